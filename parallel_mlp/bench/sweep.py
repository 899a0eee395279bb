"""The shape sweep: ours against PyTorch eager, torch.compile and quack at the shapes a
pretraining run meets.

    python -m parallel_mlp.bench sweep --json sweep.json --png sweep.png   # ~8 min on an H200
    python -m parallel_mlp.bench sweep --quick     # four shapes, ~2 min
    python -m parallel_mlp.bench sweep --estimate  # the plan and its time; runs nothing
    python -m parallel_mlp.bench sweep --dry-run   # tiny shapes on the CPU (automatic without CUDA)
    python -m parallel_mlp.bench sweep --ceiling   # cuBLAS's six GEMMs alone beside ours, ~9 min
    python -m parallel_mlp.bench sweep --torch-backend --tokens 512,1000,2048,4096
                                                   # the short steps, the torch backend beside cute
    python -m parallel_mlp.bench sweep --shape 512,1024,gelu_tanh_approx --rounds 8
                                                   # one shape of the grid, more turns

For each shape of the grid (sweep_grid.py: 30 shapes over tokens per rank, model width and TP
shard, swiglu and gelu_tanh_approx) and each variant, ours (default mode), ours (recompute),
PyTorch eager, torch.compile and quack's MLP, one training step fwd+bwd: ms, TFLOP/s, its ratio
to eager and to quack, and its peak memory above what was allocated before the step (the
weights and inputs of every variant). The variants of a shape hold the same weights, are checked
against eager's outputs, and are timed side by side, held (harness.time_held): each back to back
for --hold-s seconds a turn, --rounds turns, as the single-GPU benchmark times them but with
shorter and fewer turns so that 30 shapes fit one device call.

Before anything is timed, our kernels for the whole grid compile in a process pool
(kernels.warmup.compile_keys) and quack's in child processes beside it, so no timed shape pays
for compiling. The plan's time is printed first; a shape that would end past --budget-s is
skipped and its row says so. Prints a table, writes the JSON, and with --png draws heat maps of
ours / eager and ours / quack over (T, d) (sweep_report.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import asdict

import torch

from .. import small_step
from ..activations import get_activation
from ..autograd import replays_launches
from ..backends import CuteBackend
from ..launch_graphs import GRAPHS
from . import quack_baseline, report, sweep_report
from .harness import (
    Ctx,
    attempt,
    check_timing_flags,
    environment,
    free_memory,
    l2_bytes,
    log,
    probe_ours,
    ratio,
    start_watchdog,
    unavailable,
    without_cuda,
)
from .mlp import bench_mlp
from .models import fc1_features
from .progress import Progress
from .sweep_grid import DRY_RUN, GRID, QUICK, Shape
from .threads import placement
from .timing import HOLD_QUEUE

# The variants, in the order they are built and timed; eager first, the others' reference.
# eager_recompute: eager under torch.utils.checkpoint, recompute mode's baseline at its memory.
VARIANTS = ("eager", "ours", "ours_recompute", "eager_recompute", "compile", "quack", "eager_copy")
# Turns: the single-GPU bench holds 1 s x 3 (timing.DEFAULT_HOLD_S: the card's clock seems to
# swing with a period near a second; three turns of one kernel held 0.5 s each spread up to 6%,
# held 1 s 0.6%). 30 shapes x 7 variants at that would take 630 s of holds alone; two turns of
# 0.7 s fit the whole sweep, compiling included, in one device call of under 9 minutes (with
# six variants and --ceiling, 0.8 s turns ran all 30 shapes in 451 s, 2026-12-03).
DEFAULT_HOLD_S = 0.7
DEFAULT_ROUNDS = 2
QUICK_HOLD_S = 0.5       # --quick: shorter turns still, which sample the swing (a few %)
# Steps whose GPU work is shorter than the host's launching of it (host_bound) take the host's
# time, and the H200 host's speed wanders by tens of % over seconds: eager against a second
# copy of itself, held 0.8 s x 2, measured 0.89-1.11x at such shapes; in turns of 0.05 s x 32
# (the same time) 0.95-1.05x (H200, 2026-12-02, `tools/timing_spread.py`: three repeats at
# T=512 d=1024 swiglu, T=4096 d=1024 gelu and T=2048 d=2048 swiglu). Their GPUs idle between
# launches, far from the power cap that the long turns are for. So those steps run in short
# turns, as many as fill the same time.
SHORT_TURN_S = 0.05
# Untimed calls of every variant in turn before a shape's first turn (timing.heat says why):
# about the first two turns of 0.7 s, the ones that ran fast without them.
HEAT_S = 1.5
# The first shape's heat: it meets the card straight from the idle of compiling ahead. On an H100
# (2026-12-06) with 1.5 s the headline's two rounds read ours 12.12 then 12.75 ms and the GEMM
# bound 12.79 then 12.25 (first rounds 4-5% off the rest, both ways); with 10 s (`gpu_run.sh
# sweep_heat`, another H100, six rounds) the first rounds sat within 2.2% of the other five and
# those within 1.2% (benchmarks/h100-sweep-heat.json). Later shapes follow the turns of the one
# before, on a card already at its steady clocks.
FIRST_HEAT_S = 10.0
DEFAULT_BUDGET_S = 500.0  # a device call may run 600 s; leave time for the report and margin
WATCHDOG_MARGIN_S = 60.0
# Outputs or gradients further than this from eager's (relative: y, dx, dW1 or dW2) mark the
# row: bf16 rounding of the same function stays near 1e-2.
AGREE_TOL = 3e-2
# What is compared with eager's: the output, and the gradients of x and of both weights.
ERR_KEYS = ("rel_err_y", "rel_err_dx", "rel_err_dw1", "rel_err_dw2")

# What the time estimate assumes, per part. Kernel compile: ~1.3 s each on the H200 host,
# serially (kernels/NOTES.md); a spawned pool's workers first import the DSL. torch.compile:
# its first graph of a process pays for inductor's start; later ones took 1.4-1.7 s at the
# single-GPU bench's shapes (measured 2026-11-30, `python -m parallel_mlp.bench`). quack's
# compile of its untuned kernels, one child process per activation: 20 s each, side by side
# (the sweep of 2026-12-02, its JSON's compile_ahead). torch.compile's later graphs are counted
# at the top of the range measured: the sweep of 2bfe98f with --ceiling ran its 30 shapes in
# 462.5 s against a plan of 571.6 s that counted them at 3.0 s each (H200, 2026-12-04).
STARTUP_S = 15.0
POOL_START_S = 10.0
KERNEL_S = 1.3
QUACK_WARM_S = 25.0
FIRST_COMPILE_S = 15.0
COMPILE_S = 1.7
SHAPE_SETUP_S = 1.0      # weights and inputs drawn, outputs checked
GRAPH_CAPTURE_S = 1.0    # a graphed variant's three warmup steps and two captures (a guess)
STEP_RATE = 450e12       # FLOP/s of a step, below every variant's at large shapes
STEP_FLOOR_S = 0.4e-3    # a step's launches and host time at small shapes
# The host's time for one eager fwd+bwd of the MLP on the H200's host: 0.2 ms on a fast one, up
# to 0.7 ms on a slow one (T=512 d=1024 swiglu, 2026-12-02, `tools/small_step_variants.py` and
# the A/A runs behind SHORT_TURN_S, two machines of the same kind).
HOST_STEP_S = 0.5e-3
REPORT_S = 5.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"{len(QUICK)} shapes, {QUICK_HOLD_S:g} s turns (~2 min)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes, call by call; automatic when CUDA is absent")
    p.add_argument("--estimate", action="store_true",
                   help="print the plan and its time, run nothing")
    p.add_argument("--hold-s", type=float, default=None,
                   help=f"seconds each variant runs back to back per turn (default "
                        f"{DEFAULT_HOLD_S:g}, --quick {QUICK_HOLD_S:g}; 0: call by call)")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help="held timing: turns per variant")
    p.add_argument("--heat-s", type=float, default=HEAT_S,
                   help="held timing: seconds of untimed calls of every variant in turn before a "
                        "shape's first turn, so that its first turns do not meet a card fresh "
                        f"from idle (default {HEAT_S:g}; 0: none)")
    p.add_argument("--first-heat-s", type=float, default=FIRST_HEAT_S,
                   help="held timing: the same before the first shape, which meets the card "
                        f"from the idle of compiling ahead (default {FIRST_HEAT_S:g}; 0: none)")
    p.add_argument("--short-turns-s", type=float, default=SHORT_TURN_S,
                   help="turn length for host-bound steps (GPU work under "
                        f"{HOST_STEP_S * 1e3:g} ms at {STEP_RATE / 1e12:g} TFLOP/s), as many "
                        "turns as fill --hold-s x --rounds (0: all shapes take --hold-s turns)")
    p.add_argument("--ceiling", action="store_true",
                   help="also time cuBLAS's six GEMMs of each step with no activation at all "
                        "(models.GemmCeiling): the bound of any fused MLP on cuBLAS-speed "
                        "GEMMs, beside ours (adds a variant's time: ~1 min over the grid)")
    p.add_argument("--no-eager-copy", action="store_true",
                   help="no second copy of eager (timed beside the first, it shows the timing's "
                        "own spread at each shape)")
    p.add_argument("--no-eager-recompute", action="store_true",
                   help="no eager under torch.utils.checkpoint (the baseline of ours' recompute "
                        "mode at its memory: x kept alone)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each variant first")
    p.add_argument("--iters", type=int, default=10, help="timed calls when --hold-s is 0")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help="shapes that would end past this many seconds are skipped")
    p.add_argument("--json", default="sweep.json", help="where to write every number")
    p.add_argument("--png", default=None, help="heat maps (needs matplotlib, the 'bench' extra)")
    p.add_argument("--backend", default="auto", choices=["auto", "cute", "torch"],
                   help="what 'ours' runs on (default auto, ParallelMLP's default: the fused "
                        "kernels, or plain autograd ops for steps below small_step's FLOP "
                        "thresholds, with the fused kernels timed beside them there)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--torch-backend", action="store_true",
                   help="also time ParallelMLP on its torch backend (cuBLAS and fused torch "
                        "activations): the data a size rule for backend='auto' would need")
    p.add_argument("--all-cute", action="store_true",
                   help="also time the fused function with every GEMM on our kernels "
                        "(backend='cute'), beside auto's, which runs the plain GEMMs of few "
                        "tiles on cuBLAS (backends.cublas_runs)")
    p.add_argument("--graphed", action="store_true",
                   help="also time eager and ours with each step captured in CUDA graphs "
                        "(torch.cuda.make_graphed_callables): what remains of a host-bound "
                        "step once the host's launches are gone")
    p.add_argument("--no-autograd-threads", action="store_true",
                   help="run every variant's backward on the calling thread "
                        "(torch.autograd.set_multithreading_enabled(False)) instead of autograd's "
                        "CUDA device thread, as a user can choose for host-bound steps")
    p.add_argument("--no-launch-graphs", action="store_true",
                   help="ours launching kernel by kernel, its launch groups never replayed from "
                        "CUDA graphs (launch_graphs.GRAPHS, as PARALLEL_MLP_LAUNCH_GRAPHS=0 does) "
                        "for the whole run")
    p.add_argument("--tokens", default=None,
                   help="only the grid's shapes with these tokens per rank, e.g. 512,1000,2048")
    p.add_argument("--shape", action="append", default=None, metavar="T,D,ACT[,H]",
                   help="only the grid's shapes with these tokens per rank, width, activation "
                        "and (optionally) per-rank hidden size, e.g. 512,1024,gelu_tanh_approx; "
                        "repeat it for more (with --tokens, a shape must match both)")
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile baseline")
    p.add_argument("--no-quack", action="store_true", help="no quack baseline")
    p.add_argument("--quack-tuned", action="store_true",
                   help="quack with its default tuned=True (autotunes each shape: needs far more "
                        "time than the budget; see quack_baseline.py)")
    p.add_argument("--no-warmup", action="store_true",
                   help="do not compile the kernels ahead (they compile on first use instead)")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes compiling our kernels ahead")
    args = p.parse_args(argv)
    check_timing_flags(p, args)
    if args.short_turns_s < 0:
        p.error(f"--short-turns-s {args.short_turns_s:g}: must be >= 0 (0 turns the short "
                "turns off)")
    if args.heat_s < 0:
        p.error(f"--heat-s {args.heat_s:g}: must be >= 0 (0: no untimed calls before the turns)")
    if args.first_heat_s < 0:
        p.error(f"--first-heat-s {args.first_heat_s:g}: must be >= 0 (0: no untimed calls before "
                "the first shape's turns)")
    if args.tokens is not None:
        try:
            args.tokens = sorted({int(t) for t in args.tokens.split(",")})
        except ValueError:
            p.error(f"--tokens {args.tokens!r}: give token counts separated by commas, e.g. 512,2048")
    if args.shape is not None:
        args.shape = [_shape_filter(p, text) for text in args.shape]
    return args


def _shape_filter(p: argparse.ArgumentParser, text: str) -> tuple:
    """(tokens, d, activation, per-rank hidden or None) of one --shape."""
    parts = text.split(",")
    try:
        if len(parts) not in (3, 4):
            raise ValueError
        tokens, d, act = int(parts[0]), int(parts[1]), parts[2]
        hidden = int(parts[3]) if len(parts) == 4 else None
    except ValueError:
        p.error(f"--shape {text!r}: give T,D,ACT or T,D,ACT,H, e.g. 512,1024,gelu_tanh_approx "
                "or 8192,4096,gelu_tanh_approx,2048")
    return tokens, d, act, hidden


def _matches(shape: Shape, wanted: tuple) -> bool:
    tokens, d, act, hidden = wanted
    return ((shape.tokens, shape.d, shape.act) == (tokens, d, act)
            and hidden in (None, shape.shard))


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    without_cuda(args, planning=args.estimate)  # --estimate plans the GPU run from anywhere
    if args.hold_s is None:
        args.hold_s = 0.0 if args.dry_run else QUICK_HOLD_S if args.quick else DEFAULT_HOLD_S
    if args.dry_run:
        args.iters = min(args.iters, 2)
        args.warmup = min(args.warmup, 1)
        if args.tokens is not None or args.shape is not None:
            log("--tokens and --shape pick shapes of the GPU grid; the dry run keeps its tiny "
                "shapes")
            args.tokens = args.shape = None
    return args


def grid(args: argparse.Namespace) -> tuple[Shape, ...]:
    shapes = DRY_RUN if args.dry_run else QUICK if args.quick else GRID
    for wanted in args.shape or ():
        if not any(_matches(s, wanted) for s in shapes):
            raise ValueError(f"--shape {','.join(str(v) for v in wanted if v is not None)}: "
                             "no shape of this grid is that one")
    if args.shape is not None:
        shapes = tuple(s for s in shapes if any(_matches(s, w) for w in args.shape))
    if args.tokens is not None:
        shapes = tuple(s for s in shapes if s.tokens in args.tokens)
        if not shapes:
            raise ValueError(f"--tokens {','.join(map(str, args.tokens))}: no shape of this grid "
                             "has those tokens per rank")
    return shapes


def variants(args: argparse.Namespace) -> list[str]:
    skip = {"compile"} if args.skip_compile else set()
    skip |= {"quack"} if args.no_quack else set()
    skip |= {"eager_copy"} if args.no_eager_copy else set()
    skip |= {"eager_recompute"} if args.no_eager_recompute else set()
    names = [v for v in VARIANTS if v not in skip]
    # The optional variants go after the recompute pair, in this order. With --backend torch,
    # ours already is the torch backend.
    extra = ["torch_backend"] if args.torch_backend and args.backend != "torch" else []
    extra += ["ours_cute"] if args.all_cute and args.backend == "auto" else []
    extra += ["gemm_ceiling"] if args.ceiling else []
    extra += ["eager_graphed", "ours_graphed"] if args.graphed else []
    at = names.index("eager_recompute" if "eager_recompute" in names else "ours_recompute") + 1
    names[at:at] = extra
    return names


# ---- the plan and its time ------------------------------------------------------------------


def step_s(shape: Shape) -> float:
    return shape.flops / STEP_RATE + STEP_FLOOR_S


def host_bound(shape: Shape) -> bool:
    """Whether the step's GPU work (at STEP_RATE) is shorter than the host's time to launch it,
    HOST_STEP_S: the step then takes the host's time."""
    return shape.flops / STEP_RATE < HOST_STEP_S


