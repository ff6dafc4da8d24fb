# Owner(s): ["module: dynamo"]
"""Data-parallel training with a DDP-wrapped model on 2 ranks (gloo on loopback).

TestDataParallel: one job (test/_precompile_ddp_worker.py, tiny MLPs, 3
iterations, both backends) runs once for the class: rank 0 precompiles each
step, every rank loads the broadcast pairs and trains with them and with eager
DDP; the tests compare the two per rank and check the refusals.
TestFullyShard: the same for a model fully_shard (FSDP2) sharded
(test/_precompile_fsdp_worker.py), against eager FSDP2 on every rank.
TestDistributedTrain: examples/distributed_train.py, checked against a
single-process eager run on the full batch.  All check that rank 1 never ran a
compiler.
"""

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize, run_tests, TestCase


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "distributed_train.py")
WORKER = os.path.join(REPO, "test", "_precompile_ddp_worker.py")
FSDP_WORKER = os.path.join(REPO, "test", "_precompile_fsdp_worker.py")
FSDP_EXAMPLE = os.path.join(REPO, "examples", "fsdp2_train.py")
TP_WORKER = os.path.join(REPO, "test", "_precompile_tp_worker.py")
STEPS, GLOBAL_BATCH, WORLD_SIZE = 3, 8, 2
BACKENDS = ("eager", "inductor")
RUNS = ("plain", "accumulate", "sgd", "adamw", "unused", "batchnorm", "bucket_view", "mixed", "no_grad_targets")  # see _precompile_ddp_worker.run_all


def _example_module():
    spec = importlib.util.spec_from_file_location("distributed_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# On a loaded host gloo's teardown now and then aborts a rank that has finished, after
# destroy_process_group (a C++ thread torn down at exit: std::terminate, SIGABRT), in
# scripts of ours and plain eager ones alike.  Everything a test checks was saved or
# printed before it, so a job whose every rank ``finished`` is accepted with a warning.
_TEARDOWN_ABORT = "terminate called without an active exception"
# Where a rank died of a signal: its own lines (with PYTHONFAULTHANDLER, every thread's stack),
# which the other ranks' tracebacks that follow would push out of the output's tail.
_RANK_DIED = ("Fatal Python error", "terminate called", "what():")


def _first_death(stderr: str, lines: int = 80) -> str:
    text = stderr.splitlines()
    first = next((i for i, line in enumerate(text) if any(mark in line for mark in _RANK_DIED)), None)
    return "" if first is None else "\n".join(["where a rank died:", *text[first : first + lines], "..."])


def _run_job(script_and_args: list, world_size: int = WORLD_SIZE, finished: Any = None) -> None:
    """torch.distributed.run with ``world_size`` processes on loopback; raises with the output when
    it fails (unless only the teardown aborted and ``finished(job)`` says every rank had finished)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(world_size),
        "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()),
        *script_and_args,
    ]  # fmt: skip
    job = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    if job.returncode != 0 and _TEARDOWN_ABORT in job.stderr and finished is not None and finished(job):
        warnings.warn(f"{script_and_args[0]}: every rank finished, then one aborted in gloo's teardown")
    elif job.returncode != 0:
        raise AssertionError(
            f"distributed job failed (exit {job.returncode}):\n{_first_death(job.stderr)}\n{job.stdout[-4000:]}\n{job.stderr[-8000:]}"
        )


needs_gloo = unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "needs torch.distributed with gloo")
needs_compiler = unittest.skipUnless(shutil.which(os.environ.get("CXX", "g++")), "rank 0 needs a C++ compiler for inductor")


class _JobResults(TestCase):
    """Runs the class's job once; ``cls.ranks`` holds what each rank saved as OUT/rank{r}.pt."""

    world_size = WORLD_SIZE

    @classmethod
    def job(cls, out: str) -> list:
        """The script and its arguments, writing into ``out``."""
        raise NotImplementedError

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls._tmp.name, "out")
        try:
            saved = lambda job: all(os.path.exists(os.path.join(out, f"rank{r}.pt")) for r in range(cls.world_size))  # noqa: E731
            _run_job(cls.job(out), cls.world_size, finished=saved)
            cls.ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(cls.world_size)]
        except BaseException:
            cls._tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
        super().tearDownClass()


