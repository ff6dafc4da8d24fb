"""The precompile artifact format: what capture writes, load() and the inspector read.

``python_code``'s sections and header constants, the BYTECODE_SHA256 pin, the
cache's zip envelope, and ``read_artifact``, which reads and checks a pair
without executing either (Note [precompile programming model], invariants 6
and 7, in ``torch/_precompile.py``).  It sits at the bottom of precompile's
modules: ``_precompile_artifact`` (writing and running a pair),
``_precompile_capture`` and ``_precompile_inspect`` import it, and it imports only the schema
(``_precompile_schema``: the calling convention's records and their codec),
the driver (``_precompile_runtime``), torch and the standard library, so no
module imports its importer (test_precompile.py TestImportGraph).
"""

import ast
import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import marshal
import platform
import struct
import sys
import threading
import zipfile
from typing import Any

import torch

from . import _precompile_runtime as runtime, _precompile_schema as schema
from ._precompile_schema import CallingConvention, PrecompileError


CACHE_FORMAT = "torch.compiler.precompile"
# Two versions, as jax.export keeps its calling convention apart from its
# serialization: python_code's (its sections, header constants and the
# CallingConvention record, stored as the convention's ``format_version``) and
# the cache envelope's (its ``version``).  Through 10 they were one number.
#
# python_code.  2: the convention records module modes read, aliasing,
# requires_grad, global state (Note invariant 11 on); 3: submodule classes and
# read attributes, how each .grad is written (invariant 13), and the graph and
# the driver are code sections, no longer string literals; older artifacts lack
# them.  4: the format version and backend are stored once (CALLING_CONVENTION's
# format_version / backend, no FORMAT_VERSION / BACKEND lines), the free sizes
# are derived from the inputs' free_dims, a LeafSpec's unset value is no None.
# 5: each tensor output's shape, dtype and device (output_tensors).  7: the
# sections run under the file name <precompile artifact HASH>.py.  8: fn's
# signature (keyword calls), the dict inputs whose key order fn observed,
# optimizer hyperparameters lifted like lr (OptimizerSpec.lifted) and
# structures named by import path; a version-7 convention reads as one without
# them, an older driver refuses 8.  9: grad_inputs_read_only (zeros kept across
# calls for a None .grad); an older convention reads as one without it.  10:
# rebound_inputs and returned_inputs (input objects fn changes or returns, as a
# cache); an older convention reads as one without them.  11: StateSpec.sharded
# (parameters fully_shard sharded, invariant 17); an older convention reads as one
# without it.  Fields added since, with defaults (an older convention reads as one
# without them; a driver that lacks one refuses a convention that sets it):
# fully_shard_policies, grads_none / grads_present, requires_grad_read, same_modules
# (an older artifact's own driver checks no module identity), eager artifacts'
# TensorSpec.stride (None before: not checked), grads_owned (none before: every
# new .grad is copied into the parameter's layout), autocast_dtypes, tensor_attributes,
# DataParallelSpec's reduced / ignored, OutputView.detached / no_grad (an older artifact's
# own driver rebuilds such a view with history).
MIN_CONVENTION_VERSION = 7
CONVENTION_VERSION = 11
# The cache.  6: a zip of a JSON envelope and raw entries, not a torch.save
# pickle, carrying the header's constants beside the compiled sections.  7: its
# code_hash is derived from python_code's source hash (_text_hashes: python_code
# is hashed once per load).  11: the compiled parts are a dict by name without
# the driver, which load() takes from the installed package when it is the
# driver section's exact text (compiled from python_code otherwise); 7..10
# store them as a tuple with the driver (_pinned_parts reads both).
MIN_CACHE_VERSION = 7
CACHE_VERSION = 11
# The golden pairs under test/precompile_golden/ (test_precompile_golden.py)
# make both minimums a tested promise.


# ---------------------------------------------------------------------------
# Sections: python_code = header (calling convention) + graph + driver + forward.
# ---------------------------------------------------------------------------


# After the header, python_code is sections of plain code in reading order, each
# opened by its marker line.  Run alone, they share one namespace; load() compiles
# them one by one and skips the driver when the installed one is the same text.
_SECTIONS = ("graph", "driver", "forward")


def _marker(section: str) -> str:
    return f"\n# {'=' * 20} {section} {'=' * 20}\n"


