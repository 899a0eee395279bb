"""Every activation's math, forward and derivative, written once.

Each formula is a plain function of its inputs and of a small math namespace ``m`` that supplies
the few primitives the formulas need (``tanh``, ``sigmoid``, ``relu``, ``step``, ``erf``, ``exp``). The reference
backend evaluates them with :data:`TORCH_MATH` on fp32 tensors; the CuTe kernels evaluate the very
same functions with a namespace of device intrinsics on fp32 registers. So there is one source of
truth per activation, and the kernels' device math is tested against this module.

Gated activations read an interleaved pre-activation: column ``2i`` is gate unit ``i`` and column
``2i + 1`` is up unit ``i`` (einops ``"... (h two)"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

# sqrt(2 / pi), the constant of the tanh approximation of GELU.
_GELU_C = math.sqrt(2.0 / math.pi)
# 1 / sqrt(2) and 1 / sqrt(2 pi), the constants of the exact (erf) GELU and its derivative.
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_A = 0.044715
# The sigmoid slope of OpenAI's SwiGLU variant (gpt-oss).
_OAI_ALPHA = 1.702


class TorchMath:
    """The primitives the formulas use, on torch tensors."""

    tanh = staticmethod(torch.tanh)
    sigmoid = staticmethod(torch.sigmoid)
    relu = staticmethod(torch.relu)
    erf = staticmethod(torch.erf)
    exp = staticmethod(torch.exp)

    @staticmethod
    def step(x):
        """1 where x > 0, else 0 (the derivative of relu; 0 at 0, as torch defines it)."""
        return (x > 0).to(x.dtype)


TORCH_MATH = TorchMath()


# ---- non-gated: f(x) and f'(x) -------------------------------------------------------------


# GELU's tanh approximation, 0.5 x (1 + tanh(u)) with u = C x (1 + A x^2), and its derivative
# 0.5 (1 + t) + 0.5 x (1 - t^2) C (1 + 3 A x^2), t = tanh(u). Written so that each step is one
# multiply or one multiply-add (the constants C A and 3 C A folded ahead): the epilogues evaluate
# them per element, and spelled as the textbook product they compiled to 15 floating-point
# instructions besides the tanh per element of the dact (sm_90a SASS, 2026-12-03), this way 11.
# Held on an H200 (bench configs --only fc1,dpost, gelu_tanh_approx, T=8192, 2026-12-03), the
# fused fc1 + act and the dact ran 1-3% faster (kernels/NOTES.md, "act" and "dact").


def _gelu_tanh_u(x, x2):
    return x * (_GELU_C + (_GELU_C * _GELU_A) * x2)


def gelu_tanh_approx(x, m):
    half_x = 0.5 * x
    return half_x + half_x * m.tanh(_gelu_tanh_u(x, x * x))


def gelu_tanh_approx_grad(x, m):
    x2 = x * x
    t = m.tanh(_gelu_tanh_u(x, x2))
    slope = _GELU_C + (3.0 * _GELU_C * _GELU_A) * x2
    return (0.5 * x) * (1.0 - t * t) * slope + (0.5 + 0.5 * t)


def gelu(x, m):
    """The exact GELU, x * Phi(x): torch's and Megatron's default ``F.gelu``, HF's ``"gelu"``."""
    return 0.5 * x * (1.0 + m.erf(_INV_SQRT2 * x))


def gelu_grad(x, m):
    # Phi(x) + x * phi(x), with phi the standard normal density.
    return 0.5 * (1.0 + m.erf(_INV_SQRT2 * x)) + x * (_INV_SQRT_2PI * m.exp(-0.5 * x * x))


def relu(x, m):
    return m.relu(x)


def relu_grad(x, m):
    return m.step(x)


def relu_sq(x, m):
    r = m.relu(x)
    return r * r


def relu_sq_grad(x, m):
    return 2.0 * m.relu(x)


# ---- gated: f(g, u) and (df/dg, df/du) -----------------------------------------------------


def swiglu(g, u, m):
    return g * m.sigmoid(g) * u


def swiglu_grad(g, u, m):
    s = m.sigmoid(g)
    silu = g * s
    return u * (s + silu * (1.0 - s)), silu


