"""FlashAttention-2's Python functions (the `flash_attn` package's names, arguments and
conventions) over fusedattn's torch operators, so that replacing the import is enough:

    from fusedattn.flash_attn import flash_attn_func, flash_attn_varlen_func
    # was: from flash_attn import flash_attn_func, flash_attn_varlen_func

Conventions kept: q, k, v are [batch, seqlen, heads, dim] (or [total_tokens, heads, dim] with
int32 cu_seqlens for the varlen functions); k/v heads divide q's (MQA/GQA); causal and the
sliding window are aligned to the bottom-right corner (query i of a sequence sees keys up to
i + seqlen_k - seqlen_q, and window_size=(left, right) bounds it to
[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right], -1 unbounded; causal sets
right to 0); softcap 0 is off; alibi_slopes [heads] float32 add -slope * |i + seqlen_k -
seqlen_q - j|; softmax_scale defaults to 1/sqrt(dim); dropout_p applies whenever it is above
0 (pass 0 in evaluation, as with flash_attn); max_seqlen_q/k are the caller's ints, so no call
reads the device.

KV caches (serving, forward only, as in flash_attn): flash_attn_with_kvcache appends the new
keys and values in place into a contiguous cache [batch_cache, seqlen_cache, heads_k, dim] or a
paged one ([num_blocks, page_block_size, heads_k, dim] pools with block_table; any page size,
where flash_attn wants multiples of 256), applies rotary embeddings, and attends to each
sequence's cache_seqlens + seqlen_new keys; flash_attn_varlen_func takes block_table too (k and
v then are page pools, the key lengths cu_seqlens_k's steps). Both run on fusedattn's paged K/V
(fusedattn.attention(..., page_table=, seqlens_kv=)) or, for a contiguous cache, its dense
problem with per-sequence key lengths (_kvcache.py says which and why): on CPU tensors the
reference backend; on CUDA tensors cuDNN or flash (paged K/V: flash's decode kernel for up to
16 query rows per sequence, float16/bfloat16, head dims 64 or 128; on sm_90 its Hopper forward
for the rest, chunked prefill included, with page sizes that are powers of two of at least 16;
then cuDNN's paged SDPA forward, float16/bfloat16 with page sizes that are powers of two;
fusedattn.explain says why a problem runs nowhere).

Not taken, with an error that says so: return_attn_probs=True (fusedattn never materializes
the probabilities; fusedattn.attention(..., return_lse=True) gives the log-sum-exp), alibi
slopes per batch ([batch, heads]), cache_leftpad, and cache_batch_idx together with
block_table. Differences: dropout draws a different (equally distributed) random mask than
FlashAttention, from a seed taken from torch's default CPU generator; the log-sum-exp of a query
row with no visible key (return_softmax_lse) is -inf, where FlashAttention's kernels write +inf.
"""

