"""The daemon's structure: sub-packages in layers, one composition root, a short way for a request.

``LAYERS`` lists ``daemon/``'s sub-packages from the top down; each imports only those below it,
imports under ``if TYPE_CHECKING`` included (a circle there is one a reader must follow all the
same). ``process/`` builds the app (``app.py``, the composition root) and runs it (``serve.py``);
``edge/`` holds the HTTP handlers, admission and the services bundle; ``usage/`` the quotas, the
counters and the usage rows; ``request/`` the lease and the dispatcher; ``pollers/`` what the daemon
learns in the background. ``request/`` and ``pollers/`` share the ground floor and never import each
other: the lease reaches the registry through a protocol (``request/ports.py``).

Before issue 29 all six sub-packages imported each other in one circle, ``process/appkeys.py``
imported every one of them, and the inference handler depended at run time on 22 of the daemon's modules.
"""

from __future__ import annotations

import re
from pathlib import Path

import mindrouter
import mindrouter.daemon

from .importgraph import cycle, imports, reach

ROOT = Path(mindrouter.daemon.__file__).parent
PACKAGE = "mindrouter.daemon"
LAYERS = [("__main__",), ("process",), ("ui",), ("admin",), ("edge",), ("usage",), ("request", "pollers")]
HANDLER = f"{PACKAGE}.edge.inference"
MOST_MODULES_ON_THE_WAY = 12


def part(module: str) -> str:
    """The sub-package (or top-level module) of ``daemon/`` that ``module`` belongs to."""
    return module.removeprefix(f"{PACKAGE}.").split(".")[0]


def floor(name: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if name in names)


def test_every_sub_package_has_its_floor() -> None:
    parts = {part(name) for name in imports(mindrouter.daemon) if name != PACKAGE}
    assert parts == {name for names in LAYERS for name in names}


def test_the_daemons_sub_packages_import_each_other_in_one_direction_only() -> None:
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in imports(mindrouter.daemon).items()
        if name != PACKAGE
        for target in targets
        if target != PACKAGE and part(target) != part(name) and floor(part(target)) <= floor(part(name))
    )
    assert upward == []


def test_no_import_circle_among_the_daemons_sub_packages_or_inside_them() -> None:
    graph = imports(mindrouter.daemon)
    parts: dict[str, set[str]] = {}
    for name, targets in graph.items():
        parts.setdefault(part(name), set()).update(part(t) for t in targets if part(t) != part(name))
    assert cycle(parts) is None
    assert cycle(graph) is None


def test_a_request_runs_from_the_handler_to_the_backend_through_at_most_12_of_the_daemons_modules() -> None:
    """What the inference handler imports at run time, directly or through others (the services are
    reached through the bundle, whose classes it names for the type checker only)."""
    graph = imports(mindrouter, typing=False)
    way = reach(graph, HANDLER)
    assert "mindrouter.backends.base" in way  # the adapter that speaks to the backend
    daemon_modules = sorted(m for m in way if m.startswith(f"{PACKAGE}."))
    assert f"{PACKAGE}.request.lease" in daemon_modules
    assert len(daemon_modules) <= MOST_MODULES_ON_THE_WAY, daemon_modules


def test_no_class_in_the_daemon_is_held_together_by_stubs_and_no_service_is_untyped() -> None:
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        assert "NotImplementedError" not in text, path
        assert not re.search(r"\bstore: Any\b", text), path
    for path in (ROOT / "request").glob("*.py"):  # the lease and its relay were one class cast across two files
        assert "cast(" not in path.read_text(), path
