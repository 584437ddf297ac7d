"""The framework-neutral part of the package: problem arguments to a fusedattn_config, output
shapes, and forward/backward runs whose outputs are allocated by the caller's framework.

A framework is a small adapter (`Arrays` below: NumPy here, PyTorch in _torch.py) with four
functions: the dtype name of a tensor, an allocator, the device name and the CUDA stream.
"""

import functools
import random
from collections import namedtuple

from . import _C
from . import _flex
from ._errors import InvalidArgumentError, NotSupportedError

LAYOUTS = ("bshd", "sbhd", "bhsd", "thd")
MASKS = ("none", "padding", "causal", "causal_bottom_right", "padding_causal",
         "padding_causal_bottom_right")
BIAS_TYPES = ("pre_scale", "post_scale")
# User-facing softmax names -> fusedattn_softmax names.
SOFTMAXES = {"vanilla": "vanilla", "off_by_one": "off_by_one", "sink": "learnable_sink",
             "learnable_sink": "learnable_sink"}
BACKENDS = ("auto", "reference", "cudnn", "flash", "small_seq")
DTYPES = ("float32", "float16", "bfloat16")

# Config fields that hold an enum, and the extension's enum type for each.
_ENUM_FIELDS = {
    "qkv_dtype": _C.Dtype, "o_dtype": _C.Dtype,
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
    member = getattr(enum_type, str(value), None) if isinstance(value, str) else None
    if not isinstance(member, enum_type):
        names = [n for n in dir(enum_type) if isinstance(getattr(enum_type, n), enum_type)]
        raise InvalidArgumentError("config.%s = %r is not one of %s" % (field, value, ", ".join(names)))
    return member


# ---------------------------------------------------------------------------------------------
# Problem arguments
# ---------------------------------------------------------------------------------------------

class Options(namedtuple("Options", [
        "layout", "mask", "window_left", "window_right", "bias_type", "softcap", "softmax",
        "dropout_p", "dropout_seed", "scale", "max_seqlen_q", "max_seqlen_kv", "deterministic",
        "backend"])):
    """The scalar arguments of a problem, normalized: strings checked, None replaced by the
    library's encoding (scale 0 = 1/sqrt(head_dim), max_seqlen 0 = from the shapes, window -1 =
    unbounded). The order is the order of the torch ops' scalar arguments."""


def normalize_options(layout="bshd", mask=None, window=(-1, -1), bias_type="post_scale",
                      has_bias=False, has_alibi=False, softcap=0.0, has_sinks=False, softmax=None,
                      dropout_p=0.0, dropout_seed=None, scale=None, max_seqlen_q=None,
                      max_seqlen_kv=None, deterministic=False, backend="auto"):
    layout = str(layout).lower()
    if layout not in LAYOUTS:
        raise InvalidArgumentError("layout = %r is not one of %s" % (layout, ", ".join(LAYOUTS)))
    mask = "none" if mask is None else str(mask).lower()
    if mask not in MASKS:
        raise InvalidArgumentError("mask = %r is not one of None, %s" % (mask, ", ".join(MASKS)))
    if window is None:
        window = (-1, -1)
    if len(window) != 2:
        raise InvalidArgumentError("window = %r must be a pair (left, right); -1 is unbounded"
                                   % (window,))
    window_left = -1 if window[0] is None else int(window[0])
    window_right = -1 if window[1] is None else int(window[1])
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
    dropout_p = float(dropout_p)
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = random.getrandbits(63)
    backend = str(backend).lower()
    if backend not in BACKENDS:
        raise InvalidArgumentError("backend = %r is not one of %s" % (backend, ", ".join(BACKENDS)))
    return Options(layout, mask, window_left, window_right, bias_type, float(softcap),
                   softmax_name, dropout_p, int(dropout_seed or 0),
                   0.0 if scale is None else float(scale),
                   int(max_seqlen_q or 0), int(max_seqlen_kv or 0), bool(deterministic), backend)


Dims = namedtuple("Dims", "batch max_seqlen_q max_seqlen_kv heads_q heads_kv head_dim_qk head_dim_v")


def problem_dims(layout, q_shape, k_shape, v_shape, batch=None, max_seqlen_q=0, max_seqlen_kv=0):
    """Dims from the tensors' shapes in a layout. THD takes batch (from cu_seqlens) and the
    max_seqlens from the caller."""
    q_shape, k_shape, v_shape = tuple(q_shape), tuple(k_shape), tuple(v_shape)
    rank = 3 if layout == "thd" else 4
    axes = {"bshd": "[batch, seqlen, heads, head_dim]", "sbhd": "[seqlen, batch, heads, head_dim]",
            "bhsd": "[batch, heads, seqlen, head_dim]", "thd": "[tokens, heads, head_dim]"}[layout]
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(shape) != rank:
            raise InvalidArgumentError("%s has shape %s but layout %r needs %d dimensions %s"
                                       % (name, list(shape), layout, rank, axes))
    if layout == "thd":
        if batch is None:
            raise InvalidArgumentError("layout 'thd' needs cu_seqlens_q and cu_seqlens_kv "
                                       "(int32 [batch + 1])")
        if not max_seqlen_q or not max_seqlen_kv:
            raise InvalidArgumentError("layout 'thd' needs max_seqlen_q and max_seqlen_kv")
        return Dims(batch, max_seqlen_q, max_seqlen_kv, q_shape[1], k_shape[1], q_shape[2],
                    v_shape[2])
    b, s, h = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}[layout]
    for name, given, shape in (("max_seqlen_q", max_seqlen_q, q_shape),
                               ("max_seqlen_kv", max_seqlen_kv, k_shape)):
        if given and given != shape[s]:
            raise InvalidArgumentError("%s = %d but the tensor's seqlen axis (layout %r) is %d"
                                       % (name, given, layout, shape[s]))
    return Dims(q_shape[b], q_shape[s], k_shape[s], q_shape[h], k_shape[h], q_shape[3],
                v_shape[3])


