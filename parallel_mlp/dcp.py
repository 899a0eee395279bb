"""torch.distributed.checkpoint (DCP) state dicts for models that hold parallel_mlp layers, so that
``dcp.save`` at one TP size and ``dcp.load`` at another give the same global weights and optimizer
state, as torchtitan-style training loops expect.

    import torch.distributed.checkpoint as dcp
    from parallel_mlp.dcp import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    # later, at any TP size, into a fresh model and optimizer:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)

The six functions take the arguments of their namesakes in
``torch.distributed.checkpoint.state_dict`` (DSD) and return what those return, except that each
TP shard of a ParallelMLP (fc1's weight and bias, fc2's weight: every parameter marked
``tensor_model_parallel`` in a module with a TP group) and every optimizer state of that
parameter's shape is a DTensor: a view of the local shard, ``Shard(partition_dim)`` over a mesh of
the module's TP group, with the global shape. DCP then records global tensors and each rank's
offset, writes each piece once (replicas across data parallelism deduplicated), and reads back
whatever slice the loading rank's view covers; it loads into the views, that is into the
parameters and optimizer states themselves. The ``set_*`` functions hand DSD the local tensors.

Why views and not DTensor parameters: the layer, its fused autograd function and every
framework integration keep working on plain local shards, and nothing but checkpointing pays for
DTensor dispatch. Plain DSD would be wrong here: it gives every rank its local shard under the
same name, and DCP, taking equal names for replicas, stores rank 0's shard alone (a reload at the
same TP size then gives every rank rank 0's shard, with no error).

The interleaved gated fc1 needs no permutation: shards concatenate along dim 0 to the global
matrix, which is exactly ``Shard(0)``'s layout. ParallelMLP requires ``h % p == 0``, so shards are
even; the views still state the global shape, since ``DTensor.from_local`` would otherwise infer it
from the local one assuming even shards.

This module sits beside the layer rather than under ``integrations/``: it needs nothing but torch
and serves any model that holds ParallelMLP layers, whoever built it (plain PyTorch, a Hugging
Face model after ``replace_mlps``); ``integrations/`` holds the adapters that import a framework.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import state_dict as dsd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from .checkpoint import check_local_state_dict
from .tp import TPGroup

__all__ = ["get_model_state_dict", "get_optimizer_state_dict", "get_state_dict",
           "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict"]

_STATE = "state"


@dataclass(frozen=True)
class _Shard:
    """Where a TP-sharded parameter sits in its global tensor."""

    param: nn.Parameter
    dim: int
    global_shape: torch.Size
    group: dist.ProcessGroup


def _dsd_name(model: nn.Module, name: str) -> str:
    """The name DSD gives parameter ``name`` of ``model``: the wrappers' own path segments
    (DDP's ``module``, torch.compile's ``_orig_mod``, activation checkpointing's
    ``_checkpoint_wrapped_module``) dropped."""
    kept, obj = [], model
    for part in name.split("."):
        wrapper = ((part == "module" and isinstance(obj, nn.parallel.DistributedDataParallel))
                   or part in ("_orig_mod", "_checkpoint_wrapped_module"))
        if not wrapper:
            kept.append(part)
        obj = getattr(obj, part)
    return ".".join(kept)


def _tp_shards(model: nn.Module) -> dict[str, _Shard]:
    """Every TP-sharded parameter of a module with a TP group of more than one rank, by DSD
    name."""
    shards = {}
    for prefix, module in model.named_modules():
        tp = getattr(module, "tp", None)
        if not isinstance(tp, TPGroup) or tp.size == 1:
            continue
        for name, p in module.named_parameters():
            if not getattr(p, "tensor_model_parallel", False):
                continue
            global_shape = list(p.shape)
            global_shape[p.partition_dim] *= tp.size
            shards[_dsd_name(model, f"{prefix}.{name}" if prefix else name)] = _Shard(
                p, p.partition_dim, torch.Size(global_shape), tp.group)
    return shards


def _check_options(options) -> None:
    if options is not None and (options.full_state_dict or options.broadcast_from_rank0):
        raise ValueError("options: full_state_dict / broadcast_from_rank0 are not supported for "
                         "models with ParallelMLP; DCP reshards from the default sharded state "
                         "dict. For global tensors use ParallelMLP.full_state_dict() (or "
                         "parallel_mlp.integrations.hf.hf_state_dict for HF models)")


# ---- wrapping (get) and unwrapping (set) ----------------------------------------------------


class _Views:
    """Builds DTensor views of local shards, one DeviceMesh per (group, device type)."""

    def __init__(self):
        self.meshes = {}

    def mesh(self, group, device_type) -> DeviceMesh:
        key = (id(group), device_type)
        if key not in self.meshes:
            self.meshes[key] = DeviceMesh.from_group(group, device_type)
        return self.meshes[key]

    def __call__(self, t: torch.Tensor, shard: _Shard, where: str) -> torch.Tensor:
        if isinstance(t, DTensor):
            return t
        if tuple(t.shape) != tuple(shard.param.shape):
            raise ValueError(f"{where} has shape {tuple(t.shape)}, not the shape of its "
                             f"parameter's shard {tuple(shard.param.shape)}: cannot tell how it "
                             f"is split across TP ranks")
        stride = torch.empty(shard.global_shape, device="meta").stride()
        return DTensor.from_local(t, self.mesh(shard.group, t.device.type), [Shard(shard.dim)],
                                  run_check=False, shape=shard.global_shape, stride=stride)


def _local(t, shard: _Shard, where: str):
    """A state dict entry for ``shard`` as the local tensor DSD's set functions take."""
    if isinstance(t, DTensor):
        placed = tuple(t.placements) == (Shard(shard.dim),)
        if tuple(t.shape) != tuple(shard.global_shape) or not placed:
            raise ValueError(f"{where} is a DTensor of global shape {tuple(t.shape)} placed "
                             f"{t.placements}; this rank's parameter is Shard({shard.dim}) of "
                             f"{tuple(shard.global_shape)}")
        t = t.to_local()
    if torch.is_tensor(t) and t.dim() > 0 and tuple(t.shape) != tuple(shard.param.shape):
        raise ValueError(f"{where} has shape {tuple(t.shape)}; this rank's shard is "
                         f"{tuple(shard.param.shape)}")
    return t


