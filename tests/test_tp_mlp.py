"""ParallelMLP on real gloo groups vs the independent fp64 single-process reference.

TP sizes 1, 2, 4 x all eight activations x {default, recompute} x {plain autograd, fused
main_grad, fused .grad}: output, dx and every rank's dW1/dW2/db1/db2 shard equal the matching slice
of the reference gradients summed over three micro-batches; recompute equals default bitwise.
"""

from __future__ import annotations

import pytest
import torch

import reference
from dist_utils import run_distributed
from parallel_mlp import ParallelMLP

# Awkward sizes: 3*7 = 21 tokens, in != out, per-rank hidden of 6 at TP=4.
BATCH, SEQ, D_IN, HIDDEN, D_OUT = 3, 7, 20, 24, 18
MICRO_BATCHES = 3
GRAD_MODES = ("plain", "main_grad", "grad")
# fp32 on the CPU against fp64: only rounding separates them.
RTOL, ATOL = 2e-5, 2e-6


def global_weights(activation: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = (2 if reference.is_gated(activation) else 1) * HIDDEN
    w1 = torch.randn(rows, D_IN, generator=g) / D_IN**0.5
    b1 = torch.randn(rows, generator=g) * 0.1
    w2 = torch.randn(D_OUT, HIDDEN, generator=g) / HIDDEN**0.5
    b2 = torch.randn(D_OUT, generator=g) * 0.1
    return w1, b1, w2, b2


def micro_batches(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, SEQ, D_IN, generator=g), torch.randn(BATCH, SEQ, D_OUT, generator=g))
            for _ in range(MICRO_BATCHES)]


def build(activation, rank, world, recompute, grad_mode, w1, b1, w2, b2):
    mlp = ParallelMLP(D_IN, HIDDEN, D_OUT, activation=activation, bias1=True, bias2=True,
                      recompute=recompute, fuse_grad_accum=grad_mode != "plain", backend="torch")
    rows, cols = w1.shape[0] // world, HIDDEN // world
    with torch.no_grad():  # slice by hand, as DESIGN.md defines the shards
        mlp.fc1.weight.copy_(w1[rank * rows:(rank + 1) * rows])
        mlp.fc1.bias.copy_(b1[rank * rows:(rank + 1) * rows])
        mlp.fc2.weight.copy_(w2[:, rank * cols:(rank + 1) * cols])
        mlp.fc2.bias.copy_(b2)
    if grad_mode == "main_grad":
        for p in (mlp.fc1.weight, mlp.fc2.weight):
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
            p.grad_added_to_main_grad = False
            p.zero_out_wgrad = True
    return mlp


def run_micro_batches(mlp, batches):
    outs, dxs, grad_ptrs = [], [], []
    for x, dy in batches:
        x = x.clone().requires_grad_()
        y = mlp(x)
        y.backward(dy)
        outs.append(y.detach())
        dxs.append(x.grad)
        grad_ptrs.append(mlp.fc1.weight.grad.data_ptr() if mlp.fc1.weight.grad is not None else None)
    return outs, dxs, grad_ptrs


def weight_grads(mlp, grad_mode):
    if grad_mode == "main_grad":
        return mlp.fc1.weight.main_grad, mlp.fc2.weight.main_grad
    return mlp.fc1.weight.grad, mlp.fc2.weight.grad


def close(name, got, want):
    torch.testing.assert_close(got, want.to(got.dtype), rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


def check_all_combinations(rank, world):
    batches = micro_batches()
    for activation in reference.NAMES:
        w1, b1, w2, b2 = global_weights(activation)
        refs = [reference.mlp_with_grads(x, w1, w2, activation, b1, b2, dy) for x, dy in batches]
        ref_grads = {k: sum(r[1][k] for r in refs) for k in ("w1", "b1", "w2", "b2")}
        rows, cols = w1.shape[0] // world, HIDDEN // world
        for grad_mode in GRAD_MODES:
            results = {}
            for recompute in (False, True):
                tag = f"{activation} tp={world} rank={rank} recompute={recompute} {grad_mode}"
                mlp = build(activation, rank, world, recompute, grad_mode, w1, b1, w2, b2)
                outs, dxs, ptrs = run_micro_batches(mlp, batches)
                for i, (ref_y, ref_g) in enumerate(refs):
                    close(f"{tag} y[{i}]", outs[i], ref_y)
                    close(f"{tag} dx[{i}]", dxs[i], ref_g["x"])
                gw1, gw2 = weight_grads(mlp, grad_mode)
                close(f"{tag} dW1 shard", gw1, ref_grads["w1"][rank * rows:(rank + 1) * rows])
                close(f"{tag} dW2 shard", gw2, ref_grads["w2"][:, rank * cols:(rank + 1) * cols])
                close(f"{tag} db1 shard", mlp.fc1.bias.grad, ref_grads["b1"][rank * rows:(rank + 1) * rows])
                close(f"{tag} db2", mlp.fc2.bias.grad, ref_grads["b2"])
                if grad_mode == "main_grad":
                    for p in (mlp.fc1.weight, mlp.fc2.weight):
                        assert p.main_grad.dtype == torch.float32
                        assert p.grad_added_to_main_grad is True, tag
                        # zero_out_wgrad: the dummy grads handed to autograd are zeros
                        assert p.grad is not None and not p.grad.any(), tag
                if grad_mode == "grad":
                    # first micro-batch makes .grad, later ones accumulate into that same buffer
                    assert ptrs[0] == ptrs[1] == ptrs[2], tag
                results[recompute] = (outs, dxs, gw1.clone(), gw2.clone(), mlp.fc1.bias.grad)
            default, recomputed = results[False], results[True]
            for a, b in zip(default, recomputed):
                for ta, tb in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
                    assert torch.equal(ta, tb), f"{activation} tp={world} {grad_mode}: recompute != default"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_parallel_mlp_matches_reference(world):
    run_distributed(world, check_all_combinations)


def test_single_process_without_distributed():
    """tp_group=None with torch.distributed uninitialized means TP size 1."""
    check_all_combinations(0, 1)
