"""Steps too small for the fused path to pay: plain PyTorch autograd ops instead.

Below a few hundred GFLOP per fwd+bwd, the GPU finishes an MLP step's GEMMs sooner than the host
can issue them, and the step takes the host's time. The fused path's host time is Python: the
autograd function, its checks and six launches, and a backward that runs Python on autograd's
CUDA device thread (handing the GIL over and back). A plain ``F.linear -> activation -> F.linear``
costs the host less, because its backward is autograd's C++ nodes. Measured on one H200 (its VM
host), T=512 d=1024 swiglu h=2816, host µs per fwd+bwd: fused 793, eager 384
(`python -m parallel_mlp.bench host --step`, 2026-12-02). So ``backend="auto"`` runs a step
below a FLOP threshold as plain autograd ops; the thresholds come from held steps of the shape
sweep (`python -m parallel_mlp.bench sweep`, H200, 2026-12-01 and 2026-12-02), the fused time
against eager's:

- gated: 0.63-0.91x at 27-213 GFLOP per step, 1.05-1.08x at 812-831 and above: ``MAX_FLOP_GATED``.
  At 425 GFLOP (T=8192 d=1024 h=2816) the fused kernels read 0.89x eager in the sweep of
  0e2d173 on a slow host (1.116 against 0.989 ms), yet faster than the small step beside them
  (1.321 ms); in the sweep of 1acf886, with the fewer-waves rule (kernels/config.py) and a
  faster host, 1.29x (0.773 against 0.998 ms, the small step 0.917). Faster than the small step
  in both, so from 425 GFLOP the fused kernels run;
- gated, where the small step would run a lean function (an activation with gate ops, from one
  row per input feature; below): that function's backward is Python on autograd's device
  thread, as the fused path's is, so the small step keeps no edge in host time, and once the
  fused path's launches made no transposed views and sent fresh outputs straight to the launch
  (kernels/ops.py), the fused kernels ran faster at the one such shape swept, T=2048 d=2048 h=2816
  (213 GFLOP): 0.356 against 0.431 ms on a fast host, 0.856 against 0.882 on a slow one, at a
  lower step peak (77.1 against 82.0 MiB; eager 92.8) (`bench sweep`, H200, 2026-12-03, code
  366dd57; before those launch changes the fused kernels ran 3% slower there, 0.971 against
  0.939 ms). So from ``MAX_FLOP_GATED_LEAN`` such steps run fused. Below one row per feature the
  small step is autograd's C++ nodes and stays ahead: at T=512 d=1024 (27 GFLOP) 0.241 against
  0.264 ms, at T=512 d=8192 (208 GFLOP) 0.853 against 0.943 on the slow host (0.385 against
  0.356 on the fast one);
- not gated: 0.43-0.57x at 6-206 GFLOP, 0.75-0.96x at 629, 0.96-1.00x at 824-825, 0.99-1.02x from
  3.3 TFLOP. With gelu_tanh_approx's math respelled (fewer instructions per
  element in the fused epilogues), the fused kernels read 0.86x eager at 629 GFLOP and
  0.99-1.01x at the three steps of 825, and 0.986-1.012x the small step's time there (the
  sweep of 7eb0e4b, 2026-12-03): a tie. In the three sweeps since the fused function runs
  through the C++ apply and returns its output as made (79dbb22, f751e90, 7c49a9e, 2026-12-04),
  at T=8192 d=4096 h=2048 (825 GFLOP) the fused kernels ran ahead of the small step every time,
  1.297 / 1.304, 1.270 / 1.274 and 1.292 / 1.308 ms (1.011x, 1.008x and 1.009x eager, the
  small step 1.005x, 1.005x and 0.997x), while at T=1000 d=5120 h=10240 (629 GFLOP) they tied
  or trailed it (1.048 / 1.045, 1.016 / 1.017, 1.057 / 1.031 ms; fused / small step, as
  before): ``MAX_FLOP`` lies between. Eager's own non-gated step (one GEMM, one fused
  activation kernel each way) leaves the fused kernels less to win than
  its gated one (a split, a cat, three elementwise kernels). Narrow steps (``in_features`` up
  to ``NARROW_MAX_IN_FEATURES``) gain more from the fused activations, whose eager passes move
  bytes in proportion to T x h against GEMM work in proportion to T x h x d: at T=8192 d=2048
  h=4096 (825 GFLOP) the fused kernels read 0.986x and 0.983x the small step's time in two
  sweeps, and at T=65536 d=1024 h=1024 (825 GFLOP), once its two weight gradients (1024 x
  1024 over K = 65536: 64 tiles, 0.86x cuBLAS on ours) ran on cuBLAS (backends.cublas_runs),
  0.975x and 0.947x (1.451 against 1.532 ms, eager 1.538; `bench sweep`, H200, 2026-12-03, slow
  hosts); at T=4096 d=1024 h=4096 (206 GFLOP) the small step stayed ahead (0.608 against 0.900
  ms on a slow host, 0.365 against 0.369 on a fast one). So such steps run fused from
  ``MAX_FLOP_NARROW``.

With launch graphs (launch_graphs.py: the fused path's launch groups replayed from CUDA graphs,
its host time a few graph launches), gated steps run fused at every size: at the sweep's two
gated small steps the fused kernels ran faster than the small step, T=512 d=1024 h=2816 0.682
against 0.737 ms and T=512 d=8192 h=2752 0.606 against 0.669 (eager 0.681 and 0.576), while the
non-gated small steps stayed faster as plain ops (T=512 d=1024 h=512 0.301 against 0.450 ms,
T=4096 d=1024 h=4096 0.369 against 0.473, and ties at 825 GFLOP and above) (`bench sweep
--launch-graphs`, H200, 2026-12-03, a slow host: a tiny eager step's host time 636 µs). In 80
paired turns of 0.05 s (`tools/host_bound_paths.py`, H200, 2026-12-04) the small step, forced,
took 1.05x, 1.05x and 1.25x the fused step's time at T=512 d=1024, T=512 d=8192 and T=2048
d=2048 swiglu, and 1.14x, 1.16x and 1.43x once the fused function returned its output as made
(autograd.py).

Only where nothing else is asked of the fused path: one rank (no collective to run or hide),
default memory mode (``recompute=True`` promises to keep x alone), no fused gradient
accumulation (``fuse_grad_accum=True`` promises the weight gradient lands in ``main_grad`` in
place), CUDA tensors (the rule was measured there), and not under torch.compile (which runs the
fused function untraced, as it does at every size). What changes at those steps: autograd keeps
postact for fc2's weight gradient, as eager does (the fused path recomputes it), the activation
rounds in the tensors' dtype as eager's does, and a second backward through the step works.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .activations import TORCH_MATH, Activation, interleaved_pairs

# fwd+bwd FLOP of a step below which ``auto`` takes the plain ops (see above): gated, between the
# largest step measured slower fused (213 GFLOP) and the smallest measured faster (425); not
# gated, between the largest measured slower or even (629) and the smallest measured faster (825).
MAX_FLOP_GATED = 0.3e12
MAX_FLOP = 0.7e12
# Not gated and at most this wide (in_features): fused from MAX_FLOP_NARROW, about the
# geometric middle of the narrow steps measured slower fused (206 GFLOP) and faster (825).
NARROW_MAX_IN_FEATURES = 2048
MAX_FLOP_NARROW = 0.4e12
# Gated steps whose small step would be a lean function (keeps_gate_and_up_alone, an activation
# with gate ops): from the one such step measured, where the fused kernels were faster (213
# GFLOP); below it none was measured, so the small step stays there.
MAX_FLOP_GATED_LEAN = 0.2e12
# Rows per input feature from which a gated small step runs fc1 as two GEMMs (small_step): two
# GEMMs were faster at 8 and slower at 1 (the shapes measured); 3 is about their geometric
# middle.
GATE_GEMMS_MIN_ROWS_PER_FEATURE = 3
# Rows per input feature from which a gated small step keeps gate and up alone (LeanGatedProduct
# or LeanGatedPairs, see small_step): there its step peak fell 12-15% (1 and 8 rows per
# feature); at 1/2 and 1/16, where the weights' gradients set the peak, 0-4% either way, for an
# autograd function's host time at steps the host already decides.
LEAN_MIN_ROWS_PER_FEATURE = 1


def step_flop(rows: int, in_features: int, fc1_rows: int, hidden: int, out_features: int) -> int:
    """FLOP of one fwd+bwd: fc1 and fc2 forward, each GEMM twice more in backward."""
    return 6 * rows * (in_features * fc1_rows + hidden * out_features)


def applies(rows: int, in_features: int, fc1_rows: int, hidden: int, out_features: int, *,
            device_type: str, backend: str, tp_size: int, recompute: bool,
            fuse_grad_accum: bool, compiling: bool, gate_ops: bool,
            launch_graphs: bool) -> bool:
    """Whether a step with these sizes and options runs as plain autograd ops (gated: fc1_rows
    is twice hidden; ``gate_ops``: the activation is ``a(g) * u`` with gate ops, so that its
    small step would be a lean function from one row per input feature; ``launch_graphs``: the
    fused path would replay its launch groups from CUDA graphs, launch_graphs.py)."""
    if not (backend == "auto" and device_type == "cuda" and tp_size == 1 and not recompute
            and not fuse_grad_accum and not compiling):
        return False
    if fc1_rows == hidden:
        limit = MAX_FLOP_NARROW if in_features <= NARROW_MAX_IN_FEATURES else MAX_FLOP
    elif launch_graphs:
        return False  # gated steps run fused at every size under launch graphs (see above)
    elif keeps_gate_and_up_alone(rows, in_features, gate_ops):
        limit = MAX_FLOP_GATED_LEAN
    else:
        limit = MAX_FLOP_GATED
    return step_flop(rows, in_features, fc1_rows, hidden, out_features) < limit


def row_limit(in_features: int, fc1_rows: int, hidden: int, out_features: int,
              **options) -> int:
    """The fewest rows at which :func:`applies`, given these sizes and options (its keywords),
    turns the small step down: a step of fewer rows takes it. ``applies`` holds below a FLOP
    limit that can only fall as rows grow (the lean limit, from one row per input feature, is
    the lower), so its answer is yes up to some row count and no from there, found here by
    bisection. A rule that never says no (a test's) gives 2**48."""
    def says_yes(rows):
        return applies(rows, in_features, fc1_rows, hidden, out_features, **options)

    if not says_yes(0):
        return 0
    yes, no = 0, 1
    while says_yes(no):
        if no >= 2 ** 48:
            return no
        yes, no = no, 2 * no
    while no - yes > 1:
        mid = (yes + no) // 2
        yes, no = (mid, no) if says_yes(mid) else (yes, mid)
    return no


def splits_the_weight(rows: int, in_features: int) -> bool:
    """Whether a gated small step runs fc1 as two GEMMs on W1's gate and up rows (see
    small_step): once the activation is GATE_GEMMS_MIN_ROWS_PER_FEATURE times fc1's input width."""
    return rows >= GATE_GEMMS_MIN_ROWS_PER_FEATURE * in_features


def keeps_gate_and_up_alone(rows: int, in_features: int, gate_ops: bool) -> bool:
    """Whether a gated small step runs a lean function (LeanGatedProduct or LeanGatedPairs): for
    an activation with gate ops (``a(g) * u``), once its activation is LEAN_MIN_ROWS_PER_FEATURE
    times fc1's input width."""
    return gate_ops and rows >= LEAN_MIN_ROWS_PER_FEATURE * in_features


def small_step(x: torch.Tensor, w1: torch.Tensor, b1, w2: torch.Tensor, b2,
               act: Activation) -> torch.Tensor:
    """act(x @ w1.T + b1) @ w2.T + b2 on one rank, differentiated by autograd.

    Gated, fc1's rows hold interleaved (gate, up) pairs. With few rows per input feature, fc1 is
    one GEMM and the activation reads its output's pairs in place (two strided views of one
    ``[..., h, 2]`` view); autograd's backward through those views stacks the two gradients
    back into pairs, one copy kernel storing 2-byte elements at a 4-byte stride (which
    LeanGatedPairs, below, avoids): 0.211 ms at T=8192 d=1024 h=2816, where eager's cat of
    contiguous halves takes 0.045 (torch.profiler, H200, 2026-12-02, `bench
    profile`). With many rows, fc1 runs instead as two GEMMs on the gate rows and the up rows
    in place (views of W1 with a leading dimension of 2 x in_features, no copy), whose outputs
    are contiguous, and the backward's W1 gradient is one stack of the halves' gradients. Held
    steps against eager's (`tools/small_step_variants.py`, held 0.5 s x 2 and CUDA-graphed, H200,
    2026-12-02; eager against a second copy of itself in the same run: 0.98-1.04x):

    | rows per input feature                       | T=8192 d=1024 (8) | T=2048 d=2048 (1) | T=512 d=8192 (1/16) |
    | -------------------------------------------- | ----------------- | ----------------- | ------------------- |
    | pairs read in place                          | 0.85-0.88x        | 0.97-0.98x        | 0.99x               |
    | two GEMMs, weight halves by unbind           | 1.11x             | 0.90x             | 0.56x               |
    | two GEMMs, weight halves by slices           | 1.06-1.09x        | 0.86x             | 0.50-0.52x          |
    | one GEMM on a copy of W1 in [gate; up] order | 0.93-0.97x        | 0.87x             | 0.66x               |

    From one row per input feature, the activation, where it has gate ops (``a(g) * u``), is a
    lean autograd function: autograd keeps g and u, not a(g) too (a quarter less of what the MLP
    keeps per layer from forward to backward), and the backward recomputes a(g) into its
    gradient's own buffer (:func:`lean_gradients_into`): :class:`LeanGatedProduct` on the two
    GEMMs' outputs, :class:`LeanGatedPairs` on the one GEMM's interleaved output, whose
    gradient it writes straight into pairs (no stack). Against autograd's nodes for the same
    split (`tools/small_step_variants.py`, held 0.5 s x 2 and CUDA-graphed, H200, 2026-12-02,
    five runs; eager against its copy 0.975-0.994x held, 0.994-1.009x graphed at these shapes):

    | eager / spelling: held, graphed; step peak MiB | T=8192 d=1024 (two GEMMs) | T=2048 d=2048 (pairs) |
    | ---------------------------------------------- | ------------------------- | --------------------- |
    | autograd's nodes                               | 1.077-1.100x, 1.101-1.123x; 302.0 | 0.967-0.985x, 0.981-0.986x; 94.0 |
    | LeanGatedProduct                               | 1.048-1.076x, 1.067-1.091x; 257.5-258.0 | on unbind's views: 0.942-0.952x, 0.954-0.968x; 83.0 |
    | LeanGatedPairs                                 | (1.096 ms: 0.901x, 0.914x; 257.5) | 0.941-0.960x, 0.878-0.997x; 82.0-83.0 |
    | eager                                          | 1.000x; 301.5             | 1.000x; 93.0          |

    quack's MLP peaked at 257.5 and 83.0 MiB there (the shape sweep). The recompute of a(g) is
    one more elementwise pass (about 3% of the T=8192 step, CUDA-graphed); at T=2048 writing
    into pairs saves the stack, which gained that back in one run (graphed 0.997x against the
    nodes' 0.986x) and not in the next two (0.944-0.961x against 0.981-0.985x).
    Each lean function is Python on autograd's device thread, which costs the host time: on a
    2-core CPU VM at swiglu T=8 d=16 on the pairs, autograd's nodes 65-70 µs per step,
    LeanGatedPairs 76-81, LeanGatedProduct on unbind's views 80-86, eager 59-62 (minimums of 31
    interleaved rounds of 500 steps, three runs, 2026-12-02), most of it the backward's nine
    Python-level ops: the same function with a one-op backward read 57 µs against the nodes' 64
    (one probe run beside them, 2026-12-02). In the shape sweep's process, whose host is slower,
    the T=2048 step read 0.79x eager (2026-12-02, eager against its copy 0.96x). The lean
    function brings the step to quack's memory where the activation sets the peak; below one
    row per feature the weights' gradients set it (T=512 d=8192: 159.4-159.6 MiB for every
    spelling and eager; T=512 d=1024: 25.0-26.0 for every spelling and eager, the caching
    allocator's rounding) and the step is the host's, so autograd's nodes stay there.
    """
    if not act.gated:
        return F.linear(act.autograd_forward(F.linear(x, w1, b1)), w2, b2)
    rows, in_features = x.numel() // x.shape[-1], w1.shape[1]
    lean = keeps_gate_and_up_alone(rows, in_features, act.gate is not None)
    if splits_the_weight(rows, in_features):
        gate, up = gate_and_up_by_two_gemms(x, w1, b1)
        post = LeanGatedProduct.apply(gate, up, act) if lean else act.autograd_gated(gate, up)
    else:
        preact = F.linear(x, w1, b1)
        post = (LeanGatedPairs.apply(preact, act) if lean
                else act.autograd_gated(*interleaved_pairs(preact)))
    return F.linear(post, w2, b2)


def bias_free_step(act: Activation):
    """:func:`small_step` without biases, as one callable ``(x, w1, w2) -> y`` made once per
    activation (ParallelMLP keeps it beside its row limit): a non-gated step calls its three ops
    straight, without the frames of small_step and Activation.autograd_forward around them, which
    a host-bound step pays for on every call."""
    if act.gated:
        return lambda x, w1, w2: small_step(x, w1, None, w2, None, act)
    post = act.eager if act.eager is not None else act.autograd_forward
    return lambda x, w1, w2: F.linear(post(F.linear(x, w1)), w2)


def lean_gradients_into(dg: torch.Tensor, du: torch.Tensor, g: torch.Tensor, u: torch.Tensor,
                        dpost: torch.Tensor, gate) -> None:
    """The gradients of a(g) * u into the buffers dg and du (either may be a strided view):
    du = a(g) * dpost with a(g) recomputed into du itself, dg = dpost * u then times a'(g) in
    place. The ops autograd's nodes for ``a(g) * u`` run, in the same dtype, so the values are
    theirs to the bit, without a T x h temporary."""
    gate.forward_into(du, g)
    du.mul_(dpost)
    torch.mul(dpost, u, out=dg)
    gate.backward_into(dg, g)


class LeanGatedProduct(torch.autograd.Function):
    """a(g) * u for a gated activation with gate ops, g and u separate tensors (fc1 as two
    GEMMs), keeping g and u alone for backward.

    Autograd's nodes for ``F.silu(g) * u`` keep g, u and silu(g), and their backward holds
    dpost, its two products and dg at once. Here the backward is :func:`lean_gradients_into`
    into two new buffers, so it holds one T x h tensor less. Under ``create_graph=True`` the
    backward is the activation's derivative formula in differentiable ops instead, so a double
    backward works as it does through eager's nodes.
    """

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor, act: Activation) -> torch.Tensor:
        ctx.save_for_backward(g, u)
        ctx.act = act
        return act.gate.forward(g).mul_(u)

    @staticmethod
    def backward(ctx, dpost: torch.Tensor):
        g, u = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: gradients that are themselves differentiable
            dfdg, dfdu = ctx.act.grad(g, u, TORCH_MATH)
            return dpost * dfdg, dpost * dfdu, None
        dg, du = torch.empty_like(dpost), torch.empty_like(dpost)
        lean_gradients_into(dg, du, g, u, dpost, ctx.act.gate)
        return dg, du, None


