"""Step 2 of the embedded draft: train the EAGLE-style head (ears_core/draft/eagle.py) on the feature
cache of scripts/draft_data.py (--features), then save it to assets/embedded_draft/ (or --out).

What is learnt: fc and one decoder layer (initialised from the target's last layer) so that
head(f_j, x_{j+1}) predicts f_{j+1}, the target's next feature. Losses, on answer positions:
  cls  cross-entropy of the head's distribution over ``vocab_ids`` against P_target there
  reg  smooth-L1 between the predicted and the true feature
Both are applied ``--unroll`` times (default 2): once from true (noised) input features, then from
the head's own predictions fed back, one step further each time (a training-time test: what the
second, third, ... drafts of a round see at inference).

``--qat`` trains the head for its int4 variant (``EagleDrafter.quantize_kernels``): every linear layer
the int4 kernel takes runs through its Q4_1 round trip in the forward (the bfloat16 weight's blocks,
as the kernel computes them: ``int4_linear.round_trip``), with a straight-through gradient to the float
weight, and the head's rows of the output head are read through their round trip too. The saved weights
are the float ones; the int4 variant quantises them at load as before.

    python scripts/train_draft.py --features ~/.cache/ears_studio/draft_features/Llast [--minutes 12] \
        [--vocab 6144] [--out assets/embedded_draft]
    python scripts/train_draft.py --features ~/.cache/ears_studio/draft_features/Llast \
        --positions 250000 --out /tmp/head-250k     # a nested subset, for the saturation curve

Validation is by prompt (prompt id % --val-mod == 0 never trains: answers to
prompts the head never saw), and --positions takes a fixed-seed prefix of the shuffled training
answers until that many answer positions, so smaller subsets are nested in larger ones.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ears_core.draft.eagle import DraftHead, head_config_from_target
from ears_core.pair import load_pair

ROOT = Path(__file__).resolve().parent.parent


def split_feature_rows(folder: Path, val_mod: int, val_rows: int, rng: random.Random, fused: bool = False
                       ) -> tuple[list[dict], list[dict], list[int]]:
    """(validation, training) rows of a draft_data.py feature cache, split by prompt, both
    shuffled, and the hidden-state indices the head reads: the cache's last layer, or all of its
    layers side by side when ``fused`` (EAGLE-3)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from draft_data import feature_layers, load_feature_rows

    layers = feature_layers(folder)
    rows = load_feature_rows(folder, slice(None) if fused else -1)
    layers = layers if fused else layers[-1:]
    if not rows:
        sys.exit(f"no features in {folder}: run `python scripts/draft_data.py features` first")
    val = [r for r in rows if r["prompt_id"] % val_mod == 0]
    train = [r for r in rows if r["prompt_id"] % val_mod != 0]
    rng.shuffle(val)
    rng.shuffle(train)
    return val[:val_rows], train, layers


def take_positions(rows: list[dict], positions: int) -> list[dict]:
    """The shortest prefix of ``rows`` holding at least ``positions`` answer positions."""
    out, n = [], 0
    for r in rows:
        if n >= positions:
            break
        out.append(r)
        n += len(r["ids"]) - r["prompt_len"]
    if n < positions:
        print(f"warning: only {n} answer positions available, fewer than --positions {positions}", flush=True)
    return out


