"""A transformer temporal point process with a KV cache (THP-style encoder, log-normal mixture decoder).

Terms
-----
position         slot k of a sequence: k = 0 is a start pseudo-event (mark C, t = 0), k >= 1 is event k
event features   mark embedding + THP temporal encoding of the absolute time t (sin / cos of t w_j at fixed
                 geometric frequencies w_j, time measured in units of ``t_scale``) + a linear map of the
                 standardised log inter-event time
encoder          ``layers`` pre-norm blocks of causal self-attention (each position sees itself and the
                 ``window - 1`` positions before it) and a GELU MLP; output h_k (D,) per position
next-event law   p(tau, x | h_k) for event k + 1: the log-normal mixture x categorical ``EventDist`` of event_law.py
KV cache         per layer keys and values in one tensor (2, B, heads, capacity, D / heads); row b holds ``length[b]`` valid
                 positions. ``forward`` writes L new positions at each row's own offset and returns their
                 outputs (one pass over L positions); rolling back is setting ``length`` (nothing is erased:
                 positions past ``length`` are masked out and later overwritten).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .event_law import EventDist

__all__ = ["TransformerConfig", "TransformerTPP", "KVCache", "save_transformer", "load_transformer", "load_pair",
           "ASSET_DIR"]

ASSET_DIR = Path(__file__).resolve().parents[2] / "assets" / "tpp"  # the shipped pairs: ASSET_DIR/<process>/{target,draft}


@dataclass
class TransformerConfig:
    num_types: int = 1
    d_model: int = 32
    heads: int = 4
    layers: int = 12
    d_ff: int = 64
    window: int = 64  # each position attends to itself and the window - 1 before it
    num_components: int = 4
    num_freqs: int = 8  # temporal encoding: 2 * num_freqs sin / cos features
    t_scale: float = 1.0  # mean inter-event time of the training data (time unit of the encoding)
    y_mean: float = 0.0  # mean and std of y = log tau in the training data
    y_std: float = 1.0

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        if self.layers < 1 or self.window < 2 or self.num_types < 1:
            raise ValueError("need layers >= 1, window >= 2 and num_types >= 1")


class KVCache:
    """Keys and values of every layer for B rows; ``length`` (B,) long = valid positions per row."""

    def __init__(self, cfg: TransformerConfig, batch: int, capacity: int, dtype=torch.float32):
        dh = cfg.d_model // cfg.heads
        self.kv = [torch.zeros(2, batch, cfg.heads, capacity, dh, dtype=dtype) for _ in range(cfg.layers)]
        self.length = torch.zeros(batch, dtype=torch.long)  # (B,)
        self.capacity = capacity

    @property
    def batch(self) -> int:
        return self.length.shape[0]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention of a few cached queries as two batched matmuls and a softmax: q (B, H, L, dh), k and v (B, H, S, dh),
    mask None or additive (B or 1, 1, L, S). At sampling's shapes (thousands of rows, L <= 16, S <= window) this
    costs two thirds of ``F.scaled_dot_product_attention``'s CPU kernel; training's long sequences keep that."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # (B, H, L, S)
    if mask is not None:
        scores = scores + mask
    return scores.softmax(-1) @ v


class _Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        D = cfg.d_model
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ff1, self.ff2 = nn.Linear(D, cfg.d_ff), nn.Linear(cfg.d_ff, D)

    def forward(self, h, mask, kv=None, write=None, keys=None):
        """h (B, L, D); mask (B or 1, 1, L, S) additive float or bool; kv: the layer's cache (2, B, H, cap, dh) or
        None (training). write: int offset (one row) or (B, L) long positions; keys: slice of cache positions."""
        B, L, D = h.shape
        qkv = self.qkv(self.ln1(h)).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # (3, B, H, L, dh)
        q, k, v = qkv
        if kv is not None:
            if isinstance(write, int):
                kv[:, :, :, write:write + L] = qkv[1:]
            else:
                rows = torch.arange(B).unsqueeze(1)  # (B, 1)
                kv[:, rows, :, write] = qkv[1:].permute(1, 3, 0, 2, 4)  # (B, L, 2, H, dh) at (B, L) positions
            k, v = kv[0, :, :, keys], kv[1, :, :, keys]  # (B, H, S, dh)
            a = _attend(q, k, v, mask)  # (B, H, L, dh)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, dh)
        h = h + self.proj(a.transpose(1, 2).reshape(B, L, D))
        return h + self.ff2(F.gelu(self.ff1(self.ln2(h))))


class TransformerTPP(nn.Module):
    """See the module docstring. ``forward`` (cached) for sampling, ``log_likelihood`` for training."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        D, R, C = cfg.d_model, cfg.num_components, cfg.num_types
        self.mark_emb = nn.Embedding(C + 1, D)  # index C: the start pseudo-event
        self.y_in = nn.Linear(1, D)
        self.time_in = nn.Linear(2 * cfg.num_freqs, D, bias=False)
        freqs = torch.exp(torch.linspace(math.log(0.2), math.log(20.0), cfg.num_freqs)) / cfg.t_scale
        self.register_buffer("freqs", freqs.repeat(2), persistent=False)  # (2F,): sin(t w), cos(t w) = sin(t w + pi/2)
        self.register_buffer("phase", torch.cat([torch.zeros(cfg.num_freqs), torch.full((cfg.num_freqs,), math.pi / 2)]),
                             persistent=False)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, 3 * R + C)

    # --- features and decoder -------------------------------------------------------------------------
    def embed(self, t: torch.Tensor, tau: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """t absolute times, tau inter-event times, x marks (C = start), each (B, L) -> (B, L, D)."""
        ang = torch.addcmul(self.phase, t.unsqueeze(-1), self.freqs)  # (B, L, 2F)
        y = (torch.log(tau) - self.cfg.y_mean) / self.cfg.y_std
        y = torch.where(x == self.cfg.num_types, 0.0, y)  # the start has no gap
        # functional calls: the same maths as the modules, without their per-call overhead (hot path)
        return (F.embedding(x, self.mark_emb.weight) + F.linear(y.unsqueeze(-1), self.y_in.weight, self.y_in.bias)
                + F.linear(torch.sin(ang), self.time_in.weight))

    def decode(self, h: torch.Tensor) -> EventDist:
        """Outputs (..., D) -> next-event laws with leading shape (...)."""
        R, s = self.cfg.num_components, self.cfg.y_std
        ln = self.ln_f
        out = F.linear(F.layer_norm(h, ln.normalized_shape, ln.weight, ln.bias, ln.eps), self.head.weight,
                       self.head.bias)  # (..., 3R + C)
        w, m, ls, tl = out[..., :R], out[..., R:2 * R], out[..., 2 * R:3 * R], out[..., 3 * R:]
        return EventDist(w, self.cfg.y_mean + s * m, s * (F.softplus(ls) + 0.05), tl)

    # --- cached inference -------------------------------------------------------------------------------
    def new_cache(self, batch: int, capacity: int) -> KVCache:
        return KVCache(self.cfg, batch, capacity)

    def forward(self, t: torch.Tensor, tau: torch.Tensor, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append L positions to every row at its own ``cache.length`` and return their outputs (B, L, D);
        advances ``cache.length`` by L. One pass: the cost of L positions is close to that of one."""
        B, L = x.shape
        W = self.cfg.window
        h = self.embed(t, tau, x)  # (B, L, D)
        if B == 1:  # one row: slices, no index tensors
            s = int(cache.length[0])
            if s + L > cache.capacity:
                raise ValueError(f"KV cache full ({cache.capacity} positions): give a larger capacity")
            lo = max(0, s - W + 1)  # the first key the first query sees
            keys = slice(lo, s + L)
            mask = None  # one query sees every key in [lo, s]
            if L > 1:
                qp = s + torch.arange(L).unsqueeze(1)  # (L, 1) query positions
                kp = torch.arange(lo, s + L).unsqueeze(0)  # (1, S)
                mask = torch.zeros(1, 1, L, s + L - lo).masked_fill_(~((kp <= qp) & (kp > qp - W)), -math.inf)
            write = s
        else:
            qp = cache.length.unsqueeze(1) + torch.arange(L)  # (B, L) positions written
            S = int(qp.max()) + 1
            if S > cache.capacity:
                raise ValueError(f"KV cache full ({cache.capacity} positions): give a larger capacity")
            lo = max(0, int(qp.min()) - W + 1)
            keys = slice(lo, S)
            kp = torch.arange(lo, S).view(1, 1, -1)  # (1, 1, S')
            qq = qp.unsqueeze(-1)  # (B, L, 1)
            mask = torch.zeros(B, 1, L, S - lo).masked_fill_(~((kp <= qq) & (kp > qq - W)).unsqueeze(1), -math.inf)
            write = qp
        for blk, kv in zip(self.blocks, cache.kv):
            h = blk(h, mask, kv, write, keys)
        cache.length = cache.length + L
        return h

    # --- training -----------------------------------------------------------------------------------------
    def encode_all(self, t: torch.Tensor, tau: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """No cache: outputs for every position of full sequences (B, L) -> (B, L, D)."""
        L, W = x.shape[1], self.cfg.window
        i = torch.arange(L)
        mask = ((i.unsqueeze(0) <= i.unsqueeze(1)) & (i.unsqueeze(0) > i.unsqueeze(1) - W)).view(1, 1, L, L)
        h = self.embed(t, tau, x)
        for blk in self.blocks:
            h = blk(h, mask)
        return h

    def log_likelihood(self, tau: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Exact log-likelihood of sequences of events tau, x (B, N) (no start in them) -> (B,)."""
        B = tau.shape[0]
        t = torch.cumsum(tau.double(), 1).float()
        start_x = torch.full((B, 1), self.cfg.num_types, dtype=torch.long)
        pos_t = torch.cat([torch.zeros(B, 1), t[:, :-1]], 1)  # (B, N): position 0 = start, then events 1..N-1
        pos_tau = torch.cat([torch.ones(B, 1), tau[:, :-1]], 1)
        pos_x = torch.cat([start_x, x[:, :-1]], 1)
        h = self.encode_all(pos_t, pos_tau, pos_x)  # (B, N, D): law of event k+1 at position k
        return self.decode(h).log_prob(tau, x).sum(-1)


def save_transformer(model: TransformerTPP, folder: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**asdict(model.cfg), **(extra or {})}, indent=2) + "\n")


def load_transformer(folder: Path | str) -> TransformerTPP:
    """A model saved by ``save_transformer`` (e.g. assets/tpp/hawkes/target), in eval mode."""
    from safetensors.torch import load_file
    folder = Path(folder)
    if not (folder / "model.safetensors").exists():
        raise FileNotFoundError(f"no transformer TPP weights in {folder}: run scripts/train_tpp_transformer.py to make them")
    raw = json.loads((folder / "config.json").read_text())
    model = TransformerTPP(TransformerConfig(**{k: raw[k] for k in TransformerConfig.__dataclass_fields__}))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval()


def load_pair(process: str, folder: Path | str = ASSET_DIR) -> tuple[TransformerTPP, TransformerTPP]:
    """The shipped (target, draft) trained on ``process`` (assets/tpp/<process>/{target,draft})."""
    from .processes import PROCESSES
    if process not in PROCESSES:
        raise ValueError(f"unknown process {process!r}: choose one of {sorted(PROCESSES)}")
    return load_transformer(Path(folder) / process / "target"), load_transformer(Path(folder) / process / "draft")