def output_shape(q_shape, v_shape):
    """o has q's shape with v's head_dim (every layout)."""
    return tuple(q_shape[:-1]) + (v_shape[-1],)


def lse_shape(layout, q_shape):
    """[batch, heads_q, max_seqlen_q], or [tokens, heads_q] (packed) for THD."""
    if layout == "thd":
        return (q_shape[0], q_shape[1])
    b, s, h = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}[layout]
    return (q_shape[b], q_shape[h], q_shape[s])


def build_config(dims, options, dtype, device="auto", is_training=False, return_lse=False,
                 bias_shape=None, bias_requires_grad=False):
    """The _C.Config of a problem (cached: the same problem gets the same object; never change
    it)."""
    return _build_config(Dims(*(int(x) for x in dims)), options, dtype, device,
                         bool(is_training), bool(return_lse),
                         None if bias_shape is None else tuple(int(x) for x in bias_shape),
                         bool(bias_requires_grad))


@functools.lru_cache(maxsize=1024)
def _build_config(dims, options, dtype, device, is_training, return_lse, bias_shape,
                  bias_requires_grad):
    if dtype not in DTYPES:
        raise InvalidArgumentError("q has dtype %s: fusedattn computes on float32, float16 and "
                                   "bfloat16 tensors" % (dtype,))
    bias_batch = bias_heads = 1
    if bias_shape is not None:
        if len(bias_shape) != 4:
            raise InvalidArgumentError("bias has shape %s but [1|batch, 1|heads_q, max_seqlen_q, "
                                       "max_seqlen_kv] is expected" % (list(bias_shape),))
        bias_batch, bias_heads = bias_shape[0], bias_shape[1]
    layout = options.layout
    return make_config(
        is_training=is_training, batch=dims.batch, heads_q=dims.heads_q, heads_kv=dims.heads_kv,
        max_seqlen_q=dims.max_seqlen_q, max_seqlen_kv=dims.max_seqlen_kv,
        head_dim_qk=dims.head_dim_qk, head_dim_v=dims.head_dim_v, qkv_dtype=dtype, o_dtype=dtype,
        q_format=layout, kv_format=layout, o_format=layout, do_format=layout, dqkv_format=layout,
        mask=options.mask, window_left=options.window_left, window_right=options.window_right,
        bias_type=options.bias_type, bias_batch=bias_batch, bias_heads=bias_heads,
        bias_requires_grad=bias_requires_grad, softmax_type=options.softmax,
        attn_scale=options.scale, softcap=options.softcap, dropout=options.dropout_p,
        deterministic=options.deterministic, return_lse=return_lse, backend=options.backend,
        device=device)


