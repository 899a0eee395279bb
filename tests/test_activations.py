"""The reference activation module against torch.nn.functional and autograd (fp64)."""

import pytest
import torch

import reference
from parallel_mlp import ACTIVATIONS, get_activation
from parallel_mlp.activations import TORCH_MATH


def test_every_activation_is_registered():
    assert sorted(ACTIVATIONS) == sorted(reference.NAMES)
    for name, act in ACTIVATIONS.items():
        assert act.gated == reference.is_gated(name)


@pytest.mark.parametrize("name", reference.NAMES)
def test_forward_matches_independent_formula(name):
    x = torch.randn(5, 12, dtype=torch.float64) * 3
    torch.testing.assert_close(ACTIVATIONS[name].forward(x), reference.act(name, x))


@pytest.mark.parametrize("name", reference.NAMES)
def test_derivative_matches_autograd(name):
    x = (torch.randn(7, 10, dtype=torch.float64) * 3).requires_grad_()
    dy_shape = (7, 5) if reference.is_gated(name) else (7, 10)
    dy = torch.randn(dy_shape, dtype=torch.float64)
    reference.act(name, x).backward(dy)
    dpreact, postact = ACTIVATIONS[name].backward(x.detach(), dy)
    torch.testing.assert_close(dpreact, x.grad)
    torch.testing.assert_close(postact, reference.act(name, x.detach()))


@pytest.mark.parametrize("name", ["swiglu", "glu"])
def test_gated_columns_are_interleaved(name):
    """Column 2i is gate unit i, 2i+1 its up unit: swapping a pair changes only that unit."""
    x = torch.randn(3, 8, dtype=torch.float64)
    swapped = x.clone()
    swapped[:, [2, 3]] = x[:, [3, 2]]
    a, b = ACTIVATIONS[name].forward(x), ACTIVATIONS[name].forward(swapped)
    assert torch.equal(a[:, [0, 2, 3]], b[:, [0, 2, 3]])
    assert not torch.allclose(a[:, 1], b[:, 1])


def test_low_precision_inputs_are_computed_in_fp32():
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    out = ACTIVATIONS["gelu_tanh_approx"].forward(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ACTIVATIONS["gelu_tanh_approx"].forward(x.float()).bfloat16())


def test_relu_step_is_zero_at_zero():
    assert TORCH_MATH.step(torch.tensor([0.0, -1.0, 2.0])).tolist() == [0.0, 0.0, 1.0]


def test_unknown_activation_names_the_choices():
    with pytest.raises(ValueError, match=r"activation='silu' is not known; choose one of"):
        get_activation("silu")
