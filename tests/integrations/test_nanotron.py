"""parallel_mlp.integrations.nanotron against the real nanotron 0.4, on CPU with gloo (its MLP
runs there; its full Llama needs CUDA and flash-attn: see the gpu-marked test at the end).

- Ours equals Nanotron's own MLP (same weights, converted) in output, input grad and weight grads
  at TP 1 and 2, in both tp_modes, for a SiLU and an exact-GELU model.
- REDUCE_SCATTER with tp_linear_async_communication: ours against an independent fp64 reference
  (nanotron 0.4's own async row-parallel backward computes wrong gradients there).
- Checkpoints through nanotron.serialize: Nanotron's save loads into ours and ours into
  Nanotron's, at TP 2 -> 1, 1 -> 2 and 2 -> 2 (where Nanotron's loader would copy raw files).
- The context manager that builds Nanotron's Llama with our MLP, and its initialization.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("nanotron", reason="nanotron is not installed (the 'nanotron' extra)")

import nanotron_cpu  # noqa: E402

nanotron_cpu.install()

import reference  # noqa: E402
from dist_utils import counting_block_reduce_scatters, run_distributed  # noqa: E402
from parallel_mlp.integrations import gated_layout  # noqa: E402
from parallel_mlp.integrations.nanotron import (NanotronParallelMLP,  # noqa: E402
                                                llama_with_parallel_mlp)

HIDDEN, INTER, SEQ, BATCH = 16, 24, 4, 3


def configs(hidden_act="silu", mode="ALL_REDUCE", async_comm=False, world=1):
    from nanotron.config import LlamaConfig, ParallelismArgs

    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act=hidden_act,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    parallel = ParallelismArgs(dp=1, pp=1, tp=world, tp_mode=mode,
                               tp_linear_async_communication=async_comm)
    return config, parallel


def native_mlp(config, parallel, group):
    return nanotron_cpu.import_llama().MLP(config=config, parallel_config=parallel, tp_pg=group)


def ours_from(native, config, parallel, group):
    ours = NanotronParallelMLP(config, parallel, group, backend="torch")
    with torch.no_grad():
        ours.gate_up_proj.weight.copy_(gated_layout.from_blocks(native.gate_up_proj.weight))
        ours.down_proj.weight.copy_(native.down_proj.weight)
    return ours


def sequence(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SEQ, BATCH, HIDDEN, generator=g), torch.randn(SEQ, BATCH, HIDDEN, generator=g)


def local(t, rank, world, sequence_parallel):
    s = t.shape[0] // world
    return t[rank * s:(rank + 1) * s] if sequence_parallel else t


def fwd_bwd(mlp, x, dy):
    x = x.detach().clone().requires_grad_()
    y = mlp(x)["hidden_states"]
    y.backward(dy)
    return y.detach(), x.grad


def close(name, got, want):
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-5,
                               msg=lambda m: f"{name}: {m}")


def _equals_native(rank, world):
    import torch.distributed as dist

    group = dist.new_group(list(range(world)))
    for hidden_act in ("silu", "gelu"):
        for mode in ("ALL_REDUCE", "REDUCE_SCATTER"):
            tag = f"{hidden_act} {mode} tp={world} rank={rank}"
            config, parallel = configs(hidden_act, mode, world=world)
            torch.manual_seed(0)
            native = native_mlp(config, parallel, group)
            ours = ours_from(native, config, parallel, group)
            assert ours.sequence_parallel == (mode == "REDUCE_SCATTER")
            x, dy = sequence(1)
            sp = mode == "REDUCE_SCATTER"
            x, dy = local(x, rank, world, sp), local(dy, rank, world, sp)
            y_n, dx_n = fwd_bwd(native, x, dy)
            y_o, dx_o = fwd_bwd(ours, x, dy)
            close(f"{tag} y", y_o, y_n)
            close(f"{tag} dx", dx_o, dx_n)
            close(f"{tag} d gate_up", gated_layout.to_blocks(ours.gate_up_proj.weight.grad),
                  native.gate_up_proj.weight.grad)
            close(f"{tag} d down", ours.down_proj.weight.grad, native.down_proj.weight.grad)


@pytest.mark.parametrize("world", [1, 2])
def test_ours_equals_nanotrons_mlp(world):
    run_distributed(world, _equals_native)


def _async_reduce_scatter_against_reference(rank, world):
    """Nanotron's async REDUCE_SCATTER mode: ours is held to the fp64 reference (not to
    Nanotron's output, whose async row-parallel backward is wrong in 0.4)."""
    import torch.distributed as dist

    group = dist.new_group(list(range(world)))
    config, parallel = configs("silu", "REDUCE_SCATTER", async_comm=True, world=world)
    torch.manual_seed(0)
    native = native_mlp(config, parallel, group)
    ours = ours_from(native, config, parallel, group)
    # the global weights, gathered from every rank's native [gate_r; up_r] shard
    shards = [torch.empty_like(native.gate_up_proj.weight) for _ in range(world)]
    dist.all_gather(shards, native.gate_up_proj.weight.detach().contiguous())
    gate = torch.cat([s.chunk(2)[0] for s in shards])
    up = torch.cat([s.chunk(2)[1] for s in shards])
    downs = [torch.empty_like(native.down_proj.weight) for _ in range(world)]
    dist.all_gather(downs, native.down_proj.weight.detach().contiguous())
    w1 = gated_layout.interleave(gate, up)
    w2 = torch.cat(downs, dim=1)
    x, dy = sequence(2)
    ref_y, ref = reference.mlp_with_grads(x, w1, w2, "swiglu", dy=dy)
    y, dx = fwd_bwd(ours, local(x, rank, world, True), local(dy, rank, world, True))
    close("y", y, local(ref_y, rank, world, True))
    close("dx", dx, local(ref["x"], rank, world, True))
    n = INTER // world
    close("dW1", ours.gate_up_proj.weight.grad, ref["w1"][2 * rank * n:2 * (rank + 1) * n])
    close("dW2", ours.down_proj.weight.grad, ref["w2"][:, rank * n:(rank + 1) * n])


