"""tp_comm_overlap: the GEMMs run block by block beside their collectives (parallel_mlp.overlap).

On real gloo groups at TP 2 and 4, sequence-parallel and replicated, default and recompute, with
and without biases, over two micro-batches with fused main-grad accumulation: the overlapped
layer equals the plain one and the fp64 reference. The option's rules and the block arithmetic.
"""

from __future__ import annotations

import pytest
import torch

import reference
from dist_utils import run_distributed
from parallel_mlp import ParallelMLP, overlap
from parallel_mlp.tp import TPGroup, device_backends

D, H, D_OUT, SEQ, BATCH = 20, 24, 12, 8, 3


def close(name, got, want):
    atol = 4e-7 * max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want.to(got.dtype), rtol=2e-5, atol=atol,
                               msg=lambda m: f"{name}: {m}")


def _build(activation, sp, recompute, bias, overlapped, w1, b1, w2, b2, rank, world):
    mlp = ParallelMLP(D, H, D_OUT, activation=activation, bias1=bias, bias2=bias,
                      sequence_parallel=sp, recompute=recompute, fuse_grad_accum=True,
                      backend="torch", tp_comm_overlap=overlapped)
    rows, cols = w1.shape[0] // world, H // world
    with torch.no_grad():
        mlp.fc1.weight.copy_(w1[rank * rows:(rank + 1) * rows])
        mlp.fc2.weight.copy_(w2[:, rank * cols:(rank + 1) * cols])
        if bias:
            mlp.fc1.bias.copy_(b1[rank * rows:(rank + 1) * rows])
            mlp.fc2.bias.copy_(b2)
    for p in (mlp.fc1.weight, mlp.fc2.weight):
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
    return mlp


def _overlap_equals_plain(rank, world):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(SEQ, BATCH, D, generator=g), torch.randn(SEQ, BATCH, D_OUT, generator=g))
               for _ in range(2)]
    s = SEQ // world
    for activation in ("swiglu", "gelu", "relu_sq"):
        rows = (2 if reference.is_gated(activation) else 1) * H
        w1, b1 = torch.randn(rows, D, generator=g) / D**0.5, torch.randn(rows, generator=g) * 0.1
        w2, b2 = torch.randn(D_OUT, H, generator=g) / H**0.5, torch.randn(D_OUT, generator=g) * 0.1
        for sp in (True, False):
            mine = slice(rank * s, (rank + 1) * s) if sp else slice(None)
            for recompute in (False, True):
                for bias in (True, False):
                    tag = f"{activation} sp={sp} recompute={recompute} bias={bias} tp={world}"
                    runs = {}
                    for overlapped in (False, True):
                        mlp = _build(activation, sp, recompute, bias, overlapped, w1, b1, w2, b2, rank, world)
                        outs = []
                        for x, dy in batches:
                            xs = x[mine].clone().requires_grad_()
                            y = mlp(xs)
                            y.backward(dy[mine])
                            outs += [y.detach(), xs.grad]
                        outs += [mlp.fc1.weight.main_grad, mlp.fc2.weight.main_grad]
                        runs[overlapped] = outs
                    for i, (a, b) in enumerate(zip(runs[True], runs[False])):
                        close(f"{tag} [{i}] overlap vs plain", a, b)
                    ref_y, ref = reference.mlp_with_grads(batches[0][0], w1, w2, activation,
                                                          b1 if bias else None, b2 if bias else None,
                                                          batches[0][1])
                    close(f"{tag} y vs reference", runs[True][0], ref_y[mine])
                    close(f"{tag} dx vs reference", runs[True][1], ref["x"][mine])


@pytest.mark.parametrize("world", [2, 4])
def test_overlapped_layer_equals_the_plain_one_and_the_reference(world):
    run_distributed(world, _overlap_equals_plain)


def _auto_is_off_on_gloo(rank, world):
    from parallel_mlp.tp import resolve_group

    tp = resolve_group(None)
    assert device_backends(tp) == {"cpu": "gloo", "cuda": "gloo"}
    for device_type in ("cpu", "cuda"):  # gloo blocks the host: nothing to overlap
        assert overlap.enabled("auto", tp, device_type) is False
    assert overlap.enabled(True, tp, "cpu") is True
    assert overlap.enabled(False, tp, "cpu") is False


def test_auto_turns_overlap_off_on_gloo():
    run_distributed(2, _auto_is_off_on_gloo)


@pytest.mark.parametrize("config,on_cuda", [("cuda:nccl", True), ("cpu:gloo,cuda:nccl", True),
                                              ("cpu:gloo,cuda:gloo", False), ("cpu:gloo", False)])
def test_auto_follows_the_backend_of_the_tensors_device(monkeypatch, config, on_cuda):
    """init_process_group() without a backend makes a group whose get_backend() is "undefined"
    but whose CUDA collectives run on NCCL: "auto" overlaps CUDA tensors there."""
    monkeypatch.setattr(torch.distributed, "get_backend_config", lambda group=None: config)
    two = TPGroup(object(), 2, 0)
    assert overlap.enabled("auto", two, "cuda") is on_cuda
    assert overlap.enabled("auto", two, "cpu") is False


def test_option_rules():
    one = TPGroup(None, 1, 0)
    assert overlap.enabled(True, one, "cuda") is False and overlap.enabled("auto", one, "cuda") is False
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match=r"tp_comm_overlap=.*: choose False, True or 'auto'"):
            overlap.check_option(bad)
    with pytest.raises(ValueError, match="tp_comm_overlap='on'"):
        ParallelMLP(8, 16, tp_comm_overlap="on")
    assert "tp_comm_overlap='auto'" in repr(ParallelMLP(8, 16, tp_comm_overlap="auto"))


def test_all_reduce_blocks_are_whole_tiles_covering_every_row():
    for rows in (1, 300, 511, 512, 1000, 8192, 8191, 65536):
        blocks = overlap.all_reduce_blocks(rows)
        assert blocks[0].start == 0 and blocks[-1].stop == rows
        assert all(a.stop == b.start for a, b in zip(blocks, blocks[1:]))
        assert all((b.stop - b.start) % overlap.TILE_ROWS == 0 for b in blocks[:-1])
        assert len(blocks) <= overlap.ALL_REDUCE_BLOCKS
        assert len(blocks) == 1 or rows >= 2 * overlap.TILE_ROWS
