"""The MLP's plain GEMMs, ours against cuBLAS, at every shape of the sweep's grid (a GPU is needed).

    python3 tools/plain_gemms.py [--hold-s 0.2] [--rounds 4] [--tokens 512,1000] [--no-graph] [--json FILE]

Of a step's six GEMMs, four carry no activation: fc2 (postact @ W2.T), dx (dpreact @ W1) and the
two weight gradients, bf16 in the default mode or accumulated into an fp32 main grad
(fuse_grad_accum). cuBLAS can run those as well as our kernels can; which is faster depends on
the shape (few tiles, short K). This times both for each of them at the grid's 30 shapes, each
as a CUDA graph of back-to-back calls (the kernels alone: at a few tens of microseconds a call,
the host would bound an ungraphed loop; ``--no-graph`` times the calls from Python instead,
their launches' host time included), held in turns (`median_ms_held`), and prints ours /
cuBLAS per GEMM with our default config's tiles, so that a rule for which library runs which
GEMM can be read off it. Our kernels for the grid compile ahead in a pool first.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def plain_cases(T, d, h, act):
    """The step's GEMMs without an activation, as the layer lays them out (the bench's
    mlp_gemm_cases, less fc1's forward and fc2's dgrad, which run as fused ops)."""
    from parallel_mlp.bench.gemms import mlp_gemm_cases

    return [c for c in mlp_gemm_cases(T, d, act, h)
            if not c.name.startswith(("fc1 fwd", "fc2 dgrad"))]


def gemm_fns(case, dtype=torch.bfloat16, scale=0.02, device="cuda"):
    """(cuBLAS fn, ours fn) for one case on random operands; ours as the layer calls it (operands
    checked once beforehand, ``checked=True``), cuBLAS as the torch backend does (an fp32 main
    grad by one addmm where this torch has it)."""
    from types import SimpleNamespace

    from parallel_mlp.backends import TorchBackend
    from parallel_mlp.bench.gemms import make_operand
    from parallel_mlp.kernels import ops

    ctx = SimpleNamespace(rand=lambda *shape: (torch.randn(*shape, device=device) * scale).to(dtype))
    a, b = make_operand(ctx, case.m, case.k, case.a_t), make_operand(ctx, case.k, case.n, case.b_t)
    if not case.accumulate:
        return (lambda: torch.mm(a, b)), (lambda: ops.gemm(a, b, checked=True))
    main_grad = torch.zeros(case.m, case.n, device=device)
    return ((lambda: TorchBackend.gemm(a, b, out=main_grad, accumulate=True)),
            (lambda: ops.gemm(a, b, out=main_grad, accumulate=True, checked=True)))


def calls_per_graph(flop: float) -> int:
    """About 2 ms of work per graph at ~600 TFLOP/s, 1 to 20 calls."""
    return max(1, min(20, round(2e-3 * 600e12 / flop)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 tools/plain_gemms.py", description=__doc__.split("\n")[0])
    p.add_argument("--hold-s", type=float, default=0.2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    p.add_argument("--tokens", default=None, help="comma-separated T values to keep")
    p.add_argument("--no-graph", action="store_true",
                   help="call each GEMM from Python, back to back, no CUDA graph: its launch's host "
                        "time included (what a host-bound step pays per GEMM)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tools/plain_gemms.py needs a CUDA GPU")

    from parallel_mlp.bench.sweep_grid import GRID
    from parallel_mlp.bench.timing import graphed, median_ms_held
    from parallel_mlp.kernels.config import default_config
    from parallel_mlp.kernels.warmup import compile_keys, mlp_keys

    shapes = GRID
    if args.tokens:
        keep = {int(t) for t in args.tokens.split(",")}
        shapes = tuple(s for s in shapes if s.tokens in keep)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.monotonic()
    keys = list(dict.fromkeys(k for s in shapes for k in mlp_keys(s.tokens, s.d, s.shard, s.act,
                                                                    num_sms=num_sms)))
    ok = sum(r[0] for r in compile_keys(keys, args.jobs))
    print(f"compiled {ok}/{len(keys)} kernels ahead in {time.monotonic() - t0:.0f} s", flush=True)

    rows = []
    print(f"{'shape':44s} {'gemm':22s} {'M':>6s} {'N':>6s} {'K':>6s} {'config':34s} "
          f"{'cuBLAS ms':>9s} {'ours ms':>9s} {'ours/cuBLAS':>11s}", flush=True)
    for s in shapes:
        for case in plain_cases(s.tokens, s.d, s.shard, s.act):
            name, M, N, K = case.name, case.m, case.n, case.k
            ref, ours = gemm_fns(case)
            cfg = default_config(M, N, K, num_sms, "accumulate" if case.accumulate else "store")
            calls = 1 if args.no_graph else calls_per_graph(2.0 * M * N * K)
            fns = [ref, ours] if args.no_graph else [graphed(ref, calls), graphed(ours, calls)]
            t_ref, t_ours = (t / calls for t in median_ms_held(fns, hold_s=args.hold_s,
                                                                rounds=args.rounds, warmup=2))
            row = dict(label=s.label, tokens=s.tokens, d=s.d, h=s.shard, act=s.act, gemm=name,
                       M=M, N=N, K=K, config=cfg.key, calls=calls, cublas_ms=t_ref, ours_ms=t_ours,
                       speed=t_ref / t_ours)
            rows.append(row)
            print(f"{s.label[:44]:44s} {name:22s} {M:6d} {N:6d} {K:6d} {cfg.key[:34]:34s} "
                  f"{t_ref:9.4f} {t_ours:9.4f} {t_ref / t_ours:11.3f}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                    hold_s=args.hold_s, rounds=args.rounds, graphed=not args.no_graph,
                    started=time.strftime("%Y-%m-%d %H:%M:%S"), argv=argv)
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
