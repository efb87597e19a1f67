"""Train the transformer TPPs (target and 1-layer draft) on the known processes: assets/tpp/<process>/{target,draft}.

    .venv/bin/python scripts/train_tpp_transformer.py                      # every process, both roles
    .venv/bin/python scripts/train_tpp_transformer.py --process hawkes --role draft

Exact maximum likelihood (ears_core.tpp.transformer) on sequences simulated from the process (numpy seed
0 for training, 1 for the held-out set). Resumable: every ``--chunk`` optimiser steps the model and the
optimiser are saved to ``--ckpt`` (outside the repository); a killed run restarts where it stopped. One CPU
thread. At the end the held-out log-likelihood per event of the model and of the true process go into the
model's config.json (the model card, assets/tpp/README.md, quotes them).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ears_core.tpp.processes import PROCESSES, make_process
from ears_core.tpp.transformer import TransformerConfig, TransformerTPP, save_transformer

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "tpp"
ROLES = {"target": dict(layers=16, d_model=32, heads=4, d_ff=64), "draft": dict(layers=1, d_model=32, heads=4, d_ff=64)}
STEPS = {"target": 1500, "draft": 2000}


def make_data(proc, n_seq: int, n_events: int, seed: int):
    rng = np.random.default_rng(seed)
    seqs = [proc.simulate(n_events, rng) for _ in range(n_seq)]
    tau = torch.tensor(np.stack([s.taus for s in seqs]), dtype=torch.float32).clamp_min(1e-6)  # (N, L)
    x = torch.tensor(np.stack([s.types for s in seqs]))  # (N, L)
    true_ll = float(np.mean([proc.log_likelihood(s) for s in seqs]) / n_events)
    return tau, x, true_ll


def train_one(name: str, role: str, args) -> dict:
    out = ASSETS / name / role
    ckpt = args.ckpt / f"{name}_{role}.pt"
    proc = make_process(name)
    tau, x, _ = make_data(proc, args.train, args.events, 0)
    vtau, vx, v_true = make_data(proc, args.valid, args.events, 1)
    y = torch.log(tau)
    cfg = TransformerConfig(num_types=proc.num_types, window=args.window, t_scale=float(tau.mean()),
                            y_mean=float(y.mean()), y_std=float(y.std()), **ROLES[role])
    torch.manual_seed(args.seed)
    model = TransformerTPP(cfg)
    steps = args.steps or STEPS[role]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=steps, pct_start=0.05)
    step, spent = 0, 0.0
    if ckpt.exists():
        st = torch.load(ckpt)
        model.load_state_dict(st["model"]), opt.load_state_dict(st["opt"]), sched.load_state_dict(st["sched"])
        step, spent = st["step"], st["seconds"]
        print(f"{name}/{role}: resumed at step {step}", flush=True)
    gen = torch.Generator().manual_seed(args.seed + step)
    t0 = time.perf_counter()
    while step < steps:
        idx = torch.randint(0, len(tau), (args.batch,), generator=gen)
        loss = -model.log_likelihood(tau[idx], x[idx]).mean() / args.events
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % args.chunk == 0 or step == steps:
            args.ckpt.mkdir(parents=True, exist_ok=True)
            secs = spent + time.perf_counter() - t0
            torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(), step=step,
                            seconds=secs), ckpt)
            print(f"{name}/{role}: step {step}/{steps} loss/event {loss.item():.4f} {secs:.0f}s", flush=True)
    secs = spent + time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        v_ll = float(torch.cat([model.log_likelihood(vtau[i:i + 100], vx[i:i + 100])
                                for i in range(0, len(vtau), 100)]).mean()) / args.events
    params = {k: v for k, v in asdict(proc).items()}
    extra = dict(process=name, role=role, process_params=params, parameters=sum(p.numel() for p in model.parameters()),
                 train_sequences=args.train, events_per_sequence=args.events, steps=steps, batch=args.batch,
                 heldout_ll_per_event=round(v_ll, 4), true_process_ll_per_event=round(v_true, 4),
                 heldout_sequences=args.valid, train_seconds_one_cpu_thread=round(secs, 1))
    save_transformer(model, out, extra)
    print(json.dumps({k: extra[k] for k in ("process", "role", "heldout_ll_per_event", "true_process_ll_per_event")}),
          flush=True)
    return extra


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--process", choices=[*PROCESSES, "all"], default="all")
    ap.add_argument("--role", choices=["target", "draft", "both"], default="both")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--valid", type=int, default=300)
    ap.add_argument("--events", type=int, default=96)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=0, help="optimiser steps (0: the role's default)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt", type=Path, default=Path("/work/tpp_ckpt"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = list(PROCESSES) if args.process == "all" else [args.process]
    roles = ["target", "draft"] if args.role == "both" else [args.role]
    for name in names:
        for role in roles:
            if (ASSETS / name / role / "model.safetensors").exists() and not (args.ckpt / f"{name}_{role}.pt").exists():
                print(f"{name}/{role}: already trained", flush=True)
                continue
            train_one(name, role, args)
            (args.ckpt / f"{name}_{role}.pt").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
