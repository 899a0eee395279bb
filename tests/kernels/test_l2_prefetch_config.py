"""The l2_prefetch option's configuration (CPU): its name, and that the selfcheck compiles it for
every epilogue that reads global memory. GPU tests: test_l2_prefetch_gpu.py."""

from parallel_mlp.kernels.config import GemmConfig


def test_default_is_off_and_names_are_unchanged():
    assert GemmConfig().l2_prefetch is False
    assert GemmConfig(128, 256, 2, 1).key == "t128x256_c2x1_g8_sm132"


def test_prefetch_has_its_own_name():
    assert GemmConfig(l2_prefetch=True).key == "t128x256_c1x1_g8_sm132_l2pf"
    assert GemmConfig(dact_prefetch=2, l2_prefetch=True).key.endswith("_pf2_l2pf")


def test_selfcheck_compiles_the_prefetch_for_dact_and_accumulate():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        keys = [k for k in variants(quick) if k.config.l2_prefetch]
        assert {k.epilogue.kind for k in keys} == {"dact", "accumulate"}
