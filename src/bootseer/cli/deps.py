"""``bootseer deps``: dependency snapshots."""

from __future__ import annotations

import json
import sys

from bootseer.cli import print_json, say_none
from bootseer.cli._flags import add_gc_verb, add_index_url_arg, add_json_arg, add_store_arg


def register(sub) -> None:
    p = sub.add_parser("deps", help="dependency snapshots: build once, restore everywhere")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("ensure", help="make PREFIX hold SPEC's environment (warm, restore, "
                                        "or build once); a restore mounts the snapshot where "
                                        "the kernel has EROFS")
    v.add_argument("spec", help="requirements file, pyproject.toml or uv.lock")
    v.add_argument("--prefix", required=True,
                   help="where the environment lives (same on every node)")
    v.add_argument("--python", help="interpreter (default: this one)")
    add_index_url_arg(v)
    v.add_argument("--key", help="key from 'bootseer deps key' (skips resolving on a warm node)")
    add_store_arg(v)
    v.add_argument("--wait", type=float, default=600.0, help="seconds to wait for another builder")
    v.add_argument("--mount", action="store_true",
                   help="mount the snapshot lazily at PREFIX instead of restoring it (a FUSE "
                        "server keeps serving after this returns; 'bootseer deps umount' stops it)")
    v.add_argument("--window", type=float, default=120.0, metavar="S",
                   help="with --mount: seconds of start-up reads recorded as the hot-block "
                        "profile that the next node's mount prefetches (default 120)")
    form = v.add_mutually_exclusive_group()
    form.add_argument("--copy", action="store_true",
                      help="restore a plain directory (extracted files) instead of mounting "
                           "the snapshot, for tools that need one")
    form.add_argument("--read-only", action="store_true",
                      help="mount the restored snapshot read-only, exactly as published (default: "
                           "writable through an overlay whose changes 'deps umount' drops)")
    add_json_arg(v, "how the environment was made (warm, restored, built...), its key, prefix "
                    "and form (directory, mount, lazy)")
    v.set_defaults(func=_ensure)
    v = verbs.add_parser("umount", help="unmount an environment (a mounted restore or --mount); "
                                        "lazily while files are open")
    v.add_argument("prefix", help="the PREFIX given to 'deps ensure'")
    v.set_defaults(func=_umount)
    v = verbs.add_parser("key", help="resolve SPEC and print the environment key")
    v.add_argument("spec", help="requirements file, pyproject.toml or uv.lock")
    v.add_argument("--prefix", required=True,
                   help="where the environment will live (part of the key)")
    v.add_argument("--python", help="interpreter (default: this one)")
    add_index_url_arg(v)
    v.set_defaults(func=_key)
    v = verbs.add_parser("ls", help="environments published in the store")
    add_store_arg(v)
    add_json_arg(v, "the environments (key, prefix, tree)")
    v.set_defaults(func=_ls)
    v = add_gc_verb(verbs, "environments", _gc)
    v.add_argument("--host-proc", default=None, metavar="DIR",
                   help="the node's /proc mounted here (a pod without hostPID): what its "
                        "processes and mounts use is kept; default: this /proc, refused in a "
                        "PID namespace of its own")
    v = verbs.add_parser("verify", help="re-hash a restored environment against its snapshot")
    v.add_argument("prefix", help="a restored environment")
    add_store_arg(v)
    add_json_arg(v, "the result (ok, the files checked, each problem: missing or modified "
                    "and its path)")
    v.set_defaults(func=_verify)


def _config(url):
    from bootseer.config import BootseerConfig
    return BootseerConfig.from_env(overrides={"store": {"url": url}})


def prefix_arg(path: str | None) -> str | None:
    """``--prefix``: refused when it, or a folder above it, is a file (else the build
    fails halfway with "File exists")."""
    import os

    from bootseer.errors import UsageError
    if path is None:
        return None
    at = os.path.abspath(path)
    while not os.path.lexists(at) and os.path.dirname(at) != at:
        at = os.path.dirname(at)
    if os.path.lexists(at) and not os.path.isdir(at):
        what = "is" if at == os.path.abspath(path) else f"lies under {at}, which is"
        raise UsageError(f"--prefix {path} {what} a file, not a directory")
    return path


