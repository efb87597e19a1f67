"""A neural temporal point process: GRU encoder over the history, log-normal mixture x categorical decoder.

Terms
-----
history H_i      the events (tau_1, x_1), ..., (tau_i, x_i) before event i+1
hidden h_i       the GRU state after reading H_i; h_0 is a learned start state
next-event law   p(tau, x | h) = p(tau | h) p(x | h): tau is log-normal mixture (K components: weights w,
                 locations mu and scales sd of y = log tau), x is categorical over C types
EventDist        that law for a batch of states: tensors w_logits (..., K), mu (..., K), sd (..., K),
                 type_logits (..., C). Draws take an explicit ``torch.Generator`` so runs are seeded.
exact likelihood log p(seq) = sum_i log p(tau_i, x_i | h_{i-1}); no intensity integral is needed.

The model is small on purpose (hidden 32): sampling cost is dominated by per-call overhead, which is
what speculative sampling amortises.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["TPPConfig", "EventDist", "NeuralTPP", "load_model", "save_model", "ASSET_DIR"]

ASSET_DIR = Path(__file__).resolve().parents[2] / "assets" / "tpp"
LOG_2PI = math.log(2 * math.pi)


@dataclass
class TPPConfig:
    num_types: int = 3
    hidden: int = 32
    num_components: int = 4
    type_dim: int = 8
    y_mean: float = 0.0  # mean and std of y = log tau in the training data (input and output scaling)
    y_std: float = 1.0


@dataclass
class EventDist:
    """p(tau, x | h) for a batch of states; every tensor has the same leading shape (...)."""

    w_logits: torch.Tensor  # (..., K)
    mu: torch.Tensor  # (..., K) location of y = log tau
    sd: torch.Tensor  # (..., K) scale of y
    type_logits: torch.Tensor  # (..., C)

    @property
    def log_w(self) -> torch.Tensor:  # (..., K)
        return torch.log_softmax(self.w_logits, -1)

    @property
    def type_log_probs(self) -> torch.Tensor:  # (..., C)
        return torch.log_softmax(self.type_logits, -1)

    def __getitem__(self, idx) -> "EventDist":
        return EventDist(self.w_logits[idx], self.mu[idx], self.sd[idx], self.type_logits[idx])

    def log_prob_y(self, y: torch.Tensor) -> torch.Tensor:
        """log density of y = log tau; y has the leading shape (...) -> (...)."""
        z = (y.unsqueeze(-1) - self.mu) / self.sd  # (..., K)
        return torch.logsumexp(self.log_w - 0.5 * z * z - torch.log(self.sd) - 0.5 * LOG_2PI, -1)

    def log_prob(self, tau: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """log p(tau, x) with the Jacobian of tau = e^y: log p_y(log tau) - log tau. (...)"""
        y = torch.log(tau)
        lp_x = self.type_log_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        return self.log_prob_y(y) - y + lp_x

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """n i.i.d. draws per state: tau (..., n) float, x (..., n) long."""
        shape = (*self.mu.shape[:-1], n)
        dev = self.mu.device
        u = torch.rand((*shape, 2), generator=generator, device=dev)  # (..., n, 2)
        cw = torch.softmax(self.w_logits, -1).cumsum(-1).unsqueeze(-2)  # (..., 1, K)
        k = (cw[..., :-1] < u[..., :1]).sum(-1)  # (..., n) component index
        eps = torch.randn(shape, generator=generator, device=dev)
        mu = self.mu.unsqueeze(-2).expand(*shape, -1).gather(-1, k.unsqueeze(-1)).squeeze(-1)
        sd = self.sd.unsqueeze(-2).expand(*shape, -1).gather(-1, k.unsqueeze(-1)).squeeze(-1)
        tau = torch.exp(mu + sd * eps)
        ct = torch.softmax(self.type_logits, -1).cumsum(-1).unsqueeze(-2)  # (..., 1, C)
        x = (ct[..., :-1] < u[..., 1:]).sum(-1)
        return tau, x


    def sample1(self, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draw per state with fewer tensor calls than ``sample(1)`` (the samplers' hot path):
        tau (..., 1) float, x (..., 1) long."""
        u = torch.rand((*self.mu.shape[:-1], 2), generator=generator, device=self.mu.device)  # (..., 2)
        k = (torch.softmax(self.w_logits, -1).cumsum(-1)[..., :-1] < u[..., :1]).sum(-1, keepdim=True)  # (..., 1)
        eps = torch.randn(u[..., :1].shape, generator=generator, device=u.device)
        tau = torch.exp(torch.addcmul(self.mu.gather(-1, k), self.sd.gather(-1, k), eps))
        x = (torch.softmax(self.type_logits, -1).cumsum(-1)[..., :-1] < u[..., 1:]).sum(-1, keepdim=True)
        return tau, x


