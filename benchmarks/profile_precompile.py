"""Where a precompiled warm start and call spend their time (for issue 7's "why").

For each workload: build the precompile artifact (fresh process, empty cache
dir), then in fresh processes:

  1. ``python -X importtime``: the modules imported between ``import torch``
     and the first result (``torch.compiler.precompile`` access + ``load()`` +
     first call), largest cumulative first;
  2. cProfile of ``load()`` (empty inductor cache dir), top functions by own time;
  3. cProfile of N steady-state driver calls (1 thread), top functions by own
     time, next to the raw generated call's median and the driver's;
  4. the warm start split, unprofiled (``--splits`` fresh processes at 1 thread
     and as many at default threads, medians): model + inputs, first access of
     ``torch.compiler.precompile``, ``load()`` by stage (verify: constants,
     convention, cache and kernel checks; prime: kernel files; exec: the
     artifact module, Python's ``compile()`` of python_code and of Inductor's
     graph shown apart), first and second call.

Usage: python benchmarks/profile_precompile.py [--workloads tiny,mlp_fwd] [--calls 2000] [--splits 5]
Writes benchmarks/results/profile_precompile.md (``--report NAME``: NAME.md), e.g. for
GPT-2: --workloads gpt2_fwd,gpt2_train --calls 30 --report profile_precompile_gpt2
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

    import torch_precompile

    wl = C.WORKLOADS[task["workload"]]
    art = Path(task["art"])
    model, inputs = wl.build()
    code, cache = (art / "code.py").read_text(), (art / "cache.bin").read_bytes()
    print(LOAD_MARK, file=sys.stderr, flush=True)
    profile = cProfile.Profile() if task["profile"] else None
    t0 = time.perf_counter()
    if profile:
        profile.enable()
    precompile = torch_precompile.precompile  # first access imports the implementation
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


def task_split(task: dict, methods: dict, t_torch: float) -> dict:
    """One unprofiled warm start, split into its parts (seconds)."""
    import builtins
    import logging
    import re

    import torch
    import torch_precompile

    if task.get("threads"):
        torch.set_num_threads(task["threads"])
    wl = C.WORKLOADS[task["workload"]]
    art = Path(task["art"])
    t0 = time.perf_counter()
    model, inputs = wl.build()
    t1 = time.perf_counter()
    code, cache = (art / "code.py").read_text(), (art / "cache.bin").read_bytes()
    t2 = time.perf_counter()
    precompile = torch_precompile.precompile  # first access imports the implementation
    t3 = time.perf_counter()
    stages: list = []

    class Stages(logging.Handler):
        def emit(self, record):
            stages.append(record.getMessage())

    logger = logging.getLogger("torch_precompile._precompile")
    handler = Stages(logging.INFO)
    logger.addHandler(handler)
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    compiles = {}
    real_compile = builtins.compile

    def timed_compile(source, filename, *args, **kwargs):
        start = time.perf_counter()
        try:
            return real_compile(source, filename, *args, **kwargs)
        finally:
            compiles[filename] = compiles.get(filename, 0.0) + time.perf_counter() - start

    builtins.compile = timed_compile
    try:
        t4 = time.perf_counter()
        f = precompile.load(code, cache)
        t5 = time.perf_counter()
    finally:
        builtins.compile = real_compile
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    with wl.context():
        f(model, *inputs)
    t6 = time.perf_counter()
    for p in model.parameters():
        p.grad = None
    with wl.context():
        f(model, *inputs)
    t7 = time.perf_counter()
    found = [m for m in stages if m.startswith("load:")]
    split = {name: float(ms) / 1e3 for name, ms in re.findall(r"(\w+) ([0-9.]+) ms", found[0])} if found else {}
    return {
        "setup_s": t1 - t0,
        "attach_s": t3 - t2,
        "load_s": t5 - t4,
        "verify_s": split.get("verify"),
        "prime_s": split.get("prime"),
        "exec_s": split.get("exec"),
        "compile_code_s": compiles.get("<precompile artifact>"),
        "compile_graph_s": compiles.get("<precompile inductor graph>"),
        "compile_other_s": sum(v for k, v in compiles.items() if k not in ("<precompile artifact>", "<precompile inductor graph>")),
        "first_call_s": t6 - t5,
        "second_call_s": t7 - t6,
        "code_bytes": len(code.encode()),
        "cache_bytes": len(cache),
    }


def task_calls(task: dict, methods: dict, t_torch: float) -> dict:
    import cProfile
    import statistics

    import torch
    import torch_precompile

    torch.set_num_threads(1)
    wl = C.WORKLOADS[task["workload"]]
    art = Path(task["art"])
    model, inputs = wl.build()
    f = torch_precompile.load((art / "code.py").read_text(), (art / "cache.bin").read_bytes())
    raw, flat = f.run_graph, f.graph_inputs(model, *inputs)
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
    parser.add_argument("--splits", type=int, default=5, help="unprofiled warm starts per thread setting")
    parser.add_argument("--report", default="profile_precompile", help="results/REPORT.md (and .json)")
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
            splits = {}
            for _ in range(args.splits):  # interleaved: machine load drifts hit both settings alike
                for threads in (1, None):
                    task = {"task": "profile_split", "workload": w, "art": art, "threads": threads}
                    splits.setdefault(str(threads or "default"), []).append(runner.run(task, runner.fresh_dir("split")))
            out[w] = {"imports": imports, "load": load, "calls": calls, "splits": splits}
        elapsed = runner.elapsed()
    text = C.report_header("Profile of precompile's warm start and driver", sys.argv, mach, load_before, C.load_average(), elapsed)
    text += render(out)
    print(text)
    path = C.write_report(f"{args.report}.md", text, {w: {k: {kk: vv for kk, vv in v.items() if kk != "stderr"} for k, v in d.items()} for w, d in out.items()})
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


_SPLIT_COLUMNS = [
    ("setup_s", "model + inputs"),
    ("attach_s", "first `torch.compiler.precompile`"),
    ("load_s", "`load()`"),
    ("verify_s", "verify"),
    ("prime_s", "prime"),
    ("exec_s", "exec"),
    ("compile_code_s", "`compile()` python_code"),
    ("compile_graph_s", "`compile()` Inductor graph"),
    ("first_call_s", "first call"),
    ("second_call_s", "second call"),
]


def _render_splits(splits: dict) -> str:
    rows = []
    for threads, results in splits.items():
        ok = [r for r in results if r.get("ok")]
        if not ok:
            rows.append([threads, 0] + ["failed"] * (len(_SPLIT_COLUMNS) + 1))
            continue
        cells = [C.fmt_time(C.median(r.get(key) for r in ok)) for key, _ in _SPLIT_COLUMNS]
        load_call = C.median(r["load_s"] + r["first_call_s"] for r in ok)
        rows.append([threads, len(ok), *cells, C.fmt_time(load_call)])
    if not rows:
        return ""
    sizes = next((r for rs in splits.values() for r in rs if r.get("ok")), {})
    return (
        "\nWarm start split, unprofiled (fresh processes, empty cache dir, medians; python_code "
        f"{C.fmt_bytes(sizes.get('code_bytes'))}, cache {C.fmt_bytes(sizes.get('cache_bytes'))}): `load()` = "
        "verify (constants, calling convention, cache envelope and kernel hashes) + prime (kernel files) + exec "
        "(the artifact module, which includes both `compile()`s and the kernel loads):\n\n"
        + C.markdown_table(["threads", "runs", *(label for _, label in _SPLIT_COLUMNS), "load + first call"], rows)
        + "\n"
    )


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
        parts.append(_render_splits(data.get("splits", {})))
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    if "--child" in sys.argv:
        C.child_main(C.BASE_METHODS, {"profile_load": task_load, "profile_calls": task_calls, "profile_split": task_split})
    else:
        main()
