"""Persistent, warp-specialized Hopper (sm_90a) GEMM with fused epilogues.

    D[M, N] (+)= A[M, K] @ B[N, K]^T, then an epilogue variant (see epilogue.py)

One CTA per SM (cluster of 1 or 2 CTAs). Warpgroup 0 is the producer: after giving most of its
registers away (setmaxnreg) its first warp runs the TMA loads of mainloop.produce_tile. The
other warpgroups are consumers: they take the registers (setmaxnreg up to 232), run the WGMMA
mainloop on their 64-row slice of the tile and then the epilogue, subtile by subtile, through
shared memory and TMA stores. Both sides walk the same persistent tile sequence
(tile_scheduler), so while the consumers run a tile's epilogue the producer is already
prefetching the next tile's A and B into the ring.

Operand majorness is a compile-time property: A may be K-major (row-major [M, K]) or M-major,
B may be K-major or N-major; D is row-major. M, N, K and the leading strides are dynamic, so a
compiled kernel serves every problem size of its layout; tails are handled by TMA's bounds
(zero-filled loads, clipped stores) and by predicates in the direct-access epilogue paths.
"""

from __future__ import annotations

import math
from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import make_fake_tensor

from . import mainloop, tile_scheduler
from .config import TILE_K, GemmConfig
from .epilogue import EpilogueSpec

try:  # moved in 4.8; the old spelling still works with a deprecation warning
    from cutlass.tensor_utils import LayoutEnum
except ImportError:  # pragma: no cover
    LayoutEnum = utils.LayoutEnum

SMEM_CAPACITY = 227 * 1024  # dynamic smem per CTA on sm_90 (228 KB minus 1 KB reserved)
PRODUCER_REGS = 40
CONSUMER_REGS = 232
EPI_STAGES = 2


