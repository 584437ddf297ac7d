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

Not taken, with an error that says so: return_attn_probs=True (fusedattn never materializes
the probabilities; fusedattn.attention(..., return_lse=True) gives the log-sum-exp), alibi
slopes per batch ([batch, heads]), block_table (paged KV caches), and flash_attn_with_kvcache
(paged K/V is in the C API and in fusedattn.attention(..., page_table=, seqlens_kv=), forward
only and on the reference backend so far; these entry points do not map onto it yet). Dropout draws a different (equally distributed) random
mask than FlashAttention, from a seed taken from torch's default CPU generator.
"""

from ._api import _torch_for
from ._errors import InvalidArgumentError, NotSupportedError
from ._sdpa import dropout_seed

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]


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
    sequence are 0."""
    torch_path = _torch_path(q, "flash_attn_varlen_func")
    _refuse_probs(return_attn_probs, "flash_attn_varlen_func")
    if block_table is not None:
        raise NotSupportedError("flash_attn_varlen_func: block_table (a paged KV cache) is not "
                                "supported yet; pass k and v packed as [total_k, heads_k, dim]")
    if max_seqlen_q is None or max_seqlen_k is None:
        raise InvalidArgumentError("flash_attn_varlen_func needs max_seqlen_q and max_seqlen_k "
                                   "(ints: the longest query and key sequences)")
    mask, window = _mask_and_window(causal, window_size, "padding_causal_bottom_right")
    return torch_path.attention(
        q, k, v, "thd", mask or "padding", window, None, "post_scale", _slopes(alibi_slopes),
        softcap or 0.0, None, None, dropout_p, dropout_seed(dropout_p, torch_path),
        softmax_scale, cu_seqlens_q, cu_seqlens_k, None, None, max_seqlen_q, max_seqlen_k,
        deterministic, "auto", False, None, None)


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
