"""Exact event samplers for a transformer TPP target, behind one interface: a round commits events to B rows.

Terms
-----
round        one unit of work on every row. ``ar_round``: one target step, one event from p* (kind target).
             ``round(length)``: the sampler's speculative round with ``length`` drafted / proposed events.
pending      positions a model has not read yet. The target always has exactly one (position n, the last
             committed event), so a round feeds it [event n, drafts 1..K] in one pass and reads p* for
             events n+1..n+K+1; the draft has 1 at the start, 2 after a speculative round and one more
             per autoregressive round in between. Rolling back a cache is setting its length.
DraftSampler        TPP-SD: a draft transformer proposes K events autoregressively, the target scores
                    them in one pass, verify.py decides (joint time-and-mark ratio, residual, bonus).
SelfProposalSampler seed 001, Algorithm 1: l i.i.d. proposals from the target's own law at the round's first
                    position (heavy tail and uniform mixed in), kept with p*_j / (M_j q); the first rejection
                    ends the round and the next round starts at that position; a kept proposal
                    has the law p*_j whichever proposal the trial used, because M_j >= sup p*_j / q depends
                    only on the history (docs/tpp.md; the constants: constants.py).
"""

from __future__ import annotations

import math
import time

import torch

from .constants import LOG_SAFETY, mixture_log_bound
from .events import ACCEPTED, BONUS, RESAMPLED, TARGET, Events, RoundRecord
from .event_law import EventDist, check_history
from .transformer import TransformerTPP
from .verify import RATIOS, residual_draw, stack_laws, take, verify_drafts

__all__ = ["TPPSampler", "AutoregressiveSampler", "DraftSampler", "SelfProposalSampler", "proposal_law",
           "draw_proposals"]


class TPPSampler:
    """Common state: the target, its KV cache, the committed events; the autoregressive round."""

    mode = "ar"
    lengths: tuple[int, ...] = ()  # the draft lengths the cost model chooses from

    def __init__(self, target: TransformerTPP, batch: int, capacity: int, gen: torch.Generator, history=None):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.target, self.B, self.gen = target, batch, gen
        self.C = target.cfg.num_types
        times, types = check_history(history, target.cfg.num_types)
        h = self.n_history = times.numel()
        self.ev = Events(self.C, batch, capacity + h + 2)
        self.tc = target.new_cache(batch, capacity + h + 2)
        if h:
            taus = torch.diff(times, prepend=torch.zeros(1))
            ones = torch.ones(batch, dtype=torch.long)
            self.ev.append(taus.expand(batch, h), types.expand(batch, h), ones * h, torch.full((batch, h), TARGET))
            self._prefill(target, self.tc, h)

    def _prefill(self, model: TransformerTPP, cache, k: int) -> None:
        """``model`` reads positions 0..k-1 (the same for every row) into ``cache``."""
        with torch.inference_mode():
            model(self.ev.t[:, :k].float(), self.ev.tau[:, :k], self.ev.x[:, :k], cache)

    def target_pass(self, tau: torch.Tensor, x: torch.Tensor) -> EventDist:
        """Feed [event n, tau / x (B, m)]: p* for events n+1..n+m+1, leading (B, m+1)."""
        t0, tau0, x0 = self.ev.tail(1)  # (B, 1)
        if tau.shape[1]:  # times in float64 as the event buffer computes them, then float32 like its reads
            last = self.ev.last_time().unsqueeze(1)  # (B, 1)
            t = torch.cat([t0, (last + torch.cumsum(tau.double(), 1)).float()], 1)
        else:
            t = t0
        self.tc.length = self.ev.n
        return self.target.decode(self.target(t, torch.cat([tau0, tau], 1), torch.cat([x0, x], 1), self.tc))

    def ar_round(self) -> RoundRecord:
        t0 = time.perf_counter()
        with torch.inference_mode():
            empty = torch.zeros(self.B, 0)
            p = self.target_pass(empty, empty.long())[:, 0]  # (B,)
            tau, x = p.sample1(self.gen)  # (B, 1)
            one = torch.ones(self.B, dtype=torch.long)
            self.ev.append(tau, x, one, torch.full((self.B, 1), TARGET))
        self._after_ar()
        return RoundRecord("ar", 1, [0] * self.B, [1] * self.B, time.perf_counter() - t0)

    def _after_ar(self) -> None:
        pass

    def round(self, length: int) -> RoundRecord:
        return self.ar_round()


class AutoregressiveSampler(TPPSampler):
    """The baseline: every round is one target step."""


