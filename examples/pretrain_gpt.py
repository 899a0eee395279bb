#!/usr/bin/env python
"""Pretrain a small GPT whose MLPs are tensor-parallel ``parallel_mlp.ParallelMLP`` layers.

Start it with torchrun; every rank is one tensor-parallel (TP) rank, TP size = world size:

    torchrun --nproc-per-node 2 examples/pretrain_gpt.py            # CPU + gloo, synthetic data
    torchrun --nproc-per-node 8 examples/pretrain_gpt.py --data input.txt --d-model 512 ...

(``python examples/pretrain_gpt.py`` also works and runs at TP=1 without a process group.)

What is parallel and what is not:

- the MLP of every block is a ParallelMLP over the world group: fc1 column-parallel, fc2
  row-parallel, one all-reduce per pass;
- embeddings, attention, norms and the LM head are replicated: every rank holds the same copy and
  computes the same thing on the same batch. There is no data parallelism, so every rank reads the
  same batch.

Every rank uses the same seed. ParallelMLP draws each weight at its *global* shape and keeps its
slice, so the model is the same at any TP size, and so is a checkpoint: ``--save`` gathers each
ParallelMLP through ``full_state_dict()`` and the AdamW moments of its shards through the same TP
metadata (``partition_dim``), and ``--resume`` slices them again for the TP size it runs at. A run
saved at TP=2 therefore resumes at TP=1 or TP=4 with its full optimizer state and step counter.

Data: by default a synthetic corpus made in-process from a seeded first-order Markov chain over
a small alphabet (no download; the same on every rank and every run), which a small model learns
quickly. ``--data FILE`` trains on the bytes of a text file instead. Either way the vocabulary is
the 256 byte values.

Devices: with CUDA GPUs, one GPU per rank (``LOCAL_RANK``), NCCL and bf16 autocast; otherwise CPU
and gloo in fp32.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import parallel_mlp
from parallel_mlp import ParallelMLP

VOCAB_SIZE = 256  # byte-level tokens, for the synthetic corpus and for --data alike
CHECKPOINT_FORMAT = 1


# ---- the model ----------------------------------------------------------------------------------


@dataclass
class GPTConfig:
    vocab_size: int = VOCAB_SIZE
    seq_len: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    activation: str = "swiglu"
    # The MLP width is rounded up to a multiple of this, so that it splits evenly at the TP sizes
    # a checkpoint may move between (64: any power of two up to 64 for the default model).
    multiple_of: int = 64
    tied_head: bool = True


class CausalSelfAttention(nn.Module):
    """Plain multi-head causal attention; replicated on every rank (not tensor-parallel)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        # [batch, seq, d] -> [batch, heads, seq, d / heads]
        q, k, v = (t.view(batch, seq, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig, recompute: bool, mlp_backend: str):
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model)
        # The one tensor-parallel piece: split over the default (world) process group.
        self.mlp = ParallelMLP(cfg.d_model, activation=cfg.activation,
                               multiple_of=cfg.multiple_of, recompute=recompute,
                               backend=mlp_backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, recompute: bool = False, mlp_backend: str = "auto"):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, recompute, mlp_backend)
                                    for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_replicated_weights()
        if cfg.tied_head:
            self.lm_head.weight = self.tok_emb.weight

    @torch.no_grad()
    def _init_replicated_weights(self) -> None:
        # GPT-2-like init for the replicated layers; ParallelMLP initialized itself (global draw,
        # then slice). The output projection of attention is scaled down with depth.
        for name, p in self.named_parameters():
            if ".mlp." in name or p.dim() < 2:
                continue
            std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith("attn.proj.weight") \
                else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.final_norm(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


# ---- data ---------------------------------------------------------------------------------------


def synthetic_corpus(seed: int, n_tokens: int = 200_000, alphabet: int = 32,
                     probs: tuple[float, ...] = (0.6, 0.3, 0.1)) -> torch.Tensor:
    """A seeded first-order Markov chain over ``alphabet`` printable byte values.

    After each symbol only ``len(probs)`` successors may follow, drawn with skewed probabilities,
    so the stream has structure a small model picks up in a few dozen steps: the loss falls from
    ln 256 ~ 5.5 (uniform over bytes) past ln 32 ~ 3.5 (which symbols occur) towards the chain's
    entropy rate, ~0.9 nats (which symbol follows which); see :func:`entropy_floor`.
    """
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, alphabet, (alphabet, len(probs)), generator=g).tolist()
    # All choices drawn at once; only the walk itself is sequential.
    choices = torch.multinomial(torch.tensor(probs), n_tokens, replacement=True,
                                generator=g).tolist()
    state, out = 0, [0] * n_tokens
    for i, c in enumerate(choices):
        state = successors[state][c]
        out[i] = state
    return torch.tensor(out, dtype=torch.long) + ord("a")  # printable, for a look at the data


