"""The pingpong consumer option's configuration (CPU): validation, names, candidates, selfcheck."""

import pytest

from parallel_mlp.kernels.config import PINGPONG_CANDIDATES, TUNE_CANDIDATES, GemmConfig


def test_cooperative_names_are_unchanged():
    assert GemmConfig().key == "t128x256_c1x1_g8_sm132"
    assert GemmConfig(scheduler="dynamic").key == "t128x256_c1x1_g8_sm132_dynamic"


def test_pingpong_has_its_own_name():
    assert GemmConfig(128, 128, consumers="pingpong").key == "t128x128_c1x1_g8_sm132_pingpong"
    assert GemmConfig(128, 128, scheduler="dynamic", consumers="pingpong").key.endswith("_dynamic_pingpong")
    assert GemmConfig(128, 128, consumers="pingpong").key != GemmConfig(128, 128).key


@pytest.mark.parametrize("tile", [(128, 256)])
def test_pingpong_rejects_accumulators_that_do_not_fit(tile):
    with pytest.raises(ValueError, match=r"tile_m \* tile_n / 128 <= 192"):
        GemmConfig(*tile, consumers="pingpong")


@pytest.mark.parametrize("tile", [(128, 128), (64, 256), (64, 128), (128, 64), (128, 192), (192, 128)])
def test_pingpong_accepts_tiles_that_fit(tile):
    assert GemmConfig(*tile, consumers="pingpong").consumers == "pingpong"


def test_192_row_tile_pingpong_holds_at_most_192_accumulators():
    with pytest.raises(ValueError, match="tile_m \\* tile_n / 128 <= 192"):
        GemmConfig(192, 192, consumers="pingpong")


@pytest.mark.parametrize("tile_n", [64, 128])
def test_192_row_cooperative_tile_takes_up_to_128_columns(tile_n):
    # three consumer warpgroups of 64 rows: tile_n / 2 accumulators per thread at 160 registers
    assert GemmConfig(192, tile_n).key == f"t192x{tile_n}_c1x1_g8_sm132"


@pytest.mark.parametrize("tile_n", [160, 192, 256])
def test_192_row_cooperative_tile_refuses_wider_tiles(tile_n):
    with pytest.raises(ValueError, match=r"tile 192x\d+ with consumers='cooperative'.*tile_n <= 128"):
        GemmConfig(192, tile_n)


def test_192_row_cooperative_tile_has_no_stream_k():
    with pytest.raises(ValueError, match="stream-K tiles have at most 128 rows"):
        GemmConfig(192, 128, stream_k=True)


def test_unknown_consumers_value():
    with pytest.raises(ValueError, match="consumers="):
        GemmConfig(consumers="pong")


def test_candidates_kept_apart():
    assert all(c.consumers == "pingpong" for c in PINGPONG_CANDIDATES)
    assert all(c.consumers == "cooperative" for c in TUNE_CANDIDATES)


def test_selfcheck_compiles_pingpong_variants():
    from parallel_mlp.kernels.selfcheck import variants

    for quick in (True, False):
        pp = [k for k in variants(quick) if k.config.consumers == "pingpong"]
        kinds = {k.epilogue.kind for k in pp}
        assert kinds == {"store", "accumulate", "act", "dact"}
        assert any(k.config.cluster_m == 2 for k in pp)
        tiles = {(k.config.tile_m, k.config.tile_n) for k in pp}
        assert {(128, 128), (64, 256)} <= tiles <= {(128, 128), (64, 256), (64, 128), (64, 64), (128, 160), (128, 192), (192, 128)}
        assert quick or {(64, 128), (64, 64), (128, 160), (128, 192), (192, 128)} <= tiles


def raster(cfg):
    return cfg.raster_group, cfg.raster_along, cfg.serpentine


ROWS_SERPENTINE = (8, "m", True)  # groups of 8 cluster rows, every other one walked back


