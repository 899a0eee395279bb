"""The GEMM mainloop: a TMA producer warp and WGMMA consumer warpgroups around an smem ring.

Stage s of the ring holds one (tile_m x 64) slice of A and one (tile_n x 64) slice of B. The
producer waits until a stage is empty, arms its "full" mbarrier with the bytes it expects, and
issues two TMA loads that complete on that mbarrier (multicast to the other CTAs of the cluster
that share the slice). The consumers wait on "full", issue the stage's WGMMAs asynchronously, and
release the *previous* stage once its WGMMAs have retired (wait_group(1)), so one stage of MMAs
is always in flight while the next is being issued.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

# K blocks between two L2 prefetches of epilogue subtiles (produce_tile): 8 subtiles of a 128x256
# tile span the last 16 K blocks, roughly the last 10 us of a K=4096 tile's mainloop.
PREFETCH_STRIDE = 2


@cute.jit
def produce_tile(
    ab_pipeline: pipeline.PipelineTmaAsync,
    state: pipeline.PipelineState,
    tma_atom_a: cute.CopyAtom,
    tAgA: cute.Tensor,
    tAsA: cute.Tensor,
    a_mcast_mask,
    tma_atom_b: cute.CopyAtom,
    tBgB: cute.Tensor,
    tBsB: cute.Tensor,
    b_mcast_mask,
    k_tiles: cutlass.Int32,
    prefetch_atom=None,
    prefetch_g=None,
    prefetch_first=None,
    prefetch_count: cutlass.Constexpr = 0,
    cache_policy=None,
    k_begin=None,
):
    """Load all K slices of one output tile's A and B rows into the ring; returns the state.
    `cache_policy` (an Int64 L2 policy, or None for the DSL's default) goes with both loads.
    With `k_begin` (stream-K), the k_tiles slices from that K block on instead.

    With a prefetch atom (a TMA load atom of the epilogue's input), the tile's `prefetch_count`
    epilogue subtiles prefetch_g[(None, prefetch_first + j)] are prefetched into L2, one every
    PREFETCH_STRIDE K blocks over the mainloop's last stretch: late enough that the lines are
    still in L2 when the epilogue reads them, spread out so they share HBM with A and B.
    """
    if cutlass.const_expr(prefetch_atom is not None):
        pf_start = cutlass.max(k_tiles - PREFETCH_STRIDE * prefetch_count, 0)
    for k in cutlass.range(k_tiles, unroll=1):
        ab_pipeline.producer_acquire(state)
        bar = ab_pipeline.producer_get_barrier(state)
        kg = k if cutlass.const_expr(k_begin is None) else k_begin + k
        cute.copy(tma_atom_a, tAgA[(None, kg)], tAsA[(None, state.index)], tma_bar_ptr=bar, mcast_mask=a_mcast_mask,
                  cache_policy=cache_policy)
        cute.copy(tma_atom_b, tBgB[(None, kg)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=b_mcast_mask,
                  cache_policy=cache_policy)
        if cutlass.const_expr(prefetch_atom is not None):
            j = k - pf_start
            if j >= 0:
                if j % PREFETCH_STRIDE == 0:
                    # Unlike cute.copy's TMA, the prefetch does not elect a thread itself.
                    with cute.arch.elect_one():
                        cute.prefetch(prefetch_atom, prefetch_g[(None, prefetch_first + j // PREFETCH_STRIDE)])
        # TMA arrives on the barrier itself; commit is a no-op kept for the pipeline protocol.
        ab_pipeline.producer_commit(state)
        state.advance()
    return state


@cute.jit
def issue_tile_mmas(
    ab_pipeline: pipeline.PipelineTmaAsync,
    read_state: pipeline.PipelineState,
    release_state: pipeline.PipelineState,
    tiled_mma: cute.TiledMma,
    tiled_mma_first: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    k_tiles: cutlass.Int32,
):
    """acc = the WGMMAs of every K stage of one tile, releasing each stage once the next
    stage's WGMMAs are issued and its own have retired. Returns with the last stage's group still
    in flight and its slot held: the caller retires it (`retire_tile`), possibly after handing the
    tensor cores to another warpgroup. The tile's first K block goes through `tiled_mma_first`
    (ACCUMULATE off: it overwrites acc, so nothing clears it first), the rest through
    `tiled_mma` (ACCUMULATE on). Both fields are set once, before the persistent loop: mutating
    a TiledMma here, inside the loop, is not threaded through the staged control flow."""
    num_k_blocks = cute.size(tCrA, mode=[2])
    # Prologue: the first stage, with no earlier group to keep in flight.
    ab_pipeline.consumer_wait(read_state)
    cute.nvgpu.warpgroup.fence()
    for kb in cutlass.range_constexpr(num_k_blocks):
        mma = tiled_mma_first if kb == 0 else tiled_mma
        cute.gemm(mma, acc, tCrA[(None, None, kb, read_state.index)], tCrB[(None, None, kb, read_state.index)], acc)
    cute.nvgpu.warpgroup.commit_group()
    read_state.advance()
    for k in cutlass.range(1, k_tiles, unroll=1):
        ab_pipeline.consumer_wait(read_state)
        # Order this stage's WGMMAs after the accumulator accesses of the previous issue (what
        # ptxas would otherwise inject itself, warning C7519).
        cute.nvgpu.warpgroup.fence()
        for kb in cutlass.range_constexpr(num_k_blocks):
            cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)], tCrB[(None, None, kb, read_state.index)], acc)
        cute.nvgpu.warpgroup.commit_group()
        # Keep this stage's MMAs in flight; the previous stage's have retired, so free its slot.
        cute.nvgpu.warpgroup.wait_group(1)
        ab_pipeline.consumer_release(release_state)
        release_state.advance()
        read_state.advance()
    return read_state, release_state


@cute.jit
def retire_tile(ab_pipeline: pipeline.PipelineTmaAsync, release_state: pipeline.PipelineState):
    """Wait for the tile's last WGMMAs and free the stage they read."""
    cute.nvgpu.warpgroup.wait_group(0)
    ab_pipeline.consumer_release(release_state)
    release_state.advance()
    return release_state


@cute.jit
def consume_tile(
    ab_pipeline: pipeline.PipelineTmaAsync,
    read_state: pipeline.PipelineState,
    release_state: pipeline.PipelineState,
    tiled_mma: cute.TiledMma,
    tiled_mma_first: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    k_tiles: cutlass.Int32,
):
    """acc = sum over K of A_k @ B_k for one tile; returns (read_state, release_state)."""
    read_state, release_state = issue_tile_mmas(
        ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles
    )
    release_state = retire_tile(ab_pipeline, release_state)
    return read_state, release_state


# ---- pingpong consumers -------------------------------------------------------------------------
#
# Two consumer warpgroups own alternate tiles of the CTA's sequence. Named barriers order their
# mainloops (and, in gemm_sm90, their epilogues): warpgroup w waits on barrier `base + w`, which
# completes once the other warpgroup (128 threads) has arrived on it; 256 threads in all. This is
# an ordered sequence of two: WG0 mainloop, WG1 mainloop, WG0 mainloop, ... and WG1 pre-arrives
# once on WG0's barrier so WG0 goes first.


@cute.jit
def order_wait(base: int, wg: cutlass.Int32):
    """Block until the other warpgroup has handed the turn to warpgroup `wg`."""
    cute.arch.barrier(barrier_id=base + wg, number_of_threads=256)


@cute.jit
def order_arrive(base: int, wg: cutlass.Int32):
    """Hand the turn from warpgroup `wg` to the other one (non-blocking)."""
    cute.arch.barrier_arrive(barrier_id=base + 1 - wg, number_of_threads=256)


@cute.jit
def consume_tile_pingpong(
    ab_pipeline: pipeline.PipelineTmaAsync,
    read_state: pipeline.PipelineState,
    release_state: pipeline.PipelineState,
    tiled_mma: cute.TiledMma,
    tiled_mma_first: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    k_tiles: cutlass.Int32,
    order_base: int,
    wg: cutlass.Int32,
):
    """consume_tile for one warpgroup of a pingpong pair: waits for its turn, issues all of the
    tile's WGMMAs, hands the turn over as soon as the last ones are issued (the other warpgroup's
    first WGMMAs then queue right behind them, so the tensor cores never drain), retires its own,
    and finally skips the ring stages of the other warpgroup's next tile (k_tiles of them), which
    that warpgroup reads and releases. Returns (read_state, release_state)."""
    order_wait(order_base, wg)
    read_state, release_state = issue_tile_mmas(
        ab_pipeline, read_state, release_state, tiled_mma, tiled_mma_first, acc, tCrA, tCrB, k_tiles
    )
    order_arrive(order_base, wg)
    release_state = retire_tile(ab_pipeline, release_state)
    # The other warpgroup's tile comes next in the ring.
    read_state.advance(k_tiles)
    release_state.advance(k_tiles)
    return read_state, release_state
