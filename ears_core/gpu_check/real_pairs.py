"""The real pairs on this machine, if any: the prepared embedded pair and presets in the local Hugging Face cache.

Terms
-----
present    the embedded pair is present when its prepared safetensors folder is in ``$EARS_CACHE``
           (``python -m ears_core.model.loading.embedded --prepare`` made it); a preset is present when the local
           Hugging Face cache holds the config of both its target and its draft. Nothing is downloaded:
           HF_HUB_OFFLINE is set before any load, and a pair that is not present is *skipped*, never passed.
largest    the present pair with the most bytes of target weights on disk: the speed part's subject.
real check greedy equality with the target's own greedy decoding on five chat prompts (chain, and tree
           where the drafter can branch), then EARS (beta 0.1) at T = 0.9 running to the end.
cold start what a ZeroGPU Space's first request spends before its first token (``cold_start``): the load, the
           first speculative run's first token (on CUDA its first passes capture their graphs), the
           capture seconds within that, and the GPU memory allocated after the load and at its peak. The
           Space's allowance (studio/zerogpu.py, ``START_S``) is set from these.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from ears_core.decode.api import autoregressive, generate, stream, tree_generate
from ears_core.gpu_check.correctness import parting
from ears_core.gpu_check.outcome import Check
from ears_core.model.loading.embedded import CACHE_SUBDIR, MARKER, cache_root
from ears_core.pair import EMBEDDED, PRESETS, ModelPair, load_pair
from ears_core.rules import EARSRule, GreedyRule

__all__ = ["present_pairs", "check_real_pair", "REAL_PROMPTS", "gib"]

REAL_PROMPTS = ("What is the capital of France? Answer in one sentence.", "Write a haiku about the sea.",
                "Explain in two sentences why the sky is blue.", "List three prime numbers greater than 10.",
                "Translate 'good morning' into Spanish and German.")


def _hub_bytes(repo: str) -> int | None:
    """Bytes of ``repo`` in the local Hugging Face cache, or None when its config is not there."""
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(repo, "config.json"), str):
        return None
    try:
        return next((r.size_on_disk for r in scan_cache_dir().repos if r.repo_id == repo), 0)
    except Exception:  # an unreadable cache folder: present, size unknown
        return 0


def present_pairs() -> list[tuple[str, str, int]]:
    """(target, draft, target bytes) of every present pair, largest target first (module terms)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    found = []
    folder = cache_root() / CACHE_SUBDIR
    if (folder / MARKER).is_file():
        found.append((EMBEDDED, EMBEDDED, sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))))
    for preset in PRESETS:
        if preset.target == EMBEDDED:
            continue
        target_bytes, draft_bytes = _hub_bytes(preset.target), _hub_bytes(preset.draft)
        if target_bytes is not None and draft_bytes is not None:
            found.append((preset.target, preset.draft, target_bytes))
    return sorted(found, key=lambda f: -f[2])


def _greedy_parts(pair: ModelPair, new_tokens: int) -> list[str]:
    """Where speculative greedy output parts from the target's own beyond a near-tie, per prompt and shape."""
    shapes = {"chain": lambda ids: generate(pair.target, pair.new_drafter(), ids, rule=GreedyRule(), k=4,
                                            temperature=0.0, max_new_tokens=new_tokens, vocab_size=pair.vocab_size)}
    if hasattr(pair.new_drafter(), "propose_tree"):
        shapes["tree"] = lambda ids: tree_generate(pair.target, pair.new_drafter(), ids, rule=GreedyRule(), budget=8,
                                                   depth=4, temperature=0.0, max_new_tokens=new_tokens,
                                                   vocab_size=pair.vocab_size)
    parts = []
    for prompt in REAL_PROMPTS:
        ids = pair.encode(prompt)  # (1, T)
        ref = autoregressive(pair.target, ids, temperature=0.0, max_new_tokens=new_tokens,
                             vocab_size=pair.vocab_size).token_ids
        for shape, run in shapes.items():
            parted = parting(pair.target, ids, ref, run(ids).token_ids, pair.vocab_size)
            if parted is not None and parted[1] > parted[2]:  # beyond a near-tie
                parts.append(f"{shape} parts at token {parted[0]} of {prompt!r}")
    return parts


def gib(n: int) -> float:
    return round(n / 2**30, 3)


def cold_start(target: str, draft: str, device: torch.device) -> tuple[ModelPair, dict[str, Any]]:
    """Load the pair and run to its first speculative token, timed (module terms: cold start)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    pair = load_pair(target, draft, device=device)
    loaded = time.perf_counter()
    allocated = torch.cuda.memory_allocated(device) if cuda else 0
    run = iter(stream(*pair, pair.encode(REAL_PROMPTS[0]), rule=EARSRule(beta=0.1), k=4, temperature=0.9,
                      max_new_tokens=8, seed=0, vocab_size=pair.vocab_size))
    next(run)
    first = time.perf_counter()
    for _ in run:
        pass
    captured = sum(float(getattr(m, "capture_s", 0.0) or 0.0) for m in (pair.target, pair.draft) if m is not None)
    return pair, {"load_s": round(loaded - t0, 2), "first_token_s": round(first - t0, 2),
                  "capture_s": round(captured, 2), "gpu_allocated_gib": gib(allocated),
                  "gpu_peak_gib": gib(torch.cuda.max_memory_allocated(device)) if cuda else 0.0}


def check_real_pair(target: str, draft: str, device: torch.device, new_tokens: int = 48) -> Check:
    """Load a present pair on ``device``, timing its cold start, and run the real check (module terms)."""
    pair, start = cold_start(target, draft, device)
    parts = _greedy_parts(pair, new_tokens)
    if parts:
        return Check("", "fail", "; ".join(parts), {"target": target, "draft": draft, **start})
    out = generate(*pair, pair.encode(REAL_PROMPTS[2]), rule=EARSRule(beta=0.1), k=4, temperature=0.9,
                   max_new_tokens=64, seed=0, vocab_size=pair.vocab_size)
    s = out.stats
    ended = s.new_tokens == 64 or (out.token_ids and out.token_ids[-1] in _eos(pair))
    if not ended or not math.isfinite(s.mean_distortion) or s.mean_distortion < 0:
        return Check("", "fail", f"EARS 0.1 at T = 0.9 stopped after {s.new_tokens} tokens (distortion "
                     f"{s.mean_distortion})", {"target": target, **start})
    return Check("", "pass", f"{pair.name}: greedy = target on {len(REAL_PROMPTS)} prompts; EARS 0.1 at T = 0.9 ran "
                 f"{s.new_tokens} tokens (acceptance {s.acceptance_rate or 0:.2f}, pardons {s.pardon_rate or 0:.2f}); "
                 f"cold start to the first token {start['first_token_s']} s (load {start['load_s']} s, capture "
                 f"{start['capture_s']} s), GPU memory {start['gpu_allocated_gib']} GiB, peak {start['gpu_peak_gib']} GiB",
                 {"target": target, "draft": draft, "acceptance": s.acceptance_rate, **start})


def _eos(pair: ModelPair) -> set[int]:
    eos = pair.target.generation_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
