"""benchmarks/ as a package a newcomer can walk (issue 61): one evidence library, test beds, one
folder per question; a question imports the library and the test beds, never another question;
no file edits ``sys.path``; only the library takes percentiles; no import circle."""

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SHARED = {"evidence", "testbeds"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in BENCH.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, known: dict) -> set[str]:
    """benchmarks modules ``name`` imports (module level or inside functions)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # ``from pkg import submodule`` imports the submodule, not the package's other names
            targets = subs if all(t in known for t in subs) else [base] + subs
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t != "benchmarks":
                out.add(t)
    return out


def _part(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_questions_import_only_the_library_and_test_beds_and_there_is_no_circle():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    wrong = []
    for m, deps in graph.items():
        for d in deps:
            src, dst = _part(m), _part(d)
            if src == dst or dst in SHARED and (src not in SHARED or (src, dst) != ("evidence", "testbeds")):
                continue
            if dst in ("summarize", "__main__", "") or src in ("summarize", "__main__"):
                continue
            wrong.append(f"{m} -> {d}")
    assert not wrong, "a question imports another question (or the library a test bed):\n" + "\n".join(sorted(wrong))
    # no circle: depth-first search over the module graph
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in graph.get(m, ()):
            if state.get(d) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_no_file_edits_sys_path_and_only_the_library_takes_percentiles():
    files = subprocess.run(["git", "ls-files", "benchmarks", "tests"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    py = [f for f in files if f.endswith(".py") and (ROOT / f).exists()]
    edits = [f for f in py if f != "tests/test_benchmarks_layout.py"
             and re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", (ROOT / f).read_text())]
    assert not edits, f"these files edit sys.path: {edits}"
    pct = [f for f in py if f.startswith("benchmarks/") and not f.startswith("benchmarks/evidence/")
           and "percentile" in (ROOT / f).read_text()]
    assert not pct, f"percentiles outside benchmarks/evidence/: {pct}"


def test_every_result_lives_in_its_question_and_names_are_unique():
    results = sorted(BENCH.glob("*/results/*.json"))
    assert results, "no results found under benchmarks/<question>/results/"
    names = [p.name for p in results]
    assert len(names) == len(set(names)), "a result file name appears in two questions"
    assert not (BENCH / "results").exists() and not (BENCH / "data").exists() and not (BENCH / "protocols").exists()
    assert {p.name for p in BENCH.glob("*.py")} <= {"__init__.py", "__main__.py", "summarize.py"}