def _ensure(args) -> int:
    from bootseer.cli._status import show_progress
    from bootseer.deps.ensure import ensure
    from bootseer.errors import UsageError
    prefix_arg(args.prefix)
    if args.mount and (args.copy or args.read_only):
        raise UsageError("--mount serves the snapshot lazily: it takes neither --copy nor "
                         "--read-only (its mount is read-only)")
    bar = None

    def progress(n: int, total: int) -> None:
        nonlocal bar
        if bar is None:    # tqdm only when there is something to show (a warm node has not)
            from tqdm import tqdm
            bar = tqdm(total=total, unit="B", unit_scale=True, desc="restore", file=sys.stderr,
                       dynamic_ncols=True, disable=not show_progress())
        if bar.total != total:
            bar.total = total
        bar.update(n)
    try:
        r = ensure(args.spec, args.prefix, python=args.python, index_urls=args.index_url,
                   key=args.key, config=_config(args.store), wait_s=args.wait,
                   progress=progress, mount=args.mount, mount_window_s=args.window,
                   copy=args.copy, writable=not args.read_only)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print_json({"how": r.how, "key": r.key, "prefix": r.prefix, "form": r.form})
    else:
        print(f"{r.how} {r.key} {r.prefix}")
    return 0


def _umount(args) -> int:
    import os

    from bootseer.deps.mounts import unmount
    if not unmount(os.path.abspath(args.prefix)):
        print(f"no environment is mounted at {args.prefix}", file=sys.stderr)
        return 1
    return 0


def _gc(args) -> int:
    from bootseer.config import parse_size
    from bootseer.deps.gc import gc
    from bootseer.node.procfs import node_view
    view = node_view(args.host_proc, "deps gc")
    report = gc(_config(None), parse_size(args.max_size, "--max-size"), dry_run=args.dry_run,
                view=view)
    for env, action in report:
        print(f"{action}\t{env.bytes / 2**20:.0f} MiB\t{env.prefix}\t{env.key[:19]}")
    if not report:
        print("no environments recorded on this node")
    return 0


def _key(args) -> int:
    import os

    from bootseer.deps.resolve import resolve_key
    print(resolve_key(args.spec, os.path.abspath(args.prefix), args.python or sys.executable,
                      args.index_url).key)
    return 0


def _ls(args) -> int:
    from bootseer.store import open_store
    store = open_store(args.store, _config(args.store))
    envs = []
    for name in store.list_refs("deps/env/"):
        digest = store.get_ref(name)
        if digest is None:   # removed since it was listed
            continue
        m = json.loads(store.read(digest))
        envs.append({"key": f"sha256:{name.rsplit('/', 1)[1]}", "prefix": m["prefix"],
                     "tree": m["tree"]})
    if args.json:
        print_json({"store": store.url, "environments": envs})
        return 0
    if not envs:
        say_none("published environments", store.url,
                 "bootseer deps ensure SPEC --prefix DIR publishes one")
    for e in envs:
        print(f"{e['key']}\t{e['prefix']}\t{e['tree']}")
    return 0


def _verify(args) -> int:
    import os

    from bootseer.deps.prefix import read_marker
    from bootseer.deps.relocate import rewrite_bytes
    from bootseer.deps.verify import bytes_match, file_matches
    from bootseer.errors import BootseerError
    from bootseer.store import open_store
    from bootseer.store.client import process_fetcher
    from bootseer.tree.reader import TreeReader
    m = read_marker(args.prefix)
    if not m or not m.get("tree"):
        raise BootseerError(f"{args.prefix} is not a restored bootseer environment")
    moved = m.get("relocated") or {}
    rewritten = {"/" + p for p in moved.get("text", [])}
    store = open_store(args.store, _config(args.store))
    problems: list[dict] = []
    files = 0

    def problem(kind: str, path: str) -> None:
        problems.append({"problem": kind, "path": path})
        if not args.json:
            print(f"{kind} {path}")
    with process_fetcher().lane() as f:
        reader = TreeReader(store, m["tree"], f)
        cs = reader.toc.chunk_size
        for e in reader.toc.files():
            files += 1
            path = os.path.join(args.prefix, e.path.lstrip("/"))
            want = None
            if e.path in rewritten:   # relocated: the snapshot's bytes, rewritten
                want = rewrite_bytes(reader.read(e.path, e.size, 0), moved["from"],
                                     os.path.abspath(args.prefix))
            try:   # read in blocks: a 2 GB library never sits in memory whole
                ok = (bytes_match(path, want) if want is not None
                      else file_matches(path, e.chunks or (), cs, e.size))
            except OSError:
                problem("missing", e.path)
                continue
            if not ok:
                problem("modified", e.path)
    if args.json:
        print_json({"prefix": args.prefix, "key": m.get("key"), "tree": m["tree"],
                    "ok": not problems,
                    "files": files, "problems": problems})
    else:
        print(f"{'OK' if not problems else 'FAILED'}: {len(problems)} problem(s)")
    return 1 if problems else 0
