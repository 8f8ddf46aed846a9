"""``bootseer store``: look at and edit a store by hand (debugging, publishing).

    bootseer store put FILE|- [--ref NAME] [--store URL]    prints the digest
    bootseer store get DIGEST [-o FILE|-]                   streamed, verified
    bootseer store cat DIGEST                               to standard output
    bootseer store stat DIGEST [--json]                     digest and size in bytes
    bootseer store ls                                       blob digests
    bootseer store ls --refs [PREFIX]                       refs and their digests
    bootseer store ref get NAME [--json] | set NAME DIGEST [--exclusive] | rm NAME
    bootseer store gc [--dry-run] [--min-age 24h]           unreferenced blobs
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import BinaryIO

from bootseer.cli import print_json, say_none
from bootseer.cli._flags import add_json_arg, add_store_arg

DIGEST_HELP = "blob digest, sha256:<64 hex>"
REF_HELP = "ref name: parts of [A-Za-z0-9._-] joined by '/', e.g. team/train/v3"

_PART = 8 * 1024**2
"""Bytes per read when streaming a blob out."""


def register(sub) -> None:
    p = sub.add_parser("store", help="put/get/stat/ls/cat blobs and refs of a store",
                       description="Inspect or edit a bootseer store. The store is --store URL, "
                                   "else BOOTSEER_STORE_URL, else the embedded default directory.")
    add_store_arg(p)
    verbs = _StoreVerbs(p.add_subparsers(dest="verb", metavar="VERB", required=True))
    v = verbs.add_parser("put", help="store a file as a blob; print its digest")
    v.add_argument("file", help="path, or - for standard input")
    v.add_argument("--ref", help="also point this ref name at it")
    v.set_defaults(func=_put)
    v = verbs.add_parser("get", help="write a blob (streamed, verified) to a file or stdout")
    v.add_argument("digest", help=DIGEST_HELP)
    v.add_argument("-o", "--output", help="file, or - for standard output (the default); "
                                          "written only if the blob verifies")
    v.set_defaults(func=_get)
    v = verbs.add_parser("cat", help="a blob to standard output (verified)")
    v.add_argument("digest", help=DIGEST_HELP)
    v.set_defaults(func=_get, output=None)
    v = verbs.add_parser("stat", help="digest and size (bytes) of a blob")
    v.add_argument("digest", help=DIGEST_HELP)
    add_json_arg(v, "the digest and size")
    v.set_defaults(func=_stat)
    v = verbs.add_parser("ls", help="list blobs (or refs with --refs)")
    v.add_argument("--refs", action="store_true", help="list refs and their digests")
    v.add_argument("prefix", nargs="?", default=None, help="with --refs: only refs starting "
                                                           "with this")
    add_json_arg(v, "the digests (or refs)")
    v.set_defaults(func=_ls)
    v = verbs.add_parser("gc", help="remove blobs that no ref, tree or profile reaches",
                         description="Remove the blobs of a directory store that nothing "
                         "reaches: no ref points at them, and no tree, profile or manifest "
                         "a ref reaches names them. Run it while nothing publishes to the "
                         "store (a convert reuses old blobs before its ref is set); blobs "
                         "younger than --min-age are kept. --dry-run lists them, for any "
                         "store.")
    v.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    v.add_argument("--min-age", default="24h", metavar="AGE",
                   help="keep blobs written less than AGE ago (s, m, h or d)")
    add_json_arg(v, "the unreferenced blobs (digest, size, age)")
    v.set_defaults(func=_gc)
    v = verbs.add_parser("ref", help="get, set or rm a named ref")
    refs = _StoreVerbs(v.add_subparsers(dest="ref_verb", metavar="get|set|rm", required=True))
    r = refs.add_parser("get", help="print the digest a ref points to")
    r.add_argument("name", help=REF_HELP)
    add_json_arg(r, "the ref's name and digest")
    r.set_defaults(func=_ref_get)
    r = refs.add_parser("set", help="point a ref at a blob of the store")
    r.add_argument("name", help=REF_HELP)
    r.add_argument("digest", help="the blob it points to (sha256:<64 hex>), already in the store")
    r.add_argument("--exclusive", action="store_true",
                   help="only if the ref does not exist yet (exit 3 if it does)")
    r.set_defaults(func=_ref_set)
    r = refs.add_parser("rm", help="delete a ref (no error if absent)")
    r.add_argument("name", help=REF_HELP)
    r.set_defaults(func=_ref_rm)


class _StoreVerbs:
    """Verb parsers that take ``--store`` after the verb too (``store ls --store DIR``),
    as every other command does; given before the verb, it is kept (SUPPRESS)."""

    def __init__(self, actions):
        self.actions = actions

    def add_parser(self, name, **kw):
        v = self.actions.add_parser(name, **kw)
        add_store_arg(v, default=argparse.SUPPRESS)
        v.set_defaults = functools.partial(_set_guarded_defaults, v)
        return v


def _set_guarded_defaults(parser, **kw):
    if "func" in kw:
        kw["func"] = functools.partial(_guarded, kw["func"])
    argparse.ArgumentParser.set_defaults(parser, **kw)


def _guarded(func, args) -> int:
    """``func`` with what the store's driver raises said as one line naming the store."""
    from bootseer.cli._errors import reaching
    from bootseer.config import BootseerConfig
    url = args.store or BootseerConfig.from_env().store.url or "(none configured)"
    with reaching(url):
        return func(args)


