# Owner(s): ["module: dynamo"]
"""Concurrency of torch.compiler.precompile artifacts.

Note [precompile programming model] invariant 9: an inference runnable may be
called from several threads at once; a training step writes ``.grad`` (and
buffers) of the model it is given, so it must not run concurrently *on the
same model* -- concurrent training steps on separate models are fine.

* the inference runnable called from 4 threads at once (shared and per-thread
  models) gives exactly the results of serial calls;
* training steps on separate models from 4 threads match serial eager;
* several ``load()`` calls of the same pair in one process (also from 4
  threads at once) give independent, correct runnables;
* two threads calling ``precompile()`` at once capture (and lower) one after
  the other;
* 4 processes loading the same pair into one shared, empty
  ``TORCHINDUCTOR_CACHE_DIR`` at the same moment all succeed with correct
  results (and, for inductor, without compiling anything).
"""

import copy
import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

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


precompile = torch_precompile.precompile
BACKENDS = ("eager", "inductor")
THREADS = 4

logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))


def _infer(model, x):
    return model(x).softmax(-1)


def _train(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _x(seed: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))


def _y(seed: int) -> torch.Tensor:
    return torch.randint(0, 4, (4,), generator=torch.Generator().manual_seed(seed))


_PAIRS: dict = {}


def pair(kind: str, backend: str) -> tuple[str, bytes]:
    key = (kind, backend)
    if key not in _PAIRS:
        if kind == "infer":
            _PAIRS[key] = precompile(_infer, _model(), _x(0), backend=backend)
        else:
            _PAIRS[key] = precompile(_train, _model(), _x(0), _y(0), backend=backend)
    return _PAIRS[key]


def run_threads(target, count: int = THREADS) -> None:
    """Run target(i) in `count` threads released together; re-raise the first error."""
    barrier = threading.Barrier(count)
    errors = []

    def body(i):
        try:
            barrier.wait(timeout=60)
            target(i)
        except BaseException as error:  # noqa: B036 - reported in the main thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,), name=f"precompile-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    if any(thread.is_alive() for thread in threads):
        raise AssertionError("a thread did not finish within 300 s (deadlock?)")
    if errors:
        raise errors[0]


class TestThreads(TestCase):
    @parametrize("backend", BACKENDS)
    def test_inference_from_four_threads_matches_serial(self, backend):
        runnable = precompile.load(*pair("infer", backend))
        shared = _model()
        own = [_model(seed=10 + i) for i in range(THREADS)]  # one model per thread, other weights
        inputs = [_x(seed) for seed in range(8)]
        with torch.no_grad():
            serial_shared = [runnable(shared, x) for x in inputs]
            serial_own = [[runnable(m, x) for x in inputs] for m in own]
        eager = [_infer(shared, x) for x in inputs]
        for got, want in zip(serial_shared, eager):
            torch.testing.assert_close(got, want)

        def work(i):
            for round_ in range(25):
                order = range(len(inputs)) if (i + round_) % 2 else reversed(range(len(inputs)))
                for j in order:
                    model, expected = (shared, serial_shared[j]) if j % 2 else (own[i], serial_own[i][j])
                    out = runnable(model, inputs[j])
                    if not torch.equal(out, expected):
                        raise AssertionError(
                            f"thread {i}, round {round_}, input {j}: differs from the serial call "
                            f"(max abs diff {(out - expected).abs().max().item()})"
                        )

        run_threads(work)

    @parametrize("backend", BACKENDS)
    def test_training_steps_on_separate_models_from_four_threads(self, backend):
        # Safe: each thread steps its own model.  (Running a training step
        # concurrently on the *same* model is not: .grad accumulation and
        # buffer updates race, exactly as with eager .backward().)
        runnable = precompile.load(*pair("train", backend))
        refs = [_model(seed=20 + i) for i in range(THREADS)]
        models = [copy.deepcopy(m) for m in refs]
        for i, ref in enumerate(refs):
            for step in range(3):
                _train(ref, _x(100 * i + step), _y(100 * i + step))
        losses = [[None] * 3 for _ in range(THREADS)]

        def work(i):
            for step in range(3):
                losses[i][step] = runnable(models[i], _x(100 * i + step), _y(100 * i + step))

        run_threads(work)
        for i, (ref, model) in enumerate(zip(refs, models)):
            for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
                torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"thread {i}: {name}.grad: {m}")

    @parametrize("backend", BACKENDS)
    def test_loads_from_four_threads_at_once(self, backend):
        python_code, cache = pair("infer", backend)
        runnables = [None] * THREADS

        def work(i):
            runnables[i] = precompile.load(python_code, cache)
            model = _model()
            torch.testing.assert_close(runnables[i](model, _x(i)), _infer(model, _x(i)))

        with tempfile.TemporaryDirectory() as directory:
            previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory  # empty: every thread materializes kernels
            try:
                run_threads(work)
            finally:
                if previous is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
        self.assertTrue(all(callable(r) for r in runnables))


