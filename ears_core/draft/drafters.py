"""Drafters: anything that proposes the next K tokens. The decode loop speaks only this protocol, so a draft
model, a head on the target's hidden states (``needs_target_hidden``) and n-gram lookup are interchangeable.

Terms
-----
pending tokens      committed tokens (the prompt and every token emitted) the drafter has not yet run through its
                    model: at least the last emitted token; after a round whose K drafts all stood, also x_K.
propose(k)          draw k tokens one after another from the drafter's own distribution (after the target's
                    sampling, ``probs_fn``) with the given uniforms: the tokens and those distributions.
commit(n, t)        the verifier kept the first n drafts and emitted t: roll the rest back.
free_positions      (optional) a position after the first costs no model step (n-gram lookup).
device confidence   (optional, ``device_confidence``) ``propose(..., confidences=True)`` keeps each position's
                    confidence as a (k',) tensor in ``confidence_t``, unread (decode/device_round.py reads it).
support             (optional) the (N,) token ids outside which the drafter's distributions are 0 (an EAGLE
                    head's ``vocab_ids``): verify() computes the distortion over those N tokens only.
"""

from __future__ import annotations

from itertools import takewhile
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

import torch
from torch import Tensor
from transformers import DynamicCache

from ears_core.draft.trees import DraftTree, ProbsFn, additive_mask, build_tree, draft_pass, node_rows
from ears_core.model.passes.kv_cache import keep_tail_positions, new_cache
from ears_core.sampling import sample_with_uniforms

if TYPE_CHECKING:  # annotations only: importing it loads transformers' modeling code (seconds)
    from transformers import PreTrainedModel

__all__ = ["Drafter", "ModelDrafter", "NGramDrafter", "draft_chain", "drawn", "model_vocab_size", "scored_vocab",
           "target_features"]

Keep = Callable[[float | None], bool]  # keep(confidence) before a draw; keep(None) before a later position's step
Draw = Callable[[Tensor], tuple[Tensor, Tensor]]  # uniforms (B,) -> probs (B, V'), the token drawn (B,)
Step = Callable[[int, list[Tensor]], tuple[Tensor | None, Draw]]  # (i, drafts so far) -> (confidence (), draw)


@runtime_checkable
class Drafter(Protocol):
    vocab_size: int
    needs_target_hidden: bool

    def prefill(self, input_ids: Tensor, target_hidden: Tensor | None) -> None:
        """input_ids (B, T): the prompt; target_hidden (B, T, d) or None."""

    def propose(self, k: int, probs_fn: ProbsFn, uniforms: Tensor, keep: Keep | None = None) -> tuple[Tensor, Tensor]:
        """uniforms (B, k) -> tokens (B, k') long, probs (B, k', V), k' <= k. ``keep(confidence)`` is asked
        BEFORE each draw with the drafter's mass on its top token there (kept in ``confidence``): it stops
        at the first False; ``keep(None)`` may be asked before a later position that costs a forward."""

    def commit(self, num_accepted: int, next_token: Tensor, target_hidden: Tensor | None) -> None:
        """Keep the first ``num_accepted`` proposals and append next_token (B,)."""


def target_features(out: object, drafter: object) -> Tensor | None:
    """The target's hidden states ``drafter.feature_layers`` (default (-1,): after the final norm) of a forward
    with output_hidden_states, side by side (B, T, n_layers * d); None for a drafter that reads none."""
    if not getattr(drafter, "needs_target_hidden", False):
        return None
    return layers_side_by_side(out.hidden_states, tuple(getattr(drafter, "feature_layers", (-1,))))


def layers_side_by_side(hidden_states: tuple[Tensor, ...], layers: tuple[int, ...]) -> Tensor:
    """hidden_states[i] for i in ``layers``, concatenated on the last axis: (B, T, len(layers) * d)."""
    return hidden_states[layers[0]] if len(layers) == 1 else torch.cat([hidden_states[i] for i in layers], dim=-1)


