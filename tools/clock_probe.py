"""Time against the clock: ms per call, mean SM clock and board power per workload.

    python3 tools/clock_probe.py [--h 7168] [--seconds 2] [--rounds 3]

The H200 is power-bound: its SM clock falls when a kernel draws more power (more HBM traffic,
more shared-memory traffic per FLOP). Two kernels can then differ in time while taking the same
number of cycles. This runs each workload back to back for --seconds, in turn, for --rounds,
sampling the SM clock and power through NVML in a thread, and prints per workload: ms per call,
MHz, W, and kilocycles per call (ms x MHz), the part of the time that is the kernel's own.
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


def workloads(h: int, T: int = 8192, d: int = 4096, act: str = "swiglu"):
    from parallel_mlp.kernels import ops

    bf = torch.bfloat16
    from parallel_mlp.activations import get_activation

    F = 2 * h if get_activation(act).gated else h
    r = lambda *s: torch.randn(*s, device="cuda", dtype=bf) * 0.02  # noqa: E731
    dy, w2, pre, post = r(T, d), r(d, h), r(T, F), r(T, h)
    mg = torch.zeros(d, h, device="cuda")
    return {
        "cuBLAS dy@W2": (2 * T * h * d, lambda: dy @ w2),
        "ours dy@W2": (2 * T * h * d, lambda: ops.gemm(dy, w2)),
        "ours dy@W2+dact": (2 * T * h * d, lambda: ops.gemm_dact(dy, w2, pre, act)),
        "cuBLAS dW2 addmm fp32": (2 * T * h * d, lambda: torch.addmm(mg, dy.t(), post, out_dtype=torch.float32, out=mg)),
        "ours dW2 +=": (2 * T * h * d, lambda: ops.gemm(dy.t(), post, out=mg, accumulate=True)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 tools/clock_probe.py", description=__doc__.split("\n")[0])
    p.add_argument("--h", type=int, default=7168)
    p.add_argument("--act", default="swiglu")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("clock_probe needs a CUDA GPU")
    sampler = Sampler(Nvml())
    sampler.start()
    work = workloads(args.h, act=args.act)
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
    print(f"h={args.h} act={args.act}; {torch.cuda.get_device_name()}; {args.rounds} rounds of {args.seconds} s each")
    print(f"{'workload':24s} {'ms/call':>8s} {'TF/s':>6s} {'MHz':>6s} {'W':>6s} {'kcycles':>8s}")
    for name, rows in stats.items():
        ms = statistics.median(r[0] for r in rows)
        mhz = statistics.median(r[1] for r in rows)
        w = statistics.median(r[2] for r in rows)
        print(f"{name:24s} {ms:8.3f} {rows[0][3] / ms / 1e9:6.0f} {mhz:6.0f} {w:6.0f} {ms * mhz:8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
