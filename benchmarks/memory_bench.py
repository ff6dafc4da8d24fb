"""Peak memory of precompile() against the model's state size (issue 5, item 6).

Model: 4x Linear(H, H) with ReLU between (H=2048: 64 MB of parameters; a second
size, H=4096, 256 MB, gives the slope).  Each figure comes from its own fresh
process: build the model and inputs, ``gc.collect()``, read VmRSS (the
baseline), reset the peak (``echo 5 > /proc/self/clear_refs``), run ONE
operation, read VmHWM.  extra = peak - baseline, reported in MB and in copies
of the state (extra / state bytes).

Operations: eager forward+backward (the training step: its own peak, i.e. the
grads plus activations), eager forward; ``precompile()`` of the same fn with
backend="eager" and "inductor"; ``load()`` + first call of the inductor
artifact.  Fixed costs (importing Inductor alone is ~100+ MB of RSS) do not
depend on the state, so the state-proportional part is the slope between the two
sizes: d(extra) / d(state).  Goal: precompile's extra <= one copy of the state
+ eager's own peak, i.e. slope(precompile) - slope(eager train step) <= 1.

Usage:
    python benchmarks/memory_bench.py            # full run (~5 min)
    python benchmarks/memory_bench.py --quick    # smoke: smaller sizes, 1 repeat
"""

import gc
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402  (imports no torch)


OPS = ["eager", "precompile_eager", "precompile_inductor", "load_call"]
LABELS = {
    "eager": "eager run",
    "precompile_eager": "precompile(backend='eager')",
    "precompile_inductor": "precompile(backend='inductor')",
    "load_call": "load() + first call (inductor)",
}


def _status_kb(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.M).group(1))


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def task_mem(task: dict, methods: dict, t_torch: float) -> dict:
    import torch

    hidden, kind, op = task["hidden"], task["kind"], task["op"]
    torch.manual_seed(0)
    layers = []
    for i in range(4):
        layers += [torch.nn.Linear(hidden, hidden)] + ([torch.nn.ReLU()] if i < 3 else [])
    model = torch.nn.Sequential(*layers)
    inputs = (torch.randn(64, hidden),) + ((torch.randn(64, hidden),) if kind == "train" else ())
    fn = C.train_step if kind == "train" else C.forward
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    art = Path(task["art"])
    if op == "load_call":
        code, cache = (art / "code.py").read_text(), (art / "cache.bin").read_bytes()
        import torch_precompile._precompile  # noqa: F401  (the implementation's import is not what we measure)
    elif op.startswith("precompile"):
        import torch_precompile._precompile  # noqa: F401
    gc.collect()
    baseline = _status_kb("VmRSS")
    reset = _reset_peak()
    if not reset:
        baseline = max(baseline, _status_kb("VmHWM"))
    t0 = time.perf_counter()
    if op == "eager":
        with torch.no_grad() if kind == "forward" else torch.enable_grad():
            fn(model, *inputs)
    elif op in ("precompile_eager", "precompile_inductor"):
        backend = op.split("_", 1)[1]
        code, cache = torch_precompile.precompile(fn, model, *inputs, backend=backend)
        if backend == "inductor":
            art.mkdir(parents=True, exist_ok=True)
            (art / "code.py").write_text(code)
            (art / "cache.bin").write_bytes(cache)
    elif op == "load_call":
        f = torch_precompile.load(code, cache)
        with torch.no_grad() if kind == "forward" else torch.enable_grad():
            f(model, *inputs)
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    return {
        "state_bytes": state_bytes,
        "baseline_kb": baseline,
        "peak_kb": peak,
        "extra_bytes": (peak - baseline) * 1024,
        "peak_reset": reset,
        "seconds": seconds,
    }


