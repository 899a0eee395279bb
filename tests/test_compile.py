"""torch.compile of a model around ParallelMLP, in every mode of the layer, on two gloo ranks:
the compiled model gives the eager model's outputs and gradients (the fused function runs between
compiled graphs; a LayerNorm before it and a square after it are compiled)."""

import shutil

import pytest
import torch

from dist_utils import run_distributed
from parallel_mlp import ParallelMLP

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="inductor on CPU needs a C++ compiler")

MODES = [dict(), dict(recompute=True), dict(sequence_parallel=True),
         dict(sequence_parallel=True, recompute=True),
         dict(sequence_parallel=True, fuse_grad_accum=True)]


def _compiled_equals_eager(rank, world):
    for mode in MODES:
        torch.manual_seed(0)
        mlp = ParallelMLP(16, 32, activation="swiglu", bias1=True, bias2=True, backend="torch", **mode)
        if mode.get("fuse_grad_accum"):
            for p in (mlp.fc1.weight, mlp.fc2.weight):
                p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
        model = torch.nn.Sequential(torch.nn.LayerNorm(16), mlp)
        x = torch.randn(8, 2, 16, requires_grad=True)

        def step(module):
            x.grad = None
            model.zero_grad()
            for p in (mlp.fc1.weight, mlp.fc2.weight):
                if hasattr(p, "main_grad"):
                    p.main_grad.zero_()
            y = module(x)
            y.square().sum().backward()
            grads = [getattr(p, "main_grad", p.grad) for p in (mlp.fc1.weight, mlp.fc2.weight)]
            return [y.detach(), x.grad, model[0].weight.grad, mlp.fc2.bias.grad] + [g.clone() for g in grads]

        want = step(model)
        compiled = torch.compile(model)
        for _ in range(2):  # the first call compiles, the second runs the cached graphs
            got = step(compiled)
            for i, (g, w) in enumerate(zip(got, want)):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m: f"{mode} [{i}]: {m}")


@needs_cxx
def test_torch_compile_in_every_mode_at_tp2():
    run_distributed(2, _compiled_equals_eager)
