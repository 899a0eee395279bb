"""ParallelMLP on CUDA: the cute backend against the torch backend and the fp64 reference, and
the TP layer on real NCCL groups. Skipped without a GPU (the `gpu` marker)."""

import pytest
import torch

import reference
from dist_utils import run_distributed
from layer_steps import mlp_and_batch
from numerics import assert_design_tolerance
from parallel_mlp import ParallelMLP
from parallel_mlp.backends import CuteBackend

pytestmark = pytest.mark.gpu

# Tails everywhere: 1000 tokens, K of 1000 (fc1) and of h (fc2), small out_features.
TOKENS, D, H, D_OUT = 1000, 1000, 1000, 136


def cute_reason():
    if not torch.cuda.is_available():
        return "no CUDA"
    t = torch.empty(8, 8, device="cuda", dtype=torch.bfloat16)
    return CuteBackend.unsupported_reason(t)


def needs_cute():
    reason = cute_reason()
    if reason is not None:
        pytest.skip(f"cute backend unavailable: {reason}")


def make(activation, backend, dtype, recompute=False, fuse=False, seed=0, bias=True):
    torch.manual_seed(seed)
    return ParallelMLP(D, H, D_OUT, activation=activation, bias1=bias, bias2=bias,
                       recompute=recompute, fuse_grad_accum=fuse, backend=backend,
                       device="cuda", dtype=dtype)


def fwd_bwd(mlp, x, dy):
    x = x.detach().clone().requires_grad_()
    y = mlp(x)
    y.backward(dy)
    return dict(y=y.detach(), x=x.grad, w1=mlp.fc1.weight.grad, w2=mlp.fc2.weight.grad,
                b1=mlp.fc1.bias.grad if mlp.fc1.bias is not None else None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation", reference.NAMES)
def test_cute_matches_reference_within_design_tolerance(activation, dtype):
    needs_cute()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(TOKENS, D, device="cuda", generator=g).to(dtype)
    dy = torch.randn(TOKENS, D_OUT, device="cuda", generator=g).to(dtype)
    mlp = make(activation, "cute", dtype)
    ours = fwd_bwd(mlp, x, dy)
    weights = (mlp.fc1.weight, mlp.fc2.weight, activation, mlp.fc1.bias, mlp.fc2.bias)
    ref_y, ref = reference.mlp_with_grads(x, *weights, dy=dy)
    torch_y, theirs = reference.mlp_with_grads(x, *weights, dy=dy, dtype=dtype)
    ref, theirs = dict(ref, y=ref_y), dict(theirs, y=torch_y)
    for key in ("y", "x", "w1", "w2", "b1"):
        assert_design_tolerance(f"{activation} {dtype} {key}", ours[key], theirs[key], ref[key])
    # and the torch backend on the same GPU passes the same rule
    ours_torch = fwd_bwd(make(activation, "torch", dtype), x, dy)
    for key in ("y", "x", "w1", "w2"):
        assert_design_tolerance(f"torch backend {key}", ours_torch[key], theirs[key], ref[key])


def _fused(y) -> bool:
    return type(y.grad_fn).__name__.startswith("ParallelMLPFunction")


# 1000 tokens (one per input feature): gated fc1 as one GEMM, the activation LeanGatedPairs;
# 3001 (over 3 per input feature): as two GEMMs, the activation LeanGatedProduct.
@pytest.mark.parametrize("activation,tokens", [("swiglu", TOKENS), ("gelu_tanh_approx", TOKENS),
                                               ("swiglu", 3001)])
def test_auto_runs_a_small_step_as_plain_ops_within_tolerance(activation, tokens):
    """backend='auto' at 13-40 GFLOP per step takes the small step (small_step.py), which passes
    the design's numerics rule; asked for main-grad fusion or recompute, or at 1.6-2.5 TFLOP, it
    keeps the fused function."""
    needs_cute()
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(tokens, D, device="cuda", generator=g).bfloat16()
    dy = torch.randn(tokens, D_OUT, device="cuda", generator=g).bfloat16()
    mlp = make(activation, "auto", torch.bfloat16)
    assert not _fused(mlp(x))
    ours = fwd_bwd(mlp, x, dy)
    weights = (mlp.fc1.weight, mlp.fc2.weight, activation, mlp.fc1.bias, mlp.fc2.bias)
    ref_y, ref = reference.mlp_with_grads(x, *weights, dy=dy)
    torch_y, theirs = reference.mlp_with_grads(x, *weights, dy=dy, dtype=torch.bfloat16)
    ref, theirs = dict(ref, y=ref_y), dict(theirs, y=torch_y)
    for key in ("y", "x", "w1", "w2", "b1"):
        assert_design_tolerance(f"{activation} small step {key}", ours[key], theirs[key], ref[key])
    for kw in (dict(fuse=True), dict(recompute=True)):
        assert _fused(make(activation, "auto", torch.bfloat16, **kw)(x))
    big = ParallelMLP(4096, 4096, activation=activation, device="cuda", dtype=torch.bfloat16)
    assert _fused(big(torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)))



