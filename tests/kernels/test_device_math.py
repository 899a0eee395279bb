"""Device math (the DEVICE_MATH namespace the epilogues evaluate the activations with).

On CPU: every activation's forward and derivative trace and compile for sm_90a with DEVICE_MATH
(the same formula functions the torch reference runs). On an sm_90 GPU the values are compared
with the torch reference in tests/kernels/test_ops_gpu.py (test_device_math_matches_reference and
every act/dact variant).
"""

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from parallel_mlp.activations import ACTIVATIONS  # noqa: E402

# Trace-only compile of a tiny kernel that runs each formula on DEVICE_MATH; lives in a module
# file because the DSL needs the source of what it compiles.
from parallel_mlp.kernels import math_probe  # noqa: E402


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_device_math_compiles(name):
    ptx = math_probe.compile_probe(name)
    assert ".target sm_90a" in ptx and ".entry" in ptx
    # every formula is straight-line fp32 arithmetic on device
    assert "mul.f32" in ptx or "mul.rn.f32" in ptx or "fma.rn.f32" in ptx or name.startswith("relu")


def _sm90():
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_device_math_values(name):
    """f and its derivative on device vs TorchMath, on values that cover both tails."""
    import torch

    from parallel_mlp.activations import TORCH_MATH

    A = ACTIVATIONS[name]
    x = torch.linspace(-12, 12, 1024, device="cuda")
    y = torch.randn(1024, device="cuda") * 3
    out = math_probe.run_probe(name, x, y)
    if A.gated:
        ref = [A.fn(x, y, TORCH_MATH), *A.grad(x, y, TORCH_MATH)]
    else:
        ref = [A.fn(x, TORCH_MATH), A.grad(x, TORCH_MATH)]
    for i, r in enumerate(ref):
        r = r.broadcast_to(x.shape) if torch.is_tensor(r) else torch.full_like(x, r)
        # fp32 on both sides; the device uses fast exp/tanh, so allow a few ulps plus 1e-4 absolute
        torch.testing.assert_close(out[:, i], r, rtol=1e-4, atol=1e-4)
