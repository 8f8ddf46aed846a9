"""A zygote kept between containers on a node (``bootseer run --image --warm`` with
``warm.keep_s > 0``): started by ``bootseer run`` as a detached container of its own (the
same image tree, environment, working directory, user, binds and network as the job),
reused by the next start when its key matches, it is alive and it passes its check.

The job's workers reach its socket through the bound per-user, per-image directory; each
forked child chroots into the worker's own root (the fd the launcher passes), so it sees
the job's mounts, and signals go over the socket (the child lives in the zygote's PID
namespace). It ends itself after ``keep_s`` idle seconds (its PID namespace with it); a
stale or dead one is stopped by its PID and replaced. See docs/warm-start.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bootseer import jobenv, trace
from bootseer.config import BootseerConfig
from bootseer.errors import MountError
from bootseer.run import container as C
from bootseer.run import warmhold
from bootseer.warm import proto, ship
from bootseer.warm.key import DIR_VAR, KEYED_VARS, key_difference, socket_path
from bootseer.warm.session import route

log = logging.getLogger(__name__)
RECORD = "kept.json"
READY_WAIT_S = 120.0
# Per-start values: each forked child takes its worker's own; the zygote's are not used.
PER_START = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                       "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", jobenv.READY_FILE,
                       jobenv.WARM_MODULES})
PER_START_PREFIXES = ("TORCHELASTIC_", "SLURM_", jobenv.TRACE_PREFIX)
# Binds whose target these variables name are a start's own data, not what the zygote
# imports: the checkpoint (a mount, or a staged copy, of its own per start). A forked child
# sees the job's own through its root; the zygote's container does not bind them.
PER_START_BIND_VARS = ("BOOTSEER_CKPT_DIR",)


def _shared(binds: Sequence[C.Bind], env: Mapping[str, str], per_run: str) -> list[C.Bind]:
    """The binds a kept zygote shares with the job: not this run's own paths (under
    ``per_run``), not a start's own data (``PER_START_BIND_VARS``)."""
    own = {env[v] for v in PER_START_BIND_VARS if env.get(v)}
    return [b for b in binds if not b.source.startswith(per_run) and b.target not in own]


@dataclass(frozen=True)
class Kept:
    """What the job's container needs to be served by the kept zygote, and ``close``:
    called when the job has ended, it prepares the zygote for the next start (one line)."""
    argv: list[str]
    binds: list[C.Bind]
    said: str
    hit: bool
    close: Callable[[], str]


def _modules(path: str) -> tuple[list[str], str]:
    """The module list the capture wrote next to the socket, and its digest (the key's)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return [], ""
    names = [m.strip() for m in data.decode(errors="replace").splitlines() if m.strip()]
    return names, hashlib.sha256(data).hexdigest()[:16]


def layout_key(*, image: str, argv: Sequence[str], env: Mapping[str, str], workdir: str,
               binds: Sequence[C.Bind], options: C.Options, per_run: str) -> dict[str, str]:
    """What a kept zygote must share with the job, besides what the zygote checks itself
    (script and config digests): image tree, uid, command, working directory, environment
    less per-start values and binds less this run's own paths (under ``per_run``),
    network, devices."""
    key = {"image": image, "uid": str(os.getuid()), "argv": json.dumps(list(argv)),
           "workdir": workdir, "network": options.network,
           "devices": json.dumps([n.target for n in options.devices.nodes])}
    for name, value in env.items():
        per_start = name in PER_START or name.startswith(PER_START_PREFIXES)
        if name in KEYED_VARS or not (per_start or per_run in value):
            key[f"env.{name}"] = value
    key["binds"] = json.dumps([[b.source, b.target, b.readonly]
                               for b in _shared(binds, env, per_run)])
    return key


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop(record: Mapping, host: str | None = None) -> None:
    """Stop a kept zygote by its PID: the ``unshare`` whose command names its state dir
    (so a reused PID is never signalled); ``--kill-child`` takes its namespace with it.
    One still serving another job's workers (asked over its socket in ``host``) is told
    to take no more and ends once they have, so that their exit statuses come back."""
    pid, marker = int(record.get("pid", 0)), str(record.get("state", ""))
    if host and record.get("socket"):
        info = _info(os.path.join(host, str(record["socket"])))
        if info is not None and info.get("workers"):
            _send(os.path.join(host, str(record["socket"])), {"op": "stop"})
            return
    if pid > 0 and marker and marker in _cmdline(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    holder = int(record.get("holder", 0))
    if holder > 0 and marker and marker in _cmdline(holder):
        # the holder of its image ends once the container has: it unmounts first
        deadline = time.monotonic() + warmhold.STOP_TIMEOUT_S
        while _alive(holder) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(holder) and marker in _cmdline(holder):
            log.warning("warm: holder %d of a kept zygote's image did not end: SIGTERM",
                        holder)
            os.kill(holder, signal.SIGTERM)
    if marker and not _alive(pid):
        shutil.rmtree(marker, ignore_errors=True)   # its (empty) mount points' directory


def _send(path: str, msg: dict) -> dict | None:
    """``msg`` to the zygote at ``path``; its answer (None: none)."""
    try:
        # through the directory's fd: a warm.dir path may be longer than a socket address
        folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
            proto.send(s, msg)
            return proto.recv(s, bytearray()) if msg["op"] == "info" else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(folder)


def _info(path: str) -> dict | None:
    return _send(path, {"op": "info"})


def _usable(record: Mapping, key: Mapping[str, str], host: str) -> str | None:
    """Why the recorded zygote cannot serve this start (None: it can)."""
    pid, marker = int(record.get("pid", 0)), str(record.get("state", ""))
    if not _alive(pid) or marker not in _cmdline(pid):
        return f"kept zygote {pid} is gone"
    why = key_difference(record.get("key", {}), key)
    if why is not None:
        return why
    if not _ready(pid, marker):
        return f"kept zygote {pid} did not get ready"
    info = _info(os.path.join(host, str(record.get("socket", ""))))
    if info is None:
        return f"kept zygote {pid} does not answer"
    if info.get("stale"):
        return str(info["stale"])
    return None


def _ready(pid: int, state: str) -> bool:
    """Wait for a zygote that may still be importing (one the last job's end started)."""
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(state, "log"), errors="replace") as f:
                if "zygote ready" in f.read():
                    return True
        except OSError:
            return False
        if not _alive(pid):
            return False
        time.sleep(0.05)
    return False


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# A lazy image served by a server in this run's own process (FUSE) ends with the run: a
# zygote kept on it would fault on the pages of its libraries not yet read (and the run's
# unmount would wait for it), so it runs on a mount of its own, held by a process that
# lives as long as it does (run/warmhold.py). A kernel-served (erofs-local) or unpacked
# one outlives the run.
KEEPABLE_MOUNTS = (None, "erofs-local")


