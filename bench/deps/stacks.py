"""bench/deps: the package stacks it measures, where their wheels are kept, and how the
node's output is read (pure helpers, unit-tested in tests/unit/test_bench_deps.py)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

PYTHON_VERSION = "3.11"   # the wheels are CPython 3.11, manylinux x86_64, CPU only


@dataclass(frozen=True)
class Stack:
    name: str
    pins: tuple[str, ...]   # the whole closure, exact versions: nothing left to resolve
    imports: str            # the first import timed after each variant
    nodes: int              # N nodes at once by default (0: that part is skipped)
    installers: bool        # also pip install and uv with a warm cache


# The 8-package set of issue #5. Small enough that restore is mostly the link's time.
SMALL = Stack(
    "small",
    ("numpy==2.2.6", "scipy==1.15.3", "pandas==2.2.3", "pyarrow==20.0.0",
     "safetensors==0.5.3", "tokenizers==0.21.1", "tqdm==4.67.1", "PyYAML==6.0.2"),
    "numpy, scipy.linalg, pandas, pyarrow, safetensors, tokenizers, yaml",
    nodes=4, installers=True)

# Issue #14's realistic stack: a data and model-tooling environment without torch (too big
# for the link and disk here): 73 pins, about 270 MB of wheels, 1.2 GB and 30k files
# installed with bytecode (17k without). The closure of numpy scipy pandas pyarrow polars
# scikit-learn transformers datasets matplotlib seaborn sympy networkx pillow tokenizers
# safetensors sentencepiece huggingface-hub statsmodels h5py pydantic rich einops PyYAML
# tqdm requests jinja2 psutil, as `uv pip compile --python-version 3.11
# --python-platform x86_64-manylinux_2_28 --only-binary :all:` resolved it from PyPI.
LARGE = Stack(
    "large",
    ("annotated-doc==0.0.7", "annotated-types==0.8.0", "anyio==4.16.0",
     "certifi==2026.10.19.post1", "charset-normalizer==3.5.3", "click==8.5.1",
     "cloudpickle==3.1.3", "contourpy==1.3.3", "cycler==0.12.1", "datasets==5.2.0",
     "dill==0.4.1", "einops==0.8.2", "filelock==4.3.1", "fonttools==4.68.0",
     "formulaic==1.2.2", "fsspec==2026.9.0", "h11==0.16.0", "h5py==3.16.0", "hf-xet==1.8.0",
     "httpcore2==2.16.2", "httpx2==2.16.2", "huggingface-hub==2.4.0", "idna==3.20",
     "interface-meta==2.0.1", "jinja2==3.1.6", "joblib==1.6.0", "kiwisolver==1.5.1",
     "markdown-it-py==4.3.0", "markupsafe==3.0.4", "matplotlib==3.11.2", "mdurl==0.1.2",
     "mpmath==1.3.0", "multiprocess==0.70.19", "narwhals==2.29.0", "networkx==3.6.1",
     "numpy==2.4.6", "packaging==26.4", "pandas==3.1.1", "patsy==1.0.3", "pillow==13.0.0",
     "polars==2.1.0", "polars-runtime-32==2.1.0", "psutil==7.2.2", "pyarrow==26.0.1",
     "pydantic==2.14.4", "pydantic-core==2.50.5", "pygments==2.21.0", "pyparsing==3.3.3",
     "python-dateutil==4.0.0", "pyyaml==6.0.4", "regex==2026.11.19", "requests==2.34.2",
     "rich==15.0.0", "safetensors==0.8.0", "scikit-learn==1.9.1", "scipy==1.17.1",
     "seaborn==0.13.2", "sentencepiece==0.2.3", "shellingham==1.5.4", "statsmodels==0.15.0",
     "sympy==1.14.0", "threadpoolctl==3.8.0", "tokenizers==0.23.3", "tqdm==4.70.1",
     "transformers==5.24.0", "truststore==0.10.5", "typer==0.29.2",
     "typing-extensions==4.16.0", "typing-inspection==0.4.5", "tzdata==2026.6",
     "urllib3==2.8.0", "wrapt==2.5.2", "xxhash==4.1.0"),
    # matplotlib, not pyplot: pyplot builds a font cache on a node's first import, the
    # same seconds for every variant, which would only dilute the ratios
    "numpy, scipy.linalg, scipy.sparse, pandas, pyarrow, pyarrow.parquet, polars, "
    "sklearn.linear_model, transformers, datasets, matplotlib, sympy, networkx, PIL.Image, "
    "tokenizers, safetensors, statsmodels.api, yaml, pydantic",
    nodes=0, installers=False)

STACKS = {s.name: s for s in (SMALL, LARGE)}
TORCH = "torch==2.13.0"


def _project(pin: str) -> str:
    """PEP 503 normalized project name of ``name==version``."""
    return re.sub(r"[-_.]+", "-", pin.split("==")[0].split("[")[0]).lower()


def pin_set_key(pins: list[str] | tuple[str, ...]) -> str:
    """A short digest of the pin set (order and name spelling do not matter), so a changed
    stack gets a new wheelhouse and an old one is never served for it."""
    norm = sorted(f"{_project(p)}=={p.split('==', 1)[1].strip()}" for p in pins)
    text = f"python={PYTHON_VERSION}\nplatform=manylinux_x86_64\n" + "\n".join(norm)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def wheelhouse_name(stack: str, pins: list[str] | tuple[str, ...]) -> str:
    """The wheelhouse's directory name in the persistent cache: ``<stack>-<pin set key>``."""
    return f"{stack}-{pin_set_key(pins)}"


