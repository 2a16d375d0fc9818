"""One source for the rules that the CLI, the store, the backends and auth all apply.

Pure functions, no I/O: the engines mindrouter speaks to, what a name may be,
what a backend URL may be and when two URLs are the same server, and how an
API key is made and hashed. Each check raises ``ValueError`` with one sentence;
callers turn it into their own error type (``UsageError`` in the CLI,
``InvalidValue`` in the store) so the wording is the same everywhere.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import secrets
from urllib.parse import urlsplit

__all__ = [
    "ENGINES",
    "KEY_PREFIX",
    "LOOPBACK_HOSTS",
    "PERSON_FROM",
    "STALLING_ENGINES",
    "check_name",
    "check_url",
    "hash_key",
    "is_loopback",
    "is_this_machine",
    "key_label",
    "new_key",
    "person_identity",
    "person_name",
    "same_server",
    "server_identity",
]

#: The backend engines mindrouter has adapters for, in the order help texts list them.
ENGINES = ("ollama", "vllm", "llamacpp", "openai")

#: Engines whose steps read a prompt's chunk beside one token of each decoding stream, so a prompt being read
#: stalls them (``Backend.prefill_stalls``): vLLM's chunked prefill, on by default since its V1 engine, and
#: llama-server's steps (measured: benchmarks/bench_prefill_stall.py). Ollama's runner builds its steps so too,
#: not taken so yet (docs/performance.md, "Prefill beside decode on a real llama-server").
STALLING_ENGINES = frozenset({"vllm", "llamacpp"})

#: Group, user and backend names: 1 to 64 letters, digits and ``. _ - @ +``, starting with a letter or digit.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}\Z")

#: Where a proxy's requests name their person: forwarding headers (the default) or OpenAI's ``user`` body field.
PERSON_FROM = ("header", "user-field")

#: The longest forwarded identity a person may have, in characters.
_MAX_IDENTITY = 256
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9._@+-]+")

#: Every key starts so, so a key pasted in the wrong place is recognisable.
KEY_PREFIX = "mr-"

#: Host names that mean this machine.
LOOPBACK_HOSTS = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})

_DEFAULT_PORTS = {"http": 80, "https": 443}


def check_name(kind: str, value: object) -> str:
    """``value`` if it is a valid name for a ``kind`` (group, user, backend)."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"{kind} name {value!r} is not valid; use 1 to 64 letters, digits, '.', '_', '-', "
            "'@' or '+', starting with a letter or digit"
        )
    return value


def person_identity(raw: object) -> str | None:
    """The identity a proxy forwarded, exactly as sent but for surrounding spaces; None if it cannot be one.

    An e-mail address (anything with an ``@``) is case-folded, since mail systems treat it so; nothing
    else is rewritten, so two different identities never become one person. Empty, overlong
    (:data:`_MAX_IDENTITY`), control characters or text that is not valid Unicode give None.
    """
    if not isinstance(raw, str):
        return None
    identity = raw.strip()
    if not identity or len(identity) > _MAX_IDENTITY or any(c < " " or "\x7f" <= c <= "\x9f" for c in identity):
        return None
    try:
        identity.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a JSON body
        return None
    return identity.lower() if "@" in identity else identity


def person_name(identity: str) -> str:
    """A user name (``check_name``'s pattern) to show for a person; the identity stays the key.

    An identity that is a valid name is its own name; any other is cleaned (other characters turned
    into ``-``, a leading ``._@+-`` dropped) and ends in four hex digits of its hash, so the cleaned
    forms of two identities differ and do not take the name of an identity that needed no cleaning.
    """
    if _NAME.match(identity):
        return identity
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()
    cleaned = _NOT_IN_NAMES.sub("-", identity).lstrip("._@+-")[:59].rstrip("-")
    return f"{cleaned}-{digest[:4]}" if cleaned else f"person-{digest[:8]}"


def check_url(value: object, what: str = "URL") -> str:
    """An http(s) URL with a host, stripped of spaces and trailing slashes.

    Raises:
        ValueError: another scheme (``file:``, ``unix:``...), no host, spaces or a bad port.
    """
    example = "write it like http://ws3.lab:11434"
    if not isinstance(value, str) or any(c.isspace() for c in value.strip()):
        raise ValueError(f"{what} {value!r} is not an http(s) URL with a host; {example}")
    text = value.strip()
    parts = urlsplit(text)
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{what} {value!r} is not an http(s) URL with a host; {example}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{what} {value!r} has a port that is not a number from 1 to 65535")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{what} {value!r} carries a query, fragment or password; {example}")
    return text.rstrip("/")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether a listener on ``host`` is reachable from this machine only (``localhost``, ``127.x``, ``::1``)."""
    address = _address(host)
    return host.lower() in LOOPBACK_HOSTS if address is None else address.is_loopback


def is_this_machine(host: str) -> bool:
    """Whether connecting to ``host`` reaches this machine: loopback, or ``0.0.0.0`` used as a target."""
    address = _address(host)
    return is_loopback(host) or (address is not None and address.is_unspecified)


def server_identity(url: str) -> tuple[str, int, str]:
    """What makes two backend URLs the same server: host, port and path, normalized.

    Host case, the default port, a trailing slash and the spelling of this
    machine (``localhost``, ``127.0.0.1``, ``::1``) do not count.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if is_this_machine(host):
        host = "localhost"
    port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    return host, port, parts.path.rstrip("/")


def same_server(a: str, b: str) -> bool:
    return server_identity(a) == server_identity(b)


def key_label(value: object) -> str:
    """A key's label ("laptop", "open-webui"): up to 64 printable characters; empty for none."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value.strip()) > 64 or not value.strip().isprintable():
        raise ValueError("a key's label is up to 64 printable characters, such as laptop or open-webui")
    return value.strip()


def new_key() -> str:
    """A new API key: 256 random bits, URL-safe, with :data:`KEY_PREFIX`."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The stored form of a key (SHA-256, hex): keys are high-entropy, so no salt or stretching is needed."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
