"""llama.cpp's plain decoding of the embedded GGUF on this machine: the peer the Studio's speed is judged against.

Terms
-----
peer        llama.cpp (the engine a user would pick to run this GGUF on a CPU), built from the source
            vendored in a pinned llama-cpp-python sdist from PyPI (``LLAMA_CPP_PYTHON``), with cmake,
            into ``$EARS_CACHE/llama.cpp-<version>-<kind>`` (built once; ``--build`` asks for it). Never in
            CI, never a runtime dependency of the project.
kinds       ``native``: llama.cpp's default ``-march=native`` build, which on a CPU listing AMX repacks the
            4-bit weights for its AMX/VNNI kernels. ``isa``: the instruction sets /proc/cpuinfo lists
            (AVX2, AVX512 with VNNI / VBMI / BF16), AMX left out. ``avx2``: AVX2, FMA, F16C and BMI2 only, what
            llama.cpp runs on an AVX2 CPU (most laptops), the peer of the project's emulated AVX2 figures. On the virtual machines measured, AMX is
            listed but its tile instructions trap: the native build dies with "illegal instruction" on
            every pass over more than one token unless passes are cut to one token (``-ub 1``), while its
            one-token decoding is the fastest there is. Both are measured; the faster generation is the peer.
generation  ``llama-bench -n N -p 0``: N tokens decoded one at a time from an empty context, tokens/s.
price curve ``llama-bench -p m -n 0`` for small m: a pass over m tokens, in decode steps (the same quantity
            as the project's verify price V(m)); null where the build dies on such a pass.
prompt      ``llama-bench -p 64 -n 0`` (with ``-ub 1`` where wider passes die), tokens/s.

    python scripts/llama_cpp_peer.py --build                 # once: download the sdist, build both kinds
    python scripts/llama_cpp_peer.py --out peer.json         # measure (2 threads by default)

``scripts/measure_speedup.py --peer`` runs the same measurement before and after the project's own runs, so
the figures (llama.cpp, target-only, speculative) come from one run on one machine.
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


KINDS = ("native", "isa", "avx2")
AVX2_CPUINFO = "flags : avx avx2 fma f16c bmi2"  # the ``avx2`` kind's instruction sets, as /proc/cpuinfo would list them


def build_dir(kind: str) -> Path:
    root = Path(os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser()
    return root / f"llama.cpp-{LLAMA_CPP_PYTHON}-{kind}"


def bench_binary(kind: str) -> Path:
    return build_dir(kind) / "build" / "bin" / "llama-bench"


def isa_flags(cpuinfo: str | None = None) -> list[str]:
    """cmake switches for the instruction sets /proc/cpuinfo lists (module terms: kinds); AMX stays off."""
    if cpuinfo is None:
        cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    flags = set(next((line.split(":", 1)[1] for line in cpuinfo.splitlines() if line.startswith("flags")), "").split())
    table = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "bmi2": "GGML_BMI2",
             "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI",
             "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16"}
    return [f"-D{opt}={'ON' if isa in flags else 'OFF'}" for isa, opt in table.items()] + ["-DGGML_AMX_TILE=OFF"]


def _source(dest: Path) -> None:
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


def build(kind: str, jobs: int = 2) -> Path:
    """Download the pinned sdist (PyPI), unpack its vendored llama.cpp and build llama-bench of one kind."""
    if bench_binary(kind).is_file():
        return bench_binary(kind)
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"building llama.cpp needs {tool}: apt-get install cmake g++")
    dest = build_dir(kind)
    _source(dest)
    isa = ["-DGGML_NATIVE=ON"] if kind == "native" else \
        ["-DGGML_NATIVE=OFF", *isa_flags(AVX2_CPUINFO if kind == "avx2" else None)]
    subprocess.run(["cmake", "-S", str(dest), "-B", str(dest / "build"), "-DCMAKE_BUILD_TYPE=Release", *isa,
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(dest / "build"), "--target", "llama-bench", "-j", str(jobs)], check=True)
    return bench_binary(kind)


def _bench(kind: str, gguf: Path, threads: int, repeats: int, *, prompt: int, gen: int,
           ubatch: int | None = None) -> dict | None:
    """One llama-bench run: its JSON record (avg_ts, stddev_ts in tokens/s), or None when it dies."""
    extra = ["-ub", str(ubatch)] if ubatch else []
    out = subprocess.run([str(bench_binary(kind)), "-m", str(gguf), "-t", str(threads), "-p", str(prompt),
                          "-n", str(gen), "-r", str(repeats), "-o", "json", *extra], capture_output=True, text=True)
    return json.loads(out.stdout)[0] if out.returncode == 0 else None


def measure_kind(kind: str, gguf: Path, threads: int = 2, repeats: int = 5, tokens: int = BENCH_TOKENS,
                 curve: tuple[int, ...] = CURVE_M) -> dict:
    """One build's generation tokens/s, price curve (null where a pass dies) and prompt tokens/s."""
    gen = _bench(kind, gguf, threads, repeats, prompt=0, gen=tokens)
    if gen is None:
        raise SystemExit(f"llama-bench ({kind}) died decoding one token at a time")
    passes = {m: _bench(kind, gguf, threads, repeats, prompt=m, gen=0) for m in curve}
    ms = {m: (1000.0 * m / r["avg_ts"] if r else None) for m, r in passes.items()}
    wide_dies = any(v is None for v in ms.values())
    prompt = _bench(kind, gguf, threads, repeats, prompt=64, gen=0, ubatch=1 if wide_dies else None)
    return {"kind": kind, "generation_tok_s": round(gen["avg_ts"], 1), "generation_sd": round(gen["stddev_ts"], 1),
            "step_ms": round(1000.0 / gen["avg_ts"], 2),
            "price_curve": {str(m): (round(v / ms[1], 2) if v is not None and ms[1] else None) for m, v in ms.items()},
            "prompt64_tok_s": round(prompt["avg_ts"], 1) if prompt else None,
            "wide_passes": "die (illegal instruction); prompts run one token a pass (-ub 1)" if wide_dies else "run"}


def measure(gguf: Path, threads: int = 2, repeats: int = 5, tokens: int = BENCH_TOKENS) -> dict:
    """Every built kind (module terms); ``generation_tok_s`` is the fastest kind's."""
    kinds = [measure_kind(k, gguf, threads, repeats, tokens) for k in KINDS if bench_binary(k).is_file()]
    if not kinds:
        raise SystemExit(f"llama-bench is not built: run `python {Path(__file__).name} --build` first")
    best = max(kinds, key=lambda r: r["generation_tok_s"])
    return {"engine": f"llama.cpp (llama-cpp-python {LLAMA_CPP_PYTHON} sdist)", "threads": threads, "tokens": tokens,
            "repeats": repeats, "generation_tok_s": best["generation_tok_s"], "fastest": best["kind"], "kinds": kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="download the pinned sdist and build every kind")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the kinds --build builds (comma list)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=BENCH_TOKENS)
    parser.add_argument("--out", help="write the measurement as JSON here")
    args = parser.parse_args(argv)
    if args.build:
        for kind in args.kinds.split(","):
            print(f"llama-bench ({kind}) at {build(kind)}")
    if args.build and not args.out:
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ears_core.model.loading.embedded import find_embedded_gguf

    result = measure(find_embedded_gguf(), args.threads, args.repeats, args.tokens)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
