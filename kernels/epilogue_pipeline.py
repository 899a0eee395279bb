"""The epilogue's way out of the SM, shared by every consumer schedule of gemm_sm90.

A tile's accumulators leave subtile by subtile (epi_n accumulator columns each): the variant's
`visit` (epilogue.py) fills register fragments and writes the odd-width channels into shared
memory, stmatrix writes the accumulator-shaped ones, and TMA stores send every channel's
subtile to global memory; the dact's preact arrives by TMA load into a ring of subtile slots.
This module is that choreography: the per-thread copies and TMA views (`_epilogue_setup`,
`_tma_views`), the gated dact's shared-memory pair swap (`_pair_swap`), the preact loads
(`_load_preact`), and one tile's subtiles with their buffers, barriers and waits
(`_epilogue_tile`).

`EpiloguePipelineSm90` holds no state of its own: PersistentGemmSm90 inherits it and sets what
its methods read (the config, tile shape, channel widths and layouts, the preact ring's shape)
in its constructor and while tracing.
"""

from __future__ import annotations

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils

from .config import CACHE_HINTS

try:  # moved in 4.8; the old spelling still works with a deprecation warning
    from cutlass.tensor_utils import LayoutEnum
except ImportError:  # pragma: no cover
    LayoutEnum = utils.LayoutEnum

# The TMA store pipeline's stages: its acquire waits until one store group (this subtile's) is in
# flight, i.e. the previous subtile's stores have read shared memory, whatever the buffer count.
STORE_WINDOW = 2
# Shared-memory buffers per epilogue output channel. After issuing a subtile's TMA stores the
# store warp waits until the previous subtile's stores have read their buffer (the one written
# next), and a second barrier per subtile tells the other warps so. A third buffer, which lets
# that wait free the buffer two subtiles ahead and each subtile run one barrier, and a producer
# warp issuing the stores in the consumers' place were built and measured: neither shortened a
# whole step (kernels/NOTES.md, "Tried and rejected").
OUT_STAGES = 2


