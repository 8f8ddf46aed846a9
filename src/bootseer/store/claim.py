"""An exclusive claim of a ref on a store without an atomic create (an OCI registry).

Check, put, settle, read back: contenders that all saw the ref absent all put it, and after
the settle time every one of them reads the same last write, so exactly one wins. (A put
delayed past another's settle time can still make two winners; for leases that costs a
duplicate build of the same key, never a wrong result.) Stores with an atomic create (a
local directory: ``link``) do not need it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bootseer.store.digest import Digest

SETTLE_S = 1.0
"""How long a claim waits between its put and reading back who won."""


def claim_by_read_back(get_ref: Callable[[str], Digest | None],
                       put_ref: Callable[[str, Digest], None], name: str, digest: Digest, *,
                       settle_s: float = SETTLE_S,
                       sleep: Callable[[float], None] = time.sleep) -> bool:
    """Point ``name`` at ``digest`` unless it exists; True if this claim won."""
    if get_ref(name) is not None:
        return False
    put_ref(name, digest)
    sleep(settle_s)
    return get_ref(name) == digest
