"""Ways to spell the gated small step in plain autograd ops, timed side by side (a GPU is needed).

    python3 tools/small_step_variants.py [--hold-s 0.5] [--rounds 2]

fc1's weight holds interleaved (gate, up) rows, so its output holds interleaved pairs. How the
activation splits them decides the backward's kernels: unbind's backward is a stack into the
interleaved layout (one copy kernel storing 2-byte elements at a 4-byte stride), where eager's
chunk of contiguous halves is a cat. The layer's small step (small_step.py) picks between its
gate_and_up_in_place and gate_and_up_by_two_gemms by rows per input feature, and from one row
per feature runs its lean activation on either (LeanGatedProduct on the two GEMMs' outputs,
LeanGatedPairs on the one GEMM's interleaved output, its gradient written into pairs, no stack).
Beside it: both splits with autograd's nodes and with the lean product for the activation, the
lean function into pairs, other ways to split (a transposed unbind, a W1 copy in halves, two
GEMMs on slices of W1), other ways to keep only gate and up for backward (a Python backward, fc2
recomputed) and a second copy of eager, whose ratio to eager is the run's own spread.
Each spelling computes the same MLP; each is timed held (as the sweep times) and as a CUDA graph
(its kernels alone, no host), at the sweep's gated small-step shapes, with its gradients checked
against eager's and its step's peak memory beside its time.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from parallel_mlp.activations import ACTIVATIONS
from parallel_mlp.bench.harness import Ctx, l2_bytes, ratio, time_with_tflops
from parallel_mlp.bench.models import (EagerMLP, build_parallel_mlp, chunked_w1, cuda_graphed,
                                       mlp_flops, step_peak_memory, train_step,
                                       weight_grads)
from parallel_mlp.bench.sweep import host_probe_us
from parallel_mlp.bench.threads import describe, placement
from parallel_mlp.small_step import (LeanGatedPairs, LeanGatedProduct,
                                     gate_and_up_by_two_gemms, gate_and_up_in_place)

SHAPES = [  # T, d, h: the sweep's gated small steps
    (8192, 1024, 2816), (2048, 2048, 2816), (512, 1024, 2816), (512, 8192, 2752)]


class Spelled(nn.Module):
    """The swiglu MLP on an interleaved W1, fc1's (gate, up) made by ``split(x, w1)``."""

    def __init__(self, w1, w2, split, tail=None):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(w1.clone()), nn.Parameter(w2.clone())
        self.split, self.tail = split, tail

    def forward(self, x):
        g, u = self.split(x, self.w1)
        if self.tail is not None:
            return self.tail(g, u, self.w2)
        return F.linear(F.silu(g) * u, self.w2)


class SwigluKeepingHalves(torch.autograd.Function):
    """silu(g) * u that keeps g and u alone for backward (autograd keeps silu(g) too) and
    recomputes silu(g) there: one activation-sized tensor less, one elementwise pass more, and a
    Python backward."""

    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dpost):
        g, u = ctx.saved_tensors
        return torch.ops.aten.silu_backward(dpost * u, g), dpost * F.silu(g)


class SwigluFc2Recomputed(torch.autograd.Function):
    """The activation and fc2 keeping g, u and W2: postact recomputed in backward for fc2's
    weight gradient (what the fused path's default mode keeps, in torch ops)."""

    @staticmethod
    def forward(ctx, g, u, w2):
        ctx.save_for_backward(g, u, w2)
        return F.linear(F.silu(g) * u, w2)

    @staticmethod
    def backward(ctx, dy):
        g, u, w2 = ctx.saved_tensors
        a = F.silu(g)
        dpost = dy @ w2
        dw2 = dy.flatten(0, -2).T @ (a * u).flatten(0, -2)
        return torch.ops.aten.silu_backward(dpost * u, g), dpost * a, dw2


def lean_product(g, u, w2):
    return F.linear(LeanGatedProduct.apply(g, u, ACTIVATIONS["swiglu"]), w2)


def preact_alone(x, w1):
    # fc1's interleaved output whole, for a tail that reads its pairs itself
    return F.linear(x, w1), None


def lean_pairs(preact, _, w2):
    return F.linear(LeanGatedPairs.apply(preact, ACTIVATIONS["swiglu"]), w2)


def keeping_halves(g, u, w2):
    return F.linear(SwigluKeepingHalves.apply(g, u), w2)


def transposed_unbind(x, w1):
    # unbind over a [.., 2, h] view: its backward stacks contiguous halves, then one transpose copy
    return F.linear(x, w1).unflatten(-1, (-1, 2)).transpose(-1, -2).unbind(-2)


