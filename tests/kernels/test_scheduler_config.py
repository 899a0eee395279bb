"""The tile-scheduler option of GemmConfig: validation and the compiled-kernel cache key (CPU)."""

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
