"""Nanotron drop-in: an MLP with the contract of ``nanotron.models.llama.MLP`` on parallel_mlp's
fused layer, and a context manager that builds Nanotron's Llama with it.

    from parallel_mlp.integrations.nanotron import llama_with_parallel_mlp

    with llama_with_parallel_mlp(recompute=False):
        trainer = DistributedTrainer(config_file)      # builds (and initializes) the model

``NanotronParallelMLP(config, parallel_config, tp_pg)`` takes ``[seq, batch, hidden]`` and returns
``{"hidden_states": y}``; ``parallel_config.tp_mode`` ``ALL_REDUCE`` keeps input and output
replicated, ``REDUCE_SCATTER`` is our sequence parallelism (each rank's slice of the sequence).

Checkpoints. Nanotron's global gated weight is ``[all gate; all up]`` and its rank r holds
``[gate_r; up_r]``. Our rank-r shard holds the same units, interleaved, and tells Nanotron so with
two slice pairs onto that global (gate rows ``0::2`` -> chunk ``r``, up rows ``1::2`` -> chunk
``p + r``), so ``nanotron.serialize`` reshards between the two layouts. One detail of Nanotron's
loader decides the parameter's name: when it finds a file under the parameter's own name for this
TP rank and size, it copies the data raw without reading any slice metadata; otherwise it globs
``model_<name>*`` in the module's folder and reshards through the metadata. So the interleaved
weight is named ``gate_up_proj.weight_`` (Nanotron's is ``gate_up_proj.weight``):

- a native checkpoint never loads raw into our layout (its file names are never ours), at the
  same TP size or another: it is resharded through its metadata, as it is at a new TP size;
- Nanotron's own MLP reads ours the same way (its glob ``model_weight*`` finds our files);
- ``down_proj.weight`` keeps Nanotron's name and layout (both split its columns the same way).

This module imports nanotron; ``import parallel_mlp`` never does.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
from nanotron.parallel.parameters import SlicesPair
from nanotron.parallel.sharded_parameters import create_sharded_parameter
from nanotron.parallel.tensor_parallel.enum import TensorParallelLinearMode
from torch import nn

from ..activations import get_activation
from ..backends import check_backend_name
from ..checks import require_divisible, require_flag
from ..checkpoint import ChecksBeforeLoading
from ..layer import TPShard, parallel_mlp_func
from ..overlap import check_option as check_overlap_option
from ..params import set_muon_hooks, set_tp_metadata
from ..tp import resolve_group
from .hf_activations import gated_activation

__all__ = ["NanotronParallelMLP", "llama_with_parallel_mlp"]

# The interleaved fc1's parameter name; see the module docstring for why it is not "weight".
GATE_UP_PARAM = "weight_"


def _global_ranks(tp_pg) -> tuple[int, ...]:
    import torch.distributed as dist

    if tp_pg is None:
        return (dist.get_rank() if dist.is_initialized() else 0,)
    return tuple(sorted(dist.get_global_rank(tp_pg, i) for i in range(tp_pg.size())))


def _sharded(param: torch.Tensor, tp_pg, pairs, unsharded_shape) -> nn.Parameter:
    """``param`` as a NanotronParameter marked sharded with these (local, global) slice pairs.
    Slice bounds are Python ints, so any Nanotron reader parses them (numpy 2 ints are written
    as ``np.int64(...)``, which nanotron 0.4's reader refuses)."""
    pairs = tuple(SlicesPair(local_slices=tuple(local), global_slices=tuple(glob))
                  for local, glob in pairs)
    return create_sharded_parameter(param, global_ranks=_global_ranks(tp_pg),
                                    local_global_slices_pairs=pairs,
                                    unsharded_shape=tuple(int(s) for s in unsharded_shape))


class _GateUp(TPShard):
    """fc1's shard, interleaved (gate unit i at row 2i), under Nanotron's module name."""

    def __init__(self, param: nn.Parameter):
        super().__init__()
        self.register_parameter(GATE_UP_PARAM, param)
        self._tag_parameters()

    def _tag_parameters(self) -> None:
        set_tp_metadata(self.weight, partition_dim=0)
        set_muon_hooks(self.weight)

    @property
    def weight(self) -> torch.Tensor:
        return getattr(self, GATE_UP_PARAM)


class _Down(TPShard):
    """fc2's shard: columns ``[r*I/p, (r+1)*I/p)`` of ``down_proj``, Nanotron's name and layout."""

    def __init__(self, param: nn.Parameter):
        super().__init__()
        self.weight = param
        self._tag_parameters()

    def _tag_parameters(self) -> None:
        set_tp_metadata(self.weight, partition_dim=1)


class NanotronParallelMLP(ChecksBeforeLoading, nn.Module):
    """``nanotron.models.llama.MLP(config, parallel_config, tp_pg)`` on parallel_mlp's layer.

    Reads ``config.hidden_size``, ``config.intermediate_size`` and ``config.hidden_act`` (HF
    activation names: silu/swish -> swiglu, gelu -> geglu_erf, the tanh GELUs -> geglu,
    relu -> reglu, sigmoid -> glu), ``parallel_config.tp_mode`` and
    ``parallel_config.tp_linear_async_communication``. Options: ``recompute``, ``backend`` and
    ``tp_comm_overlap`` as in ParallelMLP; ``tp_comm_overlap=None`` follows
    ``tp_linear_async_communication`` (True: ``"auto"``, the collectives run block by block beside
    the GEMMs where the group is NCCL's; False: off, the backward's collectives still overlapping
    its weight-gradient GEMMs). No biases (Nanotron's Llama has none).

    Gradients are always real ``.grad`` tensors, as Nanotron's gradient accumulator requires.
    """

    def __init__(self, config, parallel_config, tp_pg, *, recompute: bool = False,
                 backend: str = "auto", tp_comm_overlap=None, device=None, dtype=None):
        super().__init__()
        self.activation = get_activation(gated_activation(config.hidden_act))
        mode = getattr(parallel_config, "tp_mode", None) or TensorParallelLinearMode.ALL_REDUCE
        if isinstance(mode, str):
            mode = TensorParallelLinearMode[mode.upper()]
        self.tp = resolve_group(tp_pg)
        self.sequence_parallel = mode is TensorParallelLinearMode.REDUCE_SCATTER
        self.recompute, self.backend = require_flag("recompute", recompute), check_backend_name(backend)
        if tp_comm_overlap is None:
            asynchronous = getattr(parallel_config, "tp_linear_async_communication", False)
            tp_comm_overlap = "auto" if asynchronous else False
        check_overlap_option(tp_comm_overlap)
        self.tp_comm_overlap = tp_comm_overlap
        hidden, inter = config.hidden_size, config.intermediate_size
        require_divisible("intermediate_size", inter, self.tp.size)
        n, r = inter // self.tp.size, self.tp.rank
        self.hidden_size, self.intermediate_size = hidden, inter
        kw = dict(device=device, dtype=dtype)

        everything = slice(None)
        gate_up = _sharded(nn.Parameter(torch.empty(2 * n, hidden, **kw)), tp_pg, [
            ((slice(0, 2 * n, 2), everything), (slice(r * n, (r + 1) * n), everything)),
            ((slice(1, 2 * n, 2), everything), (slice(inter + r * n, inter + (r + 1) * n), everything)),
        ], (2 * inter, hidden))
        down = _sharded(nn.Parameter(torch.empty(hidden, n, **kw)), tp_pg, [
            ((everything, everything), (everything, slice(r * n, (r + 1) * n))),
        ], (hidden, inter))
        self.gate_up_proj = _GateUp(gate_up)
        self.down_proj = _Down(down)
        if gate_up.device.type != "meta":
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, num_layers: int = 1) -> None:
        """Nanotron's Llama initialization: fc1 ~ N(0, std), fc2 ~ N(0, std / sqrt(2 L))."""
        self.gate_up_proj.weight.normal_(0.0, std)
        self.down_proj.weight.normal_(0.0, std / math.sqrt(2 * num_layers))

    def forward(self, hidden_states):
        y = parallel_mlp_func(hidden_states, self.gate_up_proj.weight, self.down_proj.weight,
                              self.activation, tp_group=self.tp,
                              sequence_parallel=self.sequence_parallel, recompute=self.recompute,
                              backend=self.backend, tp_comm_overlap=self.tp_comm_overlap)
        return {"hidden_states": y}


