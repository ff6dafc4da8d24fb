"""The schema of a ``torch.compiler.precompile`` artifact's calling convention.

``PrecompileError`` (``_precompile_error``'s class); ``Record``, a cheap ``typing.NamedTuple``; the records of
the ``CallingConvention`` (each field's annotation is its schema) with their
codec to and from the literals python_code's header holds, and
``validate_convention``, which checks what the annotations cannot; pytree
structures as literals.  The format module (``_precompile_format``) reads and
writes artifacts with it; the driver (``_precompile_runtime``) runs them.  Like
the driver, whose section of every artifact starts with this file, it depends
on nothing but the standard library and torch (installed, it also imports
``_precompile_error``, whose class an embedded copy looks up).
"""

import ast
import base64
import contextlib
import contextvars
import enum
import functools
import importlib.util
import inspect
import math
import operator
import sys
import types
from typing import Any, Callable, Literal, NewType, Union, get_args, get_origin

import torch
import torch.utils._pytree as pytree


if __name__.endswith("._precompile_schema"):
    # The installed module (torch_precompile._precompile_schema, or
    # torch._precompile_schema in a PyTorch checkout).
    from ._precompile_error import PrecompileError
else:
    # A copy embedded in an artifact: share the installed package's class if there
    # is one (a package older than _precompile_error has it in its schema, older
    # still in its driver).  Not torch.compiler.PrecompileError: torch 2.14+ has
    # its own, and the installed shim's lazy attribute would import the whole
    # package into an artifact run alone.
    _PrecompileError = None
    for _installed in (
        "torch_precompile._precompile_error",
        "torch_precompile._precompile_schema",
        "torch_precompile._precompile_runtime",
        "torch._precompile_error",
        "torch._precompile_schema",
        "torch._precompile_runtime",
    ):
        try:
            _PrecompileError = importlib.import_module(_installed).PrecompileError
            break
        except (ImportError, AttributeError):  # not installed, or another torch's module
            pass
    if _PrecompileError is None:
        # Running without the patch installed (a bare artifact in a plain torch
        # environment): define the class the installed patch would provide.
        class PrecompileError(RuntimeError):
            """A call, capture or load violated the precompile contract."""

    else:
        PrecompileError = _PrecompileError


# ---------------------------------------------------------------------------
# Records: typing.NamedTuple's interface, without its cost at import
# ---------------------------------------------------------------------------

try:  # the C field accessor namedtuple uses; CPython-private
    from collections import _tuplegetter as _field_getter
except ImportError:  # another Python: a plain property
    def _field_getter(index: int, doc: str | None) -> Any:
        return property(operator.itemgetter(index), doc=doc)


class _RecordMeta(type):
    def __new__(mcls, name: str, bases: tuple, namespace: dict) -> type:
        if not any(isinstance(base, _RecordMeta) for base in bases):
            return super().__new__(mcls, name, bases, namespace)  # Record itself
        fields = tuple(namespace.get("__annotations__", {}))
        defaults = {field: namespace.pop(field) for field in fields if field in namespace}
        if list(defaults) != list(fields[len(fields) - len(defaults) :]):
            raise TypeError(f"{name}: fields with defaults must come last")
        namespace.setdefault("__slots__", ())  # no per-instance __dict__, as namedtuple
        for index, field in enumerate(fields):
            namespace[field] = _field_getter(index, f"Alias for field number {index}")
        if fields:
            namespace["_fields"], namespace["_field_defaults"] = fields, defaults
        return super().__new__(mcls, name, bases, namespace)


class Record(tuple, metaclass=_RecordMeta):
    """An immutable record whose fields are its class annotations (as typing.NamedTuple).

    typing.NamedTuple compiles each class's ``__new__`` from generated source
    (``eval``): ~0.3 ms per class at import, which every ``load()`` of an
    artifact pays.  A Record class is an ordinary class statement, so its
    code comes from cached bytecode; it is a tuple with named fields,
    ``_fields``, ``_field_defaults``, ``_make`` and ``_replace``.
    """

    __slots__ = ()
    _fields: "tuple[str, ...]" = ()  # set per subclass by _RecordMeta
    _field_defaults: "dict[str, Any]" = {}

    def __new__(cls, /, *args: Any, **kwargs: Any) -> Any:
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} fields, got {len(args)}")
        values = list(args)
        for field in fields[len(args) :]:
            if field in kwargs:
                values.append(kwargs.pop(field))
            elif field in cls._field_defaults:
                values.append(cls._field_defaults[field])
            else:
                raise TypeError(f"{cls.__name__}() lacks its field {field!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected or repeated fields {sorted(kwargs)}")
        return tuple.__new__(cls, values)

    @classmethod
    def _make(cls, values: Any) -> Any:
        return tuple.__new__(cls, values)

    def _replace(self, **changes: Any) -> Any:
        return type(self)(**{**dict(zip(self._fields, self)), **changes})

    def __getnewargs__(self) -> tuple:  # copy and pickle rebuild through __new__
        return tuple(self)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))
        return f"{type(self).__name__}({fields})"


# ---------------------------------------------------------------------------
# The calling convention: one explicit, versioned record (Records, not
# dataclasses: creating a dataclass execs generated code, ~2 ms each).
#
# Each field's annotation is its schema: _decoder() turns it, once at import,
# into the function that reads the field from python_code's literal
# (``ast.literal_eval`` output) and refuses anything else with the field's
# path and value.  What one field cannot say alone (indices into other
# fields, counts that must agree) is checked by validate_convention().
# ---------------------------------------------------------------------------

# Scalar kinds the codec checks beyond their Python type; the values stay plain ints / strs.
Count = NewType("Count", int)  # an int >= 0: a size, an index, a position
DType = NewType("DType", str)  # a torch dtype's name, e.g. "float32"
Device = NewType("Device", str)  # what torch.device() accepts, e.g. "cpu"
# A Python leaf value baked at capture (one of LEAF_VALUE_TYPES; nan/inf are
# rendered {"nonfinite_float": "nan"}, not literals), and such values nested in tuples.
Scalar = NewType("Scalar", object)
PyValue = NewType("PyValue", object)

# The Python values a pytree leaf of fn's inputs or outputs may be (baked at capture).
LEAF_VALUE_TYPES = (int, float, bool, str, type(None))
MISSING = object()

# Memory formats an input with free dims may be pinned to, by name.
MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
}

# Device types whose autocast state is recorded at capture (torch.is_autocast_enabled).
AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia")


def _describe_sizes(sizes: list) -> str:
    """``(2, *)``, ``(4,)``: a shape or strides as Python writes a tuple."""
    return "(" + ", ".join(map(str, sizes)) + ("," if len(sizes) == 1 else "") + ")"


