"""The fused step with GemmConfig fields replaced in the configs the rule picks, beside the same
step on the rule's own configs, and eager (a GPU is needed).

    python3 tools/option_ab.py --also FIELD=VALUE[,...] [--where FIELD=VALUE[,...]]
                               [--hold-s 0.4] [--rounds 6] [--shapes T:d:h:act,...]

``bench configs --also`` times one GEMM at a time; whether an option belongs in the default rule
is decided by whole steps, where its kernels run between the step's others. Both variants here
launch through ``ops.rewriting_configs`` (the baseline's rewrite keeps every config as the rule
picked it), so both launch kernel by kernel, past the plan cache and the launch groups' graphs,
and differ in the kernels alone. That is fair where the GPU decides the step, which is where an
epilogue option can pay (the default shapes); at a host-bound step both would read the host.
``--where`` limits the fields to the configs whose fields already hold those values (e.g.
``consumers=pingpong``: one consumer schedule's configs; ``dact_prefetch=3``: the short-K dact's
config alone); a config the fields make invalid (a three-slot preact ring in a pingpong config)
stays as the rule has it. What is invalid only for an epilogue (stream-K, which the dact does not
run) is refused when its kernel is built, which stops the run: keep the dact's configs out with
``--where`` (its pingpong configs alone hold ``dact_prefetch=2``). Compile
the option's kernels first (``python -m parallel_mlp.kernels.warmup --shapes ... --also FIELDS
-j 16``), or the warm-up steps compile them one by one.

Per shape: ms per fwd+bwd of eager, the option, the rule and eager's second copy (the run's
spread), each one's ratio to eager, the option's gain over the rule (the median of the rounds'
paired ratios), and how many of the step's distinct configs the fields changed.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from launch_graphs_ab import (  # same folder: its step's models and timing, alike
    device_and_host_line, eager_two_ways_copy, fused_and_eager)
from parallel_mlp.bench.models import train_step
from parallel_mlp.kernels import ops
from parallel_mlp.kernels.config import parse_fields
from parallel_mlp.kernels.warmup import parse_shapes

# GPU-bound steps of the sweep whose epilogue GEMMs are big pingpong ones (the headline and its
# neighbours), and narrow shards, where an epilogue option measured one GEMM at a time has read
# either way.
SHAPES = "8192:4096:14336:swiglu,8192:4096:11008:swiglu,8192:5120:13824:swiglu," \
         "8192:8192:5504:swiglu,16384:4096:11008:swiglu,8192:4096:16384:gelu_tanh_approx," \
         "8192:8192:8192:gelu_tanh_approx,8192:2048:4096:gelu_tanh_approx,8192:4096:1376:swiglu"


class FieldRewrite:
    """A config rewrite for ops.rewriting_configs: ``fields`` replaced in each config whose
    fields hold ``where``'s values (every config, without one), where they leave it valid;
    ``changed`` and ``seen`` collect the distinct configs rewritten and met."""

    def __init__(self, fields: dict, where: dict | None = None):
        self.fields, self.where = fields, where or {}
        self.changed, self.seen = set(), set()

    def __call__(self, cfg):
        self.seen.add(cfg)
        if not self.fields or any(getattr(cfg, name) != value for name, value in self.where.items()):
            return cfg
        try:
            new = dataclasses.replace(cfg, **self.fields)
        except ValueError:  # e.g. the store warp asked of a stream-K config
            return cfg
        if new != cfg:
            self.changed.add(cfg)
        return new


def _rewritten(model, x, dy, rewrite: FieldRewrite):
    def step():
        with ops.rewriting_configs(rewrite):
            train_step(model, x, dy)
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--also", required=True, metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="GemmConfig fields to replace, as bench configs --also takes them")
    p.add_argument("--where", default=None, metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="replace them only in the configs whose fields have these values")
    p.add_argument("--hold-s", type=float, default=0.4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--shapes", default=SHAPES, metavar="T:d:h:act,...")
    args = p.parse_args(argv)
    try:
        fields = parse_fields(args.also)
        where = parse_fields(args.where) if args.where else {}
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        p.error(str(e))
    if not torch.cuda.is_available():
        raise SystemExit("option_ab.py needs a CUDA GPU")
    scope = f" where {args.where}" if args.where else ""
    print(device_and_host_line(args.hold_s, args.rounds))
    print(f"{args.also}{scope} against the rule's configs, both launched kernel by kernel")
    print(f"{'shape':38s} {'eager ms':>9s} {'option':>8s} {'rule':>8s} {'copy':>8s} "
          f"{'opt/eager':>9s} {'rule/eager':>10s} {'gain':>7s} {'configs changed':>15s}")
    for T, d, h, act in shapes:
        ours, eager, copy, x, dy, _ = fused_and_eager(T, d, h, act, launch_graphs=False)
        option, rule = FieldRewrite(fields, where), FieldRewrite({})
        fns = [lambda: train_step(eager, x, dy), _rewritten(ours, x, dy, option),
               _rewritten(ours, x, dy, rule), lambda: train_step(copy, x, dy)]
        ms, over_eager, gain = eager_two_ways_copy(fns, args.hold_s, args.rounds)
        label = f"T={T} d={d} {act} h={h}"
        changed = f"{len(option.changed)} of {len(option.seen)}"
        print(f"{label:38s} {ms[0]:9.3f} {ms[1]:8.3f} {ms[2]:8.3f} {ms[3]:8.3f} "
              f"{over_eager[1]:8.3f}x {over_eager[2]:9.3f}x {gain:6.3f}x {changed:>15s}",
              flush=True)
        del ours, eager, copy, fns
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