# ---------------------------------------------------------------------------------------------
# Runs, for any framework adapter
# ---------------------------------------------------------------------------------------------

Inputs = namedtuple("Inputs", "bias alibi_slopes sink_logits cu_seqlens_q cu_seqlens_kv "
                              "seq_offsets_q seq_offsets_kv")


def _dims_of(arrays, q, k, v, options, inputs):
    batch = None
    if inputs.cu_seqlens_q is not None:
        batch = inputs.cu_seqlens_q.shape[0] - 1
    max_q, max_kv = options.max_seqlen_q, options.max_seqlen_kv
    if options.layout == "thd" and batch is not None and (not max_q or not max_kv):
        # Reads cu_seqlens on the host: a device synchronization for GPU tensors.
        if not max_q:
            max_q = arrays.max_length(inputs.cu_seqlens_q)
        if not max_kv and inputs.cu_seqlens_kv is not None:
            max_kv = arrays.max_length(inputs.cu_seqlens_kv)
    return problem_dims(options.layout, q.shape, k.shape, v.shape, batch, max_q, max_kv)


def _tensors(inputs):
    return {"bias": inputs.bias, "alibi_slopes": inputs.alibi_slopes,
            "sink_logits": inputs.sink_logits, "cu_seqlens_q": inputs.cu_seqlens_q,
            "cu_seqlens_kv": inputs.cu_seqlens_kv, "seq_offsets_q": inputs.seq_offsets_q,
            "seq_offsets_kv": inputs.seq_offsets_kv}


def _exported(tensors):
    """tensors for _C.fwd / _C.bwd:
    * torch tensors become DLPack capsules through torch.utils.dlpack.to_dlpack: no stream
      synchronization and no device check (Tensor.__dlpack__ may do both, and costs tens of
      microseconds a tensor), safe under CUDA-graph capture; the op runs on the stream given;
    * NumPy bfloat16 arrays (ml_dtypes) become (uint16 view, "bfloat16"), since NumPy exports no
      bfloat16 through DLPack or the buffer protocol;
    * anything else goes as is, through its __dlpack__."""
    def export(t):
        module = type(t).__module__
        if module == "torch" or module.startswith("torch."):
            import torch.utils.dlpack
            # A score_mod tensor that requires grad (autograd.Function path) exports as data.
            return torch.utils.dlpack.to_dlpack(t.detach() if t.requires_grad else t)
        if module == "numpy" and getattr(t.dtype, "name", None) == "bfloat16":
            import numpy as np
            return (t.view(np.uint16), "bfloat16")
        return t

    out = {}
    for name, t in tensors.items():
        if isinstance(t, list):  # the score_mod tensors
            out[name] = [None if x is None else export(x) for x in t]
        else:
            out[name] = export(t)
    return out


def _workspace(arrays, nbytes, like):
    return arrays.empty((nbytes,), "uint8", like) if nbytes else None


