"""One step's allocations, ours beside eager: where the caching allocator's blocks go.

    python3 tools/step_memory_trace.py [--shape 512,1024,2816,swiglu] [--recompute] [--warm 3]

The sweep's step peak (``bench.models.step_peak_memory``: a private pool of the caching
allocator, STEADY_STEPS untimed steps, then measured steps) reads the bytes of the allocator's
blocks, and a block it does not split counts whole. Where ours and eager ask for the same bytes
at their peaks but their blocks differ (T=512 d=1024 swiglu, one untimed step: 26.0 against
25.0 MiB, the requested bytes equal), the difference is in which free block each request took.
This tool runs the same measurement with the allocator's history recorded over the measured
steps and prints, for each variant, the step peak of the blocks held and of the bytes asked
for, then every allocation and free in order: its size as the history records it (what the
tensor asked for, to 512 bytes), the running total of those over the start, and the line of the
library or of the caller that asked (the deepest frame in this repository's code), with the
peak marked. It needs a GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parallel_mlp.bench.models import (STEADY_STEPS, EagerMLP, build_parallel_mlp,  # noqa: E402
                                       chunked_w1, clear_grads, fc1_features,
                                       own_allocator_pool, train_step)

MIB = 2 ** 20


def _frame(entry: dict) -> str:
    """The deepest frame of the entry's stack in this repository's code, else the first one."""
    frames = entry.get("frames") or []
    for f in frames:
        name = f.get("filename", "")
        if "parallel_mlp" in name or "kernels/" in name or "step_memory_trace" in name:
            return f"{Path(name).name}:{f.get('line')} {f.get('name')}"
    return f"{Path(frames[0]['filename']).name}:{frames[0]['line']}" if frames else "?"


def trace_steps(model, xs, dys, device, warm: int, steps: int) -> tuple[list[dict], int, int]:
    """(the allocator's trace entries of the measured steps, their peak over the start in bytes,
    the requested bytes' peak over the start), as step_peak_memory measures it: ``warm``
    untimed steps in the private pool, then ``steps`` measured."""
    clear_grads(model, xs)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    with own_allocator_pool(device):
        for _ in range(warm):
            train_step(model, xs[0], dys[0])
            clear_grads(model, xs)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        requested_before = torch.cuda.memory_stats(device).get("requested_bytes.all.current", 0)
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
        for i in range(steps):
            train_step(model, xs[i % len(xs)], dys[i % len(dys)])
        torch.cuda.synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = torch.cuda.max_memory_allocated(device) - before
        requested = torch.cuda.memory_stats(device).get("requested_bytes.all.peak", 0)
        clear_grads(model, xs)
    torch.cuda.empty_cache()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return snapshot["device_traces"][index], peak, requested - requested_before


def report(name: str, entries: list[dict], peak: int, requested: int, out=print) -> None:
    out(f"\n{name}: step peak over its start {peak / MIB:.2f} MiB "
        f"(requested {requested / MIB:.2f})")
    live, top, rows = 0, 0, []
    for e in entries:
        action = e["action"]
        if action == "alloc":
            live += e["size"]
        elif action == "free_completed":
            live -= e["size"]
        else:
            continue
        top = max(top, live)
        rows.append((action, e["size"], live, _frame(e)))
    for action, size, running, where in rows:
        mark = "  <- peak" if running == top else ""
        out(f"  {action:15s} {size / MIB:9.3f} MiB  asked {running / MIB:9.3f}  {where}{mark}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="512,1024,2816,swiglu", help="T,d,h,activation")
    p.add_argument("--recompute", action="store_true", help="ours in recompute mode")
    p.add_argument("--warm", type=int, default=STEADY_STEPS,
                   help=f"untimed steps before the measured ones (the sweep's: {STEADY_STEPS})")
    p.add_argument("--steps", type=int, default=2, help="measured steps (the sweep's: 2)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_memory_trace needs a CUDA GPU (it reads the caching allocator's "
                         "history)")
    tokens, d, h, act = args.shape.split(",")
    tokens, d, h = int(tokens), int(d), int(h)
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16
    w1 = torch.randn(fc1_features(act, h), d, device=device, dtype=dtype, generator=gen) * d ** -0.5
    w2 = torch.randn(d, h, device=device, dtype=dtype, generator=gen) * h ** -0.5
    xs = [torch.randn(tokens, d, device=device, dtype=dtype, generator=gen).requires_grad_()
          for _ in range(2)]
    dys = [torch.randn(tokens, d, device=device, dtype=dtype, generator=gen) for _ in range(2)]
    models = {
        "ours" + (" recompute" if args.recompute else ""):
            build_parallel_mlp(w1, w2, act, h, recompute=args.recompute),
        "eager": EagerMLP(chunked_w1(w1, fc1_features(act, h) != h), w2.clone(), act),
    }
    print(f"T={tokens} d={d} {act} h={h}, bf16; {args.steps} measured steps per variant in a "
          f"private pool after {args.warm} untimed")
    for name, model in models.items():
        report(name, *trace_steps(model, xs, dys, device, args.warm, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
