"""Trains a small GPT whose attention is fusedattn's, through the one-line swap of
torch.nn.functional.scaled_dot_product_attention for fusedattn.scaled_dot_product_attention.

    python examples/train_gpt.py                       # CUDA when present (bfloat16), else CPU
    python examples/train_gpt.py --device cpu --steps 30 --layers 2 --dim 64 --seq 32

It learns to continue a short text (characters as tokens) and prints the loss as it goes; it
exits with an error if the loss did not fall, so it doubles as a test (python/tests runs it on
the CPU, where the reference backend computes the attention)."""

import argparse
import math
import time

import torch
from torch import nn

from fusedattn import scaled_dot_product_attention  # was: from torch.nn.functional import ...

TEXT = ("fusedattn computes scaled dot product attention, forward and backward, for every "
        "layout, mask, bias and softmax variant that models use, and picks the fastest "
        "backend that runs the problem. ") * 8


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim,
             self.kv_heads * self.head_dim], dim=-1)
        # [batch, heads, seq, head_dim] views, as torch's SDPA takes them (no copies).
        q = q.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        y = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, seq, dim, heads, kv_heads, layers):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, else float32")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    torch.manual_seed(0)

    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT], device=args.device)
    model = GPT(len(chars), args.seq, args.dim, args.heads, args.kv_heads, args.layers)
    model = model.to(device=args.device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def batch():
        starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,), device=args.device)
        index = starts[:, None] + torch.arange(args.seq + 1, device=args.device)
        window = data[index]
        return window[:, :-1], window[:, 1:]

    first = last = None
    start = time.perf_counter()
    for step in range(args.steps):
        ids, targets = batch()
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, len(chars)),
                                           targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last = loss.item()
        first = last if first is None else first
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print("step %4d  loss %.4f" % (step, last))
    elapsed = time.perf_counter() - start
    print("%d steps in %.1f s on %s (%s); loss %.3f -> %.3f (uniform: %.3f)"
          % (args.steps, elapsed, args.device, str(dtype).replace("torch.", ""), first, last,
             math.log(len(chars))))
    if not last < first:
        raise SystemExit("the loss did not fall")


if __name__ == "__main__":
    main()
