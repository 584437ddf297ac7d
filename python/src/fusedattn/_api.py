"""The public functions: attention, attention_backward, explain, backends, and the low-level
forward / backward on preallocated DLPack tensors.

attention() sends torch tensors to the torch operators (_torch.py) and NumPy arrays to the CPU
reference backend through the extension (_run.py). Problem options are checked in _problem.py.
"""

import sys

from . import _C
from . import _flex
from ._errors import InvalidArgumentError, NotSupportedError
from ._problem import (add_layout_hint, build_config, config_dict, make_config,  # noqa: F401
                       normalize_options, problem_dims)
from ._run import (Gradients, Inputs, NumpyArrays, check_writable, exported, numpy_inputs,
                   paged_tensors, refuse_paged_backward, run_backward, run_forward)

# fusedattn._torch, once a torch tensor has been seen (or torch was imported before fusedattn).
_torch_path = [None]


def _torch_for(x):
    """fusedattn._torch when x is a torch.Tensor, else None. torch itself is never imported
    here: a torch tensor exists only where the caller imported torch."""
    path = _torch_path[0]
    if path is None:
        if "torch" not in sys.modules:
            return None
        from . import _torch as path
        _torch_path[0] = path
    return path if isinstance(x, path.torch.Tensor) else None


def _numpy_or_refuse(x, what):
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
              score_mod=None, mask_mod=None, page_table=None, seqlens_kv=None,
              dropout_positions=None):
    """Scaled dot-product attention, o = softmax(scale * q k^T + bias) v, as specified in
    include/fusedattn/fusedattn.h.

    layout: "bshd" (the default, as FlashAttention: q [batch, seqlen_q, heads_q, head_dim]),
    "sbhd", "bhsd" (as torch's scaled_dot_product_attention: [batch, heads, seqlen, head_dim])
    or "thd" ([tokens, heads, head_dim], packed variable length with cu_seqlens_q/kv). Give the
    layout explicitly when your tensors come from SDPA code: a [batch, heads, seq, dim] tensor
    read as bshd is a different (valid-looking) problem. k, v: heads_kv dividing heads_q.

    mask: None, "causal" (top-left), "causal_bottom_right", "padding", "padding_causal",
    "padding_causal_bottom_right" (padding masks take the lengths from cu_seqlens_q/kv).
    window: (left, right), -1 unbounded; an int w is (w, w). bias: [1|b, 1|h, sq, skv] added
    before ("pre_scale") or after ("post_scale") the scale and softcap. alibi_slopes: float32
    [heads_q]. sinks: float32 [heads_q] learnable sink logits (softmax "sink"); softmax
    "off_by_one" adds a zero logit. dropout_p with dropout_seed (random when None);
    dropout_positions: a DropoutPositions (or a dict of its fields) that places the call in a
    larger problem whose dropout mask it draws (context parallelism; default: the call's own
    positions; the reference backend runs it, the GPU backends refuse it for now). scale:
    default 1/sqrt(head_dim). cu_seqlens_q/kv, seq_offsets_q/kv: int32 [batch + 1] (int64 and
    lists are converted). backend: "auto" or a backend's name (see fusedattn.backends()).

    NumPy arrays run on the CPU (the reference backend) and return NumPy arrays; torch tensors
    run where they live (CPU: reference; CUDA: cuDNN, flash or small_seq, whichever is fastest
    and runs the problem), on the current CUDA stream, with autograd (q, k, v, bias, sinks and
    score_mod tensors), torch.compile and CUDA-graph support. Returns o, or (o, lse) with
    return_lse (lse: float32 [batch, heads_q, seqlen_q], or [tokens, heads_q] for "thd"; not
    differentiable).

    score_mod / mask_mod: fusedattn.flex expressions that modify the final score and hide keys
    (True = visible, ANDed with mask), e.g. score_mod=30 * flex.tanh(flex.score / 30),
    mask_mod=flex.q_idx >= flex.kv_idx; or a flex.ScoreMod as score_mod. They run on the
    reference, cuDNN and flash backends, with autograd and under torch.compile.

    page_table, seqlens_kv: paged K/V (a serving engine's KV cache; forward only). k and v are
    then pools of pages, [num_pages, page_size, heads_kv, head_dim] for "bshd" and "thd" queries
    (vLLM's and FlashAttention's layout), [num_pages, heads_kv, page_size, head_dim] for "bhsd",
    [page_size, num_pages, heads_kv, head_dim] for "sbhd" (other strides are fine: a pool kept
    as [num_pages, heads_kv, page_size, head_dim] goes to "bshd" as pool.transpose(1, 2));
    page_table int32 [batch, max_pages_per_seq] (key j of sequence b is token j % page_size of
    page page_table[b, j // page_size]; entries past a sequence's keys are never read) and
    seqlens_kv int32 [batch] (each sequence's number of keys). Queries are dense (decode:
    seqlen_q = 1) or "thd" with cu_seqlens_q (chunked prefill: the new tokens of each sequence,
    the last ones of its seqlens_kv keys, with mask="causal_bottom_right"); cu_seqlens_kv is not
    taken. max_seqlen_kv defaults to max_pages_per_seq * page_size. Page indices are checked
    against the pool (the reference backend refuses a bad one, naming it).
    """
    torch_path = _torch_for(q)
    if torch_path is not None:
        return torch_path.attention(
            q, k, v, layout, mask, window, bias, bias_type, alibi_slopes, softcap, sinks,
            softmax, dropout_p, dropout_seed, scale, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
            seq_offsets_kv, max_seqlen_q, max_seqlen_kv, deterministic, backend, return_lse,
            score_mod, mask_mod, page_table=page_table, seqlens_kv=seqlens_kv,
            dropout_positions=dropout_positions)
    arrays = _numpy_or_refuse(q, "attention")
    options, inputs = _problem(dict(
        layout=layout, mask=mask, window=window, bias=bias, bias_type=bias_type,
        alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, softmax=softmax,
        dropout_p=dropout_p, dropout_seed=dropout_seed, scale=scale, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_seqlens_kv, seq_offsets_q=seq_offsets_q, seq_offsets_kv=seq_offsets_kv,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, deterministic=deterministic,
        backend=backend, page_table=page_table, seqlens_kv=seqlens_kv,
        dropout_positions=dropout_positions))
    mod = _flex.as_score_mod(score_mod, mask_mod)
    try:
        o, lse = run_forward(arrays, q, k, v, options, numpy_inputs(inputs),
                             return_lse=return_lse, score_mod=mod)
    except InvalidArgumentError as error:
        add_layout_hint(error, layout, q, k)
        raise
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
    mod = _flex.as_score_mod(score_mod, mask_mod)
    options, inputs = _problem(problem)
    refuse_paged_backward(inputs)
    if options.dropout_p > 0 and problem.get("dropout_seed") is None:
        raise InvalidArgumentError("attention_backward with dropout_p > 0 needs the forward's "
                                   "dropout_seed")
    if bias_requires_grad is None:
        bias_requires_grad = inputs.bias is not None
    torch_path = _torch_for(q)
    if torch_path is not None:
        return torch_path.attention_backward(d_o, q, k, v, o, lse, options, inputs,
                                             bias_requires_grad, mod)
    arrays = _numpy_or_refuse(q, "attention_backward")
    return run_backward(arrays, d_o, q, k, v, o, lse, options, numpy_inputs(inputs),
                        bias_requires_grad, score_mod=mod)


