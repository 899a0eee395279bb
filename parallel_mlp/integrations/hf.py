"""Hugging Face transformers: put ParallelMLP into a loaded model in place of its gated MLPs, and
save the model back in Hugging Face's format.

    from parallel_mlp.integrations.hf import hf_state_dict, replace_mlps

    model = AutoModelForCausalLM.from_pretrained(path)  # or with distributed_config=...
    replace_mlps(model)                                 # every rank: its shards, converted
    ...                                                 # train
    model.save_pretrained(out, state_dict=hf_state_dict(model))  # every rank; rank 0 writes

Any module whose ``gate_proj``, ``up_proj`` and ``down_proj`` are ``nn.Linear`` layers and whose
forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` qualifies: Llama, Mistral, Qwen2/3,
Gemma 1-3, OLMo 2, Granite and their kin. Our global fc1 is ``merge_gate_up(stack([gate, up]))``
(gate and up rows interleaved), fc2 is ``down_proj``; biases follow their weights. Each rank's
fc1 shard holds units ``[r*h/p, (r+1)*h/p)`` of both gate and up, so it is built from the same
rows of each (or from the local pieces of transformers' own column-parallel DTensors), never
from a global copy.

This module imports transformers; ``import parallel_mlp`` never does.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from transformers.activations import ACT2FN

from ..layer import ParallelMLP
from ..tp import TPGroup, resolve_group
from . import gated_layout
from .hf_activations import GATED, gated_activation

__all__ = ["find_gated_mlps", "full_state_dict_to_hf", "hf_state_dict", "hf_to_full_state_dict",
           "mlp_activation", "plain_gated_forward", "replace_mlps"]

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# ParallelMLP's keyword options that replace_mlps takes from the HF module or its own arguments;
# every other one (backend, recompute, fuse_grad_accum, ...) is the caller's to pass. Sequence
# parallelism is not: HF's decoder layers, with or without their own TP, hand the MLP the whole,
# replicated sequence.
_SET_HERE = {"activation", "bias1", "bias2", "multiple_of", "tp_group", "sequence_parallel",
             "device", "dtype"}
OPTIONS = tuple(sorted(name for name, p in inspect.signature(ParallelMLP).parameters.items()
                       if p.kind is p.KEYWORD_ONLY and name not in _SET_HERE))


# ---- converters: HF's gate/up/down tensors <-> our global fc1/fc2 ----------------------------


def _split(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our interleaved ``[2h, ...]`` -> (gate, up), each ``[h, ...]`` and contiguous."""
    return gated_layout.gate_rows(fc1).contiguous(), gated_layout.up_rows(fc1).contiguous()


def hf_to_full_state_dict(hf_mlp_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF gated MLP's tensors (keys ``gate_proj.weight``, ``up_proj.weight``,
    ``down_proj.weight`` and, where it has biases, ``gate_proj.bias``, ``up_proj.bias``,
    ``down_proj.bias``) -> our global ``fc1.weight``, ``fc2.weight`` (``fc1.bias``, ``fc2.bias``),
    as :meth:`ParallelMLP.load_full_state_dict` takes them."""
    _check_hf_mlp_state(hf_mlp_state)
    s = hf_mlp_state
    out = {"fc1.weight": gated_layout.interleave(s["gate_proj.weight"], s["up_proj.weight"]),
           "fc2.weight": s["down_proj.weight"]}
    if "gate_proj.bias" in s:
        out["fc1.bias"] = gated_layout.interleave(s["gate_proj.bias"], s["up_proj.bias"])
    if "down_proj.bias" in s:
        out["fc2.bias"] = s["down_proj.bias"]
    return out


def full_state_dict_to_hf(full_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`hf_to_full_state_dict`: our global tensors (as
    :meth:`ParallelMLP.full_state_dict` returns them) -> ``gate_proj`` / ``up_proj`` /
    ``down_proj`` tensors, in the order an HF MLP's own state dict lists them."""
    known = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    missing = sorted({"fc1.weight", "fc2.weight"} - set(full_state))
    unexpected = sorted(set(full_state) - known)
    if missing or unexpected:
        raise ValueError(f"full_state must hold fc1.weight, fc2.weight and optionally fc1.bias, "
                         f"fc2.bias: missing {missing}, unexpected {unexpected}")
    fc1 = full_state["fc1.weight"]
    if fc1.shape[0] % 2:
        raise ValueError(f"full_state['fc1.weight'] has {fc1.shape[0]} rows; a gated fc1 has an "
                         f"even number (gate and up interleaved)")
    gate, up = _split(fc1)
    gate_bias = up_bias = None
    if "fc1.bias" in full_state:
        gate_bias, up_bias = _split(full_state["fc1.bias"])
    out = {}
    for name, weight, bias in (("gate_proj", gate, gate_bias), ("up_proj", up, up_bias),
                               ("down_proj", full_state["fc2.weight"], full_state.get("fc2.bias"))):
        out[f"{name}.weight"] = weight
        if bias is not None:
            out[f"{name}.bias"] = bias
    return out


