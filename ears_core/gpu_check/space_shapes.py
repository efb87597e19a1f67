"""The ZeroGPU Space's default pair at its real shapes, with seeded random weights: what its passes cost on a device.

Terms
-----
space pair     a target with Qwen2.5-7B-Instruct's configuration (Qwen2: q / k / v biases, 28 layers, width 3,584,
               grouped queries 28 over 4, an untied head over a vocabulary padded to 152,064) drafted by one with
               Qwen2.5-0.5B-Instruct's (24 layers, width 896, 14 over 2, a tied head over 151,936), both scoring the
               tokenizer's 151,665 ids, built where they run in bfloat16 from a fixed seed (``SPACE_GPU``). Their
               tokens mean nothing; their costs are the real pair's. ``SPACE_CPU`` is a small pair of the same
               build for the CPU form of the check (the test suite runs it).
bandwidth      the device's memory bandwidth, measured: the fastest of several copies of a large buffer on it, read
               plus write bytes over the time. ``h2d`` likewise for a pinned host buffer copied to the device: what
               moving the weights in costs a ZeroGPU worker.
read time      the bytes a target step reads (every weight but the input embedding table, which a step reads one row
               of) over the bandwidth: a step's floor. The goal: a captured step within 1.3x of it.
round cost     a chain round of k drafts in target steps: k draft steps plus V(k + 1).
cold request   what a fresh worker's first request spends to its first token once the weights are on the device: a
               Session, its warm-up (prices measured, passes captured as they first run) and a speculative run to its
               first token (EARS 0.1, T = 0.9). A Space's worker adds its start and the weights' move (``h2d``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ears_core.gpu_check import captured, speed
from ears_core.gpu_check.outcome import Check
from ears_core.gpu_check.real_pairs import gib
from ears_core.model.cuda.graphed import graphed_or_eager
from ears_core.pair import ModelPair
from ears_core.serve.session import RunConfig, Session

__all__ = ["ModelShape", "SpaceShape", "SPACE_GPU", "SPACE_CPU", "space_pair", "stand_in_tokenizer", "weight_bytes",
           "bandwidth_gb_s", "check_space_shapes", "READ_GOAL", "ROUND_K"]

READ_GOAL = 1.3  # a captured step within this many read times (module terms: read time)
ROUND_K = 4  # the chain round whose cost is stated in target steps


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2 model's configuration, as its config.json gives it."""

    vocab: int  # rows of the embedding and head (padded past the tokenizer's ids)
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool

    def config(self) -> Qwen2Config:
        return Qwen2Config(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, max_position_embeddings=32768, rope_theta=1e6,
                           rms_norm_eps=1e-6, tie_word_embeddings=self.tied, use_sliding_window=False,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)


@dataclass(frozen=True)
class SpaceShape:
    """A target and draft shape and the ids both score (module terms: space pair)."""

    name: str
    target: ModelShape
    draft: ModelShape
    tokens: int  # the tokenizer's ids: what the pair decides over


SPACE_GPU = SpaceShape("Qwen2.5-7B-Instruct <- Qwen2.5-0.5B-Instruct shapes",
                       ModelShape(152064, 3584, 18944, 28, 28, 4, tied=False),
                       ModelShape(151936, 896, 4864, 24, 14, 2, tied=True), 151665)
SPACE_CPU = SpaceShape("small Qwen2 shapes", ModelShape(2048, 128, 448, 3, 4, 2, tied=False),
                       ModelShape(1920, 64, 224, 2, 2, 1, tied=True), 1900)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@torch.no_grad()
def _built(shape: ModelShape, device: torch.device, dtype: torch.dtype, seed: int) -> Qwen2ForCausalLM:
    """A model initialised where it runs, in ``dtype`` (a 7B float32 build would need twice the memory)."""
    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(dtype):
        model = Qwen2ForCausalLM(shape.config())
    model.generation_config.eos_token_id = None  # random weights: every run goes to its length
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(all parameter bytes, bytes a one-token step reads: module terms, read time)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    unread = 0 if head is embed else embed.numel() * embed.element_size()  # tied: one Parameter
    return total, total - unread


