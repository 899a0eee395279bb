"""A digest of each kernel's sm_90a PTX, without a GPU: does a change leave the kernels alone?

    python3 tools/ptx_digest.py [--quick | --sweep] [-j N] > after.txt
    git stash; python3 tools/ptx_digest.py [--quick] > before.txt; git stash pop
    diff before.txt after.txt

Compiles every kernel the selfcheck compiles (`parallel_mlp.kernels.selfcheck.variants`; the
quick subset with --quick; with --sweep, the kernels the default rule picks for the shape sweep's
30 shapes instead) for sm_90a with the PTX kept and prints one line per kernel: a
digest of its PTX without comments and line information, its line count and its name. A
refactor of the kernel code that must not change what runs (new options off, code moved
between functions) shows no difference; an option's knob left at its default must not either.
A GPU then has nothing new to test for those kernels. The digest depends on the installed
CuTe DSL, so compare lines from the same environment.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from concurrent.futures import ProcessPoolExecutor


def ptx_body(ptx: str) -> str:
    """The PTX without what says where it came from: comments, .file and .loc lines."""
    keep = []
    for line in ptx.splitlines():
        text = line.strip()
        if text.startswith(("//", ".file", ".loc")):
            continue
        keep.append(line)
    return "\n".join(keep)


def digest(key) -> tuple[str, int]:
    """(first 16 hex digits of the sha256 of ptx_body, its line count) of one KernelKey."""
    from parallel_mlp.kernels.compile import kernel_ptx

    body = ptx_body(kernel_ptx(key))
    return hashlib.sha256(body.encode()).hexdigest()[:16], body.count("\n") + 1


def _line(key) -> str:
    try:
        h, n = digest(key)
        return f"{h} {n:6d} {key.name}"
    except Exception as e:  # report, don't stop: a failed compile is a difference too
        return f"{'FAILED':16s} {0:6d} {key.name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def sweep_keys():
    """The kernels `python -m parallel_mlp.bench sweep` compiles ahead and runs at the rule's
    configs (bench.sweep.kernel_keys over its grid, each kernel once): many are not among the
    selfcheck's kernels (other tiles and clusters of the same code)."""
    from parallel_mlp.bench.sweep import kernel_keys
    from parallel_mlp.bench.sweep_grid import GRID
    from parallel_mlp.kernels.config import DEFAULT_NUM_SMS

    return kernel_keys(GRID, "bfloat16", DEFAULT_NUM_SMS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 tools/ptx_digest.py", description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="the selfcheck's quick subset")
    which.add_argument("--sweep", action="store_true", help="the shape sweep's kernels at the rule's configs")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    from parallel_mlp.kernels.selfcheck import variants

    keys = sweep_keys() if args.sweep else variants(args.quick)
    jobs = max(1, min(args.jobs, len(keys)))
    if jobs == 1:
        lines = list(map(_line, keys))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            lines = list(pool.map(_line, keys))
    for line in sorted(lines, key=lambda s: s.split()[2]):
        print(line)
    return 1 if any(line.startswith("FAILED") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
