"""The tile-scheduler option of GemmConfig: validation and the compiled-kernel cache key (CPU)."""

import dataclasses

import pytest

from parallel_mlp.kernels.compile import KernelKey, _export_name
from parallel_mlp.kernels.config import GemmConfig
from parallel_mlp.kernels.epilogue_spec import EpilogueSpec


def test_static_is_the_default_and_keeps_its_key():
    cfg = GemmConfig()
    assert cfg.scheduler == "static"
    # Unchanged from before the option existed, so the static kernels' names stay the same.
    assert cfg.key == "t128x256_c1x1_g8_sm132"


def test_dynamic_and_static_never_share_a_kernel():
    spec = EpilogueSpec("store")
    static = KernelKey(spec, GemmConfig(), "bfloat16", "row", "row", "bfloat16")
    dynamic = KernelKey(spec, GemmConfig(scheduler="dynamic"), "bfloat16", "row", "row", "bfloat16")
    assert static != dynamic and dynamic not in {static: None}  # in-memory cache
    assert static.name != dynamic.name and "dynamic" in dynamic.name
    assert _export_name(static) != _export_name(dynamic)  # on-disk cache


def test_scheduler_validation():
    with pytest.raises(ValueError, match="scheduler"):
        GemmConfig(scheduler="round_robin")
    with pytest.raises(ValueError, match="1x1 clusters"):
        GemmConfig(cluster_m=2, scheduler="dynamic")
    GemmConfig(128, 128, scheduler="dynamic")  # any tile with a 1x1 cluster is fine


def test_cluster_validation():
    GemmConfig(cluster_m=2)  # 2x1 and 1x2 are the clusters a persistent grid can fill
    GemmConfig(cluster_n=2)
    with pytest.raises(ValueError, match=r"cluster=\(2,2\): at most 2 CTAs per cluster"):
        GemmConfig(cluster_m=2, cluster_n=2)
    with pytest.raises(ValueError, match=r"cluster=\(4,1\): each 1 or 2"):
        GemmConfig(cluster_m=4)


def test_tile256_validation():
    GemmConfig(256, 128, 1, 2)  # cooperative, 128 x 128 accumulators per warpgroup
    with pytest.raises(ValueError, match=r"256-row tile is cooperative with tile_n <= 128"):
        GemmConfig(256, 256)
    with pytest.raises(ValueError, match=r"256-row tile is cooperative"):
        GemmConfig(256, 128, consumers="pingpong")
    with pytest.raises(ValueError, match="tile_m=512: must be 64, 128, 192 or 256"):
        GemmConfig(512, 128)


def test_narrow_tile_validation():
    GemmConfig(128, 160, consumers="pingpong")  # 160 accumulators per thread, 5 subtiles of 32
    with pytest.raises(ValueError, match=r"tile_n=176: must be one of \(64, 128, 160, 192, 256\)"):
        GemmConfig(128, 176, consumers="pingpong", epi_n=16)


def test_stream_k_validation():
    assert GemmConfig(stream_k=True).key.endswith("_sk") and "_sk" not in GemmConfig().key
    with pytest.raises(ValueError, match="stream-K needs consumers='cooperative' and scheduler='static'"):
        GemmConfig(128, 128, consumers="pingpong", stream_k=True)
    with pytest.raises(ValueError, match="stream-K needs consumers='cooperative' and scheduler='static'"):
        GemmConfig(scheduler="dynamic", stream_k=True)
    with pytest.raises(ValueError, match="stream_k=True with tile_m=256: stream-K tiles have at most 128 rows"):
        GemmConfig(256, 128, stream_k=True)


