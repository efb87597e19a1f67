"""llama.cpp's plain decoding of the embedded GGUF on this machine: the peer the Studio's speed is judged against.

Terms
-----
peer        llama.cpp (the engine a user would pick to run this GGUF on a CPU), built from the source
            vendored in a pinned llama-cpp-python sdist from PyPI (``LLAMA_CPP_PYTHON``), with cmake,
            into ``$EARS_CACHE/llama.cpp-<version>`` (built once; ``--build`` asks for it). Never in CI, never a
            runtime dependency of the project.
generation  ``llama-bench -n N -p 0``: N tokens decoded one at a time from an empty context, tokens/s.
prompt      ``llama-bench -p P -n 0``: a prompt of P tokens in one pass, tokens/s.
price curve ``llama-bench -p m -n 0`` for small m: a pass over m tokens, in decode steps (the same quantity
            as the project's verify price V(m), measured the same way: time of a pass over m / time of one).
repeats     llama-bench's own ``-r``; its mean and standard deviation are kept.

    python scripts/llama_cpp_peer.py --build                 # once: download the sdist, build llama-bench
    python scripts/llama_cpp_peer.py --out peer.json         # measure (2 threads by default)

``scripts/measure_speedup.py --peer`` runs the same measurement before and after the project's own runs, so
the three figures (llama.cpp, target-only, speculative) come from one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp is built
BENCH_TOKENS = 96
CURVE_M = (1, 2, 3, 4, 5, 8, 9)


def build_dir() -> Path:
    root = Path(os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser()
    return root / f"llama.cpp-{LLAMA_CPP_PYTHON}"


def bench_binary() -> Path:
    return build_dir() / "build" / "bin" / "llama-bench"


def build(jobs: int = 2) -> Path:
    """Download the pinned sdist (PyPI), unpack its vendored llama.cpp and build llama-bench with cmake."""
    if bench_binary().is_file():
        return bench_binary()
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"building llama.cpp needs {tool}: apt-get install cmake g++")
    dest = build_dir()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest)
    subprocess.run(["cmake", "-S", str(dest), "-B", str(dest / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(dest / "build"), "--target", "llama-bench", "-j", str(jobs)], check=True)
    return bench_binary()


def _bench(gguf: Path, threads: int, repeats: int, *, prompt: int, gen: int) -> dict:
    """One llama-bench run; its JSON record (avg_ts, stddev_ts in tokens/s)."""
    out = subprocess.run([str(bench_binary()), "-m", str(gguf), "-t", str(threads), "-p", str(prompt),
                          "-n", str(gen), "-r", str(repeats), "-o", "json"], check=True, capture_output=True, text=True)
    rows = json.loads(out.stdout)
    return rows[0]


def measure(gguf: Path, threads: int = 2, repeats: int = 5, tokens: int = BENCH_TOKENS,
            curve: tuple[int, ...] = CURVE_M) -> dict:
    """Generation tokens/s, prompt tokens/s, and the price of a pass over m tokens in decode steps."""
    if not bench_binary().is_file():
        raise SystemExit(f"llama-bench is not built: run `python {Path(__file__).name} --build` first")
    gen = _bench(gguf, threads, repeats, prompt=0, gen=tokens)
    step_ms = 1000.0 / gen["avg_ts"]
    passes = {m: 1000.0 * m / _bench(gguf, threads, repeats, prompt=m, gen=0)["avg_ts"] for m in curve}
    prompt = _bench(gguf, threads, repeats, prompt=512, gen=0)
    return {"engine": f"llama.cpp (llama-cpp-python {LLAMA_CPP_PYTHON} sdist, build {gen.get('build_commit', '?')})",
            "threads": threads, "tokens": tokens, "repeats": repeats,
            "generation_tok_s": round(gen["avg_ts"], 1), "generation_sd": round(gen["stddev_ts"], 1),
            "step_ms": round(step_ms, 2), "prompt512_tok_s": round(prompt["avg_ts"], 1),
            "price_curve": {str(m): round(ms / passes[1], 2) for m, ms in passes.items()},
            "cpu": gen.get("cpu_info", ""), "type": gen.get("model_type", "")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="download the pinned sdist and build llama-bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=BENCH_TOKENS)
    parser.add_argument("--out", help="write the measurement as JSON here")
    args = parser.parse_args(argv)
    if args.build:
        print(f"llama-bench at {build()}")
    if args.build and not args.out:
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ears_core.model.embedded import find_embedded_gguf

    result = measure(find_embedded_gguf(), args.threads, args.repeats, args.tokens)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
