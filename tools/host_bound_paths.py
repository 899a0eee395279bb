"""The paths a host-bound gated step can take through the layer, timed in paired short turns
beside eager (a GPU is needed to time; ``--check-only`` runs anywhere).

    python3 tools/host_bound_paths.py [--rounds 80] [--turn-s 0.05] [--shape T,d,h,act ...]
    python3 tools/host_bound_paths.py --shape 512,1024,512,gelu_tanh_approx --kernels

Five variants of one step, with the same weights:

- ``eager``: ``bench.models.EagerMLP``, the MLP a PyTorch user writes;
- ``fused``: ``ParallelMLP`` on ``backend="auto"`` with its kept small-step row limit forced to 0
  rows (the fused path at every step, which ``auto`` takes at the gated steps and not at the
  non-gated small ones), the fused function applied through autograd's C++ apply
  (``autograd.apply_function``);
- ``torch_apply``: the same module with that direct apply switched off between turns
  (``autograd._DIRECT``), so that torch's ``Function.apply``, Python around the same C++ apply,
  runs instead;
- ``full_path``: another such module whose kept limit holds no fused-function options, so that
  its forward's fast lane passes the step on to the full path (the module's options read, the
  shards' checks, ``_run``), as every fused step ran before the lane took them;
- ``small``: a second ``ParallelMLP`` whose kept small-step row limit is forced above the step
  (``small_step.row_limit`` answering 2**48 while it works the limit out): the plain autograd
  ops of ``small_step.small_step``, which ``auto`` runs at the non-gated small steps and no
  longer at gated ones (``small_step.applies``, its launch-graphs clause).

Each turn runs one variant back to back for ``--turn-s`` and counts its steps between two
device synchronizations (host-bound steps: the host's time per step); the variants take turns in
an order reversed every round (``bench.timing.turn_order``) after ``--heat-s`` of untimed calls
(``bench.timing.heat``). Short turns, many rounds, because the host's speed wanders over
seconds (`docs/speed.md`, "How it times"). Prints ms per step and the paired ratios (the median over
rounds of one turn's time over the other's, with its 95% interval,
``bench.harness.ratio_interval``). Every variant's output and gradients are checked against
eager's first. ``--kernels`` then lists each variant's kernels under torch.profiler (GPU time
per step, kernels per step, each kernel's share): whether a gap between two variants is GPU
work or host time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

from parallel_mlp import autograd, small_step
from parallel_mlp.activations import ACTIVATIONS
from parallel_mlp.bench.harness import ratio, ratio_interval
from parallel_mlp.bench.models import (EagerMLP, build_parallel_mlp, chunked_w1, train_step,
                                       weight_grads)
from parallel_mlp.bench.timing import heat, turn_order

SHAPES = [  # T, d, h, activation: the sweep's gated host-bound steps
    (512, 1024, 2816, "swiglu"), (512, 8192, 2752, "swiglu"), (2048, 2048, 2816, "swiglu")]
# (numerator, denominator) of the printed ratios: above 1 the denominator is faster.
PAIRS = (("torch_apply", "fused"), ("full_path", "fused"), ("small", "fused"), ("eager", "fused"),
         ("eager", "small"))
# Whether this torch has the direct apply's parts: the switch is restored to it after each use.
_DIRECT_AVAILABLE = autograd._DIRECT


def _shape(text: str) -> tuple[int, int, int, str]:
    parts = text.split(",")
    if len(parts) != 4 or parts[3] not in ACTIVATIONS or not all(p.isdigit() and int(p) > 0
                                                                 for p in parts[:3]):
        raise argparse.ArgumentTypeError(
            f"--shape takes T,d,h,act with positive integers and an activation of "
            f"{sorted(ACTIVATIONS)}, got {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2]), parts[3]


def _forced_row_limit(model, limit: int, probe_rows: int):
    """``model`` with its small-step row limit worked out as ``limit`` (steps of fewer rows take
    the small step), by one forward of ``probe_rows`` rows; the limit is kept while its weights
    and options stay."""
    with mock.patch.object(small_step, "row_limit", lambda *args, **kwargs: limit):
        with torch.no_grad():
            model(torch.zeros(probe_rows, model.in_features, device=model.fc1.weight.device,
                              dtype=model.fc1.weight.dtype))
    return model


def forced_small_step(model):
    """``model`` taking the small step at every step it sees."""
    return _forced_row_limit(model, 2 ** 48, 1)


def forced_fused(model, rows: int):
    """``model`` taking the fused path at every step it sees; its probe forward has the timed
    steps' ``rows``, so that it launches no kernel those steps would not."""
    return _forced_row_limit(model, 0, rows)


