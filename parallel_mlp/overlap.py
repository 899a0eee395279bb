"""Tensor-parallel communication overlapped with the GEMMs that feed or consume it
(``tp_comm_overlap``).

A GEMM whose input arrives over the wire, or whose output leaves over it, runs block of rows by
block of rows, and each block's transfer is issued on its own, so the wire and the tensor cores
work at the same time (what Megatron's ``tp_comm_overlap``, Transformer Engine's userbuffers and
PyTorch's async TP do):

- gather, then GEMM (sequence parallelism: x before fc1, dy before the dact): every rank's block
  is broadcast by its owner; each block's GEMM starts as soon as its rows are in, this rank's own
  block first, while the later blocks are still on the wire;
- GEMM, then reduce-scatter (sequence parallelism: fc2's output, dx): the GEMM runs one owner's
  block of rows at a time and each block is reduced onto its owner while the next is computed;
- GEMM, then all-reduce (replicated mode: fc2's output): the GEMM runs in blocks of whole tiles of
  rows and each block is all-reduced while the next is computed.

Collectives are issued in the same order on every rank (block 0, 1, ...), as NCCL requires.

Numerics. Each block's GEMM uses the kernel the whole GEMM would (the ops' ``whole_rows``), so
the GEMMs produce the unchunked GEMMs' bits, except where the whole GEMM would split its K loop
over the last wave (stream-K): blocks always run whole tiles; and where ``backend="auto"`` runs
the whole GEMM on cuBLAS (backends.cublas_runs), each block runs there too, and cuBLAS picks its
kernel for the block's own rows. The reductions are not the same
collectives (a reduce per block instead of one reduce-scatter, an all-reduce per block instead
of one all-reduce), so their p-way sums may round in another order: the outputs agree with the
unchunked path to the rounding of that sum, not bit for bit.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from .tp import Pending, TPGroup, device_backends

OPTIONS = (False, True, "auto")

# The all-reduce mode's blocks: about this many per GEMM, each a multiple of the largest tile's
# rows, and none when the GEMM is shorter than two of them.
ALL_REDUCE_BLOCKS = 4
TILE_ROWS = 256


def check_option(value) -> None:
    if value not in OPTIONS or not isinstance(value, (bool, str)):
        raise ValueError(f"tp_comm_overlap={value!r}: choose False, True or 'auto' (on where it "
                         f"can help: more than one rank, on NCCL)")


def enabled(value, tp: TPGroup, device_type: str) -> bool:
    """Whether to overlap: never on one rank (nothing to overlap); with ``"auto"`` only where
    the group runs this device's collectives on NCCL, on a stream of their own beside the GEMMs
    (gloo's block the host, so there is nothing to gain); with ``True`` on any backend (gloo
    included, for testing)."""
    check_option(value)
    if not value or tp.size == 1:
        return False
    if value == "auto":
        return device_backends(tp).get(device_type) == "nccl"
    return True


def _rows(i: int, m: int) -> slice:
    return slice(i * m, (i + 1) * m)


class RowsInFlight:
    """An all-gather of every rank's ``local [m, ...]`` in rank order (all_gather_rows), as one
    broadcast per owner, all issued at once: ``each(compute)`` calls ``compute(owner, rows,
    block)`` for each owner's block as soon as it has arrived, this rank's own block first;
    ``full`` is the gathered tensor."""

    def __init__(self, local: torch.Tensor, tp: TPGroup):
        p, r, m = tp.size, tp.rank, local.shape[0]
        self.tp, self.m = tp, m
        self.full = local.new_empty((p * m,) + tuple(local.shape[1:]))
        self.full[_rows(r, m)].copy_(local)
        self.handles = [dist.broadcast(self.full[_rows(q, m)], group=tp.group, async_op=True,
                                       src=dist.get_global_rank(tp.group, q)) for q in range(p)]

    def each(self, compute: Callable[[int, slice, torch.Tensor], None]) -> torch.Tensor:
        r, m = self.tp.rank, self.m
        compute(r, _rows(r, m), self.full[_rows(r, m)])
        for q, handle in enumerate(self.handles):
            handle.wait()
            if q != r:
                compute(q, _rows(q, m), self.full[_rows(q, m)])
        return self.full


class _Handles:
    """Several collectives' handles waited as one."""

    def __init__(self, handles):
        self.handles = list(handles)

    def wait(self):
        for h in self.handles:
            h.wait()


def gemm_reduce_scatter(a: torch.Tensor, b: torch.Tensor, tp: TPGroup, ops) -> Pending:
    """``reduce_scatter_rows(a @ b)``, block by block: owner q's rows of ``a @ b`` are computed
    and reduced onto q while owner q+1's are computed. Returns a Pending: wait() gives this
    rank's rows (the last reduce may still run behind whatever comes next)."""
    p, r = tp.size, tp.rank
    if a.shape[0] % p:
        raise ValueError(f"{a.shape[0]} rows do not split evenly over {p} ranks")
    m = a.shape[0] // p
    blocks, handles = [], []
    for q in range(p):
        block = ops.gemm(a[_rows(q, m)], b, whole_rows=a.shape[0])
        handles.append(dist.reduce(block, dst=dist.get_global_rank(tp.group, q), group=tp.group,
                                   async_op=True))
        blocks.append(block)
    return Pending(blocks[r], _Handles(handles))


def all_reduce_blocks(rows: int) -> list[slice]:
    """The row blocks of the all-reduce mode: about ALL_REDUCE_BLOCKS, whole multiples of
    TILE_ROWS, the last one taking the remainder; one block for short GEMMs."""
    if rows < 2 * TILE_ROWS:
        return [slice(0, rows)]
    step = max(TILE_ROWS, -(-rows // ALL_REDUCE_BLOCKS) // TILE_ROWS * TILE_ROWS)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def gemm_all_reduce(a: torch.Tensor, b: torch.Tensor, tp: TPGroup, ops) -> Pending:
    """``all_reduce(a @ b)``, block by block: each block of rows is all-reduced while the next
    one is computed. Returns a Pending of the whole result."""
    out = a.new_empty(a.shape[0], b.shape[1])
    handles = []
    for rows in all_reduce_blocks(a.shape[0]):
        ops.gemm(a[rows], b, out=out[rows], whole_rows=a.shape[0])
        handles.append(dist.all_reduce(out[rows], group=tp.group, async_op=True))
    return Pending(out, _Handles(handles))
