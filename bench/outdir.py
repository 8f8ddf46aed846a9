"""Where every benchmark writes: ``bench/results/`` (ignored by git, so a fresh clone has
none). A bench asks for its output path here and the directory exists when it writes.

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import outdir
    outdir.write_json("image.json", {...})

``BOOTSEER_BENCH_RESULTS`` moves the directory (the tests point it at a temporary one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "results"


def root() -> Path:
    return Path(os.environ.get("BOOTSEER_BENCH_RESULTS") or DEFAULT)


def path(name: str | os.PathLike, *, is_dir: bool = False) -> Path:
    """``name`` under the results directory (an absolute path is kept as given), its
    parent made (the path itself too when ``is_dir``)."""
    p = root() / name
    (p if is_dir else p.parent).mkdir(parents=True, exist_ok=True)
    return p


def write_json(name: str | os.PathLike, data, **kw) -> Path:
    p = path(name)
    p.write_text(json.dumps(data, indent=1, default=str, **kw) + "\n")
    return p
