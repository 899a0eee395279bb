"""Checks of what a user can get wrong, each raising an error that names the parameter, the value
and the rule. Kept apart from the math so the hot path reads plainly."""

from __future__ import annotations

import torch

from .activations import Activation


def require_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def require_flag(name: str, value) -> bool:
    """An on/off option: True or False (0 and 1 too, bool being an int). Anything else is refused
    rather than read by its truth: the string "false" from a config file is truthy."""
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} ({value!r})")


def require_divisible(name: str, value: int, tp_size: int) -> None:
    if value % tp_size != 0:
        raise ValueError(
            f"{name}={value} is not divisible by the tensor-parallel size {tp_size}; "
            f"each rank must hold an equal shard"
        )


def require_float_dtype(name: str, dtype) -> None:
    """None (torch's default dtype) or a real floating-point torch.dtype."""
    if dtype is None:
        return
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype or None, got {type(dtype).__name__} "
                        f"({dtype!r})")
    if not dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point dtype (parameters are trained), got "
                         f"{dtype}")


def require_tensor(name: str, t, optional: bool = False) -> None:
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def plainly_valid(x, w1, b1, w2, b2, act: Activation) -> bool:
    """The common case in a few comparisons, so that a host-bound step does not pay for the
    full checks: no biases, tensors of one floating dtype on one device, matching shapes. False
    only means "look closer"."""
    if b1 is not None or b2 is not None or not (
            isinstance(x, torch.Tensor) and isinstance(w1, torch.Tensor)
            and isinstance(w2, torch.Tensor)):
        return False
    s1, s2, dtype, device = w1.shape, w2.shape, x.dtype, x.device
    return (len(s1) == 2 and len(s2) == 2 and x.dim() >= 1 and x.shape[-1] == s1[1]
            and s1[0] == (2 * s2[1] if act.gated else s2[1])
            and w1.dtype is dtype and w2.dtype is dtype and dtype.is_floating_point
            and w1.device == device and w2.device == device)


def check_shards(x, w1, b1, w2, b2, act: Activation) -> None:
    """Shapes, dtypes and devices of one rank's MLP inputs (see parallel_mlp_func)."""
    if not plainly_valid(x, w1, b1, w2, b2, act):
        _check_shards_fully(x, w1, b1, w2, b2, act)


def _check_shards_fully(x, w1, b1, w2, b2, act: Activation) -> None:
    require_tensor("x", x)
    require_tensor("w1", w1)
    require_tensor("w2", w2)
    require_tensor("b1", b1, optional=True)
    require_tensor("b2", b2, optional=True)
    if w1.dim() != 2 or w2.dim() != 2:
        raise ValueError(
            f"w1 and w2 must be 2-D weight shards, got w1 {tuple(w1.shape)} and w2 {tuple(w2.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != w1.shape[1]:
        raise ValueError(
            f"x's last dim must be in_features={w1.shape[1]} (w1 is [fc1 rows, in_features]), "
            f"got x of shape {tuple(x.shape)}"
        )
    rows = w1.shape[0]
    if act.gated and rows % 2 != 0:
        raise ValueError(
            f"activation={act.name!r} is gated, so fc1 holds interleaved (gate, up) row pairs and "
            f"its size must be even; got w1 with {rows} rows"
        )
    hidden = rows // 2 if act.gated else rows
    if w2.shape[1] != hidden:
        raise ValueError(
            f"w2 must be [out_features, {hidden}] to match w1's {rows} rows with "
            f"activation={act.name!r}, got w2 of shape {tuple(w2.shape)}"
        )
    if b1 is not None and tuple(b1.shape) != (rows,):
        raise ValueError(f"b1 must have shape ({rows},) like w1's rows, got {tuple(b1.shape)}")
    if b2 is not None and tuple(b2.shape) != (w2.shape[0],):
        raise ValueError(
            f"b2 must have shape ({w2.shape[0]},) like w2's rows, got {tuple(b2.shape)}"
        )
    named = [("x", x), ("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2)]
    named = [(n, t) for n, t in named if t is not None]
    for n, t in named:
        if not t.is_floating_point():
            raise TypeError(f"{n} must be a floating-point tensor, got dtype {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{n} is on {t.device} but x is on {x.device}; all must share a device")
    # Under autocast, mixed dtypes are expected: the function casts to autocast's dtype.
    if not torch.is_autocast_enabled(x.device.type):
        for n, t in named[1:]:
            if t.dtype != x.dtype:
                raise TypeError(
                    f"{n} has dtype {t.dtype} but x has {x.dtype}; they must match "
                    f"(or run under torch.autocast)"
                )


def check_sequence_parallel_input(x) -> None:
    """Sequence parallelism splits dim 0 over the ranks; a 1-D x has no dim to split."""
    if isinstance(x, torch.Tensor) and x.dim() < 2:
        raise ValueError(
            f"sequence_parallel=True: x must be this rank's slice of dim 0 (the sequence dim of "
            f"[s, b, d], or the token dim of [T, d]), so at least 2-D; got x of shape "
            f"{tuple(x.shape)}")
