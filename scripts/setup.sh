#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine for bootseer: system packages, uv,
# the project's virtual environment (locked by uv.lock) and torch (CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(fuse3 libfuse3-dev docker-registry nginx-light podman catatonit runc skopeo buildah
              busybox-static zstd iproute2 util-linux procps psmisc e2fsprogs debootstrap
              apache2-utils erofs-utils containerd chromium systemd
              slurmctld slurmd slurm-client munge zsh fish)

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# kubectl (with its built-in kustomize) for the manifests' tests: Debian's package unless
# the machine has a kubectl from elsewhere (a package that would collide with Debian's).
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    # The packaged nginx and registry are not started (tests start their own, on free
    # ports); services already on the host are left alone, never stopped by name. The
    # Slurm tests start their own munged, slurmctld and slurmd (tests/deploy/slurm_cluster.py).
    scripts/apt-install-no-start.sh "${missing[@]}"
fi

if ! command -v uv >/dev/null 2>&1; then
    echo "setup: installing uv"
    python3 -m pip install -q uv
fi

if [ ! -x .venv/bin/python ]; then
    uv venv -q --python "$(command -v python3)" --seed .venv
fi
uv sync -q --frozen --inexact --group dev

# torch CPU: pip takes the wheel that lies on this machine's disk (uv does not look there).
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing torch (CPU build)"
    .venv/bin/python -m pip install -q "torch==2.13.0" \
        || echo "setup: torch unavailable; torch tests will be skipped"
fi
# Bytecode, as a package installed by pip has it: uv writes none by default and
# PYTHONDONTWRITEBYTECODE keeps imports from writing it, so every bootseer start (each
# benchmark's too) would compile its modules again.
.venv/bin/python -m compileall -q -j 0 src/bootseer .venv/lib/python3*/site-packages >/dev/null 2>&1 || true
echo "setup: ready (.venv)"
