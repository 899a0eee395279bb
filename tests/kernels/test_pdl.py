"""Programmatic dependent launch (GemmConfig.pdl, ops.set_pdl, PARALLEL_MLP_PDL) on the CPU: the
option's rule and name, what it puts into a compiled kernel (the wait before any global memory
access, the early launch of the next kernel, the launch attribute), and which launches the ops'
switch gives it. Its GPU tests (bitwise twins, hazards between consecutive kernels, graphs, the
layer's step) are in test_pdl_gpu.py."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from parallel_mlp.kernels.config import GemmConfig, parse_fields


def test_off_by_default_with_its_own_name():
    assert GemmConfig().pdl is False
    assert GemmConfig(128, 128, 2, 1, 16).key == "t128x128_c2x1_g16_sm132"
    assert GemmConfig(128, 128, 2, 1, 16, pdl=True).key == "t128x128_c2x1_g16_sm132_pdl"
    assert GemmConfig(128, 192, consumers="pingpong", stream_k=False, pdl=True).key.endswith("_pingpong_pdl")
    assert parse_fields("pdl=1,epi_n=16") == {"pdl": True, "epi_n": 16}


def test_a_value_that_is_not_a_bool_is_refused():
    with pytest.raises(ValueError, match="pdl='yes': must be True or False"):
        GemmConfig(pdl="yes")


def _key(kind, act, cfg, b_major="row", out="bfloat16"):
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    spec = EpilogueSpec(kind, act) if act else EpilogueSpec(kind)
    return KernelKey(spec, cfg, "bfloat16", "row" if kind != "accumulate" else "col", b_major, out)


# Each schedule's first global access: the producer's TMA loads, the dynamic scheduler's atomic
# claim, stream-K's flags, the epilogue's stores and preact loads.
GLOBAL_ACCESS = re.compile(
    r"\b(?:cp\.async\.bulk\.tensor|cp\.reduce\.async\.bulk\.tensor|cp\.async\.bulk\.prefetch\.tensor"
    r"|atom\.global|red\.[a-z.]*global|ld\.global|st\.global|ld\.acquire\.gpu|ld\.relaxed\.gpu)")

CASES = {
    "cooperative store": ("store", None, GemmConfig(128, 256, 2, 1, 8), "row", "bfloat16"),
    "pingpong dact": ("dact", "swiglu", GemmConfig(128, 192, 2, 1, 8, consumers="pingpong", dact_prefetch=2, epi_n=16),
                      "col", "bfloat16"),
    "short-K dact": ("dact", "gelu_tanh_approx", GemmConfig(128, 128, dact_prefetch=3), "col", "bfloat16"),
    "stream-K accumulate": ("accumulate", None, GemmConfig(128, 256, 2, 1, 16, stream_k=True, l2_prefetch=True),
                            "col", "float32"),
    "dynamic act": ("act", "swiglu", GemmConfig(128, 128, scheduler="dynamic"), "row", "bfloat16"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_waits_before_its_first_global_access(case):
    """With pdl, the PTX holds one griddepcontrol.wait and one launch_dependents, after the CTA's
    barriers are set up and before the first instruction of any role that reads or writes global
    memory; without it, neither (so the off kernel is the kernel as it was)."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import dataclasses

    from parallel_mlp.kernels.compile import kernel_ptx

    kind, act, cfg, b_major, out = CASES[case]
    off = kernel_ptx(_key(kind, act, cfg, b_major, out))
    on = kernel_ptx(_key(kind, act, dataclasses.replace(cfg, pdl=True), b_major, out))
    assert "griddepcontrol" not in off
    assert on.count("griddepcontrol.wait") == 1 and on.count("griddepcontrol.launch_dependents") == 1
    wait, launch = on.index("griddepcontrol.wait"), on.index("griddepcontrol.launch_dependents")
    first_access = GLOBAL_ACCESS.search(on)
    assert first_access is not None
    assert "mbarrier.init" in on[:wait], f"{case}: the wait comes before the barriers are set up"
    assert wait < launch < first_access.start(), (
        f"{case}: {first_access.group(0)} at {first_access.start()} comes before the wait at {wait}")


def _launch_ir(pdl: bool, tmp_path) -> str:
    """The MLIR the DSL keeps (CUTE_DSL_KEEP=ir) of a cooperative store kernel's host function,
    compiled in a fresh process (the DSL reads its environment once)."""
    script = textwrap.dedent(f"""
        from parallel_mlp.kernels.compile import KernelKey, compile_kernel
        from parallel_mlp.kernels.config import GemmConfig
        from parallel_mlp.kernels.epilogue_spec import EpilogueSpec
        cfg = GemmConfig(128, 128, 2, 1, 8, pdl={pdl})
        compile_kernel(KernelKey(EpilogueSpec("store"), cfg, "bfloat16", "row", "row", "bfloat16"))
    """)
    dump = tmp_path / f"pdl{int(pdl)}"
    dump.mkdir()
    env = dict(os.environ, CUTE_DSL_KEEP="ir", CUTE_DSL_DUMP_DIR=str(dump))
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    files = list(dump.glob("*.mlir"))
    assert files, f"no MLIR kept in {dump}"
    return "\n".join(f.read_text() for f in files)


