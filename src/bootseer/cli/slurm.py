"""``bootseer slurm``: the node hooks slurmd runs (deploy/slurm/prolog.sh, epilog.sh)."""

from __future__ import annotations

import os
import shutil
import sys


def register(sub) -> None:
    p = sub.add_parser("slurm", help="Slurm node hooks: the prolog and epilog slurmd runs as root",
                       description="Run by slurmd (through deploy/slurm/prolog.sh and "
                                   "epilog.sh) with the job in SLURM_JOB_*; the site's "
                                   "settings are read from BOOTSEER_SLURM_CONFIG (default "
                                   "/etc/bootseer/slurm.toml). What runs as root and what as "
                                   "the job's user: docs/slurm.md.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("prolog", help="warm this node for the job (exit 0 unless the node "
                                        "is at fault)")
    v.set_defaults(func=_hook, hook="prolog")
    v = verbs.add_parser("epilog", help="node housekeeping after the job")
    v.set_defaults(func=_hook, hook="epilog")


def _hook(args) -> int:
    from bootseer.config import BootseerConfig, slurm_job_vars, slurm_settings_file
    from bootseer.slurm import hooks, policy
    default = shutil.which("bootseer") or os.path.join(os.path.dirname(sys.executable), "bootseer")
    try:
        site = policy.Site.load(slurm_settings_file(), default_bootseer=default)
        job = hooks.Job.from_env(slurm_job_vars())
        # The store and node cache every step uses: the site's, else bootseer's own
        # settings (BOOTSEER_CONFIG); never anything the job chose.
        config = BootseerConfig.from_env()
        store = site.store or config.store.url
        cache = site.cache or str(config.cache.dir)
        h = hooks.Hooks(site, job, str(store) if store else None, cache)
        if args.hook == "prolog":
            h.prolog()
        else:
            h.epilog()
    except (policy.SlurmSettingsError, OSError) as e:
        print(f"bootseer slurm {args.hook}: node fault: {e}", file=sys.stderr)
        return 1
    return 0
