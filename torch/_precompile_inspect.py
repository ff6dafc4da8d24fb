"""Inspect a ``torch.compiler.precompile`` artifact without running it.

    python -m torch_precompile inspect CODE_FILE CACHE_FILE [--json]

(``python -m torch._precompile inspect ...`` in a PyTorch checkout with the
in-tree form)

prints what a ``(python_code, cache)`` pair was built for and what it expects
at every call: format version, backend, the build environment of the cached
kernels and whether it matches this host, module positions, parameters and
buffers (a summary and the first few names with shapes; ``--json`` lists every
one), user inputs (shapes, dtypes, devices, free dims and their bounds),
outputs (shapes, dtypes, devices), which parameters receive gradients, the
kernels, and whether the two files belong together.

Nothing in the artifact is executed: the pair is read by
``read_artifact`` (``torch/_precompile_format.py``), the reader ``precompile.load`` uses
(``python_code``'s header with ``ast``, the cache's JSON envelope and raw
entries, the pairing, version and payload checks; see
Note [precompile programming model], invariants 6 and 7, in
``torch/_precompile.py``), and nothing is imported: a class an input/output
structure names stays its import path unless its module is already imported
(``classes_by_name``).  The checks are listed by the installed driver, so only
for an artifact whose driver section is its text; an empty cache is no cache,
as for ``load``.

Exit status: 0 the pair belongs together (``load`` accepts it); 1 a file is
missing or is not a readable precompile artifact (one line on stderr); 2 bad
command line; 3 both files are readable but do not belong together (the report
says why).
"""

import argparse
import collections
import json
import math
import os
import sys
from typing import Any

import torch.utils._pytree as pytree

from . import _precompile_format as _format
from ._precompile_runtime import _leaf_path, _preorder, leaf_paths, PrecompiledFunction
from ._precompile_schema import _dtype, CallingConvention, NamedClass, PrecompileError, TensorSpec


__all__ = ["describe", "format_report", "main", "NO_CACHE", "OWN_DRIVER", "read", "report", "UnreadableArtifact"]

EXIT_OK, EXIT_BAD_FILE, EXIT_USAGE, EXIT_MISMATCH = 0, 1, 2, 3
# What users run: the installed package, or torch._precompile in-tree.
_COMMAND = "torch._precompile" if __package__ == "torch" else __package__


class UnreadableArtifact(PrecompileError):
    """One half of the pair cannot be read; ``part`` is "python_code" or "cache"."""

    def __init__(self, part: str, error: PrecompileError):
        super().__init__(_one_line(str(error)))
        self.part = part


def describe(python_code: str, cache: bytes) -> dict[str, Any]:
    """A JSON-serializable report on a ``(python_code, cache)`` pair; executes nothing.

    Raises ``UnreadableArtifact`` (a ``PrecompileError``) if either half cannot
    be read (not an artifact, a newer format, damaged bytes); a readable pair
    that does not belong together is reported in ``report["pair"]``.
    """
    return report(read(python_code, cache))


def read(python_code: str, cache: bytes) -> _format.Artifact:
    """``read_artifact`` (what ``load`` reads), with each failure blamed on its half of the pair."""
    if not isinstance(cache, (bytes, bytearray, memoryview)):
        raise UnreadableArtifact("cache", PrecompileError(f"cache: expected bytes, got {type(cache).__name__}"))
    try:
        artifact = _format.read_artifact(python_code, cache, import_classes=False)
        # read_artifact parses only the header; load() would also fail on
        # a syntax error further down, or a missing section.  Compiling executes nothing.
        compile(python_code, "<precompile artifact>", "exec", dont_inherit=True)
        _format._split_sections(python_code)
    except SyntaxError as error:
        raise UnreadableArtifact(
            "python_code", PrecompileError(f"python_code is not valid Python ({error}); it is damaged or was edited")
        ) from None
    except PrecompileError as error:
        raise UnreadableArtifact("python_code", error) from None
    return artifact


