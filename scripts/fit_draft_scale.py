"""Fit a draft head's temperature scale tau on held-out features and write it into head.json.

Terms
-----
first-draft acceptance  at temperature T under the ordinary rule, the chance that a first draft
                        stands: sum_x min(P_T(x), q(x)), with P_T the target's distribution at T
                        (over its whole vocabulary) and q the head's, zero outside its vocabulary.
temperature scale tau   the head draws at T * tau (``ears_core/draft/eagle.py``). A one-layer head is
                        flatter than the target where it is unsure, so tau < 1 often raises the
                        acceptance; it only changes what is drafted, so every rule stays exact.
fit                     tau on a grid, maximising the acceptance averaged over ``--temperatures``,
                        on the validation answers (prompt id % 20 == 0, never trained on) of a
                        ``draft_data.py features`` cache: the head's first draft after true
                        features, exactly what a round's first draft sees.

    python scripts/fit_draft_scale.py --draft assets/embedded_draft \
        --features ~/.cache/ears_studio/draft_features/L3-15-last [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from ears_core.draft.eagle import DraftHead  # noqa: E402

GRID = (0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1)


def acceptance_by_scale(pred_logits: torch.Tensor, target_logits: torch.Tensor, vocab_ids: torch.Tensor,
                        temperatures: list[float], taus: list[float], chunk: int = 512) -> dict[float, dict[float, float]]:
    """{T: {tau: mean first-draft acceptance}}. pred_logits (n, N) the head's logits on its
    vocabulary ``vocab_ids`` (N,); target_logits (n, V) the target's over its whole vocabulary."""
    sums = {t: {s: 0.0 for s in taus} for t in temperatures}
    n = pred_logits.shape[0]
    for a in range(0, n, chunk):
        lq, lp = pred_logits[a : a + chunk].float(), target_logits[a : a + chunk].float()  # (c, N), (c, V)
        for t in temperatures:
            p = torch.softmax(lp / t, dim=-1)[:, vocab_ids]  # (c, N): P_T on the head's tokens
            for s in taus:
                q = torch.softmax(lq / (t * s), dim=-1)  # (c, N)
                sums[t][s] += float(torch.minimum(p, q).sum())
    return {t: {s: v / max(n, 1) for s, v in row.items()} for t, row in sums.items()}


def best_scale(table: dict[float, dict[float, float]]) -> float:
    """The tau with the highest acceptance averaged over temperatures (ties: the one nearest 1)."""
    taus = list(next(iter(table.values())))
    mean = {s: sum(row[s] for row in table.values()) / len(table) for s in taus}
    return max(taus, key=lambda s: (round(mean[s], 6), -abs(s - 1.0)))


def first_draft_logits(head: DraftHead, target, rows: list[dict], batch_tokens: int = 3072):
    """(pred (n, N), target (n, V)) logits at every answer position of ``rows``: the head's first
    draft after true features, and the target's own distribution there."""
    import train_draft as td

    embed, w = target.get_input_embeddings(), target.get_output_embeddings().weight.detach()  # (V, d)
    w_sub, d = w[head.vocab_ids], w.shape[1]
    preds, tgts = [], []
    with torch.no_grad():
        for b in td.batches(rows, batch_tokens, random.Random(1)):
            feats, tokens, mask = td.collate(b)
            out = head(feats[:, :-1], embed(tokens))[mask]  # (n_b, d) predicted final features
            preds.append(out @ w_sub.T)
            tgts.append(feats[:, 1:, -d:][mask] @ w.T)
    return torch.cat(preds), torch.cat(tgts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", required=True, help="a saved head folder (head.json is updated in place)")
    ap.add_argument("--features", required=True, help="a draft_data.py features cache with the head's layers")
    ap.add_argument("--temperatures", default="0.6,0.9,1.2")
    ap.add_argument("--val-rows", type=int, default=200, help="validation answers to fit on")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="print the table, leave head.json alone")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import train_draft as td
    from ears_core.pair import load_pair

    head = DraftHead.load(args.draft)
    val, _, _ = td.split_feature_rows(Path(args.features).expanduser(), 20, args.val_rows, random.Random(0),
                                           fused=len(head.feature_layers) > 1)
    target = load_pair("embedded", device="cpu").target
    pred, tgt = first_draft_logits(head, target, val)
    temps = [float(t) for t in args.temperatures.split(",")]
    table = acceptance_by_scale(pred, tgt, head.vocab_ids.long(), temps, list(GRID))
    tau = best_scale(table)
    print(f"{pred.shape[0]} validation answer positions ({len(val)} answers)")
    for t, row in table.items():
        print(f"T = {t:g}: " + "  ".join(f"tau {s:g} {v:.4f}" for s, v in row.items()))
    print(f"best tau {tau:g} (was {head.temperature_scale:g})")
    if args.dry_run:
        return
    info_file = Path(args.draft) / "head.json"
    info = json.loads(info_file.read_text())
    info["temperature_scale"] = tau
    info.setdefault("meta", {})["temperature_scale_fit"] = {
        "positions": int(pred.shape[0]), "grid": list(GRID),
        "acceptance": {f"T={t:g}": {f"{s:g}": round(v, 4) for s, v in row.items()} for t, row in table.items()}}
    info_file.write_text(json.dumps(info, indent=1, default=str))
    print(f"wrote temperature_scale {tau:g} into {info_file}")


if __name__ == "__main__":
    main()
