"""mindrouter/names.py: one rule for names, URLs, engines and keys, and everyone applies it."""

from __future__ import annotations

import pytest

from mindrouter import names
from mindrouter.backends import ENGINES as ADAPTERS
from mindrouter.cli import _validate
from mindrouter.cli.config_cmd import SECTIONS, _fields, field_docs
from mindrouter.errors import UsageError


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://localhost:11434", "http://127.0.0.1:11434/"),
        ("http://LOCALHOST:11434//", "http://[::1]:11434"),
        ("http://ws3.lab", "http://WS3.lab:80/"),
        ("https://ws3.lab/", "https://ws3.lab:443"),
        ("http://0.0.0.0:8000", "http://127.0.0.2:8000"),
        ("http://ws3.lab:8000/v1/", "http://ws3.lab:8000/v1"),
    ],
)
def test_spellings_of_one_server_are_one_server(a, b):
    assert names.same_server(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://localhost:11434", "http://localhost:11435"),
        ("http://ws3.lab:8000", "http://ws4.lab:8000"),
        ("http://ws3.lab", "https://ws3.lab"),  # ports 80 and 443
        ("http://ws3.lab:8000/a", "http://ws3.lab:8000/b"),
    ],
)
def test_different_servers_stay_different(a, b):
    assert not names.same_server(a, b)


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "unix:/run/x.sock",
        "gopher://h:70",
        "http://",
        "http://a b:1",
        "http://h:0",
        "http://h:99999",
    ],
)
def test_only_http_urls_with_a_host_are_backends(url):
    with pytest.raises(ValueError):
        names.check_url(url)
    with pytest.raises(UsageError):
        _validate.url(url)


def test_loopback_means_reachable_from_this_machine_only():
    assert names.is_loopback("127.0.0.1") and names.is_loopback("::1") and names.is_loopback("localhost")
    assert not names.is_loopback("0.0.0.0") and not names.is_loopback("10.0.0.5") and not names.is_loopback("ws3")
    assert names.is_this_machine("0.0.0.0")


def test_keys_carry_256_random_bits_and_are_hashed_one_way():
    keys = {names.new_key() for _ in range(1000)}
    assert len(keys) == 1000
    key = next(iter(keys))
    assert key.startswith(names.KEY_PREFIX) and len(key) - len(names.KEY_PREFIX) == 43  # 32 bytes, base64
    assert names.hash_key(key) == names.hash_key(key) and key not in names.hash_key(key)
    assert len(names.hash_key("\ud800")) == 64  # a lone surrogate from a client hashes instead of raising


def test_the_engine_list_is_the_adapters_list():
    assert set(names.ENGINES) == set(ADAPTERS)


def test_every_setting_is_documented_once_on_its_own_field():
    missing = [
        f"[{section}] {f.name}"
        for section, cls in SECTIONS
        for f in _fields(section, cls)
        if not field_docs(cls).get(f.name)
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("raw", "identity"),
    [
        ("alice@lab.edu", "alice@lab.edu"),
        ("  Prof@Lab.EDU ", "prof@lab.edu"),  # an address is case-folded
        ("_prof@lab.edu", "_prof@lab.edu"),  # nothing else is rewritten
        ("Dan Smith", "Dan Smith"),
        ("..prof", "..prof"),
        ("", None),
        ("   ", None),
        ("a\x00b", None),
        ("a\x1bb", None),
        ("x" * 257, None),
        ("\ud800", None),
        (["alice"], None),
    ],
)
def test_a_forwarded_identity_is_kept_exactly(raw, identity):
    assert names.person_identity(raw) == identity


def test_each_identity_gets_a_valid_name_of_its_own_to_show():
    identities = ["prof@lab.edu", "_prof@lab.edu", "-prof@lab.edu", "Dan Smith", "dan-smith", "日本", "..", "é" * 256]
    shown = [names.person_name(i) for i in identities]
    assert shown[0] == "prof@lab.edu" and shown[4] == "dan-smith"  # a valid name is its own
    assert len(set(shown)) == len(shown)
    assert all(names.check_name("user", s) for s in shown)
