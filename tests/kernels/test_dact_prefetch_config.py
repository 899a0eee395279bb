"""The dact_prefetch option's configuration (CPU): validation, names, and what the selfcheck
compiles. Its GPU tests are in test_ops_gpu.py (test_dact_in_place_*)."""

import pytest

from parallel_mlp.kernels.config import GemmConfig


def test_default_names_are_unchanged():
    assert GemmConfig().dact_prefetch == 1
    assert GemmConfig(128, 256, 2, 1).key == "t128x256_c2x1_g8_sm132"


@pytest.mark.parametrize("pf", [2, 3])
def test_deeper_prefetch_has_its_own_name(pf):
    assert GemmConfig(dact_prefetch=pf).key == f"t128x256_c1x1_g8_sm132_pf{pf}"


@pytest.mark.parametrize("pf", [0, 4, 8])
def test_prefetch_depth_outside_the_rule(pf):
    with pytest.raises(ValueError, match=r"dact_prefetch=.*must be 1, 2 or 3"):
        GemmConfig(dact_prefetch=pf)


def test_pingpong_preact_ring_has_one_or_two_slots():
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.gemm_sm90 import PersistentGemmSm90

    spec = EpilogueSpec("dact", "swiglu")
    for pf in (1, 2):
        k = PersistentGemmSm90(GemmConfig(128, 128, dact_prefetch=pf, consumers="pingpong"), spec)
        assert k.dpre_in_place and k.l_ring == pf
    with pytest.raises(ValueError, match="pingpong warpgroup's preact ring has 1 or 2 slots"):
        GemmConfig(128, 128, dact_prefetch=3, consumers="pingpong")


def test_selfcheck_compiles_in_place_dact():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        keys = [k for k in variants(quick) if k.config.dact_prefetch > 1]
        assert keys and all(k.epilogue.kind == "dact" for k in keys)
        assert {k.epilogue.gated for k in keys} == {True, False}
