"""Rows read from the store: frozen values the daemon and the admin API pass around."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

QUOTA_FIELDS = ("tokens_per_day", "tokens_per_month", "requests_per_minute")

KEEP: Any = object()
"""For a setter whose None means "not set": leave this setting as it is."""


@dataclass(frozen=True, slots=True)
class Quota:
    """A user's or group's limits; None means no limit of that kind."""

    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    requests_per_minute: int | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, f) is not None for f in QUOTA_FIELDS)

    def to_dict(self) -> dict[str, int | None]:
        return {f: getattr(self, f) for f in QUOTA_FIELDS}


@dataclass(frozen=True, slots=True)
class Group:
    id: int
    name: str
    scheduler_weight: float
    quota: Quota = Quota()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scheduler_weight": self.scheduler_weight, **self.quota.to_dict()}


@dataclass(frozen=True, slots=True)
class User:
    id: int
    name: str
    group: str
    weight_override: float | None
    group_weight: float
    created: float
    """Wall-clock epoch seconds."""
    quota: Quota = Quota()
    proxy: bool = False
    """A front end whose requests may name the person they are for (``mr user set-proxy``)."""
    proxy_group: str | None = None
    """Where a proxy's people are created: this group, or the proxy's own when None."""
    person_from: str = "header"
    """For a proxy: where its requests name their person, ``header`` or ``user-field`` (``names.PERSON_FROM``)."""
    owner_id: int | None = None
    """For a person: the id of the proxy it was created through, the only one that may name it."""
    person_of: str | None = None
    """For a person: that proxy's name."""
    identity: str | None = None
    """For a person: the identity its proxy forwards (``names.person_identity``); the name is for showing."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "proxy", bool(self.proxy))  # SQLite hands back 0 or 1

    @property
    def weight(self) -> float:
        """The scheduler weight: the override if set, else the group's weight."""
        return self.group_weight if self.weight_override is None else self.weight_override

    @property
    def forwards_to(self) -> str | None:
        """The group a proxy's people go in; None for a user that is not a proxy."""
        return (self.proxy_group or self.group) if self.proxy else None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "group": self.group,
            "weight_override": self.weight_override,
            "weight": self.weight,
            **self.quota.to_dict(),
        }
        if self.proxy:
            out["proxy_for"] = self.forwards_to
            out["person_from"] = self.person_from
        if self.owner_id is not None:
            out["person_of"] = self.person_of
            out["identity"] = self.identity
        return out


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    """What may be shown about a key: never the key itself."""

    id: int
    user: str
    prefix: str
    created: float
    last_used: float | None = None
    """Wall-clock time of the key's last request, to within a minute; None if never used."""
    label: str = ""
    """What the admin named it for ("laptop"); empty if unnamed."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "label": self.label,
            "prefix": self.prefix,
            "created": self.created,
            "last_used": self.last_used,
        }


@dataclass(frozen=True, slots=True)
class BackendRow:
    id: int
    name: str
    url: str
    engine: str
    max_concurrent: int
    gpus: tuple[int, ...]
    node: str
    """URL of the ``mr agent`` that reports this backend's GPUs; empty for this machine."""
    priority: float
    state: str
    parallel: int | None = None
    """Requests each loaded model serves at once (Ollama's OLLAMA_NUM_PARALLEL), if the admin said."""
    max_loaded: int | None = None
    """Models the server keeps loaded at once (Ollama's OLLAMA_MAX_LOADED_MODELS), if the admin said."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "url": self.url,
            "engine": self.engine,
            "max_concurrent": self.max_concurrent,
            "gpus": list(self.gpus),
            "node": self.node,
            "priority": self.priority,
            "state": self.state,
            "parallel": self.parallel,
            "max_loaded": self.max_loaded,
        }


class UsageRow(NamedTuple):
    user_id: int
    prompt_tokens: int
    completion_tokens: int
    at: float
    model: str

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class UsageTotal:
    user_id: int
    user: str | None
    """None once the user has been removed."""
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "user": self.user,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens": self.tokens,
        }


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Usage totals grouped as asked (``Store.usage_report``)."""

    by: list[str]
    rows: list[dict[str, Any]]
    """One dict per group: a key per dimension, then requests, prompt_tokens, completion_tokens, gpu_seconds."""
    total: dict[str, Any]
    since: float
    """The start actually covered (earlier than asked where only daily totals were left)."""
    until: float
    day_resolution_before: float | None
    """Per-request rows before this time were rolled into daily totals; None when all are kept."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "rows": self.rows,
            "total": self.total,
            "since": self.since,
            "until": self.until,
            "day_resolution_before": self.day_resolution_before,
        }
