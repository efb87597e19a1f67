"""What the app, the CLI and the bench share: a run's settings, one pair's runs, timing, the summary.

Terms
-----
RunConfig   one request's settings: rule name and its parameters (from the registry in
            ``rules``), temperature, K, length, seed, top-k / top-p. ``validate()`` refuses bad
            values with a message naming the fix; ``rule()`` builds the rule (T = 0 or the
            greedy rule: GreedyRule at T = 0, the target's own greedy output).
Session     a loaded ``ModelPair`` and what runs on it: ``speculative()`` and ``baseline()``
            return ``decoding.Generation`` objects (a fresh drafter per generation, the decode
            clock, an optional deadline); clean target-only baselines are cached per request.
contended   a run that overlapped another decode in this process: two decodes on the same cores
            time each other, so such a run is labelled and its baseline is never cached.
Background  a Generation decoded in a thread of its own, to completion, a deadline or ``stop()``;
            a UI reads ``events`` at its own frame rate and never slows the decode loop.
summary     ``summary_rows()``: the one list of (metric, value) the app renders as a table and
            the CLI prints as text.
record      ``run_record()``: one run as plain data (settings, metrics, baseline, events, rounds):
            what the app shows as raw metrics and ``export_run()`` writes.
PairSlot    the one pair a server holds in memory: chosen by (target, draft spec), loaded on first
            use, switched with the tokenizers checked first; a switch starts a new Session (its
            cached baselines belong to the old pair).
"""

from __future__ import annotations

import csv
import gc
import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from .decoding import Generation, autoregressive_stream, stream
from .metrics import GenerationStats
from .models import ModelPair, check_pair, describe_device, load_pair, resolve_draft
from .rules import AcceptanceRule, GreedyRule, make_rule, rule_spec
from .settings import Settings

__all__ = ["RunConfig", "Session", "Background", "summary_rows", "summary_markdown", "summary_text",
           "export_run", "run_record", "ActivityLog", "PairSlot"]


@dataclass
class RunConfig:
    """One request's settings; ``params`` holds the rule's parameters by name (e.g. beta)."""

    rule: str = "ears"
    params: dict[str, float] = field(default_factory=lambda: {"beta": 0.1})
    temperature: float = 0.9
    gamma: int = 4  # K: drafts per round at most
    max_new_tokens: int = 96
    seed: int = 0
    top_k: int | None = None
    top_p: float | None = None

    def validate(self) -> "RunConfig":
        rule_spec(self.rule)  # unknown name: a ValueError listing the registered rules
        for name, value in self.params.items():
            if value is None or value != value:
                raise ValueError(f"the rule parameter {name} must be a number, got {value!r}")
        if self.params.get("beta") is not None and self.params["beta"] < 0:
            raise ValueError(f"beta must be >= 0 (0 is the ordinary lossless rule), got {self.params['beta']!r}")
        if self.temperature is None or self.temperature != self.temperature or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy decoding), got {self.temperature!r}")
        if not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"K (drafts per round) must be a whole number >= 1, got {self.gamma!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max new tokens must be a whole number >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a whole number >= 0, got {self.seed!r}")
        return self

    def rule_and_temperature(self) -> tuple[AcceptanceRule, float]:
        """The rule to verify with and the temperature to decode at: T = 0 or the greedy rule both
        mean GreedyRule at T = 0."""
        rule = make_rule(self.rule, **self.params)
        if isinstance(rule, GreedyRule) or self.temperature == 0:
            return GreedyRule(), 0.0
        return rule, float(self.temperature)

    def sampling_kwargs(self, temperature: float) -> dict[str, Any]:
        return dict(temperature=temperature, max_new_tokens=self.max_new_tokens, seed=self.seed,
                    top_k=self.top_k, top_p=self.top_p)


class ActivityLog:
    """Which decodes run now in this process; a decode that overlaps another is contended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: list[dict[str, bool]] = []

    def begin(self) -> dict[str, bool]:
        with self._lock:
            mark = {"contended": bool(self._active)}
            for other in self._active:
                other["contended"] = True
            self._active.append(mark)
            return mark

    def end(self, mark: dict[str, bool]) -> None:
        with self._lock:
            if mark in self._active:
                self._active.remove(mark)

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)


ACTIVITY = ActivityLog()  # one per process: every Session's decodes share the cores


class Tracked:
    """A Generation whose decoding is registered with the activity log while it runs."""

    def __init__(self, gen: Generation, activity: ActivityLog) -> None:
        self.gen, self._activity, self._mark = gen, activity, None
        self.contended = False

    def __iter__(self) -> Iterator[Any]:
        self._mark = self._activity.begin()
        try:
            for ev in self.gen:
                yield ev
        finally:
            self._activity.end(self._mark)
            self.contended = self._mark["contended"]

    def __getattr__(self, name: str) -> Any:  # events, steps, samples, decode_s, stats(), result()
        return getattr(self.gen, name)


class Background:
    """Decode a Generation in a thread of its own; read ``events`` while it runs.

    ``wait(timeout)`` returns True once decoding ended (finished, deadline, ``stop()`` or an
    error, re-raised by ``result()``). The decode clock is the Generation's own."""

    def __init__(self, tracked: Tracked) -> None:
        self.tracked = tracked
        self.gen = tracked.gen
        self._stop = threading.Event()
        self._done = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            with torch.inference_mode():
                for _ in self.tracked:
                    if self._stop.is_set():
                        break
        except BaseException as exc:  # shown by result(); never kills the server
            self.error = exc
        finally:
            self._done.set()

    @property
    def events(self) -> list[Any]:
        return self.gen.events

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def contended(self) -> bool:
        return self.tracked.contended

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def result(self) -> Any:
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.gen.result()


