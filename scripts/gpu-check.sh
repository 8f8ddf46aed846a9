#!/usr/bin/env bash
# bootseer on a real GPU: install bootseer from a wheelhouse (no internet), build a
# CUDA-capable image from this machine's own files (its Python, its NVIDIA driver
# libraries, its torch venv), convert it into a local store, and `bootseer run --image
# --gpus all` it with the chroot runtime (no podman/runc needed): inside the container
# torch.cuda.is_available() and an all-reduce across 2 processes (NCCL when there is a GPU
# per process; on one GPU, gloo on CUDA tensors across the 2 ranks plus an NCCL all-reduce
# on rank 0's GPU, since NCCL refuses two ranks on one device). Then the trace's report.
#
#   sudo scripts/gpu-check.sh WHEELHOUSE        # WHEELHOUSE: made by scripts/gpu-wheelhouse.sh
#
# Settings (environment):
#   TORCH_VENV=/opt/torch/.venv   the venv with a CUDA torch (its Python is the image's)
#   UV=/usr/local/bin/uv          uv, to make bootseer's own venv from the wheelhouse
#   GPU_CHECK_WORK=/tmp/bootseer-gpu-check   scratch (store, cache, image, trace, log)
#   GPU_CHECK_TORCH=image         image: the torch venv is in the image (lazy-loaded);
#                                 bind: bound read-only instead (a smaller, faster convert)
#   GPU_CHECK_GPUS=all            bootseer run --gpus (none: CPU-only rehearsal)
#   GPU_CHECK_DEV=/dev            where the NVIDIA device nodes are looked for (preflight)
# Everything it prints also goes to $GPU_CHECK_WORK/gpu-check.log.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
wheels=${1:-}
torch_venv=${TORCH_VENV:-/opt/torch/.venv}
uv=${UV:-/usr/local/bin/uv}
work=${GPU_CHECK_WORK:-/tmp/bootseer-gpu-check}
torch_mode=${GPU_CHECK_TORCH:-image}
gpus=${GPU_CHECK_GPUS:-all}
dev=${GPU_CHECK_DEV:-/dev}

say() { printf 'gpu-check: %s\n' "$*"; }
fail() { printf 'gpu-check: error: %s\n' "$*" >&2; exit 1; }
step() { printf '\ngpu-check: == %s (%s)\n' "$*" "$(date +%T)"; }

# -- preflight: say everything that is missing before doing anything ----------------------
[ -n "$wheels" ] || fail "usage: $0 WHEELHOUSE (make it with scripts/gpu-wheelhouse.sh)"
[ "$(id -u)" = 0 ] || fail "run as root (mounts, chroot, device nodes)"
problems=()
[ -d "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1 || problems+=("no wheels in $wheels")
[ -x "$uv" ] || problems+=("no uv at $uv (set UV=)")
[ -x "$torch_venv/bin/python" ] || problems+=("no Python at $torch_venv/bin/python (set TORCH_VENV=)")
case $torch_mode in image|bind) ;; *) problems+=("GPU_CHECK_TORCH=$torch_mode: image or bind") ;; esac
if [ "$gpus" != none ]; then
    ls "$dev"/nvidia[0-9]* >/dev/null 2>&1 || problems+=("no $dev/nvidia<N> device nodes (is the NVIDIA driver loaded?)")
    [ -e "$dev/nvidiactl" ] || problems+=("no $dev/nvidiactl")
fi
for tool in unshare chroot mount tar; do
    command -v "$tool" >/dev/null || problems+=("no $tool (util-linux, coreutils, tar)")
done
if [ ! -e /dev/fuse ]; then
    problems+=("no /dev/fuse: the lazy image is a FUSE (or EROFS) mount; modprobe fuse")
elif ! ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so\.3' && ! command -v fusermount3 >/dev/null; then
    say "note: no libfuse3 found; bootseer will need the kernel's EROFS path (Linux >= 6.12)"
