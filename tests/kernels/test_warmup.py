"""The warmup's list of kernels matches what the ops pick for an MLP's GEMMs (CPU, no compile)."""

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")


def test_mlp_keys_cover_the_six_gemms():
    from parallel_mlp.kernels.warmup import mlp_keys

    keys = mlp_keys(8192, 4096, 14336, "swiglu")
    kinds = sorted(k.epilogue.key for k in keys)
    assert "act-swiglu" in kinds and "act-swiglu-nopre" in kinds and "dact-swiglu" in kinds
    assert any(k.epilogue.kind == "accumulate" and k.d_dtype == "float32" for k in keys)
    # wgrads read a column-major a (dy.T, dpreact.T)
    assert all(k.a_major == "col" for k in keys if k.epilogue.kind == "accumulate")
    assert len(set(keys)) == len(keys)


def test_mlp_keys_hold_recompute_s_plain_fc1_replay():
    """Recompute replays fc1 in backward as a plain GEMM at fc1's config and operand layout."""
    from parallel_mlp.kernels.warmup import mlp_keys

    keys = mlp_keys(8192, 4096, 7168, "swiglu")
    act = next(k for k in keys if k.epilogue.key == "act-swiglu")
    assert any(k.epilogue.kind == "store" and k.config == act.config and
               (k.a_major, k.b_major, k.d_dtype) == ("row", "row", "bfloat16") for k in keys)


def test_shapes_list_is_parsed_and_refused_when_malformed(capsys):
    from parallel_mlp.kernels.warmup import main, parse_shapes

    assert parse_shapes("8192:4096:14336:swiglu, 1000:1024:512:gelu_tanh_approx") == [
        (8192, 4096, 14336, "swiglu"), (1000, 1024, 512, "gelu_tanh_approx")]
    for bad in ("8192:4096:swiglu", "8192:4096:0:swiglu", "a:b:c:swiglu"):
        with pytest.raises(ValueError, match="expected T:d:h:activation"):
            parse_shapes(bad)
    with pytest.raises(ValueError, match="nope"):
        parse_shapes("8:8:8:nope")
    with pytest.raises(SystemExit):
        main(["--shapes", "8192:4096:swiglu"])
    assert "expected T:d:h:activation" in capsys.readouterr().err


def test_shapes_compile_the_union_of_their_keys(monkeypatch):
    from parallel_mlp.kernels import warmup

    compiled = []
    monkeypatch.setattr(warmup, "compile_keys",
                        lambda keys, jobs: compiled.extend(keys) or [(True, 0.0, "")] * len(keys))
    assert warmup.main(["--shapes", "8192:4096:7168:swiglu,8192:4096:7168:swiglu,512:1024:4096:relu",
                        "--num-sms", "132"]) == 0
    expected = warmup.mlp_keys(8192, 4096, 7168, "swiglu") + warmup.mlp_keys(512, 1024, 4096, "relu")
    assert compiled == list(dict.fromkeys(expected))


def test_also_adds_each_kernel_with_the_fields_replaced(monkeypatch, capsys):
    import dataclasses

    from parallel_mlp.kernels import warmup

    compiled = []
    monkeypatch.setattr(warmup, "compile_keys",
                        lambda keys, jobs: compiled.extend(keys) or [(True, 0.0, "")] * len(keys))
    assert warmup.main(["--shapes", "8192:4096:14336:swiglu", "--num-sms", "132",
                        "--also", "max_stages=4", "--also", "dact_prefetch=3"]) == 0
    base = warmup.mlp_keys(8192, 4096, 14336, "swiglu")
    four = [dataclasses.replace(k, config=dataclasses.replace(k.config, max_stages=4)) for k in base]
    assert compiled[: len(base)] == base and set(four) <= set(compiled)
    assert all(k.config.max_stages == 4 for k in four) and four[0] not in base
    # pingpong GEMMs refuse three preact slots a warpgroup: skipped with a line saying why,
    # the cooperative ones compiled with it
    out = capsys.readouterr().out
    assert "skip " in out and "dact_prefetch=3" in out
    assert any(k.config.dact_prefetch == 3 for k in compiled)


def test_also_refuses_what_is_not_a_config_field(capsys):
    from parallel_mlp.kernels.warmup import main

    with pytest.raises(SystemExit):
        main(["--shapes", "8192:4096:14336:swiglu", "--also", "tile=128"])
    assert "--also 'tile=128': 'tile=128' is not FIELD=VALUE" in capsys.readouterr().err
