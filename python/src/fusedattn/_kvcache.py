"""flash_attn_with_kvcache (fusedattn.flash_attn's) over fusedattn's torch operator: the append of
the new keys and values into the cache, rotary embeddings, and the mapping of the cache onto the
library's problems. Imported on the first call (torch is loaded then).

How a cache becomes a problem (every path computes the same thing; they differ in which GPU
kernels can run it, see src/backends/flash/README.md and src/backends/cudnn/README.md):

* Paged cache (block_table): the library's paged K/V as it is, k_cache/v_cache the pools of
  pages, page_table = block_table, seqlens_kv = cache_seqlens + seqlen_new; dense queries. On
  GPUs flash's decode kernel runs it (seqlen_q <= 16) or the Hopper forward (page sizes that are
  powers of two of at least 16).
* Contiguous cache [batch_cache, seqlen_cache, heads_k, dim]: a dense BSHD problem over
  k_cache[:batch] with each sequence's key length as a padding mask (cu_seqlens_kv from
  cache_seqlens + seqlen_new on the device; with an int cache_seqlens every sequence has the same
  length and the keys are the view k_cache[:batch, :length], no padding at all). That is the
  problem every backend runs: cuDNN (padding masks), flash's decode kernel (contiguous K/V with
  padding), its Hopper and mma.sync forwards; the alternative, a pool of one page per sequence
  (page_size = seqlen_cache), would leave only the paged kernels, whose Hopper forward takes page
  sizes that are powers of two only, and cuDNN none.
* Contiguous cache with cache_batch_idx: the sequences' rows of the cache are not a slice. For
  decode-shaped problems that flash's decode kernel reads (seqlen_q <= 16, float16/bfloat16,
  head dims 64/64 or 128/128) the cache is read in place as a pool of one page per sequence
  (page_table = cache_batch_idx[:, None], any page size): decode is memory-bound and a gather
  would triple its traffic. Otherwise the rows are gathered (k_cache.index_select, a copy) into
  the dense problem above, which every backend runs; beside the attention of more than 16
  queries (compute-bound) or on kernels that are not the decode kernel, the copy is small.

Nothing here reads a device tensor on the host (the lengths, indices and scatter positions are
computed with torch ops where the tensors live), so calls on CUDA tensors can be captured in CUDA
graphs. On CPU tensors (free to read) the lengths, cache_batch_idx and the block_table entries a
call uses are checked before anything is written, and a bad one is refused by name; on CUDA, as
with flash_attn, they are the caller's to keep in range (torch's indexing asserts on the device
for positions past the cache, a page index of -1 would be taken as the last page).

Every argument is checked before the append. What only a backend can decide comes after it: if
no backend runs the attention (fusedattn.explain says why), the NotSupportedError is raised with
the new keys and values already in the cache, as a completed append.
"""

import math
import numbers

import torch

from ._errors import InvalidArgumentError, NotSupportedError

NAME = "flash_attn_with_kvcache"
# The most query rows per sequence that flash's decode kernel takes (planner.cpp's
# kPagedDecodeMaxRows), and the dtypes and head dims it is built for (decode.cu's DecodeFits).
_DECODE_ROWS = 16
_DECODE_DTYPES = (torch.float16, torch.bfloat16)
_DECODE_DIMS = (64, 128)
_FLT_MIN, _FLT_MAX = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max  # normal range


def _check(ok, message, *values):
    if not ok:
        raise InvalidArgumentError("%s: %s" % (NAME, message % values))


def _shape(t):
    return list(t.shape)


def _is_index_tensor(t):
    return isinstance(t, torch.Tensor) and not (t.dtype.is_floating_point or t.dtype.is_complex
                                                or t.dtype == torch.bool)


def _describe(t):
    if isinstance(t, torch.Tensor):
        return "a %s tensor" % str(t.dtype).replace("torch.", "")
    return type(t).__name__


def _check_index(t, name, shape, what, device):
    """An integer tensor of a given shape on q's device (int32 as flash_attn takes it; other
    integer dtypes are converted)."""
    _check(_is_index_tensor(t), "%s must be an int32 tensor %s, got %s", name, what,
           _describe(t))
    _check(tuple(t.shape) == shape, "%s has shape %s but %s = %s is expected", name, _shape(t),
           what, list(shape))
    _check(t.device == device, "%s is on %s but q on %s", name, t.device, device)


