"""The rule registry: one class with ``register_rule`` reaches the CLI, the bench and the library."""
from __future__ import annotations

import pytest
import torch

from ears_core import rules
from ears_core.bench import build_parser as bench_parser
from ears_core.report.bench_plan import BenchSettings, parse_rules, section_configs
from ears_core.cli import build_parser as cli_parser, config_from_args
from ears_core.rules import AcceptanceRule, Param, make_rule, register_rule, rule_spec


@pytest.fixture
def toy_rule():
    """A rule with a constant tolerance ``slack``, registered for one test only."""

    @register_rule("toy-slack", label="toy: constant slack", params=(Param("slack", 0.05, 0.0, 0.5, "constant tolerance"),))
    class ToySlack(AcceptanceRule):
        name = "toy-slack"
        lossless = False

        def __init__(self, slack: float = 0.05) -> None:
            self.slack = slack

        def tolerance(self, target_probs, max_p):
            return torch.full_like(max_p, self.slack)

    yield ToySlack
    rules.RULES.pop("toy-slack")


def test_builtin_rules_by_name_alias_and_parameters():
    assert list(rules.RULES)[:5] == ["standard", "ears", "greedy", "ears-entropy", "typical"]
    assert type(make_rule("ordinary")).__name__ == "StandardRule"
    assert make_rule("ears", beta=0.3).beta == 0.3 and make_rule("ears").beta == 0.1  # the Param default
    assert make_rule("entropy", beta=0.2).name == "ears-entropy"
    t = make_rule("typical", eps=0.2, beta=0.7)  # beta is not typical's: ignored
    assert (t.eps, t.delta) == (0.2, 0.3)
    with pytest.raises(ValueError, match="unknown rule 'nope'; choose one of: standard, ears"):
        make_rule("nope")
    with pytest.raises(ValueError, match="beta must be a number >= 0"):
        make_rule("ears", beta=-1)


def test_a_clashing_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_rule("ordinary", label="again")(AcceptanceRule)


def test_a_toy_rule_reaches_the_cli_and_the_bench(toy_rule, capsys):
    with pytest.raises(SystemExit):
        cli_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "toy-slack" in text and "--slack" in text
    args = cli_parser().parse_args(["--rule", "toy-slack", "--slack", "0.2"])
    rule, temperature = config_from_args(args).rule_and_temperature()
    assert isinstance(rule, toy_rule) and rule.slack == 0.2 and temperature == 0.9

    with pytest.raises(SystemExit):
        bench_parser().parse_args(["--help"])
    assert "toy-slack (slack)" in capsys.readouterr().out
    assert parse_rules("ordinary,toy-slack:slack=0.3") == (("ordinary", ()), ("toy-slack", (("slack", 0.3),)))
    cfgs = section_configs(BenchSettings(rules="toy-slack:slack=0.3"), "main", assisted=False)
    assert [c.label for c in cfgs] == ["target", "toy-slack slack=0.3"]
    assert cfgs[1].rule().slack == 0.3
    with pytest.raises(ValueError, match="takes no parameter 'beta'"):
        parse_rules("toy-slack:beta=1")


def test_the_toy_rule_decides_with_its_tolerance(toy_rule):
    from ears_core import verify
    tp = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])  # (1, 2, 3)
    dp = torch.tensor([[[0.8, 0.2, 0.0]]])  # q(0) = 0.8, p(0) = 0.5: r = 0.625
    args = (tp, dp, torch.tensor([[0]]))
    kw = dict(uniforms=torch.tensor([[0.7]]), sample_uniforms=torch.tensor([0.5]))
    assert verify(*args, make_rule("toy-slack", slack=0.1), **kw).kinds.tolist() == [[1]]  # pardoned: 0.625 >= 0.6
    assert verify(*args, make_rule("toy-slack", slack=0.05), **kw).kinds.tolist() == [[2]]  # rejected
    assert rule_spec("toy-slack").label == "toy: constant slack"