@needs_gloo
@needs_compiler
class TestDataParallel(_JobResults):
    """A DistributedDataParallel model argument (Note [precompile programming model], invariant 16)."""

    @classmethod
    def job(cls, out: str) -> list:
        return [WORKER, out, *BACKENDS]

    def assert_same_grads(self, got: list, want: list, msg: str) -> None:
        self.assertEqual(len(got), len(want), msg)
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertEqual(g is None, w is None, f"{msg}, parameter {i}: .grad None or not")
            if w is not None:
                torch.testing.assert_close(g, w, msg=f"{msg}, parameter {i}")

    @parametrize("backend", BACKENDS)
    def test_grads_and_parameters_equal_eager_ddps(self, backend):
        # Each run: 3 iterations on rank-specific data; grads after every
        # backward (accumulate: after the no_sync micro-batch too), then the
        # parameters, with the artifact and with eager DDP.
        for rank, result in enumerate(self.ranks):
            for run in RUNS:
                got, want = result["artifact"][backend][run], result["eager"][run]
                where = f"rank {rank}, run {run}"
                self.assertEqual(len(got["grads"]), len(want["grads"]))
                for i, (g, w) in enumerate(zip(got["grads"], want["grads"])):
                    self.assert_same_grads(g, w, f"{where}, backward {i}")
                self.assert_same_grads(got["params"], want["params"], f"{where}, final parameters")

    @parametrize("backend", BACKENDS)
    def test_gradients_are_averaged_over_ranks(self, backend):
        first, second = (result["artifact"][backend] for result in self.ranks)
        for i, (a, b) in enumerate(zip(first["plain"]["grads"], second["plain"]["grads"])):
            self.assert_same_grads(a, b, f"iteration {i}: ranks differ")
        # The negative control: the shards differ, so local gradients (the
        # no_sync micro-batch, before the synchronizing one) differ by rank.
        local_first, local_second = first["accumulate"]["grads"][0], second["accumulate"]["grads"][0]
        self.assertFalse(torch.allclose(local_first[0], local_second[0]))

    @parametrize("backend", BACKENDS)
    def test_unused_parameters_get_no_gradient(self, backend):
        # find_unused_parameters=True: WithUnused.unused (its last two
        # parameters) gets no .grad on any rank, like eager DDP.
        for result in self.ranks:
            for grads in result["artifact"][backend]["unused"]["grads"]:
                self.assertEqual([g is None for g in grads[-2:]], [True, True])
                self.assertTrue(all(g is not None for g in grads[:-2]))

    def test_loading_on_other_ranks_compiles_nothing(self):
        for rank, result in enumerate(self.ranks[1:], start=1):
            self.assertEqual(result["compiler_calls"], [], f"rank {rank} invoked a compiler")

    @parametrize("backend", BACKENDS)
    def test_other_world_size_is_refused(self, backend):
        refusals = self.ranks[0]["refusals"][backend]
        self.assertRegex(
            refusals["world_size"],
            r"^args\[0\]\.process_group has 1 ranks, but the artifact was captured with 2 .*precompile again for a "
            r"world size of 1$",
        )
        self.assertTrue(refusals["world_size_untouched"], "a refused call changed .grad or the parameters")

    @parametrize("backend", BACKENDS)
    def test_no_sync_must_match_capture(self, backend):
        refusals = self.ranks[0]["refusals"][backend]
        self.assertRegex(
            refusals["sync_inside_no_sync"],
            r"^args\[0\]\.require_backward_grad_sync is False, but was True at capture: this artifact all-reduces "
            r"gradients, and it is called inside ddp\.no_sync\(\)\. For gradient accumulation precompile two steps",
        )
        self.assertRegex(
            refusals["no_sync_outside"],
            r"^args\[0\]\.require_backward_grad_sync is True, but was False at capture: this artifact was captured "
            r"inside ddp\.no_sync\(\)",
        )
        self.assertTrue(refusals["untouched"], "a refused call wrote .grad")

    @parametrize("backend", BACKENDS)
    def test_buffers_are_broadcast_where_ddp_would(self, backend):
        # The batchnorm run's state (parameters, then the running statistics)
        # equals eager DDP's on every rank (test_grads_and_parameters_equal_eager_ddps):
        # without the broadcast from rank 0 before each forward, rank 1's
        # statistics would follow its own data only.
        first, second = (result["artifact"][backend]["batchnorm"]["params"] for result in self.ranks)
        self.assertFalse(torch.equal(first[-3], second[-3]), "the negative control: rank-local running means")
        refusals = self.ranks[0]["refusals"][backend]
        self.assertRegex(
            refusals["no_buffer_broadcast"],
            r"^args\[0\]\.require_forward_param_sync is False \(DDP's previous forward ran without gradient sync, "
            r".*but the graph broadcasts them",
        )
        self.assertTrue(refusals["batchnorm_untouched"], "a refused call changed .grad, parameters or buffers")

    @parametrize("backend", BACKENDS)
    def test_the_parameters_ddp_averages_must_match_capture(self, backend):
        # DDP fixes them when it is constructed: those of its module requiring grad then, less its ignored ones.
        refusals = self.ranks[0]["refusals"][backend]
        self.assertRegex(
            refusals["ignored_parameters"],
            r"^args\[0\]\.parameters_to_ignore is \['0\.bias'\], but was \[\] at capture .*construct DDP with the "
            r"same ignored parameters and buffers as at capture, or precompile again$",
        )
        self.assertRegex(
            refusals["unfrozen_after_wrapping"],
            r"^args\[0\]: DDP averages the gradients of \['0\.weight', '2\.weight', '2\.bias'\], but of \['0\.weight', "
            r"'0\.bias', '2\.weight', '2\.bias'\] at capture .*wrap the model in DDP as at capture \(requires_grad set before",
        )
        self.assertRegex(
            refusals["module_replaced"],
            r"^args\[0\]: DDP averages the gradients of \[\], but of \['0\.weight', .*ddp\.module not replaced since",
        )
        for name in ("ignored_parameters", "unfrozen_after_wrapping", "module_replaced"):
            self.assertTrue(refusals[f"{name}_untouched"], f"{name}: a refused call changed .grad or the parameters")

    @parametrize("backend", BACKENDS)
    def test_plain_module_for_ddp_is_refused(self, backend):
        self.assertRegex(
            self.ranks[0]["refusals"][backend]["plain_module"],
            r"^args\[0\] is a Sequential, but was a DistributedDataParallel at capture \(the graph all-reduces "
            r"gradients over 2 ranks\)",
        )

    @parametrize("backend", BACKENDS)
    def test_grads_share_a_bucket_where_ddps_do(self, backend):
        # Each bucket is all-reduced as one flat tensor; the eager graph copies
        # each .grad out of it as DDP's reducer does (a storage per parameter),
        # or leaves a view of it with gradient_as_bucket_view (one storage: the
        # MLP is one bucket).  Inductor removes the copies: views either way.
        for rank, result in enumerate(self.ranks):
            eager, artifact = result["eager"], result["artifact"][backend]
            self.assertEqual(eager["plain"]["grad_storages"], len(eager["plain"]["params"]))
            self.assertEqual(eager["bucket_view"]["grad_storages"], 1)
            self.assertEqual(artifact["bucket_view"]["grad_storages"], 1, f"rank {rank}")
            want = eager["plain"]["grad_storages"] if backend == "eager" else 1
            self.assertEqual(artifact["plain"]["grad_storages"], want, f"rank {rank}")

    @parametrize("backend", BACKENDS)
    def test_grads_keep_the_parameters_layout_and_dtype_buckets(self, backend):
        # MixedLayouts: a channels_last conv weight's .grad is channels_last as
        # in eager DDP, and its float64 head is a bucket of its own (values: above).
        for rank, result in enumerate(self.ranks):
            got, want = result["artifact"][backend]["mixed"]["grad_strides"], result["eager"]["mixed"]["grad_strides"]
            self.assertEqual(got, want, f"rank {rank}")
            self.assertEqual(want[0], (8, 1, 4, 2))  # channels_last

    @parametrize("backend", BACKENDS)
    def test_synchronizing_steps_only_read_the_incoming_grads(self, backend):
        # The all-reduced sum is incoming + local, computed out of place, so a
        # .grad of None passes zeros the runnable keeps (every run's later
        # iterations above use them).  no_sync accumulates without inputs; the
        # optimizer steps' zero_grad() drops them.
        grad_inputs = self.ranks[0]["grad_inputs"][backend]
        for name in ("plain", "unused", "batchnorm", "bucket_view", "mixed"):
            incoming, read_only = grad_inputs[name]
            self.assertNotEqual(incoming, [], name)
            self.assertEqual(read_only, incoming, name)
        for name in ("accumulate", "sgd", "adamw"):
            self.assertEqual(grad_inputs[name], ([], []), name)

    def test_inspector_shows_the_data_parallel_settings(self):
        inspected = self.ranks[0]["inspected_modules"]
        (plain,) = inspected["plain"]
        self.assertEqual(
            plain["data_parallel"],
            {"world_size": 2, "group_name": "0", "grad_sync": True, "find_unused_parameters": False,
             "static_graph": False, "gradient_as_bucket_view": False, "bucket_cap_bytes": 25 * 1024 * 1024,
             "comm_hook": None, "broadcast_buffers": False, "reduced": ("0.weight", "0.bias", "2.weight", "2.bias"),
             "ignored": ()},
        )
        self.assertFalse(inspected["accumulate"][0]["data_parallel"]["grad_sync"])
        self.assertTrue(inspected["batchnorm"][0]["data_parallel"]["broadcast_buffers"])
        self.assertTrue(inspected["unused"][0]["data_parallel"]["find_unused_parameters"])

    def test_capture_refuses_what_it_cannot_reproduce(self):
        refusals = self.ranks[0]["capture_refusals"]
        self.assertRegex(
            refusals["unused"],
            r"^args\[0\]: backward produced no gradient for module\.unused\.weight, module\.unused\.bias; .*"
            r"find_unused_parameters=True",
        )
        self.assertRegex(
            refusals["comm_hook"], r"^args\[0\] has the comm hook 'fp16_compress_hook' .*which the artifact cannot run"
        )
        self.assertRegex(
            refusals["buffers_in_no_sync"],
            r"^args\[0\]: DDP broadcasts this model's buffers before a forward only when the previous forward "
            r"synchronized gradients, which a step captured inside no_sync\(\) .*broadcast_buffers=False",
        )
        self.assertRegex(
            refusals["frozen_after_wrapping"],
            r"^args\[0\]: DDP averages the gradients of the parameters that required grad when it was constructed; "
            r"module\.0\.bias frozen since \(eager DDP's reducer waits for their gradients\): set requires_grad before "
            r"wrapping the model in DDP",
        )
        self.assertRegex(
            refusals["fsdp"], r"^args\[0\] is a FullyShardedDataParallel \(FSDP1\), which precompile does not support: .*fully_shard"
        )

    def test_capture_runs_no_collective(self):
        """Rank 0 captures alone while rank 1 waits elsewhere: a collective in fn is refused at once
        (the other rank never joins it), naming the op and fn's line."""
        refusals = self.ranks[0]["capture_refusals"]
        for name, op in (
            ("all_reduce", r"c10d\.allreduce_\.default"),
            ("functional_all_reduce", r"_c10d_functional\.all_reduce\.default"),
            ("redistribute", r"_c10d_functional\.all_gather_into_tensor\.default"),
        ):
            self.assertRegex(
                refusals[name],
                rf"^fn runs the collective {op} at .*_precompile_ddp_worker\.py:\d+ .*while it is captured\. "
                r"Capture runs in one process",
            )
        # An op on a DTensor made inside fn may communicate inside DTensor's own dispatch: refused at the op.
        self.assertRegex(
            refusals["dtensor_op"],
            r"^fn computes with a DTensor over several ranks \(aten\.mul\.Tensor\) at .*_precompile_ddp_worker\.py:\d+",
        )
        for name in ("all_reduce", "functional_all_reduce", "redistribute", "dtensor_op"):
            self.assertLess(refusals[f"{name}_seconds"], 10, name)