class TensorSpec(Record):
    """What the graph was specialized to for one tensor."""

    shape: tuple[Count | None, ...]  # None marks a free (unbacked) dim
    stride: tuple[int, ...] | None  # None: free dims (memory_format), or an eager artifact older than stride checks
    dtype: DType  # e.g. "float32"
    device: Device  # e.g. "cpu"
    # Free dims as ((dim, shape group, min, max), ...) in dim order; max None =
    # unbounded.  Dims in one shape group must have equal sizes.
    free_dims: tuple[tuple[Count, Count, Count, Count | None], ...] = ()
    # Inputs with free dims: their strides vary with the sizes, so the layout is
    # pinned as a memory format instead ("contiguous_format", "channels_last", ...).
    memory_format: Literal[tuple(MEMORY_FORMATS)] | None = None
    requires_grad: bool = False  # checked when the convention's needs_grad is set

    def describe_shape(self) -> str:
        return _describe_sizes(["*" if s is None else s for s in self.shape])

    def describe(self) -> str:
        """``Tensor(2, *) float32 cpu``: shape (``*`` a free dim), dtype, device."""
        return f"Tensor{self.describe_shape()} {self.dtype} {self.device}"


class ShardSpec(Record):
    """A parameter that is a DTensor over several ranks (Note invariant 17), whose local
    shard is the graph input (its StateSpec's ``tensor`` is the DTensor's layout).

    ``fully_shard`` (FSDP2)'s, ``gathered``: the graph all-gathers the shards into the
    whole parameter over the process group ``group_name`` of ``world_size`` ranks and
    reduce-scatters its gradient back, averaged as FSDP2 does.  Tensor parallel's: the
    graph computes with the local shard, and the collectives that DTensor's sharding
    propagation runs are in it.  Both (fully_shard over tensor parallel): a 2-D mesh,
    fully_shard's dim (``group_name``) gathered into tensor parallel's local shard, on
    its dim ``parallel_group_name``.  No rank is baked.  Checked when the module cache
    is built: a DTensor of ``shape`` with ``placements`` (their reprs) on a mesh over
    those groups.
    """

    shape: tuple[Count, ...]  # the whole parameter's; each sharded dim divides evenly over the ranks
    world_size: Count
    group_name: str
    placements: tuple[str, ...] = ("Shard(dim=0)",)
    gathered: bool = True  # fully_shard's; False: tensor parallel's
    # Its .grad's placements where they are not ``placements``: a Replicate parameter
    # computed with sharded activations (SequenceParallel's norms) gets a Partial(sum) one.
    grad_placements: tuple[str, ...] = ()
    # A 2-D mesh's tensor parallel dim, under fully_shard's: its process group and size.
    parallel_group_name: str = ""
    parallel_world_size: Count = 0
    # The ranks of the mesh the parameter's was sliced from (or its own), row by row: the
    # same on every rank.  A slice's groups differ from rank to rank; each rank's own group
    # on a dim stands for the captured one (the graph's collectives name capture's).
    mesh_ranks: tuple[Count, ...] = ()

    @property
    def mesh_groups(self) -> tuple:
        """(process group name, size) of each dim of the parameter's mesh."""
        return ((self.group_name, self.world_size),) + (
            ((self.parallel_group_name, self.parallel_world_size),) if self.parallel_group_name else ()
        )


class StateSpec(Record):
    """One lifted parameter or buffer (tied names collapse onto one entry)."""

    kind: Literal["parameter", "buffer"]
    names: tuple[tuple[Count, str], ...]  # (module index, fully-qualified name)
    tensor: TensorSpec
    sharded: ShardSpec | None = None  # a parameter fully_shard sharded: ``tensor`` is its local shard


class DataParallelSpec(Record):
    """A ``DistributedDataParallel`` module argument (Note invariant 16): what its graph assumes.

    The graph all-reduces gradients over the process group named
    ``group_name`` of ``world_size`` ranks (no rank is baked: one artifact
    serves every rank).  Checked at every call: the group, its size, whether
    gradients are synchronized (``ddp.no_sync()``), find_unused_parameters,
    static_graph, the comm hook, whether DDP would broadcast the buffers
    before this forward, the parameters its reducer averages and its
    ``parameters_to_ignore``.  Recorded only (values do not depend on them):
    gradient_as_bucket_view and the bucket cap.
    """

    world_size: Count
    group_name: str
    grad_sync: bool  # ddp.require_backward_grad_sync at capture (False under no_sync())
    find_unused_parameters: bool
    static_graph: bool
    gradient_as_bucket_view: bool
    bucket_cap_bytes: Count
    comm_hook: str | None  # None (DDP's own averaging) or "allreduce_hook"
    # The graph first broadcasts the module's buffers from rank 0, as DDP's forward
    # does while broadcast_buffers (forward_sync_buffers) is on and the previous
    # forward synchronized gradients (require_forward_param_sync).
    broadcast_buffers: bool = False
    # Names in the wrapped module of the parameters DDP's reducer averages (those requiring
    # grad when DDP was constructed, less parameters_to_ignore), and of the parameters and
    # buffers it ignores (not averaged, not broadcast).  None: not recorded, not checked.
    reduced: tuple[str, ...] | None = None
    ignored: tuple[str, ...] | None = None


class ModuleSpec(Record):
    """The structure a module argument must have at runtime."""

    position: Count  # positional index in fn's arguments
    parameters: tuple[str, ...]
    buffers: tuple[str, ...]
    # (name, training flag) of every submodule in ``named_modules()`` order,
    # the module itself ("") first.  The flag is None where fn never read it
    # at capture (it cannot have shaped the graph): only read flags are checked.
    submodules: tuple[tuple[str, bool | None], ...]
    classes: tuple[str, ...] = ()  # class_name() of each submodule, same order
    # (submodule name, attribute, value) of each plain attribute fn read (eps, p, ...).
    attributes: tuple[tuple[str, str, PyValue], ...] = ()
    data_parallel: DataParallelSpec | None = None  # the module is a DistributedDataParallel
    # Indices into ``submodules`` of those fn called (nn.Module.__call__ read their hook
    # dicts): a hook written into one of their dicts would run in eager, so they are watched.
    called: tuple[Count, ...] = ()


# LeafSpec.value when the leaf is not a baked value: Ellipsis is no leaf value
# (LEAF_VALUE_TYPES), so a baked None is ``value=None`` and nothing else.
NO_VALUE = ...


class LeafSpec(Record):
    """A pytree leaf of fn's inputs or outputs: a tagged union.

    Exactly one of ``tensor`` (an input tensor), ``graph_output`` (an output
    tensor, by index into the graph's outputs) or ``value`` (a Python value
    baked at capture, None included) is set; the literal holds only that one.
    """

    tensor: TensorSpec | None = None
    graph_output: Count | None = None
    value: Scalar = NO_VALUE

    @property
    def is_value(self) -> bool:
        return self.value is not NO_VALUE


class ConstantSpec(Record):
    """A tensor literal created inside fn, reproduced bit-exactly."""

    shape: tuple[Count, ...]
    dtype: DType
    device: Device
    data: str  # base64 of the raw little-endian bytes


class OutputView(Record):
    """A tensor output of fn that is a tensor graph input, or a view of one.

    backend='inductor' returns fresh buffers (an input written in place and
    viewed comes back as a copy): the driver rebuilds these outputs from the
    runtime input after the graph ran, so writes through them reach it as in eager.
    """

    graph_output: Count  # which tensor output of fn
    base: Count  # the tensor graph input it aliases: state, then user tensors
    # None: the input itself; else the view's sizes, strides and storage offset
    # (relative to the input's own) at capture, all static.
    shape: tuple[Count, ...] | None = None
    stride: tuple[int, ...] = ()
    offset: int = 0
    # fn detached it (.detach(), .data): rebuilt without autograd history, as eager's has none.
    detached: bool = False
    # fn made it under no_grad() from an input that requires grad: rebuilt under no_grad(), so
    # that it requires grad without history, as eager's.
    no_grad: bool = False


