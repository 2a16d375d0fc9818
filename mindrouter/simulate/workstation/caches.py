"""Prompt caches: a runner's slots (llama-server, and Ollama, which runs it) or its prefix blocks (vLLM).

Each cache is owned by one runner and dropped with it (an unload). ``take``
is called when a request gets a slot and says how many of its prompt tokens
need no prefill; ``release`` when it ends, with what the slot (or the blocks)
now hold: the prompt and the answer, which the next turn of a conversation
sends back as its history. At least one prompt token is always computed (the
engine needs its logits to sample the first answer token).

``SlotCache`` follows llama.cpp's ``tools/server/server-context.cpp``
(``get_available_slot``) and its host-memory prompt cache (``server_prompt_cache``,
``--cache-ram``, 8 GiB by default, which Ollama leaves as it is):

- a request takes the free slot whose sequence shares the largest fraction
  of the request's prompt, if above ``--slot-prompt-similarity`` (0.1);
  otherwise the free slot used least recently (ties: the last);
- a slot taken by that second rule, or one that keeps under half of its
  sequence, first saves its sequence to host memory, and loads from there
  the saved sequence that shares more of the prompt, if one keeps at least a
  quarter of itself; host memory drops its oldest sequences past its size.

``BlockCache`` follows vLLM's automatic prefix caching (``v1/core``): a prompt's
full blocks of 16 tokens, hashed in a chain, are looked up from the first
until one is missing, at most ``prompt - 1`` tokens' worth of whole blocks;
blocks in use are held, and a finished request's blocks go to the free
queue last block first, so a prefix outlives its tails; a new block takes
the place of the oldest free one when the cache is full.
"""

from __future__ import annotations

from collections import OrderedDict

from .prompts import BLOCK, Prompt, Segment, block_hashes, common_prefix

__all__ = ["SIMILARITY", "BlockCache", "SlotCache"]

EMPTY = Prompt(())
SIMILARITY = 0.1
"""llama-server's ``--slot-prompt-similarity``: the part of a prompt a slot must hold to be chosen for it."""
KEEP_LOADED = 0.25
"""A saved sequence is loaded back only if the prompt keeps at least this part of it."""
KEEP_SLOT = 0.5
"""A slot chosen by similarity that keeps less than this part of its sequence saves it first."""


class SlotCache:
    """The slots of one llama-server runner, each with the sequence it last held, and host memory."""

    def __init__(self, slots: int, host_tokens: int) -> None:
        """Args:
        slots: parallel sequences (``-np``, ``OLLAMA_NUM_PARALLEL``).
        host_tokens: what host memory (``--cache-ram``) holds, in tokens of this model's KV cache.
        """
        self.seqs: list[Prompt] = [EMPTY] * slots
        self.last_used = [-1.0] * slots
        self.busy = [False] * slots
        self.host: list[Prompt] = []
        """Saved sequences, oldest first."""
        self.host_tokens = host_tokens
        self.held = 0
        """Tokens in host memory."""

    def take(self, prompt: Prompt, now: float) -> tuple[int, int]:
        """A free slot for ``prompt`` and the prompt tokens it holds already (``get_available_slot``)."""
        wanted = prompt.tokens
        best, best_sim, save = -1, 0.0, False
        for i, seq in enumerate(self.seqs):
            if self.busy[i] or not seq.tokens:
                continue
            sim = common_prefix(seq.segments, prompt.segments) / wanted
            if sim > best_sim and sim > SIMILARITY:
                best, best_sim = i, sim
        if best >= 0:
            save = best_sim * wanted / self.seqs[best].tokens < KEEP_SLOT
        else:
            oldest = 0.0
            for i in range(len(self.seqs)):
                if not self.busy[i] and (best < 0 or self.last_used[i] <= oldest):
                    best, oldest = i, self.last_used[i]
            save = True
        if save and self.host_tokens:
            self._swap(best, prompt)
        self.busy[best] = True
        return best, min(common_prefix(self.seqs[best].segments, prompt.segments), wanted - 1)

    def release(self, slot: int, seq: tuple[Segment, ...], now: float) -> None:
        """The slot's request ended: it holds ``seq`` (its prompt, and its answer as far as it went)."""
        self.seqs[slot] = Prompt(seq)
        self.busy[slot] = False
        self.last_used[slot] = now

    def _swap(self, slot: int, prompt: Prompt) -> None:
        """Save the slot's sequence to host memory, and load the saved one that serves ``prompt`` better."""
        mine = self.seqs[slot]
        if mine.tokens and not any(common_prefix(mine.segments, s.segments) == mine.tokens for s in self.host):
            rest = [s for s in self.host if common_prefix(s.segments, mine.segments) < s.tokens]
            self.held -= sum(s.tokens for s in self.host) - sum(s.tokens for s in rest)
            self.host = [*rest, mine]
            self.held += mine.tokens
        lcp = common_prefix(mine.segments, prompt.segments)
        keep = lcp / mine.tokens if mine.tokens else 0.0
        sim = lcp / prompt.tokens
        found = -1
        for i, seq in enumerate(self.host):
            lcp = common_prefix(seq.segments, prompt.segments)
            if not lcp:
                continue
            kept, covers = lcp / seq.tokens, lcp / prompt.tokens
            if kept >= KEEP_LOADED and keep < kept and sim < covers:
                found, keep, sim = i, kept, covers
        if found >= 0:
            self.seqs[slot] = self.host.pop(found)
            self.held -= self.seqs[slot].tokens
        while self.host and self.held > self.host_tokens:
            self.held -= self.host.pop(0).tokens


class BlockCache:
    """vLLM's prefix blocks for one model: blocks in use, and free ones kept in least-recently-freed order."""

    def __init__(self, capacity: int | None) -> None:
        """Args:
        capacity: blocks the KV cache holds (None: no bound).
        """
        self.capacity = capacity
        self.held: dict[int, int] = {}
        """Block hash -> requests holding it."""
        self.free: OrderedDict[int, None] = OrderedDict()
        """Cached blocks no request holds, the next to be reused first."""

    def take(self, prompt: Prompt) -> tuple[list[int], int]:
        """Hold ``prompt``'s blocks; returns their hashes and the prompt tokens found cached."""
        hashes = block_hashes(prompt.segments)
        hit = 0
        for h in hashes[: (prompt.tokens - 1) // BLOCK]:
            if h not in self.held and h not in self.free:
                break
            hit += 1
        for h in hashes:
            self._hold(h)
        return hashes, hit * BLOCK

    def release(self, held: list[int], seq: tuple[Segment, ...]) -> None:
        """A request ended holding ``held``, having read and written ``seq``: its full blocks stay cached."""
        hashes = block_hashes(seq)
        for h in hashes[len(held) :]:
            self._hold(h)
        for h in reversed(held + hashes[len(held) :]):
            left = self.held[h] - 1
            if left:
                self.held[h] = left
            else:
                del self.held[h]
                self.free[h] = None

    def _hold(self, h: int) -> None:
        if h in self.held:
            self.held[h] += 1
            return
        if h in self.free:
            del self.free[h]
        elif self.capacity is not None:
            while self.free and len(self.held) + len(self.free) >= self.capacity:
                self.free.popitem(last=False)
        self.held[h] = 1
