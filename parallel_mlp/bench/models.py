"""What the benchmarks compare: the MLP's configs and FLOPs, the eager PyTorch module a user
would write, ParallelMLP holding the same weights, and one training step with its checks (first
call, agreement with a reference, peak memory)."""

from __future__ import annotations

import contextlib
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..activations import get_activation
from ..layer import ParallelMLP, _apply_function
from ..params import merge_gate_up, split_gate_up
from .harness import Ctx, nbytes, rel_err


def parse_configs(text: str) -> list[tuple[str, int]]:
    """'swiglu:14336,gelu_tanh_approx:16384' -> [('swiglu', 14336), ('gelu_tanh_approx', 16384)]."""
    configs = []
    for item in text.split(","):
        name, _, hidden = item.strip().partition(":")
        get_activation(name)  # an unknown name fails here, with the list of valid ones
        if not hidden.isdigit() or int(hidden) <= 0:
            raise ValueError(f"--configs item {item!r}: expected activation:hidden, e.g. swiglu:14336")
        configs.append((name, int(hidden)))
    return configs


def config_label(act: str, h: int) -> str:
    return f"{act}:{h}"


def fc1_features(act: str, h: int) -> int:
    return 2 * h if get_activation(act).gated else h


def mlp_flops(tokens: int, d: int, act: str, h: int) -> float:
    """fwd+bwd = 3 x forward, forward = fc1 (2*T*d*F) + fc2 (2*T*h*d)."""
    return 3.0 * (2 * tokens * d * fc1_features(act, h) + 2 * tokens * h * d)


def eager_activation(name: str):
    """The activation as a PyTorch user writes it: torch ops on bf16 tensors, gated halves taken
    with chunk() (the layout plain modules use; any layout is the same math up to a permutation
    of W1's rows)."""

    def gated(f):
        def apply(pre):
            g, u = pre.chunk(2, dim=-1)
            return f(g, u)
        return apply

    table = {
        "gelu_tanh_approx": lambda x: F.gelu(x, approximate="tanh"),
        "gelu": F.gelu,
        "relu": F.relu,
        "relu_sq": lambda x: F.relu(x).square(),
        "swiglu": gated(lambda g, u: F.silu(g) * u),
        "swiglu_oai": gated(lambda g, u: g * torch.sigmoid(1.702 * g) * (u + 1)),
        "reglu": gated(lambda g, u: F.relu(g) * u),
        "geglu": gated(lambda g, u: F.gelu(g, approximate="tanh") * u),
        "geglu_erf": gated(lambda g, u: F.gelu(g) * u),
        "glu": gated(lambda g, u: torch.sigmoid(g) * u),
    }
    return table[name]


class EagerMLP(nn.Module):
    """The PyTorch reference a user would write: x @ W1.T -> activation in torch ops -> @ W2.T,
    differentiated by autograd. W1 in the chunked gate/up layout."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, activation: str):
        super().__init__()
        self.w1 = nn.Parameter(w1)
        self.w2 = nn.Parameter(w2)
        self.act = eager_activation(activation)

    def forward(self, x):
        return self.act(x @ self.w1.t()) @ self.w2.t()


class CheckpointedEagerMLP(EagerMLP):
    """EagerMLP under ``torch.utils.checkpoint`` (non-reentrant), the way a PyTorch user trades
    compute for memory: autograd keeps x alone, the promise of ``ParallelMLP(recompute=True)``,
    and the backward replays the whole forward (fc1, the activation and fc2: eight GEMMs a step
    against the fused recompute's seven) before differentiating it. The baseline of ours'
    recompute mode at the same memory."""

    def forward(self, x):
        return checkpoint(super().forward, x, use_reentrant=False)


def _postact_stand_in(preact: torch.Tensor, hidden: int) -> torch.Tensor:
    """A contiguous T x h tensor without an elementwise pass: the first T*h elements of fc1's
    output, which is contiguous (gated, F = 2h; otherwise F = h and this is all of it)."""
    return preact.view(-1)[:preact.shape[0] * hidden].view(preact.shape[0], hidden)


class _SixGemms(torch.autograd.Function):
    """The MLP's six GEMMs on cuBLAS (torch.mm), with every elementwise pass left out. Forward:
    fc1 (T x F x d), fc2 (T x d x h) on a stand-in for postact read from fc1's output in place.
    Backward: the dact's GEMM dy @ W2 (T x h x d), dW2 = dy^T @ postact (d x h x T), and dx and
    dW1 on a T x F operand, for which fc1's output stands in for dpreact. Every operand has the
    MLP's shape, contiguity and magnitude; the values are not its gradients."""

    @staticmethod
    def forward(ctx, x, w1, w2):
        preact = x @ w1.t()
        ctx.save_for_backward(x, w1, w2, preact)
        return _postact_stand_in(preact, w2.shape[1]) @ w2.t()

    @staticmethod
    def backward(ctx, dy):
        x, w1, w2, preact = ctx.saved_tensors
        _dpost = dy @ w2  # the dact's GEMM, whose output the activation's backward would read
        dw2 = dy.t() @ _postact_stand_in(preact, w2.shape[1])
        return preact @ w1, preact.t() @ x, dw2


class GemmCeiling(nn.Module):
    """What a fused MLP whose activation cost nothing would take: a step of cuBLAS's six GEMMs
    as the MLP runs them (bf16 weight gradients, as eager's), nothing else. Not the MLP's
    function, so the benchmarks time it beside the others without checking its outputs
    (``computes_the_mlp``)."""

    computes_the_mlp = False

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor):
        super().__init__()
        self.w1 = nn.Parameter(w1)
        self.w2 = nn.Parameter(w2)

    def forward(self, x):
        return _SixGemms.apply(x, self.w1, self.w2)