class EpiloguePipelineSm90:
    """The epilogue's methods of PersistentGemmSm90 (see the module's docstring)."""

    def _epilogue_setup(
        self, tiled_mma, thr_idx, acc, sD, sP, sH, sX, sL,
        tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, l_mbar, copy_order=None,
    ):
        """Everything the epilogue needs that does not change from tile to tile, for the
        consumer thread `thr_idx` of the MMA (a namespace, built once before the tile loop):
        the registers -> smem copies of the acc-shaped channels (stmatrix for 16-bit outputs),
        their smem partitions, the subtile fragments, and the TMA views of every channel.
        `copy_order(ep)`, if given, adds the visit order and coordinates of an epilogue that
        walks the accumulators in the copy's order (pingpong, and the 256-row cooperative tile);
        it runs after the accumulators are retiled and before the smem partitions are made."""
        row = LayoutEnum.ROW_MAJOR
        ep = self._tma_views(sD, sP, sH, sX, sL, tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, l_mbar)
        c_atom_d = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.d_dtype)
        ep.r2s_d = cute.make_tiled_copy_S(
            sm90_utils.get_smem_store_op(row, self.d_dtype, self.acc_dtype),
            cute.make_tiled_copy_C_atom(c_atom_d, tiled_mma),
        )
        c_atom_p = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.post_dtype)
        ep.r2s_p = cute.make_tiled_copy_S(
            sm90_utils.get_smem_store_op(row, self.post_dtype, self.acc_dtype),
            cute.make_tiled_copy_C_atom(c_atom_p, tiled_mma),
        )
        ep.thr_r2s_d = ep.r2s_d.get_slice(thr_idx)
        thr_r2s_p = ep.r2s_p.get_slice(thr_idx)
        if cutlass.const_expr(copy_order is None):
            ep.tRS_sD = ep.thr_r2s_d.partition_D(sD)
            ep.tRS_sP = thr_r2s_p.partition_D(sP)
            ep.tRS_acc = ep.r2s_d.retile(acc)
        else:
            ep.tRS_acc = ep.r2s_d.retile(acc)
            copy_order(ep)
            ep.tRS_sD = ep.thr_r2s_d.partition_D(sD)
            ep.tRS_sP = thr_r2s_p.partition_D(sP)
        sub_shape = ep.thr_r2s_d.partition_S(sD).shape[:3]
        ep.S = cute.size(sub_shape)
        ep.rAcc = cute.make_rmem_tensor(sub_shape, self.acc_dtype)
        ep.rD = cute.make_rmem_tensor(sub_shape, self.acc_dtype)
        ep.rP = cute.make_rmem_tensor(sub_shape, self.acc_dtype)
        ep.rD_out = cute.make_rmem_tensor(sub_shape, self.d_dtype)
        ep.rP_out = cute.make_rmem_tensor(sub_shape, self.post_dtype)
        # In place: the non-gated dpreact is written into the preact ring by stmatrix, like
        # channel D.
        if cutlass.const_expr(self.dpre_in_place):
            ep.tRS_sL = ep.thr_r2s_d.partition_D(sL)
        self.epilogue.pair_swap = None
        if cutlass.const_expr(self.epi.kind == "dact" and self.epi.gated and self.dact_pair_swap):
            self.epilogue.pair_swap = self._pair_swap(tiled_mma, ep.r2s_d, copy_order is not None, ep.S)
        return ep

    def _tma_views(self, sD, sP, sH, sX, sL, tma_d, mD, tma_p, mP, tma_h, mH, tma_x, mX, tma_l, mL, l_mbar):
        """What issuing the epilogue's TMA copies takes (a namespace): every channel's atom and
        its (TMA, subtiles_m, subtiles_n, 1) views of the global tensor and the smem buffers;
        subtile (i, j) of a channel covers the same accumulator columns for every channel width.
        In place, dpreact (channel X if gated, else D) leaves from the preact ring."""
        ep = SimpleNamespace(tma={"D": tma_d, "P": tma_p, "H": tma_h, "X": tma_x, "L": tma_l}, l_mbar=l_mbar)
        ep.sH, ep.sX, ep.sL = sH, sX, sL
        ep.smem, ep.gmem = {}, {}
        for c, mT, sT in (("D", mD, sD), ("P", mP, sP), ("H", mH, sH), ("X", mX, sX), ("L", mL, sL)):
            ep.smem[c], ep.gmem[c] = self._tma_view(ep.tma[c], mT, sT, c)
        if cutlass.const_expr(self.dpre_in_place):
            mT = mX if self.epi.gated else mD
            ep.smem[self.dpre], ep.gmem[self.dpre] = self._tma_view(ep.tma[self.dpre], mT, sL, "L")
        return ep

    def _pair_swap(self, tiled_mma, r2s, copy_ordered: bool, S: int):
        """The gated dact's shared-memory access permutation: (partner, row_bit, vector_xor).

        A thread reads 8 bytes of preact (and writes 8 of dpreact) per accumulator pair; four
        threads per row, eight rows per warp, 32 bytes of a row each. The smem rows are 128 bytes
        (32-column subtiles, 128B swizzle: chunk ^= row % 8) or 64 (16 columns, 64B swizzle:
        chunk ^= (row / 2) % 4), and 8-byte accesses are served a half-warp (four rows) at a
        time: rows r and r ^ 1 (128B), or r and r ^ 2 (64B), land on the same chunks, 4
        wavefronts where 2 do (kernels/NOTES.md, "dact"). So threads whose row has bit `row_bit`
        set take, at slot j, pair partner[j]: same row, accumulator columns XOR 16 (128B) or 8
        (64B), i.e. the 4-element preact vector index XOR vector_xor. Static: thread 0's
        coordinates, the same pattern for every thread and subtile."""
        tm, tn, _ = self.tile_shape_mnk
        w = self.epi_tile[1]
        col_xor, row_bit = (16, 0) if w == 32 else (8, 1)
        ident = cute.make_identity_tensor((tm, tn))
        c0 = r2s.get_slice(0).partition_S(ident) if copy_ordered else tiled_mma.get_slice(0).partition_C(ident)
        swap = None
        for e in range(tn // w):
            coords = [tuple(c0[e * S + v]) for v in range(S)]
            pos = {coords[2 * j]: j for j in range(S // 2)}
            this = [pos[(r, c ^ col_xor)] for (r, c) in coords[0::2]]
            if swap is not None and this != swap:
                raise ValueError(f"dact pair swap differs between subtiles: {swap} vs {this}")
            swap = this
        return swap, row_bit, col_xor // 2

    @cute.jit
    def _load_preact(self, ep, tc, e: cutlass.Constexpr, count, wg):
        """Issue preact subtile e of tile tc into slot count % l_ring of warpgroup wg's preact
        ring (cooperative: wg = 0). Called by a whole warp: the TMA copy elects its own thread;
        one thread arms the slot's barrier with the bytes to expect."""
        num_sub = self.tile_shape_mnk[1] // self.epi_tile[1]
        slot = wg * self.l_ring + count % self.l_ring
        l_bytes = self.tile_shape_mnk[0] * self.ch_width["L"] * self.d_dtype.width // 8
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(ep.l_mbar + slot, l_bytes)
        cute.copy(
            ep.tma["L"], ep.gmem["L"][(None, tc[0], tc[1] * num_sub + e, 0)], ep.smem["L"][(None, slot)],
            tma_bar_ptr=ep.l_mbar + slot, cache_policy=self._policy(1),
        )

    @cute.jit
    def _start_tile_preact(self, ep, tc, count, is_store_warp):
        """Cooperative ring (and handoff): the store warp issues tile tc's first l_ahead preact
        subtiles before the tile's mainloop has finished, so they land while it runs (their
        slots' stores finished by the tile before's last acquire). No-op without a preact."""
        if cutlass.const_expr(self.ch_width["L"] > 0):
            if is_store_warp:
                for e in cutlass.range_constexpr(min(self.l_ahead, self.tile_shape_mnk[1] // self.epi_tile[1])):
                    self._load_preact(ep, tc, e, count + e, 0)

    def _policy(self, which: int):
        """The L2 policy operand of config.cache_hints for A/B loads (0), epilogue loads (1) or
        epilogue stores (2): a constant Int64, or None for the DSL's default."""
        value = CACHE_HINTS[self.cfg.cache_hints][which]
        return None if value is None else cutlass.Int64(value)

    @cute.jit
    def _epilogue_tile(
        self, ep, tc, acc_of, cT, cG, count, wg, is_store_warp, epi_barrier, store_pipeline, mBias, n_size,
        S: cutlass.Constexpr, buffer_by_count: cutlass.Constexpr, drain_last: cutlass.Constexpr,
    ):
        """One tile's epilogue, epi_n accumulator columns (one subtile) at a time; returns the
        subtile count advanced by the tile's subtiles.

        Per subtile: wait for its preact (dact; the next one's load is issued first, or, with
        dpreact in place, the one l_ahead subtiles ahead once the previous subtile's stores have
        read its slot), gather its
        accumulators (value v of subtile e is register acc_of[e * S + v], at tile coordinates
        cT and problem coordinates cG), run the variant's `visit`, write the acc-shaped outputs
        by stmatrix, then the store warp sends every channel's smem subtile out by TMA and waits
        until the store issued one subtile earlier has read its buffer, the buffer written next,
        and a second barrier passes the news on (OUT_STAGES).
        S is the number of accumulator values per subtile (a compile-time constant).
        `count` numbers this thread group's subtiles: it picks the preact slot and its
        phase, and the output buffer when `buffer_by_count` (else buffer e % OUT_STAGES, for
        epilogues that start drained); `drain_last` waits for all stores at the last subtile
        instead.
        """
        has = {c: self.ch_width[c] > 0 for c in self.ch_width}
        w = self.epi_tile[1]
        num_sub = self.tile_shape_mnk[1] // w
        n_buf = OUT_STAGES
        for e in cutlass.range_constexpr(num_sub):
            if cutlass.const_expr(buffer_by_count):
                buf = count % n_buf
            else:
                buf = e % n_buf
            lslot = wg * self.l_ring + count % self.l_ring
            if cutlass.const_expr(has["L"]):
                if cutlass.const_expr(not self.dpre_in_place and e + 1 < num_sub):
                    if is_store_warp:
                        self._load_preact(ep, tc, e + 1, count + 1, wg)
                cute.arch.mbarrier_wait(ep.l_mbar + lslot, (count // self.l_ring) % 2)
            for v in cutlass.range_constexpr(S):
                ep.rAcc[v] = ep.tRS_acc[acc_of[e * S + v]]
            self.epilogue.visit(
                ep.rAcc, ep.rD, ep.rP, cT, cG, e * S, e * w, n_size, mBias,
                ep.sL[(None, None, lslot)] if cutlass.const_expr(has["L"]) else None,
                ep.sH[(None, None, buf)] if cutlass.const_expr(has["H"]) else None,
                ep.sL[(None, None, lslot)] if cutlass.const_expr(self.dpre == "X")
                else (ep.sX[(None, None, buf)] if cutlass.const_expr(has["X"]) else None),
            )
            if cutlass.const_expr(has["D"]):
                ep.rD_out.store(ep.rD.load().to(self.d_dtype))
                cute.copy(ep.r2s_d, ep.rD_out, ep.tRS_sD[(None, None, None, buf)])
            if cutlass.const_expr(self.dpre == "D"):
                ep.rD_out.store(ep.rD.load().to(self.d_dtype))
                cute.copy(ep.r2s_d, ep.rD_out, ep.tRS_sL[(None, None, None, lslot)])
            if cutlass.const_expr(has["P"]):
                ep.rP_out.store(ep.rP.load().to(self.post_dtype))
                cute.copy(ep.r2s_p, ep.rP_out, ep.tRS_sP[(None, None, None, buf)])
            # smem written by the generic proxy, read next by the TMA (async proxy).
            cute.arch.fence_proxy("async.shared", space="cta")
            epi_barrier.arrive_and_wait()
            if is_store_warp:
                self._store_subtile(ep, tc, e, buf, lslot)
                store_pipeline.producer_commit()
                self._wait_subtile_stores(ep, tc, e, count, wg, store_pipeline, drain_last)
                self._refill_preact(ep, tc, e, count, wg)
            epi_barrier.arrive_and_wait()
            count += 1
        return count

    @cute.jit
    def _wait_subtile_stores(self, ep, tc, e: cutlass.Constexpr, l_count, wg, store_pipeline,
                             drain_last: cutlass.Constexpr):
        """After subtile e's stores are committed (by the warp that issued them): wait until the
        buffers written next may be. Usually the previous subtile's stores must have read smem;
        `drain_last`: at the tile's last subtile, all of them (the buffers are handed over
        empty); with one preact slot, this subtile's too, and the slot then takes the next
        subtile's preact. l_count: this subtile's place in warpgroup wg's preact ring."""
        num_sub = self.tile_shape_mnk[1] // self.epi_tile[1]
        if cutlass.const_expr(drain_last and e + 1 == num_sub):
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        elif cutlass.const_expr(self.dpre_in_place and self.l_ring == 1 and e + 1 < num_sub):
            # dpreact left from the slot: once this subtile's stores have read it, it is free
            cute.arch.cp_async_bulk_wait_group(0, read=True)
            self._load_preact(ep, tc, e + 1, l_count + 1, wg)
        else:
            store_pipeline.producer_acquire()

    @cute.jit
    def _refill_preact(self, ep, tc, e: cutlass.Constexpr, l_count, wg):
        """With dpreact in place, after _wait_subtile_stores: the preact slot the previous
        subtile's stores have just read takes the ring's next subtile. Cooperative: that slot is
        subtile e + l_ahead's. Pingpong (every slot filled before the tile): subtile
        e - 1 + l_ring's."""
        num_sub = self.tile_shape_mnk[1] // self.epi_tile[1]
        if cutlass.const_expr(self.dpre_in_place and not self.pingpong and e + self.l_ahead < num_sub):
            self._load_preact(ep, tc, e + self.l_ahead, l_count + self.l_ahead, wg)
        if cutlass.const_expr(self.dpre_in_place and self.pingpong and self.l_ring > 1 and e >= 1
                              and e - 1 + self.l_ring < num_sub):
            self._load_preact(ep, tc, e - 1 + self.l_ring, l_count - 1 + self.l_ring, wg)

    @cute.jit
    def _store_subtile(self, ep, tc, e: cutlass.Constexpr, buf, lslot):
        """Issue the TMA stores of subtile e of tile tc: every output channel from buffer `buf`,
        dpreact in place from preact slot `lslot`. Called by a whole warp."""
        num_sub = self.tile_shape_mnk[1] // self.epi_tile[1]
        sm = tc[0]
        sn = tc[1] * num_sub + e
        for c in ("D", "P", "H", "X"):
            if cutlass.const_expr(c == self.dpre):
                cute.copy(ep.tma[c], ep.smem[c][(None, lslot)], ep.gmem[c][(None, sm, sn, 0)],
                          cache_policy=self._policy(2))
            elif cutlass.const_expr(self.ch_width[c] > 0):
                cute.copy(ep.tma[c], ep.smem[c][(None, buf)], ep.gmem[c][(None, sm, sn, 0)],
                          cache_policy=self._policy(2))


def subtile_order(tiled_mma, r2s, tm: int, tn: int):
    """Static map from (subtile e, fragment value v) -> index into r2s.retile(acc): entry
    e * S + v is the accumulator register holding the value that the copy's source partition of
    the whole (tm, tn) tile puts at flat position e * S + v. Computed on thread 0's slices, whose
    coordinates are static; every thread's pattern is the same up to its offset. (With one m64
    atom along M it is the identity.)"""
    ident = cute.make_identity_tensor((tm, tn))
    acc_c = r2s.retile(tiled_mma.get_slice(0).partition_C(ident))
    full = r2s.get_slice(0).partition_S(ident)
    pos = {tuple(acc_c[i]): i for i in range(cute.size(acc_c))}
    coords = [tuple(full[v]) for v in range(cute.size(full))]
    # The gated epilogues take values 2j, 2j + 1 as one (gate, up) pair of adjacent columns.
    for j in range(len(coords) // 2):
        (r0, c0), (r1, c1) = coords[2 * j], coords[2 * j + 1]
        if r1 != r0 or c1 != c0 + 1 or c0 % 2:
            raise ValueError(f"epilogue fragment: values {2 * j}, {2 * j + 1} are not a column pair ({coords[2 * j]}, {coords[2 * j + 1]})")
    return [pos[c] for c in coords]
