"""The README's library example runs as written, on the embedded pair."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def library_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The library in ten lines"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_readme_library_example_runs_as_written(capsys):
    code = library_example()
    assert "load_pair()" in code and "generate(*pair" in code
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    out, base = scope["out"], scope["base"]
    assert len(out.token_ids) == 32 == len(base.token_ids)
    assert scope["pair"].draft_spec == "embedded"  # load_pair() comes with its draft
    assert out.stats.drafted > 0  # the head drafted: this was speculative decoding
    assert capsys.readouterr().out.startswith(out.text)