def test_stream_k_workspace_size():
    """Flags for the partial wave's CTA tiles (zeroed, padded to 32 words), then one fp32 slot of
    tile_m x tile_n per CTA of the grid; a single word when the waves are all full."""
    import torch

    from parallel_mlp.kernels.ops import _stream_k_workspace

    cpu = torch.device("cpu")
    # fc2 at h=7168 on 132 SMs: 32 x 16 clusters of 2 on 66: 7 full waves, 50 left over
    cfg = GemmConfig(128, 256, 2, 1, 16, stream_k=True)
    ws = _stream_k_workspace(8192, 4096, 7168, cfg, cpu)
    assert ws.dtype == torch.int32 and ws.numel() == 128 + 132 * 128 * 256
    assert (ws[:128] == 0).all()
    # 33 x 2 clusters on 66: whole waves only
    assert _stream_k_workspace(8448, 512, 4096, cfg, cpu).numel() == 1
    # 4 x 2 clusters, fewer than the grid's 66: every cluster of the grid shares their K blocks
    # (64 each at K = 4096), so 16 CTA flags (padded to 32) and 132 slots
    assert _stream_k_workspace(1024, 512, 4096, cfg, cpu).numel() == 32 + 132 * 128 * 256
    # ... but never more clusters than K blocks: 8 x 3 = 24 clusters at K = 192
    assert _stream_k_workspace(1024, 512, 192, cfg, cpu).numel() == 32 + 48 * 128 * 256
    # one K block: each tile is one piece, whole tiles on 8 clusters
    assert _stream_k_workspace(1024, 512, 64, cfg, cpu).numel() == 1


@pytest.mark.parametrize("tiles,k_blocks,grid", [
    ((20, 20), 112, 132),  # a partial last wave: the whole grid
    ((8, 8), 1024, 132),   # 64 tiles of K = 65536 (the wgrads at T=65536 d=1024): the whole grid
    ((4, 2), 3, 24),       # never more clusters than K blocks, so that each has work
    ((4, 2), 1, 8), ((4, 2), 0, 8),
])
def test_the_kernels_stream_k_grid_is_the_one_the_host_sizes_its_workspace_for(tiles, k_blocks, grid):
    pytest.importorskip("cutlass")
    from parallel_mlp.kernels.tile_scheduler import grid_shape, make_params, stream_k_grid

    params = make_params((*tiles, 1), (1, 1), 8)
    assert int(grid_shape(params, 132, k_blocks)[2]) == stream_k_grid(tiles[0] * tiles[1], k_blocks, 132) == grid
    # whole tiles: one cluster per tile cluster at most
    assert int(grid_shape(params, 132)[2]) == min(tiles[0] * tiles[1], 132)


def test_the_default_shares_a_long_k_over_the_whole_grid_when_tiles_are_fewer_than_sms():
    """The wgrads at T=65536, d=1024, h=1024: 64 tiles of 128x128 on 132 SMs. At K >= 32768 the
    default is stream-K over the whole grid in 128x256 tiles, 2x1 clusters; at a short K (fc2 and
    dx at T=512, d=1024: 32 tiles, K = 2816 and 5632) whole 128x64 tiles, twice the CTAs; the
    dact keeps whole 128x128 tiles."""
    from parallel_mlp.kernels.config import UNDERFILLED_STREAM_K_MIN_K, cluster_waves, default_config

    for kind in ("store", "accumulate"):
        cfg = default_config(1024, 1024, 65536, kind=kind)
        assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.stream_k) == (128, 256, 2, True), kind
        assert cluster_waves(cfg, 1024, 1024) == (0, 16, 66)
    assert default_config(2048, 704, 65536, kind="accumulate").stream_k
    # fewer rows than PAIR_MIN_ROWS: the same in 1x1 clusters (one tile row leaves a pair's
    # second CTA nothing to compute)
    for n in (1024, 4096):  # 4 and 16 tiles, split 33 and 8.25 ways
        few_rows = default_config(100, n, 65536, kind="accumulate")
        assert (few_rows.tile_n, few_rows.cluster_m, few_rows.stream_k) == (256, 1, True)
    # just below the threshold, and the short-K GEMMs of a 512-token step: whole tiles
    assert not default_config(1024, 1024, UNDERFILLED_STREAM_K_MIN_K - 64, kind="accumulate").stream_k
    for k in (2816, 5632):
        for kind in ("store", "act", "accumulate"):
            cfg = default_config(512, 1024, k, kind=kind)
            assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.stream_k) == (128, 64, 1, False), (k, kind)
    dact = default_config(1024, 1024, 65536, kind="dact")
    assert (dact.tile_n, dact.stream_k) == (128, False)
    assert default_config(512, 2816, 1024, kind="dact").tile_n == 128
    # enough 128x128 tiles for a wave: the under-filled rule does not apply (the last-wave rule may)
    assert default_config(1408, 2048, 65536, kind="accumulate").tile_n == 128