@pytest.mark.parametrize("activation", ["swiglu", "gelu_tanh_approx"])
def test_auto_runs_the_small_plain_gemms_on_cublas_within_tolerance(activation, monkeypatch):
    """On the fused path (here: main-grad fusion, with and without recompute) ``auto`` runs fc2,
    dx and the wgrads on cuBLAS where backends.cublas_runs says (16-64 tiles here, its FLOP
    floor lifted for a test this small) and the fused ops on ours; recompute's replay of fc1
    (no b1: a plain GEMM) stays on ours, so recompute still gives the default mode's bits; every
    gradient within the design's rule."""
    needs_cute()
    from parallel_mlp import backends

    monkeypatch.setattr(backends, "CUBLAS_MIN_FLOP", 0)

    calls = []
    real_mm, real_acc = torch.mm, backends._accumulate_fp32
    monkeypatch.setattr(torch, "mm", lambda *a, **kw: calls.append("mm") or real_mm(*a, **kw))
    monkeypatch.setattr(backends, "_accumulate_fp32",
                        lambda *a: calls.append("acc") or real_acc(*a))
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(TOKENS, D, device="cuda", generator=g).bfloat16()
    dy = torch.randn(TOKENS, D_OUT, device="cuda", generator=g).bfloat16()
    runs = {}
    for recompute in (False, True):
        mlp = make(activation, "auto", torch.bfloat16, recompute=recompute, fuse=True, bias=False)
        for p in (mlp.fc1.weight, mlp.fc2.weight):
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
        xg = x.detach().clone().requires_grad_()
        y = mlp(xg)
        assert _fused(y)
        y.backward(dy)
        runs[recompute] = dict(y=y.detach(), x=xg.grad, w1=mlp.fc1.weight.main_grad,
                               w2=mlp.fc2.weight.main_grad)
    assert sorted(calls) == ["acc"] * 4 + ["mm"] * 4  # per step: fc2, dx; dW2, dW1 accumulated
    for key in runs[False]:
        assert torch.equal(runs[False][key], runs[True][key]), f"{key}: recompute differs"
    weights = (mlp.fc1.weight, mlp.fc2.weight, activation)
    ref_y, ref = reference.mlp_with_grads(x, *weights, dy=dy)
    torch_y, theirs = reference.mlp_with_grads(x, *weights, dy=dy, dtype=torch.bfloat16)
    ref, theirs = dict(ref, y=ref_y), dict(theirs, y=torch_y)
    for key in ("y", "x", "w1", "w2"):
        assert_design_tolerance(f"{activation} auto {key}", runs[True][key], theirs[key], ref[key])

# Shapes whose default configs run stream-K: the wgrads at T=65536 d=1024 h=1024 share their K
# over an under-filled grid (16 tile clusters on 66, 4.1 ways); fc2 and dx at T=2304 d=4096
# h=7168 split a partial last wave (12 of 66 clusters, 5.5 ways). Every gradient, not y and dx
# alone, against the fp64 reference.
@pytest.mark.parametrize("tokens,d,h,activation", [(65536, 1024, 1024, "gelu_tanh_approx"),
                                                   (2304, 4096, 7168, "swiglu")])
