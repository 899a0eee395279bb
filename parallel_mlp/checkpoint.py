"""Full (unsharded) state dicts, so a checkpoint written at one TP size loads at any other.

The global fc1 weight is the rank-order concatenation of the shards along dim 0 (interleaving is
kept per shard), fc2's along dim 1; fc1's bias is split like its rows, fc2's is replicated.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .tp import all_gather_cat


def global_layout(mlp) -> dict[str, tuple[tuple[int, ...], int | None]]:
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
        for key, (_, dim) in global_layout(mlp).items():
            local = params[key].detach()
            out[key] = local.clone() if dim is None else all_gather_cat(local, mlp.tp, dim)
    return out


def _check_values(key: str, t, assign: bool = False) -> None:
    """What ``param.copy_(t)`` needs of a checkpoint's entry, checked before anything is written
    (a copy that fails halfway through a load would leave some weights overwritten)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"state_dict[{key!r}] must be a tensor, got {type(t).__name__}")
    if t.layout is not torch.strided:
        raise TypeError(f"state_dict[{key!r}] must be a dense (strided) tensor, got layout "
                        f"{t.layout}")
    if t.is_meta and not assign:
        raise ValueError(f"state_dict[{key!r}] is on the meta device and holds no values")


def _shape_hint(mlp, key: str, shape: tuple[int, ...], local: tuple[int, ...],
                glob: tuple[int, ...], wants_global: bool) -> str:
    """Why a checkpoint's shape may not fit where ``wants_global`` (load_full_state_dict) or this
    rank's (load_state_dict) shape was due: the other of the two came, or the other kind of fc1
    (gated or not)."""
    tp = mlp.tp.size
    if tp > 1 and wants_global and shape == local:
        return (f" (this rank's shard shape at TP={tp}: load_full_state_dict takes the global "
                f"tensors of full_state_dict(), load_state_dict this rank's shards)")
    if tp > 1 and not wants_global and shape == glob:
        return (f" (the global shape: load_state_dict takes this rank's shards at TP={tp}, "
                f"load_full_state_dict the global tensors of full_state_dict())")
    expected = glob if wants_global else local
    if key == "fc1.weight" and len(shape) == 2 and shape[1] == expected[1]:
        if mlp.activation.gated and shape[0] * 2 == expected[0]:
            return " (it looks like a non-gated fc1; this module's activation is gated)"
        if not mlp.activation.gated and shape[0] == 2 * expected[0]:
            return " (it looks like a gated fc1; this module's activation is not gated)"
    return ""


def _local_shape(shape: tuple[int, ...], dim: int | None, tp: int) -> tuple[int, ...]:
    if dim is None:
        return shape
    return tuple(s // tp if i == dim else s for i, s in enumerate(shape))


def _check(mlp, state_dict) -> None:
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
    if any(p.is_meta for p in mlp.parameters()):
        raise ValueError("this ParallelMLP's parameters are on the meta device, where a load "
                         "writes nothing: materialize them first (to_empty(device=...))")
    layout = global_layout(mlp)
    missing = sorted(set(layout) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(layout))
    if missing or unexpected:
        raise ValueError(f"state_dict does not fit this ParallelMLP: missing keys {missing}, "
                         f"unexpected keys {unexpected}")
    for key, (shape, dim) in layout.items():
        t = state_dict[key]
        _check_values(key, t)
        if tuple(t.shape) != shape:
            hint = _shape_hint(mlp, key, tuple(t.shape), _local_shape(shape, dim, mlp.tp.size),
                               shape, wants_global=True)
            raise ValueError(f"state_dict[{key!r}] has shape {tuple(t.shape)}, expected the "
                             f"global shape {shape}{hint}")
        if not t.is_floating_point():
            raise TypeError(f"state_dict[{key!r}] must be floating point, got dtype {t.dtype}")


def check_local_state_dict(mlp, state_dict, strict: bool, assign: bool,
                           layout: dict | None = None) -> None:
    """Everything ``load_state_dict`` would refuse, refused before it writes anything: torch's
    own writes each entry that fits and reports the others at the end, so a bad checkpoint
    would leave the module half loaded. Checks the entries of this rank's shards; ``layout``
    (key: global shape, split dim) lets a shape error say whether a global tensor came."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of tensors, got "
                        f"{type(state_dict).__name__}")
    own = mlp.state_dict(keep_vars=True)
    if strict:
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise ValueError(f"state_dict does not fit this {type(mlp).__name__} (strict=True): "
                             f"missing keys {missing}, unexpected keys {unexpected}")
    layout = layout or {}
    for key, param in own.items():
        if key not in state_dict or not isinstance(param, torch.Tensor):
            continue  # missing (strict=False) or extra state, which carries no shape
        t = state_dict[key]
        _check_values(key, t, assign)
        if t.shape != param.shape:
            hint = ""
            if key in layout:
                hint = _shape_hint(mlp, key, tuple(t.shape), tuple(param.shape), layout[key][0],
                                   wants_global=False)
            raise ValueError(f"state_dict[{key!r}] has shape {tuple(t.shape)}, expected this "
                             f"rank's shape {tuple(param.shape)}{hint}")


class ChecksBeforeLoading:
    """For an ``nn.Module`` that holds TP shards: ``load_state_dict`` with every entry checked
    first (:func:`check_local_state_dict`), so that a failed load leaves the module untouched.
    Inside a larger model, the model's own ``load_state_dict`` runs torch's per-entry load."""

    def global_layout(self) -> dict | None:
        """Key: (global shape, split dim), for shape errors that say whether a global tensor
        came; None where the module does not say."""
        return None

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        check_local_state_dict(self, state_dict, strict, assign, self.global_layout())
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def load_full_state_dict(mlp, state_dict) -> None:
    _check(mlp, state_dict)  # everything is checked before anything is written
    params = dict(mlp.named_parameters())
    with torch.no_grad():
        for key, (_, dim) in global_layout(mlp).items():
            full = state_dict[key]
            part = full if dim is None else full.chunk(mlp.tp.size, dim)[mlp.tp.rank]
            params[key].copy_(part)
