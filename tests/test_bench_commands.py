"""The GPU timing commands' command lines (CPU): `configs --also FIELD=VALUE` parsing and its
refusal of what is not a GemmConfig field, and the message of the GPU-only commands without a GPU."""

import sys

import pytest
import torch

from parallel_mlp.bench.gemm_configs import _label, _parse_fields


def test_also_fields_are_typed_like_the_config():
    fields = _parse_fields("l2_prefetch=1,dact_prefetch=2,consumers=pingpong,max_stages=5")
    assert fields == {"l2_prefetch": True, "dact_prefetch": 2, "consumers": "pingpong", "max_stages": 5}
    assert _parse_fields("l2_prefetch=0") == {"l2_prefetch": False}
    assert _label(fields) == "l2_prefetch=True,dact_prefetch=2,consumers=pingpong,max_stages=5"


@pytest.mark.parametrize("bad", ["tile=128", "l2_prefetch", "max_stages=", "l2_prefetch=1,nope=2"])
def test_also_refuses_what_is_not_field_equals_value(bad):
    with pytest.raises(SystemExit, match="--also .*is not FIELD=VALUE with a GemmConfig field"):
        _parse_fields(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
@pytest.mark.parametrize("command,argv", [("host", ["--calls", "1"]), ("host", ["--step"]),
                                          ("configs", ["--T", "128"]), ("ncu-cases", []),
                                          ("ncu-cases", ["--short-k-dact"]), ("ncu-cases", ["--short-k-pingpong"]),
                                          ("ncu-cases", ["--epilogue-gap", "8192,4096,1376,swiglu"])])
def test_gpu_only_commands_say_so(command, argv):
    from parallel_mlp.bench.__main__ import main

    with pytest.raises(SystemExit, match=f"{command} needs a CUDA GPU"):
        main([command, *argv])


@pytest.mark.parametrize("argv,message", [
    (["--epilogue-gap", "8192,4096,swiglu"], "--shape must be T,d,h,activation"),
    (["--epilogue-gap", "8192,4096,1376,relu9"], "relu9"),
    (["--short-k-dact", "--epilogue-gap", "8192,4096,1376,swiglu"], "different case lists"),
    (["--short-k-dact", "--short-k-pingpong"], "different case lists")])
def test_ncu_cases_refuses_a_bad_epilogue_gap_before_touching_the_gpu(argv, message, capsys):
    from parallel_mlp.bench.ncu_cases import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2  # argparse's usage error, not "needs a CUDA GPU"
    assert message in capsys.readouterr().err


def test_help_lists_every_command(capsys):
    from parallel_mlp.bench.__main__ import COMMANDS, main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)
    assert "With no command" in out


def test_no_command_runs_the_full_suite_and_flags_pass_through(monkeypatch):
    from parallel_mlp.bench import __main__ as entry
    from parallel_mlp.bench import suite

    seen = []
    monkeypatch.setattr(suite, "main", lambda argv, command: seen.append((command, argv)) or 0)
    assert entry.main([]) == 0
    assert entry.main(["--dry-run", "--json", "x.json"]) == 0
    assert entry.main(["mlp", "--skip-compile"]) == 0
    assert seen == [("full", []), ("full", ["--dry-run", "--json", "x.json"]),
                    ("mlp", ["--skip-compile"])]


def test_unknown_command_is_refused(capsys):
    from parallel_mlp.bench.__main__ import main

    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_configs_refuses_a_negative_graph_length(capsys):
    from parallel_mlp.bench import gemm_configs

    with pytest.raises(SystemExit):
        gemm_configs.main(["--graphed", "-1"])
    assert "--graphed -1: give the calls per graph" in capsys.readouterr().err


def test_configs_refuses_zero_rounds(capsys):
    from parallel_mlp.bench import gemm_configs

    with pytest.raises(SystemExit):
        gemm_configs.main(["--rounds", "0"])
    assert "--rounds 0: must be >= 1" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphed_replays_the_captured_calls():
    from parallel_mlp.bench.timing import graphed

    counter = torch.zeros(1, device="cuda")
    replay = graphed(lambda: counter.add_(1), calls=5, warmup=2)
    assert counter.item() == 2  # the warmup calls ran; the capture ran nothing
    replay()
    replay()
    assert counter.item() == 12


def test_a_config_column_invalid_for_a_row_reads_not_available():
    from parallel_mlp.bench.gemm_configs import _runnable
    from parallel_mlp.kernels.config import GemmConfig

    def invalid():
        GemmConfig(consumers="pingpong", dact_prefetch=3)

    def valid():
        return GemmConfig(dact_prefetch=3)

    assert _runnable(invalid) is None
    assert _runnable(valid) is valid


def test_a_command_runs_with_a_bare_sys_argv_and_gets_its_flags(monkeypatch):
    # quack compiles through the CuTe DSL, which parses sys.argv on every compile: the bench's
    # own `--h 1376` would read there as --help and end the process.
    from parallel_mlp.bench import __main__ as entry
    from parallel_mlp.bench import profile_step

    seen = []
    monkeypatch.setattr(profile_step, "main", lambda argv: seen.append((list(sys.argv), argv)) or 0)
    monkeypatch.setattr(sys, "argv", ["bench", "profile", "--h", "1376"])
    assert entry.main() == 0
    assert seen == [(["bench"], ["--h", "1376"])]
    assert sys.argv == ["bench", "profile", "--h", "1376"]
