"""Who and what the core schedules: users, groups and backends, as the daemon tells it.

A mixin of ``Scheduler``, holding the calls that change them; reading them back
is in ``reading.py``. A new weight applies from now on (the seats it moves are
re-keyed), and a change in what backends serve seats every queued job in its
class's pool again (``Scheduler._classes_changed``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from .fairness.fairshare import FairShare
from .fairness.holds import Holds
from .fairness.pools import Seat
from .routing.backend import Backend, BackendLoad
from .routing.classes import Classes
from .settings import check_weight

__all__ = ["CoreRoster"]


class CoreRoster:
    fair: FairShare
    classes: Classes
    holds: Holds
    _backends: dict[Hashable, Backend]
    _loads: dict[Hashable, BackendLoad]

    def _rekey_seats(self, seats: Iterable[Seat]) -> None:
        raise NotImplementedError

    def _classes_changed(self) -> None:
        raise NotImplementedError

    # -- users and groups --------------------------------------------------

    def set_user(
        self,
        user_id: Hashable,
        weight: float,
        *,
        name: str | None = None,
        group: str | None = None,
        weight_override: float | None = None,
        group_weight: float | None = None,
    ) -> None:
        """Add a user or change its weight, name or group; a new weight applies from now on.

        Args:
            weight: the user's own weight (its ``weight_override``, else its group's weight).
            weight_override: the override, if any: its weight inside its group in group shares.
            group_weight: its group's weight, if known (group shares); defaults to ``weight``.
        """
        check_weight(weight)
        for value in (weight_override, group_weight):
            if value is not None:
                check_weight(value)
        _, changed = self.fair.set_user(user_id, weight, name, group, weight_override, group_weight)
        self._rekey_seats(changed)

    def set_group(self, name: str, weight: float) -> None:
        """A group's weight changed: members without an override follow it, from now on."""
        self._rekey_seats(self.fair.set_group(name, check_weight(weight)))

    def remove_user(self, user_id: Hashable) -> None:
        """Forget a user that has nothing queued or running."""
        user = self.fair.users.get(user_id)
        if user is None:
            return
        if user.queued or user.running:
            raise ValueError(f"user {user.name!r} still has jobs queued or running")
        del self.fair.users[user_id]
        for pool in self.fair.pools.values():
            pool.seats.pop(user_id, None)

    # -- backends ----------------------------------------------------------

    def set_backend(self, backend: Backend) -> None:
        """Add a backend or replace what is known about it (configuration and telemetry)."""
        old = self._backends.get(backend.id)
        self._backends[backend.id] = backend
        self._loads.setdefault(backend.id, BackendLoad()).polled(backend)
        if old is None or (old.models, old.modalities, old.model_modalities, old.supports_json) != (
            backend.models,
            backend.modalities,
            backend.model_modalities,
            backend.supports_json,
        ):
            self._classes_changed()
        else:
            self.classes.changed(backend.id)
        if not backend.healthy or not backend.enabled or backend.draining:
            self.holds.backend_closed(backend.id)

    def remove_backend(self, backend_id: Hashable) -> None:
        """Forget a backend; jobs running there still end through complete/fail/cancel."""
        self.holds.backend_closed(backend_id)
        if self._backends.pop(backend_id, None) is not None:
            self._classes_changed()
        self._loads.pop(backend_id, None)
