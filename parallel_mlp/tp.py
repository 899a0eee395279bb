"""Tensor-parallel group handling and the collectives the MLP issues.

The fused MLP function calls these directly rather than through autograd mappings, because it
owns both passes: forward all-reduces fc2's partial output (Megatron's
``reduce_from_tensor_model_parallel_region``), backward all-reduces fc1's partial input gradient
(the backward of ``copy_to_tensor_model_parallel_region``), asynchronously, so that the dW1 GEMM
runs while it is on the wire.
"""

from __future__ import annotations

import pickle
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


def _collective_device(tp: TPGroup) -> torch.device:
    """NCCL moves only CUDA tensors; gloo takes CPU ones."""
    if dist.get_backend(tp.group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_objects(obj, tp: TPGroup) -> list:
    """Every rank's picklable ``obj``, in rank order (used for the one-time config check).

    Pickled into byte tensors by hand: ``dist.all_gather_object`` needs numpy, which is not one
    of our dependencies.
    """
    if tp.size == 1:
        return [obj]
    device = _collective_device(tp)
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(tp.size)]
    dist.all_gather(sizes, torch.tensor([payload.numel()], device=device), group=tp.group)
    longest = max(int(n.item()) for n in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    parts = [torch.empty_like(padded) for _ in range(tp.size)]
    dist.all_gather(parts, padded, group=tp.group)
    return [pickle.loads(bytes(p[: int(n.item())].cpu().tolist())) for p, n in zip(parts, sizes)]
