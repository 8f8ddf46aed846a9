"""Build the demo's training setup once, offline, and keep it for the next run.

* a container image: a Debian bookworm rootfs (debootstrap from the apt mirror) with
  Python 3.11 as one layer and torch CPU as a second, saved as an OCI archive;
* a requirements set served as a PEP 503 index from a local wheelhouse;
* a sharded DCP checkpoint of a small transformer trained for a few steps by N ranks
  (``torchrun --nproc-per-node N train.py --init``), one per job size: each rank of a job
  of N nodes reads its own shard.

Everything lands under ``assets_dir``; a step whose output exists is skipped, and each step
writes to a temporary name and renames, so an interrupted build is redone, never reused.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.node.mounts import unmount_under

REQUIREMENTS = ["numpy==2.2.6", "safetensors==0.5.3", "tqdm==4.67.1", "PyYAML==6.0.2"]
IMPORTS = "numpy,safetensors,tqdm,yaml"
IMAGE_PYTHON = "/usr/bin/python3.11"  # Debian bookworm's interpreter, also the host's
TORCH = "torch==2.13.0"
TRAIN_ARGS = ["--dim", "512", "--layers", "6"]


class AssetError(BootseerError):
    pass


@dataclass(frozen=True)
class Assets:
    root: Path

    @property
    def image_archive(self) -> Path:
        return self.root / "image.oci.tar"

    @property
    def index(self) -> Path:
        """Served directory holding ``simple/`` and ``wheels/``."""
        return self.root / "pypi"

    @property
    def requirements(self) -> Path:
        return self.root / "requirements.txt"

    def checkpoint(self, ranks: int) -> Path:
        """The checkpoint saved by ``ranks`` ranks (one shard file per rank)."""
        return self.root / f"checkpoint-{ranks}ranks"

    @property
    def train_script(self) -> Path:
        return Path(__file__).with_name("train.py")


def _run(cmd: list[str], what: str, **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise AssetError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


def _apt_mirror() -> str:
    src = Path("/etc/apt/sources.list.d/debian.sources")
    if src.exists():
        m = re.search(r"^URIs:\s*(\S+)", src.read_text(), re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    return "http://deb.debian.org/debian"


def build_image(a: Assets, say) -> None:
    if a.image_archive.exists():
        return
    work = a.root / "image.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rootfs, torch_layer = work / "rootfs", work / "torch"
    say("debootstrap a Debian bookworm rootfs with python3 (from the apt mirror)")
    _run(["debootstrap", "--variant=minbase", "--include=python3", "bookworm", str(rootfs),
          _apt_mirror()], "debootstrap")
    say(f"install {TORCH} (CPU) for the image")
    site = torch_layer / "usr/local/lib/python3.11/dist-packages"
    # pip, not uv: the machine's pip config points at the CPU torch wheel.
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(site),
          "--disable-pip-version-check", TORCH], "pip install torch into the image")
    say("commit two layers (base, torch) with buildah and save an OCI archive")
    store = f"/tmp/bsb-{os.getpid()}"
    b = ["buildah", "--root", f"{store}/r", "--runroot", f"{store}/rr", "--storage-driver", "vfs"]
    try:
        ctr = _run([*b, "from", "scratch"], "buildah from").strip()
        _run([*b, "copy", ctr, f"{rootfs}/", "/"], "buildah copy rootfs")
        _run([*b, "commit", "-q", ctr, "demo-base"], "buildah commit base")
        ctr2 = _run([*b, "from", "demo-base"], "buildah from base").strip()
        _run([*b, "copy", ctr2, f"{torch_layer}/", "/"], "buildah copy torch")
        _run([*b, "config", "--cmd", "/usr/bin/python3", "--env", "PYTHONDONTWRITEBYTECODE=1",
              ctr2], "buildah config")
        _run([*b, "commit", "-q", ctr2, "demo-train"], "buildah commit torch")
        tmp = a.root / "image.oci.tar.tmp"
        _run([*b, "push", "-q", "demo-train", f"oci-archive:{tmp}:demo/train:latest"],
             "buildah push oci-archive")
        tmp.rename(a.image_archive)
    finally:
        unmount_under(store)
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def build_index(a: Assets, say) -> None:
    if (a.index / "simple" / "index.html").exists() and a.requirements.exists():
        return
    say("download the requirements set into a wheelhouse (PEP 503 index)")
    tmp = a.root / "pypi.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    wheels = tmp / "wheels"
    wheels.mkdir(parents=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
          "--only-binary=:all:", "-d", str(wheels), *REQUIREMENTS], "pip download")
    write_simple_index(tmp)
    shutil.rmtree(a.index, ignore_errors=True)
    tmp.rename(a.index)
    a.requirements.write_text("\n".join(REQUIREMENTS) + "\n")


def write_simple_index(root: Path) -> None:
    """``root/wheels/*.whl`` -> ``root/simple/<project>/index.html`` with sha256 fragments."""
    projects: dict[str, list[Path]] = {}
    for whl in sorted((root / "wheels").glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
        projects.setdefault(name, []).append(whl)
    simple = root / "simple"
    simple.mkdir(exist_ok=True)
    links = []
    for name, files in sorted(projects.items()):
        (simple / name).mkdir(exist_ok=True)
        rows = []
        for whl in files:
            digest = hashlib.sha256(whl.read_bytes()).hexdigest()
            rows.append(f'<a href="../../wheels/{html.escape(whl.name)}#sha256={digest}">'
                        f"{html.escape(whl.name)}</a><br>")
        (simple / name / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(rows) + "\n</body></html>\n")
        links.append(f'<a href="{name}/">{name}</a><br>')
    (simple / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")


def build_checkpoint(a: Assets, say, train_args: list[str], ranks: int) -> None:
    dest = a.checkpoint(ranks)
    if (dest / ".metadata").exists():
        return
    say(f"train a small transformer for a few steps on {ranks} ranks and save a sharded "
        f"DCP checkpoint")
    tmp = a.root / f"{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
          str(ranks), str(a.train_script), "--init", str(tmp), *train_args],
         "train.py --init", env={**os.environ, "OMP_NUM_THREADS": "1"})
    tmp.rename(dest)


def build_all(root: str | Path, say=print, train_args: list[str] = TRAIN_ARGS,
              ranks: int = 4) -> Assets:
    """Build what is missing under ``root``. ``train_args`` size the model (and so the
    checkpoint); keep one ``root`` per size. ``ranks``: the job's size, the checkpoint's
    number of shards."""
    a = Assets(Path(root))
    a.root.mkdir(parents=True, exist_ok=True)
    build_index(a, say)
    build_checkpoint(a, say, train_args, ranks)
    build_image(a, say)
    return a