def turns(shape: Shape, args: argparse.Namespace) -> tuple[float, int]:
    """(seconds per turn, turns) of each variant at this shape: --hold-s x --rounds, or for a
    host-bound step the same time in turns of --short-turns-s (SHORT_TURN_S says why)."""
    short = args.short_turns_s
    if args.hold_s <= 0 or short <= 0 or short >= args.hold_s or not host_bound(shape):
        return args.hold_s, args.rounds
    return short, max(args.rounds, round(args.hold_s * args.rounds / short))


def shape_heat_s(index: int, args: argparse.Namespace) -> float:
    """Seconds of untimed calls before the turns of the sweep's shape number ``index``."""
    return args.first_heat_s if index == 0 else args.heat_s


def shape_s(shape: Shape, names, args: argparse.Namespace, heat: float | None = None) -> float:
    """Seconds one shape takes: per variant its untimed calls, first step and two steps of peak
    memory, then its turns (each runs past its time by the steps queued, HOLD_QUEUE) or its
    timed calls; the untimed calls before held turns (``heat``, default --heat-s, its last
    cycle's steps past it) and torch.compile's compile on top."""
    heat = args.heat_s if heat is None else heat
    step = step_s(shape)
    hold_s, rounds = turns(shape, args)
    timed = rounds * (hold_s + HOLD_QUEUE * step) if hold_s > 0 else args.iters * step
    per_variant = (args.warmup + 3) * step + timed
    graphs = GRAPH_CAPTURE_S * sum(name.endswith("_graphed") for name in names)
    heated = heat + len(names) * step if hold_s > 0 and heat > 0 else 0.0
    return (SHAPE_SETUP_S + len(names) * per_variant + graphs + heated
            + (COMPILE_S if "compile" in names else 0.0))


