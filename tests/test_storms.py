"""Disconnect storms: clients dropping at random moments leave nothing behind.

About 1,000 clients in the default run (a few seconds), half OpenAI SSE and
half Ollama NDJSON, on two in-process backends with 200 slots between them; each
client reads to the end, hangs up after a random number of lines (mid-stream),
or hangs up after a random wait (mostly while queued). Afterwards nothing may be queued or running in the core, no
generation may be running at either backend, and every request that reached
the scheduler must have settled exactly once, as ``ok`` or ``client_gone``. ``-m soak`` runs 5,000.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from typing import Any

import aiohttp
import pytest

from mindrouter.daemon.edge.services import SERVICES
from mindrouter.daemon.request.settlement import Outcome, Settlement

from .harness import Daemon, until
from .inprocess import InProcess


async def storm(daemon: Any, clients: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    settled: list[Settlement] = []
    dispatcher = daemon.app[SERVICES].dispatcher
    original = dispatcher.on_settled

    def record(s: Settlement) -> None:
        settled.append(s)
        original(s)

    dispatcher.on_settled = record
    submitted: set[str] = set()
    submit = dispatcher.submit

    def count_submit(job: Any) -> Any:
        submitted.add(job.id)
        return submit(job)

    dispatcher.submit = count_submit
    # Half a second to the first token: a client that leaves sooner leaves before its answer began. Three
    # seconds of tokens: one that reads 30 lines leaves mid-stream even when a busy machine slows the
    # clients more than the daemon.
    vllm, ollama = (
        InProcess(models=("m",), tokens_per_second=20, completion_tokens=60, first_byte_delay=0.5) for _ in range(2)
    )
    await daemon.backend("vllm", vllm, max_concurrent=100)
    await daemon.backend("ollama", ollama, max_concurrent=100)
    keys = [await daemon.user(f"u{i}") for i in range(10)]
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 60}
    dropped = completed = 0

    async def client(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal dropped, completed
        await asyncio.sleep(rng.uniform(0, 1.0))  # arrivals spread over a second
        path = "/v1/chat/completions" if i % 2 else "/api/chat"
        headers = {"Authorization": f"Bearer {keys[i % len(keys)]}"}

        async def read(lines: int | None) -> None:
            async with session.post(daemon.url + path, json=body, headers=headers) as resp:
                if lines is None:
                    await resp.read()
                for _ in range(lines or 0):
                    await resp.content.readline()

        try:  # a third read to the end, a third hang up mid-stream, a third after a random wait
            if i % 3 == 0:
                await read(None)
                completed += 1
            elif i % 3 == 1:
                await read(rng.randint(2, 30))
                dropped += 1
            else:
                await asyncio.wait_for(read(None), rng.uniform(0.01, 1.5))
                completed += 1
        except TimeoutError:
            dropped += 1

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(client(session, i) for i in range(clients)))
    scheduler = daemon.scheduler
    with contextlib.suppress(AssertionError):  # what is left is reported below
        await until(
            lambda: (
                scheduler.queued_count == scheduler.running_count == 0
                and vllm.in_flight == ollama.in_flight == 0
                and len(settled) == len(submitted)
            ),
            timeout=10,  # everything is released within 10 s of the last client leaving
        )
    scheduler.check()
    return {
        "queued": scheduler.queued_count,
        "running": scheduler.running_count,
        "generating": vllm.in_flight + ollama.in_flight,
        "settled": Counter(s.outcome for s in settled),
        "reasons": Counter(s.reason for s in settled if s.outcome is Outcome.REJECTED),
        "settled_requests": len({s.job.id for s in settled}),
        "submitted": len(submitted),
        "gone_queued": sum(1 for s in settled if s.outcome is Outcome.CLIENT_GONE and not s.answered),
        "gone_streaming": sum(1 for s in settled if s.outcome is Outcome.CLIENT_GONE and s.answered),
        "dropped": dropped,
        "completed": completed,
        "cancelled_metric": daemon.app[SERVICES].stats.cancelled,
    }


def check(result: dict[str, Any], clients: int, *, saturated: bool = False) -> None:
    """Nothing leaked and every request settled once; unless ``saturated``, also the mix of ends.

    A soak saturates two shared cores: clients then wait past the queue's limits and
    requests are refused. That is the daemon doing its job.
    """
    settled = result["settled"]
    print(  # the figures docs/reliability.md quotes (pytest -s)
        f"storm of {clients}: {result['submitted']} reached the scheduler; "
        + ", ".join(f"{n} {outcome.value}" for outcome, n in settled.most_common())
        + f" ({result['gone_queued']} gone while queued or opening, {result['gone_streaming']} mid-stream);"
        f" afterwards {result['queued']} queued, {result['running']} running, {result['generating']} generating;"
        f" cancelled metric {result['cancelled_metric']}"
    )
    assert (result["queued"], result["running"], result["generating"]) == (0, 0, 0), result
    # Every request that reached the scheduler settled exactly once (a client may hang up before that).
    assert sum(settled.values()) == result["settled_requests"] == result["submitted"] >= 2 * clients // 3, result
    assert result["cancelled_metric"] == settled[Outcome.CLIENT_GONE], result  # every disconnect counted once
    if saturated:
        return
    assert set(settled) <= {Outcome.OK, Outcome.CLIENT_GONE}, result
    assert settled[Outcome.CLIENT_GONE] <= result["dropped"] and settled[Outcome.OK] >= result["completed"], result
    # Both kinds of drop happened (how many of each depends on how busy the machine is).
    assert result["gone_queued"] >= clients // 50 and result["gone_streaming"] >= clients // 10, result


@pytest.fixture
async def quiet_daemon(new_daemon: Any) -> Daemon:
    """A daemon that probes only when backends are added: the storm is about leaks, not health."""
    return await new_daemon(backends={"poll_interval": 600})


async def test_a_storm_of_1000_clients_dropping_at_random_leaks_nothing(quiet_daemon):
    result = await storm(quiet_daemon, 1000, seed=10)
    check(result, 1000)


@pytest.mark.soak
async def test_a_storm_of_5000_clients_dropping_at_random_leaks_nothing(quiet_daemon):
    result = await storm(quiet_daemon, 5000, seed=11)
    check(result, 5000, saturated=True)
