"""Settings: defaults < config.toml < environment < command-line flags, as one typed object.

The file is found at ``--config``, else ``$MR_CONFIG``, else platformdirs' user
config dir. Keys are exactly those of config.example.toml; an unknown key or a
value of the wrong type is refused with a sentence naming the key, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from .errors import ConfigError
from .scheduler.settings import DEFAULT_GROUP_WEIGHTS, SHARES, SchedulerSettings, ScoreWeights

__all__ = [
    "BackendSettings",
    "Config",
    "ServerSettings",
    "StoreSettings",
    "check_keys",
    "config_path",
    "default_socket_path",
    "default_state_dir",
    "load_config",
]

APP = "mindrouter"


def default_state_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP))


def default_socket_path() -> Path:
    # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to /tmp/runtime-$UID,
    # which is the right place for us; the warning would print on every `mr` call.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Path(platformdirs.user_runtime_dir(APP)) / "mr.sock"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    """Address the inference API (OpenAI- and Ollama-compatible) listens on; 0.0.0.0 for the whole lab network."""
    port: int = 8484
    """TCP port of the inference API."""
    socket: str = ""
    """Unix socket for the admin API; empty means platformdirs' user runtime dir."""
    socket_group: str = ""
    """When set, the admin socket is mode 0660 with this group, so its members can run `mr`; else 0600."""
    state_dir: str = ""
    """Folder of the SQLite state; empty means platformdirs' user data dir."""
    admin_key: str = ""
    """When set (at least 16 characters), admin calls are also accepted on TCP with this key."""
    metrics_key: str = ""
    """Key (at least 16 characters) a Prometheus scraper sends to see per-user series in /metrics (the admin
    key works too)."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted, in bytes; a larger one gets 413."""
    header_timeout: float = 15.0
    """Seconds a client has to send a request's headers after connecting or after its last answer (slow-loris)."""
    body_timeout: float = 60.0
    """Seconds a client has to send a request's whole body once its headers are in; 408 after that."""
    shutdown_grace_seconds: float = 30.0
    """Seconds running requests may finish after a stop signal."""
    log_level: str = "info"
    """debug, info, warning or error (debug adds an access log line per request)."""
    discover: bool = True
    """On first start with no backend, look for Ollama and OpenAI-compatible servers on this machine."""
    gpu_poll_interval: float = 5.0
    """Seconds between readings of the local GPUs (NVML) and of `mr agent` nodes."""
    agent_key: str = ""
    """Key the daemon sends to the `mr agent` of other workstations (`mr agent --key`)."""
    decision_retention_days: float = 7.0
    """Days decision records (`mr why`, `mr decisions`) are kept; each local day's go at once when it is that old."""
    decision_retention: int = 0
    """The most decision records kept, the oldest deleted first, to bound the disk at a peak (0: no cap)."""
    usage_retention_days: float = 30.0
    """Days per-request usage rows are kept; older ones live on as daily totals, which reports read."""
    cors_origins: str = ""
    """Comma-separated web origins whose pages may call the inference API from the browser (CORS), "*" for any."""
    new_people_per_hour: int = 100
    """People one proxy (`mr user set-proxy`) may add in an hour; past it, a request naming a new one gets 429."""

    @property
    def socket_path(self) -> Path:
        return Path(self.socket) if self.socket else default_socket_path()

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) if self.state_dir else default_state_dir()


