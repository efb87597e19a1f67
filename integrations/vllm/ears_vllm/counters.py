"""Pardon counters that a user can read, across vLLM's processes.

vLLM decides acceptance in its worker process(es), while a user reads numbers in the process that
started vLLM (an ``LLM`` script) or from the API server's ``/metrics``. Each worker keeps its own
counts and writes them, after every verification step that drafted anything, to one small JSON
file (atomically: write, then rename) in a folder shared by the whole run:

    $EARS_VLLM_STATS_DIR/counters-<run>-<pid>.json

The first process that loads the plug-in (vLLM's process 0: the script or the API server) makes a
fresh folder when EARS_VLLM_STATS_DIR is unset, and a run id, and puts both in its environment, so
the engine-core and worker processes it spawns (tensor / pipeline parallel ranks too, and Ray
workers when the variable is forwarded) write to the same folder under the same run id. On several
nodes, point EARS_VLLM_STATS_DIR at a shared filesystem or sum each node's files.

Readers: ``read_counters()`` sums the current run's files; in the API server process the plug-in
adds a Prometheus collector, so ``GET /metrics`` shows
    ears_vllm_drafted_tokens_total, ears_vllm_accepted_tokens_total, ears_vllm_pardoned_tokens_total,
    ears_vllm_verify_calls_total
(with a ``rule`` label) beside vLLM's own ``vllm:spec_decode_*`` counters.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

FIELDS = ("calls", "drafted", "accepted", "pardoned")
ENV_DIR = "EARS_VLLM_STATS_DIR"
ENV_RUN = "EARS_VLLM_RUN"


def ensure_run() -> tuple[Path, str]:
    """The run's counter folder and id; the first process of a run makes them (see module doc)."""
    folder = os.environ.get(ENV_DIR)
    if not folder:
        folder = tempfile.mkdtemp(prefix="ears_vllm_")
        os.environ[ENV_DIR] = folder
    run = os.environ.get(ENV_RUN)
    if not run:
        run = f"{os.getpid()}x{int(time.time() * 1000)}"
        os.environ[ENV_RUN] = run
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder), run


class Counters:
    """This process's counts; ``flush()`` writes them to its file."""

    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.values = dict.fromkeys(FIELDS, 0)
        self._lock = threading.Lock()
        self._path: Path | None = None

    def add(self, calls: int, drafted: int, accepted: int, pardoned: int) -> None:
        with self._lock:
            v = self.values
            v["calls"] += calls
            v["drafted"] += drafted
            v["accepted"] += accepted
            v["pardoned"] += pardoned
        self.flush()

    def flush(self) -> None:
        if self._path is None:
            folder, run = ensure_run()
            self._path = folder / f"counters-{run}-{os.getpid()}.json"
        with self._lock:
            data = {"rule": self.rule, "pid": os.getpid(), **self.values}
        tmp = self._path.with_name(self._path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._path)
        except OSError:  # a counter must never stop serving
            pass


def read_counters(folder: str | os.PathLike | None = None, run: str | None = None) -> dict:
    """Sum of the counters of one run (default: this process's run, from its environment).
    Returns {"rule", "calls", "drafted", "accepted", "pardoned", "processes"}; an empty run is all 0."""
    folder = Path(folder or os.environ.get(ENV_DIR) or "")
    run = run if run is not None else os.environ.get(ENV_RUN, "")
    total: dict = dict.fromkeys(FIELDS, 0)
    total["rule"], total["processes"] = None, 0
    if not str(folder) or not folder.is_dir():
        return total
    for path in folder.glob(f"counters-{run}*.json" if run else "counters-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for key in FIELDS:
            total[key] += int(data.get(key, 0))
        total["rule"] = data.get("rule", total["rule"])
        total["processes"] += 1
    return total


class PrometheusCollector:
    """Reads the run's counter files at every scrape (registered in each process that loads the
    plug-in; only the API server's registry is served)."""

    def __init__(self, rule: str) -> None:
        self.rule = rule

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        totals = read_counters()
        helps = {"calls": "verification steps of random-sampling requests with drafts",
                 "drafted": "draft tokens of random-sampling requests",
                 "accepted": "draft tokens that stood (ordinary acceptance plus pardons)",
                 "pardoned": "draft tokens that stood only thanks to the rule's tolerance"}
        names = {"calls": "ears_vllm_verify_calls", "drafted": "ears_vllm_drafted_tokens",
                 "accepted": "ears_vllm_accepted_tokens", "pardoned": "ears_vllm_pardoned_tokens"}
        for key in FIELDS:
            family = CounterMetricFamily(names[key], helps[key], labels=["rule"])
            family.add_metric([self.rule], totals[key])
            yield family


def register_prometheus(rule: str) -> None:
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    try:
        REGISTRY.register(PrometheusCollector(rule))
    except ValueError:  # already registered in this process
        pass