# What both sharded forms refuse alike (Note invariant 17).
WORLD_SIZE_REFUSAL = (
    r"^args\[0\]\.0\.weight \(parameter\) is sharded over 1 ranks, but over 2 at capture .*precompile again for a world size of 1"
)
REPLICATED_GRAD_REFUSAL = (
    r"^args\[0\]\.0\.weight \(parameter\)\.grad is a DTensor of shape \(32, 16\), not a DTensor placed \[Shard\(dim=0\)\] "
    r"as backward leaves it, .*set it to None"
)
SETS_GRAD_REFUSAL = (
    r"^fn sets args\[0\]\.0\.weight\.grad at .*_precompile_fsdp_worker\.py:\d+ .*, a parameter of a model sharded by "
    r"fully_shard or tensor parallel, to a tensor: precompile supports setting it to None"
)


class _ShardedChecks:
    """For a _JobResults whose ranks save, per run, the artifact's and eager's snapshots
    (_precompile_fsdp_worker.snapshot), the refusals' messages, and rank 1's compilers
    (a mixin: unittest would run its tests alone otherwise)."""

    def assert_runs_equal_eager(self, backend: str, runs: tuple) -> None:
        """Per rank and iteration: the output, the local shards of the parameters and of their
        DTensor gradients, the gradients' placements and the optimizer state equal eager's."""
        for rank, result in enumerate(self.ranks):
            for name in runs:
                ours, theirs = result["artifact"][backend][name], result["eager"][name]
                self.assertEqual(len(ours), len(theirs))
                for i, (got, want) in enumerate(zip(ours, theirs)):
                    msg = f"rank {rank}, {name}, iteration {i}"
                    self.assertEqual(got["types"], want["types"], msg)
                    for key in ("out", "params", "grads"):
                        if key in want:
                            torch.testing.assert_close(got[key], want[key], msg=lambda m: f"{msg}, {key}: {m}")
                    for got_state, want_state in zip(got.get("optimizer") or (), want.get("optimizer") or ()):
                        self.assertEqual({k: t for k, (t, _) in got_state.items()}, {k: t for k, (t, _) in want_state.items()}, msg)
                        for key, (_, value) in want_state.items():
                            torch.testing.assert_close(got_state[key][1], value, msg=lambda m: f"{msg}, {key}: {m}")

    def assert_refused(self, refusals: dict, patterns: tuple, untouched: bool) -> None:
        """Each message matches, advises no removing of the sharder's hooks, and (``untouched``)
        the refused call left the model as it was."""
        for name, pattern in patterns:
            with self.subTest(name):
                self.assertRegex(refusals[name], pattern)
                self.assertNotIn("Remove it", refusals[name])
                if untouched:
                    self.assertTrue(refusals[f"{name}_untouched"], name)

    def test_ranks_hold_different_shards(self):
        """Each rank's gradient shard is its own part: rank 0's and rank 1's differ."""
        grads = [result["artifact"]["eager"]["accumulate"][0]["grads"][0] for result in self.ranks[:2]]
        self.assertFalse(torch.equal(*grads))

    def test_loading_on_other_ranks_compiles_nothing(self):
        self.assertEqual(self.ranks[1]["compiler_calls"], [])


