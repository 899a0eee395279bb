"""launch_graphs: when a launch group is run, captured or replayed (with stand-ins for CUDA
graphs), and the fused function's launch groups on the CPU against the launch-by-launch path.
The CUDA graphs themselves are tested on the GPU (test_layer_gpu.py)."""

import weakref
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parallel_mlp import ParallelMLP, autograd, backends
from parallel_mlp.activations import get_activation
from parallel_mlp.launch_graphs import ENV, LaunchGraphs


class Recorder:
    """Stand-ins for capture and replay that record what happened; a replay runs the calling
    group's launches, as a CUDA graph of the same launches into the same addresses would."""

    def __init__(self, fail=False):
        self.captured, self.replayed, self.fail = [], [], fail

    def capture(self, launches, device):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captured.append(type(launches).__name__)  # not the launches: a CUDA graph keeps
        return f"graph {len(self.captured)}"            # no reference to their tensors

    def replay(self, graph, launches):
        self.replayed.append(graph)
        launches()

    def graphs(self, **kw):
        graphs = LaunchGraphs(capture=self.capture, replay=self.replay, capturing=lambda: False, **kw)
        graphs.enabled = True
        return graphs


def _counting():
    calls = []
    return calls, lambda: calls.append(1)


def test_a_key_is_captured_the_second_time_and_replayed_after():
    rec = Recorder()
    graphs = rec.graphs()
    calls, launches = _counting()
    for _ in range(4):
        graphs.run("site", ("site", 1), launches, None)
    assert len(rec.captured) == 1 and rec.replayed == ["graph 1"] * 3
    assert len(calls) == 4  # plain, then three replays (the stand-in runs the launches)
    assert graphs.stats == {"plain": 1, "captures": 1, "replays": 3}
    graphs.run("site", ("site", 2), launches, None)  # another key: plain again
    assert len(rec.captured) == 1 and graphs.stats["plain"] == 2


def test_graphs_are_kept_up_to_a_bound_least_recently_replayed_dropped():
    """With no idle runs asked of the graph that gives way: least recently replayed first."""
    rec = Recorder()
    graphs = rec.graphs(max_graphs=2, max_idle_runs=0)
    for key in (1, 1, 2, 2):
        graphs.run("site", key, lambda: None, None)
    graphs.run("site", 1, lambda: None, None)  # replay: 1 is now the most recent
    for _ in range(2):
        graphs.run("site", 3, lambda: None, None)
    assert len(graphs) == 2 and len(rec.captured) == 3
    graphs.run("site", 1, lambda: None, None)
    assert rec.replayed[-1] == "graph 1"
    graphs.run("site", 2, lambda: None, None)  # dropped: seen afresh, not replayed
    assert rec.replayed[-1] == "graph 1"


def test_keys_that_outnumber_the_bound_replay_the_bound_and_do_not_thrash():
    """Six keys in a loop, four graphs kept: least-recently-used dropping would capture two
    keys a round for ever; with the idle rule the kept four replay and the other two run
    without a graph, with no capture after the first rounds."""
    rec = Recorder()
    graphs = rec.graphs(max_graphs=4, max_idle_runs=8)
    for _ in range(3):
        for key in range(6):
            graphs.run("site", key, lambda: None, None)
    captured = len(rec.captured)
    graphs.stats.clear()
    for _ in range(10):
        for key in range(6):
            graphs.run("site", key, lambda: None, None)
    assert len(rec.captured) == captured == 4 and len(graphs) == 4
    assert graphs.stats == {"replays": 40, "plain": 20, "no room": 20}
    assert not graphs.site_off("site")


def test_graphs_left_idle_past_the_limit_give_way_to_new_keys():
    """Keys 0-3 kept; then the loop moves to keys 10-13 (a changed shape): once the old graphs
    have gone max_idle_runs runs without a replay, the new keys are captured and replay."""
    rec = Recorder()
    graphs = rec.graphs(max_graphs=4, max_idle_runs=8)
    for _ in range(2):
        for key in range(4):
            graphs.run("site", key, lambda: None, None)
    assert len(rec.captured) == 4
    for _ in range(4):
        for key in range(10, 14):
            graphs.run("site", key, lambda: None, None)
    assert len(rec.captured) == 8 and len(graphs) == 4
    replayed = len(rec.replayed)
    for key in range(10, 14):
        graphs.run("site", key, lambda: None, None)
    assert len(rec.replayed) == replayed + 4
    graphs.run("site", 0, lambda: None, None)  # dropped: seen afresh
    assert len(rec.replayed) == replayed + 4


