"""The ``containerd.services.snapshots.v1.Snapshots`` servicer. Records and directories
change together under one metadata transaction: directories are created before the record
commits and removed after it does, so a crash can only leave an unnamed directory behind,
which ``Cleanup`` (and every start) removes."""

from __future__ import annotations

import logging
import os

import grpc
from google.protobuf import empty_pb2, timestamp_pb2

from bootseer.node import mounts
from bootseer.snapshotter.filters import parse
from bootseer.snapshotter.lazy import REF, TREE, LazyImages, is_top, placeholder_below_top
from bootseer.snapshotter.metadata import (
    ACTIVE,
    COMMITTED,
    VIEW,
    MetaStore,
    Snapshot,
    SnapshotError,
)
from bootseer.snapshotter.overlay import OverlayLayout
from bootseer.snapshotter.proto import mount_pb2, snapshots_pb2_grpc
from bootseer.snapshotter.proto import snapshots_pb2 as pb

log = logging.getLogger(__name__)
_LIST_BATCH = 100
_MAX_LABEL_BYTES = 4096   # containerd's limit on one label's key + value


def _timestamp(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def _info(s: Snapshot) -> pb.Info:
    return pb.Info(name=s.key, parent=s.parent, kind=s.kind, created_at=_timestamp(s.created),
                   updated_at=_timestamp(s.updated), labels=s.labels)


def _check_labels(labels) -> dict[str, str]:
    for k, v in labels.items():
        if len(k.encode()) + len(v.encode()) > _MAX_LABEL_BYTES:
            raise SnapshotError("INVALID_ARGUMENT",
                                f"label {k[:60]!r} is over {_MAX_LABEL_BYTES} bytes")
    return dict(labels)


def _check_key(key: str, what: str = "key") -> str:
    if not key:
        raise SnapshotError("INVALID_ARGUMENT", f"empty snapshot {what}")
    return key


class SnapshotService(snapshots_pb2_grpc.SnapshotsServicer):
    """``lazy``: converted images become remote snapshots (None: every image is pulled)."""

    def __init__(self, root: str, lazy: LazyImages | None = None):
        self.layout = OverlayLayout(root)
        self.meta = MetaStore(f"{self.layout.root}/metadata.db")
        self.lazy = lazy
        self.errors: dict[str, int] = {}   # gRPC status name -> calls answered with it
        with self.meta.transaction() as tx:
            removed = self.layout.cleanup(tx.ids())
            tops = [x for x in tx.all() if is_top(x)]
        if removed:
            log.info("removed %d directories no snapshot names: %s", len(removed), removed[:5])
        for top in tops:   # a restart: live holders adopted, dead ones' trees served again
            self._remount(top)
        if self.lazy is not None:   # running containers' ready files, watched again
            with self.meta.transaction() as tx:
                for s in tx.all():
                    top = next((p for p in tx.parents(s) if is_top(p)), None)
                    if s.kind == ACTIVE and top is not None:
                        self.lazy.watch(top, self.layout.fs(s))

    def close(self, *, cleanup: bool = False) -> None:
        """``cleanup``: unmount every image tree too (else their holders serve running
        containers on, for the next snapshotter)."""
        if self.lazy:
            self.lazy.close(cleanup=cleanup)
        self.meta.close()

    # -- gRPC methods: each maps a SnapshotError to its status code ---------------------
    def Prepare(self, request, context):
        return pb.PrepareSnapshotResponse(mounts=self._call(
            context, self._create, ACTIVE, request.key, request.parent, request.labels))

    def View(self, request, context):
        return pb.ViewSnapshotResponse(mounts=self._call(
            context, self._create, VIEW, request.key, request.parent, request.labels))

    def Mounts(self, request, context):
        return pb.MountsResponse(mounts=self._call(context, self._mounts, request.key))

    def Commit(self, request, context):
        self._call(context, self._commit, request.name, request.key, request.labels)
        return empty_pb2.Empty()

    def Remove(self, request, context):
        self._call(context, self._remove, request.key)
        return empty_pb2.Empty()

    def Stat(self, request, context):
        return pb.StatSnapshotResponse(info=self._call(context, self._stat, request.key))

    def Update(self, request, context):
        return pb.UpdateSnapshotResponse(info=self._call(
            context, self._update, request.info, list(request.update_mask.paths)))

    def List(self, request, context):
        infos = self._call(context, self._list, list(request.filters))
        for i in range(0, len(infos), _LIST_BATCH):
            yield pb.ListSnapshotsResponse(info=infos[i:i + _LIST_BATCH])

    def Usage(self, request, context):
        size, inodes = self._call(context, self._usage, request.key)
        return pb.UsageResponse(size=size, inodes=inodes)

    def Cleanup(self, request, context):
        self._call(context, self._cleanup)
        return empty_pb2.Empty()

    def _call(self, context, fn, *args):
        try:
            return fn(*args)
        except SnapshotError as e:
            self.errors[e.code] = self.errors.get(e.code, 0) + 1
            context.abort(getattr(grpc.StatusCode, e.code), str(e))
        except OSError as e:
            self.errors["INTERNAL"] = self.errors.get("INTERNAL", 0) + 1
            log.error("%s: %s", fn.__name__.strip("_"), e)
            context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__.strip('_')}: {e}")

    # -- semantics --------------------------------------------------------------------
    def _create(self, kind: int, key: str, parent: str, labels) -> list:
        _check_key(key)
        labels = _check_labels(labels)
        match = self.lazy.match(labels) if self.lazy and kind == ACTIVE else None
        if match and self._commit_remote(match, labels[REF], parent, labels):
            raise SnapshotError("ALREADY_EXISTS", f"snapshot {labels[REF]!r} already exists "
                                                  f"(tree {match.tree}, served lazily)")
        with self.meta.transaction() as tx:
            chain = [tx.get(parent)] + tx.parents(tx.get(parent)) if parent else []
            if chain and placeholder_below_top(chain[0]):
                raise SnapshotError(
                    "FAILED_PRECONDITION",
                    f"{parent} is a placeholder layer of the converted image tree "
                    f"{chain[0].labels[TREE]} (its files are in that image's top layer): "
                    f"another image cannot stack on it; hint: remove the converted image "
                    f"from this node, or pull this one with another snapshotter")
            s = tx.create(key, kind, parent, labels)
            self.layout.create(s)
        top = next((p for p in chain if is_top(p)), None)
        if top is not None and self.lazy is not None:
            self._remount(top)   # gone with a restarted snapshotter: back for this one
            if kind == ACTIVE:
                self.lazy.watch(top, self.layout.fs(s))
        return self._pb_mounts(s, chain)

    def _commit_remote(self, match, name: str, parent: str, labels: dict) -> bool:
        """Commit layer ``name`` of a converted image without its content (the top one
        mounts the tree); False when the tree cannot be mounted (the layer is then
        pulled as usual)."""
        lazy = self.lazy
        if lazy is None:   # no lazy images: no match is made (_create), pulled as usual
            return False
        with self.meta.transaction() as tx:
            if tx.find(name) is not None:
                return True
            s = tx.create(name, COMMITTED, parent, {**labels, **match.labels()})
            self.layout.create(s)
        if not match.top:
            return True
        try:
            lazy.mount(s, self.layout.fs(s), self._lazy_state(s))
            return True
        except Exception as e:   # noqa: BLE001 - store, FUSE: the layers are pulled instead
            log.warning("tree %s cannot be mounted (%s): pulling the image's layers",
                        match.tree, e)
            with self.meta.transaction() as tx:
                tx.remove(name)
            self.layout.remove(s)
            return False

    def _lazy_state(self, s: Snapshot) -> str:
        state = os.path.join(self.layout.dir(s), "lazy")
        os.makedirs(state, exist_ok=True)
        return state

    def _remount(self, top: Snapshot) -> None:
        if self.lazy is None or self.lazy.mounted(top):
            return
        if self.lazy.adopt(top, self._lazy_state(top)):
            return   # served on by the holder a snapshotter before this one started
        fs = self.layout.fs(top)
        if mounts.is_mount_point(fs):   # its holder died: a dead mount, detached
            mounts.lazy_unmount(fs)
        try:
            self.lazy.mount(top, fs, self._lazy_state(top))
        except Exception as e:   # noqa: BLE001 - said loudly: containers on it will fail
            log.error("tree %s of snapshot %s cannot be mounted again: %s",
                      top.labels.get(TREE), top.key, e)

    def _mounts(self, key: str) -> list:
        with self.meta.transaction() as tx:
            s = tx.get(_check_key(key))
            if s.kind == COMMITTED:
                raise SnapshotError("FAILED_PRECONDITION",
                                    f"snapshot {key!r} is committed: it has no mounts")
            return self._pb_mounts(s, tx.parents(s))

    def _commit(self, name: str, key: str, labels) -> None:
        _check_key(name, "name")
        with self.meta.transaction() as tx:
            s = tx.get(_check_key(key))
            size, inodes = self.layout.usage(s) if s.kind == ACTIVE else (0, 0)
            tx.commit(key, name, _check_labels(labels), size, inodes)

    def _remove(self, key: str) -> None:
        with self.meta.transaction() as tx:
            s = tx.get(_check_key(key))
            user = self.layout.in_use(s, own_mount=is_top(s))
            if user:
                raise SnapshotError("FAILED_PRECONDITION",
                                    f"snapshot {key!r} is in use by the mount at {user}")
            tx.remove(key)
        if self.lazy and s.kind == ACTIVE:
            self.lazy.forget(self.layout.fs(s))
        if is_top(s) and self.lazy:
            self.lazy.unmount(s)
        elif is_top(s) and os.path.ismount(self.layout.fs(s)):
            mounts.lazy_unmount(self.layout.fs(s))
        self.layout.remove(s)

    def _stat(self, key: str) -> pb.Info:
        with self.meta.transaction() as tx:
            return _info(tx.get(_check_key(key)))

    def _update(self, info, paths: list[str]) -> pb.Info:
        """Only labels are mutable: the mask ``labels`` replaces them all, ``labels.K``
        sets (or, given no value, deletes) one; no mask replaces them all."""
        with self.meta.transaction() as tx:
            s = tx.get(_check_key(info.name))
            labels = dict(s.labels)
            if not paths:
                paths = ["labels"]
            for p in paths:
                if p == "labels":
                    labels = dict(info.labels)
                elif p.startswith("labels."):
                    k = p[7:]
                    if k in info.labels:
                        labels[k] = info.labels[k]
                    else:
                        labels.pop(k, None)
                else:
                    raise SnapshotError("INVALID_ARGUMENT",
                                        f"cannot update field {p!r}: only labels are mutable")
            return _info(tx.set_labels(s.key, _check_labels(labels)))

    def _list(self, filters: list[str]) -> list:
        predicates = [parse(f) for f in filters if f]
        with self.meta.transaction() as tx:
            snaps = tx.all()
        return [_info(s) for s in snaps if not predicates or any(p(s) for p in predicates)]

    def _usage(self, key: str) -> tuple[int, int]:
        with self.meta.transaction() as tx:
            s = tx.get(_check_key(key))
        if s.kind == COMMITTED:
            return s.size, s.inodes
        return self.layout.usage(s)

    def _cleanup(self) -> None:
        with self.meta.transaction() as tx:
            self.layout.cleanup(tx.ids())

    def _pb_mounts(self, s: Snapshot, parents: list[Snapshot]) -> list:
        return [mount_pb2.Mount(type=m.type, source=m.source, options=m.options)
                for m in self.layout.mounts(s, parents)]