def _section_spans(python_code: str) -> dict[str, tuple[int, int]]:
    """Section name -> (start, end) of its text in python_code."""
    starts = []
    for name in _SECTIONS:
        at = python_code.find(_marker(name), starts[-1][1] if starts else 0)
        if at < 0:
            raise PrecompileError(
                f"python_code has no {name} section (marker {_marker(name).strip()!r}); it was edited"
            )
        starts.append((name, at))
    ends = [at for _, at in starts[1:]] + [len(python_code)]
    return {name: (at + len(_marker(name)), end) for (name, at), end in zip(starts, ends)}


def _split_sections(python_code: str) -> dict[str, tuple[int, str]]:
    """Section name -> (where its text starts in python_code, its text)."""
    return {name: (start, python_code[start:end]) for name, (start, end) in _section_spans(python_code).items()}

# The driver is the schema (torch/_precompile_schema.py) and the runtime
# (torch/_precompile_runtime.py), whose text is a core and optional parts, each
# opened by a marker line and running to the next.  An artifact's driver section
# is the schema, the core and the parts its calling convention uses, in the
# file's order: the core calls into a part only where the convention has what
# it serves.
_PART_MARKER_START = "\n# ~~~~ driver part: "
_PART_MARKER_END = " ~~~~\n"


def _split_driver(text: str) -> tuple[str, dict[str, str]]:
    """A driver's core, and its parts by name (each part's text opens with its marker)."""
    core, *pieces = text.split(_PART_MARKER_START)
    return core, {piece[: piece.index(_PART_MARKER_END)]: _PART_MARKER_START + piece for piece in pieces}


@functools.lru_cache(maxsize=None)
def _installed_driver_texts() -> tuple[str, str, dict[str, str]]:
    """The installed schema's text, the runtime's core and the runtime's parts (read once)."""
    schema_text = _read_source(schema.__file__)
    core, parts = _split_driver(_read_source(runtime.__file__))
    return schema_text, core, parts


def _read_source(path: str) -> str:
    # As bytes, then decoded: a text-mode read of the runtime costs a warm load ~0.1 ms more.
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text  # universal newlines


def _installed_driver() -> tuple[str, dict[str, str]]:
    """The installed driver's core (the schema's text, then the runtime's core) and the runtime's parts."""
    schema_text, core, parts = _installed_driver_texts()
    return f"{schema_text}\n\n{core}", parts


def driver_parts(convention: CallingConvention) -> tuple[str, ...]:
    """The driver's optional parts a runnable of ``convention`` calls into, in file order."""
    used = {
        "gradients": convention.touches_grads,
        "data_parallel": any(m.data_parallel is not None for m in convention.modules),
        "sharded": any(spec.sharded is not None for spec in convention.state) or bool(convention.parallel_hooks),
        "optimizer": bool(convention.optimizers),
        "input_objects": bool(convention.rebound_inputs or convention.returned_inputs),
        "inductor": convention.backend == "inductor",
        "library_hooks": convention.library_modules,
    }
    return tuple(name for name in _installed_driver()[1] if used[name])


def _driver_source(parts: Any = None) -> str:
    """The installed driver's core and ``parts`` (None: every part, the whole file)."""
    core, installed = _installed_driver()
    return core + "".join(text for name, text in installed.items() if parts is None or name in parts)


def _is_installed_driver(text: str, start: int = 0, end: int | None = None) -> bool:
    """Whether a driver section (``text[start:end]``) is the installed driver's text: its
    core, then installed parts, each whole.  Compared in place: load() copies no text for it."""
    end = len(text) if end is None else end
    schema_text, core, parts = _installed_driver_texts()
    at = start + len(schema_text)
    if not (text.startswith(schema_text, start, end) and text.startswith("\n\n", at, end) and text.startswith(core, at + 2, end)):
        return False
    at += 2 + len(core)
    while at < end:
        name_end = text.find(_PART_MARKER_END, at, end) if text.startswith(_PART_MARKER_START, at, end) else -1
        part = parts.get(text[at + len(_PART_MARKER_START) : name_end]) if name_end != -1 else None
        if part is None or not text.startswith(part, at, end):
            return False
        at += len(part)
    return True


def runs_installed_driver(python_code: str) -> bool:
    """Whether ``load`` runs the installed driver for python_code (else the artifact's own,
    whose checks only executing it could list: another version's, or edited)."""
    return _is_installed_driver(python_code, *_section_spans(python_code)["driver"])


