"""Direct epilogues: outputs that go from registers straight to global memory, with no
shared-memory staging, TMA store, fence or store wait (GemmConfig.dact_direct, act_direct).

Accumulators 2j, 2j + 1 of a consumer thread are columns (c, c + 1) of one row r, c even, in
the WGMMA fragment and in the epilogue's copy order alike. A pair is the unit of every direct
access: the gated dact's preact and dpreact are one vector of 4 elements at column 2c ((gate,
up) of both columns), a non-gated one's a vector of 2 at column c; a postact is a pair at c, or
one element at c / 2 for the gated act; the act's preact is a pair at c. Four threads cover 8
adjacent accumulator columns of a row, so a warp's vector access spans whole 32-byte sectors of
8 rows, or half sectors that the next pair's access fills in L2.

A thread's accumulators sit at the same (row, column) offsets from its first one in every thread
(`value_offsets` checks it at trace time), so a pair's address is the thread's base address in
the tile, plus a row step (one per distinct row offset), plus a constant (`PairAddresses`):
immediate offsets on the store, not a 64-bit row times stride product per pair. Each store is
one predicated instruction (`store_global_if`).

`DirectEpilogues` is a base of PersistentGemmSm90 (gemm_sm90.py). Its methods read the kernel's
tile shape (`tile_shape_mnk`, `epi_tile`), epilogue (`epi`, `epilogue`), output dtypes
(`d_dtype`, `post_dtype`), and, in the pingpong dact, its preact ring (`l_ring`, `_load_preact`).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


def value_offsets(coords_of, threads: int, what: str):
    """The static (row, column) offset of each value of a thread's coordinate partition from its
    value 0, for partitions whose values sit at the same offsets in every thread: coords_of(t)
    is thread t's (static) partition, checked on a sample of threads. ValueError (naming `what`)
    where a thread's differ."""
    c0 = coords_of(0)
    n = cute.size(c0)

    def offsets(c):
        return [(c[v][0] - c[0][0], c[v][1] - c[0][1]) for v in range(n)]

    offs = offsets(c0)
    for t in sorted({1, 3, 4, 31, 32, 63, 64, 127, threads - 1}):
        if t < threads and offsets(coords_of(t)) != offs:
            raise ValueError(f"{what}: thread {t}'s accumulators are not thread 0's, shifted")
    return offs


