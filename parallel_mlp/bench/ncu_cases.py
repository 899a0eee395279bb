"""Launch a few of the MLP's GEMMs once each, after a warm-up pass, for a profiler to look at.

    ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 5 --launch-count 5 \
        --section SpeedOfLight --section WarpStateStats \
        python -m parallel_mlp.bench ncu-cases

The warm-up pass compiles (or loads) every kernel and launches each once; the second pass is the
one to profile (`--launch-skip` = the number of cases). Shapes: T=8192, d=4096, h=14336, swiglu;
``--short-k-dact`` profiles instead the swiglu dact at K = 1024 (T=8192, d=1024, h=2816) beside
the plain GEMM of its shape, both in its default config (cooperative 128x128 tiles), the plain
GEMM in pingpong 128x192 tiles, and the dact without its pair swap (GemmConfig.dact_pair_swap)
in that cooperative config and in the big dact's pingpong 128x192 one (16-column subtiles), with
the swap and without: the shared-memory wavefronts the swap saves under both swizzles.
``--short-k-pingpong`` profiles the same dact and the plain GEMM of its shape in its default
config and in pingpong 128x128 tiles (2x1, two preact slots, 16-column subtiles): pingpong gives
one warpgroup's epilogue the other's mainloop to hide behind yet ran no faster, so what the
two schedules keep busy (tensor pipe, shared memory, issue) says which resource the epilogue
takes from the mainloop (`--launch-skip 4`).
``--epilogue-gap T,d,h,act`` (repeatable) profiles, at each shape, the two epilogue GEMMs beside
the plain GEMMs of their shapes and configs (fc1 + act and plain fc1; the dact and plain dy@W2 in
the dact's config, and plain dy@W2 in its own default): what the epilogue costs in cycles, clock,
DRAM bytes and stalls where it runs well above the plain GEMM (`--launch-skip` = 5 x shapes).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from .host_overhead import parse_shape


def _random_bf16(seed: int = 0):
    """rand(*shape, scale=1.0): bf16 normal samples on the GPU, one seeded generator per case list."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)

    return rand


SHORT_K = (8192, 1024, 2816)  # T, d, h of the swiglu dact at K = d = 1024


def _short_k_operands():
    """dy, W2 and the interleaved swiglu preact of the short-K dact (SHORT_K), seeded."""
    T, d, h = SHORT_K
    rand = _random_bf16()
    return rand(T, d), rand(d, h, scale=h ** -0.5), rand(T, 2 * h)


def short_k_dact_cases():
    from ..kernels import ops
    from ..kernels.config import big_pingpong_config, default_config

    T, d, h = SHORT_K
    dy, w2, pre = _short_k_operands()
    # the dact's own config (the short-K dact rule's), for the plain GEMM beside it
    dact_cfg = default_config(T, h, d, kind="dact")
    no_swap = dataclasses.replace(dact_cfg, dact_pair_swap=False)
    pp = big_pingpong_config(T, h, kind="dact")
    pp_no_swap = dataclasses.replace(pp, dact_pair_swap=False)
    return [
        ("dpost dy@W2 + swiglu dact, its default config", lambda: ops.gemm_dact(dy, w2, pre, "swiglu")),
        ("dpost dy@W2 plain, the dact's config", lambda: ops.gemm(dy, w2, config=dact_cfg)),
        ("dpost dy@W2 plain, default", lambda: ops.gemm(dy, w2)),
        ("dpost dy@W2 + swiglu dact, no pair swap", lambda: ops.gemm_dact(dy, w2, pre, "swiglu", config=no_swap)),
        ("dpost dy@W2 + swiglu dact, pingpong (big default)", lambda: ops.gemm_dact(dy, w2, pre, "swiglu", config=pp)),
        ("dpost dy@W2 + swiglu dact, pingpong, no pair swap",
         lambda: ops.gemm_dact(dy, w2, pre, "swiglu", config=pp_no_swap)),
    ]


def short_k_pingpong_cases():
    from ..kernels import ops
    from ..kernels.config import GemmConfig, default_config

    T, d, h = SHORT_K
    dy, w2, pre = _short_k_operands()
    coop = default_config(T, h, d, kind="dact")
    pp = GemmConfig(128, 128, 2, 1, 8, consumers="pingpong", dact_prefetch=2, epi_n=16)
    return [
        ("dpost dy@W2 + swiglu dact, its default config", lambda: ops.gemm_dact(dy, w2, pre, "swiglu", config=coop)),
        ("dpost dy@W2 plain, the dact's config", lambda: ops.gemm(dy, w2, config=coop)),
        ("dpost dy@W2 + swiglu dact, pingpong 128x128", lambda: ops.gemm_dact(dy, w2, pre, "swiglu", config=pp)),
        ("dpost dy@W2 plain, pingpong 128x128", lambda: ops.gemm(dy, w2, config=pp)),
    ]


