"""bench_pool.py's clients: each request sent at its time, a conversation's later turns after each answer.

A chat request streams (``stream_options.include_usage``) and counts the
"tok" words of its chunks; an embedding request sends 8 inputs. A
conversation's turns go one after the other, each its think time after the
answer before it, with the history as the client keeps it: the app's system
prompt, every message and every answer as it was received. Every text
starts with what makes it unique (its user and time, or its conversation and
turn), so the fakes' prompt caches find exactly the prefixes the workload
shares. A word is a token to the fakes and four characters with its space
("wor ", "sys ", "tok "), as English text is to a tokenizer, so the daemon's
estimate of a prompt (characters / 4) reads it whole (with one-letter words
it read half of every prompt, and half of every prefix it expects cached).
Times are lab seconds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
from _lab import Request
from _pool_report import Outcome
from _pools import MODELS

from mindrouter.simulate.conversations import Conversation

__all__ = ["TIMEOUT", "messages", "replay"]

TIMEOUT = 300.0
"""Lab seconds a client waits for an answer before it counts the request as lost."""


def messages(r: Request, answers: list[str]) -> list[dict[str, str]]:
    """What a client sends: a single request's one message, or a conversation's history and new message.

    Words are the fake's tokens; a system prompt's text is the same for every user of its app, a message's
    starts with its conversation and turn, and an answer is sent back as it was received.
    """
    conv = r.conversation
    if conv is None:  # its own text: no two requests share a prefix
        return [{"role": "user", "content": " ".join([f"{r.user}@{r.at:.6f}"] + ["wor"] * (r.prompt - 1))}]
    out = []
    if conv.system:
        out.append({"role": "system", "content": " ".join([f"{conv.app}-system"] + ["sys"] * (conv.system - 1))})
    for i, turn in enumerate(conv.turns[: r.turn + 1]):
        out.append({"role": "user", "content": " ".join([f"{conv.key}/{i}"] + ["wor"] * (turn.message - 1))})
        if i < r.turn:
            out.append({"role": "assistant", "content": answers[i]})
    return out


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    o: Outcome,
    clock: Callable[[], float],
    arrivals: list[tuple[float, int]],
    timeout: float,
    answers: list[str],
) -> None:
    """Send ``o``'s request and fill in its outcome; a chat answer's text is appended to ``answers``."""
    r = o.req
    try:
        if MODELS[r.model].kind == "embedding":
            texts = [" ".join([f"{r.user}@{r.at:.6f}/{i}"] + ["wor"] * (max(1, r.prompt // 8) - 1)) for i in range(8)]
            async with session.post(
                f"{url}/v1/embeddings",
                json={"model": r.model, "input": texts},
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                o.request_id = resp.headers.get("X-Request-Id")
                await resp.read()
                o.error = None if resp.status == 200 else f"HTTP {resp.status}"
                o.end = clock()
            return
        body = {
            "model": r.model,
            "messages": messages(r, answers),
            "max_tokens": r.out,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text: list[str] = []
        async with session.post(
            f"{url}/v1/chat/completions", json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            o.request_id = resp.headers.get("X-Request-Id")
            if resp.status != 200:
                o.error = f"HTTP {resp.status}"
                return
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                content = (choices[0].get("delta") or {}).get("content") or ""
                if n := content.count("tok"):
                    now = clock()
                    o.first = now if o.first is None else o.first
                    o.tokens += n
                    arrivals.append((now, n))
                    text.append(content)
            o.end = clock()
            o.error = None if o.tokens >= r.out else f"short answer: {o.tokens} of {r.out} tokens"
            answers.append("".join(text))
    except (TimeoutError, aiohttp.ClientError) as exc:
        o.error = type(exc).__name__


async def replay(
    url: str, headers: Callable[[str], dict[str, str]], requests: list[Request], compression: float, steady_s: float
) -> tuple[list[Outcome], list[tuple[float, int]], float]:
    """Send each request at its time (a conversation's later turns each its think time after the answer
    before it); wait for all, at most ``TIMEOUT`` after the last (each turn's own). Lab seconds."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.2

    def clock() -> float:
        return (loop.time() - t0) * compression

    outcomes: list[Outcome] = []
    arrivals: list[tuple[float, int]] = []
    tasks = []

    async def talk(session: aiohttp.ClientSession, first: Outcome) -> None:
        """A request, or a conversation turn by turn while each is answered."""
        r, answers, o = first.req, [], first
        conv: Conversation | None = r.conversation
        for k in range(len(conv.turns) if conv else 1):
            if k:
                await asyncio.sleep(conv.turns[k].think / compression)  # type: ignore[union-attr]
                sent = clock()
                phase = "steady" if sent < steady_s else "burst"
                turn = conv.turns[k]  # type: ignore[union-attr]
                req = Request(sent, r.user, r.model, conv.prompt_tokens(k), turn.completion, phase, conv, k)  # type: ignore[union-attr]
                o = Outcome(req, sent)
                outcomes.append(o)
            await one_request(session, url, headers(r.user), o, clock, arrivals, TIMEOUT / compression, answers)
            if not o.ok:
                return

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for r in requests:
            await asyncio.sleep(max(0.0, t0 + r.at / compression - loop.time()))
            o = Outcome(r, clock())
            outcomes.append(o)
            tasks.append(asyncio.create_task(talk(session, o)))
        longest = max(
            (sum(t.think + TIMEOUT for t in r.conversation.turns[1:]) for r in requests if r.conversation), default=0.0
        )
        await asyncio.wait(tasks, timeout=(TIMEOUT + longest) / compression + 1)  # every request times out by then
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for o in outcomes:
        if o.end is None and o.error is None:
            o.error = "unfinished"
    return outcomes, arrivals, clock()
