"""Shared machinery of the precompile benchmarks (``benchmarks/*.py``).

What lives here, so the three scripts have no copy-paste twins:

* the workloads (tiny Linear, MLP forward, MLP training step, conv+BatchNorm
  forward) and the ways to run them (``Method``: eager, torch.compile,
  precompile with either backend, and precompile's raw generated call);
* the fresh-process runner: each script re-runs itself as
  ``python SCRIPT --child TASK_JSON``; the child's clock starts right after
  ``import torch`` (this module imports no torch at module level, so
  importing it first costs nothing measurable);
* the shared child tasks: ``build`` (time one method's build in a fresh process
  with a given inductor cache dir), ``start`` (fresh process: load + first
  result) and ``steady`` (one process, ``torch.set_num_threads(1)``, all methods
  interleaved, medians of repeats);
* statistics, formatting, machine description and markdown tables.

Every figure the scripts print is a median of repeats and is shown next to a
ratio against a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import gc
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


BENCH_DIR = Path(__file__).resolve().parent
# PRECOMPILE_BENCH_RESULTS redirects the tables (CI smoke runs keep the committed ones).
RESULTS_DIR = Path(os.environ.get("PRECOMPILE_BENCH_RESULTS", BENCH_DIR / "results"))
RESULT_MARK = "@@precompile-bench-result@@"
NO_COMPILER = "+no-compiler"  # suffix of the start modes run with failing stub compilers
HEAVY_MODULES = ("torch._inductor", "torch._dynamo")


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


def forward(model, x):
    """The forward workloads' fn."""
    return model(x)


def train_step(model, x, y):
    """The training-step workload's fn: MSE loss + backward, returns the loss."""
    import torch.nn.functional as F

    loss = F.mse_loss(model(x), y)
    loss.backward()
    # Detached: the caller gets the value; grads were already accumulated.
    # (aot_compile cannot trace a step that returns a tensor whose grad_fn
    # backward consumed, so every method gets the same, detached, result.)
    return loss.detach()


def _tiny_model():
    import torch

    return torch.nn.Linear(16, 16)


def _mlp_model():
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
    )


def _conv_model():
    import torch

    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).eval()


def _gpt2_model():
    """A small random-initialised Hugging Face GPT-2 (4 layers x 256), eval mode.

    Wrapped so that ``model(ids)`` returns the logits tensor: every method then
    runs the same ``forward`` / ``train_step`` fn as the other workloads.
    Dropout probabilities are 0, so eager and every compiled peer compute
    the same values.
    """
    import torch
    import transformers

    class LogitsOf(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids).logits

    config = transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, eos_token_id=0, bos_token_id=0,
    )
    return LogitsOf(transformers.GPT2LMHeadModel(config)).eval()


def _gpt2_inputs(train: bool):
    import torch

    ids = torch.randint(0, 1000, (2, 64))
    return (ids, torch.randn(2, 64, 1000)) if train else (ids,)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    label: str
    kind: str  # "forward" (run under torch.no_grad) or "train"
    make_model: Callable[[], Any]
    input_shapes: tuple  # shapes of the user tensors, in fn's argument order
    zero_grads: bool = True  # steady state: set .grad = None before every step
    artifacts_of: str | None = None  # reuse another workload's builds (same model and fn)
    make_inputs: Callable[[], tuple] | None = None  # instead of randn of input_shapes
    needs: str | None = None  # a package the workload's model comes from

    @property
    def train(self) -> bool:
        return self.kind == "train"

    @property
    def fn(self) -> Callable:
        return train_step if self.train else forward

    def context(self):
        import torch

        return contextlib.nullcontext() if self.train else torch.no_grad()

    def build(self):
        """(model, inputs), deterministic: same weights and data in every process."""
        import torch

        torch.manual_seed(0)
        model = self.make_model()
        if self.make_inputs is not None:
            return model, self.make_inputs()
        inputs = tuple(torch.randn(*shape) for shape in self.input_shapes)
        return model, inputs


WORKLOADS = {
    w.name: w
    for w in (
        Workload("tiny", "tiny Linear(16,16), batch 1, forward", "forward", _tiny_model, ((1, 16),)),
        Workload("mlp_fwd", "MLP 3xLinear(256), batch 64, forward", "forward", _mlp_model, ((64, 256),)),
        Workload(
            "mlp_train",
            "MLP training step (MSE + backward; grads set to None before each step)",
            "train",
            _mlp_model,
            ((64, 256), (64, 256)),
        ),
        Workload(
            "mlp_train_acc",
            "MLP training step, grads accumulating (no zero_grad between steps)",
            "train",
            _mlp_model,
            ((64, 256), (64, 256)),
            zero_grads=False,
            artifacts_of="mlp_train",
        ),
        Workload(
            "conv_fwd",
            "conv+BatchNorm net (eval), batch 8, 3x32x32, forward",
            "forward",
            _conv_model,
            ((8, 3, 32, 32),),
        ),
        Workload(
            "gpt2_fwd",
            "HF GPT-2 4x256 (random init, eval), ids 2x64, logits",
            "forward",
            _gpt2_model,
            (),
            make_inputs=lambda: _gpt2_inputs(train=False),
            needs="transformers",
        ),
        Workload(
            "gpt2_train",
            "HF GPT-2 4x256 training step (MSE on logits + backward, no dropout), ids 2x64",
            "train",
            _gpt2_model,
            (),
            make_inputs=lambda: _gpt2_inputs(train=True),
            needs="transformers",
        ),
    )
}


