"""`python -m ears_core.generate`: the terminal demo (see ears_core/cli.py and --help).

This module shares its name with the function ``ears_core.generate``. Importing it would make
Python bind the package attribute ``generate`` to this module, so the module is made callable:
``ears_core.generate(...)`` means the decoding function either way.
"""

import sys
import types

from ears_core.cli import main
from ears_core.decode.api import generate as _generate


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return _generate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    import torch

    torch.set_grad_enabled(False)
    sys.exit(main())
