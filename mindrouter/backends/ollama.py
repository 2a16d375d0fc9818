"""Ollama: models from /api/tags, resident models and their VRAM from /api/ps.

Models are listed as Ollama spells them (``llama3.2:latest``); the daemon
treats ``llama3.2`` as the same model (see ``model_key``).
What each model can do (vision, embedding, tools) comes from /api/show, asked
once per model digest and remembered, so a poll costs three requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..gpu.vram import ModelShape, parse_ollama_show
from ..reported import distrust, nbytes
from .base import Adapter
from .probe import Probe

__all__ = ["OllamaAdapter"]

_SHOW_PER_POLL = 8
"""At most this many /api/show calls per poll, so a large model library is learnt over a few polls."""


def _name(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return None
    name = entry.get("name") or entry.get("model")
    return name if isinstance(name, str) and name else None


class OllamaAdapter(Adapter):
    engine = "ollama"
    family = "ollama"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._capabilities: dict[str, frozenset[str]] = {}
        """By model digest (or name when there is none)."""
        self._shapes: dict[str, ModelShape] = {}
        """By model digest, from the same /api/show answers."""

    @staticmethod
    def normalize_url(url: str) -> str:
        return url.rstrip("/").removesuffix("/api")

    async def probe(self) -> Probe:
        tags, ps, version = await asyncio.gather(self.get("/api/tags"), self.get("/api/ps"), self.get("/api/version"))
        if not tags.ok:
            return self.down(tags, "/api/tags")
        data = tags.json()
        listed = data.get("models") if isinstance(data, dict) else None
        if not isinstance(listed, list):
            return Probe(
                healthy=False, error=f"{self.base_url}/api/tags did not list models; is this an Ollama server?"
            )
        details: dict[str, dict[str, Any]] = {}
        sizes: dict[str, int] = {}
        for entry in listed:
            if (name := _name(entry)) is not None:
                details[name] = entry
                if (size := self._bytes(entry, "size")) is not None:
                    sizes[name] = size
        models = frozenset(details)
        loaded: set[str] = set()
        vram: dict[str, int] = {}
        data = ps.json() if ps.ok else None
        running = data.get("models") if isinstance(data, dict) else None
        for entry in running or ():
            if (name := _name(entry)) is not None:
                loaded.add(name)
                details[name] = {**details.get(name, {}), **entry}  # adds expires_at, size_vram
                size = self._bytes(entry, "size_vram" if "size_vram" in entry else "size")
                if size is not None:
                    vram[name] = size
        ver = version.json() if version.ok else None
        return Probe(
            healthy=True,
            models=models,
            loaded_models=frozenset(loaded),
            loaded_vram=vram,
            model_sizes=sizes,
            capabilities=(learnt := await self._learn_capabilities(listed))[0],
            shapes=learnt[1],
            details=details,
            version=ver.get("version") if isinstance(ver, dict) else None,
        )

    def _bytes(self, entry: dict[str, Any], key: str) -> int | None:
        """A size from /api/tags or /api/ps, checked: a negative, huge or mistyped one is dropped (logged once)."""
        value = entry.get(key)
        size = nbytes(value)
        if size is None and value is not None:
            distrust(self.base_url, key, value)
        return size

    async def _learn_capabilities(self, listed: list[Any]) -> tuple[dict[str, frozenset[str]], dict[str, ModelShape]]:
        """Each model's capabilities and shape, by name, from /api/show (a few models a poll, each asked once)."""
        key_of: dict[str, str] = {}  # every name -> its digest
        ask: dict[str, str] = {}  # digest -> one name to ask /api/show about
        for entry in listed:
            if (name := _name(entry)) is not None:
                key = str(entry.get("digest") or name)
                ask.setdefault(key, name)
                key_of[name] = key
        asked = [(k, n) for k, n in ask.items() if k not in self._capabilities][:_SHOW_PER_POLL]
        replies = await asyncio.gather(
            *(self.get("/api/show", method="POST", json_body={"model": n}) for _, n in asked)
        )
        for (key, _), reply in zip(asked, replies, strict=True):
            info = reply.json() if reply.ok else None
            caps = info.get("capabilities") if isinstance(info, dict) else None
            if isinstance(caps, list) and caps:  # before Ollama 0.6 /api/show had none: unknown
                self._capabilities[key] = frozenset(c for c in caps if isinstance(c, str))
            if isinstance(info, dict):
                self._shapes[key] = parse_ollama_show(info)
        return (
            {n: self._capabilities[k] for n, k in key_of.items() if k in self._capabilities},
            {n: self._shapes[k] for n, k in key_of.items() if k in self._shapes},
        )