def _check_hf_mlp_state(s) -> None:
    required = {f"{p}.weight" for p in PROJECTIONS}
    known = required | {f"{p}.bias" for p in PROJECTIONS}
    missing, unexpected = sorted(required - set(s)), sorted(set(s) - known)
    if missing or unexpected:
        raise ValueError(f"hf_mlp_state does not hold a gated MLP: missing keys {missing}, "
                         f"unexpected keys {unexpected}")
    if ("gate_proj.bias" in s) != ("up_proj.bias" in s):
        raise ValueError("hf_mlp_state: gate_proj and up_proj must both have a bias or neither "
                         "(they become one fc1 with one bias)")
    gate, up, down = (s[f"{p}.weight"] for p in PROJECTIONS)
    if (gate.dim() != 2 or gate.shape != up.shape or down.dim() != 2
            or down.shape[1] != gate.shape[0]):
        raise ValueError(f"hf_mlp_state: gate_proj.weight {tuple(gate.shape)} and up_proj.weight "
                         f"{tuple(up.shape)} must be the same [h, d], and down_proj.weight "
                         f"{tuple(down.shape)} [d_out, h]")
    for p, rows in (("gate_proj", gate.shape[0]), ("up_proj", gate.shape[0]),
                    ("down_proj", down.shape[0])):
        b = s.get(f"{p}.bias")
        if b is not None and tuple(b.shape) != (rows,):
            raise ValueError(f"hf_mlp_state['{p}.bias'] has shape {tuple(b.shape)}, expected "
                             f"({rows},)")


# ---- finding HF MLPs and their activation ----------------------------------------------------


# The forward replace_mlps replaces: down_proj(act(gate_proj(x)) * up_proj(x)), as a tree of
# what _trace_forward reads off a forward's source (the product's factors in a fixed order).
_GATED_MLP = ("down_proj", ("mul", ("act", ("gate_proj", "x")), ("up_proj", "x")))
_ACT_ATTRIBUTES = ("act_fn", "activation_fn")


class _NotPlain(Exception):
    pass


