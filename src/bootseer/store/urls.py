"""Pick a backend from a store URL.

    /path/to/dir, file:///path       local directory (the embedded default)
    http(s)://host/path              read-only, the same layout served by a web server
    oci://host:port/repo             OCI distribution registry (http on loopback)
    s3://, hdfs://, webhdfs://, memory://, ...   any fsspec filesystem
"""

from __future__ import annotations

from bootseer.config import BootseerConfig
from bootseer.errors import ConfigError


def open_backend(url: str | None = None, config: BootseerConfig | None = None):
    config = config or BootseerConfig.from_env()
    url = url or config.store.url
    if not url:
        raise ConfigError("store.url", "no store configured")
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" not in url:
        from bootseer.store.backends.local import LocalBackend
        return LocalBackend(url)
    scheme = url.split("://", 1)[0]
    if scheme in ("http", "https"):
        from bootseer.store.backends.http import HttpBackend
        return HttpBackend(url, timeout=config.fetch.timeout_s)
    if scheme == "oci":
        from bootseer.store.backends.oci import OciBackend
        return OciBackend(url, username=config.store.username, password=config.store.password,
                          insecure=config.store.insecure, timeout=config.fetch.timeout_s)
    from bootseer.store.backends.fsspec_store import FsspecBackend
    return FsspecBackend(url)
