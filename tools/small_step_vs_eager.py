"""A host-bound step on eager's own ops beside eager's module: held time, host time and the
kernels each runs.

At T=512 d=1024 gelu_tanh_approx h=512 (one rank, no biases) `backend="auto"` runs the layer's
small step (small_step.py): F.linear -> gelu -> F.linear under autograd, the ops of the eager
module the benchmarks compare against (x @ W1.T -> gelu -> @ W2.T). This script times the two
(and a second copy of eager, the timing's spread) held back to back in alternating rounds, the
host time of a burst of steps issued without waiting for the GPU, and lists each one's kernels
under torch.profiler, so that a difference can be told apart: GPU work or host time.

Grads are cleared over parameter lists made once (as an optimizer's zero_grad does), not by
walking the module tree, which costs the layer's nested shards more host time than eager's flat
module.

    python3 tools/small_step_vs_eager.py [--T 512 --d 1024 --h 512 --act gelu_tanh_approx]
    python3 tools/small_step_vs_eager.py --check-only   # CPU: the premise and values, no timing
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--T", type=int, default=512)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--h", type=int, default=512)
    parser.add_argument("--act", default="gelu_tanh_approx")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--hold-s", type=float, default=0.3)
    parser.add_argument("--check-only", action="store_true",
                        help="check on the CPU that the layer takes the small step at this shape "
                        "on CUDA and computes eager's output and gradients; time nothing")
    args = parser.parse_args()
    require_small_step(args)
    if args.check_only:
        return check(args)
    if not torch.cuda.is_available():
        raise SystemExit("small_step_vs_eager: needs a CUDA device")

    from parallel_mlp import ParallelMLP
    from parallel_mlp.bench.models import EagerMLP

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    ours = ParallelMLP(args.d, args.h, activation=args.act, device=dev, dtype=dt)
    w1, w2 = ours.fc1.weight.detach(), ours.fc2.weight.detach()
    models = {"ours": ours, "eager": EagerMLP(w1.clone(), w2.clone(), args.act),
              "eager copy": EagerMLP(w1.clone(), w2.clone(), args.act)}
    params = {name: list(model.parameters()) for name, model in models.items()}
    x = torch.randn(args.T, args.d, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(args.T, args.d, device=dev, dtype=dt)

    def step(name):
        for p in params[name]:
            p.grad = None
        x.grad = None
        models[name](x).backward(dy)

    for name in models:
        for _ in range(50):
            step(name)
    torch.cuda.synchronize()

    def hold(name):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n, t0 = 0, time.perf_counter()
        start.record()
        while time.perf_counter() - t0 < args.hold_s:
            step(name)
            n += 1
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000 / n

    print(f"T={args.T} d={args.d} {args.act} h={args.h}, bf16, {torch.cuda.get_device_name()}")
    held = {name: [] for name in models}
    for _ in range(args.rounds):
        for name in models:
            held[name].append(hold(name))
    for name, times in held.items():
        print(f"held {args.hold_s} s x {args.rounds}: {name:10s} median {statistics.median(times):7.1f} µs"
              f"  rounds {[round(t, 1) for t in times]}")
    for name in ("eager", "eager copy"):
        ratios = [a / b for a, b in zip(held[name], held["ours"])]
        print(f"{name} / ours by round: median {statistics.median(ratios):.3f}  "
              f"{[round(r, 3) for r in ratios]}")

    def host_us(name, n=200):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step(name)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    print("host µs per step, 200 steps issued without waiting (five bursts):")
    for _ in range(2):
        for name in models:
            print(f"  {name:10s} {[round(host_us(name), 1) for _ in range(5)]}")

    from torch.profiler import ProfilerActivity, profile
    steps = 20
    for name in models:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step(name)
            torch.cuda.synchronize()
        kernels = [ev for ev in prof.key_averages()
                   if ev.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(ev.self_device_time_total for ev in kernels) / steps
        launches = sum(ev.count for ev in kernels) / steps
        print(f"\n{name}: GPU kernel time per step {total:.1f} µs, {launches:.0f} kernels")
        for ev in sorted(kernels, key=lambda ev: -ev.self_device_time_total):
            print(f"  {ev.self_device_time_total / steps:7.1f} µs  x{ev.count / steps:.0f}  {ev.key[:100]}")
    return 0


def require_small_step(args) -> None:
    """Refuse a shape this script does not compare: a gated activation (eager's module chunks
    its fc1 where the layer interleaves it), or sizes at which `auto` runs the fused kernels on
    CUDA (one rank, no biases, default options) instead of the small step."""
    from parallel_mlp import get_activation, small_step
    from parallel_mlp.autograd import replays_launches

    if get_activation(args.act).gated:
        raise SystemExit(f"small_step_vs_eager: --act {args.act}: compares non-gated activations "
                         "only, whose fc1 has eager's layout")
    takes = small_step.applies(
        args.T, args.d, args.h, args.h, args.d, device_type="cuda", backend="auto", tp_size=1,
        recompute=False, fuse_grad_accum=False, compiling=False, gate_ops=False,
        launch_graphs=replays_launches(None, None))
    if not takes:
        raise SystemExit(f"small_step_vs_eager: auto runs T={args.T} d={args.d} h={args.h} "
                         f"{args.act} fused on CUDA, not as the small step this script compares")


def check(args) -> int:
    """On the CPU in fp32: the small step as the layer runs it on CUDA, the layer itself (here
    the fused function on the torch backend) and eager's module, holding the same weights, give
    the same output and gradients."""
    from parallel_mlp import ParallelMLP, small_step
    from parallel_mlp.bench.models import EagerMLP

    torch.manual_seed(0)
    ours = ParallelMLP(args.d, args.h, activation=args.act)
    w1, w2 = ours.fc1.weight, ours.fc2.weight
    eager = EagerMLP(w1.detach().clone(), w2.detach().clone(), args.act)
    steps = [(lambda xi: small_step.small_step(xi, w1, None, w2, None, ours.activation), ours),
             (ours, ours), (eager, eager)]
    x = torch.randn(args.T, args.d)
    dy = torch.randn(args.T, args.d)
    results = []
    for run, model in steps:
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        run(xi).backward(dy)
        results.append([run(xi), xi.grad] + [p.grad for p in model.parameters()])
    for other in results[1:]:
        for name, a, b in zip(("y", "dx", "dW1", "dW2"), results[0], other):
            torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")
    print(f"T={args.T} d={args.d} {args.act} h={args.h}: auto takes the small step on CUDA; "
          "the layer gives eager's output and gradients")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
