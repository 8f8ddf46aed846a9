"""Nothing outlives a killed command (issue 18, item 8): ``image mount``, ``ckpt mount`` and
``image run`` are SIGKILLed at seeded random moments of their start (and once when they
are up); their servers die with them, the next command on the node removes what they
left, and nothing of theirs is then mounted, running or on disk."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from bootseer.node import alive, proc
from bootseer.node import mounts as points
from tests.image.test_image import oci_layout

pytestmark = pytest.mark.timeout(300)
SEEDS = (3, 5)           # bounded: two random moments per command, plus one when it is up
UP = None                # the kill moment "once it is up"


def _kill_moments() -> list[float | None]:
    return [random.Random(seed).uniform(0.2, 2.0) for seed in SEEDS] + [UP]


def _bootseer(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                          text=True, env=env, timeout=120, **kw)


def _theirs(token: str) -> list[int]:
    """Processes that carry ``token`` in their environment or arguments."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and (token.encode() in env or token.encode() in cmd):
            found.append(int(entry))
    return found


def _state_paths(token: str) -> set[Path]:
    """Private directories under /tmp that the command's processes name in their
    arguments (podman's --root, --rootfs...)."""
    found = set()
    for pid in _theirs(token):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        found |= {Path(m) for m in re.findall(r"/tmp/bs[a-z]+-[A-Za-z0-9_]+", cmd)}
    return found


def _dead_states(before: set[str]) -> dict[Path, list[dict]]:
    """State directories made since ``before`` whose owner is dead, with their notes."""
    out = {}
    for name in set(os.listdir(alive.STATE_ROOT)) - before:
        path = Path(alive.STATE_ROOT, name)
        if name.startswith(alive.STATE_PREFIXES) and alive.held(path / alive.MARK) is False:
            out[path] = alive._notes(path)
    return out


def _mounted_under(*roots) -> list[str]:
    roots = [os.path.realpath(r) for r in roots]
    return [e.mountpoint for e in points.table()
            if any(e.mountpoint == r or e.mountpoint.startswith(r + "/") for r in roots)]


def _wait(check, timeout: float, what):
    """Poll ``check`` until true; ``what`` (a string, or a function giving one) says why
    it failed."""
    deadline = time.time() + timeout
    while True:
        result = check()
        if result or time.time() > deadline:
            assert result, what() if callable(what) else what
            return result
        time.sleep(0.05)