def without_fast_lane(model):
    """``model`` (its limit kept) with its forward's fast lane closed to fused steps: the kept
    limit holds no fused-function options, so those steps take the full path."""
    kept = model.__dict__["_kept_small_step_limit"]
    model.__dict__["_kept_small_step_limit"] = kept._replace(function_options=None)
    return model


def variants(T: int, d: int, h: int, act: str, device, dtype):
    """{name: step function} and (x, dy) for one shape."""
    gated = ACTIVATIONS[act].gated
    g = torch.Generator(device=device).manual_seed(0)
    w1 = (torch.randn((2 if gated else 1) * h, d, device=device, generator=g) * d ** -0.5).to(dtype)
    w2 = (torch.randn(d, h, device=device, generator=g) * h ** -0.5).to(dtype)
    x = torch.randn(T, d, device=device, generator=g).to(dtype).requires_grad_()
    dy = torch.randn(T, d, device=device, generator=g).to(dtype)
    eager = EagerMLP(chunked_w1(w1, gated), w2.clone(), act)
    fused = forced_fused(build_parallel_mlp(w1, w2, act, h), T)
    full_path = without_fast_lane(forced_fused(build_parallel_mlp(w1, w2, act, h), T))
    small = forced_small_step(build_parallel_mlp(w1, w2, act, h))

    def step(model, direct=True):
        def run(_i=0):
            autograd._DIRECT = direct and _DIRECT_AVAILABLE
            return train_step(model, x, dy)
        return run

    fns = {"eager": step(eager), "fused": step(fused), "torch_apply": step(fused, direct=False),
           "full_path": step(full_path), "small": step(small)}
    models = {"eager": eager, "fused": fused, "torch_apply": fused, "full_path": full_path,
              "small": small}
    return fns, models, x, gated


def check(fns, models, x, gated: bool, tol: float) -> dict[str, float]:
    """Each variant's largest relative error against eager over y, dx, dW1 and dW2 (raises above
    ``tol``), after checking that the layer's variants took their paths: the fused function's
    node where asked for, plain autograd ops in the small step."""
    def grads(name):
        y = fns[name]()
        fused_node = type(y.grad_fn).__name__.startswith("ParallelMLPFunction")
        if fused_node != (name in ("fused", "torch_apply", "full_path")):
            raise SystemExit(f"{name} took the wrong path: its output's node is "
                             f"{type(y.grad_fn).__name__}")
        return [y.detach().clone(), x.grad.clone(), *weight_grads(models[name], gated)]

    ref = grads("eager")
    errors = {}
    for name in fns:
        if name == "eager":
            continue
        errors[name] = max(float((a.float() - b.float()).norm() / b.float().norm())
                           for a, b in zip(grads(name), ref))
        if not errors[name] <= tol:
            raise SystemExit(f"{name} differs from eager: relative error {errors[name]:.3g} > {tol}")
    autograd._DIRECT = _DIRECT_AVAILABLE
    return errors


