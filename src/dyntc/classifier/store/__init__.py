"""A classifier's versioned store: every kept version of it, in SQLite (a model directory,
``MODEL_DIR/dyntc.sqlite``) or in PostgreSQL (a ``postgresql://`` URL, one schema per model), with one
implementation for both.

A commit is one transaction holding the store's write lock, so a process killed at any point leaves the
old or the new version, never half of one, and concurrent writers are serialised; readers never block.
A version stores only what changed; reading verifies every blob and example against its hash.

Modules: :mod:`.versions` (:class:`ModelStore`), :mod:`.transaction` (commit and restore),
:mod:`.schema` (tables and row bytes), :mod:`.dialect` with :mod:`.sqlite` and :mod:`.postgres` (what
differs between the backends), :mod:`.common` (what they share), :mod:`.upgrade` (older formats),
:mod:`.copy` (to another location). docs/design.md gives the reasons.
"""

from dyntc.classifier.store.changes import Changes
from dyntc.classifier.store.copy import copy_store
from dyntc.classifier.store.common import (LOCK_TIMEOUT_S, POLL_S, STORE_FILE, StoreFullError, StoreUnavailableError,
                                           store_file)
from dyntc.classifier.store.dialect import is_url
from dyntc.classifier.store.schema import STORE_FORMAT, TABLES, Snapshot
from dyntc.classifier.store.transaction import Transaction
from dyntc.classifier.store.versions import ModelStore, is_store

__all__ = ["Changes", "LOCK_TIMEOUT_S", "POLL_S", "STORE_FILE", "STORE_FORMAT", "TABLES", "ModelStore", "Snapshot",
           "StoreFullError", "StoreUnavailableError", "Transaction", "copy_store", "is_store", "is_url", "store_file"]