_CREATING_VERBS = ("put", "set")


def _open(args):
    """The store; a directory store is created only by the verbs that write one (a
    mistyped ``--store /typo`` for ``ls`` is an error, not a new empty store)."""
    import os

    from bootseer.cli._errors import with_hint
    from bootseer.config import BootseerConfig
    from bootseer.errors import StoreError
    from bootseer.store import open_store
    url = args.store or BootseerConfig.from_env().store.url
    local = url.removeprefix("file://") if url and ("://" not in url or
                                                    url.startswith("file://")) else None
    verb = getattr(args, "ref_verb", None) or args.verb
    if local and verb not in _CREATING_VERBS and not os.path.isdir(local):
        raise with_hint(StoreError(f"no store at {local}: it is not a directory", url=local),
                        "check the path; 'bootseer store put' creates a store there")
    return open_store(args.store)


def _put(args) -> int:
    from bootseer.errors import StoreError
    from bootseer.store.digest import file_digest
    store = _open(args)
    f: BinaryIO   # read twice: once for its digest, once to upload
    if args.file == "-":
        # stdin cannot be read twice: spool it to a temp file (bounded memory)
        import tempfile
        f = tempfile.TemporaryFile()
        while chunk := sys.stdin.buffer.read(1 << 20):
            f.write(chunk)
        f.seek(0)
    else:
        try:
            f = open(args.file, "rb")
        except OSError as e:
            raise StoreError(f"cannot read {args.file}: {e.strerror}") from e
    with f:
        digest, size = file_digest(f)
        f.seek(0)
        store.write(digest, f, size)
    if args.ref:
        store.set_ref(args.ref, digest)
    print(digest)
    return 0


def _get(args) -> int:
    """The blob to ``-o FILE`` (written in place, see bootseer/node/outputs.py) or stdout.
    No byte leaves before the whole blob verifies: it is spooled (beside a file, in a
    temporary for stdout, a FIFO or a device) and copied out only then."""
    import contextlib
    import hashlib
    import shutil
    import tempfile

    from bootseer.errors import DigestMismatch
    from bootseer.node import outputs
    from bootseer.store.digest import parse
    digest = parse(args.digest)
    if args.output == "-":
        args.output = None
    if args.output:
        outputs.check(args.output)
    store = _open(args)
    size = store.stat(digest)
    h = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        to_file = bool(args.output) and not outputs.is_stream(args.output)
        spool = stack.enter_context(outputs.spool_beside(args.output) if to_file
                                    else tempfile.TemporaryFile())
        for start in range(0, max(size, 1), _PART):
            data = store.read(digest, start, min(start + _PART, size)) if size else b""
            h.update(data)
            spool.write(data)
        actual = "sha256:" + h.hexdigest()
        if actual != digest:
            raise DigestMismatch(f"blob {digest} from {store.url} is corrupt: its bytes hash to "
                                 f"{actual} (nothing written)", digest=digest, url=store.url)
        if to_file:
            outputs.copy_into(spool, args.output)
            return 0
        spool.seek(0)
        out = (stack.enter_context(outputs.open_output(args.output, "wb")) if args.output
               else sys.stdout.buffer)
        shutil.copyfileobj(spool, out, _PART)
        out.flush()
    return 0


