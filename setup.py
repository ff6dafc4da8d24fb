"""Install torch-precompile onto a stock torch wheel (2.11-2.14).

The distribution is one package, ``torch_precompile``, whose modules are the
repository's ``torch/_precompile*.py`` (kept there as the in-tree form for a
PyTorch checkout, see ``patches/``; they import each other relatively, so the
same files work under either package name).  ``build_py`` below copies them
into the package for a regular install; an editable install reads them from
``torch/`` (``torch_precompile/__init__.py`` extends its ``__path__``).
Nothing is installed under torch's own directory: on torch 2.14+, which ships
its own ``torch/_precompile.py``, installing and ``pip uninstall
torch-precompile`` leave every torch file as it was.

One C++ extension, ``torch_precompile._C_<torch version>``
(``torch_precompile/csrc/``; the version in the name lets venvs with other
torch releases share an editable checkout), is built against the installed torch (``--no-build-isolation``: it needs that
torch, not another in an isolated build environment): the driver's per-call
tensor check.  It is optional -- where torch is not importable at build time
or no C++ compiler works, the install goes on without it (with a warning), and
the driver checks with Dynamo's TensorGuards instead, same semantics, slower.

``torch_precompile`` is also an entry point of the group ``torch.backends``,
which ``import torch`` runs at its end: on torch without a precompile of its
own it attaches ``precompile`` / ``PrecompileError`` to ``torch.compiler``
(lazily, never raising); see ``torch_precompile/__init__.py``.
"""

import glob
import os

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Build torch/_precompile*.py as modules of the torch_precompile package."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if package == "torch_precompile":
            sources = sorted(glob.glob(os.path.join("torch", "_precompile*.py")))
            modules += [(package, os.path.basename(path)[: -len(".py")], path) for path in sources]
        return modules


def _layout_guard_extension() -> list:
    """torch_precompile._C_<torch version>, or nothing where torch is not importable here (an isolated build)."""
    try:
        import torch
        from torch.utils.cpp_extension import CppExtension
    except ImportError:
        print("torch-precompile: torch is not importable at build time (use --no-build-isolation); "
              "installing without torch_precompile._C, the driver's faster tensor check")
        return []
    # The driver imports this name (_C in torch/_precompile_runtime.py spells it the same way).
    module = "_C_" + "".join(c if c.isalnum() else "_" for c in torch.__version__)
    return [
        CppExtension(
            f"torch_precompile.{module}",
            ["torch_precompile/csrc/layout_guard.cpp"],
            # Checked at import: the extension reads TensorImpl, whose layout is this torch's.
            define_macros=[("PRECOMPILE_TORCH_VERSION", f'"{torch.__version__}"'), ("PRECOMPILE_MODULE", module)],
            extra_compile_args=["-O2", "-g0"],
        )
    ]


def _build_ext():
    """torch's BuildExtension (its flags for the installed torch), where a failed compile only warns."""
    try:
        from torch.utils.cpp_extension import BuildExtension
    except ImportError:
        return build_ext

    class OptionalBuildExtension(BuildExtension):
        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as error:  # no compiler, or one torch's headers reject
                print(f"torch-precompile: could not build {ext.name} ({type(error).__name__}: {error}); "
                      "installing without it: the driver checks tensors with Dynamo's TensorGuards instead")

    return OptionalBuildExtension.with_options(use_ninja=False)


setup(
    name="torch-precompile",
    version="0.1.0",
    description="torch_precompile.precompile: ahead-of-time precompile on a stock PyTorch",
    python_requires=">=3.10",
    packages=["torch_precompile"],
    ext_modules=_layout_guard_extension(),
    cmdclass={"build_py": BuildPy, "build_ext": _build_ext()},
    install_requires=["torch>=2.11,<2.15"],
    entry_points={"torch.backends": ["precompile = torch_precompile:_attach"]},
)