def test_stream_k_shapes_give_the_reference_gradients(tokens, d, h, activation):
    needs_cute()
    from parallel_mlp.bench.models import fc1_features
    from parallel_mlp.kernels.config import default_config

    f = fc1_features(activation, h)
    gemms = [(tokens, d, h, "store"), (tokens, d, f, "store"), (d, h, tokens, "accumulate"),
             (f, d, tokens, "accumulate")]
    assert any(default_config(*g[:3], num_sms=132, kind=g[3]).stream_k for g in gemms)
    g = torch.Generator(device="cuda").manual_seed(4)
    torch.manual_seed(4)
    mlp = ParallelMLP(d, h, activation=activation, backend="cute", device="cuda",
                      dtype=torch.bfloat16)
    x = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    dy = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    ours = fwd_bwd(mlp, x, dy)
    weights = (mlp.fc1.weight, mlp.fc2.weight, activation)
    ref_y, ref = reference.mlp_with_grads(x, *weights, dy=dy)
    torch_y, theirs = reference.mlp_with_grads(x, *weights, dy=dy, dtype=torch.bfloat16)
    ref, theirs = dict(ref, y=ref_y), dict(theirs, y=torch_y)
    for key in ("y", "x", "w1", "w2"):
        assert_design_tolerance(f"{activation} T={tokens} {key}", ours[key], theirs[key], ref[key])


# Without b1 the recompute replays fc1 as a plain GEMM (with b1: gemm_act); either must give
# forward's preact bits.
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ["swiglu", "gelu_tanh_approx"])
def test_cute_recompute_is_bitwise_default_and_deterministic(activation, bias):
    needs_cute()
    x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(TOKENS, D_OUT, device="cuda", dtype=torch.bfloat16)
    default = fwd_bwd(make(activation, "cute", torch.bfloat16, bias=bias), x, dy)
    again = fwd_bwd(make(activation, "cute", torch.bfloat16, bias=bias), x, dy)
    recomputed = fwd_bwd(make(activation, "cute", torch.bfloat16, recompute=True, bias=bias), x, dy)
    for key in default:
        if default[key] is None:
            continue
        assert torch.equal(default[key], again[key]), f"{key}: not deterministic"
        assert torch.equal(default[key], recomputed[key]), f"{key}: recompute differs"