def entropy_floor(data: torch.Tensor) -> float:
    """The corpus's empirical next-byte entropy given the previous byte, in nats: the loss a
    perfect bigram model would reach (the synthetic corpus has no longer-range structure)."""
    pairs = torch.bincount(data[:-1] * VOCAB_SIZE + data[1:], minlength=VOCAB_SIZE ** 2)
    pairs = pairs.view(VOCAB_SIZE, VOCAB_SIZE).double()
    p_next = pairs / pairs.sum(1, keepdim=True).clamp(min=1)
    h_row = -(p_next * p_next.clamp(min=1e-30).log()).sum(1)
    return float((h_row * pairs.sum(1)).sum() / pairs.sum())


def load_corpus(path: str | None, seed: int, seq_len: int) -> torch.Tensor:
    if path is None:
        data = synthetic_corpus(seed)
    else:
        with open(path, "rb") as f:
            raw = f.read()
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    if data.numel() < seq_len + 2:
        raise ValueError(f"the corpus has {data.numel()} tokens; --seq-len {seq_len} needs at "
                         f"least {seq_len + 2}")
    return data


def get_batch(data: torch.Tensor, step: int, batch_size: int, seq_len: int, seed: int):
    """The batch of ``step``: a function of (seed, step) only, so every rank reads the same batch
    and a resumed run reads exactly what the uninterrupted run would have read."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=g)
    offsets = torch.arange(seq_len + 1)
    chunk = data[starts[:, None] + offsets]
    return chunk[:, :-1], chunk[:, 1:]


# ---- checkpoints --------------------------------------------------------------------------------
#
# A checkpoint holds global tensors only, so it does not depend on the TP size:
#   model:  every replicated tensor as it is, plus each ParallelMLP's full_state_dict()
#   optim:  AdamW state per parameter *name*; for the TP shards (param.tensor_model_parallel) the
#           moments are gathered along param.partition_dim, exactly like the weights
# Only collectives run on every rank; rank 0 writes the file.


def _mlp_modules(model: nn.Module) -> dict[str, ParallelMLP]:
    return {name: m for name, m in model.named_modules() if isinstance(m, ParallelMLP)}


def _is_tp_shard(p: torch.Tensor) -> bool:
    return bool(getattr(p, "tensor_model_parallel", False))


def _gather_shard(t: torch.Tensor, dim: int) -> torch.Tensor:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return t.detach().cpu().clone()
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.detach().contiguous())
    return torch.cat(parts, dim=dim).cpu()


def _slice_shard(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    rank, size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return full.chunk(size, dim=p.partition_dim)[rank]


def _param_names(model: nn.Module) -> dict[int, str]:
    """id(param) -> its first name (tied weights appear once, as in model.parameters())."""
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def save_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
                    args: argparse.Namespace) -> None:
    model_sd = {}
    for prefix, mlp in _mlp_modules(model).items():
        for key, t in mlp.full_state_dict().items():  # collective
            model_sd[f"{prefix}.{key}"] = t.cpu()
    for key, t in model.state_dict().items():
        if key not in model_sd and not _is_mlp_key(model, key):
            model_sd[key] = t.detach().cpu().clone()

    names = _param_names(model)
    optim_state = {}
    for p in (p for group in optimizer.param_groups for p in group["params"]):
        state = optimizer.state.get(p, {})
        entry = {}
        for k, v in state.items():
            if torch.is_tensor(v) and v.shape == p.shape and _is_tp_shard(p):
                entry[k] = _gather_shard(v, p.partition_dim)  # collective
            else:
                entry[k] = v.detach().cpu().clone() if torch.is_tensor(v) else v
        optim_state[names[id(p)]] = entry

    if _rank() == 0:
        ckpt = dict(format=CHECKPOINT_FORMAT, step=step, model=model_sd, optim=optim_state,
                    config=asdict(model.cfg), saved_at_tp_size=_world_size(),
                    args=vars(args))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp"
        torch.save(ckpt, tmp)
        os.replace(tmp, path)  # a crash mid-write never leaves a torn checkpoint behind
    if dist.is_initialized():
        dist.barrier()


def _is_mlp_key(model: nn.Module, key: str) -> bool:
    return any(key.startswith(prefix + ".") for prefix in _mlp_modules(model))


def load_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load a checkpoint written at any TP size; returns the step to continue from."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a checkpoint of this script (format {ckpt.get('format')!r})")
    saved_cfg, cfg = ckpt["config"], asdict(model.cfg)
    diff = {k: (saved_cfg.get(k), v) for k, v in cfg.items() if saved_cfg.get(k) != v}
    if diff:
        flags = ", ".join(f"{k}: checkpoint {a!r}, this run {b!r}" for k, (a, b) in diff.items())
        raise ValueError(f"{path} holds a different model ({flags}); pass the model flags it was "
                         f"trained with")

    model_sd = ckpt["model"]
    for prefix, mlp in _mlp_modules(model).items():
        mlp.load_full_state_dict({k[len(prefix) + 1:]: v for k, v in model_sd.items()
                                  if k.startswith(prefix + ".")})
    rest = {k: v for k, v in model_sd.items() if not _is_mlp_key(model, k)}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    missing = [k for k in missing if not _is_mlp_key(model, k)]
    if missing or unexpected:
        raise ValueError(f"{path}: missing keys {missing}, unexpected keys {unexpected}")

    # Rebuild the optimizer's own state dict (indices, not names) at this run's TP size.
    names = _param_names(model)
    osd = optimizer.state_dict()
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            saved = ckpt["optim"].get(names[id(p)])
            if saved:
                osd["state"][index] = {
                    k: (_slice_shard(v, p) if torch.is_tensor(v) and _is_tp_shard(p)
                        and v.dim() == p.dim() else v)
                    for k, v in saved.items()}
            index += 1
    optimizer.load_state_dict(osd)  # moves the state to each parameter's device
    return int(ckpt["step"])


# ---- the training loop --------------------------------------------------------------------------


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def setup_distributed(backend: str, device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this PyTorch sees no CUDA device (use --device cpu or "
                         "auto)")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        # torch.optim imports torch._dynamo on first use, and that import keeps references to
        # the default process group if one exists already. The group would then outlive
        # destroy_process_group() and its gloo threads would be torn down during interpreter
        # shutdown, which can abort ("terminate called without an active exception"). Import
        # it before the group exists.
        importlib.import_module("torch._dynamo")
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
    return dev


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup, then cosine decay to 10% of --lr at --steps."""
    warmup = max(1, min(args.warmup, args.steps // 5))
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


@torch.no_grad()
def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip by the norm of the *global* gradient, the same on every rank and at every TP size.

    torch.nn.utils.clip_grad_norm_ would see only this rank's shards of the MLP weights, so each
    rank would scale by a different factor and the replicated weights would drift apart. Here the
    shards' squared norms are summed over the TP group and the replicated ones counted once.
    """
    replicated = torch.zeros((), dtype=torch.float32, device=next(model.parameters()).device)
    sharded = torch.zeros_like(replicated)
    for p in model.parameters():
        if p.grad is not None:
            sq = p.grad.float().pow(2).sum()
            if _is_tp_shard(p):
                sharded += sq
            else:
                replicated += sq
    if dist.is_initialized():
        dist.all_reduce(sharded)
    total = (replicated + sharded).sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype))
    return total.item()


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


class Progress:
    """Rank 0's progress line: tqdm when importable on a terminal, an in-place line on a plain
    terminal, and one line every --log-every steps when the output is a file or a pipe."""

    def __init__(self, start: int, total: int, log_every: int, enabled: bool):
        self.total, self.log_every, self.enabled = total, log_every, enabled
        self.bar = None
        self.tty = sys.stdout.isatty()
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.3f} | {tokens_per_s:,.0f} tok/s")
            self.bar.update(1)
            return
        line = f"step {step + 1:>5}/{self.total} | loss {loss:.4f} | {tokens_per_s:,.0f} tok/s"
        if self.tty:
            print(f"\r{line}\x1b[K", end="", flush=True)  # \x1b[K: clear the rest
        elif (step + 1) % self.log_every == 0 or step + 1 == self.total:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.tty:
            print()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="total optimizer steps (a resumed run "
                   "continues up to this step)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--activation", default="swiglu", choices=sorted(parallel_mlp.ACTIVATIONS))
    p.add_argument("--multiple-of", type=int, default=64,
                   help="round the MLP width up to a multiple of this (it must split evenly "
                   "over the TP size)")
    p.add_argument("--untied-head", action="store_true",
                   help="give the LM head its own weight instead of the token embedding's")
    p.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (AdamW); the "
                   "default suits the tiny default model, real sizes want ~3e-4")
    p.add_argument("--warmup", type=int, default=5, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--recompute", action="store_true",
                   help="ParallelMLP saves only its input and replays fc1 in backward")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                   help="torch.distributed backend; auto: nccl with CUDA, else gloo")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mlp-backend", default="auto", choices=list(parallel_mlp.BACKENDS),
                   help="ParallelMLP's GEMM backend (cute: the CuTe DSL kernels on sm_90)")
    p.add_argument("--no-autocast", action="store_true", help="run fp32 on CUDA too")
    p.add_argument("--seed", type=int, default=1234, help="the same on every rank")
    p.add_argument("--data", default=None, help="a text file to train on (byte-level tokens); "
                   "default: a synthetic corpus made in-process")
    p.add_argument("--save", default=None, help="write a checkpoint here at the end; a '{step}' "
                   "in the path is replaced by the step, e.g. --save ckpt/step{step}.pt")
    p.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only "
                   "at the end)")
    p.add_argument("--resume", default=None, help="continue from this checkpoint (written at any "
                   "TP size)")
    p.add_argument("--log-every", type=int, default=10,
                   help="progress line interval when output is not a terminal")
    args = p.parse_args(argv)
    if args.d_model % args.n_heads:
        p.error(f"--d-model {args.d_model} must be divisible by --n-heads {args.n_heads}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = setup_distributed(args.backend, args.device)
    train(args, device)
    if dist.is_initialized():
        dist.barrier()  # nobody tears the group down while a peer still uses it
        # Everything that referenced the process group (each ParallelMLP, the autograd graph of
        # the last loss) died with train()'s frame; collect any cycles too, so that the group's
        # threads stop inside destroy_process_group() rather than during interpreter shutdown
        # (see setup_distributed).
        gc.collect()
        dist.destroy_process_group()


def train(args: argparse.Namespace, device: torch.device) -> None:
    rank, world = _rank(), _world_size()
    say = print if rank == 0 else (lambda *a, **k: None)

    torch.manual_seed(args.seed)  # same seed everywhere: replicated weights agree across ranks
    cfg = GPTConfig(seq_len=args.seq_len, d_model=args.d_model, n_layers=args.n_layers,
                    n_heads=args.n_heads, activation=args.activation,
                    multiple_of=args.multiple_of, tied_head=not args.untied_head)
    model = GPT(cfg, recompute=args.recompute, mlp_backend=args.mlp_backend).to(device)
    optimizer = make_optimizer(model, args)
    data = load_corpus(args.data, args.seed, args.seq_len)

    start = 0
    if args.resume:
        start = load_checkpoint(args.resume, model, optimizer)
        say(f"resumed from {args.resume} at step {start}")

    autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                if device.type == "cuda" and not args.no_autocast else nullcontext())
    n_params = sum(p.numel() for p in model.parameters())
    say(f"GPT: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.activation} MLP "
        f"(hidden {model.blocks[0].mlp.hidden_features}, split over TP={world}), "
        f"{n_params:,} parameters on this rank; device {device}, "
        f"{dist.get_backend() if dist.is_initialized() else 'no process group'}; "
        f"data: {args.data or 'synthetic Markov chain'} ({data.numel():,} tokens, bigram "
        f"entropy {entropy_floor(data):.3f} nats)")

    tokens_per_step = args.batch_size * args.seq_len
    progress = Progress(start, args.steps, args.log_every, enabled=rank == 0)
    first_loss = last_loss = None
    t_start = time.perf_counter()
    model.train()
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        x, y = (t.to(device, non_blocking=True)
                for t in get_batch(data, step, args.batch_size, args.seq_len, args.seed))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        with autocast:
            _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            clip_grad_norm(model, args.grad_clip)
        optimizer.step()
        loss_value = loss.item()  # also a sync point, so the timing below is honest
        first_loss = loss_value if first_loss is None else first_loss
        last_loss = loss_value
        progress.update(step, loss_value, tokens_per_step / (time.perf_counter() - t0))
        if args.save and args.save_every and (step + 1) % args.save_every == 0 \
                and step + 1 < args.steps:
            path = args.save.format(step=step + 1)
            save_checkpoint(path, model, optimizer, step + 1, args)
            say(f"\nsaved {path} (step {step + 1}, TP={world})" if progress.tty else
                f"saved {path} (step {step + 1}, TP={world})")
    progress.close()
    elapsed = time.perf_counter() - t_start
    steps_run = args.steps - start

    if args.save:
        # The step the model is at: a run resumed at or past --steps trained nothing.
        at = max(start, args.steps)
        path = args.save.format(step=at)
        save_checkpoint(path, model, optimizer, at, args)
        say(f"saved {path} (step {at}, TP={world})")
    if first_loss is None:
        say(f"nothing to do: the run is already at step {start} of --steps {args.steps}")
    else:
        say(f"{steps_run} steps in {elapsed:.1f}s, "
            f"{steps_run * tokens_per_step / elapsed:,.0f} tokens/s")
        say(f"first loss {first_loss:.4f} last loss {last_loss:.4f}")

if __name__ == "__main__":
    main()
