"""Data-parallel training step on 2 ranks (issue 26): a DDP-wrapped model, gloo on loopback.

Per workload (the MLP 3x256 and HF GPT-2 4x256 training steps of
``_common.WORKLOADS``: forward, MSE loss, backward, grads set to None before
each step), every rank runs, on its own DistributedDataParallel copy of the
same model:

  eager DDP        train_step(ddp, x, y) as written (DDP's reducer all-reduces)
  torch.compile    torch.compile(train_step)(ddp, x, y) (Dynamo's DDPOptimizer)
  precompile       precompile(train_step, ddp, x, y, backend="inductor") on rank 0,
                   broadcast, loaded on every rank (all-reduce in the graph)

Step time: single-threaded ranks, methods interleaved, median over repeats of
the per-step time of a block of steps (the ranks synchronize in every step's
all-reduce).  Warm start per rank: ``load()`` + the first call of the DDP
artifact, the first load in the rank's process (after a barrier), next to the
single-process warm start: ``load()`` + the first call of the artifact of the
unwrapped model (``precompile(train_step, model, x, y)``) in fresh processes
(median of ``--starts``), both from after ``import torch``.

Usage: python benchmarks/ddp_bench.py [--workloads mlp_train,gpt2_train] [--repeats 7] [--steps 10]
Goals (issue 26): step time <= eager DDP's and <= torch.compile DDP's; warm
start per rank within 2x of the single-process warm start.  Writes
results/ddp_bench.md (and .json).
"""

import argparse
import copy
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402  (imports no torch)


METHODS = ("eager", "compile", "precompile")
WORLD_SIZE = 2


