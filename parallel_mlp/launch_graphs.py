"""CUDA graphs of the fused function's kernel launches, replayed where a call repeats an earlier one.

A step with little GPU work takes the host's time, and much of the fused function's host time is
its launches: for each kernel the op's Python (the plan, the packed argument structs, a ctypes
call into the launcher) and, before a stream-K or dynamic-scheduler kernel, a workspace
allocation and a memset. The function groups its launches (the forward's two kernels; the
backward's dact, with fc2's weight gradient where that accumulates in place, else the two
apart; fc1's weight gradient with dx) and runs each group through ``LaunchGraphs.run``,
which replays a CUDA graph of the group when it has one.

Why a replay is exact: a graph replays the launches it captured, the same kernels with the same
arguments. So a group may replay a graph when every tensor it reads or writes sits where the
captured group's did (pointer, shape, strides, dtype) and the ops and options are the same: that
tuple is the graph's key, which the caller builds (``tensor_key``). The caller allocates the
group's outputs before it, from the caching allocator as always, so nothing the caller sees lives
in a graph's memory; a training loop of fixed shapes gets the same addresses back step after step,
so its keys repeat. A captured group allocates nothing: the launches' transient workspace
(stream-K partial sums and flags, a tile counter; zeroed by memset nodes as the launches zero it)
is a slice of one buffer per device and stream, made between captures and held by the graphs
captured with it. The graphs of a stream can share it since a replay's workspace is dead when the
replay ends and replays on one stream run one after another. (An allocation inside a capture
would go to whichever pool routes the thread's allocations, a ``torch.cuda.use_mem_pool`` of the
caller's before the graph's own, and that pool could hand the block to another tensor while the
graph still writes it at each replay; a capture that allocates fails.)

What it holds: besides the shared workspace buffer, nothing in the caching allocator; the
instantiated graphs hold device memory of their own, outside it: about 71 MiB the first time a
process keeps graphs and about 115 KiB a graph after that (H200, torch 2.11, 2026-12-04,
``tools/graph_memory_probe.py``: 100 MiB for 256 graphs, 186 MiB for 1024), bounded by
``MAX_GRAPHS``.

When it runs: by default (``PARALLEL_MLP_LAUNCH_GRAPHS=0`` in the environment, or
``GRAPHS.enabled = False``, turns it off), at one rank without biases on the CuTe kernels
(autograd.py says which calls make groups). A key is captured the second time it is seen; a key
seen once costs a lookup. At most ``MAX_GRAPHS`` graphs are kept. When they are all kept, the
least recently replayed one makes room for a new key only once it has gone ``MAX_IDLE_RUNS``
group runs without a replay; until then the new key runs without a graph. Plain
least-recently-used dropping would thrash where a loop's keys outnumber the bound (many layers,
micro-batches in flight): each key dropped before it comes round again, and captured anew each
time, 0.8-0.9 ms of host time a capture (H200, 2026-12-04), where now the bound's worth of keys
replay and the rest run plainly; graphs whose keys a changed shape left behind still give way
after that many runs. A site (a group's kind and options: its ops, activation, memory mode, device and stream,
not its tensors) that has seen ``MAX_MISSES`` new keys without one replay turns off
(``site_off``), and the function then launches that site's kernels one by one as before, since a
group whose keys never repeat costs more host time than those launches (its outputs are made
ahead, its key built, and the graphs' bookkeeping done, for nothing replayed). The bound is
loose enough for every layer of a deep model to meet its site in the first step before the
second step replays. The launches
run as usual, uncaptured, while the current stream is being captured by someone else (they go
into that graph, as they always did). A capture runs with Python's garbage collector paused
(``_collector_paused``). A capture that fails turns the graphs off for the process, with a
warning that names the launches' own error, and leaves torch's CUDA RNG usable and the
allocator's routing to the capture's pool ended (``_end_capture``): the launches then run one
by one.

Measured (H200, 2026-12-03, a slow host: a tiny eager step's host time 742 µs): held 0.3 s x 6
in alternating turns (``python3 tools/launch_graphs_ab.py``), the fused step with its groups
replayed against the same step launched one by one took 0.782 against 0.826 ms at T=8192
d=1024 swiglu h=2816 (eager 0.986), 0.719 against 0.869 at T=2048 d=2048 swiglu, 0.681 against
0.822 at T=512 d=1024 swiglu, 0.548 against 0.727 at T=4096 d=1024 gelu_tanh_approx, and 1.319
against 1.322 at the GPU-bound T=8192 d=2048 gelu_tanh_approx; host µs per step back to back
527 against 735 at T=8192 d=1024 (eager 535). The GPU tests (``tests/test_layer_gpu.py -k
launch_graphs``) replay the launches' bits (dx, both weight gradients, y; default, recompute
and main_grad modes; under a caller's MemPool too) at a requested step peak no higher, and
refuse a capture that allocates.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
import os
import threading
import warnings
from typing import Callable, Hashable

import torch

log = logging.getLogger(__name__)

ENV = "PARALLEL_MLP_LAUNCH_GRAPHS"
MAX_GRAPHS = 2048
MAX_IDLE_RUNS = 2 * MAX_GRAPHS  # group runs without a replay before a kept graph may give way
MAX_MISSES = 1024
_SEEN_LIMIT = 4 * MAX_GRAPHS  # keys seen once, remembered (oldest forgotten first)


def enabled_by_env() -> bool:
    """PARALLEL_MLP_LAUNCH_GRAPHS: "1" (or unset) on, "0" off; anything else is refused, as the
    other PARALLEL_MLP_ switches refuse theirs (fused_act.mode)."""
    value = os.environ.get(ENV, "1").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={value!r}: must be 0 or 1")
    return value == "1"


def tensor_key(t: torch.Tensor) -> tuple:
    """What a launch reads of a tensor: its address, sizes, strides and dtype."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


