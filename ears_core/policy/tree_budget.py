"""The size of a round's tree from the cost model (issue 16): draft nodes while they pay.

Terms (prices V, d, o: costs.py; tree, node, slot priority: trees.py)
-----
estimate       P(node stands): the chance that a node and all its ancestors are accepted, from what
               is known before its draw: its slot priority pi (the product of draft probabilities
               along its path, the last factor being its rank's probability at its parent) and its
               depth d. With the drafter's ``Calibration`` c (confidence -> acceptance of one
               position) it is c(pi^(1/d))^d: the calibrated acceptance of a per-level confidence
               equal to the path's geometric mean, compounded over its d levels. Without one it is
               pi itself (what a calibrated draft's own probability of the path promises). With a
               ``DepthCalibration`` (one table per draft depth) level j reads table j:
               prod_j c_j(pi^(1/d)), so deep nodes are priced as the head's deep drafts stand.
               With a ``TreeCalibration`` the estimate is built level by level instead (the
               ``level`` hook of ``trees.build_tree``): prod over the path of c(p_j, j, rank_j),
               p_j the probability of the rank_j-th slot at level j, read from the rank-0 tables for
               a first child and from the siblings' own tables for a later one. A later sibling
               stands far less often than a first child at the same probability (docs/measurements.md),
               so without its own table the budget drafted siblings that did not pay.
E(N)           1 + the sum of the estimates of the round's N nodes: the tokens the round is
               expected to emit (at most one node per depth stands, so the accepted length is the
               number of nodes that stand, and its mean the sum of their chances).
T(N, D)        D d + V(N + 1) + o + N n: D draft passes (siblings share a pass, one per level: D
               is the tree's depth), the target pass over the root and N nodes, the round's
               overhead, and n per node: what a tree round costs beyond a chain's prices (the tree
               mask in both passes, ranking and drawing each node's slots, the walk over siblings; a
               few percent of a step per node on the embedded pair: docs/measurements.md).
               n is learnt from the rounds' own clocks (``observe_cost``: a running mean of the
               measured round time minus the chain's prices, per node). A chain of k drafts
               (N = D = k, n = 0) costs ``PriceCurve.round_ms(k)``.
value(N)       E(N) / T(N, D): expected tokens per millisecond. N = 0 is a plain target step.
stopping rule  ``TreeBudget(priority, nodes, depth)``, the ``keep`` hook of ``trees.build_tree``, is
               asked before node N + 1 is drawn, with p its estimate: the node is drawn iff some
               n in N + 1 .. budget beats value(N) when every node after it is also estimated at p
               and adds no depth. Nodes come best first, so p bounds the later estimates (closely:
               the expansion order is nearly best-first) and the rule never stops while more nodes
               could still pay. When the estimates do not grow and T is convex in N (no node costs
               less than the one before: no draft pass to amortise, a convex V) it stops at exactly
               the best N; otherwise it may draft a few nodes past it, never fewer than the best N
               (tests/test_tree_policy.py).
learning       ``observe_round(record)`` teaches the calibration from a finished round (a
               ``TreeRecord``): every node whose parent stood (or that hangs from the root) is one
               observation at its level confidence, its priority over its parent's score (the
               probability of its rank at the parent), stood or not. Scores come from the raw draft
               (T = 1) at every temperature, the units of the chain's confidence, so the shipped
               calibration of the chain starts the tree's off in the right units.
exactness      the rule reads the priority, the node count and the depth, all fixed before the draw,
               and prices and a calibration learnt from earlier rounds only. Like the chain's
               ``DraftPolicy`` it is a stopping rule: every acceptance rule stays exactly what it
               is without it (greedy stays the target's greedy output).
"""

from __future__ import annotations

from typing import Any, Sequence

from ears_core.policy.costs import Calibration, DepthCalibration, PriceCurve

__all__ = ["TreeBudget", "TreeCalibration", "node_estimate", "tree_round_ms"]


