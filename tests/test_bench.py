"""The single-GPU and TP benchmarks on the CPU: the dry run end to end, the rows when ours cannot
run, the command line, and the timing helpers.

The real numbers need an H200 (``python -m parallel_mlp.bench``); these tests keep the scripts
themselves working, so that the one GPU run they get does not die on a typo.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_clock import FakeClock

REPO = Path(__file__).resolve().parent.parent


def positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


def assert_no_errors(obj, path="results"):
    """Every measurement of the dry run must have produced a number, not an error or a skip."""
    if isinstance(obj, dict):
        assert "error" not in obj and "skipped" not in obj, f"{path}: {obj}"
        for k, v in obj.items():
            assert_no_errors(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            assert_no_errors(v, f"{path}[{i}]")


def test_dry_run_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    # No CUDA in the child, so the test takes the CPU path on every machine.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_mlp.bench", "--dry-run", "--json", str(out),
         "--skip-compile"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\nTargets\n" in proc.stdout  # the summary comes last
    # recompute mode's row names its ratio to eager checkpointed, whose own row is in the table
    assert "; x eager checkpointed " in proc.stdout and "eager checkpointed" in proc.stdout
    data = json.loads(out.read_text())

    assert {"meta", "ceiling", "gemms", "fused", "mlp", "cold_start", "targets"} <= data.keys()
    assert data["meta"]["device"] == "cpu" and data["meta"]["torch"] == torch.__version__
    assert data["meta"]["dry_run"] is True
    assert_no_errors({k: v for k, v in data.items() if k != "meta"})

    for when in ("start", "end"):
        assert positive(data["ceiling"][when]["tflops"])

    assert len(data["gemms"]) == 3 * 8  # three configs x (six GEMMs + two main-grad wgrads)
    for row in data["gemms"]:
        for impl in ("cublas", "ours"):
            assert positive(row[impl]["ms"]) and positive(row[impl]["tflops"])
        assert positive(row["ratio"])
        assert row["rel_err"] < 1e-2

    assert len(data["fused"]) == 3 * 3
    for row in data["fused"]:
        for impl in ("cublas", "eager", "ours"):
            assert positive(row[impl]["ms"])
        assert positive(row["time_vs_cublas"]) and positive(row["speedup_vs_eager"])

    assert len(data["mlp"]) == 3
    for row in data["mlp"]:
        assert positive(row["flops"]) and positive(row["recompute_ratio"])
        for name in ("eager", "ours", "ours_recompute"):
            v = row["variants"][name]
            assert positive(v["ms"]) and positive(v["tflops"]) and positive(v["speedup_vs_eager"])
        # ours (the torch backend here) computes the eager module's function
        assert row["variants"]["ours"]["rel_err_y"] < 2e-2
        assert row["variants"]["ours"]["rel_err_dx"] < 2e-2
        # eager under torch.utils.checkpoint replays eager's ops: its bits
        assert row["variants"]["eager_recompute"]["rel_err_y"] == 0.0
        assert positive(row["variants"]["ours_recompute"]["speedup_vs_eager_recompute"])

    cold = data["cold_start"]["torch"]
    assert positive(cold["first_fwd_bwd_s"]) and len(cold["runs"]) == 2

    assert data["targets"]
    assert {t["status"] for t in data["targets"]} <= {"PASS", "MISS", "n/a"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where cute cannot run")
def test_rows_say_why_when_ours_cannot_run(tmp_path, monkeypatch):
    from parallel_mlp.bench import report, suite

    def broken_ceiling(ctx, n):
        raise RuntimeError("boom")

    monkeypatch.setattr(suite, "bench_ceiling", broken_ceiling)
    args = suite.apply_defaults(suite.parse_args(
        ["--dry-run", "--configs", "swiglu:128", "--skip-compile", "--skip-cold-start",
         "--json", str(tmp_path / "b.json")]))
    args.backend = "cute"  # cannot run on the CPU: every row of ours must say so
    results = suite.run_single(args)

    assert "cute" in results["meta"]["ours_unavailable"]
    assert all("unavailable" in row["ours"] for row in results["gemms"])
    assert all(positive(row["cublas"]["ms"]) for row in results["gemms"])  # baselines still run
    assert "unavailable" in results["mlp"][0]["variants"]["ours"]
    assert positive(results["mlp"][0]["variants"]["eager"]["ms"])
    assert results["ceiling"]["start"]["error"] == "RuntimeError: boom"

    table = report.format_tables(results)
    assert "cannot run here" in table and "n/a" in table and "RuntimeError: boom" in table
    assert json.loads((tmp_path / "b.json").read_text())["meta"]["backend"] == "cute"


def test_cold_start_alone_with_its_breakdown_and_profile(tmp_path):
    """The cold command runs that section alone; each run stamps its steps in order, and
    PMLP_COLD_PROFILE_DIR keeps a cProfile of the warm (second) run."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PMLP_COLD_PROFILE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_mlp.bench", "cold", "--dry-run",
         "--configs", "swiglu:128", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "gemms" not in data and "mlp" not in data and "ceiling" not in data
    assert "ceiling:" not in proc.stdout
    steps = ("torch_import_s", "import_s", "cuda_init_s", "ready_s", "first_fwd_s", "first_fwd_bwd_s")
    cold = data["cold_start"]["torch"]
    for run in cold["runs"] + [cold["meta_build"]]:
        stamps = [run[k] for k in steps]
        # a training step on a model built on the device imports no sympy (torch's meta setup does)
        assert run["sympy_imported"] == (run is cold["meta_build"]), run
        assert all(positive(t) for t in stamps) and stamps == sorted(stamps), run
    assert (tmp_path / "cold_start_torch.prof").stat().st_size > 0
    assert "fwd+bwd alone" in proc.stdout and "built on meta" in proc.stdout


