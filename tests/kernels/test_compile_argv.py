"""kernels/compile.py against a caller's command line. Where the CuTe DSL builds a JIT engine (a
GPU host) it parses ``sys.argv`` on each compile, for its ``-diagnostic`` flag: a training
script's ``--h 7168`` reads there as an abbreviation of ``--help`` and ``-d 4096`` as
``-diagnostic 4096``, and either ends the process."""

import sys

import pytest

HOSTILE = ["train.py", "--h", "7168", "-d", "4096"]


def _dsl_parser():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from cutlass.base_dsl import dsl

    if not hasattr(dsl, "_get_diagnostic_arg_parser"):
        pytest.skip("this nvidia-cutlass-dsl builds its -diagnostic parser elsewhere")
    return dsl._get_diagnostic_arg_parser()


def test_the_dsls_parser_ends_the_process_on_a_callers_flags(monkeypatch, capsys):
    parser = _dsl_parser()
    monkeypatch.setattr(sys, "argv", HOSTILE)
    with pytest.raises(SystemExit):
        parser.parse_known_args()
    monkeypatch.setattr(sys, "argv", ["train.py", "-d", "4096"])
    with pytest.raises(SystemExit):
        parser.parse_known_args()


def test_under_the_guard_it_sees_a_bare_command_line_and_the_callers_comes_back(monkeypatch):
    from parallel_mlp.kernels.compile import dsl_safe_argv

    parser = _dsl_parser()
    monkeypatch.setattr(sys, "argv", list(HOSTILE))
    with dsl_safe_argv():
        args, rest = parser.parse_known_args()
        assert sys.argv == ["train.py"]
    assert args.diagnostic is None and rest == []
    assert sys.argv == HOSTILE
    with pytest.raises(RuntimeError), dsl_safe_argv():
        raise RuntimeError("a failed compile")
    assert sys.argv == HOSTILE


def test_compile_kernel_compiles_under_the_guard(monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import cutlass.cute as cute

    from parallel_mlp.kernels.compile import KernelKey, compile_kernel
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    seen = []
    monkeypatch.setattr(cute, "compile", lambda *args, **kwargs: seen.append(list(sys.argv)))
    monkeypatch.setattr(sys, "argv", list(HOSTILE))
    compile_kernel(KernelKey(EpilogueSpec("store"), GemmConfig(128, 128, 2, 1, 8), "bfloat16",
                             "row", "row", "bfloat16"))
    assert seen == [["train.py"]]
    assert sys.argv == HOSTILE