def compile_ahead_s(n_kernels: int, warm_quack: bool, jobs: int) -> float:
    """Our kernels in a pool of ``jobs`` processes, quack's in one child beside it."""
    ours = POOL_START_S + KERNEL_S * n_kernels / max(1, min(jobs, n_kernels)) if n_kernels else 0.0
    return max(ours, QUACK_WARM_S if warm_quack else 0.0)


def estimate(shapes, names, args: argparse.Namespace, n_kernels: int, warm_quack: bool) -> dict:
    """The plan's seconds. n_kernels: ours compiled ahead (0: none); warm_quack: quack's too,
    else (when it runs) it compiles during the first shape."""
    per_shape = [shape_s(s, names, args, shape_heat_s(i, args)) for i, s in enumerate(shapes)]
    # torch.compile's first graph; the torch backend compiles its fused activations once too
    # (static at the first shape, shape-generic from the second on).
    first_use = FIRST_COMPILE_S * (("compile" in names) + ("torch_backend" in names))
    if "quack" in names and not warm_quack:
        first_use += QUACK_WARM_S
    parts = {"startup": STARTUP_S,
             "compile_ahead": compile_ahead_s(n_kernels, warm_quack, args.jobs),
             "shapes": sum(per_shape) + first_use, "report": REPORT_S}
    return {"total_s": sum(parts.values()), "parts_s": parts, "per_shape_s": per_shape,
            "kernels": n_kernels}


