#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/bootseer-epilog.sh): node housekeeping after
# a job. A job's own bootseer processes took their mounts and servers with them; the next
# bootseer command on the node sweeps what a killed one left. Here the node cache (as
# root) and the job user's own area (as that user) are kept under the site's `keep` size,
# least recently used first, never what a running job uses, and the job's notes removed.
# Exits 0 unless the node is at fault (an epilog failure drains the node).
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec "${BOOTSEER:-bootseer}" slurm epilog
