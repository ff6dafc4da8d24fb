"""Fully sharded (FSDP2) training step on 2 ranks: a fully_shard-ed model, gloo on loopback.

Per workload (the MLP 3x256 and HF GPT-2 4x256 training steps of
``_common.WORKLOADS``: forward, MSE loss, backward, grads set to None before
each step), every rank runs, on its own fully_shard-ed copy of the same model
(``fully_shard`` on each Linear / each GPT-2 block, then on the root; GPT-2's
tied ``lm_head`` / ``wte`` sit in the root's group; 1-D mesh over the default
gloo group):

  eager FSDP2          train_step(model, x, y) as written (fully_shard's hooks
                       all-gather and reduce-scatter)
  torch.compile FSDP2  torch.compile(train_step)(model, x, y)
  precompile FSDP2     precompile(train_step, model, x, y, backend="inductor") on
                       rank 0 alone, broadcast, loaded on every rank (all-gather
                       and reduce-scatter in the graph; .grad written as DTensors)

Step time: single-threaded ranks, methods interleaved, median over repeats of
the per-step time of a block of steps (the ranks synchronize in every step's
collectives).  The last step's local gradient shards (``p.grad.to_local()``)
are compared with eager FSDP2's on every rank (``torch.testing.assert_close``).

Warm start per rank, each in fresh 2-rank jobs (one workload per job), timed
from a barrier after ``import torch``, process group, model and fully_shard:
  precompile     ``load()`` + first call of the FSDP2 artifact the step-time
                 job wrote to a file, with an empty TORCHINDUCTOR_CACHE_DIR;
  torch.compile  ``torch.compile(train_step)`` + its first call (compile +
                 run), with TORCHINDUCTOR_CACHE_DIR at a cache that a previous
                 identical job populated (that populating job's own cold first
                 call is reported too).
Median of ``--starts`` jobs per method, the two methods' jobs interleaved.

``--parallel tp`` runs the same with tensor parallel instead of fully_shard:
``parallelize_module`` splits the MLP's first Linear column-wise and its second
row-wise (the last stays whole; GPT-2's Conv1D layers have no ParallelStyle), the
methods then being eager, torch.compile-d and precompiled tensor parallel.

Usage: python benchmarks/fsdp2_bench.py [--workloads mlp_train,gpt2_train] [--repeats 7] [--steps 10] [--starts 3] [--parallel fsdp2|tp]
Goals: step time <= eager FSDP2's and <= torch.compile FSDP2's; warm start per
rank >= 50x faster than torch.compile's warm-cache start.  Writes
results/fsdp2_bench.md (and .json), or results/tp_bench.md with --parallel tp.
"""

import argparse
import datetime
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402  (imports no torch)


METHODS = ("eager", "compile", "precompile")
TITLES = {"eager": "eager {}", "compile": "torch.compile {}", "precompile": "precompile {}"}  # .format(FORMS[parallel])
FORMS = {"fsdp2": "FSDP2", "tp": "tensor parallel"}
WORLD_SIZE = 2
START_GOAL = 50.0  # torch.compile's warm-cache start / precompile's warm start


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _sharded(workload, model, parallel: str):
    """fully_shard each Linear (MLP) / transformer block (GPT-2), then the root, or (``parallel``
    "tp") tensor parallel's column-wise and row-wise split of the MLP; returns (model, layout)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    if parallel == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module, RowwiseParallel

        if workload.name.startswith("gpt2"):
            raise ValueError("tensor parallel: GPT-2's Conv1D layers have no ParallelStyle; use --workloads mlp_train")
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        return parallelize_module(model, mesh, plan), "parallelize_module: Linear 0 column-wise, Linear 1 row-wise, Linear 2 whole"
    if workload.name.startswith("gpt2"):
        blocks = list(model.model.transformer.h)
        layout = f"fully_shard on each of the {len(blocks)} GPT2Blocks, then the root (wte = lm_head, wpe, ln_f)"
    else:
        blocks = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        layout = f"fully_shard on each of the {len(blocks)} Linears, then the root"
    for block in blocks:
        fully_shard(block)
    return fully_shard(model), layout


def _odd_dim0(model) -> list:
    """Parameters whose dim 0 does not divide by the world size (fully_shard would shard them unevenly)."""
    return [f"{n} {tuple(p.shape)}" for n, p in model.named_parameters() if p.dim() == 0 or p.shape[0] % WORLD_SIZE]


def _compare_grads(reference, model) -> dict:
    """The local gradient shards of ``model`` against ``reference``'s (assert_close, default tolerances)."""
    import torch
    from torch.distributed.tensor import DTensor

    out = {"match": True, "dtensor_grads": True, "max_abs_diff": 0.0, "error": None}
    for (name, a), b in zip(reference.named_parameters(), model.parameters()):
        if a.grad is None or b.grad is None:
            if (a.grad is None) != (b.grad is None):
                out.update(match=False, error=out["error"] or f"{name}: grad is None on one side only")
            continue
        out["dtensor_grads"] &= isinstance(b.grad, DTensor)
        want = a.grad.to_local() if isinstance(a.grad, DTensor) else a.grad
        got = b.grad.to_local() if isinstance(b.grad, DTensor) else b.grad
        if got.shape == want.shape:
            out["max_abs_diff"] = max(out["max_abs_diff"], (got - want).abs().max().item())
        try:
            torch.testing.assert_close(got, want)
        except AssertionError as error:
            out["match"] = False
            out["error"] = out["error"] or f"{name}: {str(error)[:500]}"
    return out


