"""Rejection constants M >= sup f_T / f_P for exact rejection sampling (seed 001).

Terms
-----
target f_T     the law we must sample exactly (the full model at a position)
proposal f_P   the law we drew from; a draw y is kept with probability f_T(y) / (M f_P(y))
M              an upper bound of the ratio r = f_T / f_P on a stated domain D; the acceptance rate is 1/M
mass outside   the target's probability outside D. Where r is unbounded, D is a central target quantile
               range (mass ``alpha`` outside) and draws outside it are kept with probability min(1, r/M):
               that mass bounds the distortion. 0 when D is the whole support.
heavy tail     a wide component mixed into a proposal with small weight eps so that r is bounded everywhere

Closed forms (derived here; the seed's exponential ratio has the exponent's sign reversed):
- categorical: M = max_i p_T(i) / p_P(i)
- exponential: r(x) = (l_T / l_P) exp(-(l_T - l_P) x). l_T >= l_P: r falls, M = l_T / l_P at x = 0.
  l_T < l_P: r grows without bound; truncate at the target's (1 - alpha) quantile.
- Gaussian in y (log-normal in x = e^y; the Jacobians cancel): log r(y) = A y^2 + B y + C with
  A = 1/(2 s_P^2) - 1/(2 s_T^2). A < 0 (s_T < s_P): maximum at y* = -B / (2A), i.e.
  x* = exp((mu_T s_P^2 - mu_P s_T^2) / (s_P^2 - s_T^2)); otherwise unbounded (unless identical).
- Gaussian / log-normal mixtures (the model's decoder): per-cell interval bounds on a grid over the
  target's bulk D (a Gaussian's max on a cell is at its clamped mean, its min at an end), and
  closed-form quadratic sups on the two tails against the proposal's heavy
  tail; with paired components (same R, as in the sampler), also the global mediant bound
  max_k min(w_k N_k / (v_k N'_k), N_k / (eps h)) (ratio of sums <= largest ratio of terms), tight when the
  two mixtures are close. Every piece is a true upper bound, so M never falls below the supremum.
- anything else: the seed's piecewise envelope (Algorithms 2 and 3): a grid from target quantiles,
  tangent lines at cell mid-points, upper bounds for the target and lower bounds for the proposal. A
  tangent/chord bound holds on cells where the density is convex or concave; the grid must be fine
  enough that cells with an inflection point do not matter (checked against dense grids in the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

D = torch.distributions
INF = float("inf")
LOG_SAFETY = 1e-4  # M is inflated by e^1e-4 so float rounding never makes an acceptance probability exceed 1

__all__ = ["RejectionConstant", "rejection_constant", "quad_sup", "mixture_log_bound", "envelope_constant",
           "with_heavy_tail"]


@dataclass
class RejectionConstant:
    M: torch.Tensor  # () or batch shape: the constant (inf if no bound exists on the domain)
    lo: torch.Tensor  # domain D = [lo, hi] in the distribution's own coordinate
    hi: torch.Tensor
    mass_outside: torch.Tensor  # target probability outside D
    method: str


def quad_sup(A, B, C, lo, hi):
    """sup over y in [lo, hi] of A y^2 + B y + C, elementwise; lo may be -inf, hi +inf; +inf if unbounded."""
    A, B, C, lo, hi = torch.broadcast_tensors(A, B, C, lo, hi)
    neg = torch.full_like(A, -INF)

    def q(y):
        return torch.where(torch.isfinite(y), A * y * y + B * y + C, neg)

    a_neg = A < 0
    finite_end = torch.where(torch.isfinite(lo), lo, torch.where(torch.isfinite(hi), hi, torch.zeros_like(hi)))
    ystar = torch.where(a_neg, -B / (2 * torch.where(a_neg, A, -torch.ones_like(A))), finite_end)
    yc = torch.minimum(torch.maximum(ystar, lo), hi)
    best = torch.maximum(torch.maximum(q(lo), q(hi)), q(yc))
    grows_right = (A > 0) | ((A == 0) & (B > 0))
    grows_left = (A > 0) | ((A == 0) & (B < 0))
    unbounded = ((hi == INF) & grows_right) | ((lo == -INF) & grows_left)
    return torch.where(unbounded, torch.full_like(A, INF), best)


def _pair_coeffs(lw_a, mu_a, sd_a, lw_b, mu_b, sd_b):
    """log(a N(y; mu_a, sd_a)) - log(b N(y; mu_b, sd_b)) = A y^2 + B y + C."""
    ia, ib = 1 / (sd_a * sd_a), 1 / (sd_b * sd_b)
    A = 0.5 * (ib - ia)
    B = mu_a * ia - mu_b * ib
    C = lw_a - lw_b + torch.log(sd_b / sd_a) - 0.5 * mu_a * mu_a * ia + 0.5 * mu_b * mu_b * ib
    return A, B, C


def mixture_log_bound(tw, tmu, tsd, pw, pmu, psd, heavy=None, *, cells: int = 128, z: float = 4.0,
                      mediant: bool = True, shared_grid: bool = False):
    """log M for Gaussian mixtures in y (log-normal mixtures in tau = e^y), batched.

    tw, tmu, tsd: target log-weights, locations, scales (..., R); pw, pmu, psd: proposal (..., J);
    heavy: optional (log_eps, mu_h, sd_h), each (...), an extra proposal component.
    Inside D = [min_k mu_k - z sd_k, max_k mu_k + z sd_k], cut in ``cells`` equal cells [a, b]: interval
    bounds, exact per component because a Gaussian is unimodal: target <= sum_k w_k N_k(clamp(mu_k, a, b)),
    proposal >= sum_j v_j min(N_j(a), N_j(b)) (heavy tail included).
    Tails y < lo, y > hi: sum_k w_k N_k / (eps h) with each term's quadratic sup in closed form (or, with
    no heavy tail and paired components, the mediant max_k w_k N_k / (v_k N'_k)).
    ``mediant=False`` skips the mediant bound (fewer tensor calls; the sampler's fine grid is tight already).
    ``shared_grid=True``: one grid spanning every batch row's D, so a proposal shared by the rows (given
    unbatched, (J,)) is evaluated once on it.
    Returns (log_M, lo, hi, mass_outside, truncated), each (...): where a tail has no finite bound,
    log_M covers D only and mass_outside is the target's mass outside D.
    """
    lo = (tmu - z * tsd).amin(-1)  # (...)
    hi = (tmu + z * tsd).amax(-1)
    if shared_grid:
        lo, hi = lo.amin(), hi.amax()  # ()
    inner = _grid_bound(tw, tmu, tsd, pw, pmu, psd, heavy, lo, hi, cells)  # (...)
    inf = torch.full_like(lo, INF)
    tail = _tails_bound(tw, tmu, tsd, pw, pmu, psd, heavy, lo, hi, inf)  # (...)
    truncated = ~torch.isfinite(tail)
    log_m = torch.maximum(inner, torch.where(truncated, -inf, tail))
    if mediant and pw.shape[-1] == tw.shape[-1]:  # paired components: the global mediant bound, tight when T ~ P
        med = _mediant_bound(tw, tmu, tsd, pw, pmu, psd, heavy, inf)  # (...)
        log_m = torch.where(truncated & torch.isfinite(med), med, torch.minimum(log_m, med))
        truncated = truncated & ~torch.isfinite(med)
    log_m = log_m + LOG_SAFETY
    outside = torch.zeros_like(lo)
    if bool(truncated.any()):
        cdf = torch.special.ndtr
        mass = (torch.exp(tw) * (cdf((lo.unsqueeze(-1) - tmu) / tsd) + cdf((tmu - hi.unsqueeze(-1)) / tsd))).sum(-1)
        outside = torch.where(truncated, mass, outside)
    return log_m, lo, hi, outside, truncated


def _grid_bound(tw, tmu, tsd, pw, pmu, psd, heavy, lo, hi, cells: int):
    """log of the largest per-cell bound of target / proposal over ``cells`` equal cells of [lo, hi] (...)
    (the heavy tail, if given, is one more proposal component)."""
    frac = torch.linspace(0, 1, cells + 1, dtype=tmu.dtype, device=tmu.device)
    y = lo.unsqueeze(-1) + (hi - lo).unsqueeze(-1) * frac  # (..., G+1) grid, or (G+1,) when shared
    pm, ps, pwh = pmu, psd, pw
    if heavy is not None:
        pm, ps = torch.cat([pmu, heavy[1].unsqueeze(-1)], -1), torch.cat([psd, heavy[2].unsqueeze(-1)], -1)
        pwh = torch.cat([pw, heavy[0].unsqueeze(-1)], -1)
    # each Gaussian is unimodal: its max on a cell [a, b] is at clamp(mu, a, b), its min at an end.
    # Linear space, weights shifted by their max (the common 1/sqrt(2 pi) cancels in the ratio).
    m_t, m_p = tw.amax(-1, keepdim=True), pwh.amax(-1, keepdim=True)
    ct = (torch.exp(tw - m_t) / tsd).unsqueeze(-1)  # (..., R, 1) weight / scale
    cp = (torch.exp(pwh - m_p) / ps).unsqueeze(-1)  # (..., J, 1)
    a, b = y[..., :-1].unsqueeze(-1), y[..., 1:].unsqueeze(-1)  # (..., G, 1) cell ends
    mu_t, mu_p = tmu.unsqueeze(-2), pm.unsqueeze(-2)  # (..., 1, R), (..., 1, J)
    zt = (torch.minimum(torch.maximum(mu_t, a), b) - mu_t) / tsd.unsqueeze(-2)  # (..., G, R)
    num = (torch.exp(-0.5 * zt * zt) @ ct).squeeze(-1)  # (..., G) target upper bound per cell
    zp = (y.unsqueeze(-1) - mu_p) / ps.unsqueeze(-2)  # (..., G+1, J) at the grid points
    ep = torch.exp(-0.5 * zp * zp)
    den = (torch.minimum(ep[..., :-1, :], ep[..., 1:, :]) @ cp).squeeze(-1)  # (..., G) proposal lower bound
    return torch.log((num / den).amax(-1)) + (m_t - m_p).squeeze(-1)  # (...); den > 0 inside D


def _tails_bound(tw, tmu, tsd, pw, pmu, psd, heavy, lo, hi, inf):
    """log sup of target / proposal on the tails (-inf, lo] and [hi, inf) (...): against the heavy tail alone
    (each target term's quadratic sup in closed form), else by paired components; +inf where unbounded."""
    if heavy is not None:  # tails against the heavy tail alone: log(w_k N_k / (eps h)) = A y^2 + B y + C
        le, mh, sh = (v.unsqueeze(-1) for v in heavy)  # (..., 1)
        ik, ih = 1 / (tsd * tsd), 1 / (sh * sh)
        A, B = 0.5 * (ih - ik), tmu * ik - mh * ih  # (..., R); A < 0 iff the component is narrower than h
        C = tw - le + torch.log(sh / tsd) - 0.5 * tmu * tmu * ik + 0.5 * mh * mh * ih
        ystar = -B / (2 * torch.where(A < 0, A, -torch.ones_like(A)))
        yt = torch.stack([torch.minimum(ystar, lo.unsqueeze(-1)), torch.maximum(ystar, hi.unsqueeze(-1))], -2)  # (..., 2, R)
        vals = torch.where((A < 0).unsqueeze(-2), A.unsqueeze(-2) * yt * yt + B.unsqueeze(-2) * yt + C.unsqueeze(-2), INF)
        tails = torch.logsumexp(vals, -1)  # (..., 2)
    elif pw.shape[-1] == tw.shape[-1]:
        T = [t.unsqueeze(-2) for t in (tw, tmu, tsd)]  # (..., 1, R)
        ta = torch.stack([-inf, hi], -1).unsqueeze(-1)  # (..., 2, 1): (-inf, lo] and [hi, inf)
        tb = torch.stack([lo, inf], -1).unsqueeze(-1)
        tails = quad_sup(*_pair_coeffs(*T, *(p.unsqueeze(-2) for p in (pw, pmu, psd))), ta, tb).amax(-1)
    else:
        tails = inf.unsqueeze(-1)
    return tails.amax(-1)


def _mediant_bound(tw, tmu, tsd, pw, pmu, psd, heavy, inf):
    """The global mediant bound of paired components, max_k min(w_k N_k / (v_k N'_k), N_k / (eps h)) (...)."""
    T = [t.unsqueeze(-2) for t in (tw, tmu, tsd)]  # (..., 1, R)
    med = quad_sup(*_pair_coeffs(*T, *(p.unsqueeze(-2) for p in (pw, pmu, psd))), -inf.unsqueeze(-1).unsqueeze(-1),
                   inf.unsqueeze(-1).unsqueeze(-1))  # (..., 1, R)
    if heavy is not None:
        hv = [h.unsqueeze(-1).unsqueeze(-1) for h in heavy]  # (..., 1, 1)
        med = torch.minimum(med, quad_sup(*_pair_coeffs(torch.zeros_like(T[0]), T[1], T[2], *hv),
                                          -inf.unsqueeze(-1).unsqueeze(-1), inf.unsqueeze(-1).unsqueeze(-1)))
    return med.amax(-1).squeeze(-1)  # (...)


def with_heavy_tail(mix: D.MixtureSameFamily, eps: float = 0.05, widen: float = 3.0) -> D.MixtureSameFamily:
    """The proposal (1 - eps) mix + eps h, h one component with the mixture's mean location and ``widen``
    times its widest scale: wider than every target component the original's scale covers."""
    comp = mix.component_distribution
    log_normal = isinstance(comp, D.LogNormal)
    base = comp.base_dist if log_normal else comp
    w = mix.mixture_distribution.probs
    mu_h = (w * base.loc).sum(-1, keepdim=True)
    sd_h = widen * base.scale.amax(-1, keepdim=True)
    loc, scale = torch.cat([base.loc, mu_h], -1), torch.cat([base.scale, sd_h], -1)
    probs = torch.cat([(1 - eps) * w, torch.full_like(mu_h, eps)], -1)
    new = D.LogNormal(loc, scale) if log_normal else D.Normal(loc, scale)
    return D.MixtureSameFamily(D.Categorical(probs=probs), new)


def _gauss_params(d):
    """(log_w, loc, scale, is_log) for a Normal / LogNormal / mixture of them, in y coordinates; else None."""
    if isinstance(d, D.MixtureSameFamily):
        c = d.component_distribution
        if isinstance(c, (D.Normal, D.LogNormal)):
            base = c.base_dist if isinstance(c, D.LogNormal) else c
            return torch.log(d.mixture_distribution.probs), base.loc, base.scale, isinstance(c, D.LogNormal)
        return None
    if isinstance(d, (D.Normal, D.LogNormal)):
        base = d.base_dist if isinstance(d, D.LogNormal) else d
        return torch.zeros_like(base.loc).unsqueeze(-1), base.loc.unsqueeze(-1), base.scale.unsqueeze(-1), \
            isinstance(d, D.LogNormal)
    return None


def rejection_constant(target: D.Distribution, proposal: D.Distribution, *, alpha: float = 1e-3,
                       n: int = 64, cells: int = 256) -> RejectionConstant:
    """M >= sup f_T / f_P on a stated domain, for a pair of ``torch.distributions`` (see module docstring).

    ``alpha``: target mass left outside the domain where no finite bound exists; ``n``: envelope grid cells;
    ``cells``: grid cells of the mixture bound.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}: it is the target mass left outside the domain")
    zero = torch.tensor(0.0)
    if isinstance(target, D.Categorical) != isinstance(proposal, D.Categorical):
        raise ValueError("target and proposal must both be Categorical or both continuous")
    if isinstance(target, D.Categorical):
        pt, pp = target.probs, proposal.probs
        if pt.shape[-1] != pp.shape[-1]:
            raise ValueError(f"categoricals over {pt.shape[-1]} and {pp.shape[-1]} outcomes: give both the same support")
        ratio = torch.where(pt > 0, pt / pp, torch.zeros_like(pt))  # p_P = 0 < p_T gives inf: no bound exists
        return RejectionConstant(ratio.amax(-1), zero, torch.tensor(pt.shape[-1] - 1.0), zero, "categorical")
    if isinstance(target, D.Exponential) and isinstance(proposal, D.Exponential):
        lt, lp = target.rate, proposal.rate
        bounded = lt >= lp
        hi = torch.where(bounded, torch.full_like(lt, INF), -math.log(alpha) / lt)  # target (1 - alpha) quantile
        m = torch.where(bounded, lt / lp, lt / lp * torch.exp((lp - lt) * torch.where(bounded, 0 * lt, hi)))
        return RejectionConstant(m * math.exp(LOG_SAFETY), torch.zeros_like(lt), hi,
                                 torch.where(bounded, 0 * lt, torch.full_like(lt, alpha)), "exponential")
    gt, gp = _gauss_params(target), _gauss_params(proposal)
    if gt is not None and gp is not None and gt[3] == gp[3]:
        return _gauss_family_constant(gt, gp, alpha, cells)
    return envelope_constant(target, proposal, alpha=alpha, n=n)


def _gauss_family_constant(gt, gp, alpha, cells):
    tw, tm, ts, is_log = gt
    pw, pm, ps, _ = gp
    conv = torch.exp if is_log else (lambda v: v)
    if tw.shape[-1] == 1 and pw.shape[-1] == 1:  # single Gaussian / log-normal: closed form
        A, B, C = _pair_coeffs(tw[..., 0], tm[..., 0], ts[..., 0], pw[..., 0], pm[..., 0], ps[..., 0])
        ninf = torch.full_like(A, -INF)
        log_m = quad_sup(A, B, C, ninf, -ninf)
        zq = D.Normal(0.0, 1.0).icdf(torch.tensor(1 - alpha / 2))
        lo, hi = tm[..., 0] - zq * ts[..., 0], tm[..., 0] + zq * ts[..., 0]
        trunc = ~torch.isfinite(log_m)
        log_m = torch.where(trunc, quad_sup(A, B, C, lo, hi), log_m) + LOG_SAFETY
        lo, hi = torch.where(trunc, lo, ninf), torch.where(trunc, hi, -ninf)
        mass = torch.where(trunc, torch.full_like(A, alpha), torch.zeros_like(A))
        return RejectionConstant(torch.exp(log_m), conv(lo), conv(hi), mass, "lognormal" if is_log else "normal")
    heavy = None
    if pw.shape[-1] == tw.shape[-1] + 1:  # the last proposal component is a heavy tail
        heavy = (pw[..., -1], pm[..., -1], ps[..., -1])
        pw, pm, ps = pw[..., :-1], pm[..., :-1], ps[..., :-1]
    z = float(D.Normal(0.0, 1.0).icdf(torch.tensor(1 - alpha / 2)))
    log_m, lo, hi, mass, trunc = mixture_log_bound(tw, tm, ts, pw, pm, ps, heavy, cells=cells, z=z)
    lo = torch.where(trunc, lo, torch.full_like(lo, -INF))
    hi = torch.where(trunc, hi, torch.full_like(hi, INF))
    return RejectionConstant(torch.exp(log_m), conv(lo), conv(hi), mass, "mixture")


def _quantiles(d: D.Distribution, levels: torch.Tensor) -> torch.Tensor:
    try:
        return d.icdf(levels.to(torch.get_default_dtype()))
    except NotImplementedError:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            draws = d.sample((200_000,)).flatten()
        return torch.quantile(draws.double(), levels.double()).to(draws.dtype)


def _segment_bounds(d: D.Distribution, left: torch.Tensor, right: torch.Tensor, upper: bool):
    """Algorithm 3: tangent at each cell's mid-point, compared with the density at the cell's ends."""
    with torch.enable_grad():  # the slopes come from autograd, also when a caller disabled gradients
        mid = ((left + right) / 2).detach().requires_grad_(True)
        f_mid = torch.exp(d.log_prob(mid))
        (slope,) = torch.autograd.grad(f_mid.sum(), mid)
    f_mid = f_mid.detach()
    with torch.no_grad():
        f_l, f_r = torch.exp(d.log_prob(left)), torch.exp(d.log_prob(right))
        z_l, z_r = f_mid + slope * (left - mid), f_mid + slope * (right - mid)
        if upper:  # a concave cell lies under its tangent, a convex one under its chord
            return torch.maximum(f_l, z_l), torch.maximum(f_r, z_r)
        return torch.minimum(f_l, z_l).clamp_min(0), torch.minimum(f_r, z_r).clamp_min(0)


def envelope_constant(target: D.Distribution, proposal: D.Distribution, *, alpha: float = 1e-3,
                      n: int = 64) -> RejectionConstant:
    """Algorithm 2: M = max over cell ends of (upper target line) / (lower proposal line) on the target's
    central (1 - alpha) quantile range; the grid holds the quantiles of both laws inside that range."""
    levels = torch.linspace(alpha / 2, 1 - alpha / 2, n + 1, dtype=torch.float64)
    grid_t = _quantiles(target, levels)
    grid_p = _quantiles(proposal, levels)
    lo, hi = grid_t[0], grid_t[-1]
    grid = torch.unique(torch.cat([grid_t, grid_p[(grid_p > lo) & (grid_p < hi)]]))  # sorted
    left, right = grid[:-1], grid[1:]
    for _ in range(8):  # halve cells whose lower proposal line reaches 0 (a steep convex cell)
        q_l, q_r = _segment_bounds(proposal, left, right, upper=False)
        bad = (q_l <= 0) | (q_r <= 0)
        if not bad.any():
            break
        mid = (left[bad] + right[bad]) / 2
        left, right = torch.cat([left[~bad], left[bad], mid]), torch.cat([right[~bad], mid, right[bad]])
    p_l, p_r = _segment_bounds(target, left, right, upper=True)
    # a ratio of two linear functions is monotone on a cell: its largest value is at an end
    ratio = torch.cat([p_l / q_l, p_r / q_r])
    ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, INF), ratio)
    try:
        mass = 1 - (target.cdf(hi) - target.cdf(lo))
    except NotImplementedError:
        mass = torch.tensor(alpha)
    return RejectionConstant(ratio.max() * math.exp(LOG_SAFETY), lo, hi, torch.as_tensor(mass).clamp_min(0), "envelope")
