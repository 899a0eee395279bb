"""The fused tensor-parallel MLP as one autograd function, on one rank's shards.

Forward (``x`` is replicated, or with sequence parallelism this rank's block of rows)::

    [SP: x = all_gather_rows(x)]
    preact, postact = gemm_act(x, W1_r.T, act, b1_r)      # preact kept only without recompute
    y = postact @ W2_r.T
    y = all_reduce(y)   |   SP: y = reduce_scatter_rows(y)
    y += b2

Backward::

    [SP: dy = all_gather_rows(dy); x = all_gather_rows(x) started async]
    [recompute: preact = x @ W1_r.T (+ b1_r)]            # bit-identical to forward's preact
    dpreact, postact = gemm_dact(dy, W2_r, preact, act)   # postact recomputed, never stored
    dW2_r = dy.T @ postact
    dx    = dpreact @ W1_r  -> all_reduce | SP: reduce_scatter_rows, started async
    dW1_r = dpreact.T @ x                                 # runs while dx is on the wire
    wait(dx)

Without a TP group there is no collective to hide, and of dx and dW1 the GEMM with the larger
transient workspace runs first (dW1 on a tie), so that it is gone before the other's output is made.

At one rank without biases on the CuTe kernels, and with ``launch_graphs.GRAPHS`` on, the same
launches run in groups whose outputs are made first (the forward; the dact, with dW2 where it
accumulates in place; dW2 otherwise; dW1 and dx), so that a group whose tensors sit where an
earlier call's did can be replayed from a CUDA graph (launch_graphs.py); each group makes and
frees its tensors where the launches below do.

Only the local ``x`` is saved: with sequence parallelism, a 1/p slice, re-gathered in backward
while the dgrad GEMMs run (Megatron does the same). With ``tp_comm_overlap`` the gathers before
fc1 and the dact, and the reduce-scatters or all-reduce after fc2 and the dx GEMM, run block by
block beside those GEMMs (overlap.py). The backward is not differentiable: it
accumulates into gradient buffers in place and recomputes what it needs, so a second backward
through it raises instead of returning wrong second derivatives.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import torch

from .activations import Activation
from .backends import TorchBackend, for_step, resolve
from .grad_accum import (accumulation_buffer, after_accumulating, gradients_wanted,
                         weight_grad)
from .launch_graphs import GRAPHS, tensor_key
from . import overlap as overlap_mod
from .tp import Pending, TPGroup, all_gather_rows, all_reduce, reduce_scatter_rows

DOUBLE_BACKWARD_ERROR = (
    "parallel_mlp: the fused MLP's backward is not differentiable, so a second backward "
    "through it (double backward, e.g. torch.autograd.grad(..., create_graph=True) then "
    "backward) is not supported; compute higher-order gradients with a plain PyTorch MLP")


def _not_differentiable(backward):
    """``torch.autograd.function.once_differentiable`` with a message that says what to do: under
    ``create_graph=True`` the gradients it returns raise when differentiated again."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():  # the usual backward: no graph to keep out of
            return backward(ctx, *grads)
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        # The returned gradients get a grad_fn that raises; they must require grad to have one.
        raising = torch._C._functions.DelayedError(DOUBLE_BACKWARD_ERROR.encode(), len(outputs))
        return raising(*[None if g is None else g.detach().requires_grad_() for g in outputs])

    return wrapper


def _saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks: non-reentrant
    activation checkpointing, save_on_cpu) are in force; True where torch cannot say."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None