# ---------------------------------------------------------------------------
# Methods: how one workload is built, loaded and called
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Runtime:
    """A loaded method, ready to run the workload once per ``call()``."""

    call: Callable[[], Any]
    params: list  # tensors whose .grad a training call writes
    context: Callable[[], Any] = contextlib.nullcontext  # entered around calls


class Method:
    """One way to run a workload.  Subclasses override what they need.

    ``build`` runs in a fresh process whose TORCHINDUCTOR_CACHE_DIR is empty and
    returns at least ``build_s``; ``load`` runs in a fresh process and returns a
    Runtime; the framework times load + first call.  Both receive ``art``, the
    method's artifact directory (``artifact_from`` names another method whose
    artifacts it reuses).
    """

    name = ""
    label = ""
    artifact_from: str | None = None
    weights_baked = "no"
    # Fresh-process start modes: "empty" (new empty inductor cache dir per
    # run) and/or "own" (the method's own warm cache dir).
    start_modes: tuple = ("empty",)
    slow_empty_start = False  # an empty-dir start compiles kernels (seconds)
    steady_artifact: str | None = None  # steady state loads this method's build instead

    def unsupported(self, wl: Workload) -> str | None:
        return None

    def build(self, wl: Workload, model, inputs, art: Path) -> dict:
        return {"build_s": 0.0}

    def load(self, wl: Workload, model, inputs, art: Path) -> Runtime:
        raise NotImplementedError

    def artifact_bytes(self, art: Path, build_info: dict) -> int | None:
        return None

    @property
    def artifact_dir_name(self) -> str:
        return self.artifact_from or self.name


class Eager(Method):
    name, label = "eager", "eager"

    def load(self, wl, model, inputs, art):
        fn = wl.fn
        return Runtime(lambda: fn(model, *inputs), list(model.parameters()), wl.context)


class Compile(Method):
    """torch.compile; its build is the cold first call (it has no separate build)."""

    name, label = "compile", "torch.compile"
    start_modes = ("own",)

    def build(self, wl, model, inputs, art):
        import torch

        t0 = time.perf_counter()
        compiled = torch.compile(wl.fn)
        with wl.context():
            compiled(model, *inputs)
        build_s = time.perf_counter() - t0
        # The mega-cache of this very compile (used by the MegaCache method).
        t1 = time.perf_counter()
        saved = torch.compiler.save_cache_artifacts()
        save_s = time.perf_counter() - t1
        if saved is not None:
            (art / "mega.bin").write_bytes(saved[0])
        return {
            "build_s": build_s,
            "mega_save_s": save_s,
            "mega_bytes": None if saved is None else len(saved[0]),
            "cache_dir_bytes": dir_bytes(os.environ["TORCHINDUCTOR_CACHE_DIR"]),
        }

    def load(self, wl, model, inputs, art):
        import torch

        compiled = torch.compile(wl.fn)
        return Runtime(lambda: compiled(model, *inputs), list(model.parameters()), wl.context)

    def artifact_bytes(self, art, build_info):
        return build_info.get("cache_dir_bytes")


class Precompile(Method):
    name, label = "precompile", "precompile (inductor)"
    backend = "inductor"
    start_modes = ("empty", "own")

    def _api(self):
        """(precompile, load): this package's."""
        import torch_precompile

        return torch_precompile.precompile, torch_precompile.load

    def build(self, wl, model, inputs, art):
        precompile, _ = self._api()
        t0 = time.perf_counter()
        code, cache = precompile(wl.fn, model, *inputs, backend=self.backend)
        build_s = time.perf_counter() - t0
        (art / "code.py").write_text(code)
        (art / "cache.bin").write_bytes(cache)
        return {"build_s": build_s, "code_bytes": len(code.encode()), "cache_bytes": len(cache)}

    def _load(self, art):
        _, load = self._api()
        return load((art / "code.py").read_text(), (art / "cache.bin").read_bytes())

    def load(self, wl, model, inputs, art):
        f = self._load(art)
        return Runtime(lambda: f(model, *inputs), list(model.parameters()), wl.context)

    def artifact_bytes(self, art, build_info):
        return build_info["code_bytes"] + build_info["cache_bytes"]


class PrecompileEager(Precompile):
    name, label = "precompile_eager", "precompile (eager backend)"
    backend = "eager"


def torch_own_precompile_missing() -> str | None:
    """Why torch's own ``torch.compiler.precompile`` cannot be measured here (None: it can).

    torch 2.14 ships a prototype of its own (``torch/_precompile.py``, the class
    ``_PrecompileApi``); earlier releases have none, and there this package
    attaches itself as ``torch.compiler.precompile``.  Read from the file, so
    the parent process need not import torch.
    """
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "torch is not installed"
    own = Path(spec.submodule_search_locations[0]) / "_precompile.py"
    with contextlib.suppress(OSError):
        if "class _PrecompileApi" in own.read_text():
            return None
    return "this torch has no precompile of its own (torch 2.14 has)"