def child(args) -> None:
    """One rank of the step-time job: build the artifact (rank 0), load, time all methods."""
    import torch
    import torch.distributed as dist
    import torch_precompile

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    rank = dist.get_rank()
    results = {}
    for name in args.workloads.split(","):
        workload = _common.WORKLOADS[name]
        result = results[name] = {"errors": {}}
        models = {}
        for method in METHODS:  # same seed: the same weights and data on every rank and method
            model, inputs = workload.build()
            result["odd_dim0"] = _odd_dim0(model)
            models[method], result["layout"] = _sharded(workload, model, args.parallel)
        # Rank 0 builds the artifact alone (no collective at capture); every rank loads it.
        shipped = [None]
        if rank == 0:
            start = time.perf_counter()
            try:
                shipped[0] = ("ok", torch_precompile.precompile(_common.train_step, models["precompile"], *inputs, backend="inductor"))
                result["precompile_build_s"] = time.perf_counter() - start
                with open(os.path.join(args.child, f"{name}.pair"), "wb") as f:
                    pickle.dump(shipped[0][1], f)
            except Exception as error:
                shipped[0] = ("error", _error(error), traceback.format_exc()[-4000:])
        dist.broadcast_object_list(shipped, src=0)
        runnables = {"eager": _common.train_step}
        if shipped[0][0] == "ok":
            try:
                runnables["precompile"] = torch_precompile.load(*shipped[0][1])
            except Exception as error:
                result["errors"]["precompile"] = "load() failed: " + _error(error)
        else:
            result["errors"]["precompile"] = "precompile() failed on rank 0: " + shipped[0][1]
            result["precompile_traceback"] = shipped[0][2]
        # A rank whose load failed would leave the other waiting in the first call's all-gather.
        loaded = [None] * WORLD_SIZE
        dist.all_gather_object(loaded, "precompile" in runnables)
        if not all(loaded):
            runnables.pop("precompile", None)
            result["errors"].setdefault("precompile", "load() failed on another rank")
        if "precompile" in runnables:
            try:
                result["precompile_first_call_s"] = _common.timed(lambda: runnables["precompile"](models["precompile"], *inputs))
            except Exception as error:
                result["errors"]["precompile"] = "first call failed: " + _error(error)
                result["precompile_traceback"] = traceback.format_exc()[-4000:]
                runnables.pop("precompile")
        try:
            runnables["compile"] = torch.compile(_common.train_step)
            result["compile_first_call_s"] = _common.timed(lambda: runnables["compile"](models["compile"], *inputs))
        except Exception as error:
            result["errors"]["compile"] = "torch.compile's first call failed: " + _error(error)
            runnables.pop("compile", None)
        methods = [m for m in METHODS if m in runnables]
        ordered = {method: runnables[method] for method in methods}
        samples = _common.interleaved_step_times(ordered, models, inputs, args.repeats, args.steps, dist.barrier)
        result["step_s"] = {method: _common.median(values) for method, values in samples.items()}
        result["step_samples_s"] = samples
        # Same start, same data, grads set to None before every step: the last step's grads are every step's.
        result["grads"] = {m: _compare_grads(models["eager"], models[m]) for m in methods if m != "eager"}
        dist.barrier()
    with open(os.path.join(args.child, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def start_child(args) -> None:
    """One rank of a warm-start job: one method's first step, from a barrier after the setup."""
    import torch  # noqa: F401  (the setup below is the same for both methods)
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    workload = _common.WORKLOADS[args.workloads]
    model, inputs = workload.build()
    model, _ = _sharded(workload, model, args.parallel)
    result = {"heavy_modules_before": _common._heavy_modules()}
    if args.warm_start == "precompile":
        import torch_precompile

        with open(args.pair, "rb") as f:
            pair = pickle.load(f)
        dist.barrier()
        start = time.perf_counter()
        runnable = torch_precompile.load(*pair)
        loaded = time.perf_counter()
        runnable(model, *inputs)
        result.update(load_s=loaded - start, first_call_s=time.perf_counter() - loaded)
    else:
        dist.barrier()
        start = time.perf_counter()
        compiled = torch.compile(_common.train_step)
        compiled(model, *inputs)
        result["first_call_s"] = time.perf_counter() - start
    result["total_s"] = result.get("load_s", 0.0) + result["first_call_s"]
    result["heavy_modules_after"] = _common._heavy_modules()
    with open(os.path.join(args.child, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(out: str, cache_dir: str, extra: list, timeout: float) -> list:
    """A 2-rank torch.distributed.run job of this script; each rank's JSON, or raises with the output."""
    os.makedirs(out, exist_ok=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD_SIZE),
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), os.path.abspath(__file__),
        "--child", out, *extra,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONWARNINGS="ignore")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # children import from cached bytecode, as _common.Runner's do
    env.pop("TORCH_LOGS", None)
    start = time.perf_counter()
    job = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"  job {' '.join(extra[:4])}: {time.perf_counter() - start:.1f} s, exit {job.returncode}", file=sys.stderr, flush=True)
    if job.returncode != 0:
        raise RuntimeError(f"job failed (exit {job.returncode}): {job.stdout[-3000:]}\n{job.stderr[-6000:]}")
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(WORLD_SIZE)]


