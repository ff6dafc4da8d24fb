# Owner(s): ["module: dynamo"]
"""The private torch internals torch.compiler.precompile relies on, pinned (each supported release: 2.11-2.14).

One test per shim in ``torch/_precompile_compat.py`` (capture) and in the
driver's section "torch 2.11-2.14 internals the driver relies on"
(``torch/_precompile_runtime.py``): each asserts that the internal exists in
the installed torch with the signature and behaviour precompile relies on,
so a torch upgrade that moves or changes one fails here, in one place.
``TestQuarantine`` checks that no other source touches those internals.
"""

import ast
import contextlib
import functools
import hashlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import traceback
import unittest
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch_precompile import _precompile_compat as compat, _precompile_runtime as runtime
from torch.testing._internal.common_utils import run_tests, TestCase


REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------
# The quarantine: private torch names only the compat module and the driver's
# marked section may touch (as an attribute, an import, or a string naming one).
# ---------------------------------------------------------------------------

# Private torch modules, matched as a component of a dotted import or attribute.
PRIVATE_MODULES = {
    "_C", "_inductor", "_dynamo", "_logging", "_export", "_subclasses", "_higher_order_ops", "_prims_common",
    "_decomp",
}
PRIVATE_NAMES = {
    # capture
    "_reparametrize_module", "_custom_builtins", "_parse_stack_trace", "_register_stack_trace_anchor", "register_log", "_rename",
    "_is_compiling_flag", "_is_exporting_flag", "_compiling_state_context", "_is_compiling",
    "_global_optimizer_pre_hooks", "_global_optimizer_post_hooks",
    "replacements", "deferred_runtime_asserts", "pending_fresh_unbacked_symbols",
    "StatelessSymbolicContext", "DimDynamic", "LocalSource", "FakeTensorMode",
    "is_fake", "has_effects", "is_traceable_wrapper_subclass",
    "compile_fx", "compile_fx_inner", "_set_mkldnn_enabled", "_get_mkldnn_enabled", "_disable_current_modes",
    *compat.MARK_ATTRIBUTES,
    # both
    "_is_alias_of", "_current_autograd_node", "TensorGuards",
    "_parameters", "_buffers", "_modules",
    "_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
    "_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks", "_post_accumulate_grad_hooks",
    "_set_grad_enabled", "_is_any_autocast_enabled", "_DisableAutocast", "_disabled_torch_function_impl",
    "_torchdynamo_disable", "_torchdynamo_disable_msg", "_FrameAction", "_FrameExecStrategy", "set_code_exec_strategy",
    "_top_saved_tensors_default_hooks",
    "_is_torch_function_mode_enabled", "_len_torch_function_stack", "_get_function_stack_at",
    "_len_torch_dispatch_stack", "_get_dispatch_stack_at",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "_torchinductor_pyobject_tensor_data_ptr",
    "CppPythonBindingsCodeCache",
    # DistributedDataParallel arguments
    "_execution_engine", "_c10d_functional", "_DEFAULT_FIRST_BUCKET_BYTES",
    "_comm_hooks", "_get_ddp_logging_data", "_resolve_process_group",
    # fully_shard (FSDP2) models
    "_get_fsdp_state", "_fsdp_param_groups", "_fsdp_param_group", "_pre_forward", "_post_forward",
    "_all_reduce_hook", "_local_tensor", "fsdp_params", "sharded_param",
}
COMPAT = REPO / "torch" / "_precompile_compat.py"
DRIVER = REPO / "torch" / "_precompile_runtime.py"
SECTION_START = "# --- torch 2.11-2.14 internals the driver relies on"
SECTION_END = "# --- end of torch 2.11-2.14 internals ---"


