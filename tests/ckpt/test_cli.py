"""``bootseer ckpt mount`` as users run it: foreground, SIGTERM unmounts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("mode", ["striped", "single"])
def test_cli_mount_reads_and_unmounts_on_sigterm(need_fuse, nginx, www, tmp_path, mode):
    data = os.urandom(3 * 1024 * 1024 + 7)
    (www / "model.bin").write_bytes(data)
    mp = tmp_path / "mnt"
    mp.mkdir()
    env = {**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache/blobs")}
    p = subprocess.Popen([sys.executable, "-m", "bootseer", "ckpt", "mount", nginx.url + "/",
                          str(mp), "--mode", mode, "--no-prefetch"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not os.path.ismount(mp):
            assert p.poll() is None, p.stdout.read().decode()
            assert time.time() < deadline, "mount did not appear"
            time.sleep(0.05)
        assert (mp / "model.bin").read_bytes() == data
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
        assert not os.path.ismount(mp)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if os.path.ismount(mp):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])


def test_cli_mount_of_missing_directory_is_a_clear_error(nginx, tmp_path):
    r = subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "mount", nginx.url + "/nope/",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "nope" in (r.stderr + r.stdout)
    assert not os.path.ismount(tmp_path)


@pytest.mark.parametrize("argv, says", [
    (["mount", "{local}", "{mnt}", "--mirror", "{url}/"], "mirrors are supported for http(s)"),
    (["mount", "{url}/", "{mnt}", "--mirror", "{local}"], "is not an http(s) URL"),
    (["prefetch", "{url}/", "--rank", "3", "--world", "2"], "--rank 3 is not in"),
])
def test_cli_arguments_that_cannot_work_are_one_error_line(nginx, www, tmp_path, argv, says):
    (www / "model.bin").write_bytes(b"x" * 1000)
    local = tmp_path / "local"
    local.mkdir()
    fill = {"local": str(local), "mnt": str(tmp_path), "url": nginx.url}
    r = subprocess.run([sys.executable, "-m", "bootseer", "ckpt",
                        *(a.format(**fill) for a in argv)],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache/blobs")})
    assert r.returncode != 0 and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not os.path.ismount(tmp_path)
