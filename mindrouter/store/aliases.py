"""Model aliases in the store: a name that is another name of a model the pool serves (``mr model alias``).

A vLLM server names a model by its Hugging Face id and Ollama by its own tag; an
alias makes them one model, so the two servers form one pool and a client may
ask for either name. One level only: a target is never itself an alias, so a
name resolves in one step.
"""

from __future__ import annotations

import sqlite3

from .errors import InvalidValue, NotFound

__all__ = ["Aliases", "check_alias"]


def _model_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 256 or not value.isprintable():
        raise InvalidValue(f"the {what} must be a model name of 1 to 256 printable characters, such as llama3.1:8b")
    return value.strip().removesuffix(":latest")


def check_alias(name: object, target: object, aliases: dict[str, str]) -> tuple[str, str]:
    """``(name, target)`` made canonical, or InvalidValue naming what is wrong, given the ``aliases`` there are."""
    alias, model = _model_name("alias", name), _model_name("target", target)
    if alias == model:
        raise InvalidValue(f"{alias!r} cannot be an alias of itself; give another model's name as the target")
    if model in aliases:
        raise InvalidValue(
            f"{model!r} is itself an alias of {aliases[model]!r}; make {alias!r} an alias of {aliases[model]!r}"
        )
    if alias in aliases.values():
        raise InvalidValue(f"{alias!r} is the target of other aliases; remove those first (`mr model aliases`)")
    return alias, model


class Aliases:
    """The alias half of ``Store``; it shares the store's connection."""

    _db: sqlite3.Connection

    def list_aliases(self) -> dict[str, str]:
        """Every alias and the model it names, by alias."""
        return dict(self._db.execute("SELECT name, target FROM model_aliases ORDER BY name"))

    def set_alias(self, name: object, target: object) -> tuple[str, str]:
        """Make ``name`` another name of ``target`` (replacing what it named); returns both as stored."""
        current = self.list_aliases()
        current.pop(str(name), None)
        alias, model = check_alias(name, target, current)
        self._db.execute(
            "INSERT INTO model_aliases (name, target) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET target = excluded.target",
            (alias, model),
        )
        return alias, model

    def import_aliases(self, entries: object) -> int:
        """Set every alias of an import's ``aliases`` list (tables of ``name`` and ``target``); how many.

        All are checked before any is written; the caller holds the import's transaction.
        """
        if not isinstance(entries, list):
            raise InvalidValue("the import data's aliases must be a list of tables with name and target")
        aliases = self.list_aliases()
        checked = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or set(entry) != {"name", "target"}:
                raise InvalidValue(f"aliases[{i}] must be a table with exactly name and target")
            aliases.pop(str(entry["name"]), None)
            try:
                alias, model = check_alias(entry["name"], entry["target"], aliases)
            except InvalidValue as exc:
                raise InvalidValue(f"aliases[{i}]: {exc}") from None
            aliases[alias] = model
            checked.append((alias, model))
        for alias, model in checked:
            self._db.execute(
                "INSERT INTO model_aliases (name, target) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET target = excluded.target",
                (alias, model),
            )
        return len(checked)

    def remove_alias(self, name: str) -> None:
        gone = self._db.execute("DELETE FROM model_aliases WHERE name = ?", (name.removesuffix(":latest"),))
        if not gone.rowcount:
            raise NotFound(f"there is no model alias {name!r}; see them with `mr model aliases`")