def report(artifact: _format.Artifact) -> dict[str, Any]:
    """``describe``'s report on an artifact ``read_artifact`` read.

    Raises ``UnreadableArtifact`` if the cache cannot be read or its payload is damaged;
    an empty cache is no cache, as load takes it (it compiles from python_code), and
    its fields in the report are None.
    """
    if artifact.cache_error is not None and artifact.cache_size:
        raise UnreadableArtifact("cache", artifact.cache_error)
    python_code, convention, envelope, kernels = (
        artifact.python_code,
        artifact.convention,
        artifact.envelope or dict.fromkeys(("version", "backend", "code_hash", "build_env")),
        artifact.kernels,
    )
    problem = artifact.pair_problem
    state = convention.state
    installed_driver = _format.runs_installed_driver(python_code)
    return {
        "format_version": {
            "python_code": convention.format_version,
            "cache": envelope["version"],
            "supported": {
                "python_code": [_format.MIN_CONVENTION_VERSION, _format.CONVENTION_VERSION],
                "cache": [_format.MIN_CACHE_VERSION, _format.CACHE_VERSION],
            },
        },
        "backend": {"python_code": convention.backend, "cache": envelope["backend"]},
        "pair": {
            "belongs_together": problem is None,
            "problem": None if problem is None else _one_line(str(problem)),
            "backend_matches": None if artifact.envelope is None else envelope["backend"] == convention.backend,
            "code_hash_matches": (
                None if artifact.envelope is None else envelope["code_hash"] == _format._text_hashes(python_code)[1]
            ),
        },
        "build_environment": _build_environment_report(envelope["build_env"], len(kernels)),
        "call": _call_text(convention),
        "driver": "installed" if installed_driver else "own",
        "checks": _checks_report(convention) if installed_driver else None,
        "arity": convention.arity,
        "modules": [
            {"position": m.position, "parameters": len(m.parameters), "buffers": len(m.buffers)}
            | ({} if m.data_parallel is None else {"data_parallel": dict(zip(m.data_parallel._fields, m.data_parallel))})
            for m in convention.modules
        ],
        "parameters": _state_report(convention, "parameter"),
        "buffers": _state_report(convention, "buffer"),
        "tied": [[_state_name(convention, n) for n in s.names] for s in state if len(s.names) > 1],
        "inputs": _inputs_report(convention),
        "unimported_classes": _unimported_classes(convention),
        "size_facts": _size_facts_report(convention),
        "rebound_inputs": [f"args[{position}]" for position in convention.rebound_inputs],
        "outputs": _outputs_report(convention),
        "grad_params": [
            {"name": _state_name(convention, state[i].names[0]), **_tensor_report(state[i].tensor)}
            for i in convention.grad_state
        ],
        "constants": {
            "count": len(convention.constants),
            "bytes": sum(_nbytes(c.shape, c.dtype) for c in convention.constants),
        },
        "kernels": {"count": len(kernels), "bytes": sum(len(blob) for blob in kernels.values())},
        "sizes": {"python_code": len(python_code.encode()), "cache": artifact.cache_size},
    }


def _checks_report(convention: CallingConvention) -> list[str]:
    """What a runnable of this convention checks at every call, one line each (``PrecompiledFunction.checks``).

    Listed by the installed driver, on records decoded without executing python_code:
    only for an artifact that load runs with it (its driver section is that text).
    """
    return [str(check) for check in PrecompiledFunction(convention, run_graph=None, constants=[]).checks]


def _unimported_classes(convention: CallingConvention) -> list[str]:
    """The classes fn's input/output structure names by import path whose modules this
    process has not imported: the inspector shows their paths, load imports them."""
    nodes = _preorder(convention.input_spec) + _preorder(convention.output_spec)
    return sorted({repr(c) for node in nodes for c in (node.type, node.context) if isinstance(c, NamedClass)})


def _call_text(convention: CallingConvention) -> str:
    modules = {m.position for m in convention.modules}
    args = [f"args[{i}]: nn.Module" if i in modules else f"args[{i}]" for i in range(convention.arity)]
    return f"forward({', '.join(args)})"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _nbytes(shape: tuple, dtype: str) -> int | None:
    if any(size is None for size in shape):
        return None  # a free dim: the size is only known at runtime
    return math.prod(shape) * _dtype(dtype).itemsize


