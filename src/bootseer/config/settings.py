"""One settings object for all of bootseer.

Each subsystem owns a frozen ``Config`` dataclass; ``BootseerConfig`` composes them.
The environment is read only here, in :meth:`BootseerConfig.from_env`:

* ``BOOTSEER_<SECTION>_<FIELD>`` sets one field, e.g. ``BOOTSEER_FETCH_RETRIES=3``;
* ``BOOTSEER_CONFIG`` names a TOML file with one table per section (``[fetch] retries = 3``);
  without it, ``$XDG_CONFIG_HOME/bootseer/config.toml`` is read when present;
* the node's file, /etc/bootseer/config.toml (``BOOTSEER_SYSTEM_CONFIG`` names another), is
  read first: the user's file, then the environment, override it field by field.

Precedence: explicit overrides > environment > user's file > system's file > defaults
(:func:`effective` says where each setting in force came from). Every variable is
listed in docs/configuration.md. Sizes accept suffixes (``64MiB``, ``10G``).

This package is the one reader of ``BOOTSEER_*`` variables: the few that are not settings
(a start's id, the ready file, the restart count) have an accessor in :mod:`.env`. Those a
job's own processes read live in :mod:`bootseer.jobenv`, which the trace capture ships into
images without bootseer; this package builds on it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootseer import jobenv
from bootseer.errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1000**4, "tib": 1024**4}


def parse_size(value: str | int, field_name: str = "size") -> int:
    """``"64MiB"`` -> 67108864. Plain integers are bytes."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(field_name, f"{value!r} is not a size: bytes (1048576) or a number "
                          "with a unit (512MiB, 10GiB, 1.5TB: KiB/MiB/GiB/TiB are powers of "
                          "1024, k/M/G/T or kB/MB/GB/TB of 1000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _default_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/bootseer")
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "bootseer"


def _default_cache_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/bootseer")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bootseer"


