"""parallel_mlp.fused_act: the torch backend's activation math compiled into one kernel.

On CPU the compiled path is forced on (PARALLEL_MLP_FUSE_ACT=1; inductor's C++ backend), so
these tests check what it computes; on CUDA it is the default (tests/test_backends.py checks it
there)."""

import logging
import shutil

import pytest
import torch

from parallel_mlp import fused_act
from parallel_mlp.activations import ACTIVATIONS, get_activation
from parallel_mlp.backends import TorchBackend

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="inductor on CPU needs a C++ compiler")


@pytest.fixture
def fuse(monkeypatch):
    """Set PARALLEL_MLP_FUSE_ACT (None: unset) with nothing compiled yet."""
    monkeypatch.setattr(fused_act, "_compiled", {})

    def set_mode(value):
        if value is None:
            monkeypatch.delenv(fused_act.ENV, raising=False)
        else:
            monkeypatch.setenv(fused_act.ENV, value)
    return set_mode


def _inputs(act, rows=37, h=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    preact = (2 * torch.randn(rows, 2 * h if act.gated else h, generator=g)).bfloat16()
    dpost = torch.randn(rows, h, generator=g).bfloat16()
    return preact, dpost


def _within_one_ulp(got, want):
    # bf16 keeps 8 significant bits: one unit in the last place is at most 2^-7 of the value.
    # Near a zero of the activation (gelu at -0.0...) a different fp32 rounding order moves a
    # tiny value by more than that relatively; the inputs are O(1), so 1e-5 absolute covers it.
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-5)


@needs_cxx
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_compiled_matches_the_unfused_formulas(fuse, name):
    fuse("1")
    act = get_activation(name)
    preact, dpost = _inputs(act)
    post = fused_act.forward(act, preact)
    assert post is not None and post.dtype == preact.dtype
    _within_one_ulp(post, act.forward(preact))
    dpre, post_again = fused_act.backward(act, preact, dpost)
    want_dpre, _ = act.backward(preact, dpost)
    assert dpre.shape == preact.shape
    _within_one_ulp(dpre, want_dpre)
    # The postact the backward recomputes is the one the forward gave fc2, to the bit.
    assert torch.equal(post_again, post)
    assert set(fused_act._compiled) == {(name, "forward"), (name, "backward")}


@needs_cxx
def test_torch_backend_ops_run_it(fuse):
    fuse("1")
    g = torch.Generator().manual_seed(1)
    a = torch.randn(45, 40, generator=g).bfloat16()
    w = torch.randn(40, 2 * 24, generator=g).bfloat16()
    preact, post = TorchBackend.gemm_act(a, w, "swiglu")
    assert ("swiglu", "forward") in fused_act._compiled
    fuse("0")
    _, want = TorchBackend.gemm_act(a, w, "swiglu")
    _within_one_ulp(post, want)

    fuse("1")
    dy = torch.randn(45, 40, generator=g).bfloat16()
    w2 = torch.randn(40, 24, generator=g).bfloat16()
    dpre, post_again = TorchBackend.gemm_dact(dy, w2, preact, "swiglu")
    assert ("swiglu", "backward") in fused_act._compiled
    assert torch.equal(post_again, post)
    fuse("0")
    want_dpre, _ = TorchBackend.gemm_dact(dy, w2, preact, "swiglu")
    _within_one_ulp(dpre, want_dpre)


def test_off_and_cpu_auto_stay_unfused(fuse):
    act = get_activation("swiglu")
    preact, dpost = _inputs(act)
    fuse("0")
    assert fused_act.forward(act, preact) is None and fused_act.backward(act, preact, dpost) is None
    fuse(None)  # auto: CUDA tensors only
    assert fused_act.forward(act, preact) is None
    assert fused_act._compiled == {}


def test_an_unknown_mode_is_refused(fuse):
    fuse("yes")
    with pytest.raises(ValueError, match="PARALLEL_MLP_FUSE_ACT='yes': must be one of auto, 1, 0"):
        fused_act.forward(get_activation("relu"), torch.ones(2, 2))


def test_a_failed_compile_warns_once_and_falls_back(fuse, monkeypatch, caplog):
    fuse("1")
    made = []

    def broken(act, which):
        made.append(which)

        def run(*tensors):
            raise RuntimeError("no compiler here")
        return run

    monkeypatch.setattr(fused_act, "_make", broken)
    act = get_activation("gelu_tanh_approx")
    preact, dpost = _inputs(act)
    with caplog.at_level(logging.WARNING, logger="parallel_mlp.fused_act"):
        assert fused_act.forward(act, preact) is None
        assert fused_act.forward(act, preact) is None
    assert made == ["forward"]  # not tried again
    assert [r.getMessage() for r in caplog.records] == [
        "torch backend: could not fuse gelu_tanh_approx's forward with torch.compile "
        "(RuntimeError: no compiler here); evaluating it unfused"]
    # The backend still answers, unfused.
    _, post = TorchBackend.gemm_act(preact, torch.eye(preact.shape[1]).bfloat16(), act.name)
    torch.testing.assert_close(post, act.forward(preact), rtol=0, atol=0)


@needs_cxx
@pytest.mark.parametrize("mode", ["0", "1"])
def test_torch_compile_of_a_model_around_it(fuse, mode):
    """Users compile their whole model: ParallelMLP inside torch.compile gives the eager module's
    output and gradients, with the activation compiled on its own (1) or not (0)."""
    from parallel_mlp import ParallelMLP

    fuse(mode)
    torch.manual_seed(0)
    mlp = ParallelMLP(64, 96, activation="swiglu", dtype=torch.bfloat16)
    x = torch.randn(2, 37, 64, dtype=torch.bfloat16, requires_grad=True)

    def step(module):
        x.grad = None
        mlp.zero_grad()
        y = module(x)
        y.float().square().sum().backward()
        return y.detach(), x.grad.clone(), mlp.fc1.weight.grad.clone(), mlp.fc2.weight.grad.clone()

    want = step(mlp)
    got = step(torch.compile(mlp))
    for g, w in zip(got, want):
        _within_one_ulp(g, w)