@needs_gloo
@needs_compiler
class TestFullyShard(_ShardedChecks, _JobResults):
    """A model fully_shard (FSDP2) sharded (Note [precompile programming model], invariant 17)."""

    RUNS = ("accumulate", "no_reshard", "outside", "forward", "sgd", "adam", "adamw", "clip")  # see _precompile_fsdp_worker.run

    @classmethod
    def job(cls, out: str) -> list:
        return [FSDP_WORKER, out, *BACKENDS]

    @parametrize("backend", BACKENDS)
    def test_steps_equal_eager_fully_shard(self, backend):
        """Per rank, after each of 3 iterations and an eager step after them: the output, the local
        shards of the parameters and of their DTensor gradients, the gradients' placements and the
        optimizer state (inside fn and outside it) equal eager FSDP2's; with mixed precision
        policies too (bfloat16 compute, float32 or bfloat16 reduction)."""
        self.assert_runs_equal_eager(backend, self.RUNS)
        sharded = ("DTensor", "DTensor", ("Shard(dim=0)",))
        self.assertEqual(self.ranks[0]["artifact"][backend]["accumulate"][0]["types"], [sharded] * 6)

    def test_gpt2_step_equals_eager_fully_shard(self):
        """A Hugging Face GPT-2 (blocks and root sharded, tied embeddings), backend='eager':
        losses and gradient shards over 2 accumulating iterations, per rank."""
        if "gpt2" not in self.ranks[0]["eager"]:
            self.skipTest("needs transformers")
        for rank, result in enumerate(self.ranks):
            for i, (got, want) in enumerate(zip(result["artifact"]["eager"]["gpt2"], result["eager"]["gpt2"])):
                self.assertEqual(got["types"], want["types"])
                for key in ("out", "grads"):
                    torch.testing.assert_close(got[key], want[key], msg=lambda m: f"rank {rank}, iteration {i}, {key}: {m}")

    @parametrize("backend", BACKENDS)
    def test_calls_refuse_other_shardings_before_changing_anything(self, backend):
        refusals = self.ranks[0]["refusals"][backend]
        self.assert_refused(refusals, (
            ("world_size", WORLD_SIZE_REFUSAL),
            ("mixed_precision", r"^args\[0\] is sharded by fully_shard with mixed precision policy MixedPrecisionPolicy\("
                                r"param_dtype=torch\.bfloat16.*\), but without one at capture \(the graph casts as capture's "
                                r"policy does\): shard it with capture's mp_policy, or precompile again$"),
            ("other_policy", r"^args\[0\] is sharded by fully_shard with mixed precision policy MixedPrecisionPolicy\("
                             r"param_dtype=torch\.bfloat16, reduce_dtype=None, output_dtype=torch\.float32.*\), but with "
                             r"MixedPrecisionPolicy\(param_dtype=torch\.bfloat16, reduce_dtype=torch\.float32, "
                             r"output_dtype=torch\.float32.*\) at capture"),
            ("unsharded", r"^args\[0\]\.0\.weight \(parameter\) is a Parameter, but was a DTensor sharded by fully_shard "
                          r"at capture .*call model\.reshard\(\)"),
            ("no_gradient_sync", r"^args\[0\]\.0 is sharded by fully_shard, and its gradient sync is off "
                                 r"\(set_requires_gradient_sync\(False\).*call set_requires_gradient_sync\(True\)"),
            ("custom_reduce_scatter", r"^args\[0\]\.0 is sharded by fully_shard, and its reduce_scatter_comm is a "
                                      r"_SummingReduceScatter \(set_custom_all_gather / set_custom_reduce_scatter\), which "
                                      r"the graph does not run"),
            ("no_reshard_after_backward", r"^args\[0\]\.0 is sharded by fully_shard, and it does not reshard after backward "
                                          r"\(set_reshard_after_backward\(False\)\): .*call set_reshard_after_backward\(True\)$"),
            ("requires_grad", r"^args\[0\]\.0\.weight \(parameter\): requires_grad was True at capture, got False"),
            ("replicated_grad", REPLICATED_GRAD_REFUSAL),
            ("plain_model", r"^args\[0\] is a torch\.nn\.modules\.container\.Sequential, but was a .*FSDPSequential"),
        ), untouched=True)
        self.assertEqual(self.ranks[1]["refusals"][backend]["unsharded"], refusals["unsharded"])

    @parametrize("backend", BACKENDS)
    def test_capture_refuses_what_it_cannot_reproduce(self, backend):
        """Named, with a fix that keeps the model's semantics (no advice to remove fully_shard's hooks)."""
        self.assert_refused(self.ranks[0]["refusals"][backend], (
            ("offload", r"^args\[0\]\.0 is sharded by fully_shard, and it offloads parameters to the CPU \(CPUOffloadPolicy\)"),
            ("no_gradient_sync", r"^args\[0\]\.0 is sharded by fully_shard, and its gradient sync is off"),
            ("uneven", r"^args\[0\]\.0\.weight has 7 rows over 2 ranks: its shards differ in size from rank to rank"),
            ("grouped", r"^args\[0\]\.0 was sharded by one fully_shard call together with other modules"),
            ("sets_grad", SETS_GRAD_REFUSAL),
            ("forward_in_grad_mode", r"^args\[0\]: fn runs its forward with grad enabled and no backward through it; "
                                     r"eager fully_shard then leaves its unsharded parameters registered .*run that forward "
                                     r"under torch\.no_grad\(\), or call backward on its output inside fn$"),
            ("forward_without_reshard", r"^args\[0\]\.0: fn runs its forward with grad enabled and no backward through it"),
            ("hsdp", r"^args\[0\]\.0\.weight is placed \(Replicate\(\), Shard\(dim=0\)\) on a 2-D device mesh: precompile "
                     r"supports fully_shard with its default Shard\(0\) placement on a 1-D mesh, or on the first dim of a named "
                     r"2-D mesh whose second dim tensor parallel shards"),
        ), untouched=False)

    def test_example_trains_as_eager_fully_shard(self):
        """examples/fsdp2_train.py asserts each rank's losses and final shards against eager FSDP2."""
        checked = lambda job: all(f"rank {r}: parameter shards equal" in job.stdout for r in range(WORLD_SIZE))  # noqa: E731
        _run_job([FSDP_EXAMPLE, "--steps", "2", "--backend", "eager"], finished=checked)

    def test_communication_overlaps_compute(self):
        """Both all-gathers are launched before the first layer computes, the second waited for
        only after it; the first reduce-scatter is launched before backward's last matmul."""
        ops = self.ranks[0]["graph_ops"]
        position = lambda name, n=0: [i for i, op in enumerate(ops) if op == name][n]  # noqa: E731
        self.assertEqual(ops.count("all_gather_into_tensor"), 3)  # a group per Linear
        self.assertLess(position("all_gather_into_tensor", 2), position("addmm"))
        self.assertGreater(position("wait_tensor", 1), position("addmm"))
        self.assertLess(position("reduce_scatter_tensor"), max(i for i, op in enumerate(ops) if op == "mm"))

    def test_checks_list_the_shardings(self):
        checks = [line for line in self.ranks[0]["checks"] if line.startswith("sharded")]
        self.assertEqual(len(checks), 7)  # six parameters, and fully_shard's settings
        self.assertRegex(
            checks[0],
            r"^sharded +args\[0\]\.0\.weight \(parameter\): a DTensor of shape \(32, 16\) placed \[Shard\(dim=0\)\] on a "
            r"mesh over process group '0' of 2 ranks$",
        )

    def test_checks_list_the_mixed_precision_policies(self):
        """One line per fully_shard module (the root, each Linear), with its policy."""
        checks = [line for line in self.ranks[0]["mixed_precision_checks"] if "mixed precision policy" in line]
        self.assertEqual([line.split()[1] for line in checks], ["args[0]:", "args[0].0:", "args[0].2:", "args[0].4:"])
        for line in checks:
            self.assertRegex(line, r"fully_shard's mixed precision policy MixedPrecisionPolicy\(param_dtype=torch\.bfloat16, "
                                   r"reduce_dtype=torch\.float32, output_dtype=torch\.float32, cast_forward_inputs=True\)$")


