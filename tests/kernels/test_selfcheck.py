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
