"""``python -m ears_core.gpu_check`` (see the package's docstring)."""

import sys

from ears_core.gpu_check import main

sys.exit(main())
