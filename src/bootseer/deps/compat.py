"""The CUDA gate: an environment whose torch was built for CUDA runtime X needs a driver
that supports X. Checked before a snapshot is restored or built, so a too-old driver is a
clear message at startup, never ``torch.cuda`` failing an hour into the job.

CUDA's minor-version compatibility means any driver at or above the first release of a
major version runs every minor runtime of that major; those minimums are from NVIDIA's
CUDA compatibility table (Linux, x86_64).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from bootseer.deps.resolve import DepsError

MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}
NVIDIA_VERSION_FILE = "/proc/driver/nvidia/version"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def cuda_runtime(locked: str) -> str | None:
    """The CUDA runtime an environment's pins need: ``torch==2.4.0+cu121`` -> "12.1",
    ``nvidia-cuda-runtime-cu12==12.4.127`` -> "12.4"; None for CPU-only stacks."""
    for line in locked.splitlines():
        m = re.match(r"\s*torch==[^+\s]+\+cu(\d+)(\d)\b", line)
        if m:
            return f"{m[1]}.{m[2]}"
    for line in locked.splitlines():
        m = re.match(r"\s*nvidia-cuda-runtime-cu\d+==(\d+)\.(\d+)", line)
        if m:
            return f"{m[1]}.{m[2]}"
    return None


def installed_cuda_runtime(prefix: str) -> str | None:
    """The same, read from an installed environment (torch's own ``version.py``)."""
    import glob
    for path in glob.glob(os.path.join(prefix, "lib", "python*", "site-packages", "torch",
                                       "version.py")):
        m = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*'(\d+\.\d+)", open(path).read(), re.M)
        if m:
            return m[1]
    return None


def driver_version(version_file: str = NVIDIA_VERSION_FILE) -> str | None:
    """The NVIDIA kernel driver's version on this node, or None without one."""
    try:
        m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)",
                      open(version_file).read())
        if m:
            return m[1]
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=20).stdout.split()
            return out[0] if out else None
        except (OSError, subprocess.SubprocessError):
            return None
    return None


def check(runtime: str | None, driver: str | None, what: str = "this environment") -> None:
    """Raise DepsError when ``driver`` cannot run CUDA ``runtime``. No driver at all is
    allowed: torch's CUDA wheels import and run on CPU there."""
    if runtime is None or driver is None:
        return
    major = int(runtime.split(".")[0])
    need = MIN_DRIVER.get(major)
    if need is None:
        raise DepsError(f"{what} needs CUDA {runtime}, which this bootseer does not know the "
                        f"driver requirement of; refusing rather than risk a broken import")
    if _version(driver) < need:
        raise DepsError(f"{what} needs CUDA {runtime} (NVIDIA driver >= "
                        f"{'.'.join(map(str, need))}), but this node's driver is {driver}: "
                        f"pin a torch build for an older CUDA or update the driver")