def cpu_ctx(iters: int, warmup: int, clock=None):
    """A CPU context whose timing reads ``clock`` (a FakeClock: no test here measures real time)."""
    from parallel_mlp.bench import harness

    ctx = harness.Ctx(device=torch.device("cpu"), dtype=torch.float32, tokens=1, d_model=1,
                      configs=[], iters=iters, warmup=warmup, backend="torch",
                      deadline=float("inf"))
    if clock is not None:
        ctx.clock = clock
    return ctx


def test_time_side_by_side_round_robin():
    """Each round calls every fn once, in order, on the same input set; warm-up rounds first;
    per fn the same result as time_calls."""
    from parallel_mlp.bench import harness

    clock = FakeClock()
    ctx = cpu_ctx(iters=5, warmup=2, clock=clock)
    calls = []

    def fn(name):
        def call(i):
            calls.append((name, i))
            clock.advance({"a": 2 ** -10, "b": 2 ** -9, "c": 0.0}[name])
        return call

    out = harness.time_side_by_side(ctx, {name: fn(name) for name in ("a", "b", "c")}, n_sets=3)

    rounds = [i % 3 for i in range(2)] + [i % 3 for i in range(5)]  # warm-up, then timed
    assert calls == [(name, i) for i in rounds for name in ("a", "b", "c")]
    assert list(out) == ["a", "b", "c"]
    alone = harness.time_calls(ctx, lambda i: None, n_sets=3)
    assert out["a"].keys() == alone.keys()
    for name, ms in (("a", 1000 * 2 ** -10), ("b", 1000 * 2 ** -9), ("c", 0.0)):
        assert out[name] == {"ms": ms, "min_ms": ms, "max_ms": ms, "iters": 5, "input_sets": 3}


def test_time_side_by_side_times_each_fn_apart():
    """A slow fn beside a fast one: each keeps its own time (the median of its calls)."""
    from parallel_mlp.bench import harness

    clock = FakeClock()
    ctx = cpu_ctx(iters=3, warmup=0, clock=clock)
    steps = iter([2 ** -6, 2 ** -5, 2 ** -6])  # the slow fn's three calls: 15.6, 31.3, 15.6 ms

    out = harness.time_side_by_side(
        ctx, {"slow": lambda i: clock.advance(next(steps)), "fast": lambda i: None})
    assert out["slow"]["ms"] == 1000 * 2 ** -6 and out["slow"]["max_ms"] == 1000 * 2 ** -5
    assert out["fast"]["ms"] == 0.0


