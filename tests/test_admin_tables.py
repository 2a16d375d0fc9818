"""Issue 32 item 6: `mr why`, `mr simulate`, `mr decisions --follow` and `mr backend list` as a person reads them.

`mr why` cut its scores to ``-2…`` and its headers to ``st…`` at 80 columns and put the winner's ✓ on a line
of its own; `mr simulate` cut ``1,125,…``; `--follow` wrapped every record onto two lines at 100
columns; `mr backend list` hid the URL while it showed the id and the engine. Each table now keeps every
value whole, hiding the least telling columns first, or prints one block per row.
"""

from __future__ import annotations

import re

import pytest

from . import test_cli_fake
from .test_cli_80cols import GROUP, MODEL, PERSON, URL, lab, whole
from .test_cli_fake import FakeDaemon, decision, mr

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server


@pytest.mark.parametrize("width", [80, 120])
def test_why_keeps_every_score_whole_and_the_tick_beside_the_winner(fake: FakeDaemon, width: int) -> None:
    lab(fake)
    out = mr("why", "mr-3fa9c2e1", env={"COLUMNS": str(width)}).stdout
    whole(
        out,
        [PERSON, f"({GROUP})", MODEL, "local-ollama", "gpu-node-18-llamacpp", "-4.5", "-20.2", "12.5", "36.5"],
        width,
    )
    winner = next(line for line in out.splitlines() if line.startswith("local-ollama"))
    assert "✓" in winner and "-4.5" in winner, out
    assert not any(line.strip() == "✓" for line in out.splitlines()), out
    header = next(line for line in out.splitlines() if re.match(r"backend\s+score", line))
    for term in ("start", "finish"):
        assert re.search(rf"\b{term}\b", header), header


@pytest.mark.parametrize("width", [80, 120])
def test_simulate_keeps_every_number_whole(width: int) -> None:
    args = ["simulate", "--example", "scenario3", "--duration", "600"]
    result = mr(*args, "--json").json()
    out = mr(*args, env={"COLUMNS": str(width)}).stdout
    values = [u["name"] for u in result["users"]] + [f"{u['tokens']:,}" for u in result["users"]]
    values += [f"{100 * u['target_share']:.1f}%" for u in result["users"]]
    whole(out, values, width)
    for user in result["users"]:  # one row a user: name, target and tokens on one line
        row = next(line for line in out.splitlines() if line.startswith(user["name"] + " "))
        assert f"{user['tokens']:,}" in row and f"{100 * user['target_share']:.1f}%" in row, out


def test_follow_prints_a_record_a_line_at_100_columns(fake: FakeDaemon) -> None:
    fake.decisions = [decision(f"mr-4c1e2{i:02x}", wall=1_767_000_000.0 + i) for i in range(3)]
    out = mr("decisions", "--follow", env={"COLUMNS": "100"}).stdout
    lines = out.splitlines()
    assert len(lines) == 3 and all(len(line) <= 100 for line in lines), out
    for i, line in enumerate(lines):
        assert f"mr-4c1e2{i:02x}" in line and "alice (faculty)" in line and "llama3.2" in line and "ws1" in line


@pytest.mark.parametrize("width", [80, 100])
def test_follow_keeps_long_values_whole_at_80_and_100_columns(fake: FakeDaemon, width: int) -> None:
    lab(fake)
    out = mr("decisions", "--follow", env={"COLUMNS": str(width)}).stdout
    whole(out, ["mr-3fa9c2e1", PERSON, f"({GROUP})", MODEL, "local-ollama", "1.2s"], width)


def test_backend_list_hides_the_id_and_engine_before_the_url(fake: FakeDaemon) -> None:
    lab(fake)
    out = mr("backend", "list", env={"COLUMNS": "125"}).stdout
    whole(out, [URL, "local-ollama", MODEL], 125)
    hidden = " ".join(out.split()).split("not shown at 125 columns: ")[1]
    assert hidden.startswith("id,") and "url" not in hidden.split("(")[0], out


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40)])
def test_top_never_cuts_a_number(fake: FakeDaemon, width: int, height: int) -> None:
    """`mr top` cuts long names with an ellipsis to keep one line a row; its numbers were cut too ("1,94…")."""
    lab(fake)
    data = fake.top()
    for row in data["backends"]:
        row["tokens_per_second"] = 1943.25
        row["latency_ema"] = 12.5
    data["share"]["users"][0].update(deficit=-2_345_678.0, factor=0.13)
    from .test_cli_top import frame

    lines = frame(data, width, height, socket="/run/mr.sock", now=1_767_000_000.0)
    text = "\n".join(lines)
    numbers = re.findall(r"\d[\d,.]*…", text)
    assert not numbers, text
    if width == 120:
        assert "1,943.2" in text and "-2,345,678" in text and "0.13" in text, text


LONG_USER = "a.very.long.person.name@university.example.edu"
LONG_MODEL = "hf.co/bartowski/Qwen2.5-Coder-32B-Instruct-GGUF:Q4_K_M"
LONG_BACKEND = "gpu-node-18-llamacpp-second-card"


@pytest.mark.parametrize(("width", "height"), [(80, 24), (80, 60), (120, 40)])
def test_top_never_cuts_a_name(fake: FakeDaemon, width: int, height: int) -> None:
    """`mr top` cut names longer than their column with "…" (issue 32); a row that cannot fit whole is a block."""
    lab(fake)
    data = fake.top()
    data["backends"][0]["name"] = LONG_BACKEND
    data["share"]["users"][0]["name"] = LONG_USER
    data["queue"]["queue"]["by_user_model"] = {LONG_USER: {LONG_MODEL: 3}}
    data["queue"]["queue"]["oldest_wait_by_user_model"] = {LONG_USER: {LONG_MODEL: 4.5}}
    from .test_cli_top import frame

    lines = frame(data, width, height, socket="/run/mr.sock", now=1_767_000_000.0)
    text = "\n".join(lines)
    cut = [line for line in lines if re.search(r"\S…", line) and "more" not in line]
    assert not cut, text
    assert all(len(line) <= width for line in lines), text
    assert LONG_USER in text and LONG_BACKEND in text, text
    if height >= 40:
        assert LONG_MODEL in text, text
