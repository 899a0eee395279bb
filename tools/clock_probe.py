"""Time against the clock: ms per call, mean SM clock and board power per workload.

    python3 tools/clock_probe.py [--h 7168] [--T 8192 --d 4096] [--seconds 2] [--rounds 3]
                                 [--also consumers=cooperative,tile_n=256 ...]
    python3 tools/clock_probe.py --mlp swiglu:14336 [--T 8192 --d 4096] [--compile]

The H200 is power-bound: its SM clock falls when a kernel draws more power (more HBM traffic,
more shared-memory traffic per FLOP). Two kernels can then differ in time while taking the same
number of cycles. This runs each workload back to back for --seconds, in turn, for --rounds,
sampling the SM clock and power through NVML in a thread, and prints per workload: ms per call,
MHz, W, and kilocycles per call (ms x MHz), the part of the time that is the kernel's own.
Each --also adds our plain dy@W2 and its dact at their default configs with those GemmConfig
fields replaced (as `python -m parallel_mlp.bench configs --also`), to see what a tile, a
cluster shape or an L2 policy does to the clock.

--mlp ACT:H runs whole MLP training steps instead (the bench's models and train_step): PyTorch
eager, ours, ours with recompute (and torch.compile with --compile), each sustained as training
runs it. The bench times its variants step by step in turn, so they share one clock; sustained,
each variant runs at the clock its own power draw allows, and a kernel that takes fewer cycles but
more energy than cuBLAS's gains less than the interleaved ratio says.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import threading
import time

import torch


class Nvml:
    """The two NVML queries we need, through ctypes (no pynvml on the GPU host)."""

    CLOCK_SM = 1

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
            raise RuntimeError(f"no NVML device {index}")

    def sample(self) -> tuple[int, float]:
        mhz, mw = ctypes.c_uint(), ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.handle, self.CLOCK_SM, ctypes.byref(mhz))
        self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw))
        return mhz.value, mw.value / 1000.0


class Sampler(threading.Thread):
    def __init__(self, nvml: Nvml, period_s: float = 0.01):
        super().__init__(daemon=True)
        self.nvml, self.period_s = nvml, period_s
        self.samples: list[tuple[float, int, float]] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.samples.append((time.time(), *self.nvml.sample()))
            time.sleep(self.period_s)

    def between(self, t0: float, t1: float):
        return [(mhz, w) for t, mhz, w in self.samples if t0 <= t <= t1]


def workloads(h: int, T: int = 8192, d: int = 4096, act: str = "swiglu", also=()):
    import dataclasses

    from parallel_mlp.kernels import ops
    from parallel_mlp.bench.gemm_configs import _label
    from parallel_mlp.kernels.config import default_config

    bf = torch.bfloat16
    from parallel_mlp.activations import get_activation

    F = 2 * h if get_activation(act).gated else h
    r = lambda *s: torch.randn(*s, device="cuda", dtype=bf) * 0.02  # noqa: E731
    dy, w2, pre, post = r(T, d), r(d, h), r(T, F), r(T, h)
    mg = torch.zeros(d, h, device="cuda")
    work = {
        "cuBLAS dy@W2": (2 * T * h * d, lambda: dy @ w2),
        "ours dy@W2": (2 * T * h * d, lambda: ops.gemm(dy, w2)),
        "ours dy@W2+dact": (2 * T * h * d, lambda: ops.gemm_dact(dy, w2, pre, act)),
        "cuBLAS dW2 addmm fp32": (2 * T * h * d, lambda: torch.addmm(mg, dy.t(), post, out_dtype=torch.float32, out=mg)),
        "ours dW2 +=": (2 * T * h * d, lambda: ops.gemm(dy.t(), post, out=mg, accumulate=True)),
    }
    for fields in also:
        cfg = dataclasses.replace(default_config(T, h, d), **fields)
        work[f"ours dy@W2 {_label(fields)}"] = (2 * T * h * d, lambda cfg=cfg: ops.gemm(dy, w2, config=cfg))
        dcfg = dataclasses.replace(default_config(T, h, d, kind="dact"), **fields)
        work[f"ours dy@W2+dact {_label(fields)}"] = (
            2 * T * h * d, lambda cfg=dcfg: ops.gemm_dact(dy, w2, pre, act, config=cfg))
    return work


def mlp_workloads(spec: str, compile_too: bool, T: int = 8192, d: int = 4096):
    """Training steps of the bench's MLP variants at one activation:hidden config."""
    from parallel_mlp.activations import get_activation
    from parallel_mlp.bench import models as bench

    ((act, h),) = bench.parse_configs(spec)
    gated = get_activation(act).gated
    F = 2 * h if gated else h
    flops = bench.mlp_flops(T, d, act, h)
    bf = torch.bfloat16
    w1 = torch.randn(F, d, device="cuda", dtype=bf) * d ** -0.5
    w2 = torch.randn(d, h, device="cuda", dtype=bf) * h ** -0.5
    x = torch.randn(T, d, device="cuda", dtype=bf).requires_grad_(True)
    dy = torch.randn(T, d, device="cuda", dtype=bf)
    models = {
        "eager": bench.EagerMLP(bench.chunked_w1(w1, gated), w2.clone(), act),
        "ours": bench.build_parallel_mlp(w1, w2, act, h),
        "ours recompute": bench.build_parallel_mlp(w1, w2, act, h, recompute=True),
    }
    if compile_too:
        models["torch.compile"] = torch.compile(bench.EagerMLP(bench.chunked_w1(w1, gated), w2.clone(), act),
                                                dynamic=False)
    return {name: (flops, lambda m=m: bench.train_step(m, x, dy)) for name, m in models.items()}