def test_big_whole_tile_gemms_walk_rows_and_stream_k_keeps_columns():
    from parallel_mlp.kernels.config import ALONG_M_RASTER_GROUP, GemmConfig, default_config, with_raster

    assert ALONG_M_RASTER_GROUP == 8
    headline = {  # T=8192 d=4096 swiglu h=14336: (m, n, k, kind) of each GEMM of a step
        "fc1": (8192, 28672, 4096, "act"), "fc2": (8192, 4096, 14336, "store"),
        "dact": (8192, 14336, 4096, "dact"), "dx": (8192, 4096, 28672, "store"),
        "dW2": (4096, 14336, 8192, "accumulate"), "dW1": (28672, 4096, 8192, "accumulate")}
    picks = {name: default_config(*mnkk[:3], 132, mnkk[3]) for name, mnkk in headline.items()}
    # pingpong (fc1, dact) and cooperative 128x256 (the rest) alike, whichever of the tile
    # columns and the cluster rows outnumber the other (fc2: 16 columns, 32 rows)
    assert {name: raster(cfg) for name, cfg in picks.items()} == {name: ROWS_SERPENTINE for name in headline}
    assert (picks["fc1"].consumers, picks["dW1"].consumers) == ("pingpong", "cooperative")
    cfg = GemmConfig(128, 192, 2, 1, 16, consumers="pingpong")
    assert raster(cfg) == (16, "n", False)  # GemmConfig's own default: groups of 16 columns
    assert with_raster(cfg).key == "t128x192_c2x1_g8_sm132_pingpong_rm_sp"
    # stream-K keeps its column groups (its split of the grid is tested with those)
    sk = GemmConfig(128, 256, 2, 1, 16, stream_k=True)
    assert with_raster(sk) is sk
    fc2_t2304 = default_config(2304, 4096, 14336, 132, "store")  # a light last wave: stream-K
    assert (fc2_t2304.stream_k, raster(fc2_t2304)) == (True, (16, "n", False))


def test_default_config_is_pingpong_at_big_shapes():
    from parallel_mlp.kernels.config import SHORT_K_DACT_MAX_K, default_config

    for m, n, k in [(8192, 28672, 4096), (8192, 14336, 4096), (4100, 4200, 1000), (8192, 4096, 6143)]:
        for kind in ("store", "accumulate", "act", "dact"):
            if kind == "dact" and k <= SHORT_K_DACT_MAX_K:  # the short-K dact rule (below)
                continue
            cfg = default_config(m, n, k, 132, kind)
            assert (cfg.consumers, cfg.tile_m, cfg.tile_n, cfg.cluster_m) == ("pingpong", 128, 192, 2)
            assert raster(cfg) == ROWS_SERPENTINE, (m, n, kind)
            assert cfg.l2_prefetch == (kind == "accumulate")
            # the dact alone takes the two-slot preact ring, with 16-column subtiles for 5 stages
            assert (cfg.dact_prefetch, cfg.epi_n) == ((2, 16) if kind == "dact" else (1, 32))
    # a narrow N that 192-wide tiles would pad far more than 128-wide ones: 128x128 (below
    # NARROW_COOPERATIVE_MIN_K, the dact as the store)
    for n in (256, 640, 1000):
        for kind in ("store", "dact"):
            cfg = default_config(65536, n, 2048, 132, kind)
            assert (cfg.consumers, cfg.tile_m, cfg.tile_n) == ("pingpong", 128, 128), (n, kind)
    assert default_config(65536, 384, 2048, 132, "store").tile_n == 192  # no padding at 192
    # fewer than two waves of 128x256 tiles: cooperative as before
    assert default_config(1024, 2048, 4096, 132, "store").consumers == "cooperative"


def test_default_config_is_cooperative_128x256_at_long_k():
    """From K = COOPERATIVE_MIN_K up, big store / accumulate / act GEMMs (fc2, dx, the wgrads)
    take cooperative 128x256 tiles with a 2x1 cluster; the dact keeps its pingpong config."""
    from parallel_mlp.kernels.config import COOPERATIVE_MIN_K, default_config

    for m, n, k in [(8192, 4096, 14336), (8192, 4096, 28672), (4096, 14336, 8192),
                    (28672, 4096, 8192), (8192, 4096, COOPERATIVE_MIN_K)]:
        for kind in ("store", "accumulate", "act"):
            cfg = default_config(m, n, k, 132, kind)
            assert (cfg.consumers, cfg.tile_m, cfg.tile_n, cfg.cluster_m) == \
                ("cooperative", 128, 256, 2), (m, n, k, kind)
            assert raster(cfg) == ROWS_SERPENTINE, (m, n, k, kind)
            assert cfg.l2_prefetch == (kind == "accumulate")
        dact = default_config(m, n, k, 132, "dact")
        assert (dact.consumers, dact.tile_n, dact.dact_prefetch) == ("pingpong", 192, 2)


