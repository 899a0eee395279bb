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
