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

``torch_precompile`` is also an entry point of the group ``torch.backends``,
which ``import torch`` runs at its end: on torch without a precompile of its
own it attaches ``precompile`` / ``PrecompileError`` to ``torch.compiler``
(lazily, never raising); see ``torch_precompile/__init__.py``.
"""

import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Build torch/_precompile*.py as modules of the torch_precompile package."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if package == "torch_precompile":
            sources = sorted(glob.glob(os.path.join("torch", "_precompile*.py")))
            modules += [(package, os.path.basename(path)[: -len(".py")], path) for path in sources]
        return modules


setup(
    name="torch-precompile",
    version="0.1.0",
    description="torch_precompile.precompile: ahead-of-time precompile on a stock PyTorch",
    python_requires=">=3.10",
    packages=["torch_precompile"],
    cmdclass={"build_py": BuildPy},
    install_requires=["torch>=2.11,<2.15"],
    entry_points={"torch.backends": ["precompile = torch_precompile:_attach"]},
)
