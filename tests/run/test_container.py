"""The container launcher against real podman/runc and unshare+chroot."""

from __future__ import annotations

import os
import signal
import stat
import time

import pytest

from bootseer.run import container as C
from bootseer.run import devices as D
from tests.conftest import is_root, need

pytestmark = pytest.mark.timeout(120)

RUNTIMES = ["podman", "chroot"]


@pytest.fixture(params=RUNTIMES)
def runtime(request):
    need(is_root(), "containers need root")
    need(request.param in C.available_runtimes(), f"{request.param} is not installed")
    return request.param


def test_exit_status_env_and_binds(runtime, busybox_rootfs, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello").write_text("from the host\n")
    out = tmp_path / "out"
    out.mkdir()
    c = C.Container(rootfs=str(busybox_rootfs),
                    argv=["sh", "-c", 'cat /data/hello > /out/copy; echo "$FOO" >> /out/copy; '
                                      'pwd >> /out/copy; touch /data/x 2>/dev/null && exit 9; '
                                      'exit 7'],
                    env={"FOO": "bar"}, workdir="/tmp",
                    binds=[C.Bind(str(data), "/data"), C.Bind(str(out), "/out", readonly=False)])
    assert C.run(c, runtime=runtime) == 7
    assert (out / "copy").read_text() == "from the host\nbar\n/tmp\n"
    assert not (data / "x").exists()  # read-only bind


def test_root_stays_untouched(runtime, busybox_rootfs):
    c = C.Container(rootfs=str(busybox_rootfs), argv=["sh", "-c", "touch /newfile"])
    assert C.run(c, runtime=runtime) == 0
    assert not (busybox_rootfs / "newfile").exists()  # writes go to a private overlay


def test_sigterm_reaches_the_command(runtime, busybox_rootfs, tmp_path):
    c = C.Container(rootfs=str(busybox_rootfs),
                    argv=["sh", "-c", 'trap "exit 42" TERM; echo up > /out/up; '
                                      'while true; do sleep 0.1; done'],
                    binds=[C.Bind(str(tmp_path), "/out", readonly=False)])
    running = C.start(c, runtime=runtime)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "up").exists():
            assert time.time() < deadline, "container never started"
            time.sleep(0.05)
        running.send_signal(signal.SIGTERM)
        rc = running.wait(timeout=60)
    finally:
        running.kill()
    assert rc in (42, 128 + signal.SIGTERM)
    assert not os.path.exists(running.state_dir)


def test_missing_command_detected_before_start(busybox_rootfs):
    assert C.rootfs_has(busybox_rootfs, "sh")
    assert C.rootfs_has(busybox_rootfs, "/bin/sh")
    assert not C.rootfs_has(busybox_rootfs, "python3")
    assert not C.rootfs_has(busybox_rootfs, "/usr/bin/nothing")


def test_absolute_symlinks_resolve_inside_root(tmp_path):
    root = tmp_path / "r"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_text("")
    os.symlink("/usr/bin", root / "bin")          # absolute: must not escape to the host
    os.symlink("/usr/bin/tool", root / "usr/bin/alias")
    assert C.rootfs_has(root, "/bin/tool")
    assert C.rootfs_has(root, "alias")
    assert not C.rootfs_has(root, "/bin/ls")      # exists on the host, not in the root


def test_bad_root_and_empty_command(tmp_path):
    with pytest.raises(C.ContainerError, match="not a directory"):
        C.start(C.Container(rootfs=str(tmp_path / "missing"), argv=["sh"]))
    with pytest.raises(C.ContainerError, match="no command"):
        C.start(C.Container(rootfs=str(tmp_path), argv=[]))


def test_own_dev_never_the_hosts(runtime, busybox_rootfs, tmp_path):
    """A process in the container cannot remove the host's /dev/null nor see its disks;
    the usual nodes, ptys and /dev/shm work."""
    script = ("busybox ls -1 /dev > /out/dev; "
              "echo gone > /dev/null && busybox head -c 8 /dev/urandom | wc -c > /out/urandom; "
              "busybox head -c 4 /dev/zero | wc -c > /out/zero; echo s > /dev/shm/x; "
              "test -c /dev/ptmx -o -L /dev/ptmx && busybox touch /out/ptmx; "
              "busybox rm -f /dev/null; test -e /dev/null || busybox touch /out/removed")
    c = C.Container(rootfs=str(busybox_rootfs), argv=["sh", "-c", script],
                    binds=[C.Bind(str(tmp_path), "/out", readonly=False)])
    assert C.run(c, runtime=runtime) == 0
    assert os.path.exists("/dev/null") and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert (tmp_path / "removed").exists()    # it was the container's own node
    names = (tmp_path / "dev").read_text().split()
    assert {"null", "zero", "urandom", "random", "full", "tty", "shm", "pts"} <= set(names)
    assert not [n for n in names if n.startswith(("vd", "sd", "nvme", "loop", "fuse", "kmsg"))]
    assert (tmp_path / "urandom").read_text().strip() == "8"
    assert (tmp_path / "zero").read_text().strip() == "4"
    assert (tmp_path / "ptmx").exists()


def test_fake_gpu_and_infiniband_nodes_reach_the_container(runtime, busybox_rootfs, tmp_path):
    node = tmp_path / "node"
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "infiniband/uverbs0"):
        (node / "dev" / name).parent.mkdir(parents=True, exist_ok=True)
        os.mknod(node / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a null
    out = tmp_path / "out"
    out.mkdir()
    plan = D.plan("all", root=str(node), env={}, runtime=runtime)
    c = C.Container(rootfs=str(busybox_rootfs),
                    argv=["sh", "-c", "test -c /dev/nvidia0 && test -c /dev/nvidiactl && "
                                      "test -c /dev/infiniband/uverbs0 && "
                                      "echo ok > /dev/nvidia0 && busybox touch /out/ok"],
                    binds=[C.Bind(str(out), "/out", readonly=False)],
                    options=C.Options(devices=plan))
    assert C.run(c, runtime=runtime) == 0
    assert (out / "ok").exists()
    bare = C.Container(rootfs=str(busybox_rootfs), argv=["sh", "-c", "test -e /dev/nvidia0"])
    assert C.run(bare, runtime=runtime) == 1   # not asked: not there


def test_network_host_and_none(runtime, busybox_rootfs, tmp_path):
    def interfaces(network: str) -> set[str]:
        c = C.Container(rootfs=str(busybox_rootfs), argv=["sh", "-c", "cat /proc/net/dev > /out/n"],
                        binds=[C.Bind(str(tmp_path), "/out", readonly=False)],
                        options=C.Options(network=network))
        assert C.run(c, runtime=runtime) == 0
        return {line.split(":")[0].strip() for line in (tmp_path / "n").read_text().splitlines()
                if ":" in line}
    with open("/proc/net/dev") as f:
        host = {line.split(":")[0].strip() for line in f if ":" in line}
    assert interfaces("host") == host
    assert interfaces("none") == {"lo"}
