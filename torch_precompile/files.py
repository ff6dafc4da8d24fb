"""``torch_precompile.files``: torch 2.15's file-based front-end (``capture`` / ``load``).

This name is an alias: importing it imports ``torch_precompile._precompile_files``
(the repository's ``torch/_precompile_files.py``) and makes that module
``torch_precompile.files``, so ``from torch_precompile.files import capture``
and ``torch_precompile.files.capture`` are the same objects.
"""

import sys

from . import _precompile_files


sys.modules[__name__] = _precompile_files
