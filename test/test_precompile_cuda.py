# Owner(s): ["oncall: pt2"]
"""CUDA artifacts: Inductor's Triton kernels in the cache, and a warm load that compiles nothing.

``TestCudaArtifacts`` needs a CUDA GPU and skips cleanly without one (CI has
none; run this file on a GPU machine, e.g. with ``benchmarks/cuda_device_run.sh``).
It proves, on CUDA, what the CPU suite proves: inference and training steps,
the optimizer as an argument, free dims, the per-call device checks, autocast
inside fn, and a fresh process whose warm load imports neither Triton nor
Inductor (so no Triton compiler, ptxas or autotuning benchmark can run).

``TestCudaCacheLayout`` runs everywhere: the parts of the Triton path that
need no GPU (launch records, the grid check, the build environment, the
refusal of a CUDA artifact where no GPU is present).
"""

import ast
import copy
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile
from torch_precompile import (
    _precompile as precompile_module,
    _precompile_compat as compat_module,
    _precompile_format as format_module,
    _precompile_kernel_store as kernel_store,
    _precompile_runtime as runtime,
    PrecompileError,
)


HAS_CUDA = torch.cuda.is_available()
requires_cuda = unittest.skipUnless(HAS_CUDA, "needs a CUDA GPU")
BACKENDS = ("eager", "inductor")
# Triton's reductions and TF32-free matmuls differ from eager's in the last bits.
TOLERANCE = {"atol": 2e-5, "rtol": 2e-4}
_ARTIFACTS: dict = {}


def _artifact(key, fn, *example_inputs, backend="inductor"):
    if (key, backend) not in _ARTIFACTS:
        _ARTIFACTS[key, backend] = torch_precompile.precompile(fn, *example_inputs, backend=backend)
    return _ARTIFACTS[key, backend]


def _mlp(seed=0, device="cuda"):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 8)).to(device)


def _forward(m, x):
    return m(x)


def _train_step(m, x, y):
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    return loss.detach()


def _optimizer_step(m, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _autocast_step(m, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(m(x), y)
    loss.backward()
    return loss.detach()


def _scaled(m, x, scale):
    return m(x) * scale


def _data(seed=1, batch=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 32, generator=g).cuda(), torch.randint(0, 8, (batch,), generator=g).cuda()


OPTIMIZERS = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    "adam_foreach": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, foreach=True),
    "adamw_foreach": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True),
}


def _run_python(code, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=600)


