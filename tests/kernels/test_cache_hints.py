"""GemmConfig(cache_hints=...) without a GPU: the option's rules, its kernel names, and the
L2 policy operands that reach the compiled PTX's TMA copies."""

import re

import pytest

pytest.importorskip("cutlass")


def test_cache_hints_values_and_key():
    from parallel_mlp.kernels.config import CACHE_HINTS, GemmConfig

    # "normal" is the default and keeps the plain names; the others name themselves.
    assert GemmConfig().cache_hints == "normal" and GemmConfig().key == "t128x256_c1x1_g8_sm132"
    assert GemmConfig(cache_hints="stream").key == "t128x256_c1x1_g8_sm132_l2stream"
    assert GemmConfig(cache_hints="none").key == "t128x256_c1x1_g8_sm132_l2none"
    assert len({GemmConfig(cache_hints=h).key for h in CACHE_HINTS}) == len(CACHE_HINTS)
    with pytest.raises(ValueError, match="cache_hints='first'.*must be one of"):
        GemmConfig(cache_hints="first")


def _policies(ptx: str) -> dict[str, set[int]]:
    """The constant L2 policy operand of each TMA copy in a PTX, by load / store / reduce."""
    consts = {reg: int(v) for reg, v in re.findall(r"mov\.b64\s+(%rd\d+),\s*(-?\d+);", ptx)}
    found: dict[str, set[int]] = {}
    for op, reg in re.findall(r"(cp(?:\.reduce)?\.async\.bulk\.tensor\.\S+)\s[^;]*?,\s*(%rd\d+);", ptx):
        kind = "load" if "mbarrier" in op else "reduce" if "reduce" in op else "store"
        found.setdefault(kind, set()).add(consts.get(reg, -1))
    return found


@pytest.mark.parametrize("hints", ["default", "none", "stream"])
def test_cache_hints_reach_the_tma_copies(hints, monkeypatch):
    """The default puts EVICT_NORMAL on every copy; "none" leaves the DSL's policy operand (0);
    "stream" puts EVICT_NORMAL on the A/B loads and EVICT_FIRST on the epilogue's preact loads
    and its stores."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from parallel_mlp.kernels.compile import KernelKey, kernel_ptx
    from parallel_mlp.kernels.config import L2_EVICT_FIRST, L2_EVICT_NORMAL, GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    extra = {} if hints == "default" else {"cache_hints": hints}
    cfg = GemmConfig(128, 128, 1, 1, 8, consumers="pingpong", **extra)
    key = KernelKey(EpilogueSpec("dact", "relu"), cfg, "bfloat16", "row", "col", "bfloat16")
    found = _policies(kernel_ptx(key))
    if hints == "default":
        assert found == {"load": {L2_EVICT_NORMAL}, "store": {L2_EVICT_NORMAL}}
    elif hints == "none":
        assert found == {"load": {0}, "store": {0}}
    else:
        assert found == {"load": {L2_EVICT_NORMAL, L2_EVICT_FIRST}, "store": {L2_EVICT_FIRST}}
