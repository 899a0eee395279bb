"""ParallelMLP: fc1 column-parallel, fc2 row-parallel, one fused autograd function per call."""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import torch
from torch import nn

from . import checkpoint
from . import overlap as overlap_mod
from .activations import get_activation
from .autograd import FunctionOptions, ParallelMLPFunction, apply_function, replays_launches
from .backends import check_backend_name
from .checks import (check_sequence_parallel_input, check_shards, plainly_valid,
                     require_divisible, require_flag, require_float_dtype,
                     require_positive_int)
from .params import set_muon_hooks, set_tp_metadata
from . import small_step
from .tp import TPGroup, all_gather_objects, resolve_group


def parallel_mlp_func(x, w1, w2, activation, *, b1=None, b2=None, tp_group=None,
                      sequence_parallel=False, recompute=False, fuse_grad_accum=False,
                      backend="auto", tp_comm_overlap=False):
    """The TP MLP on this rank's shards: ``all_reduce(act(x @ w1.T + b1) @ w2.T) + b2``.

    ``w1`` is this rank's fc1 rows (gated: interleaved gate/up pairs), ``w2`` its fc2 columns,
    ``b1`` its fc1 bias slice and ``b2`` the full, replicated fc2 bias. Collective when the TP
    group has more than one rank. With ``sequence_parallel``, ``x`` and the result are this rank's
    contiguous slice of dim 0 (rank order, equal slices on every rank):
    ``reduce_scatter(act(all_gather(x) @ w1.T + b1) @ w2.T) + b2``. ``tp_comm_overlap``
    (False, True or "auto": on with NCCL) runs those collectives block by block beside the GEMMs.
    With ``backend="auto"``, a step too small for the fused path to pay runs as plain autograd
    ops (small_step.py says when).
    """
    act = get_activation(activation)
    check_backend_name(backend)
    tp = tp_group if isinstance(tp_group, TPGroup) else resolve_group(tp_group)
    return _run(x, w1, b1, w2, b2, act, tp, require_flag("sequence_parallel", sequence_parallel),
                require_flag("recompute", recompute), require_flag("fuse_grad_accum", fuse_grad_accum),
                backend, tp_comm_overlap)


def _run(x, w1, b1, w2, b2, act, tp: TPGroup, sequence_parallel, recompute, fuse_grad_accum,
         backend: str, tp_comm_overlap, small=None):
    """parallel_mlp_func with its activation and group resolved and its backend's name checked
    (ParallelMLP's forward holds them so): the small step, or the shards' checks and the fused
    function. ``small``: the small-step rule's answer where the caller already has it (None:
    ask it here). Its arguments are positional: a host-bound step pays for each keyword."""
    if sequence_parallel:
        check_sequence_parallel_input(x)
    # The small step's own torch ops refuse what the shards' checks would (shapes, dtypes,
    # devices), so there the checks run only after something failed, to say which input and
    # rule: a host-bound step saves their host time. Not where torch would accept what they
    # refuse (a bias of the wrong shape broadcasts; complex numbers multiply), nor before the
    # fused function, whose kernels check nothing.
    check_on_failure = (b1 is None and b2 is None and isinstance(x, torch.Tensor)
                        and x.dtype.is_floating_point)
    if not check_on_failure:
        check_shards(x, w1, b1, w2, b2, act)
    if backend == "auto" and small is None:
        try:
            s1, s2 = w1.shape, w2.shape
            small = small_step.applies(
                x.numel() // s1[1], s1[1], s1[0], s2[1], s2[0],
                device_type="cuda" if x.is_cuda else x.device.type, backend=backend,
                tp_size=tp.size, recompute=recompute, fuse_grad_accum=fuse_grad_accum,
                compiling=torch.compiler.is_compiling(), gate_ops=act.gate is not None,
                launch_graphs=replays_launches(b1, b2))
        except Exception:
            if check_on_failure:
                check_shards(x, w1, b1, w2, b2, act)
            raise
    if small:
        return _small_step(x, w1, b1, w2, b2, act, check_on_failure)
    if check_on_failure:
        check_shards(x, w1, b1, w2, b2, act)
    overlap = overlap_mod.enabled(tp_comm_overlap, tp, x.device.type)
    return _apply_function(x, w1, b1, w2, b2, act, tp, bool(recompute), bool(fuse_grad_accum),
                           backend, bool(sequence_parallel), overlap)


