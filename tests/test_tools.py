"""tools/gpu_run.sh, the one-call GPU check: its step list and its refusal of unknown steps (the
steps themselves need a GPU)."""

import subprocess
from pathlib import Path

import pytest
import torch

TOOLS = Path(__file__).resolve().parent.parent / "tools"
SCRIPT = TOOLS / "gpu_run.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_lists_every_step_with_its_command():
    r = run("--list")
    assert r.returncode == 0
    steps = [line.split()[0] for line in r.stdout.splitlines()]
    assert steps == ["tests_kernels", "tests_layer", "tests_all", "prefetch", "bench_gemm", "sweep", "mlp", "profile", "cold", "clock", "full", "ncu"]
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


def test_pytest_shards_runs_every_test_once_and_fails_if_one_shard_fails(tmp_path):
    tests = tmp_path / "test_sample.py"
    tests.write_text(
        "import os, pytest\n"
        "@pytest.mark.parametrize('i', range(7))\n"
        "def test_ok(i):\n"
        "    open(os.environ['MARKS'] + f'/{i}', 'x').close()  # 'x': a second run of i fails\n"
        "def test_maybe_bad():\n"
        "    assert os.environ.get('BAD') != '1'\n"
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"MARKS": str(marks), "OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin"}

    def shards(bad):
        for f in marks.iterdir():
            f.unlink()
        import os
        import sys

        return subprocess.run(
            [sys.executable, str(TOOLS / "pytest_shards.py"), "3", "-q", "-p", "no:cacheprovider", str(tests)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, **env, "BAD": bad},
        )

    r = shards("0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(int(f.name) for f in marks.iterdir()) == list(range(7))
    assert "8 tests in 3 shards, 0 failed" in r.stdout
    r = shards("1")
    assert r.returncode == 1 and "1 failed" in r.stdout and "test_maybe_bad" in r.stdout
