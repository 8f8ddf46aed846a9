"""Announce a converted image next to its source: an OCI artifact manifest, pushed to the
source image's repository, whose ``subject`` is the source manifest and whose one layer is
the tree's TOC (annotated with the store holding the tree). A registry with the referrers
API lists it under the source; for registries without it (the Debian docker-registry,
distribution 2.8) the OCI 1.1 tag schema is maintained too: tag ``sha256-<hex>`` of the
subject names an image index of its referrers.

Publishing is best effort: a source we may not write to costs a log line, never the
conversion."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from bootseer.errors import BlobNotFound, StoreError
from bootseer.store import sha256_digest

if TYPE_CHECKING:
    from bootseer.store.backends.oci import OciBackend

log = logging.getLogger(__name__)

ARTIFACT_TYPE = "application/vnd.bootseer.tree.v1"
TOC_MEDIA = "application/vnd.bootseer.tree.toc.v1+zstd"
STORE_ANNOTATION = "dev.bootseer.store"


def registry_ref(src: str) -> tuple[str, str] | None:
    """(``oci://host/repo`` URL, tag or digest) for a registry source, else None."""
    if src.startswith(("docker-archive:", "oci-archive:", "oci:", "/", ".")):
        return None
    ref = src.removeprefix("docker://")
    host, _, rest = ref.partition("/")
    if not rest or not ("." in host or ":" in host or host == "localhost"):
        return None
    if "@" in rest:
        repo, _, tag = rest.partition("@")
    elif ":" in rest.rsplit("/", 1)[-1]:
        repo, _, tag = rest.rpartition(":")
    else:
        repo, tag = rest, "latest"
    return f"oci://{host}/{repo}", tag


def tag_for(subject: str) -> str:
    return subject.replace(":", "-")


def _registry(url: str, config) -> OciBackend:
    """The registry repository at ``url`` (an ``oci://`` URL, as ``registry_ref`` makes):
    manifests are read and pushed through the OCI backend's own calls."""
    from bootseer.store import open_store
    from bootseer.store.backends.oci import OciBackend
    repo = open_store(url, config)
    if not isinstance(repo, OciBackend):
        raise StoreError(f"{url} is not an OCI registry", url=url)
    return repo


def publish(src: str, tree: str, toc: bytes, store_url: str, config=None) -> str | None:
    """Push the artifact manifest for ``tree`` next to registry image ``src``; return its
    digest, or None when ``src`` is not in a registry or the push is refused."""
    from bootseer.store.backends.oci import EMPTY_CONFIG, EMPTY_MEDIA, INDEX, MANIFEST
    where = registry_ref(src)
    if where is None:
        return None
    url, ref = where
    try:
        repo = _registry(url, config)
        body, media, subject = repo.get_manifest(ref)
        repo.write(tree, toc)
        empty = sha256_digest(EMPTY_CONFIG)
        repo.write(empty, EMPTY_CONFIG)
        artifact = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST, "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": EMPTY_MEDIA, "digest": empty, "size": len(EMPTY_CONFIG)},
            "layers": [{"mediaType": TOC_MEDIA, "digest": tree, "size": len(toc),
                        "annotations": {STORE_ANNOTATION: store_url}}],
            "subject": {"mediaType": media, "digest": subject, "size": len(body)},
            "annotations": {STORE_ANNOTATION: store_url}}, sort_keys=True).encode()
        digest = sha256_digest(artifact)
        repo.put_manifest(digest, artifact, MANIFEST)
        # tag-schema fallback: the subject's referrers index, ours added (or refreshed)
        try:
            old = json.loads(repo.get_manifest(tag_for(subject))[0])
        except BlobNotFound:
            old = {"manifests": []}
        entries = [m for m in old.get("manifests", []) if m.get("digest") != digest]
        entries.append({"mediaType": MANIFEST, "digest": digest, "size": len(artifact),
                        "artifactType": ARTIFACT_TYPE,
                        "annotations": {STORE_ANNOTATION: store_url}})
        index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries},
                           sort_keys=True).encode()
        repo.put_manifest(tag_for(subject), index, INDEX)
        return digest
    except (StoreError, OSError, ValueError) as e:
        log.warning("converted %s, but cannot publish its referrer next to it: %s", src, e)
        return None


def find(src: str, config=None) -> list[dict]:
    """The bootseer trees announced for registry image ``src`` (through the tag schema):
    [{"tree": digest, "store": url, "artifact": digest}]."""
    where = registry_ref(src)
    if where is None:
        return []
    url, ref = where
    repo = _registry(url, config)
    _, _, subject = repo.get_manifest(ref)
    try:
        index = json.loads(repo.get_manifest(tag_for(subject))[0])
    except BlobNotFound:
        return []
    out = []
    for m in index.get("manifests", []):
        if m.get("artifactType") != ARTIFACT_TYPE:
            continue
        manifest = json.loads(repo.get_manifest(m["digest"])[0])
        layer = manifest["layers"][0]
        out.append({"tree": layer["digest"], "artifact": m["digest"],
                    "store": (layer.get("annotations") or {}).get(STORE_ANNOTATION)})
    return out
