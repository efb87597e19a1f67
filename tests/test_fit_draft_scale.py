"""fit_draft_scale.py: the expected first-draft acceptance under a temperature scale, and the fit."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import fit_draft_scale as fds  # noqa: E402


def test_acceptance_is_the_overlap_of_target_and_draft_on_known_numbers():
    # target over V = 4 at T = 1: (0.5, 0.25, 0.25, 0); head over ids (0, 1): logits equal -> (0.5, 0.5)
    tgt = torch.tensor([[0.0, -0.6931472, -0.6931472, -1e9]])
    pred = torch.tensor([[0.0, 0.0]])
    table = fds.acceptance_by_scale(pred, tgt, torch.tensor([0, 1]), [1.0], [1.0])
    assert table[1.0][1.0] == pytest.approx(0.5 + 0.25)  # min(.5,.5) + min(.25,.5)


def test_a_head_twice_as_flat_as_the_target_is_fitted_tau_one_half():
    gen = torch.Generator().manual_seed(0)
    tgt = torch.randn(300, 6, generator=gen) * 3
    tgt[:, 5] = -1e9  # no target mass outside the head's vocabulary (ids 0..4)
    ids = torch.arange(5)
    flat = tgt[:, :5] / 2  # the head's logits: the right order, half the sharpness
    table = fds.acceptance_by_scale(flat, tgt, ids, [0.6, 0.9, 1.2], [0.5, 0.75, 1.0, 1.25], chunk=64)
    for row in table.values():
        assert row[0.5] == pytest.approx(1.0, abs=1e-5) and row[1.0] < 0.95 and row[1.25] < row[1.0]
    assert fds.best_scale(table) == 0.5
    exact = fds.acceptance_by_scale(tgt[:, :5], tgt, ids, [0.9], [0.75, 1.0, 1.25])
    assert fds.best_scale(exact) == 1.0 and exact[0.9][1.0] == pytest.approx(1.0, abs=1e-5)
