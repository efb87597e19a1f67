"""The target's own greedy accuracy on the question set, per category: what it can answer at all.

    python scripts/quality_greedy.py                                  # the embedded target, every question
    python scripts/quality_greedy.py --target Qwen/Qwen2.5-1.5B-Instruct --out docs/results/quality_greedy_qwen15.json
    python scripts/quality_greedy.py --rescore docs/results/quality_greedy_embedded.json   # the scorer changed: read again

Target-only decoding at T = 0, ``--max-new-tokens`` (16) new tokens, each question's prompt through the
pair's chat template; the answer is read with the quality scorer (ears_core/quality/score.py). Writes a
JSON file with the accuracy per category and every reply (docs/results/quality_greedy_embedded.json is
this script's output on the embedded target; the categories at 0 there are ``questions.LEFT_OUT``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from ears_core.pair import load_pair
from ears_core.quality.questions import LEFT_OUT_BELOW, QUESTIONS_FILE, load_questions
from ears_core.quality.runs import Decoding, Record, Setting, sweep
from ears_core.quality.summary import by_category
from ears_core.serve.session import Session

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="embedded")
    p.add_argument("--questions-file", type=Path, default=QUESTIONS_FILE)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: leaves the other core free)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "quality_greedy_embedded.json")
    p.add_argument("--rescore", type=Path, default=None,
                   help="decode nothing: score this file's replies again (the scorer or the question set changed)")
    a = p.parse_args(argv)
    qset = load_questions(a.questions_file)
    if a.rescore:
        return rescore(a.rescore, qset)
    torch.set_num_threads(a.threads)
    session = Session(load_pair(a.target, None, device="cpu"))
    t0 = time.perf_counter()
    records = []
    for n, rec in enumerate(sweep(session, qset, qset.questions, [Setting("target")],
                                  Decoding(temperature=0.0, max_new_tokens=a.max_new_tokens)), 1):
        records.append(rec)
        if n % 25 == 0:
            print(f"[{n}/{len(qset.questions)}] {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    out = dict(target=a.target, decoding="target-only, T = 0", max_new_tokens=a.max_new_tokens,
               machine=dict(torch=torch.__version__, python=platform.python_version(), threads=a.threads),
               command="python scripts/quality_greedy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               wall_s=round(time.perf_counter() - t0, 1),
               replies=[dict(id=r.question, reply=r.reply) for r in records])
    return write(a.out, out, records)


def write(path: Path, out: dict, records: list) -> int:
    """Fill in the scores of ``out`` from ``records``, write it, print the table."""
    cats = by_category(records)
    right = sum(r.correct for r in records)
    read = {r.question: r for r in records}
    out.update(questions=len(records), accuracy=round(right / len(records), 4), by_category=cats,
               left_out=[c for c, v in cats.items() if v["accuracy"] < LEFT_OUT_BELOW],
               left_out_rule=f"greedy accuracy below {LEFT_OUT_BELOW:g}",
               replies=[dict(r, answer=read[r["id"]].answer, correct=read[r["id"]].correct) for r in out["replies"]])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for c, v in cats.items():
        print(f"{c:16s} {v['right']:3d}/{v['runs']:3d}  {v['accuracy']:.2f}")
    print(f"all              {right:3d}/{len(records):3d}  {right / len(records):.2f}   -> {path}")
    return 0


def rescore(path: Path, qset) -> int:
    """Score a finished run's replies again with the current scorer and question set; rewrite the file."""
    out = json.loads(path.read_text(encoding="utf-8"))
    by_id = {q.id: q for q in qset.questions}
    records = []
    for r in out["replies"]:
        q = by_id[r["id"]]
        answer, correct = qset.read(q, r["reply"])
        records.append(Record("target-only", q.id, q.category, 0, r["reply"], answer, correct, 0, 0.0, 0, 0, 0, 0, 0.0))
    return write(path, out, records)


if __name__ == "__main__":
    sys.exit(main())
