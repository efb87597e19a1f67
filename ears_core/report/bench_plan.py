"""The benchmark's plan: what to run (configs, jobs, sections) and how answers are read.

Terms are those of ``bench`` (method, config, run, section). A config's method is ``target``
(target-only), ``assisted`` (transformers' assisted generation) or any rule registered in
``rules.RULES`` (by name or alias). ``--rules`` names the main section's rules, each with optional
parameters: ``ordinary,ears,typical,ears-entropy:beta=0.2``. A rule that takes beta and is given
none runs at every ``--betas`` value when it is ``ears``, else at the headline beta.
Every speculative config has a draft length (``session.DRAFT_LENGTHS``): ``policy`` (the measured
cost model picks 0..K drafts each round; the default), ``fixed`` (always K; the k section) or
``threshold`` (the old confidence threshold, asked before each draw). The policy section compares
them on the same prompts at T = 0 and T = 0.9: the policy, fixed K = 1..4 and the threshold.
Every speculative config also has a draft shape: ``chain`` (K drafts in a row) or ``tree`` (a tree of
depth K, ``budget`` nodes: exactly with a fixed draft length, at most with the policy, which is then
policy/tree_budget.py: ``TreeBudget``). The tree section compares them on the policy section's prompts,
temperatures and length: at the same verify price (a tree of N nodes against a chain of K = N drafts,
both N + 1 tokens a target pass, for N in ``--tree-budgets``) and each with the cost model (the
chain's policy against a tree sized by the cost model, at most ``--tree-max-nodes`` nodes, depth K0).
``--frontier`` names the frontier section's sweeps, one per rule: its first parameter takes every
value listed (separated by ``/``), later ones are fixed: ``ears:beta=0.1/0.3,fly:gate=0.3/0.6:window=2``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ears_core.quality.section import QualitySettings
from ears_core.rules import AcceptanceRule, make_rule, rule_spec

__all__ = ["Config", "BenchSettings", "Job", "build_plan", "load_prompts", "spread", "final_answer", "parse_rules",
           "SECTIONS", "PROMPTS_FILE", "FRONTIER", "parse_frontier", "OWN_SECTIONS"]

PROMPTS_FILE = Path(__file__).resolve().parents[2] / "assets" / "prompts.json"
SECTIONS = ("main", "sweep", "k", "fidelity", "frontier", "policy", "tree")
OWN_SECTIONS = ("quality",)  # their own runner and files (quality/section.py); run only when --sections names them
DRAFT_LENGTHS = ("policy", "fixed", "threshold")
# The frontier section's default sweeps: every lossy rule's knob, from nearly lossless to loose.
FRONTIER = ("ears:beta=0.05/0.1/0.2/0.3/0.5/1,ears-entropy:beta=0.05/0.1/0.2/0.5/1,typical:eps=0.3/0.2/0.1/0.05/0.02,"
            "fly:gate=1/0.7/0.5/0.3/0.1/0,ears-budget:epsilon=0.005/0.01/0.02/0.05/0.1")


@dataclass(frozen=True)
class Config:
    """One decoding setup: ``method`` is target, assisted or a registered rule; ``beta`` and
    ``params`` (other (name, value) pairs) are the rule's parameters; ``draft`` its draft length."""

    method: str
    temperature: float
    k: int = 0  # K, drafts per round at most; 0 for target-only
    beta: float = 0.0
    params: tuple[tuple[str, float], ...] = ()
    draft: str = "policy"  # policy / fixed / threshold (see the module docstring)
    shape: str = "chain"  # chain / tree (see the module docstring)
    budget: int = 0  # a tree's nodes per round (at most with the policy); 0 for a chain

    @property
    def label(self) -> str:
        if self.method in ("target", "assisted"):
            return self.method
        names = {p.name for p in rule_spec(self.method).params}
        values = ([f"{self.beta:g}"] if "beta" in names else []) + [f"{k}={v:g}" for k, v in self.params]
        tree = [f"tree({self.budget})"] if self.shape == "tree" else []
        return " ".join([self.method, *values, *tree]) + ("" if self.draft == "policy" else f" [{self.draft}]")

    @property
    def key(self) -> str:
        return f"{self.label} T={self.temperature:g} K={self.k}"

    def rule(self) -> AcceptanceRule:
        if self.method in ("target", "assisted"):
            raise ValueError(f"{self.method} is not a speculative rule")
        return make_rule(self.method, beta=self.beta, **dict(self.params))


