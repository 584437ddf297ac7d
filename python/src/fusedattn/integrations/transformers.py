"""fusedattn as a Hugging Face transformers attention implementation, "fusedattn":

    import fusedattn.integrations.transformers        # registers "fusedattn" (once, at import)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fusedattn")
    # or model.set_attn_implementation("fusedattn")

Two functions are registered under the name: the attention function (AttentionInterface) that
every attention layer calls, and a mask function (AttentionMaskInterface) that the model calls
once per forward pass and mask type (full, sliding) to describe its mask. The mask function
does not build an O(seq_q * seq_kv) mask: it recognizes the mask transformers asks for (causal
or bidirectional, sliding window, the 2-D padding mask `attention_mask`, sequences packed
through position_ids, the cache's query and key offsets) and returns a "plan" that every
layer of the forward pass then runs:

* dense: no padding. q, k, v run as they come ([batch, heads, seq, dim] views, no copy) with
  the library's causal mask, top-left or bottom-right (the end of the keys aligned with the
  last query, as a KV cache has it) and window.
* varlen: padding (left or right) or packed sequences. Each sequence's tokens are one
  contiguous run of the batch row, so q, k, v run as packed variable-length tensors ("thd",
  [batch * seq, heads, dim], a view where the layout allows, else one copy) with
  cu_seqlens and seq_offsets that point at each run: no gather, no scatter, the output is
  [batch, seq, heads, dim] at once; padded tokens do no work and get 0.
* flex: the exact mask as a score modifier reading the padding mask [batch, seq_kv] (and the
  packed sequence ids, the query offset) per key: for masks whose runs are not contiguous
  (holes), for cache offsets that neither alignment fits (a static cache's), and whenever the
  plan may not read the device (below). Where no backend runs score modifiers for a layer's
  tensors (float32 on CUDA: flash runs them in float16 and bfloat16), the same mask runs
  materialized as a [batch, 1, seq_q, seq_kv] bias, with a warning. The library's backend
  selection decides this on the host before the call, so it holds under torch.compile too
  (generate() compiles its decoding steps with a static cache).
* general: a mask transformers builds from pieces fusedattn does not recognize (or_mask /
  and_mask functions, chunked attention, block-wise overlays) is materialized as transformers'
  own SDPA mask [batch, 1, seq_q, seq_kv] and added as a bias: exact, O(seq_q * seq_kv) memory.

Device synchronization: choosing dense or varlen for a padding mask takes one device-to-host
read per mask creation (so one or two per forward pass, never per layer) of a few integers: is
there padding, is every row one run, the longest runs (max_seqlen). Without it, padding runs as
flex, which is exact but slower. No read happens while torch.compile traces, while a CUDA graph
is being captured, or after register(read_masks=False); a mask without padding (attention_mask
None, as in most training) needs no read at all.

Per layer: dropout (the layer's `dropout`, drawn with fusedattn's Philox from a seed of torch's
CPU generator), scaling, softcap (attn_logit_softcapping), s_aux (learnable sinks, as gpt-oss),
GQA/MQA (natively, k/v are not repeated); the output is [batch, seq_q, heads, dim_v].
FlashAttention's varlen keyword arguments (cu_seq_lens_q/k, max_length_q/k, as
DataCollatorWithFlattening passes them) are taken too.

Differences from "eager"/"sdpa" that do not change a model's results: outputs at padded query
positions are 0 (eager and SDPA compute values there that nothing reads); dropout masks differ
(random). Refused with an error: position_bias (T5-style relative bias), flex BlockMasks,
float64. output_attentions=True warns and returns no weights (as SDPA does).

Written against transformers 5.x (tested with 5.17): the mask functions are recognized by what
transformers builds them from (causal_mask_function, and_masks, the sliding-window and
packed-sequence overlays); a version that builds them otherwise gets the exact general plan.
"""

import functools
import warnings

import torch
from transformers import AttentionInterface
from transformers import masking_utils as _masks
from transformers.masking_utils import AttentionMaskInterface

from .. import _api, _C, _torch, flex
from .._errors import InvalidArgumentError, NotSupportedError
from .._sdpa import additive_bias, dropout_seed

NAME = "fusedattn"

_settings = {"read_masks": True}


