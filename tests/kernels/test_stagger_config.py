"""The stagger option's configuration (CPU): its name, its bounds, and the producer's wait in the
compiled kernel (sm_90a PTX)."""

import pytest

from parallel_mlp.kernels.config import GemmConfig, parse_fields


def test_default_waits_for_nothing_and_keeps_the_names():
    assert GemmConfig().stagger == 0
    assert GemmConfig(128, 128, dact_prefetch=3).key == "t128x128_c1x1_g8_sm132_pf3"


def test_a_stagger_has_its_own_name():
    assert GemmConfig(128, 128, dact_prefetch=3, stagger=12000).key == "t128x128_c1x1_g8_sm132_pf3_stg12000"
    assert parse_fields("stagger=12000") == {"stagger": 12000}


@pytest.mark.parametrize("value", [-1, 10**6 + 1, 1.5, "12000", True])
def test_a_stagger_is_a_bounded_count_of_cycles(value):
    with pytest.raises(ValueError, match=r"stagger=.*must be an int of clock cycles, 0 to 1000000"):
        GemmConfig(stagger=value)
