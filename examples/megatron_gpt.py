"""A tiny Megatron-core GPT whose MLPs are parallel_mlp's, trained for a few steps.

    torchrun --nproc-per-node 2 examples/megatron_gpt.py                   # TP=2
    torchrun --nproc-per-node 2 examples/megatron_gpt.py --sequence-parallel --recompute

The tensor-parallel size is the world size. The model is Megatron's own ``GPTModel`` built from
``parallel_mlp.integrations.megatron.gpt_layer_spec()``: Megatron's local transformer layer with
``MegatronParallelMLP`` as its MLP. It learns synthetic arithmetic sequences (token t+1 = token t
+ a per-row stride, modulo the vocabulary), so nothing is downloaded and the loss falls within
the default 40 steps.

With CUDA: NCCL, one GPU per rank, bf16 parameters. Without: gloo on the CPU in fp32. Megatron-core
supports only CUDA, so on a CPU-only machine this script patches the few places where it assumes
a GPU, with the shim the tests use (tests/integrations/megatron_cpu.py); nothing in parallel_mlp
changes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64, help="hidden_size (d)")
    p.add_argument("--ffn", type=int, default=192, help="ffn_hidden_size (h)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron's sequence parallelism (our MLP gathers and scatters the sequence)")
    p.add_argument("--recompute", action="store_true",
                   help="our MLP keeps only its input for backward and replays fc1 there")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def setup(args):
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        dist.init_process_group("gloo")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // dist.get_world_size()))
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integrations"))
        import megatron_cpu

        megatron_cpu.patch_megatron_for_cpu()
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=dist.get_world_size())
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    return cuda


def build(args, cuda):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from parallel_mlp.integrations.megatron import gpt_layer_spec

    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        ffn_hidden_size=args.ffn, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, normalization="RMSNorm",
        tensor_model_parallel_size=dist.get_world_size(),
        sequence_parallel=args.sequence_parallel and dist.get_world_size() > 1,
        use_cpu_initialization=not cuda, params_dtype=torch.bfloat16 if cuda else torch.float32,
        bf16=cuda, hidden_dropout=0.0, attention_dropout=0.0,
        # Megatron's fused kernels are CUDA-only extensions; our MLP fuses its own.
        masked_softmax_fusion=False, bias_dropout_fusion=False, bias_activation_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False)
    model = GPTModel(config=config, transformer_layer_spec=gpt_layer_spec(recompute=args.recompute),
                     vocab_size=args.vocab, max_sequence_length=args.seq,
                     position_embedding_type="rope")
    return model.cuda() if cuda else model


def batch(args, step, device):
    g = torch.Generator().manual_seed(10_000 + step)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    stride = torch.randint(1, 5, (args.batch, 1), generator=g)
    seq = (start + stride * torch.arange(args.seq + 1)) % args.vocab
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


def main(argv=None):
    args = parse_args(argv)
    cuda = setup(args)
    from megatron.core import parallel_state

    from parallel_mlp import allreduce_sequence_parallel_grads

    rank, tp = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    model = build(args, cuda)
    mlp = model.decoder.layers[0].mlp
    if rank == 0:
        print(f"GPT with {type(mlp).__name__} ({mlp.activation.name}), TP={tp}, "
              f"sequence_parallel={mlp.sequence_parallel}, recompute={mlp.recompute}, "
              f"device={device.type}", flush=True)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    positions = torch.arange(args.seq, device=device).unsqueeze(0).expand(args.batch, -1)
    # Megatron builds its default causal mask on CUDA; give it explicitly (True = masked out).
    mask = torch.triu(torch.ones(args.seq, args.seq, dtype=torch.bool, device=device), 1)[None, None]
    losses, start = [], time.time()
    for step in range(1, args.steps + 1):
        tokens, labels = batch(args, step, device)
        loss = model(tokens, positions, attention_mask=mask, labels=labels).float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # Norms and our fc2 bias see only this rank's tokens under sequence parallelism; Megatron's
        # DDP sums their gradients in finalize_model_grads, a plain loop does it here.
        allreduce_sequence_parallel_grads(model, parallel_state.get_tensor_model_parallel_group())
        opt.step()
        losses.append(loss.item())
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step:4d}/{args.steps} loss {losses[-1]:.4f} "
                  f"({(time.time() - start) / step * 1000:.0f} ms/step)", flush=True)
    if rank == 0:
        print(f"first loss {losses[0]:.4f} last loss {losses[-1]:.4f}", flush=True)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