def test_interleaved_failure_reaches_every_row():
    """When the interleaved measurement fails, every variant in it gets the error."""
    from parallel_mlp.bench import harness

    ctx = cpu_ctx(iters=2, warmup=1)

    def broken(i):
        raise RuntimeError("boom")

    fns = {"cublas": lambda i: None, "ours": broken}
    rows = harness.per_name(harness.attempt(ctx, "pair", harness.time_side_by_side, ctx, fns), fns)
    assert rows == {name: {"error": "RuntimeError: boom"} for name in ("cublas", "ours")}


def test_time_held_runs_each_fn_in_holds():
    """Held timing: each fn runs back to back for hold_s per turn, fns in turn, ctx.rounds turns;
    each keeps its own time, and the calls counted leave out the start of every hold."""
    from parallel_mlp.bench import harness

    clock = FakeClock()
    ctx = cpu_ctx(iters=3, warmup=1, clock=clock)
    ctx.hold_s, ctx.rounds = 2 ** -3, 2  # 125 ms turns
    order = []
    slow = clock.call_taking(2 ** -6, order, "slow")  # 15.625 ms: 8 calls a turn
    fast = clock.call_taking(2 ** -10, order, "fast")  # 0.9765625 ms: 128 calls a turn

    out = harness.time_side_by_side(ctx, {"slow": slow, "fast": fast})
    # warm-up: one call of each; then two turns each, every turn a run of one fn's calls, the
    # second round in reverse order (so fast's two turns run back to back)
    turns = [order[0]] + [b for a, b in zip(order, order[1:]) if a != b]
    assert turns == ["slow", "fast", "slow", "fast", "slow"]
    assert order.count("slow") == 1 + 2 * 8 and order.count("fast") == 1 + 2 * 128
    for name, ms, calls in (("slow", 1000 * 2 ** -6, 8), ("fast", 1000 * 2 ** -10, 128)):
        res = out[name]
        assert res["ms"] == res["min_ms"] == res["max_ms"] == ms
        assert res["hold_s"] == 2 ** -3 and res["rounds"] == 2
        # the first quarter of every turn (the clock settling) is left out of the count
        assert res["iters"] == 2 * (calls - calls // 4)


def test_ratio_pairs_held_timings_round_by_round():
    """Two held timings compare round by round: a host that wanders between rounds (1, 2, 3 ms)
    and one slow turn of one side (round 2) leave the paired ratio at the true 1/1.1, where the
    ratio of the two medians reads 2.0 / 3.3. Without per-round holds, or with different
    numbers of them, it is the ratio of the times."""
    from parallel_mlp.bench.harness import ratio

    base = {"ms": 2.0, "holds_ms": [1.0, 2.0, 3.0]}
    other = {"ms": 3.3, "holds_ms": [1.1, 4.0, 3.3]}
    assert ratio(base, other) == pytest.approx(1 / 1.1)
    assert ratio({"ms": 2.0}, {"ms": 3.3}) == pytest.approx(2.0 / 3.3)
    assert ratio(base, {"ms": 3.3, "holds_ms": [1.1, 4.0]}) == pytest.approx(2.0 / 3.3)
    assert ratio(base, None) is None and ratio({"error": "x"}, other) is None


def test_ratio_interval_is_the_binomial_rank_interval_of_the_round_ratios():
    """Six rounds are the fewest whose extremes hold the median at 95% (1 - 2/64 = 0.969; five:
    0.938); with 20 the 6th smallest and 6th largest (1 - 2 P(B <= 5) = 0.959, where the 7th
    would give 0.885). Rounds in any order; unpaired or too few rounds give None."""
    import random

    from parallel_mlp.bench.harness import ratio_interval

    def held(ratios):
        random.Random(0).shuffle(ratios)
        base = {"ms": 1.0, "holds_ms": [3.0 * r for r in ratios]}
        return base, {"ms": 1.0, "holds_ms": [3.0] * len(ratios)}

    assert ratio_interval(*held([0.9, 1.3, 1.0, 1.1, 0.8])) is None
    assert ratio_interval(*held([0.9, 1.3, 1.0, 1.1, 0.8, 1.2])) == pytest.approx((0.8, 1.3))
    assert ratio_interval(*held([i / 10 for i in range(1, 21)])) == pytest.approx((0.6, 1.5))
    assert ratio_interval(*held([i / 10 for i in range(1, 21)]), level=0.8) == pytest.approx(
        (0.7, 1.4))  # the 7th: 1 - 2 P(B <= 6) = 0.885; the 8th would give 0.737
    base, other = held([1.0] * 8)
    assert ratio_interval(base, {"ms": 1.0, "holds_ms": [3.0] * 7}) is None
    assert ratio_interval(base, {"ms": 1.0}) is None and ratio_interval(None, other) is None


def test_time_held_keeps_each_rounds_hold():
    from parallel_mlp.bench import harness

    clock = FakeClock()
    ctx = cpu_ctx(iters=3, warmup=0, clock=clock)
    ctx.hold_s, ctx.rounds = 2 ** -6, 3
    fns = {n: clock.call_taking(t, [], n) for n, t in (("a", 2 ** -9), ("b", 2 ** -10))}
    out = harness.time_side_by_side(ctx, fns)
    assert out["a"]["holds_ms"] == [1000 * 2 ** -9] * 3
    assert harness.ratio(out["a"], out["b"]) == 2.0


def test_held_turns_reverse_every_round_so_each_fns_mean_place_is_the_same():
    from parallel_mlp.bench import harness
    from parallel_mlp.bench.timing import turn_order

    assert turn_order(3, 0) == [0, 1, 2] and turn_order(3, 1) == [2, 1, 0]
    assert turn_order(3, 2) == [0, 1, 2] and turn_order(1, 1) == [0]
    clock = FakeClock()
    ctx = cpu_ctx(iters=3, warmup=0, clock=clock)
    ctx.hold_s, ctx.rounds = 2 ** -6, 4
    order = []
    fns = {n: clock.call_taking(2 ** -8, order, n) for n in "abc"}
    harness.time_side_by_side(ctx, fns)
    turns = [order[0]] + [b for a, b in zip(order, order[1:]) if a != b]
    assert turns == list("abcbabcb") + ["a"]  # a b c | c b a | a b c | c b a, runs merged
    places = {n: [] for n in "abc"}
    for r in range(ctx.rounds):
        for place, k in enumerate(turn_order(3, r)):
            places["abc"[k]].append(place)
    assert len({sum(p) for p in places.values()}) == 1


def test_held_timing_heats_every_fn_untimed_before_the_first_turn():
    """With ctx.heat_s, every fn runs in turn, untimed, for that long before the first held
    turn: the turns and what they time are those of a run without it."""
    from parallel_mlp.bench import harness

    results = {}
    for heat_s in (0.0, 2 ** -5):
        clock = FakeClock()
        ctx = cpu_ctx(iters=3, warmup=1, clock=clock)
        ctx.hold_s, ctx.rounds, ctx.heat_s = 2 ** -6, 2, heat_s
        order = []
        fns = {n: clock.call_taking(2 ** -8, order, n) for n in "ab"}
        results[heat_s] = harness.time_side_by_side(ctx, fns), order
    (plain, plain_order), (heated, heated_order) = results[0.0], results[2 ** -5]
    # warm-up a b, then 2 ** -5 s of a b cycles (2 ** -7 s each: four), then the same turns
    assert heated_order[:2] == ["a", "b"] and heated_order[2:10] == list("ab") * 4
    assert heated_order[10:] == plain_order[2:]
    for n in "ab":
        assert heated[n]["holds_ms"] == plain[n]["holds_ms"]
        assert heated[n]["iters"] == plain[n]["iters"]


@pytest.mark.parametrize("argv,message", [(["--hold-s", "-1"], "--hold-s -1: must be >= 0"),
                                          (["--rounds", "0"], "--rounds 0: must be >= 1")])
def test_bad_timing_flags_are_refused(argv, message, capsys):
    from parallel_mlp.bench import suite

    with pytest.raises(SystemExit):
        suite.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("hold_s,mode", [("0", []), ("0.05", []), ("0", ["--sequence-parallel"])],
                         ids=["call-by-call", "held", "sequence-parallel"])
def test_tp_mode_on_two_gloo_ranks(tmp_path, hold_s, mode):
    """tp under torchrun with two CPU ranks (gloo): eager, ours and ours with tp_comm_overlap
    run, checked against each other, timed call by call (--hold-s 0) or held in turns of a step
    count the ranks agree on; replicated or sequence parallel; the link's bandwidth is stated."""
    out = tmp_path / "tp.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "parallel_mlp.bench", "tp", "--dry-run", "--configs", "swiglu:128,relu:64",
         "--hold-s", hold_s, "--json", str(out), *mode],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    for row in data["tp"]:  # PyTorch's async TP needs CUDA: its row says so
        assert "CUDA with NCCL" in row["variants"].pop("torch_async_tp")["unavailable"]
    assert_no_errors(data["tp"])
    meta = data["meta"]
    assert meta["world_size"] == 2 and meta["hold_s"] == float(hold_s)
    assert meta["sequence_parallel"] == bool(mode)
    assert positive(meta["link"]["all_gather_busbw_gbs"]) and positive(meta["link"]["all_reduce_ms"])
    for row in data["tp"]:
        eager, ours = row["variants"]["megatron_eager"], row["variants"]["ours"]
        overlap = row["variants"]["ours_overlap"]
        assert positive(eager["ms"]) and positive(ours["ms"]) and positive(row["speedup_vs_eager"])
        assert positive(overlap["ms"]) and positive(row["overlap_speedup_vs_eager"])
        for variant in (ours, overlap):  # bf16 against eager
            assert variant["rel_err_y"] < 2e-2 and variant["rel_err_dx"] < 2e-2
        if hold_s != "0":
            assert ours["steps_per_turn"] >= 5 and ours["rounds"] == 3
            assert ours["min_ms"] <= ours["ms"] <= ours["max_ms"]
        else:
            assert ours["ms"] >= ours["rank_ms"]  # the slowest rank's median
    assert ("timing: held" if hold_s != "0" else "timing: call by call") in proc.stdout


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_weight_grads_read_every_variant_in_our_layout(act):
    """The benchmark compares weight gradients across variants: EagerMLP's W1 in gate/up halves
    is read back interleaved, so equal functions give equal gradients (fp64, CPU); under
    torch.compile's wrapper too; a model without the known weights gives None."""
    from parallel_mlp.bench.models import (EagerMLP, build_parallel_mlp, chunked_w1, fc1_features,
                                           train_step, weight_grads)

    gated = act == "swiglu"
    d, h = 16, 12
    w1 = torch.randn(fc1_features(act, h), d, dtype=torch.float64)
    w2 = torch.randn(d, h, dtype=torch.float64)
    x = torch.randn(5, d, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(5, d, dtype=torch.float64)
    ours = build_parallel_mlp(w1, w2, act, h, backend="torch")
    eager = EagerMLP(chunked_w1(w1, gated), w2.clone(), act)
    got = []
    for model in (ours, eager):
        train_step(model, x, dy)
        got.append(weight_grads(model, gated))
    for a, b in zip(*got):
        torch.testing.assert_close(a, b)

    class Wrapped(torch.nn.Module):  # what torch.compile returns: the model as _orig_mod
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

    assert weight_grads(Wrapped(eager), gated)[1] is eager.w2.grad
    assert weight_grads(torch.nn.Linear(2, 2), gated) is None


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_checkpointed_eager_is_eager_to_the_bit_and_keeps_x_alone(act):
    """Recompute mode's baseline: EagerMLP under torch.utils.checkpoint gives eager's output and
    gradients bit for bit (bf16, CPU), and what its forward leaves for backward is x alone: no
    tensor of the step's hidden width stays alive between forward and backward."""
    from parallel_mlp.bench.models import (CheckpointedEagerMLP, EagerMLP, fc1_features,
                                           train_step, weight_grads)

    gated = act == "swiglu"
    d, h, T = 16, 24, 7
    w1 = torch.randn(fc1_features(act, h), d).bfloat16()
    w2 = torch.randn(d, h).bfloat16()
    x = torch.randn(T, d).bfloat16().requires_grad_(True)
    dy = torch.randn(T, d).bfloat16()
    got = []
    for cls in (EagerMLP, CheckpointedEagerMLP):
        model = cls(w1.clone(), w2.clone(), act)
        y = train_step(model, x, dy)
        got.append((y, x.grad.clone(), *weight_grads(model, gated)))
    for a, b in zip(*got):
        assert torch.equal(a, b)

    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    model = CheckpointedEagerMLP(w1.clone(), w2.clone(), act)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    # x itself; the replay in backward saves the rest. Some torch versions' checkpoint also saves
    # an empty placeholder (shape (0,) with torch 2.9), which holds no memory.
    kept = [shape for shape in saved if math.prod(shape) > 0]
    assert kept == [(T, d)], saved
    assert all(shape == (0,) for shape in saved if shape not in kept), saved


def test_train_step_clears_every_parameters_grad_each_step():
    """train_step clears grads as an optimizer does, over a list made at the first step: a
    second step's gradients are that step's alone, in a nested module too (ParallelMLP's
    weights sit in its fc1 and fc2)."""
    from parallel_mlp.bench.models import build_parallel_mlp, parameter_list, train_step

    torch.manual_seed(0)
    w1, w2 = torch.randn(2 * 24, 16), torch.randn(16, 24)
    model = build_parallel_mlp(w1, w2, "swiglu", 24)
    x, dy = torch.randn(5, 16, requires_grad=True), torch.randn(5, 16)
    train_step(model, x, dy)
    first = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    train_step(model, x, dy)
    second = [p.grad for p in model.parameters()] + [x.grad]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert {id(p) for p in parameter_list(model)} == {id(model.fc1.weight), id(model.fc2.weight)}


@pytest.mark.parametrize("act,T", [("swiglu", 7), ("gelu_tanh_approx", 13)])
def test_gemm_ceiling_runs_the_mlps_six_gemms_and_nothing_else(act, T):
    """The sweep's GEMM bound: one step is exactly six matrix products, of the MLP's six GEMM
    shapes (M x N x K: fc1, fc2, the dact's dy @ W2, dW2, dx, dW1), with no elementwise op, and
    its values are the stand-in's formulas (fp64 against an independent reference)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from parallel_mlp.bench.models import GemmCeiling, fc1_features, train_step

    d, h = 16, 12
    F = fc1_features(act, h)
    w1 = torch.randn(F, d, dtype=torch.float64)
    w2 = torch.randn(d, h, dtype=torch.float64)
    x = torch.randn(T, d, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(T, d, dtype=torch.float64)
    model = GemmCeiling(w1.clone(), w2.clone())

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.mm, self.other = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.mm.default:
                a, b = args
                self.mm.append((a.shape[0], b.shape[1], a.shape[1]))
            elif func._schema.name not in ("aten::t", "aten::slice", "aten::detach",
                                            "aten::view", "aten::transpose", "aten::alias"):
                self.other.append(func._schema.name)
            return out

    with Ops() as ops:
        y = train_step(model, x, dy)
    assert sorted(ops.mm) == sorted([(T, F, d), (T, d, h), (T, h, d), (d, h, T), (T, d, F),
                                     (F, d, T)])
    assert ops.other == []

    preact = x.detach() @ w1.t()
    post = preact.flatten()[:T * h].reshape(T, h)  # contiguous, fc1's output read in place
    torch.testing.assert_close(y, post @ w2.t())
    torch.testing.assert_close(x.grad, preact @ w1)
    torch.testing.assert_close(model.w1.grad, preact.t() @ x.detach())
    torch.testing.assert_close(model.w2.grad, dy.t() @ post)
    assert model.computes_the_mlp is False


def test_first_step_checks_the_mlps_but_not_the_gemm_ceiling():
    """A stand-in that does not compute the MLP records no errors against the reference, and
    leaves the reference as it was."""
    from parallel_mlp.bench.harness import Ctx
    from parallel_mlp.bench.models import EagerMLP, GemmCeiling, first_step

    ctx = Ctx(device=torch.device("cpu"), dtype=torch.float32, tokens=5, d_model=8, configs=[],
              iters=1, warmup=0, backend="torch", deadline=float("inf"))
    w1, w2 = torch.randn(24, 8), torch.randn(8, 12)
    xs, dys = [torch.randn(5, 8, requires_grad=True)], [torch.randn(5, 8)]
    out, ref = first_step(ctx, EagerMLP(w1.clone(), w2.clone(), "swiglu"), xs, dys, None, True)
    out, same = first_step(ctx, GemmCeiling(w1.clone(), w2.clone()), xs, dys, ref, True)
    assert same is ref and not any(key.startswith("rel_err") for key in out)
    assert out["first_step_s"] > 0 and xs[0].grad is None


def _fragment_the_shared_pool():
    """Leave the caching allocator's shared pool with free blocks of odd sizes in segments that
    stay partly held, as the variants measured before another leave it; returns what holds
    them."""
    blocks = [torch.empty(int(mib * 2 ** 20) // 2, dtype=torch.bfloat16, device="cuda")
              for mib in (3.5, 1.25, 6.75, 2.5, 11.5, 0.75, 5.25, 2.75, 13.0, 1.5)]
    return blocks[::2]  # the others are freed into the pool, between held neighbours


@pytest.mark.gpu
def test_step_peak_is_the_variants_own():
    """A variant's step peak is its own steady state: eager, then a second copy of it measured
    after free blocks of odd sizes were left in the shared pool, read the same bytes (T=512
    d=1024 swiglu, where a 25.0 MiB step read 25.5 and 28.0 MiB from the shared pool)."""
    from parallel_mlp.bench.harness import Ctx
    from parallel_mlp.bench.models import EagerMLP, step_peak_memory

    ctx = Ctx(device=torch.device("cuda"), dtype=torch.bfloat16, tokens=0, d_model=0, configs=[],
              iters=1, warmup=0, backend="auto", deadline=float("inf"), quiet=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    tokens, d, h = 512, 1024, 2816
    w1 = torch.randn(2 * h, d, device="cuda", generator=g).bfloat16() / d**0.5
    w2 = torch.randn(d, h, device="cuda", generator=g).bfloat16() / h**0.5
    xs = [torch.randn(tokens, d, device="cuda", generator=g).bfloat16().requires_grad_()]
    dys = [torch.randn(tokens, d, device="cuda", generator=g).bfloat16()]
    first = step_peak_memory(ctx, EagerMLP(w1.clone(), w2.clone(), "swiglu"), xs, dys)
    held = _fragment_the_shared_pool()
    second = step_peak_memory(ctx, EagerMLP(w1.clone(), w2.clone(), "swiglu"), xs, dys)
    del held
    assert first["peak_over_start_gb"] == second["peak_over_start_gb"], (first, second)
    asked = first["requested_peak_over_start_gb"]
    # What the step asks for: dW1, dW2, dx and the activations' gradients, at least.
    assert asked * 2 ** 30 >= (2 * h * d + d * h + tokens * d) * 2
    assert first["peak_over_start_gb"] >= asked


def test_the_fused_variant_runs_the_fused_function_where_auto_would_take_the_small_step(monkeypatch):
    """ours_fused (bench.models.FusedParallelMLP) is auto's fused path at every size: the same
    function ParallelMLP runs above the small-step thresholds, with the same values."""
    from parallel_mlp import small_step
    from parallel_mlp.bench.models import FusedParallelMLP, build_parallel_mlp

    monkeypatch.setattr(small_step, "applies", lambda *a, **kw: True)
    torch.manual_seed(0)
    w1, w2 = torch.randn(64, 16), torch.randn(16, 32)
    x = torch.randn(5, 16, requires_grad=True)
    plain = build_parallel_mlp(w1, w2, "swiglu", 32)
    fused = build_parallel_mlp(w1, w2, "swiglu", 32, cls=FusedParallelMLP)
    y_small, y_fused = plain(x), fused(x)
    assert type(y_fused.grad_fn).__name__.startswith("ParallelMLPFunction")
    assert not type(y_small.grad_fn).__name__.startswith("ParallelMLPFunction")
    torch.testing.assert_close(y_fused, y_small)


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_fused_and_eager_hold_one_function_and_the_sweeps_input_sets(act):
    """The launch-group probes' models compute the same MLP (the gated weight's layouts told
    apart by chunked_w1), and recompute_too adds the sweep's other two variants."""
    from parallel_mlp.bench.models import FusedParallelMLP, fused_and_eager

    models, inputs = fused_and_eager((6, 8, 4, act), input_sets=3, device="cpu",
                                     dtype=torch.float32)
    assert list(models) == ["ours", "eager"] and isinstance(models["ours"], FusedParallelMLP)
    assert len(inputs) == 3 and all(x.requires_grad and x.shape == dy.shape == (6, 8)
                                    for x, dy in inputs)
    x = inputs[1][0]
    torch.testing.assert_close(models["ours"](x), models["eager"](x), rtol=1e-5, atol=1e-5)
    more, _ = fused_and_eager((6, 8, 4, act), recompute_too=True, device="cpu",
                              dtype=torch.float32)
    assert list(more) == ["ours", "eager", "ours recompute", "eager copy"]
    assert more["ours recompute"].recompute


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_ours_and_quack_share_the_weights_and_one_input_set(act, monkeypatch):
    """The quack tools' pair: ours on backend auto, and quack's MLP built from ours's very
    weights (quack stood in for on CPU), with the probes' first input set."""
    from parallel_mlp import ParallelMLP
    from parallel_mlp.bench import quack_baseline
    from parallel_mlp.bench.models import fused_and_eager, ours_and_quack

    given = {}
    monkeypatch.setattr(quack_baseline, "build",
                        lambda w1, w2, a, h: given.update(w1=w1, w2=w2, act=a, h=h) or "quack")
    runs, x, dy = ours_and_quack((6, 8, 4, act), device="cpu")
    assert list(runs) == ["ours", "quack"] and runs["quack"] == "quack"
    ours = runs["ours"]
    assert type(ours) is ParallelMLP and ours.backend == "auto"
    assert torch.equal(given["w1"], ours.fc1.weight) and torch.equal(given["w2"], ours.fc2.weight)
    assert (given["act"], given["h"]) == (act, 4)
    models, inputs = fused_and_eager((6, 8, 4, act), 1, device="cpu")
    assert torch.equal(x, inputs[0][0]) and torch.equal(dy, inputs[0][1]) and x.requires_grad
    torch.testing.assert_close(ours(x), models["eager"](x))