class _Site:
    __slots__ = ("misses", "replays", "off")

    def __init__(self):
        self.misses = 0
        self.replays = 0
        self.off = False


class LaunchGraphs:
    """Graphs of launch groups by key (see the module's docstring). ``capture(launches, device)``
    makes a graph of ``launches`` without running it, ``replay(graph, launches)`` runs one (the
    launches of the call that replays it are there for stand-ins: a CUDA graph needs none), and
    ``capturing()`` says whether the current stream is being captured; tests pass their own."""

    def __init__(self, capture: Callable | None = None, replay: Callable | None = None,
                 capturing: Callable[[], bool] | None = None, max_graphs: int = MAX_GRAPHS,
                 max_misses: int = MAX_MISSES, max_idle_runs: int = MAX_IDLE_RUNS):
        self._capture = capture or _capture_cuda_graph
        self._replay = replay or _replay_cuda_graph
        self._capturing = capturing or torch.cuda.is_current_stream_capturing
        self.max_graphs = max_graphs
        self.max_misses = max_misses
        self.max_idle_runs = max_idle_runs
        self._runs = 0  # calls of run(), the clock of a graph's idleness
        # key -> [graph, its site's state, the run that last replayed it], least recent first
        self._graphs: collections.OrderedDict = collections.OrderedDict()
        self._seen: collections.OrderedDict = collections.OrderedDict()
        self._sites: dict = {}
        self._lock = threading.Lock()
        self.enabled = enabled_by_env()
        # replays, captures, plain runs ("no room" among them: seen before, kept out by the
        # bound), capture failures
        self.stats = collections.Counter()

    def run(self, site: Hashable, key: Hashable, launches: Callable[[], None],
            device: torch.device) -> None:
        """Run ``launches`` (which launch kernels into tensors that exist already, allocating
        nothing the caller keeps), or replay the graph of an earlier call with the same key.
        ``site`` names the group without its tensors' addresses; ``key`` must include it."""
        self._runs += 1
        entry = self._graphs.get(key) if self.enabled else None
        if entry is not None:
            graph, state, _ = entry
            entry[2] = self._runs
            self._replay(graph, launches)
            state.replays += 1
            self.stats["replays"] += 1
            try:
                self._graphs.move_to_end(key)
            except KeyError:  # dropped meanwhile by another thread
                pass
            return
        state = self._sites.get(site)
        if state is None:
            state = self._sites.setdefault(site, _Site())
        if not self.enabled or state.off or self._capturing():
            self.stats["plain"] += 1
            launches()
            return
        with self._lock:
            capture = key in self._seen and self._make_room()
            if capture:
                del self._seen[key]
            elif key not in self._seen:
                state.misses += 1
                if state.replays == 0 and state.misses >= self.max_misses:
                    state.off = True
                self._seen[key] = None
                if len(self._seen) > _SEEN_LIMIT:
                    self._seen.popitem(last=False)
            else:  # seen before, no room yet: it stays seen, asked again at its next sighting
                self.stats["no room"] += 1
        if not capture:
            self.stats["plain"] += 1
            launches()
            return
        try:
            graph = self._capture(launches, device)
        except Exception as e:  # not capturable here: launch by launch from now on
            state.off = True
            self.enabled = False
            self.stats["capture failures"] += 1
            log.warning("parallel_mlp: launch graphs turned off: capturing %s failed (%s: %s)",
                        site[0] if isinstance(site, tuple) else site, type(e).__name__, e)
            launches()
            return
        self.stats["captures"] += 1
        self._replay(graph, launches)  # a capture runs nothing: its first replay does
        state.replays += 1
        self.stats["replays"] += 1
        with self._lock:
            self._graphs[key] = [graph, state, self._runs]
            while len(self._graphs) > self.max_graphs:  # another thread's capture meanwhile
                self._graphs.popitem(last=False)

    def _make_room(self) -> bool:
        """Whether a new graph may be kept (called with the lock held): the bound is not
        reached, or the least recently replayed graph has gone max_idle_runs runs without a
        replay (then it is dropped)."""
        if len(self._graphs) < self.max_graphs:
            return True
        oldest = next(iter(self._graphs), None)
        if oldest is None or self._runs - self._graphs[oldest][2] <= self.max_idle_runs:
            return False  # (None: max_graphs is 0)
        del self._graphs[oldest]
        return True

    def site_off(self, site: Hashable) -> bool:
        """Whether groups of this site should not be made at all: the graphs are off, or the
        site gave up (its keys never repeated)."""
        if not self.enabled:
            return True
        state = self._sites.get(site)
        return state is not None and state.off

    def clear(self) -> None:
        with self._lock:
            self._graphs.clear()
            self._seen.clear()
            self._sites.clear()
            self.stats.clear()
            self._runs = 0
            _workspaces.clear()  # each graph holds its own; the next capture makes a new one

    def __len__(self) -> int:
        return len(self._graphs)


