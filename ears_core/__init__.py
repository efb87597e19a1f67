"""EARS Studio core: speculative decoding with pluggable acceptance rules.

    from ears_core import load_pair, generate, EARSRule
    pair = load_pair()                                  # the embedded target with its draft
    out = generate(*pair, pair.encode("Hi!"), rule=EARSRule(beta=0.1), k=4, temperature=0.9)
    out.token_ids, out.events, out.stats

The README gives the decision rule and the public API; each subpackage's modules define their terms
in their docstrings (decode/ for rounds and verdicts, rules/ for the rules and the distortion);
docs/benchmarks.md has the measurements.
"""

import os as _os

# Large CPU tensors (the weights) in transparent huge pages: target-only decoding measured faster and steadier
# across processes with them (docs/measurements.md).
# torch's CPU allocator reads the variable when it allocates (tests/test_structure.py checks that the weights
# land in huge pages); a value the user set wins (THP_MEM_ALLOC_ENABLE=0 turns it off).
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from ears_core.decode.api import autoregressive, autoregressive_stream, generate, stream, tree_generate, tree_stream
from ears_core.decode.generation import Generation, GenerationResult
from ears_core.draft.drafters import Drafter, ModelDrafter, NGramDrafter
from ears_core.events import KINDS, DraftRecord, StepRecord, TokenEvent
from ears_core.metrics import GenerationStats, expected_tokens_per_step, summarize, theoretical_speedup
from ears_core.pair import ModelPair, load_pair
from ears_core.rules import (RULES, AcceptanceRule, EARSRule, EntropyEARSRule, GreedyRule, Param, StandardRule, TypicalRule,
                    make_rule, register_rule)
from ears_core.serve.session import RunConfig, Session
from ears_core.sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs, sample_with_uniforms
from ears_core.decode.verify import DraftKind, Verdict, verify
from ears_core.decode.verify_tree import TreeVerdict, verify_tree

__all__ = [
    "AcceptanceRule", "StandardRule", "EARSRule", "GreedyRule", "TypicalRule", "EntropyEARSRule",
    "RULES", "Param", "register_rule", "make_rule", "load_pair", "ModelPair", "RunConfig", "Session", "NGramDrafter",
    "verify", "Verdict", "DraftKind", "verify_tree", "TreeVerdict",
    "generate", "stream", "tree_generate", "tree_stream", "autoregressive", "autoregressive_stream", "Generation",
    "GenerationResult",
    "Drafter", "ModelDrafter",
    "TokenEvent", "StepRecord", "DraftRecord", "KINDS",
    "GenerationStats", "summarize", "expected_tokens_per_step", "theoretical_speedup",
    "SamplingConfig", "Stream", "logits_to_probs", "counter_uniforms", "sample_with_uniforms",
]
__version__ = "0.1.0"
