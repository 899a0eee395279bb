"""The ``cold`` section: a new process's time to its first fwd+bwd (import, CUDA context, model
build, the kernels loaded from the on-disk cache), ours and ParallelMLP's torch backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .harness import Ctx, attempt, log
from .models import config_label

# Run in a fresh interpreter: import, build the MLP, one fwd+bwd; times are from the parent's
# launch (PMLP_T0) so interpreter start and `import torch` count too, as a user sees them.
# build "device": parameters made and initialised on the GPU, as Megatron and Nanotron build;
# build "meta": on the meta device, then to_empty + init, as FSDP-style code does. torch's first
# meta op imports its meta registrations and sympy (~0.3 s), whatever the backend.
COLD_START_CHILD = r"""
import json, os, sys, time
t0 = float(os.environ["PMLP_T0"])
import torch
t_torch = time.time() - t0
import parallel_mlp
t_import = time.time() - t0
act, h, d, T, backend, device, dtype, build = sys.argv[1:9]
h, d, T, dtype = int(h), int(d), int(T), getattr(torch, dtype)
if device.startswith("cuda"):
    torch.empty(1, device=device)  # the CUDA context, timed on its own
t_cuda = time.time() - t0
if build == "meta":
    m = parallel_mlp.ParallelMLP(d, h, activation=act, backend=backend, device="meta", dtype=dtype)
    m = m.to_empty(device=device)
    m.reset_parameters()
else:
    m = parallel_mlp.ParallelMLP(d, h, activation=act, backend=backend, device=device, dtype=dtype)
x = torch.randn(T, d, device=device, dtype=dtype, requires_grad=True)
dy = torch.randn(T, d, device=device, dtype=dtype)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t_ready = time.time() - t0
prof_path = os.environ.get("PMLP_COLD_PROFILE")
if prof_path:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
y = m(x)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t_fwd = time.time() - t0
# A scalar loss whose gradient at y is dy, as a training step backpropagates: backward(dy) with
# an explicit gradient would make torch import sympy (~0.4 s) on the way, whatever the backend.
(y * dy).sum().backward()
if device.startswith("cuda"):
    torch.cuda.synchronize()
t_first = time.time() - t0
if prof_path:
    prof.disable()
    prof.dump_stats(prof_path)
print("PMLP_COLD_START " + json.dumps(dict(torch_import_s=t_torch, import_s=t_import, cuda_init_s=t_cuda,
                                           ready_s=t_ready, first_fwd_s=t_fwd, first_fwd_bwd_s=t_first,
                                           sympy_imported="sympy" in sys.modules)))
"""


def cold_start_once(ctx: Ctx, backend: str, act: str, h: int, timeout: float,
                    profile: str | None = None, build: str = "device") -> dict:
    """One fresh interpreter; with `profile`, a cProfile of its first fwd+bwd is written there;
    `build` is where the model is made ("device" or "meta", see COLD_START_CHILD)."""
    repo_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PMLP_T0=repr(time.time()))
    env.pop("PMLP_COLD_PROFILE", None)
    if profile:
        env["PMLP_COLD_PROFILE"] = profile
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    dtype = str(ctx.dtype).removeprefix("torch.")
    argv = [sys.executable, "-c", COLD_START_CHILD, act, str(h), str(ctx.d_model),
            str(ctx.tokens), backend, str(ctx.device), dtype, build]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=repo_root, capture_output=True, text=True,
                          timeout=timeout, check=False)
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith("PMLP_COLD_START "):
            return json.loads(line.split(" ", 1)[1]) | {"process_wall_s": wall}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"cold-start child exited {proc.returncode}: {' | '.join(tail)}")


def bench_cold_start(ctx: Ctx, backend: str) -> dict:
    """Twice: the first run may fill the on-disk kernel cache, the second is what a new training
    process pays with the cache warm, and is the number reported. Then once more with the model
    built on the meta device, reported beside it (torch's meta setup is most of the difference)."""
    act, h = ctx.cold_start_config
    # PMLP_COLD_PROFILE_DIR=DIR: also write DIR/cold_start_<backend>.prof (cProfile of the warm
    # run's first fwd+bwd), to see where a new process spends its time.
    prof_dir = os.environ.get("PMLP_COLD_PROFILE_DIR")
    runs = []
    for i in range(2):
        timeout = max(10.0, min(180.0, ctx.time_left()))
        profile = str(Path(prof_dir) / f"cold_start_{backend}.prof") if prof_dir and i == 1 else None
        runs.append(cold_start_once(ctx, backend, act, h, timeout, profile))
    timeout = max(10.0, min(180.0, ctx.time_left()))
    meta = cold_start_once(ctx, backend, act, h, timeout, build="meta")
    return {"config": config_label(act, h), "backend": backend, "runs": runs,
            "first_fwd_bwd_s": runs[-1]["first_fwd_bwd_s"], "meta_build": meta}


def section_cold_start(ctx: Ctx, results: dict) -> None:
    out = results.setdefault("cold_start", {})
    backends = [ctx.backend] + (["torch"] if ctx.backend != "torch" else [])
    for backend in backends:  # torch too: how much of the time is Python, torch and CUDA init
        log(f"cold start ({backend})")
        if backend != "torch" and ctx.ours is None:
            out[backend] = {"unavailable": ctx.ours_reason}
            continue
        out[backend] = attempt(ctx, f"cold start {backend}", bench_cold_start, ctx, backend,
                               min_time_s=10.0)
        ctx.checkpoint()
