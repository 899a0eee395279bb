"""Count one kernel's sm_90a instructions, whole and in its epilogue, without a GPU.

    python3 tools/sass_counts.py --T 8192 --d 1024 --h 2816 --act swiglu --kind dact
    python3 tools/sass_counts.py ... --also dact_pair_swap=0   (GemmConfig fields replaced)

Compiles the kernel that `ops` would launch for that GEMM of the MLP (the default config, as
`python -m parallel_mlp.kernels.warmup` picks it) with the PTX kept, assembles it with `ptxas
-arch=sm_90a` and disassembles it with `nvdisasm` (both on PATH, or $PTXAS / $NVDISASM; the
`nvidia-cuda-nvdisasm` wheel has nvdisasm). It prints ptxas's register and spill line and the
opcode counts of the epilogue's stretch: from the last wait for the WGMMAs to retire
(`WARPGROUP.DEPBAR.LE gsb0, 0x0`) to the kernel's last global or TMA store. A persistent
kernel's tile loop is unrolled neither way, so that stretch is one tile's epilogue of the last
tile loop in the code (for the pingpong schedule: one warpgroup's).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile

OPCODE = re.compile(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
EPILOGUE_START = "WARPGROUP.DEPBAR.LE gsb0, 0x0"
STORES = ("STG", "UTMASTG", "UTMAREDG")


def epilogue_counts(sass: str) -> tuple[collections.Counter, int]:
    """(opcode -> count, instructions) over the epilogue's stretch of a disassembly."""
    lines = sass.splitlines()
    start = max((i for i, line in enumerate(lines) if EPILOGUE_START in line), default=None)
    if start is None:
        raise ValueError(f"no '{EPILOGUE_START}' in the disassembly: not a WGMMA kernel")
    ops = [(i, m.group(1)) for i, line in enumerate(lines) if (m := OPCODE.search(line))]
    end = max((i for i, op in ops if op in STORES and i > start), default=None)
    if end is None:
        raise ValueError("no global or TMA store after the last WGMMA wait")
    counts = collections.Counter(op for i, op in ops if start <= i <= end)
    return counts, sum(counts.values())


def _tool(name: str) -> str:
    """The path of ptxas or nvdisasm: $PTXAS / $NVDISASM, else the one on PATH."""
    path = os.environ.get(name.upper()) or shutil.which(name)
    if not path or not os.path.exists(path):
        raise SystemExit(f"{name} not found: put it on PATH or set ${name.upper()} (nvdisasm: the "
                         "nvidia-cuda-nvdisasm wheel)")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--T", type=int, default=8192)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--h", type=int, default=14336)
    p.add_argument("--act", default="swiglu")
    p.add_argument("--kind", default="dact", choices=("act", "store", "dact", "accumulate"),
                   help="the GEMM of the step: act (fc1 + act), dact (dy @ W2 + dact), store (fc2), "
                        "accumulate (dW2 +=)")
    p.add_argument("--also", default=None, metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="GemmConfig fields replaced on the default config")
    args = p.parse_args(argv)

    from parallel_mlp.kernels.compile import kernel_ptx
    from parallel_mlp.kernels.config import parse_fields
    from parallel_mlp.kernels.warmup import mlp_keys

    key = next(k for k in mlp_keys(args.T, args.d, args.h, args.act) if k.epilogue.kind == args.kind)
    if args.also:
        key = dataclasses.replace(key, config=dataclasses.replace(key.config, **parse_fields(args.also)))
    print(f"{key.epilogue.key} {key.config.key}")
    ptx = kernel_ptx(key)
    with tempfile.TemporaryDirectory(prefix="pmlp_sass_") as d:
        src, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([_tool("ptxas"), "-arch=sm_90a", "-O3", "-v", src, "-o", cubin],
                           capture_output=True, text=True, check=True)
        for line in r.stderr.splitlines():
            if "registers" in line or "spill" in line:
                print(line.strip())
        sass = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True).stdout
    counts, total = epilogue_counts(sass)
    print(f"epilogue: {total} instructions")
    print("  " + "  ".join(f"{op} {n}" for op, n in counts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
