"""The problem a call describes: its options (checked, normalized), the dimensions read from the
tensors' shapes, the shapes of its outputs and the fusedattn_config (_C.Config) it becomes.

Enum names come from the extension (_C.Format, _C.Mask, ...), which mirrors fusedattn.h; nothing
here re-declares them. Framework-neutral: shapes are tuples, tensors are not touched.
"""

import operator
import random
from collections import namedtuple

from . import _C
from ._errors import InvalidArgumentError


def _names(enum_type):
    return tuple(enum_type.__members__)


LAYOUTS = _names(_C.Format)                                   # bshd, sbhd, bhsd, thd
MASKS = _names(_C.Mask)                                       # none, padding, causal, ...
BIAS_TYPES = tuple(n for n in _names(_C.Bias) if n in ("pre_scale", "post_scale"))
BACKENDS = _names(_C.Backend)                                 # auto, reference, cudnn, ...
DTYPES = ("float32", "float16", "bfloat16")                   # what q, k, v may hold
# attention()'s softmax names: the library's, and "sink" for learnable_sink.
SOFTMAXES = dict({n: n for n in _names(_C.Softmax)}, sink="learnable_sink")

_AXES = {"bshd": "[batch, seqlen, heads, head_dim]", "sbhd": "[seqlen, batch, heads, head_dim]",
         "bhsd": "[batch, heads, seqlen, head_dim]", "thd": "[tokens, heads, head_dim]"}
# (batch, seqlen, heads) axes of a 4-d tensor in each dense layout.
_BSH = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}


class DropoutPositions(namedtuple("DropoutPositions", [
        "batch_offset", "heads", "head_offset", "rows", "row_offset", "key_offset"],
        defaults=(0, 0, 0, 0, 0, 0))):
    """Where a call's elements sit in a larger problem, for the dropout mask only: the config
    fields dropout_batch_offset, dropout_heads, ... (fusedattn.h, "Dropout mask"). Element
    (b, h, i, j) of the call draws the bit of element (b + batch_offset, h + head_offset,
    i + row_offset, j + key_offset) of a problem of `heads` query heads (0: the call's heads_q)
    and max_seqlen_q `rows` (0: the call's). key_offset is a multiple of 4. All 0 (the default):
    the call is the whole problem. Context parallelism (fusedattn.distributed) sets them so that
    every block's call draws the single-device call's mask."""

    __slots__ = ()


DEFAULT_DROPOUT_POSITIONS = DropoutPositions()


def checked_dropout_positions(value):
    """A DropoutPositions from None (the default), a DropoutPositions or a dict of its fields.
    The values are checked by the library (INVALID_ARGUMENT naming the config field)."""
    if value is None:
        return DEFAULT_DROPOUT_POSITIONS
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(DropoutPositions._fields))
        if unknown:
            raise InvalidArgumentError("dropout_positions: unknown field(s) %s (fields: %s)"
                                       % (", ".join(unknown), ", ".join(DropoutPositions._fields)))
        value = DropoutPositions(**value)
    if not isinstance(value, DropoutPositions):
        raise InvalidArgumentError("dropout_positions = %r must be a fusedattn.DropoutPositions "
                                   "or a dict of its fields (%s)"
                                   % (value, ", ".join(DropoutPositions._fields)))
    ints = []
    for name, n in zip(DropoutPositions._fields, value):
        try:
            if isinstance(n, bool):
                raise TypeError
            ints.append(int(operator.index(n)))
        except TypeError:
            raise InvalidArgumentError("dropout_positions.%s = %r must be an int"
                                       % (name, n)) from None
    return DropoutPositions(*ints)


class Options(namedtuple("Options", [
        "layout", "mask", "window_left", "window_right", "bias_type", "softcap", "softmax",
        "dropout_p", "dropout_seed", "scale", "max_seqlen_q", "max_seqlen_kv", "deterministic",
        "backend", "dropout_positions"], defaults=(DEFAULT_DROPOUT_POSITIONS,))):
    """The scalar arguments of a problem, normalized: names checked, None replaced by the
    library's encoding (scale 0 = 1/sqrt(head_dim), max_seqlen 0 = from the shapes, window -1 =
    unbounded, dropout_positions the default DropoutPositions)."""


def _window(window):
    """(left, right) from a pair, an int (a symmetric window, as jax.nn's local_window_size
    takes it; under a causal mask only the left part matters) or None (unbounded)."""
    if window is None:
        return -1, -1
    if isinstance(window, bool):
        raise InvalidArgumentError("window = %r must be an int or a pair (left, right); -1 is "
                                   "unbounded" % (window,))
    if isinstance(window, int):
        return int(window), int(window)
    try:
        left, right = window
    except (TypeError, ValueError):
        raise InvalidArgumentError("window = %r must be an int or a pair (left, right); -1 is "
                                   "unbounded" % (window,)) from None
    return (-1 if left is None else int(left)), (-1 if right is None else int(right))


