"""Full (unsharded) state dicts, so a checkpoint written at one TP size loads at any other.

The global fc1 weight is the rank-order concatenation of the shards along dim 0 (interleaving is
kept per shard), fc2's along dim 1; fc1's bias is split like its rows, fc2's is replicated.
"""

from __future__ import annotations

import torch

from .tp import all_gather_cat


def _layout(mlp) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Each key's global shape and the dim it is split along (None: replicated)."""
    layout = {"fc1.weight": ((mlp.fc1_features, mlp.in_features), 0),
              "fc2.weight": ((mlp.out_features, mlp.hidden_features), 1)}
    if mlp.fc1.bias is not None:
        layout["fc1.bias"] = ((mlp.fc1_features,), 0)
    if mlp.fc2.bias is not None:
        layout["fc2.bias"] = ((mlp.out_features,), None)
    return layout


def gather_full_state_dict(mlp) -> dict[str, torch.Tensor]:
    params = dict(mlp.named_parameters())
    out = {}
    with torch.no_grad():
        for key, (_, dim) in _layout(mlp).items():
            local = params[key].detach()
            out[key] = local.clone() if dim is None else all_gather_cat(local, mlp.tp, dim)
    return out


def _check(mlp, state_dict) -> None:
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
    layout = _layout(mlp)
    missing = sorted(set(layout) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(layout))
    if missing or unexpected:
        raise ValueError(f"state_dict does not fit this ParallelMLP: missing keys {missing}, "
                         f"unexpected keys {unexpected}")
    for key, (shape, _) in layout.items():
        t = state_dict[key]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict[{key!r}] must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            hint = ""
            if key == "fc1.weight" and mlp.activation.gated and t.shape[0] * 2 == shape[0]:
                hint = " (it looks like a non-gated fc1; this module's activation is gated)"
            elif key == "fc1.weight" and not mlp.activation.gated and t.shape[0] == 2 * shape[0]:
                hint = " (it looks like a gated fc1; this module's activation is not gated)"
            raise ValueError(f"state_dict[{key!r}] has shape {tuple(t.shape)}, expected the "
                             f"global shape {shape}{hint}")
        if not t.is_floating_point():
            raise TypeError(f"state_dict[{key!r}] must be floating point, got dtype {t.dtype}")


def load_full_state_dict(mlp, state_dict) -> None:
    _check(mlp, state_dict)  # everything is checked before anything is written
    params = dict(mlp.named_parameters())
    with torch.no_grad():
        for key, (_, dim) in _layout(mlp).items():
            full = state_dict[key]
            part = full if dim is None else full.chunk(mlp.tp.size, dim)[mlp.tp.rank]
            params[key].copy_(part)
