"""The ``gemm`` section: the MLP's GEMMs, ours against cuBLAS (``torch.mm``) with the operand
layouts the layer really uses (plus the wgrads accumulated into an fp32 main grad); then the fused
``gemm_act`` and ``gemm_dact`` against a plain cuBLAS GEMM of the same shape and against eager
torch (GEMM + activation)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backends import TorchBackend, fp32_addmm_works
from .harness import (
    Ctx,
    attempt,
    free_memory,
    input_sets,
    log,
    nbytes,
    ours_or_reason,
    per_name,
    ratio,
    rel_err,
    time_calls,
    time_with_tflops,
    with_tflops,
)
from .models import config_label, eager_activation, fc1_features


@dataclass(frozen=True)
class GemmCase:
    """out [M, N] (+)= a [M, K] @ b [K, N]; ``a_t`` / ``b_t``: the operand is a transposed view."""

    name: str
    m: int
    n: int
    k: int
    a_t: bool
    b_t: bool
    accumulate: bool = False


def mlp_gemm_cases(tokens: int, d: int, act: str, h: int) -> list[GemmCase]:
    """The GEMMs autograd.py issues, with its layouts: weights are [out, in] row-major, so the
    forward reads W.T views, and the wgrads read activations.T views."""
    T, f = tokens, fc1_features(act, h)
    return [
        GemmCase("fc1 fwd   x @ W1.T", T, f, d, False, True),
        GemmCase("fc2 fwd   post @ W2.T", T, d, h, False, True),
        GemmCase("fc2 dgrad dy @ W2", T, h, d, False, False),
        GemmCase("fc1 dgrad dpre @ W1", T, d, f, False, False),
        GemmCase("fc2 wgrad dy.T @ post", d, h, T, True, False),
        GemmCase("fc1 wgrad dpre.T @ x", f, d, T, True, False),
        GemmCase("fc2 wgrad +=fp32 main", d, h, T, True, False, accumulate=True),
        GemmCase("fc1 wgrad +=fp32 main", f, d, T, True, False, accumulate=True),
    ]


def make_operand(ctx: Ctx, rows: int, cols: int, transposed: bool) -> torch.Tensor:
    """A [rows, cols] operand; when ``transposed``, a .t() view of a contiguous [cols, rows]."""
    if transposed:
        return ctx.rand(cols, rows).t()
    return ctx.rand(rows, cols)


def cublas_accumulate_fn(ctx: Ctx):
    """How cuBLAS accumulates into an fp32 main grad from torch, which is what the torch backend
    does: one addmm with beta=1 and an fp32 output where this torch has it (as Megatron/TE do),
    else mm-then-add (backends.fp32_addmm_works)."""

    def accumulate(a, b, out):
        return TorchBackend.gemm(a, b, out=out, accumulate=True)

    if fp32_addmm_works(ctx.device, ctx.dtype):
        return "addmm(beta=1, out_dtype=fp32)", accumulate
    return "mm(out_dtype=fp32) + add_", accumulate


def bench_gemm(ctx: Ctx, case: GemmCase, accumulate_fn) -> dict:
    set_bytes = ctx.dtype.itemsize * (case.m * case.k + case.k * case.n + case.m * case.n)
    n_sets = input_sets(ctx, set_bytes)
    sets = [(make_operand(ctx, case.m, case.k, case.a_t), make_operand(ctx, case.k, case.n, case.b_t))
            for _ in range(n_sets)]
    flops = 2.0 * case.m * case.n * case.k
    main_grad = torch.randn(case.m, case.n, device=ctx.device, dtype=torch.float32)

    def cublas(i):
        if case.accumulate:
            return accumulate_fn(*sets[i], main_grad)
        return torch.mm(*sets[i])

    def ours(i):
        if case.accumulate:
            return ctx.ours.gemm(*sets[i], out=main_grad, accumulate=True)
        return ctx.ours.gemm(*sets[i])

    # cuBLAS and ours call by call, so that their ratio compares kernels at the same clocks; when
    # ours cannot run, cuBLAS alone.
    fns = {"cublas": cublas}
    if ctx.ours is not None:
        fns["ours"] = ours
    row = per_name(attempt(ctx, f"{' vs '.join(fns)} {case.name}", time_with_tflops, ctx, fns,
                           n_sets, flops), fns)
    row["ours"] = ours_or_reason(ctx) or row["ours"]
    if ctx.ours is not None:
        row["rel_err"] = attempt(ctx, f"check {case.name}", check_gemm, ctx, case, sets[0],
                                 accumulate_fn)
    return row


def check_gemm(ctx: Ctx, case: GemmCase, operands, accumulate_fn) -> float:
    a, b = operands
    if not case.accumulate:
        return rel_err(ctx.ours.gemm(a, b), torch.mm(a, b))
    base = torch.randn(case.m, case.n, device=ctx.device, dtype=torch.float32)
    ours, ref = base.clone(), base.clone()
    ctx.ours.gemm(a, b, out=ours, accumulate=True)
    accumulate_fn(a, b, ref)
    return rel_err(ours - base, ref - base)  # the added product, not the (random) base


def section_gemms(ctx: Ctx, results: dict) -> None:
    name, accumulate_fn = cublas_accumulate_fn(ctx)
    results["meta"]["cublas_accumulate"] = name
    rows = results.setdefault("gemms", [])
    for act, h in ctx.configs:
        for case in mlp_gemm_cases(ctx.tokens, ctx.d_model, act, h):
            log(f"gemm {config_label(act, h)} {case.name}")
            row = {"config": config_label(act, h), "name": case.name, "m": case.m, "n": case.n,
                   "k": case.k, "a_transposed": case.a_t, "b_transposed": case.b_t,
                   "accumulate_fp32": case.accumulate}
            row |= attempt(ctx, case.name, bench_gemm, ctx, case, accumulate_fn)
            row["ratio"] = ratio(row.get("cublas"), row.get("ours"))  # ours / cuBLAS throughput
            rows.append(row)
            ctx.checkpoint()
            free_memory(ctx)


# ---- fused GEMM + activation -----------------------------------------------------------------


def eager_dact(dy, w2, preact, act_fn):
    """What eager torch runs for gemm_dact's outputs: the dgrad GEMM, then the activation
    recomputed and differentiated by autograd (separate elementwise kernels)."""
    dpost = dy @ w2
    with torch.enable_grad():
        pre = preact.detach().requires_grad_(True)
        post = act_fn(pre)
    (dpre,) = torch.autograd.grad(post, pre, dpost)
    return dpre, post.detach()


def fused_ops(ctx: Ctx, act: str, h: int) -> dict:
    """For each fused op, as functions of an input set ``s``: its FLOPs, ours, the plain cuBLAS GEMM of the same
    shape, eager torch, and the pairs of outputs (ours, reference) its check compares."""
    T, d, f = ctx.tokens, ctx.d_model, fc1_features(act, h)
    act_fn = eager_activation(act)
    ref = TorchBackend  # the correctness reference: the same interleaved layout as ours
    return {
        "gemm_act": dict(
            flops=2.0 * T * f * d,
            ours=lambda s: ctx.ours.gemm_act(s["x"], s["w1"].t(), act),
            cublas=lambda s: torch.mm(s["x"], s["w1"].t()),
            eager=lambda s: act_fn(s["x"] @ s["w1"].t()),
            reference=lambda s: ref.gemm_act(s["x"], s["w1"].t(), act)),
        "gemm_act no-preact": dict(
            flops=2.0 * T * f * d,
            ours=lambda s: ctx.ours.gemm_act(s["x"], s["w1"].t(), act, store_preact=False),
            cublas=lambda s: torch.mm(s["x"], s["w1"].t()),
            eager=lambda s: act_fn(s["x"] @ s["w1"].t()),
            reference=lambda s: (None, ref.gemm_act(s["x"], s["w1"].t(), act)[1])),
        "gemm_dact": dict(
            flops=2.0 * T * h * d,
            ours=lambda s: ctx.ours.gemm_dact(s["dy"], s["w2"], s["preact"], act),
            cublas=lambda s: torch.mm(s["dy"], s["w2"]),
            eager=lambda s: eager_dact(s["dy"], s["w2"], s["preact"], act_fn),
            reference=lambda s: ref.gemm_dact(s["dy"], s["w2"], s["preact"], act)),
    }


def check_outputs(ours: tuple, reference: tuple) -> float:
    """The worst relative error over an op's outputs (None entries: not produced)."""
    return max(rel_err(o, r) for o, r in zip(ours, reference) if r is not None)