@requires_cuda
class TestCudaArtifacts(TestCase):
    @parametrize("backend", BACKENDS)
    def test_inference_matches_eager(self, backend):
        m = _mlp()
        x, _ = _data()
        f = torch_precompile.load(*_artifact("forward", _forward, m, x, backend=backend))
        for batch_seed in (1, 2):
            x, _ = _data(batch_seed)
            with torch.no_grad():
                torch.testing.assert_close(f(m, x), m(x), **TOLERANCE)

    @parametrize("backend", BACKENDS)
    def test_training_step_grads_match_eager(self, backend):
        m = _mlp()
        x, y = _data()
        f = torch_precompile.load(*_artifact("train", _train_step, m, x, y, backend=backend))
        reference = copy.deepcopy(m)
        for seed in (1, 2):  # the second call accumulates into .grad, as eager does
            x, y = _data(seed)
            torch.testing.assert_close(f(m, x, y), _train_step(reference, x, y), **TOLERANCE)
        for ours, theirs in zip(m.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad, **TOLERANCE)

    @parametrize("name", list(OPTIMIZERS))
    def test_optimizer_in_the_artifact_matches_eager(self, name):
        m = _mlp()
        opt = OPTIMIZERS[name](m)
        x, y = _data()
        f = torch_precompile.load(*_artifact(f"opt_{name}", _optimizer_step, m, opt, x, y))
        reference = copy.deepcopy(m)
        reference_opt = OPTIMIZERS[name](reference)
        for seed in (1, 2, 3):
            x, y = _data(seed)
            torch.testing.assert_close(f(m, opt, x, y), _optimizer_step(reference, reference_opt, x, y), **TOLERANCE)
        for ours, theirs in zip(m.parameters(), reference.parameters()):
            torch.testing.assert_close(ours, theirs, **TOLERANCE)

    def test_free_batch_dim(self):
        m = _mlp()
        x, _ = _data(batch=16)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        f = torch_precompile.load(*torch_precompile.precompile(_forward, m, x))
        for batch in (16, 5, 64):
            x, _ = _data(batch=batch)
            with torch.no_grad():
                torch.testing.assert_close(f(m, x), m(x), **TOLERANCE)

    def test_autocast_bf16_training_step(self):
        m = _mlp()
        x, y = _data()
        f = torch_precompile.load(*_artifact("amp", _autocast_step, m, x, y))
        reference = copy.deepcopy(m)
        torch.testing.assert_close(f(m, x, y), _autocast_step(reference, x, y), atol=1e-2, rtol=1e-2)
        for ours, theirs in zip(m.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-2, rtol=1e-2)

    def test_mixed_cpu_and_cuda_inputs(self):
        m = _mlp()
        x, _ = _data()
        scale = torch.tensor(2.5)  # a CPU scalar tensor next to CUDA ones
        f = torch_precompile.load(*_artifact("mixed", _scaled, m, x, scale))
        with torch.no_grad():
            torch.testing.assert_close(f(m, x, torch.tensor(-1.0)), m(x) * -1.0, **TOLERANCE)
        with self.assertRaisesRegex(PrecompileError, "device"):
            f(m, x, scale.cuda())

    def test_device_mismatch_is_refused(self):
        m = _mlp()
        x, _ = _data()
        f = torch_precompile.load(*_artifact("forward", _forward, m, x))
        with self.assertRaisesRegex(PrecompileError, "device"):
            f(m, x.cpu())
        with self.assertRaisesRegex(PrecompileError, "device"):
            f(_mlp(device="cpu"), x)

    @unittest.skipUnless(torch.cuda.device_count() > 1, "needs two GPUs")
    def test_other_device_index_is_refused(self):
        m = _mlp()
        x, _ = _data()
        f = torch_precompile.load(*_artifact("forward", _forward, m, x))
        with self.assertRaisesRegex(PrecompileError, "cuda:1"):
            f(m.to("cuda:1"), x.to("cuda:1"))

    def test_cache_holds_cubins_and_launch_records(self):
        m = _mlp()
        x, y = _data()
        python_code, cache = _artifact("train", _train_step, m, x, y)
        artifact = format_module.read_artifact(python_code, cache)
        cubins = [key for key in artifact.kernels if key.endswith(".cubin")]
        self.assertGreater(len(cubins), 0)
        for key in cubins:
            self.assertIn(key.removesuffix(".cubin") + ".json", artifact.kernels)
        self.assertEqual(artifact.envelope["build_env"], format_module._build_environment(gpu=True))
        self.assertIn("async_compile.triton(", python_code)
        # Inductor's module imports Triton only inside its kernels' source strings now.
        top_level_imports = [
            alias.name for node in ast.parse(python_code).body if isinstance(node, ast.Import) for alias in node.names
        ]
        self.assertNotIn("triton", top_level_imports)

    def test_warm_load_in_a_fresh_process_imports_no_compiler(self):
        m = _mlp()
        x, y = _data()
        python_code, cache = _artifact("train", _train_step, m, x, y)
        reference = copy.deepcopy(m)
        expected = _train_step(reference, x, y)
        with tempfile.TemporaryDirectory() as tmp:
            paths = {name: os.path.join(tmp, name) for name in ("a.py", "a.cache", "data.pt", "out.pt")}
            with open(paths["a.py"], "w") as f:
                f.write(python_code)
            with open(paths["a.cache"], "wb") as f:
                f.write(cache)
            torch.save({"model": m, "x": x, "y": y}, paths["data.pt"])
            script = textwrap.dedent(
                f"""
                import sys, torch, torch_precompile
                data = torch.load({paths['data.pt']!r}, weights_only=False)
                f = torch_precompile.load(open({paths['a.py']!r}).read(), open({paths['a.cache']!r}, "rb").read())
                loss = f(data["model"], data["x"], data["y"])
                torch.cuda.synchronize()
                heavy = sorted(k for k in sys.modules if k.split(".")[0] == "triton" or k.startswith(("torch._inductor", "torch._dynamo")))
                torch.save({{"loss": loss, "grads": [p.grad for p in data["model"].parameters()], "heavy": heavy}}, {paths['out.pt']!r})
                """
            )
            # An empty Inductor/Triton cache directory: nothing to find there either.
            result = _run_python(script, env={"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"), "TRITON_CACHE_DIR": os.path.join(tmp, "triton")})
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertNotIn("compiling", result.stderr)
            out = torch.load(paths["out.pt"])
            self.assertEqual(out["heavy"], [])
            self.assertFalse(os.path.exists(os.path.join(tmp, "triton")))
        torch.testing.assert_close(out["loss"], expected, **TOLERANCE)
        for ours, theirs in zip(out["grads"], reference.parameters()):
            torch.testing.assert_close(ours, theirs.grad, **TOLERANCE)

    def test_foreign_gpu_cache_compiles_from_python_code(self):
        m = _mlp()
        x, _ = _data()
        python_code, cache = _artifact("forward", _forward, m, x)
        with mock.patch.object(format_module, "_gpu_environment", return_value="sm_00 triton 0.0"):
            with self.assertWarnsRegex(UserWarning, "compiling the kernels from python_code"):
                f = torch_precompile.load(python_code, cache)
        with torch.no_grad():
            torch.testing.assert_close(f(m, x), m(x), **TOLERANCE)