def run(torch_path, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
        cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window, softcap,
        rotary_interleaved, alibi_slopes, return_lse):
    """flash_attn_with_kvcache's body; window is (left, right) with -1 unbounded, alibi_slopes
    already checked to be per head. Runs without autograd."""
    if cache_leftpad is not None:
        raise NotSupportedError(
            "%s: cache_leftpad (keys that start at a per-sequence offset of the cache) is not "
            "supported: keep each sequence's keys from position 0 of its cache row, or call "
            "fusedattn.attention(layout='thd', seq_offsets_kv=...) with the offsets" % NAME)
    paged = block_table is not None
    if paged and cache_batch_idx is not None:
        raise NotSupportedError(
            "%s: cache_batch_idx with block_table: a paged cache selects its pages through "
            "block_table (flash_attn refuses the pair too: 'Paged KVcache does not support "
            "cache_batch_idx')" % NAME)

    # Shapes, dtypes, devices.
    _check(isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor),
           "k_cache and v_cache must be torch tensors")
    _check(q.dim() == 4, "q has shape %s but [batch, seqlen_q, heads, head_dim] is expected",
           _shape(q))
    batch, seqlen_q, heads, dim = q.shape
    cache_axes = ("[num_blocks, page_block_size, heads_k, head_dim]" if paged
                  else "[batch_cache, seqlen_cache, heads_k, head_dim]")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check(t.dim() == 4, "%s has shape %s but %s is expected%s", name, _shape(t), cache_axes,
               " (block_table is given: a paged cache)" if paged else "")
    _check(k_cache.shape[:3] == v_cache.shape[:3], "k_cache has shape %s but v_cache %s: they "
           "differ outside the head dim", _shape(k_cache), _shape(v_cache))
    _check(k_cache.shape[3] == dim, "k_cache has head dim %d but q %d", k_cache.shape[3], dim)
    heads_k, dim_v = k_cache.shape[2], v_cache.shape[3]
    _check(heads_k > 0 and heads % heads_k == 0, "k_cache has %d heads, which does not divide "
           "q's %d (MQA/GQA: heads_k divides heads)", heads_k, heads)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check(t.dtype == q.dtype, "%s has dtype %s but q %s", name, t.dtype, q.dtype)
        _check(t.device == q.device, "%s is on %s but q on %s", name, t.device, q.device)
    batch_cache = num_blocks = page_size = None
    if paged:
        _check(_is_index_tensor(block_table), "block_table must be an int32 tensor [batch, "
               "max_num_blocks_per_seq], got %s", _describe(block_table))
        _check(block_table.dim() == 2 and block_table.shape[0] == batch, "block_table has shape "
               "%s but [batch = %d, max_num_blocks_per_seq] is expected", _shape(block_table),
               batch)
        _check(block_table.device == q.device, "block_table is on %s but q on %s",
               block_table.device, q.device)
        num_blocks, page_size = k_cache.shape[0], k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        batch_cache, capacity = k_cache.shape[0], k_cache.shape[1]
        if cache_batch_idx is not None:
            _check_index(cache_batch_idx, "cache_batch_idx", (batch,), "[batch]", q.device)
        else:
            _check(batch <= batch_cache, "q has batch %d but k_cache only %d sequences "
                   "(pass cache_batch_idx to choose them)", batch, batch_cache)
    _check(capacity > 0, "the cache holds no key per sequence (k_cache has shape %s)",
           _shape(k_cache))

    # The new keys and values.
    _check((k is None) == (v is None), "k and v are given together (the new keys and values), "
           "but only %s is", "k" if v is None else "v")
    seqlen_new = 0
    if k is not None:
        _check(k.dim() == 4 and tuple(k.shape) == (batch, k.shape[1], heads_k, dim),
               "k has shape %s but [batch, seqlen_new, heads_k, head_dim] = %s is expected",
               _shape(k), [batch, "seqlen_new", heads_k, dim])
        seqlen_new = k.shape[1]
        _check(tuple(v.shape) == (batch, seqlen_new, heads_k, dim_v), "v has shape %s but %s "
               "(k's, with v_cache's head dim) is expected", _shape(v),
               [batch, seqlen_new, heads_k, dim_v])
        for name, t in (("k", k), ("v", v)):
            _check(t.dtype == k_cache.dtype, "%s has dtype %s but the cache %s", name, t.dtype,
                   k_cache.dtype)
            _check(t.device == q.device, "%s is on %s but q on %s", name, t.device, q.device)
        _check(cache_seqlens is not None, "k and v are appended at cache_seqlens: pass "
               "cache_seqlens (an int or an int32 tensor [batch])")
        _check(seqlen_new <= capacity, "k has seqlen_new = %d, more than the cache's %d keys per "
               "sequence", seqlen_new, capacity)

    # cache_seqlens: an int, an int32 tensor [batch], or None (the whole cache).
    uniform = None  # every sequence's number of keys after the append, when one int says it
    if cache_seqlens is None:
        uniform = capacity
    elif isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        cache_seqlens = int(cache_seqlens)
        _check(0 <= cache_seqlens <= capacity - seqlen_new, "cache_seqlens = %d with seqlen_new "
               "= %d does not fit the cache's %d keys per sequence", cache_seqlens, seqlen_new,
               capacity)
        uniform = cache_seqlens + seqlen_new
    else:
        _check_index(cache_seqlens, "cache_seqlens", (batch,), "[batch] (or an int)",
                     q.device)

    # Rotary embeddings.
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary:
        _check(rotary_cos is not None and rotary_sin is not None, "rotary_cos and rotary_sin "
               "are given together")
        _check(k is not None, "rotary_cos/rotary_sin rotate the new keys (and q): pass k and v")
        _check(rotary_cos.dim() == 2 and rotary_cos.shape == rotary_sin.shape,
               "rotary_cos has shape %s and rotary_sin %s but both (seqlen_ro, rotary_dim / 2) "
               "are expected", _shape(rotary_cos), _shape(rotary_sin))
        _check(0 < 2 * rotary_cos.shape[1] <= dim, "rotary_cos has shape %s: rotary_dim = %d "
               "must be in [2, head_dim = %d]", _shape(rotary_cos), 2 * rotary_cos.shape[1], dim)
        _check(rotary_cos.shape[0] >= capacity, "rotary_cos has %d positions but the cache %d "
               "keys per sequence (seqlen_ro must be at least that)", rotary_cos.shape[0],
               capacity)
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _check(t.dtype.is_floating_point, "%s has dtype %s (a float tensor is expected)",
                   name, t.dtype)
            _check(t.device == q.device, "%s is on %s but q on %s", name, t.device, q.device)

    # The attention's own arguments, checked here as the library would check them, so that a
    # bad one is refused before the append writes anything (float32's normal range: fusedattn.h,
    # attn_scale and softcap).
    for name, value in (("softmax_scale", softmax_scale), ("softcap", softcap)):
        if value is None:
            continue
        _check(isinstance(value, numbers.Real) and math.isfinite(value)
               and (value == 0 or _FLT_MIN <= abs(value) <= _FLT_MAX)
               and (value >= 0 or name == "softmax_scale"),
               "%s = %r must be a finite number%s: 0 or of magnitude %g to %g", name, value,
               " >= 0" if name == "softcap" else "", _FLT_MIN, _FLT_MAX)
    if alibi_slopes is not None:
        _check(isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.dtype.is_floating_point
               and tuple(alibi_slopes.shape) == (heads,), "alibi_slopes must be a float tensor "
               "[heads = %d], got %s", heads, _shape(alibi_slopes)
               if isinstance(alibi_slopes, torch.Tensor) else _describe(alibi_slopes))
        _check(alibi_slopes.device == q.device, "alibi_slopes is on %s but q on %s",
               alibi_slopes.device, q.device)

    # Windows as flash_attn normalizes them against the cache's length (a side at least that
    # long is unbounded), causal as a right side of 0.
    left, right = window
    left = -1 if left >= capacity else left
    right = -1 if right >= capacity else right
    if causal:
        right = 0
    local_or_causal = left >= 0 or right >= 0

    if q.device.type == "cpu" and not torch.compiler.is_compiling():
        _check_on_host(batch, cache_seqlens, seqlen_new, capacity, cache_batch_idx, batch_cache,
                       block_table, page_size, num_blocks,
                       rotary_cos.shape[0] if rotary and local_or_causal else None, seqlen_q)

    device = q.device
    if cache_seqlens is None:
        lengths = None  # every sequence has the whole cache; nothing is appended
    elif isinstance(cache_seqlens, torch.Tensor):
        lengths = cache_seqlens.to(torch.int32)
    else:
        lengths = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)

    # The append (rotating the new keys first).
    if k is not None:
        positions = lengths.long()[:, None] + torch.arange(seqlen_new, device=device)
        if rotary:
            k = rotate(k, rotary_cos, rotary_sin, positions, rotary_interleaved)
        if paged:
            pages = block_table.long().gather(1, torch.div(positions, page_size,
                                                           rounding_mode="floor"))
            where = (pages, positions % page_size)
        else:
            rows = (cache_batch_idx.long() if cache_batch_idx is not None
                    else torch.arange(batch, device=device))
            where = (rows[:, None].expand(batch, seqlen_new), positions)
        k_cache.index_put_(where, k)
        v_cache.index_put_(where, v)
    if rotary:
        # flash_attn: causal or local, query i at cache_seqlens + i; else every query at
        # cache_seqlens.
        steps = (torch.arange(seqlen_q, device=device) if local_or_causal
                 else torch.zeros(seqlen_q, dtype=torch.long, device=device))
        q = rotate(q, rotary_cos, rotary_sin, lengths.long()[:, None] + steps,
                   rotary_interleaved)

    # The attention.
    seqlens_k = None if lengths is None else lengths + seqlen_new
    common = dict(window=(left, -1 if causal else right), alibi=alibi_slopes, softcap=softcap,
                  scale=softmax_scale, return_lse=return_lse)
    if paged or (cache_batch_idx is not None and _decode_kernel_reads(q, seqlen_q, dim, dim_v)):
        if paged:
            table = block_table
        else:  # one page per sequence: its cache row
            table = cache_batch_idx.reshape(batch, 1)
        if seqlens_k is None:
            seqlens_k = torch.full((batch,), capacity, dtype=torch.int32, device=device)
        return _attention(torch_path, q, k_cache, v_cache, "causal_bottom_right" if causal
                          else None, page_table=table, seqlens_kv=seqlens_k, **common)
    if cache_batch_idx is not None:
        keys, values = (x.index_select(0, cache_batch_idx.long()) for x in (k_cache, v_cache))
    else:
        keys, values = k_cache[:batch], v_cache[:batch]
    if uniform is not None and uniform > 0:
        return _attention(torch_path, q, keys[:, :uniform], values[:, :uniform],
                          "causal_bottom_right" if causal else None, **common)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device) * seqlen_q
    cu_seqlens_kv = torch.cat((seqlens_k.new_zeros(1), torch.cumsum(seqlens_k, 0,
                                                                     dtype=torch.int32)))
    return _attention(torch_path, q, keys, values, "padding_causal_bottom_right" if causal
                      else "padding", cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                      **common)


