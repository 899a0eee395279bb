"""The small-step path: when backend='auto' runs a step as plain autograd ops, and that those ops
compute the MLP (values and every gradient) as the independent reference does."""

import copy
import dataclasses

import pytest
import torch

import reference
from dist_utils import run_distributed
from parallel_mlp import ACTIVATIONS, ParallelMLP, parallel_mlp_func, small_step
from parallel_mlp.activations import TORCH_MATH, interleaved_pairs

# T=512 d=1024 swiglu h=2816: 26.6 GFLOP per fwd+bwd, far below the threshold.
SMALL = dict(rows=512, in_features=1024, fc1_rows=5632, hidden=2816, out_features=1024)
OPTIONS = dict(device_type="cuda", backend="auto", tp_size=1, recompute=False,
               fuse_grad_accum=False, compiling=False, gate_ops=True, launch_graphs=False)


def applies(sizes=SMALL, **changes):
    return small_step.applies(*sizes.values(), **(OPTIONS | changes))


def test_step_flop_counts_six_gemms():
    # fc1 [512 x 1024] @ [1024 x 5632] and fc2 [512 x 2816] @ [2816 x 1024], each 2*M*N*K
    # forward and twice that backward (dgrad and wgrad).
    fwd = 2 * 512 * 1024 * 5632 + 2 * 512 * 2816 * 1024
    assert small_step.step_flop(*SMALL.values()) == 3 * fwd


@pytest.mark.parametrize("gated,in_features,limit", [
    (True, 1024, small_step.MAX_FLOP_GATED), (False, 4096, small_step.MAX_FLOP),
    (False, 2048, small_step.MAX_FLOP_NARROW), (False, 2049, small_step.MAX_FLOP)])
