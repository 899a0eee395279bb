"""bench host --step --phases on the CPU: a step's host time split by phase, from a fake clock."""

import torch
from fake_clock import FakeClock


def test_step_phases_splits_a_step_by_the_clock():
    """Each phase's median over the steps, read from a clock that
    moves only inside the model's forward (2 ms) and backward (3 ms)."""
    from parallel_mlp.bench.host_overhead import PHASES, step_phases

    clock = FakeClock()

    class Timed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            clock.advance(2 ** -9)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            clock.advance(2 ** -8)
            return g * 2

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            return Timed.apply(x * self.w)

    model, x = Model(), torch.ones(3, requires_grad=True)
    synced = []
    out = step_phases(model, x, torch.ones(3), calls=4, clock=clock,
                      sync=lambda: synced.append(1))
    assert list(out) == list(PHASES) and synced == [1]
    assert out["clear grads"] == 0.0
    assert out["forward"] == 1e6 * 2 ** -9 and out["backward"] == 1e6 * 2 ** -8
    assert out["step"] == out["forward"] + out["backward"]
    assert torch.equal(model.w.grad, torch.full((3,), 2.0))  # cleared each step, not summed


def test_phase_probe_prints_every_model_and_phase(capsys):
    """The probe end to end on tiny CPU tensors (on CUDA, ours on auto is its small step)."""
    from parallel_mlp.bench.host_overhead import PHASES, phase_probe

    assert phase_probe(2, (8, 16, 24, "swiglu"), rounds=1, device="cpu") == 0
    out = capsys.readouterr().out
    assert "Python loop" in out
    for name in ("ours, auto", "the small step's ops alone", "eager"):
        assert out.count(name) == 2  # device threads on and off
    assert all(out.count(phase) >= 6 for phase in PHASES)


def test_phase_probe_reverses_its_order_every_round(monkeypatch, capsys):
    """Like the held timing, the probe's models take their turns forward, then reversed."""
    import torch

    from parallel_mlp.bench import host_overhead

    seen = []

    def record(model, x, dy, calls, sync=None):
        seen.append((type(model).__name__, torch.autograd.is_multithreading_enabled()))
        return dict.fromkeys(host_overhead.PHASES, 1.0)

    monkeypatch.setattr(host_overhead, "step_phases", record)
    assert host_overhead.phase_probe(1, (8, 16, 24, "swiglu"), rounds=2, device="cpu") == 0
    capsys.readouterr()
    first, second = seen[:6], seen[6:]
    assert len(set(first)) == 6 and second == first[::-1]


def test_the_step_probes_flags_are_refused_apart_from_step(capsys):
    import pytest

    from parallel_mlp.bench.host_overhead import main

    for argv, message in ((["--phases"], "give them with --step"),
                          (["--step", "--forward", "--phases"], "give one of them")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