_PROBLEM_ARGS = ("layout", "mask", "window", "bias", "bias_type", "alibi_slopes", "softcap",
                 "sinks", "softmax", "dropout_p", "dropout_seed", "scale", "cu_seqlens_q",
                 "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv", "max_seqlen_q",
                 "max_seqlen_kv", "deterministic", "backend", "page_table", "seqlens_kv",
                 "dropout_positions")


def _problem(args):
    """(Options, Inputs) from attention()'s problem arguments by name."""
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
        deterministic=get("deterministic", False), backend=get("backend", "auto"),
        dropout_positions=get("dropout_positions"))
    inputs = Inputs(get("bias"), get("alibi_slopes"), get("sinks"), get("cu_seqlens_q"),
                    get("cu_seqlens_kv"), get("seq_offsets_q"), get("seq_offsets_kv"),
                    get("page_table"), get("seqlens_kv"))
    return options, inputs


# ---------------------------------------------------------------------------------------------
# The low-level calls on preallocated tensors of any DLPack framework
# ---------------------------------------------------------------------------------------------


def forward(config, *, q, k, v, o, lse=None, max_logit=None, bias=None, alibi_slopes=None,
            sink_logits=None, cu_seqlens_q=None, cu_seqlens_kv=None, seq_offsets_q=None,
            seq_offsets_kv=None, dropout_seed=0, dropout_offset=0, workspace=None, stream=None,
            page_table=None, seqlens_kv=None, fp8=None):
    """The C API's fusedattn_fwd on preallocated DLPack tensors (any framework). config: a
    _C.Config or a dict of its fields (see make_config). workspace: a tensor of at least
    fwd_workspace_size(config) bytes on the tensors' device (allocated here, with the
    framework of q, when None and needed). stream: a cudaStream_t as an int (torch's current
    stream for torch tensors when None, else the default stream). page_table, seqlens_kv:
    paged K/V (config page_size > 0; see fusedattn.h, "Paged K/V"). fp8: FP8 attention's
    per-tensor scaling (config qkv_dtype "fp8_e4m3"; see fusedattn.h, "FP8 attention"): a dict of
    float32 one-element tensors on the tensors' device, descale_q, descale_k, descale_v,
    descale_s, scale_s, scale_o (O in FP8 only) and the outputs amax_s, amax_o. FP8 tensors are
    torch.float8_e4m3fn / float8_e5m2 tensors, or (uint8 view, "fp8_e4m3" / "fp8_e5m2") pairs."""
    config = make_config(**config) if isinstance(config, dict) else config
    for name, out in (("o", o), ("lse", lse), ("max_logit", max_logit)):
        check_writable(name, out)
    tensors = dict(q=q, k=k, v=v, o=o, lse=lse, max_logit=max_logit, bias=bias,
                   alibi_slopes=alibi_slopes, sink_logits=sink_logits, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_kv=cu_seqlens_kv, seq_offsets_q=seq_offsets_q,
                   seq_offsets_kv=seq_offsets_kv, page_table=page_table, seqlens_kv=seqlens_kv)
    tensors.update(_fp8_tensors(fp8, _FP8_FWD, ("amax_s", "amax_o")))
    workspace, stream = _low_level_resources(config, q, workspace, stream, _C.fwd_workspace_size)
    _C.fwd(config, exported(tensors), dropout_seed=dropout_seed, dropout_offset=dropout_offset,
           workspace=workspace, stream=stream)


