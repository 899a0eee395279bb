"""bench host --stub: the layer's host path with the kernels stubbed out, on the CPU."""

import torch

from parallel_mlp.bench import host_stub
from parallel_mlp.kernels import compile as kcompile
from parallel_mlp.kernels import ops


def test_a_stubbed_step_takes_the_fused_path_with_six_launches(monkeypatch):
    """Every GEMM of fwd+bwd reaches a launch (none falls back to the torch math, which a CPU
    tensor would otherwise trigger), with the default configs' kernels."""
    from parallel_mlp.layer import ParallelMLP

    launched = []
    monkeypatch.setattr(host_stub._NoLaunch, "run_compiled_program",
                        lambda self, args: launched.append(self.key))
    with host_stub.stubbed_kernels():
        mlp = ParallelMLP(256, 512, activation="swiglu", backend="cute", dtype=torch.bfloat16)
        x = torch.randn(128, 256, dtype=torch.bfloat16, requires_grad=True)
        mlp(x).backward(torch.randn(128, 256, dtype=torch.bfloat16))
    kinds = [key.epilogue.kind for key in launched]
    assert len(kinds) == 6 and kinds[0] == "act" and "dact" in kinds, kinds
    assert all(g is not None for g in (x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad))


def test_the_command_prints_its_figures_and_leaves_ops_as_it_was():
    get_kernel, current_device = kcompile.get_kernel, torch.cuda.current_device
    lines = []
    figures = host_stub.measure(calls=2, out=lines.append)
    assert set(figures) == {"fwd+bwd", "forward", "ops.gemm (fc2's shape)",
                            "empty autograd function fwd+bwd",
                            "fwd+bwd, launch groups replayed (graph launches not counted)",
                            "fwd+bwd, launch groups with every key new", host_stub.AUTO_LANE}
    assert all(us > 0 for us in figures.values())
    assert lines[0].startswith("host µs with the kernels stubbed out")
    assert kcompile.get_kernel is get_kernel and torch.cuda.current_device is current_device
    assert not ops._plans  # no plan holding a stub survives the context
    assert ops._tensor_reason(torch.empty(2, 8), "t") is not None  # CPU tensors refused again


def test_the_command_refuses_a_call_count_below_one(capsys):
    import pytest

    with pytest.raises(SystemExit):
        host_stub.main(["--stub", "--calls", "0"])
    assert "--calls must be >= 1, got 0" in capsys.readouterr().err



def test_launch_groups_replayed_launch_nothing_and_new_keys_launch_all(monkeypatch):
    """launch_groups: replayed, the step's launches happen only in its first call (the graphs
    stand in for the rest); with every key new, all six launch on every call; afterwards the
    function is as it was."""
    from parallel_mlp import autograd
    from parallel_mlp.layer import ParallelMLP

    launched = []
    monkeypatch.setattr(host_stub._NoLaunch, "run_compiled_program",
                        lambda self, args: launched.append(self.key))
    saved = autograd.GRAPHS, autograd._kernels_here
    with host_stub.stubbed_kernels():
        mlp = ParallelMLP(256, 512, activation="swiglu", backend="cute", dtype=torch.bfloat16)
        x = torch.randn(128, 256, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(128, 256, dtype=torch.bfloat16)
        for replayed, per_call in ((True, [6, 0, 0]), (False, [6, 6, 6])):
            with host_stub.launch_groups(replayed) as graphs:
                counts = []
                for _ in range(3):
                    before = len(launched)
                    mlp(x).backward(dy)
                    counts.append(len(launched) - before)
            assert counts == per_call, (replayed, counts, graphs.stats)
    assert (autograd.GRAPHS, autograd._kernels_here) == saved


def test_the_auto_figure_takes_the_modules_fast_lane_to_the_fused_function(monkeypatch):
    """The auto module of the stub's figure reaches the fused function's launches, and from its
    second step without the module's full path (layer._run): the fast lane, which a user's
    backend="auto" layer takes."""
    from parallel_mlp import layer
    from parallel_mlp.layer import ParallelMLP

    launched, full_path = [], []
    monkeypatch.setattr(host_stub._NoLaunch, "run_compiled_program",
                        lambda self, args: launched.append(self.key))
    run = layer._run
    monkeypatch.setattr(layer, "_run", lambda *args: full_path.append(1) or run(*args))
    with host_stub.stubbed_kernels(), host_stub.launch_groups(False):
        mlp = ParallelMLP(256, 512, activation="swiglu", backend="auto", dtype=torch.bfloat16)
        x = torch.randn(128, 256, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(128, 256, dtype=torch.bfloat16)
        for _ in range(3):
            mlp(x).backward(dy)
    assert len(launched) == 18  # six launches a step, each key new
    assert full_path == [1]  # the first step keeps the limit; the other two take the lane
