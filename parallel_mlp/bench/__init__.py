"""The benchmarks of parallel_mlp: measurement code, kept out of the layer's package.

Run them as ``python -m parallel_mlp.bench COMMAND [flags]`` (``--help`` lists the commands;
with no command, the full single-GPU run). Modules:

    suite.py          the single-GPU run: flags, sections, driver (commands full, mlp, gemm, cold)
    harness.py        the run's context, side-by-side timing, guarded attempts, run metadata
    timing.py         held and round-robin timing primitives (also used by kernels' tuned=True)
    models.py         what is compared: eager PyTorch MLP, ParallelMLP, one training step
    gemms.py          the MLP's GEMMs and fused ops against cuBLAS
    mlp.py            the whole MLP against eager and torch.compile
    cold.py           a new process's time to its first fwd+bwd
    report.py         the single-GPU run's JSON, targets, tables and chart
    sweep.py          ~30 pretraining shapes: ours against eager, torch.compile and quack
    sweep_grid.py     the sweep's shapes: tokens per rank, width, TP shard, activation
    sweep_report.py   the sweep's table, summary and heat maps
    quack_baseline.py quack's MLP holding our weights (and the patch quack needs)
    progress.py       a one-line progress bar on stderr
    tp.py             the MLP at TP = world size against a Megatron-style eager MLP
    profile_step.py   one step's kernels and idle gaps under torch.profiler
    gemm_configs.py   kernel configs against cuBLAS, for choosing GemmConfig defaults
    host_overhead.py  where the host time of one launch goes
    ncu_cases.py      a few GEMMs launched once each, for Nsight Compute

Importing this package imports nothing else: ``parallel_mlp.kernels.tuning`` reads ``timing``
from it on its first tuned call and must not pull the benchmarks in with it.
"""
