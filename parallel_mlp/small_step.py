"""Steps too small for the fused path to pay: plain PyTorch autograd ops instead.

Below a few hundred GFLOP per fwd+bwd, the GPU finishes an MLP step's GEMMs sooner than the host
can issue them, and the step takes the host's time. The fused path's host time is Python: the
autograd function, its checks and six launches, and a backward that runs Python on autograd's
CUDA device thread (handing the GIL over and back). A plain ``F.linear -> activation -> F.linear``
costs the host less, because its backward is autograd's C++ nodes. Measured on one H200 (its VM
host), T=512 d=1024 swiglu h=2816, host µs per fwd+bwd: fused 793, eager 384
(`python -m parallel_mlp.bench host --step`, 2026-12-02); held steps of the shape sweep
(`python -m parallel_mlp.bench sweep`, 2026-12-01), fused time against eager's: 0.43-0.75x at
6-212 GFLOP per step, 0.90x at 425 GFLOP, 0.96-1.08x from 629 GFLOP up, where the GPU's work
outlasts the host's. So ``backend="auto"`` runs a step below ``MAX_FLOP`` as plain autograd ops.

Only where nothing else is asked of the fused path: one rank (no collective to run or hide),
default memory mode (``recompute=True`` promises to keep x alone), no fused gradient
accumulation (``fuse_grad_accum=True`` promises the weight gradient lands in ``main_grad`` in
place), CUDA tensors (the rule was measured there), and not under torch.compile (which runs the
fused function untraced, as it does at every size). What changes at those steps: autograd keeps
postact for fc2's weight gradient, as eager does (the fused path recomputes it), the activation
rounds in the tensors' dtype as eager's does, and a second backward through the step works.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .activations import Activation

# fwd+bwd FLOP of a step below which ``auto`` takes the plain ops: between the largest step
# measured slower fused (425 GFLOP, 0.90x eager) and the smallest measured as fast (629-831).
MAX_FLOP = 0.5e12


def step_flop(rows: int, in_features: int, fc1_rows: int, hidden: int, out_features: int) -> int:
    """FLOP of one fwd+bwd: fc1 and fc2 forward, each GEMM twice more in backward."""
    return 6 * rows * (in_features * fc1_rows + hidden * out_features)


def applies(rows: int, in_features: int, fc1_rows: int, hidden: int, out_features: int, *,
            device_type: str, backend: str, tp_size: int, recompute: bool,
            fuse_grad_accum: bool, compiling: bool) -> bool:
    """Whether a step with these sizes and options runs as plain autograd ops."""
    return (backend == "auto" and device_type == "cuda" and tp_size == 1 and not recompute
            and not fuse_grad_accum and not compiling
            and step_flop(rows, in_features, fc1_rows, hidden, out_features) < MAX_FLOP)


def small_step(x: torch.Tensor, w1: torch.Tensor, b1, w2: torch.Tensor, b2,
               act: Activation) -> torch.Tensor:
    """act(x @ w1.T + b1) @ w2.T + b2 on one rank, differentiated by autograd."""
    return F.linear(act.autograd_forward(F.linear(x, w1, b1)), w2, b2)
