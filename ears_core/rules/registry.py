"""The rule registry: every front end (the CLI's ``--rule``, the bench's ``--rules``, the app's
rule selector and sliders) reads ``RULES``.

``@register_rule(name, label=..., params=(Param(...), ...))`` on a rule class is all a new rule
needs. ``make_rule(name, **params)`` builds one by name (or alias) from the parameters it takes
(an ``AcceptanceRule``, rules/base.py); ``Param`` gives each parameter's default and the range a
slider offers. ``BETA`` is EARS's tolerance scale: its range is the one the app's slider, the CLI
and ``RunConfig`` check against. This module imports no rule: the rules import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Param", "RuleSpec", "RULES", "register_rule", "rule_spec", "make_rule", "BETA"]


@dataclass(frozen=True)
class Param:
    """A number a rule takes: its default, and the range (and step) a slider offers."""

    name: str
    default: float
    low: float
    high: float
    help: str = ""
    step: float = 0.01


@dataclass(frozen=True)
class RuleSpec:
    """A registered rule: its name, aliases, a label for people, the class and its parameters."""

    name: str
    label: str
    cls: type
    params: tuple[Param, ...] = ()
    aliases: tuple[str, ...] = ()
    summary: str = ""

    def build(self, **values: Any) -> Any:
        """An instance from the parameters this rule takes (others in ``values`` are ignored;
        a missing one takes its default)."""
        kwargs = {p.name: float(values[p.name]) if values.get(p.name) is not None else p.default
                  for p in self.params}
        return self.cls(**kwargs)


RULES: dict[str, RuleSpec] = {}  # name -> spec, in registration order


def register_rule(name: str, *, label: str, params: tuple[Param, ...] = (), aliases: tuple[str, ...] = (),
                  summary: str = "") -> Callable[[type], type]:
    """Class decorator: add a rule to the registry every front end reads."""

    def add(cls: type) -> type:
        taken = {n for spec in RULES.values() if spec.name != name for n in (spec.name, *spec.aliases)}
        clash = taken & {name, *aliases}
        if clash:
            raise ValueError(f"rule name(s) {sorted(clash)} already registered: pick another name")
        RULES[name] = RuleSpec(name, label, cls, tuple(params), tuple(aliases), summary or (cls.__doc__ or "").split("\n")[0])
        return cls

    return add


def rule_spec(name: str) -> RuleSpec:
    """The spec registered under ``name`` or one of its aliases (any case)."""
    key = str(name).strip().lower()
    for spec in RULES.values():
        if key == spec.name or key in spec.aliases:
            return spec
    raise ValueError(f"unknown rule {name!r}; choose one of: {', '.join(RULES)}")


def make_rule(name: str, **params: Any) -> Any:
    """A rule by registered name or alias, from the parameters it takes (see ``RuleSpec.build``)."""
    return rule_spec(name).build(**params)


BETA = Param("beta", 0.1, 0.0, 1.0, "tolerance scale, >= 0 (0 = the ordinary rule)")