def cuda_graphed(model: nn.Module, sample_x: torch.Tensor) -> nn.Module:
    """``model`` with its forward and backward captured in CUDA graphs and replayed on every call
    (torch.cuda.make_graphed_callables, what Megatron's and Transformer Engine's CUDA-graph
    options use): a step then costs the host a few launches, whatever its kernels. Each call
    copies its input into the graph's static one; the capture runs three warmup steps first."""
    return torch.cuda.make_graphed_callables(model, (sample_x,))


def chunked_w1(w1: torch.Tensor, gated: bool) -> torch.Tensor:
    """Our interleaved gated W1 -> the [gate rows; up rows] layout EagerMLP chunks, so that both
    compute the same function and can check each other."""
    return split_gate_up(w1).reshape(w1.shape).contiguous() if gated else w1.clone()


class FusedParallelMLP(ParallelMLP):
    """ParallelMLP that runs the fused function at every size: what ``backend="auto"`` runs
    above the small-step thresholds (the fused kernels, cuBLAS for the plain GEMMs it measured
    faster), timed beside an ``auto`` that takes the small step."""

    def forward(self, x):
        return _apply_function(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                               self.activation, self.tp, self.recompute, self.fuse_grad_accum,
                               self.backend, self.sequence_parallel, False)


def build_parallel_mlp(w1, w2, act: str, h: int, cls=ParallelMLP, **kwargs) -> ParallelMLP:
    """ParallelMLP (or ``cls``) holding the given weights (this rank's shards; TP = the default
    group's size, 1 without torch.distributed). Built on the meta device and materialized where
    the weights are, so no time goes to drawing the default init on the CPU."""
    d = w1.shape[1]
    model = cls(d, h, activation=act, device="meta", dtype=w1.dtype, **kwargs)
    model = model.to_empty(device=w1.device)
    with torch.no_grad():
        model.fc1.weight.copy_(w1)
        model.fc2.weight.copy_(w2)
    return model


def fused_and_eager(shape: tuple[int, int, int, str], input_sets: int = 4,
                    recompute_too: bool = False, device="cuda", dtype=torch.bfloat16):
    """({name: model}, [(x, dy), ...]) for the launch-group probes (tools/launch_key_churn.py,
    tools/fused_step_probe.py): "ours", the fused function at every size (the sweep's
    ``ours_fused``: FusedParallelMLP on backend="auto"), and "eager", with the same weights;
    with ``recompute_too`` also "ours recompute" and "eager copy", as the sweep times them. The
    inputs are ``input_sets`` (x, dy) pairs, x requiring its gradient, to take in turn as the
    sweep rotates its sets; shape is (T, d, h, activation)."""
    tokens, d, h, act = shape
    gated = get_activation(act).gated
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*size, scale=1.0):
        return (torch.randn(*size, device=device, generator=g) * scale).to(dtype)

    w1, w2 = rand((2 if gated else 1) * h, d, scale=d ** -0.5), rand(d, h, scale=h ** -0.5)
    models = {"ours": build_parallel_mlp(w1, w2, act, h, cls=FusedParallelMLP, backend="auto"),
              "eager": EagerMLP(chunked_w1(w1, gated), w2.clone(), act)}
    if recompute_too:
        models["ours recompute"] = build_parallel_mlp(w1, w2, act, h, cls=FusedParallelMLP,
                                                      backend="auto", recompute=True)
        models["eager copy"] = EagerMLP(chunked_w1(w1, gated), w2.clone(), act)
    inputs = [(rand(tokens, d).requires_grad_(True), rand(tokens, d)) for _ in range(input_sets)]
    return models, inputs