class TorchPrecompile(Precompile):
    """torch 2.14's own prototype: ``torch.compiler.precompile(...)`` / ``.load(...)``.

    Same call shape as this package.  Its cache is a ``torch.save`` of Inductor's
    ``save_cache_artifacts`` bundle; its ``load`` imports ``torch._dynamo``, primes
    the Inductor caches with the bundle and executes ``python_code``, whose kernels
    are then compiled or fetched from the Inductor cache directory.
    """

    name, label = "torch_precompile", "torch's own precompile (inductor)"
    slow_empty_start = True

    def unsupported(self, wl):
        return torch_own_precompile_missing()

    def _api(self):
        import torch

        api = torch.compiler.precompile
        if type(api).__name__ != "_PrecompileApi":  # this package, attached on torch < 2.14
            raise RuntimeError(f"torch.compiler.precompile is not torch's own here: {type(api)}")
        return api, api.load


class TorchPrecompileEager(TorchPrecompile):
    name, label = "torch_precompile_eager", "torch's own precompile (eager backend)"
    backend = "eager"
    slow_empty_start = False


class DriverProbe(Precompile):
    """Pieces of a precompiled call, to separate the driver's cost from the graph's.

    ``graph``: "raw" runs the artifact's generated graph on the flat input list
    (state + user tensors + constants); "noop" returns outputs computed once,
    so only the Python around it is timed.  ``handoff``: also hand the grads
    to ``.grad`` in a plain loop (what the driver must do for a training
    step).  ``driver``: run the real driver (``f(model, *inputs)``) around a
    no-op graph first -- alone (``graph=None``) it is the driver's own cost;
    followed by the raw graph it shows what the driver's Python does to the
    graph call that follows it.
    """

    def __init__(self, name, label, artifact_from, graph=None, handoff=False, driver=False):
        self.name, self.label, self.artifact_from = name, label, artifact_from
        self.graph, self.handoff, self.driver = graph, handoff, driver

    def load(self, wl, model, inputs, art):
        import torch

        f = self._load(art)
        # The runnable's introspection hooks: the flat inputs a call passes to
        # its graph, and the graph alone on them.
        raw, flat = f.run_graph, f.graph_inputs(model, *inputs)
        with torch.no_grad():
            cached = raw(flat)

        def noop(inputs_list):
            inputs_list.clear()
            return cached

        driver_alone = f.with_graph(noop)  # the same checks around a graph that costs nothing
        graph = {"raw": raw, "noop": lambda xs: noop(list(xs)), None: None}[self.graph]
        params = [flat[i] for i in f.convention.grad_state] if self.handoff else []
        first_grad = -len(params) if params else None
        driver = self.driver

        def call():
            if driver:
                result = driver_alone(model, *inputs)
                if graph is None:
                    return result
            outputs = graph(flat)
            if first_grad is not None:
                for p, g in zip(params, outputs[first_grad:]):
                    if p.grad is None:
                        p.grad = g
                    else:
                        p.grad.add_(g)
            return outputs

        # The driver switches grad mode itself; bare graphs run under no_grad.
        return Runtime(call, list(model.parameters()), wl.context if driver else torch.no_grad)


def _probes() -> list:
    probes = []
    for prefix, label in (("precompile", "inductor"), ("precompile_eager", "eager backend")):
        probes += [
            DriverProbe(f"{prefix}_raw", f"raw generated call ({label})", prefix, graph="raw"),
            DriverProbe(f"{prefix}_raw_handoff", f"raw call + grad hand-off ({label})", prefix, graph="raw", handoff=True),
            DriverProbe(f"{prefix}_noop_driver", f"driver around a no-op graph ({label})", prefix, driver=True),
            DriverProbe(f"{prefix}_noop_handoff", f"no-op graph + grad hand-off ({label})", prefix, graph="noop", handoff=True),
            DriverProbe(
                f"{prefix}_noop_driver_then_raw_handoff", f"no-op driver, then raw call + hand-off ({label})",
                prefix, graph="raw", handoff=True, driver=True,
            ),
        ]
    return probes


BASE_METHODS = {
    m.name: m
    for m in (
        Eager(),
        Compile(),
        Precompile(),
        PrecompileEager(),
        TorchPrecompile(),
        TorchPrecompileEager(),
        *_probes(),
    )
}


# ---------------------------------------------------------------------------
# Child tasks (run inside ``SCRIPT --child TASK_JSON``)
# ---------------------------------------------------------------------------


def _heavy_modules() -> list[str]:
    return sorted(m for m in HEAVY_MODULES if m in sys.modules)


def _reference(wl: Workload):
    """Eager result and parameter grads on a fresh copy of the workload."""
    import torch

    model, inputs = wl.build()
    with wl.context():
        out = wl.fn(model, *inputs)
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return out, grads, model, inputs


