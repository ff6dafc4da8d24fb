# Owner(s): ["module: dynamo"]
"""Compile once, run everywhere: examples/distributed_train.py on 2 ranks.

One short job (tiny MLP, 3 steps, gloo on loopback) runs once for the class:
rank 0 precompiles the training step, every rank loads the broadcast pair and
trains data-parallel.  The tests check its results against a single-process
eager run on the full batch, and that rank 1 never ran a compiler.
"""

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.distributed as dist
from torch.testing._internal.common_utils import run_tests, TestCase


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "distributed_train.py")
STEPS, GLOBAL_BATCH, WORLD_SIZE = 3, 8, 2


def _example_module():
    spec = importlib.util.spec_from_file_location("distributed_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "needs torch.distributed with gloo")
@unittest.skipUnless(shutil.which(os.environ.get("CXX", "g++")), "rank 0 needs a C++ compiler for inductor")
class TestDistributedTrain(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls._tmp.name, "out")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nproc-per-node", str(WORLD_SIZE),
            "--master-addr", "127.0.0.1",
            "--master-port", str(_free_port()),
            EXAMPLE, out, "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH),
        ]  # fmt: skip
        job = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        if job.returncode != 0:
            cls._tmp.cleanup()
            raise AssertionError(
                f"distributed job failed (exit {job.returncode}):\n{job.stdout[-4000:]}\n{job.stderr[-8000:]}"
            )
        cls.ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(WORLD_SIZE)]

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
        super().tearDownClass()

    def test_parameters_equal_across_ranks(self):
        first = self.ranks[0]["parameters"]
        for other in self.ranks[1:]:
            self.assertEqual(other["parameters"].keys(), first.keys())
            for name, value in first.items():
                self.assertTrue(torch.equal(other["parameters"][name], value), name)

    def test_matches_single_process_eager_full_batch(self):
        example = _example_module()
        model = example.make_model()
        optimizer = example.make_optimizer(model)
        xs, ys = example.make_data(STEPS, GLOBAL_BATCH)
        losses = []
        for i in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            losses.append(example.train_step(model, xs[i], ys[i]).item())
            optimizer.step()
        trained = self.ranks[0]["parameters"]
        self.assertEqual(trained.keys(), dict(model.named_parameters()).keys())
        for name, p in model.named_parameters():
            torch.testing.assert_close(trained[name], p.detach(), msg=name)
        # Equal shards and a mean loss: the full-batch loss is the mean of the ranks' losses.
        rank_mean = torch.tensor([r["losses"] for r in self.ranks]).mean(0)
        torch.testing.assert_close(rank_mean, torch.tensor(losses))

    def test_no_compiler_on_other_ranks(self):
        for rank, result in enumerate(self.ranks[1:], start=1):
            self.assertEqual(result["compiler_calls"], [], f"rank {rank} invoked a compiler")


class TestStubCompilers(TestCase):
    def test_stubs_catch_inductors_compiler(self):
        # Negative control for test_no_compiler_on_other_ranks: with the
        # example's stubs installed, Inductor's compiler lookup hits a stub,
        # which records the call and fails.
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "calls.log")
            script = (
                "import importlib.util, sys\n"
                f"spec = importlib.util.spec_from_file_location('example', {EXAMPLE!r})\n"
                "example = importlib.util.module_from_spec(spec); spec.loader.exec_module(example)\n"
                f"example.install_stub_compilers({os.path.join(tmp, 'bin')!r}, {log!r})\n"
                "from torch._inductor.cpp_builder import get_cpp_compiler\n"
                "try:\n    get_cpp_compiler()\nexcept Exception as e:\n    sys.exit(type(e).__name__)\n"
            )
            result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
            self.assertIn("InvalidCxxCompiler", result.stderr)
            with open(log) as f:
                self.assertEqual(f.read().splitlines(), ["c++ --version"])


if __name__ == "__main__":
    run_tests()