class TestHookEpoch(TestCase):
    def test_another_threads_probe_never_shows(self):
        """The hook epoch a scan records as clean: a probe (a handle made and counted at
        once) in another thread must not move it, or the next real hook could go unseen."""
        from torch_precompile import _precompile_runtime as runtime

        leaf = nn.Parameter(torch.ones(2))
        stop, seen = threading.Event(), set()

        def probe():
            while not stop.is_set():
                runtime.accumulate_grad_hooks(leaf)

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        prober = threading.Thread(target=probe)
        try:
            prober.start()
            deadline = time.perf_counter() + 1.0
            while time.perf_counter() < deadline:
                seen.add(runtime.hook_epoch())
        finally:
            stop.set()
            prober.join()
            sys.setswitchinterval(interval)
        self.assertEqual(len(seen), 1, f"hook_epoch() read {sorted(seen)} while only probes ran")


class TestWritesDuringACall(TestCase):
    """Another thread's write landing inside a call's checks (simulated at one exact
    point, where the interpreter may switch threads) is refused then or at the next
    call: never cached as checked, which would accept every later call."""

    @parametrize("window", ["_check_attributes", "_walk_module", "check_slowly"])
    def test_a_write_inside_the_checks_is_refused(self, window):
        torch.manual_seed(0)
        if window == "check_slowly":  # then the tensor guard is armed
            model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
            fn, write = _train, lambda: model[0].weight.requires_grad_(False)
            args = (model, _x(0), _y(0))
            expected = r"args\[0\]\.0\.weight \(parameter\): requires_grad was True at capture, got False"
        else:
            last = nn.LayerNorm(8) if window == "_check_attributes" else nn.Dropout(0.5)
            model = nn.Sequential(nn.Linear(8, 8), last).eval()
            fn = _infer
            write = (lambda: setattr(last, "eps", 100.0)) if window == "_check_attributes" else model.train
            args = (model, torch.randn(4, 8))
            expected = r"args\[0\]\.1\.eps is 100\.0" if window == "_check_attributes" else r"args\[0\]\.1 \(Dropout\) is in train mode"
        f = precompile.load(*precompile(fn, *args, backend="eager"))
        written = []

        def other_thread(frame, event, arg):
            if event == "return" and frame.f_code.co_name == window and not written:
                written.append(write())

        sys.setprofile(other_thread)
        try:
            f(*args)
        except torch_precompile.PrecompileError:
            pass  # refused at once: also right
        finally:
            sys.setprofile(None)
        self.assertTrue(written)
        model.zero_grad(set_to_none=True)
        with self.assertRaisesRegex(torch_precompile.PrecompileError, expected):
            f(*args)