def weight_in_halves(x, w1):
    # fc1 on a copy of W1 in [gate; up] order: eager's kernels plus a weight-sized copy each way
    h2, d = w1.shape
    halves = w1.view(h2 // 2, 2, d).transpose(0, 1).reshape(h2, d)
    return F.linear(x, halves).chunk(2, dim=-1)


def sliced_weight(x, w1):
    # the same two GEMMs on two slices of W1: each half's gradient lands in a zeroed W1-sized
    # tensor, and the two are summed
    return F.linear(x, w1[0::2]), F.linear(x, w1[1::2])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hold-s", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--with-baselines", action="store_true",
                   help="also build and time torch.compile's and quack's MLP beside them, as the "
                        "sweep does (does their presence slow the process's host work?)")
    p.add_argument("--check-only", action="store_true",
                   help="compare the spellings' gradients with eager's, time nothing (any device)")
    p.add_argument("--shapes", default=None, metavar="TxDxH,...",
                   help="instead of the sweep's four, e.g. 512x1024x2816,2048x2048x2816")
    args = p.parse_args()
    shapes = SHAPES
    if args.shapes is not None:
        items = [item.split("x") for item in args.shapes.split(",")]
        if not all(len(i) == 3 and all(v.isdigit() and int(v) > 0 for v in i) for i in items):
            p.error(f"--shapes must be TxDxH items of positive ints, comma-separated; got "
                    f"{args.shapes!r}")
        shapes = [tuple(int(v) for v in i) for i in items]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ctx = Ctx(device=device, dtype=torch.bfloat16, tokens=0, d_model=0, configs=[], iters=10,
              warmup=3, backend="auto", deadline=float("inf"), hold_s=args.hold_s,
              rounds=args.rounds, quiet=True)
    ctx.l2_bytes = l2_bytes(device)
    torch.manual_seed(0)
    for T, d, h in shapes:
        w1 = (torch.randn(2 * h, d, device=device) * d ** -0.5).bfloat16()
        w2 = (torch.randn(d, h, device=device) * h ** -0.5).bfloat16()
        xs = [torch.randn(T, d, device=device, dtype=torch.bfloat16, requires_grad=True)
              for _ in range(2)]
        dys = [torch.randn(T, d, device=device, dtype=torch.bfloat16) for _ in range(2)]
        models = {
            "eager": EagerMLP(chunked_w1(w1, True), w2.clone(), "swiglu"),
            "the layer's small step": build_parallel_mlp(w1, w2, "swiglu", h),
            "pairs in place, autograd's nodes": Spelled(w1, w2, gate_and_up_in_place),
            "transposed unbind": Spelled(w1, w2, transposed_unbind),
            "weight in halves": Spelled(w1, w2, weight_in_halves),
            "two GEMMs, autograd's nodes": Spelled(w1, w2, gate_and_up_by_two_gemms),
            "two GEMMs (slices)": Spelled(w1, w2, sliced_weight),
            "two GEMMs, keeping g and u": Spelled(w1, w2, gate_and_up_by_two_gemms,
                                                       keeping_halves),
            "two GEMMs, fc2 recomputed": Spelled(w1, w2, gate_and_up_by_two_gemms,
                                                      SwigluFc2Recomputed.apply),
            "pairs in place, keeping g and u": Spelled(w1, w2, gate_and_up_in_place,
                                                       keeping_halves),
            "two GEMMs, lean product": Spelled(w1, w2, gate_and_up_by_two_gemms, lean_product),
            "pairs in place, lean product": Spelled(w1, w2, gate_and_up_in_place, lean_product),
            "pairs, lean into pairs": Spelled(w1, w2, preact_alone, lean_pairs),
            "eager, a second copy": EagerMLP(chunked_w1(w1, True), w2.clone(), "swiglu"),
        }
        if args.with_baselines:
            from parallel_mlp.bench import quack_baseline

            models["torch.compile"] = torch.compile(EagerMLP(chunked_w1(w1, True), w2.clone(),
                                                             "swiglu"), dynamic=False)
            if quack_baseline.load()[0] is not None:
                models["quack"] = quack_baseline.build(w1, w2, "swiglu", h)
        ref = None
        for name, model in models.items():
            train_step(model, xs[0], dys[0])
            wgrads = ((model.w1.grad, model.w2.grad) if isinstance(model, Spelled)
                      else weight_grads(model, True))
            if wgrads is None:  # a model whose weights weight_grads cannot find
                continue
            grads = [g.float() for g in (xs[0].grad, *wgrads)]
            if ref is None:
                ref = grads
            else:
                errs = [((a - b).norm() / b.norm()).item() for a, b in zip(grads, ref)]
                assert max(errs) < 2e-2, f"{name}: gradients differ from eager's ({errs})"
        if args.check_only:
            print(f"T={T} d={d} h={h}: every spelling's gradients match eager's")
            continue
        peaks = {name: step_peak_memory(ctx, m, xs, dys).get("peak_over_start_gb")
                 for name, m in models.items()}
        baselines = {"torch.compile", "quack"}
        for name in [n for n in models if n not in baselines]:
            models[f"{name}, graphed"] = cuda_graphed(models[name], xs[0])
        steps = {name: (lambda i, m=m: train_step(m, xs[i], dys[i])) for name, m in models.items()}
        times = time_with_tflops(ctx, steps, 2, mlp_flops(T, d, "swiglu", h))
        print(f"T={T} d={d} swiglu h={h}: ms per fwd+bwd, held {args.hold_s} s x {args.rounds}; "
              f"host probe {host_probe_us(ctx):.0f} µs (the sweep's), {describe(placement())}")
        for name in models:
            if name.endswith(", graphed"):
                continue
            t = times[name]["ms"]
            line = f"  {name:34s} {t:7.3f} ({ratio(times['eager'], times[name]):5.3f}x eager)"
            if peaks.get(name) is not None:
                line += f"  step peak {peaks[name] * 1024:7.1f} MiB"
            if f"{name}, graphed" in times:
                g = times[f"{name}, graphed"]
                line += (f"   graphed {g['ms']:7.3f} "
                         f"({ratio(times['eager, graphed'], g):5.3f}x)")
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
