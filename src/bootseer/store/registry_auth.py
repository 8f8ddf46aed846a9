"""Credentials for one repository of an OCI distribution registry.

Anonymous, basic (a configured username and password, else at the first 401 the login
``podman login``/``docker login`` left for the host: auth files and credential helpers,
store/logins.py), and bearer tokens (a 401 with ``WWW-Authenticate: Bearer realm=..,
service=..,scope=..`` fetches a token from the realm, with basic credentials if any;
tokens are cached per scope). :meth:`RegistryAuth.send` is the one place a request is
repeated after a challenge was answered. Secrets never appear in ``repr``, errors or logs.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from typing import TypeVar

from bootseer.errors import StoreError
from bootseer.store import http, logins

R = TypeVar("R")
SENDS = 3
"""A request is sent at most this often: a bearer challenge can follow a basic one."""


class RegistryAuth:
    def __init__(self, host: str, repo: str, url: str, *, username: str | None = None,
                 password: str | None = None, timeout: float = 30.0):
        """``url``: how errors name the repository (without credentials)."""
        self.host, self.repo, self.url, self.timeout = host, repo, url, timeout
        self.username = username
        self._password = password
        self._tokens: dict[str, str] = {}  # scope -> bearer token
        self._last_token: str | None = None
        self._lock = threading.Lock()
        self._standard_login_tried = username is not None

    def __repr__(self) -> str:
        return f"RegistryAuth({self.url!r}, user={self.username!r})"

    def basic(self) -> dict[str, str]:
        if self.username is None:
            return {}
        cred = f"{self.username}:{self._password or ''}".encode()
        return {"Authorization": "Basic " + base64.b64encode(cred).decode()}

    def headers(self) -> dict[str, str]:
        """What a request carries now: the last bearer token, else basic credentials."""
        with self._lock:
            token = self._last_token
        return {"Authorization": f"Bearer {token}"} if token else self.basic()

    def send(self, send: Callable[[dict[str, str]], R],
             answer: Callable[[R], tuple[int, dict[str, str]]],
             drop: Callable[[R], None] = lambda r: None) -> R:
        """``send(headers)``, again after a 401 that a challenge answered (a token fetched,
        a standard login found). ``answer`` gives a response's status and headers;
        ``drop`` releases a response that is not returned."""
        for attempt in range(SENDS):
            r = send(self.headers())
            status, headers = answer(r)
            if status == 401 and attempt < SENDS - 1:
                try:
                    answered = self.challenge(headers)
                except BaseException:
                    drop(r)
                    raise
                if answered:
                    drop(r)
                    continue
            return r
        raise AssertionError("unreachable: the last send is returned")

    def challenge(self, headers: dict[str, str]) -> bool:
        """Handle a 401: fetch a bearer token if challenged for one. True if worth retrying."""
        chal = headers.get("www-authenticate", "")
        found = self._standard_login()
        if not chal.lower().startswith("bearer"):
            return found
        params = dict(re.findall(r'(\w+)="([^"]*)"', chal))
        scope = params.get("scope", "")
        with self._lock:
            cached = self._tokens.get(scope)
            if cached and cached != self._last_token:
                self._last_token = cached
                return True
        realm = params.get("realm")
        if not realm:
            raise StoreError(f"registry {self.host} sent a bearer challenge without a realm",
                             url=self.url)
        query = urllib.parse.urlencode({k: v for k, v in params.items()
                                        if k in ("service", "scope")})
        token_url = f"{realm}{'&' if '?' in realm else '?'}{query}"
        status, _, data = http.request("GET", token_url, headers=self.basic(),
                                       timeout=self.timeout)
        if status in (401, 403):
            raise StoreError(f"token service {http.safe_url(realm)} refused the credentials for "
                             f"{self.url} (HTTP {status}): check store.username / "
                             f"store.password", url=self.url)
        if status != 200:
            raise StoreError(f"token service {http.safe_url(realm)} answered HTTP {status}",
                             url=self.url)
        try:
            body = json.loads(data)
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise StoreError(f"token service {http.safe_url(realm)} sent no token", url=self.url)
        with self._lock:
            self._tokens[scope] = token
            self._last_token = token
        return True

    def _standard_login(self) -> bool:
        """Once, when no login is configured: the one the container tools keep for this
        host. True if one was found (worth retrying with it)."""
        with self._lock:
            if self._standard_login_tried:
                return False
            self._standard_login_tried = True
        try:
            login = logins.find(self.host, repository=self.repo)
        except logins.CredentialHelperError as e:   # a store error, as callers expect
            raise StoreError(str(e), url=self.url) from None
        if login is None or login.identity_token:
            return False
        with self._lock:
            self.username, self._password = login.username, login.password
        return True

    def denied(self, status: int) -> StoreError:
        """The error of a 401 or 403 no challenge could answer."""
        how = ("check store.username / store.password (or the registry login in your auth "
               "file)" if self.username is not None
               else "the registry needs credentials: `podman login` / `docker login` to it, "
                    "or set BOOTSEER_STORE_USERNAME / _PASSWORD")
        return StoreError(f"registry {self.host} refused access to {self.repo} (HTTP {status}):"
                          f" {how}", url=self.url)
