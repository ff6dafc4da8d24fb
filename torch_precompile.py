"""Entry point of the torch-precompile distribution (group ``torch.backends``).

``import torch`` runs every ``torch.backends`` entry point at its end and turns
any exception into a ``RuntimeError`` that aborts ``import torch`` itself.  This
shim is that entry point.  It attaches ``precompile`` / ``PrecompileError`` to
``torch.compiler`` lazily and never raises:

* The names go into ``torch.compiler.__all__`` at once, and a module
  ``__getattr__`` on ``torch.compiler`` imports ``torch._precompile`` (which
  sets the real attributes) at the first access, so ``import torch`` pays well
  under a millisecond instead of importing the implementation (~5 ms with
  bytecode cached, ~35 ms without).  The ``precompile`` log alias is registered
  now, so ``TORCH_LOGS=precompile`` is valid when torch parses it.
* Split installs: when this distribution is installed into a different
  site-packages directory than torch (a ``venv --system-site-packages`` over a
  system torch, ``pip install --user``), its ``torch/_precompile*.py`` files
  are not on ``torch.__path__`` (torch is a regular package, searched only in
  its own directory).  The shim appends its sibling ``torch/`` directory, which
  holds only this distribution's files, to ``torch.__path__``.

It is a top-level module, rather than an entry point at
``torch._precompile:_attach``, because loading an entry point imports its
module outside any try/except of ours: a module that fails to import there
breaks ``import torch`` for everyone.

``import torch_precompile`` attaches too, in any layout (useful with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); ``import torch._precompile`` attaches
eagerly whenever the files sit next to torch's own.
"""

import os
import sys


_NAMES = ("precompile", "PrecompileError")
_MODULE = "torch._precompile"


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

            # Re-entrant access while torch._precompile is importing (in this
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
    """Attach torch.compiler.precompile (lazily); never raises (warns on failure)."""
    try:
        import torch
        import torch.compiler as compiler

        ours = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch")
        path = getattr(torch, "__path__", None)
        if (
            path is not None
            and os.path.isfile(os.path.join(ours, "_precompile.py"))
            and not os.path.isfile(os.path.join(ours, "__init__.py"))  # never a second torch
            and not any(os.path.realpath(p) == os.path.realpath(ours) for p in path)
        ):
            path.append(ours)

        if _MODULE in sys.modules:  # already imported: attach for real
            sys.modules[_MODULE]._attach()
            return
        previous = compiler.__dict__.get("__getattr__")
        if not getattr(previous, "_torch_precompile_lazy", False):
            compiler.__getattr__ = _make_lazy_getattr(previous)
        for name in _NAMES:
            if name not in compiler.__all__:
                compiler.__all__.append(name)
        from torch._precompile_compat import register_log_alias

        register_log_alias("precompile", _MODULE)
    except Exception as error:  # never break `import torch` for everyone
        _warn(error)


_attach()
