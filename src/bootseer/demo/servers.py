"""The demo's servers, on the storage host (its own network namespace, whose link to the
nodes is shaped): the Debian docker-registry (the image, and the bootseer store the nodes
share) and nginx (the package index and the checkpoint, capped per connection like one
storage node's stream). They listen on the storage host's address on the bridge."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bootseer.demo.assets import Assets
from bootseer.testing import servers
from bootseer.testing.netns import Host


class DemoServers:
    def __init__(self, scratch: Path, assets: Assets, storage: Host, limit_rate: str, say,
                 ranks: int):
        self.scratch, self.assets, self.storage = scratch, assets, storage
        self.limit_rate, self.say, self.ranks = limit_rate, say, ranks
        self.netns = storage.netns
        self.started: list[servers.Server] = []

    def _ns(self) -> list[str]:
        return self.storage.enter()

    def __enter__(self) -> DemoServers:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        reg = servers.start_registry(self.scratch / "registry", self.scratch / "registry-run",
                                     netns=self.netns, host=self.storage.addr)
        self.started.append(reg)
        registry = f"{self.storage.addr}:{reg.port}"
        self.image_ref = f"{registry}/demo/train:latest"
        # Plain http to a registry off loopback: what a user configures for such a registry
        # (podman and skopeo read registries.conf; bootseer's store has its own switch).
        conf = self.scratch / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
        self.client_env = {"CONTAINERS_REGISTRIES_CONF": str(conf),
                           "BOOTSEER_STORE_INSECURE": "1",
                           # and the package index over plain http, for pip and uv
                           "PIP_TRUSTED_HOST": self.storage.addr,
                           "UV_INSECURE_HOST": self.storage.addr}
        self.say("push the image to the registry")
        subprocess.run([*self._ns(), "skopeo", "copy", "-q", "--dest-tls-verify=false",
                        f"oci-archive:{self.assets.image_archive}:demo/train:latest",
                        f"docker://{self.image_ref}"], check=True)
        www = self.scratch / "www"
        www.mkdir()
        os.symlink(self.assets.index, www / "pypi")
        os.symlink(self.assets.checkpoint(self.ranks), www / "ckpt")
        web = servers.start_nginx(www, self.scratch / "nginx-run", netns=self.netns,
                                  limit_rate=self.limit_rate, host=self.storage.addr)
        self.started.append(web)
        self.index_url = f"{web.url}/pypi/simple"
        self.ckpt_url = f"{web.url}/ckpt/"
        # The nodes' store: the registry, over the same shaped link (reads by range,
        # writes of profiles and environment snapshots, refs as tags).
        self.store_url = f"oci://{self.storage.addr}:{reg.port}/bootseer"
        self.say("convert the image into the store (bootseer image convert)")
        subprocess.run([*self._ns(), sys.executable, "-m", "bootseer.demo.servers",
                        str(self.assets.image_archive), self.image_ref, self.store_url],
                       check=True, env={**os.environ, **self.client_env})

    def __exit__(self, *exc) -> None:
        for s in reversed(self.started):
            s.stop()
        self.started.clear()


def convert_as(archive: str, image_ref: str, store_url: str) -> None:
    """``bootseer image convert`` of the image's archive, published under the reference the
    nodes run (skopeo 1.9 ignores CONTAINERS_REGISTRIES_CONF, so it cannot read a plain-http
    registry off loopback; podman, which the conventional start uses, does)."""
    from bootseer.config import BootseerConfig
    from bootseer.image.convert import convert, ref_name
    from bootseer.store import open_store
    store = open_store(store_url, BootseerConfig.from_env(overrides={"store": {"url": store_url}}))
    store.set_ref(ref_name(image_ref), convert(archive, store))


if __name__ == "__main__":
    convert_as(*sys.argv[1:4])
