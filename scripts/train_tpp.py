"""Train the shipped neural TPP (assets/tpp) on sequences thinned from a known Hawkes process
(or, with --process renewal, on a log-normal renewal process: assets/tpp/renewal).

    .venv/bin/python scripts/train_tpp.py            # about 1 minute on one CPU thread
    .venv/bin/python scripts/train_tpp.py --process renewal --out assets/tpp/renewal

Exact maximum likelihood (ears_core.tpp.model). Held-out negative log-likelihood per event is
reported next to the true Hawkes process's own, the floor any model can reach; both go into
assets/tpp/config.json and the model card.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from ears_core.tpp.model import ASSET_DIR, NeuralTPP, TPPConfig, save_model
from ears_core.tpp.processes import HawkesProcess, RenewalProcess


def make_data(proc, n_seq: int, n_events: int, seed: int):
    rng = np.random.default_rng(seed)
    seqs = [proc.simulate(n_events, rng) for _ in range(n_seq)]
    tau = torch.tensor(np.stack([s.taus for s in seqs]), dtype=torch.float32)  # (N, L)
    x = torch.tensor(np.stack([s.types for s in seqs]))  # (N, L)
    true_nll = -np.mean([proc.log_likelihood(s) for s in seqs]) / n_events
    return tau.clamp_min(1e-6), x, float(true_nll)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--valid", type=int, default=300)
    ap.add_argument("--events", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--process", choices=["hawkes", "renewal"], default="hawkes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    proc = HawkesProcess() if args.process == "hawkes" else RenewalProcess()
    tau, x, _ = make_data(proc, args.train, args.events, args.seed)
    vtau, vx, v_true = make_data(proc, args.valid, args.events, args.seed + 1)
    y = torch.log(tau)
    cfg = TPPConfig(num_types=proc.num_types, y_mean=float(y.mean()), y_std=float(y.std()))
    model = NeuralTPP(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    n_ev = tau.numel()
    print(f"data: {args.train} x {args.events} events in {time.perf_counter() - t0:.1f}s; true NLL/event {v_true:.4f}")
    for epoch in range(args.epochs):
        perm = torch.randperm(len(tau))
        total = 0.0
        for i in range(0, len(tau), 64):
            idx = perm[i:i + 64]
            loss = -model.log_likelihood(tau[idx], x[idx]).sum() / idx.numel() / args.events
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            total += float(loss) * idx.numel() * args.events
        sched.step()
        with torch.no_grad():
            v = float(-model.log_likelihood(vtau, vx).sum()) / vtau.numel()
        print(f"epoch {epoch + 1:3d}  train NLL/event {total / n_ev:.4f}  valid {v:.4f}  (true {v_true:.4f})"
              f"  {time.perf_counter() - t0:.0f}s", flush=True)
    secs = time.perf_counter() - t0
    params = dict(mu=proc.mu, alpha=proc.alpha, beta=proc.beta) if args.process == "hawkes" else \
        dict(mu=proc.mu, sigma=proc.sigma, probs=proc.probs)
    extra = dict(process=args.process, **{args.process: params},
                 train_sequences=args.train, events_per_sequence=args.events, epochs=args.epochs, seed=args.seed,
                 valid_nll_per_event=round(v, 4), true_process_nll_per_event=round(v_true, 4),
                 train_seconds_one_cpu_thread=round(secs, 1))
    save_model(model, args.out, extra)
    print(json.dumps(extra, indent=2))


if __name__ == "__main__":
    main()
