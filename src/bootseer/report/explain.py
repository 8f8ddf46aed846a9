"""One job's startup explained from its trace, wherever the trace lives (a directory, a
store ``bootseer run --trace URL`` uploaded to, any fsspec URL): the trace, its attempts'
views and their summaries, what ``bootseer report`` renders."""

from __future__ import annotations

import gc
import os
import tempfile

from bootseer.errors import TraceError
from bootseer.report import load, remote
from bootseer.report.summary import summarize
from bootseer.report.views import attempts
from bootseer.store import open_store


def _copied(url: str, into: str) -> str:
    """A trace under a URL (``s3://bucket/traces/job``, ``file://``, any fsspec location)
    copied into a local directory: its ``.jsonl`` files only."""
    import fsspec  # an extra (s3, hdfs...): imported only for a trace under a URL
    try:
        fs, root = fsspec.core.url_to_fs(url)
        # regular files only: a FIFO would block the copy, a link to /dev/zero fill the disk
        files = [f for f, info in fs.find(root, detail=True).items()
                 if f.endswith(".jsonl") and info.get("type") == "file"]
        for i, f in enumerate(files):
            rel = os.path.relpath(f, root)
            dest = os.path.join(into, rel if not rel.startswith("..") else f"{i}.jsonl")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            fs.get_file(f, dest)
    except ImportError as e:
        raise TraceError(f"cannot read {url}: {e} (s3:// needs the s3 extra: "
                         f"pip install 'bootseer[s3]')") from None
    except (OSError, ValueError) as e:
        raise TraceError(f"cannot read the trace at {url}: {e}") from None
    if not files:
        raise TraceError(f"{url} holds no trace files (*.jsonl)")
    return into


def _from_store(url: str, job: str | None, into: str) -> str | None:
    """Job ``job``'s traces uploaded by ``bootseer run --trace URL`` (or under ``URL/JOB``)
    into ``into``; None when neither store holds traces."""
    tries = [(url, job)]
    parent, _, last = url.rstrip("/").rpartition("/")
    if job is None and last and not parent.endswith(":/"):
        tries.append((parent, last))
    for store_url, job_id in tries:
        local = store_url[len("file://"):] if store_url.startswith("file://") else None
        if local is not None and not os.path.isdir(os.path.join(local, "refs")):
            continue   # opening a local store would create it
        try:
            store = open_store(store_url)
        except (OSError, ValueError):
            continue
        try:
            if remote.holds_traces(store):
                return remote.download(store, url, job_id, into)
        except TraceError:
            raise
        except (OSError, ValueError):   # not a store (or not one that lists): next try
            continue
        finally:
            store.close()
    return None


def build(path: str, k: float, attempt: int | None, job: str | None = None):
    """The trace at ``path``, its attempts and their summaries, kept to the end of the
    process (:func:`_keep`)."""
    gc.disable()   # 10,000s of small acyclic dicts: the cyclic collector would only cost time
    try:
        built = _build(path, k, attempt, job)
        _keep(built)
        return built
    finally:
        gc.enable()


def _keep(obj) -> None:
    """Keep ``obj`` alive to the end of the process, out of every collection and never
    freed: a 10,000-node trace is a million objects, each collection would walk them and
    freeing them one by one at exit is slow (the OS takes the memory back at once).
    A command's last use of its trace is its output, so nothing is lost."""
    holder = [obj]
    holder.append(holder)   # a cycle: clearing the modules at exit leaves its count above 0
    gc.freeze()             # and no collection, the one at exit included, looks at it


def _build(path: str, k: float, attempt: int | None, job: str | None = None):
    if "://" in path:
        with tempfile.TemporaryDirectory(prefix="bootseer-trace-") as tmp:
            t = load.load(_from_store(path, job, tmp) or _copied(path, tmp))
    else:
        t = load.load(path)
    jobs = sorted(map(str, t.jobs))
    if len(jobs) > 1:
        raise TraceError(f"{path} mixes {len(jobs)} jobs ({', '.join(jobs[:5])}): report one "
                         f"job's directory (e.g. {path}/{jobs[0]}) or use 'bootseer analyze'")
    views = attempts(t.events)
    if attempt is not None:
        views = [v for v in views if v.attempt == attempt]
    if not views:
        raise TraceError(f"{path}: no events"
                         + (f" for attempt {attempt}" if attempt is not None else ""))
    return t, views, [summarize(v, k) for v in views]
