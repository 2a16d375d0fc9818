"""``mr export`` and ``mr import FILE.toml``: move a pool's setup to another machine.

The file holds groups, users (never their keys) and backends. ``import``
checks every entry here, with the same rules as ``mr group add`` and friends,
before the daemon applies the whole file at once or nothing of it. Read-only
columns that a listing would show (in-flight counts, health, ...) are
accepted and dropped, so a file written by ``mr export`` of any version, or
assembled from ``--json`` listings, imports cleanly; any other key is refused
as a probable typo. The keys an entry may set are the store's
(``store.IMPORT_FIELDS``), so every key ``mr export`` writes imports.
"""

from __future__ import annotations

import json as jsonlib
import sys
import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import tomli_w
import typer
from rich.markup import escape
from rich.text import Text

from .. import __version__ as VERSION
from ..errors import MindRouterError, UsageError
from ..store import IMPORT_FIELDS, QUOTA_FIELDS, describe
from . import _validate
from ._app import ConfigOption, JsonOption, get_app
from ._output import console, print_json

__all__ = ["normalize", "register", "to_toml"]

#: Keys each kind of entry may set (the daemon's import shape, docs/admin-api.md).
SETTABLE = {kind: allowed for kind, (_, allowed, _) in IMPORT_FIELDS.items()}
#: Keys a listing shows that cannot be set; accepted and dropped. A user's
#: ``weight`` is the effective one (from the group unless overridden), so it is
#: never read as an override.
READ_ONLY = {
    "groups": {"users", "id", "quotas"},
    "users": {"weight", "keys", "queued", "running", "recent_tokens", "id", "quotas"},
    "backends": {
        "id",
        "status",
        "healthy",
        "in_flight",
        "models",
        "loaded_models",
        "latency_ema",
        "tokens_per_second",
        "error",
        "utilization",
        "vram_free",
        "vram_total",
        "waiting",
        "completed",
        "failed",
    },
}
#: Other names for a settable key (``mr group add`` says ``--weight``).
ALIASES = {"groups": {"weight": "scheduler_weight"}, "users": {}, "backends": {}}
#: Backend states an import may set.
STATES = ("enabled", "draining", "disabled")


def _entry(kind: str, index: int, raw: Any) -> dict[str, Any]:
    where = f"{kind}[{index}]"
    if not isinstance(raw, dict):
        raise UsageError(f"{where} must be a table of keys, not {type(raw).__name__}")
    entry: dict[str, Any] = {}
    for key, value in raw.items():
        key = ALIASES[kind].get(key, key)
        if key in READ_ONLY[kind]:
            continue
        if key not in SETTABLE[kind]:
            raise UsageError(f"{where} has an unknown key {key!r}; the keys are {', '.join(sorted(SETTABLE[kind]))}")
        entry[key] = value
    name = entry.get("name")
    if not isinstance(name, str):
        raise UsageError(f"{where} needs a name")
    where = f"{kind[:-1]} {name!r}"
    _validate.name(name, kind[:-1])
    try:
        for key in QUOTA_FIELDS if kind != "backends" else ():
            if entry.get(key) is None:
                entry.pop(key, None)
            else:
                entry[key] = _validate.amount(str(entry[key]), f"{key}")
        if kind == "groups":
            if "scheduler_weight" not in entry:
                raise UsageError(f"{where} needs a weight, such as scheduler_weight = 2")
            entry["scheduler_weight"] = _validate.weight(entry["scheduler_weight"], where)
        elif kind == "users":
            if not isinstance(entry.get("group"), str):
                raise UsageError(f'{where} needs a group, such as group = "student"')
            if entry.get("weight_override") is None:
                entry.pop("weight_override", None)
            else:
                entry["weight_override"] = _validate.weight(entry["weight_override"], where)
        else:
            entry["url"] = _validate.url(str(entry.get("url", "")), f"{where} url")
            entry["engine"] = _validate.engine(entry.get("engine"))
            for key, check in (("max_concurrent", _validate.max_concurrent), ("priority", _validate.priority)):
                if entry.get(key) is not None:
                    entry[key] = check(str(entry[key]))
            for key in ("parallel", "max_loaded"):
                if entry.get(key) is not None:
                    entry[key] = _validate.slots(str(entry[key]), key)
            gpus = entry.get("gpus")
            if isinstance(gpus, list):
                entry["gpus"] = _validate.gpus(",".join(str(g) for g in gpus)) if gpus else []
            elif gpus is not None:
                entry["gpus"] = _validate.gpus(str(gpus))
            if entry.get("node"):
                entry["node"] = _validate.url(str(entry["node"]), f"{where} node")
            if entry.get("state") is not None and entry["state"] not in STATES:
                raise UsageError(f"{where} has state {entry['state']!r}; use one of {', '.join(STATES)}")
            entry = {k: v for k, v in entry.items() if v is not None and v != ""}
    except UsageError as exc:
        message = str(exc)
        raise UsageError(message if message.startswith(where) else f"{where}: {message}") from None
    return entry


