"""Wrong input and unusable environments end in one ``bootseer: error:`` line (a hint
under it where there is a next step), exit 2 for usage and 1 for failures, never a
traceback and never a silent success. docs/cli.md documents the table."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.cli.conftest import DIGEST_OF_HI, error_lines

MISSING_DRIVER = ("s3fs", "gcsfs", "pyarrow")


@pytest.fixture
def scratch(world):
    """Inputs the cases name: files, a bad OCI layout, drivers that fail to import."""
    r = world.root
    (r / "a-file").write_text("not a directory\n")
    (r / "requirements.txt").write_text("six\n")
    (r / "bad.json").write_text("{bad")
    (r / "list.json").write_text("[1, 2]")
    layout = r / "layout"
    layout.mkdir()
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text('{"schemaVersion": 2, "manifests": [')
    (r / "mnt").mkdir()
    # a login kept by a credential helper that is not installed (only this host uses it)
    (r / "auth.json").write_text('{"credHelpers": {"127.0.0.1:9": "nope"}}')
    world.env["REGISTRY_AUTH_FILE"] = str(r / "auth.json")
    shadow = r / "shadow"   # importing one of these fails as when it is not installed
    for name in MISSING_DRIVER:
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    world.env["PYTHONPATH"] = os.pathsep.join(
        [str(shadow), *filter(None, [world.env.get("PYTHONPATH")])])
    return world


LONG = "a" * 300
CASES = [
    # id, argv, exit code, in the error line, in the hint line (None: no hint expected)
    ("ckpt-s3-no-s3fs", ["ckpt", "mount", "s3://bucket/ckpt", "mnt"], 1, "s3fs",
     "pip install 'bootseer[s3]'"),
    ("ckpt-gs-no-gcsfs", ["ckpt", "mount", "gs://bucket/ckpt", "mnt"], 1, "gcsfs",
     "pip install 'bootseer[gcs]'"),
    ("ckpt-hdfs-no-pyarrow", ["ckpt", "mount", "hdfs://namenode:8020/ckpt", "mnt"], 1,
     "pyarrow", "pip install 'bootseer[hdfs]'"),
    ("ckpt-prefetch-s3-no-s3fs", ["ckpt", "prefetch", "s3://bucket/ckpt"], 1, "s3fs",
     "bootseer[s3]"),
    ("ckpt-ftp-unknown-host", ["ckpt", "mount", "ftp://no-such-host.invalid/ckpt", "mnt"], 1,
     "cannot use the checkpoint ftp://no-such-host.invalid/ckpt", None),
    ("store-ftp-unknown-host", ["store", "--store", "ftp://no-such-host.invalid/s", "ls"], 1,
     "cannot use the store ftp://no-such-host.invalid/s", None),
    ("store-s3-no-s3fs", ["store", "ls", "--store", "s3://bucket/store"], 2, "s3fs", None),
    ("store-typo-dir", ["store", "--store", "typo", "ls"], 1, "no store at",
     "'bootseer store put' creates"),
    ("store-long-ref", ["store", "ref", "set", LONG, DIGEST_OF_HI], 1, "File name too long",
     "shorter name"),
    ("oci-layout-bad-json", ["image", "convert", "layout", "--store", "store"], 1,
     "not a readable OCI image layout", None),
    ("profile-merge-not-json", ["image", "profile", "merge", "bad.json"], 2, "not JSON",
     None),
    ("profile-merge-not-profile", ["image", "profile", "merge", "list.json"], 2,
     "not a bootseer hot-block profile", None),
    ("profile-merge-missing", ["image", "profile", "merge", "nope.json"], 2,
     "No such file or directory", None),
    ("prefix-is-file", ["run", "--deps", "requirements.txt", "--prefix", "a-file", "--",
                        "true"], 2, "--prefix a-file is a file", None),
    ("prefix-under-file", ["deps", "ensure", "requirements.txt", "--prefix", "a-file/env"], 2,
     "which is a file", None),
    ("prefetch-bad-digest", ["image", "prefetch", "sha256:abc"], 2, "not a sha256 digest",
     None),
    ("trace-mark-nowhere", ["trace", "mark", "ready"], 2, "no trace location",
     "--trace DIR|URL or set BOOTSEER_TRACE_LOCATION"),
    ("run-deps-no-prefix", ["run", "--deps", "requirements.txt", "--", "true"], 2,
     "--deps needs --prefix", "--prefix /opt/envs/NAME"),
    ("run-trace-unwritable", ["run", "--trace", "http://127.0.0.1:9/t", "--", "true"], 1,
     "cannot record traces to", None),
    ("image-run-never-converted", ["image", "run", "never/converted:v1", "--fallback", "never",
                                   "--", "true"], 1, "not falling back (--fallback never)",
     None),
    ("ckpt-rank-without-world", ["ckpt", "prefetch", "s3://bucket/ckpt", "--rank", "1"], 2,
     "give --rank and --world together", None),
    ("convert-credential-helper-missing", ["image", "convert", "127.0.0.1:9/team/app:1"], 1,
     "docker-credential-nope is not on PATH", None),
    ("analyze-two-outputs-on-stdout", ["analyze", "sim", "--json", "-", "--html", "-"], 2,
     "only one of --json, --html can be -", None),
    ("store-get-output-dir", ["store", "get", DIGEST_OF_HI, "-o", "mnt"], 1, "mnt", None),
]


@pytest.mark.parametrize("argv, code, says, hint", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line(scratch, argv, code, says, hint):
    r = scratch.run(*argv)
    assert "Traceback" not in r.stderr, r.stderr
    lines = error_lines(r)
    assert len(lines) == 1, r.stderr
    assert says in lines[0]
    assert r.returncode == code, r.stderr
    hints = [line for line in r.stderr.splitlines() if line.startswith("bootseer: hint:")]
    if hint is not None:
        assert len(hints) == 1 and hint in hints[0], r.stderr


def test_a_mistyped_store_directory_is_not_created(world):
    r = world.run("store", "--store", "typo", "ls")
    assert r.returncode == 1
    assert not (world.root / "typo").exists()
    r = world.run("store", "ls", "--store", "fresh")   # only put creates a store
    assert r.returncode == 1 and not (world.root / "fresh").exists()
    assert world.run("store", "put", "hi", "--store", "fresh").returncode == 0
    assert (world.root / "fresh").is_dir()


def test_unknown_bootseer_variable_is_warned_with_the_closest_name(world):
    r = world.run("store", "ls", env={"BOOTSEER_FETCH_RETRYS": "3", "BOOTSEER_NOPE_X": "1"})
    assert r.returncode == 0 and DIGEST_OF_HI in r.stdout
    warned = [line for line in r.stderr.splitlines() if line.startswith("bootseer: warning:")]
    assert len(warned) == 2, r.stderr
    assert "BOOTSEER_FETCH_RETRYS" in warned[0] and "did you mean BOOTSEER_FETCH_RETRIES" \
        in warned[0]
    assert "BOOTSEER_NOPE_X" in warned[1] and "docs/configuration.md" in warned[1]


def test_every_variable_bootseer_names_is_known():
    """A variable the code reads (or sets for the job) is never warned about."""
    import re
    from pathlib import Path

    from bootseer.config import known_variables
    root = Path(__file__).parents[2]
    named = set()
    for base in ("src", "deploy"):
        for path in (root / base).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".md", ""):
                named |= set(re.findall(r"BOOTSEER_[A-Z0-9_]*[A-Z0-9]",
                                        path.read_text(errors="replace")))
    known = known_variables()
    # a family named in prose (BOOTSEER_TRACE_*), or a typo the warning's own docs show
    unknown = {n for n in named - known if not any(k.startswith(n + "_") for k in known)}
    assert unknown <= {"BOOTSEER_FETCH_RETRYS", "BOOTSEER_TEST"}, unknown   # BOOTSEER_TEST_*


def test_uv_multi_line_error_is_indented_not_joined(world):
    (world.root / "reqs.txt").write_text("this is not a requirement ! !\n")
    r = world.run("deps", "ensure", "reqs.txt", "--prefix", str(world.root / "env"))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and " | " not in r.stderr
    lines = r.stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("bootseer: error:"))
    assert "uv pip compile" in lines[first]
    assert lines[first + 1].startswith("  "), r.stderr   # uv's next line, indented


def test_an_unexpected_exception_is_one_line_and_the_traceback_only_with_vv(capsys):
    from bootseer.cli import _errors
    assert _errors.report(RuntimeError("boom")) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "bootseer: error: unexpected RuntimeError: boom"
    assert "rerun with -vv" in err and "Traceback" not in err
    try:
        raise RuntimeError("boom")
    except RuntimeError as e:
        _errors.report(e, verbose=2)
    assert "Traceback" in capsys.readouterr().err


def test_a_full_disk_on_ref_set_is_one_line(world, need_root, tmp_path):
    """``store ref set`` into a store whose file system is full (a tiny tmpfs)."""
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        store = full / "store"
        assert world.run("store", "put", "hi", "--store", str(store)).returncode == 0
        fd = os.open(full / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass   # full
        finally:
            os.close(fd)
        r = world.run("store", "ref", "set", "team/x", DIGEST_OF_HI, "--store", str(store))
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr
        assert len(error_lines(r)) == 1 and "No space left on device" in r.stderr
        assert "bootseer: hint: free space" in r.stderr
    finally:
        subprocess.run(["umount", str(full)], check=True)


def _ckpt_dir(world):
    ckpt = world.root / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.bin").write_bytes(b"x" * 100)
    (world.root / "mnt").mkdir(exist_ok=True)
    return f"file://{ckpt}"


def test_fuse_without_cap_sys_admin_is_one_line(world, need_fuse):
    url = _ckpt_dir(world)
    r = world.run("ckpt", "mount", url, "mnt", prefix=["capsh", "--drop=cap_sys_admin", "--",
                                                       "-c", 'exec "$0" "$@"'])
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(error_lines(r)) == 1, r.stderr
    assert "bootseer: hint: a FUSE mount needs /dev/fuse and CAP_SYS_ADMIN" in r.stderr
    assert not os.path.ismount(world.root / "mnt")


def test_fuse_without_dev_fuse_is_one_line(world, need_fuse):
    """In a private mount namespace whose /dev is an empty tmpfs."""
    url = _ckpt_dir(world)
    r = world.run("ckpt", "mount", url, "mnt", prefix=[
        "unshare", "-m", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs none /dev && exec "$0" "$@"'])
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(error_lines(r)) == 1, r.stderr
    assert "/dev/fuse is missing" in r.stderr and "bootseer: hint:" in r.stderr


def test_a_fuse_mount_says_nothing_of_max_threads(world, need_fuse):
    """libfuse's "Ignoring invalid max threads value 4294967295" is gone."""
    url = _ckpt_dir(world)
    import sys
    import time
    p = subprocess.Popen([sys.executable, "-m", "bootseer", "ckpt", "mount", url, "mnt"],
                         cwd=world.root, env=world.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not os.path.ismount(world.root / "mnt") and time.time() < deadline:
            time.sleep(0.1)
        assert os.path.ismount(world.root / "mnt")
    finally:
        p.terminate()
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "max threads" not in err and "max threads" not in out
