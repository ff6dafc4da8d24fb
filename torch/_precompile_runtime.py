"""Runtime driver of a ``torch.compiler.precompile`` artifact.

This file (its core, and of its marked optional parts those an artifact
uses), after the schema (``_precompile_schema.py``), is embedded verbatim into
every artifact's ``python_code``; it is also an ordinary module so that it can
be linted and unit-tested.  It must therefore depend on nothing but the
standard library and ``torch`` itself: an artifact runs in a fresh interpreter
where only torch is installed.

The driver enforces the runtime half of Note [precompile programming model]
(see ``torch/_precompile.py``): every call is checked against the artifact's
``CallingConvention`` before the captured graph runs.  ``PrecompiledFunction``
runs a call through one part per concern, each with a fast test on the
per-call path, a check that raises the PrecompileError naming what differs,
and the list of what it checks (``PrecompiledFunction.checks``): ``Binding``,
``GlobalState``, ``ModuleArguments`` (module structure, values read, hooks,
tied weights), ``UserInputs`` (structure, values, tensor layouts, free sizes,
aliasing), ``Gradients`` (the incoming ``.grad``, in its own part); then the
graph, then ``ResultWriter`` (optimizer state, ``.grad`` through ``Gradients``,
outputs that alias inputs, input objects fn rebinds).  The warm path needs
neither ``torch._inductor`` nor ``torch._dynamo``; they are imported only when
a kernel has to be compiled because the cache did not provide it.
"""
import ast
import base64
import collections
import contextlib
import functools
import hashlib
import importlib.util
import itertools
import json
import operator
import os
import sys
import threading
import types
import warnings
import weakref
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.nn.modules import module as _nn_module
from torch.optim import optimizer as _optim_module
from torch.utils.hooks import RemovableHandle


# ---------------------------------------------------------------------------
# --- torch 2.11-2.14 internals the driver relies on (see torch/_precompile_compat.py) ---
# The driver runs inside artifacts where only torch is installed, so it cannot
# import the compat module: every private torch name it uses is bound here,
# once, at module level (the per-call path pays no extra lookup), with what
# those releases lack.  test/test_precompile_compat.py pins each against the installed
# torch and checks that the rest of this file uses none of them directly.
# ---------------------------------------------------------------------------

# Dynamo's C++ tensor check (type, dtype, device, sizes/strides with free
# entries, requires_grad, dispatch keys) in one call; no public API as of 2.13.
_TensorGuards = torch._C._dynamo.guards.TensorGuards
try:
    # The same check, ~6x cheaper a tensor, with the module state lookup in the
    # same call, and the module cache's re-verification in one C loop
    # (torch_precompile/csrc/layout_guard.cpp): built by this package's
    # setup.py against this torch, whose version names it (and is checked again
    # at import).  Optional: an artifact run where only torch is installed, or
    # under another torch, uses TensorGuards and _entries_unchanged in Python.
    _C = importlib.import_module("torch_precompile._C_" + "".join(c if c.isalnum() else "_" for c in torch.__version__))
except ImportError:
    _C = None
# The extension's ABIs this driver was written against (its ABI_VERSION moves with any change
# of a signature or meaning): 1 (LayoutGuard, entries_unchanged), 2 (tuple lengths,
# dict_version), 3 (gather() None under a torch function or dispatch mode).  Any other, a
# build newer than the driver an artifact carries, is not used.
DRIVER_ABIS = (1, 2, 3)
if getattr(_C, "ABI_VERSION", 1) not in DRIVER_ABIS:
    _C = None
_LayoutGuard = _C.LayoutGuard if _C is not None else None
# Where LayoutGuard.gather() does not see the modes, every call tests them in Python.
_MODES_UNSEEN_BY_GATHER = getattr(_C, "ABI_VERSION", 1) < 3
# Whether two tensors share a storage (overlapping or not); no public API as of 2.13.
_is_alias_of = torch._C._is_alias_of
# Read or set at every call: the C functions behind torch.set_grad_enabled (a
# context-manager class) and torch.is_autocast_enabled(device) (one per device).
_set_grad_enabled = torch._C._set_grad_enabled
_is_any_autocast_enabled = torch._C._is_any_autocast_enabled
# Runs ops below autocast (its dispatch keys excluded) on every device: the
# graph of an artifact captured under autocast holds its casts already.
_DisableAutocast = torch._C._DisableAutocast
# The innermost torch.autograd.graph.saved_tensors_hooks(pack, unpack) pair, or
# None; its argument says whether to ignore Dynamo's compiled autograd (a flag
# since 2.5).  Read per call of an artifact that runs autograd; private in 2.13.
_saved_tensors_hooks = functools.partial(torch._C._autograd._top_saved_tensors_default_hooks, False)
# Whether any TorchFunctionMode is active (``with torch.device(...)`` and
# torch.set_default_device push one, torch.utils._device.DeviceContext; False
# inside DisableTorchFunction, where eager runs none either) and how many
# TorchDispatchModes are (user modes and infra modes such as FakeTensorMode):
# read at every call, the graph bypasses them (Note invariant 11).  The stacks'
# entries name the innermost one in the PrecompileError.  Private in 2.11-2.14.
_is_torch_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_len_torch_dispatch_stack = torch._C._len_torch_dispatch_stack
_len_torch_function_stack = torch._C._len_torch_function_stack
_get_function_stack_at = torch._C._get_function_stack_at
_get_dispatch_stack_at = torch._C._get_dispatch_stack_at


def _modes_active() -> bool:
    """Whether a torch function or dispatch mode is active (the per-call chain inlines this test)."""
    return bool(_is_torch_function_mode_enabled() or _len_torch_dispatch_stack())


# __torch_function__ of Parameter & co. (traced through dispatch); private in 2.13.
_disabled_torch_function_impl = torch._C._disabled_torch_function_impl

# nn.Module's own dicts of parameters, buffers and children: the driver caches
# them and re-reads entries at every call; 2.13 has no public view of them.
_CHILDREN = "_modules"
_children = operator.attrgetter(_CHILDREN)
_TENSOR_TABLES = ("_parameters", "_buffers")  # the attributes holding those dicts (watched by identity)


def _owner_dict(module: torch.nn.Module, fqn: str, kind: str) -> tuple[dict, str]:
    *path, leaf = fqn.split(".")
    owner = module
    for part in path:
        owner = owner._modules[part]
    table = owner._parameters if kind == "parameter" else owner._buffers
    return table, leaf


# Hooks run by eager but not by the graph (Note invariant 11); keyed by the
# attribute holding them.  torch 2.11-2.14 register hooks publicly but cannot list
# them: private attributes of nn.Module, Tensor, torch.nn.modules.module
# (``_global`` + the module attribute) and Optimizer.
_MODULE_HOOKS = {
    "_forward_pre_hooks": "forward pre-hook",
    "_forward_hooks": "forward hook",
    "_backward_pre_hooks": "backward pre-hook",
    "_backward_hooks": "backward hook",
}
_TENSOR_HOOKS = {"_backward_hooks": "gradient hook", "_post_accumulate_grad_hooks": "post-accumulate-grad hook"}
MODULE_HOOK_DICTS = tuple(_MODULE_HOOKS)  # what nn.Module.__call__ reads of a module it calls
# Marks an instance ``forward`` that calls the artifacts themselves (generation.serving()'s):
# it stands for the class's forward the graph holds, where another instance forward is refused.
SERVES_ARTIFACTS = "__precompile_serves_artifacts__"


def _global_module_hooks(attribute: str) -> Any:
    return getattr(_nn_module, "_global" + attribute, None)


def _optimizer_step_hooks(optimizer: Any) -> str | None:
    """Which step hooks eager's ``optimizer.step()`` would run, or None."""
    # Per call of an artifact taking an optimizer: plain attribute reads (an
    # operator.attrgetter + any() measured 3x slower than this call).
    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
        return "it has step hooks"
    if _optim_module._global_optimizer_pre_hooks or _optim_module._global_optimizer_post_hooks:
        return "torch.optim has global step hooks (register_optimizer_step_pre_hook / _post_hook)"
    return None


# Inductor's compiled kernels: their PyInit_kernel reads the address of the
# tensor data-pointer accessor from this environment variable, as
# CppPythonBindingsCodeCache._load_library_inner sets it; private in 2.13.
_KERNEL_DATA_PTR_ENV = "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"
_KERNEL_DATA_PTR = str(torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)
# What Inductor's generated module imports from torch._inductor (private in
# 2.13), for the stand-ins at the end of this file: ALIGN_BYTES of
# torch._inductor.utils._align, and the cold path's compiler, its vector ISA and extern kernels.
_INDUCTOR_ALIGN_BYTES = 64


def _inductor_compile_kernel(argtypes: list[str], source: str) -> Callable:
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    return CppPythonBindingsCodeCache.load_pybinding(argtypes, source)


def _inductor_vec_isas() -> tuple[tuple[str, int], dict[str, int]]:
    """(name, bit width) of the vector ISA Inductor picks here, and name -> bit width of those this machine runs."""
    from torch._inductor.cpu_vec_isa import invalid_vec_isa, pick_vec_isa, valid_vec_isa_list

    picked = pick_vec_isa()
    runnable = {str(isa): isa.bit_width() for isa in (*valid_vec_isa_list(), invalid_vec_isa)}
    return (str(picked), picked.bit_width()), runnable


@contextlib.contextmanager
def _inductor_simdlen(width: int):
    """Inductor compiles for this machine's first ISA of ``width`` bits (cpp.simdlen; 0: none).

    Among the ISAs a machine runs, that one has the recorded ISA's width and
    vector macros (x86: AMX and VNNI extend AVX512's flags, and -march=native
    already enables them), so the C++ compiles as it was generated.
    """
    from torch._inductor import config

    with config.patch({"cpp.simdlen": width}):
        yield


def _inductor_extern_kernels() -> Any:
    from torch._inductor.select_algorithm import extern_kernels

    return extern_kernels


def _inductor_compile_triton(kernel_name: str, source: str, device_str: str) -> Any:
    """Inductor's CachingAutotuner for one Triton kernel (the cold path: imports Inductor and Triton)."""
    from torch._inductor.async_compile import AsyncCompile

    kernel = AsyncCompile().triton(kernel_name, source, device_str)
    # With compile worker processes Inductor hands back a future of the autotuner.
    return kernel if hasattr(kernel, "run") else kernel.result()


def _static_cuda_launcher() -> Any:
    # torch._C._StaticCudaLauncher (2.11-2.14): what Inductor's StaticallyLaunchedCudaKernel
    # calls to load a cubin (_load_kernel) and launch it (_launch_kernel); no public API.
    return torch._C._StaticCudaLauncher


# Hooks on a parameter's AccumulateGrad node (``node.register_hook`` /
# ``register_prehook``, as Horovod-style reducers add them) run when eager's
# backward accumulates the parameter's gradient.  torch 2.11-2.14 cannot list a
# node's hooks from Python (gc.get_referents sees them only while nothing else
# owns the node): registering a probe hands back a handle on the node's one
# dict of Python hooks (registerFunctionHook reuses it), so any other entry is
# someone else's hook.  Hooks added from C++ (DDP's Reducer) are not in it.
_NODE_HOOK_REGISTRATIONS = (("register_prehook", "pre-hook"), ("register_hook", "hook"))


def _probe(*_: Any) -> None:
    return None


def _hook_probe_counter() -> tuple[list, Any]:
    """``[n]``: RemovableHandles the drivers' probes made, process-wide (so a probe is no new
    hook); and the lock that makes a probe's handle and its count one step for other threads."""
    counter = getattr(RemovableHandle, "_precompile_probes", None)
    if counter is None:
        counter = [0]
        RemovableHandle._precompile_probes = counter
    lock = getattr(RemovableHandle, "_precompile_probe_lock", None)
    if lock is None:
        lock = RemovableHandle._precompile_probe_lock = threading.RLock()  # a finalizer may call a runnable
    return counter, lock


_HOOK_PROBES, _HOOK_PROBE_LOCK = _hook_probe_counter()


def accumulate_grad_hooks(tensor: torch.Tensor) -> list[str]:
    """Kinds of the Python hooks on the AccumulateGrad node of leaf ``tensor`` ([] for none).

    Reusable for any wrapper that reaches parameters (DDP-style reducers); it
    leaves an empty hook dict on a node that someone else keeps alive.
    """
    if not (tensor.requires_grad and tensor.is_leaf):
        return []
    node = torch.autograd.graph.get_gradient_edge(tensor).node
    kinds = []
    for register, kind in _NODE_HOOK_REGISTRATIONS:
        with _HOOK_PROBE_LOCK:  # hook_epoch() never sees the handle without its count
            handle = getattr(node, register)(_probe)
            _HOOK_PROBES[0] += 1
        if len(handle.hooks_dict_ref()) > 1:
            kinds.append(kind)
        handle.remove()
    return kinds


# DistributedDataParallel (Note invariant 16): its registered Python comm hooks
# (a list; no public reader in 2.11-2.14), the name of any comm hook, built-in
# C++ ones included (only its logging data has it), and the process group a
# group name resolves to (the graph's collectives name their group).
_DDP_COMM_HOOKS = "_comm_hooks"


def _ddp_comm_hook_name(ddp: Any) -> str | None:
    return ddp._get_ddp_logging_data().get("comm_hook")


def _ddp_reduced_parameters(ddp: Any) -> frozenset:
    """ids of the parameters DDP's reducer averages, fixed when DDP was constructed (its
    buckets' parameters).  The only reader allocates zeros the size of all the buckets, so
    it runs once per reducer, whose buckets hold those parameters (their ids stay theirs)."""
    reducer = ddp.reducer
    if reducer not in _REDUCED_BY_REDUCER:
        buckets = reducer._get_zeros_like_grad_buckets()
        _REDUCED_BY_REDUCER[reducer] = frozenset(id(p) for bucket in buckets for p in bucket.parameters())
    return _REDUCED_BY_REDUCER[reducer]


_REDUCED_BY_REDUCER: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _resolve_process_group(group_name: str) -> Any:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


# A 2-D mesh's groups differ from rank to rank (rank 0's data-parallel group is not
# rank 1's), so the graph's collectives name rank 0's; on a rank outside that group the
# name is unknown, and the driver registers it for this rank's group on the same mesh dim.
# c10d's name registry has no public writer in 2.11-2.14.
def _process_group_known(group_name: str) -> bool:
    try:
        _resolve_process_group(group_name)
    except RuntimeError:  # "Could not resolve the process group registered under the name ..."
        return False
    return True


def _register_process_group(group_name: str, group: Any) -> None:
    from torch._C._distributed_c10d import _register_process_group

    _register_process_group(group_name, group)


# The mesh a device mesh was sliced from (itself if none): the same on every rank, where
# the slice holds this rank's row or column.  DeviceMesh._get_root_mesh in 2.13-2.14,
# _mesh_resources.get_root_mesh before (deprecated from 2.13).
def root_mesh_ranks(mesh: Any) -> tuple:
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else sys.modules[type(mesh).__module__]._mesh_resources.get_root_mesh(mesh)
    return tuple(root.mesh.flatten().tolist())


# fully_shard's (FSDP2) forward pre- and post-hook on each module it sharded: methods of
# its FSDPState; the graph does what they do (Note invariant 17).  Private in 2.11-2.14.
# None until torch.distributed.fsdp is imported (no module has them before).
def is_fully_shard_hook(hook: Any) -> bool:
    state = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_state")
    return state is not None and getattr(hook, "__func__", None) in (
        state.FSDPState._pre_forward,
        state.FSDPState._post_forward,
    )


# A fully_shard module's MixedPrecisionPolicy (on its FSDPState; its forward hooks' __self__).
def fully_shard_policy(state: Any) -> Any:
    return state._mp_policy


# The fully_shard state of a module it sharded (FSDPModule._get_fsdp_state), or None, and
# its parameter groups (a list from 2.13, one group or None before).  Private in 2.11-2.14.
def fully_shard_state(module: Any) -> Any:
    get_state = getattr(type(module), "_get_fsdp_state", None)
    return get_state(module) if get_state is not None else None


def fully_shard_param_groups(state: Any) -> list:
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)


# A parameter group's settings (attributes of the private FSDPParamGroup, set by
# FSDPModule's setters) that change what a step computes, with the values the
# graph assumes (set_gradient_divide_factor, set_reduce_scatter_unused_params,
# set_all_reduce_hook); an attribute a release lacks reads as its default.
_FULLY_SHARD_DEFAULTS = (("gradient_divide_factor", None), ("reduce_scatter_unused_params", False), ("_all_reduce_hook", None))
# Its collectives' objects (set_custom_all_gather, set_custom_reduce_scatter): torch's own
# compute what the graph's collectives do, a caller's may compute anything.
_FULLY_SHARD_COMMS = ("_all_gather_comm", "_reduce_scatter_comm")


# A DTensor's local shard, a slot of this name; no public API returns that tensor
# itself (to_local() is a view made through autograd) as of 2.14.
DTENSOR_LOCAL = "_local_tensor"


