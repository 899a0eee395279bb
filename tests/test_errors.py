"""Every error of DESIGN.md: raised with a message that names the parameter, value and rule."""

import pytest
import torch

from dist_utils import run_distributed
from parallel_mlp import ParallelMLP, parallel_mlp_func


def test_unknown_activation():
    with pytest.raises(ValueError, match=r"activation='silu' is not known; choose one of \["):
        ParallelMLP(8, activation="silu")


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"backend='cuda' is not known"):
        ParallelMLP(8, backend="cuda")


@pytest.mark.parametrize("kw, exc, msg", [
    (dict(in_features=0), ValueError, r"in_features must be positive, got 0"),
    (dict(in_features=8.0), TypeError, r"in_features must be an int, got float"),
    (dict(in_features=8, hidden_features=-4), ValueError, r"hidden_features must be positive"),
    (dict(in_features=8, out_features=0), ValueError, r"out_features must be positive"),
    (dict(in_features=8, multiple_of=0), ValueError, r"multiple_of must be positive"),
    (dict(in_features=8, dtype=torch.int32), ValueError,
     r"dtype must be a floating-point dtype .*got torch.int32"),
    (dict(in_features=8, dtype=torch.complex64), ValueError,
     r"dtype must be a floating-point dtype .*got torch.complex64"),
    (dict(in_features=8, dtype="bfloat16"), TypeError, r"dtype must be a torch.dtype or None, got str"),
    (dict(in_features=8, tp_group="tp"), TypeError,
     r"tp_group must be a torch.distributed ProcessGroup or None, got str"),
])
def test_bad_sizes(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        ParallelMLP(**kw)


@pytest.mark.parametrize("name", ["recompute", "fuse_grad_accum", "sequence_parallel", "bias1",
                                  "bias2"])
@pytest.mark.parametrize("value", ["false", None, 2, 0.0])
def test_on_off_options_take_true_or_false_only(name, value):
    # "false" (from a config file, say) is truthy: read by its truth it would turn the option on
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got "
                                        rf"{type(value).__name__} \({value!r}\)"):
        ParallelMLP(8, **{name: value})
    on = ParallelMLP(8, 16, **{name: 1})  # 0 and 1 are bools' own values
    if name in ("bias1", "bias2"):
        assert (on.fc1 if name == "bias1" else on.fc2).bias is not None
    else:
        assert getattr(on, name) is True


@pytest.mark.parametrize("name", ["recompute", "fuse_grad_accum", "sequence_parallel"])
def test_the_functions_on_off_options_take_true_or_false_only(name):
    x, w1, w2 = torch.randn(3, 8), torch.randn(32, 8), torch.randn(8, 16)
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got str \('no'\)"):
        parallel_mlp_func(x, w1, w2, "swiglu", **{name: "no"})


def _not_divisible(rank, world):
    with pytest.raises(ValueError, match=r"hidden_features=10 is not divisible by the tensor-parallel size 4"):
        ParallelMLP(8, 10)


def test_hidden_not_divisible_by_tp_size():
    run_distributed(4, _not_divisible)


def _different_configs(rank, world):
    with pytest.raises(ValueError, match=r"different configurations .* hidden_features: this rank"):
        ParallelMLP(8, 16 if rank == 0 else 32, activation="swiglu")


def test_ranks_built_differently_fail_fast_instead_of_hanging():
    run_distributed(2, _different_configs)


def _unequal_inputs(rank, world, sequence_parallel, overlap):
    # Built alike (the construction check passes); then each rank passes a different T.
    mlp = ParallelMLP(16, 32, activation="swiglu", sequence_parallel=sequence_parallel,
                      tp_comm_overlap=overlap)
    x = torch.randn(4 + rank, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="Detected mismatch between collectives"):
        mlp(x).sum().backward()


@pytest.mark.parametrize("sequence_parallel, overlap",
                         [(False, False), (True, False), (True, True)])
def test_unequal_inputs_are_named_under_torch_distributed_debug(monkeypatch, sequence_parallel,
                                                                 overlap):
    """What the README's errors bullet tells a user: per-call shapes are not compared across ranks
    by the layer, but every collective it issues goes through the process group, so
    TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatch on each rank instead of a hang or a crash."""
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")  # the spawned ranks inherit it
    run_distributed(2, _unequal_inputs, sequence_parallel, overlap)


def shards(rows=16, d=8, h=8, out=8, dtype=torch.float32):
    return torch.randn(3, d, dtype=dtype), torch.randn(rows, d, dtype=dtype), torch.randn(out, h, dtype=dtype)


