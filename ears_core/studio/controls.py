"""The request controls above the tabs, shared by Generate and Race, built from the rule registry.

Terms
-----
rule selector    ``elem_id="rule"``: one choice per rule in ``rules.RULES`` (its label shown, its
                 name sent), read when the app is built: a rule registered before ``build_app()``
                 appears with no other edit. The API also takes aliases and labels ("EARS",
                 "ordinary", "greedy"), hence a dropdown that lets a value through to the callback,
                 which resolves it (``errors.resolve_rule``) or answers with the list of rules.
parameter slider one per parameter name any registered rule takes (``Param``), ``beta`` first
                 (``elem_id="beta"``), the others ``elem_id="param_<name>"``; its range covers every
                 rule taking that name, and the callback checks the chosen rule's own range. A slider
                 shows only while a selected rule (Generate's, or either racer) takes it.
extra params     the sliders after beta: API inputs appended after the fixed ones, so a client that
                 sends only the fixed inputs gets their defaults; then the draft-length choice, then
                 the draft shape (``elem_id="draft_shape"``: API callers send
                 "auto", "chain" or "tree") and
                 the tree's nodes per round (``elem_id="tree_budget"``), in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import gradio as gr

from ears_core.rules import BETA, RULES, Param
from ears_core.serve.session import DRAFT_LENGTHS, DRAFT_SHAPES, MAX_K, MAX_TREE_NODES, RunConfig
from ears_core.serve.settings import Settings

from .errors import Request, check_params, resolve_rule

EXAMPLES = [
    ["Write a short poem about a lighthouse keeper who befriends a storm."],  # creative writing
    ["Why do leaves change colour in autumn? Answer in a few sentences."],  # open QA
    ["A train travels 120 km in 1.5 hours. What is its average speed? Explain step by step."],  # math
]
DEFAULT_RULE = "ears"


def rule_choices() -> list[tuple[str, str]]:
    """(label, name) of every registered rule, in registration order."""
    return [(spec.label, spec.name) for spec in RULES.values()]


def param_sliders_spec() -> list[Param]:
    """One Param per parameter name of the registered rules, beta first; a name several rules take
    gets the first one's default and help and a range covering all of them."""
    by_name: dict[str, list[Param]] = {"beta": []}
    for spec in RULES.values():
        for p in spec.params:
            by_name.setdefault(p.name, []).append(p)
    out = []
    for name, ps in by_name.items():
        ps = ps or [BETA]
        out.append(Param(name, ps[0].default, min(p.low for p in ps), max(p.high for p in ps), ps[0].help,
                         min(p.step for p in ps)))
    return out


def params_of(rule_name: Any) -> set[str]:
    """The parameter names a rule takes (none for a value that names no rule)."""
    try:
        return {p.name for p in resolve_rule(rule_name).params}
    except ValueError:
        return set()


@dataclass
class Controls:
    prompt: gr.Textbox
    rule: gr.Dropdown
    sliders: dict[str, gr.Slider]  # parameter name -> slider, beta first
    temperature: gr.Slider
    k: gr.Slider
    max_new: gr.Number
    seed: gr.Number
    with_base: gr.Checkbox
    draft_length: gr.Radio
    tree: gr.Checkbox
    tree_budget: gr.Slider
    names: list[str] = field(default_factory=list)  # parameter names in slider order

    @property
    def request(self) -> list[Any]:
        """The fixed inputs every run endpoint starts with: prompt, beta, temperature, K, length, seed."""
        return [self.prompt, self.sliders["beta"], self.temperature, self.k, self.max_new, self.seed]

    @property
    def extra(self) -> list[gr.Slider]:
        return [self.sliders[n] for n in self.names[1:]]

    def follow(self, selectors: Sequence[gr.Dropdown]) -> None:
        """Show exactly the sliders of the rules chosen in ``selectors``."""
        def visible(*chosen: Any) -> list[Any]:
            wanted = set().union(*(params_of(r) for r in chosen))
            return [gr.update(visible=n in wanted) for n in self.names]

        gr.on([s.change for s in selectors], visible, list(selectors), [self.sliders[n] for n in self.names],
              api_name=False, queue=False)


