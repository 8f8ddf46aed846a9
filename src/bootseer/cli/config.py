"""``bootseer config show``: every setting in force and where it came from (a file, a
variable, the default), so a node's effective configuration is one command away."""

from __future__ import annotations

from bootseer.cli import print_json
from bootseer.cli._flags import add_json_arg


def register(sub) -> None:
    p = sub.add_parser("config", help="the settings in force: config show [--json]",
                       description="The settings bootseer runs with on this node: defaults, "
                       "then /etc/bootseer/config.toml (BOOTSEER_SYSTEM_CONFIG), the user's "
                       "file (BOOTSEER_CONFIG, else $XDG_CONFIG_HOME/bootseer/config.toml), "
                       "then BOOTSEER_<SECTION>_<FIELD> variables (docs/configuration.md).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("show", help="every setting, its value and where it came from "
                                      "(secrets shown as ***)")
    v.add_argument("section", nargs="?", help="only this section (store, cache, fetch, ...)")
    add_json_arg(v, "the settings ({section: {field: {value, source}}} and the files read)")
    v.set_defaults(func=_show)


def _show(args) -> int:
    import os

    from bootseer.config import config_files, effective
    from bootseer.errors import UsageError
    rows = effective()
    sections = sorted({s for s, *_ in rows})
    if args.section and args.section not in sections:
        import difflib
        near = difflib.get_close_matches(args.section, sections, n=1)
        raise UsageError(f"no section {args.section!r}"
                         + (f" (did you mean {near[0]}?)" if near else "")
                         + f"; sections: {', '.join(sections)}")
    rows = [r for r in rows if not args.section or r[0] == args.section]
    files = [path for path, _ in config_files(os.environ)]
    if args.json:
        doc: dict[str, dict[str, dict[str, object]]] = {}
        for section, name, value, source in rows:
            doc.setdefault(section, {})[name] = {"value": _plain(value), "source": source}
        print_json({"files": files, "settings": doc})
        return 0
    print(f"# files read: {', '.join(files) if files else 'none'}")
    width = max(len(f"{s}.{n}") for s, n, *_ in rows)
    for section, name, value, source in rows:
        print(f"{f'{section}.{name}':<{width}}  {_plain(value)!s:<24}  {source}")
    return 0


def _plain(value: object) -> object:
    """A value as JSON and a table show it (paths as text)."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
