"""Registry logins from where podman, skopeo and docker keep them, for everything of
bootseer that reads or writes a registry (``image convert``'s pull and referrer push, the
``oci://`` store).

Files, first found wins (as podman and skopeo look): ``--authfile``, else
``$REGISTRY_AUTH_FILE``, ``$XDG_RUNTIME_DIR/containers/auth.json``,
``~/.config/containers/auth.json``, ``$DOCKER_CONFIG/config.json`` or
``~/.docker/config.json``. In a file, as docker does: a per-registry credential helper
(``credHelpers``), else the global one (``credsStore``), else the inline ``auths`` entry
(base64 ``user:password`` in ``auth``). An ``auths`` key may name a namespace,
``host/team`` (``podman login host/team``): as containers-auth.json(5) says, the most
specific key whose path leads the repository wins (``host/team/app``, then ``host/team``,
then ``host``); a key with a scheme (docker's ``https://host/v1/``) names its host only.
A helper is ``docker-credential-NAME`` on PATH, run
as ``docker-credential-NAME get`` with the server on standard input; it answers
``{"ServerURL", "Username", "Secret"}`` (user ``<token>``: the secret is an identity token).
A registry's own helper that is missing or fails is an error; a global ``credsStore``
whose helper is not installed (a desktop's leftover config) is a warning.

The secret is never logged, shown in an error, or put on a command line.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bootseer import redact
from bootseer.errors import BootseerError

log = logging.getLogger(__name__)

HELPER_TIMEOUT_S = 30.0
IDENTITY_TOKEN_USER = "<token>"
_DOCKER_HUB = {"docker.io", "index.docker.io", "registry-1.docker.io"}


class CredentialHelperError(BootseerError):
    """A credential helper named in an auth file is missing or failed."""


@dataclass(frozen=True)
class Login:
    username: str
    password: str = field(repr=False)

    @property
    def identity_token(self) -> bool:
        """An OAuth refresh token (docker's ``identitytoken``), not a password."""
        return self.username == IDENTITY_TOKEN_USER

    def auth_entry(self) -> dict[str, str]:
        """This login as an ``auths`` entry of an auth.json file."""
        if self.identity_token:
            return {"identitytoken": self.password}
        return {"auth": base64.b64encode(f"{self.username}:{self.password}".encode()).decode()}


def standard_authfiles() -> list[Path]:
    """Where podman, skopeo and docker keep registry logins, in the order they look."""
    env = os.environ
    out = []
    if env.get("REGISTRY_AUTH_FILE"):
        out.append(Path(env["REGISTRY_AUTH_FILE"]))
    if env.get("XDG_RUNTIME_DIR"):
        out.append(Path(env["XDG_RUNTIME_DIR"]) / "containers/auth.json")
    home = Path(env.get("HOME") or Path.home())
    out.append(home / ".config/containers/auth.json")
    out.append(Path(env["DOCKER_CONFIG"]) / "config.json" if env.get("DOCKER_CONFIG")
               else home / ".docker/config.json")
    return out


def find(host: str, authfile: str | os.PathLike[str] | None = None, *,
         repository: str | None = None) -> Login | None:
    """The login for registry ``host`` (``name[:port]``), for its ``repository``
    (``team/app``; None: the host's own login only): from ``authfile`` only when given,
    else from the first standard file that has one; None when nobody has one."""
    files = [Path(authfile)] if authfile else standard_authfiles()
    for path in files:
        login = login_in(path, host, repository)
        if login is not None:
            return login
    return None


def login_in(path: Path, host: str, repository: str | None = None) -> Login | None:
    """The login one auth file gives ``host`` (for ``repository``), or None (no file, no
    entry for it)."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    helper = _entry(config.get("credHelpers"), host)
    if isinstance(helper, str) and helper:
        return run_helper(helper, host, path)
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        if shutil.which(f"docker-credential-{store}") is None:
            # a desktop's leftover global store must not fail every anonymous pull
            log.warning("%s names the credential store %r, but docker-credential-%s is not "
                        "on PATH: no login from it for %s", path, store, store, host)
        else:
            login = run_helper(store, host, path)
            if login is not None:
                return login
    entry = _auths_entry(config.get("auths"), host, repository)
    return _inline(entry) if isinstance(entry, dict) else None


def _same_registry(key: str, host: str) -> bool:
    """Whether an auth file's key (``host``, ``https://host/v1/``, ...) names ``host``."""
    name = key.split("://", 1)[-1].split("/", 1)[0].lower()
    host = host.lower()
    return name == host or (name in _DOCKER_HUB and host in _DOCKER_HUB)


def _auths_key(key: str) -> tuple[str, tuple[str, ...]]:
    """An ``auths`` key as (host, namespace's path components): ``host/team`` gives
    ``("host", ("team",))``; one with a scheme names its host only (docker's legacy
    ``https://index.docker.io/v1/``)."""
    if "://" in key:
        return key.split("://", 1)[1].split("/", 1)[0].lower(), ()
    name, _, path = key.partition("/")
    return name.lower(), tuple(part for part in path.split("/") if part)


def _auths_entry(table: object, host: str, repository: str | None) -> object:
    """The ``auths`` entry of the most specific key for ``host``/``repository``."""
    if not isinstance(table, dict):
        return None
    wanted = tuple(part for part in (repository or "").split("/") if part)
    best: object = None
    best_depth = -1
    for key, value in table.items():
        if not isinstance(key, str):
            continue
        name, namespace = _auths_key(key)
        if not _same_registry(name, host) or wanted[:len(namespace)] != namespace:
            continue
        # an exact spelling of the host outranks an alias of it (docker.io's names)
        depth = len(namespace) * 2 + (name == host.lower())
        if depth > best_depth:
            best, best_depth = value, depth
    return best


def _entry(table: object, host: str) -> object:
    if not isinstance(table, dict):
        return None
    if host in table:
        return table[host]
    return next((v for k, v in table.items() if isinstance(k, str) and _same_registry(k, host)),
                None)


def _inline(entry: dict[str, object]) -> Login | None:
    token, auth = entry.get("identitytoken"), entry.get("auth")
    if isinstance(token, str) and token:
        return Login(IDENTITY_TOKEN_USER, token)
    if not isinstance(auth, str) or not auth:
        return None
    try:
        user, sep, password = base64.b64decode(auth).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return Login(user, password) if sep and user else None


def run_helper(name: str, host: str, named_in: Path) -> Login | None:
    """``docker-credential-NAME get`` for ``host``; None when it has no login for it."""
    program = f"docker-credential-{name}"
    path = shutil.which(program)
    if path is None:
        raise CredentialHelperError(f"{named_in} names the credential helper {name!r} for "
                                    f"{host}, but {program} is not on PATH: install it, or "
                                    f"pass --authfile/--creds")
    try:
        proc = subprocess.run([path, "get"], input=host, capture_output=True, text=True,
                              timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CredentialHelperError(f"credential helper {program} did not answer for {host} "
                                    f"within {HELPER_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise CredentialHelperError(f"cannot run credential helper {program}: "
                                    f"{e.strerror}") from None
    said = (proc.stdout.strip() or proc.stderr.strip())
    if proc.returncode != 0:
        if "credentials not found" in said.lower():   # docker's helpers' own wording
            return None
        first = redact.text(said.splitlines()[0][:200]) if said else "no message"
        raise CredentialHelperError(f"credential helper {program} failed for {host} "
                                    f"(exit {proc.returncode}): {first}")
    try:
        answer = json.loads(proc.stdout)
        user, secret = answer["Username"], answer["Secret"]
        if not isinstance(user, str) or not isinstance(secret, str):
            raise TypeError("Username and Secret must be strings")
    except (ValueError, KeyError, TypeError):   # its output may hold the secret: not shown
        raise CredentialHelperError(f"credential helper {program} answered {host} with "
                                    f"something other than its JSON "
                                    f"{{\"Username\", \"Secret\"}}") from None
    return Login(user, secret) if user or secret else None
