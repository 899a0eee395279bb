"""The shape sweep on the CPU: its grid, its time plan, its table, JSON and heat maps, quack's
driver (missing, patched, refused off its fused path), and a dry run end to end."""

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from parallel_mlp.bench import quack_baseline, sweep, sweep_report
from parallel_mlp.bench.progress import Progress
from parallel_mlp.bench.sweep_grid import (
    ACTIVATIONS,
    DRY_RUN,
    GRID,
    MAX_T_TIMES_D,
    QUICK,
    TOKENS,
    TP_SIZES,
    WIDTHS,
    Shape,
    global_hidden,
)

REPO = Path(__file__).resolve().parent.parent


# ---- the grid --------------------------------------------------------------------------------


def test_global_hidden_follows_the_recipes():
    # Llama-style 8/3 d rounded up to 256: Llama 2 7B's 11008, 13B's 13824
    assert [global_hidden(d, "swiglu") for d in WIDTHS] == [2816, 5632, 11008, 13824, 22016]
    assert [global_hidden(d, "gelu_tanh_approx") for d in WIDTHS] == [4 * d for d in WIDTHS]


def test_shards_split_the_global_hidden_size():
    s = Shape(8192, 4096, "swiglu", tp=8)
    assert (s.hidden, s.shard) == (11008, 1376)
    assert Shape(512, 1024, "gelu_tanh_approx", tp=8).shard == 512
    assert Shape(8192, 4096, "swiglu", hidden=14336).shard == 14336
    with pytest.raises(ValueError, match="not divisible by TP 3"):
        Shape(8192, 4096, "swiglu", tp=3)
    assert s.label == "T=8192 d=4096 swiglu h=1376 (TP8 of 11008)"
    assert s.flops == 3 * (2 * 8192 * 4096 * 2 * 1376 + 2 * 8192 * 1376 * 4096)


def test_grid_covers_every_axis_in_about_30_shapes():
    assert len(GRID) == 30 and len(set(GRID)) == 30
    assert {s.tokens for s in GRID} == set(TOKENS)
    assert {s.d for s in GRID} == set(WIDTHS)
    assert {s.tp for s in GRID} == set(TP_SIZES)
    assert {s.act for s in GRID} == set(ACTIVATIONS)
    for act in ACTIVATIONS:  # each activation meets the extremes of T and d
        mine = [s for s in GRID if s.act == act]
        assert {min(TOKENS), max(TOKENS)} <= {s.tokens for s in mine}
        assert {min(WIDTHS), max(WIDTHS)} <= {s.d for s in mine}
    # the common shards at T=8192: d=4096 swiglu at every TP size
    assert {s.tp for s in GRID if (s.tokens, s.d, s.act, s.model) == (8192, 4096, "swiglu", "")} \
        == set(TP_SIZES)
    assert set(QUICK) <= set(GRID) and GRID[0] == QUICK[0]