def kernel_keys(shapes, dtype: str, num_sms: int) -> list:
    """Every kernel ours runs on the grid, each once (kernels.warmup.mlp_keys per shape)."""
    from ..kernels.warmup import mlp_keys

    keys = [k for s in shapes
            for k in mlp_keys(s.tokens, s.d, s.shard, s.act, dtype, num_sms=num_sms)]
    return list(dict.fromkeys(keys))


def plan_lines(shapes, names, args, plan: dict) -> list[str]:
    p = plan["parts_s"]
    timing = (f"held {args.hold_s:g} s x {args.rounds} turns per variant" if args.hold_s > 0
              else f"call by call, {args.iters} calls per variant")
    short = [t for t in (turns(s, args) for s in shapes) if t != (args.hold_s, args.rounds)]
    if short:
        timing += f" ({len(short)} host-bound shapes: {short[0][0]:g} s x {short[0][1]})"
    return [f"plan: {len(shapes)} shapes x {len(names)} variants ({', '.join(names)}), {timing}",
            f"estimate: ~{plan['total_s']:.0f} s = startup {p['startup']:.0f} + compile ahead "
            f"{p['compile_ahead']:.0f} ({plan['kernels']} kernels of ours) + shapes "
            f"{p['shapes']:.0f} + report {p['report']:.0f}; budget {args.budget_s:.0f} s"]


