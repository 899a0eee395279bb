"""How many A/B stages a kernel's shared memory holds (CPU, compile-only): GemmConfig.max_stages
caps it, and the pingpong dact keeps the 5 that a 128x128 pingpong tile needs (H200: 3 stages
ran 32% slower than 6, 5 even)."""

import pytest

from parallel_mlp.kernels.config import GemmConfig


def test_max_stages_rule_and_name():
    assert GemmConfig().max_stages == 8 and GemmConfig().key == "t128x256_c1x1_g8_sm132"
    assert GemmConfig(max_stages=3).key == "t128x256_c1x1_g8_sm132_st3"
    for bad in (1, 9):
        with pytest.raises(ValueError, match=r"max_stages=.*must be 2 to 8"):
            GemmConfig(max_stages=bad)


def stages_of(key, monkeypatch):
    """Compile `key` for sm_90a and return the A/B stage count its shared storage was laid out with."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from parallel_mlp.kernels import gemm_sm90
    from parallel_mlp.kernels.compile import compile_kernel

    seen = []
    layout = gemm_sm90.PersistentGemmSm90._smem_layouts

    def record(self, *args):
        layout(self, *args)
        seen.append(self.ab_stages)

    monkeypatch.setattr(gemm_sm90.PersistentGemmSm90, "_smem_layouts", record)
    compile_kernel(key)
    return seen[-1]


@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_pingpong_dact_keeps_five_stages(act, monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    cfg = GemmConfig(128, 128, 2, 1, 16, consumers="pingpong")
    key = KernelKey(EpilogueSpec("dact", act), cfg, "bfloat16", "row", "col", "bfloat16")
    assert stages_of(key, monkeypatch) >= 5


def test_max_stages_caps_the_ring(monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    spec = EpilogueSpec("store")
    full = KernelKey(spec, GemmConfig(128, 128, consumers="pingpong"), "bfloat16", "row", "row", "bfloat16")
    capped = KernelKey(spec, GemmConfig(128, 128, consumers="pingpong", max_stages=3), "bfloat16", "row", "row", "bfloat16")
    assert stages_of(full, monkeypatch) == 6
    assert stages_of(capped, monkeypatch) == 3


def test_epi_n_rule_and_name():
    assert GemmConfig(epi_n=16).key == "t128x256_c1x1_g8_sm132_e16"
    with pytest.raises(ValueError, match="epi_n=8: must be 16 or 32"):
        GemmConfig(epi_n=8)


@pytest.mark.parametrize(
    "cfg,kind,want",
    [
        # 256x128 cooperative: 48 KB stages; a 256 x 32 D pair leaves 3, a 256 x 16 pair 4
        (GemmConfig(256, 128, 1, 2), "store", 3),
        (GemmConfig(256, 128, 1, 2, epi_n=16), "store", 4),
        # the pingpong dact's second preact slot per warpgroup: 4 stages at 32 columns, 5 at 16
        (GemmConfig(128, 128, 2, 1, 16, consumers="pingpong", dact_prefetch=2), "dact", 4),
        (GemmConfig(128, 128, 2, 1, 16, consumers="pingpong", dact_prefetch=2, epi_n=16), "dact", 5),
    ],
)
def test_narrow_epilogue_subtiles_buy_stages(cfg, kind, want, monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    spec = EpilogueSpec("dact", "swiglu") if kind == "dact" else EpilogueSpec("store")
    b_major = "col" if kind == "dact" else "row"
    key = KernelKey(spec, cfg, "bfloat16", "row", b_major, "bfloat16")
    assert stages_of(key, monkeypatch) == want


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_short_k_dact_four_slot_ring_keeps_the_two_slot_rings_stages(act, monkeypatch):
    """The short-K dact's default ring of four preact slots (dpreact in place) takes no A/B stage
    from the two-slot ring with separate dpreact buffers: the rule was timed on that premise."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import dataclasses

    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.config import default_config
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    cfg = default_config(8192, 2816, 1024, 132, "dact")
    assert cfg.dact_prefetch == 3
    key = KernelKey(EpilogueSpec("dact", act), cfg, "bfloat16", "row", "col", "bfloat16")
    two = dataclasses.replace(key, config=dataclasses.replace(cfg, dact_prefetch=1))
    four_slots, two_slots = stages_of(key, monkeypatch), stages_of(two, monkeypatch)
    assert four_slots == two_slots, (four_slots, two_slots)
    assert four_slots == (4 if act == "swiglu" else 5)


@pytest.mark.parametrize("pf,epi_n,want", [(2, 32, 3), (3, 16, 4), (1, 16, 4)])
def test_cooperative_192_row_dact_stages(pf, epi_n, want, monkeypatch):
    """The cooperative 192x128 swiglu dact: a 40 KB A/B stage beside 192-row epilogue buffers.
    Three stages of 192 rows hold more MMA work than the four of the 128x128 short-K default."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    cfg = GemmConfig(192, 128, dact_prefetch=pf, epi_n=epi_n)
    key = KernelKey(EpilogueSpec("dact", "swiglu"), cfg, "bfloat16", "row", "col", "bfloat16")
    assert stages_of(key, monkeypatch) == want


@pytest.mark.parametrize("act,pf,epi_n,want", [
    ("swiglu", 2, 16, 4), ("swiglu", 2, 32, 3), ("swiglu", 3, 16, 3), ("gelu_tanh_approx", 3, 16, 4),
])
def test_handoff_dact_stages(act, pf, epi_n, want, monkeypatch):
    """The handoff schedule's 64 KB of fp32 accumulators come out of the A/B ring's share, and
    its absent channels take 16 bytes, not a 1 KB slot: the gated dact keeps 4 stages of 128x128
    with a 3-slot ring and 16-column subtiles (the cooperative short-K default has 4), which the
    1 KB slots would have cut to 3."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    cfg = GemmConfig(128, 128, consumers="handoff", dact_prefetch=pf, epi_n=epi_n)
    key = KernelKey(EpilogueSpec("dact", act), cfg, "bfloat16", "row", "col", "bfloat16")
    assert stages_of(key, monkeypatch) == want
