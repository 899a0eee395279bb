"""TP metadata on parameters, in Megatron's attribute names, and the Muon reshape hooks.

Megatron-core and TP-aware optimizers read ``tensor_model_parallel``, ``partition_dim`` and
``partition_stride`` off each parameter; Megatron's DDP also reads ``allreduce`` (True: a dense,
not expert-parallel, parameter whose gradient is reduced over data parallelism) and its gradient
finalization ``sequence_parallel`` (True: a replicated parameter whose gradient is partial per TP
rank under sequence parallelism, summed over the TP group). Because our fc1 shards concatenate
along dim 0 to the global interleaved W1, a gated fc1 can also expose how to view it as separate
gate and up matrices: ``_muon_reshape_functions = (split, merge)``, so Muon orthogonalizes gate
and up on their own.
"""

from __future__ import annotations

import torch
from einops import rearrange

# The interleaved gated layout: row 2i is gate unit i, row 2i+1 is up unit i (of a weight
# [2h, d] or a bias [2h]). The one definition; the integrations' converters build on it.
GATED_ROWS = "(h two) ..."


def split_gate_up(w: torch.Tensor) -> torch.Tensor:
    """[2h, ...] interleaved -> [2, h, ...]: index 0 the gate rows, 1 the up rows (a view)."""
    return rearrange(w, f"{GATED_ROWS} -> two h ...", two=2)


def merge_gate_up(w: torch.Tensor) -> torch.Tensor:
    """[2, h, ...] -> [2h, ...] interleaved; the inverse of :func:`split_gate_up`."""
    return rearrange(w, f"two h ... -> {GATED_ROWS}", two=2)


def set_tp_metadata(param: torch.Tensor, partition_dim: int | None,
                    sequence_parallel: bool = False) -> None:
    """Mark ``param`` as split along ``partition_dim`` across TP ranks, or replicated if None;
    ``sequence_parallel`` marks a replicated parameter whose gradient is partial per rank."""
    param.tensor_model_parallel = partition_dim is not None
    param.partition_dim = -1 if partition_dim is None else partition_dim
    param.partition_stride = 1
    param.allreduce = True
    if partition_dim is None:
        param.sequence_parallel = bool(sequence_parallel)


def set_muon_hooks(param: torch.Tensor) -> None:
    param._muon_reshape_functions = (split_gate_up, merge_gate_up)