def describe_arguments(convention: CallingConvention) -> list[str]:
    """One line per positional argument of fn: what the runnable expects there (the header states them)."""
    lines = []
    modules = {m.position: m for m in convention.modules}
    optimizers = {o.position: o for o in convention.optimizers}
    spec = convention.input_spec
    leaves = iter(convention.inputs)
    for position in range(convention.arity):
        if position in optimizers:
            o = optimizers[position]
            lines.append(
                f"args[{position}]: torch.optim.{o.cls} over {sum(map(len, o.groups))} parameters in "
                f"{len(o.groups)} groups ({' and '.join(('lr', *o.lifted))} read at every call; state updated in place)"
            )
            continue
        if position in modules:
            module = modules[position]
            lines.append(
                f"args[{position}]: nn.Module with {len(module.parameters)} parameters, "
                f"{len(module.buffers)} buffers"
            )
            continue
        child = spec.children()[convention.user_positions.index(position)]
        described = [_describe_leaf(next(leaves)) for _ in range(child.num_leaves)]
        lines.append(f"args[{position}]: " + (described[0] if child.is_leaf() else f"pytree of {described}"))
    return lines


def _describe_leaf(leaf: schema.LeafSpec) -> str:
    if leaf.is_value:
        return f"{leaf.value!r} (baked)"
    return leaf.tensor.describe()


# ---------------------------------------------------------------------------
# Package: the cache is a zip archive of stored entries (``unzip -l`` lists
# it): ``envelope.json``, a plain dict (format, version, backend, code_hash,
# build_env, payload_sha256, artifact) whose bytes values are references
# {"$blob": NAME} to the entries holding them.  Written by hand rather than
# with torch.save: a process's first torch.load costs ~3 ms (it imports and
# tokenizes serialization config), a third of a warm load, and pickle protocol
# 2 stores bytes as latin-1 text.  Reading JSON and raw entries runs no code
# (Note invariant 7).
# ---------------------------------------------------------------------------


_ENVELOPE_ENTRY = "envelope.json"
_BLOB_REFERENCE = "$blob"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same artifact gives the same bytes
# Entry names are ASCII, read as UTF-8: zipfile's default for them, cp437, is a
# codec a warm load would import (~0.4 ms); Python 3.10 has no such option.
_ZIP_READ_OPTIONS = {"metadata_encoding": "utf-8"} if sys.version_info >= (3, 11) else {}


def _build_environment(gpu: bool = False, cpu_features: bool = True) -> dict[str, str]:
    """What compiled kernels depend on; they are loaded only on an exact match.

    ``gpu``: the cache holds Triton kernels, whose cubins also depend on the
    GPU architecture and on the Triton that built them (its launch ABI).
    ``cpu_features``: the CPU's instruction-set extensions, which Inductor's
    -march=native lets its C++ kernels use (caches before it do not record them).
    """
    environment = {
        "torch": str(torch.__version__),
        "python": sys.implementation.cache_tag,
        "platform": f"{sys.platform}-{platform.machine()}",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if cpu_features:
        environment["cpu_features"] = _cpu_features()
    if gpu:
        environment["gpu"] = _gpu_environment()
    return environment


def _host_environment(built: Any) -> dict[str, str]:
    """This process's build environment, with the optional fields ``built`` (a cache's build_env) records."""
    recorded = built if isinstance(built, dict) else {}
    return _build_environment(gpu="gpu" in recorded, cpu_features="cpu_features" in recorded)


@functools.lru_cache(maxsize=None)
def _cpu_features() -> str:
    """The CPU's instruction-set extensions (cpuinfo's), e.g. 'aes amx_bf16 ... avx512_f ... sse4_2'.

    Two CPUs of one ``cpu_capability`` (AVX512: Skylake-X, Sapphire Rapids)
    differ in these, and a kernel built for one may not run on the other.
    """
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # absent in torch builds that predate it
    if capabilities is None:
        return "unknown"
    return " ".join(
        sorted(
            name if value is True else f"{name}={value}"
            for name, value in capabilities().items()
            if value is True or (name.endswith("_max_length") and type(value) is int)  # SVE / SME vector lengths
        )
    )


def _gpu_environment() -> str:
    if not torch.cuda.is_available():
        return "none"
    import importlib.metadata

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "none"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor} triton {triton}"


# Cache keys of a Triton kernel: KEY.cubin (its binary) and KEY.json (how to launch it).
GPU_KERNEL_SUFFIX = ".cubin"


def _has_gpu_kernels(keys) -> bool:
    return any(key.endswith(GPU_KERNEL_SUFFIX) for key in keys)


