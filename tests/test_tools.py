"""tools/gpu_run.sh, the one-call GPU check: its step list and its refusal of unknown steps (the
steps themselves need a GPU)."""

import collections
import contextlib
import dataclasses
import itertools
import os
import re
import subprocess
import sys
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
    assert steps == ["tests_kernels", "tests_layer", "tests_defaults", "tests_all", "streamk", "streamk_fill", "configs_small", "configs_wave", "configs_mid", "configs_long_k", "configs_dact", "configs_swap", "configs_ring", "configs_raster", "configs_narrow_gelu", "configs_narrow_ring", "configs_narrow_n", "configs_sk_pingpong", "configs_below_bound", "configs_pairs", "configs_one_wave", "tests_overlap", "configs_overlap", "overlap_ab", "configs_sk160", "tests_pdl", "pdl", "short_k_probe", "plain_gemms", "plain_gemms_host", "gemm", "mlp", "sweep", "sweep_ceiling", "sweep_plain_launches", "sweep_below_eager", "sweep_below_target", "sweep_heat", "sweep_small", "sweep_graphed",
                     "tp", "tp_sp", "profile", "profile_narrow", "launch_graphs", "launch_keys", "held_turns", "kernels_vs_quack", "kernels_vs_quack_below", "graph_memory", "memory_trace", "small_step_variants", "small_step_kernels", "host_paths", "timing_spread", "host_step",
                     "host_stages", "host_env", "host_phases", "cold", "clock", "full", "ncu", "ncu_dact", "ncu_dact_pingpong", "ncu_smem", "ncu_vs_quack", "ncu_epilogue_gap"]
    # every step the script defines is listed (a step missing from the list still ran, unseen)
    defined = re.findall(r"^  \[(\w+)\]=", SCRIPT.read_text(), flags=re.M)
    assert sorted(defined) == sorted(steps)
    assert "pytest -q -m gpu tests/kernels" in r.stdout
    commands = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert "python3 -m parallel_mlp.bench sweep --json" in commands["sweep"]
    assert "-m parallel_mlp.bench tp" in commands["tp"]
    # the re-timing of the shapes below eager names four shapes of the grid
    from parallel_mlp.bench import sweep

    below = commands["sweep_below_eager"].split("sweep", 1)[1].split()
    assert len(sweep.grid(sweep.parse_args(below))) == 4
    target = commands["sweep_below_target"].split("sweep", 1)[1].split()
    shapes = sweep.grid(sweep.parse_args(target))
    assert len(shapes) == 4 and ("--ceiling" in target)
    # every bench command a step names exists (the full run's step names none)
    from parallel_mlp.bench.__main__ import COMMANDS

    named = set(re.findall(r"parallel_mlp\.bench (\S+)", r.stdout))
    assert named - {"--budget-s"} <= set(COMMANDS) and "configs" in named


def test_unknown_step_and_no_step_are_refused():
    r = run("tests_layer", "nope")
    assert r.returncode == 2 and "unknown step" in r.stderr
    r = run()
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_profile_needs_a_gpu():
    from parallel_mlp.bench import profile_step

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


