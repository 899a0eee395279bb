"""kernels/compile.py's disk cache on CPU, without compiling: where it lives when there is no
home directory, and that the DSL settings that change a binary are part of its directory."""

import subprocess
import sys

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")


def _fingerprint(env_extra: dict) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_DSL_")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", "from parallel_mlp.kernels.compile import "
                          "source_fingerprint; print(source_fingerprint())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_dsl_settings_that_change_the_binary_change_the_cache_directory():
    plain = _fingerprint({})
    assert _fingerprint({"CUTE_DSL_ARCH": "sm_90a"}) == plain  # every kernel is built for sm_90a
    assert _fingerprint({"CUTE_DSL_KEEP": "ptx"}) == plain  # keeps files beside, same binary
    for name in ("LINEINFO", "ENABLE_ASSERTIONS", "DEBUG"):
        assert _fingerprint({f"CUTE_DSL_{name}": "1"}) != plain, name


def test_without_a_home_the_cache_goes_to_the_temporary_directory(monkeypatch):
    import tempfile
    from pathlib import Path

    from parallel_mlp.kernels import compile as kc

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("PARALLEL_MLP_CACHE_DIR", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert kc.cache_dir().parent == Path(tempfile.gettempdir())
    monkeypatch.setenv("PARALLEL_MLP_CACHE_DIR", "/somewhere/else")
    assert kc.cache_dir() == Path("/somewhere/else")
