"""Launching cached kernels through the DSL's C runtime, without importing the DSL in Python.

A kernel exported by ``export_to_c`` is an object file: the host launcher, the embedded cubin and
metadata. ``cutlass.runtime.load_module`` links it in process, but needs ``import cutlass``
first (~0.6 s: MLIR bindings and every DSL module). The DSL wheel also ships its C runtime,
``libcute_dsl_runtime.so``, with a small documented C API (``include/CuteDSLRuntime.h``, the
"dynamic" AOT integration) that does the same from the object's bytes:

    CuteDSLRT_Module_Create_From_Bytes(&module, bytes, size, NULL, 0)
    CuteDSLRT_Module_Get_Function(&function, module, prefix)   # prefix given at export
    CuteDSLRT_Function_Run(function, args, n)   # args: &struct per tensor, &stream, &int32 result

so a process whose kernels are all in the disk cache launches them through ctypes and never
imports the DSL. Tested with one GPU per process, as torchrun runs training. The argument structs are the ones ops.py builds for the DSL's own launcher
(ops._launch_args), so both paths share one description of the ABI.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import threading
from pathlib import Path
from typing import Optional

RUNTIME_NAME = "libcute_dsl_runtime.so"


def runtime_library_path() -> Optional[Path]:
    """The DSL's C runtime library, found without importing the DSL: $CUTE_DSL_LIBS if it names
    it (the DSL's own override), else the one ``lib``/``cu12/lib``/``cu13/lib`` folder of the
    installed wheel that holds it. None when there is none, or more than one to choose from (the
    DSL picks by its CUDA build then; we leave that choice to it)."""
    for entry in os.environ.get("CUTE_DSL_LIBS", "").split(os.pathsep):
        if entry.endswith(RUNTIME_NAME) and Path(entry).is_file():
            return Path(entry)
    spec = importlib.util.find_spec("cutlass")
    if spec is None or not spec.origin:
        return None
    root = Path(spec.origin).parents[2]  # <wheel>/dsl_packages/cutlass/__init__.py -> <wheel>
    found = [root / d / RUNTIME_NAME for d in ("lib", "cu12/lib", "cu13/lib")]
    found = [p for p in found if p.is_file()]
    return found[0] if len(found) == 1 else None


class CuteRuntimeError(RuntimeError):
    """A CuteDSLRT_* call failed (loading an object, finding its function, or launching)."""


@functools.lru_cache(maxsize=None)
def _library() -> Optional[ctypes.CDLL]:
    path = runtime_library_path()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    c_void_pp = ctypes.POINTER(ctypes.c_void_p)
    lib.CuteDSLRT_Module_Create_From_Bytes.argtypes = [
        c_void_pp, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
    ]
    lib.CuteDSLRT_Module_Get_Function.argtypes = [c_void_pp, ctypes.c_void_p, ctypes.c_char_p]
    lib.CuteDSLRT_Function_Run.argtypes = [ctypes.c_void_p, c_void_pp, ctypes.c_size_t]
    lib.CuteDSLRT_Module_Destroy.argtypes = [ctypes.c_void_p]
    lib.CuteDSLRT_GetErrorName.argtypes = [ctypes.c_int]
    lib.CuteDSLRT_GetErrorString.argtypes = [ctypes.c_int]
    lib.CuteDSLRT_GetErrorName.restype = ctypes.c_char_p
    lib.CuteDSLRT_GetErrorString.restype = ctypes.c_char_p
    for f in ("Module_Create_From_Bytes", "Module_Get_Function", "Function_Run", "Module_Destroy"):
        getattr(lib, f"CuteDSLRT_{f}").restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether cached kernels can be launched without importing the DSL."""
    try:
        return _library() is not None
    except OSError:  # the library exists but does not load (wrong platform, missing libc parts)
        return False


def _check(lib: ctypes.CDLL, err: int, what: str) -> None:
    if err != 0:
        name = lib.CuteDSLRT_GetErrorName(err).decode()
        text = lib.CuteDSLRT_GetErrorString(err).decode()
        raise CuteRuntimeError(f"{what}: {name} ({text})")


class LoadedKernel:
    """One exported kernel, loaded through the C runtime. `run_compiled_program(args)` takes the
    same argument addresses as the DSL's compiled function (ops._launch_args) and launches it."""

    def __init__(self, object_path: Path, prefix: str):
        lib = _library()
        if lib is None:
            raise CuteRuntimeError(f"{RUNTIME_NAME} not found next to the installed DSL")
        self._lib = lib
        data = Path(object_path).read_bytes()
        module = ctypes.c_void_p()
        _check(lib, lib.CuteDSLRT_Module_Create_From_Bytes(ctypes.byref(module), data, len(data), None, 0),
               f"loading {object_path}")
        function = ctypes.c_void_p()
        try:
            _check(lib, lib.CuteDSLRT_Module_Get_Function(ctypes.byref(function), module, prefix.encode()),
                   f"finding {prefix} in {object_path}")
        except CuteRuntimeError:
            lib.CuteDSLRT_Module_Destroy(module)
            raise
        # Only now owned by this object: __del__ destroys what it owns, and a module destroyed
        # above must not be destroyed again when the half-built object is collected.
        self._module = module
        self._function = function
        self._tls = threading.local()  # each thread packs its own arguments

    def run_compiled_program(self, args: list[int]) -> None:
        tls = self._tls
        packed = getattr(tls, "packed", None)
        if packed is None or len(packed) != len(args) + 1:
            tls.result = ctypes.c_int32(0)
            packed = tls.packed = (ctypes.c_void_p * (len(args) + 1))()
            packed[len(args)] = ctypes.addressof(tls.result)
        for i, a in enumerate(args):
            packed[i] = a
        _check(self._lib, self._lib.CuteDSLRT_Function_Run(self._function, packed, len(args) + 1), "launching")
        if tls.result.value != 0:  # the launcher's own cudaLaunchKernelEx status
            raise CuteRuntimeError(f"kernel launch failed with CUDA error {tls.result.value}")

    def __del__(self):
        module = getattr(self, "_module", None)
        if module is not None and module.value:
            try:
                self._lib.CuteDSLRT_Module_Destroy(module)
            except Exception:  # interpreter shutdown: the library may be gone already
                pass
