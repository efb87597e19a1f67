"""Known point processes to train and test on: a multivariate Hawkes process and a renewal process.

Terms
-----
event          a pair (t, x): time t > 0 and type x in {0, ..., C-1}; a sequence has 0 < t_1 < ... < t_n
tau            inter-event time t_i - t_{i-1} (t_0 = 0)
intensity      lambda_c(t | H_t): the rate of type-c events given the history H_t before t
Hawkes         lambda_c(t) = mu_c + sum_{t_i < t} alpha[c, x_i] * beta * exp(-beta (t - t_i)):
               every event raises the rate of the others, and the raise decays at rate beta.
               Stationary when the spectral radius of alpha is below 1.
thinning       (Ogata) between events the total Hawkes intensity only falls, so its value just after
               the last event (or candidate) bounds it from above; draw a candidate from a Poisson
               process with that bound, keep it with probability lambda(t) / bound, else move on.
renewal        i.i.d. inter-event times (here log-normal) and i.i.d. types: the history does not matter.
self-correcting lambda(t) = exp(mu t - alpha N(t)): the rate grows steadily and every event lowers it,
               so events come more regularly than Poisson (one type). Between events the compensator is
               closed form, so a gap is drawn exactly by inverting it.
compensator    Lambda_i = integral of the total intensity over (t_{i-1}, t_i]; under the true process the
               Lambda_i are i.i.d. Exp(1) (time-rescaling theorem): the QQ plot of the app's tab.

Simulators use numpy's seeded ``Generator`` and return lists of (times, types) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["HawkesProcess", "RenewalProcess", "SelfCorrectingProcess", "Sequence", "PROCESSES", "make_process"]


@dataclass
class Sequence:
    """One event sequence: increasing times (n,) float64 and types (n,) int64."""

    times: np.ndarray
    types: np.ndarray

    @property
    def taus(self) -> np.ndarray:  # (n,)
        return np.diff(self.times, prepend=0.0)


@dataclass
class HawkesProcess:
    """Multivariate Hawkes process with exponential kernels (see module docstring)."""

    mu: list[float] = field(default_factory=lambda: [0.6, 0.3, 0.2])
    alpha: list[list[float]] = field(default_factory=lambda: [[0.30, 0.10, 0.05],
                                                              [0.20, 0.40, 0.00],
                                                              [0.05, 0.20, 0.30]])
    beta: float = 2.0

    def __post_init__(self) -> None:
        self._mu = np.asarray(self.mu, dtype=float)  # (C,)
        self._alpha = np.asarray(self.alpha, dtype=float)  # (C, C): row = affected type, col = source
        C = len(self._mu)
        if self._alpha.shape != (C, C) or (self._mu <= 0).any() or (self._alpha < 0).any() or self.beta <= 0:
            raise ValueError("Hawkes needs mu > 0 of length C, alpha >= 0 of shape (C, C) and beta > 0")
        if np.abs(np.linalg.eigvals(self._alpha)).max() >= 1:
            raise ValueError("Hawkes alpha has spectral radius >= 1: the process explodes; scale alpha down")

    @property
    def num_types(self) -> int:
        return len(self._mu)

    def intensity(self, excitation: np.ndarray) -> np.ndarray:
        """lambda (C,) given the current excitation state (C,) = sum alpha[:, x_i] beta e^{-beta dt}."""
        return self._mu + excitation

    def simulate(self, n_events: int, rng: np.random.Generator) -> Sequence:
        """Draw the first ``n_events`` events by Ogata thinning."""
        C, t = self.num_types, 0.0
        exc = np.zeros(C)  # (C,) excitation just after time t
        times, types = np.empty(n_events), np.empty(n_events, dtype=np.int64)
        i = 0
        while i < n_events:
            bound = self.intensity(exc).sum()  # the intensity only decays until the next event
            dt = rng.exponential(1.0 / bound)
            t += dt
            exc = exc * np.exp(-self.beta * dt)
            lam = self.intensity(exc)  # (C,)
            if rng.random() * bound <= lam.sum():  # keep the candidate
                c = rng.choice(C, p=lam / lam.sum())
                times[i], types[i] = t, c
                exc = exc + self._alpha[:, c] * self.beta
                i += 1
        return Sequence(times, types)

    def log_likelihood(self, seq: Sequence) -> float:
        """Exact log-likelihood of the events up to the last one (for the model card)."""
        C, ll, exc, prev = self.num_types, 0.0, np.zeros(self.num_types), 0.0
        for t, c in zip(seq.times, seq.types):
            dt = t - prev
            # integral of mu + exc * e^{-beta s} over (0, dt)
            ll -= self._mu.sum() * dt + exc.sum() * (1 - np.exp(-self.beta * dt)) / self.beta
            exc = exc * np.exp(-self.beta * dt)
            ll += np.log(self.intensity(exc)[c])
            exc = exc + self._alpha[:, c] * self.beta
            prev = t
        return float(ll)

    def compensators(self, seq: Sequence) -> np.ndarray:
        """Lambda_i of each gap (n,): integral of the total intensity from t_{i-1} to t_i."""
        out, exc, prev = np.empty(len(seq.times)), np.zeros(self.num_types), 0.0
        for i, (t, c) in enumerate(zip(seq.times, seq.types)):
            dt = t - prev
            out[i] = self._mu.sum() * dt + exc.sum() * (1 - np.exp(-self.beta * dt)) / self.beta
            exc = exc * np.exp(-self.beta * dt) + self._alpha[:, c] * self.beta
            prev = t
        return out


@dataclass
class RenewalProcess:
    """Log-normal i.i.d. inter-event times (log tau ~ N(mu, sigma^2)) and i.i.d. types with ``probs``."""

    mu: float = -0.5
    sigma: float = 0.8
    probs: list[float] = field(default_factory=lambda: [0.5, 0.3, 0.2])

    @property
    def num_types(self) -> int:
        return len(self.probs)

    def log_likelihood(self, seq: Sequence) -> float:
        """Exact log-likelihood: log-normal density of each gap times the probability of each type."""
        y = np.log(seq.taus)
        ll = -0.5 * ((y - self.mu) / self.sigma) ** 2 - np.log(self.sigma * np.sqrt(2 * np.pi)) - y
        p = np.asarray(self.probs) / sum(self.probs)
        return float(ll.sum() + np.log(p[seq.types]).sum())

    def compensators(self, seq: Sequence) -> np.ndarray:
        """Cumulative hazard of each gap: -log(1 - F(tau_i)) (n,)."""
        from scipy.stats import norm
        return -norm.logsf((np.log(seq.taus) - self.mu) / self.sigma)

    def simulate(self, n_events: int, rng: np.random.Generator) -> Sequence:
        taus = np.exp(rng.normal(self.mu, self.sigma, n_events))
        types = rng.choice(len(self.probs), size=n_events, p=np.asarray(self.probs) / sum(self.probs))
        return Sequence(np.cumsum(taus), types.astype(np.int64))


@dataclass
class SelfCorrectingProcess:
    """lambda(t) = exp(mu t - alpha N(t)), one event type (see module docstring)."""

    mu: float = 1.0
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if self.mu <= 0 or self.alpha <= 0:
            raise ValueError("self-correcting process needs mu > 0 and alpha > 0")

    num_types = 1

    def compensators(self, seq: Sequence) -> np.ndarray:
        """Lambda_i = e^{-alpha (i-1)} (e^{mu t_i} - e^{mu t_{i-1}}) / mu, computed stably (n,)."""
        prev = np.concatenate([[0.0], seq.times[:-1]])
        n_before = np.arange(len(seq.times))
        return np.exp(self.mu * prev - self.alpha * n_before) * np.expm1(self.mu * (seq.times - prev)) / self.mu

    def log_likelihood(self, seq: Sequence) -> float:
        n_before = np.arange(len(seq.times))
        return float((self.mu * seq.times - self.alpha * n_before).sum() - self.compensators(seq).sum())

    def simulate(self, n_events: int, rng: np.random.Generator) -> Sequence:
        """Exact inversion: Lambda_i ~ Exp(1) gives t_i = t_{i-1} + log(1 + mu E e^{alpha (i-1) - mu t_{i-1}}) / mu."""
        times, t = np.empty(n_events), 0.0
        for i in range(n_events):
            e = rng.exponential()
            t = t + np.log1p(self.mu * e * np.exp(self.alpha * i - self.mu * t)) / self.mu
            times[i] = t
        return Sequence(times, np.zeros(n_events, dtype=np.int64))


# the processes the transformer TPPs are trained on (assets/tpp/<name>/{target,draft})
PROCESSES = {
    "hawkes": lambda: HawkesProcess(mu=[0.5], alpha=[[0.7]], beta=2.0),
    "multi_hawkes": HawkesProcess,
    "self_correcting": SelfCorrectingProcess,
    "renewal": RenewalProcess,
}


def make_process(name: str):
    """A fresh instance of one named process in ``PROCESSES``."""
    if name not in PROCESSES:
        raise ValueError(f"unknown process {name!r}: choose one of {sorted(PROCESSES)}")
    return PROCESSES[name]()