def main(argv=None) -> int:
    from parallel_mlp.kernels.warmup import positive_int

    p = argparse.ArgumentParser(prog="python3 tools/clock_probe.py", description=__doc__.split("\n")[0])
    p.add_argument("--h", type=positive_int, default=7168)
    p.add_argument("--act", default="swiglu")
    p.add_argument("--T", type=positive_int, default=8192, help="tokens (the GEMMs' M)")
    p.add_argument("--d", type=positive_int, default=4096, help="model width (dy@W2's K)")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--also", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="also our plain dy@W2 and its dact with these GemmConfig fields replaced; repeatable")
    p.add_argument("--mlp", default=None, metavar="ACT:H",
                   help="time MLP training steps (eager, ours, ours recompute) instead of GEMMs")
    p.add_argument("--compile", action="store_true", help="with --mlp: torch.compile's step too")
    args = p.parse_args(argv)
    from parallel_mlp.bench.gemm_configs import _parse_fields

    also = [_parse_fields(a) for a in args.also]
    if not torch.cuda.is_available():
        raise SystemExit("clock_probe needs a CUDA GPU")
    sampler = Sampler(Nvml())
    sampler.start()
    if args.mlp:
        work = mlp_workloads(args.mlp, args.compile, T=args.T, d=args.d)
    else:
        work = workloads(args.h, T=args.T, d=args.d, act=args.act, also=also)
    stats = {name: [] for name in work}
    for fn in (f for _, f in work.values()):  # compile / load before anything is timed
        fn()
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        for name, (flops, fn) in work.items():
            t0 = time.time()
            n = 0
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            while time.time() - t0 < args.seconds:
                fn()
                n += 1
                if n % 50 == 0:
                    torch.cuda.synchronize()  # keep the host within a few calls of the GPU
            end.record()
            end.synchronize()
            t1 = time.time()
            ms = start.elapsed_time(end) / n
            s = sampler.between(t0 + 0.2 * (t1 - t0), t1)  # past the switch-over
            stats[name].append((ms, statistics.mean(m for m, _ in s), statistics.mean(w for _, w in s), flops))
    sampler.stop.set()
    what = f"MLP {args.mlp}" if args.mlp else f"h={args.h} act={args.act}"
    what += f" T={args.T} d={args.d}"
    print(f"{what}; {torch.cuda.get_device_name()}; {args.rounds} rounds of {args.seconds} s each")
    first = next(iter(stats))
    print(f"{'workload':56s} {'ms/call':>8s} {'TF/s':>6s} {'MHz':>6s} {'W':>6s} {'kcycles':>8s} {'x ' + first:>10s}")
    base = statistics.median(r[0] for r in stats[first])
    for name, rows in stats.items():
        ms = statistics.median(r[0] for r in rows)
        mhz = statistics.median(r[1] for r in rows)
        w = statistics.median(r[2] for r in rows)
        print(f"{name:56s} {ms:8.3f} {rows[0][3] / ms / 1e9:6.0f} {mhz:6.0f} {w:6.0f} {ms * mhz:8.0f} {base / ms:10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