def _kernel_digests(kernels: dict[str, bytes]) -> dict[str, str]:
    """Kernel key -> sha256 of its compiled bytes: what KERNEL_SHA256 records and the payload hash covers."""
    return {key: hashlib.sha256(blob).hexdigest() for key, blob in kernels.items()}


def _payload_hash(digests: dict[str, str]) -> str:
    """The cache's own hash of its kernels, over their keys and digests (each kernel is hashed once)."""
    return hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()


def _code_hash(python_code: str) -> str:
    return hashlib.sha256(python_code.encode()).hexdigest()


def _text_hashes(python_code: str) -> tuple[str, str]:
    """(source hash, code hash) of python_code, reading its text once.

    The source hash is the sha256 of the text its compiled parts were made
    from: python_code with its BYTECODE_SHA256 line holding the placeholder
    (the parts record it).  The code hash adds that line's value, so it
    covers every character: the cache's code_hash, binding it to python_code.
    """
    span = _pin_span(python_code)
    if span is None:
        source_hash, pin = _code_hash(python_code), None
    else:
        start, end = span
        text = memoryview(python_code.encode())  # hashed around the pin, without copies
        byte_start = start if python_code.isascii() else len(python_code[:start].encode())
        digest = hashlib.sha256(text[:byte_start])
        digest.update(_NO_PIN)
        digest.update(text[byte_start + end - start :])  # the pin is ASCII
        source_hash, pin = digest.hexdigest(), python_code[start + 1 : end - 1]
    return source_hash, _code_hash(f"{source_hash} {pin}")


def _pack_envelope(envelope: dict) -> bytes:
    """The cache bytes holding ``envelope`` (JSON values and bytes)."""
    blobs: dict[str, bytes] = {}

    def reference(value: Any) -> dict[str, str]:
        if not isinstance(value, bytes):
            raise TypeError(f"a cache envelope holds JSON values and bytes, not {type(value).__name__}")
        name = f"blobs/{len(blobs)}"
        blobs[name] = value
        return {_BLOB_REFERENCE: name}

    entries = {_ENVELOPE_ENTRY: json.dumps(envelope, default=reference, indent=1).encode(), **blobs}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name, _ZIP_EPOCH), data)
    return buffer.getvalue()


# python_code's sections compiled for this interpreter travel in the cache, so a
# warm load() compiles no Python, and so do its header's constants
# (marshalled), so a warm load() parses no header either.  python_code pins
# these parts by sha256 (like its kernels), and they record the sha256 of the
# text they were made from: the cache cannot substitute other code or values,
# and an edited python_code is compiled and parsed as it now reads.
def _pin_line(digest: str | None) -> str:
    """python_code's BYTECODE_SHA256 line (None: the placeholder it holds until its parts are compiled)."""
    return f"BYTECODE_SHA256 = {digest!r}"


_NO_BYTECODE = _pin_line(None)
_PIN_LINE_START = "\n" + _NO_BYTECODE.removesuffix("None")
_NO_PIN = b"None"
_BYTECODE_MAGIC = importlib.util.MAGIC_NUMBER.hex()
# The compiled parts a cache carries: the header's constants and the sections
# but the driver, which the installed package has (cache version 11 on).
_CACHED_PARTS = ("header", "graph", "forward")
_TUPLE_CACHED_PARTS = ("header", *_SECTIONS)  # cache versions 7..10: a tuple, the driver included


def _bytecode_hash(constants: dict[str, Any]) -> str | None:
    recorded = constants.get("BYTECODE_SHA256")
    if recorded is not None and not _is_sha256_hex(recorded):
        raise PrecompileError("python_code: BYTECODE_SHA256 is malformed (expected a sha256 hex or None); it was edited")
    return recorded


def _pinned_parts(envelope: dict, pin: str | None, source_hash: str) -> tuple[dict[str, bytes], str | None]:
    """The cache's compiled parts (part -> marshalled bytes), if python_code pins exactly
    these bytes (``pin``) and is the text they were made from (``source_hash``); else {}
    and why, if worth a warning."""
    artifact = envelope.get("artifact")
    entry = artifact.get("bytecode") if isinstance(artifact, dict) else None
    if pin is None or not isinstance(entry, dict) or entry.get("magic") != _BYTECODE_MAGIC:
        return {}, None  # none pinned, or built by another Python: compile python_code
    bytecode = entry.get("code")
    if not isinstance(bytecode, bytes) or hashlib.sha256(bytecode).hexdigest() != pin:
        return {}, (
            "the cache's compiled Python does not match the sha256 python_code records for it "
            "(damaged, or another artifact's)"
        )
    recorded_source_hash, *parts = marshal.loads(bytecode)
    if recorded_source_hash != source_hash:
        return {}, "python_code was edited after its compiled Python was recorded"
    return (parts[0] if len(parts) == 1 else dict(zip(_TUPLE_CACHED_PARTS, parts))), None


