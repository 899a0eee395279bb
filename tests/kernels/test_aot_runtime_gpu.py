"""Kernels launched through the DSL's C runtime (kernels/aot_runtime.py) on an sm_90 GPU: bitwise
the same outputs as the same kernel launched by the DSL that compiled it, for every kind of
argument list (row/col-major, padded strides, tails, bias, gated preact/dpreact, fp32
accumulate with the dynamic scheduler's counter); and a new process that finds its kernels in the
disk cache runs them without importing the DSL."""

import os
import subprocess
import sys

import pytest
import torch

requires_sm90 = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs an sm_90 GPU (H100/H200)",
)

pytestmark = [pytest.mark.gpu, requires_sm90]


def operand(rows, cols, major="row", pad=0, dtype=torch.bfloat16, scale=1.0):
    """(rows, cols) on the GPU, row- or column-major, `pad` extra elements per leading stride."""
    if major == "row":
        t = torch.randn(rows, cols + pad, device="cuda")[:, :cols]
    else:
        t = torch.randn(cols, rows + pad, device="cuda")[:, :rows].t()
    return (t * scale).to(dtype)


def cases():
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    x = operand(1000, 520, "row", pad=8, scale=520 ** -0.5)
    xc = operand(1000, 520, "col", pad=16, scale=520 ** -0.5)
    w = operand(520, 264, "col")  # a transposed weight view: (N, K) row-major
    wg = operand(520, 528, "col")  # gated: interleaved (gate, up) columns
    bias = torch.randn(528, device="cuda").to(torch.bfloat16)
    dy = operand(1000, 520, scale=520 ** -0.5)
    w2 = operand(520, 264, "row")
    pre = operand(1000, 528)
    main_grad = torch.randn(520, 520, device="cuda")
    dynamic = GemmConfig(128, 128, scheduler="dynamic")
    return {
        "gemm": lambda: (ops.gemm(x, w),),
        "gemm_col_a_fp32": lambda: (ops.gemm(xc, w, out_dtype=torch.float32),),
        "gemm_m1": lambda: (ops.gemm(x[:1], w),),
        "act_swiglu_bias": lambda: ops.gemm_act(x, wg, "swiglu", bias=bias),
        "act_gelu_no_preact": lambda: ops.gemm_act(x, w, "gelu_tanh_approx", store_preact=False)[1:],
        "dact_swiglu": lambda: ops.gemm_dact(dy, w2, pre, "swiglu"),
        # a wgrad: x.T @ dy into an fp32 main grad (a column-major, b row-major)
        "accumulate_dynamic": lambda: (ops.gemm(x.t(), dy, out=main_grad.clone(), accumulate=True, config=dynamic),),
    }


def forget_loaded_kernels():
    """Empty the kernel table and the ops' launch plans: a plan holds the function it launched,
    so a launch of a shape seen before would reuse the DSL's function and never reach the cache."""
    from parallel_mlp.kernels import compile as kc
    from parallel_mlp.kernels import ops

    kc._memory.clear()
    ops._plans.clear()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    from parallel_mlp.kernels import compile as kc
    from parallel_mlp.kernels import ops

    monkeypatch.setenv("PARALLEL_MLP_CACHE_DIR", str(tmp_path))
    saved, saved_plans = dict(kc._memory), dict(ops._plans)
    forget_loaded_kernels()
    yield tmp_path
    forget_loaded_kernels()
    kc._memory.update(saved)
    ops._plans.update(saved_plans)


def test_c_runtime_launch_is_bitwise_the_dsl_launch(fresh_cache):
    from parallel_mlp.kernels import aot_runtime
    from parallel_mlp.kernels import compile as kc

    assert aot_runtime.available()
    torch.manual_seed(0)
    ops_by_name = cases()
    by_dsl = {name: [t.clone() for t in run() if t is not None] for name, run in ops_by_name.items()}
    compiled = dict(kc._memory)
    assert compiled and not any(isinstance(f, aot_runtime.LoadedKernel) for f in compiled.values())
    forget_loaded_kernels()  # now every kernel comes from the disk cache, through the C runtime
    by_c = {name: [t.clone() for t in run() if t is not None] for name, run in ops_by_name.items()}
    assert set(kc._memory) == set(compiled)
    assert all(isinstance(f, aot_runtime.LoadedKernel) for f in kc._memory.values())
    torch.cuda.synchronize()
    for name in ops_by_name:
        for i, (a, b) in enumerate(zip(by_dsl[name], by_c[name])):
            assert torch.isfinite(a.float()).all(), f"{name} output {i}: non-finite"
            assert torch.equal(a, b), f"{name} output {i}: C runtime launch differs from the DSL's"


def test_a_new_process_runs_cached_kernels_without_importing_the_dsl(fresh_cache):
    from parallel_mlp.kernels import ops

    a = operand(1000, 520, scale=520 ** -0.5)
    b = operand(520, 264, "col")
    ops.gemm(a, b)  # compiles and exports into the fresh cache
    code = (
        "import sys, torch\n"
        "from parallel_mlp.kernels import ops\n"
        "torch.manual_seed(1)\n"
        "a = (torch.randn(1000, 520, device='cuda') * 520 ** -0.5).to(torch.bfloat16)\n"
        "b = torch.randn(264, 520, device='cuda').to(torch.bfloat16).t()\n"
        "out = ops.gemm(a, b)\n"
        "ref = a.float() @ b.float()\n"
        "err = (out.float() - ref).abs().max().item()\n"
        "base = ((a @ b).float() - ref).abs().max().item()\n"
        "assert err <= 2 * base + 1e-3 * ref.abs().max().item(), (err, base)\n"
        "print([m for m in sys.modules if m == 'cutlass' or m.startswith('cutlass.')])\n"
    )
    env = dict(os.environ, PARALLEL_MLP_CACHE_DIR=str(fresh_cache))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", "the DSL was imported"
