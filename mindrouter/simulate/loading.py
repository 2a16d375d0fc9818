"""Scenario files: TOML in, validated frozen dataclasses (``scenario.py``) out.

The format is a contract other tools rely on (issue 2, item 3), so every key
is checked: an unknown key, a wrong type or an impossible value is refused
with one sentence that names the key, never silently defaulted. Keys beyond
the contract's are optional and documented in docs/simulate.md.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ..scheduler.settings import DEFAULT_GROUP_WEIGHTS, SchedulerSettings, ScoreWeights
from ._backends import BackendFields
from .scenario import EventSpec, Scenario, ScenarioError, UserSpec

__all__ = ["example_names", "load_example", "load_scenario", "parse_scenario"]


# -- reading ----------------------------------------------------------------

_EXAMPLES = "examples"


def example_names() -> list[str]:
    """Names of the scenarios shipped inside the package (for ``--example``)."""
    folder = resources.files(__package__).joinpath(_EXAMPLES)
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_example(name: str) -> Scenario:
    """Load a packaged example by name (``scenario3`` or ``scenario3.toml``)."""
    stem = name[: -len(".toml")] if name.endswith(".toml") else name
    names = example_names()
    if stem not in names:
        raise ScenarioError(f"there is no example scenario named {name!r}; the examples are {', '.join(names)}")
    text = resources.files(__package__).joinpath(_EXAMPLES, f"{stem}.toml").read_text(encoding="utf-8")
    return parse_scenario(text, source=f"example {stem}", name=stem)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"scenario file {file} does not exist; try `mr simulate --example scenario3`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"cannot read scenario file {file}: {exc}") from exc
    return parse_scenario(text, source=str(file), name=file.stem)


def parse_scenario(text: str, *, source: str = "scenario", name: str = "scenario") -> Scenario:
    """Validate TOML text into a Scenario; errors name ``source`` and the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source} is not valid TOML ({exc})") from exc
    return _Parser(source).scenario(data, name)


_TOP = {
    "duration",
    "seed",
    "name",
    "description",
    "groups",
    "models",
    "apps",
    "backends",
    "users",
    "events",
    "scheduler",
}
_USER = {
    "name",
    "group",
    "weight",
    "model",
    "concurrency",
    "rate",
    "prompt_tokens",
    "completion_tokens",
    "start",
    "stop",
    "max_tokens",
    "think_time",
    "requests",
    "stream",
    "leave_after",
    "json_mode",
    "app",
    "turns",
    "keep_alive",
    "num_ctx",
}
_EVENT = {"at", "user", "group", "weight", "clear"}
#: SchedulerSettings fields a scenario may not set ([groups] sets the weights; scores are a sub-table).
_SETTINGS_SKIP = {"group_weights", "scores"}
#: Settings that must be above zero, not merely at least zero.
_POSITIVE = {
    "fairness_window",
    "queue_timeout",
    "max_queued_per_user",
    "max_queued_per_proxy",
    "max_queued",
    "min_deprioritization",
    "default_decode_rate",
    "prefill_speedup",
    "default_load_bytes_per_second",
    "heavy_refresh_interval",
    "deficit_shift_threshold",
}


