#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/bootseer-prolog.sh, PrologFlags=Alloc so it
# runs when the allocation starts, before any task): warms this node for the job, so its
# tasks find the image's hot blocks, the environment and the checkpoint already local.
#
# The job says what to warm in its extra field or comment (sbatch --extra / --comment):
#     bootseer image=REF deps=REQUIREMENTS prefix=/opt/envs/train ckpt=URL
# Every step is best effort: a prolog that fails drains the node, and a cold start is only
# slower. Steps run in parallel, each bounded by BOOTSEER_PROLOG_TIMEOUT seconds.
set -u
BOOTSEER=${BOOTSEER:-bootseer}
LOG=${BOOTSEER_PROLOG_LOG:-/var/log/bootseer/prolog.log}
LIMIT=${BOOTSEER_PROLOG_TIMEOUT:-600}
mkdir -p "$(dirname "$LOG")"
say() { printf '%s job %s: %s\n' "$(date -u +%FT%TZ)" "${SLURM_JOB_ID:-?}" "$*" >>"$LOG"; }

settings="${SLURM_JOB_EXTRA:-}"
case "$settings" in bootseer\ *) ;; *) settings="${SLURM_JOB_COMMENT:-}" ;; esac
case "$settings" in bootseer\ *) ;; *) exit 0 ;; esac   # not a bootseer job

image="" deps="" prefix="" ckpt=""
for kv in ${settings#bootseer }; do
    case "$kv" in
        image=*) image=${kv#image=} ;;
        deps=*) deps=${kv#deps=} ;;
        prefix=*) prefix=${kv#prefix=} ;;
        ckpt=*) ckpt=${kv#ckpt=} ;;
        *) say "ignoring unknown setting '$kv'" ;;
    esac
done

step() {   # step NAME CMD...: run bounded, log the outcome, never fail the prolog
    local name=$1; shift
    local t0=$SECONDS
    if timeout "$LIMIT" "$@" >>"$LOG" 2>&1; then
        say "$name: done in $((SECONDS - t0)) s"
    else
        say "$name: failed (exit $?) after $((SECONDS - t0)) s; the job starts cold"
    fi
}

pids=()
[ -n "$image" ] && { step image "$BOOTSEER" image prefetch "$image" & pids+=($!); }
if [ -n "$deps" ]; then
    if [ -n "$prefix" ]; then
        step deps "$BOOTSEER" deps ensure "$deps" --prefix "$prefix" & pids+=($!)
    else
        say "deps: no prefix= given; skipped"
    fi
fi
[ -n "$ckpt" ] && { step ckpt "$BOOTSEER" ckpt prefetch "$ckpt" & pids+=($!); }
for p in "${pids[@]}"; do wait "$p"; done
exit 0
