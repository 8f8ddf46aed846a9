"""``bootseer image``: convert, mount lazily, record, prefetch, run."""

from __future__ import annotations

import argparse
import json
import sys

from bootseer.cli import print_json, say_none
from bootseer.cli._flags import (
    IMAGE_REF_HELP,
    JSON_SCHEMA,
    add_fallback_arg,
    add_json_arg,
    add_ready_regex_arg,
    add_store_arg,
    ready_regex,
)


def register(sub) -> None:
    p = sub.add_parser("image", help="lazy container images with hot-block prefetch")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("convert", help="convert an image (registry ref, OCI layout dir, "
                         "docker-archive tar) into a tree in the store; print its digest")
    v.add_argument("src", help="registry reference (host:port/repo:tag), OCI image layout "
                               "directory, image tar, or a skopeo transport (docker://REF, "
                               "oci:DIR:TAG, containers-storage:REF, oci-archive:TAR, ...)")
    add_store_arg(v, "store URL (default: settings)")
    v.add_argument("--to", dest="store", help=argparse.SUPPRESS)   # its first spelling
    v.add_argument("--chunk-size", default="1MiB", metavar="SIZE",
                   help="bytes per content-addressed chunk of a file")
    _add_registry_args(v)
    add_json_arg(v, "the tree's digest, size (bytes of file data) and chunk count")
    v.set_defaults(func=_convert)
    v = verbs.add_parser("ls", help="images converted into the store (name, tree)")
    add_store_arg(v)
    add_json_arg(v, "the images (name, tree)")
    v.set_defaults(func=_ls)
    v = verbs.add_parser("inspect", help="a converted image: size, files, chunks, packs, "
                         "source metadata, hot-block profile coverage")
    v.add_argument("ref", help=IMAGE_REF_HELP)
    add_store_arg(v)
    add_json_arg(v, "the figures")
    v.set_defaults(func=_inspect)
    v = verbs.add_parser("rm", help="remove converted images from the store: their names "
                         "(refs), not their blobs; `bootseer store gc` reclaims those")
    v.add_argument("refs", nargs="+", metavar="REF",
                   help="the image as converted (SRC), its name in `image ls`, or a tree "
                        "digest (every name of that tree)")
    add_store_arg(v)
    add_json_arg(v, "the refs removed")
    v.set_defaults(func=_rm)
    v = verbs.add_parser("mount", help="mount an image read-only and lazily (foreground)")
    v.add_argument("ref", help=IMAGE_REF_HELP)
    v.add_argument("mountpoint", help="empty directory to mount the image's root at")
    add_store_arg(v)
    v.add_argument("--record", action="store_true", help="record and push the hot-block profile")
    v.add_argument("--prefetch", nargs="?", const="latest", metavar="PROFILE",
                   help="prefetch the hot blocks (the latest profile, or this profile digest)")
    v.add_argument("--window", type=float, default=600.0, help="recording window timeout, s")
    v.set_defaults(func=_mount)
    v = verbs.add_parser("prefetch", help="fetch an image's hot blocks into the node cache "
                         "(before any container exists)")
    v.add_argument("ref", help=IMAGE_REF_HELP)
    add_store_arg(v)
    v.add_argument("--profile", metavar="DIGEST", help="profile digest (default: the latest)")
    v.set_defaults(func=_prefetch)
    pr = verbs.add_parser("profile", help="merge, push, show hot-block profiles")
    pv = pr.add_subparsers(dest="pverb", metavar="ACTION", required=True)
    x = pv.add_parser("merge", help="merge recorded profiles (files) into one")
    x.add_argument("files", nargs="+", metavar="FILE",
                   help="recorded profile (JSON); - is standard input")
    x.add_argument("--min-support", type=float, default=0.0, metavar="FRACTION",
                   help="keep only chunks read by at least this fraction of the runs")
    x.add_argument("--budget", default=None, help="byte budget, e.g. 2GiB")
    x.add_argument("-o", "--output", help="write here; - is standard output (the default)")
    x.set_defaults(func=_merge)
    x = pv.add_parser("push", help="store a profile file; point the tree's profile ref at it")
    x.add_argument("file", help="profile (JSON) from `image profile merge` or a recording; "
                               "- is standard input")
    add_store_arg(x)
    x.set_defaults(func=_push)
    x = pv.add_parser("show", help="show the latest profile of an image")
    x.add_argument("ref", help=IMAGE_REF_HELP)
    add_store_arg(x)
    add_json_arg(x, "the profile's tree, hot chunks, bytes and runs")
    x.set_defaults(func=_show)
    v = verbs.add_parser("run", help="mount the image and run CMD in it as the container root")
    v.add_argument("ref", help=IMAGE_REF_HELP)
    add_store_arg(v)
    only = v.add_mutually_exclusive_group()   # default: both, as under `bootseer run`
    only.add_argument("--record", action="store_true",
                      help="only record this start's hot blocks (no prefetch: a cold start)")
    only.add_argument("--prefetch", action="store_true",
                      help="only prefetch the recorded hot blocks (publish no new profile)")
    add_ready_regex_arg(v, "close the recording window at the first line of CMD's output "
                           "matching REGEX (else when CMD creates $BOOTSEER_READY_FILE)")
    add_fallback_arg(v)
    v.add_argument("argv", nargs="+", metavar="-- CMD", help="the command to run in the image")
    v.set_defaults(func=_run)


