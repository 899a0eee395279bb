"""Epilogue variants: what happens to a tile of fp32 accumulators before it leaves the SM.

Each variant is a small function of one epilogue subtile of accumulators (plus the tiles it
loads) that fills the register fragments of its outputs. The kernel does the rest the same way
for every variant: fragments of "TMA outputs" go registers -> shared memory (stmatrix) -> global
memory (TMA store, or TMA reduce-add for accumulation); outputs of another width than the
accumulator tile (the gated act's half-width postact, the gated dact's double-width interleaved
dpreact) are written element by element into their smem subtile at the accumulators' tile
coordinates (no stmatrix tiling of the accumulator tile expresses them) and then leave by TMA
like the others. The dact's preact arrives by TMA load into a small smem ring, loaded ahead of
the subtile being computed (config.dact_prefetch; by default a pingpong warpgroup has two slots
and writes dpreact back over the preact it read).

The variants and their host-side description are in epilogue_spec.py (``EpilogueSpec``).

Gated activations read interleaved (gate, up) column pairs; in the WGMMA accumulator fragment the
two columns of a pair sit in adjacent registers of one thread (values 2j, 2j+1), so a pair never
crosses threads and the gated math is purely per thread.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .device_math import DEVICE_MATH
from .epilogue_spec import EpilogueSpec


class Epilogue:
    """The device side of an EpilogueSpec: `visit` fills one subtile's outputs."""

    def __init__(self, spec: EpilogueSpec):
        self.spec = spec
        # The gated dact's pair permutation for odd rows (set by the kernel at trace time; see
        # PersistentGemmSm90._pair_swap), or None.
        self.pair_swap = None

    # One subtile: registers (and smem subtiles) in, registers / smem out.
    # rAcc: fp32 fragment of this subtile's accumulators (S values), value v at tile coordinates
    #       tCcT[base + v] (row, col) and problem coordinates tCcG[base + v]; the subtile's first
    #       column in the tile is col0.
    # rD / rP: fp32 fragments of the acc-shaped outputs (channels D and P), same positions as rAcc.
    # sL: this subtile's preact (dact; acc-shaped, or double width when gated), in smem.
    # sH / sX: this subtile's half-width postact / double-width dpreact buffers, in smem.

    @cute.jit
    def visit(
        self,
        rAcc: cute.Tensor,
        rD: cute.Tensor,
        rP: cute.Tensor,
        tCcT: cute.Tensor,
        tCcG: cute.Tensor,
        base: cutlass.Constexpr,
        col0: cutlass.Constexpr,
        n_lim: cutlass.Int32,
        mBias: Optional[cute.Tensor],
        sL: Optional[cute.Tensor],
        sH: Optional[cute.Tensor],
        sX: Optional[cute.Tensor],
    ):
        s = self.spec
        pair_swap = self.pair_swap
        S = cute.size(rAcc)
        m = DEVICE_MATH
        if cutlass.const_expr(s.kind == "store" or s.kind == "accumulate"):
            for v in cutlass.range_constexpr(S):
                rD[v] = rAcc[v]
        if cutlass.const_expr(s.kind == "act"):
            if cutlass.const_expr(s.has_bias):
                for v in cutlass.range_constexpr(S):
                    n = tCcG[base + v][1]
                    b = Float32(0.0)
                    if n < n_lim:
                        b = Float32(mBias[n])
                    rAcc[v] = rAcc[v] + b
            if cutlass.const_expr(s.has_tma_d):
                for v in cutlass.range_constexpr(S):
                    rD[v] = rAcc[v]
            if cutlass.const_expr(not s.gated):
                for v in cutlass.range_constexpr(S):
                    rP[v] = s.act.fn(rAcc[v], m)
            else:
                # Registers 2j, 2j+1 hold the (gate, up) columns of one unit.
                for j in cutlass.range_constexpr(S // 2):
                    r, c = tCcT[base + 2 * j]
                    y = s.act.fn(rAcc[2 * j], rAcc[2 * j + 1], m)
                    sH[r, (c - col0) // 2] = y.to(sH.element_type)
        if cutlass.const_expr(s.kind == "dact"):
            if cutlass.const_expr(not s.gated):
                # Registers 2j, 2j+1 are columns (c, c+1), c even: one 4-byte vector of preact.
                sL2 = cute.zipped_divide(sL, (1, 2))  # ((1, 2), (rows, cols / 2))
                for j in cutlass.range_constexpr(S // 2):
                    r, c = tCcT[base + 2 * j]
                    pre = sL2[((0, None), (r, (c - col0) // 2))].load().to(Float32)
                    for t in cutlass.range_constexpr(2):
                        x = pre[t]
                        rD[2 * j + t] = s.act.grad(x, m) * rAcc[2 * j + t]
                        rP[2 * j + t] = s.act.fn(x, m)
            else:
                # The GEMM is h wide (dpostact); accumulator column n owns preact/dpreact columns
                # (2n, 2n+1), and postact column n is the accumulator's own position.
                # Accumulator registers 2j, 2j+1 are columns (c, c+1), c even: together they own
                # the four adjacent preact/dpreact columns 2c .. 2c+3, read and written as one
                # 8-byte vector (a 128B swizzle moves 16-byte chunks only, so it stays whole).
                sL4 = cute.zipped_divide(sL, (1, 4))  # ((1, 4), (rows, cols / 4))
                sX4 = cute.zipped_divide(sX, (1, 4))
                # Every preact vector of the subtile is loaded before the first dpreact store.
                # Interleaved pair by pair, no load could pass the store before it (the
                # compiler cannot tell sX from sL, and in place they are one buffer), so each
                # pair's load, math and store ran as one dependent chain. Loaded ahead, the
                # pingpong dacts (one warp per scheduler in an epilogue) ran 5-9% faster and the
                # cooperative 128x128 one even (bench configs --only dpost, held, H200,
                # 2026-12-03; kernels/NOTES.md, "dact").
                # With the pair swap (PersistentGemmSm90._pair_swap), threads whose row has bit
                # row_bit set take pair partner[j] (the column group vector_xor vectors over)
                # where the others take pair j: slot j's preact is read from, and its dpreact
                # written to, that pair's address, 2 shared-memory wavefronts per warp access
                # instead of 4. Only the accumulators going in and the postact coming out are
                # swapped, by selects in place (no value waits in an extra register). Each thread
                # keeps to its own row and columns, so writing dpreact in place stays race-free.
                swapping = pair_swap is not None
                if cutlass.const_expr(swapping):
                    partner, row_bit, vector_xor = pair_swap
                    sel = (tCcT[base][0] >> row_bit) & 1
                    odd = sel == 1
                    flip = sel * vector_xor

                def vector(c):
                    k = (c - col0) // 2
                    if cutlass.const_expr(swapping):
                        k = k ^ flip
                    return k

                pres = []
                for j in cutlass.range_constexpr(S // 2):
                    r, c = tCcT[base + 2 * j]
                    pres.append(sL4[((0, None), (r, vector(c)))].load())
                dpre = cute.make_rmem_tensor(4, sX.element_type)
                for j in cutlass.range_constexpr(S // 2):
                    r, c = tCcT[base + 2 * j]
                    pre = pres[j].to(Float32)
                    for t in cutlass.range_constexpr(2):
                        g = pre[2 * t]
                        u = pre[2 * t + 1]
                        if cutlass.const_expr(swapping):
                            q = partner[j]
                            dy = cutlass.select_(odd, rAcc[2 * q + t], rAcc[2 * j + t])
                        else:
                            dy = rAcc[2 * j + t]
                        dg, du = s.act.grad(g, u, m)
                        p = s.act.fn(g, u, m)
                        if cutlass.const_expr(swapping):
                            # slot j's postact is pair j's, or pair q's in a swapped row
                            rP[2 * j + t] = cutlass.select_(odd, rP[2 * j + t], p)
                            rP[2 * q + t] = cutlass.select_(odd, p, rP[2 * q + t])
                        else:
                            rP[2 * j + t] = p
                        dpre[2 * t] = (dg * dy).to(sX.element_type)
                        dpre[2 * t + 1] = (du * dy).to(sX.element_type)
                    sX4[((0, None), (r, vector(c)))].store(dpre.load())
