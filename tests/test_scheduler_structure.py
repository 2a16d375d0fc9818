"""The core's structure: two parts behind one facade, no import circle, no class held together by stubs.

Fairness (``scheduler/fairness/``: whose job goes next, and its charge) and
routing (``scheduler/routing/``: where it runs, and what answers teach) never
import each other; ``Scheduler`` composes them. Imports are read from the
source with ``ast``, those under ``if TYPE_CHECKING`` included, since a circle
there is a circle a reader must follow all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mindrouter.scheduler

ROOT = Path(mindrouter.scheduler.__file__).parent
PACKAGE = "mindrouter.scheduler"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def imports() -> dict[str, set[str]]:
    """Every scheduler module and the scheduler modules it imports (a package means its ``__init__``)."""
    modules = {module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
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


def test_the_scheduler_has_no_import_circle() -> None:
    assert cycle(imports()) is None


def test_the_cycle_check_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_fairness_and_routing_never_import_each_other() -> None:
    graph = imports()
    for part, other in (("fairness", "routing"), ("routing", "fairness")):
        for name, targets in graph.items():
            if name.startswith(f"{PACKAGE}.{part}"):
                assert not [t for t in targets if t.startswith(f"{PACKAGE}.{other}")], name


def test_no_class_in_the_scheduler_is_held_together_by_stubs() -> None:
    for path in ROOT.rglob("*.py"):
        assert "NotImplementedError" not in path.read_text(), path
