"""Run a test body in several processes that form a real gloo process group (no mocks)."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import subprocess
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_TEARDOWNS: list = []


def at_teardown(fn) -> None:
    """Call ``fn()`` when this rank's test body ends, before the process group is destroyed: for
    state a test body builds over the group that module globals keep (Megatron's parallel state
    holds a dozen subgroups, each with its own gloo threads)."""
    _TEARDOWNS.append(fn)


def _entry(rank, world_size, port, backend, fn, args, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # several ranks share two cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        while _TEARDOWNS:
            _TEARDOWNS.pop()()
        # Whatever still refers to the group from a reference cycle (a caught exception's
        # traceback holds the test body's frame, and with it its modules, meshes and DTensors)
        # goes now, so the group's gloo threads stop inside destroy_process_group() and not
        # during interpreter shutdown, which can abort ("terminate called without an active
        # exception"). Groups held by module globals are released by the at_teardown calls above.
        gc.collect()
        dist.destroy_process_group()
    # The body passed and the group is destroyed: leave without the interpreter's shutdown, in
    # which destructors of state the frameworks keep in module globals have aborted a rank after
    # its work was done and checked.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_distributed(world_size: int, fn, *args, backend: str = "gloo") -> None:
    """Call ``fn(rank, world_size, *args)`` on every rank of a fresh process group (gloo on the
    CPU; nccl with one GPU per rank); re-raise a rank's failure with its traceback. ``fn`` must
    be a module-level function."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    try:
        mp.start_processes(_entry, args=(world_size, free_port(), backend, fn, args, errors),
                           nprocs=world_size, join=True, start_method="spawn")
    except Exception as e:
        details = []
        while not errors.empty():
            rank, tb = errors.get()
            details.append(f"--- rank {rank} ---\n{tb}")
        raise AssertionError("distributed test failed:\n" + "\n".join(details)) from e


@contextlib.contextmanager
def counting_block_reduce_scatters():
    """A list that gets one entry per GEMM the layer runs with tp_comm_overlap's block-by-block
    reduce-scatter (parallel_mlp.overlap.gemm_reduce_scatter), while the context is open: how the
    tests see that the overlap ran rather than only that the results agree."""
    from parallel_mlp import overlap

    calls, real = [], overlap.gemm_reduce_scatter

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    overlap.gemm_reduce_scatter = counting
    try:
        yield calls
    finally:
        overlap.gemm_reduce_scatter = real


def torchrun_command(nproc: int, script, *args) -> list[str]:
    """torchrun (as ``python -m torch.distributed.run``) of ``script`` on ``nproc`` local ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), str(script), *map(str, args)]


def run_on_cpu(cmd: list[str], cwd, **env) -> str:
    """Run ``cmd`` with no GPU visible and one thread per process (several ranks share two
    cores); returns stdout and stderr together, and fails with their tail if it exits non-zero."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **env)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-4000:]}"
    return out