def test_async_reduce_scatter_mode_matches_the_reference():
    run_distributed(2, _async_reduce_scatter_against_reference)


def _overlap_follows_async_communication(rank, world):
    """tp_linear_async_communication=True asks for "auto" overlap (on with NCCL, so off on this
    gloo group); tp_comm_overlap=True forces our block-by-block overlap, which runs and matches
    the plain layer; a bad value is refused at construction."""
    import torch.distributed as dist

    group = dist.new_group(list(range(world)))
    config, parallel = configs("silu", "REDUCE_SCATTER", async_comm=True, world=world)
    torch.manual_seed(0)
    native = native_mlp(config, parallel, group)
    assert ours_from(native, config, parallel, group).tp_comm_overlap == "auto"
    assert ours_from(native, *configs("silu", "REDUCE_SCATTER", world=world), group).tp_comm_overlap is False
    plain = ours_from(native, config, parallel, group)
    forced = NanotronParallelMLP(config, parallel, group, backend="torch", tp_comm_overlap=True)
    forced.load_state_dict(plain.state_dict())
    x, dy = (local(t, rank, world, True) for t in sequence(4))
    with counting_block_reduce_scatters() as blocks:
        y_p, dx_p = fwd_bwd(plain, x, dy)
        assert not blocks  # "auto" on gloo: off
        y_f, dx_f = fwd_bwd(forced, x, dy)
        assert len(blocks) == 2  # fc2 forward and dx backward
    close("y", y_f, y_p)
    close("dx", dx_f, dx_p)
    close("d gate_up", forced.gate_up_proj.weight.grad, plain.gate_up_proj.weight.grad)
    close("d down", forced.down_proj.weight.grad, plain.down_proj.weight.grad)
    with pytest.raises(ValueError, match="tp_comm_overlap=1.5"):
        NanotronParallelMLP(config, parallel, group, tp_comm_overlap=1.5)
    with pytest.raises(TypeError, match=r"recompute must be True or False, got str \('no'\)"):
        NanotronParallelMLP(config, parallel, group, recompute="no")
    with pytest.raises(ValueError, match=r"backend='cuda' is not known"):
        NanotronParallelMLP(config, parallel, group, backend="cuda")


def test_tp_comm_overlap_follows_async_communication():
    run_distributed(2, _overlap_follows_async_communication)


# ---- checkpoints --------------------------------------------------------------------------------


