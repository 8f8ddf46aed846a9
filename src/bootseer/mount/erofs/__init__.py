"""The kernel's EROFS as a mount backend: an uncompressed, chunk-indexed metadata image
written here (``writer``), whose file data lives on a second device, the data blob; the
kernel mounts the image file itself with ``device=<blob>`` (``kernel``). Whoever serves
the blob (a local file, a single-file FUSE server) is the caller's business."""

BLOB_NAME = "blob"
"""The one file a blob server's mount shows (the blob EROFS reads as its device)."""
