"""The overlapped cooperative schedule's configuration (CPU): validation, names, the kernel's
preact ring, and what the selfcheck compiles. Its GPU tests are in test_overlap_gpu.py."""

import pytest

from parallel_mlp.kernels.config import OVERLAP_MAX_TILE_N, GemmConfig


def test_overlap_has_its_own_name():
    assert GemmConfig(128, 128, consumers="overlap").key == "t128x128_c1x1_g8_sm132_overlap"
    assert GemmConfig(128, 128, scheduler="dynamic", consumers="overlap").key.endswith("_dynamic_overlap")


@pytest.mark.parametrize("tile", [(128, 64), (128, 128)])
def test_overlap_accepts_128_row_tiles_up_to_its_width(tile):
    assert GemmConfig(*tile, consumers="overlap").consumers == "overlap"


@pytest.mark.parametrize("tile", [(128, 192), (128, 256), (64, 128), (256, 128)])
def test_overlap_rejects_tiles_whose_two_accumulator_sets_do_not_fit(tile):
    with pytest.raises(ValueError, match=f"tile_m == 128 and tile_n <= {OVERLAP_MAX_TILE_N}"):
        GemmConfig(*tile, consumers="overlap")


def test_overlap_rejects_stream_k():
    with pytest.raises(ValueError, match="stream-K needs consumers='cooperative'"):
        GemmConfig(128, 128, consumers="overlap", stream_k=True)


def test_overlapped_dact_writes_dpreact_in_place_over_a_ring_of_prefetch_plus_one():
    pytest.importorskip("cutlass")
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.gemm_sm90 import PersistentGemmSm90

    for pf in (1, 2, 3):
        k = PersistentGemmSm90(GemmConfig(128, 128, consumers="overlap", dact_prefetch=pf),
                               EpilogueSpec("dact", "swiglu"))
        assert k.overlap and k.dpre_in_place and k.l_ring == pf + 1 and k.num_mma_wg == 2
    plain = PersistentGemmSm90(GemmConfig(128, 128, consumers="overlap"), EpilogueSpec("store"))
    assert not plain.dpre_in_place


def test_selfcheck_compiles_overlap_variants():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        keys = [k for k in variants(quick) if k.config.consumers == "overlap"]
        kinds = {k.epilogue.kind for k in keys}
        assert {k.epilogue.gated for k in keys if k.epilogue.kind == "dact"} == {True, False}
        assert kinds == ({"dact"} if quick else {"dact", "act", "accumulate", "store"})
