"""What each backend is expected to hold in its prompt cache: the prefixes the router left there.

Per (backend, model) a shelf of the sequences sent there, least recently
sent first. A new request's sequence replaces those it extends (the next
turn of a conversation takes the slot its last turn left, and vLLM's blocks
are shared), and the shelf is bounded as the engine's cache is:

- a server with slots per model (``Backend.parallel``: Ollama, llama-server)
  keeps one sequence a slot, so a shelf holds ``parallel`` sequences and a
  new one pushes out the one used least recently (slot reuse);
- any other (vLLM's prefix blocks) keeps what fits its KV cache, bounded here
  by ``SchedulerSettings.prefix_cache_tokens`` tokens, a block shared by
  several sequences (an app's system prompt) counted once, as vLLM holds it.

A shelf is dropped when its model leaves the backend (unloaded, evicted, or
keep_alive ran out: the next poll says so) and when the engine's answer says
it had less cached than expected (``missed``). Memory: at most ``parallel``
(or the token bound's worth of) sequences of ``MAX_BLOCKS`` entries per pair.

Invariant: ``count`` holds, for each hash, how many of the shelf's sequences
contain it; the hashes a shelf holds of any one prefix are a run from its
first block, so a lookup is a binary search.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from operator import itemgetter

from ..prefix import Prefix

__all__ = ["Prefixes", "Shelf"]

_hash = itemgetter(0)


class Shelf:
    """The sequences one (backend, model) is expected to hold, keyed by their last block's hash."""

    __slots__ = ("clock", "count", "seqs", "stamps", "tokens")

    def __init__(self) -> None:
        self.seqs: OrderedDict[int, Prefix] = OrderedDict()
        self.count: dict[int, int] = {}
        self.tokens = 0
        self.clock = 0
        """Sequences put so far: each sequence's ``stamps`` entry says when it was put, in this count."""
        self.stamps: dict[int, int] = {}

    def found(self, prefix: Prefix) -> int:
        """How many of ``prefix``'s blocks this shelf holds.

        The blocks found are a run from the first (a sequence is put and dropped whole, with every
        block before its last), so a binary search finds where the run ends.
        """
        count = self.count
        lo, hi = 0, len(prefix)  # prefix[:lo] found; prefix[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix[mid][0] in count:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def put(self, prefix: Prefix, found: int, sequences: int | None, tokens: int) -> int | None:
        """``prefix`` (its first ``found`` blocks held here) was sent here: it replaces the sequences it extends,
        then the oldest go past the bounds. Returns when the newest sequence it extends was put (None: none)."""
        seqs = self.seqs
        extended = None
        for h in map(_hash, prefix[:found]):
            if h in seqs:
                extended = self.stamps[h]
                self.drop(h)
        leaf = prefix[-1][0]
        self.clock += 1
        self.stamps[leaf] = self.clock
        seqs[leaf] = prefix
        count = self.count
        before = added = 0
        for h, end in prefix:
            held = count.get(h)
            if held is None:  # a block no other sequence here holds: its tokens take room of their own
                added += end - before
                count[h] = 1
            else:
                count[h] = held + 1
            before = end
        self.tokens += added
        most = sequences or len(seqs)
        while len(seqs) > 1 and (len(seqs) > most or self.tokens > tokens):
            self.drop(next(iter(seqs)))
        return extended

    def drop(self, leaf: int) -> None:
        prefix = self.seqs.pop(leaf)
        del self.stamps[leaf]
        count = self.count
        before = freed = 0
        for h, end in prefix:
            left = count[h] - 1
            if left:
                count[h] = left
            else:
                del count[h]
                freed += end - before
            before = end
        self.tokens -= freed


class Prefixes:
    """Every (backend, model)'s shelf, and what each running job was expected to find cached."""

    def __init__(self) -> None:
        self._shelves: dict[Hashable, dict[str, Shelf]] = {}
        self._expected: dict[str, tuple[Shelf, Prefix, int, int | None]] = {}
        """Per job sent with a prefix: its shelf, prefix, tokens expected cached, and when the sequence it
        extended was put there (None: it extended none, or the shelf has slots)."""

    def cached(self, backend_id: Hashable, model: str, prefix: Prefix) -> int:
        """Prompt tokens of ``prefix`` expected in ``backend_id``'s cache for ``model``."""
        if not prefix:
            return 0
        shelf = self._shelves.get(backend_id, {}).get(model)
        found = 0 if shelf is None else shelf.found(prefix)
        return prefix[found - 1][1] if found else 0

    def sent(
        self, job_id: str, backend_id: Hashable, model: str, prefix: Prefix, sequences: int | None, tokens: int
    ) -> None:
        """``job_id``'s prompt (``prefix``) goes to ``backend_id``: the engine will hold it after."""
        if not prefix or (sequences is None and tokens <= 0):
            return
        shelves = self._shelves.setdefault(backend_id, {})
        shelf = shelves.get(model)
        if shelf is None:
            shelf = shelves[model] = Shelf()
        found = shelf.found(prefix)
        extended = shelf.put(prefix, found, sequences, tokens)
        hoped = prefix[found - 1][1] if found else 0
        self._expected[job_id] = (shelf, prefix, hoped, extended if sequences is None else None)

    def ended(self, job_id: str, cached: int | None, prompt: int | None = None) -> float:
        """``job_id`` ended; ``cached``: prompt tokens its engine said it found cached, if it said, of ``prompt``
        (its count of the prompt; None: as the shelf counted it). Returns the part of the prompt (0 to 1)
        expected cached when it was sent (0 for a job not sent with a prefix).

        Under half the part of the prompt the shelf promised means the engine kept less than the shelf
        thinks (a slot reused by work the router did not send, a restart): the shelf keeps only what this
        job left. Parts, not tokens: the engine counts tokens, the shelf the daemon's estimate of them.
        Where the cache is bounded by tokens (vLLM's blocks, freed least recently used first) and the
        sequence the job extended is what was lost, only the sequences sent no later than that one go:
        those sent since are newer than what the engine evicted. Forgetting them all, one miss in a
        burst (the blocks of running requests leave less room for the cached) made the router scatter
        every conversation on that replica.
        """
        expected = self._expected.pop(job_id, None)
        if expected is None:
            return 0.0
        shelf, prefix, hoped, since = expected
        leaf, total = prefix[-1]
        if cached is not None and cached * 2 * total < hoped * (prompt or total):
            stamps = shelf.stamps
            lost = [o for o in shelf.seqs if o != leaf and (since is None or stamps[o] <= since)]
            for other in lost:
                shelf.drop(other)
        return hoped / total

    def keep(self, backend_id: Hashable, models: frozenset[str]) -> None:
        """``backend_id`` holds only ``models`` now (a poll, an eviction): forget the others' shelves."""
        shelves = self._shelves.get(backend_id)
        if shelves:
            for model in [model for model in shelves if model not in models]:
                del shelves[model]

    def unloaded(self, backend_id: Hashable, models: Iterable[str]) -> None:
        """``models`` leave ``backend_id`` (evicted to make room): their caches go with them."""
        shelves = self._shelves.get(backend_id)
        if shelves:
            for model in models:
                shelves.pop(model, None)

    def forget(self, backend_id: Hashable) -> None:
        """``backend_id`` went away."""
        self._shelves.pop(backend_id, None)