@needs_gloo
@needs_compiler
class TestTensorParallel(_ShardedChecks, _JobResults):
    """A model parallelize_module split (Note [precompile programming model], invariant 17)."""

    RUNS = ("accumulate", "outside", "forward", "sgd", "adamw", "clip")  # see _precompile_tp_worker.run
    BLOCK_RUNS = ("sequence_parallel", "prepared")  # ... and run_block

    @classmethod
    def job(cls, out: str) -> list:
        return [TP_WORKER, out, *BACKENDS]

    @parametrize("backend", BACKENDS)
    def test_steps_equal_eager_tensor_parallel(self, backend):
        """Per rank, after each of 3 iterations: the output, the local shards of the parameters
        and of their DTensor gradients, the gradients' placements and the optimizer state
        (inside fn and outside it) equal eager tensor parallel's."""
        self.assert_runs_equal_eager(backend, self.RUNS)
        placed = [("DTensor", "DTensor", (p,)) for p in ("Shard(dim=0)", "Shard(dim=0)", "Shard(dim=1)", "Replicate()")]
        self.assertEqual(self.ranks[0]["artifact"][backend]["accumulate"][0]["types"], placed + [("Parameter", "Tensor", ())] * 2)

    @parametrize("backend", BACKENDS)
    def test_sequence_parallel_steps_equal_eager(self, backend):
        """SequenceParallel norms (their .grad Partial(sum), accumulated over 3 calls, and stepped by
        AdamW outside fn), with the linears' layouts or PrepareModuleInputOutput moving the sequence."""
        self.assert_runs_equal_eager(backend, self.BLOCK_RUNS)
        norm_weight = self.ranks[0]["artifact"][backend]["prepared"][0]["types"][0]
        self.assertEqual(norm_weight, ("DTensor", "DTensor", ("Partial(sum)",)))

    def test_graph_all_reduces_the_row_wise_output(self):
        """The row-wise layer's partial sums are all-reduced in the graph, by the functional collective."""
        self.assertEqual(self.ranks[0]["collectives"], ["all_reduce", "wait_tensor"])

    @parametrize("backend", BACKENDS)
    def test_calls_refuse_other_parallelizations_before_changing_anything(self, backend):
        refusals = self.ranks[0]["refusals"][backend]
        self.assert_refused(refusals, (
            ("world_size", WORLD_SIZE_REFUSAL),
            ("placements", r"^args\[0\]\.0\.weight \(parameter\) is a DTensor of shape \(32, 16\) placed \[Shard\(dim=1\)\] "
                           r"on a 1-D mesh, but was of shape \(32, 16\) placed \[Shard\(dim=0\)\] on a 1-D mesh at capture"),
            ("hooks", r"^args\[0\]\.2 has a tensor parallel forward hook other than at capture, .*RowwiseParallel\._prepare_output_fn, "
                      r"\(\(Shard\(dim=0\),\), True\).*Parallelize the model with the same plan as at capture"),
            ("replicated_grad", REPLICATED_GRAD_REFUSAL),
            ("plain_model", r"^args\[0\]\.0\.weight \(parameter\) is a Parameter, but was a DTensor sharded by tensor parallel"),
        ), untouched=True)
        self.assert_refused(refusals, (  # a ParallelStyle's setting changed after parallelize_module
            ("style_changed", r"^args\[0\]\.mlp has a tensor parallel forward pre-hook other than at capture, .*PrepareModuleInput"),
        ), untouched=False)

    @parametrize("backend", BACKENDS)
    def test_capture_refuses_what_it_cannot_reproduce(self, backend):
        self.assert_refused(self.ranks[0]["refusals"][backend], (
            ("embedding", r"^fn's trace reads this process's rank at .*_precompile_tp_worker\.py:\d+ .*\(DeviceMesh\.\w+\(\), "
                          r"in \w+ at .*\): DTensor computes from it a sharded embedding's offsets"),
            ("uneven", r"^args\[0\]\.0\.weight has 7 entries in dim 0 over 2 ranks: its shards differ in size"),
            ("sets_grad", SETS_GRAD_REFUSAL),
            ("partial_grad_optimizer", r"^args\[0\]\.norm\.\w+'s gradient is placed \(Partial\(sum\),\), and the optimizer "
                                       r"inside fn steps the local shards.*keep opt\.step\(\) outside fn"),
        ), untouched=False)

    def test_checks_list_the_parallelization(self):
        checks = [line for line in self.ranks[0]["checks"] if line.startswith("sharded")]
        self.assertEqual(len(checks), 8)  # four parameters, four hooks
        self.assertRegex(
            checks[3],
            r"^sharded +args\[0\]\.2\.bias \(parameter\): a DTensor of shape \(32,\) placed \[Replicate\(\)\] on a "
            r"mesh over process group '0' of 2 ranks$",
        )
        self.assertRegex(
            checks[4],
            r"^sharded +args\[0\]\.0\._forward_pre_hooks: tensor parallel's hook .*ColwiseParallel\._prepare_input_fn, "
            r"\(\(Replicate\(\),\), \(Replicate\(\),\)\)",
        )


