"""``bootseer run``: start one node of a training job fast."""

from __future__ import annotations

import argparse

from bootseer.cli._flags import (
    add_fallback_arg,
    add_index_url_arg,
    add_ready_regex_arg,
    add_store_arg,
    ready_regex,
)

EPILOG = """\
examples:
  # one node of a job: lazy image with hot-block prefetch, snapshot env, striped checkpoint
  bootseer run --image 10.0.0.5:5000/team/train:v3 --deps requirements.txt \\
      --prefix /opt/envs/train --ckpt s3://bucket/run7/step-12000 --trace /shared/traces \\
      -- torchrun --nnodes 64 --node-rank $NODE_RANK train.py

  # the conventional path, to measure what bootseer buys
  bootseer run --baseline --image ... --deps ... --ckpt ... -- CMD

The command finds its environment prefix in $BOOTSEER_ENV_PREFIX, the checkpoint in
$BOOTSEER_CKPT_DIR, and signals that the job is ready (first training step done) by
creating the file named in $BOOTSEER_READY_FILE; that closes the hot-block recording
window and publishes the profile the next start prefetches.
"""


def register(sub) -> None:
    from bootseer.cli import RawDescriptionHelpFormatter
    p = sub.add_parser("run", help="start one node of a job: overlap image, deps and "
                       "checkpoint, then run CMD in the image",
                       description="Start one node of a training job: image hot-block "
                       "prefetch, dependency restore and checkpoint plan prefetch run at "
                       "once; then CMD runs with the image as its root filesystem. CMD's "
                       "exit status is passed through.",
                       epilog=EPILOG, formatter_class=RawDescriptionHelpFormatter)
    g = p.add_argument_group("image")
    g.add_argument("--image", metavar="REF",
                   help="image to run CMD in (registry reference host:port/repo:tag); "
                        "without it CMD runs on the host")
    g.add_argument("--no-prefetch", action="store_true",
                   help="lazy image without hot-block prefetch")
    g.add_argument("--pull", action="store_true",
                   help="pull and unpack the whole image first (podman), no lazy loading")
    g = p.add_argument_group("dependencies")
    g.add_argument("--deps", metavar="SPEC|KEY",
                   help="requirements file, pyproject.toml or uv.lock (or a key from "
                        "'bootseer deps key')")
    g.add_argument("--deps-key", metavar="KEY",
                   help="environment key from 'bootseer deps key', resolved once per job")
    g.add_argument("--prefix", metavar="PATH",
                   help="where the environment lives (the same path on every node)")
    g.add_argument("--python", metavar="PY", help="interpreter of the environment")
    add_index_url_arg(g, "package index (repeatable)")
    g.add_argument("--no-snapshot", action="store_true",
                   help="pip install on this node instead of restoring a snapshot")
    g = p.add_argument_group("checkpoint")
    g.add_argument("--ckpt", metavar="URL", help="checkpoint directory (any fsspec URL)")
    g.add_argument("--ckpt-target", default="/ckpt", metavar="PATH",
                   help="where CMD sees the checkpoint inside the container (default /ckpt)")
    g.add_argument("--ckpt-mirror", action="append", default=[], metavar="URL",
                   help="an exact copy of the checkpoint on another http(s) server "
                        "(repeatable): slow stripes are hedged to it, failed ones fail over")
    g.add_argument("--no-stripe", action="store_true",
                   help="read the checkpoint as one sequential stream per file")
    g = p.add_argument_group("job")
    add_fallback_arg(g)
    g.add_argument("--baseline", action="store_true",
                   help="the conventional start: --pull --no-snapshot --no-stripe")
    g.add_argument("--trace", metavar="LOCATION",
                   help="trace location: a directory, or a store URL (oci://, s3://, "
                   "file:///dir, ...) the trace files are uploaded to as refs "
                   "traces/JOB/ATTEMPT/FILE; read with 'bootseer report URL --job JOB'")
    g.add_argument("--job-id", help="job id shared by every node (trace)")
    g.add_argument("--attempt", default="auto", metavar="N|auto",
                   help="restart number (trace); auto (default): SLURM_RESTART_COUNT, "
                        "TORCHELASTIC_RESTART_COUNT or BOOTSEER_RESTART_COUNT, else this "
                        "node's start counter for the job in the store")
    g.add_argument("--node", help="node name (trace; default: host name)")
    g.add_argument("--nodes", metavar="N",
                   help="nodes in the job, for peers (default: torchrun's --nnodes, Slurm, "
                        "WORLD_SIZE/LOCAL_WORLD_SIZE, BOOTSEER_JOB_COMPLETIONS; docs/peers.md)")
    add_store_arg(g, "bootseer store (default: settings)")
    g.add_argument("--bind", action="append", default=[], metavar="SRC:DST[:rw]",
                   help="extra bind mount into the container (repeatable)")
    g.add_argument("-e", "--env", action="append", default=[], metavar="K=V",
                   help="environment variable for CMD (repeatable)")
    g.add_argument("-w", "--workdir",
                   help="working directory of CMD (default: the image's, else /)")
    g.add_argument("--runtime", choices=["auto", "podman", "chroot", "rootless"],
                   default="auto",
                   help="container runtime (default: podman, else unshare+chroot; for a "
                        "user without root, rootless: a user namespace)")
    g.add_argument("--network", default="host", metavar="MODE",
                   help="container network: host (default: the node's, as torchrun and "
                        "NCCL expect), none, ns:PATH, or a podman mode or network name")
    g.add_argument("--gpus", default="auto", metavar="all|none|auto|0,1",
                   help="GPUs passed into the container (default auto: those present; "
                        "a CDI spec is preferred, else the NVIDIA device nodes)")
    g.add_argument("--shm-size", metavar="SIZE",
                   help="a private /dev/shm of SIZE (e.g. 16GiB) instead of the host's IPC")
    g.add_argument("--warm", action="store_true",
                   help="serve the job's Python workers from this node's zygote, cold on any "
                        "miss; with --image the zygote runs inside the container "
                        "(docs/warm-start.md)")
    g.add_argument("--summary", metavar="FILE",
                   help="write per-phase timings (JSON) here (- : standard output)")
    add_ready_regex_arg(g, "the job is ready at the first line of CMD's output matching "
                           "REGEX (e.g. 'step 1 '), for jobs that do not create "
                           "$BOOTSEER_READY_FILE")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD...",
                   help="the command to run")
    p.set_defaults(func=_run)