def time_turns(fns, rounds: int, turn_s: float, heat_s: float) -> dict[str, dict]:
    """{name: {"ms": median turn, "holds_ms": each round's ms per step}}."""
    names = list(fns)
    heat(list(fns.values()), heat_s)
    holds = {name: [] for name in names}
    for r in range(rounds):
        for i in turn_order(len(names), r):
            fn = fns[names[i]]
            torch.cuda.synchronize()
            start, steps = time.perf_counter(), 0
            while time.perf_counter() - start < turn_s:
                fn()
                steps += 1
            torch.cuda.synchronize()
            holds[names[i]].append((time.perf_counter() - start) / steps * 1e3)
    autograd._DIRECT = _DIRECT_AVAILABLE
    return {name: {"ms": statistics.median(v), "holds_ms": v} for name, v in holds.items()}


def kernel_summary(kernels, steps: int, top: int = 12) -> list[str]:
    """Lines for one variant's kernels, given (name, device µs over all steps, launches) per
    kernel name: the GPU time and the kernels per step, then the longest kernels' µs and
    launches per step."""
    kernels = sorted(kernels, key=lambda k: -k[1])
    total = sum(us for _, us, _ in kernels) / steps
    launches = sum(n for _, _, n in kernels) / steps
    lines = [f"GPU kernel time per step {total:.1f} µs, {launches:.0f} kernels"]
    lines += [f"  {us / steps:7.1f} µs  x{n / steps:.0f}  {name[:100]}" for name, us, n in kernels[:top]]
    return lines


def profile_kernels(fn, steps: int = 20) -> list[str]:
    """``steps`` calls of ``fn`` under torch.profiler (CUDA activity), summarized by
    :func:`kernel_summary`."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    autograd._DIRECT = _DIRECT_AVAILABLE
    kernels = [(ev.key, ev.self_device_time_total, ev.count) for ev in prof.key_averages()
               if ev.device_type == torch.autograd.DeviceType.CUDA]
    return kernel_summary(kernels, steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--turn-s", type=float, default=0.05)
    p.add_argument("--heat-s", type=float, default=1.5)
    p.add_argument("--shape", type=_shape, action="append",
                   help="T,d,h,act (repeatable; default: the sweep's gated host-bound steps)")
    p.add_argument("--check-only", action="store_true",
                   help="build the variants and check them against eager, time nothing (on the "
                        "CPU in fp32 where there is no GPU)")
    p.add_argument("--kernels", action="store_true",
                   help="after a shape's turns, list each variant's kernels under torch.profiler")
    args = p.parse_args(argv)
    shapes = args.shape or SHAPES
    cuda = torch.cuda.is_available()
    if not cuda and not args.check_only:
        raise SystemExit("host_bound_paths.py times on a CUDA GPU; --check-only runs without one")
    if args.kernels and args.check_only:
        p.error("--kernels lists the kernels of timed steps: not with --check-only")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    if not args.check_only:
        print(f"{torch.cuda.get_device_name()}; turns of {args.turn_s} s x {args.rounds} rounds "
              f"after {args.heat_s} s of heat; ratios: paired median (95% interval), above 1 the "
              f"second is faster")
    for T, d, h, act in shapes:
        fns, models, x, gated = variants(T, d, h, act, device, dtype)
        errors = check(fns, models, x, gated, tol)
        label = f"T={T} d={d} {act} h={h}"
        if args.check_only:
            print(f"{label}: every variant agrees with eager (largest relative error "
                  + ", ".join(f"{k} {v:.2g}" for k, v in errors.items()) + ")")
            continue
        res = time_turns(fns, args.rounds, args.turn_s, args.heat_s)
        ms = ", ".join(f"{k} {v['ms']:.4f}" for k, v in res.items())
        pairs = []
        for a, b in PAIRS:
            lo_hi = ratio_interval(res[a], res[b])
            span = f" ({lo_hi[0]:.3f}-{lo_hi[1]:.3f})" if lo_hi else ""
            pairs.append(f"{a}/{b} {ratio(res[a], res[b]):.3f}{span}")
        print(f"{label}: ms {ms}; " + "; ".join(pairs), flush=True)
        if args.kernels:
            for name, fn in fns.items():
                print(f"  {name}: " + "\n    ".join(profile_kernels(fn)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
