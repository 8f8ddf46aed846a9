#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/bootseer-epilog.sh): node housekeeping after
# a job. A job's own bootseer processes took their mounts and servers with them; the next
# bootseer command on the node sweeps what a killed one left. Here the node's staged
# checkpoints and environments are kept under a size, least recently used first, never
# one a running job uses. Best effort, like the prolog: an epilog failure drains the node.
set -u
BOOTSEER=${BOOTSEER:-bootseer}
LOG=${BOOTSEER_PROLOG_LOG:-/var/log/bootseer/prolog.log}
KEEP=${BOOTSEER_NODE_KEEP:-50G}
mkdir -p "$(dirname "$LOG")"
say() { printf '%s job %s: %s\n' "$(date -u +%FT%TZ)" "${SLURM_JOB_ID:-?}" "$*" >>"$LOG"; }
for what in ckpt deps; do
    if "$BOOTSEER" "$what" gc --max-size "$KEEP" >>"$LOG" 2>&1; then
        say "epilog: $what gc done (keep $KEEP)"
    else
        say "epilog: $what gc failed (exit $?)"
    fi
done
exit 0
