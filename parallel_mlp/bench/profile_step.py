"""Where one MLP fwd+bwd step's time goes: every GPU kernel of the step, and the idle gaps.

    python -m parallel_mlp.bench profile [--act swiglu --h 14336 --T 8192 --d 4096 --steps 6]

For ours (ParallelMLP on the default backend, with and without recompute), PyTorch eager and,
where it is installed and runs the shape, quack's MLP (its defaults, as the sweep runs it), after
warm-up steps, runs `--steps` training steps (the bench's `train_step`) under torch.profiler
and prints per step: the wall time between the first kernel's start and the last kernel's end,
the summed kernel time, the gaps (the GPU idle, e.g. waiting for the host), and each kernel's
time in launch order. A step that is
slower than its kernels is host- or sync-bound.

The models are profiled one after another, so their kernel times include the card's clock drift
(10-20% over seconds on a power-bound H200): compare kernels within one model's rows, and
models against each other with `python -m parallel_mlp.bench mlp`, which times them side by side.
"""

from __future__ import annotations

import argparse
import os
import time
from bisect import bisect_right
from collections import Counter

import torch


def kernel_table(prof, steps: int):
    """(per-step busy ms, per-step span ms, [(name, ms per step, idle ms before)], note) from the
    CUDA kernel events of a profile. The rows follow one step's launch order, each the mean over
    the steps that launched the most common sequence of kernels; the note says how many did,
    when not all, or is empty. With the fused step's launch groups replayed from CUDA graphs, six
    profiled steps' records came back in seven spans between step markers, of 8, 2, 16, 8, 8, 8
    and 8 kernels (H100, torch 2.11, CUDA 13.0, 2026-12-07; launched one by one, 8 in each of
    six). Steps are told apart by the profiler's GPU-side step markers, or without them by
    count."""
    cuda = [e for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0]
    # the schedule's step markers span a step's work, they are not work
    kernels = sorted((e for e in cuda if not e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start)
    if not kernels:
        return 0.0, 0.0, [], ""
    start, end = kernels[0].time_range.start, max(e.time_range.end for e in kernels)
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    # The GPU's idle time before each kernel (0 for the first one profiled).
    gaps = [0.0] + [max(0.0, b.time_range.start - a.time_range.end) for a, b in zip(kernels, kernels[1:])]
    per_step = split_steps(kernels, cuda, steps)
    sequences = Counter(tuple(kernels[i].name for i in step) for step in per_step if step)
    if not sequences:  # fewer kernels than steps, and no markers to place them
        return busy / steps / 1e3, (end - start) / steps / 1e3, [], (
            f"{len(kernels)} kernel record(s) over {steps} steps: no step's sequence to list")
    common, count = sequences.most_common(1)[0]
    chosen = [step for step in per_step if tuple(kernels[i].name for i in step) == common]
    rows = [(name,
             sum(kernels[step[j]].time_range.elapsed_us() for step in chosen) / count / 1e3,
             sum(gaps[step[j]] for step in chosen) / count / 1e3)
            for j, name in enumerate(common)]
    note = ""
    if count < len(per_step):
        sizes = ", ".join(str(len(step)) for step in per_step)
        note = (f"{count} of the {len(per_step)} spans (between step markers, else equal slices) "
                f"launched this sequence of {len(common)} kernels (kernels per span: {sizes}; a "
                f"step's records may be split across spans or missing); the rows are those spans' means")
    return busy / steps / 1e3, (end - start) / steps / 1e3, rows, note


def split_steps(kernels, cuda_events, steps: int) -> list[list[int]]:
    """The indices of ``kernels`` (sorted by start) that each profiled step launched: a kernel
    belongs to the last GPU-side step marker that started before it (a step's marker spans only
    the kernels its own thread launched, not autograd's backward thread's, so its start is what
    counts), or, with no markers, ``steps`` equal slices."""
    starts = sorted(e.time_range.start for e in cuda_events if e.name.startswith("ProfilerStep"))
    if not starts:
        n = len(kernels) // steps
        return [list(range(i * n, (i + 1) * n)) for i in range(steps)]
    out = [[] for _ in starts]
    for i, k in enumerate(kernels):
        out[max(0, bisect_right(starts, k.time_range.start) - 1)].append(i)
    return out


def host_and_gpu_ms(step, steps: int):
    """Without the profiler: host ms per step (enqueueing only, no synchronize inside) and
    wall ms per step once the GPU has finished. Host time well under the wall time means the
    host runs ahead and cannot leave the GPU idle."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / steps * 1e3, (t2 - t0) / steps * 1e3


ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def allocator_calls_per_step(step, steps: int) -> dict:
    """cudaMalloc / cudaFree calls (and allocator retries, device-wide syncs) per step, from the
    caching allocator's counters: a cudaFree waits for the whole device, so one per step leaves
    the GPU idle while the host catches up."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    return {k: (after.get(k, 0) - before.get(k, 0)) / steps for k in ALLOCATOR_COUNTERS}


def profile(step, steps: int, warmup: int = 3, trace: str | None = None):
    from torch.profiler import ProfilerActivity, profile as torch_profile, schedule

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    # The profiler's own first step is traced and thrown away: in it, the first launch from each
    # thread stalled the host 2-2.5 ms (H200 trace, both our kernels and cuBLAS's), which showed
    # up as a 0.3-0.6 ms "gap" per step that unprofiled steps do not have.
    with torch_profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU],
                       schedule=schedule(wait=0, warmup=1, active=steps)) as prof:
        for i in range(steps + 1):
            step()
            if i == 0:
                torch.cuda.synchronize()  # the measured steps start on an idle GPU
            if i < steps:  # no step() after the last: leaving the block ends the window and keeps it
                prof.step()
        torch.cuda.synchronize()
    if trace:
        prof.export_chrome_trace(trace)
    return kernel_table(prof, steps)


