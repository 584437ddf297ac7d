"""A paged KV cache, as a serving engine keeps one, driven through
fusedattn.flash_attn.flash_attn_with_kvcache (FlashAttention-2's function): prompts of different
lengths are prefilled in chunks, then every sequence decodes token by token; each call appends
the new keys and values into the cache in place (rotary embeddings applied to them and to the
queries) and attends to the sequence's keys, and each step is checked against a dense
recomputation in float64.

    python examples/paged_decode.py                       # CUDA when present, else the CPU
    python examples/paged_decode.py --device cuda --dtype float16 --dim 128 --page-size 64

The "model" is one tiny random attention layer (no weights to download): hidden states project
to q, k, v, and the attention output feeds the next token's hidden state, so a wrong step would
change every later one. Blocks of the cache are handed out from a shuffled free list as the
sequences grow (any block holds any sequence's keys), as vLLM's block manager does. On CUDA the
chunks of at most 16 tokens and the decode steps run on flash's decode kernel (float16/bfloat16,
head dims 64 or 128); python/tests runs this script on the CPU (the reference backend).
"""

import argparse

import torch

from fusedattn.flash_attn import flash_attn_with_kvcache

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


class PagedCache:
    """K and V pools [num_blocks, page_size, heads_kv, dim], the block table, and each sequence's
    number of keys (kept on the host: the scheduler decides on it)."""

    def __init__(self, batch, num_blocks, page_size, max_blocks, heads_kv, dim, dtype, device,
                 generator):
        self.k = torch.zeros(num_blocks, page_size, heads_kv, dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.page_size = page_size
        self.table = torch.full((batch, max_blocks), -1, dtype=torch.int32)
        self.free = torch.randperm(num_blocks, generator=generator).tolist()
        self.lengths = [0] * batch

    def reserve(self, b, count):
        """Blocks for `count` more keys of sequence b."""
        have = -(-self.lengths[b] // self.page_size)
        need = -(-(self.lengths[b] + count) // self.page_size)
        for i in range(have, need):
            if not self.free:
                raise SystemExit("the cache is full: raise --blocks")
            self.table[b, i] = self.free.pop()

    def blocks_used(self):
        return int((self.table >= 0).sum())


def rotary_tables(max_len, dim, device, base=10000.0):
    """rotary_cos/rotary_sin [max_len, dim / 2] (float32) for a rotary dim of the whole head."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).float().to(device), torch.sin(angles).float().to(device)


def rope(x, cos, sin, positions):
    """GPT-NeoX rotary (flash_attn's rotary_interleaved=False) in float64: x [seq, heads, dim]
    at positions [seq]."""
    half = x.shape[-1] // 2
    c = cos.double()[positions][:, None, :]
    s = sin.double()[positions][:, None, :]
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


def dense_attention(q, keys, values):
    """float64 attention of q [seq_q, heads, dim] (the last seq_q positions) to keys/values
    [seq_k, heads_kv, dim], causal aligned to the end (bottom-right), GQA by repeating k/v."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) / q.shape[-1] ** 0.5
    seq_q, seq_k = q.shape[0], keys.shape[0]
    visible = torch.arange(seq_k)[None, :] <= torch.arange(seq_q)[:, None] + seq_k - seq_q
    scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values)


def relative_error(out, ref):
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, else float32")
    parser.add_argument("--prompts", default="37,20,5", help="prompt lengths, one per sequence")
    parser.add_argument("--chunk", type=int, default=16, help="prefill chunk length")
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=64, help="blocks in the pools")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    prompts = [int(n) for n in args.prompts.split(",")]
    batch, heads, heads_kv, dim = len(prompts), args.heads, args.kv_heads, args.dim
    max_len = max(prompts) + args.new_tokens
    max_blocks = -(-max_len // args.page_size)

    generator = torch.Generator().manual_seed(0)
    model_dim = 32
    w_qkv = (torch.randn(model_dim, (heads + 2 * heads_kv) * dim, generator=generator)
             / model_dim ** 0.5).to(device)
    w_out = (torch.randn(heads * dim, model_dim, generator=generator) / (heads * dim) ** 0.5
             ).to(device)

    def project(x):
        """Hidden states [batch, seq, model_dim] -> q, k, v in the cache's dtype."""
        qkv = (x @ w_qkv).to(dtype)
        q, k, v = qkv.split((heads * dim, heads_kv * dim, heads_kv * dim), dim=-1)
        return (q.unflatten(-1, (heads, dim)), k.unflatten(-1, (heads_kv, dim)),
                v.unflatten(-1, (heads_kv, dim)))

    cache = PagedCache(batch, args.blocks, args.page_size, max_blocks, heads_kv, dim, dtype,
                       device, generator)
    cos, sin = rotary_tables(max_blocks * args.page_size, dim, device)  # the table's capacity
    dense_k = [torch.zeros(0, heads_kv, dim, dtype=torch.float64, device=device)] * batch
    dense_v = list(dense_k)
    worst = 0.0

    def step(b_rows, x):
        """Appends the tokens x [len(b_rows), seq, model_dim] of sequences b_rows (all at the same
        number of new tokens) and checks the attention; returns its output."""
        nonlocal worst
        q, k, v = project(x)
        seq = x.shape[1]
        for b in b_rows:
            cache.reserve(b, seq)
        lengths = [cache.lengths[b] for b in b_rows]
        out = flash_attn_with_kvcache(
            q, cache.k, cache.v, k, v, rotary_cos=cos, rotary_sin=sin,
            cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=device),
            block_table=cache.table[b_rows].to(device), causal=True, rotary_interleaved=False)
        for row, b in enumerate(b_rows):
            positions = torch.arange(lengths[row], lengths[row] + seq, device=device)
            dense_k[b] = torch.cat((dense_k[b], rope(k[row], cos, sin, positions)))
            dense_v[b] = torch.cat((dense_v[b], v[row].double()))
            ref = dense_attention(rope(q[row], cos, sin, positions), dense_k[b], dense_v[b])
            error = relative_error(out[row], ref)
            worst = max(worst, error)
            if error > TOLERANCE[dtype]:
                raise SystemExit("sequence %d at key %d: relative error %.3g against the dense "
                                 "recomputation" % (b, lengths[row], error))
            cache.lengths[b] += seq
        return out

    # Prefill: each prompt in chunks (the sequences' prompts differ in length, so one call per
    # sequence and chunk; a batch of them would go to flash_attn_varlen_func(block_table=...)).
    hidden = torch.randn(batch, max(prompts), model_dim, generator=generator).to(device)
    last = torch.zeros(batch, model_dim, device=device)
    chunks = 0
    for b, length in enumerate(prompts):
        for start in range(0, length, args.chunk):
            x = hidden[b:b + 1, start:min(start + args.chunk, length)]
            out = step([b], x)
            chunks += 1
        last[b] = torch.tanh(out[0, -1].flatten().float() @ w_out + x[0, -1])

    # Decode: one new token per sequence and step, all sequences in one call.
    for _ in range(args.new_tokens):
        x = last[:, None, :]
        out = step(list(range(batch)), x)
        last = torch.tanh(out[:, 0].flatten(1).float() @ w_out + last)

    # The cache holds every sequence's rotated keys where its block table says.
    for b in range(batch):
        j = torch.arange(cache.lengths[b])
        pages = cache.table[b, j // args.page_size].long().to(device)
        gathered = cache.k[pages, (j % args.page_size).to(device)]
        error = relative_error(gathered, dense_k[b])
        if error > TOLERANCE[dtype]:
            raise SystemExit("sequence %d: the paged keys differ from the dense history (%.3g)"
                             % (b, error))

    print("device %s, %s: %d sequences, prompts %s prefilled in %d chunks, %d decode steps; "
          "%d of %d blocks of %d tokens used" % (device, str(dtype).replace("torch.", ""), batch,
                                                  prompts, chunks, args.new_tokens,
                                                  cache.blocks_used(), args.blocks,
                                                  args.page_size))
    print("every step agrees with the dense recomputation (worst relative error %.2g)" % worst)


if __name__ == "__main__":
    main()
