"""fusedattn.flash_attn's KV-cache entry points against FlashAttention-2's documented semantics:
flash_attn_with_kvcache writes the new keys and values in place at cache_seqlens (contiguous
caches, rows chosen by cache_batch_idx, paged caches with shuffled block tables) and touches
nothing else of the cache; its attention matches the independent float64 oracle (oracle.py) run
on each sequence's keys gathered from the cache; rotary embeddings match a complex-number
re-implementation; and what it cannot map is refused by name. flash_attn_varlen_func with
block_table reads k and v as page pools. CPU tensors (the reference backend); the CUDA-graph test
runs on the GPU machine (`-m gpu`)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

import fusedattn  # noqa: E402
from fusedattn import _kvcache  # noqa: E402
from fusedattn import flash_attn as fa  # noqa: E402
from helpers import TOLERANCE, relative_error  # noqa: E402
from oracle import Problem  # noqa: E402

CAPACITY = 16  # keys per sequence every cache here holds
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _randn(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


class Cache:
    """A KV cache of random keys and values, CAPACITY keys per sequence, and where key j of
    sequence b lives (slot(b, j)):
      "contiguous"  [batch + 1, CAPACITY, heads_k, dim], sequence b in row b;
      "batch_idx"   [batch + 2, CAPACITY, heads_k, dim], sequence b in row cache_batch_idx[b]
                    (shuffled);
      "paged"       pools [num_blocks, page_size, heads_k, dim] with spare blocks, the blocks in
                    a shuffled order and -1 in block_table entries past each sequence's keys."""

    def __init__(self, kind, batch, heads_k, dim, dtype, keys_needed, page_size=4, seed=1):
        self.kind, self.page_size = kind, page_size
        order = torch.Generator().manual_seed(seed + 7)
        self.kwargs = {}
        if kind == "paged":
            width = -(-CAPACITY // page_size)
            num_blocks = batch * width + 3
            table = torch.randperm(num_blocks, generator=order)[:batch * width]
            table = table.reshape(batch, width).to(torch.int32)
            for b, n in enumerate(keys_needed):
                table[b, -(-n // page_size):] = -1
            self.block_table = table
            self.kwargs["block_table"] = table
            shape = (num_blocks, page_size, heads_k, dim)
        else:
            rows = batch + (2 if kind == "batch_idx" else 1)
            self.rows = list(range(batch))
            if kind == "batch_idx":
                self.rows = torch.randperm(rows, generator=order)[:batch].tolist()
                self.kwargs["cache_batch_idx"] = torch.tensor(self.rows, dtype=torch.int32)
            shape = (rows, CAPACITY, heads_k, dim)
        self.k = _randn(shape, dtype, seed)
        self.v = _randn(shape, dtype, seed + 1)

    def slot(self, b, j):
        if self.kind == "paged":
            return int(self.block_table[b, j // self.page_size]), j % self.page_size
        return self.rows[b], j

    def gather(self, pool, b, n):
        """Sequence b's first n keys (or values) of pool, [n, heads_k, dim]."""
        if n == 0:
            return pool.new_zeros((0,) + tuple(pool.shape[2:]))
        return torch.stack([pool[self.slot(b, j)] for j in range(n)])

    def appended(self, pool, lengths, new):
        """pool after appending new [batch, seqlen_new, ...] at lengths, written slot by slot,
        and a boolean mask of the written slots."""
        out, written = pool.clone(), torch.zeros(pool.shape[:2], dtype=torch.bool)
        for b, n in enumerate(lengths):
            for i in range(new.shape[1]):
                out[self.slot(b, n + i)] = new[b, i]
                written[self.slot(b, n + i)] = True
        return out, written


def oracle(q, keys, values, causal=False, window_size=(-1, -1), softcap=0.0,
           alibi_slopes=None, softmax_scale=None):
    """(out [batch, seqlen_q, heads, dim_v], lse [batch, heads, seqlen_q]) in float64: oracle.py's
    Problem on each sequence alone, its keys keys[b] [n_b, heads_k, dim]; causal and windows
    bottom-right aligned to those n_b keys."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        problem = Problem(layout="bshd", mask="causal_bottom_right" if causal else None,
                          window=window_size, softcap=softcap, scale=softmax_scale,
                          alibi_slopes=None if alibi_slopes is None else alibi_slopes.numpy())
        o, lse = problem.forward(*(x.double().numpy()[None] for x in (q[b], keys[b], values[b])))
        outs.append(o[0])
        lses.append(lse[0])
    return np.stack(outs), np.stack(lses)


def _check_against_oracle(out, lse, q, keys, values, dtype, **kwargs):
    ref_out, ref_lse = oracle(q, keys, values, **kwargs)
    assert out.shape == q.shape[:3] + (values[0].shape[-1],) and out.dtype == dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    error = relative_error(out.float().numpy(), ref_out)
    assert error < TOLERANCE[DTYPE_NAMES[dtype]], "out: %.3g" % error
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-5, atol=1e-5)


# name -> the cache, each sequence's keys before the call (a list: a tensor cache_seqlens; an
# int: cache_seqlens as an int; None: no cache_seqlens, the whole cache), seqlen_q, seqlen_new
# (None: no k, v), and flash_attn's keyword arguments.
CASES = {
    "decode_contiguous_causal": dict(cache="contiguous", lens=[5, 0, 11], sq=1, new=1,
                                     kwargs=dict(causal=True)),
    "decode_contiguous_int_cache_seqlens": dict(cache="contiguous", lens=7, sq=1, new=1,
                                                kwargs=dict(causal=True)),
    "prefill_contiguous_causal_gqa": dict(cache="contiguous", lens=[3, 0, 9], sq=4, new=4,
                                          kwargs=dict(causal=True)),
    "prefill_contiguous_int_cache_seqlens_window": dict(cache="contiguous", lens=2, sq=3,
                                                        new=3, kwargs=dict(window_size=(2, 1))),
    "chunk_paged_causal_window": dict(cache="paged", lens=[6, 1, 13], sq=3, new=3,
                                      kwargs=dict(causal=True, window_size=(5, -1))),
    "decode_paged_softcap_alibi_page_3": dict(cache="paged", lens=[10, 2], sq=1, new=1, page=3,
                                              kwargs=dict(causal=True, softcap=4.0,
                                                          alibi_slopes=True)),
    "paged_int_cache_seqlens_window": dict(cache="paged", lens=5, sq=2, new=2,
                                           kwargs=dict(window_size=(3, 1))),
    "paged_decode_bfloat16_d64": dict(cache="paged", lens=[9, 3], sq=1, new=1, dim=64,
                                      dtype=torch.bfloat16, kwargs=dict(causal=True)),
    # cache_batch_idx: gathered into a dense batch (float32), or read in place as one page per
    # sequence (the shapes flash's decode kernel reads: bfloat16, d64, one query).
    "batch_idx_gathered": dict(cache="batch_idx", lens=[4, 7, 0], sq=2, new=2,
                               kwargs=dict(causal=True)),
    "batch_idx_in_place_decode": dict(cache="batch_idx", lens=[4, 7, 0], sq=1, new=1, dim=64,
                                      dtype=torch.bfloat16, kwargs=dict(causal=True)),
    "no_new_keys": dict(cache="contiguous", lens=[4, 9], sq=2, new=None,
                        kwargs=dict(causal=True)),
    "seqlen_new_0_paged": dict(cache="paged", lens=[4, 9], sq=2, new=0,
                               kwargs=dict(causal=True)),
    "whole_cache_contiguous": dict(cache="contiguous", lens=None, sq=3, new=None,
                                   kwargs=dict(causal=True)),
    "whole_cache_paged": dict(cache="paged", lens=None, sq=1, new=None, kwargs={}),
    "mqa_softmax_scale": dict(cache="contiguous", lens=[6, 2], sq=2, new=2, heads_k=1,
                              kwargs=dict(softmax_scale=0.3)),
    "more_queries_than_new_keys": dict(cache="contiguous", lens=[5, 8], sq=3, new=1,
                                       kwargs=dict(causal=True)),
}


def _setup(case, seed=0):
    """(q, k, v, cache, cache_seqlens argument, lengths before the call, kwargs)."""
    dtype, dim = case.get("dtype", torch.float32), case.get("dim", 16)
    heads, heads_k = 4, case.get("heads_k", 2)
    lens = case["lens"]
    batch = len(lens) if isinstance(lens, list) else 2
    new = case["new"] or 0
    if lens is None:
        lengths, cache_seqlens = [CAPACITY] * batch, None
    elif isinstance(lens, int):
        lengths, cache_seqlens = [lens] * batch, lens
    else:
        lengths, cache_seqlens = lens, torch.tensor(lens, dtype=torch.int32)
    cache = Cache(case["cache"], batch, heads_k, dim, dtype, [n + new for n in lengths],
                  page_size=case.get("page", 4))
    q = _randn((batch, case["sq"], heads, dim), dtype, seed + 10)
    k = v = None
    if case["new"] is not None:
        k = _randn((batch, new, heads_k, dim), dtype, seed + 11)
        v = _randn((batch, new, heads_k, dim), dtype, seed + 12)
    kwargs = dict(case["kwargs"])
    if kwargs.get("alibi_slopes") is True:
        kwargs["alibi_slopes"] = 0.5 ** torch.arange(1, heads + 1, dtype=torch.float32)
    return q, k, v, cache, cache_seqlens, lengths, kwargs


@pytest.mark.parametrize("name", sorted(CASES))
def test_appends_in_place_and_attends_like_the_oracle(name):
    case = CASES[name]
    q, k, v, cache, cache_seqlens, lengths, kwargs = _setup(case)
    new = 0 if k is None else k.shape[1]
    expected_k, _ = cache.appended(cache.k, lengths, k if k is not None else cache.k[:0, :0])
    expected_v, _ = cache.appended(cache.v, lengths, v if v is not None else cache.v[:0, :0])
    out, lse = fa.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cache_seqlens=cache_seqlens,
                                          return_softmax_lse=True, **cache.kwargs, **kwargs)
    # Written exactly where flash_attn writes, nothing else touched.
    assert torch.equal(cache.k, expected_k)
    assert torch.equal(cache.v, expected_v)
    keys = [cache.gather(cache.k, b, n + new) for b, n in enumerate(lengths)]
    values = [cache.gather(cache.v, b, n + new) for b, n in enumerate(lengths)]
    _check_against_oracle(out, lse, q, keys, values, q.dtype, **kwargs)


def test_cache_seqlens_int_tensor_and_int64_agree():
    q, k, v, cache, _, _, _ = _setup(CASES["decode_contiguous_int_cache_seqlens"])
    results = []
    for cache_seqlens in (7, torch.full((2,), 7, dtype=torch.int32),
                          torch.full((2,), 7, dtype=torch.int64)):
        k_cache, v_cache = cache.k.clone(), cache.v.clone()
        out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                         causal=True)
        results.append((out, k_cache, v_cache))
    for out, k_cache, v_cache in results[1:]:
        torch.testing.assert_close(out, results[0][0], rtol=0, atol=1e-6)
        assert torch.equal(k_cache, results[0][1]) and torch.equal(v_cache, results[0][2])


def test_without_return_softmax_lse_only_out_is_returned():
    q, k, v, cache, cache_seqlens, _, kwargs = _setup(CASES["chunk_paged_causal_window"])
    pools = cache.k.clone(), cache.v.clone()
    out, _ = fa.flash_attn_with_kvcache(q, *pools, k, v, cache_seqlens=cache_seqlens,
                                        return_softmax_lse=True, **cache.kwargs, **kwargs)
    only = fa.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cache_seqlens=cache_seqlens,
                                      **cache.kwargs, **kwargs)
    assert isinstance(only, torch.Tensor) and torch.equal(only, out)


def test_num_splits_is_accepted_and_ignored():
    q, k, v, cache, cache_seqlens, _, kwargs = _setup(CASES["decode_contiguous_causal"])
    outs = []
    for num_splits in (0, 1, 4):
        k_cache, v_cache = cache.k.clone(), cache.v.clone()
        outs.append(fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
                                               cache_seqlens=cache_seqlens,
                                               num_splits=num_splits, **kwargs))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_forward_only_the_output_has_no_gradient():
    q, k, v, cache, cache_seqlens, _, kwargs = _setup(CASES["prefill_contiguous_causal_gqa"])
    q.requires_grad_()
    out = fa.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cache_seqlens=cache_seqlens,
                                     **kwargs)
    assert not out.requires_grad


def test_a_window_as_long_as_the_cache_is_unbounded_as_in_flash_attn():
    """flash_attn sets a window side >= the cache's keys per sequence to -1 (which also makes
    the call non-local for rotary: every query at cache_seqlens)."""
    q, k, v, cache, cache_seqlens, lengths, _ = _setup(CASES["prefill_contiguous_causal_gqa"])
    cos, sin = _cos_sin(CAPACITY, 8)
    outs = []
    for window in ((CAPACITY, -1), (-1, -1)):
        k_cache, v_cache = cache.k.clone(), cache.v.clone()
        outs.append(fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin,
                                               cache_seqlens=cache_seqlens,
                                               window_size=window))
    assert torch.equal(outs[0], outs[1])


def test_top_level_name_is_the_same_function():
    assert fusedattn.flash_attn_with_kvcache is fa.flash_attn_with_kvcache
    assert "flash_attn_with_kvcache" in fa.__all__ and "flash_attn_with_kvcache" in \
        fusedattn.__all__


# ---------------------------------------------------------------------------------------------
# Rotary embeddings
# ---------------------------------------------------------------------------------------------


def _cos_sin(seqlen_ro, rotary_dim, base=10000.0):
    """flash_attn's rotary_cos/rotary_sin [seqlen_ro, rotary_dim / 2] (float32)."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


def rope_reference(x, cos, sin, positions, interleaved):
    """x [batch, seq, heads, dim] rotated in float64 as complex numbers: feature pairs (2i, 2i+1)
    (interleaved) or (i, i + rotary_dim / 2) (GPT-NeoX) times exp(1j * angle) of pair i at the
    token's position; features past rotary_dim unchanged."""
    x = x.double()
    half = cos.shape[1]
    turn = torch.complex(cos.double(), sin.double())[positions][:, :, None, :]
    if interleaved:
        pairs = x[..., :2 * half].reshape(*x.shape[:3], half, 2)
        z = torch.view_as_complex(pairs.contiguous()) * turn
        rotated = torch.view_as_real(z).reshape(*x.shape[:3], 2 * half)
    else:
        z = torch.complex(x[..., :half], x[..., half:2 * half]) * turn
        rotated = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((rotated, x[..., 2 * half:]), dim=-1)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("attention", ["causal", "local", "global"])
def test_rotary_rotates_new_keys_and_queries_at_their_positions(attention, kind, interleaved):
    """The new keys at cache_seqlens + i; the queries at cache_seqlens + i when causal or local,
    else all at cache_seqlens (flash_attn's rule); the first rotary_dim = 8 of 16 features."""
    kwargs = {"causal": dict(causal=True), "local": dict(window_size=(4, 2)),
              "global": {}}[attention]
    case = dict(cache=kind, lens=[3, 0, 7], sq=3, new=3, kwargs=kwargs)
    q, k, v, cache, cache_seqlens, lengths, kwargs = _setup(case)
    cos, sin = _cos_sin(CAPACITY, 8)
    key_positions = torch.tensor(lengths)[:, None] + torch.arange(3)
    query_positions = key_positions if attention != "global" else \
        torch.tensor(lengths)[:, None].expand(3, 3)
    expected_k, written = cache.appended(
        cache.k, lengths, rope_reference(k, cos, sin, key_positions, interleaved).float())
    expected_v, _ = cache.appended(cache.v, lengths, v)
    out, lse = fa.flash_attn_with_kvcache(
        q, cache.k, cache.v, k, v, cos, sin, cache_seqlens=cache_seqlens,
        rotary_interleaved=interleaved, return_softmax_lse=True, **cache.kwargs, **kwargs)
    torch.testing.assert_close(cache.k, expected_k, rtol=1e-6, atol=1e-6)
    assert torch.equal(cache.k[~written], expected_k[~written])  # the rest untouched
    assert torch.equal(cache.v, expected_v)  # values are not rotated
    q_rotated = rope_reference(q, cos, sin, query_positions, interleaved)
    keys = [cache.gather(cache.k, b, n + 3) for b, n in enumerate(lengths)]
    values = [cache.gather(cache.v, b, n + 3) for b, n in enumerate(lengths)]
    _check_against_oracle(out, lse, q_rotated, keys, values, torch.float32, **kwargs)


# ---------------------------------------------------------------------------------------------
# What a CUDA graph needs: no host read of a tensor; and torch.compile
# ---------------------------------------------------------------------------------------------


class _HostReads(torch.overrides.TorchFunctionMode):
    """Records the tensor methods that copy a value to the host."""

    NAMES = {"item", "tolist", "__bool__", "__int__", "__index__", "__float__", "numpy", "cpu"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["decode_contiguous_causal", "chunk_paged_causal_window",
                                  "batch_idx_in_place_decode", "batch_idx_gathered"])
def test_the_append_and_the_mapping_read_no_tensor_on_the_host(name, monkeypatch):
    """What CUDA-graph capture needs: past the CPU-only checks (switched off here), every length,
    index and scatter position stays a tensor."""
    monkeypatch.setattr(_kvcache, "_check_on_host", lambda *args: None)
    q, k, v, cache, cache_seqlens, _, kwargs = _setup(CASES[name])
    cos, sin = _cos_sin(CAPACITY, 8)
    reads = _HostReads()
    with reads:
        fa.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cos, sin,
                                   cache_seqlens=cache_seqlens, **cache.kwargs, **kwargs)
    assert reads.calls == []


def test_a_decode_step_compiles_without_graph_breaks():
    q, k, v, cache, cache_seqlens, _, _ = _setup(CASES["decode_contiguous_causal"])
    eager_k, eager_v = cache.k.clone(), cache.v.clone()
    expected = fa.flash_attn_with_kvcache(q, eager_k, eager_v, k, v,
                                          cache_seqlens=cache_seqlens, causal=True)

    def step(q, k_cache, v_cache, k, v, cache_seqlens):
        return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
                                          cache_seqlens=cache_seqlens, causal=True)

    import torch._dynamo
    torch._dynamo.reset()
    out = torch.compile(step, backend="eager", fullgraph=True)(q, cache.k, cache.v, k, v,
                                                                cache_seqlens)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert torch.equal(cache.k, eager_k) and torch.equal(cache.v, eager_v)


# ---------------------------------------------------------------------------------------------
# Refusals (each before anything is written)
# ---------------------------------------------------------------------------------------------


def _call(case_name="decode_contiguous_causal", **changes):
    """Calls flash_attn_with_kvcache with a case's arguments changed; returns the cache tensors
    and their contents before the call, for the caller to check nothing was written."""
    q, k, v, cache, cache_seqlens, _, kwargs = _setup(CASES[case_name])
    args = dict(q=q, k_cache=cache.k, v_cache=cache.v, k=k, v=v, cache_seqlens=cache_seqlens,
                **cache.kwargs, **kwargs)
    args.update(changes)
    before = [x.clone() for x in (cache.k, cache.v)]
    try:
        fa.flash_attn_with_kvcache(**args)
    finally:
        assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])


