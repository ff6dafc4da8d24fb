"""How small can the tiny artifact's driver get without dropping a check? (issue 34, item 2)

Precompiles ``nn.Linear(4, 4)`` with backend="eager" (the issue's tiny artifact),
prints its sections' sizes, then loads it and calls it under ``sys.settrace``:
three accepted calls, calls under ``no_grad`` / ``inference_mode`` / an eval
module, and one call of each kind of refusal listed in ``_REFUSALS`` (each must
raise PrecompileError; the script fails otherwise).  It reports the driver
code (the schema and the runtime) these ran, in two phases:

  * load: decoding the convention and building the runnable, work a
    per-artifact code generator could move to capture;
  * calls: the checks, the graph call and the explanations of the refusals.

Each executed statement counts with all of its lines (a compound statement:
its header lines only), with indentation, without comments, docstrings or
statements that did not run.  The calls' figure is therefore a lower bound on
the driver any design carries while it keeps these checks and messages --
before one comment, and before the refusals this script does not trigger.

Usage:  python benchmarks/driver_size_bound.py      (~10 s; prints, writes nothing)
"""

import ast
import sys

import torch
import torch.nn as nn
import torch.nn.utils.parametrize as parametrize

import torch_precompile
from torch_precompile import _precompile_artifact as artifact, _precompile_runtime as runtime, _precompile_schema as schema


def _fresh() -> nn.Module:
    return nn.Linear(4, 4)


def _with(change) -> nn.Module:
    module = _fresh()
    change(module)
    return module


class _Subclass(nn.Linear):
    pass


class _PassThroughMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _under(context, *args):
    def call(f):
        with context():
            return f(*args)

    return call


def _with_settings(enter, leave, *args):
    def call(f):
        enter()
        try:
            return f(*args)
        finally:
            leave()

    return call


def _refusals(model: nn.Module, x: torch.Tensor) -> dict:
    """Kind of refusal -> a call of f that must raise PrecompileError."""
    def plain(*args, **kwargs):
        return lambda f: f(*args, **kwargs)

    return {
        "shape": plain(model, torch.randn(3, 4)),
        "dtype": plain(model, x.double()),
        "arity": plain(model),
        "keyword": plain(model, x, y=1),
        "module shapes": plain(nn.Linear(4, 5), x),
        "input structure": plain(model, [x]),
        "input type": plain(model, 3),
        "module position": plain(x, x),
        "autocast": _under(lambda: torch.autocast("cpu"), model, x),
        "function mode": _under(_PassThroughMode, model, x),
        "forward hook": plain(_with(lambda m: m.register_forward_hook(lambda *a: None)), x),
        "pre-hook": plain(_with(lambda m: m.register_forward_pre_hook(lambda *a: None)), x),
        "child added": plain(_with(lambda m: setattr(m, "extra", nn.ReLU())), x),
        "buffer added": plain(_with(lambda m: m.register_buffer("extra", torch.zeros(1))), x),
        "parameter removed": plain(_with(lambda m: setattr(m, "bias", None)), x),
        "strides": plain(_with(lambda m: setattr(m, "weight", nn.Parameter(torch.randn(4, 4).t()))), x),
        "parametrization": plain(_with(lambda m: parametrize.register_parametrization(m, "weight", nn.Identity())), x),
        "module class": plain(_Subclass(4, 4), x),
        "device": plain(model, x.to("meta")),
        "gradient hook": plain(_with(lambda m: m.weight.register_hook(lambda grad: grad)), x),
        "default dtype": _with_settings(
            lambda: torch.set_default_dtype(torch.float64), lambda: torch.set_default_dtype(torch.float32), model, x
        ),
    }


def _statement_lines(sources: dict) -> dict:
    """(file, first line) -> the lines of the statement starting there (a compound one's header)."""
    spans = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.stmt):
                continue
            body = getattr(node, "body", None)
            end = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno
            spans.setdefault((path, node.lineno), range(node.lineno, max(end, node.lineno) + 1))
    return spans


def _size(executed: set, sources: dict, spans: dict) -> tuple[int, int]:
    lines = {path: text.splitlines() for path, text in sources.items()}
    counted = set()
    for path, line in executed:
        for number in spans.get((path, line), (line,)):
            text = lines[path][number - 1]
            if not text.strip().startswith("#"):
                counted.add((path, number, len(text) + 1))
    return len(counted), sum(size for _, _, size in counted)


def main() -> None:
    model, x = _fresh(), torch.randn(2, 4)
    python_code, cache = torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager")
    sections = artifact._split_sections(python_code)
    print(f"tiny artifact: python_code {len(python_code):,} characters, cache {len(cache):,} bytes")
    print(f"  header {min(start for start, _ in sections.values()):,}, "
          + ", ".join(f"{name} {len(text):,}" for name, (_, text) in sections.items()))

    sources = {module.__file__: open(module.__file__, encoding="utf-8").read() for module in (schema, runtime)}
    executed = {"load": set(), "calls": set()}
    phase = "load"

    def trace(frame, event, arg):
        path = frame.f_code.co_filename
        if path in sources:
            executed[phase].add((path, frame.f_lineno))
            if event == "call":  # the def line (its decorators are not re-run)
                executed[phase].add((path, frame.f_code.co_firstlineno))
        return trace

    refusals = _refusals(model, x)
    sys.settrace(trace)
    try:
        f = torch_precompile.load(python_code, cache)
        phase = "calls"
        for _ in range(3):
            f(model, x)
        _under(torch.no_grad, model, x)(f)
        _under(torch.inference_mode, model, x)(f)
        f(_fresh().eval(), x)
        accepted = []
        for kind, call in refusals.items():
            try:
                call(f)
            except torch_precompile.PrecompileError:
                continue
            accepted.append(kind)
    finally:
        sys.settrace(None)
    if accepted:
        raise SystemExit(f"expected refusals were accepted: {accepted}")

    spans = _statement_lines(sources)
    print(f"driver code run ({len(refusals)} kinds of refusal; statements, no comments or docstrings):")
    for name, lines in executed.items():
        count, chars = _size(lines, sources, spans)
        print(f"  {name:5s}: {count:4d} lines, {chars:6,d} characters")


if __name__ == "__main__":
    main()
