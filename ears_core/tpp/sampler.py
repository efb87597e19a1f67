"""Exact speculative sampling of event sequences (seed 001, Algorithm 1) and the autoregressive baseline.

Terms
-----
position j      the j-th event after the committed history (j = 1..l within one step)
target p*_j     the model's own law of event j given the history and the proposals before it
proposal q      one law for all l positions of a step: the target at position 1 (the model at the current
                state), with a heavy tail h mixed into the time law (weight eps, scale ``widen`` times
                the widest component) and a uniform mixed into the type law (weight eps), so that
                p*_j / q is bounded everywhere for every position (see constants.py)
M_j             rejection constant of position j: M_time (mixture bound) x M_type (largest type ratio)
step            draw l proposals from q in one batch; read them with one encoder call; decode all l + 1
                targets in one batch; keep proposal j with probability p*_j(e_j) / (M_j q(e_j)); the first
                rejection ends the step: everything after it is discarded, and the next step starts at that
                position with state and proposal updated to that position's target (Algorithm 1, lines 14-15)
accepted        an event that is a kept proposal
resampled       the event at a position whose first proposal was rejected, drawn at the start of the next
                step from a proposal built on that position's own target
target          an event of the plain autoregressive sampler

Why it is exact: given the history, every trial at position j keeps a proposal with probability
p*_j / (M_j q), M_j >= sup p*_j / q depending on the history only, so a kept proposal is distributed as
p*_j whichever proposal the trial used (ordinary rejection sampling); a rejected trial is simply retried
at the next step. So event j ~ p*_j given the history, and the sequence has the model's law. At position
1 the proposal is (1 - eps) p*_1 + eps (...), so M_1 = 1/(1 - eps)^2 exactly and each step keeps at
least one event with probability about (1 - eps)^2. Where
a time law has no finite bound (a target component wider than the heavy tail), M covers the target's
central range and that step's ``mass_outside`` bounds the distortion; it is recorded and reported.

Beyond the seed (optional, off by default, NOT exact): ``SpecConfig(beta > 0)`` keeps proposal j when
u < a_j + beta * (1 - max_c p*_j(c)), an EARS-style tolerance relaxed by the target's own uncertainty
over event types (seed 000's rule carried over to events). It raises acceptance and distorts the law;
its distortion was measured against the exact samplers when this GRU sampler was benchmarked (docs/tpp.md).
"""

from __future__ import annotations

import bisect
import math
import time as _time
from dataclasses import dataclass, field

import torch

from .constants import LOG_SAFETY, mixture_log_bound
from .model import EventDist, NeuralTPP

__all__ = ["SpecConfig", "TPPStep", "SampleResult", "autoregressive_sample", "speculative_sample",
           "proposal_law", "check_history", "step_laws"]


@dataclass
class SpecConfig:
    l: int = 8  # proposals per step
    eps: float = 0.02  # heavy-tail weight in the time proposal and uniform weight in the type proposal
    widen: float = 3.0  # heavy tail scale / widest component scale
    cells: int = 512  # grid cells of the mixture bound (512: within ~5% of the true sup on the shipped model)
    z: float = 4.0  # the bound's grid spans every target component's mean +- z scales
    beta: float = 0.0  # EARS-style tolerance, beyond the seed (see below); 0 keeps the sampler exact


@dataclass
class TPPStep:
    """One speculative step: the l proposals and their fate."""

    tau: list[float]  # proposed inter-event times (l,)
    types: list[int]
    accept_prob: list[float]  # p*_j(e_j) / (M_j q(e_j)) (l,)
    M: list[float]  # M_j (l,)
    num_accepted: int  # proposals kept before the first rejection
    mass_outside: float  # largest target mass outside a truncated bound's domain in this step (0: exact)