REFUSALS = {
    "cache_leftpad": (fusedattn.NotSupportedError, r"cache_leftpad .* not supported",
                      "decode_contiguous_causal",
                      dict(cache_leftpad=torch.zeros(3, dtype=torch.int32))),
    "cache_batch_idx_with_block_table": (
        fusedattn.NotSupportedError, "cache_batch_idx with block_table",
        "chunk_paged_causal_window", dict(cache_batch_idx=torch.arange(3, dtype=torch.int32))),
    "alibi_per_batch": (fusedattn.NotSupportedError, "one slope per head",
                        "decode_contiguous_causal", dict(alibi_slopes=torch.ones(3, 4))),
    "k_without_cache_seqlens": (fusedattn.InvalidArgumentError, "pass cache_seqlens",
                                "decode_contiguous_causal", dict(cache_seqlens=None)),
    "k_without_v": (fusedattn.InvalidArgumentError, "k and v are given together",
                    "decode_contiguous_causal", dict(v=None)),
    "rotary_without_k": (fusedattn.InvalidArgumentError, "rotate the new keys.*pass k and v",
                         "no_new_keys", dict(rotary_cos=torch.ones(16, 4),
                                             rotary_sin=torch.ones(16, 4))),
    "rotary_dim_above_head_dim": (fusedattn.InvalidArgumentError,
                                  r"rotary_dim = 18 must be in \[2, head_dim = 16\]",
                                  "decode_contiguous_causal",
                                  dict(rotary_cos=torch.ones(16, 9), rotary_sin=torch.ones(16, 9))),
    "rotary_too_few_positions": (fusedattn.InvalidArgumentError, "rotary_cos has 8 positions",
                                 "decode_contiguous_causal",
                                 dict(rotary_cos=torch.ones(8, 4), rotary_sin=torch.ones(8, 4))),
    "q_not_4d": (fusedattn.InvalidArgumentError,
                 r"q has shape \[3, 4, 16\] but \[batch, seqlen_q, heads, head_dim\]",
                 "decode_contiguous_causal", dict(q=torch.ones(3, 4, 16))),
    "heads_k_not_dividing": (fusedattn.InvalidArgumentError, "k_cache has 3 heads",
                             "decode_contiguous_causal",
                             dict(k_cache=torch.ones(4, 16, 3, 16),
                                  v_cache=torch.ones(4, 16, 3, 16), k=torch.ones(3, 1, 3, 16),
                                  v=torch.ones(3, 1, 3, 16))),
    "k_of_other_heads": (fusedattn.InvalidArgumentError,
                         r"k has shape \[3, 1, 1, 16\] but \[batch, seqlen_new, heads_k",
                         "decode_contiguous_causal", dict(k=torch.ones(3, 1, 1, 16))),
    "cache_seqlens_of_other_batch": (fusedattn.InvalidArgumentError,
                                     r"cache_seqlens has shape \[4\] but",
                                     "decode_contiguous_causal",
                                     dict(cache_seqlens=torch.zeros(4, dtype=torch.int32))),
    "cache_seqlens_float": (fusedattn.InvalidArgumentError,
                            "cache_seqlens must be an int32 tensor .* got a float32 tensor",
                            "decode_contiguous_causal", dict(cache_seqlens=torch.zeros(3))),
    "cache_seqlens_past_the_cache": (
        fusedattn.InvalidArgumentError,
        r"cache_seqlens\[1\] = 16 with seqlen_new = 1 does not fit the cache's 16 keys",
        "decode_contiguous_causal",
        dict(cache_seqlens=torch.tensor([5, 16, 0], dtype=torch.int32))),
    "int_cache_seqlens_past_the_cache": (
        fusedattn.InvalidArgumentError, r"cache_seqlens = 15 with seqlen_new = 3",
        "prefill_contiguous_int_cache_seqlens_window", dict(cache_seqlens=15)),
    "a_used_block_table_entry_of_minus_1": (
        fusedattn.InvalidArgumentError, r"block_table\[1, 1\] = -1 is outside the pool's",
        "chunk_paged_causal_window",
        dict(cache_seqlens=torch.tensor([6, 4, 13], dtype=torch.int32))),
    "cache_batch_idx_outside_the_cache": (
        fusedattn.InvalidArgumentError, r"cache_batch_idx\[2\] = 5 is outside the cache's 5",
        "batch_idx_gathered", dict(cache_batch_idx=torch.tensor([0, 1, 5], dtype=torch.int32))),
    # The attention's own arguments are refused before the append, not by the library after it.
    "negative_softcap": (fusedattn.InvalidArgumentError, r"softcap = -1\.0 must be a finite",
                         "decode_contiguous_causal", dict(softcap=-1.0)),
    "softmax_scale_outside_float": (fusedattn.InvalidArgumentError,
                                    r"softmax_scale = 1e-50 must be a finite number",
                                    "decode_contiguous_causal", dict(softmax_scale=1e-50)),
    "alibi_slopes_of_other_heads": (fusedattn.InvalidArgumentError,
                                    r"alibi_slopes must be a float tensor \[heads = 4\], got \[3\]",
                                    "decode_contiguous_causal", dict(alibi_slopes=torch.ones(3))),
    "batch_above_the_cache_without_cache_batch_idx": (
        fusedattn.InvalidArgumentError, "q has batch 3 but k_cache only 2 sequences",
        "decode_contiguous_causal", dict(k_cache=torch.ones(2, 16, 2, 16),
                                         v_cache=torch.ones(2, 16, 2, 16))),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refused_with_a_message_and_nothing_written(name):
    error, message, case_name, changes = REFUSALS[name]
    with pytest.raises(error, match=message):
        _call(case_name, **changes)


def test_numpy_arrays_are_refused():
    x = np.zeros((1, 1, 2, 8), dtype=np.float32)
    with pytest.raises(TypeError, match="torch tensors"):
        fa.flash_attn_with_kvcache(x, x, x)


# ---------------------------------------------------------------------------------------------
# flash_attn_varlen_func with block_table: k and v are page pools
# ---------------------------------------------------------------------------------------------


def _varlen_paged(lengths_q, lengths_k, seed=3):
    cache = Cache("paged", len(lengths_k), 2, 16, torch.float32, lengths_k, page_size=4,
                  seed=seed)
    q = _randn((sum(lengths_q), 4, 16), torch.float32, seed + 1)
    cu_q = torch.tensor([0] + lengths_q).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lengths_k).cumsum(0).to(torch.int32)
    return q, cache, cu_q, cu_k