def test_long_k_takes_pingpong_where_its_waves_fill_the_grid_as_well():
    """From K = COOPERATIVE_MIN_K up, pingpong 128x192 replaces cooperative 128x256 where its
    quantized waves take no more columns of tile time: every GEMM of T=8192 d=8192 gelu h=8192
    (4096 against 4032 columns, measured 0.6-1.9% faster), fc1 of T=16384 d=8192 swiglu h=11008
    (21504 columns each, measured 0.9% faster plain, 2.6% with the activation), not the wgrads
    at T=8192 d=4096 h=14336 (3584 against 3648 columns, measured 1.0-2.5% slower). Store, act
    and accumulate decide alike; a cooperative GEMM that runs stream-K keeps it."""
    from parallel_mlp.kernels.config import (GemmConfig, big_pingpong_config, default_config,
                                             wave_columns)

    tie = (16384, 22016, 8192)
    assert (wave_columns(GemmConfig(128, 256, 2, 1, 16), *tie[:2])
            == wave_columns(big_pingpong_config(*tie[:2], 132), *tie[:2]) == 21504)
    flipped = [(8192, 8192, 8192), tie]
    kept = [(4096, 14336, 8192), (28672, 4096, 8192), (8192, 4096, 14336)]
    for m, n, k in flipped + kept:
        picks = {kind: default_config(m, n, k, 132, kind) for kind in ("store", "act", "accumulate")}
        want = ("pingpong", 192) if (m, n, k) in flipped else ("cooperative", 256)
        for kind, cfg in picks.items():
            assert (cfg.consumers, cfg.tile_n, cfg.cluster_m) == (*want, 2), (m, n, k, kind)
            assert raster(cfg) == ROWS_SERPENTINE, (m, n, k, kind)
            assert cfg.l2_prefetch == (kind == "accumulate")
    assert wave_columns(default_config(8192, 8192, 8192, 132, "store"), 8192, 8192) == 192 * 21
    assert wave_columns(GemmConfig(128, 256, 2, 1, 16), 8192, 8192) == 256 * 16
    # the GPU tests' tailed shape for this rule (test_ops_gpu.BIG_LONG_K_WAVES) reaches it
    for kind in ("store", "accumulate", "act"):
        assert default_config(2568, 5640, 6200, 132, kind).consumers == "pingpong"
    # fc2 at T=2304: pingpong's waves would be fewer, but stream-K evens cooperative's last wave
    m, n, k = 2304, 4096, 14336
    assert wave_columns(big_pingpong_config(m, n, 132), m, n) < 256 * 3
    cfg = default_config(m, n, k, 132, "store")
    assert (cfg.consumers, cfg.tile_n, cfg.stream_k) == ("cooperative", 256, True)


def test_from_long_k_cooperative_128x256_whatever_the_columns():
    """From K = LONG_K_COOPERATIVE_MIN_K up, big GEMMs take cooperative 128x256 though pingpong
    128x192's waves take fewer columns of tile time: fc2 and dx of T=16384 d=8192 swiglu h=11008
    (K = 11008 and 22016; 8064 against 8192 columns) and dx of T=8192 d=8192 swiglu h=5504
    (K = 11008), measured 1-8% faster cooperative on an H100, for store, act and accumulate
    alike; just below that K the columns still decide (pingpong at K = 8192, measured faster)."""
    from parallel_mlp.kernels.config import (GemmConfig, LONG_K_COOPERATIVE_MIN_K,
                                             big_pingpong_config, default_config, wave_columns)

    assert 8192 < LONG_K_COOPERATIVE_MIN_K <= 11008
    for m, n, k in [(16384, 8192, 11008), (16384, 8192, 22016), (8192, 8192, 11008),
                    (2568, 5640, 10312)]:
        assert (wave_columns(big_pingpong_config(m, n, 132), m, n)
                < wave_columns(GemmConfig(128, 256, 2, 1, 16), m, n)), (m, n)
        for kind in ("store", "act", "accumulate"):
            cfg = default_config(m, n, k, 132, kind)
            assert (cfg.consumers, cfg.tile_n, cfg.cluster_m, cfg.stream_k) == \
                ("cooperative", 256, 2, False), (m, n, k, kind)
            assert raster(cfg) == ROWS_SERPENTINE, (m, n, k, kind)
            below = default_config(m, n, LONG_K_COOPERATIVE_MIN_K - 64, 132, kind)
            assert (below.consumers, below.tile_n) == ("pingpong", 192), (m, n, kind)
        # the dact keeps its own rule
        assert default_config(m, n, k, 132, "dact").consumers == "pingpong"


