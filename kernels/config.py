"""Kernel configuration: what a compiled kernel is specialized on, and the shape heuristic.

A :class:`GemmConfig` fixes everything that changes the generated code except the epilogue:
CTA tile, cluster shape, rasterization group, the SM count the persistent grid is sized for, and
the tile scheduler ("static", the default, or "dynamic": an atomic tile counter; see
tile_scheduler.py) and the consumer schedule ("cooperative", the default: the consumer
warpgroups split one tile; "pingpong": each warpgroup owns a whole tile and the two alternate;
"handoff": two warpgroups' mainloop hands each tile's accumulators to two epilogue warpgroups;
see gemm_sm90.py), and whether the last partial wave runs stream-K (``stream_k``).
Problem sizes and strides stay dynamic, so one compiled kernel serves every shape of a layout.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

# Hopper SXM parts (H100, H200) have 132 SMs; the persistent grid is sized for this many CTAs at
# most. A part with fewer SMs would still run correctly (the scheduler strides by the launched
# grid), only with one partial wave.
DEFAULT_NUM_SMS = 132

# K extent of one pipeline stage for 16-bit operands: 64 elements = 128 bytes, one full 128B swizzle
# row, which is what TMA and WGMMA both like best.
TILE_K = 64

# N extents of a CTA tile. 160 is for N that 192 leaves a partial last wave on (N = 7168: 37.3
# tiles of 192 per row, 44.8 of 160); its N-major B operand takes a 64B swizzle instead of 128B.
# Held 1 s on an H200, 2026-11-30 (bench configs --h 7168 --also tile_n=160): the plain dy@W2 at
# N = 7168 ran 1.4% faster than at 192 and its dact 1.2% slower, so no default picks it. 176
# (32B swizzle) ran 16-22% slower in the same run and is not offered.
TILE_N_CHOICES = (64, 128, 160, 192, 256)

# Pingpong: most fp32 accumulators one consumer thread may hold (one warpgroup owns a whole tile).
# 192 (a 128x192 tile) leaves ~40 of the consumer's 232 registers for everything else: ptxas
# reports no spills for store, accumulate and dact there, 12-76 bytes for the gated act.
PINGPONG_MAX_ACC_REGS = 192
# Cooperative 192-row tiles: three consumer warpgroups of 64 rows at 160 registers a thread, so
# tile_n / 2 accumulators per thread; 128 columns (64) is what a cooperative 128x128 thread holds.
COOPERATIVE_192_MAX_N = 128


# The 128x192 pingpong tile is the default only where its padded N is at most this factor of a
# 128-wide tile's. N = 4096 pads 3.1%: on an H200, 2026-11-30, held 0.5 s, 1.5% faster than
# 128x128 in one run and even in another (at long K, N = 4096 takes cooperative 128x256, below).
WIDE_TILE_MAX_PAD = 1.04
# ... and where its coarser waves do not cost more than its tile saves. A persistent grid takes
# as long as its busiest cluster's tiles, ceil(clusters / grid) of them; per output element a
# 128x192 tile ran up to 7% faster than 128x128 (held, above). Where 128-wide tiles' waves are
# then still at least 5% faster (e.g. fc1 and the dact at T=1000, h=10240: 4 waves of 192
# against 5 of 128, 12%), 128 it is. The rule is that arithmetic on those figures; no sweep has
# timed it yet (the sweep's T=1000 d=5120 gelu shape ran 0.82x eager with 192).
WIDE_TILE_SPEEDUP = 1.07
NARROW_TILE_MIN_GAIN = 1.05

# From this K up, big GEMMs other than the dact take cooperative 128x256 tiles (2x1 cluster): the
# least operand traffic per MAC we have (0.0078 elements from L2, n256 WGMMAs reading the least
# shared memory), while the epilogue it cannot overlap is a small share of a tile's time once K
# is long. Held 0.5 s on an H200, 2026-11-30 (bench configs --also
# consumers=cooperative,tile_n=256,..., at h = 14336, 7168 and gelu 16384), against pingpong
# 128x192: fc2 and dx (K 7168 to 28672) 3-5% faster, dW1 (K 8192) 1.5-3%; at K = 4096 the plain
# dy@W2 was even and the dact 7% slower (0.845 vs 0.910x cuBLAS).
COOPERATIVE_MIN_K = 6144
# ... unless pingpong 128x192 tiles fill the grid's waves at least as well. At K = 8192, per output
# element the two run alike, and the persistent grid's quantized waves decide: held 0.5 s x 4 in
# alternating order on an H200, 2026-12-02 (bench configs --rounds 4 --also
# consumers=pingpong,tile_n=192), at T=8192 d=8192 gelu h=8192 (8192 x 8192 GEMMs: 16 waves of
# 128x256 clusters of which the last is half full, against 21 of 128x192 with the last 85% full;
# 256 x 16 = 4096 columns of tile time against 192 x 21 = 4032) pingpong ran fc2, dx and both
# wgrads 0.6-1.9% faster, the same dact config in both columns 0.4% apart; at T=8192 d=4096 h=14336
# the wgrads (3584 against 3648 columns for dW2, 7168 against 7296 for dW1) ran 1.0-2.5% faster
# cooperative. The earlier figures behind COOPERATIVE_MIN_K (fc2 and dx at d=4096, 3-5% faster
# cooperative; 2048 against 2112 columns) fit the same count. Where the columns tie, pingpong,
# whose one warpgroup's epilogue runs beside the other's mainloop: fc1 at T=16384 d=8192 swiglu
# h=11008 (16384 x 22016 x 8192; 84 waves of 256 columns against 112 of 192, 21504 each) ran
# 8.796 against 9.028 ms with the gated activation (2.6%) and 8.773 against 8.852 plain, held 0.5
# s x 4 on an H200, 2026-12-04 (`bench configs --T 16384 --d 8192 --h 11008 --act swiglu
# --rounds 4 --hold-s 0.5 --also consumers=pingpong,tile_n=192`); that step read 0.9925x quack
# (0.9915-0.9950, six turns) before. quack's MLP runs pingpong 128x192 at every GEMM. The GEMMs
# the comparison moves at five more sweep shapes, timed the same way (gpu_run.sh configs_long_k,
# 2026-12-02): from 0.2% slower (fc2 at T=16384 d=8192) to 2.7% faster (dW2 at d=5120 h=13824);
# the sweep with it read T=8192 d=8192 gelu h=8192 at 0.988x quack, 0.977x without.
# Below COOPERATIVE_MIN_K, where the big pingpong config falls back to 128x128 tiles (N that 192
# pads too much, or waves too coarse for 192: NARROW_TILE_MIN_GAIN), cooperative 128x256 tiles
# in 2x1 clusters read the fewest operand elements per MAC and the pingpong tile has lost its
# width advantage; from this K up they take over where their waves take no more columns of tile
# time. Store, act and the dact (the wgrads were not timed there). Held 0.5 s x 4 on an H200,
# 2026-12-02 (`bash tools/gpu_run.sh configs_mid`, x cuBLAS,
# pingpong 128x128 -> cooperative 128x256, equal columns of tile time): T=16384 d=5120 gelu
# h=2560 fc1 + act 0.915 -> 0.952, plain 0.956 -> 0.993 (K = 5120); T=8192 d=4096 gelu h=2048
# fc1 + act 0.916 -> 0.930, plain 0.984 -> 0.974 (K = 4096); T=8192 d=2048 gelu h=4096 fc2 0.970
# -> 0.975, dx 0.973 -> 0.977. Where the default is pingpong 128x192 the same swap ran 0.4-4.7%
# slower at 10 of 14 GEMMs (fc2 and dx at T=16384 d=5120 1.028 / 1.019 -> 0.991 / 0.981, fc1 +
# act at T=4096 d=5120 swiglu 0.985 -> 0.940), and at K = 1024 (T=4096 d=1024 gelu fc1 + act,
# 128x128) 0.866 -> 0.847: 192 and short K stay pingpong. The dact there, in cooperative 128x256
# (one-subtile preact prefetch, 32-column subtiles) against pingpong 128x128 (two slots, 16-column
# subtiles), held 0.4 s x 4 on an H100, 2026-12-05 (`bash tools/gpu_run.sh configs_narrow_gelu`;
# benchmarks/h100-configs-narrow-gelu.txt), x cuBLAS's plain GEMM: T=8192 d=4096 gelu h=2048
# 0.827 -> 0.893 (0.822 -> 0.895 in a second run), T=16384 d=5120 gelu h=2560 0.792 -> 0.904
# (0.818 -> 0.913), T=8192 d=4096 swiglu h=1376 0.850 -> 0.881; pingpong 128x192 and cooperative
# 128x128 with the four-slot ring were no faster than the default. Whole steps in the H100 sweep:
# 1.298 -> 1.257 ms and 4.143 -> 4.013 ms at the two gelu shards (0.998x and 0.984x eager before,
# 1.037x and 1.003x after), the swiglu shard 1.404 -> 1.406. On an H200, the same A/B
# (benchmarks/h200-narrow-dact.txt): 0.859 -> 0.898, 0.879 -> 0.909, 0.860 -> 0.873.
NARROW_COOPERATIVE_MIN_K = 4096
# From this K up, big GEMMs past COOPERATIVE_MIN_K take cooperative 128x256 even where pingpong
# 128x192's waves take fewer columns of tile time. Pingpong's gain is its epilogue hidden behind
# the other warpgroup's mainloop, a share of a tile's time that shrinks as K grows; cooperative
# 128x256 reads 10% fewer operand bytes per MAC (384 against 320 rows of A and B per 32768 against
# 24576 outputs) at every K. Held 0.4 s x 4 on an H100, 2026-12-05 (`bench configs --hold-s 0.4
# --rounds 4 --also consumers=cooperative,tile_n=256`; benchmarks/h100-long-k.txt), ms, pingpong
# -> cooperative (cuBLAS): at K = 11008 and 22016 fc2 and dx of T=16384 d=8192 swiglu h=11008
# 4.650 -> 4.355 (4.374) and 9.414 -> 8.687 (9.053), dx of T=8192 d=8192 swiglu h=5504 2.227 ->
# 2.204 (2.230); at K = 8192, T=8192 d=8192 gelu h=8192, fc2 1.632 -> 1.648 and dx 1.637 -> 1.648
# (pingpong ahead, as on an H200 in the figures above). Between the two Ks measured.
LONG_K_COOPERATIVE_MIN_K = 10240

# Big dacts up to this K run cooperative 128x128 tiles in 1x1 clusters, raster 8 (the small-shape
# dact's config) instead of big_pingpong_config. At K = 1024 the mainloop of a tile is as short
# as its epilogue's 10 bytes per element (preact pair in, dpreact pair and postact out), and
# pingpong 128x192 ran the swiglu dact at twice a plain GEMM's time. Held 0.5 s x 4 on an H200, 2026-12-02 (bench configs
# --only dpost --also consumers=cooperative,tile_n=128,cluster_m=1,raster_group=8,
# dact_prefetch=1,epi_n=32), ms pingpong 128x192 -> cooperative 128x128: T=8192 d=1024 swiglu
# h=2816 0.167 -> 0.143 (cuBLAS's plain GEMM 0.081); T=65536 d=1024 1.220 -> 1.108 (held
# 0.4 s x 4; 1.125 in 2x1 clusters). At K = 2048 pingpong stayed ahead (T=8192 d=2048 h=5632
# 0.416 against 0.433, T=65536 d=2048 h=704 0.435 against 0.464), and at K = 4096 (0.176
# against 0.202). `bash tools/gpu_run.sh configs_dact`; benchmarks/h200-dact-short-k.txt.
# Its preact ring has four slots (dact_prefetch=3, dpreact in place; the same bits as two): a
# whole tile's preact is in flight during its mainloop, and A/B keep the stages they had (4
# gated, 5 not). Held 0.4 s x 6 on an H200, 2026-12-05 (bench configs --only dpost --also
# dact_prefetch=3), ms two slots -> four: T=65536 d=1024 swiglu h=2816 1.062 -> 1.039, T=8192
# 0.136 -> 0.134, gelu T=65536 h=1024 0.329 -> 0.316, gelu T=16384 h=4096 0.332 -> 0.325
# (benchmarks/h200-dact-short-k.txt).
SHORT_K_DACT_MAX_K = 1024
SHORT_K_DACT_PREFETCH = 3


# L2 cache-policy operands of the TMA copies (the 64-bit encodings CUTLASS's CacheHintSm90 names
# EVICT_NORMAL / EVICT_FIRST / EVICT_LAST). Without one the DSL emits every TMA copy with
# `.L2::cache_hint` and a policy of 0, which createpolicy never produces.
L2_EVICT_NORMAL = 0x1000000000000000
L2_EVICT_FIRST = 0x12F0000000000000
L2_EVICT_LAST = 0x14F0000000000000

# GemmConfig.cache_hints -> (A/B operand loads, epilogue loads, epilogue stores); None: the
# DSL's default operand (0).
CACHE_HINTS = {
    "none": (None, None, None),
    "normal": (L2_EVICT_NORMAL, L2_EVICT_NORMAL, L2_EVICT_NORMAL),
    # Epilogue traffic streams through L2 once (the dact's preact in, dpreact and postact out:
    # 1.2 GB a call at h=14336) beside A/B tiles that other CTAs read again: let it go first.
    "stream": (L2_EVICT_NORMAL, L2_EVICT_FIRST, L2_EVICT_FIRST),
    "keep": (L2_EVICT_LAST, L2_EVICT_FIRST, L2_EVICT_FIRST),
}


@dataclass(frozen=True)
class GemmConfig:
    tile_m: int = 128
    tile_n: int = 256
    cluster_m: int = 1
    cluster_n: int = 1
    # Grouped rasterization: tiles are visited in groups of `raster_group` columns (clusters) of
    # tiles, walking down M inside a group, so consecutive CTAs share B tiles and A tiles in L2.
    raster_group: int = 8
    num_sms: int = DEFAULT_NUM_SMS
    # "static": CTA c takes tiles c, c + grid, ...; "dynamic": after its first tile a CTA claims
    # the next one from a global atomic counter (balances uneven progress; needs a 1x1 cluster).
    scheduler: str = "static"
    # "cooperative": the consumer warpgroups work on one tile_m x tile_n tile (two of tile_m / 2
    # rows each; three of 64 rows at tile_m = 192, one at 64) and then all run its epilogue, so
    # the tensor cores idle during every epilogue.
    # "handoff": two warpgroups run the mainloop of a 128-row tile, as cooperative ones do, and
    # hand its accumulators through shared memory to two more warpgroups, which run its epilogue
    # while the first two run the next tile's mainloop (gemm_sm90, "Consumer schedules").
    # "pingpong": tile_m x tile_n is ONE warpgroup's tile; the two warpgroups take alternate tiles
    # and their mainloops alternate, so one's epilogue overlaps the other's mainloop.
    consumers: str = "cooperative"
    # dact with cooperative consumers: how many preact subtiles are loaded ahead of the one
    # being computed. 1: a two-slot preact ring and separate dpreact buffers. 2 or 3: a ring of
    # 3 or 4 slots, with dpreact written in place over its preact and stored from there, so the
    # dpreact buffers' shared memory holds the deeper ring. At 128x256, a gated dact keeps 3 A/B
    # stages with 2 and drops to 2 with 3. On an H200, 2026-11-30 (bench configs --only dpost
    # --dact-prefetch N): 2 ran 1.443 ms against 1's 1.445, 3 ran 2.16 ms.
    # Pingpong dact always writes dpreact in place; dact_prefetch is its slots per warpgroup:
    # 1 (the next subtile's preact loads once this one's stores have read the slot) or 2 (both
    # slots filled at the tile's start, each refilled one subtile later; with epi_n=16 this fits
    # beside 5 A/B stages).
    dact_prefetch: int = 1
    # dact and accumulate: the producer warp prefetches the tile's epilogue input (preact, or the
    # fp32 D that the reduce-add store updates) into L2 during the last K blocks of the tile's
    # mainloop. Persistent CTAs reach their epilogues together, so without it every SM reads
    # its epilogue input from HBM in the same few microseconds while the tensor cores wait.
    l2_prefetch: bool = False
    # Most A/B stages the smem ring may hold (the kernel takes as many as fit, up to this):
    # for measuring what the stage count is worth at a tile.
    max_stages: int = 8
    # Accumulator columns per epilogue subtile: 32, or 16 to halve every epilogue buffer (more
    # A/B stages beside it, or a second preact slot per pingpong warpgroup), at twice the
    # subtiles (TMA stores and barriers) per tile.
    epi_n: int = 32
    # Programmatic dependent launch: the kernel is launched with programmatic stream
    # serialization allowed, so its CTAs may start while the kernel before it on the stream is
    # still running; each CTA sets up its shared memory, barriers and cluster, then waits
    # (griddepcontrol.wait) until that kernel has finished and its writes are visible, before it
    # touches global memory. Once past the wait it lets the next such kernel start the same way
    # (griddepcontrol.launch_dependents). What it can save is the gap between two kernels of a
    # step: the launch and each CTA's setup run while the SMs drain the previous kernel's last
    # tiles. Work before it that is not a kernel (a memset, an event wait) keeps its full order.
    pdl: bool = False
    # The L2 eviction policy of the TMA copies, by CACHE_HINTS: "normal" (EVICT_NORMAL on every
    # copy, as CUTLASS C++ passes by default), "none" (the DSL's undocumented operand of 0),
    # "stream" (epilogue traffic evict-first) or "keep" (A/B tiles evict-last as well). Held 2 s
    # on an H200, 2026-11-30 (tools/clock_probe.py --h 14336 --also cache_hints=none ...),
    # "normal" and "none" ran dy@W2 (1.463 / 1.464 ms) and its dact (1.590 / 1.589 ms) at the same
    # time; "stream" slowed the dact 1.2%. "normal" is the default because it is the documented
    # policy, not for speed.
    cache_hints: str = "normal"
    # Stream-K for the last partial wave (cooperative, static, tile_m <= 128; the store,
    # accumulate and act epilogues, not the dact):
    # whole tiles for the full waves, then the remaining tiles' K blocks shared evenly by every
    # cluster, partial sums reduced in a fixed order through an fp32 workspace (tile_scheduler,
    # "Stream-K"). Deterministic, but not bitwise equal to the whole-tile kernel.
    stream_k: bool = False
    # Gated dact: rows that would share shared-memory chunks with their neighbour row read preact
    # and write dpreact at the accumulator pair next door, 2 wavefronts per warp access instead
    # of 4 (PersistentGemmSm90._pair_swap; kernels/NOTES.md, "dact"). Off only to measure it.
    dact_pair_swap: bool = True
    # Rasterization (tile_scheduler.work_at), after raster_group: "n": the groups are raster_group
    # cluster columns, walked columns first, then down M; "m": raster_group cluster rows, walked
    # rows first, then across N (the A rows of a group stay in L2 while B streams past).
    raster_along: str = "n"
    # Every other group walks its long side from the far end, so each group starts on the A rows
    # (or B columns) that the one before it ended on.
    serpentine: bool = False

    def __post_init__(self):
        for name in ("l2_prefetch", "stream_k", "dact_pair_swap", "serpentine", "pdl"):
            # a string such as "no" would otherwise switch the option on without a word
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be True or False")
        if self.tile_m not in (64, 128, 192, 256):
            raise ValueError(f"tile_m={self.tile_m}: must be 64, 128, 192 or 256")
        if self.tile_n not in TILE_N_CHOICES:
            raise ValueError(f"tile_n={self.tile_n}: must be one of {TILE_N_CHOICES}")
        if self.cluster_m not in (1, 2) or self.cluster_n not in (1, 2):
            raise ValueError(f"cluster=({self.cluster_m},{self.cluster_n}): each 1 or 2")
        if self.cluster_m * self.cluster_n > 2:
            # The persistent grid is num_sms / cluster size clusters, and an H200 holds only 30
            # four-CTA clusters at once (cudaOccupancyMaxActiveClusters; 120 of its 132 SMs):
            # the 33rd runs as a second wave. On an H200, 2026-11-30, 2x2 clusters ran every MLP
            # GEMM at 0.49-0.56x cuBLAS (bench configs --also cluster_n=2), and even a 30-cluster
            # grid would leave 12 SMs idle.
            raise ValueError(
                f"cluster=({self.cluster_m},{self.cluster_n}): at most 2 CTAs per cluster (2x1 or "
                "1x2); a Hopper GPU fits too few 4-CTA clusters at once for a persistent grid"
            )
        if self.scheduler not in ("static", "dynamic"):
            raise ValueError(f"scheduler={self.scheduler!r}: must be 'static' or 'dynamic'")
        if self.scheduler == "dynamic" and (self.cluster_m, self.cluster_n) != (1, 1):
            raise ValueError(
                f"scheduler='dynamic' with cluster=({self.cluster_m},{self.cluster_n}): the dynamic "
                "scheduler supports 1x1 clusters only (the claimed tile would have to reach the peer CTAs)"
            )
        if self.consumers not in ("cooperative", "pingpong", "handoff"):
            raise ValueError(f"consumers={self.consumers!r}: must be 'cooperative', 'pingpong' or 'handoff'")
        if self.consumers == "handoff" and (self.tile_m != 128 or self.tile_n > 128 or self.scheduler != "static"):
            # Two warpgroups' fp32 accumulators of a 128 x tile_n tile go through shared memory
            # (64 KB at 128 columns) beside the A/B ring; the epilogue warpgroups walk the static
            # tile sequence themselves.
            raise ValueError(
                f"consumers='handoff' with tile {self.tile_m}x{self.tile_n}, scheduler={self.scheduler!r}: "
                "the handoff schedule runs 128-row tiles of at most 128 columns with the static scheduler"
            )
        if self.tile_m == 256:
            # Two warpgroups of 128 rows each: tile_n accumulators per thread, as many as one
            # pingpong warpgroup's 128x128. The tile cuBLAS picks for most of the MLP's GEMMs
            # (256x128, 1x2 cluster): half the L2 reads per MAC of a 128x128 tile.
            if self.consumers != "cooperative" or self.tile_n > 128:
                raise ValueError(
                    f"tile {self.tile_m}x{self.tile_n} with consumers={self.consumers!r}: a 256-row tile "
                    "is cooperative with tile_n <= 128 (each warpgroup holds 128 x tile_n accumulators)"
                )
        if self.tile_m == 192 and self.consumers == "cooperative" and self.tile_n > COOPERATIVE_192_MAX_N:
            # Three consumer warpgroups of 64 rows, each thread at 160 registers (gemm_sm90's
            # CONSUMER_REGS): tile_n / 2 fp32 accumulators per thread.
            raise ValueError(
                f"tile 192x{self.tile_n} with consumers='cooperative': three warpgroups of 64 rows "
                f"at 160 registers a thread hold tile_n / 2 accumulators each; the rule is tile_n <= "
                f"{COOPERATIVE_192_MAX_N}"
            )
        if self.consumers == "pingpong":
            # One warpgroup holds the whole tile's fp32 accumulators: tile_m * tile_n / 128 per
            # thread. Past 192 the consumer (232 registers) would spill in the mainloop.
            acc = self.tile_m * self.tile_n // 128
            if acc > PINGPONG_MAX_ACC_REGS:
                raise ValueError(
                    f"consumers='pingpong' with tile {self.tile_m}x{self.tile_n}: one warpgroup would "
                    f"hold {acc} fp32 accumulators per thread; the rule is tile_m * tile_n / 128 <= "
                    f"{PINGPONG_MAX_ACC_REGS} (e.g. 128x128, 64x256 or 128x192)"
                )

        if self.stream_k and (self.consumers, self.scheduler) != ("cooperative", "static"):
            raise ValueError(
                f"stream_k=True with consumers={self.consumers!r}, scheduler={self.scheduler!r}: "
                "stream-K needs consumers='cooperative' and scheduler='static'"
            )
        if self.stream_k and self.tile_m > 128:
            raise ValueError(f"stream_k=True with tile_m={self.tile_m}: stream-K tiles have at most 128 rows")
        if self.raster_along not in ("m", "n"):
            raise ValueError(f"raster_along={self.raster_along!r}: must be 'm' or 'n'")
        if self.cache_hints not in CACHE_HINTS:
            raise ValueError(f"cache_hints={self.cache_hints!r}: must be one of {sorted(CACHE_HINTS)}")
        if self.epi_n not in (16, 32):
            raise ValueError(f"epi_n={self.epi_n}: must be 16 or 32")
        if not 2 <= self.max_stages <= 8:
            raise ValueError(f"max_stages={self.max_stages}: must be 2 to 8")
        if self.dact_prefetch not in (1, 2, 3):
            raise ValueError(f"dact_prefetch={self.dact_prefetch}: must be 1, 2 or 3")
        if self.consumers == "pingpong" and self.dact_prefetch > 2:
            raise ValueError(
                f"dact_prefetch={self.dact_prefetch} with consumers='pingpong': a pingpong warpgroup's "
                "preact ring has 1 or 2 slots"
            )

    @property
    def key(self) -> str:
        # The config is part of the name of every compiled kernel (and of its disk-cache file):
        # tile, cluster, raster group and SM count always; each other field only as a suffix when
        # it is off its default.
        sched = "" if self.scheduler == "static" else f"_{self.scheduler}"
        cons = "" if self.consumers == "cooperative" else f"_{self.consumers}"
        pf = "" if self.dact_prefetch == 1 else f"_pf{self.dact_prefetch}"
        l2 = "_l2pf" if self.l2_prefetch else ""
        st = "" if self.max_stages == 8 else f"_st{self.max_stages}"
        st += "" if self.epi_n == 32 else f"_e{self.epi_n}"
        st += "" if self.cache_hints == "normal" else f"_l2{self.cache_hints}"
        st += "_sk" if self.stream_k else ""
        st += "" if self.dact_pair_swap else "_nops"
        st += "" if self.raster_along == "n" else "_rm"
        st += "_sp" if self.serpentine else ""
        st += "_pdl" if self.pdl else ""
        return (
            f"t{self.tile_m}x{self.tile_n}_c{self.cluster_m}x{self.cluster_n}"
            f"_g{self.raster_group}_sm{self.num_sms}{sched}{cons}{pf}{l2}{st}"
        )


def parse_fields(text: str) -> dict:
    """'l2_prefetch=1,dact_prefetch=2' -> GemmConfig field overrides, typed like the fields (for
    `bench configs --also` and `warmup --also`). ValueError names what is not FIELD=VALUE."""
    types = {f.name: f.type for f in dataclasses.fields(GemmConfig)}
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in types or not value:
            raise ValueError(f"{text!r}: {item!r} is not FIELD=VALUE with a GemmConfig field ({', '.join(types)})")
        kind = types[key]
        if kind in (bool, "bool"):
            if value.lower() not in _BOOLS:
                raise ValueError(f"{text!r}: {key} takes 1/0 or true/false, got {value!r}")
            out[key] = _BOOLS[value.lower()]
        elif kind in (int, "int"):
            try:
                out[key] = int(value)
            except ValueError:
                raise ValueError(f"{text!r}: {key} takes an int, got {value!r}") from None
        else:
            out[key] = value
    return out


_BOOLS = {"1": True, "true": True, "0": False, "false": False}


def is_big(m: int, n: int, num_sms: int = DEFAULT_NUM_SMS) -> bool:
    """Two or more waves of 128x256 tiles: every GEMM of an MLP at T=8192."""
    return -(-m // 128) * -(-n // 256) >= 2 * num_sms


def pads_much_more(n: int, tile_n: int, limit: float) -> bool:
    """Whether tile_n-wide tiles pad N to more than ``limit`` times the columns 128-wide tiles
    pad it to (WIDE_TILE_MAX_PAD, STREAM_K_WIDE_MAX_PAD)."""
    return -(-n // tile_n) * tile_n > limit * (-(-n // 128) * 128)


def big_pingpong_config(m: int, n: int, num_sms: int = DEFAULT_NUM_SMS, kind: str = "store") -> GemmConfig:
    """The pingpong config of a big GEMM (``is_big``): 2x1 cluster from PAIR_MIN_ROWS rows,
    walking groups of 8 cluster rows (``with_raster``), one warpgroup's epilogue running under
    the other's mainloop.

    Its warpgroup tile is 128x192 (192 accumulators per thread): with the 2x1 cluster, 0.0091
    operand elements read from L2 per MAC against 128x128's 0.0117. At the power cap the time of
    a GEMM follows its energy, not its cycles: held 0.5 s on an H200, 2026-11-30 (bench configs
    --also tile_n=128), 25 of 27 MLP GEMMs ran 1-7% faster than at 128x128. Where 192 would pad
    N much more than 128 does (N = 256: 50%), or its waves are too coarse for the grid
    (NARROW_TILE_MIN_GAIN), 128 it stays.

    The dact's two preact slots per warpgroup, both filled at the tile's start, hide its preact
    load behind the other warpgroup's mainloop; 16-column subtiles make room for them (4 A/B
    stages at 128x192, 5 at 128x128). On an H200, 2026-11-30 (bench configs --only dpost, swiglu),
    call by call: 2.4% faster at h=7168, 2.3% at h=14336; either change alone is neutral or
    slower. Held 0.5 s, at 128x192 and h=7168: 1.13x the time of cuBLAS's plain GEMM against
    1.17x with one slot.
    """
    dact = dict(dact_prefetch=2, epi_n=16) if kind == "dact" else {}

    def config(tn):
        return GemmConfig(128, tn, cluster_rows(m), 1, 16, num_sms, consumers="pingpong",
                          l2_prefetch=kind == "accumulate", **dact)

    wide, narrow = config(192), config(128)
    if pads_much_more(n, 192, WIDE_TILE_MAX_PAD):
        return with_raster(narrow)
    if (wave_columns(wide, m, n) / WIDE_TILE_SPEEDUP
            >= NARROW_TILE_MIN_GAIN * wave_columns(narrow, m, n)):
        return with_raster(narrow)
    return with_raster(wide)


# Big whole-tile GEMMs walk groups of this many cluster rows (raster_along="m", serpentine): the
# A rows of a group stay in L2 while B streams past, where groups of 16 cluster columns held 16
# panels of B while A streamed (10-20% more DRAM reads than quack's walk, ncu). Held 0.5 s x 4 on
# an H200, 2026-12-04 (bench configs --also raster_along=...; benchmarks/h200-raster.txt), ms
# columns -> rows: T=8192 d=4096 swiglu h=14336 fc1 + act 2.886 -> 2.847, plain fc1 2.864 ->
# 2.826, the dact 1.569 -> 1.551, dW2 += 1.505 -> 1.488, fc2 1.439 -> 1.424, dx 2.850 -> 2.822,
# dW1 += 3.033 -> 2.955 (2.972 -> 2.968 in another run); T=8192 d=8192 gelu h=8192 fc1 + act
# 1.659 -> 1.628, the dact 1.684 -> 1.670; T=16384 d=8192 swiglu h=11008 dx 8.845 -> 8.762, dW1 +=
# 8.782 -> 8.686. Summed over a step's moved GEMMs, rows were faster at seven of eight shapes
# (0.003-0.198 ms) and 0.020 ms slower at T=65536 d=1024 swiglu h=2816 (fc1 + act 1.172 -> 1.185).
# DRAM reads (ncu, tools/ncu_vs_quack.py): the headline's fc1 + act 2.66 -> 2.11 GB, its dact
# 1.83 -> 1.64 GB, quack's. Groups of 4 rows, or 8 or 16 columns with the serpentine walk, did
# not gain. Stream-K configs keep the column groups (their split of the grid is tested with those).
ALONG_M_RASTER_GROUP = 8


def with_raster(cfg: GemmConfig) -> GemmConfig:
    """``cfg`` walking groups of ``ALONG_M_RASTER_GROUP`` cluster rows, serpentine; under stream-K
    as it is."""
    if cfg.stream_k:
        return cfg
    return dataclasses.replace(cfg, raster_along="m", raster_group=ALONG_M_RASTER_GROUP, serpentine=True)


# Stream-K (GemmConfig.stream_k) is picked where whole tiles would waste at least this share of
# the time in the last wave: (1 - R/G) / (W + 1) for W full waves and R of G clusters busy in the
# last. Held 1 s on an H200, 2026-11-30 (bench configs --only fc2,dx,dW2,dW1 --also stream_k=1 at
# T = 2304, 4352, 8192), stream-K realized about half of that share, less ~1.5%: fc2 / dx at
# T=2304 (27% predicted) ran 14-16% faster, at T=4352 (18%) 10%; at T=8192 (3%) even or within
# 2% either way.
STREAM_K_MIN_WASTE = 0.05
# ... and only where K is long enough that a contributor's fp32 partial tile (written once, read
# once: 128 KB at 128x256) stays small beside its mainloop's operand traffic (~1.5 MB per 64 K
# blocks at 128x256); the measured gains were at K = 14336 and 28672.
STREAM_K_MIN_K = 4096
# Where even 128x128 tiles leave SMs idle (fewer tiles than SMs) and K is at least this long,
# the default is stream-K over the whole grid with 128x256 tiles (2x1 clusters from
# PAIR_MIN_ROWS rows): every SM shares the K blocks. Held 0.5 s on an H200, 2026-12-01 (bench configs --T 65536 --d 1024
# --h 1024 --act gelu_tanh_approx --only dW2,dW1 --also stream_k=1,tile_n=256,cluster_m=2 ...):
# the wgrads 1024 x 1024 x 65536 ran 0.262-0.267 ms against whole 128x128 tiles' 0.318-0.319
# (cuBLAS 0.212), 128x256 in 1x1 clusters 0.280, 128x128 stream-K 0.355-0.374; at 2048 x 704
# x 65536 (T=65536, d=2048, h=704) even with whole tiles (0.371 against 0.371 ms). At short
# K it loses: fc2 and dx at T=512, d=1024 (32 tiles, K = 2816 and 5632, graphed) ran 0.029 and
# 0.033 ms against whole tiles' 0.016 and 0.028. The partial sums (16.5 MiB of fp32 on 132
# SMs) then are a small share of the traffic.
UNDERFILLED_STREAM_K_MIN_K = 32768
# Below two waves of 128x256 tiles (not ``is_big``), the default's cooperative 128x128 tiles (whole
# or stream-K) and whole 128x256 tiles give way to whole 128x192 tiles where those need at most
# this share of the columns of tile time (``wave_columns``): e.g. fc1 at T=512, N = 5632: 176 tiles
# of 128x128 in two waves on 132 SMs (256 columns) against 120 of 128x192 in one (192). Held as
# CUDA graphs of 20 calls on an H200, 2026-12-02 (`bash tools/gpu_run.sh configs_wave`, x cuBLAS,
# default -> 128x192): T=512 d=1024 swiglu fc1 + act 0.694 -> 0.843, dW2 += 0.820 -> 0.994, dW1 +=
# 0.802 -> 0.945; T=512 d=8192 fc1 + act (stream-K 128x128) 0.803 -> 0.895; T=2048 d=2048 swiglu
# dact 0.638 -> 0.680, dW2 += 0.877 -> 1.011; T=8192 d=1024 dW2 += (stream-K 128x128) 0.897 ->
# 0.981. Stream-K in 128x256 tiles balances its last wave better than 192's whole tiles do, so it
# stays: T=8192 d=1024 dW1 += 1.047 against 0.991, T=1000 d=5120 fc2 and dx 0.917-0.923 against
# 0.889. From UNDERFILLED_STREAM_K_MIN_K up (the wgrads at T=65536), not timed: the default stays.
WIDE_WAVES_MAX_SHARE = 0.8
# 2x1 clusters (the pair shares its B tile through TMA multicast) for GEMMs of at least this many
# rows, the big pingpong ones too. Held on an H200, 2026-12-01 (bench configs --T 1000 --d 5120
# --h 10240 --act gelu_tanh_approx --graphed 20 --hold-s 0.4 --only fc2,dx --also cluster_m=2):
# fc2 and dx, 1000 x 5120 x 10240 in stream-K 128x256 tiles, 0.177 ms in 2x1 clusters against
# 0.193-0.194 in 1x1 (cuBLAS 0.162). Held 0.4 s x 4 on an H100, 2026-12-06 (bench configs --T
# 1000 ... --only fc1,dpost --also cluster_m=2; benchmarks/h100-t1000-pairs.txt), the big
# pingpong GEMMs at 1000 rows, 1x1 -> 2x1: gelu h=10240 fc1 + act 0.222 -> 0.180 ms, the dact
# 0.230 -> 0.191 (cuBLAS's plain GEMM 0.16); swiglu d=4096 h=11008 fc1 + act 0.334 -> 0.277
# (cuBLAS 0.295), the dact 0.194 -> 0.176; whole steps at T=1000 d=4096 swiglu 1.373 -> 1.310
# ms, eager 1.49 in both runs (benchmarks/h100-sweep-t1000-pairs.json): single CTAs read every
# operand from L2 for themselves.
PAIR_MIN_ROWS = 1000
# Below one wave of 128x256 tiles but at least this share of it, whole 128x256 tiles (2x1 clusters
# from PAIR_MIN_ROWS rows) instead of two waves of 128x128 in 1x1 clusters: the same columns of
# tile time, at half the L2 reads per output element. Held on an H100, 2026-12-06 (`bash
# tools/gpu_run.sh configs_one_wave`, benchmarks/h100-one-wave.txt; 128 tiles of 128x256 on 132
# SMs, graphed where short), x cuBLAS, 128x128 -> 128x256: fc2 and dx at T=512 d=8192 swiglu
# h=2752 0.900 -> 0.969 and 0.794 -> 0.946 (1x1), at T=2048 d=2048 h=2816 0.776 -> 0.925 and
# 0.741 -> 0.974, at T=1000 d=4096 h=11008 0.718 -> 0.985 and 0.696 -> 0.970, at T=4096 d=1024
# gelu h=4096 0.796 -> 0.956 and 0.780 -> 0.972, that shape's wgrads += 0.858 -> 0.978 and 0.841
# -> 0.996. Whole steps (bench sweep, held 6 turns, the same machine): T=2048 d=2048 swiglu 0.390
# -> 0.364 ms (1.141x -> 1.221x eager), T=512 d=8192 swiglu 0.379 -> 0.373 (1.077x -> 1.090x).
# Fills below 0.97 and the dact were not timed; K from UNDERFILLED_STREAM_K_MIN_K keeps its rule.
# Below PAIR_MIN_ROWS these tiles pair (2x1) too where their rows come in pairs (an odd one would
# pad a cluster): at T=512 d=8192 fc2 and dx read 0.985 and 0.984x cuBLAS in 2x1 against 0.969
# and 0.946 in 1x1, the same run; 128x128 tiles at that T had gained nothing from pairs.
ONE_WAVE_MIN_FILL = 0.9


def cluster_rows(m: int, one_wave: bool = False) -> int:
    """CTAs per cluster along M for an M-row GEMM: a 2x1 pair from PAIR_MIN_ROWS rows, and below
    that for tiles under one wave (ONE_WAVE_MIN_FILL) whose 128-row tiles come in pairs."""
    return 2 if m >= PAIR_MIN_ROWS or (one_wave and -(-m // 128) % 2 == 0) else 1


def cluster_waves(cfg: GemmConfig, m: int, n: int) -> tuple[int, int, int]:
    """(full waves, clusters in the last partial wave, clusters of the whole persistent grid)
    of cfg's tiles over an M x N output. Fewer tile clusters than the grid holds: 0 full waves,
    all of them in the partial one (whole tiles then launch only that many clusters)."""
    clusters = -(-(-(-m // cfg.tile_m)) // cfg.cluster_m) * -(-(-(-n // cfg.tile_n)) // cfg.cluster_n)
    grid = cfg.num_sms // (cfg.cluster_m * cfg.cluster_n)
    return (*divmod(clusters, grid), grid)


def wave_columns(cfg: GemmConfig, m: int, n: int) -> int:
    """The persistent grid's time in columns of tile time: its waves of tile clusters, a partial
    last one counted whole, times the tile's width (default_config compares two configs
    by it)."""
    full, rem, _ = cluster_waves(cfg, m, n)
    return (full + (rem > 0)) * cfg.tile_n


def has_partial_wave(cfg: GemmConfig, m: int, n: int) -> bool:
    """At least one full wave of tile clusters, then a partial one: where the default's rule
    (with_stream_k) and tuned=True weigh stream-K."""
    waves, rem, _ = cluster_waves(cfg, m, n)
    return waves > 0 and rem > 0


def last_wave_waste(cfg: GemmConfig, m: int, n: int) -> float:
    """The share of the persistent grid's time its last, partial wave of tile clusters leaves
    idle: (1 - R/G) / (W + 1) for W full waves and R of G clusters busy in the last; 0 without a
    full wave or without a partial one."""
    waves, rem, grid = cluster_waves(cfg, m, n)
    return (1 - rem / grid) / (waves + 1) if has_partial_wave(cfg, m, n) else 0.0


def with_stream_k(cfg: GemmConfig, m: int, n: int, k: int, kind: str) -> GemmConfig:
    """cfg with stream_k on where its last wave would leave enough of the grid idle
    (STREAM_K_MIN_WASTE) and K is long (STREAM_K_MIN_K). Only cooperative static tiles of up to
    128 rows, and never the dact; store and act decide alike, so that recompute's plain replay
    of fc1 rounds the same sums."""
    if kind == "dact" or cfg.consumers != "cooperative" or cfg.scheduler != "static" or cfg.tile_m > 128:
        return cfg
    if k < STREAM_K_MIN_K:
        return cfg
    # Only after a full wave. With fewer tile clusters than the grid holds, stream-K shares their
    # K blocks over the whole grid; default_config asks for that itself where it pays
    # (UNDERFILLED_STREAM_K_MIN_K).
    if last_wave_waste(cfg, m, n) >= STREAM_K_MIN_WASTE:
        return dataclasses.replace(cfg, stream_k=True)
    return cfg


def with_fewer_waves(cfg: GemmConfig, m: int, n: int, k: int) -> GemmConfig:
    """cfg, a cooperative 128x128 (whole or stream-K) or whole 128x256 config of a GEMM below
    ``is_big``, as whole 128x192 tiles in the same clusters where those take at most
    WIDE_WAVES_MAX_SHARE of its whole tiles' columns of tile time, at K below
    UNDERFILLED_STREAM_K_MIN_K. Independent of the epilogue kind, so that act and store (fc1 and
    recompute's replay of it) still decide alike."""
    if k >= UNDERFILLED_STREAM_K_MIN_K or (cfg.tile_n, cfg.stream_k) == (256, True):
        return cfg
    whole = dataclasses.replace(cfg, stream_k=False)
    wide = dataclasses.replace(whole, tile_n=192)
    if wave_columns(wide, m, n) <= WIDE_WAVES_MAX_SHARE * wave_columns(whole, m, n):
        return wide
    return cfg


# Big GEMMs of these kinds at K below COOPERATIVE_MIN_K run stream-K 128x256 (``with_stream_k``)
# instead of whole pingpong 128x192 tiles where the pingpong tiles' last wave leaves at least
# STREAM_K_MIN_WASTE of the grid's time idle too and cooperative 128x256's whole tiles would take
# no more columns of tile time (``wave_columns``). Held 0.4 s x 6 on an H100, 2026-12-05 (`bash
# tools/gpu_run.sh configs_sk_pingpong`; benchmarks/h100-sk-over-pingpong.txt), ms, stream-K
# against pingpong, swiglu: fc1 + act at T=8192 d=4096 h=1376 (8192 x 2752 x 4096: 1536 columns either
# way) 0.299 against 0.312 and plain 0.286 against 0.305 (cuBLAS 0.282); at T=4096 h=2752
# (4096 x 5504 x 4096, 1536 either way) 0.308 against 0.307 and 0.296 against 0.303. Where 256
# columns take more (1024 against 960: T=4096 h=1792, T=2048 h=3584, T=4096 d=5120 h=1728) stream-K
# ran 0-5% slower, as the rule of thumb of STREAM_K_MIN_WASTE (half the idle share, less 1.5%)
# over cooperative 128x256's ~2% more energy per column than pingpong 128x192's predicts; fc2 and
# dx of Qwen2.5-7B at T=4096 TP4 and TP8 tied (0.222-0.223 against 0.223-0.224).
STREAM_K_OVER_PINGPONG_KINDS = ("store", "act")
# Stream-K 128x256 tiles below two waves (``is_big``) give way to whole 128x128 tiles where 256
# columns pad N by more than this factor of what 128 columns pad it by: there the padded columns'
# work costs more than 128x128's smaller tiles and coarser last wave. Held 0.4 s x 4 on an H100,
# 2026-12-05 (bench configs --only dW2 --also tile_n=256,stream_k=1 ...; benchmarks/
# h100-narrow-n-tiles.txt), dW2 += of T=8192 d=4096 swiglu h=1376 (4096 x 1376 x 8192, 1536 columns
# against 1408; 2.67 waves of 128x128 clusters): 0.185 and 0.191 ms in stream-K 128x256 against
# 0.170 and 0.171 in whole 128x128 (stream-K 128x128 0.180 and 0.182, stream-K 128x160 0.174 and
# 0.175; cuBLAS 0.160); the same at T=16384 0.365 -> 0.346; fc1 + swiglu at T=4096 d=4096 h=688
# (4096 x 1376 x 4096) 0.110 -> 0.088. The whole step at T=8192 h=1376 then read 1.000x and
# 0.988x quack's in two runs (8 and 6 turns; 0.983x in the full sweep before, 1.002x in 6 turns).
STREAM_K_WIDE_MAX_PAD = 1.05


def with_narrow_whole_tiles(cfg: GemmConfig, n: int) -> GemmConfig:
    """cfg, as whole 128x128 tiles where it is stream-K 128x256 and 256 columns would pad N by
    more than STREAM_K_WIDE_MAX_PAD times what 128 columns pad it by. Independent of the epilogue
    kind, as with_fewer_waves is."""
    if not cfg.stream_k or cfg.tile_n != 256:
        return cfg
    if pads_much_more(n, 256, STREAM_K_WIDE_MAX_PAD):
        return dataclasses.replace(cfg, tile_n=128, stream_k=False)
    return cfg


@functools.lru_cache(maxsize=4096)  # on every launch's path; a pure function of its arguments
def default_config(m: int, n: int, k: int, num_sms: int = DEFAULT_NUM_SMS, kind: str = "store") -> GemmConfig:
    """Pick a config for an (M, N, K) problem and an epilogue kind without timing anything.

    Big GEMMs (``is_big``) with K >= COOPERATIVE_MIN_K (fc2, dx and the wgrads of an MLP at
    T=8192), except the dact: cooperative 128x256, 2x1 cluster, walking groups of 8 cluster rows
    (``with_raster``, as every big whole-tile GEMM does), unless it runs
    whole tiles, K is below LONG_K_COOPERATIVE_MIN_K and pingpong 128x192 takes no more columns
    of tile time (``wave_columns``: e.g. every GEMM of T=8192 d=8192 gelu h=8192, and fc1 at
    T=16384 d=8192 swiglu h=11008, whose fc2 and dx, at K = 11008 and 22016, run cooperative).

    Other big GEMMs (fc1, dy@W2 and its dact at d=4096): ``big_pingpong_config``, or, where
    that is 128x128 tiles at K >= NARROW_COOPERATIVE_MIN_K, cooperative 128x256 for store, act and
    dact where its waves take no more columns of tile time (fc1 and the dact of the narrow shards
    at T=8192-16384: gelu h=2048 and 2560, swiglu h=1376). On an H200,
    2026-11-30, pingpong 128x128 timed call by call against cooperative 128x256 (bench configs
    --also consumers=pingpong,tile_n=128,raster_group=16): fc1 + swiglu 7% faster, plain and
    accumulate GEMMs 2-5%, dx even. The pingpong dact writes dpreact in place over its preact,
    which leaves a 128x128 tile 5 A/B stages (with 3, plain fc1 ran 3.950 ms against 2.704 at 5).
    Held, pingpong 128x192 beats cooperative 128x256 at K = 4096 on energy: dy@W2 1.453 against
    1.503 ms (tools/clock_probe.py, 2 s turns). See kernels/NOTES.md, "Consumer schedules".
    Store and act take stream-K 128x256 instead where pingpong's last wave idles part of the grid
    and cooperative's whole tiles would take no more columns (STREAM_K_OVER_PINGPONG_KINDS: fc1
    at T=8192 d=4096 swiglu h=1376, 0.312 -> 0.299 ms on an H100).

    The accumulate (fp32 main-grad) epilogue gets the L2 prefetch of its D tile: 0.5-1.4%
    faster on the MLP's wgrad shapes (call by call, bench configs --also l2_prefetch=1). The dact
    does not: its preact prefetch measured 0.7-1.4% slower; it gets a two-slot preact ring per
    warpgroup instead.

    When 128x256 tiles would leave most SMs idle (small M*N, e.g. a wgrad with a small N or a
    short sequence), smaller cooperative tiles give more CTAs. With fewer 128x128 tiles than
    SMs and a very long K (the wgrads at T=65536, d=1024: 64 tiles), stream-K over the whole
    grid in 128x256 tiles (UNDERFILLED_STREAM_K_MIN_K); at a shorter K, whole 128x64 tiles,
    twice the CTAs of 128x128: held on an H200, 2026-12-01, each a CUDA graph of 20 calls (bench
    configs --T 512 --d 1024 --h 2816 --act swiglu --graphed 20 --hold-s 0.4 --also tile_n=64),
    fc2 (512 x 1024 x 2816) ran 0.010 ms against 128x128's 0.016 and dx (K = 5632) 0.017
    against 0.028 (cuBLAS 0.007 and 0.013). The dact keeps 128x128 there: 128x64 ran 0.012 ms
    against 0.011.

    Just under one wave of 128x256 tiles (ONE_WAVE_MIN_FILL of the grid or more; not the dact),
    whole 128x256 tiles rather than two waves of 128x128, in 2x1 clusters at any row count where
    the tile rows pair up: fc2 and dx at T=2048 d=2048 swiglu h=2816, 0.74-0.78x cuBLAS ->
    0.93-0.97x on an H100.

    Below two waves of 128x256 tiles, 128x128 tiles (whole or stream-K) and whole 128x256 tiles
    become whole 128x192 tiles where those run enough fewer waves (``with_fewer_waves``,
    WIDE_WAVES_MAX_SHARE: e.g. fc1 at T=512, d=1024, swiglu h=2816: one wave of 120 tiles
    instead of two of 176, 0.015 -> 0.012 ms), and stream-K 128x256 tiles become whole 128x128
    ones where 256 columns pad N much more than 128 do (``with_narrow_whole_tiles``,
    STREAM_K_WIDE_MAX_PAD: dW2 at T=8192 d=4096 swiglu h=1376, 0.185 -> 0.170 ms on an H100).
    """
    def waves(tm, tn):
        tiles = -(-m // tm) * -(-n // tn)
        return tiles / num_sms

    pf = kind == "accumulate"
    cm = cluster_rows(m)
    if is_big(m, n, num_sms):
        # act takes the same choice as store: recompute replays fc1's act GEMM as a plain one
        # and relies on the same config giving the same bits.
        if kind == "dact" and k <= SHORT_K_DACT_MAX_K:
            return GemmConfig(128, 128, 1, 1, 8, num_sms, dact_prefetch=SHORT_K_DACT_PREFETCH)
        pingpong = big_pingpong_config(m, n, num_sms, kind)
        cooperative = with_stream_k(GemmConfig(128, 256, cm, 1, 16, num_sms, l2_prefetch=pf),
                                    m, n, k, kind)
        narrow_cooperative = (k >= NARROW_COOPERATIVE_MIN_K and kind != "accumulate"
                              and pingpong.tile_n == 128
                              and wave_columns(cooperative, m, n) <= wave_columns(pingpong, m, n))
        if kind == "dact":
            return with_raster(cooperative) if narrow_cooperative else pingpong
        if k >= COOPERATIVE_MIN_K:
            if (cooperative.stream_k or pingpong.tile_n != 192 or k >= LONG_K_COOPERATIVE_MIN_K
                    or wave_columns(cooperative, m, n) < wave_columns(pingpong, m, n)):
                return with_raster(cooperative)
        elif narrow_cooperative:
            return with_raster(cooperative)
        elif (kind in STREAM_K_OVER_PINGPONG_KINDS and cooperative.stream_k
                and last_wave_waste(pingpong, m, n) >= STREAM_K_MIN_WASTE
                and wave_columns(cooperative, m, n) <= wave_columns(pingpong, m, n)):
            return cooperative
        return pingpong
    wide_waves = waves(128, 256)
    just_under_one_wave = (kind != "dact" and k < UNDERFILLED_STREAM_K_MIN_K
                           and wide_waves >= ONE_WAVE_MIN_FILL)
    if n > 128 and (wide_waves >= 1 or just_under_one_wave):
        cm = cluster_rows(m, one_wave=wide_waves < 1)
        return with_narrow_whole_tiles(with_fewer_waves(
            with_stream_k(GemmConfig(128, 256, cm, 1, 8, num_sms, l2_prefetch=pf), m, n, k, kind), m, n, k), n)
    if waves(128, 128) >= 1:
        return with_fewer_waves(
            with_stream_k(GemmConfig(128, 128, 1, 1, 8, num_sms, l2_prefetch=pf), m, n, k, kind), m, n, k)
    if kind == "dact":
        return GemmConfig(128, 64 if n <= 64 else 128, 1, 1, 8, num_sms, l2_prefetch=pf)
    if k >= UNDERFILLED_STREAM_K_MIN_K:
        return GemmConfig(128, 256, cm, 1, 8, num_sms, l2_prefetch=pf, stream_k=True)
    return GemmConfig(128, 64, 1, 1, 8, num_sms, l2_prefetch=pf)


# Candidates that `tuned=True` times for a shape (all must compile for every layout).
TUNE_CANDIDATES = (
    GemmConfig(128, 256, 1, 1, 8),
    GemmConfig(128, 256, 2, 1, 8),
    GemmConfig(128, 256, 1, 2, 8),
    GemmConfig(128, 256, 2, 1, 16),
    GemmConfig(128, 128, 2, 1, 8),
    GemmConfig(128, 192, 1, 1, 8),
)


# Pingpong configs that `python -m parallel_mlp.bench configs --sweep --consumers pingpong`
# times (the tile is one warpgroup's). Not in TUNE_CANDIDATES: on big shapes tuned=True times
# the pingpong default (big_pingpong_config) and its 128x128 tile instead.
PINGPONG_CANDIDATES = (
    GemmConfig(128, 128, 1, 1, 8, consumers="pingpong"),
    GemmConfig(128, 128, 2, 1, 8, consumers="pingpong"),
    GemmConfig(64, 256, 1, 1, 8, consumers="pingpong"),
    GemmConfig(64, 256, 2, 1, 8, consumers="pingpong"),
)