@contextlib.contextmanager
def llama_with_parallel_mlp(**options):
    """While inside, ``nanotron.models.llama`` builds :class:`NanotronParallelMLP` (with
    ``options``) wherever it builds its ``MLP``, and ``LlamaForTraining.init_model_randomly``
    initializes those MLPs the way it initializes its own (it knows only its own module classes).

    Nanotron's decoder layer constructs ``MLP`` by that name, with no spec or registry to hook,
    and its trainer builds and initializes the model inside its constructor: so wrap the
    construction (``DistributedTrainer(...)``, or ``build_model`` + ``init_model_randomly``).
    """
    from nanotron.models import llama

    stock_mlp = llama.MLP
    stock_init = llama.LlamaForTraining.init_model_randomly

    @functools.wraps(stock_init)
    def init_model_randomly(self, config):
        ours = [(parent, name, child) for parent in self.modules()
                for name, child in parent.named_children() if isinstance(child, NanotronParallelMLP)]
        for parent, name, _ in ours:  # hidden from the stock loop, which would refuse them
            parent._modules[name] = nn.Identity()
        try:
            stock_init(self, config)
        finally:
            for parent, name, child in ours:
                parent._modules[name] = child
        std = config.model.init_method.std
        layers = config.model.model_config.num_hidden_layers
        for _, _, child in ours:
            child.reset_parameters(std=std, num_layers=layers)

    llama.MLP = functools.partial(NanotronParallelMLP, **options)
    llama.LlamaForTraining.init_model_randomly = init_model_randomly
    try:
        yield
    finally:
        llama.MLP = stock_mlp
        llama.LlamaForTraining.init_model_randomly = stock_init
