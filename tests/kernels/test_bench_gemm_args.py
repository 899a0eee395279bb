"""The GPU timing scripts' command lines (CPU): bench_gemm's `--also FIELD=VALUE` parsing and its
refusal of what is not a GemmConfig field, and host_overhead's message without a GPU."""

import pytest
import torch

from parallel_mlp.kernels.bench_gemm import _label, _parse_fields


def test_also_fields_are_typed_like_the_config():
    fields = _parse_fields("l2_prefetch=1,dact_prefetch=2,consumers=pingpong,max_stages=5")
    assert fields == {"l2_prefetch": True, "dact_prefetch": 2, "consumers": "pingpong", "max_stages": 5}
    assert _parse_fields("l2_prefetch=0") == {"l2_prefetch": False}
    assert _label(fields) == "l2_prefetch=True,dact_prefetch=2,consumers=pingpong,max_stages=5"


@pytest.mark.parametrize("bad", ["tile=128", "l2_prefetch", "max_stages=", "l2_prefetch=1,nope=2"])
def test_also_refuses_what_is_not_field_equals_value(bad):
    with pytest.raises(SystemExit, match="is not FIELD=VALUE with a GemmConfig field"):
        _parse_fields(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_host_overhead_needs_a_gpu():
    from parallel_mlp.kernels import host_overhead

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        host_overhead.main(["--calls", "1"])