class Session:
    """One loaded pair and the runs made on it (see the module's terms)."""

    def __init__(self, pair: ModelPair, activity: ActivityLog | None = None) -> None:
        self.pair = pair
        self.activity = activity or ACTIVITY
        self._baselines: dict[tuple, GenerationStats] = {}
        self._lock = threading.Lock()

    def encode(self, prompt: Any, chat: bool = True) -> torch.Tensor:
        ids = self.pair.encode(prompt, chat=chat)  # (1, T)
        limit = getattr(self.pair.target.config, "max_position_embeddings", None)
        if limit is not None and ids.shape[1] >= limit:
            raise ValueError(f"the prompt is {ids.shape[1]} tokens long and the target's context holds {limit}: "
                             "shorten the prompt")
        return ids

    @property
    def device_label(self) -> str:
        """Where the target runs, for people: e.g. 'cpu (float32)' (``models.describe_device``)."""
        return describe_device(self.pair.target)

    def _common(self) -> dict[str, Any]:
        return dict(tokenizer=self.pair.tokenizer, vocab_size=self.pair.vocab_size)

    def speculative(self, ids: torch.Tensor, cfg: RunConfig, deadline_s: float | None = None) -> Tracked:
        """The speculative run of ``cfg`` on ``ids`` with a fresh drafter (iterate it, or run it in
        ``Background``)."""
        rule, temperature = cfg.validate().rule_and_temperature()
        gen = stream(self.pair.target, self.pair.new_drafter(), ids, rule=rule, gamma=cfg.gamma,
                     deadline_s=deadline_s, **cfg.sampling_kwargs(temperature), **self._common())
        return Tracked(gen, self.activity)

    def baseline(self, ids: torch.Tensor, cfg: RunConfig, deadline_s: float | None = None) -> Tracked:
        """Target-only decoding of the same request (same temperature, seed, length)."""
        _, temperature = cfg.validate().rule_and_temperature()
        gen = autoregressive_stream(self.pair.target, ids, deadline_s=deadline_s,
                                    **cfg.sampling_kwargs(temperature), **self._common())
        return Tracked(gen, self.activity)

    def _key(self, ids: torch.Tensor, cfg: RunConfig) -> tuple:
        _, temperature = cfg.rule_and_temperature()
        return (self.pair.name, tuple(ids[0].tolist()), temperature, cfg.seed, cfg.max_new_tokens, cfg.top_k, cfg.top_p)

    def cached_baseline(self, ids: torch.Tensor, cfg: RunConfig) -> GenerationStats | None:
        with self._lock:
            return self._baselines.get(self._key(ids, cfg))

    def remember_baseline(self, ids: torch.Tensor, cfg: RunConfig, run: Tracked | Background) -> bool:
        """Cache a finished baseline unless it overlapped another decode or was cut by a deadline.
        Returns whether it was cached."""
        if run.contended or run.gen.timed_out:
            return False
        with self._lock:
            self._baselines[self._key(ids, cfg)] = run.gen.stats()
        return True

    def clear(self) -> None:
        with self._lock:
            self._baselines.clear()


