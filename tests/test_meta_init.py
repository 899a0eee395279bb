"""Meta-device construction: a ParallelMLP built on ``meta`` (``device="meta"``, the
``torch.device("meta")`` context, accelerate's ``init_empty_weights``) and materialized with
``to_empty`` keeps its TP metadata and Muon hooks, and ``reset_parameters`` /
``load_full_state_dict`` then give exactly the eagerly built module, at TP 1 and 2. The metadata
also survives ``load_state_dict(assign=True)`` and torch's swap-on-conversion mode, which put new
tensors in place too."""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch

from dist_utils import run_distributed
from parallel_mlp import ParallelMLP

D, H = 16, 24
OPTIONS = dict(activation="swiglu", bias1=True, bias2=True, backend="torch")
# What Megatron, TP-aware optimizers and Muon read off a shard parameter.
METADATA = ("tensor_model_parallel", "partition_dim", "partition_stride", "allreduce",
            "sequence_parallel", "_muon_reshape_functions")


def metadata(module):
    return {name: {a: getattr(p, a, "<missing>") for a in METADATA}
            for name, p in module.named_parameters()}


def eager(seed):
    torch.manual_seed(seed)
    return ParallelMLP(D, H, **OPTIONS)


def on_meta(how):
    if how == "device=meta":
        return ParallelMLP(D, H, device="meta", **OPTIONS)
    if how == "init_empty_weights":
        from accelerate import init_empty_weights
        context = init_empty_weights()
    else:
        context = torch.device("meta")
    with context:
        return ParallelMLP(D, H, **OPTIONS)


def constructions():
    ways = ["device=meta", "torch.device('meta')"]
    if importlib.util.find_spec("accelerate") is not None:
        ways.append("init_empty_weights")
    return ways


def check_materialization(rank, world):
    ref = eager(seed=5)
    full = ref.full_state_dict()
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(1))
    for how in constructions():
        for swap in (False, True):
            with _swap_on_conversion(swap):
                mlp = on_meta(how)
                assert mlp.fc1.weight.device.type == "meta", how
                mlp.to_empty(device="cpu")
            case = f"{how}, swap_module_params_on_conversion={swap}"
            assert metadata(mlp) == metadata(ref), case

            torch.manual_seed(5)
            mlp.reset_parameters()
            for key, value in ref.state_dict().items():
                assert torch.equal(mlp.state_dict()[key], value), (case, key)

            with _swap_on_conversion(swap):
                loaded = on_meta(how).to_empty(device="cpu")
            loaded.load_full_state_dict(full)
            assert metadata(loaded) == metadata(ref), case
            torch.testing.assert_close(loaded(x), ref(x), rtol=0, atol=0)

    # load_state_dict(assign=True) replaces the parameters by the state dict's tensors.
    assigned = on_meta("device=meta")
    assigned.load_state_dict({k: v.clone() for k, v in ref.state_dict().items()}, assign=True)
    assert metadata(assigned) == metadata(ref)
    assigned(x).sum().backward()
    assert assigned.fc1.weight.grad is not None


@contextlib.contextmanager
def _swap_on_conversion(enabled):
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(enabled)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def test_meta_construction_materializes_at_tp1():
    check_materialization(0, 1)


@pytest.mark.slow
def test_meta_construction_materializes_at_tp2():
    run_distributed(2, check_materialization)
