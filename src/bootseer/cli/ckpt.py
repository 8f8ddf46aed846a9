"""``bootseer ckpt``: striped checkpoint reads."""

from __future__ import annotations

import functools
import json


def register(sub) -> None:
    p = sub.add_parser("ckpt", help="striped checkpoint reads: mount, prefetch")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("mount", help="mount a remote checkpoint directory read-only (foreground)")
    v.add_argument("url", help="fsspec URL: http(s):// (JSON listing), hdfs://, webhdfs://, s3://, file://")
    v.add_argument("mountpoint")
    v.add_argument("--single-stream", action="store_true",
                   help="one sequential stream per file (the fuse-dfs baseline)")
    v.add_argument("--mode", choices=("striped", "sequential"), default="striped",
                   help="sequential = --single-stream: one buffer, one request in flight")
    v.add_argument("--no-prefetch", action="store_true", help="do not stream files in at mount")
    v.set_defaults(func=_mount)
    v = verbs.add_parser("prefetch", help="stream a checkpoint into this node's staging area")
    v.add_argument("url")
    v.add_argument("--rank", type=int)
    v.add_argument("--world", type=int)
    v.set_defaults(func=_prefetch)


def _mount(args) -> int:
    from bootseer.config import BootseerConfig
    from bootseer.ckpt.mount import build_view
    from bootseer.ckpt.remote import list_files
    from bootseer.mount.fuse import run_foreground
    config = BootseerConfig.from_env()
    list_files(args.url)
    mode = "single" if args.single_stream or args.mode == "sequential" else "striped"

    factory = functools.partial(build_view, args.url, config, memory_budget=1 << 30,
                                mode=mode, prefetch=not args.no_prefetch, stats_path=None)
    return run_foreground(factory, args.mountpoint, name="bootseer-ckpt")


def _prefetch(args) -> int:
    from bootseer.config import BootseerConfig
    from bootseer.ckpt.engine import Engine
    from bootseer.ckpt.mount import staging_dir
    config = BootseerConfig.from_env()
    e = Engine(args.url, fetch=config.fetch, staging=staging_dir(config))
    e.prefetch().join()
    print(json.dumps(e.stats(), default=str))
    e.close()
    return 0