def _parse_bind(text: str):
    from bootseer.errors import ConfigError
    from bootseer.run.container import Bind
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ConfigError("--bind", f"{text!r} is not SRC:DST[:ro|rw]")
    return Bind(parts[0], parts[1], readonly=len(parts) == 2 or parts[2] == "ro")


def spec_from_args(args):
    from bootseer.cli._errors import with_hint
    from bootseer.cli.deps import prefix_arg
    from bootseer.errors import ConfigError, UsageError
    from bootseer.run.node import RunSpec
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise ConfigError("CMD", "no command given: bootseer run [options] -- CMD...")
    if args.deps and not args.prefix and not args.no_snapshot and not args.baseline:
        # a temp prefix would publish a snapshot no node could ever use again
        raise with_hint(UsageError("--deps needs --prefix: the environment's path, the "
                                   "same on every node"),
                        "add --prefix /opt/envs/NAME (or --no-snapshot to install into "
                        "a throw-away directory)")
    env = {}
    for item in args.env:
        if "=" not in item:
            raise ConfigError("--env", f"{item!r} is not K=V")
        k, v = item.split("=", 1)
        env[k] = v
    return RunSpec(argv=argv, image=args.image,
                   image_mode="pull" if (args.pull or args.baseline) else "lazy",
                   prefetch=not args.no_prefetch, deps=args.deps, deps_key=args.deps_key,
                   prefix=prefix_arg(args.prefix),
                   python=args.python, index_urls=args.index_url,
                   snapshot=not (args.no_snapshot or args.baseline), ckpt=args.ckpt,
                   ckpt_target=args.ckpt_target, ckpt_mirrors=args.ckpt_mirror,
                   stripe=not (args.no_stripe or args.baseline),
                   binds=[_parse_bind(b) for b in args.bind], env=env, workdir=args.workdir,
                   runtime=args.runtime, network=args.network, gpus=_gpus_arg(args.gpus),
                   shm_size=_shm_arg(args.shm_size), summary=summary_arg(args.summary),
                   ready_regex=ready_regex(args.ready_regex), fallback=args.fallback,
                   warm=args.warm)


def summary_arg(path: str | None) -> str | None:
    """``--summary``: refused now if it can never be written (a directory...), and made
    absolute (the run may change directory before it writes it, in place)."""
    import os

    from bootseer.node import outputs
    if path is None or path == "-":   # -: standard output, after the job's own output
        return path
    outputs.check(path, "summary")
    return os.path.abspath(path)


def _gpus_arg(text: str) -> str:
    from bootseer.run.devices import parse_gpus
    parse_gpus(text)
    return text


def _shm_arg(text: str | None) -> int | None:
    from bootseer.config import parse_size
    return None if text is None else parse_size(text, "--shm-size")


def _attempt_arg(text: str) -> str:
    from bootseer.errors import ConfigError
    if text != "auto" and not text.isdigit():
        raise ConfigError("--attempt", f"{text!r} is not a number or auto")
    return text


def _run(args) -> int:
    from bootseer.cli._status import run_node
    from bootseer.config import BootseerConfig, trace_start
    from bootseer.report import remote
    from bootseer.run import start
    spec = spec_from_args(args)
    asked = _attempt_arg(args.attempt)
    overrides = {"store": {"url": args.store},
                 "trace": {"location": args.trace, "job_id": args.job_id,
                           "attempt": None if asked == "auto" else int(asked),
                           "node": args.node}}
    config = BootseerConfig.from_env(overrides=overrides)
    config = start.with_job(config, spec.argv, _nodes_arg(args.nodes))
    if config.trace.location:
        config = start.with_attempt(config, asked)
    # a store URL: record to a local spool, uploaded while the job runs and at its end
    with remote.recording(config, trace_start() or "run") as config:
        start.export_trace(config)
        return run_node(spec, config)


def _nodes_arg(text: str | None) -> int | None:
    from bootseer.errors import ConfigError
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ConfigError("--nodes", f"{text!r} is not a node count (1 or more)")
    return int(text)
