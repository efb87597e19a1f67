"""B rows of committed events, laid out as the transformer's positions, and what a finished run returns.

Terms
-----
position k     0 is the start pseudo-event (mark C, t = 0, tau = 1 as a placeholder), k >= 1 is event k
committed      events decided for good; row b has ``n[b]`` of them (positions 1..n[b])
kind           how an event was decided: accepted (a drafted or proposed event that passed its test),
               resampled (drawn after a rejection: from the residual max(0, p* - q) / Z for the draft
               sampler, from the next round's proposal for the self-proposal sampler), bonus (drawn from the
               target after every draft of a round stood), target (a plain autoregressive step)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["KINDS", "ACCEPTED", "RESAMPLED", "BONUS", "TARGET", "Events", "RoundRecord", "SampleRun"]

KINDS = ("accepted", "resampled", "bonus", "target")
ACCEPTED, RESAMPLED, BONUS, TARGET = range(4)


class Events:
    """Per-row event buffers: t (B, cap) float64 absolute times, tau (B, cap), x (B, cap) long, kind (B, cap)."""

    def __init__(self, num_types: int, batch: int, capacity: int):
        self.t = torch.zeros(batch, capacity, dtype=torch.float64)
        self.tau = torch.ones(batch, capacity)
        self.x = torch.full((batch, capacity), num_types, dtype=torch.long)
        self.kind = torch.full((batch, capacity), -1, dtype=torch.long)
        self.n = torch.zeros(batch, dtype=torch.long)  # (B,) committed events; never changed in place
        self.capacity = capacity
        self.limit = capacity  # a row stops committing once it has ``limit`` events (set by the run)
        self._rows = torch.arange(batch).unsqueeze(1)  # (B, 1)

    def tail(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions n-k+1 .. n of every row as model input: t (float32), tau, x, each (B, k)."""
        idx = self.n.unsqueeze(1) + torch.arange(1 - k, 1)  # (B, k)
        return self.t[self._rows, idx].float(), self.tau[self._rows, idx], self.x[self._rows, idx]

    def last_time(self) -> torch.Tensor:  # (B,) float64
        return self.t[self._rows[:, 0], self.n]

    def append(self, tau: torch.Tensor, x: torch.Tensor, count: torch.Tensor, kind: torch.Tensor) -> None:
        """Commit the first count[b] of m candidate events per row: tau, x, kind (B, m), count (B,).
        Columns past count[b] are written too (beyond n, so they are overwritten later). A row never goes past
        ``limit`` events: the rest of its round is dropped (the first ``limit`` events keep their law)."""
        m = tau.shape[1]
        if int(self.n.max()) + m >= self.capacity:
            raise ValueError(f"event buffer full ({self.capacity}): give a larger capacity")
        pos = self.n.unsqueeze(1) + 1 + torch.arange(m)  # (B, m)
        self.t[self._rows, pos] = self.last_time().unsqueeze(1) + torch.cumsum(tau.double(), 1)
        self.tau[self._rows, pos] = tau
        self.x[self._rows, pos] = x
        self.kind[self._rows, pos] = kind
        self.n = torch.minimum(self.n + count, torch.full_like(self.n, self.limit))


@dataclass
class RoundRecord:
    """One round of a sampler: mode "draft" / "self" / "ar", its length (K or l; 1 for ar), drafts kept per
    row before the first rejection (B,), events committed per row (B,), wall-clock seconds."""

    mode: str
    length: int
    num_accepted: list[int]
    committed: list[int]
    seconds: float


@dataclass
class SampleRun:
    """The first ``n_events`` events of every row and how the run went."""

    times: list[list[float]]  # per row, absolute times
    types: list[list[int]]
    kinds: list[list[str]]
    rounds: list[RoundRecord] = field(default_factory=list)
    seconds: float = 0.0
    start: float = 0.0  # time of the last history event (0 without history)

    @property
    def taus(self) -> list[list[float]]:
        return [[b - a for a, b in zip([self.start, *ts[:-1]], ts)] for ts in self.times]

    @property
    def events_per_second(self) -> float:
        n = sum(len(ts) for ts in self.times)
        return n / self.seconds if self.seconds > 0 else float("nan")

    def stats(self) -> dict:
        """acceptance = drafts kept / drafts evaluated (up to and including the first rejection);
        events per round over drafting rounds; lengths = how often each draft length was used."""
        spec = [r for r in self.rounds if r.mode != "ar"]
        kept = sum(sum(r.num_accepted) for r in spec)
        evaluated = sum(min(a + 1, r.length) for r in spec for a in r.num_accepted)
        rows = sum(len(r.committed) for r in spec)
        lengths: dict[int, int] = {}
        for r in self.rounds:
            lengths[0 if r.mode == "ar" else r.length] = lengths.get(0 if r.mode == "ar" else r.length, 0) + 1
        return dict(events=sum(len(ts) for ts in self.times), rounds=len(self.rounds), seconds=self.seconds,
                    events_per_s=self.events_per_second,
                    acceptance=kept / evaluated if evaluated else float("nan"),
                    events_per_round=sum(sum(r.committed) for r in spec) / rows if rows else float("nan"),
                    ar_rounds=len(self.rounds) - len(spec), lengths=dict(sorted(lengths.items())))