OUTLIER_FLOOR = 0.02  # observe_cost: a node's price is never learnt above 3x max(its price, this many steps)


class TreeCalibration:
    """Slot probability -> P(the node stands | its parent stood), per depth, with a first child
    (rank 0) and later siblings (rank >= 1) in tables of their own (module terms: estimate)."""

    def __init__(self, first: Calibration | DepthCalibration, siblings: Calibration | DepthCalibration) -> None:
        self.first, self.siblings = first, siblings
        self.prior_weight = min(first.prior_weight, siblings.prior_weight)

    def _table(self, rank: int) -> Calibration | DepthCalibration:
        return self.first if rank == 0 else self.siblings

    def level(self, conf: float, depth: int, rank: int) -> float:
        return min(max(self._table(rank)(conf, depth), 0.0), 1.0)

    def __call__(self, conf: float, depth: int = 1) -> float:  # a first child's, as a chain's table
        return self.level(conf, depth, 0)

    def observe(self, conf: float, stood: bool, depth: int = 1, rank: int = 0) -> None:
        self._table(rank).observe(conf, stood, depth=depth)

    def copy(self) -> "TreeCalibration":
        return TreeCalibration(self.first.copy(), self.siblings.copy())


def node_estimate(priority: float, depth: int, calibration: Calibration | DepthCalibration | None = None) -> float:
    """P(node stands) from its slot priority and depth (see the module's terms). With a
    ``DepthCalibration`` each level j = 1 .. d reads its own table: prod_j c_j(pi^(1/d))."""
    pi = min(max(float(priority), 0.0), 1.0)
    if calibration is None or depth < 1:
        return pi
    level = pi ** (1.0 / depth)
    if isinstance(calibration, DepthCalibration):
        out = 1.0
        for j in range(1, depth + 1):
            out *= min(max(calibration(level, j), 0.0), 1.0)
        return out
    return min(max(calibration(level), 0.0), 1.0) ** depth


def tree_round_ms(prices: PriceCurve, nodes: int, depth: int, node_ms: float = 0.0) -> float:
    """T(N, D) = D d + V(N + 1) + o + N n, in milliseconds."""
    return depth * prices.draft_ms + prices.verify(nodes + 1) + prices.overhead_ms + nodes * node_ms


