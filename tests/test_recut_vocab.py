"""scripts/recut_vocab.py: a head's vocabulary cut to its N most frequent answer tokens, nothing else moved."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama
from ears_core.draft.eagle import DraftHead, head_config_from_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import draft_data as dd  # noqa: E402
import recut_vocab as rv  # noqa: E402


def _store(tmp_path: Path) -> Path:
    """Answers in which token 10 is most frequent, then 30, then 7 (outside the head's vocabulary)."""
    answers = [dd.Answer(0, 0, 3, 0, [10] * 9 + [30] * 5 + [7] * 20 + [12] * 2, True),
               dd.Answer(1, 0, 3, 0, [10] * 3 + [2, 14], True)]
    dd.write_shard(dd.answers_dir(tmp_path / "store"), 0, dd.Shard(answers, 0.9, 0, 64))
    return tmp_path / "store"


def test_the_cut_keeps_the_most_frequent_trained_tokens_and_end_of_sequence(tmp_path):
    target = tiny_llama(0, vocab=96)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2), feature_layers=(1, -1))
    head.save(tmp_path / "head")
    info = rv.recut(tmp_path / "head", 2, tmp_path / "cut", _store(tmp_path))
    cut = DraftHead.load(tmp_path / "cut")
    assert cut.vocab_ids.tolist() == [2, 10, 30]  # 7 occurs most but the head never learnt it
    assert info["vocab"] == 3 and info["was"] == 48
    assert info["covers"] == pytest.approx((12 + 5 + 1) / 41, abs=1e-4)
    assert info["was_covers"] == pytest.approx(21 / 41, abs=1e-4)
    old = DraftHead.load(tmp_path / "head").state_dict()
    for name, value in cut.state_dict().items():
        if name != "vocab_ids" and not name.startswith("body.embed_tokens"):  # the target's, not saved
            assert torch.equal(value, old[name]), name
    with pytest.raises(SystemExit, match="below the head's 48"):
        rv.recut(tmp_path / "head", 48, tmp_path / "cut2", tmp_path / "store")
