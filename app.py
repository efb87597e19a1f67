"""EARS Studio, the Hugging Face Space's entry point: build the UI and serve it.

    python app.py                      # http://127.0.0.1:7860 on the embedded pair (HOST / PORT override)

Configuration comes from environment variables (``ears_core.serve.settings``: EARS_TARGET, EARS_DRAFT,
EARS_DEVICE, HOST, PORT and the limits of a public server); see the README's table. The UI is the
package ``ears_core.studio`` (one module per tab); the pair, the runs, their clocks and summaries
come from ``ears_core.serve.session``. Nothing here decodes.
"""

from __future__ import annotations

import logging

from ears_core.serve.settings import Settings
from ears_core.studio import LAUNCH_KW, build_app

__all__ = ["main", "build_app", "LAUNCH_KW"]


def main() -> None:
    """``python app.py``: settings from the environment, the default pair loading in the background
    from the app's build on (the page says "loading" until it is ready)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    from ears_core.serve.shutdown import exit_on_sigterm

    app = build_app(settings=settings)  # the pair loads and warms up in the background from here on
    exit_on_sigterm(app.close)  # `docker stop` / a Space restart: close the server, exit 0 (PID 1 has no default)
    app.launch(server_name=settings.host, server_port=settings.port, show_error=False, **LAUNCH_KW)


if __name__ == "__main__":
    main()
