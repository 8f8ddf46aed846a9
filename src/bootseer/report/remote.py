"""Traces in a store: ``--trace URL`` (oci://, s3://, an http(s) store, file:///dir).

Events are appended line by line to local files, which a store cannot take. So a command
traced to a URL records into a spool directory on the node and uploads each trace file as
a blob plus a ref ``traces/<job>/<attempt>/<file>``: every ``FLUSH_INTERVAL_S`` while it
runs (a job that trains for days still shows its startup) and once more at its end.
``bootseer report URL --job ID`` lists those refs and reads the blobs back.

A location that cannot be written is an error before anything starts; an upload that fails
later is a warning (tracing never fails the job) and the spool is kept for a retry.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from bootseer import redact
from bootseer.config import BootseerConfig, section_env, start_env, trace_start
from bootseer.errors import TraceError
from bootseer.store import open_store
from bootseer.store.digest import sha256_digest
from bootseer.trace.record import new_start_id

log = logging.getLogger(__name__)

REF_ROOT = "traces"
FLUSH_INTERVAL_S = 30.0
# Short plain parts: an OCI registry keeps a ref as a tag of at most 128 characters and can
# list it back only when no part holds '--' (see store/backends/oci.py).
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,39}")
_PROBE = b'{"bootseer": "trace location probe"}\n'


def is_url(location: str | None) -> bool:
    return location is not None and "://" in location


def ref_part(text: str) -> str:
    """``text`` as one ref part: itself when plain, else a cleaned prefix and a hash."""
    if _PLAIN.fullmatch(text) and "--" not in text:
        return text
    cleaned = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._-]", "_", text))
    safe = cleaned.lstrip("._-")[:24].rstrip("-")
    return f"{safe or 'x'}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def ref_name(job: str, attempt: str, file: str) -> str:
    stem, dot, ext = file.rpartition(".")
    if ref_part(file) != file:   # the extension kept: readers look for *.jsonl
        file = f"{ref_part(stem)}.{ext}" if dot and _PLAIN.fullmatch(ext) else ref_part(file)
    return f"{REF_ROOT}/{ref_part(job)}/{ref_part(attempt)}/{file}"


def _redacted(url: str) -> str:
    return redact.url(url)


def open_writable(url: str, config=None):
    """The store at ``url``, after proving it takes a blob: an error now, not at the end."""
    store = None
    try:
        store = open_store(url, config)
        store.write(sha256_digest(_PROBE), _PROBE)
        return store
    except (OSError, ValueError) as e:
        if store is not None:
            store.close()
        raise TraceError(f"cannot record traces to {_redacted(url)}: "
                         f"{redact.text(str(e))}") from None


def spool_dir(config, start_id: str) -> Path:
    """Where this start records before upload: beside the node cache, else in $TMPDIR."""
    for base in (Path(config.cache.dir).parent / "trace-spool",
                 Path(tempfile.gettempdir()) / f"bootseer-trace-spool-{os.getuid()}"):
        path = base / start_id
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            return path
        except OSError:
            continue
    raise TraceError("cannot create a trace spool directory beside the node cache "
                     f"({config.cache.dir}) or in {tempfile.gettempdir()}")


def upload(store, spool: Path) -> int:
    """Each ``<job>/<attempt>/<file>.jsonl`` under ``spool`` as a blob + ref; files sent."""
    sent = 0
    for path in sorted(spool.glob("*/*/*.jsonl")):
        job, attempt = path.parent.parent.name, path.parent.name
        data = path.read_bytes()
        if not data:
            continue
        digest = sha256_digest(data)
        name = ref_name(job, attempt, path.name)
        if store.get_ref(name) == digest:
            continue
        if not store.exists(digest):
            store.write(digest, data)
        store.set_ref(name, digest)
        sent += 1
    return sent


@contextlib.contextmanager
def recording(config, start_id: str):
    """``config`` as the command should run it: a URL location becomes a spool directory,
    uploaded every ``FLUSH_INTERVAL_S`` and at the end. Other locations pass through."""
    url = config.trace.location
    if not is_url(url):
        yield config
        return
    store = open_writable(url, config)
    spool = spool_dir(config, start_id)
    stop = threading.Event()

    def flush() -> bool:
        try:
            upload(store, spool)
            return True
        except (OSError, ValueError) as e:
            log.warning("trace upload to %s failed (%s); the files stay in %s",
                        _redacted(url), e, spool)
            return False

    def periodic() -> None:
        while not stop.wait(FLUSH_INTERVAL_S):
            flush()

    flusher = threading.Thread(target=periodic, name="trace-upload", daemon=True)
    flusher.start()
    try:
        yield config.replace(trace={"location": str(spool)})
    finally:
        stop.set()
        flusher.join()
        if flush():
            shutil.rmtree(spool, ignore_errors=True)
        store.close()


@contextlib.contextmanager
def command_recording(location: str | None):
    """Where a command (``bootseer trace``) records: True when somewhere. A store URL
    becomes a spool directory (exported, so the command's own traced processes record
    there too) that is uploaded when the block ends, as under ``bootseer run --trace URL``."""
    if location:
        os.environ.update(section_env("trace", location=location))
    config = BootseerConfig.from_env()
    if not is_url(config.trace.location):
        yield bool(config.trace.location)
        return
    # a start id in the file names: two commands of a node never upload to one ref, even
    # when their pids are the same (each in its own container)
    start = trace_start() or new_start_id()
    with recording(config, start) as spooled:
        os.environ.update({**section_env("trace", location=spooled.trace.location),
                           **start_env(start)})
        yield True


# -- reading ----------------------------------------------------------------------------------

def jobs(store) -> list[str]:
    """The job parts under ``traces/`` (as ref parts: see :func:`ref_part`)."""
    return sorted({name.split("/")[1] for name in store.list_refs(f"{REF_ROOT}/")
                   if name.count("/") == 3})


def download(store, url: str, job: str | None, into: str) -> str:
    """Job ``job``'s trace files from the store at ``url`` into ``into/<attempt>/``."""
    found = jobs(store)
    if job is None:
        if len(found) != 1:
            listed = ", ".join(found[:10]) or "none"
            raise TraceError(f"{_redacted(url)} holds the traces of {len(found)} jobs "
                             f"({listed}): name one with --job")
        part = found[0]
    else:
        part = ref_part(job)
    names = list(store.list_refs(f"{REF_ROOT}/{part}/"))
    if not names:
        raise TraceError(f"{_redacted(url)} holds no trace of job {job or part}"
                         + (f" (jobs: {', '.join(found[:10])})" if found else ""))
    for name in names:
        _, _, attempt, file = name.split("/")
        digest = store.get_ref(name)
        if digest is None:   # removed while listing
            continue
        dest = Path(into) / attempt / (file if file.endswith(".jsonl") else f"{file}.jsonl")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(store.read(digest))
    return into


def holds_traces(store) -> bool:
    return next(iter(store.list_refs(f"{REF_ROOT}/")), None) is not None
