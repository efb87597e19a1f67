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
E(N)           1 + the sum of the estimates of the round's N nodes: the tokens the round is
               expected to emit (at most one node per depth stands, so the accepted length is the
               number of nodes that stand, and its mean the sum of their chances).
T(N, D)        D d + V(N + 1) + o: D draft passes (siblings share a pass, one per level: D is the
               tree's depth), the target pass over the root and N nodes, the round's overhead. A
               chain of k drafts (N = D = k) costs ``PriceCurve.round_ms(k)``.
value(N)       E(N) / T(N, D): expected tokens per millisecond. N = 0 is a plain target step.
stopping rule  ``TreeBudget(priority, nodes, depth)``, the ``keep`` hook of ``trees.build_tree``, is
               asked before node N + 1 is drawn, with p its estimate: the node is drawn iff some
               n in N + 1 .. budget beats value(N) when every node after it is also estimated at p
               and adds no depth. Nodes come best first, so p bounds the later estimates (closely:
               the expansion order is nearly best-first) and the rule never stops while more nodes
               could still pay. When the estimates do not grow and T is convex in N (no node costs
               less than the one before: no draft pass to amortise, a convex V) it stops at exactly
               the best N; otherwise it may draft a few nodes past it. ``choose`` (every estimate
               known) finds the best N on any curve.
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

from .costs import Calibration, DepthCalibration, PriceCurve

__all__ = ["TreeBudget", "node_estimate", "tree_round_ms", "tree_value"]


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


def tree_round_ms(prices: PriceCurve, nodes: int, depth: int) -> float:
    """T(N, D) = D d + V(N + 1) + o, in milliseconds."""
    return depth * prices.draft_ms + prices.verify(nodes + 1) + prices.overhead_ms


def tree_value(estimates: Sequence[float], depths: Sequence[int], prices: PriceCurve) -> list[float]:
    """[value(0), ..., value(N)] for nodes with these estimates and depths, in their drawing order."""
    out, e, deepest = [1.0 / tree_round_ms(prices, 0, 0)], 1.0, 0
    for n, (p, d) in enumerate(zip(estimates, depths), start=1):
        e += p
        deepest = max(deepest, d)
        out.append(e / tree_round_ms(prices, n, deepest))
    return out


class TreeBudget:
    """A round's tree size from the prices: the ``keep`` hook of ``tree_stream`` (module terms).

    prices: the price curve in force (a snapshot: a run's decisions do not change with timings
    taken during it); budget: the most nodes a round may draft; calibration: the drafter's
    confidence -> acceptance table (None: a node's estimate is its priority). State per round:
    ``estimates`` of the nodes drafted so far (reset when a new tree starts, ``nodes == 0``)."""

    def __init__(self, prices: PriceCurve, budget: int, calibration: Calibration | DepthCalibration | None = None
                 ) -> None:
        if not isinstance(budget, int) or budget < 1:
            raise ValueError(f"the tree budget (nodes per round at most) must be a whole number >= 1, got {budget!r}")
        if not isinstance(prices, PriceCurve):
            raise ValueError(f"prices must be a costs.PriceCurve (e.g. Session.prices), got {type(prices).__name__}")
        self.prices, self.budget, self.calibration = prices, budget, calibration
        self.estimates: list[float] = []  # this round's drafted nodes, in drawing order
        self.depth = 0  # the deepest level drafted this round
        self.rounds = 0  # rounds that asked (trees started)

    def estimate(self, priority: float, depth: int) -> float:
        return node_estimate(priority, depth, self.calibration)

    def _pays(self, e_stop: float, nodes: int, depth: int, future: Sequence[tuple[float, int]]) -> bool:
        """Does some prefix of ``future`` ((estimate, depth) of the next nodes) beat stopping now?"""
        stop = e_stop / tree_round_ms(self.prices, nodes, depth)
        e, deepest = e_stop, depth
        for n, (p, d) in enumerate(future, start=nodes + 1):
            e += p
            deepest = max(deepest, d)
            if e / tree_round_ms(self.prices, n, deepest) > stop:
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

    def choose(self, nodes: Sequence[tuple[float, int]]) -> int:
        """The tree size for fully known nodes ((priority, depth) in drawing order): the stopping
        rule run with the true later estimates, which is the N of the best value(N)."""
        est = [(self.estimate(pr, d), d) for pr, d in nodes][: self.budget]
        n, deepest = 0, 0
        while n < len(est) and self._pays(1.0 + sum(p for p, _ in est[:n]), n, deepest, est[n:]):
            deepest = max(deepest, est[n][1])
            n += 1
        return n

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
            self.calibration.observe(min(conf, 1.0), i in stood, depth=record.depths[i])