def short(name: str, width: int = 70) -> str:
    """Our kernels' names start with the same long class path; what differs comes last."""
    if name.startswith("kernel_cutlass") and len(name) > width:
        return "cute ..." + name[-(width - 8):]
    return name if len(name) <= width else name[: width - 3] + "..."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench profile", description=__doc__.split("\n")[0])
    p.add_argument("--act", default="swiglu")
    p.add_argument("--h", type=int, default=14336)
    p.add_argument("--T", type=int, default=8192)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--trace-dir", default=None, help="also write each model's chrome trace here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile needs a CUDA GPU")

    from ..activations import get_activation
    from . import quack_baseline
    from .models import EagerMLP, build_parallel_mlp, chunked_w1, train_step

    gated = get_activation(args.act).gated
    f = 2 * args.h if gated else args.h
    T, d = args.T, args.d
    bf = torch.bfloat16
    w1 = (torch.randn(f, d, device="cuda") * d ** -0.5).to(bf)
    w2 = (torch.randn(d, args.h, device="cuda") * args.h ** -0.5).to(bf)
    x = torch.randn(T, d, device="cuda").to(bf).requires_grad_(True)
    dy = torch.randn(T, d, device="cuda").to(bf)
    flops = 3 * (2 * T * d * f + 2 * T * args.h * d)
    models = {
        "ours": build_parallel_mlp(w1, w2, args.act, args.h),
        "ours recompute": build_parallel_mlp(w1, w2, args.act, args.h, recompute=True),
        "eager": EagerMLP(chunked_w1(w1, gated), w2.clone(), args.act),
    }
    quack_off = quack_baseline.load()[1] or quack_baseline.off_fused_path(w1, w2, args.act)
    if quack_off:
        print(f"quack: not profiled ({quack_off})")
    else:
        models["quack"] = quack_baseline.build(w1, w2, args.act, args.h)
    print(f"{args.act} h={args.h} T={T} d={d} bf16, {args.steps} profiled steps; {torch.cuda.get_device_name()}")
    for name, model in models.items():
        step = lambda: train_step(model, x, dy)  # noqa: E731
        trace = None
        if args.trace_dir:
            os.makedirs(args.trace_dir, exist_ok=True)
            trace = os.path.join(args.trace_dir, name.replace(" ", "_") + ".json")
        busy, span, rows, note = profile(step, args.steps, trace=trace)
        host, wall = host_and_gpu_ms(step, args.steps)
        alloc = allocator_calls_per_step(step, args.steps)
        print(f"\n{name}: step span {span:.3f} ms ({flops / span / 1e9:.0f} TF/s), kernels {busy:.3f} ms, "
              f"gaps {span - busy:.3f} ms; unprofiled: host {host:.3f} ms/step, wall {wall:.3f} ms/step")
        print("  per step: " + ", ".join(f"{k} {v:g}" for k, v in alloc.items()))
        if note:
            print("  " + note)
        print(f"  {'kernel ms':>9s} {'idle before':>11s}")
        for kname, ms, gap in rows:
            print(f"  {ms:9.3f} {gap:11.3f}  {short(kname)}")
    return 0
