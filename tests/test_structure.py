"""The package's shape: data flows one way (no import cycles), gradio only in the studio, short functions."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "ears_core"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def from_imports(path: Path) -> list[tuple[str, ast.ImportFrom]]:
    """Each ``from X import ...`` of ``path`` with X resolved to an absolute module name."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.append((base, node))
    return out


def imports(path: Path) -> set[str]:
    """Every module of the package that ``path`` imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    for base, node in from_imports(path):
        out.add(base)
        out |= {f"{base}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in imports(p) if i in files and i != m} for m, p in files.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if n.startswith(m + ".") or m.startswith(n + "."):
                continue  # a package and its own submodules
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_a_module_that_imports_it_back():
    g = graph()
    assert len(g) > 20 and "ears_core.serve.session" in g
    assert find_cycle(g) is None


# The package's layers, bottom first: a module imports only from lower layers or from its own subpackage.
LAYERS = [
    {"sampling", "timing", "threads", "events", "deprecated", "tpp"},  # draws, clocks, thread lifetimes, records, renamed
    # names; point processes stand apart
    {"rules", "metrics"},  # acceptance rules and the distortion maths; what a generation measured
    {"model"},  # model kernels, KV-cache edits, the embedded target, hub loading
    {"draft"},  # drafters: a draft model, the EAGLE-style head, n-grams, tree building
    {"decode", "policy"},  # the decode loop and verifiers; measured prices and draft-length policies
    {"pair"},  # a target with its drafter
    {"serve"},  # sessions, runs, server settings
    {"quality"},  # the task score: questions, the scorer, sweeps of settings, accuracy with intervals
    {"report"},  # figures, the bench's plan and report
    {"cli", "bench", "gpu_check", "studio"},  # the terminal, the benchmark command, the CUDA check, the Gradio UI
    {"generate", "__init__"},  # ``python -m ears_core.generate`` and the public API
]


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    found = [i for i, names in enumerate(LAYERS) if part in names]
    assert found, f"{module}: its top-level name {part!r} is in no layer of LAYERS; add it where it belongs"
    return found[0]


def test_the_checker_finds_an_upward_arrow():
    assert layer_of("ears_core.model.passes.kv_cache") < layer_of("ears_core.decode.rounds")
    assert layer_of("ears_core") == len(LAYERS) - 1


def test_every_import_inside_the_package_points_down_the_layers():
    bad = []
    for m, targets in graph().items():
        top_m = m.split(".")[:2]
        for t in targets:
            if t.split(".")[:2] == top_m:
                continue  # within one subpackage (or one module)
            if layer_of(t) >= layer_of(m):
                bad.append(f"{m} -> {t}")
    assert not bad, "imports that point up or across a layer: " + "; ".join(sorted(bad))


def private_imports(path: Path) -> list[str]:
    """``from X import _name`` where X is another module of the package (a private name crossing modules)."""
    name = module_name(path)
    out = []
    for base, node in from_imports(path):
        if base.split(".")[0] != "ears_core" or base == name:
            continue
        out += [f"{name}: from {base} import {a.name}" for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_the_checker_finds_a_private_import(tmp_path):
    f = PKG / "decode" / "_probe_for_the_structure_test.py"
    try:
        f.write_text("from ears_core.decode.verify import _check\nfrom ears_core import __version__\n")
        assert private_imports(f) == ["ears_core.decode._probe_for_the_structure_test: from ears_core.decode.verify import _check"]
    finally:
        f.unlink()


def test_no_module_imports_a_private_name_of_another():
    found = [hit for path in PKG.rglob("*.py") for hit in private_imports(path)]
    assert not found, "; ".join(found)


def test_only_the_studio_imports_gradio():
    for path in PKG.rglob("*.py"):
        if "studio" in path.relative_to(PKG).parts:
            continue
        assert not any(i.split(".")[0] == "gradio" for i in imports(path)), path


MAX_FUNCTION_LINES = 60
LONG_REASON = re.compile(r"#\s*long:\s*\S")  # "# long: <why this function reads best in one piece>"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """"name (line N, L lines)" for every function (method, nested function) of ``source`` longer than
    ``limit`` lines, from its def line to its last line, without a reason: a ``# long: <reason>`` comment on
    its def line (or its signature's lines) or on the line just above the def (or above its decorators)."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length <= limit:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        body = node.body[0].lineno  # the signature ends before the first statement (the docstring, if any)
        said = lines[first - 2: first - 1] + lines[node.lineno - 1: max(body - 1, node.lineno)]
        if not any(LONG_REASON.search(line) for line in said):
            out.append(f"{node.name} (line {node.lineno}, {length} lines)")
    return out


def _function(name: str, body_lines: int, comment: str = "", above: str = "") -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    return f"{above}def {name}():{comment}\n{body}"


def test_the_length_checker_flags_a_long_function_unless_a_reason_is_written_beside_it():
    assert long_functions(_function("short", 59)) == []  # 60 lines with its def: at the limit
    assert long_functions(_function("long", 60)) == ["long (line 1, 61 lines)"]
    assert long_functions(_function("long", 60, comment="  # long: a table of cases")) == []
    assert long_functions(_function("long", 60, above="# long: one loop, read top to bottom\n")) == []
    assert long_functions(_function("long", 60, above="# long: its cases side by side\n@decorator\n")) == []
    assert long_functions(_function("long", 60, comment="  # longer than it should be")) == ["long (line 1, 61 lines)"]
    assert long_functions(_function("long", 60, above="# long:\n")) == ["long (line 2, 61 lines)"]  # no reason given
    nested = "def outer():\n" + "".join("    " + line + "\n" for line in _function("inner", 60).splitlines())
    assert long_functions(nested) == ["outer (line 1, 62 lines)", "inner (line 2, 61 lines)"]


def test_no_function_is_longer_than_the_limit_without_a_written_reason():
    found = [f"{path.relative_to(PKG.parent)}: {hit}" for path in sorted(PKG.rglob("*.py"))
             for hit in long_functions(path.read_text(encoding="utf-8"))]
    assert not found, (f"functions over {MAX_FUNCTION_LINES} lines: split them, or write why one reads best whole "
                       f"as '# long: <reason>' on or just above its def line: " + "; ".join(found))


HUGE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_kb_after_a_big_tensor(env_value: str | None) -> int:
    """AnonHugePages (kB) of a fresh interpreter that imported ears_core and filled a 64 MB tensor."""
    import os
    import subprocess
    import sys

    code = ("import os, ears_core, torch\n"
            "t = torch.ones(16 * 1024 * 1024)\n"
            "print(open(f'/proc/{os.getpid()}/smaps_rollup').read().split('AnonHugePages:')[1].split()[0])")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = env_value
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_importing_ears_core_puts_large_tensors_in_huge_pages_unless_the_user_says_no():
    import pytest

    if not HUGE.exists() or "[never]" in HUGE.read_text() or not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("this kernel offers no transparent huge pages")
    assert _huge_kb_after_a_big_tensor(None) >= 32 * 1024  # most of the 64 MB tensor
    assert _huge_kb_after_a_big_tensor("0") < 32 * 1024  # the user's choice wins


def test_the_package_names_each_public_name_once_where_it_lives_and_imports_it_on_first_use():
    """``ears_core.__all__``, the lazy table and the type checkers' imports name the same things, and importing the
    package alone loads no torch (a fresh interpreter)."""
    import subprocess
    import sys

    import ears_core

    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.name: node.module for node in guarded.body for alias in node.names}
    assert typed == ears_core._HOME and set(ears_core.__all__) == set(typed)
    assert all(getattr(ears_core, name) is not None for name in ears_core.__all__)
    code = "import sys, ears_core; print('torch' in sys.modules, 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == \
        ["False", "False"]
