"""The host time of the module's small-step fast lane against eager's module, on the CPU.

    python3 tools/small_step_lane.py [BASE] [--rounds 200] [--steps 50] [--d 16] [--h 64]

At the host-bound steps where ``backend="auto"`` runs plain ops (small_step.py), what separates
the layer from eager's module (bench.models.EagerMLP) is Python around the same autograd graph:
the layer's forward tests its kept limit, then calls ``F.linear``, the activation and
``F.linear``; eager's reads its parameters and calls two matmuls on transposed views. This
times, cold as training runs them (each forward right after a backward, the gradients set to
None), the forward of: the layer (``ParallelMLP``, gelu_tanh_approx, its rule forced to the
small step, which otherwise holds on CUDA only), eager's module, and the layer's three ops
called bare; and the whole fwd+bwd of the first two. The layer minus the bare ops is what its
forward's tests cost. With BASE (a git revision), that revision's layer is timed beside the
working tree's in the same rounds (tools/host_stub_paired.py's renamed copies). Rounds
interleave the variants in turn; prints medians over rounds and the paired median of each
variant's forward and step to eager's. A shared 2-core VM moves by 1.5x within minutes: compare
only within one run.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

ACT = "gelu_tanh_approx"


def layer_from(package: str, d: int, h: int):
    """A ParallelMLP of the package imported as ``package``, its small-step rule forced on."""
    pm = importlib.import_module(package)
    importlib.import_module(package + ".small_step").applies = lambda *a, **k: True
    torch.manual_seed(0)
    return pm.ParallelMLP(d, h, activation=ACT)


def timed(forward, params, x, dy, steps: int) -> tuple[float, float]:
    """(forward µs, fwd+bwd µs) per step, averaged over ``steps`` steps."""
    fwd = total = 0
    for _ in range(steps):
        for p in params:
            p.grad = None
        x.grad = None
        t0 = time.perf_counter_ns()
        y = forward()
        t1 = time.perf_counter_ns()
        y.backward(dy)
        t2 = time.perf_counter_ns()
        fwd += t1 - t0
        total += t2 - t0
    return fwd / steps / 1e3, total / steps / 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", nargs="?", help="a git revision whose layer is timed beside this one")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--steps", type=int, default=50, help="steps per variant per round")
    p.add_argument("--T", type=int, default=8)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--h", type=int, default=64)
    args = p.parse_args(argv)
    from parallel_mlp.activations import get_activation
    from parallel_mlp.bench.models import EagerMLP

    layers = {"layer": layer_from("parallel_mlp", args.d, args.h)}
    if args.base:
        import host_stub_paired

        into = Path(tempfile.mkdtemp(prefix="small_step_lane_"))
        host_stub_paired.export_renamed(args.base, "pmlp_base", into)
        sys.path.insert(0, str(into))
        layers["layer@" + args.base] = layer_from("pmlp_base", args.d, args.h)
    mlp = layers["layer"]
    w1, w2 = mlp.fc1.weight, mlp.fc2.weight
    eager = EagerMLP(w1.detach().clone(), w2.detach().clone(), ACT)
    x = torch.randn(args.T, args.d, requires_grad=True)
    dy = torch.randn(args.T, args.d)
    variants = {"eager": (lambda: eager(x), list(eager.parameters()))}
    for name, layer in layers.items():
        layer(x)  # keeps the limit: later steps take the fast lane
        if type(layer(x).grad_fn).__name__.startswith("ParallelMLPFunction"):
            raise SystemExit(f"{name}: the step did not take the small step")
        variants[name] = (lambda layer=layer: layer(x), list(layer.parameters()))
    post = get_activation(ACT).eager
    variants["bare ops"] = (lambda: F.linear(post(F.linear(x, w1)), w2), [w1, w2])
    names = list(variants)
    times = {n: [] for n in names}
    for n in names:  # warm
        timed(*variants[n], x, dy, args.steps)
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(timed(*variants[n], x, dy, args.steps))
    print(f"T={args.T} d={args.d} h={args.h} {ACT}, {args.rounds} rounds of {args.steps} steps; "
          "µs: median over rounds; ratio: paired median to eager's")
    print(f"{'variant':<22} {'forward':>9} {'ratio':>7} {'fwd+bwd':>9} {'ratio':>7}")
    for n in names:
        fwd = statistics.median(t[0] for t in times[n])
        step = statistics.median(t[1] for t in times[n])
        rf = statistics.median(a[0] / b[0] for a, b in zip(times[n], times["eager"]))
        rs = statistics.median(a[1] / b[1] for a, b in zip(times[n], times["eager"]))
        print(f"{n:<22} {fwd:9.2f} {rf:7.3f} {step:9.2f} {rs:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