def _map_param_states(state, shard: _Shard, fn, where: str):
    """``fn`` applied to every non-scalar tensor of one parameter's optimizer state (nested
    dicts allowed, as DSD allows them); scalars such as ``step`` stay as they are."""
    if isinstance(state, dict):
        return {k: _map_param_states(v, shard, fn, f"{where}[{k!r}]") for k, v in state.items()}
    if torch.is_tensor(state) and state.dim() > 0:
        return fn(state, shard, where)
    return state


def _map_model(sd: dict, shards: dict[str, _Shard], fn) -> dict:
    return {k: fn(v, shards[k], f"model_state_dict[{k!r}]") if k in shards else v
            for k, v in sd.items()}


def _map_optim(osd: dict, shards: dict[str, _Shard], fn) -> dict:
    """Both DSD layouts: ``{"state": {fqn: {...}}, "param_groups": [...]}`` and the flattened
    ``{"state.<fqn>.<name>": tensor, ...}``."""
    if isinstance(osd.get(_STATE), dict):
        state = {fqn: (_map_param_states(s, shards[fqn], fn, f"optim_state_dict[{fqn!r}]")
                       if fqn in shards else s)
                 for fqn, s in osd[_STATE].items()}
        return dict(osd, **{_STATE: state})
    out = {}
    for key, value in osd.items():
        shard = _flat_owner(key, shards)
        out[key] = (value if shard is None else
                    _map_param_states(value, shard, fn, f"optim_state_dict[{key!r}]"))
    return out


def _flat_owner(key: str, shards: dict[str, _Shard]) -> _Shard | None:
    """The shard whose state a flattened key ``state.<fqn>.<path>`` belongs to, if any."""
    if not key.startswith(_STATE + "."):
        return None
    parts = key[len(_STATE) + 1:].split(".")
    for end in range(len(parts) - 1, 0, -1):
        shard = shards.get(".".join(parts[:end]))
        if shard is not None:
            return shard
    return None


# ---- DSD's functions, with TP shards as views ----------------------------------------------


def get_model_state_dict(model: nn.Module, *, options=None) -> dict:
    """DSD's ``get_model_state_dict``, TP shards as DTensor views of the parameters."""
    _check_options(options)
    return _map_model(dsd.get_model_state_dict(model, options=options), _tp_shards(model),
                      _Views())


def get_optimizer_state_dict(model: nn.Module, optimizers, *, options=None) -> dict:
    """DSD's ``get_optimizer_state_dict`` (which initializes an empty optimizer's state), the
    states of TP shards as DTensor views. A non-scalar state of another shape than its
    parameter raises a ValueError: DCP could not tell how it is split."""
    _check_options(options)
    return _map_optim(dsd.get_optimizer_state_dict(model, optimizers, options=options),
                      _tp_shards(model), _Views())


def get_state_dict(model: nn.Module, optimizers, *, options=None) -> tuple[dict, dict]:
    """DSD's ``get_state_dict``: ``(model_state_dict, optim_state_dict)`` with TP views."""
    _check_options(options)
    model_sd, optim_sd = dsd.get_state_dict(model, optimizers, options=options)
    shards, views = _tp_shards(model), _Views()
    return _map_model(model_sd, shards, views), _map_optim(optim_sd, shards, views)


def _checked(model: nn.Module, model_state_dict: dict) -> dict:
    """The model state dict as DSD's set functions take it, every entry that names one of the
    model's tensors checked first (TP entries against the shard, the rest for shape and values):
    torch's load writes each entry that fits before it reports the others."""
    local = _map_model(model_state_dict, _tp_shards(model), _local)
    check_local_state_dict(model, local, strict=False, assign=False)
    return local


def set_model_state_dict(model: nn.Module, model_state_dict: dict, *, options=None):
    """DSD's ``set_model_state_dict``; TP entries may be our views (or any DTensor of the same
    global shape and placement) or local shards. Every entry is checked before anything is
    written (:func:`_checked`)."""
    _check_options(options)
    return dsd.set_model_state_dict(model, _checked(model, model_state_dict), options=options)


def set_optimizer_state_dict(model: nn.Module, optimizers, optim_state_dict: dict, *,
                             options=None) -> None:
    """DSD's ``set_optimizer_state_dict``, TP states as in :func:`set_model_state_dict`."""
    _check_options(options)
    dsd.set_optimizer_state_dict(model, optimizers,
                                 _map_optim(optim_state_dict, _tp_shards(model), _local),
                                 options=options)


def set_state_dict(model: nn.Module, optimizers, *, model_state_dict: dict,
                   optim_state_dict: dict, options=None):
    """DSD's ``set_state_dict``, TP entries as in :func:`set_model_state_dict`."""
    _check_options(options)
    shards = _tp_shards(model)
    return dsd.set_state_dict(model, optimizers,
                              model_state_dict=_checked(model, model_state_dict),
                              optim_state_dict=_map_optim(optim_state_dict, shards, _local),
                              options=options)
