"""How the benchmark measures a row: the run's context, side-by-side timing (held or call by
call), guarded attempts that record an error instead of ending the run, and the run's metadata.

Timing follows one method everywhere: CUDA events around each call, warm-up first, random inputs
(never zeros), several input sets rotated when one set would sit in L2. Variants that are compared
run side by side, held by default (``time_held``): each back to back for ``hold_s`` seconds, in
turn, for ``rounds`` rounds (the median of its rounds). The H200 is power-bound: at its 700 W cap
the clock a kernel gets depends on the energy it spends per cycle, and it settles over tens of
milliseconds. Held, each variant runs at its own clock, as in training; rounds in turn cancel the
drift of the card's clock over seconds. ``hold_s = 0`` times call by call, round-robin: the
variants then share one clock, so the ratio compares cycles, not time; that favoured our kernels,
which take fewer cycles but more power than cuBLAS's, by up to 13% on the whole MLP
(kernels/NOTES.md).
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backends import resolve
from .timing import Clock, heat, hold, settled, turn_order

_START = time.monotonic()


def log(msg: str) -> None:
    """Progress goes to stderr, so stdout ends with the table alone. On a terminal the line is
    cleared first, so a message lands over a progress bar (``progress.Progress``) rather than
    after it; the bar redraws on its next update."""
    clear = "\r\033[K" if sys.stderr.isatty() else ""
    print(f"{clear}[bench {time.monotonic() - _START:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---- run context ----------------------------------------------------------------------------


@dataclass
class Ctx:
    """Everything a section needs: shapes, device, timing settings, and which backend is ours."""

    device: torch.device
    dtype: torch.dtype
    tokens: int
    d_model: int
    configs: list[tuple[str, int]]
    iters: int
    warmup: int
    backend: str
    deadline: float
    cold_start_config: tuple[str, int] | None = None
    ours: object = None            # the resolved backend class, or None when it cannot run
    ours_reason: str | None = None  # why not
    l2_bytes: int = 0
    hold_s: float = 0.0             # > 0: time variants held (time_held), else call by call
    rounds: int = 3                 # held: turns each variant gets
    heat_s: float = 0.0             # held: untimed calls of every variant in turn first (timing.heat)
    current: str = ""               # the measurement in progress, for the watchdog's report
    # Variants that cannot run here (a missing package, say), by name: their rows say why.
    unavailable: dict[str, str] = field(default_factory=dict)
    clock: Clock = time.perf_counter  # what CPU timing reads; tests inject a fake one
    quiet: bool = False             # no progress lines (errors are still logged)
    checkpoint: Callable[[], None] = lambda: None  # saves the results so far
    # Held timing: counts to read before and after every timed turn; each fn's result then holds
    # their change over its turns, per turn, as "per_turn". On CUDA by default the fused
    # function's launch-group captures, plain runs and replays (launch_counts).
    turn_counts: Callable[[], dict] | None = None
    cuda: bool = field(init=False)

    def __post_init__(self):
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.turn_counts is None:
            self.turn_counts = launch_counts

    def log(self, msg: str) -> None:
        if not self.quiet:
            log(msg)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def rand(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        # Random, never zero: zeros hide unwritten outputs and can run faster than real data.
        return torch.randn(*shape, device=self.device, dtype=self.dtype).mul_(scale)


# ---- timing ---------------------------------------------------------------------------------


def input_sets(ctx: Ctx, bytes_per_set: int, max_sets: int = 4) -> int:
    """How many input sets to rotate through so that repeated calls don't just measure the L2:
    one when a set is well over the L2, more when it would fit."""
    if bytes_per_set >= 2 * ctx.l2_bytes:
        return 1
    return max(1, min(max_sets, math.ceil(3 * ctx.l2_bytes / max(bytes_per_set, 1))))


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def time_calls(ctx: Ctx, fn, n_sets: int = 1) -> dict:
    """The time of ``fn(i)``, ``i`` cycling the input sets: time_side_by_side of fn alone (held,
    or the median of ctx.iters calls after ctx.warmup).

    For a measurement that stands alone (the ceiling, eager's fused ops); those
    whose ratio is taken go through time_side_by_side together, so that the card's drift cancels.
    """
    return time_side_by_side(ctx, {"fn": fn}, n_sets)["fn"]


def time_side_by_side(ctx: Ctx, fns: dict[str, Callable], n_sets: int = 1) -> dict[str, dict]:
    """Time several functions side by side: held (time_held) when ctx.hold_s > 0, else call by
    call, round-robin: ctx.warmup untimed rounds, then ctx.iters rounds, each calling every fn
    once in order with the same input set ``i``. Returns, per name, what time_calls returns.

    Why side by side: the H200 is power-bound, and its SM clock wanders 10-20% over seconds with
    the load. Timing all of one variant's calls and then the other's compares two clock states as
    much as two kernels (one run had cuBLAS at 803 TF/s and ours at 680 on a row, another run the
    reverse). Call by call, the variants share one clock, so the ratio compares their cycles but
    hides that one may draw more power per cycle and, run alone, get a lower clock; held turns
    (the default) give each its own clock and still cancel the drift.

    On CUDA each call sits between two events and the host never waits inside the loop, so the
    queue stays full; one synchronize at the end. On the CPU two readings of ctx.clock per call.
    """
    if ctx.hold_s > 0:
        return time_held(ctx, fns, n_sets)
    for i in range(ctx.warmup):
        for fn in fns.values():
            fn(i % n_sets)
    ctx.sync()
    if ctx.cuda:
        def event():
            return torch.cuda.Event(enable_timing=True)

        events = {name: [(event(), event()) for _ in range(ctx.iters)] for name in fns}
        for i in range(ctx.iters):
            for name, fn in fns.items():
                start, end = events[name][i]
                start.record()
                fn(i % n_sets)
                end.record()
        torch.cuda.synchronize(ctx.device)
        times = {name: [start.elapsed_time(end) for start, end in pairs]
                 for name, pairs in events.items()}
    else:
        times = {name: [] for name in fns}
        for i in range(ctx.iters):
            for name, fn in fns.items():
                t0 = ctx.clock()
                fn(i % n_sets)
                times[name].append((ctx.clock() - t0) * 1e3)
    return {name: {"ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                   "iters": ctx.iters, "input_sets": n_sets} for name, t in times.items()}


def time_held(ctx: Ctx, fns: dict[str, Callable], n_sets: int = 1) -> dict[str, dict]:
    """Time each fn held, as training runs it: ctx.warmup untimed calls of each, then ctx.heat_s
    seconds of untimed calls of every fn in turn (timing.heat: the first turns would otherwise
    meet a card fresh from idle), then ctx.rounds rounds in which each fn in turn runs back to
    back for ctx.hold_s seconds (input sets cycling; the order reverses every round,
    timing.turn_order).
    A hold's time is the median of its settled calls (timing.settled); a fn's ``ms`` is
    the median of its holds, ``min_ms`` / ``max_ms`` the extremes of its holds' medians,
    ``holds_ms`` the holds' medians round by round (for :func:`ratio`'s pairing), and ``iters``
    the calls timed. Returns the same keys as the call-by-call timing, plus ``hold_s`` and
    ``rounds``."""
    for i in range(ctx.warmup):
        for fn in fns.values():
            fn(i % n_sets)
    ctx.sync()
    if ctx.heat_s > 0:
        heat([lambda i, fn=fn: fn(i % n_sets) for fn in fns.values()], ctx.heat_s, ctx.cuda,
             ctx.clock)
    holds = {name: [] for name in fns}
    counted = {name: 0 for name in fns}
    counts = {name: {} for name in fns}
    names = list(fns)
    for r in range(ctx.rounds):
        for name in (names[k] for k in turn_order(len(names), r)):
            fn = fns[name]
            before = ctx.turn_counts() if ctx.turn_counts is not None else None
            kept = settled(hold(lambda i, fn=fn: fn(i % n_sets), ctx.hold_s, ctx.cuda, ctx.clock))
            if before is not None:
                add_changes(counts[name], before, ctx.turn_counts())
            holds[name].append(statistics.median(kept))
            counted[name] += len(kept)
    out = {name: {"ms": statistics.median(h), "min_ms": min(h), "max_ms": max(h),
                  "holds_ms": h, "iters": counted[name], "input_sets": n_sets,
                  "hold_s": ctx.hold_s, "rounds": ctx.rounds} for name, h in holds.items()}
    if ctx.turn_counts is not None:
        for name in fns:
            out[name]["per_turn"] = {k: v / ctx.rounds for k, v in counts[name].items()}
    return out


def add_changes(total: dict, before: dict, after: dict) -> None:
    """total[k] += after[k] - before[k] for every count k of either reading (a missing one is 0)."""
    for k in after.keys() | before.keys():
        total[k] = total.get(k, 0) + after.get(k, 0) - before.get(k, 0)


def launch_counts() -> dict:
    """The fused function's launch-group counts so far (launch_graphs.GRAPHS.stats: captures,
    plain runs, replays, capture failures), for Ctx.turn_counts: where a variant's groups meet
    new keys during its timed turns, each costs a plain run and, seen again, a capture."""
    from ..launch_graphs import GRAPHS

    return dict(GRAPHS.stats)


def per_name(result: dict, names) -> dict[str, dict]:
    """An attempt() of an interleaved measurement gives a dict per name, or a single error (or
    skip) dict when it failed: then every name gets a copy of that one."""
    if all(name in result for name in names):
        return result
    return {name: dict(result) for name in names}


def with_tflops(timing: dict, flops: float) -> dict:
    timing["tflops"] = flops / (timing["ms"] * 1e-3) / 1e12
    return timing


def time_with_tflops(ctx: Ctx, fns: dict[str, Callable], n_sets: int, flops: float) -> dict:
    """time_side_by_side, with each fn's rate for ``flops`` per call."""
    times = time_side_by_side(ctx, fns, n_sets)
    return {name: with_tflops(t, flops) for name, t in times.items()}