def normalize_options(layout="bshd", mask=None, window=(-1, -1), bias_type="post_scale",
                      has_bias=False, has_alibi=False, softcap=0.0, has_sinks=False, softmax=None,
                      dropout_p=0.0, dropout_seed=None, scale=None, max_seqlen_q=None,
                      max_seqlen_kv=None, deterministic=False, backend="auto",
                      dropout_positions=None):
    layout = str(layout).lower()
    if layout not in LAYOUTS:
        raise InvalidArgumentError("layout = %r is not one of %s" % (layout, ", ".join(LAYOUTS)))
    mask = "none" if mask is None else str(mask).lower()
    if mask not in MASKS:
        raise InvalidArgumentError("mask = %r is not one of None, %s" % (mask, ", ".join(MASKS)))
    window_left, window_right = _window(window)
    if has_alibi:
        if has_bias:
            raise InvalidArgumentError(
                "bias and alibi_slopes are both given: the library takes one bias "
                "(config.bias_type is pre_scale, post_scale or alibi)")
        bias_type = "alibi"
    elif has_bias:
        bias_type = str(bias_type).lower()
        if bias_type not in BIAS_TYPES:
            raise InvalidArgumentError("bias_type = %r is not one of %s"
                                       % (bias_type, ", ".join(BIAS_TYPES)))
    else:
        bias_type = "none"
    if softmax is None:
        softmax = "sink" if has_sinks else "vanilla"
    softmax_name = SOFTMAXES.get(str(softmax).lower())
    if softmax_name is None:
        raise InvalidArgumentError("softmax = %r is not one of vanilla, off_by_one, sink"
                                   % (softmax,))
    if softmax_name == "learnable_sink" and not has_sinks:
        raise InvalidArgumentError("softmax = %r needs sinks= (float32 [heads_q], the learnable "
                                   "sink logits)" % (softmax,))
    dropout_p = float(dropout_p)
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = random.getrandbits(63)
    backend = str(backend).lower()
    if backend not in BACKENDS:
        raise InvalidArgumentError("backend = %r is not one of %s" % (backend, ", ".join(BACKENDS)))
    return Options(layout, mask, window_left, window_right, bias_type, float(softcap),
                   softmax_name, dropout_p, int(dropout_seed or 0),
                   0.0 if scale is None else float(scale),
                   int(max_seqlen_q or 0), int(max_seqlen_kv or 0), bool(deterministic), backend,
                   checked_dropout_positions(dropout_positions))


# page_size: 0 for contiguous K/V, else the pages' length (paged K/V).
Dims = namedtuple("Dims", "batch max_seqlen_q max_seqlen_kv heads_q heads_kv head_dim_qk "
                          "head_dim_v page_size", defaults=(0,))


def pool_layout(layout):
    """The layout of the pages of a paged K/V cache: the layout's own axes for the dense
    layouts, "bshd" ([num_pages, page_size, heads_kv, head_dim]) for "thd"."""
    return "bshd" if layout == "thd" else layout


_POOL_AXES = {"bshd": "[num_pages, page_size, heads_kv, head_dim]",
              "sbhd": "[page_size, num_pages, heads_kv, head_dim]",
              "bhsd": "[num_pages, heads_kv, page_size, head_dim]"}


def problem_dims(layout, q_shape, k_shape, v_shape, batch=None, max_seqlen_q=0, max_seqlen_kv=0,
                 page_table_shape=None):
    """Dims from the tensors' shapes in a layout. THD takes batch (from cu_seqlens) and the
    max_seqlens from the caller. With page_table_shape, k and v are pools of pages (pool_layout)
    and max_seqlen_kv defaults to what the table holds."""
    q_shape, k_shape, v_shape = tuple(q_shape), tuple(k_shape), tuple(v_shape)
    rank = 3 if layout == "thd" else 4
    if page_table_shape is not None:
        return _paged_dims(layout, q_shape, k_shape, v_shape, batch, max_seqlen_q, max_seqlen_kv,
                           tuple(page_table_shape))
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(shape) != rank:
            raise InvalidArgumentError("%s has shape %s but layout %r needs %d dimensions %s"
                                       % (name, list(shape), layout, rank, _AXES[layout]))
    if layout == "thd":
        if batch is None:
            raise InvalidArgumentError("layout 'thd' needs cu_seqlens_q and cu_seqlens_kv "
                                       "(int32 [batch + 1])")
        if not max_seqlen_q or not max_seqlen_kv:
            raise InvalidArgumentError("layout 'thd' needs max_seqlen_q and max_seqlen_kv")
        return Dims(batch, max_seqlen_q, max_seqlen_kv, q_shape[1], k_shape[1], q_shape[2],
                    v_shape[2])
    b, s, h = _BSH[layout]
    for name, given, shape in (("max_seqlen_q", max_seqlen_q, q_shape),
                               ("max_seqlen_kv", max_seqlen_kv, k_shape)):
        if given and given != shape[s]:
            raise InvalidArgumentError("%s = %d but the tensor's seqlen axis (layout %r) is %d"
                                       % (name, given, layout, shape[s]))
    return Dims(q_shape[b], q_shape[s], k_shape[s], q_shape[h], k_shape[h], q_shape[3],
                v_shape[3])


