#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/bootseer-task-prolog.sh): runs as the
# job's user before each task. It hands the job what the prolog left for it, in
# TaskProlog's language: "print" lines (what was warmed, refused or failed, shown once, in
# the batch script's output) and "export" lines (BOOTSEER_CACHE_DIR: the user's cache,
# where the checkpoint was staged; the store; the trace), for every task.
# BOOTSEER_SLURM_STATE must match the site's `state` (default /run/bootseer/slurm).
notes="${BOOTSEER_SLURM_STATE:-/run/bootseer/slurm}/${SLURM_JOB_ID:-none}/task-prolog"
[ -f "$notes" ] || exit 0
if [ -z "${SLURM_STEP_ID:-}" ]; then    # the batch step: the notes go to the job's output
    cat "$notes"
else
    grep '^export ' "$notes"
fi
exit 0
