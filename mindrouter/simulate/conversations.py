"""Conversations: several turns, each resending the history, behind a system prompt shared per client app.

A lab's traffic is mostly conversations: Open WebUI or Continue sends the whole
history with every turn, after a system prompt that every user of the app
shares. A user with ``turns`` or ``app`` (``[apps]``) sends conversations: turn
k's prompt is the app's system prompt, then each earlier turn's message and
answer, then its own new message of ``prompt_tokens``; ``think_time`` passes
between an answer and the next turn. Everything a conversation will send
(how many turns, each message and answer, each pause) is drawn when it
starts, from its phase's generator (``workload.draw_conversation``), so the simulator and a live replay of
the same scenario (``workload.arrivals``) send the same conversations
whatever the pool does; only when each turn leaves depends on the run.

Prompts are ``workstation.Prompt`` segments, keyed so that the same text has
the same key: the app's system prompt by the app, a message and an answer by
their conversation and turn. A request that is no conversation shares
nothing: one segment keyed by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from .workstation import Prompt, Segment

__all__ = ["Conversation", "Turn", "single"]


@dataclass(frozen=True, slots=True)
class Turn:
    message: int
    """Tokens of its new message."""
    completion: int
    """Tokens of its answer."""
    think: float
    """Seconds between the previous turn's answer and this turn (0 for the first)."""


@dataclass(frozen=True, slots=True)
class Conversation:
    key: str
    """Unique in the run (``phase/n``)."""
    app: str | None
    system: int
    """Tokens of the app's system prompt (0: none)."""
    turns: tuple[Turn, ...]

    def prompt(self, k: int) -> Prompt:
        """Turn ``k``'s prompt: the system prompt, the earlier turns' messages and answers, its message."""
        segments = [Segment(("app", self.app), self.system)] if self.system else []
        for i, turn in enumerate(self.turns[: k + 1]):
            segments.append(Segment((self.key, i, "user"), turn.message))
            if i < k:
                segments.append(self.answer(i))
        return Prompt(tuple(segments))

    def answer(self, k: int) -> Segment:
        return Segment((self.key, k, "assistant"), self.turns[k].completion)

    def prompt_tokens(self, k: int) -> int:
        return self.system + sum(t.message + t.completion for t in self.turns[:k]) + self.turns[k].message


def single(key: str, prompt: int) -> tuple[Prompt, Segment]:
    """A request that is no conversation: its prompt, shared with nothing, and its answer."""
    return Prompt.single(("request", key), prompt), Segment(("request", key, "assistant"), 0)
