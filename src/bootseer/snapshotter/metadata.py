"""Snapshot records, as containerd's snapshot semantics need them: a key, a kind (view,
active, committed), a parent (always committed), labels and times. One sqlite database
per snapshotter root: every call is one transaction, so a killed snapshotter never leaves
a half-made record, and records survive restarts (containerd keeps its own view of them).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field

from bootseer.errors import BootseerError

VIEW, ACTIVE, COMMITTED = 1, 2, 3   # the values of snapshots.v1.Kind
KIND_NAMES = {VIEW: "view", ACTIVE: "active", COMMITTED: "committed"}


class SnapshotError(BootseerError):
    """A call containerd made that its semantics refuse; ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


def not_found(key: str) -> SnapshotError:
    return SnapshotError("NOT_FOUND", f"snapshot {key!r} does not exist")


@dataclass
class Snapshot:
    key: str
    id: int
    kind: int
    parent: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
    size: int = 0
    inodes: int = 0


_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    key TEXT PRIMARY KEY, id INTEGER NOT NULL UNIQUE, kind INTEGER NOT NULL,
    parent TEXT NOT NULL, labels TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    size INTEGER NOT NULL DEFAULT 0, inodes INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS by_parent ON snapshots(parent);
CREATE TABLE IF NOT EXISTS counter (n INTEGER NOT NULL);
"""


class MetaStore:
    def __init__(self, path: str):
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        if self._db.execute("SELECT COUNT(*) FROM counter").fetchone()[0] == 0:
            self._db.execute("INSERT INTO counter VALUES (0)")
        self._lock = threading.Lock()   # one writer; sqlite serializes, this keeps it simple

    def close(self) -> None:
        self._db.close()

    def transaction(self):
        return _Tx(self)

    # Reads and writes below run inside ``with store.transaction() as tx``.
    def get(self, key: str) -> Snapshot:
        row = self._db.execute("SELECT key, id, kind, parent, labels, created, updated, size, "
                               "inodes FROM snapshots WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise not_found(key)
        return _snapshot(row)

    def find(self, key: str) -> Snapshot | None:
        try:
            return self.get(key)
        except SnapshotError:
            return None

    def all(self) -> list[Snapshot]:
        rows = self._db.execute("SELECT key, id, kind, parent, labels, created, updated, size, "
                                "inodes FROM snapshots ORDER BY id").fetchall()
        return [_snapshot(r) for r in rows]

    def parents(self, s: Snapshot) -> list[Snapshot]:
        """The committed chain below ``s``, nearest first."""
        chain = []
        while s.parent:
            s = self.get(s.parent)
            chain.append(s)
        return chain

    def has_children(self, key: str) -> bool:
        return self._db.execute("SELECT 1 FROM snapshots WHERE parent = ? LIMIT 1",
                                (key,)).fetchone() is not None

    def create(self, key: str, kind: int, parent: str, labels: dict[str, str]) -> Snapshot:
        if self.find(key) is not None:
            raise SnapshotError("ALREADY_EXISTS", f"snapshot {key!r} already exists")
        if parent:
            p = self.find(parent)
            if p is None:
                raise SnapshotError("NOT_FOUND", f"parent snapshot {parent!r} does not exist")
            if p.kind != COMMITTED:
                raise SnapshotError("INVALID_ARGUMENT",
                                    f"parent {parent!r} is {KIND_NAMES[p.kind]}, not committed")
        n = self._db.execute("UPDATE counter SET n = n + 1 RETURNING n").fetchone()[0]
        now = time.time()
        s = Snapshot(key, n, kind, parent, dict(labels), now, now)
        self._db.execute("INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0)",
                         (key, n, kind, parent, json.dumps(s.labels), now, now))
        return s

    def commit(self, key: str, name: str, labels: dict[str, str], size: int,
               inodes: int) -> Snapshot:
        s = self.get(key)
        if s.kind != ACTIVE:
            raise SnapshotError("FAILED_PRECONDITION",
                                f"snapshot {key!r} is {KIND_NAMES[s.kind]}: only an active "
                                f"snapshot can be committed")
        if self.find(name) is not None:
            raise SnapshotError("ALREADY_EXISTS", f"snapshot {name!r} already exists")
        now = time.time()
        self._db.execute("UPDATE snapshots SET key = ?, kind = ?, labels = ?, updated = ?, "
                         "size = ?, inodes = ? WHERE key = ?",
                         (name, COMMITTED, json.dumps(labels), now, size, inodes, key))
        return self.get(name)

    def remove(self, key: str) -> Snapshot:
        s = self.get(key)
        if self.has_children(key):
            raise SnapshotError("FAILED_PRECONDITION",
                                f"snapshot {key!r} has children: remove them first")
        self._db.execute("DELETE FROM snapshots WHERE key = ?", (key,))
        return s

    def set_labels(self, key: str, labels: dict[str, str]) -> Snapshot:
        self.get(key)
        self._db.execute("UPDATE snapshots SET labels = ?, updated = ? WHERE key = ?",
                         (json.dumps(labels), time.time(), key))
        return self.get(key)

    def ids(self) -> set[int]:
        return {r[0] for r in self._db.execute("SELECT id FROM snapshots")}


class _Tx:
    def __init__(self, store: MetaStore):
        self.store = store

    def __enter__(self) -> MetaStore:
        self.store._lock.acquire()
        self.store._db.execute("BEGIN IMMEDIATE")
        return self.store

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.store._db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.store._lock.release()


def _snapshot(row) -> Snapshot:
    key, id_, kind, parent, labels, created, updated, size, inodes = row
    return Snapshot(key, id_, kind, parent, json.loads(labels), created, updated, size, inodes)