def register(name=NAME, read_masks=True):
    """Registers fusedattn's attention and mask functions under `name` (done for "fusedattn" at
    import). read_masks=False: plans never read the device (padding then runs as a flex mask,
    see the module's documentation); the setting holds for every name."""
    _settings["read_masks"] = bool(read_masks)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------


class Plan:
    """How every layer of a forward pass runs its attention, for one mask.

    kind: "dense", "varlen" or "flex". mask / window: the library's mask name and (left,
    right) window. q_length / kv_length: the query and key array lengths it was made for.
    varlen: cu_seqlens_q/kv, seq_offsets_q/kv (int32 [batch + 1]) and max_seqlen_q/kv (ints).
    flex: score_mod, a fusedattn.flex.ScoreMod holding the mask, and `visible`, a function that
    materializes the same mask ([batch|1, 1, seq_q, seq_kv] booleans) for the devices and dtypes
    where no backend runs score modifiers (float32 on CUDA); `bias` holds it once made."""

    _FIELDS = ("cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv",
               "max_seqlen_q", "max_seqlen_kv", "score_mod", "visible", "bias")
    __slots__ = ("kind", "mask", "window", "q_length", "kv_length") + _FIELDS

    def __init__(self, kind, mask=None, window=(-1, -1), q_length=None, kv_length=None,
                 **fields):
        self.kind, self.mask, self.window = kind, mask, window
        self.q_length, self.kv_length = q_length, kv_length
        for name in self._FIELDS:
            setattr(self, name, fields.get(name))

    def __repr__(self):
        return "Plan(%s, mask=%s, window=%s, q_length=%s, kv_length=%s)" % (
            self.kind, self.mask, self.window, self.q_length, self.kv_length)


class Pattern:
    """The mask pattern without padding: causal (key position <= query position) or
    bidirectional, and a window (left, right) in positions, -1 unbounded."""

    __slots__ = ("causal", "left", "right")

    def __init__(self, causal, left=-1, right=-1):
        self.causal, self.left, self.right = causal, left, right

    @property
    def aligned(self):
        """Whether the result depends on how queries and keys align (causal or windowed)."""
        return self.causal or self.left >= 0 or self.right >= 0

    def window(self):
        return (self.left, -1 if self.causal else self.right)


_PLAN = "_fusedattn_plan"  # the attribute of a mask tensor that carries its plan


def _can_read(device):
    """Whether a plan may read the device now."""
    if not _settings["read_masks"] or torch.compiler.is_compiling():
        return False
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def _dense(pattern, q_offset, q_length, kv_length):
    """The dense plan for an unpadded batch, or None when neither of the library's alignments
    fits the offsets (q_offset: the position of the first query minus that of the first key)."""
    if not pattern.aligned:
        return Plan("dense", None, (-1, -1), q_length, kv_length)
    if not isinstance(q_offset, int):
        return None
    top_left = q_offset == 0
    bottom_right = q_offset == kv_length - q_length
    if pattern.causal and (top_left or bottom_right):
        mask = "causal" if top_left else "causal_bottom_right"
        return Plan("dense", mask, pattern.window(), q_length, kv_length)
    if not pattern.causal and bottom_right:  # a window alone is bottom-right aligned
        return Plan("dense", None, pattern.window(), q_length, kv_length)
    return None


def _runs(valid):
    """Per row of a boolean [batch, n]: (start, length, contiguous): its first True, its count
    of True, and whether the Trues form one run. Empty rows start at 0."""
    n = valid.shape[1]
    index = torch.arange(n, device=valid.device)
    length = valid.sum(1)
    first = torch.where(valid, index, n).amin(1)
    last = torch.where(valid, index, -1).amax(1)
    contiguous = (length == 0) | (last - first + 1 == length)
    start = torch.where(length == 0, 0, first)
    return start, length, contiguous


def _cumulative(lengths):
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def _offsets(starts, row_length):
    """seq_offsets of runs starting at `starts` in rows of row_length tokens ([batch + 1]; the
    last entry, the end of the packed tensor, is not read as a start)."""
    batch = starts.shape[0]
    rows = torch.arange(batch + 1, device=starts.device) * row_length
    return (rows + torch.nn.functional.pad(starts, (0, 1))).to(torch.int32)