@dataclass(frozen=True, slots=True)
class BackendSettings:
    poll_interval: float = 10.0
    """Seconds between health and model probes of each backend."""
    connect_timeout: float = 5.0
    """Seconds to wait for a backend to accept a connection."""
    first_byte_timeout: float = 60.0
    """Seconds a backend with the model loaded may take to start a streamed answer (its first chunk,
    the prompt's prefill included) before the attempt fails over; a hung backend holds a stream no longer."""
    load_timeout: float = 180.0
    """Seconds added to first_byte_timeout when the backend's last probe did not list the model as
    loaded: Ollama sends nothing while it loads one (a 70B model at 4 bits, about 40 GB, in 180 s is
    220 MB/s, a SATA disk's pace)."""
    chunk_timeout: float = 60.0
    """Seconds of silence allowed between two chunks of a streamed answer before it is cut with the
    dialect's error ending and charged for what was delivered (Ollama sends a tool call only once it is
    whole: raise this for long tool calls on slow machines)."""
    stream_timeout: float = 3600.0
    """Seconds a streamed answer may run in all before it is cut (and charged for what was delivered);
    0 for no limit."""
    max_line_bytes: int = 8388608
    """Bytes one line (event) of a streamed answer may hold before the stream is cut (8 MiB)."""
    max_answer_bytes: int = 268435456
    """Bytes a whole (non-streamed) answer may hold; a longer one is not read (256 MiB). One with max_tokens
    is held to what that many tokens can take (backends/events.py: answer_bytes)."""
    max_held_answer_bytes: int = 268435456
    """Bytes all whole answers may hold together while they are read and written (256 MiB): past it, the
    largest still being read is cut and its client gets a 503, so backends cannot grow the daemon."""
    request_timeout: float = 600.0
    """Seconds a backend may take to finish one non-streaming request."""
    max_retries: int = 2
    """Other backends tried when one fails before its first byte (never the same one twice)."""
    probe_failures: int = 2
    """Failed health probes in a row that take a backend out; one bad probe does not."""
    circuit_failures: int = 3
    """Failures (failed probes, requests whose connection failed, and timeouts and 5xx answers once
    more than one user's requests meet them) within circuit_window seconds that open a backend's
    circuit, holding it out even if it keeps coming back. A "not supported" answer never counts."""
    circuit_window: float = 60.0
    """Seconds within which circuit_failures failures open the circuit."""
    circuit_cooldown: float = 30.0
    """Seconds an open circuit waits before a successful probe may close it again."""
    reprobe_interval: float = 0.5
    """Seconds before the first new probe of a backend that is down, doubling up to poll_interval,
    so one that recovers is back within about a second."""
    takeover_hold_seconds: float = 60.0
    """Seconds a router that takes over the leadership (``[store] url``) keeps busy, on a backend without
    load gauges (Ollama, plain OpenAI-compatible), the slots the old leader's streams held there, which
    may still be generating: about one long generation. Backends with gauges (vLLM, llama-server) are
    freed as their gauges show. 0 frees them at once."""


MIN_KEY_LENGTH = 16
"""The fewest characters of an ``admin_key`` or ``metrics_key`` that ``mr serve`` starts with: a shorter one
could be guessed over the network, even at the pace wrong keys are allowed (daemon/edge/guesses.py)."""


def check_keys(server: ServerSettings) -> None:
    """Refuse a key too short to resist guessing.

    Raises:
        ConfigError: ``admin_key`` or ``metrics_key`` is set and shorter than ``MIN_KEY_LENGTH``.
    """
    for name in ("admin_key", "metrics_key"):
        value = getattr(server, name)
        if value and len(value) < MIN_KEY_LENGTH:
            raise ConfigError(
                f"[server] {name} is {len(value)} characters, too few to resist guessing; set one of at least "
                f"{MIN_KEY_LENGTH}, such as what `python3 -c 'import secrets; print(secrets.token_urlsafe(24))'` prints"
            )