_SIZE_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_NEGATED_OPS = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}


class SizeFact(Record):
    """A linear requirement on the free sizes that the captured graph needs
    (Note invariant 3): ``sum(c * sizes[i] for i, c in terms) + constant OP 0``,
    as the example's sizes decided a branch of fn (e.g. a mask one longer than
    the cache: ``s1 - s0 - 1 == 0``).  Checked at every call."""

    terms: tuple[tuple[Count, int], ...]  # (free size index, coefficient)
    constant: int
    op: Literal[tuple(_SIZE_OPS)]
    where: str = ""  # " at file:line (code)" of the branch that needed it

    def holds(self, sizes: Any) -> Any:
        """Whether ``sizes`` (ints; SymInts give a SymBool) satisfy it."""
        return _SIZE_OPS[self.op](sum(c * sizes[i] for i, c in self.terms) + self.constant, 0)

    def negated(self) -> "SizeFact":
        return SizeFact(terms=self.terms, constant=self.constant, op=_NEGATED_OPS[self.op], where=self.where)

    def describe(self, names: list) -> str:
        """``2*(a) - (b) + 1 >= 0`` with each free size named."""
        terms = [(c, f"({names[i]})" if abs(c) == 1 else f"{abs(c)}*({names[i]})") for i, c in self.terms]
        if self.constant:
            terms.append((self.constant, str(abs(self.constant))))
        text = " ".join(f"{'-' if c < 0 else '+'} {term}" for c, term in terms)
        text = text[2:] if text[0] == "+" else "-" + text[2:]  # no sign before a first positive term
        return f"{text} {self.op} 0"


# State keys the traced step reads and writes, per supported torch.optim class.
OPTIMIZER_STATE_KEYS = {
    "SGD": ("momentum_buffer",),
    "Adam": ("step", "exp_avg", "exp_avg_sq"),
    "AdamW": ("step", "exp_avg", "exp_avg_sq"),
}


# What OneCycleLR / CyclicLR cycle besides lr, per optimizer class: lifted when captured.
LIFTED_HYPERPARAMETERS = {"SGD": ("momentum",), "Adam": ("betas[0]",), "AdamW": ("betas[0]",)}


class OptimizerSpec(Record):
    """A ``torch.optim`` optimizer argument, lifted like a module (no state stored).

    Graph inputs per optimizer: per param group a 0-dim float64 ``lr`` and one
    per ``lifted`` hyperparameter, then the ``keys`` state tensors of each
    ``stepped`` parameter.  Every other group entry the trace read (by fn or
    torch's step) or capture decided from is baked and must be equal at every
    call; the rest (an LR scheduler's ``initial_lr``) are not checked.
    """

    position: Count  # positional index in fn's arguments
    cls: str  # "SGD", "Adam" or "AdamW" (torch.optim.<cls>, exact type; OPTIMIZER_STATE_KEYS)
    groups: tuple[tuple[Count, ...], ...]  # per param group: indices into state
    hyper: tuple[tuple[tuple[str, PyValue], ...], ...]  # per param group: baked (key, value), the read ones
    keys: tuple[str, ...]  # state keys of one stepped parameter, in input order
    stepped: tuple[tuple[Count, Count], ...]  # (group, index in group) with state inputs
    tensors: tuple[TensorSpec, ...]  # the state inputs, len(stepped) * len(keys)
    # Hyperparameters LR schedulers cycle, read at every call like lr (LIFTED_HYPERPARAMETERS).
    lifted: tuple[str, ...] = ()


# inspect.Parameter kinds, by name (the convention stores fn's signature as literals).
PARAMETER_KINDS = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD")


def call_signature(parameters: tuple) -> inspect.Signature:
    """fn's signature rebuilt from ``CallingConvention.signature``.

    A parameter not bound at capture gets the default ``BAKED``, so a call that
    leaves it out binds, and one that passes it is seen (``PrecompiledFunction._bind``).
    """
    return inspect.Signature(
        [
            inspect.Parameter(
                name,
                getattr(inspect.Parameter, kind),
                default=BAKED if not bound and kind not in ("VAR_POSITIONAL", "VAR_KEYWORD") else inspect.Parameter.empty,
            )
            for name, kind, bound in parameters
        ]
    )


class _Baked:
    def __repr__(self) -> str:
        return "<baked at capture>"


BAKED = _Baked()


