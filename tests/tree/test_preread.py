"""The pre-read's schedule, on a plain directory (the EROFS mount is covered in
tests/mount/test_erofs.py): each hot chunk is read once the prefetch made it local, in
profile order; once the prefetch is over, a chunk still not local is skipped, never
fetched by the pre-read."""

from __future__ import annotations

import threading
import time

from bootseer.tree.preread import HotRange, Preread, preread

KiB = 1 << 10


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_preread_follows_the_prefetch_and_skips_what_it_did_not_bring(tmp_path):
    (tmp_path / "a").write_bytes(b"a" * 64 * KiB)
    (tmp_path / "b").write_bytes(b"b" * 16 * KiB)
    hot = [HotRange("d1", "/a", 0, 32 * KiB), HotRange("d2", "/b", 0, 16 * KiB),
           HotRange("d3", "/a", 32 * KiB, 32 * KiB)]
    local: set[str] = set()
    asked: list[str] = []

    def is_local(digest: str) -> bool:
        asked.append(digest)
        return digest in local

    prefetched, done, stop = tmp_path / "prefetched", tmp_path / "done", threading.Event()
    result: list[Preread] = []
    t = threading.Thread(target=lambda: result.append(
        preread(str(tmp_path), hot, is_local, prefetched, done, stop)))
    t.start()
    assert _until(lambda: len(asked) >= 3)
    assert not done.exists() and set(asked) == {"d1"}   # waits for the first hot chunk
    local.update({"d1", "d2"})
    assert _until(lambda: asked.count("d3") >= 3)
    assert not done.exists()                             # read those two, waits for d3
    prefetched.touch()                                   # the prefetch ends without d3
    t.join(5)
    assert done.exists()
    assert result == [Preread(chunks=2, bytes=48 * KiB, skipped_chunks=1,
                              skipped_bytes=32 * KiB)]


def test_preread_stops_when_the_mount_goes_away(tmp_path):
    stop = threading.Event()
    stop.set()
    got = preread(str(tmp_path), [HotRange("d1", "/missing", 0, 4096)], lambda d: False,
                  tmp_path / "prefetched", tmp_path / "done", stop)
    assert got.chunks == 0 and (tmp_path / "done").exists()


def test_preread_of_a_file_it_cannot_open_goes_on(tmp_path):
    (tmp_path / "b").write_bytes(b"b" * 4096)
    got = preread(str(tmp_path), [HotRange("d1", "/missing", 0, 4096),
                                  HotRange("d2", "/b", 0, 4096)],
                  lambda d: True, tmp_path / "prefetched", tmp_path / "done", threading.Event())
    assert got.chunks == 1 and got.bytes == 4096
