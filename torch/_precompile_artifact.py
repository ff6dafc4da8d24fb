"""Writing and running a ``torch.compiler.precompile`` artifact.

What ``precompile()`` does after capture and lowering -- run the artifact once
to harvest its compiled kernels, record their hashes and the compiled sections'
hash in the header, pack the cache -- and what ``load()`` does with a pair:
decide what of the cache it may use, place the verified kernels in the kernel
store, and execute python_code's sections, compiling only those the cache does
not hold (the driver section is the installed driver when it is its exact
text).  ``_precompile`` (the public API) imports this module at the first
``precompile()`` or ``load()``, so the first access to
``torch.compiler.precompile`` imports neither the driver nor the format.
"""

import functools
import hashlib
import json
import linecache
import logging
import marshal
import pprint
import warnings
from typing import Any, Callable

import torch

from . import _precompile_compat as compat, _precompile_runtime as runtime
from ._precompile_format import (
    _BYTECODE_MAGIC,
    _build_environment,
    _CACHED_PARTS,
    _code_hash,
    _has_gpu_kernels,
    _host_environment,
    _is_installed_driver,
    _kernel_digests,
    _marker,
    _NO_BYTECODE,
    _pack_envelope,
    _payload_hash,
    _pin_line,
    _read_constants,
    _section_spans,
    _split_sections,
    _text_hashes,
    Artifact,
    CACHE_FORMAT,
    CACHE_VERSION,
    GPU_KERNEL_SUFFIX,
)
from ._precompile_schema import CallingConvention, PrecompileError


# The public module's logger, which TORCH_LOGS=precompile enables.
log = logging.getLogger(__name__.replace("_precompile_artifact", "_precompile"))


# ---------------------------------------------------------------------------
# precompile: harvest kernels -> record their hashes -> pin the compiled
# sections -> pack the cache.
# ---------------------------------------------------------------------------


def _package(python_code: str, backend: str, kernels: dict[str, bytes], bytecode: bytes | None = None) -> bytes:
    return _pack_envelope(
        {
            "format": CACHE_FORMAT,
            "version": CACHE_VERSION,
            "backend": backend,
            "code_hash": _text_hashes(python_code)[1],
            "build_env": _build_environment(gpu=_has_gpu_kernels(kernels)),
            "payload_sha256": _payload_hash(_kernel_digests(kernels)),
            "artifact": {"kernels": kernels, "bytecode": {"magic": _BYTECODE_MAGIC, "code": bytecode}},
        }
    )


def _record_kernel_hashes(python_code: str, kernels: dict[str, bytes]) -> str:
    """python_code with KERNEL_SHA256 (kernel key -> sha256 of its compiled bytes) in its header.

    The cache is bound to python_code by code_hash, so this binds each cache
    key to its bytes: load() never runs a kernel under another kernel's key.
    """
    hashes = dict(sorted(_kernel_digests(kernels).items()))
    header_end = python_code.index(_marker("graph"))
    recorded = f"\nKERNEL_SHA256 = {pprint.pformat(hashes, width=100)}\n"
    return python_code[:header_end] + recorded + python_code[header_end:]


def _record_bytecode(python_code: str) -> tuple[str, bytes]:
    """python_code with BYTECODE_SHA256 set, and the marshalled parts it pins.

    The sections are compiled first: replacing the placeholder line keeps every
    line number and the sections' text, so their code objects stay exact.  The
    header's constants are all but BYTECODE_SHA256 itself.
    """
    source_hash = _code_hash(python_code)  # = _text_hashes()[0] of the result
    compiled = _compile_sections(python_code, source_hash)
    header = {name: value for name, value in _read_constants(python_code).items() if name != "BYTECODE_SHA256"}
    parts = {"header": header, **compiled}
    # Each part marshalled on its own: load() unmarshals only those it needs.
    bytecode = marshal.dumps((source_hash, {name: marshal.dumps(parts[name]) for name in _CACHED_PARTS}))
    return python_code.replace(_NO_BYTECODE, _pin_line(hashlib.sha256(bytecode).hexdigest()), 1), bytecode


def _harvest_kernels(python_code: str, example_inputs: list) -> dict[str, bytes]:
    """Run the artifact once (JIT, Inductor's cache is warm) and keep its kernels.

    Triton kernels are autotuned at their first launch, so the graph runs once
    on copies of the example inputs; each keeps the binary of the config that
    won and the record of how to launch it (``TritonLaunch``).  With free dims
    the example inputs are fakes: each kernel then keeps Inductor's first
    (heuristically preferred) config, untuned.
    """
    namespace = _exec_artifact(python_code, _read_constants(python_code), {})
    kernels = {}
    loader = namespace.get("_kernel_loader")  # none when Inductor generated no module
    for key, path in (loader.compiled if loader else {}).items():
        with open(path, "rb") as f:
            kernels[key] = f.read()
    if loader and loader.compiled_triton:
        if not any(compat.is_fake(t) or isinstance(t, torch.SymInt) for t in example_inputs):
            with torch.no_grad(), compat.autocast_disabled():  # as a call runs it (the graph holds autocast's casts)
                namespace["_run_graph"]([_copy_of(t) for t in example_inputs])
        for key, autotuner in loader.compiled_triton.items():
            launch = compat.triton_launch_record(autotuner)
            if launch is None:  # not statically launchable: load() compiles it from python_code
                log.info("precompile: Triton kernel %s stays JIT-compiled at load", autotuner.fn.__name__)
                continue
            record, cubin = launch
            kernels[key + ".json"] = json.dumps(record, sort_keys=True).encode()
            kernels[key + GPU_KERNEL_SUFFIX] = cubin
    return kernels


