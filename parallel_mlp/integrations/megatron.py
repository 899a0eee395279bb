"""Megatron-core drop-in: an MLP that a layer spec takes in place of
``megatron.core.transformer.mlp.MLP``, with Megatron's checkpoint keys and layout.

    from parallel_mlp.integrations.megatron import gpt_layer_spec, mlp_spec

    layer_spec = gpt_layer_spec()                          # the local GPT layer, our MLP in it
    layer_spec = gpt_layer_spec(transformer_engine=True)   # TE's layer, its norm moved before ours
    spec.submodules.mlp = mlp_spec(recompute=True)         # or swap it into a spec of your own

:class:`MegatronParallelMLP` keeps ``MLP``'s contract: built by ``build_module(spec, config=...)``
from a ``TransformerConfig``, ``forward(hidden_states)`` returns ``(output, output_bias)`` with fc2's
bias returned rather than added, and its state dict and ``sharded_state_dict`` use Megatron's keys
(``linear_fc1.weight`` ...). A gated fc1 is kept interleaved per shard and described to
Megatron's distributed checkpointing by a sharded-tensor factory as the ``[gate; up]`` global the
stock MLP writes, so checkpoints move between the two at any TP size.

This module imports megatron-core; ``import parallel_mlp`` never does.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from ..activations import get_activation
from ..backends import check_backend_name
from ..checks import require_divisible, require_flag
from ..checkpoint import ChecksBeforeLoading
from ..layer import ColumnParallelShard, RowParallelShard, parallel_mlp_func
from ..overlap import check_option as check_overlap_option
from ..tp import TPGroup, resolve_group
from . import gated_layout

__all__ = ["MegatronParallelMLP", "activation_name", "gpt_layer_spec", "mlp_spec"]


# ---- Megatron's activation functions -> ours ------------------------------------------------


def _megatron_activations():
    """(function, gated) -> our activation name, for every function Megatron configs use."""
    from megatron.core import activations as mact
    from megatron.core.fusions import fused_bias_geglu
    from megatron.core.transformer import utils as mutils

    table = {}
    for fn, plain, gated in (
        (F.silu, None, "swiglu"),
        (F.relu, "relu", "reglu"),
        (F.sigmoid, None, "glu"),
        (torch.sigmoid, None, "glu"),
        (F.gelu, "gelu", "geglu_erf"),
        (mutils.erf_gelu, "gelu", "geglu_erf"),  # F.gelu written out (1.41421 for sqrt 2)
        (mutils.openai_gelu, "gelu_tanh_approx", "geglu"),
        (mact.fast_gelu, "gelu_tanh_approx", "geglu"),
        (mact.squared_relu, "relu_sq", None),
    ):
        table[(fn, False)], table[(fn, True)] = plain, gated
    for quick_gelu in (mact.quick_gelu, fused_bias_geglu.quick_gelu):
        # gpt-oss's SwiGLU: quick_gelu(g) * (u + 1), with glu_linear_offset = 1
        table[(quick_gelu, "offset1")] = "swiglu_oai"
    return table


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def activation_name(config) -> str:
    """Our activation for a TransformerConfig's ``activation_func``, ``gated_linear_unit``,
    ``glu_linear_offset`` and ``activation_func_clamp_value``; a ValueError names what has none."""
    fn, gated = config.activation_func, bool(config.gated_linear_unit)
    offset = getattr(config, "glu_linear_offset", 0.0) or 0.0
    clamp = getattr(config, "activation_func_clamp_value", None)
    label = _name(fn)
    if clamp is not None:
        raise ValueError(f"activation_func_clamp_value={clamp!r}: parallel_mlp's activations do not "
                         f"clamp their inputs; set it to None")
    table = _megatron_activations()
    if gated and offset == 1.0:
        name = table.get((fn, "offset1"))
        if name is None:
            raise ValueError(f"glu_linear_offset=1 is supported with quick_gelu (gpt-oss's SwiGLU), "
                             f"not with activation_func={label}")
        return name
    if gated and offset != 0.0:
        raise ValueError(f"glu_linear_offset={offset!r} is not supported (0, or 1 with quick_gelu)")
    name = table.get((fn, gated))
    if name is None:
        kind = "gated" if gated else "non-gated"
        choices = sorted({_name(f) for (f, g), ours in table.items() if g is gated and ours})
        raise ValueError(f"activation_func={label} ({kind}) has no parallel_mlp activation; "
                         f"{kind} choices: {choices}")
    return name


# ---- the module -------------------------------------------------------------------------------


class _MegatronLinearState:
    """Megatron's linears carry an ``_extra_state`` entry (None; kept for Transformer Engine's
    checkpoints), so their state dict keys are ``weight``, ``bias`` and ``_extra_state``."""

    def get_extra_state(self):
        return None

    def set_extra_state(self, state):
        pass


class LinearFC1(_MegatronLinearState, ColumnParallelShard):
    pass


class LinearFC2(_MegatronLinearState, RowParallelShard):
    pass


def _tp_group(tp_group):
    if tp_group is not None:
        return tp_group
    if parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_group()
    return None


class MegatronParallelMLP(ChecksBeforeLoading, MegatronModule):
    """``megatron.core.transformer.mlp.MLP``'s contract, on parallel_mlp's fused layer.

    Reads from the ``TransformerConfig``: ``hidden_size``, ``ffn_hidden_size``,
    ``gated_linear_unit``, ``activation_func`` (+ ``glu_linear_offset``,
    ``activation_func_clamp_value``), ``add_bias_linear``, ``sequence_parallel``,
    ``gradient_accumulation_fusion`` (our fused accumulation into ``main_grad``; no APEX needed),
    ``params_dtype``, ``perform_initialization``, ``init_method``, ``output_layer_init_method``,
    ``use_cpu_initialization``.

    Options (through :func:`mlp_spec`): ``recompute`` (keep only the input for backward and
    replay fc1 there: cheaper than Megatron's selective recompute of the whole MLP),
    ``fuse_grad_accum`` (None: the config's ``gradient_accumulation_fusion``; True turns it on for
    this MLP alone, which needs no APEX, while Megatron's own linears refuse the config flag
    without APEX), ``tp_comm_overlap`` (None: the config's ``tp_comm_overlap``; else as in
    ParallelMLP: False, True or ``"auto"``; our overlap runs its collectives block by block
    beside the GEMMs over NCCL or gloo, with no Transformer Engine userbuffers) and ``backend``
    (``"auto"``, ``"cute"``, ``"torch"``).
    """

    def __init__(self, config, submodules=None, is_expert: bool = False,
                 input_size: Optional[int] = None, ffn_hidden_size: Optional[int] = None,
                 tp_group=None, *, recompute: bool = False, fuse_grad_accum: Optional[bool] = None,
                 tp_comm_overlap=None, backend: str = "auto"):
        super().__init__(config=config)
        if is_expert:
            raise ValueError("is_expert=True: MegatronParallelMLP is the dense MLP; Megatron's MoE "
                             "layers build their own experts")
        for flag in ("fp8", "fp4"):
            if getattr(config, flag, None):
                raise ValueError(f"{flag}={getattr(config, flag)!r}: MegatronParallelMLP runs bf16/fp16 "
                                 f"GEMMs; use Megatron's Transformer Engine MLP for {flag}")
        if getattr(config, "delay_wgrad_compute", False):
            raise ValueError("delay_wgrad_compute=True: MegatronParallelMLP computes weight "
                             "gradients in its backward; turn it off")
        self.activation = get_activation(activation_name(config))
        self.input_size = config.hidden_size if input_size is None else input_size
        hidden = config.ffn_hidden_size if ffn_hidden_size is None else ffn_hidden_size

        self.tp_group = _tp_group(tp_group)
        # No group and no Megatron parallel state: one rank, like Megatron without TP.
        self.tp = resolve_group(self.tp_group) if self.tp_group is not None else TPGroup(None, 1, 0)
        require_divisible("ffn_hidden_size", hidden, self.tp.size)
        self.hidden_size = hidden
        self.sequence_parallel = bool(config.sequence_parallel) and self.tp.size > 1
        if fuse_grad_accum is None:
            self.fuse_grad_accum = bool(getattr(config, "gradient_accumulation_fusion", False))
        else:
            self.fuse_grad_accum = require_flag("fuse_grad_accum", fuse_grad_accum)
        self.recompute, self.backend = require_flag("recompute", recompute), check_backend_name(backend)
        if tp_comm_overlap is None:
            tp_comm_overlap = bool(getattr(config, "tp_comm_overlap", False))
        check_overlap_option(tp_comm_overlap)
        self.tp_comm_overlap = tp_comm_overlap

        gated = self.activation.gated
        device = torch.device("cpu") if config.use_cpu_initialization else torch.cuda.current_device()
        dtype = config.params_dtype
        bias = bool(config.add_bias_linear)
        self.linear_fc1 = LinearFC1(self.input_size, (2 if gated else 1) * hidden // self.tp.size,
                                    bias, device, dtype, gated=gated)
        self.linear_fc2 = LinearFC2(hidden // self.tp.size, config.hidden_size, bias, device, dtype,
                                    sequence_parallel=self.sequence_parallel)
        if config.perform_initialization:
            self._initialize(config)
        elif bias:
            with torch.no_grad():
                self.linear_fc1.bias.zero_()
                self.linear_fc2.bias.zero_()

    @torch.no_grad()
    def _initialize(self, config) -> None:
        """The stock MLP's initialization, value for value: with ``use_cpu_initialization`` the
        global fp32 master drawn with ``init_method`` and this rank's slice taken (a gated fc1's
        master is ``[gate; up]``, so the slice is interleaved from its two chunks); otherwise the
        local shard drawn under Megatron's model-parallel RNG, in the stock layout, then
        interleaved. Biases start at zero."""
        p, r = self.tp.size, self.tp.rank
        fc1, fc2 = self.linear_fc1.weight, self.linear_fc2.weight
        gated = self.activation.gated
        if config.use_cpu_initialization:
            master = torch.empty(fc1.shape[0] * p, fc1.shape[1], dtype=torch.float32)
            config.init_method(master)
            master = master.to(fc1.dtype)
            fc1.copy_(gated_layout.global_blocks_to_shard(master, r, p) if gated
                      else master.chunk(p)[r])
            master = torch.empty(fc2.shape[0], fc2.shape[1] * p, dtype=torch.float32)
            config.output_layer_init_method(master)
            fc2.copy_(master.to(fc2.dtype).chunk(p, dim=1)[r])
        else:
            from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

            with get_cuda_rng_tracker().fork():
                blocks = torch.empty_like(fc1)
                config.init_method(blocks)
                fc1.copy_(gated_layout.from_blocks(blocks) if gated else blocks)
                config.output_layer_init_method(fc2)
        for b in (self.linear_fc1.bias, self.linear_fc2.bias):
            if b is not None:
                b.zero_()

    def forward(self, hidden_states, per_token_scale=None, **kwargs):
        """``[s, b, h]`` (``[s/p, b, h]`` under sequence parallelism) -> ``(output, output_bias)``,
        fc2's bias returned for Megatron's bias-dropout-add, not added."""
        if per_token_scale is not None:
            raise ValueError("per_token_scale is for MoE experts; MegatronParallelMLP is dense")
        out = parallel_mlp_func(
            hidden_states, self.linear_fc1.weight, self.linear_fc2.weight, self.activation,
            b1=self.linear_fc1.bias, tp_group=self.tp, sequence_parallel=self.sequence_parallel,
            recompute=self.recompute, fuse_grad_accum=self.fuse_grad_accum, backend=self.backend,
            tp_comm_overlap=self.tp_comm_overlap)
        bias = self.linear_fc2.bias
        # A view, not the Parameter: Megatron's selective recompute of "mlp" wraps this module in
        # its checkpoint, whose backward recurses forever on a leaf handed out of it (the stock
        # MLP included).
        return out, (None if bias is None else bias.view(bias.shape))

    # ---- distributed checkpointing ----

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (),
                           metadata: Optional[dict] = None):
        """Megatron's keys and global layouts, built from the parameters themselves (the
        distributed optimizer maps its states by them). fc1 is split on dim 0, fc2 on dim 1, fc2's
        bias replicated; a gated fc1 (weight and bias) is described as the stock MLP's
        ``[gate; up]`` global through :func:`interleaved_glu_factory`."""
        metadata = metadata or {}
        dp_cp_group = metadata.get("dp_cp_group")
        if dp_cp_group is None:
            dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        tp_group = self.tp_group
        if tp_group is None:
            tp_group = parallel_state.get_tensor_model_parallel_group()
        singleton = bool(metadata.get("singleton_local_shards", False))
        out = {}
        for name, axes in (("linear_fc1", {"weight": 0, "bias": 0}), ("linear_fc2", {"weight": 1})):
            state = getattr(self, name).state_dict(prefix="", keep_vars=True)
            part = make_sharded_tensors_for_checkpoint(state, f"{prefix}{name}.", axes, sharded_offsets,
                                                       tp_group=tp_group, dp_cp_group=dp_cp_group)
            if name == "linear_fc1" and self.activation.gated:
                for key in (f"{prefix}{name}.weight", f"{prefix}{name}.bias"):
                    if key in part:
                        part[key] = interleaved_glu_factory(part[key], sharded_offsets, singleton)
            out.update(part)
        return out


def interleaved_glu_factory(sh_ten: ShardedTensor, sharded_offsets: tuple = (),
                            singleton_local_shards: bool = False) -> ShardedTensorFactory:
    """Describe an interleaved gated fc1 shard (weight or bias) as the stock MLP does its
    ``[gate_r; up_r]`` shard: gate rows at chunk ``r`` of ``2p`` of the global ``[gate; up]``, up
    rows at chunk ``p + r`` (or, with ``singleton_local_shards``, as two globals ``<key>_w`` and
    ``<key>_v`` of p chunks each). Loading merges the two parts back into interleaved rows."""
    axis = len(sharded_offsets)  # the TP axis of the tensor, after prepended (e.g. layer) axes
    rows = sh_ten.local_shape[0]
    if sh_ten.global_offset[axis] % rows:
        raise ValueError(f"{sh_ten.key}: global offset {sh_ten.global_offset[axis]} is not a "
                         f"multiple of the local rows {rows}")
    rank = sh_ten.global_offset[axis] // rows
    frag = sh_ten.axis_fragmentations[axis]

    @torch.no_grad()
    def build(key, t, replica_id, flattened_range):
        if flattened_range is not None:
            raise NotImplementedError(
                f"{key}: a flattened range of an interleaved gated fc1 is not contiguous in its "
                f"[gate; up] global; save the optimizer in a fully reshardable format")
        if singleton_local_shards:
            keys = (f"{key}_w", f"{key}_v")
            offsets = ((axis, rank, frag), (axis, rank, frag))
        else:
            keys = (key, key)
            offsets = ((axis, rank, 2 * frag), (axis, rank + frag, 2 * frag))
        parts = (gated_layout.gate_rows(t), gated_layout.up_rows(t))
        return [ShardedTensor.from_rank_offsets(k, part.contiguous(), *sharded_offsets, offset,
                                                replica_id=replica_id, prepend_axis_num=axis)
                for k, part, offset in zip(keys, parts, offsets)]

    def merge(parts):
        gate, up = parts
        return gated_layout.interleave(gate, up)

    return ShardedTensorFactory(sh_ten.key, sh_ten.data, build, merge, sh_ten.replica_id,
                                flattened_range=sh_ten.flattened_range)


# ---- specs ------------------------------------------------------------------------------------


def mlp_spec(**options) -> ModuleSpec:
    """A ModuleSpec that ``build_module(spec, config=...)`` turns into a
    :class:`MegatronParallelMLP`; ``options`` are its keyword options (``recompute``,
    ``fuse_grad_accum``, ``tp_comm_overlap``, ``backend``)."""
    known = {"recompute", "fuse_grad_accum", "tp_comm_overlap", "backend"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"mlp_spec: unknown options {sorted(unknown)}; known: {sorted(known)}")
    return ModuleSpec(module=MegatronParallelMLP, params=dict(options))


def gpt_layer_spec(transformer_engine: bool = False, layer_kwargs: Optional[dict] = None,
                   **options) -> ModuleSpec:
    """A GPT layer spec with our MLP in it.

    ``transformer_engine=False``: Megatron's local layer (``get_gpt_layer_local_spec``), its
    ``pre_mlp_layernorm`` kept. ``True``: Transformer Engine's layer
    (``get_gpt_layer_with_transformer_engine_spec``), which fuses the pre-MLP norm into fc1: that
    norm becomes a separate ``TENorm`` before our MLP, and the layer's checkpoint key map sends
    ``pre_mlp_layernorm.*`` to TE's ``mlp.linear_fc1.layer_norm_*``, so checkpoints stay those of
    the stock TE layer. ``layer_kwargs`` go to Megatron's spec function (e.g.
    ``{"normalization": "RMSNorm"}`` for the local one); ``options`` to :func:`mlp_spec`.
    """
    from megatron.core.models.gpt import gpt_layer_specs

    layer_kwargs = dict(layer_kwargs or {})
    if transformer_engine:
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is None:
            raise ValueError("transformer_engine=True needs Transformer Engine, which is not "
                             "installed here; use transformer_engine=False")
        from megatron.core.extensions.transformer_engine import TENorm

        spec = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(**layer_kwargs)
        return with_parallel_mlp(spec, pre_mlp_norm=TENorm, **options)
    spec = gpt_layer_specs.get_gpt_layer_local_spec(**layer_kwargs)
    return with_parallel_mlp(spec, **options)


# Where a fused norm-into-fc1 layer keeps the pre-MLP norm's parameters.
_FUSED_NORM_KEYS = {"pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def with_parallel_mlp(layer_spec: ModuleSpec, pre_mlp_norm=None, **options) -> ModuleSpec:
    """A copy of a TransformerLayer spec with our MLP. Where the spec has no pre-MLP norm of its
    own (its fc1 had the norm fused in), ``pre_mlp_norm`` becomes one, saved under the fused
    layer's keys."""
    spec = copy.deepcopy(layer_spec)
    sub = spec.submodules
    sub.mlp = mlp_spec(**options)
    if _is_identity(sub.pre_mlp_layernorm):
        if pre_mlp_norm is None:
            raise ValueError("this layer spec fuses the pre-MLP norm into fc1 (pre_mlp_layernorm "
                             "is IdentityOp); pass pre_mlp_norm= to put a norm before our MLP")
        sub.pre_mlp_layernorm = pre_mlp_norm
        keys = dict(getattr(sub, "sharded_state_dict_keys_map", None) or {})
        # TE's own op-fuser map names mlp.* keys of TE's fused layer; ours is Megatron's layout.
        keys = {k: v for k, v in keys.items() if not k.startswith("mlp.")}
        keys.update(_FUSED_NORM_KEYS)
        sub.sharded_state_dict_keys_map = keys
    return spec


def _is_identity(module) -> bool:
    from megatron.core.transformer.identity_op import IdentityOp

    target = module.module if isinstance(module, ModuleSpec) else module
    return target is IdentityOp
