"""Fused gradient accumulation (grad_accum.py) against autograd's own: the wgrad GEMMs add into
main_grad or an existing .grad in a full backward and where torch.autograd.grad asks for both
weights (as torch.cuda.make_graphed_callables captures a backward), and leave every buffer alone
in a backward that wants no weight gradient (backward(inputs=[x]), torch.autograd.grad(y, [x]))
or only one (whose gradient then comes back as autograd's own)."""

import pytest
import torch

import reference
from parallel_mlp import ParallelMLP

D, H = 12, 20


def make(**kw):
    torch.manual_seed(0)
    return ParallelMLP(D, H, activation="swiglu", backend="torch", fuse_grad_accum=True, **kw)


def reference_grads(mlp, x, dy):
    """fp64 gradients of x, W1 and W2 from the independent reference."""
    x64 = x.detach().double().requires_grad_()
    w1 = mlp.fc1.weight.detach().double().requires_grad_()
    w2 = mlp.fc2.weight.detach().double().requires_grad_()
    b1, b2 = (None if b is None else b.detach().double() for b in (mlp.fc1.bias, mlp.fc2.bias))
    reference.mlp(x64, w1, w2, "swiglu", b1, b2).backward(dy.double())
    return x64.grad, w1.grad, w2.grad


@pytest.mark.parametrize("how", ["backward", "autograd_grad_weights"])
@pytest.mark.parametrize("buffer", ["main_grad", "grad"])
def test_a_backward_of_the_weights_adds_into_the_buffer(buffer, how):
    mlp = make()
    x, dy = torch.randn(7, D, requires_grad=True), torch.randn(7, D)
    weights = (mlp.fc1.weight, mlp.fc2.weight)
    start = [torch.randn(w.shape) for w in weights]
    for w, s in zip(weights, start):
        if buffer == "main_grad":
            w.main_grad = s.clone()
        else:
            w.grad = s.clone()
    if how == "backward":
        mlp(x).backward(dy)
    else:  # the fused accumulation's dummy (None here) comes back instead of the gradient
        got = torch.autograd.grad(mlp(x), [x, *weights], dy, allow_unused=True)
        assert got[1] is None and got[2] is None
    _, g1, g2 = reference_grads(mlp, x, dy)
    for w, s, g in zip(weights, start, (g1, g2)):
        got = w.main_grad if buffer == "main_grad" else w.grad
        torch.testing.assert_close(got.double(), s.double() + g, rtol=1e-5, atol=1e-5)
        if buffer == "main_grad":
            assert w.grad is None  # no grad_added_to_main_grad attribute: nothing returned


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("buffer", ["main_grad", "grad"])
@pytest.mark.parametrize("how", ["backward_inputs", "autograd_grad_x", "autograd_grad_w1"])
def test_a_backward_without_the_weights_accumulation_leaves_the_buffers(buffer, how, bias):
    mlp = make(bias1=bias, bias2=bias)
    x, dy = torch.randn(2, 3, D, requires_grad=True), torch.randn(2, 3, D)
    weights = (mlp.fc1.weight, mlp.fc2.weight)
    for w in weights:
        setattr(w, buffer, torch.randn(w.shape))
    before = [getattr(w, buffer).clone() for w in weights]
    y = mlp(x)
    gx, g1, _ = reference_grads(mlp, x.reshape(-1, D), dy.reshape(-1, D))
    if how == "backward_inputs":
        y.backward(dy, inputs=[x])
        torch.testing.assert_close(x.grad.reshape(-1, D).double(), gx, rtol=1e-5, atol=1e-5)
    elif how == "autograd_grad_x":
        (got,) = torch.autograd.grad(y, [x], dy)
        torch.testing.assert_close(got.reshape(-1, D).double(), gx, rtol=1e-5, atol=1e-5)
    else:  # one weight's gradient asked for: returned as autograd returns one
        (got,) = torch.autograd.grad(y, [mlp.fc1.weight], dy)
        torch.testing.assert_close(got.double(), g1, rtol=1e-5, atol=1e-5)
    for w, b in zip(weights, before):
        assert torch.equal(getattr(w, buffer), b)
