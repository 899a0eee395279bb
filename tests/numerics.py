"""DESIGN.md's numerics rule, in one place for every test that uses it."""

import torch


def max_err(t: torch.Tensor, ref: torch.Tensor) -> float:
    return (t.double() - ref.double()).abs().max().item()


def assert_design_tolerance(name, ours, torch_bf16, ref, slack=2**-8 * 1e-2):
    """``ours`` is at most twice as far from the fp32/fp64 ``ref`` as PyTorch's own low-precision
    path ``torch_bf16`` is, plus a small absolute slack relative to ref's scale."""
    bound = 2 * max_err(torch_bf16, ref) + slack * ref.abs().max().item()
    err = max_err(ours, ref)
    assert err <= bound, f"{name}: max error {err:.3e} exceeds 2x PyTorch's + slack = {bound:.3e}"
