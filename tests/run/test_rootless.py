"""``bootseer run --image`` by an ordinary user: no root, no podman. The converted image's
tree is served by the FUSE tree view (mounted through the set-uid fusermount3) and entered
in a user namespace (bootseer.run.rootless). Checked as a user made for the test: the job
reads the image's files (a 0600 one too), its exit status passes through, its /dev holds the
standard nodes only, nothing stays mounted; where the node forbids it, one line says what
the site must enable."""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import BUSYBOX, make_busybox_rootfs, need
from tests.deploy.test_slurm_cluster import _make_venv
from tests.image.test_image import oci_layout

REPO = Path(__file__).resolve().parents[2]
USER = "bs-rootless-test"
ACL = "system.posix_acl_access"
pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class World:
    base: Path
    python: str
    store: str
    tree: str
    uid: int

    def run(self, *args: str, prefix: tuple[str, ...] = (), user: str = USER,
            **env: str) -> subprocess.CompletedProcess:
        """``bootseer ARGS`` as ``user``, from a clean environment as a batch job has."""
        return subprocess.run(self.argv(*args, prefix=prefix, user=user, **env),
                              capture_output=True, text=True, timeout=60, cwd="/")

    def argv(self, *args: str, prefix: tuple[str, ...] = (), user: str = USER,
             **env: str) -> list[str]:
        return [*prefix, "setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}",
                "--clear-groups",
                "env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", f"HOME={self.base}/home",
                f"PYTHONPATH={REPO}/src", f"BOOTSEER_STORE_URL={self.store}",
                *(f"{k}={v}" for k, v in env.items()), self.python, "-m", "bootseer", *args]


