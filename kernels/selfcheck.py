"""Compile every kernel variant for sm_90a and check the generated PTX; no GPU needed.

    python -m parallel_mlp.kernels.selfcheck --compile-only [--quick] [-j N]

For each variant x dtype x operand layout it runs the DSL's full compile (trace, MLIR passes,
NVVM, ptxas) for sm_90a with symbolic problem sizes, then checks that the PTX issues
``wgmma.mma_async`` and bulk tensor copies (``cp.async.bulk.tensor`` loads; stores, or
``cp.reduce.async.bulk.tensor`` reduce-adds for accumulation) and register reallocation
(``setmaxnreg``); the dynamic-scheduler variants must also claim tiles with a global atomic add
(``atom.global.add``), and the pingpong variants must hand turns between their consumer
warpgroups with named-barrier arrives (``bar.arrive``); a kernel has ``griddepcontrol.wait`` and
``griddepcontrol.launch_dependents`` once each with config.pdl, and neither without. One line
per variant, a summary line last; the exit status is non-zero if any variant fails. Compiles
run in parallel processes (-j, default: number of CPUs).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from parallel_mlp.activations import ACTIVATIONS

from .compile import KernelKey
from .config import GemmConfig
from .epilogue_spec import EpilogueSpec

LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


def variants(quick: bool = False):
    """The (name, KernelKey) pairs the selfcheck compiles.

    Full: plain store for every dtype x layout x output dtype, the fp32 accumulate for every dtype x
    layout, every activation's act (with and without bias / preact) and dact for both dtypes, at
    the default tile; plus the other tiles and a 2x1 cluster for the plain store.
    --quick keeps one dtype's layouts and every activation once (a fast local check; CI runs all).
    Both add the dynamic tile scheduler for each epilogue kind (store, accumulate, act, dact)
    and the pingpong consumer schedule (pingpong_variants).
    """
    cfg = GemmConfig()
    out = []
    dtypes = ["bfloat16"] if quick else ["bfloat16", "float16"]
    for dt in dtypes:
        for am, bm in LAYOUTS:
            for od in ([dt, "float32"] if not quick else [dt]):
                out.append(KernelKey(EpilogueSpec("store"), cfg, dt, am, bm, od))
            out.append(KernelKey(EpilogueSpec("accumulate"), cfg, dt, am, bm, "float32"))
    if quick:
        dtypes = ["bfloat16"]
    for dt in dtypes:
        for name in sorted(ACTIVATIONS):
            # fc1 is x @ W1.T (a row-major, b = W1.T: K-major (N,K) view); dact is dy @ W2
            # (b = W2 row-major: N-major (N,K) view).
            out.append(KernelKey(EpilogueSpec("act", name), cfg, dt, "row", "row", dt))
            out.append(KernelKey(EpilogueSpec("dact", name), cfg, dt, "row", "col", dt))
            if not quick:
                out.append(KernelKey(EpilogueSpec("act", name, True, False), cfg, dt, "row", "row", dt, dt))
    tiles = [GemmConfig(128, 128), GemmConfig(128, 256, 2, 1)]
    if not quick:
        tiles += [GemmConfig(64, 128), GemmConfig(128, 192), GemmConfig(128, 64), GemmConfig(128, 128, 2, 1)]
    for c in tiles:
        out.append(KernelKey(EpilogueSpec("store"), c, "bfloat16", "row", "row", "bfloat16"))
    out += dynamic_variants(quick)
    out += pingpong_variants(quick)
    out += dact_prefetch_variants(quick)
    out += l2_prefetch_variants(quick)
    out += default_mlp_variants(quick)
    out += tile256_variants(quick)
    out += epi16_variants(quick)
    out += stream_k_variants(quick)
    out += pair_swap_off_variants(quick)
    out += pdl_variants(quick)
    out += cooperative192_variants(quick)
    out += handoff_variants(quick)
    return out


def _overlap_kinds(c, quick: bool):
    """Every epilogue kind on schedule config `c`: store and the gated dact with a 3-slot ring
    (--quick), then fp32 accumulate in a 2x1 cluster, the gated act in a 1x2 cluster, gelu's act
    with a bias in fp16, the gated dact with a 2-slot ring and the gelu dact with a 4-slot ring."""
    out = [
        KernelKey(EpilogueSpec("store"), c, "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), dataclasses.replace(c, dact_prefetch=2), "bfloat16", "row", "col", "bfloat16"),
    ]
    if not quick:
        out += [
            KernelKey(EpilogueSpec("accumulate"), dataclasses.replace(c, cluster_m=2), "bfloat16", "col", "col", "float32"),
            KernelKey(EpilogueSpec("act", "swiglu"), dataclasses.replace(c, cluster_n=2), "bfloat16", "row", "row", "bfloat16"),
            KernelKey(EpilogueSpec("act", "gelu_tanh_approx", True), c, "float16", "row", "row", "float16", "float16"),
            KernelKey(EpilogueSpec("dact", "swiglu"), c, "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "gelu_tanh_approx"), dataclasses.replace(c, dact_prefetch=3, epi_n=16),
                      "bfloat16", "row", "col", "bfloat16"),
        ]
    return out


def handoff_variants(quick: bool = False):
    """The handoff schedule (two mainloop and two epilogue warpgroups, the accumulators passed
    through shared memory), 16-column subtiles: every epilogue kind (_overlap_kinds), and the
    non-gated dact at 32 columns and the 128x64 tile's fp32 store in full."""
    c = GemmConfig(128, 128, 1, 1, 8, consumers="handoff", epi_n=16)
    out = _overlap_kinds(c, quick)
    if not quick:
        out += [
            KernelKey(EpilogueSpec("dact", "relu"), dataclasses.replace(c, epi_n=32), "float16", "row", "col", "float16"),
            KernelKey(EpilogueSpec("store"), dataclasses.replace(c, tile_n=64, cluster_m=2), "bfloat16", "col", "row", "float32"),
        ]
    return out


