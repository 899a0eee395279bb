"""Fill the on-disk kernel cache for a model's MLP shapes, compiling in parallel.

    python -m parallel_mlp.kernels.warmup --tokens 8192 --d 4096 --h 14336 --act swiglu [-j 16]
    python -m parallel_mlp.kernels.warmup --shapes 8192:4096:14336:swiglu,2048:1024:4096:gelu_tanh_approx

Compiles (in a process pool) the kernels that ParallelMLP's forward and backward use at these
shapes with the default configs: fc1 + act (with and without stored preact, for recompute),
recompute's plain fc1 replay, fc2, the dact GEMM, dx, and both wgrads (fp32 accumulate and plain
store), and exports each to ``$PARALLEL_MLP_CACHE_DIR`` (default ``~/.cache/parallel_mlp``). Run
it once on the GPU host (or any machine with the same DSL) before timing or training, so no step
pays for compiling; a kernel it did not foresee is still compiled on first use.
``--also FIELD=VALUE[,...]`` (repeatable) adds each kernel again with those GemmConfig fields
replaced, as ``bench configs --also`` times it, so that command's extra columns compile here in
parallel instead of one by one inside the timing run.
Shape-independent: a kernel serves every problem size of its layout and config, so only the
configs the shapes select matter (``python -m parallel_mlp.bench sweep`` compiles its whole
grid's this way, through ``compile_keys``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from parallel_mlp.activations import get_activation

from .compile import KernelKey
from .config import DEFAULT_NUM_SMS, default_config, parse_fields
from .epilogue_spec import EpilogueSpec


def mlp_keys(tokens, d, h, act, dtype="bfloat16", d_out=None, bias=False, num_sms=DEFAULT_NUM_SMS):
    """KernelKeys of one TP shard's MLP fwd + bwd (the operand majorness ParallelMLP produces)."""
    A = get_activation(act)
    d_out = d_out or d
    F = 2 * h if A.gated else h
    T = tokens
    from .ops import pdl_launches

    pdl = pdl_launches()

    def cfg(m, n, k, kind="store"):  # the rule's config, launched as ops would (PARALLEL_MLP_PDL)
        c = default_config(m, n, k, num_sms, kind)
        return dataclasses.replace(c, pdl=True) if pdl else c

    bias_dt = dtype if bias else None
    keys = [
        # fc1 + act: x [T, d] row-major, b = W1.T -> (N, K) = W1, K contiguous
        KernelKey(EpilogueSpec("act", A.name, bias, True), cfg(T, F, d, "act"), dtype, "row", "row", dtype, bias_dt),
        KernelKey(EpilogueSpec("act", A.name, bias, False), cfg(T, F, d, "act"), dtype, "row", "row", dtype, bias_dt),
        # recompute's replay of fc1 in backward: a plain GEMM at fc1's config
        KernelKey(EpilogueSpec("store"), cfg(T, F, d), dtype, "row", "row", dtype),
        # fc2: postact [T, h] @ W2.T
        KernelKey(EpilogueSpec("store"), cfg(T, d_out, h), dtype, "row", "row", dtype),
        # dpostact = dy @ W2 (W2 row-major [d_out, h]: the (N, K) view is N-contiguous)
        KernelKey(EpilogueSpec("dact", A.name), cfg(T, h, d_out, "dact"), dtype, "row", "col", dtype),
        # dx = dpreact @ W1
        KernelKey(EpilogueSpec("store"), cfg(T, d, F), dtype, "row", "col", dtype),
    ]
    # wgrads: dW2 = dy.T @ postact, dW1 = dpreact.T @ x (a column-major, b row-major)
    for m, n in ((d_out, h), (F, d)):
        keys.append(KernelKey(EpilogueSpec("accumulate"), cfg(m, n, T, "accumulate"), dtype, "col", "col", "float32"))
        keys.append(KernelKey(EpilogueSpec("store"), cfg(m, n, T), dtype, "col", "col", dtype))
        # a 16-bit .grad accumulated in place: computed in fp32, then added
        keys.append(KernelKey(EpilogueSpec("store"), cfg(m, n, T), dtype, "col", "col", "float32"))
    return list(dict.fromkeys(keys))


