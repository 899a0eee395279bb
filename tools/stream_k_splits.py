"""Stream-K's sums against the fp32 reference as the split per tile grows (a GPU is needed).

    python3 tools/stream_k_splits.py

config.STREAM_K_MAX_SPLIT keeps stream-K at most 8.25 pieces per tile: GPU tests gave wrong
sums at 11 and 66 (under-filled grids with M tails, B column-major; H200, 2026-12-02). This
probe lifts the limit for the process and prints, per case, the split and the max error beside
torch's bf16 error, for splits of 8-132 ways with and without M tails, in an under-filled grid
and in a partial last wave, both B layouts: which of those the fault follows. A case whose error
is far above torch's is wrong.
"""

from __future__ import annotations

import torch

from parallel_mlp.kernels import config, ops
from parallel_mlp.kernels.config import GemmConfig

# name, config, (M, K, N)
CASES = [
    ("under-filled, 8.25 ways, M tail", GemmConfig(128, 256, 1, 1, 8, stream_k=True), (104, 40000, 4096)),
    ("under-filled, 16.5 ways", GemmConfig(128, 256, 1, 1, 8, stream_k=True), (256, 40000, 1024)),
    ("under-filled, 33 ways", GemmConfig(128, 256, 1, 1, 8, stream_k=True), (256, 40000, 512)),
    ("under-filled, 66 ways", GemmConfig(128, 256, 1, 1, 8, stream_k=True), (128, 40000, 512)),
    ("under-filled, 66 ways, M tail", GemmConfig(128, 256, 1, 1, 8, stream_k=True), (104, 40000, 304)),
    ("under-filled 2x1, 11 ways, M tail", GemmConfig(128, 256, 2, 1, 8, stream_k=True), (296, 40000, 704)),
    ("under-filled 2x1, 11 ways", GemmConfig(128, 256, 2, 1, 8, stream_k=True), (512, 40000, 768)),
    ("partial wave 2x1, 33 ways (a wgrad at T=16384 d=5120 h=2560)",
     GemmConfig(128, 256, 2, 1, 16, stream_k=True), (5120, 16384, 2560)),
    ("partial wave, 132 ways (133 tiles on 132 SMs)", GemmConfig(128, 128, 1, 1, 8, stream_k=True),
     (133 * 128, 8192, 128)),
]


def main() -> int:
    config.STREAM_K_MAX_SPLIT = ops.STREAM_K_MAX_SPLIT = float("inf")
    torch.manual_seed(0)
    print(f"{'case':62s} {'M x N x K':22s} B    split  max err  torch's")
    for name, cfg, (m, k, n) in CASES:
        for b_major in ("col", "row"):
            a = (torch.randn(m, k, device="cuda") * k ** -0.5).bfloat16()
            b = torch.randn(k, n, device="cuda").bfloat16()
            if b_major == "col":
                b = b.t().contiguous().t()
            ref = a.float() @ b.float()
            err = (ops.gemm(a, b, config=cfg).float() - ref).abs().max().item()
            theirs = ((a @ b).float() - ref).abs().max().item()
            split = config.stream_k_split(cfg, m, n, k)
            print(f"{name:62s} {f'{m}x{n}x{k}':22s} {b_major:4s} {split:5.2f}  {err:.2e}  {theirs:.2e}"
                  + ("  WRONG" if err > 4 * theirs + 1e-2 else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
