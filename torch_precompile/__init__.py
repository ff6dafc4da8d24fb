"""torch-precompile: ``torch_precompile.precompile`` / ``load`` / ``PrecompileError``.

The implementation is ``torch/_precompile*.py`` in the repository (the in-tree
form for a PyTorch checkout, see ``patches/``).  Installed, those files are
this package's modules: ``setup.py`` copies them in for a regular install, and
an editable install finds them in the repository's ``torch/`` directory
(appended to ``__path__`` below).  Nothing is installed under torch's own
directory, so installing and uninstalling never touch torch's files.

Names that work on every supported torch (2.11-2.14)::

    python_code, cache = torch_precompile.precompile(fn, *example_inputs)
    runnable = torch_precompile.load(python_code, cache)  # = precompile.load

    from torch_precompile import files  # torch 2.15's file-based front-end
    with files.capture(fn, artifact_path="f.py", cache_path="f.cache") as cap:
        result = cap(*args)  # a real call; leaving the block writes the two files
    runnable = files.load("f.py", "f.cache")

This package is also the entry point of the group ``torch.backends``, which
``import torch`` runs at its end, turning any exception into a ``RuntimeError``
that aborts ``import torch`` itself.  ``_attach`` therefore never raises
(it warns), and is cheap:

* On torch without a precompile of its own (2.11-2.13) it attaches
  ``precompile`` / ``PrecompileError`` to ``torch.compiler`` lazily: the names
  go into ``torch.compiler.__all__`` at once, and a module ``__getattr__`` on
  ``torch.compiler`` imports the implementation at the first access, so
  ``import torch`` pays well under a millisecond.  torch 2.14+ ships its own
  ``torch.compiler.precompile``, which is left untouched.
* The ``precompile`` and ``precompile_checks`` log aliases are registered now,
  so ``TORCH_LOGS=precompile`` (each stage's time) and
  ``TORCH_LOGS=precompile_checks`` (what a loaded artifact checks at every
  call) are valid when torch parses them.

``import torch_precompile`` attaches too (useful with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), and so does importing the implementation.
"""

import os
import sys


_NAMES = ("precompile", "PrecompileError")
_MODULE = __name__ + "._precompile"

# Editable install: the modules are the repository's torch/_precompile*.py.
_SOURCES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch")
if not os.path.isfile(os.path.join(__path__[0], "_precompile.py")) and not os.path.isfile(
    os.path.join(_SOURCES, "__init__.py")  # never torch's own directory
):
    __path__.append(_SOURCES)


def __getattr__(name: str):
    if name not in ("precompile", "load", "PrecompileError", "files", "generation"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    if name in ("files", "generation"):  # the submodule aliases, imported at first access like the rest
        return importlib.import_module(f"{__name__}.{name}")
    module = importlib.import_module(_MODULE)
    return module.precompile.load if name == "load" else getattr(module, name)


def _warn(error: BaseException) -> None:
    import warnings

    warnings.warn(
        f"torch-precompile: torch.compiler.precompile is unavailable ({type(error).__name__}: {error})",
        RuntimeWarning,
        stacklevel=3,
    )


def _make_lazy_getattr(previous):
    def __getattr__(name: str):
        if name not in _NAMES:
            if previous is not None:
                return previous(name)
            raise AttributeError(f"module 'torch.compiler' has no attribute {name!r}")
        try:
            import importlib

            # Re-entrant access while the implementation is importing (in this
            # thread) gets the partial module and an AttributeError, which is
            # what getattr(torch.compiler, name, None) expects then.
            module = importlib.import_module(_MODULE)
        except Exception as error:
            _warn(error)
            raise AttributeError(f"module 'torch.compiler' has no attribute {name!r} ({error})") from error
        return getattr(module, name)

    __getattr__._torch_precompile_lazy = True
    return __getattr__


def _attach() -> None:
    """Attach torch.compiler.precompile (lazily) unless torch has its own; never raises (warns on failure)."""
    try:
        import torch.compiler as compiler

        from ._precompile_compat import register_log_alias

        register_log_alias("precompile", _MODULE)
        register_log_alias("precompile_checks", _MODULE + "_checks")  # _precompile.checks_log
        if _MODULE in sys.modules:  # already imported: it attached itself (or left torch's own)
            sys.modules[_MODULE]._attach()
            return
        if "precompile" in vars(compiler):  # torch 2.14+: torch.compiler.precompile is torch's own
            return
        previous = compiler.__dict__.get("__getattr__")
        if not getattr(previous, "_torch_precompile_lazy", False):
            compiler.__getattr__ = _make_lazy_getattr(previous)
        for name in _NAMES:
            if name not in compiler.__all__:
                compiler.__all__.append(name)
    except Exception as error:  # never break `import torch` for everyone
        _warn(error)


_attach()
