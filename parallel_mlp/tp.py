"""Tensor-parallel group handling and the collectives the MLP issues.

The fused MLP function calls these directly rather than through autograd mappings, because it
owns both passes: forward all-reduces fc2's partial output (Megatron's
``reduce_from_tensor_model_parallel_region``), backward all-reduces fc1's partial input gradient
(the backward of ``copy_to_tensor_model_parallel_region``), asynchronously, so that the dW1 GEMM
runs while it is on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """A resolved TP group: the process group (None when TP size is 1), its size and our rank."""

    group: dist.ProcessGroup | None
    size: int
    rank: int


def resolve_group(tp_group: dist.ProcessGroup | None) -> TPGroup:
    """``tp_group=None`` means the default group when torch.distributed is initialized, else TP=1."""
    if tp_group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return TPGroup(None, 1, 0)
        tp_group = dist.group.WORLD
    size = dist.get_world_size(tp_group)
    rank = dist.get_rank(tp_group)
    return TPGroup(tp_group if size > 1 else None, size, rank)


def all_reduce(t: torch.Tensor, tp: TPGroup, async_op: bool = False):
    """Sum ``t`` in place across the TP group; with ``async_op`` returns a handle to ``wait()``."""
    if tp.size == 1:
        return None
    return dist.all_reduce(t, group=tp.group, async_op=async_op)


def all_gather_cat(t: torch.Tensor, tp: TPGroup, dim: int) -> torch.Tensor:
    """Every rank's ``t`` concatenated along ``dim`` in rank order (rank r's shard at slice r)."""
    if tp.size == 1:
        return t.clone()
    parts = [torch.empty_like(t) for _ in range(tp.size)]
    dist.all_gather(parts, t.contiguous(), group=tp.group)
    return torch.cat(parts, dim=dim)


def all_gather_objects(obj, tp: TPGroup) -> list:
    """Every rank's picklable ``obj``, in rank order (used for the one-time config check)."""
    if tp.size == 1:
        return [obj]
    out = [None] * tp.size
    dist.all_gather_object(out, obj, group=tp.group)
    return out
