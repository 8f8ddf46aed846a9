"""Secrets out of URLs and text: one helper for everything bootseer prints, traces, stores
or raises.

A URL may carry credentials in two places: its userinfo (``https://user:password@host/``)
and its query (S3 and GCS presigned URLs: ``X-Amz-Signature``, ``X-Amz-Credential``,
``X-Amz-Security-Token``, ``X-Goog-Signature``; Azure SAS ``sig``; ``token``,
``access_token``...). The URL keeps them for the requests it makes; everything else sees

* :func:`url` - for people (errors, logs, traces): secrets replaced by ``***``;
* :func:`strip` - for keys (profile names, staging names, store refs): secrets removed, so
  the same file read with rotated credentials is the same file;
* :func:`text` - any text (an exception from a library, a log line) with every URL in it
  redacted as :func:`url` does.
"""

from __future__ import annotations

import logging
import re
import urllib.parse

MASK = "***"

SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature",
    "x-goog-credential", "signature", "sig", "token", "access_token", "id_token",
    "refresh_token", "auth", "authorization", "password", "passwd", "pwd", "secret",
    "client_secret", "api_key", "apikey", "key", "awsaccesskeyid", "x-oss-signature",
    "ossaccesskeyid", "sas", "sv_sig", "code"})
"""Query parameters (lower case) whose value is a credential."""

_SECRET_WORDS = ("password", "passwd", "secret", "token", "signature", "credential")


def _secret_param(name: str) -> bool:
    low = name.lower()
    return low in SECRET_PARAMS or any(w in low for w in _SECRET_WORDS)


def has_credentials(u: str) -> bool:
    """Whether ``u`` carries a userinfo or a credential query parameter."""
    try:
        parts = urllib.parse.urlsplit(u)
    except ValueError:
        return False
    if "@" in parts.netloc:
        return True
    return any(_secret_param(k) for k, _ in urllib.parse.parse_qsl(parts.query,
                                                                  keep_blank_values=True))


def _rebuild(u: str, *, drop: bool) -> str:
    try:
        parts = urllib.parse.urlsplit(u)
    except ValueError:   # not parseable as a URL: redact it as text
        return _text_pass(u)
    netloc = parts.netloc
    if "@" in netloc:
        host = netloc.rpartition("@")[2]
        netloc = host if drop else f"{MASK}@{host}"
    query = parts.query
    if query:
        kept = []
        for item in query.split("&"):
            name = urllib.parse.unquote_plus(item.partition("=")[0])
            if not _secret_param(name):
                kept.append(item)
            elif not drop:
                kept.append(f"{item.partition('=')[0]}={MASK}")
        query = "&".join(kept)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url(u: str) -> str:
    """``u`` safe to show: userinfo and credential query values replaced by ``***``."""
    if not isinstance(u, str) or ("@" not in u and "?" not in u and "&" not in u):
        return u
    return _rebuild(u, drop=False)


def strip(u: str) -> str:
    """``u`` without its credentials (userinfo and credential query parameters removed):
    a stable key for the file it names."""
    if not isinstance(u, str) or ("@" not in u and "?" not in u):
        return u
    return _rebuild(u, drop=True)


# scheme://userinfo@ (greedy: up to the host's last '@', so a raw '@' in a password goes too)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/'\"<>]*@")
# ?name=value or &name=value whose name is a credential
_PARAM = re.compile(r"([?&;])([^=&\s'\"<>#?]+)=([^&\s'\"<>#]*)")


def _text_pass(s: str) -> str:
    s = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", s)
    return _PARAM.sub(lambda m: (f"{m.group(1)}{m.group(2)}={MASK}"
                                 if _secret_param(urllib.parse.unquote_plus(m.group(2)))
                                 else m.group(0)), s)


def text(s: str) -> str:
    """``s`` (an error message, a log line) with the credentials of every URL in it masked."""
    if not isinstance(s, str) or ("@" not in s and "=" not in s):
        return s
    return _text_pass(s)


def value(v: object) -> object:
    """A trace attribute value with URLs' credentials masked (strings, lists, dicts)."""
    if isinstance(v, str):
        return text(v)
    if isinstance(v, (list, tuple)):
        return [value(x) for x in v]
    if isinstance(v, dict):
        return {k: value(x) for k, x in v.items()}
    return v


class LogFilter:
    """A logging filter (put on handlers) that masks credentials in every record's text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report
            return True
        clean = text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = text(record.exc_text)
        return True


def install_log_filter() -> None:
    """Mask credentials in everything the root logger's handlers print."""
    for h in logging.getLogger().handlers:
        if not any(isinstance(f, LogFilter) for f in h.filters):
            h.addFilter(LogFilter())
