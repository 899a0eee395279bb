"""The direct dact (GemmConfig.dact_direct) on the CPU: its name, the tiles it accepts, what it
stages in shared memory (cooperative: nothing, so the A/B ring takes what the epilogue gave up;
pingpong: the preact ring alone), that it reads and writes global memory with 8-byte vectors,
and that the selfcheck compiles it. Its GPU tests (bitwise equal to the staged dact) are in
test_dact_direct_gpu.py."""

import pytest

from parallel_mlp.kernels.config import GemmConfig


def test_off_by_default_and_named_when_on():
    assert not GemmConfig().dact_direct
    assert GemmConfig(128, 128, dact_direct=True).key == "t128x128_c1x1_g8_sm132_dd"


@pytest.mark.parametrize("kw,rule", [
    (dict(tile_m=128, tile_n=256), "at most 96 accumulators per consumer thread \\(this tile: 128"),
    (dict(tile_m=64, tile_n=256), "this tile: 128"),
    (dict(tile_m=256, tile_n=64), "tile_m <= 128"),
])
def test_rejects_cooperative_tiles_it_cannot_hold(kw, rule):
    with pytest.raises(ValueError, match=rf"dact_direct=True with .*{rule}"):
        GemmConfig(dact_direct=True, **kw)


@pytest.mark.parametrize("tile", [(128, 128), (128, 192), (64, 128), (128, 64), (64, 192)])
def test_accepts_cooperative_tiles_of_at_most_96_accumulators(tile):
    assert GemmConfig(*tile, dact_direct=True).dact_direct


@pytest.mark.parametrize("tile", [(128, 192), (128, 128), (192, 128), (64, 256)])
def test_accepts_every_pingpong_tile(tile):
    """Pingpong keeps its preact in the shared-memory ring: no register limit of its own."""
    assert GemmConfig(*tile, consumers="pingpong", dact_direct=True).dact_direct


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
    assert k.dact_direct and k.preact_in_registers and not k.dpre_in_place
    assert set(k._channel_widths().values()) == {0}
    staged = _kernel(GemmConfig(128, 128), act=act)
    assert staged._channel_widths()["L"] > 0


@pytest.mark.parametrize("act,width", [("swiglu", 32), ("gelu_tanh_approx", 16)])
@pytest.mark.parametrize("prefetch", [1, 2])
def test_pingpong_keeps_the_preact_ring_alone(act, width, prefetch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    cfg = GemmConfig(128, 192, 2, 1, 16, consumers="pingpong", dact_prefetch=prefetch, epi_n=16,
                     dact_direct=True)
    k = _kernel(cfg, act=act)
    assert k.dact_direct and not k.preact_in_registers and not k.dpre_in_place
    assert k._channel_widths() == {"D": 0, "P": 0, "H": 0, "X": 0, "L": width}
    assert k.l_ring == prefetch


@pytest.mark.parametrize("kind,act", [("act", "swiglu"), ("store", None), ("accumulate", None)])
def test_other_epilogues_ignore_it(kind, act):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    direct = _kernel(GemmConfig(128, 128, dact_direct=True), kind, act)
    plain = _kernel(GemmConfig(128, 128), kind, act)
    assert not direct.dact_direct
    assert direct._channel_widths() == plain._channel_widths()


def test_l2_prefetch_is_refused_where_preact_goes_to_registers():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    cfg = GemmConfig(128, 128, dact_direct=True, l2_prefetch=True)
    with pytest.raises(ValueError, match="l2_prefetch with dact_direct"):
        _kernel(cfg)
    assert _kernel(cfg, "accumulate", None).prefetch_channel == "D"
    pp = GemmConfig(128, 192, consumers="pingpong", dact_direct=True, l2_prefetch=True)
    assert _kernel(pp).prefetch_channel == "L"


def test_the_freed_shared_memory_goes_to_the_ab_ring(monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from test_stage_count import stages_of  # same directory: pytest puts it on sys.path

    spec = EpilogueSpec("dact", "swiglu")
    direct = KernelKey(spec, GemmConfig(128, 192, dact_direct=True), "bfloat16", "row", "col", "bfloat16")
    staged = KernelKey(spec, GemmConfig(128, 192), "bfloat16", "row", "col", "bfloat16")
    assert stages_of(direct, monkeypatch) > stages_of(staged, monkeypatch)


def predicated_stores(ptx: str, plain: int = 0) -> list[str]:
    """The access of every predicated global store in the PTX ("v2.b32", "b16", ...): a direct
    epilogue's are predicated instructions (store_global_if), not branches around a store. The
    PTX must hold `plain` global stores besides (e.g. stream-K's partial sums)."""
    import re

    stores = re.findall(r"(\S*)\s+st\.global\.(\S+)\s", ptx)
    predicated = [access for p, access in stores if p.startswith("@%p")]
    assert predicated and len(stores) - len(predicated) == plain, stores
    return predicated


@pytest.mark.parametrize("act,width,dpre", [("swiglu", "v2.b32", "v2.b32"), ("gelu_tanh_approx", "b32", "b32")])
def test_vector_loads_and_stores_in_the_ptx(act, width, dpre):
    """Gated: one 8-byte load of a pair's preact and one 8-byte store of its dpreact; not gated:
    4-byte ones; postact leaves as 4-byte pairs, every store a predicated instruction. No
    shared-memory epilogue stores, no TMA store."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import re

    from parallel_mlp.kernels.compile import KernelKey, compile_kernel
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    key = KernelKey(EpilogueSpec("dact", act), GemmConfig(128, 128, dact_direct=True), "bfloat16", "row", "col",
                    "bfloat16")
    ptx = compile_kernel(key, keep_ptx=True).artifacts.PTX
    # the access width: what follows ld.global and its cache qualifiers, if any
    loads = [m.split("global.")[-1] for m in re.findall(r"ld\.global\S*", ptx)]
    stores = predicated_stores(ptx)
    # 128x128 over 256 threads: 64 accumulators, 32 pairs per thread; the loads twice (a tile
    # inside the problem, one across its edge), the stores once
    assert loads.count(width) == 64 and len(loads) == 64, loads
    assert len(stores) == 64 and stores.count(dpre) >= 32 and stores.count("b32") >= 32, stores
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx
    assert "stmatrix" not in ptx


def test_pingpong_stores_from_registers_and_loads_preact_by_tma():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey, compile_kernel
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    cfg = GemmConfig(128, 192, 2, 1, 16, consumers="pingpong", dact_prefetch=2, epi_n=16, dact_direct=True)
    key = KernelKey(EpilogueSpec("dact", "swiglu"), cfg, "bfloat16", "row", "col", "bfloat16")
    ptx = compile_kernel(key, keep_ptx=True).artifacts.PTX
    stores = predicated_stores(ptx)
    # 128x192 over one warpgroup: 192 accumulators, 96 pairs per thread
    assert stores.count("v2.b32") == 96 and stores.count("b32") == 96 and len(stores) == 192, stores
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx and "stmatrix" not in ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx or "cp.async.bulk.tensor.2d.shared::cta.global" in ptx


def test_selfcheck_compiles_it():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        direct = [key for key in variants(quick) if key.config.dact_direct]
        assert direct and all(key.epilogue.kind == "dact" for key in direct)
        assert {key.epilogue.gated for key in direct} == {True, False}
        assert {key.config.consumers for key in direct} == {"cooperative", "pingpong"}