def _config(url):
    from bootseer.config import BootseerConfig
    return BootseerConfig.from_env(overrides={"store": {"url": url}})


def _add_registry_args(v) -> None:
    """skopeo's and podman's spellings for what a registry pull needs."""
    v.add_argument("--authfile", metavar="PATH",
                   help="registry logins (auth.json or docker's config.json, credential "
                        "helpers included); default: $REGISTRY_AUTH_FILE, "
                        "containers/auth.json, ~/.docker/config.json, as podman looks")
    v.add_argument("--creds", metavar="USER:PASS",
                   help="registry login (never printed; passed to skopeo in a private file)")
    v.add_argument("--tls-verify", action=argparse.BooleanOptionalAction, default=None,
                   help="verify the registry's TLS certificate and require https (default: "
                        "yes, except for a registry on loopback)")
    v.add_argument("--platform", default=None, metavar="OS/ARCH[,...]|all",
                   help="which images of a multi-platform index to convert, one tree each, "
                        "e.g. linux/arm64 or linux/amd64,linux/arm64 (default: all it "
                        "offers; a single-platform image must then be this node's)")
    v.add_argument("--no-referrer", dest="referrer", action="store_false",
                   help="do not push the referrer artifact that announces the tree into the "
                        "source repository (default: push it when the registry allows)")


def _convert(args) -> int:
    from bootseer.config import parse_size
    from bootseer.image.convert import convert_image
    from bootseer.image.registry import RegistryOptions
    from bootseer.store import open_store
    registry = RegistryOptions(authfile=args.authfile, creds=args.creds,
                               tls_verify=args.tls_verify, platform=args.platform,
                               referrer=args.referrer)
    config = _config(args.store)
    store = open_store(args.store, config)
    from bootseer.cli._status import StageBars, show_progress
    with StageBars() as bars:   # the registry pull, then the layers (of their totals)
        done = convert_image(args.src, store,
                             chunk_size=parse_size(args.chunk_size, "--chunk-size"),
                             progress=bars if show_progress() else None, registry=registry,
                             node=config.mount.platform or None)
    digest = done.tree   # this node's platform's: what `image run` here will mount
    if args.json:
        print_json({"digest": digest, **_tree_figures(store, digest), "platforms": done.trees})
    else:
        print(digest)
        if len(done.trees) > 1:
            from bootseer.cli._status import say
            say("one tree per platform (a node takes its own): " + ", ".join(
                f"{p} {tree}" for p, tree in done.trees.items()))
    return 0


def _toc(store, tree: str):
    from bootseer.store.client import process_fetcher
    from bootseer.tree.reader import load_toc
    with process_fetcher().lane() as f:
        return load_toc(store, tree, f)


def _tree_figures(store, tree: str, toc=None) -> dict:
    """Bytes of file data and chunks of a converted tree, from its table of contents."""
    files = list((toc or _toc(store, tree)).files())
    return {"size": sum(e.size for e in files),
            "chunks": sum(len(e.chunks or ()) for e in files)}


IMAGE_REFS = "images/by-name/"
PLATFORM_REFS = "images/platforms/"   # bootseer.image.platforms: one tree per platform


def _ls(args) -> int:
    from bootseer.store import open_store
    store = open_store(args.store, _config(args.store))
    images = [{"name": n[len(IMAGE_REFS):], "tree": store.get_ref(n)}
              for n in store.list_refs(IMAGE_REFS)]
    if args.json:
        print_json({"store": store.url, "images": images})
    elif not images:
        say_none("converted images", store.url,
                 f"bootseer image convert SRC --to {store.url}")
    else:
        for i in images:
            print(f"{i['name']}\t{i['tree']}")
    return 0


