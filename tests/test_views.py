"""The admin views are pure functions: plain values in, the JSON the CLI draws out."""

from __future__ import annotations

from types import SimpleNamespace

from mindrouter.daemon.admin.views import Counters, share_view, status_view, top_view
from mindrouter.scheduler import Scheduler


def test_status_counts_healthy_backends_and_names_unreachable_nodes_once():
    view = status_view(
        Counters(uptime=12.34567, requests_total=9, tokens_total=900, requests_per_second=1.23456, tokens_per_second=5),
        version="1.0",
        backend_states=["healthy", "unhealthy", "healthy", "draining"],
        unreachable_nodes=["http://ws2:8485", "http://ws1:8485", "http://ws2:8485"],
        queued=3,
        running=2,
        users=4,
        listen="http://127.0.0.1:8484",
        socket="/run/mr.sock",
    )
    assert (view["backends"], view["backends_healthy"]) == (4, 2)
    assert view["nodes_unreachable"] == ["http://ws1:8485", "http://ws2:8485"]
    assert view["uptime_seconds"] == 12.346 and view["requests_per_second"] == 1.235


def test_share_reports_use_and_quotas_and_no_target_while_idle():
    core = Scheduler()
    core.set_user(1, 3.0, name="alice", group="faculty")
    core.set_user(2, 1.0, name="bob", group="student")
    users = [
        SimpleNamespace(
            id=1, name="alice", group="faculty", weight=3.0, weight_override=None, proxy=False, person_of=None
        ),
        SimpleNamespace(
            id=2, name="bob", group="student", weight=1.0, weight_override=None, proxy=False, person_of=None
        ),
    ]
    groups = [
        SimpleNamespace(name="faculty", scheduler_weight=3.0),
        SimpleNamespace(name="student", scheduler_weight=1.0),
    ]
    asked: list[tuple[str, object]] = []

    def quotas(kind: str, key: object) -> list[dict]:
        asked.append((kind, key))
        return [{"kind": "tokens_per_day", "limit": 100}] if key == 2 else []

    view = share_view(core.share(0.0), users, groups, {"faculty": 1, "student": 1}, quotas, {})
    by_name = {u["name"]: u for u in view["users"]}
    # nobody has sent anything: no one has a target (tests/test_share_truth.py splits a pool by weight)
    assert by_name["alice"]["target_share"] is None and by_name["bob"]["target_share"] is None
    assert by_name["bob"]["quotas"] == [{"kind": "tokens_per_day", "limit": 100}]
    assert [g["users"] for g in view["groups"]] == [1, 1]
    assert ("group", "faculty") in asked and ("user", 1) in asked


def test_top_is_every_view_at_once():
    view = top_view(status={"a": 1}, backends=[], gpus=[], queue={}, share={}, decisions=[], panels={"today": {}})
    assert set(view) == {"status", "backends", "gpus", "queue", "share", "decisions", "today"}