def _small_step(x, w1, b1, w2, b2, act, check_on_failure: bool):
    """small_step.small_step; where the shards' checks wait for a failure (``check_on_failure``,
    see _run), they run after one, to raise the error that names the input and rule."""
    try:
        return small_step.small_step(x, w1, b1, w2, b2, act)
    except Exception:
        if check_on_failure:
            check_shards(x, w1, b1, w2, b2, act)
        raise


def _apply_function(x, w1, b1, w2, b2, *options):
    """ParallelMLPFunction on these tensors, its other arguments (FunctionOptions' fields, in
    order) bundled into one."""
    options = FunctionOptions(*options)
    if torch.compiler.is_compiling():
        return _run_untraced(x, w1, b1, w2, b2, options)
    return apply_function(x, w1, b1, w2, b2, options)


# torch.compile of a model around the layer runs the fused function as it is, between compiled
# graphs: its collectives work in place on process groups and its kernels are our own, so
# there is nothing for dynamo to trace (it would only try, fail and break the graph there).
# Made on first use under compilation: torch.compiler.disable imports dynamo (and sympy), which
# a process that never compiles should not pay for at import (cold start).
_untraced_apply = None


def _run_untraced(*args):
    global _untraced_apply
    if _untraced_apply is None:
        _untraced_apply = torch.compiler.disable(ParallelMLPFunction.apply)
    return _untraced_apply(*args)


def _weight_and_bias(shard: nn.Module):
    """``(shard.weight, shard.bias)``, read from the shard's own parameter table where they are
    registered there: ``nn.Module.__getattr__`` is a Python call per lookup, which a host-bound
    step pays in full. Anything not registered there (a None bias, a parametrization's property)
    is read as an attribute."""
    params = shard._parameters
    weight = params.get("weight")
    if weight is None:
        weight = shard.weight
    return weight, params["bias"] if "bias" in params else shard.bias


class _KeptLimit(NamedTuple):
    """What ParallelMLP.forward keeps of the small-step rule and of its own options (see
    _small_step_limit), for its fast lane."""

    w1: weakref.ref
    w2: weakref.ref
    options: tuple
    numel: int  # x.numel() below which the step takes the small step
    shapes: tuple
    run: object  # small_step.bias_free_step of the options' activation
    # The fused function's options for the steps from numel on (None: no fast lane for them)
    function_options: FunctionOptions | None = None


def _small_step_limit(w1, w2, options: tuple, kept: _KeptLimit | None,
                      function_options: FunctionOptions | None = None) -> _KeptLimit:
    """The x.numel() below which a step without biases on backend "auto" takes the small step:
    the rule's row limit (small_step.row_limit) times in_features, with weak references to the
    weights and the options it was worked out for, for ParallelMLP.forward to keep until a weight
    or an option changes. ``options``: (TP size, recompute, fuse_grad_accum, activation, whether
    launch groups would replay, x's device type). New weights of the kept ones' shapes (FSDP puts
    new views in place every step) keep the limit, without asking the rule again. A weight whose
    shape changes in place (``w.data = ...``) keeps it too: that only moves a step between two
    paths that compute the same function. ``function_options``: what the fast lane applies the
    fused function with at the steps from the limit on (None: those take the full path)."""
    shapes = (w1.shape, w2.shape)
    if kept is not None and kept.options == options and kept.shapes == shapes:
        return kept._replace(w1=weakref.ref(w1), w2=weakref.ref(w2),
                             function_options=function_options)
    tp_size, recompute, fuse_grad_accum, act, launch_graphs, device_type = options
    numel = 0
    if w1.dim() == 2 and w2.dim() == 2:  # else the checks refuse them, in _run
        (fc1_rows, in_features), (out_features, hidden) = shapes
        numel = in_features * small_step.row_limit(
            in_features, fc1_rows, hidden, out_features, device_type=device_type,
            backend="auto", tp_size=tp_size, recompute=recompute,
            fuse_grad_accum=fuse_grad_accum, compiling=False, gate_ops=act.gate is not None,
            launch_graphs=launch_graphs)
    return _KeptLimit(weakref.ref(w1), weakref.ref(w2), options, numel, shapes,
                      small_step.bias_free_step(act), function_options)


def default_hidden_features(in_features: int, gated: bool) -> int:
    return int(8 / 3 * in_features) if gated else 4 * in_features


