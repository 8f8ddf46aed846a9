"""Slurm's node hooks: the prolog warms a node for a job, the epilog keeps the node clean.

slurmd runs both as root, with the job's settings (its comment or extra field) written by
the job's user. The trust boundary:

- **As root**, only the node's own housekeeping (the log, the per-job notes, creating each
  user's area and handing it to them, the node cache's gc) and prefetching content-addressed,
  verified data into the node cache: an image tree named by digest or store ref
  (``image prefetch``; every chunk is checked against its digest before it is cached).
- **As the job's user** (``setpriv`` with SLURM_JOB_UID, SLURM_JOB_GID and the user's
  groups, no new privileges, a clean environment, in ``/``), everything the user's
  settings name: reading the requirements file, restoring or building the environment at
  the user's prefix (``deps ensure --copy``: a build runs the packages' build backends,
  which must never run as root), staging the checkpoint into the user's own area (a URL
  or path the user chose), and recording the steps into the job's trace.

Every value is checked first (:mod:`bootseer.slurm.policy`); a refused one is logged and
told to the job (the task prolog prints it into the job's output), and the prolog still
exits 0: a job's settings never drain a node. Only a node fault (the site's settings file
broken, the node's own directories unusable) makes the prolog fail, which drains the node
as Slurm intends. Each step is bounded by the site's timeout, so a slow source costs the job
a cold start, never the node.
"""

from __future__ import annotations

import json
import os
import pwd
import select
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bootseer.image.convert import ref_name
from bootseer.node import proc
from bootseer.slurm import policy
from bootseer.slurm.policy import Request, Site, User, shown
from bootseer.store import open_store
from bootseer.trace.record import Recorder


@dataclass(frozen=True)
class Job:
    """The job as slurmd describes it to its prolog and epilog."""
    id: str
    node: str
    attempt: int
    user: User | None
    settings: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Job:
        job_id = env.get("SLURM_JOB_ID", "")
        if not job_id.isdigit():
            raise policy.SlurmSettingsError(f"SLURM_JOB_ID={shown(job_id)!r} is not a job id "
                                            "(run by slurmd as its Prolog/Epilog?)")
        user = None
        uid, gid = env.get("SLURM_JOB_UID", ""), env.get("SLURM_JOB_GID", "")
        if uid.isdigit() and gid.isdigit():
            try:
                entry = pwd.getpwuid(int(uid))
                user = User(entry.pw_name, int(uid), int(gid), entry.pw_dir)
            except KeyError:
                user = None
        restarts = env.get("SLURM_JOB_RESTART_COUNT", "0")
        return cls(job_id, env.get("SLURMD_NODENAME") or os.uname().nodename,
                   int(restarts) if restarts.isdigit() else 0, user,
                   policy.job_settings(env.get("SLURM_JOB_EXTRA"), env.get("SLURM_JOB_COMMENT")))


@dataclass(frozen=True)
class Step:
    """One finished prolog step: what it was, as whom, how it ended."""
    name: str
    as_user: bool
    start: float
    end: float
    code: int | None       # None: killed at the site's timeout

    @property
    def ok(self) -> bool:
        return self.code == 0