def answer_token_counts(rows: list[dict], vocab_size: int = 49152) -> torch.Tensor:
    """(V,) how often each token id occurs in the rows' answers (prompts not counted)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in rows:
        counts += torch.bincount(r["ids"][r["prompt_len"] :].long(), minlength=vocab_size)
    return counts


def pick_vocab(rows: list[dict], n: int, always: list[int]) -> tuple[torch.Tensor, float]:
    """The n most frequent answer tokens (plus ``always``) and the share of answer tokens they cover."""
    counts = answer_token_counts(rows)
    top = counts.argsort(descending=True)[:n]
    ids = torch.unique(torch.cat([top, torch.tensor(always)]))
    return ids, vocab_coverage(counts, ids)


def vocab_coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """The share of the counted answer tokens that are among ``ids``."""
    return float(counts[ids].sum() / counts.sum())


def run_vocab(rows: list[dict], n: int, always: list[int], init: str | None) -> tuple[torch.Tensor, float]:
    """This run's vocabulary: a warm restart (``init``) keeps the saved head's, so that more data
    (whose most frequent tokens shift a little) can continue a head; else ``pick_vocab``."""
    if not init:
        return pick_vocab(rows, n, always)
    ids = DraftHead.load(init).vocab_ids.cpu().long()
    return ids, vocab_coverage(answer_token_counts(rows), ids)


def batches(rows: list[dict], max_tokens: int, rng: random.Random) -> list[list[dict]]:
    order = sorted(rows, key=lambda r: len(r["ids"]))
    out, cur = [], []
    for r in order:
        if cur and (len(cur) + 1) * len(r["ids"]) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(batch: list[dict], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> feats (B, L+1, n*d) = f_0..f_L (n feature layers side by side, the final one last),
    tokens (B, L) = x_1..x_L, mask (B, L) for outputs j whose target token x_{j+2} is an answer
    token and whose target feature f_{j+1} exists; on ``device`` (rows preloaded there by
    ``to_device`` are read there)."""
    lmax = max(len(r["ids"]) for r in batch) - 1  # feature count of the longest row
    shape = batch[0]["feats"].shape  # (n, d) or (n, layers, d)
    d = int(np.prod(shape[1:]))
    feats = torch.zeros(len(batch), lmax, d, device=device)
    tokens = torch.zeros(len(batch), lmax - 1, dtype=torch.long, device=device)
    mask = torch.zeros(len(batch), lmax - 1, dtype=torch.bool, device=device)
    for i, r in enumerate(batch):
        n = len(r["ids"]) - 1  # features f_0 .. f_{n-1}
        f = r["feats"]  # (n, d): a memory-mapped array (draft_data) or a tensor
        f = torch.from_numpy(np.asarray(f, dtype=np.float32)) if isinstance(f, np.ndarray) else f.float()
        feats[i, :n] = f.reshape(n, d)
        tokens[i, : n - 1] = r["ids"][1:n].long()
        j = torch.arange(n - 1, device=device)
        mask[i, : n - 1] = j + 2 >= r["prompt_len"]
    return feats, tokens, mask


def to_device(rows: list[dict], device: torch.device) -> None:
    """Read every row's features and ids into ``device`` memory once (float16 features: a GPU holds
    the whole cache, so batches are gathered there, not read and converted on the host each step)."""
    for r in rows:
        f = r["feats"]
        r["feats"] = (torch.from_numpy(np.ascontiguousarray(f)) if isinstance(f, np.ndarray) else f).to(device)
        r["ids"] = r["ids"].to(device)


def step_losses(head, embed, w_sub, feats, tokens, mask, noise: float, unroll: int = 2, w_head=None):
    """[(cls, reg, top1)] for unroll steps 1 .. ``unroll``. Step u > 1 reads, at output j, the
    head's step u - 1 prediction at j - 1 (so its input chain reaches back u - 1 own predictions to a
    true feature), as the u-th draft of a round does; position 0 always reads the true feature.
    ``w_head``: the rows the head's own logits read (default ``w_sub``; --qat: their int4 round trip)."""
    w_head = w_sub if w_head is None else w_head
    if unroll < 1:
        raise ValueError(f"unroll must be >= 1, got {unroll}")
    d = w_sub.shape[1]
    f_in, f_tgt = feats[:, :-1], feats[:, 1:, -d:]  # (B, L, n*d) inputs, (B, L, d) final features
    with torch.no_grad():
        logp_t = torch.log_softmax(f_tgt @ w_sub.T, dim=-1)  # (B, L, N) target over the head's vocabulary
        p_t = logp_t.exp()
        emb = embed(tokens)
    losses, preds = [], None
    for u in range(unroll):
        if u == 0:
            x = f_in + noise * torch.randn_like(f_in)
        else:  # the head's own predictions as inputs, as for the 2nd+ drafts of a round (a fused
            # head reads zeros for the lower layers there, as at inference: DraftHead.inputs)
            fed = F.pad(preds[:, :-1], (f_in.shape[-1] - d, 0))  # (B, L-1, n*d)
            x = torch.cat([f_in[:, :1], fed], dim=1)
        preds = head(x, emb)  # (B, L, d)
        logq = torch.log_softmax(preds @ w_head.T, dim=-1)
        cls = -(p_t * logq).sum(-1)[mask].mean()
        reg = F.smooth_l1_loss(preds[mask], f_tgt[mask])
        top1 = (logq.argmax(-1) == logp_t.argmax(-1))[mask].float().mean()
        losses.append((cls, reg, top1))
    return losses


DEFAULT_MINUTES = 12.0