def _state_name(convention: CallingConvention, name: tuple) -> str:
    module_index, fqn = name
    return f"args[{convention.modules[module_index].position}].{fqn}"


def _tensor_report(spec: TensorSpec) -> dict[str, Any]:
    return {
        "shape": list(spec.shape),
        "stride": None if spec.stride is None else list(spec.stride),
        "dtype": spec.dtype,
        "device": spec.device,
        # Dims in one size group must have equal sizes at runtime.
        "free_dims": [
            {"dim": d, "size_group": group, "min": low, "max": high} for d, group, low, high in spec.free_dims
        ],
        "memory_format": spec.memory_format,
        "bytes": _nbytes(spec.shape, spec.dtype),
    }


def _state_report(convention: CallingConvention, kind: str) -> dict[str, Any]:
    """A summary of the parameters (or buffers), and each one by name (tied: its first name)."""
    entries = [s for s in convention.state if s.kind == kind]
    specs = [s.tensor for s in entries]
    sizes = [_nbytes(s.shape, s.dtype) for s in specs]
    elements = [None if None in s.shape else math.prod(s.shape) for s in specs]
    return {
        "count": len(specs),
        "elements": sum(elements) if None not in elements else None,
        "bytes": sum(sizes) if None not in sizes else None,
        "dtypes": dict(collections.Counter(s.dtype for s in specs)),
        "devices": dict(collections.Counter(s.device for s in specs)),
        "tensors": [{"name": _state_name(convention, s.names[0]), **_tensor_report(s.tensor)} for s in entries],
    }


def _inputs_report(convention: CallingConvention) -> list[dict[str, Any]]:
    report = []
    paths = leaf_paths(convention.input_spec)
    for (positional, *rest), leaf in zip(paths, convention.inputs):
        entry = {"path": _leaf_path(convention.user_positions[positional.idx], tuple(rest))}
        if leaf.tensor is not None:
            entry.update(kind="tensor", **_tensor_report(leaf.tensor))
        else:
            entry.update(kind="value", value=repr(leaf.value))
        report.append(entry)
    return report


def _size_facts_report(convention: CallingConvention) -> list[str]:
    """Each requirement between free sizes the graph took from the example, with the line that needed it."""
    paths = [entry["path"] for entry in _inputs_report(convention)]
    names = [f"{paths[leaf]} dim {dim}" for leaf, dim in convention.sizes]
    return [fact.describe(names) + fact.where for fact in convention.size_facts]


def _outputs_report(convention: CallingConvention) -> list[dict[str, Any]]:
    report = []
    paths = leaf_paths(convention.output_spec)
    for path, leaf in zip(paths, convention.outputs):
        entry = {"path": "result" + pytree.keystr(path)}
        if leaf.graph_output is not None:
            spec = convention.output_tensors[leaf.graph_output]
            entry.update(
                kind="tensor", graph_output=leaf.graph_output, shape=list(spec.shape), dtype=spec.dtype, device=spec.device
            )
        else:
            entry.update(kind="value", value=repr(leaf.value))
        report.append(entry)
    return report


def _build_environment_report(built: Any, num_kernels: int) -> dict[str, Any]:
    host = _format._host_environment(built)
    built_dict = built if isinstance(built, dict) else {}
    differs = sorted(k for k in set(host) | set(built_dict) if built_dict.get(k) != host.get(k))
    matches = isinstance(built, dict) and not differs
    if built is None:
        differs, consequence = [], NO_CACHE
    elif num_kernels == 0:
        consequence = "no compiled kernels in the cache: the build environment does not matter"
    elif matches:
        consequence = "the cached kernels load directly on this host (no compiler needed)"
    else:
        consequence = (
            "load will warn and compile the kernels from python_code on this host "
            "(needs a C++ compiler; slower first call)"
        )
    return {
        "cache": built,
        "host": host,
        "matches_host": matches,
        "differs": differs,
        "consequence": consequence,
    }


# ---------------------------------------------------------------------------
# Text rendering
# ---------------------------------------------------------------------------


def _shape_text(shape: list) -> str:
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + (",)" if len(shape) == 1 else ")")


def _bytes_text(n: int | None) -> str:
    return "unknown (free dims)" if n is None else f"{n:,} bytes"


