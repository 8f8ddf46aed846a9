"""Credentials for http(s) checkpoints that need not appear in a URL (or argv).

In order: the URL's own ``user:password@`` (sent by bootseer.store.http, masked everywhere
it is shown); else ``BOOTSEER_CKPT_USERNAME`` / ``BOOTSEER_CKPT_PASSWORD`` (the
``[ckpt]`` table of the settings file), sent to every http(s) checkpoint URL and mirror;
else the host's entry in ``~/.netrc`` (or ``$NETRC``), as curl and requests read it.
Other schemes use their filesystem's own credentials (``AWS_*`` for s3://, Kerberos for
hdfs://...).
"""

from __future__ import annotations

import base64
import functools
import netrc
import os
import urllib.parse

from bootseer import redact
from bootseer.config import section_key


def _basic(user: str, password: str) -> dict[str, str]:
    cred = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {cred}"}


@functools.lru_cache(maxsize=8)
def _configured(_key) -> tuple[str | None, str | None]:
    from bootseer.config import BootseerConfig
    c = BootseerConfig.from_env().ckpt
    return c.username, c.password


def _settings() -> tuple[str | None, str | None]:
    return _configured(section_key("ckpt"))


def _netrc(host: str) -> tuple[str, str] | None:
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if not entry or entry[0] is None:
        return None
    return entry[0], entry[2] or ""


def auth_headers(url: str) -> dict[str, str]:
    """The Authorization header for an http(s) ``url`` with no userinfo of its own."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.username is not None:
        return {}
    user, password = _settings()
    if user is not None:
        return _basic(user, password or "")
    found = _netrc(parts.hostname or "")
    return _basic(*found) if found else {}


def carried(url: str) -> bool:
    """Whether reading ``url`` uses credentials (in it, in the settings or in netrc): its
    staged copy and access profile are then private (ckpt.staging_mode ``auto``)."""
    return redact.has_credentials(url) or bool(auth_headers(url))
