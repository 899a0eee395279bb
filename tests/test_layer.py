"""ParallelMLP as a module: sizes, partial gradients, leading dims, autocast, determinism, the
DESIGN.md bf16 tolerance, and a GPU/NCCL run when GPUs are there."""

import pytest
import torch

import reference
from dist_utils import run_distributed
from numerics import assert_design_tolerance
from parallel_mlp import ParallelMLP, parallel_mlp_func


def test_default_hidden_features_and_multiple_of():
    assert ParallelMLP(30).hidden_features == 120
    assert ParallelMLP(30, activation="swiglu").hidden_features == 80  # int(8/3 * 30)
    assert ParallelMLP(30, activation="swiglu", multiple_of=64).hidden_features == 128
    assert ParallelMLP(30, 100, multiple_of=32).hidden_features == 128
    mlp = ParallelMLP(30, 40, 12, activation="glu")
    assert mlp.fc1.weight.shape == (80, 30) and mlp.fc2.weight.shape == (12, 40)
    assert set(mlp.state_dict()) == {"fc1.weight", "fc2.weight"}
    assert set(ParallelMLP(4, bias1=True, bias2=True).state_dict()) == {
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


def test_meta_device_construction_skips_init():
    mlp = ParallelMLP(64, activation="swiglu", device="meta")
    assert mlp.fc1.weight.is_meta


def _grads(mlp, x):
    x = x.detach().clone().requires_grad_(x.requires_grad)
    mlp(x).square().sum().backward()
    return x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad


def test_forward_uses_a_parametrized_weight():
    """The forward reads its weights and biases from the shards' parameter tables where they are
    registered there; a parametrized weight or bias (torch.nn.utils.parametrize: a property, not a
    table entry) must still be what the forward uses."""
    from torch.nn.utils import parametrize

    class Halved(torch.nn.Module):
        def forward(self, w):
            return w / 2

    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, activation="swiglu", bias1=True, backend="torch")
    x = torch.randn(5, 16)
    w1, b1, w2 = (t.detach().clone() for t in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight))
    parametrize.register_parametrization(mlp.fc2, "weight", Halved())
    parametrize.register_parametrization(mlp.fc1, "bias", Halved())
    ref_y = reference.mlp(x.double(), w1.double(), (w2 / 2).double(), "swiglu",
                          (b1 / 2).double())
    torch.testing.assert_close(mlp(x), ref_y.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("frozen", ["fc1", "fc2", "both", "x"])
def test_partial_gradients(frozen):
    torch.manual_seed(0)
    full = ParallelMLP(12, 20, activation="swiglu", backend="torch")
    part = ParallelMLP(12, 20, activation="swiglu", backend="torch")
    part.load_state_dict(full.state_dict())
    x = torch.randn(5, 12, requires_grad=True)
    dx, dw1, dw2 = _grads(full, x)
    if frozen in ("fc1", "both"):
        part.fc1.weight.requires_grad_(False)
    if frozen in ("fc2", "both"):
        part.fc2.weight.requires_grad_(False)
    px, pw1, pw2 = _grads(part, x.detach().requires_grad_(frozen != "x"))
    assert (px is None) == (frozen == "x")
    assert (pw1 is None) == (frozen in ("fc1", "both"))
    assert (pw2 is None) == (frozen in ("fc2", "both"))
    for got, want in ((px, dx), (pw1, dw1), (pw2, dw2)):
        if got is not None:
            assert torch.equal(got, want)


@pytest.mark.parametrize("shape", [(12,), (2, 3, 4, 12), (0, 12)])
def test_any_leading_dims(shape):
    mlp = ParallelMLP(12, 16, 5, activation="relu_sq")
    x = torch.randn(shape, requires_grad=True)
    y = mlp(x)
    assert y.shape == shape[:-1] + (5,)
    y.sum().backward()
    assert x.grad.shape == x.shape
    ref = reference.mlp(x.detach().reshape(-1, 12), mlp.fc1.weight, mlp.fc2.weight, "relu_sq")
    torch.testing.assert_close(y.reshape(-1, 5), ref)


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("shape", [(12,), (2, 3, 12), (4, 12)])
def test_the_output_can_be_modified_in_place(shape, backend):
    """As nn.Linear's can (a residual added in place, an in-place dropout), whatever x's
    leading dims: the output is not a view autograd would guard."""
    torch.manual_seed(0)
    mlp = ParallelMLP(12, 16, activation="swiglu", backend=backend)
    x = torch.randn(shape, requires_grad=True)
    y = mlp(x)
    y += 1.0
    y.square().sum().backward()
    xr = x.detach().reshape(-1, 12)
    ref_y, ref_g = reference.mlp_with_grads(xr, mlp.fc1.weight, mlp.fc2.weight, "swiglu",
                                            dy=2 * (reference.mlp(xr.double(), mlp.fc1.weight.double(),
                                                                  mlp.fc2.weight.double(), "swiglu") + 1))
    torch.testing.assert_close(y.detach().reshape(-1, 12).double(), ref_y + 1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.reshape(-1, 12).double(), ref_g["x"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("shape", [(12,), (2, 3, 12), (4, 12)])
def test_an_input_edited_in_place_is_caught_at_backward(shape, backend):
    """As with nn.Linear: editing x in place after the forward is allowed until a backward needs
    the x it saved, and that backward raises torch's saved-tensor version error."""
    torch.manual_seed(0)
    mlp = ParallelMLP(12, 16, activation="swiglu", backend=backend)
    leaf = torch.randn(shape, requires_grad=True)
    x = leaf * 1.0
    y = mlp(x)
    x.add_(1.0)
    with torch.no_grad():
        x.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_float64_stays_float64_to_the_bias_gradients():
    """Every gradient of an fp64 layer, the bias sums too, at fp64's precision against torch's
    own fp64 ops."""
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, activation="gelu", bias1=True, bias2=True, backend="torch",
                      dtype=torch.float64)
    x = torch.randn(512, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(512, 16, dtype=torch.float64)
    mlp(x).backward(dy)
    params = [p.detach().clone().requires_grad_() for p in
              (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias)]
    w1, b1, w2, b2 = params
    torch.nn.functional.linear(torch.nn.functional.gelu(
        torch.nn.functional.linear(x.detach(), w1, b1)), w2, b2).backward(dy)
    for ours, want in zip((mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias), params):
        torch.testing.assert_close(ours.grad, want.grad, rtol=1e-12, atol=1e-12)


def test_autocast_leaves_float64_alone():
    """Autocast never casts float64, for F.linear or for this layer."""
    torch.manual_seed(0)
    mlp = ParallelMLP(8, 16, activation="swiglu", dtype=torch.float64)
    x = torch.randn(3, 8, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mlp(x)
    assert y.dtype == torch.float64
    ref = reference.mlp(x, mlp.fc1.weight.detach(), mlp.fc2.weight.detach(), "swiglu")
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)


def test_autocast_runs_in_bf16_and_returns_fp32_grads():
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, activation="swiglu", bias1=True)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mlp(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and mlp.fc1.weight.grad.dtype == torch.float32
    ref_y, ref_g = reference.mlp_with_grads(x, mlp.fc1.weight, mlp.fc2.weight, "swiglu",
                                            mlp.fc1.bias, None, torch.ones(4, 16))
    torch.testing.assert_close(y.double(), ref_y, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(mlp.fc1.weight.grad.double(), ref_g["w1"], rtol=5e-2, atol=5e-2)


def test_bitwise_deterministic_run_to_run():
    torch.manual_seed(0)
    mlp = ParallelMLP(24, 40, activation="geglu", dtype=torch.bfloat16)
    x = torch.randn(33, 24, dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        mlp.zero_grad()
        xi = x.clone().requires_grad_()
        y = mlp(xi)
        y.float().square().sum().backward()
        runs.append((y, xi.grad, mlp.fc1.weight.grad.clone(), mlp.fc2.weight.grad.clone()))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bias", [False, True])
def test_recompute_is_bitwise_default_with_and_without_bias(bias):
    """Without b1 the backward replays fc1 as a plain GEMM, with b1 as gemm_act: both must give
    forward's preact bits, so every output and gradient equals the default mode's."""
    x = torch.randn(37, 24, dtype=torch.bfloat16)
    dy = torch.randn(37, 24, dtype=torch.bfloat16)
    runs = []
    for recompute in (False, True):
        torch.manual_seed(0)
        mlp = ParallelMLP(24, 40, activation="swiglu", bias1=bias, recompute=recompute, dtype=torch.bfloat16)
        xi = x.clone().requires_grad_()
        y = mlp(xi)
        y.backward(dy)
        runs.append([y, xi.grad] + [p.grad for p in mlp.parameters()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def _bf16_tolerance_case(rank, world):
    """DESIGN.md numerics: ours in bf16 at TP=world is within 2x PyTorch's own bf16 error
    (plus a small slack) of the fp64 reference, for the output and every gradient."""
    for activation in reference.NAMES:
        g = torch.Generator().manual_seed(3)
        d, h, tokens = 64, 96, 77
        rows = (2 if reference.is_gated(activation) else 1) * h
        w1 = torch.randn(rows, d, generator=g) / d**0.5
        w2 = torch.randn(d, h, generator=g) / h**0.5
        x, dy = torch.randn(tokens, d, generator=g), torch.randn(tokens, d, generator=g)
        ref_y, ref = reference.mlp_with_grads(x, w1, w2, activation, dy=dy)
        torch_y, torch_g = reference.mlp_with_grads(x.bfloat16(), w1.bfloat16(), w2.bfloat16(),
                                                    activation, dy=dy.bfloat16(), dtype=torch.bfloat16)
        r, c = rows // world, h // world
        w1_r = w1[rank * r:(rank + 1) * r].bfloat16().requires_grad_()
        w2_r = w2[:, rank * c:(rank + 1) * c].bfloat16().requires_grad_()
        xb = x.bfloat16().requires_grad_()
        y = parallel_mlp_func(xb, w1_r, w2_r, activation)
        y.backward(dy.bfloat16())
        pairs = [("y", y, torch_y, ref_y), ("dx", xb.grad, torch_g["x"], ref["x"]),
                 ("dW1", w1_r.grad, torch_g["w1"][rank * r:(rank + 1) * r], ref["w1"][rank * r:(rank + 1) * r]),
                 ("dW2", w2_r.grad, torch_g["w2"][:, rank * c:(rank + 1) * c], ref["w2"][:, rank * c:(rank + 1) * c])]
        for name, ours, theirs, want in pairs:
            assert_design_tolerance(f"{activation} {name}", ours, theirs, want)


@pytest.mark.parametrize("world", [1, 2])
def test_bf16_within_design_tolerance(world):
    run_distributed(world, _bf16_tolerance_case)


def test_autocast_with_fused_main_grad_accumulates_fp32():
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, activation="reglu", fuse_grad_accum=True)
    for p in (mlp.fc1.weight, mlp.fc2.weight):
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)
    x = torch.randn(6, 16)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mlp(x).float().sum().backward()
    # no grad_added_to_main_grad attribute: nothing is handed to autograd, .grad stays None
    assert mlp.fc1.weight.grad is None and mlp.fc2.weight.grad is None
    _, ref = reference.mlp_with_grads(x, mlp.fc1.weight, mlp.fc2.weight, "reglu", dy=torch.ones(6, 16))
    torch.testing.assert_close(mlp.fc1.weight.main_grad.double(), 2 * ref["w1"], rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(mlp.fc2.weight.main_grad.double(), 2 * ref["w2"], rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp2_bf16_swiglu_with_biases_on_gloo(sequence_parallel):
    from test_layer_gpu import tp_bf16_matches_reference

    run_distributed(2, tp_bf16_matches_reference, "cpu", sequence_parallel)


@pytest.mark.parametrize("recompute", [False, True])
def test_double_backward_raises_a_clear_error(recompute):
    """The fused backward is not differentiable: taking gradients with create_graph=True works,
    but differentiating them again raises (it used to return wrong second derivatives)."""
    torch.manual_seed(0)
    mlp = ParallelMLP(8, 16, activation="swiglu", recompute=recompute, dtype=torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(mlp(x).square().sum(), x, create_graph=True)
    want = reference.mlp_with_grads(x, mlp.fc1.weight, mlp.fc2.weight, "swiglu",
                                    dy=2 * mlp(x).detach())[1]["x"]
    torch.testing.assert_close(gx.detach(), want)  # the first derivative is still right
    with pytest.raises(RuntimeError, match="fused MLP's backward is not differentiable"):
        gx.square().sum().backward()
    # an ordinary backward afterwards is unaffected
    mlp(x).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("bias", [False, True])
def test_the_function_applied_directly_is_torchs_apply(bias):
    """autograd.apply_function calls the C++ apply without torch's Python wrapper: the same
    outputs, the same gradients bit for bit, the same backward node, as
    ParallelMLPFunction.apply, with and without biases, whose gradients flow too."""
    from parallel_mlp.autograd import FunctionOptions, ParallelMLPFunction, apply_function
    from parallel_mlp.activations import get_activation
    from parallel_mlp.tp import TPGroup

    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    w1, w2 = torch.randn(32, 8, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    b1 = torch.randn(32, dtype=torch.float64) if bias else None
    b2 = torch.randn(8, dtype=torch.float64) if bias else None
    options = FunctionOptions(get_activation("swiglu"), TPGroup(None, 1, 0), False, False, "torch")
    results = []
    for apply in (ParallelMLPFunction.apply, apply_function):
        leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w1, b1, w2, b2)]
        y = apply(*leaves, options)
        assert type(y.grad_fn).__name__ == "ParallelMLPFunctionBackward"
        y.square().sum().backward()
        results.append([y.detach()] + [t.grad for t in leaves if t is not None])
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)
    y, grads = reference.mlp_with_grads(x, w1, w2, "swiglu", b1=b1, b2=b2, dy=2 * results[0][0])
    wants = [y] + [g for g in (grads[k] for k in ("x", "w1", "b1", "w2", "b2")) if g is not None]
    for got, want in zip(results[1], wants, strict=True):  # bias gradients sum in fp32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_without_the_c_apply_the_layer_takes_torchs_apply(monkeypatch):
    """Where torch lacks a part the direct apply needs, apply_function takes torch's apply, with
    the same values."""
    from parallel_mlp import autograd

    torch.manual_seed(0)
    mlp = ParallelMLP(8, 16, activation="swiglu", dtype=torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    grads = []
    for direct in (True, False):
        monkeypatch.setattr(autograd, "_DIRECT", direct)
        calls = []
        original = autograd.ParallelMLPFunction.apply
        monkeypatch.setattr(autograd.ParallelMLPFunction, "apply",
                            lambda *a: calls.append(1) or original(*a))
        x.grad = None
        mlp(x).square().sum().backward()
        assert calls == ([] if direct else [1])
        grads.append(x.grad.clone())
        monkeypatch.undo()
    assert torch.equal(grads[0], grads[1])


def test_under_a_functorch_transform_the_layer_raises_torchs_error():
    """Under torch.func transforms apply_function takes torch's own apply, which refuses an
    autograd.Function without setup_context with its error, as before; outside them the layer
    works again."""
    torch.manual_seed(0)
    mlp = ParallelMLP(8, 16, activation="swiglu", dtype=torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda x: mlp(x).sum())(x)
    want = reference.mlp(x, mlp.fc1.weight, mlp.fc2.weight, "swiglu")
    torch.testing.assert_close(mlp(x), want)


def test_backward_drops_preact_before_the_input_grad_gemms(monkeypatch):
    """Memory: the saved pre-activation (the largest tensor the layer keeps) is freed as soon as
    the dact has read it, so it is not alive beside dx and dW1 (eager autograd frees its own
    activation there too; keeping it put the step's peak a preact above eager's)."""
    import weakref

    from parallel_mlp import backends

    seen = {}
    dact, gemm = backends.TorchBackend.gemm_dact, backends.TorchBackend.gemm

    def spy_dact(a, b, preact, activation):
        seen["preact"] = weakref.ref(preact)
        return dact(a, b, preact, activation)

    def spy_gemm(a, b, out=None, out_dtype=None, accumulate=False):
        if "preact" in seen:  # after the dact: dW2, dx, dW1
            seen.setdefault("alive", []).append(seen["preact"]() is not None)
        return gemm(a, b, out=out, out_dtype=out_dtype, accumulate=accumulate)

    monkeypatch.setattr(backends.TorchBackend, "gemm_dact", staticmethod(spy_dact))
    monkeypatch.setattr(backends.TorchBackend, "gemm", staticmethod(spy_gemm))
    mlp = ParallelMLP(16, 32, activation="swiglu", backend="torch")
    mlp(torch.randn(9, 16, requires_grad=True)).sum().backward()
    assert seen["alive"] == [False, False, False]


def _weight_and_input_grad_order(tp_group=None, transient=None):
    """The GEMMs the backward runs after the dact, named by their outputs: "dW2" [d_out, h],
    "dW1" [2h, d_in], "dx" [T, d_in]. ``transient``: bytes of workspace each GEMM, by that name,
    says it allocates (the torch backend's say none)."""
    from parallel_mlp import backends

    tokens, d_in, hidden, d_out = 9, 16, 32, 12
    order, started = [], []
    dact, gemm = backends.TorchBackend.gemm_dact, backends.TorchBackend.gemm
    transient_bytes = backends.TorchBackend.transient_bytes
    if transient:
        def named_transient_bytes(m, n, k, device):
            return transient.get({tokens: "dx", d_out: "dW2"}.get(m, "dW1"), 0)

        backends.TorchBackend.transient_bytes = staticmethod(named_transient_bytes)

    def spy_dact(*args, **kw):
        started.append(True)
        return dact(*args, **kw)

    def spy_gemm(a, b, out=None, out_dtype=None, accumulate=False):
        if started:
            order.append({tokens: "dx", d_out: "dW2"}.get(a.shape[0], "dW1"))
        return gemm(a, b, out=out, out_dtype=out_dtype, accumulate=accumulate)

    backends.TorchBackend.gemm_dact = staticmethod(spy_dact)
    backends.TorchBackend.gemm = staticmethod(spy_gemm)
    try:
        mlp = ParallelMLP(d_in, hidden, d_out, activation="swiglu", backend="torch", tp_group=tp_group)
        mlp(torch.randn(tokens, d_in, requires_grad=True)).sum().backward()
    finally:
        backends.TorchBackend.gemm_dact, backends.TorchBackend.gemm = (staticmethod(dact),
                                                                       staticmethod(gemm))
        backends.TorchBackend.transient_bytes = staticmethod(transient_bytes)
    return order


def test_alone_dw1_runs_before_dx():
    """Memory, without a TP group: nothing needs dx early, so dW1 runs first and its transients
    (a stream-K GEMM's fp32 partial sums) are freed before dx exists; run after dx they added
    the workspace to the step's peak (15-17 MB above eager's at h=1376 and h=2560 on an H200)."""
    assert _weight_and_input_grad_order() == ["dW2", "dW1", "dx"]


def test_alone_the_gemm_with_the_larger_workspace_runs_first():
    """Memory, without a TP group: dx's stream-K workspace (T=1000, d=5120, gelu h=10240: 16.5
    MiB at dx, none at dW1) run after dW1 sat on top of dW1's 100 MB output and put the step's
    peak 16 MB above eager's; run first, it is freed before dW1 is made."""
    assert _weight_and_input_grad_order(transient={"dx": 2**24}) == ["dW2", "dx", "dW1"]
    assert _weight_and_input_grad_order(transient={"dx": 2**20, "dW1": 2**24}) == ["dW2", "dW1", "dx"]


def _order_at_tp2(rank, world):
    import torch.distributed as dist

    assert _weight_and_input_grad_order(dist.group.WORLD) == ["dW2", "dx", "dW1"]


def test_in_a_tp_group_dx_runs_first_so_its_all_reduce_hides_behind_dw1():
    run_distributed(2, _order_at_tp2)


def _grads_of(mlp, x, dy, backward=lambda y, dy: y.backward(dy)):
    x = x.detach().clone().requires_grad_()
    mlp.zero_grad(set_to_none=True)
    backward(mlp(x), dy)
    return [x.grad] + [p.grad for p in mlp.parameters()]


@pytest.mark.parametrize("recompute", [False, True])
def test_a_retained_graph_backs_up_twice_with_the_same_gradients(recompute):
    """The first backward frees the saved pre-activation; a second one over the retained graph
    replays fc1 for it and gives the same gradients again."""
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, 12, activation="swiglu", bias1=True, recompute=recompute, backend="torch")
    x, dy = torch.randn(9, 16), torch.randn(9, 12)
    once = _grads_of(mlp, x, dy)

    def twice(y, dy):
        y.backward(dy, retain_graph=True)
        y.backward(dy)

    for g1, g2 in zip(once, _grads_of(mlp, x, dy, twice)):
        torch.testing.assert_close(g2, 2 * g1)


def test_saved_tensor_hooks_see_the_pre_activation_and_checkpointing_matches():
    """Under saved-tensor hooks (save_on_cpu, non-reentrant checkpointing) the pre-activation is
    saved like the other tensors, so the hooks pack it, and the gradients are unchanged."""
    import torch.utils.checkpoint as cp

    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, 12, activation="geglu", backend="torch")
    x, dy = torch.randn(9, 16), torch.randn(9, 12)
    plain = _grads_of(mlp, x, dy)
    packed = []

    def pack(t):
        packed.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hooked = _grads_of(mlp, x, dy)
    assert (9, 64) in packed  # preact: [tokens, 2 * hidden]
    x2 = x.clone().requires_grad_()
    mlp.zero_grad(set_to_none=True)
    cp.checkpoint(mlp, x2, use_reentrant=False).backward(dy)
    checkpointed = [x2.grad] + [p.grad for p in mlp.parameters()]
    for a, b, c in zip(plain, hooked, checkpointed):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        torch.testing.assert_close(c, a, rtol=0, atol=0)


def test_backward_checks_only_dy_again_and_follows_it(monkeypatch):
    """Forward's choice of the CuTe path covered every operand but the incoming gradient: the
    backward checks dy alone (a share of a small step's host time), and with backend='auto'
    takes the torch path where dy cannot go the CuTe one."""
    from parallel_mlp import backends

    checked, ran = [], []

    def unsupported_reason(cls, *tensors):
        checked.append(tensors)
        dy_like = [t for t in tensors if isinstance(t, torch.Tensor) and getattr(t, "_not_for_cute", False)]
        return "dy is not for cute" if dy_like else None

    def delegate(name):
        def op(cls, *args, **kw):
            ran.append(("cute", name))
            kw.pop("whole_rows", None)
            return getattr(backends.TorchBackend, name)(*args, **kw)
        return classmethod(op)

    monkeypatch.setattr(backends.CuteBackend, "unsupported_reason", classmethod(unsupported_reason))
    for name in ("gemm", "gemm_act", "gemm_dact"):
        monkeypatch.setattr(backends.CuteBackend, name, delegate(name))
    monkeypatch.setattr(backends.CuteBackend, "transient_bytes", backends.TorchBackend.transient_bytes)
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, activation="swiglu", backend="auto")
    x = torch.randn(9, 16, requires_grad=True)
    mlp(x).backward(torch.randn(9, 16))
    assert len(checked) == 2 and len(checked[1]) == 1 and checked[1][0].shape == (9, 16)
    assert ran[-4:] == [("cute", "gemm_dact"), ("cute", "gemm"), ("cute", "gemm"), ("cute", "gemm")]

    class NotForCute(torch.Tensor):
        _not_for_cute = True

    ran.clear()
    mlp.zero_grad(set_to_none=True)
    y = mlp(x)
    dy = torch.randn(9, 16).as_subclass(NotForCute)
    y.backward(dy)
    assert ran == [("cute", "gemm_act"), ("cute", "gemm")]  # the forward only; backward on torch
    ref = ParallelMLP(16, 32, activation="swiglu", backend="torch")
    ref.load_state_dict(mlp.state_dict())
    x2 = x.detach().clone().requires_grad_()
    ref(x2).backward(dy.as_subclass(torch.Tensor))
    for ours, want in ((mlp.fc1.weight, ref.fc1.weight), (mlp.fc2.weight, ref.fc2.weight)):
        torch.testing.assert_close(ours.grad, want.grad)