def _rm(args) -> int:
    from bootseer.errors import BlobNotFound
    from bootseer.image.convert import ref_name
    from bootseer.store import open_store
    from bootseer.tree import profile as prof
    store = open_store(args.store, _config(args.store))
    names = {n: tree for n in store.list_refs(IMAGE_REFS)
             if (tree := store.get_ref(n)) is not None}   # a ref removed meanwhile: gone
    chosen: list[str] = []
    for ref in args.refs:   # every REF is checked before anything is removed
        found = ([n for n, tree in names.items() if tree == ref] if ref.startswith("sha256:")
                 else [n for n in (IMAGE_REFS + ref, ref_name(ref)) if n in names][:1])
        if not found:
            raise BlobNotFound(f"no converted image {ref!r} in {store.url} (see `bootseer "
                               f"image ls`)", url=store.url)
        chosen += [n for n in found if n not in chosen]
    for n in list(chosen):   # a multi-platform image's other trees go with its name
        for p in store.list_refs(f"{PLATFORM_REFS}{n[len(IMAGE_REFS):]}/"):
            if (tree := store.get_ref(p)) is not None:
                names[p] = tree
                chosen.append(p)
    trees = {names[n] for n in chosen}
    removed = list(chosen)
    for n in chosen:
        store.delete_ref(n)
    # a tree no name reaches any more: its manifest refs and profile go too, so gc can
    # reclaim it (a tree another name still has keeps them)
    still_named = {tree for n, tree in names.items() if n not in chosen}
    for tree in sorted(trees - still_named):
        extra = [n for n in store.list_refs("images/by-manifest/") if store.get_ref(n) == tree]
        if store.get_ref(prof.ref_for(tree)) is not None:
            extra.append(prof.ref_for(tree))
        for n in extra:
            store.delete_ref(n)
        removed += extra
    if args.json:
        print_json({"store": store.url, "removed": removed})
    else:
        for n in removed:
            print(f"removed {n}")
        from bootseer.cli._status import say
        say("blobs stay until `bootseer store gc` removes those no ref reaches")
    return 0


def _inspect(args) -> int:
    from bootseer.image import convert
    from bootseer.store import open_store
    from bootseer.tree import profile as prof
    config = _config(args.store)
    store = open_store(args.store, config)
    tree = convert.resolve(args.ref, store, config.mount.platform or None)
    toc = _toc(store, tree)
    figures = _tree_figures(store, tree, toc)
    packed = sum(store.stat(p) for p in toc.packs)
    p = prof.latest(store, tree)
    hot = None if p is None else {
        "chunks": len(p["chunks"]), "bytes": sum(r[4] for r in p["chunks"]), "runs": p["runs"],
        "coverage": round(sum(r[4] for r in p["chunks"]) / figures["size"], 4)
        if figures["size"] else 0.0}
    doc = {"tree": tree, **figures, "files": sum(1 for _ in toc.files()),
           "entries": len(toc.entries), "chunk_size": toc.chunk_size,
           "packs": len(toc.packs), "packed_bytes": packed, "meta": toc.meta,
           "profile": hot}
    if args.json:
        print_json(doc)
        return 0
    from bootseer.cli._status import size
    print(f"tree        {tree}")
    print(f"data        {size(figures['size'])} in {doc['files']} files "
          f"({doc['entries']} entries), {figures['chunks']} chunks of "
          f"{toc.chunk_size // 1024} KiB")
    print(f"stored      {size(packed)} in {doc['packs']} pack(s)")
    for key in ("source", "manifest", "entrypoint", "cmd", "workdir"):
        if doc["meta"].get(key):
            print(f"{key:<11} {doc['meta'][key]}")
    print("profile     " + ("none recorded" if hot is None else
                            f"{hot['chunks']} hot chunks, {size(hot['bytes'])} "
                            f"({hot['coverage']:.1%} of the data), {hot['runs']} run(s)"))
    return 0


def _mount(args) -> int:
    import os
    import signal
    import time

    from bootseer.image.session import mount_image
    from bootseer.node.alive import StateDir
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
        from bootseer import trace  # the start's figures, when a trace is configured
        from bootseer.tree.session import window_attrs
        trace.mark("image.window", **window_attrs(json.loads(text)))
    if record:
        digest = prof.publish_recorded(config, os.path.join(state, "profile.json"))
        if digest:
            print(f"profile {digest}", file=sys.stderr)
    return 0


