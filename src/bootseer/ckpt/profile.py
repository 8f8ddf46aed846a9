"""Access profiles: the byte ranges a checkpoint load actually read, in order, so the next
resume prefetches exactly those first (a better plan than the metadata's when the job
reads a subset: one rank's shard, the model without the optimizer).

Recorded by the engine for every read handed to a reader (mount, ``bootseer.ckpt.open``,
the DCP reader), coalesced per file (a read that continues or overlaps the file's last
range extends it). Saved when a mount is unmounted or a DCP load ends, next to the staging
data, as ``<staging>/profiles-v1/<sha256(checkpoint URL)[:32]>.json``, and pushed to the
store (when one is configured and writable) under ref ``ckpt/profile/<same name>``, so
that a resume on fresh nodes finds it too::

    {"v": 1, "kind": "bootseer.ckpt.profile", "url": "<checkpoint URL, no credentials>",
     "files": {"<relative path>": "<file identity: url|size|mtime>"},
     "ranges": [["<relative path>", start, end], ...]}

A profile is used only while every file it names still has the recorded identity (path,
size, mtime/ETag): a new checkpoint written under the same URL falls back to its metadata.

The checkpoint URL names a profile without its credentials (``user:password@``, presigned
query signatures: bootseer/redact.py), so none reach the file or the store, and a load with
rotated credentials finds the same profile. A profile of a checkpoint read with credentials
is private (0600) unless ``ckpt.staging_mode`` says ``shared``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import urllib.parse
from pathlib import Path

from bootseer import redact

log = logging.getLogger(__name__)
MAX_RANGES = 100_000  # a pathological random-read load must not grow without bound
DIR = "profiles-v1"


class AccessRecorder:
    """The ordered, coalesced ranges read, per engine (thread-safe)."""

    def __init__(self) -> None:
        self.ranges: list[list] = []      # [url, key, start, end]
        self._last: dict[str, int] = {}   # url -> index of its latest range
        self._lock = threading.Lock()

    def add(self, url: str, key: str, start: int, end: int) -> None:
        with self._lock:
            i = self._last.get(url)
            if i is not None:
                r = self.ranges[i]
                if r[1] == key and r[2] <= start <= r[3]:
                    r[3] = max(r[3], end)
                    return
            if len(self.ranges) < MAX_RANGES:
                self._last[url] = len(self.ranges)
                self.ranges.append([url, key, start, end])

    def under(self, root_url: str) -> tuple[dict[str, str], list[list]]:
        """(files, ranges) recorded for files under ``root_url``, paths made relative."""
        prefix = root_url.rstrip("/") + "/"
        files: dict[str, str] = {}
        ranges = []
        with self._lock:
            for url, key, start, end in self.ranges:
                if url.startswith(prefix):
                    rel = urllib.parse.unquote(url[len(prefix):])
                    files[rel] = key
                    ranges.append([rel, start, end])
        return files, ranges


def _name(root_url: str) -> str:
    return hashlib.sha256(redact.strip(root_url).rstrip("/").encode()).hexdigest()[:32]


def profile_path(staging_dir: str | os.PathLike, root_url: str) -> Path:
    return Path(staging_dir) / DIR / f"{_name(root_url)}.json"


def store_ref(root_url: str) -> str:
    return f"ckpt/profile/{_name(root_url)}"


def _push(store_url: str, root_url: str, blob: bytes) -> None:
    from bootseer.store import open_store
    from bootseer.store.digest import sha256_digest
    store = open_store(store_url)
    if store.writable:
        d = sha256_digest(blob)
        store.write(d, blob)
        store.set_ref(store_ref(root_url), d)


def _pull(store_url: str, root_url: str) -> bytes | None:
    from bootseer.store import open_store
    from bootseer.store.digest import verify
    store = open_store(store_url)
    d = store.get_ref(store_ref(root_url))
    if d is None:
        return None
    blob = store.read(d)
    verify(d, blob, source=store.url)
    return blob


def save(staging_dir: str | os.PathLike, root_url: str, recorder: AccessRecorder, *,
         store_url: str | None = None, private: bool = False) -> Path | None:
    """Write the profile of ``root_url`` (atomically; ``private``: mode 0600) and push it to
    ``store_url``; None when nothing under it was read. A store that cannot take it costs a
    log line."""
    files, ranges = recorder.under(root_url)
    if not ranges:
        return None
    path = profile_path(staging_dir, root_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"v": 1, "kind": "bootseer.ckpt.profile", "url": redact.strip(root_url).rstrip("/"),
           "files": files, "ranges": ranges}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    blob = json.dumps(doc, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600 if private else 0o644)   # not the umask's say
        f.write(blob)
    os.replace(tmp, path)
    if store_url:
        try:
            _push(store_url, root_url, blob)
        except Exception as e:  # noqa: BLE001 - the local copy is saved; sharing is a bonus
            log.warning("checkpoint access profile not pushed to %s: %s", redact.url(store_url),
                        redact.text(str(e)))
    return path


def load(staging_dir: str | os.PathLike, root_url: str, sources: dict, *,
         store_url: str | None = None) -> tuple[list, str]:
    """The recorded ranges ``[(rel, start, end)]`` of ``root_url`` if its files are still
    the recorded versions (``sources``: relative path -> source), with a reason otherwise.
    This node's own recording first; when it is missing or of other file versions, the one
    pushed to the store by another node (which may have loaded the new checkpoint)."""
    path = profile_path(staging_dir, root_url)
    try:
        ranges, why = _matching(json.loads(path.read_text()), path, sources)
    except FileNotFoundError:
        ranges, why = None, "no access profile recorded"
    except (OSError, ValueError) as e:
        ranges, why = None, f"access profile {path} is unreadable: {e}"
    if ranges is not None or not store_url:
        return ranges or [], why
    where = f"{redact.url(store_url)} ref {store_ref(root_url)}"
    try:
        blob = _pull(store_url, root_url)
    except Exception as e:  # noqa: BLE001 - no profile is a plan too (the metadata's)
        return [], f"{why}; the store's is unreadable: {redact.text(str(e))}"
    if blob is None:
        return [], why
    try:
        theirs, their_why = _matching(json.loads(blob), where, sources)
    except ValueError as e:
        return [], f"{why}; access profile {where} is unreadable: {e}"
    return (theirs, their_why) if theirs is not None else ([], f"{why}; {their_why}")


def _matching(doc, where, sources: dict) -> tuple[list | None, str]:
    """The ranges of a profile document if it records exactly these file versions."""
    if not isinstance(doc, dict) or doc.get("kind") != "bootseer.ckpt.profile" or doc.get("v") != 1:
        return None, f"{where} is not a version 1 checkpoint access profile"
    for rel, key in doc["files"].items():
        src = sources.get(rel)
        if src is None or src.key != key:
            return None, f"access profile {where} recorded for another version of {rel}"
    return [(rel, start, end) for rel, start, end in doc["ranges"]], "recorded access profile"
