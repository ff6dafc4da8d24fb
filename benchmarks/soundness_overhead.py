"""Per-call cost of the precompile driver's checks (issue 12, soundness).

Two models, each captured with ``backend="eager"`` and a trivial graph
(``fn(model, x) = x * 2``: every parameter and buffer is still lifted and
checked at every call, the graph itself costs almost nothing):

  * ``tiny``: one ``nn.Linear(16, 16)`` (1 module, 2 parameters);
  * ``deep``: ``Sequential`` of 50 ``Linear(4, 4)`` + ``ReLU`` (101 modules,
    100 parameters).

For each it prints the median per-call time of the precompiled runnable, of
the raw generated graph on the same flat inputs, and their paired difference
(the driver's own cost).  One thread, gc disabled while timing.

Usage:  python benchmarks/soundness_overhead.py [--pairs N]
"""

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402  (imports no torch)


def _models():
    import torch.nn as nn

    deep = nn.Sequential(*[layer for _ in range(50) for layer in (nn.Linear(4, 4), nn.ReLU())])
    return {"tiny": (nn.Linear(16, 16), 16), "deep": (deep, 4)}


def _double(model, x):
    return x * 2


def _per_call(step, seconds: float = 0.2, repeats: int = 15) -> float:
    """Median over repeats of the mean per-call time of a ~seconds/repeats block."""
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.05:
        step()
        n += 1
    k = max(1, int(seconds / repeats / ((time.perf_counter() - t0) / n)))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(k):
            step()
        times.append((time.perf_counter() - t) / k)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200, help="adjacent block pairs for the difference")
    args = parser.parse_args()

    import contextlib

    import torch

    torch.set_num_threads(1)
    logging.getLogger("torch._precompile").setLevel(logging.ERROR)  # load() warns by design
    rows = []
    for name, (model, features) in _models().items():
        x = torch.randn(2, features)
        f = torch.compiler.precompile.load(*torch.compiler.precompile(_double, model, x, backend="eager"))
        raw, flat = C.raw_graph_call(f), C.flat_graph_inputs(f, model, [x])
        precompiled = lambda: f(model, x)  # noqa: E731
        graph = lambda: raw(flat)  # noqa: E731
        overhead = C._paired_overhead(
            precompiled, graph, contextlib.nullcontext, contextlib.nullcontext, args.pairs, 0.002
        )
        rows.append(
            [
                name,
                str(sum(1 for _ in model.modules())),
                str(sum(1 for _ in model.parameters())),
                C.fmt_us(_per_call(precompiled)),
                C.fmt_us(_per_call(graph)),
                f"{overhead['median_s'] * 1e6:.2f} us ± {overhead['ci95_s'] * 1e6:.2f}",
            ]
        )
    print(C.markdown_table(["model", "modules", "params", "precompiled call", "raw graph", "driver overhead"], rows))


if __name__ == "__main__":
    main()