def _prefetch(args) -> int:
    from bootseer.image import convert
    from bootseer.store import live
    from bootseer.store.client import StoreClient
    from bootseer.tree import profile as prof
    from bootseer.tree.prefetch import Prefetcher
    from bootseer.tree.reader import TreeReader
    config = _config(args.store)
    client = StoreClient.of(config)
    store = client.store()
    tree = convert.resolve(args.ref, store, config.mount.platform or None)
    profile = prof.load(store, args.profile) if args.profile else prof.latest(store, tree)
    if profile is None:
        print(f"no profile for {tree}: nothing to prefetch (record one with --record)",
              file=sys.stderr)
        return 0
    prof.check(profile, tree)
    from bootseer.cli._status import follow
    with client.lane() as f:
        held = live.hold(client.cache.root, tree)   # store gc keeps it while we fetch
        try:
            # whole hot chunks, not the hot pack: a later start then finds them all local
            p = Prefetcher(TreeReader(store, tree, f, client.cache), profile,
                           use_pack=False).start()
            s = p.stats
            follow("prefetch", s["planned_chunks"],
                   lambda: s["fetched_chunks"] + s["already_local"] + s["errors"],
                   _finished(p.wait), unit=" chunks")
        finally:
            if held is not None:
                held.release()
    print(json.dumps({"schema": JSON_SCHEMA, **p.stats}))
    return 0


def _finished(wait):
    """``finished(timeout)`` for :func:`~bootseer.cli._status.follow` of a blocking
    ``wait()``: it runs in a thread of its own."""
    import threading
    waiter = threading.Thread(target=wait, daemon=True, name="bootseer-wait")
    waiter.start()

    def finished(timeout: float) -> bool:
        waiter.join(timeout)
        return not waiter.is_alive()
    return finished


def _merge(args) -> int:
    from bootseer.config import parse_size
    from bootseer.tree import profile as prof
    budget = parse_size(args.budget, "--budget") if args.budget else None
    profiles = [_read_profile(f) for f in args.files]
    try:
        merged = prof.merge(profiles, min_support=args.min_support, byte_budget=budget)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise prof.ProfileError(f"cannot merge {', '.join(args.files)}: not recorded "
                                f"profiles ({type(e).__name__}: {e})") from None
    from bootseer.cli import write_output
    write_output(args.output or "-", json.dumps(merged))
    return 0


def _read_profile(path: str) -> dict:
    """A profile file; ``-`` is standard input (``image profile merge ... | image profile
    push -``)."""
    from bootseer.tree import profile as prof
    try:
        if path == "-":
            profile = json.load(sys.stdin)
        else:
            with open(path) as f:
                profile = json.load(f)
    except OSError as e:
        raise prof.ProfileError(f"cannot read the profile {path}: {e.strerror}") from None
    except ValueError as e:
        raise prof.ProfileError(f"cannot read the profile {path}: not JSON ({e})") from None
    if not isinstance(profile, dict) or profile.get("kind") != "bootseer.profile" \
            or not isinstance(profile.get("chunks"), list):
        raise prof.ProfileError(f"{path} is not a bootseer hot-block profile (record one with "
                                f"`image mount --record` or make one with `image profile "
                                f"merge`)")
    return profile


def _push(args) -> int:
    from bootseer.store import open_store
    from bootseer.tree import profile as prof
    profile = _read_profile(args.file)
    print(prof.push(open_store(args.store, _config(args.store)), profile))
    return 0


def _show(args) -> int:
    from bootseer.image import convert
    from bootseer.store import open_store
    from bootseer.tree import profile as prof
    config = _config(args.store)
    store = open_store(args.store, config)
    tree = convert.resolve(args.ref, store, config.mount.platform or None)
    p = prof.latest(store, tree)
    if p is None:
        if args.json:
            print_json({"tree": tree, "profile": None})
        else:
            print(f"no profile for {tree}")
        return 1
    hot = prof.hot_bytes(p)
    total = hot["chunk_bytes"]
    if args.json:
        print_json({"tree": tree, "profile": {"chunks": len(p["chunks"]), "bytes": total,
                                              "block_bytes": hot["block_bytes"],
                                              "runs": p["runs"]}})
        return 0
    print(f"tree {tree}: {len(p['chunks'])} hot chunks, {total / 2**20:.1f} MiB "
          f"({hot['block_bytes'] / 2**20:.1f} MiB in the blocks read), {p['runs']} run(s)")
    return 0


def _run(args) -> int:
    from bootseer.cli._status import run_node
    from bootseer.run.node import RunSpec
    argv = args.argv[1:] if args.argv[0] == "--" else args.argv
    spec = RunSpec(argv=argv, image=args.ref, image_mode="lazy", prefetch=not args.record,
                   record=not args.prefetch, ready_regex=ready_regex(args.ready_regex),
                   fallback=args.fallback)
    return run_node(spec, _config(args.store))