def _paged_dims(layout, q_shape, k_shape, v_shape, batch, max_seqlen_q, max_seqlen_kv,
                page_table_shape):
    rank = 3 if layout == "thd" else 4
    if len(q_shape) != rank:
        raise InvalidArgumentError("q has shape %s but layout %r needs %d dimensions %s"
                                   % (list(q_shape), layout, rank, _AXES[layout]))
    pool = pool_layout(layout)
    for name, shape in (("k", k_shape), ("v", v_shape)):
        if len(shape) != 4:
            raise InvalidArgumentError(
                "%s has shape %s but with page_table it is a pool of pages, %s for layout %r"
                % (name, list(shape), _POOL_AXES[pool], layout))
    if len(page_table_shape) != 2:
        raise InvalidArgumentError("page_table has shape %s but [batch, max_pages_per_seq] is "
                                   "expected" % (list(page_table_shape),))
    _, token_axis, head_axis = _BSH[pool]  # a page is a "sequence" of page_size tokens
    page_size = k_shape[token_axis]
    if layout == "thd":
        if batch is None:
            raise InvalidArgumentError("layout 'thd' needs cu_seqlens_q (int32 [batch + 1])")
        if not max_seqlen_q:
            raise InvalidArgumentError("layout 'thd' needs max_seqlen_q")
        heads_q, head_dim_qk = q_shape[1], q_shape[2]
    else:
        b, s, h = _BSH[layout]
        if max_seqlen_q and max_seqlen_q != q_shape[s]:
            raise InvalidArgumentError("max_seqlen_q = %d but the tensor's seqlen axis (layout "
                                       "%r) is %d" % (max_seqlen_q, layout, q_shape[s]))
        batch, max_seqlen_q, heads_q, head_dim_qk = q_shape[b], q_shape[s], q_shape[h], q_shape[3]
    return Dims(batch, max_seqlen_q, max_seqlen_kv or page_table_shape[1] * page_size, heads_q,
                k_shape[head_axis], head_dim_qk, v_shape[3], page_size)


def output_shape(q_shape, v_shape):
    """o has q's shape with v's head_dim (every layout)."""
    return tuple(q_shape[:-1]) + (v_shape[-1],)


def lse_shape(layout, q_shape):
    """[batch, heads_q, max_seqlen_q], or [tokens, heads_q] (packed) for THD."""
    if layout == "thd":
        return (q_shape[0], q_shape[1])
    b, s, h = _BSH[layout]
    return (q_shape[b], q_shape[h], q_shape[s])


# ---------------------------------------------------------------------------------------------
# The config
# ---------------------------------------------------------------------------------------------

# Config fields that hold an enum, and the extension's enum type for each.
_ENUM_FIELDS = {
    "qkv_dtype": _C.Dtype, "o_dtype": _C.Dtype, "do_dtype": _C.Dtype, "dqkv_dtype": _C.Dtype,
    "q_format": _C.Format, "kv_format": _C.Format, "o_format": _C.Format,
    "do_format": _C.Format, "dqkv_format": _C.Format,
    "mask": _C.Mask, "bias_type": _C.Bias, "softmax_type": _C.Softmax,
    "backend": _C.Backend, "device": _C.Device,
}
_BOOL_FIELDS = ("is_training", "bias_requires_grad", "deterministic", "return_lse",
                "return_max_logit")


