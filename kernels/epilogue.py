"""Epilogue variants: what happens to a tile of fp32 accumulators before it leaves the SM.

Each variant is a small function of one epilogue subtile of accumulators (plus the tiles it
loads) that fills the register fragments of its outputs. The kernel does the rest the same way
for every variant: fragments of "TMA outputs" go registers -> shared memory (stmatrix) -> global
memory (TMA store, or TMA reduce-add for accumulation); outputs of another width than the
accumulator tile (the gated act's half-width postact, the gated dact's double-width interleaved
dpreact) are written straight from registers at the accumulators' coordinates, because no
stmatrix tiling of the accumulator tile expresses them.

Variants (``EpilogueSpec.kind``):

- ``store``      D = acc (bf16 / fp16 / fp32)
- ``accumulate`` D += acc with fp32 D, by a TMA reduce-add store: D is never read into registers
- ``act``        preact = acc (+ bias), postact = act(preact); preact optional
- ``dact``       acc is dpostact; loads preact, writes dpreact = act'(preact) * dpostact and the
                 recomputed postact

Gated activations read interleaved (gate, up) column pairs; in the WGMMA accumulator fragment the
two columns of a pair sit in adjacent registers of one thread (values 2j, 2j+1), so a pair never
crosses threads and the gated math is purely per thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from parallel_mlp.activations import ACTIVATIONS, Activation

from .device_math import DEVICE_MATH

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

    # ---- host-side description ----------------------------------------------------------------

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
        """Slot D goes through smem + TMA: D, preact (act), or non-gated dpreact (dact)."""
        if self.kind == "act":
            return self.store_preact
        if self.kind == "dact":
            return not self.gated
        return True

    @property
    def has_tma_post(self) -> bool:
        """postact as wide as the accumulator tile goes through smem + TMA as a second output.

        That is every postact except the gated act's, which is half as wide as its GEMM.
        """
        return self.kind == "dact" or (self.kind == "act" and not self.gated)

    @property
    def loads_preact(self) -> bool:
        return self.kind == "dact"

    # ---- device side: one subtile, registers in, registers out --------------------------------
    #
    # rAcc: fp32 fragment of this subtile's accumulators (S values).
    # tCc:  coordinates of the tile's accumulators; value v of this subtile is tCc[base + v].
    # rD / rPost: fp32 fragments of the TMA outputs (same S values, same positions as rAcc).
    # mPost (gated act) / mDpre (gated dact): outputs of another width, written directly.

    @cute.jit
    def visit(
        self,
        rAcc: cute.Tensor,
        rD: cute.Tensor,
        rPost: cute.Tensor,
        tCc: cute.Tensor,
        base: cutlass.Constexpr,
        m_lim: cutlass.Int32,
        n_lim: cutlass.Int32,
        mBias: Optional[cute.Tensor],
        mPreIn: Optional[cute.Tensor],
        mPost: Optional[cute.Tensor],
        mDpre: Optional[cute.Tensor],
    ):
        S = cute.size(rAcc)
        m = DEVICE_MATH
        if cutlass.const_expr(self.kind == "store" or self.kind == "accumulate"):
            for v in cutlass.range_constexpr(S):
                rD[v] = rAcc[v]
        if cutlass.const_expr(self.kind == "act"):
            if cutlass.const_expr(self.has_bias):
                for v in cutlass.range_constexpr(S):
                    c = tCc[base + v]
                    b = Float32(0.0)
                    if c[1] < n_lim:
                        b = Float32(mBias[c[1]])
                    rAcc[v] = rAcc[v] + b
            if cutlass.const_expr(self.has_tma_d):
                for v in cutlass.range_constexpr(S):
                    rD[v] = rAcc[v]
            if cutlass.const_expr(not self.gated):
                for v in cutlass.range_constexpr(S):
                    rPost[v] = self.act.fn(rAcc[v], m)
            else:
                for j in cutlass.range_constexpr(S // 2):
                    y = self.act.fn(rAcc[2 * j], rAcc[2 * j + 1], m)
                    self._store_half(mPost, tCc[base + 2 * j], y, m_lim, n_lim)
        if cutlass.const_expr(self.kind == "dact"):
            if cutlass.const_expr(not self.gated):
                # preact at the accumulators' own coordinates, read from global memory.
                for v in cutlass.range_constexpr(S):
                    c = tCc[base + v]
                    x = Float32(0.0)
                    if c[0] < m_lim and c[1] < n_lim:
                        x = Float32(mPreIn[c[0], c[1]])
                    rD[v] = self.act.grad(x, m) * rAcc[v]
                    rPost[v] = self.act.fn(x, m)
            else:
                # Gated: the GEMM is h wide (dpostact), preact and dpreact 2h wide. Accumulator
                # column n pairs with preact columns (2n, 2n+1); postact column n is the
                # accumulator's own position, so it leaves through TMA like any full-width output.
                for v in cutlass.range_constexpr(S):
                    c = tCc[base + v]
                    g = Float32(0.0)
                    u = Float32(0.0)
                    if c[0] < m_lim and c[1] < n_lim:
                        g = Float32(mPreIn[c[0], 2 * c[1]])
                        u = Float32(mPreIn[c[0], 2 * c[1] + 1])
                    dy = rAcc[v]
                    dg, du = self.act.grad(g, u, m)
                    rPost[v] = self.act.fn(g, u, m)
                    if c[0] < m_lim and c[1] < n_lim:
                        mDpre[c[0], 2 * c[1]] = (dg * dy).to(mDpre.element_type)
                        mDpre[c[0], 2 * c[1] + 1] = (du * dy).to(mDpre.element_type)

    @cute.jit
    def _store_half(self, mPost: cute.Tensor, c, y, m_lim: cutlass.Int32, n_lim: cutlass.Int32):
        """postact[m, n // 2] = y for the pair whose gate column is n (bounds-checked)."""
        if c[0] < m_lim and c[1] < n_lim:
            mPost[c[0], c[1] // 2] = y.to(mPost.element_type)
