"""The layer's host time with its kernels stubbed out, on any machine (no GPU needed).

    python -m parallel_mlp.bench host --stub [--calls 300] [--profile]

A host-bound step (T=512, d=1024, swiglu h=2816) costs what the layer's Python costs: the
autograd function, the operand checks, six launches' plans and packed arguments. With the
launcher replaced by a function that returns at once, and CPU tensors standing in for the GPU's,
that Python runs as it would before a real launch, so a change to the launch path can be timed
on a laptop or a CI machine. What it leaves out: the launcher itself (the DSL's C runtime: TMA
descriptors, cuLaunchKernelEx), the CUDA caching allocator (CPU tensors come from the CPU
allocator) and the backend's per-call operand check (``unsupported_reason``, which refuses CPU
tensors); on the H200 host those took ~6.7 us per launch and ~7.5 us per call (kernels/NOTES.md).
Prints µs per fwd+bwd, per forward, per ``ops.gemm`` of fc2's shape, and torch's own floor (an
autograd function that does nothing but allocate its outputs); ``--profile`` adds a cProfile.
On a shared 2-core VM the figures moved by up to 1.6x within minutes (fwd+bwd 154-278 µs,
2026-12-01), so compare variants within one process, side by side, not across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import time

import torch

from .host_overhead import STEP_SHAPE

T, D, H, ACT = STEP_SHAPE


class _NoLaunch:
    """Stands in for a compiled kernel: takes the packed arguments and launches nothing."""

    def __init__(self, key):
        self.key = key

    def run_compiled_program(self, args):
        return None


class _SeenOnGPU:
    """A CPU tensor as ops' per-tensor check sees it: on cuda:0, everything else its own."""

    device = torch.device("cuda", 0)

    def __init__(self, t: torch.Tensor):
        self._t = t

    def __getattr__(self, name):
        return getattr(self._t, name)


@contextlib.contextmanager
def stubbed_kernels(num_sms: int = 132):
    """Within this context, ops launches nothing: every kernel it looks up is a _NoLaunch, the
    device queries it makes answer as one GPU of ``num_sms`` SMs would, ops' per-tensor check
    (strides, alignment, dtype) sees CPU tensors as CUDA ones, and the cute backend takes them
    without its per-call check. The launch plans and cached sizes made meanwhile are dropped on
    both sides of it, so no stub outlives the context."""
    from .. import backends
    from ..kernels import compile as kcompile
    from ..kernels import ops

    tensor_reason = ops._tensor_reason

    def tensor_reason_on_gpu(t, name):
        return tensor_reason(_SeenOnGPU(t) if t.device.type == "cpu" else t, name)

    patches = [
        (kcompile, "get_kernel", lambda key, use_disk=True: _NoLaunch(key)),
        (ops, "_tensor_reason", tensor_reason_on_gpu),
        (ops, "_stream_handle", lambda index: 0),
        (ops, "_current_device", lambda: None),  # a CPU tensor's device index: no device switch
        (ops, "_num_sms", lambda index: num_sms),
        (torch.cuda, "current_device", lambda: 0),
        (backends.CuteBackend, "unsupported_reason", classmethod(lambda cls, *tensors: None)),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]

    def forget():
        ops._plans.clear()
        ops._transient_bytes.cache_clear()

    forget()
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        forget()


def _us_per_call(fn, calls: int, rounds: int = 5, clock=time.perf_counter) -> float:
    """Median over ``rounds`` of the µs per call of ``calls`` back-to-back calls."""
    for _ in range(3):
        fn()
    per_round = []
    for _ in range(rounds):
        t0 = clock()
        for _ in range(calls):
            fn()
        per_round.append((clock() - t0) / calls * 1e6)
    return statistics.median(per_round)