def test_time_held_counts_each_fns_turns_when_asked():
    """With Ctx.turn_counts, each fn's result holds what the counts moved by over its own timed
    turns (warm-up calls excluded), per turn; without it, no such key."""
    from parallel_mlp.bench import harness

    clock = FakeClock()
    ctx = cpu_ctx(iters=3, warmup=1, clock=clock)
    ctx.hold_s, ctx.rounds = 2 ** -6, 2  # 15.625 ms turns
    counts = {"captures": 0, "replays": 0}
    slow_step, fast_step = clock.call_taking(2 ** -8), clock.call_taking(2 ** -10)

    def grouped(i):  # 4 calls a turn: a capture at each turn's first, replays after
        counts["captures" if counts.get("fresh", True) else "replays"] += 1
        counts["fresh"] = False
        slow_step(i)

    def plain(i):  # 16 calls a turn, no groups; the next turn of grouped starts fresh
        counts["fresh"] = True
        fast_step(i)

    ctx.turn_counts = lambda: {k: v for k, v in counts.items() if k != "fresh"}
    out = harness.time_side_by_side(ctx, {"grouped": grouped, "plain": plain})
    # rounds: grouped, plain | plain, grouped: grouped's second turn follows plain's, so it
    # starts fresh again; its first turn came after the warm-up's plain call
    assert out["grouped"]["per_turn"] == {"captures": 1.0, "replays": 3.0}
    assert out["plain"]["per_turn"] == {"captures": 0.0, "replays": 0.0}
    ctx.turn_counts = None
    assert "per_turn" not in harness.time_side_by_side(ctx, {"plain": plain})["plain"]
    total = {"a": 1}
    harness.add_changes(total, {"a": 2, "b": 1}, {"a": 5, "c": 2})
    assert total == {"a": 4, "b": -1, "c": 2}


def test_a_cuda_context_counts_the_launch_groups_per_turn_by_default():
    """On CUDA, held turns read the fused function's launch-group counts (a copy of
    GRAPHS.stats, so later calls do not change an earlier reading); on the CPU nothing."""
    from parallel_mlp.bench import harness
    from parallel_mlp.launch_graphs import GRAPHS

    ctx = harness.Ctx(device=torch.device("cuda"), dtype=torch.bfloat16, tokens=0, d_model=0,
                      configs=[], iters=1, warmup=0, backend="auto", deadline=float("inf"))
    assert ctx.turn_counts is harness.launch_counts
    assert cpu_ctx(iters=1, warmup=0).turn_counts is None
    saved = GRAPHS.stats.copy()
    try:
        GRAPHS.stats["captures"] = 3
        reading = harness.launch_counts()
        GRAPHS.stats["captures"] += 1
        assert reading["captures"] == 3 and harness.launch_counts()["captures"] == 4
    finally:
        GRAPHS.stats.clear()
        GRAPHS.stats.update(saved)
