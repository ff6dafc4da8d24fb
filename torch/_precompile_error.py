"""``PrecompileError``, in a module of its own.

The first access to ``torch.compiler.precompile`` / ``PrecompileError`` imports
only ``_precompile`` and this module; the schema, the driver and the format
module are imported by the first ``precompile()`` or ``load()``.  A copy of the
schema embedded in an artifact shares this class when the package is installed
(``_precompile_schema``), so one ``except PrecompileError`` catches both.
"""


class PrecompileError(RuntimeError):
    """A call, capture or load violated the precompile contract."""
