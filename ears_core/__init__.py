"""EARS Studio core: speculative decoding with pluggable acceptance rules.

    from ears_core import generate, EARSRule
    out = generate(target, draft, input_ids, rule=EARSRule(beta=0.1), gamma=5, temperature=0.9)
    out.token_ids, out.events, out.stats

See DESIGN notes in the README for the decision rule and the terms used throughout.
"""

from .decoding import Generation, GenerationResult, autoregressive, autoregressive_stream, generate, stream
from .drafters import Drafter, ModelDrafter
from .events import KINDS, DraftRecord, StepRecord, TokenEvent
from .metrics import GenerationStats, expected_tokens_per_step, summarize, theoretical_speedup
from .rules import AcceptanceRule, EARSRule, EntropyEARSRule, GreedyRule, StandardRule, TypicalRule, rule_from_name
from .sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs, sample_with_uniforms
from .verify import DraftKind, Verdict, emitted_distribution, verify

__all__ = [
    "AcceptanceRule", "StandardRule", "EARSRule", "GreedyRule", "TypicalRule", "EntropyEARSRule", "rule_from_name",
    "verify", "Verdict", "DraftKind", "emitted_distribution",
    "generate", "stream", "autoregressive", "autoregressive_stream", "Generation", "GenerationResult",
    "Drafter", "ModelDrafter",
    "TokenEvent", "StepRecord", "DraftRecord", "KINDS",
    "GenerationStats", "summarize", "expected_tokens_per_step", "theoretical_speedup",
    "SamplingConfig", "Stream", "logits_to_probs", "counter_uniforms", "sample_with_uniforms",
]
__version__ = "0.1.0"
