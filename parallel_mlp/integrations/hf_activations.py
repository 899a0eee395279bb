"""Hugging Face activation names (``config.hidden_act``, transformers' ``ACT2FN`` keys, which
Nanotron uses too) -> our gated activation for a ``gate_proj`` / ``up_proj`` / ``down_proj`` MLP,
``down(act(gate(x)) * up(x))``."""

from __future__ import annotations

# The tanh-approximate GELUs all compute 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
GATED = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu": "geglu_erf",             # HF's "gelu" is the exact erf GELU
    "gelu_pytorch_tanh": "geglu",
    "gelu_new": "geglu",
    "gelu_fast": "geglu",
    "relu": "reglu",
    "sigmoid": "glu",
}


def gated_activation(hidden_act: str) -> str:
    """Our activation for a gated MLP with ``hidden_act``; a ValueError lists what maps."""
    try:
        return GATED[hidden_act]
    except (KeyError, TypeError):
        raise ValueError(f"hidden_act={hidden_act!r} has no parallel_mlp activation; supported: "
                         f"{sorted(GATED)}") from None
