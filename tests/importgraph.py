"""A package's import graph, read from its source with ``ast`` (for the structure tests).

Imports under ``if TYPE_CHECKING`` count: a circle there is a circle a reader must follow all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType


def _statements(tree: ast.Module, typing: bool) -> list[ast.AST]:
    """Every node of the module; without ``typing``, none under ``if TYPE_CHECKING:``."""
    if typing:
        return list(ast.walk(tree))
    found: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def imports(package: ModuleType, *, typing: bool = True) -> dict[str, set[str]]:
    """Every module of ``package`` and the modules of it that it imports (a package means its ``__init__``).

    Args:
        typing: count the imports under ``if TYPE_CHECKING:`` (False: only what runs).
    """
    root, prefix = Path(package.__file__ or "").parent, package.__name__

    def module_name(path: Path) -> str:
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join((prefix, *parts))

    modules = {module_name(path): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        base_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in _statements(ast.parse(path.read_text()), typing):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = base_package.rsplit(".", node.level - 1)[0] if node.level > 1 else base_package
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                for alias in node.names:  # ``from . import x`` may name a module
                    if f"{target}.{alias.name}" in modules:
                        found.add(f"{target}.{alias.name}")
                if target in modules:
                    found.add(target)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in modules}
        graph[name] = found - {name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, if any (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and every module it imports, directly or through others."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
