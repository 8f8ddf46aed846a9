#!/bin/sh
# enroot pre-start hook: the container's root becomes a bootseer-converted image, mounted
# lazily (docs/slurm.md, "enroot and Pyxis").
#
# Contract (enroot runs every hooks.d/*.sh after creating the container's user and mount
# namespaces and before switching root, as the user, with these variables):
#   ENROOT_ROOTFS        the container's root directory (here a small placeholder image)
#   ENROOT_PID           the process that becomes the container
#   ENROOT_RUNTIME_PATH  a private tmpfs of this container
#   ENROOT_ENVIRON       the container's environment file (KEY=VALUE lines)
# and the job's environment. It acts only where the job set BOOTSEER_IMAGE (a converted
# image's reference or tree digest); for every other container it does nothing.
# What it does: serves the image's tree with the FUSE tree view under ENROOT_RUNTIME_PATH
# (a server that ends when ENROOT_PID does), and mounts it over ENROOT_ROOTFS with a tmpfs
# overlay (writes stay private and vanish with the container). enroot then mounts /proc,
# /dev, /sys and its other fstab entries onto it and switches into it, as into any rootfs.
# Exit status: 0 when mounted or not asked; else enroot fails the start with the message.
set -eu

[ -n "${BOOTSEER_IMAGE-}" ] || exit 0
for v in ENROOT_ROOTFS ENROOT_PID ENROOT_RUNTIME_PATH; do
    eval "[ -n \"\${$v-}\" ]" || { echo "bootseer hook: $v is not set (run by enroot?)" >&2; exit 1; }
done
BOOTSEER=${BOOTSEER:-bootseer}
# The node's cache is root's; the user's own, unless the site shares one.
export BOOTSEER_CACHE_DIR="${BOOTSEER_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/bootseer}"
tree="$ENROOT_RUNTIME_PATH/bootseer-tree"
rw="$ENROOT_RUNTIME_PATH/bootseer-rw"
mkdir -p "$tree" "$rw"

# The server outlives this hook: it lives in the background until the container ends.
"$BOOTSEER" image mount "$BOOTSEER_IMAGE" "$tree" >"$ENROOT_RUNTIME_PATH/bootseer.log" 2>&1 &
server=$!
i=0
until mountpoint -q "$tree"; do
    if ! kill -0 "$server" 2>/dev/null || [ $i -ge 600 ]; then
        kill "$server" 2>/dev/null || true
        echo "bootseer hook: cannot mount $BOOTSEER_IMAGE: $(tail -n 1 "$ENROOT_RUNTIME_PATH/bootseer.log")" >&2
        exit 1
    fi
    i=$((i + 1))
    sleep 0.1
done
# When the container ends: the overlay first (it holds the tree; this namespace lives on
# while the server is in it), then SIGTERM, on which the server unmounts the tree and exits.
(
    while kill -0 "$ENROOT_PID" 2>/dev/null; do sleep 0.2; done
    umount -l "$ENROOT_ROOTFS" 2>/dev/null
    umount -l "$rw" 2>/dev/null
    kill -TERM "$server" 2>/dev/null
) >/dev/null 2>&1 </dev/null &

mount -t tmpfs -o mode=755 bootseer-rw "$rw"
mkdir -p "$rw/upper" "$rw/work"
mount -t overlay -o "lowerdir=$tree,upperdir=$rw/upper,workdir=$rw/work,userxattr" \
    bootseer "$ENROOT_ROOTFS"
if [ -n "${ENROOT_ENVIRON-}" ]; then
    echo "BOOTSEER_IMAGE=$BOOTSEER_IMAGE" >> "$ENROOT_ENVIRON"
fi