def local_shard_of(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor itself."""
    return getattr(tensor, DTENSOR_LOCAL, tensor)


# Whether DDP broadcasts buffers before forward: the instance attribute
# ``broadcast_buffers`` in 2.11-2.12, ``forward_sync_buffers`` from 2.13.
_DDP_BUFFER_SYNC = ("forward_sync_buffers", "broadcast_buffers")


# Under torch.compile a loaded artifact's call is opaque: its checks must run,
# not become Dynamo guards.  ``_torchdynamo_disable`` (what torch._dynamo.disable
# sets on its wrapper) makes a traced call graph-break instead of inlining the
# driver, and the code's exec strategy SKIP/SKIP runs that call and every frame
# under it eagerly.  Both are set on the function itself, so no wrapper is on the
# per-call path and torch._dynamo is not imported.  Private in 2.11-2.14.
def opaque_to_dynamo(function: Callable) -> Callable:
    function._torchdynamo_disable = True
    function._torchdynamo_disable_msg = (
        "a loaded torch.compiler.precompile artifact runs eagerly, with its own checks; "
        "call it outside fullgraph=True code"
    )
    eval_frame = torch._C._dynamo.eval_frame
    skip = eval_frame._FrameAction.SKIP
    eval_frame.set_code_exec_strategy(function.__code__, eval_frame._FrameExecStrategy(skip, skip))
    return function


# --- end of torch 2.11-2.14 internals ---


if __name__.endswith("._precompile_runtime"):
    # The installed module.  In an artifact the schema's text comes first in the
    # driver section (one namespace), so these names are already there.
    from ._precompile_schema import (
        autocast_dtypes,
        autocast_state,
        call_signature,
        CallingConvention,
        class_name,
        ConstantSpec,
        DataParallelSpec,
        describe_literal,
        _describe_sizes,
        _device,
        _dtype,
        matches,
        MEMORY_FORMATS,
        MISSING,
        OPTIMIZER_STATE_KEYS,
        OptimizerSpec,
        PrecompileError,
        Record,
        same_value,
        ShardSpec,
        TensorSpec,
    )


# ---------------------------------------------------------------------------
# Structures at call time: leaf paths and dict order (Note invariant 3)
# ---------------------------------------------------------------------------


def leaf_paths(spec: pytree.TreeSpec) -> list[tuple]:
    """The pytree key path of each leaf of ``spec``.

    Read through the node types' ``flatten_with_keys_fn`` on a copy of the
    tree rebuilt with a distinct placeholder tensor per leaf (not None: a
    node type may flatten None into its context, as transformers' caches do,
    and come back with fewer leaves).  Where that copy does not give back
    exactly the placeholders, in order (a node registered without keys, a
    context only compared, an unflatten that computes), each leaf is named
    by position (by field for a namedtuple, by key for a dict).
    """
    placeholders = [torch.empty(()) for _ in range(spec.num_leaves)]
    try:
        keyed = pytree.tree_flatten_with_path(pytree.tree_unflatten(placeholders, spec))[0]
        if len(keyed) == len(placeholders) and all(map(operator.is_, (leaf for _, leaf in keyed), placeholders)):
            return [path for path, _ in keyed]
    except Exception:  # whatever a node's unflatten or missing flatten_with_keys_fn raises
        pass
    paths: list = []
    _walk_leaf_paths(spec, (), paths)
    return paths


def _walk_leaf_paths(spec: pytree.TreeSpec, path: tuple, paths: list) -> None:
    if spec.is_leaf():
        paths.append(path)
        return
    context = spec.context
    for index, child in enumerate(spec.children()):
        if spec.type in (dict, collections.OrderedDict):
            key = pytree.MappingKey(context[index])
        elif isinstance(context, type) and hasattr(context, "_fields"):
            key = pytree.GetAttrKey(context._fields[index])
        else:
            key = pytree.SequenceKey(index)
        _walk_leaf_paths(child, (*path, key), paths)


def typed_contexts(spec: pytree.TreeSpec) -> list:
    """(pre-order node index, context) of each node of ``spec`` whose context holds numbers:
    TreeSpec's ``==`` does not tell ``1`` from ``1.0`` and ``True``, or ``0.0`` from ``-0.0``,
    while fn may compute with the context (a flatten that keeps attributes there)."""
    return [(index, node.context) for index, node in enumerate(_preorder(spec)) if _holds_numbers(node.context)]


def _preorder(spec: pytree.TreeSpec) -> list:
    nodes = [spec]
    for child in spec.children():
        nodes += _preorder(child)
    return nodes


def _holds_numbers(value: Any) -> bool:
    if type(value) in (bool, int, float):
        return True
    if type(value) in (tuple, list):
        return any(map(_holds_numbers, value))
    return type(value) is dict and any(map(_holds_numbers, value.values()))


def same_context(got: Any, want: Any) -> bool:
    """A context as captured, by ``same_value``'s rules (``True`` is not ``1``, ``-0.0`` not ``0.0``) throughout."""
    if type(got) is not type(want):
        return False
    if type(want) in (tuple, list):
        return len(got) == len(want) and all(map(same_context, got, want))
    if type(want) is dict:
        return got.keys() == want.keys() and all(same_context(got[key], value) for key, value in want.items())
    return same_value(got, want)


def check_contexts(where: str, spec: pytree.TreeSpec, typed: list) -> None:
    """``spec`` (equal to the captured one by ``==``) has the captured ``typed`` contexts (``typed_contexts``)."""
    nodes = _preorder(spec)
    for index, want in typed:
        got = nodes[index].context
        if not same_context(got, want):
            raise PrecompileError(
                f"{where}: a {class_name(nodes[index].type)} node's context is {got!r}, but was {want!r} at capture "
                "(fn may compute with it, and 1 is not 1.0 nor True, -0.0 is not 0.0): pass the captured values, "
                "or precompile again"
            )


def structure_difference(want: pytree.TreeSpec, got: pytree.TreeSpec, path: str) -> str:
    """Where the caller's structure first differs from the captured one, for the refusal to
    lead with: a cache's spec prints every attribute of every layer."""
    if want.type is not got.type or (want.type is collections.namedtuple and want.context is not got.context):
        return f"{path} is a {_node_class(got)}, but was a {_node_class(want)} at capture"
    if want.context != got.context:
        where, captured, now = _context_difference(want.context, got.context, "")
        at = f" at {where}" if where else ""
        return f"{path} ({want.type.__name__}) has {now} in its context{at}, but {captured} at capture"
    wanted, passed = want.children(), got.children()
    if len(wanted) != len(passed):
        return f"{path} ({want.type.__name__}) has {len(passed)} children, but {len(wanted)} at capture"
    for index, (a, b) in enumerate(zip(wanted, passed)):
        if a != b:
            key = want.context[index] if want.type is dict else index
            return structure_difference(a, b, f"{path}[{key!r}]")
    return f"{path} differs"


def _node_class(spec: pytree.TreeSpec) -> str:
    if spec.is_leaf():
        return "leaf"
    return class_name(spec.context if spec.type is collections.namedtuple else spec.type)  # a namedtuple's class is its context


def _context_difference(captured: Any, now: Any, where: str) -> tuple:
    """(key path, captured value, value now) of the first difference between two contexts,
    descending through the dicts and lists a context is made of (transformers' caches)."""
    if type(captured) is type(now) is dict:
        for key in [*captured, *(k for k in now if k not in captured)]:
            if key not in now or key not in captured:
                return f"{where}[{key!r}]", _short(captured, key), _short(now, key)
            if captured[key] != now[key]:
                return _context_difference(captured[key], now[key], f"{where}[{key!r}]")
    if type(captured) is type(now) is list and len(captured) == len(now):
        for index, (a, b) in enumerate(zip(captured, now)):
            if a != b:
                return _context_difference(a, b, f"{where}[{index}]")
    return where, _short(captured), _short(now)


def _short(value: Any, key: Any = None) -> str:
    """``value`` (its ``key``, where given) as a refusal shows it."""
    if key is not None:
        if key not in value:
            return "nothing"
        value = value[key]
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def conform_dict_order(value: Any, spec: pytree.TreeSpec, path: str, ordered: frozenset) -> Any:
    """``value`` with each plain dict's keys put in ``spec``'s (the captured) order.

    fn reads a dict input by key unless capture saw it observe the order
    (``ordered``: the paths of those dicts), so a dict with the same keys in
    another order computes the same; other keys, or another order where the
    order was observed, are refused.  Recurses through plain tuples, lists
    and dicts, as capture's probe does.
    """
    kind = type(value)
    if spec.is_leaf() or kind is not spec.type or kind not in (dict, list, tuple):
        return value
    if kind is dict:
        keys = spec.context
        if list(value) != keys:
            if value.keys() != set(keys):
                raise PrecompileError(
                    f"{path}: a dict with keys {list(value)}, but it had keys {keys} at capture (the artifact "
                    "maps dict inputs by key): pass the captured keys, or precompile again"
                )
            if path in ordered:
                raise PrecompileError(
                    f"{path}: its keys come in the order {list(value)}, but were {keys} at capture, and fn "
                    "observed that order (it iterated over the dict, e.g. items(), values(), ** or a for "
                    "loop), so it is baked into the artifact: pass the keys in the captured order"
                )
        return {
            key: conform_dict_order(value[key], child, path + pytree.keystr((pytree.MappingKey(key),)), ordered)
            for key, child in zip(keys, spec.children())
        }
    if len(value) != spec.num_children:
        return value
    return kind(conform_dict_order(v, child, f"{path}[{i}]", ordered) for i, (v, child) in enumerate(zip(value, spec.children())))


def unflatten_substituting(leaves: list, spec: pytree.TreeSpec, substitutes: dict) -> Any:
    """``tree_unflatten(leaves, spec)``, except that the node at each pre-order
    index in ``substitutes`` is that object instead of a rebuilt one, and a
    ``torch.Size`` comes back as one, as fn returned it."""
    return _build_substituting(spec, iter(leaves), itertools.count(), substitutes)


def _build_substituting(spec: pytree.TreeSpec, leaves: Any, counter: Any, substitutes: dict) -> Any:
    # A module-level function, not a closure calling itself: that would be a reference
    # cycle keeping ``substitutes`` (the caller's objects) alive until a garbage collection.
    index = next(counter)
    if spec.is_leaf():
        return next(leaves)
    if index in substitutes:  # its subtree's leaves and nodes are skipped, not rebuilt
        _skip(leaves, spec.num_leaves)
        _skip(counter, spec.num_nodes - 1)
        return substitutes[index]
    children = [_build_substituting(child, leaves, counter, substitutes) for child in spec.children()]
    if spec.type is torch.Size:  # torch's pytree rebuilds a Size as a plain tuple
        return torch.Size(children)
    return pytree.SUPPORTED_NODES[spec.type].unflatten_fn(children, spec.context)


def _skip(iterator: Any, count: int) -> None:
    if count > 0:
        next(itertools.islice(iterator, count - 1, None), None)


# ---------------------------------------------------------------------------
# Runtime checks
# ---------------------------------------------------------------------------


def _checked_strides(spec: TensorSpec, exact: bool = False) -> list[int | None]:
    """Strides the graph relies on, on every backend (the trace bakes layout-dependent
    decisions: ``.contiguous()`` of a contiguous tensor is an alias, ``reshape`` a view).

    Empty tensors may have any stride, and so may every dim of a spec without
    strides (``stride is None``: an input with free dims, whose layout is
    pinned as a memory format, or an eager artifact written before strides
    were recorded on every backend).  Size-1 dims may too, unless ``exact``:
    a module's own tensors, whose size-1 strides torch reads to pick a memory
    format (a 1x1 convolution's weight moved to channels_last differs from
    the captured one there alone), while an input's vary with how it was sliced.
    """
    if spec.stride is None or any(s == 0 for s in spec.shape):
        return [None] * len(spec.shape)
    return [
        None if size == 1 and not exact else stride for size, stride in zip(spec.shape, spec.stride)
    ]


def _describe_tensor(spec: TensorSpec, requires_grad_checked: bool, exact: bool = False) -> str:
    """A tensor check as ``PrecompiledFunction.checks`` lists it."""
    strides = _checked_strides(spec, exact)
    layout = ""
    if spec.memory_format:
        layout = f", {spec.memory_format}"
    elif any(s is not None for s in strides):
        layout = ", strides " + _describe_sizes(["*" if s is None else s for s in strides])
    grad = f", requires_grad={spec.requires_grad}" if requires_grad_checked else ""
    return f"{spec.describe()}{layout}{grad}"


# __torch_function__ of tensors whose Python logic the graph does not skip: plain
# tensors' and the disabled one (Parameter, DTensor: traced through dispatch).
_PLAIN_TORCH_FUNCTIONS = (torch.Tensor.__torch_function__.__func__, _disabled_torch_function_impl)


def check_plain_torch_function(what: str, value: torch.Tensor) -> None:
    """A tensor subclass with its own ``__torch_function__`` (Note invariant 11)."""
    override = type(value).__torch_function__
    if getattr(override, "__func__", override) not in _PLAIN_TORCH_FUNCTIONS:
        raise PrecompileError(
            f"{what} is a {type(value).__name__}, a tensor subclass with its own __torch_function__: "
            "its Python logic would run once at capture and the graph would skip it at every call. "
            "Pass a plain tensor (x.as_subclass(torch.Tensor))"
        )


def check_tensor(
    what: str, value: Any, spec: TensorSpec, backend: str, check_requires_grad: bool = False, exact: bool = False
) -> None:
    """Raise a PrecompileError naming ``what`` if ``value`` does not fit ``spec``."""
    if not isinstance(value, torch.Tensor):
        raise PrecompileError(
            f"{what}: expected a Tensor of shape {spec.describe_shape()}, got {type(value).__name__}"
        )
    if value.layout != torch.strided:
        raise PrecompileError(
            f"{what}: expected a dense (strided) Tensor, got layout {value.layout}; "
            "pass .to_dense()"
        )
    check_plain_torch_function(what, value)
    shape = tuple(value.shape)
    if shape != spec.shape and (  # equal tuples: the common case, one comparison
        len(shape) != len(spec.shape) or any(want is not None and want != got for want, got in zip(spec.shape, shape))
    ):
        raise PrecompileError(
            f"{what}: expected shape {spec.describe_shape()}, got {shape}; shapes are "
            "specialized at capture (mark a dim with torch._dynamo.decorators.mark_unbacked "
            "before precompile() to let it vary)"
        )
    for dim, _, low, high in spec.free_dims:
        size = shape[dim]
        if size < low or (high is not None and size > high):
            raise PrecompileError(
                f"{what}: dim {dim} has size {size}, outside the bounds "
                f"[{low}, {'inf' if high is None else high}] it was marked with"
            )
    if value.dtype != _dtype(spec.dtype):
        raise PrecompileError(
            f"{what}: expected dtype torch.{spec.dtype}, got {value.dtype}; convert it with .to(torch.{spec.dtype})"
        )
    if value.device != _device(spec.device):
        raise PrecompileError(
            f"{what}: expected device {spec.device}, got {value.device}; move it with .to('{spec.device}')"
        )
    if backend == "inductor" and (value.is_conj() or value.is_neg()):
        bit, fix = ("conjugate", "resolve_conj") if value.is_conj() else ("negative", "resolve_neg")
        raise PrecompileError(
            f"{what}: the tensor has a lazy {bit} bit (a view such as x.conj() or torch._neg_view), "
            f"which backend 'inductor' kernels do not apply: pass x.{fix}(), or precompile with "
            "backend='eager'"
        )
    if check_requires_grad and value.requires_grad != spec.requires_grad:
        raise PrecompileError(
            f"{what}: requires_grad was {spec.requires_grad} at capture, got {value.requires_grad}; "
            "the graph was traced with it (which tensors get gradients, or fn's read of .requires_grad), "
            f"so eager would compute otherwise: set requires_grad_({spec.requires_grad}), or "
            "precompile again with the tensors as they are now"
        )
    if spec.memory_format is not None and not value.is_contiguous(memory_format=MEMORY_FORMATS[spec.memory_format]):
        raise PrecompileError(
            f"{what}: expected a tensor in {spec.memory_format} memory format (it has free dims, "
            f"so its layout is pinned as a format), got strides {tuple(value.stride())}; pass "
            f".contiguous(memory_format=torch.{spec.memory_format})"
        )
    got = value.stride()
    if got == spec.stride:  # the common case: exactly the captured strides
        return
    want = _checked_strides(spec, exact)
    if any(w is not None and w != g for w, g in zip(want, got)):
        expected = tuple("*" if w is None else w for w in want)
        raise PrecompileError(
            f"{what}: expected strides {expected}, got {tuple(got)}; the graph is specialized "
            "to the captured memory layout (its trace decided .contiguous(), reshape and "
            "is_contiguous() for it): pass a tensor with that layout (e.g. .contiguous()), or "
            "precompile with an example in this layout"
        )


def _structure_counter() -> list:
    """``[n]``, bumped whenever any nn.Module registers a submodule, parameter or buffer.

    The driver caches where each lifted tensor lives (the owning module's
    ``_parameters`` / ``_buffers`` dict); replacing ``model.fc1`` or registering a
    new parameter must invalidate that, or stale weights are used silently.
    One counter per process, shared by every artifact.

    Not bumped while Dynamo traces (Note invariant 10): torch.compile would
    guard on the counter and recompile at every call of a model that
    registers modules in its forward (``self.layers[:n]`` slices a
    ModuleList); a registration that outlives the compiled frame is replayed
    by Dynamo's side-effect code, which bumps it for real.
    """
    import torch.nn.modules.module as module_module

    counter = getattr(module_module, "_precompile_structure_counter", None)
    if counter is None:
        counter = [0]

        def bump(*_: Any) -> None:  # returns None: the registration is unchanged
            # Looked up per call: in-tree, torch.compiler does not exist yet when this runs.
            if not torch.compiler.is_dynamo_compiling():
                counter[0] += 1

        module_module.register_module_module_registration_hook(bump)
        module_module.register_module_parameter_registration_hook(bump)
        module_module.register_module_buffer_registration_hook(bump)
        module_module._precompile_structure_counter = counter
    return counter


_STRUCTURE = _structure_counter()

# Read at every call: bound once, saving the attribute lookups (and
# _set_grad_enabled, _is_any_autocast_enabled in the internals section).
_is_grad_enabled = torch.is_grad_enabled
_is_anomaly_enabled = torch.is_anomaly_enabled
_is_inference_mode_enabled = torch.is_inference_mode_enabled
_get_default_dtype = torch.get_default_dtype
_increment_version = torch.autograd.graph.increment_version


class _ModuleCache(Record):
    """What the driver checked about the module arguments, re-verified cheaply.

    Cached per tuple of module ids, dropped by a weakref callback when a
    module dies (so a live entry's ids are the same module objects). Edits
    through the nn.Module API bump ``_STRUCTURE``; edits that bypass the
    registration hooks are caught by the C-level comparisons in
    ``watched_unchanged()``: ``del model.fc2`` and
    ``ModuleDict.pop`` change a ``_modules`` dict's length, ``del
    model.layers[1]`` (and so ``del`` + ``insert`` reorders) replaces it,
    ``del model.lin.bias`` makes the state lookup miss, and setting a
    checked ``training`` flag or attribute replaces the value object in the
    ``vars()`` of the submodule (or of the config object) holding it, or on
    its class; an element written into a list or dict fn read changes the
    ids of that container's elements; ``module._parameters = {...}`` replaces
    a watched value.
    """

    refs: tuple  # weakrefs to the module arguments, whose callbacks drop this entry
    tables: list  # per lifted tensor: the owning module's _parameters / _buffers dict
    names: list  # ... and its key there
    aliases: list  # (state index, table, name, module index, fqn) of each tied name
    generation: int  # _STRUCTURE[0] when walked
    # Watched entries: the training flags fn reads, every step of the attribute
    # paths fn reads (an absent entry too: a class attribute the instance may
    # come to shadow), the ``_parameters`` / ``_buffers`` dicts holding lifted
    # tensors, and the ``_modules`` dict of every submodule that has children.
    watched_vars: list  # vars() of the submodule or object holding each watched entry
    watched_keys: list  # ... the entry's name
    watched_values: list  # ... the value object checked (or MISSING), compared by identity (a changed value of equal == is caught)
    children: list  # the watched _modules dicts (and DDP comm hook lists), then every (empty) hook dict
    # len() of each child container; for a _modules dict the tuple of its
    # submodules, compared by identity: a replacement that bypasses the
    # registration hooks (a ``_modules`` write; Dynamo's replay of one made in
    # a compiled frame, which the structure counter does not see) is caught.
    lengths: list
    # [hook_epoch()] when a scan of these modules last found no hook, [-1] before
    # one: a rebuilt entry (another instance, a swapped submodule) is rescanned.
    hooks_clean_at: list
    # (class, name) of each class attribute read through an instance.
    class_owners: list
    class_names: list
    class_values: list  # ... their values, held so that their ids are not reused
    # The lists and dicts among the values read, and the vars() of each object
    # whose own __getattribute__ computed a value read (an attribute_map alias).
    containers: list
    container_copies: list  # ... a copy of each, holding its elements
    class_and_element_ids: list  # id() of each class value, then of each container's elements
    # The class of each module and object the walk read: ``m.__class__ = Other`` writes no
    # dict watched above.  The submodules are held as ``lengths`` holds them; the module
    # arguments and the other objects by a weakref (a strong one could keep the module
    # arguments alive), so one that cannot be referenced weakly (__slots__ without
    # __weakref__) is not among them.
    class_objects: list
    class_refs: list
    classes: list  # of class_objects, then of class_refs' referents

    def watched_unchanged(self) -> bool:
        """With ``generation`` still ``_STRUCTURE[0]``: whether the walk this entry records
        still describes the modules (one C-level pass each)."""
        return (
            not self.watched_vars  # a module with no tensors or children whose modes and attributes fn ignores
            or _entries_unchanged(
                self.watched_vars, self.watched_keys, self.watched_values, self.children, self.lengths, MISSING
            )
        ) and (
            not self.class_and_element_ids
            or [*map(id, map(getattr, self.class_owners, self.class_names, _ABSENT)), *map(_element_ids, self.containers)]
            == self.class_and_element_ids
        ) and _classes_unchanged(self.class_objects, self.class_refs, self.classes)


def _weak_refs(objects: Any) -> list:
    """A weakref to each of ``objects`` that can be referenced weakly."""
    refs = []
    for item in objects:
        try:
            refs.append(weakref.ref(item))
        except TypeError:
            pass
    return refs


def _lifted_tensors(cached: _ModuleCache) -> list:
    """The module arguments' lifted tensors, looked up by name now (a KeyError where one was deleted)."""
    return list(map(dict.__getitem__, cached.tables, cached.names))


_ABSENT = itertools.repeat(MISSING)  # dict.get's and getattr's default, for map()


def _size_or_values(container: Any) -> Any:
    """What the module cache compares of a watched container: a dict's version and values
    (its ``_modules``' submodules, by identity; the version skips the comparison while the
    dict is not written), else its length."""
    return (_dict_version(container), *container.values()) if type(container) is dict else len(container)


def _entries_unchanged_in_python(owners: list, keys: list, values: list, sized: list, lengths: list, missing: Any) -> bool:
    """``owners[i].get(keys[i], missing) is values[i]`` for each i and, for each j,
    ``len(sized[j]) == lengths[j]`` or, where that is a tuple, ``sized[j]``'s values are its elements.

    By identity: a new value object of equal ``==`` differs.  ``_entries_unchanged``
    is this, or the same loop in C++ where the extension is built.
    """
    return all(map(operator.is_, map(dict.get, owners, keys, itertools.repeat(missing)), values)) and all(
        len(c) == len(want) - 1 and all(map(operator.is_, c.values(), want[1:])) if type(want) is tuple else len(c) == want
        for c, want in zip(sized, lengths)
    )


# The extension's ABI 2 compares a tuple entry of lengths by version and values; an older
# build (a checkout not yet rebuilt) does not: the Python loop then, which ignores versions.
_ABI_2 = getattr(_C, "ABI_VERSION", 1) >= 2
_entries_unchanged = _C.entries_unchanged if _ABI_2 else _entries_unchanged_in_python
_dict_version = _C.dict_version if _ABI_2 else lambda d: 0


def _classes_unchanged_in_python(objects: list, refs: list, classes: list) -> bool:
    """The classes of ``objects``, then of the weakrefs ``refs``' referents (NoneType for one
    that is gone), are ``classes``."""
    return [*map(type, objects), *map(type, map(weakref.ref.__call__, refs))] == classes


# Added to the extension at ABI 3 (an older build of it lacks it).
_classes_unchanged = getattr(_C, "classes_unchanged", _classes_unchanged_in_python)


NO_PATH = object()  # an attribute path whose owner is gone: matches no recorded value


def _element_ids(container: Any) -> list:
    """id() of a list's elements, or of a dict's keys then values: changed by any write into it."""
    if type(container) is dict:
        return [*map(id, container), *map(id, container.values())]
    return [*map(id, container)]


class ValueReads:
    """What a walk read of the module arguments' plain Python state, to re-verify cheaply."""

    def __init__(self) -> None:
        self.entries: dict = {}  # (id(vars), name) -> (vars, name): each watched dict entry once
        self.classes: dict = {}  # (id(class), name) -> (class, name)
        self.containers: dict = {}  # id -> list or dict
        self.owners: dict = {}  # id -> each object read from, whose class answered the reads

    def read(self, owner: Any, name: str) -> Any:
        """``owner.name`` where it is a plain value in ``vars(owner)`` or on its class, else MISSING."""
        values = getattr(owner, "__dict__", None)
        if type(values) is not dict:
            return MISSING
        self.owners[id(owner)] = owner
        self.entries.setdefault((id(values), name), (values, name))
        value = values.get(name, MISSING)
        if value is MISSING:
            value = class_value(type(owner), name)
            if value is not MISSING:
                self.classes[(id(type(owner)), name)] = (type(owner), name)
            elif computes_attributes(type(owner), name):
                value = getattr(owner, name, MISSING)
                # What it computes from is in vars(owner): any write there re-verifies it.
                self.containers[id(values)] = values
        return value

    def read_path(self, owner: Any, path: str) -> Any:
        """The value at a dotted attribute path (``config.eps``), watching every step;
        MISSING where its last step is absent, NO_PATH where an earlier one is."""
        *steps, last = path.split(".")
        for name in steps:
            owner = self.read(owner, name)
            if owner is MISSING:
                return NO_PATH
        value = self.read(owner, last)
        self._watch_containers(value)
        return value

    def _watch_containers(self, value: Any) -> None:
        if type(value) in (list, dict):
            self.containers[id(value)] = value
        if type(value) in (list, tuple):
            for item in value:
                self._watch_containers(item)
        elif type(value) is dict:
            for item in (*value, *value.values()):
                self._watch_containers(item)


def _describe_read(got: Any) -> str:
    if got is MISSING:
        return "missing"
    if got is NO_PATH:
        return "unreachable (an attribute on its path is missing)"
    return repr(got)


def computes_attributes(cls: type, name: str) -> bool:
    """Whether ``cls``, not a module, defines no ``name`` but its own ``__getattribute__`` /
    ``__getattr__`` may answer it (transformers' PretrainedConfig maps ``hidden_size`` to ``n_embd``)."""
    return (
        not issubclass(cls, torch.nn.Module)
        and (cls.__getattribute__ is not object.__getattribute__ or hasattr(cls, "__getattr__"))
        and not any(name in vars(base) for base in cls.__mro__)
    )


def class_value(cls: type, name: str) -> Any:
    """A plain value (no method, property or other descriptor) ``cls`` or a base defines as ``name``, else MISSING."""
    for base in cls.__mro__:
        if name in vars(base):
            value = vars(base)[name]
            return MISSING if hasattr(type(value), "__get__") else value
    return MISSING


def _forget(cache: dict, key: tuple, _dead_ref: Any) -> None:
    cache.pop(key, None)


def _picker(positions: Any) -> Callable[[Any], tuple]:
    """``seq -> tuple(seq[i] for i in positions)`` as one C call (the driver's hot path)."""
    if not positions:
        return lambda seq: ()
    if len(positions) == 1:  # itemgetter(i) returns the bare item; a slice keeps a tuple
        return operator.itemgetter(slice(positions[0], positions[0] + 1))
    return operator.itemgetter(*positions)


def _leaf_path(i: int, key_path: tuple) -> str:
    return f"args[{i}]" + pytree.keystr(key_path)


def tensor_guard(tensors: list, specs: list, num_exact: int = 0):
    """One C++ check of ``tensors`` against the layout they were fully checked with.

    Sizes and strides the specs leave free (``None``) are not compared (the
    first ``num_exact`` specs' size-1 dims are: ``_checked_strides``);
    type, requires_grad, dtype, device and dispatch keys always are.  The
    guard has ``check(*tensors)`` and ``gather(tables, names, inputs)``
    (``_TensorGuardsGather``): a ``LayoutGuard`` where the extension is
    built and every tensor is a plain strided one, else ``TensorGuards``.
    """
    sizes = [list(s.shape) for s in specs]
    strides = [_checked_strides(s, k < num_exact) for k, s in enumerate(specs)]
    if _LayoutGuard is not None:
        try:
            return _LayoutGuard(list(tensors), sizes, strides)
        except TypeError:  # a tensor subclass with __torch_dispatch__, a sparse or nested tensor
            pass
    return _TensorGuardsGather(_TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides))


class _TensorGuardsGather:
    """TensorGuards with LayoutGuard's interface (torch_precompile/csrc/layout_guard.cpp)."""

    __slots__ = ("check",)

    def __init__(self, guard: Any):
        self.check = guard.check

    def gather(self, tables: list, names: list, inputs: "tuple | list") -> list | None:
        """``[tables[i][names[i]]..., *inputs]`` if they pass ``check``, else None (a missing name too,
        or a torch function or dispatch mode active, as LayoutGuard's)."""
        if _modes_active():
            return None
        try:
            tensors = [*map(dict.__getitem__, tables, names), *inputs]
            return tensors if self.check(*tensors) else None
        except (KeyError, TypeError):  # deleted (the slow path names it); a non-tensor where a tensor was captured
            return None


def named_submodules(positions: Any, modules: Any) -> list:
    """(``args[i].path``, submodule) of every submodule of the module arguments, in named_modules() order."""
    return [
        (f"args[{position}]" + (f".{name}" if name else ""), sub)
        for position, module in zip(positions, modules)
        for name, sub in module.named_modules()
    ]


def hook_epoch() -> int:
    """Moves whenever a hook is registered anywhere: each makes a ``RemovableHandle`` (not counting probes).

    Read under the probes' lock where it is recorded as clean: read while another
    thread's probe had its handle but not yet its count, it would be one too high,
    and the next real hook would bring the epoch back to the recorded value.
    """
    with _HOOK_PROBE_LOCK:
        return RemovableHandle.next_id - _HOOK_PROBES[0]


def find_hook(
    named_modules: Any,
    named_tensors: Any,
    named_accumulated: Any = (),
    parallel_hooks: frozenset = frozenset(),
    library_fixes: dict | None = None,
) -> tuple[str, str | None] | None:
    """Describe a module or tensor hook on what fn receives and, for a library's
    (``library_fixes``: LIBRARY_HOOK_FIXES), how to take it off; or return None.

    ``named_accumulated``: the parameters whose gradient eager's backward
    accumulates, whose AccumulateGrad nodes are probed too.  fully_shard's hooks
    pass, and tensor parallel's where ``parallel_hooks`` holds their (module path,
    hook dict, description).
    """
    for attribute, kind in _MODULE_HOOKS.items():
        for hook in (_global_module_hooks(attribute) or {}).values():
            return (
                f"a global module {kind} ({hook_name(hook)}, registered with "
                f"torch.nn.modules.module.register_module_{kind.replace(' ', '_').replace('-', '_')})"
            ), None
    for path, module in named_modules:
        for attribute, kind in _MODULE_HOOKS.items():
            for hook in (getattr(module, attribute, None) or {}).values():
                if is_fully_shard_hook(hook):
                    continue
                description = parallel_hook_description(hook) if parallel_hooks else None
                if description is None:
                    fix = library_fixes.get(hook_name(hook)) if library_fixes else None
                    return f"{path} has a {kind} ({hook_name(hook)})", fix
                if (path, attribute, description) not in parallel_hooks:
                    raise PrecompileError(
                        f"{path} has a tensor parallel {kind} other than at capture, {description}: the graph "
                        "redistributes as the captured plan did. Parallelize the model with the same plan as "
                        "at capture, or precompile again"
                    )
    for path, tensor in named_tensors:
        for attribute, kind in _TENSOR_HOOKS.items():
            for hook in (getattr(tensor, attribute, None) or {}).values():
                return f"{path} has a {kind} ({hook_name(hook)})", None
    for path, tensor in named_accumulated:
        for kind in accumulate_grad_hooks(tensor):
            return (
                f"{path} has a {kind} on its AccumulateGrad node "
                "(torch.autograd.graph.get_gradient_edge(param).node)"
            ), None
    return None