class PairAddresses:
    """Byte addresses of a thread's accumulator pairs in one global tensor `t`, for one tile.

    The tile's first element sits at row `row0`, accumulator column `col0` of the problem; the
    thread's value 0 at (rc[0], rc[1]) in the tile (rc[1] even), its values at `offs` from it.
    `t` holds `per_col` elements per `cols_per` accumulator columns: 1, 1 for an acc-shaped
    output, 2, 1 for the gated dact's interleaved pairs, 1, 2 for the gated act's postact. Built
    while tracing: a base per tile and a step per distinct row offset, then a constant per pair."""

    def __init__(self, t: cute.Tensor, row0, col0, rc, offs, per_col: int = 1, cols_per: int = 1):
        self.eb = t.element_type.width // 8
        self.offs = offs
        self.per_col, self.cols_per = per_col, cols_per
        stride = cutlass.Int64(t.layout.stride[0])
        r = cutlass.Int64(row0 + rc[0])
        c = cutlass.Int64((col0 + rc[1]) * per_col // cols_per)
        self.base = t.iterator.toint() + (r * stride + c) * self.eb
        self.step = {dr: cutlass.Int64(dr * self.eb) * stride for dr in sorted({o[0] for o in offs})}

    def at(self, v: int):
        """The address of value v's element (the pair's first when v is even)."""
        dr, dc = self.offs[v]
        return self.base + self.step[dr] + dc * self.per_col // self.cols_per * self.eb


@dsl_user_op
def store_global_if(addr, words, ok, *, loc=None, ip=None):
    """`@p st.global` of `words` (one 16-bit integer, or one or two 32-bit ones: a 2-, 4- or
    8-byte vector) at byte address `addr` where the Boolean `ok` holds. Inline PTX rather than
    a copy under `pred=`: the DSL lowers that to a branch around the store, LLVM then sinks the
    math that only the store uses into the branch, and ptxas keeps it a branch (BSSY / BRA /
    BSYNC around every pair of the gated direct act: 1465 epilogue instructions at 128x128
    against 1269 staged; sm_90a, ptxas 13.0). Opaque to LLVM, the store leaves the math where
    it is, and ptxas predicates the one instruction."""
    bits = words[0].width
    n = len(words)
    reg = "h" if bits == 16 else "r"
    values = "$1" if n == 1 else "{" + ", ".join(f"${i + 1}" for i in range(n)) + "}"
    vec = "" if n == 1 else f".v{n}"
    llvm.inline_asm(
        None,
        [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)] + [w.ir_value(loc=loc, ip=ip) for w in words]
        + [cutlass.Boolean(ok).ir_value(loc=loc, ip=ip)],
        f"@${n + 1} st.global{vec}.b{bits} [$0], {values};",
        "l," + ",".join([reg] * n) + ",b,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


def put(values: cute.Tensor, addr, ok):
    """Store the register vector `values` (2, 4 or 8 bytes) at byte address addr of global memory
    where the Boolean ok holds: one predicated store instruction, no branch."""
    bits = cute.size(values) * values.element_type.width
    word = cutlass.Int16 if bits == 16 else cutlass.Int32
    words = cute.recast_tensor(values, word)
    store_global_if(addr, [words[i] for i in range(bits // word.width)], ok)


def vector_at(dtype, addr, n: int):
    """n elements of dtype at byte address addr of global memory, aligned to their size."""
    ptr = cute.make_ptr(dtype, addr, cute.AddressSpace.gmem, assumed_align=n * dtype.width // 8)
    return cute.make_tensor(ptr, cute.make_layout(n))


class DirectEpilogues:
    """The direct dact and act of PersistentGemmSm90 (see the module's docstring)."""

    def _value_offsets(self, coords_of, threads: int):
        return value_offsets(coords_of, threads, self.cfg.key)

    def _pairs(self, t: cute.Tensor, tc, rc, offs, per_col: int = 1, cols_per: int = 1) -> PairAddresses:
        """PairAddresses of tensor t for tile tc."""
        tm, tn, _ = self.tile_shape_mnk
        return PairAddresses(t, tc[0] * tm, tc[1] * tn, rc, offs, per_col, cols_per)

    # ---- the direct dact (config.dact_direct) --------------------------------------------------

    @cute.jit
    def _direct_preact(self, mL: cute.Tensor, tc, cT: cute.Tensor, offs, m_size: cutlass.Int32,
                       n_size: cutlass.Int32):
        """Load this thread's preact of tile tc into registers (one vector per accumulator pair;
        cT: the accumulators' tile coordinates, offs: their offsets from value 0), issued before
        the tile's mainloop so the loads land while it runs (the cooperative direct dact). In a
        tile across the problem's edge, coordinates past it are clamped onto its last row / pair
        (in bounds; their results are never stored)."""
        tm, tn, _ = self.tile_shape_mnk
        gated = self.epi.gated
        w = 4 if cutlass.const_expr(gated) else 2
        n_pairs = cute.size(cT) // 2
        pre = cute.make_rmem_tensor((w, n_pairs), self.d_dtype)
        rows = m_size - tc[0] * tm
        cols = n_size - tc[1] * tn
        if rows >= tm and cols >= tn:
            src = self._pairs(mL, tc, cT[0], offs, 2 if gated else 1)
            for j in cutlass.range_constexpr(n_pairs):
                pre[None, j].store(vector_at(self.d_dtype, src.at(2 * j), w).load())
        else:
            vectors = cute.zipped_divide(mL, (1, w))  # ((1, w), (rows, vectors per row))
            for j in cutlass.range_constexpr(n_pairs):
                r, c = cT[2 * j]
                r = cutlass.min(r, rows - 1) + tc[0] * tm
                c = cutlass.min(c, cols - 2) + tc[1] * tn
                pre[None, j].store(vectors[((0, None), (r, c // 2))].load())
        return pre

    @cute.jit
    def _direct_dact(self, acc: cute.Tensor, pre: cute.Tensor, tc, cT: cute.Tensor, offs, mX: cute.Tensor,
                     mP: cute.Tensor, m_size: cutlass.Int32, n_size: cutlass.Int32):
        """dpreact and postact of tile tc from its accumulators (dpostact) and the preact
        registers of _direct_preact, each pair stored to global memory where it is in bounds."""
        tm, tn, _ = self.tile_shape_mnk
        self._direct_pairs(
            mX, mP, tc, cT, offs, m_size - tc[0] * tm, n_size - tc[1] * tn, 0, cute.size(cT),
            lambda j: pre[None, j].load(), lambda v: acc[v],
        )

    @cute.jit
    def _direct_pairs(self, mX: cute.Tensor, mP: cute.Tensor, tc, cT: cute.Tensor, offs, rows, cols,
                      v0: cutlass.Constexpr, n: cutlass.Constexpr, preact_of, acc_of):
        """Values v0 .. v0 + n - 1 of this thread (n // 2 accumulator pairs; cT their tile
        coordinates, offs their offsets from value 0): each pair's dpreact and postact from its
        preact vector preact_of(j) and accumulators acc_of(v), by the staged dact's math
        (Epilogue.dact_unit), stored from registers straight to global memory where in bounds
        (rows, cols: the tile's extent inside the problem)."""
        gated = self.epi.gated
        w = 4 if cutlass.const_expr(gated) else 2
        to_x = self._pairs(mX, tc, cT[0], offs, 2 if gated else 1)
        to_p = self._pairs(mP, tc, cT[0], offs)
        r0, c0 = cT[0]
        dpre = cute.make_rmem_tensor(w, self.d_dtype)
        post = cute.make_rmem_tensor(2, self.post_dtype)
        for j in cutlass.range_constexpr(n // 2):
            v = v0 + 2 * j
            dr, dc = offs[v]
            x = preact_of(v // 2).to(cutlass.Float32)
            for t in cutlass.range_constexpr(2):
                dvals, p = self.epilogue.dact_unit(x, t, acc_of(v + t))
                for i in cutlass.range_constexpr(len(dvals)):
                    dpre[len(dvals) * t + i] = dvals[i].to(self.d_dtype)
                post[t] = p.to(self.post_dtype)
            ok = r0 + dr < rows and c0 + dc < cols
            put(dpre, to_x.at(v), ok)
            put(post, to_p.at(v), ok)

    @cute.jit
    def _direct_epilogue_tile(
        self, ep, tc, acc_of, cT, offs, count, wg, is_store_warp, epi_barrier, mX: cute.Tensor, mP: cute.Tensor,
        m_size: cutlass.Int32, n_size: cutlass.Int32, S: cutlass.Constexpr,
    ):
        """A pingpong warpgroup's direct dact of one tile (config.dact_direct), epi_n accumulator
        columns at a time; returns `count` advanced by the tile's subtiles. Per subtile: wait for
        its preact slot, read every pair's preact vector from it, and once the warpgroup's warps
        all have (its barrier), refill the slot with the subtile l_ring ahead; then compute and
        store each pair's dpreact and postact straight to global memory where it is in bounds.
        No output touches shared memory, so there is no fence, TMA store or store wait, and
        the slot's next load starts before the math instead of after the stores."""
        tm, tn, _ = self.tile_shape_mnk
        w = self.epi_tile[1]
        num_sub = tn // w
        v = 4 if cutlass.const_expr(self.epi.gated) else 2
        for e in cutlass.range_constexpr(num_sub):
            lslot = wg * self.l_ring + count % self.l_ring
            cute.arch.mbarrier_wait(ep.l_mbar + lslot, (count // self.l_ring) % 2)
            pre_vectors = cute.zipped_divide(ep.sL[(None, None, lslot)], (1, v))
            pres = []
            for j in cutlass.range_constexpr(S // 2):
                r, c = cT[e * S + 2 * j]
                pres.append(pre_vectors[((0, None), (r, (c - e * w) // 2))].load())
            epi_barrier.arrive_and_wait()
            if cutlass.const_expr(e + self.l_ring < num_sub):
                if is_store_warp:
                    self._load_preact(ep, tc, e + self.l_ring, count + self.l_ring, wg)
            self._direct_pairs(
                mX, mP, tc, cT, offs, m_size - tc[0] * tm, n_size - tc[1] * tn, e * S, S,
                lambda q: pres[q - e * S // 2], lambda a: ep.tRS_acc[acc_of[a]],
            )
            count += 1
        return count

    # ---- the direct act (config.act_direct) ----------------------------------------------------

    @cute.jit
    def _direct_act(self, acc: cute.Tensor, tc, cT: cute.Tensor, offs, mX: Optional[cute.Tensor],
                    mP: cute.Tensor, mBias: Optional[cute.Tensor], m_size: cutlass.Int32, n_size: cutlass.Int32):
        """The direct act of tile tc: each accumulator pair's preact (+ bias; stored to mX unless
        that is None) and postact (to mP; gated, one element at half the column), computed by
        the staged epilogue's math (Epilogue.act_unit, the same fp32 adds of the bias) and
        stored from registers straight to global memory where in bounds. cT: the accumulators'
        tile coordinates in the MMA's order, offs: their offsets from value 0.

        A pair is stored whole or not at all: N must be even (gated N is; ops._storable_config
        gives a non-gated odd N the staged act, whose TMA stores stop at the row's end)."""
        tm, tn, _ = self.tile_shape_mnk
        gated = self.epi.gated
        store_pre = mX is not None
        rows = m_size - tc[0] * tm
        cols = n_size - tc[1] * tn
        r0, c0 = cT[0]
        to_p = self._pairs(mP, tc, cT[0], offs, 1, 2 if gated else 1)
        to_x = self._pairs(mX, tc, cT[0], offs) if cutlass.const_expr(store_pre) else None
        pre = cute.make_rmem_tensor(2, self.d_dtype)
        post = cute.make_rmem_tensor(1 if gated else 2, self.post_dtype)
        for j in cutlass.range_constexpr(cute.size(cT) // 2):
            v = 2 * j
            dr, dc = offs[v]
            x0 = acc[v]
            x1 = acc[v + 1]
            if cutlass.const_expr(self.epi.has_bias):
                # Columns past N get N - 1's bias: their results are never stored.
                n = tc[1] * tn + c0 + dc
                x0 = x0 + cutlass.Float32(mBias[cutlass.min(n, n_size - 1)])
                x1 = x1 + cutlass.Float32(mBias[cutlass.min(n + 1, n_size - 1)])
            ys = self.epilogue.act_unit(x0, x1)
            pre[0] = x0.to(self.d_dtype)
            pre[1] = x1.to(self.d_dtype)
            for i in cutlass.range_constexpr(len(ys)):
                post[i] = ys[i].to(self.post_dtype)
            ok = r0 + dr < rows and c0 + dc < cols
            if cutlass.const_expr(store_pre):
                put(pre, to_x.at(v), ok)
            put(post, to_p.at(v), ok)
