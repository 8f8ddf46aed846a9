"""The one serving seam. Techniques (image, deps, ckpt through tree) describe what to
serve; this package chooses how, mounts it and unmounts it:

- :mod:`.choose`: the one chooser (EROFS on a local blob, EROFS on a FUSE-served blob, the
  FUSE tree view, devfuse passthrough, mfusepy), its fallback said once;
- :mod:`.serve`: a tree or a file set served as chosen;
- :mod:`.handle`: the one handle of a served mount, with the one unmount;
- :mod:`.fuse`, :mod:`.devfuse`: the FUSE servers (mfusepy; bootseer's own /dev/fuse
  server with passthrough), each in a process of its own;
- :mod:`.erofs`: the kernel's EROFS: metadata images written and cached, the blob LRU,
  mount(2);
- :mod:`.overlay`: a writable overlay over a read-only mount.

Every FUSE mount is read-only (ro, nosuid, nodev, 1 MiB kernel reads) and serves a
:class:`~bootseer.mount.view.TreeView`."""
