"""The house's layers (docs/architecture.md): each package imports only from the packages below it, and no module
imports itself back through others. Imports anywhere count (module level, inside functions, under TYPE_CHECKING),
as they do for cache keys (`stages.code_deps`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Bottom to top: a package may import from its own layer and those before it.
LAYERS = ("rlhf_lib", "stages", "flows", "services", "benchmarks", "cli")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (`from pkg import name` counts `pkg.name` when a module)."""
    files = {_module(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")
             if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)}  # benchmarks/.trl-venv
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        found: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files)
        graph[mod] = {m for m in found if m in files and m != mod}
    return graph


GRAPH = _graph()


def test_the_graph_is_read():
    assert "rlhf_lib.ppo.trainer" in GRAPH["rlhf_lib.ppo.loop"]
    assert len(GRAPH) > 100


def test_no_arrow_up():
    rank = {name: i for i, name in enumerate(LAYERS)}
    up = sorted(f"{a} -> {b}" for a, deps in GRAPH.items() for b in deps
                if rank[b.split(".")[0]] > rank[a.split(".")[0]])
    assert up == []


def test_no_import_circle():
    # Tarjan's strongly connected components: any component of more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert circles == []


def test_a_circle_would_be_found(monkeypatch):
    monkeypatch.setitem(GRAPH, "rlhf_lib.lm.masked", GRAPH["rlhf_lib.lm.masked"] | {"rlhf_lib.lm.kl"})
    try:
        test_no_import_circle()
    except AssertionError:
        return
    raise AssertionError("a planted circle lm.masked <-> lm.kl went unnoticed")


def test_no_file_over_300_lines_without_a_reason_at_its_top():
    long = []
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            if len(lines) > 300 and "Over 300 lines because" not in "\n".join(lines[:40]):
                long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
    assert long == []


def test_no_stage_or_flow_imports_a_task_package():
    """The stages and flows reach a task through the protocol (`rlhf_lib.tasks`) only: a task's package (its builder,
    judge, baselines) and the user data's reader are imported by its `task.py`, never by a stage (issue 56)."""
    from rlhf_lib.tasks import TASKS

    packages = {type(task).__module__.rsplit(".", 1)[0] for task in TASKS.values()} | {"rlhf_lib.data.user"}
    assert packages >= {"rlhf_lib.demo_task", "rlhf_lib.arith_task", "rlhf_lib.user_task"}
    found = sorted(f"{mod} -> {dep}" for mod, deps in GRAPH.items() if mod.split(".")[0] in ("stages", "flows")
                   for dep in deps if any(dep == p or dep.startswith(p + ".") for p in packages))
    assert found == []
    assert "rlhf_lib.tasks" in GRAPH["stages.data"] and "rlhf_lib.tasks" in GRAPH["stages.eval"]
