"""The direct act (GemmConfig.act_direct) on the CPU: its name, what it stages in shared memory
(nothing, so the A/B ring takes what the epilogue gave up), that its every global store is a
predicated register store of a whole pair (no stmatrix, no TMA store), the odd-N rule that
gives a non-gated act its staged twin, and that the selfcheck compiles it. Its GPU tests
(bitwise equal to the staged act) are in test_act_direct_gpu.py."""

import pytest

from parallel_mlp.kernels.config import GemmConfig

from test_dact_direct_config import predicated_stores  # same directory: pytest puts it on sys.path

PP = dict(tile_m=128, tile_n=192, cluster_m=2, raster_group=16, consumers="pingpong")


def test_off_by_default_and_named_when_on():
    assert not GemmConfig().act_direct
    assert GemmConfig(128, 128, act_direct=True).key == "t128x128_c1x1_g8_sm132_ad"
    assert GemmConfig(128, 128, dact_direct=True, act_direct=True).key.endswith("_dd_ad")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_takes_booleans_only(value):
    with pytest.raises(ValueError, match="act_direct=.*must be True or False"):
        GemmConfig(act_direct=value)


def _kernel(cfg, kind="act", act="swiglu", **spec):
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.gemm_sm90 import PersistentGemmSm90

    return PersistentGemmSm90(cfg, EpilogueSpec(kind, act, **spec) if act else EpilogueSpec(kind))


@pytest.mark.parametrize("cfg", [GemmConfig(128, 256, act_direct=True), GemmConfig(**PP, act_direct=True),
                                 GemmConfig(128, 128, stream_k=True, act_direct=True),
                                 GemmConfig(256, 128, 1, 2, act_direct=True)])
@pytest.mark.parametrize("act,spec", [("swiglu", {}), ("gelu_tanh_approx", {}),
                                      ("swiglu", dict(store_preact=False)),
                                      ("gelu_tanh_approx", dict(has_bias=True))])
def test_no_epilogue_channel_in_shared_memory(cfg, act, spec):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import dataclasses

    k = _kernel(cfg, act=act, **spec)
    assert k.act_direct
    assert set(k._channel_widths().values()) == {0}
    staged = _kernel(dataclasses.replace(cfg, act_direct=False), act=act, **spec)
    assert any(staged._channel_widths().values())


@pytest.mark.parametrize("kind,act", [("dact", "swiglu"), ("store", None), ("accumulate", None)])
def test_other_epilogues_ignore_it(kind, act):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    direct = _kernel(GemmConfig(**PP, act_direct=True), kind, act)
    plain = _kernel(GemmConfig(**PP), kind, act)
    assert not direct.act_direct
    assert direct._channel_widths() == plain._channel_widths()


