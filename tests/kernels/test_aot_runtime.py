"""kernels/aot_runtime.py on CPU: finding the DSL's C runtime without importing the DSL, its
errors for an object it cannot load, the disk cache treating such an object as a miss, and that
the launch path's modules do not import the DSL. (Launching needs a GPU: test_aot_runtime_gpu.py.)"""

import subprocess
import sys

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from parallel_mlp.kernels import aot_runtime  # noqa: E402


def test_finds_the_runtime_library_of_the_installed_dsl():
    path = aot_runtime.runtime_library_path()
    assert path is not None and path.name == "libcute_dsl_runtime.so" and path.is_file()
    assert aot_runtime.available()


def test_cute_dsl_libs_names_the_library(monkeypatch, tmp_path):
    fake = tmp_path / "libcute_dsl_runtime.so"
    fake.write_bytes(b"")
    monkeypatch.setenv("CUTE_DSL_LIBS", f"/nowhere/libother.so:{fake}")
    assert aot_runtime.runtime_library_path() == fake


def test_an_object_that_is_not_one_is_refused_with_its_path(tmp_path):
    bad = tmp_path / "pmlp_bad.o"
    bad.write_bytes(b"\x7fELF but not really an object file")
    with pytest.raises(aot_runtime.CuteRuntimeError, match=r"pmlp_bad\.o.*InvalidBinary"):
        aot_runtime.LoadedKernel(bad, "pmlp_bad")


def test_a_corrupt_cache_object_is_a_miss(tmp_path):
    from parallel_mlp.kernels.compile import _load_cached

    bad = tmp_path / "pmlp_bad.o"
    bad.write_bytes(b"garbage")
    assert _load_cached(bad, "pmlp_bad") is None  # neither loader takes it: get_kernel recompiles


class _FakeRuntime:
    """The C runtime's four calls, where a module loads and its function is not found (a cubin
    the driver refuses, a CPU host's CUDA error): each handle's destroys are counted."""

    def __init__(self):
        self.destroyed = []

    def CuteDSLRT_Module_Create_From_Bytes(self, module_ref, data, size, opts, n):
        module_ref._obj.value = 0x1234
        return 0

    def CuteDSLRT_Module_Get_Function(self, function_ref, module, name):
        return 35

    def CuteDSLRT_Module_Destroy(self, module):
        self.destroyed.append(module.value)
        return 0

    def CuteDSLRT_GetErrorName(self, err):
        return b"CudaError"

    def CuteDSLRT_GetErrorString(self, err):
        return b"insufficient driver"


def test_a_module_whose_function_is_missing_is_destroyed_once(monkeypatch, tmp_path):
    """The failed load destroys the module, and the half-built object's __del__ must not destroy
    it again (a double free: the process died instead of recompiling)."""
    import gc

    fake = _FakeRuntime()
    monkeypatch.setattr(aot_runtime, "_library", lambda: fake)
    obj = tmp_path / "pmlp_x.o"
    obj.write_bytes(b"an object the fake runtime takes")
    with pytest.raises(aot_runtime.CuteRuntimeError, match=r"finding pmlp_x in .*CudaError"):
        aot_runtime.LoadedKernel(obj, "pmlp_x")
    gc.collect()
    assert fake.destroyed == [0x1234]


def test_the_launch_path_does_not_import_the_dsl():
    code = (
        "import sys\n"
        "from parallel_mlp.kernels import ops, compile, aot_runtime\n"
        "from parallel_mlp.kernels.epilogue_spec import EpilogueSpec\n"
        "EpilogueSpec('dact', 'swiglu').key\n"
        "assert ops._dsl_import_error() is None\n"
        "assert aot_runtime.available()\n"
        "print(sorted(m for m in sys.modules if m == 'cutlass' or m.startswith('cutlass.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
