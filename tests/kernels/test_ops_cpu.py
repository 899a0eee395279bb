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


def test_stream_k_grid_larger_than_the_gpu_is_refused(monkeypatch):
    """A stream-K grid must fit the GPU at once (owners wait on later clusters): a config sized
    for 132 SMs on a 114-SM part is refused before anything launches."""
    import pytest

    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    monkeypatch.setattr(ops, "_num_sms", lambda index: 114)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    a = torch.empty(256, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="config.num_sms=132 with stream_k=True on a GPU with 114 SMs"):
        ops._launch(EpilogueSpec("store"), a, a, d_dtype=torch.bfloat16, config=GemmConfig(stream_k=True))
