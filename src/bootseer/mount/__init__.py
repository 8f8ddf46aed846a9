"""The one read-only FUSE adapter. Techniques provide a :class:`~bootseer.mount.view.TreeView`
(an image tree, an environment snapshot, a remote checkpoint directory); this package
turns it into a mount (ro, nosuid, nodev, 1 MiB kernel reads)."""