def test_narrow_pingpong_gives_way_to_cooperative_128x256_from_k_4096():
    """Big GEMMs below COOPERATIVE_MIN_K whose pingpong config is 128x128 take cooperative
    128x256 (2x1, walking rows as every big GEMM) from NARROW_COOPERATIVE_MIN_K where its waves take no more columns
    of tile time: store, act and the dact alike, not the wgrads. The GEMMs timed for the rule
    (gpu_run.sh configs_mid, configs_narrow_gelu), on 132 SMs; 192-wide pingpong and short K stay."""
    from parallel_mlp.kernels.config import (NARROW_COOPERATIVE_MIN_K, big_pingpong_config,
                                             default_config, wave_columns)

    moved = [(16384, 2560, 5120), (8192, 2048, 4096)]  # fc1 of gelu h=2560 d=5120; h=2048 d=4096 (and fc2, dx at d=2048)
    for m, n, k in moved:
        assert big_pingpong_config(m, n, 132).tile_n == 128
        for kind in ("store", "act", "dact"):
            cfg = default_config(m, n, k, 132, kind)
            assert (cfg.consumers, cfg.tile_n, cfg.cluster_m, cfg.stream_k) == \
                ("cooperative", 256, 2, False), (m, n, k, kind)
            assert raster(cfg) == ROWS_SERPENTINE, (m, n, k, kind)
            assert wave_columns(cfg, m, n) <= wave_columns(big_pingpong_config(m, n, 132), m, n)
            # the cooperative dact's one-subtile preact prefetch and 32-column subtiles
            assert (cfg.dact_prefetch, cfg.epi_n) == (1, 32), (m, n, k, kind)
        assert default_config(m, n, k, 132, "accumulate").consumers == "pingpong", (m, n, k)
    # 192-wide pingpong stays (fc2 and dx at T=16384 d=5120 gelu h=2560, timed slower cooperative)
    assert default_config(16384, 5120, 2560, 132, "store").tile_n == 192
    # below the K threshold (fc1 at T=4096 d=1024 gelu h=4096, timed slower cooperative)
    assert default_config(4096, 4096, 1024, 132, "act").consumers == "pingpong"
    assert default_config(8192, 2048, NARROW_COOPERATIVE_MIN_K - 64, 132, "act").consumers == "pingpong"
    # the GPU tests' tailed shape for this rule (test_ops_gpu.BIG_NARROW_COOP) reaches it
    for kind in ("store", "act", "dact"):
        cfg = default_config(5512, 1288, 4200, 132, kind)
        assert (cfg.consumers, cfg.tile_n, cfg.stream_k) == ("cooperative", 256, False)
    # the dact below the K threshold keeps its pingpong ring
    dact = default_config(8192, 2048, NARROW_COOPERATIVE_MIN_K - 64, 132, "dact")
    assert (dact.consumers, dact.dact_prefetch) == ("pingpong", 2)


def test_short_k_dacts_take_cooperative_128x128_tiles():
    """Big dacts up to SHORT_K_DACT_MAX_K run cooperative 128x128 in 1x1 clusters, raster 8, with
    the four-slot preact ring; the
    GEMMs timed for the rule (T=8192 and 65536, d=1024, swiglu h=2816) and the GPU tests' tailed
    shape reach it, K = 2048 and 4096 do not, and only the dact moves."""
    from parallel_mlp.kernels.config import SHORT_K_DACT_MAX_K, default_config, is_big

    for m, n, k in [(8192, 2816, 1024), (65536, 2816, 1024), (4104, 4200, 1000),
                    (65536, 1024, SHORT_K_DACT_MAX_K)]:
        assert is_big(m, n, 132)
        cfg = default_config(m, n, k, 132, "dact")
        assert (cfg.consumers, cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n,
                cfg.raster_group, cfg.stream_k) == ("cooperative", 128, 128, 1, 1, 8, False)
        assert (cfg.dact_prefetch, cfg.epi_n, cfg.l2_prefetch) == (3, 32, False)
        for kind in ("store", "act", "accumulate"):
            assert default_config(m, n, k, 132, kind).consumers == "pingpong", (m, n, k, kind)
    for m, n, k in [(8192, 5632, 2048), (65536, 704, 2048), (8192, 1376, 4096),
                    (8192, 2816, SHORT_K_DACT_MAX_K + 64)]:
        cfg = default_config(m, n, k, 132, "dact")
        assert (cfg.tile_n, cfg.dact_prefetch) != (128, 3), (m, n, k)