def backward(config, *, q, k, v, o, lse, d_o, dq, dk, dv, dbias=None, dsink=None, bias=None,
             alibi_slopes=None, sink_logits=None, cu_seqlens_q=None, cu_seqlens_kv=None,
             seq_offsets_q=None, seq_offsets_kv=None, dropout_seed=0, dropout_offset=0,
             workspace=None, stream=None, fp8=None):
    """The C API's fusedattn_bwd on preallocated DLPack tensors; see forward(). fp8: descale_q,
    descale_k, descale_v, descale_o (O in FP8 only), descale_do, descale_s, descale_dp, scale_s,
    scale_dp, scale_dq, scale_dk, scale_dv (FP8 gradients only) and the outputs amax_dp, amax_dq,
    amax_dk, amax_dv."""
    config = make_config(**config) if isinstance(config, dict) else config
    for name, out in (("dq", dq), ("dk", dk), ("dv", dv), ("dbias", dbias), ("dsink", dsink)):
        check_writable(name, out)
    tensors = dict(q=q, k=k, v=v, o=o, lse=lse, d_o=d_o, dq=dq, dk=dk, dv=dv, dbias=dbias,
                   dsink=dsink, bias=bias, alibi_slopes=alibi_slopes, sink_logits=sink_logits,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                   seq_offsets_q=seq_offsets_q, seq_offsets_kv=seq_offsets_kv)
    tensors.update(_fp8_tensors(fp8, _FP8_BWD, ("amax_dp", "amax_dq", "amax_dk", "amax_dv")))
    workspace, stream = _low_level_resources(config, q, workspace, stream, _C.bwd_workspace_size)
    _C.bwd(config, exported(tensors), dropout_seed=dropout_seed, dropout_offset=dropout_offset,
           workspace=workspace, stream=stream)


_FP8_FWD = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o", "amax_s",
            "amax_o")
_FP8_BWD = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_do", "descale_s",
            "descale_dp", "scale_s", "scale_dp", "scale_dq", "scale_dk", "scale_dv", "amax_dp",
            "amax_dq", "amax_dk", "amax_dv")


def _fp8_tensors(fp8, known, outputs):
    """The FP8 scaling tensors of a call (names checked here; presence, dtype and values by the
    library, which names what is missing or wrong)."""
    if fp8 is None:
        return {}
    unknown = sorted(set(fp8) - set(known))
    if unknown:
        raise InvalidArgumentError("fp8: unknown scaling tensor(s) %s (known: %s)"
                                   % (", ".join(unknown), ", ".join(known)))
    for name in outputs:
        check_writable(name, fp8.get(name))
    return {name: t for name, t in fp8.items() if t is not None}


