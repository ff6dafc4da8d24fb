"""``python -m torch_precompile inspect CODE_FILE CACHE_FILE [--json]``: see ``_precompile_inspect``."""

import sys

from ._precompile_inspect import main


sys.exit(main(sys.argv[1:]))
