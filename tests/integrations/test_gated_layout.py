"""The translation between our interleaved gated shards and the [all gate; all up] layout of
Megatron-core and Nanotron (DESIGN.md, "Framework layouts")."""

import torch

from parallel_mlp import merge_gate_up
from parallel_mlp.integrations import gated_layout


def test_blocks_and_interleaved_are_inverse():
    t = torch.arange(24.0).reshape(6, 4)
    assert torch.equal(gated_layout.from_blocks(gated_layout.to_blocks(t)), t)
    assert torch.equal(gated_layout.to_blocks(gated_layout.from_blocks(t)), t)
    # row 2i of the interleaved shard is gate unit i, row 2i+1 up unit i
    blocks = torch.cat([torch.full((3, 2), 1.0), torch.full((3, 2), 2.0)])
    assert gated_layout.from_blocks(blocks)[:, 0].tolist() == [1, 2, 1, 2, 1, 2]


def test_their_rank_r_is_our_rank_r():
    """Rank r's shard taken from their global equals rank r's block of our global interleaved W1
    (which is merge_gate_up of the same gate and up), and their per-rank [gate_r; up_r] piece."""
    h, d = 12, 5
    gate, up = torch.randn(h, d), torch.randn(h, d)
    theirs = torch.cat([gate, up])                 # Megatron / Nanotron global
    ours = merge_gate_up(torch.stack([gate, up]))  # our global, interleaved
    for p in (1, 2, 3, 4):
        for r in range(p):
            shard = gated_layout.global_blocks_to_shard(theirs, r, p)
            assert torch.equal(shard, ours.chunk(p)[r])
            their_piece = torch.cat([gate.chunk(p)[r], up.chunk(p)[r]])
            assert torch.equal(gated_layout.to_blocks(shard), their_piece)
            assert torch.equal(gated_layout.from_blocks(their_piece), shard)


def test_biases_translate_like_rows():
    b = torch.arange(8.0)
    assert gated_layout.from_blocks(b).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
