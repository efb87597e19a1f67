"""decode/packed.py: the packed read's declared layouts. Known values go through pack and unpack unchanged for the
chain (chain.RoundHost, with and without the device chain's confidences) and the tree (device_tree.pack / unpack);
the lengths are the ones the hand-written offsets had."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ears_core.decode.chain import RoundHost
from ears_core.decode.device_tree import pack as pack_tree, unpack as unpack_tree
from ears_core.decode.packed import BOOL, CHAIN_READ, FLOAT, INT, TREE_READ, Field, Layout

F32 = torch.float32


def chain_verdict(distortion: bool) -> SimpleNamespace:
    """Row 0 of a chain Verdict with k = 3, every value distinct and exact in float32."""
    return SimpleNamespace(
        p=torch.tensor([[0.5, 0.25, 0.125]]), q=torch.tensor([[0.75, 0.5, 0.375]]),
        ratio=torch.tensor([[2 / 3, 0.5, 1 / 3]]),
        u=torch.tensor([[0.0625, 0.5625, 0.9375]]), tolerance=torch.tensor([[0.01, 0.02, 0.03]]),
        distortion=torch.tensor([[0.001, 0.002, 0.0]]) if distortion else None,
        max_p=torch.tensor([[0.5, 0.625, 0.75, 0.875]]), next_p=torch.tensor([0.3]), next_q=torch.tensor([0.2]),
        num_accepted=torch.tensor([2]), next_token=torch.tensor([151_642]),
        kinds=torch.tensor([[0, 1, 2]], dtype=torch.int8))


def f32(xs):
    return torch.tensor(xs, dtype=F32).tolist()  # the float32 values, as the host reads them


@pytest.mark.parametrize("distortion", [True, False])
def test_a_chain_round_goes_through_the_packed_read_unchanged(distortion):
    v, tokens = chain_verdict(distortion), torch.tensor([[7, 151_000, 3]])
    packed = RoundHost.pack(v, tokens)
    assert packed.dtype == torch.float64 and packed.shape == (9 * 3 + 5,)  # the old hand-written length, 9k + 5
    host = RoundHost.unpack(packed.tolist(), 3)
    assert (host.num_accepted, host.next_token, host.tokens, host.kinds) == (2, 151_642, [7, 151_000, 3], [0, 1, 2])
    assert host.p == [0.5, 0.25, 0.125] and host.q == [0.75, 0.5, 0.375] and host.u == [0.0625, 0.5625, 0.9375]
    assert host.ratio == f32([2 / 3, 0.5, 1 / 3]) and host.tolerance == f32([0.01, 0.02, 0.03])
    assert host.distortion == (f32([0.001, 0.002, 0.0]) if distortion else [0.0, 0.0, 0.0])
    assert host.max_p == [0.5, 0.625, 0.75, 0.875] and (host.next_p, host.next_q) == tuple(f32([0.3, 0.2]))
    assert host.confidences == [] and RoundHost.read(v, tokens) == host
    assert all(isinstance(t, int) for t in host.tokens + host.kinds)


def test_the_device_chains_confidences_travel_in_the_same_read():
    v, tokens = chain_verdict(True), torch.tensor([[7, 8, 9]])
    packed = RoundHost.pack(v, tokens, torch.tensor([0.875, 0.5, 0.25]))
    assert packed.shape == (10 * 3 + 5,)  # 9k + 5, and the k confidences
    host = RoundHost.unpack(packed.tolist(), 3, 3)
    assert host.confidences == [0.875, 0.5, 0.25]
    assert host.tokens == [7, 8, 9] and host.max_p == [0.5, 0.625, 0.75, 0.875] and host.next_token == 151_642


def test_a_round_with_no_drafts_packs_its_next_token_alone():
    v = SimpleNamespace(**{name: torch.zeros(1, 0) for name in ("p", "q", "ratio", "u", "tolerance")},
                        distortion=None, max_p=torch.tensor([[0.75]]), next_p=torch.tensor([0.5]),
                        next_q=torch.tensor([0.0]), num_accepted=torch.tensor([0]), next_token=torch.tensor([4]),
                        kinds=torch.zeros(1, 0, dtype=torch.int8))
    host = RoundHost.unpack(RoundHost.pack(v, torch.zeros(1, 0, dtype=torch.long)).tolist(), 0)
    assert (host.num_accepted, host.next_token, host.next_p, host.max_p, host.tokens) == (0, 4, 0.5, [0.75], [])


def test_a_tree_round_goes_through_the_packed_read_unchanged():
    """n = 4 nodes, depth 3, a path of 2 nodes: the TreeHost has every value, the path cut at n."""
    v = SimpleNamespace(
        p=torch.tensor([[0.5, 0.25, 0.125, 0.0625]]), q=torch.tensor([[0.75, 0.5, 0.375, 0.25]]),
        ratio=torch.tensor([[1.5, 0.5, 0.25, 0.125]]), u=torch.tensor([[0.125, 0.25, 0.375, 0.5]]),
        tolerance=torch.tensor([[0.0, 0.01, 0.02, 0.03]]), max_p=torch.tensor([[0.5, 0.625, 0.75, 0.875, 1.0]]),
        next_p=torch.tensor([0.375]), next_q=torch.tensor([0.125]), num_accepted=torch.tensor([2]),
        next_token=torch.tensor([99_999]), is_bonus=torch.tensor([True]), last_rejected=torch.tensor([-1]),
        path=torch.tensor([[1, 3, -1]]), kinds=torch.tensor([[2, 0, 3, 1]], dtype=torch.int8), distortion=None,
        distortion_exact=None)
    tokens, alive = torch.tensor([[11, 12, 13, 14]]), torch.tensor([True, True, False, True])
    scores = torch.tensor([-0.5, -1.25, -2.0, -3.5], dtype=torch.float64)  # float64, as a tree's scores
    priorities = torch.tensor([1.0, 0.5, 0.25, 0.125])
    packed = pack_tree(v, tokens, alive, scores, priorities)
    assert packed.dtype == torch.float64 and packed.shape == (11 * 4 + 3 + 7,)  # as the old offsets: 8N + 3 floats,
    # 3N + D + 4 ints
    host = unpack_tree(packed.tolist(), 4, 3)
    assert (host.num_accepted, host.next_token, host.is_bonus, host.last_rejected) == (2, 99_999, True, -1)
    assert host.path == [1, 3] and host.tokens == [11, 12, 13, 14] and host.kinds == [2, 0, 3, 1]
    assert host.alive == [True, True, False, True] and all(isinstance(a, bool) for a in host.alive)
    assert host.p == [0.5, 0.25, 0.125, 0.0625] and host.ratio == [1.5, 0.5, 0.25, 0.125]
    assert host.u == [0.125, 0.25, 0.375, 0.5] and host.tolerance == f32([0.0, 0.01, 0.02, 0.03])
    assert host.max_p == [0.5, 0.625, 0.75, 0.875, 1.0] and (host.next_p, host.next_q) == (0.375, 0.125)
    assert host.scores == [-0.5, -1.25, -2.0, -3.5] and host.priorities == [1.0, 0.5, 0.25, 0.125]
    assert host.distortion == [] and host.distortion_exact == []  # none computed: none read
    v.distortion = torch.tensor([[0.25, 0.0625, 0.0, 0.0]], dtype=torch.float64)  # (1, D + 1), as path_distortions
    v.distortion_exact = torch.tensor([[True, False, True, True]])
    packed = pack_tree(v, tokens, alive, scores, priorities)
    assert packed.shape == (11 * 4 + 3 + 7 + 2 * 4,)  # then the distortion and its flag per emitted position
    host = unpack_tree(packed.tolist(), 4, 3, 4)
    assert host.distortion == [0.25, 0.0625, 0.0, 0.0] and host.distortion_exact == [True, False, True, True]
    assert host.path == [1, 3] and host.alive == [True, True, False, True]  # the fields before them unchanged


def test_a_layout_refuses_a_field_of_the_wrong_width_or_a_missing_size():
    layout = Layout(Field("x", FLOAT, "k"), Field("n", INT), Field("ok", BOOL, "k", 1))
    assert layout.size(k=2) == 6
    values = dict(x=torch.tensor([0.5, 1.5]), n=torch.tensor([3]), ok=torch.tensor([True, False, True]))
    packed = layout.pack(values, k=2)
    assert packed.tolist() == [0.5, 1.5, 3.0, 1.0, 0.0, 1.0]
    assert layout.unpack(packed.tolist(), k=2) == dict(x=[0.5, 1.5], n=3, ok=[True, False, True])
    with pytest.raises(ValueError, match="'x' has 3 values"):
        layout.pack(dict(x=torch.zeros(3), n=torch.tensor([3]), ok=torch.zeros(3, dtype=torch.bool)), k=2)
    with pytest.raises(ValueError, match="pass k="):
        layout.size()
    with pytest.raises(ValueError, match="shorter than its layout"):
        layout.unpack([0.0] * 5, k=2)
    with pytest.raises(ValueError, match="distinct names"):
        Layout(Field("x", FLOAT), Field("x", INT))
    assert CHAIN_READ.size(k=4, c=0) == 41 and TREE_READ.size(n=6, depth=2, e=0) == 75
    assert TREE_READ.size(n=6, depth=2, e=3) == 75 + 2 * 3  # a distortion and its flag per emitted position
