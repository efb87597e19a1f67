"""How long the app takes to serve its first request, from a cold cache, a warm one, and under contention.

Each scenario runs in a fresh Python process, as a server start does, over ``$EARS_CACHE`` set to a folder that
holds only the prepared embedded target (what `make demo` and the Docker image leave) or, for ``cached``, what a
previous start left there. The process times ``import ears_core``, ``load_pair()``, a Session's warm-up with
background prices (as the app's pair slot makes it), then a first request (the app's defaults, EARS 0.1 at
T = 0.9, ``--tokens`` new tokens, decoded in a thread of its own as the app's are), waits for the background
measurements (the pair's provisional choices and the price curve) and decodes the same request again, warmed. ``contended`` starts two busy-looping processes
beside the start (a browser loading would do the same to two cores) and stops them once the first request
is served; the background measurements then run on a quiet machine. ``app cold`` and ``app cached`` start the
app as ``python app.py`` does (``app.start``: the pair loading while Gradio is imported, the page built) and
report when the page is built and when the pair is ready (loaded and warmed up), without serving it.

    python scripts/measure_startup.py [--tokens 64] [--out docs/results/startup.json]

Run it alone on the machine. Reported per scenario: seconds from the process's start to import, to the pair
loaded, to ready (warmed up), to the first request's first token and last token; the first and warmed
requests' tokens/s; the price curve at ready and once settled (the app's: to the page built and to ready).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Explain in three sentences why the sky is blue."

CHILD = r"""
import json, sys, time
t0 = float(sys.argv[1])
import ears_core
from ears_core import load_pair
t_import = time.time()
pair = load_pair()
t_load = time.time()
provisional = list(pair.provisional)
from ears_core.policy.costs import describe
from ears_core.serve.session import RunConfig, Session
session = Session(pair, background_prices=True)
session.warm_up()
t_ready = time.time()
curve_ready = describe(session.prices)
open(sys.argv[3], "w").write("ready")  # the parent stops its busy loops here (contended)
cfg = RunConfig(rule="ears", params={"beta": 0.1}, temperature=0.9, max_new_tokens=int(sys.argv[2]), seed=0)
ids = session.encode(%r)
from ears_core.serve.runs import Background
def run():  # in a thread of its own, as the app decodes (a pool kept here would hold off the background's work)
    t_start = time.time()
    s = Background(session.speculative(ids, cfg)).result().stats  # ttft_s: from the Generation's start
    return t_start + s.ttft_s, time.time(), s.new_tokens / s.decode_s
first_tok, last_tok, tps_first = run()
t_settle = time.time()
session.pricing.wait(300)
settled_s = time.time() - t_settle
_, _, tps_warm = run()
print(json.dumps({"import_s": t_import - t0, "load_s": t_load - t0, "ready_s": t_ready - t0,
                  "first_token_s": first_tok - t0, "first_request_done_s": last_tok - t0,
                  "first_tokens_per_s": tps_first, "warm_tokens_per_s": tps_warm, "provisional_at_load": provisional,
                  "background_s": settled_s, "curve_ready": curve_ready, "curve_settled": describe(session.prices),
                  "still_provisional": session.pricing.provisional, "target": type(pair.target).__name__}))
""" % PROMPT


APP = r"""
import json, sys, time
t0 = float(sys.argv[1])
import app
from ears_core.serve.settings import Settings
demo = app.start(Settings.from_env())  # what `python app.py` does before it serves
t_built = time.time()
demo.ears_slot.preloader.join(600)
print(json.dumps({"page_built_s": t_built - t0, "ready_s": time.time() - t0,
                  "loaded": demo.ears_slot.loaded is not None}))
"""


def _cold_cache() -> Path:
    """A fresh $EARS_CACHE holding only the prepared embedded target (a link to it)."""
    from ears_core.model.loading.embedded import CACHE_SUBDIR, prepare_embedded

    folder = Path(tempfile.mkdtemp(prefix="ears-startup-"))
    (folder / CACHE_SUBDIR).symlink_to(prepare_embedded())
    return folder


def _start(cache: Path, tokens: int, busy: int = 0, child_code: str = CHILD) -> dict:
    flag = cache / "ready.flag"
    flag.unlink(missing_ok=True)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    env = {**os.environ, "EARS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen([sys.executable, "-c", child_code, str(time.time()), str(tokens), str(flag)], env=env,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        while busy and child.poll() is None and not flag.exists():
            time.sleep(0.1)
        time.sleep(0.5 if busy else 0)  # the first request starts under the same load a moment longer
    finally:
        for p in loops:
            p.kill()
    out, _ = child.communicate(timeout=900)
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} vCPU", "tokens": args.tokens}
    cache = _cold_cache()
    results["cold"] = _start(cache, args.tokens)
    results["cached"] = _start(cache, args.tokens)
    contended_cache = _cold_cache()
    results["contended cold"] = _start(contended_cache, args.tokens, busy=2)
    app_cache = _cold_cache()
    results["app cold"] = _start(app_cache, args.tokens, child_code=APP)
    results["app cached"] = _start(cache, args.tokens, child_code=APP)
    for name in ("cold", "cached", "contended cold", "app cold", "app cached"):
        print(name, json.dumps(results[name], indent=1))
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(contended_cache, ignore_errors=True)
    shutil.rmtree(app_cache, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
