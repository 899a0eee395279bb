"""The pretraining example end to end: torchrun at TP=2 on CPU/gloo, its loss falls, and a checkpoint
written at TP=2 resumes at TP=1 exactly where the uninterrupted run would have been."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from dist_utils import run_on_cpu, torchrun_command

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pretrain_gpt.py"
STEPS = 40

pytestmark = pytest.mark.slow


def _run_example(nproc: int, *args: str, cwd: Path) -> str:
    """torchrun the example with ``nproc`` ranks on the CPU; returns its output, fails on rc != 0."""
    return run_on_cpu(torchrun_command(nproc, EXAMPLE, "--device", "cpu", "--backend", "gloo",
                                       "--log-every", "10", *args), cwd)


def _losses(out: str) -> tuple[float, float]:
    m = re.search(r"first loss (\d+\.\d+) last loss (\d+\.\d+)", out)
    assert m, f"no 'first loss ... last loss ...' line in:\n{out[-2000:]}"
    return float(m.group(1)), float(m.group(2))


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory):
    """One TP=2 run of STEPS steps that also saves a checkpoint halfway and at the end."""
    tmp = tmp_path_factory.mktemp("tp2")
    out = _run_example(2, "--steps", str(STEPS), "--save-every", str(STEPS // 2),
                       "--save", str(tmp / "ckpt{step}.pt"), cwd=tmp)
    return tmp, out


def test_example_loss_falls_at_tp2(tp2_run):
    _, out = tp2_run
    assert "split over TP=2" in out, out[-2000:]
    first, last = _losses(out)
    # The first loss is ~ln(256): the model knows nothing yet.
    assert abs(first - math.log(256)) < 0.3, first
    # Below ln(32) ~ 3.47 the model has learned more than which 32 symbols occur: it has picked
    # up the chain's transitions (its entropy rate is ~0.87 nats).
    assert last < 0.5 * first and last < 3.0, (first, last)


def test_checkpoint_saved_at_tp2_resumes_at_tp1(tp2_run, tmp_path):
    tmp, out = tp2_run
    _, last_uninterrupted = _losses(out)
    half = tmp / f"ckpt{STEPS // 2}.pt"
    ckpt = torch.load(half, map_location="cpu", weights_only=False)
    assert ckpt["step"] == STEPS // 2 and ckpt["saved_at_tp_size"] == 2
    # Global shapes only: the swiglu fc1 holds 2 x 192 interleaved rows, fc2 all 192 columns.
    assert ckpt["model"]["blocks.0.mlp.fc1.weight"].shape == (384, 64)
    assert ckpt["model"]["blocks.0.mlp.fc2.weight"].shape == (64, 192)
    assert ckpt["optim"]["blocks.0.mlp.fc1.weight"]["exp_avg"].shape == (384, 64)

    resumed = _run_example(1, "--steps", str(STEPS), "--resume", str(half),
                           "--save", str(tmp_path / "final.pt"), cwd=tmp_path)
    assert f"resumed from {half} at step {STEPS // 2}" in resumed, resumed[-2000:]
    assert "split over TP=1" in resumed
    # The step counter continues: the first progress line is past the checkpoint's step.
    steps_logged = [int(s) for s in re.findall(r"step\s+(\d+)/" + str(STEPS), resumed)]
    assert steps_logged and min(steps_logged) > STEPS // 2 and max(steps_logged) == STEPS
    assert torch.load(tmp_path / "final.pt", map_location="cpu",
                      weights_only=False)["step"] == STEPS
    # Same weights, same AdamW moments, same batches, same schedule: the resumed run ends where the
    # uninterrupted TP=2 run ended (up to the order of the fp32 sums in the all-reduce).
    _, last_resumed = _losses(resumed)
    assert abs(last_resumed - last_uninterrupted) < 1e-3, (last_resumed, last_uninterrupted)


def test_a_run_resumed_past_its_steps_saves_the_step_it_is_at(tp2_run, tmp_path):
    """Resumed at step 40 with --steps 20 it trains nothing, and what it saves says step 40 (a
    file named and marked 20 would replay steps 21-40 on weights that already hold them)."""
    tmp, _ = tp2_run
    out = _run_example(1, "--steps", str(STEPS // 2), "--resume", str(tmp / f"ckpt{STEPS}.pt"),
                       "--save", str(tmp_path / "again{step}.pt"), cwd=tmp_path)
    assert f"nothing to do: the run is already at step {STEPS}" in out, out[-2000:]
    assert not (tmp_path / f"again{STEPS // 2}.pt").exists()
    again = torch.load(tmp_path / f"again{STEPS}.pt", map_location="cpu", weights_only=False)
    saved = torch.load(tmp / f"ckpt{STEPS}.pt", map_location="cpu", weights_only=False)
    assert again["step"] == STEPS
    for k, v in saved["model"].items():
        assert torch.equal(again["model"][k], v), k
