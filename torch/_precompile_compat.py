"""The private torch internals torch.compiler.precompile's capture side relies on.

Supported: torch 2.11 to 2.14 (``SUPPORTED_TORCH``); importing this module on
another release raises ImportError naming it.  Every private torch API that
``torch/_precompile*.py`` module outside the driver uses (and the installed
package ``torch_precompile``, which re-exports them) goes through one name here,
with a line saying what torch lacks and what there is instead; where an
internal differs between releases, each path names the releases it covers
(``TORCH_RELEASE``).
``test/test_precompile_compat.py`` pins each against the installed torch
(existence, signature, the behaviour relied on) and checks that no other
``torch/_precompile*.py`` source touches them, so a torch upgrade that moves
or changes one fails there, in one place, rather than deep inside a capture.

The driver (``torch/_precompile_runtime.py``) is embedded in every artifact
and runs where only torch is installed, so it cannot import this module: its
own private uses are gathered in its section "torch 2.11-2.14 internals the driver
relies on", pinned by the same test file.

Importing this module is cheap (the shim imports it during ``import torch``):
``torch._inductor``, ``torch._dynamo`` and the other heavy modules are
imported only inside the functions that need them, never on the warm load
path.

Not routed here, on purpose: op introspection (``torch._ops.OpOverload`` /
``HigherOrderOperator`` and their ``_schema``), ``torch.utils._pytree`` and
``torch.utils._python_dispatch.TorchDispatchMode``, which every torch tool
uses and 2.13 offers no public alternative for.  Atomic writes: 2.13 has only
private helpers (``torch._inductor.codecache.write_atomic``, which imports
Inductor, and ``torch._dynamo.aot_compile.atomic_write_binary``), so the
kernel store (``torch/_precompile_kernel_store.py``) keeps its own
``write_atomically`` (the load path must not import Inductor).  MKLDNN: the
public ``torch.backends.mkldnn.flags`` is used directly.
"""

import contextlib
import functools
import os
import re
import sys
import traceback
import types
from typing import Any, Callable, Iterable

import torch


# ---------------------------------------------------------------------------
# Supported torch releases
# ---------------------------------------------------------------------------

# The torch releases (major, minor) this module has a path for, first and last.
SUPPORTED_TORCH = ((2, 11), (2, 14))


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as ``2.11.0+cu130`` or ``2.15.0a0+git``."""
    # String methods, not a regex: compiling one costs the package's import ~0.3 ms.
    major, minor = version.split(".")[:2]
    return int(major), int(minor[: len(minor) - len(minor.lstrip("0123456789"))])


def check_torch_version(version: str) -> None:
    """Refuse a torch release outside SUPPORTED_TORCH, naming it and the range."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TORCH
    if not SUPPORTED_TORCH[0] <= torch_release(version) <= SUPPORTED_TORCH[1]:
        raise ImportError(
            f"torch-precompile supports torch {low_major}.{low_minor} to {high_major}.{high_minor}, but "
            f"torch {version} is installed: install a supported torch "
            f"(pip install 'torch>={low_major}.{low_minor},<{high_major}.{high_minor + 1}')"
        )


# The paths below rely on one release's internals each; an unknown release
# would fail deep inside a capture instead of here.
check_torch_version(torch.__version__)
TORCH_RELEASE = torch_release(torch.__version__)


# ---------------------------------------------------------------------------
# Autograd and storage
# ---------------------------------------------------------------------------

# Whether two tensors share a storage (overlapping or not); no public API as of 2.13.
is_alias_of = torch._C._is_alias_of
# The autograd Node running now (None outside the engine); no public API as of 2.13.
current_autograd_node = torch._C._current_autograd_node
# A Tensor subclass's __torch_function__ that makes it behave as a plain tensor
# (nn.Parameter's); no public name as of 2.13.
disabled_torch_function_impl = torch._C._disabled_torch_function_impl
# A context that runs ops below autocast on every device (its dispatch keys
# excluded); torch 2.11-2.14 can only disable autocast publicly one device at a time.
autocast_disabled = torch._C._DisableAutocast


def saved_tensors_hooks_active() -> bool:
    """Whether a ``torch.autograd.graph.saved_tensors_hooks`` context is active on this thread."""
    # torch 2.11-2.14 can enter the hooks publicly but not read them; the
    # private reader's flag (2.5+) would ignore Dynamo's compiled autograd.
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def held_by_module(module: torch.nn.Module, name: str) -> bool:
    """Whether nn.Module's own tables (parameters, buffers, submodules) hold ``name``."""
    # torch 2.11-2.14 keep them in the private dicts nn.Module.__getattr__ reads; no public query by name.
    tables = vars(module)
    return any(name in tables.get(table, ()) for table in ("_parameters", "_buffers", "_modules"))


def import_tensor_attribute_readers() -> None:
    """Import (and fill the caches of) what lists Tensor's attributes once, before capture wraps them."""
    # torch._dynamo lists TensorBase's getset descriptors when first imported (torch 2.11's
    # make_fx imports it mid-trace; capture imports it on every release anyway): imported under
    # the wrappers it fails, or would keep them.  torch.overrides caches dir(Tensor) in the
    # private _get_tensor_methods (2.11-2.14) and get_overridable_functions (~5 ms, once).
    import torch._dynamo  # noqa: F401

    torch.overrides.get_overridable_functions()
    torch.overrides._get_tensor_methods()


def tensor_attribute(name: str) -> Any:
    """The C property or method ``Tensor.<name>`` resolves to, which capture wraps to note or refuse reads."""
    # torch 2.11-2.14 define them on the private torch._C.TensorBase (torch.Tensor inherits them).
    return vars(torch._C.TensorBase)[name]


def torch_modes_active() -> bool:
    """Whether a TorchFunctionMode (a default device's DeviceContext included) or a
    TorchDispatchMode is active on this thread."""
    # torch 2.11-2.14 have no public reader of either mode stack.
    return torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0


# The mode queries fn can branch on.  torch re-exports the torch._C builtins
# and code looks them up on either module when it calls them, so capture wraps
# both attributes while fn is traced (2.11-2.14: no hook says who asked).
MODE_QUERIES = {
    "is_grad_enabled": (torch, torch._C),
    "is_inference_mode_enabled": (torch, torch._C),
}


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any):
    """``owner.name`` is ``value`` inside; restored on exit (deleted where ``owner`` only inherited it)."""
    missing = object()
    original = vars(owner).get(name, missing)  # inherited (TensorBase's) when missing
    setattr(owner, name, value)
    try:
        yield
    finally:
        if original is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


@contextlib.contextmanager
def wrapped_mode_queries(wrap: Callable[[str, Callable], Callable]):
    """Inside, each of MODE_QUERIES is ``wrap(name, original)``; restored on exit."""
    originals = {name: getattr(modules[0], name) for name, modules in MODE_QUERIES.items()}
    try:
        for name, modules in MODE_QUERIES.items():
            wrapper = wrap(name, originals[name])
            for module in modules:
                setattr(module, name, wrapper)
        yield
    finally:
        for name, modules in MODE_QUERIES.items():
            for module in modules:
                setattr(module, name, originals[name])


def without_dispatch_modes() -> contextlib.AbstractContextManager:
    """Run real ops inside a TorchDispatchMode handler: the modes below it are off inside."""
    # No public API as of 2.13: torch.utils._python_dispatch's own helper.
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


# ---------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------


