"""fusedattn.scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's
signature and semantics over fusedattn's torch operators, so that replacing the import is enough:

    from fusedattn import scaled_dot_product_attention        # was: from torch.nn.functional

How each argument maps onto the library (include/fusedattn/fusedattn.h), nothing materialized
that the caller did not give:
* query/key/value [..., heads, seq, dim] run as layout "bhsd" (any strides, no copy); inputs of
  rank 2 or 3 get unit batch/head axes, ranks above 4 fold their leading axes into the batch.
* is_causal: mask "causal", top-left as PyTorch defines it (query i sees keys j <= i, also when
  seq_q != seq_kv).
* attn_mask, boolean (True = takes part) or float (added to the scaled scores): a post-scale
  bias of shape [1|batch, 1|heads, seq_q, seq_kv]. Axes the mask broadcasts over (a key-padding
  mask [B, 1, 1, S], a [S_q, S_kv] mask) stay broadcast views of stride 0, so only the mask's
  own elements exist; a boolean mask becomes an additive one (0 / -inf) of its own shape, once
  per call. A float mask that requires grad gets its gradient (summed over broadcast axes).
* enable_gqa: key/value heads dividing the query heads run natively (no repeat).
* scale: default 1/sqrt(dim); dropout_p: the library's Philox dropout, its seed drawn from
  torch's default CPU generator (torch.manual_seed reproduces it).
The function adds no device synchronization and keeps the torch operators' per-call cost: the
options resolve to a cached problem string (fusedattn._torch).
"""

