"""A prompt's prefix as routing sees it: a chain of hashed blocks, each with the prompt's tokens up to its end.

Inference servers keep what they last read: Ollama's and llama-server's slots
their last sequence, vLLM its prefix blocks. A conversation's next turn sends
its whole history again, and apps send one system prompt to everyone, so a
request read where its prefix already is needs only the rest prefilled. The
core cannot see tokens, so a prompt is cut where its text changes hands
(one block per message: the daemon; one per segment: the simulator), and
each block's hash is chained over every block before it, so two prompts
share a block only where everything before it is the same (vLLM's rule for
its 16-token blocks). The cumulative token count says what a hit up to that
block saves.

Hashes are Python's ``hash``: the same within one process, which is all the
router (in the same process) needs; nothing here is stored.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

__all__ = ["MAX_BLOCKS", "Prefix", "chain", "message_chain"]

#: (chain hash, prompt tokens up to the end of this block), first block first.
Prefix = tuple[tuple[int, int], ...]

MAX_BLOCKS = 64
"""Blocks kept per prompt (a 64-message history): the router's memory and time per candidate stay bounded,
and a hit beyond them is counted as far as them."""


def chain(blocks: Iterable[tuple[Hashable, int]]) -> Prefix:
    """The chained hashes of ``(content key, tokens)`` blocks, with cumulative tokens (empty blocks skipped)."""
    out: list[tuple[int, int]] = []
    h = 0
    total = 0
    for key, tokens in blocks:
        if tokens <= 0:
            continue
        h = hash((h, key))
        total += tokens
        out.append((h, total))
        if len(out) == MAX_BLOCKS:
            break
    return tuple(out)


def message_chain(messages: Sequence[Any]) -> Prefix:
    """The prefix of a chat request's ``messages`` (a list of dicts as clients send them).

    Each message is a block keyed by its role and content; its tokens are estimated as the daemon
    estimates a prompt's (characters / 4).
    """
    blocks: list[tuple[Hashable, int]] = []
    for message in messages[:MAX_BLOCKS]:
        if isinstance(message, dict):
            content = message.get("content")
            text = content if isinstance(content, str) else repr(content)
            blocks.append(((str(message.get("role")), text), (len(text) + 3) // 4))
    return chain(blocks)