def hook_name(hook: Any) -> str:
    """Where a hook comes from, for a caller who holds no handle to it: ``module.qualname`` of its
    function (a partial's, a bound method's), or of its class for another callable object."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    named = hook if hasattr(hook, "__qualname__") else type(hook)
    return f"{getattr(named, '__module__', None) or '?'}.{named.__qualname__}"


def same_input_groups(same_inputs: Any) -> list[list[int]]:
    """The inputs that ``same_inputs`` (pairs (first, other)) make one tensor, group by group, sorted."""
    groups: dict[int, set] = {}
    for first, other in same_inputs:
        groups.setdefault(first, {first}).add(other)
    return [sorted(group) for group in groups.values()]


def pairs_within_groups(same_inputs: Any) -> set:
    """Every (i, j), both orders, of inputs that ``same_inputs`` make one tensor."""
    return {(i, j) for group in same_input_groups(same_inputs) for i in group for j in group if i != j}


def _distinct_storages(tensors: list) -> bool:
    """Whether no two of ``tensors`` can share memory: their storages' data pointers differ.

    Storages with one data pointer (and empty ones) may still be distinct:
    a False answer only sends the caller to the exact pairwise check.
    """
    try:
        pointers = [tensor.untyped_storage().data_ptr() for tensor in tensors]
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):  # no storage of its own (DTensor)
        return False
    return 0 not in pointers and len(set(pointers)) == len(pointers)


def versions_bumped(run_graph: Callable[[list], Any], mutated: tuple[int, ...]) -> Callable[[list], Any]:
    """``run_graph``, moving the version counters of the inputs it writes as eager's in-place ops do.

    Inductor's kernels write through raw pointers; without this, autograd would
    run a backward through a value the graph overwrote, which eager refuses
    ("modified by an inplace operation").
    """
    if not mutated:
        return run_graph

    def run(inputs: list) -> Any:
        written = [inputs[i] for i in mutated]  # Inductor's call() empties the list
        outputs = run_graph(inputs)
        _increment_version(written)
        return outputs

    return run


def autocast_disabled(run_graph: Callable[[list], Any], captured_under_autocast: bool) -> Callable[[list], Any]:
    """``run_graph`` with autocast off, for an artifact captured under autocast (every call then has it on).

    The graph already holds capture's casts; run under the caller's autocast,
    its ops would be cast again, undoing a region fn ran with autocast off or
    in another dtype.
    """
    if not captured_under_autocast:
        return run_graph

    def run(inputs: list) -> Any:
        with _DisableAutocast():
            return run_graph(inputs)

    return run


def raise_if_aliased(tensors: list, pairs: list, name: Callable[[int], str], mutated: Any) -> None:
    """A PrecompileError naming the first of ``pairs`` (indices into ``tensors``) whose
    tensors share memory: the graph writes one of each pair (``mutated``) in place."""
    for i, j in pairs:
        if _is_alias_of(tensors[i], tensors[j]):
            written = name(i if i in mutated else j)
            raise PrecompileError(
                f"{name(i)} and {name(j)} share memory, but they were "
                f"distinct tensors at capture and the graph writes {written} in place, so it "
                "would compute something else than eager: pass distinct tensors (e.g. .clone())"
            )


class Check(Record):
    """One thing every call checks before the graph runs (``PrecompiledFunction.checks``).

    Each is enforced by the runnable from the calling-convention record it is
    listed from (Note invariant 11); a call that fails it raises a
    PrecompileError naming ``subject``.
    """

    kind: str  # binding, global, module, attribute, data_parallel, hooks, structure, tensor, tie, value, alias, same, size, optimizer, grad
    subject: str  # what the call passes or the process holds, e.g. "args[1]", "torch.get_default_dtype()"
    expected: str  # what it must be, as captured

    def __str__(self) -> str:
        return f"{self.kind:<13} {self.subject}: {self.expected}"


# ---------------------------------------------------------------------------
# The runnable
# ---------------------------------------------------------------------------


class ResultWriter:
    """What a call writes once the graph ran: the optimizer state it created, ``.grad``
    as ``backward()`` would (``Gradients``, Note invariant 13), outputs that alias inputs,
    and fn's result, with the input objects fn rebinds or returns written into or taken
    from the caller's (invariant 5)."""

    def __init__(self, convention: CallingConvention, argument_specs: dict, written: dict, gradients: "Gradients | None"):
        self.convention = convention
        self._output_spec = convention.output_spec  # of (result, rebound inputs) where fn rebinds some
        self._returns_sizes = any(node.type is torch.Size for node in _preorder(self._output_spec))
        self._input_spec = convention.input_spec
        self._user_positions = convention.user_positions
        self._argument_specs = argument_specs  # by position (UserInputs')
        self.writes_grads = bool(convention.grad_state or convention.grads_cleared)
        self._gradients = gradients  # PrecompiledFunction's (None where no call touches .grad)
        self._output_views = convention.output_views
        self._rebound_in_place = self._plan_rebound_writes()
        self.written = written  # UserInputs': the rebound arguments as the last call wrote them

    def store(self, outputs: Any, state: list, created: Any) -> None:
        """After the graph ran, with grad mode off: the optimizer state it created, and .grad."""
        for optimizer, entries in created:
            OptimizerArgument.stepped(optimizer, entries)
        if self.writes_grads:
            self._gradients.write(state, outputs)

    def alias_outputs(self, outputs: Any, tensors: list) -> list:
        """Outputs that were graph inputs or views of them at capture, rebuilt from the runtime inputs
        in the caller's grad mode: a backward through a view of a parameter reaches it, as in eager."""
        outputs = list(outputs)
        for view in self._output_views:
            base = tensors[view.base]
            if view.detached:
                base = base.detach()
            if view.shape is None:
                outputs[view.graph_output] = base
                continue
            offset = base.storage_offset() + view.offset
            if view.no_grad:  # made under fn's no_grad(): requires grad as its base, without history
                with torch.no_grad():
                    outputs[view.graph_output] = base.as_strided(view.shape, view.stride, offset)
            else:
                outputs[view.graph_output] = base.as_strided(view.shape, view.stride, offset)
        return outputs

    def _plan_rebound_writes(self) -> dict:
        """Per rebound argument that fn leaves with its captured structure (only tensors
        rebound, as a DynamicCache's layers are): (its node in the output spec, its first
        output leaf, its first input leaf, its leaf slots), so that a call writes the new
        leaves straight into the caller's object instead of rebuilding and merging it."""
        rebound = self.convention.rebound_inputs
        if not rebound:
            return {}
        result_spec, after_spec = self._output_spec.children()
        node, out_start = 2 + result_spec.num_nodes, result_spec.num_leaves  # the root, result, the tuple
        starts = dict(zip(self._user_positions, itertools.accumulate(
            (spec.num_leaves for spec in self._input_spec.children()), initial=0)))
        plans = {}
        for position, spec in zip(rebound, after_spec.children()):
            slots = leaf_slots(spec) if spec == self._argument_specs[position] else None
            if slots is not None:
                plans[position] = (node, out_start, starts[position], slots)
            node, out_start = node + spec.num_nodes, out_start + spec.num_leaves
        return plans

    def _watch_written(self, position: int, argument: Any, places: list) -> None:
        forget = functools.partial(_forget_written, self.written, position)
        entry = LeftAsWritten.watch(argument, places, forget)
        if entry is None:
            self.written.pop(position, None)
        else:
            self.written[position] = entry

    def rebuild(self, outputs: Any, args: tuple, inputs: list) -> Any:
        leaves = [
            outputs[leaf.graph_output] if leaf.graph_output is not None else leaf.value
            for leaf in self.convention.outputs
        ]
        rebound, returned = self.convention.rebound_inputs, self.convention.returned_inputs
        if not (rebound or returned):
            if self._returns_sizes:
                return unflatten_substituting(leaves, self._output_spec, {})
            return pytree.tree_unflatten(leaves, self._output_spec)
        # Invariant 5: the caller's input objects, as eager leaves and returns them.
        specs = self._argument_specs
        substitutes = {index: node_at(args[position], specs[position], node) for index, position, node in returned}
        written = set()
        for position, (node, out_start, in_start, slots) in self._rebound_in_place.items():
            argument, count = args[position], len(slots)
            entry = self.written.get(position)
            if entry is not None and entry.unchanged(argument):
                write_places(entry.places, leaves[out_start : out_start + count])
                entry.refresh()
            else:
                places = leaf_places(argument, slots, inputs[in_start : in_start + count])
                if places is None:
                    continue
                write_places(places, leaves[out_start : out_start + count])
                self._watch_written(position, argument, places)
            substitutes[node] = None  # not rebuilt
            written.add(position)
        result = unflatten_substituting(leaves, self._output_spec, substitutes)
        if not rebound:
            return result
        result, after = result
        for position, argument in zip(rebound, after):
            if position not in written:
                write_back(args[position], argument)
        return result


class Binding:
    """A call's arguments bound as Python binds fn's (its signature as captured), to the
    positional arguments the convention describes; a parameter whose default was baked
    may not be passed."""

    def __init__(self, convention: CallingConvention):
        self._arity = convention.arity
        self.signature = call_signature(convention.signature) if convention.signature else None
        self._baked_parameters = frozenset(name for name, _, bound in convention.signature if not bound)
        # Names a call may pass by keyword; None: any (fn takes **kwargs, whose emptiness is baked).
        kinds = {kind for _, kind, _ in convention.signature}
        self._keywords = None if "VAR_KEYWORD" in kinds else frozenset(
            name for name, kind, _ in convention.signature if kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")
        )

    def bind(self, args: tuple, kwargs: dict) -> tuple:
        """fn's arguments as captured (positionally), bound from a call as Python binds fn's."""
        if self.signature is None:  # fn had no signature: positional calls only
            self._raise_call_shape(args, kwargs)
        unknown = [name for name in kwargs if self._keywords is not None and name not in self._keywords]
        try:
            if unknown:  # named before a missing argument, as Python's own call does
                raise TypeError(f"got an unexpected keyword argument {unknown[0]!r}")
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise PrecompileError(f"fn{self.signature}: {error} (the artifact binds its arguments like fn)") from None
        for name in bound.arguments:
            if name in self._baked_parameters:
                raise PrecompileError(
                    f"fn's parameter {name!r} was not passed at capture, so its default is baked into the "
                    "artifact: leave it out, or precompile again passing it"
                )
        if len(bound.args) != self._arity:  # more or fewer *args than at capture
            self._raise_call_shape(bound.args, {})
        return bound.args

    def _raise_call_shape(self, args: tuple, kwargs: dict) -> None:
        if kwargs:
            raise PrecompileError(
                f"keyword arguments are not supported (got {sorted(kwargs)}); pass every "
                "argument positionally, as at capture"
            )
        raise PrecompileError(
            f"expected {self._arity} positional arguments (as captured), got {len(args)}"
        )

    def checks(self) -> list[Check]:
        """The one ``Check`` of binding."""
        signature = f"fn{self.signature}" if self.signature is not None else "fn(*args)"
        return [Check("binding", "the call", f"{signature} bound as Python binds it, {self._arity} arguments")]


class GlobalState:
    """The process-global state a call must share with capture (Note invariant 11): no
    torch function or dispatch mode, grad mode where the graph runs autograd or fn read it,
    inference mode where fn read it, no anomaly detection or saved-tensor hooks around a
    compiled backward, autocast, and the default dtype.  ``moved`` is the fast test of what
    only some artifacts compare (the call tests modes, autocast and the default dtype
    itself), ``check`` raises the PrecompileError."""

    def __init__(self, convention: CallingConvention):
        self.convention = convention
        self._needs_grad = convention.needs_grad
        # Grad mode must be on for an artifact that runs autograd or whose fn read it.
        self._needs_grad_mode = convention.needs_grad or bool(convention.grad_mode_read)
        self._inference_mode_read = bool(convention.inference_mode_read)
        self.default_dtype = _dtype(convention.default_dtype)
        self._any_autocast = bool(convention.autocast)
        self._autocast_dtypes = convention.autocast_dtypes
        self._autocast_dtype_devices = tuple(device for device, _ in convention.autocast_dtypes)
        # Whether any of the above is compared beyond autocast and the default dtype, which
        # every call tests itself (most forwards compare nothing more).
        self.reads_more = (
            self._any_autocast or bool(self._autocast_dtypes) or self._needs_grad_mode or self._needs_grad
            or self._inference_mode_read
        )

    def moved(self, grad_enabled: bool) -> bool:
        """Whether the global state this artifact compares beyond autocast and the default dtype may differ (a few C calls)."""
        return (
            self._any_autocast  # captured under autocast: compared in full at every call
            or (self._autocast_dtypes and autocast_dtypes(self._autocast_dtype_devices) != self._autocast_dtypes)
            or (self._needs_grad_mode and not grad_enabled)
            or (self._needs_grad and (_is_anomaly_enabled() or _saved_tensors_hooks() is not None))
            or (self._inference_mode_read and _is_inference_mode_enabled())
        )

    @staticmethod
    def refuse_inference_mode() -> None:
        """fn runs backward: not under inference mode, where eager records no autograd graph.
        Called on the call's slow path, which every call under inference_mode() takes."""
        if _is_inference_mode_enabled():
            raise PrecompileError(
                "called under torch.inference_mode(), but this artifact runs autograd (fn calls backward() "
                "or torch.autograd.grad): eager records no autograd graph there, even with grad mode "
                "enabled, and its backward() raises; call it outside inference_mode()"
            )

    def check(self, grad_enabled: bool) -> None:
        """No torch function / dispatch mode, grad mode (and the modes fn read), saved-tensor hooks,
        autocast and default dtype as captured, or a PrecompileError."""
        self._check_no_modes()
        where = "torch.inference_mode()" if _is_inference_mode_enabled() else "torch.no_grad()"
        if self._needs_grad and not grad_enabled:
            raise PrecompileError(
                f"called under {where}, but this artifact runs autograd (fn calls backward() or "
                "torch.autograd.grad) and was captured with grad mode enabled; whether fn would "
                "enable grad itself is not recorded: call it with grad mode enabled, outside "
                "no_grad() / inference_mode()"
            )
        read = self.convention.grad_mode_read
        if read and not grad_enabled:
            raise PrecompileError(
                f"called under {where}, but fn reads torch.is_grad_enabled(){read} and was "
                "captured with grad mode enabled: the graph follows that branch. Call it with grad "
                "mode enabled, or pass the mode to fn as a Python argument (baked and checked)"
            )
        read = self.convention.inference_mode_read
        if read and _is_inference_mode_enabled():
            raise PrecompileError(
                f"called under torch.inference_mode(), but fn reads "
                f"torch.is_inference_mode_enabled(){read} and was captured outside it: the graph "
                "follows that branch. Call it outside inference_mode() (no_grad() is fine), or pass "
                "the mode to fn as a Python argument (baked and checked)"
            )
        if self._needs_grad and _is_anomaly_enabled():
            raise PrecompileError(
                "called with autograd anomaly detection enabled, but this artifact's backward is "
                "compiled and cannot check for anomalies: disable torch.autograd.detect_anomaly / "
                "set_detect_anomaly, or call fn eagerly to debug"
            )
        hooks = _saved_tensors_hooks() if self._needs_grad else None
        if hooks is not None:
            raise PrecompileError(
                f"called inside torch.autograd.graph.saved_tensors_hooks (pack hook "
                f"{getattr(hooks[0], '__qualname__', hooks[0])!s}), but this artifact runs autograd in "
                "its compiled graph, which saves no tensors through them: eager would pack and "
                "unpack them. Call it outside the hooks, or enter them inside fn and precompile again "
                "(the trace then records what they do)"
            )
        captured, now = self.convention.autocast, autocast_state()
        if now != captured:
            raise PrecompileError(
                f"autocast state differs from capture: captured {list(captured) or 'no autocast'}, "
                f"now {list(now) or 'no autocast'}; the casts are baked into the graph: call it "
                "under the same torch.autocast(...) as at capture, or precompile again under this one"
            )
        process = autocast_dtypes(self._autocast_dtype_devices)
        for (device, captured), (_, dtype) in zip(self._autocast_dtypes, process):
            if dtype != captured:
                raise PrecompileError(
                    f"torch.get_autocast_dtype({device!r}) is torch.{dtype}, but it was torch.{captured} at "
                    f"capture, and fn computes in it (torch.autocast({device!r}) without a dtype, or fn "
                    f"enabling autocast itself): call torch.set_autocast_dtype({device!r}, torch.{captured}) "
                    "first, give fn's torch.autocast a dtype, or precompile again"
                )
        dtype = torch.get_default_dtype()
        if dtype is not self.default_dtype:
            raise PrecompileError(
                f"torch.get_default_dtype() is {dtype}, but it was {self.default_dtype} at capture "
                "(tensors fn creates take that dtype): call "
                f"torch.set_default_dtype({self.default_dtype}) first, or precompile again"
            )

    @staticmethod
    def _check_no_modes() -> None:
        """Eager fn runs every op through the active modes; the graph, captured without them, would not."""
        if _is_torch_function_mode_enabled():
            mode = _get_function_stack_at(_len_torch_function_stack() - 1)
            device = getattr(mode, "device", None)
            if type(mode).__name__ == "DeviceContext" and type(mode).__module__ == "torch.utils._device":
                raise PrecompileError(
                    f"called with a default device ({device}: inside `with torch.device({str(device)!r}):` or after "
                    f"torch.set_default_device({str(device)!r})), a torch function mode that makes the tensors "
                    "fn creates land there in eager; the artifact's graph would bypass it (it creates them "
                    "where it did at capture). Call the artifact outside that context / with "
                    "torch.set_default_device(None), or call fn eagerly there"
                )
            raise PrecompileError(
                f"called while a torch function mode is active ({type(mode).__qualname__}, a "
                "TorchFunctionMode): eager fn would run every torch call through it, the artifact's graph "
                "would bypass it. Call the artifact outside the mode, or call fn eagerly under it"
            )
        if _len_torch_dispatch_stack():
            mode = _get_dispatch_stack_at(_len_torch_dispatch_stack() - 1)
            raise PrecompileError(
                f"called while a torch dispatch mode is active ({type(mode).__qualname__}, a "
                "TorchDispatchMode): eager fn would run every operator through it, the artifact's graph "
                "would bypass it (or run other operators through it). Call the artifact outside the "
                "mode, or call fn eagerly under it"
            )

    def checks(self) -> list[Check]:
        """A ``Check`` per global state ``check`` compares."""
        c = self.convention
        # `with torch.device(...)` and torch.set_default_device push a torch function mode.
        checks = [Check("global", "torch function and dispatch modes", "none active, default device included (the graph would bypass them)")]
        if c.needs_grad:
            checks.append(Check("global", "torch.is_grad_enabled()", "True (the graph runs autograd)"))
            checks.append(Check("global", "autograd anomaly detection and saved_tensors_hooks", "off"))
        elif c.grad_mode_read:
            checks.append(Check("global", "torch.is_grad_enabled()", f"True (fn read it{c.grad_mode_read})"))
        if c.inference_mode_read:
            checks.append(Check("global", "torch.is_inference_mode_enabled()", f"False (fn read it{c.inference_mode_read})"))
        elif c.needs_grad:
            checks.append(Check("global", "torch.is_inference_mode_enabled()", "False (the graph runs autograd)"))
        autocast = ", ".join(f"{device} {dtype}" for device, dtype in c.autocast) or "off"
        checks.append(Check("global", "torch.autocast", autocast))
        for device, dtype in c.autocast_dtypes:
            checks.append(Check("global", f"torch.get_autocast_dtype({device!r})", f"torch.{dtype} (fn computes in it)"))
        checks.append(Check("global", "torch.get_default_dtype()", f"torch.{c.default_dtype}"))
        return checks


