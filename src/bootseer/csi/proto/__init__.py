"""Python stubs generated from ``csi.proto`` (the CSI spec's Identity and Node services)
by ``scripts/gen-protos.sh`` (never edited by hand)."""
