"""torch 2.15's file-based precompile front-end, on top of ``precompile`` / ``load``.

Installed this module is ``torch_precompile.files`` (an alias of
``torch_precompile._precompile_files``); it mirrors torch 2.15's
``torch.compiler.precompile`` module, so code written for that prototype
switches by changing one import::

    from torch_precompile import files as precompile   # torch 2.15: from torch.compiler import precompile

    with precompile.capture(step, artifact_path="step.py", cache_path="step.cache") as cap:
        loss = cap(model, x, y)        # a real call: eager's result and side effects
    # leaving the block wrote step.py and step.cache

    with precompile.load("step.py", "step.cache") as step:   # another process
        loss = step(model, x, y)

The pair written is exactly ``precompile(fn, *args, backend=...)``'s
``(python_code, cache)``: ``python_code`` as UTF-8 text to ``artifact_path``,
``cache`` to ``cache_path``; ``load`` reads them (the artifact as Python reads
source: CRLF line endings and a UTF-8 byte-order mark undone) and calls
``precompile.load``.
Everything else (the contract, the per-call checks, trust) is
Note [precompile programming model] in ``_precompile.py``.

How one call is captured (``Capture.__call__``): ``precompile`` first traces
fn on clones of the arguments -- it leaves the caller's parameters, buffers,
``.grad``, inputs and RNG exactly as they were, and refuses fn before anything
changed -- then fn runs once, eagerly, on the real arguments, and that call's
result and side effects (``.grad`` accumulated once, running stats, an
optimizer step) are the caller's.  fn's Python therefore runs twice for the
call (the trace, then the real call): plain Python side effects (printing,
appending to a list) happen twice.
"""

import dataclasses
import os
from typing import Any, Callable

from . import _precompile_inspect as inspect_artifact
from ._precompile import BACKENDS, precompile
from ._precompile_format import describe_arguments
from ._precompile_kernel_store import write_atomically
from ._precompile_schema import PrecompileError


__all__ = [
    "Capture",
    "capture",
    "load",
    "MakeFxTracer",
    "PrecompiledRunnable",
    "PrecompileError",
    "PrecompileSummary",
]


class MakeFxTracer:
    """The capture front-end: a non-strict make_fx trace of one call (``precompile``'s ``tracer="make_fx"``).

    It takes exactly one call: a ``Capture`` refuses a second.  ``decompositions``
    is forwarded to make_fx as ``precompile``'s argument of that name.  The
    tracer holds no state, so one instance may serve any number of captures.
    """

    def __init__(self, *, decompositions: dict | None = None):
        self.decompositions = decompositions

    def __repr__(self) -> str:
        return "MakeFxTracer()" if self.decompositions is None else "MakeFxTracer(decompositions=...)"


def _tracer(tracer: Any) -> MakeFxTracer:
    if isinstance(tracer, MakeFxTracer):
        return tracer
    if isinstance(tracer, str) and tracer == "make_fx":
        return MakeFxTracer()
    raise PrecompileError(
        f"capture: tracer must be MakeFxTracer() (or the string 'make_fx'), the only tracer this "
        f"package implements; got {tracer!r}.  Pass tracer=MakeFxTracer() or leave tracer out"
    )


def _path(argument: str, path: Any) -> str:
    try:
        path = os.path.abspath(os.fsdecode(path))  # a bytes path too: tempfile refuses mixing it with str
    except TypeError:
        raise PrecompileError(
            f"{argument} must be a str, bytes or os.PathLike file path, got {type(path).__name__}"
        ) from None
    if os.path.isdir(path):
        raise PrecompileError(f"{argument} {path!r} is a directory; give the path of a file to write")
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise PrecompileError(
            f"{argument} {path!r}: its directory {directory!r} does not exist; create it before capturing"
        )
    return path


