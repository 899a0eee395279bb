"""The direct dact (GemmConfig.dact_direct) on the CPU: its name, the tiles it accepts, that it
stages nothing in shared memory (so the A/B ring takes what the epilogue gave up), that it reads
and writes global memory with 8-byte vectors, and that the selfcheck compiles it. Its GPU tests
(bitwise equal to the shared-memory dact) are in test_dact_direct_gpu.py."""

import pytest

from parallel_mlp.kernels.config import GemmConfig


def test_off_by_default_and_named_when_on():
    assert not GemmConfig().dact_direct
    assert GemmConfig(128, 128, dact_direct=True).key == "t128x128_c1x1_g8_sm132_dd"


@pytest.mark.parametrize("kw,rule", [
    (dict(tile_m=128, tile_n=256), "at most 96 accumulators per consumer thread \\(this tile: 128"),
    (dict(tile_m=64, tile_n=256), "this tile: 128"),
    (dict(tile_m=256, tile_n=64), "tile_m <= 128"),
    (dict(tile_m=128, tile_n=128, consumers="pingpong"), "consumers='cooperative'"),
])
def test_rejects_tiles_it_cannot_hold(kw, rule):
    with pytest.raises(ValueError, match=rf"dact_direct=True with .*{rule}"):
        GemmConfig(dact_direct=True, **kw)


@pytest.mark.parametrize("tile", [(128, 128), (128, 192), (64, 128), (128, 64), (64, 192)])
def test_accepts_cooperative_tiles_of_at_most_96_accumulators(tile):
    assert GemmConfig(*tile, dact_direct=True).dact_direct


@pytest.mark.parametrize("value", ["no", 0, None])
def test_takes_booleans_only(value):
    with pytest.raises(ValueError, match="dact_direct=.*must be True or False"):
        GemmConfig(dact_direct=value)


def _kernel(cfg, kind="dact", act="swiglu"):
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.gemm_sm90 import PersistentGemmSm90

    spec = EpilogueSpec(kind, act) if act else EpilogueSpec(kind)
    return PersistentGemmSm90(cfg, spec)


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_no_epilogue_channel_in_shared_memory(act):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    k = _kernel(GemmConfig(128, 128, dact_direct=True), act=act)
    assert k.dact_direct and not k.dpre_in_place
    assert set(k._channel_widths().values()) == {0}
    staged = _kernel(GemmConfig(128, 128), act=act)
    assert staged._channel_widths()["L"] > 0


@pytest.mark.parametrize("kind,act", [("act", "swiglu"), ("store", None), ("accumulate", None)])
def test_other_epilogues_ignore_it(kind, act):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    direct = _kernel(GemmConfig(128, 128, dact_direct=True), kind, act)
    plain = _kernel(GemmConfig(128, 128), kind, act)
    assert not direct.dact_direct
    assert direct._channel_widths() == plain._channel_widths()


def test_l2_prefetch_is_refused_for_the_direct_dact_only():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    cfg = GemmConfig(128, 128, dact_direct=True, l2_prefetch=True)
    with pytest.raises(ValueError, match="l2_prefetch with dact_direct"):
        _kernel(cfg)
    assert _kernel(cfg, "accumulate", None).prefetch_channel == "D"


def test_the_freed_shared_memory_goes_to_the_ab_ring(monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from test_stage_count import stages_of  # same directory: pytest puts it on sys.path

    spec = EpilogueSpec("dact", "swiglu")
    direct = KernelKey(spec, GemmConfig(128, 192, dact_direct=True), "bfloat16", "row", "col", "bfloat16")
    staged = KernelKey(spec, GemmConfig(128, 192), "bfloat16", "row", "col", "bfloat16")
    assert stages_of(direct, monkeypatch) > stages_of(staged, monkeypatch)


@pytest.mark.parametrize("act,width", [("swiglu", "v2.b32"), ("gelu_tanh_approx", "b32")])
def test_vector_loads_and_stores_in_the_ptx(act, width):
    """Gated: one 8-byte load of a pair's preact and one 8-byte store of its dpreact; not gated:
    4-byte ones; postact leaves as 4-byte pairs. No shared-memory epilogue stores, no TMA store."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import re

    from parallel_mlp.kernels.compile import KernelKey, compile_kernel
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    key = KernelKey(EpilogueSpec("dact", act), GemmConfig(128, 128, dact_direct=True), "bfloat16", "row", "col",
                    "bfloat16")
    ptx = compile_kernel(key, keep_ptx=True).artifacts.PTX
    # the access width: what follows ld.global / st.global and its cache qualifiers, if any
    loads = [m.split("global.")[-1] for m in re.findall(r"ld\.global\S*", ptx)]
    stores = [m.split("global.")[-1] for m in re.findall(r"st\.global\S*", ptx)]
    # 128x128 over 256 threads: 64 accumulators, 32 pairs per thread
    assert loads.count(width) == 32 and len(loads) == 32, loads
    assert stores.count(width) >= 32 and stores.count("b32") >= 32 and len(stores) == 64, stores
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx
    assert "stmatrix" not in ptx


def test_selfcheck_compiles_it():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        direct = [key for key in variants(quick) if key.config.dact_direct]
        assert direct and all(key.epilogue.kind == "dact" for key in direct)
        assert {key.epilogue.gated for key in direct} == {True, False}