def with_fields(key: KernelKey, fields: dict) -> KernelKey:
    """``key`` at its config with these GemmConfig fields replaced."""
    return dataclasses.replace(key, config=dataclasses.replace(key.config, **fields))


def _build(key: KernelKey):
    import warnings

    from .compile import get_kernel, object_path

    t = time.time()
    if object_path(key).exists():
        # Cached already: not loaded here, since loading creates a CUDA context on a GPU host
        # (one per worker, beside whatever else runs there). A cached object that does not load
        # is compiled again where it is used.
        return True, 0.0, "cached"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            get_kernel(key)
    except Exception as e:
        return False, time.time() - t, f"{type(e).__name__}: {str(e)[:200]}"
    if not object_path(key).exists():
        why = "; ".join(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning))
        return False, time.time() - t, (f"compiled, but not cached: {why[:300]}" if why else
                                        "compiled, but the object could not be exported")
    return True, time.time() - t, ""


def compile_keys(keys, jobs: int) -> list[tuple[bool, float, str]]:
    """Compile and export ``keys`` in a pool of ``jobs`` processes: (ok, seconds, why not) per key."""
    if not keys:
        return []
    # spawn, not fork: this process may have initialised CUDA (to count SMs), and a forked child
    # must not inherit a CUDA context.
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(keys))), mp_context=ctx) as pool:
        return list(pool.map(_build, keys))


def parse_shapes(text: str) -> list[tuple[int, int, int, str]]:
    """'8192:4096:14336:swiglu,...' -> [(tokens, d, h, act), ...] (h: one shard's hidden size)."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 4 or not all(x.isascii() and x.isdigit() and int(x) > 0
                                      for x in parts[:3]):
            raise ValueError(f"--shapes item {item!r}: expected T:d:h:activation, e.g. 8192:4096:14336:swiglu")
        get_activation(parts[3])  # an unknown name fails here, with the list of valid ones
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
    return shapes


def positive_int(text: str) -> int:
    """argparse's type for sizes: a positive int, else an error naming the rule."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.kernels.warmup", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=positive_int, default=8192)
    p.add_argument("--d", type=positive_int, default=4096)
    p.add_argument("--h", type=positive_int, nargs="+", default=[14336], help="hidden size(s) of one shard")
    p.add_argument("--d-out", type=positive_int, default=None)
    p.add_argument("--act", nargs="+", default=["swiglu"])
    p.add_argument("--shapes", default=None, metavar="T:d:h:act,...",
                   help="a list of shapes instead of --tokens/--d/--h/--act (h: one shard's)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--bias", action="store_true")
    p.add_argument("--num-sms", type=positive_int, default=None, help="default: the current GPU's, else 132")
    p.add_argument("--also", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="also compile every kernel with these GemmConfig fields replaced (repeatable)")
    p.add_argument("-j", "--jobs", type=positive_int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    for name in args.act:
        try:
            get_activation(name)
        except ValueError as e:
            p.error(f"--act {e}")
    try:
        variants = [parse_fields(a) for a in args.also]
    except ValueError as e:
        p.error(f"--also {e}")
    sms = args.num_sms
    if sms is None:
        try:
            import torch

            sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else DEFAULT_NUM_SMS
        except Exception:
            sms = DEFAULT_NUM_SMS
    if args.shapes is not None:
        try:
            shapes = parse_shapes(args.shapes)
        except ValueError as e:
            p.error(str(e))
    else:
        shapes = [(args.tokens, args.d, h, act) for act in args.act for h in args.h]
    keys = []
    for T, d, h, act in shapes:
        keys += mlp_keys(T, d, h, act, args.dtype, args.d_out, args.bias, sms)
    base = list(keys)
    for fields in variants:
        for k in base:
            try:
                keys.append(with_fields(k, fields))
            except ValueError as e:  # a field value that config refuses (e.g. stream-K on a pingpong GEMM)
                print(f"skip {k.name}: {e}")
    keys = list(dict.fromkeys(keys))
    t0 = time.time()
    results = compile_keys(keys, args.jobs)
    bad = 0
    for key, (ok, dt, msg) in zip(keys, results):
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {key.name:72s} {dt:5.1f}s {msg}")
    print(f"warmup: {len(keys) - bad}/{len(keys)} kernels cached in {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
