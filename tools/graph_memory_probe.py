"""What the fused function's kept CUDA graphs cost in device memory.

    python3 tools/graph_memory_probe.py [--shape T,d,h,act] [--input-sets N]

The fused function at one shape over N input sets, so that its launch groups meet N keys each:
three passes over the sets with the launch graphs off, then three with them on (the second
pass captures, the third replays), then the graphs dropped. After each phase: the caching
allocator's reserved and allocated bytes, and the device's free bytes as the driver reports
them (``torch.cuda.mem_get_info``), which also counts what the allocator does not see: the
instantiated graphs' own memory. Printed: those readings and, per kept graph, the difference
the graphs made to each.
"""

from __future__ import annotations

import argparse
import gc
import sys

import torch

from parallel_mlp.bench.host_overhead import parse_shape
from parallel_mlp.bench.models import fused_and_eager, train_step

MIB = 2 ** 20


def reading() -> dict:
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    return {"free": free, "reserved": torch.cuda.memory_reserved(),
            "allocated": torch.cuda.memory_allocated()}


def show(name: str, r: dict) -> None:
    print(f"  {name:28s} free {r['free'] / MIB:10.1f} MiB  reserved {r['reserved'] / MIB:8.1f}"
          f"  allocated {r['allocated'] / MIB:8.1f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=parse_shape, default=(512, 1024, 2816, "swiglu"),
                   help="T,d,h,act (default: 512,1024,2816,swiglu)")
    p.add_argument("--input-sets", type=int, default=64)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("graph_memory_probe.py needs a CUDA GPU")
    from parallel_mlp.launch_graphs import GRAPHS

    models, inputs = fused_and_eager(args.shape, args.input_sets)
    model = models["ours"]

    def passes(n):
        for _ in range(n):
            for x, dy in inputs:
                train_step(model, x, dy)

    was_enabled = GRAPHS.enabled
    GRAPHS.clear()
    try:
        GRAPHS.enabled = False
        passes(3)
        off = reading()
        GRAPHS.enabled = True
        passes(3)
        on = reading()
        graphs, stats = len(GRAPHS), dict(GRAPHS.stats)
    finally:
        GRAPHS.clear()
        GRAPHS.enabled = was_enabled
    gc.collect()
    torch.cuda.empty_cache()
    dropped = reading()
    print(f"== {','.join(map(str, args.shape))}, {args.input_sets} input sets: {graphs} graphs "
          f"kept, groups {stats}")
    show("graphs off, 3 passes", off)
    show("graphs on, 3 passes", on)
    show("graphs dropped, cache emptied", dropped)
    if graphs:
        print("  per graph, on against off: " + ", ".join(
            f"{key} {(on[key] - off[key]) / graphs / 1024:+.1f} KiB"
            for key in ("free", "reserved", "allocated")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
