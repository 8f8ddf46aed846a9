"""``bootseer demo``: the end-to-end demo (the README's main command)."""

from __future__ import annotations


def register(sub) -> None:
    from bootseer.demo.main import __doc__ as doc
    from bootseer.demo.main import add_arguments
    p = sub.add_parser("demo", help="run the end-to-end demo: a real job started three ways",
                       description=doc)
    add_arguments(p)
    p.set_defaults(func=lambda args: __import__("bootseer.demo.main", fromlist=["run_demo"])
                   .run_demo(args))
