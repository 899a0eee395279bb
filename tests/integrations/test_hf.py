"""parallel_mlp.integrations.hf against the real transformers (tiny random models, nothing
downloaded), on CPU with gloo.

- The converters against an independent interleaving, both directions, and their errors.
- replace_mlps: logits, loss and every gradient of the swapped model equal the original model's
  (ours converted back to gate/up/down by an independent interleaving) at TP 1 and 2, for Llama
  with and without mlp_bias, Llama with the exact gelu, Qwen2 and Mistral, Gemma 2 (whose
  activation is in config.hidden_activation), a tied LM head; and beside transformers' own TP
  (DistributedConfig(tp_size=2)), whose mesh gives the group.
- hf_state_dict equals the original state dict bitwise, and save_pretrained(state_dict=...) then
  from_pretrained gives it back bitwise; save_pretrained without it, with the model's own
  state dict or with distributed_checkpoint=True refuses and writes nothing.
- Bad input: unknown options, a model without MLPs, an activation we lack: clear errors, and the
  model is left as it was.
- Only the plain gated forward is replaced: a module that clamps, scales, normalizes or drops
  out around it is left as it is, with a warning naming it; frozen MLPs stay frozen.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (the 'hf' extra)")

import transformers  # noqa: E402

from dist_utils import run_distributed  # noqa: E402
from parallel_mlp import ParallelMLP  # noqa: E402
from parallel_mlp.integrations.hf import (full_state_dict_to_hf, hf_state_dict,  # noqa: E402
                                          hf_to_full_state_dict, plain_gated_forward,
                                          replace_mlps)

TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
# name -> (model class, config class, config overrides)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "llama_mlp_bias_tied": ("LlamaForCausalLM", "LlamaConfig",
                            dict(mlp_bias=True, tie_word_embeddings=True)),
    "llama_gelu_exact": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_act="gelu")),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(head_dim=8)),
}
EXPECTED_ACTIVATION = {"llama_gelu_exact": "geglu_erf", "gemma2": "geglu"}  # else swiglu
AT_TP2 = ("llama", "llama_mlp_bias_tied", "llama_gelu_exact", "qwen2")


def build(family, seed=0):
    model_cls, config_cls, overrides = FAMILIES[family]
    config = getattr(transformers, config_cls)(**TINY, **overrides)
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config)


def tokens(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (2, 10), generator=g)


def interleave(gate, up):
    """Rows gate[0], up[0], gate[1], up[1], ... written out, independently of parallel_mlp."""
    rows = []
    for g, u in zip(gate, up):
        rows += [g, u]
    return torch.stack(rows)


def expected_shard_grads(ref_mlp, rank, world):
    """This rank's fc1/fc2 gradient shards, from the original MLP's gate/up/down gradients."""
    g, u, d = (getattr(ref_mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))
    out = {"fc1.weight": interleave(g.weight.grad, u.weight.grad).chunk(world)[rank],
           "fc2.weight": d.weight.grad.chunk(world, dim=1)[rank]}
    if g.bias is not None:
        out["fc1.bias"] = interleave(g.bias.grad, u.bias.grad).chunk(world)[rank]
        out["fc2.bias"] = d.bias.grad
    return out


def compare_swapped(ref, model, rank=0, world=1, family=""):
    """The swapped model's logits, loss and gradients equal the original's."""
    ids = tokens()
    want, got = ref(input_ids=ids, labels=ids), model(input_ids=ids, labels=ids)
    want.loss.backward()
    got.loss.backward()
    close = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.logits, want.logits, **close, msg=lambda m: f"{family}: {m}")
    torch.testing.assert_close(got.loss, want.loss, **close)
    ref_params = dict(ref.named_parameters())
    mlps = {n: m for n, m in model.named_modules() if isinstance(m, ParallelMLP)}
    for name, mlp in mlps.items():
        for key, grad in expected_shard_grads(ref.get_submodule(name), rank, world).items():
            ours = mlp.get_parameter(key).grad
            torch.testing.assert_close(ours, grad, **close, msg=lambda m: f"{name}.{key}: {m}")
    for name, p in model.named_parameters():
        if not any(name.startswith(prefix + ".") for prefix in mlps):
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            torch.testing.assert_close(grad, ref_params[name].grad, **close,
                                       msg=lambda m: f"{family} {name}: {m}")


def assert_state_dicts_equal(got, want):
    assert list(got) == list(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def check_refuses_plain_saves(model, directory):
    for kwargs, match in (({}, r"state_dict=None\) would write this rank's ParallelMLP shards"),
                          ({"state_dict": model.state_dict()}, "state_dict holds ParallelMLP "
                                                               "shards"),
                          ({"distributed_checkpoint": True}, "distributed_checkpoint=True")):
        with pytest.raises(ValueError, match=match) as err:
            model.save_pretrained(directory, **kwargs)
        assert "hf_state_dict(model)" in str(err.value)
        assert not os.path.exists(directory) or not os.listdir(directory)


def save_and_reload(model, ref, directory):
    """save_pretrained with hf_state_dict (every rank), then from_pretrained on this rank."""
    state = hf_state_dict(model)
    assert_state_dicts_equal(state, ref.state_dict())
    model.save_pretrained(directory, state_dict=dict(state))  # it empties the dict it is given
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        reloaded = type(ref).from_pretrained(directory)
        assert_state_dicts_equal(reloaded.state_dict(), ref.state_dict())


# ---- converters -----------------------------------------------------------------------------


def test_converters_against_an_independent_interleaving():
    g = torch.Generator().manual_seed(0)
    h, d = 6, 4
    hf = {"gate_proj.weight": torch.randn(h, d, generator=g),
          "up_proj.weight": torch.randn(h, d, generator=g),
          "down_proj.weight": torch.randn(d, h, generator=g),
          "gate_proj.bias": torch.randn(h, generator=g),
          "up_proj.bias": torch.randn(h, generator=g),
          "down_proj.bias": torch.randn(d, generator=g)}
    full = hf_to_full_state_dict(hf)
    assert torch.equal(full["fc1.weight"], interleave(hf["gate_proj.weight"], hf["up_proj.weight"]))
    assert torch.equal(full["fc1.bias"], interleave(hf["gate_proj.bias"], hf["up_proj.bias"]))
    assert full["fc2.weight"] is hf["down_proj.weight"] and full["fc2.bias"] is hf["down_proj.bias"]
    back = full_state_dict_to_hf(full)
    assert list(back) == ["gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias",
                          "down_proj.weight", "down_proj.bias"]
    for key, value in hf.items():
        assert torch.equal(back[key], value), key
    no_bias = {k: v for k, v in hf.items() if k.endswith("weight")}
    assert set(full_state_dict_to_hf(hf_to_full_state_dict(no_bias))) == set(no_bias)


def test_converter_errors():
    w = torch.zeros(6, 4)
    good = {"gate_proj.weight": w, "up_proj.weight": w, "down_proj.weight": w.t()}
    with pytest.raises(ValueError, match=r"missing keys \['up_proj.weight'\]"):
        hf_to_full_state_dict({"gate_proj.weight": w, "down_proj.weight": w.t()})
    with pytest.raises(ValueError, match="gate_proj and up_proj must both have a bias or neither"):
        hf_to_full_state_dict(dict(good, **{"gate_proj.bias": torch.zeros(6)}))
    with pytest.raises(ValueError, match=r"up_proj.weight \(5, 4\) must be the same"):
        hf_to_full_state_dict(dict(good, **{"up_proj.weight": torch.zeros(5, 4)}))
    with pytest.raises(ValueError, match=r"missing \['fc2.weight'\]"):
        full_state_dict_to_hf({"fc1.weight": torch.zeros(6, 4)})
    with pytest.raises(ValueError, match="even number"):
        full_state_dict_to_hf({"fc1.weight": torch.zeros(5, 4), "fc2.weight": torch.zeros(4, 2)})


# ---- the swap at TP 1 (one process) -----------------------------------------------------------


def swapped_copy(family, world=1):
    """The original model and a copy with its MLPs replaced (the swap itself checked)."""
    ref = build(family)
    model = copy.deepcopy(ref)
    swapped = replace_mlps(model, backend="torch")
    assert sorted(swapped) == [f"model.layers.{i}.mlp" for i in range(TINY["num_hidden_layers"])]
    for name, mlp in swapped.items():
        assert model.get_submodule(name) is mlp
        assert mlp.activation.name == EXPECTED_ACTIVATION.get(family, "swiglu"), family
        assert mlp.tp.size == world
        assert mlp.fc1.weight.shape == (2 * TINY["intermediate_size"] // world, TINY["hidden_size"])
    tied = ref.lm_head.weight is ref.model.embed_tokens.weight
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied, family
    return ref, model


def test_swap_equals_the_original_and_saves_in_hf_format_at_tp1(tmp_path):
    for family in FAMILIES:
        ref, model = swapped_copy(family)
        compare_swapped(ref, model, family=family)
        check_refuses_plain_saves(model, str(tmp_path / f"{family}-refused"))
        save_and_reload(model, ref, str(tmp_path / family))


def test_bad_input_leaves_the_model_as_it_was():
    model = build("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TypeError, match=r"unknown options \['sequence_parallel'\] \(HF models hand "
                                        r"their MLPs the whole, replicated sequence\)"):
        replace_mlps(model, sequence_parallel=True)
    with pytest.raises(TypeError, match=r"unknown options \['bias1'\]; known"):
        replace_mlps(model, bias1=True)
    with pytest.raises(ValueError, match="has no module with nn.Linear gate_proj, up_proj"):
        replace_mlps(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    # An activation we lack, on the second layer only: the first must not be swapped either.
    model.model.layers[1].mlp.act_fn = transformers.activations.ACT2FN["quick_gelu"]
    with pytest.raises(ValueError, match=r"model.layers.1.mlp: act_fn=QuickGELUActivation has no "
                                         r"parallel_mlp activation"):
        replace_mlps(model)
    assert not any(isinstance(m, ParallelMLP) for m in model.modules())
    assert_state_dicts_equal(model.state_dict(), before)
    assert "save_pretrained" not in vars(model)


class _Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (torch.nn.Linear(4, 4) for _ in range(3))
        self.act_fn = torch.nn.SiLU()


class _OneLine(_Plain):
    def forward(self, hidden_state):
        """A docstring changes nothing."""
        return self.down_proj(self.up_proj(hidden_state) * self.act_fn(self.gate_proj(hidden_state)))


class _Steps(_Plain):
    def forward(self, x):
        gate = self.act_fn(self.gate_proj(x))
        up = self.up_proj(x)
        out = self.down_proj(gate * up)
        return out


class _Clamped(_Plain):
    def forward(self, x):
        gate = self.gate_proj(x).clamp(max=7.0)
        return self.down_proj(self.act_fn(gate) * self.up_proj(x))


class _Scaled(_Plain):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) * 0.5


class _Branch(_Plain):
    def forward(self, x):
        g = self.gate_proj(x)
        if self.training:
            g = g * 2
        return self.down_proj(self.act_fn(g) * self.up_proj(x))


class _OtherInput(_Plain):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x * x))


def test_plain_gated_forward_reads_the_forward():
    assert plain_gated_forward(transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
                               .model.layers[0].mlp.__class__)
    for cls in (_OneLine, _Steps):
        assert plain_gated_forward(cls), cls.__name__
    for cls in (_Clamped, _Scaled, _Branch, _OtherInput, _Plain):  # _Plain: nn.Module's forward
        assert not plain_gated_forward(cls), cls.__name__


def test_another_forward_is_left_as_it_is_with_a_warning():
    ref = build("llama")
    # the second layer's MLP scales its output: ParallelMLP would drop that
    scaled = type("ScaledLlamaMLP", (type(ref.model.layers[1].mlp),),
                  {"forward": _Scaled.forward})
    ref.model.layers[1].mlp.__class__ = scaled
    model = copy.deepcopy(ref)
    with pytest.warns(UserWarning, match=r"left ScaledLlamaMLP as they are: their forward is "
                                         r"not down_proj"):
        swapped = replace_mlps(model, backend="torch")
    assert list(swapped) == ["model.layers.0.mlp"]
    assert type(model.model.layers[1].mlp) is scaled
    compare_swapped(ref, model, family="llama, one scaled MLP")
    only_odd = torch.nn.Sequential(_Clamped())
    with pytest.raises(ValueError, match=r"modules with gate_proj, up_proj and down_proj "
                                         r"\(_Clamped\) do not qualify: their forward is not"):
        replace_mlps(only_odd)


def test_frozen_mlps_stay_frozen():
    model = build("llama_mlp_bias_tied")
    for p in model.model.layers[0].mlp.parameters():
        p.requires_grad_(False)
    swapped = replace_mlps(model, backend="torch")
    assert not any(p.requires_grad for p in swapped["model.layers.0.mlp"].parameters())
    assert all(p.requires_grad for p in swapped["model.layers.1.mlp"].parameters())
    half = build("llama")
    half.model.layers[1].mlp.gate_proj.weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"model.layers.1.mlp: gate_proj.weight and "
                                         r"up_proj.weight must be frozen alike"):
        replace_mlps(half)
    assert not any(isinstance(m, ParallelMLP) for m in half.modules())


def test_a_model_built_on_meta_gets_meta_mlps():
    """Nothing to convert yet: the ParallelMLPs stay on meta, to be materialized and loaded."""
    with torch.device("meta"):
        model = build("llama_mlp_bias_tied")
    swapped = replace_mlps(model, backend="torch")
    for mlp in swapped.values():
        assert all(p.device.type == "meta" for p in mlp.parameters())
        mlp.to_empty(device="cpu")
        mlp.reset_parameters()
        assert mlp.fc1.bias is not None and mlp.fc1.weight.partition_dim == 0


# ---- TP 2 -------------------------------------------------------------------------------------


def swap_at_tp2(rank, world, directory):
    for family in AT_TP2:
        ref, model = swapped_copy(family, world)
        compare_swapped(ref, model, rank, world, family)
        assert_state_dicts_equal(hf_state_dict(model), ref.state_dict())
    check_refuses_plain_saves(model, f"{directory}/refused-{rank}")
    save_and_reload(model, ref, f"{directory}/saved")


@pytest.mark.slow
def test_swap_equals_the_original_at_tp2(tmp_path):
    run_distributed(2, swap_at_tp2, str(tmp_path))


def beside_hf_tp(rank, world, source, directory):
    from torch.distributed.tensor import DTensor
    from transformers.distributed import DistributedConfig

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    cls = transformers.LlamaForCausalLM
    ref = cls.from_pretrained(source)
    model = cls.from_pretrained(source, distributed_config=DistributedConfig(tp_size=world))
    assert model.tp_size == world
    swapped = replace_mlps(model, backend="torch")  # the group: the "tp" dim of the model's mesh
    for mlp in swapped.values():
        assert mlp.tp.size == world
    assert isinstance(model.model.layers[0].self_attn.q_proj.weight, DTensor)  # HF's TP stays
    compare_swapped(ref, model, rank, world, "llama under HF TP")
    check_refuses_plain_saves(model, f"{directory}/refused-{rank}")
    save_and_reload(model, ref, f"{directory}/saved")


@pytest.mark.slow
def test_beside_transformers_tensor_parallelism(tmp_path):
    source = str(tmp_path / "tiny-llama")
    build("llama_mlp_bias_tied").save_pretrained(source)
    run_distributed(2, beside_hf_tp, source, str(tmp_path))