def _pin_span(python_code: str) -> tuple[int, int] | None:
    """Where the header's one BYTECODE_SHA256 line has its quoted sha256, if it has one.

    Found with str methods: a regex scan of the header costs more.
    """
    header_end = max(python_code.find(_marker(_SECTIONS[0])), 0)
    if python_code.count(_PIN_LINE_START, 0, header_end) != 1:
        return None
    start = python_code.find(_PIN_LINE_START, 0, header_end) + len(_PIN_LINE_START)
    end = start + 66  # '<64 hex digits>'
    quoted = python_code[start:end]
    if quoted[:1] != "'" or quoted[-1:] != "'" or python_code[end : end + 1] != "\n" or not _is_sha256_hex(quoted[1:-1]):
        return None
    return start, end


def _pinned_header(
    python_code: str, envelope: dict, source_hash: str
) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """The header's constants and the compiled parts as the cache carries them, or None.

    load()'s warm path, which parses no header: taken when the header's one
    BYTECODE_SHA256 line pins the cache's parts and python_code is the text
    they were made from (``_pinned_parts``), so the constants are the ones
    precompile read from this very text.
    """
    span = _pin_span(python_code)
    pin = python_code[span[0] + 1 : span[1] - 1] if span else None
    parts = _pinned_parts(envelope, pin, source_hash)[0] if pin else {}
    if "header" not in parts:
        return None
    return {**marshal.loads(parts["header"]), "BYTECODE_SHA256": pin}, parts


class _CacheUnusable(PrecompileError):
    """The cache cannot accelerate this load: damaged, foreign, or another version.

    The cache only accelerates (Note invariant 6): load() warns and compiles
    from python_code instead.  A cache bound to other code still raises.
    """


# CPython 3.11 (seen on 3.11.7) keeps ast.parse's recursion-depth counter in shared
# state: parses racing in two threads raise "SystemError: AST constructor
# recursion depth mismatch" (gh-106905).  load() is called from threads.
_AST_LOCK = threading.Lock()

_REQUIRED_CONSTANTS = ("CALLING_CONVENTION",)
# Absent in artifacts of older versions: KERNEL_SHA256 and BYTECODE_SHA256, recorded
# after the kernels are harvested, and INDUCTOR_VEC_ISA (backend='inductor').
_HEADER_CONSTANTS = (*_REQUIRED_CONSTANTS, "KERNEL_SHA256", "BYTECODE_SHA256", "INDUCTOR_VEC_ISA")


def _parse(source: str) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(source)


def _read_constants(python_code: str) -> dict[str, Any]:
    # The constants precede the graph: parsing only that header keeps load()
    # fast for large graphs; the rest is compiled when executed.
    header_end = python_code.find(_marker("graph"))
    _refuse_transcoded(python_code, header_end)
    try:
        module = _parse(python_code if header_end < 0 else python_code[:header_end])
    except (SyntaxError, ValueError) as error:
        raise PrecompileError(f"python_code is not valid Python ({error}); it is not a precompile artifact") from None
    except (MemoryError, RecursionError) as error:
        raise PrecompileError(
            f"python_code is nested too deeply to parse ({type(error).__name__}); it is not a precompile artifact"
        ) from None
    constants, others = {}, []
    for node in module.body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in _HEADER_CONSTANTS
        ):
            others.append(node)
            continue
        if node.targets[0].id in constants:
            raise PrecompileError(f"python_code assigns {node.targets[0].id} twice; it was edited")
        try:
            constants[node.targets[0].id] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
            raise PrecompileError(
                f"python_code: {node.targets[0].id} is not a plain literal ({error})"
            ) from error
    missing = set(_REQUIRED_CONSTANTS) - set(constants)
    if missing:
        raise PrecompileError(
            f"python_code is missing the calling-convention metadata {sorted(missing)}; "
            "it is not a precompile artifact"
        )
    if others:
        _refuse_misplaced_sections(python_code if header_end < 0 else python_code[:header_end], header_end)
        _refuse_header_statement(others[0])
    return constants