class TestConcurrentPrecompile(TestCase):
    def test_two_threads_capture_one_at_a_time(self):
        # Capture flips process-global state (MKLDNN off, torch.compiler's compiling
        # flag, the model's tensors swapped for traced leaves): a second precompile()
        # waits for the first instead of tracing under, or undoing, its state.
        model, x, y = _model(), _x(0), _y(0)
        reference = copy.deepcopy(model)
        events, tracing, artifacts = [], threading.Event(), {}

        def observe(what):
            events.append((what, torch._C._get_mkldnn_enabled(), torch.compiler.is_compiling()))
            if what == "infer starts":
                tracing.set()  # in a function fn calls: fn changing state it closes over is refused

        def slow_infer(model, x):
            observe("infer starts")
            time.sleep(0.5)  # the other thread calls precompile() meanwhile
            observe("infer ends")
            return _infer(model, x)

        def train(model, x, y):
            observe("train")
            return _train(model, x, y)

        def work(i):
            if i == 0:
                artifacts["infer"] = precompile(slow_infer, model, x, backend="eager")
            else:
                self.assertTrue(tracing.wait(timeout=60))
                artifacts["train"] = precompile(train, model, x, y, backend="eager")

        run_threads(work, count=2)
        self.assertEqual(
            events, [("infer starts", False, True), ("infer ends", False, True), ("train", False, True)]
        )
        self.assertTrue(torch._C._get_mkldnn_enabled())
        self.assertFalse(torch.compiler.is_compiling())
        torch.testing.assert_close(precompile.load(*artifacts["infer"])(model, x), _infer(reference, x))
        torch.testing.assert_close(precompile.load(*artifacts["train"])(model, x, y), _train(reference, x, y))
        for p, q in zip(reference.parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad)

    def test_two_threads_lower_one_at_a_time(self):
        # Lowering patches Inductor's process-global config: a second precompile()
        # must not lower while the first does.  Inductor itself is stubbed (it
        # records who is inside, then refuses), so this takes no compile.
        import torch_precompile._precompile as implementation

        inside, overlaps, lowered = [], [], []

        class Stop(Exception):
            pass

        def fake_compile(graph, example_inputs, config):
            overlaps.append(list(inside))
            inside.append(threading.current_thread().name)
            lowered.append(dict(config))
            time.sleep(0.3)
            inside.pop()
            raise Stop

        # Built before the threads start: _model() reseeds the global RNG, which a
        # capture running in the other thread rightly refuses (it sees its RNG moved).
        models = [_model(i) for i in range(2)]

        def work(i):
            with self.assertRaises(Stop):
                precompile(_infer, models[i], _x(i), backend="inductor")

        original = implementation.compat.inductor_compile
        implementation.compat.inductor_compile = fake_compile
        try:
            run_threads(work, count=2)
        finally:
            implementation.compat.inductor_compile = original
        self.assertEqual(overlaps, [[], []])
        self.assertEqual(len(lowered), 2)
        self.assertTrue(torch._C._get_mkldnn_enabled())
        self.assertFalse(torch.compiler.is_compiling())


class TestSeveralLoads(TestCase):
    @parametrize("backend", BACKENDS)
    def test_several_loads_in_one_process(self, backend):
        python_code, cache = pair("train", backend)
        runnables = [precompile.load(python_code, cache) for _ in range(3)]
        refs = [_model(seed=30 + i) for i in range(3)]
        models = [copy.deepcopy(m) for m in refs]
        # Interleaved: each runnable has its own state (per-model caches, guards).
        for step in range(2):
            for i, runnable in enumerate(runnables):
                x, y = _x(step), _y(step)
                torch.testing.assert_close(runnable(models[i], x, y), _train(refs[i], x, y))
        # The same model through different loads of the same pair accumulates like eager.
        shared_ref, shared = _model(seed=40), _model(seed=40)
        for i, runnable in enumerate(runnables):
            torch.testing.assert_close(runnable(shared, _x(i), _y(i)), _train(shared_ref, _x(i), _y(i)))
        for (name, p), (_, q) in zip(shared_ref.named_parameters(), shared.named_parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}.grad: {m}")
        for model, ref in zip(models, refs):
            for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
                torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}.grad: {m}")
        # A load after the others were used still works.
        late = precompile.load(python_code, cache)
        model, ref = _model(seed=50), _model(seed=50)
        torch.testing.assert_close(late(model, _x(9), _y(9)), _train(ref, _x(9), _y(9)))


