"""What the cute ops say on a machine where they cannot run."""

import torch

from parallel_mlp.kernels import ops


def test_unsupported_reason_cpu_tensor():
    r = ops.unsupported_reason(torch.randn(8, 8, dtype=torch.bfloat16))
    assert r and "CUDA" in r


def test_unsupported_reason_dtype():
    r = ops.unsupported_reason(dtype=torch.float64)
    assert r and "float64" in r


def test_unsupported_reason_shape_alignment():
    r = ops.unsupported_reason((8, 7), dtype=torch.bfloat16)
    assert r and "16 bytes" in r


def test_unsupported_reason_fp32_inputs_only():
    # fp32 is accepted as an output dtype, never as the only operand dtype
    r = ops.unsupported_reason(torch.randn(8, 8), torch.randn(8, 8))
    assert r is not None
