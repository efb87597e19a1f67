"""Issue 14's app checks on the embedded pair, measured (not a test: timings need a quiet machine).

1. The app's tokens/s through ``gradio_client`` (no browser) against the terminal path for the same
   prompt, seed and settings, each run several times in turn; the ratio of the medians. Two terminal
   paths: a warmed Session in this process, decoding run after run in its main thread (an upper
   bound), and ``--cli``: the terminal demo itself, ``python -m ears_core.generate``, one process
   per run (its summary's throughput), as a user runs it.
2. 20 requests sent at once over loopback: all answered, and none of them cached a baseline measured
   under contention (each summary that measured one says "contended"; the cache stays empty).

    python scripts/measure_app.py [--tokens 64] [--repeats 3] [--burst 20]

Prints one JSON object; state the machine's price curve (it prints it) next to any figure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gradio_client
import torch

from ears_core import load_pair
from ears_core.serve.session import DRAFT_SHAPES, RunConfig, Session
from ears_core.serve.settings import Settings
from ears_core.studio import LAUNCH_KW, build_app
from ears_core.studio.controls import param_sliders_spec

PROMPT = "Why do leaves change colour in autumn? Answer in a few sentences."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--draft-length", default="fixed", help="fixed: the same rounds in both paths (deterministic)")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--shape", default="auto", choices=DRAFT_SHAPES,
                    help="draft shape in both paths (auto: resolved as the session does, Session.resolved)")
    ap.add_argument("--tree-budget", type=int, default=8)
    ap.add_argument("--cli", action="store_true", help="also run the terminal demo (python -m ears_core.generate) "
                    "--repeats times, a process each, and compare the app with it")
    ap.add_argument("--concurrency", type=int, default=1, help="EARS_CONCURRENCY of the app (2: runs overlap)")
    ap.add_argument("--subprocess", action="store_true",
                    help="serve the app as `python app.py` in a process of its own (as a Space does), so that "
                    "this script's client does not share the app's interpreter")
    return ap.parse_args()


def app_run(client: gradio_client.Client, a: argparse.Namespace, seed: int = 0, baseline: bool = False) -> dict:
    """One /generate request: its details (the run record) and its summary."""
    extras = [p.default for p in param_sliders_spec()[1:]]
    out = client.predict(PROMPT, 0.1, 0.9, a.k, a.tokens, seed, "ears", baseline, *extras, a.draft_length,
                         a.shape, a.tree_budget, api_name="/generate")
    return {"details": out[7], "summary": out[2]}


def start_app(a: argparse.Namespace, port: int) -> tuple[gradio_client.Client, Session, Any, Any]:
    """The app on ``port`` (in this process, or ``python app.py`` with --subprocess), a client of it and
    a warmed Session of the embedded pair -> (client, session, demo or None, server process or None)."""
    if not a.subprocess:
        demo = build_app(settings=Settings(queue_size=max(64, 2 * a.burst), concurrency=a.concurrency))
        session = demo.ears_slot.session()  # loads and warms up the embedded pair
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **LAUNCH_KW)
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        app_run(client, a)  # warm the HTTP path
        return client, session, demo, None
    env = dict(os.environ, PORT=str(port), EARS_CONCURRENCY=str(a.concurrency), EARS_QUEUE_SIZE=str(max(64, 2 * a.burst)))
    server = subprocess.Popen([sys.executable, "app.py"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
            break
        except Exception:
            time.sleep(0.5)
    app_run(client, a)  # returns once the app has loaded and warmed its pair (and warms the HTTP path)
    session = Session(load_pair())
    session.warm_up()  # alone on the cores: its price curve is the one printed
    return client, session, None, server


def cli_run(a: argparse.Namespace) -> float:
    """The terminal demo's throughput for the same request, in a process of its own."""
    out = subprocess.run([sys.executable, "-m", "ears_core.generate", "--prompt", PROMPT, "--rule", "ears", "--beta",
                          "0.1", "--temperature", "0.9", "-K", str(a.k), "--max-new-tokens", str(a.tokens), "--seed",
                          "0", "--draft-length", a.draft_length, "--shape", a.shape, "--tree-budget",
                          str(a.tree_budget), "--no-baseline", "--no-color"], capture_output=True, text=True, check=True)
    return float(re.search(r"throughput\s+([\d.]+) tokens/s", out.stdout).group(1))


def burst(client: gradio_client.Client, a: argparse.Namespace, session: Session, in_process: bool) -> dict:
    """``a.burst`` requests at once: how many were answered, labelled contended or clean, and cached."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.burst) as pool:
        results = list(pool.map(lambda s: app_run(client, a, seed=s, baseline=True), range(a.burst)))
    burst_s = time.perf_counter() - t0
    answered = sum(1 for r in results if r["details"] and r["details"]["stats"]["new_tokens"] > 0)
    contended = sum(1 for r in results if "contended" in (r["summary"] or ""))
    clean = sum(1 for r in results if r["details"] and not r["details"]["contended"])
    cached = len(session._baselines) if in_process else None  # the app's own cache is in its process
    return {"sent": a.burst, "concurrency": a.concurrency, "answered": answered, "labelled_contended": contended,
            "clean": clean, "baselines_cached": cached, "seconds": round(burst_s, 1)}


def main() -> None:
    a = parse_args()
    client, session, demo, server = start_app(a, free_port())
    cfg = RunConfig(rule="ears", params={"beta": 0.1}, temperature=0.9, k=a.k, max_new_tokens=a.tokens,
                    seed=0, draft_length=a.draft_length, draft_shape=a.shape, tree_budget=a.tree_budget)
    ids = session.encode(PROMPT)

    def terminal_run() -> float:
        run = session.speculative(ids, cfg)
        with torch.inference_mode():
            for _ in run:
                pass
        return run.gen.stats().tokens_per_s

    app_tps, term_tps, cli_tps = [], [], []
    for _ in range(a.repeats):
        term_tps.append(terminal_run())
        app_tps.append(app_run(client, a)["details"]["stats"]["tokens_per_s"])
        if a.cli:
            cli_tps.append(cli_run(a))
    session.clear()
    cli = {"cli_tokens_per_s": [round(x, 2) for x in cli_tps],
           "app_over_cli": round(statistics.median(app_tps) / statistics.median(cli_tps), 3)} if cli_tps else {}
    if a.burst <= 0:
        print(json.dumps({"machine": session.profile_text(), "terminal_tokens_per_s": [round(x, 2) for x in term_tps],
                          "app_tokens_per_s": [round(x, 2) for x in app_tps],
                          "app_over_terminal": round(statistics.median(app_tps) / statistics.median(term_tps), 3), **cli}))
        demo.close() if demo is not None else server.terminate()
        return
    print(json.dumps({
        "machine": session.profile_text(), "draft_length": a.draft_length, "shape": a.shape, "K": a.k, "tokens": a.tokens,
        "terminal_tokens_per_s": [round(x, 2) for x in term_tps], "app_tokens_per_s": [round(x, 2) for x in app_tps],
        "app_over_terminal": round(statistics.median(app_tps) / statistics.median(term_tps), 3), **cli,
        "burst": burst(client, a, session, demo is not None),
    }, indent=1))
    demo.close() if demo is not None else server.terminate()


if __name__ == "__main__":
    main()