def _close(a, b) -> bool:
    import torch

    if isinstance(a, (list, tuple)):
        a = a[0]
    if isinstance(b, (list, tuple)):
        b = b[0]
    return isinstance(a, torch.Tensor) and torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-4)


def _grads_match(params, want, scale: float = 1.0) -> bool:
    import torch

    if len(params) != len(want):
        return False
    for p, g in zip(params, want):
        if (p.grad is None) != (g is None):
            return False
        if g is not None and not torch.allclose(p.grad, g * scale, rtol=1e-3, atol=1e-4):
            return False
    return True


def task_build(task: dict, methods: dict) -> dict:
    wl, method = WORKLOADS[task["workload"]], methods[task["method"]]
    art = Path(task["art"])
    art.mkdir(parents=True, exist_ok=True)
    model, inputs = wl.build()
    info = method.build(wl, model, inputs, art)
    info["artifact_bytes"] = method.artifact_bytes(art, info)
    return info


def task_start(task: dict, methods: dict, t_torch: float) -> dict:
    """Fresh process: from after `import torch` (and a model library, see child_main) to the first result."""
    import torch

    wl, method = WORKLOADS[task["workload"]], methods[task["method"]]
    if task.get("threads"):
        torch.set_num_threads(task["threads"])
    model, inputs = wl.build()
    t_setup = time.perf_counter()
    runtime = method.load(wl, model, inputs, Path(task["art"]))
    t_load = time.perf_counter()
    with runtime.context():
        out = runtime.call()
    t_first = time.perf_counter()
    heavy = _heavy_modules()
    ref_out, ref_grads, _, _ = _reference(wl)
    correct = _close(out, ref_out) and (not wl.train or _grads_match(runtime.params, ref_grads))
    return {
        "first_result_s": t_first - t_torch,
        "setup_s": t_setup - t_torch,
        "load_s": t_load - t_setup,
        "first_call_s": t_first - t_load,
        "heavy_modules": heavy,
        "correct": bool(correct),
    }


def _time_batches(steps: dict, contexts: dict, repeats: int, target_s: float) -> dict:
    """Interleaved batches: per repeat, every method once (rotating order).

    Not torch.utils.benchmark.Timer: it times one statement at a time, and
    methods measured one after the other would each see a different phase of
    the machine's drift; interleaving gives them the same.
    """
    names = list(steps)
    # Warm-up (TorchScript's profiling executor, lazy inits) and calibration.
    batch = {}
    for name in names:
        with contexts[name]():
            t0, n = time.perf_counter(), 0
            while n < 5 or time.perf_counter() - t0 < min(0.2, target_s * 5):
                steps[name]()
                n += 1
            per_call = (time.perf_counter() - t0) / n
        batch[name] = max(1, int(target_s / per_call))
    samples = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    try:
        for r in range(repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                step, k = steps[name], batch[name]
                gc.collect()
                gc.disable()
                with contexts[name]():
                    t0 = time.perf_counter()
                    for _ in range(k):
                        step()
                    dt = time.perf_counter() - t0
                gc.enable()
                samples[name].append(dt / k)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        name: {"median_s": statistics.median(v), "ci95_s": _notch(v), "samples_s": v, "batch": batch[name]}
        for name, v in samples.items()
    }


def _notch(values: list) -> float:
    """Half-width of the median's ~95% confidence notch: 1.58 IQR / sqrt(n)."""
    ordered = sorted(values)
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    return 1.58 * (q3 - q1) / len(ordered) ** 0.5


def _paired_overhead(a: Callable, b: Callable, context_a, context_b, pairs: int, block_s: float) -> dict:
    """Per-call time of ``a`` minus ``b``, from many short adjacent blocks.

    Subtracting two independently measured medians of ~500 us calls leaves
    +-10 us of machine noise; differences of adjacent ~2 ms blocks (order
    alternating) cancel the drift, and their median is the overhead.  This is
    why it is not torch.utils.benchmark.Timer (nor Timer.compare): Timer
    measures each statement on its own, so only two independent medians could
    be subtracted, which is what this pairing avoids.
    """
    with context_a():
        t0, n = time.perf_counter(), 0
        while n < 5 or time.perf_counter() - t0 < 0.05:
            a()
            n += 1
    k = max(1, int(block_s / ((time.perf_counter() - t0) / n)))

    def block(step, context) -> float:
        with context():
            t = time.perf_counter()
            for _ in range(k):
                step()
            return (time.perf_counter() - t) / k

    diffs, times_a, times_b = [], [], []
    gc.collect()
    gc.disable()
    try:
        for i in range(pairs):
            if i % 2:
                tb = block(b, context_b)
                ta = block(a, context_a)
            else:
                ta = block(a, context_a)
                tb = block(b, context_b)
            diffs.append(ta - tb)
            times_a.append(ta)
            times_b.append(tb)
    finally:
        gc.enable()
    times_a.sort()
    times_b.sort()
    p10 = len(times_a) // 10
    return {
        "median_s": statistics.median(diffs),
        "ci95_s": _notch(diffs),
        # The least-disturbed blocks: 10th percentile of each, differenced.
        "p10_diff_s": times_a[p10] - times_b[p10],
        "pairs": pairs,
        "block_calls": k,
    }


