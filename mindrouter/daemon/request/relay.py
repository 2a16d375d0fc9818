"""The answer's chunks on their way to the client: charged as they go, cut when a quota is spent.

A mixin of :class:`~.lease.Lease`, which owns the slot, the upstream and the settlement;
this part only relays, so the lease's state machine reads apart from the per-chunk loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, cast

from ...backends.base import Upstream
from ...errors import RequestError
from ...scheduler import Job
from .settlement import Outcome

if TYPE_CHECKING:
    from .dispatcher import Dispatcher
    from .lease import Lease

__all__ = ["AnswerRelay"]


class AnswerRelay:
    __slots__ = ()

    dispatcher: Dispatcher
    job: Job
    upstream: Upstream | None

    def _used(self) -> tuple[int, int]:
        raise NotImplementedError

    def _end_attempt(self, outcome: Outcome, reason: str | None) -> None:
        raise NotImplementedError

    def _released(self) -> None:
        raise NotImplementedError

    def _settle(
        self, outcome: Outcome, reason: str | None, status: int, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        raise NotImplementedError

    async def chunks(self) -> AsyncIterator[bytes | bytearray]:
        """The answer's chunks, in the client's dialect, ending with an error tail if the backend broke.

        Raises:
            RequestError: the daemon ended the stream (a quota it outgrew its reservation of is spent);
                the lease has settled, and the handler writes the error tail.

        The job is charged as the answer is produced, every 32 chunks or 100 ms, whichever comes
        first: one upstream event carries about one token, so chunks stand in for tokens until the
        backend's own counts settle the charge in ``finish``.
        """
        assert self.upstream is not None, "open() first"
        upstream = self.upstream
        progress, job_id, quotas = self.dispatcher.progress, self.job.id, self.dispatcher.quotas
        streamed = self.dispatcher.on_streamed
        allowance = math.inf if quotas is None else quotas.allowance(job_id)
        next_charge, due, delivered = 32, time.monotonic() + 0.1, 0
        async for chunk in upstream:
            sent = upstream.chunks
            if sent > allowance:  # past the reservation: asked before the chunk goes out, so a cut withholds it
                assert quotas is not None
                cut = quotas.outgrow(job_id, sent)
                if cut is not None:
                    await self._cut(cut, delivered)
                    raise cut
                allowance = quotas.allowance(job_id)
            yield chunk
            delivered = sent
            if sent >= next_charge or time.monotonic() >= due:
                progress(job_id, sent)
                if streamed is not None:
                    streamed(cast("Lease", self), sent)  # the relay is only ever a lease's part
                next_charge, due = sent + 32, time.monotonic() + 0.1

    async def _cut(self, reason: RequestError, delivered: int) -> None:
        """End a stream the daemon stops (a spent quota): the backend stops, what was delivered is charged."""
        upstream = self.upstream
        assert upstream is not None
        await upstream.close()
        prompt, _ = self._used()
        completion = delivered
        self.dispatcher.abandon(self.job.id, prompt_tokens=prompt, completion_tokens=completion)
        self._end_attempt(Outcome.REJECTED, reason.message)
        self._released()
        self._settle(Outcome.REJECTED, reason.message, reason.status, prompt, completion)
