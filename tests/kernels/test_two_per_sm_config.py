"""Two CTAs per SM (GemmConfig.ctas_per_sm) on the CPU: its name and rules, and what the compiled
short-K dact is (sm_90a, compile-only): a launch of two CTAs per SM, no setmaxnreg, every warp at
most 80 registers without spilling, A/B stages beside its epilogue buffers in half the SM's
shared memory. Its GPU tests (bitwise equal to one CTA per SM) are in test_two_per_sm_gpu.py."""

import re
import shutil
import subprocess

import pytest

from parallel_mlp.kernels.config import TWO_PER_SM_MAX_N, GemmConfig


def two_per_sm(**fields):
    return GemmConfig(128, 64, 1, 1, 8, epi_n=16, dact_prefetch=2, ctas_per_sm=2, **fields)


def test_one_by_default_and_named_only_when_two():
    assert GemmConfig().ctas_per_sm == 1 and GemmConfig(128, 64).key == "t128x64_c1x1_g8_sm132"
    assert two_per_sm().key == "t128x64_c1x1_g8_sm132_pf2_e16_o2"


@pytest.mark.parametrize("fields,match", [
    (dict(ctas_per_sm=3), r"ctas_per_sm=3: must be 1 or 2"),
    (dict(ctas_per_sm=2, tile_n=128), r"at most 64 columns"),
    (dict(ctas_per_sm=2, consumers="pingpong"), r"consumers='pingpong'"),
    (dict(ctas_per_sm=2, scheduler="dynamic"), r"scheduler='dynamic'"),
    (dict(ctas_per_sm=2, stream_k=True), r"stream_k=True"),
    (dict(ctas_per_sm=2, tile_m=64), r"tile 64x64"),
])
def test_rules_name_the_field(fields, match):
    base = dict(tile_m=128, tile_n=TWO_PER_SM_MAX_N)
    with pytest.raises(ValueError, match=match):
        GemmConfig(**{**base, **fields})


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_the_short_k_dact_compiles_for_two_ctas_per_sm(act, monkeypatch, tmp_path):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("PARALLEL_MLP_CACHE_DIR", str(tmp_path))
    from parallel_mlp.kernels import gemm_sm90
    from parallel_mlp.kernels.compile import KernelKey, kernel_ptx
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    built = []
    layouts = gemm_sm90.PersistentGemmSm90._smem_layouts

    def record(self, *args):
        layouts(self, *args)
        built.append(self)

    monkeypatch.setattr(gemm_sm90.PersistentGemmSm90, "_smem_layouts", record)
    key = KernelKey(EpilogueSpec("dact", act), two_per_sm(), "bfloat16", "row", "col", "bfloat16")
    ptx = kernel_ptx(key)
    kernel = built[-1]
    assert kernel.max_active_clusters == 2 * 132 and kernel.regs is None
    assert kernel.ab_stages >= 3
    assert kernel.shared_storage.size_in_bytes() <= gemm_sm90.SMEM_CAPACITY_TWO_PER_SM
    assert 2 * (gemm_sm90.SMEM_CAPACITY_TWO_PER_SM + 1024) <= 228 * 1024
    assert re.search(r"\.minnctapersm 2\b", ptx) and ".reqntid 384" in ptx
    assert "setmaxnreg" not in ptx
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas is not on PATH: the register count is not checked")
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    log = subprocess.run([ptxas, "-arch=sm_90a", "-O3", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    assert regs <= 80 and "0 bytes spill stores, 0 bytes spill loads" in log
