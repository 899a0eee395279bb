"""Persistent, warp-specialized Hopper (sm_90a) GEMM with fused epilogues.

    D[M, N] (+)= A[M, K] @ B[N, K]^T, then an epilogue variant (see epilogue.py)

One CTA per SM (cluster of 1 or 2 CTAs). Warpgroup 0 is the producer: after giving most of its
registers away (setmaxnreg) its first warp runs the TMA loads of mainloop.produce_tile. The
other warpgroups are consumers: they take the registers (setmaxnreg up to 232), run the WGMMA
mainloop on their share of the tile (see "Consumer schedules" below) and then the epilogue,
subtile by subtile, through shared memory and TMA stores. Both sides walk the same persistent
tile sequence (tile_scheduler), so while the consumers run a tile's epilogue the producer is
already prefetching the next tile's A and B into the ring. With the static scheduler (default)
each side computes the sequence itself; with the dynamic one (config.scheduler == "dynamic") the
producer claims tiles from a global atomic counter and passes each index to the consumers
through a shared-memory ring of tile indices. With config.stream_k the last partial wave's K
blocks are shared by all clusters instead, and each tile's owner sums the pieces
(tile_scheduler, "Stream-K").

Operand majorness is a compile-time property: A may be K-major (row-major [M, K]) or M-major,
B may be K-major or N-major; D is row-major. M, N, K and the leading strides are dynamic, so a
compiled kernel serves every problem size of its layout; tails are handled by TMA's bounds
(zero-filled loads, clipped stores); only the bias, read straight from global memory, needs a
predicate.

Consumer schedules (config.consumers):
- "cooperative" (default): the consumer warpgroups split one tile and all run its epilogue, so
  the tensor cores idle during every epilogue: two of 64 rows (128-row tile) or 128 rows (two
  m64 atoms each, 256-row tile), three of 64 rows (192-row tile, at 160 registers a thread),
  one for a 64-row tile.
- "pingpong": the tile is one warpgroup's. Consumer warpgroup w takes tiles w, w + 2, ... of the
  CTA's sequence; named barriers make the two mainloops alternate (mainloop order) and the two
  epilogues alternate (epilogue order: they share the epilogue smem and its TMA stores), so one
  warpgroup's epilogue runs while the other's WGMMAs keep the tensor cores busy. Each warpgroup
  has its own store warp, its own 128-thread epilogue barrier and its own preact (dact) TMA-load
  ring. See _consume_pingpong.
- "handoff": two warpgroups run a 128-row tile's mainloop as cooperative ones do and leave its
  fp32 accumulators in shared memory (sAcc); two more warpgroups run the cooperative epilogue
  from there while the first two run the next tile's mainloop. Two mbarriers pass sAcc back and
  forth ("full" once written, "empty" once read). See _handoff_mainloop, _handoff_epilogue.

The epilogue's path out of the SM (subtiles through shared memory, TMA stores, the preact ring)
is epilogue_pipeline.py's, which this class inherits.
"""

from __future__ import annotations

import math
from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import make_fake_tensor

from . import mainloop, tile_scheduler
from .config import TILE_K, GemmConfig
from .epilogue import Epilogue
from .epilogue_pipeline import OUT_STAGES, STORE_WINDOW, EpiloguePipelineSm90, subtile_order
from .epilogue_spec import EpilogueSpec

try:  # moved in 4.8; the old spelling still works with a deprecation warning
    from cutlass.tensor_utils import LayoutEnum
except ImportError:  # pragma: no cover
    LayoutEnum = utils.LayoutEnum

SMEM_CAPACITY = 232448  # max dynamic smem per CTA on sm_90 (227 KB)
# Registers per thread after setmaxnreg, by the number of consumer warpgroups. setmaxnreg moves
# registers within what the CTA was launched with: the threads times the per-thread count
# ptxas gives a kernel of that many (65,536 / threads, down to a multiple of 8). 384 threads
# (168 each): 128 x 40 + 256 x 232 = 64,512; 512 threads (128 each; the cooperative 192-row
# tile): 128 x 32 + 384 x 160 = 65,536, the split FlashAttention-3 uses for its three consumer
# warpgroups; 640 threads (96 each; the handoff schedule's two mainloop and two epilogue
# warpgroups): 128 x 32 + 512 x 112 = 61,440. An increase past the pool waits forever.
PRODUCER_REGS = {1: 40, 2: 40, 3: 32, 4: 32}
CONSUMER_REGS = {1: 232, 2: 232, 3: 160, 4: 112}
PREACT_RING = 2  # preact slots of the dact that writes dpreact to buffers of its own

# Named barrier IDs (0 is __syncthreads). Cooperative: 1 = the 256 consumer threads' epilogue
# barrier. Pingpong: 1 + w = warpgroup w's own epilogue barrier (128 threads); the mainloop and
# epilogue order barriers (256 threads: one warpgroup waits, the other arrives) at base + w.
PP_EPI_BARRIER = 1
PP_MMA_ORDER = 3
PP_EPI_ORDER = 5


