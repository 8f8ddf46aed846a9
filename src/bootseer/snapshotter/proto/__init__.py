"""Python stubs generated from containerd's snapshots.v1 and types/mount .proto files by
``scripts/gen-protos.sh`` (never edited by hand)."""
