"""Pick a backend from a store URL.

    /path/to/dir, file:///path       local directory (the embedded default)
    http(s)://host/path              read-only, the local layout served by a web server
    oci://host:port/repo/path        OCI distribution registry (http on loopback)
    s3://, gs://, hdfs://, webhdfs://, memory://, ...   any fsspec filesystem
    fsspec+file:///path              the local layout through fsspec (forced)
"""

from __future__ import annotations

from bootseer.config import BootseerConfig
from bootseer.errors import ConfigError
from bootseer.store.backend import Backend

_HINTS = {"s3": "pip install 'bootseer[s3]' (s3fs)", "s3a": "pip install 'bootseer[s3]' (s3fs)",
          "gs": "pip install 'bootseer[gcs]' (gcsfs)", "gcs": "pip install 'bootseer[gcs]' (gcsfs)",
          "hdfs": "pip install 'bootseer[hdfs]' (and a Hadoop client)",
          "abfs": "pip install adlfs", "az": "pip install adlfs"}


def open_backend(url: str | None = None, config: BootseerConfig | None = None) -> Backend:
    """The backend for ``url`` (default: ``config.store.url``, from BOOTSEER_STORE_URL)."""
    config = config or BootseerConfig.from_env()
    url = url or config.store.url
    if not url:
        raise ConfigError("store.url", "no store configured: set BOOTSEER_STORE_URL or --store")
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" not in url:
        from bootseer.store.backends.local import LocalBackend
        return LocalBackend(url)
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        from bootseer.store.backends.http import HttpBackend
        return HttpBackend(url, timeout=config.fetch.timeout_s)
    if scheme == "oci":
        from bootseer.store.backends.oci import OciBackend
        return OciBackend(url, username=config.store.username, password=config.store.password,
                          insecure=config.store.insecure, timeout=config.fetch.timeout_s)
    if scheme.startswith("fsspec+"):
        url = url[len("fsspec+"):]
        scheme = scheme[len("fsspec+"):]
    import fsspec
    from fsspec.registry import known_implementations, registry
    if scheme not in known_implementations and scheme not in registry:
        known = ["file (a path)", "http", "https", "oci",
                 *sorted(s for s in known_implementations if s not in ("file", "http", "https"))]
        raise ConfigError("store.url", f"unknown scheme {scheme!r} in {url}: known schemes are "
                                       f"{', '.join(known)}")
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:
        hint = _HINTS.get(scheme) or known_implementations.get(scheme, {}).get("err", "")
        raise ConfigError("store.url", f"the {scheme}:// store {url} needs a driver that is not "
                                       f"installed: {hint or e}") from e
    from bootseer.store.backends.fsspec_store import FsspecBackend
    return FsspecBackend(url)
