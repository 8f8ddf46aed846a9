"""Store in an OCI distribution registry: ``oci://host:port/repo/path``.

* Transport: http for loopback hosts (127.x, ::1, localhost), https otherwise unless
  ``insecure`` (``BOOTSEER_STORE_INSECURE=1``).
* Blobs are registry blobs: HEAD (stat/exists), range GET following redirects (200 with
  the whole body or 206 are both accepted, as the spec allows), monolithic upload (POST +
  PUT ``?digest=``) and, for streams larger than one chunk (64 MiB), chunked upload (POST,
  PATCH with ``Content-Range``, PUT). Bytes are hashed while uploading; a mismatch cancels
  the upload session before the final PUT, so a wrong blob is never stored.
* Manifests and tags: :meth:`put_manifest`, :meth:`get_manifest`, :meth:`list_tags`.
* Refs are tags on a tiny OCI artifact manifest (``artifactType
  application/vnd.bootseer.ref.v1``) whose single layer is the target blob, so the target
  survives the registry's garbage collection. Tag = ``ref.`` + the name with ``/`` as
  ``--``; names that do not fit a tag (``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``) become
  ``refh.`` + a hash, and the real name is kept in the manifest's annotations.
* Limitations of the distribution API: it cannot list blobs, so :meth:`list` yields the
  blobs referenced by tagged manifests of the repository only (untagged blobs are
  invisible); and it has no atomic create, so ``set_ref(exclusive=True)`` is the claim by
  read-back of store/claim.py.
* Auth: store/registry_auth.py (anonymous, basic, the host's standard login, bearer
  tokens). Secrets never appear in ``url``, ``repr``, errors or logs.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from typing import BinaryIO

from bootseer.errors import BlobNotFound, DigestMismatch, FetchError, StoreError
from bootseer.store import http
from bootseer.store.backend import head_size
from bootseer.store.backends import check_ref_name
from bootseer.store.claim import claim_by_read_back
from bootseer.store.digest import Digest, parse, sha256_digest
from bootseer.store.registry_auth import RegistryAuth
from bootseer.store.retry import retry

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_ARTIFACT = "application/vnd.bootseer.ref.v1"
EMPTY_MEDIA = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
ACCEPT = ", ".join([MANIFEST, INDEX, "application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json"])
CHUNK = 64 * 1024**2
"""Streams larger than this (bytes) are uploaded in PATCH chunks of this size."""
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_ANNOTATION = "dev.bootseer.ref"


def ref_to_tag(name: str) -> str:
    """The tag holding ref ``name`` (reversible unless it starts with ``refh.``)."""
    check_ref_name(name)
    tag = "ref." + name.replace("/", "--")
    if "--" not in name and _TAG.fullmatch(tag):
        return tag
    return "refh." + hashlib.sha256(name.encode()).hexdigest()[:48]


def _tag_to_ref(tag: str) -> str | None:
    return tag[4:].replace("--", "/") if tag.startswith("ref.") else None


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class OciBackend:
    writable = True

    def __init__(self, url: str, *, username: str | None = None, password: str | None = None,
                 insecure: bool = False, timeout: float = 30.0, chunk_bytes: int = CHUNK):
        """``url``: ``oci://host:port/repo/path``; ``timeout``: socket timeout of one
        request, seconds; ``chunk_bytes``: PATCH size of chunked uploads."""
        u = urllib.parse.urlsplit(url)
        repo = u.path.strip("/")
        if u.scheme != "oci" or not u.hostname or not re.fullmatch(
                r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*", repo):
            shown = http.safe_url(url.replace("oci:", "http:", 1)).replace("http:", "oci:", 1)
            raise StoreError(f"bad registry store URL {shown!r}: expected "
                             f"oci://host:port/repo/path with a lower-case repository name")
        self.host = f"{u.hostname}:{u.port}" if u.port else u.hostname
        self.repo = repo
        self.scheme = "http" if (_is_loopback(u.hostname) or insecure) else "https"
        self.url = f"oci://{self.host}/{self.repo}"
        self.base = f"{self.scheme}://{self.host}/v2/{self.repo}"
        username = username if username is None else str(username)
        if u.username:  # oci://user:pw@host/repo
            username = urllib.parse.unquote(u.username)
            password = urllib.parse.unquote(u.password or "")
        self.auth = RegistryAuth(self.host, repo, self.url, username=username,
                                 password=password, timeout=timeout)
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes

    def __repr__(self) -> str:
        return f"OciBackend({self.url!r}, user={self.auth.username!r})"

    def _request(self, method: str, url: str, headers: dict[str, str] | None = None,
                 body: bytes | None = None, *, what: str = "", digest: str | None = None
                 ) -> tuple[int, dict[str, str], bytes]:
        def send(auth: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
            try:
                return http.request(method, url, headers={**auth, **(headers or {})},
                                    body=body, timeout=self.timeout)
            except FetchError as e:
                raise FetchError(f"{what or method} at {self.url} failed: {e}", url=e.url,
                                 digest=digest) from e
        # A registry may answer 5xx for a moment while another client's upload of the same
        # blob commits (its link file is rewritten in place): a read or stat is asked again.
        attempts = 4 if method in ("GET", "HEAD") else 1
        for attempt in range(1, attempts + 1):
            status, rh, data = self.auth.send(send, lambda r: (r[0], r[1]))
            if status not in (500, 502, 503, 504) or attempt == attempts:
                break
            time.sleep(0.1 * attempt)
        if status in (401, 403):
            raise self.auth.denied(status)
        return status, rh, data

    # -- blobs --------------------------------------------------------------------------------
    def _blob_url(self, digest: Digest) -> str:
        return f"{self.base}/blobs/{parse(digest)}"

    def stat(self, digest: Digest) -> int:
        status, rh, _ = self._request("HEAD", self._blob_url(digest), what=f"stat of {digest}",
                                      digest=digest)
        return head_size(status, rh, digest, self.url)

    def exists(self, digest: Digest) -> bool:
        try:
            self.stat(digest)
            return True
        except BlobNotFound:
            return False

    def _open_range(self, digest: Digest, start: int, end: int | None
                    ) -> tuple[http.Response, int]:
        url = self._blob_url(digest)
        r, skip = self.auth.send(
            lambda auth: http.open_range(url, start, end, timeout=self.timeout, headers=auth),
            lambda opened: (opened[0].status, opened[0].headers),
            lambda opened: opened[0].close())
        if r.status not in (200, 206):
            r.close()
            if r.status in (401, 403):
                raise self.auth.denied(r.status)
            if r.status == 404:
                raise BlobNotFound(f"blob {digest} not found in {self.url}", digest=digest,
                                   url=self.url)
            http.raise_for_status(r.status, url, start, end, digest)
        return r, skip

    def read(self, digest: Digest, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            return b""
        try:
            r, skip = self._open_range(digest, start, end)
            return http.read_body(r, skip, start, end, digest=digest)
        except FetchError as e:
            if e.digest:
                raise
            raise FetchError(f"reading blob {digest} [{start}, {end}) from {self.url}: {e}",
                             digest=digest, url=e.url or self.url, offset=start) from e

    def read_into(self, digest: Digest, start: int, buf: memoryview | bytearray) -> int:
        """Fill ``buf`` (a writable buffer) with the blob's bytes from ``start``."""
        view = memoryview(buf).cast("B")
        if not len(view):
            return 0
        try:
            r, skip = self._open_range(digest, start, start + len(view))
            with r:
                if skip:
                    r.skip(skip)
                n: int = r.readinto(view)
                return n
        except FetchError as e:
            if e.digest:
                raise
            raise FetchError(f"reading blob {digest} at {start} from {self.url}: {e}",
                             digest=digest, url=e.url or self.url, offset=start) from e

    def write(self, digest: Digest, data: bytes | BinaryIO, size: int | None = None) -> bool:
        """Upload ``data`` (bytes or a binary stream, read ``chunk_bytes`` at a time)."""
        parse(digest)
        if isinstance(data, (bytes, bytearray, memoryview)):
            actual = sha256_digest(data)
            if actual != digest:  # refuse before sending anything
                raise DigestMismatch(f"refusing to upload {digest} to {self.url}: the bytes "
                                     f"hash to {actual}", digest=digest, url=self.url)
            data = io.BytesIO(data)
        if self.exists(digest):
            return False
        status, rh, body = self._request("POST", f"{self.base}/blobs/uploads/",
                                         what=f"starting the upload of {digest}", digest=digest)
        if status != 202 or "location" not in rh:
            raise FetchError(f"starting an upload to {self.url}: HTTP {status} {body[:200]!r}",
                             url=self.url, digest=digest)
        location = self._abs(rh["location"])
        h = hashlib.sha256()
        offset = 0
        try:
            chunk = data.read(self.chunk_bytes)
            while True:
                nxt = data.read(self.chunk_bytes) if len(chunk) == self.chunk_bytes else b""
                h.update(chunk)
                if not nxt:
                    break
                # more follows: PATCH this chunk (chunked upload)
                status, rh, body = self._request(
                    "PATCH", location, body=chunk, what=f"uploading {digest}", digest=digest,
                    headers={"Content-Type": "application/octet-stream",
                             "Content-Range": f"{offset}-{offset + len(chunk) - 1}"})
                if status != 202 or "location" not in rh:
                    raise FetchError(f"uploading a chunk of {digest} to {self.url} at {offset}:"
                                     f" HTTP {status} {body[:200]!r}", url=self.url,
                                     digest=digest, offset=offset)
                location = self._abs(rh["location"])
                offset += len(chunk)
                chunk = nxt
            total = offset + len(chunk)
            actual = "sha256:" + h.hexdigest()
            if actual != digest or (size is not None and total != size):
                raise DigestMismatch(f"refusing to store {digest} in {self.url}: the "
                                     f"{total} bytes hash to {actual}", digest=digest,
                                     url=self.url)
            sep = "&" if "?" in location else "?"
            hdrs = {"Content-Type": "application/octet-stream"}
            status, _, body = self._request("PUT", f"{location}{sep}digest={digest}",
                                            body=chunk, headers=hdrs,
                                            what=f"finishing the upload of {digest}",
                                            digest=digest)
            if status not in (201, 204):
                raise FetchError(f"finishing the upload of {digest} to {self.url}: HTTP "
                                 f"{status} {body[:200]!r}", url=self.url, digest=digest)
        except BaseException:
            self._cancel(location)
            raise
        return True

    def _cancel(self, location: str) -> None:
        try:
            self._request("DELETE", location)
        except StoreError:
            pass  # the registry purges abandoned uploads itself

    def _abs(self, location: str) -> str:
        return urllib.parse.urljoin(f"{self.scheme}://{self.host}/", location)

    def list(self) -> Iterator[Digest]:
        """Blobs referenced by the repository's tagged manifests (config and layers, and
        those of index children). The distribution API cannot list untagged blobs."""
        seen: set[str] = set()
        for tag in self.list_tags():
            try:
                body, _, _ = self.get_manifest(tag)
            except BlobNotFound:
                continue
            yield from self._manifest_blobs(body, seen)

    def _manifest_blobs(self, body: bytes, seen: set[str]) -> Iterator[Digest]:
        doc = json.loads(body)
        for m in doc.get("manifests") or []:
            try:
                child, _, _ = self.get_manifest(m["digest"])
            except BlobNotFound:
                continue
            yield from self._manifest_blobs(child, seen)
        for desc in [doc.get("config") or {}] + list(doc.get("layers") or []):
            d = desc.get("digest")
            if d and d not in seen:
                seen.add(d)
                yield d

    # -- manifests and tags -------------------------------------------------------------------
    def put_manifest(self, ref: str, body: bytes, media_type: str = MANIFEST) -> Digest:
        """Push manifest ``body`` under tag or digest ``ref``; returns its digest."""
        digest = sha256_digest(body)
        status, rh, resp = self._request("PUT", f"{self.base}/manifests/{ref}", body=body,
                                         headers={"Content-Type": media_type},
                                         what=f"pushing manifest {ref}")
        if status not in (200, 201):
            raise FetchError(f"pushing manifest {ref} to {self.url}: HTTP {status} "
                             f"{resp[:300]!r}", url=self.url, digest=digest)
        return str(rh.get("docker-content-digest", digest))

    def get_manifest(self, ref: str) -> tuple[bytes, str, Digest]:
        """(bytes, media type, digest) of the manifest tagged (or with digest) ``ref``;
        BlobNotFound if absent. The bytes are verified against the digest when known."""
        status, rh, body = self._request("GET", f"{self.base}/manifests/{ref}",
                                         headers={"Accept": ACCEPT},
                                         what=f"reading manifest {ref}")
        if status == 404:
            raise BlobNotFound(f"manifest {ref} not found in {self.url}", url=self.url,
                               digest=ref if ref.startswith("sha256:") else None)
        if status != 200:
            raise FetchError(f"reading manifest {ref} from {self.url}: HTTP {status}",
                             url=self.url)
        digest = sha256_digest(body)
        expected = ref if ref.startswith("sha256:") else rh.get("docker-content-digest", digest)
        if expected != digest:
            raise DigestMismatch(f"manifest {ref} from {self.url} hashes to {digest}, not "
                                 f"{expected}", digest=expected, url=self.url)
        media = rh.get("content-type", "").split(";")[0] or json.loads(body).get("mediaType", "")
        return body, media, digest

    def list_tags(self) -> builtins.list[str]:
        tags: builtins.list[str] = []
        url = f"{self.base}/tags/list?n=1000"
        while url:
            status, rh, body = self._request("GET", url, what="listing tags")
            if status == 404:
                return tags
            if status != 200:
                raise FetchError(f"listing tags of {self.url}: HTTP {status}", url=self.url)
            tags += json.loads(body).get("tags") or []
            m = re.search(r"<([^>]+)>;\s*rel=\"?next", rh.get("link", ""))
            url = self._abs(m.group(1)) if m else ""
        return tags

    def delete_manifest(self, ref: str) -> None:
        status, rh, _ = self._request("HEAD", f"{self.base}/manifests/{ref}",
                                      headers={"Accept": ACCEPT})
        if status == 404:
            return
        digest = rh.get("docker-content-digest")
        if digest:
            status, _, body = self._request("DELETE", f"{self.base}/manifests/{digest}")
            if status not in (202, 200, 404):
                raise FetchError(f"deleting manifest {ref} in {self.url}: HTTP {status} "
                                 f"{body[:200]!r} (is storage.delete enabled?)", url=self.url)

    # -- refs ---------------------------------------------------------------------------------
    def get_ref(self, name: str) -> Digest | None:
        try:
            body, _, _ = self.get_manifest(ref_to_tag(name))
        except BlobNotFound:
            return None
        layers = json.loads(body).get("layers") or []
        return parse(layers[0]["digest"]) if layers else None

    def set_ref(self, name: str, digest: Digest, *, exclusive: bool = False) -> bool:
        """Point ``name`` at ``digest`` (which must be in the registry). ``exclusive``:
        the registry has no atomic create, so it is a claim by read-back (store/claim.py)."""
        parse(digest)
        if exclusive:
            return claim_by_read_back(self.get_ref, self._put_ref, name, digest)
        self._put_ref(name, digest)
        return True

    def _put_ref(self, name: str, digest: Digest) -> None:
        tag = ref_to_tag(name)
        size = self.stat(digest)
        config = sha256_digest(EMPTY_CONFIG)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST, "artifactType": REF_ARTIFACT,
            "config": {"mediaType": EMPTY_MEDIA, "digest": config, "size": len(EMPTY_CONFIG)},
            "layers": [{"mediaType": "application/octet-stream", "digest": digest,
                        "size": size}],
            "annotations": {_ANNOTATION: name}}, sort_keys=True).encode()
        def put() -> None:
            if not self.exists(config):
                self.write(config, EMPTY_CONFIG)
            self.put_manifest(tag, manifest, MANIFEST)
        # Nodes setting refs at once all upload the same empty config blob; while one
        # upload commits, the registry may call the blob unknown to another's manifest.
        retry(put, attempts=5, pause_s=0.1,
              transient=lambda e: isinstance(e, FetchError) and "BLOB_UNKNOWN" in str(e))

    def delete_ref(self, name: str) -> None:
        self.delete_manifest(ref_to_tag(name))

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        names = []
        for tag in self.list_tags():
            name = _tag_to_ref(tag)
            if name is None and tag.startswith("refh."):
                try:
                    body, _, _ = self.get_manifest(tag)
                    name = (json.loads(body).get("annotations") or {}).get(_ANNOTATION)
                except BlobNotFound:
                    name = None
            if name is not None and name.startswith(prefix):
                names.append(name)
        return iter(sorted(names))

    def close(self) -> None:
        pass