# ---- running it -----------------------------------------------------------------------------


def compile_ahead(shapes, args, warm_ours: bool, warm_quack: bool, num_sms: int) -> dict:
    """Our kernels for the whole grid in a pool; quack's beside it, a child process per activation
    (kernels both need, the plain GEMMs, compile once: quack locks each on disk)."""
    out = {}
    acts = sorted({s.act for s in shapes}) if warm_quack else []
    children = {act: quack_baseline.start_warm([act]) for act in acts}
    t0 = time.monotonic()
    if warm_ours:
        from ..kernels.warmup import compile_keys

        keys = kernel_keys(shapes, args.dtype, num_sms)
        results = compile_keys(keys, args.jobs)
        failed = [f"{key.name}: {msg}" for key, (ok, _, msg) in zip(keys, results) if not ok]
        out["ours"] = {"kernels": len(keys), "failed": failed, "seconds": time.monotonic() - t0}
        log(f"compiled {len(keys) - len(failed)}/{len(keys)} kernels of ours ahead in "
            f"{out['ours']['seconds']:.0f} s")
    for act, (child, output) in children.items():
        try:
            ok = child.wait(timeout=max(60.0, 2 * QUACK_WARM_S - (time.monotonic() - t0))) == 0
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            ok = False
        output.seek(0)
        tail = output.read()[-1500:].decode(errors="replace")
        output.close()
        out[f"quack {act}"] = {"ok": ok, "seconds": time.monotonic() - t0,
                               **({} if ok else {"output_tail": tail})}
        log(f"quack's {act} kernels compiled ahead in {out[f'quack {act}']['seconds']:.0f} s"
            + ("" if ok else " (failed: they compile on first use instead; see the JSON)"))
    return out


