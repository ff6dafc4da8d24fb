"""Capture, enforce, lower and render: the half of ``torch.compiler.precompile`` that makes artifacts.

``precompile()`` imports this module at its first call; ``load()`` never does,
so a warm start imports only ``torch._precompile`` (the API, the artifact
format and the load pipeline) and the driver.  The contract it enforces is
Note [precompile programming model] in ``torch/_precompile.py``; the private
torch 2.11-2.14 internals it relies on go through ``torch/_precompile_compat.py``.
"""

import ast
import collections
import contextlib
import copy
import dataclasses
import dis
import functools
import inspect
import keyword
import logging
import operator
import os
import pprint
import re
import reprlib
import sys
import threading
import traceback
import types
import weakref
from typing import Any, Callable, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import (
    _precompile_compat as compat,
    _precompile_ddp as ddp,
    _precompile_fsdp as fsdp,
    _precompile_runtime as runtime,
    _precompile_schema as schema,
    _precompile_tp as tp,
)
from ._precompile_format import (
    _driver_source,
    _marker,
    _NO_BYTECODE,
    _parse,
    _SECTIONS,
    describe_arguments,
    driver_parts,
    CONVENTION_VERSION,
)
from ._precompile_schema import (
    CallingConvention,
    ConstantSpec,
    LeafSpec,
    ModuleSpec,
    OptimizerSpec,
    OutputView,
    PrecompileError,
    StateSpec,
    TensorSpec,
)


# ---------------------------------------------------------------------------
# Capture: lift module state, trace fn with make_fx on clones.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _LiftedTensor:
    tensor: torch.Tensor  # the caller's tensor (never written); a DTensor parameter's local shard
    kind: str  # "parameter" | "buffer"
    names: list  # [(module index, fqn), ...]
    sharded: Any = None  # a DTensor parameter's ShardSpec (Note invariant 17)
    param: Any = None  # ... the parameter, a DTensor
    gather_group: int | None = None  # ... and which of the all-gathers gathers it (fully_shard's),
    precision: Any = None  # ... in which dtypes (fsdp.Precision)
    layout: Any = None  # ... tensor parallel's (local shape, mesh, placements) of it (tp.local_layout)


@dataclasses.dataclass
class _Arguments:
    """fn's example arguments: module positions, lifted state, user-input leaves."""

    example_inputs: tuple
    module_positions: list
    modules: list
    user_positions: list
    lifted: list  # [_LiftedTensor]
    input_leaves: list
    input_spec: pytree.TreeSpec
    input_paths: list  # "args[1]['x']" per input leaf
    tensor_indices: list  # input leaves that are tensors
    optimizers: list = dataclasses.field(default_factory=list)  # [_LiftedOptimizer]
    data_parallel: list = dataclasses.field(default_factory=list)  # [ddp.DataParallelArgument]
    parallel_hooks: list = dataclasses.field(default_factory=list)  # [(path, hook dict, description)], tensor parallel's
    fully_shard_policies: list = dataclasses.field(default_factory=list)  # [(module path, mixed precision policy)]


@dataclasses.dataclass
class _FreeDim:
    """A user-input dim marked with mark_unbacked (Note invariant 3)."""

    leaf: int  # index into input_leaves
    dim: int
    low: int
    high: int | None
    shape_id: str | None


@dataclasses.dataclass
class _Capture:
    graph: torch.fx.GraphModule
    convention: CallingConvention
    example_inputs: list  # flat graph inputs: real clones, or fakes when dims are free
    # A question about the free sizes -> the size fact the example decides (_SymbolicAttempt.size_fact);
    # None without free dims.
    size_fact_of: Callable[[Any, str], "schema.SizeFact | None"] | None = None


def _lift_state(module_positions: list, modules: list) -> list:
    """Parameters of all modules, then buffers; tied tensors collapse by identity."""
    lifted: dict[int, _LiftedTensor] = {}
    for kind, named in (
        ("parameter", lambda m: m.named_parameters(remove_duplicate=False)),
        ("buffer", lambda m: m.named_buffers(remove_duplicate=False)),
    ):
        for index, module in enumerate(modules):
            for fqn, tensor in named(module):
                entry = lifted.setdefault(id(tensor), _LiftedTensor(tensor, kind, []))
                if entry.kind != kind:
                    _refuse_buffer_that_is_a_parameter(module_positions, entry, (index, fqn))
                entry.names.append((index, fqn))
    return list(lifted.values())


def _refuse_buffer_that_is_a_parameter(module_positions: list, parameter: _LiftedTensor, buffer: tuple) -> None:
    """A buffer registered with a parameter itself (``register_buffer("w", self.l.weight)``): the
    artifact lifts each tensor once, as a parameter or as a buffer, never as both."""
    (p_index, p_fqn), (b_index, b_fqn) = parameter.names[0], buffer
    p_path, b_path = f"args[{module_positions[p_index]}].{p_fqn}", f"args[{module_positions[b_index]}].{b_fqn}"
    raise PrecompileError(
        f"{b_path} (buffer) is the same tensor as {p_path} (parameter): precompile lifts a tensor as "
        f"a parameter or as a buffer, not both. Read {p_path} where the buffer is read, or register "
        "a buffer of its own (a .detach().clone() of the parameter) before precompile"
    )


def _split_arguments(example_inputs: tuple) -> _Arguments:
    module_positions = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.nn.Module)]
    modules = [example_inputs[i] for i in module_positions]
    for position, module in zip(module_positions, modules):
        _refuse_script_modules(f"args[{position}]", module)
        _refuse_compiled_modules(f"args[{position}]", module)
    optimizer_positions = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.optim.Optimizer)]
    runtime.refuse_repeated_optimizers(example_inputs, optimizer_positions)
    user_positions = [
        i for i in range(len(example_inputs)) if i not in module_positions and i not in optimizer_positions
    ]
    user_args = tuple(example_inputs[i] for i in user_positions)
    for position, arg in zip(user_positions, user_args):
        _check_recordable_structure(f"args[{position}]", pytree.tree_structure(arg), rebuilt=False)
    input_leaves, input_spec = pytree.tree_flatten(user_args)
    input_paths = [
        f"args[{user_positions[path[0].idx]}]{pytree.keystr(path[1:])}"
        for path in _input_leaf_paths(user_positions, user_args, input_leaves, input_spec)
    ]
    for what, leaf in zip(input_paths, input_leaves):
        if isinstance(leaf, torch.Tensor):
            runtime.check_plain_torch_function(what, leaf)
        else:
            _input_value_literal(what, leaf)
    lifted = _lift_state(module_positions, modules)
    # DDP and fully_shard first: the artifact does what DDP's reducer and fully_shard's
    # hooks would (generic checks of hooks and DTensors must skip theirs).
    fully_shard_policies = []
    for position, module in zip(module_positions, modules):
        ddp.refuse_sharded_wrappers(f"args[{position}]", module)
        fully_shard_policies += fsdp.check_module(f"args[{position}]", module)
    hooks_by_module = [tp.parallel_hooks(runtime.named_submodules([p], [m])) for p, m in zip(module_positions, modules)]
    parallel_hooks = [hook for hooks in hooks_by_module for hook in hooks]
    _lift_shards(lifted, module_positions, modules, parallelized={i for i, hooks in enumerate(hooks_by_module) if hooks})
    for entry in lifted:
        module_index, fqn = entry.names[0]
        _refuse_lazy_parameter(f"args[{module_positions[module_index]}].{fqn}", entry.tensor)
        runtime.check_plain_torch_function(f"args[{module_positions[module_index]}].{fqn}", entry.tensor)
    _refuse_state_as_input(lifted, module_positions, input_leaves, input_paths)
    _refuse_dtensors([*zip(input_paths, input_leaves), *_named_state(module_positions, lifted)])
    data_parallel = [
        ddp.data_parallel_argument(index, f"args[{position}]", module, lifted)
        for index, (position, module) in enumerate(zip(module_positions, modules))
        if runtime.is_data_parallel(module)
    ]
    _refuse_hooks(
        runtime.named_submodules(module_positions, modules),
        _named_state(module_positions, lifted) + _named_sharded(module_positions, lifted),
        parallel_hooks=frozenset(parallel_hooks),
    )
    return _Arguments(
        example_inputs=example_inputs,
        module_positions=module_positions,
        modules=modules,
        user_positions=user_positions,
        lifted=lifted,
        input_leaves=input_leaves,
        input_spec=input_spec,
        input_paths=input_paths,
        tensor_indices=[i for i, leaf in enumerate(input_leaves) if isinstance(leaf, torch.Tensor)],
        optimizers=[_lift_optimizer(i, example_inputs[i], lifted) for i in optimizer_positions],
        data_parallel=data_parallel,
        parallel_hooks=parallel_hooks,
        fully_shard_policies=fully_shard_policies,
    )


def _refuse_lazy_parameter(where: str, tensor: torch.Tensor) -> None:
    """A lazy module's parameter or buffer before its first forward: it has no shape to trace yet."""
    if torch.nn.parameter.is_lazy(tensor):
        raise PrecompileError(
            f"{where} is an {type(tensor).__name__} of a lazy module (nn.LazyLinear & co.), not yet "
            "initialized: its shape is decided by the module's first forward. Run the model once eagerly "
            "(model(example_input)) before precompile, which materializes it"
        )


def _refuse_script_modules(where: str, module: torch.nn.Module) -> None:
    """A torch.jit traced or scripted module in a module argument, refused before capture touches
    the modules: its forward is TorchScript, not Python the trace can follow, and its attributes
    live in C++ where capture's probes (class swaps, ``vars()`` snapshots) cannot reach."""
    for path, sub in module.named_modules():
        if isinstance(sub, torch.jit.ScriptModule):
            name = f"{where}.{path}" if path else where
            raise PrecompileError(
                f"{name} is a TorchScript module ({type(sub).__name__}, from torch.jit.trace or "
                "torch.jit.script), which precompile does not trace: pass the original nn.Module "
                "(the one given to torch.jit) instead"
            )


def _refuse_compiled_modules(where: str, module: torch.nn.Module) -> None:
    """A torch.compile'd module (OptimizedModule) in a module argument: its calls run Dynamo and its
    ``training`` forwards to the module it wraps, which no call could check; precompile compiles
    the module itself."""
    for path, sub in module.named_modules():
        if compat.compiled_module_original(sub) is None:
            continue
        name = f"{where}.{path}" if path else where
        fix = (
            f"pass the module itself ({name}._orig_mod, or the model before torch.compile)"
            if not path
            else f"put the module it wraps in its place ({name}._orig_mod)"
        )
        raise PrecompileError(
            f"{name} is a torch.compile'd module ({type(sub).__name__}), which precompile does not "
            f"trace: {fix}; precompile compiles it"
        )


def _input_leaf_paths(user_positions: list, user_args: tuple, leaves: list, spec: pytree.TreeSpec) -> list:
    """The key path of each input leaf, read from the inputs themselves (never a rebuilt copy).

    A node type whose ``flatten_with_keys_fn`` gives other leaves than its
    ``flatten_fn`` is refused naming it: the leaves could not be named, nor
    be trusted to line up at a call.
    """
    try:
        keyed = pytree.tree_flatten_with_path(user_args)[0]
    except Exception:  # a node registered without flatten_with_keys_fn: named by position
        return runtime.leaf_paths(spec)
    if len(keyed) == len(leaves) and all(map(operator.is_, (leaf for _, leaf in keyed), leaves)):
        return [path for path, _ in keyed]
    for position, arg in zip(user_positions, user_args):
        node = _node_with_unkeyed_leaves(arg)
        if node is not None:
            node_type, plain, with_keys = node
            raise PrecompileError(
                f"args[{position}] holds a {node_type.__module__}.{node_type.__qualname__}, whose pytree "
                f"registration flattens it to {plain} leaves without keys but {with_keys} with "
                "keys: make its flatten_fn and flatten_with_keys_fn return the same children "
                "(torch.utils._pytree.register_pytree_node)"
            )
    raise PrecompileError("fn's inputs flatten to other leaves with keys than without (torch.utils._pytree)")


def _node_with_unkeyed_leaves(tree: Any) -> tuple | None:
    """(type, leaves without keys, leaves with keys) of the first node in ``tree`` whose two flattens disagree."""
    node = pytree.SUPPORTED_NODES.get(type(tree))
    if node is None:
        return None
    children, _ = node.flatten_fn(tree)
    if node.flatten_with_keys_fn is not None:
        keyed = node.flatten_with_keys_fn(tree)[0]
        if len(keyed) != len(children) or any(a is not b for (_, a), b in zip(keyed, children)):
            return type(tree), len(children), len(keyed)
    for child in children:
        found = _node_with_unkeyed_leaves(child)
        if found is not None:
            return found
    return None


def _refuse_state_as_input(lifted: list, module_positions: list, leaves: list, paths: list) -> None:
    """A module's parameter or buffer passed again as a plain input (Note invariant 11).

    Capture traces each input on its own clone, so fn would see two unrelated
    tensors: gradients (``clip_grad_norm_(params)``) and writes through one
    would not reach the other, unlike eager.
    """
    owners = {_storage_address(e.tensor): e for e in lifted}
    owners.pop(0, None)  # empty tensors share no storage
    for path, leaf in zip(paths, leaves):
        entry = isinstance(leaf, torch.Tensor) and owners.get(_storage_address(leaf))
        if entry:
            module_index, fqn = entry.names[0]
            raise PrecompileError(
                f"{path} is (or shares memory with) args[{module_positions[module_index]}].{fqn}, a "
                f"{entry.kind} of a module argument: precompile lifts module state itself and would "
                "trace this input as a separate tensor, so gradients and writes would not reach "
                f"it as in eager. Reach it through the module inside fn (e.g. "
                f"args[{module_positions[module_index]}].parameters()), or pass a .clone()"
            )


def _named_state(module_positions: list, lifted: list) -> list:
    return [(f"args[{module_positions[e.names[0][0]]}].{e.names[0][1]}", e.tensor) for e in lifted]


def _named_sharded(module_positions: list, lifted: list) -> list:
    """(path, DTensor) of each DTensor parameter (``_named_state`` names its local shard)."""
    return [(f"args[{module_positions[e.names[0][0]]}].{e.names[0][1]}", e.param) for e in lifted if e.sharded]


def _lift_shards(lifted: list, module_positions: list, modules: list, parallelized: set) -> None:
    """Each DTensor parameter over several ranks, fully_shard's or tensor parallel's: lift its
    local shard (Note invariant 17).  ``parallelized``: the modules (indices) with tensor
    parallel's hooks."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # no DTensor exists before its import
    if dtensor is None:
        return
    sharded_models = {i for i, m in enumerate(modules) if any(map(fsdp.is_fully_shard_module, m.modules()))}
    # Tensor parallel's: over several ranks, or on a one-rank mesh with its hooks (DTensor ops
    # on a one-rank mesh alone, all local, are traced as DTensor ops instead).
    parallel_models = {
        i for i, m in enumerate(modules)
        if i not in sharded_models and (i in parallelized or any(map(_is_spread_dtensor, m.parameters())))
    }
    for entry in lifted:
        module_index, fqn = entry.names[0]
        if module_index in parallel_models and entry.kind == "parameter" and isinstance(entry.tensor, dtensor.DTensor):
            where = f"args[{module_positions[module_index]}].{fqn}"
            entry.param, entry.sharded = entry.tensor, tp.shard_spec(where, entry.tensor)
            entry.tensor, entry.layout = tp.local_shard(entry.param), tp.local_layout(where, entry.param)
    if not sharded_models:
        return
    # One all-gather per fully_shard parameter group and dtype, as eager FSDP2's.
    all_groups = [group for index in sorted(sharded_models) for group in fsdp.parameter_groups(modules[index])]
    groups = {id(param): (g, param.dtype) for g, (_, params) in enumerate(all_groups) for param in params}
    buckets: dict = {}
    for entry in lifted:
        module_index, fqn = entry.names[0]
        if module_index in sharded_models and entry.kind == "parameter" and isinstance(entry.tensor, dtensor.DTensor):
            where = f"args[{module_positions[module_index]}].{fqn}"
            if id(entry.tensor) not in groups:
                raise PrecompileError(
                    f"{where} is a DTensor that no fully_shard of the model manages (tensor parallel's, or made by "
                    "hand): precompile supports DTensor parameters only as fully_shard's, on a 1-D mesh"
                )
            entry.param, entry.sharded = entry.tensor, fsdp.shard_spec(where, entry.tensor)
            if entry.sharded.parallel_group_name:  # the mesh sliced here: not in the trace
                entry.layout = tp.local_layout(where, entry.param)
            entry.tensor = fsdp.local_shard(entry.param)
            group = groups[id(entry.param)]
            entry.gather_group = buckets.setdefault(group, len(buckets))
            entry.precision = fsdp.precision(all_groups[group[0]][0], entry.param)


def _refuse_hooks(
    named_modules: list, named_tensors: list, named_accumulated: list = (), parallel_hooks: frozenset = frozenset()
) -> None:
    """Hooks on fn's modules, their tensors or their AccumulateGrad nodes (Note invariant 11).

    The trace would inline what a hook computes once, and the artifact could
    not tell if it is removed later (or repeat its Python side effects).
    """
    # Capture names a library's fix wherever it finds its hook; an artifact, where its
    # convention has the library's classes (the driver's library_hooks part).
    found = runtime.find_hook(
        named_modules, named_tensors, named_accumulated, parallel_hooks, runtime.LIBRARY_HOOK_FIXES
    )
    if found is not None:
        hook, fix = found
        raise PrecompileError(
            f"{hook}: precompile cannot keep a hook in step with the artifact (it would be "
            "baked at capture and never run again). "
            + (
                fix
                or "Remove it before precompile (handle.remove()); for weight reparametrizations "
                "use torch.nn.utils.parametrize, which fn's trace includes"
            )
        )


def _check_recordable_structure(what: str, spec: pytree.TreeSpec, rebuilt: bool) -> None:
    """The artifact can record ``spec`` (Note invariant 3): by treespec_dumps, else by import paths.

    ``rebuilt``: load must rebuild the structure (fn's output), so every
    context must be a literal or a class; an input's is only compared with
    the caller's, by repr, which must then not name an address.
    """
    if schema.dumps_exactly(spec) is not None:
        return
    try:
        node = schema.named_node(spec)
    except schema.Unnameable as error:
        raise PrecompileError(f"{what}: its pytree structure holds {error}") from None
    for type_path, context in _repr_contexts(node):
        if rebuilt or " at 0x" in context:
            raise PrecompileError(
                f"{what}: its pytree structure holds a {type_path.replace(':', '.')} whose context {context} "
                + ("is not a Python literal or a class, so load could not rebuild it" if rebuilt else "has no stable repr to compare at each call")
                + ": register the type with to_dumpable_context / from_dumpable_context and a "
                "serialized_type_name (torch.utils._pytree.register_pytree_node), or make its context a "
                "literal (tuples, lists, dicts of str, int, float, bool, None)"
            )


def _repr_contexts(node: Any):
    """(type path, context repr) of each node of a named structure whose context is only a repr."""
    if node is None:
        return
    type_path, kind, context, children = node
    if kind == "repr":
        yield type_path, context
    for child in children:
        yield from _repr_contexts(child)


def _state_spec(entry: _LiftedTensor) -> StateSpec:
    """A fully_shard parameter's tensor spec is the DTensor's (what a call checks; its local
    shard, the graph input, follows from it and the ShardSpec)."""
    tensor = _tensor_spec(entry.param if entry.sharded else entry.tensor)
    return StateSpec(kind=entry.kind, names=tuple(entry.names), tensor=tensor, sharded=entry.sharded)


def _tensor_spec(t: torch.Tensor, free_dims: tuple = ()) -> TensorSpec:
    free = {dim for dim, *_ in free_dims}
    return TensorSpec(
        shape=tuple(None if d in free else size for d, size in enumerate(t.shape)),
        # Strides on every backend: the trace bakes layout-dependent decisions
        # (.contiguous() of a contiguous tensor is an alias, reshape a view,
        # is_contiguous() branches), not only Inductor's kernels.  Free dims:
        # strides vary with the size, so the layout is pinned as a memory format.
        stride=None if free else tuple(t.stride()),
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
        free_dims=tuple(free_dims),
        memory_format=_memory_format(t) if free else None,
        requires_grad=t.requires_grad,
    )


def _memory_format(t: torch.Tensor) -> str | None:
    """The first memory format ``t`` is dense in (row-major first), or None."""
    for name, memory_format in schema.MEMORY_FORMATS.items():
        if t.is_contiguous(memory_format=memory_format):
            return name
    return None


def _clone_leaf(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same strides as the caller's tensor, no autograd history, no .grad.

    Exactly the same strides also for a non-dense one (``ids[:, :1]``), which
    ``clone(preserve_format)`` would make contiguous: Inductor compiles for
    the strides it traced with, and the driver checks the caller's.
    """
    source = t.detach()
    if source.layout == torch.strided and not _is_non_overlapping(source) and type(source) is torch.Tensor:
        # Elements sharing memory (``x.expand(...)``, backend='eager' only): the
        # same sharing over a copy of the memory the tensor spans.
        span = 1 + sum((size - 1) * stride for size, stride in zip(source.shape, source.stride()))
        window = source.as_strided((span,), (1,), source.storage_offset()).clone()
        return window.as_strided(source.shape, source.stride()).requires_grad_(t.requires_grad)
    if _is_non_overlapping(source) and not _is_dense(source) and source.layout == torch.strided:
        clone = torch.empty_strided(source.shape, source.stride(), dtype=source.dtype, device=source.device)
        clone.copy_(source)
    else:
        clone = source.clone(memory_format=torch.preserve_format)
    return clone.requires_grad_(t.requires_grad)


def _is_dense(t: torch.Tensor) -> bool:
    return _memory_format(t) is not None or t.numel() <= 1


def _is_non_overlapping(t: torch.Tensor) -> bool:
    """No two elements share memory: each dim's stride reaches past the dims with smaller strides."""
    extent = 0  # the largest offset the smaller-strided dims reach
    for stride, size in sorted((stride, size) for stride, size in zip(t.stride(), t.shape) if size > 1):
        if stride <= extent:
            return False
        extent += (size - 1) * stride
    return True


def _refuse_overlapping_inputs(args: "_Arguments", backend: str) -> None:
    """Inductor compiles for its inputs' strides and cannot for one whose elements share
    memory (``x.expand(...)``); backend='eager' traces it with the same sharing (_clone_leaf)."""
    if backend != "inductor":
        return
    named = _named_state(args.module_positions, args.lifted) + [
        (args.input_paths[i], args.input_leaves[i]) for i in args.tensor_indices
    ]
    for what, tensor in named:
        if tensor.layout == torch.strided and not _is_non_overlapping(tensor):
            raise PrecompileError(
                f"{what} has elements sharing memory (strides {tuple(tensor.stride())} for shape "
                f"{tuple(tensor.shape)}, e.g. from .expand()), which backend='inductor' cannot specialize "
                "on: pass .contiguous(), or precompile with backend='eager'"
            )


def _check_value_leaf(what: str, value: Any) -> None:
    if isinstance(value, torch.SymInt):
        raise PrecompileError(
            f"{what} is a Python int computed from dims marked with mark_unbacked ({value}), which the "
            "artifact cannot return (its outputs are tensors and constants): return it as a tensor "
            "(torch.tensor(n) or x.new_tensor(n)), or remove the marks it depends on"
        )
    if type(value) not in schema.LEAF_VALUE_TYPES:
        raise PrecompileError(
            f"{what}: unsupported leaf of type {type(value).__name__}; outputs must be pytrees "
            f"of tensors, int, float, bool, str or None{_how_to_register(value)}"
        )


def _how_to_register(value: Any) -> str:
    """How to make an object a pytree node, so its tensors are lifted and the rest is its context."""
    cls = type(value)
    if cls.__module__.partition(".")[0] == "transformers" and cls.__name__.endswith("Cache"):
        return (
            f". {cls.__qualname__} is a transformers cache, not registered as a pytree node: call "
            "transformers.exporters.exporter_dynamo.register_cache_pytrees_for_model(model) before "
            "precompile() and before load() (it registers transformers' cache classes)"
        )
    if isinstance(value, (torch.Tensor, int, float, bool, str, type(None))):
        return ""
    if isinstance(value, torch.Generator):  # its state is the point, and no pytree node can carry it
        return (
            ". A torch.Generator cannot be passed: the artifact can neither carry its state nor advance it. "
            "Draw inside fn from torch's default generator (torch.randn(...) without generator=; the artifact "
            "draws anew from it at every call, as eager does) and seed that outside fn (torch.manual_seed), "
            "or draw with your generator outside fn and pass the numbers in as a tensor argument"
        )
    if cls.__module__ in ("builtins", "torch"):  # a type of Python's or torch's own (set, slice, dtype): not one to register
        return (
            f". A {cls.__qualname__} cannot be carried there: pass or return it as one of those types "
            "(str(value), a tuple), or use it outside fn"
        )
    return (
        f". To pass a {cls.__qualname__}, register it: torch.utils._pytree.register_pytree_node({cls.__qualname__}, "
        "flatten_fn, unflatten_fn, serialized_type_name=..., flatten_with_keys_fn=...); its tensors "
        "are then lifted and the rest of its state is its context, checked at every call"
    )


def _input_value_literal(what: str, value: Any) -> Any:
    """A Python leaf of fn's inputs, baked as value_literal(): its type (a numpy scalar's dtype, an Enum's class) is checked too."""
    if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):  # lifted only where _split_arguments finds them
        kind = "an nn.Module" if isinstance(value, torch.nn.Module) else "an optimizer"
        raise PrecompileError(
            f"{what} is {kind} ({type(value).__qualname__}) inside a container: precompile lifts modules and "
            "optimizers only where they are arguments of fn themselves; pass it as one (fn(model, opt, x, y) "
            "instead of fn({'model': model, 'opt': opt}, x, y))"
        )
    literal = _value_literal_or_missing(value)
    if literal is schema.MISSING or type(literal) is dict and not schema.is_scalar_literal(literal):
        raise PrecompileError(
            f"{what}: unsupported leaf of type {type(value).__name__}; inputs must be pytrees of "
            "tensors, int, float, bool, str, None, torch.dtype, torch.device, Enum members or numpy scalars"
            + _how_to_register(value)
        )
    return literal


def _read_marks(args: _Arguments, backend: str) -> list:
    """Dims marked with torch._dynamo.decorators.mark_unbacked on the user inputs."""
    for entry in args.lifted:
        if compat.dim_marks(entry.tensor).marked:
            raise PrecompileError(
                f"parameter/buffer '{entry.names[0][1]}' has dynamic-dim marks; only user "
                "inputs can have free dims: remove the marks from the module's tensors"
            )
    free_dims = []
    for index in args.tensor_indices:
        tensor, what = args.input_leaves[index], args.input_paths[index]
        marks = compat.dim_marks(tensor)
        if marks.dynamic:
            raise PrecompileError(
                f"{what}: dims {sorted(marks.dynamic)} are marked with "
                "mark_dynamic (backed), which precompile does not support; use "
                "torch._dynamo.decorators.mark_unbacked instead"
            )
        marked = marks.unbacked
        if not marked:
            continue
        if backend != "inductor":
            raise NotImplementedError(
                f"precompile: {what} has dims marked with mark_unbacked; free dims are only "
                "supported by backend='inductor' (backend='eager' specializes every size)"
            )
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            raise PrecompileError(
                f"{what}: mark_unbacked on a tensor subclass ({type(tensor).__name__}) is not "
                "supported; pass a plain torch.Tensor"
            )
        if _memory_format(tensor) is None:
            raise PrecompileError(
                f"{what}: an input with marked dims must be dense in a memory format (its strides "
                f"depend on the free sizes); got strides {tuple(tensor.stride())}: pass "
                "x.contiguous() or x.contiguous(memory_format=torch.channels_last)"
            )
        bounds, shape_ids = marks.bounds, marks.shape_ids
        for dim in sorted(marked):
            low, high = bounds.get(dim, (None, None))
            free_dims.append(_FreeDim(index, dim, 0 if low is None else low, high, shape_ids.get(dim)))
    return _combine_shape_id_bounds(free_dims, args)


def _combine_shape_id_bounds(free_dims: list, args: _Arguments) -> list:
    """Dims sharing a shape_id are one size: each gets the tightest bounds of all their marks."""
    groups: dict[str, list] = {}
    for free in free_dims:
        if free.shape_id is not None:
            groups.setdefault(free.shape_id, []).append(free)
    for shape_id, members in groups.items():
        low = max(f.low for f in members)
        highs = [f.high for f in members if f.high is not None]
        high = min(highs) if highs else None
        if high is not None and low > high:
            dims = ", ".join(f"{args.input_paths[f.leaf]} dim {f.dim}" for f in members)
            raise PrecompileError(
                f"the marks of shape_id {shape_id!r} ({dims}) have no size in common: min={low} "
                f"> max={high}; fix the bounds given to mark_unbacked"
            )
        for free in members:
            free.low, free.high = low, high
        sizes = {f"{args.input_paths[f.leaf]} dim {f.dim}": args.input_leaves[f.leaf].shape[f.dim] for f in members}
        if len(set(sizes.values())) > 1:
            raise PrecompileError(
                f"the marks of shape_id {shape_id!r} are one size, but the example inputs have "
                + ", ".join(f"{name} = {size}" for name, size in sizes.items())
                + ": pass example inputs whose marked dims agree, or give them different shape_ids"
            )
    for free in free_dims:  # the example's own sizes must be sizes the artifact accepts
        size = args.input_leaves[free.leaf].shape[free.dim]
        if size < free.low or (free.high is not None and size > free.high):
            bound = "" if free.shape_id is None else f" (the tightest of the marks of shape_id {free.shape_id!r})"
            raise PrecompileError(
                f"{args.input_paths[free.leaf]} dim {free.dim} has size {size} in the example inputs, outside "
                f"its bounds [{free.low}, {'inf' if free.high is None else free.high}]{bound}: every call would "
                "be refused; pass an example inside the bounds, or widen them"
            )
    return free_dims


class _DictOrderProbe(dict):
    """A plain dict input while fn is traced: notes whether fn observed its key order.

    A call may pass the same keys in another order (Note invariant 3): the
    driver maps them by key, which computes what eager would unless fn
    depends on the order -- iterating the dict (keys(), values(), items(),
    ``**``, ``for``, copies that keep the order).  Registered with pytree like
    dict, so fn's own tree_map still sees a node (and observes the order).
    """

    __slots__ = ("observed",)


def _observing(method: Callable) -> Callable:
    @functools.wraps(method)
    def observe(self, *args, **kwargs):
        self.observed = True
        return method(self, *args, **kwargs)

    return observe


for _name in ("__iter__", "__reversed__", "keys", "values", "items", "popitem", "copy", "__or__", "__ror__"):
    setattr(_DictOrderProbe, _name, _observing(getattr(dict, _name)))
pytree.register_pytree_node(
    _DictOrderProbe,
    lambda d: (list(d.values()), list(d.keys())),
    lambda values, keys: dict(zip(keys, values)),
    flatten_with_keys_fn=lambda d: ([(pytree.MappingKey(k), v) for k, v in d.items()], list(d.keys())),
)


def _probe_dicts(value: Any, path: str, probes: dict) -> Any:
    """``value`` with each plain dict (through plain tuples, lists, dicts) a _DictOrderProbe, by path in ``probes``."""
    kind = type(value)
    if kind is dict:
        probe = probes[path] = _DictOrderProbe(
            (key, _probe_dicts(v, path + pytree.keystr((pytree.MappingKey(key),)), probes)) for key, v in value.items()
        )
        probe.observed = False
        return probe
    if kind in (list, tuple):
        return kind(_probe_dicts(v, f"{path}[{i}]", probes) for i, v in enumerate(value))
    return value


def _without_probes(spec: pytree.TreeSpec) -> pytree.TreeSpec:
    """``spec`` with each _DictOrderProbe node a dict (fn returned an input dict): the call returns a dict."""
    if spec.is_leaf():
        return spec
    node_type = dict if spec.type is _DictOrderProbe else spec.type
    return pytree.TreeSpec(node_type, spec.context, [_without_probes(child) for child in spec.children()])