def _copy_of(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device).copy_(value)


# ---------------------------------------------------------------------------
# load: read_artifact (envelope, header: the cache's pinned copy or ast, pairing,
# payload) -> usable cache -> prime kernels -> warn -> exec.
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    # Called by load()'s helpers: the warning points at load()'s caller.
    warnings.warn(message, stacklevel=4)


def _usable_cache(artifact: Artifact) -> tuple[dict, dict]:
    """What this load may use of the cache, warning about the rest: key -> (sha256,
    bytes) of the kernels, and part -> marshalled code of python_code's compiled sections."""
    if artifact.pair_error is not None:
        raise artifact.pair_error
    problem = artifact.version_error or artifact.cache_error
    if problem is not None:
        warnings.warn(
            f"torch.compiler.precompile: ignoring the cache: {problem}; compiling from python_code "
            "instead (slower first call)",
            stacklevel=3,
        )
        return {}, {}
    if artifact.compiled_problem is not None:
        _warn_once(f"torch.compiler.precompile: {artifact.compiled_problem}; compiling python_code instead")
    return _usable_kernels(artifact), artifact.compiled


def _usable_kernels(artifact: Artifact) -> dict:
    if not artifact.kernels:
        return {}
    built = artifact.envelope["build_env"]
    here = _host_environment(built)
    if built != here:
        _warn_once(
            f"torch.compiler.precompile: the cache's kernels were built for {built!r}, "
            f"this process runs {here!r}; compiling the kernels from python_code instead (slower first call)"
        )
        return {}
    return _bound_kernels(artifact.kernels, artifact.kernel_digests, artifact.kernel_hashes)


def _refuse_kernels_for_an_unknown_isa(artifact: Artifact, kernels: dict) -> None:
    """Note invariant 9: an Inductor artifact older than INDUCTOR_VEC_ISA has C++ written for
    the vector ISA of the host that made it, which only its cache's build environment tells
    (the CPU capability).  Its own driver compiles that C++ for this host's ISA, whose other
    width makes the loops step wrong: refused where a kernel must be compiled here and that
    host's capability is another or unknown."""
    constants = artifact.constants
    if artifact.convention.backend != "inductor" or "INDUCTOR_VEC_ISA" in constants:
        return
    recorded = artifact.kernel_hashes
    if recorded is not None and all(key in kernels or key.endswith(GPU_KERNEL_SUFFIX) for key in recorded):
        return
    built = (artifact.envelope or {}).get("build_env")
    built_for = built.get("cpu_capability") if isinstance(built, dict) else None
    here = torch.backends.cpu.get_cpu_capability()
    if built_for == here:
        return
    made = f"was {built_for} (its cache's build environment)" if built_for else "its cache does not record"
    raise PrecompileError(
        "this artifact predates INDUCTOR_VEC_ISA and its C++ kernels must be compiled here: that C++ was "
        f"written for the vector ISA of the host that made it, whose CPU capability {made}, while this "
        f"machine's is {here}; compiled for another ISA it computes wrong results: precompile again on "
        "this machine"
    )


def _bound_kernels(kernels: dict[str, bytes], digests: dict[str, str], hashes: dict[str, str] | None) -> dict:
    """The kernels whose bytes hash to what python_code records for their key.

    A cache's own hashes can be recomputed by whoever edits it; python_code's
    are bound to the cache by code_hash, so rotated or swapped kernels are
    compiled instead of being run with the wrong arguments.
    """
    if hashes is None:
        warnings.warn(
            "torch.compiler.precompile: python_code records no hashes of its compiled kernels (made by an "
            "older version); compiling them from python_code instead of loading the cache's",
            stacklevel=4,
        )
        return {}
    bound = {key: (digests[key], blob) for key, blob in kernels.items() if hashes.get(key) == digests[key]}
    if len(bound) < len(kernels):
        warnings.warn(
            f"torch.compiler.precompile: {len(kernels) - len(bound)} of the cache's {len(kernels)} kernels "
            "do not match the sha256 python_code records for them (a forged or mixed-up cache); "
            "compiling those from python_code instead",
            stacklevel=4,
        )
    return bound


