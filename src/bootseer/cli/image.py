"""``bootseer image``: convert, mount lazily, record, prefetch, run."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("image", help="lazy container images with hot-block prefetch")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("convert", help="convert an image (registry ref, OCI layout dir, "
                         "docker-archive tar) into a tree in the store; print its digest")
    v.add_argument("src")
    v.add_argument("--to", metavar="STORE", help="store URL (default: settings)")
    v.add_argument("--chunk-size", default="1MiB")
    v.set_defaults(func=_convert)
    v = verbs.add_parser("mount", help="mount an image read-only and lazily (foreground)")
    v.add_argument("ref", help="tree digest, store ref, or the converted image's reference")
    v.add_argument("mountpoint")
    v.add_argument("--store", metavar="URL")
    v.add_argument("--record", action="store_true", help="record and push the hot-block profile")
    v.add_argument("--prefetch", nargs="?", const="latest", metavar="PROFILE",
                   help="prefetch the hot blocks (the latest profile, or this profile digest)")
    v.add_argument("--window", type=float, default=600.0, help="recording window timeout, s")
    v.set_defaults(func=_mount)
    v = verbs.add_parser("prefetch", help="fetch an image's hot blocks into the node cache "
                         "(before any container exists)")
    v.add_argument("ref")
    v.add_argument("--store", metavar="URL")
    v.add_argument("--profile", metavar="DIGEST", help="profile digest (default: the latest)")
    v.set_defaults(func=_prefetch)
    pr = verbs.add_parser("profile", help="merge, push, show hot-block profiles")
    pv = pr.add_subparsers(dest="pverb", metavar="ACTION", required=True)
    x = pv.add_parser("merge", help="merge recorded profiles (files) into one")
    x.add_argument("files", nargs="+")
    x.add_argument("--min-support", type=float, default=0.0)
    x.add_argument("--budget", default=None, help="byte budget, e.g. 2GiB")
    x.add_argument("-o", "--output", help="write here (default stdout)")
    x.set_defaults(func=_merge)
    x = pv.add_parser("push", help="store a profile file; point the tree's profile ref at it")
    x.add_argument("file")
    x.add_argument("--store", metavar="URL")
    x.set_defaults(func=_push)
    x = pv.add_parser("show", help="show the latest profile of an image")
    x.add_argument("ref")
    x.add_argument("--store", metavar="URL")
    x.set_defaults(func=_show)
    v = verbs.add_parser("run", help="mount the image and run CMD in it as the container root")
    v.add_argument("ref")
    v.add_argument("--store", metavar="URL")
    only = v.add_mutually_exclusive_group()   # default: both, as under `bootseer run`
    only.add_argument("--record", action="store_true",
                      help="only record this start's hot blocks (no prefetch: a cold start)")
    only.add_argument("--prefetch", action="store_true",
                      help="only prefetch the recorded hot blocks (publish no new profile)")
    v.add_argument("--ready-regex", metavar="REGEX",
                   help="close the recording window at the first line of CMD's output "
                        "matching REGEX (else when CMD creates $BOOTSEER_READY_FILE)")
    v.add_argument("argv", nargs="+", metavar="-- CMD")
    v.set_defaults(func=_run)


def _config(url):
    from bootseer.config import BootseerConfig
    return BootseerConfig.from_env(overrides={"store": {"url": url}})


def _convert(args) -> int:
    from tqdm import tqdm
    from bootseer.config import parse_size
    from bootseer.image.convert import convert
    from bootseer.store import open_store
    store = open_store(args.to, _config(args.to))
    with tqdm(unit="B", unit_scale=True, desc="convert", disable=not sys.stderr.isatty()) as bar:
        digest = convert(args.src, store, chunk_size=parse_size(args.chunk_size),
                         progress=bar.update)
    print(digest)
    return 0


def _mount(args) -> int:
    import os
    import signal
    import time
    from bootseer.alive import StateDir
    from bootseer.image.session import mount_image
    from bootseer.tree.session import TRIGGER
    config = _config(args.store)
    state_dir = StateDir("bsimg-")   # swept by the next command if we are SIGKILLed
    state = str(state_dir.path)
    stop = []   # handlers first: a SIGTERM once the mount is visible must still unmount
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda n, f: stop.append(n))
    try:
        handle, tree, profile, _ = mount_image(
            config, args.ref, args.mountpoint, state, record=args.record,
            prefetch=args.prefetch is not None,
            profile_digest=None if args.prefetch in (None, "latest") else args.prefetch,
            window_timeout_s=args.window)
        print(f"mounted {tree} at {args.mountpoint}"
              + (f", prefetching {len(profile['chunks'])} hot chunks" if profile else ""),
              flush=True)
        print(f"startup window: closes after {args.window:g} s, at unmount, or on "
              f"`touch {os.path.join(state, TRIGGER)}` (the job is ready)", flush=True)
        while not stop and handle.proc.is_alive():
            time.sleep(0.2)
        handle.unmount()
        return _publish(config, state, args.record)
    finally:
        state_dir.close()


def _publish(config, state, record: bool) -> int:
    import os
    from bootseer.tree import profile as prof
    figures = os.path.join(state, "figures.json")
    if os.path.exists(figures):
        text = open(figures).read()
        print(text, file=sys.stderr)
        from bootseer import trace   # the start's figures, when a trace is configured
        from bootseer.tree.session import window_attrs
        trace.mark("image.window", **window_attrs(json.loads(text)))
    if record:
        digest = prof.publish_recorded(config, os.path.join(state, "profile.json"))
        if digest:
            print(f"profile {digest}", file=sys.stderr)
    return 0


def _prefetch(args) -> int:
    from bootseer.image import convert
    from bootseer.tree import profile as prof
    from bootseer.tree.prefetch import Prefetcher
    from bootseer.store import open_store
    from bootseer.store.cache import NodeCache
    from bootseer.store.fetch import Fetcher
    from bootseer.tree.reader import TreeReader
    config = _config(args.store)
    store = open_store(config.store.url, config)
    tree = convert.resolve(args.ref, store)
    profile = prof.load(store, args.profile) if args.profile else prof.latest(store, tree)
    if profile is None:
        print(f"no profile for {tree}: nothing to prefetch (record one with --record)",
              file=sys.stderr)
        return 0
    prof.check(profile, tree)
    with Fetcher(config.fetch) as f:
        p = Prefetcher(TreeReader(store, tree, f, NodeCache(config.cache)), profile).start()
        p.wait()
    print(json.dumps(p.stats))
    return 0


def _merge(args) -> int:
    from bootseer.config import parse_size
    from bootseer.tree import profile as prof
    merged = prof.merge([json.load(open(f)) for f in args.files], min_support=args.min_support,
                        byte_budget=parse_size(args.budget) if args.budget else None)
    out = json.dumps(merged)
    if args.output:
        from bootseer import outputs
        outputs.write_text(args.output, out)
    else:
        print(out)
    return 0


def _push(args) -> int:
    from bootseer.tree import profile as prof
    from bootseer.store import open_store
    try:
        with open(args.file) as f:
            profile = json.load(f)
    except (OSError, ValueError) as e:
        raise prof.ProfileError(f"cannot read the profile {args.file}: {e}") from e
    print(prof.push(open_store(args.store, _config(args.store)), profile))
    return 0


def _show(args) -> int:
    from bootseer.image import convert
    from bootseer.tree import profile as prof
    from bootseer.store import open_store
    store = open_store(args.store, _config(args.store))
    tree = convert.resolve(args.ref, store)
    p = prof.latest(store, tree)
    if p is None:
        print(f"no profile for {tree}")
        return 1
    total = sum(r[4] for r in p["chunks"])
    print(f"tree {tree}: {len(p['chunks'])} hot chunks, {total / 2**20:.1f} MiB, {p['runs']} run(s)")
    return 0


def _run(args) -> int:
    from bootseer.cli.run import ready_regex_arg
    from bootseer.run.node import NodeRun, RunSpec
    argv = args.argv[1:] if args.argv[0] == "--" else args.argv
    spec = RunSpec(argv=argv, image=args.ref, image_mode="lazy", prefetch=not args.record,
                   record=not args.prefetch, ready_regex=ready_regex_arg(args.ready_regex))
    return NodeRun(spec, _config(args.store)).run()
