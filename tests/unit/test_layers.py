"""The package's layers: each subpackage imports only from those below it, and no module imports
itself back through others. Read from the source, so a wrong-way import fails here before it
becomes a cycle at run time."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "qeebm"

# Lowest first. A module may import from its own layer and any layer before it.
LAYERS = [
    {"qeebm", "qeebm.errors", "qeebm.utils", "qeebm.guards"},
    {"qeebm.config"},
    {"qeebm.data"},
    {"qeebm.metrics"},
    {"qeebm.qe"},
    {"qeebm.translation"},
    {"qeebm.methods"},
    {"qeebm.training"},
    {"qeebm.evaluation"},
    {"qeebm.analysis"},
    {"qeebm.tinyworld"},
    {"qeebm.experiments"},
    {"qeebm.cli"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """Every qeebm module ``path`` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # ``from pkg import submodule`` depends on the submodule; ``from pkg import name`` on pkg.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known}
    return found


def layer(module: str) -> int:
    for rank, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members if m != "qeebm") or module == "qeebm":
            return rank
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS")


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods)) - {name} for name, path in mods.items()}


def wrong_way() -> list[str]:
    return [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
            for a, deps in graph().items() for b in sorted(deps) if layer(b) > layer(a)]


def test_every_import_goes_down_the_layers():
    wrong = wrong_way()
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


def test_few_top_level_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top


def test_the_contract_fails_on_a_wrong_way_import(tmp_path, monkeypatch):
    # The checks above see what they are meant to: a layer-0 module importing the training loop.
    bad = tmp_path / "qeebm"
    (bad / "utils").mkdir(parents=True)
    (bad / "training").mkdir()
    (bad / "__init__.py").write_text("")
    (bad / "utils" / "__init__.py").write_text("")
    (bad / "training" / "__init__.py").write_text("")
    (bad / "utils" / "x.py").write_text("def f():\n    from qeebm.training.loop import train\n")
    (bad / "training" / "loop.py").write_text("from qeebm.utils.x import f\ntrain = f\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", bad)
    assert graph()["qeebm.utils.x"] == {"qeebm.training.loop"}
    assert wrong_way() == ["qeebm.utils.x (layer 0) imports qeebm.training.loop (layer 7)"]