@pytest.mark.slow
def test_the_launch_allows_programmatic_stream_serialization_only_with_pdl(tmp_path):
    """The attribute that lets the kernel start before the one ahead of it ends is set on the
    launch by the compiled host function (which the disk cache exports and the C runtime runs):
    1 with pdl, 0 without."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    attribute = re.compile(r"programmatic_stream_serialization_allowed\[[^\]]*\]\s+%c(\d)_i32")
    assert attribute.findall(_launch_ir(True, tmp_path)) == ["1"]
    assert attribute.findall(_launch_ir(False, tmp_path)) == ["0"]


# ---- the ops' switch ------------------------------------------------------------------------


@pytest.fixture
def launched(monkeypatch):
    """The KernelKeys the ops launch, with the kernels stubbed out (bench/host_stub.py) and the
    switch put back afterwards."""
    from parallel_mlp.bench.host_stub import stubbed_kernels
    from parallel_mlp.kernels import compile as kcompile
    from parallel_mlp.kernels import ops

    keys = []

    class Recorder:
        def __init__(self, key):
            keys.append(key)

        def run_compiled_program(self, args):
            return None

    previous = ops.pdl_launches()
    with stubbed_kernels():
        monkeypatch.setattr(kcompile, "get_kernel", lambda key, use_disk=True: Recorder(key))
        yield keys
    ops.set_pdl(previous)


def _operands(m=512, k=1024, n=2816):
    a = torch.randn(m, k, dtype=torch.bfloat16)
    return a, torch.randn(n, k, dtype=torch.bfloat16).t()


def test_the_switch_gives_the_rules_configs_pdl_and_leaves_a_callers_config_alone(launched):
    from parallel_mlp.kernels import ops

    a, b = _operands()
    ops.set_pdl(False)
    ops.gemm(a, b, checked=True)
    ops.set_pdl(True)
    ops.gemm(a, b, checked=True)  # the plan of the same shape, made again
    ops.gemm_act(a, b, "gelu_tanh_approx", checked=True)
    mine = GemmConfig(128, 128)
    ops.gemm(a, b, config=mine, checked=True)
    ops.set_pdl(False)
    ops.gemm(a, b, checked=True)
    pdl = [k.config.pdl for k in launched]
    assert pdl == [False, True, True, False, False]
    assert launched[3].config == mine
    # the rule's config otherwise: only the option differs
    assert launched[1].config.key == launched[0].config.key + "_pdl"


def test_set_pdl_returns_the_previous_setting_and_refuses_a_non_bool():
    from parallel_mlp.kernels import ops

    previous = ops.set_pdl(True)
    try:
        assert ops.set_pdl(True) is True and ops.pdl_launches() is True
        with pytest.raises(ValueError, match=r"set_pdl\(on=1\): must be True or False"):
            ops.set_pdl(1)
        assert ops.pdl_launches() is True
    finally:
        ops.set_pdl(previous)


@pytest.mark.parametrize("value,expected", [(None, False), ("0", False), ("1", True), (" 1 ", True), ("", False)])
def test_the_environment_switch(value, expected, monkeypatch):
    from parallel_mlp.kernels import ops

    if value is None:
        monkeypatch.delenv(ops.PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(ops.PDL_ENV, value)
    assert ops.pdl_by_env() is expected


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_the_environment_switch_refuses_other_values(value, monkeypatch):
    from parallel_mlp.kernels import ops

    monkeypatch.setenv(ops.PDL_ENV, value)
    with pytest.raises(ValueError, match=f"PARALLEL_MLP_PDL={value!r}: must be 0 or 1"):
        ops.pdl_by_env()


def test_warmup_compiles_what_the_switch_launches():
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.warmup import mlp_keys

    previous = ops.set_pdl(False)
    try:
        off = mlp_keys(512, 1024, 2816, "swiglu")
        ops.set_pdl(True)
        on = mlp_keys(512, 1024, 2816, "swiglu")
    finally:
        ops.set_pdl(previous)
    assert not any(k.config.pdl for k in off) and all(k.config.pdl for k in on)
    assert [k.config.key + "_pdl" for k in off] == [k.config.key for k in on]