def workspace_size(config, backward=False):
    """Bytes of workspace fusedattn.forward (or backward) needs for config (a _C.Config or a
    dict of fields) on the device config.device names (auto: CUDA when present)."""
    config = make_config(**config) if isinstance(config, dict) else config
    return (_C.bwd_workspace_size if backward else _C.fwd_workspace_size)(config)


def _low_level_resources(config, q, workspace, stream, workspace_size_of):
    torch_path = _torch_for(q)
    if stream is None:
        stream = torch_path.current_stream(q) if torch_path is not None else 0
    if workspace is None:
        if config.device == _C.Device.auto:  # the workspace size depends on the backend
            device = torch_path.device_name(q) if torch_path is not None else "cpu"
            config = make_config(**dict(config_dict(config), device=device))
        nbytes = workspace_size_of(config)
        if nbytes:
            if torch_path is not None:
                workspace = torch_path.empty_bytes(nbytes, q)
            else:
                import numpy as np
                if not isinstance(q, np.ndarray):
                    raise InvalidArgumentError(
                        "this problem needs a workspace of %d bytes: pass workspace= (a tensor "
                        "of that many bytes on the tensors' device)" % nbytes)
                workspace = np.empty((nbytes,), dtype=np.uint8)
    return workspace, stream


# ---------------------------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------------------------


def explain(q, k, v, *, dtype=None, device=None, batch=None, score_mod=None, mask_mod=None,
            **problem):
    """Which backend runs this problem and why the ones before it refused, for the forward
    alone and for forward + backward (training). q, k, v: tensors, or their shapes (then give
    dtype, default "bfloat16", and device, default "auto"); bias likewise may be a shape, and
    for "thd" give cu_seqlens_q or batch; alibi_slopes and sinks may be True; page_table may be
    a shape too (seqlens_kv is not needed). Takes attention()'s other arguments. Raises
    InvalidArgumentError when the problem itself is wrong. Paged K/V has no backward: its
    second line says so."""
    configs = _configs(q, k, v, dtype, device, batch, problem)
    mod = _flex.as_score_mod(score_mod, mask_mod)
    graph = mod.graph if mod is not None else None
    lines = []
    for label, config in zip(("forward", "forward+backward"), configs):
        if config is None:
            lines.append("%s: none: paged K/V is forward only (a serving cache has no "
                         "backward)" % label)
            continue
        try:
            _, diagnostic = _C.get_backend(config, graph)
        except NotSupportedError as e:
            diagnostic = str(e)
        lines.append("%s: %s" % (label, diagnostic))
    return "\n".join(lines)


def problem_config(q, k, v, *, training=False, dtype=None, device=None, batch=None, **problem):
    """The _C.Config that backend selection sees for a problem given as explain() takes it, for
    the forward alone or, with training=True, forward and backward (None for paged K/V, which
    has no backward); `_C.get_backend(config, graph)` then names the backend (or raises
    NotSupportedError with every backend's reason). Nothing runs on a device."""
    return _configs(q, k, v, dtype, device, batch, problem)[1 if training else 0]


def _configs(q, k, v, dtype, device, batch, problem):
    """(forward config, forward + backward config or None for paged K/V) of explain()'s
    arguments."""
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
        max_q = _max_length_of(inputs.cu_seqlens_q, "cu_seqlens_q")
    if options.layout == "thd" and hasattr(inputs.cu_seqlens_kv, "shape") and not max_kv:
        max_kv = _max_length_of(inputs.cu_seqlens_kv, "cu_seqlens_kv")
    table = None if inputs.page_table is None else _shape_of(inputs.page_table)
    dims = problem_dims(options.layout, _shape_of(q), _shape_of(k), _shape_of(v), batch,
                        max_q, max_kv, table)
    bias_shape = None if inputs.bias is None else _shape_of(inputs.bias)
    return tuple(None if training and dims.page_size else
                 build_config(dims, options, dtype, device, training, False, bias_shape,
                              training and bias_shape is not None)
                 for training in (False, True))


def _shape_of(x):
    return tuple(int(n) for n in (x.shape if hasattr(x, "shape") else x))


def _max_length_of(cu_seqlens, name):
    torch_path = _torch_for(cu_seqlens)
    if torch_path is not None:
        return torch_path.max_length(cu_seqlens, name)
    return NumpyArrays.max_length(cu_seqlens, name)


def _dtype_name_of(x):
    torch_path = _torch_for(x)
    if torch_path is not None:
        return torch_path.dtype_name(x)
    return getattr(x.dtype, "name", str(x.dtype))


def _device_name_of(x):
    torch_path = _torch_for(x)
    if torch_path is not None:
        return torch_path.device_name(x)
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