from ._api import _torch_for
from ._errors import InvalidArgumentError, NotSupportedError
from ._sdpa import dropout_seed

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"]


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """flash_attn.flash_attn_func: q [batch, seqlen_q, heads, dim], k/v [batch, seqlen_k,
    heads_k, dim]; returns out [batch, seqlen_q, heads, dim_v] (autograd on q, k, v)."""
    torch_path = _torch_path(q, "flash_attn_func")
    _refuse_probs(return_attn_probs, "flash_attn_func")
    mask, window = _mask_and_window(causal, window_size, "causal_bottom_right")
    return torch_path.attention(
        q, k, v, "bshd", mask, window, None, "post_scale", _slopes(alibi_slopes), softcap or 0.0,
        None, None, dropout_p, dropout_seed(dropout_p, torch_path), softmax_scale, None, None,
        None, None, None, None, deterministic, "auto", False, None, None)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """flash_attn.flash_attn_varlen_func: q [total_q, heads, dim], k/v [total_k, heads_k, dim]
    packed, sequence b at cu_seqlens[b]..cu_seqlens[b + 1] (int32 [batch + 1]); max_seqlen_q/k
    the longest sequences (ints). Returns out [total_q, heads, dim_v]; tokens outside every
    sequence are 0.

    With block_table (int32 [batch, max_num_blocks_per_seq]), k and v are a paged KV cache,
    pools [num_blocks, page_block_size, heads_k, dim]: key j of sequence b is token
    j % page_block_size of block block_table[b, j // page_block_size], for
    j < cu_seqlens_k[b + 1] - cu_seqlens_k[b]. Forward only (fusedattn's paged K/V has no
    backward): call it under torch.no_grad() or torch.inference_mode()."""
    torch_path = _torch_path(q, "flash_attn_varlen_func")
    _refuse_probs(return_attn_probs, "flash_attn_varlen_func")
    if max_seqlen_q is None or max_seqlen_k is None:
        raise InvalidArgumentError("flash_attn_varlen_func needs max_seqlen_q and max_seqlen_k "
                                   "(ints: the longest query and key sequences)")
    mask, window = _mask_and_window(causal, window_size, "padding_causal_bottom_right")
    seqlens_k = None
    if block_table is not None:
        # fusedattn's paged K/V: the key lengths are cu_seqlens_k's steps (computed where the
        # tensor lives, no host read), the keys found through the table; cu_seqlens_kv is not
        # taken then.
        if not isinstance(cu_seqlens_k, torch_path.torch.Tensor):
            cu_seqlens_k = torch_path.torch.tensor(cu_seqlens_k, dtype=torch_path.torch.int32,
                                                   device=q.device)
        if cu_seqlens_k.dim() != 1 or cu_seqlens_k.shape[0] < 1:
            raise InvalidArgumentError("cu_seqlens_k has shape %s but int32 [batch + 1] is "
                                       "expected" % (list(cu_seqlens_k.shape),))
        seqlens_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        cu_seqlens_k = None
    return torch_path.attention(
        q, k, v, "thd", mask or "padding", window, None, "post_scale", _slopes(alibi_slopes),
        softcap or 0.0, None, None, dropout_p, dropout_seed(dropout_p, torch_path),
        softmax_scale, cu_seqlens_q, cu_seqlens_k, None, None, max_seqlen_q, max_seqlen_k,
        deterministic, "auto", False, None, None, page_table=block_table, seqlens_kv=seqlens_k)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """flash_attn.flash_attn_with_kvcache: attention of q [batch, seqlen_q, heads, dim] to a
    KV cache, after appending the new keys and values k, v [batch, seqlen_new, heads_k, dim]
    (optional, together) *in place* into k_cache/v_cache at positions cache_seqlens[b],
    cache_seqlens[b] + 1, ... of each sequence. Forward only: no autograd, as in flash_attn.

    k_cache, v_cache: [batch_cache, seqlen_cache, heads_k, dim] (sequence b is cache row
    cache_batch_idx[b], default b), or with block_table (int32 [batch, max_num_blocks_per_seq])
    a paged cache [num_blocks, page_block_size, heads_k, dim] (key j of sequence b is token
    j % page_block_size of block block_table[b, j // page_block_size]; any page size).
    cache_seqlens: an int or int32 [batch], each sequence's keys before the append (needed
    with k); None: every sequence has the whole cache (seqlen_cache, or max_num_blocks_per_seq
    * page_block_size keys). Sequence b attends to its first cache_seqlens[b] + seqlen_new keys,
    with causal and window_size aligned to their end (bottom-right), softcap, alibi_slopes
    [heads] and softmax_scale as in flash_attn_func (a window side at least as long as the
    cache's keys per sequence is unbounded, as flash_attn sets it).

    rotary_cos, rotary_sin: [seqlen_ro, rotary_dim / 2] (with k; seqlen_ro at least the cache's
    keys per sequence): the new keys are rotated at positions cache_seqlens + i before they are
    written, and q at cache_seqlens + i when causal or local (a window), else every query at
    cache_seqlens; the first rotary_dim features, in pairs (0, 1), (2, 3), ... when
    rotary_interleaved, else (i, i + rotary_dim / 2) (GPT-NeoX), computed in float32.

    num_splits: flash_attn's split-KV hint; accepted and ignored (the backend plans its own
    splits). Returns out [batch, seqlen_q, heads, dim_v], and with return_softmax_lse also the
    log-sum-exp float32 [batch, heads, seqlen_q] (-inf for a row with no visible key).

    The append reads no device value on the host (scatter positions are computed with torch
    ops on the device), so it can be captured in a CUDA graph; on CPU tensors the lengths,
    indices and block-table entries it uses are checked first and a bad one is refused before
    anything is written. Refused: cache_leftpad, cache_batch_idx with block_table, per-batch
    alibi slopes."""
    torch_path = _torch_path(q, "flash_attn_with_kvcache")
    del num_splits  # a performance hint of flash_attn's split-KV kernel
    _, window = _mask_and_window(False, window_size, None)
    slopes = _slopes(alibi_slopes)
    from . import _kvcache
    with torch_path.torch.no_grad():
        return _kvcache.run(torch_path, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                            cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                            softmax_scale, bool(causal), window, softcap or 0.0,
                            bool(rotary_interleaved), slopes, bool(return_softmax_lse))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_qkvpacked_func: qkv [batch, seqlen, 3, heads, dim]."""
    q, k, v = _unpack(qkv, 3, "qkv", "[batch, seqlen, 3, heads, dim]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_kvpacked_func: kv [batch, seqlen_k, 2, heads_k, dim]."""
    k, v = _unpack(kv, 2, "kv", "[batch, seqlen_k, 2, heads_k, dim]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn.flash_attn_varlen_qkvpacked_func: qkv [total, 3, heads, dim]."""
    q, k, v = _unpack(qkv, 3, "qkv", "[total_tokens, 3, heads, dim]")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash_attn.flash_attn_varlen_kvpacked_func: kv [total_k, 2, heads_k, dim]."""
    k, v = _unpack(kv, 2, "kv", "[total_k, 2, heads_k, dim]")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


def _torch_path(q, name):
    torch_path = _torch_for(q)
    if torch_path is None:
        raise TypeError("fusedattn.flash_attn.%s takes torch tensors (got %s)"
                        % (name, type(q).__module__ + "." + type(q).__name__))
    return torch_path


def _refuse_probs(return_attn_probs, name):
    if return_attn_probs:
        raise NotSupportedError(
            "%s: return_attn_probs=True is not supported: fusedattn never materializes the "
            "attention probabilities; fusedattn.attention(..., return_lse=True) returns the "
            "log-sum-exp" % name)


def _mask_and_window(causal, window_size, causal_mask):
    """The library's mask and window for flash_attn's causal and window_size: bottom-right
    aligned, the window's right side 0 under causal (as flash_attn sets it)."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError("window_size = %r must be a pair (left, right); -1 is "
                                   "unbounded" % (window_size,)) from None
    left = -1 if left is None or left < 0 else int(left)
    right = -1 if right is None or right < 0 else int(right)
    if causal:
        return causal_mask, (left, -1)
    return None, (left, right)


def _slopes(alibi_slopes):
    if alibi_slopes is not None and alibi_slopes.dim() != 1:
        raise NotSupportedError("alibi_slopes has shape %s: fusedattn takes one slope per head "
                                "([heads], float32), not per batch and head"
                                % (list(alibi_slopes.shape),))
    return alibi_slopes


def _unpack(packed, count, name, shape):
    axis = packed.dim() - 3
    if axis < 1 or packed.shape[axis] != count:
        raise InvalidArgumentError("%s has shape %s but %s is expected"
                                   % (name, list(packed.shape), shape))
    return packed.unbind(axis)