def prepare(settings, *, rootfs: str, image: str, argv: list[str], env: dict[str, str],
            workdir: str, binds: list[C.Bind], options: C.Options, per_run: str,
            runtime: str = "chroot", attrs: Mapping | None = None,
            config: BootseerConfig | None = None) -> Kept | None:
    """Reuse or start the node's kept zygote for this job; None when there is none to keep
    (``keep_s`` 0 and the cases said in one line: the zygote lives in the job's
    container). ``attrs``: the prepared image's (its tree, how it is mounted). ``env``
    gets PYTHONPATH and the socket directory. PermissionError: a bad ``warm.dir``.
    ``config``: to mount a lazy image this run serves itself once more, for the zygote
    (None: such an image is not kept, the zygote lives in the job's container)."""
    started, attrs = time.time(), attrs or {}
    if settings.keep_s <= 0:
        return None
    # The zygote's own container is the chroot runtime's (root: mount namespaces, chroot);
    # a podman job's workers reach it the same way, through the bound socket directory.
    if runtime not in ("chroot", "podman") or os.geteuid() != 0:
        log.warning("warm: a zygote is kept between containers by root with --runtime "
                    "chroot or podman only (this run: %s); it lives in the job's container "
                    "(hint: warm.keep_s = 0)", runtime)
        return None
    hold = None
    if attrs.get("mount") not in KEEPABLE_MOUNTS and config is not None:
        hold = (config, image)   # the zygote's own mount of the same image (warmhold)
    elif attrs.get("mount") not in KEEPABLE_MOUNTS:
        log.warning("warm: the image is served by this run (%s) and goes with it: the zygote "
                    "lives in the job's container (hint: --image-mode pull, or a node whose "
                    "kernel mounts erofs from a file)", attrs.get("mount"))
        return None
    image = str(attrs.get("tree") or image)
    routed = route(argv, env)
    if isinstance(routed, str):
        return None
    host = ship.host_dir(settings.dir, image)
    pkg = ship.write_package(os.path.join(host, "pkg"))
    env["PYTHONPATH"] = ":".join(p for p in (ship.CONTAINER_PKG_DIR, env.get("PYTHONPATH")) if p)
    env[DIR_VAR] = ship.CONTAINER_DIR
    more = [C.Bind(pkg, ship.CONTAINER_PKG_DIR), C.Bind(host, ship.CONTAINER_DIR, readonly=False)]
    key = layout_key(image=image, argv=argv, env=env, workdir=workdir, binds=binds,
                     options=options, per_run=per_run)
    modules_file = socket_path(routed.worker, workdir, {DIR_VAR: host})[:-len(".sock")] + ".modules"
    key["modules"] = _modules(modules_file)[1]
    zygote_binds = _shared(binds, env, per_run) + more

    def start(why: str, wait: bool) -> str:
        stop(_read(record_path), host)
        return f"warm: {why}: " + _start(
            settings, host, record_path, key, modules_file, rootfs=rootfs, argv=argv,
            worker=routed.worker, env=env, workdir=workdir, binds=zygote_binds,
            options=options, wait=wait, hold=hold)

    def close() -> str:
        """A new module list (the capture wrote it during the job): the next start's zygote
        imports it, so it is started now, after the job, not while the next one imports."""
        have, record = _modules(modules_file)[1], _read(record_path)
        alive = _alive(int(record.get("pid", 0))) and str(record.get("state", "x")) in \
            _cmdline(int(record.get("pid", 0)))
        if have == key["modules"] and alive:
            rss = _info(os.path.join(host, str(record.get("socket", ""))))
            return (f"warm: zygote kept for {settings.keep_s:g} s idle "
                    f"({'?' if rss is None else rss.get('rss_mb')} MiB)")
        why = "new module list" if have != key["modules"] else "the job recorded no module list"
        key["modules"] = have
        # A held image stays; the run's own root (a pulled tree) is removed as the run
        # ends, so that zygote must have imported its list first.
        return start(why, wait=hold is None)
    job_argv = ship.container_command(argv, max_rss_mb=settings.max_rss_mb,
                                      timeout_s=settings.timeout_s, kept=True)
    record_path = os.path.join(host, RECORD)
    record = _read(record_path)
    why = _usable(record, key, host) if record else "no kept zygote"
    if why is None:
        trace.emit("job.warm", started, time.time(), hit=True, scope="kept",
                   pid=int(record["pid"]))
        said, hit = f"warm: kept zygote {record['pid']} reused", True
    elif not key["modules"] and any(k.startswith(jobenv.TRACE_PREFIX) for k in env):
        # No module list yet: a zygote importing nothing would serve the workers, and a
        # forked child runs no capture (the trace shim is the job's, not the zygote's),
        # so no list would ever be recorded. The workers start cold and record it; the
        # zygote is started at the job's end (close) importing it.
        stop(record, host)
        said, hit = (f"warm: {why}: no module list recorded yet: workers start cold and "
                     f"record it, a zygote importing it is kept at the job's end"), False
        trace.emit("job.warm", started, time.time(), hit=False, scope="kept", why=why)
    else:
        said, hit = start(why, wait=True), False
        trace.emit("job.warm", started, time.time(), hit=False, scope="kept", why=why)
    log.warning("%s", said)
    return Kept(job_argv, more, said, hit, close)


