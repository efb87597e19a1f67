"""A head's top-1 agreement with the target on feature caches, with its int4 rounding on or off, part by part.

Terms
-----
agreement   on the answer positions of the chosen answers, how often the head's top token equals the target's
            (scripts/train_draft.py's validation measure), for the first draft (true features in) and the
            second (its own prediction fed back).
layers      the head's linear layers (fc and its decoder layer) through their int4 round trip
            (``int4_linear.round_trip``), as the int4 variant computes them.
rows        the head's rows of the target's output head through their round trip, as the int4 variant's
            ``sub_head`` computes them. Both on: what ``EagleDrafter.quantize_kernels`` runs.

Two caches of the same answers (e.g. the lean target's and the float32 target's features, from
``draft_data.py features --target lean`` and ``--target float``) tell whether the head reads one target's
hidden states worse than the other's; the four int4 settings tell where the int4 variant loses.

    python scripts/head_agreement.py --features DIR [DIR ...] --heads assets/embedded_draft [DIR ...] \
        [--val-mod 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_draft as td  # noqa: E402
from draft_data import load_feature_rows  # noqa: E402

from ears_core.draft.eagle import DraftHead  # noqa: E402
from ears_core.model.kernels.int4_linear import round_trip  # noqa: E402
from ears_core.pair import load_pair  # noqa: E402

SETTINGS = ((False, False), (False, True), (True, False), (True, True))  # (layers int4, rows int4)


def agreement(head_dir: str, rows: list[dict], embed, w_out: torch.Tensor, layers: bool, rows_q: bool) -> list[float]:
    """Top-1 agreement of the first and second draft (module terms), the head's parts rounded as asked."""
    head = DraftHead.load(head_dir)
    w_sub = w_out[head.vocab_ids]
    if layers:
        td.fake_int4(head, True)
    w_head = round_trip(w_sub.to(torch.bfloat16)) if rows_q else None
    return [round(a, 4) for a in td.evaluate(head, embed, w_sub, rows, 3072, 2, w_head)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", nargs="+", required=True, help="feature caches of draft_data.py (fused layers)")
    ap.add_argument("--heads", nargs="+", required=True, help="head folders")
    ap.add_argument("--val-mod", type=int, default=0, help="only answers to prompts with id %% this == 0 (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair("embedded", None, dtype=torch.float32)  # the embedding and output head train_draft uses
    embed, w_out = pair.target.get_input_embeddings(), pair.target.get_output_embeddings().weight.detach()
    report: dict = {"val_mod": args.val_mod, "results": []}
    for folder in args.features:
        rows = [r for r in load_feature_rows(Path(folder).expanduser(), slice(None))
                if not args.val_mod or r["prompt_id"] % args.val_mod == 0]
        positions = sum(len(r["ids"]) - r["prompt_len"] for r in rows)
        for head_dir in args.heads:
            for layers, rows_q in SETTINGS:
                acc = agreement(head_dir, rows, embed, w_out, layers, rows_q)
                report["results"].append({"features": Path(folder).name, "head": head_dir, "answers": len(rows),
                                          "answer_positions": positions, "layers_int4": layers, "rows_int4": rows_q,
                                          "top1_first_draft": acc[0], "top1_second_draft": acc[1]})
                print(json.dumps(report["results"][-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