@pytest.mark.parametrize("kwargs", [dict(causal=True), dict(window_size=(3, 1), softcap=5.0)],
                         ids=["causal", "window_softcap"])
def test_varlen_with_block_table_reads_the_pages(kwargs):
    lengths_q, lengths_k = [3, 1, 4], [9, 5, 4]
    q, cache, cu_q, cu_k = _varlen_paged(lengths_q, lengths_k)
    with torch.no_grad():
        out = fa.flash_attn_varlen_func(q, cache.k, cache.v, cu_q, cu_k, max(lengths_q),
                                        max(lengths_k), block_table=cache.block_table, **kwargs)
    keys = [cache.gather(cache.k, b, n) for b, n in enumerate(lengths_k)]
    values = [cache.gather(cache.v, b, n) for b, n in enumerate(lengths_k)]
    # The same problem with the keys packed: flash_attn_varlen_func's contiguous form, equal.
    packed = fa.flash_attn_varlen_func(q, torch.cat(keys), torch.cat(values), cu_q, cu_k,
                                       max(lengths_q), max(lengths_k), **kwargs)
    assert torch.equal(out, packed.detach())
    for b in range(len(lengths_q)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref, _ = oracle(q[rows][None], [keys[b]], [values[b]], **kwargs)
        assert relative_error(out[rows].numpy(), ref[0]) < TOLERANCE["float32"]


def test_varlen_with_block_table_is_forward_only():
    q, cache, cu_q, cu_k = _varlen_paged([2, 2], [6, 3])
    q.requires_grad_()
    with pytest.raises(fusedattn.InvalidArgumentError, match=r"forward only.*torch.no_grad"):
        fa.flash_attn_varlen_func(q, cache.k, cache.v, cu_q, cu_k, 2, 6,
                                  block_table=cache.block_table)


def test_varlen_block_table_shapes_are_said_in_the_calls_terms():
    q, cache, cu_q, cu_k = _varlen_paged([2, 2], [6, 3])
    with torch.no_grad(), pytest.raises(fusedattn.InvalidArgumentError,
                                        match=r"k has 3 dimensions but a page pool .*"
                                              r"\[num_pages, page_size, heads_kv, head_dim\]"):
        fa.flash_attn_varlen_func(q, cache.k[0], cache.v, cu_q, cu_k, 2, 6,
                                  block_table=cache.block_table)


# ---------------------------------------------------------------------------------------------
# CUDA (the GPU machine)
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["decode_contiguous_causal", "paged_decode_bfloat16_d64",
                                  "batch_idx_in_place_decode"])