def warm_starts(scratch: str, name: str, pair_file: str, count: int, parallel: str) -> dict:
    """Fresh 2-rank jobs: precompile's start (empty cache) and torch.compile's warm-cache start, interleaved."""
    compile_cache = os.path.join(scratch, f"compile-cache-{name}")
    starts = {"precompile": [], "compile": [], "compile_populate": [], "errors": {}}

    def job(kind: str, tag: str, cache: str) -> list | None:
        extra = ["--warm-start", kind, "--workloads", name, "--pair", pair_file, "--parallel", parallel]
        try:
            return run_job(os.path.join(scratch, f"start-{name}-{tag}"), cache, extra, timeout=600)
        except Exception as error:
            starts["errors"].setdefault(kind, str(error)[-3000:])
            return None

    populated = job("compile", "populate", compile_cache)  # the "previous identical job"
    if populated:
        starts["compile_populate"].append(populated)
    for i in range(count):
        if os.path.exists(pair_file):
            ranks = job("precompile", f"precompile-{i}", os.path.join(scratch, f"empty-cache-{name}-{i}"))
            if ranks:
                starts["precompile"].append(ranks)
        if populated:
            ranks = job("compile", f"compile-{i}", compile_cache)
            if ranks:
                starts["compile"].append(ranks)
    return starts


def _per_rank(runs: list, key: str) -> list:
    """Median over jobs of ``key``, per rank (None where no job succeeded)."""
    return [_common.median(run[r][key] for run in runs) if runs else None for r in range(WORLD_SIZE)]


def _met(flag) -> str:
    return "n/a" if flag is None else ("met" if flag else "NOT met")


