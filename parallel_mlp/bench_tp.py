"""TP mode of the benchmark: the whole MLP fwd+bwd at TP = world size, ours vs Megatron-style eager.

    torchrun --nproc-per-node 2 -m parallel_mlp.bench --tp [--configs swiglu:14336] [--json tp.json]

Each rank holds its shards of the same global weights; ``--configs`` hidden sizes are global. The
reference is what Megatron's ColumnParallelLinear -> activation -> RowParallelLinear does, written
in torch: shard GEMMs through cuBLAS, an all-reduce of fc2's output in forward and of x's gradient
in backward. Times are each rank's median, maxed over ranks; TFLOP/s are per rank (FLOPs / p).
NCCL on CUDA, gloo on the CPU (so ``--tp --dry-run`` runs anywhere).
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from . import bench_report
from .activations import get_activation
from .bench import (
    attempt,
    bench_mlp_variant,
    build_parallel_mlp,
    chunked_w1,
    config_label,
    eager_activation,
    fc1_features,
    free_memory,
    log,
    make_ctx,
    mlp_flops,
    probe_ours,
    ratio,
    run_metadata,
)

# A rank that fails inside a collective would leave the others waiting forever: time out instead.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=180)


class _CopyToTP(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, y, group):
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class MegatronEagerMLP(nn.Module):
    """fc1 column-parallel -> activation (torch ops) -> fc2 row-parallel, on this rank's shards."""

    def __init__(self, w1_shard, w2_shard, activation: str, group=None):
        super().__init__()
        self.w1 = nn.Parameter(w1_shard)
        self.w2 = nn.Parameter(w2_shard)
        self.act = eager_activation(activation)
        self.group = group

    def forward(self, x):
        x = _CopyToTP.apply(x, self.group)
        y = self.act(x @ self.w1.t()) @ self.w2.t()
        return _ReduceFromTP.apply(y, self.group)


def max_over_ranks(ctx, result: dict) -> dict:
    """Every rank calls this once per measurement, failed or not, so the collective always
    matches; the slowest rank's median is the step time of the group."""
    mine = torch.tensor([result["ms"] if isinstance(result, dict) and "ms" in result else -1.0],
                        dtype=torch.float64, device=ctx.device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if isinstance(result, dict) and "ms" in result:
        result["rank_ms"] = result["ms"]
        result["ms"] = mine.item()
    return result


def bench_tp_config(ctx, act: str, h: int, world: int, rank: int) -> dict:
    """ParallelMLP vs MegatronEagerMLP on this rank's shards of one set of global weights."""
    T, d, gated = ctx.tokens, ctx.d_model, get_activation(act).gated
    f = fc1_features(act, h)
    # The same seed on every rank: the same global weights and the same (replicated) x and dy.
    torch.manual_seed(1234)
    w1, w2 = ctx.rand(f, d, scale=d ** -0.5), ctx.rand(d, h, scale=h ** -0.5)
    xs = [ctx.rand(T, d).requires_grad_(True)]
    dys = [ctx.rand(T, d)]
    # Rank r holds rows [r*F/p, (r+1)*F/p) of the interleaved W1 and columns [r*h/p, ...) of W2.
    w1_shard = w1.chunk(world, dim=0)[rank].contiguous()
    w2_shard = w2.chunk(world, dim=1)[rank].contiguous()
    del w1, w2
    flops_per_rank = mlp_flops(T, d, act, h) / world

    variants = {
        "megatron_eager": lambda: MegatronEagerMLP(chunked_w1(w1_shard, gated), w2_shard.clone(),
                                                   act),
        "ours": lambda: build_parallel_mlp(w1_shard, w2_shard, act, h, backend=ctx.backend),
    }
    row = {"config": config_label(act, h), "world_size": world, "flops_per_rank": flops_per_rank,
           "variants": {}}
    reference = None
    for name, build in variants.items():
        if rank == 0:
            log(f"tp {world} {config_label(act, h)} {name}")
        if name == "ours" and ctx.ours is None:
            row["variants"][name] = {"unavailable": ctx.ours_reason}
            max_over_ranks(ctx, row["variants"][name])
            continue
        out = attempt(ctx, f"tp {name}", lambda build=build, ref=reference: bench_mlp_variant(
            ctx, build(), xs, dys, flops_per_rank, ref))
        if isinstance(out, tuple):
            out, reference = out
        out = max_over_ranks(ctx, out)
        if "ms" in out:
            out["tflops_per_rank"] = flops_per_rank / (out["ms"] * 1e-3) / 1e12
            out["tflops"] = out["tflops_per_rank"]
        row["variants"][name] = out
        free_memory(ctx)
    row["speedup_vs_eager"] = ratio(row["variants"].get("megatron_eager"),
                                    row["variants"].get("ours"))
    return row


def format_tp(results: dict) -> str:
    notes = bench_report.Notes()
    meta = results["meta"]
    rows = []
    for r in results["tp"]:
        for name, m in r.get("variants", {}).items():
            err = "-"
            if isinstance(m, dict) and "rel_err_y" in m:
                err = f"{bench_report.num(m['rel_err_y'], 2)}/{bench_report.num(m['rel_err_dx'], 2)}"
            speedup = bench_report.num(r.get("speedup_vs_eager")) if name == "ours" else ""
            rows.append([r["config"], name, notes.cell(m), notes.cell(m, "tflops_per_rank"),
                         notes.cell(m, "peak_mem_gb"), err, speedup])
    header = ["config (global h)", "variant", "ms (max rank)", "TF/s per rank", "peak GB",
              "err y/dx", "x eager"]
    lines = [f"parallel_mlp.bench --tp  TP={meta['world_size']}  {meta['device']}  "
             f"torch {meta['torch']}  {meta['dtype']}  T={meta['tokens']} d={meta['d_model']}  "
             f"ours={meta['backend']}" + ("  [DRY RUN]" if meta.get("dry_run") else "")]
    if meta.get("ours_unavailable"):
        lines.append(f"ours cannot run here: {meta['ours_unavailable'][:300]}")
    lines += bench_report._table(header, rows)
    if notes.messages:
        lines += ["Errors and skips"] + notes.lines()
    return "\n".join(lines)


def init_distributed() -> tuple[torch.device, int, int]:
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    return device, dist.get_world_size(), dist.get_rank()


def main(args) -> int:
    if "RANK" not in os.environ and not dist.is_initialized():
        log("--tp runs under torchrun: torchrun --nproc-per-node 2 -m parallel_mlp.bench --tp")
        return 2
    start = time.monotonic()
    device, world, rank = init_distributed()
    ctx = make_ctx(args, device, start)
    # No time budget here: a rank skipping a row the others run would desynchronize collectives.
    ctx.deadline = float("inf")
    # Nor held timing: each rank would stop its hold after its own number of steps, and the
    # collectives in them would no longer pair up. Call by call, every rank runs ctx.iters steps.
    ctx.hold_s = 0.0
    probe_ours(ctx)
    results = {"meta": run_metadata(args, ctx) | {"world_size": world, "mode": "tp"}, "tp": []}
    for act, h in ctx.configs:
        if h % world:
            results["tp"].append({"config": config_label(act, h), "variants": {"setup": {
                "error": f"hidden {h} is not divisible by the TP size {world}"}}})
            continue
        results["tp"].append(bench_tp_config(ctx, act, h, world, rank))
    results["meta"]["wall_s"] = time.monotonic() - start
    if rank == 0:
        bench_report.write_json(results, args.json)
        log(f"wrote {args.json}")
        print(format_tp(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0
