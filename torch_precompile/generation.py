"""``torch_precompile.generation``: Hugging Face ``generate()`` served by precompiled artifacts.

This name is an alias: importing it imports ``torch_precompile._precompile_generation``
(the repository's ``torch/_precompile_generation.py``) and makes that module
``torch_precompile.generation``.
"""

import sys

from . import _precompile_generation


sys.modules[__name__] = _precompile_generation
