"""tools/gpu_run.sh, the one-call GPU check: its step list and its refusal of unknown steps (the
steps themselves need a GPU)."""

import subprocess
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu_run.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_lists_every_step_with_its_command():
    r = run("--list")
    assert r.returncode == 0
    steps = [line.split()[0] for line in r.stdout.splitlines()]
    assert steps == ["tests_kernels", "tests_layer", "prefetch", "bench_gemm", "sweep", "mlp", "profile", "full", "ncu"]
    assert "pytest -q -m gpu tests/kernels" in r.stdout
    assert "python3 -m parallel_mlp.bench" in r.stdout


def test_unknown_step_and_no_step_are_refused():
    r = run("tests_layer", "nope")
    assert r.returncode == 2 and "unknown step" in r.stderr
    r = run()
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_profile_step_needs_a_gpu():
    from parallel_mlp import profile_step

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        profile_step.main(["--steps", "1"])