# A swiglu step this small (tokens, width) has next to no GPU work: its time is the host's.
HOST_PROBE_SHAPE = (64, 256)


def host_probe_us(ctx: Ctx) -> float | None:
    """Host µs per fwd+bwd of a tiny eager MLP (None without CUDA): how fast this process does
    host work. Read at the start, after quack's import and the kernels compiled ahead, and after
    the last shape: on the H200 host it wanders by up to 2x within one process, with no stage of
    the sweep to blame (`tools/host_speed_stages.py`), and the host-bound rows run at whatever
    speed it has then."""
    if not ctx.cuda:
        return None
    from .models import EagerMLP, train_step
    from .timing import host_us_per_call

    tokens, d = HOST_PROBE_SHAPE
    model = EagerMLP(ctx.rand(2 * 4 * d, d), ctx.rand(d, 4 * d), "swiglu")
    x = ctx.rand(tokens, d).requires_grad_(True)
    dy = ctx.rand(tokens, d)
    return host_us_per_call(lambda: train_step(model, x, dy), calls=300, warmup=10)


def takes_small_step(ctx: Ctx, shape: Shape) -> bool:
    """Whether ours (ParallelMLP with ctx.backend, one rank, default mode) runs this shape's step
    as plain autograd ops (small_step.py)."""
    return small_step.applies(shape.tokens, shape.d, fc1_features(shape.act, shape.shard),
                              shape.shard, shape.d, device_type=ctx.device.type,
                              backend=ctx.backend, tp_size=1, recompute=False,
                              fuse_grad_accum=False, compiling=False,
                              gate_ops=get_activation(shape.act).gate is not None,
                              launch_graphs=replays_launches(None, None))  # no biases


