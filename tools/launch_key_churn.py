"""How often the fused function's launch groups meet new keys, which key fields change, and
what a capture costs.

    python3 tools/launch_key_churn.py [--shape T,d,h,act ...] [--steps 600] [--profile-captures]

A launch group replays a CUDA graph when its key (the addresses of what it reads and writes,
launch_graphs.py) repeats; a new key costs a plain run, and its second sighting a capture. For
each shape, the fused function (the sweep's ``ours_fused``: FusedParallelMLP on backend="auto",
four input sets in turn as the sweep rotates them) in three settings:

- alone, ``--steps`` steps;
- in turns with eager: 20 eager steps before every 20th step of ours;
- in rounds, as the sweep alternates its variants: eager, ours, ours in recompute mode and a
  second eager, 50 steps each per round, the order reversed every round, 12 rounds.

Per window (100 steps of ours, or one round) the groups' captures / plain runs / replays; the
graphs kept; each capture's host time; for the last window's new keys, which fields differ from
the site's latest key with the same first operand; with ``--profile-captures``, a cProfile of
all captures.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time

import torch

from parallel_mlp.bench.host_overhead import parse_shape
from parallel_mlp.bench.models import fused_and_eager

KINDS = ("captures", "plain", "replays")
ROUNDS = 12
STEPS_PER_TURN = 50


SHAPES = [(4096, 1024, 4096, "gelu_tanh_approx"), (512, 1024, 2816, "swiglu"),
          (8192, 1024, 2816, "swiglu")]


def differing_fields(previous: tuple, key: tuple) -> list[int]:
    """Positions at which two keys of one site differ."""
    return [i for i, (a, b) in enumerate(zip(previous, key)) if a != b]


def window_counts(log: list) -> str:
    """'captures/plain/replays' of the (site, key, kind) entries of one window."""
    c = collections.Counter(kind for _, _, kind in log)
    return "/".join(str(c[k]) for k in KINDS)


class Recorder:
    """Wraps GRAPHS.run and GRAPHS._capture: logs each group's (site, key, kind) and times each
    capture (profiled with ``profile``)."""

    def __init__(self, graphs, profile: bool):
        self.graphs, self.log, self.capture_s = graphs, [], []
        self.profiler = cProfile.Profile() if profile else None
        self._run, self._capture = graphs.run, graphs._capture
        graphs.run, graphs._capture = self.run, self.capture

    def close(self) -> None:
        """Give GRAPHS its own run and capture back."""
        self.graphs.run, self.graphs._capture = self._run, self._capture

    def capture(self, launches, device):
        t0 = time.perf_counter()
        if self.profiler is not None:
            self.profiler.enable()
        try:
            return self._capture(launches, device)
        finally:
            if self.profiler is not None:
                self.profiler.disable()
            self.capture_s.append(time.perf_counter() - t0)

    def run(self, site, key, launches, device):
        before = dict(self.graphs.stats)
        self._run(site, key, launches, device)
        after = self.graphs.stats
        kind = next((k for k in KINDS[:2] if after.get(k, 0) != before.get(k, 0)), "replays")
        self.log.append((site, key, kind))


def _stepper(models, inputs):
    count = collections.Counter()

    def step(name):
        model = models[name]
        x, dy = inputs[count[name] % len(inputs)]
        count[name] += 1
        for p in model.parameters():
            p.grad = None
        x.grad = None
        model(x).backward(dy)

    return step


def churn(shape, setting: str, steps: int, recorder: Recorder, graphs) -> None:
    graphs.clear()
    recorder.log.clear()
    recorder.capture_s.clear()
    models, inputs = fused_and_eager(shape, recompute_too=setting == "rounds")
    step = _stepper(models, inputs)
    windows, last = [], []

    def close_window():
        torch.cuda.synchronize()
        windows.append(window_counts(recorder.log))
        last[:] = recorder.log
        recorder.log.clear()

    if setting == "rounds":
        order = ["eager", "ours", "ours recompute", "eager copy"]
        for r in range(ROUNDS):
            for name in (order if r % 2 == 0 else order[::-1]):
                for _ in range(STEPS_PER_TURN):
                    step(name)
            close_window()
    else:
        for i in range(steps):
            if setting == "turns with eager" and i % 20 == 0:
                for _ in range(20):
                    step("eager")
            step("ours")
            if (i + 1) % 100 == 0:
                close_window()
    per = "round" if setting == "rounds" else "100 steps of ours"
    mean_us = 1e6 * sum(recorder.capture_s) / max(len(recorder.capture_s), 1)
    print(f"{','.join(map(str, shape))} {setting}: captures/plain/replays per {per}: "
          f"{' '.join(windows)}; {len(graphs)} graphs kept; {len(recorder.capture_s)} captures, "
          f"{mean_us:.0f} µs each on average")
    latest, shown = {}, 0
    for site, key, kind in last:
        previous = latest.get((site, key[1]))
        if kind != "replays" and previous is not None and shown < 3:
            print(f"    a new key at site {site[0]}: fields {differing_fields(previous, key)} "
                  "differ from the site's latest with the same first operand")
            shown += 1
        latest[(site, key[1])] = key
    print(f"    memory reserved {torch.cuda.memory_reserved() / 2**20:.0f} MiB, allocated "
          f"{torch.cuda.memory_allocated() / 2**20:.0f} MiB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", type=parse_shape,
                   help="T,d,h,act (repeatable; default: T=4096 d=1024 gelu_tanh_approx h=4096, "
                        "T=512 and T=8192 d=1024 swiglu h=2816)")
    p.add_argument("--steps", type=int, default=600, help="steps of ours alone and in turns")
    p.add_argument("--profile-captures", action="store_true",
                   help="a cProfile of the captures, printed at the end")
    args = p.parse_args(argv)
    if args.steps < 100:
        p.error(f"--steps {args.steps}: must be at least 100 (one window)")
    if not torch.cuda.is_available():
        raise SystemExit("launch_key_churn.py needs a CUDA GPU (it captures CUDA graphs)")
    from parallel_mlp.launch_graphs import GRAPHS

    recorder = Recorder(GRAPHS, args.profile_captures)
    try:
        for shape in args.shape or SHAPES:
            for setting in ("alone", "turns with eager", "rounds"):
                churn(shape, setting, args.steps, recorder, GRAPHS)
    finally:
        recorder.close()
    if recorder.profiler is not None:
        pstats.Stats(recorder.profiler).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
