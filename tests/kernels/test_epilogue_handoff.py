"""The epi_stages and epi_store_warp options (CPU): validation, names, and what they do to a
compiled kernel.

Three output buffers per epilogue channel let each subtile run one barrier instead of two: the
sm_90a PTX of a tile's epilogue must hold exactly one named-barrier wait fewer per subtile, and
the buffer it adds must not cost the default dacts an A/B stage. With the store warp apart, no
consumer thread waits at a barrier of the consumers alone. Their GPU tests, bitwise against the
default kernels, are in test_epilogue_handoff_gpu.py."""

import re

import pytest

from parallel_mlp.kernels.config import GemmConfig


def test_default_is_two_buffers_and_keeps_the_names():
    assert GemmConfig().epi_stages == 2
    assert GemmConfig(128, 128, 2, 1, 16).key == "t128x128_c2x1_g16_sm132"


def test_three_buffers_have_their_own_name():
    assert GemmConfig(epi_stages=3).key == "t128x256_c1x1_g8_sm132_es3"
    assert GemmConfig(128, 128, dact_prefetch=3, epi_n=16, epi_stages=3).key.endswith("_pf3_e16_es3")


@pytest.mark.parametrize("bad", [0, 1, 4])
def test_buffer_count_outside_the_rule(bad):
    with pytest.raises(ValueError, match=r"epi_stages=.*must be 2 or 3"):
        GemmConfig(epi_stages=bad)


def test_parse_fields_takes_it():
    from parallel_mlp.kernels.config import parse_fields

    assert parse_fields("epi_stages=3,epi_n=16") == {"epi_stages": 3, "epi_n": 16}


def _key(kind, act, cfg, b_major, out="bfloat16"):
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    spec = EpilogueSpec(kind, act) if act else EpilogueSpec(kind)
    return KernelKey(spec, cfg, "bfloat16", "row", b_major, out)


# (kernel, subtiles per tile): the dact defaults (short-K cooperative 128x128 with the four-slot
# ring; big pingpong 128x192 with 16-column subtiles, two slots per warpgroup), fc1 + act's
# pingpong 128x192, the plain cooperative 128x256 store, and pingpong with one preact slot.
CASES = {
    "short-K dact": (("dact", "swiglu", GemmConfig(128, 128, 2, 1, 16, dact_prefetch=3), "col"), 4),
    "big dact": (
        ("dact", "swiglu", GemmConfig(128, 192, 2, 1, 8, consumers="pingpong", dact_prefetch=2, epi_n=16), "col"),
        12,
    ),
    "fc1 + act": (("act", "gelu_tanh_approx", GemmConfig(128, 192, 2, 1, 8, consumers="pingpong"), "row"), 6),
    "store": (("store", None, GemmConfig(128, 256, 2, 1, 8), "row"), 8),
    "one-slot dact": (("dact", "relu", GemmConfig(128, 128, 1, 1, 8, consumers="pingpong"), "col"), 4),
}

BARRIER_WAIT = re.compile(r"\b(?:bar|barrier)\.sync\b[^;]*;")


def _ptx(kind, act, cfg, b_major):
    from parallel_mlp.kernels.compile import compile_kernel

    return compile_kernel(_key(kind, act, cfg, b_major), keep_ptx=True).artifacts.PTX


@pytest.mark.parametrize("case", list(CASES))
def test_three_buffers_take_one_barrier_per_subtile_out(case):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import dataclasses

    (kind, act, cfg, b_major), subtiles = CASES[case]
    two = len(BARRIER_WAIT.findall(_ptx(kind, act, cfg, b_major)))
    three = len(BARRIER_WAIT.findall(_ptx(kind, act, dataclasses.replace(cfg, epi_stages=3), b_major)))
    # The tile's epilogue is unrolled over its subtiles once per kernel (no stream-K here).
    assert two - three == subtiles, f"{case}: {two} barrier waits with two buffers, {three} with three"


@pytest.mark.parametrize("case", ["short-K dact", "big dact", "fc1 + act"])
def test_the_third_buffer_keeps_the_defaults_stages(case, monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import dataclasses

    from test_stage_count import stages_of  # same directory: pytest puts it on sys.path

    (kind, act, cfg, b_major), _ = CASES[case]
    two = stages_of(_key(kind, act, cfg, b_major), monkeypatch)
    three = stages_of(_key(kind, act, dataclasses.replace(cfg, epi_stages=3), b_major), monkeypatch)
    assert three == two, f"{case}: {two} A/B stages with two output buffers, {three} with three"


def test_store_warp_rule_and_name():
    assert GemmConfig().epi_store_warp is False
    assert GemmConfig(128, 128, epi_store_warp=True).key == "t128x128_c1x1_g8_sm132_sw"
    assert GemmConfig(128, 128, epi_stages=3, epi_store_warp=True).key.endswith("_es3_sw")
    assert GemmConfig(128, 192, consumers="pingpong", epi_store_warp=True).key.endswith("_pingpong_sw")
    for bad in (dict(scheduler="dynamic"), dict(stream_k=True)):
        with pytest.raises(ValueError, match="epi_store_warp=True .* static sequence of whole tiles"):
            GemmConfig(128, 128, epi_store_warp=True, **bad)
    with pytest.raises(ValueError, match="epi_store_warp='yes': must be True or False"):
        GemmConfig(epi_store_warp="yes")


NAMED_BARRIER = re.compile(r"\bbar\.(?:sync|arrive)\s+\S+,\s*(\d+);")


@pytest.mark.parametrize("kind,act,cfg,b_major", [
    ("dact", "swiglu", GemmConfig(128, 128, 2, 1, 16, dact_prefetch=3, epi_stages=3, epi_store_warp=True), "col"),
    ("dact", "swiglu", GemmConfig(128, 128, 1, 1, 8, epi_store_warp=True), "col"),
    ("dact", "relu", GemmConfig(64, 128, 1, 1, 8, epi_stages=3, epi_store_warp=True), "col"),
    ("act", "gelu_tanh_approx", GemmConfig(128, 256, 2, 1, 8, epi_store_warp=True), "row"),
    ("dact", "swiglu", GemmConfig(128, 192, 2, 1, 8, consumers="pingpong", dact_prefetch=2, epi_n=16, epi_stages=3,
                                  epi_store_warp=True), "col"),
    ("act", "swiglu", GemmConfig(128, 192, 2, 1, 8, consumers="pingpong", epi_store_warp=True), "row"),
], ids=["coop-pf3-es3", "coop-2slot", "coop64-es3", "coop-act", "pingpong-dact-es3", "pingpong-act"])
def test_with_the_store_warp_apart_no_consumer_waits_for_another_in_an_epilogue(kind, act, cfg, b_major):
    """The epilogue's hand-offs are mbarriers between each consumer warp and the store warp: the
    only named barriers left are the pingpong warpgroups' turns (256 threads), none of the
    consumers' own epilogue barriers (all of a cooperative tile's consumers, or a warpgroup)."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

    ptx = _ptx(kind, act, cfg, b_major)
    counts = [int(n) for n in NAMED_BARRIER.findall(ptx)]
    if cfg.consumers == "pingpong":
        assert counts and set(counts) == {256}, counts
    else:
        assert counts == [], counts
    assert "mbarrier.arrive" in ptx
