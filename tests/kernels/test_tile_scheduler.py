"""The persistent tile scheduler's walk (kernels/tile_scheduler.py), run on the CPU.

Host code compiled by the DSL (no GPU) calls the kernel's own `work_at` for every
cluster-linear index of a grid of output tiles and writes down the tile it names; the test
requires every tile cluster named once by the valid indices and by nothing else, each CTA of a
cluster on its own tile, the walk inside a group along its fast side first, and, serpentine,
each group starting where the one before it ended. The GPU test of the same property
(test_ops_gpu.py, `test_rasterization_covers_every_tile_once`) checks the kernel's outputs; this
one runs in CI. `cute.arch.make_warp_uniform`, a device intrinsic, is the identity here.
"""

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

import torch  # noqa: E402

# tile grids (tiles_m, tiles_n): one tile, odd counts around the groups, wider than tall
GRIDS = [(1, 1), (5, 1), (5, 7), (4, 29), (9, 8), (17, 3)]


@pytest.fixture(scope="module")
def walk():
    """walk(cluster, group, along, serpentine, tiles, cta) -> [(m, n, valid) per index], for
    indices 0 .. clusters + 4 (four past the end)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.runtime import from_dlpack

    from parallel_mlp.kernels import tile_scheduler

    compiled = {}

    def build(cluster, group, along, serpentine):
        @cute.jit
        def probe(out: cute.Tensor, tiles_m: Int32, tiles_n: Int32, count: Int32, cta_m: Int32, cta_n: Int32):
            params = tile_scheduler.make_params((tiles_m, tiles_n, 1), cluster, group, along, serpentine)
            for i in cutlass.range(count, unroll=1):
                work = tile_scheduler.work_at(params, i, (cta_m, cta_n))
                out[i, 0] = work.tile_idx[0]
                out[i, 1] = work.tile_idx[1]
                out[i, 2] = Int32(work.is_valid_tile)

        return probe

    def run(cluster, group, along, serpentine, tiles, cta):
        cm, cn = cluster
        clusters = -(-tiles[0] // cm) * -(-tiles[1] // cn)
        out = torch.zeros(clusters + 4, 3, dtype=torch.int32)
        args = (from_dlpack(out), tiles[0], tiles[1], clusters + 4, *cta)
        key = (cluster, group, along, serpentine)
        if key not in compiled:
            compiled[key] = cute.compile(build(*key), *args, options="--gpu-arch sm_90a")
        compiled[key](*args)
        return [tuple(row) for row in out.tolist()]

    saved = cute.arch.make_warp_uniform
    cute.arch.make_warp_uniform = lambda value, **kw: value  # a device intrinsic; host code has one thread
    try:
        yield run
    finally:
        cute.arch.make_warp_uniform = saved


@pytest.mark.parametrize("serpentine", [False, True])
@pytest.mark.parametrize("along", ["n", "m"])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("cluster", [(1, 1), (2, 1), (1, 2)])
def test_every_tile_cluster_is_named_once_in_group_order(walk, cluster, group, along, serpentine):
    cm, cn = cluster
    for tiles in GRIDS:
        mc, nc = -(-tiles[0] // cm), -(-tiles[1] // cn)
        fast, slow = (nc, mc) if along == "n" else (mc, nc)
        for cta in {(0, 0), (cm - 1, cn - 1)}:
            named = walk(cluster, group, along, serpentine, tiles, cta)
            what = f"tiles {tiles} cluster {cluster} group {group} along {along} serpentine {serpentine} cta {cta}"
            assert all(v == 1 for _, _, v in named[:mc * nc]) and all(v == 0 for _, _, v in named[mc * nc:]), what
            valid = named[:mc * nc]
            # each CTA takes its own tile of the cluster
            assert all(m % cm == cta[0] and n % cn == cta[1] for m, n, _ in valid), what
            clusters = [(m // cm, n // cn) for m, n, _ in valid]
            assert sorted(clusters) == [(i, j) for i in range(mc) for j in range(nc)], what
            # (slow, fast) position of each index, and its group: fast // group
            pos = [(c[0], c[1]) if along == "n" else (c[1], c[0]) for c in clusters]
            groups = [f // group for _, f in pos]
            assert groups == sorted(groups), what  # a group at a time
            for g in sorted(set(groups)):
                run = [p for p, k in zip(pos, groups) if k == g]
                width = min(group, fast - g * group)
                assert len(run) == slow * width, what
                # the fast side first: `width` consecutive indices per slow position
                slows = [s for s, _ in run]
                assert all(slows[i] == slows[i - i % width] for i in range(len(slows))), what
                order = [slows[i] for i in range(0, len(slows), width)]
                forward = list(range(slow))
                assert order == (forward[::-1] if serpentine and g % 2 else forward), what


def test_the_grid_never_holds_more_clusters_than_tiles():
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.runtime import from_dlpack

    from parallel_mlp.kernels import tile_scheduler

    @cute.jit
    def probe(out: cute.Tensor, tiles_m: Int32, tiles_n: Int32, k_blocks: Int32):
        params = tile_scheduler.make_params((tiles_m, tiles_n, 1), (2, 1), 8)
        out[0] = tile_scheduler.grid_shape(params, 66)[2]
        out[1] = tile_scheduler.grid_shape(params, 66, k_blocks)[2]

    out = torch.zeros(2, dtype=torch.int32)
    fn = cute.compile(probe, from_dlpack(out), 1, 1, 1, options="--gpu-arch sm_90a")
    for tiles_m, tiles_n, k_blocks in ((1, 1, 1), (3, 5, 4), (40, 40, 64), (9, 2, 100), (1, 3, 2)):
        fn(from_dlpack(out), tiles_m, tiles_n, k_blocks)
        clusters = -(-tiles_m // 2) * tiles_n
        assert out[0] == min(clusters, 66)
        # stream-K: the whole grid, but never more clusters than K blocks in all
        assert out[1] == tile_scheduler.stream_k_grid(clusters, k_blocks, 66) == min(clusters * k_blocks, 66)
