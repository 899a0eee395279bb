"""A model of PyTorch's CUDA caching allocator, for the order in which the fused step makes its
tensors.

    python3 tools/allocator_model.py

The sweep reads a step's peak as the bytes of the caching allocator's blocks (``bench sweep``:
a private pool, untimed steps, two measured). A block carved from a larger free one keeps the
remainder only where the remainder is large enough to split off (above 1 MiB in the large pool),
so two steps that ask for the same bytes can hold different blocks, by the order in which they
make and free their tensors. On the H200 (2026-12-03, `tools/step_memory_trace.py`, one
untimed step), T=512 d=1024 swiglu asked for 25.0 MiB at its peak in every variant and held
25.0 (eager), 26.0 (the fused step making dpreact before postact), 26.75 (with fc2's weight
gradient made before the dact) and, with postact made before dpreact, 25.0; T=512 d=8192 swiglu
held 159.44 against eager's 159.38, asking for 158.38. This model reproduces those figures from
the sizes alone, and prints, at the sweep's 30 shapes in both memory modes, what the blocks hold
above the requested peak for the fused step's order and for the alternatives. Its prediction
for the forward's group making y before postact, 159.375 at T=512 d=8192, measured so on the
H200 afterwards (2026-12-04, code 0889eb5).

What it models (c10/cuda/CUDACachingAllocator.cpp, one stream, no expandable segments): sizes
rounded up to 512 bytes; requests up to 1 MiB from the small pool's 2 MiB segments, larger ones
from the large pool, whose new segments are 20 MiB below 10 MiB and the size rounded up to 2 MiB
above; the smallest free block that fits (lowest address on a tie); a block split where the
remainder is at least 512 bytes (small pool) or above 1 MiB (large pool); a freed block merged
with free neighbours of its segment.
"""

from __future__ import annotations

import argparse
import bisect
import sys
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20
MIN_BLOCK = 512
SMALL_REQUEST = 1 * MIB
SMALL_SEGMENT = 2 * MIB
LARGE_SEGMENT = 20 * MIB
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB


@dataclass(eq=False)
class Block:
    addr: int
    size: int
    small: bool
    free: bool = True
    prev: "Block | None" = None
    next: "Block | None" = None


