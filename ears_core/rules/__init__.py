"""Acceptance rules: how a verifier decides whether a drafted token stands.

base.py      the terms, ``AcceptanceRule`` (the ratio rule with a per-position tolerance), the
             ordinary rule, EARS and greedy
lossy.py     rules that trade fidelity for speed: entropy EARS, typical acceptance, FLy, the budget
registry.py  ``RULES``, ``register_rule``, ``make_rule``, ``Param`` (every front end reads these)
distortion.py the exact emitted distribution and its TV distance to P_target
"""

from ears_core.rules.base import (Q_EPS, AcceptanceRule, EARSRule, GreedyRule, RuleInputs, StandardRule,
                                  is_ratio_rule, verifying_rule)
from ears_core.rules.distortion import RESIDUAL_EPS, emitted, ratio_rule_distortion, tv_distance
from ears_core.rules.lossy import BudgetEARSRule, EntropyEARSRule, FLyRule, TypicalRule
from ears_core.rules.registry import BETA, RULES, Param, RuleSpec, make_rule, register_rule, rule_spec

__all__ = [
    "Q_EPS", "RuleInputs", "AcceptanceRule", "StandardRule", "EARSRule", "GreedyRule", "verifying_rule",
    "is_ratio_rule", "TypicalRule", "EntropyEARSRule", "FLyRule", "BudgetEARSRule", "Param", "RuleSpec",
    "RULES", "register_rule", "make_rule", "rule_spec", "BETA", "RESIDUAL_EPS", "emitted", "tv_distance",
    "ratio_rule_distortion",
]