def run_forward(arrays, q, k, v, options, inputs, is_training=False, return_lse=False,
                bias_requires_grad=False, score_mod=None):
    """Allocates o (and lse when is_training or return_lse) with `arrays` and runs the forward.
    score_mod: a fusedattn.flex.ScoreMod or None. Returns (o, lse or None)."""
    dims = _dims_of(arrays, q, k, v, options, inputs)
    bias_shape = None if inputs.bias is None else tuple(inputs.bias.shape)
    config = build_config(dims, options, arrays.dtype_name(q), arrays.device(q), is_training,
                          return_lse, bias_shape, bias_requires_grad)
    # THD leaves tokens outside every sequence untouched: zero them rather than leave garbage.
    thd = options.layout == "thd"
    o = arrays.empty(output_shape(q.shape, v.shape), arrays.dtype_name(q), q, zero=thd)
    lse = None
    if is_training or return_lse:
        lse = arrays.empty(lse_shape(options.layout, q.shape), "float32", q, zero=thd)
    graph = score_mod.graph if score_mod is not None else None
    workspace = _workspace(arrays, _C.fwd_workspace_size(config, graph), q)
    tensors = dict(q=q, k=k, v=v, o=o, lse=lse, **_tensors(inputs))
    if score_mod is not None:
        tensors["score_mod_tensors"] = score_mod.tensors()
    _C.fwd(config, _exported(tensors), dropout_seed=options.dropout_seed, workspace=workspace,
           stream=arrays.stream(q), score_mod=graph)
    return o, lse


class Gradients(namedtuple("Gradients", "dq dk dv dbias dsink")):
    """dq, dk, dv, dbias and dsink (None when not computed); dscore_mod: the gradients of the
    score_mod tensors that require one, {tensor name: array} (summed over the reads of a tensor
    indexed in several ways)."""

    dscore_mod = {}


def run_backward(arrays, d_o, q, k, v, o, lse, options, inputs, bias_requires_grad=False,
                 score_mod=None):
    """Allocates dq, dk, dv (dbias when bias_requires_grad, dsink for the sink softmax, the
    gradients of score_mod tensors that require one) with `arrays` and runs the backward.
    Returns Gradients (absent ones None)."""
    dims = _dims_of(arrays, q, k, v, options, inputs)
    bias_requires_grad = bool(bias_requires_grad and inputs.bias is not None)
    bias_shape = None if inputs.bias is None else tuple(inputs.bias.shape)
    config = build_config(dims, options, arrays.dtype_name(q), arrays.device(q), True, False,
                          bias_shape, bias_requires_grad)
    thd = options.layout == "thd"
    dtype = arrays.dtype_name(q)
    dq = arrays.empty(tuple(q.shape), dtype, q, zero=thd)
    dk = arrays.empty(tuple(k.shape), dtype, q, zero=thd)
    dv = arrays.empty(tuple(v.shape), dtype, q, zero=thd)
    dbias = None
    if bias_requires_grad:
        dbias = arrays.empty(tuple(inputs.bias.shape), arrays.dtype_name(inputs.bias), q)
    dsink = None
    if options.softmax == "learnable_sink":
        dsink = arrays.empty((dims.heads_q,), "float32", q)
    graph = score_mod.graph if score_mod is not None else None
    workspace = _workspace(arrays, _C.bwd_workspace_size(config, graph), q)
    tensors = dict(q=q, k=k, v=v, o=o, lse=lse, d_o=d_o, dq=dq, dk=dk, dv=dv, dbias=dbias,
                   dsink=dsink, **_tensors(inputs))
    slot_grads = []
    if score_mod is not None:
        tensors["score_mod_tensors"] = score_mod.tensors()
        for tensor, _ in score_mod.slots:
            slot_grads.append(arrays.empty(tuple(tensor.array.shape),
                                           arrays.dtype_name(tensor.array), q)
                              if tensor.requires_grad else None)
        tensors["d_score_mod_tensors"] = slot_grads
    _C.bwd(config, _exported(tensors), dropout_seed=options.dropout_seed, workspace=workspace,
           stream=arrays.stream(q), score_mod=graph)
    grads = Gradients(dq, dk, dv, dbias, dsink)
    if score_mod is not None:
        grads.dscore_mod = {}
        for (tensor, _), grad in zip(score_mod.slots, slot_grads):
            if grad is None:
                continue
            if tensor.name in grads.dscore_mod:
                grads.dscore_mod[tensor.name] = grads.dscore_mod[tensor.name] + grad
            else:
                grads.dscore_mod[tensor.name] = grad
    return grads


