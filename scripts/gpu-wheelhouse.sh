#!/usr/bin/env bash
# Make the wheelhouse that scripts/gpu-check.sh installs bootseer from, on a GPU machine
# without internet: bootseer's runtime dependencies and its build backend (hatchling), as
# binary wheels for the GPU machine's Python (default 3.12, Linux x86_64).
#
#   scripts/gpu-wheelhouse.sh [DIR]        # default DIR: ./wheelhouse
#   GPU_PYTHON_VERSION=3.11 scripts/gpu-wheelhouse.sh /tmp/wh311   # another Python
#
# Needs pip and a package index (PyPI). Carry DIR to the GPU machine with this repo.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/wheelhouse}
version=${GPU_PYTHON_VERSION:-3.12}
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then python=$repo/.venv/bin/python; else python=python3; fi
fi

# The requirements come from pyproject.toml: the runtime dependencies and the build system.
mapfile -t reqs < <("$python" - "$repo/pyproject.toml" <<'EOF'
import sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))
for req in data["project"]["dependencies"] + data["build-system"]["requires"]:
    print(req)
EOF
)
mkdir -p "$out"
echo "gpu-wheelhouse: ${reqs[*]} for Python $version -> $out"
"$python" -m pip download --quiet --dest "$out" --only-binary=:all: \
    --python-version "$version" --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 \
    "${reqs[@]}"
echo "gpu-wheelhouse: $(ls "$out" | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
