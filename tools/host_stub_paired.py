"""The layer's host time at two git revisions, paired in one process, with the kernels stubbed.

    python3 tools/host_stub_paired.py BASE [NEW] [--rounds 60] [--steps 30] [--groups replayed]

A shared 2-core VM moves by 1.5x within minutes, so host times from two runs, or two processes,
do not compare. This tool exports both revisions (NEW defaults to the working tree) as two
renamed copies of the package (``parallel_mlp`` and its ``kernels`` directory under another
top-level name), imports both into one process, and times a host-bound fwd+bwd and forward of
each (T=512 d=1024 swiglu, default and recompute modes, ``bench host --stub``'s stubs: no GPU
needed) in interleaved rounds, keeping each one's minimum over the rounds. Prints µs and NEW's
ratio to BASE.
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
SHAPE = (512, 1024, 2816, "swiglu")
_KEEP: list = []  # the entered stub contexts, for the life of the process


def _files(rev: str | None) -> dict[str, bytes]:
    """{repo-relative path: bytes} of parallel_mlp/ and kernels/ at rev (None: the working tree)."""
    if rev is None:
        return {str(p.relative_to(REPO)): p.read_bytes()
                for top in ("parallel_mlp", "kernels") for p in (REPO / top).rglob("*.py")}
    tar = subprocess.run(["git", "archive", rev, "parallel_mlp", "kernels"], cwd=REPO,
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers()
                if m.isfile() and m.name.endswith(".py")}


def export_renamed(rev: str | None, name: str, into: Path) -> None:
    """The package at rev as ``into/name``, its kernels as ``name.kernels``, every reference to
    ``parallel_mlp`` renamed."""
    for path, data in _files(rev).items():
        rel = Path(path)
        target = into / name / (rel.relative_to("parallel_mlp") if rel.parts[0] == "parallel_mlp"
                                else rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(re.sub(rb"\bparallel_mlp\b", name.encode(), data))


def step_functions(name: str, groups: str = "off") -> dict[str, callable]:
    """{measure: fn} for the package imported as name, its kernels stubbed from now on;
    ``groups``: "replayed" or "new" runs the fused function's launch groups through
    host_stub.launch_groups (every group replayed, or every group's key new), "off" launches
    kernel by kernel."""
    stub = importlib.import_module(f"{name}.bench.host_stub")
    layer = importlib.import_module(f"{name}.layer")
    contexts = [stub.stubbed_kernels()]
    if groups != "off":
        contexts.append(stub.launch_groups(groups == "replayed"))
    for context in contexts:
        context.__enter__()
        _KEEP.append(context)  # collected, the context would exit and take its stubs with it
    tokens, d, h, act = SHAPE
    fns = {}
    for recompute in (False, True):
        torch.manual_seed(0)
        mlp = layer.ParallelMLP(d, h, activation=act, backend="cute", dtype=torch.bfloat16,
                                recompute=recompute)
        x = torch.randn(tokens, d, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(tokens, d, dtype=torch.bfloat16)
        params = list(mlp.parameters())

        def step(mlp=mlp, x=x, dy=dy, params=params):
            for p in params:
                p.grad = None
            x.grad = None
            mlp(x).backward(dy)

        def forward(mlp=mlp, x=x):
            with torch.no_grad():
                mlp(x)

        mode = " recompute" if recompute else ""
        fns[f"fwd+bwd{mode}"] = step
        fns[f"forward{mode}"] = forward
    return fns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("base", help="git revision to compare against")
    p.add_argument("new", nargs="?", default=None, help="git revision (default: the working tree)")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--steps", type=int, default=30, help="calls per timed turn")
    p.add_argument("--groups", choices=("off", "replayed", "new"), default="off",
                   help="the launch groups: off (kernel by kernel, the default), every group "
                        "replayed (graph launches not counted), or every group's key new")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        export_renamed(args.base, "pmlp_base", Path(tmp))
        export_renamed(args.new, "pmlp_new", Path(tmp))
        sys.path.insert(0, tmp)
        fns = {(pkg, k): f for pkg in ("pmlp_base", "pmlp_new")
               for k, f in step_functions(pkg, args.groups).items()}
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(3):
            for f in fns.values():
                f()
        for _ in range(args.rounds):
            for key, f in fns.items():
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    f()
                best[key] = min(best[key], (time.perf_counter() - t0) / args.steps * 1e6)
    print(f"host µs, kernels stubbed, T={SHAPE[0]} d={SHAPE[1]} {SHAPE[3]} h={SHAPE[2]}, minimum "
          f"of {args.rounds} interleaved rounds of {args.steps} calls; {args.base} against "
          f"{args.new or 'the working tree'}; launch groups {args.groups}")
    for measure in dict.fromkeys(k for _, k in fns):
        base, new = best[("pmlp_base", measure)], best[("pmlp_new", measure)]
        print(f"  {measure:20s} {base:8.1f} {new:8.1f}  {new / base:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
