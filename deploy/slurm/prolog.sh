#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/bootseer-prolog.sh, PrologFlags=Alloc so it
# runs when the allocation starts, before any task): warms this node for the job, so its
# tasks find the image's hot blocks, the environment and the checkpoint already local.
#
# The job says what to warm in its comment or extra field (sbatch --comment / --extra):
#     bootseer image=REF deps=/home/me/requirements.txt prefix=/home/me/envs/train ckpt=URL
# slurmd runs this as root; `bootseer slurm prolog` checks every value and runs what the
# user named (the environment, the checkpoint) as the user, only the verified image
# prefetch as root (docs/slurm.md, docs/security.md "Slurm"). A refused or failed step is
# said in the job's output (through task-prolog.sh) and the prolog still exits 0; it exits
# non-zero (Slurm drains the node) only for a node fault, such as a broken
# /etc/bootseer/slurm.toml. Keep the site's `timeout` below PrologEpilogTimeout.
set -u
# Not a bootseer job: done, without starting Python (the prolog runs for every job).
case "${SLURM_JOB_EXTRA:-}" in "bootseer "*) ;; *)
    case "${SLURM_JOB_COMMENT:-}" in "bootseer "*) ;; *) exit 0 ;; esac ;;
esac
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec "${BOOTSEER:-bootseer}" slurm prolog