def swiglu_oai(g, u, m):
    return g * m.sigmoid(_OAI_ALPHA * g) * (u + 1.0)


def swiglu_oai_grad(g, u, m):
    s = m.sigmoid(_OAI_ALPHA * g)
    gs = g * s
    return (u + 1.0) * (s + _OAI_ALPHA * gs * (1.0 - s)), gs


def reglu(g, u, m):
    return m.relu(g) * u


def reglu_grad(g, u, m):
    return u * m.step(g), m.relu(g)


def geglu(g, u, m):
    return gelu_tanh_approx(g, m) * u


def geglu_grad(g, u, m):
    return u * gelu_tanh_approx_grad(g, m), gelu_tanh_approx(g, m)


def geglu_erf(g, u, m):
    return gelu(g, m) * u


def geglu_erf_grad(g, u, m):
    return u * gelu_grad(g, m), gelu(g, m)


def glu(g, u, m):
    return m.sigmoid(g) * u


def glu_grad(g, u, m):
    s = m.sigmoid(g)
    return u * s * (1.0 - s), s


# ---- torch's own spellings, for autograd ---------------------------------------------------
# The same functions written with torch's fused elementwise ops where it has one (a kernel each
# way, where the formula would launch one per term), evaluated in the tensors' own dtype: what a
# plain PyTorch MLP computes. The layer's small-step path (small_step.py) differentiates them with
# autograd. An activation without a fused op here is its formula on TORCH_MATH; tests check every
# spelling against the formula.


def _gelu_tanh_approx_eager(x):
    return F.gelu(x, approximate="tanh")


def _relu_sq_eager(x):
    return F.relu(x).square()


def _swiglu_eager(g, u):
    return F.silu(g) * u


def _reglu_eager(g, u):
    return F.relu(g) * u


def _geglu_eager(g, u):
    return F.gelu(g, approximate="tanh") * u


def _geglu_erf_eager(g, u):
    return F.gelu(g) * u


def _glu_eager(g, u):
    return torch.sigmoid(g) * u


@dataclass(frozen=True)
class GateOps:
    """The gate function of an ``a(g) * u`` activation as torch's fused ops: ``forward(g)`` is
    a(g), ``forward_into(out, g)`` writes it into ``out`` (aten's out variant, the same kernel:
    ``out`` may be a strided view), ``backward_into(grad, g)`` overwrites grad with grad * a'(g)
    (aten's ``*_backward`` out variant, which reads the input, not the output). What
    small_step's lean backward recomputes and differentiates with; tests check them against the
    formula."""

    forward: Callable
    forward_into: Callable
    backward_into: Callable


def _silu_into(out, g):
    torch.ops.aten.silu.out(g, out=out)


def _relu_into(out, g):
    # aten's relu is clamp_min(g, 0), whose out variant every supported torch has
    torch.clamp_min(g, 0, out=out)


def _gelu_tanh_into(out, g):
    torch.ops.aten.gelu.out(g, approximate="tanh", out=out)


def _gelu_into(out, g):
    torch.ops.aten.gelu.out(g, out=out)


def _silu_backward_into(grad, g):
    torch.ops.aten.silu_backward.grad_input(grad, g, grad_input=grad)


def _relu_backward_into(grad, g):
    torch.ops.aten.threshold_backward.grad_input(grad, g, 0, grad_input=grad)


def _gelu_tanh_backward_into(grad, g):
    torch.ops.aten.gelu_backward.grad_input(grad, g, approximate="tanh", grad_input=grad)


def _gelu_backward_into(grad, g):
    torch.ops.aten.gelu_backward.grad_input(grad, g, grad_input=grad)