def test_pytest_shards_kills_a_shard_past_its_deadline_and_the_others_still_report(tmp_path):
    tests = tmp_path / "test_sample.py"
    tests.write_text(
        "import os, time\n"
        "def test_quick_a():\n"
        "    pass\n"
        "def test_hangs():\n"
        "    open(os.environ['PIDS'] + f'/{os.getpid()}', 'x').close()\n"
        "    time.sleep(600)\n"
        "def test_quick_b():\n"
        "    pass\n"
    )
    pids = tmp_path / "pids"
    pids.mkdir()
    import time

    # The hung test sleeps 600 s; had the tool waited for it instead of killing it at the
    # deadline, subprocess.run's own timeout (far from both) would raise here. The deadline
    # leaves a quick shard's pytest ample time to start on a loaded machine.
    r = subprocess.run(
        [sys.executable, str(TOOLS / "pytest_shards.py"), "3", "--deadline", "20", "-q", "-p", "no:cacheprovider",
         str(tests)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, "OUT": str(tmp_path / "out"), "PIDS": str(pids)},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "timed out after 20 s" in r.stdout and "3 tests in 3 shards, 1 failed" in r.stdout
    # pytest's faulthandler named the hung test in its shard's log
    assert "test_hangs" in r.stdout
    (pid,) = [int(f.name) for f in pids.iterdir()]
    # the shard's pytest is gone, not orphaned: killed with its group, then reaped (poll, since
    # the reaping of an orphan by init takes its own time)
    for _ in range(300):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the hung shard's pytest (pid {pid}) still runs")


def test_pytest_shards_refuses_a_deadline_without_seconds(tmp_path):
    import sys

    r = subprocess.run([sys.executable, str(TOOLS / "pytest_shards.py"), "2", "--deadline", "soon", "x.py"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "--deadline takes a number of seconds" in r.stderr


def _cuda_event(name, start, end):
    from types import SimpleNamespace

    tr = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA, time_range=tr)


def test_profile_step_kernel_table_counts_kernels_and_gaps_not_step_markers():
    """kernel_table on synthetic CUDA events: two steps of two kernels, with the profiler
    schedule's GPU-side step markers (which span the step) left out of busy time and gaps."""
    from types import SimpleNamespace

    from parallel_mlp.bench import profile_step

    event = _cuda_event
    events = [
        event("ProfilerStep#1", 0, 1000), event("fc1", 0, 400), event("fc2", 500, 900),
        event("ProfilerStep#2", 1000, 2000), event("fc1", 1000, 1400), event("fc2", 1400, 1800),
    ]
    prof = SimpleNamespace(events=lambda: events)
    busy, span, rows, note = profile_step.kernel_table(prof, steps=2)
    assert busy == 0.8 and span == 0.9  # ms per step: 1600 us busy, 1800 us span, over 2 steps
    assert [r[0] for r in rows] == ["fc1", "fc2"]
    assert rows[1][2] == 0.05  # fc2's idle before: 100 us in step 1, 0 in step 2
    assert note == ""


def test_profile_step_kernel_table_lists_the_common_sequence_when_a_step_differs():
    """Three steps whose markers span only the forward's kernels (the backward's launch from
    another thread), one of them with a kernel record missing: the rows are the other two
    steps' sequence in launch order, each kernel its own mean, and the note says so; the busy
    time still counts every kernel."""
    from types import SimpleNamespace

    from parallel_mlp.bench import profile_step

    event = _cuda_event
    events = []
    for step, (t0, kernels) in enumerate([(0, ["fwd", "bwd", "fill"]), (1000, ["fwd", "bwd"]),
                                          (2000, ["fwd", "bwd", "fill"])]):
        events.append(event(f"ProfilerStep#{step + 1}", t0, t0 + 300))  # the forward's only
        for j, name in enumerate(kernels):
            ms = {"fwd": 300, "bwd": 500 + 100 * step, "fill": 10}[name]
            start = t0 + [0, 300, 900][j]
            events.append(event(name, start, start + ms))
    prof = SimpleNamespace(events=lambda: events)
    busy, span, rows, note = profile_step.kernel_table(prof, steps=3)
    assert [r[0] for r in rows] == ["fwd", "bwd", "fill"]
    assert rows[1][1] == 0.6  # bwd's mean over steps 1 and 3: (500 + 700) / 2 us
    assert rows[2][2] == (0.1 + 0.0) / 2  # fill's idle before: 900 - 800 us in step 1, none in step 3
    assert busy == (300 * 3 + 500 + 600 + 700 + 20) / 3 / 1e3
    assert "2 of the 3 spans" in note and "kernels per span: 3, 2, 3" in note


def test_profile_step_kernel_table_without_markers_splits_by_count():
    """No GPU-side step markers: the kernels split into equal slices, one per step; a slice that
    differs is named in the note; fewer kernels than steps list nothing and say why."""
    from types import SimpleNamespace

    from parallel_mlp.bench import profile_step

    event = _cuda_event
    names = ["a", "b", "a", "b", "a", "c"]
    events = [event(n, 100 * i, 100 * i + 50) for i, n in enumerate(names)]
    busy, span, rows, note = profile_step.kernel_table(SimpleNamespace(events=lambda: events), steps=3)
    assert [r[0] for r in rows] == ["a", "b"] and rows[0][1] == 0.05
    assert busy == 0.1 and "2 of the 3 spans" in note and "kernels per span: 2, 2, 2" in note

    one = [event("a", 0, 50)]
    busy, span, rows, note = profile_step.kernel_table(SimpleNamespace(events=lambda: one), steps=3)
    assert rows == [] and "1 kernel record(s) over 3 steps" in note


def test_clock_probe_refuses_a_shape_that_is_not_positive(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("clock_probe", TOOLS / "clock_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    with pytest.raises(SystemExit) as exit_info:
        probe.main(["--T", "0"])
    assert exit_info.value.code == 2
    assert "argument --T: expected a positive int, got 0" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_clock_probe_needs_a_gpu():
    import importlib.util

    spec = importlib.util.spec_from_file_location("clock_probe", TOOLS / "clock_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        probe.main(["--seconds", "0.1"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_timing_spread_needs_a_gpu():
    r = subprocess.run([sys.executable, str(TOOLS / "timing_spread.py")], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "needs a CUDA GPU" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_host_speed_stages_needs_a_gpu():
    r = subprocess.run([sys.executable, str(TOOLS / "host_speed_stages.py")], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "needs a CUDA GPU" in r.stderr


def test_small_step_variants_spell_the_same_mlp(monkeypatch, capsys):
    """tools/small_step_variants.py --check-only: every spelling of the gated small step gives
    eager's gradients (CPU, small shapes on both sides of the two-GEMM threshold)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("small_step_variants",
                                                  TOOLS / "small_step_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "SHAPES", [(96, 32, 24), (20, 64, 40)])
    monkeypatch.setattr(sys, "argv", ["small_step_variants.py", "--check-only"])
    assert mod.main() == 0
    assert capsys.readouterr().out.count("every spelling's gradients match eager's") == 2


def _host_bound_paths():
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_bound_paths", TOOLS / "host_bound_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY_SHAPES = ["--shape", "8,16,32,swiglu", "--shape", "64,32,48,gelu_tanh_approx"]


def test_host_bound_paths_takes_each_path_and_matches_eager(monkeypatch, capsys):
    """tools/host_bound_paths.py --check-only (CPU, fp32): the fused variant and its torch_apply
    twin run the fused function, the latter through torch's Function.apply and the former not
    (where the direct apply is available), the full_path variant runs it through the module's
    full path (``_run``) where the fused variant takes the forward's fast lane, the forced small
    step runs plain ops, and all of them give eager's output and gradients."""
    from parallel_mlp import autograd, layer

    tool = _host_bound_paths()
    calls, full_path_steps = [], []
    torch_apply = autograd.ParallelMLPFunction.apply
    monkeypatch.setattr(autograd.ParallelMLPFunction, "apply",
                        staticmethod(lambda *args: calls.append(1) or torch_apply(*args)))
    run = layer._run
    # the timed steps' x requires grad; the probe forwards that keep each limit do not
    monkeypatch.setattr(layer, "_run", lambda x, *args: (
        full_path_steps.append(1) if x.requires_grad else None) or run(x, *args))
    assert tool.main(["--check-only", *TINY_SHAPES]) == 0
    out = capsys.readouterr().out
    assert out.count("every variant agrees with eager") == 2
    # one torch_apply step per shape; without the direct apply the fused and full_path steps too
    assert len(calls) == (2 if autograd._DIRECT else 6)
    assert len(full_path_steps) == 2  # the full_path variant's step, once per shape


def test_host_bound_paths_refuses_a_small_step_that_was_not_forced(monkeypatch):
    tool = _host_bound_paths()
    monkeypatch.setattr(tool, "forced_small_step", lambda model: model)
    with pytest.raises(SystemExit, match="small took the wrong path"):
        tool.main(["--check-only", "--shape", "8,16,32,swiglu"])


def test_host_bound_paths_forces_the_fused_path_where_auto_would_not(monkeypatch, capsys):
    """Where ``auto`` takes the small step (the non-gated small steps on a GPU; here a rule that
    always says yes), the fused variant still runs the fused function."""
    from parallel_mlp import small_step

    monkeypatch.setattr(small_step, "applies", lambda *args, **kwargs: True)
    tool = _host_bound_paths()
    assert tool.main(["--check-only", "--shape", "64,32,48,gelu_tanh_approx"]) == 0
    assert "every variant agrees with eager" in capsys.readouterr().out


def test_host_bound_paths_sums_each_variants_kernels_per_step():
    """--kernels' summary: GPU µs and kernels per step over the profiled steps, the longest
    kernels first."""
    tool = _host_bound_paths()
    lines = tool.kernel_summary([("gelu", 30.0, 20), ("gemm", 150.0, 40)], steps=20)
    assert lines == ["GPU kernel time per step 9.0 µs, 3 kernels",
                     "      7.5 µs  x2  gemm",
                     "      1.5 µs  x1  gelu"]


def test_host_bound_paths_refuses_bad_shapes_and_timing_without_a_gpu():
    r = subprocess.run([sys.executable, str(TOOLS / "host_bound_paths.py"), "--shape", "8,16,swiglu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--shape takes T,d,h,act" in r.stderr
    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, str(TOOLS / "host_bound_paths.py"), *TINY_SHAPES],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "--check-only runs without one" in r.stderr
    r = subprocess.run([sys.executable, str(TOOLS / "host_bound_paths.py"), "--check-only",
                        "--kernels", *TINY_SHAPES], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--kernels lists the kernels of timed steps" in r.stderr


def test_small_step_variants_refuses_bad_shapes():
    r = subprocess.run([sys.executable, str(TOOLS / "small_step_variants.py"), "--check-only",
                        "--shapes", "512x1024"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--shapes must be TxDxH" in r.stderr


def _host_speed_stages():
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_speed_stages",
                                                  TOOLS / "host_speed_stages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_host_speed_stages_counts_faults_and_switches_per_step():
    """rusage_per_step: the differences of two getrusage readings, per step, by field."""
    import resource
    from types import SimpleNamespace

    stages = _host_speed_stages()
    before = SimpleNamespace(ru_minflt=100, ru_nvcsw=10, ru_nivcsw=1)
    after = SimpleNamespace(ru_minflt=400, ru_nvcsw=610, ru_nivcsw=31)
    assert stages.rusage_per_step(before, after, 300) == {"faults": 1.0, "waits": 2.0,
                                                          "preempted": 0.1}
    now = resource.getrusage(resource.RUSAGE_SELF)
    assert all(v == 0 for v in stages.rusage_per_step(now, now, 1).values())


def test_host_speed_stages_quick_flag_parses():
    r = subprocess.run([sys.executable, str(TOOLS / "host_speed_stages.py"), "--quick"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr


def test_host_stub_paired_runs_two_revisions_side_by_side(tmp_path, capsys):
    """tools/host_stub_paired.py: each revision's copy imports as its own package (no module of
    it refers to parallel_mlp), and a run prints both host times and their ratio for each
    measure, on the CPU."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=TOOLS.parent, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    sys.path.insert(0, str(TOOLS))
    try:
        import host_stub_paired
    finally:
        sys.path.remove(str(TOOLS))
    host_stub_paired.export_renamed("HEAD", "pmlp_head", tmp_path)
    texts = [p.read_text() for p in (tmp_path / "pmlp_head").rglob("*.py")]
    assert (tmp_path / "pmlp_head" / "kernels" / "ops.py").is_file()
    assert not any(re.search(r"\bparallel_mlp\b", t) for t in texts)
    assert host_stub_paired.main(["HEAD", "--rounds", "1", "--steps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["fwd+bwd", "forward", "fwd+bwd", "forward"]
    assert all(line.rstrip().endswith("x") for line in lines[1:])


def test_small_step_lane_times_the_layers_lane_beside_eager_and_a_base_revision(monkeypatch,
                                                                              capsys):
    """tools/small_step_lane.py: the layer (its rule forced to the small step, which it checks
    the step took), a base revision's layer, eager's module and the bare ops, each a row of
    forward and fwd+bwd times with ratios to eager's, on the CPU."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=TOOLS.parent, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    from parallel_mlp import small_step

    monkeypatch.setattr(small_step, "applies", small_step.applies)  # restored afterwards
    monkeypatch.syspath_prepend(str(TOOLS))
    import small_step_lane

    assert small_step_lane.main(["HEAD", "--rounds", "2", "--steps", "2"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["eager", "layer", "layer@HEAD", "bare"]
    assert rows[0].split()[2] == "1.000" and rows[0].split()[4] == "1.000"
    assert all(float(v) > 0 for row in rows for v in row.split()[-4:])


def test_plain_gemms_graphs_about_two_milliseconds_of_work_per_replay(monkeypatch):
    """tools/plain_gemms.py: each graph holds enough calls (1 to 20) for ~2 ms at ~600 TFLOP/s,
    so that short GEMMs are timed as kernels, not launches; it needs a GPU to run."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import plain_gemms

    assert plain_gemms.calls_per_graph(2 * 512 * 1024 * 2816) == 20       # 3 GFLOP: capped
    assert plain_gemms.calls_per_graph(2 * 8192 * 4096 * 14336) == 1      # 962 GFLOP
    assert plain_gemms.calls_per_graph(2 * 1024 * 1024 * 65536) == 9      # 137 GFLOP
    # fc2, dx and the two wgrads (bf16 and into fp32), with the layer's layouts; no fused op
    cases = plain_gemms.plain_cases(512, 1024, 2816, "swiglu")
    assert [(c.m, c.n, c.k, c.a_t, c.b_t, c.accumulate) for c in cases] == [
        (512, 1024, 2816, False, True, False), (512, 1024, 5632, False, False, False),
        (1024, 2816, 512, True, False, False), (5632, 1024, 512, True, False, False),
        (1024, 2816, 512, True, False, True), (5632, 1024, 512, True, False, True)]
    # cuBLAS's side, on the CPU here: the case's product, and into an fp32 main grad
    small = plain_gemms.plain_cases(16, 32, 48, "swiglu")
    ref, _ = plain_gemms.gemm_fns(small[2], dtype=torch.float32, device="cpu")
    assert ref().shape == (32, 48)
    ref, _ = plain_gemms.gemm_fns(small[-1], dtype=torch.float32, device="cpu")
    once = ref().clone()
    torch.testing.assert_close(ref(), 2 * once)
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            plain_gemms.main(["--tokens", "512"])


def test_launch_graphs_ab_says_what_it_times():
    """tools/launch_graphs_ab.py needs a GPU to time; without one its help still runs (its
    imports and arguments are sound)."""
    r = subprocess.run([sys.executable, str(TOOLS / "launch_graphs_ab.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--hold-s" in r.stdout and "launch groups" in r.stdout


def test_the_step_ab_tools_pair_each_way_with_eager_and_the_other_way_round_by_round(monkeypatch):
    """launch_graphs_ab.eager_two_ways_copy, which pdl_ab and option_ab time with too: medians of
    the held turns, each variant's ratio to eager and the first way's gain over the second, all
    paired within a round, never across rounds."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import launch_graphs_ab

    # ms per round: eager, way A, way B, eager's copy; round 2 runs everything twice as slow
    turns = [[1.0, 2.0, 1.1], [0.5, 1.2, 0.55], [0.6, 1.0, 0.66], [1.0, 2.0, 1.0]]
    asked = []

    def held(fns, hold_s, rounds, warmup):
        asked.append((len(fns), hold_s, rounds, warmup))
        return turns

    monkeypatch.setattr(launch_graphs_ab, "held_turns", held)
    ms, over_eager, gain = launch_graphs_ab.eager_two_ways_copy([None] * 4, 0.4, 3)
    assert asked == [(4, 0.4, 3, 5)]
    assert ms == [1.1, 0.55, 0.66, 1.0]
    assert over_eager[0] == 1.0 and over_eager[1] == pytest.approx(2.0)
    assert over_eager[2] == pytest.approx(1.0 / 0.6) and over_eager[3] == pytest.approx(1.0)
    assert gain == pytest.approx(1.2)  # B's turn over A's in each round: 1.2, 0.833, 1.2


@contextlib.contextmanager
def _stubbed_swiglu_layer(monkeypatch):
    """A small swiglu ParallelMLP on the cute backend with its kernels stubbed out (on the CPU)
    and its launch groups run, never replayed: yields (mlp, x, dy, the groups, the list each
    launch appends its kernel's GemmConfig to)."""
    from parallel_mlp import ParallelMLP
    from parallel_mlp.bench.host_stub import launch_groups, stubbed_kernels
    from parallel_mlp.kernels import compile as kcompile

    launched = []

    class Recorder:
        def __init__(self, key):
            self.key = key

        def run_compiled_program(self, args):
            launched.append(self.key.config)

    with stubbed_kernels(), launch_groups(replayed=False) as groups:
        monkeypatch.setattr(kcompile, "get_kernel", lambda key, use_disk=True: Recorder(key))
        mlp = ParallelMLP(64, 96, activation="swiglu", backend="cute", dtype=torch.bfloat16)
        x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(32, 64, dtype=torch.bfloat16)
        yield mlp, x, dy, groups, launched


def test_pdl_ab_switches_the_kernels_and_the_launch_graphs_with_each_step(monkeypatch):
    """tools/pdl_ab.py's two variants of one module: each step sets pdl as its variant says and
    runs through its own launch graphs, so that neither replays the other's captures (kernels
    stubbed out, on the CPU)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import pdl_ab

    from parallel_mlp import autograd
    from parallel_mlp.kernels import ops

    kept_graphs, kept_pdl = autograd.GRAPHS, ops.pdl_launches()
    try:
        with _stubbed_swiglu_layer(monkeypatch) as (mlp, x, dy, groups, launched):
            other = type(groups)(capture=lambda launches, device: None, replay=lambda graph, launches: None,
                                 capturing=lambda: False)
            other.enabled = True  # a first sighting of each key: its launches run
            on = pdl_ab._switched(mlp, x, dy, True, groups)
            off = pdl_ab._switched(mlp, x, dy, False, other)
            on()
            assert ops.pdl_launches() and autograd.GRAPHS is groups
            assert launched and all(c.pdl for c in launched)
            launched.clear()
            off()
            assert not ops.pdl_launches() and autograd.GRAPHS is other
            assert launched and not any(c.pdl for c in launched)
    finally:
        autograd.GRAPHS = kept_graphs
        ops.set_pdl(kept_pdl)


def test_pdl_ab_refuses_bad_shapes_and_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(TOOLS))
    import pdl_ab

    with pytest.raises(SystemExit):
        pdl_ab.main(["--shapes", "8192:4096"])
    assert "expected T:d:h:activation" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            pdl_ab.main(["--shapes", "512:1024:2816:swiglu"])


def test_option_ab_replaces_the_fields_in_the_schedule_asked_where_they_stay_valid(monkeypatch):
    """tools/option_ab.py's rewrite: the fields go into each config whose fields hold --where's
    values (every config without it; e.g. one consumer schedule's), a config they would make
    invalid stays as the rule picked it, and the configs changed and met are counted."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import option_ab

    from parallel_mlp.kernels.config import GemmConfig

    cooperative = GemmConfig()
    pingpong = GemmConfig(tile_n=192, consumers="pingpong")
    stream_k = GemmConfig(stream_k=True)
    narrow = option_ab.FieldRewrite({"epi_n": 16}, where={"consumers": "pingpong"})
    assert narrow(pingpong).epi_n == 16 and narrow(cooperative) is cooperative
    assert narrow.changed == {pingpong} and narrow.seen == {pingpong, cooperative}
    ring = option_ab.FieldRewrite({"dact_prefetch": 3})
    assert ring(cooperative).dact_prefetch == 3 and ring(stream_k).dact_prefetch == 3
    assert ring(pingpong) is pingpong  # a pingpong warpgroup's preact ring has 1 or 2 slots
    assert ring.changed == {cooperative, stream_k}
    rule = option_ab.FieldRewrite({})
    assert rule(pingpong) is pingpong and not rule.changed
    # --where: only the configs whose fields already hold the values (the short-K dact's ring)
    short_k = GemmConfig(128, 128, dact_prefetch=3)
    handoff = option_ab.FieldRewrite({"consumers": "handoff", "dact_prefetch": 2, "epi_n": 16},
                                     where={"dact_prefetch": 3})
    assert handoff(cooperative) is cooperative and handoff(pingpong) is pingpong
    assert handoff(short_k) == GemmConfig(128, 128, consumers="handoff", dact_prefetch=2, epi_n=16)
    assert handoff.changed == {short_k}


def test_option_ab_steps_launch_the_rewritten_configs_and_the_rules(monkeypatch):
    """Each of option_ab's variants runs the layer's step under its own rewrite: the option's
    launches carry its fields, the baseline's the rule's configs (kernels stubbed out, on the
    CPU)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import option_ab

    from parallel_mlp.kernels import ops

    with _stubbed_swiglu_layer(monkeypatch) as (mlp, x, dy, _, launched):
        option = option_ab.FieldRewrite({"max_stages": 4})
        option_ab._rewritten(mlp, x, dy, option)()
        assert len(launched) == 6 and all(c.max_stages == 4 for c in launched)
        assert option.changed == option.seen and ops._config_rewrite is None
        launched.clear()
        rule = option_ab.FieldRewrite({})
        option_ab._rewritten(mlp, x, dy, rule)()
        assert len(launched) == 6 and all(c.max_stages == 8 for c in launched)
        assert rule.seen == option.seen and not rule.changed


def test_option_ab_refuses_bad_fields_and_shapes_and_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(TOOLS))
    import option_ab

    with pytest.raises(SystemExit):
        option_ab.main(["--also", "max_stages"])
    assert "is not FIELD=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        option_ab.main(["--also", "max_stages=4", "--shapes", "8192:4096"])
    assert "expected T:d:h:activation" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        option_ab.main(["--also", "max_stages=4", "--where", "prefetch=3"])
    assert "is not FIELD=VALUE" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            option_ab.main(["--also", "max_stages=4", "--shapes", "512:1024:2816:swiglu"])


def test_step_memory_trace_marks_the_peak_of_what_the_step_asks_for(monkeypatch):
    """tools/step_memory_trace.py: the running total of the bytes asked for over the step's start, from
    the allocator's trace (allocations, and frees once completed), with the peak marked; the
    deepest frame of the library's code names each line. It needs a GPU to trace."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import step_memory_trace as smt

    mib = 2 ** 20
    frames = [{"filename": "/x/torch/autograd/graph.py", "line": 1, "name": "run"},
              {"filename": "/repo/parallel_mlp/autograd.py", "line": 250, "name": "backward"}]
    entries = [{"action": "alloc", "size": 2 * mib, "frames": frames},
               {"action": "alloc", "size": 1 * mib, "frames": []},
               {"action": "free_requested", "size": 2 * mib},
               {"action": "free_completed", "size": 2 * mib},
               {"action": "alloc", "size": 3 * mib, "frames": frames}]
    lines = []
    smt.report("ours", entries, 4 * mib, 4 * mib, out=lines.append)
    assert "ours: step peak over its start 4.00 MiB (requested 4.00)" in lines[0]
    asked = [float(line.split("asked")[1].split()[0]) for line in lines[1:]]
    assert asked == [2.0, 3.0, 1.0, 4.0]
    assert [line.endswith("<- peak") for line in lines[1:]] == [False, False, False, True]
    assert "autograd.py:250 backward" in lines[1]
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            smt.main([])


def test_allocator_model_reproduces_the_step_peaks_the_h200_measured(monkeypatch, capsys):
    """tools/allocator_model.py against the H200's figures (tools/step_memory_trace.py and the
    sweep, 2026-12-03): at T=512 d=1024 swiglu every order asks for 25.0 MiB at the peak, and
    the blocks held 26.75 with fc2's weight gradient made before the dact, 26.0 with dpreact
    made before postact, 25.0 with postact first (default mode; recompute 26.0 and 25.0); at
    T=512 d=8192 swiglu 159.44 asking for 158.38. The layer's order holds what it asks for at
    T=512 d=1024 in both modes."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import allocator_model as am

    old_forward = ("preact", "postact", "y")
    cases = [
        (am.StepOrder(old_forward, ("dpreact", "postact", "dW2")), 512, 1024, 2816, False, 26.75),
        (am.StepOrder(old_forward, ("dpreact", "postact")), 512, 1024, 2816, False, 26.0),
        (am.StepOrder(old_forward), 512, 1024, 2816, False, 25.0),
        (am.StepOrder(old_forward, ("dpreact", "postact")), 512, 1024, 2816, True, 26.0),
        (am.StepOrder(old_forward), 512, 1024, 2816, True, 25.0),
        (am.StepOrder(old_forward, ("dpreact", "postact", "dW2")), 512, 8192, 2752, False, 159.44),
    ]
    for order, tokens, d, h, recompute, measured in cases:
        held, asked = am.sweep_peak(tokens, d, h, True, order, recompute, warm=1)  # as measured
        assert abs(held - measured) < 0.01, (order, tokens, d, recompute, held)
    for warm in (1, 3):
        assert am.sweep_peak(512, 1024, 2816, True, warm=warm) == (25.0, 25.0)
        assert am.sweep_peak(512, 1024, 2816, True, recompute=True, warm=warm) == (25.0, 25.0)
    # fc2's fresh weight gradient in fc1's group (one launch group fewer) keeps postact alive
    # beside dW1 and dx: 2.75 MiB more asked for at T=512 d=1024
    assert am.sweep_peak(512, 1024, 2816, True, am.StepOrder(dw2_with_dw1=True)) == (27.75, 27.75)
    # ... and in the dact's group, made while preact is alive, it asks for no more there but
    # holds 26.0 MiB of blocks or more in each of the six orders of the group's three outputs,
    # in both forward orders, against the layer's 25.0
    for forward in (am.LAYER.forward, old_forward):
        for dact in itertools.permutations(("postact", "dpreact", "dW2")):
            held, asked = am.sweep_peak(512, 1024, 2816, True, am.StepOrder(forward, dact))
            assert held >= 26.0 and asked == 25.0, (forward, dact, held, asked)
    # the model's own mechanics: a block split only where its remainder is above 1 MiB
    model = am.CachingAllocatorModel()
    model.alloc("a", 5 * am.MIB)
    model.free("a")
    model.alloc("b", 4 * am.MIB)                   # from the 20 MiB segment, split
    assert model.held == 4 * am.MIB
    model.free("b")
    model.alloc("c", 19 * am.MIB + am.MIB // 2)    # 0.5 MiB left: the whole segment
    assert model.held == 20 * am.MIB and model.asked == 19 * am.MIB + am.MIB // 2
    assert am.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("T=") == 60 and "recompute mode" in out


def _tool(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
@pytest.mark.parametrize("name", ["launch_key_churn", "fused_step_probe", "held_turns_probe",
                                  "kernels_vs_quack", "graph_memory_probe", "ncu_vs_quack"])
def test_shape_probes_need_a_gpu_and_refuse_bad_shapes(name, capsys):
    tool = _tool(name)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        tool.main(["--shape", "512,1024,512,gelu_tanh_approx"])
    with pytest.raises(SystemExit):
        tool.main(["--shape", "512,1024,swiglu"])
    assert "--shape must be T,d,h,activation" in capsys.readouterr().err


def test_ncu_vs_quack_refuses_an_also_that_is_not_a_config_field(capsys):
    with pytest.raises(SystemExit):
        _tool("ncu_vs_quack").main(["--also", "raster=8"])
    assert "--also 'raster=8': 'raster=8' is not FIELD=VALUE with a GemmConfig field" in capsys.readouterr().err


def test_launch_key_churn_needs_a_window_of_steps(capsys):
    with pytest.raises(SystemExit):
        _tool("launch_key_churn").main(["--steps", "99"])
    assert "--steps 99: must be at least 100" in capsys.readouterr().err


def test_launch_key_churn_records_what_each_group_call_did():
    """The recorder sorts each call of a real LaunchGraphs (stand-in capture and replay) into
    plain run, capture or replay, as its stats count them, and times each capture."""
    from parallel_mlp.launch_graphs import LaunchGraphs

    churn = _tool("launch_key_churn")
    ran = []
    graphs = LaunchGraphs(capture=lambda launches, device: object(),
                          replay=lambda graph, launches: ran.append("replayed"),
                          capturing=lambda: False)
    graphs.enabled = True
    recorder = churn.Recorder(graphs, profile=False)
    site = ("dact", "ops")
    for key in ["a", "a", "a", "b", "a", "b"]:
        graphs.run(site, (site, key), lambda: ran.append("launched"), torch.device("cpu"))
    kinds = [kind for _, _, kind in recorder.log]
    assert kinds == ["plain", "captures", "replays", "plain", "replays", "captures"]
    assert churn.window_counts(recorder.log) == "2/2/2"
    assert len(recorder.capture_s) == 2
    recorder.close()
    assert graphs.run.__self__ is graphs
    assert ran == ["launched", "replayed", "replayed", "launched", "replayed", "replayed"]
    assert churn.differing_fields((site, "x", 1, 2), (site, "x", 1, 3)) == [3]
    assert churn.differing_fields((site, "x", 1), (site, "x", 1)) == []


def test_launch_key_churn_runs_its_three_settings(monkeypatch, capsys):
    """The whole tool on tiny CPU models (CUDA's calls stubbed): each setting reports its
    windows (the CPU runs no launch groups, so each window counts none)."""
    from parallel_mlp.bench import models

    churn = _tool("launch_key_churn")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
    monkeypatch.setattr(churn, "fused_and_eager", lambda shape, **kw: models.fused_and_eager(
        shape, device="cpu", dtype=torch.float32, **kw))
    monkeypatch.setattr(churn, "ROUNDS", 2)
    monkeypatch.setattr(churn, "STEPS_PER_TURN", 3)
    from parallel_mlp.launch_graphs import GRAPHS

    run = GRAPHS.run
    assert churn.main(["--shape", "4,8,4,swiglu", "--steps", "200"]) == 0
    assert GRAPHS.run == run  # given back
    out = capsys.readouterr().out
    assert "4,8,4,swiglu alone: captures/plain/replays per 100 steps of ours: 0/0/0 0/0/0;" in out
    assert "4,8,4,swiglu turns with eager:" in out
    assert "4,8,4,swiglu rounds: captures/plain/replays per round: 0/0/0 0/0/0;" in out


def test_held_turns_probe_times_each_way_and_counts_the_turns(monkeypatch, capsys):
    """The whole probe on tiny CPU models (CUDA's calls stubbed, eight calls a turn of known
    times): every model gets each turn's settled median in the three turn-based ways and the
    loop's time, and the turns' launch-group counts and the fused step's by-input-set medians
    are reported."""
    from parallel_mlp.bench import models

    probe = _tool("held_turns_probe")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(probe, "fused_and_eager", lambda shape, n: models.fused_and_eager(
        shape, n, device="cpu", dtype=torch.float32))
    monkeypatch.setattr(probe, "ON_GPU", False)

    def hold(fn, seconds, cuda):  # eight calls a turn, whatever the machine's speed
        assert seconds == probe.TURN_S and cuda is False
        for i in range(8):
            fn(i)
        return [0.5 + 0.01 * i for i in range(8)]

    monkeypatch.setattr(probe, "hold", hold)
    monkeypatch.setattr(probe, "gpu_gaps", lambda fn: (0.0, 0.0, []))
    monkeypatch.setattr(probe, "loop_ms", lambda fn, steps=300: 1.0)
    assert probe.main(["--shape", "8,16,8,swiglu", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    rows = {m[1]: m[2].split() for m in re.finditer(r"^  (fused|eager) +([\d. ]+)$", out, re.M)}
    # a turn's calls after its first quarter: 0.52-0.57 ms, median 0.545
    assert rows["fused"] == rows["eager"] == ["0.545", "0.545", "0.545", "1.000"]
    assert re.search(r"^  auto +0\.545 ", out, re.M)
    assert ("fused in turns: settled median by input set 0: 0.540, 1: 0.550, 2: 0.540, "
            "3: 0.550; calls over 2x the median 0/12; first-quarter median 0.505") in out
    assert "fused launch groups per turn:" in out


def test_kernels_vs_quack_averages_each_kernel_over_the_profiled_steps():
    tool = _tool("kernels_vs_quack")
    steps = tool.STEPS
    # step s: fc1 starts at 100 s and runs 10 + s µs, fc2 starts 3 µs after it ends and runs 20 µs
    kernels = []
    for s in range(steps):
        kernels += [("fc1", 100.0 * s, 10.0 + s), ("fc2", 100.0 * s + 13 + s, 20.0)]
    # fc1's idle time: from the step before's fc2 end (100 (s - 1) + 13 + (s - 1) + 20) to 100 s
    fc1_idle = [68.0 - s for s in range(1, steps)]
    assert tool.per_step(kernels) == [("fc1", 10 + (steps - 1) / 2, sum(fc1_idle) / len(fc1_idle)),
                                      ("fc2", 20.0, 3.0)]
    # a list that does not split into equal steps is shown kernel by kernel, not misattributed
    assert tool.per_step(kernels[:3]) == [("fc1", 10.0, 0.0), ("fc2", 20.0, 3.0), ("fc1", 11.0, 67.0)]
    assert tool.short("k" * 96) == "k" * 96
    long = "a" * 70 + "b" * 60
    assert tool.short(long).startswith("a" * 60) and tool.short(long).endswith("b" * 33)


def test_graph_memory_probe_reads_memory_after_each_phase(monkeypatch, capsys):
    """The probe on a tiny CPU model (CUDA's calls stubbed, the driver's free bytes falling by
    1 MiB a reading): three readings, graphs off, on and dropped, and the launch graphs left
    empty and switched as they were. The CPU runs no launch groups, so no per-graph line."""
    from parallel_mlp.bench import models
    from parallel_mlp.launch_graphs import GRAPHS

    probe = _tool("graph_memory_probe")
    monkeypatch.setattr(GRAPHS, "enabled", False)  # the probe turns them on, then puts this back
    free = [2 ** 30]

    def mem_get_info():
        free[0] -= 2 ** 20
        return free[0], 2 ** 31

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 3 * 2 ** 20)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 2 ** 20)
    monkeypatch.setattr(probe, "fused_and_eager", lambda shape, n: models.fused_and_eager(
        shape, n, device="cpu", dtype=torch.float32))
    assert probe.main(["--shape", "8,16,8,swiglu", "--input-sets", "2"]) == 0
    out = capsys.readouterr().out
    assert "== 8,16,8,swiglu, 2 input sets: 0 graphs kept" in out
    assert re.search(r"graphs off, 3 passes +free +1023\.0 MiB +reserved +3\.0 +allocated +1\.0", out)
    assert re.search(r"graphs dropped, cache emptied +free +1021\.0 MiB", out)
    assert "per graph" not in out
    assert not GRAPHS.enabled and len(GRAPHS) == 0


def test_sass_counts_reads_the_epilogue_stretch():
    """tools/sass_counts.py counts from the last WGMMA wait to the last store, opcodes without
    their modifiers or predicates; a disassembly without either is refused by name."""
    sys.path.insert(0, str(TOOLS))
    try:
        import sass_counts
    finally:
        sys.path.pop(0)
    sass = "\n".join([
        "        /*0100*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4].tnspB, R24 ;",
        "        /*0110*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
        "        /*0120*/                   FMUL R1, R2, R3 ;",
        "        /*0130*/              @!P0 LDG.E.64 R4, desc[UR14][R6.64] ;",
        "        /*0140*/                   MUFU.EX2 R1, R1 ;",
        ".L_x_1:",
        "        /*0150*/               @P1 STG.E.64 desc[UR14][R8.64+0x10], R24 ;",
        "        /*0160*/                   EXIT ;",
    ])
    counts, total = sass_counts.epilogue_counts(sass)
    assert total == 5 and counts == {"WARPGROUP": 1, "FMUL": 1, "LDG": 1, "MUFU": 1, "STG": 1}
    with pytest.raises(ValueError, match="not a WGMMA kernel"):
        sass_counts.epilogue_counts(sass.replace("WARPGROUP.DEPBAR.LE gsb0, 0x0", "NOP"))
    with pytest.raises(ValueError, match="no global or TMA store"):
        sass_counts.epilogue_counts(sass.replace("STG.E.64", "LDG.E.64"))


def test_sass_counts_names_a_missing_disassembler(monkeypatch, tmp_path):
    sys.path.insert(0, str(TOOLS))
    try:
        import sass_counts
    finally:
        sys.path.pop(0)
    monkeypatch.setenv("NVDISASM", str(tmp_path / "no-such-nvdisasm"))
    with pytest.raises(SystemExit, match=r"nvdisasm not found: put it on PATH or set \$NVDISASM"):
        sass_counts._tool("nvdisasm")
    monkeypatch.delenv("PTXAS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match=r"ptxas not found"):
        sass_counts._tool("ptxas")


def test_ptx_digest_drops_where_the_ptx_came_from():
    tool = _tool("ptx_digest")
    ptx = "//\n// Generated by NVIDIA NVVM\n.version 8.7\n\t.file\t1 \"/tmp/a.py\"\n\t.loc\t1 10 2\n\tmov.u32 %r1, 0;\n"
    moved = ptx.replace("/tmp/a.py", "/tmp/b.py").replace(".loc\t1 10 2", ".loc\t1 12 4")
    assert tool.ptx_body(ptx) == tool.ptx_body(moved) == ".version 8.7\n\tmov.u32 %r1, 0;"
    assert tool.ptx_body(ptx) != tool.ptx_body(ptx.replace("%r1, 0", "%r1, 1"))


def test_ptx_digest_sweep_covers_every_shape_of_the_grid_once_per_kernel():
    """--sweep digests the kernels the rule picks for the sweep's grid: each shape's, each once."""
    from parallel_mlp.bench.sweep_grid import GRID
    from parallel_mlp.kernels.warmup import mlp_keys

    names = [key.name for key in _tool("ptx_digest").sweep_keys()]
    assert len(names) == len(set(names))
    for shape in GRID:
        assert {k.name for k in mlp_keys(shape.tokens, shape.d, shape.shard, shape.act)} <= set(names)


def test_ptx_digest_takes_one_kernel_set(capsys):
    with pytest.raises(SystemExit):
        _tool("ptx_digest").main(["--quick", "--sweep"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_ptx_digest_is_the_same_for_the_same_kernel_and_tells_an_option_apart():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    tool = _tool("ptx_digest")
    key = KernelKey(EpilogueSpec("dact", "swiglu"), GemmConfig(128, 128, dact_prefetch=3), "bfloat16", "row", "col", "bfloat16")
    first, lines = tool.digest(key)
    assert tool.digest(key) == (first, lines) and len(first) == 16 and lines > 100
    narrow = KernelKey(key.epilogue, GemmConfig(128, 128, dact_prefetch=3, epi_n=16), "bfloat16", "row", "col", "bfloat16")
    assert tool.digest(narrow)[0] != first


def test_overlap_steps_run_their_tests_and_configs():
    """tests_overlap selects tests that exist in both files; configs_overlap's four variants are
    valid on top of each default the bench replaces them on (two three-warpgroup tiles, two
    handoff configs), and every shape it times is compiled ahead."""
    import dataclasses

    from parallel_mlp.kernels.config import parse_fields
    from parallel_mlp.kernels.warmup import mlp_keys, parse_shapes

    commands = dict(line.split(None, 1) for line in run("--list").stdout.splitlines())
    assert "-k 'three_warpgroup or handoff'" in commands["tests_overlap"]
    # both steps start with one GPU test of each schedule, named by node ids that must exist
    for name in ("tests_overlap", "configs_overlap"):
        smoke = re.findall(r"'(tests/kernels/[^']+::[^']+)'", commands[name])
        assert len(smoke) == 2 and "exit 1" in commands[name]
        collected = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", *smoke],
                                   capture_output=True, text=True, cwd=SCRIPT.parent.parent, timeout=120)
        assert "2 tests collected" in collected.stdout, collected.stdout[-2000:]
    tests = SCRIPT.parent.parent / "tests/kernels"
    assert "def test_three_warpgroup_tile_dact" in (tests / "test_tile192_gpu.py").read_text()
    assert "def test_handoff_dact" in (tests / "test_handoff_gpu.py").read_text()
    step = commands["configs_overlap"]
    variants = set(re.findall(r"--also (\S+)", step))
    assert len(variants) == 4
    shapes = parse_shapes(re.search(r"--shapes (\S+)", step).group(1))
    timed = re.findall(r"--T (\S+) --d (\S+) --h (\S+) --act ([^\s;]+)", step)
    looped = re.findall(r"'(\d+) (\d+) (\d+) (\w+)'", step)
    looped += [(*m, "gelu_tanh_approx") for m in re.findall(r"'(\d+) (\d+) (\d+)'", step)]
    timed = {t for t in timed if not t[0].startswith("$")} | set(looped)  # the loops' $1..$4 are their shapes
    assert len(timed) == 8 and {tuple(map(str, s)) for s in shapes} >= timed
    schedules = set()
    for fields in map(parse_fields, variants):
        for key in mlp_keys(8192, 1024, 2816, "swiglu") + mlp_keys(8192, 4096, 14336, "swiglu"):
            cfg = dataclasses.replace(key.config, **fields)
            schedules.add((cfg.tile_m, cfg.tile_n, cfg.consumers))
    assert schedules == {(192, 128, "cooperative"), (128, 128, "handoff")}


def test_decision_cost_answers_every_decision_by_a_constant_and_restores_them(capsys):
    """tools/decision_cost.py: inside its constant variant a stubbed fused step calls none of the
    decisions it stands for (counted through wrappers put in place first), which are back in
    place afterwards, where a step calls each of them again; a short run prints both variants."""
    sys.path.insert(0, str(TOOLS))
    try:
        import decision_cost
    finally:
        sys.path.remove(str(TOOLS))
    from parallel_mlp import autograd, backends
    from parallel_mlp.bench.host_stub import launch_groups, stubbed_kernels
    from parallel_mlp.layer import ParallelMLP

    calls = collections.Counter()

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    originals = {name: getattr(autograd, name) for name in decision_cost.DECISIONS}
    with stubbed_kernels(), launch_groups(True):
        mlp = ParallelMLP(64, 128, activation="swiglu", backend="cute", dtype=torch.bfloat16)
        x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)

        def step():
            mlp(x).sum().backward()

        try:
            for name, fn in originals.items():
                setattr(autograd, name, counting(name, fn))
            with decision_cost.constant_decisions(backends.CuteBackend):
                step()
                step()
            assert not calls
            step()
            assert set(calls) == set(decision_cost.DECISIONS)
        finally:
            for name, fn in originals.items():
                setattr(autograd, name, fn)
    assert decision_cost.main(["--rounds", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "as_is" in out and "constant" in out and "paired median" in out


def test_every_config_field_and_tool_a_step_names_exists():
    """A step that names a GemmConfig field since removed, or a tool since deleted, would fail
    only on the GPU host, after a machine start: each --also / --where list of the steps parses
    into GemmConfig's fields, and every tools/ script a step runs is in the folder."""
    from parallel_mlp.kernels.config import GemmConfig, parse_fields

    text = run("--list").stdout
    specs = re.findall(r"--(?:also|where)[ =]([A-Za-z0-9_=,.]+)", text)
    assert len(specs) > 20  # the config steps' columns
    fields = {f.name for f in dataclasses.fields(GemmConfig)}
    for spec in specs:
        parsed = parse_fields(spec)
        assert parsed and set(parsed) <= fields, spec
    scripts = set(re.findall(r"tools/(\w+\.py)", text))
    assert "host_bound_paths.py" in scripts
    assert all((TOOLS / name).is_file() for name in scripts), scripts
