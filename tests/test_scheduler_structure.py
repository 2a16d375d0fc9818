"""The core's structure: two parts behind one facade, no import circle, no class held together by stubs.

Fairness (``scheduler/fairness/``: whose job goes next, and its charge) and
routing (``scheduler/routing/``: where it runs, and what answers teach) never
import each other; ``Scheduler`` composes them. Imports are read from the
source with ``ast``, those under ``if TYPE_CHECKING`` included, since a circle
there is a circle a reader must follow all the same.
"""

from __future__ import annotations

from pathlib import Path

import mindrouter.scheduler

from .importgraph import cycle, imports

ROOT = Path(mindrouter.scheduler.__file__).parent
PACKAGE = "mindrouter.scheduler"


def test_the_scheduler_has_no_import_circle() -> None:
    assert cycle(imports(mindrouter.scheduler)) is None


def test_the_cycle_check_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_fairness_and_routing_never_import_each_other() -> None:
    graph = imports(mindrouter.scheduler)
    for part, other in (("fairness", "routing"), ("routing", "fairness")):
        for name, targets in graph.items():
            if name.startswith(f"{PACKAGE}.{part}"):
                assert not [t for t in targets if t.startswith(f"{PACKAGE}.{other}")], name


def test_no_class_in_the_scheduler_is_held_together_by_stubs() -> None:
    for path in ROOT.rglob("*.py"):
        assert "NotImplementedError" not in path.read_text(), path