def stand_in_tokenizer(tokens: int) -> Any:
    """A word-level tokenizer over ``tokens`` ids ("t0" ... ; any other word is "t0"), built offline: the
    Session encodes and decodes through it (module terms: space pair; no Qwen tokenizer is on the machine)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(tokens)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0")


def space_pair(device: torch.device, shape: SpaceShape, dtype: torch.dtype = torch.bfloat16, seed: int = 0
               ) -> tuple[ModelPair, dict[str, Any]]:
    """The space pair on ``device`` (captured where graphs run there, as load_pair does), and what building it
    took: seconds, parameters and bytes of each model (module terms: space pair)."""
    t0 = time.perf_counter()
    target = _built(shape.target, device, dtype, seed)
    draft = _built(shape.draft, device, dtype, seed + 1)
    _sync(device)
    target_bytes, step_bytes = weight_bytes(target)
    built = {"build_s": round(time.perf_counter() - t0, 2),
             "target_params": sum(p.numel() for p in target.parameters()),
             "draft_params": sum(p.numel() for p in draft.parameters()),
             "target_bytes": target_bytes, "target_step_bytes": step_bytes, "draft_bytes": weight_bytes(draft)[0]}
    pair = ModelPair(graphed_or_eager(target), graphed_or_eager(draft), stand_in_tokenizer(shape.tokens), device, dtype,
                     shape.name, shape.tokens, "synthetic")
    return pair, built


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fastest_s(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def bandwidth_gb_s(device: torch.device, nbytes: int, repeats: int = 5) -> dict[str, float]:
    """The device's copy bandwidth and, on CUDA, a pinned host buffer's to it, GB/s (module terms)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    out = {"device_gb_s": round(2 * nbytes / _fastest_s(lambda: dst.copy_(src), device, repeats) / 1e9, 1)}
    if device.type == "cuda":
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        out["h2d_gb_s"] = round(nbytes / _fastest_s(lambda: dst.copy_(host, non_blocking=True), device, repeats) / 1e9, 1)
    del src, dst
    return out


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _memory(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":
        return 0, 0
    return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)


@torch.inference_mode()
def _cold_request(pair: ModelPair, prompt: torch.Tensor) -> dict[str, float]:
    """A Session made, warmed and run to its first speculative token, timed (module terms: cold request)."""
    t0 = time.perf_counter()
    session = Session(pair)
    session.warm_up()
    warmed = time.perf_counter()
    run = iter(session.speculative(prompt, RunConfig(rule="ears", params={"beta": 0.1}, temperature=0.9,
                                                     max_new_tokens=8, seed=0)))
    next(run)
    first = time.perf_counter()
    for _ in run:
        pass
    return {"warm_up_s": round(warmed - t0, 2), "first_token_s": round(first - t0, 2)}


def check_space_shapes(device: torch.device, shape: SpaceShape | None = None, repeats: int = 5,
                       copy_bytes: int | None = None) -> Check:
    """Build the space pair on ``device`` and measure it: memory, a cold request, capture, the price curve and
    draft step, the bandwidth and the step against its read time, and a chain round's cost in target steps."""
    cuda = device.type == "cuda"
    shape = shape or (SPACE_GPU if cuda else SPACE_CPU)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    pair, figures = space_pair(device, shape)
    figures["allocated_after_build_gib"] = gib(_memory(device)[0])
    prompt = torch.randint(0, shape.tokens, (1, 32), generator=torch.Generator().manual_seed(0)).to(device)
    figures["cold_request"] = _cold_request(pair, prompt)
    captured.prepare(pair, prompt)  # every width 1..16 captured, after what the cold request captured
    figures["capture_s"] = round(captured.capture_seconds(pair), 2)
    curve = speed.price_curve(pair, repeats).figures
    step_ms, draft_ms = curve["verify_ms"][0], curve["draft_ms"]
    bw = bandwidth_gb_s(device, copy_bytes or (2**31 if cuda else 2**26))
    read_ms = figures["target_step_bytes"] / (bw["device_gb_s"] * 1e9) * 1e3
    round_steps = ROUND_K * draft_ms / step_ms + curve["steps"][ROUND_K]
    allocated, peak = _memory(device)
    figures.update(step_ms=round(step_ms, 3), steps=curve["steps"], draft_ms=round(draft_ms, 3),
                   draft_in_steps=round(draft_ms / step_ms, 3), **bw, read_ms=round(read_ms, 3),
                   step_over_read=round(step_ms / read_ms, 2), read_goal_met=step_ms <= READ_GOAL * read_ms,
                   chain_round_k=ROUND_K, chain_round_steps=round(round_steps, 2),
                   allocated_gib=gib(allocated), peak_gib=gib(peak))
    h2d = (f", weights in over {bw['h2d_gb_s']} GB/s: {figures['target_bytes'] / bw['h2d_gb_s'] / 1e9:.2f} s"
           if "h2d_gb_s" in bw else "")
    detail = (f"{shape.name}: {_count(figures['target_params'])} <- {_count(figures['draft_params'])} parameters built in "
              f"{figures['build_s']} s; step {step_ms:.2f} ms = {step_ms / read_ms:.2f}x its read time ({read_ms:.2f} ms "
              f"at {bw['device_gb_s']} GB/s; goal {READ_GOAL}x); V(1..8) {' '.join(f'{s:.2f}' for s in curve['steps'][:8])}; "
              f"draft step {draft_ms:.2f} ms ({draft_ms / step_ms:.3f} of a step); a chain round of {ROUND_K} drafts "
              f"{round_steps:.2f} steps; cold request to its first token {figures['cold_request']['first_token_s']} s"
              f"{h2d}; capture {figures['capture_s']} s; memory {figures['allocated_after_build_gib']} GiB built, "
              f"{figures['peak_gib']} GiB at peak")
    del pair
    if cuda:
        torch.cuda.empty_cache()
    return Check("", "pass", detail, figures)
