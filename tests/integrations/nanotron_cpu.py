"""nanotron 0.4 on a CPU-only machine, for the tests: its obstacles worked around here, in the
test processes only (never in the library).

- Import cycle: ``nanotron.logging`` imports ``nanotron.config.config`` for an annotation, which
  imports back into ``nanotron.logging`` through the pipeline engine; every entry point fails
  (``cannot import name 'log_rank' from partially initialized module``). The config module is
  created with a placeholder for that one name before it runs; its own body replaces it.
- ``flash_attn`` is imported at module level by ``nanotron.models.llama`` (and its layer norm);
  stub modules stand in, raising if anything in them is called (the MLP calls none).
- Its async TP linears assert ``CUDA_DEVICE_MAX_CONNECTIONS=1``; set.
- ``ParallelContext`` sets a CUDA device: ``nanotron.serialize`` gets a stand-in with only what
  it reads (the groups, the rank matrix).
- numpy 2: nanotron 0.4 writes ``np.int64(24)`` into a checkpoint's shape metadata and its own
  reader then refuses it (resharding fails); the reader is given a parser that accepts both.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import sys
import types

FLASH_ATTN = ("flash_attn", "flash_attn.bert_padding", "flash_attn.flash_attn_interface",
              "flash_attn.layers", "flash_attn.layers.rotary", "flash_attn.ops",
              "flash_attn.ops.triton", "flash_attn.ops.triton.layer_norm")


def _refuse(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"{name}: flash_attn is stubbed out in the CPU tests")
    return call


def _stub_flash_attn() -> None:
    if "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
        return
    for name in FLASH_ATTN:
        module = types.ModuleType(name)
        module.__path__ = []
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    interface = sys.modules["flash_attn.flash_attn_interface"]
    interface.flash_attn_varlen_func = _refuse("flash_attn_varlen_func")
    interface.flash_attn_with_kvcache = _refuse("flash_attn_with_kvcache")
    sys.modules["flash_attn.layers.rotary"].RotaryEmbedding = _refuse("RotaryEmbedding")
    sys.modules["flash_attn.ops.triton.layer_norm"].layer_norm_fn = _refuse("layer_norm_fn")


def _break_import_cycle() -> None:
    config = sys.modules.get("nanotron.config.config")
    if config is not None and hasattr(config, "Config"):
        return
    import nanotron  # noqa: F401  (its __init__ stays out of the cycle)

    package_spec = importlib.util.find_spec("nanotron.config")
    package = importlib.util.module_from_spec(package_spec)
    sys.modules["nanotron.config"] = package
    spec = importlib.util.find_spec("nanotron.config.config")
    module = importlib.util.module_from_spec(spec)
    module.LoggingArgs = type("LoggingArgs", (), {})  # the one name nanotron.logging needs early
    sys.modules["nanotron.config.config"] = module
    spec.loader.exec_module(module)
    package_spec.loader.exec_module(package)
    nanotron.config, package.config = package, module


def _accept_numpy_ints_in_shapes() -> None:
    from typing import Tuple

    import dacite
    import torch
    from nanotron.serialize.metadata import TensorMetadata

    def shape(text: str) -> torch.Size:
        text = re.sub(r"np\.\w+\((-?\d+)\)", r"\1", text)  # "(np.int64(24), 8)" -> "(24, 8)"
        return torch.Size(int(s) for s in text.strip("()").split(",") if s.strip())

    config = TensorMetadata._metadata_config
    hooks = dict(config.type_hooks)
    hooks[Tuple[int, ...]] = shape
    TensorMetadata._metadata_config = dacite.Config(cast=config.cast, type_hooks=hooks,
                                                    strict=config.strict)


def install() -> None:
    """Call before importing anything under nanotron (in every process)."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _break_import_cycle()
    _accept_numpy_ints_in_shapes()


def import_llama():
    """``nanotron.models.llama``, with flash-attn stubbed where it is not installed. Called only in
    the spawned test processes: a stub in the pytest process would tell other libraries that
    probe for flash-attn (transformers) that it is there."""
    _stub_flash_attn()
    from nanotron.models import llama

    return llama


class SerializeContext:
    """What ``nanotron.serialize.save_weights`` / ``load_weights`` read of a ParallelContext, for
    TP only (one pipeline stage, one data-parallel rank), over the given TP group."""

    def __init__(self, tp_pg):
        import numpy as np
        import torch.distributed as dist

        self.world_pg = self.tp_pg = tp_pg
        # one data-parallel (and pipeline) group per rank; every rank creates every group
        singles = [dist.new_group([r]) for r in range(dist.get_world_size())]
        self.dp_pg = self.pp_pg = singles[dist.get_rank()]
        ranks = tuple(sorted(dist.get_process_group_ranks(tp_pg)))
        self.world_ranks_to_pg = {ranks: tp_pg}
        self.world_rank_matrix = np.arange(dist.get_world_size()).reshape(1, 1, 1, -1)
        self._ranks = ranks

    def get_3d_ranks(self, world_rank):
        return (0, 0, self._ranks.index(world_rank))
