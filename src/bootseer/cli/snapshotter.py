"""``bootseer snapshotter``: the containerd proxy snapshotter."""

from __future__ import annotations

import sys

from bootseer.cli._flags import add_store_arg


def register(sub) -> None:
    from bootseer.snapshotter import DEFAULT_ADDRESS, DEFAULT_ROOT  # (no grpc import)
    p = sub.add_parser("snapshotter", help="containerd proxy snapshotter (Kubernetes nodes)",
                       description="A containerd proxy snapshotter: containerd's snapshots.v1 "
                                   "API on a unix socket. Configure containerd with "
                                   "[proxy_plugins.bootseer] type = \"snapshot\", address = "
                                   "this socket (see deploy/kubernetes/).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    s = verbs.add_parser("serve", help="serve snapshots until SIGINT/SIGTERM")
    s.add_argument("--address", default=DEFAULT_ADDRESS,
                   help=f"unix socket to listen on (default {DEFAULT_ADDRESS})")
    s.add_argument("--root", default=DEFAULT_ROOT,
                   help=f"directory for snapshots and their records (default {DEFAULT_ROOT})")
    add_store_arg(s, "the store converted images are in (default $BOOTSEER_STORE_URL); "
                     "without one every image is pulled as usual")
    s.add_argument("--window", type=float, default=120.0, metavar="SECONDS",
                   help="a converted image's recording window closes after this long "
                        "(default 120) or at its ready file")
    s.add_argument("--ready-file", default="/run/bootseer/ready", metavar="PATH",
                   help="a container creating this path (set $BOOTSEER_READY_FILE to it in "
                        "the pod) closes its image's recording window "
                        "(default /run/bootseer/ready)")
    s.add_argument("--metrics-addr", default=None, metavar="HOST:PORT",
                   help="serve /metrics (Prometheus), /healthz and /readyz there "
                        "(e.g. 127.0.0.1:9464; default: no endpoint)")
    s.add_argument("--cleanup-on-close", action="store_true",
                   help="unmount every image tree on exit (default: their processes serve "
                        "running containers on, and the next snapshotter adopts them)")
    s.set_defaults(func=_serve)
    _register_install(verbs, DEFAULT_ADDRESS)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _register_install(verbs, address: str) -> None:
    from bootseer.snapshotter.install import DEFAULT_CONFIG
    i = verbs.add_parser("install", help="patch containerd's config for bootseer (--uninstall "
                                         "puts the original back)",
                         description="Adds the proxy plugin and a runtime handler whose "
                                     "snapshotter is bootseer to containerd's config (version 2: "
                                     "1.6/1.7, version 3: 2.x); idempotent; the original is kept "
                                     "in CONFIG.bootseer-backup. Restart containerd afterwards.")
    i.add_argument("--config", default=DEFAULT_CONFIG, help=f"default {DEFAULT_CONFIG}")
    i.add_argument("--socket", default=address,
                   help=f"the snapshotter's socket (default {address})")
    i.add_argument("--runtime-class", default="bootseer", metavar="NAME",
                   help="runtime handler and proxy plugin name (default bootseer)")
    i.add_argument("--default", action="store_true",
                   help="also make bootseer the node-wide CRI snapshotter (every pod; see the "
                        "bootstrap caveat in docs/kubernetes.md)")
    i.add_argument("--dry-run", action="store_true", help="print the new config, write nothing")
    i.add_argument("--uninstall", action="store_true",
                   help="restore the config saved at install, byte for byte")
    i.set_defaults(func=_install)


def _containerd_version() -> str | None:
    import shutil
    import subprocess
    if not shutil.which("containerd"):
        return None
    out = subprocess.run(["containerd", "--version"], capture_output=True, text=True).stdout
    parts = out.split()   # "containerd github.com/containerd/containerd 1.6.20~ds1 ..."
    return parts[2].lstrip("v") if len(parts) > 2 else None


def _install(args) -> int:
    from pathlib import Path

    from bootseer.snapshotter import install
    path = Path(args.config)
    if args.uninstall:
        if args.dry_run:
            print(f"would restore {path} from {path}{install.BACKUP_SUFFIX}")
            return 0
        if not install.uninstall(path):
            from bootseer.cli._errors import with_hint
            from bootseer.errors import UsageError
            raise with_hint(UsageError(f"{path}: no {path.name}{install.BACKUP_SUFFIX}: "
                                       "bootseer install did not patch it"),
                            "nothing to roll back; edit the file by hand if needed")
        print(f"{path}: original restored; restart containerd", file=sys.stderr)
        return 0
    p = install.plan(path, socket=args.socket, runtime_class=args.runtime_class,
                     default=args.default, containerd_version=_containerd_version())
    for note in p.notes:
        print(f"bootseer: note: {note}", file=sys.stderr)
    if args.dry_run:
        sys.stdout.write(p.text if p.text is not None else "")
        print(f"{path}: " + ("unchanged (already installed)" if p.text is None
                             else "would be patched"), file=sys.stderr)
        return 0
    changed = install.apply(p)
    print(f"{path}: " + (f"patched (version {p.version}); restart containerd" if changed
                         else "unchanged (already installed)"), file=sys.stderr)
    return 0


def _serve(args) -> int:
    try:
        import grpc  # noqa: F401 - the one optional dependency of this command
    except ImportError:
        from bootseer.errors import BootseerError  # this node lacks an extra: exit 1
        raise BootseerError("the snapshotter needs grpcio and protobuf; "
                            "hint: pip install 'bootseer[containerd]'") from None
    from bootseer.config import BootseerConfig, store_url_from_env
    from bootseer.snapshotter.lazy import LazyImages
    from bootseer.snapshotter.server import serve
    overrides = {"store": {"url": args.store}} if args.store else None
    config = BootseerConfig.from_env(overrides=overrides)
    lazy = None
    if args.store or store_url_from_env():
        lazy = LazyImages(config, window_s=args.window, ready_file=args.ready_file)
    return serve(args.address, args.root, lazy,
                 ready=lambda: print(f"snapshotter: serving {args.address}", flush=True,
                                     file=sys.stderr),
                 metrics_addr=args.metrics_addr, cleanup_on_close=args.cleanup_on_close)
