"""The small-step path: when backend='auto' runs a step as plain autograd ops, and that those ops
compute the MLP (values and every gradient) as the independent reference does."""

import dataclasses

import pytest
import torch

import reference
from parallel_mlp import ACTIVATIONS, ParallelMLP, parallel_mlp_func, small_step
from parallel_mlp.activations import TORCH_MATH

# T=512 d=1024 swiglu h=2816: 26.6 GFLOP per fwd+bwd, far below the threshold.
SMALL = dict(rows=512, in_features=1024, fc1_rows=5632, hidden=2816, out_features=1024)
OPTIONS = dict(device_type="cuda", backend="auto", tp_size=1, recompute=False,
               fuse_grad_accum=False, compiling=False)


def applies(sizes=SMALL, **changes):
    return small_step.applies(*sizes.values(), **(OPTIONS | changes))


def test_step_flop_counts_six_gemms():
    # fc1 [512 x 1024] @ [1024 x 5632] and fc2 [512 x 2816] @ [2816 x 1024], each 2*M*N*K
    # forward and twice that backward (dgrad and wgrad).
    fwd = 2 * 512 * 1024 * 5632 + 2 * 512 * 2816 * 1024
    assert small_step.step_flop(*SMALL.values()) == 3 * fwd


@pytest.mark.parametrize("gated,limit", [(True, small_step.MAX_FLOP_GATED),
                                         (False, small_step.MAX_FLOP)])
