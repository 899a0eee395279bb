"""parallel_mlp.integrations.megatron against the real megatron-core, on CPU with gloo.

- Ours equals Megatron's own MLP (weights moved between them through a distributed checkpoint):
  output, returned bias, input grad and weight grads (ours converted to the stock [gate; up]
  layout), at TP 1 and 2, with and without sequence parallelism, gated and not, with and without
  biases, Megatron's default exact gelu included.
- Checkpoints: the stock MLP's TP=2 checkpoint loads into ours at TP 1, 2 and 4, and ours loads
  back into the stock MLP, with the same outputs; the singleton-local-shards format too.
- A tiny GPTModel from our layer spec trains at TP=2 (loss falls), with sequence parallelism,
  Megatron's selective recompute of the MLP, and our own fc1 recompute.
- Metadata, activations, errors and the specs.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the 'megatron' extra)")

import megatron_cpu  # noqa: E402
from dist_utils import counting_block_reduce_scatters, run_distributed  # noqa: E402

SEQ, BATCH = 8, 3

# (name for the test ids, TransformerConfig overrides): gated and not, Megatron's default F.gelu.
ACTIVATIONS = {
    "swiglu": dict(gated_linear_unit=True, activation_func=F.silu),
    "geglu_erf": dict(gated_linear_unit=True, activation_func=F.gelu),
    "gelu": dict(gated_linear_unit=False, activation_func=F.gelu),
    "relu_sq": dict(gated_linear_unit=False, activation_func="squared_relu"),
}


def _config(activation, **overrides):
    kw = dict(ACTIVATIONS[activation])
    if kw["activation_func"] == "squared_relu":
        from megatron.core.activations import squared_relu

        kw["activation_func"] = squared_relu
    kw.update(overrides)
    return megatron_cpu.transformer_config(**kw)


def stock_mlp(config):
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module

    spec = ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                           linear_fc2=RowParallelLinear))
    return build_module(spec, config=config, ffn_hidden_size=config.ffn_hidden_size)


def our_mlp(config, **options):
    from megatron.core.transformer.spec_utils import build_module

    from parallel_mlp.integrations.megatron import mlp_spec

    return build_module(mlp_spec(backend="torch", **options), config=config)


def _metadata(**extra):
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    return dict(ensure_metadata_has_dp_cp_group(None), **extra)


def save(module, directory, **metadata):
    from megatron.core import dist_checkpointing

    os.makedirs(directory, exist_ok=True)
    dist_checkpointing.save(module.sharded_state_dict(prefix="mlp.", metadata=_metadata(**metadata)),
                            directory)


def load(module, directory, **metadata):
    """Megatron's two-step load: the checkpoint into the module's sharded state dict, then
    load_state_dict (strict: every key, ours included, must be Megatron's)."""
    from megatron.core import dist_checkpointing

    sharded = module.sharded_state_dict(prefix="mlp.", metadata=_metadata(**metadata))
    loaded = dist_checkpointing.load(sharded, directory)
    result = module.load_state_dict({k[len("mlp."):]: v for k, v in loaded.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def sequence(seed=0, d=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SEQ, BATCH, d, generator=g), torch.randn(SEQ, BATCH, d, generator=g)


def run(mlp, x, dy):
    x = x.detach().clone().requires_grad_()
    out, bias = mlp(x)
    y = out if bias is None else out + bias
    y.backward(dy)
    return y.detach(), x.grad


def close(name, got, want):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


# ---- ours == stock ----------------------------------------------------------------------------


def _ours_equals_stock(rank, world, root):
    from parallel_mlp.integrations.gated_layout import to_blocks

    megatron_cpu.init_megatron(world)
    for activation in ACTIVATIONS:
        for bias in (False, True):
            for sp in ((False, True) if world > 1 else (False,)):
                tag = f"{activation} tp={world} bias={bias} sp={sp} rank={rank}"
                config = _config(activation, add_bias_linear=bias, sequence_parallel=sp)
                torch.manual_seed(1)
                stock = stock_mlp(config)
                torch.manual_seed(2)  # different weights until the checkpoint moves them
                ours = our_mlp(config)
                path = os.path.join(root, f"{activation}-{bias}-{sp}")
                save(stock, path)
                load(ours, path)
                x, dy = sequence()
                if sp:  # each rank feeds and gets back its slice of the sequence
                    s = SEQ // world
                    x, dy = x[rank * s:(rank + 1) * s], dy[rank * s:(rank + 1) * s]
                y_s, dx_s = run(stock, x, dy)
                y_o, dx_o = run(ours, x, dy)
                close(f"{tag} y", y_o, y_s)
                close(f"{tag} dx", dx_o, dx_s)
                w1 = ours.linear_fc1.weight.grad
                close(f"{tag} dW1", to_blocks(w1) if config.gated_linear_unit else w1,
                      stock.linear_fc1.weight.grad)
                close(f"{tag} dW2", ours.linear_fc2.weight.grad, stock.linear_fc2.weight.grad)
                if bias:
                    b1 = ours.linear_fc1.bias.grad
                    close(f"{tag} db1", to_blocks(b1) if config.gated_linear_unit else b1,
                          stock.linear_fc1.bias.grad)
                    close(f"{tag} db2", ours.linear_fc2.bias.grad, stock.linear_fc2.bias.grad)


@pytest.mark.parametrize("world", [1, 2])
def test_ours_equals_the_stock_mlp(world, tmp_path):
    run_distributed(world, _ours_equals_stock, str(tmp_path))


# ---- checkpoints across TP sizes --------------------------------------------------------------


# Megatron's two checkpoint formats for a gated fc1: one [gate; up] global (default), or two
# globals, <key>_w and <key>_v (singleton_local_shards).
FORMATS = {"default": {}, "singleton": {"singleton_local_shards": True}}


def _stock_saves(rank, world, root):
    megatron_cpu.init_megatron(world)
    config = _config("swiglu", add_bias_linear=True)
    torch.manual_seed(3)
    stock = stock_mlp(config)
    for fmt, metadata in FORMATS.items():
        save(stock, os.path.join(root, f"stock-{fmt}"), **metadata)
    x, _ = sequence(5)
    y, bias = stock(x)
    if rank == 0:
        torch.save({"x": x, "y": (y + bias).detach()}, os.path.join(root, "stock_io.pt"))


def _loads(rank, world, root, kind, source):
    """A fresh MLP of `kind` ("ours" or "stock") at TP=world loads checkpoint `source` in each
    format and reproduces the stock TP=2 output; ours then saves itself as ours<world>."""
    megatron_cpu.init_megatron(world)
    config = _config("swiglu", add_bias_linear=True)
    io = torch.load(os.path.join(root, "stock_io.pt"))
    for fmt, metadata in FORMATS.items():
        torch.manual_seed(4)  # other weights until the load
        mlp = our_mlp(config) if kind == "ours" else stock_mlp(config)
        load(mlp, os.path.join(root, f"{source}-{fmt}"), **metadata)
        y, bias = mlp(io["x"])
        close(f"{kind} at tp={world} from {source} ({fmt})", y + bias, io["y"])
        if kind == "ours":
            save(mlp, os.path.join(root, f"ours{world}-{fmt}"), **metadata)


def test_checkpoints_move_between_stock_and_ours_at_any_tp(tmp_path):
    root = str(tmp_path)
    run_distributed(2, _stock_saves, root)
    for world in (1, 2, 4):  # the stock TP=2 checkpoint into ours
        run_distributed(world, _loads, root, "ours", "stock")
    run_distributed(1, _loads, root, "stock", "ours4")  # ours (TP=4) into stock TP=1
    run_distributed(2, _loads, root, "stock", "ours1")  # ours (TP=1) into stock TP=2


def _interleaved_checkpoint_would_mislead(rank, world, root):
    """Why the factory matters: our shards written as plain row blocks (the interleaved layout
    under the stock key) load into the stock MLP without error and compute something else."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    megatron_cpu.init_megatron(world)
    config = _config("swiglu")
    torch.manual_seed(6)
    ours = our_mlp(config)
    naive = ours.sharded_state_dict(prefix="mlp.", metadata=_metadata())
    naive["mlp.linear_fc1.weight"] = make_sharded_tensors_for_checkpoint(
        {"weight": ours.linear_fc1.weight}, "mlp.linear_fc1.", {"weight": 0})["mlp.linear_fc1.weight"]
    from megatron.core import dist_checkpointing

    os.makedirs(os.path.join(root, "naive"), exist_ok=True)
    dist_checkpointing.save(naive, os.path.join(root, "naive"))
    stock = stock_mlp(config)
    load(stock, os.path.join(root, "naive"))
    x, _ = sequence(7)
    assert not torch.allclose(stock(x)[0], ours(x)[0], atol=1e-3)


def test_an_unconverted_interleaved_checkpoint_loads_silently_wrong(tmp_path):
    run_distributed(2, _interleaved_checkpoint_would_mislead, str(tmp_path))


# ---- a GPT model from our layer spec ----------------------------------------------------------


VOCAB, GPT_SEQ, GPT_BATCH = 64, 16, 4


def _tokens(step):
    g = torch.Generator().manual_seed(100 + step)
    start = torch.randint(0, VOCAB, (GPT_BATCH, 1), generator=g)
    stride = torch.randint(1, 4, (GPT_BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(GPT_SEQ + 1)) % VOCAB  # learnable arithmetic sequences
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def gpt_losses(config, layer_spec, steps):
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    model = GPTModel(config=config, transformer_layer_spec=layer_spec, vocab_size=VOCAB,
                     max_sequence_length=GPT_SEQ, position_embedding_type="rope")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    pos = torch.arange(GPT_SEQ).unsqueeze(0).expand(GPT_BATCH, GPT_SEQ)
    # The causal mask given explicitly: Megatron's default one is built on CUDA.
    mask = torch.triu(torch.ones(GPT_SEQ, GPT_SEQ, dtype=torch.bool), 1)[None, None]
    losses = []
    for step in range(steps):
        tokens, labels = _tokens(step)
        loss = model(tokens, pos, attention_mask=mask, labels=labels).float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if config.sequence_parallel:  # what Megatron's finalize_model_grads does for these
            for p in model.parameters():
                if getattr(p, "sequence_parallel", False) and p.grad is not None:
                    dist.all_reduce(p.grad, group=parallel_state.get_tensor_model_parallel_group())
        opt.step()
        losses.append(loss.item())
    return model, losses


def _gpt_trains(rank, world, case):
    from parallel_mlp.integrations.megatron import MegatronParallelMLP, gpt_layer_spec

    megatron_cpu.init_megatron(world)
    extra = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, gated_linear_unit=True,
                 activation_func=F.silu, add_bias_linear=True)
    options = {}
    if case == "sequence_parallel":
        extra["sequence_parallel"] = True
    elif case == "megatron_recompute":
        extra.update(recompute_granularity="selective", recompute_modules=["mlp"])
    elif case == "our_recompute":
        options["recompute"] = True
    config = megatron_cpu.transformer_config(**extra)
    model, losses = gpt_losses(config, gpt_layer_spec(backend="torch", **options), steps=25)
    assert isinstance(model.decoder.layers[0].mlp, MegatronParallelMLP)
    assert model.decoder.layers[0].mlp.recompute == (case == "our_recompute")
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.7 * first, f"{case}: loss {first:.3f} -> {last:.3f} did not fall: {losses}"


@pytest.mark.parametrize("case", ["plain", "sequence_parallel", "megatron_recompute", "our_recompute"])
def test_gpt_from_our_layer_spec_trains_at_tp2(case):
    run_distributed(2, _gpt_trains, case)


# ---- metadata, grads into main_grad -----------------------------------------------------------


def _metadata_matches_stock(rank, world):
    megatron_cpu.init_megatron(world)
    for sp in (False, True):
        config = _config("swiglu", add_bias_linear=True, sequence_parallel=sp)
        stock, ours = stock_mlp(config), our_mlp(config)
        assert list(stock.state_dict()) == list(ours.state_dict())
        stock_params, our_params = dict(stock.named_parameters()), dict(ours.named_parameters())
        assert list(stock_params) == list(our_params)
        for name, p in stock_params.items():
            q = our_params[name]
            assert q.shape == p.shape and q.dtype == p.dtype, name
            for attr in ("tensor_model_parallel", "partition_dim", "allreduce", "sequence_parallel"):
                if hasattr(p, attr):
                    assert getattr(q, attr) == getattr(p, attr), (name, attr, sp)
        # Megatron strides its gated fc1 by 2 for [gate_r; up_r]; ours is contiguous per shard
        assert ours.linear_fc1.weight.partition_stride == 1
        assert hasattr(ours.linear_fc1.weight, "_muon_reshape_functions")


def test_parameters_carry_megatrons_metadata():
    run_distributed(2, _metadata_matches_stock)


def _fused_main_grad(rank, world):
    """gradient_accumulation_fusion: the wgrads accumulate into main_grad over micro-batches,
    grad_added_to_main_grad is set and autograd gets Megatron's dummy gradient."""
    megatron_cpu.init_megatron(world)
    config = _config("swiglu", gradient_accumulation_fusion=True)
    torch.manual_seed(8)
    ours = our_mlp(config)
    plain = our_mlp(_config("swiglu"))
    plain.load_state_dict(ours.state_dict())
    weights = (ours.linear_fc1.weight, ours.linear_fc2.weight)
    for p in weights:
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
        p.grad_added_to_main_grad = False
    for step in range(3):
        x, dy = sequence(10 + step)
        run(ours, x, dy)
        run(plain, x, dy)
    for p, q in zip(weights, (plain.linear_fc1.weight, plain.linear_fc2.weight)):
        assert p.grad_added_to_main_grad is True
        close("main_grad", p.main_grad, q.grad)


def test_gradient_accumulation_fusion_fills_main_grad():
    run_distributed(2, _fused_main_grad)


def _under_megatron_ddp(rank, world):
    """The real DistributedDataParallel and finalize_model_grads around a GPT from our layer spec,
    sequence parallel, with our MLP's fused accumulation (mlp_spec(fuse_grad_accum=True): the
    config flag would make Megatron's attention linears demand APEX): over two micro-batches every
    main_grad
    (ours written in place by the wgrad GEMMs, the rest by DDP's hooks; the sequence-parallel ones
    summed over TP by finalize) equals the plain .grad of an identical model without DDP."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                           finalize_model_grads)
    from megatron.core.models.gpt import GPTModel

    from parallel_mlp.integrations.megatron import gpt_layer_spec

    megatron_cpu.init_megatron(world)
    kw = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, gated_linear_unit=True,
              activation_func=F.silu, add_bias_linear=True, sequence_parallel=True)
    models = {}
    for fused in (True, False):
        torch.manual_seed(0)
        config = megatron_cpu.transformer_config(**kw)
        spec = gpt_layer_spec(backend="torch", fuse_grad_accum=fused)
        models[fused] = GPTModel(config=config, transformer_layer_spec=spec,
                                 vocab_size=VOCAB, max_sequence_length=GPT_SEQ,
                                 position_embedding_type="rope")
    ddp = DistributedDataParallel(config=models[True].config,
                                  ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                  module=models[True])
    ddp.zero_grad_buffer()
    pos = torch.arange(GPT_SEQ).unsqueeze(0).expand(GPT_BATCH, GPT_SEQ)
    mask = torch.triu(torch.ones(GPT_SEQ, GPT_SEQ, dtype=torch.bool), 1)[None, None]
    for step in range(2):
        tokens, labels = _tokens(step)
        ddp(tokens, pos, attention_mask=mask, labels=labels).float().mean().backward()
        models[False](tokens, pos, attention_mask=mask, labels=labels).float().mean().backward()
    finalize_model_grads([ddp])
    tp_group = parallel_state.get_tensor_model_parallel_group()
    mlp = models[True].decoder.layers[0].mlp
    assert mlp.fuse_grad_accum and mlp.linear_fc1.weight.grad_added_to_main_grad is True
    plain = dict(models[False].named_parameters())
    for name, p in models[True].named_parameters():
        want = plain[name].grad.clone()
        if getattr(p, "sequence_parallel", False):
            dist.all_reduce(want, group=tp_group)
        close(f"main_grad of {name}", p.main_grad, want)


def test_fused_accumulation_under_megatrons_ddp():
    run_distributed(2, _under_megatron_ddp)


# ---- activations, errors, specs ---------------------------------------------------------------


def _activation_names():
    from megatron.core import activations as mact
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.utils import openai_gelu

    from parallel_mlp.integrations.megatron import activation_name

    class Config:
        def __init__(self, fn, gated, offset=0.0, clamp=None):
            self.activation_func, self.gated_linear_unit = fn, gated
            self.glu_linear_offset, self.activation_func_clamp_value = offset, clamp

    cases = [(F.silu, True, 0.0, "swiglu"), (quick_gelu, True, 1.0, "swiglu_oai"),
             (mact.quick_gelu, True, 1.0, "swiglu_oai"), (F.relu, True, 0.0, "reglu"),
             (F.sigmoid, True, 0.0, "glu"), (mact.squared_relu, False, 0.0, "relu_sq"),
             (F.relu, False, 0.0, "relu"), (openai_gelu, False, 0.0, "gelu_tanh_approx"),
             (mact.fast_gelu, False, 0.0, "gelu_tanh_approx"), (openai_gelu, True, 0.0, "geglu"),
             (F.gelu, False, 0.0, "gelu"), (F.gelu, True, 0.0, "geglu_erf")]
    for fn, gated, offset, want in cases:
        assert activation_name(Config(fn, gated, offset)) == want, (fn, gated, offset)
    with pytest.raises(ValueError, match=r"activation_func=tanh \(non-gated\) has no parallel_mlp"):
        activation_name(Config(torch.tanh, False))
    with pytest.raises(ValueError, match="glu_linear_offset=1 is supported with quick_gelu"):
        activation_name(Config(F.silu, True, 1.0))
    with pytest.raises(ValueError, match="activation_func_clamp_value=7.0"):
        activation_name(Config(quick_gelu, True, 1.0, clamp=7.0))


def test_megatron_activations_map_to_ours():
    _activation_names()


def _errors(rank, world):
    from megatron.core.transformer.spec_utils import build_module

    from parallel_mlp.integrations.megatron import mlp_spec

    megatron_cpu.init_megatron(world)
    with pytest.raises(ValueError, match="is_expert=True"):
        build_module(mlp_spec(), config=_config("swiglu"), is_expert=True)
    with pytest.raises(ValueError, match="ffn_hidden_size=45 is not divisible by the tensor-parallel size 2"):
        build_module(mlp_spec(), config=_config("swiglu", ffn_hidden_size=45))
    with pytest.raises(TypeError, match=r"mlp_spec: unknown options \['recompte'\]; known"):
        mlp_spec(recompte=True)
    # the options are refused at construction, before a first forward
    with pytest.raises(TypeError, match=r"recompute must be True or False, got str \('no'\)"):
        our_mlp(_config("swiglu"), recompute="no")
    with pytest.raises(TypeError, match=r"fuse_grad_accum must be True or False, got str"):
        our_mlp(_config("swiglu"), fuse_grad_accum="False")
    with pytest.raises(ValueError, match=r"backend='cuda' is not known"):
        build_module(mlp_spec(backend="cuda"), config=_config("swiglu"))
    # a load that does not fit changes nothing (torch's load_state_dict writes what fits first)
    ours = our_mlp(_config("swiglu", add_bias_linear=True))
    before = {k: v.clone() for k, v in ours.state_dict().items() if torch.is_tensor(v)}
    bad = {k: torch.randn_like(v) if torch.is_tensor(v) else v for k, v in ours.state_dict().items()}
    bad["linear_fc2.bias"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"'linear_fc2.bias'\] has shape \(1,\), expected this rank's"):
        ours.load_state_dict(bad)
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items() if torch.is_tensor(v))


def test_errors_name_the_parameter():
    run_distributed(2, _errors)


def _overlap_follows_the_config(rank, world):
    """tp_comm_overlap=True in the TransformerConfig turns on our block-by-block overlap (no
    Transformer Engine userbuffers needed), which runs and gives the results of the plain layer;
    the option overrides the config, and a bad value is refused at construction."""
    megatron_cpu.init_megatron(world)
    config = _config("swiglu", sequence_parallel=True, tp_comm_overlap=True)
    torch.manual_seed(3)
    ours = our_mlp(config)
    plain = our_mlp(config, tp_comm_overlap=False)
    plain.load_state_dict(ours.state_dict())
    assert (ours.tp_comm_overlap, plain.tp_comm_overlap) == (True, False)
    assert our_mlp(_config("swiglu", sequence_parallel=True)).tp_comm_overlap is False
    x, dy = sequence()
    s = SEQ // world
    x, dy = x[rank * s:(rank + 1) * s], dy[rank * s:(rank + 1) * s]
    with counting_block_reduce_scatters() as blocks:
        y_p, dx_p = run(plain, x, dy)
        assert not blocks
        y_o, dx_o = run(ours, x, dy)
        assert len(blocks) == 2  # fc2 forward and dx backward, each reduce-scattered by blocks
    close("y", y_o, y_p)
    close("dx", dx_o, dx_p)
    close("dW1", ours.linear_fc1.weight.grad, plain.linear_fc1.weight.grad)
    close("dW2", ours.linear_fc2.weight.grad, plain.linear_fc2.weight.grad)
    with pytest.raises(ValueError, match="tp_comm_overlap='yes'"):
        our_mlp(config, tp_comm_overlap="yes")


def test_tp_comm_overlap_follows_megatrons_config():
    run_distributed(2, _overlap_follows_the_config)


def _bias_is_a_view(rank, world):
    megatron_cpu.init_megatron(world)
    ours = our_mlp(_config("gelu", add_bias_linear=True))
    out, bias = ours(sequence()[0])
    assert bias is not ours.linear_fc2.bias and bias._base is ours.linear_fc2.bias
    assert torch.equal(bias, ours.linear_fc2.bias)


def test_returned_bias_is_a_view_of_fc2s():
    run_distributed(1, _bias_is_a_view)


def test_layer_specs_put_our_mlp_in():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from parallel_mlp.integrations.megatron import (MegatronParallelMLP, gpt_layer_spec,
                                                    with_parallel_mlp)

    local = gpt_layer_spec(recompute=True)
    assert local.submodules.mlp.module is MegatronParallelMLP
    assert local.submodules.mlp.params == {"recompute": True}
    assert local.submodules.pre_mlp_layernorm is get_gpt_layer_local_spec().submodules.pre_mlp_layernorm

    # A layer that fused its pre-MLP norm into fc1 (Transformer Engine's) gets the norm back
    # in front of our MLP, saved under the fused layer's keys.
    fused = get_gpt_layer_local_spec()
    fused.submodules.pre_mlp_layernorm = IdentityOp
    with pytest.raises(ValueError, match="pass pre_mlp_norm="):
        with_parallel_mlp(fused)
    spec = with_parallel_mlp(fused, pre_mlp_norm=WrappedTorchNorm)
    assert spec.submodules.pre_mlp_layernorm is WrappedTorchNorm
    assert spec.submodules.sharded_state_dict_keys_map["pre_mlp_layernorm."] == "mlp.linear_fc1.layer_norm_"
    assert fused.submodules.pre_mlp_layernorm is IdentityOp  # the input spec is left alone

    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="transformer_engine=True needs Transformer Engine"):
            gpt_layer_spec(transformer_engine=True)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--sequence-parallel", "--recompute"]], ids=["plain", "sp-recompute"])
def test_megatron_example_trains_under_torchrun(flags, tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    from dist_utils import free_port

    example = Path(__file__).resolve().parents[2] / "examples" / "megatron_gpt.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(example),
           "--device", "cpu", "--steps", "30", *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "GPT with MegatronParallelMLP (swiglu), TP=2" in out
    first, last = map(float, re.search(r"first loss (\S+) last loss (\S+)", out).groups())
    assert last < 0.5 * first, (first, last)
