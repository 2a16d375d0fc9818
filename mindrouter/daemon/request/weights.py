"""How the store's users and groups reach the scheduler core: one place, used at start, per request and by admin."""

from __future__ import annotations

from typing import Any, Protocol

from ...scheduler import Scheduler

__all__ = ["apply_user"]


class _UserLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def weight_override(self) -> float | None: ...
    @property
    def group_weight(self) -> float: ...
    @property
    def weight(self) -> float: ...


def apply_user(scheduler: Scheduler, user_id: Any, user: _UserLike) -> None:
    """Tell the core ``user``'s weight, override, group and group weight (applied from now on)."""
    scheduler.set_user(
        user_id,
        user.weight,
        name=user.name,
        group=user.group,
        weight_override=user.weight_override,
        group_weight=user.group_weight,
    )