def _decode_kernel_reads(q, seqlen_q, dim, dim_v):
    """Whether flash's decode kernel takes this problem's shapes (it reads a paged cache in
    place); see the module's docstring."""
    return (seqlen_q <= _DECODE_ROWS and q.dtype in _DECODE_DTYPES and dim == dim_v
            and dim in _DECODE_DIMS)


def _attention(torch_path, q, k, v, mask, window, alibi, softcap, scale, return_lse,
               cu_seqlens_q=None, cu_seqlens_kv=None, page_table=None, seqlens_kv=None):
    return torch_path.attention(
        q, k, v, "bshd", mask, window, None, "post_scale", alibi, softcap, None, None, 0.0, None,
        scale, cu_seqlens_q, cu_seqlens_kv, None, None, None, None, False, "auto", return_lse,
        None, None, page_table=page_table, seqlens_kv=seqlens_kv)


def rotate(x, cos, sin, positions, interleaved):
    """x [batch, seqlen, heads, dim] with its first rotary_dim = 2 * cos.shape[1] features
    rotated by the angles of cos/sin at positions [batch, seqlen] (flash_attn's rotary: pairs
    (0, 1), (2, 3), ... when interleaved, else (i, i + rotary_dim / 2), GPT-NeoX style); computed
    in float32 (or x's dtype, if wider) and rounded to x's dtype, the rest of x unchanged."""
    half = cos.shape[1]
    compute = torch.promote_types(x.dtype, torch.float32)
    c = cos[positions].to(compute).unsqueeze(2)  # [batch, seqlen, 1, rotary_dim / 2]
    s = sin[positions].to(compute).unsqueeze(2)
    part = x[..., :2 * half].to(compute)
    if interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = part[..., :half], part[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _check_on_host(batch, cache_seqlens, seqlen_new, capacity, cache_batch_idx, batch_cache,
                   block_table, page_size, num_blocks, query_positions, seqlen_q):
    """CPU tensors only: what the device path leaves to the caller, checked before the append
    writes anything. query_positions: seqlen_ro when q is rotated at cache_seqlens + i."""
    if isinstance(cache_seqlens, torch.Tensor):
        lengths = cache_seqlens.tolist()
        for b, n in enumerate(lengths):
            _check(0 <= n <= capacity - seqlen_new, "cache_seqlens[%d] = %d with seqlen_new = "
                   "%d does not fit the cache's %d keys per sequence", b, n, seqlen_new,
                   capacity)
    else:  # an int (checked already) or None: the whole cache
        lengths = [capacity if cache_seqlens is None else cache_seqlens] * batch
    if query_positions is not None:
        for b, n in enumerate(lengths):
            _check(n + seqlen_q <= query_positions, "q is rotated at cache_seqlens + i (causal "
                   "or local): sequence %d needs positions up to %d but rotary_cos has %d",
                   b, n + seqlen_q - 1, query_positions)
    if cache_batch_idx is not None:
        for b, row in enumerate(cache_batch_idx.tolist()):
            _check(0 <= row < batch_cache, "cache_batch_idx[%d] = %d is outside the cache's "
                   "%d sequences", b, row, batch_cache)
    if block_table is not None:
        for b, (row, n) in enumerate(zip(block_table.tolist(), lengths)):
            for i in range(-(-(n + seqlen_new) // page_size)):
                _check(0 <= row[i] < num_blocks, "block_table[%d, %d] = %d is outside the "
                       "pool's num_blocks = %d (sequence %d has %d keys)", b, i, row[i],
                       num_blocks, b, n + seqlen_new)