class CallingConvention(Record):
    """Everything a caller must match; rendered into python_code as literals.

    Graph inputs are ``state`` tensors, then the tensor leaves of the user
    inputs, then the free ``sizes`` (ints), then each optimizer's lrs and state
    tensors, then the incoming grads of ``grad_inputs``, then ``constants``.  Graph outputs are the tensor leaves of fn's
    result, then one gradient per entry of ``grad_state``.  ``needs_grad`` to
    ``autocast`` record the global state and aliasing the graph was captured under.
    """

    # The artifact's format version and backend, stored here only (load()
    # checks the version against the supported range before decoding the rest).
    format_version: Count
    backend: Literal["eager", "inductor"]
    arity: Count
    modules: tuple[ModuleSpec, ...]
    state: tuple[StateSpec, ...]
    input_spec: pytree.TreeSpec  # of the non-module arguments; treespec_dumps in the literal
    inputs: tuple[LeafSpec, ...]
    output_spec: pytree.TreeSpec  # of fn's result
    outputs: tuple[LeafSpec, ...]
    grad_state: tuple[Count, ...]  # indices into state receiving .grad
    constants: tuple[ConstantSpec, ...]
    # The graph runs autograd (a backward, or inputs that require grad): it
    # needs grad mode, and every tensor's requires_grad is part of the contract.
    needs_grad: bool
    # Tensor graph inputs (state, then user tensors) the graph writes in place.
    mutated: tuple[Count, ...]
    default_dtype: DType  # torch.get_default_dtype() at capture, e.g. "float32"
    autocast: tuple[tuple[Literal[AUTOCAST_DEVICES], DType], ...]  # (device type, dtype) of each enabled autocast
    # (device type, dtype): the process's autocast dtype (torch.get_autocast_dtype) at
    # capture for each device, not in ``autocast``, whose dtype fn read or computed in
    # (torch.autocast(device) without a dtype, fn enabling autocast itself): checked at every call.
    autocast_dtypes: tuple[tuple[Literal[AUTOCAST_DEVICES], DType], ...] = ()
    # Optimizer arguments (see OptimizerSpec); their inputs follow the sizes.
    optimizers: tuple[OptimizerSpec, ...] = ()
    # State indices whose incoming .grad is a graph input (after the optimizers'
    # inputs; zeros when None): fn reads it, or accumulates onto it in-graph.
    grad_inputs: tuple[Count, ...] = ()
    # Those of grad_inputs the graph only reads (no write, view or output
    # reaches them): a None .grad passes zeros the runnable keeps across calls.
    grad_inputs_read_only: tuple[Count, ...] = ()
    # grad_state entries whose graph gradient is the final .grad (fn cleared or
    # read the incoming one): assigned; the others accumulate like backward().
    grads_assigned: tuple[Count, ...] = ()
    # grad_state entries accumulated like backward() whose graph gradient no other graph
    # output or input shares: a call keeps it as a None .grad's new tensor where it has the
    # parameter's layout, as AccumulateGrad does; it copies the others into that layout.
    grads_owned: tuple[Count, ...] = ()
    # Parameters whose .grad fn sets to None (zero_grad() after its backward).
    grads_cleared: tuple[Count, ...] = ()
    # Parameters whose .grad every call requires None / a tensor, as at capture:
    # fn's optimizer tells them apart and backward does not reach them (Note invariant 13).
    grads_none: tuple[Count, ...] = ()
    grads_present: tuple[Count, ...] = ()
    # Tensor graph inputs (state, then user tensors) whose requires_grad fn read: checked
    # at every call, as every tensor's is where needs_grad is set.
    requires_grad_read: tuple[Count, ...] = ()
    # (tensor graph input, name, value_literal or missing) of each Python attribute fn read
    # on a tensor argument that a plain tensor lacks (``p.no_wd``, set by the caller):
    # the value normal lookup gives on the caller's tensor at every call, as at capture.
    tensor_attributes: tuple[tuple[Count, str, PyValue], ...] = ()
    # What each tensor output (by graph_output index) was at capture: shape
    # (None where it depends on free dims), dtype, device.  For readers (the
    # inspector); the driver does not check outputs.
    output_tensors: tuple[TensorSpec, ...] = ()
    # fn's parameters, as inspect.signature saw them: (name, kind, bound at
    # capture).  A call binds its keyword arguments with them as Python would;
    # a parameter not bound at capture had its default baked.  () when fn has
    # no signature (a C callable): only positional calls then.
    signature: tuple[tuple[str, Literal[PARAMETER_KINDS], bool], ...] = ()
    # Paths (``args[1]['batch']``) of the dict inputs whose key order fn observed
    # (it iterated over them): another order is refused there, mapped by key elsewhere.
    ordered_dicts: tuple[str, ...] = ()
    # Tensor outputs that alias a tensor graph input (backend='inductor' only;
    # the eager graph returns the views itself), by increasing graph_output.
    output_views: tuple[OutputView, ...] = ()
    # (i, j): user tensor graph inputs that were one tensor at capture (fn(x, x)),
    # traced as one, so every call passes one there; the other user tensors were
    # distinct and every call passes distinct ones (fn may branch on ``a is b``).
    # Artifacts written before this recorded only groups with a member written in
    # place and check only those: their own driver reads the field as written.
    same_inputs: tuple[tuple[Count, Count], ...] = ()
    # (i, j): module arguments (indices into ``modules``) that were one object at capture
    # (fn(m, m)); the others were distinct, and every call passes the same partition (fn
    # may branch on ``a is b``).  Older conventions read as all distinct: their own driver
    # checks no module identity.
    same_modules: tuple[tuple[Count, Count], ...] = ()
    # Where fn read torch.is_grad_enabled() / is_inference_mode_enabled() and
    # got the captured answer (grad on, inference off), as " at file:line
    # (code)"; empty when it never did.  The graph follows that answer, so the
    # caller's mode must give it too.
    grad_mode_read: str = ""
    inference_mode_read: str = ""
    # Argument positions (user inputs) whose objects fn changed beyond their
    # tensors' values (an attribute rebound, as a DynamicCache's update does; an
    # element added): output_spec is then of (fn's result, (each such argument
    # as fn left it, ...)), written into the caller's objects after the graph
    # ran (write_back), as eager leaves them.
    rebound_inputs: tuple[Count, ...] = ()
    # (output node, argument position, input node): pytree nodes of fn's result
    # that were one of its input objects, by index in the TreeSpec's pre-order
    # walk (leaves included), returned as the caller's object there, as in eager.
    returned_inputs: tuple[tuple[Count, Count, Count], ...] = ()
    # Linear requirements between the free sizes (indices into ``sizes``) that
    # the graph took from the example's sizes (a mask one longer than a cache).
    size_facts: tuple[SizeFact, ...] = ()
    # (module path, hook dict attribute, description) of each tensor parallel hook
    # the trace ran (Note invariant 17): the only hooks besides fully_shard's a call
    # accepts, each as runtime.parallel_hook_description describes it.
    parallel_hooks: tuple[tuple[str, str, str], ...] = ()
    # (module path, repr of its MixedPrecisionPolicy) of each fully_shard module with a
    # mixed precision policy (Note invariant 17): the graph casts as it does, so a call
    # checks that every fully_shard module has capture's policy, or none where it had none.
    fully_shard_policies: tuple[tuple[str, str], ...] = ()

    def to_literal(self) -> dict:
        return _to_literal(self)

    @classmethod
    def from_literal(cls, literal: Any) -> "CallingConvention":
        try:
            convention = _DECODERS[cls](literal)
        except _Malformed as error:
            raise PrecompileError(f"calling convention is malformed: {error.describe()}") from None
        validate_convention(convention)
        return convention

    @property
    def user_positions(self) -> tuple[int, ...]:
        lifted = {m.position for m in self.modules} | {o.position for o in self.optimizers}
        return tuple(i for i in range(self.arity) if i not in lifted)

    @property
    def sizes(self) -> tuple[tuple[int, int], ...]:
        """(input leaf, dim) of each free size graph input: the inputs' free dims, in order."""
        return tuple(
            (index, free[0])
            for index, leaf in enumerate(self.inputs)
            if leaf.tensor is not None
            for free in leaf.tensor.free_dims
        )

    @property
    def library_modules(self) -> bool:
        """Whether a module argument has a HOOK_LIBRARIES class (the driver's library_hooks part)."""
        return any(name.partition(".")[0] in HOOK_LIBRARIES for m in self.modules for name in m.classes)

    @property
    def touches_grads(self) -> bool:
        """Whether a call checks, reads or writes a parameter's ``.grad`` (the fields that
        name parameters by their .grad; the others are subsets of these)."""
        return bool(self.grad_state or self.grads_cleared or self.grad_inputs or self.grads_none or self.grads_present)


def _to_literal(value: Any) -> Any:
    """Records -> dicts of plain literals that ``ast.literal_eval`` reads.

    Fields equal to their defaults are left out (a smaller header parses
    faster at load), which also renders a LeafSpec as its one tag and payload:
    a baked ``None`` reads ``{'value': None}``.
    """
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        defaults = value._field_defaults
        return {
            name: _to_literal(field)
            for name, field in zip(value._fields, value)
            if name not in defaults or not _is_default(field, defaults[name])
        }
    if isinstance(value, (tuple, list)):
        return [_to_literal(v) for v in value]
    if type(value) is dict:  # value_literal()'s tagged values
        return {key: _to_literal(v) for key, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"nonfinite_float": repr(value)}  # `nan`/`inf` are not literals
    if isinstance(value, pytree.TreeSpec):
        return encode_tree_spec(value)
    return value