# A reshape that autograd does not track as a view (see ParallelMLPFunction.forward).
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the GEMMs run in: autocast's when autocast is on for x's device, else x's.
    Autocast leaves float64 alone, as it does for ``F.linear``."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type) and x.dtype is not torch.float64:
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def _autocast_off(device_type: str):
    """A context with autocast off: a no-op where it is not on (entering torch.autocast costs
    tens of microseconds, a share of a small step's host time)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """t in dtype; t itself when it already is (checked in Python: a no-op .to() still costs a
    dispatch, a share of a small step's host time)."""
    return t if t is None or t.dtype is dtype else t.to(dtype)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as a matrix of rows: itself where it is one already (a view costs a dispatch, a share
    of a small step's host time)."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def _shaped(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """t viewed as ``shape``: itself where it has that shape already."""
    return t if t.shape == shape else t.view(shape)


def _bias_grad(grad_out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The column sums, accumulated in fp32 at least (as the GEMMs accumulate), in bias's dtype."""
    acc = torch.float64 if grad_out.dtype == torch.float64 else torch.float32
    return grad_out.sum(0, dtype=acc).to(bias.dtype)


def _fc1(ops, x2d, w1c, b1c, act, store_preact, tp, sp, overlap):
    """(preact or None, postact) of fc1 over every rank's rows (sequence parallel: gathered
    first, or block by block as the rows arrive)."""
    if not sp:
        return ops.gemm_act(x2d, w1c.t(), act.name, bias=b1c, store_preact=store_preact)
    if not overlap:
        return ops.gemm_act(all_gather_rows(x2d, tp), w1c.t(), act.name, bias=b1c,
                            store_preact=store_preact)
    rows = tp.size * x2d.shape[0]
    features = w1c.shape[0]
    preact = x2d.new_empty(rows, features) if store_preact else None
    postact = x2d.new_empty(rows, features // 2 if act.gated else features)

    def block(owner, r, xb):
        ops.gemm_act(xb, w1c.t(), act.name, bias=b1c, store_preact=store_preact,
                     out_preact=None if preact is None else preact[r], out_postact=postact[r],
                     whole_rows=rows)

    overlap_mod.RowsInFlight(x2d, tp).each(block)
    return preact, postact


def _fc2(ops, postact, w2c, tp, sp, overlap):
    """fc2's output summed over the group: all-reduced, or reduce-scattered to each rank's rows;
    with overlap, block by block while the next block is computed."""
    if overlap:
        if sp:
            return overlap_mod.gemm_reduce_scatter(postact, w2c.t(), tp, ops).wait()
        return overlap_mod.gemm_all_reduce(postact, w2c.t(), tp, ops).wait()
    y = ops.gemm(postact, w2c.t())
    if sp:
        return reduce_scatter_rows(y, tp)
    all_reduce(y, tp)
    return y


def replays_launches(b1, b2) -> bool:
    """What of _in_groups a caller knows before the call: the graphs are on and there are no
    biases (their sums are torch ops). small_step's rule asks it for a one-rank step."""
    return GRAPHS.enabled and b1 is None and b2 is None


def _in_groups(ops, tp, sp: bool, overlap: bool, x2d, b1c, b2c) -> bool:
    """Whether this call runs its launches in groups that ``launch_graphs.GRAPHS`` may replay:
    replays_launches, at one rank (no collective between launches), on the CuTe kernels
    (_kernels_here)."""
    return (replays_launches(b1c, b2c) and tp.size == 1 and not sp and not overlap
            and ops is not TorchBackend and _kernels_here(ops, x2d))


def _kernels_here(ops, x2d) -> bool:
    """Whether x2d is on the current CUDA device and the kernels run their rule's configs."""
    if not x2d.is_cuda:
        return False
    kernels = ops._ops()
    return kernels._config_rewrite is None and x2d.device.index == kernels._current_device()


def _site(phase: str, ops, x2d, *more) -> tuple:
    """A launch group's site: what it runs, on which stream, without its tensors' addresses."""
    index = x2d.device.index
    return (phase, ops, index, ops._ops()._stream_handle(index)) + more


def _forward_in_groups(site, ops, x2d, w1c, w2c, act: Activation, store_preact: bool,
                       lead: torch.Size):
    """(preact or None, y) of fc1 and fc2 as one launch group, their outputs made first
    (``site``: the forward's, from _site); y of shape ``lead`` + (fc2's rows,), x's leading dims,
    so that the function returns it as made: an output that is a view costs the C++ apply its
    view bookkeeping. y is made before postact, which the forward frees: at the sweep's shapes
    the caching allocator's blocks then hold no more than the other way round, and less at T=512
    d=8192 and T=2048 d=2048 swiglu (tools/allocator_model.py)."""
    rows, features = x2d.shape[0], w1c.shape[0]
    preact = x2d.new_empty(rows, features) if store_preact else None
    y = x2d.new_empty(*lead, w2c.shape[0])
    y2d = y if y.dim() == 2 else y.view(rows, w2c.shape[0])
    postact = x2d.new_empty(rows, features // 2 if act.gated else features)
    w2t = w2c.t()

    def launches():  # not called where the group replays: W1's view is made only when it runs
        ops.gemm_act(x2d, w1c.t(), act.name, store_preact=store_preact, out_preact=preact,
                     out_postact=postact)
        ops.gemm(postact, w2t, out=y2d)

    if ops.on_cublas(postact, w2t, y2d):  # cuBLAS's bits under capture are cuBLAS's to choose
        launches()
        return preact, y
    GRAPHS.run(site, (site, tensor_key(x2d), tensor_key(w1c), tensor_key(w2c),
                      0 if preact is None else preact.data_ptr(), postact.data_ptr(),
                      y.data_ptr()), launches, x2d.device)
    return preact, y


def _run_group(site, key, gemms, device, before=None) -> None:
    """Plain GEMMs ``[(ops, a, b, out, accumulate), ...]`` (none or more), after ``before`` (the
    group's own launches, or None), as one launch group keyed by ``key``; launch by launch where
    one of the GEMMs runs on cuBLAS or the torch backend (their launches are not ours to
    capture)."""

    def launches():
        if before is not None:
            before()
        for target, a, b, out, accumulate in gemms:
            target.gemm(a, b, out=out, accumulate=accumulate)

    if any(t is TorchBackend or t.on_cublas(a, b, out, acc) for t, a, b, out, acc in gemms):
        launches()
        return
    GRAPHS.run(site, key, launches, device)


def _out_key(gemm) -> tuple:
    """What a group's key needs of a GEMM beyond the function's operands: its target and mode,
    and where it writes (a fresh output's address and dtype, its shape fixed by the operands: a
    weight gradient takes its weight's dtype, which the cast operands do not show; a buffer's
    whole geometry)."""
    target, _, _, out, accumulate = gemm
    return (target, accumulate,
            tensor_key(out) if accumulate else (out.data_ptr(), out.dtype))


def _weight_grad_gemm(ops, backend: str, a, b, weight, fuse: bool):
    """(the GEMM of weight's gradient as ``_run_group`` takes it, a function that returns what
    autograd receives for weight once it ran): into main_grad or .grad in place, or into a
    fresh gradient made here."""
    buffer = accumulation_buffer(weight, fuse)
    if buffer is None:
        out = weight.new_empty(weight.shape)  # torch.empty(dtype=, device=): ~3x the host time
        return (ops, a, b, out, False), lambda: out
    return ((resolve(backend, a, b, buffer), a, b, buffer, True),
            lambda: after_accumulating(weight, buffer))


def _backward_in_groups(site, ops, backend: str, fuse: bool, dy2d, x2d, w1c, w2c, held: list,
                        act: Activation, weights, need_x: bool, need_w1: bool, need_w2: bool):
    """(dx or None, what autograd receives for W1 and for W2) in launch groups: [fc1's replay
    and] the dact, with fc2's weight gradient where it accumulates in place, else fc2's weight
    gradient on its own; then fc1's weight gradient and dx (one group, or one each where either
    GEMM has a transient workspace). Each group's outputs are made just before it, and each
    input freed after its last group. ``site``: the dact group's, which the others'
    extend; ``held``: [forward's preact or None], the only reference to it, emptied here.

    Every key holds the function's operands (dy, x, W1, W2) whole; the tensors made here are
    contiguous, of shapes those fix, so their addresses stand for them."""
    w1, w2 = weights
    rows, (features, d_in) = x2d.shape[0], w1c.shape
    width = w2c.shape[1]
    device = dy2d.device
    preact = held.pop()
    replay = preact is None
    operands = (tensor_key(dy2d), tensor_key(x2d), tensor_key(w1c), tensor_key(w2c),
                None if replay else tensor_key(preact))
    if replay:
        preact = x2d.new_empty(rows, features)

    # fc2's weight gradient joins the dact's group where it makes nothing (accumulated in
    # place: main_grad, or an existing .grad) and has no transient workspace: one launch group
    # fewer, at no memory. A fresh dW2 made before the dact would live beside preact, and even
    # where that asks for no more bytes at the peak, the caching allocator's blocks can hold more
    # (T=512 d=1024 swiglu: 26.75 against 25.0 MiB, H200, 2026-12-03, `bench sweep`).
    join = (need_w2 and accumulation_buffer(w2, fuse) is not None
            and not ops.transient_bytes(w2c.shape[0], width, rows, device))
    # postact before dpreact: the allocator's blocks then hold what the tensors ask for at the
    # step's peak at T=512 d=1024 swiglu (25.0 MiB on the H200; 26.0 the other way round), and
    # no more at the sweep's other shapes, in either mode (tools/allocator_model.py).
    postact = x2d.new_empty(rows, width)
    dpreact = x2d.new_empty(rows, features)

    def dact():
        if replay:
            ops.gemm(x2d, w1c.t(), out=preact, replay=True)
        ops.gemm_dact(dy2d, w2c, preact, act.name, out_dpreact=dpreact, out_postact=postact)

    made, joined = {}, []
    if join:
        gemm, made["w2"] = _weight_grad_gemm(ops, backend, dy2d.t(), postact, w2, fuse)
        joined.append(gemm)
        del gemm
    _run_group(site, (site, operands, preact.data_ptr(), dpreact.data_ptr(), postact.data_ptr())
               + tuple(_out_key(g) for g in joined), joined, device, before=dact)
    del preact, joined  # the joined GEMM holds postact
    if need_w2 and not join:
        gemm, made["w2"] = _weight_grad_gemm(ops, backend, dy2d.t(), postact, w2, fuse)
        _run_group(site + ("dW2",), (site, "dW2", operands, postact.data_ptr())
                   + _out_key(gemm), [gemm], device)
        del gemm
    del postact

    def w1_gemm():
        gemm, made["w1"] = _weight_grad_gemm(ops, backend, dpreact.t(), x2d, w1, fuse)
        return gemm

    def dx_gemm():
        made["dx"] = x2d.new_empty(rows, d_in)
        return (ops, dpreact, w1c, made["dx"], False)

    def run(phase, gemms):
        key = (site, phase, operands, dpreact.data_ptr()) + tuple(_out_key(g) for g in gemms)
        _run_group(site + (phase,), key, gemms, device)

    dx_workspace = ops.transient_bytes(rows, d_in, features, device) if need_x else 0
    w1_workspace = ops.transient_bytes(features, d_in, rows, device) if need_w1 else 0
    if need_x and need_w1 and not dx_workspace and not w1_workspace:
        run("dW1+dx", [w1_gemm(), dx_gemm()])
    else:
        # The larger workspace first, so that it is gone before the other's output is made (a
        # tie leaves dW1 first, as the backward below does).
        steps = [("dW1", need_w1, w1_gemm), ("dx", need_x, dx_gemm)]
        if dx_workspace > w1_workspace:
            steps.reverse()
        for phase, wanted, make in steps:
            if wanted:
                run(phase, [make()])
    return (made.get("dx"), made["w1"]() if need_w1 else None,
            made["w2"]() if need_w2 else None)


class FunctionOptions(NamedTuple):
    """What ParallelMLPFunction does besides its tensors: one argument of ``apply``, as autograd
    looks at each of them on every call, a share of a small step's host time."""

    act: Activation
    tp: TPGroup
    recompute: bool
    fuse_grad_accum: bool
    backend: str
    sequence_parallel: bool = False
    comm_overlap: bool = False


class ParallelMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, options: FunctionOptions):
        act, tp, recompute, fuse_grad_accum, backend, sequence_parallel, comm_overlap = options
        dtype = _compute_dtype(x)
        sp = sequence_parallel and tp.size > 1
        overlap = comm_overlap and tp.size > 1
        # Autocast is resolved here once; the ops below must see exactly the dtypes chosen.
        with _autocast_off(x.device.type):
            x_rows = _rows(x)
            x2d = _cast(x_rows, dtype)
            w1c, b1c = _cast(w1, dtype), _cast(b1, dtype)
            w2c, b2c = _cast(w2, dtype), _cast(b2, dtype)
            # Every GEMM operand of both passes is one of these, or a tensor with their row widths
            # (preact and dpreact: fc1's rows; y and dy: fc2's), so the choice holds for all of
            # them and the ops need not check again.
            ops = resolve(backend, x2d, w1c, w2c, b1c, (1, w1c.shape[0]), (1, w2c.shape[0]))
            ops = for_step(ops, tp.size * x2d.shape[0] if sp else x2d.shape[0], w1c.shape,
                           w2c.shape)
            groups = _in_groups(ops, tp, sp, overlap, x2d, b1c, b2c)
            if groups:
                site = _site("forward", ops, x2d, act.name, not recompute)
                groups = not GRAPHS.site_off(site)
            if groups:
                preact, y = _forward_in_groups(site, ops, x2d, w1c, w2c, act, not recompute,
                                               x.shape[:-1])
            else:
                preact, postact = _fc1(ops, x2d, w1c, b1c, act, not recompute, tp, sp, overlap)
                y = _fc2(ops, postact, w2c, tp, sp, overlap)
                del postact
                if b2c is not None:
                    y.add_(b2c)

        # x is saved as given to this rank: under sequence parallelism, its slice.
        # preact is ours alone (made here, never seen by the caller), and the largest thing kept:
        # held on ctx rather than saved, so backward can drop it as soon as the dact has read it.
        # A saved tensor would live until backward returns, beside dx and dW1 (at d=8192, h=3584,
        # T=8192 that is 117 MB above eager's step peak, which frees its activation earlier).
        # Under saved-tensor hooks (activation checkpointing, save_on_cpu) it is saved like the
        # rest, so that the hooks see it.
        # Where x2d only folds x's leading dims, x itself is saved and folded again in backward:
        # a view of it made here (autograd is off inside forward) would turn a later in-place
        # edit of x into torch's "view created in no_grad mode" error at the edit, where
        # nn.Linear's caller gets the saved-tensor version check at backward.
        folded = x2d is x_rows and x_rows is not x and x_rows._is_view()
        hooked = _saved_tensor_hooks_active()
        ctx.save_for_backward(x if folded else x2d, w1c, b1c, w2c, preact if hooked else None)
        ctx.preact = None if hooked else preact
        # The parameters themselves, for their main_grad / .grad buffers; one attribute, as each
        # costs the host a dictionary store.
        ctx.state = ((w1, w2), (b1, b2), (x.shape, x.dtype), act, tp, sp, overlap,
                     fuse_grad_accum, backend, ops, groups)
        # As made where it has x's leading dims (launch groups, a 2-D x): see _forward_in_groups.
        # Else reshaped as torch's matmul does a folded input's output: a view made here would
        # be an output autograd refuses to let the caller modify in place (y += residual).
        if y.dim() == x.dim():
            return y
        return _UNSAFE_VIEW(y, (*x.shape[:-1], y.shape[-1]))

    @staticmethod
    @_not_differentiable
    def backward(ctx, dy):
        x_saved, w1c, b1c, w2c, saved_preact = ctx.saved_tensors
        x2d = _rows(x_saved)
        preact = ctx.preact if ctx.preact is not None else saved_preact
        ctx.preact = None
        # No preact: recompute mode, or a second backward (retain_graph) after the first freed it.
        replay = preact is None
        ((w1, w2), (b1, b2), (x_shape, x_dtype), act, tp, sp, overlap, fuse, backend, forward_ops,
         forward_groups) = ctx.state
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        if fuse:
            # Not where this backward wants no weight gradient (backward(inputs=[x])): their
            # buffers stay as they are.
            fuse = gradients_wanted(ctx, 1, 2 if b1 is None else 3)  # w1, w2 (x is 0)

        dy2d = _cast(_rows(dy), x2d.dtype)
        # Every other operand is forward's or has its row widths, and forward's choice covered
        # them (for_step's too: the step's sizes are the same): only dy is new to the CuTe
        # path's checks, and it can only send the step to the torch backend.
        ops = forward_ops
        if ops is not TorchBackend and resolve(backend, dy2d) is TorchBackend:
            ops = TorchBackend
        groups = (forward_groups and ops is forward_ops
                  and _in_groups(ops, tp, sp, overlap, dy2d, b1c, None))
        if groups:
            site = _site("dact", ops, dy2d, act.name, replay)
            groups = not GRAPHS.site_off(site)
        if groups:
            held = [preact]  # handed over, so that the groups can free it after the dact
            del preact, saved_preact
            grad_x, grad_w1, grad_w2 = _backward_in_groups(
                site, ops, backend, fuse, dy2d, x2d, w1c, w2c, held, act, (w1, w2),
                need_x, need_w1, need_w2)
            if grad_x is not None:
                grad_x = _cast(_shaped(grad_x, x_shape), x_dtype)
            return grad_x, grad_w1, None, grad_w2, None, None
        rows = tp.size * x2d.shape[0] if sp else x2d.shape[0]

        def replay_fc1(x_rows, out=None, whole_rows=None):
            if b1c is None:
                # Only preact is needed. A plain GEMM of the same shape runs the same kernel
                # config and mainloop as forward's gemm_act and rounds the same fp32 accumulator
                # once, so it gives the same bits, without writing a postact nobody reads.
                return ops.gemm(x_rows, w1c.t(), out=out, whole_rows=whole_rows, replay=True)
            # With a bias, gemm_act rounds (acc + b1) once; a GEMM then a bias add would round
            # twice. Replay the forward's own op instead.
            return ops.gemm_act(x_rows, w1c.t(), act.name, bias=b1c, store_preact=True,
                                out_preact=out, whole_rows=whole_rows)[0]

        # Under sequence parallelism x is needed whole only by dW1 (or the fc1 replay): its gather
        # runs behind the dgrad GEMMs, issued after dy's, which the first GEMM waits for.
        x_pending = None
        if sp and replay and overlap:
            # The replay runs block by block as x's rows arrive; it leaves x gathered for dW1.
            # dy's broadcasts are issued right behind x's, so they arrive during the replay.
            preact = x2d.new_empty(rows, w1c.shape[0])
            x_flight = overlap_mod.RowsInFlight(x2d, tp)
            dy_flight = overlap_mod.RowsInFlight(dy2d, tp)
            x_pending = Pending(x_flight.each(
                lambda owner, r, xb: replay_fc1(xb, out=preact[r], whole_rows=rows)))
        elif sp and overlap:
            dy_flight = overlap_mod.RowsInFlight(dy2d, tp)
        elif sp:
            dy_pending = all_gather_rows(dy2d, tp, async_op=True)
        if sp and x_pending is None and (need_w1 or replay):
            x_pending = all_gather_rows(x2d, tp, async_op=True)

        def x_full():
            return x_pending.wait() if x_pending is not None else x2d

        if preact is None:
            preact = replay_fc1(x_full())
        if sp and overlap:
            width = w2c.shape[1]
            dpreact = x2d.new_empty(rows, preact.shape[1])
            postact = x2d.new_empty(rows, width)

            def dact_block(owner, r, dyb):
                ops.gemm_dact(dyb, w2c, preact[r], act.name, out_dpreact=dpreact[r],
                              out_postact=postact[r], whole_rows=rows)

            dy_full = dy_flight.each(dact_block)
        else:
            dy_full = dy_pending.wait() if sp else dy2d
            dpreact, postact = ops.gemm_dact(dy_full, w2c, preact, act.name)
        del preact

        grad_w2 = (weight_grad(ops, backend, dy_full.t(), postact, w2, fuse)
                   if need_w2 else None)
        # Under sequence parallelism this rank's dy covers its own tokens only: a partial sum,
        # which the framework adds over the group (b2 is marked sequence_parallel).
        grad_b2 = _bias_grad(dy2d, b2) if need_b2 else None
        del postact, dy_full

        def dx_in_flight():
            if sp and overlap:
                return overlap_mod.gemm_reduce_scatter(dpreact, w1c, tp, ops)
            dx_full = ops.gemm(dpreact, w1c)
            if sp:
                return reduce_scatter_rows(dx_full, tp, async_op=True)
            return all_reduce(dx_full, tp, async_op=True)

        # With a TP group, dx goes first so that its all-reduce (or reduce-scatter) runs behind
        # dW1. Alone, dx has nothing to hide behind, and the GEMM with the larger transient
        # workspace (a stream-K GEMM's fp32 partial sums, 16.5 MiB at 128x256 tiles on 132 SMs)
        # goes first, so that the workspace is freed before the other's output is made instead
        # of adding to the step's peak on top of it; a tie leaves dW1 first.
        # dx = dpreact @ W1: [rows, d] over K = fc1's rows; dW1 = dpreact.T @ x: [fc1's rows, d]
        # over K = rows.
        features, d_in = w1c.shape
        dx_first = need_x and (tp.size > 1 or (
            need_w1 and ops.transient_bytes(rows, d_in, features, dpreact.device)
            > ops.transient_bytes(features, d_in, rows, dpreact.device)))
        dx_pending = dx_in_flight() if dx_first else None
        grad_w1 = (weight_grad(ops, backend, dpreact.t(), x_full(), w1, fuse)
                   if need_w1 else None)
        grad_b1 = _bias_grad(dpreact, b1) if need_b1 else None
        if need_x and not dx_first:
            dx_pending = dx_in_flight()
        if x_pending is not None:
            x_pending.wait()  # recompute without dW1 gathered x but never waited on it here
        grad_x = None
        if dx_pending is not None:
            grad_x = _cast(_shaped(dx_pending.wait(), x_shape), x_dtype)
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2, None


# torch.autograd.Function.apply is Python around the C++ apply: it looks for a setup_context,
# asks whether a functorch transform is active and unwraps dead functorch wrappers from the
# arguments, then calls the C++ apply. 14.1 against 8.4 µs per call for a six-argument function on
# a 2-core VM (timeit, torch 2.13, 2026-12-04): a share of a host-bound step's time. The
# function has no setup_context, so under a functorch transform torch's apply raises its own
# error; elsewhere apply_function does what torch's apply does, without the Python between.
# A torch without one of these parts takes torch's apply every time.
_C_APPLY = getattr(super(torch.autograd.Function, ParallelMLPFunction), "apply", None)
_UNWRAP_IF_DEAD = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_FUNCTORCH_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
_DIRECT = _C_APPLY is not None and _UNWRAP_IF_DEAD is not None


def apply_function(x, w1, b1, w2, b2, options: FunctionOptions):
    """``ParallelMLPFunction.apply(x, w1, b1, w2, b2, options)``, calling the C++ apply directly
    where no functorch transform is active (see above); x, w1 and w2 are tensors."""
    if not _DIRECT or _FUNCTORCH_ACTIVE():
        return ParallelMLPFunction.apply(x, w1, b1, w2, b2, options)
    unwrap = _UNWRAP_IF_DEAD
    return _C_APPLY(unwrap(x), unwrap(w1), None if b1 is None else unwrap(b1), unwrap(w2),
                    None if b2 is None else unwrap(b2), options)