def attempt(ctx: Ctx, what: str, fn, *args, min_time_s: float = 0.0) -> dict:
    """Run one measurement; an exception becomes ``{"error": ...}`` so one broken row never ends
    the run, and a measurement that would start past the time budget is skipped."""
    if ctx.time_left() < min_time_s:
        return {"skipped": f"over the time budget ({ctx.time_left():.0f} s left)"}
    ctx.current = what
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - recorded in the results, never swallowed silently
        log(f"{what} failed: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        if ctx.cuda:
            torch.cuda.empty_cache()  # after an OOM, let the next row start from a clean pool
        return {"error": f"{type(e).__name__}: {e}"[:600]}


def ours_or_reason(ctx: Ctx):
    """The measurement for a row of ours when our backend cannot run here: say so, per row."""
    if ctx.ours is None:
        return {"unavailable": ctx.ours_reason}
    return None


def unavailable(ctx: Ctx, variant: str):
    """Why a variant cannot run here (ours without its backend, a baseline without its package),
    as the row to record in its place; None when it can run."""
    if variant.endswith("_graphed") and not ctx.cuda:
        return {"unavailable": "CUDA graphs need a GPU"}
    if variant.startswith("ours"):
        return ours_or_reason(ctx)
    if variant in ctx.unavailable:
        return {"unavailable": ctx.unavailable[variant]}
    return None


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32: a cheap guard against timing a kernel that computes
    something else (bf16 operands land between 1e-3 and 1e-2)."""
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def ratio(base: dict | None, other: dict | None) -> float | None:
    """base time / other time: other's throughput relative to base (None if either is missing).

    Two held timings of one run (time_held) pair up round by round: the median over rounds of
    base's hold / other's hold in that round. A round's turns lie within a second of each
    other, so a host or clock that wanders over seconds moves both sides of each pair alike,
    where the ratio of the two medians can take them from different phases of the wander. At the
    sweep's host-bound steps (32 turns of 0.05 s) eager against a second copy of itself read
    0.89-1.21x as a ratio of medians (H200, 2026-12-02, `bench sweep`); see the sweep's JSON for
    the paired reading."""
    if not (isinstance(base, dict) and isinstance(other, dict)):
        return None
    if "ms" not in base or "ms" not in other:
        return None
    ratios = round_ratios(base, other)
    if len(ratios) >= 2:
        return statistics.median(ratios)
    return base["ms"] / other["ms"]


def round_ratios(base, other) -> list[float]:
    """base's hold / other's, round by round, where both hold the same number of rounds."""
    if not (isinstance(base, dict) and isinstance(other, dict)):
        return []
    b, o = base.get("holds_ms") or (), other.get("holds_ms") or ()
    if len(b) != len(o) or not all(x > 0 for x in o):
        return []
    return [x / y for x, y in zip(b, o)]


def ratio_interval(base: dict | None, other: dict | None,
                   level: float = 0.95) -> tuple[float, float] | None:
    """An interval that holds :func:`ratio`'s paired median with probability at least ``level``,
    or None where the rounds are too few (six at 0.95) or unpaired.

    Distribution-free: the k-th smallest and the k-th largest of the n round ratios, with k the
    largest rank at which a median's interval covers it with that probability (each round's
    ratio falls on either side of the true median with probability 1/2, so the number below it
    is binomial). It assumes rounds independent of each other, which a host that drifts over
    seconds only approximates; eager against a second copy of itself in the same run shows how
    often an interval misses 1.0 without a cause."""
    ratios = sorted(round_ratios(base, other))
    n = len(ratios)
    k, below = 0, 0.0  # below: P(fewer than k+1 of the n rounds fall below the median)
    while k < n // 2:
        below += math.comb(n, k) / 2 ** n
        if 1 - 2 * below < level:
            break
        k += 1
    if k == 0:
        return None
    return ratios[k - 1], ratios[n - k]


def free_memory(ctx: Ctx) -> None:
    if ctx.cuda:
        torch.cuda.empty_cache()


def check_timing_flags(parser, args) -> None:
    """Refuse what held timing cannot do (argparse's error: usage and exit 2)."""
    if args.hold_s is not None and args.hold_s < 0:
        parser.error(f"--hold-s {args.hold_s:g}: must be >= 0 (0 times call by call)")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be >= 1")


def without_cuda(args, planning: bool = False) -> None:
    """Without CUDA a run is the CPU dry run (tiny shapes), ours on the torch backend: it tests
    the script. ``planning``: nothing will run, so the plan stays the GPU run's."""
    if torch.cuda.is_available() or planning:
        return
    if not args.dry_run:
        log("no CUDA device: running the CPU dry run (tiny shapes, torch backend)")
        args.dry_run = True
    if args.backend == "cute":
        args.backend = "torch"  # the CuTe kernels need sm_90; the CPU run tests the script
        args.backend_note = "cute needs CUDA: ours runs on the torch backend in this dry run"


def l2_bytes(device: torch.device) -> int:
    """The device's L2 size, which decides how many input sets a row rotates (input_sets)."""
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2 ** 20)
    return 32 * 2 ** 20  # a nominal cache, so a CPU dry run exercises input rotation