def register_log_alias(name: str, module: str) -> None:
    """Make ``TORCH_LOGS=name`` enable ``module``'s logger."""
    # torch 2.13 has no public registration for an out-of-tree log alias
    # (torch._logging.set_logs only sets registered ones): private register_log.
    import torch._logging._internal

    torch._logging._internal.register_log(name, module)


# ---------------------------------------------------------------------------
# Capture: module tensors, export flags, optimizer hooks
# ---------------------------------------------------------------------------


def reparametrized(module: torch.nn.Module, mapping: dict) -> contextlib.AbstractContextManager:
    """Context manager: ``module``'s parameters/buffers by FQN are ``mapping``'s tensors inside."""
    # Public torch.func.functional_call swaps tensors around one module call only;
    # capture needs the swap around all of fn: the private context manager it uses.
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, mapping)


@contextlib.contextmanager
def seen_as_parameters(tensors: list):
    """Inside, ``isinstance(t, nn.Parameter)`` is True for each of ``tensors`` (capture's stand-ins
    of parameters, plain traced tensors), as it is for the parameters eager fn reads."""
    # torch 2.11-2.14: _ParameterMeta.__instancecheck__ answers True for a tensor whose private
    # _is_param attribute is true (what torch's own tracing sets); no public way to say so.
    marked = [t for t in tensors if not isinstance(t, torch.nn.Parameter)]
    for tensor in marked:
        tensor._is_param = True
    try:
        yield
    finally:
        for tensor in marked:
            vars(tensor).pop("_is_param", None)


def compiling_and_exporting() -> contextlib.AbstractContextManager:
    """``torch.compiler.is_compiling()`` and ``is_exporting()`` true inside, restored on exit."""
    # torch 2.13 has public readers for the flags but no setter: torch.export's
    # non-strict capture uses this private helper.
    from torch._export.utils import _compiling_state_context

    return _compiling_state_context()


@contextlib.contextmanager
def checkpoint_regions_as_in_eager():
    """Inside, torch.utils.checkpoint's selective checkpointing (``context_fn=
    create_selective_checkpoint_contexts``) saves and recomputes as in eager, also under make_fx.

    Its dispatch modes ask ``torch.utils.checkpoint._is_compiling`` (torch 2.11-2.14: true under any
    proxy mode, unless torch's non-strict tracing flag is set), and then keep every op's output for a
    compiler's partitioner and hand it back at recomputation instead of running the op: a random op
    is not drawn again, and an output a later in-place op of the region writes (dropout's mask) trips
    its "has been mutated" check.  Process-global while set, like the compiling flags."""
    import torch.utils.checkpoint as checkpoint

    original = checkpoint._is_compiling
    checkpoint._is_compiling = _not_compiling
    try:
        yield
    finally:
        checkpoint._is_compiling = original


def _not_compiling(func: Any, args: Any, kwargs: Any) -> bool:
    return False


def compiling_flag() -> bool:
    # The variable behind torch.compiler.is_compiling(); no public setter as of 2.13.
    return torch.compiler._is_compiling_flag


def set_compiling_flag(value: bool) -> None:
    torch.compiler._is_compiling_flag = value