def time_budget_s(epochs: float | None, minutes: float | None) -> float:
    """Seconds the run may take: ``minutes`` when given; else none (inf) when ``epochs`` ends the
    run, so that "--epochs 3" means three passes, not three passes or 12 minutes; else 12 minutes."""
    if minutes is not None:
        if minutes <= 0:
            raise SystemExit(f"--minutes must be > 0, got {minutes:g}")
        return minutes * 60
    return math.inf if epochs else DEFAULT_MINUTES * 60


def start_head(head: DraftHead, target, n_layers: int, init: str | None = None) -> dict | None:
    """Set the head's starting weights. From scratch: the target's last layer and final norm, and an
    input projection near "the next feature is this one" (z = f / w_norm; lower fused layers at
    zero weight; a small layer update). ``init``: a warm restart from a saved head (its bfloat16
    weights), which must have this run's vocabulary and feature layers; returns its training record."""
    if init:
        start = DraftHead.load(init)
        if not torch.equal(start.vocab_ids.cpu(), head.vocab_ids.cpu()) or start.feature_layers != head.feature_layers:
            sys.exit(f"--init {init}: its vocabulary or feature layers differ from this run's; train from scratch")
        have = start.config.num_hidden_layers
        if have > head.config.num_hidden_layers:
            sys.exit(f"--init {init} has {have} decoder layers, more than --head-layers {head.config.num_hidden_layers}")
        head.load_state_dict(start.state_dict(), strict=False)
        for layer in head.body.layers[have:]:  # added layers start as the identity: the head is the saved one
            add_identity_layer(layer, target)
        return {"from": str(init), **{k: start.meta.get(k) for k in ("epochs", "steps", "train_minutes", "val_top1_step1",
                                                                     "val_top1_step2", "lr")}}
    head.body.layers[0].load_state_dict(target.model.layers[-1].state_dict())
    head.body.norm.load_state_dict(target.model.norm.state_dict())
    d = target.config.hidden_size
    with torch.no_grad():
        w_norm = target.model.norm.weight.detach().float()
        head.fc.weight.zero_()  # lower feature layers (a fused head) start at zero weight
        n_in = n_layers * d
        head.fc.weight[:, n_in - d : n_in] = torch.diag(1.0 / w_norm)
        head.fc.weight[:, n_in:] = 0.02 * torch.randn(d, d)
        head.fc.bias.zero_()
        head.body.layers[0].self_attn.o_proj.weight.mul_(0.1)
        head.body.layers[0].mlp.down_proj.weight.mul_(0.1)
    for layer in head.body.layers[1:]:
        add_identity_layer(layer, target)
    return None


def add_identity_layer(layer: torch.nn.Module, target) -> None:
    """A decoder layer appended to a trained head: the target's last layer with its two residual
    writes (attention output, MLP down projection) at zero, so it passes its input through unchanged
    until training moves it."""
    layer.load_state_dict(target.model.layers[-1].state_dict())
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


