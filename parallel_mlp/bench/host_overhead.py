"""Where the host time of one op launch goes (a GPU is needed to launch).

    python -m parallel_mlp.bench host [--calls 300] [--step [--shape T,d,h,act] | --stub [--profile]]

A 256^3 GEMM runs for a few microseconds, so back-to-back launches measure the host side alone:
the Python of `ops.gemm`, the packed launch arguments, the config and kernel lookup, and the
compiled launcher (which encodes the TMA descriptors and launches); beside them, the DSL's own
argument path (from_dlpack tensors) that ops no longer takes. Prints each part's µs per call, and
a cProfile of the whole op's calls, to show what a faster launch path has to remove.

``--step`` looks at a whole host-bound fwd+bwd instead (T=512, d=1024, swiglu h=2816 unless
``--shape`` names another): host time per step of ours (the fused kernels, ``backend="auto"``'s small step, the torch backend) and of
eager with autograd's device threads on and off; for ours, where the
step's time goes (forward, the wait before the backward starts on the device thread, the
backward's body, the return to the caller); the same op launched on the main thread and on a
worker thread; and a cProfile of the backward's body where autograd runs it. Each model's step
also runs once under ``torch.cuda.set_sync_debug_mode("error")``: a step that waits for the GPU
would pay the GPU's time on top of the host's, and is named.

``--step --phases`` compares ours on ``auto`` (its small step), the small step's ops without the
layer, and eager, in interleaved rounds (their order reversed every round, as the held timing
does) with autograd's device threads on and off: each step's host time split into clearing the
grads, the forward and the backward (until ``y.backward`` returns), and a pure-Python loop timed
in every round, so that a slow or drifting host shows as such. Where a host-bound step of ours
loses to eager's, it says in which part.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import pstats
import statistics
import sys
import threading
import time

import torch

from ..autograd import replays_launches
from .timing import host_us_per_call, turn_order

# The host-bound step the --step and --stub probes run: tokens, width, hidden size, activation.
STEP_SHAPE = (512, 1024, 2816, "swiglu")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--stub" in argv:
        from .host_stub import main as stub_main

        return stub_main(argv)
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench host", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--step", action="store_true", help="a whole host-bound fwd+bwd (see above)")
    p.add_argument("--forward", action="store_true",
                   help="with --step: the forward alone, the models interleaved in rounds, and the "
                        "layer's checks and dispatch one by one (what the layer's Python adds)")
    p.add_argument("--phases", action="store_true",
                   help="with --step: ours on auto, the small step's ops alone and eager in "
                        "interleaved rounds, each step's host time split into clearing grads, "
                        "forward and backward, device threads on and off")
    p.add_argument("--shape", type=parse_shape, default=STEP_SHAPE, metavar="T,d,h,act",
                   help="--step's shape (default %(default)s)")
    p.add_argument("--stub", action="store_true",
                   help="the same step's host time with the kernels stubbed out, on any machine "
                        "(no GPU; see host_stub.py; --profile adds a cProfile)")
    args = p.parse_args(argv)
    if (args.forward or args.phases) and not args.step:
        p.error("--forward and --phases look at a whole step: give them with --step")
    if args.forward and args.phases:
        p.error("--forward and --phases are two probes: give one of them")
    if not torch.cuda.is_available():
        raise SystemExit("host needs a CUDA GPU")
    if args.step:
        if args.forward:
            return forward_probe(args.calls, args.shape)
        if args.phases:
            return phase_probe(args.calls, args.shape)
        return step_probe(args.calls, args.shape)

    from ..kernels import aot_runtime, ops
    from ..kernels.compile import KernelKey, _export_name, compile_kernel, get_kernel, object_path
    from ..kernels.epilogue_spec import EpilogueSpec

    n = args.calls
    a = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    b = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    d = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    bk = b.t()
    spec = EpilogueSpec("store")

    def key():
        cfg = ops._pick_config(spec, a, bk, torch.bfloat16, None, False)
        return KernelKey(spec, cfg, "bfloat16", ops._major(a), ops._major(bk), "bfloat16", None)

    def lookup():
        return get_kernel(key())

    lookup()  # compiled (and exported) or loaded from the disk cache: what ops launches
    # The same kernel both ways: loaded through the DSL's C runtime (what a process whose
    # kernels are cached uses), and as the DSL's own compiled function (a fresh compile).
    c_fn = None
    if aot_runtime.available() and object_path(key()).exists():
        c_fn = aot_runtime.LoadedKernel(object_path(key()), _export_name(key()))
    dsl_fn = compile_kernel(key())
    handle = torch.cuda.current_stream().cuda_stream
    # A copy of the packed structs: ops reuses its buffer on the next launch of this thread.
    addresses, buf = ops._launch_args((a, bk, d), handle)
    _alive = ctypes.create_string_buffer(buf.raw[:len(addresses) * ops._SLOT])
    packed = [ctypes.addressof(_alive) + i * ops._SLOT for i in range(len(addresses))]
    args_cute = [ops._to_cute(t) for t in (a, bk, d)]
    stream = ops._stream()

    def dsl_call():
        dsl_fn(args_cute[0], args_cute[1], args_cute[2], None, None, None, None, None, stream)

    def device_context():
        with torch.cuda.device(a.device):
            pass

    parts = {
        "torch.mm (reference)": lambda: torch.mm(a, b),
        "ops.gemm, whole op": lambda: ops.gemm(a, b, out=d),
        "  _launch_args (3 tensors + stream)": lambda: ops._launch_args((a, bk, d), handle),
        "  config + KernelKey + get_kernel": lookup,
        "  launcher via the C runtime, packed args": (lambda: c_fn.run_compiled_program(packed)) if c_fn else None,
        "  launcher via the DSL's function, packed args": lambda: dsl_fn.run_compiled_program(packed),
        "  (the DSL's path: 3 x from_dlpack + dynamic layout)": lambda: [ops._to_cute(t) for t in (a, bk, d)],
        "  (the DSL's path: call with cute tensors)": dsl_call,
        "  torch.cuda.device(...) context": device_context,
    }
    print(f"host µs per call ({n} back-to-back calls, 256^3 bf16); {torch.cuda.get_device_name()}")
    for name, f in parts.items():
        if f is None:
            print(f"  {'-':>8s}  {name} (not available)")
            continue
        print(f"  {host_us_per_call(f, calls=n, warmup=5):8.1f}  {name}")

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        ops.gemm(a, b, out=d)
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())
    return 0


class _SmallStepOnly(torch.nn.Module):
    """small_step.small_step on the layer's weights with none of the layer around it (no checks,
    no dispatch): what the layer's own Python adds to a small step is the difference."""

    def __init__(self, w1, w2, act: str):
        super().__init__()
        from ..activations import get_activation

        self.w1, self.w2 = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())
        self.act = get_activation(act)

    def forward(self, x):
        from ..small_step import small_step

        return small_step(x, self.w1, None, self.w2, None, self.act)