def test_the_default_pairs_ctas_from_1000_rows():
    """128x256 cooperative tiles run in 2x1 clusters from PAIR_MIN_ROWS rows up (fc2 and dx at
    T=1000, d=5120, h=10240), in 1x1 below."""
    from parallel_mlp.kernels.config import PAIR_MIN_ROWS, cluster_rows, default_config

    assert PAIR_MIN_ROWS == 1000
    assert (cluster_rows(PAIR_MIN_ROWS), cluster_rows(PAIR_MIN_ROWS - 1)) == (2, 1)
    # under one wave of tiles, pairs below PAIR_MIN_ROWS too where the 128-row tiles pair up
    assert (cluster_rows(512, one_wave=True), cluster_rows(640, one_wave=True), cluster_rows(512)) == (2, 1, 1)
    cfg = default_config(1000, 5120, 10240)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.stream_k) == (128, 256, 2, True)
    small = default_config(999, 5120, 10240)
    assert (small.tile_n, small.cluster_m) == (256, 1)


def test_stream_k_where_the_last_wave_is_light():
    """default_config turns stream-K on where whole tiles would idle >= 5% of the time in the
    last wave and K >= 4096, for store, act and accumulate alike (recompute's plain replay of fc1 must round
    the same sums as the forward's act), never for the dact or a pingpong config."""
    from parallel_mlp.kernels.config import STREAM_K_MIN_K, STREAM_K_MIN_WASTE, default_config, with_stream_k

    # fc2 / dx at T=2304: 9 x 16 clusters of 2 on 66: 2 full waves and 12 of 66 busy in the third
    for kind in ("store", "act", "accumulate"):
        assert default_config(2304, 4096, 14336, kind=kind).stream_k, kind
    assert default_config(4352, 4096, 28672).stream_k  # 4 waves + 8 of 66: 17.6% idle
    # The MLP at T=8192: 7 full waves + 50 of 66 (3% idle), the wgrads alike: whole tiles
    for m, n, k in ((8192, 4096, 14336), (8192, 4096, 28672), (4096, 14336, 8192), (28672, 4096, 8192)):
        assert not default_config(m, n, k, kind="accumulate" if k == 8192 else "store").stream_k, (m, n, k)
    # whole waves only (8 x 33 clusters = 4 x 66), and pingpong / dact configs
    assert not default_config(2048, 8448, 8192).stream_k
    assert not default_config(2304, 4096, 14336, kind="dact").stream_k
    pp = GemmConfig(128, 192, 2, 1, 16, consumers="pingpong")
    assert with_stream_k(pp, 2304, 4096, 14336, "store") == pp
    # the rule itself: 2 + 12/66 waves leave (1 - 12/66) / 3 = 27% idle
    cfg = GemmConfig(128, 256, 2, 1, 16)
    assert with_stream_k(cfg, 2304, 4096, 14336, "store").stream_k and (1 - 12 / 66) / 3 >= STREAM_K_MIN_WASTE
    # but not at short K, where the partial sums' traffic is a large share of a tile's
    assert not with_stream_k(cfg, 2304, 4096, STREAM_K_MIN_K - 64, "store").stream_k