def task_steady(task: dict, methods: dict) -> dict:
    """One process, single thread: every method interleaved on one workload."""
    import torch

    torch.set_num_threads(1)
    wl = WORKLOADS[task["workload"]]
    arts = task["arts"]
    model, inputs = wl.build()
    ref_out, ref_grads, _, _ = _reference(wl)
    steps, contexts, info, runtimes = {}, {}, {}, {}
    for name in task["methods"]:
        method = methods[name]
        entry = info[name] = {}
        try:
            t0 = time.perf_counter()
            runtime = method.load(wl, model, inputs, Path(arts[method.artifact_dir_name]))
            step = _make_step(runtime, wl)  # zeroes grads first: the model is shared by all methods
            with runtime.context():
                out = step()
            entry["load_and_first_call_s"] = time.perf_counter() - t0
        except Exception as error:  # report, keep measuring the others
            entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            continue
        if "_raw" not in name:
            entry["correct"] = bool(_close(out, ref_out))
        runtimes[name] = runtime
        contexts[name] = runtime.context
        steps[name] = step
    timings = _time_batches(steps, contexts, task["repeats"], task["target_s"])
    for name, timing in timings.items():
        info[name].update(timing)
    pairs = {}
    for a, b in task.get("pairs", []):
        if a in steps and b in steps:
            pairs[f"{a}-{b}"] = _paired_overhead(steps[a], steps[b], contexts[a], contexts[b], task.get("pair_count", 200), 0.002)
    if wl.train:
        for name, runtime in runtimes.items():
            if "_raw" not in name:
                info[name]["grads_accumulate"] = _check_accumulation(runtime, ref_grads)
    return {"methods": info, "pairs": pairs, "threads": torch.get_num_threads()}


def _make_step(runtime: Runtime, wl: Workload) -> Callable[[], Any]:
    if not (wl.train and wl.zero_grads):
        return runtime.call
    params, call = runtime.params, runtime.call

    def step():
        for p in params:
            p.grad = None
        return call()

    return step


def _check_accumulation(runtime: Runtime, ref_grads: list) -> str:
    """Two calls without zeroing must leave 2x the single-step grads (like eager)."""
    for p in runtime.params:
        p.grad = None
    try:
        with runtime.context():
            runtime.call()
            runtime.call()
    except Exception as error:
        return f"no ({type(error).__name__} on the 2nd call: {str(error).splitlines()[0][:90]})"
    return "yes" if _grads_match(runtime.params, ref_grads, 2.0) else "no (grads differ from eager)"


BASE_TASKS = {
    "build": lambda task, methods, t: task_build(task, methods),
    "start": task_start,
    "steady": lambda task, methods, t: task_steady(task, methods),
}


