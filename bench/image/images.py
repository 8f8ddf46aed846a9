"""bench/image's two workloads, each an image built offline once into the assets directory
on top of the demo image (bootseer.demo.assets: Debian bookworm, Python 3.11, torch CPU),
with one more layer:

  heldout (default)  numpy + a 144M-parameter bf16 model in the safetensors layout (JSON
                     header, then the tensors; ~290 MB, incompressible). The start imports
                     torch and numpy and opens the model as safetensors does (the header
                     read, the data mmapped), then touches what a first step on a short
                     prompt needs: 256 embedding rows, the position table's first rows, the
                     first two blocks' weights and the final norm. The start touches about
                     a tenth of the image's bytes, sparsely in the big files (the shape of
                     issue #25's held-out image, a workload this project did not tune for).
  data               numpy, an app and --data-mib of data files: the start imports torch,
                     its distributed checkpoint module, numpy and the app, and reads 6 MiB
                     of each data file (bench/image's workload before issue #25).
Each workload writes $BOOTSEER_READY_FILE and prints READY once it could take a step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

DATA_FILES = 4
SITE = "usr/local/lib/python3.11/dist-packages"
READY = "open(os.environ['BOOTSEER_READY_FILE'], 'w').close(); print('READY', flush=True)"

DATA_WORKLOAD = ("import os, sys; sys.path.insert(0, '/opt/app'); "
                 "import torch, torch.nn, torch.distributed.checkpoint, numpy, app.main; "
                 "app.main.warm_up(); " + READY)
DATA_APP = '''"""The benchmark's training application: at start-up it reads the parts of its data
files a first step needs (a header, a vocabulary table, a slice of each shard)."""
import glob
import os

import numpy

DATA = "/opt/app/data"


def warm_up():
    total = 0
    for path in sorted(glob.glob(os.path.join(DATA, "*.bin"))):
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            for offset in (0, size // 3, size - (4 << 20)):
                f.seek(offset)
                total += numpy.frombuffer(f.read(2 << 20), dtype=numpy.uint8).size
    return total
'''

# A GPT-2-small-like shape, widened to ~144M parameters: vocabulary 48000 x 768, 1024
# positions, 15 blocks (qkv, projection, two MLP matrices, their biases, two norms).
VOCAB, DIM, POSITIONS, BLOCKS = 48000, 768, 1024, 15
HELDOUT_WORKLOAD = ("import os, sys; sys.path.insert(0, '/opt/app'); "
                    "import torch, torch.nn, numpy, app.model; app.model.first_step(); " + READY)
HELDOUT_APP = '''"""The held-out workload's start: open the model as safetensors does (header read,
data mmapped, tensors made over the mapping without copying), then touch what a first step
on a short prompt needs."""
import json
import mmap
import struct

import torch

MODEL = "/opt/app/model/model.safetensors"


def open_model(path=MODEL):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    base = 8 + n
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        tensors[name] = torch.frombuffer(mm, dtype=torch.bfloat16, count=(b - a) // 2,
                                         offset=base + a).view(t["shape"])
    return tensors


def first_step(prompt=256):
    w = open_model()
    ids = torch.randint(0, w["wte"].shape[0], (prompt,), generator=torch.Generator().manual_seed(0))
    x = w["wte"][ids].float() + w["wpe"][:prompt].float()
    for i in range(2):
        for name, t in w.items():
            if name.startswith(f"h.{i}."):
                x = x + t.float().mean()
    return float((x * w["ln_f.weight"].float()).sum())
'''


def model_tensors() -> list[tuple[str, list[int]]]:
    out = [("wte", [VOCAB, DIM]), ("wpe", [POSITIONS, DIM])]
    for i in range(BLOCKS):
        h = f"h.{i}"
        out += [(f"{h}.ln_1.weight", [DIM]), (f"{h}.ln_1.bias", [DIM]),
                (f"{h}.attn.c_attn.weight", [DIM, 3 * DIM]), (f"{h}.attn.c_attn.bias", [3 * DIM]),
                (f"{h}.attn.c_proj.weight", [DIM, DIM]), (f"{h}.attn.c_proj.bias", [DIM]),
                (f"{h}.ln_2.weight", [DIM]), (f"{h}.ln_2.bias", [DIM]),
                (f"{h}.mlp.c_fc.weight", [DIM, 4 * DIM]), (f"{h}.mlp.c_fc.bias", [4 * DIM]),
                (f"{h}.mlp.c_proj.weight", [4 * DIM, DIM]), (f"{h}.mlp.c_proj.bias", [DIM])]
    return out + [("ln_f.weight", [DIM]), ("ln_f.bias", [DIM])]


def write_safetensors(path: Path) -> int:
    """The model file with random bf16 data; returns its parameter count."""
    header, offset = {}, 0
    for name, shape in model_tensors():
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)   # safetensors pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        left = offset
        while left:
            f.write(os.urandom(min(left, 1 << 20)))
            left -= min(left, 1 << 20)
    return offset // 2


def _numpy(layer: Path, assets) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile",
                    "--disable-pip-version-check", "--no-index", "--find-links",
                    str(assets.index / "wheels"), "--target", str(layer / SITE), "numpy"],
                   check=True)


def _data_layer(layer: Path, assets, data_mib: int) -> None:
    _numpy(layer, assets)
    (layer / "opt/app/app").mkdir(parents=True)
    (layer / "opt/app/app/__init__.py").write_text("")
    (layer / "opt/app/app/main.py").write_text(DATA_APP)
    (layer / "opt/app/data").mkdir(parents=True)
    for i in range(DATA_FILES):
        with open(layer / f"opt/app/data/shard-{i:02d}.bin", "wb") as f:
            for _ in range(data_mib // DATA_FILES):
                f.write(os.urandom(1 << 20))


def _heldout_layer(layer: Path, assets, _data_mib: int) -> None:
    _numpy(layer, assets)
    (layer / "opt/app/app").mkdir(parents=True)
    (layer / "opt/app/app/__init__.py").write_text("")
    (layer / "opt/app/app/model.py").write_text(HELDOUT_APP)
    (layer / "opt/app/model").mkdir(parents=True)
    write_safetensors(layer / "opt/app/model/model.safetensors")


# name -> (the workload's python -c text, the layer's builder, what the layer holds)
WORKLOADS: dict[str, tuple[str, Callable, str]] = {
    "heldout": (HELDOUT_WORKLOAD, _heldout_layer, "numpy + a 144M bf16 safetensors model"),
    "data": (DATA_WORKLOAD, _data_layer, "numpy + app + data files"),
}


def build(assets, workload: str, data_mib: int, say) -> Path:
    """The demo image plus the workload's layer, as an OCI archive (built once)."""
    _code, populate, what = WORKLOADS[workload]
    name = f"bench-image-{data_mib}m" if workload == "data" else f"bench-image-{workload}"
    out = Path(assets.root) / f"{name}.oci.tar"
    if out.exists():
        return out
    work = Path(assets.root) / f"{name}.tmp"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    layer = work / "layer"
    say(f"build the benchmark image ({workload}): demo image + {what}")
    populate(layer, assets, data_mib)
    store = f"/tmp/bsbi-{os.getpid()}"
    b = ["buildah", "--root", f"{store}/r", "--runroot", f"{store}/rr", "--storage-driver", "vfs"]
    try:
        ctr = subprocess.run([*b, "from", f"oci-archive:{assets.image_archive}:demo/train:latest"],
                             check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run([*b, "copy", ctr, f"{layer}/", "/"], check=True, capture_output=True)
        subprocess.run([*b, "commit", "-q", ctr, "bench-train"], check=True,
                       capture_output=True)
        tmp = out.with_suffix(".tmp")
        subprocess.run([*b, "push", "-q", "bench-train", f"oci-archive:{tmp}:bench/train:latest"],
                       check=True)
        tmp.rename(out)
    finally:
        subprocess.run(["umount", "-R", "-l", f"{store}/r"], capture_output=True)
        subprocess.run(["rm", "-rf", store, str(work)], check=True)
    return out
