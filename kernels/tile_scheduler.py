"""Persistent tile scheduling for the sm90 GEMM: static (default) and dynamic.

The grid has one CTA (cluster) per SM at most. The order in which tile *indices* map to output
tiles is the grouped ("swizzled") rasterization of the installed CuTe DSL scheduler: clusters are
taken `raster_group` columns at a time, walking down M inside a group, so the A and B tiles that
neighbouring SMs load at the same time overlap and stay in L2. Both schedulers share that mapping
(`work_at`); they differ only in which indices a CTA walks.

Static: CTA c walks c, c + grid, c + 2 * grid, ... The producer warp and the consumer warpgroups
each own a scheduler and advance them in lock step, so they agree on the tile sequence without
talking to each other.

Dynamic: CTA c starts at index c, then claims the next index with an atomic add on a global
int32 counter (index = grid + old value), so an SM that finishes early takes more tiles instead
of idling behind a slow one. Only the producer warp claims; it hands each index to the consumer
warpgroups through a small shared-memory ring guarded by mbarriers (a PipelineAsync of tile
indices), because the consumers must walk exactly the tiles the producer loaded. The last index
handed over is the first one past the end, which stops both sides. Indices that the grouped
rasterization adds as padding (a column past N) are claimed and skipped, never handed over. The counter must be 0 at
launch (ops.py zeroes it on the launch stream). Clusters of one CTA only: in a larger cluster
every CTA must work on the same cluster index, which would need the claimed index sent to the
peer CTAs' shared memory; not built.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass import Int32
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values

# Depth of the tile-index ring: how many tiles the producer may claim ahead of the consumers. The
# A/B ring already bounds how far ahead it loads; 4 keeps it from stalling on tiny-K tiles.
SCHED_STAGES = 4


def make_params(m_tiles_shape, cluster_shape_mn, raster_group: int):
    """Host side: scheduler parameters for a grid of (tiles_m, tiles_n, 1) output tiles."""
    return utils.PersistentTileSchedulerParams(
        m_tiles_shape, (*cluster_shape_mn, 1), raster_group, True
    )


def grid_shape(params, max_active_clusters: int):
    """The same persistent grid for both schedulers: (cluster_m, cluster_n, clusters)."""
    return utils.StaticPersistentTileScheduler.get_grid_shape(params, max_active_clusters)


@cute.jit
def create(params):
    """Device side: this CTA's static scheduler, positioned at its first tile."""
    return utils.StaticPersistentTileScheduler.create(
        params, cute.arch.block_idx(), cute.arch.grid_dim()
    )


@cute.jit
def work_at(params, linear_idx: Int32):
    """The output tile of cluster-linear index `linear_idx` (a WorkTileInfo: tile_idx (m, n, l)
    and is_valid_tile = index < number of tiles), computed by the static scheduler's own code so
    both schedulers rasterize identically. Cluster of one CTA: its offset in the cluster is 0."""
    one = utils.StaticPersistentTileScheduler(
        params, Int32(1), linear_idx, (Int32(0), Int32(0), Int32(0)), Int32(0)
    )
    return one.get_current_work()


def make_index_pipeline(barrier_ptr, num_consumer_threads: int):
    """The producer -> consumers ring of tile indices: one producer thread publishes, every
    consumer thread arrives once it has read the slot (so the slot is never overwritten early)."""
    return pipeline.PipelineAsync.create(
        barrier_storage=barrier_ptr,
        num_stages=SCHED_STAGES,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, num_consumer_threads),
        defer_sync=True,
    )