def _fuse_acl(uid: int) -> bytes:
    """/dev/fuse's ACL giving ``uid`` read and write (no setfacl here: the xattr's layout,
    version 2 then (tag, perm, id) entries): the node opens FUSE to this user only, as a
    site opens it to all (mode 0666) without touching other users of this machine."""
    import struct
    none = 0xFFFFFFFF
    entries = [(0x01, 6, none), (0x02, 6, uid), (0x04, 0, none), (0x10, 6, none),
               (0x20, 0, none)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _user_mounts() -> list[str]:
    """Mounts the test's user made (FUSE records its owner): other tests' are not ours."""
    uid = pwd.getpwnam(USER).pw_uid
    with open("/proc/mounts") as f:
        return [line for line in f if f"user_id={uid}," in line]


@pytest.fixture(scope="session")
def world():
    need(os.geteuid() == 0, "the test makes a user and opens /dev/fuse to it")
    need(os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None, "no FUSE")
    need(os.path.exists(BUSYBOX), "busybox-static is not installed")
    base = Path(tempfile.mkdtemp(prefix="bs-rootless-"))
    base.chmod(0o755)
    fuse = os.stat("/dev/fuse")
    try:
        old_acl: bytes | None = os.getxattr("/dev/fuse", ACL)
    except OSError:
        old_acl = None
    try:
        why = _make_venv(base / "venv")
        need(why is None, why or "")
        subprocess.run(["userdel", USER], check=False, capture_output=True)   # a killed run's
        subprocess.run(["useradd", "-M", "-d", str(base / "home"), "-s", "/bin/sh", USER],
                       check=True, capture_output=True)
        user = pwd.getpwnam(USER)
        (base / "home").mkdir(mode=0o755)
        os.chown(base / "home", user.pw_uid, user.pw_gid)
        rootfs = make_busybox_rootfs(base / "rootfs")
        (rootfs / "etc/motd").write_text("hello from the image\n")
        (rootfs / "etc/secret").write_text("root only\n")
        (rootfs / "etc/secret").chmod(0o600)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add(rootfs, arcname=".")
        layout = oci_layout(base / "layout", [buf.getvalue()])
        store = base / "store"
        r = subprocess.run([sys.executable, "-m", "bootseer", "image", "convert", str(layout),
                            "--to", str(store)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": f"{REPO}/src"})
        assert r.returncode == 0, r.stderr
        subprocess.run(["chmod", "-R", "a+rX", str(store)], check=True)
        os.setxattr("/dev/fuse", ACL, _fuse_acl(user.pw_uid))
        yield World(base, str(base / "venv/bin/python"), str(store), r.stdout.strip(),
                    user.pw_uid)
    finally:
        if old_acl is None:
            try:
                os.removexattr("/dev/fuse", ACL)
            except OSError:
                pass
        else:
            os.setxattr("/dev/fuse", ACL, old_acl)
        os.chmod("/dev/fuse", fuse.st_mode & 0o7777)
        subprocess.run(["userdel", USER], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


JOB = ("cat /etc/motd /etc/secret; id -u; ls /dev | tr '\\n' ' '; echo; "
       "echo written > /tmp/w && cat /tmp/w; exit 7")


def test_an_ordinary_user_runs_a_lazy_image(world, need_fuse):
    assert not _user_mounts()
    r = world.run("run", "--image", world.tree, "--", "sh", "-c", JOB)
    assert r.returncode == 7, r.stderr   # the job's own status
    lines = r.stdout.splitlines()
    assert lines[:3] == ["hello from the image", "root only", "0"], r.stdout   # root: the user
    devs = set(lines[3].split())
    assert devs == {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm",
                    "fd", "stdin", "stdout", "stderr"}, devs   # never the host's /dev
    assert lines[4] == "written"   # a private writable layer over the read-only image
    assert "tree view" in r.stderr   # said once: EROFS needs root
    deadline = time.time() + 5   # the FUSE server's own exit follows the unmount
    while _user_mounts() and time.time() < deadline:
        time.sleep(0.05)
    assert not _user_mounts()
    # what it left in the user's cache is the user's
    cache = world.base / "home/.cache/bootseer"
    assert cache.exists() and all(p.stat().st_uid == world.uid for p in cache.rglob("*"))
    # a missing command: 127 and one line, as with root
    r = world.run("run", "--image", world.tree, "--", "python3", "-c", "1")
    assert r.returncode == 127 and "not found in image" in r.stderr
    # a network mode that needs privilege is refused before anything is mounted
    r = world.run("run", "--image", world.tree, "--network", "ns:/proc/1/ns/net", "--",
                  "true")
    assert r.returncode != 0 and "without root, host and none are supported" in r.stderr
    assert not _user_mounts()
    # scancel's SIGTERM reaches the job; a --bind of the user's own directory is writable
    out = world.base / "home/out"
    out.mkdir()
    os.chown(out, world.uid, -1)
    proc = subprocess.Popen(world.argv("run", "--image", world.tree, "--bind", f"{out}:/out:rw",
                                       "--", "sh", "-c", 'trap "exit 42" TERM; touch /out/up; '
                                       "while true; do sleep 0.1; done"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    try:
        deadline = time.time() + 60
        while not (out / "up").exists():
            assert proc.poll() is None and time.time() < deadline, "the job never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 42
    finally:
        proc.kill()
        proc.wait()
    assert (out / "up").stat().st_uid == world.uid
    # doctor, as this user, finds its runtime
    checks = {c["name"]: c for c in json.loads(world.run("doctor", "--json").stdout)["checks"]}
    assert checks["container runtime"]["ok"], checks["container runtime"]
    assert checks["container runtime"]["detail"] == "rootless (a user namespace)"


def _in_userns_without_userns(world: World) -> tuple[str, ...]:
    """A prefix running the command in a user namespace (ids mapped 1:1) whose
    user.max_user_namespaces is 0: the node as a site that turned them off, for this
    command only."""
    script = world.base / "no-userns.sh"
    script.write_text("#!/bin/sh\necho 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"\n")
    script.chmod(0o755)
    return ("python3", "-c", _MAPPER, str(script))


# The root of a new user namespace regains its capabilities at exec once its ids are mapped;
# util-linux's --map-users goes through newuidmap, which refuses a 1:1 map of root.
_MAPPER = """
import os, subprocess, sys, time
p = subprocess.Popen(["unshare", "--user", "sh", "-c", 'read x; exec "$@"', "sh", *sys.argv[1:]],
                     stdin=subprocess.PIPE)
mine = os.readlink("/proc/self/ns/user")
while os.readlink(f"/proc/{p.pid}/ns/user") == mine:
    time.sleep(0.005)
for f in ("uid_map", "gid_map"):
    with open(f"/proc/{p.pid}/{f}", "w") as fh:
        fh.write("0 0 65536\\n")
p.stdin.write(b"go\\n")
p.stdin.close()
sys.exit(p.wait())
"""


def test_user_namespaces_off_is_one_line_naming_the_setting(world, need_fuse):
    r = world.run("run", "--image", world.tree, "--", "true",
                  prefix=_in_userns_without_userns(world))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "bootseer: error: cannot enter an image without root: unprivileged user namespaces "
        "are off (user.max_user_namespaces=0): the site must set sysctl "
        "user.max_user_namespaces to a positive number"], r.stderr
    r = world.run("doctor", "--json", prefix=_in_userns_without_userns(world))
    check = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["user namespaces"]
    assert not check["ok"] and check["required"] and "max_user_namespaces" in check["hint"]
    assert not _user_mounts()


def test_fuse_closed_to_the_user_is_one_line(world, need_fuse):
    """A user /dev/fuse is not open to (here: nobody, outside the ACL the test gave)."""
    need(not os.stat("/dev/fuse").st_mode & 0o006, "/dev/fuse is open to every user here")
    r = world.run("run", "--image", world.tree, "--", "true", user="nobody")
    assert r.returncode == 1
    assert re.fullmatch(
        r"bootseer: error: cannot enter an image without root: /dev/fuse is not open to this "
        r"user \(mode \d+\): the site must make it 0666, as Debian's udev rules do\n",
        r.stderr), r.stderr


HOOK = REPO / "deploy/enroot/hooks.d/50-bootseer.sh"
# What enroot does around its hooks (src/runtime.sh: enroot-unshare --user --mount
# --remap-root, a tmpfs at ENROOT_RUNTIME_PATH, the ENROOT_* variables, then switch root
# into ENROOT_ROOTFS); enroot itself is not packaged for Debian, so this stands in for it.
ENROOT_LIKE = """
mount -t tmpfs tmpfs "$RT"
export ENROOT_ROOTFS="$STUB" ENROOT_RUNTIME_PATH="$RT" ENROOT_PID=$$ \\
       ENROOT_ENVIRON="$RT/environment"
"$HOOK" || exit 99
exec chroot "$ENROOT_ROOTFS" /bin/sh -c "$JOB"
"""


def _servers_of(path: str) -> list[int]:
    """PIDs whose command line names ``path`` (the hook's FUSE server)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if path.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _hook(world: World, job: str, image: str, tag: str) -> subprocess.CompletedProcess:
    stub, rt = world.base / f"stub-{tag}", world.base / f"rt-{tag}"
    for d in (stub / "etc", rt):
        d.mkdir(parents=True)
    for d in (stub, stub / "etc", rt):
        os.chown(d, world.uid, -1)
    wrapper = world.base / "bin/bootseer"
    if not wrapper.exists():
        wrapper.parent.mkdir()
        wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={REPO}/src exec {world.python} -m bootseer "
                           f"\"$@\"\n")
        wrapper.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": f"{world.base}/home",
           "BOOTSEER_STORE_URL": world.store, "BOOTSEER": str(wrapper),
           "BOOTSEER_IMAGE": image, "STUB": str(stub), "RT": str(rt), "HOOK": str(HOOK),
           "JOB": job}
    return subprocess.run(
        ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "env", "-i",
         *(f"{k}={v}" for k, v in env.items()), "unshare", "--user", "--map-root-user",
         "--mount", "--propagation", "private", "sh", "-c", ENROOT_LIKE],
        capture_output=True, text=True, timeout=60, cwd="/")


def test_enroot_hook_run_by_hand_makes_the_image_the_root(world, need_fuse):
    r = _hook(world, "cat /etc/motd /etc/secret; echo w > /w && cat /w; exit 3", world.tree,
              "ok")
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines() == ["hello from the image", "root only", "w"]
    tree = str(world.base / "rt-ok/bootseer-tree")
    deadline = time.time() + 10   # the server goes once the container has ended
    while _servers_of(tree) and time.time() < deadline:
        time.sleep(0.1)
    assert not _servers_of(tree)
    assert not _user_mounts()
    # an image the store does not hold: the hook fails the start with the reason
    r = _hook(world, "true", "sha256:" + "0" * 64, "missing")
    assert r.returncode == 99 and "bootseer hook: cannot mount sha256:000" in r.stderr, r.stderr
    assert not _servers_of(str(world.base / "rt-missing/bootseer-tree"))


def test_enroot_hook_leaves_other_containers_alone():
    env = {"PATH": os.environ["PATH"]}
    r = subprocess.run([str(HOOK)], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr   # no BOOTSEER_IMAGE: not ours
    r = subprocess.run([str(HOOK)], env={**env, "BOOTSEER_IMAGE": "x"}, capture_output=True,
                       text=True)
    assert r.returncode == 1
    assert r.stderr == "bootseer hook: ENROOT_ROOTFS is not set (run by enroot?)\n"
