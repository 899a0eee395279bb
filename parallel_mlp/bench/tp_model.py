"""A model of the MLP's tensor-parallel step at TP 2, 4 and 8 on one node: how much of the
communication is exposed, without and with tp_comm_overlap, from measured GEMM time and link
bandwidth.

    python -m parallel_mlp.bench tp-model [--sweep benchmarks/h200-sweep.json] [--tp-json tp.json]
                                          [--busbw-gbs 360] [--T 8192 --d 4096 --act swiglu --h 11008]

Inputs. The compute: the one-GPU step time of each TP shard (hidden h/p) at this T and d, taken
from a sweep's JSON where it has that shape (its Llama-style shards at TP 1, 2, 4, 8), else
scaled from the TP=1 step by the FLOPs; the step is split over the six GEMMs in proportion to
their FLOPs. The link: the bus bandwidth a ``bench tp`` run measured (its JSON's ``meta.link``),
else ``--busbw-gbs``, a figure to state (the NVLink of an H200 carries 450 GB/s each way by its
datasheet; NCCL's large-message bus bandwidth is below that).

The collectives of one step, with the activation S = T x d x 2 bytes (T: the group's tokens):

- replicated: all-reduce of fc2's output (forward) and of dx (backward), each 2(p-1)/p S per rank;
- sequence parallel: all-gather of x, reduce-scatter of fc2's output (forward); all-gather of dy,
  re-gather of x, reduce-scatter of dx (backward), each (p-1)/p S per rank.

What is exposed (a collective's time beyond the GEMM it runs beside; 0 when it hides):

- without overlap (the layer's default): the forward's collectives entirely; in backward, dy's
  gather entirely, x's re-gather beside the dact, dW2 and dx GEMMs, dx's all-reduce or
  reduce-scatter beside dW1;
- with overlap, where a GEMM and its collective run in c blocks (c = p for the sequence-parallel
  gathers and scatters, 4 for the all-reduce): one block's transfer that cannot overlap, or the
  excess of the transfer over the GEMM's other blocks, whichever is larger.

A model, not a measurement: it assumes the GEMMs keep their one-GPU speed beside the transfers,
which NCCL's use of SMs and HBM does not quite allow.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from ..activations import get_activation

ALL_REDUCE_BLOCKS = 4


@dataclass
class Step:
    """The six GEMMs of one rank's fwd+bwd, ms."""

    fc1: float
    fc2: float
    dact: float
    dw2: float
    dx: float
    dw1: float

    @property
    def total(self) -> float:
        return self.fc1 + self.fc2 + self.dact + self.dw2 + self.dx + self.dw1


def gemm_times(step_ms: float, T: int, d: int, h: int, gated: bool) -> Step:
    """A step's time split over its GEMMs in proportion to their FLOPs."""
    f = 2 * h if gated else h
    flops = Step(fc1=T * d * f, fc2=T * h * d, dact=T * d * h, dw2=T * d * h, dx=T * f * d,
                 dw1=T * f * d)
    per = step_ms / flops.total
    return Step(*(getattr(flops, k) * per for k in ("fc1", "fc2", "dact", "dw2", "dx", "dw1")))


def exposed(comm: float, gemm: float, blocks: int) -> float:
    """Exposed time of a transfer pipelined with a GEMM in `blocks` blocks: at least one
    block's transfer, or what the transfer takes beyond the GEMM's other blocks."""
    if blocks <= 1:
        return max(0.0, comm - gemm) if gemm else comm
    return max(comm / blocks, comm - gemm * (blocks - 1) / blocks)