def _is_default(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default


class _Malformed(Exception):
    """A literal that does not match its field's type; the path grows as it propagates up."""

    def __init__(self, value: Any, expected: str):
        self.value, self.expected, self.path = value, expected, []

    def describe(self) -> str:
        path = "".join(reversed(self.path)).lstrip(".") or "CALLING_CONVENTION"
        if self.value is MISSING:
            return f"{path}: {self.expected}"
        value = repr(self.value)
        return f"{path} = {value if len(value) <= 200 else value[:200] + '...'} ({self.expected})"


def _scalar(expected: str, ok: Callable[[Any], bool]) -> Callable[[Any], Any]:
    def decode(value: Any) -> Any:
        if ok(value):
            return value
        raise _Malformed(value, expected)

    return decode


def _is_dtype(name: Any) -> bool:
    return type(name) is str and _names_dtype(name)


def _is_device(name: Any) -> bool:
    return type(name) is str and _names_device(name)


# Every tensor spec names its dtype and device: each name is checked once per process.
@functools.lru_cache(maxsize=None)
def _names_dtype(name: str) -> bool:
    return isinstance(getattr(torch, name, None), torch.dtype)


@functools.lru_cache(maxsize=None)
def _names_device(name: str) -> bool:
    try:
        torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _decode_scalar(value: Any) -> Any:
    if type(value) in LEAF_VALUE_TYPES:
        return value
    if type(value) is dict and len(value) == 1:
        ((tag, payload),) = value.items()
        if tag == "nonfinite_float" and payload in _NONFINITE:
            return _NONFINITE[payload]
        decoded = _decode_tagged_scalar(tag, payload)
        if decoded is not MISSING:
            return {tag: decoded}
    raise _Malformed(value, "a Python leaf value: int, float, bool, str or None, or a tagged dtype, size, device, enum or numpy scalar")


def _decode_tagged_scalar(tag: Any, payload: Any) -> Any:
    """The payload of one of value_literal()'s tagged scalars, or MISSING."""
    if tag in ("dtype", "device"):
        return payload if (_is_dtype if tag == "dtype" else _is_device)(payload) else MISSING
    if type(payload) is not list:
        return MISSING
    if tag == "size" and all(type(n) is int and n >= 0 for n in payload):
        return tuple(payload)
    if tag == "enum" and len(payload) == 2 and all(type(n) is str for n in payload):
        return tuple(payload)
    if tag == "numpy" and len(payload) == 2 and type(payload[0]) is str:
        return (payload[0], _decode_scalar(payload[1]))
    if tag == "missing" and not payload:
        return ()
    return MISSING


def _decode_py_value(value: Any) -> Any:
    if type(value) is list:
        return _sequence(value, _decode_py_value)
    if type(value) is dict and len(value) == 1 and type(payload := next(iter(value.values()))) is list:
        if "list" in value:
            return {"list": _sequence(payload, _decode_py_value)}
        if "dict" in value and all(type(item) is list and len(item) == 2 for item in payload):
            return {"dict": _sequence(payload, _decode_py_value)}
    return _decode_scalar(value)


def _decode_tree_spec(value: Any) -> pytree.TreeSpec:
    if type(value) is str and value.startswith(NAMED_SPEC_PREFIX):
        try:
            node = ast.literal_eval(value[len(NAMED_SPEC_PREFIX) :])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            node = MISSING
        return _decode_named_node(value, node)
    if type(value) is str:
        try:
            return pytree.treespec_loads(value)
        except Exception:  # any decoding failure: damaged
            pass
    raise _Malformed(value, "a pytree.treespec_dumps string")


def _sequence(value: list, item: Callable[[Any], Any]) -> tuple:
    try:
        return tuple(map(item, value))
    except _Malformed:
        for index, entry in enumerate(value):  # only to name the entry
            try:
                item(entry)
            except _Malformed as error:
                error.path.append(f"[{index}]")
                raise
        raise


# Annotation -> decoder: the scalar kinds, then every record and composite
# type as _decoder() builds it (a composite that repeats is built once).
_DECODERS: dict = {
    int: _scalar("an int", lambda v: type(v) is int),
    bool: _scalar("a bool", lambda v: type(v) is bool),
    str: _scalar("a str", lambda v: type(v) is str),
    Count: _scalar("an int >= 0", lambda v: type(v) is int and v >= 0),
    DType: _scalar("a torch dtype name", _is_dtype),
    Device: _scalar("a torch device", _is_device),
    Scalar: _decode_scalar,
    PyValue: _decode_py_value,
    pytree.TreeSpec: _decode_tree_spec,
}


def _decoder(annotation: Any) -> Callable[[Any], Any]:
    """The function that reads one field of this type from its literal (built once, at import)."""
    decoder = _DECODERS.get(annotation)
    if decoder is None:
        decoder = _DECODERS[annotation] = _composite_decoder(annotation)
    return decoder


def _composite_decoder(annotation: Any) -> Callable[[Any], Any]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _decoder(args[0] if args[1] is type(None) else args[1])
        return lambda value: None if value is None else inner(value)
    if origin is Literal:
        allowed = frozenset(args)
        return _scalar(f"one of {list(args)}", lambda v: type(v) is str and v in allowed)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])

        def decode_tuple(value: Any) -> tuple:
            if type(value) is not list:
                raise _Malformed(value, "a list")
            return _sequence(value, item)

        return decode_tuple
    if origin is tuple:
        items = [_decoder(arg) for arg in args]

        def decode_fixed(value: Any) -> tuple:
            if type(value) is not list or len(value) != len(items):
                raise _Malformed(value, f"a list of {len(items)}")
            try:
                return tuple([decode(entry) for decode, entry in zip(items, value)])
            except _Malformed as error:
                for index, (decode, entry) in enumerate(zip(items, value)):  # only to name the entry
                    try:
                        decode(entry)
                    except _Malformed:
                        error.path.append(f"[{index}]")
                        raise error from None
                raise

        return decode_fixed
    raise TypeError(f"calling convention: no decoder for the annotation {annotation!r}")


def _record_decoder(cls: Any) -> Callable[[Any], Any]:
    fields = [
        (name, _decoder(annotation), cls._field_defaults.get(name, MISSING))
        for name, annotation in cls.__annotations__.items()
    ]
    names = frozenset(cls._fields)
    make = cls._make

    def decode(literal: Any) -> Any:
        if type(literal) is not dict:
            raise _Malformed(literal, f"a dict of {cls.__name__} fields")
        values, found = [], 0
        for name, decode_field, default in fields:
            value = literal.get(name, MISSING)
            if value is MISSING:
                if default is MISSING:
                    raise _Malformed(MISSING, f"{cls.__name__} lacks its field {name!r}")
                values.append(default)
                continue
            found += 1
            try:
                values.append(decode_field(value))
            except _Malformed as error:
                error.path.append(f".{name}")
                raise
        if found != len(literal):
            unknown = sorted(map(repr, literal.keys() - names))
            raise _Malformed(MISSING, f"{cls.__name__} has unknown fields [{', '.join(unknown)}]")
        return make(values)

    return decode


