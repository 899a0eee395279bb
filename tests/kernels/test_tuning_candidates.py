"""tuned=True's candidate list (kernels/tuning.py), with the timing replaced: which configs
compete, that the fastest is kept, and that a later call reuses it from disk without timing."""

import dataclasses

import pytest

pytest.importorskip("cutlass")

import torch


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    from parallel_mlp.kernels import tuning

    monkeypatch.setenv("PARALLEL_MLP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_choices", None)
    return tuning


def fake_timing(tuning, monkeypatch, fastest):
    """Candidates 'run' without a GPU; the one equal to `fastest` times quickest."""
    from parallel_mlp.bench import timing

    seen = []

    def held(fns, **kw):
        # an even number of turns: the alternating order then gives every candidate one mean place
        assert kw.get("rounds", 3) % 2 == 0, kw
        return [0.5 if f.args[0] == fastest else 1.0 for f in fns]

    monkeypatch.setattr(tuning, "_candidate_runner", lambda *a: seen.append)
    monkeypatch.setattr(timing, "median_ms_held", held)
    return seen


@pytest.mark.parametrize("k", [4096, 14336])
def test_big_shapes_time_the_pingpong_and_cooperative_configs(tuning, monkeypatch, k):
    from parallel_mlp.kernels.config import big_pingpong_config, default_config
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    m, n = 8192, 4096
    spec = EpilogueSpec("store")
    a = torch.empty(m, k, dtype=torch.bfloat16)
    bk = torch.empty(n, k, dtype=torch.bfloat16)
    pingpong = big_pingpong_config(m, n, 132, "store")
    seen = fake_timing(tuning, monkeypatch, fastest=pingpong)
    chosen = tuning.tuned_config(spec, a, bk, torch.bfloat16, 132)
    default = default_config(m, n, k, 132, "store")
    assert default in seen and pingpong in seen
    assert any(c.consumers == "pingpong" and c.tile_n == 128 for c in seen)
    assert any(c.consumers == "cooperative" and c.tile_n == 256 for c in seen)
    assert len(seen) == len(set(seen))  # each candidate timed once
    assert chosen == pingpong

    # kept on disk: a new process (empty in-memory table) reuses it without timing anything
    monkeypatch.setattr(tuning, "_choices", None)
    seen.clear()
    assert tuning.tuned_config(spec, a, bk, torch.bfloat16, 132) == pingpong and not seen


def test_stream_k_competes_where_the_last_wave_is_partial(tuning, monkeypatch):
    """fc2 at T=2304 (a light last wave): the default is stream-K, and whole tiles at the same
    tile compete with it; at T=8192 the default is whole tiles and stream-K competes."""
    import dataclasses

    from parallel_mlp.kernels.config import default_config
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    spec = EpilogueSpec("store")
    for m, k in ((2304, 14336), (8192, 14336)):
        n = 4096
        default = default_config(m, n, k, 132, "store")
        other = dataclasses.replace(default, stream_k=not default.stream_k)
        seen = fake_timing(tuning, monkeypatch, fastest=other)
        a = torch.empty(m, k, dtype=torch.bfloat16)
        bk = torch.empty(n, k, dtype=torch.bfloat16)
        assert tuning.tuned_config(spec, a, bk, torch.bfloat16, 132) == other
        assert default in seen and other in seen and default.stream_k == (m == 2304)


def test_a_stored_choice_that_no_longer_builds_is_tuned_again(tuning, monkeypatch):
    """A choice written by older code (a GemmConfig field since removed) is a miss, not a
    TypeError on every tuned call of that problem."""
    import json
    from dataclasses import asdict

    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    spec = EpilogueSpec("store")
    a, bk = torch.zeros(256, 512, dtype=torch.bfloat16), torch.zeros(384, 512, dtype=torch.bfloat16)
    key = (f"{spec.key}|{a.dtype}|{ops._major(a)}|{ops._major(bk)}|{torch.bfloat16}|256x384x512|"
           f"sm132")
    stale = dict(asdict(GemmConfig()), stream_k_split=1)
    (tuning._path()).write_text(json.dumps({key: stale}))
    fastest = GemmConfig(tile_n=128)
    seen = fake_timing(tuning, monkeypatch, fastest)
    monkeypatch.setattr(tuning, "TUNE_CANDIDATES", [fastest])
    got = tuning.tuned_config(spec, a, bk, torch.bfloat16, 132)
    assert seen and got == dataclasses.replace(fastest, num_sms=132, l2_prefetch=got.l2_prefetch)
    assert json.loads(tuning._path().read_text())[key] == asdict(got)


def test_saving_keeps_the_choices_other_processes_wrote(tuning):
    import json

    tuning._load()["mine"] = {"tile_n": 128}
    tuning._path().parent.mkdir(parents=True, exist_ok=True)
    tuning._path().write_text(json.dumps({"theirs": {"tile_n": 192}}))  # written since we read
    tuning._save()
    assert json.loads(tuning._path().read_text()) == {"mine": {"tile_n": 128},
                                                      "theirs": {"tile_n": 192}}
