"""``bootseer csi``: the CSI node plugin (environments and checkpoints as pod volumes)."""

from __future__ import annotations

import sys

from bootseer.cli._flags import add_store_arg


def register(sub) -> None:
    from bootseer.csi import DEFAULT_ENDPOINT, DEFAULT_KUBELET_DIR, DEFAULT_STATE_DIR
    p = sub.add_parser("csi", help="CSI node plugin: environments and checkpoints as pod "
                                   "volumes (Kubernetes nodes)",
                       description="A CSI node plugin (driver csi.bootseer.dev) serving "
                                   "inline ephemeral volumes: an environment key or a "
                                   "checkpoint URL in a pod's volumeAttributes becomes a "
                                   "read-only volume (see docs/csi.md).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    s = verbs.add_parser("serve", help="serve the Identity and Node services until "
                                       "SIGINT/SIGTERM")
    s.add_argument("--endpoint", default=DEFAULT_ENDPOINT,
                   help=f"unix socket to listen on (default {DEFAULT_ENDPOINT})")
    s.add_argument("--node-id", help="this node's name, as NodeGetInfo reports it "
                                     "(default: the host name; in a pod: $(KUBE_NODE_NAME))")
    s.add_argument("--kubelet-dir", default=DEFAULT_KUBELET_DIR,
                   help=f"the kubelet's root directory: every volume's target path lies "
                        f"under its pods/ (default {DEFAULT_KUBELET_DIR})")
    s.add_argument("--state-dir", default=DEFAULT_STATE_DIR,
                   help=f"where the published volumes are recorded (default "
                        f"{DEFAULT_STATE_DIR})")
    s.add_argument("--build-wait", type=float, default=30.0, metavar="SECONDS",
                   help="a volume whose environment is being built waits this long, then "
                        "the kubelet retries (default 30)")
    s.add_argument("--allow-checkpoint", action="append", default=[], metavar="URL_PREFIX",
                   help="a checkpoint volume's URL must start with one of these "
                        "(repeatable; none given: any http(s), s3, gs, hdfs, webhdfs URL)")
    add_store_arg(s, "the store environments are published in (default $BOOTSEER_STORE_URL)")
    s.set_defaults(func=_serve)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _serve(args) -> int:
    try:
        import grpc  # noqa: F401 - the one optional dependency of this command
    except ImportError:
        from bootseer.errors import BootseerError  # this node lacks an extra: exit 1
        raise BootseerError("the CSI plugin needs grpcio and protobuf; "
                            "hint: pip install 'bootseer[containerd]'") from None
    import socket

    from bootseer.config import BootseerConfig
    from bootseer.csi.server import serve
    from bootseer.csi.volumes import Settings
    from bootseer.errors import UsageError
    if args.build_wait < 0:
        raise UsageError(f"--build-wait {args.build_wait} is negative")
    overrides = {"store": {"url": args.store}} if args.store else None
    config = BootseerConfig.from_env(overrides=overrides)
    settings = Settings(state_dir=args.state_dir, kubelet_dir=args.kubelet_dir,
                        build_wait_s=args.build_wait,
                        allowed_checkpoint_prefixes=tuple(args.allow_checkpoint))
    node_id = args.node_id or socket.gethostname()
    return serve(args.endpoint, config, settings, node_id=node_id,
                 ready=lambda: print(f"csi: serving {args.endpoint} as {node_id}",
                                     flush=True, file=sys.stderr))
