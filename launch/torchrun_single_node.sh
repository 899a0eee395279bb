#!/usr/bin/env bash
# Start a script (by default the GPT pretraining example) on one machine with torchrun, one process
# per GPU, or 2 CPU processes on gloo when there is no GPU. Every process is one tensor-parallel rank.
#
#   launch/torchrun_single_node.sh                    # all visible GPUs, or 2 CPU ranks
#   launch/torchrun_single_node.sh 4 --steps 200      # 4 ranks; the rest goes to the script
#   SCRIPT=my_train.py launch/torchrun_single_node.sh 8 --lr 3e-4
#
# Environment:
#   SCRIPT          the Python script to run (default: examples/pretrain_gpt.py of this repository)
#   PYTHON          the interpreter with torch and parallel_mlp installed (default: python)
#   NPROC_PER_NODE  ranks to start when no count is given as the first argument
#
# NCCL: this launcher sets no NCCL variables. In particular it never turns on NVLink SHARP /
# multicast; keep NCCL_NVLS_ENABLE unset or 0 on machines where multicast is not available.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="${SCRIPT:-$root/examples/pretrain_gpt.py}"
python="${PYTHON:-python}"

if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    nproc="$1"
    shift
elif [[ -n ${NPROC_PER_NODE:-} ]]; then
    nproc="$NPROC_PER_NODE"
else
    # GPUs that this process may use (honours CUDA_VISIBLE_DEVICES); 0 when CUDA is absent.
    gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
    if [[ $gpus -gt 0 ]]; then
        nproc="$gpus"
    else
        nproc=2
    fi
fi

echo "launching $nproc rank(s) of $script" >&2
# --standalone: a local rendezvous on a free port, so several jobs can share the machine.
exec "$python" -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node "$nproc" \
    "$script" "$@"
