"""Enter a container root without root: a user namespace, as rootless container engines do.

A user without CAP_SYS_ADMIN (a Slurm job's user) gets the image's tree from the FUSE tree
view, mounted through the set-uid ``fusermount3`` in the user's own state directory, and
enters it with ``unshare --user --map-root-user --mount --pid``: inside, the user is root of
a namespace that owns nothing on the host, so it may mount (tmpfs, overlay, proc, binds)
and chroot, and every file it writes on the host is still the user's.

What differs from the root chroot runtime (:mod:`bootseer.run.container`), and why:

* ``/dev``: ``mknod`` is refused in a user namespace, so the standard nodes (null, zero,
  full, random, urandom, tty) and the planned GPU/InfiniBand nodes are each bind-mounted
  from the host, one file at a time, on a private tmpfs. The host's ``/dev`` itself is
  never bound: no disk and no other device is reachable.
* ``/sys``: a fresh sysfs needs a network namespace owned by the user namespace; on the
  node's network the host's ``/sys`` is bound recursively and made read-only, as rootless
  podman does (with ``--network none`` a new network namespace gets its own sysfs).
* ``--network ns:PATH`` is refused: joining another network namespace needs privilege.
* The mount is the user's alone (no ``allow_other``), and shows every file as the user's:
  root in the namespace is the user, so it owns the image as root owns it in a container.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from collections.abc import Sequence

NETWORK_MODES = ("host", "none")
USERNS_CLONE = "/proc/sys/kernel/unprivileged_userns_clone"
MAX_USERNS = "/proc/sys/user/max_user_namespaces"
APPARMOR_USERNS = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")


def tool(name: str) -> str | None:
    """A program's path; the sbin directories count too (a user's PATH often lacks them,
    and chroot lives there)."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def read_sysctl(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def userns_unavailable() -> str | None:
    """None when users without root may make user namespaces, else what is off and what
    the site must set."""
    if read_sysctl(USERNS_CLONE) == "0":
        return ("unprivileged user namespaces are off (kernel.unprivileged_userns_clone=0): "
                "the site must set sysctl kernel.unprivileged_userns_clone=1")
    if read_sysctl(MAX_USERNS) == "0":
        return ("unprivileged user namespaces are off (user.max_user_namespaces=0): the site "
                "must set sysctl user.max_user_namespaces to a positive number")
    if read_sysctl(APPARMOR_USERNS) == "1":
        return ("AppArmor restricts unprivileged user namespaces "
                "(kernel.apparmor_restrict_unprivileged_userns=1): the site must set it to 0 "
                "or give bootseer an AppArmor profile allowing userns")
    return None


def unavailable() -> str | None:
    """None when a user without root can enter a lazy image here, else one line: what the
    node lacks and what the site must enable."""
    why = userns_unavailable()
    if why is not None:
        return why
    helper = shutil.which("fusermount3")
    if helper is None:
        return "fusermount3 is missing: the site must install fuse3"
    if not os.stat(helper).st_mode & stat.S_ISUID:
        return f"{helper} is not set-uid root: the site must run 'chmod u+s {helper}'"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: the site must load the fuse module"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return ("/dev/fuse is not open to this user (mode "
                f"{stat.S_IMODE(os.stat('/dev/fuse').st_mode):o}): the site must make it "
                "0666, as Debian's udev rules do")
    if not (tool("unshare") and tool("chroot")):
        return "unshare or chroot is missing: the site must install util-linux and coreutils"
    return None


def _bind_file(source: str, target: str) -> list[str]:
    t = shlex.quote(target)
    return [f"mkdir -p $(dirname {t}); [ -e {t} ] || touch {t}",
            f"mount --bind {shlex.quote(source)} {t}"]