def _mountinfo_entries(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) per line of a ``/proc/PID/mountinfo``, in order."""
    out = []
    for line in mountinfo.splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and rest:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((point, rest[0]))
    return out


def _under(point: str, root: str) -> bool:
    return point == root or point.startswith(root.rstrip("/") + "/")


def env_backend(mountinfo: str, prefix: str, node_roots: tuple[str, ...]) -> str:
    """What serves ``prefix`` on a node, read from the node's mount table: ``directory``
    (a restored tree, no mount of its own); ``fuse`` (the Python tree view); ``erofs`` on a
    local blob, ``erofs+fuse-blob`` when a FUSE server answers the blob's reads, either with
    ``overlay+`` before it when a writable overlay sits on top; else the filesystem types at
    the prefix as the kernel names them, lowest last. Only mounts under ``node_roots`` (the
    node's own directories) count: the namespace also holds copies of the host's mounts."""
    entries = _mountinfo_entries(mountinfo)
    at_prefix = [fs for point, fs in entries if point == prefix]
    if not at_prefix:
        return "directory"
    top = at_prefix[-1]
    if top.startswith("fuse"):
        return "fuse"
    ours = [fs for point, fs in entries if any(_under(point, r) for r in node_roots)]
    if "erofs" in ours:
        kind = "erofs+fuse-blob" if any(fs.startswith("fuse") for fs in ours) else "erofs"
        return f"overlay+{kind}" if top == "overlay" else kind
    return "+".join(reversed(at_prefix))


def parse_marks(output: str) -> dict[str, list[float]]:
    """The numbers a node's shell printed as ``MARK value`` lines (STEP in microseconds,
    IMPORT and HOT in seconds), in order; other lines are the tools' own output."""
    marks: dict[str, list[float]] = {}
    for line in output.splitlines():
        word, _, value = line.partition(" ")
        if word in ("STEP", "IMPORT", "HOT"):
            try:
                marks.setdefault(word, []).append(float(value.split()[0]))
            except (ValueError, IndexError):
                continue
    return marks


def ensure_json(output: str) -> dict:
    """The object ``deps ensure --json`` printed (on one line or indented over several):
    the last JSON object with ``how``; {} when the output has none (an installer's)."""
    import json
    decoder, found, at = json.JSONDecoder(), {}, 0
    for line in output.splitlines(keepends=True):
        if line.startswith("{"):
            try:
                obj, _ = decoder.raw_decode(output, at)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and "how" in obj:
                found = obj
        at += len(line)
    return found


WINDOW_FIGURES = ("coverage", "precision", "stall_s", "demand_chunks", "read_bytes",
                  "store_bytes", "window_s", "backend")


def parse_figures(output: str) -> dict:
    """A lazy mount's recording figures (its ``figures.json``, printed on a ``FIGURES``
    line): coverage of the start's reads by the prefetch, stalls, chunks fetched on demand,
    bytes; {} when the mount wrote none."""
    import json
    for line in output.splitlines():
        if line.startswith("FIGURES {"):
            try:
                figures = json.loads(line[len("FIGURES "):])
            except ValueError:
                return {}
            return {k: figures[k] for k in WINDOW_FIGURES if figures.get(k) is not None}
    return {}


def ratio_line(name: str, value: float, goal: float, unit: str = "x") -> str:
    """``name 0.42x (goal <= 0.5x: met)``."""
    verdict = "met" if value <= goal else "missed"
    return f"{name} {value:.2f}{unit} (goal <= {goal:g}{unit}: {verdict})"
