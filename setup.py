"""Install torch.compiler.precompile onto an installed torch 2.11-2.14 wheel.

Adds the modules ``torch._precompile``, ``torch._precompile_capture``,
``torch._precompile_runtime``, ``torch._precompile_inspect`` and
``torch._precompile_compat`` next to torch's own files (never over them), plus
the top-level shim ``torch_precompile``, and registers it as an entry point of
the group ``torch.backends``, which ``import torch`` runs at its end: it
attaches ``precompile`` and ``PrecompileError`` to ``torch.compiler``.  The
shim never raises (a raising entry point aborts ``import torch``) and also
works when this package lands in another site-packages than torch; see
``torch_precompile.py``.  No file of the torch distribution is touched, so
``pip uninstall torch-precompile`` restores stock torch exactly.
"""

from setuptools import setup


setup(
    name="torch-precompile",
    version="0.1.0",
    description="torch.compiler.precompile: ahead-of-time precompile on a stock PyTorch 2.11-2.14",
    python_requires=">=3.10",
    py_modules=[
        "torch._precompile",
        "torch._precompile_capture",
        "torch._precompile_runtime",
        "torch._precompile_inspect",
        "torch._precompile_compat",
        "torch_precompile",
    ],
    install_requires=["torch>=2.11,<2.15"],
    entry_points={"torch.backends": ["precompile = torch_precompile:_attach"]},
)
