"""quack (``quack-kernels``, CuTe DSL kernels by Tri Dao et al.) as a baseline: its MLP,
``quack.mlp.MLP``, holding the same weights as ours.

Read from quack 0.6.5: ``MLP(in_features, hidden_features=None, out_features=None, bias1=False,
bias2=False, activation="gelu_tanh_approx", multiple_of=1, device=None, dtype=None,
fuse_grad_accum=False, tuned=True, recompute=False, concat_layout=False)``. Its fc1 is an
``nn.Linear(d, 2h)`` for gated activations (``h`` otherwise) and its fc2 an ``nn.Linear(h, d)``:
[out, in] weights like ours. A gated fc1's rows are interleaved unless ``concat_layout=True``:
row 2i is gate unit i and row 2i+1 up unit i (its Muon split is ``"(d two) e -> two d e"``), our
layout, so it takes our global W1 as it is. swiglu and gelu_tanh_approx mean the same there.

Its forward runs its fused kernels only for a CUDA input with a contiguous last dim, in_features
% 8 == 0, fc1's out_features % 16 (gated) or % 8, fc2's out_features % 8, and no bias while
training; otherwise it runs nn.Linear and torch's activation, and timing that would time PyTorch
under quack's name, so ``build`` refuses such a shape instead.

``tuned``: quack's default, True, autotunes each GEMM at each new shape over about 40 tile
configs, compiling every candidate: minutes on a fresh host, more than the sweep's budget for its
30 shapes. The sweep runs it with ``tuned=False``, its heuristic config, the footing ours runs on
(the layer never tunes), unless asked for ``--quack-tuned``; the JSON records which.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import torch

from ..activations import get_activation

VERSION_READ = "0.6.5"
INSTALL_HINT = f"pip install quack-kernels=={VERSION_READ}"
# quack's names for the activations it fuses, where ours are the same function by the same name.
ACTIVATIONS = ("gelu_tanh_approx", "relu", "relu_sq", "swiglu", "reglu", "geglu", "glu")

_loaded: tuple | None = None  # (quack.mlp or None, why not)


def patch_semantic_value_key(identity) -> bool:
    """Let quack key compiled epilogues on values its fingerprint does not know. Returns whether
    the patch was applied now (False when it already was).

    quack caches each compiled epilogue under a fingerprint of its source and of the values it
    reads (``quack.gemm_runtime.identity.function_semantic_key``, which calls
    ``semantic_value_key`` on each global and closure variable). ``semantic_value_key`` knows
    primitives, containers, enums, modules, classes, functions, dataclasses and torch dtypes, and
    raises TypeError on anything else: fail-closed, since a key too coarse would reuse a wrong
    kernel. On the GPU host quack met a value there that it could not key, and raised. The
    wrapper keys such a value by its type and repr instead. A repr
    shows a constant's value, and an object without a repr of its own shows its address, which
    only makes the key finer (a recompile at worst); what the patch gives up is quack's guarantee
    for two different values of one type with equal reprs, which the sweep's two built-in
    activations do not produce. Nested values go through the wrapper too: the original recurses
    through the module's global name, which now names the wrapper.
    """
    original = identity.semantic_value_key
    if getattr(original, "parallel_mlp_patch", False):
        return False

    def semantic_value_key(value, seen):
        try:
            return original(value, seen)
        except TypeError:
            kind = type(value)
            return ("unkeyed", kind.__module__, kind.__qualname__, repr(value))

    semantic_value_key.parallel_mlp_patch = True
    identity.semantic_value_key = semantic_value_key
    return True


def installed() -> bool:
    return importlib.util.find_spec("quack") is not None


def version() -> str | None:
    try:
        from importlib.metadata import version as dist_version
        return dist_version("quack-kernels")
    except Exception:  # noqa: BLE001 - not installed
        return None


def load():
    """(the ``quack.mlp`` module, None), or (None, why quack cannot run here). Imports once."""
    global _loaded
    if _loaded is None:
        _loaded = _import()
    return _loaded


def _import():
    if not installed():
        return None, f"quack-kernels is not installed ({INSTALL_HINT})"
    if not torch.cuda.is_available():
        return None, "quack runs on CUDA only (its MLP would time plain PyTorch here)"
    try:
        # The patch goes in before quack.mlp and its epilogue library are imported, since the
        # library fingerprints its epilogues as it builds them.
        from quack.gemm_runtime import identity

        patch_semantic_value_key(identity)
        import quack.mlp
    except Exception as e:  # noqa: BLE001 - any failure to import is a reason, not a crash
        return None, f"quack failed to import: {type(e).__name__}: {e}"[:300]
    return quack.mlp, None


def off_fused_path(w1: torch.Tensor, w2: torch.Tensor, act: str) -> str | None:
    """Why quack's MLP would not run its kernels on these weights (None: it would)."""
    if act not in ACTIVATIONS:
        return f"activation {act!r}: quack's MLP has no fused {act}"
    f, d = w1.shape
    d_out = w2.shape[0]
    f_multiple = 16 if get_activation(act).gated else 8
    if not w1.is_cuda or d % 8 or f % f_multiple or d_out % 8:
        return (f"d={d}, F={f}, d_out={d_out} on {w1.device}: quack's MLP runs its kernels only on "
                f"CUDA with d and d_out multiples of 8 and F of {f_multiple}; it would run "
                "nn.Linear and torch's activation")
    return None


def build(w1: torch.Tensor, w2: torch.Tensor, act: str, h: int, tuned: bool = False):
    """quack's MLP holding our global W1 [F, d] (interleaved when gated) and W2 [d_out, h]."""
    mlp, reason = load()
    if mlp is None:
        raise RuntimeError(reason)
    reason = off_fused_path(w1, w2, act)
    if reason:
        raise ValueError(reason)
    d, d_out = w1.shape[1], w2.shape[0]
    model = mlp.MLP(d, h, d_out, activation=act, device=w1.device, dtype=w1.dtype, tuned=tuned)
    with torch.no_grad():
        model.fc1.weight.copy_(w1)
        model.fc2.weight.copy_(w2)
    return model


def warm(activations) -> None:
    """One small fwd+bwd per activation, untuned, so quack compiles its kernels (its disk cache,
    ``quack.cache``, keeps them for the next process). Its kernels are keyed by dtypes, layouts
    and tile config, not by size, so a small shape compiles what the sweep's shapes use."""
    for act in activations:
        f = 2 * 256 if get_activation(act).gated else 256
        w1 = torch.randn(f, 256, device="cuda", dtype=torch.bfloat16) * 0.06
        w2 = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16) * 0.06
        model = build(w1, w2, act, 256)
        x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        model(x).backward(torch.randn(512, 256, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()


def start_warm(activations) -> tuple[subprocess.Popen, IO[bytes]]:
    """``warm`` in a child process, to run beside our own kernels' compile pool. Returns the
    process and the file its output goes to (a file, not a pipe: nobody reads a pipe while the
    pool compiles, and a full one would stall the child)."""
    code = "import sys; from parallel_mlp.bench.quack_baseline import warm; warm(sys.argv[1:])"
    output = tempfile.TemporaryFile()
    child = subprocess.Popen([sys.executable, "-c", code, *activations], stdout=output,
                             stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
    return child, output
