"""Where this process's threads run: the CPU each last ran on, and that CPU's core (Linux /proc
and /sys; elsewhere the readings are empty).

On the H200 host (a VM) a held host-bound eager step ran GPU-bound in one process and took the
host's slower pace in another on the same machine, and autograd's device threads off made the
host 1.5-2x faster: every backward hands over from the main thread to autograd's CUDA thread
("pt_autograd_0") and back. The benchmarks record where those two threads sit beside the host
probe; in the runs of 2026-12-02 they sat on different cores in fast and slow readings alike
(benchmarks/h200-host-speed-stages.txt).
"""

from __future__ import annotations

import os

TASK_DIR = "/proc/self/task"


def thread_cpus(task_dir: str = TASK_DIR) -> dict[int, tuple[str, int]]:
    """{thread id: (name, CPU it last ran on)} of this process's threads, from field 39 of
    each /proc/self/task/<tid>/stat (the name, field 2, may hold spaces and parentheses).
    Empty where there is no such directory."""
    out = {}
    try:
        tids = sorted(os.listdir(task_dir), key=int)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "stat")) as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        after_name = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on
        out[int(tid)] = (name, int(after_name[39 - 3]))
    return out


def core_of(cpu: int) -> str:
    """The physical core a CPU belongs to, as its SMT siblings' list ("?" where unknown)."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return f.read().strip()
    except OSError:
        return "?"


def placement() -> dict[str, object]:
    """The main thread's and autograd's threads' last CPUs with their cores, e.g.
    {"main": [15, "15"], "pt_autograd_0": [0, "0"]} (lists, for JSON); {} where unknown."""
    threads = thread_cpus()
    out: dict[str, object] = {}
    if os.getpid() in threads:  # the main thread's id is the process id
        cpu = threads[os.getpid()][1]
        out["main"] = [cpu, core_of(cpu)]
    for name, cpu in threads.values():
        if name.startswith("pt_autograd"):
            out[name] = [cpu, core_of(cpu)]
    return out


def describe(where: dict[str, object]) -> str:
    """placement() as one line: "main cpu 15 (core 15), pt_autograd_0 cpu 0 (core 0)"."""
    return ", ".join(f"{name} cpu {cpu} (core {core})" for name, (cpu, core) in where.items())
