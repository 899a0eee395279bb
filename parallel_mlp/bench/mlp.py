"""The ``mlp`` section: the whole MLP fwd+bwd at TP=1, ours (default and recompute modes, and
ParallelMLP on the torch backend) against a plain PyTorch module, eager, under
torch.utils.checkpoint (recompute mode's baseline) and torch.compile, with peak memory per
variant. ``bench_mlp`` measures one shape's variants and is shared with the sweep.
"""

from __future__ import annotations

import torch

from ..activations import get_activation
from .harness import (
    Ctx,
    attempt,
    free_memory,
    input_sets,
    nbytes,
    per_name,
    ratio,
    ratio_interval,
    time_with_tflops,
    unavailable,
)
from .models import (
    CheckpointedEagerMLP,
    EagerMLP,
    FusedParallelMLP,
    GemmCeiling,
    build_parallel_mlp,
    chunked_w1,
    cuda_graphed,
    config_label,
    fc1_features,
    mlp_flops,
    model_bytes,
    prepare_mlp_variant,
    train_step,
)

# torch.compile's first call can take tens of seconds: don't start one with less time than this.
COMPILE_RESERVE_S = 60.0

# Measured in the MLP section; torch.compile comes last, in a section of its own.
MLP_VARIANTS = ("eager", "ours", "ours_recompute", "eager_recompute", "torch_backend")


def mlp_builders(ctx: Ctx, act: str, h: int, w1: torch.Tensor, w2: torch.Tensor) -> dict:
    """Each variant's constructor, all holding the same weights so that they check each other."""
    gated = get_activation(act).gated

    def compiled():
        import torch._dynamo

        torch._dynamo.reset()
        # dynamic=False: each config is one fixed shape. Dynamo would otherwise mark dims dynamic
        # when it sees the second config's shapes and compile shape-generic, slower kernels.
        return torch.compile(EagerMLP(chunked_w1(w1, gated), w2.clone(), act), dynamic=False)

    def eager():
        return EagerMLP(chunked_w1(w1, gated), w2.clone(), act)

    def ours():
        return build_parallel_mlp(w1, w2, act, h, backend=ctx.backend)

    def graphed(build):
        sample = ctx.rand(ctx.tokens, ctx.d_model).requires_grad_(True)
        return cuda_graphed(build(), sample)

    return {
        "eager": eager,
        # eager again, timed beside the first: the spread of the timing itself at this shape
        "eager_copy": eager,
        "ours": ours,
        "eager_graphed": lambda: graphed(eager),
        "ours_graphed": lambda: graphed(ours),
        # The fused function at every size, as `auto` runs it above the small-step thresholds:
        # beside an `auto` ours that takes the small step.
        "ours_fused": lambda: build_parallel_mlp(w1, w2, act, h, cls=FusedParallelMLP,
                                                 backend=ctx.backend),
        "ours_recompute": lambda: build_parallel_mlp(w1, w2, act, h, backend=ctx.backend,
                                                     recompute=True),
        # eager at recompute's memory: x kept alone, the forward replayed in backward
        "eager_recompute": lambda: CheckpointedEagerMLP(chunked_w1(w1, gated), w2.clone(), act),
        "torch_backend": lambda: build_parallel_mlp(w1, w2, act, h, backend="torch"),
        # the fused function with every GEMM on our kernels, beside auto's (cuBLAS's plain
        # GEMMs where backends.cublas_runs)
        "ours_cute": lambda: build_parallel_mlp(w1, w2, act, h, cls=FusedParallelMLP,
                                                backend="cute"),
        "compile": compiled,
        # cuBLAS's six GEMMs of the step and nothing else: the bound of a fused MLP
        "gemm_ceiling": lambda: GemmCeiling(chunked_w1(w1, gated), w2.clone()),
    }