def cooperative192_variants(quick: bool = False):
    """The cooperative 192x128 tile (three consumer warpgroups of 64 rows at 160 registers):
    every epilogue kind (_overlap_kinds), and in full the gated dact's 4-slot ring with
    16-column subtiles, the dynamic scheduler and the 192x64 tile."""
    c = GemmConfig(192, 128, 1, 1, 8)
    out = _overlap_kinds(c, quick)
    if not quick:
        out += [
            KernelKey(EpilogueSpec("dact", "swiglu"), dataclasses.replace(c, dact_prefetch=3, epi_n=16),
                      "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "relu"), dataclasses.replace(c, scheduler="dynamic"), "float16", "row", "col", "float16"),
            KernelKey(EpilogueSpec("store"), dataclasses.replace(c, tile_n=64, cluster_m=2), "bfloat16", "col", "row", "float32"),
        ]
    return out


def pdl_variants(quick: bool = False):
    """Programmatic dependent launch (config.pdl) on each schedule the defaults run: the
    cooperative 2x1 128x256 store and fp32 accumulate, the pingpong 128x192 act and dact, the
    short-K cooperative 128x128 dact, stream-K and the dynamic scheduler."""
    coop = GemmConfig(128, 256, 2, 1, 8, pdl=True)
    pp = GemmConfig(128, 192, 2, 1, 8, consumers="pingpong", pdl=True)
    keys = [
        KernelKey(EpilogueSpec("store"), coop, "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), dataclasses.replace(pp, dact_prefetch=2, epi_n=16),
                  "bfloat16", "row", "col", "bfloat16"),
    ]
    if not quick:
        keys += [
            KernelKey(EpilogueSpec("accumulate"), dataclasses.replace(coop, l2_prefetch=True),
                      "bfloat16", "col", "col", "float32"),
            KernelKey(EpilogueSpec("act", "swiglu"), pp, "bfloat16", "row", "row", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "gelu_tanh_approx"), GemmConfig(128, 128, dact_prefetch=3, pdl=True),
                      "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("store"), dataclasses.replace(coop, raster_group=16, stream_k=True),
                      "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("store"), GemmConfig(128, 128, scheduler="dynamic", pdl=True),
                      "bfloat16", "row", "row", "bfloat16"),
        ]
    return keys