@dataclass
class CachingAllocatorModel:
    """One private pool: ``alloc(name, nbytes)``, ``free(name)``; the blocks held and the bytes
    asked for, now and at their peaks."""

    held: int = 0
    held_peak: int = 0
    asked: int = 0
    asked_peak: int = 0
    _pools: dict = field(default_factory=lambda: {True: [], False: []})
    _live: dict = field(default_factory=dict)
    _next_addr: int = 1 << 40

    def alloc(self, name: str, nbytes: int) -> Block:
        size = max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_REQUEST
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool.pop(i)[2]
        else:
            block = Block(self._next_addr, _segment_size(size), small)
            self._next_addr += block.size + (1 << 32)  # segments never adjacent
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_REQUEST):
            tail = Block(block.addr + size, rest, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            bisect.insort(pool, (tail.size, tail.addr, tail))
        block.free = False
        self._live[name] = (block, nbytes)
        self.held += block.size
        self.asked += nbytes
        self.held_peak = max(self.held_peak, self.held)
        self.asked_peak = max(self.asked_peak, self.asked)
        return block

    def free(self, name: str) -> None:
        block, nbytes = self._live.pop(name)
        self.held -= block.size
        self.asked -= nbytes
        block.free = True
        pool = self._pools[block.small]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                pool.remove((neighbour.size, neighbour.addr, neighbour))
        if block.prev is not None and block.prev.free:
            block = _merge(block.prev, block)
        if block.next is not None and block.next.free:
            block = _merge(block, block.next)
        bisect.insort(pool, (block.size, block.addr, block))

    def restart_peaks(self) -> tuple[int, int]:
        self.held_peak, self.asked_peak = self.held, self.asked
        return self.held, self.asked


def _segment_size(size: int) -> int:
    if size <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def _merge(first: Block, second: Block) -> Block:
    first.size += second.size
    first.next = second.next
    if second.next is not None:
        second.next.prev = first
    return first


@dataclass(frozen=True)
class StepOrder:
    """The order in which the fused step (default backend, launch groups) makes its tensors:
    the forward's outputs, the backward's dact outputs (the replayed preact comes first in
    recompute mode; "dW2" among them: fc2's fresh weight gradient made in the dact's group,
    while preact is still alive), and whether that gradient is made with fc1's weight gradient
    and dx in one group instead (postact then freed after that group)."""

    forward: tuple = ("preact", "y", "postact")
    dact: tuple = ("postact", "dpreact")
    dw2_with_dw1: bool = False


LAYER = StepOrder()  # what parallel_mlp/autograd.py makes


def step_events(tokens: int, d: int, h: int, gated: bool, order: StepOrder, recompute: bool,
                x: int, first: bool, elem: int = 2) -> list:
    """One training step's allocations and frees, as ``bench.models.train_step`` runs the layer:
    the previous step's weight gradients freed (not at the first), the forward, the backward,
    y dropped; dx becomes x's gradient, alive until x is used again."""
    features = 2 * h if gated else h
    size = {"preact": tokens * features, "postact": tokens * h, "y": tokens * d,
            "dpreact": tokens * features, "dW2": d * h, "dW1": features * d, "dx": tokens * d}
    size = {k: v * elem for k, v in size.items()}
    ev = [] if first else [("free", "dW1"), ("free", "dW2")]
    ev += [("alloc", n, size[n]) for n in order.forward if not (recompute and n == "preact")]
    ev += [("free", "postact")]
    dact = (("preact",) if recompute else ()) + tuple(
        "bwd_postact" if n == "postact" else n for n in order.dact)
    ev += [("alloc", n, size["postact" if n == "bwd_postact" else n]) for n in dact]
    ev += [("free", "preact")]
    if "dW2" not in order.dact:
        ev += [("alloc", "dW2", size["dW2"])]
    grads = [("alloc", "dW1", size["dW1"]), ("alloc", f"dx{x}", size["dx"])]
    postact_freed = [("free", "bwd_postact")]
    ev += grads + postact_freed if order.dw2_with_dw1 else postact_freed + grads
    ev += [("free", "dpreact"), ("free", "y")]
    return ev


def sweep_peak(tokens: int, d: int, h: int, gated: bool, order: StepOrder = LAYER,
               recompute: bool = False, warm: int = 3) -> tuple[float, float]:
    """(MiB held, MiB asked for) at the peak over the start, as the sweep measures a step
    (``bench.models.step_peak_memory``): ``warm`` untimed steps, each with its gradients cleared
    after it (STEADY_STEPS; the H200 figures above were read after one), then two measured
    steps on two inputs."""
    model = CachingAllocatorModel()
    for _ in range(warm):
        for ev in step_events(tokens, d, h, gated, order, recompute, 0, first=True):
            _apply(model, ev)
        for name in ("dW1", "dW2", "dx0"):
            model.free(name)
    held0, asked0 = model.restart_peaks()
    for x, first in ((0, True), (1, False)):
        for ev in step_events(tokens, d, h, gated, order, recompute, x, first):
            _apply(model, ev)
    return (model.held_peak - held0) / MIB, (model.asked_peak - asked0) / MIB


def _apply(model: CachingAllocatorModel, ev: tuple) -> None:
    if ev[0] == "alloc":
        model.alloc(ev[1], ev[2])
    else:
        model.free(ev[1])


ALTERNATIVES = {
    "the layer's": LAYER,
    "forward preact, postact, y": StepOrder(forward=("preact", "postact", "y")),
    "dact dpreact first": StepOrder(dact=("dpreact", "postact")),
    "dW2 made before the dact": StepOrder(dact=("postact", "dpreact", "dW2")),
    "dW2 with dW1 and dx": StepOrder(dw2_with_dw1=True),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from parallel_mlp.activations import get_activation
    from parallel_mlp.bench.sweep_grid import GRID

    for recompute in (False, True):
        print(f"\n{'recompute' if recompute else 'default'} mode: MiB the blocks hold above the "
              f"requested peak, per order ({', '.join(ALTERNATIVES)})")
        totals = dict.fromkeys(ALTERNATIVES, 0.0)
        for s in GRID:
            cells = []
            for name, order in ALTERNATIVES.items():
                held, asked = sweep_peak(s.tokens, s.d, s.shard, get_activation(s.act).gated,
                                         order, recompute)
                totals[name] += held - asked
                cells.append(f"{held - asked:6.2f}")
            print(f"  T={s.tokens:<6d} d={s.d:<5d} h={s.shard:<6d} {s.act:17s}" + "".join(cells))
        print("  sum" + " " * 41 + "".join(f"{v:6.2f}" for v in totals.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
