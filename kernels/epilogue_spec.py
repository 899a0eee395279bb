"""What an epilogue variant is, on the host: the fields a kernel is specialized on, their rules,
the variant's cache-key name, and which output channels it has. Importing this module does not
import the DSL, so launching a cached kernel (ops.py, compile.py) never pays for it; the device
side of each variant is in epilogue.py.

Variants (``EpilogueSpec.kind``):

- ``store``      D = acc (bf16 / fp16 / fp32)
- ``accumulate`` D += acc with fp32 D, by a TMA reduce-add store: D is never read into registers
- ``act``        preact = acc (+ bias), postact = act(preact); preact optional
- ``dact``       acc is dpostact; loads preact, writes dpreact = act'(preact) * dpostact and the
                 recomputed postact
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from parallel_mlp.activations import ACTIVATIONS, Activation

KINDS = ("store", "accumulate", "act", "dact")


@dataclass(frozen=True)
class EpilogueSpec:
    kind: str = "store"
    activation: Optional[str] = None
    has_bias: bool = False
    store_preact: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"epilogue kind={self.kind!r}: one of {KINDS}")
        if self.kind in ("act", "dact") and self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}: one of {sorted(ACTIVATIONS)}")
        if self.has_bias and self.kind != "act":
            raise ValueError("a bias is only fused into the act epilogue")

    @property
    def act(self) -> Optional[Activation]:
        return ACTIVATIONS[self.activation] if self.activation else None

    @property
    def gated(self) -> bool:
        return self.act is not None and self.act.gated

    @property
    def key(self) -> str:
        parts = [self.kind]
        if self.activation:
            parts.append(self.activation)
        if self.has_bias:
            parts.append("bias")
        if self.kind == "act" and not self.store_preact:
            parts.append("nopre")
        return "-".join(parts)

    @property
    def has_tma_d(self) -> bool:
        """Channel D (acc-shaped): D, preact (act, if stored), or non-gated dpreact (dact)."""
        if self.kind == "act":
            return self.store_preact
        if self.kind == "dact":
            return not self.gated
        return True

    @property
    def has_tma_post(self) -> bool:
        """Channel P (acc-shaped): postact of a non-gated act, and of every dact (the gated dact's
        GEMM is h wide, like its postact)."""
        return self.kind == "dact" or (self.kind == "act" and not self.gated)

    @property
    def has_half_post(self) -> bool:
        """Channel H: the gated act's postact, half as wide as its GEMM."""
        return self.kind == "act" and self.gated

    @property
    def has_dpre_x2(self) -> bool:
        """Channel X: the gated dact's interleaved dpreact, twice as wide as its GEMM."""
        return self.kind == "dact" and self.gated

    @property
    def loads_preact(self) -> bool:
        return self.kind == "dact"