def probe_ours(ctx: Ctx) -> None:
    """Decide once whether ``ctx.backend`` can run here, so each row can say why not without
    paying for the failure again."""
    a, b = ctx.rand(128, 128), ctx.rand(128, 128).t()
    try:
        ctx.ours = resolve(ctx.backend, a, b)
    except Exception as e:  # noqa: BLE001 - ValueError by contract; anything else says the same
        ctx.ours, ctx.ours_reason = None, f"{e}" if isinstance(e, ValueError) else repr(e)
        log(f"ours unavailable: {ctx.ours_reason}")


def environment(ctx: Ctx) -> dict:
    """What ran the measurements: versions, device, kernel cache, git revision, command line (as
    the interpreter got it: the bench hides sys.argv from the DSL while a command runs)."""
    meta = {"torch": torch.__version__, "python": sys.version.split()[0],
            "device": torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu",
            "cuda": torch.version.cuda, "backend": ctx.backend,
            "ours_unavailable": ctx.ours_reason, "l2_bytes": ctx.l2_bytes,
            "argv": sys.orig_argv, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        from importlib.metadata import version
        meta["cutlass_dsl"] = version("nvidia-cutlass-dsl")
    except Exception:  # noqa: BLE001 - not installed: fine, just not recorded
        meta["cutlass_dsl"] = None
    try:
        from ..kernels.compile import cache_dir
        meta["kernel_cache_dir"] = str(cache_dir())
    except Exception:  # noqa: BLE001 - kernels not importable here
        meta["kernel_cache_dir"] = None
    try:
        repo = Path(__file__).resolve().parents[2]

        def git(*args):
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=5, check=False).stdout.strip()

        # "+changes" when tracked files differ from HEAD: a copied working tree (as on a lent GPU
        # host) may carry an older .git than the code it runs.
        head = git("rev-parse", "--short", "HEAD")
        dirty = head and git("status", "--porcelain", "--untracked-files=no")
        meta["git"] = f"{head}+changes" if dirty else head
    except Exception:  # noqa: BLE001
        meta["git"] = None
    return meta


def start_watchdog(ctx: Ctx, limit_s: float, report: Callable[[str], None]) -> threading.Timer:
    """A hung kernel blocks the main thread in a synchronize forever. After ``limit_s``, log the
    measurement that hangs, let ``report(message)`` save and print what was measured, and exit,
    so the one run on a GPU still reports instead of dying silently at the caller's time limit."""

    def fire():
        msg = f"watchdog: still running after {limit_s:.0f} s, stuck in: {ctx.current}"
        log(msg)
        try:
            report(msg)
        finally:
            os._exit(3)

    timer = threading.Timer(limit_s, fire)
    timer.daemon = True
    timer.start()
    return timer
