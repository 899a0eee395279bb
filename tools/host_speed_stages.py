"""Does anything the sweep does before its shapes slow the process's host work? (GPU needed)

    python3 tools/host_speed_stages.py [--quick]

Reads the host's µs per fwd+bwd of a tiny eager MLP (the sweep's host probe: min and median of
five runs of 300 steps) and eager's held step at T=512 d=1024 swiglu (0.05 s x 12 turns) after
each thing the sweep does, in turn: nothing yet (twice, for the host's own wander), importing the
benchmark, resolving ours, a CUDA-graph capture, running the fused kernels, quack and
torch.compile, then gc.freeze() and autograd's device threads off. A stage that slows host work
would read slower from there on; one run on the H200 host (benchmarks/h200-host-speed-stages.txt)
found none beyond the host's own wander, and device threads off twice as fast. Each line also
names the CPU (and its core's SMT siblings) that the main thread and autograd's CUDA thread last
ran on (different cores in fast and slow readings alike, 2026-12-02). And each line counts, per step of the tiny probe,
the process's minor page faults and voluntary and involuntary context switches (getrusage): a
heap that glibc trims and grows back every step, or threads that sleep and wake at every
hand-over, would show there. ``--quick`` reads a fresh process and device threads off alone (~15
s), to compare processes started differently (e.g. with glibc's MALLOC_* tunables). And each
line reads the tiny step's host time launched into an idle GPU and behind a busy one
(busy_gpu_probe).
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import threading
import time

import torch

from parallel_mlp.bench.threads import describe, placement


def tiny_mlp():
    """The sweep's host probe's model (T=64 d=256 swiglu, bf16 on the GPU), its input and dy;
    built here rather than through sweep.host_probe_us, so that the first stages read a process
    that has not imported the sweep."""
    from parallel_mlp.bench.models import EagerMLP
    dev = torch.device("cuda")
    d = 256
    m = EagerMLP(torch.randn(8 * d, d, device=dev, dtype=torch.bfloat16),
                 torch.randn(d, 4 * d, device=dev, dtype=torch.bfloat16), "swiglu")
    x = torch.randn(64, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, d, device=dev, dtype=torch.bfloat16)
    return m, x, dy


def tiny_probe() -> tuple[float, float, dict[str, float]]:
    """(min, median) host µs per fwd+bwd of a tiny eager MLP over five runs of 300 steps, and
    the process's page faults and context switches per step over those runs (rusage_per_step)."""
    from parallel_mlp.bench.models import train_step
    m, x, dy = tiny_mlp()
    best = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(5):
        for _ in range(10):
            train_step(m, x, dy)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(300):
            train_step(m, x, dy)
        best.append((time.perf_counter() - t) / 300 * 1e6)
        torch.cuda.synchronize()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return min(best), sorted(best)[2], rusage_per_step(before, after, 5 * 310)


