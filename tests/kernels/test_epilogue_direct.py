"""The direct epilogues' addressing (kernels/epilogue_direct.py), run on the CPU.

A direct store lands at a base per tile, plus a row step, plus a constant per pair, all derived
from thread 0's accumulator offsets. Here host code compiled by the DSL (no GPU) builds the
WGMMA partitions the kernel uses, and for every checked thread, tile and tensor layout writes
out each pair's coordinates and the element PairAddresses points at; the test requires that
element to be the one the pair's coordinates name in the tensor (its row stride, its columns per
accumulator column), and each pair to be two adjacent columns of one row starting at an even
column (what a pair store assumes).
"""

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
# the probe unrolls over a thread's accumulators, as the kernel does (range_constexpr)
pytestmark = pytest.mark.filterwarnings("ignore:This static loop has")

import torch  # noqa: E402


def sample(threads):
    """The threads checked: each warp's first and last lanes of the first warpgroup's edges, and
    the second warpgroup's."""
    return sorted(t for t in {0, 1, 2, 5, 30, 31, 32, 63, 64, 97, 127, 128, 161, 255} if t < threads)


def _compiled(tm, tn, atoms, threads, per_col, cols_per):
    """Host function (tensor, out, coords, tile_m, tile_n) for the sample of the `threads`
    consumer threads of a (tm x tn) tile whose tiled MMA has `atoms` warpgroups along M (the
    kernel's two partitions: cooperative (2, 1, 1) over two warpgroups, pingpong (1, 1, 1) over
    one)."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.runtime import from_dlpack
    from cutlass.tensor_utils import LayoutEnum

    from parallel_mlp.kernels.epilogue_direct import PairAddresses, value_offsets

    @cute.jit
    def probe(t: cute.Tensor, out: cute.Tensor, coords: cute.Tensor, tc0: cutlass.Int32, tc1: cutlass.Int32):
        k_major = LayoutEnum.ROW_MAJOR.sm90_mma_major_mode()
        mma = sm90_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, k_major, k_major,
                                                cutlass.Float32, atoms, tiler_mn=(64, tn))

        def part(i):
            return mma.get_slice(i).partition_C(cute.make_identity_tensor((tm, tn)))

        offs = value_offsets(part, threads, "probe")
        for k, i in enumerate(sample(threads)):
            cT = part(i)
            to = PairAddresses(t, tc0 * tm, tc1 * tn, cT[0], offs, per_col, cols_per)
            eb = t.element_type.width // 8
            for v in cutlass.range_constexpr(cute.size(cT)):
                out[k, v] = (to.at(v) - t.iterator.toint()) // eb
                coords[k, v, 0] = cT[v][0]
                coords[k, v, 1] = cT[v][1]

    return probe, from_dlpack


CASES = {
    # name: (tile_m, tile_n, atoms, threads)
    "cooperative 128x128": (128, 128, (2, 1, 1), 256),
    "cooperative 64x192": (64, 192, (1, 1, 1), 128),
    "pingpong 128x192": (128, 192, (1, 1, 1), 128),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("per_col,cols_per", [(1, 1), (2, 1), (1, 2)])
def test_every_pair_lands_where_its_coordinates_say(case, per_col, cols_per):
    import cutlass.cute as cute

    tm, tn, atoms, threads = CASES[case]
    probe, from_dlpack = _compiled(tm, tn, atoms, threads, per_col, cols_per)
    cols = 3 * tn * per_col // cols_per  # three tile columns of the output's width
    stride = cols + 40  # a column view of a wider tensor: the row stride is not the width
    t = torch.zeros(5 * tm, stride, dtype=torch.bfloat16)[:, :cols]
    n_vals = tm * tn // threads
    out = torch.zeros(len(sample(threads)), n_vals, dtype=torch.int64)
    coords = torch.zeros(len(sample(threads)), n_vals, 2, dtype=torch.int32)
    args = (from_dlpack(t).mark_layout_dynamic(leading_dim=1), from_dlpack(out), from_dlpack(coords))
    fn = cute.compile(probe, *args, 1, 1, options="--gpu-arch sm_90a")
    for tc0, tc1 in ((0, 0), (3, 2), (4, 1)):
        fn(*args, tc0, tc1)
        r = tc0 * tm + coords[..., 0].long()
        c = tc1 * tn + coords[..., 1].long()
        want = r * stride + c * per_col // cols_per
        # each value of a pair (even v) at its own coordinates
        assert torch.equal(out[:, 0::2], want[:, 0::2]), (case, tc0, tc1)
        # a pair is columns (c, c + 1) of one row, c even
        assert torch.equal(coords[:, 1::2, 0], coords[:, 0::2, 0])
        assert torch.equal(coords[:, 1::2, 1], coords[:, 0::2, 1] + 1)
        assert (coords[:, 0::2, 1] % 2 == 0).all()


def test_value_offsets_refuses_a_partition_that_is_not_shifted_alike():
    import cutlass
    import cutlass.cute as cute

    from parallel_mlp.kernels.epilogue_direct import value_offsets

    @cute.jit
    def probe():
        ident = cute.make_identity_tensor((8, 8))

        along_row = cute.make_tensor(ident.iterator, cute.make_layout((4,), stride=(cute.E(1),)))
        along_column = cute.make_tensor(ident.iterator, cute.make_layout((4,), stride=(cute.E(0),)))

        def rows_then_columns(i):
            # thread 0 walks a row, the others a column: not the same offsets
            return along_row if cutlass.const_expr(i == 0) else along_column

        value_offsets(rows_then_columns, 4, "the probe")

    with pytest.raises(ValueError, match="the probe: thread 1's accumulators are not thread 0's, shifted"):
        cute.compile(probe, options="--gpu-arch sm_90a")