def _padded_plan(pattern, padding, q_offset, q_length, kv_length, read):
    """The plan for a padding mask `padding` (bool [batch, kv_length], True = a real key, in the
    key array's positions) and the pattern; q_offset as in _dense."""
    kv_start, kv_len, kv_contiguous = _runs(padding)
    if not pattern.aligned:
        # Queries are not masked by padding (as in SDPA): each sequence takes every query.
        q_start = torch.zeros_like(kv_start)
        q_len = torch.full_like(kv_len, q_length)
        ok = kv_contiguous
    elif isinstance(q_offset, int) and 0 <= q_offset <= kv_length - q_length:
        # Queries are keys too: a query is real where its key is, and a sequence's last query
        # and last key are one position, so bottom-right alignment in the sequence is the
        # batch's own alignment.
        q_start, q_len, q_contiguous = _runs(padding[:, q_offset:q_offset + q_length])
        aligned = (kv_start + kv_len) - (q_start + q_len) == q_offset
        ok = kv_contiguous & q_contiguous & ((q_len == 0) | aligned)
    else:
        return _flex_plan(pattern, q_offset, q_length, kv_length, padding.device,
                          padding=padding)
    if not read:
        return _flex_plan(pattern, q_offset, q_length, kv_length, padding.device,
                          padding=padding)
    padded = (kv_len < kv_length).any() | (q_len < q_length).any()
    facts = torch.stack((ok.all(), padded, q_len.max(), kv_len.max())).tolist()  # the read
    all_ok, any_padding, max_q, max_kv = (int(x) for x in facts)
    if not all_ok:
        return _flex_plan(pattern, q_offset, q_length, kv_length, padding.device,
                          padding=padding)
    if not any_padding:
        plan = _dense(pattern, q_offset, q_length, kv_length)
        if plan is not None:
            return plan
    mask = "padding"
    if pattern.causal:  # q_offset 0 with as many queries as keys: the runs are the same
        same = q_offset == 0 and q_length == kv_length
        mask = "padding_causal" if same else "padding_causal_bottom_right"
    return Plan("varlen", mask, pattern.window(), q_length, kv_length,
                cu_seqlens_q=_cumulative(q_len), cu_seqlens_kv=_cumulative(kv_len),
                seq_offsets_q=_offsets(q_start, q_length),
                seq_offsets_kv=_offsets(kv_start, kv_length),
                max_seqlen_q=max(max_q, 1), max_seqlen_kv=max(max_kv, 1))


def _packed_plan(pattern, sequence_ids, read):
    """The plan for sequences packed into rows (sequence_ids [batch, seq]: the same id for the
    tokens of one sequence, increasing along the row, as transformers derives it from
    position_ids; no cache, so queries and keys are the same tokens)."""
    batch, length = sequence_ids.shape
    if not read:
        return _flex_plan(pattern, 0, length, length, sequence_ids.device,
                          sequence_ids=sequence_ids)
    flat = sequence_ids.reshape(-1)
    position = torch.arange(flat.shape[0], device=flat.device)
    starts = (position % length == 0)
    starts[1:] |= flat[1:] != flat[:-1]
    # Sequence ids are below `length`, so id + row * length numbers every sequence uniquely.
    unique = sequence_ids + torch.arange(batch, device=flat.device)[:, None] * length
    lengths = torch.bincount(unique.reshape(-1), minlength=batch * length)
    facts = torch.stack((starts.sum(), lengths.max())).tolist()  # the read
    count, longest = int(facts[0]), int(facts[1])
    first = torch.nonzero_static(starts, size=count).reshape(-1)
    cu = torch.cat((first, first.new_full((1,), flat.shape[0]))).to(torch.int32)
    mask = "padding_causal" if pattern.causal else "padding"
    return Plan("varlen", mask, pattern.window(), length, length, cu_seqlens_q=cu,
                cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest)