class NeuralTPP(nn.Module):
    """GRU encoder + decoder; see the module docstring."""

    def __init__(self, cfg: TPPConfig):
        super().__init__()
        self.cfg = cfg
        self.type_emb = nn.Embedding(cfg.num_types, cfg.type_dim)
        self.gru = nn.GRU(1 + cfg.type_dim, cfg.hidden, batch_first=True)
        self.h0 = nn.Parameter(torch.zeros(cfg.hidden))
        K, C = cfg.num_components, cfg.num_types
        self.head = nn.Linear(cfg.hidden, 3 * K + C)

    def features(self, tau: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Encoder input per event: (B, L) tau, (B, L) x -> (B, L, 1 + type_dim)."""
        y = (torch.log(tau) - self.cfg.y_mean) / self.cfg.y_std
        return torch.cat([y.unsqueeze(-1), self.type_emb(x)], -1)

    def start(self, batch: int = 1) -> torch.Tensor:
        """h_0 for an empty history: (B, H)."""
        return self.h0.expand(batch, -1).contiguous()

    def encode(self, tau: torch.Tensor, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Read events (B, L) from state h (B, H); returns all states after each event (B, L, H)."""
        out, _ = self.gru(self.features(tau, x), h.unsqueeze(0).contiguous())
        return out

    def decode(self, h: torch.Tensor) -> EventDist:
        """States (..., H) -> next-event laws with leading shape (...)."""
        K, s = self.cfg.num_components, self.cfg.y_std
        out = self.head(h)  # (..., 3K + C)
        w, m, ls, tl = out[..., :K], out[..., K:2 * K], out[..., 2 * K:3 * K], out[..., 3 * K:]
        sd = s * (F.softplus(ls) + 0.05)  # scales bounded away from 0
        return EventDist(w, self.cfg.y_mean + s * m, sd, tl)

    def log_likelihood(self, tau: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Exact sequence log-likelihood: tau, x (B, L) -> (B,)."""
        B = tau.shape[0]
        h0 = self.start(B)
        hs = self.encode(tau, x, h0)  # (B, L, H)
        prev = torch.cat([h0.unsqueeze(1), hs[:, :-1]], 1)  # state before each event (B, L, H)
        lp = self.decode(prev).log_prob(tau, x)  # (B, L)
        if mask is not None:
            lp = lp * mask
        return lp.sum(-1)


def save_model(model: NeuralTPP, folder: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**asdict(model.cfg), **(extra or {})}, indent=2) + "\n")


def load_model(folder: Path | str = ASSET_DIR) -> NeuralTPP:
    """The shipped model (assets/tpp) or one saved by ``save_model``; in eval mode."""
    from safetensors.torch import load_file
    folder = Path(folder)
    if not (folder / "model.safetensors").exists():
        raise FileNotFoundError(f"no TPP weights in {folder}: run `python scripts/train_tpp.py` to make them")
    raw = json.loads((folder / "config.json").read_text())
    cfg = TPPConfig(**{k: raw[k] for k in TPPConfig.__dataclass_fields__})
    model = NeuralTPP(cfg)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval()