def test_a_decode_step_captures_in_a_cuda_graph(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to PyTorch")
    case = dict(CASES[name], dtype=torch.bfloat16, dim=64)
    q, k, v, cache, cache_seqlens, lengths, kwargs = _setup(case)
    cuda = {n: (x.cuda() if isinstance(x, torch.Tensor) else x)
            for n, x in dict(q=q, k=k, v=v, k_cache=cache.k, v_cache=cache.v,
                             cache_seqlens=cache_seqlens, **cache.kwargs, **kwargs).items()}
    initial = cuda["k_cache"].clone(), cuda["v_cache"].clone()
    expected = fa.flash_attn_with_kvcache(**cuda)
    expected_caches = cuda["k_cache"].clone(), cuda["v_cache"].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (plans, workspaces) off the capture
        for _ in range(2):
            cuda["k_cache"].copy_(initial[0])
            cuda["v_cache"].copy_(initial[1])
            fa.flash_attn_with_kvcache(**cuda)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa.flash_attn_with_kvcache(**cuda)
    cuda["k_cache"].copy_(initial[0])
    cuda["v_cache"].copy_(initial[1])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cuda["k_cache"], expected_caches[0])
    assert torch.equal(cuda["v_cache"], expected_caches[1])
    torch.testing.assert_close(out, expected)  # bfloat16's default tolerances
