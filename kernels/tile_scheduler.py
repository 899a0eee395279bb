"""Persistent tile scheduling for the sm90 GEMM.

The grid has one CTA (cluster) per SM at most; each CTA walks the output tiles with a stride of
the grid size. The order is the grouped ("swizzled") rasterization of the installed CuTe DSL
scheduler: clusters are taken `raster_group` columns at a time, walking down M inside a group,
so the A and B tiles that neighbouring SMs load at the same time overlap and stay in L2.
The producer warp and the consumer warpgroups each own a scheduler and advance them in lock
step, so they agree on the tile sequence without talking to each other.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils


def make_params(m_tiles_shape, cluster_shape_mn, raster_group: int):
    """Host side: scheduler parameters for a grid of (tiles_m, tiles_n, 1) output tiles."""
    return utils.PersistentTileSchedulerParams(
        m_tiles_shape, (*cluster_shape_mn, 1), raster_group, True
    )


def grid_shape(params, max_active_clusters: int):
    return utils.StaticPersistentTileScheduler.get_grid_shape(params, max_active_clusters)


@cute.jit
def create(params):
    """Device side: this CTA's scheduler, positioned at its first tile."""
    return utils.StaticPersistentTileScheduler.create(
        params, cute.arch.block_idx(), cute.arch.grid_dim()
    )