def child_main(methods: dict, tasks: dict | None = None) -> None:
    """Entry of ``SCRIPT --child TASK_JSON``; prints one RESULT_MARK line."""
    task = json.loads(sys.argv[sys.argv.index("--child") + 1])
    t0 = time.perf_counter()
    import torch  # noqa: F401  (the clock of every start measurement begins after this)

    # A model library is loaded before the clock too, as torch is: building one
    # throwaway model imports what the library pulls in (for transformers ~6 s,
    # torch._dynamo and torch._inductor included), the same for every method,
    # and a process that runs such a model has paid it already.
    workload = WORKLOADS.get(task.get("workload"))
    if workload is not None and workload.needs:
        workload.make_model()
    t_torch = time.perf_counter()
    handlers = dict(BASE_TASKS, **(tasks or {}))
    try:
        result = handlers[task["task"]](task, methods, t_torch)
        result["ok"] = True
    except Exception as error:
        import traceback

        result = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:600]}", "traceback": traceback.format_exc()[-3000:]}
    result["import_torch_s"] = t_torch - t0
    sys.stdout.flush()
    print(RESULT_MARK + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------
# Parent side: fresh-process runner
# ---------------------------------------------------------------------------


class Runner:
    """Runs child tasks of one script in fresh processes, sequentially."""

    def __init__(self, script: str, workdir: Path, verbose: bool = True):
        self.script = str(Path(script).resolve())
        self.workdir = workdir
        self.verbose = verbose
        self.started = time.perf_counter()
        self._dirs = 0

    def fresh_dir(self, tag: str) -> Path:
        self._dirs += 1
        path = self.workdir / f"{tag}-{self._dirs:03d}"
        path.mkdir(parents=True)
        return path

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def no_compiler_env(self) -> tuple[dict, Path]:
        """Environment in which every C++ compiler fails, and the log its calls go to.

        A directory of stub ``gcc g++ cc c++ clang clang++`` that append their
        command line to the log and exit 1 goes first on PATH (CC/CXX name them
        by bare name, so Inductor finds the stubs), as in the test suite's
        TestInductorCache.
        """
        stubs = self.workdir / "compiler-stubs"
        if not stubs.exists():
            stubs.mkdir(parents=True)
            for name in ("gcc", "g++", "cc", "c++", "clang", "clang++"):
                stub = stubs / name
                stub.write_text('#!/bin/sh\necho "$0 $@" >> "$PRECOMPILE_BENCH_COMPILER_LOG"\nexit 1\n')
                stub.chmod(0o755)
        log = self.fresh_dir("compiler-log") / "calls.log"
        env = {
            "PATH": str(stubs) + os.pathsep + os.environ.get("PATH", ""),
            "CC": "gcc",
            "CXX": "g++",
            "PRECOMPILE_BENCH_COMPILER_LOG": str(log),
        }
        return env, log

    def run(
        self, task: dict, cache_dir: Path, timeout: float = 1200, python_flags: tuple = (), keep_stderr: bool = False,
        no_compiler: bool = False,
    ) -> dict:
        """Run one child task; ``no_compiler``: with failing stub compilers (``result["compiler_calls"]``)."""
        env = dict(os.environ)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        compiler_log = None
        if no_compiler:
            stub_env, compiler_log = self.no_compiler_env()
            env.update(stub_env)
        env.pop("TORCH_LOGS", None)
        # Import modules from cached bytecode, like any normal install: this
        # sandbox sets PYTHONDONTWRITEBYTECODE=1, which would make every fresh
        # process compile torch/_precompile*.py from source (~15 ms) inside the
        # timed load().  (Python writes the usual, git-ignored __pycache__.)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONWARNINGS"] = "ignore"
        cmd = [sys.executable, *python_flags, self.script, "--child", json.dumps(task)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(BENCH_DIR))
        except subprocess.TimeoutExpired:
            result = {"ok": False, "error": f"timed out after {timeout:.0f} s"}
        else:
            lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_MARK)]
            if lines:
                result = json.loads(lines[-1][len(RESULT_MARK) :])
            else:
                tail = (proc.stderr or proc.stdout)[-1500:]
                result = {"ok": False, "error": f"child exited {proc.returncode} without a result: {tail}"}
            if keep_stderr:
                result["stderr"] = proc.stderr
        if compiler_log is not None:
            calls = compiler_log.read_text().splitlines() if compiler_log.exists() else []
            result["compiler_calls"] = len(calls)
            result["compiler_first_call"] = calls[0][:200] if calls else None
        wall = time.perf_counter() - t0
        if self.verbose:
            what = " ".join(f"{k}={v}" for k, v in task.items() if k in ("task", "workload", "method", "mode", "size"))
            status = "ok" if result.get("ok") else "FAILED: " + result.get("error", "")[:300]
            print(f"  [{self.elapsed():7.1f}s] {what} ({wall:.1f}s) {status}", file=sys.stderr, flush=True)
        return result


def merge_dirs(dst: Path, sources: list) -> Path:
    """Copy several inductor cache dirs into one (content-addressed entries)."""
    dst.mkdir(parents=True, exist_ok=True)
    for src in sources:
        if src and Path(src).exists():
            shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True)
    return dst