def _on_worker_thread(fn):
    """fn() run on a new thread; returns its result."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def parse_shape(text: str) -> tuple[int, int, int, str]:
    """"T,d,h,act" -> (T, d, h, act), e.g. "512,1024,512,gelu_tanh_approx"."""
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts[:3]):
        raise argparse.ArgumentTypeError(f"--shape must be T,d,h,activation, got {text!r}")
    from ..activations import get_activation

    act = get_activation(parts[3].strip()).name
    return int(parts[0]), int(parts[1]), int(parts[2]), act


def _syncs(step) -> str:
    """'' when one call of ``step`` never waits for the GPU, else the error naming the wait."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return ""
    except RuntimeError as e:
        return str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")


def forward_probe(calls: int, shape: tuple[int, int, int, str] = STEP_SHAPE,
                  rounds: int = 15) -> int:
    """Host µs per forward (autograd recording, outputs dropped) of ours on ``auto``, the small
    step's ops alone and eager, and of the layer's checks and dispatch called one by one; every
    entry timed once per round, rounds interleaved, min and median printed: the host's speed
    drifts, so only entries timed side by side compare."""
    from .. import checks, small_step
    from ..activations import get_activation
    from .models import EagerMLP, build_parallel_mlp, chunked_w1

    T, d, h, act = shape
    a = get_activation(act)
    w1 = torch.randn(2 * h if a.gated else h, d, device="cuda").to(torch.bfloat16)
    w2 = torch.randn(d, h, device="cuda").to(torch.bfloat16)
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ours = build_parallel_mlp(w1, w2, act, h, backend="auto")
    alone = _SmallStepOnly(w1, w2, act)
    eager = EagerMLP(chunked_w1(w1, a.gated), w2, act)
    W1, W2, tp = ours.fc1.weight, ours.fc2.weight, ours.tp
    entries = {
        "ours, auto: module call": lambda: ours(x),
        "small step's ops alone: module call": lambda: alone(x),
        "eager: module call": lambda: eager(x),
        "check_shards": lambda: checks.check_shards(x, W1, None, W2, None, a),
        # ParallelMLP keeps the rule's row limit; parallel_mlp_func asks it on every call
        "small_step.applies, as parallel_mlp_func asks it": lambda: small_step.applies(
            x.numel() // x.shape[-1], W1.shape[1], W1.shape[0], W2.shape[1], W2.shape[0],
            device_type=x.device.type, backend="auto", tp_size=tp.size, recompute=False,
            fuse_grad_accum=False, compiling=torch.compiler.is_compiling(),
            gate_ops=a.gate is not None, launch_graphs=replays_launches(None, None)),
        "torch.compiler.is_compiling": torch.compiler.is_compiling,
        "empty lambda": lambda: None,
    }
    times = {name: [] for name in entries}
    for _ in range(rounds):
        for name, fn in entries.items():
            times[name].append(host_us_per_call(fn, calls=calls, warmup=3))
    print(f"host µs per call, T={T} d={d} {act} h={h}; {rounds} interleaved rounds of {calls} "
          f"calls; {torch.cuda.get_device_name()}")
    for name, ts in times.items():
        print(f"  min {min(ts):8.2f}  median {statistics.median(ts):8.2f}  {name}")
    return 0


