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
from typing import TYPE_CHECKING

# Large CPU tensors (the weights) in transparent huge pages: target-only decoding measured faster and steadier
# across processes with them (docs/measurements.md).
# torch's CPU allocator reads the variable when it allocates (tests/test_structure.py checks that the weights
# land in huge pages); a value the user set wins (THP_MEM_ALLOC_ENABLE=0 turns it off).
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# Where each public name lives: ``from ears_core import X`` imports X's module on first use (PEP 562), so importing
# the package alone, or one of its light modules (``ears_core.threads``, ``ears_core.timing``), loads neither
# torch nor transformers' modeling code (13.7 s of a cold start on a slow 2-vCPU machine: docs/measurements.md).
_HOMES = {
    "ears_core.decode.api": "autoregressive autoregressive_stream generate stream tree_generate tree_stream",
    "ears_core.decode.generation": "Generation GenerationResult",
    "ears_core.draft.drafters": "Drafter ModelDrafter NGramDrafter",
    "ears_core.events": "KINDS DraftRecord StepRecord TokenEvent",
    "ears_core.metrics": "GenerationStats expected_tokens_per_step summarize theoretical_speedup",
    "ears_core.pair": "ModelPair load_pair",
    "ears_core.rules": "RULES AcceptanceRule EARSRule EntropyEARSRule GreedyRule Param StandardRule TypicalRule make_rule "
                       "register_rule",
    "ears_core.serve.session": "RunConfig Session",
    "ears_core.sampling": "SamplingConfig Stream counter_uniforms logits_to_probs sample_with_uniforms",
    "ears_core.decode.verify": "DraftKind Verdict verify",
    "ears_core.decode.verify_tree": "TreeVerdict verify_tree",
}
_HOME = {name: module for module, names in _HOMES.items() for name in names.split()}


if TYPE_CHECKING:  # the same names for type checkers and editors
    from ears_core.decode.api import autoregressive, autoregressive_stream, generate, stream, tree_generate, tree_stream
    from ears_core.decode.generation import Generation, GenerationResult
    from ears_core.decode.verify import DraftKind, Verdict, verify
    from ears_core.decode.verify_tree import TreeVerdict, verify_tree
    from ears_core.draft.drafters import Drafter, ModelDrafter, NGramDrafter
    from ears_core.events import KINDS, DraftRecord, StepRecord, TokenEvent
    from ears_core.metrics import GenerationStats, expected_tokens_per_step, summarize, theoretical_speedup
    from ears_core.pair import ModelPair, load_pair
    from ears_core.rules import (RULES, AcceptanceRule, EARSRule, EntropyEARSRule, GreedyRule, Param, StandardRule,
                                 TypicalRule, make_rule, register_rule)
    from ears_core.sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs, sample_with_uniforms
    from ears_core.serve.session import RunConfig, Session


def __getattr__(name: str) -> object:
    """A public name, imported from its module the first time it is asked for (then kept in the package)."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'ears_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = list(_HOME)  # every public name, as the table lists them
__version__ = "0.1.0"
