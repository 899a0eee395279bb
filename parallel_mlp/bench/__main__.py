"""``python -m parallel_mlp.bench COMMAND [flags]``: one entry point for every benchmark."""

from __future__ import annotations

import importlib
import sys

# command -> (module, its main's extra keyword arguments, one line of help)
COMMANDS = {
    "full": ("suite", {"command": "full"},
             "the default: GEMMs, fused ops, the MLP, cold start and torch.compile (~6 min)"),
    "mlp": ("suite", {"command": "mlp"},
            "the whole MLP fwd+bwd: ours, recompute, eager, torch.compile"),
    "gemm": ("suite", {"command": "gemm"},
             "the MLP's GEMMs and fused GEMM+activation ops against cuBLAS"),
    "cold": ("suite", {"command": "cold"}, "a new process's time to its first fwd+bwd"),
    "sweep": ("sweep", {},
              "30 pretraining shapes: ours against eager, torch.compile and quack (~8 min)"),
    "tp": ("tp", {}, "under torchrun: the MLP at TP = world size against Megatron-style eager"),
    "tp-model": ("tp_model", {}, "exposed TP communication at TP 2/4/8, from measured step times "
                                 "and bandwidth"),
    "profile": ("profile_step", {}, "one step's kernels and idle gaps (torch.profiler)"),
    "configs": ("gemm_configs", {}, "kernel configs (GemmConfig fields) against cuBLAS"),
    "host": ("host_overhead", {}, "where the host time of one launch goes"),
    "ncu-cases": ("ncu_cases", {}, "a few GEMMs launched once each, for Nsight Compute"),
}
DEFAULT = "full"


def usage() -> str:
    lines = ["usage: python -m parallel_mlp.bench [COMMAND] [flags]", "",
             f"With no command (or flags only), runs '{DEFAULT}'. "
             "'python -m parallel_mlp.bench COMMAND --help' shows a command's flags.", "",
             "commands:"]
    lines += [f"  {name:10s} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command = DEFAULT
    if argv and not argv[0].startswith("-"):
        command = argv.pop(0)
    if command not in COMMANDS:
        print(f"unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, kwargs, _ = COMMANDS[command]
    command_main = importlib.import_module(f"{__package__}.{module}").main
    # quack compiles its kernels through the CuTe DSL at their first call, and the DSL parses
    # sys.argv on every compile: our --h would read as --help there and end the process. The
    # command has its flags in `argv`; sys.argv stays bare while it runs.
    from ..kernels.compile import dsl_safe_argv

    with dsl_safe_argv():
        return command_main(argv, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