# Per thread, device index -> the side stream that thread captures on: two threads capturing at
# once (thread-local capture mode) must not capture into one stream.
_side_streams = threading.local()
# (device index, stream) -> the int32 buffer that the graphs captured for that stream take their
# launches' workspace from (the tile counter, stream-K's partial sums and flags). One buffer serves
# them all, as one pool would: a replay's workspace is dead when it ends, and replays on one stream
# run one after another. Each graph holds the buffer it was captured with (``graph.workspace``), so
# growing the buffer for a larger group leaves the earlier graphs theirs.
_workspaces: dict = {}
WORKSPACE_ALIGN = 128  # int32 words (512 B), the alignment of the caching allocator's own blocks


class _WorkspaceFull(Exception):
    """The group needs more workspace than the buffer holds: capture again with a larger one."""


class _Workspace:
    """Hands a capture's launches consecutive, aligned slices of one buffer, in launch order."""

    def __init__(self, buffer: torch.Tensor | None):
        self.buffer = buffer
        self.used = 0  # words handed out so far, alignment included

    def take(self, words: int, device: torch.device) -> torch.Tensor:
        start = self.used
        self.used = start + -(-words // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        if self.buffer is None or self.used > self.buffer.numel():
            raise _WorkspaceFull()
        return self.buffer[start:start + words]


def capture_with_workspace(capture_once: Callable, slot: Hashable, device: torch.device):
    """``capture_once(take)`` captures a group with its launches' workspace from ``take`` (see
    ops.workspace_from); captured again with a larger buffer (twice the last, at least what the
    launches asked for so far) while the buffer of ``slot`` is too small. The buffer is allocated
    between captures, never during one; the graph keeps a reference to it."""
    while True:
        workspace = _Workspace(_workspaces.get(slot))
        try:
            graph = capture_once(workspace.take)
        except _WorkspaceFull:
            size = 0 if workspace.buffer is None else workspace.buffer.numel()
            _workspaces[slot] = torch.empty(max(2 * size, workspace.used), dtype=torch.int32,
                                            device=device)
            continue
        graph.workspace = workspace.buffer
        return graph


def _allocations(index: int) -> int:
    """How many allocations the caching allocator has made on this device, ever. Read from the
    nested stats, which ``torch.cuda.memory_stats`` flattens in Python, every statistic of the
    allocator, for each of a capture's two reads: read so, a capture took 0.76-0.92 ms of wall
    time against 0.88-1.10 (H200 host, 2026-12-04, ``tools/launch_key_churn.py``)."""
    counts = torch.cuda.memory_stats_as_nested_dict(index).get("allocation", {}).get("all", {})
    return counts.get("allocated", 0)


def _capture_cuda_graph(launches: Callable[[], None], device: torch.device):
    """A torch.cuda.CUDAGraph of ``launches`` on the current stream's behalf: captured on a side
    stream (the legacy default stream cannot be captured), in this thread's capture mode alone
    (other threads keep running), allocating nothing: the launches' workspace comes from the
    stream's buffer (capture_with_workspace). An allocation during the capture is refused (the
    capture fails, and the graphs turn off), since a pool of the caller's (torch.cuda.use_mem_pool)
    would have taken it and could give it to another tensor between replays."""
    from .kernels import ops

    index = device.index if device.index is not None else torch.cuda.current_device()
    current = torch.cuda.current_stream(index)
    streams = _side_streams.__dict__
    side = streams.get(index)
    if side is None:
        side = streams[index] = torch.cuda.Stream(index)

    def capture_once(take):
        graph = torch.cuda.CUDAGraph()
        # a pool named here (as make_graphed_callables names its own), so that a failed
        # capture's allocator routing can be taken down (_end_capture)
        pool = torch.cuda.graph_pool_handle()
        side.wait_stream(current)
        try:
            with torch.cuda.stream(side), _collector_paused():
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    # counted after capture_begin, which allocates the graph's RNG seed and offset
                    # (16 bytes that the graph holds)
                    before = _allocations(index)
                    with ops.workspace_from(take):
                        launches()
                    allocated = _allocations(index) != before
                except BaseException:
                    # The launches' own error is the one to report (a _WorkspaceFull included):
                    # the capture is ended, and whatever ending an invalidated capture raises
                    # is dropped, torch's RNG state put right.
                    _end_capture(graph, side, index, pool, quiet=True)
                    raise
                _end_capture(graph, side, index, pool, quiet=False)
        finally:
            current.wait_stream(side)
        if allocated:
            raise RuntimeError("the launches allocated device memory while being captured")
        return graph

    return capture_with_workspace(capture_once, (index, current.cuda_stream), device)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the length of a capture: a collection there
    runs arbitrary destructors in this thread, and destroying another CUDA graph inside a capture
    invalidates it (reproduced on the H200, 2026-12-04; it failed one of 375 GPU tests run after
    a test whose torch.cuda.make_graphed_callables graphs sat in reference cycles).
    torch.cuda.graph collects before capturing instead, which costs milliseconds."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _end_capture(graph, stream, index: int, pool, quiet: bool) -> None:
    """End ``graph``'s capture on ``stream``. Where the capture was invalidated (a launch did
    something a capture cannot hold), torch's capture_end raises before it takes down what
    capture_begin set up: the caching allocator's routing of the capture's allocations to its
    pool, and the CUDA RNG generators' capture mode. Left so, every later random op of the
    process failed ("Offset increment outside graph capture"), and leaving a caller's
    ``use_mem_pool`` aborted the process (H200, 2026-12-04; the stale routing is the likely
    cause). Both are taken down here, as a capture that ended and its graph's release would
    have (the RNG's part checked on the H200, the routing's not yet), then the error is
    raised, or dropped with ``quiet``."""
    try:
        _capture_end(graph)
    except Exception:
        _release_pool(index, pool)
        _release_generators(stream)
        if not quiet:
            raise


def _release_pool(index: int, pool) -> None:
    """The allocator's routing to ``pool`` ended and the capture's reference to it dropped (what
    capture_end and the graph's release do); nothing of a torch whose capture_end got that far."""
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except RuntimeError:  # not routing to it any more
        return
    torch._C._cuda_releasePool(index, pool)


def _release_generators(stream) -> None:
    empty = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        empty.capture_begin(capture_error_mode="thread_local")
        _capture_end(empty)


def _capture_end(graph) -> None:
    with warnings.catch_warnings():
        # empty on purpose (_release_generators), or cut short by _WorkspaceFull before its
        # first launch (a group's whole capture never is): dropped, and captured again
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        graph.capture_end()


def _replay_cuda_graph(graph, launches) -> None:
    graph.replay()


# The fused function's graphs, one set for the process.
GRAPHS = LaunchGraphs()