class DraftSampler(TPPSampler):
    """TPP-SD with the exact joint rule (module docstring); ``ratio="time"`` is the inexact ablation."""

    mode = "draft"
    lengths = (1, 2, 3, 4, 5, 6, 8, 10, 12)

    def __init__(self, target: TransformerTPP, draft: TransformerTPP, batch: int, capacity: int,
                 gen: torch.Generator, history=None, ratio: str = "joint"):
        if draft is None:
            raise ValueError("the draft-model sampler needs a draft model")
        if draft.cfg.num_types != target.cfg.num_types:
            raise ValueError(f"draft has {draft.cfg.num_types} event types, target {target.cfg.num_types}")
        if ratio not in RATIOS:
            raise ValueError(f"ratio must be one of {RATIOS}, got {ratio!r}")
        self.draft, self.ratio = draft, ratio
        super().__init__(target, batch, capacity, gen, history)
        self.dc = draft.new_cache(batch, self.ev.capacity)
        n = int(self.ev.n[0])
        if n:
            self._prefill(draft, self.dc, n)
        self.d_pending = 1  # position n

    def _after_ar(self) -> None:
        self.d_pending += 1

    def round(self, length: int) -> RoundRecord:
        g = int(length)
        if g < 1:
            raise ValueError(f"draft length K must be >= 1, got {length}")
        t0 = time.perf_counter()
        with torch.inference_mode():
            B, gen = self.B, self.gen
            t, tau, x = self.ev.tail(self.d_pending)  # (B, k) the positions the draft has not read
            self.dc.length = self.ev.n + 1 - self.d_pending
            h = self.draft(t, tau, x, self.dc)[:, -1]  # (B, D)
            t_cur, laws, taus, xs = self.ev.last_time(), [], [], []  # (B,) float64
            for i in range(g):
                q = self.draft.decode(h)  # leading (B,)
                tau_i, x_i = q.sample1(gen)  # (B, 1)
                laws.append(q), taus.append(tau_i), xs.append(x_i)
                if i < g - 1:
                    t_cur = t_cur + tau_i[:, 0].double()
                    h = self.draft(t_cur.unsqueeze(1).float(), tau_i, x_i, self.dc)[:, -1]
            d_tau, d_x = torch.cat(taus, 1), torch.cat(xs, 1)  # (B, g)
            q = stack_laws(laws)  # (B, g)
            p = self.target_pass(d_tau, d_x)  # (B, g+1)
            n_acc, _ = verify_drafts(p, q, d_tau, d_x, torch.rand(B, g, generator=gen), self.ratio)  # (B,)
            bonus = n_acc == g
            q_j = take(q, n_acc.clamp(max=g - 1))
            e_tau, e_x, _ = residual_draw(take(p, n_acc), q_j, bonus, gen, self.ratio)  # (B,)
            cols = torch.arange(g + 1)
            at = cols == n_acc.unsqueeze(1)  # (B, g+1) the replacement / bonus column
            new_tau = torch.where(at, e_tau.unsqueeze(1), torch.cat([d_tau, d_tau[:, :1]], 1))
            new_x = torch.where(at, e_x.unsqueeze(1), torch.cat([d_x, d_x[:, :1]], 1))
            kind = torch.where(at, torch.where(bonus, BONUS, RESAMPLED).unsqueeze(1), torch.full_like(new_x, ACCEPTED))
            self.ev.append(new_tau, new_x, n_acc + 1, kind)
            self.d_pending = 2
            acc = n_acc.tolist()
        return RoundRecord("draft", g, acc, [a + 1 for a in acc], time.perf_counter() - t0)


def proposal_law(d: EventDist, eps: float, widen: float):
    """Seed 001's proposal from the target law d (leading (B,)): mixture comps (log w, mu, sd) (B, R),
    heavy tail (log eps, mu_h, sd_h) (B,), type log-probs (B, C) with a uniform of weight eps mixed in."""
    lw = d.log_w  # (B, R)
    mu_h = (torch.exp(lw) * d.mu).sum(-1)
    sd_h = widen * d.sd.amax(-1)
    C = d.type_logits.shape[-1]
    type_lp = torch.logaddexp(d.type_log_probs + math.log1p(-eps), torch.full_like(d.type_logits, math.log(eps / C)))
    return (lw + math.log1p(-eps), d.mu, d.sd), (torch.full_like(mu_h, math.log(eps)), mu_h, sd_h), type_lp


def draw_proposals(comps, heavy, type_lp, l: int, gen):
    """l i.i.d. proposals per row: y = log tau (B, l), x (B, l), log q(y) + log q(x) (B, l)."""
    lw = torch.cat([comps[0], heavy[0].unsqueeze(1)], 1)  # (B, R+1)
    mu = torch.cat([comps[1], heavy[1].unsqueeze(1)], 1)
    sd = torch.cat([comps[2], heavy[2].unsqueeze(1)], 1)
    B = lw.shape[0]
    u = torch.rand(B, l, 2, generator=gen)
    k = (torch.exp(lw).cumsum(1)[:, :-1].unsqueeze(1) < u[..., :1]).sum(-1)  # (B, l)
    y = mu.gather(1, k) + sd.gather(1, k) * torch.randn(B, l, generator=gen)
    x = (torch.exp(type_lp).cumsum(1)[:, :-1].unsqueeze(1) < u[..., 1:]).sum(-1)  # (B, l)
    z = (y.unsqueeze(-1) - mu.unsqueeze(1)) / sd.unsqueeze(1)  # (B, l, R+1)
    log_q = torch.logsumexp(lw.unsqueeze(1) - 0.5 * z * z - torch.log(sd).unsqueeze(1), -1) \
        - 0.5 * math.log(2 * math.pi) + type_lp.gather(1, x)
    return y, x, log_q