def _save(rank, world, kind, root):
    import torch.distributed as dist
    from nanotron.serialize import save_weights

    from pathlib import Path

    group = dist.new_group(list(range(world)))
    config, parallel = configs(world=world)
    torch.manual_seed(10)
    native = native_mlp(config, parallel, group)
    mlp = native if kind == "native" else ours_from(native, config, parallel, group)
    save_weights(mlp, nanotron_cpu.SerializeContext(group), Path(root))
    x, _ = sequence(3)
    y = mlp(x)["hidden_states"].detach()
    if rank == 0:
        torch.save({"x": x, "y": y}, os.path.join(root, "io.pt"))


def _load(rank, world, kind, root):
    import torch.distributed as dist
    from nanotron.serialize import load_weights

    from pathlib import Path

    group = dist.new_group(list(range(world)))
    config, parallel = configs(world=world)
    torch.manual_seed(11)  # other weights until the load
    mlp = native_mlp(config, parallel, group)
    if kind == "ours":
        mlp = NanotronParallelMLP(config, parallel, group, backend="torch")
    load_weights(mlp, nanotron_cpu.SerializeContext(group), Path(root))
    io = torch.load(os.path.join(root, "io.pt"))
    close(f"{kind} at tp={world} from {root}", mlp(io["x"])["hidden_states"], io["y"])