@pytest.mark.parametrize("cfg", [GemmConfig(**PP), GemmConfig(128, 192, 2, 1)])
def test_the_freed_shared_memory_goes_to_the_ab_ring(cfg, monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import dataclasses

    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from test_stage_count import stages_of  # same directory: pytest puts it on sys.path

    spec = EpilogueSpec("act", "swiglu")
    direct = KernelKey(spec, dataclasses.replace(cfg, act_direct=True), "bfloat16", "row", "col", "bfloat16")
    staged = KernelKey(spec, cfg, "bfloat16", "row", "col", "bfloat16")
    assert stages_of(direct, monkeypatch) > stages_of(staged, monkeypatch)


def _ptx(spec, cfg, dtype="bfloat16"):
    from parallel_mlp.kernels.compile import KernelKey, compile_kernel

    bias = dtype if spec.has_bias else None
    return compile_kernel(KernelKey(spec, cfg, dtype, "row", "col", dtype, bias), keep_ptx=True).artifacts.PTX


# (activation, spec fields, config, stores per tile: {access: count})
# Gated: a pair's (gate, up) preact is one 4-byte store and its postact one 2-byte store at half
# the column; not gated: both 4-byte pairs. 128x128 cooperative: 32 pairs per thread; 128x192
# pingpong: 96; stream-K stores a tile from two places (a whole tile, an owner's).
PTX_CASES = {
    "coop gated": ("swiglu", {}, GemmConfig(128, 128, act_direct=True), {"b32": 32, "b16": 32}),
    "coop gelu": ("gelu_tanh_approx", {}, GemmConfig(128, 128, act_direct=True), {"b32": 64}),
    "coop postact alone": ("swiglu", dict(store_preact=False), GemmConfig(128, 128, act_direct=True), {"b16": 32}),
    "pingpong gated": ("swiglu", {}, GemmConfig(**PP, act_direct=True), {"b32": 96, "b16": 96}),
    "pingpong gelu bias": ("gelu_tanh_approx", dict(has_bias=True), GemmConfig(**PP, act_direct=True),
                           {"b32": 192}),
    "stream-K gated": ("swiglu", {}, GemmConfig(128, 128, stream_k=True, act_direct=True), {"b32": 64, "b16": 64}),
}


@pytest.mark.parametrize("case", list(PTX_CASES))
def test_every_store_is_a_predicated_register_store(case):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import collections

    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    act, fields, cfg, want = PTX_CASES[case]
    ptx = _ptx(EpilogueSpec("act", act, **fields), cfg)
    # stream-K's contributors store their fp32 partial sums, one per accumulator, unpredicated
    plain = cfg.tile_m * cfg.tile_n // 256 if cfg.stream_k else 0
    assert dict(collections.Counter(predicated_stores(ptx, plain))) == want
    assert "stmatrix" not in ptx and "cp.async.bulk.tensor.2d.global.shared" not in ptx


def test_odd_n_of_a_non_gated_act_takes_the_staged_twin():
    """ops._storable_config: only there would a whole pair cross the last column."""
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.ops import _storable_config

    direct = GemmConfig(**PP, act_direct=True)
    gelu, swiglu = EpilogueSpec("act", "gelu_tanh_approx"), EpilogueSpec("act", "swiglu")
    staged = _storable_config(direct, gelu, 1001)
    assert not staged.act_direct and staged.key == GemmConfig(**PP).key
    assert _storable_config(direct, gelu, 1000) is direct
    assert _storable_config(direct, swiglu, 1002) is direct
    assert _storable_config(direct, EpilogueSpec("store"), 1001) is direct
    assert _storable_config(GemmConfig(**PP), gelu, 1001).key == GemmConfig(**PP).key


def test_selfcheck_compiles_it():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        direct = [key for key in variants(quick) if key.config.act_direct]
        assert direct and all(key.epilogue.kind == "act" for key in direct)
        assert {key.epilogue.gated for key in direct} == {True, False}
        assert {key.config.consumers for key in direct} == {"cooperative", "pingpong"}
    full = [key for key in variants(False) if key.config.act_direct]
    assert any(key.config.stream_k for key in full) and any(key.epilogue.has_bias for key in full)
    assert any(not key.epilogue.store_preact for key in full) and any(key.ab_dtype == "float16" for key in full)


def test_an_odd_n_reaches_the_launch_as_the_staged_act(monkeypatch):
    """The odd-N rule where it acts: the plan ops launches (config and kernel key) for a
    non-gated act of N = 1001 is the staged twin's, for N = 1000 and a gated N the direct
    one's. The kernels stubbed out: what is checked is what reaches the launch."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import torch

    from parallel_mlp.bench.host_stub import stubbed_kernels
    from parallel_mlp.kernels import ops

    planned = []
    plan = ops._plan

    def record(*args, **kw):
        cfg, fn = plan(*args, **kw)
        planned.append((cfg.act_direct, fn.key.config.act_direct))
        return cfg, fn

    x = torch.zeros(256, 512, dtype=torch.bfloat16)
    direct = GemmConfig(**PP, act_direct=True)
    with stubbed_kernels():
        monkeypatch.setattr(ops, "_plan", record)
        for act, n in (("gelu_tanh_approx", 1001), ("gelu_tanh_approx", 1000), ("swiglu", 1002)):
            pre, post = ops.gemm_act(x, torch.zeros(512, n, dtype=torch.bfloat16), act, config=direct,
                                     checked=True)
            assert pre.shape == (256, n)
    assert planned == [(False, False), (True, True), (True, True)]
