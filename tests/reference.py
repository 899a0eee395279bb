"""An independent single-process MLP reference: plain torch ops and autograd, no parallel_mlp
code. Activations are written with torch.nn.functional where it has them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


GATED = {
    "swiglu": lambda g, u: F.silu(g) * u,
    "swiglu_oai": lambda g, u: g * torch.sigmoid(1.702 * g) * (u + 1),
    "reglu": lambda g, u: F.relu(g) * u,
    "geglu": lambda g, u: _gelu_tanh(g) * u,
    "geglu_erf": lambda g, u: F.gelu(g) * u,
    "glu": lambda g, u: torch.sigmoid(g) * u,
}
PLAIN = {
    "gelu_tanh_approx": _gelu_tanh,
    "gelu": F.gelu,
    "relu": F.relu,
    "relu_sq": lambda x: F.relu(x) ** 2,
}
NAMES = list(PLAIN) + list(GATED)


def is_gated(name: str) -> bool:
    return name in GATED


def act(name: str, preact: torch.Tensor) -> torch.Tensor:
    if name in GATED:
        return GATED[name](preact[..., 0::2], preact[..., 1::2])
    return PLAIN[name](preact)


def mlp(x, w1, w2, name, b1=None, b2=None):
    h = x @ w1.t()
    if b1 is not None:
        h = h + b1
    y = act(name, h) @ w2.t()
    return y if b2 is None else y + b2


def mlp_with_grads(x, w1, w2, name, b1=None, b2=None, dy=None, dtype=torch.float64):
    """Output and gradients of sum(y * dy) w.r.t. x, w1, b1, w2, b2, computed in ``dtype``."""
    leaves = [t.detach().to(dtype).requires_grad_() if t is not None else None
              for t in (x, w1, b1, w2, b2)]
    xr, w1r, b1r, w2r, b2r = leaves
    y = mlp(xr, w1r, w2r, name, b1r, b2r)
    y.backward(dy.to(dtype))
    grads = [t.grad if t is not None else None for t in leaves]
    return y.detach(), dict(zip(("x", "w1", "b1", "w2", "b2"), grads))
