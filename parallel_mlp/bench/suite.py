"""The single-GPU benchmark: ours against cuBLAS, PyTorch eager and torch.compile, in one process.

    python -m parallel_mlp.bench [full] [flags]   # everything below, in one run (~6 minutes)
    python -m parallel_mlp.bench mlp [flags]      # the whole MLP fwd+bwd, then torch.compile
    python -m parallel_mlp.bench gemm [flags]     # the MLP's GEMMs and fused ops against cuBLAS
    python -m parallel_mlp.bench cold [flags]     # a new process's time to its first fwd+bwd
    python -m parallel_mlp.bench full --dry-run   # tiny shapes; automatic without CUDA

Sections:

- ``gemm`` (gemms.py): the six GEMMs of the MLP with the operand layouts the layer really uses
  (plus the wgrads accumulated into an fp32 main grad), ours vs ``torch.mm`` (cuBLAS); then
  ``gemm_act`` and ``gemm_dact`` vs a plain cuBLAS GEMM of the same shape and vs eager torch.
- ``mlp`` (mlp.py): ParallelMLP fwd+bwd at TP=1 (default and recompute modes) vs a plain PyTorch
  module (eager and torch.compile), with peak memory per variant.
- ``cold`` (cold.py): a new process to its first fwd+bwd with the kernel cache warm.

Timing (harness.py): CUDA events, warm-up first, random inputs, compared variants held side by
side (``--hold-s`` seconds a turn, ``--rounds`` turns; ``--hold-s 0`` times call by call), and a
cuBLAS 8192^3 line at the start and end so the run states its own ceiling and drift.

Every measurement is guarded: an error (the kernels missing, a shape they reject, an OOM) is
recorded in its row of the JSON and the table, and the run goes on. The table is printed last.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

from . import report
from .cold import section_cold_start
from .gemms import section_fused, section_gemms
from .harness import (
    Ctx,
    attempt,
    check_timing_flags,
    environment,
    l2_bytes,
    log,
    probe_ours,
    start_watchdog,
    time_calls,
    with_tflops,
    without_cuda,
)
from .mlp import section_compile, section_mlp
from .models import parse_configs
from .timing import DEFAULT_HOLD_S

DEFAULT_CONFIGS = "swiglu:14336,swiglu:7168,gelu_tanh_approx:16384"
# Tiny shapes for --dry-run: every code path, seconds on a CPU. Sizes stay multiples of 64 so the
# CuTe kernels' 16-byte alignment holds when a dry run happens on a GPU.
DRY_RUN = dict(tokens=256, d_model=128, configs="swiglu:384,swiglu:192,gelu_tanh_approx:512",
               iters=3, warmup=1, ceiling_size=256, hold_s=0.0)
FULL_SIZE = dict(tokens=8192, d_model=4096, configs=DEFAULT_CONFIGS, iters=30, warmup=5,
                 ceiling_size=8192, hold_s=DEFAULT_HOLD_S)
# Leave room after the budget for the table, the JSON and the chart.
DEFAULT_BUDGET_S = 420.0
# After the budget, the longest a started row may take before the watchdog reports a hang.
WATCHDOG_MARGIN_S = 150.0

# The sections each command runs, most important first in case the budget runs out: the whole
# MLP, the GEMMs, the cold start (after the kernel cache is warm), and torch.compile, the slow
# one, last.
COMMANDS = {
    "full": ("mlp", "gemm", "cold", "compile"),
    "mlp": ("mlp", "compile"),
    "gemm": ("gemm",),
    "cold": ("cold",),
}
SECTIONS = {
    "mlp": [section_mlp],
    "gemm": [section_gemms, section_fused],
    "cold": [section_cold_start],
    "compile": [section_compile],
}


def parse_args(argv=None, command: str = "full") -> argparse.Namespace:
    """The flags of ``command``: one of COMMANDS, or "tp" (the shapes and timing flags only)."""
    p = argparse.ArgumentParser(prog=f"python -m parallel_mlp.bench {command}",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=None, help="T, rows of x (default 8192)")
    p.add_argument("--d-model", type=int, default=None, help="d (default 4096)")
    global_h = "; hidden is the global size, split over the ranks" if command == "tp" else ""
    p.add_argument("--configs", default=None,
                   help=f"activation:hidden list (default {DEFAULT_CONFIGS}){global_h}")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--backend", default="cute", choices=["cute", "torch"],
                   help="what 'ours' runs on (default cute)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per row (default 30)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 5)")
    p.add_argument("--json", default="bench.json", help="where to write every number")
    p.add_argument("--hold-s", type=float, default=None,
                   help="seconds each compared variant runs back to back per round (default 1; "
                        "0: call by call, which compares cycles at a shared clock, not time)")
    p.add_argument("--rounds", type=int, default=3, help="held timing: turns per variant")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes and few iterations; automatic when CUDA is absent")
    if command == "tp":
        p.add_argument("--sequence-parallel", action="store_true",
                       help="x and y are each rank's slice of the tokens (all-gather before fc1, "
                            "reduce-scatter after fc2) instead of replicated (all-reduce)")
    sections = COMMANDS.get(command, ())
    if "compile" in sections:
        p.add_argument("--skip-compile", action="store_true", help="no torch.compile baseline")
    if "cold" in sections and command != "cold":
        p.add_argument("--skip-cold-start", action="store_true", help="no cold-start subprocesses")
    if command in COMMANDS:
        p.add_argument("--png", default=None, help="chart (needs matplotlib, the 'bench' extra)")
        p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                       help="rows that would start after this many seconds are skipped")
    args = p.parse_args(argv)
    check_timing_flags(p, args)
    args.command = command
    return args


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset flags: the full-size shapes, or tiny ones for a dry run (forced without CUDA)."""
    without_cuda(args)
    for key, value in (DRY_RUN if args.dry_run else FULL_SIZE).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def run_metadata(args: argparse.Namespace, ctx: Ctx) -> dict:
    meta = environment(ctx) | {
        "command": args.command, "dtype": args.dtype, "tokens": args.tokens,
        "d_model": args.d_model, "configs": args.configs, "iters": args.iters,
        "warmup": args.warmup, "hold_s": args.hold_s, "rounds": args.rounds,
        "dry_run": args.dry_run}
    if getattr(args, "backend_note", None):
        meta["backend_note"] = args.backend_note
    return meta