def dir_bytes(path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


# ---------------------------------------------------------------------------
# Statistics and formatting
# ---------------------------------------------------------------------------


def timed(fn) -> float:
    """Seconds ``fn()`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def seconds_per_step(fn, model, inputs, count: int) -> float:
    """Seconds per ``fn(model, *inputs)`` over ``count`` steps, ``.grad`` set to None before each."""
    start = time.perf_counter()
    for _ in range(count):
        for p in model.parameters():
            p.grad = None
        fn(model, *inputs)
    return (time.perf_counter() - start) / count


def interleaved_step_times(runnables: dict, models: dict, inputs, repeats: int, steps: int, barrier) -> dict:
    """method -> ``repeats`` samples of seconds per step (``seconds_per_step`` over ``steps``),
    after 2 warm-up steps each; the methods take turns, ``barrier()`` before each block."""
    for method in runnables:  # warm-up
        seconds_per_step(runnables[method], models[method], inputs, 2)
    samples = {method: [] for method in runnables}
    for _ in range(repeats):
        for method in runnables:
            barrier()
            samples[method].append(seconds_per_step(runnables[method], models[method], inputs, steps))
    return samples


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt_time(seconds: float | None) -> str:
    """Seconds with a unit that keeps 3 significant digits."""
    if seconds is None:
        return "n/a"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f} us"


def fmt_steady(info: dict | None) -> str:
    """A steady-state median with its ~95% notch, e.g. '232.9 us +-2.1'."""
    if not info or info.get("median_s") is None:
        return "error" if info and "error" in info else "n/a"
    ci = info.get("ci95_s")
    return fmt_us(info["median_s"]) + ("" if ci is None else f" +-{ci * 1e6:.1f}")


def fmt_ratio(a: float | None, b: float | None) -> str:
    """a / b as 'N.NNx' (how many times a is b)."""
    if a is None or b is None or b == 0:
        return "n/a"
    r = a / b
    if r >= 100:
        return f"{r:.0f}x"
    if r >= 10:
        return f"{r:.1f}x"
    return f"{r:.2f}x"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def markdown_table(headers: list, rows: list) -> str:
    out = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |")
    return "\n".join(out)


def machine() -> dict:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(Exception):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        found = re.search(r"Model name:\s*(.+)", out)
        if found:
            model = found.group(1).strip()
    try:
        import torch

        version = torch.__version__
    except Exception:  # pragma: no cover
        version = "?"
    return {
        "cpu": model,
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "torch": version,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def implementation_state() -> str:
    """Which precompile was measured: git HEAD plus a hash of the implementation files."""
    import hashlib

    root = BENCH_DIR.parent
    head = "?"
    with contextlib.suppress(Exception):
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    digest = hashlib.sha256()
    files = sorted((root / "torch").glob("_precompile*.py"))
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    dirty = ""
    with contextlib.suppress(Exception):
        status = subprocess.run(["git", "status", "--porcelain", "--", "torch"], cwd=root, capture_output=True, text=True, timeout=10).stdout
        dirty = " (working tree differs from HEAD)" if status.strip() else ""
    return f"git {head}{dirty}; sha256 of torch/_precompile*.py: {digest.hexdigest()[:12]}"


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "n/a"


def report_header(title: str, argv: list, mach: dict, load_before: str, load_after: str, elapsed: float) -> str:
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(argv[0], BENCH_DIR.parent)] + argv[1:])
    return (
        f"# {title}\n\n"
        f"- command: `{command}`\n"
        f"- machine: {mach['cpu']}, nproc {mach['nproc']}; Python {mach['python']}, torch {mach['torch']}\n"
        f"- date: {mach['date']}; run took {elapsed / 60:.1f} min\n"
        f"- implementation: {implementation_state()}\n"
        f"- load average (1/5/15 min) before: {load_before}; after: {load_after}\n"
        "- children import from cached bytecode (PYTHONDONTWRITEBYTECODE unset), as a normal install does\n"
    )


def rerender(args, name: str, plan_factory: Callable, render: Callable) -> None:
    """``--from-json``: rebuild the Plan from a run's JSON and render it again."""
    dump = json.loads(Path(args.from_json).read_text())
    plan, *extra = plan_factory(dump)
    plan.restore(dump)
    header = dump.get("_header")
    if header is None:  # runs from before the header was stored: take it from the markdown
        md = Path(args.from_json).with_suffix(".md")
        header = md.read_text().split("\n## ", 1)[0].rstrip("\n") + "\n\n" if md.exists() else ""
    text = header + render(plan, *extra)
    print(text)
    path = write_report(name, text, dict(dump, _header=header))
    print(f"re-rendered {path} from {args.from_json}", file=sys.stderr)


def write_report(name: str, text: str, raw: dict | None = None) -> Path:
    """results/NAME (markdown) and, with ``raw``, results/NAME.json beside it."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / name
    path.write_text(text)
    if raw is not None:
        path.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    return path


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smoke run: minimal repeats (CI)")
    parser.add_argument("--repeats", type=int, default=None, help="fresh-process repeats per start measurement")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir, removed after)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return parser


@contextlib.contextmanager
def scratch(args) -> Any:
    if args.workdir:
        path = Path(args.workdir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="precompile-bench-"))
    try:
        yield path
    finally:
        if args.keep:
            print(f"scratch kept at {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------
# Measurement plans shared by precompile_bench.py and compare.py
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    """Everything measured for one (workload, method)."""

    builds: list = dataclasses.field(default_factory=list)  # build task results
    art: Path | None = None
    own_dir: Path | None = None  # warm inductor cache dir of this method
    # mode ("empty" / "own", suffixed "@N" when run with N threads) -> results
    starts: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    steady: dict | None = None
    skipped: str | None = None

    def ok_builds(self) -> list:
        return [b for b in self.builds if b.get("ok")]

    def build_s(self) -> float | None:
        return median(b["build_s"] for b in self.ok_builds())

    def start_s(self, mode: str) -> float | None:
        return median(s["first_result_s"] for s in self.starts[mode] if s.get("ok"))

    def start_field(self, mode: str, field: str) -> float | None:
        return median(s[field] for s in self.starts[mode] if s.get("ok"))

    def error(self) -> str | None:
        """The first failure, not counting starts without a compiler (those may fail by design)."""
        starts = [r for mode, results in self.starts.items() if not mode.endswith(NO_COMPILER) for r in results]
        for result in self.builds + starts:
            if not result.get("ok"):
                return result.get("error")
        if self.steady and "error" in self.steady:
            return self.steady["error"]
        return None


def _missing_package(wl: Workload) -> str | None:
    import importlib.util

    if wl.needs and importlib.util.find_spec(wl.needs) is None:
        return f"{wl.needs} is not installed"
    return None


class Plan:
    """Builds, starts and steady-state runs for a grid of workloads x methods."""

    def __init__(self, runner: Runner, methods: dict, workloads: list, method_names: list):
        self.runner, self.methods = runner, methods
        self.workloads, self.method_names = workloads, method_names
        self.cells = {(w, m): Cell() for w in workloads for m in method_names}
        self.pairs: dict = {}  # workload -> {"a-b": paired overhead of a over b}
        for (w, m), cell in self.cells.items():
            reason = _missing_package(WORKLOADS[w]) or methods[m].unsupported(WORKLOADS[w])
            if reason:
                cell.skipped = reason

    def cell(self, w: str, m: str) -> Cell:
        return self.cells[(w, m)]

    def art_dir(self, w: str, m: str) -> Path:
        w = WORKLOADS[w].artifacts_of or w
        owner = self.methods[m].artifact_dir_name
        cell = self.cell(w, owner)
        if cell.art is None:
            cell.art = self.runner.workdir / "artifacts" / w / owner
        return cell.art

    def build(self, w: str, m: str, repeats: int = 1) -> None:
        """Build in fresh processes with fresh empty cache dirs; the last one stays as the artifact."""
        cell, method = self.cell(w, m), self.methods[m]
        if cell.skipped or method.artifact_from:
            return
        for _ in range(repeats):
            cache = self.runner.fresh_dir(f"build-{w}-{m}")
            result = self.runner.run(
                {"task": "build", "workload": w, "method": m, "art": str(self.art_dir(w, m))}, cache
            )
            cell.builds.append(result)
            if result.get("ok"):
                cell.own_dir = cache  # the build leaves a warm cache behind
            else:
                break

    def start(self, w: str, m: str, mode: str, repeats: int = 1, threads: int | None = None, no_compiler: bool = False) -> None:
        """Fresh-process starts; results land in ``cell.starts[mode]`` (``mode@threads``).

        ``no_compiler``: every C++ compiler on PATH fails and records its calls
        (``Runner.no_compiler_env``); results land in ``cell.starts[mode + NO_COMPILER]``.
        """
        cell, method = self.cell(w, m), self.methods[m]
        owner = self.cell(w, method.artifact_dir_name)
        if cell.skipped or owner.skipped or (owner.builds and not owner.ok_builds()):
            return
        for _ in range(repeats):
            if mode == "empty":
                cache = self.runner.fresh_dir(f"start-{w}-{m}")
            else:
                if cell.own_dir is None:
                    cell.own_dir = self.runner.fresh_dir(f"own-{w}-{m}")
                cache = cell.own_dir
            task = {"task": "start", "workload": w, "method": m, "art": str(self.art_dir(w, m)), "mode": mode}
            if threads:
                task["threads"] = threads
            result = self.runner.run(task, cache, no_compiler=no_compiler)
            key = (f"{mode}@{threads}" if threads else mode) + (NO_COMPILER if no_compiler else "")
            cell.starts[key].append(result)
            if mode == "empty" and result.get("ok") and not no_compiler:
                cell.own_dir = cache  # an empty dir that one run warmed becomes the method's own cache

    def steady(self, w: str, methods: list, repeats: int, target_s: float, pairs: tuple = (), pair_count: int = 200) -> None:
        usable = []
        base = WORKLOADS[w].artifacts_of or w
        for m in methods:
            cell, method = self.cell(w, m), self.methods[m]
            owner = self.cell(base, method.artifact_dir_name)
            if not cell.skipped and not owner.skipped and (not owner.builds or owner.ok_builds()):
                usable.append(m)
        warm = [self.cell(base, m).own_dir for m in self.method_names]
        cache = merge_dirs(self.runner.fresh_dir(f"steady-{w}"), warm)
        arts = {self.methods[m].artifact_dir_name: str(self.art_dir(w, m)) for m in usable}
        for m in usable:  # a method may run steady state on a variant build (see Method.steady_artifact)
            variant = self.methods[m].steady_artifact
            if variant:
                arts[self.methods[m].artifact_dir_name] = str(self.art_dir(w, variant))
        task = {"task": "steady", "workload": w, "methods": usable, "arts": arts, "repeats": repeats, "target_s": target_s}
        if pairs:
            task.update(pairs=[list(p) for p in pairs], pair_count=pair_count)
        result = self.runner.run(task, cache)
        self.pairs[w] = result.get("pairs", {}) if result.get("ok") else {}
        for m in usable:
            self.cell(w, m).steady = (
                result["methods"].get(m, {"error": "not measured"}) if result.get("ok") else {"error": result.get("error")}
            )

    def restore(self, dump: dict) -> None:
        """Inverse of dump(): re-render a finished run without measuring again."""
        self.pairs = dump.get("pairs", {})
        for key, data in dump.items():
            if key == "pairs" or "/" not in key:
                continue
            w, m = key.split("/", 1)
            if (w, m) in self.cells:
                cell = self.cells[(w, m)]
                cell.skipped, cell.builds, cell.steady = data["skipped"], data["builds"], data["steady"]
                cell.starts.update(data["starts"])

    def dump(self) -> dict:
        """Every raw result, for results/*.json."""
        return {"pairs": self.pairs} | {
            f"{w}/{m}": {
                "skipped": c.skipped,
                "builds": c.builds,
                "starts": dict(c.starts),
                "steady": c.steady,
            }
            for (w, m), c in self.cells.items()
        }

    def steady_s(self, w: str, m: str) -> float | None:
        s = self.cell(w, m).steady
        return None if not s else s.get("median_s")