def _elements_text(n: int | None) -> str:
    return "unknown (free dims)" if n is None else f"{n:,} elements"


def _counts_text(counter: dict) -> str:
    return ", ".join(f"{key} x{count}" for key, count in counter.items()) or "-"


def _tensor_text(entry: dict) -> str:
    text = f"{_shape_text(entry['shape'])} {entry['dtype']} {entry['device']}"
    if entry["stride"] is not None:
        text += f" stride {_shape_text(entry['stride'])}"
    if entry["memory_format"]:
        text += f" {entry['memory_format']}"
    for free in entry["free_dims"]:
        high = "inf" if free["max"] is None else free["max"]
        text += f"; dim {free['dim']} free in [{free['min']}, {high}] (size group {free['size_group']})"
    return text


_NAMES_SHOWN = 3  # parameters / buffers named in the text report
NO_CACHE = (
    "none (an empty cache file): load ignores it with a warning and compiles from python_code "
    "(slower first call; backend inductor needs a C++ compiler)"
)
OWN_DRIVER = (
    "not listed: the artifact carries a driver different from the installed one (another version's, or "
    "edited), and load runs that one; its checks cannot be listed without executing it"
)


def format_report(report: dict[str, Any], code_file: str = "", cache_file: str = "", checks: bool = False) -> str:
    """The human-readable form of ``describe``'s report."""
    version, backend, pair, env = (
        report["format_version"],
        report["backend"],
        report["pair"],
        report["build_environment"],
    )
    lines = ["torch.compiler.precompile artifact"]

    def row(label: str, value: Any) -> None:
        lines.append(f"  {label:<20}{value}")

    row("python_code", f"{code_file} ({report['sizes']['python_code']:,} bytes)")
    row("cache", f"{cache_file} ({report['sizes']['cache']:,} bytes)")
    row(
        "format version",
        "{} (cache {}; this torch reads {}..{} and caches {}..{})".format(
            version["python_code"],
            "none" if version["cache"] is None else version["cache"],
            *version["supported"]["python_code"],
            *version["supported"]["cache"],
        ),
    )
    cache_backend = "" if pair["backend_matches"] is not False else f" (cache: {backend['cache']})"
    row("backend", backend["python_code"] + cache_backend)
    row("pair", "belongs together" if pair["belongs_together"] else f"DOES NOT belong together: {pair['problem']}")
    built = env["cache"]
    if built is None:
        row("build environment", env["consequence"])
    else:
        built_text = ", ".join(f"{k} {v}" for k, v in built.items()) if isinstance(built, dict) else repr(built)
        row("build environment", built_text)
        if env["matches_host"]:
            row("", "matches this host")
        else:
            here = ", ".join(f"{k} {env['host'].get(k)}" for k in env["differs"])
            row("", f"DIFFERS from this host ({here})")
        row("", env["consequence"])
    row("calling convention", report["call"])
    if report["checks"] is None:
        row("checks", OWN_DRIVER)
    else:
        kinds = collections.Counter(line.split(" ", 1)[0] for line in report["checks"])
        listed = "" if checks else "; --checks lists them"
        row("checks", f"{len(report['checks'])} at every call ({_counts_text(kinds)}){listed}")
        if checks:
            for line in report["checks"]:
                row("", line)
    for module in report["modules"]:
        row("module", f"args[{module['position']}]: {module['parameters']} parameters, {module['buffers']} buffers")
        ddp = module.get("data_parallel")
        if ddp:
            reduces = "averages gradients over" if ddp["grad_sync"] else "inside no_sync(), no all-reduce; for"
            row("", f"DistributedDataParallel: {reduces} {ddp['world_size']} ranks (process group {ddp['group_name']!r})")
    for kind in ("parameters", "buffers"):
        summary = report[kind]
        row(
            kind,
            f"{summary['count']} tensors, {_elements_text(summary['elements'])}, {_bytes_text(summary['bytes'])}; "
            f"dtypes {_counts_text(summary['dtypes'])}; devices {_counts_text(summary['devices'])}",
        )
        if summary["tensors"]:
            shown = summary["tensors"][:_NAMES_SHOWN]
            more = len(summary["tensors"]) - len(shown)
            names = ", ".join(f"{t['name']} {_shape_text(t['shape'])}" for t in shown)
            row("", names + (f", ... ({more} more; --json lists all)" if more else ""))
    for names in report["tied"]:
        row("tied", " = ".join(names))
    if not report["inputs"]:
        row("inputs", "-")
    for entry in report["inputs"]:
        detail = _tensor_text(entry) if entry["kind"] == "tensor" else f"value {entry['value']} (baked)"
        row("input", f"{entry['path']}: {detail}")
    for path in report["unimported_classes"]:
        row("class", f"{path}: named by import path, not imported here (load imports it)")
    for fact in report["size_facts"]:
        row("size fact", fact)
    for path in report["rebound_inputs"]:
        row("written back", f"{path}: fn changes the object; the call writes its new state into the caller's")
    for entry in report["outputs"]:
        detail = (
            f"{_shape_text(entry['shape'])} {entry['dtype']} {entry['device']} (graph output {entry['graph_output']})"
            if entry["kind"] == "tensor"
            else f"value {entry['value']} (baked)"
        )
        row("output", f"{entry['path']}: {detail}")
    if not report["outputs"]:
        row("outputs", "-")
    grads = report["grad_params"]
    row("grad params", f"{len(grads)}" + ("" if grads else " (inference only)"))
    for entry in grads:
        row("", f"{entry['name']}: {_tensor_text(entry)}")
    if report["constants"]["count"]:
        row("constants", f"{report['constants']['count']}, {_bytes_text(report['constants']['bytes'])}")
    row("kernels", f"{report['kernels']['count']}, {_bytes_text(report['kernels']['bytes'])}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


class _BadFile(Exception):
    pass


def _read(path: str, text: bool) -> Any:
    try:
        if text:
            with open(path, encoding="utf-8-sig") as f:
                return f.read()
        with open(path, "rb") as f:
            return f.read()
    except UnicodeDecodeError as error:
        raise _BadFile(f"{path}: not a precompile python_code file (not UTF-8 text: {error.reason})") from None
    except OSError as error:
        raise _BadFile(f"{path}: cannot read ({error.strerror or error})") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {_COMMAND}",
        description="Tools for torch.compiler.precompile artifacts.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect",
        help="describe a (python_code, cache) pair without executing it",
        description=(
            "Describe a (python_code, cache) pair without executing it. Exit status: 0 the "
            "pair belongs together, 1 a file cannot be read, 3 the files do not belong together."
        ),
    )
    inspect.add_argument("code_file", metavar="CODE_FILE", help="the python_code, as written to disk")
    inspect.add_argument("cache_file", metavar="CACHE_FILE", help="the cache bytes, as written to disk")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument("--checks", action="store_true", help="list what every call checks, one line each")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_precompile inspect CODE_FILE CACHE_FILE [--json] [--checks]``."""
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit:  # --help, or argparse's own usage error
        return EXIT_USAGE if exit.code else EXIT_OK
    prefix = f"{_COMMAND} inspect: error"
    try:
        python_code = _read(args.code_file, text=True)
        cache = _read(args.cache_file, text=False)
        report = describe(python_code, cache)
        if args.json:
            report = {"code_file": args.code_file, "cache_file": args.cache_file, **report}
            text = json.dumps(report, indent=2, default=repr)
        else:
            text = format_report(report, args.code_file, args.cache_file, checks=args.checks)
    except _BadFile as error:
        print(f"{prefix}: {error}", file=sys.stderr)
        return EXIT_BAD_FILE
    except UnreadableArtifact as error:
        path = args.code_file if error.part == "python_code" else args.cache_file
        print(f"{prefix}: {path}: {error}", file=sys.stderr)
        return EXIT_BAD_FILE
    except Exception as error:  # malformed content that the readers let through
        print(
            f"{prefix}: {args.code_file}, {args.cache_file}: not a readable precompile artifact "
            f"({type(error).__name__}: {_one_line(str(error))[:300]})",
            file=sys.stderr,
        )
        return EXIT_BAD_FILE
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `... | head`: the reader left; exit quietly like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return EXIT_OK if report["pair"]["belongs_together"] else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
