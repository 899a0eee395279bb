"""`tuned=True`: time the candidate configs once per problem, remember the winner on disk.

The choice is keyed by (variant, dtypes, operand majorness, M, N, K, SM count) and kept in
``$PARALLEL_MLP_CACHE_DIR/tune-v3.json`` (default ``~/.cache/parallel_mlp``); later calls and
later processes reuse it without timing. Candidates are timed held (parallel_mlp.bench.timing's
median_ms_held: turns of DEFAULT_HOLD_S, TUNE_ROUNDS each, ~40 s per problem), so the choice is the
fastest at the clock it gets running alone; shorter turns measured the card's clock swing rather
than the candidates.
Timing runs the real op on the caller's tensors, into scratch outputs, so it never writes to the
caller's outputs.

Each epilogue kind is tuned on its own. Whole-tile configs sum every output element in the same
order whatever their tile, but stream-K's sums depend on its split: a tuned act and a tuned plain
GEMM of one shape need not round the same preact. The layer never tunes (recompute relies on that
equality), so this concerns direct callers of the ops only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import threading
from dataclasses import asdict

import torch

from .compile import cache_dir
from .config import TUNE_CANDIDATES, GemmConfig, big_pingpong_config, default_config, has_partial_wave, is_big

_lock = threading.Lock()
_choices: dict | None = None

# Held turns per candidate: an even number, so that the turn order's reversal every round gives
# every candidate the same mean place (with three, the last candidate runs last in two rounds of
# three: one config in two columns of bench configs read 1.1-2.3% apart that way, 0.4% with
# four; H200, 2026-12-02).
TUNE_ROUNDS = 4


def _path():
    # Choices of candidates held 1 s a turn. tune.json (call by call: picks by cycles) and
    # tune-v2.json (0.3 s turns) are not read: on an H200, 2026-11-30, one kernel timed in three
    # columns in turn differed by up to 6% at 0.5 s turns, 0.6% at 1 s (bench.timing.DEFAULT_HOLD_S).
    return cache_dir() / "tune-v3.json"


def _load():
    global _choices
    if _choices is None:
        try:
            _choices = json.loads(_path().read_text())
        except (OSError, ValueError):
            _choices = {}
    return _choices


def _save():
    """Write the choices, merged over what the file holds now: other processes (the ranks of a
    node, tuning other problems) may have written theirs since this one read it."""
    p = _path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            merged = json.loads(p.read_text())
        except (OSError, ValueError):
            merged = {}
        merged.update(_choices)
        _choices.update(merged)
        # unique across the hosts that may share the directory, not only across this host's pids
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tune-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(merged, indent=1, sort_keys=True))
        os.replace(tmp, p)
    except OSError:
        pass


def _stored(choice) -> GemmConfig | None:
    """A stored choice as a GemmConfig; None where it no longer builds one (a field the config
    has lost or a value it now refuses: a choice written by older code), to be tuned again."""
    try:
        return GemmConfig(**choice)
    except (TypeError, ValueError):
        return None


def _candidate_runner(spec, a, b, d_dtype):
    """run(cfg): one launch of the op `spec` describes on a @ b with config cfg, into buffers
    shared by every candidate (inputs a, b are the caller's real data)."""
    from . import ops

    m, n = a.shape[0], b.shape[1]
    if spec.kind in ("store", "accumulate"):
        out = torch.zeros(m, n, dtype=d_dtype, device=a.device)
        return lambda cfg: ops.gemm(a, b, out=out, accumulate=spec.kind == "accumulate", config=cfg)
    if spec.kind == "act":
        bias = torch.randn(n, device=a.device).to(a.dtype) if spec.has_bias else None
        return lambda cfg: ops.gemm_act(a, b, spec.activation, bias=bias, store_preact=spec.store_preact, config=cfg)
    pre = torch.randn(m, 2 * n if spec.gated else n, device=a.device).to(a.dtype)
    return lambda cfg: ops.gemm_dact(a, b, pre, spec.activation, config=cfg)


def tuned_config(spec, a, bk, d_dtype, num_sms: int) -> GemmConfig:
    from . import ops

    m, k = a.shape
    n = bk.shape[0]
    key = f"{spec.key}|{a.dtype}|{ops._major(a)}|{ops._major(bk)}|{d_dtype}|{m}x{n}x{k}|sm{num_sms}"
    with _lock:
        choice = _load().get(key)
        stored = None if choice is None else _stored(choice)
        if stored is not None:
            return stored
    default = default_config(m, n, k, num_sms, spec.kind)
    # The default competes too: it may be a config the candidate list does not hold (pingpong).
    # On big shapes so do the pingpong config (the default below COOPERATIVE_MIN_K) and its
    # 128x128 tile (the default before 128x192).
    candidates = [default] + [dataclasses.replace(c, num_sms=num_sms, l2_prefetch=default.l2_prefetch)
                              for c in TUNE_CANDIDATES]
    if is_big(m, n, num_sms):
        pingpong = big_pingpong_config(m, n, num_sms, spec.kind)
        candidates += [pingpong, dataclasses.replace(pingpong, tile_n=128)]
    sk_able = (default.consumers, default.scheduler) == ("cooperative", "static") and default.tile_m <= 128
    if sk_able and spec.kind != "dact" and has_partial_wave(default, m, n):
        # Stream-K against whole tiles at the default's tile, whichever way the default's rule
        # (config.with_stream_k) decided.
        candidates.append(dataclasses.replace(default, stream_k=not default.stream_k))
    run = _candidate_runner(spec, a, bk.t(), d_dtype)
    runnable = []
    for cfg in dict.fromkeys(candidates):
        try:
            run(cfg)  # compiles (or loads) it; one that does not build or launch here is not chosen
        except Exception:
            continue
        runnable.append(cfg)
    best = default
    if runnable:
        # Held turns: each candidate at the clock its own power draw gets (call by call they
        # would share one and be chosen by cycles), and the turns in rounds cancel the card's
        # drift of 10-20% over seconds. Imported here: only a first tuned call of a problem
        # times anything, and the bench package's timing needs nothing but torch.
        from parallel_mlp.bench import timing

        times = timing.median_ms_held([functools.partial(run, cfg) for cfg in runnable],
                                      rounds=TUNE_ROUNDS)
        best = runnable[min(range(len(runnable)), key=times.__getitem__)]
    with _lock:
        _load()[key] = asdict(best)
        _save()
    return best
