"""One fwd+bwd step of ours and one of quack's MLP, each inside the CUDA profiler's range, for
Nsight Compute to set the two sides' epilogue GEMMs beside each other (instructions, shared-memory
stores and their bank conflicts, DRAM bytes, warp stalls).

    ncu --clock-control none --profile-from-start off --kernel-name regex:kernel_cutlass \
        --section SpeedOfLight --section WarpStateStats --section InstructionStats \
        python3 tools/ncu_vs_quack.py [--shape T,d,h,act ...]

Both models are built on the same weights as ``tools/kernels_vs_quack.py`` builds them
(``bench.models.ours_and_quack``) and run
three warm steps first (compiles, autotuning, caches), so the profiled range holds exactly one
step of each: ours first, then quack's, shape by shape (`gpu_run.sh ncu_vs_quack`). Each
``--also FIELD=VALUE[,...]`` then adds our fc1 + activation and dact GEMMs once more, launched
through ``ops`` with those GemmConfig fields replaced (e.g. ``raster_group=8``).
"""

from __future__ import annotations

import argparse
import sys

import torch

from parallel_mlp.bench import quack_baseline
from parallel_mlp.bench.host_overhead import parse_shape
from parallel_mlp.bench.models import ours_and_quack, train_step
from parallel_mlp.kernels.config import parse_fields

SHAPES = [(8192, 8192, 8192, "gelu_tanh_approx"), (8192, 4096, 14336, "swiglu")]


def profiled(label: str, fn) -> None:
    """fn() twice to warm, then once inside the profiler's range."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    print(f"profiled: {label}", flush=True)
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def epilogue_gemms(w1, w2, act, x, dy, fields: dict) -> None:
    """Our fc1 + act and dact GEMMs of this step with ``fields`` replaced in the configs."""
    import dataclasses

    from parallel_mlp.kernels import ops

    x, dy = x.detach(), dy.detach()
    pre = ops.gemm_act(x, w1.t(), act)[0]
    with ops.rewriting_configs(lambda cfg: dataclasses.replace(cfg, **fields)):
        label = ",".join(f"{k}={v}" for k, v in fields.items())
        profiled(f"ours fc1 + act, {label}", lambda: ops.gemm_act(x, w1.t(), act))
        profiled(f"ours dact, {label}", lambda: ops.gemm_dact(dy, w2, pre, act))


def profile_shape(shape, variants=()) -> None:
    tokens, d, h, act = shape
    runs, x, dy = ours_and_quack(shape)
    for model in runs.values():
        for _ in range(3):
            train_step(model, x, dy)
    torch.cuda.synchronize()
    for name, model in runs.items():
        profiled(f"{name}, T={tokens} d={d} h={h} {act}", lambda m=model: train_step(m, x, dy))
    w1, w2 = runs["ours"].fc1.weight.detach(), runs["ours"].fc2.weight.detach()
    for fields in variants:
        epilogue_gemms(w1, w2, act, x, dy, fields)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", type=parse_shape,
                   help="T,d,h,act (repeatable; default: T=8192 d=8192 gelu_tanh_approx h=8192, "
                        "T=8192 d=4096 swiglu h=14336)")
    p.add_argument("--also", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="also profile our fc1 + act and dact GEMMs with these GemmConfig fields replaced")
    args = p.parse_args(argv)
    try:
        variants = [parse_fields(a) for a in args.also]
    except ValueError as e:
        p.error(f"--also {e}")
    if not torch.cuda.is_available():
        raise SystemExit("ncu_vs_quack.py needs a CUDA GPU")
    if not quack_baseline.installed():
        raise SystemExit(f"ncu_vs_quack.py needs quack: {quack_baseline.INSTALL_HINT}")
    for shape in args.shape or SHAPES:
        profile_shape(shape, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