def bench_mlp(ctx: Ctx, act: str, h: int, names, extra: dict | None = None) -> dict:
    """The named variants of one config. Each in turn is built, called once (first-call time, and
    a check against the first variant's outputs, the reference) and measured for peak memory; then
    their timed steps run side by side (time_side_by_side: held, each at its own clock, by
    default). ``extra``: more variants, name -> build(w1, w2), given the same weights."""
    T, d = ctx.tokens, ctx.d_model
    f = fc1_features(act, h)
    gated = get_activation(act).gated
    flops = mlp_flops(T, d, act, h)
    # nn.Linear-like scale keeps activations O(1) through both layers.
    w1, w2 = ctx.rand(f, d, scale=d ** -0.5), ctx.rand(d, h, scale=h ** -0.5)
    n_sets = input_sets(ctx, nbytes(w1, w2) + 2 * T * d * ctx.dtype.itemsize)
    xs = [ctx.rand(T, d).requires_grad_(True) for _ in range(n_sets)]
    dys = [ctx.rand(T, d) for _ in range(n_sets)]
    builders = mlp_builders(ctx, act, h, w1, w2)
    builders |= {name: (lambda build=build: build(w1, w2)) for name, build in (extra or {}).items()}
    label = config_label(act, h)

    row = {"config": label, "activation": act, "hidden": h, "flops": flops, "variants": {}}
    models = {}  # the variants ready to time, kept alive until the interleaved timing
    reference = None
    for name in names:
        ctx.log(f"mlp {label} {name}")
        missing = unavailable(ctx, name)
        if missing:
            row["variants"][name] = missing
            continue
        reserve = COMPILE_RESERVE_S if name == "compile" else 0.0
        held = sum(model_bytes(m) for m in models.values())

        def prepare(build=builders[name], ref=reference, held=held):
            model = build()
            return (model, *prepare_mlp_variant(ctx, model, xs, dys, ref, held, gated))

        out = attempt(ctx, f"mlp {name}", prepare, min_time_s=reserve)
        if isinstance(out, tuple):
            models[name], out, reference = out
            if name.endswith("_graphed"):
                # A replay allocates nothing: its tensors live in the graph's pool, made at
                # capture, so the step's peak over its start reads 0 and says nothing.
                for key in ("peak_mem_gb", "peak_over_start_gb", "requested_peak_over_start_gb"):
                    out.pop(key, None)
        row["variants"][name] = out
        free_memory(ctx)

    if models:
        ctx.log(f"mlp {label} timing {', '.join(models)} side by side")
        steps = {name: (lambda i, model=model: train_step(model, xs[i], dys[i]))
                 for name, model in models.items()}
        timings = per_name(attempt(ctx, f"mlp {' vs '.join(models)}", time_with_tflops, ctx,
                                   steps, n_sets, flops), models)
        for name in models:
            row["variants"][name] |= timings[name]
    return finish_mlp_row(row)


def finish_mlp_row(row: dict) -> dict:
    """The ratios: every variant vs eager, recompute time / default time, and ours' recompute
    mode vs eager checkpointed (when timed). torch.compile is
    compared with eager's second run, the one timed interleaved with it, when that has a time."""
    v = row["variants"]
    for name, res in v.items():
        if isinstance(res, dict) and "ms" in res:
            base = v.get("eager")
            if name == "compile" and "ms" in v.get("eager_again", {}):
                base = v["eager_again"]
            res["speedup_vs_eager"] = ratio(base, res)
            res["speedup_vs_eager_interval"] = ratio_interval(base, res)
    row["recompute_ratio"] = ratio(v.get("ours_recompute"), v.get("ours"))
    if isinstance(v.get("ours_recompute"), dict) and "ms" in v["ours_recompute"]:
        # recompute mode against eager at the same memory (x kept alone)
        v["ours_recompute"]["speedup_vs_eager_recompute"] = ratio(v.get("eager_recompute"),
                                                                   v["ours_recompute"])
    return row


def empty_mlp_row(act: str, h: int, **variants) -> dict:
    return {"config": config_label(act, h), "activation": act, "hidden": h, "variants": variants}


def section_mlp(ctx: Ctx, results: dict) -> None:
    names = [n for n in MLP_VARIANTS if not (n == "torch_backend" and ctx.backend == "torch")]
    rows = results.setdefault("mlp", [])
    for act, h in ctx.configs:
        out = attempt(ctx, f"mlp {config_label(act, h)}", bench_mlp, ctx, act, h, names)
        rows.append(out if "variants" in out else empty_mlp_row(act, h, setup=out))
        ctx.checkpoint()
        free_memory(ctx)


def section_compile(ctx: Ctx, results: dict) -> None:
    """torch.compile last: its first call takes tens of seconds, so everything else is measured
    first and compile runs while the budget lasts. Eager runs again beside it, kept as its own row
    ("eager (again)") although the MLP section already timed eager: it is compile's correctness
    reference, and, timed interleaved with compile, the same-clock base of compile's speedup. Its
    time next to the first eager's also shows how far the clocks moved between the sections."""
    rows = results.setdefault("mlp", [])
    by_config = {r["config"]: r for r in rows}
    for act, h in ctx.configs:
        row = by_config.get(config_label(act, h))
        if row is None:  # the MLP section failed before this config: compile still gets a row
            row = empty_mlp_row(act, h)
            rows.append(row)
        if ctx.time_left() < COMPILE_RESERVE_S:
            row["variants"]["compile"] = {
                "skipped": f"over the time budget ({ctx.time_left():.0f} s left)"}
            continue
        out = attempt(ctx, f"compile {config_label(act, h)}", bench_mlp, ctx, act, h,
                      ["eager", "compile"])
        if "variants" in out:
            row["variants"]["eager_again"] = out["variants"]["eager"]
            row["variants"]["compile"] = out["variants"]["compile"]
        else:
            row["variants"]["compile"] = out
        finish_mlp_row(row)
        ctx.checkpoint()
        free_memory(ctx)
