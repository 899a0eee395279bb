"""examples/finetune_hf_llama.py end to end: torchrun at TP=2 on CPU/gloo fine-tunes a tiny random
Llama with our MLPs, saves it in Hugging Face's format, reloads it and carries on. The saved
checkpoint is then loaded by transformers alone (no parallel_mlp), with no missing or unexpected
keys, and gives the held-out loss the example printed."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (the 'hf' extra)")

from dist_utils import run_on_cpu, torchrun_command  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED, SEQ_LEN, BATCH = 1234, 64, 8  # the example's defaults

pytestmark = pytest.mark.slow


def _torchrun(nproc, *args, cwd):
    return run_on_cpu(torchrun_command(nproc, EXAMPLES / "finetune_hf_llama.py", "--device", "cpu",
                                       "--backend", "gloo", *args), cwd)


def _number(pattern, out):
    m = re.search(pattern, out)
    assert m, f"no {pattern!r} in:\n{out[-2000:]}"
    return [float(g) for g in m.groups()]


def held_out_loss(directory) -> float:
    """The example's held-out batch, through transformers' own model loaded from ``directory``."""
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(EXAMPLES))
    try:
        from pretrain_gpt import get_batch, load_corpus
    finally:
        sys.path.remove(str(EXAMPLES))
    model, info = LlamaForCausalLM.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    x, _ = get_batch(load_corpus(None, SEED, SEQ_LEN), -1, BATCH, SEQ_LEN, SEED)
    with torch.no_grad():
        return model(input_ids=x, labels=x).loss.item()


def test_finetune_save_reload_continue_at_tp2(tmp_path):
    out = _torchrun(2, "--steps", "30", "--more-steps", "10", "--out", str(tmp_path / "ckpt"),
                    cwd=tmp_path)
    assert "MLPs split over TP=2" in out, out[-2000:]
    before, after = _number(r"held-out loss before saving (\d+\.\d+) after reloading (\d+\.\d+)",
                            out)
    assert before == after  # the reloaded model is the saved one, at the same TP size
    first, last_saved, first_reloaded, last = _number(
        r"training loss: first (\d+\.\d+), last before saving (\d+\.\d+); after reloading "
        r"first (\d+\.\d+), last (\d+\.\d+)", out)
    assert abs(first - math.log(256)) < 0.3, first  # knows nothing yet
    assert last_saved < 0.5 * first, (first, last_saved)
    # Training picks up where it stopped, not from scratch.
    assert abs(first_reloaded - last_saved) < 0.5 and last < 0.5 * first, out[-1500:]
    # transformers alone reads the checkpoint, and it is the model that was trained.
    assert abs(held_out_loss(tmp_path / "ckpt") - before) < 1e-5