def model(step: Step, p: int, T: int, d: int, busbw_gbs: float, sequence_parallel: bool) -> dict:
    """Communication ms and exposed ms without and with overlap, for one TP size and mode."""
    if p == 1:
        return {"comm_ms": 0.0, "exposed_ms": 0.0, "exposed_overlap_ms": 0.0}
    size = T * d * 2

    def ms(factor):
        return factor * size / (busbw_gbs * 1e9) * 1e3

    if sequence_parallel:
        one = ms((p - 1) / p)  # every gather and scatter moves the same bytes
        comm = 5 * one
        plain = 3 * one + max(0.0, one - (step.dact + step.dw2 + step.dx)) + max(0.0, one - step.dw1)
        overlapped = (exposed(one, step.fc1, p) + exposed(one, step.fc2, p)
                      + exposed(one, step.dact, p)
                      + max(0.0, one - (step.dact + step.dw2 + step.dx))  # x's re-gather
                      + max(0.0, exposed(one, step.dx, p) - step.dw1))  # dx's, last block beside dW1
    else:
        one = ms(2 * (p - 1) / p)
        comm = 2 * one
        plain = one + max(0.0, one - step.dw1)
        overlapped = exposed(one, step.fc2, ALL_REDUCE_BLOCKS) + max(0.0, one - step.dw1)
    return {"comm_ms": comm, "exposed_ms": plain, "exposed_overlap_ms": overlapped}


def shard_step_ms(sweep: dict | None, T: int, d: int, act: str, h: int, p: int,
                  tp1_ms: float | None) -> tuple[float | None, str]:
    """(one-GPU step ms of the TP-p shard, where it came from)."""
    if sweep:
        for row in sweep.get("rows", []):
            if (row["tokens"], row["d"], row["act"], row["shard"]) == (T, d, act, h // p):
                ms = row["variants"].get("ours", {}).get("ms")
                if ms:
                    return ms, "measured (sweep)"
    if tp1_ms:
        return tp1_ms / p, "TP=1 step / p"
    return None, "no measurement"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench tp-model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", default="benchmarks/h200-sweep.json",
                   help="a sweep's JSON with the shards' one-GPU step times")
    p.add_argument("--tp-json", default=None, help="a `bench tp` JSON whose meta.link to use")
    p.add_argument("--busbw-gbs", type=float, default=None,
                   help="bus bandwidth when no --tp-json gives one (GB/s)")
    p.add_argument("--T", type=int, default=8192)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--act", default="swiglu")
    p.add_argument("--h", type=int, default=11008, help="global hidden size")
    p.add_argument("--tp1-ms", type=float, default=None,
                   help="the TP=1 step's ms when the sweep lacks a shard")
    return p.parse_args(argv)


def _load(path):
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    sweep, tp = _load(args.sweep), _load(args.tp_json)
    if tp and "link" in tp.get("meta", {}):
        busbw, source = tp["meta"]["link"]["all_reduce_busbw_gbs"], f"measured ({args.tp_json})"
    elif args.busbw_gbs:
        busbw, source = args.busbw_gbs, "given (--busbw-gbs)"
    else:
        print("tp-model needs a bandwidth: --tp-json from a `bench tp` run, or --busbw-gbs")
        return 2
    gated = get_activation(args.act).gated
    print(f"TP model: T={args.T} d={args.d} {args.act} h={args.h}; bus bandwidth "
          f"{busbw:.0f} GB/s, {source}")
    print(f"{'TP':>3} {'mode':>10} {'compute ms':>10} {'source':>18} {'comm ms':>8} "
          f"{'exposed':>8} {'share':>6} {'overlapped':>10} {'share':>6}")
    for p in (1, 2, 4, 8):
        if args.h % p:
            continue
        step_ms, how = shard_step_ms(sweep, args.T, args.d, args.act, args.h, p, args.tp1_ms)
        if step_ms is None:
            print(f"{p:>3}  no step time for h={args.h // p}: give --tp1-ms")
            continue
        step = gemm_times(step_ms, args.T, args.d, args.h // p, gated)
        for sp in (False, True):
            m = model(step, p, args.T, args.d, busbw, sp)
            share = m["exposed_ms"] / (step_ms + m["exposed_ms"])
            share_o = m["exposed_overlap_ms"] / (step_ms + m["exposed_overlap_ms"])
            print(f"{p:>3} {'seq-par' if sp else 'all-reduce':>10} {step_ms:>10.3f} {how:>18} "
                  f"{m['comm_ms']:>8.3f} {m['exposed_ms']:>8.3f} {share:>6.1%} "
                  f"{m['exposed_overlap_ms']:>10.3f} {share_o:>6.1%}")
    return 0