def test_no_graph_is_kept_with_a_bound_of_zero():
    rec = Recorder()
    graphs = rec.graphs(max_graphs=0)
    for _ in range(3):
        graphs.run("site", 1, lambda: None, None)
    assert rec.captured == [] and graphs.stats["plain"] == 3


def test_a_site_whose_keys_never_repeat_stops_looking():
    rec = Recorder()
    graphs = rec.graphs(max_misses=3)
    for key in range(3):
        graphs.run("site", key, lambda: None, None)
    for _ in range(3):  # a repeating key now finds the site given up: nothing captured
        graphs.run("site", 0, lambda: None, None)
    assert rec.captured == [] and graphs.stats["plain"] == 6 and graphs.site_off("site")
    graphs.run("other", 0, lambda: None, None)
    graphs.run("other", 0, lambda: None, None)
    assert len(rec.captured) == 1  # other sites are their own


def test_every_layer_of_a_deep_model_meets_its_site_before_the_second_step_replays():
    """One site, 200 layers' keys in the first step: none turned away before the second step's
    captures (the default bound is loose enough), and the third step replays them all."""
    rec = Recorder()
    graphs = rec.graphs()
    for _step in range(3):
        for layer in range(200):
            graphs.run("site", layer, lambda: None, None)
    assert len(rec.captured) == 200 and graphs.stats["replays"] == 400
    assert not graphs.site_off("site")


def test_a_site_that_replays_keeps_looking_for_new_keys():
    rec = Recorder()
    graphs = rec.graphs(max_misses=2)
    for key in (0, 0, 1, 2, 3, 3):
        graphs.run("site", key, lambda: None, None)
    assert len(rec.captured) == 2


def test_a_failed_capture_runs_the_launches_and_turns_the_graphs_off(caplog):
    rec = Recorder(fail=True)
    graphs = rec.graphs()
    calls, launches = _counting()
    with caplog.at_level("WARNING", logger="parallel_mlp.launch_graphs"):
        for _ in range(4):
            graphs.run("site", 0, launches, None)
    assert len(calls) == 4 and len(graphs) == 0 and not graphs.enabled
    assert graphs.stats == {"plain": 3, "capture failures": 1}
    assert "launch graphs turned off" in caplog.text and "RuntimeError" in caplog.text


def test_under_someone_elses_capture_the_launches_run_plainly():
    rec = Recorder()
    graphs = LaunchGraphs(capture=rec.capture, replay=rec.replay, capturing=lambda: True)
    graphs.enabled = True
    calls, launches = _counting()
    for _ in range(3):
        graphs.run("site", 0, launches, None)
    assert len(calls) == 3 and rec.captured == [] and graphs.stats == {"plain": 3}