class PersistentGemmSm90(EpiloguePipelineSm90):
    def __init__(self, config: GemmConfig, epilogue: EpilogueSpec):
        self.cfg = config
        self.epi = epilogue
        self.epilogue = Epilogue(epilogue)  # its device side
        self.tile_shape_mnk = (config.tile_m, config.tile_n, TILE_K)
        self.cluster_shape_mn = (config.cluster_m, config.cluster_n)
        self.pingpong = config.consumers == "pingpong"
        # Cooperative: two consumer warpgroups split a 128-row tile (64 rows each); a 64-row tile
        # needs one; a 192-row tile takes three of 64 rows, at fewer registers a thread
        # (CONSUMER_REGS); in a 256-row tile each of two runs two m64 atoms along M (128 rows).
        # Pingpong: the tiled MMA is one warpgroup's (a 128-row tile is two m64 atoms along M,
        # run by the same warpgroup), and there are always two consumer warpgroups.
        if self.pingpong or config.tile_m == 64:
            self.atom_layout_mnk = (1, 1, 1)
        else:
            self.atom_layout_mnk = (3 if config.tile_m == 192 else 2, 1, 1)
        self.num_mma_wg = 2 if self.pingpong else math.prod(self.atom_layout_mnk)
        # Handoff: two more warpgroups run the epilogue, on the accumulators the mainloop's two
        # leave in shared memory (sAcc).
        self.handoff = config.consumers == "handoff"
        self.num_epi_threads = self.num_mma_threads = 128 * self.num_mma_wg
        self.num_consumer_wg = self.num_mma_wg * (2 if self.handoff else 1)
        self.num_threads = 128 * (1 + self.num_consumer_wg)
        self.epi_tile = (config.tile_m, config.epi_n)
        self.max_active_clusters = config.num_sms // (config.cluster_m * config.cluster_n)
        self.dynamic = config.scheduler == "dynamic"
        self.dact_pair_swap = config.dact_pair_swap
        self.stream_k = config.stream_k
        if self.stream_k and epilogue.kind == "dact":
            # Only the owner of a tile runs its epilogue; the dact's preact ring is loaded ahead
            # of every tile's mainloop, which a contributor piece would leave unconsumed.
            raise ValueError(f"{config.key} {epilogue.key}: stream-K serves the store, accumulate and act epilogues")
        # dact with dact_prefetch 2 or 3: dpreact is written in place over its preact subtile
        # and stored from there, which frees the dpreact buffers for a preact ring of
        # dact_prefetch + 1 slots (else a two-slot ring, one load ahead).
        # Pingpong dact: in place too, over ONE preact slot per warpgroup, loaded when the
        # subtile before it has been stored. A 128x128 pingpong tile needs 5 or more A/B stages
        # (on an H200, 2026-11-30, plain fc1 at 3 / 4 / 5 / 6 stages: 3.950 / 2.882 / 2.704 /
        # 2.696 ms; bench configs --also max_stages=N), and the two-slot ring plus dpreact buffers
        # left the gated dact 3. The load latency this exposes per subtile falls inside the
        # other warpgroup's mainloop.
        self.dpre_in_place = epilogue.kind == "dact" and (config.dact_prefetch > 1 or self.pingpong)
        # Pingpong with dact_prefetch=2: two slots per warpgroup, both filled at the tile's start
        # and each refilled as soon as its subtile's stores have read it, so a subtile's preact
        # loads while the one before is computed (fits beside 5 stages with epi_n=16).
        if self.dpre_in_place:
            self.l_ring = config.dact_prefetch if self.pingpong else config.dact_prefetch + 1  # slots per warpgroup
        else:
            self.l_ring = PREACT_RING
        self.l_ahead = self.l_ring - 1  # preact subtiles loaded ahead of the one computed
        # The channel dpreact leaves by when in place: gated X, else D (None: not in place).
        self.dpre = ("X" if epilogue.gated else "D") if self.dpre_in_place else None
        # The channel whose global tensor the epilogue reads and the producer prefetches into L2
        # (config.l2_prefetch): dact's preact (L), accumulate's fp32 D; None: no prefetch.
        self.prefetch_channel = None
        if config.l2_prefetch:
            self.prefetch_channel = {"dact": "L", "accumulate": "D"}.get(epilogue.kind)

    # ---- host-side setup (runs while tracing __call__) -----------------------------------------
    #
    # Epilogue "channels": every output leaves the SM as a (tile_m x w) subtile staged in shared
    # memory and written by one TMA store; preact (dact) arrives the same way by TMA load.
    #   D  acc-shaped (w = epi_n):     D / preact / non-gated dpreact     stmatrix
    #   P  acc-shaped (w = epi_n):     postact (non-gated act, any dact)  stmatrix
    #   H  half width (w = epi_n / 2): gated act's postact                per-element smem stores
    #   X  double width (w = 2 epi_n): gated dact's interleaved dpreact   8-byte vector smem stores
    #   L  preact input, acc-shaped or double width (gated dact), TMA load, a ring of l_ring
    #      slots (per warpgroup in pingpong); dpreact leaves from it when written in place

    def _channel_widths(self):
        e = self.epi
        w = self.epi_tile[1]
        in_place = self.dpre_in_place  # dpreact leaves from the preact ring (L) instead
        return {
            "D": w if e.has_tma_d and not in_place else 0,
            "P": w if e.has_tma_post else 0,
            "H": w // 2 if e.has_half_post else 0,
            "X": 2 * w if e.has_dpre_x2 and not in_place else 0,
            "L": (2 * w if e.gated else w) if e.loads_preact else 0,
        }

    def _smem_layouts(self, a_dtype, a_layout, b_dtype, b_layout, d_dtype, post_dtype):
        tm, tn, tk = self.tile_shape_mnk
        widths = self._channel_widths()
        dtypes = {"D": d_dtype, "P": post_dtype, "H": post_dtype, "X": d_dtype, "L": d_dtype}
        # SharedStorage: mbarriers (padded to the 1 KB alignment of what follows), the A/B ring,
        # then one 1 KB-aligned buffer per channel; an absent channel still takes its 1 KB slot.
        # Pingpong: the output channels are shared by the two warpgroups (their epilogues take
        # turns), but each has its own preact ring (L), loaded before its mainloop.
        self.l_stages = self.l_ring * (2 if self.pingpong else 1)
        stages = {c: (self.l_stages if c == "L" else OUT_STAGES) for c in widths}
        epi_bytes = sum(
            tm * w * dtypes[c].width // 8 * stages[c] if w else 1024 for c, w in widths.items()
        )
        stage_bytes = (tm * tk) * a_dtype.width // 8 + (tn * tk) * b_dtype.width // 8
        ab_stages = min((SMEM_CAPACITY - epi_bytes - 1024) // stage_bytes, self.cfg.max_stages)
        # Handoff: an absent channel's placeholder is 16-byte aligned instead of taking a 1 KB
        # slot, and the stage count is what the laid-out storage fits (_handoff_stages): with
        # the 64 KB of accumulators beside them, the gated dact's 16-column buffers leave room
        # for 4 stages that way and 3 the other.
        self.ch_align = {c: 1024 if w or not self.handoff else 16 for c, w in widths.items()}
        if self.handoff:
            ab_stages = self._handoff_stages(widths, stages, dtypes, stage_bytes)
        if ab_stages < 2:
            raise ValueError(f"tile {tm}x{tn}: not enough shared memory for two stages")
        self.ab_stages = ab_stages
        self.sA_layout = sm90_utils.make_smem_layout_a(a_layout, self.tile_shape_mnk, a_dtype, ab_stages)
        self.sB_layout = sm90_utils.make_smem_layout_b(b_layout, self.tile_shape_mnk, b_dtype, ab_stages)
        row = LayoutEnum.ROW_MAJOR
        # Absent channels get a minimal placeholder layout (never allocated beyond one element).
        self.ch_layout = {
            c: sm90_utils.make_smem_layout_epi(dtypes[c], row, (tm, w if w else self.epi_tile[1]), stages[c])
            for c, w in widths.items()
        }
        self.ch_width = widths
        self.ch_dtype = dtypes

    def _handoff_stages(self, widths, stages, dtypes, stage_bytes):
        """The most A/B stages (up to max_stages) whose SharedStorage, laid out field by field
        as __call__ declares it, fits SMEM_CAPACITY, for the handoff schedule."""
        tm, tn, _ = self.tile_shape_mnk

        def up(x, a):
            return (x + a - 1) // a * a

        for n in range(self.cfg.max_stages, 1, -1):
            # ab_mbar, l_mbar, sched_mbar and acc_mbar (8-byte mbarriers), sched_idx (the static
            # scheduler's one slot), then sAcc, the A/B ring and the channels in their order.
            off = 8 * (2 * n + self.l_stages + 2 + 2) + 4
            off = up(off, 16) + tm * tn * 4
            off = up(off, 1024) + n * stage_bytes
            for c, w in widths.items():
                size = tm * w * dtypes[c].width // 8 * stages[c] if w else dtypes[c].width // 8
                off = up(off, self.ch_align[c]) + size
            if up(off, 1024) <= SMEM_CAPACITY:
                return n
        return 1

    @staticmethod
    def _epi_buffers(storage, layouts):
        """The epilogue's smem buffers (sD, sP, sH, sX, sL; an absent channel's is a placeholder)
        in `storage`, laid out as `layouts` (in that order); made where each role needs them."""
        return tuple(
            getattr(storage, name).get_tensor(layout.outer, swizzle=layout.inner)
            for name, layout in zip(("sD", "sP", "sH", "sX", "sL"), layouts)
        )

    @staticmethod
    def _with_batch(t: cute.Tensor) -> cute.Tensor:
        """(X, Y) -> (X, Y, 1): the scheduler and tilers speak (m, n, l)."""
        return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1, stride=0)))

    def _tma(self, op, t, c):
        if cutlass.const_expr(t is None or self.ch_width[c] == 0):
            return None, None
        layout = self.ch_layout[c]
        return cpasync.make_tiled_tma_atom(
            op, self._with_batch(t), cute.slice_(layout, (None, None, 0)), (self.tile_shape_mnk[0], self.ch_width[c])
        )

    def _tma_view(self, atom, mT, s, c):
        """(TMA, subtiles_m, subtiles_n, 1) view of channel c's global tensor and its smem ring;
        subtile (i, j) of every channel covers the same accumulator columns, whatever its width."""
        if self.ch_width[c] == 0:
            return None, None
        g = cute.local_tile(mT, (self.tile_shape_mnk[0], self.ch_width[c]), (None, None, None))
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2))

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # (M, K)
        mB: cute.Tensor,  # (N, K)
        mD: Optional[cute.Tensor],  # (M, N): D / preact / non-gated dpreact
        mPost: Optional[cute.Tensor],  # postact: (M, N), or (M, N/2) for the gated act
        mPreIn: Optional[cute.Tensor],  # dact: preact, (M, N) or (M, 2N) gated
        mDpre: Optional[cute.Tensor],  # gated dact: dpreact (M, 2N)
        mBias: Optional[cute.Tensor],  # act: (N,)
        mCounter: Optional[cute.Tensor],  # dynamic scheduler: (1,) int32 tile counter, 0 at launch
        stream: cuda.CUstream,
    ):
        a_dtype = mA.element_type
        b_dtype = mB.element_type
        a_layout = LayoutEnum.from_tensor(mA)
        b_layout = LayoutEnum.from_tensor(mB)
        if cutlass.const_expr(mD is not None):
            d_dtype = mD.element_type
        elif cutlass.const_expr(mDpre is not None):
            d_dtype = mDpre.element_type
        else:
            d_dtype = mPost.element_type
        post_dtype = mPost.element_type if cutlass.const_expr(mPost is not None) else d_dtype
        self.a_dtype, self.b_dtype = a_dtype, b_dtype
        self.d_dtype, self.post_dtype = d_dtype, post_dtype
        self.acc_dtype = cutlass.Float32

        def make_tiled_mma():
            return sm90_utils.make_trivial_tiled_mma(
                a_dtype, b_dtype, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
                self.acc_dtype, self.atom_layout_mnk, tiler_mn=(64, self.tile_shape_mnk[1]),
            )

        self.tiled_mma = make_tiled_mma()
        # The same MMA with ACCUMULATE off (scale-d = 0): a tile's first K block overwrites the
        # accumulators instead of adding to zeros. Zeroing them first (acc.fill) is a register
        # write LLVM may sink past the wgmma fence, and ptxas then serializes the tile's first
        # WGMMAs (C7519/C7517 in the 128x128 pingpong kernels).
        self.tiled_mma_first = make_tiled_mma()
        self._smem_layouts(a_dtype, a_layout, b_dtype, b_layout, d_dtype, post_dtype)

        cm, cn = self.cluster_shape_mn
        # A is shared by the CTAs of a cluster row (multicast along N), B along M.
        tma_a, tA = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp() if cn == 1 else cpasync.CopyBulkTensorTileG2SMulticastOp(),
            self._with_batch(mA), cute.slice_(self.sA_layout, (None, None, 0)),
            (self.tile_shape_mnk[0], self.tile_shape_mnk[2]), num_multicast=cn,
        )
        tma_b, tB = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp() if cm == 1 else cpasync.CopyBulkTensorTileG2SMulticastOp(),
            self._with_batch(mB), cute.slice_(self.sB_layout, (None, None, 0)),
            (self.tile_shape_mnk[1], self.tile_shape_mnk[2]), num_multicast=cm,
        )
        store = cpasync.CopyBulkTensorTileS2GOp()
        d_op = cpasync.CopyReduceBulkTensorTileS2GOp(cute.ReductionKind.ADD) if cutlass.const_expr(self.epi.kind == "accumulate") else store
        tma_d, tD = self._tma(d_op, mD, "D")
        tma_p, tP = self._tma(store, mPost, "P")
        tma_h, tH = self._tma(store, mPost, "H")
        tma_x, tX = self._tma(store, mDpre, "X")
        tma_l, tL = self._tma(cpasync.CopyBulkTensorTileG2SOp(), mPreIn, "L")
        # The L2 prefetch reads through a load atom of the channel's subtile box.
        tma_f = tF = None
        if cutlass.const_expr(self.prefetch_channel == "L"):
            tma_f, tF = tma_l, tL
        elif cutlass.const_expr(self.prefetch_channel == "D"):
            tma_f, tF = self._tma(cpasync.CopyBulkTensorTileG2SOp(), mD, "D")
        if cutlass.const_expr(self.dpre_in_place):
            # dpreact leaves from the preact slot it overwrote: a store atom with L's smem layout.
            if cutlass.const_expr(self.epi.gated):
                tma_x, tX = self._tma(store, mDpre, "L")
            else:
                tma_d, tD = self._tma(store, mD, "L")

        # Persistent grid over (tiles_m, tiles_n) output tiles.
        m_size = cute.size(mA, mode=[0])
        n_size = cute.size(mB, mode=[0])
        tiles_mnl = (
            (m_size + self.tile_shape_mnk[0] - 1) // self.tile_shape_mnk[0],
            (n_size + self.tile_shape_mnk[1] - 1) // self.tile_shape_mnk[1],
            1,
        )
        sched_params = tile_scheduler.make_params(
            tiles_mnl, self.cluster_shape_mn, self.cfg.raster_group, self.cfg.raster_along, self.cfg.serpentine
        )
        k_blocks = None
        if cutlass.const_expr(self.stream_k):
            k_blocks = (cute.size(mA, mode=[1]) + self.tile_shape_mnk[2] - 1) // self.tile_shape_mnk[2]
        grid = tile_scheduler.grid_shape(sched_params, self.max_active_clusters, k_blocks)

        def cosize(c):
            return cute.cosize(self.ch_layout[c]) if self.ch_width[c] else 1

        tm_tn = self.tile_shape_mnk[0] * self.tile_shape_mnk[1]

        if cutlass.const_expr((self.dynamic or self.stream_k) and mCounter is None):
            raise ValueError(f"{self.cfg.key}: the dynamic scheduler and stream-K need their workspace (mCounter)")
        # The dynamic scheduler's ring of tile indices (a 1-slot placeholder for the static one);
        # it sits with the mbarriers, inside the 1 KB in front of the A/B ring.
        sched_slots = tile_scheduler.SCHED_STAGES if self.dynamic else 1

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            l_mbar: cute.struct.MemRange[cutlass.Int64, self.l_stages]
            sched_mbar: cute.struct.MemRange[cutlass.Int64, 2 * sched_slots]
            acc_mbar: cute.struct.MemRange[cutlass.Int64, 2]  # handoff: sAcc's "full" and "empty"
            sched_idx: cute.struct.MemRange[cutlass.Int32, sched_slots]
            # handoff: the tile's fp32 accumulators, each mainloop thread's in 16-byte pieces
            # interleaved thread by thread (_acc_slab); otherwise one element inside the 1 KB
            # in front of the A/B ring, which leaves every other kernel's layout as it was
            sAcc: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, tm_tn if self.handoff else 1], 16]
            sA: cute.struct.Align[cute.struct.MemRange[a_dtype, cute.cosize(self.sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[b_dtype, cute.cosize(self.sB_layout)], 1024]
            sD: cute.struct.Align[cute.struct.MemRange[d_dtype, cosize("D")], self.ch_align["D"]]
            sP: cute.struct.Align[cute.struct.MemRange[post_dtype, cosize("P")], self.ch_align["P"]]
            sH: cute.struct.Align[cute.struct.MemRange[post_dtype, cosize("H")], self.ch_align["H"]]
            sX: cute.struct.Align[cute.struct.MemRange[d_dtype, cosize("X")], self.ch_align["X"]]
            sL: cute.struct.Align[cute.struct.MemRange[d_dtype, cosize("L")], self.ch_align["L"]]

        self.shared_storage = SharedStorage
        # A launch with more shared memory than the SM has fails only on the GPU; fail at compile
        # time instead, where the selfcheck sees it.
        if cutlass.const_expr(SharedStorage.size_in_bytes() > SMEM_CAPACITY):
            raise ValueError(
                f"{self.cfg.key} {self.epi.key}: shared storage {SharedStorage.size_in_bytes()} B "
                f"exceeds {SMEM_CAPACITY} B"
            )

        self.kernel(
            tma_a, tA, tma_b, tB, tma_d, tD, tma_p, tP, tma_h, tH, tma_x, tX, tma_l, tL, tma_f, tF,
            mBias, mCounter, m_size, n_size, self.tiled_mma, self.tiled_mma_first, self.sA_layout, self.sB_layout,
            self.ch_layout["D"], self.ch_layout["P"], self.ch_layout["H"], self.ch_layout["X"], self.ch_layout["L"],
            sched_params,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            cluster=(cm, cn, 1),
            min_blocks_per_mp=1,
            stream=stream,
            use_pdl=self.cfg.pdl,
        )

    # ---- the kernel --------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_d: Optional[cute.CopyAtom], mD: Optional[cute.Tensor],
        tma_p: Optional[cute.CopyAtom], mP: Optional[cute.Tensor],
        tma_h: Optional[cute.CopyAtom], mH: Optional[cute.Tensor],
        tma_x: Optional[cute.CopyAtom], mX: Optional[cute.Tensor],
        tma_l: Optional[cute.CopyAtom], mL: Optional[cute.Tensor],
        tma_f: Optional[cute.CopyAtom], mF: Optional[cute.Tensor],
        mBias: Optional[cute.Tensor],
        mCounter: Optional[cute.Tensor],
        m_size: cutlass.Int32, n_size: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        tiled_mma_first: cute.TiledMma,
        sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
        sD_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, sH_layout: cute.ComposedLayout,
        sX_layout: cute.ComposedLayout, sL_layout: cute.ComposedLayout,
        sched_params: tile_scheduler.RasterParams,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        tm, tn, tk = self.tile_shape_mnk
        has = {c: self.ch_width[c] > 0 for c in self.ch_width}

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)

        # ---- cluster geometry and multicast masks
        cta_layout_mnk = cute.make_layout((*self.cluster_shape_mn, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout_mnk.get_flat_coord(cta_rank)
        cm, cn = self.cluster_shape_mn
        a_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1) if cutlass.const_expr(cn > 1) else 0
        b_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0) if cutlass.const_expr(cm > 1) else 0

        # ---- shared memory and the A/B pipeline
        smem = cutlass.memory.SmemAllocator()  # cutlass.utils' is a deprecated alias since 4.8
        storage = smem.allocate(self.shared_storage)
        tx_bytes = cute.size_in_bytes(self.a_dtype, cute.slice_(sA_layout, (None, None, 0))) + cute.size_in_bytes(
            self.b_dtype, cute.slice_(sB_layout, (None, None, 0))
        )
        # Every consumer warp of every CTA that reads a multicast slice must release it; in
        # pingpong each stage belongs to one warpgroup's tile, so only its 4 warps release it.
        consumer_arrivals = (cm + cn - 1) * (1 if self.pingpong else self.num_mma_wg) * 4
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_arrivals),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )
        l_mbar = storage.l_mbar.data_ptr()
        if cutlass.const_expr(has["L"]):
            # The preact ring's "full" barriers: one arrival (the thread that arms the bytes).
            if tidx == 0:
                for i in cutlass.range_constexpr(self.l_stages):
                    cute.arch.mbarrier_init(l_mbar + i, 1)
            cute.arch.mbarrier_init_fence()
        acc_mbar = storage.acc_mbar.data_ptr()
        if cutlass.const_expr(self.handoff):
            # acc_mbar + 0, "full": every mainloop thread has written the tile's accumulators;
            # acc_mbar + 1, "empty": every epilogue thread has read them.
            if tidx == 0:
                cute.arch.mbarrier_init(acc_mbar, self.num_mma_threads)
                cute.arch.mbarrier_init(acc_mbar + 1, self.num_epi_threads)
            cute.arch.mbarrier_init_fence()
        index_pipe = s_idx = None
        if cutlass.const_expr(self.dynamic):
            index_pipe = tile_scheduler.make_index_pipeline(storage.sched_mbar.data_ptr(), self.num_mma_threads)
            s_idx = storage.sched_idx.get_tensor(cute.make_layout(tile_scheduler.SCHED_STAGES))
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        epi_layouts = (sD_layout, sP_layout, sH_layout, sX_layout, sL_layout)

        # (bM, bK, tiles_m, tiles_k, 1) views of A and B for the TMA partition.
        gA = cute.local_tile(mA, (tm, tk), (None, None, None))
        gB = cute.local_tile(mB, (tn, tk), (None, None, None))
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, cluster_coord[1], cute.make_layout(cn),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, cluster_coord[0], cute.make_layout(cm),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2),
        )
        k_tiles = cute.size(gA, mode=[3])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)
        if cutlass.const_expr(self.cfg.pdl):
            # Everything above is this CTA's own (shared memory, barriers, its cluster, the TMA
            # descriptors in parameter space); every global read or write below must come after
            # the kernel before it on the stream (config.pdl).
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

        if wg_idx == 0:
            # ---------------- producer warpgroup ----------------
            cute.arch.setmaxregister_decrease(PRODUCER_REGS[self.num_consumer_wg])
            if warp_idx == 0:
                if cutlass.const_expr(self.dynamic):
                    sched = tile_scheduler.DynamicProducer.create(sched_params, index_pipe, s_idx, mCounter.iterator)
                else:
                    sched = tile_scheduler.create(sched_params)
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
                num_sub = tn // self.epi_tile[1]
                gF = None
                if cutlass.const_expr(self.prefetch_channel is not None):
                    c = self.prefetch_channel
                    sF = (
                        storage.sL.get_tensor(sL_layout.outer, swizzle=sL_layout.inner) if c == "L"
                        else storage.sD.get_tensor(sD_layout.outer, swizzle=sD_layout.inner)
                    )
                    _, gF = self._tma_view(tma_f, mF, sF, c)
                if cutlass.const_expr(self.stream_k):
                    state = self._produce_stream_k(
                        ab_pipeline, state, tma_a, tAgA, tAsA, a_mask, tma_b, tBgB, tBsB, b_mask, k_tiles, sched_params,
                        tma_f, gF, num_sub,
                    )
                else:
                    work = sched.initial_work_tile_info()
                    while work.is_valid_tile:
                        state = self._produce_tile_at(
                            ab_pipeline, state, work.tile_idx, tma_a, tAgA, tAsA, a_mask, tma_b, tBgB, tBsB, b_mask,
                            k_tiles, tma_f, gF, num_sub,
                        )
                        sched.advance_to_next_work()
                        work = sched.get_current_work()
                # Wait for the consumers to release the last stages, so no CTA of the cluster
                # exits while a multicast into its smem is in flight.
                ab_pipeline.producer_tail(state)
        else:
            # ---------------- consumer warpgroups ----------------
            cute.arch.setmaxregister_increase(CONSUMER_REGS[self.num_consumer_wg])
            if cutlass.const_expr(self.handoff):
                sAcc = storage.sAcc.get_tensor(cute.make_layout(tm * tn))
                # Set here, where both roles' code is dominated by it: a TiledMma mutated inside
                # one branch would hand the other branch values it cannot see.
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                tiled_mma_first.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                if wg_idx <= self.num_mma_wg:
                    self._handoff_mainloop(tidx, tiled_mma, tiled_mma_first, sA, sB, ab_pipeline, k_tiles, sched_params,
                                           sAcc, acc_mbar)
                else:
                    self._handoff_epilogue(
                        tidx, warp_idx, tiled_mma, sched_params, sAcc, acc_mbar, l_mbar,
                        *self._epi_buffers(storage, epi_layouts),
                        tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, mBias, m_size, n_size,
                    )
            elif cutlass.const_expr(self.pingpong):
                self._consume_pingpong(
                    tidx, warp_idx, tiled_mma, tiled_mma_first, sA, sB, ab_pipeline, k_tiles, sched_params, index_pipe, s_idx,
                    l_mbar,
                    *self._epi_buffers(storage, epi_layouts),
                    tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, mBias, m_size, n_size,
                )
            else:
                mma_tidx = tidx - 128
                thr_mma = tiled_mma.get_slice(mma_tidx)
                tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
                tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))

                # Each accumulator's coordinates: in the tile (static shape) for the smem channels of
                # other widths, and in the problem for the bias.
                tCcT = thr_mma.partition_C(cute.make_identity_tensor((tm, tn)))
                gcG = cute.local_tile(cute.make_identity_tensor((m_size, n_size)), (tm, tn), (None, None))
                acc = cute.make_rmem_tensor(tCcT.shape, self.acc_dtype)

                # A 256-row tile gives each warpgroup two m64 atoms along M: the epilogue then
                # walks the accumulators in the copy's order, as a pingpong warpgroup does.
                two_atoms = tm > 64 * self.atom_layout_mnk[0]
                ep = self._epilogue_setup(
                    tiled_mma, mma_tidx, acc,
                    *self._epi_buffers(storage, epi_layouts),
                    tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, l_mbar,
                    self._copy_order(tiled_mma, m_size, n_size) if two_atoms else None,
                )
                if cutlass.const_expr(two_atoms):
                    acc_of, tCcT = ep.acc_of, ep.cT
                else:
                    # Visit order = the accumulators' own (one m64 atom per warpgroup along M).
                    acc_of = list(range(cute.size(ep.tRS_acc)))
                S = ep.S  # a Python int; read inside the tile loop, ep's ints would arrive dynamic
                epi_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_mma_threads)
                store_pipeline = pipeline.PipelineTmaStore.create(
                    num_stages=STORE_WINDOW,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads),
                )
                store_warp = 4  # first consumer warp issues the TMA stores

                sched, work, read_state, release_state = self._consumer_start(sched_params, index_pipe, s_idx)
                epi_count = cutlass.Int32(0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                tiled_mma_first.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                if cutlass.const_expr(self.stream_k):
                    self._consume_stream_k(
                        ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles,
                        sched_params, mCounter, mma_tidx, thr_mma, gcG, ep, acc_of, tCcT,
                        warp_idx == store_warp, epi_barrier, store_pipeline, mBias, n_size, S,
                    )
                else:
                    while work.is_valid_tile:
                        tc = work.tile_idx
                        self._start_tile_preact(ep, tc, epi_count, warp_idx == store_warp)
                        read_state, release_state = mainloop.consume_tile(
                            ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles
                        )
                        if cutlass.const_expr(two_atoms):
                            tile_cG = ep.thr_r2s_d.partition_S(ep.gcG[(None, None, tc[0], tc[1])])
                        else:
                            tile_cG = thr_mma.partition_C(gcG[(None, None, tc[0], tc[1])])
                        epi_count = self._epilogue_tile(
                            ep, tc, acc_of, tCcT, tile_cG,
                            epi_count, 0, warp_idx == store_warp, epi_barrier, store_pipeline, mBias, n_size,
                            S, True, False,
                        )

                        sched.advance_to_next_work()
                        work = sched.get_current_work()
                store_pipeline.producer_tail()


    # ---- stream-K (config.stream_k; see tile_scheduler) --------------------------------------------

    @cute.jit
    def _produce_stream_k(
        self, ab_pipeline, state, tma_a, tAgA, tAsA, a_mask, tma_b, tBgB, tBsB, b_mask, k_tiles, sched_params,
        tma_f, gF, num_sub: cutlass.Constexpr,
    ):
        """The producer's side of stream-K: the whole tiles of the full waves, then every piece of
        this cluster's segment, in the order the consumers take them. The L2 prefetch of the
        epilogue input (tma_f) goes with the whole tiles only."""
        dp_end, sk_iters, grid = tile_scheduler.stream_k_plan(sched_params, k_tiles)
        cta = tile_scheduler.cta_in_cluster(sched_params)
        c = cutlass.Int32(cute.arch.block_idx()[2])
        idx = c
        while idx < dp_end:
            state = self._produce_tile_at(
                ab_pipeline, state, tile_scheduler.work_at(sched_params, idx, cta).tile_idx,
                tma_a, tAgA, tAsA, a_mask, tma_b, tBgB, tBsB, b_mask, k_tiles, tma_f, gF, num_sub,
            )
            idx += grid
        it, end = tile_scheduler.stream_k_segment(c, grid, sk_iters)
        while it < end:
            t = it // k_tiles
            k0 = it - t * k_tiles
            k1 = cutlass.min(k_tiles, end - t * k_tiles)
            state = self._produce_tile_at(
                ab_pipeline, state, tile_scheduler.work_at(sched_params, dp_end + t, cta).tile_idx,
                tma_a, tAgA, tAsA, a_mask, tma_b, tBgB, tBsB, b_mask, k1 - k0, None, None, num_sub, k_begin=k0,
            )
            it = (t + 1) * k_tiles
        return state

    @cute.jit
    def _produce_tile_at(
        self, ab_pipeline, state, tc, tma_a, tAgA, tAsA, a_mask, tma_b, tBgB, tBsB, b_mask, k_count,
        tma_f, gF, num_sub: cutlass.Constexpr, k_begin=None,
    ):
        """Load k_count K slices (from k_begin, else from 0) of output tile tc's A and B rows; with
        a prefetch view gF, also prefetch the tile's epilogue input into L2 (tma_f None: none)."""
        return mainloop.produce_tile(
            ab_pipeline, state,
            tma_a, tAgA[(None, tc[0], None, tc[2])], tAsA, a_mask,
            tma_b, tBgB[(None, tc[1], None, tc[2])], tBsB, b_mask,
            k_count,
            tma_f, gF[(None, tc[0], None, 0)] if cutlass.const_expr(gF is not None) else None,
            tc[1] * num_sub, num_sub,
            self._policy(0), k_begin=k_begin,
        )

    @cute.jit
    def _consume_stream_k(
        self, ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles,
        sched_params, mWork, mma_tidx, thr_mma, gcG, ep, acc_of, tCcT,
        is_store_warp, epi_barrier, store_pipeline, mBias, n_size, S: cutlass.Constexpr,
    ):
        """The cooperative consumers' side of stream-K: whole tiles as usual, then the pieces of
        this cluster's segment. A contributor piece leaves its accumulators in its CTA's
        workspace slot and adds its K-block count to the tile's flag; the owner piece waits for
        the flag, adds the slots of the later clusters in order, and runs the epilogue."""
        dp_end, sk_iters, grid = tile_scheduler.stream_k_plan(sched_params, k_tiles)
        cta = tile_scheduler.cta_in_cluster(sched_params)
        c = cutlass.Int32(cute.arch.block_idx()[2])
        cm, cn = self.cluster_shape_mn
        csize = cm * cn
        rank = cta[0] + cta[1] * cm  # this CTA's slot among its cluster's
        tm, tn, _ = self.tile_shape_mnk
        n_acc = cute.size(acc)
        threads = self.num_mma_threads
        flags = mWork.iterator
        parts = cute.make_tensor(
            cute.recast_ptr(flags + tile_scheduler.stream_k_flag_words(sk_iters // k_tiles, csize), dtype=self.acc_dtype),
            cute.make_layout(grid * csize * tm * tn),
        )
        epi_count = cutlass.Int32(0)

        idx = c
        while idx < dp_end:
            tc = tile_scheduler.work_at(sched_params, idx, cta).tile_idx
            read_state, release_state = mainloop.consume_tile(
                ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles
            )
            epi_count = self._epilogue_tile(
                ep, tc, acc_of, tCcT, thr_mma.partition_C(gcG[(None, None, tc[0], tc[1])]),
                epi_count, 0, is_store_warp, epi_barrier, store_pipeline, mBias, n_size, S, True, False,
            )
            idx += grid

        it, end = tile_scheduler.stream_k_segment(c, grid, sk_iters)
        while it < end:
            t = it // k_tiles
            k0 = it - t * k_tiles
            k1 = cutlass.min(k_tiles, end - t * k_tiles)
            read_state, release_state = mainloop.consume_tile(
                ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k1 - k0
            )
            flag = flags + (t * csize + rank)
            if k0 > 0:
                # Contributor: a coalesced slot (accumulator i of every thread, then i + 1), then
                # the count, released after every consumer thread's stores (the barrier).
                base = (c * csize + rank) * (tm * tn) + mma_tidx
                for i in cutlass.range_constexpr(n_acc):
                    parts[base + i * threads] = acc[i]
                epi_barrier.arrive_and_wait()
                if mma_tidx == 0:
                    cute.arch.fence_acq_rel_gpu()
                    cute.arch.red(flag, k1 - k0, op="add", dtype=cutlass.Int32, sem="relaxed", scope="gpu")
            else:
                # Owner: wait for every K block it did not compute, then add the later clusters'
                # slots in cluster order (the same sum, bit for bit, on every run).
                if mma_tidx == 0:
                    seen = cute.arch.load(flag, cutlass.Int32, sem="acquire", scope="gpu")
                    while seen != k_tiles - k1:
                        seen = cute.arch.load(flag, cutlass.Int32, sem="acquire", scope="gpu")
                epi_barrier.arrive_and_wait()
                tile_end = (t + 1) * k_tiles
                # Only the clusters that start inside this tile hold pieces of it: the loop stops
                # at the last of them (the same slots in the same order as a loop over the whole
                # grid; tile_scheduler), not at the grid's end, up to 131 turns of integer
                # divisions later (an owner at T=512 d=8192's fc1 took 12% of the GEMM's time
                # in them).
                reach = cutlass.min(grid, tile_scheduler.stream_k_clusters_starting_before(tile_end, grid, sk_iters))
                for c2 in cutlass.range(c + 1, reach, unroll=1):
                    s2, e2 = tile_scheduler.stream_k_segment(c2, grid, sk_iters)
                    if s2 < tile_end:
                        if e2 > s2:
                            base = (c2 * csize + rank) * (tm * tn) + mma_tidx
                            for i in cutlass.range_constexpr(n_acc):
                                acc[i] = acc[i] + parts[base + i * threads]
                tc = tile_scheduler.work_at(sched_params, dp_end + t, cta).tile_idx
                epi_count = self._epilogue_tile(
                    ep, tc, acc_of, tCcT, thr_mma.partition_C(gcG[(None, None, tc[0], tc[1])]),
                    epi_count, 0, is_store_warp, epi_barrier, store_pipeline, mBias, n_size, S, True, False,
                )
            it = (t + 1) * k_tiles

    # ---- pingpong consumers --------------------------------------------------------------------

    @cute.jit
    def _consume_pingpong(
        self, tidx, warp_idx, tiled_mma, tiled_mma_first, sA, sB, ab_pipeline, k_tiles, sched_params, index_pipe, s_idx,
        l_mbar, sD, sP, sH, sX, sL, tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, mBias, m_size, n_size,
    ):
        """One consumer warpgroup of a pingpong pair: tiles wg, wg + 2, ... of the CTA's sequence.

        Per tile: [preact load] -> mainloop (in turn with the other warpgroup) -> epilogue (in
        turn: the D/P/H/X smem buffers and their TMA stores are shared, so a warpgroup's
        epilogue drains its stores before handing over). The producer warp is the same as for
        cooperative consumers: it loads every tile of the sequence into the ring, and each
        warpgroup skips the other's stages (mainloop.consume_tile_pingpong)."""
        tm, tn, tk = self.tile_shape_mnk
        has = {c: self.ch_width[c] > 0 for c in self.ch_width}
        wg = cute.arch.make_warp_uniform((tidx - 128) // 128)  # 0 or 1 among the consumers
        wg_tidx = tidx % 128
        thr_mma = tiled_mma.get_slice(wg_tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(cute.make_identity_tensor((tm, tn))).shape, self.acc_dtype)

        ep = self._epilogue_setup(
            tiled_mma, wg_tidx, acc, sD, sP, sH, sX, sL,
            tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, l_mbar,
            self._copy_order(tiled_mma, m_size, n_size),
        )
        acc_of, tRS_cT, gcG = ep.acc_of, ep.cT, ep.gcG
        S = ep.S  # a Python int; read inside the tile loop, ep's ints would arrive dynamic

        # This warpgroup's own 128-thread barrier and store warp (its first warp); its TMA store
        # groups are that warp's own, so the two warpgroups' store pipelines are independent.
        epi_barrier = pipeline.NamedBarrier(barrier_id=PP_EPI_BARRIER + wg, num_threads=128)
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=STORE_WINDOW,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
        )
        is_store_warp = warp_idx % 4 == 0

        sched, work, read_state, release_state = self._consumer_start(sched_params, index_pipe, s_idx)
        if wg == 1:
            # WG0 goes first in both orders; WG1 starts at the CTA's second tile.
            mainloop.order_arrive(PP_MMA_ORDER, wg)
            mainloop.order_arrive(PP_EPI_ORDER, wg)
            sched.advance_to_next_work()
            work = sched.get_current_work()
        # ... and past the first tile's ring stages (0 stages for WG0).
        read_state.advance(k_tiles * wg)
        release_state.advance(k_tiles * wg)

        l_count = cutlass.Int32(0)  # this warpgroup's preact subtiles so far (its own L ring)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        tiled_mma_first.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
        while work.is_valid_tile:
            tc = work.tile_idx
            if cutlass.const_expr(has["L"]):
                # The tile's first preact subtiles (one per slot) land during the mainloop (own
                # ring: no turn; the last tile left every slot drained).
                if is_store_warp:
                    for i in cutlass.range_constexpr(min(self.l_ring, tn // self.epi_tile[1])):
                        self._load_preact(ep, tc, i, l_count + i, wg)
            read_state, release_state = mainloop.consume_tile_pingpong(
                ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles, PP_MMA_ORDER, wg
            )
            mainloop.order_wait(PP_EPI_ORDER, wg)
            # The output buffers start drained at every turn (buffer e % 2), and are handed over
            # drained (the last subtile waits for all of this tile's stores to have read smem).
            l_count = self._epilogue_tile(
                ep, tc, acc_of, tRS_cT, ep.thr_r2s_d.partition_S(gcG[(None, None, tc[0], tc[1])]),
                l_count, wg, is_store_warp, epi_barrier, store_pipeline, mBias, n_size,
                S, False, True,
            )
            mainloop.order_arrive(PP_EPI_ORDER, wg)
            # Next own tile: skip the other warpgroup's. The dynamic scheduler's ring ends with one
            # past-the-end index and nothing after it, so never read beyond an invalid one.
            sched.advance_to_next_work()
            work = sched.get_current_work()
            if cutlass.const_expr(self.dynamic):
                if work.is_valid_tile:
                    sched.advance_to_next_work()
                    work = sched.get_current_work()
            else:
                sched.advance_to_next_work()
                work = sched.get_current_work()
        store_pipeline.producer_tail()

    # ---- handoff consumers --------------------------------------------------------------------
    #
    # Warpgroups 1-2 run each tile's mainloop as cooperative consumers do, then copy their
    # accumulators into sAcc (once the epilogue warpgroups have read the tile before) and go on
    # to the next tile's mainloop; warpgroups 3-4 run the epilogue of the tile in sAcc, thread t
    # reading what mainloop thread t wrote, so the epilogue is the cooperative one unchanged.
    # Both walk the same static tile sequence.

    def _acc_slab(self, sAcc, t, shape):
        """Thread t's accumulators in sAcc, shaped as its register fragment (`shape`): values
        4i .. 4i + 3 (the fragment's flat order) in the 16 bytes at element (i * num_mma_threads
        + t) * 4, so a warp's 16-byte stores and loads cover 512 contiguous bytes (no bank
        conflict) and the compiler issues one st/ld.shared.v4 per four values."""
        n = cute.size(shape)
        spread = cute.make_layout((4, n // 4), stride=(1, 4 * self.num_mma_threads))
        ptr = cute.make_ptr(self.acc_dtype, (sAcc.iterator + 4 * t).toint(), cute.AddressSpace.smem, assumed_align=16)
        return cute.make_tensor(ptr, cute.composition(spread, cute.make_layout(shape)))

    @cute.jit
    def _handoff_mainloop(self, tidx, tiled_mma, tiled_mma_first, sA, sB, ab_pipeline, k_tiles, sched_params,
                          sAcc, acc_mbar):
        mma_tidx = tidx - 128
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(cute.make_identity_tensor(self.tile_shape_mnk[:2])).shape,
                                    self.acc_dtype)
        slab = self._acc_slab(sAcc, mma_tidx, acc.shape)
        sched, work, read_state, release_state = self._consumer_start(sched_params, None, None)
        tiles = cutlass.Int32(0)
        while work.is_valid_tile:
            read_state, release_state = mainloop.consume_tile(
                ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles
            )
            # "empty" completes once per tile the epilogue has read; before the first, the wait
            # for the phase before a fresh barrier's first returns at once.
            cute.arch.mbarrier_wait(acc_mbar + 1, (tiles + 1) % 2)
            for j in cutlass.range_constexpr(cute.size(acc)):
                slab[j] = acc[j]
            cute.arch.mbarrier_arrive(acc_mbar)
            tiles += 1
            sched.advance_to_next_work()
            work = sched.get_current_work()

    @cute.jit
    def _handoff_epilogue(
        self, tidx, warp_idx, tiled_mma, sched_params, sAcc, acc_mbar, l_mbar, sD, sP, sH, sX, sL,
        tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, mBias, m_size, n_size,
    ):
        tm, tn, _ = self.tile_shape_mnk
        epi_tidx = tidx - 128 * (1 + self.num_mma_wg)
        thr_mma = tiled_mma.get_slice(epi_tidx)
        tCcT = thr_mma.partition_C(cute.make_identity_tensor((tm, tn)))
        gcG = cute.local_tile(cute.make_identity_tensor((m_size, n_size)), (tm, tn), (None, None))
        acc = self._acc_slab(sAcc, epi_tidx, tCcT.shape)
        ep = self._epilogue_setup(
            tiled_mma, epi_tidx, acc, sD, sP, sH, sX, sL,
            tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, l_mbar,
        )
        acc_of = list(range(cute.size(ep.tRS_acc)))  # one m64 atom per warpgroup: the fragment's order
        S = ep.S
        epi_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_epi_threads)
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=STORE_WINDOW,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_epi_threads),
        )
        store_warp = 4 * (1 + self.num_mma_wg)  # the first epilogue warp issues the TMA stores
        sched = tile_scheduler.create(sched_params)
        work = sched.initial_work_tile_info()
        epi_count = cutlass.Int32(0)
        tiles = cutlass.Int32(0)
        while work.is_valid_tile:
            tc = work.tile_idx
            self._start_tile_preact(ep, tc, epi_count, warp_idx == store_warp)
            cute.arch.mbarrier_wait(acc_mbar, tiles % 2)
            epi_count = self._epilogue_tile(
                ep, tc, acc_of, tCcT, thr_mma.partition_C(gcG[(None, None, tc[0], tc[1])]),
                epi_count, 0, warp_idx == store_warp, epi_barrier, store_pipeline, mBias, n_size,
                S, True, False,
            )
            cute.arch.mbarrier_arrive(acc_mbar + 1)
            tiles += 1
            sched.advance_to_next_work()
            work = sched.get_current_work()
        store_pipeline.producer_tail()

    def _copy_order(self, tiled_mma, m_size, n_size):
        """For a warpgroup with two m64 atoms along M (a pingpong 128-row tile, or half of a
        cooperative 256-row one): the retiled accumulators run over all columns of the first 64
        rows before the next 64, while a 32-column subtile's fragment takes both row halves. The
        returned hook (for _epilogue_setup) gathers each subtile's values through a static
        permutation and gives the epilogue the coordinates in the fragment's (copy) order."""
        tm, tn, _ = self.tile_shape_mnk

        def copy_order(ep):
            ep.acc_of = subtile_order(tiled_mma, ep.r2s_d, tm, tn)
            ep.cT = ep.thr_r2s_d.partition_S(cute.make_identity_tensor((tm, tn)))
            ep.gcG = cute.local_tile(cute.make_identity_tensor((m_size, n_size)), (tm, tn), (None, None))

        return copy_order

    def _consumer_start(self, sched_params, index_pipe, s_idx):
        """A consumer's tile scheduler (the dynamic one reads the producer's index ring), its
        first tile, and its read / release positions in the A/B ring."""
        if cutlass.const_expr(self.dynamic):
            sched = tile_scheduler.DynamicConsumer.create(sched_params, index_pipe, s_idx)
        else:
            sched = tile_scheduler.create(sched_params)
        work = sched.initial_work_tile_info()
        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        return sched, work, read_state, release_state


# ---- compile-time signatures --------------------------------------------------------------------

_CUTE_DTYPES = {}


def cute_dtype(name: str):
    return {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16, "float32": cutlass.Float32}[name]


def fake_matrix(dtype, major: str, rows_sym=None, cols_sym=None):
    """A symbolic (rows, cols) matrix whose `major` mode ('row': cols contiguous, 'col': rows
    contiguous) has stride 1 and whose other stride is a dynamic multiple of 16 bytes."""
    div = 128 // dtype.width
    rows = rows_sym if rows_sym is not None else cute.sym_int32()
    cols = cols_sym if cols_sym is not None else cute.sym_int32()
    ld = cute.sym_int64(divisibility=div)
    if major == "row":
        return make_fake_tensor(dtype, (rows, cols), (ld, 1), assumed_align=16)
    return make_fake_tensor(dtype, (rows, cols), (1, ld), assumed_align=16)
