"""A standby's live views (the web UI's Live, `mr top`) say that it is a standby and which router leads.

Two in-process daemons on one PostgreSQL store. Marked ``postgres``: tests/pg.py starts a throwaway one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mindrouter.config import StoreSettings
from mindrouter.daemon.edge.services import SERVICES

from .harness import ADMIN_KEY, _configured, daemon, until
from .test_cli_top import frame
from .test_web_ui import login

pytestmark = pytest.mark.postgres


def _config(tmp: Path, url: str, port: int):
    config = _configured(tmp, None, {"port": port}, None)
    return dataclasses.replace(config, store=StoreSettings(url=url))


async def test_a_standbys_live_page_and_mr_top_name_the_leader(tmp_path: Path, pg_url: str):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with daemon(tmp_path / "a", config=_config(tmp_path / "a", pg_url, 18101)) as first:
        await until(lambda: first.app[SERVICES].leading, "the first router leads")
        async with daemon(tmp_path / "b", config=_config(tmp_path / "b", pg_url, 18102)) as second:
            assert first.config.server.host == "127.0.0.1"  # named as it listens; 0.0.0.0: by its host name
            leader = "http://127.0.0.1:18101"
            sentence = f"This router is a standby and schedules nothing, so its live views stay empty: {leader} leads."
            await until(lambda: second.app[SERVICES].leadership.leader == leader, "the standby knows the leader")
            top = await second.admin("GET", "/admin/top")
            assert top["status"]["role"] == "standby" and top["status"]["standby"] == sentence
            assert (await first.admin("GET", "/admin/top"))["status"]["standby"] is None
            assert sentence in "".join(line.strip() for line in frame(top, 120, 30))  # wrapped, whole
            await login(second, ADMIN_KEY)
            live = await (await second.client.get("/ui/admin/top")).text()
            assert sentence in live
            await login(first, ADMIN_KEY)
            assert "standby" not in await (await first.client.get("/ui/admin/top")).text()