def _trace_forward(cls: type) -> tuple | None:
    """What ``cls.forward`` computes from its one input, as a tree of projections, the
    activation and products, read off its source; None where it does anything else (another
    statement or op: a clamp, a scale, a norm, dropout, a branch) or its source is not there."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        return None
    args = fn.args
    if len(args.args) != 2 or args.vararg or args.kwonlyargs or args.kwarg or args.defaults:
        return None
    env = {args.args[1].arg: "x"}

    def value(node):
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return ("mul",) + tuple(sorted((value(node.left), value(node.right)), key=repr))
        if (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
                and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == args.args[0].arg):
            name = node.func.attr
            if name in PROJECTIONS:
                return (name, value(node.args[0]))
            if name in _ACT_ATTRIBUTES:
                return ("act", value(node.args[0]))
        raise _NotPlain

    try:
        for stmt in fn.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)):
                env[stmt.targets[0].id] = value(stmt.value)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                return value(stmt.value)
            else:
                return None
    except _NotPlain:
        return None
    return None


@functools.cache
def plain_gated_forward(cls: type) -> bool:
    """Whether ``cls.forward(x)`` is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` and
    nothing else, read off its source (transformers' Llama, Mistral, Qwen2/3, Gemma 1-3, OLMo 2,
    Granite and their kin; not those that clamp, scale, normalize or drop out around it)."""
    return _trace_forward(cls) == _GATED_MLP


def _three_linears(model: nn.Module) -> dict[str, nn.Module]:
    """Every module of ``model`` (by name, shared modules under each of their names) whose
    ``gate_proj``, ``up_proj`` and ``down_proj`` are ``nn.Linear`` layers."""
    return {name: m for name, m in model.named_modules(remove_duplicate=False)
            if all(isinstance(getattr(m, p, None), nn.Linear) for p in PROJECTIONS)}


def _plain(modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Those of ``modules`` whose forward is the plain gated MLP (:func:`plain_gated_forward`)."""
    return {name: m for name, m in modules.items() if plain_gated_forward(type(m))}


def find_gated_mlps(model: nn.Module) -> dict[str, nn.Module]:
    """Every module of ``model`` (by name, shared modules under each of their names) whose
    ``gate_proj``, ``up_proj`` and ``down_proj`` are ``nn.Linear`` layers and whose forward is
    the plain gated MLP (:func:`plain_gated_forward`)."""
    return _plain(_three_linears(model))


@functools.cache
def _activation_by_class() -> dict[type, str]:
    # One activation class per ACT2FN name; several names share a class (gelu and gelu_python
    # are both the exact GELU), never with different math.
    return {type(ACT2FN[name]): ours for name, ours in GATED.items()}


def mlp_activation(mlp: nn.Module, config=None) -> str:
    """Our gated activation for an HF MLP module: read from the function it runs (``act_fn``)
    when it has one, since the config field differs by family (Gemma 2/3 read
    ``hidden_activation``, most others ``hidden_act``); else from ``config`` (the module's own
    ``config`` first)."""
    act_fn = getattr(mlp, "act_fn", None)
    if act_fn is not None:
        name = _activation_by_class().get(type(act_fn))
        if name is None:
            raise ValueError(f"act_fn={type(act_fn).__name__} has no parallel_mlp activation; "
                             f"supported: the ACT2FN activations of {sorted(GATED)}")
        return name
    config = getattr(mlp, "config", None) or config
    hidden_act = (getattr(config, "hidden_activation", None)
                  or getattr(config, "hidden_act", None))
    if hidden_act is None:
        raise ValueError(f"{type(mlp).__name__} has no act_fn and its config no hidden_act or "
                         f"hidden_activation: cannot tell its activation")
    return gated_activation(hidden_act)


# ---- the swap -----------------------------------------------------------------------------------


def replace_mlps(model: nn.Module, tp_group: dist.ProcessGroup | None = None,
                 **options) -> dict[str, ParallelMLP]:
    """Swap every gated MLP of ``model`` (:func:`find_gated_mlps`) for a :class:`ParallelMLP`
    holding this rank's shard of the same weights (frozen where theirs were); returns the new
    modules by name. Modules with the three projections but another forward are left as they
    are, with a warning that names them (a ValueError where no module qualifies).

    Collective: every rank of the TP group calls it. The TP group is ``tp_group``; else, for a
    model that transformers itself made tensor-parallel (``from_pretrained(...,
    distributed_config=DistributedConfig(tp_size=p))``), the ``"tp"`` dimension of its device
    mesh; else the default group when torch.distributed is initialized, and TP size 1 without
    it. ``options`` go to ParallelMLP: its keyword options other than those taken from the HF
    module (``backend``, ``recompute``, ``fuse_grad_accum``, ...).

    The shards are converted from the loaded weights, a slice at a time (the local pieces of
    transformers' DTensors where those are already split like ours), so no rank holds a second
    global copy; the HF modules are released as they are replaced. Everything is checked before
    the first module is replaced. ``save_pretrained`` then needs
    ``state_dict=hf_state_dict(model)``; without it the model refuses to save (see
    :func:`hf_state_dict`).
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        hint = (" (HF models hand their MLPs the whole, replicated sequence)"
                if "sequence_parallel" in unknown else "")
        raise TypeError(f"replace_mlps: unknown options {unknown}{hint}; known: {list(OPTIONS)}")
    candidates = _three_linears(model)
    mlps = _plain(candidates)
    other = sorted({type(m).__name__ for m in candidates.values()} -
                   {type(m).__name__ for m in mlps.values()})
    why = ("their forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x)) alone (a clamp, "
           "scale, norm, dropout or other step around it, which ParallelMLP would drop)")
    if not mlps:
        if other:
            raise ValueError(f"replace_mlps: {type(model).__name__}'s modules with gate_proj, "
                             f"up_proj and down_proj ({', '.join(other)}) do not qualify: {why}")
        raise ValueError(f"replace_mlps: {type(model).__name__} has no module with nn.Linear "
                         f"gate_proj, up_proj and down_proj")
    if other:
        warnings.warn(f"replace_mlps: left {', '.join(other)} as they are: {why}", stacklevel=2)
    group = _tp_group(model, tp_group)
    tp = resolve_group(group)
    config = getattr(model, "config", None)
    plans = {}
    for name, mlp in mlps.items():  # check everything before changing anything
        if id(mlp) not in plans:
            plans[id(mlp)] = _plan(name, mlp, config, tp)
    swapped, new_by_id = {}, {}
    for name, mlp in mlps.items():
        if id(mlp) not in new_by_id:
            new_by_id[id(mlp)] = _convert(mlp, plans[id(mlp)], group, tp, options)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, new_by_id[id(mlp)])
        swapped[name] = new_by_id[id(mlp)]
    _refuse_saving_shards(model)
    return swapped


def _hf_tp_group(model) -> dist.ProcessGroup | None:
    """The TP group of a model that transformers made tensor-parallel, else None."""
    if (getattr(model, "tp_size", None) or 1) <= 1:
        return None
    return model._device_mesh["tp"].get_group()


def _ranks(group) -> list[int]:
    return dist.get_process_group_ranks(group)


def _tp_group(model, tp_group):
    hf_group = _hf_tp_group(model)
    if hf_group is None:
        return tp_group
    if tp_group is None:
        return hf_group
    if _ranks(tp_group) != _ranks(hf_group):
        raise ValueError(f"tp_group has ranks {_ranks(tp_group)}, but transformers made this "
                         f"model tensor-parallel over ranks {_ranks(hf_group)}, whose activations "
                         f"the MLPs receive replicated; pass tp_group=None to use that group")
    return tp_group


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _plan(name, mlp, config, tp: TPGroup) -> dict:
    gate, up, down = (getattr(mlp, p) for p in PROJECTIONS)
    try:
        activation = mlp_activation(mlp, config)
    except ValueError as e:
        raise ValueError(f"replace_mlps: {name}: {e}") from None
    hidden = gate.out_features
    if ((up.in_features, up.out_features) != (gate.in_features, hidden)
            or down.in_features != hidden):
        raise ValueError(f"replace_mlps: {name}: gate_proj {gate.in_features}->{hidden}, up_proj "
                         f"{up.in_features}->{up.out_features} and down_proj {down.in_features}->"
                         f"{down.out_features} do not make a gated MLP")
    if (gate.bias is None) != (up.bias is None):
        raise ValueError(f"replace_mlps: {name}: gate_proj and up_proj must both have a bias or "
                         f"neither (they become one fc1)")
    for kind in ("weight", "bias"):
        g, u = getattr(gate, kind), getattr(up, kind)
        if g is not None and g.requires_grad != u.requires_grad:
            raise ValueError(f"replace_mlps: {name}: gate_proj.{kind} and up_proj.{kind} must be "
                             f"frozen alike (requires_grad {g.requires_grad} and "
                             f"{u.requires_grad}): they become one fc1.{kind}")
    if hidden % tp.size:
        raise ValueError(f"replace_mlps: {name}: intermediate size {hidden} is not divisible by "
                         f"the TP size {tp.size}")
    return dict(in_features=gate.in_features, hidden_features=hidden,
                out_features=down.out_features, activation=activation,
                bias1=gate.bias is not None, bias2=down.bias is not None)


def _slice(t: torch.Tensor, dim: int, tp: TPGroup) -> torch.Tensor:
    """This rank's chunk along ``dim`` of the global ``t``, a plain tensor or a DTensor. A
    DTensor already split along ``dim`` over the TP group (transformers' colwise / rowwise
    layers) gives its local piece as it is: the same rows as ours whenever the size divides."""
    if isinstance(t, DTensor):
        mesh = t.device_mesh
        if (tp.size > 1 and mesh.ndim == 1 and tuple(t.placements) == (Shard(dim),)
                and _ranks(mesh.get_group()) == _ranks(tp.group)):
            return t.to_local()
        t = _global(t)
    return t.chunk(tp.size, dim)[tp.rank]


def _global(t: torch.Tensor) -> torch.Tensor:
    """The global tensor of a DTensor (collective unless replicated), a plain tensor as it is."""
    if not isinstance(t, DTensor):
        return t
    if all(isinstance(p, Replicate) for p in t.placements):
        return t.to_local()
    return t.full_tensor()


@torch.no_grad()
def _convert(mlp, plan, group, tp: TPGroup, options) -> ParallelMLP:
    gate, up, down = (getattr(mlp, p) for p in PROJECTIONS)
    like = _local(gate.weight)
    # Built on meta and materialized, so no global weight is drawn only to be overwritten.
    new = ParallelMLP(**plan, tp_group=group, device="meta", dtype=like.dtype, **options)
    for ours, theirs in ((new.fc1.weight, gate.weight), (new.fc1.bias, gate.bias),
                         (new.fc2.weight, down.weight), (new.fc2.bias, down.bias)):
        if ours is not None:
            ours.requires_grad_(theirs.requires_grad)  # a frozen MLP stays frozen
    if like.device.type == "meta":  # a model built on meta: ours stays there too
        return new
    new.to_empty(device=like.device)
    new.fc1.weight.copy_(gated_layout.interleave(_slice(gate.weight, 0, tp), _slice(up.weight, 0, tp)))
    new.fc2.weight.copy_(_slice(down.weight, 1, tp))
    if plan["bias1"]:
        new.fc1.bias.copy_(gated_layout.interleave(_slice(gate.bias, 0, tp), _slice(up.bias, 0, tp)))
    if plan["bias2"]:
        new.fc2.bias.copy_(_global(down.bias))
    new.train(mlp.training)
    return new


# ---- saving in HF format ------------------------------------------------------------------------


def _parallel_mlps(model: nn.Module) -> dict[str, ParallelMLP]:
    return {name: m for name, m in model.named_modules(remove_duplicate=False)
            if isinstance(m, ParallelMLP)}


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict the model had before :func:`replace_mlps`, with global tensors: HF key
    names (``...mlp.gate_proj.weight``, ``up_proj``, ``down_proj``), every ParallelMLP gathered
    and split back into gate and up, and transformers' own TP DTensors gathered too. Pass it to
    ``save_pretrained(dir, state_dict=...)``.

    Collective over every TP group involved: call it on every rank (every rank gets the whole
    dict; ``save_pretrained`` writes on rank 0 only). Tensors that share storage in the model (a
    tied LM head) share it here too, so ``save_pretrained`` drops the tied copy as usual.
    """
    mlps = _parallel_mlps(model)
    out, gathered = {}, {}
    for key, value in model.state_dict().items():
        prefix = key.rsplit(".", 2)[0]
        if prefix not in mlps:
            out[key] = _global_shared(value, gathered)
        elif f"{prefix}.gate_proj.weight" not in out:
            for name, t in full_state_dict_to_hf(mlps[prefix].full_state_dict()).items():
                out[f"{prefix}.{name}"] = t
    return out


def _global_shared(value, gathered: dict):
    """:func:`_global` that gathers a DTensor once per storage, so tied entries stay tied."""
    if not isinstance(value, DTensor):
        return value
    local = value.to_local()
    key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(value.shape))
    if key not in gathered:
        gathered[key] = _global(value)
    return gathered[key]


def _refuse_saving_shards(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` refuse what would write a wrong checkpoint with no error:
    its own ``state_dict()`` (this rank's fc1/fc2 shards, under keys transformers would not load:
    ``from_pretrained`` only warns and re-initializes the MLPs) and
    ``distributed_checkpoint=True`` (which stores our plain shards as one replicated tensor).

    Why an instance attribute wrapping the bound method: it relies only on the public name and
    signature of ``save_pretrained`` and Python's attribute lookup, covers every caller that
    goes through the model (``push_to_hub``, Trainer's ``_save``, a compiled wrapper), and fails
    before anything is written. transformers' weight-conversion hooks could instead rewrite the
    keys on save, but they are private (``model._weight_conversions``, ``ConversionOps``) and
    changed within 5.x, they skip ``distributed_checkpoint=True``, and at TP > 1 they fail only
    after ``config.json`` is written. A ``functools.partial`` (not a closure) keeps ``deepcopy``
    and pickling of the model working: the copy's method refers to the copy.
    """
    if not callable(getattr(type(model), "save_pretrained", None)):
        return
    if isinstance(vars(model).get("save_pretrained"), functools.partial):
        return  # already guarded (replace_mlps called twice)
    model.save_pretrained = functools.partial(_checked_save_pretrained, model,
                                              type(model).save_pretrained)


def _checked_save_pretrained(model, save_pretrained, *args, **kwargs):
    call = inspect.signature(save_pretrained).bind(model, *args, **kwargs)
    how = ("pass state_dict=parallel_mlp.integrations.hf.hf_state_dict(model), called on every "
           "rank (it gathers the shards)")
    if call.arguments.get("distributed_checkpoint", False):
        raise ValueError("save_pretrained(distributed_checkpoint=True) would store one rank's "
                         "ParallelMLP shards as if they were the whole tensors; "
                         f"{how}, or use parallel_mlp.dcp for a resharding checkpoint")
    state_dict = call.arguments.get("state_dict")
    if state_dict is None:
        raise ValueError("save_pretrained(state_dict=None) would write this rank's ParallelMLP "
                         "shards under fc1/fc2 keys that from_pretrained does not load (it "
                         f"re-initializes the MLPs with only a warning); {how}")
    shard_keys = {f"{prefix}.{k}" for prefix, m in _parallel_mlps(model).items()
                  for k in m.state_dict()}
    found = sorted(k for k in state_dict if k in shard_keys)
    if found:
        raise ValueError(f"save_pretrained: state_dict holds ParallelMLP shards ({found[:3]}"
                         f"{' ...' if len(found) > 3 else ''}), which from_pretrained does not "
                         f"load; {how}")
    return save_pretrained(model, *args, **kwargs)
