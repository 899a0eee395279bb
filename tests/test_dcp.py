"""parallel_mlp.dcp with torch.distributed.checkpoint on CPU/gloo: a model (a replicated Linear and
a ParallelMLP) and its AdamW state saved at TP=2 load at TP=1 (one process, no process group) and
at TP=4 with the same global weights, moments and step, and the next step matches the one the
saving run took. Both of DSD's optimizer layouts (nested and flattened). The references are the
saving run's own tensors, gathered with plain all_gathers; the checkpoint's metadata holds the
global shapes. A load that does not fit fails and changes nothing."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions

from dist_utils import run_distributed
from parallel_mlp import ParallelMLP
from parallel_mlp import dcp as pdcp

D, H = 16, 24  # H divisible by 1, 2, 4
STEPS = 3
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def build(seed, hidden=H):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(D, D),
        ParallelMLP(D, hidden, activation="swiglu", bias1=True, bias2=True, backend="torch"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model, opt, step):
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(100 + step))
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def gather(t, dim):
    """The global tensor of a TP shard: every rank's piece, concatenated in rank order."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return t.detach().clone()
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.detach().contiguous())
    return torch.cat(parts, dim=dim)


def global_state(model, opt):
    """Global weights and AdamW moments by parameter name, and the step counters."""
    out = {}
    for name, p in model.named_parameters():
        sharded = getattr(p, "tensor_model_parallel", False)
        full = (lambda t: gather(t, p.partition_dim)) if sharded else (lambda t: t.detach().clone())
        st = opt.state[p]
        out[name] = {"weight": full(p), "exp_avg": full(st["exp_avg"]),
                     "exp_avg_sq": full(st["exp_avg_sq"]), "step": float(st["step"])}
    return out


def save_at_tp2(rank, world, root):
    model, opt = build(seed=0)
    for step in range(STEPS):
        train_step(model, opt, step)
    before = global_state(model, opt)
    for layout, options in (("nested", None), ("flat", FLAT)):
        model_sd, optim_sd = pdcp.get_state_dict(model, opt, options=options)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"{root}/{layout}")
    # Saving changed nothing, and the checkpoint records global tensors.
    assert _equal(global_state(model, opt), before)
    meta = dcp.FileSystemReader(f"{root}/nested").read_metadata().state_dict_metadata
    assert tuple(meta["model.1.fc1.weight"].size) == (2 * H, D)
    assert tuple(meta["model.1.fc2.weight"].size) == (D, H)
    assert tuple(meta["optim.state.1.fc1.weight.exp_avg"].size) == (2 * H, D)

    train_step(model, opt, STEPS)  # what a load should continue to
    after = global_state(model, opt)
    if rank == 0:
        torch.save({"saved": before, "next": after}, f"{root}/reference.pt")

    # An optimizer state that is neither scalar nor shaped like its parameter has no known split.
    opt.state[model[1].fc1.weight]["row_factor"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"\['1.fc1.weight'\]\['row_factor'\] has shape \(3,\), "
                                         r"not the shape of its parameter's shard \(24, 16\)"):
        pdcp.get_optimizer_state_dict(model, opt)


def load_and_continue(rank, world, root):
    reference = torch.load(f"{root}/reference.pt")
    no_dist = not dist.is_initialized()
    for layout, options in (("nested", None), ("flat", FLAT)):
        model, opt = build(seed=1)  # different weights: the load must do the work
        model_sd, optim_sd = pdcp.get_state_dict(model, opt, options=options)
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"{root}/{layout}",
                 no_dist=no_dist)
        pdcp.set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd,
                            options=options)
        assert model[1].fc1.weight.shape == (2 * H // world, D)
        assert _equal(global_state(model, opt), reference["saved"]), layout
        train_step(model, opt, STEPS)
        _close(global_state(model, opt), reference["next"])
    return model, opt


def load_at_tp4(rank, world, root):
    model, opt = load_and_continue(rank, world, root)

    # A checkpoint of another model fails in DCP's planning, before anything is read.
    other, other_opt = build(seed=2, hidden=2 * H)
    other_sd, other_optim = pdcp.get_state_dict(other, other_opt)
    kept = global_state(other, other_opt)
    with pytest.raises(dcp.api.CheckpointException, match="Size mismatch"):
        dcp.load({"model": other_sd, "optim": other_optim}, checkpoint_id=f"{root}/nested")
    assert _equal(global_state(other, other_opt), kept)

    # set_* check every TP entry before DSD writes anything.
    kept = global_state(model, opt)
    model_sd, optim_sd = pdcp.get_state_dict(model, opt)
    bad = dict(model_sd)
    bad["0.weight"] = torch.zeros(D, D)
    bad["1.fc2.weight"] = torch.zeros(D, H)  # a global tensor where this rank's shard belongs
    with pytest.raises(ValueError, match=r"model_state_dict\['1.fc2.weight'\] has shape "
                                         r"\(16, 24\); this rank's shard is \(16, 6\)"):
        pdcp.set_state_dict(model, opt, model_state_dict=bad, optim_state_dict=optim_sd)
    assert _equal(global_state(model, opt), kept)


def _equal(a, b) -> bool:
    return a.keys() == b.keys() and all(
        a[n]["step"] == b[n]["step"] and all(torch.equal(a[n][k], b[n][k])
                                             for k in ("weight", "exp_avg", "exp_avg_sq"))
        for n in a)


def _close(a, b):
    for n in a:
        for k in ("weight", "exp_avg", "exp_avg_sq"):
            # Only the order of the fp32 sums in the all-reduces differs between TP sizes.
            torch.testing.assert_close(a[n][k], b[n][k], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{n} {k}: {m}")


@pytest.mark.slow
def test_saved_at_tp2_loads_at_tp1_and_tp4(tmp_path):
    run_distributed(2, save_at_tp2, str(tmp_path))
    load_and_continue(0, 1, str(tmp_path))
    run_distributed(4, load_at_tp4, str(tmp_path))


def test_full_state_dict_options_are_refused():
    model, opt = build(seed=0)
    for options in (StateDictOptions(full_state_dict=True),
                    StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)):
        with pytest.raises(ValueError, match="full_state_dict / broadcast_from_rank0 are not "
                                             "supported"):
            pdcp.get_state_dict(model, opt, options=options)


def _a_bad_replicated_entry_changes_nothing(rank, world):
    model, opt = build(seed=0)
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    bad = pdcp.get_model_state_dict(build(seed=3)[0])  # fits everywhere ...
    bad["1.fc2.bias"] = torch.zeros(D + 1)  # ... but fc2's replicated bias, last in the order
    with pytest.raises(ValueError, match=r"state_dict\['1.fc2.bias'\] has shape \(17,\), expected "
                                         r"this rank's shape \(16,\)"):
        pdcp.set_model_state_dict(model, bad)
    with pytest.raises(ValueError, match=r"'1.fc2.bias'"):
        pdcp.set_state_dict(model, opt, model_state_dict=bad,
                            optim_state_dict=pdcp.get_optimizer_state_dict(model, opt))
    for k, v in model.state_dict().items():
        assert torch.equal(v, kept[k]), k


def test_a_bad_replicated_entry_changes_nothing():
    run_distributed(2, _a_bad_replicated_entry_changes_nothing)
