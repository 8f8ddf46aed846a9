"""``bootseer doctor``: what this node has and lacks for bootseer, in one table."""

from __future__ import annotations

from bootseer.cli import print_json
from bootseer.cli._flags import add_json_arg


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check this node: FUSE, container runtimes, uv, the "
                                      "store, the cache, GPUs, kernel features",
                       description="Check what bootseer needs on this node, one line each. "
                                   "Exit 1 if a required check fails (MISSING); optional "
                                   "ones (no) only make some paths slower or unavailable.")
    add_json_arg(p, "the checks (name, ok, required, detail, hint)")
    p.set_defaults(func=_doctor)


def _doctor(args) -> int:
    from bootseer import doctor
    checks = doctor.run_checks()
    ok = doctor.healthy(checks)
    if args.json:
        print_json({"ok": ok, "checks": [c.as_dict() for c in checks]})
    else:
        print(doctor.table(checks))
    return 0 if ok else 1
