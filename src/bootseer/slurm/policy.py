"""What a Slurm job may ask the prolog for, and what the site allows: pure parsing and
checks, no side effects.

A job's settings come from its comment or extra field, which the job's user writes and the
prolog (root) reads. Nothing in them is trusted: every value is checked against a strict
shape before it names anything, and a value that fails is refused with one line (the job
still runs, only colder). Passing the checks does not make a value safe to use as root:
what the user names (a requirements file, a prefix, a checkpoint URL) is used only by
processes running as the user (see :mod:`bootseer.slurm.hooks`); the checks are there so a
refusal is clear and early, and so the site's allow-lists hold.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bootseer.errors import BootseerError

KEYS = ("image", "deps", "prefix", "ckpt")
#: Directories no job's environment may live under (the node's own system).
SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
               "/dev", "/proc", "/sys", "/run", "/var", "/root", "/srv", "/snap")

_PATH_DEFAULT = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,511}")
_PATH = re.compile(r"/[A-Za-z0-9._/+@,=-]{0,1023}")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[A-Za-z0-9._~:/@+,=%-]{1,2048}")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


class SlurmSettingsError(BootseerError):
    """The site's Slurm settings file is missing a value or has a wrong one (a node fault:
    the prolog fails and Slurm drains the node until an administrator fixes it)."""


def shown(value: str, limit: int = 80) -> str:
    """A user's value as it may appear in a log or the job's output: printable ASCII only
    (nothing that starts a new line or moves the terminal), shortened."""
    text = "".join(c if " " <= c <= "~" else "?" for c in value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class Site:
    """The administrator's settings (``/etc/bootseer/slurm.toml``): what the prolog runs
    with, where, and the allow-lists a job's settings must pass."""
    bootseer: str                  # the executable every step runs
    path: str                      # PATH of every step (slurmd gives the prolog none)
    store: str | None              # BOOTSEER_STORE_URL of every step (None: bootseer's own)
    cache: str | None              # the node cache, root's (None: bootseer's own)
    users: str                     # per-user areas: USERS/UID, owned by that user, 0700
    state: str                     # per-job notes for the task prolog: STATE/JOBID
    log: str
    timeout: float                 # the prolog's seconds in all; keep below PrologEpilogTimeout
    keep: str                      # epilog: node cache and each user's area kept under this
    trace: str | None              # where the prolog's steps are recorded (the job's trace)
    prefixes: tuple[str, ...] = ()   # allowed environment roots ({user}, {uid}, {home})
    indexes: tuple[str, ...] = ()    # allowed package indexes (empty: any)
    ckpt_schemes: tuple[str, ...] = ("https", "http", "s3", "gs", "hdfs", "webhdfs", "file")
    deps: str = "user"             # "user": built or restored as the job's user; "off"

    @classmethod
    def load(cls, path: str, *, default_bootseer: str) -> Site:
        """The settings in ``path`` (every key optional); a missing file means the
        defaults; an unreadable or malformed one raises :class:`SlurmSettingsError`."""
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raw = {}
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SlurmSettingsError(f"{path}: {e}") from e
        raw = raw.get("slurm", raw)
        known = {"bootseer", "path", "store", "cache", "users", "state", "log", "timeout",
                 "keep", "trace", "prefixes", "indexes", "ckpt_schemes", "deps"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise SlurmSettingsError(f"{path}: unknown setting(s) {', '.join(unknown)}")

        def text(key, default):
            value = raw.get(key, default)
            if value is not None and not isinstance(value, str):
                raise SlurmSettingsError(f"{path}: {key} must be a string")
            return value

        def strings(key, default=()):
            value = raw.get(key, list(default))
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SlurmSettingsError(f"{path}: {key} must be a list of strings")
            return tuple(value)
        timeout = raw.get("timeout", 600)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise SlurmSettingsError(f"{path}: timeout must be a positive number of seconds")
        deps = text("deps", "user")
        if deps not in ("user", "off"):
            raise SlurmSettingsError(f"{path}: deps must be \"user\" or \"off\"")
        site = cls(bootseer=text("bootseer", default_bootseer),
                   path=text("path", _PATH_DEFAULT),
                   store=text("store", None), cache=text("cache", None),
                   users=text("users", "/var/lib/bootseer/users"),
                   state=text("state", "/run/bootseer/slurm"),
                   log=text("log", "/var/log/bootseer/prolog.log"), timeout=float(timeout),
                   keep=text("keep", "50G"), trace=text("trace", None),
                   prefixes=strings("prefixes"), indexes=strings("indexes"),
                   ckpt_schemes=strings("ckpt_schemes", cls.ckpt_schemes), deps=deps)
        for key in ("bootseer", "users", "state", "log"):
            if not os.path.isabs(getattr(site, key)):
                raise SlurmSettingsError(f"{path}: {key} must be an absolute path")
        return site


@dataclass(frozen=True)
class User:
    """The job's owner, as slurmd names it (SLURM_JOB_UID, SLURM_JOB_GID, SLURM_JOB_USER)."""
    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class Request:
    """What a job asked the prolog for, each value checked; ``refused`` says, one line each,
    what was refused and why; ``ignored`` names unknown settings."""
    image: str | None = None
    deps: str | None = None
    prefix: str | None = None
    ckpt: str | None = None
    refused: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()


def job_settings(extra: str | None, comment: str | None) -> str | None:
    """The job's bootseer settings: its extra field, else its comment, when it starts with
    ``bootseer `` (None: not a bootseer job, left alone)."""
    for text in (extra, comment):
        if text and text.startswith("bootseer "):
            return text[len("bootseer "):]
    return None


def parse(settings: str, site: Site, user: User) -> Request:
    """Check every ``key=value`` of a job's settings against its shape and the site."""
    values: dict[str, str] = {}
    refused: list[str] = []
    ignored: list[str] = []
    if not _PRINTABLE.fullmatch(settings):
        refusal = "the settings hold control or non-ASCII characters: all refused"
        return Request(refused=(refusal,))
    for word in settings.split():
        key, eq, value = word.partition("=")
        if not eq or key not in KEYS:
            ignored.append(shown(word, 40))
            continue
        if key in values:
            refused.append(f"{key}= given twice: both refused")
            values[key] = ""
            continue
        values[key] = value
    checks = {"image": _check_image, "deps": _check_spec_path,
              "prefix": lambda v: _check_prefix(v, site, user),
              "ckpt": lambda v: _check_ckpt(v, site)}
    kept: dict[str, str] = {}
    for key, value in values.items():
        if not value:
            continue
        problem = checks[key](value)
        if problem:
            refused.append(f"{key}={shown(value)} refused: {problem}")
        else:
            kept[key] = value
    if site.deps == "off" and ("deps" in values or "prefix" in values):
        refused.append("deps= refused: this site builds no environments in the prolog "
                       "(run 'bootseer deps ensure' in the batch script)")
        kept.pop("deps", None), kept.pop("prefix", None)
    elif ("deps" in kept) != ("prefix" in kept):
        have, other = ("deps", "prefix") if "deps" in kept else ("prefix", "deps")
        if other not in values:
            refused.append(f"{have}= refused: no {other}= given (they go together)")
        else:
            refused.append(f"{have}= skipped: its {other}= was refused")
        kept.pop(have)
    return Request(image=kept.get("image"), deps=kept.get("deps"), prefix=kept.get("prefix"),
                   ckpt=kept.get("ckpt"), refused=tuple(refused), ignored=tuple(ignored))


def _check_image(value: str) -> str | None:
    if value.startswith("sha256:") and not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
        return "a digest is sha256: and 64 lowercase hex digits"
    if not _IMAGE.fullmatch(value) or ".." in value.split("/"):
        return "an image is a tree digest, a store ref or an image reference " \
               "(letters, digits and . _ : / @ + = -)"
    return None


def _check_path(value: str) -> str | None:
    if not _PATH.fullmatch(value):
        return "not an absolute path of letters, digits and . _ / + @ , = -"
    if os.path.normpath(value) != value or "/./" in value + "/" or \
            "/../" in value + "/" or value.startswith("//"):
        return "not a canonical path ('..', '.', '//' or a trailing '/')"
    return None


def _check_spec_path(value: str) -> str | None:
    problem = _check_path(value)
    if problem:
        return problem
    if Path(value).name != "uv.lock" and not value.endswith((".txt", ".in", ".toml")):
        return "a spec is a requirements file (.txt, .in), a pyproject.toml or a uv.lock"
    return None


def under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def allowed_roots(site: Site, user: User) -> list[str]:
    """The site's allowed environment roots for this user ({user}, {uid}, {home})."""
    return [os.path.normpath(p.replace("{user}", user.name).replace("{uid}", str(user.uid))
                             .replace("{home}", user.home)) for p in site.prefixes]


def _check_prefix(value: str, site: Site, user: User) -> str | None:
    problem = _check_path(value)
    if problem:
        return problem
    if value == "/" or any(under(value, d) for d in SYSTEM_DIRS):
        return "a system directory; an environment lives in a directory its user owns"
    roots = allowed_roots(site, user)
    if roots and not any(under(value, r) and value != r for r in roots):
        return f"not under a directory this site allows ({', '.join(roots)})"
    return None


def _check_ckpt(value: str, site: Site) -> str | None:
    if value.startswith("/"):
        if "file" not in site.ckpt_schemes:
            return "local checkpoints are not allowed on this site"
        return _check_path(value)
    if not _URL.fullmatch(value):
        return ("not a URL of letters, digits and . _ ~ : / @ + , = % - (no query: "
                "credentials do not belong in a job's settings, which every user can read)")
    parts = urlsplit(value)
    if parts.scheme not in site.ckpt_schemes:
        return f"scheme {parts.scheme}:// is not allowed here ({', '.join(site.ckpt_schemes)})"
    if "@" in parts.netloc:
        return "credentials in the URL (every user can read a job's settings): use " \
               "~/.netrc or the variables of docs/security.md"
    if ".." in parts.path.split("/"):
        return "'..' in the path"
    return None


# -- the spec: which sources an environment built in the prolog may come from ------------

_VCS = ("git+", "hg+", "svn+", "bzr+")


@dataclass(frozen=True)
class SpecReport:
    """What a spec asks for: its problems (each refuses the environment), and the indexes
    it names."""
    problems: tuple[str, ...] = ()
    indexes: tuple[str, ...] = field(default=())


def _index_allowed(url: str, allowed: tuple[str, ...]) -> bool:
    return not allowed or any(url.rstrip("/") == a.rstrip("/") or
                              url.startswith(a.rstrip("/") + "/") for a in allowed)


def check_spec(path: str, indexes: tuple[str, ...]) -> SpecReport:
    """Read the spec at ``path`` (run as the job's user: it is the user's file) and list
    what the prolog will not build from it: a local source tree or file (``-e``, a path,
    ``file:``), a VCS URL, an index or direct URL the site does not allow."""
    name = Path(path).name
    try:
        text = _read_regular(path)
    except OSError as e:
        return SpecReport(problems=(f"cannot read {shown(path)}: {e.strerror}",))
    if name == "uv.lock":
        return _check_lock(text, indexes)
    if name == "pyproject.toml":
        return _check_pyproject(text, indexes)
    return _check_requirements(text, indexes, Path(path).parent, depth=0)


def _read_regular(path: str) -> str:
    """A spec's text: a regular file only (a FIFO or device is never waited on), its first
    4 MiB."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = os.read(fd, 4 << 20)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def _direct(req: str, indexes: tuple[str, ...]) -> str | None:
    """The problem of a requirement (None: a plain name and version constraint)."""
    req = req.split(";")[0].strip()
    if "@" in req:
        url = req.split("@", 1)[1].strip()
        if url.startswith(_VCS):
            return f"{shown(req)}: a VCS source (built from its tree)"
        if url.startswith(("file:", "/", ".", "~")):
            return f"{shown(req)}: a local source"
        if not _index_allowed(url, indexes):
            return f"{shown(req)}: a direct URL outside the allowed indexes"
        return None
    if req.startswith(("/", ".", "~", "file:")) or "/" in req or "\\" in req \
            or req.endswith((".whl", ".tar.gz", ".zip")):
        return f"{shown(req)}: a local path"
    if req.startswith(_VCS) or "://" in req:
        return f"{shown(req)}: a URL instead of a name"
    return None


def _check_requirements(text: str, indexes: tuple[str, ...], base: Path,
                        depth: int) -> SpecReport:
    problems: list[str] = []
    named: list[str] = []
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if not line:
            continue
        words = line.split()
        opt, value = words[0], (words[1] if len(words) > 1 else "")
        if opt.startswith("--") and "=" in opt:
            opt, value = opt.split("=", 1)
        if opt in ("-e", "--editable"):
            problems.append(f"{shown(line)}: an editable install (built from a source tree)")
        elif opt in ("-i", "--index-url", "--extra-index-url"):
            named.append(value)
            if not _index_allowed(value, indexes):
                problems.append(f"index {shown(value)} is not one this site allows")
        elif opt in ("-f", "--find-links"):
            problems.append(f"{shown(line)}: find-links (a local or unindexed source)")
        elif opt in ("-r", "--requirement", "-c", "--constraint"):
            if depth >= 4 or value.startswith("/") or ".." in value.split("/"):
                problems.append(f"{shown(line)}: an include outside the spec's folder")
                continue
            try:
                sub = _read_regular(str(base / value))
            except OSError as e:
                problems.append(f"{shown(line)}: {e.strerror}")
                continue
            inner = _check_requirements(sub, indexes, (base / value).parent, depth + 1)
            problems += inner.problems
            named += inner.indexes
        elif opt.startswith("-"):
            continue   # --hash, --pre, --only-binary...: how, not from where
        else:
            problem = _direct(line.split(" --")[0], indexes)
            if problem:
                problems.append(problem)
    return SpecReport(tuple(problems), tuple(named))


def _check_lock(text: str, indexes: tuple[str, ...]) -> SpecReport:
    try:
        lock = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return SpecReport(problems=(f"uv.lock: {e}",))
    problems: list[str] = []
    named: list[str] = []
    for pkg in lock.get("package", []):
        source = pkg.get("source", {}) if isinstance(pkg, dict) else {}
        name = shown(str(pkg.get("name", "?")) if isinstance(pkg, dict) else "?", 40)
        if "registry" in source:
            named.append(str(source["registry"]))
            if not _index_allowed(str(source["registry"]), indexes):
                problems.append(f"{name}: index {shown(str(source['registry']))} is not one "
                                "this site allows")
        elif "virtual" in source:
            continue   # the project itself, installed without being built
        elif "url" in source and _index_allowed(str(source["url"]), indexes) and indexes:
            continue
        else:
            kind = next(iter(source), "unknown")
            problems.append(f"{name}: a {kind} source (built from a tree or taken from "
                            "outside an index)")
    return SpecReport(tuple(problems), tuple(dict.fromkeys(named)))


def _check_pyproject(text: str, indexes: tuple[str, ...]) -> SpecReport:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return SpecReport(problems=(f"pyproject.toml: {e}",))
    problems: list[str] = []
    named: list[str] = []
    uv = doc.get("tool", {}).get("uv", {})
    for name, source in (uv.get("sources") or {}).items():
        kinds = sorted(set(source) & {"path", "git", "editable", "url"}) \
            if isinstance(source, dict) else []
        if kinds:
            problems.append(f"{shown(name, 40)}: a {kinds[0]} source in [tool.uv.sources]")
    for index in uv.get("index") or []:
        url = str(index.get("url", "")) if isinstance(index, dict) else ""
        named.append(url)
        if not _index_allowed(url, indexes):
            problems.append(f"index {shown(url)} is not one this site allows")
    project = doc.get("project", {})
    deps = list(project.get("dependencies") or [])
    for group in (project.get("optional-dependencies") or {}).values():
        deps += list(group)
    for req in deps:
        problem = _direct(str(req), indexes)
        if problem:
            problems.append(problem)
    return SpecReport(tuple(problems), tuple(named))
