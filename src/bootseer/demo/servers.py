"""The demo's servers, inside the shaped network namespace: the Debian docker-registry
(the image, and the bootseer store the nodes share) and nginx (the package index and
the checkpoint, capped per connection like one storage node's stream)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bootseer.demo.assets import Assets
from bootseer.testing import servers


class DemoServers:
    def __init__(self, scratch: Path, assets: Assets, netns: str | None, limit_rate: str, say):
        self.scratch, self.assets, self.netns, self.limit_rate = scratch, assets, netns, limit_rate
        self.say = say
        self.started: list[servers.Server] = []

    def _ns(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []

    def __enter__(self) -> "DemoServers":
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        reg = servers.start_registry(self.scratch / "registry", self.scratch / "registry-run",
                                     netns=self.netns)
        self.started.append(reg)
        self.image_ref = f"127.0.0.1:{reg.port}/demo/train:latest"
        self.say("push the image to the registry")
        subprocess.run([*self._ns(), "skopeo", "copy", "-q", "--dest-tls-verify=false",
                        f"oci-archive:{self.assets.image_archive}:demo/train:latest",
                        f"docker://{self.image_ref}"], check=True)
        www = self.scratch / "www"
        www.mkdir()
        os.symlink(self.assets.index, www / "pypi")
        os.symlink(self.assets.checkpoint, www / "ckpt")
        web = servers.start_nginx(www, self.scratch / "nginx-run", netns=self.netns,
                                  limit_rate=self.limit_rate)
        self.started.append(web)
        self.index_url = f"{web.url}/pypi/simple"
        self.ckpt_url = f"{web.url}/ckpt/"
        # The nodes' store: the registry, over the same shaped link (reads by range,
        # writes of profiles and environment snapshots, refs as tags).
        self.store_url = f"oci://127.0.0.1:{reg.port}/bootseer"
        self.say("convert the image into the store (bootseer image convert)")
        import sys
        subprocess.run([*self._ns(), sys.executable, "-m", "bootseer", "image", "convert",
                        self.image_ref, "--to", self.store_url], check=True,
                       stdout=subprocess.DEVNULL)

    def __exit__(self, *exc) -> None:
        for s in reversed(self.started):
            s.stop()
        self.started.clear()