class ModuleArguments:
    """fn's module arguments at a call (Note invariant 11): walked once per set of module
    objects and cached (``_ModuleCache``, walked again when the structure counter or a watched
    entry moves), checked against the convention's module specs (parameter, buffer and
    submodule names, order and classes; the training flags and plain values fn read; DDP
    settings; tied weights; which module arguments are one object) and scanned for hooks
    whenever one was registered anywhere.  The runnable's per-call path reads ``cache``, and
    where the graph writes a parameter or buffer, has ``refuse_shared_memory`` check the state."""

    def __init__(self, convention: CallingConvention, state_alias_pairs: list):
        self.convention = convention
        self.positions = tuple(m.position for m in convention.modules)
        self.pick = _picker(self.positions)
        self._one_module = len(self.positions) == 1
        self._state_slots, self._alias_slots = self._locate_state()
        self._state_alias_pairs = state_alias_pairs  # state tensors that must not share memory
        # Per module argument, the first one it was one object with at capture (itself where
        # none), compared when an entry is walked: its cache key, the ids, fixes the partition.
        first = list(range(len(self.positions)))
        for i, j in convention.same_modules:
            first[j] = i
        self._first_same = first if len(first) > 1 else None
        self.sharded = [(index, spec.sharded) for index, spec in enumerate(convention.state) if spec.sharded is not None]
        self.parallel_hooks = frozenset(convention.parallel_hooks)
        self.library_fixes = LIBRARY_HOOK_FIXES if convention.library_modules else None  # its driver part
        # id(module), or tuple(id(module)) of several -> _ModuleCache, while those modules live.
        self.cache: dict[Any, _ModuleCache] = {}

    def state_path(self, index: int) -> str:
        """Names lifted tensor ``index``: ``args[0].fc.weight (parameter)``."""
        spec = self.convention.state[index]
        module_index, name = spec.names[0]
        return f"args[{self.positions[module_index]}].{name} ({spec.kind})"

    def key(self, args: tuple) -> Any:
        """The module arguments' cache key: the usual single module's id alone, no tuple built per call."""
        return id(args[self.positions[0]]) if self._one_module else tuple(map(id, self.pick(args)))

    def _accepted_hook(self, hook: Any) -> bool:
        """fully_shard's hook, or tensor parallel's where the trace ran some (find_hook checks which)."""
        return is_fully_shard_hook(hook) or bool(self.parallel_hooks) and parallel_hook_description(hook) is not None

    def refuse_hooks(self, args: tuple, cached: _ModuleCache) -> _ModuleCache:
        """A PrecompileError naming a hook on the module arguments or their tensors; ``cached``, marked clean, where none."""
        epoch = hook_epoch()  # read first: a hook registered while scanning rescans next call
        cached, state = self.state_tensors(args, cached)
        named_modules = named_submodules(self.positions, self.pick(args))
        named_state = list(zip(map(self.state_path, range(len(state))), state))
        # Eager fully_shard assigns its parameters' .grad after its reduce-scatter: their
        # AccumulateGrad nodes never run (and probing a DTensor's costs ~1 ms).
        sharded = {index for index, _ in self.sharded}
        accumulated = [named_state[i] for i in self.convention.grad_state if i not in sharded]
        found = find_hook(named_modules, named_state, accumulated, self.parallel_hooks, self.library_fixes)
        if found is not None:
            hook, fix = found
            raise PrecompileError(
                f"{hook}, which was not there at capture: the graph does not run it, eager would. "
                + (fix or "Remove it (handle.remove()) before calling, or call fn eagerly")
            )
        cached.hooks_clean_at[0] = epoch
        return cached

    def state_tensors(self, args: tuple, cached: _ModuleCache) -> tuple[_ModuleCache, list]:
        """The lifted tensors ``cached`` locates (re-walked, naming what is missing, where one was deleted)."""
        try:
            state = _lifted_tensors(cached)
        except KeyError:  # deleted with `del`, which bypasses the registration hooks
            cached = self.walk(self.pick(args), self.key(args))  # names what is missing
            state = _lifted_tensors(cached)
        self.check_ties(args, cached, state)
        return cached, state

    def check_ties(self, args: tuple, cached: _ModuleCache, tensors: list) -> None:
        """Each tied name (captured as one tensor under several names) still holds that tensor."""
        for state_index, table, name, module_index, fqn in cached.aliases:
            if table.get(name) is not tensors[state_index]:
                if name not in table:  # deleted with `del`, past the registration hooks: the walk names it
                    self.walk(self.pick(args), self.key(args))
                self._raise_untied(state_index, module_index, fqn)

    def walk(self, modules: tuple, key: Any) -> _ModuleCache:
        """Walk the module arguments, check them against the convention, cache the result."""
        generation = _STRUCTURE[0]  # read first: a change while walking re-walks next call
        if self._first_same is not None:
            self._check_identity(modules)
        walked = [self._walk_module(index, module) for index, module in enumerate(modules)]
        accessors = [walked[m][0][slot] for m, slot in self._state_slots]
        submodules = [sub for _, named, _, _ in walked for _, sub in named]
        reads = ValueReads()
        for index, (_, named, _, _) in enumerate(walked):
            self._check_attributes(index, named, reads)
        ddp_entries = [entry for _, _, checked, _ in walked for entry in checked]
        flags = [flag for spec in self.convention.modules for _, flag in spec.submodules]
        # Containers whose length is watched: every submodule's _modules that has
        # children, and a DDP argument's comm hook list.
        sized = [(vars(sub), _CHILDREN) for sub in submodules if _children(sub)]
        sized += [entry for _, _, _, lengths in walked for entry in lengths]
        # The _parameters / _buffers dict of each submodule holding a lifted tensor:
        # rebinding one (`module._parameters = {...}` bypasses the registration hooks)
        # would leave the tables cached below stale.
        table_ids = {id(table) for table, _ in accessors}
        tables_held = [
            (vars(sub), attribute)
            for sub in submodules
            for attribute in _TENSOR_TABLES
            if id(vars(sub).get(attribute)) in table_ids
        ]
        sharded_entries = []
        if self.sharded:
            sharded_entries = check_sharded_parameters(accessors, self.sharded, self.state_path)
            sharded_entries += check_fully_shard(named_submodules(self.positions, modules), self.convention.fully_shard_policies)
            sharded_entries += parallel_style_settings(named_submodules(self.positions, modules))
        watched = (
            [(vars(sub), "training") for sub, flag in zip(submodules, flags) if flag is not None]
            + ddp_entries
            + list(reads.entries.values())
            + tables_held
            + sharded_entries
            + sized
        )
        watched_values = [values.get(name, MISSING) for values, name in watched]
        # The hook dicts of each submodule fn calls, and the global ones, stay empty (hooks are
        # refused) or hold fully_shard's own: a hook written into one directly, past
        # register_forward_hook's handle, is seen.
        called = [named[i][1] for (_, named, _, _), spec in zip(walked, self.convention.modules) for i in spec.called]
        hook_dicts = [
            hooks
            for hooks in (
                *(getattr(sub, attribute, None) for sub in called for attribute in _MODULE_HOOKS),
                *(map(_global_module_hooks, _MODULE_HOOKS) if called else ()),
            )
            if type(hooks) in (dict, collections.OrderedDict) and all(map(self._accepted_hook, hooks.values()))
        ]
        classes = list(reads.classes.values())
        class_values = [getattr(owner, name, MISSING) for owner, name in classes]
        containers = list(reads.containers.values())
        copies = [type(c)(c) for c in containers]
        roots = {id(module): module for module in modules}
        held = {id(sub): sub for sub in submodules if id(sub) not in roots}
        weakly = {**{i: owner for i, owner in reads.owners.items() if i not in held}, **roots}
        class_refs = _weak_refs(weakly.values())
        forget = functools.partial(_forget, self.cache, key)
        cached = _ModuleCache(
            refs=tuple(weakref.ref(m, forget) for m in modules),
            tables=[table for table, _ in accessors],
            names=[name for _, name in accessors],
            aliases=[(i, *walked[m][0][slot], m, fqn) for i, m, slot, fqn in self._alias_slots],
            generation=generation,
            watched_vars=[values for values, _ in watched],
            watched_keys=[name for _, name in watched],
            watched_values=watched_values,
            children=[*watched_values[len(watched) - len(sized) :], *hook_dicts],  # the sized entries come last
            lengths=[*map(_size_or_values, watched_values[len(watched) - len(sized) :]), *map(len, hook_dicts)],
            hooks_clean_at=[-1],
            class_owners=[owner for owner, _ in classes],
            class_names=[name for _, name in classes],
            class_values=class_values,
            containers=containers,
            container_copies=copies,
            class_and_element_ids=[*map(id, class_values), *map(_element_ids, copies)],
            class_objects=list(held.values()),
            class_refs=class_refs,
            classes=[*map(type, held.values()), *map(type, map(weakref.ref.__call__, class_refs))],
        )
        # Checked again, after the snapshot the next calls compare by identity: another
        # thread's write between the checks above and the snapshot would be cached as checked.
        num_flags = sum(flag is not None for flag in flags)
        snapshot_checked = watched_values[:num_flags] == [flag for flag in flags if flag is not None]
        if not snapshot_checked:  # a flag moved after its check: name it if it still differs
            for index, module in enumerate(modules):
                self._walk_module(index, module)
        for index, (_, named, _, _) in enumerate(walked):
            self._check_attributes(index, named, ValueReads())
        state = _lifted_tensors(cached)
        if len(set(map(id, state))) != len(state):
            self._raise_tied(state)
        if snapshot_checked:  # otherwise the next call walks again
            self.cache[key] = cached
        return cached

    def refuse_shared_memory(self, state: list) -> None:
        """No two of ``state`` (the graph's parameters and buffers) that must stay distinct share memory.

        Called at every call of a graph that writes one: ``p.set_(buf)``, parametrize's
        assignment and swap_tensors share memory past every hook the module cache watches.
        """
        if not _distinct_storages(state):  # one pass instead of every pair
            raise_if_aliased(state, self._state_alias_pairs, self.state_path, self.convention.mutated)

    def _check_identity(self, modules: tuple) -> None:
        """fn may branch on ``a is b``: the module arguments are one object where they were at
        capture (``same_modules``), else distinct."""
        seen: dict[int, int] = {}
        for k, module in enumerate(modules):
            i, want = seen.setdefault(id(module), k), self._first_same[k]
            if i == want:
                continue
            where, first = f"args[{self.positions[k]}]", f"args[{self.positions[i]}]"
            if i == k:
                raise PrecompileError(
                    f"{where} must be the same module as args[{self.positions[want]}], as at capture: fn may "
                    "branch on identity and was traced with both as one module. Pass one module for both, "
                    "or precompile again with distinct modules"
                )
            raise PrecompileError(
                f"{where} is {first} (one module), but they were distinct modules at capture: fn may branch "
                "on identity. Pass distinct modules, or precompile with one module there too"
            )

    def _walk_module(self, index: int, module: Any) -> tuple[list, list, list, list]:
        """(owner dict, name) of each parameter and buffer, (name, submodule) of each submodule,
        the checked DDP attributes, and the (vars, name) of containers whose length is watched."""
        spec = self.convention.modules[index]
        where = f"args[{spec.position}]"
        if not isinstance(module, torch.nn.Module):
            raise PrecompileError(
                f"{where}: expected an nn.Module (one was captured at this position), "
                f"got {type(module).__name__}"
            )
        checked, sized = [], []
        if spec.data_parallel is not None:
            checked += check_data_parallel(where, module, spec.data_parallel, bool(spec.buffers))
            sized.append((vars(module), _DDP_COMM_HOOKS))  # register_comm_hook appends to it
        named = list(module.named_modules())
        params = [n for n, _ in module.named_parameters(remove_duplicate=False)]
        buffers = [n for n, _ in module.named_buffers(remove_duplicate=False)]
        for kind, want, got in (
            ("parameters", list(spec.parameters), params),
            ("buffers", list(spec.buffers), buffers),
            ("submodules", [n for n, _ in spec.submodules], [n for n, _ in named]),
        ):
            if want != got:
                missing = [n for n in want if n not in got]
                extra = [n for n in got if n not in want]
                raise PrecompileError(
                    f"{where}: the module's {kind} differ from the captured model's: "
                    f"expected {len(want)} {kind}, got {len(got)}; missing {missing[:5]}, "
                    f"unexpected {extra[:5]}"
                    + ("; order differs" if not missing and not extra else "")
                )
        for (name, want), (_, sub) in zip(spec.submodules, named):
            if want is not None and type(vars(sub).get("training")) is not bool:
                raise PrecompileError(
                    f"{f'{where}.{name}' if name else where} ({type(sub).__name__}): fn reads its training "
                    "flag, which is not a bool in the module's __dict__ (a property?), where the artifact "
                    "watches it between calls: make it a plain attribute, or call fn eagerly"
                )
            if want is not None and sub.training != want:
                path = f"{where}.{name}" if name else where
                raise PrecompileError(
                    f"{path} ({type(sub).__name__}) is in {'train' if sub.training else 'eval'} "
                    f"mode, but was in {'train' if want else 'eval'} mode at capture (BatchNorm, "
                    f"Dropout & co. compute differently): call .{'train' if want else 'eval'}() "
                    "on it, or precompile again in this mode"
                )
        for (name, _), want, (_, sub) in zip(spec.submodules, spec.classes, named):
            if class_name(type(sub)) != want:
                raise PrecompileError(
                    f"{where}{'.' + name if name else ''} is a {class_name(type(sub))}, but was a {want} "
                    "at capture (its forward is baked into the graph): put back a module of that class, "
                    "or precompile again"
                )
        accessors = [_owner_dict(module, n, "parameter") for n in params] + [
            _owner_dict(module, n, "buffer") for n in buffers
        ]
        return accessors, named, checked, sized

    def _check_attributes(self, index: int, named: list, reads: ValueReads) -> None:
        """The plain values fn read from a module argument (attribute paths), as captured."""
        spec = self.convention.modules[index]
        subs = dict(named)
        for name, path, want in spec.attributes:
            got = reads.read_path(subs[name], path)
            if not matches(got, want):
                where = f"args[{spec.position}]{'.' + name if name else ''}.{path}"
                if callable(got) and matches(MISSING, want):  # absent from the object at capture
                    if getattr(got, SERVES_ARTIFACTS, False):
                        continue  # generation.serving()'s forward: it calls the artifacts themselves
                    raise PrecompileError(
                        f"{where} is set on the instance ({_describe_read(got)}), where at capture its class's method "
                        "ran, which the graph holds: delete that instance attribute to call the artifact, or "
                        "precompile again with it set"
                    )
                described = _describe_read(got)
                if described == describe_literal(want):  # a value of another type with the same repr
                    described += f" of type {type(got).__qualname__}"
                raise PrecompileError(
                    f"{where} is {described}, but was "
                    f"{describe_literal(want)} at capture (fn read it, so it is baked into the graph): "
                    "set it back, or precompile again"
                )

    def _raise_tied(self, state: list) -> None:
        first = {}
        for index, tensor in enumerate(state):
            earlier = first.setdefault(id(tensor), index)
            if earlier != index:
                raise PrecompileError(
                    f"{self.state_path(index)} is the same tensor as {self.state_path(earlier)} "
                    "(tied weights), but they were distinct tensors at capture, so the graph would "
                    "compute and write each one separately (eager sums both uses into one .grad): "
                    "untie them, or precompile the tied model"
                )

    def _raise_untied(self, state_index: int, module_index: int, fqn: str) -> None:
        first_module, first_name = self.convention.state[state_index].names[0]
        raise PrecompileError(
            f"args[{self.positions[module_index]}].{fqn} was the same tensor as "
            f"args[{self.positions[first_module]}].{first_name} at capture (tied "
            "weights) but is a different tensor now; tie them again or precompile the untied model"
        )

    def _locate_state(self) -> tuple[list, list]:
        """Where each lifted tensor lives: (module index, slot) in accessor order."""
        slots = {}
        for index, spec in enumerate(self.convention.modules):
            for slot, name in enumerate(spec.parameters + spec.buffers):
                slots[(index, name)] = slot
        primary, aliases = [], []
        for state_index, spec in enumerate(self.convention.state):
            (module_index, name), *tied = spec.names
            primary.append((module_index, slots[(module_index, name)]))
            aliases += [(state_index, m, slots[(m, n)], n) for m, n in tied]
        return primary, aliases

    def checks(self) -> list[Check]:
        """A ``Check`` per fact of each module argument this walk compares, its hook scan, and tied weights."""
        checks = [check for spec in self.convention.modules for check in self._spec_checks(spec)]
        if self._first_same is not None:
            paths = [f"args[{position}]" for position in self.positions]
            distinct = len(set(self._first_same))
            checks += [Check("same", paths[k], f"the same module as {paths[i]}") for k, i in enumerate(self._first_same) if i != k]
            checks.append(Check("same", ", ".join(paths), f"{distinct} distinct modules, as at capture (fn may branch on identity)"))
        for index, spec in enumerate(self.convention.state):
            for module_index, name in spec.names[1:]:
                tied = f"args[{self.positions[module_index]}].{name}"
                checks.append(Check("tie", tied, f"the same tensor as {self.state_path(index)}"))
        for index, shard in self.sharded:
            checks.append(Check("sharded", self.state_path(index), f"a DTensor of shape {_describe_sizes(list(shard.shape))} "
                                f"placed [{', '.join(shard.placements)}] on a mesh over "
                                + " by ".join(f"process group {name!r} of {size} ranks" for name, size in shard.mesh_groups)
                                + (f"; its .grad placed [{', '.join(shard.grad_placements)}]" if shard.grad_placements else "")))
        for path, attribute, description in self.convention.parallel_hooks:
            checks.append(Check("sharded", f"{path}.{attribute}", f"tensor parallel's hook {description}"))
        if any(shard.gathered for _, shard in self.sharded):
            checks.append(Check("sharded", "fully_shard settings", "no offload policy, gradient sync on, the default "
                                "gradient reduction, mixed precision policies as listed (none elsewhere)"))
        for path, policy in self.convention.fully_shard_policies:
            checks.append(Check("sharded", path, f"fully_shard's mixed precision policy {policy}"))
        return checks

    @staticmethod
    def _spec_checks(spec: Any) -> list[Check]:
        where = f"args[{spec.position}]"
        checks = [
            Check("module", where, f"{spec.classes[0] if spec.classes else 'an nn.Module'}: parameters, buffers and "
                  f"{len(spec.submodules)} submodules of the captured names, order and classes")
        ]
        modes = [(name, flag) for name, flag in spec.submodules if flag is not None]
        checks += [Check("module", f"{where}{'.' + name if name else ''}.training", str(flag)) for name, flag in modes]
        for name, path, want in spec.attributes:
            checks.append(Check("attribute", f"{where}{'.' + name if name else ''}.{path}", describe_literal(want)))
        if spec.data_parallel is not None:
            ddp = spec.data_parallel
            checks.append(Check("data_parallel", where, f"DistributedDataParallel over process group {ddp.group_name!r} of "
                                f"{ddp.world_size} ranks, with the captured settings and gradient sync"))
        checks.append(Check("hooks", where, "no hook on it, its submodules, parameters, buffers or their gradient "
                            "accumulation, nor a global module hook, that was not there at capture"))
        return checks


def inference_tensor_error(path: str, why: str) -> PrecompileError:
    """The refusal of an inference tensor at ``path``; ``why``: what eager would do with it."""
    if why == "backward":
        return PrecompileError(
            f"{path} is an inference tensor (made under torch.inference_mode()) and fn runs backward: outside "
            "inference mode eager's autograd refuses to save one for backward and to update one in place, so "
            "a training step refuses every inference tensor it takes. Make it outside inference_mode() (e.g. "
            ".clone() it there), or call fn eagerly"
        )
    return PrecompileError(
        f"{path} is an inference tensor (made under torch.inference_mode()) and {why}, which eager refuses "
        "outside inference mode: call the artifact under torch.inference_mode(), or pass a tensor made "
        "outside it (e.g. .clone() it there)"
    )