for _record in (
    TensorSpec, ShardSpec, StateSpec, DataParallelSpec, ModuleSpec, LeafSpec, ConstantSpec, OutputView, SizeFact,
    OptimizerSpec, CallingConvention,
):
    _DECODERS[_record] = _record_decoder(_record)
del _record


def autocast_dtypes(devices: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(device type, dtype) of the process's autocast dtype of each of ``devices``, enabled or not."""
    return tuple((device, str(torch.get_autocast_dtype(device)).removeprefix("torch.")) for device in devices)


def autocast_state() -> tuple[tuple[str, str], ...]:
    """(device type, dtype) of every enabled autocast, as recorded in a convention."""
    return tuple(
        (device, str(torch.get_autocast_dtype(device)).removeprefix("torch."))
        for device in AUTOCAST_DEVICES
        if torch.is_autocast_enabled(device)
    )


def value_literal(value: Any) -> Any:
    """What a convention records of a Python value fn read; TypeError where it cannot.

    Plain leaves by exact type (a ``str`` Enum or ``numpy.float64`` is no plain
    str / float: its repr is no literal) and tuples of values stay themselves;
    anything else becomes a one-key dict naming its kind: ``{"list": ...}``,
    ``{"dict": ((key, value), ...)}``, ``{"dtype": "float64"}``, ``{"size": (2, 3)}``,
    ``{"device": "cpu"}``, ``{"enum": (class_name, member name)}``,
    ``{"numpy": (dtype name, value)}`` and, for an attribute fn found absent
    (``getattr(config, "sliding_window", None)``), ``{"missing": ()}``.  Two
    values compare equal under same_value() exactly when their literals do.
    """
    if value is MISSING:
        return {"missing": ()}
    kind = type(value)
    if kind in LEAF_VALUE_TYPES:
        return value
    if kind is tuple:
        return tuple(map(value_literal, value))
    if kind is list:
        return {"list": tuple(map(value_literal, value))}
    if kind is dict:
        return {"dict": tuple((value_literal(k), value_literal(v)) for k, v in value.items())}
    if kind is torch.dtype:
        return {"dtype": str(value).removeprefix("torch.")}
    if kind is torch.Size:
        return {"size": tuple(value)}
    if kind is torch.device:
        return {"device": str(value)}
    if isinstance(value, enum.Enum):
        return {"enum": (class_name(kind), value.name)}
    if kind.__module__ == "numpy" and getattr(value, "shape", None) == () and value.dtype.kind in "biuf":
        return {"numpy": (value.dtype.name, value.item())}
    raise TypeError(f"no literal for a {kind.__name__}")


def is_scalar_literal(literal: dict) -> bool:
    """Whether a tagged literal is one that a pytree leaf (LeafSpec.value) may hold."""
    return next(iter(literal)) in ("dtype", "device", "enum", "numpy")


def matches(got: Any, want: Any) -> bool:
    """Whether ``got`` is the value recorded as the literal ``want`` (same_value on literals)."""
    if type(want) in LEAF_VALUE_TYPES:
        return same_value(got, want)
    try:
        return same_value(value_literal(got), want)
    except TypeError:
        return False


def describe_literal(want: Any) -> str:
    """A recorded literal as the user wrote the value: ``torch.float32``, ``[0.5, 2.0]``, ``Mode.A``."""
    if type(want) is tuple:
        return "(" + ", ".join(map(describe_literal, want)) + ("," if len(want) == 1 else "") + ")"
    if type(want) is not dict:
        return repr(want)
    ((tag, payload),) = want.items()
    if tag == "list":
        return "[" + ", ".join(map(describe_literal, payload)) + "]"
    if tag == "dict":
        return "{" + ", ".join(f"{describe_literal(k)}: {describe_literal(v)}" for k, v in payload) + "}"
    if tag == "dtype":
        return f"torch.{payload}"
    if tag == "size":
        return f"torch.Size({list(payload)})"
    if tag == "device":
        return f"device({payload!r})"
    if tag == "enum":
        return f"{payload[0].rpartition('.')[2]}.{payload[1]}"
    if tag == "missing":
        return "missing"
    return f"numpy.{payload[0]}({payload[1]!r})"


HOOK_LIBRARIES = frozenset({"transformers"})  # packages whose handle-less hooks LIBRARY_HOOK_FIXES names


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def same_value(got: Any, want: Any) -> bool:
    """Whether a Python leaf equals the value baked at capture.

    Stricter than ``==``: ``True`` is not ``1``, ``-0.0`` is not ``0.0``
    (``x / s`` differs in sign), and ``nan`` equals ``nan``.
    """
    if type(got) is not type(want):
        return False
    if type(want) is tuple:
        return len(got) == len(want) and all(map(same_value, got, want))
    if type(want) is dict:  # value_literal()'s tagged values
        return got.keys() == want.keys() and all(map(same_value, got.values(), want.values()))
    if type(want) is not float:
        return got == want
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def validate_convention(c: "CallingConvention") -> None:
    """What the field types cannot say: the cross-references of a decoded convention.

    A damaged CALLING_CONVENTION must be refused here, at load, never turn into
    a TypeError / IndexError or a wrong result at call time.
    """

    def fail(field: str, value: Any, why: str) -> None:
        raise PrecompileError(f"calling convention is malformed: {field} = {value!r} ({why})")

    def check_tensor(where: str, t: TensorSpec) -> None:
        if t.stride is not None and len(t.stride) != len(t.shape):
            fail(f"{where}.stride", t.stride, f"expected {len(t.shape)} strides, one per dim")
        dims = [f[0] for f in t.free_dims]
        if dims != [d for d, size in enumerate(t.shape) if size is None]:
            fail(f"{where}.free_dims", t.free_dims, f"expected one entry per None dim of shape {t.shape}, in order")
        for dim, _, low, high in t.free_dims:
            if high is not None and high < low:
                fail(f"{where}.free_dims", t.free_dims, f"dim {dim} has max < min")

    def check_indices(field: str, indices: tuple, within: Any) -> None:
        if list(indices) != sorted(set(indices)) or not all(i in within for i in indices):
            fail(field, indices, f"expected increasing indices within {sorted(within)}")

    names: dict = {}  # (module index, name) -> kind
    positions = set()
    for index, m in enumerate(c.modules):
        where = f"modules[{index}]"
        if m.position >= c.arity or m.position in positions:
            fail(f"{where}.position", m.position, f"expected a distinct argument position < arity {c.arity}")
        positions.add(m.position)
        if not m.submodules or m.submodules[0][0] != "":
            fail(f"{where}.submodules", m.submodules, "expected the module itself ('') first")
        check_indices(f"{where}.called", m.called, range(len(m.submodules)))
        if len(m.classes) != len(m.submodules):
            fail(f"{where}.classes", m.classes, f"expected one class per submodule ({len(m.submodules)})")
        submodule_names = {name for name, _ in m.submodules}
        for entry in m.attributes:
            if entry[0] not in submodule_names:
                fail(f"{where}.attributes", entry, "names no submodule")
        for kind, fqns in (("parameter", m.parameters), ("buffer", m.buffers)):
            for n in fqns:
                if not n or (index, n) in names:
                    fail(f"{where}.{kind}s", n, "empty or repeated")
                names[(index, n)] = kind
    covered = set()
    for index, s in enumerate(c.state):
        if not s.names:
            fail(f"state[{index}].names", s.names, "empty")
        for entry in s.names:
            if names.get(entry) != s.kind or entry in covered:
                fail(f"state[{index}].names", entry, f"not a {s.kind} of the modules, or named twice")
            covered.add(entry)
        check_tensor(f"state[{index}].tensor", s.tensor)
    if covered != set(names):
        fail("state", sorted(set(names) - covered), "module parameters and buffers no state entry names")
    for index, leaf in enumerate(c.inputs):
        if leaf.graph_output is not None or (leaf.tensor is None) != leaf.is_value:
            fail(f"inputs[{index}]", leaf, "expected exactly one of tensor, value")
        if leaf.tensor is not None:
            check_tensor(f"inputs[{index}].tensor", leaf.tensor)
    num_user = c.arity - len(c.modules) - len(c.optimizers)
    spec = c.input_spec
    if spec.num_leaves != len(c.inputs) or spec.type is not tuple or spec.num_children != num_user:
        fail("input_spec", spec, f"expected a tuple of {num_user} arguments with {len(c.inputs)} leaves")
    for index, leaf in enumerate(c.outputs):
        if leaf.tensor is not None or (leaf.graph_output is None) != leaf.is_value:
            fail(f"outputs[{index}]", leaf, "expected exactly one of graph_output, value")
    # A tensor fn returns twice is one graph output: the first uses of each count up from 0.
    uses = [leaf.graph_output for leaf in c.outputs if leaf.graph_output is not None]
    graph_outputs = list(dict.fromkeys(uses))
    if graph_outputs != list(range(len(graph_outputs))):
        fail("outputs", uses, "graph_output indices must count up from 0")
    if c.output_spec.num_leaves != len(c.outputs):
        fail("output_spec", c.output_spec, f"expected {len(c.outputs)} leaves")
    if len(c.output_tensors) != len(graph_outputs):
        fail("output_tensors", c.output_tensors, f"expected one per tensor output ({len(graph_outputs)})")
    for index, t in enumerate(c.output_tensors):
        # Only shape (None: depends on free dims), dtype and device are recorded.
        if (t.stride, t.free_dims, t.memory_format) != (None, (), None):
            fail(f"output_tensors[{index}]", t, "records only shape, dtype and device")
    parameters = [i for i, s in enumerate(c.state) if s.kind == "parameter"]
    check_indices("grad_state", c.grad_state, parameters)
    check_indices("grad_inputs", c.grad_inputs, parameters)
    check_indices("grad_inputs_read_only", c.grad_inputs_read_only, c.grad_inputs)
    check_indices("grads_assigned", c.grads_assigned, c.grad_state)
    check_indices("grads_owned", c.grads_owned, set(c.grad_state) - set(c.grads_assigned))
    check_indices("grads_cleared", c.grads_cleared, set(parameters) - set(c.grad_state))
    check_indices("grads_none", c.grads_none, set(parameters) - set(c.grad_inputs))
    check_indices("grads_present", c.grads_present, c.grad_inputs)
    num_tensors = len(c.state) + sum(1 for leaf in c.inputs if leaf.tensor is not None)
    check_indices("mutated", c.mutated, range(num_tensors))
    check_indices("requires_grad_read", c.requires_grad_read, range(num_tensors))
    read = [(index, name) for index, name, _ in c.tensor_attributes]
    if read != sorted(set(read)) or not all(index < num_tensors for index, _ in read):
        fail("tensor_attributes", c.tensor_attributes, f"expected increasing (tensor, name), tensors within {num_tensors}")
    check_indices("output_views", [v.graph_output for v in c.output_views], range(len(graph_outputs)))
    user_positions = c.user_positions
    check_indices("rebound_inputs", c.rebound_inputs, user_positions)
    for fact in c.size_facts:
        if not fact.terms or not all(i < len(c.sizes) for i, _ in fact.terms):
            fail("size_facts", fact, f"expected terms over the {len(c.sizes)} free sizes")
    result_spec, first = c.output_spec, 0
    if c.rebound_inputs:
        children = c.output_spec.children()
        if c.output_spec.type is not tuple or len(children) != 2 or len(children[1].children()) != len(c.rebound_inputs):
            fail("output_spec", c.output_spec, "expected (result, (one tree per rebound input))")
        result_spec, first = children[0], 1
    result_nodes = range(first, first + result_spec.num_nodes)
    for entry in c.returned_inputs:
        if entry[0] not in result_nodes or entry[1] not in user_positions:
            fail("returned_inputs", entry, "expected (node of fn's result, user argument position, node)")
    for pair in c.same_inputs:
        if not len(c.state) <= pair[0] < pair[1] < num_tensors:
            fail("same_inputs", pair, f"expected user tensor inputs i < j in [{len(c.state)}, {num_tensors})")
    for pair in c.same_modules:
        if not 0 <= pair[0] < pair[1] < len(c.modules):
            fail("same_modules", pair, f"expected module arguments i < j in [0, {len(c.modules)})")
    for index, v in enumerate(c.output_views):
        if v.base >= num_tensors or (v.shape is not None and len(v.stride) != len(v.shape)):
            fail(f"output_views[{index}]", v, f"expected a tensor graph input < {num_tensors} and one stride per dim")
    for index, o in enumerate(c.optimizers):
        where = f"optimizers[{index}]"
        if o.position >= c.arity or o.position in positions:
            fail(f"{where}.position", o.position, f"expected a distinct argument position < arity {c.arity}")
        positions.add(o.position)
        if o.cls not in OPTIMIZER_STATE_KEYS:
            fail(f"{where}.cls", o.cls, f"expected one of {list(OPTIMIZER_STATE_KEYS)}")
        for group in o.groups:
            if not all(i < len(c.state) and c.state[i].kind == "parameter" for i in group):
                fail(f"{where}.groups", group, "expected indices of parameters in state")
        if len(o.hyper) != len(o.groups):
            fail(f"{where}.hyper", o.hyper, f"expected one entry per group ({len(o.groups)})")
        if not set(o.lifted) <= set(LIFTED_HYPERPARAMETERS[o.cls]) or len(set(o.lifted)) != len(o.lifted):
            fail(f"{where}.lifted", o.lifted, f"expected distinct entries of {list(LIFTED_HYPERPARAMETERS[o.cls])}")
        for entry in o.stepped:
            if entry[0] >= len(o.groups) or entry[1] >= len(o.groups[entry[0]]):
                fail(f"{where}.stepped", entry, "expected (group, index in group)")
        if len(o.tensors) != len(o.stepped) * len(o.keys):
            fail(f"{where}.tensors", len(o.tensors), f"expected len(stepped) * len(keys) = {len(o.stepped) * len(o.keys)} specs")
        for i, t in enumerate(o.tensors):
            check_tensor(f"{where}.tensors[{i}]", t)
    if c.signature:
        try:
            call_signature(c.signature)
        except ValueError as error:  # kinds out of order, a repeated or non-identifier name
            fail("signature", c.signature, str(error))
        if sum(1 for _, kind, bound in c.signature if bound and kind != "VAR_POSITIONAL") > c.arity:
            fail("signature", c.signature, f"binds more parameters than arity {c.arity}")
    for index, k in enumerate(c.constants):
        try:
            raw = base64.b64decode(k.data, validate=True)
        except ValueError:
            fail(f"constants[{index}].data", k.data[:40], "not base64")
        if len(raw) != math.prod(k.shape) * _dtype(k.dtype).itemsize:
            fail(f"constants[{index}].data", f"{len(raw)} bytes", f"expected {k.shape} {k.dtype}")


# ---------------------------------------------------------------------------
# Structures: fn's input and output pytree specs as literals (Note invariant 3)
# ---------------------------------------------------------------------------

# A spec that treespec_dumps cannot write (a plain namedtuple, a node type
# registered without serialized_type_name, a context that is not JSON) is
# written as this prefix and a literal that names each node type, and a class
# context (a namedtuple's), by import path: load imports them.  Per node:
# None for a leaf, else (type path, context kind, context, children) with
# kind "literal" (the context itself), "class" (its import path) or "repr"
# (a context load cannot rebuild: inputs compare it by repr, see ContextRepr).
NAMED_SPEC_PREFIX = "precompile-named-treespec:"


class Unnameable(Exception):
    """A class a structure literal cannot name by import path; the message says which and the fix."""


def encode_tree_spec(spec: pytree.TreeSpec) -> str:
    dumped = dumps_exactly(spec)
    return dumped if dumped is not None else NAMED_SPEC_PREFIX + repr(named_node(spec))


def dumps_exactly(spec: pytree.TreeSpec) -> str | None:
    """``treespec_dumps(spec)`` where it reads back as ``spec``, else None.

    Not where nothing is registered to serialize a node, nor where JSON would
    change a context (a dict's int keys come back as str: transformers'
    EncoderDecoderCache keeps ``is_updated`` by layer index).
    """
    try:
        dumped = pytree.treespec_dumps(spec)
    except (NotImplementedError, TypeError, ValueError):
        return None
    try:
        same = pytree.treespec_loads(dumped) == spec
    except Exception:  # whatever a node's from_dumpable_context raises
        same = False
    return dumped if same else None


def named_node(spec: pytree.TreeSpec) -> Any:
    """The literal of ``spec`` (see NAMED_SPEC_PREFIX); raises Unnameable."""
    if spec.is_leaf():
        return None
    children = [named_node(child) for child in spec.children()]
    context = spec.context
    if isinstance(context, type):  # a namedtuple's or structseq's class
        return (import_path(spec.type), "class", import_path(context), children)
    if _is_literal(context):
        return (import_path(spec.type), "literal", context, children)
    return (import_path(spec.type), "repr", repr(context), children)


def import_path(obj: Any) -> str:
    """``module:qualname`` that imports ``obj`` back, or Unnameable."""
    path = f"{obj.__module__}:{obj.__qualname__}"
    found = _import(path)
    if found is not obj:
        why = "another object has that name" if found is not None else f"{obj.__module__} defines no such name"
        raise Unnameable(
            f"the class {obj.__module__}.{obj.__qualname__}, which cannot be imported by that name ({why}; "
            "defined inside a function?), and the artifact records classes by import path: define it at "
            "module level"
        )
    return path


def _import(path: str) -> Any:
    module, _, qualname = path.partition(":")
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError):
        return None
    return found