def ours_and_quack(shape: tuple[int, int, int, str], device="cuda"):
    """({"ours": ParallelMLP(backend="auto"), "quack": quack's MLP}, x, dy) on the weights and
    first input set of ``fused_and_eager(shape, 1)``: what the tools that set our kernels beside
    quack's run (tools/kernels_vs_quack.py, tools/ncu_vs_quack.py)."""
    from . import quack_baseline

    models, inputs = fused_and_eager(shape, 1, device=device)
    w1, w2 = models["ours"].fc1.weight.detach(), models["ours"].fc2.weight.detach()
    act, h = shape[3], shape[2]
    runs = {"ours": build_parallel_mlp(w1, w2, act, h, cls=ParallelMLP, backend="auto"),
            "quack": quack_baseline.build(w1, w2, act, h)}
    x, dy = inputs[0]
    return runs, x, dy


# Each timed model's parameters, listed at its first step, as an optimizer lists them once.
_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def parameter_list(model: nn.Module) -> list[nn.Parameter]:
    """``list(model.parameters())``, made at the first call for this model (whose parameters the
    benchmarks never replace afterwards)."""
    params = _PARAMETERS.get(model)
    if params is None:
        params = _PARAMETERS[model] = list(model.parameters())
    return params


def train_step(model: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """One fwd+bwd as training runs it: grads cleared as an optimizer's zero_grad(set_to_none=True)
    clears them, over a parameter list made once (``model.zero_grad`` walks the module tree each
    step instead, a Python generator per module: three for ParallelMLP with its fc1 and fc2, one
    for a flat module, a difference a host-bound step would time), and dx, since an MLP inside a
    network must return it. Returns the output."""
    for p in parameter_list(model):
        p.grad = None
    x.grad = None
    y = model(x)
    y.backward(dy)
    return y


def clear_grads(model: nn.Module, xs) -> None:
    model.zero_grad(set_to_none=True)
    for x in xs:
        x.grad = None


def model_bytes(model: nn.Module) -> int:
    return nbytes(*model.parameters(), *model.buffers())


def weight_grads(model: nn.Module, gated: bool):
    """(dW1 in our interleaved layout, dW2) of a single-rank variant's last backward: ParallelMLP
    and quack's MLP (fc1/fc2, W1 interleaved as ours), EagerMLP (W1 in gate/up halves), either
    under torch.compile; None for a model whose weights are not found that way."""
    m = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if isinstance(m, EagerMLP):
        dw1 = m.w1.grad
        if gated and dw1 is not None:
            dw1 = merge_gate_up(dw1.unflatten(0, (2, -1)))
        return dw1, m.w2.grad
    fc1, fc2 = getattr(m, "fc1", None), getattr(m, "fc2", None)
    if fc1 is None or fc2 is None or not hasattr(fc1, "weight") or not hasattr(fc2, "weight"):
        return None
    return fc1.weight.grad, fc2.weight.grad


def first_step(ctx: Ctx, model: nn.Module, xs, dys, reference, gated: bool | None = None):
    """The first call (compiles or loads kernels), timed, and a check of y and dx against the
    reference: the first variant's outputs, which this call provides when there is none yet.
    With ``gated`` given (single-rank variants), the weight gradients too (``weight_grads``).
    Returns (result, reference)."""
    t0 = time.perf_counter()
    y = train_step(model, xs[0], dys[0])
    ctx.sync()
    out = {"first_step_s": time.perf_counter() - t0}
    if not getattr(model, "computes_the_mlp", True):  # a stand-in (GemmCeiling): nothing to check
        clear_grads(model, xs)
        return out, reference
    grads = weight_grads(model, gated) if gated is not None else None
    if reference is None:
        reference = (y.detach().clone(), xs[0].grad.clone(),
                     None if grads is None else tuple(g.detach().clone() for g in grads))
    else:
        out["rel_err_y"] = rel_err(y, reference[0])
        out["rel_err_dx"] = rel_err(xs[0].grad, reference[1])
        if grads is not None and reference[2] is not None:
            out["rel_err_dw1"] = rel_err(grads[0], reference[2][0])
            out["rel_err_dw2"] = rel_err(grads[1], reference[2][1])
    clear_grads(model, xs)
    return out, reference


# Untimed steps before a step peak is measured: the fused path's launch groups see their keys at
# the first, capture at the second (a graph's RNG state, a larger workspace buffer: one-time
# buffers) and replay from the third, as every later step of a training loop does.
STEADY_STEPS = 3


def step_peak_memory(ctx: Ctx, model: nn.Module, xs, dys, held_by_others: int = 0,
                     steps: int = 2) -> dict:
    """Peak memory of a few training steps of this model alone, after its first calls (whose
    one-time buffers stay out). A pass of its own because interleaved variants share the one peak
    counter. ``held_by_others``: bytes of other variants' models that are alive meanwhile (built
    for the interleaved timing), left out so that peak_mem_gb is what this variant needs alone.

    The steps allocate from a private pool of the caching allocator made for this pass
    (:func:`own_allocator_pool`), refilled by STEADY_STEPS untimed steps first, so each variant's
    peak is that of its own steady state, as in a process of its own. The allocator counts a
    block it does not split whole (an 11 MiB weight gradient carved from a 12 MiB free block
    counts 12), so from the shared pool, whose free blocks are what the variants measured before
    left in segments still partly held by their weights, the peak moved with the order of the
    variants: at T=512 d=1024 swiglu (every variant asking for 25.0 MiB) eager read 25.5 MiB and
    a second copy of eager 28.0 in the same run (H200, 2026-12-03, `bench sweep`)."""
    if not ctx.cuda:
        return {}
    clear_grads(model, xs)
    ctx.sync()
    torch.cuda.empty_cache()
    with own_allocator_pool(ctx.device):
        for _ in range(STEADY_STEPS):
            train_step(model, xs[0], dys[0])
            clear_grads(model, xs)
        ctx.sync()
        torch.cuda.reset_peak_memory_stats(ctx.device)
        before = torch.cuda.memory_allocated(ctx.device)
        requested_before = _requested_bytes(ctx.device, "current")
        for i in range(steps):
            train_step(model, xs[i % len(xs)], dys[i % len(dys)])
        ctx.sync()
        peak = torch.cuda.max_memory_allocated(ctx.device)
        requested_peak = _requested_bytes(ctx.device, "peak")
        clear_grads(model, xs)
    torch.cuda.empty_cache()
    out = {"peak_mem_gb": (peak - held_by_others) / 2 ** 30,
           "peak_over_start_gb": (peak - before) / 2 ** 30}
    if requested_peak is not None and requested_before is not None:
        # What the tensors asked for, before the caching allocator rounds each block up (a
        # block it does not split counts whole): tells a layout of allocations from the
        # allocator's granularity when two variants' peaks differ by a MiB or two.
        out["requested_peak_over_start_gb"] = (requested_peak - requested_before) / 2 ** 30
    return out


@contextlib.contextmanager
def own_allocator_pool(device):
    """Route the caching allocator's allocations, forward's and backward's, to a fresh private
    pool for the length of the context; the pool is given back after it. Backward runs on the
    calling thread meanwhile (autograd's device threads off), since a pool takes the
    allocations of the thread that entered it only; the allocations, and their order, are the
    same on either thread. Allocations made inside must be freed before the context ends."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.autograd.set_multithreading_enabled(False), \
            torch.cuda.use_mem_pool(torch.cuda.MemPool(), index):
        yield


def _requested_bytes(device, which: str) -> int | None:
    return torch.cuda.memory_stats(device).get(f"requested_bytes.all.{which}")


def prepare_mlp_variant(ctx: Ctx, model: nn.Module, xs, dys, reference, held_by_others: int = 0,
                        gated: bool | None = None):
    """Everything of a variant but its timing: first call, check (of the weight gradients too
    when ``gated`` is given), peak memory. Returns (result, reference)."""
    out, reference = first_step(ctx, model, xs, dys, reference, gated)
    out |= step_peak_memory(ctx, model, xs, dys, held_by_others)
    return out, reference