def main() -> None:
    parser = C.base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=None, help="comma-separated hidden sizes (default 2048,4096)")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    sizes = [int(s) for s in (args.sizes or ("1024,2048" if args.quick else "2048,4096")).split(",")]
    kinds = ["train"] if args.quick else ["train", "forward"]
    load_before, mach = C.load_average(), C.machine()
    results: dict = {}
    with C.scratch(args) as workdir:
        runner = C.Runner(__file__, workdir)
        for r in range(repeats):
            for kind in kinds:
                for hidden in sizes:
                    art = workdir / "artifacts" / f"{kind}-{hidden}"
                    for op in OPS:
                        if op == "load_call" and not (art / "cache.bin").exists():
                            continue
                        task = {"task": "mem", "op": op, "kind": kind, "hidden": hidden, "art": str(art), "size": hidden}
                        result = runner.run(task, runner.fresh_dir(f"mem-{op}"))
                        results.setdefault((kind, hidden, op), []).append(result)
        elapsed = runner.elapsed()

    text = C.report_header("precompile() peak memory vs model state", sys.argv, mach, load_before, C.load_average(), elapsed)
    text += f"- {repeats} fresh process(es) per figure, median; peak = VmHWM after resetting it (clear_refs) at the baseline\n\n"
    text += render(results, kinds, sizes)
    print(text)
    raw = {f"{k}/{h}/{op}": v for (k, h, op), v in results.items()}
    path = C.write_report("memory_bench.md", text, raw)
    print(f"wrote {path}", file=sys.stderr)


def _extra(results, key) -> float | None:
    return C.median(r["extra_bytes"] for r in results.get(key, []) if r.get("ok"))


def render(results: dict, kinds: list, sizes: list) -> str:
    out = []
    mb = 1 << 20
    for kind in kinds:
        out.append(f"\n## fn = {'training step (MSE + backward)' if kind == 'train' else 'forward'}\n")
        rows, state = [], {}
        for hidden in sizes:
            any_ok = next((r for op in OPS for r in results.get((kind, hidden, op), []) if r.get("ok")), None)
            if any_ok is None:
                continue
            state[hidden] = any_ok["state_bytes"]
            eager = _extra(results, (kind, hidden, "eager"))
            for op in OPS:
                extra = _extra(results, (kind, hidden, op))
                rows.append([
                    f"4x Linear({hidden})", C.fmt_bytes(state[hidden]), LABELS[op],
                    "n/a" if extra is None else f"{extra / mb:.0f} MB",
                    "n/a" if extra is None else f"{extra / state[hidden]:.2f}",
                    "-" if op == "eager" or None in (extra, eager) else f"{(extra - eager) / state[hidden]:+.2f}",
                ])
        out.append(C.markdown_table(
            ["model", "state", "operation", "peak - baseline", "x state", "(op - eager) x state"], rows
        ))
        if len(state) >= 2:
            lo, hi = sizes[0], sizes[-1]
            d_state = state[hi] - state[lo]
            slopes = {}
            for op in OPS:
                a, b = _extra(results, (kind, lo, op)), _extra(results, (kind, hi, op))
                slopes[op] = None if None in (a, b) else (b - a) / d_state
            srows = []
            for op in OPS:
                s, e = slopes[op], slopes["eager"]
                fixed = None if s is None else (_extra(results, (kind, lo, op)) - s * state[lo])
                goal = None if op == "eager" or None in (s, e) else (s - e <= 1.0 + 0.05)
                srows.append([
                    LABELS[op],
                    "n/a" if s is None else f"{s:.2f}",
                    "-" if op == "eager" or None in (s, e) else f"{s - e:+.2f}",
                    "n/a" if fixed is None else f"{fixed / mb:.0f} MB",
                    "-" if goal is None else ("yes" if goal else "**no**"),
                ])
            out.append(f"\nState-proportional part (slope between {lo} and {hi}) and the fixed part (intercept):\n")
            out.append(C.markdown_table(
                ["operation", "copies of state (slope)", "vs eager's own peak", "fixed (intercept)",
                 "goal: <= eager + 1 copy"],
                srows,
            ))
    errors = [f"- {k}: {r.get('error')}" for k, rs in results.items() for r in rs if not r.get("ok")]
    if errors:
        out.append("\n## Errors\n\n" + "\n".join(errors))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if "--child" in sys.argv:
        C.child_main({}, {"mem": task_mem})
    else:
        main()
