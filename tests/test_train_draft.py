"""scripts/train_draft.py's data path for a fused head (EAGLE-3): rows with several feature
layers are laid side by side in the cache's order, the final layer last, and the losses read the
final layer as the target while the fed-back step sees zeros for the lower layers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ears_core.draft.eagle import DraftHead, head_config_from_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import train_draft as td  # noqa: E402


def _row(n: int, layers: int, d: int, prompt_len: int, seed: int) -> dict:
    g = np.random.default_rng(seed)
    return {"ids": torch.tensor(g.integers(4, 90, n + 1), dtype=torch.int32), "prompt_len": prompt_len,
            "feats": g.standard_normal((n, layers, d)).astype(np.float16)}


def test_collate_lays_fused_layers_side_by_side_with_the_final_one_last():
    rows = [_row(6, 2, 8, 2, 0), _row(9, 2, 8, 3, 1)]
    feats, tokens, mask = td.collate(rows)
    assert feats.shape == (2, 9, 16) and tokens.shape == (2, 8)
    f = torch.from_numpy(rows[1]["feats"].astype(np.float32))  # (9, 2, 8)
    assert torch.equal(feats[1, :, :8], f[:, 0]) and torch.equal(feats[1, :, 8:], f[:, 1])
    assert torch.equal(feats[0, 6:], torch.zeros(3, 16))  # padding
    assert mask[0].tolist() == [True] * 5 + [False] * 3  # outputs j with x_{j+2} an answer token and f_{j+1} known
    single = td.collate([{**r, "feats": r["feats"][:, -1]} for r in rows])[0]
    assert torch.equal(single, feats[..., 8:])


def test_the_losses_of_a_fused_head_train_its_lower_layer_weights():
    target = tiny_llama(0, vocab=96)
    d = target.config.hidden_size
    torch.manual_seed(0)
    head = DraftHead(head_config_from_target(target.config), torch.arange(96), feature_layers=(1, -1))
    rows = [_row(7, 2, d, 2, s) for s in range(3)]
    feats, tokens, mask = td.collate(rows)
    w_sub = target.get_output_embeddings().weight.detach()
    (c1, r1, a1), (c2, r2, a2) = td.step_losses(head, target.get_input_embeddings(), w_sub, feats, tokens, mask, 0.0)
    (c1 + r1 + c2 + r2).backward()
    g = head.fc.weight.grad  # (d, 3d): [lower layer | final layer | token embedding]
    assert g[:, :d].abs().sum() > 0 and g[:, d : 2 * d].abs().sum() > 0
    assert all(torch.isfinite(x) for x in (c1, r1, c2, r2)) and 0 <= float(a1) <= 1


def test_a_warm_restart_starts_from_the_saved_head_and_refuses_another_vocabulary(tmp_path):
    target = tiny_llama(0, vocab=96)
    cfg = head_config_from_target(target.config)
    torch.manual_seed(0)
    fresh = DraftHead(cfg, torch.arange(0, 96, 2), feature_layers=(1, -1))
    assert td.start_head(fresh, target, 2) is None
    d = target.config.hidden_size
    assert torch.equal(fresh.fc.weight[:, :d], torch.zeros(d, d))  # from scratch: lower layer at zero weight
    with torch.no_grad():
        fresh.fc.weight.add_(0.5)  # "trained"
    fresh.save(tmp_path / "a", meta={"epochs": 4.0, "val_top1_step1": 0.47})
    warm = DraftHead(cfg, torch.arange(0, 96, 2), feature_layers=(1, -1))
    record = td.start_head(warm, target, 2, init=str(tmp_path / "a"))
    assert record["from"] == str(tmp_path / "a") and record["epochs"] == 4.0 and record["val_top1_step1"] == 0.47
    saved = fresh.fc.weight.to(torch.bfloat16).float()  # what the file holds
    assert torch.equal(warm.fc.weight, saved) and not torch.equal(warm.fc.weight[:, :d], torch.zeros(d, d))
    other = DraftHead(cfg, torch.arange(1, 96, 2), feature_layers=(1, -1))
    with pytest.raises(SystemExit, match="vocabulary or feature layers differ"):
        td.start_head(other, target, 2, init=str(tmp_path / "a"))


def test_a_warm_restart_keeps_the_saved_heads_vocabulary_when_the_data_shifts(tmp_path):
    """More data moves the most frequent tokens; a restart must keep the head's own vocabulary (so
    start_head accepts it) and report the coverage of the new answers."""
    target = tiny_llama(0, vocab=96)
    saved_ids = torch.tensor([3, 5, 7, 9])
    DraftHead(head_config_from_target(target.config), saved_ids).save(tmp_path / "a", meta={})
    rows = [{"ids": torch.tensor([1, 2, 5, 5, 11, 11, 11, 3]), "prompt_len": 2}]  # answer: 5 5 11 11 11 3
    picked, cov = td.pick_vocab(rows, 2, [3])
    assert picked.tolist() == [3, 5, 11] and cov == 1.0
    kept, cov = td.run_vocab(rows, 2, [3], str(tmp_path / "a"))
    assert kept.tolist() == [3, 5, 7, 9] and cov == pytest.approx(3 / 6)
    assert td.run_vocab(rows, 2, [3], None)[0].tolist() == [3, 5, 11]


@pytest.mark.parametrize("fused", [False, True])
def test_each_unroll_step_reads_its_own_predictions_one_position_further_back(fused):
    """Training-time test: step u's output at j sees true features only up to j - u + 1 (and the
    first position), exactly as the u-th draft of a round sees the last true feature u - 1 drafts back."""
    target = tiny_llama(0, vocab=96)
    d = target.config.hidden_size
    torch.manual_seed(0)
    layers = (1, -1) if fused else (-1,)
    head = DraftHead(head_config_from_target(target.config), torch.arange(96), feature_layers=layers)
    feats, tokens, mask = td.collate([_row(9, len(layers), d, 1, 3)])
    feats.requires_grad_(True)
    w_sub = target.get_output_embeddings().weight.detach()
    j = 6
    only_j = torch.zeros_like(mask)
    only_j[0, j] = True
    losses = td.step_losses(head, target.get_input_embeddings(), w_sub, feats, tokens, only_j, 0.0, unroll=3)
    assert len(losses) == 3
    for u, (cls, _, _) in enumerate(losses, start=1):
        (g,) = torch.autograd.grad(cls, feats, retain_graph=True)
        touched = g[0].abs().sum(-1) > 0  # (L+1,): input positions the loss at j depends on
        last_true = j - u + 1
        assert touched[last_true], (u, touched.tolist())
        assert not touched[last_true + 1 : j + 1].any(), (u, touched.tolist())
    with pytest.raises(ValueError, match="unroll must be >= 1"):
        td.step_losses(head, target.get_input_embeddings(), w_sub, feats, tokens, mask, 0.0, unroll=0)


def test_epochs_alone_mean_every_pass_and_minutes_cap_only_when_asked():
    assert td.time_budget_s(3.0, None) == float("inf")  # was a silent 12-minute cap
    assert td.time_budget_s(3.0, 30.0) == 1800.0
    assert td.time_budget_s(None, None) == td.DEFAULT_MINUTES * 60
    assert td.time_budget_s(None, 5.0) == 300.0
    with pytest.raises(SystemExit, match="--minutes must be > 0"):
        td.time_budget_s(None, 0.0)


def test_a_head_grown_by_a_layer_starts_as_the_saved_head_and_its_new_layer_trains(tmp_path):
    target = tiny_llama(0, vocab=96)
    torch.manual_seed(0)
    one = DraftHead(head_config_from_target(target.config), torch.arange(96), feature_layers=(1, -1))
    td.start_head(one, target, 2)
    with torch.no_grad():  # a trained head's layer writes to the residual stream
        one.body.layers[0].self_attn.o_proj.weight.normal_(0, 0.05)
    one.save(tmp_path / "h1")
    one = DraftHead.load(tmp_path / "h1")  # bfloat16 weights read back, as the restart reads them
    two = DraftHead(head_config_from_target(target.config, 2), torch.arange(96), feature_layers=(1, -1))
    assert td.start_head(two, target, 2, str(tmp_path / "h1")) is not None
    rows = [_row(7, 2, target.config.hidden_size, 2, s) for s in range(2)]
    feats, tokens, _ = td.collate(rows)
    emb = target.get_input_embeddings()(tokens)
    with torch.no_grad():
        assert torch.allclose(two(feats[:, :-1], emb), one(feats[:, :-1], emb), atol=1e-5)
    two(feats[:, :-1], emb).square().sum().backward()
    new = two.body.layers[1]
    assert new.self_attn.o_proj.weight.grad.abs().sum() > 0 and new.mlp.down_proj.weight.grad.abs().sum() > 0
    one_more = DraftHead(head_config_from_target(target.config, 1), torch.arange(96), feature_layers=(1, -1))
    two.save(tmp_path / "h2")
    with pytest.raises(SystemExit, match="more than --head-layers"):
        td.start_head(one_more, target, 2, str(tmp_path / "h2"))


def test_rows_read_into_device_memory_collate_to_the_same_batch():
    rows = [_row(6, 2, 8, 2, 0), _row(9, 2, 8, 3, 1)]
    want = td.collate(rows)
    moved = [dict(r) for r in rows]
    td.to_device(moved, torch.device("cpu"))
    assert all(isinstance(r["feats"], torch.Tensor) and r["feats"].dtype == torch.float16 for r in moved)
    for a, b in zip(td.collate(moved, "cpu"), want):
        assert torch.equal(a, b)


def test_the_schedule_ends_with_whichever_budget_ends_first():
    inf = float("inf")
    assert td.schedule_progress(50, 100, 10.0, inf) == 0.5  # --epochs alone: by steps
    assert td.schedule_progress(50, None, 30.0, 120.0) == 0.25  # --minutes alone: by time
    assert td.schedule_progress(50, 100, 90.0, 120.0) == 0.75  # both: the minutes run out first
    assert td.schedule_progress(80, 100, 30.0, 120.0) == 0.8  # both: the epochs run out first
    assert td.schedule_progress(300, 100, 500.0, 120.0) == 1.0


@pytest.mark.skipif(not __import__("ears_core.model.kernels.gguf_q4", fromlist=["available"]).available(),
                    reason="this torch has no CPU int4 kernel")
def test_qat_runs_the_heads_linears_through_their_int4_round_trip_and_saves_the_float_weights():
    from ears_core.model.kernels.int4_linear import round_trip

    target = tiny_llama(0, vocab=96, hidden=64)
    torch.manual_seed(0)
    head = DraftHead(head_config_from_target(target.config), torch.arange(96), feature_layers=(1, -1))
    fc = head.fc.weight.detach().clone()
    assert td.fake_int4(head, True) == 1 + 7  # fc and the layer's seven projections
    assert torch.allclose(head.fc.weight, round_trip(fc.to(torch.bfloat16)), rtol=0, atol=1e-7)
    rows = [_row(7, 2, 64, 2, s) for s in range(2)]
    w_sub = target.get_output_embeddings().weight.detach()
    (c1, r1, _), _ = td.step_losses(head, target.get_input_embeddings(), w_sub, *td.collate(rows), 0.0,
                                    w_head=round_trip(w_sub.to(torch.bfloat16)))
    (c1 + r1).backward()
    grad = head.parametrizations.weight.original.grad if hasattr(head, "parametrizations") else \
        head.fc.parametrizations.weight.original.grad
    assert grad is not None and grad.abs().sum() > 0  # straight through to the float weight
    td.fake_int4(head, False)
    assert torch.equal(head.fc.weight.detach(), fc) and "fc.weight" in head.state_dict()
