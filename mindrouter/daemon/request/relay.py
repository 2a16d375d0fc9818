"""The answer's chunks on their way to the client: charged as they go, cut when a quota is spent.

A :class:`Relay` is made by the lease that owns it once the backend's answer is open, and knows
nothing of the lease: it is told how to charge what went out and how to end a stream the daemon
cuts, so the per-chunk loop reads apart from the lease's state machine.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from ...backends.base import Upstream
from ...errors import RequestError

if TYPE_CHECKING:  # a protocol only: nothing of it runs
    from .ports import Reservations

__all__ = ["Relay"]

CHARGE_CHUNKS = 32
CHARGE_SECONDS = 0.1
"""A stream is charged every 32 chunks or 100 ms, whichever comes first."""


class Relay:
    """Relays one open stream's chunks, charging ``charge(sent)`` as they go.

    Args:
        upstream: the backend's open answer.
        job_id: whose reservation a quota grows or cuts.
        quotas: the quota reservations (None: no quotas).
        charge: told the chunks sent so far (cumulative) at each charge.
        cut: awaited with the refusal and the chunks delivered when a quota ends the stream.
        clock: the lease's clock, for the charge's cadence.
    """

    __slots__ = ("charge", "clock", "cut", "job_id", "quotas", "upstream")

    def __init__(
        self,
        upstream: Upstream,
        job_id: str,
        quotas: Reservations | None,
        *,
        charge: Callable[[int], None],
        cut: Callable[[RequestError, int], Awaitable[None]],
        clock: Callable[[], float],
    ) -> None:
        self.upstream = upstream
        self.job_id = job_id
        self.quotas = quotas
        self.charge = charge
        self.cut = cut
        self.clock = clock

    async def chunks(self) -> AsyncIterator[bytes | bytearray]:
        """The answer's chunks, in the client's dialect, ending with an error tail if the backend broke.

        Raises:
            RequestError: the daemon ended the stream (a quota it outgrew its reservation of is spent);
                ``cut`` has ended the lease, and the handler writes the error tail.

        One upstream event carries about one token, so chunks stand in for tokens until the
        backend's own counts settle the charge when the lease finishes.
        """
        upstream, job_id, quotas, charge, clock = self.upstream, self.job_id, self.quotas, self.charge, self.clock
        allowance = math.inf if quotas is None else quotas.allowance(job_id)
        next_charge, due, delivered = CHARGE_CHUNKS, clock() + CHARGE_SECONDS, 0
        async for chunk in upstream:
            sent = upstream.chunks
            if sent > allowance:  # past the reservation: asked before the chunk goes out, so a cut withholds it
                assert quotas is not None
                refusal = quotas.outgrow(job_id, sent)
                if refusal is not None:
                    await self.cut(refusal, delivered)
                    raise refusal
                allowance = quotas.allowance(job_id)
            yield chunk
            delivered = sent
            if sent >= next_charge or clock() >= due:
                charge(sent)
                next_charge, due = sent + CHARGE_CHUNKS, clock() + CHARGE_SECONDS
