"""EARS Studio, the Hugging Face Space's entry point: build the UI and serve it.

    python app.py                      # http://127.0.0.1:7860 on the embedded pair (HOST / PORT override)

Configuration comes from environment variables (``ears_core.serve.settings``: EARS_TARGET, EARS_DRAFT,
EARS_DEVICE, HOST, PORT and the limits of a public server); see the README's table. The UI is the
package ``ears_core.studio`` (one module per tab); the pair, the runs, their clocks and summaries
come from ``ears_core.serve.session``. Nothing here decodes.
"""

from __future__ import annotations

import logging
from typing import Any

from ears_core.serve.settings import Settings

__all__ = ["main", "start", "build_app", "LAUNCH_KW"]


def __getattr__(name: str) -> Any:
    """``build_app`` and ``LAUNCH_KW`` from ``ears_core.studio``, imported on first use: importing Gradio takes
    seconds, and ``main()`` starts the pair's load before it."""
    if name in ("build_app", "LAUNCH_KW"):
        import ears_core.studio

        return getattr(ears_core.studio, name)
    raise AttributeError(f"module 'app' has no attribute {name!r}")


def start(settings: Settings) -> Any:
    """The app, built and queued, not yet serving; the pair starts loading and warming up in the background
    first, while Gradio is imported (seconds), and the page says "loading" until it is ready."""
    from ears_core.serve.pair_slot import PairSlot

    slot = PairSlot(settings)
    slot.preload()
    from ears_core.studio import build_app

    return build_app(slot=slot, preload=False)


def main() -> None:
    """``python app.py``: settings from the environment, the app started (``start``) and served."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    from ears_core.serve.shutdown import exit_on_sigterm
    from ears_core.studio import LAUNCH_KW

    app = start(settings)
    exit_on_sigterm(app.close)  # `docker stop` / a Space restart: close the server, exit 0 (PID 1 has no default)
    app.launch(server_name=settings.host, server_port=settings.port, show_error=False, **LAUNCH_KW)


if __name__ == "__main__":
    main()