@dataclass
class SampleResult:
    times: list[float]
    types: list[int]
    kinds: list[str]  # "accepted" / "resampled" / "target", per event
    steps: list[TPPStep] = field(default_factory=list)
    seconds: float = 0.0
    start: float = 0.0  # time of the last history event (0 without history)

    @property
    def events_per_second(self) -> float:
        return len(self.times) / self.seconds if self.seconds > 0 else float("nan")

    @property
    def taus(self) -> list[float]:
        return [t - s for t, s in zip(self.times, [self.start, *self.times[:-1]])]

    def stats(self) -> dict:
        """Acceptance rate (kept / proposal positions evaluated) and mean accepted per step."""
        n = len(self.steps)
        evaluated = sum(min(s.num_accepted + 1, len(s.tau)) for s in self.steps)
        accepted = sum(s.num_accepted for s in self.steps)
        return dict(events=len(self.times), steps=n, seconds=self.seconds, events_per_s=self.events_per_second,
                    acceptance_rate=accepted / evaluated if evaluated else float("nan"),
                    mean_accepted_per_step=accepted / n if n else float("nan"),
                    events_per_step=len(self.times) / n if n else float("nan"),
                    max_mass_outside=max((s.mass_outside for s in self.steps), default=0.0))


def check_history(model: NeuralTPP, history) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate (times, types) and return them as (n,) tensors."""
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
    C = model.cfg.num_types
    if types.numel() and ((types < 0) | (types >= C)).any():
        raise ValueError(f"unknown event type in history: types must be in 0..{C - 1} for this model")
    return times, types


def _check_budget(n_events, t_end):
    if n_events is None and t_end is None:
        raise ValueError("give n_events (how many events to draw) or t_end (the end of the time window)")
    if n_events is not None and (int(n_events) != n_events or n_events < 1):
        raise ValueError(f"n_events must be a positive integer, got {n_events}")
    if t_end is not None and not t_end > 0:
        raise ValueError(f"t_end must be positive, got {t_end}")


def _start(model: NeuralTPP, history) -> tuple[torch.Tensor, float]:
    times, types = check_history(model, history)
    h = model.start(1)  # (1, H)
    if times.numel():
        taus = torch.diff(times, prepend=torch.zeros(1))
        h = model.encode(taus.unsqueeze(0), types.unsqueeze(0), h)[:, -1]
    return h, float(times[-1]) if times.numel() else 0.0


def _done(n: int, t: float, n_events, t_end) -> bool:
    return (n_events is not None and n >= n_events) or (t_end is not None and t > t_end)


@torch.no_grad()
def autoregressive_sample(model: NeuralTPP, *, n_events: int | None = None, t_end: float | None = None,
                          history=None, seed: int = 0) -> SampleResult:
    """The baseline: one event per encoder call. Stops after ``n_events`` or at the first event past ``t_end``
    (which is not kept)."""
    _check_budget(n_events, t_end)
    gen = torch.Generator().manual_seed(seed)
    t0 = _time.perf_counter()
    h, t = _start(model, history)
    t_start, times, types = t, [], []
    while True:
        tau, x = model.decode(h).sample(1, gen)  # (1, 1) each
        t += float(tau)
        if _done(len(times), t, n_events, t_end):
            break
        times.append(t)
        types.append(int(x))
        h = model.encode(tau, x, h)[:, -1]  # (1, H)
    return SampleResult(times, types, ["target"] * len(times), seconds=_time.perf_counter() - t0, start=t_start)


def proposal_law(dist: EventDist, cfg: SpecConfig):
    """The step's proposal from the target at position 1 (leading shape ()): time comps (log w, mu, sd) (K,),
    heavy tail (log eps, mu_h, sd_h) (), type log-probs (C,)."""
    log_w = dist.log_w + math.log1p(-cfg.eps)  # (K,)
    w = torch.exp(dist.log_w)
    mu_h = (w * dist.mu).sum(-1)
    sd_h = cfg.widen * dist.sd.amax(-1)
    C = dist.type_logits.shape[-1]
    type_lp = torch.logaddexp(dist.type_log_probs + math.log1p(-cfg.eps),
                              torch.full_like(dist.type_logits, math.log(cfg.eps / C)))  # (C,)
    return (log_w, dist.mu, dist.sd), (torch.tensor(math.log(cfg.eps)), mu_h, sd_h), type_lp


def _draw_proposals(comps, heavy, type_lp, l: int, gen: torch.Generator):
    """l i.i.d. draws from the proposal: y = log tau (l,), x (l,) long, and log q(y) + log q(x) (l,)."""
    lw = torch.cat([comps[0], heavy[0].reshape(1)])  # (K+1,)
    mu = torch.cat([comps[1], heavy[1].reshape(1)])
    sd = torch.cat([comps[2], heavy[2].reshape(1)])
    u = torch.rand(l, 2, generator=gen)
    k = (torch.exp(lw).cumsum(0)[:-1].unsqueeze(0) < u[:, :1]).sum(-1)  # (l,) component
    y = mu[k] + sd[k] * torch.randn(l, generator=gen)
    x = (torch.exp(type_lp).cumsum(0)[:-1].unsqueeze(0) < u[:, 1:]).sum(-1)  # (l,)
    z = (y.unsqueeze(-1) - mu) / sd  # (l, K+1)
    log_q = torch.logsumexp(lw - 0.5 * z * z - torch.log(sd), -1) - 0.5 * math.log(2 * math.pi) + type_lp[x]
    return y, x, log_q


@torch.no_grad()
def speculative_sample(model: NeuralTPP, *, l: int = 8, n_events: int | None = None, t_end: float | None = None,
                       history=None, seed: int = 0, cfg: SpecConfig | None = None) -> SampleResult:
    """Algorithm 1 of seed 001: l proposals per step, the next step restarts at the first rejected position
    with state and proposal moved there (module docstring). Stops after ``n_events`` or at the first event
    past ``t_end``, like ``autoregressive_sample``."""
    if isinstance(l, bool) or int(l) != l or l < 1:
        raise ValueError(f"l (proposals per step) must be an integer >= 1, got {l}")
    _check_budget(n_events, t_end)
    cfg = SpecConfig(l=int(l), **{k: v for k, v in vars(cfg or SpecConfig()).items() if k != "l"})
    if not 0 < cfg.eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {cfg.eps}")
    if not 0 <= cfg.beta <= 1:
        raise ValueError(f"beta (the tolerance) must be in [0, 1], got {cfg.beta}; 0 is the exact sampler")
    l = cfg.l
    gen = torch.Generator().manual_seed(seed)
    t0 = _time.perf_counter()
    h, t = _start(model, history)  # (1, H)
    t_start, times, types, kinds, steps = t, [], [], [], []
    dist0 = model.decode(h[0])  # target at position 1, leading shape ()
    after_rejection = False
    while not _done(len(times), t, n_events, t_end):
        comps, heavy, type_lp = proposal_law(dist0, cfg)
        y, x, log_q = _draw_proposals(comps, heavy, type_lp, l, gen)  # (l,)
        hs = model.encode(torch.exp(y).unsqueeze(0), x.unsqueeze(0), h)[0]  # (l, H) one encoder call
        states = torch.cat([h, hs])  # (l+1, H): the state before each position, and after the last
        tgt_all = model.decode(states)  # targets p*_j for j = 1..l+1, leading shape (l+1,)
        tgt = tgt_all[:l]
        log_p = tgt.log_prob_y(y) + tgt.type_log_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # (l,)
        # one grid for all l positions: the shared proposal (K,) is evaluated on it once
        log_m_time, _, _, outside, _ = mixture_log_bound(tgt.log_w, tgt.mu, tgt.sd, *comps, heavy, cells=cfg.cells,
                                                         z=cfg.z, mediant=False, shared_grid=True)  # (l,)
        log_m = log_m_time + (tgt.type_log_probs - type_lp).amax(-1) + LOG_SAFETY  # (l,)
        log_m[0] = min(float(log_m[0]), -2 * math.log1p(-cfg.eps) + LOG_SAFETY)  # q >= (1 - eps)^2 p*_1 exactly
        log_a = log_p - log_m - log_q  # log acceptance probability (l,)
        u = torch.rand(l, generator=gen)
        if cfg.beta > 0:  # beyond the seed: pardon a near miss by the target's own type uncertainty (inexact)
            keep = u < torch.exp(log_a) + cfg.beta * (1 - torch.exp(tgt.type_log_probs).amax(-1))  # (l,)
        else:
            keep = torch.log(u) < log_a  # (l,)
        n_acc = int(keep.long().cumprod(0).sum())  # proposals before the first rejection
        steps.append(TPPStep(torch.exp(y).tolist(), x.tolist(), torch.exp(log_a).tolist(),
                                torch.exp(log_m).tolist(), n_acc, float(outside.max())))
        new_t = (t + torch.cumsum(torch.exp(y[:n_acc]).double(), 0)).tolist()  # times of the kept events
        keep = n_acc if n_events is None else min(n_acc, n_events - len(times))
        if t_end is not None:
            keep = min(keep, bisect.bisect_right(new_t, t_end))  # the first event past t_end is not kept
        times.extend(new_t[:keep])
        types.extend(x[:keep].tolist())
        kinds.extend(["resampled" if after_rejection else "accepted"] + ["accepted"] * (keep - 1) if keep else [])
        if keep < n_acc:  # the budget ran out inside this step
            break
        t = new_t[-1] if n_acc else t
        # the next step starts at the first rejected position (or after the last proposal), from its own target
        after_rejection = n_acc < l
        h, dist0 = states[n_acc:n_acc + 1], tgt_all[n_acc]
    return SampleResult(times, types, kinds, steps, seconds=_time.perf_counter() - t0, start=t_start)


@torch.no_grad()
def step_laws(model: NeuralTPP, result: SampleResult, step: int, position: int, cfg: SpecConfig | None = None,
              history=None) -> dict:
    """Recompute, for display, the time laws of one speculative position (1-based) of a finished run:
    proposal and target components (log w, mu, sd) in y = log tau, M_time, M_type, the proposed tau and
    whether it was kept. Step s starts after the events kept by steps 0..s-1."""
    cfg = cfg or SpecConfig()
    if not 0 <= step < len(result.steps) or not 1 <= position <= len(result.steps[step].tau):
        raise ValueError(f"step must be in 0..{len(result.steps) - 1} and position in 1..l")
    start = sum(s.num_accepted for s in result.steps[:step])
    times, types = check_history(model, history)
    taus = [*torch.diff(times, prepend=torch.zeros(1)).tolist(), *result.taus[:start]]
    xs = [*types.tolist(), *result.types[:start]]
    rec = result.steps[step]
    h = model.start(1)
    if taus:
        h = model.encode(torch.tensor([taus]), torch.tensor([xs]), h)[:, -1]
    comps, heavy, type_lp = proposal_law(model.decode(h[0]), cfg)
    if position > 1:
        h = model.encode(torch.tensor([rec.tau[:position - 1]]), torch.tensor([rec.types[:position - 1]]), h)[:, -1]
    tgt = model.decode(h[0])
    log_m, *_ = mixture_log_bound(tgt.log_w, tgt.mu, tgt.sd, *comps, heavy, cells=cfg.cells, z=cfg.z)
    prop_w = torch.cat([comps[0], heavy[0].reshape(1)])
    return dict(step=step, position=position, target=(tgt.log_w.tolist(), tgt.mu.tolist(), tgt.sd.tolist()),
                proposal=(prop_w.tolist(), torch.cat([comps[1], heavy[1].reshape(1)]).tolist(),
                          torch.cat([comps[2], heavy[2].reshape(1)]).tolist()),
                M_time=float(torch.exp(log_m)), M_type=float(torch.exp((tgt.type_log_probs - type_lp).amax())),
                tau=rec.tau[position - 1], kept=position <= rec.num_accepted, M_recorded=rec.M[position - 1])