PHASES = ("clear grads", "forward", "backward", "step")


def step_phases(model: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, calls: int,
                clock=time.perf_counter, sync=torch.cuda.synchronize) -> dict[str, float]:
    """Median host µs of each phase (PHASES) over ``calls`` back-to-back training steps of
    ``model``, grads cleared as models.train_step clears them; one ``sync`` after the last."""
    from .models import parameter_list

    params = parameter_list(model)
    marks = []
    for _ in range(calls):
        t0 = clock()
        for p in params:
            p.grad = None
        x.grad = None
        t1 = clock()
        y = model(x)
        t2 = clock()
        y.backward(dy)
        marks.append((t0, t1, t2, clock()))
    sync()
    spans = [(b - a, c - b, d - c, d - a) for a, b, c, d in marks]
    return {name: statistics.median(s[k] for s in spans) * 1e6 for k, name in enumerate(PHASES)}


def _python_loop_us(n: int = 2000, repeats: int = 20) -> float:
    """µs of a plain Python loop (the host's own speed, with no torch in it): min of repeats."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        s = 0
        for i in range(n):
            s += i
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def phase_probe(calls: int, shape: tuple[int, int, int, str] = STEP_SHAPE,
                rounds: int = 9, device: str = "cuda") -> int:
    from ..activations import get_activation
    from .models import EagerMLP, build_parallel_mlp, chunked_w1, train_step

    T, d, h, act = shape
    gated = get_activation(act).gated
    torch.manual_seed(0)
    w1 = (torch.randn(2 * h if gated else h, d, device=device) * d ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(d, h, device=device) * h ** -0.5).to(torch.bfloat16)
    x = torch.randn(T, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, d, device=device, dtype=torch.bfloat16)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    models = {"ours, auto": build_parallel_mlp(w1, w2, act, h, backend="auto"),
              "the small step's ops alone": _SmallStepOnly(w1, w2, act),
              "eager": EagerMLP(chunked_w1(w1, gated), w2, act)}
    for model in models.values():
        for _ in range(5):
            train_step(model, x, dy)
    runs = {(name, threads): [] for name in models for threads in (True, False)}
    keys = list(runs)
    loop = []
    for r in range(rounds):
        loop.append(_python_loop_us())
        for name, threads in (keys[k] for k in turn_order(len(keys), r)):
            with torch.autograd.set_multithreading_enabled(threads):
                runs[name, threads].append(step_phases(models[name], x, dy, calls, sync=sync))
    print(f"host µs per fwd+bwd by phase, T={T} d={d} {act} h={h}; {rounds} interleaved rounds "
          f"of {calls} steps (median within a round; min and median over rounds); "
          f"{torch.cuda.get_device_name() if device == 'cuda' else device}")
    print(f"  a 2000-step Python loop: min {min(loop):.1f} µs, median {statistics.median(loop):.1f},"
          f" max {max(loop):.1f}")
    for (name, threads), out in runs.items():
        cells = "  ".join(f"{phase} {min(r[phase] for r in out):6.1f} / "
                          f"{statistics.median(r[phase] for r in out):6.1f}" for phase in PHASES)
        print(f"  {name:28s} threads {'on ' if threads else 'off'}  {cells}")
    return 0


def step_probe(calls: int, shape: tuple[int, int, int, str] = STEP_SHAPE) -> int:
    from ..autograd import ParallelMLPFunction
    from ..kernels import ops
    from ..activations import get_activation
    from .models import EagerMLP, build_parallel_mlp, chunked_w1, train_step

    T, d, h, act = shape
    gated = get_activation(act).gated
    torch.manual_seed(0)
    w1 = (torch.randn(2 * h if gated else h, d, device="cuda") * d ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(d, h, device="cuda") * h ** -0.5).to(torch.bfloat16)
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, d, device="cuda", dtype=torch.bfloat16)
    models = {
        "ours": build_parallel_mlp(w1, w2, act, h, backend="cute"),
        "ours, auto": build_parallel_mlp(w1, w2, act, h, backend="auto"),
        "ours, torch backend": build_parallel_mlp(w1, w2, act, h, backend="torch"),
        "the small step's ops alone": _SmallStepOnly(w1, w2, act),
        "eager": EagerMLP(chunked_w1(w1, gated), w2, act),
    }
    print(f"host µs per fwd+bwd, T={T} d={d} {act} h={h}, {calls} back-to-back steps; "
          f"{torch.cuda.get_device_name()}")
    for name, model in models.items():
        waits = _syncs(lambda: train_step(model, x, dy))
        if waits:
            print(f"  {name}: its step waits for the GPU: {waits}")
        for threads in (True, False):
            with torch.autograd.set_multithreading_enabled(threads):
                us = host_us_per_call(lambda: train_step(model, x, dy), calls=calls, warmup=5)
            print(f"  {us:8.1f}  {name}, autograd device threads {'on' if threads else 'off'}")

    # Where ours' step goes, from timestamps (perf_counter is one clock for all threads).
    marks = []
    original = ParallelMLPFunction.backward

    def timed_backward(ctx, *grads):
        t_enter = time.perf_counter()
        out = original(ctx, *grads)
        marks[-1].extend((t_enter, time.perf_counter()))
        return out

    model = models["ours"]

    def traced_step():
        model.zero_grad(set_to_none=True)
        x.grad = None
        t0 = time.perf_counter()
        y = model(x)
        t1 = time.perf_counter()
        marks.append([t0, t1])
        y.backward(dy)
        marks[-1].append(time.perf_counter())

    ParallelMLPFunction.backward = staticmethod(timed_backward)
    try:
        for threads in (True, False):
            marks.clear()
            with torch.autograd.set_multithreading_enabled(threads):
                host_us_per_call(traced_step, calls=calls, warmup=5)
            rows = [m for m in marks[5:] if len(m) == 5]
            if not rows:
                continue
            part = lambda i, j: statistics.median((m[j] - m[i]) * 1e6 for m in rows)
            print(f"  ours, device threads {'on' if threads else 'off'}: forward {part(0, 1):.1f} µs, "
                  f"until backward starts {part(1, 2):.1f}, backward body {part(2, 3):.1f}, "
                  f"back to the caller {part(3, 4):.1f} (medians of {len(rows)} steps)")

        prof = cProfile.Profile()

        def profiled_backward(ctx, *grads):
            prof.enable()
            try:
                return original(ctx, *grads)
            finally:
                prof.disable()

        ParallelMLPFunction.backward = staticmethod(profiled_backward)
        for _ in range(calls):
            train_step(model, x, dy)
        torch.cuda.synchronize()
    finally:
        ParallelMLPFunction.backward = original
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
    print("cProfile of the backward's body on autograd's device thread:")
    print(out.getvalue())

    a = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    b = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    out_d = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    launch = lambda: ops.gemm(a, b, out=out_d)
    print(f"  {host_us_per_call(launch, calls=calls):8.1f}  ops.gemm 256^3, main thread")
    print(f"  {_on_worker_thread(lambda: host_us_per_call(launch, calls=calls)):8.1f}  "
          "ops.gemm 256^3, a new thread")
    mm = lambda: torch.mm(a, b, out=out_d)
    print(f"  {host_us_per_call(mm, calls=calls):8.1f}  torch.mm 256^3, main thread")
    print(f"  {_on_worker_thread(lambda: host_us_per_call(mm, calls=calls)):8.1f}  "
          "torch.mm 256^3, a new thread")
    return 0
