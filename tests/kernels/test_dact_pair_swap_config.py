"""The gated dact's pair swap option (GemmConfig.dact_pair_swap) on the CPU: its name, where it
acts, and that the compile-only selfcheck builds the dact without it. Its GPU tests (bitwise
equal to the unswapped dact) are in test_dact_pair_swap_gpu.py."""

import pytest

from parallel_mlp.kernels.config import GemmConfig


def test_on_by_default_and_named_only_when_off():
    assert GemmConfig().dact_pair_swap
    assert GemmConfig(128, 128).key == "t128x128_c1x1_g8_sm132"
    assert GemmConfig(128, 128, dact_pair_swap=False).key == "t128x128_c1x1_g8_sm132_nops"
    assert GemmConfig(dact_prefetch=2, dact_pair_swap=False).key.endswith("_pf2_nops")


@pytest.mark.parametrize("act,kind,swaps", [
    ("swiglu", "dact", True), ("geglu", "dact", True), ("relu", "dact", False),
    ("swiglu", "act", False), (None, "store", False),
])
def test_only_the_gated_dact_takes_it(act, kind, swaps):
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.gemm_sm90 import PersistentGemmSm90

    spec = EpilogueSpec(kind, act) if act else EpilogueSpec(kind)
    k = PersistentGemmSm90(GemmConfig(128, 128), spec)
    assert k.dact_pair_swap
    assert (k.epi.kind == "dact" and k.epi.gated) == swaps


def test_selfcheck_compiles_the_unswapped_dact():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        off = [key for key in variants(quick) if not key.config.dact_pair_swap]
        assert off and all(key.epilogue.kind == "dact" and key.epilogue.gated for key in off)
        if not quick:
            assert {key.config.epi_n for key in off} == {16, 32}


@pytest.mark.parametrize("field", ["dact_pair_swap", "l2_prefetch", "stream_k"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_switches_take_booleans_only(field, value):
    with pytest.raises(ValueError, match=rf"{field}=.*must be True or False"):
        GemmConfig(**{field: value})