class PairSlot:
    """The one pair in memory (see the module's terms), thread-safe.

    ``settings`` give the configured pair and how to load (device, cache, downloads);
    ``default_loader()`` loads the configured pair instead (tests inject a tiny one) and
    ``loader(target, draft)`` any other (default ``models.load_pair`` on the settings)."""

    def __init__(self, settings: Settings | None = None, default_loader: Callable[[], ModelPair] | None = None,
                 loader: Callable[[str, str | None], ModelPair] | None = None,
                 activity: ActivityLog | None = None) -> None:
        self.settings = settings or Settings()
        self.default: tuple[str, str | None] = (self.settings.target, self.settings.draft)
        self.choice = self.default  # the pair in memory, or the one to load on first use
        self._default_loader, self._loader, self._activity = default_loader, loader or self._load_pair, activity
        self._session: Session | None = None
        self._lock = threading.Lock()

    def _load_pair(self, target: str, draft: str | None) -> ModelPair:
        s = self.settings
        return load_pair(target, draft, device=s.torch_device, cache_dir=s.cache, allow_download=s.allow_download)

    @staticmethod
    def same(a: tuple[str, str | None], b: tuple[str, str | None]) -> bool:
        """Whether two (target, draft spec) choices name one pair once "auto" is resolved."""
        return a[0] == b[0] and resolve_draft(*a) == resolve_draft(*b)

    def _injected(self, choice: tuple[str, str | None]) -> bool:
        return self._default_loader is not None and self.same(choice, self.default)

    def _load(self, choice: tuple[str, str | None]) -> Session:
        pair = self._default_loader() if self._injected(choice) else self._loader(*choice)
        return Session(pair, self._activity)

    def session(self) -> Session:
        """The Session on the chosen pair, loading it on first use."""
        with self._lock:
            if self._session is None:
                self._session = self._load(self.choice)
            return self._session

    @property
    def loaded(self) -> Session | None:
        return self._session

    def switch(self, target: str, draft: str | None, check: bool = True,
               progress: Callable[[str], Any] | None = None) -> Session:
        """Make (target, draft) the pair in memory. The tokenizers are checked first (seconds), so a
        pair that is not cached or does not match fails while the current pair stays; then the
        current pair is dropped before the new one loads. If that load fails, the previous choice
        loads again on the next ``session()``."""
        choice = (target, draft)
        with self._lock:
            if self._session is not None and self.same(choice, self.choice):
                return self._session
            if check and not self._injected(choice):
                check_pair(target, draft, cache_dir=self.settings.cache, allow_download=self.settings.allow_download)
            previous, self._session = self.choice, None
            _free_memory()
            if progress is not None:
                progress(f"loading {target}" + ("" if draft is None else f" <- {draft}"))
            try:
                self._session = self._load(choice)
            except BaseException:
                self.choice = previous
                _free_memory()
                raise
            self.choice = choice
            return self._session


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ the summary


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def summary_rows(stats: GenerationStats, baseline_tps: float | None = None, *, contended: bool = False,
                 baseline_note: str = "") -> list[tuple[str, str]]:
    """(metric, value) rows: rates, lengths, distortion, speed, speedup measured vs theory."""
    speedup = stats.tokens_per_s / baseline_tps if baseline_tps else None
    label = " (contended: another decode ran at the same time)" if contended else ""
    rows = [
        ("rule", stats.method),
        ("tokens / rounds", f"{stats.new_tokens} / {stats.steps}"),
        ("acceptance rate", f"{_fmt(stats.acceptance_rate)} ({stats.accepted} of {stats.drafted} drafts stood)"),
        ("mean acceptance length", f"{stats.mean_accept_length:.2f} tokens per round"),
        ("pardon rate", f"{_fmt(stats.pardon_rate)} ({stats.pardoned} pardoned)"),
        ("mean exact distortion (TV)", f"{stats.mean_distortion:.4f} per token"),
        ("throughput", f"{stats.tokens_per_s:.1f} tokens/s{label}"),
        ("target-only", "not measured" if not baseline_tps else f"{baseline_tps:.1f} tokens/s{baseline_note}"),
        ("speedup, measured", "–" if speedup is None else f"{speedup:.2f}×{label}"),
        ("speedup, theory S = E/(kc+1)", "–" if stats.theory_speedup is None else
         f"{stats.theory_speedup:.2f}× (E = {stats.theory_tokens_per_step:.2f}, c = {stats.cost_ratio:.3f})"),
    ]
    return rows


def summary_markdown(rows: Sequence[tuple[str, str]]) -> str:
    return "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def summary_text(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


# ------------------------------------------------------------------------------------ export


def run_record(result: Any, cfg: RunConfig, *, prompt: str, model: str, device: str,
               baseline_tps: float | None = None, contended: bool = False) -> dict[str, Any]:
    """One finished (or timed-out) run as plain data: ``result`` is a ``GenerationResult``."""
    stats = result.stats
    rule, temperature = cfg.rule_and_temperature()
    settings = {"prompt": prompt, "rule": rule.describe(), **cfg.params, "temperature": temperature,
                "K": cfg.gamma, "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "top_k": cfg.top_k,
                "top_p": cfg.top_p, "model": model, "device": device}
    return {"settings": settings, "stats": stats.to_dict(), "baseline_tokens_per_s": baseline_tps,
            "speedup": stats.tokens_per_s / baseline_tps if baseline_tps else None,
            "contended": contended, "timed_out": result.timed_out, "text": result.text,
            "events": [e.to_dict() for e in result.events], "steps": [s.to_dict() for s in result.steps]}



def export_run(run: dict[str, Any], folder: str | os.PathLike | None = None) -> tuple[str, str]:
    """Write a run (``{"events": [TokenEvent dicts], ...}``) as CSV (one row per token) and JSON
    (everything) into ``folder`` (a new temporary folder by default); return both paths."""
    folder = str(folder) if folder is not None else tempfile.mkdtemp(prefix="ears_run_")
    csv_path, json_path = os.path.join(folder, "ears_events.csv"), os.path.join(folder, "ears_run.json")
    events = run.get("events") or []
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(events[0].keys()) if events else ["position"])
        writer.writeheader()
        writer.writerows(events)
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(run, f, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
    return csv_path, json_path