class TestCudaCacheLayout(TestCase):
    """The GPU path's parts that run without a GPU."""

    def test_grid_expressions_are_arithmetic_over_the_arguments(self):
        grid = runtime._grid_function(["-((xnumel) // -(128))", "1", "min(ynumel, 65535)"], ["in_ptr0", "xnumel", "ynumel"])
        self.assertEqual(grid(None, 1000, 7), (8, 1, 7))
        for bad in ("__import__('os').system('true')", "xnumel.bit_length()", "open", "[x for x in ()]", "1.5", "'a'"):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, "in the grid"):
                runtime._grid_function([bad, "1", "1"], ["xnumel"])

    def test_triton_key_covers_name_and_source(self):
        key = runtime.triton_kernel_key("k0", "src")
        self.assertNotEqual(key, runtime.triton_kernel_key("k1", "src"))
        self.assertNotEqual(key, runtime.triton_kernel_key("k0", "src "))

    def test_unused_triton_imports_are_stripped(self):
        from torch_precompile import _precompile_capture as capture

        source = textwrap.dedent(
            """\
            import torch
            from torch._inductor.async_compile import AsyncCompile
            import triton
            import triton.language as tl
            from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
            from torch._inductor.runtime.triton_heuristics import grid
            async_compile = AsyncCompile()
            k = async_compile.triton('k', '''import triton''', device_str='cuda')
            g = grid
            """
        )
        stripped = capture._strip_stand_in_imports(source)
        self.assertNotIn("import triton\n", stripped.split("'''")[0])
        self.assertNotIn("start_graph", stripped)
        self.assertNotIn("AsyncCompile\n", stripped.splitlines()[1])
        self.assertIn("from torch._inductor.runtime.triton_heuristics import grid", stripped)  # used: kept
        self.assertIn("'''import triton'''", stripped)

    def test_gpu_build_environment(self):
        env = format_module._build_environment(gpu=True)
        self.assertEqual(env, {**format_module._build_environment(), "gpu": format_module._gpu_environment()})
        if not HAS_CUDA:
            self.assertEqual(env["gpu"], "none")

    def test_store_names_gpu_kernels_by_their_kind(self):
        with tempfile.TemporaryDirectory() as tmp:
            files = kernel_store.place_kernels(
                tmp, {"a" * 64 + ".cubin": ("1" * 64, b"\x7fELF"), "a" * 64 + ".json": ("2" * 64, b"{}"), "b" * 64: ("3" * 64, b"so")}
            )
            self.assertEqual(
                sorted(os.path.basename(p) for p in files.values()),
                ["1" * 64 + ".cubin", "2" * 64 + ".json", "3" * 64 + ".so"],
            )

    def test_cuda_artifact_without_a_gpu_is_refused_before_executing(self):
        torch.manual_seed(0)
        m, x = nn.Linear(4, 2), torch.randn(3, 4)
        python_code, _ = _artifact("cpu_linear", _forward, m, x, backend="eager")
        as_cuda = python_code.replace("'cpu'", "'cuda:0'")
        self.assertNotEqual(as_cuda, python_code)
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            with self.assertRaisesRegex(PrecompileError, r"captured on cuda:0 and needs cuda:0, but this process sees 0 CUDA GPU"):
                torch_precompile.load(as_cuda, b"")