def _start(settings, host: str, record_path: str, key: dict[str, str], modules_file: str, *,
           rootfs: str, argv: list[str], worker: list[str], env: dict[str, str], workdir: str,
           binds: list[C.Bind], options: C.Options, wait: bool,
           hold: tuple[BootseerConfig, str] | None = None) -> str:
    """Start the zygote's own container, detached (it outlives this run); one line.
    ``wait``: until it has imported (else the next start waits for it). ``hold``: (the
    run's config, the image's reference): the zygote runs on a mount of its own, held
    by a process that unmounts it once the zygote has ended."""
    sock = socket_path(worker, workdir, {DIR_VAR: host})
    modules = _modules(modules_file)[0]
    if os.path.exists(sock):
        os.unlink(sock)   # the last one's, if it died without removing it
    state = os.path.join(host, f"ct-{time.time_ns()}")   # also names its process (stop)
    os.makedirs(f"{state}/m")
    os.makedirs(f"{state}/w")
    c = C.Container(rootfs=rootfs, workdir=workdir, env=env, binds=binds, options=options,
                    argv=[ship.image_python(argv), "-m", f"{ship.PACKAGE}.zygote", "--modules",
                          ",".join(modules), "--idle", str(settings.keep_s), "--max-rss",
                          str(settings.max_rss_mb), "--", *worker])
    log_path = os.path.join(state, "log")
    holder = 0
    if hold is not None:
        folder = state + "-image"   # outside the state dir, which stop() removes
        os.makedirs(folder)
        c = dataclasses.replace(c, rootfs=os.path.join(folder, "root"))
        try:
            holder, pid = warmhold.start(warmhold.HoldSpec(
                config=hold[0], ref=hold[1], folder=folder, container=c, state=state,
                log=log_path))
        except MountError as e:
            shutil.rmtree(state, ignore_errors=True)
            return f"no zygote (its image could not be mounted: {e}): workers start cold"
    else:
        with open(log_path, "wb") as log:
            # its own session and no parent-death signal: it outlives this run by design
            pid = subprocess.Popen(C.chroot_command(c, state), stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=log, start_new_session=True).pid
    with open(record_path + ".tmp", "w") as f:
        json.dump({"pid": pid, "holder": holder, "key": key, "state": state,
                   "socket": os.path.basename(sock)}, f)
    os.replace(record_path + ".tmp", record_path)
    held = f", on its own mount of the image (holder {holder})" if holder else ""
    if not wait:
        return f"zygote {pid} starting in a container of its own ({len(modules)} modules{held})"
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        with open(log_path, errors="replace") as f:
            text = f.read()
        if "zygote ready" in text:
            return (f"zygote {pid} started in a container of its own, kept "
                    f"{settings.keep_s:g} s idle, {len(modules)} modules imported{held}")
        if not _alive(pid):
            last = text.strip().splitlines()[-1:] or ["it exited"]
            return f"no zygote ({last[0]}): workers start cold"
        time.sleep(0.05)
    stop({"pid": pid, "holder": holder, "state": state})
    return "no zygote (not ready in time): workers start cold"