def model_vocab_size(model: PreTrainedModel) -> int:
    """Rows of the model's output head (may exceed the tokenizer's length by padding)."""
    head = model.get_output_embeddings()
    has_rows = head is not None and hasattr(head, "weight")
    return int(head.weight.shape[0]) if has_rows else int(model.config.get_text_config().vocab_size)


def scored_vocab(model: PreTrainedModel) -> int:
    """The ids a model scores: ``ears_vocab_size`` if ``load_pair`` set it (``len(tokenizer)``), else its head's rows."""
    known = getattr(model, "ears_vocab_size", None)
    return int(known) if known is not None else model_vocab_size(model)


def drawn(pr: Tensor, u: Tensor, ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """pr (B, V') and the token (B,) drawn from it with uniforms u (B,): ``ids[token]`` where pr is over ids (V',)."""
    tok = sample_with_uniforms(pr, u)  # (B,)
    return pr, tok if ids is None else ids[tok]


def draft_chain(drafter: Any, k: int, uniforms: Tensor, keep: Keep | None, step: Step, *, confidences: bool,
                batch: int, device: torch.device, ask_ahead: bool = False) -> tuple[Tensor, Tensor]:
    """``Drafter.propose`` around a chain drafter's ``step`` per position, ``keep(None)`` asked before a later step
    with ``ask_ahead``; sets the drafter's ``confidence`` and ``confidence_t`` (module terms: device confidence)."""
    drafter.confidence, confs, tokens, probs = [], [], [], []
    for i in range(k):
        if ask_ahead and i > 0 and keep is not None and not keep(None):  # an average draft here would not pay
            break
        conf_t, draw = step(i, tokens)
        if confidences:
            confs.append(conf_t.reshape(()))
        if keep is not None:
            conf = float(conf_t)  # one host read, before the draw
            if not keep(conf):
                break
            drafter.confidence.append(conf)
        pr, tok = draw(uniforms[:, i])  # (B, V'), (B,)
        tokens.append(tok)
        probs.append(pr)
    drafter.confidence_t = torch.stack(confs) if confs else None  # (k',): never read here
    if not tokens:
        return (torch.empty((batch, 0), dtype=torch.long, device=device),
                torch.empty((batch, 0, drafter.vocab_size), device=device))
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


class ModelDrafter:
    """A Hugging Face causal LM used as the draft, with its own KV cache and rollback."""

    needs_target_hidden = False
    device_confidence = True  # propose(confidences=True) records them on the device (module terms)

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None) -> None:
        self.model = model
        self.vocab_size = vocab_size if vocab_size is not None else scored_vocab(model)
        self.device = model.device
        self._cache: DynamicCache | None = None
        self._cache_len = 0  # tokens in the cache
        self._steps: Any = None  # a graphed model's captured draft step (draft/step_graphs.py), made once per model
        self._pending: Tensor | None = None  # (B, P) committed tokens not yet in the cache
        self._proposed: Tensor | None = None  # (B, k) the last proposal
        self._base = 0  # committed length when the last proposal started
        self._start = 0  # cache length when the last proposal started (pending begins there)
        self.confidence: list[float] = []
        self.confidence_t: Tensor | None = None  # (k',) the last proposal's confidences, with confidences=True

    @torch.inference_mode()
    def prefill(self, input_ids: Tensor, target_hidden: Tensor | None = None) -> None:
        from ears_core.draft.step_graphs import LMStepGraphs
        from ears_core.model.cuda.graphed import GraphedLM

        self._cache = new_cache(self.model)
        self._cache_len = 0
        graphed = isinstance(self.model, GraphedLM)
        self._steps = self.model.__dict__.get("step_graphs") if graphed else None
        if graphed and (self._steps is None or self._steps.vocab_size != self.vocab_size):
            self._steps = self.model.__dict__["step_graphs"] = LMStepGraphs(self.model, self.vocab_size)
        if input_ids.shape[1] > 1:
            self.model(input_ids[:, :-1], past_key_values=self._cache, use_cache=True, logits_to_keep=1)
            self._cache_len = input_ids.shape[1] - 1
        self._pending = input_ids[:, -1:]
        self._proposed = None

    @torch.inference_mode()
    def propose(self, k: int, probs_fn: ProbsFn, uniforms: Tensor, keep: Keep | None = None,
                confidences: bool = False) -> tuple[Tensor, Tensor]:
        assert self._pending is not None, "prefill() first"
        self._start = self._cache_len  # where the committed tokens not yet fed (pending) begin
        self._base = self._cache_len + self._pending.shape[1]
        scored = keep is not None or confidences  # the confidence is computed (and read only for keep)
        steps = self._steps if self._steps is not None and self._steps.usable(probs_fn) else None

        def step(i: int, drafts: list[Tensor]) -> tuple[Tensor | None, Draw]:
            inp = drafts[-1].unsqueeze(-1) if drafts else self._pending  # (B, P) pending, then (B, 1) the last draft
            self._cache_len += inp.shape[1]
            if steps is not None and inp.shape[1] == 1:  # the whole step as one captured graph (draft/step_graphs.py)
                conf_t, pr, tok = steps.step(self._cache, inp[:, 0], uniforms[:, i], probs_fn)
                return conf_t, lambda u: (pr, tok)
            logits = self.model(inp, past_key_values=self._cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            conf_t = (torch.softmax(logits[:, : self.vocab_size].float(), dim=-1).max(dim=-1).values.mean()
                      if scored else None)  # at T = 1
            return conf_t, lambda u: drawn(probs_fn(logits), u)  # (B, V)

        self._proposed, probs = draft_chain(self, k, uniforms, keep, step, confidences=confidences,
                                            batch=self._pending.shape[0], device=self.device)
        return self._proposed, probs  # (B, k'), (B, k', V); the last draft is not fed

    def commit(self, num_accepted: int, next_token: Tensor, target_hidden: Tensor | None = None) -> None:
        """The committed tokens from ``_start`` on are pending + the n drafts that stood + next;
        the cache keeps those it already holds (at most base + n) and the rest become pending."""
        assert self._proposed is not None and self._pending is not None, "propose() first"
        nxt = next_token.reshape(-1, 1)  # (B, 1)
        tail = torch.cat([self._pending, self._proposed[:, :num_accepted], nxt], dim=1)  # (B, P + n + 1)
        keep = min(self._cache_len, self._base + num_accepted)
        if self._cache_len > keep:
            self._cache.crop(keep - self._cache_len)  # transformers 5: negative = drop the last n
            self._cache_len = keep
        self._pending = tail[:, keep - self._start :]
        self._proposed = None

    # ------------------------------------------------------------------ trees (seed 002, trees.py)
    @torch.inference_mode()
    def propose_tree(self, spec: Any, probs_fn: ProbsFn, draws: Any, *, build: Any = None, **options: Any
                     ) -> DraftTree:
        """Draft a tree for the next round, batch 1 (trees.py: tree pass): ``build`` (default ``trees.build_tree``, or
        one with its signature: ``fixed_trees.build_fixed_tree``) given its keywords ``options`` (greedy, ...)."""
        assert self._pending is not None, "prefill() first"
        self._base = self._cache_len + self._pending.shape[1]
        self._tree_slots: list[int] = []  # tree nodes in the draft's cache, in cache order
        if spec.depth == 0:
            self._tree = DraftTree.empty(self.vocab_size, self.device)
            return self._tree
        logits = self.model(self._pending, past_key_values=self._cache, use_cache=True, logits_to_keep=1).logits
        self._cache_len = self._base

        def expand(ids: list[int], tree: DraftTree) -> Tensor:
            seen, pos = draft_pass(tree, ids, self._tree_slots, self._base, self.device)
            mask = None if seen is None else additive_mask(seen, self.model.dtype)  # (1, 1, m, base + slots + m)
            out = self.model(node_rows(tree.tokens, ids)[None], attention_mask=mask,
                             position_ids=None if pos is None else pos[None], past_key_values=self._cache, use_cache=True)
            self._tree_slots.extend(ids)
            return out.logits[0]  # (m, V_model)

        self._tree = (build or build_tree)(logits[0, -1], expand, spec, probs_fn, draws, **options)
        return self._tree

    @torch.inference_mode()
    def commit_tree(self, path: list[int], next_token: Tensor, target_hidden: Tensor | None = None,
                    nodes: Tensor | None = None) -> None:
        """The verifier kept nodes ``path`` (root first) and emitted next_token: keep their cache
        entries in order (the draft ran every path node except perhaps the last), drop the rest.
        ``nodes``: the path as a (n,) long tensor on the device, where the caller has one (no tensor made from
        the list where the tree's nodes ran in node order, as a fixed tree's do)."""
        nxt = next_token.reshape(1, 1)
        if not self._tree_slots and self._cache_len < self._base:  # nothing was run this round
            self._pending = torch.cat([self._pending, nxt], dim=1)
            return
        slot = {node: i for i, node in enumerate(self._tree_slots)}
        fed = [a for a in path if a in slot]  # a prefix of the path
        in_order = nodes is not None and self._tree_slots == list(range(len(self._tree_slots)))  # slot = node
        if self._tree_slots:  # a path's slots ascend (a node runs after its parent): the tail moves in place
            keep = (nodes[: len(fed)] + self._base if in_order else
                    torch.tensor([self._base + slot[a] for a in fed], dtype=torch.long, device=self.device))
            keep_tail_positions(self._cache, self._base, keep)
        self._cache_len = self._base + len(fed)
        tail = (self._tree.tokens.index_select(0, nodes[len(fed):]) if nodes is not None
                else self._tree.tokens[path[len(fed):]]).reshape(1, -1)  # (1, P-1) path nodes not yet run
        self._pending = torch.cat([tail, nxt], dim=1)
        self._tree_slots = []


def ngram_lookup(seq: list[int], k: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int]:
    """Prompt lookup's rule: (up to k tokens that followed the latest earlier occurrence of the longest
    tail of ``seq`` of ``max_ngram`` down to ``min_ngram`` tokens, that tail's length n); ([], 0) if none."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        tail = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):  # latest match first
            if seq[start : start + n] == tail:
                return seq[start + n : start + n + k], n
    return [], 0


class NGramDrafter:
    """Prompt lookup (``ngram_lookup``), batch 1: a deterministic proposal, so q is one-hot. Where nothing matches
    it proposes nothing, and the round is a plain target step."""

    needs_target_hidden = False
    free_positions = True  # a later position costs no model step (see ``Drafter``)

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._seq: list[int] = []
        self._proposed: list[int] = []
        self._device = torch.device("cpu")
        self.confidence: list[float] = []

    def prefill(self, input_ids: Tensor, target_hidden: Tensor | None = None) -> None:
        if input_ids.shape[0] != 1:
            raise ValueError("NGramDrafter drafts for one sequence at a time")
        self._seq = input_ids[0].tolist()
        self._device = input_ids.device

    def propose(self, k: int, probs_fn: ProbsFn, uniforms: Tensor, keep: Keep | None = None) -> tuple[Tensor, Tensor]:
        """The continuation of the longest matching n-gram; each token's confidence n / max_ngram (known before)."""
        found, n = ngram_lookup(self._seq, k, self.max_ngram, self.min_ngram)
        conf = n / self.max_ngram * 0.999
        if keep is not None:
            found = list(takewhile(lambda _: keep(conf), found))  # up to the first False
        self.confidence = [conf] * len(found)  # known without a model step: the device round learns from it too
        self._proposed = found
        tokens = torch.tensor([self._proposed], dtype=torch.long, device=self._device).reshape(1, -1)
        probs = torch.zeros((1, tokens.shape[1], self.vocab_size), device=self._device)  # (1, k', V) one-hot
        return tokens, probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)

    def commit(self, num_accepted: int, next_token: Tensor, target_hidden: Tensor | None = None) -> None:
        self._seq += self._proposed[:num_accepted] + [int(next_token.reshape(-1)[0])]
        self._proposed = []
