#!/usr/bin/env python3
"""Write docs/api.md, the Python API reference, from the public modules' docstrings.

    .venv/bin/python scripts/gen-api-doc.py          # rewrite docs/api.md
    .venv/bin/python scripts/gen-api-doc.py --check  # exit 1 when docs/api.md is stale

Each module's public names are its ``__all__`` (the names a user imports); classes list
their public methods and documented attributes. Signatures come from ``inspect``, so the
page says what the code accepts, not what someone remembered to write down.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "api.md"

# (module, names): names None means the module's __all__
MODULES: list[tuple[str, list[str] | None]] = [
    ("bootseer", ["ready"]),
    ("bootseer.trace", None),
    ("bootseer.ckpt", None),
    ("bootseer.ckpt.dcp", ["StripedDCPReader"]),
    ("bootseer.store", None),
]

HEADER = """# Python API

Generated from the docstrings by `scripts/gen-api-doc.py` (a test checks that this page
is up to date: edit the docstrings, then run the script). The command line is in
[commands.md](commands.md) and [cli.md](cli.md); what each subsystem does is in its own page.
"""


def doc(obj) -> list[str]:
    """The object's own docstring (never one inherited from a base such as ``io`` or
    ``Protocol``), as paragraph lines; none when it has none."""
    own = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return [inspect.cleandoc(own), ""] if own else []


class _Shown:
    """An annotation kept as written (``from __future__ import annotations`` makes them
    strings; repr would quote them)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature(name: str, obj) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name

    def shown(a):
        return _Shown(a) if isinstance(a, str) else a
    params = [p.replace(annotation=shown(p.annotation)) for p in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=shown(sig.return_annotation))
    return f"{name}{sig}"


def members(cls) -> list[tuple[str, object]]:
    """Public methods and properties defined by ``cls`` itself (not inherited), in source
    order."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if inspect.isfunction(value) or isinstance(value, (property, classmethod, staticmethod)):
            out.append((name, value))
    return out


def attribute_docs(cls) -> list[tuple[str, str]]:
    """``name: type`` attributes documented by a string right under them (PEP 257 style),
    read from the source since Python keeps no such docstrings."""
    import ast
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return []
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = []
    for stmt, nxt in zip(body, body[1:] + [None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            text = ""
            if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant) \
                    and isinstance(nxt.value.value, str):
                text = inspect.cleandoc(nxt.value.value)
            out.append((f"{stmt.target.id}: {ast.unparse(stmt.annotation)}", text))
    return out


def render_class(qual: str, cls) -> list[str]:
    if getattr(cls, "_is_protocol", False):   # a typing.Protocol: no constructor to show
        lines = [f"### protocol `{qual}`", "", "A `typing.Protocol`: what every "
                 f"`{cls.__name__}` provides.", ""] + doc(cls)
    else:
        lines = [f"### class `{signature(qual, cls)}`", ""] + doc(cls)
    attrs = [f"- `{attr}`" + (f": {text}" if text else "") for attr, text in attribute_docs(cls)]
    lines += attrs + ([""] if attrs else [])
    for name, value in members(cls):
        fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        label = name if isinstance(value, property) else signature(name, fn)
        kind = "property " if isinstance(value, property) else ""
        lines += [f"#### {kind}`{qual}.{label}`", ""] + doc(fn)
    return lines


def render_module(modname: str, names: list[str] | None) -> list[str]:
    mod = importlib.import_module(modname)
    names = names if names is not None else list(getattr(mod, "__all__", []))
    lines = [f"## `{modname}`", ""] + doc(mod)
    for name in names:
        obj = getattr(mod, name)
        qual = f"{modname}.{name}"
        if inspect.isclass(obj) and obj.__module__ == "builtins":   # a type alias
            lines += [f"### `{qual}`", "", f"An alias of `{obj.__name__}`.", ""]
        elif inspect.isclass(obj):
            lines += render_class(qual, obj)
        elif callable(obj):
            lines += [f"### `{signature(qual, obj)}`", ""] + doc(obj)
        else:
            lines += [f"### `{qual}`", "", f"`{obj!r}`", ""]
    return lines


def render() -> str:
    lines = [HEADER]
    for modname, names in MODULES:
        lines += render_module(modname, names)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed page instead of writing it")
    args = ap.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"error: {PAGE.relative_to(REPO)} is out of date with the docstrings",
                  file=sys.stderr)
            print("hint: run scripts/gen-api-doc.py and commit docs/api.md", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
