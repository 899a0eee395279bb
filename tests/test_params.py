"""TP metadata on the parameters and the Muon gate/up hooks."""

import copy

import torch

from dist_utils import run_distributed
from parallel_mlp import ParallelMLP, merge_gate_up, split_gate_up


def test_megatron_metadata():
    mlp = ParallelMLP(8, 16, activation="swiglu", bias1=True, bias2=True)
    w1, b1, w2, b2 = mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias
    assert (w1.tensor_model_parallel, w1.partition_dim, w1.partition_stride) == (True, 0, 1)
    assert (b1.tensor_model_parallel, b1.partition_dim, b1.partition_stride) == (True, 0, 1)
    assert (w2.tensor_model_parallel, w2.partition_dim, w2.partition_stride) == (True, 1, 1)
    assert (b2.tensor_model_parallel, b2.partition_dim) == (False, -1)
    assert not hasattr(w2, "_muon_reshape_functions")
    # Megatron's DDP reduces every dense parameter over data parallelism
    assert all(p.allreduce is True for p in mlp.parameters())
    # a replicated bias sees every token without sequence parallelism, only its own with it
    assert b2.sequence_parallel is False
    sp = ParallelMLP(8, 16, activation="swiglu", bias1=True, bias2=True, sequence_parallel=True)
    assert sp.fc2.bias.sequence_parallel is True
    assert not hasattr(sp.fc1.bias, "sequence_parallel")  # split, not replicated


def _metadata(p):
    return {k: v for k, v in vars(p).items() if not k.startswith("_") or k == "_muon_reshape_functions"}


def test_a_deep_copy_keeps_the_metadata():
    """copy.deepcopy (an EMA or reference model) makes new Parameters, which Parameter's own
    deepcopy leaves without attributes: the shards tag them again."""
    mlp = ParallelMLP(8, 16, activation="swiglu", bias1=True, bias2=True, sequence_parallel=True)
    twin = copy.deepcopy(mlp)
    for (name, p), q in zip(mlp.named_parameters(), twin.parameters()):
        assert q is not p and torch.equal(q, p)
        assert _metadata(q) == _metadata(p) and _metadata(p), name
    assert twin.fc2.bias.sequence_parallel is True


def test_non_gated_fc1_has_no_muon_hook():
    assert not hasattr(ParallelMLP(8, 16, activation="relu").fc1.weight, "_muon_reshape_functions")


def _split_merge_on_shard(rank, world):
    torch.manual_seed(0)
    mlp = ParallelMLP(6, 8, activation="geglu")
    w = mlp.fc1.weight.detach()
    split, merge = mlp.fc1.weight._muon_reshape_functions
    parts = split(w)
    h_local = 8 // world
    assert parts.shape == (2, h_local, 6)
    assert torch.equal(parts[0], w[0::2]) and torch.equal(parts[1], w[1::2])  # gate, up rows
    assert torch.equal(merge(parts), w)
    # the shard's gate rows are the global gate units [r*h/p, (r+1)*h/p)
    full = mlp.full_state_dict()["fc1.weight"]
    assert torch.equal(parts[0], split(full)[0][rank * h_local:(rank + 1) * h_local])


def test_muon_split_merge_on_each_tp_shard():
    run_distributed(2, _split_merge_on_shard)


def test_split_merge_are_inverse():
    w = torch.randn(10, 3)
    assert torch.equal(merge_gate_up(split_gate_up(w)), w)
    t = torch.randn(2, 5, 3)
    assert torch.equal(split_gate_up(merge_gate_up(t)), t)


def test_split_and_merge_take_weights_and_biases_alike():
    """Row 2i is gate unit i and row 2i+1 up unit i, for a [2h, d] weight and a [2h] bias; the
    split is a view (no copy), as the Muon hooks and the integrations' converters rely on."""
    for t in (torch.arange(12.0).reshape(6, 2), torch.arange(6.0)):
        gate, up = split_gate_up(t)
        assert torch.equal(gate, t[0::2]) and torch.equal(up, t[1::2])
        assert gate.data_ptr() == t.data_ptr()
        assert torch.equal(merge_gate_up(torch.stack((gate, up))), t)
