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


def gemm_cases(T, d, h, act, dtype=torch.bfloat16, scale=0.02):
    """(name, M, N, K, cuBLAS fn, ours fn) for the step's plain GEMMs at one shape; ours as the
    layer calls it (operands checked once beforehand, ``checked=True``)."""
    from parallel_mlp.activations import get_activation
    from parallel_mlp.kernels import ops

    F = 2 * h if get_activation(act).gated else h
    r = lambda *s: torch.randn(*s, device="cuda", dtype=dtype) * scale  # noqa: E731
    x, w1, w2, post, dy, dpre = r(T, d), r(F, d), r(d, h), r(T, h), r(T, d), r(T, F)
    mg1, mg2 = torch.zeros(F, d, device="cuda"), torch.zeros(d, h, device="cuda")

    def addmm(a, b, out):
        return torch.addmm(out, a, b, out_dtype=torch.float32, out=out)

    return [
        ("fc2", T, d, h, lambda: post @ w2.t(), lambda: ops.gemm(post, w2.t(), checked=True)),
        ("dx", T, d, F, lambda: dpre @ w1, lambda: ops.gemm(dpre, w1, checked=True)),
        ("dW2", d, h, T, lambda: dy.t() @ post, lambda: ops.gemm(dy.t(), post, checked=True)),
        ("dW1", F, d, T, lambda: dpre.t() @ x, lambda: ops.gemm(dpre.t(), x, checked=True)),
        ("dW2+=", d, h, T, lambda: addmm(dy.t(), post, mg2),
         lambda: ops.gemm(dy.t(), post, out=mg2, accumulate=True, checked=True)),
        ("dW1+=", F, d, T, lambda: addmm(dpre.t(), x, mg1),
         lambda: ops.gemm(dpre.t(), x, out=mg1, accumulate=True, checked=True)),
    ]


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
    print(f"{'shape':44s} {'gemm':6s} {'M':>6s} {'N':>6s} {'K':>6s} {'config':34s} "
          f"{'cuBLAS ms':>9s} {'ours ms':>9s} {'ours/cuBLAS':>11s}", flush=True)
    for s in shapes:
        for name, M, N, K, ref, ours in gemm_cases(s.tokens, s.d, s.shard, s.act):
            kind = "accumulate" if name.endswith("+=") else "store"
            cfg = default_config(M, N, K, num_sms, kind)
            calls = 1 if args.no_graph else calls_per_graph(2.0 * M * N * K)
            fns = [ref, ours] if args.no_graph else [graphed(ref, calls), graphed(ours, calls)]
            t_ref, t_ours = (t / calls for t in median_ms_held(fns, hold_s=args.hold_s,
                                                                rounds=args.rounds, warmup=2))
            row = dict(label=s.label, tokens=s.tokens, d=s.d, h=s.shard, act=s.act, gemm=name,
                       M=M, N=N, K=K, config=cfg.key, calls=calls, cublas_ms=t_ref, ours_ms=t_ours,
                       speed=t_ref / t_ours)
            rows.append(row)
            print(f"{s.label[:44]:44s} {name:6s} {M:6d} {N:6d} {K:6d} {cfg.key[:34]:34s} "
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
