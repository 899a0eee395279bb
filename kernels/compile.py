"""Building kernels: symbolic signatures, cute.compile, and the in-process and on-disk caches.

A kernel is compiled against *fake* tensors whose sizes and leading strides are symbolic, so one
compiled kernel serves every problem size of its (variant, dtypes, operand majorness, config).
The same code path compiles for sm_90a on a machine without a GPU (the selfcheck) and on the
GPU host at first use.

Compiled kernels are kept in memory, and exported as object files (the DSL's ``export_to_c``)
under ``$PARALLEL_MLP_CACHE_DIR/kernels/<fingerprint>/`` (default ``~/.cache/parallel_mlp``), so a
new process loads them instead of tracing and compiling again: through the DSL's C runtime
(aot_runtime.py), which spares it the DSL's Python import, or else ``cutlass.runtime.load_module``.
The fingerprint covers our kernel sources, the activations module and the DSL version, so a
changed kernel never loads a stale object.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .config import GemmConfig
from .epilogue_spec import EpilogueSpec

_ARCH = "sm_90a"


def cache_dir() -> Path:
    """``$PARALLEL_MLP_CACHE_DIR``, else ``~/.cache/parallel_mlp``; where there is no home (a
    container running as a user without a passwd entry), the system's temporary directory, so
    that the cache, an optimization, never fails an op."""
    d = os.environ.get("PARALLEL_MLP_CACHE_DIR")
    if d:
        return Path(d)
    try:
        return Path.home() / ".cache" / "parallel_mlp"
    except RuntimeError:
        import tempfile

        return Path(tempfile.gettempdir()) / f"parallel_mlp-{os.getuid()}"


@dataclass(frozen=True)
class KernelKey:
    """Everything a compiled kernel is specialized on."""

    epilogue: EpilogueSpec
    config: GemmConfig  # tile, cluster, raster group, SMs and scheduler: all in `name` via config.key
    ab_dtype: str  # "bfloat16" | "float16"
    a_major: str  # "row" (K contiguous) | "col" (M contiguous)
    b_major: str  # of the (N, K) view of b: "row" (K contiguous) | "col" (N contiguous)
    d_dtype: str  # dtype of D / preact / dpreact (store: bf16, fp16 or fp32; accumulate: fp32)
    bias_dtype: Optional[str] = None

    @property
    def name(self) -> str:
        s = f"{self.epilogue.key}_{self.ab_dtype}_a{self.a_major}_b{self.b_major}_d{self.d_dtype}_{self.config.key}"
        if self.bias_dtype:
            s += f"_bias{self.bias_dtype}"
        return s


_fingerprint: Optional[str] = None

# CuTe DSL settings that change the binary it emits: the names its env_manager marks
# affects_compile (nvidia-cutlass-dsl 4.8; the DSL's own JIT cache keys on them), read here as
# CUTE_DSL_<name> from the environment so that the key needs no `import cutlass`. CUTE_DSL_ARCH
# is not among them: every kernel here is built for _ARCH.
DSL_COMPILE_SETTINGS = ("AUTO_M2S", "COMPILER_BACKEND", "COMPILER_OPT", "DEBUG",
                        "ENABLE_ASSERTIONS", "ENABLE_PYIR", "ENABLE_TVM_FFI", "LINEINFO",
                        "LOC_TRACEBACKS", "TOLERATE_M2M", "USE_EXTENSION_COMPILER")


def source_fingerprint() -> str:
    """The disk cache's directory for this code: a hash of the kernels' sources, the
    activations' math, the DSL's version and the DSL settings that change its binaries (a
    debug or assertions build never lands where normal builds are looked up)."""
    global _fingerprint
    if _fingerprint is None:
        import importlib.metadata

        import parallel_mlp.activations as acts

        h = hashlib.sha256()
        here = Path(__file__).parent
        for p in sorted(here.glob("*.py")) + [Path(acts.__file__)]:
            h.update(p.name.encode())
            h.update(p.read_bytes())
        try:
            h.update(importlib.metadata.version("nvidia-cutlass-dsl").encode())
        except importlib.metadata.PackageNotFoundError:
            pass
        for name in DSL_COMPILE_SETTINGS:
            value = os.environ.get(f"CUTE_DSL_{name}")
            if value is not None:
                h.update(f"CUTE_DSL_{name}={value}".encode())
        _fingerprint = h.hexdigest()[:16]
    return _fingerprint


def fake_args(key: KernelKey):
    """The symbolic signature (mA, mB, mD, mPost, mPreIn, mDpre, mBias, mCounter, stream) of a
    kernel; mCounter (the dynamic scheduler's int32 tile counter, or stream-K's workspace) is
    None for the static scheduler without stream-K."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from .gemm_sm90 import cute_dtype, fake_matrix

    ab = cute_dtype(key.ab_dtype)
    dd = cute_dtype(key.d_dtype)
    spec = key.epilogue
    a = fake_matrix(ab, key.a_major)
    b = fake_matrix(ab, key.b_major)
    d = post = prein = dpre = bias = None
    if spec.kind in ("store", "accumulate"):
        d = fake_matrix(dd, "row")
    elif spec.kind == "act":
        if spec.store_preact:
            d = fake_matrix(dd, "row")
        post = fake_matrix(dd, "row")
        if spec.has_bias:
            bt = cute_dtype(key.bias_dtype)
            bias = make_fake_tensor(bt, (cute.sym_int32(),), (1,), assumed_align=bt.width // 8)
    else:  # dact
        post = fake_matrix(dd, "row")
        prein = fake_matrix(dd, "row")
        if spec.gated:
            dpre = fake_matrix(dd, "row")
        else:
            d = fake_matrix(dd, "row")
    counter = None
    if key.config.scheduler == "dynamic" or key.config.stream_k:
        counter = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    return a, b, d, post, prein, dpre, bias, counter, make_fake_stream()


@contextlib.contextmanager
def dsl_safe_argv():
    """Hide the process's command line from the DSL while it compiles.

    Where it builds a JIT engine (on a GPU host) the DSL runs ``argparse.parse_known_args()`` over
    ``sys.argv`` on every compile (looking for its ``-diagnostic`` flag). A user's own flags then
    collide with it: ``--h 7168`` is taken as an abbreviation of ``--help`` (prints usage and
    exits), ``-d 4096`` as ``-diagnostic 4096`` (an invalid choice: exits). So our compiles see a
    bare argv, and so does anything else that compiles through the DSL under this context (the
    benchmark runs quack's MLP inside it).
    """
    saved = sys.argv
    sys.argv = saved[:1] if saved else ["python"]
    try:
        yield
    finally:
        sys.argv = saved


def compile_kernel(key: KernelKey, keep_ptx: bool = False):
    """cute.compile one kernel for sm_90a (the target is a compile option, so this works on a
    machine without a GPU and never depends on CUTE_DSL_ARCH). Returns the compiled function;
    with keep_ptx its ``.artifacts.PTX`` holds the PTX text."""
    import cutlass.cute as cute

    from .gemm_sm90 import PersistentGemmSm90

    kernel = PersistentGemmSm90(key.config, key.epilogue)
    args = fake_args(key)
    with dsl_safe_argv(), warnings.catch_warnings():
        # Stream-K unrolls its loops over a thread's accumulators on purpose (range_constexpr:
        # each value's offset and register are static), 64-192 iterations; the DSL warns that
        # such a loop may compile slowly (these compile in 1-3 s).
        warnings.filterwarnings("ignore", message="This static loop has")
        if keep_ptx:
            compiled = _compile_with_ptx(kernel, args)
        else:
            compiled = cute.compile(kernel, *args, options=f"--gpu-arch {_ARCH}")
    return compiled


def kernel_ptx(key: KernelKey) -> str:
    """The sm_90a PTX text of one kernel, compiled here (no GPU needed). The DSL hands it back as
    str or bytes depending on its version; this is always str."""
    ptx = compile_kernel(key, keep_ptx=True).artifacts.PTX
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def _compile_with_ptx(kernel, args):
    """Compile with the PTX kept (the DSL writes it into a dump directory that must exist; the
    compiled function then carries the PTX text in ``.artifacts.PTX``)."""
    import tempfile

    import cutlass.cute as cute

    with tempfile.TemporaryDirectory(prefix="pmlp_ptx_") as d:
        return cute.compile(kernel, *args, options=f"--gpu-arch {_ARCH} --keep-ptx --dump-dir={d}")


# ---- caches ------------------------------------------------------------------------------------

_memory: dict = {}
_lock = threading.Lock()


def _export_name(key: KernelKey) -> str:
    return "pmlp_" + hashlib.sha256(key.name.encode()).hexdigest()[:20]


def object_path(key: KernelKey) -> Path:
    """Where the disk cache keeps `key`'s exported object."""
    return cache_dir() / "kernels" / source_fingerprint() / f"{_export_name(key)}.o"


def get_kernel(key: KernelKey, use_disk: bool = True):
    """The compiled kernel for `key`: from memory, else from the disk cache, else compiled now."""
    fn = _memory.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _memory.get(key)
        if fn is not None:
            return fn
        name = _export_name(key)
        d = cache_dir() / "kernels" / source_fingerprint()
        obj = d / f"{name}.o"
        if use_disk and obj.exists():
            fn = _load_cached(obj, name)  # None: corrupt or incompatible, a miss; recompile below
        if fn is None:
            fn = compile_kernel(key)
            if use_disk:
                _export(fn, d, name)
        _memory[key] = fn
        return fn


def _load_cached(obj: Path, name: str):
    """An exported kernel from the disk cache: through the DSL's C runtime when it is installed
    (aot_runtime: no `import cutlass`, ~0.5 s less for a new process), else through the DSL's
    own loader. PARALLEL_MLP_C_RUNTIME=0 forces the DSL's loader. None if neither loads it."""
    from . import aot_runtime

    if os.environ.get("PARALLEL_MLP_C_RUNTIME", "1") != "0" and aot_runtime.available():
        try:
            return aot_runtime.LoadedKernel(obj, name)
        except Exception:  # noqa: BLE001 - try the DSL's loader before calling it a miss
            pass
    try:
        import cutlass.runtime

        return getattr(cutlass.runtime.load_module(str(obj)), name)
    except Exception:  # noqa: BLE001
        return None


def _export(fn, d: Path, name: str):
    """Write the object file atomically (temp dir + rename), so a killed process never leaves a
    truncated object behind that every later process would fail to load."""
    import tempfile

    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=d, prefix=".tmp_") as tmp:
            fn.export_to_c(tmp, name, name)
            os.replace(Path(tmp) / f"{name}.o", d / f"{name}.o")
    except Exception as e:  # the cache is an optimization: never fail the op over it
        import warnings

        warnings.warn(f"parallel_mlp: could not write kernel cache {d}: {e}", RuntimeWarning)