def absolute_store_url(url: str) -> str:
    """A store URL naming a local directory (a path, ``file://``) as an absolute path;
    other URLs as they are."""
    if not url:
        return url
    if url.startswith("file://"):
        url = url[len("file://"):]
    elif "://" in url:
        return url
    return os.path.abspath(url)


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreConfig:
    url: str = field(default_factory=lambda: str(_default_data_dir() / "store"))
    """Where blobs live: a directory path (the embedded default), ``oci://host:port/repo``
    or ``registry+https://...``, or any fsspec URL (``s3://``, ``hdfs://``, ``http://``...)."""
    username: str | None = None
    """Registry user for basic/token auth (never logged)."""
    password: str | None = field(default=None, repr=False)
    """Registry password or token (never logged)."""
    insecure: bool = False
    """Allow plain http to a registry that is not on loopback."""

    def __post_init__(self) -> None:
        # a mount's server does not run in our directory: a relative store must not move
        object.__setattr__(self, "url", absolute_store_url(self.url))


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheConfig:
    dir: str = field(default_factory=lambda: str(_default_cache_dir() / "blobs"))
    """Node-local cache directory, shared by every bootseer process on the node."""
    budget_bytes: int = 20 * 1024**3
    """Hard byte budget of the node cache; LRU eviction keeps it under (pinned excepted)."""

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise ConfigError("cache.budget_bytes", "must be > 0")
        if self.dir:   # shared by processes that do not run in our directory
            object.__setattr__(self, "dir", os.path.abspath(self.dir))


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchConfig:
    max_inflight: int = 64
    """Requests in flight per fetcher, all hosts together."""
    connections_per_host: int = 16
    """Cap on concurrent connections to one storage host."""
    part_bytes: int = 8 * 1024**2
    """Large reads are split into parts of this size (stripes)."""
    coalesce_gap_bytes: int = 64 * 1024
    """Adjacent queued ranges of one blob closer than this are fetched as one request."""
    max_coalesced_bytes: int = 16 * 1024**2
    """Upper bound on one coalesced request."""
    retries: int = 5
    """Attempts after the first one before a read fails."""
    backoff_s: float = 0.1
    """First retry delay in seconds; doubles per attempt, with jitter."""
    backoff_max_s: float = 5.0
    """Largest retry delay in seconds."""
    timeout_s: float = 30.0
    """Socket timeout of one request, seconds."""
    deadline_s: float = 300.0
    """A read that has not succeeded after this many seconds fails."""
    verify: bool = True
    """Verify every whole blob against its digest before returning it."""

    def __post_init__(self) -> None:
        for name in ("max_inflight", "connections_per_host", "part_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"fetch.{name}", "must be > 0")
        if self.retries < 0:
            raise ConfigError("fetch.retries", "must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceConfig:
    location: str | None = None
    """Where trace events go (directory or store URL); unset disables tracing."""
    job_id: str | None = None
    """Job identifier shared by every node of one job."""
    attempt: int = 0
    """Restart number of the job (0 = first start)."""
    node: str | None = None
    """Node name; defaults to the host name."""
    gpus: int = 0
    """GPUs on this node (used for GPU-seconds lost)."""

    def __post_init__(self) -> None:
        # a store URL location is checked by opening it (bootseer run, report/remote.py);
        # ids name trace files: no '/', '..'
        for name, value in (("job_id", self.job_id),   # {rank}-style node templates allowed
                            ("node", re.sub(r"\{\w*\}", "0", self.node or ""))):
            problem = value and jobenv.id_problem(value)
            if problem:
                raise ConfigError(f"trace.{name} (BOOTSEER_TRACE_{name.upper()})", problem)


@dataclass(frozen=True, kw_only=True, slots=True)
class CkptConfig:
    stripe_bytes: int = 8 * 1024**2
    """Checkpoint files are fetched in stripes of this many bytes."""
    memory_budget_bytes: int = 2 * 1024**3
    """Bytes of stripes held in memory by one process, all open files together."""
    max_stripes_in_flight: int = 32
    """Stripe requests in flight per process, all files together."""
    per_host: int = 16
    """Concurrent connections to one storage host."""
    readahead_max_bytes: int = 256 * 1024**2
    """Largest read-ahead window of one sequential cursor."""
    hedge_multiple: float = 3.0
    """With mirrors, a stripe in flight longer than this many times the median of recent
    stripes is re-issued to another replica (hedged read); the first answer wins."""
    hedge_min_s: float = 0.2
    """Never hedge a stripe younger than this (seconds): below it, the median of a fast
    link is noise and hedging would only double the traffic."""
    username: str | None = None
    """User for http(s) checkpoints (basic auth), so no password is put in a URL; else
    ``user:password@`` in the URL, else ``~/.netrc`` (never logged)."""
    password: str | None = field(default=None, repr=False)
    """Password for ``ckpt.username`` (never logged, traced or stored)."""
    staging_mode: str = "auto"
    """Who may read staged checkpoint files and their access profiles: ``auto`` (only the
    owner, 0600 files / 0700 folders, when the checkpoint was read with credentials; else
    everyone, 0644), ``private`` (only the owner, always) or ``shared`` (everyone)."""
    staging_dir: str = ""
    """The node's staging directory for checkpoint files (staged stripes, access
    profiles); empty: ``ckpt-staging`` inside ``cache.dir``, the node's bootseer cache,
    never a folder beside it."""
    stage: str = "auto"
    """What a node's checkpoint mount stages: ``reads`` (the small files, and the large
    ones its own ranks read: those of its last load here at once, any other from the job's
    first read of it), ``all`` (every file), ``auto`` (``reads`` for a job of two or more
    nodes whose DCP checkpoint stores tensors in parts, ``all`` otherwise). See
    docs/ckpt.md, "Each node stages what its ranks read"."""
    fuse: str = "auto"
    """Which FUSE server a checkpoint mount runs: ``devfuse`` (bootseer's own /dev/fuse
    server: staged files read through kernel passthrough), ``mfusepy`` (libfuse), or
    ``auto`` (devfuse where the kernel offers passthrough and the process has
    CAP_SYS_ADMIN, else mfusepy, said once in the log)."""

    def __post_init__(self) -> None:
        if self.fuse not in ("auto", "devfuse", "mfusepy"):
            raise ConfigError("ckpt.fuse", f"{self.fuse!r} is not auto, devfuse or mfusepy")
        if self.stage not in ("auto", "reads", "all"):
            raise ConfigError("ckpt.stage", f"{self.stage!r} is not auto, reads or all")
        for name in ("stripe_bytes", "memory_budget_bytes", "max_stripes_in_flight", "per_host"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ckpt.{name}", "must be > 0")
        if self.hedge_multiple <= 1:
            raise ConfigError("ckpt.hedge_multiple", "must be > 1 (a multiple of the median)")
        if self.hedge_min_s < 0:
            raise ConfigError("ckpt.hedge_min_s", "must be >= 0")
        if self.staging_dir:   # shared by processes that do not run in our directory
            object.__setattr__(self, "staging_dir", os.path.abspath(self.staging_dir))
        if self.staging_mode not in ("auto", "private", "shared"):
            raise ConfigError("ckpt.staging_mode", f"{self.staging_mode!r} is not auto, "
                                                   "private or shared")


@dataclass(frozen=True, kw_only=True, slots=True)
class MountConfig:
    backend: str = "auto"
    """How lazy trees (images, environments) are mounted: ``erofs`` (the kernel's EROFS on
    a metadata image and a data blob), ``fuse`` (the Python FUSE tree view) or ``auto``
    (EROFS where the kernel has file-backed mounts, else FUSE, said once in the log)."""
    stored_metadata: bool = True
    """Mount the EROFS metadata image a tree's producer stored with it (its digest is part
    of the tree's, so it is as trusted as the tree; a fresh node then writes none). False:
    every node writes its own from the checked TOC, so the kernel parses only images this
    node wrote (a site that does not trust its image producers' tooling that far)."""
    platform: str = ""
    """Which tree of a multi-platform image this node mounts (``os/arch[/variant]``);
    empty: this machine's (``platform.machine()`` in OCI's names: x86_64 is amd64)."""
    env_lazy: bool = False
    """A restored environment whose blob the node lacks is mounted as soon as its metadata
    is local, the blob served on demand (recorded profile first) and filled in the
    background into the node's blob (``deps.fill``); off: the whole blob is fetched first."""

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "erofs", "fuse"):
            raise ConfigError("mount.backend", f"{self.backend!r} is not auto, erofs or fuse")
        if self.platform and not re.fullmatch(r"[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?",
                                              self.platform):
            raise ConfigError("mount.platform", f"{self.platform!r} is not os/arch[/variant], "
                                                "e.g. linux/arm64")


@dataclass(frozen=True, kw_only=True, slots=True)
class PeersConfig:
    """Peer-to-peer distribution of hot sets among the nodes of one job (docs/peers.md)."""
    mode: str = "auto"
    """``off``, ``on``, or ``auto``: on when the job has >= 2 nodes and the set is at least
    ``min_set_bytes``."""
    nodes: int = 0
    """Nodes in the job (0: unknown, which ``auto`` takes as one)."""
    job_id: str | None = None
    """The job whose nodes share (default: trace.job_id); its nodes announce themselves
    under the store ref ``peers/<job_id>/``."""
    interface: str | None = None
    """Address or device name to listen on and announce (default: the address that routes
    to the store)."""
    port_min: int = 6881
    """Lowest listening port for peer traffic."""
    port_max: int = 6999
    """Highest listening port for peer traffic."""
    upload_cap_bytes: int = 0
    """Upload cap per node in bytes per second (0: none); applies to the job's private
    network too."""
    min_set_bytes: int = 64 * 1024**2
    """Under ``auto``, smaller sets come from the origin only."""
    stall_s: float = 5.0
    """Without progress from peers for this long, the rest comes from the origin."""
    wait_s: float = 120.0
    """How long a node waits for the set's torrent that another node is making."""

    def __post_init__(self) -> None:
        if self.mode not in ("off", "auto", "on"):
            raise ConfigError("peers.mode", f"{self.mode!r} is not off, auto or on")
        if not 0 < self.port_min <= self.port_max < 65536:
            raise ConfigError("peers.port_min", "need 0 < port_min <= port_max < 65536")
        if self.upload_cap_bytes < 0 or self.nodes < 0:
            raise ConfigError("peers.upload_cap_bytes", "must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class WarmConfig:
    """Warm starts (``bootseer run --warm``, docs/warm-start.md)."""
    max_rss_mb: int = 4096
    """A zygote holding more resident memory than this is dropped instead of forked from."""
    keep_s: float = 0.0
    """How long a node's zygote waits for the next start after the job (0: stopped with it)."""
    dir: str = ""
    """This user's zygote sockets (a 0700 directory; default ``/tmp/bootseer-warm-<uid>``)."""
    timeout_s: float = 5.0
    """A worker waits this long for the zygote's answer, then starts cold."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BootseerConfig:
    store: StoreConfig = field(default_factory=StoreConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    ckpt: CkptConfig = field(default_factory=CkptConfig)
    mount: MountConfig = field(default_factory=MountConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    warm: WarmConfig = field(default_factory=WarmConfig)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 overrides: Mapping[str, Mapping[str, Any]] | None = None) -> BootseerConfig:
        return cls.from_layers(cls.layers(env, overrides=overrides))

    @classmethod
    def from_layers(cls, layers: list[Layer]) -> BootseerConfig:
        """The settings the layers give, a later layer's field over an earlier one's."""
        merged: dict[str, dict[str, Any]] = {}
        for layer in layers:
            try:   # checked alone first, so that a bad value names where it was set
                cls.from_dict(layer.values)
            except ConfigError as e:
                raise ConfigError(e.field, f"{e.reason} ({_where(layer, e.field)})") from e
            for section, values in layer.values.items():
                merged.setdefault(section, {}).update(values)
        return cls.from_dict(merged)

    @classmethod
    def layers(cls, env: Mapping[str, str] | None = None, *,
               overrides: Mapping[str, Mapping[str, Any]] | None = None) -> list[Layer]:
        """Where settings come from, lowest precedence first: the system's file, the user's
        file, the environment, explicit overrides (flags)."""
        env = os.environ if env is None else env
        found: list[Layer] = [Layer(path, _read_toml(path, var))
                              for path, var in config_files(env)]
        from_vars: dict[str, dict[str, Any]] = {}
        for sect in dataclasses.fields(cls):
            sub = typing.get_type_hints(cls)[sect.name]
            for sf in dataclasses.fields(sub):
                var = setting_var(sect.name, sf.name)
                if var in env:
                    from_vars.setdefault(sect.name, {})[sf.name] = env[var]
        found.append(Layer("environment", from_vars))
        flags = {section: {k: v for k, v in values.items() if v is not None}
                 for section, values in (overrides or {}).items()}
        found.append(Layer("flags", flags))
        return found

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> BootseerConfig:
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}
        for section in data:
            if section not in known:
                raise ConfigError(section, f"unknown section (known: {', '.join(sorted(known))})")
        kwargs = {}
        for name in known:
            sub = hints[name]
            kwargs[name] = _build(sub, name, data.get(name, {}))
        return cls(**kwargs)

    def replace(self, **sections: Any) -> BootseerConfig:
        """A copy with whole sections or ``section={"field": value}`` dicts replaced."""
        new = {}
        for name, value in sections.items():
            current = getattr(self, name)
            new[name] = (dataclasses.replace(current, **value) if isinstance(value, dict)
                         else value)
        return dataclasses.replace(self, **new)


SYSTEM_CONFIG_VAR = "BOOTSEER_SYSTEM_CONFIG"
SYSTEM_CONFIG = "/etc/bootseer/config.toml"
"""The node's settings file, read before the user's: a fleet sets its store and cache once."""


@dataclass(frozen=True)
class Layer:
    """One source of settings: a file's path, ``environment`` or ``flags``, and the raw
    values it gives (section -> field -> value, not yet checked)."""
    source: str
    values: dict[str, dict[str, Any]]


def config_files(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The TOML files read, (path, the variable that names it), lowest precedence first:
    the system's (``BOOTSEER_SYSTEM_CONFIG``, else /etc/bootseer/config.toml when present),
    then the user's (``BOOTSEER_CONFIG``, else $XDG_CONFIG_HOME/bootseer/config.toml when
    present). A file a variable names must exist; a default path may be absent."""
    files = []
    system = env.get(SYSTEM_CONFIG_VAR)
    if system is None and Path(SYSTEM_CONFIG).is_file():
        system = SYSTEM_CONFIG
    if system:
        files.append((system, SYSTEM_CONFIG_VAR))
    user = env.get(jobenv.CONFIG_FILE)
    if user is None:
        xdg = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        candidate = Path(xdg) / "bootseer" / "config.toml"
        user = str(candidate) if candidate.is_file() else None
    if user:
        files.append((user, jobenv.CONFIG_FILE))
    return files


def _read_toml(path: str, var: str) -> dict[str, dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(var, f"cannot read {path}: {e}") from e
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(section, f"expected a [{section}] table in {path}")
    return data


def effective(env: Mapping[str, str] | None = None, *,
              overrides: Mapping[str, Mapping[str, Any]] | None = None
              ) -> list[tuple[str, str, Any, str]]:
    """Every setting as (section, field, value in force, where it came from: a file's path,
    the variable's name, ``flags`` or ``default``); secrets shown as ``***`` when set."""
    env = os.environ if env is None else env
    layers = BootseerConfig.layers(env, overrides=overrides)
    config = BootseerConfig.from_layers(layers)   # the files read once, for both
    rows = []
    for sect in dataclasses.fields(config):
        values = getattr(config, sect.name)
        for sf in dataclasses.fields(values):
            source = "default"
            for layer in layers:
                if sf.name in layer.values.get(sect.name, {}):
                    source = (setting_var(sect.name, sf.name) if layer.source == "environment"
                              else layer.source)
            value = getattr(values, sf.name)
            if not sf.repr and value:   # a secret (never logged, never shown)
                value = "***"
            rows.append((sect.name, sf.name, value, source))
    return rows


def _where(layer: Layer, field: str) -> str:
    if layer.source == "environment":
        return f"from {setting_var(*field.split('.', 1))}" if "." in field else "from a variable"
    return "from the command line" if layer.source == "flags" else f"in {layer.source}"


def _build(cls: type, section: str, values: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, raw in values.items():
        if key not in names:
            raise ConfigError(f"{section}.{key}",
                              f"unknown field (known: {', '.join(sorted(names))})")
        kwargs[key] = _coerce(raw, hints[key], f"{section}.{key}")
    return cls(**kwargs)


def _coerce(raw: Any, typ: Any, name: str) -> Any:
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        if raw is None or (isinstance(raw, str) and raw == ""):
            return None
        typ = next(a for a in args if a is not type(None))
    if not isinstance(raw, str):
        return raw
    try:
        if typ is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ is int:
            return parse_size(raw, name) if name.endswith("bytes") else int(raw)
        if typ is float:
            return float(raw)
    except ConfigError:
        raise   # parse_size's own message names the forms a size takes
    except ValueError as e:
        what = {bool: "true or false (also 1/0, yes/no, on/off)", int: "a whole number",
                float: "a number"}.get(typ, f"a valid {getattr(typ, '__name__', typ)}")
        raise ConfigError(name, f"{raw!r} is not {what}") from e
    return raw


def setting_var(section: str, name: str) -> str:
    """``("fetch", "retries")`` -> ``BOOTSEER_FETCH_RETRIES``."""
    return f"BOOTSEER_{section.upper()}_{name.upper()}"