class UserInputs:
    """fn's arguments other than modules and optimizers at a call (Note invariants 1, 3 and
    11): their pytree structure (read where the last call wrote an argument it left as
    written), baked values, tensor layouts (the slow path's full check, and the guard that
    arms the fast one), free dim sizes with their bounds, groups and size facts, and memory
    shared with a tensor the graph writes."""

    def __init__(self, convention: CallingConvention, state_path: Callable[[int], str], input_alias_pairs: list):
        self.convention = convention
        self._user_positions = convention.user_positions
        self._input_spec = convention.input_spec
        self.argument_specs = dict(zip(self._user_positions, self._input_spec.children()))  # by position
        self._typed_contexts = {  # by position, where a context holds numbers
            position: typed for position, spec in self.argument_specs.items() if (typed := typed_contexts(spec))
        }
        self._ordered_dicts = frozenset(convention.ordered_dicts)
        # By position: arguments as the last call left them, written by ResultWriter after the graph.
        self.written: dict[int, LeftAsWritten] = {}
        self._state_path = state_path
        # A flat tuple of leaves (the common `fn(model, x)` case) skips pytree;
        # the guard and value checks catch a container passed instead.
        self.flat = self._input_spec.type is tuple and all(c.is_leaf() for c in self._input_spec.children())
        inputs = convention.inputs
        self.tensor_inputs = [i for i, leaf in enumerate(inputs) if leaf.tensor is not None]
        mutated, num_state = frozenset(convention.mutated), len(convention.state)
        self._num_state = num_state
        self._written = frozenset(i for k, i in enumerate(self.tensor_inputs) if num_state + k in mutated)
        # requires_grad is checked where the graph runs autograd, else where fn read it.
        read = frozenset(convention.requires_grad_read)
        self._requires_grad_checked = [convention.needs_grad or k in read for k in range(num_state + len(self.tensor_inputs))]
        self._value_inputs = [(i, leaf.value) for i, leaf in enumerate(inputs) if leaf.is_value]
        # (tensor graph input, name, literal) of each Python attribute fn read on a tensor argument.
        self.tensor_attributes = convention.tensor_attributes
        # Inputs with free dims: checked every call (layout, bounds, shape groups).
        self.free_inputs = [
            (i, MEMORY_FORMATS[inputs[i].tensor.memory_format], inputs[i].tensor.free_dims)
            for i in self.tensor_inputs
            if inputs[i].tensor.free_dims
        ]
        self._sizes = convention.sizes
        self._same_inputs = convention.same_inputs
        groups = same_input_groups(self._same_inputs)
        self._written_groups = frozenset(i for group in groups if not mutated.isdisjoint(group) for i in group)
        # Capture traced the user tensors as this many objects, one per same_inputs group, and fn
        # may branch on identity: a call passes as many (0: fewer than two tensors, nothing to count).
        num_user = len(self.tensor_inputs)
        self.distinct_tensors = num_user - sum(len(g) - 1 for g in groups) if num_user > 1 else 0
        self._input_alias_pairs = input_alias_pairs  # (i, j) tensor graph inputs, j a user input
        # Invariant 5: fn changes an input object, which capture saw with no container at two
        # places (rebuilt from its pytree, the places were distinct): a call passes none either,
        # checked as it flattens where the captured structure has two such containers.
        types = {p: mutable_node_types(spec) for p, spec in self.argument_specs.items()} if convention.rebound_inputs else {}
        self._container_types = frozenset(t for position_types in types.values() for t in position_types)
        self._checks_sharing = sum(map(len, types.values())) > 1
        # An argument left as the last call wrote it is read there, not flattened, unless it
        # could share a container with another argument (a node type in common).
        self._read_as_written = frozenset(
            p for p in self._user_positions
            if not self._checks_sharing or not any(set(types[p]) & set(types[q]) for q in types if q != p)
        )
        # The tensors whose gradient the graph may compute: a hook the caller puts on one would
        # change eager's (autograd.grad w.r.t. it runs the hook), which the graph does not run.
        self._differentiated = [i for i in self.tensor_inputs if convention.needs_grad and inputs[i].tensor.requires_grad]
        self.has_checks = bool(self._value_inputs or input_alias_pairs or self._same_inputs or self._differentiated)

    def flatten(self, user_args: tuple) -> list:
        if self.written:
            leaves = self._flatten_unless_written(user_args)
            if leaves is not None:
                return leaves
        # The captured spec on the left: a ContextRepr in it compares first.
        nodes: list = []
        leaves, spec = self._flatten_noting_containers(tuple(user_args), nodes)
        if self._input_spec != spec:
            leaves, spec = pytree.tree_flatten(self._conform_dict_order(user_args))
            if self._input_spec != spec:
                self._raise_structure_mismatch(user_args)
        if self._typed_contexts:
            arguments = dict(zip(self._user_positions, spec.children()))
            for position, typed in self._typed_contexts.items():
                check_contexts(f"args[{position}]", arguments[position], typed)
        self._refuse_shared_containers(user_args, nodes)
        return leaves

    def _flatten_noting_containers(self, tree: Any, nodes: list) -> tuple:
        """``pytree.tree_flatten(tree)``, adding to ``nodes`` each container of a type that
        could be shared where a call checks that none is (``_checks_sharing``)."""
        if not self._checks_sharing:
            return pytree.tree_flatten(tree)
        types = self._container_types
        return pytree.tree_flatten(tree, is_leaf=lambda node: type(node) in types and nodes.append(node))

    def _refuse_shared_containers(self, user_args: tuple, nodes: list) -> None:
        if nodes and len(set(map(id, nodes))) != len(nodes):
            arguments = [(f"args[{p}]", argument) for p, argument in zip(self._user_positions, user_args)]
            raise shared_container_error(arguments, ", but they were distinct objects at capture")

    def _flatten_unless_written(self, user_args: tuple) -> list | None:
        """The leaves, read where the last call wrote them for each argument nothing changed
        since (``LeftAsWritten``), the other arguments flattened; None where one of those has
        another structure (the full flatten conforms dict order or names the difference)."""
        leaves, written, specs, nodes = [], self.written, self.argument_specs, []
        for position, argument in zip(self._user_positions, user_args):
            entry = written.get(position)
            if entry is not None and position in self._read_as_written and entry.unchanged(argument):
                leaves += entry.leaves()
                continue
            argument_leaves, spec = self._flatten_noting_containers(argument, nodes)
            if specs[position] != spec:
                return None
            if position in self._typed_contexts:
                check_contexts(f"args[{position}]", spec, self._typed_contexts[position])
            leaves += argument_leaves
        self._refuse_shared_containers(user_args, nodes)
        return leaves

    def _conform_dict_order(self, user_args: tuple) -> tuple:
        ordered = self._ordered_dicts
        return tuple(
            conform_dict_order(arg, spec, f"args[{position}]", ordered)
            for position, arg, spec in zip(self._user_positions, user_args, self._input_spec.children())
        )

    def _raise_structure_mismatch(self, user_args: tuple) -> None:
        expected = self._input_spec.children()
        for position, arg, want in zip(self._user_positions, user_args, expected):
            got = pytree.tree_structure(arg)
            if want != got:
                raise PrecompileError(
                    f"args[{position}]: input structure differs from the captured one: "
                    f"{structure_difference(want, got, f'args[{position}]')}; expected {want}, got {got}"
                )
        raise PrecompileError("input structure differs from the captured one")

    def check(self, user_args: tuple, leaves: list, tensors: list) -> None:
        """Baked values, no memory shared with a tensor the graph writes, and the tensors that must be one, as captured."""
        self._check_values(user_args, leaves)
        self._refuse_input_hooks(leaves)
        raise_if_aliased(tensors, self._input_alias_pairs, self.tensor_path, self.convention.mutated)
        self._check_same_inputs(tensors)

    def check_tensor_attributes(self, tensors: list) -> None:
        """The Python attributes fn read on its tensor arguments (``p.no_wd``; ``_is_param``, found
        absent, for ``isinstance(x, nn.Parameter)``) are as at capture: the graph followed them."""
        for index, name, want in self.tensor_attributes:
            got = getattr(tensors[index], name, MISSING)
            if not matches(got, want):
                raise PrecompileError(
                    f"{self._attribute_path(index, name)} is {_describe_read(got)}, was {describe_literal(want)} at "
                    "capture (fn read it, so the graph follows it); set it back, or precompile again"
                )

    def _attribute_path(self, index: int, name: str) -> str:
        """``args[0].fc.weight.no_wd``: attribute ``name`` of tensor graph input ``index``."""
        if index < self._num_state:
            module_index, fqn = self.convention.state[index].names[0]
            return f"args[{self.convention.modules[module_index].position}].{fqn}.{name}"
        return f"{self.tensor_path(index)}.{name}"

    def _check_values(self, user_args: tuple, leaves: list) -> None:
        for index, want in self._value_inputs:
            got = leaves[index]
            if not matches(got, want):
                if self.flat:
                    self.flatten(user_args)  # a container passed for a value: say so
                raise PrecompileError(
                    f"{self.input_path(index)}: expected {describe_literal(want)} (baked into the artifact at "
                    f"capture), got {got!r}; precompile again for another value"
                )

    def _refuse_input_hooks(self, leaves: list) -> None:
        for index in self._differentiated:
            tensor = leaves[index]
            for attribute, kind in _TENSOR_HOOKS.items():
                for hook in (getattr(tensor, attribute, None) or {}).values():
                    raise PrecompileError(
                        f"{self.input_path(index)} has a {kind} ({hook_name(hook)}), which was not there at "
                        "capture: eager's gradient with respect to it would run the hook, the graph does not. "
                        "Remove it (handle.remove()) before calling, or call fn eagerly"
                    )

    def input_path(self, index: int) -> str:
        positional, *rest = leaf_paths(self._input_spec)[index]
        return _leaf_path(self._user_positions[positional.idx], tuple(rest))

    def free_sizes(self, leaves: list) -> list:
        """Sizes of the free dims (graph inputs, the convention's ``sizes`` order), after
        checking layouts, bounds and shape groups."""
        sizes, by_group = [], {}
        for index, memory_format, free_dims in self.free_inputs:
            tensor = leaves[index]
            if not tensor.is_contiguous(memory_format=memory_format):
                self._check_free_input(index, leaves)
            shape = tensor.shape
            for dim, group, low, high in free_dims:
                size = shape[dim]
                if size < low or (high is not None and size > high):
                    self._check_free_input(index, leaves)
                if by_group.setdefault(group, size) != size:
                    self._raise_unequal_group(index, dim, group, leaves)
                sizes.append(size)
        for fact in self.convention.size_facts:
            if not fact.holds(sizes):
                names = [f"{self.input_path(index)} dim {dim}" for index, dim in self._sizes]
                got = ", ".join(f"{names[i]} is {sizes[i]}" for i, _ in fact.terms)
                raise PrecompileError(
                    f"the captured graph requires {fact.describe(names)}, decided by the example "
                    f"inputs{fact.where}, but {got}: pass sizes that satisfy it, or precompile "
                    "with example inputs whose sizes take the branch these do"
                )
        return sizes

    def _check_free_input(self, index: int, leaves: list) -> None:
        """The full check of a free-dim input the fast test doubted (a PrecompileError naming it, if it fails)."""
        check_tensor(self.input_path(index), leaves[index], self.convention.inputs[index].tensor, self.convention.backend)

    def _raise_unequal_group(self, index: int, dim: int, group: int, leaves: list) -> None:
        """Names ``index``'s ``dim`` and the first dim of ``group``, whose sizes differ."""
        first, first_dim = next(
            (i, d) for i, _, free_dims in self.free_inputs for d, g, _, _ in free_dims if g == group
        )
        raise PrecompileError(
            f"{self.input_path(index)} dim {dim} has size {leaves[index].shape[dim]} but "
            f"{self.input_path(first)} dim {first_dim} has size {leaves[first].shape[first_dim]}; "
            "the captured graph requires them equal"
        )

    def check_slowly(self, user_args: tuple, leaves: list, state: list) -> None:
        """Full check with precise errors; returns when the call is valid."""
        if self.flat:
            self.flatten(user_args)  # the fast path skipped the structure check
        backend, grads, checked = self.convention.backend, self.convention.needs_grad, self._requires_grad_checked
        for index, (spec, value) in enumerate(zip(self.convention.state, state)):
            check_tensor(self.tensor_path(index), value, spec.tensor, backend, checked[index], exact=True)
        for k, index in enumerate(self.tensor_inputs, len(state)):
            check_tensor(self.input_path(index), leaves[index], self.convention.inputs[index].tensor, backend, checked[k])
            if index in self._written and not grads and leaves[index].requires_grad:
                raise PrecompileError(
                    f"{self.input_path(index)} requires grad and fn writes it in place: eager refuses that for "
                    "a leaf under grad mode and records the write in autograd otherwise, and this artifact's "
                    "graph runs without autograd: pass a tensor that does not require grad (x.detach())"
                )

    def tensor_path(self, index: int) -> str:
        """Names tensor graph input ``index``: a parameter/buffer, then the user tensors."""
        if index >= len(self.convention.state):
            return self.input_path(self.tensor_inputs[index - len(self.convention.state)])
        return self._state_path(index)

    def refuse_written_inference_tensors(self, tensors: list) -> None:
        """Called outside inference mode: no tensor the graph writes is an inference tensor.

        Eager's in-place update of one raises there; Inductor's kernels write
        through raw pointers, and autograd would not see it either way.
        """
        for index in self.convention.mutated:
            if tensors[index].is_inference():
                raise inference_tensor_error(self.tensor_path(index), "the graph writes it in place")

    def refuse_inference_tensors(self, tensors: list) -> None:
        """fn runs backward: no inference tensor among ``tensors`` (the state, then the user
        tensors), which eager's autograd refuses to save for backward or update in place.

        Refuses some fn eager would run (an inference tensor only added): refuse or honour.
        """
        for index, tensor in enumerate(tensors):
            if tensor.is_inference():
                raise inference_tensor_error(self.tensor_path(index), "backward")

    def _check_same_inputs(self, tensors: list) -> None:
        """The user tensors that were one object at capture (``same_inputs``) are one now."""
        for i, j in self._same_inputs:
            if tensors[i] is not tensors[j]:
                why = "fn writes one of them in place" if i in self._written_groups else "fn may branch on identity"
                raise PrecompileError(
                    f"{self.tensor_path(j)} must be the same tensor as {self.tensor_path(i)}, as at "
                    f"capture: {why} and was traced with both as one tensor. "
                    "Pass one tensor for both, or precompile again with distinct example tensors"
                )

    def raise_identity_differs(self, tensors: list) -> None:
        """Where a call's user tensors are not as many objects as at capture (``distinct_tensors``):
        names a group that is not one object, else two tensors that were distinct at capture."""
        self._check_same_inputs(tensors)
        one_tensor, first = pairs_within_groups(self._same_inputs), {}
        for k in range(self._num_state, len(tensors)):
            i = first.setdefault(id(tensors[k]), k)
            if i != k and (i, k) not in one_tensor:
                raise PrecompileError(
                    f"{self.tensor_path(k)} is {self.tensor_path(i)} (one tensor), but they were distinct "
                    "tensors at capture: fn may branch on identity (nn.MultiheadAttention does); pass "
                    "distinct tensors, or precompile with one tensor there too"
                )

    def build_guard(self, tensors: list):
        specs = [s.tensor for s in self.convention.state] + [
            self.convention.inputs[i].tensor for i in self.tensor_inputs
        ]
        return tensor_guard(tensors, specs, num_exact=len(self.convention.state))

    def checks(self) -> list[Check]:
        """A ``Check`` per fact of the inputs a call compares, tensors of modules (``state_path``) included."""
        c = self.convention
        checks = []
        if not self.flat:
            for position, spec in zip(self._user_positions, self._input_spec.children()):
                expected = f"pytree of {spec.num_leaves} leaves, as captured: {spec}"
                checks.append(Check("structure", f"args[{position}]", expected))
        checked = self._requires_grad_checked
        for index, spec in enumerate(c.state):
            checks.append(Check("tensor", self._state_path(index), _describe_tensor(spec.tensor, checked[index], exact=True)))
        for k, index in enumerate(self.tensor_inputs, len(c.state)):
            requires_grad_checked = checked[k] or index in self._written
            checks.append(Check("tensor", self.input_path(index), _describe_tensor(c.inputs[index].tensor, requires_grad_checked)))
        for index, name, want in self.tensor_attributes:  # checked once the tensors are
            expected = f"{describe_literal(want)} (a Python attribute fn read)"
            checks.append(Check("tensor", self._attribute_path(index, name), expected))
        for index, want in self._value_inputs:
            checks.append(Check("value", self.input_path(index), f"{describe_literal(want)} (baked)"))
        return checks

    def pair_checks(self, state_alias_pairs: list) -> list[Check]:
        """A ``Check`` per tensor the graph writes that must share memory with no other, per same-tensor
        rule, and per tensor the graph writes (no inference tensor)."""
        paired = {index for pair in self._input_alias_pairs + state_alias_pairs for index in pair}
        checks = [
            Check("alias", self.tensor_path(index), "shares memory with no other tensor argument (the graph writes it)")
            for index in sorted(paired & set(self.convention.mutated))
        ]
        checks += [Check("same", self.tensor_path(j), f"the same tensor as {self.tensor_path(i)}") for i, j in self._same_inputs]
        if self.distinct_tensors:
            paths = [self.input_path(index) for index in self.tensor_inputs]
            subject = ", ".join(paths) if len(paths) <= 4 else f"{paths[0]}, ..., {paths[-1]} ({len(paths)} tensors)"
            expected = f"{self.distinct_tensors} distinct tensors, as at capture (fn may branch on identity)"
            checks.append(Check("same", subject, expected))
        if self.convention.needs_grad:
            checks.append(Check("written", "every parameter, buffer and tensor argument", "no inference tensor (fn runs backward)"))
        else:
            checks += [
                Check("written", self.tensor_path(index), "no inference tensor, unless called under torch.inference_mode()")
                for index in self.convention.mutated
            ]
        return checks

    def size_checks(self) -> list[Check]:
        """A ``Check`` per free dim (bounds, shape group) and per size fact."""
        checks, first_of_group = [], {}
        for index, _, free_dims in self.free_inputs:
            for dim, group, low, high in free_dims:
                name = f"{self.input_path(index)} dim {dim}"
                equal = first_of_group.setdefault(group, name)
                bounds = f"in [{low}, {'inf' if high is None else high}]"
                checks.append(Check("size", name, bounds if equal == name else f"{bounds}, equal to {equal}"))
        names = [f"{self.input_path(index)} dim {dim}" for index, dim in self._sizes]
        checks += [Check("size", "free sizes", f"{fact.describe(names)}{fact.where}") for fact in self.convention.size_facts]
        return checks


class PrecompiledFunction:
    """The callable returned by ``load`` (and bound to ``forward`` in an artifact).

    Every call is checked against the calling convention, runs the graph,
    accumulates parameter gradients onto the runtime model like eager
    ``.backward()``, and rebuilds fn's result.  The checks cost microseconds:
    a call whose modules and tensor layouts were already fully checked is
    verified by one C++ tensor check (``tensor_guard``); anything else takes the slow
    path, which either raises a PrecompileError naming what differs or
    re-arms the fast path for the new layout.
    """

    def __init__(
        self,
        convention: CallingConvention,
        run_graph: Callable[[list], Any],
        constants: list[torch.Tensor],
    ):
        self.convention = convention
        if convention.backend == "inductor":
            run_graph = versions_bumped(run_graph, convention.mutated)
        self._run_graph = autocast_disabled(run_graph, bool(convention.autocast))
        self._constants = constants
        self._arity = convention.arity
        self._binding = Binding(convention)
        self._module_positions = tuple(m.position for m in convention.modules)
        self._pick_user_args = _picker(convention.user_positions)
        self._output_spec = convention.output_spec  # of (result, rebound inputs) where fn rebinds some
        # fn's tensor outputs (one returned twice is one graph output), then the gradients.
        self._num_graph_outputs = len(convention.output_tensors) + len(convention.grad_state)
        self._output_indices = [leaf.graph_output for leaf in convention.outputs]
        self._plain_outputs = all(i is not None for i in self._output_indices) and (
            self._output_spec.is_leaf() or (self._output_spec.type is tuple and all(c.is_leaf() for c in self._output_spec.children()))
        )
        self._single_output = self._plain_outputs and self._output_spec.is_leaf()
        self._one_module = len(self._module_positions) == 1
        self._guard = None  # tensor_guard() armed by the last fully checked call
        # Global state, compared at every call with a few C calls.
        self._global_state = GlobalState(convention)
        self._default_dtype = self._global_state.default_dtype
        self._reads_global_state = self._global_state.reads_more
        # Memory shared with a tensor the graph writes changes what it computes.
        # Pairs of tensor graph inputs that must not share memory, checked at every
        # call: state-only ones in one pass over the storages (set_ and swap_tensors
        # share memory without changing anything the module cache watches).
        num_state = self._num_state = len(convention.state)
        num_tensors = num_state + sum(leaf.tensor is not None for leaf in convention.inputs)
        mutated = frozenset(convention.mutated)
        one_tensor = pairs_within_groups(convention.same_inputs)  # checked by identity instead
        # From the written tensors' side: O(written x tensors), not every pair of a large model's tensors.
        pairs = sorted(
            {(min(i, j), max(i, j)) for i in mutated for j in range(num_tensors) if j != i} - one_tensor
        )
        self._state_alias_pairs = [(i, j) for i, j in pairs if j < num_state]
        self._module_arguments = ModuleArguments(convention, self._state_alias_pairs)
        self._pick_modules = self._module_arguments.pick
        self._state_cache = self._module_arguments.cache  # read by every call (_module_entry)
        input_alias_pairs = [(i, j) for i, j in pairs if j >= num_state]
        self._inputs = UserInputs(convention, self._module_arguments.state_path, input_alias_pairs)
        # The driver's gradients part: present only where a call reads or writes .grad.
        self._gradients = (
            Gradients(convention, self._inputs.tensor_path, frozenset(index for index, _ in self._module_arguments.sharded))
            if convention.touches_grads
            else None
        )
        self._results = ResultWriter(convention, self._inputs.argument_specs, self._inputs.written, self._gradients)
        self._flat_inputs = self._inputs.flat
        self._distinct_inputs = self._inputs.distinct_tensors  # 0 with fewer than two tensor inputs
        self._pick_tensor_inputs = _picker(self._inputs.tensor_inputs)
        sharded = bool(self._module_arguments.sharded)
        self._runs_backward = convention.needs_grad
        self._optimizers = [
            OptimizerArgument(spec, convention.backend, sharded, convention.needs_grad) for spec in convention.optimizers
        ]
        self._optimizer_states_apart: list = []  # two or more optimizers: their state tensors last found apart
        self._reads_grads = bool(convention.grad_inputs)  # the incoming .grad are graph inputs
        self._has_trailing_inputs = bool(self._inputs.free_inputs or self._optimizers or self._reads_grads)
        self._copies_inputs = bool(self._constants or convention.output_views)
        self._writes_state = bool(self._optimizers or self._results.writes_grads)
        self._output_views = bool(convention.output_views)
        self._checks_inputs = self._inputs.has_checks
        self._reads_tensor_attributes = bool(convention.tensor_attributes)
        # grad_state: each new gradient's parameter must take it as the graph computes it (grad_dtype)
        self._checks_grads = bool(convention.grads_none or convention.grads_present or convention.grad_state)
        self._writes_tensors = bool(convention.mutated)
        # Per call for an inference artifact; a training step refuses every inference tensor on its slow path.
        self._refuses_written_inference = self._writes_tensors and not convention.needs_grad
        self._sharded = self._module_arguments.sharded  # fully_shard's parameters (Note invariant 17)
        self._state_path = self._module_arguments.state_path
        # One flag for the per-call path (an inference forward): between the
        # guard and the graph nothing to check, add or replace, after it nothing
        # to store, and one output to return.
        self._bare = self._single_output and not (
            self._checks_inputs
            or self._checks_grads
            or self._writes_tensors
            or self._has_trailing_inputs
            or self._copies_inputs
            or self._writes_state
            or self._sharded
            or self._reads_tensor_attributes
        )

    # -- the call ------------------------------------------------------------

    @opaque_to_dynamo
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != self._arity:
            args = self._binding.bind(args, kwargs)
        grad_enabled = _is_grad_enabled()
        if (
            _is_any_autocast_enabled()
            or _get_default_dtype() is not self._default_dtype
            or (_MODES_UNSEEN_BY_GATHER and (_is_torch_function_mode_enabled() or _len_torch_dispatch_stack()))
            or (self._reads_global_state and self._global_state.moved(grad_enabled))
        ):
            self._global_state.check(grad_enabled)
        cached = self._module_entry(args)
        if RemovableHandle.next_id - _HOOK_PROBES[0] != cached.hooks_clean_at[0]:  # hook_epoch(), inlined
            cached = self._module_arguments.refuse_hooks(args, cached)
        user_args = self._pick_user_args(args)
        leaves = user_args if self._flat_inputs else self._inputs.flatten(user_args)
        inputs = self._pick_tensor_inputs(leaves)
        guard = self._guard
        # The lifted tensors looked up and every tensor checked in one C++ call (tensor_guard).
        tensors = guard.gather(cached.tables, cached.names, inputs) if guard is not None else None
        if tensors is None:
            if _modes_active():  # gather() saw them (ABI 3)
                self._global_state.check(grad_enabled)
            cached, state = self._module_arguments.state_tensors(args, cached)
            tensors = [*state, *inputs]
            # The guard records the tensors as they are when it is built; they are checked
            # after that, so another thread's write in between is never armed as checked.
            try:
                guard = self._inputs.build_guard(tensors)
            except Exception:  # tensors unlike the specs (not a tensor, another rank): check_slowly names it
                guard = None
            self._inputs.check_slowly(user_args, leaves, state)
            # Checked here only, before the guard is armed: the guard compares each tensor's dispatch
            # keys with the thread's local ones applied. Outside inference_mode() an inference tensor
            # lacks the Autograd key a normal one has; under it every tensor lacks that and
            # ADInplaceOrView. So a guard armed here (over normal tensors outside inference mode, as
            # this refuses anything else) misses a call with an inference tensor or under inference_mode().
            if self._runs_backward:
                self._global_state.refuse_inference_mode()
                self._inputs.refuse_inference_tensors(tensors)
            self._guard = guard
        elif cached.aliases:
            self._module_arguments.check_ties(args, cached, tensors)
        # fn may branch on `a is b`: the user tensors are one object where they were at capture, else distinct.
        if self._distinct_inputs and len(set(map(id, inputs))) != self._distinct_inputs:
            self._inputs.raise_identity_differs(tensors)
        if self._bare:
            if grad_enabled:
                _set_grad_enabled(False)
            try:
                outputs = self._run_graph(tensors)
            except AssertionError as error:
                self._raise_rejected(error)
            finally:
                _set_grad_enabled(grad_enabled)  # also where the graph itself switched it
            if len(outputs) != 1:
                self._raise_edited(outputs)
            return outputs[0]
        if self._reads_tensor_attributes:  # on the tensors the caller passed: sharded parameters as DTensors
            self._inputs.check_tensor_attributes(tensors)
        state = grad_owners = tensors[: self._num_state]
        if self._sharded:  # fully_shard's parameters: the graph takes their local shards
            grad_owners, tensors = sharded_inputs(tensors, self._sharded, self._num_state, self._state_path)
        if self._state_alias_pairs:  # the graph writes a parameter or buffer
            self._module_arguments.refuse_shared_memory(tensors[: self._num_state])
        if self._checks_inputs:
            self._inputs.check(user_args, leaves, tensors)
        if self._refuses_written_inference and not _is_inference_mode_enabled():
            self._inputs.refuse_written_inference_tensors(tensors)
        if self._checks_grads:
            self._gradients.check_kept(grad_owners)
        created = ()  # (optimizer, state entries this call creates): stored once the graph ran
        if self._has_trailing_inputs:
            created = []
            tensors += self._trailing_inputs(args, leaves, state, grad_owners, tensors, created)
        # The graph already contains any backward: run it without autograd
        # recording (Inductor's out= kernels refuse inputs that require grad),
        # and write .grad as the autograd engine does, with grad mode off
        # (already off under no_grad(): nothing to switch).
        if grad_enabled:
            _set_grad_enabled(False)
        try:
            try:
                # Inductor's call() empties the list it gets: a copy where tensors is read afterwards.
                outputs = self._run_graph(tensors + self._constants if self._copies_inputs else tensors)
            except AssertionError as error:
                self._raise_rejected(error)
            if len(outputs) != self._num_graph_outputs:
                self._raise_edited(outputs)
            if self._writes_state:
                self._results.store(outputs, grad_owners, created)
        finally:
            _set_grad_enabled(grad_enabled)  # also where the graph itself switched it
        if self._output_views:
            outputs = self._results.alias_outputs(outputs, tensors)
        if self._single_output:
            return outputs[0]
        if self._plain_outputs:
            return tuple([outputs[i] for i in self._output_indices])
        return self._results.rebuild(outputs, args, leaves)

    def _trailing_inputs(self, args: tuple, leaves: Any, state: list, grad_owners: list, tensors: list, created: list) -> list:
        """The graph inputs after the tensors: free dim sizes, optimizer state, incoming grads
        (``.grad`` of ``grad_owners``, ``state`` or what stands for a fully_shard parameter).

        Optimizer state a call creates goes to ``created``, not to the
        optimizers: a call refused by a later check changes no state.
        """
        trailing = self._inputs.free_sizes(leaves) if self._inputs.free_inputs else []
        for optimizer in self._optimizers:
            trailing += optimizer.inputs(args[optimizer.spec.position], state, created, tensors, self._inputs.tensor_path)
        if len(self._optimizers) > 1:
            self._optimizer_states_apart = OptimizerArgument.refuse_shared(self._optimizers, args, self._optimizer_states_apart)
        if self._reads_grads:
            trailing += self._gradients.incoming(grad_owners, tensors)
        return trailing

    def _raise_rejected(self, error: AssertionError) -> None:
        if self.convention.backend != "inductor":
            raise error
        # Inductor's own size/stride asserts: the checks above should have
        # caught this first; never leak a bare AssertionError.
        raise PrecompileError(
            f"the compiled graph rejected its inputs: {error}; pass tensors with the "
            "captured shapes and layout, or precompile with backend='eager'"
        ) from error

    def _raise_edited(self, outputs: Any) -> None:
        raise PrecompileError(
            f"the captured graph returned {len(outputs)} outputs but the calling convention "
            f"describes {self._num_graph_outputs}: python_code was edited"
        )

    # -- module arguments (ModuleArguments walks them; the cache hit is inlined here) --

    def _module_entry(self, args: tuple) -> _ModuleCache:
        """The module arguments' cache entry, re-walked when it no longer holds."""
        # ModuleArguments.key(args), inlined: one call less on every call
        key = id(args[self._module_positions[0]]) if self._one_module else tuple(map(id, self._pick_modules(args)))
        cached = self._state_cache.get(key)
        if cached is None or cached.generation != _STRUCTURE[0] or not cached.watched_unchanged():
            cached = self._module_arguments.walk(self._pick_modules(args), key)
        return cached

    # -- copies: a loaded artifact is code, which copy keeps as one object ------
    # What it holds besides code are caches valid for any caller (one runnable
    # serves any model and any thread), so a copied model may share it.

    def __copy__(self) -> "PrecompiledFunction":
        return self

    def __deepcopy__(self, memo: dict) -> "PrecompiledFunction":
        return self

    def __reduce__(self) -> Any:
        raise PrecompileError(
            "a loaded precompile artifact cannot be pickled: it holds compiled code, not data; "
            "save its (python_code, cache) pair and load() them again where it is needed"
        )

    # -- introspection: supported hooks for benchmarks and debugging -----------
    # __call__ does not use them: its per-call path stays as it is.

    @property
    def checks(self) -> tuple[Check, ...]:
        """What every call checks before the graph runs, one ``Check`` each, in the order a call
        checks them (``TORCH_LOGS=precompile_checks`` lists them at load, the inspector prints them)."""
        c, inputs = self.convention, self._inputs
        checks = [
            *self._binding.checks(),
            *self._global_state.checks(),
            *self._module_arguments.checks(),
            *inputs.checks(),
            *inputs.pair_checks(self._state_alias_pairs),
            *inputs.size_checks(),
        ]
        for spec in c.optimizers:
            read = " and ".join(("lr", *spec.lifted))
            expected = (
                f"torch.optim.{spec.cls} over the captured parameters (parameter groups: {len(spec.groups)}), "
                f"the other group entries its step or fn read as baked ({read} read at every call)"
            )
            checks.append(Check("optimizer", f"args[{spec.position}]", expected))
            checks.append(Check("optimizer", f"args[{spec.position}] state", "no inference tensor, unless called under torch.inference_mode()"))
        if self._gradients is not None:
            checks += self._gradients.checks()
        return tuple(checks)

    def graph_inputs(self, *args: Any, **kwargs: Any) -> list:
        """The flat list of graph inputs that ``self(*args, **kwargs)`` would pass to the graph.

        In the calling convention's order: parameters and buffers, the user
        input tensors, free dim sizes, optimizer inputs, incoming grads, then
        the constants.  ``args`` are checked as a call checks them (a
        PrecompileError names what differs); the global state (grad mode,
        autocast, hooks) is not.  Nothing runs and nothing is written.
        """
        if kwargs or len(args) != self._arity:
            args = self._binding.bind(args, kwargs)
        user_args = self._pick_user_args(args)
        leaves = self._inputs.flatten(user_args)
        _, state = self._module_arguments.state_tensors(args, self._module_entry(args))
        tensors = [*state, *self._pick_tensor_inputs(leaves)]
        self._inputs.check_slowly(user_args, leaves, state)
        self._inputs.check(user_args, leaves, tensors)
        self._inputs.check_tensor_attributes(tensors)
        if self._runs_backward:
            self._inputs.refuse_inference_tensors(tensors)
        grad_owners = state
        if self._sharded:
            grad_owners, tensors = sharded_inputs(tensors, self._sharded, self._num_state, self._state_path)
        if self._state_alias_pairs:
            self._module_arguments.refuse_shared_memory(tensors[: self._num_state])
        if self._checks_grads:
            self._gradients.check_kept(grad_owners)
        return [*tensors, *self._trailing_inputs(args, leaves, state, grad_owners, tensors, []), *self._constants]

    def run_graph(self, inputs: list) -> Any:
        """Run the graph alone on ``inputs`` (from ``graph_inputs``), which it leaves as they are.

        Returns the graph's flat outputs: fn's tensor outputs, then the
        gradients of ``convention.grad_state``.  No check, no grad-mode switch
        (call it under ``torch.no_grad()`` as a call does), no ``.grad`` written,
        fn's result not rebuilt.
        """
        return self._run_graph(list(inputs))

    def with_graph(self, run_graph: Callable[[list], Any]) -> "PrecompiledFunction":
        """A runnable with this one's calling convention and checks around another graph.

        ``run_graph(list_of_inputs) -> outputs`` stands for the graph (it may
        consume the list); e.g. one returning precomputed outputs times the
        driver alone.
        """
        return type(self)(self.convention, run_graph, self._constants)