@needs_gloo
@needs_compiler
class TestFullyShardOverTensorParallel(_ShardedChecks, _JobResults):
    """fully_shard over a tensor parallel model on a 2 x 2 mesh (4 ranks): its shards gathered
    over the data-parallel dim into tensor parallel's (Note invariant 17)."""

    world_size = 4

    @classmethod
    def job(cls, out: str) -> list:
        return [TP_WORKER, out, "2d", *BACKENDS]

    @parametrize("backend", BACKENDS)
    def test_steps_equal_eager(self, backend):
        """Per rank, 3 iterations accumulating, and 3 with AdamW inside fn (also in bfloat16 by
        fully_shard's mixed precision policy): outputs, 2-D DTensor parameter and gradient
        shards, placements and optimizer state equal eager's."""
        self.assert_runs_equal_eager(backend, ("accumulate", "adamw", "bf16_adamw"))
        param, grad, (over_data_parallel, tensor_parallel) = self.ranks[0]["artifact"][backend]["accumulate"][0]["types"][0]
        self.assertEqual((param, grad, tensor_parallel), ("DTensor", "DTensor", "Shard(dim=0)"))
        self.assertRegex(over_data_parallel, r"^_StridedShard\(dim=0")  # fully_shard's, over tensor parallel's dim 0

    def test_other_ranks_compile_nothing(self):
        for rank in (1, 2, 3):  # each in other process groups than rank 0, whose names the graph holds
            self.assertEqual(self.ranks[rank]["compiler_calls"], [], rank)

    def test_a_call_without_fully_shard_is_refused(self):
        self.assertRegex(
            self.ranks[0]["refusal"],
            r"^args\[0\] is a torch\.nn\.modules\.container\.Sequential, but was a .*FSDPSequential",
        )


@needs_gloo
@needs_compiler
class TestDistributedTrain(_JobResults):
    @classmethod
    def job(cls, out: str) -> list:
        return [EXAMPLE, out, "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH)]

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
        for i in range(STEPS):  # one process, the full batch, no DDP
            losses.append(example.train_step(model, optimizer, xs[i], ys[i]).item())
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


instantiate_parametrized_tests(TestDataParallel)
instantiate_parametrized_tests(TestFullyShard)
instantiate_parametrized_tests(TestTensorParallel)
instantiate_parametrized_tests(TestFullyShardOverTensorParallel)


if __name__ == "__main__":
    run_tests()
