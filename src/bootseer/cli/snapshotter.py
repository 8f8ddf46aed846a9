"""``bootseer snapshotter``: the containerd proxy snapshotter."""

from __future__ import annotations

import sys


def register(sub) -> None:
    from bootseer.snapshotter.server import DEFAULT_ADDRESS, DEFAULT_ROOT
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
    s.set_defaults(func=_serve)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _serve(args) -> int:
    try:
        import grpc  # noqa: F401 - the one optional dependency of this command
    except ImportError:
        from bootseer.errors import UsageError
        raise UsageError("the snapshotter needs grpcio and protobuf; "
                         "hint: pip install 'bootseer[containerd]'") from None
    from bootseer.snapshotter.server import serve
    return serve(args.address, args.root,
                 ready=lambda: print(f"snapshotter: serving {args.address}", flush=True,
                                     file=sys.stderr))