class TreeBudget:
    """A round's tree size from the prices: the ``keep`` hook of ``tree_stream`` (module terms).

    prices: the price curve in force (a snapshot: a run's decisions do not change with timings
    taken during it); budget: the most nodes a round may draft; calibration: the drafter's
    confidence -> acceptance table (None: a node's estimate is its priority); node_ms: the price
    of a node beyond the chain's prices (module terms: T(N, D)), learnt further from each round
    (``observe_cost``). State per round: ``estimates`` of the nodes drafted so far (reset when a
    new tree starts, ``nodes == 0``)."""

    def __init__(self, prices: PriceCurve, budget: int,
                 calibration: Calibration | DepthCalibration | TreeCalibration | None = None,
                 node_ms: float = 0.0, alpha: float = 0.1) -> None:
        if not isinstance(budget, int) or budget < 1:
            raise ValueError(f"the tree budget (nodes per round at most) must be a whole number >= 1, got {budget!r}")
        if not isinstance(prices, PriceCurve):
            raise ValueError(f"prices must be a costs.PriceCurve (e.g. Session.prices), got {type(prices).__name__}")
        self.prices, self.budget, self.calibration = prices, budget, calibration
        self.estimates: list[float] = []  # this round's drafted nodes, in drawing order
        self.depth = 0  # the deepest level drafted this round
        self.rounds = 0  # rounds that asked (trees started)
        if not node_ms >= 0:
            raise ValueError(f"node_ms (a tree node's price beyond the chain's, ms) must be >= 0, got {node_ms!r}")
        self.node_ms, self.alpha, self.costed = float(node_ms), alpha, 0  # costed: rounds that taught node_ms
        # with a TreeCalibration, build_tree computes each slot's estimate level by level and asks
        # this hook with it (trees.build_tree: level); otherwise it is asked with the slot priority
        self.level = calibration.level if isinstance(calibration, TreeCalibration) else None

    def estimate(self, priority: float, depth: int) -> float:
        """P(node stands) from what the hook is asked with: the estimate itself when ``level`` is
        set (build_tree computed it), else from the slot priority (``node_estimate``)."""
        if self.level is not None:
            return min(max(float(priority), 0.0), 1.0)
        return node_estimate(priority, depth, self.calibration)

    def _pays(self, e_stop: float, nodes: int, depth: int, future: Sequence[tuple[float, int]]) -> bool:
        """Does some prefix of ``future`` ((estimate, depth) of the next nodes) beat stopping now?"""
        stop = e_stop / tree_round_ms(self.prices, nodes, depth, self.node_ms)
        e, deepest = e_stop, depth
        for n, (p, d) in enumerate(future, start=nodes + 1):
            e += p
            deepest = max(deepest, d)
            if e / tree_round_ms(self.prices, n, deepest, self.node_ms) > stop:
                return True
        return False

    def __call__(self, priority: float, nodes: int, depth: int) -> bool:
        """Draw node ``nodes + 1`` (slot ``priority`` at ``depth``)? Asked before its draw."""
        if nodes == 0:
            self.estimates, self.depth = [], 0
            self.rounds += 1
        if nodes >= self.budget:
            return False
        p = self.estimate(priority, depth)
        future = [(p, depth)] + [(p, 0)] * (self.budget - nodes - 1)  # later nodes: no better, no deeper
        if not self._pays(1.0 + sum(self.estimates), nodes, self.depth, future):
            return False
        self.estimates.append(p)
        self.depth = max(self.depth, depth)
        return True

    def observe_cost(self, nodes: int, depth: int, round_ms: float, verify_ms: float | None = None) -> None:
        """A finished round's measured time (drafting, the target pass and the round's work, ms)
        for a tree of ``nodes`` nodes and ``depth`` levels: node_ms moves toward (round_ms - T(N, D)
        at n = 0) / N, a running mean over the first 1 / alpha rounds, then an exponential one; one
        observation counts as at most 3x the current price (or 3x OUTLIER_FLOOR of a step).
        ``verify_ms``: the round's own target pass, measured; it then stands in for V(N + 1), so that
        a machine running slower than its profile (another job on the cores) is not read as a dear
        node: the prices are a snapshot, the pass is not."""
        if nodes <= 0 or not round_ms > 0:
            return
        if verify_ms is not None and verify_ms > 0:
            model = depth * self.prices.draft_ms + verify_ms + self.prices.overhead_ms
        else:
            model = tree_round_ms(self.prices, nodes, depth)
        extra = max((round_ms - model) / nodes, 0.0)
        # one slow round (a tree shape's first kernels, another job on the cores) moves it at most
        # to 3x its value: else a fresh process's first tree could price every later one out of drafting
        extra = min(extra, 3.0 * max(self.node_ms, OUTLIER_FLOOR * self.prices.step_ms))
        w = max(self.alpha, 1.0 / (self.costed + 1))
        self.node_ms = (1 - w) * self.node_ms + w * extra
        self.costed += 1

    def observe_round(self, record: Any) -> None:
        """Learn from a finished round's ``TreeRecord`` (module terms: learning)."""
        if self.calibration is None:
            return
        stood = set(record.path)
        for i, parent in enumerate(record.parents):  # at most ``budget`` nodes
            if parent >= 0 and parent not in stood:
                continue  # its parent fell: the node was never in question
            base = record.scores[parent] if parent >= 0 else 1.0
            conf = record.priorities[i] / base if base > 0 else 0.0
            if isinstance(self.calibration, TreeCalibration):
                self.calibration.observe(min(conf, 1.0), i in stood, depth=record.depths[i], rank=record.ranks[i])
            else:
                self.calibration.observe(min(conf, 1.0), i in stood, depth=record.depths[i])
