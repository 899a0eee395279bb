"""A host-bound step of the fused function against eager in one steady loop: wall and host
time per step, the launch groups' replays, and the GPU's kernels.

    python3 tools/fused_step_probe.py [--shape T,d,h,act ...]

For each shape, the fused function at every size (the sweep's ``ours_fused``: FusedParallelMLP
on backend="auto") and eager, each over four input sets in turn as the sweep rotates them: 20
untimed steps, then the launch groups' captures, plain runs and replays over 100 steps; the best
of three runs of 300 steps back to back (wall, synchronized at the end, and the host's time to
launch them); then torch.profiler over 10 steps: the GPU kernels' summed time per step and the
longest kernels. Unlike the sweep, no other model runs between a model's steps, so the fused
function's keys settle and its groups replay (tools/launch_key_churn.py).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from parallel_mlp.bench.host_overhead import parse_shape
from parallel_mlp.bench.models import fused_and_eager

SHAPES = [(512, 1024, 512, "gelu_tanh_approx"), (512, 1024, 2816, "swiglu"),
          (4096, 1024, 4096, "gelu_tanh_approx")]
INPUT_SETS = 4


def probe(shape) -> None:
    from parallel_mlp.launch_graphs import GRAPHS

    models, inputs = fused_and_eager(shape, INPUT_SETS)
    models = {"fused": models["ours"], "eager": models["eager"]}
    label = ",".join(map(str, shape))
    for name, model in models.items():
        params = list(model.parameters())
        count = [0]

        def step():
            x, dy = inputs[count[0] % INPUT_SETS]
            count[0] += 1
            for p in params:
                p.grad = None
            x.grad = None
            model(x).backward(dy)

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        GRAPHS.stats.clear()
        for _ in range(100):
            step()
        torch.cuda.synchronize()
        groups = dict(GRAPHS.stats)
        wall = host = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(300):
                step()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            wall = min(wall, (time.perf_counter() - t0) / 300 * 1e3)
            host = min(host, (t1 - t0) / 300 * 1e3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        kernels: dict[str, list] = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                k = kernels.setdefault(e.name, [0.0, 0])
                k[0] += e.device_time_total
                k[1] += 1
        gpu_ms = sum(t for t, _ in kernels.values()) / 10 / 1e3
        print(f"{label} {name}: wall {wall:.3f} ms/step, host {host:.3f} ms/step, GPU "
              f"kernels {gpu_ms:.3f} ms/step; groups over 100 steps: {groups}")
        for kname, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:8]:
            print(f"    {t / 10:8.1f} us/step  x{n / 10:.1f}  {kname[:110]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", type=parse_shape,
                   help="T,d,h,act (repeatable; default: T=512 d=1024 gelu_tanh_approx h=512, "
                        "T=512 d=1024 swiglu h=2816, T=4096 d=1024 gelu_tanh_approx h=4096)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fused_step_probe.py needs a CUDA GPU")
    for shape in args.shape or SHAPES:
        probe(shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
