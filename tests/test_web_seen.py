"""The pool seen from the browser (issue 32): usage over days as SVG charts, quota burn-down, backends'
throughput, latency and GPU on Live, the queue by person, decisions with times, units and filters, an
"updated" time on the pages that refresh themselves, and how an admin logs in."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from mindrouter.daemon.edge.services import SERVICES
from mindrouter.daemon.ui.charts import SERIES, burn, sparkline, stacked, top_series

from .harness import ADMIN_KEY, Daemon, until
from .inprocess import InProcess
from .test_web_ui import login

DAY = 86400.0


def test_a_stacked_chart_keeps_the_largest_subjects_and_sums_the_rest() -> None:
    values = {(f"u{i}", "d1"): float(10 + i) for i in range(9)} | {("u8", "d2"): 100.0}
    totals = {f"u{i}": float(10 + i) for i in range(9)} | {"u8": 118.0}
    days = {"d1": sum(10.0 + i for i in range(9)), "d2": 100.0}
    series = top_series(totals, lambda n, d: values.get((n, d), 0.0), days, ["d1", "d2"])
    assert [n for n, _ in series] == ["u8", "u7", "u6", "u5", "u4", "u3", "u2", "others"]
    assert series[-1][1] == {"d1": 10.0 + 11.0, "d2": 0.0}  # u0 and u1 together
    chart = stacked(["d1", "d2"], series, "tokens")
    assert len(chart.names) == SERIES + 1 and chart.peak == days["d1"]
    d2 = [b for b in chart.bars if b.title.startswith("d2")]
    assert len(d2) == 1 and d2[0].height == pytest.approx(100 / chart.peak * 38)
    assert stacked(["d1"], [], "tokens").peak == 0


def test_a_burn_down_says_when_a_quota_runs_out_at_its_pace() -> None:
    # 60% used a third of the way through: out at 55.6% of the period
    out = burn(600, 1000, 0.0, 90.0, 30.0)
    assert out["used"] == 0.6 and out["elapsed"] == pytest.approx(1 / 3)
    assert out["runs_out"] == pytest.approx(50.0)
    assert burn(100, 1000, 0.0, 90.0, 30.0)["runs_out"] is None  # at this pace it lasts the period
    assert sparkline([0.0, 5.0, 10.0]) == "0.0,20.0 50.0,11.0 100.0,2.0"


async def test_usage_over_days_per_person_and_model_with_a_quota_burn_down(daemon: Daemon) -> None:
    await daemon.user("ana")
    await daemon.user("bo", group="faculty")
    store = daemon.app[SERVICES].store
    now = time.time()
    ana, bo = store.get_user("ana").id, store.get_user("bo").id
    for day in range(3):
        at = now - day * DAY
        store.record_usage(ana, f"a{day}", "llama3.2", None, 100, 900, at, gpu_seconds=3600, group="student")
        store.record_usage(bo, f"b{day}", "qwen", None, 50, 150, at, gpu_seconds=60, group="faculty")
    await daemon.admin("PUT", "/admin/users/ana/quota", {"tokens_per_month": 10_000})
    await login(daemon, ADMIN_KEY)
    page = await (await daemon.client.get("/ui/admin/usage?by=user&days=7")).text()
    assert '<svg class="chart"' in page and page.count('<rect class="c') >= 6  # two people on three days
    rows = re.findall(r"<tr><th>(\w+)</th><td[^>]*>([\d,]+)</td><td[^>]*>([\d,]+)</td><td[^>]*>([^<]+)</td>", page)
    assert rows == [("ana", "3", "3,000", "3h 00m"), ("bo", "3", "600", "3m 00s")]
    assert "user <b>ana</b>: tokens per month, " in page  # the burn-down of ana's monthly quota
    by_model = await (await daemon.client.get("/ui/admin/usage?by=model&metric=gpu_seconds")).text()
    assert "<th>llama3.2</th>" in by_model and "<th>qwen</th>" in by_model and "GPU seconds per model" in by_model


async def test_live_shows_backends_throughput_and_the_queue_by_person_with_the_time_it_was_drawn(
    daemon: Daemon,
) -> None:
    box = InProcess(models=("llama3.2",))
    await daemon.backend("box", box, max_concurrent=1)
    ana = await daemon.user("ana")
    box.hold()

    async def chat() -> int:
        resp = await daemon.client.post(
            "/v1/chat/completions",
            json={"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {ana}"},
        )
        await resp.read()
        return resp.status

    tasks = [asyncio.create_task(chat()) for _ in range(3)]
    await until(lambda: daemon.scheduler.queued_count == 2, "two should wait")
    await login(daemon, ADMIN_KEY)
    live = await (await daemon.client.get("/ui/admin/top")).text()
    assert re.search(r'<dl id="waiting"><dt>ana</dt><dd>2 queued, oldest [\d.]+ s</dd>', live)
    assert 'id="live-backends"' in live and "<th>box</th>" in live and "1 / 1" in live
    assert re.search(r'id="updated">Updated \d\d:\d\d:\d\d', live)
    groups = await (await daemon.client.get("/ui/admin/groups")).text()
    assert 'id="updated"' not in groups  # it does not refresh itself
    box.open_gate()
    assert await asyncio.gather(*tasks) == [200, 200, 200]


async def test_decisions_newest_first_with_times_units_and_filters(daemon: Daemon) -> None:
    await daemon.backend("box", InProcess(models=("llama3.2", "qwen")))
    ana = await daemon.user("ana")
    ids = []
    for model in ("llama3.2", "qwen", "llama3.2"):
        resp = await daemon.client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {ana}"},
        )
        assert resp.status == 200
        ids.append(resp.headers["X-Request-Id"])
    await login(daemon, ADMIN_KEY)
    page = await (await daemon.client.get("/ui/admin/decisions")).text()
    shown = re.findall(r'href="/ui/admin/decisions/([^"]+)"', page)
    assert shown == ids[::-1]  # newest first
    assert re.search(r'<td data-label="time" title="\d{4}-\d\d-\d\d">\d\d:\d\d:\d\d</td>', page)
    assert re.search(r'data-label="waited">\d+(\.\d+)?(ms|s)</td>', page)  # a unit, not "0.00"
    qwen = await (await daemon.client.get("/ui/admin/decisions?model=qwen&outcome=ok&backend=box")).text()
    assert re.findall(r'href="/ui/admin/decisions/([^"]+)"', qwen) == [ids[1]]
    none = await (await daemon.client.get("/ui/admin/decisions?outcome=timeout")).text()
    assert "No decisions match." in none


async def test_the_login_page_says_how_an_admin_logs_in(daemon: Daemon) -> None:
    page = await (await daemon.client.get("/ui/login")).text()
    assert "--group admin" in page and "admin_key" in page


def test_a_sentence_shows_its_commands_as_code_and_escapes_the_rest() -> None:
    from mindrouter.daemon.ui.render import sentence

    assert str(sentence("no <b>x</b>; run `mr user list`")) == "no &lt;b&gt;x&lt;/b&gt;; run <code>mr user list</code>"
    assert str(sentence("`<script>`")) == "<code>&lt;script&gt;</code>"