def make_ctx(args: argparse.Namespace, device: torch.device, start: float) -> Ctx:
    ctx = Ctx(device=device, dtype=getattr(torch, args.dtype), tokens=args.tokens,
              d_model=args.d_model, configs=parse_configs(args.configs), iters=args.iters,
              warmup=args.warmup, backend=args.backend,
              deadline=start + getattr(args, "budget_s", float("inf")),
              hold_s=args.hold_s, rounds=args.rounds)
    # The cold start uses the headline case (swiglu h=14336) or, on other shapes, the first config.
    swiglu = [c for c in ctx.configs if c[0] == "swiglu"]
    ctx.cold_start_config = swiglu[0] if swiglu else ctx.configs[0]
    ctx.l2_bytes = l2_bytes(device)
    return ctx


def spin_up(ctx: Ctx, fn, seconds: float) -> None:
    """Keep the device busy for a while, so clocks have ramped up before the first measurement."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        fn()
        ctx.sync()


def bench_ceiling(ctx: Ctx, n: int) -> dict:
    """cuBLAS n^3 in our dtype: the rate this run can hope for, measured, not from a datasheet."""
    a, b = ctx.rand(n, n), ctx.rand(n, n)
    # An idle H200 sits near 345 MHz; a few seconds of GEMMs bring the clocks up before timing.
    spin_up(ctx, lambda: torch.mm(a, b), 3.0 if ctx.cuda else 0.0)
    out = time_calls(ctx, lambda i: torch.mm(a, b))
    return with_tflops(out, 2.0 * n ** 3) | {"size": n}


def sections_of(args: argparse.Namespace) -> list:
    names = [s for s in COMMANDS[args.command]
             if not (s == "compile" and getattr(args, "skip_compile", False))
             and not (s == "cold" and getattr(args, "skip_cold_start", False))]
    return [section for name in names for section in SECTIONS[name]]


def run_single(args: argparse.Namespace) -> dict:
    start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    ctx = make_ctx(args, device, start)
    torch.manual_seed(0)
    probe_ours(ctx)
    results = {"meta": run_metadata(args, ctx)}

    def save():
        report.write_json(results, args.json)

    def on_hang(msg: str):
        results.setdefault("errors", []).append(msg)
        results["targets"] = report.evaluate_targets(results)
        save()
        print(report.format_tables(results), flush=True)

    ctx.checkpoint = save
    watchdog = start_watchdog(ctx, args.budget_s + WATCHDOG_MARGIN_S, on_hang)

    # The ceiling states the GPU's speed at the start and end of the timed sections; the cold
    # start alone times no GPU work worth comparing with it.
    ceiling = args.command != "cold"
    if ceiling:
        log("ceiling: cuBLAS GEMM")
        results["ceiling"] = {"start": attempt(ctx, "ceiling", bench_ceiling, ctx, args.ceiling_size)}
    for section in sections_of(args):
        try:
            section(ctx, results)
        except Exception as e:  # noqa: BLE001 - a bug in one section must not lose the others
            log(f"{section.__name__} failed: {e}")
            traceback.print_exc(file=sys.stderr)
            results.setdefault("errors", []).append(f"{section.__name__}: {type(e).__name__}: {e}")
        save()  # partial results survive a crash or a kill in a later section
    if ceiling:
        # The same GEMM again at the end: a drop means clocks or thermals moved during the run.
        results["ceiling"]["end"] = attempt(ctx, "ceiling", bench_ceiling, ctx, args.ceiling_size)
    results["meta"]["wall_s"] = time.monotonic() - start
    results["targets"] = report.evaluate_targets(results)
    save()
    watchdog.cancel()
    return results


def main(argv=None, command: str = "full") -> int:
    args = apply_defaults(parse_args(argv, command))
    results = run_single(args)
    report.finish(results, args.json, args.png, report.write_png, report.format_tables)
    return 0
