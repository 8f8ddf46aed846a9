"""Store in an OCI distribution registry (``oci://host:port/repo``).

Blobs are registry blobs (HEAD, range GET, monolithic or chunked upload). A named ref is
a tag on a tiny OCI manifest whose one layer is the referenced blob, so refs survive the
registry's garbage collection and show up in ``tags/list``. '/' in ref names becomes
'--' in tags. Auth: anonymous, basic, or bearer tokens (the registry's 401 challenge).
Plain http only to loopback unless ``insecure``. The distribution API has no way to list
blobs, so :meth:`list` is refused with a clear error; create-if-absent refs are
check-then-put (the API has no compare-and-swap), which the lease logic tolerates.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from typing import Iterator

from bootseer.errors import BlobNotFound, DigestMismatch, FetchError, StoreError
from bootseer.store import http
from bootseer.store.digest import Digest, parse, sha256_digest

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY_CONFIG = b"{}"
CHUNK = 16 * 1024**2


def ref_to_tag(name: str) -> str:
    tag = name.replace("/", "--")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise StoreError(f"ref name {name!r} cannot be an OCI tag (letters, digits, _ . - /, "
                         f"at most 128 characters)")
    return tag


class OciBackend:
    writable = True

    def __init__(self, url: str, *, username: str | None = None, password: str | None = None,
                 insecure: bool = False, timeout: float = 30.0):
        u = urllib.parse.urlsplit(url)
        if not u.netloc or not u.path.strip("/"):
            raise StoreError(f"bad registry store URL {url!r}: expected oci://host:port/repo")
        self.host = u.netloc
        self.repo = u.path.strip("/")
        loopback = (u.hostname or "") in ("localhost", "::1") or (u.hostname or "").startswith("127.")
        self.scheme = "http" if (loopback or insecure) else "https"
        self.url = f"oci://{self.host}/{self.repo}"
        self.base = f"{self.scheme}://{self.host}/v2/{self.repo}"
        self.username, self.password, self.timeout = username, password, timeout
        self._token: str | None = None

    # -- auth ---------------------------------------------------------------------------------
    def _auth_headers(self) -> dict:
        if self._token:
            return {"Authorization": f"Bearer {self._token}"}
        if self.username:
            cred = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            return {"Authorization": f"Basic {cred}"}
        return {}

    def _request(self, method: str, url: str, headers: dict | None = None, body=None):
        h = {**self._auth_headers(), **(headers or {})}
        status, rh, data = http.request(method, url, headers=h, body=body, timeout=self.timeout)
        if status == 401 and "www-authenticate" in rh and rh["www-authenticate"].lower().startswith("bearer"):
            self._fetch_token(rh["www-authenticate"])
            h = {**self._auth_headers(), **(headers or {})}
            status, rh, data = http.request(method, url, headers=h, body=body, timeout=self.timeout)
        if status == 401:
            raise StoreError(f"registry {self.host} refused the credentials for {self.repo} "
                             f"(HTTP 401): check store.username / store.password", url=self.url)
        return status, rh, data

    def _fetch_token(self, challenge: str) -> None:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not realm:
            raise StoreError(f"registry {self.host} sent a bearer challenge without realm")
        query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
        headers = {}
        if self.username:
            cred = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {cred}"
        status, _, data = http.request("GET", f"{realm}?{query}", headers=headers, timeout=self.timeout)
        if status != 200:
            raise StoreError(f"token service {http._safe(realm)} answered HTTP {status}")
        body = json.loads(data)
        self._token = body.get("token") or body.get("access_token")

    # -- blobs --------------------------------------------------------------------------------
    def stat(self, digest: Digest) -> int:
        status, rh, _ = self._request("HEAD", f"{self.base}/blobs/{parse(digest)}")
        if status == 404:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest, url=self.url)
        if status != 200:
            raise FetchError(f"HEAD {digest} at {self.url}: HTTP {status}", digest=digest, url=self.url)
        return int(rh["content-length"])

    def exists(self, digest: Digest) -> bool:
        try:
            self.stat(digest)
            return True
        except BlobNotFound:
            return False

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        headers = self._auth_headers()
        try:
            return http.get_range(f"{self.base}/blobs/{parse(digest)}", start, end,
                                  timeout=self.timeout, headers=headers, digest=digest)
        except BlobNotFound:
            raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                               url=self.url) from None

    def write(self, digest: Digest, data, size: int | None = None) -> bool:
        parse(digest)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = data.read()
        data = bytes(data)
        actual = sha256_digest(data)
        if actual != digest:
            raise DigestMismatch(f"refusing to upload {digest}: the bytes hash to {actual}",
                                 digest=digest, url=self.url)
        if self.exists(digest):
            return False
        status, rh, body = self._request("POST", f"{self.base}/blobs/uploads/")
        if status != 202:
            raise FetchError(f"starting an upload to {self.url}: HTTP {status} {body[:200]!r}",
                             url=self.url, digest=digest)
        location = self._abs(rh["location"])
        offset = 0
        while len(data) - offset > CHUNK:  # chunked upload for large blobs
            part = data[offset:offset + CHUNK]
            status, rh, body = self._request(
                "PATCH", location, body=part,
                headers={"Content-Type": "application/octet-stream",
                         "Content-Range": f"{offset}-{offset + len(part) - 1}"})
            if status != 202:
                raise FetchError(f"upload chunk to {self.url}: HTTP {status}", url=self.url, digest=digest)
            location = self._abs(rh["location"])
            offset += len(part)
        sep = "&" if "?" in location else "?"
        status, _, body = self._request("PUT", f"{location}{sep}digest={digest}",
                                        body=data[offset:],
                                        headers={"Content-Type": "application/octet-stream"})
        if status not in (201, 204):
            raise FetchError(f"finishing upload of {digest} to {self.url}: HTTP {status} "
                             f"{body[:200]!r}", url=self.url, digest=digest)
        return True

    def _abs(self, location: str) -> str:
        if location.startswith("http"):
            return location
        return f"{self.scheme}://{self.host}{location}"

    def list(self) -> Iterator[Digest]:
        raise StoreError(f"{self.url}: the registry API cannot list blobs (list refs instead)",
                         url=self.url)

    # -- refs ---------------------------------------------------------------------------------
    def get_ref(self, name: str) -> Digest | None:
        status, _, body = self._request("GET", f"{self.base}/manifests/{ref_to_tag(name)}",
                                        headers={"Accept": MANIFEST})
        if status == 404:
            return None
        if status != 200:
            raise FetchError(f"ref {name} at {self.url}: HTTP {status}", url=self.url)
        layers = json.loads(body).get("layers") or []
        return parse(layers[0]["digest"]) if layers else None

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        tag = ref_to_tag(name)
        if exclusive and self.get_ref(name) is not None:
            return False
        size = self.stat(digest)
        config = sha256_digest(EMPTY_CONFIG)
        self.write(config, EMPTY_CONFIG) if not self.exists(config) else None
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "artifactType": "application/vnd.bootseer.ref.v1",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config,
                       "size": len(EMPTY_CONFIG)},
            "layers": [{"mediaType": "application/octet-stream", "digest": digest, "size": size}],
            "annotations": {"dev.bootseer.ref": name}}).encode()
        status, _, body = self._request("PUT", f"{self.base}/manifests/{tag}", body=manifest,
                                        headers={"Content-Type": MANIFEST})
        if status not in (201, 200):
            raise FetchError(f"setting ref {name} at {self.url}: HTTP {status} {body[:200]!r}",
                             url=self.url)
        return True

    def delete_ref(self, name: str) -> None:
        status, rh, _ = self._request("HEAD", f"{self.base}/manifests/{ref_to_tag(name)}",
                                      headers={"Accept": MANIFEST})
        if status == 404:
            return
        digest = rh.get("docker-content-digest")
        if digest:
            self._request("DELETE", f"{self.base}/manifests/{digest}")

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        status, _, body = self._request("GET", f"{self.base}/tags/list")
        if status == 404:
            return iter(())
        tags = json.loads(body).get("tags") or []
        return iter(sorted(n for n in (t.replace("--", "/") for t in tags) if n.startswith(prefix)))

    def close(self) -> None:
        pass
