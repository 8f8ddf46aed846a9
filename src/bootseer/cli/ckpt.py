"""``bootseer ckpt``: striped checkpoint reads."""

from __future__ import annotations

import functools
import json
import sys

from bootseer.cli import print_json
from bootseer.cli._flags import JSON_SCHEMA, add_gc_verb, add_json_arg, add_store_arg

PROFILE_STORE_HELP = ("bootseer store of the access profiles recorded at each load (default: "
              "BOOTSEER_STORE_URL, else the embedded default directory)")

PLAN_NAMES = {"profile": "access profile recorded at the previous load",
              "dcp": "DCP .metadata", "safetensors": "safetensors headers",
              "files": "file list (no metadata, no recorded profile)"}


MIRROR_HELP = ("base URL of an exact copy of the checkpoint on another http(s) server "
               "(repeatable): slow stripes are hedged to it, failed ones fail over")


def register(sub) -> None:
    p = sub.add_parser("ckpt", help="striped checkpoint reads: mount, prefetch, gc")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("mount", help="mount a remote checkpoint directory read-only (foreground)")
    v.add_argument("url", help="fsspec URL: http(s):// (a JSON or HTML directory listing, or "
                   "none when DCP/safetensors metadata names the files), hdfs://, "
                   "webhdfs://, s3://, file://")
    v.add_argument("mountpoint", help="empty directory to mount the checkpoint at")
    v.add_argument("--mode", choices=("striped", "single"), default="striped",
                   help="single: one sequential stream per file (the fuse-dfs baseline)")
    v.add_argument("--no-prefetch", action="store_true", help="do not stream files in at mount")
    v.add_argument("--mirror", action="append", default=[], metavar="URL", help=MIRROR_HELP)
    add_store_arg(v, PROFILE_STORE_HELP)
    v.set_defaults(func=_mount)
    v = verbs.add_parser("prefetch", help="stream a checkpoint into this node's staging area")
    v.add_argument("url", help="checkpoint directory (as for mount)")
    v.add_argument("--rank", type=int,
                   help="this process's index among --world processes of the node that share "
                        "its staging: each streams a contiguous 1/W of the plan, so the node's "
                        "copy is fetched once, in parallel")
    v.add_argument("--world", type=int, help="number of such processes on this node")
    v.add_argument("--mirror", action="append", default=[], metavar="URL", help=MIRROR_HELP)
    add_store_arg(v, PROFILE_STORE_HELP)
    v.set_defaults(func=_prefetch)
    add_json_arg(add_gc_verb(verbs, "staged checkpoint files", _gc),
                 "each staged file (name, bytes, action) and what is kept")


def _mount(args) -> int:
    from bootseer.ckpt.listing import RemoteDir
    from bootseer.ckpt.mount import build_view
    from bootseer.cli._errors import reaching
    from bootseer.config import BootseerConfig
    config = BootseerConfig.from_env(overrides={"store": {"url": args.store}})
    with reaching(args.url, "checkpoint"):   # a wrong URL or missing driver fails here
        RemoteDir(args.url, mirrors=args.mirror).check_root()
    factory = functools.partial(build_view, args.url, config, mode=args.mode,
                                prefetch=not args.no_prefetch, mirrors=tuple(args.mirror))
    from bootseer.mount.fuse import run_foreground
    from bootseer.mount.serve import serve_files
    return run_foreground(factory, args.mountpoint, name="bootseer-ckpt",
                          mount_with=functools.partial(serve_files, config))


def _prefetch(args) -> int:
    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.listing import RemoteDir
    from bootseer.ckpt.prefetch import start_plan
    from bootseer.ckpt.staging import node_staging_dir
    from bootseer.cli._errors import reaching
    from bootseer.cli._status import follow, say
    from bootseer.config import BootseerConfig
    from bootseer.errors import UsageError
    if (args.rank is None) != (args.world is None):
        raise UsageError("ckpt prefetch: give --rank and --world together")
    if args.world is not None and not 0 <= args.rank < args.world:
        raise UsageError(f"ckpt prefetch: --rank {args.rank} is not in "
                         f"[0, --world {args.world})")
    config = BootseerConfig.from_env(overrides={"store": {"url": args.store}})
    with Engine(config.ckpt, config.fetch, staging=str(node_staging_dir(config)),
                store_url=config.store.url) as engine:
        with reaching(args.url, "checkpoint"):
            remote = RemoteDir(args.url, mirrors=args.mirror)
            remote.check_root()
        prefetch, kind = start_plan(engine, remote, rank=args.rank, world=args.world,
                                    config=config)
        say(f"bootseer ckpt prefetch: plan from the {PLAN_NAMES[kind]}")
        extent = _plan_extent(engine, prefetch.spans)
        follow("ckpt prefetch", sum(b - a for ranges in extent.values() for a, b in ranges),
               functools.partial(_staged_bytes, extent), prefetch.join)
        print(json.dumps({"schema": JSON_SCHEMA, "plan": kind, "stripes": len(prefetch.issued),
                          "failed": prefetch.failed, **engine.statistics().as_dict()}))
    return 1 if prefetch.failed else 0


def _plan_extent(engine, spans) -> dict:
    """The bytes a plan covers: per file, its spans merged (a plan repeats ranges: the
    metadata's order first, then every file whole)."""
    by_file: dict = {}
    for span in spans:
        f = engine.file(span.source)
        end = min(span.end, f.size)
        if end > span.start:
            by_file.setdefault(f, []).append((span.start, end))
    extent = {}
    for f, ranges in by_file.items():
        merged: list[list[int]] = []
        for a, b in sorted(ranges):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        extent[f] = [(a, b) for a, b in merged]
    return extent


def _staged_bytes(extent: dict) -> int:
    """Bytes of the plan's extent that are in the staging area now (what the bar shows)."""
    done = 0
    for f, ranges in extent.items():
        for start, end in ranges:
            for idx in range(start // f.S, (end - 1) // f.S + 1):
                if f.staged.has(idx):
                    a, b = f.staged.span(idx)
                    done += max(0, min(b, end) - max(a, start))
    return done


def _gc(args) -> int:
    from bootseer.ckpt.staging import gc, node_staging_dir
    from bootseer.config import BootseerConfig, parse_size
    where = node_staging_dir(BootseerConfig.from_env())
    report = gc(where, parse_size(args.max_size, "--max-size"), dry_run=args.dry_run)
    left = sum(used for _, used, _, action in report if action not in ("removed", "would remove"))
    if args.json:
        print_json({"staging": str(where), "dry_run": args.dry_run, "kept_bytes": left,
                    "files": [{"name": name, "bytes": used, "action": action}
                              for name, used, _, action in report]})
        return 0
    for name, used, _, action in report:
        print(f"{action}\t{used / 2**20:.0f} MiB\t{name}")
    print(f"{where}: {len(report)} staged file(s), {left / 2**20:.0f} MiB kept", file=sys.stderr)
    return 0

