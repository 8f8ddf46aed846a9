"""The whole exception tree of bootseer: the roots are here, each leaf lives beside the code
that raises it (named by its module under ``bootseer.``). tests/unit/test_errors_tree.py
checks that every exception class of the package descends from BootseerError and is
listed below.

    BootseerError
    ├── UsageError(ValueError)              arguments that cannot work together
    │   └── csi.attributes.VolumeAttributeError  a pod's volume attributes or path refused
    ├── ConfigError(ValueError)             a setting is invalid; names the field
    │   └── ckpt.budget.BudgetError         the checkpoint's memory budget cannot hold a stripe
    ├── StoreError(OSError)                 anything the store layer raises
    │   ├── BlobNotFound(FileNotFoundError) unknown digest (or ref)
    │   ├── DigestMismatch                  bytes do not hash to their digest
    │   ├── InvalidDigest(ValueError)       not "sha256:<64 hex>"
    │   ├── RangeError                      range outside the blob (HTTP 416)
    │   ├── WrongRange                      a 206 for another range than the one asked
    │   ├── FetchError                      the source failed after retries/deadline
    │   ├── ReadOnlyStore                   write to a read-only backend (http)
    │   ├── CacheError                      node cache unusable (budget, disk full)
    │   ├── ckpt.plan.PlanError             a checkpoint's read plan cannot be made
    │   ├── ckpt.replicas.ReplicaMismatch   a mirror's file differs from the origin's
    │   ├── ckpt.source.ReadCancelled       a read given up by its caller (a hedge lost)
    │   └── ckpt.source.FileChanged         a checkpoint file changed while being read
    ├── MountError(OSError)                 a tree or file cannot be served (mount(2), FUSE)
    │   ├── mount.erofs.kernel.ErofsMountError   the kernel refused the EROFS mount
    │   ├── mount.erofs.writer.ImageError(ValueError)   a tree EROFS cannot represent
    │   ├── mount.overlay.OverlayError      the writable overlay cannot be mounted
    │   ├── mount.devfuse.server.ServerError     bootseer's /dev/fuse server failed
    │   └── deps.mounts.KernelMountError    an environment's kernel mount failed
    ├── TraceError(OSError)                 a trace location cannot be read/written
    ├── report.load.NotFinite(ValueError)   a trace line holds NaN or Infinity (rejected)
    ├── node.outputs.OutputError(OSError)   a file the user named cannot be written
    ├── node.tools.MissingTool              a program bootseer runs is not installed
    ├── tree.build.TreeBuildError           a directory cannot become a tree
    ├── tree.toc.TreeFormatError(ValueError)      a TOC that is not one
    ├── tree.profile.ProfileError(ValueError)     a hot-block profile that is not one
    ├── image.convert.ConvertError          an image cannot be converted
    ├── deps.resolve.DepsError              an environment cannot be resolved or made
    ├── ckpt.listing.PathOutsideRoot(PermissionError)   a path leaving the checkpoint
    ├── ckpt.named_files.NotCheckpointMetadata(ValueError)  metadata that is not what
    │                                       its name says (DCP, safetensors index)
    ├── store.logins.CredentialHelperError  a registry credential helper failed
    ├── run.pipeline.FallbackPossible       the fast path failed; the conventional may work
    ├── run.baseline.BaselineError          the conventional path failed
    ├── run.container.ContainerError        the command's container cannot run
    ├── run.devices.DeviceError             GPUs asked for cannot be passed in
    ├── run.node.RunError                   a node's start failed
    ├── snapshotter.metadata.SnapshotError  a containerd snapshot request cannot be met
    ├── snapshotter.install.InstallError(ValueError)  containerd's config cannot be patched
    ├── csi.volumes.EnvironmentBuilding     a volume's environment is being built (retry)
    ├── csi.volumes.EnvironmentNotFound(FileNotFoundError)  no snapshot, nobody builds it
    ├── csi.volumes.VolumeConflict          a target path holds another volume or mount
    ├── slurm.policy.SlurmSettingsError     the site's Slurm settings file is wrong
    ├── demo.assets.AssetError              the demo's images, environment or checkpoint
    ├── testing.netns.NetnsError(RuntimeError)    a test network namespace failed
    └── testing.servers.ServerError(RuntimeError) a test server did not start

Leaves also inherit the builtins callers already catch (OSError, FileNotFoundError,
ValueError). Errors carry fields (digest, url, offset) and say what to check.
"""

from __future__ import annotations

from bootseer import redact  # errors are shown and logged: no URL credentials


class BootseerError(Exception):
    """Root of every error bootseer raises on purpose."""

    # the next step, which the CLI shows under the error's line (None: no step to suggest)
    hint: str | None = None


class UsageError(BootseerError, ValueError):
    """Arguments that cannot work together (a mirror of a non-http checkpoint, a rank
    outside its world): said as an error line by the CLI, a ValueError to API callers."""


class ConfigError(BootseerError, ValueError):
    def __init__(self, field: str, message: str):
        self.field, self.reason = field, message
        super().__init__(f"invalid setting {field}: {message}")


class StoreError(BootseerError, OSError):
    def __init__(self, message: str, *, digest: str | None = None, url: str | None = None,
                 offset: int | None = None):
        self.digest = digest
        self.url = redact.url(url) if url else url
        self.offset = offset
        super().__init__(redact.text(message))

    def __str__(self) -> str:  # OSError's default __str__ hides the message when args differ
        return self.args[0] if self.args else ""


class BlobNotFound(StoreError, FileNotFoundError):
    pass


class DigestMismatch(StoreError):
    pass


class InvalidDigest(StoreError, ValueError):
    pass


class RangeError(StoreError):
    pass


class WrongRange(StoreError):
    """A server answered a range request with another range: its body is refused (not
    retried: the same server or proxy would answer the same)."""


class FetchError(StoreError):
    pass


class ReadOnlyStore(StoreError):
    pass


class CacheError(StoreError):
    pass


class TraceError(BootseerError, OSError):
    pass


class MountError(BootseerError, OSError):
    """A tree or file cannot be served: mount(2), a FUSE server, the kernel's EROFS."""