class _Parser(BackendFields):
    # -- sections ---------------------------------------------------------

    def scenario(self, data: dict[str, Any], default_name: str) -> Scenario:
        self.unknown("", data, _TOP)
        if "duration" not in data:
            raise self.fail("duration is missing; give the simulated seconds, such as duration = 3600")
        duration = self.number("duration", data["duration"], positive=True)
        seed = self.integer("seed", data.get("seed", 0), minimum=0)
        name = self.string("name", data["name"]) if "name" in data else default_name
        description = data.get("description", "")
        if not isinstance(description, str):
            raise self.fail(f"description must be a string, not {description!r}")

        groups = {}
        for group, weight in self.table("[groups]", data.get("groups", {})).items():
            groups[group] = self.number(f"groups.{group}", weight, positive=True)

        models = {m: self.model(m, raw) for m, raw in self.table("[models]", data.get("models", {})).items()}
        apps = {a: self.app(a, raw) for a, raw in self.table("[apps]", data.get("apps", {})).items()}
        raw_backends = data.get("backends")
        if not isinstance(raw_backends, list) or not raw_backends:
            raise self.fail(
                "[[backends]] is missing; add at least one backend with name, models, max_concurrent"
                " and tokens_per_second"
            )
        backends = tuple(self.backend(i, b, models) for i, b in enumerate(raw_backends))
        names = [b.name for b in backends]
        for b in backends:
            if names.count(b.name) > 1:
                raise self.fail(f"two backends are named {b.name!r}; give each a unique name")

        raw_users = data.get("users")
        if not isinstance(raw_users, list) or not raw_users:
            raise self.fail("[[users]] is missing; add at least one user with name, model and concurrency or rate")
        users = self.merge_phases([self.user(i, u) for i, u in enumerate(raw_users)], groups)
        for i, u in enumerate(users):
            if u.app is not None and u.app not in apps:
                known = ", ".join(sorted(apps)) or "none"
                raise self.fail(f"users[{i}] ({u.name}).app {u.app!r} is not under [apps] (the apps are {known})")
        served = {m for b in backends for m in b.models}
        for i, u in enumerate(users):
            if u.model not in served:
                raise self.fail(
                    f"users[{i}] ({u.name}).model {u.model!r} is served by no backend;"
                    f" the models are {', '.join(sorted(served))}"
                )
            if u.model in models and models[u.model].kind == "embedding":
                users = self.embedding_user(i, u, raw_users, users)
        raw_events = data.get("events", [])
        if not isinstance(raw_events, list):
            raise self.fail("events must be a list of [[events]] tables")
        events = tuple(sorted((self.event(i, e, users) for i, e in enumerate(raw_events)), key=lambda e: e.at))

        settings = self.settings(self.table("[scheduler]", data.get("scheduler", {})))
        settings = dataclasses.replace(settings, group_weights={**DEFAULT_GROUP_WEIGHTS, **groups})
        return Scenario(duration, seed, backends, users, settings, groups, name, description, events, models, apps)

    def app(self, name: str, raw: Any) -> int:
        """``[apps.NAME]``: a client app, its system prompt in tokens."""
        raw = self.table(f"[apps.{name}]", raw)
        self.unknown(f"apps.{name}.", raw, {"system_prompt"})
        return self.integer(f"apps.{name}.system_prompt", raw.get("system_prompt", 0), minimum=0)

    def embedding_user(
        self, index: int, user: UserSpec, raw: list[Any], users: tuple[UserSpec, ...]
    ) -> tuple[UserSpec, ...]:
        """An embedding request generates nothing: its completion is 0, and asking for more is an error."""
        entry = next(
            r for r in raw if isinstance(r, dict) and r.get("name") == user.name and r.get("model") == user.model
        )
        for key in ("completion_tokens", "max_tokens"):
            if key in entry:
                raise self.fail(
                    f"users[{index}] ({user.name}).{key} is set, but {user.model!r} is an embedding model,"
                    " whose requests generate no tokens; leave it out"
                )
        return tuple(dataclasses.replace(u, completion_tokens=(0, 0)) if u is user else u for u in users)

    def user(self, index: int, raw: Any) -> UserSpec:
        """One entry as written; ``merge_phases`` settles the weight of the user it belongs to."""
        where = f"users[{index}]"
        raw = self.table(where, raw)
        if "name" not in raw:
            raise self.fail(f"{where}.name is missing")
        name = self.string(f"{where}.name", raw["name"])
        where = f"users[{index}] ({name})"
        self.unknown(f"{where}.", raw, _USER)
        if "model" not in raw:
            raise self.fail(f"{where}.model is missing")
        group = self.string(f"{where}.group", raw["group"]) if "group" in raw else None
        override = self.number(f"{where}.weight", raw["weight"], positive=True) if "weight" in raw else None
        if ("concurrency" in raw) == ("rate" in raw):
            raise self.fail(f"{where} must set exactly one of concurrency (closed loop) or rate (open loop)")
        concurrency = self.integer(f"{where}.concurrency", raw["concurrency"]) if "concurrency" in raw else None
        rate = self.number(f"{where}.rate", raw["rate"], positive=True) if "rate" in raw else None
        converses = "turns" in raw or "app" in raw
        if "think_time" in raw and rate is not None and not converses:
            raise self.fail(
                f"{where}.think_time only applies to a closed-loop user (concurrency) or to conversations (turns),"
                " not to single requests at a rate"
            )
        start = self.number(f"{where}.start", raw.get("start", 0.0))
        stop = self.number(f"{where}.stop", raw["stop"]) if "stop" in raw else None
        if stop is not None and stop <= start:
            raise self.fail(f"{where}.stop ({stop:g}) must be after start ({start:g})")
        return UserSpec(
            name=name,
            group=group,
            weight=override or 1.0,
            weight_override=override,
            model=self.string(f"{where}.model", raw["model"]),
            concurrency=concurrency,
            rate=rate,
            prompt_tokens=self.tokens(f"{where}.prompt_tokens", raw.get("prompt_tokens", 200)),
            completion_tokens=self.tokens(f"{where}.completion_tokens", raw.get("completion_tokens", 300)),
            start=start,
            stop=stop,
            max_tokens=self.integer(f"{where}.max_tokens", raw["max_tokens"]) if "max_tokens" in raw else None,
            think_time=self.seconds(f"{where}.think_time", raw.get("think_time", 0.0)),
            requests=self.integer(f"{where}.requests", raw["requests"]) if "requests" in raw else None,
            stream=self.boolean(f"{where}.stream", raw.get("stream", True)),
            leave_after=self.integer(f"{where}.leave_after", raw["leave_after"]) if "leave_after" in raw else None,
            json_mode=self.boolean(f"{where}.json_mode", raw.get("json_mode", False)),
            app=self.string(f"{where}.app", raw["app"]) if "app" in raw else None,
            turns=self.tokens(f"{where}.turns", raw.get("turns", 1), minimum=1),
            keep_alive=self.number(f"{where}.keep_alive", raw["keep_alive"], minimum=-math.inf)
            if "keep_alive" in raw
            else None,
            num_ctx=self.integer(f"{where}.num_ctx", raw["num_ctx"], minimum=4) if "num_ctx" in raw else None,
        )

    def merge_phases(self, entries: list[UserSpec], groups: Mapping[str, float]) -> tuple[UserSpec, ...]:
        """Entries with one name are one user: give every phase that user's group and weight."""
        accounts: dict[str, tuple[str | None, float | None]] = {}
        for i, entry in enumerate(entries):
            group, override = accounts.get(entry.name, (None, None))
            for key, mine, theirs in (("group", entry.group, group), ("weight", entry.weight_override, override)):
                if mine is not None and theirs is not None and mine != theirs:
                    raise self.fail(
                        f"users[{i}] ({entry.name}).{key} is {mine!r} but an earlier entry of {entry.name!r} says"
                        f" {theirs!r}; entries with one name are one user, with one {key}"
                    )
            accounts[entry.name] = (group or entry.group, override or entry.weight_override)
        out = []
        for i, entry in enumerate(entries):
            group, override = accounts[entry.name]
            if override is not None:
                weight = override
            elif group is None:
                weight = 1.0
            elif group in groups:
                weight = groups[group]
            elif group in DEFAULT_GROUP_WEIGHTS:
                weight = DEFAULT_GROUP_WEIGHTS[group]
            else:
                raise self.fail(
                    f"users[{i}] ({entry.name}).group {group!r} has no weight;"
                    " add it under [groups] or give the user a weight"
                )
            out.append(dataclasses.replace(entry, group=group, weight=weight, weight_override=override))
        return tuple(out)

    def event(self, index: int, raw: Any, users: tuple[UserSpec, ...]) -> EventSpec:
        where = f"events[{index}]"
        raw = self.table(where, raw)
        self.unknown(f"{where}.", raw, _EVENT)
        if "at" not in raw:
            raise self.fail(f"{where}.at is missing; give the second the change happens, such as at = 1800")
        at = self.number(f"{where}.at", raw["at"])
        if ("user" in raw) == ("group" in raw):
            raise self.fail(f"{where} must name exactly one of user or group")
        clear = raw.get("clear", False)
        if not isinstance(clear, bool):
            raise self.fail(f"{where}.clear must be true or false, not {clear!r}")
        if clear == ("weight" in raw):
            raise self.fail(f"{where} must set exactly one of weight or clear = true")
        user = group = None
        if "user" in raw:
            user = self.string(f"{where}.user", raw["user"])
            if user not in {u.name for u in users}:
                raise self.fail(f"{where}.user {user!r} is not one of the [[users]]")
        else:
            group = self.string(f"{where}.group", raw["group"])
            if clear:
                raise self.fail(f"{where}.clear applies to a user's own weight; give the group a weight instead")
            if group not in {u.group for u in users}:
                raise self.fail(f"{where}.group {group!r} has no user in it; give one of the [[users]] that group")
        weight = None if clear else self.number(f"{where}.weight", raw["weight"], positive=True)
        return EventSpec(at=at, user=user, group=group, weight=weight, clear=clear)

    def settings(self, raw: dict[str, Any]) -> SchedulerSettings:
        """[scheduler] overrides SchedulerSettings fields by name; [scheduler.scores] the score weights."""
        fields = {f.name: f for f in dataclasses.fields(SchedulerSettings) if f.name not in _SETTINGS_SKIP}
        raw = dict(raw)
        scores_raw = self.table("[scheduler.scores]", raw.pop("scores", {}))
        self.unknown("[scheduler] ", raw, set(fields) | {"scores"})
        defaults = SchedulerSettings()
        changes: dict[str, Any] = {}
        for key, value in raw.items():
            default = getattr(defaults, key)
            label = f"[scheduler] {key}"
            if isinstance(default, str):
                if not isinstance(value, str):
                    raise self.fail(f"{label} must be a string, not {value!r}")
                changes[key] = value
            elif isinstance(default, int) and not isinstance(default, float):
                changes[key] = self.integer(label, value, minimum=1 if key in _POSITIVE else 0)
            else:
                changes[key] = self.number(label, value, positive=key in _POSITIVE)
        if changes.get("min_deprioritization", 0.0) > 1:
            raise self.fail("[scheduler] min_deprioritization must be at most 1, the factor of a user who is not heavy")
        score_fields = {f.name for f in dataclasses.fields(ScoreWeights)}
        self.unknown("[scheduler.scores] ", scores_raw, score_fields)
        scores = ScoreWeights(
            **{k: self.number(f"[scheduler.scores] {k}", v, minimum=-math.inf) for k, v in scores_raw.items()}
        )
        try:
            return dataclasses.replace(defaults, scores=scores, **changes)
        except ValueError as exc:  # SchedulerSettings checks its own values (shares)
            raise self.fail(f"[scheduler] {exc}") from None
