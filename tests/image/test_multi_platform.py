"""Multi-platform images: `image convert` of an index makes one tree per platform, and each
node (its platform simulated through the mount.platform setting) resolves the image's
name to its own tree: `image inspect`/`prefetch`, and the snapshotter's lookup. A real
docker-registry holding a two-platform index pushed by skopeo `copy --all`."""

from __future__ import annotations

import json

from bootseer.config import BootseerConfig
from bootseer.image.registry import node_platform
from tests.image.test_convert_registry import (
    bootseer,
    multi_platform_layout,
    need_skopeo,
    one_error_line,
    push,
    tree_file,
)
from tests.image.test_image import oci_layout, tar_layer

PLATFORMS = ("linux/amd64", "linux/arm64")


def test_an_index_converts_every_platform_and_each_node_takes_its_own(registry, tmp_path):
    need_skopeo()
    store = tmp_path / "store"
    ref = f"127.0.0.1:{registry.port}/team/multiarch:1"
    push(f"oci:{multi_platform_layout(tmp_path / 'multi')}:multi", ref, all_platforms=True)
    p = bootseer("image", "convert", ref, "--store", store, "--json", "--no-referrer")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    trees = doc["platforms"]
    assert sorted(trees) == list(PLATFORMS) and len(set(trees.values())) == 2
    for platform, tree in trees.items():   # each tree holds its own platform's files
        assert tree_file(store, tree, "etc/arch") == platform.split("/")[1].encode()
    # the plain name (and the printed digest) is this node's platform's tree
    assert doc["digest"] == trees.get(node_platform(), trees["linux/amd64"])

    for platform, tree in trees.items():   # a node of each platform takes its own tree
        env = {"BOOTSEER_MOUNT_PLATFORM": platform}
        r = bootseer("image", "inspect", ref, "--store", store, "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tree"] == tree
        assert json.loads(r.stdout)["meta"]["platform"] == platform
        r = bootseer("image", "prefetch", ref, "--store", store, env={
            **env, "BOOTSEER_CACHE_DIR": str(tmp_path / "cache")})
        assert r.returncode == 0 and f"no profile for {tree}" in r.stderr, r.stderr

    # the snapshotter: containerd asks for the arm64 image's top layer by its chain ID
    # under a manifest digest it was not converted from (a retag): found through the name
    from bootseer.snapshotter.lazy import CRI_IMAGE, CRI_MANIFEST, REF, LazyImages
    arm = json.loads(bootseer("image", "inspect", ref, "--store", store, "--json",
                              env={"BOOTSEER_MOUNT_PLATFORM": "linux/arm64"}).stdout)
    labels = {REF: arm["meta"]["chain_ids"][-1], CRI_MANIFEST: "sha256:" + "0" * 64,
              CRI_IMAGE: ref}
    for platform, want in (("linux/arm64", trees["linux/arm64"]), ("linux/amd64", None)):
        config = BootseerConfig.from_env(overrides={
            "store": {"url": str(store)}, "cache": {"dir": str(tmp_path / "cache")},
            "mount": {"platform": platform}})
        match = LazyImages(config).match(labels)
        # an amd64 node's tree has other layers than the arm64 image asked: a normal pull
        assert (match.tree if match else None) == want


def test_asked_platforms_and_a_name_without_this_nodes_platform(tmp_path):
    layout = multi_platform_layout(tmp_path / "multi")
    store = tmp_path / "store"
    # one platform of a list the index lacks: nothing converted, the offered ones named
    p = bootseer("image", "convert", layout, "--store", store,
                 "--platform", "linux/arm64,linux/s390x")
    assert p.returncode == 1
    line = one_error_line(p)
    assert "no linux/s390x variant" in line and "linux/amd64, linux/arm64" in line
    # converted for arm64 only; an amd64 node is told which it has and how to add its own
    p = bootseer("image", "convert", layout, "--store", store, "--platform", "linux/arm64")
    assert p.returncode == 0, p.stderr
    r = bootseer("image", "inspect", layout, "--store", store,
                 env={"BOOTSEER_MOUNT_PLATFORM": "linux/amd64"})
    assert r.returncode == 1
    line = one_error_line(r)
    assert "no tree for this node's platform linux/amd64" in line, line
    assert "(converted for: linux/arm64)" in line and "--platform linux/amd64" in line
    # its name goes with its platforms' refs
    r = bootseer("image", "rm", layout, "--store", store, "--json")
    assert r.returncode == 0, r.stderr
    assert any(n.startswith("images/platforms/") and n.endswith("/linux-arm64")
               for n in json.loads(r.stdout)["removed"])
    # a malformed platform setting is refused by name
    r = bootseer("image", "inspect", layout, "--store", store,
                 env={"BOOTSEER_MOUNT_PLATFORM": "arm64"})
    assert r.returncode != 0 and "mount.platform" in one_error_line(r)


def test_a_single_platform_image_by_default_must_be_this_nodes(tmp_path):
    layout = oci_layout(tmp_path / "img", [tar_layer([("hello", b"hi\n", "f")])], "amd64")
    store = tmp_path / "store"
    env = {"BOOTSEER_MOUNT_PLATFORM": "linux/arm64"}   # an arm64 node; the image is amd64
    p = bootseer("image", "convert", layout, "--store", store, env=env)
    assert p.returncode == 1
    line = one_error_line(p)
    assert "no linux/arm64 variant (it has: linux/amd64)" in line and "--platform" in line
    for asked in ("all", "linux/amd64"):   # asked for: converted whatever this node is
        p = bootseer("image", "convert", layout, "--store", store, "--platform", asked,
                     env=env)
        assert p.returncode == 0, p.stderr
    # its platform asked is recorded: this arm64 node is not given the amd64 tree
    r = bootseer("image", "inspect", layout, "--store", store, env=env)
    assert r.returncode == 1 and "(converted for: linux/amd64)" in one_error_line(r)
