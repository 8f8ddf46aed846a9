"""A second FUSE backend with no libfuse: bootseer speaks ``/dev/fuse`` itself.

Why: the kernel's passthrough (FUSE_DEV_IOC_BACKING_OPEN, Linux 6.9+) lets a staged,
verified local file be read and mmapped by the kernel at native speed with zero Python,
and Debian 12's libfuse 3.14 cannot ask for it. Files still streaming keep the Python read
path (1 MiB reads), which is also about twice as fast as mfusepy's here.

- :mod:`.protocol`: the wire structs (include/uapi/linux/fuse.h);
- :mod:`.channel`: ``mount(2)`` of /dev/fuse, requests in, answers out, backing files;
- :mod:`.server`: the request loop serving any TreeView (``backing_path`` optional);
- :mod:`.process`: a server in its own process, dying with its owner (the mount seam);
- :mod:`.probe`: whether this kernel and process can use passthrough at all.
"""