class PersistentGemmSm90:
    def __init__(self, config: GemmConfig, epilogue: EpilogueSpec):
        self.cfg = config
        self.epi = epilogue
        self.tile_shape_mnk = (config.tile_m, config.tile_n, TILE_K)
        self.cluster_shape_mn = (config.cluster_m, config.cluster_n)
        # Two consumer warpgroups split a 128-row tile (64 rows each); a 64-row tile needs one.
        self.atom_layout_mnk = (2, 1, 1) if config.tile_m == 128 else (1, 1, 1)
        self.num_mma_wg = math.prod(self.atom_layout_mnk)
        self.num_threads = 128 * (1 + self.num_mma_wg)
        self.num_mma_threads = 128 * self.num_mma_wg
        self.epi_tile = (config.tile_m, 32)
        self.max_active_clusters = config.num_sms // (config.cluster_m * config.cluster_n)

    # ---- host-side setup (runs while tracing __call__) -----------------------------------------

    def _smem_layouts(self, a_dtype, a_layout, b_dtype, b_layout, d_dtype, post_dtype, acc_like):
        epi_bytes = 0
        tm, tn, tk = self.tile_shape_mnk
        epi_elems = self.epi_tile[0] * self.epi_tile[1]
        if self.epi.has_tma_d:
            epi_bytes += epi_elems * d_dtype.width // 8 * EPI_STAGES
        if self.epi.has_tma_post:
            epi_bytes += epi_elems * post_dtype.width // 8 * EPI_STAGES
        stage_bytes = (tm * tk) * a_dtype.width // 8 + (tn * tk) * b_dtype.width // 8
        ab_stages = (SMEM_CAPACITY - epi_bytes - 2048) // stage_bytes
        ab_stages = min(ab_stages, 8)
        if ab_stages < 2:
            raise ValueError(f"tile {tm}x{tn}: not enough shared memory for two stages")
        self.ab_stages = ab_stages
        self.sA_layout = sm90_utils.make_smem_layout_a(a_layout, self.tile_shape_mnk, a_dtype, ab_stages)
        self.sB_layout = sm90_utils.make_smem_layout_b(b_layout, self.tile_shape_mnk, b_dtype, ab_stages)
        row = LayoutEnum.ROW_MAJOR
        self.sD_layout = sm90_utils.make_smem_layout_epi(d_dtype, row, self.epi_tile, EPI_STAGES)
        self.sP_layout = sm90_utils.make_smem_layout_epi(post_dtype, row, self.epi_tile, EPI_STAGES)

    @staticmethod
    def _with_batch(t: cute.Tensor) -> cute.Tensor:
        """(X, Y) -> (X, Y, 1): the scheduler and tilers speak (m, n, l)."""
        return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1, stride=0)))

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
        stream: cuda.CUstream,
    ):
        a_dtype = mA.element_type
        b_dtype = mB.element_type
        a_layout = LayoutEnum.from_tensor(mA)
        b_layout = LayoutEnum.from_tensor(mB)
        d_dtype = mD.element_type if cutlass.const_expr(mD is not None) else mPost.element_type
        post_dtype = mPost.element_type if cutlass.const_expr(mPost is not None) else d_dtype
        self.d_dtype = d_dtype
        self.a_dtype = a_dtype
        self.b_dtype = b_dtype
        self.post_dtype = post_dtype
        self.acc_dtype = cutlass.Float32

        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            a_dtype, b_dtype, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
            self.acc_dtype, self.atom_layout_mnk, tiler_mn=(64, self.tile_shape_mnk[1]),
        )
        self._smem_layouts(a_dtype, a_layout, b_dtype, b_layout, d_dtype, post_dtype, None)

        mA3 = self._with_batch(mA)
        mB3 = self._with_batch(mB)
        cm, cn = self.cluster_shape_mn
        # A is shared by the CTAs of a cluster row (multicast along N), B along M.
        tma_a, tA = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp() if cn == 1 else cpasync.CopyBulkTensorTileG2SMulticastOp(),
            mA3, cute.slice_(self.sA_layout, (None, None, 0)),
            (self.tile_shape_mnk[0], self.tile_shape_mnk[2]), num_multicast=cn,
        )
        tma_b, tB = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp() if cm == 1 else cpasync.CopyBulkTensorTileG2SMulticastOp(),
            mB3, cute.slice_(self.sB_layout, (None, None, 0)),
            (self.tile_shape_mnk[1], self.tile_shape_mnk[2]), num_multicast=cm,
        )
        store_op = (
            cpasync.CopyReduceBulkTensorTileS2GOp(cute.ReductionKind.ADD)
            if cutlass.const_expr(self.epi.kind == "accumulate")
            else cpasync.CopyBulkTensorTileS2GOp()
        )
        tma_d, tD = None, None
        if cutlass.const_expr(self.epi.has_tma_d):
            tma_d, tD = cpasync.make_tiled_tma_atom(
                store_op, self._with_batch(mD), cute.slice_(self.sD_layout, (None, None, 0)), self.epi_tile
            )
        tma_p, tP = None, None
        if cutlass.const_expr(self.epi.has_tma_post):
            tma_p, tP = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), self._with_batch(mPost),
                cute.slice_(self.sP_layout, (None, None, 0)), self.epi_tile,
            )

        # Persistent grid over (tiles_m, tiles_n) output tiles.
        m_size = cute.size(mA, mode=[0])
        n_size = cute.size(mB, mode=[0])
        tiles_mnl = (
            (m_size + self.tile_shape_mnk[0] - 1) // self.tile_shape_mnk[0],
            (n_size + self.tile_shape_mnk[1] - 1) // self.tile_shape_mnk[1],
            1,
        )
        sched_params = tile_scheduler.make_params(tiles_mnl, self.cluster_shape_mn, self.cfg.raster_group)
        grid = tile_scheduler.grid_shape(sched_params, self.max_active_clusters)

        d_cosize = cute.cosize(self.sD_layout) if cutlass.const_expr(self.epi.has_tma_d) else 1
        p_cosize = cute.cosize(self.sP_layout) if cutlass.const_expr(self.epi.has_tma_post) else 1

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[a_dtype, cute.cosize(self.sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[b_dtype, cute.cosize(self.sB_layout)], 1024]
            sD: cute.struct.Align[cute.struct.MemRange[d_dtype, d_cosize], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[post_dtype, p_cosize], 1024]

        self.shared_storage = SharedStorage

        self.kernel(
            tma_a, tA, tma_b, tB, tma_d, tD, tma_p, tP,
            mD, mPost, mPreIn, mDpre, mBias, m_size, n_size,
            self.tiled_mma, self.sA_layout, self.sB_layout, self.sD_layout, self.sP_layout,
            sched_params,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            cluster=(cm, cn, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    # ---- the kernel --------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_d: Optional[cute.CopyAtom], mD_tma: Optional[cute.Tensor],
        tma_p: Optional[cute.CopyAtom], mP_tma: Optional[cute.Tensor],
        mD: Optional[cute.Tensor], mPost: Optional[cute.Tensor],
        mPreIn: Optional[cute.Tensor], mDpre: Optional[cute.Tensor], mBias: Optional[cute.Tensor],
        m_size: cutlass.Int32, n_size: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
        sD_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout,
        sched_params: utils.PersistentTileSchedulerParams,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        tm, tn, tk = self.tile_shape_mnk

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            if cutlass.const_expr(self.epi.has_tma_d):
                cpasync.prefetch_descriptor(tma_d)
            if cutlass.const_expr(self.epi.has_tma_post):
                cpasync.prefetch_descriptor(tma_p)

        # ---- cluster geometry and multicast masks
        cta_layout_mnk = cute.make_layout((*self.cluster_shape_mn, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout_mnk.get_flat_coord(cta_rank)
        cm, cn = self.cluster_shape_mn
        a_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1) if cutlass.const_expr(cn > 1) else 0
        b_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0) if cutlass.const_expr(cm > 1) else 0

        # ---- shared memory and the A/B pipeline
        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        tx_bytes = cute.size_in_bytes(self.a_dtype, cute.slice_(sA_layout, (None, None, 0))) + cute.size_in_bytes(
            self.b_dtype, cute.slice_(sB_layout, (None, None, 0))
        )
        # Every consumer warp of every CTA that reads a multicast slice must release it.
        consumer_arrivals = (cm + cn - 1) * self.num_mma_wg * 4
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_arrivals),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)

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

        if wg_idx == 0:
            # ---------------- producer warpgroup ----------------
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp_idx == 0:
                sched = tile_scheduler.create(sched_params)
                work = sched.initial_work_tile_info()
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
                while work.is_valid_tile:
                    tc = work.tile_idx
                    state = mainloop.produce_tile(
                        ab_pipeline, state,
                        tma_a, tAgA[(None, tc[0], None, tc[2])], tAsA, a_mask,
                        tma_b, tBgB[(None, tc[1], None, tc[2])], tBsB, b_mask,
                        k_tiles,
                    )
                    sched.advance_to_next_work()
                    work = sched.get_current_work()
                # Wait for the consumers to release the last stages, so no CTA of the cluster
                # exits while a multicast into its smem is in flight.
                ab_pipeline.producer_tail(state)
        else:
            # ---------------- consumer warpgroups ----------------
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            mma_tidx = tidx - 128
            thr_mma = tiled_mma.get_slice(mma_tidx)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))

            # Coordinates of every output element: lets the epilogue index bias / preact /
            # half- or double-width outputs at exactly the accumulators' positions.
            cD = cute.make_identity_tensor((m_size, n_size))
            gcD = cute.local_tile(cD, (tm, tn), (None, None))
            acc_shape = thr_mma.partition_C(gcD[(None, None, 0, 0)]).shape
            acc = cute.make_rmem_tensor(acc_shape, self.acc_dtype)

            # Registers -> smem: stmatrix for 16-bit outputs, plain stores for fp32.
            row = LayoutEnum.ROW_MAJOR
            r2s_atom_d = sm90_utils.get_smem_store_op(row, self.d_dtype, self.acc_dtype)
            c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.d_dtype)
            r2s_d = cute.make_tiled_copy_S(r2s_atom_d, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
            thr_r2s_d = r2s_d.get_slice(mma_tidx)
            r2s_atom_p = sm90_utils.get_smem_store_op(row, self.post_dtype, self.acc_dtype)
            p_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.post_dtype)
            r2s_p = cute.make_tiled_copy_S(r2s_atom_p, cute.make_tiled_copy_C_atom(p_atom, tiled_mma))
            thr_r2s_p = r2s_p.get_slice(mma_tidx)

            sD = storage.sD.get_tensor(sD_layout.outer, swizzle=sD_layout.inner)
            sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
            tRS_sD = thr_r2s_d.partition_D(sD)
            tRS_sP = thr_r2s_p.partition_D(sP)
            tRS_acc = r2s_d.retile(acc)
            sub_shape = thr_r2s_d.partition_S(sD).shape[:3]
            S = cute.size(sub_shape)
            rAcc = cute.make_rmem_tensor(sub_shape, self.acc_dtype)
            rD = cute.make_rmem_tensor(sub_shape, self.acc_dtype)
            rP = cute.make_rmem_tensor(sub_shape, self.acc_dtype)
            rD_out = cute.make_rmem_tensor(sub_shape, self.d_dtype)
            rP_out = cute.make_rmem_tensor(sub_shape, self.post_dtype)

            epi_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_mma_threads)
            store_pipeline = pipeline.PipelineTmaStore.create(
                num_stages=EPI_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads),
            )
            store_warp = 4  # first consumer warp issues the TMA stores

            gD_tiles = None
            gP_tiles = None
            if cutlass.const_expr(self.epi.has_tma_d):
                gD_tiles = cute.local_tile(mD_tma, (tm, tn), (None, None, None))
            if cutlass.const_expr(self.epi.has_tma_post):
                gP_tiles = cute.local_tile(mP_tma, (tm, tn), (None, None, None))

            sched = tile_scheduler.create(sched_params)
            work = sched.initial_work_tile_info()
            read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
            release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
            epi_count = cutlass.Int32(0)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            while work.is_valid_tile:
                tc = work.tile_idx
                read_state, release_state = mainloop.consume_tile(
                    ab_pipeline, read_state, release_state, tiled_mma, acc, tCrA, tCrB, k_tiles
                )

                tCc = thr_mma.partition_C(gcD[(None, None, tc[0], tc[1])])
                bSG_sD, bSG_gD, bSG_sP, bSG_gP = None, None, None, None
                if cutlass.const_expr(self.epi.has_tma_d):
                    bSG_sD, bSG_gD = cpasync.tma_partition(
                        tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2),
                        cute.zipped_divide(gD_tiles[(None, None, tc[0], tc[1], 0)], self.epi_tile),
                    )
                if cutlass.const_expr(self.epi.has_tma_post):
                    bSG_sP, bSG_gP = cpasync.tma_partition(
                        tma_p, 0, cute.make_layout(1), cute.group_modes(sP, 0, 2),
                        cute.zipped_divide(gP_tiles[(None, None, tc[0], tc[1], 0)], self.epi_tile),
                    )
                num_epi_m = tm // self.epi_tile[0]
                num_epi_n = tn // self.epi_tile[1]
                for e in cutlass.range_constexpr(num_epi_m * num_epi_n):
                    for v in cutlass.range_constexpr(S):
                        rAcc[v] = tRS_acc[e * S + v]
                    self.epi.visit(rAcc, rD, rP, tCc, e * S, m_size, n_size, mBias, mPreIn, mPost, mDpre)
                    buf = epi_count % EPI_STAGES
                    if cutlass.const_expr(self.epi.has_tma_d):
                        rD_out.store(rD.load().to(self.d_dtype))
                        cute.copy(r2s_d, rD_out, tRS_sD[(None, None, None, buf)])
                    if cutlass.const_expr(self.epi.has_tma_post):
                        rP_out.store(rP.load().to(self.post_dtype))
                        cute.copy(r2s_p, rP_out, tRS_sP[(None, None, None, buf)])
                    # smem written by the generic proxy, read next by the TMA (async proxy).
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epi_barrier.arrive_and_wait()
                    if warp_idx == store_warp:
                        gcoord = (e // num_epi_n, e % num_epi_n)
                        if cutlass.const_expr(self.epi.has_tma_d):
                            cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, gcoord)])
                        if cutlass.const_expr(self.epi.has_tma_post):
                            cute.copy(tma_p, bSG_sP[(None, buf)], bSG_gP[(None, gcoord)])
                        store_pipeline.producer_commit()
                        # Before buffer `buf` is written again, its store must have read smem.
                        store_pipeline.producer_acquire()
                    epi_barrier.arrive_and_wait()
                    epi_count += 1

                sched.advance_to_next_work()
                work = sched.get_current_work()
            store_pipeline.producer_tail()


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