def _flex_plan(pattern, q_offset, q_length, kv_length, device, padding=None,
               sequence_ids=None):
    """The exact mask as a flex mask_mod over dense tensors: key j is visible to query i when
    padding[b, j] (a real key), sequence_ids agree, and the pattern holds between the query's
    position i + q_offset and the key's j (q_offset an int or a 0-d/1-element tensor)."""
    conditions = []
    if padding is not None:
        real = flex.Tensor(padding.to(torch.int32), name="padding")
        conditions.append(real[flex.batch, flex.kv_idx] != 0)
    if sequence_ids is not None:
        ids = flex.Tensor(sequence_ids.to(torch.int32), name="sequence_ids")
        conditions.append(ids[flex.batch, flex.q_idx] == ids[flex.batch, flex.kv_idx])
    query = flex.q_idx  # the query's position relative to the first key
    if pattern.aligned and not (isinstance(q_offset, int) and q_offset == 0):
        # A tensor even for an int offset: the graph is then the same at every decoding step
        # (its text, which backends compile and cache, holds no offset).
        if isinstance(q_offset, int):
            offset = torch.full((1,), q_offset, dtype=torch.int32, device=device)
        else:
            offset = q_offset.reshape(1).to(torch.int32)
        query = flex.q_idx + flex.Tensor(offset, name="q_offset")[()]
    if pattern.causal:
        conditions.append(flex.kv_idx <= query)
    if pattern.left >= 0:
        conditions.append(flex.kv_idx >= query - pattern.left)
    if pattern.right >= 0 and not pattern.causal:
        conditions.append(flex.kv_idx <= query + pattern.right)
    if not conditions:
        return Plan("dense", None, (-1, -1), q_length, kv_length)
    expression = functools.reduce(lambda a, b: a & b, conditions)

    def visible():
        """The same mask as booleans [batch|1, 1, q_length, kv_length]."""
        query = torch.arange(q_length, device=device)[:, None] + (
            q_offset if isinstance(q_offset, int) else q_offset.reshape(1, 1))
        key = torch.arange(kv_length, device=device)[None, :]
        ok = torch.ones(q_length, kv_length, dtype=torch.bool, device=device)
        if pattern.causal:
            ok = ok & (key <= query)
        if pattern.left >= 0:
            ok = ok & (key >= query - pattern.left)
        if pattern.right >= 0 and not pattern.causal:
            ok = ok & (key <= query + pattern.right)
        ok = ok[None, None]
        if padding is not None:
            ok = ok & padding[:, None, None, :]
        if sequence_ids is not None:
            ok = ok & (sequence_ids[:, None, :, None] == sequence_ids[:, None, None, :])
        return ok

    return Plan("flex", None, (-1, -1), q_length, kv_length,
                score_mod=flex.ScoreMod(mask=expression), visible=visible)


# ---------------------------------------------------------------------------------------------
# The mask function (AttentionMaskInterface)
# ---------------------------------------------------------------------------------------------


def _closure(fn):
    cells = fn.__closure__ or ()
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in cells)))


def _parts(fn):
    """The mask functions that transformers' and_masks(...) combined into fn (fn itself when it
    is no and_masks)."""
    if getattr(fn, "__qualname__", "") == "and_masks.<locals>.and_mask":
        out = []
        for part in _closure(fn).get("mask_functions", ()):
            out.extend(_parts(part))
        return out
    return [fn]