def fused_input_set(ctx: Ctx, act: str, h: int) -> dict:
    T, d, f = ctx.tokens, ctx.d_model, fc1_features(act, h)
    s = dict(x=ctx.rand(T, d), w1=ctx.rand(f, d, scale=d ** -0.5),
             dy=ctx.rand(T, d), w2=ctx.rand(d, h, scale=d ** -0.5))
    s["preact"] = s["x"] @ s["w1"].t()
    return s


def bench_fused(ctx: Ctx, act: str, h: int) -> list[dict]:
    """gemm_act (with and without storing preact) and gemm_dact at the MLP's shapes."""
    first = fused_input_set(ctx, act, h)
    n_sets = input_sets(ctx, nbytes(*first.values()))
    sets = [first] + [fused_input_set(ctx, act, h) for _ in range(n_sets - 1)]

    def on_sets(fn):
        return lambda i: fn(sets[i])

    rows = []
    for op, spec in fused_ops(ctx, act, h).items():
        log(f"fused {config_label(act, h)} {op}")
        flops = spec["flops"]
        # The plain cuBLAS GEMM and ours side by side for the ratio the target is on. Eager is
        # timed on its own: called in turn, its elementwise kernels, which draw less power,
        # would raise the clock for whichever call came next.
        fns = {"cublas": on_sets(spec["cublas"])}
        if ctx.ours is not None:
            fns["ours"] = on_sets(spec["ours"])
        pair = per_name(attempt(ctx, f"{' vs '.join(fns)} {op}", time_with_tflops, ctx, fns,
                                n_sets, flops), fns)
        row = {"config": config_label(act, h), "op": op, "cublas": pair["cublas"]}
        eager = on_sets(spec["eager"])
        row["eager"] = attempt(ctx, f"eager {op}", lambda fn=eager, flops=flops:
                               with_tflops(time_calls(ctx, fn, n_sets), flops))
        row["ours"] = ours_or_reason(ctx) or pair["ours"]
        if ctx.ours is not None:
            row["rel_err"] = attempt(ctx, f"check {op}", lambda spec=spec: check_outputs(
                spec["ours"](first), spec["reference"](first)))
        # ours time / plain cuBLAS GEMM time: the price of the fused activation (target <= 1.05).
        row["time_vs_cublas"] = ratio(row["ours"], row["cublas"])
        row["speedup_vs_eager"] = ratio(row["eager"], row["ours"])
        rows.append(row)
    return rows


def section_fused(ctx: Ctx, results: dict) -> None:
    rows = results.setdefault("fused", [])
    for act, h in ctx.configs:
        out = attempt(ctx, f"fused {config_label(act, h)}", bench_fused, ctx, act, h)
        if isinstance(out, dict):  # the setup itself failed (e.g. OOM): one row says so
            out = [{"config": config_label(act, h), "op": "all", "ours": out}]
        rows.extend(out)
        ctx.checkpoint()
        free_memory(ctx)
