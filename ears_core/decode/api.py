"""The decoding functions users call: speculative (chain or tree rounds) and target-only.

Each checks its request, builds the round shape and hands both to the one decode loop (rounds.py);
the result is a ``Generation`` to iterate (TokenEvents as they are decided) or to finish with ``result()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from ears_core.decode.baseline import target_only_events
from ears_core.decode.chain import ChainShape
from ears_core.decode.device_round import DeviceChainShape
from ears_core.decode.device_tree import DeviceTreeShape
from ears_core.decode.generation import (Generation, GenerationResult, as_input_ids, check_request, eos_set,
                                         shared_vocab)
from ears_core.decode.rounds import DecodeConfig, RoundShape, decode_rounds
from ears_core.decode.text import Detokenizer
from ears_core.decode.tree import TreeShape
from ears_core.draft.drafters import Drafter, ModelDrafter, scored_vocab
from ears_core.draft.trees import KeepFn, LevelFn, TreeSpec
from ears_core.deprecated import renamed_keyword
from ears_core.events import StepRecord
from ears_core.rules import AcceptanceRule, StandardRule
from ears_core.sampling import SamplingConfig

if TYPE_CHECKING:  # annotations only: importing it loads transformers' modeling code (seconds)
    from transformers import PreTrainedModel

__all__ = ["stream", "generate", "tree_stream", "tree_generate", "autoregressive_stream", "autoregressive"]


def _checked_rule(rule: AcceptanceRule | None) -> AcceptanceRule:
    rule = StandardRule() if rule is None else rule
    if not isinstance(rule, AcceptanceRule):
        raise ValueError(f"rule must be an AcceptanceRule such as StandardRule() or EARSRule(0.1), got {rule!r}")
    return rule


def _speculative(target: PreTrainedModel, drafter: Any, input_ids: Any, rule: AcceptanceRule, shape: RoundShape,
                 method: str, max_drafts: int, *, temperature: float, top_k: int | None, top_p: float | None,
                 max_new_tokens: int, seed: int, tokenizer: Any, eos_token_id: Any, vocab_size: int | None,
                 with_distortion: bool, deadline_s: float | None) -> Generation:
    """Check the request, wire the loop, wrap it in a Generation."""
    vocab = shared_vocab(target, drafter.vocab_size, vocab_size)
    if isinstance(drafter, ModelDrafter):
        drafter.vocab_size = vocab
    ids = as_input_ids(input_ids, target.device)
    check_request(target, ids, max_new_tokens, seed, vocab)
    cfg = DecodeConfig(SamplingConfig(temperature, top_k, top_p), max_new_tokens, seed, vocab,
                       eos_set(target, eos_token_id), with_distortion)
    steps: list[StepRecord] = []
    trees: list[Any] = []
    events = decode_rounds(target, drafter, shape, ids, rule, cfg, steps, trees, Detokenizer(tokenizer))
    return Generation(method, max_drafts, steps, events, deadline_s, trees, cfg.eos)


def stream(
    target: PreTrainedModel,
    draft: PreTrainedModel | Drafter,
    input_ids: Any,
    *,
    rule: AcceptanceRule | None = None,
    k: int = 5,
    temperature: float = 0.9,
    max_new_tokens: int = 128,
    seed: int = 0,
    top_k: int | None = None,
    top_p: float | None = None,
    tokenizer: Any | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    vocab_size: int | None = None,
    with_distortion: bool = True,
    deadline_s: float | None = None,
    policy: Any = None,
    calibration: Any = None,
    gamma: int | None = None,
    device_round: bool = False,
) -> Generation:
    """Speculative decoding of one prompt, at most K = ``k`` drafts per round; iterate for TokenEvents.

    ``draft`` is a Hugging Face causal LM sharing the target's tokenizer, or any ``Drafter``.
    ``rule`` defaults to StandardRule (lossless). ``tokenizer`` (optional) fills event text.
    ``deadline_s``: stop after this many seconds of decoding, keeping the tokens so far.
    ``policy`` (``costs.DraftPolicy``): each round sends as many drafts (0 .. k) as the measured
    prices and the acceptance estimates (``calibration``, a ``costs.Calibration``; default: the
    policy's own) say pay; None: always k. The policy reads only the draft side before each draw:
    every rule stays exactly as lossless (or as distorted) as without it.
    ``gamma``: the old name of ``k``, deprecated (it warns; ears_core/deprecated.py).
    ``device_round``: run each round on the device with one host read (decode/device_round.py): the same
    tokens and events for a fixed k; with a ``policy``, k is planned from earlier rounds before each round.
    """
    k = renamed_keyword(k, gamma, default=5, where="stream")
    rule = _checked_rule(rule)
    if draft is None:
        raise ValueError("a draft is required for speculative decoding; use autoregressive() for target-only decoding")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k (K, drafts per round at most) must be an integer >= 1, got {k!r}")
    drafter = draft if isinstance(draft, Drafter) else ModelDrafter(draft)
    if policy is not None and calibration is None:
        calibration = policy.new_calibration()
    shape = (DeviceChainShape if device_round else ChainShape)(k, policy, calibration)
    return _speculative(target, drafter, input_ids, rule, shape, rule.describe(), k, temperature=temperature,
                        top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed, tokenizer=tokenizer,
                        eos_token_id=eos_token_id, vocab_size=vocab_size, with_distortion=with_distortion,
                        deadline_s=deadline_s)


def generate(target: PreTrainedModel, draft: PreTrainedModel | Drafter, input_ids: Any, **kwargs: Any) -> GenerationResult:
    """Speculative decoding to the end; same arguments as ``stream`` (``k=``: drafts per round at most;
    ``gamma=``, its old name, warns). -> GenerationResult."""
    return stream(target, draft, input_ids, **kwargs).result()


def tree_stream(
    target: PreTrainedModel,
    drafter: PreTrainedModel | Drafter,
    input_ids: Any,
    *,
    rule: AcceptanceRule | None = None,
    budget: int = 8,
    depth: int = 4,
    width: int | None = None,
    siblings: str = "auto",
    temperature: float = 0.9,
    max_new_tokens: int = 128,
    seed: int = 0,
    top_k: int | None = None,
    top_p: float | None = None,
    tokenizer: Any | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    vocab_size: int | None = None,
    with_distortion: bool = True,
    keep: KeepFn | None = None,
    level: LevelFn | None = None,
    backoff: bool = False,
    deadline_s: float | None = None,
    device_round: bool = False,
) -> Generation:
    """Speculative decoding of one prompt with a tree of drafts per round; iterate for TokenEvents.

    ``drafter``: a Hugging Face causal LM sharing the target's tokenizer (wrapped in a ModelDrafter) or a
    drafter with ``propose_tree`` / ``commit_tree`` (ModelDrafter, EagleDrafter). budget / depth / width /
    siblings: the ``TreeSpec``; width=1 with budget = depth = K is the chain with k = K, token for
    token. ``keep(priority, nodes so far, depth)`` is asked before each node is drawn and ends the round's
    tree at the first False (a size policy from measured prices, ``tree_budget.TreeBudget``: it sees only
    what precedes the draw). ``level``: per-level acceptance estimates for ``keep`` (``trees.build_tree``;
    default: the keep hook's own ``level``, if it has one). ``backoff``: after a round the policy left
    empty, plain target steps for 1, 3, then 7 rounds (rounds.py). ``deadline_s``: stop after this many
    seconds of decoding, keeping the tokens so far. The rounds' trees are in ``Generation.trees``.
    ``device_round``: draft and decide each round on the device with one host read (decode/device_tree.py): a
    tree of a fixed shape (``fixed_trees.FixedTreeSpec.of(spec)``); with a ``keep`` policy (and ears-budget on a tree
    that branches), today's tree round (``DeviceTreeShape.takes``).
    """
    rule = _checked_rule(rule)
    spec = TreeSpec(budget, depth, width, siblings)
    if drafter is not None and not hasattr(drafter, "propose_tree") and isinstance(drafter, torch.nn.Module):
        drafter = ModelDrafter(drafter)
    if drafter is None or not hasattr(drafter, "propose_tree"):
        raise ValueError(f"tree decoding needs a draft model or a drafter with propose_tree(), got {type(drafter).__name__}")
    level = level if level is not None else getattr(keep, "level", None)  # a TreeBudget's own estimates
    on_device = device_round and DeviceTreeShape.takes(rule, spec, keep)
    shape = DeviceTreeShape(spec) if on_device else TreeShape(spec, keep, level, backoff)
    method = f"{rule.describe()} tree(budget={budget}, depth={depth}, width={width})"
    return _speculative(target, drafter, input_ids, rule, shape, method, budget, temperature=temperature,
                        top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed, tokenizer=tokenizer,
                        eos_token_id=eos_token_id, vocab_size=vocab_size, with_distortion=with_distortion,
                        deadline_s=deadline_s)


def tree_generate(target: PreTrainedModel, drafter: PreTrainedModel | Drafter, input_ids: Any,
                  **kwargs: Any) -> GenerationResult:
    """Tree decoding to the end; same arguments as ``tree_stream``. -> GenerationResult (the trees are in
    ``tree_stream(...).trees``; use that to keep them)."""
    return tree_stream(target, drafter, input_ids, **kwargs).result()


def autoregressive_stream(
    target: PreTrainedModel,
    input_ids: Any,
    *,
    temperature: float = 0.9,
    max_new_tokens: int = 128,
    seed: int = 0,
    top_k: int | None = None,
    top_p: float | None = None,
    tokenizer: Any | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    vocab_size: int | None = None,
    deadline_s: float | None = None,
) -> Generation:
    """Target-only decoding, one token per forward pass: the baseline, streamed. ``vocab_size``: the ids it
    may emit; default the target's scored vocabulary (a loaded pair's tokenizer, never a padding row)."""
    vocab = vocab_size if vocab_size is not None else scored_vocab(target)
    ids = as_input_ids(input_ids, target.device)
    check_request(target, ids, max_new_tokens, seed, vocab)
    cfg = DecodeConfig(SamplingConfig(temperature, top_k, top_p), max_new_tokens, seed, vocab,
                       eos_set(target, eos_token_id), False)
    steps: list[StepRecord] = []
    events = target_only_events(target, ids, cfg, steps, Detokenizer(tokenizer))
    return Generation("target-only", 0, steps, events, deadline_s, eos=cfg.eos)


def autoregressive(target: PreTrainedModel, input_ids: Any, **kwargs: Any) -> GenerationResult:
    """Target-only decoding to the end; same arguments as ``autoregressive_stream``."""
    return autoregressive_stream(target, input_ids, **kwargs).result()