def parse_rules(text: str) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """'ordinary,ears,typical:eps=0.1' -> ((name, ((param, value), ...)), ...); names checked
    against the registry, parameters against the rule's own."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, *pairs = item.split(":")
        spec = rule_spec(name)  # unknown: a ValueError listing the registered rules
        taken = {p.name for p in spec.params}
        params = []
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key.strip() not in taken:
                raise ValueError(f"rule {spec.name} takes no parameter {key.strip()!r} (it takes: "
                                 f"{', '.join(sorted(taken)) or 'none'})")
            try:
                params.append((key.strip(), float(value)))
            except ValueError:
                raise ValueError(f"--rules: {item!r}: {key.strip()} needs a number, got {value!r}") from None
        out.append((name.strip().lower(), tuple(params)))
    if not out:
        raise ValueError("--rules is empty: name at least one rule, e.g. ordinary,ears")
    return tuple(out)


Sweep = tuple[str, str, tuple[float, ...], tuple[tuple[str, float], ...]]


def parse_frontier(text: str) -> tuple[Sweep, ...]:
    """'ears:beta=0.1/0.3,fly:gate=0.3/0.6:window=2' -> ((name, swept parameter, its values,
    ((fixed parameter, value), ...)), ...): per rule, the first parameter is swept over its '/'
    separated values and the others are fixed; names and parameters checked against the registry."""
    out: list[Sweep] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, *pairs = (x.strip() for x in item.split(":"))
        spec = rule_spec(name)  # unknown: a ValueError listing the registered rules
        taken = {p.name for p in spec.params}
        if not pairs:
            raise ValueError(f"--frontier: {item!r}: name the parameter to sweep, e.g. {spec.name}:"
                             f"{next(iter(taken), 'param')}=0.1/0.2 (it takes: {', '.join(sorted(taken)) or 'none'})")
        parsed = []
        for i, pair in enumerate(pairs):
            key, _, values = (x.strip() for x in pair.partition("="))
            if key not in taken:
                raise ValueError(f"--frontier: rule {spec.name} takes no parameter {key!r} (it takes: "
                                 f"{', '.join(sorted(taken)) or 'none'})")
            try:
                nums = tuple(float(v) for v in values.split("/") if v.strip())
            except ValueError:
                raise ValueError(f"--frontier: {item!r}: {key} needs numbers separated by '/', got {values!r}") from None
            if not nums or (i > 0 and len(nums) != 1):
                raise ValueError(f"--frontier: {item!r}: sweep the first parameter ({key if i == 0 else pairs[0]}) "
                                 "over one or more values; the others take exactly one")
            parsed.append((key, nums))
        (swept, values), fixed = parsed[0], tuple((k, v[0]) for k, v in parsed[1:])
        out.append((name.lower(), swept, values, fixed))
    if not out:
        raise ValueError("--frontier is empty: name at least one rule and its parameter, e.g. ears:beta=0.1/0.3")
    return tuple(out)


@dataclass
class BenchSettings:
    target: str = "embedded"
    draft: str = "auto"
    device: str | None = None
    prompts_file: Path = PROMPTS_FILE
    prompts: int = 12  # main section: spread over the tasks
    sweep_prompts: int = 6  # sweep and k sections
    max_new_tokens: int = 48
    fidelity_tokens: int = 96
    temperature: float = 0.9  # T0
    k: int = 4  # K0
    betas: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)
    headline_beta: float = 0.1
    temperatures: tuple[float, ...] = (0.3, 0.6, 0.9, 1.2)
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    fidelity_seeds: int = 4
    fidelity_betas: tuple[float, ...] = (0.1, 0.3)
    sections: tuple[str, ...] = SECTIONS
    assisted: bool = True
    out: Path = Path("bench_out")
    threads: int | None = None
    images: bool = False
    draft_length: str = "policy"  # the main, sweep, fidelity and frontier sections' draft length
    policy_temperatures: tuple[float, ...] = (0.0, 0.9)  # the policy section (T = 0 is greedy)
    policy_ks: tuple[int, ...] = (1, 2, 3, 4)  # its fixed K; the policy and threshold use K0
    policy_tokens: int = 64
    tree_budgets: tuple[int, ...] = (2, 4)  # the tree section's fixed budgets N (against chains of K = N)
    tree_max_nodes: int = 8  # the tree section's cost-model tree: nodes per round at most (depth K0)
    rules: str = "ordinary,ears,typical,entropy"  # the main section's rules (see parse_rules)
    frontier: str = FRONTIER  # the frontier section's sweeps (see parse_frontier)
    extra: dict[str, Any] = field(default_factory=dict)
    quality: QualitySettings = field(default_factory=QualitySettings)  # the quality section's sizes

    def check(self) -> None:
        if self.max_new_tokens < 1 or self.fidelity_tokens < 1:
            raise ValueError("--max-new-tokens and --fidelity-tokens must be >= 1")
        if self.prompts < 1 or self.sweep_prompts < 1:
            raise ValueError("--prompts and --sweep-prompts must be >= 1")
        if self.k < 1 or any(k < 1 for k in self.ks):
            raise ValueError("K must be >= 1 (--k, --ks)")
        if self.temperature <= 0 or any(t <= 0 for t in self.temperatures):
            raise ValueError("benchmark temperatures must be > 0 (sampling; the greedy check is in the tests)")
        if any(b < 0 for b in (*self.betas, *self.fidelity_betas, self.headline_beta)):
            raise ValueError("beta must be >= 0")
        unknown = set(self.sections) - set(SECTIONS) - set(OWN_SECTIONS)
        if self.draft_length not in DRAFT_LENGTHS:
            raise ValueError(f"--draft-length must be one of {', '.join(DRAFT_LENGTHS)}, got {self.draft_length!r}")
        if any(t < 0 for t in self.policy_temperatures) or any(k < 1 for k in self.policy_ks):
            raise ValueError("--policy-temperatures must be >= 0 and --policy-ks >= 1")
        if any(not 1 <= n <= 16 for n in (*self.tree_budgets, self.tree_max_nodes)):
            raise ValueError("--tree-budgets and --tree-max-nodes must be whole numbers from 1 to 16 (nodes per round)")
        if unknown:
            raise ValueError(f"unknown section(s) {sorted(unknown)}: choose from {', '.join(SECTIONS + OWN_SECTIONS)}")
        parse_rules(self.rules)
        parse_frontier(self.frontier)
        if "quality" in self.sections:
            self.quality.check()
            parse_frontier(self.quality.sweeps)


# ------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Job:
    """A run to do: a config on prompt ``prompt_id`` with ``seed``, in the given sections."""

    config: Config
    prompt_id: int
    seed: int
    max_new_tokens: int


def load_prompts(path: Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    prompts = data["prompts"] if isinstance(data, dict) else data
    if len(prompts) == 0:
        raise ValueError(f"{path} holds no prompts")
    return [dict(p, id=i) for i, p in enumerate(prompts)]


def spread(prompts: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first n prompts taking the tasks in turn (creative, qa, math, creative, ...)."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for p in prompts:
        by_task.setdefault(p.get("task", "other"), []).append(p)
    out: list[dict[str, Any]] = []
    for i in range(max(len(v) for v in by_task.values())):
        out += [group[i] for group in by_task.values() if i < len(group)]
    return out[:n]


def section_configs(s: BenchSettings, section: str, assisted: bool) -> list[Config]:
    """The section's configs; every speculative one takes ``s.draft_length`` unless the section
    is about the draft length itself (k: fixed K; policy: all three)."""
    from dataclasses import replace

    if section == "k":
        t0, k0, hb = s.temperature, s.k, s.headline_beta
        return [Config("target", t0)] + [c for k in s.ks for c in (Config("ordinary", t0, k, draft="fixed"),
                                                                      Config("ears", t0, k, hb, draft="fixed"))]
    if section == "policy":
        cfgs: list[Config] = []
        for t in s.policy_temperatures:
            rules = [("ordinary", 0.0)] + ([("ears", s.headline_beta)] if t > 0 else [])
            cfgs.append(Config("target", t))
            for name, beta in rules:
                cfgs.append(Config(name, t, s.k, beta, draft="policy"))
                cfgs += [Config(name, t, k, beta, draft="fixed") for k in s.policy_ks]
                cfgs.append(Config(name, t, s.k, beta, draft="threshold"))
        return cfgs
    if section == "tree":  # the policy section's temperatures and rules; chain and tree side by side
        cfgs = []
        for t in s.policy_temperatures:
            rules = [("ordinary", 0.0)] + ([("ears", s.headline_beta)] if t > 0 else [])
            cfgs.append(Config("target", t))
            for name, beta in rules:
                for n in s.tree_budgets:  # the same verify price: N + 1 tokens a target pass
                    cfgs += [Config(name, t, n, beta, draft="fixed"),
                             Config(name, t, n, beta, draft="fixed", shape="tree", budget=n)]
                cfgs += [Config(name, t, s.k, beta, draft="policy"),
                         Config(name, t, s.k, beta, draft="policy", shape="tree", budget=s.tree_max_nodes)]
        return cfgs
    return [c if c.method in ("target", "assisted") else replace(c, draft=s.draft_length)
            for c in _section_configs(s, section, assisted)]


def _section_configs(s: BenchSettings, section: str, assisted: bool) -> list[Config]:
    t0, k0, hb = s.temperature, s.k, s.headline_beta
    if section == "main":
        cfgs = [Config("target", t0)]
        for name, params in parse_rules(s.rules):
            given = dict(params)
            takes_beta = any(p.name == "beta" for p in rule_spec(name).params)
            rest = tuple((k, v) for k, v in params if k != "beta")
            if not takes_beta:
                cfgs.append(Config(name, t0, k0, 0.0, rest))
            elif "beta" in given:
                cfgs.append(Config(name, t0, k0, given["beta"], rest))
            else:
                cfgs += [Config(name, t0, k0, b, rest) for b in (s.betas if rule_spec(name).name == "ears" else (hb,))]
        return cfgs + ([Config("assisted", t0, k0)] if assisted else [])
    if section == "sweep":
        return [c for t in s.temperatures for c in
                [Config("target", t), Config("ordinary", t, k0), *(Config("ears", t, k0, b) for b in s.betas)]]
    if section == "fidelity":
        return [Config("target", t0), Config("ordinary", t0, k0)] + [Config("ears", t0, k0, b) for b in s.fidelity_betas]
    if section == "frontier":  # every lossy rule's knob at T0, K0, beside the lossless anchor
        cfgs = [Config("target", t0), Config("ordinary", t0, k0)]
        for name, swept, values, fixed in parse_frontier(s.frontier):
            for x in values:
                given = dict(fixed, **{swept: x})
                rest = tuple((k, v) for k, v in (*((swept, x),), *fixed) if k != "beta")
                cfgs.append(Config(name, t0, k0, given.get("beta", 0.0), rest))
        return list(dict.fromkeys(cfgs))
    raise ValueError(section)


def build_plan(s: BenchSettings, prompts: list[dict[str, Any]], assisted: bool) -> tuple[list[Job], dict[str, list[Job]]]:
    """Every job once (sections share runs), grouped by (prompt, seed); and each section's jobs."""
    by_section: dict[str, list[Job]] = {}
    for sec in s.sections:
        if sec == "fidelity":
            chosen = [p for p in prompts if p.get("answer") is not None]
            seeds, tokens = range(s.fidelity_seeds), s.fidelity_tokens
        elif sec in ("policy", "tree"):
            chosen, seeds, tokens = spread(prompts, s.prompts), range(1), s.policy_tokens
        else:
            chosen = spread(prompts, s.prompts if sec == "main" else s.sweep_prompts)
            seeds, tokens = range(1), s.max_new_tokens
        by_section[sec] = [Job(c, p["id"], seed, tokens) for p in chosen for seed in seeds
                           for c in section_configs(s, sec, assisted)]
    unique = list(dict.fromkeys(j for jobs in by_section.values() for j in jobs))
    groups: dict[tuple[int, int, int], list[Job]] = {}
    for j in unique:
        groups.setdefault((j.prompt_id, j.seed, j.max_new_tokens), []).append(j)
    ordered: list[Job] = []
    for g, jobs in enumerate(groups.values()):  # rotate the order inside each group: interleaving
        r = g % len(jobs)
        ordered += jobs[r:] + jobs[:r]
    return ordered, by_section


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_answer(text: str) -> str | None:
    """The last number in the text, commas dropped, as a canonical string ("1,200.00" -> "1200")."""
    found = NUMBER.findall(text.replace(",", ""))
    if not found:
        return None
    x = float(found[-1])  # "14", "14.0" and "14.00" are one answer
    return str(int(x)) if x.is_integer() else f"{x:g}"


