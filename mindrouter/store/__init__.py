"""Durable state in one SQLite file: groups, users, API keys, backends, quotas, usage and decisions.

Or, with ``[store] url``, in a PostgreSQL database that several routers share
(``postgres.py``: the same statements and migrations, translated by ``dialect.py``).

The daemon owns the file and calls the store from its event loop, so every
call is one or two indexed statements on one long-lived connection (the
sqlite3 module caches the prepared statements). WAL with ``synchronous=NORMAL``
makes each call's commit survive a SIGKILL of the process once it returns
(not a power cut, which may lose the last commits but never corrupts). The
one thing done elsewhere: the daemon checkpoints the WAL from a thread with a
connection of its own (``checkpoint.py``), so that no commit on its loop waits
for a checkpoint's fsyncs.

Invariants:
    - API keys are stored only as SHA-256 hex plus a short display prefix.
    - User and backend ids are never reused (AUTOINCREMENT), because usage
      rows and decision records refer to them after a removal.
    - Decision records are pruned as a prefix of ids, in batches, so an
      insert is O(1) amortized and at most ``max_decisions + batch`` are kept.
    - ``import_`` validates everything before it writes, then writes in one
      transaction: bad input changes nothing.
"""

from .changes import Change, describe, describe_field, pool_changes
from .db import Store
from .errors import AlreadyExists, InUse, InvalidValue, NotFound, StoreError
from .rows import QUOTA_FIELDS, ApiKeyInfo, BackendRow, Group, Quota, UsageReport, UsageRow, UsageTotal, User
from .schema import SCHEMA_VERSION, migrate
from .usage import DIMENSIONS
from .validate import ENGINES, IMPORT_FIELDS, STATES, DecisionRow, decision_row, encode_record

__all__ = [
    "DIMENSIONS",
    "ENGINES",
    "IMPORT_FIELDS",
    "QUOTA_FIELDS",
    "SCHEMA_VERSION",
    "STATES",
    "AlreadyExists",
    "ApiKeyInfo",
    "BackendRow",
    "Change",
    "DecisionRow",
    "Group",
    "InUse",
    "InvalidValue",
    "NotFound",
    "Quota",
    "Store",
    "StoreError",
    "UsageReport",
    "UsageRow",
    "UsageTotal",
    "User",
    "decision_row",
    "describe",
    "describe_field",
    "encode_record",
    "migrate",
    "pool_changes",
]
