"""mindrouter.gpu's public names are exactly its __all__, and each module's __all__ resolves."""

from __future__ import annotations

import importlib

import pytest

import mindrouter.gpu as gpu

MODULES = ["probe", "vram", "node", "render", "client", "agent"]


def test_package_all() -> None:
    assert sorted(gpu.__all__) == sorted(set(gpu.__all__))
    for name in gpu.__all__:
        assert hasattr(gpu, name), name
    public = {n for n in vars(gpu) if not n.startswith("_") and n not in MODULES and n != "logging"}
    assert public == set(gpu.__all__)


@pytest.mark.parametrize("module", MODULES)
def test_module_all(module: str) -> None:
    mod = importlib.import_module(f"mindrouter.gpu.{module}")
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"
