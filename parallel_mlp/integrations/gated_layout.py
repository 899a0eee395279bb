"""Our interleaved gated fc1 shard against the ``[all gate; all up]`` layout of Megatron-core and
Nanotron, in one place for every integration.

Their global gated fc1 is ``[gate (h rows); up (h rows)]`` and rank r of p holds ``[gate_r; up_r]``,
the r-th of p chunks of each. Our rank-r shard holds exactly the same units, interleaved: its gate
rows ``t[0::2]`` are chunk ``r`` of ``2p`` of their global (rows ``[r*h/p, (r+1)*h/p)``), its up rows
``t[1::2]`` chunk ``p + r``. So no data moves between ranks when converting, only rows within a
shard.
"""

from __future__ import annotations

import torch

from ..params import merge_gate_up, split_gate_up


def gate_rows(t: torch.Tensor) -> torch.Tensor:
    """The gate rows of an interleaved shard (a strided view)."""
    return split_gate_up(t)[0]


def up_rows(t: torch.Tensor) -> torch.Tensor:
    """The up rows of an interleaved shard (a strided view)."""
    return split_gate_up(t)[1]


def interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``[n, ...]`` gate and up rows -> ``[2n, ...]`` interleaved (gate unit i at row 2i)."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} rows must match")
    return merge_gate_up(torch.stack((gate, up)))


def from_blocks(t: torch.Tensor) -> torch.Tensor:
    """A ``[gate; up]`` block shard (Megatron's and Nanotron's per-rank layout) -> interleaved."""
    if t.shape[0] % 2:
        raise ValueError(f"a gated shard has an even number of rows, got {t.shape[0]}")
    gate, up = t.chunk(2, dim=0)
    return interleave(gate, up)


def to_blocks(t: torch.Tensor) -> torch.Tensor:
    """An interleaved shard -> ``[gate; up]`` blocks (their per-rank layout)."""
    return torch.cat((gate_rows(t), up_rows(t)), dim=0)


def global_blocks_to_shard(full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Their global ``[gate; up]`` -> our interleaved shard of rank ``rank`` of ``size``."""
    gate, up = full.chunk(2, dim=0)
    return interleave(gate.chunk(size)[rank], up.chunk(size)[rank])