class Capture:
    """One call of ``fn``, captured to ``(artifact_path, cache_path)``; made by ``capture()``.

    ``cap(*args)`` precompiles ``fn`` from ``args`` and runs ``fn(*args)``
    eagerly, returning its result (see the module docstring for the order).
    Leaving a ``with`` block that made the call writes the pair, unless
    ``save()`` already did; a block that raises writes nothing ``save()``
    has not written; a block without a successful call raises
    ``PrecompileError``.  Single-use: one call, one ``with`` block.
    """

    def __init__(self, fn: Callable, artifact_path: str, cache_path: str, tracer: MakeFxTracer, backend: str):
        self._fn, self._tracer, self._backend = fn, tracer, backend
        self.artifact_path, self.cache_path = artifact_path, cache_path
        self._pair: tuple[str, bytes] | None = None
        self._called = self._entered = self._closed = self._saved = False

    def __repr__(self) -> str:
        return (
            f"Capture({getattr(self._fn, '__qualname__', self._fn)!r}, artifact_path={self.artifact_path!r}, "
            f"cache_path={self.cache_path!r}, backend={self._backend!r})"
        )

    def __enter__(self) -> "Capture":
        if self._entered or self._closed:
            raise PrecompileError(
                f"{self!r} was already used in a with block; a capture is single-use: call capture() again"
            )
        self._entered = True
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self._closed = True
        if exc_type is not None:
            return  # write nothing save() has not written; the exception propagates
        if self._pair is None:
            raise PrecompileError(
                f"{self!r}: the with block made no successful call, so there is nothing to write: "
                "call cap(*args) once inside the block"
            )
        if not self._saved:
            self.save()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise PrecompileError(
                f"{self!r}: keyword arguments {sorted(kwargs)} are not supported (the calling convention is "
                "positional); pass them positionally"
            )
        if self._closed:
            raise PrecompileError(
                f"{self!r} is closed (its with block exited); a capture is single-use: call capture() again"
            )
        if self._called:
            raise PrecompileError(
                f"{self!r} already took its call: MakeFxTracer captures exactly one call of fn; "
                "use another capture() for another call, or call the loaded runnable"
            )
        self._called = True  # a call that raises consumes the capture too
        pair = precompile(self._fn, *args, backend=self._backend, decompositions=self._tracer.decompositions)
        result = self._fn(*args)
        self._pair = pair
        return result

    def save(self) -> None:
        """Write the captured pair now, cache first, each atomically (a temp file, then ``os.replace``).

        The files are readable by their owner only (mode 0600, as ``tempfile``
        creates them): the artifact is code that ``load`` executes.  A write
        that fails raises ``PrecompileError`` naming the path; ``save()`` may
        then be called again.
        """
        if self._pair is None:
            raise PrecompileError(
                f"{self!r}: nothing to save: "
                + ("its call raised" if self._called else "call cap(*args) first")
            )
        python_code, cache = self._pair
        for argument, path, blob in (
            ("cache_path", self.cache_path, cache),
            ("artifact_path", self.artifact_path, python_code.encode("utf-8")),
        ):
            try:
                write_atomically(os.path.dirname(path), path, blob)
            except OSError as error:  # its own message names write_atomically's temp file
                raise PrecompileError(
                    f"{self!r}: cannot write {argument} {path!r} ({error.strerror}): its directory must exist "
                    "and be writable and the path must not be a directory; fix that and call save() again"
                ) from error
        self._saved = True

    def summary(self) -> "PrecompileSummary":
        """The summary of the captured pair (before or after it is written)."""
        if self._pair is None:
            raise PrecompileError(f"{self!r}: no successful call captured yet: call cap(*args) first")
        return PrecompileSummary._of(*self._pair)


def capture(
    fn: Callable,
    /,
    *,
    artifact_path: str | os.PathLike,
    cache_path: str | os.PathLike,
    tracer: MakeFxTracer | str = MakeFxTracer(),
    backend: str = "inductor",
) -> Capture:
    """A ``Capture`` of one call of ``fn``: ``with capture(fn, ...) as cap: result = cap(*args)``.

    ``artifact_path`` receives ``python_code`` (UTF-8), ``cache_path`` the cache
    bytes; their directories must exist.  ``backend`` is ``"inductor"`` or
    ``"eager"``, as for ``precompile``.  Arguments are checked here, before any
    call; each error is a ``PrecompileError`` naming the argument.
    """
    if not callable(fn):
        raise PrecompileError(f"capture: fn must be callable, got {type(fn).__name__}")
    if backend not in BACKENDS:
        raise PrecompileError(f"capture: backend must be one of {BACKENDS}, got {backend!r}")
    tracer = _tracer(tracer)
    artifact_path, cache_path = _path("artifact_path", artifact_path), _path("cache_path", cache_path)
    if artifact_path == cache_path:
        raise PrecompileError(
            f"capture: artifact_path and cache_path are the same file {artifact_path!r}; pass two different paths"
        )
    return Capture(fn, artifact_path, cache_path, tracer, backend)


def _read(argument: str, path: Any, text: bool) -> Any:
    try:
        with open(path, "r" if text else "rb", **({"encoding": "utf-8-sig"} if text else {})) as f:
            return f.read()
    except (OSError, TypeError) as error:
        raise PrecompileError(f"load: cannot read {argument} {path!r} ({error})") from error
    except UnicodeDecodeError as error:
        raise PrecompileError(
            f"load: {argument} {path!r} is not UTF-8 text ({error.reason}), so not a precompile artifact; "
            "did you swap artifact_path and cache_path?"
        ) from None