def test_a_row_block_runs_the_whole_gemms_tiles_without_its_stream_k_unless_it_is_the_whole(monkeypatch):
    """The overlap's row blocks take the whole GEMM's config minus stream-K (sized for the whole
    grid); a single block covering every row is the whole GEMM and keeps its stream-K."""
    import torch

    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import default_config
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda index: 132)
    spec = EpilogueSpec("store")
    m, n, k = 2304, 4096, 14336  # fc2 at T=2304: stream-K by default
    whole = default_config(m, n, k, 132, "store")
    assert whole.stream_k
    bk = torch.empty(n, k, dtype=torch.bfloat16)
    block = ops._pick_config(spec, torch.empty(m // 2, k, dtype=torch.bfloat16), bk, torch.bfloat16,
                             None, False, whole_rows=m)
    assert block == dataclasses.replace(whole, stream_k=False)
    alone = ops._pick_config(spec, torch.empty(m, k, dtype=torch.bfloat16), bk, torch.bfloat16,
                             None, False, whole_rows=m)
    assert alone == whole


def test_the_layers_stream_k_gpu_shapes_run_stream_k():
    """tests/test_layer_gpu.py checks every gradient at two shapes because their default configs
    run stream-K: the wgrads at T=65536 d=1024 h=1024 (an under-filled grid) and fc2 and dx at
    T=2304 d=4096 h=7168 (a split last wave). That premise, on a 132-SM H200."""
    from parallel_mlp.kernels.config import default_config

    T, d, h = 65536, 1024, 1024
    assert default_config(d, h, T, num_sms=132, kind="accumulate").stream_k  # dW2
    assert default_config(h, d, T, num_sms=132, kind="accumulate").stream_k  # dW1 (gelu: h rows)
    T, d, h = 2304, 4096, 7168
    assert default_config(T, d, h, num_sms=132, kind="store").stream_k  # fc2
    assert default_config(T, d, 2 * h, num_sms=132, kind="store").stream_k  # dx (swiglu: 2h)


def _owner_slots(grid, tiles, k_tiles, bound):
    """For each stream-K tile, the clusters whose slots its owner adds, in order, as the kernel's
    owner loop picks them (stream_k_segment, tile_scheduler) with the loop's upper end `bound`."""
    sk = tiles * k_tiles
    seg = [((c * sk) // grid, ((c + 1) * sk) // grid) for c in range(grid)]
    added = {}
    for c, (it, end) in enumerate(seg):
        while it < end:
            t, k0 = divmod(it, k_tiles)
            if k0 == 0:  # the owner piece of tile t
                tile_end = (t + 1) * k_tiles
                added[t] = [c2 for c2 in range(c + 1, bound(tile_end, grid, sk))
                            if seg[c2][0] < tile_end and seg[c2][1] > seg[c2][0]]
                own = min(end, tile_end) - it
                got = sum(min(seg[c2][1], tile_end) - seg[c2][0] for c2 in added[t])
                assert own + got == k_tiles, (grid, tiles, k_tiles, t)
            it = (it // k_tiles + 1) * k_tiles
    return added


@pytest.mark.parametrize("grid", [1, 2, 7, 66, 128, 132])
def test_a_stream_k_owner_reads_the_slots_of_every_later_cluster_that_starts_in_its_tile(grid):
    """The owner's loop runs over the clusters after it up to stream_k_clusters_starting_before
    its tile's end, not the whole grid: the same slots in the same order (so the same bits),
    each tile's K blocks covered exactly once, over grids, tile counts and K lengths that give
    1 to 132 pieces per tile."""
    from parallel_mlp.kernels.tile_scheduler import stream_k_clusters_starting_before

    def whole(tile_end, g, sk):
        return g

    def reach(tile_end, g, sk):
        return min(g, stream_k_clusters_starting_before(tile_end, g, sk))

    for tiles in range(1, min(grid, 40) + 1):
        for k_tiles in (1, 2, 3, 5, 11, 44, 64, 97, 1024):
            if tiles * k_tiles < grid:
                continue  # the kernel never runs more clusters than K blocks
            assert _owner_slots(grid, tiles, k_tiles, reach) == _owner_slots(grid, tiles, k_tiles, whole)
            # nothing past the bound starts before the tile's end
            sk = tiles * k_tiles
            for t in range(tiles):
                e = (t + 1) * k_tiles
                r = stream_k_clusters_starting_before(e, grid, sk)
                assert r >= grid or (r * sk) // grid >= e
                assert r == 0 or ((r - 1) * sk) // grid < e


def _picked(m, n, k, kind):
    """The default config's tile, cluster rows, schedule and stream-K for a GEMM on 132 SMs."""
    from parallel_mlp.kernels.config import default_config

    c = default_config(m, n, k, 132, kind)
    return c.tile_m, c.tile_n, c.cluster_m, c.consumers, c.stream_k


def test_gemms_below_two_wide_waves_take_128x192_where_it_runs_fewer_waves():
    """with_fewer_waves: the default's cooperative 128x128 tiles (whole or stream-K) and whole
    128x256 tiles become whole 128x192 tiles, in the same clusters, where those need at most
    WIDE_WAVES_MAX_SHARE of the columns of tile time; stream-K 128x256, big GEMMs and K from
    UNDERFILLED_STREAM_K_MIN_K keep their config. The GEMMs timed for the rule, on 132 SMs."""
    from parallel_mlp.kernels.config import (
        UNDERFILLED_STREAM_K_MIN_K,
        WIDE_WAVES_MAX_SHARE,
        wave_columns,
        with_fewer_waves,
    )

    wide_1x1 = (128, 192, 1, "cooperative", False)
    # T=512 d=1024 swiglu: fc1 (act and the recompute's plain replay alike), dW2; dW1 in 2x1 pairs
    for kind in ("act", "store"):
        assert _picked(512, 5632, 1024, kind) == wide_1x1, kind
    assert _picked(1024, 2816, 512, "accumulate") == wide_1x1
    assert _picked(5632, 1024, 512, "accumulate") == (128, 192, 2, "cooperative", False)
    # T=512 d=8192 fc1 and T=8192 d=1024 dW2: from stream-K 128x128 to whole 128x192
    assert _picked(512, 5504, 8192, "act") == wide_1x1
    assert _picked(1024, 2816, 8192, "accumulate") == wide_1x1
    # T=2048 d=2048 swiglu: the dact and dW2, from whole 128x256 in 2x1 clusters
    assert _picked(2048, 2816, 2048, "dact") == (128, 192, 2, "cooperative", False)
    assert _picked(2048, 2816, 2048, "accumulate") == (128, 192, 2, "cooperative", False)
    # stream-K 128x256 stays: T=8192 d=1024 dW1, T=1000 d=5120 fc2 and dx
    assert _picked(5632, 1024, 8192, "accumulate") == (128, 256, 2, "cooperative", True)
    assert _picked(1000, 5120, 10240, "store") == (128, 256, 2, "cooperative", True)
    # one wave of 128x128 already (the dact at T=512 d=1024), and 192 no fewer waves (fc2 at
    # T=512 d=8192: 172 tiles of 192 against 128 of 256 in one wave, the one-wave rule's)
    assert _picked(512, 2816, 1024, "dact")[1] == 128
    assert _picked(512, 8192, 2752, "store")[1] == 256
    # the wgrads at T=65536: not timed there, the long-K stream-K rules stay
    assert _picked(1408, 2048, 65536, "accumulate")[1] == 128
    # the rule itself, on the T=512 fc1: 2 waves of 128 columns against 1 of 192
    cfg = GemmConfig(128, 128, 1, 1, 8, 132)
    assert wave_columns(cfg, 512, 5632) == 256
    assert wave_columns(dataclasses.replace(cfg, tile_n=192), 512, 5632) == 192 <= WIDE_WAVES_MAX_SHARE * 256
    assert with_fewer_waves(cfg, 512, 5632, UNDERFILLED_STREAM_K_MIN_K) == cfg


def test_gemms_just_under_one_wave_of_128x256_take_whole_128x256_tiles():
    """ONE_WAVE_MIN_FILL: below one wave of 128x256 tiles but at least that share of it, whole
    128x256 tiles (2x1 where the tile rows pair up) instead of two waves of 128x128, for every kind
    but the dact and below UNDERFILLED_STREAM_K_MIN_K. The GEMMs timed for the rule, on 132 SMs:
    128 tiles of 128x256 each."""
    from parallel_mlp.kernels.config import ONE_WAVE_MIN_FILL, UNDERFILLED_STREAM_K_MIN_K

    whole_256 = (128, 256, 2, "cooperative", False)
    # fc2 and dx at T=2048 d=2048 swiglu, T=1000 d=4096 swiglu and T=4096 d=1024 gelu, whose
    # wgrads too; fc1 + act decides as its plain replay does
    for m, n, k in [(2048, 2048, 2816), (2048, 2048, 5632), (1000, 4096, 11008), (1000, 4096, 22016),
                    (4096, 1024, 4096)]:
        assert _picked(m, n, k, "store") == whole_256, (m, n, k)
        assert _picked(m, n, k, "act") == whole_256, (m, n, k)
    assert _picked(1024, 4096, 4096, "accumulate") == whole_256
    assert _picked(4096, 1024, 4096, "accumulate") == whole_256
    # fewer rows than PAIR_MIN_ROWS: 2x1 all the same where the tile rows pair up (T=512 d=8192,
    # 4 x 32 tiles), 1x1 where an odd one would pad a cluster (5 x 24 tiles)
    assert _picked(512, 8192, 2752, "store") == whole_256
    assert _picked(512, 8192, 5504, "act") == whole_256
    assert _picked(5 * 128 - 8, 24 * 256 - 8, 1000, "store") == (128, 256, 1, "cooperative", False)
    # the dact keeps 128x128; so does a K from UNDERFILLED_STREAM_K_MIN_K
    assert _picked(2048, 2048, 2816, "dact")[1] == 128
    assert _picked(1000, 4096, UNDERFILLED_STREAM_K_MIN_K, "store")[1] == 128
    # the threshold: 128 and 119 of 132 SMs' tiles (0.97, 0.90) take 256; 112 (0.85) keeps 128,
    # whose 224 tiles then run two waves all the same
    assert 119 / 132 >= ONE_WAVE_MIN_FILL > 112 / 132
    assert _picked(7 * 128, 17 * 256, 4096, "store")[1] == 256
    assert _picked(7 * 128, 16 * 256, 4096, "store")[1] == 128


def test_stream_k_128x256_takes_whole_128x128_tiles_where_256_columns_pad_n_much_more():
    """with_narrow_whole_tiles: below two waves of 128x256 tiles (not big), stream-K 128x256
    becomes whole 128x128 tiles in the same clusters where 256 columns pad N by more than
    STREAM_K_WIDE_MAX_PAD times 128's padding, for every epilogue kind alike (fc1 and its
    recompute replay round the same sums); other N and big GEMMs keep their config. The GEMMs
    timed for the rule, and the sweep's stream-K wgrads it leaves alone, on 132 SMs."""
    from parallel_mlp.kernels.config import (
        STREAM_K_WIDE_MAX_PAD,
        pads_much_more,
        with_narrow_whole_tiles,
    )

    narrow = (128, 128, 2, "cooperative", False)
    # dW2 += at T=8192 and 16384, d=4096 swiglu h=1376: 1536 padded columns against 1408
    assert 1536 > STREAM_K_WIDE_MAX_PAD * 1408
    assert pads_much_more(1376, 256, STREAM_K_WIDE_MAX_PAD)
    # 704 and 1024 pad to 768 and 1024 either way; 5504 to 5632 against 5504 (1.023)
    assert not any(pads_much_more(n, 256, STREAM_K_WIDE_MAX_PAD) for n in (704, 1024, 5504))
    assert _picked(4096, 1376, 8192, "accumulate") == narrow
    assert _picked(4096, 1376, 16384, "accumulate") == narrow
    # fc1 at T=4096 d=4096 swiglu h=688: act, the recompute's plain replay and a dact alike
    for kind in ("act", "store"):
        assert _picked(4096, 1376, 4096, kind) == narrow, kind
    # N padded alike by either width: stream-K 128x256 stays (T=65536 d=2048 h=704 dW2, T=8192
    # d=1024 dW1, T=1000 d=5120 fc2)
    assert _picked(2048, 704, 65536, "accumulate") == (128, 256, 2, "cooperative", True)
    assert _picked(5632, 1024, 8192, "accumulate") == (128, 256, 2, "cooperative", True)
    assert _picked(1000, 5120, 10240, "store") == (128, 256, 2, "cooperative", True)
    # big GEMMs are not this rule's: dW2 at h=5504 (1.023 of 128's padding) keeps its config
    assert _picked(4096, 5504, 8192, "accumulate")[1:] == (256, 2, "cooperative", True)
    # whole tiles and other widths pass through
    whole = GemmConfig(128, 256, 2, 1, 8, 132)
    assert with_narrow_whole_tiles(whole, 1376) == whole
    sk192 = GemmConfig(128, 192, 2, 1, 8, 132, stream_k=True)
    assert with_narrow_whole_tiles(sk192, 1376) == sk192


def test_raster_options_validation_and_key():
    assert (GemmConfig().raster_along, GemmConfig().serpentine) == ("n", False)
    assert GemmConfig(128, 128, raster_along="m").key == "t128x128_c1x1_g8_sm132_rm"
    assert GemmConfig(128, 128, serpentine=True).key == "t128x128_c1x1_g8_sm132_sp"
    assert GemmConfig(128, 128, raster_along="m", serpentine=True).key.endswith("_rm_sp")
    with pytest.raises(ValueError, match="raster_along='k': must be 'm' or 'n'"):
        GemmConfig(raster_along="k")
    with pytest.raises(ValueError, match="serpentine='yes': must be True or False"):
        GemmConfig(serpentine="yes")


@pytest.mark.parametrize("along,serpentine", [("m", False), ("n", True), ("m", True)])
def test_raster_options_compile_for_sm90(along, serpentine, monkeypatch):
    """Each raster walk traces and compiles (CPU, no GPU): pingpong and cooperative, 2x1."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.kernels.compile import compile_kernel

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    for cfg in (GemmConfig(128, 192, 2, 1, 16, consumers="pingpong", raster_along=along, serpentine=serpentine),
                GemmConfig(128, 256, 2, 1, 16, raster_along=along, serpentine=serpentine)):
        compile_kernel(KernelKey(EpilogueSpec("store"), cfg, "bfloat16", "row", "row", "bfloat16"))


def test_stream_k_compiles_without_the_dsls_slow_loop_warning(monkeypatch):
    """Stream-K's unrolled loops over the accumulators are intended: compile_kernel keeps the
    DSL's slow-static-loop warning out of users' logs (it printed once per loop and kernel)."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import warnings

    from parallel_mlp.kernels.compile import compile_kernel

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    key = KernelKey(EpilogueSpec("store"), GemmConfig(128, 256, 1, 1, 16, stream_k=True),
                    "bfloat16", "row", "row", "bfloat16")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compile_kernel(key)
    assert not [w for w in seen if "static loop" in str(w.message)]


def test_big_short_k_store_and_act_take_stream_k_where_pingpongs_last_wave_is_light():
    """Big GEMMs at K below COOPERATIVE_MIN_K run pingpong tiles, unless the pingpong tiles' last
    wave idles at least STREAM_K_MIN_WASTE of the grid's time, cooperative 128x256's would too
    (with_stream_k) and those take no more columns of tile time: then stream-K 128x256, store
    and act alike (recompute replays fc1 as a plain GEMM), never the dact or accumulate. The
    GEMMs timed for the rule (configs_sk_pingpong), on 132 SMs."""
    from parallel_mlp.kernels.config import (
        STREAM_K_MIN_WASTE,
        GemmConfig,
        big_pingpong_config,
        last_wave_waste,
        wave_columns,
    )

    sk = (128, 256, 2, "cooperative", True)

    # fc1 at T=8192 d=4096 swiglu h=1376: 128x192 tiles in 7 full waves of 66 clusters and 18
    # busy in the eighth, (1 - 18/66) / 8 = 9% idle; 8 x 192 = 6 x 256 = 1536 columns
    m, n, k = 8192, 2752, 4096
    pp = big_pingpong_config(m, n, 132, "act")
    assert (pp.consumers, pp.tile_n) == ("pingpong", 192)
    assert abs(last_wave_waste(pp, m, n) - (1 - 18 / 66) / 8) < 1e-12
    assert last_wave_waste(pp, m, n) >= STREAM_K_MIN_WASTE
    assert wave_columns(pp, m, n) == wave_columns(GemmConfig(128, 256, 2, 1, 16, 132), m, n) == 1536
    for m, n, k in ((8192, 2752, 4096), (4096, 5504, 4096)):  # h=1376 T=8192; h=2752 T=4096
        assert _picked(m, n, k, "act") == _picked(m, n, k, "store") == sk, (m, n, k)
        assert not _picked(m, n, k, "dact")[4] and not _picked(m, n, k, "accumulate")[4], (m, n, k)
    # 256 columns take more (1024 against 960), where stream-K ran slower: pingpong stays
    for m, n, k in ((4096, 3584, 4096), (2048, 7168, 4096), (4096, 3456, 5120)):
        assert _picked(m, n, k, "act")[3] == _picked(m, n, k, "store")[3] == "pingpong", (m, n, k)
    # pingpong's last wave nearly full: fc1 at T=4096 d=5120 swiglu h=3456 (3% idle) and the
    # headline's fc1
    for m, n, k in ((4096, 6912, 5120), (8192, 28672, 4096)):
        assert _picked(m, n, k, "act")[3] == "pingpong", (m, n, k)
    # below STREAM_K_MIN_K: not this rule's
    assert _picked(2048, 5632, 2048, "act")[3] == "pingpong"
