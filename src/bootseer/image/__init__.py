"""Lazy container images: convert an OCI image into a tree, mount it lazily, record which
chunks a start reads, and prefetch them (in recorded order) on the next start."""
