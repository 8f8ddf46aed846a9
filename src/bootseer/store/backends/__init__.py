"""One small module per store backend (local, http, oci, fsspec); see ``store/urls.py``."""

from __future__ import annotations

import re

from bootseer.errors import StoreError

_REF = re.compile(r"[A-Za-z0-9._/-]{1,1024}")


def check_ref_name(name: str, *, url: str | None = None) -> str:
    """Validate a ref name: ``[A-Za-z0-9._/-]``, relative, no empty, ``.`` or ``..`` parts
    and no part starting with ``.`` (dot names are the backends' temp files)."""
    parts = name.split("/") if isinstance(name, str) else []
    if (not isinstance(name, str) or not _REF.fullmatch(name)
            or any(not p or p.startswith(".") for p in parts)):
        raise StoreError(f"invalid ref name {name!r}: use parts of [A-Za-z0-9._-] joined by '/' "
                         f"(relative, no empty parts, none starting with '.')", url=url)
    return name