def _private_uses(source: str, skip_lines: range = range(0)) -> list[str]:
    """'line: what' for each touch of a quarantined name (docstrings and messages are text, not uses)."""
    found = []

    def flag(node, what):
        if node.lineno not in skip_lines:
            found.append(f"{node.lineno}: {what}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (node.attr in PRIVATE_NAMES or node.attr in PRIVATE_MODULES):
            if isinstance(node.value, ast.Name) and node.value.id == "compat":  # the shim of that name
                continue
            flag(node, f".{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for name in modules + names:
                if set(name.split(".")) & (PRIVATE_MODULES | PRIVATE_NAMES):
                    flag(node, f"import {name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRIVATE_NAMES:
            flag(node, repr(node.value))
    return found


def _driver_section() -> range:
    lines = DRIVER.read_text().splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.startswith(SECTION_START))
    end = next(i for i, line in enumerate(lines, 1) if line.startswith(SECTION_END))
    return range(start, end + 1)


class TestQuarantine(TestCase):
    def test_only_compat_and_the_driver_section_touch_private_internals(self):
        sources = sorted((REPO / "torch").glob("_precompile*.py")) + sorted((REPO / "torch_precompile").glob("*.py"))
        self.assertIn(COMPAT, sources)
        for path in sources:
            if path == COMPAT:
                continue
            skip = _driver_section() if path == DRIVER else range(0)
            uses = _private_uses(path.read_text(), skip)
            self.assertEqual(uses, [], f"{path.name} touches private torch internals ({uses}) outside the compat "
                             "module / the driver's marked section; route them there")

    def test_the_check_sees_each_kind_of_use(self):
        source = (
            "import torch._inductor.config\n"
            "from torch.nn.utils.stateless import _reparametrize_module\n"
            "torch._C._is_alias_of(a, b)\n"
            "getattr(t, '_dynamo_unbacked_indices', ())\n"
            "m._parameters\n"
            "raise ValueError('mark dims with torch._dynamo.decorators.mark_unbacked')\n"
        )
        # Line 6 names a private module in a message: text, not a use.
        self.assertEqual(sorted({int(u.split(":")[0]) for u in _private_uses(source)}), [1, 2, 3, 4, 5])

    def test_driver_section_is_marked_and_binds_what_the_driver_uses(self):
        section = _driver_section()
        self.assertGreater(len(section), 10)
        source = DRIVER.read_text()
        for name in ("_TensorGuards", "_is_alias_of", "_set_grad_enabled", "_is_any_autocast_enabled", "_DisableAutocast",
                     "_is_torch_function_mode_enabled", "_len_torch_dispatch_stack",
                     "_KERNEL_DATA_PTR_ENV", "_owner_dict", "_MODULE_HOOKS", "_TENSOR_HOOKS",
                     "accumulate_grad_hooks", "opaque_to_dynamo"):
            (definition,) = [i for i, line in enumerate(source.splitlines(), 1)
                             if re.match(rf"(def )?{name}\b", line)]
            self.assertIn(definition, section, name)


# ---------------------------------------------------------------------------
# The driver's section
# ---------------------------------------------------------------------------


class TestDriverInternals(TestCase):
    def test_tensor_guards_check_layout_with_free_entries(self):
        x = torch.randn(4, 3)
        guard = runtime._TensorGuards(x, dynamic_dims_sizes=[[None, 3]], dynamic_dims_strides=[[None, 1]])
        self.assertTrue(guard.check(x))
        self.assertTrue(guard.check(torch.randn(7, 3)))  # free size
        self.assertFalse(guard.check(torch.randn(4, 5)))
        self.assertFalse(guard.check(x.double()))
        self.assertFalse(guard.check(x.requires_grad_(True)))
        self.assertFalse(guard.check(torch.randn(3, 4).t()))  # stride pinned
        self.assertFalse(guard.check(x.unsqueeze(0)))
        self.assertFalse(guard.check(1.0))  # a non-tensor where a tensor was captured
        with self.assertRaises(TypeError):  # the driver's guard_passes catches this
            guard.check()
        self.assertFalse(runtime.guard_passes(guard, []))
        self.assertIs(runtime._TensorGuards, torch._C._dynamo.guards.TensorGuards)

    def test_opaque_to_dynamo_sets_what_dynamo_reads(self):
        # The attribute torch._dynamo.disable sets on its wrapper (Dynamo then graph-breaks
        # instead of inlining), and the exec strategy its skip_code sets (SKIP), here recursive.
        import torch._dynamo

        self.assertIs(torch._dynamo.disable(lambda: None)._torchdynamo_disable, True)
        call = runtime.PrecompiledFunction.__call__
        self.assertIs(call._torchdynamo_disable, True)
        self.assertIn("precompile artifact", call._torchdynamo_disable_msg)
        eval_frame = torch._C._dynamo.eval_frame
        self.assertIs(torch._dynamo.types.FrameAction, eval_frame._FrameAction)
        skip = eval_frame._FrameAction.SKIP
        self.assertIsNotNone(eval_frame._FrameExecStrategy(skip, skip))

    @unittest.skipUnless(hasattr(torch._C, "_StaticCudaLauncher"), "a CPU-only torch build has no CUDA launcher")
    def test_static_cuda_launcher_loads_and_launches(self):
        # TritonLaunch replays a cached cubin through these two (test_precompile_cuda.py runs them on a GPU).
        launcher = runtime._static_cuda_launcher()
        self.assertIs(launcher, torch._C._StaticCudaLauncher)
        self.assertTrue(callable(launcher._load_kernel) and callable(launcher._launch_kernel))

    def test_is_alias_of_means_same_storage(self):
        for is_alias_of in (runtime._is_alias_of, compat.is_alias_of):
            x = torch.randn(8)
            self.assertTrue(is_alias_of(x[:4], x[4:]))  # same storage, no overlap
            self.assertFalse(is_alias_of(x, x.clone()))

    def test_grad_and_autocast_c_functions(self):
        with torch.enable_grad():
            runtime._set_grad_enabled(False)
            self.assertFalse(torch.is_grad_enabled())
            runtime._set_grad_enabled(True)
            self.assertTrue(torch.is_grad_enabled())
        self.assertFalse(runtime._is_any_autocast_enabled())
        with torch.autocast("cpu"):
            self.assertTrue(runtime._is_any_autocast_enabled())
            for disabled in (runtime._DisableAutocast, compat.autocast_disabled):
                with disabled():  # ops run below autocast, as if it were off
                    self.assertEqual((torch.ones(2, 2) @ torch.ones(2, 2)).dtype, torch.float32)

    def test_saved_tensors_hooks_reader(self):
        for active in (runtime._saved_tensors_hooks, compat.saved_tensors_hooks_active):
            self.assertFalse(active())
        pack, unpack = (lambda t: t), (lambda t: t)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            self.assertEqual(runtime._saved_tensors_hooks(), (pack, unpack))
            self.assertTrue(compat.saved_tensors_hooks_active())

    def test_mode_stack_readers(self):
        # Every call tests the first two; the PrecompileError names the innermost mode with the others.
        class Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        self.assertFalse(runtime._is_torch_function_mode_enabled())
        self.assertEqual(runtime._len_torch_dispatch_stack(), 0)
        with Function() as mode:
            self.assertTrue(runtime._is_torch_function_mode_enabled())
            self.assertIs(runtime._get_function_stack_at(runtime._len_torch_function_stack() - 1), mode)
            with torch._C.DisableTorchFunction():  # eager runs no mode there either
                self.assertFalse(runtime._is_torch_function_mode_enabled())
        for default_device in (lambda: torch.device("meta"), lambda: contextlib.nullcontext(torch.set_default_device("meta"))):
            try:
                with default_device():  # a DeviceContext, the class and module the driver names
                    self.assertTrue(runtime._is_torch_function_mode_enabled())
                    context = runtime._get_function_stack_at(runtime._len_torch_function_stack() - 1)
                    self.assertEqual((type(context).__module__, type(context).__name__, context.device),
                                     ("torch.utils._device", "DeviceContext", torch.device("meta")))
            finally:
                torch.set_default_device(None)
        self.assertFalse(runtime._is_torch_function_mode_enabled())
        with Dispatch() as mode:
            self.assertEqual(runtime._len_torch_dispatch_stack(), 1)
            self.assertIs(runtime._get_dispatch_stack_at(0), mode)
            self.assertFalse(runtime._is_torch_function_mode_enabled())
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            self.assertEqual(runtime._len_torch_dispatch_stack(), 1)  # infra modes count
        self.assertEqual(runtime._len_torch_dispatch_stack(), 0)

    def test_disabled_torch_function_impl_is_parameters(self):
        self.assertIs(nn.Parameter.__torch_function__, runtime._disabled_torch_function_impl)
        self.assertIn(runtime._disabled_torch_function_impl, runtime._PLAIN_TORCH_FUNCTIONS)
        self.assertIs(compat.disabled_torch_function_impl, runtime._disabled_torch_function_impl)

    def test_module_dicts(self):
        model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        table, name = runtime._owner_dict(model, "0.weight", "parameter")
        self.assertIs(table, model[0]._parameters)
        self.assertIs(table[name], model[0].weight)
        table, name = runtime._owner_dict(model, "1.running_mean", "buffer")
        self.assertIs(table[name], model[1].running_mean)
        self.assertIs(runtime._children(model), vars(model)[runtime._CHILDREN])
        del model[1]
        self.assertEqual(len(runtime._children(model)), 1)

    def test_accumulate_grad_hook_probe(self):
        # A probe registration shares the node's one dict of Python hooks; probes are not new hooks.
        param = nn.Parameter(torch.ones(2))
        node = torch.autograd.graph.get_gradient_edge(param).node
        self.assertEqual(runtime.accumulate_grad_hooks(param), [])
        epoch = runtime.hook_epoch()
        self.assertEqual(runtime.accumulate_grad_hooks(param), [])
        self.assertEqual(runtime.hook_epoch(), epoch)
        handles = [node.register_hook(lambda *_: None), node.register_prehook(lambda *_: None)]
        self.assertEqual(runtime.accumulate_grad_hooks(param), ["pre-hook", "hook"])
        for handle in handles:
            handle.remove()
        self.assertEqual(runtime.accumulate_grad_hooks(param), [])
        self.assertEqual(runtime.accumulate_grad_hooks(torch.ones(2)), [])  # no gradient, no node

    def test_hook_attributes(self):
        model = nn.Linear(2, 2)
        param = model.weight
        registrations = {
            "_forward_pre_hooks": lambda: model.register_forward_pre_hook(lambda *a: None),
            "_forward_hooks": lambda: model.register_forward_hook(lambda *a: None),
            "_backward_pre_hooks": lambda: model.register_full_backward_pre_hook(lambda *a: None),
            "_backward_hooks": lambda: model.register_full_backward_hook(lambda *a: None),
        }
        self.assertEqual(set(registrations), set(runtime._MODULE_HOOKS))
        for attribute, register in registrations.items():
            self.assertFalse(getattr(model, attribute))
            handle = register()
            self.assertTrue(getattr(model, attribute), attribute)
            handle.remove()
        globals_ = {
            "_forward_pre_hooks": nn.modules.module.register_module_forward_pre_hook,
            "_forward_hooks": nn.modules.module.register_module_forward_hook,
            "_backward_pre_hooks": nn.modules.module.register_module_full_backward_pre_hook,
            "_backward_hooks": nn.modules.module.register_module_full_backward_hook,
        }
        for attribute, register in globals_.items():
            self.assertFalse(runtime._global_module_hooks(attribute))
            handle = register(lambda *a: None)
            self.assertTrue(runtime._global_module_hooks(attribute), attribute)
            handle.remove()
        tensor_registrations = {
            "_backward_hooks": lambda: param.register_hook(lambda g: g),
            "_post_accumulate_grad_hooks": lambda: param.register_post_accumulate_grad_hook(lambda p: None),
        }
        self.assertEqual(set(tensor_registrations), set(runtime._TENSOR_HOOKS))
        for attribute, register in tensor_registrations.items():
            self.assertFalse(getattr(param, attribute, None))
            handle = register()
            self.assertTrue(getattr(param, attribute), attribute)
            handle.remove()

    def test_optimizer_step_hooks(self):
        optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        self.assertFalse(runtime._optimizer_step_hooks(optimizer))
        self.assertFalse(compat.optimizer_has_step_hooks(optimizer))
        for register in (optimizer.register_step_pre_hook, optimizer.register_step_post_hook):
            handle = register(lambda *a: None)
            self.assertTrue(runtime._optimizer_step_hooks(optimizer))
            self.assertTrue(compat.optimizer_has_step_hooks(optimizer))
            handle.remove()
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        for register in (register_optimizer_step_pre_hook, register_optimizer_step_post_hook):
            handle = register(lambda *a: None)
            self.assertTrue(compat.optimizer_has_step_hooks(optimizer))
            handle.remove()
        self.assertFalse(compat.optimizer_has_step_hooks(optimizer))

    @unittest.skipUnless(torch.distributed.is_available() and torch.distributed.is_gloo_available(), "needs gloo")
    def test_data_parallel_internals(self):
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            ddp = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
            group = ddp.process_group
            self.assertIs(runtime._resolve_process_group(group.group_name), group)
            self.assertEqual(getattr(ddp, runtime._DDP_COMM_HOOKS), [])
            self.assertIsNone(runtime._ddp_comm_hook_name(ddp))
            self.assertEqual(runtime.data_parallel_comm_hook(ddp), None)
            name, value = runtime.data_parallel_buffer_sync(ddp)  # one of the two names is an instance attribute
            self.assertIn(name, runtime._DDP_BUFFER_SYNC)
            self.assertIs(value, True)
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
            self.assertEqual(getattr(ddp, runtime._DDP_COMM_HOOKS), [(default_hooks.allreduce_hook, None)])
            self.assertEqual(runtime.data_parallel_comm_hook(ddp), "allreduce_hook")
            builtin = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
            builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
            self.assertIn("FP16_COMPRESS", runtime.data_parallel_comm_hook(builtin))
        finally:
            dist.destroy_process_group()

    def test_fully_shard_internals(self):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            model = fully_shard(nn.Linear(4, 2))
            state = runtime.fully_shard_state(model)
            self.assertIsNone(runtime.fully_shard_state(nn.Linear(4, 2)))
            (group,) = runtime.fully_shard_param_groups(state)
            self.assertEqual(list(map(id, compat.fully_shard_group_parameters(group))), list(map(id, model.parameters())))
            hooks = [*model._forward_pre_hooks.values(), *model._forward_hooks.values()]
            self.assertEqual(len(hooks), 2)
            self.assertTrue(all(map(runtime.is_fully_shard_hook, hooks)))
            self.assertFalse(runtime.is_fully_shard_hook(lambda *args: None))
            weight = model.weight
            self.assertEqual(runtime.local_shard_of(weight).data_ptr(), weight.to_local().data_ptr())
            plain = torch.zeros(2)
            self.assertIs(runtime.local_shard_of(plain), plain)
            self.assertIsNone(runtime.fully_shard_unsupported(group))  # the defaults, each attribute read
            for name, default in runtime._FULLY_SHARD_DEFAULTS:
                self.assertEqual(getattr(group, name, default), default)
            model.set_requires_gradient_sync(False)
            self.assertFalse(group.reduce_grads)
            self.assertIn("set_requires_gradient_sync(False)", runtime.fully_shard_unsupported(group))
        finally:
            dist.destroy_process_group()

    def test_kernel_data_pointer_handshake(self):
        # Inductor's kernels read the accessor's address from this variable, as
        # its own loader sets it (load_kernel_library mirrors it).
        import inspect

        from torch._inductor.codecache import CppPythonBindingsCodeCache

        source = inspect.getsource(CppPythonBindingsCodeCache)
        self.assertIn(f'os.environ["{runtime._KERNEL_DATA_PTR_ENV}"]', source)
        self.assertIn("torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr", source)
        self.assertEqual(runtime._KERNEL_DATA_PTR, str(torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr))
        self.assertTrue(callable(CppPythonBindingsCodeCache.load_pybinding))

    def test_inductor_stand_ins(self):
        import torch._inductor.select_algorithm as select_algorithm
        import torch._inductor.utils as inductor_utils

        self.assertEqual(inductor_utils.ALIGN_BYTES, runtime._INDUCTOR_ALIGN_BYTES)
        for nbytes in (0, 1, 63, 64, 65, 1000, 4096 + 1):
            self.assertEqual(runtime._align(nbytes), inductor_utils._align(nbytes))
        self.assertIs(runtime._inductor_extern_kernels(), select_algorithm.extern_kernels)
        self.assertIs(compat.inductor_extern_kernels(), select_algorithm.extern_kernels)
        self.assertTrue(hasattr(select_algorithm.extern_kernels, "mm"))


# ---------------------------------------------------------------------------
# torch/_precompile_compat.py
# ---------------------------------------------------------------------------


class TestCaptureInternals(TestCase):
    def test_module_containers(self):
        """Every registration lands in one of the containers listed, in the module's own __dict__."""
        containers = compat.module_containers()
        self.assertEqual(containers["_forward_hooks"], "forward hook")
        self.assertEqual(containers["_load_state_dict_post_hooks"], "load_state_dict post-hook")
        self.assertEqual((containers["_modules"], containers["_forward_hooks_with_kwargs"]), ("submodule", ""))
        module, hook = nn.Linear(2, 2), lambda *args, **kwargs: None
        for register in (
            lambda: module.register_forward_hook(hook, with_kwargs=True, always_call=True),
            lambda: module.register_forward_pre_hook(hook, with_kwargs=True),
            lambda: module.register_full_backward_hook(hook),
            lambda: module.register_full_backward_pre_hook(hook),
            lambda: module.register_state_dict_pre_hook(hook),
            lambda: module.register_load_state_dict_post_hook(hook),
            lambda: module.register_buffer("extra", torch.ones(1), persistent=False),
            lambda: module.add_module("child", nn.Identity()),
        ):
            before = {name: dict.fromkeys(vars(module)[name]) for name in containers}
            register()
            self.assertTrue(any(dict.fromkeys(vars(module)[name]) != before[name] for name in containers))
        self.assertEqual(set(vars(module)) - set(containers), {"training", "in_features", "out_features", "_is_full_backward_hook"})

    def test_compiled_module_original(self):
        model = nn.Linear(2, 2)
        self.assertIsNone(compat.compiled_module_original(model))
        self.assertIs(compat.compiled_module_original(torch.compile(model, backend="eager")), model)

    def test_current_autograd_node(self):
        seen = []

        class Probe(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, grad):
                seen.append(compat.current_autograd_node())
                return grad

        self.assertIsNone(compat.current_autograd_node())
        Probe.apply(torch.ones(2, requires_grad=True)).sum().backward()
        self.assertIsNotNone(seen[0])

    def test_data_parallel_collectives_and_callback(self):
        all_reduce, broadcast, wait = compat.data_parallel_collectives()
        self.assertEqual(all_reduce.name(), "_c10d_functional::all_reduce")
        self.assertEqual([a.name for a in all_reduce._schema.arguments], ["input", "reduce_op", "group_name"])
        self.assertEqual(broadcast.name(), "_c10d_functional::broadcast")
        self.assertEqual([a.name for a in broadcast._schema.arguments], ["input", "src", "group_name"])
        self.assertEqual(wait.name(), "_c10d_functional::wait_tensor")
        self.assertEqual(compat.first_bucket_bytes(), 1024 * 1024)
        ran = []
        x = torch.ones(2, requires_grad=True)
        x.register_post_accumulate_grad_hook(lambda p: compat.queue_backward_callback(lambda: ran.append(p.grad.sum().item())))
        (x * 3).sum().backward()
        self.assertEqual(ran, [6.0])  # after backward, with the gradient accumulated

    @unittest.skipUnless(torch.distributed.is_available(), "needs torch.distributed")
    def test_collective_namespaces_hold_the_collectives(self):
        import torch.distributed._functional_collectives  # noqa: F401  (registers the autograd forms)

        ops = {
            "c10d": ("allreduce_", "broadcast_", "allgather_", "barrier"),
            "_c10d_functional": ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "wait_tensor"),
            "_c10d_functional_autograd": ("all_to_all_single",),
        }
        for namespace, names in ops.items():
            self.assertIn(namespace, compat.COLLECTIVE_NAMESPACES)
            for name in names:
                self.assertEqual(getattr(getattr(torch.ops, namespace), name).default.namespace, namespace)

    def test_mode_queries_are_wrapped_on_both_modules_and_restored(self):
        originals = {name: getattr(torch, name) for name in compat.MODE_QUERIES}
        for name, modules in compat.MODE_QUERIES.items():
            self.assertTrue(all(getattr(module, name) is originals[name] for module in modules))
        asked = []

        def wrap(name, query):
            return lambda: asked.append(name) or query()

        with compat.wrapped_mode_queries(wrap):
            with torch.no_grad():  # torch's own context managers look it up on torch
                self.assertFalse(torch._C.is_grad_enabled())
            self.assertFalse(torch.is_inference_mode_enabled())
        self.assertEqual(set(asked), set(compat.MODE_QUERIES))
        for name, modules in compat.MODE_QUERIES.items():
            self.assertTrue(all(getattr(module, name) is originals[name] for module in modules))

    def test_inductor_keeps_rounding_casts_where_compat_says(self):
        import torch._inductor.config as inductor_config

        def round_trip(x):
            return x.to(torch.bfloat16).to(torch.float32) * 2

        x = torch.randn(64)
        torch._dynamo.reset()
        with inductor_config.patch(emulate_precision_casts=True):
            rounds = torch.equal(torch.compile(round_trip, backend="inductor")(x), round_trip(x))
        torch._dynamo.reset()
        self.assertEqual(rounds, compat.INDUCTOR_KEEPS_ROUNDING_CASTS)

    def test_without_dispatch_modes_runs_real_ops_inside_a_mode(self):
        seen = []

        class Mode(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(func)
                with compat.without_dispatch_modes():
                    torch.ones(1).add_(1)  # not seen
                return func(*args, **(kwargs or {}))

        with Mode():
            torch.zeros(1)
        self.assertEqual(seen, [torch.ops.aten.zeros.default])

    def test_tensor_attributes_and_their_readers(self):
        # The C getters and methods capture wraps (Tensor inherits them), and the module
        # that lists them at its import, imported before they are wrapped.
        for name in ("requires_grad", "is_leaf", "grad_fn", "_version", "_base"):
            self.assertEqual(type(compat.tensor_attribute(name)).__name__, "getset_descriptor")
            self.assertIs(getattr(torch.Tensor, name), compat.tensor_attribute(name).__get__(None, torch.Tensor))
        for name in ("_is_view", "is_inference", "storage_offset", "data_ptr"):
            self.assertIs(getattr(torch.Tensor, name), compat.tensor_attribute(name))
        compat.import_tensor_attribute_readers()
        self.assertIn("torch._dynamo", sys.modules)

    def test_register_log_alias(self):
        from torch._logging._internal import log_registry

        compat.register_log_alias("precompile", "torch_precompile._precompile")
        self.assertEqual(log_registry.log_alias_to_log_qnames["precompile"], ["torch_precompile._precompile"])

    def test_reparametrized_swaps_and_restores(self):
        model = nn.Linear(2, 1, bias=False)
        original, weight = model.weight, torch.full((1, 2), 3.0)
        with compat.reparametrized(model, {"weight": weight}):
            self.assertIs(model.weight, weight)
            self.assertEqual(model(torch.ones(1, 2)), torch.tensor([[6.0]]))
        self.assertIs(model.weight, original)
        self.assertIsInstance(compat.reparametrized(model, {}), contextlib.AbstractContextManager)

    def test_seen_as_parameters_marks_and_unmarks(self):
        plain, parameter = torch.ones(2), nn.Parameter(torch.ones(2))
        with compat.seen_as_parameters([plain, parameter]):
            self.assertIsInstance(plain, nn.Parameter)
            self.assertIsInstance(parameter, nn.Parameter)
        self.assertNotIsInstance(plain, nn.Parameter)
        self.assertIsInstance(parameter, nn.Parameter)

    def test_compiling_and_exporting_flags(self):
        self.assertFalse(torch.compiler.is_compiling())
        with compat.compiling_and_exporting():
            self.assertTrue(torch.compiler.is_compiling())
            self.assertTrue(torch.compiler.is_exporting())
        self.assertFalse(torch.compiler.is_compiling() or torch.compiler.is_exporting())
        compat.set_compiling_flag(True)
        try:
            self.assertTrue(compat.compiling_flag() and torch.compiler.is_compiling())
        finally:
            compat.set_compiling_flag(False)
        self.assertFalse(torch.compiler.is_compiling())

    def test_selective_checkpointing_asks_is_compiling(self):
        """SAC's dispatch modes take any proxy mode (make_fx) for a compiler unless
        checkpoint._is_compiling says otherwise; capture makes it say so, and restores it."""
        import torch.fx.traceback as fx_traceback
        import torch.utils.checkpoint as checkpoint
        from torch.fx.experimental.proxy_tensor import make_fx

        def region(x):
            return F.dropout(x, 0.5, training=True).relu_()

        def step(x):
            contexts = functools.partial(checkpoint.create_selective_checkpoint_contexts, [torch.ops.aten.mm.default])
            checkpoint.checkpoint(region, x, use_reentrant=False, context_fn=contexts).sum().backward()
            return x.grad

        original = checkpoint._is_compiling
        self.assertEqual(list(inspect.signature(original).parameters), ["func", "args", "kwargs"])
        x = torch.randn(4, requires_grad=True)
        # (preserve_node_meta: the failing trace leaves SAC's recompute tags in fx's current_meta,
        # which would tag the nodes of later traces in this process, Inductor's pattern graphs too)
        with fx_traceback.preserve_node_meta(), self.assertRaisesRegex(
            RuntimeError, "cached during selective activation checkpoint has been mutated"
        ):
            make_fx(step)(x)
        with compat.checkpoint_regions_as_in_eager():
            self.assertFalse(checkpoint._is_compiling(None, (), {}))
            make_fx(step)(torch.randn(4, requires_grad=True))
        self.assertIs(checkpoint._is_compiling, original)

    def test_mark_attributes(self):
        from torch._dynamo.decorators import mark_dynamic, mark_unbacked, maybe_mark_dynamic

        # Attributes mark_* set that precompile does not read; any other new one fails here.
        ignored = {"_specialize_on", "_dynamo_hint_overrides", "_dynamo_dynamic_range"}
        known = set(compat.MARK_ATTRIBUTES) | ignored

        x = torch.randn(4, 5)
        marks = compat.dim_marks(x)
        self.assertEqual((marks.marked, marks.dynamic, marks.unbacked, marks.bounds, marks.shape_ids),
                         (False, frozenset(), frozenset(), {}, {}))
        # torch 2.11's mark_unbacked takes no bounds.
        bounds = {"min": 2, "max": 9} if compat.TORCH_RELEASE >= (2, 12) else {}
        mark_unbacked(x, 0, shape_id="batch", **bounds)
        self.assertLessEqual(set(vars(x)), known)
        marks = compat.dim_marks(x)
        self.assertEqual((marks.marked, marks.dynamic, marks.unbacked, marks.bounds, marks.shape_ids),
                         (True, frozenset(), frozenset({0}), {0: (2, 9)} if bounds else {}, {0: "batch"}))
        y = torch.randn(4, 5)
        mark_unbacked(y, 1, strict=True)
        self.assertLessEqual(set(vars(y)), known)
        self.assertEqual(compat.dim_marks(y).unbacked, frozenset({1}))
        z = torch.randn(4, 5)
        mark_dynamic(z, 0)
        self.assertLessEqual(set(vars(z)), known)
        marks = compat.dim_marks(z)
        self.assertEqual((marks.marked, marks.dynamic, marks.unbacked), (True, frozenset({0}), frozenset()))
        w = torch.randn(4, 5)
        maybe_mark_dynamic(w, 0)
        self.assertLessEqual(set(vars(w)), known)
        marks = compat.dim_marks(w)
        self.assertEqual((marks.marked, marks.dynamic, marks.unbacked), (True, frozenset(), frozenset()))

    def test_torch_version_range(self):
        self.assertEqual(compat.torch_release("2.11.0+cu130"), (2, 11))
        self.assertEqual(compat.torch_release("2.15.0a0+git1234"), (2, 15))
        for supported in ("2.11.0", "2.12.1+cpu", "2.13.0", "2.14.1"):
            compat.check_torch_version(supported)
        for version in ("2.10.2", "2.15.0a0+git1234", "3.0.0"):
            with self.assertRaisesRegex(ImportError, rf"supports torch 2.11 to 2.14, but torch {re.escape(version)} "
                                        r"is installed: .*pip install 'torch>=2.11,<2.15'"):
                compat.check_torch_version(version)
        self.assertEqual(compat.TORCH_RELEASE, compat.torch_release(torch.__version__))

    def test_import_refuses_an_unsupported_torch(self):
        # Importing precompile raises, naming the version; the entry-point shim
        # (which must never break `import torch`) warns instead.
        script = textwrap.dedent("""
            import sys, warnings
            import torch
            torch.__version__ = "2.10.2"
            for name in [m for m in sys.modules if m.startswith("torch_precompile")]:
                del sys.modules[name]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                import torch_precompile
            print("warned:", *[w.message for w in caught])
            try:
                import torch_precompile._precompile
            except ImportError as error:
                print("refused:", error)
        """)
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        message = "torch-precompile supports torch 2.11 to 2.14, but torch 2.10.2 is installed"
        self.assertIn(f"warned: torch-precompile: torch.compiler.precompile is unavailable (ImportError: {message}", result.stdout)
        self.assertIn(f"refused: {message}", result.stdout)

    def test_shape_env_internals(self):
        shape_env, fake_mode = compat.symbolic_fake_mode()
        self.assertIs(fake_mode.shape_env, shape_env)
        fake = compat.fake_with_unbacked_dims(fake_mode, torch.randn(4, 3), "x", {0: ("batch", 2, 9)})
        size = fake.shape[0]
        self.assertIsInstance(size, torch.SymInt)
        self.assertTrue(size.node.expr.is_symbol)
        self.assertEqual(fake.shape[1], 3)
        self.assertTrue(shape_env.pending_fresh_unbacked_symbols)
        compat.forget_pending_unbacked_symbols(shape_env)
        self.assertFalse(shape_env.pending_fresh_unbacked_symbols)
        self.assertIsInstance(compat.shape_env_replacements(shape_env), dict)
        before = compat.shape_env_deferred_asserts(shape_env)  # the mark's bounds
        torch._check(size != 5)  # not implied by the bounds: deferred to runtime
        (requirement,) = compat.shape_env_deferred_asserts(shape_env)[len(before):]
        self.assertIn(size.node.expr, requirement.expr.free_symbols)
        self.assertTrue(compat.is_fake(fake))
        self.assertFalse(compat.is_fake(torch.randn(1)))

    def test_graph_helpers(self):
        self.assertTrue(compat.has_effects(torch.ops.aten._print.default))
        self.assertFalse(compat.has_effects(torch.ops.aten.add.Tensor))
        self.assertFalse(compat.is_traceable_wrapper_subclass(torch.randn(1)))
        self.assertFalse(compat.is_traceable_wrapper_subclass(nn.Parameter(torch.randn(1))))

        graph = torch.fx.symbolic_trace(lambda x: torch.relu(x) + float("inf")).graph
        node = next(iter(graph.find_nodes(op="placeholder")))
        compat.rename_node(node, "args_0")
        self.assertEqual(node.name, "args_0")
        code = graph.python_code(root_module="self")
        imports, unknown = compat.fx_builtin_imports(code.globals)
        self.assertIn("import torch", imports)
        self.assertIn("from math import inf", imports)
        self.assertEqual(unknown, [])
        self.assertEqual(compat.fx_builtin_imports({"torch", "not_a_builtin"}), (["import torch"], ["not_a_builtin"]))

    def test_record_frames_of_keeps_a_plain_function_in_make_fx_traces(self):
        from torch.fx.experimental.proxy_tensor import make_fx

        def plain(x):
            return x.relu()

        def trace(record):
            def traced(x):
                if record:
                    compat.record_frames_of(plain)
                return plain(x)

            graph = make_fx(traced, record_stack_traces=True)(torch.randn(2))
            return [n.stack_trace or "" for n in graph.graph.nodes if n.op == "call_function"]

        self.assertNotIn("in plain", "".join(trace(record=False)))  # only frames named forward are kept
        self.assertIn("in plain", "".join(trace(record=True)))
        self.assertNotIn("in traced", "".join(trace(record=True)))  # only plain's
        compat.record_frames_of(len)  # no Python code: nothing to keep

    def test_innermost_frame(self):
        trace = "".join(traceback.format_list([
            ("/user/model.py", 3, "forward", "y = self.fc(x)"),
            ("/torch/nn/linear.py", 125, "forward", "return F.linear(x, w)"),
        ]))
        self.assertEqual(
            compat.innermost_frame(trace, lambda file: not file.startswith("/torch")),
            ("/user/model.py", 3, "forward", "y = self.fc(x)"),
        )
        self.assertEqual(compat.innermost_frame(trace, lambda file: True)[:2], ("/torch/nn/linear.py", 125))
        self.assertIsNone(compat.innermost_frame(trace, lambda file: False))
        self.assertIsNone(compat.innermost_frame(None, lambda file: True))
        # A frame with no source line (code read from stdin) has no code, not the next frame's line.
        sourceless = trace.replace("    y = self.fc(x)\n", "").replace("/user/model.py", "<stdin>")
        self.assertEqual(
            compat.innermost_frame(sourceless, lambda file: not file.startswith("/torch")), ("<stdin>", 3, "forward", "")
        )

    def test_inductor_inner_graph_and_stand_ins(self):
        # The inner_compile hook yields one inner graph whose module imports from
        # torch._inductor only names the driver stands in for.
        import torch_precompile._precompile_capture as implementation
        from torch.fx.experimental.proxy_tensor import make_fx

        graph = make_fx(lambda x, w: (torch.mm(x, w).relu() + 1,))(torch.randn(4, 4), torch.randn(4, 4))
        inputs = [torch.randn(4, 4), torch.randn(4, 4)]
        with torch.no_grad():
            compiled = compat.inductor_compile(graph, inputs, dict(implementation._INDUCTOR_CONFIG))
        self.assertEqual([c[1:] for c in compiled], [(2, 1)])
        source = compiled[0][0].source_code
        imported = set()
        for node in ast.parse(source).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(compat.INDUCTOR_MODULE):
                imported |= {alias.asname or alias.name for alias in node.names}
        self.assertLessEqual({"AsyncCompile", "align"} & imported, compat.INDUCTOR_STAND_INS)
        stripped = implementation._strip_stand_in_imports(source)
        self.assertNotIn("from torch._inductor", stripped)
        self.assertIn("extern_kernels.mm", source)
        self.assertIn("mm", implementation._extern_kernel_table(source))
        # Both inputs' asserts go (one line each, or one grouped line on 2.14), nothing else does.
        on_inputs = [line + "\n" for line in source.splitlines() if "assert_size_stride" in line and "arg" in line]
        self.assertIn(len(on_inputs), (1, 2))
        kept = compat.without_input_asserts(source)
        self.assertEqual(kept, "".join(line for line in source.splitlines(keepends=True) if line not in on_inputs))

    def test_without_default_gemm_scalars_matches_the_installed_inductor(self):
        # A Linear's addmm: the installed Inductor spells out alpha=1, beta=1 (the
        # defaults); every inductor Linear test checks the rewritten module's values.
        import torch_precompile._precompile_capture as implementation
        from torch.fx.experimental.proxy_tensor import make_fx

        weight, bias, x = torch.randn(8, 4), torch.randn(8), torch.randn(3, 4)
        graph = make_fx(lambda w, b, x: (torch.nn.functional.linear(x, w, b),))(weight, bias, x)
        with torch.no_grad():
            compiled = compat.inductor_compile(graph, [weight, bias, x], dict(implementation._INDUCTOR_CONFIG))
        source = compiled[0][0].source_code
        (call,) = [line for line in source.splitlines() if "extern_kernels.addmm(" in line]
        self.assertIn(", alpha=1, beta=1, out=", call)
        rewritten = compat.without_default_gemm_scalars(source)
        self.assertEqual(rewritten, source.replace(", alpha=1, beta=1, out=", ", out="))
        # Other scalars stay; so does any other extern call.
        kept = "        extern_kernels.addmm(a, b, c, alpha=2, beta=1, out=buf0)\n        extern_kernels.mm(a, b, out=buf1)\n"
        self.assertEqual(compat.without_default_gemm_scalars(kept), kept)

    def test_parallel_checks_raising_wraps_each_checked_parallel_loop(self):
        # The shapes Inductor's CPU kernels take (the end-to-end behaviour is
        # test_an_index_out_of_range_raises_and_the_process_goes_on).
        def module(*kernels):
            return "".join(f"k{i} = async_compile.cpp_pybinding(['long*'], r'''\n{k}''')\n" for i, k in enumerate(kernels))

        def kernel(body):
            return 'extern "C" void kernel(long* in_ptr0)\n{\n' + body + "}\n"

        check = 'TORCH_CHECK((0 <= t) & (t < 10L), "index out of bounds: {0 <= t < 10L");\n'  # a brace in a string
        loop = "for(long x=0; x<4L; x+=1)\n{\n"
        collapsed = "#pragma omp parallel num_threads(2)\n{\n#pragma omp for collapse(2)\n" + loop + loop + check + "}\n}\n}\n"
        self.assertEqual(
            compat.with_parallel_checks_raising(module(kernel(collapsed))),
            module(
                compat._FIRST_ERROR + 'extern "C" void kernel(long* in_ptr0)\n'
                "{\n"
                "    PrecompileFirstError precompile_error;\n"
                "#pragma omp parallel num_threads(2)\n"
                "{\n"
                "#pragma omp for collapse(2)\n"
                "for(long x=0; x<4L; x+=1)\n"
                "{\n"
                "for(long x=0; x<4L; x+=1)\n"
                "{ try {\n"
                + check
                + "} catch (...) { precompile_error.keep(); } }\n"
                "}\n"
                "}\n"
                "    precompile_error.rethrow();\n"
                "}\n"
            ),
        )
        unchanged = [
            kernel(loop + check + "}\n"),  # no parallel region: the throw leaves the kernel
            kernel("#pragma omp parallel\n{\n" + check + "#pragma omp for\n" + loop + "}\n}\n"),  # a check outside the loop
            kernel("#pragma omp parallel\n{\n#pragma omp for\n" + loop + "}\n}\n"),  # no check
        ]
        self.assertEqual(compat.with_parallel_checks_raising(module(*unchanged)), module(*unchanged))

    def test_without_input_asserts_knows_each_versions_format(self):
        head = "    def call(self, args):\n        arg0_1, arg1_1 = args\n        args.clear()\n"
        extern = "        assert_size_stride(buf0, (4, 4), (4, 1), 'torch.ops.aten.mm.default')\n"
        tail = "        return (buf0, )\n"
        for version, asserts in {
            "2.11/2.12": ["        assert_size_stride(arg0_1, (4, 4), (4, 1))\n",
                          "        assert_size_stride(arg1_1, (4, ), (1, ))\n"],
            "2.13": ["        assert_size_stride(arg0_1, (4, 4), (4, 1), 'input')\n",
                     "        assert_size_stride(arg1_1, (4, ), (1, ), 'input')\n"],
            "2.14": ["        assert_size_stride_grouped((arg0_1, arg1_1), ((4, 4), (4, )), ((4, 1), (1, )), 'input')\n"],
        }.items():
            self.assertEqual(compat.without_input_asserts(head + "".join(asserts) + extern + tail),
                             head + extern + tail, version)
        # A lone input ("arg0_1, = args"); an assert on a name call() did not unpack stays.
        lone = "    def call(self, args):\n        arg0_1, = args\n"
        other = "        assert_size_stride(buf1, (4, ), (1, ))\n"
        self.assertEqual(compat.without_input_asserts(lone + "        assert_size_stride(arg0_1, (4, ), (1, ))\n" + other),
                         lone + other)

    def test_inductor_realize_op_and_post_grad_pass(self):
        # The op computes its input into a buffer of its own (a scalar is then
        # computed once, outside the loop that reads it); eagerly it is a copy.
        realize = compat.inductor_realize_op()
        self.assertIs(compat.inductor_realize_op(), realize)
        s = torch.tensor(2.0)
        copied = realize(s)
        self.assertEqual(copied, s)
        self.assertNotEqual(copied.data_ptr(), s.data_ptr())

        seen = []

        def scale_by_realized_pow(graph):
            seen.append(graph)
            (node,) = [n for n in graph.nodes if n.target == torch.ops.aten.pow.Scalar]
            with graph.inserting_after(node):
                computed = graph.call_function(realize, (node,))
            computed.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(computed, delete_user_cb=lambda user: user is not computed)

        graph_pass = compat.inductor_post_grad_pass(scale_by_realized_pow, "|((0, 1),)!=-1")
        # Its cache key hashes the file that defines it and compat, whose codegen patches
        # Inductor's own key does not cover: an edit to either changes it; and the size
        # facts the graph was captured assuming, which Inductor's key does not see either.
        files = Path(__file__).read_bytes() + Path(compat.__file__).read_bytes()
        self.assertEqual(graph_pass.uuid(), hashlib.sha256(files).hexdigest() + "|((0, 1),)!=-1")
        from torch.fx.experimental.proxy_tensor import make_fx

        graph = make_fx(lambda x, step: (x * 0.9**step,))(torch.randn(64, 64), torch.tensor(3.0))
        inputs = [torch.randn(64, 64), torch.tensor(3.0)]
        with torch.no_grad():
            (compiled,) = compat.inductor_compile(graph, inputs, {"post_grad_custom_post_pass": graph_pass})
        self.assertEqual(len(seen), 1)
        source = compiled[0].source_code
        self.assertIn("empty_strided_cpu((), (), torch.float32)", source)  # the scalar's own buffer
        loop = source[source.index("#pragma omp for"):]
        self.assertIn("std::pow", source)
        self.assertNotIn("std::pow", loop)

    def test_mkldnn_public_flags_toggle_only_enabled(self):
        import torch_precompile._precompile_capture as implementation

        mkldnn = torch.backends.mkldnn
        before = (mkldnn.deterministic, mkldnn.fp32_precision, torch._C._get_onednn_allow_tf32())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with implementation._without_mkldnn():
                self.assertFalse(mkldnn.enabled)
                self.assertEqual((mkldnn.deterministic, mkldnn.fp32_precision, torch._C._get_onednn_allow_tf32()), before)
        self.assertTrue(mkldnn.enabled)
        with contextlib.suppress(RuntimeError), implementation._without_mkldnn():
            raise RuntimeError
        self.assertTrue(mkldnn.enabled)


if __name__ == "__main__":
    run_tests()