@pytest.mark.parametrize("value, on", [(None, True), ("0", False), ("1", True), ("", True)])
def test_on_unless_the_environment_turns_them_off(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    rec = Recorder()
    graphs = LaunchGraphs(capture=rec.capture, replay=rec.replay, capturing=lambda: False)
    assert graphs.enabled is on
    for _ in range(3):
        graphs.run("site", 0, lambda: None, None)
    assert len(rec.captured) == on and graphs.stats["plain"] == (1 if on else 3)


# ---- the fused function's launch groups, on the CPU --------------------------------------


class GroupOps(backends.TorchBackend):
    """The torch backend's math (which honours every out= the groups pass) under a name of its
    own, so that the function takes its launch groups on CPU tensors; records each op."""

    name = "groups"
    calls: list = []
    workspace = {}  # (m, n, k) -> transient bytes
    dact_inputs: list = []

    @staticmethod
    def _ops():
        return SimpleNamespace(_stream_handle=lambda index: 0, _config_rewrite=None)

    @staticmethod
    def on_cublas(a, b, out, accumulate=False):
        return False

    @classmethod
    def transient_bytes(cls, m, n, k, device):
        return cls.workspace.get((m, n, k), 0)

    @classmethod
    def gemm(cls, a, b, out=None, out_dtype=None, accumulate=False, whole_rows=None, replay=False):
        # after the dact: whether its preact and postact are alive still (None: no dact yet)
        alive = [r() is not None for r in cls.dact_inputs]
        cls.calls.append(("gemm", tuple(a.shape), tuple(b.shape), accumulate, alive))
        return backends.TorchBackend.gemm(a, b, out=out, out_dtype=out_dtype,
                                          accumulate=accumulate, replay=replay)

    @classmethod
    def gemm_act(cls, *args, **kw):
        cls.calls.append(("gemm_act", kw.get("out_postact") is not None))
        return backends.TorchBackend.gemm_act(*args, **kw)

    @classmethod
    def gemm_dact(cls, a, b, preact, activation, **kw):
        cls.calls.append(("gemm_dact",))
        if kw.get("out_postact") is not None:  # the groups pass it (launch by launch: none)
            cls.dact_inputs = [weakref.ref(preact), weakref.ref(kw["out_postact"])]
        return backends.TorchBackend.gemm_dact(a, b, preact, activation, **kw)


@pytest.fixture
def groups(monkeypatch):
    """The function on GroupOps with its launch groups on, through recording stand-ins for
    CUDA graphs whose keys ignore addresses (so that every group is captured, then replayed)."""
    rec = Recorder()
    graphs = rec.graphs()
    run = graphs.run
    monkeypatch.setattr(graphs, "run", lambda site, key, launches, device: run(site, site, launches, device))
    monkeypatch.setattr(autograd, "GRAPHS", graphs)
    resolve = autograd.resolve
    monkeypatch.setattr(autograd, "resolve", lambda backend, *tensors: (
        GroupOps if backend == "cute" else resolve(backend, *tensors)))
    monkeypatch.setattr(autograd, "_kernels_here", lambda ops, x2d: ops is GroupOps)
    GroupOps.calls, GroupOps.workspace, GroupOps.dact_inputs = [], {}, []
    return SimpleNamespace(graphs=graphs, rec=rec)


def _pair(act, recompute=False, fuse=False, **kw):
    torch.manual_seed(0)
    ours = ParallelMLP(16, 24, activation=act, recompute=recompute, fuse_grad_accum=fuse,
                       backend="cute", **kw)
    ref = ParallelMLP(16, 24, activation=act, recompute=recompute, fuse_grad_accum=fuse,
                      backend="torch", **kw)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _step(mlp, x, dy):
    x = x.detach().clone().requires_grad_(x.requires_grad)
    y = mlp(x)
    y.backward(dy)
    return y.detach(), x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("recompute", [False, True])
def test_groups_give_the_launch_by_launch_results(groups, act, recompute):
    ours, ref = _pair(act, recompute)
    x, dy = torch.randn(2, 9, 16, requires_grad=True), torch.randn(2, 9, 16)
    for _ in range(3):  # plain, captured, replayed
        ours.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        for a, b in zip(_step(ours, x, dy), _step(ref, x, dy)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert groups.graphs.stats["replays"] > 0 and groups.graphs.stats["captures"] == 4
    first = [c[0] for c in GroupOps.calls[:6 + recompute]]
    assert first == (["gemm_act", "gemm"] + ["gemm"] * recompute
                     + ["gemm_dact", "gemm", "gemm", "gemm"])


def test_groups_accumulate_into_main_grad_and_dot_grad(groups):
    ours, ref = _pair("swiglu", fuse=True)
    for mlp in (ours, ref):
        mlp.fc1.weight.main_grad = torch.zeros(mlp.fc1.weight.shape)
        mlp.fc1.weight.grad_added_to_main_grad = False
        mlp.fc1.weight.zero_out_wgrad = True
        mlp.fc2.weight.grad = torch.ones(mlp.fc2.weight.shape)  # no main_grad: into .grad
    x, dy = torch.randn(9, 16, requires_grad=True), torch.randn(9, 16)
    for _ in range(3):
        a, b = _step(ours, x, dy), _step(ref, x, dy)
        for t, u in zip(a, b):
            torch.testing.assert_close(t, u, rtol=0, atol=0)
    torch.testing.assert_close(ours.fc1.weight.main_grad, ref.fc1.weight.main_grad, rtol=0, atol=0)
    assert ours.fc1.weight.grad_added_to_main_grad
    assert torch.count_nonzero(ours.fc1.weight.grad) == 0  # the zeroed dummy DDP's hook sees
    accumulated = [c for c in GroupOps.calls if c[0] == "gemm" and c[3]]
    assert len(accumulated) == 6  # both wgrads of every step accumulated in place


@pytest.mark.parametrize("workspace, order", [
    ({}, ["dW1", "dx"]),                          # one group: dW1 then dx
    ({(9, 16, 48): 1 << 20}, ["dx", "dW1"]),      # dx's workspace the larger: it goes first
    ({(48, 16, 9): 1 << 20}, ["dW1", "dx"]),
])
def test_fc1s_weight_gradient_and_dx_in_the_workspace_order(groups, workspace, order):
    GroupOps.workspace = workspace
    ours, ref = _pair("swiglu")
    x, dy = torch.randn(9, 16, requires_grad=True), torch.randn(9, 16)
    for t, u in zip(_step(ours, x, dy), _step(ref, x, dy)):
        torch.testing.assert_close(t, u, rtol=0, atol=0)
    last_two = GroupOps.calls[-2:]
    names = ["dW1" if c[1] == (48, 9) else "dx" for c in last_two]
    assert names == order


@pytest.mark.parametrize("frozen", ["x", "fc1", "fc2"])
def test_groups_with_frozen_inputs(groups, frozen):
    ours, ref = _pair("swiglu")
    x, dy = torch.randn(9, 16, requires_grad=frozen != "x"), torch.randn(9, 16)
    for mlp in (ours, ref):
        if frozen != "x":
            getattr(mlp, frozen).weight.requires_grad_(False)
    for t, u in zip(_step(ours, x, dy), _step(ref, x, dy)):
        if t is None or u is None:
            assert t is None and u is None
        else:
            torch.testing.assert_close(t, u, rtol=0, atol=0)


def test_biases_take_the_launch_by_launch_path(groups):
    ours, ref = _pair("swiglu", bias1=True, bias2=True)
    x, dy = torch.randn(9, 16, requires_grad=True), torch.randn(9, 16)
    for t, u in zip(_step(ours, x, dy), _step(ref, x, dy)):
        torch.testing.assert_close(t, u, rtol=0, atol=0)
    assert groups.graphs.stats == {}


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("fuse", [False, True])
def test_groups_free_preact_and_postact_where_the_launches_do(groups, recompute, fuse):
    """preact is gone once the dact ran, postact once fc2's weight gradient ran (before fc1's
    and dx are made), as launch by launch. fc2's weight gradient runs in the dact's group (one
    group fewer) where it accumulates in place, so that it makes nothing beside preact."""
    ours, _ = _pair("swiglu", recompute, fuse=fuse)
    if fuse:
        for p in (ours.fc1.weight, ours.fc2.weight):
            p.main_grad = torch.zeros(p.shape)
    x, dy = torch.randn(9, 16, requires_grad=True), torch.randn(9, 16)
    for _ in range(3):
        _step(ours, x, dy)
        dw2, dw1, dx = [c for c in GroupOps.calls if c[0] == "gemm"][-3:]
        assert dw2[1] == (16, 9) and dw2[4] == [fuse, True]  # postact read here
        assert dw1[4] == dx[4] == [False, False]
    assert len(groups.graphs._sites) == (3 if fuse else 4)


class _Allocations(TorchDispatchMode):
    """The shapes of the tensors made by empty-like ops, in order."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.new_empty.default, torch.ops.aten.empty.memory_format):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("recompute", [False, True])
def test_the_groups_make_their_tensors_in_the_allocators_order(groups, recompute):
    """The forward's group makes [preact,] y, then postact; the backward's [the replayed
    preact,] postact, then dpreact: in that order the caching allocator's blocks at the step's
    peak hold what the tensors ask for at T=512 d=1024 swiglu (25.0 MiB on the H200, where
    dpreact first read 26.0), and no more at the sweep's other shapes (tools/allocator_model.py)."""
    ours, _ = _pair("swiglu", recompute)
    x, dy = torch.randn(9, 16, requires_grad=True), torch.randn(9, 16)
    _step(ours, x, dy)
    with _Allocations() as made:
        y = ours(x)
    # (what the launches make after them is the torch backend's own, here)
    assert made.shapes[:3 - recompute] == [(9, 48)] * (not recompute) + [(9, 16), (9, 24)]
    with _Allocations() as made:
        y.backward(dy)
    assert made.shapes[:3 if recompute else 2] == (
        [(9, 48)] * recompute + [(9, 24), (9, 48)])


def test_a_key_tells_apart_what_the_launches_read(monkeypatch):
    """The forward's key changes with anything its launches read: a transposed view at the same
    address and of the same shape, another dtype at the same address, another weight. Only the
    same tensors again replay."""
    rec = Recorder()
    graphs = rec.graphs()
    keys = []
    run = graphs.run
    monkeypatch.setattr(graphs, "run", lambda site, key, launches, device: (
        keys.append(key), run(site, key, launches, device)))
    monkeypatch.setattr(autograd, "GRAPHS", graphs)
    ops = GroupOps
    GroupOps.calls, GroupOps.workspace, GroupOps.dact_inputs = [], {}, []
    torch.manual_seed(0)
    w1, w2 = torch.randn(32, 16), torch.randn(16, 16)
    x = torch.randn(16, 16)
    act = get_activation("swiglu")

    def forward_key(x_in, w1_in=w1):
        before = len(keys)
        site = autograd._site("forward", ops, x_in, act.name, True)
        autograd._forward_in_groups(site, ops, x_in, w1_in, w2, act, True, x_in.shape[:-1])
        return keys[before]

    # (site, x, W1, W2): the outputs' addresses follow, and on the CPU they need not repeat
    k = forward_key(x)[:4]
    assert forward_key(x.t())[:4] != k           # same address and shape, other strides
    assert forward_key(w1_in=w1.clone(), x_in=x)[:4] != k  # another weight
    bits = x.view(torch.int32)
    assert bits.data_ptr() == x.data_ptr()
    assert autograd.tensor_key(bits) != autograd.tensor_key(x)  # another dtype at that address
    # the outputs are part of the key too: with the allocator's addresses for them repeating,
    # the same call's key repeats and replays
    assert all(forward_key(x)[:4] == k for _ in range(3))


def test_a_groups_key_tells_apart_the_dtype_of_a_fresh_output():
    """A fresh weight gradient takes its weight's dtype, which the operands cast for the GEMMs do
    not show (autocast over fp32 weights): the same address in another dtype is another key."""
    buf = torch.empty(64)
    a, b = buf.view(torch.float32), buf.view(torch.int32)
    assert a.data_ptr() == b.data_ptr()
    x = torch.empty(4, 4)
    assert (autograd._out_key((GroupOps, x, x, a, False))
            != autograd._out_key((GroupOps, x, x, b, False)))
    # accumulated in place: the buffer's whole geometry
    assert (autograd._out_key((GroupOps, x, x, a, True))
            != autograd._out_key((GroupOps, x, x, a[:32], True)))


def test_a_site_that_gave_up_launches_one_by_one_again(groups, monkeypatch):
    """Where the keys never repeat (every call's tensors elsewhere), the site turns off after
    its bound of new keys and the function goes back to launching kernel by kernel into fresh
    outputs, which costs the host less than groups that are never replayed."""
    rec = Recorder()
    graphs = rec.graphs(max_misses=2)
    run, calls = graphs.run, iter(range(1 << 30))
    monkeypatch.setattr(graphs, "run", lambda site, key, launches, device: run(
        site, (key, next(calls)), launches, device))
    monkeypatch.setattr(autograd, "GRAPHS", graphs)
    ours, ref = _pair("swiglu")
    x, dy = torch.randn(9, 16, requires_grad=True), torch.randn(9, 16)
    for _ in range(4):
        for t, u in zip(_step(ours, x, dy), _step(ref, x, dy)):
            torch.testing.assert_close(t, u, rtol=0, atol=0)
    into_outputs_made_ahead = [c[1] for c in GroupOps.calls if c[0] == "gemm_act"]
    assert into_outputs_made_ahead == [True, True, False, False]
    assert rec.captured == []


def test_the_environment_refuses_a_value_it_does_not_know(monkeypatch):
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match="PARALLEL_MLP_LAUNCH_GRAPHS='yes': must be 0 or 1"):
        LaunchGraphs()


def _workspace_group(calls):
    """A group's workspace requests as the ops make them: a stream-K GEMM's workspace (fc2 at
    h=7168 on 132 SMs: 128 flag words and 132 partial-sum slots) and a dynamic scheduler's tile
    counter. Returns what each launch got."""
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.ops import _stream_k_workspace, _tile_counter

    cpu = torch.device("cpu")
    cfg = GemmConfig(128, 256, 2, 1, 16, stream_k=True)
    got = [_stream_k_workspace(8192, 4096, 7168, cfg, cpu)]
    calls.append(len(got))
    got.append(_tile_counter(cpu))
    return got


def test_a_capture_takes_its_launches_workspace_from_the_streams_buffer(monkeypatch):
    """Under capture the ops allocate no workspace: each launch gets its own aligned slice of the
    stream's buffer, in launch order, flags and counter zeroed; a buffer too small is replaced by
    a larger one between captures (the capture runs again), and every graph keeps the buffer its
    launches point into."""
    from parallel_mlp import launch_graphs
    from parallel_mlp.kernels import ops

    monkeypatch.setattr(launch_graphs, "_workspaces", {})
    attempts, handed = [], []

    def capture_once(take):
        with ops.workspace_from(take):
            got = _workspace_group(attempts)
        handed.append(got)
        return SimpleNamespace()

    slot = ("device 0", "stream")
    graph = launch_graphs.capture_with_workspace(capture_once, slot, torch.device("cpu"))
    assert len(attempts) == 2  # no buffer yet: the first attempt stops at its first request
    buffer = graph.workspace
    words = 128 + 132 * 128 * 256
    assert buffer is launch_graphs._workspaces[slot] and buffer.numel() >= words + 1
    ws, counter = handed[-1]
    base = buffer.data_ptr()
    assert ws.data_ptr() == base and ws.numel() == words and (ws[:128] == 0).all()
    start = -(-words // launch_graphs.WORKSPACE_ALIGN) * launch_graphs.WORKSPACE_ALIGN
    assert counter.data_ptr() == base + 4 * start and counter.numel() == 1 and counter.item() == 0

    # The next group fits: the same buffer, no new attempt.
    again = launch_graphs.capture_with_workspace(capture_once, slot, torch.device("cpu"))
    assert again.workspace is buffer and len(attempts) == 3

    # A group that needs more: a larger buffer for it, the earlier graphs keep theirs.
    def twice(take):
        with ops.workspace_from(take):
            _workspace_group(attempts)
            _workspace_group(attempts)
        return SimpleNamespace()

    bigger = launch_graphs.capture_with_workspace(twice, slot, torch.device("cpu"))
    assert bigger.workspace.numel() >= 2 * start + words and bigger.workspace is not buffer
    assert graph.workspace is buffer and launch_graphs._workspaces[slot] is bigger.workspace
    assert ops._workspace(1, torch.device("cpu")) is None  # the source is the caller's again


def test_outside_a_capture_the_ops_allocate_their_workspace():
    """Without an installed source each launch gets a fresh block (what the launch-by-launch path
    and other streams rely on: no two live launches share a counter)."""
    first, second = _workspace_group([]), _workspace_group([])
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, second))
    assert first[1].item() == 0 and (first[0][:128] == 0).all()