def test_auto_takes_the_small_step_below_the_threshold_only(gated, limit):
    sizes = SMALL if gated else dict(SMALL, fc1_rows=2816)
    assert applies(sizes)
    # The rows at which a step's FLOP reach the threshold, and one row either side.
    per_row = small_step.step_flop(1, *list(sizes.values())[1:])
    edge = -(-int(limit) // per_row)
    assert applies(dict(sizes, rows=edge - 1))
    assert not applies(dict(sizes, rows=edge))


def test_thresholds_fall_between_the_measured_shapes():
    """bench sweep, H200: gated, 425 GFLOP slower fused, 812 faster; not gated, 825 GFLOP
    slower fused, 3.3 TFLOP as fast."""
    swiglu = dict(in_features=1024, fc1_rows=5632, hidden=2816, out_features=1024)
    assert applies(dict(rows=8192, **swiglu))
    assert not applies(dict(rows=1000, in_features=4096, fc1_rows=22016, hidden=11008,
                            out_features=4096))
    gelu = dict(in_features=1024, fc1_rows=1024, hidden=1024, out_features=1024)
    assert applies(dict(rows=65536, **gelu))
    assert not applies(dict(rows=16384, in_features=5120, fc1_rows=2560, hidden=2560,
                            out_features=5120))


@pytest.mark.parametrize("change", [dict(backend="cute"), dict(backend="torch"),
                                    dict(device_type="cpu"), dict(tp_size=2),
                                    dict(recompute=True), dict(fuse_grad_accum=True),
                                    dict(compiling=True)])
def test_anything_asked_of_the_fused_path_keeps_it(change):
    assert not applies(**change)


@pytest.mark.parametrize("name", reference.NAMES)
def test_autograd_spelling_is_the_formula(name):
    """Each activation's torch spelling computes its formula, and autograd's derivative of it
    is the formula's derivative (fp64)."""
    act = ACTIVATIONS[name]
    x = (torch.randn(6, 10, dtype=torch.float64) * 3).requires_grad_()
    y = act.autograd_forward(x)
    torch.testing.assert_close(y, act.forward(x.detach()))
    dy = torch.randn_like(y)
    y.backward(dy)
    dpreact, _ = act.backward(x.detach(), dy)
    torch.testing.assert_close(x.grad, dpreact)


def test_an_activation_without_a_torch_spelling_uses_its_formula():
    act = dataclasses.replace(ACTIVATIONS["swiglu"], eager=None)
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(act.autograd_forward(x),
                               act.fn(x[:, 0::2], x[:, 1::2], TORCH_MATH))


# Awkward sizes: rows not a multiple of anything, odd widths, a 3-D input; fewer rows than
# in_features and more, and (96 rows on 24 features) enough for gated fc1 as two GEMMs.
@pytest.mark.parametrize("lead", [(3, 5), (4, 10), (8, 12)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", ["swiglu", "gelu_tanh_approx", "swiglu_oai", "relu_sq"])
def test_small_step_matches_the_reference_with_every_gradient(name, bias, lead):
    g = torch.Generator().manual_seed(0)
    gated = reference.is_gated(name)
    d, h, d_out = 24, 10, 7
    x = torch.randn(*lead, d, generator=g, dtype=torch.float64)
    w1 = torch.randn((2 if gated else 1) * h, d, generator=g, dtype=torch.float64) / d ** 0.5
    w2 = torch.randn(d_out, h, generator=g, dtype=torch.float64) / h ** 0.5
    b1 = torch.randn(w1.shape[0], generator=g, dtype=torch.float64) if bias else None
    b2 = torch.randn(d_out, generator=g, dtype=torch.float64) if bias else None
    dy = torch.randn(*lead, d_out, generator=g, dtype=torch.float64)

    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w1, b1, w2, b2)]
    y = small_step.small_step(*leaves[:4], leaves[4], ACTIVATIONS[name])
    y.backward(dy)
    want_y, want = reference.mlp_with_grads(x.reshape(-1, d), w1, w2, name, b1, b2,
                                            dy=dy.reshape(-1, d_out))
    torch.testing.assert_close(y.detach().reshape(-1, d_out), want_y)
    for key, leaf in zip(("x", "w1", "b1", "w2", "b2"), leaves):
        if leaf is None:
            continue
        grad = leaf.grad.reshape(-1, d) if key == "x" else leaf.grad
        torch.testing.assert_close(grad, want[key], msg=f"{name} grad of {key}")


def test_gated_fc1_runs_as_two_gemms_from_the_rows_per_feature_threshold(monkeypatch):
    """From GATE_GEMMS_MIN_ROWS_PER_FEATURE rows per input feature, gated fc1 is two GEMMs on
    W1's gate and up rows in place (three F.linear calls in all), below it one (two calls);
    non-gated steps always one."""
    per = small_step.GATE_GEMMS_MIN_ROWS_PER_FEATURE
    assert not small_step.splits_the_weight(per * 16 - 1, 16)
    assert small_step.splits_the_weight(per * 16, 16)
    calls = []
    linear = small_step.F.linear

    def counted(x, w, b=None):
        calls.append(tuple(w.stride()))
        return linear(x, w, b)

    monkeypatch.setattr(small_step.F, "linear", counted)
    d, h = 16, 8
    for name, rows, want in [("swiglu", per * d - 1, [(d, 1), (h, 1)]),
                             ("swiglu", per * d, [(2 * d, 1), (2 * d, 1), (h, 1)]),
                             ("gelu_tanh_approx", per * d, [(d, 1), (h, 1)])]:
        calls.clear()
        act = ACTIVATIONS[name]
        w1 = torch.randn((2 if act.gated else 1) * h, d)
        small_step.small_step(torch.randn(rows, d), w1, None, torch.randn(d, h), None, act)
        assert calls == want, (name, rows)


def test_the_layer_runs_the_small_step_when_the_rule_says_so(monkeypatch):
    """The layer asks the rule with the step's sizes and options, and when it says yes runs the
    small step (autograd's own nodes, not the fused function), giving the fused path's values."""
    asked = []

    def rule(*sizes, **options):
        asked.append((sizes, options))
        return True

    torch.manual_seed(0)
    mlp = ParallelMLP(16, 12, 9, activation="swiglu", bias1=True, bias2=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    dy = torch.randn(2, 5, 9)
    fused = mlp(x)
    assert type(fused.grad_fn).__name__.startswith("ParallelMLPFunction")
    fused.backward(dy)
    fused_grads = [x.grad.clone(), mlp.fc1.weight.grad.clone(), mlp.fc2.weight.grad.clone()]

    monkeypatch.setattr(small_step, "applies", rule)
    mlp.zero_grad(set_to_none=True)
    x.grad = None
    y = mlp(x)
    assert not type(y.grad_fn).__name__.startswith("ParallelMLPFunction")
    assert asked == [((10, 16, 24, 12, 9), dict(device_type="cpu", backend="auto", tp_size=1,
                                                 recompute=False, fuse_grad_accum=False,
                                                 compiling=False))]
    y.backward(dy)
    torch.testing.assert_close(y, fused)
    for got, want in zip((x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad), fused_grads):
        torch.testing.assert_close(got, want)


def test_an_explicit_backend_never_asks_the_rule(monkeypatch):
    monkeypatch.setattr(small_step, "applies", lambda *a, **k: pytest.fail("rule asked"))
    mlp = ParallelMLP(16, 12, activation="gelu_tanh_approx", backend="torch")
    mlp(torch.randn(4, 16))
    parallel_mlp_func(torch.randn(4, 16), mlp.fc1.weight, mlp.fc2.weight, "gelu_tanh_approx",
                      backend="torch")


@pytest.mark.parametrize("bias", [True, False])
def test_both_fc1_spellings_give_the_gate_and_up_halves(bias):
    """gate_and_up_in_place and gate_and_up_by_two_gemms both return (x @ W1[0::2].T + b1[0::2],
    x @ W1[1::2].T + b1[1::2]) of the interleaved W1, for a 3-D x, with their gradients."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 6, generator=g, dtype=torch.float64)
    w1 = torch.randn(8, 6, generator=g, dtype=torch.float64)
    b1 = torch.randn(8, generator=g, dtype=torch.float64) if bias else None
    want = (x @ w1[0::2].T + (b1[0::2] if bias else 0), x @ w1[1::2].T + (b1[1::2] if bias else 0))
    grads = []
    for split in (small_step.gate_and_up_in_place, small_step.gate_and_up_by_two_gemms):
        w = w1.clone().requires_grad_()
        gate, up = split(x, w, b1)
        torch.testing.assert_close(gate, want[0])
        torch.testing.assert_close(up, want[1])
        (gate * 2 + up * 3).sum().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[0], grads[1])