def recognize(mask_function):
    """(Pattern, sequence_ids or None) for a mask function transformers builds from its own
    pieces: causal_mask_function or bidirectional_mask_function, and-ed with sliding-window
    overlays and packed-sequence masks. None for anything else (or_masks, chunked attention,
    block overlays, user functions): those run as a materialized mask."""
    has_base, causal, left, right, sequence_ids = False, False, -1, -1, None

    def tighter(current, bound):
        return bound if current < 0 else min(current, bound)

    for part in _parts(mask_function):
        name = getattr(part, "__qualname__", "")
        if part is _masks.causal_mask_function:
            has_base, causal = True, True
        elif part is _masks.bidirectional_mask_function:
            has_base = True
        elif name == "sliding_window_overlay.<locals>.inner_mask":
            # kv_idx > q_idx - sliding_window: `sliding_window - 1` keys back
            left = tighter(left, int(_closure(part)["sliding_window"]) - 1)
        elif name == "sliding_window_bidirectional_overlay.<locals>.inner_mask":
            # abs(q_idx - kv_idx) <= sliding_window
            window = int(_closure(part)["sliding_window"])
            left, right = tighter(left, window), tighter(right, window)
        elif name == "packed_sequence_mask_function.<locals>.inner_mask":
            if sequence_ids is not None:
                return None
            sequence_ids = _closure(part)["packed_sequence_mask"]
        else:
            return None
    if not has_base:
        return None
    return Pattern(causal, left, right), sequence_ids


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                   mask_function=_masks.causal_mask_function, attention_mask=None,
                   device="cpu", **kwargs):
    """transformers' mask function for "fusedattn": a boolean [batch, kv_length] padding mask
    (True = a real key, in the key array's positions) carrying its Plan, or, for a mask it does
    not recognize, transformers' SDPA mask [batch, 1, q_length, kv_length] (exact, materialized).
    The layers' attention function reads the plan."""
    if getattr(attention_mask, _PLAN, None) is not None:
        # Already one of ours: generate() makes the masks ahead (create_masks_for_generate) and
        # the model passes them through mask creation again, which would read this key-position
        # mask as a 2-D mask over all positions.
        return attention_mask
    recognized = recognize(mask_function)
    if recognized is None:
        return _masks.sdpa_mask(
            batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
            kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
            allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
            use_vmap=kwargs.get("use_vmap", False), device=device)
    pattern, sequence_ids = recognized
    device = torch.device(device)
    # The first query's position relative to the first key's; a tensor for a static cache
    # (kept on the device: reading it would synchronize).
    relative = q_offset - kv_offset if kv_offset else q_offset
    read = _can_read(device)
    padding = None
    if attention_mask is not None:
        padding = _masks.prepare_padding_mask(attention_mask, kv_length, kv_offset)
        padding = padding[:, kv_offset:kv_offset + kv_length].to(device=device, dtype=torch.bool)
    if sequence_ids is not None:
        plan = _packed_plan(pattern, sequence_ids, read)
    elif padding is not None:
        plan = _padded_plan(pattern, padding, relative, q_length, kv_length, read)
    else:
        plan = _dense(pattern, relative, q_length, kv_length) or _flex_plan(
            pattern, relative, q_length, kv_length, device)
    carrier = padding if padding is not None else torch.ones(
        (batch_size, kv_length), dtype=torch.bool, device=device)
    setattr(carrier, _PLAN, plan)
    return carrier


# ---------------------------------------------------------------------------------------------
# The attention function (AttentionInterface)
# ---------------------------------------------------------------------------------------------