def render(ranks: list, starts: dict, workloads: list, failed: str | None, parallel: str) -> str:
    form = FORMS[parallel]
    titles = {method: title.format(form) for method, title in TITLES.items()}
    out = []
    if failed:
        out.append(f"## The step-time job failed\n\n```\n{failed}\n```\n")
    for name in workloads:
        workload = _common.WORKLOADS[name]
        per_rank = [r.get(name, {}) for r in ranks]
        out.append(f"## {workload.label}, 2 ranks, {form}\n")
        first = per_rank[0] if per_rank else {}
        if first.get("layout"):
            odd = first.get("odd_dim0") or []
            out.append(
                f"Sharding: {first['layout']}.  Parameters whose dim 0 is odd: "
                + (", ".join(odd) if odd else f"none (every dim 0 divides by {WORLD_SIZE})") + ".\n"
            )
        errors = {}
        for x in per_rank:
            for method, message in x.get("errors", {}).items():
                errors.setdefault(method, message)
        rows = []
        for method in METHODS:
            times = [x.get("step_s", {}).get(method) for x in per_rank]
            speedups = [_common.fmt_ratio(x.get("step_s", {}).get("eager"), x.get("step_s", {}).get(method)) for x in per_rank]
            goal = ""
            if method == "precompile":
                flags = []
                for x in per_rank:
                    s = x.get("step_s", {})
                    flags.append(None if s.get("precompile") is None or s.get("eager") is None else
                                 s["precompile"] <= s["eager"] and (s.get("compile") is None or s["precompile"] <= s["compile"]))
                goal = f"<= {titles['eager']} and <= {titles['compile']}: " + " / ".join(_met(f) for f in flags)
            rows.append([titles[method], *(_common.fmt_time(t) if t is not None else "error" if method in errors else "n/a" for t in times),
                         " / ".join(speedups), goal])
        out.append(_common.markdown_table(
            ["method", *(f"step, rank {r}" for r in range(WORLD_SIZE)), f"speed-up vs {titles['eager']} (rank 0 / rank 1)", "goal (rank 0 / rank 1)"],
            rows,
        ))
        for method, message in errors.items():
            out.append(f"\n**{titles[method]} failed:**\n\n```\n{message[:3000]}\n```")
        tb = first.get("precompile_traceback")
        if tb:
            out.append(f"\nTraceback (rank 0):\n\n```\n{tb}\n```")
        # Warm starts.
        st = starts.get(name, {})
        pre, comp, pop = st.get("precompile", []), st.get("compile", []), st.get("compile_populate", [])
        pre_load, pre_call, pre_total = _per_rank(pre, "load_s"), _per_rank(pre, "first_call_s"), _per_rank(pre, "total_s")
        comp_total, pop_total = _per_rank(comp, "total_s"), _per_rank(pop, "total_s")
        start_rows = []
        for r in range(WORLD_SIZE):
            ratio = None if pre_total[r] is None or comp_total[r] is None else comp_total[r] / pre_total[r]
            start_rows.append([
                f"rank {r}", _common.fmt_time(pre_load[r]), _common.fmt_time(pre_call[r]), _common.fmt_time(pre_total[r]),
                _common.fmt_time(comp_total[r]), _common.fmt_ratio(comp_total[r], pre_total[r]),
                f">= {START_GOAL:.0f}x: {_met(None if ratio is None else ratio >= START_GOAL)}",
            ])
        out.append(
            f"\nWarm start per rank, fresh 2-rank jobs (median of {len(pre)} precompile / {len(comp)} torch.compile jobs), "
            "from a barrier after `import torch`, init_process_group, model and its sharding (each column is its own "
            "median over the jobs, so `total` need not be `load()` + `first call`):\n"
        )
        out.append(_common.markdown_table(
            ["", "precompile: load()", "first call", "total", "torch.compile warm cache: compile + first call",
             "torch.compile warm / precompile warm", "goal"],
            start_rows,
        ))
        for kind, message in st.get("errors", {}).items():
            out.append(f"\n**warm-start job ({kind}) failed:**\n\n```\n{message}\n```")
        grads = [x.get("grads", {}) for x in per_rank]
        grad_text = "; ".join(
            f"{titles[m]} {all(g.get(m, {}).get('match', False) for g in grads)}"
            f" (max abs diff {max((g.get(m, {}).get('max_abs_diff') or 0.0) for g in grads):.1e})"
            for m in ("precompile", "compile") if all(m in g for g in grads)
        ) or "n/a"
        dtensor = all(g.get("precompile", {}).get("dtensor_grads", False) for g in grads) if all("precompile" in g for g in grads) else None
        mismatches = [f"rank {r} {titles[m]}: {c['error']}" for r, g in enumerate(grads) for m, c in g.items() if c.get("error")]
        out.append(
            f"\nBuild on rank 0: precompile {_common.fmt_time(first.get('precompile_build_s'))}; torch.compile's first call "
            f"in the step-time job {' / '.join(_common.fmt_time(x.get('compile_first_call_s')) for x in per_rank)} (rank 0 / rank 1); "
            f"torch.compile's first call in the job that populated its cache (cold) "
            f"{' / '.join(_common.fmt_time(t) for t in pop_total)}.  "
            f"Last step's local grad shards (`p.grad.to_local()`) equal {titles['eager']}'s on every rank "
            f"(`torch.testing.assert_close`, default tolerances): {grad_text}.  "
            f"precompile's .grad are DTensors: {'n/a' if dtensor is None else dtensor}.\n"
        )
        for line in mismatches:
            out.append(f"- {line}\n")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp_train,gpt2_train")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--starts", type=int, default=3, help="fresh 2-rank jobs per method for the warm starts")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warm-start", default=None, choices=("precompile", "compile"), help=argparse.SUPPRESS)
    parser.add_argument("--pair", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--parallel", default="fsdp2", choices=tuple(FORMS))
    args = parser.parse_args()
    if args.child:
        (start_child if args.warm_start else child)(args)
        return
    mach, load_before, t0 = _common.machine(), _common.load_average(), time.perf_counter()
    implementation_before = _common.implementation_state()
    workloads = args.workloads.split(",")
    ranks, starts, failed = [{} for _ in range(WORLD_SIZE)], {}, None
    with tempfile.TemporaryDirectory(prefix="fsdp2-bench-") as scratch:
        out = os.path.join(scratch, "steady")
        extra = ["--workloads", args.workloads, "--repeats", str(args.repeats), "--steps", str(args.steps), "--parallel", args.parallel]
        try:
            ranks = run_job(out, os.path.join(scratch, "steady-cache"), extra, timeout=1800)
        except Exception as error:
            failed = str(error)
            print(failed, file=sys.stderr)
        for name in workloads:
            starts[name] = warm_starts(scratch, name, os.path.join(out, f"{name}.pair"), args.starts, args.parallel)
    title = "FSDP2 (fully_shard)" if args.parallel == "fsdp2" else "Tensor parallel (parallelize_module)"
    header = _common.report_header(
        f"{title} training step, 2 ranks (benchmarks/fsdp2_bench.py)", sys.argv, mach, load_before,
        _common.load_average(), time.perf_counter() - t0,
    )
    note = (
        f"- {WORLD_SIZE} ranks on this one host (gloo over loopback, 1-D mesh over the default group), each "
        f"single-threaded; the host has {mach['nproc']} cores, shared with other jobs, so the ranks also compete for them\n"
        f"- step time: median of {args.repeats} interleaved blocks of {args.steps} steps per method (defaults: 7 blocks "
        f"of 10 steps); warm starts: {args.starts} fresh 2-rank jobs per method and workload (default 3), plus one "
        "job that populates torch.compile's cache\n"
        "- precompile's warm-start jobs run with an empty TORCHINDUCTOR_CACHE_DIR; torch.compile's with the cache "
        "a previous identical job populated\n"
    )
    implementation_after = _common.implementation_state()
    if implementation_after != implementation_before:  # the header's state is the one at the end
        note += f"- the implementation changed during the run; at its start: {implementation_before}\n"
    note += "\n"
    text = header + note + render(ranks, starts, workloads, failed, args.parallel)
    print(text)
    _common.write_report("fsdp2_bench.md" if args.parallel == "fsdp2" else "tp_bench.md", text, {"ranks": ranks, "warm_starts": starts, "step_job_error": failed, "_header": header + note})


if __name__ == "__main__":
    main()
