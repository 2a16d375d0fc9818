"""Fairness: whose job goes next, and what each person is charged for what runs.

``Turns`` is its one face (``turns.py``); the rest are its parts: queues per
user and class (``queues.py``) and their order by priority (``order.py``),
pools of contention and each person's seat in them (``pools.py``,
``fairshare.py``), charges of running jobs (``ledger.py``), slots held for a
person about to send again (``holds.py``; whether to hold, ``anticipation.py``), the seed's priority formula
(``priority.py``) and frozen snapshots (``snapshots.py``). Nothing here knows
a backend beyond its id.
"""

from .fairshare import FairShare
from .holds import Hold
from .ledger import Charge
from .order import Order
from .pools import Pool, Seat, UserState
from .priority import PriorityTerms, apply_factor, heavy_factor, seed_priority
from .turns import Turn, Turns

__all__ = [
    "Charge",
    "FairShare",
    "Hold",
    "Order",
    "Pool",
    "PriorityTerms",
    "Seat",
    "Turn",
    "Turns",
    "UserState",
    "apply_factor",
    "heavy_factor",
    "seed_priority",
]
