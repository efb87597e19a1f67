"""The law of the next event and the checks on a given history: what every TPP sampler reads and writes.

Terms
-----
event            an inter-event time tau > 0 and a mark (event type) x in 0..C-1
history          the events before the next one, as absolute times t_1 < t_2 < ... and their marks
next-event law   p(tau, x | history) = p(tau | history) p(x | history): tau is a log-normal mixture of R
                 components (weights w, locations mu and scales sd of y = log tau), x is categorical over C marks
EventDist        that law for a batch of positions: tensors w_logits (..., R), mu (..., R), sd (..., R),
                 type_logits (..., C). Draws take an explicit ``torch.Generator`` so runs are seeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["EventDist", "check_history"]

LOG_2PI = math.log(2 * math.pi)


@dataclass
class EventDist:
    """p(tau, x | history) for a batch of positions; every tensor has the same leading shape (...)."""

    w_logits: torch.Tensor  # (..., R)
    mu: torch.Tensor  # (..., R) location of y = log tau
    sd: torch.Tensor  # (..., R) scale of y
    type_logits: torch.Tensor  # (..., C)

    @property
    def log_w(self) -> torch.Tensor:  # (..., R)
        return torch.log_softmax(self.w_logits, -1)

    @property
    def type_log_probs(self) -> torch.Tensor:  # (..., C)
        return torch.log_softmax(self.type_logits, -1)

    def __getitem__(self, idx) -> "EventDist":
        return EventDist(self.w_logits[idx], self.mu[idx], self.sd[idx], self.type_logits[idx])

    def log_prob_y(self, y: torch.Tensor) -> torch.Tensor:
        """log density of y = log tau; y has the leading shape (...) -> (...)."""
        z = (y.unsqueeze(-1) - self.mu) / self.sd  # (..., R)
        return torch.logsumexp(self.log_w - 0.5 * z * z - torch.log(self.sd) - 0.5 * LOG_2PI, -1)

    def log_prob(self, tau: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """log p(tau, x) with the Jacobian of tau = e^y: log p_y(log tau) - log tau. (...)"""
        y = torch.log(tau)
        lp_x = self.type_log_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        return self.log_prob_y(y) - y + lp_x

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """n i.i.d. draws per position: tau (..., n) float, x (..., n) long."""
        shape = (*self.mu.shape[:-1], n)
        dev = self.mu.device
        u = torch.rand((*shape, 2), generator=generator, device=dev)  # (..., n, 2)
        cw = torch.softmax(self.w_logits, -1).cumsum(-1).unsqueeze(-2)  # (..., 1, R)
        k = (cw[..., :-1] < u[..., :1]).sum(-1)  # (..., n) component index
        eps = torch.randn(shape, generator=generator, device=dev)
        mu = self.mu.unsqueeze(-2).expand(*shape, -1).gather(-1, k.unsqueeze(-1)).squeeze(-1)
        sd = self.sd.unsqueeze(-2).expand(*shape, -1).gather(-1, k.unsqueeze(-1)).squeeze(-1)
        tau = torch.exp(mu + sd * eps)
        ct = torch.softmax(self.type_logits, -1).cumsum(-1).unsqueeze(-2)  # (..., 1, C)
        x = (ct[..., :-1] < u[..., 1:]).sum(-1)
        return tau, x

    def sample1(self, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draw per position with fewer tensor calls than ``sample(1)`` (the samplers' hot path), the same
        draw for the same generator: tau (..., 1) float, x (..., 1) long."""
        u = torch.rand((*self.mu.shape[:-1], 2), generator=generator, device=self.mu.device)  # (..., 2)
        k = (torch.softmax(self.w_logits, -1).cumsum(-1)[..., :-1] < u[..., :1]).sum(-1, keepdim=True)  # (..., 1)
        eps = torch.randn(u[..., :1].shape, generator=generator, device=u.device)
        tau = torch.exp(torch.addcmul(self.mu.gather(-1, k), self.sd.gather(-1, k), eps))
        x = (torch.softmax(self.type_logits, -1).cumsum(-1)[..., :-1] < u[..., 1:]).sum(-1, keepdim=True)
        return tau, x


def check_history(history, num_types: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A history (times, types) checked for a model of ``num_types`` marks -> times (n,) float, types (n,) long.
    None is the empty history. Refused with a ValueError naming the fix: a count mismatch, a time <= 0,
    times not strictly increasing, a non-integer or unknown mark."""
    if history is None:
        return torch.zeros(0), torch.zeros(0, dtype=torch.long)
    times, types = history
    times = torch.as_tensor(times, dtype=torch.float32).flatten()
    types = torch.as_tensor(types).flatten()
    if times.numel() != types.numel():
        raise ValueError(f"history has {times.numel()} times but {types.numel()} types: give one type per event")
    if times.numel() and (times <= 0).any():
        raise ValueError("history times must be positive (t_1 > 0); shift the sequence so it starts after 0")
    if times.numel() > 1 and (times[1:] <= times[:-1]).any():
        raise ValueError("history times must be strictly increasing; sort the events and drop duplicates")
    if types.is_floating_point() and (types != types.round()).any():
        raise ValueError("history types must be integers")
    types = types.long()
    if types.numel() and ((types < 0) | (types >= num_types)).any():
        raise ValueError(f"unknown event type in history: types must be in 0..{num_types - 1} for this model")
    return times, types
