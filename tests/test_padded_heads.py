"""Padded output heads: a pair whose heads carry rows past the tokenizer (Qwen2.5: 152,064 and 151,936 rows
for 151,665 tokens) decodes through the README's idioms unchanged, and never emits a padding row.

Tiny random Qwen2 models (non-zero q/k/v biases, grouped heads, a tied head) sharing the embedded SmolLM2
tokenizer (49,152 tokens), saved as folders and loaded with ``load_pair``. Their padding rows are made the most likely
logits on purpose, so a loop that read past the tokenizer would emit them at once.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ears_core import EARSRule, GreedyRule, autoregressive, generate, load_pair
from ears_core.model.loading.hub import ModelLoadError

from test_models import WORDS, _tokenizer

TOKENS = 49152  # the embedded tokenizer's length
TARGET_ROWS, DRAFT_ROWS = 53248, 50000  # padded past it, as Qwen2.5's 152,064 and 151,936 rows are


def embedded_tokenizer():
    from transformers import AutoTokenizer

    from ears_core.model.loading.embedded import prepare_embedded

    return AutoTokenizer.from_pretrained(prepare_embedded())


def _save_padded_qwen2(folder: Path, rows: int, seed: int, tokenizer=None) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 with ``rows`` head rows (tied), non-zero biases, padding rows that win."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=rows, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=True, use_sliding_window=False, sliding_window=32,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
        emb = model.get_input_embeddings().weight  # (rows, d), tied to the head
        emb[TOKENS:] = 4.0 * emb[:TOKENS].abs().mean() * torch.sign(torch.randn(rows - TOKENS, emb.shape[1]))
    model.save_pretrained(folder)
    (tokenizer or embedded_tokenizer()).save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def padded_folders(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("padded")
    _save_padded_qwen2(root / "target", TARGET_ROWS, 0)
    _save_padded_qwen2(root / "draft", DRAFT_ROWS, 1)
    return root / "target", root / "draft"


def _readme_block() -> str:
    from test_readme import library_example

    return library_example()


def test_the_readmes_block_runs_unchanged_on_a_padded_pair(padded_folders, capsys):
    target, draft = padded_folders
    code = _readme_block().replace("load_pair()", f"load_pair({str(target)!r}, {str(draft)!r}, device='cpu')")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    pair, out, base = scope["pair"], scope["out"], scope["base"]
    assert pair.vocab_size == TOKENS
    assert out.stats.drafted > 0 and len(out.token_ids) == 32 == len(base.token_ids)
    assert max(out.token_ids + base.token_ids) < TOKENS
    assert capsys.readouterr().out.startswith(out.text)


def test_no_padding_row_is_ever_emitted_at_a_high_temperature(padded_folders):
    pair = load_pair(*map(str, padded_folders), device="cpu")
    ids = pair.encode("The sea is", chat=False)
    spec, plain = [], []
    # 2 x 250 = 500 tokens a path; eos_token_id=[]: no early end. Read past the tokenizer, 1 token in 25 is a
    # padding row here (below): 20 expected, a loop that read them passes with probability e^-20
    for seed in range(2):
        spec += generate(*pair, ids, rule=EARSRule(beta=0.3), k=4, temperature=1.5, max_new_tokens=250,
                         seed=seed, eos_token_id=[]).token_ids
        plain += autoregressive(pair.target, ids, temperature=1.5, max_new_tokens=250, seed=seed,
                                eos_token_id=[]).token_ids
    assert len(spec) == 500 == len(plain)
    assert max(spec) < TOKENS and max(plain) < TOKENS
    # Without the pair's vocabulary the padding rows win: the test would catch a loop that read them.
    loose = autoregressive(pair.target, ids, temperature=1.5, max_new_tokens=50, seed=0, eos_token_id=[],
                           vocab_size=TARGET_ROWS).token_ids
    assert max(loose) >= TOKENS


def test_greedy_speculative_equals_target_only_on_a_padded_pair(padded_folders):
    pair = load_pair(*map(str, padded_folders), device="cpu")
    ids = pair.encode("Once upon a time", chat=False)
    spec = generate(*pair, ids, rule=GreedyRule(), k=3, temperature=0.0, max_new_tokens=40, eos_token_id=[])
    plain = autoregressive(pair.target, ids, temperature=0.0, max_new_tokens=40, eos_token_id=[])
    assert spec.token_ids == plain.token_ids


def test_a_pair_whose_tokenizers_differ_still_fails_fast(tmp_path):
    _save_padded_qwen2(tmp_path / "t", TARGET_ROWS, 0)
    other = _tokenizer([w + "x" for w in WORDS])
    other.save_pretrained(tmp_path / "d")  # the tokenizer alone: it is compared before any weights load
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_pair(str(tmp_path / "t"), str(tmp_path / "d"), device="cpu")