# ---------------------------------------------------------------------------
# Graph backends
# ---------------------------------------------------------------------------


def materialize_constants(specs: tuple[ConstantSpec, ...]) -> list[torch.Tensor]:
    constants = []
    for spec in specs:
        raw = bytearray(base64.b64decode(spec.data))
        flat = torch.frombuffer(raw, dtype=_dtype(spec.dtype)) if raw else torch.empty(0, dtype=_dtype(spec.dtype))
        constants.append(flat.reshape(spec.shape).to(spec.device, copy=True))
    return constants


def eager_runner(graph: Callable) -> Callable[[list], Any]:
    def run(inputs: list) -> Any:
        return graph(*inputs)

    return run


# ~~~~ driver part: gradients ~~~~
# The parameters' .grad around the graph (Note invariant 13).  Only in artifacts
# whose calling convention checks, reads or writes a .grad: a training step.


def other_grad_dtype(param: torch.Tensor) -> Any:
    """The ``grad_dtype`` (torch 2.11+) eager's AccumulateGrad casts ``param``'s gradient to, where it
    is not ``param``'s dtype; else None (fully_shard's ShardedGradient has none: its own path)."""
    grad_dtype = getattr(param, "grad_dtype", None)
    return grad_dtype if grad_dtype is not None and grad_dtype is not param.dtype else None


class Gradients:
    """What a call does with the parameters' ``.grad``: the incoming ``.grad`` checked
    (None or a tensor, as at capture) and passed to the graph where fn reads it, and
    ``.grad`` written once the graph ran, as ``backward()`` would (Note invariant 13).

    ``PrecompiledFunction`` and ``ResultWriter`` hold one (None where the convention
    has no gradients) and call into it under their per-call flags.
    """

    def __init__(self, convention: CallingConvention, tensor_path: Callable[[int], str], sharded: frozenset):
        self.convention = convention
        self._module_positions = tuple(m.position for m in convention.modules)
        self._tensor_path = tensor_path  # UserInputs': names a tensor graph input
        self._num_state = len(convention.state)
        # Read at every call: held here, one lookup instead of two through the convention.
        self._grads_none, self._grads_present = convention.grads_none, convention.grads_present
        self._grad_inputs = convention.grad_inputs
        self._grad_state, self._grads_cleared = convention.grad_state, convention.grads_cleared
        self._read_only_grads = frozenset(convention.grad_inputs_read_only)
        # Incoming .grad refused as inference tensors outside inference mode: every one where fn runs
        # backward (eager's AccumulateGrad adds in place), else those the graph writes.
        self._runs_backward = convention.needs_grad
        self._inference_refused = frozenset(
            index for index in convention.grad_inputs if convention.needs_grad or index not in self._read_only_grads
        )
        self._kept_zeros: dict[int, torch.Tensor] = {}  # state index -> zeros passed for a None .grad
        # Inductor's kernels take each graph input as memory of its own: the incoming .grad
        # must share none with another graph input where the graph writes either.
        self._checks_grads_apart = convention.backend == "inductor" and bool(convention.grad_inputs)
        # (weak references to the incoming .grad and the state last found apart, their storages)
        self._grads_apart: tuple[list, frozenset] | None = None
        self._num_outputs = len(convention.output_tensors)  # the graph's gradients follow them
        self._grads_assigned = frozenset(convention.grads_assigned)
        # The .grad backward adds to in place (not assigned), checked addable (no inference tensor, no
        # elements sharing memory) once per object: a weak reference to each .grad last found so.
        self._grads_added = tuple(index for index in convention.grad_state if index not in self._grads_assigned)
        self._grads_found_addable: list = [None] * len(self._grads_added)
        # fully_shard's new .grad is its reduce-scatter's result, as is (no AccumulateGrad).
        self._sharded = sharded
        self._grads_owned = frozenset(convention.grads_owned)
        # Owned gradients of parameters every call checks contiguous: kept where contiguous too.
        self._grads_kept_if_contiguous = frozenset(
            index for index in convention.grads_owned if _contiguous(convention.state[index].tensor)
        )

    def _parameter(self, index: int) -> str:
        """Names parameter ``index`` of the state as the caller reaches it: ``args[0].fc.weight``."""
        module_index, name = self.convention.state[index].names[0]
        return f"args[{self._module_positions[module_index]}].{name}"

    # -- before the graph --------------------------------------------------------

    def check_kept(self, params: list) -> None:
        """Invariant 13: the parameters whose None ``.grad`` fn tells from a tensor have the one they had at
        capture, each parameter the graph gives a gradient takes it in its dtype (its ``grad_dtype``), and each
        ``.grad`` backward adds to in place can take the add (no inference tensor, no expanded one)."""
        for index in self._grad_state:
            param = params[index]
            grad_dtype = other_grad_dtype(param)
            if grad_dtype is not None:
                raise PrecompileError(
                    f"{self._parameter(index)} has grad_dtype {grad_dtype}, not its dtype {param.dtype}: eager's "
                    f"backward would cast its gradient to {grad_dtype}, the graph computes it in {param.dtype} "
                    "(precompile refuses a grad_dtype at capture): set p.grad_dtype = p.dtype (or None), or call "
                    "fn eagerly"
                )
        found_addable = self._grads_found_addable
        for k, index in enumerate(self._grads_added):
            grad = params[index].grad
            if grad is None or (found_addable[k] is not None and found_addable[k]() is grad):
                continue
            if grad.is_inference():  # eager's in-place add refuses it, after its forward ran
                raise inference_tensor_error(f"{self._parameter(index)}.grad", "backward")
            if not grad.is_sparse and not grad.is_contiguous():
                self._refuse_self_overlapping(index, grad)
            found_addable[k] = weakref.ref(grad)
        for index in self._grads_none:
            if params[index].grad is not None:
                raise PrecompileError(
                    f"{self._parameter(index)}.grad is a tensor, which was None at capture; backward does not "
                    "reach it and fn reads its .grad (an optimizer's step, zero_grad, clip_grad_norm_), which "
                    "eager would then use, while the graph skips it: set it to None (opt.zero_grad(), "
                    "p.grad = None), or, where it requires grad, precompile with a .grad there"
                )
        for index in self._grads_present:
            if params[index].grad is None:
                raise PrecompileError(
                    f"{self._parameter(index)}.grad is None, which was a tensor at capture; fn uses its .grad "
                    "where backward has not added to it (eager's optimizer would skip it, p.grad.mul_() would "
                    "raise; the graph computes with zeros): give it a .grad, or precompile with .grad None"
                )

    def _refuse_self_overlapping(self, index: int, grad: torch.Tensor) -> None:
        """A PrecompileError where ``grad`` has elements at one memory location (a stride 0 over a dim of
        size > 1, as ``expand`` makes: what eager's in-place add refuses, after its forward and part of
        its backward ran)."""
        if any(stride == 0 and size > 1 for size, stride in zip(grad.shape, grad.stride())):
            raise PrecompileError(
                f"{self._parameter(index)}.grad has strides {grad.stride()} for shape {tuple(grad.shape)}: "
                "several of its elements are one memory location (an expanded tensor), which eager's backward "
                "refuses to add the gradient to in place (RuntimeError, after its forward and part of its "
                "backward changed state): give it a .grad of its own (p.grad = p.grad.clone()), or set it "
                "to None (opt.zero_grad())"
            )

    def incoming(self, grad_owners: list, tensors: list) -> list:
        """Incoming .grad of each grad-input parameter (zeros when None: 0 + g is g), with the
        layout of its graph input in ``tensors``.

        The zeros for an input the graph only reads are made once and kept:
        their layout is the parameter's, which every call checked.
        """
        grads, incoming = [], []
        for index in self._grad_inputs:
            param, grad = tensors[index], grad_owners[index].grad
            if grad is not None:
                incoming.append((index, grad))
            if grad is None:
                grad = self._kept_zeros.get(index)
                if grad is None:
                    grad = torch.zeros_like(param, memory_format=torch.preserve_format)
                    if index in self._read_only_grads:
                        self._kept_zeros[index] = grad
            elif grad.is_sparse:  # no strides: checked first
                raise PrecompileError(
                    f"{self._parameter(index)}.grad is a sparse tensor; fn reads or "
                    "accumulates onto it inside the graph, which needs a dense (strided) .grad of the "
                    "parameter's shape, dtype and strides: set it to None (opt.zero_grad()) or to "
                    "its .to_dense(), or call fn eagerly"
                )
            elif grad.shape != param.shape or grad.dtype != param.dtype or grad.stride() != param.stride():
                raise PrecompileError(
                    f"{self._parameter(index)}.grad has shape {tuple(grad.shape)}, "
                    f"dtype {grad.dtype}, strides {grad.stride()}; fn accumulates onto it inside the graph, "
                    "which needs the parameter's shape, dtype and strides: set it to None (opt.zero_grad())"
                )
            elif grad.is_inference() and index in self._inference_refused and not _is_inference_mode_enabled():
                why = "backward" if self._runs_backward else "the graph writes it in place"
                raise inference_tensor_error(f"{self._parameter(index)}.grad", why)
            grads.append(grad)
        if self._checks_grads_apart and incoming:
            self._refuse_shared_grads(incoming, tensors)
        return grads

    def _refuse_shared_grads(self, incoming: list, tensors: list) -> None:
        """A PrecompileError where an incoming ``.grad`` (``incoming``: (state index, .grad))
        shares memory with another graph input and the graph writes either of them.

        Checked again only when the .grad or state tensors are other objects than at
        the last check; the user inputs' storages are compared at every call.
        """
        objects = [grad for _, grad in incoming] + tensors[: self._num_state]
        checked = self._grads_apart
        if (
            checked is None
            or len(checked[0]) != len(objects)
            or any(ref() is not tensor for ref, tensor in zip(checked[0], objects))
        ):
            self._grads_apart = None
            self._raise_if_grads_overlap(incoming, tensors)
            pointers = frozenset(grad.untyped_storage().data_ptr() for _, grad in incoming)
            self._grads_apart = ([weakref.ref(tensor) for tensor in objects], pointers)
        elif any(tensor.untyped_storage().data_ptr() in checked[1] for tensor in tensors[self._num_state :]):
            self._raise_if_grads_overlap(incoming, tensors)

    def _raise_if_grads_overlap(self, incoming: list, tensors: list) -> None:
        written = set(self.convention.mutated)
        read_only = frozenset(self.convention.grad_inputs_read_only)
        named = [(f"{self._parameter(index)}.grad", grad, index not in read_only) for index, grad in incoming]
        named += [(self._tensor_path(i), tensor, i in written) for i, tensor in enumerate(tensors)]
        for k, (name, grad, grad_written) in enumerate(named[: len(incoming)]):
            for other, tensor, other_written in named[k + 1 :]:
                if (grad_written or other_written) and _overlap(grad, tensor):
                    raise PrecompileError(
                        f"{name} shares memory with {other}, but backend='inductor' compiled the graph, which "
                        f"writes {name if grad_written else other}, for distinct tensors, so it would "
                        "compute something else than eager: give each parameter a .grad of its own "
                        "(p.grad = p.grad.clone()), or set them to None (opt.zero_grad())"
                    )

    # -- after the graph ---------------------------------------------------------

    def write(self, state: list, outputs: Any) -> None:
        # Like eager backward() (AccumulateGrad): a new .grad when None, else accumulate in
        # place, but a dense gradient onto a sparse .grad out of place, `new + old`, as eager
        # does; grads_assigned: the graph's gradient is already the final .grad.
        assigned, kept_if_contiguous = self._grads_assigned, self._grads_kept_if_contiguous
        for index, grad in zip(self._grad_state, outputs[self._num_outputs :]):
            param = state[index]
            old = param.grad
            if index in assigned:
                param.grad = grad
            elif old is None:
                if (index in kept_if_contiguous and grad.is_contiguous()) or index in self._sharded:  # common: one C call
                    param.grad = grad
                else:
                    param.grad = new_grad(grad, param, index in self._grads_owned)
            elif old.is_sparse and not grad.is_sparse:  # add_(sparse, dense) would raise
                param.grad = grad + old
            else:
                old.add_(grad)
        for index in self._grads_cleared:
            state[index].grad = None

    # -- introspection -------------------------------------------------------------

    def checks(self) -> list[Check]:
        """The grad rows of ``PrecompiledFunction.checks``."""
        c, checks = self.convention, []
        if c.grad_inputs:
            grads = f".grad of {len(c.grad_inputs)} parameters"
            apart = ", sharing no memory with another graph input where the graph writes either" if self._checks_grads_apart else ""
            checks.append(Check("grad", grads, f"None, or of the parameter's shape, dtype and strides{apart}"))
            if self._inference_refused:
                checks.append(Check("grad", grads, "no inference tensor where fn runs backward or the graph writes it"))
        if self._grads_added:
            grads = f".grad of {len(self._grads_added)} parameters backward adds to"
            checks.append(Check("grad", grads, "None, or no inference tensor and no two of its elements at one memory location"))
        for index in c.grads_none:
            checks.append(Check("grad", f"{self._parameter(index)}.grad", "None, as at capture"))
        for index in c.grads_present:
            checks.append(Check("grad", f"{self._parameter(index)}.grad", "a tensor, as at capture"))
        return checks


def new_grad(grad: torch.Tensor, param: torch.Tensor, owned: bool) -> torch.Tensor:
    """The ``.grad`` eager's AccumulateGrad makes of ``grad`` for ``param`` whose ``.grad`` is None:
    ``grad`` itself where nothing else holds it (``owned``) and it obeys the layout contract,
    else a copy that obeys it (torch/csrc/autograd/functions/accumulate_grad.h)."""
    if grad.is_sparse:
        return grad if owned else grad.clone()
    dense = _non_overlapping_and_dense(param.shape, param.stride())
    if owned and (_obeys_layout_contract(grad, param) if dense else grad.is_contiguous()):
        return grad
    if dense:
        return grad.new_empty_strided(param.shape, param.stride()).copy_(grad)
    return grad.clone(memory_format=torch.contiguous_format)