def sweep_row(ctx: Ctx, shape: Shape, names, quack_tuned: bool,
              hold: tuple[float, int] | None = None) -> dict:
    """One shape: bench_mlp's variants with quack beside them, plus every variant's ratio to
    quack and a flag where one disagrees with eager. Where ours takes the small step, the fused
    kernels are timed beside it, so the row shows the rule's choice against the other path.
    ``hold``: (seconds per turn, turns) for this shape, instead of ctx's."""
    if hold is not None and hold != (ctx.hold_s, ctx.rounds):
        saved = ctx.hold_s, ctx.rounds
        ctx.hold_s, ctx.rounds = hold
        try:
            return sweep_row(ctx, shape, names, quack_tuned) | {
                "turns": {"hold_s": hold[0], "rounds": hold[1]}}
        finally:
            ctx.hold_s, ctx.rounds = saved
    ctx.tokens, ctx.d_model = shape.tokens, shape.d
    small = takes_small_step(ctx, shape)
    if small and "ours" in names:
        names = list(names)
        names.insert(names.index("ours") + 1, "ours_fused")
    extra = {}
    if "quack" in names:
        extra["quack"] = lambda w1, w2: quack_baseline.build(w1, w2, shape.act, shape.shard,
                                                             tuned=quack_tuned)
    out = bench_mlp(ctx, shape.act, shape.shard, names, extra)
    v = out["variants"]
    for res in v.values():
        if isinstance(res, dict) and "ms" in res:
            res["speedup_vs_quack"] = ratio(v.get("quack"), res)
    disagree = [name for name, res in v.items() if isinstance(res, dict)
                and max(res.get(key, 0.0) for key in ERR_KEYS) > AGREE_TOL]
    return {"variants": v, "recompute_ratio": out.get("recompute_ratio"), "disagree": disagree,
            "ours_path": "small step" if small else "fused"}


def shape_record(shape: Shape) -> dict:
    return asdict(shape) | {"label": shape.label, "shard": shape.shard, "flops": shape.flops}


