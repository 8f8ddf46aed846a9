"""The conventional path that ``bootseer run --baseline`` measures against: real podman
pull from a real registry, real pip against a real nginx-served index."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import zipfile

import pytest

from bootseer.demo.assets import write_simple_index
from bootseer.run import baseline
from bootseer.run import container as C
from tests.conftest import is_root, need

pytestmark = pytest.mark.timeout(240)


def make_wheel(dest, name: str, version: str, body: str, scripts: dict | None = None) -> None:
    """A minimal pure-Python wheel, written by hand (PEP 427); ``scripts`` are console
    entry points (``{"cmd": "module:function"}``)."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": body.encode(),
             f"{dist}/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    if scripts:
        files[f"{dist}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items())).encode()
    record = []
    for path, data in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={h},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(dest / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, data in files.items():
            z.writestr(path, data)


def test_pip_install_from_a_real_index(nginx_factory, tmp_path):
    index = tmp_path / "index"
    (index / "wheels").mkdir(parents=True)
    make_wheel(index / "wheels", "bsdemo_alpha", "1.0", "VALUE = 41\n")
    write_simple_index(index)
    server = nginx_factory(index)
    spec = tmp_path / "requirements.txt"
    spec.write_text("bsdemo-alpha==1.0\n")
    prefix = tmp_path / "env"
    baseline.pip_install(str(spec), str(prefix), index_urls=[f"{server.url}/simple"])
    out = subprocess.run([prefix / "bin/python", "-c",
                          "import bsdemo_alpha; print(bsdemo_alpha.VALUE + 1)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"
    spec.write_text("bsdemo-alpha==9.9\n")
    with pytest.raises(baseline.BaselineError, match="pip install"):
        baseline.pip_install(str(spec), str(tmp_path / "env2"), index_urls=[f"{server.url}/simple"])


def push_busybox(registry, busybox_rootfs, tmp_path, config: tuple[str, ...] = (),
                 tag: str = "1") -> str:
    """Commit the busybox root as a one-layer image and push it to the real registry;
    ``config``: ``buildah config`` options (``--env K=V``, ``--workingdir D``)."""
    need(is_root() and "podman" in C.available_runtimes(), "podman pull needs root and podman")
    need(shutil.which("buildah") is not None, "buildah is not installed")
    ref = f"127.0.0.1:{registry.port}/test/busybox:{tag}"
    state = f"/tmp/bsb-t{tmp_path.name[-6:]}"
    b = ["buildah", "--root", f"{state}/r", "--runroot", f"{state}/rr", "--storage-driver", "vfs"]
    try:
        ctr = subprocess.run([*b, "from", "scratch"], capture_output=True, text=True,
                             check=True).stdout.strip()
        subprocess.run([*b, "copy", ctr, f"{busybox_rootfs}/", "/"], check=True,
                       capture_output=True)
        if config:
            subprocess.run([*b, "config", *config, ctr], check=True, capture_output=True)
        subprocess.run([*b, "commit", "-q", ctr, "bb"], check=True, capture_output=True)
        subprocess.run([*b, "push", "-q", "--tls-verify=false", "bb", f"docker://{ref}"],
                       check=True, capture_output=True)
    finally:
        subprocess.run(["umount", "-R", "-l", f"{state}/r"], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
    return ref


def test_podman_pull_and_run(registry, busybox_rootfs, tmp_path):
    ref = push_busybox(registry, busybox_rootfs, tmp_path)
    image = baseline.PulledImage(ref, f"/tmp/bsp-t{tmp_path.name[-6:]}")
    try:
        root = image.pull()
        argv = ["sh", "-c", "test -x /bin/busybox && exit 5"]
        assert C.run(C.Container(rootfs=root, argv=argv)) == 5
    finally:
        image.close()
    assert not shutil.os.path.exists(image.state_dir)
    missing = baseline.PulledImage(f"127.0.0.1:{registry.port}/test/nothing:1",
                                   f"/tmp/bsp-m{tmp_path.name[-6:]}")
    try:
        with pytest.raises(baseline.BaselineError, match="podman pull"):
            missing.pull()
    finally:
        missing.close()
    # a failed pull leaves podman's storage bind-mounted on itself: unmounted, removed
    assert not shutil.os.path.exists(missing.state_dir)
    assert missing.state_dir not in open("/proc/mounts").read()
