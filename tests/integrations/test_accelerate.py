"""accelerate with parallel_mlp on CPU/gloo.

- ``accelerate launch`` runs examples/pretrain_gpt.py: ``--multi_gpu --num_processes 2`` starts two
  ranks (TP=2, on the CPU with gloo here), while ``--cpu`` starts one process whatever
  ``--num_processes`` says.
- The README's data-parallel x tensor-parallel setup on 4 ranks (DP=2 x TP=2): DDP over the DP group
  only, ``Accelerator.prepare_model(..., evaluation_mode=True)`` (no second DDP over the world),
  the prepared optimizer and a loader sharded over the DP group. The TP shards survive the setup
  (not overwritten by rank 0's), TP peers read the same batch, and after training the global
  weights equal a single-process plain-torch reference trained on the global batches. A DCP
  checkpoint of the wrapped model and prepared optimizer loads at TP=1 with the same weights.

Meta-device construction under ``init_empty_weights`` is tested in tests/test_meta_init.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate", reason="accelerate is not installed (the 'hf' extra)")

import torch.distributed.checkpoint as dcp  # noqa: E402

import reference  # noqa: E402
from dist_utils import free_port, run_distributed, run_on_cpu  # noqa: E402
from parallel_mlp import dcp as pdcp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
D, H, BATCH, STEPS, LR = 8, 16, 4, 3, 1e-2


def _accelerate_launch(*flags, cwd):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *flags,
           str(ROOT / "examples" / "pretrain_gpt.py"), "--steps", "3"]
    # HF_HOME in the test's folder: no accelerate config file of the machine's user applies.
    return run_on_cpu(cmd, cwd, HF_HOME=str(cwd))


@pytest.mark.slow
def test_accelerate_launch_runs_the_example(tmp_path):
    out = _accelerate_launch("--multi_gpu", "--num_processes", "2",
                             "--main_process_port", str(free_port()), cwd=tmp_path)
    assert "split over TP=2" in out and "device cpu, gloo" in out, out[-2000:]
    out = _accelerate_launch("--cpu", "--num_processes", "2", cwd=tmp_path)
    assert "split over TP=1" in out and "no process group" in out, out[-2000:]


# ---- DP x TP with an Accelerator ----------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self, tp_group):
        from parallel_mlp import ParallelMLP

        super().__init__()
        self.inp = torch.nn.Linear(D, D)
        self.mlp = ParallelMLP(D, H, activation="swiglu", bias1=True, bias2=True,
                               tp_group=tp_group, backend="torch")

    def forward(self, x):
        return self.mlp(self.inp(x))


def dataset():
    return torch.randn(2 * STEPS * BATCH, D, generator=torch.Generator().manual_seed(3))


def global_weights(net):
    out = {f"mlp.{k}": v for k, v in net.mlp.full_state_dict().items()}  # collective over TP
    out.update({f"inp.{k}": v.detach().clone() for k, v in net.inp.state_dict().items()})
    return out


def equal_over(t, group) -> bool:
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return all(torch.equal(parts[0], p) for p in parts)


def dp_x_tp(rank, world, out_dir):
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    accelerator = Accelerator(cpu=True)
    assert (accelerator.num_processes, accelerator.process_index) == (world, rank)
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    dp_group, tp_group = mesh["dp"].get_group(), mesh["tp"].get_group()

    torch.manual_seed(0)  # the same everywhere: replicas start equal
    net = Net(tp_group)
    initial = global_weights(net)
    shard = net.mlp.fc1.weight.detach().clone()
    model = DDP(net, process_group=dp_group)
    model = accelerator.prepare_model(model, evaluation_mode=True)
    optimizer = accelerator.prepare_optimizer(torch.optim.AdamW(model.parameters(), lr=LR))
    loader = prepare_data_loader(torch.utils.data.DataLoader(dataset(), batch_size=BATCH),
                                 num_processes=mesh["dp"].size(),
                                 process_index=mesh["dp"].get_local_rank(), put_on_device=True)
    assert isinstance(model, DDP) and model.module is net  # not wrapped again over the world
    assert torch.equal(net.mlp.fc1.weight, shard)  # no broadcast of rank 0's shard
    assert not equal_over(shard, tp_group)

    for x in loader:
        assert equal_over(x, tp_group) and not equal_over(x, dp_group)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    assert equal_over(net.mlp.fc1.weight, dp_group) and not equal_over(net.mlp.fc1.weight, tp_group)
    assert equal_over(net.inp.weight, dist.group.WORLD)
    final = global_weights(net)
    if rank == 0:
        torch.save({"initial": initial, "final": final}, f"{out_dir}/weights.pt")
    # A resharding checkpoint straight from the wrapped model and the prepared optimizer: DSD
    # names drop DDP's "module." and the DP replicas of each shard are written once.
    model_sd, optim_sd = pdcp.get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"{out_dir}/dcp")


def train_reference(initial):
    """The same training on one process with plain torch: each step on both DP ranks' batches."""
    w = {k: v.clone().requires_grad_() for k, v in initial.items()}
    optimizer = torch.optim.AdamW(w.values(), lr=LR)
    data = dataset()
    for step in range(STEPS):
        x = data[2 * step * BATCH:(2 * step + 2) * BATCH]  # batches 2k (DP rank 0), 2k+1 (rank 1)
        hidden = x @ w["inp.weight"].t() + w["inp.bias"]
        y = reference.mlp(hidden, w["mlp.fc1.weight"], w["mlp.fc2.weight"], "swiglu",
                          w["mlp.fc1.bias"], w["mlp.fc2.bias"])
        y.pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach() for k, v in w.items()}


def load_at_tp1(directory):
    net = Net(tp_group=None)
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR)
    model_sd, optim_sd = pdcp.get_state_dict(net, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory, no_dist=True)
    pdcp.set_state_dict(net, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    assert all(float(s["step"]) == STEPS for s in optimizer.state.values())
    return global_weights(net)


@pytest.mark.slow
def test_dp_x_tp_setup_keeps_the_shards_and_trains_like_one_process(tmp_path):
    run_distributed(4, dp_x_tp, str(tmp_path))
    saved = torch.load(tmp_path / "weights.pt")
    want = train_reference(saved["initial"])
    for key, value in want.items():
        torch.testing.assert_close(saved["final"][key], value, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{key}: {m}")
    loaded = load_at_tp1(str(tmp_path / "dcp"))
    for key, value in saved["final"].items():
        assert torch.equal(loaded[key], value), key