def busy_gpu_probe(steps: int = 30, rounds: int = 7) -> tuple[float, float]:
    """(GPU idle, GPU busy): median host µs per fwd+bwd of the tiny eager MLP over ``rounds``
    runs of ``steps`` steps, launched into an idle GPU, then behind a ~50 ms sleep kernel that
    keeps the GPU busy for the whole run (few enough launches that the queue never fills). A
    host that pays more per launch into an idle GPU reads slower in the first column: a
    host-bound step whose GPU never falls behind would then pay that on every launch."""
    from parallel_mlp.bench.models import train_step
    m, x, dy = tiny_mlp()
    for _ in range(10):
        train_step(m, x, dy)
    out = []
    for busy in (False, True):
        runs = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            if busy:
                torch.cuda._sleep(100_000_000)  # ~50 ms of GPU clock cycles
            t = time.perf_counter()
            for _ in range(steps):
                train_step(m, x, dy)
            runs.append((time.perf_counter() - t) / steps * 1e6)
        torch.cuda.synchronize()
        out.append(sorted(runs)[rounds // 2])
    return out[0], out[1]


RUSAGE_FIELDS = {"ru_minflt": "faults", "ru_nvcsw": "waits", "ru_nivcsw": "preempted"}


def rusage_per_step(before, after, steps: int) -> dict[str, float]:
    """Per step between two getrusage readings: minor page faults ("faults"), voluntary context
    switches (a thread slept: "waits") and involuntary ones (a thread was descheduled:
    "preempted"), summed over the process's threads."""
    return {name: (getattr(after, field) - getattr(before, field)) / steps
            for field, name in RUSAGE_FIELDS.items()}


def held_eager(T=512, d=1024, h=2816) -> float:
    """Eager's held fwd+bwd in ms, as the sweep times a host-bound step."""
    from parallel_mlp.bench.harness import Ctx, time_held
    from parallel_mlp.bench.models import EagerMLP, train_step
    dev = torch.device("cuda")
    ctx = Ctx(device=dev, dtype=torch.bfloat16, tokens=T, d_model=d, configs=[], iters=10,
              warmup=3, backend="auto", deadline=float("inf"), hold_s=0.05, rounds=12, quiet=True)
    m = EagerMLP(torch.randn(2 * h, d, device=dev, dtype=torch.bfloat16) * d ** -0.5,
                 torch.randn(d, h, device=dev, dtype=torch.bfloat16) * h ** -0.5, "swiglu")
    xs = [torch.randn(T, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
          for _ in range(2)]
    dys = [torch.randn(T, d, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    return time_held(ctx, {"eager": lambda i: train_step(m, xs[i], dys[i])}, 2)["eager"]["ms"]


def report(stage: str) -> None:
    lo, med, per_step = tiny_probe()
    idle, busy = busy_gpu_probe()
    ms = held_eager()
    counts = "  ".join(f"{k} {v:5.2f}" for k, v in per_step.items())
    print(f"{stage:44s} tiny probe min {lo:6.1f} med {med:6.1f} µs   eager T=512 held "
          f"{ms * 1e3:6.1f} µs   30 steps into an idle GPU {idle:6.1f}, a busy one {busy:6.1f} µs   "
          f"per step: {counts}   threads {threading.active_count()}  "
          f"gc objects {len(gc.get_objects())}   {describe(placement())}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a fresh process and device threads off only (~15 s)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_speed_stages.py needs a CUDA GPU (it times CUDA launches)", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")
    tunables = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                        if k.startswith(("MALLOC_", "GLIBC_TUNABLES")))
    print(f"glibc {os.confstr('CS_GNU_LIBC_VERSION')}; {tunables or 'no malloc tunables set'}",
          flush=True)
    report("fresh (torch only)")
    report("again")
    if args.quick:
        torch.autograd.set_multithreading_enabled(False)
        report("autograd device threads off")
        torch.autograd.set_multithreading_enabled(True)
        return 0
    import parallel_mlp.bench.sweep  # noqa: F401
    report("after importing the sweep")
    from parallel_mlp.bench import harness, quack_baseline
    from parallel_mlp.bench.models import (EagerMLP, build_parallel_mlp, chunked_w1, cuda_graphed,
                                           train_step)
    dev = torch.device("cuda")
    ctx = harness.Ctx(device=dev, dtype=torch.bfloat16, tokens=0, d_model=0, configs=[],
                      iters=10, warmup=3, backend="auto", deadline=float("inf"), hold_s=0.1,
                      rounds=2, quiet=True)
    harness.probe_ours(ctx)
    report("after resolving ours")
    T, d, h = 512, 1024, 2816
    w1 = (torch.randn(2 * h, d, device=dev) * d ** -0.5).bfloat16()
    w2 = (torch.randn(d, h, device=dev) * h ** -0.5).bfloat16()
    x = torch.randn(T, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, d, device=dev, dtype=torch.bfloat16)
    g = cuda_graphed(EagerMLP(chunked_w1(w1, True), w2.clone(), "swiglu"), x)
    for _ in range(3):
        train_step(g, x, dy)
    report("after a CUDA-graph capture")
    fused = build_parallel_mlp(w1, w2, "swiglu", h, backend="cute")
    for _ in range(3):
        train_step(fused, x, dy)
    report("after the fused kernels ran")
    if quack_baseline.load()[0] is not None:
        q = quack_baseline.build(w1, w2, "swiglu", h)
        for _ in range(3):
            train_step(q, x, dy)
        report("after quack ran")
    c = torch.compile(EagerMLP(chunked_w1(w1, True), w2.clone(), "swiglu"), dynamic=False)
    for _ in range(3):
        train_step(c, x, dy)
    report("after torch.compile ran")
    gc.collect()
    gc.freeze()
    report("after gc.freeze()")
    torch.autograd.set_multithreading_enabled(False)
    report("autograd device threads off")
    torch.autograd.set_multithreading_enabled(True)
    print("threads:", [t.name for t in threading.enumerate()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