def child(args) -> None:
    import torch
    import torch.distributed as dist
    import torch_precompile
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}
    for name in args.workloads.split(","):
        workload = _common.WORKLOADS[name]
        model, inputs = workload.build()  # same seed: the same weights and data on every rank
        ddps = {m: DistributedDataParallel(copy.deepcopy(model)) for m in METHODS}  # (no buffers to broadcast)
        result = results[name] = {}
        # Rank 0 builds both artifacts; every rank loads them before anything else compiles there.
        pairs = [None]
        if rank == 0:
            start = time.perf_counter()
            ddp_pair = torch_precompile.precompile(_common.train_step, ddps["precompile"], *inputs, backend="inductor")
            result["precompile_build_s"] = time.perf_counter() - start
            plain_pair = torch_precompile.precompile(_common.train_step, copy.deepcopy(model), *inputs, backend="inductor")
            pairs[0] = (ddp_pair, plain_pair)
        dist.broadcast_object_list(pairs, src=0)
        ddp_pair, plain_pair = pairs[0]
        if rank == 0:  # for the single-process starts
            with open(os.path.join(args.child, f"{name}.pair"), "wb") as f:
                pickle.dump(plain_pair, f)
        runnables = {}
        dist.barrier()
        start = time.perf_counter()
        runnables["precompile"] = torch_precompile.load(*ddp_pair)
        loaded = time.perf_counter()
        runnables["precompile"](ddps["precompile"], *inputs)
        result["warm_start"] = {"load_s": loaded - start, "first_call_s": time.perf_counter() - loaded}
        runnables["eager"] = _common.train_step
        runnables["compile"] = torch.compile(_common.train_step)
        result["compile_first_call_s"] = _common.timed(lambda: runnables["compile"](ddps["compile"], *inputs))
        ordered = {method: runnables[method] for method in METHODS}
        samples = _common.interleaved_step_times(ordered, ddps, inputs, args.repeats, args.steps, dist.barrier)
        result["step_s"] = {method: _common.median(values) for method, values in samples.items()}
        # Same start, same data: every method's parameters (SGD-free steps leave them) and grads agree.
        result["grads_match"] = all(
            torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-5)
            for a, b in zip(ddps["eager"].parameters(), ddps["precompile"].parameters())
            if a.grad is not None
        )
    with open(os.path.join(args.child, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def single_start(args) -> None:
    """A fresh process: load() + the first call of the single-process artifact (after import torch)."""
    import torch
    import torch_precompile

    torch.set_num_threads(1)
    model, inputs = _common.WORKLOADS[args.workloads].build()
    with open(args.single_start, "rb") as f:
        pair = pickle.load(f)
    start = time.perf_counter()
    runnable = torch_precompile.load(*pair)
    loaded = time.perf_counter()
    runnable(model, *inputs)
    print(json.dumps({"load_s": loaded - start, "first_call_s": time.perf_counter() - loaded}))


def single_starts(pair_file: str, workload: str, count: int) -> dict:
    runs = []
    for _ in range(count):
        command = [sys.executable, os.path.abspath(__file__), "--single-start", pair_file, "--workloads", workload]
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {key: _common.median([run[key] for run in runs]) for key in ("load_s", "first_call_s")}


def render(ranks: list, singles: dict, workloads: list) -> str:
    out = []
    for name in workloads:
        label = _common.WORKLOADS[name].label
        per_rank = [r[name] for r in ranks]
        rows = []
        for method, title in (("eager", "eager DDP"), ("compile", "torch.compile DDP"), ("precompile", "precompile DDP")):
            times = [r["step_s"][method] for r in per_rank]
            rows.append(
                [title, *map(_common.fmt_time, times),
                 _common.fmt_ratio(per_rank[0]["step_s"]["eager"], per_rank[0]["step_s"][method])]
            )
        out.append(f"## {label}, 2 ranks\n")
        out.append(_common.markdown_table(
            ["method", *(f"step, rank {r}" for r in range(len(ranks))), "speed-up vs eager DDP (rank 0)"], rows
        ))
        single = singles[name]
        single_total = single["load_s"] + single["first_call_s"]
        starts = [
            [f"rank {r}", _common.fmt_time(x["warm_start"]["load_s"]), _common.fmt_time(x["warm_start"]["first_call_s"]),
             _common.fmt_time(sum(x["warm_start"].values())),
             _common.fmt_ratio(sum(x["warm_start"].values()), single_total)]
            for r, x in enumerate(per_rank)
        ]
        starts.append(["single process (fresh, no DDP)", _common.fmt_time(single["load_s"]),
                       _common.fmt_time(single["first_call_s"]), _common.fmt_time(single_total), "1.00x"])
        out.append("\nWarm start, from after `import torch` (the rank's first load, after a barrier):\n")
        out.append(_common.markdown_table(["", "load()", "first call", "total", "vs single process"], starts))
        first = per_rank[0]
        out.append(
            f"\nBuild on rank 0: precompile {_common.fmt_time(first['precompile_build_s'])}; torch.compile's "
            f"first call {_common.fmt_time(first['compile_first_call_s'])}.  Grads of the last step equal eager "
            f"DDP's on every rank: {all(x['grads_match'] for x in per_rank)}.\n"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp_train,gpt2_train")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--starts", type=int, default=5, help="fresh processes for the single-process start")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--single-start", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.single_start:
        single_start(args)
        return
    mach, load_before, start = _common.machine(), _common.load_average(), time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD_SIZE),
            "--master-addr", "127.0.0.1", "--master-port", "29581", os.path.abspath(__file__),
            "--child", out, "--workloads", args.workloads, "--repeats", str(args.repeats), "--steps", str(args.steps),
        ]  # fmt: skip
        subprocess.run(command, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(WORLD_SIZE)]
        workloads = args.workloads.split(",")
        singles = {name: single_starts(os.path.join(out, f"{name}.pair"), name, args.starts) for name in workloads}
    header = _common.report_header(
        "Data-parallel training step, 2 ranks (benchmarks/ddp_bench.py)", sys.argv, mach, load_before,
        _common.load_average(), time.perf_counter() - start,
    )
    note = (
        f"- {WORLD_SIZE} ranks on this one host (gloo over loopback), each single-threaded; the host has "
        f"{mach['nproc']} cores, shared with other jobs, so the ranks also compete for them\n\n"
    )
    text = header + note + render(ranks, singles, workloads)
    print(text)
    _common.write_report("ddp_bench.md", text, {"ranks": ranks, "single_process_start": singles, "_header": header + note})


if __name__ == "__main__":
    main()