_warned = set()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def _fa_pattern(module, is_causal, sliding_window):
    """A 2-D mask without a plan (made by another mask function, or a copy of ours) follows
    FlashAttention's contract in transformers: causal from is_causal (else the module's), the
    window from sliding_window, both bottom-right aligned."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if not sliding_window:
        return Pattern(bool(causal))
    window = int(sliding_window) - 1
    return Pattern(bool(causal), window, -1 if causal else window)


def _plan_of(mask, module, query, key, is_causal, sliding_window):
    """The plan of this layer's mask (see the module's documentation), or a bias tensor for a
    4-D mask."""
    plan = getattr(mask, _PLAN, None)
    if plan is not None:
        return plan
    q_length, kv_length = query.shape[2], key.shape[2]
    if mask is None:
        # As transformers' SDPA integration: causal (top-left) when the layer is and there is
        # more than one query.
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        mask_name = "causal" if causal and q_length > 1 else None
        return Plan("dense", mask_name, (-1, -1), q_length, kv_length)
    if not isinstance(mask, torch.Tensor):
        raise NotSupportedError(
            "the fusedattn attention implementation got an attention mask of type %s; it takes "
            "the masks transformers makes for it (attn_implementation='fusedattn'), a 2-D "
            "padding mask or a 4-D boolean/additive mask" % type(mask).__name__)
    if mask.dim() == 4:
        bias = getattr(mask, "_fusedattn_bias", None)
        if bias is None:
            bias = additive_bias(mask, query, kv_length, torch)
            setattr(mask, "_fusedattn_bias", bias)
        return bias
    if mask.dim() != 2:
        raise InvalidArgumentError("attention mask has shape %s: 2-D [batch, seq_kv] padding "
                                   "or 4-D [batch, 1|heads, seq_q, seq_kv]" % list(mask.shape))
    # FlashAttention's reading: the mask's last column is the last query's key; keys past the
    # mask (a static cache's) are not real, and a longer mask keeps its last kv_length columns.
    padding = mask.to(torch.bool)
    if padding.shape[1] >= kv_length:
        padding = padding[:, padding.shape[1] - kv_length:]
        q_offset = kv_length - q_length
    else:
        q_offset = padding.shape[1] - q_length
        padding = torch.nn.functional.pad(padding, (0, kv_length - padding.shape[1]))
    pattern = _fa_pattern(module, is_causal, sliding_window)
    plan = _padded_plan(pattern, padding, q_offset, q_length, kv_length,
                        _can_read(query.device))
    setattr(mask, _PLAN, plan)  # the next layers take it from here
    return plan


def _varlen_kwargs(kwargs):
    if kwargs.get("cu_seq_lens_q") is None:  # the common call: one lookup
        return None
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    values = [kwargs.get(n) for n in names]
    return values if all(v is not None for v in values) else None


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention function for "fusedattn": query [batch, heads, seq_q, dim],
    key/value [batch, heads_kv, seq_kv, dim] and the layer's mask (see attention_mask);
    returns (output [batch, seq_q, heads, dim_v], None)."""
    # Every layer of every step comes here: the common call (a plan of our mask function, no
    # dropout, no FlashAttention varlen arguments) does a few lookups before the op.
    if kwargs.get("output_attentions", False):
        _warn_once("output_attentions", "the fusedattn attention implementation does not return "
                   "attention weights (output_attentions=True): use attn_implementation='eager' "
                   "for them")
    if kwargs.get("position_bias") is not None:
        raise NotSupportedError("the fusedattn attention implementation does not take "
                                "position_bias (T5-style relative attention bias); use "
                                "attn_implementation='sdpa' or 'eager' for this model")
    plan = getattr(attention_mask, _PLAN, None)
    if plan is None:
        if type(attention_mask).__name__ == "BlockMask":
            raise NotSupportedError("the fusedattn attention implementation got a "
                                    "flex_attention BlockMask: its masks come from its own mask "
                                    "function (attn_implementation='fusedattn' on the model)")
        plan = _plan_of(attention_mask, module, query, key, is_causal, sliding_window)
    batch, heads, q_length, _ = query.shape
    kv_length = key.shape[2]
    if isinstance(plan, Plan) and (plan.q_length != q_length or plan.kv_length != kv_length):
        raise InvalidArgumentError(
            "the attention mask was made for %d queries and %d keys but the layer has %d and %d"
            % (plan.q_length, plan.kv_length, q_length, kv_length))
    p = float(dropout) if dropout else 0.0
    seed = dropout_seed(p, _torch) if p else None
    sinks = s_aux
    softcap = float(softcap) if softcap else 0.0
    # [batch, seq, heads, dim] views of the [batch, heads, seq, dim] inputs: the output is then
    # allocated as [batch, seq_q, heads, dim_v], the layout the layer wants.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    varlen = _varlen_kwargs(kwargs)
    if not isinstance(plan, Plan):  # a 4-D mask: its bias
        return _torch.attention(
            q, k, v, "bshd", None, (-1, -1), plan, "post_scale", None, softcap, sinks, None, p,
            seed, scaling, None, None, None, None, None, None, False, "auto", False, None,
            None), None
    if plan.kind == "dense" and varlen is not None:
        return _flattened(q, k, v, plan, varlen, p, seed, scaling, softcap, sinks), None
    if plan.kind == "varlen":
        qt = q.reshape(batch * q_length, heads, q.shape[-1])
        kt = k.reshape(batch * kv_length, k.shape[2], k.shape[-1])
        vt = v.reshape(batch * kv_length, v.shape[2], v.shape[-1])
        out = _torch.attention(
            qt, kt, vt, "thd", plan.mask, plan.window, None, "post_scale", None, softcap, sinks,
            None, p, seed, scaling, plan.cu_seqlens_q, plan.cu_seqlens_kv, plan.seq_offsets_q,
            plan.seq_offsets_kv, plan.max_seqlen_q, plan.max_seqlen_kv, False, "auto", False,
            None, None)
        return out.view(batch, q_length, heads, out.shape[-1]), None
    if plan.kind == "flex" and plan.bias is None:
        if _score_mods_run(q, k, v, sinks, p, softcap, scaling, plan.score_mod):
            return _torch.attention(
                q, k, v, "bshd", None, (-1, -1), None, "post_scale", None, softcap, sinks, None,
                p, seed, scaling, None, None, None, None, None, None, False, "auto", False,
                plan.score_mod, None), None
        # No backend here runs score modifiers for this problem (float32 on CUDA): the same
        # mask, materialized, from now on for every layer of this plan.
        plan.bias = additive_bias(plan.visible(), query, kv_length, torch)
    return _torch.attention(
        q, k, v, "bshd", plan.mask, plan.window, plan.bias, "post_scale", None, softcap, sinks,
        None, p, seed, scaling, None, None, None, None, None, None, False, "auto", False, None,
        None), None


