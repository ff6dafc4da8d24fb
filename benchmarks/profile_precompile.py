"""Where a precompiled warm start and call spend their time (for issue 7's "why").

For each workload: build the precompile artifact (fresh process, empty cache
dir), then in fresh processes:

  1. ``python -X importtime``: the modules imported between ``import torch``
     and the first result (``torch.compiler.precompile`` access + ``load()`` +
     first call), largest cumulative first;
  2. cProfile of ``load()`` (empty inductor cache dir), top functions by own time;
  3. cProfile of N steady-state driver calls (1 thread), top functions by own
     time, next to the raw generated call's median and the driver's.

Usage: python benchmarks/profile_precompile.py [--workloads tiny,mlp_fwd] [--calls 2000]
Writes benchmarks/results/profile_precompile.md.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402  (imports no torch)


LOAD_MARK = "@@load-begin@@"


def _top(profile, limit: int) -> list:
    import pstats

    stats = pstats.Stats(profile)
    rows = []
    for (filename, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        where = name if filename == "~" else f"{Path(filename).name}:{line}({name})"
        rows.append((tt, ct, nc, where))
    rows.sort(reverse=True)
    return [{"own_s": tt, "cum_s": ct, "calls": nc, "function": where} for tt, ct, nc, where in rows[:limit]]


def task_load(task: dict, methods: dict, t_torch: float) -> dict:
    import cProfile

    import torch

    wl = C.WORKLOADS[task["workload"]]
    art = Path(task["art"])
    model, inputs = wl.build()
    code, cache = (art / "code.py").read_text(), (art / "cache.bin").read_bytes()
    print(LOAD_MARK, file=sys.stderr, flush=True)
    profile = cProfile.Profile() if task["profile"] else None
    t0 = time.perf_counter()
    if profile:
        profile.enable()
    precompile = torch.compiler.precompile  # first access imports the implementation
    t1 = time.perf_counter()
    f = precompile.load(code, cache)
    t2 = time.perf_counter()
    with wl.context():
        f(model, *inputs)
    t3 = time.perf_counter()
    if profile:
        profile.disable()
    return {
        "attach_s": t1 - t0,
        "load_s": t2 - t1,
        "first_call_s": t3 - t2,
        "top": _top(profile, 18) if profile else [],
    }


def task_calls(task: dict, methods: dict, t_torch: float) -> dict:
    import cProfile
    import statistics

    import torch

    torch.set_num_threads(1)
    wl = C.WORKLOADS[task["workload"]]
    art = Path(task["art"])
    model, inputs = wl.build()
    f = torch.compiler.precompile.load((art / "code.py").read_text(), (art / "cache.bin").read_bytes())
    raw, flat = C.raw_graph_call(f), C.flat_graph_inputs(f, model, inputs)
    full = C.Runtime(lambda: f(model, *inputs), list(model.parameters()), wl.context)
    bare = C.Runtime(lambda: raw(flat), list(model.parameters()), torch.no_grad)
    steps = {"driver": C._make_step(full, wl), "raw": C._make_step(bare, wl)}
    timings = C._time_batches(steps, {"driver": full.context, "raw": bare.context}, 21, 0.02)
    profile = cProfile.Profile()
    step = steps["driver"]
    with full.context():
        profile.enable()
        for _ in range(task["calls"]):
            step()
        profile.disable()
    return {
        "driver_s": timings["driver"]["median_s"],
        "raw_s": timings["raw"]["median_s"],
        "calls": task["calls"],
        "top": _top(profile, 22),
        "noise_s": statistics.pstdev(timings["driver"]["samples_s"]),
    }


def main() -> None:
    parser = C.base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="tiny,mlp_fwd,mlp_train,conv_fwd")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    load_before, mach = C.load_average(), C.machine()
    out = {}
    with C.scratch(args) as workdir:
        runner = C.Runner(__file__, workdir)
        plan = C.Plan(runner, C.BASE_METHODS, workloads, ["precompile"])
        for w in workloads:
            plan.build(w, "precompile")
            art = str(plan.art_dir(w, "precompile"))
            imports = runner.run(
                {"task": "profile_load", "workload": w, "art": art, "profile": False},
                runner.fresh_dir("importtime"), python_flags=("-X", "importtime"), keep_stderr=True,
            )
            load = runner.run({"task": "profile_load", "workload": w, "art": art, "profile": True}, runner.fresh_dir("load"))
            calls = runner.run({"task": "profile_calls", "workload": w, "art": art, "calls": args.calls}, runner.fresh_dir("calls"))
            out[w] = {"imports": imports, "load": load, "calls": calls}
        elapsed = runner.elapsed()
    text = C.report_header("Profile of precompile's warm start and driver", sys.argv, mach, load_before, C.load_average(), elapsed)
    text += render(out)
    print(text)
    path = C.write_report("profile_precompile.md", text, {w: {k: {kk: vv for kk, vv in v.items() if kk != "stderr"} for k, v in d.items()} for w, d in out.items()})
    print(f"wrote {path}", file=sys.stderr)


def _importtime(stderr: str) -> list:
    lines = stderr.split(LOAD_MARK, 1)[1].splitlines() if LOAD_MARK in stderr else []
    rows = []
    for line in lines:
        if not line.startswith("import time:"):
            continue
        fields = [p.strip() for p in line[len("import time:") :].split("|")]
        if len(fields) != 3 or not fields[0].isdigit():
            continue  # the header line
        self_us, cum_us, name = fields
        rows.append((int(cum_us), int(self_us), name))
    rows.sort(reverse=True)
    return rows


def render(out: dict) -> str:
    parts = []
    for w, data in out.items():
        parts.append(f"\n## {w}: {C.WORKLOADS[w].label}\n")
        load, calls, imports = data["load"], data["calls"], data["imports"]
        if load.get("ok"):
            parts.append(
                f"cProfile'd warm start (default threads, empty cache dir; profiling inflates it): first access of "
                f"`torch.compiler.precompile` {C.fmt_time(load['attach_s'])}, `load()` {C.fmt_time(load['load_s'])}, "
                f"first call {C.fmt_time(load['first_call_s'])}.\n"
            )
            parts.append(C.markdown_table(
                ["function", "own", "cumulative", "calls"],
                [[r["function"], C.fmt_time(r["own_s"]), C.fmt_time(r["cum_s"]), r["calls"]] for r in load["top"]],
            ))
        else:
            parts.append(f"load profile failed: {load.get('error')}")
        if imports.get("ok"):
            rows = _importtime(imports.get("stderr", ""))
            total = sum(s for _, s, _ in rows)
            parts.append(
                f"\n`-X importtime`, modules first imported between `import torch` and the first result "
                f"({len(rows)} modules, {total / 1e3:.1f} ms own time in total); largest cumulative:\n"
            )
            parts.append(C.markdown_table(
                ["module", "cumulative", "own"], [[n, f"{c / 1e3:.1f} ms", f"{s / 1e3:.1f} ms"] for c, s, n in rows[:12]]
            ))
        if calls.get("ok"):
            over = calls["driver_s"] - calls["raw_s"]
            parts.append(
                f"\nSteady state (1 thread, interleaved medians): driver call {C.fmt_us(calls['driver_s'])}, raw generated "
                f"call {C.fmt_us(calls['raw_s'])}, overhead {C.fmt_us(over)}. cProfile of {calls['calls']} driver calls "
                "(per-call own time; cProfile adds ~0.1-0.3 us per function call):\n"
            )
            n = calls["calls"]
            parts.append(C.markdown_table(
                ["function", "own / call", "cumulative / call", "calls / call"],
                [[r["function"], C.fmt_us(r["own_s"] / n), C.fmt_us(r["cum_s"] / n), f"{r['calls'] / n:g}"] for r in calls["top"]],
            ))
        else:
            parts.append(f"call profile failed: {calls.get('error')}")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    if "--child" in sys.argv:
        C.child_main(C.BASE_METHODS, {"profile_load": task_load, "profile_calls": task_calls})
    else:
        main()