def _refuse_misplaced_sections(header: str, header_end: int) -> None:
    # Another section above the graph's is read as header statements: name the edit instead.
    for name in _SECTIONS[1:]:
        if _marker(name) in header:
            where = "precedes the graph section" if header_end >= 0 else "has no graph section before it"
            raise PrecompileError(
                f"python_code's {name} section {where} (the sections are {', '.join(_SECTIONS)}, in that order): "
                "it was edited; load the python_code precompile() returned, or precompile again"
            )


def _refuse_transcoded(python_code: str, header_end: int) -> None:
    # precompile writes neither, and each would be reported as a damaged header
    # (a CRLF python_code has no graph marker, so the whole text is parsed as one).
    how = "read the file with open(path, encoding='utf-8-sig') as torch_precompile.files.load does"
    if python_code.startswith("\ufeff"):
        raise PrecompileError(
            "python_code starts with a byte-order mark (U+FEFF), which precompile never writes (an editor or "
            f"a re-encoding added it): remove it, or {how}"
        )
    if header_end < 0 and "\r\n" in python_code:  # its CRLF graph marker was not found
        raise PrecompileError(
            "python_code has CRLF line endings, which precompile never writes (a text-mode copy or git's "
            f"core.autocrlf converted them): restore LF line endings, or {how}"
        )


def _refuse_header_statement(node: ast.stmt) -> None:
    # load() reads the header's constants without running it; exec would run any
    # other statement, so the two would disagree on the same text.
    text = ast.unparse(node)
    shown = text if len(text) <= 80 else text[:77] + "..."
    raise PrecompileError(
        f"python_code's header (above the graph section) may only assign literals to {', '.join(_HEADER_CONSTANTS)}, "
        f"but line {node.lineno} is {shown!r}: the header was edited; "
        "load the python_code precompile() returned, or precompile again"
    )


def _read_convention(python_code: str) -> CallingConvention:
    return _convention_from(_read_constants(python_code))


def _convention_from(constants: dict[str, Any]) -> CallingConvention:
    literal = constants["CALLING_CONVENTION"]
    version = literal.get("format_version") if isinstance(literal, dict) else None
    _check_format_version("python_code", version, MIN_CONVENTION_VERSION, CONVENTION_VERSION)
    return CallingConvention.from_literal(literal)


def _check_format_version(what: str, version: Any, low: int, high: int) -> None:
    """The one check of a format version (python_code's convention, or the cache envelope's,
    which load() turns into ignoring the cache) against the range ``low..high`` this package reads."""
    if type(version) is int and low <= version <= high:
        return
    supported = f"the versions this torch.compiler.precompile supports ({low}..{high})"
    if type(version) is not int:  # bool is an int subclass: refuse it too
        raise PrecompileError(f"{what} has format version {version!r}, which is malformed (expected an int in {low}..{high}); it was edited")
    if version > high:
        raise PrecompileError(
            f"{what} has format version {version}, newer than {supported}; load it with the torch "
            "version that produced it, or precompile again"
        )
    raise PrecompileError(
        f"{what} has format version {version}, older than {supported}: it does not record "
        "everything the calling convention now checks; precompile again"
    )


def _is_sha256_hex(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")


def _kernel_hashes(constants: dict[str, Any]) -> dict[str, str] | None:
    """Kernel key -> sha256 of its compiled bytes, as python_code records it (None: not recorded)."""
    hashes = constants.get("KERNEL_SHA256")
    if hashes is None:
        return None
    if not isinstance(hashes, dict) or not all(
        isinstance(key, str) and _is_sha256_hex(digest)
        for key, digest in hashes.items()
    ):
        raise PrecompileError("python_code: KERNEL_SHA256 is malformed (expected {key: sha256 hex}); it was edited")
    return hashes


def _read_envelope(cache: bytes) -> dict:
    """The envelope ``_pack_envelope`` wrote, its blob references resolved; _CacheUnusable if damaged."""
    if not isinstance(cache, (bytes, bytearray, memoryview)):
        raise PrecompileError(
            f"cache: expected bytes, got {type(cache).__name__}; to load without a cache pass b'' "
            "(python_code is then compiled)"
        )
    data = bytes(cache)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data), **_ZIP_READ_OPTIONS)
    except Exception as error:  # any parser failure means damaged bytes
        raise _CacheUnusable(
            f"cache is damaged or not a precompile cache (not a zip archive: {str(error)[:200]})"
        ) from None
    try:
        with archive:
            _check_stored(archive, len(data))

            def resolve(value: dict) -> Any:
                name = value.get(_BLOB_REFERENCE) if len(value) == 1 else None
                return value if name is None else _stored_bytes(data, archive.getinfo(name))

            envelope = json.loads(archive.read(_ENVELOPE_ENTRY), object_hook=resolve)
    except _CacheUnusable:
        raise
    except Exception as error:  # any parser failure means damaged bytes
        raise _CacheUnusable(
            f"cache is damaged or not a precompile cache ({type(error).__name__}: {str(error)[:200]})"
        ) from None
    if not isinstance(envelope, dict) or envelope.get("format") != CACHE_FORMAT:
        raise _CacheUnusable("cache is damaged or not a precompile cache (unexpected envelope)")
    return envelope


