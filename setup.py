"""Install torch.compiler.precompile onto an installed torch 2.13 wheel.

Adds the modules ``torch._precompile`` and ``torch._precompile_runtime`` next
to torch's own files (never over them) and registers an entry point of the
group ``torch.backends``, which ``import torch`` runs at its end: it attaches
``precompile`` and ``PrecompileError`` to ``torch.compiler``.
"""

from setuptools import setup


setup(
    name="torch-precompile",
    version="0.1.0",
    description="torch.compiler.precompile: ahead-of-time precompile on a stock PyTorch 2.13",
    python_requires=">=3.10",
    py_modules=["torch._precompile", "torch._precompile_runtime"],
    install_requires=["torch==2.13.*"],
    entry_points={"torch.backends": ["precompile = torch._precompile:_attach"]},
)