def test_recompute_replays_fc1_with_the_act_gemms_config():
    """Recompute replays fc1's gemm_act as a plain GEMM and needs its bits: for every shape the
    store and act kinds must choose the same tile, cluster, raster and consumers."""
    from parallel_mlp.kernels.config import default_config

    fields = ("tile_m", "tile_n", "cluster_m", "cluster_n", "raster_group", "consumers", "scheduler")
    for m in (64, 1000, 4104, 8192, 65536):
        for n in (256, 1000, 4096, 8192, 14336, 28672):
            for k in (256, 4096, 6144, 8192, 28672):
                store = default_config(m, n, k, 132, "store")
                act = default_config(m, n, k, 132, "act")
                assert [getattr(store, f) for f in fields] == [getattr(act, f) for f in fields], (m, n, k)


def test_default_config_is_cached():
    """default_config runs on every launch: it is memoized (a pure function of its arguments)."""
    from parallel_mlp.kernels.config import default_config

    assert default_config(8192, 4096, 14336, 132, "store") is default_config(8192, 4096, 14336, 132, "store")


def test_128_wide_tiles_where_192_wide_waves_are_too_coarse():
    """fc1 and the dact at T=1000, h=10240 (d=5120): 4 waves of 2x1 clusters of 128x192 tiles
    against 5 of 128x128 on 132 SMs, so 128 wins even if 192 is 7% faster per tile; store and act
    agree (the recompute replay of fc1 must give the forward's bits). At the MLP's big shapes 192
    stays."""
    from parallel_mlp.kernels.config import NARROW_TILE_MIN_GAIN, WIDE_TILE_SPEEDUP, default_config

    assert 4 * 192 / WIDE_TILE_SPEEDUP >= NARROW_TILE_MIN_GAIN * 5 * 128
    for kind in ("act", "store", "dact"):
        cfg = default_config(1000, 10240, 5120, 132, kind)
        assert (cfg.consumers, cfg.tile_n, cfg.cluster_m) == ("pingpong", 128, 2), kind
    # 73 waves of 192 against 109 of 128 (fc1 at h=14336): 6% in 192's favour
    assert default_config(8192, 28672, 4096, 132, "act").tile_n == 192
    assert default_config(8192, 14336, 4096, 132, "dact").tile_n == 192


@pytest.mark.parametrize("tile_n", [64, 128])
def test_handoff_runs_128_row_tiles_of_up_to_128_columns(tile_n):
    cfg = GemmConfig(128, tile_n, consumers="handoff")
    assert cfg.key == f"t128x{tile_n}_c1x1_g8_sm132_handoff"
    assert GemmConfig(128, tile_n, 2, 1, consumers="handoff", dact_prefetch=3, epi_n=16).dact_prefetch == 3


@pytest.mark.parametrize("fields", [
    dict(tile_m=128, tile_n=256), dict(tile_m=128, tile_n=192), dict(tile_m=256, tile_n=128),
    dict(tile_m=64, tile_n=128), dict(tile_m=192, tile_n=128), dict(tile_m=128, tile_n=128, scheduler="dynamic"),
])
def test_handoff_refuses_other_tiles_and_the_dynamic_scheduler(fields):
    with pytest.raises(ValueError, match="handoff schedule runs 128-row tiles of at most 128 columns with the static"):
        GemmConfig(consumers="handoff", **fields)


def test_handoff_has_no_stream_k():
    with pytest.raises(ValueError, match="stream-K needs consumers='cooperative'"):
        GemmConfig(128, 128, consumers="handoff", stream_k=True)


@pytest.mark.parametrize("kind", ["store", "act", "dact"])
def test_big_pingpong_pairs_ctas_from_pair_min_rows(kind):
    """The big pingpong GEMMs run 2x1 clusters (B shared through multicast) from PAIR_MIN_ROWS
    rows, as the smaller GEMMs do: at T=1000 fc1 + act and the dact in 1x1 clusters ran at
    0.71-0.89x cuBLAS's speed and 9-19% faster in 2x1 (benchmarks/h100-t1000-pairs.txt). One row
    fewer stays 1x1."""
    from parallel_mlp.kernels.config import PAIR_MIN_ROWS, default_config, is_big

    checked = 0
    for n, k in [(10240, 5120), (22016, 4096), (11008, 4096)]:
        assert is_big(PAIR_MIN_ROWS - 1, n, 132)
        paired = default_config(PAIR_MIN_ROWS, n, k, 132, kind)
        alone = default_config(PAIR_MIN_ROWS - 1, n, k, 132, kind)
        if paired.consumers != "pingpong":  # a store GEMM the stream-K rule takes
            continue
        assert (paired.cluster_m, alone.cluster_m) == (2, 1), (n, k, kind)
        checked += 1
    assert checked >= 2, kind