def _stat(args) -> int:
    from bootseer.store.digest import parse
    digest = parse(args.digest)
    store = _open(args)
    size = store.stat(digest)
    if args.json:
        print_json({"store": store.url, "digest": digest, "size": size})
    else:
        print(f"{digest}\t{size}")
    return 0


def _ls(args) -> int:
    store = _open(args)
    if args.json:
        if args.refs:
            names = store.list_refs(args.prefix or "")
            print_json({"store": store.url, "refs": {n: store.get_ref(n) for n in names}})
        else:
            print_json({"store": store.url, "blobs": list(store.list())})
        return 0
    if args.refs:
        names = list(store.list_refs(args.prefix or ""))
        if not names:
            say_none(f"refs{' under ' + repr(args.prefix) if args.prefix else ''}", store.url,
                     "bootseer store ref set NAME DIGEST, or convert an image")
        for name in names:
            print(f"{name}\t{store.get_ref(name)}")
    else:
        empty = True
        for d in store.list():
            empty = False
            print(d)
        if empty:
            say_none("blobs", store.url, "bootseer store put FILE")
    return 0


def _age_arg(text: str) -> float:
    import re

    from bootseer.errors import UsageError
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if not m:
        raise UsageError(f"--min-age {text!r} is not an age (e.g. 90s, 30m, 24h, 7d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _gc(args) -> int:
    from bootseer.errors import UsageError
    from bootseer.store import gc
    min_age = _age_arg(args.min_age)
    store = _open(args)
    if not args.dry_run and not hasattr(store, "path"):
        raise UsageError(f"store gc removes blobs from directory stores only ({store.url} is "
                         f"not one); --dry-run lists what nothing reaches in any store")
    # a tree a live mount or prefetch on this node reads is kept, referenced or not
    from bootseer.config import BootseerConfig
    from bootseer.store import live
    in_use = live.trees_in_use(BootseerConfig.from_env().cache.dir)
    found = gc.unreferenced(store, min_age_s=min_age, in_use=in_use)
    removed = [b for b in found if args.dry_run or gc.remove(store, b)]
    if args.json:
        print_json({"store": store.url, "dry_run": args.dry_run,
                    "blobs": [{"digest": b.digest, "size": b.size, "age_s": b.age_s}
                              for b in removed]})
    else:
        action = "would remove" if args.dry_run else "removed"
        for b in removed:
            print(f"{action}\t{b.size}\t{b.digest}")
    total = sum(b.size for b in removed)
    print(f"{store.url}: {len(removed)} unreferenced blob(s), {total / 2**20:.1f} MiB "
          f"{'would be freed' if args.dry_run else 'freed'}", file=sys.stderr)
    return 0


def _ref_get(args) -> int:
    from bootseer.errors import BlobNotFound
    store = _open(args)
    digest = store.get_ref(args.name)
    if digest is None:
        raise BlobNotFound(f"no ref {args.name!r} in {store.url}", url=store.url)
    if args.json:
        print_json({"store": store.url, "name": args.name, "digest": digest})
    else:
        print(digest)
    return 0


def _ref_set(args) -> int:
    from bootseer.errors import BlobNotFound
    from bootseer.store.digest import parse
    store = _open(args)
    digest = parse(args.digest)
    if not store.exists(digest):
        raise BlobNotFound(f"cannot point ref {args.name} at {digest}: no such blob in "
                           f"{store.url} (put it first)", digest=digest, url=store.url)
    if not store.set_ref(args.name, digest, exclusive=args.exclusive):
        print(f"bootseer: ref {args.name} already exists in {store.url}: "
              f"{store.get_ref(args.name)}", file=sys.stderr)
        return 3
    return 0


def _ref_rm(args) -> int:
    _open(args).delete_ref(args.name)
    return 0
