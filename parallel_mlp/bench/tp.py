"""The TP benchmark: the whole MLP fwd+bwd at TP = world size, ours (with and without
tp_comm_overlap) vs Megatron-style eager, and PyTorch's async TP where it runs.

    torchrun --nproc-per-node 2 -m parallel_mlp.bench tp [--configs swiglu:14336] [--json tp.json]
    torchrun --nproc-per-node 2 -m parallel_mlp.bench tp --sequence-parallel

Each rank holds its shards of the same global weights; ``--configs`` hidden sizes are global. The
reference is what Megatron's ColumnParallelLinear -> activation -> RowParallelLinear does, written
in torch: shard GEMMs through cuBLAS, an all-reduce of fc2's output in forward and of x's gradient
in backward; with ``--sequence-parallel``, an all-gather of x before fc1 and a reduce-scatter of
fc2's output (their backwards: a reduce-scatter of dx, an all-gather of dy). PyTorch's async TP
(torch.compile's micro-pipeline TP pass over functional collectives, as torchtitan applies it)
runs in the sequence-parallel mode on NCCL, where symmetric memory is available; elsewhere its
row says why not. Before the rows, the ranks time an all-gather and an all-reduce of one
activation ([T, d]) to state the link's bandwidth, the input of ``bench tp-model``. Both run side by side, held (1 s turns, 3 each, as the single-GPU bench; a turn is a
fixed step count agreed by the ranks so their collectives pair up) or call by call with --hold-s 0.
Times are each rank's median, maxed over ranks; TFLOP/s are per rank (FLOPs / p).
NCCL on CUDA, gloo on the CPU (so ``tp --dry-run`` runs anywhere).
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from ..activations import get_activation
from ..tp import all_gather_rows, reduce_scatter_rows, resolve_group
from . import report, suite
from .harness import (
    attempt,
    free_memory,
    log,
    per_name,
    probe_ours,
    ratio,
    time_side_by_side,
)
from .models import (
    build_parallel_mlp,
    chunked_w1,
    config_label,
    eager_activation,
    fc1_features,
    mlp_flops,
    model_bytes,
    prepare_mlp_variant,
    train_step,
)
from .timing import hold_steps, settled

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


def _sequence_region(forward, backward, doc: str):
    """An autograd function applying ``forward`` over the TP group, ``backward`` to its grad."""

    class Region(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, group):
            ctx.tp = resolve_group(group)
            return forward(t, ctx.tp)

        @staticmethod
        def backward(ctx, grad):
            return backward(grad, ctx.tp), None

    Region.__doc__ = doc
    return Region


_GatherRows = _sequence_region(all_gather_rows, reduce_scatter_rows,
                               "Megatron's gather_from_sequence_parallel_region")
_ScatterRows = _sequence_region(reduce_scatter_rows, all_gather_rows,
                                "Megatron's reduce_scatter_to_sequence_parallel_region")


class MegatronEagerMLP(nn.Module):
    """fc1 column-parallel -> activation (torch ops) -> fc2 row-parallel, on this rank's shards."""

    def __init__(self, w1_shard, w2_shard, activation: str, group=None, sequence_parallel=False):
        super().__init__()
        self.w1 = nn.Parameter(w1_shard)
        self.w2 = nn.Parameter(w2_shard)
        self.act = eager_activation(activation)
        self.group = group
        self.sequence_parallel = sequence_parallel

    def forward(self, x):
        if self.sequence_parallel:
            x = _GatherRows.apply(x, self.group)
        else:
            x = _CopyToTP.apply(x, self.group)
        y = self.act(x @ self.w1.t()) @ self.w2.t()
        if self.sequence_parallel:
            return _ScatterRows.apply(y, self.group)
        return _ReduceFromTP.apply(y, self.group)


