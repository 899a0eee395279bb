"""Kernel configs against cuBLAS: the cute ops at the configs they pick, or at others, on the
MLP's six GEMM shapes (a tool for choosing GemmConfig defaults; the ``gemm`` command measures
the defaults the layer runs).

    python -m parallel_mlp.bench configs [--T 8192 --d 4096 --h 14336 --act swiglu]
                                         [--sweep] [--scheduler static|dynamic]
                                         [--consumers cooperative|pingpong]
                                         [--also stream_k=1 [--also tile_n=128]]

Prints one line per GEMM: ms and TFLOP/s for torch and for ours, and the ratio (for the fused
rows, torch runs the plain GEMM of the same shape: the ratio is the fused op's cost); each `--also`
adds a column of ours with those GemmConfig fields changed on the config ours picks. Inputs are
random (never zeros); torch, ours and the variants are held in turn (each back to back for
--hold-s, three turns: each at its own clock, as in training), or with --hold-s 0 called in turn
call by call (one shared clock: a comparison of cycles); each time is a median of CUDA-event-timed
calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import torch

from .timing import DEFAULT_HOLD_S, graphed, host_us_per_call, median_ms_held, median_ms_interleaved


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench configs",
                                description=__doc__.split("\n")[0])
    p.add_argument("--T", type=int, default=8192)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--h", type=int, default=14336)
    p.add_argument("--act", default="swiglu")
    p.add_argument("--tuned", action="store_true")
    p.add_argument("--only", default=None, help="comma-separated GEMM names to run")
    p.add_argument("--sweep", action="store_true", help="time every tuning candidate config for each GEMM")
    p.add_argument(
        "--scheduler", choices=["static", "dynamic"], default=None,
        help="force this tile scheduler on every config (default: each config's own, i.e. static)",
    )
    p.add_argument(
        "--consumers", choices=["cooperative", "pingpong"], default=None,
        help="pingpong: time the pingpong consumer schedule. Without --sweep each GEMM runs at "
        "PINGPONG_CANDIDATES[0] (128x128, one warpgroup's tile) with this run's scheduler; with "
        "--sweep every PINGPONG_CANDIDATES config is timed instead of TUNE_CANDIDATES",
    )
    p.add_argument(
        "--groups", default=None,
        help="with --sweep: comma-separated rasterization groups to time each candidate at (e.g. 8,16)",
    )
    p.add_argument(
        "--also", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
        help="time another column of ours with these GemmConfig fields replaced on the config ours "
        "picks (e.g. l2_prefetch=1, dact_prefetch=2); repeatable",
    )
    p.add_argument("--hold-s", type=float, default=DEFAULT_HOLD_S,
                   help="each function runs back to back this long per turn, --rounds turns "
                   "(its own clock, as in training); 0: call by call, round-robin (one shared "
                   "clock: compares cycles, not time)")
    p.add_argument("--rounds", type=int, default=3,
                   help="turns per function when held (default 3). The order reverses every "
                   "round, which balances the columns' places only over an even number of "
                   "rounds: with 3 the last column runs last in two of them")
    p.add_argument("--graphed", type=int, default=0, metavar="CALLS",
                   help="time every column as a CUDA graph of CALLS back-to-back calls (timing."
                   "graphed): the kernels without their launches' host time, for GEMMs short "
                   "enough that the host would bound the timing loop; times are per call")
    p.add_argument("--scale", type=float, default=0.02,
                   help="standard deviation of every random operand (1: preact and dy at unit scale, as in training)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: must be >= 1")
    if args.graphed < 0:
        p.error(f"--graphed {args.graphed}: give the calls per graph (0: no graph)")
    variants = [_parse_fields(a) for a in args.also]

    if not torch.cuda.is_available():
        raise SystemExit("configs needs a CUDA GPU")

    from ..activations import ACTIVATIONS
    from ..kernels import ops

    A = ACTIVATIONS[args.act]
    T, d, h = args.T, args.d, args.h
    F = 2 * h if A.gated else h
    bf = torch.bfloat16
    r = lambda *s: torch.randn(*s, device="cuda", dtype=bf) * args.scale  # noqa: E731
    x, w1, w2 = r(T, d), r(F, d), r(d, h)
    pre, post, dy = r(T, F), r(T, h), r(T, d)
    dpre = r(T, F)
    mg1 = torch.zeros(F, d, device="cuda")
    mg2 = torch.zeros(d, h, device="cuda")
    tk = dict(tuned=args.tuned)

    def addmm_fp32(a, b, out):
        # cuBLAS accumulating into an fp32 main grad (beta=1), as Megatron/TE and the bench's
        # GEMM table call it: the baseline for our += rows.
        return torch.addmm(out, a, b, out_dtype=torch.float32, out=out)

    rows = [
        # The fused rows' torch column is the plain cuBLAS GEMM of the same shape (the target
        # is ours within 5% of it), run in turn with ours: an eager activation there would be a
        # light neighbour (elementwise passes), letting the clock rise before ours runs.
        ("fc1 x@W1.T +act", T, F, d, lambda: x @ w1.t(), lambda: ops.gemm_act(x, w1.t(), A.name, **tk)),
        ("fc1 x@W1.T plain", T, F, d, lambda: x @ w1.t(), lambda: ops.gemm(x, w1.t(), **tk)),
        ("fc2 post@W2.T", T, d, h, lambda: post @ w2.t(), lambda: ops.gemm(post, w2.t(), **tk)),
        ("dpost dy@W2 +dact", T, h, d, lambda: dy @ w2, lambda: ops.gemm_dact(dy, w2, pre, A.name, **tk)),
        ("dpost dy@W2 plain", T, h, d, lambda: dy @ w2, lambda: ops.gemm(dy, w2, **tk)),
        ("dx dpre@W1", T, d, F, lambda: dpre @ w1, lambda: ops.gemm(dpre, w1, **tk)),
        ("dW2 dy.T@post +=", d, h, T, lambda: addmm_fp32(dy.t(), post, mg2), lambda: ops.gemm(dy.t(), post, out=mg2, accumulate=True, **tk)),
        ("dW1 dpre.T@x +=", F, d, T, lambda: addmm_fp32(dpre.t(), x, mg1), lambda: ops.gemm(dpre.t(), x, out=mg1, accumulate=True, **tk)),
        ("dW2 dy.T@post bf16", d, h, T, lambda: dy.t() @ post, lambda: ops.gemm(dy.t(), post, **tk)),
    ]
    only = set(args.only.split(",")) if args.only else None
    print(f"T={T} d={d} h={h} act={A.name} bf16; {torch.cuda.get_device_name()}")
    # Launch overhead on a tiny GEMM (256^3: the kernel is a few µs, so host time dominates).
    tiny = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    print(f"host time per call, 256^3 GEMM: torch.mm {host_us_per_call(lambda: tiny @ tiny):.0f} us, "
          f"ops.gemm {host_us_per_call(lambda: ops.gemm(tiny, tiny)):.0f} us, "
          f"ops.gemm_act {host_us_per_call(lambda: ops.gemm_act(tiny, tiny, A.name)):.0f} us")
    extra = "".join(f" | {_label(v):>22s}" for v in variants)
    print(f"{'gemm':24s} {'M':>6s} {'N':>6s} {'K':>6s} | {'torch ms':>8s} {'TF/s':>6s} | {'ours ms':>8s} {'TF/s':>6s} | ratio{extra}")
    from ..kernels.config import PINGPONG_CANDIDATES, TUNE_CANDIDATES, default_config

    pingpong = args.consumers == "pingpong"

    def timed(fns, reps, warmup):
        calls = max(args.graphed, 1)
        if args.graphed:
            fns = [graphed(fn, calls) for fn in fns]
        if args.hold_s > 0:
            times = median_ms_held(fns, hold_s=args.hold_s, rounds=args.rounds, warmup=warmup)
        else:
            times = median_ms_interleaved(fns, reps=reps, warmup=warmup)
        return [t / calls for t in times]

    for name, M, N, K, ref, ours in rows:
        if only and name.split()[0] not in only:
            continue
        flops = 2 * M * N * K
        if args.sweep:
            candidates = PINGPONG_CANDIDATES if pingpong else TUNE_CANDIDATES
            if args.groups:
                groups = [int(g) for g in args.groups.split(",")]
                candidates = [dataclasses.replace(c, raster_group=g) for c in candidates for g in groups]
            if args.scheduler:
                # the dynamic scheduler takes 1x1 clusters only
                candidates = [dataclasses.replace(c, scheduler=args.scheduler) for c in candidates
                              if args.scheduler != "dynamic" or (c.cluster_m, c.cluster_n) == (1, 1)]
            # Compile (or fail) each candidate first, then time the ones that run interleaved
            # with torch, so the TF/s of one row compare at the same clocks.
            runnable = []
            for cfg in candidates:
                fn = functools.partial(_with_config, ours, cfg)
                try:
                    fn()
                    runnable.append((cfg, fn))
                except Exception as e:
                    print(f"   {cfg.key:28s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            times = timed([ref] + [fn for _, fn in runnable], 20, 3)
            print(f"{name}: default {default_config(M, N, K).key}; torch {flops / times[0] / 1e9:.0f} TF/s")
            for (cfg, _), t in zip(runnable, times[1:]):
                print(f"   {cfg.key:28s} {flops / t / 1e9:6.0f} TF/s  {times[0] / t:5.3f}x torch", flush=True)
            continue
        if pingpong:
            cfg = PINGPONG_CANDIDATES[0]
            if args.scheduler:
                cfg = dataclasses.replace(cfg, scheduler=args.scheduler)
            ours = functools.partial(_with_config, ours, cfg)
        elif args.scheduler:
            ours = functools.partial(_with_scheduler, ours, args.scheduler)
        # A column whose fields do not make a valid config with this row's default (e.g.
        # dact_prefetch=3 on a pingpong GEMM) reads n/a instead of ending the run.
        extra = [_runnable(functools.partial(_with_overrides, ours, v)) for v in variants]
        t_ref, t_ours, *t_ok = timed([ref, ours] + [fn for fn in extra if fn is not None], 30, 5)
        t_var = [None if fn is None else t_ok.pop(0) for fn in extra]
        cols = "".join(f" | {'n/a':>21s}" if t is None else f" | {t:8.3f} {flops / t / 1e9:6.0f} {t_ref / t:5.3f}"
                       for t in t_var)
        print(
            f"{name:24s} {M:6d} {N:6d} {K:6d} | {t_ref:8.3f} {flops / t_ref / 1e9:6.0f} | "
            f"{t_ours:8.3f} {flops / t_ours / 1e9:6.0f} | {t_ref / t_ours:5.3f}{cols}",
            flush=True,
        )
    return 0


def _runnable(fn):
    """fn if one call of it runs, else None (its config is invalid there: said on stdout)."""
    try:
        fn()
    except ValueError as e:
        print(f"   n/a: {str(e)[:160]}", flush=True)
        return None
    return fn


def _parse_fields(text: str) -> dict:
    """`--also` text -> GemmConfig field overrides; what is not FIELD=VALUE stops the command."""
    from ..kernels.config import parse_fields

    try:
        return parse_fields(text)
    except ValueError as e:
        raise SystemExit(f"--also {e}") from None


def _label(fields: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in fields.items())


def _with_overrides(fn, fields):
    """Run an op lambda with the config ops picks, these GemmConfig fields replaced."""
    from ..kernels import ops

    with ops.rewriting_configs(lambda cfg: dataclasses.replace(cfg, **fields)):
        return fn()


def _with_scheduler(fn, scheduler):
    """Run an op lambda with its usual config, but with `scheduler` (clusters made 1x1 for the
    dynamic one, which supports no others)."""
    from ..kernels import ops

    def rewrite(cfg):
        if scheduler == "dynamic":
            cfg = dataclasses.replace(cfg, cluster_m=1, cluster_n=1)
        return dataclasses.replace(cfg, scheduler=scheduler)

    with ops.rewriting_configs(rewrite):
        return fn()


def _with_config(fn, cfg):
    """Run a zero-argument op lambda with ops' config forced to `cfg`."""
    from ..kernels import ops

    with ops.rewriting_configs(lambda _: cfg):
        return fn()