def run(args: argparse.Namespace) -> dict:
    start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    ctx = Ctx(device=device, dtype=getattr(torch, args.dtype), tokens=0, d_model=0, configs=[],
              iters=args.iters, warmup=args.warmup, backend=args.backend,
              deadline=float("inf"), hold_s=args.hold_s, rounds=args.rounds,
              heat_s=args.heat_s, quiet=True)
    ctx.l2_bytes = l2_bytes(device)
    torch.manual_seed(0)
    host_us = {"start": host_probe_us(ctx)}
    host_where = {"start": placement()}
    probe_ours(ctx)
    shapes, names = grid(args), variants(args)
    if "quack" in names:
        mod, reason = quack_baseline.load()
        if mod is None:
            ctx.unavailable["quack"] = reason
            log(f"quack: skipped: {reason}")
    num_sms = (torch.cuda.get_device_properties(device).multi_processor_count if ctx.cuda
               else 132)
    warm_ours = ctx.cuda and issubclass(ctx.ours or object, CuteBackend) and not args.no_warmup
    # quack compiles ahead only untuned: tuned, it compiles its candidates at each new shape.
    warm_quack = ("quack" in names and "quack" not in ctx.unavailable and not args.no_warmup
                  and not args.quack_tuned)
    n_kernels = len(kernel_keys(shapes, args.dtype, num_sms)) if warm_ours else 0
    runnable = [name for name in names if unavailable(ctx, name) is None]  # the others cost nothing
    plan = estimate(shapes, runnable, args, n_kernels, warm_quack)
    for line in plan_lines(shapes, names, args, plan):
        log(line)
    if args.quack_tuned and "quack" not in ctx.unavailable:
        log("quack tuned: its autotuning at every shape is not in the estimate")

    if args.no_autograd_threads:
        torch.autograd.set_multithreading_enabled(False)  # for the whole run, every variant
    if args.no_launch_graphs:
        GRAPHS.enabled = False
    meta = environment(ctx) | {
        "mode": "sweep", "autograd_threads": not args.no_autograd_threads,
        "launch_graphs": GRAPHS.enabled, "dtype": args.dtype,
        "hold_s": args.hold_s, "rounds": args.rounds, "short_turns_s": args.short_turns_s,
        "heat_s": args.heat_s, "first_heat_s": args.first_heat_s,
        "warmup": args.warmup, "iters": args.iters, "dry_run": args.dry_run,
        "quick": args.quick, "variants": names, "budget_s": args.budget_s, "estimate": plan,
        "backend_note": getattr(args, "backend_note", None),
        "quack": {"version": quack_baseline.version(), "tuned": args.quack_tuned,
                  "unavailable": ctx.unavailable.get("quack")},
        "host_probe_us": host_us, "host_placement": host_where}
    results = {"meta": meta, "rows": []}

    def save():
        report.write_json(results, args.json)

    def on_hang(msg: str):
        results.setdefault("errors", []).append(msg)
        save()
        print(sweep_report.format_sweep(results), flush=True)

    watchdog = start_watchdog(ctx, args.budget_s + WATCHDOG_MARGIN_S, on_hang)
    if warm_ours or warm_quack:
        results["compile_ahead"] = compile_ahead(shapes, args, warm_ours, warm_quack, num_sms)
        save()
    host_us["before the shapes"] = host_probe_us(ctx)
    host_where["before the shapes"] = placement()

    progress = Progress(len(shapes))
    for i, shape in enumerate(shapes):
        left = sum(plan["per_shape_s"][i:])
        progress.update(i, shape.label, left)
        row = shape_record(shape)
        elapsed = time.monotonic() - start
        if elapsed + plan["per_shape_s"][i] > args.budget_s:
            row["skipped"] = f"over the time budget ({args.budget_s - elapsed:.0f} s left)"
        else:
            ctx.heat_s = shape_heat_s(i, args)
            row |= attempt(ctx, f"sweep {shape.label}", sweep_row, ctx, shape, names,
                           args.quack_tuned, turns(shape, args))
        results["rows"].append(row)
        save()
        free_memory(ctx)
    progress.update(len(shapes), "done")
    progress.close()
    host_us["after the last shape"] = host_probe_us(ctx)
    host_where["after the last shape"] = placement()
    results["meta"]["wall_s"] = time.monotonic() - start
    # the launch groups over the whole run: graphs kept at its end, captures, plain runs, replays
    results["meta"]["launch_groups"] = {"graphs kept": len(GRAPHS), **GRAPHS.stats}
    save()
    watchdog.cancel()
    return results


def main(argv=None) -> int:
    args = apply_defaults(parse_args(argv))
    try:
        grid(args)
    except ValueError as e:  # --tokens that match no shape
        print(f"python -m parallel_mlp.bench sweep: error: {e}", file=sys.stderr)
        return 2
    if args.estimate:
        shapes, names = grid(args), variants(args)
        n_kernels = 0 if args.dry_run else len(kernel_keys(shapes, args.dtype, 132))
        warm_quack = "quack" in names and not args.quack_tuned and not args.no_warmup
        plan = estimate(shapes, names, args, n_kernels, warm_quack)
        print("\n".join(plan_lines(shapes, names, args, plan)))
        for shape, secs in zip(shapes, plan["per_shape_s"]):
            print(f"  {secs:5.1f} s  {shape.label}")
        return 0
    results = run(args)
    report.finish(results, args.json, args.png, sweep_report.write_heatmap,
                  sweep_report.format_sweep)
    return 0