class LeanGatedPairs(torch.autograd.Function):
    """a(g) * u of fc1's interleaved output ``[..., 2h]`` (gate at even columns, up at odd), for a
    gated activation with gate ops, keeping that output alone for backward.

    Autograd's nodes for the same (a ``[..., h, 2]`` view, unbind, ``F.silu(g) * u``) keep
    silu(g) beside it, and their backward holds dpost, both products, dg and du, then stacks dg
    and du into the interleaved gradient with one more copy kernel (2-byte elements stored at a
    4-byte stride, over 2 x T x h). Here the backward writes du and dg straight into the two
    interleaved halves of one ``[..., 2h]`` buffer (:func:`lean_gradients_into` on strided
    views): no stack, no unbind or view nodes, and at most dpost and that buffer at once.
    Under ``create_graph=True`` the derivative formula in differentiable ops instead.
    """

    @staticmethod
    def forward(ctx, preact: torch.Tensor, act: Activation) -> torch.Tensor:
        ctx.save_for_backward(preact)
        ctx.act = act
        g, u = interleaved_pairs(preact)
        return act.gate.forward(g).mul_(u)

    @staticmethod
    def backward(ctx, dpost: torch.Tensor):
        (preact,) = ctx.saved_tensors
        g, u = interleaved_pairs(preact)
        if torch.is_grad_enabled():  # create_graph: gradients that are themselves differentiable
            dfdg, dfdu = ctx.act.grad(g, u, TORCH_MATH)
            return torch.stack((dpost * dfdg, dpost * dfdu), dim=-1).flatten(-2), None
        dpreact = torch.empty_like(preact, memory_format=torch.contiguous_format)
        lean_gradients_into(*interleaved_pairs(dpreact), g, u, dpost, ctx.act.gate)
        return dpreact, None


def gate_and_up_in_place(x: torch.Tensor, w1: torch.Tensor, b1=None):
    """(gate, up) of gated fc1 as one GEMM whose interleaved pairs are read in place."""
    return interleaved_pairs(F.linear(x, w1, b1))


def gate_and_up_by_two_gemms(x: torch.Tensor, w1: torch.Tensor, b1=None):
    """(gate, up) of gated fc1 as two GEMMs on W1's gate rows and up rows in place (views from
    one unbind, a leading dimension of 2 x in_features), each output contiguous. Through unbind,
    autograd assembles W1's gradient with one stack of the halves' gradients; through two
    slices, each half's gradient lands in a zeroed W1-sized tensor and the two are summed."""
    gate, up = w1.unflatten(0, (-1, 2)).unbind(1)
    b_gate, b_up = (None, None) if b1 is None else interleaved_pairs(b1)
    return F.linear(x, gate, b_gate), F.linear(x, up, b_up)
