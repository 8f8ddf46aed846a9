"""One snapshot format for images and environments: a TOC (paths, modes, owners, links,
xattrs, and per regular file its chunk list) plus zstd-compressed chunks packed into
large blobs. Chunks are addressed by the sha256 of their uncompressed bytes, so
identical chunks are stored once and every chunk is verified when it is read."""