def make_config(**fields):
    """A fusedattn_config (_C.Config) from its fields by name, enums by name:
    make_config(batch=2, heads_q=8, heads_kv=8, max_seqlen_q=128, max_seqlen_kv=128,
                head_dim_qk=64, head_dim_v=64, qkv_dtype="bfloat16", mask="causal").
    Fields left out keep FUSEDATTN_CONFIG_INIT's values."""
    config = _C.Config()
    for name, value in fields.items():
        if name not in _C.Config.fields:
            raise InvalidArgumentError("config has no field %r (fields: %s)"
                                       % (name, ", ".join(_C.Config.fields)))
        if name in _ENUM_FIELDS:
            value = _enum(_ENUM_FIELDS[name], name, value)
        elif name in _BOOL_FIELDS:
            value = int(bool(value))
        setattr(config, name, value)
    return config


def config_dict(config):
    """The fields of a _C.Config as a dict, enums by name."""
    out = {}
    for name in _C.Config.fields:
        value = getattr(config, name)
        out[name] = value.name if name in _ENUM_FIELDS else value
    return out


def _enum(enum_type, field, value):
    if isinstance(value, enum_type):
        return value
    member = enum_type.__members__.get(value) if isinstance(value, str) else None
    if member is None:
        raise InvalidArgumentError("config.%s = %r is not one of %s"
                                   % (field, value, ", ".join(enum_type.__members__)))
    return member


def build_config(dims, options, dtype, device="auto", is_training=False, return_lse=False,
                 bias_shape=None, bias_requires_grad=False):
    """The _C.Config of a problem."""
    if dtype not in DTYPES:
        raise InvalidArgumentError("q has dtype %s: fusedattn computes on float32, float16 and "
                                   "bfloat16 tensors" % (dtype,))
    bias_batch = bias_heads = 1
    if bias_shape is not None:
        if len(bias_shape) != 4:
            raise InvalidArgumentError("bias has shape %s but [1|batch, 1|heads_q, max_seqlen_q, "
                                       "max_seqlen_kv] is expected" % (list(bias_shape),))
        bias_batch, bias_heads = int(bias_shape[0]), int(bias_shape[1])
    layout = options.layout
    return make_config(
        is_training=is_training, batch=int(dims.batch), heads_q=int(dims.heads_q),
        heads_kv=int(dims.heads_kv), max_seqlen_q=int(dims.max_seqlen_q),
        max_seqlen_kv=int(dims.max_seqlen_kv), head_dim_qk=int(dims.head_dim_qk),
        head_dim_v=int(dims.head_dim_v), qkv_dtype=dtype, o_dtype=dtype, q_format=layout,
        kv_format=pool_layout(layout) if dims.page_size else layout, o_format=layout,
        do_format=layout, dqkv_format=layout, page_size=int(dims.page_size),
        mask=options.mask, window_left=options.window_left, window_right=options.window_right,
        bias_type=options.bias_type, bias_batch=bias_batch, bias_heads=bias_heads,
        bias_requires_grad=bias_requires_grad, softmax_type=options.softmax,
        attn_scale=options.scale, softcap=options.softcap, dropout=options.dropout_p,
        deterministic=options.deterministic, return_lse=return_lse, backend=options.backend,
        device=device, **dropout_fields(options.dropout_positions))


def dropout_fields(positions):
    """The config fields (dropout_batch_offset=..., ...) of a DropoutPositions."""
    return {"dropout_" + name: int(n) for name, n in zip(DropoutPositions._fields, positions)}


def add_layout_hint(error, layout, q, k):
    """Adds a hint to an InvalidArgumentError raised for layout "bshd" (the default) when the
    tensors would make sense as [batch, heads, seq, dim], the layout of torch's
    scaled_dot_product_attention, which fusedattn calls "bhsd"."""
    q_shape, k_shape = tuple(getattr(q, "shape", ())), tuple(getattr(k, "shape", ()))
    if layout != "bshd" or len(q_shape) != 4 or len(k_shape) != 4:
        return
    # Read as bhsd: batch [0], heads [1], head_dim [3]; GQA needs heads_kv to divide heads_q.
    if q_shape[0] == k_shape[0] and q_shape[3] == k_shape[3] and k_shape[1] and \
            q_shape[1] % k_shape[1] == 0:
        error.args = (str(error) + " (layout is 'bshd', [batch, seq, heads, dim], by default; if "
                      "these are [batch, heads, seq, dim] tensors as torch's "
                      "scaled_dot_product_attention takes them, pass layout='bhsd')",
                      ) + error.args[1:]


def checked_max_length(name, shortest, longest):
    """The longest sequence, given the shortest and longest step of a cu_seqlens tensor
    (cu[b + 1] - cu[b]); a negative step means the cumulative lengths decrease, said in those
    terms (the library would only see odd lengths, or a negative max_seqlen)."""
    if shortest < 0:
        raise InvalidArgumentError("%s decreases somewhere: cumulative lengths are "
                                   "non-decreasing, [0, len_0, len_0 + len_1, ...]" % name)
    return longest
