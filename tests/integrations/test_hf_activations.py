"""Hugging Face activation names against the functions transformers itself runs for them."""

import pytest
import torch

import reference
from parallel_mlp.integrations.hf_activations import GATED, gated_activation


def test_each_name_computes_what_transformers_does():
    acts = pytest.importorskip("transformers.activations", reason="transformers is not installed")
    g, u = torch.randn(50, dtype=torch.float64) * 3, torch.randn(50, dtype=torch.float64)
    for hidden_act, ours in GATED.items():
        want = acts.ACT2FN[hidden_act](g) * u
        got = reference.act(ours, torch.stack([g, u], dim=-1).flatten())
        torch.testing.assert_close(got, want, msg=lambda m: f"{hidden_act} -> {ours}: {m}")


def test_unknown_names_are_refused_with_the_choices():
    assert gated_activation("silu") == "swiglu"
    with pytest.raises(ValueError, match=r"hidden_act='quick_gelu' has no parallel_mlp activation; supported: \["):
        gated_activation("quick_gelu")