def _prime_kernels(kernels: dict) -> dict[str, str]:
    """Place the verified kernels in a private store; key -> path of a file holding exactly its bytes."""
    if not kernels:
        return {}
    from . import _precompile_kernel_store as kernel_store  # imported by the first load that has kernels

    preferred = kernel_store.kernel_directory()
    try:
        return kernel_store.place_kernels(kernel_store.private_directory(preferred), kernels)
    except kernel_store.StoreUnusable as problem:
        store_problem = str(problem)
    try:
        fallback = kernel_store.fallback_directory()
        files = kernel_store.place_kernels(fallback, kernels)
    except kernel_store.StoreUnusable as problem:
        raise PrecompileError(
            f"cannot write the cache's compiled kernels, neither to the kernel store ({store_problem}) nor to "
            f"a private temporary directory ({problem}); set TORCHINDUCTOR_CACHE_DIR to a writable directory"
        ) from None
    _warn_once(
        f"torch.compiler.precompile: not using the kernel store {preferred} ({store_problem}); "
        f"using the private directory {fallback} for this process"
    )
    return files


def _exec_artifact(
    python_code: str,
    constants: dict[str, Any],
    kernel_files: dict[str, str],
    convention: CallingConvention | None = None,
    compiled: dict[str, bytes] | None = None,
) -> dict:
    """Run python_code as ``exec`` would, compiling only the sections this process needs.

    The header's constants were read already (and ``convention``, when given,
    decoded and validated from them); the driver section is compiled only when
    the installed driver is not its exact text, and a section is not compiled
    at all when ``compiled`` (the cache's marshalled parts) has it.
    """
    spans = _section_spans(python_code)
    compiled = compiled or {}
    # Hashed once, and only if a section is compiled here (the cache has no driver
    # since cache version 11): the file name the cache's parts were compiled under.
    filename = functools.cache(lambda: _artifact_filename(_text_hashes(python_code)[0]))

    def code(name: str) -> Any:
        if name in compiled:
            return marshal.loads(compiled[name])
        start, end = spans[name]
        return _compile_section_of(python_code, filename(), start, python_code[start:end])

    namespace = {
        "__name__": "torch_precompile_artifact",
        **constants,
        "__precompile_kernel_files__": kernel_files,
    }
    graph = code("graph")
    _register_source(python_code, graph.co_filename)
    exec(graph, namespace)
    driver = namespace["__precompile_driver__"] = _driver_namespace(python_code, spans["driver"], lambda: code("driver"))
    if convention is not None and driver is vars(runtime):  # the installed driver's records: no second decode
        namespace["__precompile_convention__"] = convention
    exec(code("forward"), namespace)
    return namespace


def _compile_section_of(python_code: str, filename: str, start: int, text: str) -> Any:
    # Its lines are counted only when a section is compiled (~0.2 ms per 300 KB
    # of python_code): a warm load takes every section from the cache or the
    # installed driver.
    return _compile_section(filename, python_code.count("\n", 0, start), text)


def _compile_section(filename: str, line_offset: int, text: str) -> Any:
    # Blank lines in front: tracebacks give the line numbers of python_code as a whole.
    return compile("\n" * line_offset + text, filename, "exec", dont_inherit=True)


def _compile_sections(python_code: str, source_hash: str) -> dict[str, Any]:
    filename = _artifact_filename(source_hash)
    return {name: _compile_section_of(python_code, filename, *text) for name, text in _split_sections(python_code).items()}


def _artifact_filename(source_hash: str) -> str:
    """The file name python_code's code runs under, after its source hash (``_text_hashes``).

    Like torch.fx's ``<eval_with_key>.N``, it is not of the form ``<...>``,
    for which linecache serves only lines registered already split.
    """
    return f"<precompile artifact {source_hash[:12]}>.py"


def _register_source(python_code: str, filename: str) -> None:
    """Let tracebacks, pdb and inspect show python_code's lines under ``filename``.

    Registered lazily, as torch.fx does (linecache splits the text when a
    traceback first asks): splitting costs a warm load ~1 ms per 400 KB.
    """
    linecache.cache[filename] = (lambda: python_code,)


def _driver_namespace(python_code: str, span: tuple[int, int], compiled: Callable[[], Any]) -> dict:
    """The artifact's driver: the installed module when the driver section (``span`` of python_code) is its exact text.

    Importing ``torch._precompile_runtime`` reuses Python's cached bytecode;
    otherwise ``compiled()`` gives the section's code (the cache's, or compiled
    now: ~8 ms).
    """
    if _is_installed_driver(python_code, *span):
        return vars(runtime)
    namespace = {"__name__": "torch_precompile_driver"}
    exec(compiled(), namespace)
    return namespace


def _check_gpus_present(convention: CallingConvention) -> None:
    """Refuse, before executing anything, an artifact whose tensors live on GPUs this process lacks."""
    devices = [spec.tensor.device for spec in convention.state]
    devices += [leaf.tensor.device for leaf in convention.inputs if leaf.tensor is not None]
    devices += [constant.device for constant in convention.constants]
    cuda = sorted({torch.device(d) for d in devices if d.startswith("cuda")}, key=str)
    if not cuda:
        return
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = [str(d) for d in cuda if (d.index or 0) >= available]
    if missing:
        raise PrecompileError(
            f"this artifact was captured on {', '.join(str(d) for d in cuda)} and needs "
            f"{', '.join(missing)}, but this process sees {available} CUDA GPU(s); load it on a host "
            "with the GPU, or precompile again with the model and inputs on the CPU"
        )
