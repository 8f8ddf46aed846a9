"""The files a checkpoint's own metadata names, for servers that give no directory listing.

* DCP: ``.metadata`` (a pickle of torch's ``Metadata``) holds a ``_StorageInfo`` per stored
  item: its ``relative_path`` (a data file, ``__0_0.distcp``, ...), ``offset`` and
  ``length`` (ckpt/plan.py's ranges come from here too).
* safetensors: ``model.safetensors.index.json``'s ``weight_map`` names the shards.

The pickle is read without torch and without running any of it: every class it names is
replaced by an inert stand-in that only keeps its arguments and state, so a hostile
``.metadata`` can name files (each still checked to stay inside the directory) but cannot
execute code.
"""

from __future__ import annotations

import io
import json
import pickle
from typing import TypeGuard

from bootseer.errors import BootseerError

DCP_METADATA = ".metadata"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
PROBED = (DCP_METADATA, SAFETENSORS_INDEX, SAFETENSORS_SINGLE)
"""Names looked up (HEAD) in a directory the server will not list."""

MAX_METADATA_BYTES = 512 << 20


class NotCheckpointMetadata(BootseerError, ValueError):
    """The metadata file cannot be read as what its name says."""


class _Inert:
    """Stands in for any class a pickle names: keeps what it was built from, runs nothing."""

    def __init__(self, *args, **kw):
        self.args, self.state = args, kw

    def __setstate__(self, state):
        self.state = state

    def __call__(self, *args, **kw):   # a pickled function (REDUCE) yields another stand-in
        return _Inert(*args, **kw)


class _InertUnpickler(pickle.Unpickler):
    _SAFE = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
             ("collections", "OrderedDict"): dict}

    def find_class(self, module, name):
        safe = self._SAFE.get((module, name))
        if safe is not None:
            return safe
        return type(name, (_Inert,), {"__module__": "bootseer.inert." + module})


def _dcp_metadata(data: bytes) -> dict:
    """The attributes of a DCP ``.metadata``'s ``Metadata``, read inert."""
    try:
        return _state(_InertUnpickler(io.BytesIO(data)).load())
    except Exception as e:  # noqa: BLE001 - any unpickling failure: not DCP metadata
        raise NotCheckpointMetadata(f"not a DCP metadata file ({type(e).__name__}: {e})") \
            from None


def dcp_items(data: bytes) -> list[tuple[str, int, int]]:
    """(relative_path, offset, length) of every item a DCP ``.metadata`` stores."""
    storage = _dcp_metadata(data).get("storage_data")
    if not isinstance(storage, dict) or not storage:
        raise NotCheckpointMetadata("no storage_data (not a torch DCP checkpoint?)")
    items: list[tuple[str, int, int]] = []
    for info in storage.values():
        s = _state(info)
        path, offset, length = s.get("relative_path"), s.get("offset"), s.get("length")
        if not (isinstance(path, str) and path and _count(offset) and _count(length)):
            raise NotCheckpointMetadata("a storage_data item without relative_path, offset "
                                        "and length")
        items.append((path, offset, length))
    return items


def dcp_sharded(data: bytes) -> bool:
    """Whether a DCP ``.metadata`` stores any tensor in parts (an FSDP or tensor-parallel
    save: each rank loads its own) rather than every tensor whole (a replicated model,
    which every rank loads whole)."""
    return _sharded(_dcp_metadata(data))


def dcp_node_reads(data: bytes) -> tuple[bool, list[tuple[str, int, int]]]:
    """:func:`dcp_sharded` and :func:`dcp_shared_items` of one ``.metadata``, read once (it
    holds an item per rank and tensor: millions in a large job)."""
    meta = _dcp_metadata(data)
    return _sharded(meta), _shared_items(meta)


def _sharded(meta: dict) -> bool:
    tensors = meta.get("state_dict_metadata")
    if not isinstance(tensors, dict):
        raise NotCheckpointMetadata("no state_dict_metadata (not a torch DCP checkpoint?)")
    for item in tensors.values():
        state = _state(item)
        chunks, size = state.get("chunks"), _shape(state.get("size"))
        if not isinstance(chunks, list) or size is None:
            continue   # bytes (pickled objects): loaded whole by whoever asks
        if len(chunks) > 1 or any(_shape(_state(c).get("sizes")) != size for c in chunks):
            return True
    return False


def dcp_shared_items(data: bytes) -> list[tuple[str, int, int]]:
    """(relative_path, offset, length) of the items every rank of a sharded DCP load reads:
    objects stored as bytes and tensors stored whole (an optimizer's step counters, a
    replicated buffer). DCP spreads them over the ranks' files, so a rank touches each
    file for them although it loads the parts of only its own."""
    return _shared_items(_dcp_metadata(data))


def _shared_items(meta: dict) -> list[tuple[str, int, int]]:
    tensors, storage = meta.get("state_dict_metadata"), meta.get("storage_data")
    if not isinstance(tensors, dict) or not isinstance(storage, dict):
        raise NotCheckpointMetadata("no state_dict_metadata or storage_data "
                                    "(not a torch DCP checkpoint?)")
    shared: list[tuple[str, int, int]] = []
    for key, info in storage.items():
        item = tensors.get(_state(key).get("fqn"))
        state = _state(item) if item is not None else {}
        chunks, size = state.get("chunks"), _shape(state.get("size"))
        whole = (not isinstance(chunks, list) or size is None   # bytes: read whole by all
                 or (len(chunks) == 1 and _shape(_state(chunks[0]).get("sizes")) == size))
        s = _state(info)
        path, offset, length = s.get("relative_path"), s.get("offset"), s.get("length")
        if whole and isinstance(path, str) and _count(offset) and _count(length):
            shared.append((path, offset, length))
    return sorted(shared)


def _shape(size: object) -> tuple | None:
    """A ``torch.Size`` stand-in's dimensions."""
    args = getattr(size, "args", None)
    if isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return None


def _count(n: object) -> TypeGuard[int]:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def dcp_files(data: bytes) -> list[str]:
    """The data files a DCP ``.metadata`` names (its ``relative_path`` values), sorted."""
    return sorted({path for path, _, _ in dcp_items(data)})


def _state(obj) -> dict:
    """The attributes a stand-in was built with (dataclasses pickle a dict, or with
    ``__slots__`` a ``(None, slots)`` pair)."""
    state = getattr(obj, "state", None)
    if isinstance(state, tuple) and len(state) == 2:
        merged = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        return merged
    return state if isinstance(state, dict) else {}


def safetensors_files(data: bytes) -> list[str]:
    """The shards a ``model.safetensors.index.json`` names, sorted."""
    try:
        weight_map = json.loads(data)["weight_map"]
        names = set(weight_map.values())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise NotCheckpointMetadata(f"not a safetensors index ({type(e).__name__}: {e})") \
            from None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise NotCheckpointMetadata("its weight_map names no files")
    return sorted(names)


def named_by(name: str, data: bytes) -> list[str]:
    """The files the metadata file ``name`` (one of :data:`PROBED`) names."""
    if name == DCP_METADATA:
        return dcp_files(data)
    if name == SAFETENSORS_INDEX:
        return safetensors_files(data)
    return []
