"""Prompts as an engine's prompt cache sees them: runs of tokens with an identity, compared by prefix.

A simulated request carries no text, and a fake server's text is filler, so a
prompt is a sequence of *segments*: a system prompt, a user's message, an
answer, each a count of tokens under a key that names its content (the
simulator's ``("c3/7", 2, "user")``, a fake server's hash of the message). Two
prompts share a prefix as far as their leading segments are equal; where
they meet one key with two lengths (an answer cut short), the shorter is a
prefix of the longer. What a cache may reuse follows from that alone:

- a per-slot cache (llama-server, which Ollama runs) reuses the common prefix
  of the slot's sequence and the new prompt (``common_prefix``);
- vLLM's automatic prefix caching reuses whole blocks of 16 tokens, each
  named by a hash chained over every token before it (``block_hashes``), so a
  block matches only where everything before it matches too.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

__all__ = ["BLOCK", "Prompt", "Segment", "block_hashes", "common_prefix"]

BLOCK = 16
"""Tokens per KV block (vLLM's default ``--block-size``)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of ``tokens`` tokens whose content ``key`` names: equal keys, equal text."""

    key: Hashable
    tokens: int


@dataclass(frozen=True, slots=True)
class Prompt:
    """What a request asks the engine to read, segment by segment."""

    segments: tuple[Segment, ...]
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", sum(s.tokens for s in self.segments))

    @classmethod
    def single(cls, key: Hashable, tokens: int) -> Prompt:
        """A prompt that shares nothing with any other (one request, no system prompt)."""
        return cls((Segment(key, tokens),))


def common_prefix(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    """Tokens at the start of ``a`` and ``b`` that are the same."""
    if not a or not b or a[0].key != b[0].key:
        return 0
    count = 0
    for x, y in zip(a, b, strict=False):
        if x.key != y.key:
            break
        count += min(x.tokens, y.tokens)
        if x.tokens != y.tokens:
            break
    return count


def block_hashes(segments: Sequence[Segment], size: int = BLOCK) -> list[int]:
    """The hash of every full block of ``size`` tokens, each chained over the blocks before it (vLLM's)."""
    out: list[int] = []
    chain = 0
    pieces: list[tuple[Hashable, int, int]] = []
    room = size
    for seg in segments:
        start = 0
        while start < seg.tokens:
            take = min(room, seg.tokens - start)
            pieces.append((seg.key, start, take))
            start += take
            room -= take
            if not room:
                chain = hash((chain, tuple(pieces)))
                out.append(chain)
                pieces.clear()
                room = size
    return out
