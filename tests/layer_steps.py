"""A ParallelMLP on the GPU in one of its memory modes with a batch for it, as the GPU tests that
compare whole steps build them (the same seeds, so two runs of one test build the same step)."""

import torch

from parallel_mlp import ParallelMLP


def mlp_and_batch(tokens, d, h, activation, backend, mode):
    """(ParallelMLP in bf16 on CUDA, [W1, W2], x requiring grad, dy). ``mode``: "default",
    "recompute", or "main_grad" (fused fp32 gradient accumulation, each weight's main_grad
    zeroed)."""
    torch.manual_seed(7)
    mlp = ParallelMLP(d, h, activation=activation, recompute=mode == "recompute",
                      fuse_grad_accum=mode == "main_grad", backend=backend, device="cuda",
                      dtype=torch.bfloat16)
    params = [mlp.fc1.weight, mlp.fc2.weight]
    for p in params if mode == "main_grad" else ():
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(8)
    x = torch.randn(tokens, d, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    return mlp, params, x, dy
