#!/usr/bin/env bash
# One node of a torchrun job started through bootseer. Run this script once per node
# (by hand, pdsh, or your scheduler) with NODE_RANK, NNODES and MASTER_ADDR set.
#
# bootseer run overlaps image hot-block prefetch, the dependency snapshot restore and the
# checkpoint plan prefetch, then starts the node's torchrun inside the lazily loaded image:
# on the node's network (the rendezvous endpoint is reachable), the host's IPC, its hard
# nofile/memlock limits, every GPU (a CDI spec or the /dev/nvidia* nodes, docs/gpu.md) and
# /dev/infiniband. Each start is its own trace attempt (a start counter in the store).
set -euo pipefail
: "${NODE_RANK:?set NODE_RANK}" "${NNODES:?set NNODES}" "${MASTER_ADDR:?set MASTER_ADDR}"
IMAGE=${IMAGE:-registry.example.internal:5000/team/train:v3}
CKPT=${CKPT:-s3://checkpoints/run7/step-12000}
JOB_ID=${JOB_ID:-train-run7}

# The node cache and the store are shared settings: bootseer reads them from the node's
# /etc/bootseer/config.toml (BOOTSEER_SYSTEM_CONFIG names another).

exec bootseer run \
    --image "$IMAGE" \
    --deps /job/requirements.txt --prefix /opt/envs/train --python /usr/bin/python3.11 \
    --ckpt "$CKPT" --ckpt-target /ckpt \
    --trace /shared/traces --job-id "$JOB_ID" --node "$(hostname)" \
    --gpus all --bind /job:/job \
    -- torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node 8 \
       --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" /job/train.py --resume /ckpt
