"""Command line: argument parsing only. Each module here adds one command group."""


def add_gc_verb(verbs, what: str, func) -> None:
    """``gc [--max-size 50G] [--dry-run]``, the same for every node-local store of things
    (environments, staged checkpoints): least recently used first, never one in use."""
    v = verbs.add_parser("gc", help=f"remove this node's least recently used {what} until "
                                    "the rest fit SIZE (never one in use)")
    v.add_argument("--max-size", default="50G", metavar="SIZE",
                   help=f"disk the {what} on this node may use (default 50G)")
    v.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    v.set_defaults(func=func)