from ._api import _torch_for
from ._errors import InvalidArgumentError


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's semantics on fusedattn: returns the
    attention output [..., heads, seq_q, dim_v] with autograd (query, key, value and a float
    attn_mask), torch.compile and CUDA-graph support.

    Where it differs from PyTorch: query/key/value are float32, float16 or bfloat16 (no
    float64); dropout draws a different random mask than PyTorch (same probability and
    scaling); a row whose keys are all masked gives 0 (as PyTorch 2.5+ gives), and its
    gradients are 0; there is no double backward (create_graph=True, then a second backward,
    raises); nested (jagged) tensors are refused."""
    torch_path = _torch_for(query)
    if torch_path is None:
        raise TypeError("fusedattn.scaled_dot_product_attention takes torch tensors (got %s); "
                        "fusedattn.attention takes NumPy arrays"
                        % (type(query).__module__ + "." + type(query).__name__))
    if query.is_nested:
        raise InvalidArgumentError("nested (jagged) tensors are not supported: pass padded "
                                   "tensors with a mask, or packed ones to "
                                   "fusedattn.attention(layout='thd', cu_seqlens_q=...)")
    if is_causal and attn_mask is not None:
        raise InvalidArgumentError("attn_mask and is_causal=True are both given; as in torch's "
                                   "scaled_dot_product_attention, pass one of them")
    rank = query.dim()
    if rank != 4 or key.dim() != 4 or value.dim() != 4:
        query, key, value, attn_mask, restore = _as_rank4(query, key, value, attn_mask)
    else:
        restore = None
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if heads_q != heads_kv and not enable_gqa:
        raise InvalidArgumentError(
            "query has %d heads and key %d: grouped-query attention needs enable_gqa=True (as "
            "torch's scaled_dot_product_attention does)" % (heads_q, heads_kv))
    bias = None
    if attn_mask is not None:
        bias = additive_bias(attn_mask, query, key.shape[2], torch_path.torch)
    out = torch_path.attention(
        query, key, value, "bhsd", "causal" if is_causal else None, (-1, -1), bias,
        "post_scale", None, 0.0, None, None, dropout_p, dropout_seed(dropout_p, torch_path),
        scale, None, None, None, None, None, None, False, "auto", False, None, None)
    return out if restore is None else restore(out)


def dropout_seed(dropout_p, torch_path):
    """A dropout seed from torch's default CPU generator (no device work), so that
    torch.manual_seed makes runs repeatable; None (the operator's own random seed) without
    dropout or while torch.compile traces (give fusedattn.attention a seed there)."""
    if not dropout_p:
        return None
    torch = torch_path.torch
    if torch.compiler.is_compiling():
        return None
    return int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))


def additive_bias(mask, query, seqlen_kv, torch):
    """attn_mask as the library's post-scale bias [1|batch, 1|heads_q, seq_q, seq_kv]: a boolean
    mask becomes 0 / -inf in query's dtype (its own shape), a float mask stays as it is (dtypes
    other than query's and float32 become query's); then the axes it broadcasts over are
    expanded with stride 0. query is [batch, heads_q, seq_q, dim]."""
    if not isinstance(mask, torch.Tensor):
        raise InvalidArgumentError("attn_mask must be a torch tensor (boolean or float), got %s"
                                   % type(mask).__name__)
    if mask.dtype == torch.bool:
        mask = query.new_full(mask.shape, float("-inf")).masked_fill_(mask, 0.0)
    elif mask.dtype.is_floating_point:
        if mask.dtype != query.dtype and mask.dtype != torch.float32:
            mask = mask.to(query.dtype)
    else:
        raise InvalidArgumentError("attn_mask has dtype %s: it is boolean (True = takes part) or "
                                   "float (added to the scores)" % (mask.dtype,))
    batch, heads, seqlen_q = query.shape[0], query.shape[1], query.shape[2]
    full = (batch, heads, seqlen_q, seqlen_kv)
    if mask.dim() > 4:
        raise InvalidArgumentError("attn_mask has shape %s: at most 4 axes, broadcastable to "
                                   "[batch, heads, seq_q, seq_kv] = %s"
                                   % (list(mask.shape), list(full)))
    if mask.dim() < 4:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    for size, wanted in zip(mask.shape, full):
        if size != 1 and size != wanted:
            raise InvalidArgumentError(
                "attn_mask has shape %s, which does not broadcast to [batch, heads, seq_q, "
                "seq_kv] = %s" % (list(mask.shape), list(full)))
    return mask.expand(mask.shape[0], mask.shape[1], seqlen_q, seqlen_kv)


def _as_rank4(query, key, value, attn_mask):
    """Inputs of rank other than 4 as [batch, heads, seq, dim] (rank 2: one batch and head;
    rank 3: [heads, seq, dim], the axis grouped-query attention reads; rank > 4: leading axes
    folded into the batch), the mask alike, and how to give the output its rank back."""
    shapes = [tuple(t.shape) for t in (query, key, value)]
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1 or min(ranks) < 2:
        raise InvalidArgumentError(
            "query, key and value have shapes %s, %s, %s: they have one rank, at least 2 "
            "([..., seq, dim])" % tuple(list(s) for s in shapes))
    rank = ranks.pop()
    lead = shapes[0][:-3] if rank > 3 else ()
    for name, shape in (("key", shapes[1]), ("value", shapes[2])):
        if rank > 3 and shape[:-3] != lead:
            raise InvalidArgumentError("%s has shape %s but query %s: the leading axes must "
                                       "agree" % (name, list(shape), list(shapes[0])))

    def fold(t):
        if rank == 2:
            return t.reshape((1, 1) + tuple(t.shape))
        if rank == 3:
            return t.unsqueeze(0)
        return t.reshape((-1,) + tuple(t.shape[-3:]))

    if attn_mask is not None and rank > 4:
        if attn_mask.dim() > rank:
            raise InvalidArgumentError("attn_mask has more axes than query")
        mask_shape = (1,) * (rank - attn_mask.dim()) + tuple(attn_mask.shape)
        attn_mask = attn_mask.reshape(mask_shape)
        if any(n != 1 for n in mask_shape[:-3]):
            # Folding the leading axes into the batch needs the mask over all of them.
            attn_mask = attn_mask.expand(lead + mask_shape[-3:])
            attn_mask = attn_mask.reshape((-1,) + mask_shape[-3:])
        else:
            attn_mask = attn_mask.reshape(mask_shape[-3:])
    out_lead = tuple(query.shape[:-2])

    def restore(out):
        return out.reshape(out_lead + tuple(out.shape[-2:]))

    return fold(query), fold(key), fold(value), attn_mask, restore