@dataclass(frozen=True, slots=True)
class StoreSettings:
    url: str = ""
    """Where durable state lives: empty for SQLite in state_dir; postgresql://USER@HOST:PORT/DB (or
    ?host=/socket/dir) for a PostgreSQL database that several `mr serve` share, one leading and the
    others standing by (docs/scale.md; needs mindrouter[postgres])."""

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                f"[store] url {self.url!r} is not a PostgreSQL url; write postgresql://USER@HOST:PORT/DB, "
                "or leave it empty for SQLite in state_dir"
            )


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerSettings = field(default_factory=ServerSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    backends: BackendSettings = field(default_factory=BackendSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    path: Path | None = None
    """The file these settings were read from, if any."""


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the config file is (it need not exist)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("MR_CONFIG")
    if env:
        return Path(env)
    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


#: Settings that are unset (None) by default and take a number of at least 0 when set.
_OPTIONAL_NUMBERS = frozenset({"return_credit", "return_debt", "max_slot_share"})


def _coerce(section: str, key: str, value: Any, default: Any) -> Any:
    name = f"[{section}] {key}"
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
            return value.lower() in {"1", "true", "yes", "on"}
        raise ConfigError(f"{name} must be true or false, not {value!r}")
    if isinstance(default, int) and not isinstance(default, bool):
        try:
            whole = int(value) if not isinstance(value, float) or value.is_integer() else None
        except (TypeError, ValueError):
            whole = None
        if whole is None or isinstance(value, bool):
            raise ConfigError(f"{name} must be a whole number, not {value!r}")
        return whole
    if isinstance(default, float) or (default is None and key in _OPTIONAL_NUMBERS):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a number, not {value!r}") from None
        if isinstance(value, bool) or not math.isfinite(number) or number < 0:
            raise ConfigError(f"{name} must be a finite number of at least 0, not {value!r}")
        return number
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, not {value!r}")
        return value
    raise ConfigError(f"{name} cannot be set")  # pragma: no cover - every field has a simple type


def _merge(section: str, obj: Any, values: Mapping[str, Any], skip: frozenset[str] = frozenset()) -> Any:
    known = {f.name: f for f in dataclasses.fields(obj) if f.name not in skip}
    changes = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting [{section}] {key}; see config.example.toml for the keys")
        changes[key] = _coerce(section, key, value, getattr(obj, key))
    try:
        return dataclasses.replace(obj, **changes)
    except ValueError as exc:  # the settings check their own values together (token costs)
        raise ConfigError(f"[{section}] {exc}") from None


_ENV_SCORES = {f"SCHEDULER_SCORE_{f.name.upper()}": f.name for f in dataclasses.fields(ScoreWeights)}
_ENV_SCHEDULER = {
    "SCHEDULER_FAIRNESS_WINDOW": "fairness_window",
    "SCHEDULER_DEPRIORITIZE_THRESHOLD": "deprioritize_threshold",
}


_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def _toml_error(file: Path, exc: tomllib.TOMLDecodeError) -> str:
    """Where the file breaks TOML and how: fixing that line keeps every other setting (``init --force`` would not)."""
    message = str(exc)
    at = _AT.search(message)
    where = f" at line {at[1]}, column {at[2]}" if at else ""
    what = message[: at.start()] if at else message
    what = what[:1].lower() + what[1:]
    return f"config file {file} is not valid TOML{where} ({what}); fix that line (the other settings stay as they are)"


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    must_exist: bool = False,
) -> Config:
    """Read the settings.

    Args:
        path: the config file; defaults to ``config_path()``. A missing file is
            fine (defaults apply) unless ``must_exist``.
        environ: environment to read ``SCHEDULER_*`` from. Defaults to os.environ.
        overrides: ``[server]`` values from command-line flags (host, port, socket).

    Raises:
        ConfigError: unreadable file, unknown key or bad value.
    """
    environ = os.environ if environ is None else environ
    file = config_path(path)
    data: dict[str, Any] = {}
    if file.exists():
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {file}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(_toml_error(file, exc)) from exc
    elif path is None and os.environ.get("MR_CONFIG"):  # as config_path() found it
        raise ConfigError(
            f"MR_CONFIG names {file}, which does not exist; correct MR_CONFIG, or create the file with `mr config init`"
        )
    elif must_exist:
        raise ConfigError(f"config file {file} does not exist; create it with `mr config init`")

    for section in data:
        if section not in {"server", "scheduler", "backends", "store"}:
            raise ConfigError(
                f"unknown section [{section}] in {file}; the sections are [server], [scheduler], [backends] and [store]"
            )
        if not isinstance(data[section], dict):
            raise ConfigError(f"[{section}] in {file} must be a table")

    server = _merge("server", ServerSettings(), data.get("server", {}))
    sched_data = dict(data.get("scheduler", {}))
    score_data = sched_data.pop("scores", {})
    if not isinstance(score_data, dict):
        raise ConfigError(f"[scheduler.scores] in {file} must be a table")
    if sched_data.get("shares", "user") not in SHARES:
        raise ConfigError(f'[scheduler] shares in {file} must be "user" or "group", not {sched_data["shares"]!r}')
    scheduler = _merge("scheduler", SchedulerSettings(), sched_data, skip=frozenset({"scores", "group_weights"}))
    scores = _merge("scheduler.scores", ScoreWeights(), score_data)
    backends = _merge("backends", BackendSettings(), data.get("backends", {}))
    store = _merge("store", StoreSettings(), data.get("store", {}))

    # Environment (the seed's names) over the file.
    env_sched = {attr: environ[name] for name, attr in _ENV_SCHEDULER.items() if name in environ}
    scheduler = _merge("scheduler", scheduler, env_sched, skip=frozenset({"scores", "group_weights"}))
    env_scores = {attr: environ[name] for name, attr in _ENV_SCORES.items() if name in environ}
    scores = _merge("scheduler.scores", scores, env_scores)
    group_weights = dict(DEFAULT_GROUP_WEIGHTS)
    for name, value in environ.items():
        if name.startswith("SCHEDULER_WEIGHT_") and len(name) > len("SCHEDULER_WEIGHT_"):
            from .scheduler.settings import check_weight

            try:
                group_weights[name[len("SCHEDULER_WEIGHT_") :].lower()] = check_weight(value)
            except ValueError as exc:
                raise ConfigError(f"environment variable {name}: {exc}") from None
    scheduler = dataclasses.replace(scheduler, scores=scores, group_weights=group_weights)

    if overrides:
        server = _merge("server", server, {k: v for k, v in overrides.items() if v is not None})
    return Config(
        server=server, scheduler=scheduler, backends=backends, store=store, path=file if file.exists() else None
    )
