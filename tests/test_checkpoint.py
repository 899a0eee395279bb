"""Full state dicts: written at TP=2, loaded at TP=1 and TP=4 with the same outputs; a bad state
dict raises and changes nothing."""

import pytest
import torch

from dist_utils import run_distributed
from parallel_mlp import ParallelMLP

D, H = 16, 24


def make(activation="swiglu", **kw):
    return ParallelMLP(D, H, activation=activation, bias1=True, bias2=True, backend="torch", **kw)


def inputs():
    return torch.randn(2, 5, D, generator=torch.Generator().manual_seed(7))


def save_at_tp2(rank, world, path):
    torch.manual_seed(123)
    mlp = make()
    sd = mlp.full_state_dict()
    assert sd["fc1.weight"].shape == (2 * H, D) and sd["fc2.weight"].shape == (D, H)
    # every rank gets the same global tensors, and the shards are slices of them
    rows = 2 * H // world
    assert torch.equal(sd["fc1.weight"][rank * rows:(rank + 1) * rows], mlp.fc1.weight)
    assert torch.equal(sd["fc2.weight"][:, rank * H // world:(rank + 1) * H // world], mlp.fc2.weight)
    y = mlp(inputs()).detach()  # collective: every rank runs it
    if rank == 0:
        torch.save({"sd": sd, "y": y}, path)


def load_and_compare(rank, world, path):
    saved = torch.load(path)
    torch.manual_seed(999)  # a different init, so the load must do the work
    mlp = make()
    mlp.load_full_state_dict(saved["sd"])
    torch.testing.assert_close(mlp(inputs()), saved["y"], rtol=1e-6, atol=1e-6)
    again = mlp.full_state_dict()
    for k, v in saved["sd"].items():
        assert torch.equal(again[k], v), k


def test_tp2_checkpoint_loads_at_tp1_and_tp4(tmp_path):
    path = str(tmp_path / "mlp.pt")
    run_distributed(2, save_at_tp2, path)
    load_and_compare(0, 1, path)
    run_distributed(4, load_and_compare, path)


def test_init_is_the_same_at_every_tp_size(tmp_path):
    """Same seed on every rank: the TP=2 shards are slices of the TP=1 model."""
    path = str(tmp_path / "mlp.pt")
    run_distributed(2, save_at_tp2, path)
    torch.manual_seed(123)
    single = make()
    for k, v in torch.load(path)["sd"].items():
        assert torch.equal(single.state_dict()[k], v), k


def _bad_state_dicts(good, local):
    """Bad state dicts, the error each must raise from load_full_state_dict (global tensors) or,
    ``local``, from the module's load_state_dict (this rank's shards; at TP=1 the same shapes)."""
    expected = "this rank's shape" if local else "the global shape"
    missing = {k: v for k, v in good.items() if k != "fc2.bias"}
    extra = dict(good, **{"fc3.weight": torch.zeros(1)})
    wrong_shape = dict(good, **{"fc2.weight": torch.zeros(D, H + 1)})
    non_gated = dict(good, **{"fc1.weight": torch.zeros(H, D), "fc1.bias": torch.zeros(H)})
    not_float = dict(good, **{"fc2.bias": torch.zeros(D, dtype=torch.int64)})
    # fc2.bias comes last in the module's order: a check that waited for the copy would have
    # written the other three by then
    on_meta = dict(good, **{"fc2.bias": torch.empty(D, device="meta")})
    sparse = dict(good, **{"fc2.bias": torch.randn(D).to_sparse()})
    scalar = dict(good, **{"fc1.weight": torch.tensor(1.0)})
    return [
        (missing, ValueError, r"missing keys \['fc2.bias'\]"),
        (extra, ValueError, r"unexpected keys \['fc3.weight'\]"),
        (wrong_shape, ValueError, rf"'fc2.weight'\] has shape \(16, 25\), expected {expected} \(16, 24\)"),
        (non_gated, ValueError, r"looks like a non-gated fc1"),
        (not_float, TypeError, r"must be floating point"),
        ([1, 2], TypeError, r"state_dict must be a mapping" if local else r"state_dict must be a dict"),
        (on_meta, ValueError, r"'fc2.bias'\] is on the meta device and holds no values"),
        (sparse, TypeError, r"'fc2.bias'\] must be a dense \(strided\) tensor, got layout torch.sparse_coo"),
        (scalar, ValueError, rf"'fc1.weight'\] has shape \(\), expected {expected} \(48, 16\)$"),
    ]


# load_state_dict copies an integer tensor into the parameters as torch's does (case 4)
BAD_LOADS = [(local, case) for local in (False, True) for case in range(9)
             if not (local and case == 4)]


@pytest.mark.parametrize("local, case", BAD_LOADS)
def test_bad_state_dict_raises_and_changes_nothing(local, case):
    """Every entry is checked before any is written (torch's own load_state_dict writes each
    entry that fits and reports the rest at the end), so all four parameters stay as they were."""
    mlp = make()
    source = mlp.state_dict() if local else mlp.full_state_dict()
    good = {k: torch.randn_like(v) for k, v in source.items()}
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    sd, exc, msg = _bad_state_dicts(good, local)[case]
    with pytest.raises(exc, match=msg):
        (mlp.load_state_dict if local else mlp.load_full_state_dict)(sd)
    for k, v in mlp.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_gated_checkpoint_into_non_gated_module():
    gated = make("swiglu").full_state_dict()
    plain = make("gelu_tanh_approx")
    with pytest.raises(ValueError, match="looks like a gated fc1"):
        plain.load_full_state_dict(gated)


def test_loading_into_a_module_still_on_meta_is_refused():
    good = make().full_state_dict()
    with pytest.raises(ValueError, match=r"on the meta device, where a load writes nothing"):
        make(device="meta").load_full_state_dict(good)


def test_load_state_dict_still_loads_what_fits():
    mlp = make()
    good = {k: torch.randn_like(v) for k, v in mlp.state_dict().items()}
    mlp.load_state_dict(good)
    assert all(torch.equal(v, good[k]) for k, v in mlp.state_dict().items())
    partial = {"fc1.weight": torch.randn_like(good["fc1.weight"]), "extra": torch.zeros(1)}
    result = mlp.load_state_dict(partial, strict=False)
    assert result.unexpected_keys == ["extra"] and "fc2.weight" in result.missing_keys
    assert torch.equal(mlp.fc1.weight, partial["fc1.weight"])
    assert torch.equal(mlp.fc2.weight, good["fc2.weight"])
    fresh = {k: torch.randn_like(v) for k, v in good.items()}
    mlp.load_state_dict(fresh, assign=True)
    assert all(mlp.state_dict()[k].data_ptr() == fresh[k].data_ptr() for k in fresh)
    assert mlp.fc1.weight.partition_dim == 0  # the assigned tensors are tagged too


def _shard_and_global_mixed_up(rank, world):
    mlp = make()
    full, local = mlp.full_state_dict(), mlp.state_dict()
    before = {k: v.clone() for k, v in local.items()}
    with pytest.raises(ValueError, match=r"'fc1.weight'\] has shape \(24, 16\), expected the global "
                                         r"shape \(48, 16\) \(this rank's shard shape at TP=2"):
        mlp.load_full_state_dict(local)
    with pytest.raises(ValueError, match=r"'fc1.weight'\] has shape \(48, 16\), expected this rank's "
                                         r"shape \(24, 16\) \(the global shape: load_state_dict"):
        mlp.load_state_dict(full)
    for k, v in mlp.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_shard_given_for_global_tensors_and_the_reverse_are_named():
    run_distributed(2, _shard_and_global_mixed_up)