def pair_swap_off_variants(quick: bool = False):
    """The gated dact without its pair swap (config.dact_pair_swap=False; every other gated dact
    here has it): the cooperative 128x128 tile of the short-K rule and the default big dact's
    pingpong 128x192 with 16-column subtiles, one per swizzle the swap handles."""
    coop = GemmConfig(128, 128, 1, 1, 8, dact_pair_swap=False)
    pp = GemmConfig(128, 192, 2, 1, 16, consumers="pingpong", dact_prefetch=2, epi_n=16, dact_pair_swap=False)
    keys = [KernelKey(EpilogueSpec("dact", "swiglu"), coop, "bfloat16", "row", "col", "bfloat16")]
    if not quick:
        keys.append(KernelKey(EpilogueSpec("dact", "swiglu"), pp, "bfloat16", "row", "col", "bfloat16"))
    return keys


def stream_k_variants(quick: bool = False):
    """Stream-K (config.stream_k) for the store and accumulate epilogues: the 2x1-cluster
    cooperative 128x256 of the long-K GEMMs, a 1x1 cluster and fp16."""
    c = GemmConfig(128, 256, 2, 1, 16, stream_k=True)
    keys = [
        KernelKey(EpilogueSpec("store"), c, "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("accumulate"), dataclasses.replace(c, l2_prefetch=True), "bfloat16", "col", "col", "float32"),
    ]
    if not quick:
        keys += [
            KernelKey(EpilogueSpec("store"), GemmConfig(128, 256, 1, 1, 8, stream_k=True), "bfloat16", "row", "row", "bfloat16"),
            KernelKey(EpilogueSpec("store"), c, "float16", "col", "row", "float32"),
        ]
    return keys


def default_mlp_variants(quick: bool = False):
    """The kernels ops launches by default for an MLP at T=8192, d=4096 (swiglu h=14336, and
    with biases), which warm-up compiles; and, but for --quick, those of steps with fewer tiles
    than SMs: 128x64 tiles at T=512, stream-K over the whole grid for the wgrads at T=65536,
    d=1024, and the cooperative 128x192 tiles of GEMMs that run fewer waves in them (T=512
    d=1024, T=2048 d=2048 swiglu; config.with_fewer_waves)."""
    from .warmup import mlp_keys

    keys = mlp_keys(8192, 4096, 14336, "swiglu")
    if not quick:
        keys += mlp_keys(8192, 4096, 16384, "gelu_tanh_approx", bias=True)
        # one key per config, operand layout and epilogue kind, not every variant of each
        few = {(k.config, k.a_major, k.b_major, k.epilogue.kind): k
               for k in mlp_keys(512, 1024, 256, "swiglu") + mlp_keys(65536, 1024, 1024, "gelu_tanh_approx")
               + mlp_keys(512, 1024, 2816, "swiglu") + mlp_keys(2048, 2048, 2816, "swiglu")
               if k.config.stream_k or (k.config.consumers == "cooperative" and k.config.tile_n in (64, 192))}
        keys += few.values()
    return list(dict.fromkeys(keys))


def l2_prefetch_variants(quick: bool = False):
    """The producer's L2 prefetch of the epilogue input (config.l2_prefetch): the dact's preact
    (gated and not) and the accumulate's fp32 D, at the default tile's cluster shapes and the
    128x128 tile that small shapes get."""
    def c(tm=128, tn=256, cm=1):
        return GemmConfig(tm, tn, cm, 1, l2_prefetch=True)

    out = [
        KernelKey(EpilogueSpec("dact", "swiglu"), c(cm=2), "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("accumulate"), c(cm=2), "bfloat16", "col", "row", "float32"),
    ]
    if not quick:
        out += [
            KernelKey(EpilogueSpec("dact", "gelu_tanh_approx"), c(), "float16", "row", "col", "float16"),
            KernelKey(EpilogueSpec("dact", "swiglu"), c(128, 128), "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("accumulate"), c(128, 128), "float16", "col", "row", "float32"),
            KernelKey(EpilogueSpec("accumulate"), c(), "bfloat16", "col", "col", "float32"),
        ]
    return out


def dact_prefetch_variants(quick: bool = False):
    """The dact with dpreact written in place over a deeper preact ring (config.dact_prefetch 2
    and 3): gated and non-gated, both dtypes, the default tile and its 2x1 cluster."""
    def c(pf, cm=1):
        return GemmConfig(128, 256, cm, 1, dact_prefetch=pf)

    if quick:
        return [
            KernelKey(EpilogueSpec("dact", "swiglu"), c(2, 2), "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "relu"), c(3), "bfloat16", "row", "col", "bfloat16"),
        ]
    out = []
    for pf in (2, 3):
        out += [
            KernelKey(EpilogueSpec("dact", "swiglu"), c(pf, 2), "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "geglu"), c(pf), "float16", "row", "col", "float16"),
            KernelKey(EpilogueSpec("dact", "gelu_tanh_approx"), c(pf, 2), "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "relu"), c(pf), "float16", "row", "col", "float16"),
        ]
    return out


def pingpong_variants(quick: bool = False):
    """The pingpong consumers (config.consumers): every epilogue kind at two of its tiles (128x128:
    two m64 atoms per warpgroup; 64x256), a 2x1 cluster, the dynamic scheduler, the four
    epilogue kinds of the 128x192 and 192x128 tiles, and the act and dact of the 64x128 and 64x64
    tiles. --quick keeps
    one of each epilogue channel kind (acc-shaped, half-width postact, double-width dpreact with the
    preact load, reduce-add) plus the cluster."""
    def pp(tm, tn, cm=1, sched="static"):
        return GemmConfig(tm, tn, cm, 1, consumers="pingpong", scheduler=sched)

    def kinds(c, dt="bfloat16"):
        return [
            KernelKey(EpilogueSpec("store"), c, dt, "row", "row", dt),
            KernelKey(EpilogueSpec("store"), c, dt, "row", "col", dt),
            KernelKey(EpilogueSpec("accumulate"), c, dt, "col", "col", "float32"),
            KernelKey(EpilogueSpec("act", "swiglu"), c, dt, "row", "row", dt),
            KernelKey(EpilogueSpec("act", "gelu_tanh_approx", True), c, dt, "row", "row", dt, dt),
            KernelKey(EpilogueSpec("dact", "swiglu"), c, dt, "row", "col", dt),
            KernelKey(EpilogueSpec("dact", "relu"), c, dt, "row", "col", dt),
        ]

    pp192x128 = GemmConfig(192, 128, 1, 2, consumers="pingpong", epi_n=16)
    if quick:
        return [
            KernelKey(EpilogueSpec("store"), pp(128, 128), "bfloat16", "row", "row", "bfloat16"),
            KernelKey(EpilogueSpec("accumulate"), pp(64, 256), "bfloat16", "col", "col", "float32"),
            KernelKey(EpilogueSpec("act", "swiglu"), pp(64, 256), "bfloat16", "row", "row", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "swiglu"), pp(128, 128), "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("store"), pp(128, 128, 2), "bfloat16", "row", "row", "bfloat16"),
        ]
    return kinds(pp(128, 128)) + kinds(pp(64, 256)) + [
        KernelKey(EpilogueSpec("store"), pp(128, 128, 2), "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("act", "swiglu"), pp(128, 128, 2), "float16", "row", "row", "float16"),
        KernelKey(EpilogueSpec("store"), pp(128, 128), "bfloat16", "row", "row", "float32"),
        KernelKey(EpilogueSpec("store"), pp(128, 128, sched="dynamic"), "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), pp(128, 128, sched="dynamic"), "bfloat16", "row", "col", "bfloat16"),
        # 128x192: 192 accumulators per consumer thread, the most that fit beside the epilogue
        KernelKey(EpilogueSpec("store"), pp(128, 192, 2), "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("accumulate"), pp(128, 192, 2), "bfloat16", "col", "col", "float32"),
        KernelKey(EpilogueSpec("act", "swiglu"), pp(128, 192, 2), "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), pp(128, 192, 2), "bfloat16", "row", "col", "bfloat16"),
        # 64-row tiles of 128 and 64 columns (one m64 atom per warpgroup): more tiles for GEMMs
        # of few 128-row tiles
        KernelKey(EpilogueSpec("act", "swiglu"), pp(64, 128), "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), pp(64, 64), "bfloat16", "row", "col", "bfloat16"),
        # 192x128 (three m64 atoms per warpgroup) with a 1x2 cluster and 16-column subtiles
        # (the 192-row epilogue buffers leave 4 stages at 32 columns, 5 at 16)
        KernelKey(EpilogueSpec("store"), pp192x128, "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("accumulate"), pp192x128, "bfloat16", "col", "col", "float32"),
        KernelKey(EpilogueSpec("act", "swiglu"), pp192x128, "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), dataclasses.replace(pp192x128, dact_prefetch=2),
                  "bfloat16", "row", "col", "bfloat16"),
    ] + narrow_tile_variants()


def narrow_tile_variants():
    """The 128x160 pingpong tile (2x1 cluster): its N-major B operand takes a 64B swizzle, split
    between the cluster's two multicasts."""
    c = GemmConfig(128, 160, 2, 1, 16, consumers="pingpong")
    return [
        KernelKey(EpilogueSpec("store"), c, "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("accumulate"), c, "bfloat16", "col", "col", "float32"),
        KernelKey(EpilogueSpec("act", "swiglu"), c, "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), dataclasses.replace(c, dact_prefetch=2, epi_n=16),
                  "bfloat16", "row", "col", "bfloat16"),
    ]


def tile256_variants(quick: bool = False):
    """The cooperative 256x128 tile (two m64 atoms per warpgroup) with its 1x2 cluster: the
    epilogue kinds whose buffers leave room for stages (the dact's do not: it is refused)."""
    c = GemmConfig(256, 128, 1, 2)
    out = [
        KernelKey(EpilogueSpec("store"), c, "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("accumulate"), c, "bfloat16", "col", "col", "float32"),
        KernelKey(EpilogueSpec("act", "swiglu", True), c, "bfloat16", "row", "row", "bfloat16", "bfloat16"),
    ]
    if not quick:
        out += [
            KernelKey(EpilogueSpec("store"), GemmConfig(256, 128), "float16", "col", "row", "float32"),
            KernelKey(EpilogueSpec("act", "gelu_tanh_approx", False, False), c, "bfloat16", "row", "row", "bfloat16"),
        ]
    return out


def epi16_variants(quick: bool = False):
    """16-column epilogue subtiles (config.epi_n) on the 128x128 pingpong tile, the cooperative
    256x128 tile (4 A/B stages with them) and 128x256, and the pingpong dact's two-slot preact
    ring (dact_prefetch=2) with and without them."""
    pp = GemmConfig(128, 128, 2, 1, 16, consumers="pingpong", epi_n=16)
    pp2 = GemmConfig(128, 128, 2, 1, 16, consumers="pingpong", epi_n=16, dact_prefetch=2)
    big = GemmConfig(256, 128, 1, 2, epi_n=16)
    out = [
        KernelKey(EpilogueSpec("dact", "swiglu"), pp2, "bfloat16", "row", "col", "bfloat16"),
        KernelKey(EpilogueSpec("act", "swiglu"), pp, "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("store"), big, "bfloat16", "row", "col", "bfloat16"),
    ]
    if not quick:
        out += [
            KernelKey(EpilogueSpec("dact", "relu"), pp2, "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "swiglu"), GemmConfig(128, 128, 2, 1, 16, consumers="pingpong", dact_prefetch=2),
                      "bfloat16", "row", "col", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "swiglu"), pp, "float16", "row", "col", "float16"),
            KernelKey(EpilogueSpec("accumulate"), pp, "bfloat16", "col", "col", "float32"),
            KernelKey(EpilogueSpec("act", "gelu_tanh_approx", True), big, "bfloat16", "row", "row", "bfloat16", "bfloat16"),
            KernelKey(EpilogueSpec("dact", "swiglu"), GemmConfig(128, 256, 2, 1, epi_n=16), "bfloat16", "row", "col", "bfloat16"),
        ]
    return out


def dynamic_variants(quick: bool = False):
    """The dynamic tile scheduler once per epilogue kind, in the layouts the MLP uses them in
    (fc1 act, dgrad dact, wgrad accumulate); the full run adds a non-gated act/dact and a tile."""
    dyn = GemmConfig(scheduler="dynamic")
    out = [
        KernelKey(EpilogueSpec("store"), dyn, "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("accumulate"), dyn, "bfloat16", "col", "col", "float32"),
        KernelKey(EpilogueSpec("act", "swiglu"), dyn, "bfloat16", "row", "row", "bfloat16"),
        KernelKey(EpilogueSpec("dact", "swiglu"), dyn, "bfloat16", "row", "col", "bfloat16"),
    ]
    if not quick:
        out += [
            KernelKey(EpilogueSpec("act", "gelu_tanh_approx", True, False), dyn, "float16", "row", "row", "float16", "float16"),
            KernelKey(EpilogueSpec("dact", "relu"), dyn, "float16", "row", "col", "float16"),
            KernelKey(EpilogueSpec("store"), GemmConfig(128, 128, scheduler="dynamic"), "bfloat16", "row", "col", "float32"),
        ]
    return out


def launch_registers(threads: int) -> int:
    """The registers a CTA of `threads` threads is launched with, one CTA per SM: ptxas gives a
    kernel that uses setmaxnreg the most registers per thread its thread count allows, 65,536 /
    threads down to a multiple of 8 (at most 248): 168 at 384 threads, 128 at 512, 96 at 640."""
    return threads * min(65536 // threads // 8 * 8, 248)


def register_overcommit(ptx: str):
    """None if the warpgroups' setmaxnreg counts fit the registers the CTA is launched with
    (launch_registers), else what does not: the producer warpgroup (128 threads) drops to the
    `dec` count and the rest of the CTA's threads (.reqntid) rise to the `inc` count, within that
    pool. An `inc` past it waits forever on the GPU (as the handoff schedule's first split, 32
    and 120 at 640 threads, did on an H100); here it fails the compile check instead."""
    threads = re.search(r"\.reqntid\s+(\d+)", ptx)
    dec = re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx)
    inc = re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)
    if not (threads and len(set(dec)) == 1 and len(set(inc)) == 1):
        return f"setmaxnreg: expected one .reqntid and one dec and one inc count, got {threads and threads.group(1)}, {dec}, {inc}"
    n, d, i = int(threads.group(1)), int(dec[0]), int(inc[0])
    total, pool = 128 * d + (n - 128) * i, launch_registers(n)
    if total > pool:
        return (f"setmaxnreg: 128 x {d} + {n - 128} x {i} = {total} registers, over the {pool} a CTA of "
                f"{n} threads is launched with")
    return None


def check_one(key: KernelKey):
    """Compile one kernel with PTX kept; returns (ok, message, seconds)."""
    from .compile import kernel_ptx

    t = time.time()
    try:
        ptx = kernel_ptx(key)
        if not ptx:
            return False, "no PTX produced", time.time() - t
        missing = []
        if ".target sm_90a" not in ptx:
            missing.append(".target sm_90a")
        if "wgmma.mma_async" not in ptx:
            missing.append("wgmma.mma_async")
        if "cp.async.bulk.tensor" not in ptx:
            missing.append("cp.async.bulk.tensor (TMA load)")
        if key.epilogue.kind == "accumulate" and "cp.reduce.async.bulk.tensor" not in ptx:
            missing.append("cp.reduce.async.bulk.tensor (TMA reduce-add)")
        if "setmaxnreg" not in ptx:
            missing.append("setmaxnreg")
        dynamic = key.config.scheduler == "dynamic"
        if dynamic and "atom.global.add" not in ptx:
            missing.append("atom.global.add (dynamic tile counter)")
        if key.config.stream_k:
            for op in ("red.relaxed.gpu.global.add", "ld.acquire.gpu", "fence.acq_rel.gpu"):
                if op not in ptx:
                    missing.append(f"{op} (stream-K flags)")
        pingpong = key.config.consumers == "pingpong"
        if pingpong and "bar.arrive" not in ptx:
            missing.append("bar.arrive (pingpong order barriers)")
        l2_prefetch = key.config.l2_prefetch and key.epilogue.kind in ("dact", "accumulate")
        if l2_prefetch and "cp.async.bulk.prefetch.tensor" not in ptx:
            missing.append("cp.async.bulk.prefetch.tensor (L2 prefetch of the epilogue input)")
        # config.pdl: one wait for the kernel before and one early launch of the next, in every
        # CTA's common prologue; none without it.
        pdl_ops = (ptx.count("griddepcontrol.wait"), ptx.count("griddepcontrol.launch_dependents"))
        if pdl_ops != ((1, 1) if key.config.pdl else (0, 0)):
            missing.append(f"griddepcontrol.wait / .launch_dependents once each with pdl={key.config.pdl}, "
                           f"not {pdl_ops[0]} / {pdl_ops[1]}")
        if missing:
            return False, "PTX lacks " + ", ".join(missing), time.time() - t
        over = register_overcommit(ptx)
        if over:
            return False, over, time.time() - t
        n_mma = ptx.count("wgmma.mma_async")
        n_tma = ptx.count("cp.async.bulk.tensor") + ptx.count("cp.reduce.async.bulk.tensor")
        msg = f"wgmma x{n_mma}, bulk tensor copies x{n_tma}"
        if dynamic:
            msg += f", atom.global.add x{ptx.count('atom.global.add')} (tile counter)"
        if l2_prefetch:
            msg += f", L2 prefetch x{ptx.count('cp.async.bulk.prefetch.tensor')}"
        if pingpong:
            msg += f", bar.arrive x{ptx.count('bar.arrive')} (pingpong turns)"
        if key.config.pdl:
            msg += ", griddepcontrol.wait + launch_dependents (pdl)"
        return True, msg, time.time() - t
    except Exception as e:  # report, don't stop: every variant gets its line
        msg = str(e).strip().splitlines()
        return False, f"{type(e).__name__}: {' '.join(msg[:3])[:300]}", time.time() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.kernels.selfcheck", description=__doc__.split("\n")[0])
    p.add_argument("--compile-only", action="store_true", help="compile and check PTX only (the only mode; no GPU is used)")
    p.add_argument("--quick", action="store_true", help="a representative subset (CI)")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if not args.compile_only:
        print("note: only --compile-only is implemented; GPU correctness lives in tests/kernels/test_ops_gpu.py")

    keys = variants(args.quick)
    t0 = time.time()
    failures = 0
    jobs = max(1, min(args.jobs, len(keys)))
    if jobs == 1:
        results = map(check_one, keys)
    else:
        pool = ProcessPoolExecutor(max_workers=jobs)
        results = pool.map(check_one, keys)
    for key, (ok, msg, dt) in zip(keys, results):
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {key.name:70s} {dt:5.1f}s  {msg}", flush=True)
    print(
        f"selfcheck: {len(keys) - failures}/{len(keys)} variants compiled for sm_90a with wgmma + TMA "
        f"({failures} failed) in {time.time() - t0:.0f}s",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
