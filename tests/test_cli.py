"""The terminal demo on the embedded target (n-gram draft until the trained draft ships)."""

import pytest

from ears_core.cli import build_parser, main


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in ("--prompt", "--rule", "--beta", "--temperature", "--k", "-K", "--max-new-tokens", "--seed",
                 "--top-k", "--top-p", "--target", "--draft", "--no-baseline", "--no-color"):
        assert flag in text
    assert "--gamma" not in text  # the old name works (below) but is not offered


def test_the_old_flag_gamma_still_sets_k_and_says_it_was_renamed(capsys):
    assert build_parser().parse_args(["--gamma", "3"]).k == 3
    assert "--gamma is deprecated, use --k" in capsys.readouterr().err
    assert build_parser().parse_args([]).k == 4 and build_parser().parse_args(["-K", "2"]).k == 2


def test_bad_beta_is_reported_not_raised(capsys):
    assert main(["--beta", "-1", "--no-baseline"]) == 2
    assert "beta must be >= 0" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_streams_an_answer_and_prints_the_metrics(capsys):
    assert main(["--prompt", "Repeat after me: red green blue, red green blue, red green blue.",
                 "--max-new-tokens", "12", "--temperature", "0", "--rule", "greedy", "--no-color"]) == 0
    out = capsys.readouterr().out
    for line in ("acceptance rate", "mean acceptance length", "pardon rate", "mean exact distortion", "target-only",
                 "speedup, measured"):
        assert line in out
    assert out.split("\nrule")[0].strip()  # some answer text came first


@pytest.mark.slow
def test_bad_k_is_reported(capsys):
    assert main(["--k", "0", "--no-baseline"]) == 2
    assert "K (drafts per round) must be a whole number from 1 to 8" in capsys.readouterr().err


def test_importing_the_demo_module_keeps_ears_core_generate_callable(tiny_pair):
    import ears_core
    import ears_core.generate  # noqa: F401  (binds the package attribute to the module)

    target, draft = tiny_pair
    out = ears_core.generate(target, draft, [1, 2, 3], temperature=0, max_new_tokens=4)
    assert len(out.token_ids) == 4
