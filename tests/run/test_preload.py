"""The pipelines' modules are imported before their threads start (module-lock deadlock)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_preload_imports_what_the_pipelines_import_lazily_and_no_torch():
    code = ("import json, sys; from bootseer.run import pipelines; pipelines.preload_modules(); "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = set(json.loads(out))
    for name in ("bootseer.run.lazy", "bootseer.tree.session", "bootseer.tree.blob_mount",
                 "bootseer.tree.preread", "bootseer.deps.ensure", "bootseer.deps.mounts",
                 "bootseer.ckpt.mount", "bootseer.ckpt.engine", "bootseer.store.digest",
                 "bootseer.mount.erofs.kernel", "bootseer.mount.devfuse.server",
                 "bootseer.peers.share"):
        assert name in loaded, name
    assert "torch" not in loaded     # a start without a checkpoint never pays for it


def test_a_run_of_an_image_alone_preloads_neither_deps_nor_ckpt():
    code = ("import json, sys; from bootseer.run import pipelines; "
            "pipelines.preload_modules(['image']); print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = set(json.loads(out))
    for name in ("bootseer.tree.session", "bootseer.tree.preread", "bootseer.mount.fuse",
                 "bootseer.peers.share", "bootseer.image.session"):
        assert name in loaded, name
    assert not any(n.startswith(("bootseer.deps", "bootseer.ckpt")) for n in loaded), \
        sorted(n for n in loaded if n.startswith(("bootseer.deps", "bootseer.ckpt")))