def _obeys_layout_contract(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """torch's utils::obeys_layout_contract for a dense ``param``: ``grad`` has its strides
    (a size-1 dim's stride is free, but not 0)."""
    strides, own = grad.stride(), param.stride()
    return strides == own or all(
        stride != 0 if size == 1 else stride == expected for size, stride, expected in zip(grad.shape, strides, own)
    )


def _non_overlapping_and_dense(shape: tuple, strides: tuple) -> bool:
    """c10's compute_non_overlapping_and_dense (Tensor has no public method for it; the
    Python one in torch._prims_common costs ~75 us)."""
    expected = 1
    for size, stride in sorted(((size, stride) for size, stride in zip(shape, strides) if size != 1), key=lambda d: d[1]):
        if size == 0:
            return True
        if stride != expected:
            return False
        expected *= size
    return True


def _contiguous(spec: TensorSpec) -> bool:
    """Whether every tensor matching ``spec`` is contiguous (False where its strides are unchecked)."""
    if spec.memory_format is not None:
        return spec.memory_format == "contiguous_format"
    if spec.stride is None:
        return False
    expected = 1
    for size, stride in reversed(list(zip(spec.shape, spec.stride))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory ``a`` and ``b`` span (from their first to their last element) overlaps."""
    if not _is_alias_of(a, b) or a.numel() == 0 or b.numel() == 0:
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.storage_offset() * t.element_size()
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) * t.element_size()
        return start, start + last + t.element_size()

    (a_start, a_end), (b_start, b_end) = span(a), span(b)
    return a_start < b_end and b_start < a_end


# ~~~~ driver part: data_parallel ~~~~
# DistributedDataParallel arguments (Note invariant 16).  Only in artifacts with
# a DistributedDataParallel argument.


def is_data_parallel(module: Any) -> bool:
    return isinstance(module, torch.nn.parallel.DistributedDataParallel)


def data_parallel_comm_hook(ddp: Any) -> str | None:
    """None for DDP's own averaging, ``"allreduce_hook"`` for torch's built-in hook
    that computes the same, else a description of the registered hook."""
    name = _ddp_comm_hook_name(ddp)
    if name is None:
        return None
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    hooks = getattr(ddp, _DDP_COMM_HOOKS)
    if len(hooks) == 1 and hooks[0][0] is allreduce_hook and hooks[0][1] in (None, ddp.process_group):
        return "allreduce_hook"
    return f"{name!r} (registered with register_comm_hook / _register_builtin_comm_hook)"


def data_parallel_buffer_sync(ddp: Any) -> tuple[str, bool]:
    """(attribute, value) of DDP's flag for broadcasting buffers from rank 0 before each forward."""
    values = vars(ddp)
    name = next(name for name in _DDP_BUFFER_SYNC if name in values)
    return name, bool(values[name])


def data_parallel_reduced(ddp: Any) -> tuple:
    """Names in the wrapped module of the parameters DDP's reducer averages, in module order."""
    ids = _ddp_reduced_parameters(ddp)
    return tuple(name for name, param in ddp.module.named_parameters() if id(param) in ids)


_DATA_PARALLEL_FLAGS = ("find_unused_parameters", "static_graph")


def check_data_parallel(where: str, ddp: Any, spec: DataParallelSpec, has_buffers: bool) -> list:
    """Refuse a DDP argument whose settings differ from ``spec``; return the (vars, name)
    entries whose value objects the module cache watches (a change re-runs this check)."""
    if not is_data_parallel(ddp):
        raise PrecompileError(
            f"{where} is a {type(ddp).__name__}, but was a DistributedDataParallel at capture (the graph "
            f"all-reduces gradients over {spec.world_size} ranks): pass the DDP-wrapped model, or precompile "
            "fn with this one"
        )
    group = ddp.process_group
    if group.size() != spec.world_size:
        raise PrecompileError(
            f"{where}.process_group has {group.size()} ranks, but the artifact was captured with "
            f"{spec.world_size} (its graph averages gradients over that many): precompile again for a "
            f"world size of {group.size()}"
        )
    if group.group_name != spec.group_name or _resolve_process_group(spec.group_name) is not group:
        raise PrecompileError(
            f"{where}.process_group is {group.group_name!r}, but the graph's collectives run on the process "
            f"group {spec.group_name!r} (the default group at capture): wrap the model with DDP on the "
            "default process group"
        )
    values = vars(ddp)
    if values["require_backward_grad_sync"] != spec.grad_sync:
        raise PrecompileError(
            f"{where}.require_backward_grad_sync is {values['require_backward_grad_sync']}, but was "
            f"{spec.grad_sync} at capture: this artifact "
            + ("all-reduces gradients, and it is called inside ddp.no_sync()" if spec.grad_sync else
               "was captured inside ddp.no_sync() (it does not all-reduce), and it is called outside it")
            + ". For gradient accumulation precompile two steps, one under `with ddp.no_sync():` for the "
            "micro-batches and one without for the last, and call each in the same context"
        )
    for name in _DATA_PARALLEL_FLAGS:
        if values[name] != getattr(spec, name):
            raise PrecompileError(
                f"{where}.{name} is {values[name]}, but was {getattr(spec, name)} at capture "
                "(which parameters may go without a gradient depends on it): construct DDP as at capture"
            )
    hook = data_parallel_comm_hook(ddp)
    if hook != spec.comm_hook:
        raise PrecompileError(
            f"{where} has the comm hook {hook}, but {spec.comm_hook or 'none'} at capture (the graph's "
            "gradient all-reduce is baked): register the same hook, or precompile again"
        )
    buffer_sync, syncs = data_parallel_buffer_sync(ddp)
    if has_buffers and syncs != spec.broadcast_buffers:
        raise PrecompileError(
            f"{where}.{buffer_sync} is {syncs}, but was {spec.broadcast_buffers} at capture: the graph "
            + ("broadcasts" if spec.broadcast_buffers else "does not broadcast")
            + f" the module's buffers from rank 0 before the forward: construct DDP with {buffer_sync}="
            f"{spec.broadcast_buffers} as at capture, or precompile again"
        )
    if spec.broadcast_buffers and not values["require_forward_param_sync"]:
        raise PrecompileError(
            f"{where}.require_forward_param_sync is False (DDP's previous forward ran without gradient sync, "
            "e.g. inside no_sync(), so DDP would not broadcast the buffers now), but the graph broadcasts "
            f"them: call it after a synchronizing step, or construct DDP with {buffer_sync}=False"
        )
    ignored = tuple(sorted(values["parameters_to_ignore"]))
    if spec.ignored is not None and ignored != spec.ignored:
        raise PrecompileError(
            f"{where}.parameters_to_ignore is {list(ignored)}, but was {list(spec.ignored)} at capture (the graph "
            "averages the gradients and broadcasts the buffers of the others): construct DDP with the same "
            "ignored parameters and buffers as at capture, or precompile again"
        )
    reduced = data_parallel_reduced(ddp)
    if spec.reduced is not None and reduced != spec.reduced:
        raise PrecompileError(
            f"{where}: DDP averages the gradients of {list(reduced)}, but of {list(spec.reduced)} at capture "
            "(those of the module it wrapped that required grad when it was constructed, less parameters_to_ignore): "
            "wrap the model in DDP as at capture (requires_grad set before, ddp.module not replaced since), or "
            "precompile again"
        )
    watched = ("require_backward_grad_sync", "require_forward_param_sync", "process_group", "parameters_to_ignore",
               *_DATA_PARALLEL_FLAGS)
    return [(values, name) for name in (*watched, buffer_sync)]


# ~~~~ driver part: sharded ~~~~
# Parameters that are DTensors over several ranks, fully_shard (FSDP2)'s or tensor
# parallel's (Note invariant 17).  Only in artifacts with such a parameter.


# Tensor parallel's forward hooks (parallelize_module's styles install them, most through
# distribute_module): closures over the device mesh and the style's layouts, so what one
# does is its code and its closure's values.  A call accepts one only where capture recorded
# the same description (Note invariant 17).
def parallel_hook_description(hook: Any) -> str | None:
    """A tensor parallel hook's code and closure values as text, or None for any other hook."""
    module, closure = getattr(hook, "__module__", None) or "", getattr(hook, "__closure__", None)
    if not module.startswith("torch.distributed.tensor") or closure is None:
        return None
    values = [_describe_hook_value(cell.cell_contents) for cell in closure]
    return None if None in values else f"{module}.{hook.__qualname__}({', '.join(values)})"


def _describe_hook_value(value: Any) -> str | None:
    """A tensor parallel hook's closure value as text: its mesh by process group, its style's
    layouts and flags, the functions it calls by name; None for anything else."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = [_describe_hook_value(v) for v in value]
        return None if None in items else f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if isinstance(value, dict):
        items = [_describe_hook_value(item) for item in value.items()]
        return None if None in items else f"{{{', '.join(items)}}}"
    if isinstance(value, functools.partial):
        parts = [_describe_hook_value(value.func), _describe_hook_value(value.args), _describe_hook_value(value.keywords)]
        return None if None in parts else "partial({}, {}, {})".format(*parts)
    cls = type(value)
    if cls.__module__.startswith("torch.distributed"):
        if cls.__name__ == "DeviceMesh":  # by shape: a 2-D mesh's slice holds other ranks on other ranks
            return f"DeviceMesh({tuple(value.shape)}, {getattr(value, 'mesh_dim_names', None)!r})"
        if cls.__module__.endswith("placement_types"):
            return repr(value)
        if cls.__module__.startswith("torch.distributed.tensor.parallel"):  # a ParallelStyle
            described = _describe_hook_value(vars(value))
            return None if described is None else f"{cls.__qualname__}{described}"
    if isinstance(value, (types.FunctionType, types.MethodType)) and (value.__module__ or "").startswith("torch.distributed"):
        return value.__qualname__
    return None


def mixed_precision(state: Any) -> str | None:
    """A fully_shard module's mixed precision policy as text, or None where it casts nothing."""
    policy = fully_shard_policy(state)
    return None if policy.param_dtype is None and policy.reduce_dtype is None and policy.output_dtype is None else repr(policy)


def fully_shard_unsupported(group: Any) -> str | None:
    """What of a fully_shard parameter group's settings the graph does not reproduce, or None.

    The graph all-gathers the parameters and reduce-scatters the gradients, averaged, in
    the dtypes the group's mixed precision policy says, as fully_shard does."""
    if type(group.offload_policy).__name__ != "OffloadPolicy":  # the base class is "no offload"
        return (
            f"it offloads parameters to the CPU ({type(group.offload_policy).__name__}), which precompile does "
            "not support: fully_shard it without offload_policy"
        )
    if not getattr(group, "reshard_after_backward", True):
        return (
            "it does not reshard after backward (set_reshard_after_backward(False)): eager fully_shard leaves "
            "the module holding its unsharded parameters after backward, the artifact leaves its shards; call "
            "set_reshard_after_backward(True)"
        )
    if not group.reduce_grads:
        return (
            "its gradient sync is off (set_requires_gradient_sync(False), accumulation without communication), "
            "which precompile does not support yet: the graph reduce-scatters every gradient; call "
            "set_requires_gradient_sync(True)"
        )
    for name, default in _FULLY_SHARD_DEFAULTS:
        if getattr(group, name, default) != default:
            return (
                f"its {name.lstrip('_')} is {getattr(group, name)!r}, not {default!r} as the graph's gradient "
                "reduction assumes: use fully_shard's default"
            )
    for name in _FULLY_SHARD_COMMS:
        comm = getattr(group, name, None)
        if comm is not None and not type(comm).__module__.startswith("torch.distributed"):
            return (
                f"its {name.strip('_')} is a {type(comm).__qualname__} (set_custom_all_gather / "
                "set_custom_reduce_scatter), which the graph does not run (it communicates with torch's "
                "collectives): shard the module without a custom collective, or run it eagerly"
            )
    return None


def check_fully_shard(named_modules: list, policies: Any) -> list:
    """Refuse a module fully_shard sharded with settings the graph does not reproduce, or with
    another mixed precision policy than ``policies`` (path, policy) records; return the (vars,
    name) entries of those settings, which the module cache watches."""
    watched, expected = [], dict(policies)
    for path, module in named_modules:
        state = fully_shard_state(module)
        if state is None:
            continue
        policy = mixed_precision(state)
        if policy != expected.get(path):
            raise PrecompileError(
                f"{path} is sharded by fully_shard with {'mixed precision policy ' + policy if policy else 'no mixed precision policy'}, "
                f"but {'with ' + expected[path] if path in expected else 'without one'} at capture (the graph casts as capture's "
                "policy does): shard it with capture's mp_policy, or precompile again"
            )
        watched.append((vars(state), "_mp_policy"))  # fully_shard_policy's attribute
        for group in fully_shard_param_groups(state):
            problem = fully_shard_unsupported(group)
            if problem is not None:
                raise PrecompileError(f"{path} is sharded by fully_shard, and {problem}")
            values = vars(group)
            watched += [(values, name) for name in ("reduce_grads", "reshard_after_backward", "offload_policy")]
            watched += [(values, name) for name, _ in _FULLY_SHARD_DEFAULTS]
            watched += [(values, name) for name in _FULLY_SHARD_COMMS]
    return watched


def parallel_style_settings(named_modules: list) -> list:
    """The (vars, name) entries of the ParallelStyle objects tensor parallel's hooks close
    over (PrepareModuleInput's read its layouts at every call), which the module cache
    watches: a changed setting has find_hook describe the hook again."""
    watched, pending = [], [
        cell.cell_contents
        for _, module in named_modules
        for attribute in _MODULE_HOOKS
        for hook in (getattr(module, attribute, None) or {}).values()
        if parallel_hook_description(hook) is not None
        for cell in hook.__closure__
    ]
    while pending:
        value = pending.pop()
        if type(value).__module__.startswith("torch.distributed.tensor.parallel"):
            settings = vars(value)
            watched += [(settings, name) for name in settings]
            pending += settings.values()
    return watched


def check_sharded_parameters(accessors: list, sharded: list, state_path: Callable) -> list:
    """Refuse a fully_shard parameter not sharded as captured; return the entries of their
    modules' tables the module cache watches (a replaced parameter is checked again)."""
    for index, spec in sharded:
        table, name = accessors[index]
        check_sharded(state_path(index), table[name], spec)
    return [accessors[index] for index, _ in sharded]


def check_sharded(where: str, param: Any, spec: ShardSpec) -> None:
    """Refuse a parameter that is not sharded as ``spec`` records."""
    sharder = "tensor parallel" if not spec.gathered else "fully_shard" + (" and tensor parallel" if spec.parallel_group_name else "")
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None or not isinstance(param, dtensor.DTensor):
        raise PrecompileError(
            f"{where} is a {type(param).__name__}, but was a DTensor sharded by {sharder} at capture (the graph "
            "takes its local shard): pass the model sharded as at capture"
            + (" (after an explicit model.unshard(), call model.reshard())" if spec.gathered else "")
        )
    mesh, placements, groups = param.device_mesh, tuple(map(repr, param.placements)), spec.mesh_groups
    if mesh.ndim != len(groups) or placements != spec.placements or tuple(param.shape) != spec.shape:
        raise PrecompileError(
            f"{where} is a DTensor of shape {tuple(param.shape)} placed [{', '.join(placements)}] on a {mesh.ndim}-D "
            f"mesh, but was of shape {spec.shape} placed [{', '.join(spec.placements)}] on a {len(groups)}-D mesh at "
            "capture: shard the model as at capture, or precompile again"
        )
    for dim, (_, world_size) in enumerate(groups):
        if mesh.size(dim) != world_size:
            raise PrecompileError(
                f"{where} is sharded over {mesh.size(dim)} ranks, but over {world_size} at capture (the graph's "
                f"shapes and collectives are for that many): precompile again for a world size of {mesh.size(dim)}"
            )
    if spec.mesh_ranks and root_mesh_ranks(mesh) != spec.mesh_ranks:
        raise PrecompileError(
            f"{where} is sharded over a device mesh of the ranks {list(root_mesh_ranks(mesh))}, but of the ranks "
            f"{list(spec.mesh_ranks)} at capture: shard the model over the same device mesh"
        )
    for dim, (group_name, _) in enumerate(groups):
        group = mesh.get_group(dim)
        if spec.mesh_ranks and not _process_group_known(group_name):  # this rank's group on that dim (same mesh)
            _register_process_group(group_name, group)
        if _resolve_process_group(group_name) is not group or (not spec.mesh_ranks and group.group_name != group_name):
            raise PrecompileError(
                f"{where} is sharded over the process group {group.group_name!r}, but the graph's collectives "
                f"run on {group_name!r} (its group at capture): shard the model over the same device mesh"
            )


def gradient_placements(param: Any, spec: ShardSpec) -> tuple:
    """The placements of ``param``'s .grad as backward leaves it: the parameter's, or those
    ``spec.grad_placements`` names (``Partial(sum)``)."""
    if not spec.grad_placements:
        return tuple(param.placements)
    dtensor = sys.modules["torch.distributed.tensor"]
    by_name = {repr(p): p for p in (*param.placements, dtensor.Replicate(), dtensor.Partial("sum"))}
    return tuple(by_name[name] for name in spec.grad_placements)


class ShardedGradient:
    """A DTensor parameter as the gradient reader and writer see it: ``.grad`` is the local
    shard of its DTensor gradient, and setting it sets a DTensor placed as backward leaves
    it (``placements``), as FSDP2's reduce-scatter and tensor parallel's backward do."""

    __slots__ = ("param", "placements")

    def __init__(self, param: Any, placements: tuple):
        self.param, self.placements = param, placements

    @property
    def grad(self) -> torch.Tensor | None:
        grad = self.param.grad  # a DTensor placed as the parameter (sharded_inputs checked it)
        return None if grad is None else getattr(grad, DTENSOR_LOCAL)

    @grad.setter
    def grad(self, local: torch.Tensor | None) -> None:
        param = self.param
        param.grad = None if local is None else type(param).from_local(
            local, param.device_mesh, self.placements, run_check=False, shape=param.shape, stride=param.stride()
        )


def sharded_inputs(tensors: list, sharded: list, num_state: int, state_path: Callable) -> tuple[list, list]:
    """(gradient owners, graph inputs) for the checked ``tensors``, whose sharded
    parameters are DTensors: each one's gradient owner is a ShardedGradient (what reads
    and writes ``.grad``); the graph takes its local shard (contiguous, as fully_shard
    and tensor parallel keep it, where the graph assumes it).  Refuses, before
    anything runs, a ``.grad`` the writer could not accumulate into."""
    owners, tensors = list(tensors[:num_state]), list(tensors)
    for index, spec in sharded:
        param = tensors[index]
        local = tensors[index] = getattr(param, DTENSOR_LOCAL)
        placements = gradient_placements(param, spec)
        if not local.is_contiguous():
            raise PrecompileError(
                f"{state_path(index)}: its local shard has strides {local.stride()}, not contiguous as at capture "
                "and as the graph assumes: shard the model as at capture (after an explicit "
                "model.unshard(), call model.reshard())"
            )
        grad = param.grad
        if grad is not None and (
            type(grad) is not type(param)
            or tuple(grad.placements) != placements
            or getattr(grad, DTENSOR_LOCAL).shape != local.shape
        ):
            raise PrecompileError(
                f"{state_path(index)}.grad is a {type(grad).__name__} of shape {tuple(grad.shape)}, not a DTensor placed "
                f"{list(placements)} as backward leaves it, which the step accumulates into: set it to None (opt.zero_grad())"
            )
        owners[index] = ShardedGradient(param, placements)
    return owners, tensors


# ~~~~ driver part: optimizer ~~~~
# Optimizer arguments (Note [precompile programming model], invariant 11).  Only
# in artifacts with an optimizer argument.


def optimizer_methods_set_on_instance(optimizer: Any) -> str | None:
    """Which of ``step`` / ``zero_grad`` is set on ``optimizer`` itself (``opt.step = wrapper``),
    shadowing its class's, or None.  The trace ran what fn's ``opt.step()`` found at capture, which
    no call compares, so one is refused wherever it is found; torch's LR scheduler wrapper of the
    class's own step (it only sets ``_opt_called``, as every call does) excepted."""
    own = optimizer.__dict__
    for name in ("step", "zero_grad"):
        method = own.get(name)
        if method is None and name not in own:
            continue
        if (
            name == "step"
            and getattr(method, "_wrapped_by_lr_sched", False)
            and getattr(method, "__wrapped__", None) is getattr(type(optimizer), "step", None)
        ):
            continue
        what = getattr(method, "__qualname__", None) or type(method).__qualname__
        return f"its {name}() is set on the optimizer itself ({what}), shadowing torch.optim's (del opt.{name} removes it)"
    return None


def guard_passes(guard: Any, tensors: list) -> bool:
    try:
        return guard.check(*tensors)
    except TypeError:  # a non-tensor where a tensor was captured
        return False


def hyperparameter(group: dict, key: str) -> Any:
    """``group[key]``, MISSING where absent (eager's step raises KeyError); ``"betas[1]"`` names one
    element of a tuple option."""
    name, _, index = key.partition("[")
    if not index:
        return group.get(key, MISSING)
    value = group.get(name, MISSING)
    position = int(index[:-1])
    return value[position] if isinstance(value, (tuple, list)) and position < len(value) else value


def optimizer_state_keys(cls: str, group: dict) -> tuple[str, ...]:
    """The state one stepped parameter of ``group`` has after eager's first step."""
    if cls == "SGD":
        return OPTIMIZER_STATE_KEYS[cls] if group["momentum"] != 0 else ()
    return OPTIMIZER_STATE_KEYS[cls] + (("max_exp_avg_sq",) if group["amsgrad"] else ())


def initial_optimizer_state(keys: tuple[str, ...], param: torch.Tensor) -> dict:
    """State as eager's ``_init_group`` creates it before the first step.

    SGD's first step sets ``momentum_buffer = grad.clone()``; the graph computes
    ``zeros * momentum + grad`` instead, which is the same value (dampening is
    required to be 0).  Adam's ``step`` is a CPU scalar of ``_get_scalar_dtype()``.
    """
    state = {}
    for key in keys:
        if key == "step":
            state[key] = torch.tensor(0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32)
        else:
            state[key] = torch.zeros_like(param, memory_format=torch.preserve_format)
    return state


def _group_key(key: str) -> str:
    """``"betas[1]"`` -> ``['betas'][1]``, ``"lr"`` -> ``['lr']``."""
    name, bracket, rest = key.partition("[")
    return f"[{name!r}]" + bracket + rest


class OptimizerArgument:
    """Per-call work for one optimizer argument: check it, return its graph inputs."""

    def __init__(self, spec: OptimizerSpec, backend: str, sharded: bool, runs_backward: bool):
        self.spec, self.backend, self.sharded = spec, backend, sharded
        self.runs_backward = runs_backward  # fn calls backward (the refusal's reason for an inference tensor)
        self.where = f"args[{spec.position}] (optimizer)"
        self.hyper_keys = [tuple(k for k, _ in group) for group in spec.hyper]
        self.hyper_values = [tuple(v for _, v in group) for group in spec.hyper]
        self.scalars = {}  # (group, key) -> (value, its 0-dim float64 tensor), lr and the lifted keys
        self.guard = None  # tensor_guard() over the state tensors, armed after a full check
        self._unshared: list = []  # the state tensors last found not to share memory

    def inputs(self, optimizer: Any, state: list, created: list, others: list, name_of: Callable) -> list:
        """Check ``optimizer``; its graph inputs.  State it lacks is made and appended to ``created``.
        ``others``: the graph's tensor inputs before it (``name_of`` names them), which no state
        tensor may share memory with."""
        spec = self.spec
        if type(optimizer) is not getattr(torch.optim, spec.cls):
            raise PrecompileError(
                f"{self.where}: expected a torch.optim.{spec.cls} (captured), got {type(optimizer).__qualname__}"
            )
        hooks = _optimizer_step_hooks(optimizer)
        if hooks is not None:
            raise PrecompileError(f"{self.where}: {hooks}, which the artifact would not run; remove them")
        shadowed = optimizer_methods_set_on_instance(optimizer)
        if shadowed is not None:
            raise PrecompileError(
                f"{self.where}: {shadowed}; the artifact runs the step traced at capture, not it: remove it "
                "or call fn eagerly"
            )
        if optimizer.defaults.get("differentiable"):  # not a group entry: torch's step reads it here
            raise PrecompileError(
                f"{self.where}.defaults['differentiable'] is True, where eager's step raises RuntimeError (it "
                "updates the parameters in place with grad mode on); set it back to False"
            )
        groups = optimizer.param_groups
        if len(groups) != len(spec.groups):
            raise PrecompileError(
                f"{self.where}: expected {len(spec.groups)} param groups (captured), got {len(groups)}"
            )
        lrs = []
        for index, group in enumerate(groups):
            self._check_group(index, group, state)
            lrs += [self._lifted_tensor(index, key, group) for key in ("lr", *spec.lifted)]
        tensors, entries = [], {}
        for group_index, param_index in spec.stepped:
            param = groups[group_index]["params"][param_index]
            entry = optimizer.state.get(param)
            if entry is None and not isinstance(optimizer.state, collections.defaultdict):
                raise PrecompileError(
                    f"{self.where}.state is a {type(optimizer.state).__name__} without an entry for "
                    f"param_groups[{group_index}]['params'][{param_index}], where eager's step raises KeyError "
                    "(torch.optim keeps a collections.defaultdict(dict)): restore it"
                )
            if not entry:  # before eager's first step: create it as _init_group would
                entry = entries[param] = initial_optimizer_state(spec.keys, param)
            try:
                tensors += [entry[key] for key in spec.keys]
            except KeyError as error:
                raise PrecompileError(
                    f"{self.where} state of param_groups[{group_index}]['params'][{param_index}] has no "
                    f"{error.args[0]!r} (captured keys {list(spec.keys)}); load a state_dict of the same optimizer"
                ) from None
        if self.sharded:  # fully_shard's parameters' state is DTensors, as theirs: the graph takes their shards
            tensors = list(map(local_shard_of, tensors))
        if self.guard is None or not guard_passes(self.guard, tensors):
            # Checked here only (see PrecompiledFunction.__call__ on the dispatch keys the guard records).
            self._check_state(tensors)
            self.guard = tensor_guard(tensors, spec.tensors)
        if len(tensors) != len(self._unshared) or any(map(operator.is_not, tensors, self._unshared)):
            self._refuse_shared_state(tensors, others, name_of, groups)
            self._unshared = tensors
        created.append((optimizer, entries))
        return lrs + tensors

    @staticmethod
    def refuse_shared(optimizers: list, args: tuple, checked: list) -> list:
        """Two optimizer arguments are distinct objects whose state tensors share no memory.

        The graph steps each optimizer argument with its own state inputs: one
        optimizer passed twice would get its missing state created twice (the
        second step would not see the first's), and state shared between two
        optimizers (``o2.load_state_dict(o1.state_dict())`` keeps same-dtype
        tensors) would be read by the second step before the first's update
        reaches it, where eager's steps run one after the other.  Each optimizer's
        own state is checked by ``OptimizerArgument`` (``_unshared``: the tensors
        last checked); this compares them across optimizers, as that check does
        when they are other objects than ``checked`` (those last found apart,
        which it returns)."""
        refuse_repeated_optimizers(args, [optimizer.spec.position for optimizer in optimizers])
        tensors = [tensor for optimizer in optimizers for tensor in optimizer._unshared]
        if len(tensors) == len(checked) and not any(map(operator.is_not, tensors, checked)):
            return checked
        if not _distinct_storages(tensors):
            earlier: list = []
            for optimizer in optimizers:
                named = [(optimizer._state_name(j), tensor) for j, tensor in enumerate(optimizer._unshared)]
                _raise_if_state_shares(named, earlier)
                earlier += named
        return tensors

    @staticmethod
    def stepped(optimizer: Any, entries: dict) -> None:
        """After the graph stepped ``optimizer``: keep the state it created, as eager's step does."""
        optimizer.state.update(entries)
        optimizer._opt_called = True  # what eager opt.step() tells an LR scheduler

    def _check_group(self, index: int, group: dict, state: list) -> None:
        params, expected = group["params"], self.spec.groups[index]
        if len(params) != len(expected) or not all(p is state[i] for p, i in zip(params, expected)):
            raise PrecompileError(
                f"{self.where} param_groups[{index}]['params']: expected the {len(expected)} parameters of "
                "the module arguments it held at capture, in the same order, got other tensors; build the "
                "optimizer over the model passed with it"
            )
        keys, want = self.hyper_keys[index], self.hyper_values[index]
        got = tuple(hyperparameter(group, key) for key in keys)
        if got != want:
            key, w, g = next((k, w, g) for k, w, g in zip(keys, want, got) if w != g)
            changeable = ", ".join(repr(k) for k in ("lr", *self.spec.lifted))
            raise PrecompileError(
                f"{self.where} param_groups[{index}]{_group_key(key)}: expected {w!r} (baked at capture), got {_describe_read(g)}; "
                f"only {changeable} may change between calls: precompile again for other values"
            )

    def _lifted_tensor(self, index: int, key: str, group: dict) -> torch.Tensor:
        value = hyperparameter(group, key)
        if value is MISSING:
            raise PrecompileError(
                f"{self.where} param_groups[{index}]{_group_key(key)} is missing, which eager's step would "
                "raise KeyError for: put it back"
            )
        number = isinstance(value, (float, int)) and not isinstance(value, bool)
        if number and value == 1 and key == "betas[0]":
            raise PrecompileError(
                f"{self.where} param_groups[{index}]['betas'][0] is 1, where eager's step raises ZeroDivisionError "
                "(lr / (1 - beta1 ** step)); use a beta1 below 1"
            )
        if key == "momentum" and value == 0:
            raise PrecompileError(
                f"{self.where} param_groups[{index}]['momentum'] is 0, but was not at capture: eager keeps "
                "no momentum buffer at 0, the captured step updates it; precompile again with momentum=0"
            )
        return self._scalar_tensor(index, key, value)

    def _scalar_tensor(self, index: int, key: str, number: Any) -> torch.Tensor:
        """A 0-dim float64 tensor of ``number``, cached while it stays the same (bitwise: -0.0 is not 0.0)."""
        value, tensor = self.scalars.get((index, key), (None, None))
        if not same_value(number, value):
            if not isinstance(number, (float, int)) or isinstance(number, bool):
                name, in_tuple, _ = key.partition("[")  # betas[0] sits in a tuple: replace the tuple
                entry = f"opt.param_groups[{index}][{name!r}]"
                fix = f"tuple(map(float, {entry}))" if in_tuple else f"float({entry})"
                raise PrecompileError(
                    f"{self.where} param_groups[{index}]{_group_key(key)}: expected a Python float, got "
                    f"{type(number).__module__}.{type(number).__qualname__}; make it one, as float() does for a "
                    f"numpy scalar or a 0-dim tensor: {entry} = {fix}"
                )
            tensor = torch.tensor(float(number), dtype=torch.float64)
            self.scalars[index, key] = (number, tensor)
        return tensor

    def _state_name(self, index: int) -> str:
        keys = self.spec.keys
        group_index, param_index = self.spec.stepped[index // len(keys)]
        return f"{self.where} state of param_groups[{group_index}]['params'][{param_index}][{keys[index % len(keys)]!r}]"

    def _check_state(self, tensors: list) -> None:
        refuse_inference = not _is_inference_mode_enabled()  # the step writes every state tensor
        for index, (tensor, spec) in enumerate(zip(tensors, self.spec.tensors)):
            check_tensor(self._state_name(index), tensor, spec, self.backend)
            if refuse_inference and tensor.is_inference():
                why = "backward" if self.runs_backward else "the optimizer step updates it in place"
                raise inference_tensor_error(self._state_name(index), why)

    def _refuse_shared_state(self, tensors: list, others: list, name_of: Callable, groups: list) -> None:
        """No state tensor shares memory with another, with a parameter, buffer or tensor argument
        (``others``), or with a stepped parameter's ``.grad``.  The graph updates each state tensor
        in place as its own; eager's step would update shared memory twice (a state_dict loaded
        with shared tensors) or read what it wrote.  Checked when the state tensors are other
        objects than at the last call (assigned, loaded): the check costs nothing per call."""
        grads = []
        for group_index, param_index in self.spec.stepped:
            grad = groups[group_index]["params"][param_index].grad
            if grad is not None:
                grads.append((f"{self.where} param_groups[{group_index}]['params'][{param_index}].grad", grad))
        if _distinct_storages([*tensors, *others, *(grad for _, grad in grads)]):
            return
        named = [(self._state_name(j), tensor) for j, tensor in enumerate(tensors)]
        _raise_if_state_shares(named, [(name_of(i), tensor) for i, tensor in enumerate(others)] + grads)


def _raise_if_state_shares(named: list, others: list) -> None:
    """A PrecompileError naming the first state tensor of ``named`` ((name, tensor)) that shares
    memory with one before it or with one of ``others`` ((name, tensor))."""
    for j, (name, tensor) in enumerate(named):
        for other, shared in named[:j] + others:
            if _is_alias_of(tensor, shared):
                raise PrecompileError(
                    f"{name} shares memory with {other}; the artifact updates each state tensor as its "
                    "own: give it a tensor of its own (.clone() it) before the call"
                )


def refuse_repeated_optimizers(args: tuple, positions: list) -> None:
    """One optimizer at two of ``positions`` of ``args``: capture points each optimizer argument at
    its own traced groups and state, and the graph steps each with its own state inputs."""
    first: dict = {}
    for position in positions:
        earlier = first.setdefault(id(args[position]), position)
        if earlier != position:
            raise PrecompileError(
                f"args[{earlier}] and args[{position}] are the same optimizer; the artifact steps each optimizer "
                "argument with its own state, where eager's steps would share it: pass it once, or distinct "
                "optimizers"
            )


# ~~~~ driver part: input_objects ~~~~
# Input objects fn rebinds or returns, as a cache (Note invariant 5).  Only in
# artifacts whose fn does.


def is_mutable_node(node: Any) -> bool:
    """A pytree container whose identity a caller can observe (not None, a leaf or a tuple)."""
    return node is not None and not isinstance(node, tuple) and not pytree.tree_is_leaf(node)


def mutable_node_types(spec: pytree.TreeSpec) -> list:
    """The type of each node of ``spec`` that ``is_mutable_node`` (a list, a dict, a registered
    node object), pre-order; a namedtuple's spec type is no class."""
    if spec.is_leaf():
        return []
    own = [spec.type] if isinstance(spec.type, type) and not issubclass(spec.type, tuple) else []
    return own + [t for child in spec.children() for t in mutable_node_types(child)]


def first_shared_container(arguments: list) -> tuple | None:
    """(first path, other path, node): a mutable pytree container found at two places across
    or within ``arguments`` (``(path, tree)`` pairs), the first repeat in pre-order; None if none.

    Each node stays referenced until the walk ends: a ``flatten_fn`` may make its children
    afresh, and a freed one's id could come back for another."""
    first: dict = {}
    pending = list(reversed(arguments))
    while pending:
        path, node = pending.pop()
        if pytree.tree_is_leaf(node):  # None included
            continue
        if is_mutable_node(node):
            if id(node) in first:
                return first[id(node)][0], path, node
            first[id(node)] = (path, node)
        handler = pytree.SUPPORTED_NODES.get(type(node))
        if handler is None:  # a namedtuple or structseq: by position
            children = [(f"[{i}]", child) for i, child in enumerate(node)]
        elif handler.flatten_with_keys_fn is not None:
            children = [(pytree.keystr((key,)), child) for key, child in handler.flatten_with_keys_fn(node)[0]]
        else:
            children = [(f"[{i}]", child) for i, child in enumerate(handler.flatten_fn(node)[0])]
        pending.extend((path + key, child) for key, child in reversed(children))
    return None


def shared_container_error(arguments: list, since: str) -> PrecompileError:
    """Names a container found at two places of ``arguments`` where fn changes an input object:
    precompile rebuilds each place from its pytree, so a change through one would not reach the
    other (nor a read through it see the change) as in eager; ``since``: what the trace saw."""
    shared = first_shared_container(arguments)
    where = "one container is at two places"
    if shared is not None:
        first, other, node = shared
        where = f"{other} is {first} (one {type(node).__qualname__})"
    return PrecompileError(
        f"{where}{since}, and fn changes an input object beyond its tensors' values: a change through "
        "one place would not reach the other as in eager. Pass distinct objects there (e.g. a copy), "
        "at capture and at every call"
    )


def node_at(tree: Any, spec: pytree.TreeSpec, index: int) -> Any:
    """The node of ``tree`` (whose structure is ``spec``) at ``index`` in the spec's pre-order
    walk (leaves included), flattening only the nodes on the way to it."""
    while index:
        index -= 1
        children = pytree.SUPPORTED_NODES[spec.type].flatten_fn(tree)[0]
        for child, child_spec in zip(children, spec.children()):
            if index < child_spec.num_nodes:
                tree, spec = child, child_spec
                break
            index -= child_spec.num_nodes
    return tree


def write_back(target: Any, source: Any) -> Any:
    """Make ``target`` (the caller's input object) hold what ``source`` (the same
    argument as fn left it, rebuilt from the graph's outputs) holds.

    Objects of the same type are updated in place, recursively (lists and dicts
    by element, other objects by their ``__dict__``), so the caller's references
    to them stay valid as in eager; anything else (a tensor fn rebound, an
    immutable value) is replaced.  Returns the object the parent must hold:
    ``target`` where it was updated in place.
    """
    if type(target) is not type(source) or isinstance(target, torch.Tensor):
        return source
    if isinstance(target, list):
        merged = [write_back(t, s) for t, s in zip(target, source)] + list(source[len(target) :])
        target[:] = merged
    elif isinstance(target, dict):
        merged = {k: write_back(target[k], v) if k in target else v for k, v in source.items()}
        target.clear()
        target.update(merged)
    elif isinstance(target, tuple):
        merged = [write_back(t, s) for t, s in zip(target, source)]
        same = len(target) == len(source) and all(map(operator.is_, merged, target))
        return target if same else source
    elif type(getattr(target, "__dict__", None)) is dict:
        state = vars(target)
        merged = {k: write_back(state[k], v) if k in state else v for k, v in vars(source).items()}
        state.clear()
        state.update(merged)
    else:
        return source
    return target


def leaf_slots(spec: pytree.TreeSpec) -> list | None:
    """Where each leaf of ``spec`` sits in an object its unflatten builds: per leaf, the
    steps ``(through_dict_attribute, key)`` from the root through dict items, list items and
    plain objects' ``__dict__`` entries.  None where some leaf sits elsewhere (in a tuple,
    twice, or somewhere the walk does not enter), or the unflatten needs more than
    placeholder tensors.  What a call follows (``leaf_places``) instead of unflatten + write_back."""
    placeholders = [torch.empty(()) for _ in range(spec.num_leaves)]
    try:
        template = pytree.tree_unflatten(placeholders, spec)
        again = pytree.tree_leaves(template)  # a flatten gives each leaf back from where it sits
    except Exception:  # whatever a node's unflatten raises on placeholders
        return None
    if len(again) != len(placeholders) or not all(map(operator.is_, again, placeholders)):
        return None
    where = {id(placeholder): index for index, placeholder in enumerate(placeholders)}
    slots: list = [None] * len(placeholders)
    seen: set = set()
    pending = [(template, ())]
    while pending:
        node, path = pending.pop()
        if id(node) in where:
            if slots[where[id(node)]] is not None or not path:
                return None
            slots[where[id(node)]] = path
        elif not isinstance(node, torch.Tensor) and id(node) not in seen:
            seen.add(id(node))
            if isinstance(node, (list, dict)):
                items, through_dict = (node.items() if isinstance(node, dict) else enumerate(node)), False
            elif type(getattr(node, "__dict__", None)) is dict:
                items, through_dict = vars(node).items(), True
            else:
                continue
            pending.extend((child, (*path, (through_dict, key))) for key, child in items)
    return None if any(slot is None for slot in slots) else slots


def leaf_places(target: Any, slots: list, before: list) -> list | None:
    """The (container, key) holding each ``before`` leaf in ``target``, found along ``slots``
    (from ``leaf_slots``); None where some slot does not hold its leaf."""
    places = []
    for path, old in zip(slots, before):
        node = target
        try:
            for through_dict, key in path:
                container = vars(node) if through_dict else node
                if not isinstance(container, (list, dict)):
                    return None
                node = container[key]
        except (KeyError, IndexError, TypeError):
            return None
        if node is not old:
            return None
        places.append((container, key))
    return places


def write_places(places: list, leaves: list) -> None:
    """What ``write_back`` does when fn left an argument's structure as it was: each new leaf where the old one sat."""
    for (container, key), leaf in zip(places, leaves):
        container[key] = leaf


# Values whose state is their identity: a dict or list holding them changes only by a write.
_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout, torch.memory_format)


class LeftAsWritten:
    """A rebound argument as the last call's write left it, for the next call to see in a
    few C calls that nothing changed it since: then its leaves are where that call wrote
    them and its structure is the captured one, so it is not flattened again (Note
    invariant 5).  Sound for node types whose flatten reads only the argument's objects,
    dicts, lists and tuples, which this watches: each dict's PEP 509 version (which
    every write moves), each object's class and ``__dict__``, each list's elements.
    The argument is held weakly; its death drops the entry."""

    def __init__(self, ref: Any, root: Any, places: list, objects: list, dicts: list, lists: list) -> None:
        self.root, self.root_class, self.root_dict = ref, type(root), vars(root)  # held weakly, by ref
        self.places = places  # (container, key) of each leaf
        self.objects = objects  # (object, class, __dict__) of each object below the root
        self.dicts = dicts
        self.lists = lists
        self.refresh()

    @classmethod
    def watch(cls, root: Any, places: list, forget: Callable) -> "LeftAsWritten | None":
        """An entry for ``root`` (just written at ``places``), or None where its state holds
        something this cannot watch (a set, an object without ``__dict__``, ...), this
        Python has no dict versions, or ``root`` cannot be held weakly or reaches itself."""
        if not _dict_version({}) or type(getattr(root, "__dict__", None)) is not dict:
            return None
        try:
            ref = weakref.ref(root, forget)
        except TypeError:
            return None
        objects, dicts, lists = [], [], []
        seen: set = set()
        pending = [root]
        while pending:
            node = pending.pop()
            if type(node) in _ATOMS or isinstance(node, (type, torch.Tensor)):
                continue
            if id(node) in seen:
                if node is root:  # held through its own state, it would never die
                    return None
                continue
            seen.add(id(node))
            if type(node) is dict:
                dicts.append(node)
                pending.extend(node.values())
            elif type(node) is list:
                lists.append(node)
                pending.extend(node)
            elif isinstance(node, tuple) and not hasattr(node, "__dict__"):  # tuples, torch.Size, namedtuples
                pending.extend(node)
            elif isinstance(node, (dict, list)):  # a subclass: an OrderedDict's order moves no version
                return None
            elif type(getattr(node, "__dict__", None)) is dict and not _has_slots(type(node)):
                if node is not root:
                    objects.append((node, type(node), vars(node)))
                dicts.append(vars(node))
                pending.extend(vars(node).values())
            else:
                return None
        return cls(ref, root, places, objects, dicts, lists)

    def unchanged(self, argument: Any) -> bool:
        """Whether ``argument`` is the watched one, as the last write left it."""
        return (
            self.root() is argument
            and type(argument) is self.root_class
            and vars(argument) is self.root_dict
            and [*map(_dict_version, self.dicts)] == self.versions
            and all(map(_same_elements, self.lists, self.elements))
            and all(type(node) is cls and vars(node) is state for node, cls, state in self.objects)
        )

    def leaves(self) -> list:
        return [container[key] for container, key in self.places]

    def refresh(self) -> None:
        """Record the state just written as the state to compare with."""
        self.versions = [*map(_dict_version, self.dicts)]
        self.elements = [*map(tuple, self.lists)]


def _same_elements(items: list, kept: tuple) -> bool:
    return len(items) == len(kept) and all(map(operator.is_, items, kept))


def _has_slots(cls: type) -> bool:
    """Whether instances keep state in slots (beyond ``__dict__``; ``abc.ABC``'s empty ``__slots__`` keep none)."""
    for base in cls.__mro__:
        slots = vars(base).get("__slots__", ())
        if set((slots,) if isinstance(slots, str) else slots) - {"__dict__", "__weakref__"}:
            return True
    return False


def _forget_written(written: dict, position: int, dead_ref: Any) -> None:
    if getattr(written.get(position), "root", None) is dead_ref:  # not a later argument's entry
        del written[position]


# ~~~~ driver part: inductor ~~~~
# Inductor graphs: their kernels, loaded or compiled, and stand-ins for what they
# import from Inductor.  Only in artifacts of backend='inductor'.


def kernel_key(argtypes: list[str], source: str) -> str:
    """Content address of one Inductor C++ kernel."""
    digest = hashlib.sha256(repr(list(argtypes)).encode())
    digest.update(source.encode())
    return digest.hexdigest()


def load_kernel_library(key: str, path: str) -> Callable:
    """Import a compiled kernel extension directly, without torch._inductor.

    Mirrors ``CppPythonBindingsCodeCache._load_library_inner`` (torch 2.13):
    the extension's ``PyInit_kernel`` reads the tensor data-pointer accessor's
    address from this environment variable.
    """
    os.environ[_KERNEL_DATA_PTR_ENV] = _KERNEL_DATA_PTR
    module_name = f"torch_precompile_{key[:32]}.kernel"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
    return module.kernel


def jit_compile_kernel(argtypes: list[str], source: str, vec_isa: Any = None) -> Callable:
    """Compile one kernel with Inductor (the cold path: imports torch._inductor).

    ``vec_isa``: [name, bit width] of the vector ISA its C++ was generated for
    (python_code's INDUCTOR_VEC_ISA; None in artifacts that predate it).
    """
    if vec_isa is None:
        return _inductor_compile_kernel(argtypes, source)
    with _VEC_ISA_LOCK:  # the ISA is picked from Inductor's process-wide config
        with _inductor_simdlen(_check_vec_isa(vec_isa)):
            return _inductor_compile_kernel(argtypes, source)


# Held while a kernel is compiled for a recorded ISA, so no other artifact's compile
# in this process sees the config set for it.
_VEC_ISA_LOCK = threading.Lock()


def _check_vec_isa(vec_isa: Any) -> int:
    """The bit width to compile for: ``vec_isa``'s, if this machine runs that ISA, else PrecompileError.

    The C++ is written for that width (its loops step by it): compiled for
    another ISA it computes wrong results or writes past its buffers.
    """
    if not (isinstance(vec_isa, list) and len(vec_isa) == 2 and type(vec_isa[0]) is str and type(vec_isa[1]) is int):
        raise PrecompileError(
            f"python_code: INDUCTOR_VEC_ISA is malformed (expected [name, bit width], got {vec_isa!r}); it was edited"
        )
    name, width = vec_isa
    picked, runnable = _inductor_vec_isas()
    if runnable.get(name) != width:
        raise PrecompileError(
            f"this artifact's C++ kernels were generated for the vector ISA {name!r} ({width}-bit) "
            f"(python_code's INDUCTOR_VEC_ISA), which this machine does not support (Inductor picks "
            f"{picked[0]!r} ({picked[1]}-bit) here), and its cache has no kernels usable here: "
            "precompile again on this machine"
        )
    return width


def triton_kernel_key(kernel_name: str, source: str) -> str:
    """Content address of one Inductor Triton kernel; its cache entries are KEY.cubin and KEY.json."""
    digest = hashlib.sha256(kernel_name.encode())
    digest.update(b"\0")
    digest.update(source.encode())
    return digest.hexdigest()


# What a launch record's grid expressions may contain: the ceil-divisions,
# products and bounds Inductor's GridExpr writes over the kernel's size arguments.
_GRID_NODES = (
    ast.Expression, ast.Tuple, ast.Load, ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp,
    ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.USub, ast.Call,
)


_GRID_FUNCTIONS = {"min": min, "max": max}


def _grid_function(grid: list, arguments: list) -> Callable:
    """``(*arguments) -> (grid_x, grid_y, grid_z)`` from the record's three expressions.

    The expressions come from the cache, so they are checked to be arithmetic
    over the kernel's own arguments before they are compiled: the cache holds
    data, never code.
    """
    tree = ast.parse(f"({', '.join(grid)},)", mode="eval")
    for node in ast.walk(tree):
        allowed = isinstance(node, _GRID_NODES) and not (
            isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _GRID_FUNCTIONS)
        )
        if not allowed or (isinstance(node, ast.Name) and node.id not in arguments and node.id not in _GRID_FUNCTIONS):
            raise ValueError(f"unexpected {type(node).__name__} in the grid {grid!r}")
        if isinstance(node, ast.Constant) and type(node.value) is not int:
            raise ValueError(f"unexpected constant {node.value!r} in the grid {grid!r}")
    body = ast.Lambda(
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg(name) for name in arguments], kwonlyargs=[], kw_defaults=[], defaults=[]
        ),
        body=tree.body,
    )
    code = compile(ast.fix_missing_locations(ast.Expression(body)), "<precompile triton grid>", "eval")
    return eval(code, {"__builtins__": {}, **_GRID_FUNCTIONS})


