"""scripts/draft_data.py: the resumable data pipeline of the embedded draft, on a tiny random model.

What must hold: an interrupted sampling run, resumed, ends with exactly the shards an
uninterrupted run writes (nothing lost, nothing redone); a half-written shard never counts;
the quiet file pauses work; features equal the target's own hidden states; and a prompt that
repeats a held-out prompt of assets/prompts.json is refused loudly.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ears_core.model.kernels import cpu_forms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import draft_data as dd  # noqa: E402
from draft_prompts import HeldOutLeak, assert_no_held_out, held_out_leaks, held_out_prompts  # noqa: E402

EOS = 3


class FakeTokenizer:
    """Plain encoding (no chat template): one token per character, ids 4..95."""

    chat_template = None
    eos_token_id = EOS
    pad_token_id = EOS

    def __call__(self, text, return_tensors=None):
        return {"input_ids": torch.tensor([[4 + ord(c) % 92 for c in text[:12]]])}


class StopAfter(dd.Pacer):
    """A pacer that receives a stop signal at its n-th check (checks happen at every generation step)."""

    def __init__(self, n: int) -> None:
        super().__init__(quiet_file=Path("/nonexistent/ears_quiet"), log=lambda m: None)
        self.n, self.calls = n, 0

    def wait_if_quiet(self) -> None:
        self.calls += 1
        if self.calls >= self.n:
            self.stop = True


def _store(tmp: Path, n: int = 10) -> tuple[Path, list[dict]]:
    store = tmp / "store"
    manifest = dd.append_manifest(store, [{"prompt": f"item {k}: say {'ab' * k}", "task": "t"} for k in range(n)])
    return store, manifest


def _run(model, store, manifest, pacer, **kw):
    args = dict(rounds=2, batch=4, max_new_tokens=10, temperature=0.9, greedy_frac=0.4, seed=0)
    args.update(kw)
    return dd.run_sampling(model, FakeTokenizer(), manifest, store, pacer=pacer, log=lambda m: None, **args)


def _contents(store: Path) -> dict[tuple[int, int], tuple[list[int], float]]:
    out = {}
    for p in dd.shard_paths(dd.answers_dir(store)):
        sh = dd.read_shard(p)
        for a in sh.answers:
            assert (a.prompt_id, a.round) not in out, "a job was answered twice"
            out[(a.prompt_id, a.round)] = (a.tokens, sh.temperature)
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_llama(0, vocab=96, eos=EOS)


def test_plan_covers_every_job_once_and_keeps_greedy_apart():
    batches = list(dd.plan_batches(10, 3, set(), 4, 0.4, 0.9))
    jobs = [j for _, b in batches for j in b]
    assert sorted(jobs) == sorted((p, r) for p in range(10) for r in range(3))
    for t, b in batches:
        assert all(dd.is_greedy(p, r, 0.4) == (t == 0.0) for p, r in b)
        assert all(r == 0 for p, r in b) if t == 0.0 else True
    assert any(t == 0.0 for t, _ in batches) and any(t == 0.9 for t, _ in batches)
    done = set(jobs[:5])
    rest = [j for _, b in dd.plan_batches(10, 3, done, 4, 0.4, 0.9) for j in b]
    assert sorted(rest) == sorted(set(jobs) - done)


def test_prompts_known_for_short_answers_are_batched_together():
    short = {p: p % 2 == 0 for p in range(40)}
    batches = [b for t, b in dd.plan_batches(40, 2, {(p, 0) for p in range(40)}, 5, 0.0, 0.9, short=short)]
    assert sorted(j for b in batches for j in b) == [(p, 1) for p in range(40)]
    assert all(len({short[p] for p, _ in b}) == 1 for b in batches)


def test_interrupted_then_resumed_run_equals_an_uninterrupted_one(tmp_path, model):
    store_a, manifest = _store(tmp_path / "a")
    _run(model, store_a, manifest, dd.Pacer(log=lambda m: None))
    full = _contents(store_a)
    assert len(full) == 20 and any(t == 0.0 for _, t in full.values()) and any(t == 0.9 for _, t in full.values())
    assert all(len(tokens) <= 10 for tokens, _ in full.values())

    store_b, manifest_b = _store(tmp_path / "b")
    stopper = StopAfter(15)  # the second batch is cut mid-generation, as by SIGTERM
    r = _run(model, store_b, manifest_b, stopper)
    assert stopper.stop and r["batches"] == 1
    assert len(dd.shard_paths(dd.answers_dir(store_b))) == 1  # the cut batch left nothing behind
    assert not list(dd.answers_dir(store_b).glob(".*"))
    _run(model, store_b, manifest_b, dd.Pacer(log=lambda m: None))
    assert _contents(store_b) == full
    before = sorted(p.name for p in dd.shard_paths(dd.answers_dir(store_b)))
    assert _run(model, store_b, manifest_b, dd.Pacer(log=lambda m: None))["batches"] == 0  # nothing left to do
    assert sorted(p.name for p in dd.shard_paths(dd.answers_dir(store_b))) == before


def test_more_rounds_later_adds_answers_without_touching_old_shards(tmp_path, model):
    store, manifest = _store(tmp_path, n=6)
    _run(model, store, manifest, dd.Pacer(log=lambda m: None), rounds=1)
    first = {p.name: p.read_bytes() for p in dd.shard_paths(dd.answers_dir(store))}
    _run(model, store, manifest, dd.Pacer(log=lambda m: None), rounds=3)
    assert sorted(_contents(store)) == sorted((p, r) for p in range(6) for r in range(3))
    assert all(Path(dd.answers_dir(store) / n).read_bytes() == b for n, b in first.items())


def test_a_half_written_shard_is_ignored_and_removed(tmp_path):
    folder = tmp_path / "answers"
    sh = dd.Shard([dd.Answer(7, 1, 5, 123, [9, 8, EOS], True), dd.Answer(2, 0, 4, 99, [60000] * 4, False)], 0.9, 42, 4)
    path = dd.write_shard(folder, 0, sh)
    back = dd.read_shard(path)
    assert [(a.prompt_id, a.round, a.prompt_len, a.prompt_crc, a.tokens, a.ended) for a in back.answers] == \
        [(7, 1, 5, 123, [9, 8, EOS], True), (2, 0, 4, 99, [60000] * 4, False)]
    assert back.temperature == pytest.approx(0.9) and back.seed == 42
    (folder / ".shard-00001.npz.tmp").write_bytes(b"killed mid-write")
    done, nxt, short = dd.done_jobs(folder, short_below=4)
    assert done == {(7, 1), (2, 0)} and nxt == 1 and short == {7: True, 2: False}
    assert dd.clean_partial(folder) == 1 and not list(folder.glob(".*"))
    with pytest.raises(ValueError):
        dd.write_shard(folder, 1, dd.Shard([dd.Answer(0, 0, 1, 0, [70000], True)], 0.9, 0, 4))


def test_quiet_file_pauses_until_removed(tmp_path):
    quiet = tmp_path / "ears_quiet"
    quiet.touch()
    removed_at = []

    def remove():
        time.sleep(0.3)
        removed_at.append(time.monotonic())
        quiet.unlink()

    pacer = dd.Pacer(quiet_file=quiet, poll_s=0.02, log=lambda m: None)
    th = threading.Thread(target=remove)
    th.start()
    assert pacer.may_start(None)
    th.join()
    assert removed_at and time.monotonic() >= removed_at[0] and pacer.paused_s > 0
    assert not quiet.exists()


def test_budget_and_stop_refuse_new_batches():
    pacer = dd.Pacer(minutes=1.0, log=lambda m: None)
    assert pacer.may_start(None) and pacer.may_start(30.0)
    assert not pacer.may_start(61.0)  # the next batch would not fit the budget
    pacer.stop = True
    assert not pacer.may_start(None)


def test_features_are_the_targets_hidden_states_and_resume(tmp_path, model):
    store, manifest = _store(tmp_path, n=5)
    _run(model, store, manifest, dd.Pacer(log=lambda m: None), rounds=1)
    out = tmp_path / "feats"
    layers = dd.parse_layers("1,last", model.config.num_hidden_layers)
    r = dd.run_features(model, FakeTokenizer(), store, out, layers, batch_tokens=40, pacer=dd.Pacer(log=lambda m: None),
                        log=lambda m: None)
    assert r["shards"] == len(dd.shard_paths(dd.answers_dir(store)))
    rows = dd.load_feature_rows(out, layer_slot=-1)
    low = dd.load_feature_rows(out, layer_slot=0)
    assert len(rows) == 5
    for row, lo in zip(rows, low):
        prompt = FakeTokenizer()(manifest[row["prompt_id"]]["prompt"])["input_ids"][0].tolist()
        ids = row["ids"].tolist()
        assert ids[: row["prompt_len"]] == prompt and len(ids) > row["prompt_len"]
        with torch.no_grad():
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        assert row["feats"].shape == (len(ids) - 1, model.config.hidden_size)
        assert np.allclose(np.asarray(row["feats"], dtype=np.float32), hs[-1][0, :-1].numpy(), atol=2e-2, rtol=1e-2)
        assert np.allclose(np.asarray(lo["feats"], dtype=np.float32), hs[1][0, :-1].numpy(), atol=2e-2, rtol=1e-2)
    again = dd.run_features(model, FakeTokenizer(), store, out, layers, batch_tokens=40,
                            pacer=dd.Pacer(log=lambda m: None), log=lambda m: None)
    assert again["shards"] == 0
    # a shard rewritten since (different content) has stale features: they are recomputed
    first = dd.shard_paths(dd.answers_dir(store))[0]
    sh = dd.read_shard(first)
    sh.answers = sh.answers[:1]
    dd.write_shard(dd.answers_dir(store), 0, sh)
    redo = dd.run_features(model, FakeTokenizer(), store, out, layers, batch_tokens=40,
                           pacer=dd.Pacer(log=lambda m: None), log=lambda m: None)
    assert redo["shards"] == 1


@pytest.mark.skipif(not cpu_forms.int4_runs(), reason="needs PyTorch's CPU int4 kernel running with bfloat16 activations")
def test_lean_features_are_the_lean_targets_hidden_states_one_answer_at_a_time(tmp_path, model):
    from ears_core.model.loading.lean_target import from_float_model

    store, manifest = _store(tmp_path, n=6)
    _run(model, store, manifest, dd.Pacer(log=lambda m: None), rounds=1, batch=2)
    tied = tiny_llama(0, vocab=96, eos=EOS)
    with torch.no_grad():
        tied.lm_head.weight.copy_(tied.model.embed_tokens.weight)  # the lean target ties its head
    lean = from_float_model(tied)
    out = tmp_path / "lean"
    layers = dd.parse_layers("1,last", lean.config.num_hidden_layers)
    shards = dd.shard_paths(dd.answers_dir(store))
    assert len(shards) >= 2
    answers = sum(len(dd.read_shard(p).answers) for p in shards[1:])
    kw = dict(batch_tokens=40, log=lambda m: None, shards=dd.shard_slice("1:"), one_by_one=True)
    r = dd.run_features(lean, FakeTokenizer(), store, out, layers, pacer=dd.Pacer(log=lambda m: None), **kw)
    assert r["shards"] == len(shards) - 1 and not (out / f"{shards[0].stem}.idx.npz").exists()  # the slice only
    rows = dd.load_feature_rows(out, layer_slot=slice(None))
    assert len(rows) == answers
    for row in rows:
        ids = row["ids"].tolist()
        with torch.inference_mode():
            hs = lean(torch.tensor([ids]), output_hidden_states=True).hidden_states
        want = torch.stack([hs[1][0, :-1], hs[-1][0, :-1]], dim=1).float()  # (n - 1, 2, d)
        assert torch.equal(torch.from_numpy(np.asarray(row["feats"], dtype=np.float32)), want.half().float())
    again = dd.run_features(lean, FakeTokenizer(), store, out, layers, pacer=dd.Pacer(log=lambda m: None), **kw)
    assert again["shards"] == 0  # resumed: nothing redone
    assert dd.features_dir(tmp_path, "3,15,last", "lean").name == "L3-15-last-lean"
    assert dd.shard_slice("0:95:4") == slice(0, 95, 4) and dd.shard_slice(None) == slice(None)


def test_a_prompt_that_changed_encoding_is_refused(tmp_path, model):
    store, manifest = _store(tmp_path, n=4)
    _run(model, store, manifest, dd.Pacer(log=lambda m: None), rounds=1)
    sh = dd.read_shard(dd.shard_paths(dd.answers_dir(store))[0])
    sh.answers[0].prompt_crc ^= 1
    with pytest.raises(ValueError, match="encodes differently"):
        dd.shard_sequences(sh, manifest, FakeTokenizer())


@pytest.mark.parametrize("leak", [
    "Why is the sky blue?",  # verbatim
    "why is the SKY blue",  # case and punctuation
    "Please answer this: How do airplanes stay in the air? Thanks!",  # wrapped
    "A baker makes 48 cookies and packs them into boxes of 6. How many boxes can he fill?",  # reworded
])
def test_held_out_prompts_are_refused_loudly(tmp_path, leak):
    clean = ["Explain gravity in simple terms.", "Write a haiku about a fox."]
    assert_no_held_out(clean)
    with pytest.raises(HeldOutLeak, match="held-out"):
        assert_no_held_out(clean + [leak])
    store, _ = _store(tmp_path, n=3)
    before = dd.manifest_path(store).read_text()
    with pytest.raises(HeldOutLeak):
        dd.append_manifest(store, [{"prompt": "a new one", "task": "t"}, {"prompt": leak, "task": "t"}])
    assert dd.manifest_path(store).read_text() == before  # nothing written


def test_the_wide_prompt_set_is_large_distinct_and_clean():
    from draft_prompts import wide_prompts

    prompts = [p["prompt"] for p in wide_prompts()]
    assert len(prompts) >= 4000 and len(set(prompts)) == len(prompts)
    assert held_out_leaks(prompts) == []
    held = {h["prompt"] for h in held_out_prompts()}
    assert not held & set(prompts)
    assert len({p["task"] for p in wide_prompts()}) >= 12


def test_the_committed_manifest_is_clean():
    rows = dd.load_manifest(dd.DATA)
    if not rows:
        pytest.skip("no committed manifest")
    assert_no_held_out([r["prompt"] for r in rows])


def test_target_questions_are_filtered():
    assert dd.clean_question('"What makes bread rise when it bakes?"') == "What makes bread rise when it bakes?"
    assert dd.clean_question("Question: How do ships float on water?\nThey float because...") == \
        "How do ships float on water?"  # the first line only
    assert dd.clean_question('A curious person might ask: "Why do cats purr when they are happy?') == \
        "Why do cats purr when they are happy?"  # the framing clause goes
    assert dd.clean_question('A student could ask, \u201cHow are rainbows formed after a storm?\u201d') == \
        "How are rainbows formed after a storm?"
    for bad in ["What?", "Tell me about ships.", "Here is a question: why?", "What is **bold** text?",
                "How do ships float? And why do they sink?", "what is x<|im_end|>?"]:
        assert dd.clean_question(bad) is None, bad