class NumpyArrays:
    """NumPy: CPU tensors, outputs as NumPy arrays (bfloat16 through ml_dtypes)."""

    @staticmethod
    def dtype_name(a):
        return a.dtype.name

    @staticmethod
    def empty(shape, dtype_name, like, zero=False):
        import numpy as np
        if dtype_name == "bfloat16":
            import ml_dtypes
            dtype = ml_dtypes.bfloat16
        else:
            dtype = np.dtype(dtype_name)
        # Zeros always: a CPU memset is cheap next to the reference backend's work.
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def device(a):
        return "cpu"

    @staticmethod
    def stream(a):
        return 0

    @staticmethod
    def max_length(cu_seqlens):
        import numpy as np
        cu = np.asarray(cu_seqlens)
        return int(np.max(cu[1:] - cu[:-1])) if cu.shape[0] > 1 else 0


# ---------------------------------------------------------------------------------------------
# The public functions
# ---------------------------------------------------------------------------------------------

_torch_impl = None


def _torch_module_if_tensor(x):
    """fusedattn._torch when x is a torch.Tensor (torch is only imported if the caller has)."""
    global _torch_impl
    if _torch_impl is not None:
        return _torch_impl if isinstance(x, _torch_impl.torch.Tensor) else None
    import sys
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    from . import _torch
    _torch_impl = _torch
    return _torch


def _arrays_for(x, what):
    torch_impl = _torch_module_if_tensor(x)
    if torch_impl is not None:
        return torch_impl.TorchArrays
    import numpy as np
    if isinstance(x, np.ndarray):
        return NumpyArrays
    raise TypeError(
        "fusedattn.%s takes NumPy arrays or torch tensors (got %s); for other DLPack frameworks "
        "call fusedattn.forward / fusedattn.backward with preallocated outputs"
        % (what, type(x).__module__ + "." + type(x).__name__))


def attention(q, k, v, *, layout="bshd", mask=None, window=(-1, -1), bias=None,
              bias_type="post_scale", alibi_slopes=None, softcap=0.0, sinks=None, softmax=None,
              dropout_p=0.0, dropout_seed=None, scale=None, cu_seqlens_q=None,
              cu_seqlens_kv=None, seq_offsets_q=None, seq_offsets_kv=None, max_seqlen_q=None,
              max_seqlen_kv=None, deterministic=False, backend="auto", return_lse=False,
              score_mod=None, mask_mod=None):
    """Scaled dot-product attention, o = softmax(scale * q k^T + bias) v, as specified in
    include/fusedattn/fusedattn.h.

    q: [batch, seqlen_q, heads_q, head_dim] for layout "bshd" (the default, as FlashAttention);
    "sbhd", "bhsd" (as torch's scaled_dot_product_attention) and "thd" ([tokens, heads, dim],
    packed variable length with cu_seqlens_q/kv) also work. k, v: heads_kv dividing heads_q.

    mask: None, "causal" (top-left), "causal_bottom_right", "padding", "padding_causal",
    "padding_causal_bottom_right" (padding masks take the lengths from cu_seqlens_q/kv).
    window: (left, right), -1 unbounded. bias: [1|b, 1|h, sq, skv] added before ("pre_scale")
    or after ("post_scale") the scale and softcap. alibi_slopes: float32 [heads_q]. sinks:
    float32 [heads_q] learnable sink logits (softmax "sink"); softmax "off_by_one" adds a zero
    logit. dropout_p with dropout_seed (random when None). scale: default 1/sqrt(head_dim).
    backend: "auto" or a backend's name (see fusedattn.backends()).

    NumPy arrays run on the CPU (the reference backend) and return NumPy arrays; torch tensors
    run where they live, on the current CUDA stream, with autograd (q, k, v, bias, sinks) and
    torch.compile support. Returns o, or (o, lse) with return_lse (lse: float32
    [batch, heads_q, seqlen_q], or [tokens, heads_q] for "thd"; not differentiable).

    score_mod / mask_mod: fusedattn.flex expressions that modify the final score and hide keys
    (True = visible, ANDed with mask), e.g.
    score_mod=30 * flex.tanh(flex.score / 30), mask_mod=flex.q_idx >= flex.kv_idx; or a
    flex.ScoreMod as score_mod. They run on the reference backend (NumPy, or forced) and on
    cuDNN (CUDA torch tensors); with torch tensors, autograd differentiates q, k, v, bias, sinks
    and the score_mod tensors that require grad (not under torch.compile: a graph break).
    """
    args = dict(layout=layout, mask=mask, window=window, bias=bias, bias_type=bias_type,
                alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, softmax=softmax,
                dropout_p=dropout_p, dropout_seed=dropout_seed, scale=scale,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                seq_offsets_q=seq_offsets_q, seq_offsets_kv=seq_offsets_kv,
                max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                deterministic=deterministic, backend=backend, return_lse=return_lse)
    torch_impl = _torch_module_if_tensor(q)
    if torch_impl is not None:
        if score_mod is not None or mask_mod is not None:
            options, inputs = _problem(args)
            return torch_impl.attention_with_score_mod(
                q, k, v, options, inputs, _flex.as_score_mod(score_mod, mask_mod), return_lse)
        return torch_impl.attention(q, k, v, **args)
    arrays = _arrays_for(q, "attention")
    options, inputs = _problem(args)
    mod = _flex.as_score_mod(score_mod, mask_mod)
    o, lse = run_forward(arrays, q, k, v, options, inputs, return_lse=return_lse, score_mod=mod)
    return (o, lse) if return_lse else o