def test_gated_fc1_with_odd_size():
    x, w1, w2 = shards(rows=15, h=7)
    with pytest.raises(ValueError, match=r"activation='swiglu' is gated, .* must be even; got w1 with 15 rows"):
        parallel_mlp_func(x, w1, w2, "swiglu")


def test_last_dim_is_not_in_features():
    x, w1, w2 = shards()
    with pytest.raises(ValueError, match=r"x's last dim must be in_features=8 .* got x of shape \(3, 9\)"):
        parallel_mlp_func(torch.randn(3, 9), w1, w2, "swiglu")
    mlp = ParallelMLP(8, 16)
    with pytest.raises(ValueError, match=r"x's last dim must be in_features=8"):
        mlp(torch.randn(2, 4, 6))


def test_fc2_does_not_match_fc1():
    x, w1, _ = shards()
    with pytest.raises(ValueError, match=r"w2 must be \[out_features, 8\]"):
        parallel_mlp_func(x, w1, torch.randn(8, 16), "swiglu")


def test_bias_shapes():
    x, w1, w2 = shards()
    with pytest.raises(ValueError, match=r"b1 must have shape \(16,\)"):
        parallel_mlp_func(x, w1, w2, "swiglu", b1=torch.zeros(8))
    with pytest.raises(ValueError, match=r"b2 must have shape \(8,\)"):
        parallel_mlp_func(x, w1, w2, "swiglu", b2=torch.zeros(16))


def test_mismatched_dtypes():
    x, w1, w2 = shards()
    with pytest.raises(TypeError, match=r"w1 has dtype torch.bfloat16 but x has torch.float32"):
        parallel_mlp_func(x, w1.bfloat16(), w2, "swiglu")
    mlp = ParallelMLP(8, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"but x has torch.float32; they must match"):
        mlp(torch.randn(2, 8))


def test_mismatched_devices():
    x, w1, w2 = shards()
    with pytest.raises(ValueError, match=r"w2 is on meta but x is on cpu"):
        parallel_mlp_func(x, w1, w2.to("meta"), "swiglu")


def test_not_a_tensor_and_not_floating():
    x, w1, w2 = shards()
    with pytest.raises(TypeError, match=r"w1 must be a torch.Tensor, got list"):
        parallel_mlp_func(x, [[1.0]], w2, "swiglu")
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor"):
        parallel_mlp_func(torch.ones(3, 8, dtype=torch.int64), w1, w2, "swiglu")


def test_explicit_cute_backend_that_cannot_run():
    mlp = ParallelMLP(8, 16, backend="cute")
    with pytest.raises(ValueError, match=r"backend='cute' cannot run here: a cpu tensor was given"):
        mlp(torch.randn(2, 8))


def test_the_checks_fast_path_accepts_only_what_the_full_checks_accept():
    """check_shards answers the common case in a few comparisons before its full checks: over
    random combinations of shapes, dtypes, devices, biases and non-tensors, whenever that fast
    path says valid, the full checks (called past it) raise nothing."""
    import random

    from parallel_mlp import checks
    from parallel_mlp.activations import ACTIVATIONS

    rng = random.Random(0)
    accepted = 0

    def pick(good, *bad):  # mostly the valid choice, so that the fast path is reached often
        return good if rng.random() < 0.75 else rng.choice(bad)

    for _ in range(400):
        act = ACTIVATIONS[rng.choice(["swiglu", "gelu_tanh_approx"])]
        d, h = rng.choice([3, 4]), rng.choice([2, 3])
        rows = pick(2 * h if act.gated else h, h, 2 * h + 1)
        base = rng.choice([torch.float32, torch.float64])
        dtype = lambda: pick(base, torch.int32, torch.float16)
        x = torch.zeros(*pick((5, d), (2, 3, d), (d,), (5, d + 1)), dtype=dtype())
        w1 = torch.zeros(*pick((rows, d), (rows, d + 1), (rows,)), dtype=dtype())
        w2 = torch.zeros(*pick((7, h), (7, h + 1), (h,)), dtype=dtype())
        if rng.random() < 0.05:
            w2 = w2.tolist()
        b1 = pick(None, torch.zeros(rows, dtype=base), torch.zeros(rows + 1))
        b2 = pick(None, torch.zeros(7, dtype=base), torch.zeros(6))
        if checks.plainly_valid(x, w1, b1, w2, b2, act):
            accepted += 1
            checks._check_shards_fully(x, w1, b1, w2, b2, act)  # must not raise
    assert accepted > 10  # the fast path was exercised