def test_auto_takes_the_small_step_below_the_threshold_only(gated, in_features, limit):
    """Gated without gate ops (no lean small step at any rows), and not gated: wide, or narrow
    (in_features up to NARROW_MAX_IN_FEATURES)."""
    sizes = dict(SMALL, in_features=in_features)
    sizes = sizes if gated else dict(sizes, fc1_rows=2816)
    assert applies(sizes, gate_ops=False)
    # The rows at which a step's FLOP reach the threshold, and one row either side.
    per_row = small_step.step_flop(1, *list(sizes.values())[1:])
    edge = -(-int(limit) // per_row)
    assert applies(dict(sizes, rows=edge - 1), gate_ops=False)
    assert not applies(dict(sizes, rows=edge), gate_ops=False)


def test_thresholds_fall_between_the_measured_shapes():
    """bench sweep, H200: gated, 208 GFLOP (1/16 row per input feature) slower fused, 425
    faster; gated at one row per feature, where the small step is a lean function, 213 GFLOP
    faster fused; not gated at d >= 4096, 629 GFLOP slower fused or a tie, 825 faster (three
    sweeps), 3.3 TFLOP as fast; not gated at d <= 2048, 206 GFLOP slower fused, 825 faster."""
    swiglu = dict(in_features=1024, fc1_rows=5632, hidden=2816, out_features=1024)
    assert not applies(dict(rows=8192, **swiglu))  # 425 GFLOP
    t2048_d2048 = dict(rows=2048, in_features=2048, fc1_rows=5632, hidden=2816, out_features=2048)
    assert not applies(t2048_d2048)  # 213 GFLOP, lean
    # Without gate ops (swiglu_oai, glu) the small step is autograd's nodes there, unmeasured
    # against the fused kernels: it keeps the gated threshold.
    assert applies(t2048_d2048, gate_ops=False)
    assert applies(dict(rows=512, in_features=8192, fc1_rows=5504, hidden=2752,
                        out_features=8192))  # 208 GFLOP, 1/16 row per feature
    assert not applies(dict(rows=1000, in_features=4096, fc1_rows=22016, hidden=11008,
                            out_features=4096))
    # not gated, narrow (in_features <= 2048): 206 GFLOP slower fused, 825 faster (two shapes)
    gelu = dict(in_features=1024, fc1_rows=1024, hidden=1024, out_features=1024)
    assert not applies(dict(rows=65536, **gelu))
    assert applies(dict(rows=4096, in_features=1024, fc1_rows=4096, hidden=4096,
                        out_features=1024))
    assert not applies(dict(rows=8192, in_features=2048, fc1_rows=4096, hidden=4096,
                            out_features=2048))
    # not gated, wider: 825 GFLOP (T=8192 d=4096 h=2048) fused, 629 (T=1000 d=5120) the small step
    assert not applies(dict(rows=8192, in_features=4096, fc1_rows=2048, hidden=2048,
                            out_features=4096))
    assert applies(dict(rows=1000, in_features=5120, fc1_rows=10240, hidden=10240,
                        out_features=5120))
    assert not applies(dict(rows=16384, in_features=5120, fc1_rows=2560, hidden=2560,
                            out_features=5120))


def test_lean_gated_steps_take_the_small_step_below_their_own_threshold_only():
    """From one row per input feature (a lean small step), gated steps run fused from
    MAX_FLOP_GATED_LEAN; below one row per feature, from MAX_FLOP_GATED."""
    square = dict(rows=1, in_features=1024, fc1_rows=5632, hidden=2816, out_features=1024)
    per_row = small_step.step_flop(*square.values())
    edge = -(-int(small_step.MAX_FLOP_GATED_LEAN) // per_row)
    assert edge >= square["in_features"]  # lean at the edge, so the lean threshold decides
    assert applies(dict(square, rows=edge - 1))
    assert not applies(dict(square, rows=edge))
    assert applies(dict(square, rows=edge), gate_ops=False)
    # T=512 d=8192's shard: at its lean threshold's rows it is far below one row per feature,
    # so MAX_FLOP_GATED decides.
    wide = dict(rows=1, in_features=8192, fc1_rows=5504, hidden=2752, out_features=8192)
    per_row = small_step.step_flop(*wide.values())
    lean_edge = -(-int(small_step.MAX_FLOP_GATED_LEAN) // per_row)
    gated_edge = -(-int(small_step.MAX_FLOP_GATED) // per_row)
    assert lean_edge < gated_edge < wide["in_features"]
    assert applies(dict(wide, rows=lean_edge))
    assert applies(dict(wide, rows=gated_edge - 1))
    assert not applies(dict(wide, rows=gated_edge))


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
# in_features (15 on 24: autograd's nodes for the gated activation), more (40: LeanGatedPairs on
# fc1's one GEMM), and enough for gated fc1 as two GEMMs (96, with LeanGatedProduct).
@pytest.mark.parametrize("lead", [(3, 5), (4, 10), (8, 12)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", ["swiglu", "gelu_tanh_approx", "swiglu_oai", "relu_sq", "reglu",
                                  "geglu", "geglu_erf", "glu"])
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


@pytest.mark.parametrize("rows", [3, 40])  # gated: one GEMM, then two (rows per feature)
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_the_bias_free_step_is_the_small_step_to_the_bit(name, rows):
    """The module's fast lane runs small_step.bias_free_step; the full path, small_step itself:
    the same output and gradients, bit for bit, for every activation."""
    act = ACTIVATIONS[name]
    torch.manual_seed(0)
    d, h = 8, 12
    w1 = torch.randn((2 if act.gated else 1) * h, d, requires_grad=True)
    w2 = torch.randn(d, h, requires_grad=True)
    x = torch.randn(rows, d, requires_grad=True)
    dy = torch.randn(rows, d)
    results = []
    for step in (small_step.bias_free_step(act),
                 lambda x, w1, w2: small_step.small_step(x, w1, None, w2, None, act)):
        y = step(x, w1, w2)
        grads = torch.autograd.grad(y, (x, w1, w2), dy)
        results.append([y, *grads])
    for got, want in zip(*results):
        assert torch.equal(got, want)


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
                                                 compiling=False, gate_ops=True,
                                                 launch_graphs=False))]
    y.backward(dy)
    torch.testing.assert_close(y, fused)
    for got, want in zip((x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad), fused_grads):
        torch.testing.assert_close(got, want)


def _shards_for(rows=24, d=16, h=12, out=9, dtype=torch.float32):
    return (torch.randn(5, d, dtype=dtype), torch.randn(rows, d, dtype=dtype),
            torch.randn(out, h, dtype=dtype))


@pytest.mark.parametrize("bad, message", [
    (lambda x, w1, w2: (x[:, :15], w1, w2, None, None), r"x's last dim must be in_features=16"),
    (lambda x, w1, w2: (x, w1, w2[:, :11], None, None), r"w2 must be \[out_features, 12\]"),
    (lambda x, w1, w2: (x, w1[:23], w2, None, None), r"must be even; got w1 with 23 rows"),
    (lambda x, w1, w2: (x.double(), w1, w2, None, None), r"w1 has dtype torch.float32 but x has"),
    (lambda x, w1, w2: (x.tolist(), w1, w2, None, None), r"x must be a torch.Tensor, got list"),
    (lambda x, w1, w2: (x, w1[0], w2, None, None), r"w1 and w2 must be 2-D weight shards"),
    (lambda x, w1, w2: (x.to(torch.complex64), w1.to(torch.complex64), w2.to(torch.complex64),
                        None, None), r"x must be a floating-point tensor"),
    # torch's ops would broadcast a bias of one element
    (lambda x, w1, w2: (x, w1, w2, torch.zeros(1), None), r"b1 must have shape \(24,\)"),
])
def test_the_small_step_reports_bad_shards_as_the_checks_do(monkeypatch, bad, message):
    """Where the small step runs, its torch ops check the shards and the layer's checks run only
    after one failed (or where a bias or a dtype needs them first): the errors still name the
    input and the rule."""
    monkeypatch.setattr(small_step, "applies", lambda *a, **k: True)
    x, w1, w2, b1, b2 = bad(*_shards_for())
    with pytest.raises((ValueError, TypeError), match=message):
        parallel_mlp_func(x, w1, w2, "swiglu", b1=b1, b2=b2)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("d", [1024, 2048, 4096, 5120, 8192])
def test_row_limit_is_where_the_rule_turns(gated, graphs, d):
    """At every width of the sweep, gated and not, with launch graphs and without: the rule
    says yes below row_limit and no at it (0 where it never says yes)."""
    h = (8 * d // 3 + 255) // 256 * 256 if gated else 4 * d
    for shard in (h, h // 8):
        sizes = (d, 2 * shard if gated else shard, shard, d)
        options = dict(OPTIONS, gate_ops=gated, launch_graphs=graphs)
        limit = small_step.row_limit(*sizes, **options)
        if limit == 0:
            assert not small_step.applies(0, *sizes, **options)
            continue
        below = [limit - 1, (limit - 1) // 2, max(0, d - 1), 1]
        assert all(small_step.applies(r, *sizes, **options) for r in below if r < limit)
        assert not any(small_step.applies(r, *sizes, **options) for r in (limit, 2 * limit))
    # where the options rule the small step out, at any rows
    assert small_step.row_limit(*sizes, **dict(options, tp_size=2)) == 0


def test_row_limit_of_a_rule_that_always_says_yes_is_unbounded(monkeypatch):
    monkeypatch.setattr(small_step, "applies", lambda *a, **k: True)
    assert small_step.row_limit(16, 24, 12, 9) == 2 ** 48


def _rule_below(rows_limit, asked):
    """A small-step rule that says yes below ``rows_limit`` rows on any device, counting calls."""
    def rule(rows, *sizes, **options):
        asked.append((rows, options, sizes))
        return rows < rows_limit and options["backend"] == "auto" and options["tp_size"] == 1 \
            and not options["recompute"] and not options["fuse_grad_accum"]
    return rule


def _took_small_step(y):
    return not type(y.grad_fn).__name__.startswith("ParallelMLPFunction")


def test_the_module_keeps_the_rules_row_limit_for_its_weights_and_options(monkeypatch):
    """ParallelMLP's forward asks the rule once per set of weights and options (a bisection of
    the rows), then compares x's rows with the limit it kept: the small step below, the fused
    function from it, each as the rule says; weights of another shape, an option or the launch
    graphs' switch make it ask again, new weights of the same shapes do not."""
    from parallel_mlp.launch_graphs import GRAPHS

    asked = []
    monkeypatch.setattr(small_step, "applies", _rule_below(7, asked))
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 12, activation="gelu_tanh_approx")
    x6, x7 = torch.randn(2, 3, 16), torch.randn(7, 16)
    assert _took_small_step(mlp(x6)) and not _took_small_step(mlp(x7))
    first = len(asked)
    assert first > 0 and all(o["launch_graphs"] == GRAPHS.enabled for _, o, _ in asked)
    for _ in range(3):
        assert _took_small_step(mlp(x6)) and not _took_small_step(mlp(x7))
    assert len(asked) == first  # kept
    mlp.recompute = True
    assert not _took_small_step(mlp(x6))
    mlp.recompute = False
    assert _took_small_step(mlp(x6))
    # A new weight of the same shape (FSDP's views, every step) keeps the limit; a new shape
    # makes the module ask again.
    count = len(asked)
    mlp.fc1.weight = torch.nn.Parameter(mlp.fc1.weight.detach().clone())
    assert _took_small_step(mlp(x6)) and len(asked) == count
    assert mlp.__dict__["_kept_small_step_limit"][0]() is mlp.fc1.weight
    wider = ParallelMLP(16, 14, activation="gelu_tanh_approx")
    mlp.fc1.weight, mlp.fc2.weight = wider.fc1.weight, wider.fc2.weight
    assert _took_small_step(mlp(x6)) and len(asked) > count
    asked_for = {sizes for _, _, sizes in asked[count:]}
    assert asked_for == {(16, 14, 14, 16)}
    count = len(asked)
    monkeypatch.setattr(GRAPHS, "enabled", not GRAPHS.enabled)
    mlp(x6)
    assert len(asked) > count and asked[-1][1]["launch_graphs"] == GRAPHS.enabled
    # The values are the fused function's either way.
    y_small = mlp(x6)
    monkeypatch.setattr(small_step, "applies", lambda *a, **k: False)
    mlp.fc2.weight = mlp.fc2.weight  # the same weight: the kept limit still answers
    torch.testing.assert_close(y_small, ParallelMLP.forward(mlp, x6))
    fused = parallel_mlp_func(x6, mlp.fc1.weight, mlp.fc2.weight, "gelu_tanh_approx")
    assert not _took_small_step(fused)
    torch.testing.assert_close(y_small, fused)


def test_the_kept_limit_serves_later_steps_until_an_attribute_or_a_shard_changes(monkeypatch):
    """Once the limit is kept, a step below it reads neither the module's options nor the rule
    (the fast lane); setting any attribute of the module drops the limit, and a bias or a
    parametrized weight put on a shard since sends the step through the full path, which
    computes with them."""
    from torch.nn.utils import parametrize

    from parallel_mlp import layer

    monkeypatch.setattr(small_step, "applies", _rule_below(10 ** 6, []))
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 12, activation="gelu_tanh_approx")
    x = torch.randn(5, 16)
    want = mlp(x)
    full_path = []
    weight_and_bias = layer._weight_and_bias
    monkeypatch.setattr(layer, "_weight_and_bias",
                        lambda shard: full_path.append(shard) or weight_and_bias(shard))
    y = mlp(x)
    assert _took_small_step(y) and full_path == []
    torch.testing.assert_close(y, want)
    mlp.backend = "auto"  # an attribute set, even to its value: the limit is worked out again
    assert _took_small_step(mlp(x)) and len(full_path) == 2
    assert _took_small_step(mlp(x)) and len(full_path) == 2
    del mlp.tp_comm_overlap
    assert "_kept_small_step_limit" not in mlp.__dict__
    mlp.tp_comm_overlap = False
    mlp(x)
    assert "_kept_small_step_limit" in mlp.__dict__

    mlp.fc2.bias = torch.nn.Parameter(torch.randn(16))
    with_bias = mlp(x)
    assert len(full_path) > 2
    torch.testing.assert_close(with_bias, want + mlp.fc2.bias)

    mlp.fc2.bias = None
    mlp(x)
    count = len(full_path)
    parametrize.register_parametrization(mlp.fc1, "weight", _Doubled())
    doubled = mlp(x)
    assert len(full_path) > count
    torch.testing.assert_close(doubled, parallel_mlp_func(x, mlp.fc1.weight, mlp.fc2.weight,
                                                          "gelu_tanh_approx"))
    assert not torch.allclose(doubled, want)


def test_the_fast_lane_runs_the_fused_function_as_the_full_path_would(monkeypatch):
    """From the kept limit on, the fast lane applies the fused function with the options the
    full path gives it (the same output and gradients, in both memory modes); inputs the plain
    checks do not pass (a weight's dtype changed in place, x's width) and the collectives'
    overlap switched on go through the full path, whose checks name the input."""
    from parallel_mlp import layer

    monkeypatch.setattr(small_step, "applies", _rule_below(7, []))
    full_path = []
    weight_and_bias = layer._weight_and_bias
    monkeypatch.setattr(layer, "_weight_and_bias",
                        lambda shard: full_path.append(shard) or weight_and_bias(shard))
    for recompute in (False, True):
        torch.manual_seed(0)
        mlp = ParallelMLP(16, 12, activation="swiglu", recompute=recompute)
        x = torch.randn(9, 16, requires_grad=True)
        results = []
        for _ in range(2):  # the first call keeps the limit, the second takes the fast lane
            x.grad = None
            mlp.zero_grad()
            y = mlp(x)
            assert not _took_small_step(y)
            assert (y.grad_fn.preact is None) == recompute  # recompute mode keeps x alone
            y.square().sum().backward()
            results.append([y, x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad])
        assert len(full_path) == 2 * (1 + recompute)  # the fast lane read no shard
        for got, want in zip(*results):
            assert torch.equal(got, want)
        want = parallel_mlp_func(x, mlp.fc1.weight, mlp.fc2.weight, "swiglu", recompute=recompute)
        torch.testing.assert_close(results[1][0], want)

    count = len(full_path)
    with pytest.raises(ValueError, match=r"x's last dim must be in_features=16"):
        mlp(torch.randn(9, 15))
    assert len(full_path) == count + 2
    mlp.fc2.weight.data = mlp.fc2.weight.data.double()
    with pytest.raises(TypeError, match="w2 has dtype torch.float64 but x has torch.float32"):
        mlp(torch.randn(9, 16))
    mlp.fc2.weight.data = mlp.fc2.weight.data.float()
    mlp.tp_comm_overlap = True
    for _ in range(2):
        assert not _took_small_step(mlp(torch.randn(9, 16)))
    assert len(full_path) == count + 8


def test_a_kept_limit_does_not_lead_a_compiled_module_into_the_fast_lane(monkeypatch):
    """torch.compile of a module that kept its limit in eager steps: the forward tests for
    compilation before reading the kept limit's weak references, and the compiled module gives
    the eager module's output and gradients."""
    monkeypatch.setattr(small_step, "applies", _rule_below(10 ** 6, []))
    torch.manual_seed(0)
    mlp = ParallelMLP(16, 12, activation="gelu_tanh_approx")
    x = torch.randn(5, 16, requires_grad=True)
    want = mlp(x)
    want.square().sum().backward()
    want_grads = [x.grad.clone(), mlp.fc1.weight.grad.clone()]
    assert "_kept_small_step_limit" in mlp.__dict__
    compiled = torch.compile(mlp, backend="eager", fullgraph=True)
    x.grad = None
    mlp.zero_grad()
    got = compiled(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close([x.grad, mlp.fc1.weight.grad], want_grads)


class _Doubled(torch.nn.Module):
    def forward(self, w):
        return 2 * w


def test_the_modules_small_step_reports_a_bad_input_as_the_checks_do(monkeypatch):
    """Through the kept limit the small step runs without the checks first; a wrong width or
    device still raises the checks' error naming the input and rule."""
    monkeypatch.setattr(small_step, "applies", _rule_below(10 ** 6, []))
    mlp = ParallelMLP(16, 12, activation="swiglu")
    assert _took_small_step(mlp(torch.randn(4, 16)))
    with pytest.raises(ValueError, match=r"x's last dim must be in_features=16"):
        mlp(torch.randn(4, 15))
    with pytest.raises((ValueError, TypeError), match="w1 has dtype torch.float32 but x has"):
        mlp(torch.randn(4, 16, dtype=torch.float64))


def _fsdp2_small_steps(rank, world_size):
    from torch.distributed.fsdp import fully_shard

    asked = []
    small_step.applies = _rule_below(64, asked)  # this spawned process's own module
    # data parallel: each rank's MLP whole (a TP group of one), FSDP2 over the two ranks
    alone = [torch.distributed.new_group([r]) for r in range(world_size)][rank]
    torch.manual_seed(0)
    ref = ParallelMLP(16, 12, activation="gelu_tanh_approx", tp_group=alone)
    mlp = copy.deepcopy(ref)
    fully_shard(mlp)
    x = torch.randn(8, 16)  # the same on every rank
    counts = []
    for _ in range(3):
        y = mlp(x)
        assert _took_small_step(y)
        y.sum().backward()
        counts.append(len(asked))
    assert counts[0] > 0 and counts == [counts[0]] * 3, counts
    want = ref(x)
    want.sum().backward()
    torch.testing.assert_close(y, want)
    for p, q in zip(mlp.parameters(), ref.parameters()):  # three steps accumulated
        torch.testing.assert_close(p.grad.full_tensor(), 3 * q.grad)


def test_under_fsdp2_the_module_keeps_one_limit_and_steps_as_unsharded():
    """fully_shard over two gloo ranks: the unsharded weights FSDP2 puts in place for each
    forward keep the limit (the rule asked in the first step only), and the small steps' outputs
    and gradients are those of the same module unsharded."""
    run_distributed(2, _fsdp2_small_steps)


def test_the_kept_limit_leaves_the_module_picklable_and_copyable(monkeypatch, tmp_path):
    import copy
    import io

    monkeypatch.setattr(small_step, "applies", _rule_below(7, []))
    mlp = ParallelMLP(16, 12, activation="swiglu")
    x = torch.randn(3, 16)
    y = mlp(x)
    assert "_kept_small_step_limit" in mlp.__dict__
    buffer = io.BytesIO()
    torch.save(mlp, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    clone = copy.deepcopy(mlp)
    for other in (loaded, clone):
        assert "_kept_small_step_limit" not in other.__dict__
        z = other(x)
        assert _took_small_step(z)
        torch.testing.assert_close(z, y)
        assert other.__dict__["_kept_small_step_limit"][0]() is other.fc1.weight


def test_the_module_asks_the_rule_each_call_where_a_bias_or_the_dtype_needs_the_checks(
        monkeypatch):
    """With a bias (or a non-floating x, which the checks refuse first) the kept limit is not
    used: _run asks the rule with the step's sizes, once per call."""
    asked = []
    monkeypatch.setattr(small_step, "applies", _rule_below(7, asked))
    mlp = ParallelMLP(16, 12, activation="gelu_tanh_approx", bias2=True)
    for _ in range(2):
        assert _took_small_step(mlp(torch.randn(6, 16)))
    assert [rows for rows, _, _ in asked] == [6, 6]
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        ParallelMLP(16, 12, activation="gelu_tanh_approx")(torch.ones(6, 16, dtype=torch.long))


def test_the_small_step_runs_without_the_checks_when_nothing_fails(monkeypatch):
    from parallel_mlp import layer

    calls = []
    monkeypatch.setattr(small_step, "applies", lambda *a, **k: True)
    monkeypatch.setattr(layer, "check_shards", lambda *a: calls.append(a))
    x, w1, w2 = _shards_for()
    parallel_mlp_func(x, w1, w2, "swiglu")
    assert calls == []
    parallel_mlp_func(x, w1, w2, "swiglu", b1=torch.zeros(24))
    assert len(calls) == 1
    monkeypatch.setattr(small_step, "applies", lambda *a, **k: False)
    parallel_mlp_func(x, w1, w2, "swiglu")
    assert len(calls) == 2  # the fused path checks before anything runs


@pytest.mark.parametrize("enabled,bias,want", [(True, False, True), (True, True, False),
                                                (False, False, False)])
def test_the_layer_tells_the_rule_whether_its_groups_would_replay(monkeypatch, enabled, bias,
                                                                   want):
    """launch_graphs=True only where the fused path would replay launch groups: the graphs on
    and no biases (a step with biases launches one by one)."""
    from parallel_mlp.launch_graphs import GRAPHS

    asked = []
    monkeypatch.setattr(small_step, "applies", lambda *a, **k: asked.append(k) or False)
    monkeypatch.setattr(GRAPHS, "enabled", enabled)
    ParallelMLP(16, 12, activation="swiglu", bias1=bias, bias2=bias)(torch.randn(4, 16))
    assert [k["launch_graphs"] for k in asked] == [want]


def test_gated_steps_run_fused_at_every_size_under_launch_graphs():
    """bench sweep --launch-graphs, H200: at the two gated small steps of the grid the fused
    kernels, their groups replayed, beat the small step; the non-gated small steps stayed
    faster as plain ops, so their rule is the one without graphs."""
    assert applies() and not applies(launch_graphs=True)  # T=512 d=1024 swiglu, 27 GFLOP
    t512_d8192 = dict(rows=512, in_features=8192, fc1_rows=5504, hidden=2752, out_features=8192)
    assert applies(t512_d8192) and not applies(t512_d8192, launch_graphs=True)
    assert not applies(gate_ops=False, launch_graphs=True)
    for gelu in (dict(rows=512, in_features=1024, fc1_rows=512, hidden=512, out_features=1024),
                 dict(rows=4096, in_features=1024, fc1_rows=4096, hidden=4096,
                      out_features=1024)):
        assert applies(gelu, gate_ops=False, launch_graphs=True)


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


GATE_NAMES = [name for name, act in ACTIVATIONS.items() if act.gate is not None]


def test_gate_ops_cover_the_product_form_activations():
    assert sorted(GATE_NAMES) == ["geglu", "geglu_erf", "reglu", "swiglu"]


@pytest.mark.parametrize("name", GATE_NAMES)
def test_gate_ops_are_the_formula(name):
    """gate.forward(g) * u is the activation, and gate.backward_into(grad, g) overwrites grad
    with grad * a'(g), the formula's df/dg with u = 1 (fp64)."""
    act = ACTIVATIONS[name]
    g = torch.randn(7, 9, dtype=torch.float64) * 3
    u = torch.randn(7, 9, dtype=torch.float64)
    torch.testing.assert_close(act.gate.forward(g) * u, act.fn(g, u, TORCH_MATH))
    grad = torch.randn(7, 9, dtype=torch.float64)
    want = grad * act.grad(g, torch.ones_like(g), TORCH_MATH)[0]
    buffer = grad.clone()
    act.gate.backward_into(buffer, g)
    torch.testing.assert_close(buffer, want)


@pytest.mark.parametrize("name", GATE_NAMES)
def test_gate_ops_write_a_strided_view_as_forward_computes(name):
    """forward_into(out, g) into every other column of a buffer is forward(g) to the bit and
    leaves the other columns alone (bf16)."""
    act = ACTIVATIONS[name]
    g = (torch.randn(6, 2, 11) * 3).bfloat16()[:, 0]  # a strided gate, as the pairs give it
    buffer = torch.full((6, 22), 7.0, dtype=torch.bfloat16)
    act.gate.forward_into(buffer[:, 0::2], g)
    torch.testing.assert_close(buffer[:, 0::2], act.gate.forward(g), rtol=0, atol=0)
    assert bool((buffer[:, 1::2] == 7.0).all())


def _product_step(product, g0, u0, dpost):
    g, u = g0.clone().requires_grad_(), u0.clone().requires_grad_()
    post = product(g, u)
    post.backward(dpost)
    return post.detach(), g.grad, u.grad


def _pairs_step(product, g0, u0, dpost):
    """product(g, u) through an interleaved [..., 2h] pre-activation: the value and the
    pre-activation's gradient split back into (dg, du)."""
    preact = torch.stack((g0, u0), dim=-1).flatten(-2).requires_grad_()
    post = product(preact)
    post.backward(dpost)
    return post.detach(), preact.grad[..., 0::2], preact.grad[..., 1::2]


def _lean_pairs(act):
    return lambda preact: small_step.LeanGatedPairs.apply(preact, act)


def _nodes_on_pairs(act):
    return lambda preact: act.eager(*interleaved_pairs(preact))


@pytest.mark.parametrize("name", GATE_NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lean_functions_are_eagers_to_the_bit(name, dtype):
    """LeanGatedProduct's value and gradients equal autograd's through act.eager exactly, and
    LeanGatedPairs' equal autograd's through act.eager on the same strided views of the pairs:
    the same ops in the same dtype on the same layouts, only the buffers differ. (On the CPU a
    strided and a contiguous input can take different vector paths, so each is compared with
    eager on its own layout.)"""
    act = ACTIVATIONS[name]
    gen = torch.Generator().manual_seed(2)
    g, u, dpost = (torch.randn(37, 50, generator=gen).mul(3).to(dtype) for _ in range(3))
    eager = _product_step(act.eager, g, u, dpost)
    lean = _product_step(lambda a, b: small_step.LeanGatedProduct.apply(a, b, act), g, u, dpost)
    eager_on_pairs = _pairs_step(_nodes_on_pairs(act), g, u, dpost)
    pairs = _pairs_step(_lean_pairs(act), g, u, dpost)
    for got, want, what in zip(lean + pairs, eager + eager_on_pairs, ("value", "dg", "du") * 2):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"{name} {what}")


def test_lean_pairs_gradient_is_one_contiguous_interleaved_tensor():
    """The pre-activation's gradient comes back as one [..., 2h] tensor in its layout, over a
    leading batch dimension too."""
    act = ACTIVATIONS["swiglu"]
    preact = torch.randn(3, 5, 8, requires_grad=True)
    post = small_step.LeanGatedPairs.apply(preact, act)
    assert post.shape == (3, 5, 4)
    post.backward(torch.ones_like(post))
    assert preact.grad.shape == preact.shape and preact.grad.is_contiguous()
    g, u = preact.detach()[..., 0::2], preact.detach()[..., 1::2]
    want = torch.stack(act.grad(g, u, TORCH_MATH), dim=-1).flatten(-2)
    torch.testing.assert_close(preact.grad, want)


def _saved_elements(fn, *inputs):
    """Elements of the tensors autograd keeps for backward while fn's graph is alive (each
    storage once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    return out, sum(storages.values())


def test_lean_functions_keep_gate_and_up_alone():
    """Eager's nodes keep g, u and silu(g) for backward; the lean functions keep g and u (two
    tensors, or the one interleaved pre-activation)."""
    act = ACTIVATIONS["swiglu"]
    g = torch.randn(64, 32, requires_grad=True)
    u = torch.randn(64, 32, requires_grad=True)
    preact = torch.randn(64, 64, requires_grad=True)
    _, eager = _saved_elements(act.eager, g, u)
    _, nodes_on_pairs = _saved_elements(_nodes_on_pairs(act), preact)
    _, lean = _saved_elements(lambda a, b: small_step.LeanGatedProduct.apply(a, b, act), g, u)
    _, pairs = _saved_elements(_lean_pairs(act), preact)
    assert eager == nodes_on_pairs == 3 * g.numel()
    assert lean == pairs == 2 * g.numel()


@pytest.mark.parametrize("name", GATE_NAMES)
def test_lean_functions_support_a_double_backward(name):
    """With create_graph=True the lean backwards' gradients are differentiable and agree with
    eager's double backward (fp64)."""
    act = ACTIVATIONS[name]
    gen = torch.Generator().manual_seed(3)
    g0, u0, dpost = (torch.randn(5, 6, generator=gen, dtype=torch.float64) * 2 for _ in range(3))

    def through_pairs(product):
        def run(g, u):
            return product(torch.stack((g, u), dim=-1).flatten(-2))
        return run

    results = []
    for product in (act.eager, lambda a, b: small_step.LeanGatedProduct.apply(a, b, act),
                    through_pairs(_lean_pairs(act))):
        g, u = g0.clone().requires_grad_(), u0.clone().requires_grad_()
        dg, du = torch.autograd.grad(product(g, u), (g, u), dpost, create_graph=True)
        (dg.square().sum() + (du * g).sum()).backward()
        results.append((dg.detach(), du.detach(), g.grad, u.grad))
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name,rows,want", [
    ("swiglu", 48, "LeanGatedProduct"), ("swiglu", 47, "LeanGatedPairs"),
    ("swiglu", 16, "LeanGatedPairs"), ("swiglu", 15, None), ("geglu", 48, "LeanGatedProduct"),
    ("reglu", 20, "LeanGatedPairs"), ("swiglu_oai", 48, None), ("glu", 20, None)])
def test_gated_activations_with_gate_ops_take_a_lean_function(name, rows, want):
    """From one row per input feature, a gated activation with gate ops runs as LeanGatedProduct
    on fc1's two GEMMs (from 3 rows per feature) or LeanGatedPairs on its one GEMM's pairs
    (below); below one row per feature, or without gate ops, as autograd's nodes."""
    d = 16
    assert small_step.splits_the_weight(48, d) and not small_step.splits_the_weight(47, d)
    assert small_step.LEAN_MIN_ROWS_PER_FEATURE == 1
    assert small_step.keeps_gate_and_up_alone(16, d, True)
    assert not small_step.keeps_gate_and_up_alone(15, d, True)
    assert not small_step.keeps_gate_and_up_alone(16, d, False)
    act = ACTIVATIONS[name]
    x = torch.randn(rows, d, requires_grad=True)
    y = small_step.small_step(x, torch.randn(16, d), None, torch.randn(5, 8), None, act)
    fc2_inputs = [fn for fn, _ in y.grad_fn.next_functions if fn is not None]
    names = {type(fn).__name__ for fn in fc2_inputs}
    lean = {n.removesuffix("Backward") for n in names if n.startswith("LeanGated")}
    assert lean == ({want} if want else set()), names


@pytest.mark.parametrize("rows", [15, 40, 96])  # autograd's nodes, LeanGatedPairs, two GEMMs
@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_small_step_under_bf16_autocast_keeps_fp32_gradients_near_the_reference(name, rows):
    """Under autocast (as the example trains on a GPU), fc1 and fc2 run in bf16 on fp32 weights:
    the lean functions then see bf16 tensors, and every gradient comes back in its leaf's fp32,
    within bf16 rounding of the fp64 reference (CPU autocast)."""
    g = torch.Generator().manual_seed(5)
    d, h, d_out = 24, 16, 8
    x = torch.randn(rows, d, generator=g)
    w1 = torch.randn(2 * h, d, generator=g) / d ** 0.5
    w2 = torch.randn(d_out, h, generator=g) / h ** 0.5
    dy = torch.randn(rows, d_out, generator=g)
    leaves = [t.clone().requires_grad_() for t in (x, w1, w2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = small_step.small_step(leaves[0], leaves[1], None, leaves[2], None, ACTIVATIONS[name])
    assert y.dtype == torch.bfloat16
    y.backward(dy.bfloat16())
    want_y, want = reference.mlp_with_grads(x.double(), w1.double(), w2.double(), name,
                                            dy=dy.double())
    torch.testing.assert_close(y.double(), want_y, rtol=0.05, atol=0.05)
    for key, leaf in zip(("x", "w1", "w2"), leaves):
        assert leaf.grad.dtype == torch.float32, key
        err = (leaf.grad.double() - want[key]).norm() / want[key].norm()
        assert err < 2e-2, f"{name} rows={rows} grad of {key}: relative error {err:.3g}"
