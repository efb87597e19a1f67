"""EARS Studio on a ZeroGPU Space: the app of ``ears_core.studio.zerogpu`` (README.md says how this
folder becomes a Space).

``import spaces`` comes first: on ZeroGPU it patches torch before anything else imports it. On
ZeroGPU the pair loads while this module is imported, in the main thread, and reaches a GPU only
inside the requests' ``spaces.GPU`` calls; elsewhere it loads in the background, as in the root app.
"""

import spaces  # noqa: F401  (first: see the docstring)

import logging

from ears_core.studio.zerogpu import build_space, launch_kw

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
try:
    demo = build_space()
except ValueError as exc:  # a bad setting, a pair that does not load: one line in the Space's logs
    raise SystemExit(f"error: {exc}") from None

if __name__ == "__main__":
    demo.launch(**launch_kw(demo.ears_slot.settings))
