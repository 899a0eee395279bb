"""parallel_mlp.bench.threads: which CPU each thread last ran on, from /proc."""

import os

from parallel_mlp.bench import threads


def _stat_line(tid: str, name: str, cpu: int) -> str:
    fields = ["S"] + [str(i) for i in range(4, 39)] + [str(cpu), "0", "0"]  # field 39 = cpu
    return f"{tid} ({name}) " + " ".join(fields) + "\n"


def test_reads_each_threads_last_cpu_names_with_spaces_and_parentheses(tmp_path):
    for tid, name, cpu in (("12", "python", 7), ("13", "pt (autograd) 0", 3)):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "stat").write_text(_stat_line(tid, name, cpu))
    assert threads.thread_cpus(str(tmp_path)) == {12: ("python", 7), 13: ("pt (autograd) 0", 3)}


def test_no_proc_reads_empty(tmp_path):
    assert threads.thread_cpus(str(tmp_path / "missing")) == {}


def test_placement_finds_the_main_thread_here():
    if not os.path.isdir(threads.TASK_DIR):
        return  # not Linux: nothing to read, and thread_cpus says so by being empty
    where = threads.placement()
    cpu, core = where["main"]
    assert 0 <= cpu < 4096 and isinstance(core, str)
    assert threads.describe(where).startswith(f"main cpu {cpu} (core ")


def test_describe_lists_every_thread_named():
    assert threads.describe({"main": [15, "15"], "pt_autograd_0": [0, "0,8"]}) == (
        "main cpu 15 (core 15), pt_autograd_0 cpu 0 (core 0,8)")