def _keyword_overload_error(func: torch._ops.OpOverload) -> PrecompileError:
    # make_fx writes torch.ops.aten.random_.from into Python code, which does not compile.
    return PrecompileError(
        f"fn calls {func}{_user_line(traceback.extract_stack())}, an overload named by a Python keyword, "
        "which make_fx cannot record. For x.random_(low, high) draw with "
        "torch.randint(low, high, x.shape, dtype=x.dtype) instead (x.copy_(...) to fill x in place), "
        "or pass only the upper bound (x.random_(high))"
    )


class _CaptureGuard(TorchDispatchMode):
    """Sees every op fn runs while it is traced, before make_fx records it.

    It refuses, before anything is written, what the graph would not repeat
    (Note invariants 8 and 14): an optimizer's step() / zero_grad() (the
    optimizer holds the caller's tensors, not the traced copies) and in-place
    writes to tensors the trace does not track (the caller's parameters, .grad
    or inputs reached through a closure, a global).  It also notes whether fn
    runs autograd (an op run by the autograd engine): only then do grad mode
    and requires_grad shape the graph (invariant 11).
    """

    # torch.cond & co. pass through to make_fx; the contract refuses them after the trace.
    supports_higher_order_operators = True

    def __init__(self, caller_tensors: dict, optimizer_arguments: bool, parallel: bool = False):
        super().__init__()
        self.caller_tensors = caller_tensors  # storage address -> "args[0].weight (parameter)"
        # Optimizers that are arguments of fn step the traced copies (invariant 15);
        # any other optimizer's writes to the caller's tensors are still refused below.
        self.optimizer_arguments = optimizer_arguments
        # Tensor parallel: DTensor ops pass to DTensor's dispatch (the trace records their local
        # ops), and its collectives are traced as stand-ins (invariant 17).
        self.parallel = parallel
        self.ran_autograd = False
        self.random_draws = _RandomDraws()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if func is torch.ops.profiler._record_function_enter_new.default and not self.optimizer_arguments:
            _refuse_optimizer_call(args[0])
        if func.namespace in compat.COLLECTIVE_NAMESPACES:  # DDP's all-reduce is traced through stand-ins
            stand_in = tp.stand_in(func) if self.parallel else None
            if stand_in is None:
                raise _collective_error(func)
            return stand_in(*args, **kwargs)
        if types and _holds_spread_dtensor(types, args, kwargs):  # made inside fn
            if self.parallel:
                return NotImplemented  # DTensor's dispatch runs it on the local tensors, which are traced
            raise PrecompileError(
                f"fn computes with a DTensor over several ranks ({func}){_user_line(traceback.extract_stack())}: "
                "an op on it may run collectives, which the other ranks do not join at capture, and sharded "
                "tensors are not supported. Keep such DTensors outside fn (pass .to_local() results)"
            )
        if keyword.iskeyword(func.name().rpartition(".")[2]):
            raise _keyword_overload_error(func)
        self._refuse_untracked_writes(func, args, kwargs)
        if torch.Tag.dynamic_output_shape in func.tags and _sized_by_values(func, args, kwargs):
            raise _data_dependent_size_error(func)
        if compat.current_autograd_node() is not None:
            self.ran_autograd = True
            _refuse_anomaly_detection()
        if torch.Tag.nondeterministic_seeded in func.tags:
            return self.random_draws.draw(func, args, kwargs)
        return func(*args, **kwargs)

    def _refuse_untracked_writes(self, func, args: tuple, kwargs: dict) -> None:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, has_proxy_slot

        written = _written_arguments(func)
        proxy_mode = get_proxy_mode()
        if not written or proxy_mode is None:  # no mode: DTensor's sharding propagation, on meta tensors
            return
        tracer = proxy_mode.tracer
        values = [args[i] if i < len(args) else kwargs.get(name) for i, name in written]
        for tensor in pytree.tree_leaves(values):
            if not isinstance(tensor, torch.Tensor) or compat.is_fake(tensor) or has_proxy_slot(tensor, tracer):
                continue
            what = self.caller_tensors.get(_storage_address(tensor)) or (
                f"a tensor of shape {tuple(tensor.shape)} that is neither an argument of fn nor created inside it"
            )
            fix = "Update state through fn's module arguments (or its inputs), or do it outside fn"
            if what.endswith(("(parameter)", "(buffer)")):  # module state, reached another way
                fix = (
                    "The trace follows the module's own attribute; this write reached the same tensor through "
                    "another reference (an object the module keeps in a plain attribute, a closure, a global). "
                    "Write through the module's attribute, or pass the object holding the tensor as an "
                    "argument of fn (for a transformers cache: past_key_values=cache)"
                )
            raise PrecompileError(
                f"fn writes in place ({func}) to {what}{_user_line(traceback.extract_stack())}, through a "
                f"reference precompile does not trace: the artifact would not repeat the write. {fix}"
            )


def _collective_error(func) -> PrecompileError:
    return PrecompileError(
        f"fn runs the collective {func}{_user_line(traceback.extract_stack())} while it is captured. "
        "Capture runs in one process, and the other ranks do not join it, so the collective would wait "
        "until the process group times out. Inside fn, only the collectives of DistributedDataParallel and "
        "fully_shard (FSDP2) are supported: pass the wrapped or sharded model. Run other collectives outside fn"
    )


def _is_spread_dtensor(value: Any) -> bool:
    """A DTensor whose mesh spans more than this process: ops on it may communicate, inside
    DTensor's dispatch, where no trace sees them.  (One on a one-rank mesh, all local, is traced
    as DTensor ops on backend='eager'.)"""
    module = sys.modules.get("torch.distributed.tensor")  # no DTensor exists before its import
    return module is not None and isinstance(value, module.DTensor) and value.device_mesh.size() > 1


def _holds_spread_dtensor(types: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether an op's arguments hold a DTensor over several ranks.  ``types`` (the tensor
    subclasses among them, as dispatch passes them) rules out almost every op without a flatten."""
    module = sys.modules.get("torch.distributed.tensor")
    if module is None or not any(issubclass(t, module.DTensor) for t in types):
        return False
    return any(map(_is_spread_dtensor, pytree.tree_leaves((args, kwargs))))


def _refuse_dtensors(named_tensors: list) -> None:
    """DTensor arguments and module state over several ranks (tensor parallel, FSDP2), named
    before any hook check or trace: their hooks carry the sharding, and ops on them communicate."""
    for what, tensor in named_tensors:
        if _is_spread_dtensor(tensor):
            raise PrecompileError(
                f"{what} is a DTensor ({tuple(tensor.placements)} on a device mesh of {tensor.device_mesh.size()} "
                "ranks), as tensor parallel (parallelize_module) makes: tensors sharded over ranks are supported "
                "only as the parameters of a model fully_shard (FSDP2) sharded. Shard the model with fully_shard "
                "or wrap it in DistributedDataParallel, or run this one eagerly or with torch.compile"
            )


def _sized_by_values(func, args: tuple, kwargs: dict) -> bool:
    """Whether an op tagged dynamic_output_shape really sizes its output by tensor values here."""
    aten = torch.ops.aten
    if func is aten.index.Tensor:  # only boolean masks select a value-dependent count
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    if func is aten.repeat_interleave.Tensor:  # the size is given when output_size is
        return kwargs.get("output_size") is None
    return True


def _data_dependent_size_error(func) -> PrecompileError:
    return PrecompileError(
        f"fn makes a tensor whose size depends on tensor values ({func}: nonzero, torch.where(cond) "
        f"with one argument, boolean-mask indexing x[mask], masked_select, unique)"
        f"{_user_line(traceback.extract_stack())}: the artifact would bake the example's size. Keep "
        "sizes fixed: mask instead of selecting (torch.where(mask, x, 0), x * mask), or select "
        "outside fn"
    )


class _Draw(collections.namedtuple("_Draw", "signature copy after")):
    """A random op of the trace: what it drew with, a traced copy of its numbers (None when
    it cannot be replayed), the generator state it left."""


class _RandomDraws:
    """The global generators along fn's trace (Note invariant 11, "RNG").

    The graph's random ops draw one after another from the caller's global
    generator, so the trace must have too: each draw starts where the previous
    one left the generator, and fn leaves it where its last draw did.  A draw
    that starts again from an earlier draw's state repeats that draw's numbers
    -- torch.utils.checkpoint's recomputation restores the forward's RNG state
    -- and is replayed: the graph reuses the earlier numbers.  Anything else
    that moves a generator between draws (torch.manual_seed, set_rng_state,
    fork_rng, a torch.Generator) is refused, at the next draw or when fn returns.
    """

    def __init__(self):
        self.generators = _global_generators()  # device -> its default generator
        for device, generator in self.generators.items():
            # Start the trace one draw past the caller's state (capture restores it,
            # invariant 8), where no reseed lands: torch.manual_seed(0) inside fn
            # is seen even when the caller seeded 0 just before precompile().
            _advance(generator, device)
        self.expected = {device: _state_of(g) for device, g in self.generators.items()}
        self.draws: dict = {}  # (device, state before) -> _Draw; states are bytes
        self.copies: list = []  # the copies' graph nodes (dropped when nothing replays them)
        self.python_states = _python_rng_states()  # Python's and numpy's global RNGs at fn's start

    def draw(self, func, args: tuple, kwargs: dict):
        if kwargs.get("generator") is not None:
            raise PrecompileError(
                f"fn draws random numbers ({func}) from its own torch.Generator"
                f"{_user_line(traceback.extract_stack())}: the artifact cannot carry a generator's "
                "state. Draw from the global generator (seed it with torch.manual_seed outside fn)"
            )
        device = _draw_device(args, kwargs)
        generator = self.generators.get(device)
        if generator is None:  # a device whose generator was not initialized at fn's start
            return func(*args, **kwargs)
        before = _state_of(generator)
        signature = _draw_signature(func, args, kwargs)
        if before == self.expected[device]:
            out = func(*args, **kwargs)
            if compat.is_fake(out if isinstance(out, torch.Tensor) else args[0]):
                _advance(generator, device)  # fake draws leave it: give each draw its own state
            self.expected[device] = after = _state_of(generator)
            self.draws[device, before] = _Draw(signature, self._copy(func, args, out), after)
            return out
        earlier = self.draws.get((device, before))
        if earlier is None:
            raise PrecompileError(
                f"fn draws random numbers ({func}){_user_line(traceback.extract_stack())} after the "
                f"{device} RNG was reseeded or restored inside fn (torch.manual_seed, set_rng_state, "
                f"fork_rng{_StateReads.last_rng_move()}): the artifact draws from one continuing "
                "global generator. Seed outside fn, before calling it"
            )
        if earlier.signature != signature or earlier.copy is None:
            raise PrecompileError(
                f"fn draws random numbers ({func}){_user_line(traceback.extract_stack())} from an "
                "earlier RNG state again (torch.utils.checkpoint recomputing a region) with another "
                "op or shape, or an op whose numbers depend on tensor values: the artifact cannot "
                "repeat them. Keep random ops out of the recomputed region, or pass "
                "preserve_rng_state=False (eager then draws new numbers too)"
            )
        _set_state(generator, earlier.after)
        if _written_arguments(func):  # a fill: write the earlier numbers into its target
            return torch.ops.aten.copy_.default(args[0], earlier.copy)
        return torch.ops.aten.clone.default(earlier.copy)

    def finish(self) -> None:
        """Refuse fn leaving a generator elsewhere than its last draw did, and fn drawing
        from Python's or numpy's global RNG (the trace bakes those numbers)."""
        moved = [name for name, (state, _) in _python_rng_states().items() if state != self.python_states[name][0]]
        if moved:
            for name in moved:  # as the caller left it: capture changes no state where it refuses
                self.python_states[name][1]()
            rng, fix = _PYTHON_RNGS[moved[0]]
            raise PrecompileError(
                f"fn draws from {rng} (or seeds it) while it is traced: the artifact bakes the numbers drawn "
                f"at capture, takes the same branches at every call and never advances that RNG, where eager "
                f"draws anew at each call. Draw with torch's RNG instead ({fix}), which the artifact "
                "draws anew at every call, and use the draw as a tensor (torch.where(torch.rand(()) < p, a, b), "
                "not an `if`: Python branches on tensor values are refused); or draw outside fn and pass the "
                "value in as a tensor argument (a Python number argument is baked)"
            )
        for device, generator in self.generators.items():
            if _state_of(generator) != self.expected[device]:
                raise PrecompileError(
                    f"fn leaves the {device} RNG where its random ops would not: it reseeds or "
                    "restores the generator (torch.manual_seed, set_rng_state, "
                    f"fork_rng{_StateReads.last_rng_move()}) and the artifact's graph cannot repeat "
                    "that. Seed outside fn, before calling it (or, if fn does neither, keep other threads "
                    "from drawing random numbers while precompile() runs)"
                )

    def _copy(self, func, args: tuple, out: Any) -> torch.Tensor | None:
        """A traced copy of the numbers drawn, if they depend only on the op and its sizes."""
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

        written = _written_arguments(func)
        tensors = [a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
        if written == ((0, "self"),) and len(tensors) == 1:  # bernoulli_(p), uniform_, normal_ ...
            drawn = args[0]
        elif not written and (not tensors or func._schema.name.endswith("_like")):
            drawn = out  # rand, randn_like, randperm ...
        else:
            return None
        copy = torch.ops.aten.clone.default(drawn)
        self.copies.append(get_proxy_slot(copy, get_proxy_mode().tracer).proxy.node)
        return copy


# Python's and numpy's global RNGs: the message naming each, and torch's draw to use instead.
_PYTHON_RNGS = {
    "random": ("Python's global RNG (the random module: random.random(), random.choice() ...)",
               "torch.rand for random.random, torch.randint for random.randint, torch.randperm for random.shuffle"),
    "numpy": ("numpy's global RNG (np.random.rand(), np.random.randint() ...)",
              "torch.rand / torch.bernoulli for np.random.rand, torch.randint for np.random.randint"),
}


def _python_rng_states() -> dict:
    """name -> (a comparable state of that global RNG, a function that restores it); numpy's only
    where numpy is imported already (capture never imports it)."""
    import random

    states = {}
    state = random.getstate()
    states["random"] = (state, functools.partial(random.setstate, state))
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        state = numpy.random.get_state()
        comparable = tuple(v.tobytes() if hasattr(v, "tobytes") else v for v in state)
        states["numpy"] = (comparable, functools.partial(numpy.random.set_state, state))
    return states


def _global_generators() -> dict:
    generators = {"cpu": torch.default_generator}
    if torch.cuda.is_initialized():
        generators.update({f"cuda:{i}": g for i, g in enumerate(torch.cuda.default_generators)})
    return generators


def _draw_device(args: tuple, kwargs: dict) -> str:
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, (torch.Tensor, torch.device)):
            device = leaf.device if isinstance(leaf, torch.Tensor) else leaf
            break
    else:
        device = torch.get_default_device()
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _draw_signature(func, args: tuple, kwargs: dict) -> tuple:
    """What a draw's numbers depend on besides the generator: the op, sizes, strides, arguments."""
    def describe(leaf):
        if isinstance(leaf, torch.Tensor):  # str(): symbolic sizes compare without guarding
            return (str(tuple(leaf.shape)), str(leaf.stride()), leaf.dtype, leaf.device)
        return repr(leaf)

    return (func, tuple(map(describe, pytree.tree_leaves((args, kwargs)))))


def _state_of(generator: torch.Generator) -> bytes:
    with compat.without_dispatch_modes():  # get_state() and numpy() run ops the trace would record
        return generator.get_state().numpy().tobytes()


def _set_state(generator: torch.Generator, state: bytes) -> None:
    with compat.without_dispatch_modes():
        generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def _advance(generator: torch.Generator, device: str) -> None:
    """Draw one number for real, even inside the trace's dispatch modes."""
    with compat.without_dispatch_modes():
        torch.empty(1, device=device).uniform_(generator=generator)


# unsafe_split's schema declares no aliasing, while eager returns views of its
# input (a write through a piece reaches it, as its docs allow): as split, whose
# schema says so, the capture's write and view analyses and AOTAutograd see them.
_UNSAFE_SPLITS = {
    torch.ops.aten.unsafe_split.Tensor: torch.ops.aten.split.Tensor,
    torch.ops.aten.unsafe_split_with_sizes.default: torch.ops.aten.split_with_sizes.default,
}


def _unsafe_splits_as_splits(graph: torch.fx.GraphModule) -> None:
    found = [node for node in graph.graph.nodes if node.op == "call_function" and node.target in _UNSAFE_SPLITS]
    for node in found:
        node.target = _UNSAFE_SPLITS[node.target]
    if found:
        graph.recompile()


def _drop_unused_copies(graph: torch.fx.GraphModule, copies: list) -> None:
    """The random numbers no recomputation replayed need no copy."""
    for node in copies:
        if not node.users:
            graph.graph.erase_node(node)
    graph.recompile()


@functools.lru_cache(maxsize=None)
def _written_arguments(func) -> tuple:
    """(position, name) of the arguments an operator writes in place (`Tensor(a!)`)."""
    return tuple(
        (i, a.name) for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    )


def _refuse_optimizer_call(record_name: str) -> None:
    # torch.optim announces step() / zero_grad() as e.g. "Optimizer.step#SGD.step".
    kind, _, method = record_name.partition("#")
    if kind in ("Optimizer.step", "Optimizer.zero_grad"):
        raise PrecompileError(
            f"fn calls {method}(){_user_line(traceback.extract_stack())}: the optimizer holds the "
            "caller's parameters, not the copies precompile traces, so the artifact would silently "
            "leave the call out. Call optimizer.zero_grad() and optimizer.step() outside fn, around the "
            "precompiled call (the artifact accumulates .grad like loss.backward())"
        )


def _refuse_anomaly_detection() -> None:
    """Backward under anomaly detection reads every gradient's values (its NaN check), which a
    graph cannot; without backward it only records where each op ran, so fn may leave it on there."""
    if torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled():
        raise PrecompileError(
            f"fn runs backward with anomaly detection on{_user_line(traceback.extract_stack())} "
            "(torch.autograd.detect_anomaly / set_detect_anomaly, inside fn or at precompile): its NaN check "
            "reads each gradient's values, which the artifact's graph cannot repeat. To debug, call fn "
            "eagerly under anomaly detection; precompile without it (or with check_nan=False)"
        )