@pytest.mark.parametrize("shape", GRID + DRY_RUN, ids=lambda s: s.label)
def test_every_shape_is_aligned_and_bounded(shape):
    assert shape.tokens * shape.d <= MAX_T_TIMES_D
    assert shape.shard * shape.tp == shape.hidden
    assert shape.d % 64 == 0 and shape.shard % 8 == 0  # 16-byte bf16 rows everywhere
    if not shape.model:
        assert shape.hidden == global_hidden(shape.d, shape.act)
    if shape.act == "swiglu":
        assert shape.hidden % 256 == 0 and shape.shard % (256 // shape.tp) == 0


# ---- the plan --------------------------------------------------------------------------------


def plan_for(argv):
    args = sweep.apply_defaults(sweep.parse_args(["--estimate", *argv]))
    shapes, names = sweep.grid(args), sweep.variants(args)
    n_kernels = len(sweep.kernel_keys(shapes, args.dtype, 132))
    return args, sweep.estimate(shapes, names, args, n_kernels, warm_quack=True)


def test_the_default_sweep_fits_one_device_call():
    args, plan = plan_for(["-j", "16"])
    assert args.hold_s == sweep.DEFAULT_HOLD_S and args.rounds == sweep.DEFAULT_ROUNDS
    assert plan["total_s"] < 9 * 60 and plan["total_s"] < args.budget_s + 60
    assert len(plan["per_shape_s"]) == 30 and plan["kernels"] > 30
    # holds are most of it: 30 shapes x 7 variants x 2 turns (or the same time in short turns)
    assert plan["parts_s"]["shapes"] > 30 * 7 * 2 * args.hold_s


def test_host_bound_steps_take_short_turns_in_the_same_time():
    args = sweep.apply_defaults(sweep.parse_args(["--estimate"]))
    small = [s for s in GRID if sweep.host_bound(s)]
    big = [s for s in GRID if not sweep.host_bound(s)]
    # the A/A runs' shapes (SHORT_TURN_S) are host-bound; 1 ms of GPU work is not
    assert {(s.tokens, s.d, s.act) for s in small} >= {
        (512, 1024, "swiglu"), (4096, 1024, "gelu_tanh_approx"), (2048, 2048, "swiglu")}
    assert all(s.flops / sweep.STEP_RATE > 0.9e-3 for s in big if s.tokens == 8192)
    assert big and all(s.flops > max(x.flops for x in small) for s in big)
    for s in big:
        assert sweep.turns(s, args) == (args.hold_s, args.rounds)
    for s in small:
        hold_s, rounds = sweep.turns(s, args)
        assert hold_s == sweep.SHORT_TURN_S
        assert hold_s * rounds == pytest.approx(args.hold_s * args.rounds)
    # off, or with turns no longer than the short ones, every shape takes --hold-s turns
    for flags in (["--estimate", "--short-turns-s", "0"], ["--estimate", "--hold-s", "0.05"],
                  ["--dry-run"]):
        args = sweep.apply_defaults(sweep.parse_args(flags))
        assert {sweep.turns(s, args) for s in GRID} == {(args.hold_s, args.rounds)}


def test_a_row_times_in_its_own_turns_and_restores_the_context(monkeypatch):
    seen = []

    def fake_bench_mlp(ctx, act, h, names, extra):
        seen.append((ctx.hold_s, ctx.rounds))
        return {"variants": {"eager": {"ms": 1.0}}}

    monkeypatch.setattr(sweep, "bench_mlp", fake_bench_mlp)
    ctx = SimpleNamespace(hold_s=0.8, rounds=2, tokens=0, d_model=0, device=None,
                                backend="torch")
    monkeypatch.setattr(sweep, "takes_small_step", lambda ctx, shape: False)
    row = sweep.sweep_row(ctx, GRID[0], ["eager"], False, (0.05, 32))
    assert seen == [(0.05, 32)] and row["turns"] == {"hold_s": 0.05, "rounds": 32}
    assert (ctx.hold_s, ctx.rounds) == (0.8, 2)
    row = sweep.sweep_row(ctx, GRID[0], ["eager"], False, (0.8, 2))
    assert seen[-1] == (0.8, 2) and "turns" not in row


def test_the_report_states_the_timings_spread_and_the_short_turns():
    rows = [{"label": f"s{i}", "variants": {"eager": {"ms": 1.0}, "ours": {"ms": 0.9},
                                           "eager_copy": {"ms": ms}}}
            for i, ms in enumerate((0.95, 1.04))]
    rows[0]["turns"] = {"hold_s": 0.05, "rounds": 32}
    text = sweep_report.format_sweep({"meta": {"hold_s": 0.8, "rounds": 2}, "rows": rows})
    # eager's time over its copy's: 1/0.95 and 1/1.04, worst and best
    assert "eager vs a second copy of itself (the timing's spread): geomean" in text
    assert "worst 0.962x (s1)" in text and "best 1.053x (s0)" in text
    assert "host-bound steps (less GPU work than the host's launches): 0.05 s x 32 turns" in text
    assert "eager, a second copy" in text  # its own line in the table


def test_quick_is_about_two_minutes():
    args, plan = plan_for(["--quick", "-j", "16"])
    assert args.hold_s == sweep.QUICK_HOLD_S
    assert plan["total_s"] < 150


def test_estimate_prints_the_plan(capsys):
    assert sweep.main(["--estimate", "--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"plan: {len(QUICK)} shapes x 7 variants")
    assert "estimate: ~" in out and QUICK[0].label in out


def test_variants_follow_the_flags():
    args = sweep.parse_args(["--skip-compile", "--no-quack"])
    assert sweep.variants(args) == ["eager", "ours", "ours_recompute", "eager_recompute",
                                    "eager_copy"]
    args = sweep.parse_args(["--skip-compile", "--no-quack", "--no-eager-copy",
                             "--no-eager-recompute"])
    assert sweep.variants(args) == ["eager", "ours", "ours_recompute"]
    args = sweep.parse_args(["--ceiling", "--graphed", "--torch-backend"])
    assert sweep.variants(args) == ["eager", "ours", "ours_recompute", "eager_recompute",
                                    "torch_backend", "gemm_ceiling", "eager_graphed",
                                    "ours_graphed", "compile", "quack", "eager_copy"]
    args = sweep.parse_args(["--ceiling", "--no-eager-recompute"])
    assert sweep.variants(args)[:4] == ["eager", "ours", "ours_recompute", "gemm_ceiling"]
    args = sweep.parse_args(["--all-cute", "--skip-compile", "--no-quack"])
    assert sweep.variants(args)[:5] == ["eager", "ours", "ours_recompute", "eager_recompute",
                                        "ours_cute"]
    # on cute, ours already is every GEMM on our kernels
    args = sweep.parse_args(["--all-cute", "--backend", "cute"])
    assert "ours_cute" not in sweep.variants(args)


def test_the_summary_states_the_gemm_bound_and_ours_against_it():
    """--ceiling: eager's time over the six GEMMs' (what fusing can win at most) and the six
    GEMMs' over ours (1.0 where the activation is entirely hidden), each round by round."""
    rows = [{"label": label, "variants": {"eager": {"ms": e}, "ours": {"ms": o},
                                          "gemm_ceiling": {"ms": c}}}
            for label, e, o, c in (("a", 1.2, 1.1, 1.0), ("b", 2.0, 2.0, 1.6))]
    text = sweep_report.format_sweep({"meta": {"hold_s": 0.8, "rounds": 2}, "rows": rows})
    assert ("the GEMM bound (cuBLAS's six GEMMs, no activation) vs eager: geomean 1.225x   "
            "worst 1.200x (a)   best 1.250x (b)   2 shapes") in text
    assert "ours vs the GEMM bound: geomean 0.853x   worst 0.800x (b)   best 0.909x (a)" in text
    assert "six cuBLAS GEMMs, no act" in text  # its own line in the table
    rows = [{"label": "a", "variants": {"eager": {"ms": 1.0}, "ours": {"ms": 1.0}}}]
    assert "GEMM bound" not in sweep_report.format_sweep({"meta": {}, "rows": rows})


def test_the_summary_holds_recompute_against_eager_checkpointed_and_states_memory():
    """Recompute mode against eager and against eager under torch.utils.checkpoint (the same
    memory promise), and per pair of modes the shapes where ours' step peak is higher."""
    def row(label, eager, rec, eager_rec, peaks):
        names = ("eager", "ours", "ours_recompute", "eager_recompute", "quack")
        v = {n: {"ms": ms, "peak_over_start_gb": gb / 1024}
             for n, ms, gb in zip(names, (eager, 1.0, rec, eager_rec, 1.1), peaks)}
        return {"label": label, "variants": v}

    rows = [row("a", 1.1, 1.2, 1.5, (25.5, 26.5, 26.0, 20.0, 25.0)),
            row("b", 2.2, 2.4, 2.4, (100.0, 90.0, 40.0, 41.0, 95.0))]
    text = sweep_report.format_sweep({"meta": {}, "rows": rows})
    assert "ours recompute vs eager: geomean 0.917x   worst 0.917x (a)" in text
    assert ("ours recompute vs eager checkpointed (x kept alone, as ours): geomean 1.118x   "
            "worst 1.000x (b)   best 1.250x (a)   2 shapes") in text
    assert "step peak, ours vs eager: higher at 1 of 2 shapes: a (26.5 vs 25.5 MiB)" in text
    assert "step peak, ours vs quack: higher at 1 of 2 shapes: a (26.5 vs 25.0 MiB)" in text
    assert ("step peak, ours recompute vs eager, checkpointed: higher at 1 of 2 shapes: "
            "a (26.0 vs 20.0 MiB)") in text
    assert "step peak, ours recompute vs eager: higher at 1 of 2 shapes" in text
    # without the checkpointed eager (older results), no line about it
    for r in rows:
        del r["variants"]["eager_recompute"]
    text = sweep_report.format_sweep({"meta": {}, "rows": rows})
    assert "checkpointed" not in text


def test_torch_backend_and_tokens_flags():
    args = sweep.parse_args(["--torch-backend", "--no-quack", "--no-eager-copy",
                             "--no-eager-recompute", "--tokens", "2048,512"])
    assert sweep.variants(args) == ["eager", "ours", "ours_recompute", "torch_backend", "compile"]
    assert {s.tokens for s in sweep.grid(args)} == {512, 2048}
    assert sweep.grid(args) == tuple(s for s in GRID if s.tokens in (512, 2048))
    # with --backend torch, ours already is the torch backend
    args = sweep.parse_args(["--torch-backend", "--backend", "torch"])
    assert "torch_backend" not in sweep.variants(args)
    with pytest.raises(ValueError, match="--tokens 3: no shape"):
        sweep.grid(sweep.parse_args(["--tokens", "3"]))


def test_shape_flag_picks_grid_shapes_by_tokens_width_activation_and_shard():
    args = sweep.parse_args(["--shape", "512,1024,gelu_tanh_approx",
                             "--shape", "8192,4096,gelu_tanh_approx,2048"])
    picked = sweep.grid(args)
    assert [(s.tokens, s.d, s.act, s.shard) for s in picked] == [
        (s.tokens, s.d, s.act, s.shard) for s in GRID
        if (s.tokens, s.d, s.act) == (512, 1024, "gelu_tanh_approx")
        or (s.tokens, s.d, s.act, s.shard) == (8192, 4096, "gelu_tanh_approx", 2048)]
    assert len(picked) == 2
    # both filters: a shape must match both
    args = sweep.parse_args(["--tokens", "8192", "--shape", "512,1024,gelu_tanh_approx",
                             "--shape", "8192,4096,gelu_tanh_approx,2048"])
    assert [s.tokens for s in sweep.grid(args)] == [8192]
    with pytest.raises(ValueError, match="--shape 512,1024,swiglu,99: no shape of this grid"):
        sweep.grid(sweep.parse_args(["--shape", "512,1024,swiglu,99"]))
    for bad in ("512,1024", "512,x,swiglu", "1,2,swiglu,3,4"):
        with pytest.raises(SystemExit):
            sweep.parse_args(["--shape", bad])


def test_graphed_flag_adds_both_graphed_variants_and_their_capture_time():
    args = sweep.parse_args(["--graphed", "--torch-backend", "--no-quack", "--skip-compile",
                             "--no-eager-copy", "--no-eager-recompute"])
    assert sweep.variants(args) == ["eager", "ours", "ours_recompute", "torch_backend",
                                    "eager_graphed", "ours_graphed"]
    args = sweep.apply_defaults(args)
    # a graphed variant costs what a plain one does, plus its capture
    plain = sweep.shape_s(GRID[0], ["eager", "ours", "ours_recompute"], args)
    graphed = sweep.shape_s(GRID[0], ["eager", "ours", "ours_graphed"], args)
    assert graphed == pytest.approx(plain + sweep.GRAPH_CAPTURE_S)


def test_graphed_variants_are_unavailable_without_cuda():
    from parallel_mlp.bench.harness import Ctx, unavailable

    ctx = Ctx(device=torch.device("cpu"), dtype=torch.bfloat16, tokens=8, d_model=8, configs=[],
              iters=1, warmup=0, backend="torch", deadline=float("inf"))
    assert unavailable(ctx, "eager_graphed") == {"unavailable": "CUDA graphs need a GPU"}
    assert unavailable(ctx, "ours_graphed") == {"unavailable": "CUDA graphs need a GPU"}
    assert unavailable(ctx, "eager") is None


def test_tokens_that_match_nothing_are_an_error_and_the_dry_run_ignores_them(capsys):
    assert sweep.main(["--estimate", "--tokens", "3"]) == 2
    assert "sweep: error: --tokens 3: no shape of this grid" in capsys.readouterr().err
    args = sweep.apply_defaults(sweep.parse_args(["--dry-run", "--tokens", "512"]))
    assert args.tokens is None and sweep.grid(args) == DRY_RUN
    assert "the dry run keeps its tiny shapes" in capsys.readouterr().err


def test_bad_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        sweep.parse_args(["--hold-s", "-1"])
    assert "--hold-s -1: must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.parse_args(["--tokens", "512,many"])
    assert "--tokens '512,many': give token counts separated by commas" in capsys.readouterr().err


# ---- the report ------------------------------------------------------------------------------


def fake_results(quack_reason=None):
    """Two swiglu shards sharing a (T, d) cell, a gelu shape, a skipped shape."""
    def row(shape, ours, eager, quack, disagree=()):
        variants = {"eager": {"ms": eager}, "ours": {"ms": ours, "rel_err_y": 0.004,
                                                     "rel_err_dx": 0.005},
                    "ours_recompute": {"ms": ours * 1.2}, "compile": {"ms": eager * 0.95},
                    "quack": {"unavailable": quack_reason} if quack_reason else {"ms": quack}}
        for v in variants.values():
            if "ms" in v:
                v["speedup_vs_eager"] = eager / v["ms"]
        return sweep.shape_record(shape) | {"variants": variants, "recompute_ratio": 1.2,
                                            "disagree": list(disagree)}

    rows = [row(Shape(8192, 4096, "swiglu", 1), 10.0, 11.0, 10.5),
            row(Shape(8192, 4096, "swiglu", 2), 5.0, 5.2, 4.5, disagree=["quack"]),
            row(Shape(512, 1024, "gelu_tanh_approx", 8), 0.2, 0.19, 0.25),
            sweep.shape_record(Shape(65536, 2048, "swiglu", 8))
            | {"skipped": "over the time budget (3 s left)"}]
    meta = {"device": "NVIDIA H200", "dtype": "bfloat16", "backend": "cute", "hold_s": 0.8,
            "rounds": 2, "variants": list(sweep.VARIANTS),
            "quack": {"version": "0.6.5", "tuned": False, "unavailable": quack_reason}}
    return {"meta": meta, "rows": rows}


def test_table_has_every_variant_and_the_summary():
    text = sweep_report.format_sweep(fake_results())
    assert "held, each compared variant back to back for 0.8 s per turn, 2 turns" in text
    assert "quack 0.6.5: quack.mlp.MLP, tuned=False" in text
    for name in ("ours recompute", "torch.compile", "quack"):
        assert name in text
    assert "T=8192 d=4096 swiglu h=5504 (TP2 of 11008)" in text
    assert "skip1" in text and "over the time budget (3 s left)" in text
    # eager / ours: 1.1, 1.04, 0.95 -> worst 0.95 at the gelu shape
    assert "vs eager          geomean 1.028x   worst 0.950x (T=512 d=1024 gelu_tanh_approx" in text
    assert "vs quack          geomean" in text and "3 shapes" in text
    assert "Outputs or gradients that disagree with eager's" in text and "h=5504 (TP2 of 11008): quack" in text


def test_header_reports_the_host_probe_and_skips_what_was_not_read():
    results = fake_results()
    results["meta"]["host_probe_us"] = {"start": 180.4, "before the shapes": 395.0,
                                        "after the last shape": None}
    text = sweep_report.format_sweep(results)
    assert ("host speed (µs per fwd+bwd of a tiny eager MLP, all host time): 180 start, "
            "395 before the shapes\n") in text
    results["meta"]["host_probe_us"] = {"start": None}
    assert "host speed" not in sweep_report.format_sweep(results)


def test_header_says_where_the_threads_ran_at_each_probe():
    results = fake_results()
    results["meta"]["host_placement"] = {"start": {"main": [15, "15"], "pt_autograd_0": [0, "0"]},
                                         "after the last shape": {}}
    text = sweep_report.format_sweep(results)
    assert ("where the main thread and autograd's CUDA thread last ran, at each probe: start: "
            "main cpu 15 (core 15), pt_autograd_0 cpu 0 (core 0)\n") in text
    results["meta"]["host_placement"] = {"start": {}}
    assert "last ran, at each probe" not in sweep_report.format_sweep(results)


def test_ours_over_pairs_held_turns_round_by_round():
    """A row's ratio is the median of the rounds' ratios where both variants kept their turns,
    else the ratio of their times."""
    row = {"variants": {"eager": {"ms": 2.0, "holds_ms": [1.0, 2.0, 3.0]},
                        "ours": {"ms": 3.3, "holds_ms": [1.1, 4.0, 3.3]}}}
    assert sweep_report.ours_over(row, "eager") == pytest.approx(1 / 1.1)
    del row["variants"]["ours"]["holds_ms"]
    assert sweep_report.ours_over(row, "eager") == pytest.approx(2.0 / 3.3)
    assert sweep_report.ours_over(row, "quack") is None


def test_the_summary_calls_a_shape_slower_only_beyond_the_rounds_interval():
    """Eight rounds per shape: ours 0.95x in every round of s0 is slower beyond its interval; s1,
    whose rounds scatter on both sides of 1.0, is a tie; s2 with two rounds has no interval and
    is left out; eager's second copy is checked the same way."""
    def holds(ratios):
        return {"ms": 1.0, "holds_ms": [1.0 / r for r in ratios]}

    eager = {"ms": 1.0, "holds_ms": [1.0] * 8}
    rows = [{"label": "s0", "variants": {"eager": eager, "ours": holds([0.95] * 8),
                                         "eager_copy": holds([1.0] * 8)}},
            {"label": "s1", "variants": {"eager": eager,
                                         "ours": holds([0.9, 1.1, 0.95, 1.05] * 2),
                                         "eager_copy": holds([1.01, 1.03, 1.02, 1.04] * 2)}},
            {"label": "s2", "variants": {"eager": {"ms": 1.0, "holds_ms": [1.0, 1.0]},
                                         "ours": holds([0.5, 0.5])}}]
    text = sweep_report.format_sweep({"meta": {}, "rows": rows})
    assert ("ours vs eager, 95% interval over the rounds, at 2 shapes: slower at 1, a tie at 1, "
            "faster at 0") in text
    assert "slower: s0 (0.950x, 0.950-0.950)" in text
    assert ("eager's second copy vs eager, 95% interval over the rounds, at 2 shapes: slower at "
            "0, a tie at 1, faster at 1") in text
    assert "faster: s1 (1.025x, 1.010-1.040)" in text
    assert "s2 (" not in text
    assert "ours vs quack" not in text and "ours vs the GEMM bound, 95%" not in text


def test_the_summary_judges_ours_against_quack_and_the_bound_by_the_interval_too():
    """Six rounds: ours 2% faster than quack in every round is faster by its interval; against
    the GEMM bound its rounds scatter on both sides of 1.0, a tie; s1 has no quack and only two
    rounds of the bound, so it is in neither line."""
    def holds(ratios):
        return {"ms": 1.0, "holds_ms": [1.0 / r for r in ratios]}

    one = {"ms": 1.0, "holds_ms": [1.0] * 6}
    rows = [{"label": "s0", "variants": {"eager": one, "ours": one,
                                         "quack": {"ms": 1.02, "holds_ms": [1.02] * 6},
                                         "gemm_ceiling": {"ms": 1.0, "holds_ms":
                                                          [0.98, 1.01, 0.99, 1.02, 1.0, 0.97]}}},
            {"label": "s1", "variants": {"eager": {"ms": 1.0, "holds_ms": [1.0, 1.0]},
                                         "ours": holds([0.5, 0.5]),
                                         "gemm_ceiling": {"ms": 1.0, "holds_ms": [1.0, 1.0]}}}]
    lines = sweep_report.intervals(rows)
    assert ("  ours vs quack, 95% interval over the rounds, at 1 shapes: slower at 0, a tie at "
            "0, faster at 1") in lines
    assert "    faster: s0 (1.020x, 1.020-1.020)" in lines
    assert ("  ours vs the GEMM bound, 95% interval over the rounds, at 1 shapes: slower at 0, "
            "a tie at 1, faster at 0") in lines
    assert not any("s1" in line for line in lines)


def test_the_summary_names_shapes_whose_few_rounds_disagree():
    """Two rounds each: s0's ours / bound moves 10% between them (named, with both rounds'
    ratios), s1's 1% (not named); s2 ran eight rounds, which intervals() judges instead; eager's
    second copy is listed the same way, the spread to read ours' beside."""
    def holds(ratios):
        return {"ms": 1.0, "holds_ms": [1.0 / r for r in ratios]}

    two, eight = {"ms": 1.0, "holds_ms": [1.0, 1.0]}, {"ms": 1.0, "holds_ms": [1.0] * 8}
    rows = [{"label": "s0", "variants": {"eager": two, "ours": holds([1.0, 1.0]),
                                         "gemm_ceiling": {"ms": 1.0, "holds_ms": [1.05, 0.95]},
                                         "eager_copy": holds([0.96, 1.0])}},
            {"label": "s1", "variants": {"eager": two, "ours": holds([1.0, 1.01]),
                                         "gemm_ceiling": two, "eager_copy": holds([1.0, 1.0])}},
            {"label": "s2", "variants": {"eager": eight, "ours": holds([0.8, 1.2] * 4),
                                         "eager_copy": holds([0.8, 1.2] * 4)}}]
    lines = sweep_report.rounds_apart(rows)
    assert lines == [
        "  eager's second copy vs eager, rounds more than 3% apart (round by round) at 1 shapes:",
        "    s0 (0.960x, 1.000x)",
        "  ours vs the GEMM bound, rounds more than 3% apart (round by round) at 1 shapes:",
        "    s0 (1.050x, 0.950x)"]
    rows[1]["variants"]["ours"] = holds([1.0, 1.05])
    assert "    s1 (1.000x, 1.050x)" in sweep_report.rounds_apart(rows)
    assert "s1 (1.000x, 1.050x)" in sweep_report.format_sweep({"meta": {}, "rows": rows})


def test_host_probe_needs_cuda():
    from parallel_mlp.bench.harness import Ctx

    ctx = Ctx(device=torch.device("cpu"), dtype=torch.float32, tokens=0, d_model=0, configs=[],
              iters=1, warmup=0, backend="torch", deadline=float("inf"))
    assert sweep.host_probe_us(ctx) is None


def test_summary_names_the_shapes_where_the_torch_backend_wins():
    results = fake_results()
    # the torch backend: slower than ours at the first two shapes, faster at the gelu one
    for row, ms in zip(results["rows"], (10.5, 5.5, 0.16)):
        row["variants"]["torch_backend"] = {"ms": ms}
    text = sweep_report.format_sweep(results)
    assert "ours, torch backend" in text
    assert ("cute vs the torch backend: geomean 0.974x over 3 shapes; the torch backend is faster "
            "at 1: T=512 d=1024 gelu_tanh_approx") in text
    assert "(0.800x)" in text
    assert "cute vs the torch backend" not in sweep_report.format_sweep(fake_results())


def test_summary_holds_autos_fused_function_against_every_gemm_on_ours():
    """--all-cute: auto's fused function (ours, or ours_fused where auto took the small step)
    against the same function with every GEMM on our kernels."""
    results = fake_results()
    rows = results["rows"]
    rows[0]["variants"]["ours_cute"] = {"ms": 10.5}       # ours 10.0: 1.05x
    rows[2]["variants"]["ours_fused"] = {"ms": 0.4}       # the small step's row: fused 0.4
    rows[2]["variants"]["ours_cute"] = {"ms": 0.36}       # 0.9x
    text = sweep_report.format_sweep(results)
    assert "ours, every GEMM on our kernels" in text
    assert ("auto's fused function vs every GEMM on our kernels: geomean 0.972x   worst 0.900x "
            "(T=512 d=1024") in text
    assert "best 1.050x (T=8192 d=4096" in text and "2 shapes" in text
    assert "every GEMM on our kernels:" not in sweep_report.format_sweep(fake_results())


def test_small_step_rows_show_the_fused_kernels_beside_them():
    results = fake_results()
    small = results["rows"][2]  # the gelu shape at T=512: the small step, 0.2 ms
    small["ours_path"] = "small step"
    small["variants"]["ours_fused"] = {"ms": 0.4}
    text = sweep_report.format_sweep(results)
    assert "ours, small step" in text and "ours, fused kernels" in text
    assert ("small step vs the fused kernels, where auto took it: geomean 2.000x over 1 shapes; "
            "the fused kernels are faster at 0") in text
    small["variants"]["ours_fused"] = {"ms": 0.1}
    assert "the fused kernels are faster at 1: T=512 d=1024" in sweep_report.format_sweep(results)
    assert "small step vs" not in sweep_report.format_sweep(fake_results())


def test_ours_takes_the_small_step_where_the_layer_would(monkeypatch):
    from parallel_mlp.launch_graphs import GRAPHS

    def ctx(backend, device="cuda"):
        return SimpleNamespace(backend=backend, device=torch.device(device))

    monkeypatch.setattr(GRAPHS, "enabled", False)
    small, large = Shape(512, 1024, "swiglu", 1), Shape(8192, 4096, "swiglu", 1)
    assert sweep.takes_small_step(ctx("auto"), small)
    assert not sweep.takes_small_step(ctx("auto"), large)
    assert not sweep.takes_small_step(ctx("cute"), small)
    assert not sweep.takes_small_step(ctx("auto", "cpu"), small)
    assert sweep.parse_args([]).backend == "auto"
    # under launch graphs (the default) gated steps run fused; not gated, the rule is the same
    monkeypatch.setattr(GRAPHS, "enabled", True)
    assert not sweep.takes_small_step(ctx("auto"), small)
    assert sweep.takes_small_step(ctx("auto"), Shape(512, 1024, "gelu_tanh_approx", 8))


def test_header_says_when_autograd_threads_were_off():
    results = fake_results()
    assert "autograd device threads off" not in sweep_report.format_sweep(results)
    results["meta"]["autograd_threads"] = False
    assert "autograd device threads off: every backward ran on the calling thread" in \
        sweep_report.format_sweep(results)
    assert sweep.parse_args(["--no-autograd-threads"]).no_autograd_threads


def test_header_says_when_launch_graphs_were_off():
    results = fake_results()
    results["meta"]["launch_graphs"] = True
    assert "launch graphs off" not in sweep_report.format_sweep(results)
    results["meta"]["launch_graphs"] = False
    assert "launch graphs off: ours launched kernel by kernel" in sweep_report.format_sweep(results)
    assert sweep.parse_args(["--no-launch-graphs"]).no_launch_graphs
    assert not sweep.parse_args([]).no_launch_graphs


def test_summary_compares_the_graphed_variants():
    results = fake_results()
    # graphed: eager 0.19 -> 0.10 at the small shape, ours 0.2 -> 0.08; the big shapes gain ~0
    for row, eager, ours in zip(results["rows"], (11.0, 5.2, 0.10), (10.0, 5.0, 0.08)):
        row["variants"]["eager_graphed"] = {"ms": eager}
        row["variants"]["ours_graphed"] = {"ms": ours}
    text = sweep_report.format_sweep(results)
    assert "eager, CUDA graph" in text and "ours, CUDA graph" in text
    assert "CUDA-graphed, ours vs eager: geomean" in text
    assert "worst 1.040x (T=8192 d=4096 swiglu h=5504" in text
    assert "best 1.250x (T=512 d=1024 gelu_tanh_approx" in text
    assert "the graph's gain, eager: geomean" in text and "1.000x to 1.900x" in text
    assert "the graph's gain, ours: geomean" in text and "1.000x to 2.500x" in text
    assert "CUDA-graphed" not in sweep_report.format_sweep(fake_results())


def test_quack_missing_says_so_in_the_table_and_cells():
    text = sweep_report.format_sweep(fake_results(quack_reason="quack-kernels is not installed"))
    assert "quack: skipped: quack-kernels is not installed" in text
    assert "vs quack          -" in text
    assert sweep_report.heat_cells(fake_results("x"), "swiglu", "quack") == {}


def test_heat_cells_keep_the_worst_shard_of_a_cell():
    cells = sweep_report.heat_cells(fake_results(), "swiglu", "eager")
    assert cells == {(8192, 4096): (pytest.approx(5.2 / 5.0), 2)}  # 1.04 beats 1.1 as the worst
    cells = sweep_report.heat_cells(fake_results(), "swiglu", "quack")
    assert cells[(8192, 4096)] == (pytest.approx(0.9), 2)
    assert sweep_report.heat_cells(fake_results(), "gelu_tanh_approx", "eager") == {
        (512, 1024): (pytest.approx(0.95), 1)}


def with_eager_recompute(results):
    """results, with checkpointed eager at 1.5x ours' recompute time in every measured row."""
    for r in results["rows"]:
        if "variants" in r:
            r["variants"]["eager_recompute"] = {"ms": 1.5 * r["variants"]["ours_recompute"]["ms"]}
    return results


def test_heat_cells_of_recompute_mode_against_eager_checkpointed():
    results = fake_results()
    assert sweep_report.heat_cells(results, "swiglu", "eager_recompute", "ours_recompute") == {}
    cells = sweep_report.heat_cells(with_eager_recompute(results), "swiglu", "eager_recompute",
                                    "ours_recompute")
    assert cells == {(8192, 4096): (pytest.approx(1.5), 2)}


def test_heat_map_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    for name, results in (("plain", fake_results()), ("no-quack", fake_results("not installed")),
                          ("recompute", with_eager_recompute(fake_results()))):
        path = tmp_path / f"sweep-{name}.png"
        assert sweep_report.write_heatmap(results, str(path)) == f"wrote {path}"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_redraws_on_a_terminal_and_writes_lines_elsewhere():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock = iter([0.0, 5.0, 12.0]).__next__
    log = io.StringIO()
    bar = Progress(4, stream=log, width=8, clock=clock)
    bar.update(1, "shape b", left_s=30)
    bar.update(4, "done")
    assert log.getvalue().splitlines() == ["[##------] 1/4    5 s, ~30 s left  shape b",
                                           "[########] 4/4   12 s  done"]
    tty = Tty()
    bar = Progress(2, stream=tty, width=4, clock=lambda: 0.0)
    bar.update(1, "a")
    bar.close()
    assert tty.getvalue() == "\r\033[K[##--] 1/2    0 s  a\n"


# ---- quack -----------------------------------------------------------------------------------


def test_quack_missing_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(quack_baseline, "installed", lambda: False)
    mod, reason = quack_baseline._import()
    assert mod is None
    assert reason == "quack-kernels is not installed (pip install quack-kernels==0.6.5)"
    monkeypatch.setattr(quack_baseline, "_loaded", (None, reason))
    w = torch.zeros(16, 16)
    with pytest.raises(RuntimeError, match="not installed"):
        quack_baseline.build(w, w, "swiglu", 8)


def fake_identity():
    """A stand-in for quack.gemm_runtime.identity: a fail-closed keyer that recurses through the
    module's global name, as quack's does."""
    module = SimpleNamespace()

    def semantic_value_key(value, seen):
        if value is None or isinstance(value, (int, float, str)):
            return value
        if isinstance(value, tuple):
            return ("tuple", tuple(module.semantic_value_key(v, seen) for v in value))
        raise TypeError(f"no fail-closed semantic key for {value!r}")

    module.semantic_value_key = semantic_value_key
    return module


class Opaque:
    def __repr__(self):
        return "Opaque(3)"


def test_quack_patch_keys_what_quack_cannot_and_leaves_the_rest():
    identity = fake_identity()
    with pytest.raises(TypeError):
        identity.semantic_value_key((1, Opaque()), set())
    assert quack_baseline.patch_semantic_value_key(identity) is True
    assert quack_baseline.patch_semantic_value_key(identity) is False  # once only
    key = identity.semantic_value_key
    assert key((1, "a"), set()) == ("tuple", (1, "a"))  # keyable values keep quack's key
    # an unkeyable value nested in a tuple is keyed by its type and repr, the tuple as before
    assert key((1, Opaque()), set()) == ("tuple", (1, ("unkeyed", __name__, "Opaque", "Opaque(3)")))
    hash(key((1, Opaque()), set()))


def test_quack_runs_only_on_its_fused_path():
    bf = torch.bfloat16
    w1, w2 = torch.zeros(2 * 64, 64, dtype=bf), torch.zeros(64, 64, dtype=bf)
    assert "on cpu" in quack_baseline.off_fused_path(w1, w2, "swiglu")
    assert "no fused geglu_erf" in quack_baseline.off_fused_path(w1, w2, "geglu_erf")


def test_quack_takes_our_interleaved_w1_as_it_is(monkeypatch):
    """quack's gated fc1 rows are (gate, up) pairs, like ours: build copies W1 without a
    permutation. A stand-in for quack.mlp.MLP, since quack needs CUDA."""
    made = {}

    class MLP(torch.nn.Module):
        def __init__(self, d, h, d_out, activation, device, dtype, tuned):
            super().__init__()
            made.update(activation=activation, tuned=tuned)
            self.fc1 = torch.nn.Linear(d, 2 * h, bias=False, device=device, dtype=dtype)
            self.fc2 = torch.nn.Linear(h, d_out, bias=False, device=device, dtype=dtype)

    monkeypatch.setattr(quack_baseline, "_loaded", (SimpleNamespace(MLP=MLP), None))
    monkeypatch.setattr(quack_baseline, "off_fused_path", lambda w1, w2, act: None)
    w1, w2 = torch.randn(2 * 32, 64), torch.randn(64, 32)
    model = quack_baseline.build(w1, w2, "swiglu", 32)
    assert torch.equal(model.fc1.weight, w1) and torch.equal(model.fc2.weight, w2)
    assert made == {"activation": "swiglu", "tuned": False}


# ---- end to end ------------------------------------------------------------------------------


def test_budget_skips_shapes_and_says_so(tmp_path):
    args = sweep.apply_defaults(sweep.parse_args(
        ["--dry-run", "--skip-compile", "--budget-s", "0", "--json", str(tmp_path / "s.json")]))
    results = sweep.run(args)
    assert len(results["rows"]) == len(DRY_RUN)
    assert all(r["skipped"].startswith("over the time budget") for r in results["rows"])
    assert "skip1" in sweep_report.format_sweep(results)


@pytest.mark.skipif(quack_baseline.installed(), reason="checks the line shown without quack")
def test_dry_run_end_to_end(tmp_path):
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_mlp.bench", "sweep", "--dry-run", "--skip-compile",
         "--json", str(out), "--png", str(png)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "quack: skipped: quack-kernels is not installed" in proc.stderr
    assert "estimate: ~" in proc.stderr and f"{len(DRY_RUN)}/{len(DRY_RUN)}" in proc.stderr
    assert "quack: skipped: quack-kernels is not installed" in proc.stdout  # the table's header
    data = json.loads(out.read_text())
    assert data["meta"]["mode"] == "sweep" and data["meta"]["dry_run"] is True
    assert data["meta"]["heat_s"] == sweep.HEAT_S
    assert data["meta"]["first_heat_s"] == sweep.FIRST_HEAT_S
    # the launch groups over the run: on the CPU (the torch backend) none
    assert data["meta"]["launch_groups"] == {"graphs kept": 0}
    if os.path.isdir("/proc/self/task"):  # Linux: the main thread's CPU beside each host probe
        assert set(data["meta"]["host_placement"]) == {"start", "before the shapes",
                                                       "after the last shape"}
        assert "main" in data["meta"]["host_placement"]["start"]
    assert data["meta"]["quack"]["unavailable"].startswith("quack-kernels is not installed")
    assert [r["label"] for r in data["rows"]] == [s.label for s in DRY_RUN]
    for row in data["rows"]:
        v = row["variants"]
        for name in ("eager", "ours", "ours_recompute"):
            assert v[name]["ms"] > 0 and v[name]["tflops"] > 0 and v[name]["speedup_vs_eager"] > 0
        for name in ("ours", "ours_recompute"):  # the torch backend here: eager's function
            for key in sweep.ERR_KEYS:
                assert v[name][key] < 2e-2, (name, key)
        # eager under torch.utils.checkpoint replays eager's own ops: the same bits
        for key in sweep.ERR_KEYS:
            assert v["eager_recompute"][key] == 0.0, key
        assert v["ours_recompute"]["speedup_vs_eager_recompute"] > 0
        assert "unavailable" in v["quack"] and row["disagree"] == []
    assert "Summary: ours (default mode)" in proc.stdout
    assert "ours recompute vs eager checkpointed (x kept alone, as ours): geomean" in proc.stdout
    if importlib.util.find_spec("matplotlib") is None:
        assert "no heat map: matplotlib is not installed" in proc.stderr
    else:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_negative_short_turns_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        sweep.parse_args(["--short-turns-s", "-0.1"])
    assert e.value.code == 2 and "--short-turns-s -0.1: must be >= 0" in capsys.readouterr().err


def test_negative_heat_is_refused_and_the_plan_counts_the_heat(capsys):
    with pytest.raises(SystemExit) as e:
        sweep.parse_args(["--heat-s", "-1"])
    assert e.value.code == 2 and "--heat-s -1: must be >= 0" in capsys.readouterr().err
    names = ["eager", "ours", "ours_recompute"]
    cold = sweep.apply_defaults(sweep.parse_args(["--estimate", "--heat-s", "0"]))
    warm = sweep.apply_defaults(sweep.parse_args(["--estimate"]))
    assert warm.heat_s == sweep.HEAT_S > 0
    for shape in (GRID[0], next(s for s in GRID if sweep.host_bound(s))):
        # the heat, plus the steps of its last cycle that run past it
        extra = sweep.HEAT_S + len(names) * sweep.step_s(shape)
        assert sweep.shape_s(shape, names, warm) == pytest.approx(
            sweep.shape_s(shape, names, cold) + extra)
    # the first shape heats longer: it meets the card from the idle of compiling ahead
    assert warm.first_heat_s == sweep.FIRST_HEAT_S > sweep.HEAT_S
    plan = sweep.estimate(GRID[:2], names, warm, 0, False)["per_shape_s"]
    assert plan[0] == pytest.approx(sweep.shape_s(GRID[0], names, warm)
                                    + sweep.FIRST_HEAT_S - sweep.HEAT_S)
    assert plan[1] == pytest.approx(sweep.shape_s(GRID[1], names, warm))
    assert [sweep.shape_heat_s(i, warm) for i in range(3)] == [sweep.FIRST_HEAT_S, sweep.HEAT_S,
                                                                sweep.HEAT_S]
    with pytest.raises(SystemExit):
        sweep.parse_args(["--first-heat-s", "-1"])
    assert "--first-heat-s -1: must be >= 0" in capsys.readouterr().err
    # call by call there is no held turn to heat for
    calls = sweep.apply_defaults(sweep.parse_args(["--estimate", "--hold-s", "0"]))
    calls_cold = sweep.apply_defaults(sweep.parse_args(["--estimate", "--hold-s", "0",
                                                        "--heat-s", "0"]))
    assert sweep.shape_s(GRID[0], names, calls) == sweep.shape_s(GRID[0], names, calls_cold)


def test_the_summary_names_variants_whose_launch_groups_met_new_keys():
    """per_turn counts with captures or plain runs are listed, most first, by their report
    names; a variant that only replayed, or has no counts, is not."""
    rows = [{"label": "a", "variants": {
                "eager": {"ms": 1.0},
                "ours_fused": {"ms": 1.0, "per_turn": {"captures": 2.0, "plain": 2.5,
                                                       "replays": 300.0}},
                "ours": {"ms": 1.0, "per_turn": {"replays": 400.0}}}},
            {"label": "b", "variants": {
                "eager": {"ms": 1.0},
                "ours_recompute": {"ms": 1.0, "per_turn": {"captures": 9.0, "plain": 9.0}}}}]
    text = sweep_report.format_sweep({"meta": {}, "rows": rows})
    assert ("launch groups meeting new keys in the timed turns, per turn (captures / plain runs"
            " / replays), at 2 variant-shapes:") in text
    assert text.index("b, ours recompute: 9.0 / 9.0 / 0.0") < text.index(
        "a, ours, fused kernels: 2.0 / 2.5 / 300.0")
    assert "a, ours: " not in text
    rows[1]["variants"].pop("ours_recompute")
    rows[0]["variants"].pop("ours_fused")
    assert "launch groups meeting new keys" not in sweep_report.format_sweep({"meta": {},
                                                                               "rows": rows})
