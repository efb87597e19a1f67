"""The README and docs/: the library example runs as written on the embedded pair; the README stays a
short guide; every file under docs/ is cited by a document, every docs/ file a document cites
exists, and every table of figures matches the bench summary it names (scripts/bench_markdown.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 220


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
    for run in (out, base):  # 32 tokens, or fewer ending the answer (which target loads depends on the CPU class)
        assert (run.stop, len(run.token_ids)) == ("length", 32) or (run.stop == "eos" and 0 < len(run.token_ids) < 32)
    assert scope["pair"].draft_spec == "embedded"  # load_pair() comes with its draft
    assert out.stats.drafted > 0  # the head drafted: this was speculative decoding
    assert capsys.readouterr().out.startswith(out.text)


def test_the_readme_is_a_short_guide():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, "the README is a guide: move details to docs/ and link them"
    for heading in ("## The two commands", "## Results", "## The library in ten lines", "## Configuration",
                    "## Hosting", "## Layout"):
        assert heading in text, f"the README lost its section {heading!r}"
    assert "assets/screenshot.png" in text and (ROOT / "assets" / "screenshot.png").is_file()


def documents() -> list[Path]:
    """The README and every markdown file under docs/: what may cite a file under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def cited_by(doc: Path, target: Path) -> bool:
    """Whether doc names target by its path from the repository root or from doc's own folder."""
    if doc == target:
        return False
    text = doc.read_text(encoding="utf-8")
    names = {target.relative_to(ROOT).as_posix(), Path(os.path.relpath(target, doc.parent)).as_posix()}
    return any(re.search(rf"(?<![\w/.-]){re.escape(name)}(?![\w/-])", text) for name in names)


def test_every_file_under_docs_is_cited_by_a_document():
    files = sorted(p for p in DOCS.rglob("*") if p.is_file())
    assert files, "docs/ is empty"
    orphans = [p.relative_to(ROOT).as_posix() for p in files if not any(cited_by(d, p) for d in documents())]
    assert not orphans, f"files under docs/ that no document cites (cite them or delete them; git keeps history): {orphans}"


def test_every_docs_file_a_document_cites_exists():
    missing = []
    for doc in documents():
        text = doc.read_text(encoding="utf-8")
        named = {m for m in re.findall(r"(?<![\w/.-])docs/[\w./-]*\w\.\w+", text)}
        if doc.parent == DOCS or DOCS in doc.parents:
            named |= {Path(os.path.relpath(doc.parent / m, ROOT)).as_posix()
                      for m in re.findall(r"(?<![\w/.-])(?:results|img)/[\w.-]*\w\.\w+", text)}
        missing += [f"{doc.relative_to(ROOT)}: {name}" for name in sorted(named) if not (ROOT / name).exists()]
    assert not missing, f"documents cite files that do not exist: {missing}"


def bench_markdown():
    spec = importlib.util.spec_from_file_location("bench_markdown", ROOT / "scripts" / "bench_markdown.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_table_of_figures_matches_the_summary_it_names():
    md = bench_markdown()
    blocks = 0
    for doc in documents():
        text = doc.read_text(encoding="utf-8")
        blocks += len(md.BLOCK.findall(text))
        assert md.updated(text) == text, (f"{doc.relative_to(ROOT)}: a FIGURES block differs from its summary: "
                                          f"python scripts/bench_markdown.py --update {doc.relative_to(ROOT)}")
    assert blocks >= 8  # every bench section of docs/benchmarks.md (the headline figures: the test below)


def test_the_headline_figures_are_those_of_the_run_they_cite():
    """The README's and benchmarks.md's lean-path tables quote docs/results/speedup_lean_20x96.json."""
    run = json.loads((DOCS / "results" / "speedup_lean_20x96.json").read_text())
    lean = run["dtypes"]["lean"]["settings"]
    quoted = [f"{lean[name][key]:.1f}" for name in ("T=0", "ordinary T=0.9", "EARS 0.1 T=0.9")
              for key in ("target_only_tokens_per_s", "speculative_tokens_per_s")]
    quoted += [f"{lean[name]['ratio_decode']:.2f}x" for name in ("T=0", "ordinary T=0.9", "EARS 0.1 T=0.9")]
    for doc in (README, DOCS / "benchmarks.md"):
        text = doc.read_text(encoding="utf-8")
        missing = [q for q in quoted if q not in text]
        assert not missing, f"{doc.name} does not quote {missing} from results/speedup_lean_20x96.json"
    assert lean["T=0"]["greedy_equal"] == run["prompts"]  # greedy speculative = target-only on every prompt


def test_bench_markdown_renders_a_summary_and_repoints_blocks(tmp_path):
    md = bench_markdown()
    summary = md.load("docs/results/bench_xeon_policy_tree.json")
    table = md.render(summary, "headline")
    lines = table.splitlines()
    assert lines[0].startswith("| setting |") and len(lines) == 2 + 3  # T = 0, T = 0.9 ordinary, T = 0.9 EARS
    policy = next(r for r in summary["sections"]["policy"] if r["config"] == "ordinary T=0 K=4")
    assert f"{policy['ratio']:.2f}x" in lines[2]  # the chain policy's ratio at T = 0, as pooled by the bench
    with pytest.raises(ValueError, match="frontier"):
        md.render(summary, "frontier")
    waiting = "<!-- FIGURES: from (none) view=policy -->\nold\n<!-- /FIGURES -->"
    assert "No summary" in md.updated(waiting)
    filled = md.updated(waiting, "docs/results/bench_xeon_policy_tree.json")
    assert "from docs/results/bench_xeon_policy_tree.json view=policy" in filled and "fixed K = 2" in filled