class AsyncTPMLP(nn.Module):
    """PyTorch's async TP: the sequence-parallel MLP written with functional collectives and
    compiled with inductor's micro-pipeline TP pass, which rewrites all-gather + matmul and
    matmul + reduce-scatter into symmetric-memory fused ops (torchtitan's recipe). CUDA and
    NCCL only; NVLink multicast stays as the environment has it."""

    def __init__(self, w1_shard, w2_shard, activation: str, group):
        super().__init__()
        import torch._inductor.config as inductor_config
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        inductor_config._micro_pipeline_tp = True
        enable_symm_mem_for_group(group.group_name)
        self.w1 = nn.Parameter(w1_shard)
        self.w2 = nn.Parameter(w2_shard)
        self.act = eager_activation(activation)
        self.group = group
        self.step = torch.compile(self._forward)

    def _forward(self, x):
        import torch.distributed._functional_collectives as fc

        x = fc.all_gather_tensor(x, 0, self.group)
        y = self.act(x @ self.w1.t()) @ self.w2.t()
        return fc.reduce_scatter_tensor(y, "sum", 0, self.group)

    def forward(self, x):
        return self.step(x)


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


def group_max(ctx, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def all_ranks_ok(ctx, ok: bool) -> bool:
    """A variant that failed on one rank is dropped on all, so their collectives stay paired."""
    t = torch.tensor([1 if ok else 0], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


# Calls per variant that size a held turn: their median, maxed over ranks, sets the step count.
PROBE_STEPS = 5


def time_tp_held(ctx, fns: dict, n_sets: int) -> dict:
    """Held timing (harness.time_held) that keeps the ranks in step: a turn is a fixed number of
    steps, the same on every rank (enough for ctx.hold_s at the slowest rank's probed step time),
    so the collectives inside them pair up. A turn's time is the median of its settled steps,
    maxed over ranks; a variant's ``ms`` is the median of its turns."""
    for i in range(ctx.warmup):
        for fn in fns.values():
            fn(i % n_sets)
    ctx.sync()
    steps = {}
    for name, fn in fns.items():
        probe = statistics.median(hold_steps(lambda i, fn=fn: fn(i % n_sets), PROBE_STEPS, ctx.cuda))
        steps[name] = max(PROBE_STEPS, math.ceil(ctx.hold_s * 1e3 / group_max(ctx, probe)))
    turns = {name: [] for name in fns}
    for _ in range(ctx.rounds):
        for name, fn in fns.items():
            kept = settled(hold_steps(lambda i, fn=fn: fn(i % n_sets), steps[name], ctx.cuda))
            turns[name].append(group_max(ctx, statistics.median(kept)))
    return {name: {"ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                   "iters": ctx.rounds * len(settled([0.0] * steps[name])), "input_sets": n_sets,
                   "hold_s": ctx.hold_s, "rounds": ctx.rounds, "steps_per_turn": steps[name]}
            for name, t in turns.items()}


def bench_tp_config(ctx, act: str, h: int, world: int, rank: int) -> dict:
    """ParallelMLP vs MegatronEagerMLP on this rank's shards of one set of global weights: each
    is built, called once (checked against eager's outputs) and measured for peak memory, then
    both are timed side by side, held (time_tp_held) or call by call (--hold-s 0)."""
    T, d, gated = ctx.tokens, ctx.d_model, get_activation(act).gated
    sp = ctx.sequence_parallel
    f = fc1_features(act, h)
    # The same seed on every rank: the same global weights and the same x and dy (replicated, or
    # with sequence parallelism each rank's block of their rows).
    torch.manual_seed(1234)
    w1, w2 = ctx.rand(f, d, scale=d ** -0.5), ctx.rand(d, h, scale=h ** -0.5)
    x, dy = ctx.rand(T, d), ctx.rand(T, d)
    if sp:
        x, dy = x.chunk(world)[rank].contiguous(), dy.chunk(world)[rank].contiguous()
    xs, dys = [x.requires_grad_(True)], [dy]
    # Rank r holds rows [r*F/p, (r+1)*F/p) of the interleaved W1 and columns [r*h/p, ...) of W2.
    w1_shard = w1.chunk(world, dim=0)[rank].contiguous()
    w2_shard = w2.chunk(world, dim=1)[rank].contiguous()
    del w1, w2
    flops_per_rank = mlp_flops(T, d, act, h) / world

    def ours(**kw):
        return build_parallel_mlp(w1_shard, w2_shard, act, h, backend=ctx.backend,
                                  sequence_parallel=sp, **kw)

    variants = {
        "megatron_eager": lambda: MegatronEagerMLP(chunked_w1(w1_shard, gated), w2_shard.clone(),
                                                   act, sequence_parallel=sp),
        "ours": ours,
        "ours_overlap": lambda: ours(tp_comm_overlap=True),
        "torch_async_tp": lambda: AsyncTPMLP(chunked_w1(w1_shard, gated), w2_shard.clone(), act,
                                             dist.group.WORLD),
    }
    row = {"config": config_label(act, h), "world_size": world, "flops_per_rank": flops_per_rank,
           "sequence_parallel": sp, "variants": {}}
    models, reference = {}, None
    for name, build in variants.items():
        if rank == 0:
            log(f"tp {world} {config_label(act, h)} {name}")
        if name.startswith("ours") and ctx.ours is None:
            row["variants"][name] = {"unavailable": ctx.ours_reason}
            continue
        if name == "torch_async_tp" and (not sp or ctx.device.type != "cuda"):
            row["variants"][name] = {"unavailable": "PyTorch's async TP is the sequence-parallel "
                                     "mode on CUDA with NCCL (symmetric memory)"}
            continue
        held = sum(model_bytes(m) for m in models.values())

        def prepare(build=build, ref=reference, held=held):
            model = build()
            return (model, *prepare_mlp_variant(ctx, model, xs, dys, ref, held))

        out = attempt(ctx, f"tp {name}", prepare)
        if all_ranks_ok(ctx, isinstance(out, tuple)):
            models[name], out, reference = out
        elif isinstance(out, tuple):
            out = {"error": "failed on another rank"}
        row["variants"][name] = out
        free_memory(ctx)

    if models:
        steps = {name: (lambda i, model=model: train_step(model, xs[i], dys[i]))
                 for name, model in models.items()}
        if ctx.hold_s > 0:
            timings = per_name(attempt(ctx, "tp timing", time_tp_held, ctx, steps, len(xs)), models)
        else:
            timings = per_name(attempt(ctx, "tp timing", time_side_by_side, ctx, steps, len(xs)),
                               models)
            timings = {name: max_over_ranks(ctx, t) for name, t in timings.items()}
        for name in models:
            out = row["variants"][name] | timings[name]
            if "ms" in out:
                out["tflops_per_rank"] = flops_per_rank / (out["ms"] * 1e-3) / 1e12
                out["tflops"] = out["tflops_per_rank"]
            row["variants"][name] = out
    row["speedup_vs_eager"] = ratio(row["variants"].get("megatron_eager"),
                                    row["variants"].get("ours"))
    row["overlap_speedup_vs_eager"] = ratio(row["variants"].get("megatron_eager"),
                                            row["variants"].get("ours_overlap"))
    return row


def link_bandwidth(ctx, world: int) -> dict:
    """The group's collective bandwidth on one activation-sized tensor ([T, d] at the bench's
    dtype): an all-gather of each rank's 1/p of it and an all-reduce of all of it, timed after
    warm-up (median of 10, the slowest rank's). Bus bandwidth, as NCCL's tests state it: the bytes
    each rank sends, (p-1)/p of the tensor for the gather and 2(p-1)/p for the all-reduce, over
    the time."""
    full = ctx.rand(ctx.tokens, ctx.d_model)
    size = full.numel() * full.element_size()
    tp = resolve_group(None)
    local = full.chunk(world)[0].contiguous()
    out = {"bytes": size}
    for name, run, factor in (("all_gather", lambda: all_gather_rows(local, tp), (world - 1) / world),
                              ("all_reduce", lambda: dist.all_reduce(full), 2 * (world - 1) / world)):
        for _ in range(3):
            run()
        times = []
        for _ in range(10):
            ctx.sync()
            start = time.perf_counter()
            run()
            ctx.sync()
            times.append(time.perf_counter() - start)
        seconds = group_max(ctx, statistics.median(times))
        out[f"{name}_ms"] = seconds * 1e3
        out[f"{name}_busbw_gbs"] = factor * size / seconds / 1e9
    return out


def format_tp(results: dict) -> str:
    notes = report.Notes()
    meta = results["meta"]
    rows = []
    for r in results["tp"]:
        for name, m in r.get("variants", {}).items():
            err = "-"
            if isinstance(m, dict) and "rel_err_y" in m:
                err = f"{report.num(m['rel_err_y'], 2)}/{report.num(m['rel_err_dx'], 2)}"
            key = {"ours": "speedup_vs_eager", "ours_overlap": "overlap_speedup_vs_eager"}.get(name)
            speedup = report.num(r.get(key)) if key else ""
            rows.append([r["config"], name, notes.cell(m), notes.cell(m, "tflops_per_rank"),
                         notes.cell(m, "peak_mem_gb"), err, speedup])
    header = ["config (global h)", "variant", "ms (max rank)", "TF/s per rank", "peak GB",
              "err y/dx", "x eager"]
    mode = "sequence parallel" if meta.get("sequence_parallel") else "replicated (all-reduce)"
    lines = [f"parallel_mlp.bench tp  TP={meta['world_size']}  {mode}  {meta['device']}  "
             f"torch {meta['torch']}  {meta['dtype']}  T={meta['tokens']} d={meta['d_model']}  "
             f"ours={meta['backend']}" + ("  [DRY RUN]" if meta.get("dry_run") else "")]
    link = meta.get("link")
    if link:
        lines.append(f"link: all-gather of [T, d] {link['all_gather_ms']:.3f} ms "
                     f"({link['all_gather_busbw_gbs']:.0f} GB/s bus), all-reduce "
                     f"{link['all_reduce_ms']:.3f} ms ({link['all_reduce_busbw_gbs']:.0f} GB/s bus)")
    hold_s = meta.get("hold_s") or 0
    lines.append(f"timing: held, {hold_s:g} s turns of a step count the ranks agree on, "
                 f"{meta.get('rounds')} each" if hold_s > 0 else
                 "timing: call by call, in turn (one shared clock: compares cycles)")
    if meta.get("ours_unavailable"):
        lines.append(f"ours cannot run here: {meta['ours_unavailable'][:300]}")
    lines += report.table(header, rows)
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


def main(argv=None) -> int:
    args = suite.apply_defaults(suite.parse_args(argv, "tp"))
    if "RANK" not in os.environ and not dist.is_initialized():
        log("tp runs under torchrun: torchrun --nproc-per-node 2 -m parallel_mlp.bench tp")
        return 2
    start = time.monotonic()
    device, world, rank = init_distributed()
    ctx = suite.make_ctx(args, device, start)
    # No time budget here: a rank skipping a row the others run would desynchronize collectives.
    ctx.deadline = float("inf")
    ctx.sequence_parallel = bool(args.sequence_parallel)
    probe_ours(ctx)
    results = {"meta": suite.run_metadata(args, ctx) | {
        "world_size": world, "mode": "tp", "sequence_parallel": ctx.sequence_parallel,
        "link": link_bandwidth(ctx, world)}, "tp": []}
    for act, h in ctx.configs:
        if h % world or (ctx.sequence_parallel and ctx.tokens % world):
            results["tp"].append({"config": config_label(act, h), "variants": {"setup": {
                "error": f"hidden {h} (or, with sequence parallelism, T={ctx.tokens}) is not "
                         f"divisible by the TP size {world}"}}})
            continue
        results["tp"].append(bench_tp_config(ctx, act, h, world, rank))
    results["meta"]["wall_s"] = time.monotonic() - start
    if rank == 0:
        report.write_json(results, args.json)
        log(f"wrote {args.json}")
        print(format_tp(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0