def _storage_address(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return 0


def _caller_tensors(args: _Arguments) -> dict:
    """Storage address -> how the caller passed it, for every tensor fn must not write."""
    described = []
    for entry in args.lifted:
        module_index, fqn = entry.names[0]
        path = f"args[{args.module_positions[module_index]}].{fqn}"
        described.append((entry.tensor, f"{path} ({entry.kind})"))
        if entry.tensor.grad is not None:
            described.append((entry.tensor.grad, f"{path}.grad"))
    described += [(args.input_leaves[i], args.input_paths[i]) for i in args.tensor_indices]
    addresses = {_storage_address(t): what for t, what in described}
    addresses.pop(0, None)  # empty tensors share no storage
    return addresses


@contextlib.contextmanager
def _caller_grads_kept(args: _Arguments):
    """Invariant 8: fn rebinding the caller's .grad (through a closure) is undone and refused."""
    params = [entry for entry in args.lifted if entry.kind == "parameter"]
    grads = [entry.tensor.grad for entry in params]
    try:
        yield
    finally:
        rebound = [(entry, grad) for entry, grad in zip(params, grads) if entry.tensor.grad is not grad]
        for entry, grad in rebound:
            entry.tensor.grad = grad
    if rebound:
        module_index, fqn = rebound[0][0].names[0]
        raise PrecompileError(
            f"fn rebinds args[{args.module_positions[module_index]}].{fqn}.grad through a reference "
            "precompile does not trace (restored): the artifact would not repeat it; set .grad "
            "outside fn"
        )


def _flat_function(fn: Callable, args: _Arguments, recorded: dict, kept: "_KeptModules") -> Callable:
    """fn over flat tensors: (*state, *user tensors, *free sizes, *trailing) -> (*outputs, *grads).

    Each trace starts from the module arguments as the caller passed them (``kept``):
    an earlier trace that failed, or ran before a retrace, leaves nothing behind.

    The trailing inputs are the optimizers' (invariant 15), then each
    parameter's incoming ``.grad`` (invariant 13).
    """
    num_state, num_tensors = len(args.lifted), len(args.tensor_indices)
    caller_tensors = _caller_tensors(args)
    candidates = _grad_candidates(args)
    num_optimizer_inputs = _num_optimizer_inputs(args)
    parallel = {  # tensor parallel parameters (invariant 17), by path
        i: f"args[{args.module_positions[args.lifted[i].names[0][0]]}].{args.lifted[i].names[0][1]}"
        for i in _parallel_entries(args.lifted)
    }
    # A sharded model's gradients are DTensors in fn (_ShardedGradients): their ops are traced
    # on the local shards, and their collectives through stand-ins, as tensor parallel's.
    distributed = _is_distributed(args.lifted)

    def flat_fn(*flat):
        kept.restore()
        state = flat[:num_state]
        tensors = flat[num_state : num_state + num_tensors]  # free sizes follow, unused
        trailing = flat[len(flat) - num_optimizer_inputs - len(candidates) :]
        optimizer_inputs, incoming_grads = trailing[:num_optimizer_inputs], trailing[num_optimizer_inputs:]
        leaves = list(args.input_leaves)
        for index, tensor in zip(args.tensor_indices, tensors):
            leaves[index] = tensor
        call_args = list(args.example_inputs)
        probes: dict = {}  # path -> _DictOrderProbe
        for position, arg in zip(args.user_positions, pytree.tree_unflatten(leaves, args.input_spec)):
            call_args[position] = _probe_dicts(arg, f"args[{position}]", probes)
        mappings = [{} for _ in args.modules]
        whole = dict(enumerate(state))
        for members in _gather_groups(args.lifted):
            first = args.lifted[members[0]]
            whole.update(zip(members, fsdp.gathered([state[i] for i in members], first.sharded, first.precision)))
        gradient_placements = tp.GradientPlacements()
        for i, where in parallel.items():  # its local shard, or fully_shard's gather of it
            whole[i] = gradient_placements.as_dtensor(where, whole[i], args.lifted[i].param, args.lifted[i].layout)
        for i, entry in enumerate(args.lifted):
            for index, fqn in entry.names:
                mappings[index][fqn] = whole[i]
        guard = _CaptureGuard(caller_tensors, bool(args.optimizers), parallel=distributed)
        with contextlib.ExitStack() as stack:
            for module, mapping in zip(args.modules, mappings):
                stack.enter_context(compat.reparametrized(module, mapping))
            # fn sees its modules' parameters as nn.Parameter, as in eager (code branches on it)
            stack.enter_context(compat.seen_as_parameters([whole[i] for i, e in enumerate(args.lifted) if e.kind == "parameter"]))
            if args.optimizers:
                stack.enter_context(_redirect_optimizers(args, state, optimizer_inputs))
            # Invariant 13: a .grad None at capture that fn observes and backward does not
            # reach is traced as None (_grads_fn_tells_from_none); the others as a graph input.
            traced_none = recorded.get("grads_none", ())
            for index, grad in zip(candidates, incoming_grads):
                state[index].grad = None if index in traced_none else grad
            watched = [i for i in candidates if whole[i] is state[i]]  # the leaves backward accumulates into
            reached: set = set()
            for index in watched:
                hook = state[index].register_post_accumulate_grad_hook(lambda _, index=index: reached.add(index))
                stack.callback(hook.remove)
            sparse = _SparseGradients(
                {i: grad for i, grad in zip(candidates, incoming_grads) if i in watched and i not in traced_none}
            )
            for index in sparse.incoming:
                for hook in sparse.hooks(state[index], index):
                    stack.callback(hook.remove)
            grad_reads = _grad_reads(args, state, whole, watched, traced_none, reached)
            if grad_reads is not None:
                stack.enter_context(grad_reads)
            stack.enter_context(ddp.traced_data_parallel(args.data_parallel, state))
            stack.enter_context(fsdp.hooks_as_casts(args.modules, args.module_positions))
            if distributed:
                stack.enter_context(tp.rank_unread(lambda: _user_line(traceback.extract_stack())))
            sharded = {  # what fn's modules hold for each sharded parameter
                id(whole[i]): (f"args[{args.module_positions[e.names[0][0]]}].{e.names[0][1]}", state[i], e.param)
                for i, e in enumerate(args.lifted) if e.sharded is not None
            }
            if sharded:
                placements_of = lambda path, param: gradient_placements.arrived.get(path, tuple(param.placements))  # noqa: E731
                stack.enter_context(_ShardedGradients(sharded, placements_of))
            compat.record_frames_of(fn)  # the rendered eager graph names fn's lines (Note invariant 6)
            with (
                torch.enable_grad(),
                guard,
                _StateReads.of_fn(recorded.setdefault("reads", {})),
                _module_changes_noted(kept, recorded),
                _torch_settings_kept(),
                _argument_autograd_kept(_named_stand_ins(args, state, whole, tensors)),
                _TensorAttributes(_stand_ins_by_input(args, state, whole, tensors)) as tensor_attributes,
            ):
                result = fn(*call_args)
                recorded["grads_unreached"] = [i for i in watched if i not in reached]
                recorded["sparse_into_incoming"] = dict(sparse.into_incoming)
                recorded["frozen_grads_read"], recorded["grads_used_early"] = (), ()
                if grad_reads is not None:
                    recorded["grads_used_early"] = grad_reads.used_before_backward()
                    recorded["frozen_grads_read"] = tuple(grad_reads.frozen_read)
                recorded["requires_grad_read"] = _requires_grad_read(recorded["reads"], (*state, *tensors), whole)
                guard.random_draws.finish()
            gradient_placements.refuse_mismatch()
            for i, where in parallel.items():
                args.lifted[i].sharded = gradient_placements.spec(where, args.lifted[i].sharded)
            if args.optimizers and gradient_placements.arrived:
                where, placements = next(iter(gradient_placements.arrived.items()))
                raise PrecompileError(
                    f"{where}'s gradient is placed {placements}, and the optimizer inside fn steps the local "
                    "shards, while eager's step all-reduces such a gradient first: keep opt.step() outside fn "
                    "for this model"
                )
            _check_state_not_rebound(args.modules, mappings)
        recorded["tensor_attributes"] = tensor_attributes.recorded()
        # Flattening the inputs to compare them iterates their dicts: not fn observing their order.
        observed = [(probe, probe.observed) for probe in probes.values()]
        rebound = _rebound_inputs(args, call_args, leaves)
        recorded["rebound_inputs"] = rebound
        recorded["returned_inputs"] = _returned_inputs(result, call_args, args.user_positions, int(bool(rebound)))
        for probe, flag in observed:
            probe.observed = flag
        if rebound:  # their state after fn is part of what the call gives back (invariant 5)
            result = (result, tuple(call_args[position] for position in rebound))
        out_leaves, out_spec = pytree.tree_flatten(result)  # an input dict returned: order observed
        out_spec = _without_probes(out_spec)
        _check_recordable_structure("fn's output", out_spec, rebuilt=True)
        recorded["ran_autograd"] = guard.ran_autograd
        recorded["random_copies"] = guard.random_draws.copies
        recorded["out_spec"], recorded["out_leaves"] = out_spec, out_leaves
        _check_gradients_reach_only_parameters(args, state, tensors)
        recorded["grad_state"] = [i for i in candidates if state[i].grad is not None]
        _refuse_grads_with_history(args, state, recorded["grad_state"])
        _refuse_grad_dtypes(args, recorded["grad_state"])
        recorded["grads_cleared"] = [i for i in candidates if state[i].grad is None and i not in traced_none]
        recorded["ordered_dicts"] = tuple(path for path, probe in probes.items() if probe.observed)
        outputs = _unique_tensors(out_leaves)  # one tensor returned twice is one graph output, as in eager
        return (*outputs, *[state[i].grad for i in recorded["grad_state"]])

    return flat_fn


class _SparseGradients:
    """While fn is traced: the parameters whose backward accumulates a sparse gradient
    (``nn.Embedding(sparse=True)``) into the incoming ``.grad`` the trace gave them (Note
    invariant 13).  The trace's incoming ``.grad`` is a dense graph input, zeros where the
    caller's is None; eager's None takes a sparse gradient as a sparse ``.grad``.  Only a
    plain accumulation, which the runnable does like eager, keeps that: _finish_grad_inputs
    refuses the others."""

    def __init__(self, incoming: dict):
        self.incoming = incoming  # state index -> its incoming .grad in the trace
        self.arriving: set = set()  # a sparse gradient is on its way into the parameter
        self.into_incoming: dict = {}  # state index -> fn's line that ran the backward

    def hooks(self, param: torch.Tensor, index: int) -> tuple:
        def before(grad: torch.Tensor) -> None:  # what AccumulateGrad receives, summed over the uses
            if grad.layout != torch.strided:
                self.arriving.add(index)
            else:  # (torch.autograd.grad runs this hook and accumulates nothing)
                self.arriving.discard(index)

        def after(param: torch.Tensor) -> None:  # in place into the incoming .grad: its identity kept
            if index in self.arriving and param.grad is self.incoming[index]:
                self.into_incoming.setdefault(index, _user_line(traceback.extract_stack()))
            self.arriving.discard(index)

        return param.register_hook(before), param.register_post_accumulate_grad_hook(after)


def _refuse_sparse_gradients_read(args: _Arguments, recorded: dict, read: list) -> None:
    """A parameter whose gradient is sparse, where fn reads or changes its ``.grad`` (the graph
    takes the incoming one): the trace made that ``.grad`` dense (_SparseGradients)."""
    paths = [path for path, _ in _named_state(args.module_positions, args.lifted)]
    for index in read:
        if index in recorded.get("sparse_into_incoming", {}):
            raise PrecompileError(
                f"{paths[index]} gets a sparse gradient (nn.Embedding / nn.EmbeddingBag with sparse=True) from the "
                f"backward{recorded['sparse_into_incoming'][index]}, and fn reads or changes its .grad: the graph accumulates it into "
                "a dense .grad (zeros where the caller's is None), where eager leaves a sparse .grad, so the "
                "artifact would leave another layout (a sparse optimizer such as torch.optim.SparseAdam refuses it). "
                "Make the layer's gradient dense (sparse=False), or leave its .grad to backward inside fn and read "
                "or clip it outside fn"
            )


def _grad_reads(args: _Arguments, state: tuple, whole: dict, watched: list, traced_none: tuple, reached: set):
    """The _GradReads for this trace, or None where no parameter's ``.grad`` differs from eager's."""
    plain = [i for i, e in enumerate(args.lifted) if e.kind == "parameter" and whole[i] is state[i]]
    frozen = {id(state[i]): (i, args.lifted[i].tensor.grad) for i in plain if not args.lifted[i].tensor.requires_grad}
    incoming = {id(state[i]): (i, args.lifted[i].tensor.grad is None) for i in watched if i not in traced_none}
    if not frozen and not incoming:
        return None
    return _GradReads([path for path, _ in _named_state(args.module_positions, args.lifted)], frozen, incoming, reached)


def _named_stand_ins(args: _Arguments, state: tuple, whole: dict, tensors: tuple) -> list:
    """(path, tensor) of what fn receives in the trace for each lifted tensor and tensor input."""
    paths = [path for path, _ in _named_state(args.module_positions, args.lifted)]
    named = [(paths[i], held) for i in range(len(paths)) for held in (state[i], whole[i])]
    return named + [(args.input_paths[index], tensor) for index, tensor in zip(args.tensor_indices, tensors)]


def _stand_ins_by_input(args: _Arguments, state: tuple, whole: dict, tensors: tuple) -> list:
    """(tensor graph input index, path, the caller's tensor, what fn receives for it in the trace)
    of each lifted tensor and tensor input."""
    paths = [path for path, _ in _named_state(args.module_positions, args.lifted)]
    named = [
        (i, paths[i], _caller_parameter(e), {id(t): t for t in (state[i], whole[i])}.values())
        for i, e in enumerate(args.lifted)
    ]
    return named + [
        (len(state) + k, args.input_paths[index], args.input_leaves[index], (tensor,))
        for k, (index, tensor) in enumerate(zip(args.tensor_indices, tensors))
    ]


# What zero_grad(set_to_none=False) runs on a .grad (beside reading its properties): from a
# tensor it leaves zeros, to which backward adds as to eager's None.
_ZEROING = frozenset({"__get__", "requires_grad_", "detach_", "zero_", "_foreach_zero_"})


class _GradReads(TorchFunctionMode):
    """While fn is traced: its reads of a parameter's ``.grad`` where the trace's differs from
    eager's (Note invariant 13).

    - A parameter that does not require grad: its stand-in has no ``.grad``.  One the caller's
      parameter has is refused when fn reads it; the others are noted (``frozen_read``): their
      ``.grad`` must stay None at every call.
    - A ``.grad`` before backward reaches it: the trace's is the incoming one, zeros where
      the caller's is None (0 + g is g), eager's None.  Zeroing it is the same from either;
      another use (``p.grad.mul_(0.9)``, which raises in eager) of one None at capture is
      refused, of a tensor noted (``used_before_backward``): it must stay a tensor at every
      call.  Only for a parameter backward reaches: the others are _grads_fn_tells_from_none's.
    """

    def __init__(self, paths: list, frozen: dict, watched: dict, reached: set):
        super().__init__()
        self.paths = paths  # state index -> args[0].fc.weight
        self.frozen = frozen  # id(stand-in) -> state index, its caller's .grad
        self.watched = watched  # id(stand-in) -> state index, whether its caller's .grad is None
        self.reached = reached  # the state indices backward accumulated into
        self.frozen_read: set = set()
        self.incoming: dict = {}  # id(.grad fn read) -> (state index, stand-in, that .grad)
        self.used: dict = {}  # state index -> where fn first used its incoming .grad

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == torch.Tensor.grad.__get__:
            grad = func(*args)
            self._read(args[0], grad)
            return grad
        if self.incoming and getattr(func, "__name__", None) not in _ZEROING:
            self._note_use_of_none(pytree.tree_leaves((args, kwargs)))
        return func(*args, **kwargs)

    def _read(self, owner: torch.Tensor, grad: Any) -> None:
        if id(owner) in self.frozen:
            index, caller_grad = self.frozen[id(owner)]
            if caller_grad is not None:
                raise PrecompileError(
                    f"fn reads {self.paths[index]}.grad{_user_line(traceback.extract_stack())}, a parameter that does "
                    "not require grad but has a .grad (a leftover), which the trace cannot see: set that .grad to "
                    "None before precompile and the calls (or requires_grad_(True))"
                )
            self.frozen_read.add(index)
        index, _ = self.watched.get(id(owner), (None, None))
        if index is not None and grad is not None and index not in self.reached:
            self.incoming[id(grad)] = (index, owner, grad)

    def _note_use_of_none(self, leaves: list) -> None:
        for leaf in leaves:
            if id(leaf) not in self.incoming:
                continue
            index, owner, grad = self.incoming[id(leaf)]
            if grad is leaf and owner.grad is leaf and index not in self.reached and index not in self.used:
                self.used[index] = _user_line(traceback.extract_stack())

    def used_before_backward(self) -> tuple:
        """After fn: the parameters whose ``.grad`` fn used before backward reached it, a None one refused."""
        used = tuple(sorted(index for index in self.used if index in self.reached))
        none_at_capture = {index for index, none in self.watched.values() if none}
        refused = [index for index in used if index in none_at_capture]
        if refused:
            raise PrecompileError(
                f"fn uses {self.paths[refused[0]]}.grad as a tensor{self.used[refused[0]]} before backward gives "
                "it a value, while it is None (eager raises AttributeError there, or takes another branch): run "
                "backward first, or precompile and call with a .grad there"
            )
        return used


class _ShardedGradients(TorchFunctionMode):
    """While fn is traced: ``.grad`` of what a sharded model holds for a parameter (invariant
    17) reads as eager's.  In the trace the module holds the whole parameter fully_shard
    gathers, or tensor parallel's DTensor over the traced shard: not the leaf backward
    accumulates into.  Its ``.grad`` is a DTensor placed as backward leaves it, over the
    traced shard's gradient, so ``clip_grad_norm_`` or a hand-written update computes with it
    and writes it in place as in eager.  Setting it to None clears the shard's; another
    value is refused."""

    def __init__(self, entries: dict, placements_of: Callable[[str, Any], tuple]):
        super().__init__()
        self.entries = entries  # id(tensor fn's modules hold) -> (path, traced shard, the DTensor parameter)
        self.placements_of = placements_of  # (path, parameter) -> its gradient's placements
        self.views: dict = {}  # id(shard gradient) -> (it, the DTensor over it)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        entry = self.entries.get(id(args[0])) if args else None
        if entry is not None and func == torch.Tensor.grad.__get__:
            return self._gradient(*entry)
        if entry is not None and func == torch.Tensor.grad.__set__:
            path, shard, _ = entry
            if args[1] is not None:
                raise PrecompileError(
                    f"fn sets {path}.grad{_user_line(traceback.extract_stack())}, a parameter of a model sharded by "
                    "fully_shard or tensor parallel, to a tensor: precompile supports setting it to None (zero_grad) "
                    "and updating it in place; set it outside fn"
                )
            shard.grad = None
            return None
        return func(*args, **(kwargs or {}))

    def _gradient(self, path: str, shard: torch.Tensor, param: Any) -> Any:
        local = shard.grad
        if local is None:
            return None
        known = self.views.get(id(local))
        if known is None or known[0] is not local:  # the same DTensor for the same gradient, as eager's .grad
            view = type(param).from_local(
                local, param.device_mesh, self.placements_of(path, param), run_check=False,
                shape=param.shape, stride=param.stride(),
            )  # fmt: skip
            known = self.views[id(local)] = (local, view)
        return known[1]


def _is_distributed(lifted: list) -> bool:
    """Whether a lifted parameter is a DTensor over several ranks (invariant 17)."""
    return any(entry.sharded is not None for entry in lifted)


def _parallel_entries(lifted: list) -> list[int]:
    """The lifted tensor parallel parameters (indices), fully_shard over them included:
    DTensors in the trace (invariant 17)."""
    return [
        i for i, entry in enumerate(lifted)
        if entry.sharded is not None and (not entry.sharded.gathered or entry.sharded.parallel_group_name)
    ]


def _gather_groups(lifted: list) -> list[list[int]]:
    """The lifted fully_shard parameters (indices), by the all-gather that gathers them."""
    groups: dict = {}
    for index, entry in enumerate(lifted):
        if entry.gather_group is not None:
            groups.setdefault(entry.gather_group, []).append(index)
    return list(groups.values())


def _unique_tensors(leaves: list) -> list:
    """The tensor leaves, each tensor once (first occurrence first)."""
    return list({id(leaf): leaf for leaf in leaves if isinstance(leaf, torch.Tensor)}.values())


def _rebound_inputs(args: _Arguments, call_args: list, leaves: list) -> tuple:
    """Argument positions whose objects fn changed beyond their tensors' values
    (Note invariant 5): flattened after fn, another structure or context (an
    attribute or element added, a plain value changed) or another tensor (an
    attribute rebound, as transformers' DynamicLayer.update does) than fn got.

    Each must be written back into the caller's object after every call; one
    that could not be (a tuple, an object without a ``__dict__``) is refused.
    """
    rebound, start = [], 0
    for position, spec in zip(args.user_positions, args.input_spec.children()):
        given = leaves[start : start + spec.num_leaves]
        start += spec.num_leaves
        after_leaves, after_spec = pytree.tree_flatten(call_args[position])
        after_spec = _without_probes(after_spec)
        if after_spec == spec and all(map(operator.is_, after_leaves, given)):
            continue
        # A dry run on fresh copies, as a call rebuilds them: the argument's object must stay in place.
        fresh = pytree.tree_unflatten(given, spec)
        if runtime.write_back(fresh, pytree.tree_unflatten(after_leaves, after_spec)) is not fresh:
            raise PrecompileError(
                f"fn changes args[{position}] (a {type(call_args[position]).__qualname__}) in place beyond its "
                "tensors' values, but a call could not make the caller's object the same: it is immutable or has "
                "no __dict__. Return the new value from fn instead of changing the argument"
            )
        rebound.append(position)
    return tuple(rebound)


def _refuse_shared_containers(args: _Arguments) -> None:
    """fn changes an input object: the trace rebuilt each argument from its pytree, so a
    container at two places of the example inputs was two (Note invariant 5)."""
    arguments = [(f"args[{p}]", args.example_inputs[p]) for p in args.user_positions]
    if runtime.first_shared_container(arguments) is not None:
        raise runtime.shared_container_error(arguments, "")


def _preorder_nodes(tree: Any) -> list:
    """Every node of ``tree``, leaves included, in the order of its TreeSpec's pre-order walk."""
    nodes: list = []
    pytree.tree_flatten(tree, is_leaf=lambda node: nodes.append(node))  # append returns None: never a leaf
    return nodes


def _returned_inputs(result: Any, call_args: list, user_positions: list, first: int) -> tuple:
    """(output node, argument position, input node) for each node of fn's result that is
    one of its input objects (a cache fn updated and returned): the call returns the caller's."""
    owners = {}
    for position in user_positions:
        for index, node in enumerate(_preorder_nodes(call_args[position])):
            if runtime.is_mutable_node(node):
                owners.setdefault(id(node), (position, index))
    return tuple(
        (first + index, *owners[id(node)])
        for index, node in enumerate(_preorder_nodes(result))
        if runtime.is_mutable_node(node) and id(node) in owners
    )


_LR_SCHEDULER_FILE = os.path.abspath(torch.optim.lr_scheduler.__file__)


def _trace_real(flat_fn: Callable, args: _Arguments, recorded: dict, decompositions, same: list = ()) -> tuple:
    """Real-mode make_fx on clones: every size is static (Note invariant 3, 8).

    ``same``: pairs (i, j) of tensor inputs traced as one clone (make_fx then
    binds only the last placeholder of each such group).
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = [_clone_leaf(e.tensor) for e in args.lifted] + [
        _clone_leaf(args.input_leaves[i]) for i in args.tensor_indices
    ] + _trailing_example_inputs(args)
    for i, j in same:
        inputs[j] = inputs[i]
    try:
        graph = make_fx(flat_fn, decomposition_table=decompositions, record_stack_traces=True)(*inputs)
    except PrecompileError:
        raise
    except RuntimeError as error:
        frames = traceback.extract_tb(error.__traceback__)
        if any(frame.filename == _LR_SCHEDULER_FILE for frame in frames):
            raise PrecompileError(
                f"fn steps an LR scheduler{_user_line(frames)}: the artifact reads each group's lr at every "
                "call, so step the scheduler outside fn (its step ran once here, as fn's Python does at capture)"
            ) from error
        # make_fx's "value out of a tracing tensor with aten._local_scalar_dense"
        if "_local_scalar_dense" not in str(error):
            raise
        raise _data_dependent_error(frames) from None
    _drop_unused_copies(graph, recorded["random_copies"])
    _unsafe_splits_as_splits(graph)
    graph, constants = _enforce_contract(graph)
    example = [t.detach() for t in inputs] + constants
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    for k in (k for group in runtime.same_input_groups(same) for k in group[:-1]):
        if placeholders[k].users:
            raise AssertionError("make_fx bound a tensor passed twice to another placeholder than its last")
        example[k] = _clone_leaf(example[k])  # unused by the graph: lowering sees no aliased inputs
    return graph, example, (), constants


def _trace_symbolic(
    flat_fn: Callable, args: _Arguments, free_dims: list, recorded: dict, decompositions, facts: tuple
) -> tuple:
    """Symbolic make_fx with marked dims as unbacked symints (Note invariant 3), ``facts``
    about their sizes assumed (those lowering the graph needed: _captured_and_lowered).

    A data-dependent guard ``Eq(a, b)`` between two marked dims whose example
    sizes agree means the graph requires them equal: they are merged into one
    shape group (checked by the driver at every call) and the trace is redone.
    A guard linear in the marked sizes becomes a size fact the example decides,
    and so does what the trace decided without a guard (a squeeze, a size it
    tied to others: _AssumedSizeFacts); the trace is redone with it assumed.
    Any other guard on a marked dim is refused.
    """
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    groups = {i: free.shape_id or f"free{i}" for i, free in enumerate(free_dims)}
    facts = list(facts)
    for _ in range(len(free_dims) + _MAX_SIZE_FACTS + 1):
        attempt = _SymbolicAttempt(args, free_dims, groups, facts)
        try:
            graph, example, sizes, constants = attempt.trace(flat_fn, recorded, decompositions)
            recorded["size_facts"] = tuple(facts)
            recorded["size_fact_of"] = attempt.size_fact
            return graph, example, sizes, constants
        except _AssumedSizeFacts as assumed:
            if len(facts) + len(assumed.facts) > _MAX_SIZE_FACTS:
                raise PrecompileError(
                    f"fn needs more than {_MAX_SIZE_FACTS} facts about its marked dims' sizes: it is not one graph "
                    "over these sizes; mark fewer dims, or give the marks bounds that decide more"
                ) from None
            facts += assumed.facts
        except GuardOnDataDependentSymNode as error:
            if not attempt.involves_free_dim(error.cond):  # `if x.sum() > 0:` after .item()
                raise _data_dependent_error(traceback.extract_tb(error.__traceback__)) from None
            merged = attempt.mergeable(error.cond)
            if merged is not None:
                keep, drop = merged
                groups = {i: groups[keep] if g == groups[drop] else g for i, g in groups.items()}
                continue
            fact = attempt.size_fact(error.cond, _user_line(traceback.extract_tb(error.__traceback__)))
            if fact is None or len(facts) == _MAX_SIZE_FACTS:
                raise attempt.guard_error(error) from None
            facts.append(fact)
        except RuntimeError as error:
            if not compat.needs_concrete_sizes(error):
                raise
            frames = traceback.extract_tb(error.__traceback__)
            raise PrecompileError(
                f"fn needs the concrete size of a tensor whose size depends on a dim marked with mark_unbacked"
                f"{_user_line(frames)}{_library_line(frames)}: `if tensor:` and bool(tensor) read its element count "
                "(eager raises for more than one element and branches on the value of one), as do ops without "
                "symbolic-size support. Branch on an explicit size (x.shape[0] > 0, a size fact the artifact "
                "checks at every call) or with torch.where(cond, a, b), or remove the mark"
            ) from None
    raise AssertionError("unreachable: each retry merges two shape groups or adds a size fact")


# A trace that needs more linear facts about its free dims than this is refused
# (each costs a retrace; a model asking for many is not one graph over these sizes).
_MAX_SIZE_FACTS = 16


def _data_dependent_error(frames: list, how: str = "(`if tensor:`, .item(), bool(), .tolist())") -> PrecompileError:
    """fn turned a traced tensor into a Python value: control flow on tensor data."""
    return PrecompileError(
        f"fn uses the value of a tensor as a Python value{_user_line(frames)}{_library_line(frames)} "
        f"{how}: the artifact would bake the example's "
        "outcome. Write the branch with torch.where(cond, a, b), or compute the value outside fn "
        "and pass it as a Python input (baked and checked at every call)"
    )


def _is_inequality(expr) -> bool:
    """Whether a requirement on free sizes is <, <=, > or >= (what a mark's min=/max= can state)."""
    import sympy

    return isinstance(expr, (sympy.LessThan, sympy.GreaterThan, sympy.StrictLessThan, sympy.StrictGreaterThan))


class _AssumedSizeFacts(Exception):
    """A trace decided a question about free sizes without a guard; retrace with these facts."""

    def __init__(self, facts: list):
        self.facts = facts


# squeeze drops a dim only where its size is 1, which the trace decides for a free
# dim without a guard (size-obliviously: not 1), fixing the output's rank.
_SQUEEZES = (torch.ops.aten.squeeze.default, torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims)


class _SymbolicAttempt:
    """One symbolic trace: fakes in a fresh ShapeEnv, one symint per marked dim."""

    def __init__(self, args: _Arguments, free_dims: list, groups: dict, facts: list = ()):
        self.args, self.free_dims, self.facts = args, free_dims, facts
        self.shape_env, self.fake_mode = compat.symbolic_fake_mode()

        def fakify(tensor, name, free=()):
            dims = {f.dim: (groups[i], f.low, f.high) for i, f in free}
            fake = compat.fake_with_unbacked_dims(self.fake_mode, tensor.detach(), name, dims)
            return fake.requires_grad_(tensor.requires_grad)

        self.inputs = [fakify(e.tensor, f"state{i}") for i, e in enumerate(args.lifted)]
        by_leaf: dict[int, list] = {}
        for i, free in enumerate(free_dims):
            by_leaf.setdefault(free.leaf, []).append((i, free))
        fake_leaves = {}
        for index in args.tensor_indices:
            tensor = args.input_leaves[index]
            fake_leaves[index] = fakify(tensor, f"input{index}", by_leaf.get(index, ()))
            self.inputs.append(fake_leaves[index])
        # Free sizes are graph inputs too: AOTAutograd needs a binding for each symbol.
        self.sizes = [fake_leaves[f.leaf].shape[f.dim] for f in free_dims]
        self.symbols = {size.node.expr: i for i, size in enumerate(self.sizes)}
        self.trailing = [fakify(t, f"grad{i}") for i, t in enumerate(_trailing_example_inputs(args))]
        compat.forget_pending_unbacked_symbols(self.shape_env)
        for fact in facts:  # what earlier attempts found the graph needs, known from the start
            torch._check(fact.holds(self.sizes), lambda: f"precompile size fact{fact.where}")
        self.assumed = {id(requirement) for requirement in compat.shape_env_deferred_asserts(self.shape_env)}

    def trace(self, flat_fn: Callable, recorded: dict, decompositions) -> tuple:
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

        graph = make_fx(
            flat_fn, decomposition_table=decompositions, tracing_mode="symbolic", record_stack_traces=True
        )(*self.inputs, *self.sizes, *self.trailing)
        _drop_unused_copies(graph, recorded["random_copies"])
        _unsafe_splits_as_splits(graph)
        assumed = [fact for fact in self.squeezed_facts(graph) if fact not in self.facts]
        if assumed:
            raise _AssumedSizeFacts(list(dict.fromkeys(assumed)))
        self.refuse_specialization()
        insert_deferred_runtime_asserts(graph, self.shape_env, "torch.compiler.precompile")
        graph.recompile()
        graph, constants = _enforce_contract(graph)
        example = (
            [t.detach() for t in self.inputs]
            + list(self.sizes)
            + [t.detach() for t in self.trailing]
            + [self.fake_mode.from_tensor(c) for c in constants]
        )
        self.refuse_groups_the_example_breaks()
        return graph, example, self.size_sources(), constants

    def describe(self, index: int) -> str:
        free = self.free_dims[index]
        return f"{self.args.input_paths[free.leaf]} dim {free.dim}"

    def example_size(self, index: int) -> int:
        free = self.free_dims[index]
        return self.args.input_leaves[free.leaf].shape[free.dim]

    def squeezed_facts(self, graph: torch.fx.GraphModule) -> list:
        """Whether each free size a squeeze saw is 1, as the example decides it: the
        trace took it as not 1 (kept the dim), where eager squeezes a 1."""
        import sympy

        facts = []
        for node in graph.graph.nodes:
            if node.op != "call_function" or node.target not in _SQUEEZES:
                continue
            shape = node.args[0].meta["val"].shape
            dims = range(len(shape)) if len(node.args) < 2 else node.args[1]
            for dim in [dims] if isinstance(dims, int) else dims:
                size = shape[dim]
                if isinstance(size, torch.SymInt) and self.involves_free_dim(size.node.expr):
                    frame = compat.innermost_frame(node.meta.get("stack_trace"), _is_user_file)
                    where = f" at {frame[0]}:{frame[1]} ({frame[3]})" if frame else ""
                    fact = self.size_fact(sympy.Eq(size.node.expr, 1), where)
                    if fact is None:
                        raise PrecompileError(
                            f"fn squeezes a dim of size {size.node.expr}{where}, a size of its marked dims that "
                            "may be 1 at a call (eager would drop that dim): squeeze only the dims you know "
                            "are 1, e.g. x.squeeze(-1) on a static dim"
                        )
                    facts.append(fact)
        return facts

    def refuse_specialization(self) -> None:
        """Every requirement fn put on a free dim must be a mark bound or a shape group."""
        equal_by_fact = {i for fact in self.facts if fact.op == "==" for i, _ in fact.terms}
        for symbol, index in self.symbols.items():
            replaced = compat.shape_env_replacements(self.shape_env).get(symbol)
            if replaced is not None and index not in equal_by_fact and self.shape_env.simplify(replaced) not in self.symbols:
                self.raise_if_relation_of_free_sizes(index, symbol, replaced)
                raise PrecompileError(
                    f"fn specializes {self.describe(index)} (marked with mark_unbacked) to "
                    f"{replaced}, e.g. through .view() with literal sizes; use -1 or sizes derived "
                    "from the input's .shape, or remove the mark"
                )
        for requirement in compat.shape_env_deferred_asserts(self.shape_env):
            if id(requirement) not in self.assumed and not self.implied_by_marks(requirement.expr):
                names = [self.describe(i) for s, i in self.symbols.items() if s in requirement.expr.free_symbols]
                if not names:
                    raise self.undecided_size_error(requirement.expr)
                fix = (
                    "state it in the mark instead (min=/max=) or remove the mark"
                    if _is_inequality(requirement.expr)
                    else "no mark bound states that (min=/max= do not): remove the mark, or avoid the op that needs "
                    "it (e.g. .view(-1, 2) over that dim)"
                )
                raise PrecompileError(
                    f"fn requires {requirement.expr} of {' and '.join(names)} (marked with mark_unbacked); {fix}"
                )

    def undecided_size_error(self, expr) -> PrecompileError:
        """A requirement on a size an op computed from the marked ones (none of them itself)."""
        symbol = min(expr.free_symbols, key=str)
        frames = compat.symbol_made_at(self.shape_env, symbol)
        return PrecompileError(
            f"fn requires {expr} of {symbol}, a size an op computed from the marked dims{_user_line(frames)}"
            " that the trace cannot decide (marked with mark_unbacked), such as a slice "
            "whose start depends on a marked size and may fall outside the tensor: give the marks bounds that "
            "keep it inside (min=/max=), or remove the marks"
        )

    def raise_if_relation_of_free_sizes(self, index: int, symbol, replaced) -> None:
        """A free size the trace set to a linear function of others (a mask one longer than
        a cache: u1 = u0 + 1) becomes that size fact, where the example's sizes satisfy it."""
        if not replaced.free_symbols:  # a constant: a specialization
            return
        # Not size_fact(): the shape env's simplification applies the replacement itself.
        fact = self.linear_fact(symbol - replaced, "==", "")
        if fact is None:
            return
        if fact.op != "==":
            names = [self.describe(i) for i in range(len(self.sizes))]
            example = ", ".join(f"{name} = {self.example_size(i)}" for i, name in enumerate(names))
            raise PrecompileError(
                f"fn requires {fact.negated().describe(names)} (marked with mark_unbacked; e.g. a broadcast "
                f"between them), which the example inputs' sizes ({example}) do not satisfy: pass example "
                "inputs whose sizes do"
            )
        raise _AssumedSizeFacts([fact])

    def implied_by_marks(self, expr) -> bool:
        """Equalities between free dims, and bounds the driver already checks."""
        import sympy

        sides = [self.shape_env.simplify(side) for side in getattr(expr, "args", ())]
        if isinstance(expr, sympy.Eq) and all(side in self.symbols for side in sides):
            return True
        if not _is_inequality(expr):
            return False
        lhs, rhs = sides
        if lhs in self.symbols and rhs.is_Integer:  # symbol OP constant
            symbol, constant, lower = lhs, int(rhs), isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan))
        elif rhs in self.symbols and lhs.is_Integer:  # constant OP symbol
            symbol, constant, lower = rhs, int(lhs), isinstance(expr, (sympy.LessThan, sympy.StrictLessThan))
        else:
            return False
        free = self.free_dims[self.symbols[symbol]]
        strict = isinstance(expr, (sympy.StrictLessThan, sympy.StrictGreaterThan))
        if lower:  # requires size >= constant (+1 if strict)
            return constant + strict <= free.low
        return free.high is not None and free.high <= constant - strict

    def refuse_groups_the_example_breaks(self) -> None:
        """Free dims the graph requires equal (one shape group) must be equal in the example:
        a trace takes a free size as not 1, so it does not broadcast one the example broadcasts."""
        groups: dict = {}
        for index, size in enumerate(self.sizes):
            groups.setdefault(self.shape_env.simplify(size.node.expr), []).append(index)
        for members in groups.values():
            example = {self.describe(i): self.example_size(i) for i in members}
            if len(set(example.values())) > 1:
                raise PrecompileError(
                    f"fn requires {' and '.join(example)} (marked with mark_unbacked) to be one size, "
                    "as an elementwise op does (a free size is never broadcast as a 1), but the example inputs have "
                    + ", ".join(f"{name} = {size}" for name, size in example.items())
                    + ": leave a dim the example broadcasts unmarked, or pass example inputs whose marked dims agree"
                )

    def size_sources(self) -> tuple:
        """(leaf, dim, group, low, high) per free size, groups by canonical symbol."""
        canonical = {}
        result = []
        for free, size in zip(self.free_dims, self.sizes):
            symbol = self.shape_env.simplify(size.node.expr)
            group = canonical.setdefault(symbol, len(canonical))
            result.append((free.leaf, free.dim, group, free.low, free.high))
        return tuple(result)

    def involves_free_dim(self, cond) -> bool:
        marked = {str(symbol) for symbol in self.symbols}
        return any(str(symbol) in marked for symbol in getattr(cond, "free_symbols", ()))

    def mergeable(self, cond) -> tuple | None:
        import sympy

        if not isinstance(cond, (sympy.Eq, sympy.Ne)):
            return None
        lhs, rhs = (self.shape_env.simplify(side) for side in cond.args)
        if lhs not in self.symbols or rhs not in self.symbols:
            return None
        a, b = self.symbols[lhs], self.symbols[rhs]
        return (a, b) if self.example_size(a) == self.example_size(b) and a != b else None

    def size_fact(self, cond, where: str) -> "schema.SizeFact | None":
        """The guard ``cond`` on free dims as the fact the example's sizes decide
        (checked by the driver at every call), or None where it is not linear in them
        with integer coefficients."""
        import sympy

        ops = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">", sympy.Ge: ">="}
        op = ops.get(type(cond))
        if op is None:
            return None
        return self.linear_fact(self.shape_env.simplify(cond.lhs - cond.rhs), op, where)

    def linear_fact(self, expr, op: str, where: str) -> "schema.SizeFact | None":
        """``expr OP 0`` as the fact the example's sizes decide, or None where it is not linear."""
        import sympy

        symbols = list(self.symbols)
        if not expr.free_symbols <= set(symbols):
            return None
        try:
            poly = sympy.Poly(expr, *symbols)
        except sympy.PolynomialError:
            return None
        coefficients = [poly.coeff_monomial(symbol) for symbol in symbols]
        constant = poly.coeff_monomial(1)
        if poly.total_degree() > 1 or not all(c.is_Integer for c in (*coefficients, constant)):
            return None
        terms = tuple((self.symbols[s], int(c)) for s, c in zip(symbols, coefficients) if c != 0)
        if not terms:
            return None
        fact = schema.SizeFact(terms=terms, constant=int(constant), op=op, where=where)
        example = [self.example_size(i) for i in range(len(self.free_dims))]
        return fact if fact.holds(example) else fact.negated()

    def guard_error(self, error) -> PrecompileError:
        names = {str(symbol): self.describe(i) for symbol, i in self.symbols.items()}
        involved = [names[str(s)] for s in getattr(error.cond, "free_symbols", ()) if str(s) in names]
        where = _user_line(traceback.extract_tb(error.__traceback__))
        return PrecompileError(
            f"fn needs the size of {' and '.join(involved) or 'a marked dim'} (marked with "
            f"mark_unbacked) to decide {error.cond}{where}: a free dim cannot be guarded on. "
            "Give the mark bounds that decide it (min=1 rules out empty sizes, which .view(n, -1) "
            "and .flatten() must exclude), remove the mark to specialize it, or avoid branching "
            "on / reshaping with that size"
        )


@contextlib.contextmanager
def _without_mkldnn():
    """Trace nn.LSTM & co. through their cell-by-cell decomposition.

    With MKLDNN enabled, CPU ``aten::lstm`` dispatches to ``aten::mkldnn_rnn_layer``,
    which make_fx records as one op.  Its ``workspace`` output (saved for
    ``mkldnn_rnn_layer_backward``) is undefined when grad mode is off, as it is
    while the driver runs the graph, and its fake kernel reports a (1,)-sized
    workspace that Inductor's size asserts then reject.  The decomposition is
    plain ATen and serves both backends.
    """
    # The public flags() sets every MKLDNN flag it is given; None leaves
    # deterministic, allow_tf32 and fp32_precision as they are.
    with torch.backends.mkldnn.flags(enabled=False, deterministic=None, allow_tf32=None, fp32_precision=None):
        yield


