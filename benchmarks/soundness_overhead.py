"""Per-call cost of the precompile driver's checks (issue 12, soundness).

Two models, each captured with ``backend="eager"`` and a trivial graph
(``fn(model, x) = x * 2``: every parameter and buffer is still lifted and
checked at every call, the graph itself costs almost nothing):

  * ``tiny``: one ``nn.Linear(16, 16)`` (1 module, 2 parameters);
  * ``deep``: ``Sequential`` of 50 ``Linear(4, 4)`` + ``ReLU`` (101 modules,
    100 parameters).

For each it prints the median per-call time of the precompiled runnable, of
the raw generated graph on the same flat inputs, and their paired difference
(the driver's own cost: for ``deep``, the 100-submodule check of issue 27's
goal, <= 5 us).  One thread, gc disabled while timing.

A second table puts the real tiny forward next to eager PyTorch in the same
run (issue 27's goal: no slower than eager): ``nn.Linear(16, 16)``, batch 4,
``fn(model, x) = model(x)`` called under ``torch.no_grad()``, precompiled with
each backend, against eager's ``model(x)`` under ``no_grad()``, and
``torch.compile``'s call of the same fn; medians of repeats and their paired
difference.  A third splits the inductor row: the driver (precompiled call -
raw graph) against what eager adds to ``F.linear`` (``model(x)`` -
``F.linear(x, weight, bias)``: ``nn.Module.__call__`` and forward's attribute
reads), and Inductor's graph against ``F.linear``.

A fourth puts the deep model's check next to torch.compile's: the C++ guard
tree Dynamo built for ``model(x)`` on the same model (backend "eager",
no_grad), checked on its own (no frame evaluation, no graph).

Before/after a driver change, on a busy machine: ``--save DIR`` (run on the
old checkout) writes the artifacts, whose python_code embeds that driver;
``--baseline DIR`` (on the new one) loads them next to fresh ones and adds
the paired per-call difference new - old, measured in one process (for both
tables).

Usage:  python benchmarks/soundness_overhead.py [--pairs N] [--save DIR | --baseline DIR]
"""

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402  (imports no torch)


def _models():
    import torch.nn as nn

    deep = nn.Sequential(*[layer for _ in range(50) for layer in (nn.Linear(4, 4), nn.ReLU())])
    return {"tiny": (nn.Linear(16, 16), 16), "deep": (deep, 4)}


def _double(model, x):
    return x * 2


def _per_call(step, seconds: float = 0.2) -> float:
    """Median per-call time over blocks of calls (torch.utils.benchmark: gc off, one thread)."""
    from torch.utils.benchmark import Timer

    return Timer("step()", globals={"step": step}).blocked_autorange(min_run_time=seconds).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200, help="adjacent block pairs for the difference")
    parser.add_argument("--save", help="write each model's artifact to this directory")
    parser.add_argument("--baseline", help="compare with the artifacts --save wrote here")
    args = parser.parse_args()

    import torch
    import torch_precompile

    torch.set_num_threads(1)
    logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design
    rows = []
    models = _models()
    for name, (model, features) in models.items():
        x = torch.randn(2, features)
        pair = torch_precompile.precompile(_double, model, x, backend="eager")
        if args.save:
            os.makedirs(args.save, exist_ok=True)
            torch.save(pair, os.path.join(args.save, f"{name}.pt"))
        f = torch_precompile.load(*pair)
        raw, flat = f.run_graph, f.graph_inputs(model, x)
        precompiled = lambda: f(model, x)  # noqa: E731
        graph = lambda: raw(flat)  # noqa: E731
        row = [
            name,
            str(sum(1 for _ in model.modules())),
            str(sum(1 for _ in model.parameters())),
            C.fmt_us(_per_call(precompiled)),
            C.fmt_us(_per_call(graph)),
            _fmt_paired(precompiled, graph, args.pairs),
        ]
        if args.baseline:
            old = _baseline(args.baseline, name)
            row.append(_fmt_paired(precompiled, lambda: old(model, x), args.pairs))  # noqa: B023
        rows.append(row)
    headers = ["model", "modules", "params", "precompiled call", "raw graph", "driver overhead"]
    print(C.markdown_table(headers + (["new - baseline"] if args.baseline else []), rows))
    print()
    eager_table, split_table = _against_eager(args.pairs, args.save, args.baseline)
    print(C.markdown_table(*eager_table))
    print()
    print(C.markdown_table(*split_table))
    print()
    print(C.markdown_table(*_against_dynamo_guards(models["deep"], rows)))


