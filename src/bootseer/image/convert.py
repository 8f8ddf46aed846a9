"""``bootseer image convert``: OCI image -> one flattened tree in the store.

Sources: a registry reference (``host:port/repo:tag``, via skopeo), an OCI layout
directory, or an image tar (``podman save``: docker-archive or oci-archive, told apart by
its content). Layers are applied in order with
their whiteouts (``.wh.NAME`` removes, ``.wh..wh..opq`` hides what lower layers put in a
directory); hard links, symlinks, modes, owners and xattrs (PAX ``SCHILY.xattr.*``) are
kept; device nodes are recorded (the mount is nodev); a member whose path escapes the
root is refused. The tree's digest is published under refs so mounts can name the source.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bootseer import redact
from bootseer.errors import BootseerError, DigestMismatch, InvalidDigest, StoreError
from bootseer.image import chain, platforms
from bootseer.image.registry import (
    TRANSPORTS,
    RegistryOptions,
    node_platform,
    platform_matches,
    platform_of,
    pull_bytes,
    registry_host,
    registry_repository,
)
from bootseer.node import alive, tools
from bootseer.node import proc as procs
from bootseer.store.digest import VerifyingReader, parse, parse_oci
from bootseer.tree.build import Owner, TreeBuilder, TreeBuildError

log = logging.getLogger(__name__)


class ConvertError(BootseerError):
    hint: str | None = None   # the next step, said under the error line (the CLI)


IMAGE_REFS = "images/by-name/"


def ref_name(image: str) -> str:
    """Store ref under which the tree of ``image`` is published (of the converting node's
    platform, or the first converted: ``platforms`` has each platform's)."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", image.removeprefix("docker://"))
    return f"{IMAGE_REFS}{clean}"


def _skopeo_to_layout(src: str, dest: Path, registry: RegistryOptions, progress=None) -> None:
    """Copy ``src`` (a transport skopeo knows, or a bare registry reference) into the OCI
    layout ``dest``: the platform ``registry`` names, with its credentials and TLS.
    ``progress("pull", bytes, total)`` says, while it copies, how much is in ``dest`` (the
    total: what the registry's manifest lists; None for other transports)."""
    tools.require("skopeo", "image convert")
    transport = src if src.startswith(TRANSPORTS) else f"docker://{src}"
    host = registry_host(transport)
    source = (registry.skopeo_source_args(host, dest.parent, registry_repository(transport))
              if host else [])
    total = pull_bytes(transport, registry, source) if host and progress else None
    proc = subprocess.Popen(["skopeo", *registry.skopeo_global_args(), "copy", "-q",
                             *registry.copy_args(), *source,
                             transport, f"oci:{dest}:src"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=procs.preexec())
    try:
        while True:
            try:
                _, err = proc.communicate(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                if progress:
                    progress("pull", _bytes_under(dest), total)
    finally:
        if proc.poll() is None:   # interrupted: skopeo goes with us
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise ConvertError(f"cannot read image {redact.text(src)}: "
                           f"{redact.text(tools.tool_message(err))}")
    if progress:
        progress("pull", _bytes_under(dest), total)


def _bytes_under(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:   # a temp file skopeo renamed meanwhile
                pass
    return total


class Layer:
    """A layer blob of a layout: its file, and the digest and size it must have."""

    def __init__(self, path: Path, digest: str, size: int | None):
        self.path, self.digest, self.size = path, digest, size
        self.name = digest.split(":", 1)[1]


def _layout_images(layout: Path, registry: RegistryOptions, here: str
                   ) -> tuple[bool, list[tuple[str | None, str, list[Layer], dict]]]:
    """Whether the layout holds an index, and (platform, manifest digest, layers, config)
    of each image of it that
    ``registry`` asks for: every platform an index offers (attestations and entries that
    name none skipped) or the ones asked; a single image, if it is of a platform asked (of
    this node's, ``here``, by default). Every digest is checked before it names a file, and every
    blob read is verified against it (layers as they are applied)."""
    try:
        index = json.loads((layout / "index.json").read_text())
        mdesc = index["manifests"][0]
        manifest = json.loads(_read_blob(layout, mdesc))
        media = manifest.get("mediaType", mdesc.get("mediaType", ""))
        if media.endswith("index.v1+json") or "manifests" in manifest:
            chosen = _chosen(layout, registry, manifest["manifests"])
            check, is_index = registry, True
        else:   # one image: by default it must be this node's platform, as skopeo picks
            chosen = [mdesc]
            check = registry if registry.platform else RegistryOptions(platform=here)
            is_index = False
        images = []
        for desc in chosen:
            m = manifest if desc is mdesc else json.loads(_read_blob(layout, desc))
            layers = [Layer(_blob(layout, d["digest"]), d["digest"], _size(d))
                      for d in m["layers"]]
            config = json.loads(_read_blob(layout, m["config"]))
            if not check.matches(config):
                raise ConvertError(platforms.missing(layout, check.platform or "all",
                                                [{"platform": config}]))
            images.append((platform_of(config) or platform_of(desc.get("platform") or {}),
                           desc["digest"], layers, config))
    except (DigestMismatch, InvalidDigest) as e:
        raise ConvertError(f"{layout}: {e}; refusing the image") from e
    except (OSError, KeyError, TypeError, ValueError, StopIteration) as e:
        raise ConvertError(f"{layout} is not a readable OCI image layout: {e}") from e
    return is_index, images


def _chosen(layout: Path, registry: RegistryOptions, offered: list[dict]) -> list[dict]:
    """The index entries to convert: every one that names a platform (all asked), else the
    first match of each platform asked; one asked that the index lacks is an error."""
    wanted = registry.wanted()
    if wanted is None:
        chosen = [m for m in offered if platform_of(m.get("platform") or {})]
        if not chosen:   # an index of images that name no platform: its first, as before
            chosen = offered[:1]
        return chosen
    picked: list[dict] = []
    for w in wanted:
        m = next((m for m in offered if platform_matches(w, m.get("platform") or {})), None)
        if m is None:
            raise ConvertError(platforms.missing(layout, w, offered))
        if m not in picked:
            picked.append(m)
    return picked


def _size(desc: dict) -> int | None:
    size = desc.get("size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def _blob(layout: Path, digest: str) -> Path:
    algo, hexd = parse_oci(digest)   # never a path of its own (sha256:../../x)
    return layout / "blobs" / algo / hexd


def _open_blob(path: Path):
    """A blob file, opened as a regular file only (a FIFO or a device is no blob)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConvertError(f"{path} is not a regular file; refusing the image")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_blob(layout: Path, desc: dict) -> bytes:
    """A small blob (index, manifest, config), verified against its descriptor."""
    path = _blob(layout, desc["digest"])
    with _open_blob(path) as f:
        reader = VerifyingReader(f, desc["digest"], size=_size(desc), source=str(layout))
        data = reader.read(MAX_METADATA_BLOB + 1)
        if len(data) > MAX_METADATA_BLOB:
            raise ConvertError(f"{path}: a manifest or config over {MAX_METADATA_BLOB} bytes; "
                               f"refusing the image")
        reader.finish()
    return data


MAX_METADATA_BLOB = 16 << 20


def _member_path(name: str) -> str:
    """Tar member name relative to the root; '..' is kept so the builder refuses it."""
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


class _Counted:
    """A blob file that says how many bytes were read from it (the layers' progress)."""

    def __init__(self, f, progress):
        self.f, self.progress = f, progress

    def read(self, n=-1):
        data = self.f.read(n)
        self.progress(len(data))
        return data


def apply_layer(builder: TreeBuilder, layer: Layer, progress=None) -> None:
    """Apply one layer; its blob is hashed as it streams and must match its digest.
    ``progress(n)``: ``n`` more bytes of the (compressed) blob were read."""
    added: set[str] = set()
    try:
        with _open_blob(layer.path) as raw:
            source = _Counted(raw, progress) if progress else raw
            # VerifyingReader only reads its file (``read(n)``), as ``_Counted`` offers, though
            # its annotation asks a whole BinaryIO
            blob = VerifyingReader(source, layer.digest,  # type: ignore[arg-type]
                                   size=layer.size, source=str(layer.path))
            # a stream ("r|") is only read, but typeshed asks a seekable, writable file
            with tarfile.open(fileobj=blob, mode="r|*") as tar:  # type: ignore[call-overload]
                _apply_members(builder, tar, layer, added)
            blob.finish()   # before the tree is finished: no tree from an unverified layer
    except DigestMismatch as e:
        raise ConvertError(f"layer {layer.digest}: {e}; refusing the image") from e
    except TreeBuildError as e:
        raise ConvertError(f"layer {layer.name[:12]}: {e}; refusing the image") from e
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ConvertError(f"layer {layer.path} is not a readable tar: {e}") from e


def _apply_members(builder: TreeBuilder, tar: tarfile.TarFile, layer: Layer, added: set[str]
                   ) -> None:
    for m in tar:
        name = "/" + _member_path(m.name)
        try:
            norm = builder._norm(name)
        except TreeBuildError as e:
            raise ConvertError(f"layer {layer.name[:12]}: member {m.name!r} escapes the "
                               f"image root; refusing the image") from e
        norm = _in_root(builder, norm)
        base = os.path.basename(norm)
        parent = os.path.dirname(norm)
        if base == ".wh..wh..opq":
            builder.clear_dir(parent, keep=added)
            continue
        if base.startswith(".wh."):
            builder.remove(os.path.join(parent, base[4:]))
            continue
        kw: Owner = {"uid": m.uid, "gid": m.gid, "mtime": float(m.mtime)}
        xattrs = {k[len("SCHILY.xattr."):]: __import__("base64").b64encode(
            v.encode("utf-8", "surrogateescape")).decode()
            for k, v in (m.pax_headers or {}).items() if k.startswith("SCHILY.xattr.")}
        if m.isdir():
            builder.add_dir(norm, m.mode, xattrs=xattrs or None, **kw)
        elif m.issym():
            builder.remove(norm)
            builder.add_symlink(norm, m.linkname, **kw)
        elif m.islnk():
            builder.remove(norm)
            target = _in_root(builder, builder._norm("/" + _member_path(m.linkname)))
            builder.add_hardlink(norm, target)
        elif m.isfile():
            builder.remove(norm)
            f = tar.extractfile(m)
            if f is None:   # tarfile gives every regular file member a reader
                raise ConvertError(f"layer {layer.name[:12]}: member {m.name!r} cannot be read")
            builder.add_file(norm, f, m.mode, xattrs=xattrs or None, **kw)
        elif m.ischr() or m.isblk() or m.isfifo():
            kind = "c" if m.ischr() else "b" if m.isblk() else "p"
            builder.add_special(norm, kind, m.mode, os.makedev(m.devmajor, m.devminor),
                                **kw)
        added.add(norm)


MAX_SYMLINK_HOPS = 40


def _in_root(builder: TreeBuilder, path: str) -> str:
    """``path`` with its parent directories resolved through the image's own symlinks,
    as a container runtime applies a layer (``lib/x`` over a ``lib -> usr/lib`` link lands
    in ``usr/lib/x``); a link never leads out of the root (``..`` stops at ``/``)."""
    parts = path.strip("/").split("/")
    todo, hops = parts[:-1], 0
    done: list[str] = []
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        e = builder.entries.get("/" + "/".join([*done, part]))
        if e is None or e.type != "l" or e.target is None:
            done.append(part)
            continue
        hops += 1
        if hops > MAX_SYMLINK_HOPS:
            raise ConvertError(f"{path}: too many levels of symlinks in the image")
        if e.target.startswith("/"):
            done = []
        todo = e.target.split("/") + todo
    return "/" + "/".join([*done, parts[-1]]) if parts[-1] else "/"


def _archive_kind(path: Path) -> str:
    """``oci-archive`` for a tar holding an OCI layout (``podman save --format
    oci-archive``, ``buildah push oci-archive:``), else ``docker-archive``."""
    import tarfile
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name.lstrip("./") == "oci-layout":
                    return "oci-archive"
                if member.name.lstrip("./") == "manifest.json":
                    return "docker-archive"
    except (tarfile.TarError, OSError):
        pass  # skopeo says what is wrong with it
    return "docker-archive"


_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".oci")


def _looks_like_a_path(src: str) -> bool:
    """A source the user meant as a local file or directory: no image reference starts
    with ``/``, ``.`` or ``~``, and none ends like an archive."""
    return src.startswith(("/", "./", "../", "~")) or src in (".", "..") \
        or src.lower().endswith(_ARCHIVES)


@dataclass(frozen=True)
class Converted:
    """What ``convert_image`` published: ``tree``, the image's tree for this node's
    platform (else the first converted), and ``trees``, platform -> tree of every
    platform converted (empty where the image names none)."""
    tree: str
    trees: dict[str, str]


def convert(src: str, store, *, chunk_size: int = 1 << 20, pack_size: int = 64 << 20,
            progress=None, registry: RegistryOptions | None = None) -> str:
    """Convert ``src`` and publish it; return the tree digest (of this node's platform,
    where ``src`` is a multi-platform index: ``convert_image`` says each)."""
    return convert_image(src, store, chunk_size=chunk_size, pack_size=pack_size,
                         progress=progress, registry=registry).tree


def convert_image(src: str, store, *, chunk_size: int = 1 << 20, pack_size: int = 64 << 20,
                  progress=None, registry: RegistryOptions | None = None,
                  node: str | None = None) -> Converted:
    """Convert ``src`` and publish it: one tree per platform converted (every platform of
    an index, unless ``registry.platform`` names some). ``registry``: credentials,
    TLS, platforms and referrer of a registry source (default: ``RegistryOptions()``).
    ``progress(stage, done, total)``: ``"pull"`` (bytes skopeo copied so far, of what the
    registry's manifest lists), then ``"layers"`` (bytes of the layer blobs applied, of
    their total). ``node``: this node's platform (default ``node_platform()``)."""
    registry = registry or RegistryOptions()
    here = node_platform(node)
    tmp = state = None
    path = Path(src)
    if not path.exists() and _looks_like_a_path(src):
        err = ConvertError(f"{src}: no such file or directory")
        err.hint = ("give an OCI layout directory, a docker- or oci-archive tar, or an image "
                    "reference (registry.example/team/app:tag, oci:DIR:TAG)")
        raise err
    try:
        if path.is_dir():
            layout = path
        else:
            state = alive.StateDir("bsconv-")   # a SIGKILLed convert's copy goes next time
            tmp = tempfile.mkdtemp(prefix="bsconv-", dir=os.environ.get("TMPDIR", "/var/tmp"))
            state.note_dir(tmp)
            spec = f"{_archive_kind(path)}:{src}" if path.is_file() else src
            layout = Path(tmp) / "layout"   # next to it, --creds' private auth file
            _skopeo_to_layout(spec, layout, registry, progress)
        is_index, images = _layout_images(layout, registry, here)
        total = sum(layer.size or 0 for image in images for layer in image[2]) or None
        done = 0

        def applied(n: int) -> None:
            nonlocal done
            done += n
            progress("layers", done, total)
        built = []   # (platform, manifest digest, tree), in the index's order
        for platform, manifest_digest, layers, config in images:
            builder = TreeBuilder(store, chunk_size=chunk_size, pack_size=pack_size)
            for layer in layers:
                apply_layer(builder, layer, applied if progress else None)
            cfg = config.get("config") or {}
            built.append((platform, manifest_digest, builder.finish(meta={
                "source": src, "manifest": manifest_digest, "platform": platform,
                "env": cfg.get("Env"), "cmd": cfg.get("Cmd"),
                "workdir": cfg.get("WorkingDir"), "entrypoint": cfg.get("Entrypoint"),
                # containerd's layer snapshot names (snapshotter)
                "chain_ids": chain.of_config(config)})))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if state is not None:
            state.close()
    trees = {p: tree for p, _, tree in built if p}
    digest = next((tree for p, _, tree in built if p == here), built[0][2])
    if store.writable:
        store.set_ref(ref_name(src), digest)
        # a single-platform source's one tree serves every node, as before; an index's
        # (or one asked by --platform: skopeo copies that image alone) replace the
        # platforms recorded (all converted) or join them (some asked)
        platforms.publish(store, ref_name(src).removeprefix(IMAGE_REFS),
                          trees if is_index or registry.platform else {},
                          replace=registry.wanted() is None)
        for _, manifest_digest, tree in built:
            store.set_ref(f"images/by-manifest/{manifest_digest.replace(':', '-')}", tree)
    if registry.referrer and not src.startswith(TRANSPORTS[1:]):
        _announce(src, digest, store, registry)   # the referrer names one tree: this one
    return Converted(digest, trees)


def _announce(src: str, digest: str, store, registry: RegistryOptions) -> None:
    """Push the referrer next to a registry source, with the login and TLS the pull used."""
    import dataclasses

    from bootseer.config import BootseerConfig
    from bootseer.image import referrer
    where = referrer.registry_ref(src)
    if where is None:
        return
    host, _, repository = where[0].removeprefix("oci://").partition("/")
    config = BootseerConfig.from_env()
    login = registry.login_for(host, repository)
    store_cfg = dataclasses.replace(
        config.store, username=login.username if login else config.store.username,
        password=login.password if login else config.store.password,
        insecure=config.store.insecure or registry.tls_verify is False)
    referrer.publish(src, digest, store.read(digest), store.url,
                     dataclasses.replace(config, store=store_cfg))


def resolve(ref: str, store, platform: str | None = None) -> str:
    """A tree digest from a digest, a store ref name, or a converted image's reference:
    of a multi-platform image, the tree of ``platform`` (default: this node's,
    ``node_platform``); one converted for other platforms only is a BlobNotFound naming
    them. A registry image converted under another name (a new tag of the same manifest,
    or a store that only holds the tree) is found through the referrer announced next to
    it."""
    from bootseer.errors import BlobNotFound
    if ref.startswith("sha256:"):
        return parse(ref)   # InvalidDigest (one line) for anything but sha256:<64 hex>
    for name in (ref, ref_name(ref)):
        try:
            d = store.get_ref(name)
        except Exception:  # noqa: BLE001 - not a valid ref name: try the next form
            d = None
        if d and name.startswith(IMAGE_REFS):
            return platforms.pick(store, name[len(IMAGE_REFS):], ref,
                                  node_platform(platform)) or d
        if d:
            return d
    from bootseer.image import referrer
    elsewhere = []
    if referrer.registry_ref(ref) is not None:
        try:
            for found in referrer.find(ref):
                parse(found["tree"])   # from the registry: a digest, or nothing
                if store.exists(found["tree"]):
                    return found["tree"]
                elsewhere.append(f"{found['tree']} in {found['store']}")
        except (StoreError, OSError, ValueError, KeyError) as e:
            log.info("no referrer lookup for %s: %s", ref, e)
    hint = (f"; its converted tree is announced in another store ({', '.join(elsewhere)}): "
            f"point BOOTSEER_STORE_URL there") if elsewhere else ""
    raise BlobNotFound(f"no converted image for {ref!r} in {store.url}: run "
                       f"'bootseer image convert {ref} --store {store.url}' first{hint}",
                       url=store.url)
