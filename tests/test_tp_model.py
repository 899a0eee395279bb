"""The TP communication model (bench tp-model): its arithmetic and its inputs."""

import json

import pytest

from parallel_mlp.bench import tp_model


def test_gemm_times_split_the_step_by_flops():
    step = tp_model.gemm_times(12.0, 8192, 4096, 14336, gated=True)
    assert step.total == pytest.approx(12.0)
    assert step.fc1 == pytest.approx(2 * step.fc2)  # F = 2h
    assert step.dx == step.dw1 == step.fc1 and step.dact == step.dw2 == step.fc2


def test_exposed_is_one_block_or_the_excess():
    assert tp_model.exposed(1.0, 10.0, 4) == pytest.approx(0.25)  # hidden but for one block
    assert tp_model.exposed(10.0, 4.0, 4) == pytest.approx(7.0)   # the transfer outlasts the GEMM
    assert tp_model.exposed(1.0, 3.0, 1) == 0.0 and tp_model.exposed(2.0, 0.0, 1) == 2.0


@pytest.mark.parametrize("sp", [False, True])
def test_model_orders(sp):
    shares = []
    for p in (1, 2, 4, 8):
        step = tp_model.gemm_times(10.0 / p, 8192, 4096, 11008 // p, gated=True)
        m = tp_model.model(step, p, 8192, 4096, busbw_gbs=300, sequence_parallel=sp)
        assert 0 <= m["exposed_overlap_ms"] <= m["exposed_ms"] <= m["comm_ms"]
        shares.append(m["exposed_ms"] / (step.total + m["exposed_ms"]))
    assert shares[0] == 0 and shares == sorted(shares)  # more ranks, more of the step exposed


def test_cli_reads_shards_from_a_sweep_and_needs_a_bandwidth(tmp_path, capsys):
    rows = [{"tokens": 64, "d": 32, "act": "swiglu", "shard": 96 // p, "variants": {"ours": {"ms": 2.0 / p}}}
            for p in (1, 2)]
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"rows": rows}))
    argv = ["--sweep", str(sweep), "--T", "64", "--d", "32", "--h", "96"]
    assert tp_model.main(argv) == 2  # no bandwidth
    assert tp_model.main(argv + ["--busbw-gbs", "100"]) == 0
    out = capsys.readouterr().out
    assert "measured (sweep)" in out and "no step time for h=24" in out  # TP=4 is not in it
    tp_json = tmp_path / "tp.json"
    tp_json.write_text(json.dumps({"meta": {"link": {"all_reduce_busbw_gbs": 123.0}}}))
    assert tp_model.main(argv + ["--tp-json", str(tp_json), "--tp1-ms", "2.0"]) == 0
    out = capsys.readouterr().out
    assert "123 GB/s, measured" in out and "TP=1 step / p" in out