def _stored_bytes(data: bytes, entry: zipfile.ZipInfo) -> bytes:
    """A stored entry's bytes, sliced from the archive.

    zipfile's reader copies in chunks and checks a CRC: ~1.5 ms per MB of
    kernels, which a warm load cannot spare.  Every blob is checked by sha256
    instead (the kernels by the payload hash and KERNEL_SHA256, the compiled
    parts by BYTECODE_SHA256), and envelope.json is read with its CRC.
    """
    if data[entry.header_offset : entry.header_offset + 4] != b"PK\x03\x04":
        raise _CacheUnusable(f"cache is damaged: entry {entry.filename!r} has no local header")
    name_length, extra_length = struct.unpack_from("<HH", data, entry.header_offset + 26)
    start = entry.header_offset + 30 + name_length + extra_length
    if start + entry.file_size > len(data):
        raise _CacheUnusable(f"cache is damaged: entry {entry.filename!r} runs past its end")
    return data[start : start + entry.file_size]


def _check_stored(archive: zipfile.ZipFile, size: int) -> None:
    """Refuse a cache that would inflate when read, before reading any entry.

    A genuine cache is a zip of stored (uncompressed) entries, so it never
    declares more bytes than it has.
    """
    entries = archive.infolist()
    declared = sum(entry.file_size for entry in entries)
    compressed = sum(entry.compress_type != zipfile.ZIP_STORED for entry in entries)
    if compressed or declared > size:
        raise _CacheUnusable(
            f"cache is damaged or not a precompile cache: it declares {declared} bytes in {size} "
            f"({compressed} compressed entries); refused before inflating it"
        )


_ENVELOPE_KEYS = {"format", "version", "backend", "code_hash", "build_env", "payload_sha256", "artifact"}


def _pair_error(code_hash: str, convention: CallingConvention, envelope: dict) -> PrecompileError | None:
    """Why the cache belongs to other code (load() refuses the pair), or None.

    _CacheUnusable if the fields that say so are damaged."""
    backend, recorded = envelope.get("backend"), envelope.get("code_hash")
    if not isinstance(backend, str) or not isinstance(recorded, str):
        raise _CacheUnusable("cache is damaged or not a precompile cache (unexpected envelope)")
    if backend != convention.backend:
        return PrecompileError(
            f"cache was built for backend {backend!r} but python_code is for "
            f"{convention.backend!r}: the pair does not belong together"
        )
    if recorded != code_hash:
        return PrecompileError(
            "cache belongs to a different python_code (code_hash mismatch): pass the cache "
            "returned together with this python_code"
        )
    return None


def _version_error(envelope: dict) -> _CacheUnusable | None:
    try:
        _check_format_version("cache", envelope.get("version"), MIN_CACHE_VERSION, CACHE_VERSION)
    except PrecompileError as error:  # the cache only accelerates: ignored, not refused
        return _CacheUnusable(str(error))
    return None


def _payload(envelope: dict) -> tuple[dict[str, bytes], dict[str, str]]:
    """The cache's kernels and their sha256, whatever code it is paired with; _CacheUnusable if damaged."""
    if set(envelope) != _ENVELOPE_KEYS:
        raise _CacheUnusable("cache is damaged or not a precompile cache (unexpected envelope)")
    artifact = envelope["artifact"]
    kernels = artifact.get("kernels") if isinstance(artifact, dict) else None
    well_formed = isinstance(kernels, dict) and all(
        isinstance(k, str) and isinstance(v, bytes) for k, v in kernels.items()
    )
    if not well_formed:
        raise _CacheUnusable("cache is damaged: its payload does not match its recorded sha256")
    digests = _kernel_digests(kernels)
    if _payload_hash(digests) != envelope["payload_sha256"]:
        raise _CacheUnusable("cache is damaged: its payload does not match its recorded sha256")
    return kernels, digests


