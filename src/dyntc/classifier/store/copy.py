"""A store copied, every kept version, to a new location of either backend (``dyntc labels copy``)."""

from __future__ import annotations

from pathlib import Path

import torch

from dyntc.classifier.store.schema import TABLES, meta, now
from dyntc.classifier.store.versions import ModelStore, is_store
from dyntc.errors import DyntcError


def copy_store(source: str | Path, target: str | Path) -> dict:
    """Copy every kept version of the store at `source` to a new store at `target` (any two locations:
    directory to database, database to directory, database to database...). The copy has the same
    versions, ids, history and bytes and a store id of its own; it is one transaction, verified by
    reading its newest version back before it commits. `target` must not hold a model yet."""
    src = ModelStore.open(source)
    if is_store(target) and ModelStore(target).head_version() > 0:
        raise DyntcError(f"{ModelStore(target).where} already holds a model: copy into a new location")
    dst = ModelStore.create(target)
    counts = {}
    with src._connect() as sdb, dst._connect() as ddb:
        src.dialect.begin_read(sdb)
        dst.dialect.begin_write(ddb)
        try:
            if dst.head(ddb) != 0:
                raise DyntcError(f"{dst.where} was written to while the copy began: copy into a new location")
            for table, columns in TABLES.items():
                n = len(columns.split(","))
                insert = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['?'] * n)})"
                cursor = sdb.execute(f"SELECT {columns} FROM {table} ORDER BY 1")
                counts[table] = 0
                while batch := cursor.fetchmany(1000):
                    ddb.executemany(insert, [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                                             for row in batch])
                    counts[table] += len(batch)
            ddb.execute("INSERT INTO meta VALUES ('copied', ?) ON CONFLICT DO NOTHING",
                        (f"from {src.where} (store {meta(sdb, 'store_id')}) at {now()}",))
            head = src.head(sdb)
            if head:
                a, b = src.read(head, sdb), dst.read(head, ddb)
                if (a.weights_hash, a.document, sorted(a.labels)) != (b.weights_hash, b.document, sorted(b.labels)) or \
                        any(a.labels[n][0] != b.labels[n][0] or not torch.equal(a.labels[n][1], b.labels[n][1])
                            for n in a.labels):
                    raise DyntcError(f"the copy of {src.where} does not read back equal: nothing was committed")
                dst.dialect.announce(ddb, head)
            dst.dialect.commit(ddb)
        except BaseException:
            dst.dialect.rollback(ddb)
            raise
        finally:
            src.dialect.rollback(sdb)
    first = min((v["version"] for v in dst.versions()), default=0)
    return {"source": src.where, "target": dst.where, "versions": [first, head], "rows": counts}
