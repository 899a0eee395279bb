"""Where the host time of one op launch goes (a GPU is needed to launch).

    python -m parallel_mlp.bench host [--calls 300]

A 256^3 GEMM runs for a few microseconds, so back-to-back launches measure the host side alone:
the Python of `ops.gemm`, the packed launch arguments, the config and kernel lookup, and the
compiled launcher (which encodes the TMA descriptors and launches); beside them, the DSL's own
argument path (from_dlpack tensors) that ops no longer takes. Prints each part's µs per call, and
a cProfile of the whole op's calls, to show what a faster launch path has to remove.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

from .timing import host_us_per_call


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench host", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("host needs a CUDA GPU")

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
    packed, _alive = ops._launch_args((a, bk, d), handle)  # _alive holds the structs packed points to
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