@pytest.mark.parametrize("save_tp,load_tp", [(2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("direction", ["native->ours", "ours->native"])
def test_checkpoints_move_between_nanotron_and_ours(direction, save_tp, load_tp, tmp_path):
    writer, reader = direction.split("->")
    run_distributed(save_tp, _save, writer, str(tmp_path))
    # The interleaved weight never shares a file name with Nanotron's: at the same TP size the
    # loader cannot copy one raw into the other (it reshards through the slice metadata instead).
    files = sorted(os.listdir(tmp_path / "model" / "gate_up_proj"))
    prefix = "model_weight_pp" if writer == "native" else "model_weight__pp"
    assert files and all(f.startswith(prefix) for f in files), files
    run_distributed(load_tp, _load, reader, str(tmp_path))


# ---- building a Llama with it --------------------------------------------------------------------


def _context_manager(rank, world):
    import torch.distributed as dist
    from nanotron.parallel.tensor_parallel.nn import TensorParallelColumnLinear

    llama = nanotron_cpu.import_llama()
    group = dist.new_group(list(range(world)))
    config, parallel = configs(world=world)
    stock = llama.MLP
    with llama_with_parallel_mlp(recompute=True):
        mlp = llama.MLP(config=config, parallel_config=parallel, tp_pg=group)
        assert isinstance(mlp, NanotronParallelMLP) and mlp.recompute
    assert llama.MLP is stock

    # A model with one of Nanotron's own linears and our MLP: the stock initialization refuses
    # our MLP, the one inside the context initializes both the way Nanotron does.
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = TensorParallelColumnLinear(HIDDEN, 64, pg=group, mode=parallel.tp_mode,
                                                   bias=False)
            self.mlp = NanotronParallelMLP(config, parallel, group)

    model = Model()
    train_config = SimpleNamespace(model=SimpleNamespace(
        init_method=SimpleNamespace(std=0.5), model_config=SimpleNamespace(num_hidden_layers=8)))
    with pytest.raises(Exception, match="was not intialized"):
        llama.LlamaForTraining.init_model_randomly(model, train_config)
    with llama_with_parallel_mlp():
        llama.LlamaForTraining.init_model_randomly(model, train_config)
    assert model.mlp is model._modules["mlp"] and isinstance(model.mlp, NanotronParallelMLP)
    assert abs(model.proj.weight.std().item() - 0.5) < 0.1
    assert abs(model.mlp.gate_up_proj.weight.std().item() - 0.5) < 0.1
    assert abs(model.mlp.down_proj.weight.std().item() - 0.5 / 4) < 0.03  # std / sqrt(2 L)


def test_llama_is_built_and_initialized_with_our_mlp():
    run_distributed(2, _context_manager)


def test_parameters_are_marked_for_nanotron():
    from nanotron.parallel.parameters import NanotronParameter

    config, parallel = configs()
    mlp = NanotronParallelMLP(config, parallel, None, backend="torch")
    names = dict(mlp.named_parameters())
    assert sorted(names) == ["down_proj.weight", "gate_up_proj.weight_"]
    for name, p in names.items():
        assert isinstance(p, NanotronParameter) and p.is_sharded and not p.is_tied, name
    info = names["gate_up_proj.weight_"].get_sharded_info()
    assert info.unsharded_shape == (2 * INTER, HIDDEN)
    assert [str(pair) for pair in info.local_global_slices_pairs] == [
        f"0,{2 * INTER},2|None,None,None#0,{INTER},None|None,None,None",
        f"1,{2 * INTER},2|None,None,None#{INTER},{2 * INTER},None|None,None,None"]
    with pytest.raises(ValueError, match="hidden_act='quick_gelu' has no parallel_mlp activation"):
        NanotronParallelMLP(configs("quick_gelu")[0], parallel, None)


def _our_metadata(p):
    return {k: getattr(p, k, None) for k in ("tensor_model_parallel", "partition_dim",
                                             "partition_stride", "allreduce",
                                             "_muon_reshape_functions")}


@pytest.mark.parametrize("how", ["to_empty", "assign", "deepcopy", "double"])
def test_tp_metadata_survives_new_parameters(how):
    """Megatron's TP attributes and the Muon split live on our parameters whatever replaces them
    (Nanotron's own sharded info on a NanotronParameter is Nanotron's to keep, and its stock MLP
    loses it the same way)."""
    import copy

    config, parallel = configs()
    mlp = NanotronParallelMLP(config, parallel, None, backend="torch")
    want = {n: _our_metadata(p) for n, p in mlp.named_parameters()}
    assert want["gate_up_proj.weight_"]["partition_dim"] == 0
    assert want["down_proj.weight"]["partition_dim"] == 1
    assert want["down_proj.weight"]["_muon_reshape_functions"] is None
    if how == "to_empty":
        mlp = NanotronParallelMLP(config, parallel, None, backend="torch", device="meta")
        mlp = mlp.to_empty(device="cpu")
    elif how == "assign":
        mlp.load_state_dict({k: v.clone() for k, v in mlp.state_dict().items()}, assign=True)
    elif how == "deepcopy":
        mlp = copy.deepcopy(mlp)
    else:
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            mlp = mlp.double()
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
    got = {n: _our_metadata(p) for n, p in mlp.named_parameters()}
    assert got == want


def test_a_bad_load_changes_nothing():
    config, parallel = configs()
    mlp = NanotronParallelMLP(config, parallel, None, backend="torch")
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    bad = {k: torch.randn_like(v) for k, v in mlp.state_dict().items()}
    bad["down_proj.weight"] = torch.zeros(HIDDEN, INTER + 1)
    with pytest.raises(ValueError, match=r"'down_proj.weight'\] has shape \(16, 25\), expected this "
                                         r"rank's shape \(16, 24\)"):
        mlp.load_state_dict(bad)
    assert all(torch.equal(v, before[k]) for k, v in mlp.state_dict().items())


@pytest.mark.gpu
def test_full_llama_trains_with_our_mlp_on_gpu():
    """The whole LlamaForTraining needs CUDA (its P2P buffers) and flash-attn."""
    import importlib.util

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("needs flash-attn, which is not installed")
    run_distributed(1, _full_llama, backend="nccl")


def _full_llama(rank, world):
    import torch.distributed as dist
    from nanotron.config import LlamaConfig, ParallelismArgs
    from nanotron.models import build_model
    from nanotron.parallel import ParallelContext
    from nanotron.random import RandomStates

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))  # read by nanotron
    context = ParallelContext(tensor_parallel_size=world, pipeline_parallel_size=1, data_parallel_size=1)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=256)
    parallel = ParallelismArgs(dp=1, pp=1, tp=world)
    with llama_with_parallel_mlp():
        model = build_model(lambda: nanotron_cpu.import_llama().LlamaForTraining(config=config, parallel_context=context,
                                                     parallel_config=parallel,
                                                     random_states=RandomStates({})),
                            parallel_context=context, dtype=torch.bfloat16,
                            device=torch.device("cuda"))
    assert isinstance(model.model.decoder[0].pp_block.mlp, NanotronParallelMLP)
    ids = torch.randint(0, 256, (2, 64), device="cuda")
    mask = torch.ones_like(ids, dtype=torch.bool)
    out = model(input_ids=ids, input_mask=mask, label_ids=ids, label_mask=mask)
    out["loss"].backward()
    dist.barrier()
