"""One leader among the routers that share a PostgreSQL store; the others stand by and take over in seconds.

Leadership is a PostgreSQL advisory lock held by a session of its own. That session
sends a heartbeat every second and is set to be ended by the server after 3 s of
silence (``idle_session_timeout``) and to notice a dead client while it works
(``client_connection_check_interval``): the lock is released 3-10 ms after the
leader's process dies, and about 3 s after its host or process freezes. Every
router tries for the lock five times a second; whoever gets it raises the leader epoch
(``mindrouter_leader``) and fences its store with it, so a leader that was frozen
and resumes finds its epoch overtaken and can commit nothing (store/postgres.py).

A leader counts itself leading only while its last heartbeat is fresh (monotonic
time, which runs on while a process is stopped): a resumed leader answers 503 at
once, finds its session gone at the next heartbeat, and stands down by ending the
process with status 1 (a supervisor starts it again, as a standby), the way
Kubernetes controllers end on a lost lease.

The same session LISTENs for the store's change notices (a trigger on groups,
users, keys and backends), so an admin change made through any router reaches
every router's memory within milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["LEADER_LOCK", "Leadership"]

log = logging.getLogger(__name__)

LEADER_LOCK = 0x6D72_0002
"""The advisory lock whose holder leads (``mr`` in its high bytes)."""
CHANNEL = "mindrouter_changes"
"""Where the store's triggers announce a changed table (store/postgres.py)."""


class Leadership:
    """Holds or waits for the leader lock on ``url`` until cancelled.

    Args:
        url: the store's PostgreSQL url.
        on_lead: awaited with the new epoch once the lock is won, before the router counts as leading.
        on_change: called with a table's name when another write changed it (any router's).
        on_lost: called once if leadership is lost (the daemon stops the process).
        heartbeat: seconds between a leader's heartbeats. Defaults to 1; a standby tries for the lock five
            times as often (a cheap query), so it takes over about 0.1 s after the lock is free.
        idle_timeout: seconds of silence after which the server ends the session. Defaults to 3.
        name: how this router is named to the others while it leads (its address), for their live views.
    """

    def __init__(
        self,
        url: str,
        *,
        on_lead: Callable[[int], Awaitable[None]],
        on_change: Callable[[str], None],
        on_lost: Callable[[], None],
        heartbeat: float = 1.0,
        idle_timeout: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
    ) -> None:
        self.url = url
        self.on_lead = on_lead
        self.on_change = on_change
        self.on_lost = on_lost
        self.heartbeat = heartbeat
        self.idle_timeout = idle_timeout
        self.clock = clock
        self.name = name
        self.leader = ""
        """The leading router's name as a standby last read it ("" before it knows, or if it gave none)."""
        self.epoch: int | None = None
        """The epoch this router leads in; None while it stands by."""
        self._confirmed = -float("inf")
        self._conn: Any = None

    @property
    def leading(self) -> bool:
        """Leading, with a heartbeat confirmed within the last two intervals (never after a freeze)."""
        return self.epoch is not None and self.clock() - self._confirmed < 2 * self.heartbeat

    @property
    def role(self) -> str:
        return "leader" if self.leading else "standby"

    async def run(self) -> None:
        """Try for the lock each heartbeat while standing by; confirm it each heartbeat while leading."""
        import psycopg

        try:
            while True:
                try:
                    if self._conn is None:
                        self._conn = await self._connect()
                    won = await asyncio.wait_for(self._beat(), self.heartbeat * 2)
                    if won is not None:  # quick (the session must beat again within idle_timeout)
                        await self._lead(won)
                    wait = self.heartbeat if self.epoch is not None else self.heartbeat / 5
                    async for notice in self._conn.notifies(timeout=wait):  # with those that came meanwhile
                        self._notice(notice.payload)
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    await self._drop(exc)
                    await asyncio.sleep(self.heartbeat)
        finally:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()

    async def _lead(self, epoch: int) -> None:
        """Take over; if that fails, give the lock back (by ending the session) and try again later."""
        try:
            await self.on_lead(epoch)
        except Exception as exc:  # the store failed us: another router may do better
            log.exception("could not take over as leader (epoch %d); giving the lock back", epoch)
            raise OSError(f"taking over failed: {exc}") from exc
        self.epoch, self._confirmed = epoch, self.clock()

    def _notice(self, table: str) -> None:
        try:
            self.on_change(table)
        except Exception:  # the next notice, or the next takeover, reads the store again
            log.exception("could not follow a change to %s made through another router", table)

    async def _connect(self) -> Any:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, application_name="mindrouter-leader")
        await conn.execute(f"SET idle_session_timeout = '{int(self.idle_timeout * 1000)}ms'")
        await conn.execute(f"SET client_connection_check_interval = '{int(self.heartbeat * 1000)}ms'")
        await conn.execute(f"LISTEN {CHANNEL}")
        return conn

    async def _beat(self) -> int | None:
        """One heartbeat; the new epoch when this beat won the lock."""
        if self.epoch is not None:
            await self._conn.execute("SELECT 1")
            self._confirmed = self.clock()
            return None
        tried = "SELECT pg_try_advisory_lock(%s), (SELECT leader FROM mindrouter_leader)"
        row = await (await self._conn.execute(tried, (LEADER_LOCK,))).fetchone()
        if not row[0]:
            self.leader = row[1]
            return None
        raised = "UPDATE mindrouter_leader SET epoch = epoch + 1, leader = %s RETURNING epoch"
        cur = await self._conn.execute(raised, (self.name,))
        epoch: int = (await cur.fetchone())[0]
        log.info("this router leads now (epoch %d); it schedules and dispatches", epoch)
        return epoch

    async def _drop(self, exc: BaseException) -> None:
        """The session failed: a standby reconnects; a leader has lost the lock and stands down."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
        if self.epoch is None:
            log.warning("the store's leader session failed (%s); trying again in %.0f s", exc, self.heartbeat)
            return
        log.error(
            "this router lost the leadership of epoch %d (%s); it stops, and a supervisor starts it again as a standby",
            self.epoch,
            exc,
        )
        self.epoch = None
        self.on_lost()
