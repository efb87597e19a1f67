"""The Quality tab's logic without a browser: the shipped frontier or a clear message when it is absent,
the live sweep's stream on a tiny random pair, its checks and the server's time limit."""
from __future__ import annotations

import json

import pytest

from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.settings import Settings
from ears_core.studio import quality
from test_app import tiny_backend
from test_quality import rows_for_figure


def shipped_file(tmp_path):
    path = tmp_path / "bench_test_quality.json"
    path.write_text(json.dumps(dict(section="quality", target="embedded", draft="embedded", seeds=3, rows=rows_for_figure(),
                                    questions=dict(count=60, kept=["capitals"], left_out=["colours"]),
                                    decoding=dict(temperature=0.9, k=4, max_new_tokens=16, draft_length="policy"),
                                    first_beta_outside_ordinary=0.5)))
    return path


def test_the_shipped_frontier_loads_and_its_absence_is_a_clear_message(tmp_path):
    assert quality.load_shipped(tmp_path / "missing.json") is None
    (tmp_path / "broken.json").write_text("{not json")
    assert quality.load_shipped(tmp_path / "broken.json") is None
    assert "No shipped quality results yet" in quality.shipped_note(None) and "--sections quality" in quality.ABSENT
    assert "bench_<machine>_quality.json" in quality.ABSENT
    assert quality.load_shipped(tmp_path) is None  # a folder without one
    summary = quality.load_shipped(shipped_file(tmp_path))
    assert quality.load_shipped(tmp_path) == summary  # found in the folder
    (tmp_path / "bench_zz_quality.json").write_text('{"section": "main", "rows": [1]}')  # not the section: skipped
    assert quality.load_shipped(tmp_path) == summary
    note = quality.shipped_note(summary)
    assert "60 questions x 3 seeds" in note and "colours" in note and "**0.5**" in note
    table = quality.table(summary["rows"]).splitlines()
    assert len(table) == 2 + 5 and "| ordinary | 0.52 [0.42, 0.62] | 1.10× |" in table[3]


@pytest.fixture(scope="module")
def slot():
    s = PairSlot(Settings(), default_loader=tiny_backend)
    s.session()
    return s


def test_the_live_sweep_streams_every_run_into_the_figure(slot):
    outs = list(quality.make_sweep(slot, {"rows": rows_for_figure()})(3, [0.3, 1.0]))
    progress = [o[0] for o in outs]
    assert "0 / 12 runs" in progress[0]  # 3 questions x (target-only, ordinary, two betas)
    assert [f"{n} / 12 runs" in p for n, p in zip(range(1, 13), progress[1:])] == [True] * 12
    assert "done in" in progress[-1]
    final_table = outs[-1][2]
    for label in ("target-only", "ordinary", "ears beta=0.3", "ears beta=1"):
        assert f"| {label} |" in final_table
    fig = json.loads(outs[-1][1].plot)
    names = [t["name"] for t in fig["data"]]
    assert "EARS (beta)" in names and "EARS (beta) (live)" in names and "target-only (live)" in names


@pytest.mark.parametrize("n, betas, needle", [(0, [0.3], "questions must be between 1 and 20"),
                                              (21, [0.3], "questions must be between 1 and 20"),
                                              (3, [], "pick one or two betas"),
                                              (3, [0.1, 0.2, 0.3], "pick one or two betas"),
                                              ("x", [0.3], "questions must be a whole number")])
def test_the_live_sweep_refuses_what_the_server_does_not_allow(slot, n, betas, needle):
    outs = list(quality.make_sweep(slot, None)(n, betas))
    assert len(outs) == 1 and needle in outs[0][0]


def test_the_live_sweep_stops_at_the_servers_time_limit():
    tight = PairSlot(Settings(timeout_s=0.001), default_loader=tiny_backend)
    outs = list(quality.make_sweep(tight, None)(5, [0.3]))
    assert "Stopped after 0.001 s" in outs[-1][0] and "of 15 runs" in outs[-1][0]