class TritonLaunch:
    """One Triton kernel of the cache, launched from its cubin by torch's static CUDA launcher.

    Does what Inductor's ``StaticTritonCompileResult.make_launcher`` builds for
    the autotuned config, from the record precompile kept of it (grid,
    arguments, shared memory, warps): a warm load imports neither Triton nor
    Inductor and compiles, autotunes and benchmarks nothing.  ``run`` has the
    signature of Inductor's ``CachingAutotuner.run``, which the graph calls.
    """

    def __init__(self, record: dict, cubin_path: str):
        device = record["device"]
        # The launcher loads into the device's current context; create it first.
        torch.empty((), device=torch.device("cuda", device))
        self._function = _static_cuda_launcher()._load_kernel(cubin_path, record["name"], record["shared"], device)[0]
        self._launch = _static_cuda_launcher()._launch_kernel
        self._num_warps, self._shared = record["num_warps"], record["shared"]
        # Triton's kernels take trailing scratch pointers Inductor never uses (passed as None).
        self._arg_types = record["arg_tys"] + "O" * record["scratch"]
        self._scratch = (None,) * record["scratch"]
        arguments = record["def_args"]
        self._grid = _grid_function(record["grid"], arguments)
        self._call_positions = tuple(arguments.index(name) for name in record["call_args"])
        self.name = record["name"]

    def run(self, *args: Any, stream: int) -> None:
        grid_x, grid_y, grid_z = self._grid(*args)
        launch_args = (*[args[i] for i in self._call_positions], *self._scratch)
        self._launch(
            self._function, grid_x, grid_y, grid_z, self._num_warps, self._shared, self._arg_types, launch_args, stream
        )


class KernelLoader:
    """Serves the kernels Inductor's generated module requests (``bind_inductor_graph``).

    Each ``cpp_pybinding`` or ``triton`` request is served from the cache's
    compiled kernels when present, else compiled (and recorded, so precompile
    can harvest it).
    """

    def __init__(self, kernel_files: dict[str, str], vec_isa: Any = None):
        self.kernel_files = kernel_files
        self.vec_isa = vec_isa  # what its C++ kernels were generated for (jit_compile_kernel)
        self.compiled: dict[str, str] = {}  # key -> .so path of JIT-compiled kernels
        self.compiled_triton: dict[str, Any] = {}  # key -> Inductor's autotuner of JIT-compiled Triton kernels

    def triton(self, kernel_name: str, source: str, device_str: str = "cuda") -> Any:
        key = triton_kernel_key(kernel_name, source)
        record, cubin = self.kernel_files.get(key + ".json"), self.kernel_files.get(key + ".cubin")
        if record is not None and cubin is not None:
            try:
                with open(record, "rb") as f:
                    return TritonLaunch(json.loads(f.read()), cubin)
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
                warnings.warn(
                    f"torch.compiler.precompile: the cached Triton kernel {kernel_name} failed to load "
                    f"({type(error).__name__}: {error}); compiling it from python_code instead"
                )
        try:
            kernel = _inductor_compile_triton(kernel_name, source, device_str)
        except Exception as error:
            raise PrecompileError(
                f"compiling the Triton kernel {kernel_name} of this artifact failed ({type(error).__name__}: "
                f"{error}); the cache had no compiled kernel usable on this GPU, so Triton is needed"
            ) from error
        self.compiled_triton[key] = kernel
        return kernel

    def cpp_pybinding(self, argtypes: list[str], source: str) -> Callable:
        key = kernel_key(argtypes, source)
        path = self.kernel_files.get(key)
        if path is not None:
            try:
                return load_kernel_library(key, path)
            except (ImportError, OSError) as error:
                # load() verified these bytes, yet they do not load here (a missing
                # shared library): the cache only accelerates, so compile instead.
                warnings.warn(
                    f"torch.compiler.precompile: a cached kernel failed to load ({type(error).__name__}: "
                    f"{error}); compiling it from python_code instead"
                )
        try:
            kernel = jit_compile_kernel(argtypes, source, self.vec_isa)
        except PrecompileError:
            raise
        except Exception as error:
            raise PrecompileError(
                f"compiling a kernel of this artifact failed ({type(error).__name__}: {error}); "
                "the cache had no compiled kernel usable on this host, so its C++ source is compiled "
                "here, which needs a working C++ compiler and the torch release that generated the "
                f"artifact (its header names it; this is torch {torch.__version__}): install a compiler, "
                "or precompile again on a host like this one"
            ) from error
        self.compiled[key] = kernel.__self__.__file__
        return kernel


class ExternKernels:
    """Stand-in for ``torch._inductor.select_algorithm.extern_kernels``.

    ``table`` maps each extern kernel the graph calls to a dotted torch name
    recorded at precompile time; anything else is looked up in Inductor.
    """

    def __init__(self, table: dict[str, str]):
        for name, dotted in table.items():
            setattr(self, name, _resolve_dotted(dotted))

    def __getattr__(self, name: str) -> Any:
        return getattr(_inductor_extern_kernels(), name)


def _resolve_dotted(dotted: str) -> Any:
    obj: Any = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _align(nbytes: int) -> int:
    # torch._inductor.utils._align; literals: _INDUCTOR_ALIGN_BYTES is 64
    return (nbytes + 63) & -64


@contextlib.contextmanager
def _maybe_profile(should_profile: bool, *args: Any, **kwargs: Any):
    if should_profile:
        with torch.profiler.profile(*args, **kwargs) as profile:
            yield profile
    else:
        yield


def _run_intermediate_hooks(name: str, value: Any) -> None:
    pass  # only emitted with inductor's generate_intermediate_hooks, never pinned on


def bind_inductor_graph(
    namespace: dict, extern_table: dict[str, str], kernel_files: dict[str, str], vec_isa: Any = None
) -> KernelLoader:
    """Give Inductor's generated module (the artifact's graph section) what it imports from Inductor.

    The section requested its kernels from a deferred ``AsyncCompile`` (the
    driver runs after it); each ``PendingKernel`` it left in ``namespace`` is
    replaced by the kernel, loaded from the cache's files or compiled for
    ``vec_isa`` (python_code's INDUCTOR_VEC_ISA).
    """
    loader = KernelLoader(kernel_files, vec_isa)
    pending, pending_triton = namespace["PendingKernel"], namespace.get("PendingTritonKernel")
    for name, value in list(namespace.items()):
        if type(value) is pending:
            namespace[name] = loader.cpp_pybinding(*value)
        elif type(value) is pending_triton:
            namespace[name] = loader.triton(*value)
    namespace.update(
        extern_kernels=ExternKernels(extern_table),
        align=_align,
        maybe_profile=_maybe_profile,
        run_intermediate_hooks=_run_intermediate_hooks,
    )
    return loader


# ~~~~ driver part: library_hooks ~~~~
# What a refusal says of a library's hooks (find_hook's ``library_fixes``).  Only
# in artifacts whose module arguments have a submodule of a HOOK_LIBRARIES class
# (CallingConvention.library_modules); elsewhere such a hook is refused as any other.


# What fn asking a transformers (5.x) model for output_hidden_states / output_attentions can do
# instead: transformers collects them with forward hooks it installs at the first such call.
OUTPUT_CAPTURING_WAY = (
    "take the last hidden state from the base model (model.base_model(...).last_hidden_state, which is "
    "hidden_states[-1]), or call fn eagerly"
)
# Hooks a library registers without handing the caller a handle, by hook_name: how to take
# each off, said instead of handle.remove() (invariant 11).
LIBRARY_HOOK_FIXES = {
    "transformers.modeling_utils.PreTrainedModel.enable_input_require_grads.<locals>.make_inputs_require_grads": (
        "transformers' gradient_checkpointing_enable() registered it (enable_input_require_grads): call "
        "model.disable_input_require_grads(). The hook only makes the input embeddings' output require grad, "
        "which checkpointing needs with use_reentrant=True and frozen embeddings, not with use_reentrant=False "
        "(gradient_checkpointing_enable()'s default)"
    ),
    "transformers.utils.output_capturing.install_output_capuring_hook.<locals>.output_capturing_hook": (
        "transformers' output capturing installed it at a call asking for output_hidden_states or "
        "output_attentions, on every layer, for good and with no handle. Take these hooks off: delete each "
        "output_capturing_hook from the modules' _forward_hooks and their _output_capturing_hooks_installed "
        "attribute (README, 'Hooks transformers installs'); ask a copy (copy.deepcopy(model)) for hidden states. "
        "fn itself asking for them cannot be precompiled: " + OUTPUT_CAPTURING_WAY
    ),
}