def normalize(data: Any) -> dict[str, Any]:
    """Check a whole import file and return the body for ``POST /admin/import``.

    Raises:
        UsageError: the first problem found, naming the entry and the key.
    """
    if not isinstance(data, dict):
        raise UsageError("the file must hold tables named groups, users and backends")
    unknown = set(data) - set(SETTABLE) - {"version", "aliases"}
    if unknown:
        raise UsageError(
            f"unknown section {sorted(unknown)[0]!r}; an import file has groups, users, backends and aliases"
        )
    if data.get("version", 1) != 1:
        raise UsageError(f"the file has version {data.get('version')!r}; this mindrouter reads version 1")
    out: dict[str, Any] = {"version": 1}
    for kind in SETTABLE:
        items = data.get(kind, [])
        if not isinstance(items, list):
            raise UsageError(f"{kind} must be a list of tables ([[{kind}]] in TOML)")
        entries = [_entry(kind, i, raw) for i, raw in enumerate(items)]
        seen: set[str] = set()
        for entry in entries:
            if entry["name"] in seen:
                raise UsageError(f"{kind[:-1]} {entry['name']!r} appears twice; keep one entry for it")
            seen.add(entry["name"])
        out[kind] = entries
    if "aliases" in data:  # model aliases ([[aliases]] name, target): the daemon checks them
        out["aliases"] = data["aliases"]
    return out


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def to_toml(data: dict[str, Any]) -> str:
    """An export as TOML: each entry a ``[[groups]]``, ``[[users]]`` or ``[[backends]]`` table, so one can be
    added by hand below the others (tomli-w writes small tables as one inline array, which a ``[[groups]]``
    further down cannot extend); nulls, which TOML cannot hold, are left out."""
    header = (
        f"# mindrouter pool exported {time.strftime('%Y-%m-%d %H:%M:%S %z')} by mindrouter {VERSION}.\n"
        "# Groups, users (without their API keys) and backends; load it with `mr import FILE.toml`.\n\n"
    )
    text = header + tomli_w.dumps({"version": data.get("version", 1)})
    for kind in ("groups", "users", "backends", "aliases"):
        for entry in data.get(kind) or []:
            text += f"\n[[{kind}]]\n" + tomli_w.dumps(_drop_none(entry))
    return text


def _read(file: Path) -> Any:
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        if file.suffix.lower() == ".json":
            return jsonlib.loads(raw)
        return tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        kind = "JSON" if file.suffix.lower() == ".json" else "TOML"
        raise UsageError(f"{file} is not valid {kind}: {exc}") from None


def import_(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE.toml",
            help="A file written by `mr export` (TOML, or JSON when it ends in .json).",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="List each change the file would make to the daemon's pool; change nothing."),
    ] = False,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Load groups, users and backends from a file: all of it, or nothing if any entry is refused.

    Each entry is set whole, as the file has it: a quota or setting it leaves out is removed or takes
    its default. Groups, users and backends the file does not name are left alone. The changes made
    are listed (with --dry-run: the changes it would make). Users get no keys; create them with
    `mr user key NAME`.

    Example: mr import --dry-run lab.toml
    """
    body = normalize(_read(file))
    counts = {kind: len(body[kind]) for kind in SETTABLE}
    client = get_app(ctx, config).client
    answer: dict[str, Any] = client.post("/admin/import/dry-run" if dry_run else "/admin/import", body) or counts
    if json:
        print_json(answer)
        return
    verb = "would import" if dry_run else "imported"
    parts = [f"{answer.get(k, 0)} {k}" for k in ("groups", "users", "backends")]
    if answer.get("aliases"):
        parts.append(f"{answer['aliases']} model aliases")
    head = f"{verb} {', '.join(parts[:-1])} and {parts[-1]} from {file}"
    changes = answer.get("changes")
    if changes is None:  # a daemon that does not list them
        out = [head]
    elif not changes:
        out = [f"{head}; nothing {'would change' if dry_run else 'changed'}"]
    else:
        out = [f"{head}; {len(changes)} change{'s' if len(changes) != 1 else ''}:"]
        out += [f"  {describe(change)}" for change in changes]
    for line in out:
        console().print(Text(line))


def export(
    ctx: typer.Context,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout.", show_default=False),
    ] = None,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Print the pool's groups, users (without keys) and backends as TOML for `mr import`.

    Example: mr export -o lab.toml
    """
    data = get_app(ctx, config).client.get("/admin/export")
    text = (jsonlib.dumps(data, indent=2) + "\n") if json else to_toml(data)
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise MindRouterError(f"cannot write {output}: {exc.strerror or exc}") from exc
    console(stderr=True).print(f"wrote {escape(str(output))}")


def register(app: typer.Typer) -> None:
    app.command("import")(import_)
    app.command("export")(export)