def attention_backward(d_o, q, k, v, o, lse, *, bias_requires_grad=None, score_mod=None,
                       mask_mod=None, **problem):
    """The backward of attention() without autograd: gradients of a loss with respect to q, k,
    v (and the bias, sinks and score_mod tensors) given d_o = dLoss/do, the forward's o and its
    lse (from attention(..., return_lse=True)). Takes the forward's problem arguments (layout,
    mask, bias, sinks, dropout_seed, score_mod, ...). bias_requires_grad defaults to True when a
    bias is given. Returns Gradients(dq, dk, dv, dbias, dsink); dbias and dsink are None when
    not computed; Gradients.dscore_mod maps the names of score_mod tensors with requires_grad to
    their gradients."""
    problem.pop("return_lse", None)
    arrays = _arrays_for(q, "attention_backward")
    mod = _flex.as_score_mod(score_mod, mask_mod)
    options, inputs = _problem(problem)
    if options.dropout_p > 0 and problem.get("dropout_seed") is None:
        raise InvalidArgumentError("attention_backward with dropout_p > 0 needs the forward's "
                                   "dropout_seed")
    if bias_requires_grad is None:
        bias_requires_grad = inputs.bias is not None
    return run_backward(arrays, d_o, q, k, v, o, lse, options, inputs, bias_requires_grad,
                        score_mod=mod)


_PROBLEM_ARGS = ("layout", "mask", "window", "bias", "bias_type", "alibi_slopes", "softcap",
                 "sinks", "softmax", "dropout_p", "dropout_seed", "scale", "cu_seqlens_q",
                 "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv", "max_seqlen_q",
                 "max_seqlen_kv", "deterministic", "backend", "return_lse")