def _score_mods_run(q, k, v, sinks, dropout_p, softcap, scaling, score_mod):
    """Whether a backend runs this layer's flex plan (q, k, v: [batch, seq, heads, dim]) with
    its score modifier: the library's own backend selection, asked on the host before the call
    (nothing runs, nothing synchronizes). Asked, not learned from the call's NotSupportedError,
    because under torch.compile (transformers compiles generate's decoding steps with a static
    cache) the traced call runs nothing: the error would come from inside the compiled graph,
    past any fallback. While torch.compile traces, the answer becomes a constant of the graph.

    The question is the layer's problem at a nominal batch and sequence length: those are the
    sizes torch.compile may trace as symbolic (one graph for every length), and they decide
    only extreme cases (a CUDA grid or an int32 offset overflowing), where the call then raises
    the library's error. Heads and head dims are the layer's own (static in every model)."""
    training = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, sinks))
    return _score_mods_run_for(
        q.device.type, q.dtype, q.shape[2], k.shape[2], q.shape[3], v.shape[3], bool(training),
        float(dropout_p), float(softcap), sinks is not None,
        None if scaling is None else float(scaling), score_mod.text)


@torch.compiler.assume_constant_result
def _score_mods_run_for(device, dtype, heads_q, heads_kv, head_dim_qk, head_dim_v, training,
                        dropout_p, softcap, has_sinks, scale, graph_text):
    """_score_mods_run's answer from plain values (torch.compile calls it while tracing and
    keeps the result as a constant)."""
    return _score_mods_run_cached(device, dtype, heads_q, heads_kv, head_dim_qk, head_dim_v,
                                  training, dropout_p, softcap, has_sinks, scale, graph_text)


_NOMINAL_BATCH, _NOMINAL_LENGTH = 1, 128


@functools.lru_cache(maxsize=256)
def _score_mods_run_cached(device, dtype, heads_q, heads_kv, head_dim_qk, head_dim_v, training,
                           dropout_p, softcap, has_sinks, scale, graph_text):
    """The answer, once per distinct problem; warns (then, once per problem) that the mask runs
    materialized when it is no."""
    shape = (_NOMINAL_BATCH, _NOMINAL_LENGTH)
    config = _api.problem_config(
        shape + (heads_q, head_dim_qk), shape + (heads_kv, head_dim_qk),
        shape + (heads_kv, head_dim_v), training=training, dtype=str(dtype).replace("torch.", ""),
        device=device, layout="bshd", dropout_p=dropout_p, softcap=softcap,
        sinks=True if has_sinks else None, scale=scale)
    try:
        _C.get_backend(config, _C.ScoreModGraph.deserialize(graph_text))
    except NotSupportedError as error:
        warnings.warn(
            "fusedattn: this attention mask runs as a materialized [batch, 1, seq_q, seq_kv] "
            "mask on %s %s tensors, since no backend runs it as a score modifier there (%s)"
            % (device, dtype, error))
        return False
    return True


def _flattened(q, k, v, plan, varlen, p, seed, scaling, softcap, sinks):
    """FlashAttention's varlen keyword arguments: the batch's tokens as one packed sequence
    set (rows concatenated) with the given cu_seqlens and max lengths (ints, or tensors read
    once each)."""
    cu_q, cu_k, max_q, max_k = varlen
    batch, q_length, heads = q.shape[0], q.shape[1], q.shape[2]
    causal = plan.mask is not None and plan.mask.startswith("causal")
    out = _torch.attention(
        q.reshape(-1, heads, q.shape[-1]), k.reshape(-1, k.shape[2], k.shape[-1]),
        v.reshape(-1, v.shape[2], v.shape[-1]), "thd",
        "padding_causal_bottom_right" if causal else "padding", plan.window, None,
        "post_scale", None, softcap, sinks, None, p, seed, scaling, cu_q, cu_k, None, None,
        int(max_q), int(max_k), False, "auto", False, None, None)
    return out.view(batch, q_length, heads, out.shape[-1])


register()
