"""Setting up and testing bootseer leaves the host's own services alone (issue 18, item 18):
nothing is killed by name, and the packages' services are not started at install time by
a policy-rc.d that is ours only while our apt-get runs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
APT_INSTALL = REPO / "scripts/apt-install-no-start.sh"
KILL_BY_NAME = re.compile(r"\b(pkill|killall)\b")


def _project_files(tops: tuple[str, ...]) -> list[Path]:
    """The project's own files under ``tops``: tracked or not yet added, never what git
    ignores (a benchmark's downloaded assets, a busybox binary among them)."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard", "--", *tops],
                         capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]


def test_nothing_kills_by_name():
    """scripts/, src/, and the tests, benchmarks and deploy examples too."""
    hits = []
    for path in _project_files(("scripts", "src", "tests", "bench", "deploy")):
        if path == Path(__file__):
            continue
        if path.is_file() and path.suffix in ("", ".sh", ".py", ".bash"):
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if KILL_BY_NAME.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, "kill by PID, never by name:\n" + "\n".join(hits)


def test_setup_installs_through_the_no_start_wrapper():
    setup = (REPO / "scripts/setup.sh").read_text()
    assert "scripts/apt-install-no-start.sh" in setup
    assert not re.search(r"^\s*[^#\n]*apt-get install", setup, re.M)


@pytest.fixture
def fake_apt(tmp_path):
    """A fake apt-get (and sudo) first in PATH: ``install`` asks the policy, as a
    postinst's invoke-rc.d does, whether nginx may start, and records the answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answers = tmp_path / "answers"
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
echo "$@" >> {tmp_path}/calls
case "$*" in *install*)
    if [ -x "$POLICY_RC_D" ]; then "$POLICY_RC_D" nginx start; echo $? >> {answers}
    else echo none >> {answers}; fi
    [ -z "$FAIL_INSTALL" ] || exit 100 ;;
esac
""")
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    policy = tmp_path / "policy-rc.d"

    def run(**env) -> subprocess.CompletedProcess:
        return subprocess.run([str(APT_INSTALL), "nginx-light"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin",
                                               "POLICY_RC_D": str(policy), **env})
    run.policy, run.answers = policy, answers
    return run


def test_service_starts_are_denied_only_while_apt_runs(fake_apt):
    r = fake_apt()
    assert r.returncode == 0, r.stderr
    assert fake_apt.answers.read_text().split() == ["101"]   # denied during the install
    assert not fake_apt.policy.exists()                      # and gone after it


def test_the_policy_is_removed_when_apt_get_fails(fake_apt):
    r = fake_apt(FAIL_INSTALL="1")
    assert r.returncode != 0
    assert fake_apt.answers.read_text().split() == ["101"]
    assert not fake_apt.policy.exists()


def test_an_administrators_policy_is_left_alone(fake_apt):
    fake_apt.policy.write_text("#!/bin/sh\n# the admin's\nexit 0\n")
    fake_apt.policy.chmod(0o755)
    r = fake_apt()
    assert r.returncode == 0 and "not ours" in r.stderr
    assert fake_apt.policy.read_text() == "#!/bin/sh\n# the admin's\nexit 0\n"
    assert fake_apt.answers.read_text().split() == ["0"]   # the admin's answer held


def test_a_policy_left_by_a_killed_setup_is_recognised_and_removed(fake_apt):
    mark = next(line.split('"')[1] for line in APT_INSTALL.read_text().splitlines()
                if line.startswith("MARK="))
    fake_apt.policy.write_text(f"#!/bin/sh\n{mark}\nexit 101\n")
    fake_apt.policy.chmod(0o755)
    assert fake_apt().returncode == 0
    assert not fake_apt.policy.exists()


def test_test_servers_use_their_own_ports_and_files(tmp_path):
    """The test servers never need the packaged defaults (port 80 or 5000, /run/nginx.pid)."""
    from bootseer.testing import servers
    if not servers.nginx_available():
        pytest.skip("nginx is not installed")
    (tmp_path / "www").mkdir()
    s = servers.start_nginx(tmp_path / "www", tmp_path / "nginx")
    try:
        assert s.port not in (80, 443, 5000)
        conf = (tmp_path / "nginx/nginx.conf").read_text()
        assert f"pid {tmp_path}/nginx/nginx.pid;" in conf
    finally:
        s.stop()