def build_controls(settings: Settings) -> Controls:
    """The prompt, its examples and the run settings; call inside an open ``gr.Blocks``."""
    with gr.Row():
        with gr.Column(scale=2):
            prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", value=EXAMPLES[0][0],
                                max_length=settings.max_prompt_chars)
            gr.Examples(EXAMPLES, inputs=[prompt], label="Examples: creative writing, open QA, math")
        with gr.Column(scale=1):
            rule = gr.Dropdown(rule_choices(), value=DEFAULT_RULE, label="Acceptance rule", elem_id="rule",
                               allow_custom_value=True)
            shown = params_of(DEFAULT_RULE)
            sliders = {p.name: gr.Slider(p.low, p.high, value=p.default, step=p.step,
                                         label=f"{p.name}: {p.help}" if p.help else p.name,
                                         elem_id="beta" if p.name == "beta" else f"param_{p.name}",
                                         visible=p.name in shown)
                       for p in param_sliders_spec()}
            temperature = gr.Slider(0, 2, value=0.9, step=0.05, label="temperature (0 = greedy)", elem_id="temperature")
            k = gr.Slider(1, MAX_K, value=4, step=1, label="K (drafts per round)", elem_id="k")
            with gr.Row():
                max_new = gr.Number(64, label="max new tokens", precision=0, minimum=1,
                                    maximum=settings.max_new_tokens, elem_id="max_new")
                seed = gr.Number(0, label="seed", precision=0, minimum=0, elem_id="seed")
            draft_length = gr.Radio(list(DRAFT_LENGTHS), value="policy", elem_id="draft_length",
                                    label="draft length: policy = this machine's prices pick 0..K drafts each round; "
                                    "fixed = always K; threshold = stop below confidence 0.35")
            tree = gr.Radio(list(DRAFT_SHAPES), value="auto", elem_id="draft_shape",
                            label="draft shape: tree = a tree of depth K in one target pass; auto = a tree with "
                            "the policy for greedy or the ordinary rule where a wide verify pass is cheap here, else a chain")
            tree_budget = gr.Slider(1, MAX_TREE_NODES, value=8, step=1, elem_id="tree_budget",
                                    label="tree nodes per round (at most; exactly when fixed)")
            with_base = gr.Checkbox(True, label="measure target-only baseline (cached per prompt)")
    return Controls(prompt, rule, sliders, temperature, k, max_new, seed, with_base, draft_length, tree, tree_budget,
                    names=list(sliders))


def run_config(rule_name: Any, req: Request, names: Sequence[str], values: Sequence[Any],
               draft_length: str | None = "policy", tree: Any = False, tree_budget: Any = 8) -> RunConfig:
    """The RunConfig of one rule from the request and the slider values (in ``names`` order);
    ``tree``: the draft shape, "auto" (also None), "chain" or "tree" (True / False: tree / chain),
    a tree of depth K with ``tree_budget`` nodes per round."""
    spec = resolve_rule(rule_name)
    params = check_params(spec, dict(zip(names, values)))
    if isinstance(tree_budget, float) and tree_budget.is_integer():
        tree_budget = int(tree_budget)  # a slider's value
    return RunConfig(rule=spec.name, params=params, temperature=req.temperature, k=req.k,
                     max_new_tokens=req.max_new, seed=req.seed, draft_length=draft_length or "policy",
                     draft_shape=shape_of(tree), tree_budget=tree_budget).validate()


def shape_of(tree: Any) -> str:
    """The draft shape a request asks for: the radio's value, or a bool from older API callers."""
    if tree is None:
        return "auto"
    if isinstance(tree, bool):
        return "tree" if tree else "chain"
    return str(tree)


def run_name(cfg: RunConfig) -> str:
    """A run's name for tables and legends: the rule's label and its parameters."""
    label = resolve_rule(cfg.rule).label
    return label + (f" ({', '.join(f'{k}={v:g}' for k, v in cfg.params.items())})" if cfg.params else "")
