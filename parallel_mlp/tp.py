"""Tensor-parallel group handling and the collectives the MLP issues.

The fused MLP function calls these directly rather than through autograd mappings, because it
owns both passes. With replicated input and output (Megatron's default):

- forward all-reduces fc2's partial output (``reduce_from_tensor_model_parallel_region``);
- backward all-reduces fc1's partial input gradient (the backward of
  ``copy_to_tensor_model_parallel_region``), asynchronously, while the dW1 GEMM runs.

With sequence parallelism, input and output are each rank's contiguous block of rows (dim 0):

- forward all-gathers x (``gather_from_sequence_parallel_region``) and reduce-scatters fc2's
  partial output (``reduce_scatter_to_sequence_parallel_region``);
- backward all-gathers dy (the backward of that reduce-scatter), re-gathers x for dW1 while the
  first GEMMs run, and reduce-scatters fc1's partial input gradient while the dW1 GEMM runs.

The gathers and scatters are the native single-tensor collectives (NCCL's all-gather and
reduce-scatter into one buffer; gloo has them too), never lists of per-rank tensors.
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
    elif not (dist.is_available() and isinstance(tp_group, dist.ProcessGroup)):
        raise TypeError(f"tp_group must be a torch.distributed ProcessGroup or None, got "
                        f"{type(tp_group).__name__} ({tp_group!r})")
    size = dist.get_world_size(tp_group)
    rank = dist.get_rank(tp_group)
    return TPGroup(tp_group if size > 1 else None, size, rank)


class Pending:
    """A collective in flight and the tensor it fills: ``wait()`` returns that tensor."""

    def __init__(self, result: torch.Tensor, handle=None):
        self.result, self.handle = result, handle

    def wait(self) -> torch.Tensor:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
        return self.result


def all_reduce(t: torch.Tensor, tp: TPGroup, async_op: bool = False):
    """Sum ``t`` in place across the TP group; with ``async_op`` returns a :class:`Pending`."""
    handle = None if tp.size == 1 else dist.all_reduce(t, group=tp.group, async_op=async_op)
    return Pending(t, handle) if async_op else None


# torch 2.13 renamed the single-tensor collectives (the old names warn); both are the same op.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_rows(t: torch.Tensor, tp: TPGroup, async_op: bool = False):
    """Every rank's ``t [m, ...]`` stacked along dim 0 in rank order: ``[p*m, ...]``.

    Returns the tensor, or a :class:`Pending` with ``async_op``. Every rank's ``t`` must have the
    same shape (the sequence-parallel rule: equal slices)."""
    if tp.size == 1:
        return Pending(t) if async_op else t
    out = t.new_empty((tp.size * t.shape[0],) + tuple(t.shape[1:]))
    handle = _all_gather_single(out, t.contiguous(), group=tp.group, async_op=async_op)
    return Pending(out, handle) if async_op else out


def reduce_scatter_rows(t: torch.Tensor, tp: TPGroup, async_op: bool = False):
    """The sum over ranks of ``t [p*m, ...]``, of which this rank keeps rows ``[r*m, (r+1)*m)``.

    Returns the tensor, or a :class:`Pending` with ``async_op``."""
    if tp.size == 1:
        return Pending(t) if async_op else t
    if t.shape[0] % tp.size:
        raise ValueError(f"reduce_scatter_rows: {t.shape[0]} rows do not split evenly over "
                         f"{tp.size} ranks")
    out = t.new_empty((t.shape[0] // tp.size,) + tuple(t.shape[1:]))
    handle = _reduce_scatter_single(out, t.contiguous(), group=tp.group, async_op=async_op)
    return Pending(out, handle) if async_op else out


def allreduce_sequence_parallel_grads(module: torch.nn.Module, tp_group=None) -> None:
    """Sum, over the TP group, the gradients of ``module``'s parameters marked
    ``sequence_parallel = True`` (fc2's replicated bias under sequence parallelism: each rank's
    gradient covers only its own tokens).

    Megatron-core does this itself (``finalize_model_grads``); call it in a plain PyTorch loop
    after backward and before the optimizer step. Gradients held in ``main_grad`` are summed there.
    """
    tp = tp_group if isinstance(tp_group, TPGroup) else resolve_group(tp_group)
    if tp.size == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in module.parameters():
        if getattr(p, "sequence_parallel", False):
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is not None:
                by_dtype.setdefault(g.dtype, []).append(g)
    for grads in by_dtype.values():  # one collective per dtype
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=tp.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def all_gather_cat(t: torch.Tensor, tp: TPGroup, dim: int) -> torch.Tensor:
    """Every rank's ``t`` concatenated along ``dim`` in rank order (rank r's shard at slice r)."""
    if tp.size == 1:
        return t.clone()
    parts = [torch.empty_like(t) for _ in range(tp.size)]
    dist.all_gather(parts, t.contiguous(), group=tp.group)
    return torch.cat(parts, dim=dim)


def device_backends(tp: TPGroup) -> dict[str, str]:
    """The group's backend per device type: {"cuda": "nccl"} for an NCCL group, {"cpu": "gloo",
    "cuda": "nccl"} for init_process_group() without a backend on a GPU machine (whose
    get_backend() says "undefined"), {"cpu": "gloo", "cuda": "gloo"} for gloo."""
    return dict(part.split(":") for part in dist.get_backend_config(tp.group).split(","))


def _collective_device(tp: TPGroup) -> torch.device:
    """CPU tensors where the group has a CPU backend (gloo), else CUDA ones (NCCL alone)."""
    if "cpu" in device_backends(tp):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


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
