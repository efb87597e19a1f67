"""One entry point for the three samplers of a transformer TPP: ``sample`` (a finished run) and ``stream``.

Terms
-----
method     "autoregressive" (the baseline), "self" (seed 001 self-proposal) or "draft" (TPP-SD draft model)
length     the draft length K (draft) or proposals per round l (self); None = the cost model picks it
           per round (cost.py), falling back to autoregressive rounds when drafting does not pay
row        one independent sequence; ``batch`` rows are sampled side by side (same law, different draws)
A run stops when every row has ``n_events`` events and returns exactly the first ``n_events`` of each row.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from .cost import AcceptanceTracker, Prices, choose, measure_prices
from .events import KINDS, RoundRecord, SampleRun
from .samplers import AutoregressiveSampler, DraftSampler, SelfProposalSampler, TPPSampler
from .transformer import TransformerTPP

__all__ = ["METHODS", "make_sampler", "prices_for", "stream", "sample", "collect"]

METHODS = ("autoregressive", "self", "draft")
_PRICES: dict = {}
PROBE_EVERY = 32  # autoregressive rounds before the first probe; doubled after each probe that did not pay
MAX_PROBE_EVERY = 512
LONG_STREAK = 8  # speculative rounds in a row after which a fallback probes soon again
PROBE_LENGTH = 4


def make_sampler(method: str, target: TransformerTPP, draft: TransformerTPP | None, *, batch: int, capacity: int,
                 gen: torch.Generator, history=None, ratio: str = "joint", **self_kw) -> TPPSampler:
    if method == "autoregressive":
        return AutoregressiveSampler(target, batch, capacity, gen, history)
    if method == "self":
        return SelfProposalSampler(target, batch, capacity, gen, history, **self_kw)
    if method == "draft":
        return DraftSampler(target, draft, batch, capacity, gen, history, ratio)
    raise ValueError(f"unknown sampler {method!r}: choose one of {METHODS}")


def prices_for(method: str, target: TransformerTPP, draft: TransformerTPP | None = None) -> Prices:
    """This machine's measured round prices for a model pair (measured once, then cached)."""
    key = (method, id(target), id(draft))
    if key not in _PRICES:
        cls = SelfProposalSampler if method == "self" else DraftSampler
        factory = (lambda cap: make_sampler(method, target, draft, batch=1, capacity=cap,
                                            gen=torch.Generator().manual_seed(12345)))
        _PRICES[key] = measure_prices(factory, cls.lengths)
    return _PRICES[key]


def stream(target: TransformerTPP, draft: TransformerTPP | None = None, *, method: str = "draft", n_events: int,
           batch: int = 1, seed: int = 0, length: int | None = None, history=None, ratio: str = "joint",
           prices: Prices | None = None, **self_kw) -> Iterator[tuple[TPPSampler, RoundRecord]]:
    """Yield (sampler, record) after every round until every row has ``n_events`` events. ``self_kw``: eps,
    widen, cells, z of the self-proposal sampler."""
    if isinstance(n_events, bool) or int(n_events) != n_events or n_events < 1:
        raise ValueError(f"n_events must be a positive integer, got {n_events}")
    if length is not None and (isinstance(length, bool) or int(length) != length or length < 1):
        raise ValueError(f"draft length must be an integer >= 1 or None (cost model), got {length}")
    if method not in METHODS:
        raise ValueError(f"unknown sampler {method!r}: choose one of {METHODS}")
    gen = torch.Generator().manual_seed(int(seed))
    spec = method != "autoregressive"
    max_len = max(length or 0, *(SelfProposalSampler.lengths if method == "self" else DraftSampler.lengths))
    if spec and length is None:
        prices = prices or prices_for(method, target, draft)
    s = make_sampler(method, target, draft, batch=batch, capacity=int(n_events) + max_len + 4, gen=gen,
                     history=history, ratio=ratio, **self_kw)
    s.ev.limit = s.n_history + int(n_events)
    tracker = AcceptanceTracker(max_len)
    since_probe, probe_every, streak = 0, PROBE_EVERY, 0
    while int(s.ev.n.min()) < n_events:
        if not spec:
            rec = s.ar_round()
        elif length is not None:
            rec = s.round(length)
        else:
            best, pays, _ = choose(prices, tracker.rates(), method)
            if pays or since_probe >= probe_every:
                L = best if pays else min(best, PROBE_LENGTH)  # a probe only refreshes the acceptance estimate
                rec = s.round(L)
                tracker.update(L, rec.num_accepted)
                if not pays:  # each probe waits twice as long as the last (at most MAX_PROBE_EVERY) ...
                    probe_every, streak = min(2 * probe_every, MAX_PROBE_EVERY), 0
                streak += pays
                since_probe = 0
            else:
                if streak >= LONG_STREAK:  # ... unless drafting paid for a while before this fallback
                    probe_every = PROBE_EVERY
                since_probe, streak = since_probe + 1, 0
                rec = s.ar_round()
        yield s, rec


def collect(s: TPPSampler, n_events: int, rounds: list[RoundRecord], seconds: float) -> SampleRun:
    """The first ``n_events`` events of every row after the history."""
    h = s.n_history
    sl = slice(1 + h, 1 + h + n_events)
    return SampleRun(s.ev.t[:, sl].tolist(), s.ev.x[:, sl].tolist(),
                     [[KINDS[k] for k in row] for row in s.ev.kind[:, sl].tolist()], rounds, seconds,
                     start=float(s.ev.t[0, h]))


def sample(target: TransformerTPP, draft: TransformerTPP | None = None, **kw) -> SampleRun:
    """Run ``stream`` to the end (same arguments) and return the first ``n_events`` events of every row."""
    rounds, t0, s = [], time.perf_counter(), None
    for s, rec in stream(target, draft, **kw):
        rounds.append(rec)
    return collect(s, kw["n_events"], rounds, time.perf_counter() - t0)