def _problem(args):
    unknown = set(args) - set(_PROBLEM_ARGS)
    if unknown:
        raise TypeError("unexpected argument(s): %s" % ", ".join(sorted(unknown)))
    get = args.get
    options = normalize_options(
        layout=get("layout", "bshd"), mask=get("mask"), window=get("window", (-1, -1)),
        bias_type=get("bias_type", "post_scale"), has_bias=get("bias") is not None,
        has_alibi=get("alibi_slopes") is not None, softcap=get("softcap", 0.0),
        has_sinks=get("sinks") is not None, softmax=get("softmax"),
        dropout_p=get("dropout_p", 0.0), dropout_seed=get("dropout_seed"), scale=get("scale"),
        max_seqlen_q=get("max_seqlen_q"), max_seqlen_kv=get("max_seqlen_kv"),
        deterministic=get("deterministic", False), backend=get("backend", "auto"))
    inputs = Inputs(get("bias"), get("alibi_slopes"), get("sinks"), get("cu_seqlens_q"),
                    get("cu_seqlens_kv"), get("seq_offsets_q"), get("seq_offsets_kv"))
    return options, inputs


def forward(config, *, q, k, v, o, lse=None, max_logit=None, bias=None, alibi_slopes=None,
            sink_logits=None, cu_seqlens_q=None, cu_seqlens_kv=None, seq_offsets_q=None,
            seq_offsets_kv=None, dropout_seed=0, dropout_offset=0, workspace=None, stream=None):
    """The C API's fusedattn_fwd on preallocated DLPack tensors (any framework). config: a
    _C.Config or a dict of its fields (see make_config). workspace: a tensor of at least
    fwd_workspace_size(config) bytes on the tensors' device (allocated here, with the
    framework of q, when None and needed). stream: a cudaStream_t as an int (torch's current
    stream for torch tensors when None, else the default stream)."""
    config = make_config(**config) if isinstance(config, dict) else config
    tensors = dict(q=q, k=k, v=v, o=o, lse=lse, max_logit=max_logit, bias=bias,
                   alibi_slopes=alibi_slopes, sink_logits=sink_logits, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_kv=cu_seqlens_kv, seq_offsets_q=seq_offsets_q,
                   seq_offsets_kv=seq_offsets_kv)
    workspace, stream = _low_level_resources(config, q, workspace, stream, _C.fwd_workspace_size)
    _C.fwd(config, _exported(tensors), dropout_seed=dropout_seed, dropout_offset=dropout_offset,
           workspace=workspace, stream=stream)


def backward(config, *, q, k, v, o, lse, d_o, dq, dk, dv, dbias=None, dsink=None, bias=None,
             alibi_slopes=None, sink_logits=None, cu_seqlens_q=None, cu_seqlens_kv=None,
             seq_offsets_q=None, seq_offsets_kv=None, dropout_seed=0, dropout_offset=0,
             workspace=None, stream=None):
    """The C API's fusedattn_bwd on preallocated DLPack tensors; see forward()."""
    config = make_config(**config) if isinstance(config, dict) else config
    tensors = dict(q=q, k=k, v=v, o=o, lse=lse, d_o=d_o, dq=dq, dk=dk, dv=dv, dbias=dbias,
                   dsink=dsink, bias=bias, alibi_slopes=alibi_slopes, sink_logits=sink_logits,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                   seq_offsets_q=seq_offsets_q, seq_offsets_kv=seq_offsets_kv)
    workspace, stream = _low_level_resources(config, q, workspace, stream, _C.bwd_workspace_size)
    _C.bwd(config, _exported(tensors), dropout_seed=dropout_seed, dropout_offset=dropout_offset,
           workspace=workspace, stream=stream)


def workspace_size(config, backward=False):
    """Bytes of workspace fusedattn.forward (or backward) needs for config (a _C.Config or a
    dict of fields) on the device config.device names (auto: CUDA when present)."""
    config = make_config(**config) if isinstance(config, dict) else config
    return (_C.bwd_workspace_size if backward else _C.fwd_workspace_size)(config)


def _low_level_resources(config, q, workspace, stream, workspace_size):
    torch_impl = _torch_module_if_tensor(q)
    if stream is None:
        stream = torch_impl.TorchArrays.stream(q) if torch_impl is not None else 0
    if workspace is None:
        config = _config_on_device_of(config, q, torch_impl)
        nbytes = workspace_size(config)
        if nbytes:
            if torch_impl is not None:
                workspace = torch_impl.TorchArrays.empty((nbytes,), "uint8", q)
            else:
                import numpy as np
                if not isinstance(q, np.ndarray):
                    raise InvalidArgumentError(
                        "this problem needs a workspace of %d bytes: pass workspace= (a tensor "
                        "of that many bytes on the tensors' device)" % nbytes)
                workspace = np.empty((nbytes,), dtype=np.uint8)
    return workspace, stream