_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import torch_precompile

    workdir, index = sys.argv[1], int(sys.argv[2])
    python_code = open(os.path.join(workdir, "python_code.py")).read()
    cache = open(os.path.join(workdir, "cache.bin"), "rb").read()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    x = torch.load(os.path.join(workdir, "x.pt"))
    open(os.path.join(workdir, f"ready{index}"), "w").close()
    deadline = time.monotonic() + 240
    while not os.path.exists(os.path.join(workdir, "go")):
        if time.monotonic() > deadline:
            sys.exit("never released")
        time.sleep(0.005)
    runnable = torch_precompile.load(python_code, cache)
    out = runnable(model, x)
    torch.save(out, os.path.join(workdir, f"out{index}.pt"))
    with open(os.path.join(workdir, f"report{index}.json"), "w") as f:
        json.dump({"inductor_imported": "torch._inductor" in sys.modules}, f)
    """
)


class TestProcesses(TestCase):
    @parametrize("backend", BACKENDS)
    def test_four_processes_share_one_empty_cache_dir(self, backend):
        python_code, cache = pair("infer", backend)
        with tempfile.TemporaryDirectory() as workdir:
            cache_dir = os.path.join(workdir, "inductor_cache")
            os.mkdir(cache_dir)  # shared and empty
            with open(os.path.join(workdir, "python_code.py"), "w") as f:
                f.write(python_code)
            with open(os.path.join(workdir, "cache.bin"), "wb") as f:
                f.write(cache)
            x = _x(7)
            torch.save(x, os.path.join(workdir, "x.pt"))
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
            children = [
                subprocess.Popen(
                    [sys.executable, "-c", _CHILD, workdir, str(i)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for i in range(THREADS)
            ]
            try:
                start = time.monotonic()
                while not all(os.path.exists(os.path.join(workdir, f"ready{i}")) for i in range(THREADS)):
                    if any(child.poll() is not None for child in children) or time.monotonic() - start > 240:
                        break
                    time.sleep(0.01)
                open(os.path.join(workdir, "go"), "w").close()  # release all at once
                results = [child.communicate(timeout=300) for child in children]
            finally:
                for child in children:
                    if child.poll() is None:
                        child.kill()
            for i, (child, (_, stderr)) in enumerate(zip(children, results)):
                self.assertEqual(child.returncode, 0, msg=f"process {i} failed:\n{stderr[-3000:]}")
            expected = _infer(_model(), x)
            for i in range(THREADS):
                out = torch.load(os.path.join(workdir, f"out{i}.pt"))
                torch.testing.assert_close(out, expected, msg=lambda m: f"process {i}: {m}")
                with open(os.path.join(workdir, f"report{i}.json")) as f:
                    report = json.load(f)
                if backend == "inductor":
                    # Warm load from the cache: no compiler, no torch._inductor import.
                    self.assertFalse(report["inductor_imported"], msg=f"process {i} compiled kernels")
            leftovers = [
                name
                for root, _, files in os.walk(cache_dir)
                for name in files
                if name.endswith(".tmp")
            ]
            self.assertEqual(leftovers, [], msg="half-written kernel files left behind")


instantiate_parametrized_tests(TestThreads)
instantiate_parametrized_tests(TestWritesDuringACall)
instantiate_parametrized_tests(TestSeveralLoads)
instantiate_parametrized_tests(TestProcesses)


if __name__ == "__main__":
    run_tests()