class Hooks:
    """The prolog and epilog of one job on this node."""

    def __init__(self, site: Site, job: Job, store: str | None, cache: str | None):
        self.site, self.job, self.store, self.cache = site, job, store, cache
        self.notes: list[str] = []
        self._log_fd: int | None = None
        # one limit for the whole prolog, not per step: slurmd's PrologEpilogTimeout bounds
        # the whole script
        self.deadline = time.monotonic() + site.timeout

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    # -- the node's log (root's) ----------------------------------------------------------

    def log_fd(self) -> int:
        if self._log_fd is None:
            os.makedirs(os.path.dirname(self.site.log), mode=0o755, exist_ok=True)
            self._log_fd = os.open(self.site.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT |
                                   os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        return self._log_fd

    def say(self, text: str, *, tell_job: bool = False) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.write(self.log_fd(), f"{stamp} job {self.job.id}: {text}\n".encode())
        if tell_job:
            self.notes.append(shown(text, 400))

    # -- as whom ----------------------------------------------------------------------------

    def user_area(self, user: User) -> Path:
        """USERS/UID: made by root in root's directory (no path a user controls leads
        there), then handed to the user, 0700. One that exists must be a directory the
        user owns (not a link): anything else is left alone and the user's steps skipped."""
        root = Path(self.site.users)
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
        area = root / str(user.uid)
        try:
            os.mkdir(area, 0o700)
            os.chown(area, user.uid, user.gid, follow_symlinks=False)
        except FileExistsError:
            pass
        st = os.lstat(area)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != user.uid:
            raise PermissionError(f"{area} is not a directory owned by {user.name}")
        return area

    def user_env(self, user: User, area: Path) -> dict[str, str]:
        """The whole environment of a step run as the user: nothing of root's."""
        env = {"HOME": user.home, "USER": user.name, "LOGNAME": user.name,
               "PATH": self.site.path, "LANG": "C.UTF-8", "SLURM_JOB_ID": self.job.id,
               "BOOTSEER_CACHE_DIR": str(area / "cache")}
        if self.store:
            env["BOOTSEER_STORE_URL"] = self.store
        return env

    def root_env(self) -> dict[str, str]:
        env = {"PATH": self.site.path, "HOME": "/root", "LANG": "C.UTF-8"}
        if self.store:
            env["BOOTSEER_STORE_URL"] = self.store
        if self.cache:
            env["BOOTSEER_CACHE_DIR"] = self.cache
        return env

    def as_user_argv(self, user: User, argv: list[str]) -> list[str]:
        return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups",
                "--no-new-privs", "--pdeathsig=KILL", "--", *argv]

    def as_user_call(self, user: User, fn, *args, timeout: float = 30.0):
        """``fn(*args)`` in a forked child that has become the user (groups, gid, uid, in
        that order, then ``/``); its JSON-able result, or None when it failed or overran."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:   # the child: never returns into the caller's code
            code = 1
            try:
                os.close(read)
                os.setgroups(os.getgrouplist(user.name, user.gid))
                os.setgid(user.gid)
                os.setuid(user.uid)
                os.chdir("/")
                out = json.dumps(fn(*args)).encode()
                while out:
                    out = out[os.write(write, out):]
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        chunks, deadline = [], time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([read], [], [], left)[0]:
                    os.kill(pid, signal.SIGKILL)
                    break
                data = os.read(read, 65536)
                if not data:
                    break
                chunks.append(data)
        finally:
            os.close(read)
            _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        return json.loads(b"".join(chunks))

    # -- the prolog -------------------------------------------------------------------------

    def prolog(self) -> None:
        job, site = self.job, self.site
        if job.settings is None:
            return   # not a bootseer job
        user = job.user
        if user is None:
            self.say("no job user (SLURM_JOB_UID/GID unknown on this node): nothing done",
                     tell_job=True)
            self.write_notes(None, None)
            return
        request = policy.parse(job.settings, site, user)
        for word in request.ignored:
            self.say(f"ignoring unknown setting '{word}'", tell_job=True)
        for line in request.refused:
            self.say(line, tell_job=True)
        area = None
        if request.deps or request.ckpt:
            try:
                area = self.user_area(user)
            except OSError as e:
                self.say(f"{user.name}'s area is unusable ({e}): deps= and ckpt= skipped",
                         tell_job=True)
                request = Request(image=request.image)
        if request.deps:
            report = self.as_user_call(user, _spec_report, request.deps, list(site.indexes),
                                       timeout=min(30.0, self.left()))
            problems = report["problems"] if report else ["could not be read as the job's user"]
            if problems:
                for p in problems[:10]:
                    self.say(f"deps={shown(request.deps)} refused: {p}", tell_job=True)
                request = Request(image=request.image, ckpt=request.ckpt)
        if request.image:
            tree = self.image_tree(request.image)
            if tree is None:
                self.say(f"image={shown(request.image)} skipped: not in this site's store (the "
                         "prolog prefetches converted images only: bootseer image convert)",
                         tell_job=True)
            request = Request(image=tree, deps=request.deps, prefix=request.prefix,
                              ckpt=request.ckpt)
        steps = self.run_steps(request, user, area)
        for s in steps:
            who = user.name if s.as_user else "root"
            if s.ok:
                self.say(f"{s.name}: done in {s.end - s.start:.1f} s (as {who})", tell_job=True)
            elif s.code is None:
                self.say(f"{s.name}: stopped at the site's limit of {site.timeout:g} s "
                         f"(as {who}); the job starts cold", tell_job=True)
            else:
                self.say(f"{s.name}: failed (exit {s.code}) after {s.end - s.start:.1f} s "
                         f"(as {who}); the job starts cold (details: {site.log} on "
                         f"{job.node})", tell_job=True)
        if steps and site.trace:
            self.as_user_call(user, _record, site.trace, job.id, job.attempt, job.node,
                              [[s.name, s.start, s.end, s.code, s.as_user] for s in steps],
                              timeout=10.0)
        self.write_notes(user, area)

    def image_tree(self, ref: str) -> str | None:
        """The tree digest ``ref`` names in the site's store: a digest, a store ref, or the
        ref a converted image was published under. Only the store is asked (never a
        registry the job named: root contacts no host a user chose)."""
        if ref.startswith("sha256:"):
            return ref
        store = open_store(self.store)
        for name in (ref, ref_name(ref)):
            try:
                digest = store.get_ref(name)
            except Exception:  # noqa: BLE001 - not a valid ref name: try the next form
                digest = None
            if digest:
                return str(digest)
        return None

    def run_steps(self, request: Request, user: User, area: Path | None) -> list[Step]:
        """The steps, in parallel, bounded by what is left of the site's timeout (a step's
        whole process group is killed when it overruns)."""
        bs = self.site.bootseer
        planned: list[tuple[str, bool, list[str], dict]] = []
        if request.image:
            planned.append(("image", False, [bs, "image", "prefetch", "-q", "--", request.image],
                            self.root_env()))
        if request.deps and request.prefix and area is not None:
            argv = [bs, "deps", "ensure", "-q", "--copy", "--prefix", request.prefix]
            for url in self.site.indexes:
                argv += ["--index-url", url]
            planned.append(("deps", True, self.as_user_argv(user, [*argv, "--", request.deps]),
                            self.user_env(user, area)))
        if request.ckpt and area is not None:
            planned.append(("ckpt", True, self.as_user_argv(
                user, [bs, "ckpt", "prefetch", "-q", "--", request.ckpt]),
                self.user_env(user, area)))
        running: list[tuple[str, bool, float, subprocess.Popen | None]] = []
        for name, as_user, argv, env in planned:
            start = time.time()
            try:
                p = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL,
                                     stdout=self.log_fd(), stderr=self.log_fd(),
                                     start_new_session=True, **proc.popen_kwargs(signal.SIGKILL))
            except OSError as e:
                self.say(f"{name}: could not start ({e})")
                running.append((name, as_user, start, None))
                continue
            running.append((name, as_user, start, p))
        steps = []
        for name, as_user, start, child in running:
            if child is None:
                steps.append(Step(name, as_user, start, time.time(), 127))
                continue
            try:
                code: int | None = child.wait(timeout=self.left())
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.pid, signal.SIGKILL)   # the step's group, by its leader's pid
                except ProcessLookupError:
                    pass
                child.wait()
                code = None
            steps.append(Step(name, as_user, start, time.time(), code))
        return steps

    def write_notes(self, user: User | None, area: Path | None) -> None:
        """STATE/JOBID/task-prolog, in TaskProlog's language: ``print`` lines for the job's
        output, ``export`` lines for its environment (the user's cache, where its
        checkpoint was staged; the store; the trace)."""
        lines = [f"print bootseer prolog: {n}" for n in self.notes]
        exports = {}
        if area is not None:
            exports["BOOTSEER_CACHE_DIR"] = str(area / "cache")
        if self.store:
            exports["BOOTSEER_STORE_URL"] = self.store
        if self.site.trace:
            exports["BOOTSEER_TRACE_LOCATION"] = self.site.trace
            exports["BOOTSEER_TRACE_JOB_ID"] = self.job.id
        lines += [f"export {k}={v}" for k, v in exports.items() if policy.shown(v) == v]
        state = Path(self.site.state)
        state.mkdir(parents=True, exist_ok=True, mode=0o755)
        folder = state / self.job.id
        folder.mkdir(exist_ok=True, mode=0o755)
        tmp = folder / ".task-prolog.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, folder / "task-prolog")

    # -- the epilog -------------------------------------------------------------------------

    def epilog(self) -> None:
        """The node cache (root's) and the job user's area (as the user) kept under the
        site's size; the job's notes removed."""
        bs, keep = self.site.bootseer, self.site.keep
        for what in ("ckpt", "deps"):
            self._gc(what, [bs, what, "gc", "-q", "--max-size", keep], self.root_env(), "root")
        user = self.job.user
        area = Path(self.site.users) / str(user.uid) if user else None
        if user is not None and area is not None and _owned_dir(area, user.uid):
            env = self.user_env(user, area)
            for what in ("ckpt", "deps"):
                self._gc(what, self.as_user_argv(user, [bs, what, "gc", "-q", "--max-size", keep]),
                         env, user.name)
        folder = Path(self.site.state) / self.job.id
        for name in ("task-prolog", ".task-prolog.tmp"):
            try:
                os.unlink(folder / name)
            except FileNotFoundError:
                pass
        try:
            folder.rmdir()
        except OSError:
            pass

    def _gc(self, what: str, argv: list[str], env: dict, who: str) -> None:
        try:
            code = subprocess.run(argv, check=False, env=env, cwd="/", stdin=subprocess.DEVNULL,
                                  stdout=self.log_fd(), stderr=self.log_fd(),
                                  timeout=self.site.timeout).returncode
        except (OSError, subprocess.TimeoutExpired) as e:
            code = -1
            self.say(f"epilog: {what} gc ({who}): {e}")
        if code == 0:
            self.say(f"epilog: {what} gc done as {who} (keep {self.site.keep})")
        else:
            self.say(f"epilog: {what} gc failed as {who} (exit {code})")


def _owned_dir(path: Path, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid


# -- run as the job's user, in a forked child (see Hooks.as_user_call) --------------------

def _spec_report(path: str, indexes: list[str]) -> dict:
    report = policy.check_spec(path, tuple(indexes))
    return {"problems": list(report.problems), "indexes": list(report.indexes)}


def _record(location: str, job: str, attempt: int, node: str, steps: list) -> bool:
    """The prolog's steps as phases of the job's trace (``prolog.image``...), written by the
    user into the trace location (a directory root never writes into for a user)."""
    r = Recorder(location, job, attempt, node, None, 0)
    now_wall, now_mono = time.time(), time.monotonic()
    for name, start, end, code, as_user in steps:
        mono = now_mono - (now_wall - start)
        status = "ok" if code == 0 else ("timeout" if code is None else "error")
        r.write(r.event("span", f"prolog.{name}", start, end, mono, mono + (end - start),
                        status, {"as": "user" if as_user else "root", "exit": code}, None))
    return r.enabled
