"""Megatron-core 0.16 on a CPU-only torch with gloo, for the tests: the few places it assumes CUDA,
patched here (in the test processes only, never in the library).

- ``torch.cuda.current_device()`` is used as a device (the sequence-parallel gather buffer, the
  reduce-scatter output in its linears' backward, DDP's buffers): it returns the CPU device.
- Megatron's model-parallel RNG tracker keeps CUDA generator states: it keeps CPU ones instead, and
  ``model_parallel_cuda_manual_seed`` also seeds the CPU generator (on a CPU build
  ``torch.cuda.manual_seed`` is a silent no-op, and replicated dropout would drift across ranks).
- Its torch LayerNorm (the norm of the local layer spec without Apex or Transformer Engine)
  refuses sequence parallelism only because it does not mark its parameters: build it with
  ``sequence_parallel`` set on them, as Megatron's fused norms do (their gradients are then
  summed over the TP group like fc2's bias).
- Distributed checkpointing: its writer synchronizes CUDA after preloading tensors (preload
  without ``non_blocking``), starts a ``spawn`` manager process for its results queue (which re-runs
  a script without a ``__main__`` guard and hangs; a plain queue does for synchronous saves), and
  its workers hang without psutil (report zero memory instead).
"""

from __future__ import annotations

import contextlib
import queue
import warnings

import torch

_PATCHED = False


def patch_megatron_for_cpu() -> None:
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*not installed.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.cuda.current_device = lambda: torch.device("cpu")

    import megatron.core.tensor_parallel as mtp
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

    class CPURNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """The stock tracker's bookkeeping over CPU generator states."""

        def add(self, name, seed):
            if seed in self.seeds_ or name in self.states_:
                raise Exception(f"rng state {name} / seed {seed} already exists")
            self._is_initialized = True
            self.seeds_.add(seed)
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    mrandom.CudaRNGStatesTracker = CPURNGStatesTracker
    mrandom._CUDA_RNG_STATE_TRACKER = None
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = False
    seed_all = mrandom.model_parallel_cuda_manual_seed

    def model_parallel_cuda_manual_seed(seed, *args, **kwargs):
        torch.manual_seed(seed)
        return seed_all(seed, *args, **kwargs)

    mrandom.model_parallel_cuda_manual_seed = model_parallel_cuda_manual_seed
    mtp.model_parallel_cuda_manual_seed = model_parallel_cuda_manual_seed

    from megatron.core.transformer import torch_norm

    make_norm = torch_norm.WrappedTorchNorm.__new__

    def norm_marked_for_sequence_parallel(cls, config, hidden_size, *args, **kwargs):
        sp, config.sequence_parallel = config.sequence_parallel, False
        try:
            norm = make_norm(cls, config, hidden_size, *args, **kwargs)
        finally:
            config.sequence_parallel = sp
        for p in norm.parameters():
            p.sequence_parallel = sp
        return norm

    torch_norm.WrappedTorchNorm.__new__ = norm_marked_for_sequence_parallel

    from megatron.core.dist_checkpointing.strategies import filesystem_async as fa

    preload = fa.FileSystemWriterAsync.preload_tensors
    fa.FileSystemWriterAsync.preload_tensors = staticmethod(
        lambda write_buckets, non_blocking=True: preload(write_buckets, non_blocking=False))
    fa._results_queue = queue.Queue()
    if not fa.HAVE_PSUTIL:
        fa._process_memory = lambda: 0


def init_megatron(tp_size: int, seed: int = 1234) -> None:
    """Megatron's parallel state over the already-initialized gloo world, TP = tp_size."""
    patch_megatron_for_cpu()
    from megatron.core import parallel_state, tensor_parallel

    from dist_utils import at_teardown

    parallel_state.destroy_model_parallel()
    # Every group is gloo here, so Megatron's extra gloo copies of its data-parallel groups
    # would only add threads.
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size,
                                             create_gloo_process_groups=False)
    # Its module globals hold the subgroups: released before the world group is destroyed, so
    # their gloo threads do not outlive it into interpreter shutdown (which can abort the rank
    # with "terminate called without an active exception").
    at_teardown(parallel_state.destroy_model_parallel)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(**overrides):
    """A small fp32 CPU TransformerConfig with Megatron's fusions off."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core import parallel_state

    kw = dict(num_layers=1, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48,
              tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
              use_cpu_initialization=True, params_dtype=torch.float32,
              masked_softmax_fusion=False, bias_dropout_fusion=False, bias_activation_fusion=False,
              apply_rope_fusion=False, gradient_accumulation_fusion=False,
              persist_layer_norm=False, hidden_dropout=0.0, attention_dropout=0.0)
    kw.update(overrides)
    return TransformerConfig(**kw)
