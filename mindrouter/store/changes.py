"""What an import changes: the pool's export before it against the export after it, entry by entry.

An import describes each entry whole (a field it leaves out takes its default), so a file can remove
a quota or lower a ``max_concurrent`` without saying so; ``mr import --dry-run`` lists these changes
before anything is written, and ``mr import`` lists what it did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Change", "describe", "describe_field", "pool_changes"]

Change = dict[str, Any]
"""``{"kind", "name", "field", "before", "after"}``: ``field`` None for a new entry (``after`` its settings)."""

_KINDS = (("groups", "group"), ("users", "user"), ("backends", "backend"), ("aliases", "model alias"))
_NOT_SETTINGS = frozenset({"name", "id"})


def pool_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """The changes from one ``Store.export()`` to another, in the export's order (groups, users, backends).

    An entry that is only in ``before`` is not reported: an import removes nothing.
    """
    changes: list[Change] = []
    for section, kind in _KINDS:
        old = {row["name"]: row for row in before.get(section, ())}
        for row in after.get(section, ()):
            name = row["name"]
            settings = {k: v for k, v in row.items() if k not in _NOT_SETTINGS}
            if name not in old:
                changes.append({"kind": kind, "name": name, "field": None, "before": None, "after": settings})
                continue
            was = old[name]
            for field in sorted((settings.keys() | was.keys()) - _NOT_SETTINGS):
                if was.get(field) != settings.get(field):
                    changes.append(
                        {"kind": kind, "name": name, "field": field, "before": was.get(field), "after": row.get(field)}
                    )
    return changes


def _value(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def describe_field(field: str, before: Any, after: Any) -> str:
    """One setting's change: ``max_concurrent 6 → 8``, ``tokens_per_day 500000 → not set``."""
    return f"{field} {_value(before)} → {_value(after)}"


def describe(change: Mapping[str, Any]) -> str:
    """One change as a line: ``backend ws2: max_concurrent 6 → 8``, ``group phd: new (scheduler_weight 2.5)``."""
    head = f"{change['kind']} {change['name']}"
    if change.get("field") is None:
        settings = change.get("after") or {}
        return f"{head}: new ({', '.join(f'{k} {_value(v)}' for k, v in settings.items())})"
    return f"{head}: {describe_field(change['field'], change.get('before'), change.get('after'))}"