class _LstmUnderAutocast(TorchFunctionMode):
    """While fn is traced (with MKLDNN off): an LSTM on CPU under an enabled CPU autocast is
    refused.  Eager runs it as MKLDNN's fused layer, which autocast runs in its dtype (a
    bfloat16 output); the trace's cell-by-cell decomposition keeps float32 state."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.lstm and torch.is_autocast_enabled("cpu") and args and args[0].device.type == "cpu":
            raise PrecompileError(
                f"fn runs an LSTM (nn.LSTM / torch.lstm) under torch.autocast('cpu'){_user_line(traceback.extract_stack())}: "
                "eager runs it as MKLDNN's fused layer, in the autocast dtype, which the trace cannot record "
                f"(it gets float32 where eager gets {torch.get_autocast_dtype('cpu')}). Run the LSTM outside autocast "
                "(`with torch.autocast('cpu', enabled=False):` around it, on float32 inputs), or call fn eagerly"
            )
        return func(*args, **(kwargs or {}))


class _ValueChecksInTheGraph(TorchFunctionMode):
    """While fn is traced: a torch function whose C++ reads tensor values into Python only to
    check them runs as ATen ops that check them in the graph, at every call, with eager's result
    (and a RuntimeError where eager raises one): ``F.one_hot(labels, num_classes)``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.one_hot:
            return _one_hot_checked_in_graph(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _one_hot_checked_in_graph(labels: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``F.one_hot`` as torch.compile's decomposition computes it (torch 2.13-2.14's
    ``torch._decomp``; 2.11 has none): the class values asserted in the graph, with eager's
    messages.  Without ``num_classes`` (the labels' max sizes the result, data-dependent) and
    for what eager refuses outright (labels not int64), eager's own, which the trace refuses."""
    if num_classes < 0 or labels.dtype != torch.int64:
        return torch.nn.functional.one_hot(labels, num_classes)
    torch.ops.aten._assert_async.msg(torch.all(labels >= 0), "Class values must be non-negative.")
    torch.ops.aten._assert_async.msg(torch.all(labels < num_classes), "Class values must be smaller than num_classes.")
    classes = torch.arange(num_classes, dtype=labels.dtype, device=labels.device)
    return (labels.unsqueeze(-1) == classes).to(torch.int64)


@contextlib.contextmanager
def _seen_as_export():
    """Present the trace to model libraries as torch.export's non-strict capture does.

    Libraries skip data-dependent shortcuts (``if mask.all(): mask = None``) when
    ``torch.compiler.is_compiling()`` / ``is_exporting()`` is true; without
    them a padding mask would be read as data and fail the trace, or be baked.
    Same flags, set by the same helper torch.export uses; restored on exit.
    """
    with compat.compiling_and_exporting():
        yield


def _refuse_arguments_reached_around(fn: Callable, args: _Arguments) -> None:
    """A module argument, or a submodule of one, that fn also reaches through a closure cell, a
    global its code names, a bound ``self`` or a ``functools.partial``'s bound arguments (Note
    invariant 2).  At capture they are one object, whose tensors the trace swaps for its own, so
    reads through it look like the argument's; called with another module, eager fn would still
    read the one it closed over.  (A tensor held there is the caller's, never swapped: refused
    as live state when read.)  So with an optimizer argument: the trace steps it as the argument,
    where eager fn called with another optimizer would still step the one it closed over."""
    if not args.modules:
        return
    optimizers = {id(lifted.optimizer): f"args[{lifted.position}]" for lifted in args.optimizers}
    submodules = runtime.named_submodules(args.module_positions, args.modules)
    owned = {id(sub): path for path, sub in submodules}
    tensors = {  # a parameter or buffer held in a container: in the trace the modules hold stand-ins
        id(tensor): f"{path}.{name}"
        for path, sub in submodules
        for name, tensor in (*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False))
    }
    for where, value in _values_fn_names(fn):
        found = _argument_within(value, optimizers, depth=3) if optimizers else None
        if found is not None:
            raise PrecompileError(
                f"fn's {where} {'is' if id(value) in optimizers else 'holds'} the optimizer argument {found}: the "
                f"trace steps it as {found}, but eager fn would keep using the {where} when called with "
                "another optimizer. Reach it through fn's argument instead"
            )
        found = _argument_within(value, owned, depth=3)  # containers nested deeper are not followed
        if found is not None:
            argument = found.split(".")[0]
            raise PrecompileError(
                f"fn's {where} {'is' if owned.get(id(value)) == found else 'holds'} {found}, of the module "
                f"argument {argument}: the trace reads it as {argument}'s, but eager fn would keep reading "
                f"the {where} when called with another module. Reach it through fn's argument instead"
            )
        found = _argument_within(value, tensors, depth=1) if type(value) in _CONTAINERS else None  # its keys and items
        if found is not None:
            raise PrecompileError(
                f"fn's {where} holds {found}, a tensor of the module argument {found.split('.')[0]}: in the trace the "
                "modules hold stand-ins for their tensors, so a lookup of a module's tensor there (a dict keyed by "
                "parameters, `p in params`) would not find it where eager fn does, and a read of it would read the "
                "caller's tensor. Key such a container by name (dict(m.named_parameters())) or reach the tensors "
                "through fn's argument"
            )


def _values_fn_names(fn: Callable):
    """(where, value) of what fn reaches without its arguments: closure cells and the globals its
    code (and code nested in it) loads; through bound methods and functools.partial."""
    while True:
        if isinstance(fn, functools.partial):
            yield from (("functools.partial argument", value) for value in (*fn.args, *fn.keywords.values()))
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            yield "bound self", fn.__self__
            fn = fn.__func__
        else:
            break
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            yield f"closure variable {name!r}", cell.cell_contents
        except ValueError:  # a cell not yet assigned
            continue
    fn_globals = getattr(fn, "__globals__", {})
    for name in sorted(_global_names(code)):
        if name in fn_globals:
            yield f"global {name!r}", fn_globals[name]


@contextlib.contextmanager
def _outer_state_kept(fn: Callable):
    """Python state fn reaches around its arguments (``_values_fn_names``) that capture changed:
    refused where capture otherwise succeeded (Note invariant 2), and put back where it holds a
    tensor the trace made (other changes stay, as any Python side effect of a trace).

    Eager fn changes it at every call (``scaler.scale(loss)`` creating a fresh GradScaler's scale
    tensor, a step counter on a global object, a cache dict); the artifact runs the graph, never
    fn's Python, so it would not.  One level: an object's attributes, a dict's, list's or set's
    items, compared by identity.
    """
    kept = [(where, value, _shallow_state(value)) for where, value in _values_fn_names(fn)]
    kept = [entry for entry in kept if entry[2] is not None]
    try:
        yield
    finally:
        now = [(where, value, before, _shallow_state(value)) for where, value, before in kept]
        changed = [(where, value, before, after) for where, value, before, after in now if not _same_state(before, after)]
        if changed:
            where, value, before, _ = changed[0]
            first = f"fn changes its {where} (a {type(value).__name__}) while traced: {_describe_outer_change(before, value)}"
        for _, value, before, after in changed:
            if _holds_new_tensors(before, after):  # the trace's tensors do not stay in the caller's state
                _put_back(value, before)
    if changed:
        raise PrecompileError(
            f"{first}. Eager "
            "fn changes it at every call; the artifact runs the graph, never fn's Python, so it would not. Keep the "
            "change outside fn, passing what fn needs as arguments (a tensor it computes with, a module "
            "argument's buffer)"
        )


def _shallow_state(value: Any) -> Any:
    """What ``_outer_state_kept`` compares of ``value``; None for what it does not follow (immutable
    values, tensors -- refused as live state when read --, modules, classes and functions)."""
    if isinstance(value, (dict, list, set)):
        return type(value)(value) if type(value) in (dict, list, set) else None
    if isinstance(value, (torch.Tensor, types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return None
    attributes = getattr(value, "__dict__", None)
    return dict(attributes) if type(attributes) is dict else None


def _same_state(before: Any, after: Any) -> bool:
    if type(before) is set:
        return before == after
    if type(before) is list:
        return len(before) == len(after) and all(a is b for a, b in zip(before, after))
    return before.keys() == after.keys() and all(before[key] is after[key] for key in before)


def _holds_new_tensors(before: Any, after: Any) -> bool:
    old = {id(item) for item in (before.values() if type(before) is dict else before)}
    return any(isinstance(item, torch.Tensor) and id(item) not in old for item in (after.values() if type(after) is dict else after))


def _put_back(value: Any, before: Any) -> None:
    state = value if type(before) is not dict or isinstance(value, dict) else vars(value)
    state.clear()
    if type(before) is list:
        state.extend(before)
    else:
        state.update(before)


def _describe_outer_change(before: Any, value: Any) -> str:
    if isinstance(value, (list, set)):
        return f"its items, {len(before)} before the trace and {len(value)} after"
    after = value if isinstance(value, dict) else vars(value)
    keys = [key for key in {**before, **after} if before.get(key, _ABSENT) is not after.get(key, _ABSENT)]
    shown = ", ".join(map(repr, keys[:5])) + (", ..." if len(keys) > 5 else "")
    return f"{'it sets the items' if isinstance(value, dict) else 'it sets the attributes'} {shown}"


_ABSENT = object()


def _global_names(code: types.CodeType) -> set:
    """The names ``code`` and the code objects nested in it load as globals."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _argument_within(value: Any, owned: dict, depth: int) -> str | None:
    """The path of the first object of ``owned`` (id -> path) that ``value`` is, or holds as a
    submodule or an element of a list, tuple, set or dict (a key or a value)."""
    if id(value) in owned:
        return owned[id(value)]
    if isinstance(value, torch.nn.Module):
        for sub in value.modules():
            if id(sub) in owned:
                return owned[id(sub)]
    elif depth and type(value) in _CONTAINERS:
        for element in (*value.keys(), *value.values()) if type(value) is dict else value:
            found = _argument_within(element, owned, depth - 1)
            if found is not None:
                return found
    return None


_CONTAINERS = (list, tuple, set, frozenset, dict)


def _capture(fn: Callable, example_inputs: tuple, backend: str, decompositions, size_facts: tuple) -> _Capture:
    args = _split_arguments(example_inputs)
    _refuse_arguments_reached_around(fn, args)
    _refuse_overlapping_inputs(args, backend)
    free_dims = _read_marks(args, backend)
    if free_dims and args.optimizers:
        raise PrecompileError(
            "an optimizer argument together with mark_unbacked dims is not supported yet: "
            "remove the marks (sizes are then specialized) or keep opt.step() outside fn"
        )
    if compat.torch_modes_active():
        raise PrecompileError(
            "precompile() is called inside a torch function or dispatch mode (a default device from "
            "`with torch.device(...)` or torch.set_default_device is one): the trace would bake what the "
            "mode does into the graph, and every call refuses such a mode. Call precompile() outside it"
        )
    if compat.saved_tensors_hooks_active():
        raise PrecompileError(
            "precompile() is called inside torch.autograd.graph.saved_tensors_hooks: the trace "
            "would bake the hooks' pack/unpack into the graph, which every call would then run. "
            "Call precompile() outside them; to pack saved tensors at every call, enter the "
            "hooks inside fn"
        )
    with _modules_kept(args) as kept, _outer_state_kept(fn):  # around every trace and the checks after them
        return _traced(fn, args, free_dims, backend, decompositions, kept, size_facts)


def _traced(
    fn: Callable, args: _Arguments, free_dims: list, backend: str, decompositions, kept: "_KeptModules", size_facts: tuple
) -> _Capture:
    """Trace fn (again where a trace finds it must) and record its calling convention."""
    frozen = _frozen_in_optimizers(args)
    autocast = schema.autocast_state()  # the caller's, before fn could change it
    recorded: dict[str, Any] = {}
    flat_fn = _flat_function(fn, args, recorded, kept)
    num_inputs = len(args.lifted) + len(args.tensor_indices)
    same = _same_tensor_inputs(args)
    if same and free_dims:
        _refuse_same_tensor_with_marks(args, same)
    with (
        _without_mkldnn(),
        _LstmUnderAutocast() if torch.backends.mkldnn.is_available() else contextlib.nullcontext(),
        _ValueChecksInTheGraph(),
        _seen_as_export(),
        compat.checkpoint_regions_as_in_eager(),
        _caller_grads_kept(args),
        _ModuleReads(args, kept) as module_reads,
        _StateReads(),
    ):

        def trace() -> tuple:
            if free_dims:
                return _trace_symbolic(flat_fn, args, free_dims, recorded, decompositions, size_facts)
            return _trace_real(flat_fn, args, recorded, decompositions, same)

        graph, example, sizes, constants = trace()
        grads_none, grads_present = _grads_fn_tells_from_none(graph, args, recorded, len(sizes))
        if grads_none:  # traced again with their .grad None, as eager's step skips them
            recorded["grads_none"] = grads_none
            graph, example, sizes, constants = trace()
        if recorded["rebound_inputs"]:
            _refuse_shared_containers(args)
        grads_none = tuple(sorted({*grads_none, *frozen, *recorded["frozen_grads_read"]}))
        grads_present = tuple(sorted({*grads_present, *recorded["grads_used_early"]}))
    ddp.use_collectives(graph)
    fsdp.use_collectives(graph)
    if _is_distributed(args.lifted):
        tp.use_collectives(graph)
    first_trailing = len(args.lifted) + len(args.tensor_indices) + len(sizes)
    optimizers, grads = _finish_trailing_inputs(graph, example, args, recorded, first_trailing)
    # Eager's backward runs the AccumulateGrad node of each parameter that gets a gradient.
    named_state = _named_state(args.module_positions, args.lifted)
    _refuse_hooks((), (), [named_state[i] for i in grads["grad_state"]])
    if recorded["ran_autograd"]:  # the trace's clones of the inputs have no hooks: a gradient w.r.t. one skipped them
        inputs = [(args.input_paths[i], args.input_leaves[i]) for i in args.tensor_indices]
        _refuse_hooks((), [(path, tensor) for path, tensor in inputs if tensor.requires_grad])

    outputs = []
    output_leaves = _unique_tensors(recorded["out_leaves"])
    graph_output = {id(leaf): k for k, leaf in enumerate(output_leaves)}
    output_tensors = [_output_spec(leaf) for leaf in output_leaves]
    for i, leaf in enumerate(recorded["out_leaves"]):
        if isinstance(leaf, torch.Tensor):
            outputs.append(LeafSpec(graph_output=graph_output[id(leaf)]))
        else:
            _check_value_leaf(f"fn's output leaf {i}", leaf)
            outputs.append(LeafSpec(value=leaf))

    mutated = _mutated_inputs(graph, num_inputs)
    _refuse_aliased_examples(args, mutated, same)
    if backend == "inductor":
        _refuse_input_layout_changes(graph, args)
    output_views = _output_views(graph, example, output_leaves, args, backend == "inductor")
    data_parallel = {argument.module_index: argument.spec for argument in args.data_parallel}
    free_by_leaf: dict[int, list] = {}
    for leaf, dim, group, low, high in sizes:
        free_by_leaf.setdefault(leaf, []).append((dim, group, low, high))
    convention = CallingConvention(
        format_version=CONVENTION_VERSION,
        backend=backend,
        arity=len(args.example_inputs),
        modules=tuple(
            ModuleSpec(
                position=position,
                parameters=tuple(n for n, _ in m.named_parameters(remove_duplicate=False)),
                buffers=tuple(n for n, _ in m.named_buffers(remove_duplicate=False)),
                submodules=tuple(
                    (name, sub.training if module_reads.read_mode(sub) else None) for name, sub in m.named_modules()
                ),
                classes=tuple(schema.class_name(type(sub)) for _, sub in m.named_modules()),
                called=tuple(i for i, (_, sub) in enumerate(m.named_modules()) if module_reads.called(sub)),
                attributes=tuple(
                    (name, path, value)
                    for name, sub in m.named_modules()
                    for path, value in module_reads.read_attributes(
                        f"args[{position}]" + (f".{name}" if name else ""), sub
                    )
                ),
                data_parallel=data_parallel.get(index),
            )
            for index, (position, m) in enumerate(zip(args.module_positions, args.modules))
        ),
        state=tuple(_state_spec(entry) for entry in args.lifted),
        input_spec=args.input_spec,
        inputs=tuple(
            LeafSpec(tensor=_tensor_spec(leaf, tuple(free_by_leaf.get(i, ()))))
            if isinstance(leaf, torch.Tensor)
            else LeafSpec(value=schema.value_literal(leaf))
            for i, leaf in enumerate(args.input_leaves)
        ),
        output_spec=recorded["out_spec"],
        outputs=tuple(outputs),
        grad_state=grads["grad_state"],
        constants=tuple(_constant_spec(c) for c in constants),
        # Autograd in the graph (backward(), autograd.grad) makes grad mode and
        # every requires_grad part of the contract; a pure forward computes the
        # same values either way.
        needs_grad=recorded["ran_autograd"],
        grad_mode_read=recorded["reads"].get("is_grad_enabled", ""),
        inference_mode_read=recorded["reads"].get("is_inference_mode_enabled", ""),
        mutated=tuple(sorted(mutated)),
        default_dtype=str(torch.get_default_dtype()).removeprefix("torch."),
        autocast=autocast,
        autocast_dtypes=_autocast_dtypes_read(recorded["reads"], autocast),
        optimizers=optimizers,
        grad_inputs=grads["grad_inputs"],
        grads_assigned=grads["grads_assigned"],
        grads_owned=grads["grads_owned"],
        grads_cleared=grads["grads_cleared"],
        grads_none=grads_none,
        grads_present=grads_present,
        requires_grad_read=recorded["requires_grad_read"],
        tensor_attributes=recorded["tensor_attributes"],
        grad_inputs_read_only=grads["grad_inputs_read_only"],
        output_tensors=tuple(output_tensors),
        ordered_dicts=recorded["ordered_dicts"],
        signature=_signature_record(fn, args.example_inputs),
        output_views=output_views,
        same_inputs=tuple(same),
        same_modules=tuple(_same_objects(args.modules)),  # fn may branch on `a is b` (Note invariant 11)
        rebound_inputs=recorded["rebound_inputs"],
        parallel_hooks=tuple(args.parallel_hooks),
        fully_shard_policies=tuple(args.fully_shard_policies),
        size_facts=recorded.get("size_facts", ()),
        returned_inputs=recorded["returned_inputs"],
    )
    _refuse_module_changes(recorded["module_changes"])  # after the checks that name a value fn read
    return _Capture(graph, convention, example, recorded.get("size_fact_of"))


def _autocast_dtypes_read(reads: dict, autocast: tuple) -> tuple:
    """The process's autocast dtype of each device fn read it of (``_StateReads``), beyond
    those the caller's autocast sets (checked as ``autocast``); restored as at fn's start."""
    enabled = {device for device, _ in autocast}
    return schema.autocast_dtypes(tuple(sorted(reads.get("autocast_dtype", set()) - enabled)))


def _signature_record(fn: Callable, example_inputs: tuple) -> tuple:
    """fn's parameters as literals (CallingConvention.signature): (name, kind, bound by the capture)."""
    try:
        signature = inspect.signature(fn)
        bound = signature.bind(*example_inputs).arguments
    except (TypeError, ValueError):  # no signature (a C callable): positional calls only
        return ()
    return tuple((p.name, p.kind.name, p.name in bound) for p in signature.parameters.values())


def _output_spec(t: torch.Tensor) -> TensorSpec:
    """What an output tensor of the trace is: a size that depends on free dims (a SymInt) is None."""
    return TensorSpec(
        shape=tuple(size if type(size) is int else None for size in t.shape),
        stride=None,
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
    )


def _mutated_inputs(graph: torch.fx.GraphModule, count: int) -> set:
    """Indices among the first ``count`` placeholders that the graph writes in place.

    A write reaches a placeholder through any chain of views or in-place ops
    (whose results alias their first argument).
    """
    placeholders = list(graph.graph.find_nodes(op="placeholder"))[:count]
    base = {node: index for index, node in enumerate(placeholders)}  # node -> placeholder it aliases
    mutated = set()
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:  # an element of split() / unbind()
            if node.args[0] in base:
                base[node] = base[node.args[0]]
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        values = list(zip(schema.arguments, node.args)) + [
            (a, node.kwargs[a.name]) for a in schema.arguments if a.name in node.kwargs
        ]
        for argument, value in values:
            if argument.alias_info is not None and argument.alias_info.is_write:
                for arg in value if isinstance(value, (list, tuple)) else [value]:
                    if arg in base:
                        mutated.add(base[arg])
        if any(r.alias_info is not None for r in schema.returns) and node.args and node.args[0] in base:
            base[node] = base[node.args[0]]
    return mutated


def _same_tensor_inputs(args: _Arguments) -> list:
    """(first, other): user tensor inputs that are one tensor at capture (``fn(x, x)``), as
    tensor graph input indices, every other member of a group paired with its first.

    Traced as one clone, as eager runs them: fn may write through one and read the
    other, or branch on ``a is b`` (nn.MultiheadAttention's ``query is key``).  Every
    call must pass the same partition: one tensor there, distinct tensors elsewhere.
    """
    return _same_objects([args.input_leaves[index] for index in args.tensor_indices], start=len(args.lifted))


def _same_objects(objects: list, start: int = 0) -> list:
    """(first, other): indices (counted from ``start``) of ``objects`` that are one object,
    every other member of a group paired with its first."""
    groups: dict[int, list] = {}
    for j, value in enumerate(objects, start=start):
        groups.setdefault(id(value), []).append(j)
    return sorted((first, other) for first, *others in groups.values() for other in others)


def _refuse_same_tensor_with_marks(args: _Arguments, same: list) -> None:
    """One tensor passed twice where dims are marked: the symbolic trace gives each input
    leaf its own fake tensor, so fn would see two tensors where eager sees one."""
    first, other = same[0]
    raise PrecompileError(
        f"{_input_name(args, other)} is {_input_name(args, first)} (one tensor), and the example inputs have "
        "dims marked with mark_unbacked, whose trace takes each input as a distinct tensor: fn may write "
        "through one or branch on identity. Pass distinct tensors (e.g. .clone()), at capture and at every call"
    )


def _refuse_aliased_examples(args: _Arguments, mutated: set, same: list) -> None:
    """Example tensors sharing memory where one is written: the clones traced do not.

    Capture traces each example on its own clone, so the graph assumes
    distinct memory; that is only what fn computes when nothing they share is
    written, or when they are one tensor traced as one (``same``).  The driver
    refuses such aliasing at every call (Note invariant 11).
    """
    same = runtime.pairs_within_groups(same)
    tensors = [e.tensor for e in args.lifted] + [args.input_leaves[i] for i in args.tensor_indices]
    names = [f"parameter/buffer '{e.names[0][1]}'" for e in args.lifted] + [
        args.input_paths[i] for i in args.tensor_indices
    ]
    for i in sorted(mutated):
        for j in range(len(tensors)):
            if j != i and (i, j) not in same and compat.is_alias_of(tensors[i], tensors[j]):
                raise PrecompileError(
                    f"{names[i]} and {names[j]} share memory and fn writes {names[i]} in place; "
                    "precompile traces every example tensor separately and cannot reproduce "
                    "that: pass distinct tensors (e.g. .clone()) at capture and at every call"
                )


def _output_views(graph: torch.fx.GraphModule, example: list, outputs: list, args: _Arguments, inductor: bool) -> tuple:
    """fn's tensor outputs that are a tensor input (state or user) or a view of one (Note invariant 11).

    Inductor returns fresh buffers, so a write through such an output would not
    reach the input as in eager: the driver rebuilds them from the runtime input.
    The graph says which input an output aliases; the example tensors give the
    view's layout, which must be static.  A view the driver cannot rebuild (of
    a .grad or optimizer state, lazily conjugated, another dtype) is refused.
    The eager graph returns the views themselves, made with grad mode off: there
    the driver rebuilds only views that require grad, in the caller's grad mode,
    so that a backward through one reaches its base as in eager (invariant 4),
    refusing those as_strided cannot rebuild (``.conj()``, ``.real``); the rest
    it returns as the graph made them (``.view(dtype)``, ``p.detach()``).  A
    view fn detached is rebuilt detached, one it made under no_grad() under
    no_grad() (requiring grad without history, as eager's).
    """
    num_inputs = len(args.lifted) + len(args.tensor_indices)
    all_placeholders = list(graph.graph.find_nodes(op="placeholder"))
    placeholders, trailing = all_placeholders[:num_inputs], all_placeholders[num_inputs:]
    returned = graph.graph.output_node().args[0]
    root, _ = _alias_sets(graph)
    inputs_by_root = {root(node): index for index, node in enumerate(placeholders)}
    # The graph inputs after fn's tensors (the incoming .grad, optimizer state and
    # hyperparameters, free sizes), and the gradients the graph returns.
    grads = {*trailing, *(node for node in returned[len(outputs) :] if isinstance(node, torch.fx.Node))}
    grad_roots = {root(node) for node in grads}
    views = []
    for k, node in enumerate(returned[: len(outputs)]):
        if inductor and isinstance(node, torch.fx.Node) and root(node) in grad_roots and _through_in_place_ops(node) not in grads:
            raise PrecompileError(
                f"fn returns a view of a .grad or of optimizer state (fn's output {k}{_source_of(node)}): "
                "backend='inductor' returns new tensors, so writes through it would not reach the "
                ".grad as in eager. Return the .grad itself or a .clone() of the view, or use backend='eager'"
            )
        index = inputs_by_root.get(root(node)) if isinstance(node, torch.fx.Node) else None
        if index is None:
            continue
        if _through_in_place_ops(node) is placeholders[index]:  # `return x`, `return x.add_(1)`
            if inductor:  # the eager graph returns the input itself
                views.append(OutputView(graph_output=k, base=index))
            continue
        base, out = example[index], outputs[k]
        # fn runs under enable_grad(): a view without grad of an input with it, fn detached; where the
        # input required no grad at capture (it may at a call), a detach in the graph says so
        detached = not out.requires_grad if _caller_tensor(args, index).requires_grad else _detached_in_graph(node)
        if not inductor and not out.requires_grad and not detached:
            continue  # the eager graph's own view, with no history to lose (made with grad mode off)
        no_grad = out.requires_grad and out.grad_fn is None  # a view made under fn's no_grad()
        if not compat.is_alias_of(out, base) and not compat.is_fake(out):
            continue  # an out= op, which the graph's aliasing over-approximates
        layout = (*out.shape, *out.stride(), out.storage_offset(), base.storage_offset())
        lazy_bits = (out.is_conj(), out.is_neg()) != (base.is_conj(), base.is_neg())  # x.conj(), x.mH
        if out.dtype != base.dtype or lazy_bits or not all(type(size) is int for size in layout):
            differs = (
                "another dtype"
                if out.dtype != base.dtype
                else "a lazy conjugate or negation (.conj(), .mH)" if lazy_bits else "sizes that depend on a marked dim"
            )
            name = _input_name(args, index)
            if not inductor and not out.requires_grad:
                continue  # no history to lose (.view(torch.int32), a detached one): the eager graph's view
            if not inductor:  # .conj(), .real, view_as_real: the graph's view has no history
                raise PrecompileError(
                    f"fn returns a view of {name} with {differs} that autograd follows back to it: the eager "
                    "graph makes it with grad mode off and as_strided cannot make it again in the caller's grad "
                    "mode, so a backward through it would not reach the input as in eager. Return the input itself "
                    "and take the view outside fn, or .detach() it (the artifact's outputs carry no autograd history)"
                )
            raise PrecompileError(
                f"fn returns a view of {name} with {differs}: "
                "backend='inductor' returns new tensors and cannot rebuild that view, so writes "
                "through it would not reach the input as in eager. Return a .clone() (or the "
                "input itself), or use backend='eager'"
            )
        offset = out.storage_offset() - base.storage_offset()
        views.append(OutputView(k, index, tuple(out.shape), tuple(out.stride()), offset, detached, no_grad))
    return tuple(views)


def _caller_tensor(args: _Arguments, index: int) -> torch.Tensor:
    """Tensor graph input ``index`` as the caller passed it: a parameter/buffer, then the user tensors."""
    if index < len(args.lifted):
        return args.lifted[index].tensor
    return args.input_leaves[args.tensor_indices[index - len(args.lifted)]]


def _detached_in_graph(node: torch.fx.Node) -> bool:
    """Whether the view ``node`` of a graph input went through a ``detach`` (``.detach()``, ``.data``):
    each view, in-place or split op takes the tensor it aliases first.  Where make_fx records a detach
    as aten.alias (compat.DETACH_TRACES_AS_ALIAS), an alias counts as one, x[...]'s too (Note)."""
    detach = torch.ops.aten.alias.default if compat.DETACH_TRACES_AS_ALIAS else torch.ops.aten.detach.default
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target is detach:
            return True
        node = node.args[0] if node.args else None
    return False


def _through_in_place_ops(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor an in-place or out= op (``x.add_(1)`` returns ``x`` itself) wrote, repeatedly."""
    while isinstance(node, torch.fx.Node) and isinstance(node.target, torch._ops.OpOverload):
        schema = node.target._schema
        written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        returns = schema.returns
        if len(written) != 1 or len(returns) != 1 or returns[0].alias_info is None or not returns[0].alias_info.is_write:
            break
        node = (dict(zip((a.name for a in schema.arguments), node.args)) | dict(node.kwargs)).get(written[0])
    return node


def _input_name(args: _Arguments, index: int) -> str:
    """Tensor graph input ``index``: a parameter/buffer, then the user tensors."""
    if index < len(args.lifted):
        module_index, fqn = args.lifted[index].names[0]
        return f"args[{args.module_positions[module_index]}].{fqn} ({args.lifted[index].kind})"
    return args.input_paths[args.tensor_indices[index - len(args.lifted)]]


# With its separator: torchvision's files (site-packages/torchvision/...) are not torch's.
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCH_NN_DIR = os.path.join(_TORCH_DIR, "nn", "")
# precompile's modules sit together in one directory, outside torch's once installed
# (in-tree: torch's own).
_PRECOMPILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


def _is_model_code(filename: str) -> bool:
    """fn's or its modules' code (torch.nn's included), not torch's other Python or this package's."""
    return filename.startswith(_TORCH_NN_DIR) or not filename.startswith((_TORCH_DIR, _PRECOMPILE_DIR))


class _StateReads:
    """What fn reads through Python, beyond its modules, while it is traced.

    - Grad and inference mode (``torch.is_grad_enabled()`` & co.): a query
      answered as the trace runs (grad on, inference off) is noted with fn's
      line, and the driver requires that mode at every call (Note invariant 11).
      Queries by torch's context managers and optimizers, which only save a mode
      to restore it, and by the tracer do not count; neither do answers fn's
      own ``no_grad()`` gave, which no caller changes.
    - Tensor values turned into Python (``.tolist()``, ``.numpy()``, DLPack):
      refused for a traced tensor, in forward and in backward (invariant 12).
      ``.item()``, ``int()``, ``bool()`` & co. go through
      ``aten._local_scalar_dense``, which make_fx refuses (or, in a symbolic
      trace, makes an unbacked value).
    - ``requires_grad`` of a tensor, read by fn or a module's code: an
      argument's is checked at every call; an intermediate's follows grad
      mode and the arguments', which are then all required as traced.
    - Calls of torch's RNG setters (``manual_seed``, ``seed``,
      ``set_rng_state``, which ``fork_rng`` uses), only for the line a refusal
      of ``_RandomDraws`` names.
    - ``nn.Parameter(...)`` made inside fn (by fn, or by a module it builds):
      refused, as make_fx does not trace the Parameter it wraps around a
      traced tensor (the graph would read it as live state).

    The wrappers are process-global for the trace; other threads' calls pass
    through (the reads are this thread's).
    """

    _tracing = threading.local()  # .reads: {query name: where} while this thread runs fn
    _VALUE_READS = ("tolist", "numpy", "__dlpack__")
    # How the caller made a tensor and where it sits in memory: no call checks them.
    _UNCHECKED_FACTS = ("is_leaf", "grad_fn", "_version", "_base", "_is_view", "is_inference", "storage_offset", "data_ptr")
    # Noted only to name fn's line when _RandomDraws refuses a moved generator.
    _RNG_SETTERS = ("manual_seed", "seed", "set_rng_state")
    # fn computing in a device's process autocast dtype: torch.autocast(device) without
    # a dtype and custom_fwd read it, fn enabling autocast itself uses it.  autocast's
    # __enter__ reads it only to restore it, enables it with the dtype it was given, and
    # __exit__ restores the state before.
    _AUTOCAST_DTYPE_USES = ("get_autocast_dtype", "set_autocast_enabled")
    _AUTOCAST_SWITCHES = (torch.autocast.__enter__.__code__, torch.autocast.__exit__.__code__)
    # Code whose mode queries shape no graph: context managers and optimizers
    # save a mode to restore it; the tracer and fake tensors key caches on it;
    # DTensor.to_local gives its local tensor, itself or (grad on) a view of it.
    _NOT_FN_QUERIES = tuple(
        os.path.abspath(sys.modules[cls.__module__].__file__) for cls in (torch.no_grad, torch.optim.Optimizer)
    ) + tuple(
        os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), *path)
        for path in (("fx", ""), ("_subclasses", ""), ("distributed", "tensor", "_api.py"))
    )

    def __init__(self):
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "_StateReads":
        compat.import_tensor_attribute_readers()
        self._stack.enter_context(compat.wrapped_mode_queries(self._noting))
        requires_grad = self._noting_requires_grad(compat.tensor_attribute("requires_grad"))
        self._stack.enter_context(compat.patched(torch.Tensor, "requires_grad", requires_grad))
        for name in self._VALUE_READS:
            self._stack.enter_context(compat.patched(torch.Tensor, name, self._refusing(name, getattr(torch.Tensor, name))))
        for name in self._UNCHECKED_FACTS:
            self._stack.enter_context(compat.patched(torch.Tensor, name, self._refusing_fact(name, compat.tensor_attribute(name))))
        self._stack.enter_context(compat.patched(torch.utils, "swap_tensors", self._refusing_swaps(torch.utils.swap_tensors)))
        load = self._refusing_assigned_loads(torch.nn.Module.load_state_dict)
        self._stack.enter_context(compat.patched(torch.nn.Module, "load_state_dict", load))
        data = self._refusing_data_assignment(compat.tensor_attribute("data"))
        self._stack.enter_context(compat.patched(torch.Tensor, "data", data))
        mkldnn = type(torch.backends.mkldnn)
        self._stack.enter_context(compat.patched(mkldnn, "enabled", self._refusing_mkldnn_flag(vars(mkldnn)["enabled"])))
        for name in self._AUTOCAST_DTYPE_USES:
            self._stack.enter_context(compat.patched(torch, name, self._noting_autocast_dtype(name, getattr(torch, name))))
        for name in self._RNG_SETTERS:  # torch re-exports torch.random's; fork_rng calls torch.set_rng_state
            setter = self._noting_setter(name, getattr(torch.random, name))
            self._stack.enter_context(compat.patched(torch, name, setter))
            self._stack.enter_context(compat.patched(torch.random, name, setter))
        self._stack.enter_context(compat.patched(torch.Tensor, "__bool__", self._deciding_bool(torch.Tensor.__bool__)))
        call = self._refusing_artifact_calls(runtime.PrecompiledFunction.__call__)
        self._stack.enter_context(compat.patched(runtime.PrecompiledFunction, "__call__", call))
        make_parameter = staticmethod(self._refusing_parameters(torch.nn.Parameter.__new__))
        self._stack.enter_context(compat.patched(torch.nn.Parameter, "__new__", make_parameter))
        # Called only where normal lookup fails: fn reading an attribute the stand-ins lack.
        self._stack.enter_context(compat.patched(torch.Tensor, "__getattr__", _TensorAttributes.missing))
        delete = _TensorAttributes.deleting(torch.Tensor.__delattr__)
        self._stack.enter_context(compat.patched(torch.Tensor, "__delattr__", delete))
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    @classmethod
    @contextlib.contextmanager
    def of_fn(cls, reads: dict):
        """Around fn's call in the trace: its mode queries (and RNG setters) go to ``reads``."""
        cls._tracing.reads = reads
        try:
            yield
        finally:
            cls._tracing.reads = None

    @classmethod
    def _noting(cls, name: str, query: Callable) -> Callable:
        traced_answer = name == "is_grad_enabled"

        def noted_query() -> bool:
            answer = query()
            reads = getattr(cls._tracing, "reads", None)
            if reads is not None and answer is traced_answer and name not in reads:
                if not os.path.abspath(sys._getframe(1).f_code.co_filename).startswith(cls._NOT_FN_QUERIES):
                    reads[name] = _user_line(traceback.extract_stack()) or " (in torch)"
            return answer

        return noted_query

    @classmethod
    def _noting_requires_grad(cls, descriptor: Any) -> property:
        """``Tensor.requires_grad`` noting, by tensor id, the reads by fn's or its modules' code
        (torch.nn's included; torch's other Python, the tracer's and autograd's, does not count)."""

        def noted_get(tensor: torch.Tensor) -> bool:
            reads = getattr(cls._tracing, "reads", None)
            if reads is not None:
                noted = reads.setdefault("requires_grad", {})
                if id(tensor) not in noted and _is_model_code(os.path.abspath(sys._getframe(1).f_code.co_filename)):
                    noted[id(tensor)] = _user_line(traceback.extract_stack())
            return descriptor.__get__(tensor)

        return property(noted_get, descriptor.__set__)

    @classmethod
    def _noting_setter(cls, name: str, setter: Callable) -> Callable:
        def noted_setter(*args: Any, **kwargs: Any) -> Any:
            reads = getattr(cls._tracing, "reads", None)
            if reads is not None:
                reads["rng"] = f"; last: torch.{name}(){_user_line(traceback.extract_stack())}"
            return setter(*args, **kwargs)

        return noted_setter

    @classmethod
    def _refusing_swaps(cls, swap: Callable) -> Callable:
        """``torch.utils.swap_tensors`` refused inside fn: it swaps two Python tensor objects, which
        the trace cannot follow (torch would fail on the weak references its tracer keeps)."""

        @functools.wraps(swap)
        def refusing_swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
            if getattr(cls._tracing, "reads", None) is not None:
                raise PrecompileError(
                    f"fn calls torch.utils.swap_tensors{_user_line(traceback.extract_stack())}: it swaps two "
                    "tensor objects, which the trace cannot follow and the artifact cannot repeat. Swap the "
                    "tensors outside fn, before or after calling it, or swap their values in place inside fn "
                    "(same shape and dtype): `with torch.no_grad(): t = a.clone(); a.copy_(b); b.copy_(t)`"
                )
            return swap(t1, t2)

        return refusing_swap

    @classmethod
    def _refusing_artifact_calls(cls, call: Callable) -> Callable:
        """A loaded artifact called inside fn refused: its checks would run on the trace's
        stand-ins (and fail on capture's own hooks), its graph is not fn's code to trace."""

        @functools.wraps(call)
        def refusing_call(function: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(cls._tracing, "reads", None) is not None:
                raise PrecompileError(
                    f"fn calls an artifact that torch.compiler.precompile.load returned"
                    f"{_user_line(traceback.extract_stack())}, which precompile cannot trace: call "
                    "the function the artifact was made from inside fn instead (precompile traces that), "
                    "or call the artifact outside fn"
                )
            return call(function, *args, **kwargs)

        return refusing_call

    @classmethod
    def _refusing_assigned_loads(cls, load: Callable) -> Callable:
        """``nn.Module.load_state_dict`` refusing ``assign=True`` inside fn: it rebinds the module's
        parameters to the state dict's tensors (new ``nn.Parameter`` s the trace cannot follow),
        which the artifact cannot repeat; torch would wrap the refusal in its own RuntimeError."""

        @functools.wraps(load)
        def refusing_load(module: torch.nn.Module, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
            if assign and getattr(cls._tracing, "reads", None) is not None:
                raise PrecompileError(
                    f"fn calls {type(module).__name__}.load_state_dict(..., assign=True)"
                    f"{_user_line(traceback.extract_stack())}: it rebinds the module's parameters and buffers "
                    "to the state dict's tensors, which the artifact cannot repeat. Copy the values in place "
                    "instead: load_state_dict(state_dict) without assign=True (it copies under no_grad)"
                )
            return load(module, state_dict, strict=strict, assign=assign)

        return refusing_load

    @classmethod
    def _refusing_data_assignment(cls, descriptor: Any) -> property:
        """``Tensor.data`` refusing assignments by fn's or its modules' code (torch.nn's included,
        as ``vector_to_parameters``): make_fx does not trace the setter, so the artifact would
        neither compute with the new value nor leave it in the tensor."""

        def set_(tensor: torch.Tensor, value: torch.Tensor) -> None:
            reads = getattr(cls._tracing, "reads", None)
            if reads is not None and _is_model_code(os.path.abspath(sys._getframe(1).f_code.co_filename)):
                raise PrecompileError(
                    f"fn assigns a tensor's .data{_user_line(traceback.extract_stack())} (itself, or through "
                    "torch.nn.utils.vector_to_parameters): the trace does not record the assignment, so the "
                    "artifact would neither compute with the new value nor leave it in the tensor. Write the "
                    "new values in place instead: `with torch.no_grad(): p.copy_(new)` (for "
                    "vector_to_parameters, copy each parameter's slice of the vector, "
                    "`p.copy_(vec[i:i + p.numel()].view_as(p))`); a .data of another shape or dtype "
                    "cannot be precompiled"
                )
            descriptor.__set__(tensor, value)

        return property(descriptor.__get__, set_)

    @classmethod
    def _refusing_parameters(cls, make: Callable) -> Callable:
        def refusing_new(parameter_class: type, *args: Any, **kwargs: Any) -> torch.nn.Parameter:
            if getattr(cls._tracing, "reads", None) is not None:
                raise PrecompileError(
                    f"fn makes an nn.Parameter{_user_line(traceback.extract_stack())} (itself, or by "
                    "building a module inside fn), which precompile does not support: the trace cannot "
                    "follow the Parameter it wraps around a tensor. Use a plain tensor (with "
                    ".requires_grad_() where fn differentiates it), or build the module outside fn and "
                    "pass it as an argument"
                )
            return make(parameter_class, *args, **kwargs)

        return refusing_new

    @classmethod
    def _noting_autocast_dtype(cls, name: str, use: Callable) -> Callable:
        """``use`` (torch.get_autocast_dtype / set_autocast_enabled) noting, under
        ``reads["autocast_dtype"]``, the devices whose process autocast dtype fn computes in."""

        def noted_use(device: Any, *args: Any) -> Any:
            reads = getattr(cls._tracing, "reads", None)
            if (
                reads is not None
                and isinstance(device, str)  # set_autocast_enabled(bool): CUDA's deprecated form
                and (name == "get_autocast_dtype" or args[:1] == (True,))
                and sys._getframe(1).f_code not in cls._AUTOCAST_SWITCHES
            ):
                reads.setdefault("autocast_dtype", set()).add(device)
            return use(device, *args)

        return noted_use

    @classmethod
    def _refusing_mkldnn_flag(cls, flag: Any) -> property:
        """``torch.backends.mkldnn.enabled`` refusing fn's reads and writes (torch's pass): the
        trace runs with MKLDNN off (``_without_mkldnn``), so fn would read False where eager
        reads the caller's setting, and a value fn leaves would be hidden by the restore."""

        def refuse_from_fn(action: str) -> None:
            if getattr(cls._tracing, "reads", None) is not None and _is_user_file(sys._getframe(2).f_code.co_filename):
                raise PrecompileError(
                    f"fn {action} torch.backends.mkldnn.enabled{_user_line(traceback.extract_stack())}: the trace runs "
                    "with MKLDNN off, so neither what fn reads nor what it leaves for its caller is eager's; "
                    "set or read it outside fn (pass what it decides as an argument)"
                )

        def get(module: Any) -> bool:
            refuse_from_fn("reads")
            return flag.__get__(module, type(module))

        def set_(module: Any, value: bool) -> None:
            refuse_from_fn("sets")
            flag.__set__(module, value)

        return property(get, set_)

    @classmethod
    def last_rng_move(cls) -> str:
        return (getattr(cls._tracing, "reads", None) or {}).get("rng", "")

    @classmethod
    def _refusing_fact(cls, name: str, attribute: Any) -> Any:
        """``attribute`` (a property or a method of Tensor) refusing reads by fn's or its
        modules' code (not torch's): the answer depends on how the caller made the
        tensor, which no call checks (Note invariant 11)."""

        is_property = type(attribute).__name__ == "getset_descriptor"
        spelled = f".{name}" if is_property else f".{name}()"

        def refuse_from_fn() -> None:
            if getattr(cls._tracing, "reads", None) is not None and _is_user_file(sys._getframe(2).f_code.co_filename):
                raise PrecompileError(
                    f"fn reads a tensor's {spelled}{_user_line(traceback.extract_stack())}: it depends on how the "
                    "caller made the tensor, which the artifact does not check at its calls; compute without it, "
                    "or pass what it decides as an argument fn branches on"
                )

        if is_property:

            def get(tensor: torch.Tensor) -> Any:
                refuse_from_fn()
                return attribute.__get__(tensor)

            return property(get)

        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            refuse_from_fn()
            return attribute(tensor, *args, **kwargs)

        return method

    @classmethod
    def _deciding_bool(cls, truth: Callable) -> Callable:
        """``Tensor.__bool__`` answering, during fn's trace, a comparison that every call decides
        alike (``_decided_comparison``): the branch is then fn's code for every call, not data."""

        def deciding_bool(tensor: torch.Tensor) -> bool:
            if getattr(cls._tracing, "reads", None) is not None:
                decided = _decided_comparison(tensor)
                if decided is not None:
                    return decided
            return truth(tensor)

        return deciding_bool

    @classmethod
    def _refusing(cls, name: str, read: Callable) -> Callable:
        def refused_read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if getattr(cls._tracing, "reads", None) is not None and _traced_value(tensor):
                raise _data_dependent_error(traceback.extract_stack(), f"with .{name}()")
            return read(tensor, *args, **kwargs)

        return refused_read


def _trace_slot(tensor: torch.Tensor) -> Any:
    """make_fx's record of ``tensor`` in the running trace (its ``proxy`` and ``constant``), or None."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot, has_proxy_slot

    mode = get_proxy_mode()
    if mode is None or not has_proxy_slot(tensor, mode.tracer):
        return None
    return get_proxy_slot(tensor, mode.tracer)


def _traced_value(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s values come from the trace's inputs (not a make_fx constant)."""
    slot = _trace_slot(tensor)
    return slot is not None and slot.constant is None


# Draws uniform in [0, 1), taken as [0, 1]: a reduced-precision draw may round up to 1.
_UNIT_DRAWS = (torch.ops.aten.rand.default, torch.ops.aten.rand_like.default)
# Comparisons monotone in their tensor operand: constant over an interval where its ends agree.
_MONOTONE_COMPARISONS = {
    torch.ops.aten.lt.Scalar: operator.lt,
    torch.ops.aten.le.Scalar: operator.le,
    torch.ops.aten.gt.Scalar: operator.gt,
    torch.ops.aten.ge.Scalar: operator.ge,
}


def _decided_comparison(tensor: torch.Tensor) -> bool | None:
    """The truth of a traced one-element comparison of a fresh uniform draw with a bound outside
    [0, 1], which every call's draw decides alike (transformers' LayerDrop, ``torch.rand([]) <
    self.layerdrop``, never true with layerdrop 0: the bound is a module value checked at every
    call); None where the drawn value decides.  The draw stays in the graph: the generator moves
    as in eager."""
    slot = _trace_slot(tensor)
    if slot is None:
        return None
    node = slot.proxy.node
    compare = _MONOTONE_COMPARISONS.get(node.target)
    if compare is None or len(node.args) != 2 or node.kwargs:
        return None
    drawn, bound = node.args
    if not isinstance(drawn, torch.fx.Node) or drawn.target not in _UNIT_DRAWS:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        return None
    # One element, eager's condition for a truth value; sizes with marked dims (SymInts) are
    # left undecided rather than guarded.
    if not all(type(size) is int and size == 1 for size in tensor.shape):
        return None
    at_zero, at_one = compare(0.0, bound), compare(1.0, bound)
    return at_zero if at_zero == at_one else None


# Flags a library sets on a module at fn's first call, by name: what the refusal of fn setting
# one says instead of "keep fn from writing it".
_LIBRARY_FLAG_FIXES = {
    "_output_capturing_hooks_installed": (
        "transformers sets it where fn asks for output_hidden_states or output_attentions, which it collects "
        "with forward hooks installed on the layers at that first call (transformers.utils.output_capturing); "
        "precompile cannot capture that: " + runtime.OUTPUT_CAPTURING_WAY
    ),
}



def _value_change_fix(path: str, old: Any, new: Any) -> str:
    """What to do about fn writing a value it read: a default fn fills in where it finds None
    (transformers' ``config.problem_type``, at the first call with labels) can be set beforehand."""
    fix = "the artifact would compute with the value it read and not reproduce the change: "
    if old is None and new is not schema.MISSING and _has_literal(new):
        return fix + (
            f"where fn fills in a default once, as eager's first call would, set it before precompile "
            f"({path} = {new!r}); otherwise keep fn from writing it"
        )
    return fix + "keep fn from writing it"


# nn.Module's own bookkeeping (hook dicts, ``_parameters``, methods): the
# driver checks structure and hooks itself, these are not values fn computes with.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) | frozenset(dir(torch.nn.Module))
# What a plain object followed by its attribute reads must not be: its items or its own value would go unrecorded.
_BUILTIN_VALUE_TYPES = (dict, list, tuple, set, frozenset, str, bytes, int, float, complex)
_SKIPPED = ("skipped", None)  # a read that is code, a tensor, or computed by a descriptor
_CALLED = object()  # the value noted for a module whose hook dicts fn's call of it read


class _ModuleReads:
    """Records what fn reads of its modules' Python state while it is traced
    (Note invariant 11): ``training`` flags, and every plain value -- an int,
    float, str, dtype, Size, Enum, numpy scalar, or a tuple, list or dict of
    them -- read from a submodule's ``vars()`` or class (private names too), or
    from a plain object reached through such attributes (a config:
    ``self.config.eps``), as attribute paths.

    Only what was read can have shaped the graph, so only that is recorded and
    checked at every call, by the value the trace saw.  Functions, methods and
    modules are code (submodules are checked structurally), tensors are state
    (invariants 1, 2); any other value read is refused, naming its path.
    Each submodule's class is swapped, for the trace only, for a subclass that
    logs reads, and so is the class of each plain object when first reached; a
    module whose class cannot be swapped counts as having read its flag.
    During the trace ``type(obj)`` is that subclass (``isinstance`` still
    holds, names are kept).  fn changing a mode (``model.eval()`` inside fn) or
    a value it read is refused: the artifact would not reproduce that.
    """

    _probes: dict = {}  # (original class, is a module) -> its probe subclass
    _tracing = threading.local()  # .log: the _ModuleReads of this thread's capture

    def __init__(self, args: _Arguments, kept: "_KeptModules"):
        self.kept = kept  # restores the plain objects followed, with the modules
        self.modules = {}  # id -> (path, module, class, mode), first path of shared submodules
        for path, sub in runtime.named_submodules(args.module_positions, args.modules):
            self.modules.setdefault(id(sub), (path, sub, type(sub), sub.training))
        self.reads: dict = collections.defaultdict(dict)  # id(obj) -> {name: (kind, what)}, first read
        self.objects: dict = {}  # id -> (plain object, its class): probed while tracing

    def read_mode(self, module: torch.nn.Module) -> bool:
        return "training" in self.reads.get(id(module), ())

    def read_attributes(self, path: str, module: torch.nn.Module) -> list:
        """(attribute path, literal) of each plain value fn read from ``module``, in name order.

        A value changed since fn first read it (fn wrote it) is refused.
        """
        found: list = []
        self._collect(path, module, "", found, frozenset())
        return found

    def _collect(self, where: str, obj: Any, prefix: str, found: list, chain: frozenset) -> None:
        check = runtime.ValueReads()
        for name, (kind, what) in sorted(self.reads.get(id(obj), {}).items()):
            path = prefix + name
            if kind in ("skipped", "called"):  # "called": a hook dict, watched as the module's (ModuleSpec.called)
                continue
            if kind == "refused":
                raise PrecompileError(
                    f"fn reads {where}.{path}, {what}, which precompile cannot check at every call: "
                    "make it a plain value (int, float, str, None, dtype, Enum, or a tuple, list or dict "
                    "of them) or a plain object holding such values, register it as a buffer, or pass it "
                    "as an argument of fn"
                )
            now = check.read(obj, name)
            if kind == "literal" and not schema.matches(now, what):
                raise PrecompileError(
                    f"fn changes {where}.{path} (from {schema.describe_literal(what)} to "
                    f"{'nothing' if now is schema.MISSING else repr(now)}); "
                    + _LIBRARY_FLAG_FIXES.get(name, _value_change_fix(f"{where}.{path}", what, now))
                )
            if kind == "literal":
                found.append((path, what))
            elif now is not what:
                raise PrecompileError(
                    f"fn rebinds {where}.{path}; the artifact would not reproduce that: keep fn from writing it"
                )
            elif id(what) not in chain:  # a plain object: the values read from it, by their paths
                self._collect(where, what, path + ".", found, chain | {id(what)})

    def __enter__(self) -> "_ModuleReads":
        self._tracing.log = self
        for _, sub, cls, _ in self.modules.values():
            try:
                sub.__class__ = self._probe(cls, module=True)
            except TypeError:  # __slots__, script modules, a class's own `training`: assume read
                self.reads[id(sub)]["training"] = _SKIPPED
        return self

    def __exit__(self, *exc_info) -> None:
        self._tracing.log = None
        for obj, cls in self.objects.values():
            object.__setattr__(obj, "__class__", cls)
        changed = []
        for path, sub, cls, mode in self.modules.values():
            sub.__class__ = cls
            if sub.training != mode:
                changed.append(path)
                sub.training = mode  # capture leaves the caller's model as it was
        if changed and exc_info[0] is None:
            raise PrecompileError(
                f"fn changes the train/eval mode of {', '.join(changed[:5])} (it calls .eval() or "
                ".train()); the artifact would not reproduce that: set the mode before calling fn"
            )

    @classmethod
    def _note_read(cls, obj: Any, name: str, value: Any) -> None:
        log = getattr(cls._tracing, "log", None)
        if log is None:  # read by another thread, not by fn's trace
            return
        reads = log.reads[id(obj)]
        if name not in reads:
            reads[name] = log._classify(obj, name, value)

    def called(self, module: torch.nn.Module) -> bool:
        """Whether fn called ``module`` (its hook dicts were read): a hook added later would run in eager."""
        return self.reads.get(id(module), {}).get(runtime.MODULE_HOOK_DICTS[0]) == ("called", None)

    def _classify(self, obj: Any, name: str, value: Any) -> tuple:
        """What a first read of ``obj.name`` is: ("literal", its literal), ("object", a plain
        object whose reads are followed), ("refused", why) or _SKIPPED."""
        if value is _CALLED:
            return ("called", None)
        if value is schema.MISSING:  # found absent (getattr with a default, hasattr): guarded absent
            return ("literal", schema.value_literal(value))
        values = object.__getattribute__(obj, "__dict__")
        raw = values.get(name, schema.MISSING)
        if raw is schema.MISSING:
            raw = runtime.class_value(type(obj), name)
        if raw is schema.MISSING and id(obj) in self.objects and runtime.computes_attributes(self.objects[id(obj)][1], name):
            raw = value  # an alias the object's own __getattribute__ resolves: read with getattr at every call
        if raw is schema.MISSING and _is_code(value) and name not in values:
            # A method of the class (``forward``): guarded absent from the instance, so one set on it
            # later (``m.forward = wrapper``, as accelerate's prepare() does) is seen, not run past.
            return ("literal", schema.value_literal(schema.MISSING))
        if raw is not value or isinstance(value, torch.Tensor) or _is_code(value):
            return _SKIPPED  # a property's or method's result, code, or a tensor (invariants 1, 2)
        try:
            return ("literal", schema.value_literal(value))
        except TypeError:
            pass
        if type(value) in (list, tuple, dict):
            leaves = pytree.tree_leaves(value)
            if all(isinstance(leaf, torch.Tensor) or _is_code(leaf) for leaf in leaves):
                return _SKIPPED
            odd = [leaf for leaf in leaves if not _has_literal(leaf)]
            return ("refused", f"a {type(value).__name__} holding {_describe_type(odd[0]) if odd else 'keys of no plain type'}")
        if isinstance(value, _BUILTIN_VALUE_TYPES):
            # A subclass of a container or a number with a ``__dict__`` (OrderedDict, ``class Cfg(dict)``):
            # its items or value are no attribute reads, which are all a followed object's reads record.
            return ("refused", _describe_type(value))
        if type(getattr(value, "__dict__", None)) is dict and type(value).__module__ != "builtins":
            self._follow(f"{self._path_of(obj)}.{name}", value)
            return ("object", value)
        return ("refused", _describe_type(value))

    def _path_of(self, obj: Any) -> str:
        """Where fn first reached a module or plain object: ``args[0].config``."""
        return self.modules[id(obj)][0] if id(obj) in self.modules else self.kept.objects[id(obj)][0]

    def _follow(self, path: str, obj: Any) -> None:
        """Log reads of a plain object (a config, at ``path``) from now on, as of a module."""
        if id(obj) in self.objects:
            return
        self.kept.keep_object(path, obj)
        cls = type(obj)
        try:
            object.__setattr__(obj, "__class__", self._probe(cls, module=False))
        except Exception:  # noqa: BLE001  a class that refuses subclassing or swapping: all it holds counts as read
            self.reads[id(obj)].update((name, self._classify(obj, name, v)) for name, v in vars(obj).items())
            return
        self.objects[id(obj)] = (obj, cls)

    @classmethod
    def _refuse_deepcopy(cls, module: torch.nn.Module) -> None:
        """copy.deepcopy of a module argument inside fn: the copy's tensors would be copies of the
        trace's stand-ins, not of the caller's state, which make_fx cannot trace (their storage)."""
        log = getattr(cls._tracing, "log", None)
        path = log.modules[id(module)][0] if log is not None and id(module) in log.modules else "a module argument"
        callers = [frame for frame in traceback.extract_stack() if frame.filename != copy.__file__]
        raise PrecompileError(
            f"fn deep-copies {path} (copy.deepcopy, as torch.nn.utils.fusion.fuse_conv_bn_eval and "
            f"torch.ao.quantization's prepare/convert do){_user_line(callers)}, which "
            "precompile cannot trace: copy, fuse or quantize the module before precompile and pass the "
            "result as the argument"
        )

    @classmethod
    def _probe(cls, original: type, module: bool) -> type:
        if module and any("training" in vars(k) for k in original.__mro__):
            raise TypeError(f"{original.__name__} defines its own `training`")
        probe = cls._probes.get((original, module))
        if probe is None:
            get_attribute = original.__getattribute__
            internals = _MODULE_INTERNALS if module else frozenset()

            # Where a failed lookup is final, fn found the attribute absent: that is
            # read too.  A module's is final after nn.Module.__getattr__, wrapped below.
            absent_when_raised = not module and not hasattr(original, "__getattr__")

            def getattribute(obj, name):
                try:
                    value = get_attribute(obj, name)
                except AttributeError:
                    if absent_when_raised and name[:2] != "__":
                        cls._note_read(obj, name, schema.MISSING)
                    raise
                if name[:2] != "__" and (name not in internals or name == "forward"):  # forward: nn.Module's too
                    cls._note_read(obj, name, value)
                elif name in runtime.MODULE_HOOK_DICTS:  # nn.Module.__call__ looks for hooks: fn calls it
                    cls._note_read(obj, runtime.MODULE_HOOK_DICTS[0], _CALLED)
                return value

            namespace = {"__getattribute__": getattribute}
            if module:

                def get_training(module):
                    log = getattr(cls._tracing, "log", None)
                    if log is not None:  # None: read by another thread, not by fn's trace
                        log.reads[id(module)]["training"] = _SKIPPED  # checked as the mode, not as a value
                    return module.__dict__["training"]

                def set_training(module, value):
                    module.__dict__["training"] = value

                namespace["training"] = property(get_training, set_training)
                get_missing = original.__getattr__  # nn.Module's: parameters, buffers, submodules

                # A class's own __getattr__ computing a name: an instance attribute set
                # later would shadow it, so the name is read as absent from vars() too.
                computes_names = original.__getattr__ is not torch.nn.Module.__getattr__

                def getattr_(module, name):
                    try:
                        value = get_missing(module, name)
                    except AttributeError:
                        if name[:2] != "__" and name not in internals:
                            cls._note_read(module, name, schema.MISSING)
                        raise
                    if computes_names and name[:2] != "__" and name not in internals and not compat.held_by_module(module, name):
                        cls._note_read(module, name, schema.MISSING)
                    return value

                namespace["__getattr__"] = getattr_
                namespace["__deepcopy__"] = lambda module, memo: cls._refuse_deepcopy(module)
            else:
                namespace["__slots__"] = ()  # the same layout, so that __class__ can be swapped
            probe = type(original.__name__, (original,), namespace)
            probe.__module__, probe.__qualname__ = original.__module__, original.__qualname__
            cls._probes[(original, module)] = probe
        return probe


def _is_code(value: Any) -> bool:
    """Functions, methods, classes, modules (nn and Python) and loggers: code, like fn itself
    (a logger's level cache changes as it logs, and only decides what is printed)."""
    return callable(value) or isinstance(value, (types.ModuleType, logging.Logger, logging.LoggerAdapter))


def _describe_type(value: Any) -> str:
    return f"a {schema.class_name(type(value))}"


def _value_literal_or_missing(value: Any) -> Any:
    try:
        return schema.value_literal(value)
    except TypeError:
        return schema.MISSING


def _has_literal(value: Any) -> bool:
    return _value_literal_or_missing(value) is not schema.MISSING


def _set_autocast_enabled(state: tuple) -> None:
    """Autocast on exactly the devices of ``state`` (autocast_state()'s; the dtypes are set apart)."""
    enabled = {device for device, _ in state}
    for device in schema.AUTOCAST_DEVICES:
        torch.set_autocast_enabled(device, device in enabled)


def _autocast_nesting() -> int:
    """How many torch.autocast blocks are entered (torch has no reader: a net-zero round trip)."""
    torch.autocast_decrement_nesting()
    return torch.autocast_increment_nesting()


def _set_autocast_nesting(level: int) -> None:
    for _ in range(_autocast_nesting() - level):
        torch.autocast_decrement_nesting()
    for _ in range(level - _autocast_nesting()):
        torch.autocast_increment_nesting()


# Process-wide torch settings a call of fn could leave changed for its caller.
_TORCH_SETTINGS = {
    "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "the default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "deterministic algorithms": (
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1]),
    ),
    "anomaly detection": (
        lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        lambda value: torch.set_anomaly_enabled(*value),
    ),
    # The autocast settings: what torch.autocast(...).__enter__() and torch.set_autocast_* change.
    "autocast": (schema.autocast_state, _set_autocast_enabled),
    **{
        f"the {device} autocast dtype": (
            functools.partial(torch.get_autocast_dtype, device), functools.partial(torch.set_autocast_dtype, device)
        )
        for device in schema.AUTOCAST_DEVICES
    },
    "the autocast cache": (torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
    "the autocast nesting": (_autocast_nesting, _set_autocast_nesting),
}


@contextlib.contextmanager
def _torch_settings_kept():
    """fn leaving a torch setting changed is refused (and the setting restored, also where fn
    raised): eager's call would leave it so for the caller, every call of the artifact would not."""
    before = {name: read() for name, (read, _) in _TORCH_SETTINGS.items()}
    try:
        yield
    finally:  # also where fn raised: capture leaves the caller's settings as they were
        changed = {name: read() for name, (read, _) in _TORCH_SETTINGS.items() if read() != before[name]}
        for name in changed:
            _TORCH_SETTINGS[name][1](before[name])
    if changed:
        name, after = next(iter(changed.items()))
        raise PrecompileError(
            f"fn leaves {name} changed ({before[name]} -> {after}; restored): eager's call would leave it so "
            "for its caller, which no call of the artifact repeats. Restore it inside fn (a `with` block: "
            "torch.no_grad(), ...) or change it outside fn"
        )


def _gradient_hooks(tensor: torch.Tensor) -> dict:
    """(hook dict, handle id) -> hook, for each gradient hook on ``tensor``."""
    return {
        (attribute, key): hook
        for attribute in runtime._TENSOR_HOOKS
        for key, hook in (getattr(tensor, attribute, None) or {}).items()
    }


@contextlib.contextmanager
def _argument_autograd_kept(named: list):
    """Invariant 8: fn changing an argument tensor's autograd state -- its ``requires_grad``, a
    gradient hook it registers -- is refused.  ``named``: (path, the trace's stand-in for it).

    The stand-in takes the change, so the graph applies such a hook once; eager's call leaves
    both on the caller's tensor (a hook then runs again, once more, at each later call), which no
    call of the artifact repeats."""
    before = {id(tensor): (path, tensor, tensor.requires_grad, _gradient_hooks(tensor)) for path, tensor in named}
    yield
    for path, tensor, requires_grad, hooks in before.values():
        if tensor.requires_grad != requires_grad and tensor.is_leaf:  # an in-place write with history makes a non-leaf
            raise PrecompileError(
                f"fn sets {path}.requires_grad to {tensor.requires_grad} (it was {requires_grad}): eager's call "
                "leaves the caller's tensor so, which no call of the artifact repeats. Set it outside fn, "
                f"before precompile and the calls ({path}.requires_grad_({tensor.requires_grad}))"
            )
        added = [(key, hook) for key, hook in _gradient_hooks(tensor).items() if key not in hooks]
        if added:
            (attribute, _), hook = added[0]
            raise PrecompileError(
                f"fn registers a {runtime._TENSOR_HOOKS[attribute]} on {path} ({runtime.hook_name(hook)}): eager's "
                "call leaves it on the caller's tensor, where each later call runs it once more, while the "
                "artifact runs it once per call. Apply what it does to the gradient inside fn (after "
                "backward or torch.autograd.grad), or call fn eagerly"
            )


class _TensorAttributes:
    """While fn is traced: the Python attributes it reads that normal lookup does not find on
    the stand-in of a tensor argument (parameter, buffer or tensor input), as the caller's own
    (``p.no_wd = True``), which the stand-ins do not carry (Note invariant 11).

    ``missing`` (``Tensor.__getattr__`` during capture) answers with what normal lookup
    gives on the caller's tensor, recorded by graph input and name with its value, or absent
    (``isinstance(x, nn.Parameter)`` reads ``_is_param`` so): each call compares them.  A
    value that is no plain literal is refused, and so is fn setting or deleting an attribute
    of a tensor argument, which eager would change on the caller's tensor.
    """

    _tracing = threading.local()  # .current: the _TensorAttributes of this thread's trace

    def __init__(self, named: list):
        """``named``: (graph input index, path, the caller's tensor, its stand-ins in the trace)."""
        self._of = {id(held): (index, path, caller) for index, path, caller, held_by_fn in named for held in held_by_fn}
        self._stand_ins = [(path, held) for _, path, _, held_by_fn in named for held in held_by_fn]
        self.read: dict = {}  # (graph input index, name) -> value_literal

    def __enter__(self) -> "_TensorAttributes":
        self._before = [(path, held, dict(vars(held))) for path, held in self._stand_ins]
        self._tracing.current = self
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self._tracing.current = None
        if exc_type is not None:
            return
        for path, held, before in self._before:
            now = vars(held)
            changed = sorted(
                name for name in before.keys() | now.keys() if before.get(name, _ABSENT) is not now.get(name, _ABSENT)
            )
            if changed:
                raise _attribute_change_error(path, changed[0])

    def missing(tensor: torch.Tensor, name: str) -> Any:  # a plain function: Tensor.__getattr__
        reads = getattr(_TensorAttributes._tracing, "current", None)
        entry = _TensorAttributes._traced_argument(tensor)
        if entry is None:
            raise AttributeError(f"{type(tensor).__name__!r} object has no attribute {name!r}", name=name, obj=tensor)
        index, path, caller = entry
        value = getattr(caller, name, schema.MISSING)
        try:
            reads.read[(index, name)] = schema.value_literal(value)
        except TypeError:
            raise PrecompileError(
                f"fn reads {path}.{name}, a {type(value).__name__}: a Python attribute of a tensor argument is "
                "checked at every call as a plain value (a bool, number, str, None, dtype, or a tuple, list or "
                "dict of them); pass this one as an argument instead"
            ) from None
        if value is schema.MISSING:
            raise AttributeError(f"{type(caller).__name__!r} object has no attribute {name!r}", name=name, obj=tensor)
        return value

    @staticmethod
    def _traced_argument(tensor: torch.Tensor) -> tuple | None:
        """(graph input index, path, the caller's tensor) of a stand-in this thread's trace holds, else None."""
        reads = getattr(_TensorAttributes._tracing, "current", None)
        return None if reads is None else reads._of.get(id(tensor))

    @staticmethod
    def deleting(delete: Callable) -> Callable:
        """``Tensor.__delattr__`` during capture: deleting the caller's attribute, which the stand-in
        does not carry, refused as setting one is (rather than the stand-in's AttributeError)."""

        def refusing_delete(tensor: torch.Tensor, name: str) -> None:
            entry = _TensorAttributes._traced_argument(tensor)
            if entry is not None and name not in vars(tensor) and hasattr(entry[2], name):
                raise _attribute_change_error(entry[1], name)
            delete(tensor, name)

        return refusing_delete

    def recorded(self) -> tuple:
        return tuple((index, name, literal) for (index, name), literal in sorted(self.read.items()))


def _attribute_change_error(path: str, name: str) -> PrecompileError:
    return PrecompileError(
        f"fn sets or deletes {path}.{name}, a Python attribute of a tensor argument: eager's call changes "
        "that on the caller's tensor, which no call of the artifact repeats. Change it outside fn, before "
        "precompile and the calls"
    )


class _Change(NamedTuple):
    """A difference in a module's Python state: an attribute (``container`` None) or an entry of
    one of nn.Module's containers (hook dicts, children, ...); ``old``/``new`` MISSING where absent."""

    path: str
    container: str | None
    key: Any
    old: Any
    new: Any


class _ModuleState:
    """One module's Python state at a point of capture: its ``__dict__``, and the contents of the
    containers nn.Module keeps there (parameters, buffers, children, hook dicts)."""

    def __init__(self, path: str, module: torch.nn.Module):
        self.path = path
        # vars(), not getattr: the read probe takes reading a hook dict for fn calling the module.
        self.values = vars(module)
        self.before = dict(self.values)
        self.contents = {name: copy.copy(self.values[name]) for name in compat.module_containers() if name in self.values}

    def diff(self, caller_tensors: dict) -> list[_Change]:
        """What differs now: attributes, and the entries of containers that hold parameters, buffers,
        children or hooks (the bookkeeping kept beside them changes with them).  ``caller_tensors``:
        id(a tensor the trace put in a module) -> the caller's, which a value may hold instead."""
        changes = []
        for name in sorted(self.before.keys() | self.values.keys()):
            old, new = self.before.get(name, schema.MISSING), self.values.get(name, schema.MISSING)
            if old is not new and not _equal_values(old, new, caller_tensors):
                changes.append(_Change(self.path, None, name, old, new))
        for name, old in self.contents.items():
            new = self.values.get(name)
            if not compat.module_containers()[name] or not isinstance(new, dict):
                continue
            for key in _changed_keys(old, new):
                changes.append(_Change(self.path, name, key, old.get(key, schema.MISSING), new.get(key, schema.MISSING)))
        return changes

    def tensors(self) -> dict:
        """The parameters and buffers the module holds itself, by container and name."""
        return {
            (name, key): tensor
            for name, kind in compat.module_containers().items()
            if kind in ("parameter", "buffer") and name in self.contents
            for key, tensor in self.contents[name].items()
        }

    def restore(self) -> None:
        """Put the module back as it was, writing only what differs (the driver watches these
        dicts' versions: an unchanged one stays valid)."""
        _restore_entries(self.values, self.before)
        for name, old in self.contents.items():
            container = self.values[name]
            if not _same_entries(container, old):
                container.clear()
                container.update(old)


def _restore_entries(values: dict, before: dict) -> None:
    """Make ``values`` (an object's ``__dict__``) hold ``before``'s entries, writing only what differs."""
    for name in [name for name in values if name not in before]:
        del values[name]
    for name, old in before.items():
        if values.get(name, schema.MISSING) is not old:
            values[name] = old


def _same_entries(container: Any, old: Any) -> bool:
    """Whether a dict holds the same entries, by identity and in order, as ``old`` (a set: the same members)."""
    if not isinstance(container, dict):
        return container == old
    return len(container) == len(old) and all(k == j and v is w for (k, v), (j, w) in zip(container.items(), old.items()))


def _changed_keys(before: dict, after: dict) -> list:
    """The keys added, removed or rebound between two states of one dict, ``before``'s order first."""
    keys = [*before, *(k for k in after if k not in before)]
    return [k for k in keys if before.get(k, schema.MISSING) is not after.get(k, schema.MISSING)]


def _equal_values(old: Any, new: Any, caller_tensors: dict) -> bool:
    """Whether an attribute fn rebound holds what it held: an equal plain value (``self.shape = (2, 3)``
    again), or a list or tuple of the same objects or weak references to them, where the trace's
    stand-in for a module's tensor counts as the caller's tensor (an RNN module's forward rebuilds
    ``_flat_weights`` from the weights it holds: in the trace, the stand-ins)."""
    if isinstance(new, torch.Tensor):
        return caller_tensors.get(id(new)) is old
    if type(old) is not type(new):
        return False
    if type(old) in (list, tuple):
        return len(old) == len(new) and all(a is b or _equal_values(a, b, caller_tensors) for a, b in zip(old, new))
    if type(old) is weakref.ref:
        return old() is not None and _equal_values(old(), new(), caller_tensors)
    literal = _value_literal_or_missing(old)
    return literal is not schema.MISSING and literal == _value_literal_or_missing(new)


def _module_states(args: _Arguments) -> list[_ModuleState]:
    """A state of each submodule of the module arguments (one a submodule two arguments share)."""
    states: dict[int, _ModuleState] = {}
    for path, sub in runtime.named_submodules(args.module_positions, args.modules):
        if id(sub) not in states:
            states[id(sub)] = _ModuleState(path, sub)
    return list(states.values())


class _KeptModules:
    """Invariant 8: the module arguments' Python state as it was before capture, restored on every
    exit of capture, refused or not, and before each trace, so that each trace starts where an
    eager call would: whatever fn or the trace changed -- attributes set, rebound or deleted,
    hooks, children, parameters or buffers registered or removed (transformers' output capturing
    registers hooks and sets a flag at the first call asking for hidden states) -- does not stay
    on the caller's model."""

    def __init__(self, args: _Arguments):
        self.args = args
        self.states = _module_states(args)
        self.objects: dict[int, tuple[str, dict, dict]] = {}  # id -> (path, a plain object's __dict__, its entries)

    def keep_object(self, path: str, obj: Any) -> None:
        """Also keep a plain object fn reached through its modules (a config, at ``path``), as it is
        now: before fn's first read of it, so a default fn fills in (``config.problem_type``) does not stay."""
        if id(obj) not in self.objects:
            values = object.__getattribute__(obj, "__dict__")
            self.objects[id(obj)] = (path, values, dict(values))

    def object_changes(self) -> list:
        """What differs in the plain objects kept: attributes set, rebound or deleted."""
        return [
            _Change(path, None, name, before.get(name, schema.MISSING), values.get(name, schema.MISSING))
            for path, values, before in self.objects.values()
            for name in _changed_keys(before, values)
            if not _equal_values(before.get(name, schema.MISSING), values.get(name, schema.MISSING), {})
        ]

    def restore(self) -> None:
        for state in self.states:
            state.restore()
        for _, values, before in self.objects.values():
            _restore_entries(values, before)

    def caller_tensors(self, traced: list) -> dict:
        """id(each tensor the modules hold in ``traced``, states taken during a trace) -> the caller's there."""
        found = {}
        for state, caller in zip(traced, self.states, strict=True):
            theirs = caller.tensors()
            found.update((id(tensor), theirs[key]) for key, tensor in state.tensors().items() if key in theirs)
        return found


@contextlib.contextmanager
def _modules_kept(args: _Arguments):
    kept = _KeptModules(args)
    try:
        yield kept
    finally:
        kept.restore()


@contextlib.contextmanager
def _module_changes_noted(kept: _KeptModules, recorded: dict):
    """What fn itself changes of its modules' Python state while traced, as ``recorded["module_changes"]``
    (refused once the trace's other checks passed: _refuse_module_changes).

    A tensor stored in a plain module attribute (``self.cached = y * 2``, as torchvision's RAFT
    keeps its correlation pyramid) is refused at once (invariant 5): the attribute would keep
    the trace's tensor and no call would update it.
    """
    states = _module_states(kept.args)
    yield
    caller_tensors = kept.caller_tensors(states)
    changes = [change for state in states for change in state.diff(caller_tensors)] + kept.object_changes()
    stored = [change for change in changes if change.container is None and isinstance(change.new, torch.Tensor)]
    if stored:
        raise PrecompileError(
            f"fn stores a tensor in {stored[0].path}.{stored[0].key}, a plain attribute (not a parameter or buffer): "
            "the artifact would leave the attribute as it was, so after a call it would differ from eager's. "
            "Register it as a buffer (self.register_buffer(name, tensor, persistent=False)) and update it "
            "in place, or return the tensor from fn instead of storing it"
        )
    recorded["module_changes"] = changes


def _refuse_module_changes(changes: list) -> None:
    """A change fn makes to its modules that no other check refused (a value fn read and changed is
    refused naming what it read): eager's call leaves it on the model, the artifact's would not."""
    if not changes:
        return
    described = list(map(_describe_change, changes))
    listed = "; ".join(described[:3]) + (f"; and {len(described) - 3} more" if len(described) > 3 else "")
    raise PrecompileError(
        f"fn changes the modules it receives beyond their tensors' values: it {listed}. Eager's call "
        "leaves that on the model, the artifact's calls would not (capture restored the modules as they "
        "were). Keep fn from making these changes: set such an attribute before precompile, outside fn; "
        "a hook cannot be precompiled (remove what registers it, or call fn eagerly)"
    )


def _describe_change(change: _Change) -> str:
    """``sets args[0].flag to True``, ``registers a forward hook on args[0].lin (module.hook)``, ..."""
    where = f"{change.path}.{change.key}"
    if change.container is None:
        if change.new is schema.MISSING:
            return f"deletes {where}"
        if change.old is schema.MISSING:
            return f"sets {where} to {_short_repr(change.new)}"
        return f"changes {where} (from {_short_repr(change.old)} to {_short_repr(change.new)})"
    verb = "registers" if change.old is schema.MISSING else "removes" if change.new is schema.MISSING else "replaces"
    kind = compat.module_containers()[change.container]
    if kind in ("parameter", "buffer", "submodule"):
        return f"{verb} {kind} {where}"
    hook = change.old if change.new is schema.MISSING else change.new
    return f"{verb} a {kind} on {change.path} ({runtime.hook_name(hook)})"


def _short_repr(value: Any) -> str:
    try:
        return reprlib.repr(value)
    except Exception:  # noqa: BLE001  a repr that fails: the type names the value
        return _describe_type(value)


def _check_state_not_rebound(modules: list, mappings: list) -> None:
    # Invariant 5: state updates must be in-place; rebinding an attribute
    # (`self.buf = new`) would be lost when the runnable is called.
    for index, (module, mapping) in enumerate(zip(modules, mappings)):
        for fqn, leaf in mapping.items():
            owner_path, _, name = fqn.rpartition(".")
            owner = module.get_submodule(owner_path)
            if getattr(owner, name, None) is not leaf:
                raise PrecompileError(
                    f"fn rebinds {type(module).__name__} attribute '{fqn}' (module argument {index}) "
                    "instead of updating it in place; the artifact cannot reproduce that: "
                    "write `x.copy_(new)` (or `x.add_(...)`) instead of `self.x = new`"
                )


def _check_gradients_reach_only_parameters(args: _Arguments, state: tuple, tensors: tuple) -> None:
    # Invariant 4: only parameters receive gradients from the runnable.
    for entry, leaf in zip(args.lifted, state):
        if entry.kind == "buffer" and leaf.grad is not None:
            raise PrecompileError(
                f"buffer '{entry.names[0][1]}' would receive a gradient; precompile only "
                "accumulates gradients of parameters: make it an nn.Parameter or set "
                "requires_grad=False on the buffer"
            )
    for index, tensor in zip(args.tensor_indices, tensors):
        if tensor.grad is not None:
            raise PrecompileError(
                f"{args.input_paths[index]} would receive a gradient; precompile only accumulates "
                "gradients of module parameters: pass the input with requires_grad=False "
                "(e.g. x.detach()) or make it a parameter of a module argument"
            )


def _refuse_grads_with_history(args: _Arguments, state: tuple, grad_state: list) -> None:
    # Invariant 13: the runnable writes each .grad as a plain tensor, the graph holds the backward.
    for index in grad_state:
        if state[index].grad.requires_grad:
            module_index, fqn = args.lifted[index].names[0]
            raise PrecompileError(
                f"args[{args.module_positions[module_index]}].{fqn}.grad has autograd history after fn "
                "(backward(create_graph=True)), which the artifact's .grad would not have: a later backward "
                "through it runs in eager and fails on the artifact's. Take higher-order gradients inside fn "
                "(torch.autograd.grad(..., create_graph=True)), or leave create_graph off"
            )


def _refuse_grad_dtypes(args: _Arguments, grad_state: list) -> None:
    """Refuse a parameter fn gives a gradient whose ``grad_dtype`` (torch 2.11+) is not its dtype:
    eager's AccumulateGrad casts the gradient to it, the trace's stand-ins have none."""
    for index in grad_state:
        param = _caller_parameter(args.lifted[index])
        grad_dtype = runtime.other_grad_dtype(param)
        if grad_dtype is not None:
            module_index, fqn = args.lifted[index].names[0]
            raise PrecompileError(
                f"args[{args.module_positions[module_index]}].{fqn} has grad_dtype {grad_dtype}, not its dtype "
                f"{param.dtype}: eager's backward casts its gradient to {grad_dtype}, which precompile does not "
                f"support (the graph computes it in {param.dtype}). Set p.grad_dtype = p.dtype (or None) "
                "before precompile and at its calls, or call fn eagerly"
            )


# ---------------------------------------------------------------------------
# Optimizers as arguments (Note invariant 11): lifted like modules.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _LiftedOptimizer:
    position: int
    optimizer: torch.optim.Optimizer
    cls: str  # key of schema.OPTIMIZER_STATE_KEYS
    groups: list  # per param group: indices into args.lifted
    hyper: list  # per param group: [(key, value)], every entry but params, lr and the lifted ones
    keys: tuple  # state keys of one stepped parameter
    state: list  # per (group, param): {key: example tensor} (a clone, or eager's initial state)
    lifted: tuple = ()  # hyperparameters lifted like lr, per group after it ("momentum", "betas[0]")
    # Per param group: the keys the artifact checks, so bakes (of hyper): those capture decides
    # from, and those read while fn was traced, by fn or torch's step (_GroupProbe adds them).
    read: list = dataclasses.field(default_factory=list)

    @property
    def num_group_inputs(self) -> int:
        return len(self.groups) * (1 + len(self.lifted))


_SUPPORTED_OPTIMIZERS = {cls.__name__: cls for cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)}
# Options whose step the trace cannot reproduce; the value is why.
_REFUSED_OPTIONS = {
    "fused": "the fused kernel's rounding differs from the traced step; pass fused=False (backend "
    "'inductor' fuses the update itself)",
    "capturable": "it is for CUDA graphs and eager refuses it on CPU; pass capturable=False (precompile "
    "traces the capturable formulation itself)",
    "differentiable": "a step that builds autograd history cannot be part of the graph; pass differentiable=False",
}
# The group keys _lift_optimizer decides from (refusals, state keys, lifted hyperparameters):
# checked at every call even where the traced step does not read them (SGD's step reads
# differentiable from opt.defaults).
_DECIDED_AT_CAPTURE = (*_REFUSED_OPTIONS, "dampening", "momentum", "nesterov", "amsgrad")


def _lift_optimizer(position: int, optimizer: Any, lifted: list) -> _LiftedOptimizer:
    where = f"args[{position}] (optimizer)"
    cls = type(optimizer).__name__
    if _SUPPORTED_OPTIMIZERS.get(cls) is not type(optimizer):
        raise PrecompileError(
            f"{where}: {type(optimizer).__qualname__} is not supported inside fn (supported: "
            f"{', '.join('torch.optim.' + c for c in _SUPPORTED_OPTIMIZERS)}); keep opt.step() outside "
            "fn and precompile the forward/backward step only"
        )
    if compat.optimizer_has_step_hooks(optimizer):
        raise PrecompileError(f"{where}: step hooks are registered, which the artifact would not run; remove them")
    shadowed = runtime.optimizer_methods_set_on_instance(optimizer)
    if shadowed is not None:
        raise PrecompileError(
            f"{where}: {shadowed}; no call could check it is the same: remove it before precompile "
            "and do its work in fn"
        )
    # A fully_shard parameter's step updates its local shard (Note invariant 17).
    parameter_index = {id(e.param if e.sharded else e.tensor): i for i, e in enumerate(lifted) if e.kind == "parameter"}
    cycled = {_cycled_hyperparameters(cls, group) for group in optimizer.param_groups}
    cycled = cycled.pop() if len(cycled) == 1 else ()  # groups that disagree: all baked
    groups, hyper, state, keys, seen = [], [], [], None, {}
    for g, group in enumerate(optimizer.param_groups):
        _check_optimizer_group(where, g, cls, group)
        group_keys = runtime.optimizer_state_keys(cls, group)
        if keys not in (None, group_keys):
            raise PrecompileError(
                f"{where} param_groups[{g}]: its state keys {list(group_keys)} differ from group 0's "
                f"{list(keys)} (momentum / amsgrad per group); use the same options in every group"
            )
        keys = group_keys
        indices = []
        for j, param in enumerate(group["params"]):
            if id(param) not in parameter_index:
                raise PrecompileError(
                    f"{where} param_groups[{g}]['params'][{j}] (shape {tuple(param.shape)}) is not a "
                    "parameter of any module argument of fn; the artifact can only update lifted "
                    "parameters: pass the module that owns it as an argument"
                )
            index = parameter_index[id(param)]
            if cls != "SGD" and lifted[index].tensor.dtype == torch.float16:
                raise PrecompileError(
                    f"{where} param_groups[{g}]['params'][{j}] is float16: precompile traces {cls}'s capturable "
                    "step, whose sqrt(exp_avg_sq) / (lr * bias corrections) overflows float16 at common learning "
                    "rates (an element with |grad| above ~6 at lr 1e-5 would not move, where eager's step moves "
                    "it); keep float32 parameters (torch.autocast for float16 compute) or opt.step() outside fn"
                )
            if index in seen:
                raise PrecompileError(
                    f"{where} param_groups[{g}]['params'][{j}] is param_groups{seen[index]} again (shape "
                    f"{tuple(param.shape)}); eager's step updates it once per occurrence through one state, the "
                    "artifact would give each its own: build the optimizer with each parameter once"
                )
            seen[index] = f"[{g}]['params'][{j}]"
            indices.append(index)
            state.append(_example_optimizer_state(where, g, j, keys, optimizer.state.get(param), lifted[index].tensor))
        groups.append(indices)
        hyper.append(_baked_hyperparameters(group, cycled))
    read = [set(_DECIDED_AT_CAPTURE) for _ in groups]
    return _LiftedOptimizer(position, optimizer, cls, groups, hyper, keys or (), state, cycled, read)


def _cycled_hyperparameters(cls: str, group: dict) -> tuple:
    """What OneCycleLR / CyclicLR cycle besides lr, where the step's math takes it as a tensor.

    SGD's momentum, unless it is 0 (eager keeps no buffer then) or nesterov
    (it is ``add``'s ``alpha=``, which must be a number); Adam's and AdamW's
    ``betas[0]`` (traced with the single-tensor step; ``betas[1]`` stays baked).
    """
    if cls == "SGD":
        return ("momentum",) if group["momentum"] != 0 and not group["nesterov"] else ()
    return ("betas[0]",)


def _graph_input_keys(lifted: tuple) -> dict:
    """The group keys whose values are graph inputs, each to the input it holds: ``lr``, and
    each lifted hyperparameter's key (``"betas"`` -> ``"betas[0]"``: the rest of the tuple
    stays baked; LIFTED_HYPERPARAMETERS lifts one element of a tuple at most).  The one
    source for what the artifact bakes and what fn's own code may not read (_GroupProbe)."""
    return {"lr": "lr", **{key.partition("[")[0]: key for key in lifted}}


def _baked_hyperparameters(group: dict, lifted: tuple) -> list:
    """(key, value) of the group's entries the artifact may bake: all but params and the graph inputs.

    Keys beyond the optimizer's defaults too: fn may read one (a loss scale kept in the group).
    The spec keeps those the trace read (_LiftedOptimizer.read).
    """
    graph_inputs = _graph_input_keys(lifted)
    baked = []
    for key in sorted(k for k in group if k != "params"):
        held = graph_inputs.get(key)
        if held is None:
            baked.append((key, group[key]))
        elif held != key:  # betas: the rest of the tuple stays baked
            baked += [(f"{key}[{i}]", value) for i, value in enumerate(group[key]) if f"{key}[{i}]" != held]
    return baked


def _check_optimizer_group(where: str, g: int, cls: str, group: dict) -> None:
    for key, why in _REFUSED_OPTIONS.items():
        if group.get(key):
            raise PrecompileError(f"{where} param_groups[{g}][{key!r}]=True is not supported: {why}")
    if cls == "SGD" and group["dampening"] != 0:
        raise PrecompileError(
            f"{where} param_groups[{g}]['dampening']={group['dampening']} is not supported: eager's first "
            "step initializes the momentum buffer without dampening, which one graph cannot reproduce; "
            "use dampening=0 or keep opt.step() outside fn"
        )
    for key, value in group.items():
        if key != "params" and isinstance(value, torch.Tensor):
            raise PrecompileError(
                f"{where} param_groups[{g}][{key!r}] is a Tensor; pass a Python float (lr becomes a graph "
                "input; other hyperparameters are baked)"
            )
        if key == "param_names" and isinstance(value, list):
            raise PrecompileError(
                f"{where} param_groups[{g}] has 'param_names': an optimizer built from named_parameters() is "
                "not supported inside fn yet; build it from model.parameters() (the names are not used by the step)"
            )
        if key != "params" and not isinstance(value, (*schema.LEAF_VALUE_TYPES, tuple)):
            raise PrecompileError(
                f"{where} param_groups[{g}][{key!r}]: unsupported value {value!r}; use a Python float, int, "
                "bool, str or None (float(value) for a numpy scalar)"
            )


def _example_optimizer_state(where: str, g: int, j: int, keys: tuple, existing: Any, param: torch.Tensor) -> dict:
    """Clones of the caller's state, or eager's initial state before the first step."""
    if not existing:
        return runtime.initial_optimizer_state(keys, param)
    if set(existing) != set(keys):
        raise PrecompileError(
            f"{where} state of param_groups[{g}]['params'][{j}] has keys {sorted(existing)}, expected "
            f"{sorted(keys)}: it does not belong to this optimizer's options"
        )
    return {key: _clone_leaf(runtime.local_shard_of(existing[key])) for key in keys}


def _trailing_example_inputs(args: _Arguments) -> list:
    """Flat graph inputs after the sizes: per optimizer lrs then state; then incoming grads."""
    inputs = []
    for lifted in args.optimizers:
        # float64 like eager's Python float; requires_grad steers SGD onto its
        # tensor-lr path (addcmul) instead of reading lr as a number.
        for group in lifted.optimizer.param_groups:
            inputs.append(torch.tensor(group["lr"], dtype=torch.float64, requires_grad=True))
            inputs += [torch.tensor(runtime.hyperparameter(group, key), dtype=torch.float64) for key in lifted.lifted]
        inputs += [tensor for entry in lifted.state for tensor in entry.values()]
    # Incoming grads: empty, not zeros, so a fn that never touches .grad (a
    # forward) costs no resident memory (untouched pages); values are not read.
    return inputs + [torch.empty_like(args.lifted[i].tensor) for i in _grad_candidates(args)]


def _grad_candidates(args: _Arguments) -> list:
    return [i for i, e in enumerate(args.lifted) if e.kind == "parameter" and e.tensor.requires_grad]


def _grads_fn_tells_from_none(graph: torch.fx.GraphModule, args: _Arguments, recorded: dict, num_sizes: int) -> tuple:
    """The parameters whose ``.grad`` must stay None at every call, and those whose must stay a tensor (Note invariant 13).

    fn is traced with each incoming ``.grad`` a tensor, which is what eager
    computes with wherever backward adds to it (None + g is 0 + g).  Where
    the graph uses the incoming ``.grad`` of a parameter backward never
    reached, eager tells None from a tensor: ``opt.step()`` skips the
    parameter, ``zero_grad(set_to_none=False)`` and ``clip_grad_norm_``
    leave it None.  Those parameters keep what their ``.grad`` was at
    capture (the None ones are traced again with ``.grad`` None).
    """
    position = len(args.lifted) + len(args.tensor_indices) + num_sizes + _num_optimizer_inputs(args)
    incoming = list(graph.graph.find_nodes(op="placeholder"))[position:]
    results = list(graph.graph.output_node().args[0])
    grad_slots = dict(zip(recorded["grad_state"], range(len(results) - len(recorded["grad_state"]), len(results))))

    def used(index: int, node: torch.fx.Node) -> bool:  # beyond being returned as its own, untouched .grad
        untouched = index in grad_slots and results[grad_slots[index]] is node
        return any(user.op != "output" for user in node.users) or results.count(node) > untouched

    unreached = set(recorded["grads_unreached"])
    observed = [i for i, node in zip(_grad_candidates(args), incoming) if i in unreached and used(i, node)]
    none = tuple(i for i in observed if args.lifted[i].tensor.grad is None)
    return none, tuple(i for i in observed if i not in none)


def _frozen_in_optimizers(args: _Arguments) -> tuple:
    """The parameters an optimizer inside fn holds that do not require grad: their ``.grad`` must stay None.

    The trace never gives them a gradient, and eager's step would use a
    leftover ``.grad`` (Note invariant 13): one at capture is refused.
    """
    held = {i for lifted in args.optimizers for group in lifted.groups for i in group}
    frozen = tuple(sorted(held - set(_grad_candidates(args))))
    named = _named_state(args.module_positions, args.lifted)
    for i in frozen:
        if _caller_parameter(args.lifted[i]).grad is not None:
            raise PrecompileError(
                f"{named[i][0]} does not require grad but has a .grad, which eager's step of the optimizer "
                "inside fn would use: set that .grad to None before precompile and calls (or requires_grad_(True))"
            )
    return frozen


def _requires_grad_read(reads: dict, tensors: tuple, whole: dict) -> tuple:
    """The tensor graph inputs (state, then fn's tensors) whose ``requires_grad`` fn read.

    An intermediate's answer follows grad mode and the arguments': a read of
    one notes grad mode as read and gives every tensor graph input.
    """
    read = reads.pop("requires_grad", {})
    index_of = {id(t): k for k, t in enumerate(tensors)}
    index_of.update((id(held), k) for k, held in whole.items())  # what fn's modules hold for a lifted tensor
    if all(key in index_of for key in read):
        return tuple(sorted({index_of[key] for key in read}))
    line = next(where for key, where in read.items() if key not in index_of)
    reads.setdefault("is_grad_enabled", line or " (in torch)")
    return tuple(range(len(tensors)))


def _caller_parameter(entry: Any) -> torch.Tensor:
    """The parameter the caller's module holds for a lifted entry: a sharded one's DTensor, else the tensor."""
    return entry.param if entry.sharded is not None else entry.tensor


def _num_optimizer_inputs(args: _Arguments) -> int:
    return sum(lifted.num_group_inputs + sum(len(entry) for entry in lifted.state) for lifted in args.optimizers)


@contextlib.contextmanager
def _redirect_optimizers(args: _Arguments, state: tuple, inputs: tuple):
    """While fn runs, point each optimizer at the traced leaves and inputs; restore after.

    Each param group is swapped for a _GroupProbe holding the traced values
    (the caller's dicts stay as they were), and the optimizer's class for one
    refusing fn's own code what the artifact cannot check (_optimizer_probe).
    Adam/AdamW trace their ``capturable`` formulation (step, lr and bias
    corrections as tensor ops, not Python numbers baked into the graph), with
    ``torch.compiler.is_compiling()`` true during ``step()`` like under
    torch.compile, so no tensor is read back as a number; around it
    _keep_parameters_at_lr_zero makes a step at lr 0 eager's.
    """
    inputs = iter(inputs)
    saved, handles, swapped = [], [], []
    compiling = compat.compiling_flag()
    try:
        for lifted in args.optimizers:
            optimizer = lifted.optimizer
            caller = _CallerOptimizer(optimizer, f"args[{lifted.position}]")
            saved.append(caller)
            traced_groups = []
            for g, (group, indices) in enumerate(zip(caller.groups, lifted.groups)):
                traced = dict(group, params=[state[i] for i in indices], lr=next(inputs))
                traced_groups.append(traced)
                for key in lifted.lifted:
                    swapped.append(_set_lifted_hyperparameter(traced, key, next(inputs)))
                if lifted.cls != "SGD":
                    traced["capturable"] = True
                where = f"{caller.where}.param_groups[{g}]"
                caller.traced.append(_GroupProbe(traced, group, where, lifted.lifted, lifted.read[g]))
            optimizer.param_groups[:] = caller.traced
            traced_state = collections.defaultdict(dict)
            for group in caller.traced:
                for leaf in group["params"]:
                    traced_state[leaf] = {key: next(inputs) for key in lifted.keys}
            optimizer.state = traced_state
            handles.append(optimizer.register_step_pre_hook(lambda *_: _set_compiling(True)))
            handles.append(optimizer.register_step_post_hook(lambda *_: _set_compiling(compiling)))
            if lifted.cls != "SGD":
                handles += _keep_parameters_at_lr_zero(optimizer, traced_groups)  # not the probes: no read
            optimizer.__class__ = _optimizer_probe(caller.cls, caller.where)
        yield
        for caller in saved:
            caller.refuse_changes()
    finally:
        compat.set_compiling_flag(compiling)
        for handle in handles:
            handle.remove()
        for tensor in swapped:
            tensor.__class__ = torch.Tensor
        for caller in saved:
            caller.restore()


def _keep_parameters_at_lr_zero(optimizer: torch.optim.Optimizer, groups: list) -> list:
    """Hooks around each traced Adam/AdamW step that give a group at lr 0 eager's parameters.

    The capturable step divides by lr: its ``denom`` is ``(sqrt(v) / bc2 + eps) / -lr'``
    (``lr' = lr / bc1``), so at lr 0 -- the first step of a warmup from 0 -- denom is
    -inf and the update ``exp_avg / denom`` a zero, as eager's ``-0 * exp_avg / denom``,
    except where ``v`` (amsgrad: its running max) is 0: there the trace's 0/0 makes
    the element NaN, where eager leaves it as it was unless ``exp_avg`` is not finite.
    After the step, those elements get their value from before it back.  AdamW's
    decoupled decay multiplies by ``1 - 0 * wd``, which changes nothing.  Returns the
    hooks' handles.
    """
    stepped: list = []  # per group: (parameter, its value before the step) for those with a .grad

    def keep(*_):
        with torch.no_grad():
            stepped[:] = [[(p, p.clone()) for p in group["params"] if p.grad is not None] for group in groups]

    def put_back(*_):
        with torch.no_grad():
            for group, pairs in zip(groups, stepped):
                at_lr_zero = group["lr"] == 0
                for p, old in pairs:
                    state = optimizer.state[p]
                    moment, exp_avg = state.get("max_exp_avg_sq", state["exp_avg_sq"]), state["exp_avg"]
                    # At lr 0, v + exp_avg * lr is 0 where v is 0 and exp_avg finite (NaN where it is not).
                    nan_in_trace_only = at_lr_zero & (_real(moment).addcmul(_real(exp_avg), group["lr"]) == 0)
                    _real(p).copy_(torch.where(nan_in_trace_only, _real(old), _real(p)))
        stepped.clear()

    return [optimizer.register_step_pre_hook(keep), optimizer.register_step_post_hook(put_back)]


def _real(tensor: torch.Tensor) -> torch.Tensor:
    """A complex tensor as torch's Adam steps it: (real, imaginary) pairs."""
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


class _CallerOptimizer:
    """An optimizer argument as the caller has it, while fn runs on traced groups and state."""

    def __init__(self, optimizer: torch.optim.Optimizer, where: str):
        self.optimizer, self.where, self.cls, self.state = optimizer, where, type(optimizer), optimizer.state
        self.groups = list(optimizer.param_groups)
        self.before = [dict(group) for group in self.groups]
        self.traced: list = []  # the _GroupProbes fn sees, one per group

    def refuse_changes(self) -> None:
        """After fn: groups added, removed or replaced, or a caller's group written through
        another reference (a closure or global) than opt.param_groups."""
        now = self.optimizer.param_groups
        if len(now) != len(self.traced) or any(map(operator.is_not, now, self.traced)):
            raise PrecompileError(
                f"fn changes the list {self.where}.param_groups (adds, removes or replaces a group); the "
                "artifact would not do that: change the optimizer's groups outside fn and precompile again"
            )
        for g, (group, original) in enumerate(zip(self.groups, self.before)):
            changed = _changed_keys(original, group)
            if changed:
                raise PrecompileError(
                    f"fn writes {self.where}.param_groups[{g}][{changed[0]!r}] through another reference than "
                    f"{self.where}.param_groups (a closure or global); the artifact never writes the group: "
                    "set it outside fn, e.g. with an LR scheduler stepped between calls"
                )

    def restore(self) -> None:
        self.optimizer.__class__ = self.cls
        self.optimizer.state = self.state
        self.optimizer.param_groups[:] = self.groups
        for group, original in zip(self.groups, self.before):  # undo writes through another reference
            group.clear()
            group.update(original)


def _caller_is_fn() -> bool:
    """Whether the caller of the function that asks is fn's own code (not torch's, not precompile's)."""
    return _is_user_file(sys._getframe(2).f_code.co_filename)


class _GroupProbe(dict):
    """A param group of an optimizer argument while fn is traced (Note invariant 15).

    The artifact steps with the group's values as each call finds them and
    never writes the group, so a write by any code (``g["lr"] *= 0.5``) is
    refused before it happens.  It checks at every call the values of the keys
    read here, by any code (all of them where its key set is read), and of
    those capture decides from, not which keys the group has: an LR
    scheduler's ``initial_lr``, which the step never reads, may be absent or
    other at a call.  So fn's own code may not look up a key the group lacks
    (``g.get("loss_scale", 1.0)``) or read its key set (iteration, ``len``,
    copies); nor read a key whose traced value is not the caller's
    (``capturable``, ``foreach``, set for the trace), nor ``lr`` or a lifted
    hyperparameter (a graph input the call reads for the step, not the Python
    float eager's fn computes with).  torch's step reads only keys the
    optimizer's constructor fills in.  Each refusal names fn's line.
    """

    __slots__ = ("where", "traced_only", "graph_inputs", "read")

    def __init__(self, traced: dict, caller: dict, where: str, lifted: tuple, read: set):
        super().__init__(traced)
        self.where, self.read = where, read  # read: the keys the artifact checks (_LiftedOptimizer.read)
        self.graph_inputs = _graph_input_keys(lifted)  # key -> the graph input it holds ("betas" -> "betas[0]")
        kept = ("params", *self.graph_inputs)
        self.traced_only = {k: caller.get(k) for k in traced if k not in kept and traced[k] is not caller.get(k)}

    def refuse_write(self, what: str) -> None:
        raise PrecompileError(
            f"fn writes {self.where}{what}{_user_line(traceback.extract_stack())}: the artifact steps with "
            "the group's values as each call finds them and never writes the group, so the change would "
            "not happen; set it outside fn, e.g. with an LR scheduler stepped between calls"
        )

    def refuse_unchecked_read(self, key: Any) -> None:
        """For a read of ``key`` by fn's own code: refused where no call would check its answer."""
        if not dict.__contains__(self, key):
            self.refuse_absent(key)
        if key in self.traced_only:
            self.refuse_traced_only(key)
        if key in self.graph_inputs:
            self.refuse_graph_input(key)

    def refuse_absent(self, key: Any) -> None:
        raise PrecompileError(
            f"fn reads {self.where}[{key!r}]{_user_line(traceback.extract_stack())}, a key the group does not "
            "have: the artifact checks at every call the values of the keys read at capture, so the key added "
            "later would go unseen; put it in the group before precompile (e.g. in the optimizer's constructor), "
            "or pass the value as an argument of fn"
        )

    def refuse_key_set(self, how: str) -> None:
        raise PrecompileError(
            f"fn reads the keys of {self.where} ({how}){_user_line(traceback.extract_stack())}: the artifact "
            "checks at every call the values of the keys fn reads by name, not which keys the group has (an "
            "LR scheduler adds 'initial_lr'); read the keys fn needs by name"
        )

    def refuse_traced_only(self, key: Any) -> None:
        raise PrecompileError(
            f"fn reads {self.where}[{key!r}]{_user_line(traceback.extract_stack())}: precompile sets it to "
            f"{dict.__getitem__(self, key)!r} while it traces the step (the caller's is {self.traced_only[key]!r}); "
            "compute without it"
        )

    def refuse_graph_input(self, key: Any) -> None:
        held = "" if self.graph_inputs[key] == key else f" ({self.graph_inputs[key]} of it)"
        raise PrecompileError(
            f"fn reads {self.where}[{key!r}]{_user_line(traceback.extract_stack())}: the artifact reads "
            f"it{held} from the optimizer at every call as an input of the optimizer's step, so fn's own use "
            "of it would be traced as a tensor where eager's fn has a Python float (results of another type "
            "or dtype), or baked; read it outside fn and pass it as an argument (as a tensor, "
            "torch.tensor(lr, dtype=torch.float64), it follows every call; a float argument is baked and "
            "checked at every call); to change it, step an LR scheduler between calls"
        )

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        if (key in self.traced_only or key in self.graph_inputs) and _caller_is_fn():
            self.refuse_unchecked_read(key)
        return dict.__getitem__(self, key)

    def __missing__(self, key: Any) -> Any:  # dict.__getitem__ found no key
        if _caller_is_fn():
            self.refuse_absent(key)
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        if _caller_is_fn():
            self.refuse_unchecked_read(key)
        return dict.get(self, key, default)

    def __contains__(self, key: Any) -> bool:
        self.read.add(key)
        found = dict.__contains__(self, key)
        if not found and _caller_is_fn():
            self.refuse_absent(key)
        return found


# dict's writing methods: how a refusal names each (None: by the key it writes).
_GROUP_WRITES = {
    "__setitem__": None, "__delitem__": None, "pop": None, "setdefault": None,
    "popitem": " (.popitem())", "update": " (.update())", "clear": " (.clear())", "__ior__": " (|=)",
}
# dict's methods whose answer depends on which keys it has: how a refusal names each.
_GROUP_KEY_SET_READS = {
    "__iter__": "iteration", "__reversed__": "reversed()", "__len__": "len()", "keys": ".keys()",
    "values": ".values()", "items": ".items()", "copy": ".copy()", "__eq__": "==", "__ne__": "!=",
    "__or__": "|", "__ror__": "|",
}


def _refusing_group_write(name: str) -> Callable:
    def refuse(group: _GroupProbe, *args: Any, **kwargs: Any) -> Any:
        if name == "setdefault" and dict.__contains__(group, args[0]):  # a read
            group.read.add(args[0])
            if _caller_is_fn():
                group.refuse_unchecked_read(args[0])
            return dict.__getitem__(group, args[0])
        group.refuse_write(_GROUP_WRITES[name] or f"[{args[0]!r}]")

    return refuse


def _refusing_key_set_read(name: str) -> Callable:
    method = getattr(dict, name)

    @functools.wraps(method)
    def read(group: _GroupProbe, *args: Any) -> Any:
        if _caller_is_fn():
            group.refuse_key_set(_GROUP_KEY_SET_READS[name])
        group.read.update(dict.keys(group))
        return method(group, *args)

    return read


for _name in _GROUP_WRITES:
    setattr(_GroupProbe, _name, _refusing_group_write(_name))
for _name in _GROUP_KEY_SET_READS:
    setattr(_GroupProbe, _name, _refusing_key_set_read(_name))


# What fn's own code may use of an optimizer argument: its groups (the values fn reads
# there are checked at every call) and its step.  Everything else is refused by
# _optimizer_probe; torch's step and zero_grad read what they need.
_OPTIMIZER_USES = frozenset(("param_groups", "zero_grad", "step", "__class__"))
_WHY_NOT_USED = {
    "state": "inside fn it holds the trace's state (created as eager's first step would), not the caller's, "
    "and what fn decides from it (len(opt.state) == 0 before the first step) is not checked at calls",
    "defaults": "the artifact would keep what fn reads there and not check it at calls (the groups' values "
    "are checked: read opt.param_groups[g][key])",
}


def _optimizer_probe(cls: type, where: str) -> type:
    """``cls`` for one optimizer argument while fn is traced: fn's own code reading, setting or
    deleting any attribute but _OPTIMIZER_USES is refused before it happens (Note invariant 15)."""

    def refuse(verb: str, name: str) -> None:
        if verb == "reads":
            why = _WHY_NOT_USED.get(name, "the artifact would keep what fn computes from it and not check it at calls")
        else:
            why = "the artifact would not repeat the change"
        raise PrecompileError(
            f"fn {verb} {where}.{name}{_user_line(traceback.extract_stack())}: {why}; inside fn, use only the "
            "optimizer's param_groups, zero_grad() and step(), and compute anything else outside fn and pass "
            "it as an argument"
        )

    def getattribute(optimizer: Any, name: str) -> Any:
        if name not in _OPTIMIZER_USES and _caller_is_fn():
            refuse("reads", name)
        return cls.__getattribute__(optimizer, name)

    def setattr_(optimizer: Any, name: str, value: Any) -> None:
        if _caller_is_fn():
            refuse("sets", name)
        cls.__setattr__(optimizer, name, value)

    def delattr_(optimizer: Any, name: str) -> None:
        if _caller_is_fn():
            refuse("deletes", name)
        cls.__delattr__(optimizer, name)

    namespace = {"__getattribute__": getattribute, "__setattr__": setattr_, "__delattr__": delattr_}
    probe = type(cls.__name__, (cls,), namespace)  # its name is cls's: torch names step()'s profiler range by it
    probe.__module__, probe.__qualname__ = cls.__module__, cls.__qualname__
    return probe


def _set_lifted_hyperparameter(group: dict, key: str, tensor: torch.Tensor) -> torch.Tensor:
    """Point ``group``'s hyperparameter ``key`` at its graph input; returns it (its class to restore)."""
    if key == "momentum":
        tensor.__class__ = _NonzeroMomentum
        group[key] = tensor
    else:  # betas[0]: foreach Adam reads a tensor beta1 as a number; the single-tensor step does not
        group["betas"] = (tensor, group["betas"][1])
        group["foreach"] = False
    return tensor


class _NonzeroMomentum(torch.Tensor):
    """SGD's lifted momentum while fn is traced: a plain tensor to every op.

    SGD branches on ``momentum != 0`` in Python, which would read the traced
    value; the driver refuses a zero momentum at every call (eager keeps no
    buffer then), so the branch is answered without reading it.
    """

    __torch_function__ = compat.disabled_torch_function_impl

    def __ne__(self, other: Any) -> Any:
        if type(other) in (int, float) and other == 0:
            return True
        return super().__ne__(other)

    __hash__ = torch.Tensor.__hash__


def _set_compiling(value: bool) -> None:
    compat.set_compiling_flag(value)


_PROFILER_OPS = ("profiler._record_function_enter_new", "profiler._record_function_exit")


def _finish_trailing_inputs(
    graph: torch.fx.GraphModule, example: list, args: _Arguments, recorded: dict, position: int
) -> tuple:
    """Settle the inputs after the sizes (optimizers', incoming grads): keep only what fn read.

    ``position`` is the first of them among the placeholders.  Returns the
    OptimizerSpecs and the grad bookkeeping of the convention.
    """
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    optimizers, unused, position = _finish_optimizer_inputs(graph, placeholders, args, position)
    grad_nodes = placeholders[position : position + len(_grad_candidates(args))]
    grads = _finish_grad_inputs(graph, grad_nodes, args, recorded)
    unused.update(position + i for i, node in enumerate(grad_nodes) if not node.users)
    for i in sorted(unused, reverse=True):
        graph.graph.erase_node(placeholders[i])
        del example[i]
    graph.recompile()
    return optimizers, grads


def _finish_optimizer_inputs(graph: torch.fx.GraphModule, placeholders: list, args: _Arguments, position: int) -> tuple:
    """Drop the step's profiler ranges; find the optimizer state inputs fn never read.

    State of a parameter that got no gradient (eager creates none) is an
    unused placeholder: the runtime does not create it.
    """
    if not args.optimizers:
        return (), set(), position
    for node in reversed(list(graph.graph.nodes)):
        if node.op == "call_function" and str(node.target).startswith(_PROFILER_OPS):
            graph.graph.erase_node(node)
    unused = set()
    specs = []
    for lifted in args.optimizers:
        position += lifted.num_group_inputs  # lrs and lifted hyperparameters stay, even when unused
        stepped, tensors = [], []
        slots = [(g, j) for g, indices in enumerate(lifted.groups) for j in range(len(indices))]
        for slot, entry in zip(slots, lifted.state):
            nodes = placeholders[position : position + len(entry)]
            if any(node.users for node in nodes):
                stepped.append(slot)
                tensors += [_tensor_spec(t) for t in entry.values()]
            else:
                unused.update(range(position, position + len(entry)))
            position += len(entry)
        specs.append(
            OptimizerSpec(
                position=lifted.position,
                cls=lifted.cls,
                groups=tuple(tuple(g) for g in lifted.groups),
                hyper=_checked_group_values(lifted),
                keys=tuple(lifted.keys),
                stepped=tuple(stepped),
                tensors=tuple(tensors),
                lifted=lifted.lifted,
            )
        )
    return tuple(specs), unused, position


def _checked_group_values(lifted: _LiftedOptimizer) -> tuple:
    """Per param group, the (key, value) entries the artifact bakes and checks at every call:
    those read (_LiftedOptimizer.read), each a literal python_code can hold."""
    checked = []
    for g, (entries, read) in enumerate(zip(lifted.hyper, lifted.read)):
        kept = tuple((key, value) for key, value in entries if key.partition("[")[0] in read)
        for key, value in kept:
            values = value if type(value) is tuple else (value,)
            bad = next((v for v in values if type(v) not in schema.LEAF_VALUE_TYPES), None)  # numpy's float64 is a float
            if bad is not None:
                name = key.partition("[")[0]
                raise PrecompileError(
                    f"args[{lifted.position}] (optimizer) param_groups[{g}][{name!r}] holds a "
                    f"{type(bad).__module__}.{type(bad).__qualname__} ({bad!r}), which the artifact bakes and checks at "
                    "every call as a Python literal: make it a Python float, int, bool, str or None "
                    "(float(value) for a numpy scalar) before precompile"
                )
        checked.append(kept)
    return tuple(checked)


def _finish_grad_inputs(graph: torch.fx.GraphModule, placeholders: list, args: _Arguments, recorded: dict) -> dict:
    """Decide, per parameter, how the runnable writes ``.grad`` (Note invariant 13).

    fn was traced with each parameter's ``.grad`` set to its own graph input,
    the incoming gradient, so every use fn makes of it is in the graph.  Then:

    - ``.grad`` still that input, untouched: fn left it alone; no output.
    - its one use is backward's accumulation ``incoming.add_(g)``: output
      ``g`` and let the runnable accumulate like eager (assign when None,
      else add), with no incoming input (the common training step).
    - ``.grad`` None at the end: fn cleared it (``zero_grad()`` after backward).
    - otherwise the graph's gradient is final and is assigned: fn cleared the
      incoming one before backward (its input is unused), or read it
      (``clip_grad_norm_`` over accumulated gradients; the input stays).
    """
    output = graph.graph.output_node()
    results = list(output.args[0])
    grad_state = list(recorded["grad_state"])
    first = len(results) - len(grad_state)
    reduced = {index for argument in args.data_parallel for _, index in argument.parameters}
    for index, node in zip(_grad_candidates(args), placeholders):
        if index in reduced:
            _accumulate_out_of_place(node, results)
    assigned = []
    for index, node in zip(_grad_candidates(args), placeholders):
        if index not in grad_state:
            continue
        slot = first + grad_state.index(index)
        produced = results[slot]
        if produced is node:
            del results[slot]
            grad_state.remove(index)
        elif _is_plain_accumulation(produced, node, results):
            results[slot] = produced.args[1]
            output.args = (tuple(results),)
            graph.graph.erase_node(produced)
        else:
            assigned.append(index)
    output.args = (tuple(results),)
    read = [(i, node) for i, node in zip(_grad_candidates(args), placeholders) if node.users]
    _refuse_sparse_gradients_read(args, recorded, [i for i, _ in read])
    read_only = _read_only(graph, [node for _, node in read])
    accumulated = {index: results[first + k] for k, index in enumerate(grad_state) if index not in assigned}
    return {
        "grad_state": tuple(grad_state),
        "grads_assigned": tuple(assigned),
        "grads_owned": _owned_gradients(graph, results, accumulated),
        "grads_cleared": tuple(recorded["grads_cleared"]),
        "grad_inputs": tuple(i for i, _ in read),
        "grad_inputs_read_only": tuple(i for i, node in read if node in read_only),
    }


def _owned_gradients(graph: torch.fx.GraphModule, results: list, accumulated: dict) -> tuple:
    """The parameters of ``accumulated`` (state index -> its gradient's output node) whose
    gradient no other graph output or input shares (Note invariant 13).

    Eager's AccumulateGrad keeps an incoming gradient as a None ``.grad`` only where
    nothing else holds it; it copies one that is also another parameter's (``(a + b)``),
    a returned tensor, or an input (``backward(gradient=g)``) or a view of one.
    """
    root, _ = _alias_sets(graph)
    inputs = {root(node) for node in graph.graph.find_nodes(op="placeholder")}
    held = collections.Counter(root(node) for node in results if isinstance(node, torch.fx.Node))
    return tuple(
        sorted(
            index
            for index, node in accumulated.items()
            if isinstance(node, torch.fx.Node) and root(node) not in inputs and held[root(node)] == 1
        )
    )


def _accumulate_out_of_place(incoming: torch.fx.Node, results: list) -> None:
    """A DDP-reduced parameter's backward accumulation ``incoming.add_(g)`` as ``incoming + g``.

    The sum goes to the all-reduce and ``.grad`` becomes its result, so the
    in-place write only changed the incoming tensor; without it the graph
    merely reads that input, and a call with ``.grad`` None can pass the same
    zeros every time instead of allocating and filling new ones (invariant 16).
    """
    (user,) = incoming.users if len(incoming.users) == 1 else (None,)
    if (
        user is not None
        and user.target is torch.ops.aten.add_.Tensor
        and user.args[0] is incoming
        and user not in results
    ):
        user.target = torch.ops.aten.add.Tensor


def _read_only(graph: torch.fx.GraphModule, nodes: list) -> set:
    """Those placeholder ``nodes`` the graph only reads: no write or output reaches them.

    Per op schemas (``_alias_sets``); a node an op without a schema takes
    (a Python callable) counts as written.
    """
    root, written = _alias_sets(graph)
    returned = {root(n) for n in pytree.tree_leaves(graph.graph.output_node().args) if isinstance(n, torch.fx.Node)}
    opaque = {
        root(arg)
        for node in graph.graph.nodes
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload)
        and node.target is not operator.getitem
        for arg in node.all_input_nodes
    }
    return {node for node in nodes if root(node) not in written.keys() | returned | opaque}


def _is_plain_accumulation(produced: Any, incoming: torch.fx.Node, results: list) -> bool:
    """``produced`` is autograd's ``incoming.add_(g)`` and nothing else reads either."""
    return (
        isinstance(produced, torch.fx.Node)
        and produced.target in (torch.ops.aten.add_.Tensor, torch.ops.aten.add.Tensor)
        and len(produced.args) == 2
        and not produced.kwargs
        and produced.args[0] is incoming
        and isinstance(produced.args[1], torch.fx.Node)
        and len(incoming.users) == 1
        and list(produced.users) == [incoming.graph.output_node()]
        and results.count(produced) == 1
    )


# ---------------------------------------------------------------------------
# Enforce: the graph must only depend on its inputs (Note invariants 2, 5).
# ---------------------------------------------------------------------------


def _is_user_file(filename: str) -> bool:
    """fn's own code: not torch's, not precompile's (an artifact's driver run from its text
    included), not FX-generated, not a context manager's plumbing."""
    return not (
        filename.startswith(_TORCH_DIR)
        or filename.startswith(_PRECOMPILE_DIR)
        or filename.startswith(("<eval_with_key", "<precompile artifact"))
        or filename == contextlib.__file__
    )


def _exception_chain(error: BaseException | None):
    """``error``, then the exceptions it was raised from (its causes and contexts), each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _cause_of_type(error: BaseException, kind: type) -> BaseException | None:
    """``error``, or the first exception of type ``kind`` it was raised from (its causes and contexts)."""
    return next((cause for cause in _exception_chain(error) if isinstance(cause, kind)), None)


def _user_line(frames: list) -> str:
    """' at file:line (code)' for the innermost frame of fn's own code, or ''."""
    user = [f for f in frames if _is_user_file(f.filename)]
    return f" at {user[-1].filename}:{user[-1].lineno} ({user[-1].line})" if user else ""


def _library_line(frames: list) -> str:
    """', in file:line (code)' for the library code fn's innermost line called that reached
    the trace (``float(self.num_batches_tracked)`` in BatchNorm), or '' where fn's own line did:
    the frame before the first of this package's (the trace's modes see every torch call)."""
    users = [i for i, frame in enumerate(frames) if _is_user_file(frame.filename)]
    if not users:
        return ""
    site = None
    for frame in frames[users[-1] + 1 :]:
        if frame.filename.startswith(_PRECOMPILE_DIR):
            break
        site = frame
    return f", in {site.filename}:{site.lineno} ({site.line})" if site else ""


def _source_of(node: torch.fx.Node) -> str:
    # The innermost frame of user code: skip torch's own files and FX's generated code.
    frame = compat.innermost_frame(node.meta.get("stack_trace"), _is_user_file)
    return f' (at File "{frame[0]}", line {frame[1]}, in {frame[2]})' if frame else ""


def _enforce_contract(graph: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list]:
    """Refuse live state, effects and control flow; lift tensor literals to inputs."""
    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    for node in calls:
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            raise PrecompileError(
                f"fn uses the higher-order operator {node.target.name()}{_source_of(node)} "
                "(control flow such as torch.cond / while_loop), which precompile does not "
                "support; write the branch as plain Python (it is specialized to the example "
                "inputs) or keep it outside fn"
            )
        if compat.has_effects(node.target):
            raise PrecompileError(
                f"fn calls the effectful operator {node.target}{_source_of(node)}; side effects "
                "would be lost or reordered by the artifact: move it out of fn"
            )
    constants = []
    last_placeholder = list(graph.graph.find_nodes(op="placeholder"))[-1]
    for node in list(graph.graph.find_nodes(op="get_attr")):
        value = getattr(graph, node.target)
        users = list(node.users)
        is_literal = isinstance(value, torch.Tensor) and all(
            u.target is torch.ops.aten.lift_fresh_copy.default for u in users
        )
        if not is_literal:
            where = "".join(_source_of(u) for u in users[:1])
            description = (
                f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            raise PrecompileError(
                f"fn reads {description} that is neither an argument of fn nor created inside "
                f"it{where}: a global, a captured local or an unregistered module attribute is "
                "live state the artifact cannot see; pass it as an argument, or register it "
                "on a module argument with register_buffer / nn.Parameter"
            )
        with graph.graph.inserting_after(last_placeholder):
            placeholder = graph.graph.placeholder(f"constant{len(constants)}")
        last_placeholder = placeholder
        node.replace_all_uses_with(placeholder)
        graph.graph.erase_node(node)
        delattr(graph, node.target)
        constants.append(value.detach().clone())
    graph.recompile()
    return graph, constants


def _constant_spec(t: torch.Tensor) -> ConstantSpec:
    import base64

    # reshape(-1): a 0-dim literal (torch.tensor(torch.finfo(dtype).min)) cannot be
    # viewed as bytes directly ("self.dim() cannot be 0 to view Float as Byte").
    data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return ConstantSpec(
        shape=tuple(t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
        data=base64.b64encode(data).decode("ascii"),
    )


# ---------------------------------------------------------------------------
# Lower: eager keeps the ATen graph; inductor goes through AOTAutograd.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Lowered:
    graph_code: str  # python_code section that defines the graph
    bind_code: str  # statements binding `_run_graph(list_of_inputs) -> outputs`
    header_code: str = ""  # header constants the graph section depends on


# ATen ops that write their running_mean / running_var arguments (when training with
# stats) although their schemas carry no mutation annotation, so Node.is_impure misses them.
_UNANNOTATED_STAT_WRITERS = ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm")


def _is_impure_in_eager_graph(node: torch.fx.Node) -> bool:
    if node.is_impure():
        return True
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == "aten"
        and target._schema.name.removeprefix("aten::") in _UNANNOTATED_STAT_WRITERS
    )


def _lower_eager(capture: _Capture) -> _Lowered:
    graph = capture.graph.graph
    _name_graph_inputs(graph, capture.convention)
    _keep_user_frames(graph)
    # Keeps in-place and random ops (Node.is_impure), and the batch norms whose schema hides
    # that they update running_mean / running_var in place: BatchNorm in train mode whose
    # output fn discards (a `model(x)` pass that only refreshes the running stats) still
    # updates them in eager.
    graph.eliminate_dead_code(is_impure_node=_is_impure_in_eager_graph)
    # verbose: each node's shape/dtype and, where capture recorded one, its source line.
    code = graph.python_code(root_module="self", verbose=True, expanded_def=True)
    imports, unknown = compat.fx_builtin_imports(code.globals)
    if unknown:
        raise PrecompileError(f"the captured graph refers to globals the artifact cannot render: {unknown}")
    source = re.sub(r"\bdef forward\(\s*self,?\s*", "def eager_graph(\n    ", code.src.strip(), count=1)
    graph_code = (
        "# The captured ATen graph: inputs in the calling convention's order (p_ parameters,\n"
        "# b_ buffers, then fn's tensors by argument), each value's dtype[shape], and the\n"
        "# source line of fn or the model that produced it where capture recorded one.\n"
        + "\n".join(imports)
        + "\n\n\n"
        + source
        + "\n"
    )
    return _Lowered(graph_code, '_run_graph = _driver["eager_runner"](eager_graph)\n')


def _name_graph_inputs(graph: torch.fx.Graph, convention: CallingConvention) -> None:
    """Name each placeholder after what the driver passes there (FX makes them identifiers)."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    names = _graph_input_names(convention)
    if len(names) != len(placeholders):
        raise AssertionError(
            f"the calling convention names {len(names)} graph inputs, the graph has {len(placeholders)}"
        )
    for node, name in zip(placeholders, names):
        compat.rename_node(node, name)
        node.target = node.name  # FX renders a placeholder's parameter from its target


def _graph_input_names(convention: CallingConvention) -> list[str]:
    """What each graph input is, in CallingConvention's input order."""

    def fqn(state_index: int) -> str:
        return convention.state[state_index].names[0][1]

    paths = [
        f"args_{convention.user_positions[position.idx]}{pytree.keystr(tuple(rest))}"
        for position, *rest in runtime.leaf_paths(convention.input_spec)
    ]
    names = [f"{'p' if s.kind == 'parameter' else 'b'}_{fqn(i)}" for i, s in enumerate(convention.state)]
    names += [paths[i] for i, leaf in enumerate(convention.inputs) if leaf.tensor is not None]
    names += [f"size_{paths[leaf]}_dim{dim}" for leaf, dim in convention.sizes]
    for optimizer in convention.optimizers:
        for g in range(len(optimizer.groups)):
            names += [f"lr_group{g}"] + [f"{key.replace('[', '').replace(']', '')}_group{g}" for key in optimizer.lifted]
        for group, index in optimizer.stepped:
            names += [f"{key}_{fqn(optimizer.groups[group][index])}" for key in optimizer.keys]
    names += [f"grad_{fqn(i)}" for i in convention.grad_inputs]
    names += [f"constant{i}" for i in range(len(convention.constants))]
    return names


def _keep_user_frames(graph: torch.fx.Graph) -> None:
    """Reduce each node's recorded stack trace to its innermost frame in fn's or the model's code.

    FX's verbose codegen shows a trace's innermost frame: for an nn.Linear that
    is torch's linear.py, not the model line that called it.
    """
    for node in graph.nodes:
        frame = compat.innermost_frame(node.stack_trace, _is_user_file)
        node.stack_trace = "".join(traceback.format_list([frame])) if frame else None


# Inductor config pinned for lowering: kernels
# size their scratch by the runtime thread count, Python wrapper only, and
# random ops use ATen's RNG so results match eager under torch.manual_seed.
_INDUCTOR_CONFIG = {
    "cpp.dynamic_threads": True,
    "cpp_wrapper": False,
    "benchmark_harness": False,
    "size_asserts": True,
    "fallback_random": True,
    "freezing": False,
    # Round where eager rounds: a bf16 round trip (saved_tensors_hooks packing,
    # autocast) is otherwise fused away and a training step's gradients differ.
    "emulate_precision_casts": True,
}


def _inductor_config(capture: _Capture) -> dict:
    config = dict(_INDUCTOR_CONFIG)
    # Codegen wraps serial work inside a parallel region in `omp single` only when it
    # expects more than one thread, while dynamic threads run the kernel on the loading
    # process's count: lowered on one thread (OMP_NUM_THREADS=1), a reduction's scalar
    # epilogue ran once per thread at a load with eight (the loss divided eight times).
    config["cpp.threads"] = max(2, torch.get_num_threads())
    # Inductor's lowering relies on the size facts (it may ask what they decide: _captured_and_lowered).
    assumed = "".join(f"|{fact.terms}{fact.op}{fact.constant}" for fact in capture.convention.size_facts)
    config["post_grad_custom_post_pass"] = compat.inductor_post_grad_pass(_compute_scalars_once, assumed)
    # Constant folding of uniform values rewrites `x + zeros` / `x * ones` (zeros
    # made inside fn) to x itself after the outputs' aliasing was decided (its
    # remove_no_ops has no output check, in 2.11-2.14): the artifact returned
    # the caller's input or parameter where eager returns a new tensor, and a
    # write to the result reached the caller's.  (With free dims it also asks
    # `numel == 0`, which a mark without min=1 cannot decide.)
    config["joint_graph_constant_folding"] = False
    if capture.convention.sizes:
        # Free (unbacked) dims.  Layout optimization makes convolutions
        # channels_last, and the stride Inductor predicts for their output is
        # then contiguous while the kernel returns channels_last: every call
        # failed its stride assert.
        config["layout_optimization"] = False
    return config


# Below this many elements a reader's loop recomputes a scalar more cheaply
# than a buffer of its own is allocated (~0.5 us per call).
_SCALAR_READERS_MIN_NUMEL = 1024


def _compute_scalars_once(graph: torch.fx.Graph) -> None:
    """Compute each one-element CPU value that a large kernel reads into a buffer of its own.

    Inductor inlines scalar arithmetic into every loop that reads it, and its
    C++ kernels recompute it per vector iteration (torch 2.13's codegen hoists
    no loop invariants, and the C++ compiler cannot: the scalar's input may
    alias the loop's outputs).  AdamW's bias corrections -- two ``pow`` of the
    step count, a square root and divisions -- then cost more than the update
    itself: about 230 us of the 3x256 MLP's 880 us training step.  Realized,
    they are computed once per call and loaded.  Runs on Inductor's post-grad
    graph (values as eager computes them: the FX dtype of each node is kept).
    """

    def cpu_numel(node: torch.fx.Node) -> Any:
        value = node.meta.get("val")
        return value.numel() if isinstance(value, torch.Tensor) and value.device.type == "cpu" else None

    def reads_many(node: torch.fx.Node) -> bool:
        numel = cpu_numel(node)
        # A free dim counts as many.
        return numel is not None and (not isinstance(numel, int) or numel >= _SCALAR_READERS_MIN_NUMEL)

    realize = compat.inductor_realize_op()
    for node in [node for node in graph.nodes if node.op == "call_function"]:
        numel = cpu_numel(node)
        if not (isinstance(numel, int) and numel == 1):
            continue
        readers = [user for user in node.users if reads_many(user)]
        if not readers:
            continue
        with graph.inserting_after(node):
            computed = graph.call_function(realize, (node,))
        computed.meta["val"] = node.meta["val"]
        for reader in readers:
            reader.replace_input_with(node, computed)


def _views_as_reshapes(graph: torch.fx.GraphModule) -> None:
    """Turn each ``aten.view`` whose aliasing nothing observes into ``aten.reshape``.

    The real-mode trace records ``view`` where the real kernels happened to
    return compatible strides; Inductor's decompositions may not (its ``cat``
    drops an empty input and keeps the other's strides), and AOTAutograd's
    re-trace then fails with "Cannot view a tensor ...".  ``reshape`` computes
    the same values and is a view whenever one is possible; only a view in an
    alias set that something writes to must stay a view.
    """
    root, written = _alias_sets(graph)
    for node in graph.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default):
        if root(node) not in written:
            node.target = torch.ops.aten.reshape.default
    graph.recompile()


# Ops Inductor's remove_noop_ops (2.11-2.14) replaces by one of their arguments
# when it finds them no-ops (a clone, a same-dtype cast, `repeat(1)`, ...): the
# position of that argument.
_COPIES_INDUCTOR_MAY_DROP = {
    torch.ops.aten.clone.default: 0,
    torch.ops.aten._to_copy.default: 0,
    torch.ops.prims.convert_element_type.default: 0,
    torch.ops.aten.repeat.default: 0,
    torch.ops.aten.constant_pad_nd.default: 0,
    torch.ops.aten.pow.Tensor_Scalar: 0,
    torch.ops.aten.cat.default: 0,  # (a list: dropped where it holds one tensor)
    torch.ops.aten.copy.default: 1,
    torch.ops.aten.copy_.default: 1,
    torch.ops.aten.slice_scatter.default: 1,
}


def _may_be_a_no_op(copy: Any, source: Any) -> bool:
    """Whether Inductor may find the copy a no-op: it drops only copies with their source's
    metadata (a cast to another dtype stays).  Symbolic sizes count as maybe equal."""
    if not (isinstance(copy, torch.Tensor) and isinstance(source, torch.Tensor)):
        return False
    if (copy.dtype, copy.device) != (source.dtype, source.device):
        return False
    sizes = (*copy.shape, *copy.stride(), *source.shape, *source.stride())
    if any(isinstance(size, torch.SymInt) for size in sizes):
        return True
    return (copy.shape, copy.stride()) == (source.shape, source.stride())


def _keep_copies_of_written_inputs(graph: torch.fx.GraphModule) -> None:
    """Make each copy Inductor could drop read its source through ``realize``, where
    dropping it would change what fn computes.

    Inductor's remove_noop_ops replaces a no-op copy by its source, which is wrong
    where the source is (a view of) a graph input that the graph writes after the
    copy -- the copy's readers then see the new values (``t = a.clone(); a.copy_(b);
    b.copy_(t)`` left ``b`` unchanged) -- and where the copy becomes another input's
    storage through ``set_`` (``p.set_(q.clone())`` left ``p`` sharing ``q``'s memory).
    torch.compile computes the same wrong results (2.13, 2.14).
    ``realize`` is lowered as Inductor lowers a clone, but is no no-op to that pass.
    """
    root, last_write = _alias_sets(graph)
    order = {node: position for position, node in enumerate(graph.graph.nodes)}

    def must_stay(copy: torch.fx.Node, value: Any) -> bool:
        if not (isinstance(value, torch.fx.Node) and _may_be_a_no_op(copy.meta.get("val"), value.meta.get("val"))):
            return False
        if any(user.target is torch.ops.aten.set_.source_Tensor for user in copy.users):
            return True
        writer = last_write.get(root(value))
        return root(value).op == "placeholder" and writer is not None and order[writer] > order[copy]

    def kept(copy: torch.fx.Node, value: Any) -> Any:
        if not must_stay(copy, value):
            return value
        with graph.graph.inserting_before(copy):
            realized = graph.graph.call_function(compat.inductor_realize_op(), (value,))
        realized.meta["val"] = value.meta["val"]
        return realized

    for node in [node for node in graph.graph.nodes if node.op == "call_function"]:
        position = _COPIES_INDUCTOR_MAY_DROP.get(node.target)
        if position is None or position >= len(node.args):
            continue
        source = node.args[position]
        source = [kept(node, value) for value in source] if isinstance(source, (list, tuple)) else kept(node, source)
        node.args = (*node.args[:position], source, *node.args[position + 1 :])
    graph.recompile()


def _keep_traced_dtypes(graph: torch.fx.GraphModule) -> None:
    """Cast an op's result to the dtype the traced kernel gave it where Inductor's
    decomposition of the op computes another.

    ``mse_loss_backward`` of a bfloat16 input and a float32 target returns bfloat16
    (the input's dtype); its decomposition returns the promoted float32, and the matmul
    that consumes it then fails (or a returned result would differ from eager's).
    torch.compile never sees the kernel's dtype (autograd casts the decomposed gradient);
    the traced graph holds it, so the cast here is a no-op copy in eager terms.
    """
    decompositions = compat.inductor_decompositions()
    changed = False
    for node in list(graph.graph.nodes):
        decomposition = decompositions.get(node.target) if node.op == "call_function" else None
        traced = node.meta.get("val")
        if decomposition is None or not isinstance(traced, torch.Tensor) or node.target._schema.is_mutable:
            continue  # (an in-place op's decomposition would write the trace's fake values)
        try:
            values = pytree.tree_map(lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs))
            fake_mode, (args, kwargs) = compat.in_one_fake_mode(values)
            with fake_mode:
                decomposed = decomposition(*args, **kwargs)
        except Exception:  # noqa: BLE001 - a decomposition fake tensors cannot run; Inductor decides
            continue
        if isinstance(decomposed, torch.Tensor) and decomposed.dtype != traced.dtype:
            with graph.graph.inserting_after(node):
                cast = graph.graph.call_function(torch.ops.prims.convert_element_type.default, (node, traced.dtype))
            cast.meta["val"] = traced
            node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
            changed = True
    if changed:
        graph.recompile()


# Fills that draw one number per element, in memory order (CPU, torch 2.11-2.14);
# normal_ only below 16 elements or into a contiguous target (_refuse_strided_normal).
_PER_ELEMENT_FILLS = {
    torch.ops.aten.bernoulli_.float, torch.ops.aten.bernoulli_.Tensor, torch.ops.aten.uniform_.default,
    torch.ops.aten.normal_.default, torch.ops.aten.exponential_.default, torch.ops.aten.random_.default,
    torch.ops.aten.geometric_.default, torch.ops.aten.log_normal_.default, torch.ops.aten.cauchy_.default,
}


def _refuse_strided_normal(graph: torch.fx.GraphModule) -> None:
    """CPU normal_ fills a contiguous target of 16+ elements in blocks of 16 (vectorized
    Box-Muller) and any other target one element at a time, with other numbers and another
    count of draws: Inductor, which fills contiguous buffers, cannot give eager's."""
    for node in graph.graph.find_nodes(op="call_function", target=torch.ops.aten.normal_.default):
        value = node.args[0].meta.get("val")
        if _memory_order(value) is not None and value.numel() >= 16:
            raise PrecompileError(
                f"fn fills a non-contiguous tensor ({_layout(value)}) with normal_{_source_of(node)}: "
                "eager's CPU normal_ draws other numbers for it than for a contiguous tensor, which "
                "backend='inductor' cannot reproduce. Draw into a contiguous tensor (torch.randn(shape), "
                "then permute or copy_ it where it goes), or use backend='eager'"
            )


def _refuse_scaled_nearest_backward(graph: torch.fx.GraphModule) -> None:
    """Inductor's lowering of aten.upsample_nearest2d_backward ignores its scales_h / scales_w and
    maps each output row and column to the input from the sizes alone, where eager's kernels
    (forward and backward) use 1 / scale_factor: with ``F.interpolate(x, scale_factor=1.7,
    mode="nearest")`` the gradient goes to other input pixels.  (torch.compile differentiates
    the forward's decomposition instead and never meets this op; the trace records eager's
    backward.)  Refused where the two maps differ."""
    for node in graph.graph.find_nodes(op="call_function", target=torch.ops.aten.upsample_nearest2d_backward.default):
        args = list(node.args) + [None] * (5 - len(node.args))
        output_size = node.kwargs.get("output_size", args[1])
        input_size = node.kwargs.get("input_size", args[2])
        scales = (node.kwargs.get("scales_h", args[3]), node.kwargs.get("scales_w", args[4]))
        for out_size, in_size, scale in zip(tuple(output_size)[-2:], tuple(input_size)[-2:], scales):
            if scale is None:
                continue
            if not (isinstance(out_size, int) and isinstance(in_size, int)) or _nearest_map(
                out_size, in_size, scale
            ) != _nearest_map(out_size, in_size, None):
                raise PrecompileError(
                    f"fn differentiates a nearest upsampling with scale_factor={scale} ({in_size} -> "
                    f"{out_size}){_source_of(node)}: backend='inductor' would send the gradient to other input "
                    "pixels than eager (its upsample_nearest2d_backward ignores the scale). Pass size= "
                    "instead of scale_factor (or recompute_scale_factor=True), or use backend='eager'"
                )


def _nearest_map(out_size: int, in_size: int, scale: float | None) -> list:
    """The input index of each output index of eager's nearest upsampling (ATen's nearest_idx):
    float32 1 / scale where a scale is given, else in_size / out_size (exact)."""
    if out_size == in_size:
        return list(range(out_size))
    if out_size == 2 * in_size:
        return [o >> 1 for o in range(out_size)]
    if scale is None or scale <= 0:
        return [min(o * in_size // out_size, in_size - 1) for o in range(out_size)]
    factor = torch.tensor(1.0 / scale, dtype=torch.float32)
    rows = torch.floor(torch.arange(out_size, dtype=torch.float32) * factor).to(torch.int64)
    return rows.clamp(max=in_size - 1).tolist()


def _memory_order(value: Any) -> list | None:
    """The dims of a non-contiguous, non-overlapping tensor, outermost first; None for any other value."""
    if (
        not isinstance(value, torch.Tensor)
        or not compat.has_static_layout(value)
        or value.is_contiguous()
    ):
        return None
    order = sorted(range(value.dim()), key=lambda d: -value.stride(d))
    extent = 1  # elements spanned by the dims inside the current one
    for d in reversed(order):
        if value.shape[d] > 1:
            if value.stride(d) < extent:
                return None
            extent = value.stride(d) * value.shape[d]
    return order


def _fill_randoms_in_eager_memory_order(graph: torch.fx.GraphModule) -> None:
    """Make random fills draw into memory laid out as eager laid it out.

    ``bernoulli_`` & co. draw numbers in memory order, so a dropout mask
    ``empty_like(x).bernoulli_(p)`` depends on x's strides.  Inductor clones
    the fill's target contiguous, which gave other masks than eager under the
    same seed wherever x was not contiguous (nn.MultiheadAttention's output).
    Fill a contiguous tensor in eager's memory order, then permute it to x's
    strides: the same numbers land in the same elements on both backends.  A
    fill into another tensor (a strided view: ``x[:, ::2].uniform_()``) copies
    the permuted numbers into it; Inductor's own functional fill of a strided
    view returned other strides than it asserted, refusing every call.
    """
    for fill in list(graph.graph.nodes):
        target = fill.args[0] if fill.target in _PER_ELEMENT_FILLS else None
        order = _memory_order(target.meta.get("val")) if target is not None else None
        if order is None:
            continue
        fresh = target.target is torch.ops.aten.empty_like.default and len(target.users) == 1
        value = target.meta["val"]
        with graph.graph.inserting_before(fill):
            base = graph.graph.call_function(
                torch.ops.aten.empty.memory_format,
                ([value.shape[d] for d in order],),
                {"dtype": value.dtype, "device": value.device},
            )
            rest = fill.args[1:]
            if fill.target is torch.ops.aten.bernoulli_.Tensor:  # eager pairs p's elements with the target's
                expanded = graph.graph.call_function(torch.ops.aten.expand.default, (rest[0], list(value.shape)))
                rest = (graph.graph.call_function(torch.ops.aten.permute.default, (expanded, order)), *rest[1:])
        fill.args = (base, *rest)
        inverse = sorted(range(value.dim()), key=order.__getitem__)
        with graph.graph.inserting_after(fill):
            filled = permuted = graph.graph.call_function(torch.ops.aten.permute.default, (fill, inverse))
        if not fresh:
            with graph.graph.inserting_after(permuted):
                filled = graph.graph.call_function(torch.ops.aten.copy_.default, (target, permuted))
        fill.replace_all_uses_with(filled, delete_user_cb=lambda user: user is not permuted)
        if fresh:
            graph.graph.erase_node(target)
    graph.recompile()


def _refuse_reordered_draws(graph: torch.fx.GraphModule) -> None:
    """A graph with a draw fn never uses and another draw, which this torch's Inductor may run
    in another order than eager (Note invariant 11, RNG: each draw starts where the previous
    one left the generator), so the numbers would differ from eager's: refused."""
    draws = [
        node for node in graph.graph.nodes
        if isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags
    ]
    if len(draws) > 1:
        raise PrecompileError(
            f"fn draws random numbers it never uses ({draws[0].target}{_source_of(draws[0])}; transformers' "
            f"LayerDrop draws so) besides other draws: backend='inductor' on torch {torch.__version__} may run "
            "such a draw after later ones, which would then draw other numbers than eager. Precompile with "
            "backend='eager', or use torch 2.13 or newer"
        )


def _output_unused_draws(graph: torch.fx.GraphModule) -> int:
    """Make the buffers of random draws fn never uses extra graph outputs; return how many.

    Eager draws them all, advancing the global RNG (an unused dropout of an
    auxiliary branch); Inductor drops a kernel whose buffer nothing reads, so
    every later draw of the caller differed.  An output keeps the kernel.  Draws
    into memory an output or an input shares are kept by their writes already.
    """
    root, _ = _alias_sets(graph)
    output = graph.graph.output_node()
    live, stack = set(), [output, *(n for n in graph.graph.nodes if root(n).op == "placeholder")]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    live_roots = {root(node) for node in live}
    unused = {}  # the buffer each unused draw fills, once per buffer
    for node in graph.graph.nodes:
        if (
            isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in node.target.tags
            and root(node) not in live_roots
            and isinstance(root(node).meta.get("val"), torch.Tensor)
        ):
            unused[root(node)] = None
    if unused:
        output.args = ((*output.args[0], *unused),)
        graph.recompile()
    return len(unused)


def _alias_sets(graph: torch.fx.GraphModule) -> tuple[Callable, dict]:
    """Union the nodes that share storage (per op schemas): (root of a node, the last
    node that writes each written root)."""
    import operator

    parent: dict = {}

    def root(node):
        while parent.get(node, node) is not node:
            node = parent[node]
        return node

    written = []
    for node in (n for n in graph.graph.nodes if n.op == "call_function"):
        if node.target is operator.getitem:  # an element of a multi-output op aliases it
            parent[root(node)] = root(node.args[0])
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        bound = dict(zip((a.name for a in schema.arguments), node.args)) | dict(node.kwargs)
        for argument in schema.arguments:
            if argument.alias_info is None:
                continue
            # Conservatively, the outputs alias every argument with alias info
            # (view ops, in-place and out= ops; `Tensor(a)[]` returns of split).
            for value in pytree.tree_leaves(bound.get(argument.name)):
                if isinstance(value, torch.fx.Node):
                    parent[root(node)] = root(value)
                    if argument.alias_info.is_write:
                        written.append((value, node))
    return root, {root(value): writer for value, writer in written}


def _refuse_tensor_subclasses(capture: _Capture) -> None:
    # AOTAutograd would unwrap them into their inner tensors, a calling
    # convention the driver does not speak.
    state = capture.convention.state
    for i, tensor in enumerate(capture.example_inputs):
        if isinstance(tensor, torch.Tensor) and compat.is_traceable_wrapper_subclass(tensor):
            what = f"{state[i].kind} '{state[i].names[0][1]}'" if i < len(state) else "an input of fn"
            raise PrecompileError(
                f"{what} is a {type(tensor).__name__}: backend='inductor' does not support tensor "
                "subclasses (DTensor, as from fully_shard or tensor parallelism) yet; use "
                "backend='eager', or pass plain tensors (e.g. DTensor.to_local())"
            )


def _refuse_input_layout_changes(graph: torch.fx.GraphModule, args: _Arguments) -> None:
    """Refuse an in-place op that leaves a graph input with another shape, stride or offset.

    ``resize_``, ``squeeze_``, ``t_``, ``as_strided_`` and an ``out=`` that
    resizes its output change the input itself; AOTAutograd replays such
    changes in a wrapper around Inductor's graph, which an artifact does not
    carry, so the kernels would write the old, smaller buffer (Note invariant
    11).  The eager backend runs the ops themselves.
    """
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    num_inputs = len(args.lifted) + len(args.tensor_indices)
    for node in graph.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        base = _through_in_place_ops(node)
        if base is node or base.op != "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        before, after = base.meta["val"], node.meta["val"]  # each the trace's snapshot at that node
        if not _same_layout(before, after):
            index = placeholders.index(base)
            name = _input_name(args, index) if index < num_inputs else "a .grad or optimizer state tensor"
            raise PrecompileError(
                f"fn changes the layout of {name} in place ({node.target}: {_layout(before)} -> "
                f"{_layout(after)}){_source_of(node)}; backend='inductor' "
                "would keep writing its old memory. Write into a new tensor instead (x = x.reshape(...), "
                "torch.add(a, b) without out=), or use backend='eager'"
            )


def _layout(tensor: torch.Tensor) -> str:
    return f"{tuple(tensor.shape)} strides {tuple(tensor.stride())} offset {tensor.storage_offset()}"


def _same_layout(before: torch.Tensor, after: torch.Tensor) -> bool:
    try:
        return (tuple(before.shape), tuple(before.stride()), before.storage_offset()) == (
            tuple(after.shape),
            tuple(after.stride()),
            after.storage_offset(),
        )
    except Exception:  # a comparison of marked sizes the shape environment cannot decide
        return False


def _refuse_float_round_trips(graph: torch.fx.GraphModule) -> None:
    """A float cast that narrows, cast straight back (``x.to(bfloat16).to(float32)``, a
    saved_tensors_hooks packing) rounds in eager; torch 2.11/2.12's Inductor computes it in
    float32 without rounding, even under emulate_precision_casts."""
    casts = graph.graph.find_nodes(op="call_function", target=torch.ops.aten._to_copy.default)
    for node in casts:
        source, narrowed = node.args[0].meta.get("val"), node.meta.get("val")
        if not (
            isinstance(source, torch.Tensor)
            and isinstance(narrowed, torch.Tensor)
            and source.dtype.is_floating_point
            and narrowed.dtype.is_floating_point
            and narrowed.dtype.itemsize < source.dtype.itemsize
        ):
            continue
        for user in node.users:
            widened = user.meta.get("val") if user.target is torch.ops.aten._to_copy.default else None
            if isinstance(widened, torch.Tensor) and widened.dtype.itemsize > narrowed.dtype.itemsize:
                raise PrecompileError(
                    f"fn rounds a {source.dtype} tensor to {narrowed.dtype} and casts it back{_source_of(node)}: "
                    f"torch {torch.__version__}'s Inductor drops that rounding, eager keeps it. Use "
                    "backend='eager', or torch 2.13+"
                )


class _LoweringNeedsSizeFact(Exception):
    """Inductor's lowering asked a question about the free sizes that the example decides."""

    def __init__(self, fact: "schema.SizeFact"):
        self.fact = fact


def _size_fact_lowering_needs(capture: _Capture, undecided, node: "torch.fx.Node | None") -> "schema.SizeFact | None":
    """What the lowering asked of the free sizes (``undecided.cond``) as a size fact the example
    decides, or None: not linear in them, already assumed (it did not help), or one too many."""
    if capture.size_fact_of is None or len(capture.convention.size_facts) >= _MAX_SIZE_FACTS:
        return None
    where = f" for Inductor's lowering of {node.target}{_source_of(node)}" if node is not None else " for Inductor"
    fact = capture.size_fact_of(undecided.cond, where)
    assumed = {(known.terms, known.constant, known.op) for known in capture.convention.size_facts}
    return None if fact is None or (fact.terms, fact.constant, fact.op) in assumed else fact


def _captured_and_lowered(fn: Callable, example_inputs: tuple, backend: str, decompositions, timer) -> tuple:
    """(capture, lowered) of fn: a size fact Inductor's lowering needs (a question about the
    free sizes, such as whether one is 1) is taken as the example decides it and fn captured
    again with it assumed, where the lowering can decide it (Note invariant 3)."""
    size_facts: tuple = ()
    while True:
        with timer("capture+enforce"):
            capture = _capture(fn, example_inputs, backend, decompositions, size_facts)
        with timer("lower"):
            try:
                return capture, _lower_eager(capture) if backend == "eager" else _lower_inductor(capture)
            except _LoweringNeedsSizeFact as needed:
                size_facts = (*capture.convention.size_facts, needed.fact)


def _lower_inductor(capture: _Capture) -> _Lowered:
    # torch 2.13 has no compile_to_python: keep the module Inductor generates
    # for the single inner graph through an inner_compile hook.
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    num_inputs = len(capture.example_inputs)
    num_outputs = len(capture.convention.output_tensors) + len(capture.convention.grad_state)
    _refuse_tensor_subclasses(capture)
    if not compat.INDUCTOR_KEEPS_ROUNDING_CASTS:
        _refuse_float_round_trips(capture.graph)
    _views_as_reshapes(capture.graph)
    _keep_copies_of_written_inputs(capture.graph)
    _keep_traced_dtypes(capture.graph)
    _refuse_strided_normal(capture.graph)
    _refuse_scaled_nearest_backward(capture.graph)
    _fill_randoms_in_eager_memory_order(capture.graph)
    num_unused_draws = _output_unused_draws(capture.graph)
    if num_unused_draws and not compat.INDUCTOR_KEEPS_DRAW_ORDER:
        _refuse_reordered_draws(capture.graph)
    # The graph holds capture's autocast casts: traced again under it, Inductor would add more.
    with torch.no_grad(), compat.autocast_disabled():
        try:
            compiled = compat.inductor_compile(capture.graph, capture.example_inputs, _inductor_config(capture))
        except PrecompileError:
            raise
        except (RuntimeError, AssertionError) as error:  # Inductor's or AOTAutograd's own failure on a graph eager runs
            undecided = _cause_of_type(error, GuardOnDataDependentSymNode)  # a lowering's, wrapped in InductorError
            if undecided is not None:
                fact = _size_fact_lowering_needs(capture, undecided, compat.node_being_lowered(_exception_chain(error)))
                if fact is not None:
                    raise _LoweringNeedsSizeFact(fact) from undecided
                raise PrecompileError(
                    f"backend='inductor' needs to decide {undecided.cond} about a dim marked with "
                    "mark_unbacked while optimizing the graph; give the mark bounds that decide it "
                    "(e.g. mark_unbacked(x, 0, min=1)), remove the mark, or use backend='eager'"
                ) from undecided
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise PrecompileError(
                f"backend='inductor' failed to compile fn's graph ({type(error).__name__}: {message}); "
                "the captured graph itself is sound: precompile with backend='eager'"
            ) from error
    if len(compiled) != 1 or compiled[0][1:] != (num_inputs, num_outputs + num_unused_draws):
        signature = [(inputs, outputs) for _, inputs, outputs in compiled]
        raise PrecompileError(
            "backend='inductor' cannot reproduce this graph faithfully: AOTAutograd changed its "
            f"calling signature (expected one graph with {num_inputs} inputs and {num_outputs} "
            f"outputs, got {signature}); this happens with metadata mutations such as x.t_() or "
            "x.resize_(): avoid them in fn, or use backend='eager'"
        )
    if not hasattr(compiled[0][0], "source_code"):
        # Inductor generates no module for a graph without compute (fn returns an
        # input, detached or viewed): the captured graph itself is the program.
        return _lower_eager(capture)
    source = _strip_stand_in_imports(compiled[0][0].source_code)
    for rewrite in (compat.without_input_asserts, compat.without_default_gemm_scalars, compat.with_parallel_checks_raising):
        source = rewrite(source)
    graph_code = (
        "# Inductor's generated module, verbatim but for its imports from torch._inductor\n"
        "# (a 2 s import): the driver binds stand-ins for them in the forward section below;\n"
        "# for its graph-input size/stride asserts, which the driver's guards perform; and\n"
        "# for the default alpha=1, beta=1 its addmm calls spell out; and for the try around\n"
        "# its parallel C++ loops that check indices or divisors, whose throw would abort the\n"
        "# process.  (Its C++ integer divisions check their divisor: capture's codegen.)\n"
        f"EXTERN_KERNELS = {pprint.pformat(_extern_kernel_table(source))}\n\n\n"
        f"{_DEFERRED_KERNELS}\n\n{source}"
    )
    bind = '_kernel_loader = _driver["bind_inductor_graph"](globals(), EXTERN_KERNELS, _kernel_files, INDUCTOR_VEC_ISA)\n'
    if num_unused_draws:
        bind += (
            "\n\ndef _run_graph(inputs):  # Inductor's call(list_of_inputs) -> outputs\n"
            f"    return call(inputs)[:{num_outputs}]  # the rest keep fn's unused random draws\n\n\n"
        )
    else:
        bind += "_run_graph = call  # Inductor's call(list_of_inputs) -> outputs\n"
    # The vector ISA (name, bit width) Inductor wrote the C++ kernels for: compiled
    # elsewhere, they are compiled for it or refused (jit_compile_kernel).
    return _Lowered(graph_code, bind, f"INDUCTOR_VEC_ISA = {list(runtime._inductor_vec_isas()[0])!r}\n")


# Stands in for Inductor's AsyncCompile while the graph section runs, before the
# driver: kernels are loaded when the forward section binds them.
_DEFERRED_KERNELS = '''\
class PendingKernel(tuple):
    """(argtypes, C++ source) of a kernel Inductor's module requests; bind_inductor_graph loads it."""


class PendingTritonKernel(tuple):
    """(kernel name, Triton source, device type) of a GPU kernel; bind_inductor_graph loads it."""


class AsyncCompile:
    def cpp_pybinding(self, argtypes, source):
        return PendingKernel((argtypes, source))

    def triton(self, kernel_name, source_code, device_str="cuda"):
        return PendingTritonKernel((kernel_name, source_code, device_str))

    def wait(self, scope):
        pass
'''


def _strip_stand_in_imports(source: str) -> str:
    """Inductor's module without its imports from Inductor and Triton (seconds to import).

    Dropped: imports of what the driver stands in for, and imports of Triton or
    Inductor that the module's own code never uses (a GPU module imports
    ``triton`` for its kernels' source strings, which import it themselves
    when they are compiled).
    """
    tree = _parse(source)
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    lines = source.splitlines(keepends=True)
    drop = set()
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
        bound = [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        if all(module.startswith(compat.INDUCTOR_MODULE) or module.split(".")[0] == "triton" for module in modules) and all(
            name in compat.INDUCTOR_STAND_INS or name not in used for name in bound
        ):
            drop.update(range(node.lineno - 1, node.end_lineno))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def _extern_kernel_table(source: str) -> dict[str, str]:
    """Map each extern kernel the graph calls to a torch name that resolves without Inductor."""
    extern_kernels = compat.inductor_extern_kernels()
    table = {}
    for name in sorted(set(re.findall(r"\bextern_kernels\.(\w+)", source))):
        kernel = getattr(extern_kernels, name, None)
        dotted = _torch_name(kernel)
        if dotted is not None:
            table[name] = dotted
    return table


def _torch_name(obj: Any) -> str | None:
    if isinstance(obj, torch._ops.OpOverload):
        namespace, op = obj._schema.name.split("::")
        candidate = f"torch.ops.{namespace}.{op}.{obj._overloadname or 'default'}"
    else:
        candidate = f"torch.{getattr(obj, '__name__', '')}"
    try:
        return candidate if runtime._resolve_dotted(candidate) is obj else None
    except AttributeError:
        return None


# ---------------------------------------------------------------------------
# Render: python_code = header (calling convention) + graph + driver + forward.
# ---------------------------------------------------------------------------


def _describe_call(convention: CallingConvention) -> str:
    """One comment line per argument, for the artifact's header."""
    return "\n".join(f"#   {line}" for line in describe_arguments(convention))


def _render(convention: CallingConvention, lowered: _Lowered) -> str:
    header = f"""\
# torch.compiler.precompile artifact -- format {convention.format_version}, backend {convention.backend!r}.
# Generated by torch {torch.__version__}. Do not edit: the cache is bound to this
# exact text by its sha256, and the constants below are the calling convention.
#
# Load it with:   fn = torch.compiler.precompile.load(python_code, cache)
# Or run it alone (no cache; any kernels are compiled on first use):
#     namespace = {{}}
#     exec(open("this_file.py").read(), namespace)
#     out = namespace["forward"](model, *inputs)
#
# Sections: the constants, then {", ".join(_SECTIONS)}.
# Calling convention (positional arguments only):
{_describe_call(convention)}
# Pass the model(s) again at every call; no weights are stored here.

{_NO_BYTECODE}
CALLING_CONVENTION = {pprint.pformat(convention.to_literal(), width=100, sort_dicts=False)}
{lowered.header_code}"""
    forward = (
        "# Binds the graph to the driver.  load() passes its driver (the installed\n"
        "# torch._precompile_runtime when it is the driver section's exact text), the\n"
        "# cached kernels' files and the calling convention it already decoded and\n"
        "# validated; run alone, the driver section above, no files, and it is decoded here.\n"
        '_driver = globals().get("__precompile_driver__") or globals()\n'
        '_kernel_files = globals().get("__precompile_kernel_files__", {})\n'
        + lowered.bind_code
        + '_convention = globals().get("__precompile_convention__") or _driver["CallingConvention"].from_literal(\n'
        "    CALLING_CONVENTION\n"
        ")\n"
        'forward = _driver["PrecompiledFunction"](\n'
        '    _convention, _run_graph, _driver["materialize_constants"](_convention.constants)\n'
        ")\n"
    )
    sections = {"graph": lowered.graph_code, "driver": _driver_source(driver_parts(convention)), "forward": forward}
    _check_names_disjoint(header, sections)
    return header + "".join(_marker(name) + sections[name] for name in _SECTIONS)


def _check_names_disjoint(header: str, sections: dict[str, str]) -> None:
    """Run alone, the sections share one namespace: the driver must not rebind a name the others bind."""
    driver = _driver_names()
    others: dict[str, str | None] = {}
    for source in (header, sections["graph"], sections["forward"]):
        others.update(_top_level_names(source))
    # The same import twice is harmless; anything else would rebind the other's name.
    clashes = sorted(
        name for name in driver.keys() & others.keys() if driver[name] is None or driver[name] != others[name]
    )
    if clashes:
        raise AssertionError(f"the driver section rebinds names the artifact's other sections bind: {clashes}")


@functools.lru_cache(maxsize=None)
def _driver_names() -> dict[str, str | None]:
    return _top_level_names(_driver_source())


def _top_level_names(source: str) -> dict[str, str | None]:
    """Names a module binds at top level -> the module an import binds there (None: anything else)."""
    names: dict[str, str | None] = {}

    def visit(statements: list) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.name if alias.asname else alias.name.partition(".")[0]
                    names[alias.asname or bound] = bound
            elif isinstance(node, ast.ImportFrom):
                names.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = None
            elif isinstance(node, (ast.If, ast.Try)):  # as the driver's choice of PrecompileError
                handlers = [handler.body for handler in getattr(node, "handlers", [])]
                for block in (node.body, node.orelse, getattr(node, "finalbody", []), *handlers):
                    visit(block)
            else:  # assignments; over-approximated for other compound statements
                names.update(dict.fromkeys(_stored_names(node)))

    visit(_parse(source).body)
    return names


def _stored_names(node: ast.stmt) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