def epilogue_gap_cases(shapes):
    """Per (T, d, h, act): fc1 + act, plain fc1 (the same config: store and act choose alike),
    the dact, plain dy@W2 in the dact's config, plain dy@W2 in its default config."""
    from ..activations import get_activation
    from ..kernels import ops
    from ..kernels.config import default_config

    todo = []
    for T, d, h, act in shapes:
        F = 2 * h if get_activation(act).gated else h
        rand = _random_bf16()
        x, w1 = rand(T, d), rand(F, d, scale=d ** -0.5)
        dy, w2, pre = rand(T, d), rand(d, h, scale=h ** -0.5), rand(T, F)
        dact_cfg = default_config(T, h, d, kind="dact")
        at = f"T={T} d={d} {act} h={h}"
        todo += [
            (f"{at}: fc1 + act", lambda x=x, w1=w1, act=act: ops.gemm_act(x, w1.t(), act)),
            (f"{at}: fc1 plain", lambda x=x, w1=w1: ops.gemm(x, w1.t())),
            (f"{at}: dy@W2 + dact", lambda dy=dy, w2=w2, pre=pre, act=act: ops.gemm_dact(dy, w2, pre, act)),
            (f"{at}: dy@W2 plain, the dact's config",
             lambda dy=dy, w2=w2, cfg=dact_cfg: ops.gemm(dy, w2, config=cfg)),
            (f"{at}: dy@W2 plain, default", lambda dy=dy, w2=w2: ops.gemm(dy, w2)),
        ]
    return todo


def cases():
    from ..kernels import ops
    from ..kernels.config import GemmConfig

    T, d, h = 8192, 4096, 14336
    F = 2 * h
    rand = _random_bf16()
    x, w1, dy = rand(T, d), rand(F, d, scale=d ** -0.5), rand(T, d)
    w2, dpre, pre = rand(d, h, scale=h ** -0.5), rand(T, F), rand(T, F)
    pingpong = GemmConfig(128, 128, consumers="pingpong")
    return [
        ("fc1 plain (B K-major)", lambda: ops.gemm(x, w1.t())),
        ("dx dpre@W1 (B N-major, K=28672)", lambda: ops.gemm(dpre, w1)),
        ("dpost dy@W2 plain (B N-major, K=4096)", lambda: ops.gemm(dy, w2)),
        ("dpost dy@W2 + swiglu dact", lambda: ops.gemm_dact(dy, w2, pre, "swiglu")),
        ("fc1 plain, pingpong 128x128", lambda: ops.gemm(x, w1.t(), config=pingpong)),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parallel_mlp.bench ncu-cases",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--short-k-dact", action="store_true",
                        help="the swiglu dact at K = 1024 and plain GEMMs of its shape instead")
    parser.add_argument("--short-k-pingpong", action="store_true",
                        help="that dact and its plain GEMM, cooperative 128x128 and pingpong 128x128")
    parser.add_argument("--epilogue-gap", action="append", type=parse_shape, metavar="T,d,h,act",
                        help="fc1 + act and the dact beside the plain GEMMs of their shapes and "
                             "configs, at this shape instead (repeatable)")
    args = parser.parse_args(argv)
    if args.short_k_dact + args.short_k_pingpong + bool(args.epilogue_gap) > 1:
        parser.error("--short-k-dact, --short-k-pingpong and --epilogue-gap are different case lists: give one")
    if not torch.cuda.is_available():
        raise SystemExit("ncu-cases needs a CUDA GPU")
    if args.epilogue_gap:
        todo = epilogue_gap_cases(args.epilogue_gap)
    elif args.short_k_dact:
        todo = short_k_dact_cases()
    elif args.short_k_pingpong:
        todo = short_k_pingpong_cases()
    else:
        todo = cases()
    for _ in range(2):
        for name, fn in todo:
            fn()
        torch.cuda.synchronize()
    print("launched, in order:", "; ".join(name for name, _ in todo))
    return 0
