"""The installer's version-2 result loaded by a real containerd 1.6 (Debian's own default
config, moved under a scratch directory): containerd starts with the proxy plugin and the
CRI, and with the bootseer socket absent a CRI pull unpacks with the node's default
snapshotter, overlayfs: system pods (no RuntimeClass) still start while bootseer is down.
What 1.6 cannot show: the per-runtime snapshotter (a 1.7 field) is dropped, so pods of
RuntimeClass bootseer would get overlayfs there too (the installer says so)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from bootseer.snapshotter import install
from bootseer.testing.containerd import push_pause, unmount_below, wait_socket
from tests.conftest import is_root, need

pytestmark = [pytest.mark.root, pytest.mark.servers]


def _users_config(base: Path, registry_host: str) -> Path:
    """Debian's default config with its paths under ``base`` and the test registry over
    plain http: the file an administrator would have before installing."""
    default = subprocess.run(["containerd", "config", "default"], capture_output=True,
                             text=True, check=True).stdout
    text = (default.replace("/var/lib/containerd", f"{base}/root")
            .replace("/run/containerd", f"{base}/state")
            .replace("/opt/containerd", f"{base}/opt"))
    text += (f'\n[plugins."io.containerd.grpc.v1.cri".registry.mirrors."{registry_host}"]\n'
             f'  endpoint = ["http://{registry_host}"]\n')
    path = base / "config.toml"
    path.write_text(text)
    return path


def test_containerd_1_6_starts_with_the_v2_result_and_pulls_with_overlayfs_while_bootseer_is_down(
        registry, tmp_path):
    need(is_root(), "containerd needs root")
    need(shutil.which("containerd") is not None and shutil.which("ctr") is not None,
         "containerd is not installed (apt-get install containerd)")
    from tests.support.cri.pods import CriClient
    host = f"127.0.0.1:{registry.port}"
    image = push_pause(None, host, tmp_path)
    base = Path(f"/tmp/bsi-{tmp_path.name[-8:]}")   # unix socket paths must stay short
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    sock = f"{base}/absent/snapshotter.sock"        # nothing serves it in this test
    config = _users_config(base, host)
    original = config.read_bytes()
    assert install.apply(install.plan(config, socket=sock))
    dumped = subprocess.run(["containerd", "--config", str(config), "config", "dump"],
                            capture_output=True, text=True, check=True).stdout
    runtimes = tomllib.loads(dumped)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert runtimes["runtimes"]["bootseer"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["snapshotter"] == "overlayfs"
    addr = f"{base}/state/containerd.sock"
    log = base / "containerd.log"
    proc = subprocess.Popen(["containerd", "--config", str(config)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_socket(addr, proc, log)
        ctr = ["ctr", "--address", addr]
        plugins = subprocess.run([*ctr, "plugins", "ls"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()
        assert any(p.split()[:2] == ["io.containerd.snapshotter.v1", "bootseer"]
                   for p in plugins), plugins
        assert any(p.split()[:2] == ["io.containerd.grpc.v1", "cri"] and p.split()[-1] == "ok"
                   for p in plugins), plugins
        c = CriClient(addr)
        try:
            c.pull(image)
        finally:
            c.close()
        snaps = subprocess.run([*ctr, "-n", "k8s.io", "snapshots", "--snapshotter",
                                "overlayfs", "ls"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        assert len(snaps) > 1, snaps                  # the image's layer, unpacked
        assert not Path(sock).exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        unmount_below(base)
        assert install.uninstall(config) and config.read_bytes() == original
        shutil.rmtree(base, ignore_errors=True)
