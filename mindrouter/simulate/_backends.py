"""Scenario files, part two: the ``[models]`` table and ``[[backends]]`` entries (``loading.py``'s base).

Keys of the Ollama-like memory model (``workstation/``) mean something only
with ``vram``; a backend without it is refused them, so a scenario never
silently ignores what it says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._fields import Fields
from .scenario import ENGINES, KINDS, SHARING, BackendSpec, ModelSpec, Rates

__all__ = ["KEEP_ALIVE", "LOAD_SECONDS_PER_GB", "MAX_LOADED", "BackendFields"]

_MODEL = {"size", "vram", "kind", "family", "kv_mb_per_token", "context_length"}
_RATES = {"decode", "prefill"}
#: Backend keys of the Ollama-like memory model: they mean something only with ``vram``.
_OLLAMA = ("load_seconds_per_gb", "max_loaded", "keep_alive", "load_start_seconds", "max_queue", "context_length")
#: Ollama's defaults for a backend with ``vram``: 5 minutes of keep_alive, 3 models per GPU.
KEEP_ALIVE = 300.0
MAX_LOADED = 3
#: Seconds per GB of a load where the scenario does not say (about 2.5 GB/s, a fast NVMe disk).
LOAD_SECONDS_PER_GB = 0.4
_BACKEND = {
    "name",
    "models",
    "max_concurrent",
    "tokens_per_second",
    "prefill_tokens_per_second",
    "loaded_models",
    "priority",
    "vram",
    "load_seconds_per_gb",
    "parallel",
    "max_loaded",
    "keep_alive",
    "slowdown",
    "poll_interval",
    "rates",
    "engine",
    "sharing",
    "load_start_seconds",
    "max_queue",
    "context_length",
    "kv_cache_tokens",
}


class BackendFields(Fields):
    """Reads models and backends; checks each key as ``Fields`` does."""

    def model(self, name: str, raw: Any) -> ModelSpec:
        where = f"models.{name}"
        raw = self.table(f"[models.{name}]", raw)
        self.unknown(f"{where}.", raw, _MODEL)
        size = self.number(f"{where}.size", raw.get("size", 0.0))
        kind = raw.get("kind", "chat")
        if kind not in KINDS:
            raise self.fail(f'{where}.kind must be "chat" or "embedding", not {kind!r}')
        family = self.string(f"{where}.family", raw["family"]) if "family" in raw else ""
        context = self.integer(f"{where}.context_length", raw["context_length"]) if "context_length" in raw else None
        kv = self.number(f"{where}.kv_mb_per_token", raw.get("kv_mb_per_token", 0.0))
        return ModelSpec(name, size, self.number(f"{where}.vram", raw.get("vram", size)), kind, family, kv, context)

    def backend(self, index: int, raw: Any, models: Mapping[str, ModelSpec]) -> BackendSpec:
        where = f"backends[{index}]"
        raw = self.table(where, raw)
        self.unknown(f"{where}.", raw, _BACKEND)
        for key in ("name", "models", "max_concurrent", "tokens_per_second"):
            if key not in raw:
                raise self.fail(f"{where}.{key} is missing")
        name = self.string(f"{where}.name", raw["name"])
        served = self.strings(f"{where}.models", raw["models"])
        if not served:
            raise self.fail(f"{where}.models is empty; list the models backend {name!r} serves")
        tps = self.number(f"{where}.tokens_per_second", raw["tokens_per_second"], positive=True)
        prefill = self.number(
            f"{where}.prefill_tokens_per_second", raw.get("prefill_tokens_per_second", 10 * tps), positive=True
        )
        vram = self.number(f"{where}.vram", raw["vram"], positive=True) if "vram" in raw else None
        default_loaded: tuple[str, ...] = () if vram is not None else served
        loaded = (
            self.strings(f"{where}.loaded_models", raw["loaded_models"]) if "loaded_models" in raw else default_loaded
        )
        for model in loaded:
            if model not in served:
                raise self.fail(f"{where}.loaded_models names {model!r}, which is not in its models")
        if vram is None:
            for key in _OLLAMA:
                if key in raw:
                    raise self.fail(f"{where}.{key} needs {where}.vram (GB), which makes the backend load models")
        engine = raw.get("engine", "ollama" if vram is not None else "openai")
        if engine not in ENGINES:
            raise self.fail(f"{where}.engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if vram is not None and engine != "ollama":
            raise self.fail(f'{where}.vram makes the backend load models as Ollama does; it needs engine = "ollama"')
        if "kv_cache_tokens" in raw and engine != "vllm":
            raise self.fail(f'{where}.kv_cache_tokens is the size of a vLLM cache; it needs engine = "vllm"')
        sharing = raw.get("sharing", SHARING[0])
        if sharing not in SHARING:
            raise self.fail(f"{where}.sharing must be one of {', '.join(SHARING)}, not {sharing!r}")
        rates = self.rates(where, self.table(f"{where}.rates", raw.get("rates", {})), served, tps, prefill)
        parallel = self.integer(f"{where}.parallel", raw["parallel"]) if "parallel" in raw else None
        max_loaded = None
        if vram is not None:
            max_loaded = self.integer(f"{where}.max_loaded", raw.get("max_loaded", MAX_LOADED))
            for model in served:
                need = models[model].vram if model in models else None
                if need is None:
                    raise self.fail(
                        f"{where}.models names {model!r}, which has no [models.{model!r}] size;"
                        f" a backend with vram needs the size of every model it serves"
                    )
                if need > vram:
                    raise self.fail(
                        f"{where}.models names {model!r}, which holds {need:g} GB, more than {where}.vram ({vram:g} GB)"
                    )
            held = sum(models[m].vram for m in loaded)
            if held > vram or len(loaded) > max_loaded:
                raise self.fail(
                    f"{where}.loaded_models hold {held:g} GB in {len(loaded)} models, more than vram ({vram:g} GB)"
                    f" or max_loaded ({max_loaded}) allow"
                )
        keep_alive = None
        if vram is not None:
            keep_alive = self.number(f"{where}.keep_alive", raw.get("keep_alive", KEEP_ALIVE))
        return BackendSpec(
            name=name,
            models=served,
            max_concurrent=self.integer(f"{where}.max_concurrent", raw["max_concurrent"]),
            tokens_per_second=tps,
            prefill_tokens_per_second=prefill,
            loaded_models=loaded,
            priority=self.number(f"{where}.priority", raw.get("priority", 0.0), minimum=-math.inf),
            vram=vram,
            load_seconds_per_gb=self.number(
                f"{where}.load_seconds_per_gb", raw.get("load_seconds_per_gb", LOAD_SECONDS_PER_GB if vram else 0.0)
            ),
            parallel=parallel,
            max_loaded=max_loaded,
            keep_alive=keep_alive,
            slowdown=self.number(f"{where}.slowdown", raw.get("slowdown", 0.0)),
            poll_interval=self.number(f"{where}.poll_interval", raw.get("poll_interval", 0.0)),
            rates=rates,
            engine=engine,
            sharing=sharing,
            load_start_seconds=self.number(f"{where}.load_start_seconds", raw.get("load_start_seconds", 0.0)),
            max_queue=self.integer(f"{where}.max_queue", raw.get("max_queue", 512)),
            context_length=self._optional_int(f"{where}.context_length", raw.get("context_length")),
            kv_cache_tokens=self._optional_int(f"{where}.kv_cache_tokens", raw.get("kv_cache_tokens")),
        )

    def _optional_int(self, key: str, value: Any) -> int | None:
        return None if value is None else self.integer(key, value)

    def rates(
        self, where: str, raw: dict[str, Any], served: tuple[str, ...], decode: float, prefill: float
    ) -> dict[str, Rates]:
        """``[backends.rates]``: model -> {decode, prefill}; either left out takes the backend's default."""
        out = {}
        for model, entry in raw.items():
            key = f"{where}.rates.{model}"
            if model not in served:
                raise self.fail(f"{key} names a model that is not in {where}.models")
            entry = self.table(key, entry)
            self.unknown(f"{key}.", entry, _RATES)
            d = self.number(f"{key}.decode", entry.get("decode", decode), positive=True)
            p = self.number(
                f"{key}.prefill", entry.get("prefill", 10 * d if "decode" in entry else prefill), positive=True
            )
            out[model] = Rates(d, p)
        return out
