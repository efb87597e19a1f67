"""What the app, the CLI and the bench share: a run's settings, one pair's runs and their timing.

Terms
-----
RunConfig   one request's settings: rule name and its parameters (from the registry in
            ``rules``), temperature, K, length, seed, top-k / top-p. ``validate()`` refuses bad
            values with a message naming the fix; ``rule_and_temperature()`` builds the rule
            (T = 0 or the greedy rule: GreedyRule at T = 0, the target's own greedy output).
Session     a loaded ``ModelPair`` and what runs on it: ``speculative()`` and ``baseline()``
            return ``Generation`` objects (decode/generation.py) (a fresh drafter per generation, the decode
            clock, an optional deadline); clean target-only baselines are cached per request.
contended   a run that overlapped another decode (serve/runs.py): labelled, its baseline never cached.
policy      how many drafts each round sends (policy/costs.py: ``DraftPolicy``): from this machine's price
            curve (measured once per model, device, dtype and threads, cached, and kept current
            from every finished run; never measured inside a request: serve/prices.py) and a
            confidence calibration per rule and temperature (also learnt from the runs).
            ``RunConfig.draft_length`` "policy" (default), "fixed" (always K) or "threshold" (stop
            when the draft's confidence falls below 0.35).
shape       ``RunConfig.draft_shape``: "chain", "tree" or "auto" (the default). ``Session.resolved()``
            makes "auto" concrete: a tree when the draft length is "policy", the drafter can branch (a
            head or a draft model; not n-gram lookup), the rule is lossless and a ratio rule (greedy
            at T = 0, the ordinary rule or EARS at beta 0 at T > 0; a lossy rule keeps a chain) and a
            wide verify pass is cheap on this machine: V(5) <= 1.3 steps on the session's price curve
            (``TREE_WIDTH_M``, ``TREE_MAX_STEPS``), never on CUDA (a tree round's host syncs cost more
            there than its nodes bring: docs/gpu.md); else a chain. docs/benchmarks.md gives the
            measurements this rule follows.
tree        ``RunConfig.draft_shape`` "tree": each round verifies a tree of drafts (decode/)
            of depth K at most and ``tree_budget`` nodes: at most, sized each round by the cost model
            (policy/tree_budget.py: ``TreeBudget``, draft length "policy"), or exactly ("fixed"). Its calibration
            is learnt apart from the chain's (per rule and temperature); its rounds teach the running
            prices the verify price only (a tree's draft passes are per level, not per node).

The summary table and the run record of a finished run are serve/summary.py.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import InitVar, dataclass, field, replace
from typing import Any, Sequence

import torch

from ears_core.policy.costs import Calibration, DepthCalibration, DraftPolicy, PriceCurve, describe
from ears_core.decode.api import tree_stream
from ears_core.policy.tree_budget import TreeBudget, TreeCalibration
from ears_core.decode.api import autoregressive_stream, stream
from ears_core.decode.generation import Generation
from ears_core.deprecated import renamed_keyword
from ears_core.metrics import GenerationStats
from ears_core.model.loading.hub import describe_device
from ears_core.pair import ModelPair
from ears_core.threads import in_passing_thread
from ears_core.rules import BETA, AcceptanceRule, GreedyRule, is_ratio_rule, make_rule, rule_spec
from ears_core.serve.prices import ON_PATH, STALE, SessionPrices
from ears_core.serve.runs import ACTIVITY, ActivityLog, Background, Tracked

__all__ = ["RunConfig", "Session", "Background", "Tracked", "ActivityLog", "DRAFT_LENGTHS", "DRAFT_SHAPES", "MAX_K",
           "MAX_TREE_NODES", "STALE"]

DRAFT_LENGTHS = ("policy", "fixed", "threshold")
DRAFT_SHAPES = ("auto", "chain", "tree")
TREE_WIDTH_M, TREE_MAX_STEPS = 5, 1.3  # "auto" drafts a tree only where V(5) <= 1.3 steps (module terms: shape)
MAX_TREE_NODES = 16  # a tree's nodes per round at most: the app's slider, the CLI and RunConfig read it
THRESHOLD = 0.35  # the old fixed confidence threshold, now checked before each draw
MAX_K = 8  # K (drafts per round, a tree's depth) at most: the app's slider and checks, the CLI and RunConfig read it
TREE_NODE_STEPS = 0.035  # a tree node's price beyond the chain's, in target steps, before any tree round (policy/tree_budget.py)
DRIFT_MEMORY = 64.0  # verified drafts per depth the shipped calibration's drift ratio follows (costs.DepthCalibration)


@dataclass
class RunConfig:
    """One request's settings; ``params`` holds the rule's parameters by name (e.g. beta)."""

    rule: str = "ears"
    params: dict[str, float] = field(default_factory=lambda: {"beta": 0.1})
    temperature: float = 0.9
    k: int = 4  # K: drafts per round at most
    max_new_tokens: int = 96
    seed: int = 0
    top_k: int | None = None
    top_p: float | None = None
    draft_length: str = "policy"  # "policy": the measured cost model; "fixed": always K; "threshold"
    draft_shape: str = "auto"  # "chain": K drafts in a row; "tree": a tree of depth K; "auto": see the terms
    tree_budget: int = 8  # a tree's nodes per round: at most (policy) or exactly (fixed)
    tree_width: int | None = None  # a tree node's children at most (None: as many as the budget allows)
    device_round: bool = False  # rounds decided on the device, one host read a round: a chain's (decode/device_round.py),
    # a tree's with draft length "fixed" (decode/device_tree.py; with the policy, today's tree round)
    gamma: InitVar[int | None] = None  # the old name of k: deprecated, warns (ears_core/deprecated.py)

    def __post_init__(self, gamma: int | None) -> None:
        self.k = renamed_keyword(self.k, gamma, default=4, where="RunConfig")

    def validate(self) -> "RunConfig":
        rule_spec(self.rule)  # unknown name: a ValueError listing the registered rules
        if self.draft_length not in DRAFT_LENGTHS:
            raise ValueError(f"draft length must be one of {', '.join(DRAFT_LENGTHS)}, got {self.draft_length!r}")
        if self.draft_shape not in DRAFT_SHAPES:
            raise ValueError(f"draft shape must be one of {', '.join(DRAFT_SHAPES)}, got {self.draft_shape!r}")
        if self.draft_shape == "tree" or (self.draft_shape == "auto" and self.draft_length == "policy"):
            if isinstance(self.tree_budget, bool) or not isinstance(self.tree_budget, int) or \
                    not 1 <= self.tree_budget <= MAX_TREE_NODES:
                raise ValueError(f"the tree budget (nodes per round) must be a whole number from 1 to {MAX_TREE_NODES}, "
                                 f"got {self.tree_budget!r}")
            if self.tree_width is not None and (not isinstance(self.tree_width, int) or self.tree_width < 1):
                raise ValueError(f"the tree width (children per node) must be a whole number >= 1 or None (no "
                                 f"limit), got {self.tree_width!r}")
            if self.draft_length == "threshold" and self.draft_shape == "tree":
                raise ValueError("the threshold draft length is for chains: with a tree choose policy (the cost "
                                 "model sizes each round's tree) or fixed (tree_budget nodes every round)")
        for name, value in self.params.items():
            if value is None or value != value:
                raise ValueError(f"the rule parameter {name} must be a number, got {value!r}")
        if self.params.get("beta") is not None and self.params["beta"] < BETA.low:
            raise ValueError(f"beta must be >= {BETA.low:g} (0 is the ordinary lossless rule), got {self.params['beta']!r}")
        if self.temperature is None or self.temperature != self.temperature or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy decoding), got {self.temperature!r}")
        if not isinstance(self.k, int) or not 1 <= self.k <= MAX_K:
            raise ValueError(f"K (drafts per round) must be a whole number from 1 to {MAX_K}, got {self.k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max new tokens must be a whole number >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a whole number >= 0, got {self.seed!r}")
        return self

    def rule_and_temperature(self) -> tuple[AcceptanceRule, float]:
        """The rule to verify with and the temperature to decode at: T = 0 or the greedy rule both
        mean GreedyRule at T = 0."""
        rule = make_rule(self.rule, **self.params)
        if isinstance(rule, GreedyRule) or self.temperature == 0:
            return GreedyRule(), 0.0
        return rule, float(self.temperature)

    def sampling_kwargs(self, temperature: float) -> dict[str, Any]:
        return dict(temperature=temperature, max_new_tokens=self.max_new_tokens, seed=self.seed,
                    top_k=self.top_k, top_p=self.top_p)


class Session:
    """One loaded pair and the runs made on it (see the module's terms).

    prices: this machine's price curve for the target (``pricing``, serve/prices.py: read or
    measured on first use, then kept current from every finished speculative run, and with
    ``background_prices`` measured again between requests); calibrations: drafter confidence ->
    acceptance, one per (rule, temperature), learnt from the runs."""

    def __init__(self, pair: ModelPair, activity: ActivityLog | None = None, prices: PriceCurve | None = None,
                 cache_dir: str | os.PathLike | None = None, background_prices: bool = False) -> None:
        self.pair = pair
        self.activity = activity or ACTIVITY
        self._baselines: dict[tuple, GenerationStats] = {}
        self._calibrations: dict[tuple, Calibration] = {}  # (rule, temperature[, "tree"]) -> calibration
        self._node_ms: dict[tuple, float] = {}  # (rule, temperature, "tree") -> a tree node's price, learnt
        self.pricing = SessionPrices(pair, self.activity, max_m=MAX_K + 1, prices=prices, cache_dir=cache_dir,
                                     background=background_prices)
        self._lock = threading.Lock()
        self._can_branch: bool | None = None  # the drafter has propose_tree (asked once)

    def encode(self, prompt: Any, chat: bool = True) -> torch.Tensor:
        ids = self.pair.encode(prompt, chat=chat)  # (1, T)
        limit = getattr(self.pair.target.config, "max_position_embeddings", None)
        if limit is not None and ids.shape[1] >= limit:
            raise ValueError(f"the prompt is {ids.shape[1]} tokens long and the target's context holds {limit}: "
                             "shorten the prompt")
        return ids

    @property
    def device_label(self) -> str:
        """Where the target runs, for people: e.g. 'cpu (float32)' (``models.describe_device``)."""
        return describe_device(self.pair.target)

    def _common(self) -> dict[str, Any]:
        return dict(tokenizer=self.pair.tokenizer, vocab_size=self.pair.vocab_size)

    @property
    def prices(self) -> PriceCurve:
        """The price curve in force (read or measured on first use only: serve/prices.py)."""
        return self.pricing.curve

    def close(self) -> None:
        """Stop measuring in the background (the session is dropped: a pair switched out)."""
        self.pricing.close()

    def warm_up(self, tokens: int = 12, strict: bool = False) -> None:
        """Make sure of a price curve and run one short speculative generation with K = 2: the first
        kernels run, and the draft step and per-round overhead are measured. Where the drafter can
        branch, one short tree of fixed size follows, learnt from by nothing (its first passes with
        a tree mask are slow, and would teach the tree budget a node price that stops it drafting); not
        on CUDA, where shape "auto" never picks a tree (``wide_passes_are_cheap``).
        A cached curve can be hours old, and a machine's curve moves (docs/measurements.md, price
        curves), so unless the caller gave one it is measured again: now, before the decodes, or
        with ``background_prices`` between requests, after them (the warm-up then only reads the
        cached profile). On busy cores a spoilt measurement keeps the default in force, listed in
        ``provisional``; ``strict=True`` raises ``timing.MachineBusy`` instead."""
        in_passing_thread(self._warm_up, tokens, strict)  # leaves no OpenMP pool in the caller (passing.py)

    def _warm_up(self, tokens: int, strict: bool) -> None:
        self.pricing.before_warm_up(strict)
        if self.pair.draft is not None:
            self._warm_up_decodes(tokens)
        self.pricing.after_warm_up()

    def _warm_up_decodes(self, tokens: int) -> None:
        ids = self.encode("Say hello in one short sentence.")
        run = self.speculative(ids, RunConfig(rule="standard", params={}, k=2, max_new_tokens=tokens,
                                              draft_length="fixed", draft_shape="chain"))
        for _ in run:
            pass
        if self.can_branch and self.pair.device.type != "cuda":  # shape "auto" never picks a tree on CUDA
            cfg = RunConfig(rule="greedy", params={}, temperature=0.0, max_new_tokens=tokens, draft_length="fixed",
                            draft_shape="tree")
            for _ in self._tree_run(ids, cfg, *cfg.rule_and_temperature(), None).gen:  # .gen: not absorbed
                pass

    @property
    def provisional(self) -> list[str]:  # defaults in force until measured on quiet cores (serve/prices.py)
        return self.pricing.provisional

    def profile_text(self) -> str:
        """The price curve in force, and the draft head's measured dtype and kernels if it has them."""
        choice = getattr(self.pair.draft, "kernel_choice", None)  # head_kernels.HeadChoice or None
        pending = self.provisional
        return describe(self.prices) + (f"; draft head in {choice.variant.label}" if choice is not None else "") + (
            f"; provisional until measured on quiet cores: {', '.join(pending)}" if pending else "")

    def policy_for(self, rule: AcceptanceRule, temperature: float, k: int | None = None, draft_length: str = "policy",
                   *, gamma: int | None = None) -> dict[str, Any]:
        """``stream`` keyword arguments for a draft-length mode: a policy on a snapshot of the
        prices (a run's decisions do not change with timings taken during it) and a copy of the
        calibration for (rule, temperature). ``k``: drafts per round at most (``gamma``: its old name,
        deprecated)."""
        k = renamed_keyword(k, gamma, default=None, where="Session.policy_for")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"policy_for needs k (drafts per round at most) as an integer >= 1, got {k!r}")
        if draft_length == "fixed":
            return {}
        curve = self.prices
        if draft_length == "threshold":  # raw confidence: 100 bins, a prior no run can move
            calib = Calibration(bins=100, prior_weight=1e12)
        else:
            calib = self._calibration((rule.describe(), temperature), temperature)
        policy = DraftPolicy(PriceCurve(list(curve.verify_ms), curve.draft_ms, curve.overhead_ms, curve.key,
                                        curve.measured_at), k,
                             threshold=THRESHOLD if draft_length == "threshold" else None)
        return dict(policy=policy, calibration=calib)

    def _calibration(self, key: tuple, temperature: float, tree: bool = False) -> Any:
        """A copy of the calibration for ``key`` (made from the shipped one on first use)."""
        with self._lock:
            if key not in self._calibrations:
                self._calibrations[key] = self._initial_calibration(temperature, tree=tree)
            return self._calibrations[key].copy()

    def tree_policy_for(self, rule: AcceptanceRule, temperature: float, budget: int, draft_length: str
                        ) -> dict[str, Any]:
        """``tree_stream`` keyword arguments for a tree's draft length: "policy" sizes each round's
        tree from a snapshot of the prices and a copy of the tree calibration for (rule,
        temperature), backing off after empty probes; "fixed" drafts ``budget`` nodes every round."""
        if draft_length == "fixed":
            return {}
        c = self.prices
        snapshot = PriceCurve(list(c.verify_ms), c.draft_ms, c.overhead_ms, c.key, c.measured_at)
        key = (rule.describe(), temperature, "tree")
        calib = self._calibration(key, temperature, tree=True)
        with self._lock:
            node_ms = self._node_ms.get(key, TREE_NODE_STEPS * c.step_ms)
        return dict(keep=TreeBudget(snapshot, budget, calib, node_ms=node_ms), backoff=True)

    def _initial_calibration(self, temperature: float, by_depth: bool = True, tree: bool = False) -> Any:
        """What the policy assumes before a run of this pair: the drafter's shipped calibration
        (counts per confidence bin measured on held-out prompts, ``calibration_table``: "greedy"
        for T = 0, "sampled" otherwise; per draft depth when the table has "depths", for the chain's
        policy and the tree budget alike) when it has one, else the prior (acceptance = confidence).
        ``tree``: a ``TreeCalibration``, with the table's "siblings" (later children of a tree node,
        per depth) beside it, or the prior for them."""
        table = getattr(self.pair.draft, "calibration_table", None) or {}
        counts = table.get("greedy" if temperature == 0 else "sampled")
        if tree:
            first = self._initial_calibration(temperature, by_depth)
            sib = (counts or {}).get("siblings") or {}
            if sib.get("bins") == Calibration().bins and sib.get("depths"):
                return TreeCalibration(first, _depth_tables(sib["depths"]))
            return TreeCalibration(first, Calibration())
        if not counts or counts.get("bins") != Calibration().bins:
            return Calibration()
        if by_depth and counts.get("depths"):
            return _depth_tables(counts["depths"])
        return Calibration(stood=list(counts["stood"]), seen=list(counts["seen"]))

    def absorb(self, gen: Generation, rule: AcceptanceRule, temperature: float, calibration: Any = None,
               shape: str = "chain", timed: bool = True) -> None:
        """Fold a finished run into the session: its rounds' timings into the running prices where they are
        this machine's (``timed``: neither crowded nor contended, serve/runs.py; a tree's: the verify pass only;
        a stale curve is folded in, never measured here: serve/prices.py), its calibration (learnt during the
        run) into the one for (rule, temperature) and its draft shape."""
        tree = shape == "tree"
        if timed:
            self.pricing.observe(gen.steps, tree)
        with self._lock:
            if calibration is not None and calibration.prior_weight < 1e9:
                self._calibrations[(rule.describe(), temperature, *(("tree",) if tree else ()))] = calibration

    @property
    def can_branch(self) -> bool:
        """Whether this pair's drafter can draft a tree (it has a distribution to branch from)."""
        if self._can_branch is None:
            self._can_branch = self.pair.draft is not None and hasattr(self.pair.new_drafter(), "propose_tree")
        return self._can_branch

    def resolved(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with a concrete draft shape: "auto" becomes a tree when the draft length is
        "policy", the drafter can branch and the rule is a lossless ratio rule (greedy at T = 0, the
        ordinary rule at T > 0), else a chain (module terms). So the tree never judges a rule
        another way than a chain would (FLy or the distortion budget at T > 0 would be)."""
        if cfg.validate().draft_shape != "auto":
            return cfg
        rule, temperature = cfg.rule_and_temperature()
        lossless_ratio = rule.lossless and is_ratio_rule(rule)  # the ordinary rule (or EARS at beta = 0)
        tree = (temperature == 0 or lossless_ratio) and cfg.draft_length == "policy" and self.can_branch
        return replace(cfg, draft_shape="tree" if tree and self.wide_passes_are_cheap() else "chain")

    def wide_passes_are_cheap(self) -> bool:
        """Whether a verify pass over ``TREE_WIDTH_M`` tokens costs at most ``TREE_MAX_STEPS`` target
        steps on this machine (module terms: shape): what a tree's extra nodes need to pay."""
        if self.pair.device.type == "cuda":  # a tree round builds and walks its tree on the host: on a GPU it
            return False  # makes tens of host syncs a round and lost to the chain where measured (docs/gpu.md)
        return self.prices.steps(TREE_WIDTH_M) <= TREE_MAX_STEPS

    def speculative(self, ids: torch.Tensor, cfg: RunConfig, deadline_s: float | None = None,
                    since: float | None = None) -> Tracked:
        """The speculative run of ``cfg`` on ``ids`` with a fresh drafter and the draft-length
        policy of ``cfg.draft_length`` (iterate it, or run it in ``Background``). A draft shape of
        "auto" is resolved first (``resolved``): front ends resolve it themselves to label the run.
        ``since``: when the request began (``time.perf_counter()``; default now), where the run's
        wall clock starts; a first-use price measurement since then is labelled in its ``waits``."""
        since = time.perf_counter() if since is None else since
        cfg = self.resolved(cfg)
        rule, temperature = cfg.rule_and_temperature()
        if cfg.draft_shape == "tree":
            return self._since(self._tree_run(ids, cfg, rule, temperature, deadline_s), since)
        extra = self.policy_for(rule, temperature, cfg.k, cfg.draft_length)
        gen = stream(self.pair.target, self.pair.new_drafter(), ids, rule=rule, k=cfg.k, device_round=cfg.device_round,
                     deadline_s=deadline_s, **cfg.sampling_kwargs(temperature), **self._common(), **extra)
        run = Tracked(gen, self.activity, lambda g, timed: self.absorb(g, rule, temperature, extra.get("calibration"),
                                                                       timed=timed), self.pair.device)
        return self._since(run, since)

    def _since(self, run: Tracked, since: float) -> Tracked:
        """``run`` with its wall clock started at ``since``, and a price measurement on its path labelled."""
        run.gen.started_at = min(since, run.gen.started_at)
        on_path = self.pricing.on_path(since)
        if on_path > 0:
            run.gen.waits[ON_PATH] = on_path
        return run

    def _tree_run(self, ids: torch.Tensor, cfg: RunConfig, rule: AcceptanceRule, temperature: float,
                  deadline_s: float | None) -> Tracked:
        drafter = self.pair.new_drafter()
        if not hasattr(drafter, "propose_tree"):
            raise ValueError(f"the draft {getattr(self.pair, 'draft_spec', None) or type(drafter).__name__} cannot "
                             "draft a tree (it has no distribution to branch from): choose the chain draft shape, "
                             "or a draft model or head")
        extra = self.tree_policy_for(rule, temperature, cfg.tree_budget, cfg.draft_length)
        gen = tree_stream(self.pair.target, drafter, ids, rule=rule, budget=cfg.tree_budget, depth=cfg.k,
                          width=cfg.tree_width, deadline_s=deadline_s, device_round=cfg.device_round,
                          **cfg.sampling_kwargs(temperature),
                          **self._common(), **extra)
        budget = extra.get("keep")
        calib = budget.calibration if budget is not None else None

        def absorb(g: Generation, timed: bool) -> None:
            self.absorb(g, rule, temperature, calib, shape="tree", timed=timed)
            if timed and budget is not None and budget.costed:
                with self._lock:
                    self._node_ms[(rule.describe(), temperature, "tree")] = budget.node_ms
        return Tracked(gen, self.activity, absorb, self.pair.device)

    def baseline(self, ids: torch.Tensor, cfg: RunConfig, deadline_s: float | None = None) -> Tracked:
        """Target-only decoding of the same request (same temperature, seed, length)."""
        _, temperature = cfg.validate().rule_and_temperature()
        gen = autoregressive_stream(self.pair.target, ids, deadline_s=deadline_s,
                                    **cfg.sampling_kwargs(temperature), **self._common())
        return Tracked(gen, self.activity, device=self.pair.device)

    def _key(self, ids: torch.Tensor, cfg: RunConfig) -> tuple:
        _, temperature = cfg.rule_and_temperature()
        return (self.pair.name, tuple(ids[0].tolist()), temperature, cfg.seed, cfg.max_new_tokens, cfg.top_k, cfg.top_p)

    def cached_baseline(self, ids: torch.Tensor, cfg: RunConfig) -> GenerationStats | None:
        with self._lock:
            return self._baselines.get(self._key(ids, cfg))

    def remember_baseline(self, ids: torch.Tensor, cfg: RunConfig, run: Tracked | Background) -> bool:
        """Cache a finished baseline unless it overlapped another decode or was cut by a deadline.
        Returns whether it was cached."""
        if run.contended or run.gen.timed_out:
            return False
        with self._lock:
            self._baselines[self._key(ids, cfg)] = run.gen.stats()
        return True

    def clear(self) -> None:
        with self._lock:
            self._baselines.clear()


def _depth_tables(entries: Sequence[dict[str, Any]]) -> DepthCalibration:
    """A ``DepthCalibration`` from a shipped table's per-depth counts ([{"stood", "seen"}, ...])."""
    return DepthCalibration([Calibration(stood=list(d["stood"]), seen=list(d["seen"]))
                             for d in entries], drift_memory=DRIFT_MEMORY)
