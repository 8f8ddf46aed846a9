"""``bootseer run`` says one status line per pipeline, on standard error, and nothing with
``-q``; the job's own output is untouched."""

from __future__ import annotations

from bootseer.cli._status import pipeline_line


def _ckpt(world):
    ckpt = world.root / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.bin").write_bytes(b"w" * 200_000)
    return f"file://{ckpt}"


def test_run_says_one_line_per_pipeline(world, need_fuse):
    r = world.run("run", "--ckpt", _ckpt(world), "--", "sh", "-c",
                  'echo job; cat "$BOOTSEER_CKPT_DIR/model.bin" | wc -c')
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["job", "200000"]
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: striped mount ready in "), r.stderr


def test_quiet_run_says_nothing(world, need_fuse):
    r = world.run("-q", "run", "--ckpt", _ckpt(world), "--", "true")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_status_lines():
    assert pipeline_line("image", "lazy", {"prefetch_chunks": 2005, "mount": "erofs-local"},
                         1.94) == ("image: lazy (erofs-local), 2,005 hot chunks prefetching, "
                                   "mounted in 1.9 s")
    assert "no hot-block profile yet" in pipeline_line("image", "lazy", {}, 1.0)
    assert pipeline_line("deps", "restore", {"how": "restored", "key": "sha256:774a0b1c"},
                         4.1) == "deps: restored sha256:774a0b1c... in 4.1 s"
    assert pipeline_line("ckpt", "fetch", {"bytes": 2_100_000_000}, 8.75) == \
        "ckpt: 2.1 GB copied in 8.8 s, 240.0 MB/s"
    assert pipeline_line("image", "pull", {"image": "reg:5000/a:v1"}, 12.0) == \
        "image: pulled reg:5000/a:v1 in 12.0 s"
