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
    with pytest.raises(ValueError, match="expected T:d:h:activation"):
        parse_shapes("512:1024:\u00b2:swiglu")  # a digit to str.isdigit, not to int()


@pytest.mark.parametrize("argv, message", [
    (["--shapes", ""], "expected T:d:h:activation"),  # an empty $SHAPES, not the default model
    (["--tokens", "0"], "--tokens: expected a positive int, got 0"),
    (["--d", "-5"], "--d: expected a positive int, got -5"),
    (["--h", "0"], "--h: expected a positive int, got 0"),
    (["--num-sms", "0"], "--num-sms: expected a positive int, got 0"),
    (["--act", "nope"], "--act activation='nope' is not known"),
    (["--also", "l2_prefetch=yes"], "l2_prefetch takes 1/0 or true/false, got 'yes'"),
    (["--also", "tile_n=wide"], "tile_n takes an int, got 'wide'"),
])
def test_bad_arguments_are_refused_with_the_rule(argv, message, capsys, monkeypatch):
    from parallel_mlp.kernels import warmup

    monkeypatch.setattr(warmup, "compile_keys", lambda keys, jobs: pytest.fail("compiled"))
    with pytest.raises(SystemExit):
        warmup.main(argv)
    assert message in capsys.readouterr().err


def test_a_cached_kernel_is_not_loaded_again(tmp_path, monkeypatch):
    """Loading creates a CUDA context on a GPU host, one per worker: a warmup over a warm cache
    only checks the objects are there."""
    from parallel_mlp.kernels import compile as kc
    from parallel_mlp.kernels import warmup

    monkeypatch.setenv("PARALLEL_MLP_CACHE_DIR", str(tmp_path))
    key = warmup.mlp_keys(512, 1024, 512, "gelu_tanh_approx")[0]
    kc.object_path(key).parent.mkdir(parents=True)
    kc.object_path(key).write_bytes(b"an object")
    monkeypatch.setattr(kc, "get_kernel", lambda *a, **k: pytest.fail("loaded"))
    assert warmup._build(key) == (True, 0.0, "cached")


def test_a_kernel_that_could_not_be_cached_says_why(tmp_path, monkeypatch):
    import warnings

    from parallel_mlp.kernels import compile as kc
    from parallel_mlp.kernels import warmup

    monkeypatch.setenv("PARALLEL_MLP_CACHE_DIR", str(tmp_path))
    key = warmup.mlp_keys(512, 1024, 512, "gelu_tanh_approx")[0]

    def compiled_but_not_written(key):
        warnings.warn("parallel_mlp: could not write kernel cache /x: [Errno 20] Not a directory",
                      RuntimeWarning)

    monkeypatch.setattr(kc, "get_kernel", compiled_but_not_written)
    ok, _, why = warmup._build(key)
    assert not ok and why == ("compiled, but not cached: parallel_mlp: could not write kernel "
                              "cache /x: [Errno 20] Not a directory")


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