class _DynamicBase:
    """Loop-carried state shared by both roles: the current tile index and the ring position.
    The ring, its smem slots, the counter and the params are defined before the persistent loop,
    so they are referenced, not carried."""

    def __init__(self, params, index_pipe, s_idx, counter_ptr, idx, state):
        self.params = params
        self.index_pipe = index_pipe
        self.s_idx = s_idx
        self.counter_ptr = counter_ptr
        self._idx = idx
        self._state = state

    def __extract_mlir_values__(self):
        return extract_mlir_values(self._idx) + extract_mlir_values(self._state)

    def __new_from_mlir_values__(self, values):
        return type(self)(
            self.params, self.index_pipe, self.s_idx, self.counter_ptr,
            new_from_mlir_values(self._idx, values[:1]), new_from_mlir_values(self._state, values[1:]),
        )

    @cute.jit
    def get_current_work(self):
        return work_at(self.params, self._idx)


class DynamicProducer(_DynamicBase):
    """The producer warp's side: claims indices and publishes each one to the consumers.
    Called by the whole producer warp; lane 0 does the atomic and the smem write."""

    @staticmethod
    @cute.jit
    def create(params, index_pipe, s_idx, counter_ptr):
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, SCHED_STAGES)
        return DynamicProducer(params, index_pipe, s_idx, counter_ptr, Int32(0), state)

    @cute.jit
    def initial_work_tile_info(self):
        # The first tile of each CTA is its own index: no atomic needed, and every CTA that
        # starts has work (the grid is never larger than the number of tiles).
        self._idx = Int32(cute.arch.block_idx()[2])
        self._skip_padding()
        self._publish()
        return self.get_current_work()

    @cute.jit
    def advance_to_next_work(self):
        self._idx = self._claim()
        self._skip_padding()
        self._publish()

    @cute.jit
    def _claim(self) -> Int32:
        """The next unclaimed index: grid + the counter's old value (one atomic per warp)."""
        old = Int32(0)
        if cute.arch.lane_idx() == 0:
            old = cute.arch.atomic_add(self.counter_ptr, Int32(1))
        old = cute.arch.shuffle_sync(old, 0)
        return cute.arch.make_warp_uniform(Int32(cute.arch.grid_dim()[2]) + old)

    @cute.jit
    def _skip_padding(self):
        """Claim again while the index is one of the rasterization's padding tiles.

        Grouped rasterization rounds the tile columns up to a multiple of raster_group, so when
        tiles_n is not such a multiple some indices name a column past N (with N <= tile_n,
        7 of every 8). The static scheduler runs them as full, fully out-of-bounds tiles (TMA
        zero-fills the loads and drops the stores). Here the producer decides alone, so it can
        skip them; the consumers only ever see in-bounds tiles and the terminating index.
        """
        padding = self._is_padding(self._idx)
        while padding:
            self._idx = self._claim()
            padding = self._is_padding(self._idx)

    @cute.jit
    def _is_padding(self, idx: Int32):
        work = work_at(self.params, idx)
        tiles_n = self.params.problem_shape_ntile_mnl[1]
        return work.is_valid_tile & (work.tile_idx[1] >= tiles_n)

    @cute.jit
    def _publish(self):
        """Write the current index into the next ring slot once the consumers have freed it. The
        writer itself arrives on the slot's "full" barrier, so the write is ordered before it."""
        self.index_pipe.producer_acquire(self._state)
        if cute.arch.lane_idx() == 0:
            self.s_idx[self._state.index] = self._idx
            self.index_pipe.producer_commit(self._state)
        self._state.advance()


class DynamicConsumer(_DynamicBase):
    """The consumer warpgroups' side: every thread reads each published index in turn."""

    @staticmethod
    @cute.jit
    def create(params, index_pipe, s_idx):
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SCHED_STAGES)
        return DynamicConsumer(params, index_pipe, s_idx, None, Int32(0), state)

    @cute.jit
    def initial_work_tile_info(self):
        self._receive()
        return self.get_current_work()

    @cute.jit
    def advance_to_next_work(self):
        self._receive()

    @cute.jit
    def _receive(self):
        self.index_pipe.consumer_wait(self._state)
        self._idx = self.s_idx[self._state.index]
        # Each thread's arrive (release) orders its own read before the producer's reuse.
        self.index_pipe.consumer_release(self._state)
        self._state.advance()