def _against_dynamo_guards(deep: tuple, rows: list) -> tuple[list, list]:
    """The deep model's driver overhead (measured above) next to Dynamo's guard check for model(x)."""
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # private (2.11-2.14): a code object's compiled entries

    model, features = deep
    x = torch.randn(2, features)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(C.forward, backend="eager")(model, x)
        (entry,) = _debug_get_cache_entry_list(C.forward.__code__)
        frame_locals = {"model": model, "x": x}
        assert entry.guard_manager.check(frame_locals)
        dynamo_s = _per_call(lambda: entry.guard_manager.check(frame_locals))
    (ours,) = [row for row in rows if row[0] == "deep"]
    headers = ["model", "precompile driver overhead", "torch.compile guard check"]
    return headers, [["deep (101 modules, 100 parameters)", ours[5], C.fmt_us(dynamo_s)]]


def _baseline(directory: str, name: str):
    """The runnable of an artifact --save wrote, with the driver embedded in it."""
    import torch

    # Run alone, as an artifact can be: this load() may not read an older convention.
    namespace: dict = {}
    exec(torch.load(os.path.join(directory, f"{name}.pt"))[0], namespace)
    return namespace["forward"]


def _against_eager(pairs: int, save: str | None, baseline: str | None) -> tuple[tuple, tuple]:
    """The tiny no_grad forward, precompiled with each backend, next to eager's and torch.compile's call; (table, its inductor row split)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_precompile

    model, x = nn.Linear(16, 16), torch.randn(4, 16)
    eager = lambda: model(x)  # noqa: E731
    weight, bias = model.weight, model.bias  # read outside: F.linear alone, not Module.__getattr__
    linear = lambda: F.linear(x, weight, bias)  # noqa: E731
    rows, split = [], []
    with torch.no_grad():
        eager_s = _per_call(eager)
        compiled = torch.compile(C.forward)
        compiled(model, x)
        compiled_s = _per_call(lambda: compiled(model, x))
        rows.append(["torch.compile(fn), backend=inductor", C.fmt_us(compiled_s), C.fmt_us(eager_s),
                     f"{compiled_s / eager_s:.2f}x", _fmt_paired(lambda: compiled(model, x), eager, pairs)])
        if baseline:
            rows[-1].append("")
        for backend in ("eager", "inductor"):
            pair = torch_precompile.precompile(C.forward, model, x, backend=backend)
            if save:
                torch.save(pair, os.path.join(save, f"forward_{backend}.pt"))
            f = torch_precompile.load(*pair)
            precompiled = lambda: f(model, x)  # noqa: E731, B023
            torch.testing.assert_close(precompiled(), eager())
            call_s = _per_call(precompiled)
            row = [
                f"Linear(16, 16), batch 4, no_grad, backend={backend}",
                C.fmt_us(call_s),
                C.fmt_us(eager_s),
                f"{call_s / eager_s:.2f}x",
                _fmt_paired(precompiled, eager, pairs),
            ]
            if baseline:
                old = _baseline(baseline, f"forward_{backend}")
                row.append(_fmt_paired(precompiled, lambda: old(model, x), pairs))  # noqa: B023
            rows.append(row)
            if backend == "inductor":
                raw, flat = f.run_graph, f.graph_inputs(model, x)
                graph = lambda: raw(flat)  # noqa: E731, B023
                split = [
                    ["checks and bookkeeping", "precompile driver (call - raw graph)",
                     _fmt_paired(precompiled, graph, pairs), "nn.Module call (model(x) - F.linear)",
                     _fmt_paired(eager, linear, pairs)],
                    ["the computation", "Inductor's graph (raw graph - F.linear)", _fmt_paired(graph, linear, pairs),
                     "F.linear", C.fmt_us(_per_call(linear))],
                ]
    headers = ["forward", "precompiled call", "eager call", "ratio", "precompiled - eager"]
    split_headers = ["Linear(16, 16) no_grad, inductor", "precompile", "", "eager", ""]
    return (headers + (["new - baseline"] if baseline else []), rows), (split_headers, split)


def _fmt_paired(a, b, pairs: int) -> str:
    import contextlib

    paired = C._paired_overhead(a, b, contextlib.nullcontext, contextlib.nullcontext, pairs, 0.002)
    return f"{paired['median_s'] * 1e6:.2f} us ± {paired['ci95_s'] * 1e6:.2f}"


if __name__ == "__main__":
    main()
