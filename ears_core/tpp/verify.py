"""The draft-model acceptance rule for events (TPP-SD, made exact over the joint time-and-mark law).

Terms
-----
p*_j, q_j     the target's and the draft's law of the j-th drafted event given everything before it:
              densities over (tau, x), log-normal mixture in tau times categorical in x (``EventDist``)
accept        drafted event j stands with probability min(1, p*_j(tau_j, x_j) / q_j(tau_j, x_j)); the round
              keeps the drafts before the first rejection
residual      at the first rejection j, the replacement is drawn from max(0, p*_j - q_j) / Z: draw (tau, x)
              from p*_j and keep it with probability max(0, 1 - q_j / p*_j), repeat until one is kept
              (rejection sampling from p*_j with envelope p*_j: the kept draw has density max(0, p* - q) / Z)
bonus         every draft stood: one more event is drawn from p*_{K+1}
ratio         "joint" (the rule above, exact) or "time": only the time densities enter the ratio and the
              residual, the drafted mark is kept unverified and a replacement's mark is drawn from p*'s
              marks, as TPP-SD's public code does. "time" is NOT exact; it exists so the tests can show it.
"""

from __future__ import annotations

import torch

from .event_law import EventDist

__all__ = ["RATIOS", "stack_laws", "take", "log_density", "verify_drafts", "residual_draw"]

RATIOS = ("joint", "time")


def stack_laws(laws: list[EventDist]) -> EventDist:
    """K laws with leading shape (B,) -> one law with leading shape (B, K)."""
    return EventDist(*(torch.stack([getattr(d, f) for d in laws], 1) for f in ("w_logits", "mu", "sd", "type_logits")))


def take(dist: EventDist, j: torch.Tensor) -> EventDist:
    """Row b's law at column j[b]: leading (B, L) -> (B,)."""
    rows = torch.arange(j.shape[0])
    return EventDist(dist.w_logits[rows, j], dist.mu[rows, j], dist.sd[rows, j], dist.type_logits[rows, j])


def log_density(dist: EventDist, tau: torch.Tensor, x: torch.Tensor, ratio: str = "joint") -> torch.Tensor:
    """log p(tau, x) ("joint") or log p(tau) ("time"); tau, x have the dist's leading shape."""
    if ratio == "joint":
        return dist.log_prob(tau, x)
    y = torch.log(tau)
    return dist.log_prob_y(y) - y


def verify_drafts(p: EventDist, q: EventDist, tau: torch.Tensor, x: torch.Tensor, u: torch.Tensor,
                  ratio: str = "joint") -> tuple[torch.Tensor, torch.Tensor]:
    """p: target laws (B, >= K), q: draft laws (B, K), drafts tau, x and uniforms u (B, K).
    Returns (drafts kept before the first rejection (B,) long, log ratio (B, K))."""
    g = tau.shape[1]
    if ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {RATIOS}, got {ratio!r}")
    log_r = log_density(p[:, :g], tau, x, ratio) - log_density(q, tau, x, ratio)  # (B, g)
    keep = torch.log(u) < log_r  # u < min(1, r)
    return keep.long().cumprod(1).sum(1), log_r


def _repeat(d: EventDist, T: int) -> EventDist:  # leading (B,) -> (B, T) to score (B, T) draws
    return EventDist(*(f.unsqueeze(1).expand(-1, T, -1) for f in (d.w_logits, d.mu, d.sd, d.type_logits)))


def residual_draw(p: EventDist, q: EventDist, bonus: torch.Tensor, gen: torch.Generator | None = None,
                  ratio: str = "joint", tries: int = 16, max_rounds: int = 100_000):
    """One event per row from max(0, p - q) / Z, or from p where bonus[b] (every draft stood).
    p, q: leading (B,); bonus (B,) bool. Returns tau (B,), x (B,) long and the candidates drawn per row (B,)."""
    B = bonus.shape[0]
    if bool(bonus.all()):  # every row draws its bonus: one draw from p each
        tau, x = p.sample1(gen)
        return tau[..., 0], x[..., 0], torch.ones(B, dtype=torch.long)
    tau_out, x_out = torch.empty(B), torch.empty(B, dtype=torch.long)
    drawn = torch.zeros(B, dtype=torch.long)
    todo = torch.arange(B)
    pp, qq, bb = p, q, bonus
    for _ in range(max_rounds):
        tau, x = pp.sample(tries, gen)  # (b, T)
        pu, qu = _repeat(pp, tries), _repeat(qq, tries)
        log_acc = torch.log1p(-torch.exp(log_density(qu, tau, x, ratio) - log_density(pu, tau, x, ratio))
                              .clamp(max=1.0))  # log max(0, 1 - q / p), -inf where q >= p
        u = torch.rand(tau.shape, generator=gen)
        ok = (torch.log(u) < log_acc) | bb.unsqueeze(1)  # (b, T)
        hit = ok.any(1)  # (b,)
        first = ok.long().argmax(1)  # first kept candidate
        rows = torch.arange(len(todo))
        drawn[todo] += torch.where(hit, first + 1, torch.full_like(first, tries))
        done = todo[hit]
        tau_out[done], x_out[done] = tau[rows, first][hit], x[rows, first][hit]
        if bool(hit.all()):
            return tau_out, x_out, drawn
        keep = ~hit
        todo, pp, qq, bb = todo[keep], pp[keep], qq[keep], bb[keep]
    raise RuntimeError(f"residual draw: no candidate kept in {max_rounds * tries} tries (p and q nearly equal?)")
