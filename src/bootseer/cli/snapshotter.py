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
    s.set_defaults(func=_serve)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


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
                                     file=sys.stderr))