# An Inductor Triton kernel as Inductor 2.11 writes it (pointwise add + relu), NAME substituted.
_KERNEL_SOURCE = """
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.hints import DeviceProperties

@triton_heuristics.pointwise(
    size_hints={'x': 4096},
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'},
                 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9,
                                            regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                            max_threads_per_block=1024, warp_size=32),
                 'constants': {}, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]],
                                               (2,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'kernel_name': 'NAME', 'mutated_arg_names': ['in_out_ptr0'],
                   'optimize_mem': True, 'no_x_dim': False, 'autotune_local_cache': False},
    min_elem_per_thread=0
)
@triton.jit
def NAME(in_out_ptr0, in_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    tmp0 = tl.load(in_ptr0 + (xindex % 128), None)
    tmp1 = tl.load(in_out_ptr0 + (xindex), None)
    tl.store(in_out_ptr0 + (xindex), triton_helpers.maximum(tl.full([1], 0, tl.int32), tmp0 + tmp1), None)
"""


def _has_triton_codegen():
    try:
        return importlib.util.find_spec("triton") is not None and importlib.util.find_spec(
            "torch._inductor.runtime.static_triton_launcher"
        ) is not None
    except ImportError:
        return False


@unittest.skipUnless(_has_triton_codegen(), "needs Triton (torch's CUDA wheels bring it)")
class TestTritonLaunchRecords(TestCase):
    """The launch record precompile keeps of a compiled Triton kernel, built without a GPU.

    Triton compiles for sm_90 on any host; only loading and launching need the
    GPU (TestCudaArtifacts).  Inductor launches a kernel whose name is over 150
    characters through Triton's own launcher (Triton truncates its cache's file
    names, so the static launcher finds no cubin): its record must be the one
    the static launcher would have used.
    """

    def _autotuner(self, name: str, tmp: str):
        from torch._inductor.runtime import triton_helpers

        path = os.path.join(tmp, f"{len(name)}.py")
        with open(path, "w") as f:
            f.write(_KERNEL_SOURCE.replace("NAME", name))
        spec = importlib.util.spec_from_file_location(f"precompile_test_kernel_{len(name)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        autotuner = getattr(module, name)
        # No GPU here: compile every config for the sm_90 the source names, no driver.
        with mock.patch.object(triton_helpers, "set_driver_to_gpu", lambda: None):
            autotuner._precompile_worker()
        chosen = autotuner.compile_results[-1]
        autotuner.launchers = [types.SimpleNamespace(cache_hash=compat_module._triton_path_key(chosen.kernel.hash))]
        return autotuner, chosen

    def test_records_of_static_and_triton_launched_kernels_agree(self):
        with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": tmp}):
            short_name, long_name = "triton_poi_fused_relu_0", "triton_poi_fused_" + "relu_" * 32 + "0"
            (short, short_result), (long, long_result) = (
                self._autotuner(short_name, tmp), self._autotuner(long_name, tmp)
            )
            self.assertEqual(type(short_result).__name__, "StaticTritonCompileResult")
            self.assertEqual(type(long_result).__name__, "TritonCompileResult")
            (short_record, short_cubin), (long_record, long_cubin) = map(compat_module.triton_launch_record, (short, long))
        self.assertEqual(short_record.pop("name"), short_name)
        self.assertEqual(long_record.pop("name"), long_name)
        self.assertEqual(short_record, long_record)
        self.assertEqual(short_record["def_args"], ["in_out_ptr0", "in_ptr0", "xnumel"])
        self.assertEqual(short_record["call_args"], ["in_out_ptr0", "in_ptr0", "xnumel"])
        self.assertEqual(short_record["arg_tys"], "OOi")
        xblock = short_result.config.kwargs["XBLOCK"]
        grid = runtime._grid_function(short_record["grid"], short_record["def_args"])
        self.assertEqual(grid(None, None, 4096), (4096 // xblock, 1, 1))
        for cubin in (short_cubin, long_cubin):
            self.assertEqual(cubin[:4], b"\x7fELF")

    def test_unlaunched_kernel_is_not_cached(self):
        with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": tmp}):
            autotuner, _ = self._autotuner("triton_poi_fused_relu_1", tmp)
            autotuner.launchers = []
            self.assertIsNone(compat_module.triton_launch_record(autotuner))
            autotuner.launchers = [types.SimpleNamespace(cache_hash="no such binary")]
            self.assertIsNone(compat_module.triton_launch_record(autotuner))


instantiate_parametrized_tests(TestCudaArtifacts)


if __name__ == "__main__":
    run_tests()