def test_the_collector_is_paused_for_a_capture_and_left_as_found():
    """A collection inside a capture can destroy another CUDA graph, which invalidates it."""
    import gc

    from parallel_mlp.launch_graphs import _collector_paused

    was = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(KeyError):
            with _collector_paused():
                assert not gc.isenabled()
                raise KeyError
        assert gc.isenabled()
        gc.disable()
        with _collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


def test_a_failed_capture_takes_down_its_pool_routing(monkeypatch):
    """After a capture that failed, the allocator's routing to its pool is ended and the pool
    released, as capture_end and the graph's release would have; where torch had already ended
    the routing, nothing is released twice."""
    from parallel_mlp import launch_graphs

    calls = []
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool",
                        lambda index, pool: calls.append(("end", index, pool)))
    monkeypatch.setattr(torch._C, "_cuda_releasePool",
                        lambda index, pool: calls.append(("release", index, pool)))
    launch_graphs._release_pool(0, (0, 7))
    assert calls == [("end", 0, (0, 7)), ("release", 0, (0, 7))]

    def not_routing(index, pool):
        raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    calls.clear()
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", not_routing)
    launch_graphs._release_pool(0, (0, 7))
    assert calls == []


@pytest.mark.parametrize("shape", [(96, 64), (24, 4, 64), (64,)])
def test_the_fused_function_returns_its_output_as_made_in_xs_shape(shape):
    """Through launch groups (the kernels stubbed, on the CPU) the function's output has x's
    leading dims and is the tensor the group wrote, not a view of it: a view returned costs the
    C++ apply its view bookkeeping (about 5 µs a call on a 2-core VM), and an in-place op on the
    output then works as on any tensor autograd made; dx comes back in x's shape."""
    from parallel_mlp.bench import host_stub
    from parallel_mlp.layer import ParallelMLP

    with host_stub.stubbed_kernels(), host_stub.launch_groups(replayed=False) as graphs:
        mlp = ParallelMLP(64, 96, activation="swiglu", backend="cute", dtype=torch.bfloat16)
        x = torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)
        y = mlp(x)
        assert y.shape == (*shape[:-1], 64) and not y._is_view()
        assert type(y.grad_fn).__name__.startswith("ParallelMLPFunction")
        y.mul_(2)  # in place on the function's output
        y.backward(torch.ones_like(y))
        assert graphs.stats["plain"] == 4  # the forward's group and the backward's three ran
    assert x.grad.shape == x.shape