class PrecompiledRunnable:
    """What ``load`` returns: ``fn``'s calling convention, checked at every call.

    A context manager that calls ``unload()`` on exit.  ``unload()`` drops
    this object's reference to the loaded artifact (its graph, driver and
    namespace); kernels already imported stay in the process, since Python
    cannot unload extension modules.  A call after ``unload()`` raises
    ``PrecompileError``.
    """

    def __init__(self, forward: Callable, artifact_path: str, cache_path: str):
        self._forward: Callable | None = forward
        self.artifact_path, self.cache_path = artifact_path, cache_path

    def __repr__(self) -> str:
        state = "unloaded" if self._forward is None else "loaded"
        return f"PrecompiledRunnable({self.artifact_path!r}, {self.cache_path!r}, {state})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._forward is None:
            raise PrecompileError(f"{self!r}: unload() was called; load the files again to call it")
        return self._forward(*args, **kwargs)

    def unload(self) -> None:
        self._forward = None

    def __enter__(self) -> "PrecompiledRunnable":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.unload()


def load(artifact_path: str | os.PathLike, cache_path: str | os.PathLike) -> PrecompiledRunnable:
    """Read the pair ``capture`` wrote and ``precompile.load`` it; executes the artifact: trusted files only."""
    python_code = _read("artifact_path", artifact_path, text=True)
    cache = _read("cache_path", cache_path, text=False)
    return PrecompiledRunnable(precompile.load(python_code, cache), os.fspath(artifact_path), os.fspath(cache_path))


@dataclasses.dataclass(frozen=True)
class PrecompileSummary:
    """What a captured pair holds and what every call of it checks, read without executing it.

    Unlike torch 2.15's ``PrecompileSummary``, which reports a Dynamo-based
    capture's coverage (graph breaks) and its guards (kept, dropped, risky),
    this capture has neither: fn is one make_fx graph or refused, and it has
    no guards -- the driver's checks listed in ``checks`` take their place,
    and a call that fails one raises ``PrecompileError``.  ``report`` is the
    inspector's full report (``python -m torch_precompile inspect``).
    """

    backend: str
    arguments: tuple[str, ...]  # one line per positional argument, as python_code's header states them
    parameters: int
    buffers: int
    inputs: int  # pytree leaves of the non-module arguments (tensors and baked values)
    outputs: int
    grad_parameters: int  # parameters whose .grad each call writes
    kernels: int  # compiled kernels in the cache (0 for backend="eager")
    # What the driver checks before every call, one line each (f.checks); None where the
    # artifact carries a driver other than the installed one (inspect_artifact.OWN_DRIVER).
    checks: tuple[str, ...] | None
    report: dict = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_files(cls, artifact_path: str | os.PathLike, cache_path: str | os.PathLike) -> "PrecompileSummary":
        """The summary of a pair on disk; executes nothing."""
        return cls._of(_read("artifact_path", artifact_path, text=True), _read("cache_path", cache_path, text=False))

    @classmethod
    def _of(cls, python_code: str, cache: bytes) -> "PrecompileSummary":
        artifact = inspect_artifact.read(python_code, cache)
        report = inspect_artifact.report(artifact)
        convention = artifact.convention
        return cls(
            backend=convention.backend,
            arguments=tuple(describe_arguments(convention)),
            parameters=report["parameters"]["count"],
            buffers=report["buffers"]["count"],
            inputs=len(report["inputs"]),
            outputs=len(report["outputs"]),
            grad_parameters=len(report["grad_params"]),
            kernels=report["kernels"]["count"],
            checks=None if report["checks"] is None else tuple(report["checks"]),  # as f.checks gives it
            report=report,
        )

    def __str__(self) -> str:
        lines = [f"precompile summary: backend {self.backend!r}, {self.kernels} kernels"]
        lines += [f"  {line}" for line in self.arguments]
        lines.append(
            f"  {self.parameters} parameters, {self.buffers} buffers, {self.inputs} input leaves, "
            f"{self.outputs} output leaves, .grad written for {self.grad_parameters} parameters"
        )
        if self.checks is None:
            lines.append(f"  checked at every call: {inspect_artifact.OWN_DRIVER}")
        else:
            lines.append("  checked at every call:")
            lines += [f"    {check}" for check in self.checks]
        return "\n".join(lines)