class Artifact(schema.Record):
    """A ``(python_code, cache)`` pair as read and checked, with nothing executed.

    ``read_artifact`` makes it: the first stage of ``load()``, and what the
    inspector (``python -m torch._precompile inspect``) and the benchmarks
    read.  python_code's header must be readable (else PrecompileError); each
    verdict on the cache is recorded, not raised: ``load()`` raises
    ``pair_error``, and warns about ``version_error`` / ``cache_error`` and
    compiles from python_code; the inspector reports them.
    """

    python_code: str
    cache_size: int  # bytes
    constants: dict[str, Any]  # the header's literals: CALLING_CONVENTION, KERNEL_SHA256, BYTECODE_SHA256
    convention: CallingConvention  # decoded and validated
    kernel_hashes: dict[str, str] | None  # KERNEL_SHA256 (None: an older artifact records none)
    bytecode_hash: str | None  # BYTECODE_SHA256 (None: no compiled Python pinned)
    envelope: dict | None  # the cache's envelope (None: unreadable, see cache_error)
    kernels: dict[str, bytes]  # the cache's kernels, their payload sha256 checked ({} when not)
    kernel_digests: dict[str, str]  # the sha256 of each of them
    compiled: dict[str, bytes]  # the cache's marshalled header and sections, as BYTECODE_SHA256 pins them
    compiled_problem: str | None  # why the cache's compiled parts are not used, when they are not pinned
    pair_error: PrecompileError | None  # the cache is for another backend or another python_code
    version_error: PrecompileError | None  # the cache has another format version
    cache_error: PrecompileError | None  # the cache is unreadable or its payload damaged

    @property
    def pair_problem(self) -> PrecompileError | None:
        """Why ``load()`` would not use this pair's cache as is (None: they belong together)."""
        return self.pair_error or self.version_error


def read_artifact(
    python_code: str, cache: bytes, *, header_from_cache: bool = False, import_classes: bool = True
) -> Artifact:
    """Read ``(python_code, cache)`` without executing either: the envelope (JSON and
    raw entries), the header (``ast``), the pairing, version and payload checks.

    ``header_from_cache`` is load()'s warm path: the header's constants are
    the cache's copy that python_code pins, when it does (``_pinned_header``).
    ``import_classes=False`` (the inspector) imports not even the classes an
    input/output structure names: they stay ``NamedClass``es (``classes_by_name``).
    """
    if not isinstance(python_code, str):
        raise PrecompileError(f"python_code: expected str, got {type(python_code).__name__}")
    envelope, cache_error = None, None
    try:
        envelope = _read_envelope(cache)
    except _CacheUnusable as problem:
        cache_error = problem
    source_hash, code_hash = _text_hashes(python_code)
    pinned = (
        _pinned_header(python_code, envelope, source_hash) if header_from_cache and envelope is not None else None
    )
    constants = pinned[0] if pinned else _read_constants(python_code)
    with contextlib.nullcontext() if import_classes else schema.classes_by_name():
        convention = _convention_from(constants)
    hashes, bytecode_hash = _kernel_hashes(constants), _bytecode_hash(constants)  # malformed: refused first
    kernels, digests, compiled, compiled_problem, pair_error, version_error = {}, {}, {}, None, None, None
    if envelope is not None:
        try:
            pair_error = _pair_error(code_hash, convention, envelope)
            version_error = _version_error(envelope)
            kernels, digests = _payload(envelope)
            compiled, compiled_problem = (
                (pinned[1], None) if pinned else _pinned_parts(envelope, bytecode_hash, source_hash)
            )
        except _CacheUnusable as problem:
            cache_error = problem
    return Artifact(
        python_code=python_code,
        cache_size=memoryview(cache).nbytes,
        constants=constants,
        convention=convention,
        kernel_hashes=hashes,
        bytecode_hash=bytecode_hash,
        envelope=envelope,
        kernels=kernels,
        kernel_digests=digests,
        compiled=compiled,
        compiled_problem=compiled_problem,
        pair_error=pair_error,
        version_error=version_error,
        cache_error=cache_error,
    )
