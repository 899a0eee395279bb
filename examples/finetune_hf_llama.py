#!/usr/bin/env python
"""Fine-tune a Hugging Face Llama whose MLPs are tensor-parallel ``ParallelMLP`` layers, save it in
Hugging Face's format, reload it and carry on.

    torchrun --nproc-per-node 2 examples/finetune_hf_llama.py               # tiny random Llama
    torchrun --nproc-per-node 8 examples/finetune_hf_llama.py --model PATH  # a local checkpoint

Every rank is one tensor-parallel (TP) rank, TP size = world size. What happens:

1. the model is loaded on every rank (a local checkpoint with ``--model``, else a tiny random
   Llama drawn from the same seed everywhere), and ``replace_mlps`` swaps each MLP for a
   ParallelMLP holding this rank's rows of ``gate_proj``/``up_proj`` and columns of
   ``down_proj``; attention, embeddings and norms stay replicated, every rank reads the same batch;
2. ``--steps`` AdamW steps on byte-level tokens of the synthetic corpus of
   examples/pretrain_gpt.py (or ``--data FILE``), gradients clipped by their global norm;
3. ``save_pretrained(OUT, state_dict=hf_state_dict(model))``: a plain Hugging Face checkpoint
   (``gate_proj``/``up_proj``/``down_proj``, global tensors) that transformers alone can load;
4. that checkpoint is loaded back with ``from_pretrained``, swapped again, and trained for
   ``--more-steps``: the loss on a held-out batch is the same before saving and after
   reloading, and training carries on from there.

(``python examples/finetune_hf_llama.py`` runs it at TP=1 without a process group.)
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pretrain_gpt import (clip_grad_norm, get_batch, load_corpus,  # noqa: E402
                          setup_distributed)

from parallel_mlp.integrations.hf import hf_state_dict, replace_mlps  # noqa: E402

EVAL_STEP = -1  # the held-out batch: get_batch's stream at a step no training step uses


def tiny_llama(seq_len: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=seq_len)
    torch.manual_seed(seed)  # the same weights on every rank
    return LlamaForCausalLM(config)


def load(path: str | None, args, device):
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    model = (tiny_llama(args.seq_len, args.seed) if path is None
             else AutoModelForCausalLM.from_pretrained(path, dtype=dtype))
    model = model.to(device=device, dtype=dtype)
    replace_mlps(model, recompute=args.recompute)  # collective: every rank's shard, TP = world
    return model


def eval_batch(data, args):
    return get_batch(data, EVAL_STEP, args.batch_size, args.seq_len, args.seed)


@torch.no_grad()
def eval_loss(model, data, args, device) -> float:
    model.eval()
    x, _ = eval_batch(data, args)
    loss = model(input_ids=x.to(device), labels=x.to(device)).loss.item()
    model.train()
    return loss


def train(model, data, args, device, steps: range, say) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses = []
    for step in steps:
        # HF's causal-LM loss shifts the labels itself: labels are the inputs.
        x, _ = get_batch(data, step, args.batch_size, args.seq_len, args.seed)
        x = x.to(device)
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(model, 1.0)  # TP-aware: the MLP shards' norms summed over the ranks
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % args.log_every == 0:
            say(f"step {step + 1:>4} | loss {losses[-1]:.4f}")
    return losses


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="a local Hugging Face checkpoint directory; "
                   "default: a tiny random Llama (nothing is downloaded)")
    p.add_argument("--out", default="finetuned-llama", help="where to save the HF checkpoint")
    p.add_argument("--steps", type=int, default=30, help="steps before saving")
    p.add_argument("--more-steps", type=int, default=10, help="steps after reloading")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW; real checkpoints want ~1e-5")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--recompute", action="store_true", help="ParallelMLP keeps only its input "
                   "for backward and replays fc1 there")
    p.add_argument("--data", default=None, help="a text file (byte-level tokens); default: the "
                   "synthetic corpus of examples/pretrain_gpt.py")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=1234, help="the same on every rank")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = setup_distributed(args.backend, args.device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    say = print if rank == 0 else (lambda *a, **k: None)
    data = load_corpus(args.data, args.seed, args.seq_len)

    model = load(args.model, args, device)
    say(f"{args.model or 'tiny random Llama'}: MLPs split over TP={world}, device {device}")
    losses = train(model, data, args, device, range(args.steps), say)
    before = eval_loss(model, data, args, device)

    state = hf_state_dict(model)  # collective: gathers every ParallelMLP
    model.save_pretrained(args.out, state_dict=state)  # rank 0 writes
    say(f"saved {args.out} (Hugging Face format)")
    del model, state
    if dist.is_initialized():
        dist.barrier()  # the files are complete before anyone reads them

    model = load(args.out, args, device)
    after = eval_loss(model, data, args, device)
    more = train(model, data, args, device, range(args.steps, args.steps + args.more_steps), say)
    say(f"held-out loss before saving {before:.6f} after reloading {after:.6f}")
    if losses and more:
        say(f"training loss: first {losses[0]:.4f}, last before saving {losses[-1]:.4f}; "
            f"after reloading first {more[0]:.4f}, last {more[-1]:.4f}")

    if dist.is_initialized():
        del model
        gc.collect()  # see pretrain_gpt.main: the group's threads stop inside destroy
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
