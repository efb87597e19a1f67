"""The lean target's output head (model/kernels/exact_head.py): every row of a call equals the one-row call bit for
bit in each layout this machine runs, the exact width found by probing, the chunk plan from measured costs, and
the choice cached, read back and refused where its layout does not run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from ears_core.model.kernels import exact_head
from ears_core.model.kernels.exact_head import (CHUNKS, ExactHead, HeadForm, _Weights, choose_head_form, exact_width,
                                                install_exact_head, layouts_here)

pytestmark = pytest.mark.usefixtures("cpu_form")  # once per kernel mode (conftest.py)


@pytest.fixture(scope="module")
def weight() -> torch.Tensor:
    return torch.randn(8192, 576, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)  # (V, d)


def test_every_layout_here_gives_each_row_the_one_row_bits_in_its_exact_form(weight) -> None:
    h = torch.randn(40, 576, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    weights = _Weights(weight)
    for layout in layouts_here(weight.dtype):
        width = exact_width(weights, layout, h)
        assert width in CHUNKS
        head = ExactHead(weight, HeadForm(layout, width, exact_head._plan({c: 1.0 for c in CHUNKS if c <= width})))
        one = torch.cat([head(h[i:i + 1]) for i in range(40)])  # (40, V)
        for rows in (2, 3, 5, 9, 17, 40):
            assert torch.equal(head(h[:rows]), one[:rows]), (layout, width, rows)
        torch.testing.assert_close(one.float(), F.linear(h.float(), weight.float()), atol=0.15, rtol=2e-2)


def test_the_exact_width_stops_where_a_wider_call_rounds_otherwise(monkeypatch, weight) -> None:
    def by_rows(h, w):  # (r, d) -> (r, V), each row alone: row-invariant whatever this CPU's matmul does
        return torch.cat([F.linear(row[None], w) for row in h])

    def rounds_from_four(layout, h, w, w_t):  # a kernel that blocks 4 rows and more another way
        return by_rows(h, w) + (h.shape[0] >= 4)

    monkeypatch.setattr(exact_head, "run_layout", rounds_from_four)
    h = torch.randn(16, 576, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    assert exact_width(_Weights(weight), "linear", h) == 3

    def rounds_one_row_in_a_chunk(layout, h, w, w_t):  # rows apart in the chunk at 8 .. 15 only: every chunk is tried
        y = by_rows(h, w)
        return y + (h.shape[0] == 4) * (h[:, :1] == h_probe[13, :1]).any() * 1.0

    h_probe = h
    monkeypatch.setattr(exact_head, "run_layout", rounds_one_row_in_a_chunk)
    assert exact_width(_Weights(weight), "linear", h) == 3
    monkeypatch.setattr(exact_head, "run_layout", lambda layout, h, w, w_t: by_rows(h, w) + (h.shape[0] > 1))
    assert exact_width(_Weights(weight), "linear", h) == 1  # a one-row call is its own reference


def test_the_plan_splits_rows_into_the_cheapest_exact_chunks() -> None:
    form = HeadForm("linear", 3, exact_head._plan({1: 3.0, 2: 4.0, 3: 7.5}))
    assert form.plan(1) == [1] and form.plan(2) == [2] and form.plan(3) == [2, 1]  # 4 + 3 < 7.5
    assert form.plan(5) == [2, 2, 1] and len(form.chunks) == exact_head.MAX_ROWS
    assert form.plan(40) == [3] * 13 + [1]  # past the plan: chunks of the exact width
    assert HeadForm("linear", 16, exact_head._plan({1: 1.0, 16: 1.0})).plan(17) == [16, 1]


def test_the_choice_takes_the_layout_whose_plan_costs_least(monkeypatch, weight) -> None:
    cost = {"linear": {1: 5.0, 2: 6.0, 3: 7.0, 4: 8.0, 8: 12.0}, "xw": {1: 3.0, 2: 6.0, 3: 9.0, 4: 12.0, 8: 24.0},
            "wx": {1: 30.0}, "packed": {1: 3.5, 2: 7.0, 3: 10.5, 4: 14.0, 8: 28.0}}
    now = [0.0]

    def fake_run(self, layout, h):
        now[0] += cost[layout].get(h.shape[0], 1.0) / 1000
        return torch.cat([F.linear(row[None], self.w) for row in h])  # row by row: every layout's width is 16

    monkeypatch.setattr(_Weights, "run", fake_run)
    monkeypatch.setattr(exact_head, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    form = choose_head_form(weight)
    assert "wx" not in form.ms  # ten times dearer on one row: pruned before its widths are timed
    # planned over r = 1, 3, 5: linear 5 + 7 + (8 + 5) = 25 against xw's 3 + 9 + 15 = 27 and packed's 31.5
    assert form.layout == "linear" and form.plan(5) == [4, 1] and form.width == 16
    assert form.ms["linear"]["8"] == 12.0 and "16" not in form.ms["linear"]  # widths past 8 untimed


def test_the_form_is_cached_read_back_and_refused_where_its_layout_does_not_run(monkeypatch, tmp_path, weight) -> None:
    model = SimpleNamespace(get_output_embeddings=lambda: SimpleNamespace(weight=weight))
    first = install_exact_head(model, tmp_path, measure=True)
    assert first.ms and model.head_form.form is first and not model.ears_head_provisional
    again = install_exact_head(model, tmp_path)
    assert again.layout == first.layout and again.measured_at == first.measured_at  # read back, not measured
    stale = HeadForm.file(first.key, tmp_path)
    stale.write_text(stale.read_text().replace(f'"layout": "{first.layout}"', '"layout": "nonesuch"'))
    third = install_exact_head(model, tmp_path, measure=True)
    assert third.layout in layouts_here(weight.dtype)  # a layout that does not run here is measured again
    stale.write_text("{not json")
    assert install_exact_head(model, tmp_path, measure=True).layout in layouts_here(weight.dtype)
    untimed = install_exact_head(model, tmp_path / "empty")  # a load: nothing timed
    assert untimed.ms == {} and untimed.layout == layouts_here(weight.dtype)[0] and model.ears_head_provisional
    assert not HeadForm.file(untimed.key, tmp_path / "empty").exists()  # nothing measured: nothing cached


def test_a_busy_machine_leaves_the_form_untimed_and_raises_for_the_caller_to_retry(monkeypatch, tmp_path, weight) -> None:
    import ears_core.timing
    from ears_core.model.measuring import measured
    from ears_core.timing import MachineBusy, RunQueue

    class Busy(RunQueue):
        def __exit__(self, *exc):
            self.waited_share = 0.9

    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)
    monkeypatch.setattr(measured, "RunQueue", Busy)
    model = SimpleNamespace(get_output_embeddings=lambda: SimpleNamespace(weight=weight))
    install_exact_head(model, tmp_path)
    with pytest.raises(MachineBusy, match="the output head's form"):
        install_exact_head(model, tmp_path, measure=True)
    assert model.ears_head_provisional and not list(tmp_path.glob("kernels/*.json"))  # the default stays, uncached