def interleaved_pairs(preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) of an interleaved gated pre-activation ``[..., 2h]``, as two strided views of
    one ``[..., h, 2]`` view: no copy, and autograd's backward through them is a single stack."""
    return preact.unflatten(-1, (-1, 2)).unbind(-1)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """At least fp32: bf16/fp16 are computed in fp32 (as the kernels do), fp64 stays fp64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@dataclass(frozen=True)
class Activation:
    """One activation: its name, whether it is gated, and its formula and derivative.

    ``fn``/``grad`` take ``(x, m)`` when non-gated and ``(g, u, m)`` when gated; ``grad`` of a gated
    activation returns ``(df/dg, df/du)``. ``eager``, when given, is torch's fused spelling of
    ``fn`` (``(x)`` or ``(g, u)``, no namespace); see :meth:`autograd_forward`. ``gate``, for a
    gated activation of the form ``a(g) * u``, is a(g)'s fused ops (:class:`GateOps`).
    """

    name: str
    gated: bool
    fn: Callable
    grad: Callable
    eager: Callable | None = None
    gate: GateOps | None = None

    def autograd_forward(self, preact: torch.Tensor) -> torch.Tensor:
        """postact = act(preact) in preact's dtype, as torch ops that autograd differentiates
        (``eager``, else the formula on TORCH_MATH). Gated: the pairs read in place
        (``interleaved_pairs``)."""
        if self.gated:
            return self.autograd_gated(*interleaved_pairs(preact))
        return self.eager(preact) if self.eager else self.fn(preact, TORCH_MATH)

    def autograd_gated(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """A gated activation of separate gate and up tensors, as autograd_forward computes it."""
        return self.eager(g, u) if self.eager else self.fn(g, u, TORCH_MATH)

    def forward(self, preact: torch.Tensor) -> torch.Tensor:
        """postact = act(preact), computed in at least fp32, returned in preact's dtype.

        Gated: preact ``[..., 2h]`` interleaved, postact ``[..., h]``.
        """
        x = _upcast(preact)
        if self.gated:
            out = self.fn(x[..., 0::2], x[..., 1::2], TORCH_MATH)
        else:
            out = self.fn(x, TORCH_MATH)
        return out.to(preact.dtype)

    def backward(
        self, preact: torch.Tensor, dpostact: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dpreact, postact): the chain rule through act, and act recomputed, both in at least fp32.

        Gated: dpreact is ``[..., 2h]`` interleaved like preact.
        """
        x = _upcast(preact)
        dy = _upcast(dpostact)
        if self.gated:
            g, u = x[..., 0::2], x[..., 1::2]
            dg, du = self.grad(g, u, TORCH_MATH)
            dpreact = torch.stack((dg * dy, du * dy), dim=-1).flatten(-2)
            postact = self.fn(g, u, TORCH_MATH)
        else:
            dpreact = self.grad(x, TORCH_MATH) * dy
            postact = self.fn(x, TORCH_MATH)
        return dpreact.to(preact.dtype), postact.to(preact.dtype)


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation("gelu_tanh_approx", False, gelu_tanh_approx, gelu_tanh_approx_grad,
                   _gelu_tanh_approx_eager),
        Activation("gelu", False, gelu, gelu_grad, F.gelu),
        Activation("relu", False, relu, relu_grad, F.relu),
        Activation("relu_sq", False, relu_sq, relu_sq_grad, _relu_sq_eager),
        Activation("swiglu", True, swiglu, swiglu_grad, _swiglu_eager,
                   GateOps(F.silu, _silu_into, _silu_backward_into)),
        Activation("swiglu_oai", True, swiglu_oai, swiglu_oai_grad),
        Activation("reglu", True, reglu, reglu_grad, _reglu_eager,
                   GateOps(F.relu, _relu_into, _relu_backward_into)),
        Activation("geglu", True, geglu, geglu_grad, _geglu_eager,
                   GateOps(_gelu_tanh_approx_eager, _gelu_tanh_into,
                           _gelu_tanh_backward_into)),
        Activation("geglu_erf", True, geglu_erf, geglu_erf_grad, _geglu_erf_eager,
                   GateOps(F.gelu, _gelu_into, _gelu_backward_into)),
        Activation("glu", True, glu, glu_grad, _glu_eager),
    )
}


def get_activation(name: str) -> Activation:
    """Look up an activation by name, with an error that lists the valid names."""
    if isinstance(name, Activation):
        return name
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"activation={name!r} is not known; choose one of {sorted(ACTIVATIONS)}"
        ) from None
