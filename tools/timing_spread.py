"""How far held timings of host-bound steps scatter: eager against a second copy of itself (an
A/A comparison) and ours, held in turns of several lengths for the same total time, each setting
repeated (a GPU is needed).

    python3 tools/timing_spread.py [--repeats 3]

Behind the sweep's SHORT_TURN_S: a step whose GPU work is shorter than its launches takes the
host's time, and the host's speed wanders over seconds, so two copies of one step held in long
turns can differ by more than the effects being measured.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from parallel_mlp.bench.models import EagerMLP, build_parallel_mlp, chunked_w1, train_step
from parallel_mlp.bench.timing import median_ms_held

SHAPES = [(512, 1024, 2816, "swiglu"), (4096, 1024, 4096, "gelu_tanh_approx"),
          (2048, 2048, 2816, "swiglu")]
SETTINGS = [(0.8, 2), (0.2, 8), (0.05, 32)]  # (seconds per turn, turns): 1.6 s each


def rand(*shape):
    return (torch.randn(*shape, device="cuda") * 0.05).bfloat16()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tools/timing_spread.py needs a CUDA GPU (it times held CUDA steps)")
    records = []
    for T, d, h, act in SHAPES:
        gated = act == "swiglu"
        w1, w2 = rand((2 if gated else 1) * h, d), rand(d, h)
        xs = [rand(T, d).requires_grad_(True) for _ in range(2)]
        dys = [rand(T, d) for _ in range(2)]
        models = {"eager": EagerMLP(chunked_w1(w1, gated), w2.clone(), act),
                  "eager copy": EagerMLP(chunked_w1(w1, gated), w2.clone(), act),
                  "ours": build_parallel_mlp(w1, w2, act, h)}

        def stepper(model):
            calls = [0]

            def step():
                i = calls[0] % 2
                calls[0] += 1
                train_step(model, xs[i], dys[i])
            return step

        fns = [stepper(m) for m in models.values()]
        for hold_s, rounds in SETTINGS:
            for rep in range(args.repeats):
                eager, copy, ours = median_ms_held(fns, hold_s=hold_s, rounds=rounds)
                rec = {"T": T, "d": d, "h": h, "act": act, "hold_s": hold_s, "rounds": rounds,
                       "repeat": rep, "ms": {"eager": eager, "eager copy": copy, "ours": ours},
                       "eager / copy": eager / copy, "eager / ours": eager / ours}
                records.append(rec)
                print(f"T={T} d={d} {act} h={h}  {hold_s:g} s x {rounds:2d}  eager {eager:.3f} "
                      f"copy {copy:.3f} ours {ours:.3f} ms   eager/copy {eager / copy:.3f}  "
                      f"eager/ours {eager / ours:.3f}", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "timing_spread.json"), "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