class TPShard(nn.Module):
    """A shard module whose parameters carry their TP metadata (and Muon hooks) whatever replaces
    them: ``to_empty()`` after meta-device construction, ``.to()`` across device types and
    ``load_state_dict(assign=True)`` all put new Parameter objects in place (with
    ``torch.__future__``'s swap-on-conversion too, the object is kept but its attributes are
    swapped out), and so does ``copy.deepcopy``; those know nothing of the attributes set on the
    old ones."""

    def _tag_parameters(self) -> None:
        raise NotImplementedError

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._tag_parameters()
        return self

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._tag_parameters()

    def __setstate__(self, state):
        # copy.deepcopy builds new Parameters without the old ones' attributes (unpickling
        # keeps them; tagging again changes nothing there).
        super().__setstate__(state)
        self._tag_parameters()


class ColumnParallelShard(TPShard):
    """fc1's shard: rows ``[r*F/p, (r+1)*F/p)`` of the global ``[F, in]`` weight (and bias);
    ``gated``: interleaved gate/up rows, exposed to Muon as separate matrices."""

    def __init__(self, in_features, out_features_per_rank, bias, device, dtype, gated=False):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.gated = bool(gated)
        self.weight = nn.Parameter(torch.empty(out_features_per_rank, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(out_features_per_rank, **kw)) if bias else None
        self._tag_parameters()

    def _tag_parameters(self) -> None:
        set_tp_metadata(self.weight, partition_dim=0)
        if self.bias is not None:
            set_tp_metadata(self.bias, partition_dim=0)
        if self.gated:
            set_muon_hooks(self.weight)


class RowParallelShard(TPShard):
    """fc2's shard: columns ``[r*h/p, (r+1)*h/p)`` of the global ``[out, h]`` weight; the bias is
    replicated on every rank and added once, after the all-reduce."""

    def __init__(self, in_features_per_rank, out_features, bias, device, dtype,
                 sequence_parallel=False):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.sequence_parallel = bool(sequence_parallel)
        self.weight = nn.Parameter(torch.empty(out_features, in_features_per_rank, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self._tag_parameters()

    def _tag_parameters(self) -> None:
        set_tp_metadata(self.weight, partition_dim=1)
        if self.bias is not None:
            # Under sequence parallelism each rank's bias gradient covers its own tokens only.
            set_tp_metadata(self.bias, partition_dim=None,
                            sequence_parallel=self.sequence_parallel)


class ParallelMLP(checkpoint.ChecksBeforeLoading, nn.Module):
    """A Megatron-style tensor-parallel MLP: ``fc2(act(fc1(x)))`` split over the ranks of
    ``tp_group``.

    fc1 is column-parallel (rank r holds rows ``[r*F/p, (r+1)*F/p)`` of ``W1 [F, in]``, ``F = 2h``
    for gated activations with interleaved gate/up rows), fc2 row-parallel (rank r holds columns
    ``[r*h/p, (r+1)*h/p)`` of ``W2 [out, h]``). Input and output are replicated across the group;
    with ``sequence_parallel=True`` they are this rank's contiguous slice of dim 0 instead (the
    sequence dim of ``[s, b, d]``, rank order), and fc2's bias carries ``sequence_parallel = True``:
    its gradient is this rank's part, summed over the group by the framework (Megatron-core) or
    by :func:`parallel_mlp.allreduce_sequence_parallel_grads`.
    """

    def __init__(self, in_features, hidden_features=None, out_features=None, *,
                 activation="gelu_tanh_approx", bias1=False, bias2=False, multiple_of=1,
                 tp_group=None, sequence_parallel=False, recompute=False, fuse_grad_accum=False,
                 backend="auto", tp_comm_overlap=False, device=None, dtype=None):
        super().__init__()
        act = get_activation(activation)
        require_positive_int("in_features", in_features)
        require_positive_int("multiple_of", multiple_of)
        if hidden_features is None:
            hidden_features = default_hidden_features(in_features, act.gated)
        require_positive_int("hidden_features", hidden_features)
        hidden_features = math.ceil(hidden_features / multiple_of) * multiple_of
        out_features = in_features if out_features is None else out_features
        require_positive_int("out_features", out_features)
        check_backend_name(backend)
        overlap_mod.check_option(tp_comm_overlap)
        require_float_dtype("dtype", dtype)

        self.tp = resolve_group(tp_group)
        require_divisible("hidden_features", hidden_features, self.tp.size)
        self.in_features, self.hidden_features, self.out_features = (
            in_features, hidden_features, out_features)
        self.activation = act
        self.recompute, self.fuse_grad_accum, self.backend = (
            require_flag("recompute", recompute), require_flag("fuse_grad_accum", fuse_grad_accum),
            backend)
        self.sequence_parallel = require_flag("sequence_parallel", sequence_parallel)
        bias1, bias2 = require_flag("bias1", bias1), require_flag("bias2", bias2)
        self.tp_comm_overlap = tp_comm_overlap
        self._check_same_config_across_ranks(bias1, bias2, dtype)

        fc1_rows = (2 if act.gated else 1) * hidden_features
        self.fc1 = ColumnParallelShard(in_features, fc1_rows // self.tp.size, bias1, device, dtype,
                                       gated=act.gated)
        self.fc2 = RowParallelShard(hidden_features // self.tp.size, out_features, bias2,
                                    device, dtype, sequence_parallel=self.sequence_parallel)
        if self.fc1.weight.device.type != "meta":
            self.reset_parameters()

    @property
    def fc1_features(self) -> int:
        """Rows of the global W1: 2h for gated activations, h otherwise."""
        return (2 if self.activation.gated else 1) * self.hidden_features

    def _check_same_config_across_ranks(self, bias1, bias2, dtype) -> None:
        """One collective at construction, so a rank built differently fails here instead of
        hanging (or silently computing garbage) in the first all-reduce."""
        config = dict(in_features=self.in_features, hidden_features=self.hidden_features,
                      out_features=self.out_features, activation=self.activation.name,
                      bias1=bool(bias1), bias2=bool(bias2),
                      sequence_parallel=self.sequence_parallel, recompute=self.recompute,
                      fuse_grad_accum=self.fuse_grad_accum, tp_comm_overlap=self.tp_comm_overlap,
                      dtype=str(dtype))
        configs = all_gather_objects(config, self.tp)
        for rank, other in enumerate(configs):
            diff = {k: (config[k], other[k]) for k in config if config[k] != other[k]}
            if diff:
                details = ", ".join(f"{k}: this rank {a!r}, rank {rank} {b!r}"
                                    for k, (a, b) in diff.items())
                raise ValueError(
                    f"ParallelMLP was built with different configurations on the ranks of one "
                    f"tensor-parallel group (size {self.tp.size}): {details}")

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nn.Linear's default init, drawn for the *global* matrices and sliced, so that the
        model is the same at every TP size given the same seed on every rank. Drawn on the
        parameters' device (a CPU draw of a large fc1 takes seconds)."""
        for shard, fan_in, dim in ((self.fc1, self.in_features, 0),
                                   (self.fc2, self.hidden_features, 1)):
            device = shard.weight.device
            full_shape = list(shard.weight.shape)
            full_shape[dim] *= self.tp.size
            bound = 1.0 / math.sqrt(fan_in)
            full = torch.empty(full_shape, device=device).uniform_(-bound, bound)
            shard.weight.copy_(full.chunk(self.tp.size, dim)[self.tp.rank])
            del full
            if shard.bias is not None:
                full_bias = torch.empty(shard.bias.shape[0] * (self.tp.size if dim == 0 else 1),
                                        device=device)
                full_bias.uniform_(-bound, bound)
                part = full_bias.chunk(self.tp.size)[self.tp.rank] if dim == 0 else full_bias
                shard.bias.copy_(part)

    def __setattr__(self, name, value):
        # Every option the kept small-step limit holds for (backend, TP group, memory mode,
        # activation, sequence parallelism, the shards) is an attribute of this module, so
        # setting any attribute drops it and lets forward's fast lane trust it untested.
        self.__dict__.pop("_kept_small_step_limit", None)
        super().__setattr__(name, value)

    def __delattr__(self, name):
        self.__dict__.pop("_kept_small_step_limit", None)
        super().__delattr__(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modules = self._modules  # fc1 and fc2 are always registered submodules
        kept = self.__dict__.get("_kept_small_step_limit")
        if kept is not None and not torch.compiler.is_compiling() and isinstance(x, torch.Tensor):
            # The fast lane of a host-bound step: the module's own options were fixed when the
            # limit was kept (__setattr__ drops it), so what is left to test is what changes
            # without them: compilation (under which the full path decides, as before the
            # limit was kept), the shards' weights and biases (FSDP and loaders put new ones
            # in place), x and the launch graphs' switch. A shard built without a bias holds None
            # as a plain attribute; one given a Parameter since holds it in _parameters instead,
            # and leaves this lane. Against the full path on a 2-core VM (T=8 d=16, 41 rounds in
            # alternating order, two runs, 2026-12-06): the small step's forward (gelu) 16.0
            # against 16.7 µs, its whole step 1.8% shorter by the paired median and level with
            # eager's module; the fused function's forward (swiglu, the torch backend on the
            # CPU) 53.4-54.8 against 56.4-60.1 µs, its whole step 2.5% shorter; on an H100 the
            # gated host-bound steps 0.5-3.3% shorter in 40 paired turns (ties by their intervals;
            # benchmarks/h100-fused-fast-lane.txt).
            s1, s2 = modules["fc1"], modules["fc2"]
            w1, w2 = s1._parameters.get("weight"), s2._parameters.get("weight")
            options = kept.options
            if (w1 is not None and w2 is not None and kept.w1() is w1 and kept.w2() is w2
                    and s1.__dict__.get("bias", w1) is None and s2.__dict__.get("bias", w2) is None
                    and options[5] == ("cuda" if x.is_cuda else x.device.type)
                    and options[4] == replays_launches(None, None)):
                if x.numel() < kept.numel and x.dtype.is_floating_point:
                    try:
                        return kept.run(x, w1, w2)
                    except Exception:  # the checks' error names the input and rule
                        check_shards(x, w1, None, w2, None, options[3])
                        raise
                elif (kept.function_options is not None
                      and plainly_valid(x, w1, None, w2, None, options[3])):
                    # what _run does past the small step, its checks passed
                    return apply_function(x, w1, None, w2, None, kept.function_options)
        w1, b1 = _weight_and_bias(modules["fc1"])
        w2, b2 = _weight_and_bias(modules["fc2"])
        act = get_activation(self.activation)
        small = None
        # Where the shards' checks may wait for a failure (no biases, a floating x; see _run),
        # the small-step rule's answer comes from a row limit kept for these weights and options
        # (_small_step_limit): at a host-bound step, reading the sizes and asking the rule on
        # every call cost more host time than the rest of the layer's dispatch.
        if (self.backend == "auto" and b1 is None and b2 is None and not self.sequence_parallel
                and not torch.compiler.is_compiling() and isinstance(x, torch.Tensor)
                and x.dtype.is_floating_point):
            options = (self.tp.size, self.recompute, self.fuse_grad_accum, act,
                       replays_launches(None, None), "cuda" if x.is_cuda else x.device.type)
            kept = self.__dict__.get("_kept_small_step_limit")
            if (kept is None or kept.w1() is not w1 or kept.w2() is not w2
                    or kept.options != options):
                # For steps from the limit on, the fast lane runs the fused function with the
                # options _run would give it (with the collectives' overlap off; on, _run decides)
                function_options = None if self.tp_comm_overlap is not False else FunctionOptions(
                    act, self.tp, bool(self.recompute), bool(self.fuse_grad_accum), "auto")
                kept = _small_step_limit(w1, w2, options, kept, function_options)
                self.__dict__["_kept_small_step_limit"] = kept  # not a parameter or module
            small = x.numel() < kept.numel
            if small:
                return _small_step(x, w1, None, w2, None, act, True)
        return _run(x, w1, b1, w2, b2, act, self.tp, self.sequence_parallel, self.recompute,
                    self.fuse_grad_accum, check_backend_name(self.backend),
                    self.tp_comm_overlap, small)

    def __getstate__(self):
        # The kept limit holds weak references, which do not pickle; it is worked out again.
        state = dict(super().__getstate__())
        state.pop("_kept_small_step_limit", None)
        return state

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Global (unsharded) weights on every rank; collective over the TP group."""
        return checkpoint.gather_full_state_dict(self)

    def global_layout(self) -> dict:
        """Each state-dict key's global shape and the dim its shards split (None: replicated)."""
        return checkpoint.global_layout(self)

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Take this rank's slice of global weights (from any TP size); checks everything first,
        so a failed load leaves the module untouched."""
        checkpoint.load_full_state_dict(self, state_dict)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, hidden_features={self.hidden_features}, "
                f"out_features={self.out_features}, activation={self.activation.name!r}, "
                f"tp_size={self.tp.size}, sequence_parallel={self.sequence_parallel}, "
                f"tp_comm_overlap={self.tp_comm_overlap!r}, "
                f"recompute={self.recompute}, "
                f"fuse_grad_accum={self.fuse_grad_accum}, backend={self.backend!r}")
