"""What the activation epilogues' device math compiles to, without a GPU: the special-function
ops per element (a tile's epilogue cost is dominated by them and by its memory traffic) and no
IEEE division's slow path. A DSL upgrade or a formula edit that changes either shows up here
before any timing does."""

import re

import pytest

pytest.importorskip("cutlass")

# cooperative 128x128: two consumer warpgroups, 256 threads, 64 accumulator values each
VALUES_PER_THREAD = 128 * 128 // 256

# fp32 special-function ops, and fp32 division in any rounding (the index math's integer
# divisions are not counted)
OPS = {"tanh.approx.f32": r"tanh\.approx\.f32", "ex2.approx": r"ex2\.approx", "rcp.approx": r"rcp\.approx",
       "div.f32": r"div(\.\w+)*\.f32"}


def _ops(act: str, kind: str) -> dict[str, int]:
    from parallel_mlp.kernels.compile import KernelKey, kernel_ptx
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    b_major = "row" if kind == "act" else "col"  # fc1's W1 and the dact's W2, as ParallelMLP passes them
    key = KernelKey(EpilogueSpec(kind, act), GemmConfig(128, 128, 1, 1, 8), "bfloat16", "row", b_major,
                    "bfloat16")
    ptx = kernel_ptx(key)
    return {name: len(re.findall(pattern, ptx)) for name, pattern in OPS.items()}


@pytest.mark.parametrize("kind", ["act", "dact"])
def test_gelu_tanh_approx_takes_one_tanh_per_element(kind):
    # the act and the dact (its derivative and the recomputed postact) share one tanh.approx
    ops = _ops("gelu_tanh_approx", kind)
    assert ops == {"tanh.approx.f32": VALUES_PER_THREAD, "ex2.approx": 0, "rcp.approx": 0, "div.f32": 0}


@pytest.mark.parametrize("kind", ["act", "dact"])
def test_swiglu_takes_one_sigmoid_per_pair(kind):
    # sigmoid = rcp.approx(1 + ex2.approx(...)), once per (gate, up) pair: the act's tile holds
    # interleaved pairs (32 per thread), the dact's tile counts hidden units (64 pairs per thread)
    pairs = VALUES_PER_THREAD // 2 if kind == "act" else VALUES_PER_THREAD
    ops = _ops("swiglu", kind)
    assert ops == {"tanh.approx.f32": 0, "ex2.approx": pairs, "rcp.approx": pairs, "div.f32": 0}


@pytest.mark.parametrize("kind", ["act", "dact"])
def test_exact_gelu_keeps_the_accurate_erf(kind):
    # erf's accurate lowering (one ex2 inside, no tanh.approx); the dact adds the normal pdf's exp
    ops = _ops("gelu", kind)
    per_value = 1 if kind == "act" else 2
    assert ops == {"tanh.approx.f32": 0, "ex2.approx": per_value * VALUES_PER_THREAD, "rcp.approx": 0,
                   "div.f32": 0}
