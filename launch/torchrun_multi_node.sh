#!/usr/bin/env bash
# Start a script (by default the GPT pretraining example) across several machines with torchrun.
# Run this once on every node, with the same NNODES, MASTER_ADDR and MASTER_PORT and a distinct
# NODE_RANK (0 on the node whose address is MASTER_ADDR):
#
#   # node 0                                       # node 1
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 \    NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 \
#     launch/torchrun_multi_node.sh --steps 500      launch/torchrun_multi_node.sh --steps 500
#
# All arguments go to the script. The example puts every rank into one tensor-parallel group, so
# across nodes its all-reduces cross the network: fine for trying the launcher, but a real job keeps
# TP within a node (NVLink) and spreads data or pipeline parallelism across nodes.
#
# Environment:
#   NNODES          number of nodes (required)
#   NODE_RANK       this node's index, 0..NNODES-1 (required)
#   MASTER_ADDR     address of node 0, reachable from every node (required)
#   MASTER_PORT     a free TCP port on node 0 (default 29500)
#   NPROC_PER_NODE  ranks per node (default: the GPUs visible here, or 2 without CUDA)
#   SCRIPT, PYTHON  as in torchrun_single_node.sh
#
# NCCL: nothing is set here; NVLink multicast stays off unless you enable it yourself (leave
# NCCL_NVLS_ENABLE unset or 0 where multicast is not supported).
set -euo pipefail

: "${NNODES:?set NNODES to the number of nodes}"
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0..NNODES-1}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"
master_port="${MASTER_PORT:-29500}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="${SCRIPT:-$root/examples/pretrain_gpt.py}"
python="${PYTHON:-python}"

if [[ -n ${NPROC_PER_NODE:-} ]]; then
    nproc="$NPROC_PER_NODE"
else
    gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
    if [[ $gpus -gt 0 ]]; then nproc="$gpus"; else nproc=2; fi
fi

echo "node $NODE_RANK of $NNODES: launching $nproc rank(s) of $script," \
     "master $MASTER_ADDR:$master_port" >&2
exec "$python" -m torch.distributed.run \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$nproc" \
    --master-addr "$MASTER_ADDR" --master-port "$master_port" \
    "$script" "$@"
