"""Persistent tile scheduling for the sm90 GEMM: static (default) and dynamic.

The grid has one CTA (cluster) per SM at most, and never more clusters than output tile clusters.
Tile *indices* map to output tiles by a grouped ("swizzled") rasterization: clusters are taken
`raster_group` columns at a time, walking down M inside a group (or, with `raster_along="m"`,
`raster_group` rows at a time, walking across N), so the A and B tiles that neighbouring SMs load
at the same time overlap and stay in L2; a last group narrower than `raster_group` stays narrow,
so every index names a real tile (no padding). With `serpentine`, every other group walks its
long side backwards, so a group starts where the one before it ended. Both schedulers share that
mapping (`work_at`); they differ only in which indices a CTA walks.

Static: CTA c walks c, c + grid, c + 2 * grid, ... The producer warp and the consumer warpgroups
each own a scheduler and advance them in lock step, so they agree on the tile sequence without
talking to each other.

Dynamic: CTA c starts at index c, then claims the next index with an atomic add on a global
int32 counter (index = grid + old value), so an SM that finishes early takes more tiles instead
of idling behind a slow one. Only the producer warp claims; it hands each index to the consumer
warpgroups through a small shared-memory ring guarded by mbarriers (a PipelineAsync of tile
indices), because the consumers must walk exactly the tiles the producer loaded. The last index
handed over is the first one past the end, which stops both sides. The counter must be 0 at
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


class RasterParams:
    """What both schedulers need on the device: the problem's size in clusters (dynamic), the
    cluster shape and the rasterization (group, along, serpentine: compile-time). Passed into the
    kernel as one argument; only the two cluster counts travel as runtime values."""

    def __init__(self, clusters_m, clusters_n, cluster_shape_mn, group: int, along: str = "n",
                 serpentine: bool = False):
        self.clusters_m = clusters_m
        self.clusters_n = clusters_n
        self.cluster_shape_mn = tuple(cluster_shape_mn)
        self.group = group
        self.along = along
        self.serpentine = serpentine

    def __extract_mlir_values__(self):
        return extract_mlir_values(self.clusters_m) + extract_mlir_values(self.clusters_n)

    def __new_from_mlir_values__(self, values):
        return RasterParams(
            new_from_mlir_values(self.clusters_m, values[:1]),
            new_from_mlir_values(self.clusters_n, values[1:2]),
            self.cluster_shape_mn, self.group, self.along, self.serpentine,
        )


def make_params(tiles_mnl, cluster_shape_mn, raster_group: int, along: str = "n",
                serpentine: bool = False) -> RasterParams:
    """Host side: scheduler parameters for a grid of (tiles_m, tiles_n, 1) output tiles."""
    cm, cn = cluster_shape_mn
    return RasterParams(
        Int32((tiles_mnl[0] + cm - 1) // cm), Int32((tiles_mnl[1] + cn - 1) // cn), cluster_shape_mn, raster_group,
        along, serpentine,
    )


def grid_shape(params: RasterParams, max_active_clusters: int, stream_k_blocks=None):
    """The persistent grid, the same for both schedulers: (cluster_m, cluster_n, clusters), with
    one cluster per output tile cluster at most (a problem of 8 tiles launches 8 CTAs).

    Stream-K (``stream_k_blocks``: the K blocks of one tile) fills the whole grid even when there
    are fewer tile clusters than it holds: their K blocks are then shared by every cluster, but
    never by more clusters than there are K blocks, so that every cluster has work. The host
    sizes the workspace by the same rule (``stream_k_grid``)."""
    tiles = params.clusters_m * params.clusters_n
    if cutlass.const_expr(stream_k_blocks is None):
        clusters = cutlass.min(tiles, Int32(max_active_clusters))
    else:
        clusters = cutlass.min(tiles * cutlass.max(stream_k_blocks, 1), Int32(max_active_clusters))
    return (*params.cluster_shape_mn, clusters)


def stream_k_grid(tile_clusters: int, k_blocks: int, max_active_clusters: int) -> int:
    """Host side: the clusters a stream-K launch runs (grid_shape's rule)."""
    return min(tile_clusters * max(1, k_blocks), max_active_clusters)


@cute.jit
def work_at(params: RasterParams, linear_idx: Int32, cta_in_cluster=(0, 0)):
    """The output tile of cluster-linear index `linear_idx`, as a WorkTileInfo (tile_idx (m, n, 0),
    is_valid_tile = index < number of clusters).

    Grouped rasterization without padding: the cluster columns (`along="n"`; rows with "m") are
    cut into groups of `params.group`; inside a group the index walks the group's columns fastest,
    then down M (rows fastest, then across N), so the clusters that run at the same time share A
    row blocks and B column blocks in L2. When the count is not a multiple of the group, the last
    group is simply narrower: every index below clusters_m * clusters_n is a real tile (the DSL's
    own grouped scheduler rounds the columns up instead, and runs the padding indices as fully
    out-of-bounds tiles: 14% extra at N = 7168 with 256-wide tiles). With `serpentine`, odd
    groups walk the long side from its far end.
    """
    g = params.group
    mc = params.clusters_m
    nc = params.clusters_n
    fast = nc
    slow = mc
    if cutlass.const_expr(params.along == "m"):
        fast = mc
        slow = nc
    full = (fast // g) * g
    split = slow * full  # indices below this fall in full-width groups
    width = Int32(g)
    first = Int32(0)
    group_idx = linear_idx // (slow * g)
    r = linear_idx
    if linear_idx < split:
        first = group_idx * g
        r = linear_idx % (slow * g)
    else:
        # The narrow last group; max(., 1) keeps the (unused) division defined when there is none.
        width = cutlass.max(fast - full, Int32(1))
        first = full
        r = linear_idx - split
        group_idx = fast // g
    along_slow = r // width
    if cutlass.const_expr(params.serpentine):
        if group_idx % 2 == 1:
            along_slow = slow - 1 - along_slow
    along_fast = first + r % width
    m_cluster = along_slow
    n_cluster = along_fast
    if cutlass.const_expr(params.along == "m"):
        m_cluster = along_fast
        n_cluster = along_slow
    cm, cn = params.cluster_shape_mn
    m = m_cluster * cm + cta_in_cluster[0]
    n = n_cluster * cn + cta_in_cluster[1]
    valid = linear_idx < mc * nc
    return utils.WorkTileInfo(
        (cute.arch.make_warp_uniform(m), cute.arch.make_warp_uniform(n), Int32(0)),
        cute.arch.make_warp_uniform(valid),
    )


class StaticScheduler:
    """CTA (cluster) c walks indices c, c + clusters, c + 2 * clusters, ... of `work_at`."""

    def __init__(self, params: RasterParams, idx, stride, cta_m, cta_n):
        self.params = params
        self._idx = idx
        self._stride = stride
        self._cta = (cta_m, cta_n)

    def __extract_mlir_values__(self):
        vals = [self._idx, self._stride, *self._cta]
        return [v for x in vals for v in extract_mlir_values(x)] + extract_mlir_values(self.params)

    def __new_from_mlir_values__(self, values):
        idx, stride, cta_m, cta_n = (new_from_mlir_values(x, [v]) for x, v in zip(
            (self._idx, self._stride, *self._cta), values[:4]))
        return StaticScheduler(new_from_mlir_values(self.params, values[4:]), idx, stride, cta_m, cta_n)

    @cute.jit
    def get_current_work(self):
        return work_at(self.params, self._idx, self._cta)

    @cute.jit
    def initial_work_tile_info(self):
        return self.get_current_work()

    @cute.jit
    def advance_to_next_work(self, advance_count: int = 1):
        self._idx += Int32(advance_count) * self._stride


@cute.jit
def create(params: RasterParams):
    """Device side: this CTA's static scheduler, positioned at its first tile."""
    bidx, bidy, bidz = cute.arch.block_idx()
    cm, cn = params.cluster_shape_mn
    return StaticScheduler(
        params, Int32(bidz), Int32(cute.arch.grid_dim()[2]), Int32(bidx % cm), Int32(bidy % cn)
    )


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
        self._publish()
        return self.get_current_work()

    @cute.jit
    def advance_to_next_work(self):
        self._idx = self._claim()
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


# ---- Stream-K (config.stream_k) ------------------------------------------------------------------
#
# With T output tile clusters on G resident clusters, T // G full waves leave R = T % G tiles for a
# last wave that would keep only R of the G clusters busy. Stream-K runs the full waves as whole
# tiles (cluster c takes indices c, c + G, ... below the last full wave's end) and lays the last R
# tiles' K blocks end to end, R * k_tiles "iterations", cut into G near-equal contiguous segments,
# one per cluster. A segment crosses at most a few tile boundaries; each piece of it is a K range
# of one tile. The cluster whose segment holds a tile's first K block owns that tile: it adds the
# other pieces' partial sums to its accumulators, in cluster order (so the result is the same bits
# every run), and runs the epilogue. Any other piece is a contributor: the first piece of its
# segment, which it computes before anything it owns, so a cluster never waits on one that is
# waiting itself, and every cluster is resident (the grid is persistent), so the owner's spin ends.
#
# Workspace (one int32 tensor per launch, the kernel's mCounter): R * cluster_size flags, zeroed
# by the host and padded to STREAM_K_FLAG_ALIGN words, then one fp32 partial-sum slot of
# tile_m * tile_n per CTA of the grid. A contributor writes its slot, then adds its K-block count
# to the tile's flag (release); the owner waits until the flag holds every K block it did not
# compute (acquire), then reads the slots.

STREAM_K_FLAG_ALIGN = 32  # flag words before the partial sums: keeps those 128-byte aligned


def stream_k_workspace_words(clusters: int, grid: int, cluster_size: int, tile_elems: int) -> int:
    """Host side: the int32 words a launch's workspace needs (1 when there is no partial wave)."""
    rem = clusters - (clusters // grid) * grid
    if rem == 0:
        return 1
    return stream_k_flag_words(rem, cluster_size) + grid * cluster_size * tile_elems


def stream_k_flag_words(rem, cluster_size):
    """Flag words before the partial sums (host ints or device Int32s alike)."""
    align = STREAM_K_FLAG_ALIGN
    return (rem * cluster_size + align - 1) // align * align


@cute.jit
def stream_k_plan(params: RasterParams, k_tiles: Int32):
    """Device side: (end of the whole-tile indices, K iterations shared by stream-K, grid)."""
    total = params.clusters_m * params.clusters_n
    grid = Int32(cute.arch.grid_dim()[2])
    dp_end = (total // grid) * grid
    return dp_end, (total - dp_end) * k_tiles, grid


@cute.jit
def stream_k_segment(c: Int32, grid: Int32, sk_iters: Int32):
    """[start, end) of cluster c's share of the stream-K iterations."""
    return (c * sk_iters) // grid, ((c + Int32(1)) * sk_iters) // grid


def stream_k_clusters_starting_before(it, grid, sk_iters):
    """How many clusters' segments start before iteration ``it`` (host ints or device Int32s
    alike): cluster c's starts at floor(c * sk_iters / grid), which is below it exactly when
    c < it * grid / sk_iters. A tile's owner reads the slots of the clusters after it up to
    this count at the tile's end, not the whole grid: the later ones start past its tile."""
    return (it * grid + sk_iters - 1) // sk_iters


@cute.jit
def cta_in_cluster(params: RasterParams):
    """This CTA's (m, n) position inside its cluster, as the static scheduler takes it."""
    bidx, bidy, _ = cute.arch.block_idx()
    cm, cn = params.cluster_shape_mn
    return Int32(bidx % cm), Int32(bidy % cn)