def _is_literal(value: Any) -> bool:
    try:
        copy = ast.literal_eval(repr(value))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return type(copy) is type(value) and copy == value


class ContextRepr:
    """A pytree context load cannot rebuild, as captured: equal to any context with its repr.

    Only input specs hold one (capture refuses it in fn's output, which load
    must rebuild): the call compares the caller's spec with the captured one.
    """

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: Any) -> bool:
        return self.text == (other.text if isinstance(other, ContextRepr) else repr(other))

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return self.text


class NamedClass:
    """A class a named structure records by import path, left unimported (``classes_by_name``)."""

    def __init__(self, path: str):
        self.path = path
        self.__name__ = path.replace(":", ".")  # what TreeSpec's repr shows of a node type

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, NamedClass) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return self.__name__


# False inside classes_by_name(): named structures then import nothing.
_importing_classes = contextvars.ContextVar("_importing_classes", default=True)


@contextlib.contextmanager
def classes_by_name():
    """Decode named structures without importing: a class is looked up only in the modules
    already imported (``builtins:tuple``, torch's), and else stays a NamedClass.

    load imports them (Note invariant 7: its caller trusts the pair); the
    inspector reads pairs not yet trusted, and an import runs the module's
    code (with ``python -m``, even a .py file lying next to the artifact).
    """
    token = _importing_classes.set(False)
    try:
        yield
    finally:
        _importing_classes.reset(token)


