"""One truth for shares: a person's target is its weighted share among the people with demand in its pool.

`mr share --json` (GET /admin/share), `/v1/me`, the web UI's My share, Groups and Live all show the
same number for the same person, an idle account none, a proxy account none of its own, and a
person alone on a backend of its own all of that backend (issue 32: 20.0% on My share against 8.6%
on Groups and in `mr share`, which divided by every registered account's weight).
"""

from __future__ import annotations

import io
import re
from typing import Any

from mindrouter.scheduler.targets import combined, pool_targets

from .harness import ADMIN_KEY, Daemon
from .inprocess import InProcess
from .test_web_ui import login


def test_a_target_is_a_weight_over_the_weights_with_demand() -> None:
    assert pool_targets({"ana": 1.5, "dan": 1.0}) == {"ana": 0.6, "dan": 0.4}
    assert pool_targets({}) == {}
    # two pools: 60% of one that gave 300 units, 100% of one that gave 100
    assert combined([(0.6, 200.0, 300.0), (1.0, 100.0, 100.0)]) == (0.7, 0.75)
    assert combined([]) == (None, None)
    assert combined([(0.5, 0.0, 0.0)]) == (0.5, 0.0)  # only queued so far: the target shows at once


async def _ask(daemon: Daemon, key: str, model: str, **headers: str) -> None:
    resp = await daemon.client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
        headers={"Authorization": f"Bearer {key}", **headers},
    )
    assert resp.status == 200, await resp.text()


def _pct(html: str, element_id: str) -> float | None:
    """The percentage an element shows (None for '–', no target)."""
    found = re.search(rf'id="{re.escape(element_id)}"[^>]*>\s*([^<]*)<', html)
    assert found, (element_id, html[:3000])
    text = found.group(1).strip()
    return None if text in ("–", "-", "") else float(text.rstrip(" %"))


async def test_the_same_target_everywhere_and_none_for_the_idle(daemon: Daemon) -> None:
    await daemon.backend("shared", InProcess(models=("llama3.2",)))
    await daemon.backend("own", InProcess(models=("private",)))
    ana = await daemon.user("ana", weight=1.5)
    bo = await daemon.user("bo", group="faculty")
    await daemon.user("carl")  # never sends a request
    await daemon.user("root", group="admin")  # an admin who never sends one
    await daemon.admin("POST", "/admin/users", {"name": "webui", "group": "student", "proxy": True})
    webui = str((await daemon.admin("POST", "/admin/users/webui/keys"))["key"])
    await _ask(daemon, ana, "llama3.2")
    await _ask(daemon, webui, "llama3.2", **{"X-OpenWebUI-User-Email": "dan@lab.edu"})
    await _ask(daemon, bo, "private")  # alone on his own backend

    share = await daemon.admin("GET", "/admin/share")
    target = {u["name"]: u["target_share"] for u in share["users"]}
    # ana 1.5 and dan 1 share one pool; bo is alone on his
    assert target == {"ana": 0.6, "dan@lab.edu": 0.4, "bo": 1.0, "carl": None, "root": None, "webui": None}
    people = {u["name"]: u for u in share["users"]}
    assert people["webui"]["proxy"] and people["dan@lab.edu"]["person_of"] == "webui"
    groups = {g["name"]: g["target_share"] for g in share["groups"]}
    assert groups["faculty"] == 1.0 and groups["admin"] is None

    resp = await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {ana}"})
    assert (await resp.json())["fair_share"]["target_share"] == 0.6
    resp = await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {bo}"})
    assert (await resp.json())["fair_share"]["target_share"] == 1.0

    await login(daemon, ana)
    assert _pct(await (await daemon.client.get("/ui/me")).text(), "target") == 60.0
    daemon.client.session.cookie_jar.clear()
    await login(daemon, ADMIN_KEY)
    groups_page = await (await daemon.client.get("/ui/admin/groups")).text()
    live = await (await daemon.client.get("/ui/admin/top")).text()
    for page in (groups_page, live):
        assert _pct(page, "target-ana") == 60.0
        assert _pct(page, "target-bo") == 100.0
        assert _pct(page, "target-dan@lab.edu") == 40.0
        assert "target-carl" not in page or _pct(page, "target-carl") is None
    assert _pct(groups_page, "target-group-faculty") == 100.0


async def test_mr_share_json_reads_the_same_targets(daemon: Daemon) -> None:
    """`mr share --json` prints GET /admin/share as it is: its rows are the ones asserted above."""
    await daemon.backend("shared", InProcess(models=("llama3.2",)))
    ana = await daemon.user("ana", weight=3)
    await daemon.user("idle")
    await _ask(daemon, ana, "llama3.2")
    share: dict[str, Any] = await daemon.admin("GET", "/admin/share")
    rows = {u["name"]: u for u in share["users"]}
    assert rows["ana"]["target_share"] == 1.0 and rows["ana"]["actual_share"] == 1.0
    assert rows["idle"]["target_share"] is None
    assert rows["ana"]["pools"][0]["target_share"] == 1.0


def test_mr_share_adds_a_table_per_pool_where_pools_differ() -> None:
    from rich.console import Console

    from mindrouter.cli.share import pool_table

    def seat(names: list[str], target: float, actual: float) -> dict[str, Any]:
        return {"backends": ["1"], "names": names, "target_share": target, "actual_share": actual}

    one = {"users": [{"name": "ana", "pools": [seat(["shared"], 0.6, 0.5)]}]}
    assert pool_table(one) is None  # one pool: the main table says it all
    two = {
        "users": [
            {"name": "ana", "pools": [seat(["shared"], 0.6, 0.5)]},
            {"name": "dan", "pools": [seat(["shared"], 0.4, 0.5)]},
            {"name": "bo", "pools": [seat(["own"], 1.0, 1.0)]},
            {"name": "carl", "pools": []},
        ]
    }
    table = pool_table(two)
    assert table is not None
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(table)
    text = console.export_text()
    assert re.search(r"own\s+bo\s+100\.0%\s+100\.0%", text) and re.search(r"shared\s+ana\s+60\.0%\s+50\.0%", text)
    assert re.search(r"^\s+dan\s+40\.0%", text, re.M) and "carl" not in text