@contextlib.contextmanager
def launch_groups(replayed: bool):
    """Within this context (and stubbed_kernels'), the fused function runs its launch groups
    (launch_graphs.py) on the CPU tensors, through stand-ins for CUDA graphs: ``replayed``, every
    group after its first call replays a graph that launches nothing (the graph launch itself,
    a call into the driver, is not in the figure); else every group's key is new (a loop whose
    tensors never sit where they did), so each runs its launches into its outputs made ahead."""
    from .. import autograd
    from ..launch_graphs import LaunchGraphs

    graphs = LaunchGraphs(capture=lambda launches, device: None,
                          replay=lambda graph, launches: None, capturing=lambda: False,
                          max_misses=1 << 62)
    graphs.enabled = True
    run, calls = graphs.run, iter(range(1 << 62))

    def keyed(site, key, launches, device):
        run(site, site if replayed else (key, next(calls)), launches, device)

    graphs.run = keyed
    saved = autograd.GRAPHS, autograd._kernels_here
    autograd.GRAPHS = graphs
    autograd._kernels_here = lambda ops, x2d: True  # the stubbed kernels run on CPU tensors
    try:
        yield graphs
    finally:
        autograd.GRAPHS, autograd._kernels_here = saved


# The figure of the layer as a user builds it (backend="auto"), whose module forward takes the
# fast lane to the fused function; the other step figures are backend="cute"'s full path.
AUTO_LANE = "fwd+bwd, auto through the module's fast lane, launch groups replayed"


class _Empty(torch.autograd.Function):
    """torch's floor for an autograd function of the layer's arity: saves its inputs, allocates
    its outputs, computes nothing."""

    @staticmethod
    def forward(ctx, x, w1, w2):
        ctx.save_for_backward(x, w1, w2)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, w1, w2 = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w1), torch.empty_like(w2)


def measure(calls: int, profile: bool = False, out=print) -> dict:
    """The figures the command prints, as {name: µs}."""
    from ..kernels import ops
    from ..layer import ParallelMLP

    torch.manual_seed(0)
    with stubbed_kernels():
        mlp = ParallelMLP(D, H, activation=ACT, backend="cute", dtype=torch.bfloat16)
        # backend="auto", as a user builds the layer: from its second call the module's forward
        # takes its fast lane to the fused function (ParallelMLP.forward)
        auto = ParallelMLP(D, H, activation=ACT, backend="auto", dtype=torch.bfloat16)
        x = torch.randn(T, D, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(T, D, dtype=torch.bfloat16)
        w1, w2 = mlp.fc1.weight, mlp.fc2.weight
        postact = torch.randn(T, H, dtype=torch.bfloat16)

        def step():
            x.grad = w1.grad = w2.grad = None
            mlp(x).backward(dy)

        def auto_step():
            x.grad = auto.fc1.weight.grad = auto.fc2.weight.grad = None
            auto(x).backward(dy)

        def empty_step():
            x.grad = w1.grad = w2.grad = None
            _Empty.apply(x, w1, w2).backward(dy)

        figures = {
            "fwd+bwd": _us_per_call(step, calls),
            "forward": _us_per_call(lambda: mlp(x), calls),
            "ops.gemm (fc2's shape)": _us_per_call(lambda: ops.gemm(postact, w2.t(), checked=True), calls),
            "empty autograd function fwd+bwd": _us_per_call(empty_step, calls),
        }
        for replayed, name in ((True, "fwd+bwd, launch groups replayed (graph launches not counted)"),
                               (False, "fwd+bwd, launch groups with every key new")):
            with launch_groups(replayed):
                figures[name] = _us_per_call(step, calls)
        with launch_groups(True):
            figures[AUTO_LANE] = _us_per_call(auto_step, calls)
        out(f"host µs with the kernels stubbed out (no launch), T={T} d={D} {ACT} h={H}, bf16 on "
            f"the CPU; median of 5 rounds of {calls} calls")
        for name, us in figures.items():
            out(f"  {us:8.1f}  {name}")
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                step()
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            out(f"cProfile of {calls} fwd+bwd:")
            out(text.getvalue())
    return figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench host --stub",
                                description=__doc__.split("\n")[0])
    p.add_argument("--stub", action="store_true", help="(this mode)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--profile", action="store_true", help="add a cProfile of the steps")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error(f"--calls must be >= 1, got {args.calls}")
    measure(args.calls, args.profile)
    return 0