class SelfProposalSampler(TPPSampler):
    """Seed 001, Algorithm 1, on the transformer target (module docstring)."""

    mode = "self"
    lengths = (1, 2, 3, 4, 6, 8, 12, 16)

    def __init__(self, target: TransformerTPP, batch: int, capacity: int, gen: torch.Generator, history=None,
                 eps: float = 0.02, widen: float = 3.0, cells: int = 256, z: float = 4.0):
        if not 0 < eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {eps}")
        super().__init__(target, batch, capacity, gen, history)
        self.eps, self.widen, self.cells, self.z = eps, widen, cells, z
        self.next_law: EventDist | None = None  # p* of event n+1 when known
        self.fresh = torch.zeros(batch, dtype=torch.bool)  # the row's last round ended in a rejection
        self.max_mass_outside = 0.0

    def time_bound(self, pl: EventDist, comps, heavy) -> tuple[torch.Tensor, torch.Tensor]:
        """log M_time >= sup_y p*_j(y) / q(y) of the time law at each of the l positions, and the target mass
        outside the bound's domain (0 with the heavy tail): pl leading (B, l), the proposal's comps (B, R) and
        heavy tail (B,) -> (B, l), (B, l)."""
        l = pl.mu.shape[1]
        if pl.mu.shape[0] == 1:  # one grid for the l positions, the shared proposal evaluated on it once
            log_m_time, _, _, outside, _ = mixture_log_bound(
                pl.log_w[0], pl.mu[0], pl.sd[0], *(c[0] for c in comps), tuple(h[0] for h in heavy),
                cells=self.cells, z=self.z, mediant=False, shared_grid=True)
            return log_m_time.unsqueeze(0), outside.unsqueeze(0)
        ex = [c.unsqueeze(1).expand(-1, l, -1) for c in comps]  # (B, l, R)
        log_m_time, _, _, outside, _ = mixture_log_bound(
            pl.log_w, pl.mu, pl.sd, *ex, tuple(h.unsqueeze(1).expand(-1, l) for h in heavy),
            cells=self.cells, z=self.z, mediant=False)
        return log_m_time, outside

    def _after_ar(self) -> None:
        self.next_law = None
        self.fresh = torch.zeros_like(self.fresh)

    def round(self, length: int) -> RoundRecord:
        l = int(length)
        if l < 1:
            raise ValueError(f"proposals per round l must be >= 1, got {length}")
        t0 = time.perf_counter()
        with torch.inference_mode():
            B = self.B
            if self.next_law is None:
                empty = torch.zeros(B, 0)
                self.next_law = self.target_pass(empty, empty.long())[:, 0]
            comps, heavy, type_lp = proposal_law(self.next_law, self.eps, self.widen)
            y, x, log_q = draw_proposals(comps, heavy, type_lp, l, self.gen)  # (B, l)
            tau = torch.exp(y)
            p = self.target_pass(tau, x)  # (B, l+1)
            pl = p[:, :l]
            log_p = pl.log_prob_y(y) + pl.type_log_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # (B, l)
            log_m_time, outside = self.time_bound(pl, comps, heavy)  # (B, l)
            log_m = log_m_time + (pl.type_log_probs - type_lp.unsqueeze(1)).amax(-1) + LOG_SAFETY  # (B, l)
            first = torch.clamp(log_m[:, 0], max=-2 * math.log1p(-self.eps) + LOG_SAFETY)  # q >= (1-eps)^2 p*_1
            log_m = torch.cat([first.unsqueeze(1), log_m[:, 1:]], 1)
            keep = torch.log(torch.rand(B, l, generator=self.gen)) < log_p - log_m - log_q
            n_acc = keep.long().cumprod(1).sum(1)  # (B,)
            kind = torch.full((B, l), ACCEPTED)
            kind[:, 0] = torch.where(self.fresh, RESAMPLED, ACCEPTED)
            self.ev.append(tau, x, n_acc, kind)
            self.next_law = take(p, n_acc)
            self.fresh = n_acc < l
            self.max_mass_outside = max(self.max_mass_outside, float(outside.max()))
            acc = n_acc.tolist()
        return RoundRecord("self", l, acc, acc, time.perf_counter() - t0)
