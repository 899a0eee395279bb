"""The torch backend's activation math, fused into one kernel per call by torch.compile.

Evaluated eagerly, the reference formulas of ``activations.py`` make one memory pass per
operation over fp32 temporaries: at swiglu h=14336 and 8192 tokens that is several GB per
step, and it made the torch backend 0.65x PyTorch eager on an H200. Compiled, the same
formulas become one elementwise kernel that reads preact (and dpostact) once and writes its
outputs once, computing in fp32 as before. Megatron fuses its bias-SwiGLU the same way.

Nothing about the math changes: the compiled functions trace ``Activation.forward`` /
``Activation.backward`` themselves, so the formulas still live in one place.

``PARALLEL_MLP_FUSE_ACT`` picks when: ``auto`` (default) on CUDA tensors when torch can compile
for them (triton present), ``1`` on any device (inductor needs a C++ compiler on CPU), ``0``
never. A compile that fails is reported once, as a warning, and that activation then runs
unfused; the values are the same either way, up to the last bit of fp32 rounding.
"""

from __future__ import annotations

import functools
import logging
import os
import types
from typing import Callable, Optional

import torch

from .activations import Activation

log = logging.getLogger(__name__)

ENV = "PARALLEL_MLP_FUSE_ACT"
MODES = ("auto", "1", "0")

# (activation name, "forward" | "backward") -> the compiled function, or None once it failed.
_compiled: dict[tuple[str, str], Optional[Callable]] = {}


def mode() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: must be one of {', '.join(MODES)}")
    return value


def _can_compile_for(t: torch.Tensor) -> bool:
    m = mode()
    if m == "0":
        return False
    if m == "1":
        return True
    return t.is_cuda and _has_triton()


@functools.cache
def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return has_triton()


def _own_code(fn: Callable) -> Callable:
    """A copy of `fn` with a code object of its own. Dynamo keeps compiled graphs per code object,
    with a limit of 8 per object; one shared wrapper for 8 activations x 2 dtypes would hit it and
    drop back to eager."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _make(act: Activation, which: str) -> Callable:
    if which == "forward":
        def run(preact):
            return act.forward(preact)
    else:
        def run(preact, dpostact):
            return act.backward(preact, dpostact)
    return torch.compile(_own_code(run), fullgraph=True)


def _call(act: Activation, which: str, *tensors: torch.Tensor):
    """The compiled `which` of `act` on `tensors`, or None where it does not apply or failed."""
    if not _can_compile_for(tensors[0]):
        return None
    key = (act.name, which)
    if key in _compiled and _compiled[key] is None:
        return None
    first = key not in _compiled
    if first and tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():
        return None  # compiling would launch work inside the capture; the eager path is safe
    fn = _compiled.get(key) or _make(act, which)
    if not first:
        return fn(*tensors)
    try:
        out = fn(*tensors)
    except Exception as e:  # torch.compile raises many kinds (no compiler, backend failure, ...)
        log.warning("torch backend: could not fuse %s's %s with torch.compile (%s: %s); "
                    "evaluating it unfused", act.name, which, type(e).__name__, str(e).splitlines()[0][:200])
        _compiled[key] = None
        return None
    _compiled[key] = fn
    return out


def forward(act: Activation, preact: torch.Tensor) -> Optional[torch.Tensor]:
    """postact = act(preact) in one fused kernel, or None: then evaluate it unfused."""
    return _call(act, "forward", preact)


def backward(act: Activation, preact: torch.Tensor, dpostact: torch.Tensor):
    """(dpreact, postact) in one fused kernel, or None: then evaluate it unfused."""
    return _call(act, "backward", preact, dpostact)