def dev_lines(dev: str, nodes: Sequence[tuple[str, str]], shm_size: int | None) -> list[str]:
    """A private /dev on a tmpfs: each standard node and each of ``nodes`` (host path,
    path under /dev) bound from the host one by one, a new devpts, a /dev/shm."""
    q = shlex.quote(dev)
    shm = f",size={shm_size}" if shm_size else ""
    lines = [f"mkdir -p {q}", f"mount -t tmpfs -o nosuid,noexec,mode=755,size=1m bootseer-dev {q}"]
    for name in DEV_NODES:
        lines += _bind_file(f"/dev/{name}", f"{dev}/{name}")
    for host, target in nodes:
        lines += _bind_file(host, dev + target.removeprefix("/dev"))
    return lines + dev_rest(q, shm)


def dev_rest(q: str, shm: str) -> list[str]:
    """What every container's /dev has beside its device nodes (``q``: the quoted /dev
    path, ``shm``: the shm mount's size option): its own pts, a shm, the fd links."""
    return [f"mkdir -m 755 {q}/pts",
            f"mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts {q}/pts",
            f"ln -s pts/ptmx {q}/ptmx",
            f"mkdir -m 1777 {q}/shm",
            f"mount -t tmpfs -o nosuid,nodev,mode=1777{shm} shm {q}/shm",
            f"ln -s /proc/self/fd {q}/fd", f"ln -s /proc/self/fd/0 {q}/stdin",
            f"ln -s /proc/self/fd/1 {q}/stdout", f"ln -s /proc/self/fd/2 {q}/stderr"]


def command(rootfs: str, state_dir: str, inner: Sequence[str], *,
            binds: Sequence[tuple[str, str, bool]], nodes: Sequence[tuple[str, str]],
            network: str, shm_size: int | None, limits: Sequence[str]) -> list[str]:
    """The argv that enters ``rootfs`` (read-only; writes go to a tmpfs overlay) in new
    user, mount and pid namespaces and runs ``inner`` there. ``binds``: (host path, path
    in the container, read-only); ``nodes``: device nodes (host path, /dev path);
    ``limits``: shell lines (ulimit) run before entering."""
    merged, work = f"{state_dir}/m", f"{state_dir}/w"
    m, w = shlex.quote(merged), shlex.quote(work)
    lines = ["set -e", f"mount -t tmpfs tmpfs {w}", f"mkdir -p {w}/upper {w}/work",
             f"mount -t overlay overlay -o lowerdir={shlex.quote(rootfs)},upperdir={w}/upper,"
             f"workdir={w}/work,userxattr {m}",
             f"mkdir -p {m}/proc {m}/sys",
             f"mount -t proc -o nosuid,nodev,noexec proc {m}/proc"]
    if network == "none":   # the namespace's own network: its own sysfs
        lines.append(f"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {m}/sys")
    else:
        lines += [f"mount --rbind /sys {m}/sys",
                  f"mount -o remount,bind,ro,nosuid,nodev,noexec {m}/sys || true"]
    lines += dev_lines(f"{merged}/dev", nodes, shm_size)
    for source, target, readonly in binds:
        t = shlex.quote(merged + target)
        kind = "mkdir -p" if os.path.isdir(source) else "touch"
        lines += [f"[ -e {t} ] || {{ mkdir -p $(dirname {t}); {kind} {t}; }}",
                  f"mount --rbind {shlex.quote(source)} {t}"]
        if readonly:   # flags the host locked on the source (noexec) must be kept
            lines.append(f"mount -o remount,bind,ro,nosuid,nodev {t} || "
                         f"mount -o remount,bind,ro,nosuid,nodev,noexec {t}")
    lines += list(limits)
    lines.append(f"exec {tool('chroot') or 'chroot'} {m} {shlex.join(inner)}")
    namespaces = ["--user", "--map-root-user", "--mount", "--pid"]
    namespaces += ["--net"] if network == "none" else []
    return [tool("unshare") or "unshare", *namespaces, "--fork", "--kill-child",
            "--propagation", "private", "sh", "-c", "\n".join(lines)]
