#!/usr/bin/env bash
# Regenerates src/bootseer/snapshotter/proto from containerd's own .proto files, which
# Debian's golang-github-containerd-containerd-dev ships. The gogoproto options only steer
# Go code generation: they are stripped. The package names (containerd.services.snapshots.v1,
# containerd.types) are kept: they are the gRPC method paths containerd calls.
set -euo pipefail
cd "$(dirname "$0")/.."
API=/usr/share/gocode/src/github.com/containerd/containerd/api
[ -d "$API" ] || { echo "error: $API missing; hint: apt-get install golang-github-containerd-containerd-dev" >&2; exit 1; }
PKG=bootseer/snapshotter/proto
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/$PKG"
strip_gogo() {
    sed -E -e '/import weak "gogoproto\/gogo.proto";/d' \
           -e '/option \(gogoproto\.[a-z_]+\) = [^;]+;/d' \
           -e 's/ \[\(gogoproto[^]]*\]//' \
           -e 's#import "github.com/containerd/containerd/api/types/mount.proto";#import "'"$PKG"'/mount.proto";#' "$1"
}
strip_gogo "$API/types/mount.proto" > "$tmp/$PKG/mount.proto"
strip_gogo "$API/services/snapshots/v1/snapshots.proto" > "$tmp/$PKG/snapshots.proto"
.venv/bin/python -m grpc_tools.protoc -I"$tmp" -I"$(.venv/bin/python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')" \
    --python_out=src --grpc_python_out=src "$tmp/$PKG/mount.proto" "$tmp/$PKG/snapshots.proto"
rm -f src/$PKG/mount_pb2_grpc.py   # mount.proto has no service
echo "generated src/$PKG (containerd $(dpkg-query -W -f='${Version}' golang-github-containerd-containerd-dev))"

# The CSI node plugin's Identity and Node services: src/bootseer/csi/proto/csi.proto, a
# subset of the CSI spec's csi.proto written here (no package ships it), compiled as is.
.venv/bin/python -m grpc_tools.protoc -Isrc -I"$(.venv/bin/python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')" \
    --python_out=src --grpc_python_out=src src/bootseer/csi/proto/csi.proto
echo "generated src/bootseer/csi/proto"

# The CRI client the snapshotter's tests and bench/image drive containerd with (as the
# kubelet does): k8s.io/cri-api's runtime.v1 api.proto, given as CRI_API_PROTO=path (no
# Debian package ships it). Test-only: generated into tests/support, outside the wheel.
if [ -n "${CRI_API_PROTO:-}" ]; then
    CRI=tests/support/cri
    mkdir -p "$tmp/$CRI"
    cp "$CRI_API_PROTO" "$tmp/$CRI/api.proto"
    .venv/bin/python -m grpc_tools.protoc -I"$tmp" --python_out=. --grpc_python_out=. "$tmp/$CRI/api.proto"
    echo "generated $CRI from $CRI_API_PROTO"
fi
