"""``bootseer store``: look at and edit a store by hand (debugging, publishing)."""

from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("store", help="put/get/stat/ls/cat blobs and refs of a store",
                       description="Inspect or edit a bootseer store. The store is --store URL, "
                                   "else BOOTSEER_STORE_URL, else the embedded default directory.")
    p.add_argument("--store", metavar="URL", help="store URL (dir, http(s)://, oci://, s3://...)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("put", help="store a file as a blob; print its digest")
    v.add_argument("file", help="path, or - for standard input")
    v.add_argument("--ref", help="also point this ref name at it")
    v.set_defaults(func=_put)
    v = verbs.add_parser("get", help="write a blob (verified) to a file or stdout")
    v.add_argument("digest")
    v.add_argument("-o", "--output", help="file (default: standard output)")
    v.set_defaults(func=_get)
    v = verbs.add_parser("cat", help="same as get to standard output")
    v.add_argument("digest")
    v.set_defaults(func=_get, output=None)
    v = verbs.add_parser("stat", help="size of a blob")
    v.add_argument("digest")
    v.set_defaults(func=_stat)
    v = verbs.add_parser("ls", help="list blobs (or refs with --refs)")
    v.add_argument("--refs", action="store_true", help="list refs and their digests")
    v.add_argument("--prefix", default="", help="only refs starting with this")
    v.set_defaults(func=_ls)
    v = verbs.add_parser("ref", help="show or set a ref")
    v.add_argument("name")
    v.add_argument("digest", nargs="?", help="set the ref to this digest")
    v.add_argument("--delete", action="store_true", help="delete the ref")
    v.set_defaults(func=_ref)


def _open(args):
    from bootseer.store import open_store
    return open_store(args.store)


def _put(args) -> int:
    from bootseer.store.digest import sha256_digest
    data = sys.stdin.buffer.read() if args.file == "-" else open(args.file, "rb").read()
    digest = sha256_digest(data)
    store = _open(args)
    store.write(digest, data)
    if args.ref:
        store.set_ref(args.ref, digest)
    print(digest)
    return 0


def _get(args) -> int:
    from bootseer.store.digest import parse, verify
    store = _open(args)
    data = store.read(parse(args.digest))
    verify(args.digest, data, source=store.url)
    if args.output:
        with open(args.output, "wb") as f:
            f.write(data)
    else:
        sys.stdout.buffer.write(data)
    return 0


def _stat(args) -> int:
    from bootseer.store.digest import parse
    print(f"{args.digest}\t{_open(args).stat(parse(args.digest))}")
    return 0


def _ls(args) -> int:
    store = _open(args)
    if args.refs:
        for name in store.list_refs(args.prefix):
            print(f"{name}\t{store.get_ref(name)}")
    else:
        for d in store.list():
            print(d)
    return 0


def _ref(args) -> int:
    from bootseer.errors import BlobNotFound
    store = _open(args)
    if args.delete:
        store.delete_ref(args.name)
        return 0
    if args.digest:
        store.set_ref(args.name, args.digest)
        return 0
    digest = store.get_ref(args.name)
    if digest is None:
        raise BlobNotFound(f"no ref {args.name!r} in {store.url}")
    print(digest)
    return 0
