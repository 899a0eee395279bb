"""The most a plan kept per call site could take off the fused step's host time (no GPU needed).

    python3 tools/decision_cost.py [--rounds 31] [--steps 200] [--backend auto]

A plan kept per call site would skip what a repeated fused step decides the same way every time:
the backend (``backends.resolve``, ``backends.for_step``), whether the launches run in groups
(``autograd._in_groups``), each group's site (``autograd._site``) and the tensors' parts of the
groups' keys (``launch_graphs.tensor_key``). Its saving is at most what those cost. This tool
times ``bench host --stub``'s step (T=512 d=1024 swiglu, the kernels stubbed, the launch groups
replayed, device threads off) as the code is (``as_is``) and with those functions answering
constants (``constant``: the backend the first step chose, groups on, a site per phase kept in a
dict, a key of the address alone), in rounds that alternate the order, and prints the median µs
per step of each and the paired median of constant / as_is. What is left above ``constant`` is
the rest of the path (autograd, the allocations, the launch groups' own bookkeeping), which no
plan kept per site removes.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from parallel_mlp import autograd
from parallel_mlp.bench.host_stub import ACT, D, H, T, launch_groups, stubbed_kernels
from parallel_mlp.layer import ParallelMLP

DECISIONS = ("resolve", "for_step", "_in_groups", "_site", "tensor_key")


@contextlib.contextmanager
def constant_decisions(backend):
    """Within this context the fused function's per-call decisions answer constants: ``backend``
    for the ops, groups on, one site per phase and its options, a tensor's address for its key."""
    saved = {name: getattr(autograd, name) for name in DECISIONS}
    sites = {}
    constants = {
        "resolve": lambda name, *tensors: backend,
        "for_step": lambda ops, *sizes: ops,
        "_in_groups": lambda *args: True,
        "_site": lambda phase, ops, x2d, *more: sites.setdefault((phase, ops) + more,
                                                                 (phase, ops) + more),
        "tensor_key": lambda t: t.data_ptr(),
    }
    try:
        for name, value in constants.items():
            setattr(autograd, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(autograd, name, value)


def measure(rounds: int, steps: int, backend: str) -> dict[str, list[float]]:
    """{"as_is": [µs per step per round], "constant": [...]} in rounds of alternating order."""
    torch.manual_seed(0)
    times = {"as_is": [], "constant": []}
    with torch.autograd.set_multithreading_enabled(False), stubbed_kernels(), \
            launch_groups(True):
        mlp = ParallelMLP(D, H, activation=ACT, backend=backend, dtype=torch.bfloat16)
        x = torch.randn(T, D, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(T, D, dtype=torch.bfloat16)
        w1, w2 = mlp.fc1.weight, mlp.fc2.weight
        chosen = []
        for_step = autograd.for_step

        def remember(ops, *sizes):
            chosen.append(for_step(ops, *sizes))
            return chosen[-1]

        def step():
            x.grad = w1.grad = w2.grad = None
            mlp(x).backward(dy)

        autograd.for_step = remember
        try:
            step()  # the ops the step runs on, for the constant variant
        finally:
            autograd.for_step = for_step
        variants = {"as_is": contextlib.nullcontext,
                    "constant": lambda: constant_decisions(chosen[0])}
        for r in range(rounds):
            for name in (("as_is", "constant") if r % 2 == 0 else ("constant", "as_is")):
                with variants[name]():
                    for _ in range(max(1, steps // 10)):
                        step()
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        step()
                    times[name].append((time.perf_counter() - t0) / steps * 1e6)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--backend", default="auto", choices=("auto", "cute"))
    args = parser.parse_args(argv)
    times = measure(args.rounds, args.steps, args.backend)
    paired = statistics.median(c / a for c, a in zip(times["constant"], times["as_is"]))
    print(f"T={T} d={D} {ACT} h={H}, backend={args.backend!r}, kernels stubbed, groups replayed, "
          f"{args.rounds} rounds of {args.steps} steps: µs per fwd+bwd, median over rounds")
    for name, values in times.items():
        print(f"  {name:9s} {statistics.median(values):7.1f}")
    print(f"  constant / as_is, paired median: {paired:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
