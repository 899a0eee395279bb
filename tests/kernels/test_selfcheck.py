"""CI: the compile-only selfcheck (sm_90a PTX with wgmma and TMA), no GPU needed.

Runs the full selfcheck (every epilogue variant x dtype x operand layout, the tile/cluster configs
and the dynamic tile scheduler for each epilogue kind) in a subprocess, as a user would: about
80-130 s on two cores, well inside CI's budget.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")


def test_selfcheck_compile_only(tmp_path):
    env = dict(os.environ, PARALLEL_MLP_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_mlp.kernels.selfcheck", "--compile-only"],
        capture_output=True, text=True, timeout=1800, env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith(("ok", "FAIL"))]
    assert len(lines) >= 80 and all(l.startswith("ok") for l in lines), out[-4000:]
    assert "selfcheck:" in proc.stdout.splitlines()[-1]
    # The dynamic scheduler compiled for every epilogue kind, with its atomic tile counter.
    dynamic = [l for l in lines if "_dynamic" in l]
    for kind in ("store", "accumulate", "act", "dact"):
        assert any(l.split()[1].startswith(kind) for l in dynamic), (kind, dynamic)
    assert all("atom.global.add x" in l for l in dynamic), dynamic


def test_selfcheck_reports_failure(monkeypatch):
    """A variant whose PTX lacks the Hopper instructions is reported and fails the run."""
    from parallel_mlp.kernels import selfcheck

    class Fake:
        class artifacts:
            PTX = ".target sm_90a\n mma.sync ..."

    monkeypatch.setattr("parallel_mlp.kernels.compile.compile_kernel", lambda key, keep_ptx=False: Fake)
    monkeypatch.setattr(selfcheck, "variants", lambda quick=False: _one())
    assert selfcheck.main(["--compile-only", "-j", "1"]) == 1


def _one():
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    return [KernelKey(EpilogueSpec("store"), GemmConfig(), "bfloat16", "row", "row", "bfloat16")]


def _regs_ptx(threads, dec, inc):
    return (f".entry k()\n.reqntid {threads}, 1, 1\n.minnctapersm 1\n"
            f"\tsetmaxnreg.dec.sync.aligned.u32 \t{dec};\n\tsetmaxnreg.inc.sync.aligned.u32 \t{inc};\n")


@pytest.mark.parametrize("threads,dec,inc", [(384, 40, 232), (512, 32, 160), (640, 32, 112), (256, 40, 232)])
def test_register_split_within_the_sm(threads, dec, inc):
    from parallel_mlp.kernels.selfcheck import register_overcommit

    assert register_overcommit(_regs_ptx(threads, dec, inc)) is None


@pytest.mark.parametrize("threads,dec,inc,pool", [
    (512, 40, 232, 65536), (512, 40, 160, 65536), (384, 40, 240, 64512),
    (640, 32, 120, 61440),  # the handoff split that hung on an H100: 65,536 but not 61,440
])
def test_register_split_over_the_launch_pool_fails(threads, dec, inc, pool):
    from parallel_mlp.kernels.selfcheck import launch_registers, register_overcommit

    assert launch_registers(threads) == pool
    msg = register_overcommit(_regs_ptx(threads, dec, inc))
    assert msg and f"128 x {dec} + {threads - 128} x {inc}" in msg and f"over the {pool}" in msg


def test_register_split_needs_both_counts():
    from parallel_mlp.kernels.selfcheck import register_overcommit

    assert "expected one .reqntid" in register_overcommit(".reqntid 384, 1, 1\n")


def test_cooperative_192_row_tile_splits_registers_three_ways():
    """Three consumer warpgroups at 160 and the producer at 32: exactly the SM's 64 K registers."""
    from parallel_mlp.kernels import gemm_sm90
    from parallel_mlp.kernels.compile import KernelKey, kernel_ptx
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.selfcheck import register_overcommit

    ptx = kernel_ptx(KernelKey(EpilogueSpec("store"), GemmConfig(192, 128), "bfloat16", "row", "col", "bfloat16"))
    assert ".reqntid 512" in ptx and register_overcommit(ptx) is None
    assert "setmaxnreg.inc.sync.aligned.u32 \t160" in ptx and "setmaxnreg.dec.sync.aligned.u32 \t32" in ptx
    assert gemm_sm90.PRODUCER_REGS[3] * 128 + gemm_sm90.CONSUMER_REGS[3] * 384 == 65536


def test_handoff_splits_registers_five_ways():
    """A producer at 32 and four consumer warpgroups (two mainloop, two epilogue) at 112: the
    61,440 registers a 640-thread CTA is launched with (96 a thread)."""
    from parallel_mlp.kernels import gemm_sm90
    from parallel_mlp.kernels.compile import KernelKey, kernel_ptx
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
    from parallel_mlp.kernels.selfcheck import register_overcommit

    cfg = GemmConfig(128, 128, consumers="handoff", epi_n=16, dact_prefetch=2)
    ptx = kernel_ptx(KernelKey(EpilogueSpec("dact", "swiglu"), cfg, "bfloat16", "row", "col", "bfloat16"))
    assert ".reqntid 640" in ptx and register_overcommit(ptx) is None
    assert "setmaxnreg.inc.sync.aligned.u32 \t112" in ptx and "setmaxnreg.dec.sync.aligned.u32 \t32" in ptx
    assert gemm_sm90.PRODUCER_REGS[4] * 128 + gemm_sm90.CONSUMER_REGS[4] * 512 == 61440