def _kill_then_next(argv: list[str], env: dict, up, next_command, tmp_path: Path,
                    moment: float | None, watched_mount: Path | None) -> None:
    token = f"bstest-{uuid.uuid4().hex}"
    env = {**env, "BOOTSEER_TEST_KILL_TOKEN": token}
    argv = [a.replace("TOKEN", token) for a in argv]
    before = set(os.listdir(alive.STATE_ROOT))
    p = subprocess.Popen([sys.executable, "-m", "bootseer", *argv], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if moment is UP:
            _wait(lambda: up(token) or p.poll() is not None, 90, "the command did not come up")
            assert p.poll() is None, p.stderr.read()
        else:
            time.sleep(moment)
    finally:
        used = _state_paths(token)   # what its processes name, noted or not
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    if watched_mount is not None:   # the FUSE server unmounts as its parent dies
        _wait(lambda: not os.path.ismount(watched_mount), 30,
              f"{watched_mount} still mounted after its command was killed")
    left = _dead_states(before)
    noted = [Path(r["dir"]) for notes in left.values() for r in notes if "dir" in r]
    next_command()   # sweeps what the killed one left, and must work
    assert not _mounted_under(tmp_path, *left, *noted), "left mounted"
    assert not [p for p in (*left, *noted, *used) if p.exists()], "left on disk"
    _wait(lambda: not _theirs(token), 60, lambda: f"left running: {_theirs(token)}")


@pytest.fixture(scope="module")
def image_store(tmp_path_factory, busybox_rootfs):
    """A converted busybox image in a local store: (store, tree digest)."""
    root = tmp_path_factory.mktemp("sigkill-image")
    layer = root / "layer.tar"
    with tarfile.open(layer, "w") as t:
        for entry in sorted(busybox_rootfs.iterdir()):
            t.add(entry, arcname=entry.name)
    (root / "layout").mkdir()
    oci_layout(root / "layout", [layer.read_bytes()])
    store = str(root / "store")
    r = _bootseer("image", "convert", str(root / "layout"), "--to", store)
    assert r.returncode == 0, r.stderr
    return store, r.stdout.strip().splitlines()[-1]


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache/blobs")}


def _mount_read_unmount(argv: list[str], env: dict, mnt: Path, check_file: str) -> None:
    """Run a foreground mount command: it mounts, serves ``check_file``, SIGTERM unmounts.
    Up is when it says so: a dead command's mount may still be at ``mnt`` until this one
    has swept it."""
    import threading
    p = subprocess.Popen([sys.executable, "-m", "bootseer", *argv], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(p.stdout), daemon=True)
    reader.start()
    try:
        _wait(lambda: any(line.startswith("mounted ") for line in said) or p.poll() is not None,
              60, "no mount")
        assert p.poll() is None, p.stderr.read()
        assert os.path.ismount(mnt)
        assert (mnt / check_file).exists()
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, p.stderr.read()
        assert not os.path.ismount(mnt)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.mark.parametrize("backend", ["fuse", "auto"])
@pytest.mark.parametrize("moment", _kill_moments())
def test_killed_image_mount_leaves_nothing(need_fuse, image_store, tmp_path, moment, backend):
    """``fuse``: the server unmounts as its parent dies. ``auto`` (EROFS where the kernel
    has it): the kernel mount has no server; the next command unmounts it."""
    store, tree = image_store
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = ["image", "mount", tree, str(mnt), "--store", store, "--record"]
    env = {**_env(tmp_path), "BOOTSEER_MOUNT_BACKEND": backend}
    _kill_then_next(argv, env, lambda _token: os.path.ismount(mnt),
                    lambda: _mount_read_unmount(argv, env, mnt, "bin/busybox"),
                    tmp_path, moment, mnt if backend == "fuse" else None)


@pytest.mark.parametrize("moment", _kill_moments())
def test_killed_ckpt_mount_leaves_nothing(need_fuse, nginx, www, tmp_path, moment):
    (www / "model.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = ["ckpt", "mount", nginx.url + "/", str(mnt)]
    env = _env(tmp_path)
    _kill_then_next(argv, env, lambda _token: os.path.ismount(mnt),
                    lambda: _mount_read_unmount(argv, env, mnt, "model.bin"),
                    tmp_path, moment, mnt)


@pytest.mark.parametrize("moment", _kill_moments())
def test_killed_image_run_leaves_nothing(need_root, need_fuse, image_store, tmp_path, moment):
    store, tree = image_store
    env = _env(tmp_path)

    def container_is_up(token: str) -> bool:   # its command runs (the token is its $0)
        return any(Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sh\0-c\0sleep")
                   for pid in _theirs(token) if Path(f"/proc/{pid}").exists())

    def next_run() -> None:
        r = _bootseer("image", "run", tree, "--store", store, "--", "sh", "-c", "echo ok",
                      env=env)
        assert r.returncode == 0 and "ok" in r.stdout, r.stderr

    argv = ["image", "run", tree, "--store", store, "--", "sh", "-c", "sleep 300; :", "TOKEN"]
    _kill_then_next(argv, env, container_is_up, next_run, tmp_path, moment, None)


@pytest.mark.parametrize("moment", [_kill_moments()[0], UP])
def test_killed_run_with_a_pulled_image_leaves_nothing(need_root, registry, busybox_rootfs,
                                                       tmp_path, moment):
    """The conventional path (``run --pull``, also the fallback when the store is down):
    podman's storage of the pulled image lies outside the run's state directory."""
    from tests.run.test_baseline import push_busybox
    ref = push_busybox(registry, busybox_rootfs, tmp_path)
    env = _env(tmp_path)

    def container_is_up(token: str) -> bool:
        return any(Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sh\0-c\0sleep")
                   for pid in _theirs(token) if Path(f"/proc/{pid}").exists())

    def next_run() -> None:
        r = _bootseer("run", "--pull", "--image", ref, "--", "sh", "-c", "echo ok", env=env)
        assert r.returncode == 0 and "ok" in r.stdout, r.stderr

    argv = ["run", "--pull", "--image", ref, "--", "sh", "-c", "sleep 300; :", "TOKEN"]
    _kill_then_next(argv, env, container_is_up, next_run, tmp_path, moment, None)


def test_a_child_started_from_a_short_lived_thread_lives_until_its_parent_dies():
    """PR_SET_PDEATHSIG follows the spawning thread: ``proc.spawn`` starts the child from
    a thread that lives as long as the process, so the child survives its caller's thread
    and dies with the process."""
    import threading
    script = ("import subprocess, threading, time\n"
              "from bootseer.node import proc\n"
              "box = []\n"
              "t = threading.Thread(target=lambda: box.append(proc.spawn(\n"
              "    subprocess.Popen, ['sleep', '60'], **proc.popen_kwargs())))\n"
              "t.start(); t.join()\n"
              "print(box[0].pid, flush=True)\n"
              "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        time.sleep(0.3)   # the spawning thread has ended: the child must still run
        assert Path(f"/proc/{child}").exists()
        p.kill()
        p.wait(10)
        _wait(lambda: not Path(f"/proc/{child}").exists()
              or Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
              10, "the child outlived its parent")
    finally:
        if p.poll() is None:
            p.kill()
    assert threading.current_thread() is threading.main_thread()


def test_die_with_parent_when_the_parent_is_already_gone():
    """The race between fork and prctl: a child whose parent died first is signalled at
    once (getppid no longer names the spawner)."""
    r = subprocess.run([sys.executable, "-c",
                        "import signal; from bootseer.node import proc\n"
                        "proc.die_with_parent(1, signal.SIGKILL)\n"
                        "print('still here')"], capture_output=True, text=True, timeout=30)
    assert r.returncode == -signal.SIGKILL and "still here" not in r.stdout
    assert proc.popen_kwargs()["preexec_fn"] is not None


# -- the sweep itself: what it removes and what it never touches ------------------------------
_HOLDER = """
import sys, time, subprocess
from bootseer.node import alive
state = alive.StateDir("bsn-", sweep=False)
for mp in sys.argv[1:]:
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", mp], check=True)
    state.note_mount(mp)
print(state.path, flush=True)
time.sleep(120)
"""


def _holder(*mountpoints) -> tuple[subprocess.Popen, Path]:
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, *map(str, mountpoints)],
                         stdout=subprocess.PIPE, text=True)
    return p, Path(p.stdout.readline().strip())


def test_sweep_unmounts_a_dead_commands_mounts_and_never_a_live_ones(need_root, tmp_path):
    dead_mp, live_mp = tmp_path / "dead", tmp_path / "live"
    dead_mp.mkdir()
    live_mp.mkdir()
    dead, dead_state = _holder(dead_mp)
    live, live_state = _holder(live_mp)
    try:
        assert os.path.ismount(dead_mp) and os.path.ismount(live_mp)
        assert str(live_state) not in alive.sweep_dead()     # alive: nothing touched
        assert os.path.ismount(dead_mp) and live_state.exists()
        dead.kill()
        dead.wait(10)
        assert str(dead_state) in alive.sweep_dead()
        assert not os.path.ismount(dead_mp) and not dead_state.exists()
        assert os.path.ismount(live_mp) and live_state.exists()
    finally:
        for p in (dead, live):
            p.kill()
            p.wait(10)
        for mp in (dead_mp, live_mp):
            points.unmount_under(str(mp))
    alive.sweep_dead()
    assert not live_state.exists()


def test_a_mount_now_held_by_a_live_command_is_never_unmounted(need_root, tmp_path):
    """The dead command's mount is gone and a live one mounted at the same place (the
    mount id may be reused): its note keeps the dead one's record from matching it."""
    mp = tmp_path / "mp"
    mp.mkdir()
    dead, dead_state = _holder(mp)
    dead.kill()
    dead.wait(10)
    points.lazy_unmount(str(mp))
    live, live_state = _holder(mp)
    try:
        alive.sweep_dead()
        assert os.path.ismount(mp) and not dead_state.exists()
    finally:
        live.kill()
        live.wait(10)
        points.unmount_under(str(mp))
        alive.sweep_dead()


def test_a_state_dir_others_could_have_planted_is_left_alone(tmp_path):
    """A directory anyone may write, with a dead-looking mark and notes asking to remove
    a directory and run a command: not ours, nothing done."""
    planted = Path(alive.STATE_ROOT) / f"bsn-planted-{uuid.uuid4().hex[:8]}"
    victim = tmp_path / "victim"
    victim.mkdir()
    planted.mkdir()
    try:
        (planted / alive.MARK).write_text("")
        (planted / alive.NOTES).write_text(
            f'{{"dir": "{victim}", "undo": ["touch", "{tmp_path}/ran"]}}\n')
        planted.chmod(0o777)
        assert str(planted) not in alive.sweep_dead()
        assert victim.exists() and not (tmp_path / "ran").exists() and planted.exists()
        planted.chmod(0o700)   # now private: a dead command's, swept with its notes
        assert str(planted) in alive.sweep_dead()
        assert not victim.exists() and (tmp_path / "ran").exists()
    finally:
        import shutil
        shutil.rmtree(planted, ignore_errors=True)


def test_a_state_dir_that_cannot_be_removed_now_is_left_to_the_next_sweep(monkeypatch):
    """What close() cannot remove (a busy file system, say) keeps a dead mark: the next
    sweep retries, instead of a directory no sweep would ever claim."""
    state = alive.StateDir("bsn-", sweep=False)
    stuck = state.path / "stuck"
    stuck.mkdir()
    real_rmtree = alive.shutil.rmtree
    monkeypatch.setattr(alive.shutil, "rmtree", lambda path, ignore_errors=False: None
                        if Path(path) == stuck else real_rmtree(path, ignore_errors))
    state.close()
    assert stuck.exists() and alive.held(state.path / alive.MARK) is False
    monkeypatch.undo()
    assert str(state.path) in alive.sweep_dead() and not state.path.exists()


def test_spawn_works_in_a_forked_child():
    """A forked child has no spawner thread: spawn must make its own, not wait forever."""
    script = ("import os, subprocess, threading\n"
              "from bootseer.node import proc\n"
              "def from_thread(box):\n"
              "    box.append(proc.spawn(subprocess.Popen, ['true']).wait())\n"
              "box = []\n"
              "t = threading.Thread(target=from_thread, args=(box,)); t.start(); t.join()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    box = []\n"
              "    t = threading.Thread(target=from_thread, args=(box,)); t.start(); t.join(20)\n"
              "    os._exit(0 if box == [0] else 1)\n"
              "print(os.waitpid(pid, 0)[1] == 0 and box == [0])\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "True", r.stderr


@pytest.mark.parametrize("moment", [UP])
def test_killed_image_convert_leaves_no_copy(tmp_path, moment):
    """`image convert` of a tar copies it into a layout under $TMPDIR first: a SIGKILLed
    convert's copy is removed by the next command."""
    import shutil
    if not shutil.which("skopeo"):
        pytest.skip("skopeo is not installed")
    from tests.image.test_image import tar_layer
    layout = oci_layout(tmp_path / "img", [tar_layer([("big", os.urandom(64 << 20), "f")])])
    archive = tmp_path / "image.tar"
    subprocess.run(["skopeo", "copy", f"oci:{layout}", f"docker-archive:{archive}"],
                   check=True, capture_output=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}

    def copying(token: str) -> bool:   # skopeo writes the copy
        return any(Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"skopeo\0")
                   for pid in _theirs(token) if Path(f"/proc/{pid}").exists())

    def next_convert() -> None:
        r = _bootseer("image", "convert", str(archive), "--to", str(tmp_path / "store"),
                      env=env)
        assert r.returncode == 0, r.stderr
        assert not any(scratch.iterdir()), "the killed convert's copy is still there"

    _kill_then_next(["image", "convert", str(archive), "--to", str(tmp_path / "store")],
                    env, copying, next_convert, tmp_path, moment, None)


def test_the_sweep_kills_what_still_runs_on_a_dead_commands_directory(tmp_path):
    """A process that survived its command's death signal (a podman waiting on storage
    that is about to go) and names the dead command's private directory is killed before
    the directory is removed; one that names another directory is left alone."""
    storage, other = tmp_path / "storage", tmp_path / "other"
    storage.mkdir()
    other.mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    user = subprocess.Popen([*sleeper, f"--root={storage}/r"])
    bystander = subprocess.Popen([*sleeper, f"--root={other}/r"])
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from bootseer.node import alive\n"
                               "s = alive.StateDir('bsn-', sweep=False)\n"
                               f"s.note_dir({str(storage)!r})\n"
                               "print(s.path, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        state = Path(holder.stdout.readline().strip())
        holder.kill()
        holder.wait(10)
        assert str(state) in alive.sweep_dead()
        assert user.wait(10) == -signal.SIGKILL and not storage.exists()
        assert bystander.poll() is None and other.exists()
    finally:
        for p in (user, bystander, holder):
            p.kill()
            p.wait(10)
