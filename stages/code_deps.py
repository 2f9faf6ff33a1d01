"""Which project modules a stage's code depends on, read from the code itself.

A stage's cache key covers the source of every project module its own module imports, directly or through other
project modules, found by walking `import` statements with `ast` (docs/architecture.md, "What a cache key
covers"). Imports anywhere count: at module level, inside functions (lazy imports) and under `TYPE_CHECKING`;
over-counting costs a rerun, never a stale hit. The parent packages of each module count too (importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py`).
Modules outside the project packages (torch, transformers, ...) are covered by their versions instead.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("rlhf_lib", "stages", "flows", "services", "cli")


def is_project(module: str) -> bool:
    return module.split(".")[0] in PROJECT_PACKAGES


@cache
def module_file(module: str) -> Path | None:
    """The source file of a project module (a package's `__init__.py`), or None when it is not one. Found by path
    under the project root, without importing anything."""
    if not module or not is_project(module):
        return None
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name of a `from ... import` (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str) -> set[str]:
    """The project modules `module`'s source imports (one level: no recursion)."""
    path = module_file(module)
    if path is None:
        raise ImportError(f"cannot locate project module {module} to read its imports")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, path.name == "__init__.py")
            found.add(base)
            # `from pkg import name`: `name` may be a submodule of the package.
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if alias.name != "*" and module_file(f"{base}.{alias.name}") is not None)
    return {m for m in found if module_file(m) is not None}


@cache
def dependencies(module: str) -> frozenset[str]:
    """`module` and every project module it imports, directly or not, with their parent packages."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(m for m in [*_parents(current), *imported_modules(current)] if module_file(m) is not None)
    return frozenset(seen)


def source_files(module: str) -> list[Path]:
    """The source files behind `dependencies(module)`, sorted."""
    return sorted({module_file(m) for m in dependencies(module)})