def _decode_named_node(literal: str, node: Any) -> pytree.TreeSpec:
    if node is None:
        return pytree.treespec_leaf()
    if type(node) is not tuple or len(node) != 4 or type(node[0]) is not str or type(node[3]) is not list:
        raise _Malformed(literal, "a named pytree structure")
    type_path, kind, context, children = node
    node_type = _named_node_type(type_path)
    if kind == "class" and type(context) is str:
        context = _named_class(context)
    elif kind == "repr" and type(context) is str:
        context = ContextRepr(context)
    elif kind != "literal":
        raise _Malformed(literal, "a named pytree structure")
    return pytree.TreeSpec(node_type, context, [_decode_named_node(literal, child) for child in children])


def _named_node_type(path: str) -> Any:
    node_type = _resolve(path)
    if isinstance(node_type, NamedClass):
        return node_type
    if node_type not in pytree.SUPPORTED_NODES:
        raise PrecompileError(
            f"fn's input or output structure holds the pytree node type {path.replace(':', '.')}, which "
            "this process cannot import or has not registered with torch.utils._pytree: import the module "
            "that defines (and registers) it before load()"
        )
    return node_type


def _named_class(path: str) -> Any:
    found = _resolve(path)
    if not isinstance(found, (type, NamedClass)):
        raise PrecompileError(
            f"fn's input or output structure holds the class {path.replace(':', '.')}, which this process "
            "cannot import: import its module (or define it again at module level) before load()"
        )
    return found


def _resolve(path: str) -> Any:
    """The object at ``module:qualname``: imported, or inside ``classes_by_name`` a NamedClass
    unless its module is already imported."""
    if _importing_classes.get():
        return _import(path)
    found = _already_imported(path)
    return NamedClass(path) if found is None else found


def _already_imported(path: str) -> Any:
    module, _, qualname = path.partition(":")
    found = sys.modules.get(module)
    for part in qualname.split("."):
        # Only the namespaces of modules and classes: getattr could run a
        # module's __getattr__ (a lazy import) or a descriptor.
        if not isinstance(found, (types.ModuleType, type)):
            return None
        found = vars(found).get(part)
    return found


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


@functools.lru_cache(maxsize=None)
def _device(name: str) -> torch.device:
    return torch.device(name)