class _FakeInt4(torch.nn.Module):
    """A weight parametrization: forward, the int4 round trip of the weight as shipped (bfloat16);
    backward, the identity (a straight-through estimator)."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        from ears_core.model.kernels.int4_linear import round_trip

        return w + (round_trip(w.detach().to(torch.bfloat16)).to(w.dtype) - w).detach()


def fake_int4(head: DraftHead, on: bool) -> int:
    """--qat on: every linear layer of the head the int4 kernel takes computes through its round trip
    (``_FakeInt4``); off: the parametrizations removed, the float weights kept. Returns how many layers."""
    from torch.nn.utils import parametrize

    from ears_core.model.kernels.int4_linear import takes

    layers = [m for m in head.modules() if takes(m)]
    for m in layers:
        if on:
            parametrize.register_parametrization(m, "weight", _FakeInt4())
        elif parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=False)
    return len(layers)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "assets" / "embedded_draft"))
    ap.add_argument("--minutes", type=float, default=None, help="stop after this many minutes (default: "
                    f"{DEFAULT_MINUTES:g} without --epochs; no time limit with --epochs)")
    ap.add_argument("--vocab", type=int, default=6144)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch-tokens", type=int, default=3072)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--features", required=True, help="a feature cache of scripts/draft_data.py features")
    ap.add_argument("--positions", type=int, default=None, help="train on this many answer positions (nested subsets)")
    ap.add_argument("--val-mod", type=int, default=20, help="prompts with id %% this == 0 validate")
    ap.add_argument("--val-rows", type=int, default=600, help="at most this many validation answers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=float, default=None, help="stop after this many passes over the data "
                    "(the learning-rate schedule then runs by epochs, so runs on nested subsets share a recipe)")
    ap.add_argument("--curve-every", type=int, default=0, help="also measure validation top-1 every this many "
                    "steps: the learning curve against answer positions seen, kept in training.json (the first "
                    "epoch sees each position once, so it is a saturation curve of one run)")
    ap.add_argument("--init", default=None, help="start from this saved head (its vocabulary is kept; the same "
                    "feature layers) instead of the target's last layer: more epochs on top of a finished run, with a new "
                    "warm-up and cosine schedule (a warm restart)")
    ap.add_argument("--unroll", type=int, default=2, help="training-time test: steps of the head's own predictions "
                    "fed back, counting the first from true features (2: the second draft's view; 3 adds the third's)")
    ap.add_argument("--head-layers", type=int, default=1, help="decoder layers of the head (a warm restart "
                    "from a head with fewer appends identity layers: add_identity_layer)")
    ap.add_argument("--device", default="cpu", help="where the head trains (cuda: the feature cache is read "
                    "into GPU memory once; scripts/draft_on_gpu.sh)")
    ap.add_argument("--qat", action="store_true", help="quantisation-aware: train through the int4 variant's "
                    "4-bit round trip (fake_int4), straight-through gradients")
    ap.add_argument("--fused", action="store_true", help="read every layer of the cache (EAGLE-3 "
                    "fusion; e.g. a cache made with --layers 3,15,last), not only the last")
    return ap.parse_args()


def evaluate(head: DraftHead, embed, w_sub: torch.Tensor, val: list[dict], batch_tokens: int, unroll: int,
             w_head: torch.Tensor | None = None) -> list[float]:
    """Validation top-1 agreement per unroll step (at least two), the head left in training mode."""
    head.eval()
    accs = [[] for _ in range(max(2, unroll))]
    with torch.no_grad():
        for b in batches(val, batch_tokens, random.Random(1)):
            for i, (_, _, top1) in enumerate(step_losses(head, embed, w_sub, *collate(b, w_sub.device), noise=0.0,
                                                         unroll=max(2, unroll), w_head=w_head)):
                accs[i].append(float(top1))
    head.train()
    return [sum(a) / len(a) for a in accs]  # val top-1 per unroll step


def schedule_progress(step: int, total_steps: int | None, elapsed_s: float, budget_s: float) -> float:
    """How far the learning-rate schedule is, 0..1: by steps with --epochs, by time with --minutes (or
    the default budget); with both, by whichever runs out first, so the cosine ends where the run does."""
    by_steps = step / total_steps if total_steps else 0.0
    by_time = elapsed_s / budget_s if math.isfinite(budget_s) else 0.0
    return min(1.0, max(by_steps, by_time))


def train(head: DraftHead, embed, w_sub: torch.Tensor, params: list, train_rows: list[dict], val: list[dict],
          args: argparse.Namespace, rng: random.Random, w_head: torch.Tensor | None = None
          ) -> tuple[int, int, list[dict]]:
    """AdamW with warm-up then cosine until the time or epoch budget runs out ->
    (steps, batches per epoch, the learning curve [(step, positions seen, val top-1)] if asked)."""
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    t0, step, epoch = time.perf_counter(), 0, 0
    budget = time_budget_s(args.epochs, args.minutes)
    per_epoch = len(batches(train_rows, args.batch_tokens, random.Random(0)))  # the same count every epoch
    total_steps = math.ceil(args.epochs * per_epoch) if args.epochs else None
    done = False
    seen, curve = 0, []  # answer positions trained on so far (repeats counted); [(step, seen, val top-1)]
    while not done:
        for b in batches(train_rows, args.batch_tokens, rng):
            el = time.perf_counter() - t0
            if el > budget or (total_steps and step >= total_steps):
                done = True
                break
            frac = schedule_progress(step, total_steps, el, budget)
            for g in opt.param_groups:  # warm-up then cosine
                g["lr"] = args.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            losses = step_losses(head, embed, w_sub, *collate(b, w_sub.device), noise=args.noise, unroll=args.unroll,
                                 w_head=w_head)
            loss = sum(c + 0.5 * r for c, r, _ in losses)
            (c1, r1, a1), (c2, r2, a2) = losses[0], losses[min(1, len(losses) - 1)]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            seen += sum(len(r["ids"]) - r["prompt_len"] for r in b)
            if args.curve_every and (step + 1) % args.curve_every == 0:
                top1 = evaluate(head, embed, w_sub, val, args.batch_tokens, args.unroll, w_head)[0]
                curve.append({"step": step + 1, "positions_seen": seen, "epoch": round((step + 1) / per_epoch, 3),
                              "val_top1_step1": round(top1, 4)})
                print(f"curve: {curve[-1]}", flush=True)
            if step % 25 == 0:
                c1, c2, r1, r2 = (float(x.detach()) for x in (c1, c2, r1, r2))
                print(f"epoch {epoch} step {step}/{total_steps or '?'} {el / 60:.1f} min: cls {c1:.3f}/{c2:.3f} "
                      f"reg {r1:.3f}/{r2:.3f} top1 {float(a1):.3f}/{float(a2):.3f}", flush=True)
            step += 1
        else:
            epoch += 1
    return step, per_epoch, curve


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    val, train_rows, layers = split_feature_rows(Path(args.features).expanduser(), args.val_mod, args.val_rows,
                                                 rng, args.fused)
    if args.positions:
        train_rows = take_positions(train_rows, args.positions)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the head trains in TF32 on a GPU; its features stay float32
    pair = load_pair("embedded", None, device=args.device, dtype=torch.float32)
    target, tok = pair.target, pair.tokenizer
    for p in target.parameters():
        p.requires_grad_(False)
    vocab_ids, coverage = run_vocab(train_rows, args.vocab, [tok.eos_token_id], args.init)
    positions = sum(len(r["ids"]) - r["prompt_len"] for r in train_rows)
    print(f"{len(train_rows)} train / {len(val)} val answers, {positions} answer positions; "
          f"vocab {len(vocab_ids)} covers {coverage:.3f} of answer tokens", flush=True)

    n_layers = target.config.num_hidden_layers
    if layers[-1] not in (-1, n_layers):
        sys.exit(f"the feature cache's last layer is {layers[-1]}, not the final one ({n_layers} = 'last')")
    head = DraftHead(head_config_from_target(target.config, args.head_layers), vocab_ids,
                     tuple(layers[:-1]) + (-1,))
    init_meta = start_head(head, target, len(layers), args.init)
    head.to(device)
    if device.type != "cpu":
        to_device(val + train_rows, device)
    embed = target.get_input_embeddings()
    w_out = target.get_output_embeddings().weight.detach()
    w_sub = w_out[vocab_ids.to(w_out.device)]  # (N, d)
    w_head = None
    if args.qat:
        from ears_core.model.kernels.int4_linear import round_trip

        w_head = round_trip(w_sub.to(torch.bfloat16)).to(w_sub.device)  # (N, d): the int4 variant's output rows
        print(f"--qat: {fake_int4(head, True)} linear layers through their int4 round trip", flush=True)
    params = [p for n, p in head.named_parameters() if not n.startswith("body.embed_tokens")]

    print(f"before training: val top-1 agreement step1 "
          f"{evaluate(head, embed, w_sub, val, args.batch_tokens, args.unroll, w_head)[0]:.3f}", flush=True)
    t0 = time.perf_counter()
    step, per_epoch, curve = train(head, embed, w_sub, params, train_rows, val, args, rng, w_head)
    vals = evaluate(head, embed, w_sub, val, args.batch_tokens, args.unroll, w_head)
    fake_int4(head, False)
    v1, v2 = vals[0], vals[1]
    minutes = (time.perf_counter() - t0) / 60
    print(f"done: {step} steps, {step / per_epoch:.2f} epochs, {minutes:.1f} min; val top-1 agreement step1 {v1:.3f} step2 {v2:.3f}")
    meta = {"train_answers": len(train_rows), "val_answers": len(val), "answer_positions": positions,
            "vocab": len(vocab_ids), "vocab_coverage": round(coverage, 4), "steps": step, "epochs": round(step / per_epoch, 2),
            "train_minutes": round(minutes, 1), "val_top1_step1": round(v1, 4), "val_top1_step2": round(v2, 4),
            **({"val_top1_step3": round(vals[2], 4)} if len(vals) > 2 else {}), "unroll": args.unroll, "qat": args.qat, "head_layers": args.head_layers, "device": args.device,
            "lr": args.lr, "noise": args.noise, "batch_tokens": args.batch_tokens,
            "data": "draft_data features",
            "positions_asked": args.positions, "feature_layers": list(head.feature_layers),
            "epochs_asked": args.epochs, "minutes_asked": args.minutes, "curve": curve,
            "init": init_meta}
    head.eval().cpu()
    head.save(args.out, meta=meta)
    (Path(args.out) / "training.json").write_text(json.dumps(meta, indent=1))
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