def optimizer_has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` or every optimizer (globally) has step pre/post hooks."""
    # torch 2.13 can register step hooks publicly but not list them: private attributes.
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    return bool(
        optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or _global_optimizer_pre_hooks
        or _global_optimizer_post_hooks
    )


@functools.cache
def module_containers() -> dict[str, str]:
    """The containers nn.Module keeps in each instance's ``__dict__``, by attribute, with
    what an entry of each is: "parameter", "buffer", "submodule", a hook kind ("forward
    pre-hook", "state_dict hook", ...), or "" for bookkeeping kept beside them (which
    forward hooks take kwargs, the non-persistent buffers' names)."""
    # torch 2.11-2.14 keep parameters, buffers, children and every kind of hook in private
    # per-instance dicts and sets, created by nn.Module.__init__; there is no public way
    # to list hooks, nor to put an entry back without running registration hooks.
    named = {"_parameters": "parameter", "_buffers": "buffer", "_modules": "submodule"}
    return {
        name: named.get(name) or _hook_kind(name)
        for name, value in vars(torch.nn.Module()).items()
        if isinstance(value, (dict, set))
    }


def _hook_kind(attribute: str) -> str:
    """``_forward_pre_hooks`` -> "forward pre-hook", ``_state_dict_hooks`` -> "state_dict hook"; else ""."""
    if not attribute.endswith("_hooks"):
        return ""
    base = attribute.strip("_").removesuffix("_hooks")
    for stage in ("pre", "post"):
        if base.endswith("_" + stage):
            return f"{base.removesuffix('_' + stage)} {stage}-hook"
    return f"{base} hook"


def compiled_module_original(module: torch.nn.Module) -> torch.nn.Module | None:
    """The module ``torch.compile(module)`` wrapped, where ``module`` is that wrapper; else None."""
    # torch 2.11-2.14: torch.compile of an nn.Module returns the private
    # torch._dynamo.eval_frame.OptimizedModule, holding the module as ``_orig_mod``.
    if "torch._dynamo.eval_frame" not in sys.modules:  # nothing was torch.compile'd: not imported
        return None
    from torch._dynamo.eval_frame import OptimizedModule

    return module._orig_mod if isinstance(module, OptimizedModule) else None


# ---------------------------------------------------------------------------
# Dynamic-dim marks (torch._dynamo.decorators.mark_unbacked & co.)
# ---------------------------------------------------------------------------


# The tensor attributes torch._dynamo.decorators' mark_* set; no public reader as of 2.13.
MARK_ATTRIBUTES = (
    "_has_dynamo_dim_marking",  # torch 2.13+: set by mark_unbacked, mark_dynamic, maybe_mark_dynamic
    "_dynamo_dynamic_indices",
    "_dynamo_weak_dynamic_indices",  # maybe_mark_dynamic
    "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices",
    "_dynamo_unbacked_bounds",  # torch 2.12+ (2.11's mark_unbacked takes no min=/max=)
    "_dynamo_shape_ids",
)


def dim_marks(tensor: torch.Tensor) -> types.SimpleNamespace:
    """The marks on ``tensor``: ``marked`` (any mark at all), the ``dynamic`` (mark_dynamic,
    backed) and ``unbacked`` (mark_unbacked, strict or not) dims, and the ``bounds``
    ({dim: (min, max)}) and ``shape_ids`` ({dim: id}) given to mark_unbacked.

    A SimpleNamespace, not a NamedTuple, whose class creation would cost ~0.2 ms
    of every ``import torch`` (the entry-point shim imports this module).
    """
    flag, dynamic, weak, unbacked, strict, bounds, shape_ids = (getattr(tensor, name, None) for name in MARK_ATTRIBUTES)
    return types.SimpleNamespace(
        # torch 2.11/2.12 set no flag: any dim index set those three functions fill is a mark.
        marked=bool(flag or dynamic or weak or unbacked or strict),
        dynamic=frozenset(dynamic or ()),
        unbacked=frozenset(unbacked or ()) | frozenset(strict or ()),
        bounds=dict(bounds or {}),
        shape_ids=dict(shape_ids or {}),
    )


def mark_free_dim(tensor: torch.Tensor, dim: int, shape_id: str | None, low: int, high: int | None) -> None:
    """``mark_unbacked(tensor, dim, shape_id=, min=, max=)``: torch 2.11-2.14 have it only in the
    private ``torch._dynamo.decorators``; 2.11's takes neither shape_id nor bounds (then unbounded
    and unshared: the trace's own equalities merge what must be one size)."""
    from torch._dynamo.decorators import mark_unbacked

    if TORCH_RELEASE >= (2, 12):
        mark_unbacked(tensor, dim, shape_id=shape_id, min=low, max=high)
    else:
        mark_unbacked(tensor, dim)


# ---------------------------------------------------------------------------
# Symbolic tracing: fake tensors with unbacked dims, ShapeEnv internals
# ---------------------------------------------------------------------------


def symbolic_fake_mode() -> tuple:
    """(shape_env, fake_mode): a fresh ShapeEnv and a FakeTensorMode over it."""
    # torch._subclasses is private in 2.13; no public fake-tensor mode constructor.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    return shape_env, FakeTensorMode(shape_env=shape_env)


def fake_with_unbacked_dims(fake_mode: Any, tensor: torch.Tensor, name: str, dims: dict) -> torch.Tensor:
    """A fake of ``tensor`` whose ``dims`` ({dim: (shape_id, min, max)}) are unbacked symints, the rest static."""
    # No public API as of 2.13: Dynamo's StatelessSymbolicContext (shape_ids=,
    # unbacked_bounds=) and a LocalSource to name the input in guards.
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    bounds = {d: (low, high) for d, (_, low, high) in dims.items()}
    # torch 2.11's context has no unbacked_bounds: the bounds are applied below,
    # as 2.12+ applies them (torch._check on the fresh symbol).
    with_bounds = {} if TORCH_RELEASE < (2, 12) else {"unbacked_bounds": bounds}
    context = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.UNBACKED if d in dims else DimDynamic.STATIC for d in range(tensor.dim())],
        shape_ids={d: shape_id for d, (shape_id, _, _) in dims.items()},
        **with_bounds,
    )
    fake = fake_mode.from_tensor(tensor, symbolic_context=context, source=LocalSource(name))
    if not with_bounds:
        for d, (low, high) in bounds.items():
            if low is not None:
                torch._check(fake.shape[d] >= low)
            if high is not None:
                torch._check(fake.shape[d] <= high)
    return fake


# ShapeEnv's state after a trace; no public API as of 2.13 (plain ShapeEnv attributes).
def shape_env_replacements(shape_env: Any) -> dict:
    """{symbol: expression} the trace specialized or unified symbols to."""
    return shape_env.replacements


def shape_env_deferred_asserts(shape_env: Any) -> list:
    """Every deferred runtime assert the trace recorded (each has ``.expr``)."""
    return [requirement for asserts in shape_env.deferred_runtime_asserts.values() for requirement in asserts]


def symbol_made_at(shape_env: Any, symbol: Any) -> list:
    """The stack (``traceback.FrameSummary``s, outermost first) where the trace made ``symbol``, or []."""
    # torch 2.11-2.14 keep it in the private ShapeEnv.var_to_stack, as a CapturedTraceback.
    captured = getattr(shape_env, "var_to_stack", {}).get(symbol)
    return list(captured.summary()) if captured is not None else []


def forget_pending_unbacked_symbols(shape_env: Any) -> None:
    """Symbols made while creating inputs, not by an op: nothing needs to bind them."""
    shape_env.pending_fresh_unbacked_symbols.clear()


def needs_concrete_sizes(error: RuntimeError) -> bool:
    """Whether ``error`` is c10's refusal to give a symbolic-size tensor's element count or
    sizes as integers (``bool(t)``, ops without symbolic-size support): torch 2.11-2.14 raise it
    as a plain RuntimeError, with no type of its own, so its text identifies it."""
    return str(error).startswith(("Cannot call numel() on tensor with symbolic sizes", "Cannot call sizes() on tensor with symbolic sizes"))


def is_fake(tensor: Any) -> bool:
    # torch._subclasses is private in 2.13; no public is-fake test.
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return _is_fake(tensor)


# ---------------------------------------------------------------------------
# FX graphs: effects, rendering, stack traces
# ---------------------------------------------------------------------------


def has_effects(op: Any) -> bool:
    # No public API as of 2.13: the private registry of effectful ops.
    from torch._higher_order_ops.effects import has_effects as _has_effects

    return _has_effects(op)


def is_traceable_wrapper_subclass(tensor: Any) -> bool:
    # DTensor & co.; no public API as of 2.13 (torch.utils._python_dispatch).
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass as _is_wrapper

    return _is_wrapper(tensor)


def rename_node(node: torch.fx.Node, name: str) -> None:
    # torch 2.13 has no public Node rename that keeps the graph's namespace
    # consistent: private Node._rename.
    node._rename(name)


def fx_builtin_imports(names: Any) -> tuple[list[str], list[str]]:
    """(sorted import lines for the FX builtins among ``names``, sorted names that are none).

    ``names`` are the globals of ``Graph.python_code()``.
    """
    # torch 2.13 has no public map from python_code()'s globals to import lines:
    # private torch.fx.graph._custom_builtins.
    from torch.fx.graph import _custom_builtins

    imports = sorted({_custom_builtins[name].import_str for name in names if name in _custom_builtins})
    return imports, sorted(set(names) - set(_custom_builtins))


def record_frames_of(fn: Callable) -> None:
    """Keep ``fn``'s own frames in the stack traces make_fx records for graph nodes.

    Call it inside the function make_fx traces, before ``fn`` runs.
    """
    # make_fx's tracer keeps only frames named ``forward`` and registered
    # anchors, so an op written in fn itself would have no source line; torch
    # 2.13+ registers anchors only through this private helper (a process-wide set).
    code = getattr(fn, "__code__", None)
    if code is None:  # not a Python function: no frames of its own
        return
    if TORCH_RELEASE >= (2, 13):
        from torch.fx.proxy import _register_stack_trace_anchor

        _register_stack_trace_anchor(fn)
        return
    # torch 2.11/2.12 have no anchors: extend the running tracer's frame filter
    # (an overridable method) on that tracer instance alone, as 2.13 does.
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    tracer = get_proxy_mode().tracer
    kept_by_torch = type(tracer)._filter_traceback_frames
    anchor = (code.co_filename, code.co_name)

    def filter_frames(summary: traceback.StackSummary) -> traceback.StackSummary:
        kept = {id(frame) for frame in kept_by_torch(tracer, summary)}
        return traceback.StackSummary.from_list(
            [frame for frame in summary if id(frame) in kept or (frame.filename, frame.name) == anchor]
        )

    tracer._filter_traceback_frames = filter_frames


def innermost_frame(stack_trace: str | None, keep: Callable[[str], bool]) -> tuple | None:
    """(file, lineno, name, code) of the innermost frame of ``stack_trace`` whose file ``keep`` accepts."""
    # The parser FX's own verbose codegen uses; torch 2.13 has no public one
    # (torch.fx.traceback only formats): private torch.fx.graph._parse_stack_trace.
    from torch.fx.graph import _parse_stack_trace

    frame = _parse_stack_trace(stack_trace, lambda file, name, code: keep(file)) if stack_trace else None
    if frame is None:
        return None
    # It takes the line after a frame's as its code; a frame without source (code
    # read from stdin or exec'd) is followed by the next frame's line instead.
    code = "" if frame.code.startswith('File "') else frame.code
    return frame.file, int(frame.lineno), frame.name, code


# ---------------------------------------------------------------------------
# Inductor
# ---------------------------------------------------------------------------

# The names Inductor's generated module imports from torch._inductor that the
# driver provides itself (bind_inductor_graph), so the warm path never imports
# torch._inductor; the module's layout is private in 2.13.
INDUCTOR_MODULE = "torch._inductor"
INDUCTOR_STAND_INS = frozenset({"AsyncCompile", "extern_kernels", "align", "maybe_profile", "run_intermediate_hooks"})


# Whether Inductor rounds a narrowing float cast that is cast straight back
# (under emulate_precision_casts): 2.13+; 2.11/2.12 compute it in float32.
INDUCTOR_KEEPS_ROUNDING_CASTS = TORCH_RELEASE >= (2, 13)

# Whether Inductor's scheduler keeps random draws in the graph's order where no data orders
# them (a draw only a graph output keeps): 2.13+; 2.11 ran such a draw after later ones
# (2.12 is taken to do so too).
INDUCTOR_KEEPS_DRAW_ORDER = TORCH_RELEASE >= (2, 13)

# Whether make_fx records Tensor.detach() (and .data) as aten.alias, the op x[...] also
# traces to: 2.14; 2.11-2.13 record aten.detach.
DETACH_TRACES_AS_ALIAS = TORCH_RELEASE >= (2, 14)


def inductor_decompositions() -> dict:
    """The decompositions Inductor applies to an ATen graph before lowering it (op -> Python
    function): ``torch._inductor.decomposition.select_decomp_table``, private in 2.11-2.14."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def in_one_fake_mode(values: Any) -> tuple:
    """(a fake tensor mode, ``values`` with each tensor a fake tensor of it): the mode of the
    fake tensors in ``values`` where they share one (a symbolic trace's), else a new mode's
    copies of them (a real trace makes each in a mode of its own).  FakeTensor and
    FakeTensorMode are private in 2.11-2.14."""
    import torch.utils._pytree as pytree
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    modes = {v.fake_mode for v in pytree.tree_leaves(values) if isinstance(v, FakeTensor)}
    if len(modes) == 1:
        return modes.pop(), values
    mode = FakeTensorMode()

    def copy(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)

    with mode:
        return mode, pytree.tree_map(copy, values)


def inductor_compile(graph: torch.fx.GraphModule, example_inputs: list, config: dict) -> list:
    """Compile ``graph`` with Inductor under ``config``: (compiled, inputs, outputs) per inner graph.

    Each compiled inner graph has ``.source_code`` (Inductor's Python module)
    unless Inductor generated none; its outputs have ``graph``'s strides
    (_outputs_in_strides), its C++ integer divisions check their divisor
    (_integer_divisors_checked), and its tiled C++ kernels index as torch
    2.14's do (_tiled_kernels_indexed_right).
    """
    # torch 2.13 has no public "compile to Python" entry point (compile_fx returns
    # a callable): keep each inner graph through compile_fx's private
    # inner_compile hook, which calls compile_fx_inner.
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    compiled = []
    eager_strides = [
        None if _aliases_an_input(node) else _dense_static_stride(node.meta.get("val"))
        for node in graph.graph.output_node().args[0]
    ]

    def keep_inner(gm, inputs, **kwargs):
        _outputs_in_strides(gm, eager_strides)
        result = compile_fx_inner(gm, inputs, **kwargs)
        placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        compiled.append((result, placeholders, len(gm.graph.output_node().args[0])))
        return result

    # Inductor's config is process-global: callers hold _PRECOMPILE_LOCK.
    with inductor_config.patch(config), _integer_divisors_checked(), _tiled_kernels_indexed_right():
        compile_fx(graph, example_inputs, inner_compile=keep_inner)
    return compiled


def node_being_lowered(errors: Iterable[BaseException]) -> torch.fx.Node | None:
    """The FX node Inductor was lowering when the first of ``errors`` (a chain of exceptions,
    each raised from the next) that passed through its lowering was raised."""
    # torch 2.11-2.14 name no node in what a lowering raises (its LoweringException names
    # the op): GraphLowering.run_node(self, n) is on the traceback of one in the chain.
    for error in errors:
        traceback = error.__traceback__
        while traceback is not None:
            frame = traceback.tb_frame
            if frame.f_code.co_name == "run_node" and isinstance(frame.f_locals.get("n"), torch.fx.Node):
                return frame.f_locals["n"]
            traceback = traceback.tb_next
    return None


# Inductor's C++ integer divisions (torch 2.11-2.14): CppOverrides' scalar ops, and
# CppVecOverrides' vectorized ones; `mod` it vectorizes lane by lane from the scalar op.
_SCALAR_DIVISIONS = ("floordiv", "truncdiv", "mod")
_VECTORIZED_DIVISIONS = ("floordiv", "truncdiv", "remainder")
_LANE_BY_LANE_DIVISIONS = ("mod",)


@contextlib.contextmanager
def _integer_divisors_checked() -> Any:
    """Inductor's C++ codegen, while open, checks each integer divisor before dividing.

    Eager raises ``RuntimeError("ZeroDivisionError")`` on an integer division
    by zero; C++'s ``/`` and ``%`` kill the process (SIGFPE).  Inductor's CPU
    code divides unchecked in ``truncdiv`` (torch 2.11-2.14), and in
    ``floordiv``, ``mod`` (``%`` and ``fmod`` of integers) and ``remainder``
    on 2.11-2.12 (2.13 checks those,
    with a message naming its C++ function: these checks run first, so the
    message is eager's).  Each division is emitted as
    ``(precompile_check_divisor(b), <Inductor's expression>)``, and each kernel
    that calls it defines it (_DIVISOR_CHECK) before its function.  A
    vectorized division checks the divisor Inductor's expression divides by,
    whose lanes past the loop's end it sets to 1.  inductor_post_grad_pass's
    uuid hashes this file, so the FX graph cache never reuses a graph compiled
    without the checks.
    """
    # The overrides are private classes of torch 2.11-2.14 with static methods
    # returning C++ text; none has a hook for it.
    from torch._inductor.codegen import cpp

    scalar, vectorized = cpp.CppOverrides, cpp.CppVecOverrides
    vec_truncdiv, codegen_group = vectorized.truncdiv, cpp.KernelGroup.codegen_group

    def checked(original: Callable, divisor: Callable[[Any, Any], str]) -> staticmethod:
        @functools.wraps(original)  # the lane-by-lane form reads the op's name
        def division(a: Any, b: Any) -> str:
            return f"(precompile_check_divisor({divisor(a, b)}), {original(a, b)})"

        return staticmethod(division)

    def with_divisor_check(self: Any, *args: Any, **kwargs: Any) -> str:  # one kernel's C++ source
        kernel = codegen_group(self, *args, **kwargs)
        function = kernel.find('extern "C"')
        if function < 0 or "precompile_check_divisor(" not in kernel:
            return kernel
        return kernel[:function] + _DIVISOR_CHECK + kernel[function:]

    with contextlib.ExitStack() as stack:
        for name in _SCALAR_DIVISIONS:
            stack.enter_context(patched(scalar, name, checked(getattr(scalar, name), lambda a, b: b)))
        for name in _VECTORIZED_DIVISIONS:
            divisor = functools.partial(_vectorized_divisor, vec_truncdiv)
            stack.enter_context(patched(vectorized, name, checked(getattr(vectorized, name), divisor)))
        for name in _LANE_BY_LANE_DIVISIONS:  # as CppVecOverrides makes them at import, from the checked scalar op
            lanes = vectorized._scalarize(getattr(scalar, name))
            lanes.__name__ = name
            stack.enter_context(patched(vectorized, name, staticmethod(lanes)))
        stack.enter_context(patched(cpp.KernelGroup, "codegen_group", with_divisor_check))
        yield


# torch 2.13 leaves a tile whose index reads an indirect index untransposed; 2.14 also
# moves a tiled kernel's parallel atomic add once itself.
INDUCTOR_KEEPS_INDIRECT_TILES_IN_LOOP = TORCH_RELEASE >= (2, 13)
INDUCTOR_INDEXES_TILED_ATOMIC_ADDS_ONCE = TORCH_RELEASE >= (2, 14)


@contextlib.contextmanager
def _tiled_kernels_indexed_right() -> Any:
    """Inductor's 2-D tiled C++ kernels (``CppTile2DKernel``), while open, index as torch 2.14's do.

    * A parallel atomic add (the scatter-add of an index's backward) is
      indexed once.  The kernel moves its outer tiled loop variable ``x`` to
      ``x + x_inner`` in each index before ``CppVecKernel.store`` writes, which
      turns an atomic add's index into ``ops.index_expr``, and the kernel's
      overrides move that again (torch 2.11-2.13): the C++ added at
      ``x + 2 * x_inner``, into the wrong elements, silently.  Falcon's
      multi-query attention (``fused_qkv[..., [-2], :]``) trained with the
      gradients of each attention's qkv projection, and of all below it, off
      by 0.3%.  Such a store now reaches ``CppVecKernel.store`` unmoved.
    * A load whose index reads an indirect index (a tensor's value) is not
      transposed as a tile (torch 2.11-2.12): the tile is read before the
      loop that defines the index, and the C++ did not compile.

    inductor_post_grad_pass's uuid hashes this file, so the FX graph cache never
    reuses a graph compiled without these.
    """
    # CppTile2DKernel's store and need_vec_transpose are private methods of torch
    # 2.11-2.13 without a hook.  The single-threaded atomic add (a load, add and
    # store at the index it is given) and transposed tiles index correctly.
    from torch._inductor import config as inductor_config
    from torch._inductor.codegen import cpp
    from torch.utils._sympy.symbol import free_symbol_is_type, SymT

    kernel = cpp.CppTile2DKernel
    tiled_store, tiled_need_vec_transpose = kernel.store, kernel.need_vec_transpose

    @functools.wraps(tiled_store)
    def store(self: Any, name: str, index: Any, value: Any, mode: Any = None) -> Any:
        threaded = inductor_config.cpp.dynamic_threads or self.num_threads != 1  # CppVecKernel.store's test
        if mode == "atomic_add" and threaded and not self.need_vec_transpose(self.rename_indexing(index)):
            return cpp.CppVecKernel.store(self, name, index, value, mode)
        return tiled_store(self, name, index, value, mode)

    @functools.wraps(tiled_need_vec_transpose)
    def need_vec_transpose(self: Any, index: Any) -> bool:
        return not free_symbol_is_type(index, SymT.TMP) and tiled_need_vec_transpose(self, index)

    with contextlib.ExitStack() as stack:
        if not INDUCTOR_INDEXES_TILED_ATOMIC_ADDS_ONCE:
            stack.enter_context(patched(kernel, "store", store))
        if not INDUCTOR_KEEPS_INDIRECT_TILES_IN_LOOP:
            stack.enter_context(patched(kernel, "need_vec_transpose", need_vec_transpose))
        yield


def _vectorized_divisor(vec_truncdiv: Callable, a: Any, b: Any) -> str:
    """The C++ of the divisor Inductor's vectorized ``a / b`` divides by (``b`` with its
    lanes past the loop's end set to 1): vectorized truncdiv emits ``{a} / {divisor}``
    in torch 2.11-2.14."""
    expression, quotient = vec_truncdiv(a, b), f"{a} / "
    if not expression.startswith(quotient):
        raise AssertionError(f"Inductor's vectorized truncdiv is not `a / divisor`: {expression}")
    return expression[len(quotient) :]


def _dense_static_stride(value: Any) -> tuple | None:
    """A non-overlapping, dense tensor's strides where none is a symbol; None for any other value."""
    if not isinstance(value, torch.Tensor) or not has_static_layout(value):
        return None
    return value.stride() if torch._prims_common.is_non_overlapping_and_dense_or_false(value) else None


def _aliases_an_input(node: Any) -> bool:
    """Whether an output node is a graph input or a view of one (the driver rebuilds those)."""
    while isinstance(node, torch.fx.Node) and getattr(node.target, "is_view", False):
        node = node.args[0]
    return not isinstance(node, torch.fx.Node) or node.op == "placeholder"


def _outputs_in_strides(gm: torch.fx.GraphModule, strides: list) -> None:
    """Give the outputs of Inductor's inner graph ``gm`` the ``strides`` of the graph it came from.

    torch 2.11-2.14: Inductor keeps the strides of the graph AOTAutograd hands it,
    which its own decompositions traced: ``index_select`` and ``linalg_cross`` of a
    channels_last tensor come back channels_last where ATen's are contiguous, and a
    ``cat`` of an empty tensor and one other clones that one's layout (a transformers
    DynamicCache's first update came back transposed, and an artifact specialized to
    eager's cache layout refused it; there Inductor's graph returns a view of the
    other input).  Each such output goes through ``prims.copy_strided``, which
    Inductor lowers to a required stride order (the producer writes in it, or a copy
    does).  ``strides`` has None where the output is left as it is: an input or a view
    of one (the driver rebuilds those), not dense, or sizes with symbols (asking their
    layout would add guards).
    """
    output = gm.graph.output_node()
    values, relaid = list(output.args[0]), {}
    if len(values) != len(strides):
        return  # not the one graph precompile compiles: inductor_compile's caller refuses it
    for position, (node, stride) in enumerate(zip(values, strides)):
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if stride is None or not isinstance(value, torch.Tensor) or not has_static_layout(value) or value.stride() == stride:
            continue
        if node not in relaid:  # an output returned twice stays one tensor
            with gm.graph.inserting_before(output):
                relaid[node] = gm.graph.call_function(torch.ops.prims.copy_strided.default, (node, stride))
            relaid[node].meta["val"] = torch.ops.prims.copy_strided.default(value, stride)
        values[position] = relaid[node]
        recorded = output.meta.get("original_output_strides")
        if recorded is not None:  # torch 2.14 records them before inner_compile, and keeps them
            output.meta["original_output_strides"] = [*recorded[:position], stride, *recorded[position + 1 :]]
    output.args = (tuple(values),)
    gm.recompile()


def has_static_layout(tensor: torch.Tensor) -> bool:
    """Whether a (fake) tensor's sizes and strides are all plain ints, none a symbol."""
    return all(type(n) is int for n in (*tensor.shape, *tensor.stride()))


def triton_launch_record(autotuner: Any) -> tuple[dict, bytes] | None:
    """How to launch the config ``autotuner`` settled on, and its cubin; None if it cannot be cached.

    ``autotuner`` is Inductor's ``CachingAutotuner`` (2.11-2.14, private), after
    its first launch (which autotunes), or with its first config when the graph
    could not run at precompile time.  The record is what
    ``StaticTritonCompileResult.make_launcher`` generates its launcher from: the
    grid expressions (``GridExpr``), the arguments the graph passes and those
    the cubin takes, shared memory, warps, and Triton's trailing scratch
    pointers.  A config Inductor launches through Triton's own launcher
    (``TritonCompileResult``: e.g. a kernel name over 150 characters, which
    Triton truncates in its cache's file names, so Inductor's static launch
    finds no cubin) is recorded the same way from Triton's compiled kernel.
    Kernels the static launcher cannot run (launch attributes, scratch memory,
    a grid needing prefix statements) are not cached.
    """
    from torch._inductor.runtime.triton_heuristics import GridExpr, StaticTritonCompileResult

    if not autotuner.launchers:
        return None
    cache_hash = getattr(autotuner.launchers[0], "cache_hash", None)
    result = next((r for r in autotuner.compile_results if _triton_path_key(r.kernel.hash) == cache_hash), None)
    if result is None:
        return None
    if isinstance(result, StaticTritonCompileResult):
        cubin = _read_cached_cubin(result, cache_hash)
    else:
        cubin, result = _as_static_result(autotuner, result)
    if cubin is None:
        return None
    static = result.kernel
    grid = GridExpr.from_meta(result.inductor_meta, result.config)
    if grid.prefix:
        return None
    _, def_args, none_args = result._get_arg_lists(static.arg_names, static.declared_constexprs)
    call_args = [
        name for i, name in enumerate(static.arg_names) if i not in static.full_constexprs and name not in none_args
    ]
    if not set(call_args) <= set(def_args):
        return None
    record = {
        "name": static.name,
        "device": result.compile_meta.get("device") or 0,
        "shared": static.shared,
        "num_warps": static.num_warps,
        "arg_tys": static.arg_tys,
        "scratch": int(getattr(static, "has_global_scratch", False)) + int(getattr(static, "has_profile_scratch", False)),
        "def_args": list(def_args),
        "call_args": call_args,
        "grid": [str(grid.x_grid), str(grid.y_grid), str(grid.z_grid)],
    }
    return record, cubin


def _read_cached_cubin(result: Any, cache_hash: str) -> bytes | None:
    # A statically launched kernel dropped its cubin bytes once loaded; they are
    # still in Triton's cache directory, where Inductor found them.
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    path = os.path.join(triton_cache_dir(result.compile_meta.get("device") or 0), cache_hash, result.kernel.name + ".cubin")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _as_static_result(autotuner: Any, result: Any) -> tuple[bytes | None, Any]:
    """(cubin, StaticTritonCompileResult) of a config compiled to a Triton ``CompiledKernel``."""
    from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    from torch._inductor.runtime.triton_heuristics import StaticTritonCompileResult

    compiled = result.kernel
    cubin, src = compiled.asm.get("cubin"), getattr(compiled, "src", None)
    launch_attributes = getattr(compiled.metadata, "launch_pdl", False) or getattr(
        compiled.metadata, "launch_cooperative_grid", False
    )
    if cubin is None or src is None or launch_attributes:
        return None, result
    # What StaticallyLaunchedCudaKernel reads of a CompiledKernel; a kernel
    # compiled in a worker process comes back without its JITFunction (src.fn).
    view = types.SimpleNamespace(
        src=types.SimpleNamespace(fn=autotuner.fn, signature=src.signature, constants=getattr(src, "constants", {})),
        asm=compiled.asm,
        metadata=compiled.metadata,
        hash=compiled.hash,
        _cubin_path=None,
    )
    try:
        static = StaticallyLaunchedCudaKernel(view)
    except NotImplementedError:  # scratch memory, launch hooks, clusters
        return None, result
    return cubin, StaticTritonCompileResult(static, result.config, result.compile_meta, result.inductor_meta)


def _triton_path_key(kernel_hash: str) -> str:
    from torch._inductor.runtime.runtime_utils import triton_hash_to_path_key

    return triton_hash_to_path_key(kernel_hash)


def inductor_realize_op() -> Any:
    """``torch.ops._precompile.realize``: Inductor computes its input into a buffer of its own.

    Lowered as Inductor's test-only ``torch.ops._inductor_test.realize`` (which
    torch 2.13 defines only in ``torch._inductor.test_operators``): realize the
    input, then read it.  Eager and fake semantics are a copy.  Defined once
    per process, on the first Inductor lowering.
    """
    if not hasattr(torch.ops._precompile, "realize"):
        from torch._inductor.lowering import clone, register_lowering

        @torch.library.custom_op("_precompile::realize", mutates_args=())
        def realize(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @realize.register_fake
        def _(x):
            return torch.empty_like(x)

        @register_lowering(torch.ops._precompile.realize.default)
        def _(x):
            x.realize()
            return clone(x)

    return torch.ops._precompile.realize.default


def inductor_post_grad_pass(graph_pass: Callable[[torch.fx.Graph], None], assumed: str) -> Any:
    """``graph_pass`` as Inductor's ``post_grad_custom_post_pass`` config value.

    Inductor takes it as a ``CustomGraphPass`` (private in 2.13) whose uuid keys
    its FX graph cache: the hash of the file that defines the pass and of this
    one (Inductor's own helper), so an edit to the pass, to a setting beside it
    or to the codegen this file patches (_integer_divisors_checked,
    _tiled_kernels_indexed_right) never reuses
    a graph the old version produced; and ``assumed``, the size facts the graph
    was captured with, which the cache's key does not see: a graph compiled
    assuming a fact about free sizes is never reused for one captured without it.
    """
    # CustomGraphPass derives from ABC on torch 2.11/2.12 and from CustomPassBase
    # on 2.13+; a subclass defining __call__ and uuid is accepted by each.
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    version = get_hash_for_files((graph_pass.__code__.co_filename, __file__)).hex() + assumed

    class _Pass(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            graph_pass(graph)

        def uuid(self) -> str:
            return version

    return _Pass()


# Inductor's generated call() (a private format) first unpacks its inputs
# (``arg0_1, arg1_1 = args``), then asserts each input's size and stride:
# ``assert_size_stride(arg0_1, size, stride)`` on torch 2.11/2.12, the same
# with an ``'input'`` tag on 2.13, and on 2.14 one
# ``assert_size_stride_grouped((arg0_1, arg1_1), sizes, strides, 'input')``
# for several inputs.
# Patterns, compiled by re at their first use (a capture), not at import.
_INDUCTOR_CALL_INPUTS = r"^[ \t]*def call\((?:self, )?args\):\n[ \t]+([\w, ]+) = args\n"
_INDUCTOR_ASSERT = r"^[ \t]*(?:assert_size_stride\(([A-Za-z_]\w*)|assert_size_stride_grouped\(\(([\w, ]+)\)), .*\)\n"


def without_input_asserts(source: str) -> str:
    """Inductor's module without its graph-input size/stride asserts.

    The driver checks exactly that before every call (Note invariant 3:
    its tensor guard on the fast path, and for inputs with free dims their memory
    format and bounds), and the repeated asserts cost about 0.5 us each.  The
    asserts on extern kernels' outputs stay: they check Inductor's own stride
    predictions, which nothing else does.
    """
    # torch 2.11-2.14 can only turn all size asserts off (config.size_asserts).
    def names(text: str) -> set[str]:
        return {name.strip() for name in text.split(",")} - {""}

    inputs = set().union(*map(names, re.findall(_INDUCTOR_CALL_INPUTS, source, re.MULTILINE)))

    def drop_if_inputs(match: re.Match) -> str:
        return "" if names(match[1] or match[2]) <= inputs else match[0]

    return re.sub(_INDUCTOR_ASSERT, drop_if_inputs, source, flags=re.MULTILINE)


# An extern GEMM call of Inductor's module: `extern_kernels.addmm(..., alpha=1, beta=1, out=buf)`.
_INDUCTOR_DEFAULT_GEMM_SCALARS = r"^([ \t]*extern_kernels\.(?:addmm|baddbmm)\(.*), alpha=1, beta=1(, out=[A-Za-z_]\w*\)\n)"


def without_default_gemm_scalars(source: str) -> str:
    """Inductor's module with its extern ``addmm``/``baddbmm`` calls passing no ``alpha=1, beta=1``.

    Those are torch.addmm's and torch.baddbmm's defaults, so each call computes
    the same, and its keyword parsing costs about 0.4 us (a tiny Linear's call
    is ~3 us).  torch 2.11-2.14 always spell them out.
    """
    return re.sub(_INDUCTOR_DEFAULT_GEMM_SCALARS, r"\1\2", source, flags=re.MULTILINE)


# A C++ kernel's source in Inductor's module: `name = async_compile.cpp_pybinding([...], r'''...''')`.
_INDUCTOR_CPP_KERNEL = r"(cpp_pybinding\(\[[^\]]*\], r''')(.*?)(''')"
_OMP_PARALLEL = r"^[ \t]*#pragma omp parallel\b(?! for)[^\n]*\n"
_OMP_FOR = r"^[ \t]*#pragma omp for\b([^\n]*)\n"
# Keeps the first exception the parallel loop iterations throw, for the kernel to rethrow when it ends.
_FIRST_ERROR = """\
#include <atomic>
#include <exception>
namespace {
// precompile: a C++ exception may not leave an OpenMP region (the process aborts), so each
// parallel loop iteration that throws keeps the first exception, rethrown when the kernel ends.
struct PrecompileFirstError {
    std::atomic<bool> thrown{false};
    std::exception_ptr error;
    void keep() noexcept { if (!thrown.exchange(true)) error = std::current_exception(); }
    void rethrow() const { if (error) std::rethrow_exception(error); }
};
}  // namespace
"""


def with_parallel_checks_raising(source: str) -> str:
    """Inductor's module with its C++ kernels' checks raising from parallel loops too.

    Inductor's CPU kernels check indirect indices with ``TORCH_CHECK``, which throws;
    inside an OpenMP parallel region, where a kernel large enough runs its loop, the
    throw cannot leave the region and the process aborts (an ``nn.Embedding`` given a
    token id past its vocabulary), where eager raises and a smaller kernel raises a
    RuntimeError.  torch 2.11-2.14 generate that; here each parallel loop iteration
    holding a check runs in a ``try`` that keeps the first exception, which the kernel
    rethrows when it ends.  A kernel whose checks are not all in such loops stays as
    Inductor wrote it.
    """
    return re.sub(
        _INDUCTOR_CPP_KERNEL,
        lambda match: match[1] + _catch_in_parallel_loops(match[2]) + match[3],
        source,
        flags=re.DOTALL,
    )


# A call in a kernel that may throw: an index check, or a divisor check (_integer_divisors_checked).
_THROWING_CALL = re.compile(r"\b(?:TORCH_CHECK|precompile_check_divisor)\(")


def _catch_in_parallel_loops(cpp: str) -> str:
    """One kernel's C++ with the ``try`` of with_parallel_checks_raising, or as it was."""
    if not _THROWING_CALL.search(cpp) or "#pragma omp parallel" not in cpp:
        return cpp
    kernel = re.search(r'^extern "C"[^(]*\(', cpp, re.MULTILINE)
    close = None if kernel is None else _matching(cpp, kernel.end() - 1, "(", ")")
    function = None if close is None else _braced_block(cpp, close + 1)
    if function is None:
        return cpp
    # The exception is rethrown where the kernel ends, after Inductor's own cleanup.
    edits = [(kernel.start(), _FIRST_ERROR), (function[0] + 1, "\n    PrecompileFirstError precompile_error;"),
             (function[1], "    precompile_error.rethrow();\n")]  # (offset, text) insertions
    wrapped = []  # spans of the loop bodies wrapped
    for loop in re.finditer(_OMP_FOR, cpp, re.MULTILINE):
        collapse = re.search(r"collapse\((\d+)\)", loop[1])
        body = _innermost_loop_body(cpp, loop.end(), int(collapse[1]) if collapse else 1)
        if body is None:
            return cpp
        if _THROWING_CALL.search(cpp, body[0], body[1]):
            edits += [(body[0] + 1, " try {"), (body[1], "} catch (...) { precompile_error.keep(); } ")]
            wrapped.append(body)
    for region in re.finditer(_OMP_PARALLEL, cpp, re.MULTILINE):
        block = _braced_block(cpp, region.end())
        if block is None:
            return cpp
        for check in _THROWING_CALL.finditer(cpp, block[0], block[1]):
            if not any(start < check.start() < end for start, end in wrapped):
                return cpp  # a check outside the loops wrapped would still abort: leave it as it was
    for offset, text in sorted(edits, key=lambda edit: edit[0], reverse=True):
        cpp = cpp[:offset] + text + cpp[offset:]
    return cpp


# The divisor check of _integer_divisors_checked: eager's error where a C++ division would kill the process.
_DIVISOR_CHECK = """\
#include <stdexcept>
namespace {
// precompile: an integer division by zero raises eager's error, where C++ kills the process (SIGFPE).
// (The kernel's Python binding raises RuntimeError with the message, as eager's.)
template <typename T>
inline void precompile_check_divisor(const T& divisor) {
    if constexpr (std::is_integral_v<T>) {
        if (C10_UNLIKELY(divisor == 0)) throw std::runtime_error("ZeroDivisionError");
    }
}
#if INDUCTOR_USE_VECTOR_TYPES()
template <typename T>
inline void precompile_check_divisor(const at::vec::Vectorized<T>& divisor) {
    if constexpr (std::is_integral_v<T>) {
        alignas(alignof(at::vec::Vectorized<T>)) T lanes[at::vec::Vectorized<T>::size()];
        divisor.store(lanes);
        for (T lane : lanes) precompile_check_divisor(lane);
    }
}
template <typename T, int N>
inline void precompile_check_divisor(const at::vec::VectorizedN<T, N>& divisor) {
    for (int i = 0; i < N; ++i) precompile_check_divisor(divisor[i]);
}
#endif
}  // namespace
"""


def _innermost_loop_body(cpp: str, start: int, depth: int) -> tuple[int, int] | None:
    """(offset of ``{``, offset of its ``}``) of the body of the ``depth``-th nested ``for``
    from ``start`` (an ``omp for collapse(depth)`` nest); None where the text is not that."""
    body = None
    for _ in range(depth):
        header = re.compile(r"\s*for\s*\(").match(cpp, start)
        if header is None:
            return None
        close = _matching(cpp, header.end() - 1, "(", ")")
        body = None if close is None else _braced_block(cpp, close + 1)
        if body is None:
            return None
        start = body[0] + 1
    return body


def _braced_block(cpp: str, start: int) -> tuple[int, int] | None:
    """(offset of ``{``, offset of its ``}``) of the block that begins after whitespace at ``start``."""
    opening = re.compile(r"\s*\{").match(cpp, start)
    if opening is None:
        return None
    close = _matching(cpp, opening.end() - 1, "{", "}")
    return None if close is None else (opening.end() - 1, close)


def _matching(cpp: str, start: int, opening: str, closing: str) -> int | None:
    """Offset of the ``closing`` that matches the ``opening`` at ``start``, skipping
    string and character literals and comments; None if there is none."""
    depth = 0
    tokens = re.compile(r'"(?:\\.|[^"\\])*"|' r"'(?:\\.|[^'\\])*'|//[^\n]*|/\*.*?\*/|[{}()]", re.DOTALL)
    for token in tokens.finditer(cpp, start):
        if token[0] == opening:
            depth += 1
        elif token[0] == closing:
            depth -= 1
            if depth == 0:
                return token.start()
    return None


def inductor_extern_kernels() -> Any:
    # The object generated modules call as extern_kernels.*; private in 2.13.
    from torch._inductor.select_algorithm import extern_kernels

    return extern_kernels


# --- DistributedDataParallel arguments (Note invariant 16) -------------------


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the current backward pass finishes (DDP's python reducer does
    the same); torch 2.11-2.14 have no public API for it."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


# The op namespaces of torch.distributed's communication, same in 2.11-2.14: ProcessGroup's
# ops (``c10d``), the functional collectives and their legacy and autograd forms.  torch has
# no public list of them (nor a tag on the ops).
COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})


def data_parallel_collectives() -> tuple[Any, Any, Any]:
    """``(all_reduce, broadcast, wait_tensor)``: functional collective ops, same in 2.11-2.14.

    ``all_reduce(tensor, "sum", group_name)`` sums a (flat bucket) tensor over
    the group without waiting for it, ``broadcast(tensor, src, group_name)``
    sends rank ``src``'s tensor to all; ``wait_tensor`` waits.  The public
    ``torch.distributed._functional_collectives.all_reduce`` calls the same op
    but waits right away while a tracer is active (``_maybe_wrap_tensor``),
    which would put each bucket's wait next to its launch; issuing the waits
    when backward ends lets it run on meanwhile.
    """
    ops = torch.ops._c10d_functional
    return ops.all_reduce.default, ops.broadcast.default, ops.wait_tensor.default


def fully_shard_group_parameters(group: Any) -> list:
    """The sharded parameters (DTensors) of one fully_shard parameter group, which eager
    FSDP2 all-gathers in one collective.  FSDPParamGroup.fsdp_params and
    FSDPParam.sharded_param are attributes of private classes in 2.11-2.14."""
    return [fsdp_param.sharded_param for fsdp_param in group.fsdp_params]


def fully_shard_collectives() -> tuple[Any, Any, Any]:
    """``(all_gather_into_tensor, reduce_scatter_tensor, wait_tensor)``: functional collective
    ops, same in 2.11-2.14.  ``all_gather_into_tensor(shard, world_size, group_name)``
    concatenates the ranks' shards along dim 0, ``reduce_scatter_tensor(whole, reduce_op,
    world_size, group_name)`` reduces the ranks' tensors ("sum" or "avg") and keeps this
    rank's part of dim 0;
    neither waits (the public wrappers wait at once while a tracer is active)."""
    ops = torch.ops._c10d_functional
    return ops.all_gather_into_tensor.default, ops.reduce_scatter_tensor.default, ops.wait_tensor.default


def fully_shard_cast(dtype: torch.dtype, value: Any) -> Any:
    """``value`` with each floating point tensor in it cast to ``dtype``, as fully_shard's
    mixed precision casts a module's inputs and outputs: FSDP2's private
    ``_apply_to_tensors`` and ``_cast_fp_tensor`` (same in 2.11-2.14)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _cast_fp_tensor
    from torch.distributed.utils import _apply_to_tensors

    return _apply_to_tensors(functools.partial(_cast_fp_tensor, dtype), value)


def is_fully_shard_pre_hook(hook: Any) -> bool:
    """Whether ``hook`` is fully_shard's forward pre-hook (the bound method
    ``FSDPState._pre_forward``, private in 2.11-2.14), not its post-hook."""
    state = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_state")
    return state is not None and getattr(hook, "__func__", None) is state.FSDPState._pre_forward


def put_forward_hook(module: torch.nn.Module, hook: Callable) -> None:
    """``hook`` last among ``module``'s forward hooks, straight into its private hook dict
    (2.11-2.14): register_forward_hook's handle would move the hook counter every
    artifact's driver watches.  The caller restores the dict."""
    module._forward_hooks[-1] = hook


def fully_shard_keeps_unsharded(state: Any, groups: list, root: bool) -> bool:
    """Whether fully_shard leaves the parameters of a module (its state's parameter
    ``groups``) unsharded, registered as plain Parameters, after a forward in grad mode,
    for its backward: the root's, unless its reshard_after_forward was set
    (FSDPState._auto_reshard_after_forward), and those of reshard_after_forward=False
    (FSDPParamGroup.post_forward_mesh_info None).  Private in 2.11-2.14."""
    if root and getattr(state, "_auto_reshard_after_forward", False):
        return bool(groups)
    return any(group.post_forward_mesh_info is None for group in groups)


def fully_shard_divide_factors(group: Any, reduce_dtype: torch.dtype, device_type: str) -> tuple:
    """``(predivide, postdivide, reduce_scatter_op)`` of fully_shard's gradient reduce-scatter
    over ``group`` in ``reduce_dtype``: FSDP2's private ``_get_gradient_divide_factors``
    (same signature in 2.11-2.14), which averages in the collective for float32 and
    bfloat16 and divides before and after a sum for other dtypes."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors

    return _get_gradient_divide_factors(group, None, reduce_dtype, device_type)[:3]


def first_bucket_bytes() -> int:
    # DDP's smaller first bucket (1 MiB), so the first all-reduce starts early;
    # torch.distributed's private module constant in 2.11-2.14.
    import torch.distributed as dist

    return dist._DEFAULT_FIRST_BUCKET_BYTES


# --- Tensor parallel models (Note invariant 17) ------------------------------


# The functional collectives DTensor's redistribution runs, by name, and their schemas
# (same in 2.11-2.14); capture traces stand-ins of the same schemas and retargets them.
TENSOR_PARALLEL_COLLECTIVES = {
    "all_reduce": "(Tensor input, str reduce_op, str group_name) -> Tensor",
    "all_gather_into_tensor": "(Tensor input, int group_size, str group_name) -> Tensor",
    "reduce_scatter_tensor": "(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor",
    "all_to_all_single": "(Tensor input, SymInt[] output_split_sizes, SymInt[] input_split_sizes, str group_name) -> Tensor",
    "wait_tensor": "(Tensor tensor) -> Tensor",
}


def tensor_parallel_collectives() -> dict:
    """{name: functional collective op} of TENSOR_PARALLEL_COLLECTIVES."""
    ops = torch.ops._c10d_functional
    return {name: getattr(ops, name).default for name in TENSOR_PARALLEL_COLLECTIVES}

# DeviceMesh's methods that read this process's place in the mesh (those the running torch
# has: ``_sym_get_coordinate`` is 2.13+).  get_coordinate's answer is also how DTensor asks
# whether this rank is in the mesh at all (``is None``), in Python and, from 2.13, in C++.
MESH_RANK_READS = ("get_coordinate", "_sym_get_coordinate", "get_local_rank", "get_rank")


def rank_read_is_rank_independent(caller: types.FrameType) -> bool:
    """Whether DTensor reads this process's rank (``_sym_get_coordinate`` & co.), from
    ``caller``, for an answer every rank shares, in 2.11-2.14: only where
    ShardingPropagator._adjust_shape_and_stride_args turns an op's shape argument into the
    local shape of a tensor sharded evenly (it drops the offset it computes with the rank).
    Anything else (a sharded embedding's offsets, a random op's, the chunk a Replicate to
    Shard redistribution keeps) makes this rank's graph."""
    frame = caller
    for _ in range(4):  # _utils.py's helpers between the read and the shape adjustment
        if frame is None:
            return False
        if frame.f_code.co_name == "_adjust_shape_and_stride_args":
            shape, spec = frame.f_locals["out_tensor_meta"].shape, frame.f_locals["spec"]
            return all(
                shape[p.dim] % size == 0 for p, size in zip(spec.placements, spec.mesh.shape) if hasattr(p, "dim")
            )
        frame = frame.f_back
    return False