def _config_on_device_of(config, q, torch_impl):
    """A copy of config whose device is q's (the workspace size depends on the backend)."""
    if config.device != _C.Device.auto:
        return config
    device = torch_impl.TorchArrays.device(q) if torch_impl is not None else "cpu"
    return make_config(**dict(config_dict(config), device=device))


def explain(q, k, v, *, dtype=None, device=None, batch=None, score_mod=None, mask_mod=None,
            **problem):
    """Which backend runs this problem and why the ones before it refused, for the forward
    alone and for forward + backward (training). q, k, v: tensors, or their shapes (then give
    dtype, default "bfloat16", and device, default "auto"); bias likewise may be a shape, and
    for "thd" give cu_seqlens_q or batch; alibi_slopes and sinks may be True. Takes attention()'s other arguments. Raises
    InvalidArgumentError when the problem itself is wrong."""
    problem.pop("return_lse", None)
    options, inputs = _problem(problem)
    if dtype is None:
        dtype = _dtype_name_of(q) if hasattr(q, "dtype") else "bfloat16"
    if device is None:
        device = _device_name_of(q) if hasattr(q, "shape") else "auto"
    if batch is None and inputs.cu_seqlens_q is not None:
        batch = _shape_of(inputs.cu_seqlens_q)[0] - 1
    max_q, max_kv = options.max_seqlen_q, options.max_seqlen_kv
    if options.layout == "thd" and hasattr(inputs.cu_seqlens_q, "shape") and not max_q:
        max_q = _arrays_for(inputs.cu_seqlens_q, "explain").max_length(inputs.cu_seqlens_q)
    if options.layout == "thd" and hasattr(inputs.cu_seqlens_kv, "shape") and not max_kv:
        max_kv = _arrays_for(inputs.cu_seqlens_kv, "explain").max_length(inputs.cu_seqlens_kv)
    dims = problem_dims(options.layout, _shape_of(q), _shape_of(k), _shape_of(v), batch,
                        max_q, max_kv)
    bias_shape = None if inputs.bias is None else _shape_of(inputs.bias)
    mod = _flex.as_score_mod(score_mod, mask_mod)
    graph = mod.graph if mod is not None else None
    lines = []
    for label, training in (("forward", False), ("forward+backward", True)):
        config = build_config(dims, options, dtype, device, training, False, bias_shape,
                              training and bias_shape is not None)
        try:
            _, diagnostic = _C.get_backend(config, graph)
        except NotSupportedError as e:
            diagnostic = str(e)
        lines.append("%s: %s" % (label, diagnostic))
    return "\n".join(lines)


def _shape_of(x):
    return tuple(int(n) for n in (x.shape if hasattr(x, "shape") else x))


def _dtype_name_of(x):
    torch_impl = _torch_module_if_tensor(x)
    if torch_impl is not None:
        return torch_impl.TorchArrays.dtype_name(x)
    return getattr(x.dtype, "name", str(x.dtype))


def _device_name_of(x):
    torch_impl = _torch_module_if_tensor(x)
    if torch_impl is not None:
        return torch_impl.TorchArrays.device(x)
    return "cpu"


def backends():
    """{backend name: "available" or why not} for every backend of the library."""
    out = {}
    for name in _C.backend_names():
        if name == "auto":
            continue
        available, message = _C.backend_available(name)
        out[name] = "available" if available else message
    return out


def version():
    """The library's version string (fusedattn_version_string)."""
    return _C.version()


def cudnn_version():
    """The cuDNN version the library runs against (cudnnGetVersion), 0 if built without it."""
    return _C.cudnn_version()
