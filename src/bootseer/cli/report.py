"""``bootseer report TRACE``: explain one job's startup."""

from __future__ import annotations

from bootseer.cli._flags import add_json_file_arg


def register(sub) -> None:
    p = sub.add_parser("report", help="explain a job's startup: time to ready, gating node "
                       "and phase, stragglers, GPU-seconds lost",
                       description="Read a job's trace (a directory of .jsonl files) and print "
                                   "the per-phase breakdown, critical path and stragglers.")
    p.add_argument("trace", help="trace directory (or one .jsonl file), a store that "
                   "'bootseer run --trace URL' uploaded to (oci://, s3://, http(s)://, "
                   "file:///dir; URL/JOB or --job), or a URL of a trace directory (any "
                   "fsspec location)")
    p.add_argument("--job", metavar="ID", help="the job to report from a store holding "
                   "several")
    p.add_argument("--baseline", metavar="TRACE", help="compare with this trace")
    p.add_argument("--attempt", type=int, help="only this attempt")
    p.add_argument("-k", type=float, default=3.0, help="straggler rule: median + k*MAD (3)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    add_json_file_arg(p, "; the text report then goes to standard error, as for the others")
    p.add_argument("--chrome", metavar="FILE", help="write a Chrome/Perfetto trace (a track "
                   "per pipeline per node, absolute times)")
    p.add_argument("--otlp", metavar="FILE|URL", help="OpenTelemetry spans: write OTLP/JSON to "
                   "FILE, or send to an OTLP/HTTP receiver (http://collector:4318)")
    p.add_argument("--prom", metavar="FILE", help="write Prometheus metrics (text format, for "
                   "node_exporter's textfile collector: name it *.prom)")
    p.set_defaults(func=_run)


def _copied(url: str, into: str) -> str:
    """A trace under a URL (``s3://bucket/traces/job``, ``file://``, any fsspec location)
    copied into a local directory: its ``.jsonl`` files only."""
    import os

    import fsspec

    from bootseer.errors import TraceError
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
    import os

    from bootseer.store import open_store
    from bootseer.report import remote
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
        except remote.TraceError:
            raise
        except (OSError, ValueError):   # not a store (or not one that lists): next try
            continue
        finally:
            store.close()
    return None


def build(path: str, k: float, attempt: int | None, job: str | None = None):
    """The trace at ``path``, its attempts and their summaries, kept to the end of the
    process (:func:`_keep`)."""
    import gc
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
    freeing them one by one at exit takes 0.2 s (the OS takes the memory back at once).
    A command's last use of its trace is its output, so nothing is lost."""
    import gc
    holder = [obj]
    holder.append(holder)   # a cycle: clearing the modules at exit leaves its count above 0
    gc.freeze()             # and no collection, the one at exit included, looks at it


def _build(path: str, k: float, attempt: int | None, job: str | None = None):
    import tempfile

    from bootseer.errors import TraceError
    from bootseer.report.summary import summarize
    from bootseer.report.views import attempts
    from bootseer.report import load
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


def _run(args) -> int:
    import sys

    from bootseer.node import outputs
    from bootseer.cli import write_output
    from bootseer.errors import UsageError
    from bootseer.report import render
    otlp_url = bool(args.otlp) and args.otlp.startswith(("http://", "https://"))
    files = [p for p in (args.json, args.chrome, args.html, args.prom,
                         None if otlp_url else args.otlp) if p]
    if files.count("-") > 1:
        raise UsageError("only one of --json, --chrome, --html, --otlp, --prom can be - "
                         "(standard output)")
    for path in files:
        if path != "-":
            outputs.check(path)   # before the work, not after it
    # the text report goes to stderr when stdout carries a machine-readable output
    text_out = sys.stderr if "-" in files else sys.stdout
    t, views, sums = build(args.trace, args.k, args.attempt, args.job)
    report = render.text(sums, t.skipped_lines, t.problems)
    print(report, file=text_out)
    base = None
    if args.baseline:
        _, _, base = build(args.baseline, args.k, None)
        print(file=text_out)
        print(render.compare(sums, base), file=text_out)
    if args.json:
        write_output(args.json, render.to_json(sums))
    if args.chrome:
        write_output(args.chrome, render.chrome(views, sums))
    if args.html:
        write_output(args.html, render.to_html(views, sums, f"bootseer report: {args.trace}",
                                               report, base))
    job = str(t.events[0]["job"])
    if args.otlp:
        from bootseer.report import export_otlp
        body = export_otlp.to_json(job, views, sums)
        if otlp_url:
            export_otlp.post(args.otlp, body)
        else:
            write_output(args.otlp, body)
    if args.prom:
        from bootseer.report import export_prom
        write_output(args.prom, export_prom.text(job, views, sums))
    return 0
