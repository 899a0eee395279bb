"""Run a pytest selection as N concurrent pytest processes, and fail if any shard fails.

    python3 tools/pytest_shards.py N [--deadline SECONDS] [pytest args ...]

The GPU tests spend most of their time compiling kernels on the CPU (one at a time per
process), not on the GPU, so on a GPU host with many cores, N shards finish about N times sooner:
that is device time saved. Tests are dealt round-robin over the shards (a test function's
parametrizations, which compile different kernels, spread out); the shards share the on-disk
kernel cache, whose writes are atomic. Each shard's output goes to its own log under
$OUT (or /tmp), and its last lines are printed here.

With --deadline, a shard still running that many seconds after the start is killed and counted
as failed ("timed out"), and every other shard still reports: a kernel that never finishes (a
synchronization bug) costs one shard, not the whole run, and leaves no process behind on the
GPU. The shards run with pytest's faulthandler_timeout set just under the deadline, so a hung
test's traceback, with its name, is in that shard's log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def collect(pytest_args: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *[a for a in pytest_args if a not in ("-q", "-v")]],
        capture_output=True, text=True,
    )
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if out.returncode not in (0, 5) or not ids:
        sys.stdout.write(out.stdout[-3000:] + out.stderr[-3000:])
    return ids


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        print(__doc__, file=sys.stderr)
        return 2
    n, pytest_args = int(argv[0]), argv[1:]
    deadline = None
    if pytest_args[:1] == ["--deadline"]:
        if len(pytest_args) < 2 or not pytest_args[1].replace(".", "", 1).isdigit():
            print("pytest_shards: --deadline takes a number of seconds", file=sys.stderr)
            return 2
        deadline, pytest_args = float(pytest_args[1]), pytest_args[2:]
    ids = collect(pytest_args)
    if not ids:
        print("pytest_shards: nothing collected")
        return 5
    # The selection flags (-m, -k) were applied by the collection; the node ids carry the rest.
    keep = []
    for i, a in enumerate(pytest_args):
        if a in ("-x", "-s") or a.startswith("-p"):
            keep.append(a)
            if a == "-p" and i + 1 < len(pytest_args):
                keep.append(pytest_args[i + 1])  # the plugin option's value
    if deadline is not None:
        # a hung test dumps every thread's traceback into the shard's log before the kill
        keep += ["-o", f"faulthandler_timeout={max(1, int(deadline * 0.9))}"]
    shards = [ids[i::n] for i in range(n)]
    log_dir = Path(os.environ.get("OUT", "/tmp")) / "pytest_shards"
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    procs = []
    for i, shard in enumerate(shards):
        if not shard:
            continue
        log = open(log_dir / f"shard{i}.txt", "w")
        procs.append((i, log, subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", *keep, *shard], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill takes its children too
        )))
    failed = 0
    for i, log, p in procs:
        timed_out = False
        try:
            rc = p.wait(timeout=None if deadline is None else max(0.0, t0 + deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc, timed_out = p.wait(), True
        log.close()
        tail = (log_dir / f"shard{i}.txt").read_text().splitlines()[-(40 if timed_out else 12):]
        print(f"--- shard {i} ({len(shards[i])} tests): " + (f"timed out after {deadline:.0f} s" if timed_out else f"rc={rc}"))
        print("\n".join(tail if rc else tail[-1:]))
        failed += rc != 0
    print(f"pytest_shards: {len(ids)} tests in {len(procs)} shards, {failed} failed, {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