def test_cute_main_grad_accumulation_matches_torch():
    needs_cute()
    mlps = {b: make("swiglu", b, torch.bfloat16, fuse=True) for b in ("cute", "torch")}
    for mlp in mlps.values():
        for p in (mlp.fc1.weight, mlp.fc2.weight):
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
            p.grad_added_to_main_grad = False
    for _ in range(3):
        x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(TOKENS, D_OUT, device="cuda", dtype=torch.bfloat16)
        for mlp in mlps.values():
            mlp(x).backward(dy)
    for name in ("fc1", "fc2"):
        got = getattr(mlps["cute"], name).weight.main_grad
        want = getattr(mlps["torch"], name).weight.main_grad
        assert getattr(mlps["cute"], name).weight.grad_added_to_main_grad
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def tp_bf16_matches_reference(rank, world, device, sequence_parallel=False):
    """Also run on CPU/gloo by test_layer.py, so this body is exercised without GPUs. With
    sequence_parallel, each rank feeds its block of the 300 tokens and gets its block back."""
    d, h, tokens = 256, 512, 300
    torch.manual_seed(0)
    mlp = ParallelMLP(d, h, activation="swiglu", bias1=True, bias2=True, device=device,
                      dtype=torch.bfloat16, sequence_parallel=sequence_parallel)
    full = mlp.full_state_dict()
    x = torch.randn(tokens, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, d, device=device, dtype=torch.bfloat16)
    mine = slice(rank * tokens // world, (rank + 1) * tokens // world) if sequence_parallel else slice(None)
    xs = x.detach()[mine].requires_grad_()
    y = mlp(xs)
    y.backward(dy[mine])
    weights = (full["fc1.weight"], full["fc2.weight"], "swiglu", full["fc1.bias"], full["fc2.bias"])
    ref_y, ref = reference.mlp_with_grads(x, *weights, dy=dy)
    bf_y, bf = reference.mlp_with_grads(x, *weights, dy=dy, dtype=torch.bfloat16)
    rows, cols = 2 * h // world, h // world
    assert_design_tolerance("y", y, bf_y[mine], ref_y[mine])
    assert_design_tolerance("dx", xs.grad, bf["x"][mine], ref["x"][mine])
    sl1, sl2 = slice(rank * rows, (rank + 1) * rows), slice(rank * cols, (rank + 1) * cols)
    assert_design_tolerance("dW1", mlp.fc1.weight.grad, bf["w1"][sl1], ref["w1"][sl1])
    assert_design_tolerance("dW2", mlp.fc2.weight.grad, bf["w2"][:, sl2], ref["w2"][:, sl2])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL")
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp2_on_nccl_matches_reference(sequence_parallel):
    run_distributed(2, tp_bf16_matches_reference, "cuda", sequence_parallel, backend="nccl")


def overlap_equals_plain(rank, world, device):
    """tp_comm_overlap on NCCL: the overlapped layer's output and gradients against the plain
    layer's, in both TP modes, default and recompute. The GEMMs give the same bits block by
    block; the collectives sum in another order, so bf16 outputs agree to that sum's rounding."""
    torch.manual_seed(0)
    d, h, tokens = 512, 1024, 1024
    x = torch.randn(tokens, d, device=device, dtype=torch.bfloat16)
    dy = torch.randn(tokens, d, device=device, dtype=torch.bfloat16)
    for sp in (False, True):
        mine = slice(rank * tokens // world, (rank + 1) * tokens // world) if sp else slice(None)
        for recompute in (False, True):
            runs = []
            for overlap in (False, "auto"):
                torch.manual_seed(1)
                mlp = ParallelMLP(d, h, activation="swiglu", bias1=True, bias2=True,
                                  sequence_parallel=sp, recompute=recompute, tp_comm_overlap=overlap,
                                  device=device, dtype=torch.bfloat16)
                xs = x[mine].clone().requires_grad_()
                y = mlp(xs)
                y.backward(dy[mine])
                runs.append([y.detach(), xs.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad])
            for name, a, b in zip(("y", "dx", "dW1", "dW2"), *runs):
                torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2 * b.abs().max().item(),
                                           msg=lambda m: f"sp={sp} recompute={recompute} {name}: {m}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL")
def test_tp2_overlap_on_nccl_equals_plain():
    run_distributed(2, overlap_equals_plain, "cuda", backend="nccl")


def _step_peak_over_start(model, x, dy):
    """Bytes a training step (fresh grads, dx) allocates above what is resident before it, after
    the steps that make the one-time buffers (kernels, cuBLAS's workspace; the launch groups'
    graphs and their workspace buffer, captured at a group's second sighting)."""
    from parallel_mlp.bench.models import clear_grads, train_step
    from parallel_mlp.launch_graphs import GRAPHS

    for _ in range(4):
        train_step(model, x, dy)
        clear_grads(model, [x])
    torch.cuda.synchronize()
    captures = GRAPHS.stats["captures"]
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    train_step(model, x, dy)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    clear_grads(model, [x])
    assert GRAPHS.stats["captures"] == captures, "the measured step still captured"
    return peak


# Shapes where one of dx and dW1 runs stream-K (a 16.5 MiB fp32 workspace at 128x256 tiles): dW1
# at the first two, where with dx computed first the step peaked 14.5 and 15.5 MiB above eager's,
# and dx at the third, 16 MB above eager's with dW1 first (bench sweep on an H200, 2026-12-01);
# the GEMM with the workspace now runs first.
@pytest.mark.parametrize("tokens,d,h,activation", [(8192, 4096, 1376, "swiglu"),
                                                   (16384, 5120, 2560, "gelu_tanh_approx"),
                                                   (1000, 5120, 10240, "gelu_tanh_approx")])
def test_step_peak_is_at_most_eagers(tokens, d, h, activation):
    needs_cute()
    from parallel_mlp.bench.models import EagerMLP, build_parallel_mlp, chunked_w1

    gated = reference.is_gated(activation)
    g = torch.Generator(device="cuda").manual_seed(3)
    w1 = torch.randn((2 if gated else 1) * h, d, device="cuda", generator=g).bfloat16() / d**0.5
    w2 = torch.randn(d, h, device="cuda", generator=g).bfloat16() / h**0.5
    x = torch.randn(tokens, d, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    eager = _step_peak_over_start(EagerMLP(chunked_w1(w1, gated), w2.clone(), activation), x, dy)
    ours = _step_peak_over_start(build_parallel_mlp(w1, w2, activation, h, backend="cute"), x, dy)
    assert ours <= eager, f"ours peaks {ours / 2**20:.1f} MiB over start, eager {eager / 2**20:.1f} MiB"


@pytest.mark.parametrize("recompute,main_grad", [(False, True), (True, True), (False, False)])
def test_cuda_graph_replays_give_the_uncaptured_bits(recompute, main_grad):
    """Under torch.cuda.make_graphed_callables (how Megatron and Transformer Engine take the host
    out of small steps), each replay of the captured fwd+bwd gives the bits of an uncaptured call;
    with Megatron's main_grad, the fused accumulation adds up over the replays as over plain
    calls (and the weights' returned grads are its dummies, as Megatron's DDP expects)."""
    needs_cute()
    plain = make("swiglu", "cute", torch.bfloat16, recompute=recompute, fuse=main_grad, seed=5)
    captured = make("swiglu", "cute", torch.bfloat16, recompute=recompute, fuse=main_grad, seed=5)
    weights = ("fc1", "fc2")
    if main_grad:
        for mlp in (plain, captured):
            for name in weights:
                p = getattr(mlp, name).weight
                p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
                p.grad_added_to_main_grad = False
    sample = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(captured, (sample,))  # captured, forward swapped
    if main_grad:
        for name in weights:  # the capture's warmup calls accumulated into it; keep its address
            getattr(captured, name).weight.main_grad.zero_()
    g = torch.Generator(device="cuda").manual_seed(6)
    for step in range(3):
        x = torch.randn(TOKENS, D, device="cuda", generator=g).bfloat16()
        dy = torch.randn(TOKENS, D_OUT, device="cuda", generator=g).bfloat16()
        got, want = {}, {}
        for mlp, out in ((plain, want), (graphed, got)):
            mlp.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            y = mlp(xi)
            y.backward(dy)
            # copied at once: a replay's outputs live in the graph's static buffers
            out.update(y=y.detach().clone(), x=xi.grad.clone(), b1=mlp.fc1.bias.grad.clone(),
                       b2=mlp.fc2.bias.grad.clone())
            if not main_grad:
                out.update({name: getattr(mlp, name).weight.grad.clone() for name in weights})
        for key in want:
            assert torch.equal(got[key], want[key]), f"step {step}: {key} differs from the uncaptured call"
    for name in weights if main_grad else ():
        assert torch.equal(getattr(captured, name).weight.main_grad, getattr(plain, name).weight.main_grad), \
            f"{name}.main_grad: the replays' accumulation differs from the plain calls'"


@pytest.mark.gpu
def test_launch_graphs_refuse_a_capture_that_allocates():
    """A launch group that allocates while captured is refused, not replayed: the block would
    belong to whichever pool routes the thread's allocations (a caller's use_mem_pool first)."""
    needs_cute()
    from parallel_mlp.launch_graphs import _capture_cuda_graph

    with pytest.raises(RuntimeError, match="allocated device memory"):
        _capture_cuda_graph(lambda: torch.empty(1 << 20, device="cuda").fill_(1),
                            torch.device("cuda"))


@pytest.mark.gpu
def test_a_failed_capture_raises_its_cause_and_leaves_the_process_working():
    """A launch group whose capture fails raises what failed, and the process works after it:
    torch's capture_end raises before it takes down the capture's allocator routing and the
    CUDA RNG generators' capture mode when the capture was invalidated (here by destroying
    another CUDA graph inside it, which a garbage collection can do, and by a synchronize);
    left so, every later random op failed and leaving a caller's use_mem_pool aborted the
    process. Run in a process of its own, so that an abort fails this test alone."""
    needs_cute()
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _FAILED_CAPTURES], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.split()[-1:] == ["ok"], \
        f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"


_FAILED_CAPTURES = """
import torch
from parallel_mlp.launch_graphs import _capture_cuda_graph

x = torch.zeros(256, device="cuda")


def still_works():
    torch.rand(4, device="cuda")  # raised "Offset increment outside graph capture" before
    with torch.cuda.use_mem_pool(torch.cuda.MemPool()):  # leaving it aborted before
        torch.ones(1 << 20, device="cuda").sum().item()
    graph = _capture_cuda_graph(lambda: x.add_(1), torch.device("cuda"))
    graph.replay()
    torch.cuda.synchronize()


def fails(launches, message):
    try:
        _capture_cuda_graph(launches, torch.device("cuda"))
    except RuntimeError as e:
        assert message in str(e), e
    else:
        raise AssertionError("the capture did not fail")


other = torch.cuda.CUDAGraph()
with torch.cuda.stream(torch.cuda.Stream()):
    other.capture_begin()
    x.add_(1)
    other.capture_end()
held = [other]
del other


def destroy_a_graph():
    held.clear()
    x.mul_(2)


def synchronize():
    x.mul_(2)
    torch.cuda.synchronize()


fails(destroy_a_graph, "capture")
still_works()
fails(synchronize, "not permitted when stream is capturing")
still_works()
print("ok")
"""


@pytest.mark.gpu
def test_launch_graphs_capture_with_the_garbage_collector_paused():
    needs_cute()
    import gc

    from parallel_mlp.launch_graphs import _capture_cuda_graph

    x = torch.zeros(256, device="cuda")
    seen = []
    graph = _capture_cuda_graph(lambda: (seen.append(gc.isenabled()), x.add_(1)),
                                torch.device("cuda"))
    graph.replay()
    assert seen == [False] and gc.isenabled()
    assert torch.equal(x, torch.ones_like(x))


# Shapes of host-bound fused steps (each GEMM's plan differs: 128x64 and 128x192 tiles, stream-K
# and the dynamic scheduler among them) with tails in M and K, on the path users get ("auto":
# the fused kernels at T=8192 d=1024; "cute" where auto would take the small step).
@pytest.mark.parametrize("tokens,d,h,activation,backend", [
    (8192, 1024, 2816, "swiglu", "auto"), (1000, 1000, 1000, "swiglu", "cute"),
    (4096, 1024, 4096, "gelu_tanh_approx", "cute"), (512, 8192, 2752, "swiglu", "cute")])
@pytest.mark.parametrize("mode", ["default", "recompute", "main_grad"])
def test_launch_graphs_replay_the_launches_bits(tokens, d, h, activation, backend, mode):
    """The fused function's launch groups replayed from CUDA graphs (launch_graphs.GRAPHS) give
    the bits of the same launches run one by one, fresh grads or fp32 main grads accumulated in
    place, and the step peaks no higher."""
    needs_cute()
    from parallel_mlp.launch_graphs import GRAPHS

    def steps(enabled):
        GRAPHS.clear()
        GRAPHS.enabled = enabled
        mlp, params, x, dy = mlp_and_batch(tokens, d, h, activation, backend, mode)
        peaks, captures = [], []
        # Plain, captured, then replays: the same function of x, W and dy. A capture can move
        # the next step's addresses (the workspace buffer it makes), so a few steps capture.
        for _ in range(8):
            for p in params + [x]:
                p.grad = None
                if mode == "main_grad" and p is not x:
                    p.main_grad.zero_()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_stats()["requested_bytes.all.current"]
            y = mlp(x)
            y.backward(dy)
            torch.cuda.synchronize()
            # what the tensors asked for: the caching allocator's rounding of the same requests
            # moves with its history (0.9 MiB at T=1000 d=1000 between two launch-by-launch runs)
            peaks.append(torch.cuda.memory_stats()["requested_bytes.all.peak"] - before)
            captures.append(GRAPHS.stats["captures"])
            del y
        assert not enabled or captures[-1] == captures[-2], "the last step still captured"
        grads = [x.grad] + [p.main_grad if mode == "main_grad" else p.grad for p in params]
        return [t.clone() for t in grads], mlp(x).detach(), peaks[-1], dict(GRAPHS.stats)

    enabled = GRAPHS.enabled
    try:
        on_grads, on_y, on_peak, stats = steps(True)
        off_grads, off_y, off_peak, off_stats = steps(False)
        # After every graph was dropped, and under a pool of the caller's that takes this
        # thread's allocations (nothing captured may allocate: the capture would fail).
        with torch.cuda.use_mem_pool(torch.cuda.MemPool()):
            pooled_grads, pooled_y, _, again = steps(True)
    finally:
        GRAPHS.enabled = enabled
        GRAPHS.clear()
    for run in (stats, again):
        assert run.get("replays", 0) >= 3 * 4 and not run.get("capture failures"), run
    assert not off_stats.get("replays"), off_stats
    assert torch.equal(on_y, off_y) and torch.equal(pooled_y, off_y)
    for name, a, b, c in zip(("dx", "dW1", "dW2"), on_grads, off_grads, pooled_grads):
        assert torch.equal(a, b), f"{name} replayed from graphs differs from the plain launches"
        assert torch.equal(c, b), f"{name} replayed under the caller's pool differs"
    assert on_peak <= off_peak, f"graphs: step peak {on_peak / 2**20:.1f} MiB, plain {off_peak / 2**20:.1f}"


@pytest.mark.parametrize("mode", ["default", "recompute"])
def test_a_3d_input_gives_the_2d_inputs_bits_through_launch_groups(mode):
    """x of shape [s, b, d] (Megatron's and Nanotron's layout) through the fused function's launch
    groups, replayed after the first steps: y (made in x's shape, not a view), dx and both weight
    gradients equal those of the same rows given as [s * b, d], bit for bit."""
    needs_cute()
    from parallel_mlp.launch_graphs import GRAPHS

    s, b, d, h = 250, 4, 1024, 2816
    torch.manual_seed(3)
    mlp = ParallelMLP(d, h, activation="swiglu", recompute=mode == "recompute", backend="cute",
                      device="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(s, b, d, device="cuda", generator=g).bfloat16()
    dy = torch.randn(s, b, d, device="cuda", generator=g).bfloat16()

    def step(x_in, dy_in):
        for _ in range(4):  # plain, captured, then replayed
            mlp.zero_grad(set_to_none=True)
            x_in = x_in.detach().requires_grad_()
            y = mlp(x_in)
            y.backward(dy_in)
        return y.detach(), x_in.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad, y._is_view()

    replays = GRAPHS.stats["replays"]
    y3, dx3, dw1_3, dw2_3, is_view = step(x, dy)
    assert GRAPHS.stats["replays"] > replays and not is_view
    y2, dx2, dw1_2, dw2_2, _ = step(x.view(s * b, d), dy.view(s * b, d))
    assert y3.shape == (s, b, d) and dx3.shape == (s, b, d)
    assert torch.equal(y3.view(s * b, d), y2) and torch.equal(dx3.view(s * b, d), dx2)
    assert torch.equal(dw1_3, dw1_2) and torch.equal(dw2_3, dw2_2)