fi
if [ ${#problems[@]} -gt 0 ]; then
    printf 'gpu-check: error: %s\n' "${problems[@]}" >&2
    exit 1
fi

mkdir -p "$work"
exec > >(tee "$work/gpu-check.log") 2>&1
say "repo $repo, wheels $wheels, torch venv $torch_venv, work $work, torch in image: $torch_mode"
uname -a
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
ls -l "$dev"/nvidia* 2>/dev/null || true

py_base=$("$torch_venv/bin/python" -c 'import sys; print(sys.base_prefix)')
py_version=$("$torch_venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$torch_venv/bin/python" -c 'import torch; print("gpu-check: host torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' || true

# -- 1. bootseer from the wheelhouse -------------------------------------------------------
step "install bootseer into $work/venv (offline, from $wheels)"
rm -rf "$work/venv"
"$uv" venv -q --python "$torch_venv/bin/python" "$work/venv"
"$uv" pip install -q --offline --no-index --find-links "$wheels" --python "$work/venv/bin/python" "$repo"
bs() { "$work/venv/bin/python" -m bootseer "$@"; }
export BOOTSEER_CACHE_DIR=$work/cache BOOTSEER_STORE_URL=$work/store
bs run --help >/dev/null && say "bootseer installed: $("$work/venv/bin/python" -c 'import bootseer; print(bootseer.__version__)')"

# -- 2. a CUDA-capable image from this machine's own files ---------------------------------
step "build the image layer (this machine's Python $py_version, driver libraries, torch venv)"
rm -rf "$work/image" && mkdir -p "$work/image/skel" "$work/image/layout/blobs/sha256"
for d in tmp proc sys dev run root etc check; do mkdir -p "$work/image/skel/$d"; done
chmod 1777 "$work/image/skel/tmp"
paths=()
for p in bin sbin lib lib64 usr/bin usr/lib/x86_64-linux-gnu usr/lib64 usr/lib/locale \
         "usr/lib/python$py_version" usr/lib/python3 \
         etc/passwd etc/group etc/hosts etc/nsswitch.conf etc/ld.so.conf etc/ld.so.conf.d \
         etc/ld.so.cache etc/os-release etc/alternatives; do
    [ -e "/$p" ] || [ -L "/$p" ] && paths+=("$p")
done
case $py_base in /usr|/usr/local) ;; *) paths+=("${py_base#/}") ;; esac   # a uv/pyenv Python
# The NVIDIA driver's user-space libraries (libcuda, libnvidia-*), wherever the loader
# finds them: the chroot runtime passes device nodes only (no toolkit hook injects them).
# Canonical directories only: a member under a symlinked directory (/lib -> usr/lib) is
# refused by the tree's checks.
# Each path once (tar stores a repeat as a hard link to itself, which convert refuses).
[ -d /usr/local/nvidia ] && paths+=(usr/local/nvidia)
while read -r p; do
    case "$p" in usr/local/nvidia/*) [ -d /usr/local/nvidia ] && continue ;; esac
    [ -e "/$p" ] && paths+=("$p")
done < <(ldconfig -p | awk '/libcuda\.so|libnvidia-|libcudadebugger/ {print $NF}' | sort -u |
         while read -r lib; do
             d=$(readlink -f "$(dirname "$lib")")
             echo "${d#/}/$(basename "$lib")"
             r=$(readlink -f "$lib"); echo "${r#/}"
         done | sort -u)
if [ "$torch_mode" = image ]; then
    paths+=("${torch_venv#/}")
    binds=()
else
    binds=(--bind "$torch_venv:$torch_venv")
fi
say "image paths: ${paths[*]}"
du -shc "${paths[@]/#//}" 2>/dev/null | tail -1
tar --numeric-owner --one-file-system -cf "$work/image/layer.tar" \
    -C "$work/image/skel" . -C / "${paths[@]}"
say "layer: $(du -h "$work/image/layer.tar" | cut -f1)"
"$work/venv/bin/python" - "$work/image" "$torch_venv" <<'EOF'
# A one-layer OCI image layout around the tar (uncompressed layer: no gzip pass).
import hashlib, json, os, sys
image, venv = sys.argv[1], sys.argv[2]
layout, layer = os.path.join(image, "layout"), os.path.join(image, "layer.tar")
blobs = os.path.join(layout, "blobs", "sha256")
h = hashlib.sha256()
with open(layer, "rb") as f:
    while chunk := f.read(16 << 20):
        h.update(chunk)
layer_hex = h.hexdigest()
os.link(layer, os.path.join(blobs, layer_hex))
def blob(data):
    hexd = hashlib.sha256(data).hexdigest()
    open(os.path.join(blobs, hexd), "wb").write(data)
    return {"digest": f"sha256:{hexd}", "size": len(data)}
config = blob(json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Env": [f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
               "WorkingDir": "/"},
    "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_hex}"]}}).encode())
manifest = blob(json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": f"sha256:{layer_hex}", "size": os.path.getsize(layer)}]}).encode())
json.dump({"schemaVersion": 2, "manifests": [
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest}]},
    open(os.path.join(layout, "index.json"), "w"))
json.dump({"imageLayoutVersion": "1.0.0"}, open(os.path.join(layout, "oci-layout"), "w"))
EOF

step "convert the image into the local store $BOOTSEER_STORE_URL"
start=$(date +%s)
tree=$(bs image convert "$work/image/layout" | tail -1)
say "tree $tree in $(( $(date +%s) - start )) s"
rm -f "$work/image/layer.tar"   # the layout keeps its hard link until the end

# -- 3. the job, in the image, with the GPUs -------------------------------------------------
mkdir -p "$work/check"
cat > "$work/check/allreduce.py" <<'EOF'
"""2 ranks: NCCL when each rank has its own GPU; on one GPU, gloo across the ranks on CUDA
tensors and NCCL on rank 0 alone (NCCL refuses two ranks on one device). A first optimizer
step at the end, so the trace has every phase."""
import os
import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
device = torch.device("cuda", rank % ngpu) if ngpu else torch.device("cpu")
if ngpu:
    torch.cuda.set_device(device)
backend = "nccl" if ngpu >= world else "gloo"
dist.init_process_group(backend)
x = torch.full((1 << 20,), float(rank + 1), device=device)
dist.all_reduce(x)
expect = world * (world + 1) / 2
assert float(x[0]) == expect, (float(x[0]), expect)
print(f"rank {rank}: {backend} all_reduce on {device} ok (sum {float(x[0]):g})", flush=True)
if ngpu and backend == "gloo":
    solo = dist.new_group([0], backend="nccl")   # every rank must call new_group
    if rank == 0:
        y = torch.ones(1 << 20, device=device)
        dist.all_reduce(y, group=solo)
        torch.cuda.synchronize()
        print(f"rank 0: nccl {torch.cuda.nccl.version()} all_reduce on {device} ok", flush=True)
    dist.barrier()
model = torch.nn.Linear(64, 64).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(8, 64, device=device)).sum().backward()
opt.step()   # the capture marks ready here
dist.destroy_process_group()
EOF
cat > "$work/check/job.sh" <<EOF
set -e
python -c 'import torch; print("in container: torch", torch.__version__, "cuda", torch.version.cuda, "is_available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
ls -l /dev | grep -E 'nvidia|infiniband' || true
python -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 /check/allreduce.py
EOF

step "bootseer run --image $tree --gpus $gpus --runtime chroot"
rm -rf "$work/trace"
set +e
bs -v run --image "$tree" --runtime chroot --gpus "$gpus" --trace "$work/trace" \
    --job-id gpu-check --node "$(hostname)" --summary "$work/summary.json" \
    --bind "$work/check:/check" "${binds[@]}" -e OMP_NUM_THREADS=4 \
    -- /bin/sh /check/job.sh
rc=$?
set -e
say "bootseer run exit status $rc"

step "report"
bs report "$work/trace/gpu-check" || true
rm -rf "$work/image"
if [ $rc -ne 0 ]; then
    fail "the job failed (exit $rc); the log is $work/gpu-check.log"
fi
say "done: paste $work/gpu-check.log (the commands and their output) into the closing note"
