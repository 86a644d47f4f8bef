"""The package's layering (docs/design.md "Package map"): nothing imports upward, no circles,
and no module outside runs.py spells a file name of the run directory."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "archsearch"

#: Layer of each top-level part of the package; a module may import its own layer or lower.
LAYERS = {"cli": 3, "export": 3, "export_onnx": 3, "serve": 3, "runtime": 2, "tune": 2, "report": 2, "runs": 1, "search": 1, "dynamic": 1,
          "space": 1, "data": 1, "models": 0, "hub": 0, "pareto": 0, "errors": 0, "metrics": 0,
          "__init__": 0}
#: The one allowed upward import: the package's public ``archsearch.load``, imported from
#: ``export`` on first use (a facade inside ``__getattr__``; ``import archsearch`` loads nothing).
FACADE = {("archsearch", "archsearch.export")}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: Path, known) -> set[str]:
    """archsearch modules ``name`` imports, at module level or inside functions."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_nothing_imports_upward_and_there_is_no_circle():
    mods = _modules()
    graph = {m: {t for t in _imports(m, p, mods) if (m, t) not in FACADE} for m, p in mods.items()}
    upward = [(m, t) for m, ts in graph.items() for t in ts
              if _part(t) != _part(m) and LAYERS[_part(t)] > LAYERS[_part(m)]]
    assert not upward, upward
    # a circle between parts (e.g. report -> tune -> report), found by depth-first search
    parts = {p: {_part(t) for m, ts in graph.items() if _part(m) == p for t in ts} - {p}
             for p in {_part(m) for m in graph}}
    state: dict[str, int] = {}

    def visit(p, path):
        state[p] = 1
        for q in parts[p]:
            assert state.get(q) != 1, f"import circle: {' -> '.join(path + [q])}"
            if q not in state:
                visit(q, path + [q])
        state[p] = 2

    for p in parts:
        if p not in state:
            visit(p, [p])


def test_only_runs_py_spells_the_run_directory_layout():
    spelled = []
    for p in PKG.rglob("*.py"):
        if p.name == "runs.py":
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(f'"{n}"' in code or f"'{n}'" in code for n in ("run.json", "space.yaml", "optuna.db", "tuner.pkl", "trials/")):
                spelled.append(f"{p.relative_to(PKG)}:{i}: {line.strip()}")
    assert not spelled, "\n".join(spelled)


#: The families of :mod:`archsearch.dynamic` (its subpackages); the rest of it is the shared core.
DYNAMIC_FAMILIES = ("depth", "length", "tying")


def _family(module: str) -> str | None:
    """``depth`` for ``archsearch.dynamic.depth.dht``, ``"core"`` for ``archsearch.dynamic.base``,
    ``None`` outside ``archsearch.dynamic``."""
    parts = module.split(".")
    if parts[:2] != ["archsearch", "dynamic"]:
        return None
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and parts[2] in DYNAMIC_FAMILIES) else "core"


def test_dynamic_families_import_the_core_and_never_each_other():
    """Inside ``archsearch.dynamic`` the families (``depth/``, ``length/``, ``tying/``) import the
    shared core, never one another, and the core imports no family (the registry names their
    classes by string and imports them on first use)."""
    mods = _modules()
    assert {p for p in DYNAMIC_FAMILIES} <= {_family(m) for m in mods}
    crossing = [(m, t) for m, p in mods.items() if _family(m) is not None
                for t in _imports(m, p, mods) if _family(t) is not None
                and _family(t) != "core" and _family(t) != _family(m)]
    assert not crossing, crossing


def test_each_family_settings_module_imports_no_torch():
    """``archsearch.dynamic.<family>.settings`` (the family's pydantic ``Settings``) is torch-free,
    as the core's ``archsearch.dynamic.settings`` is: a fresh interpreter imports all of them
    without torch."""
    import subprocess
    import sys

    code = ("import sys; import archsearch.dynamic.settings; "
            + "; ".join(f"import archsearch.dynamic.{f}.settings" for f in DYNAMIC_FAMILIES)
            + "; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PKG.parent).stdout.strip()
    assert out == "[]", out
