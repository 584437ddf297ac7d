"""The PyTorch path: two custom ops, fusedattn::fwd and fusedattn::bwd (torch.library), with
fake implementations (torch.compile traces them without graph breaks) and autograd.

Imported only when the caller passes a torch tensor (or imports it), so `import fusedattn` works
without torch. Inside the ops nothing synchronizes with the device and every buffer (outputs and
the library's workspace) comes from torch's allocator, on torch's current stream: a warm op can
be captured in a CUDA graph.
"""

import contextlib
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _api

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16",
                torch.bfloat16: "bfloat16", torch.int32: "int32", torch.uint8: "uint8"}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


class TorchArrays:
    """The framework adapter of _api.run_forward / run_backward for torch tensors."""

    @staticmethod
    def dtype_name(t):
        return _DTYPE_NAMES.get(t.dtype, str(t.dtype).replace("torch.", ""))

    @staticmethod
    def empty(shape, dtype_name, like, zero=False):
        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=_DTYPES[dtype_name], device=like.device)

    @staticmethod
    def device(t):
        return "cuda" if t.is_cuda else "cpu"

    @staticmethod
    def stream(t):
        return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0

    @staticmethod
    def max_length(cu_seqlens):
        # A host read: synchronizes with the device for CUDA tensors.
        if cu_seqlens.shape[0] < 2:
            return 0
        return int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item())


def _on_device_of(t):
    """Makes t's GPU the current one (the library runs on the current device)."""
    if t.is_cuda and t.device.index is not None and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


# The ops take the problem's scalars as one string and a list of ints (see encode_problem): torch's
# custom-op autograd wrapper costs time quadratic in the number of schema arguments, so few
# arguments keep the per-call overhead small. The ints (max_seqlen_q, max_seqlen_kv,
# dropout_seed) stay ints so that they may be symbolic under torch.compile.
def encode_problem(options, is_training, return_lse, bias_requires_grad):
    """(problem string, ints) of the ops from _api.Options and the call's flags."""
    flags = "".join("1" if x else "0" for x in (options.deterministic, is_training, return_lse,
                                                  bias_requires_grad))
    problem = "|".join((options.layout, options.mask, str(options.window_left),
                        str(options.window_right), options.bias_type, repr(options.softcap),
                        options.softmax, repr(options.dropout_p), repr(options.scale),
                        options.backend, flags))
    return problem, [options.max_seqlen_q, options.max_seqlen_kv, options.dropout_seed]


def decode_problem(problem, ints):
    """(_api.Options, is_training, return_lse, bias_requires_grad) from the ops' arguments."""
    (layout, mask, window_left, window_right, bias_type, softcap, softmax, dropout_p, scale,
     backend, flags) = problem.split("|")
    deterministic, is_training, return_lse, bias_requires_grad = (c == "1" for c in flags)
    max_seqlen_q, max_seqlen_kv, dropout_seed = (int(x) for x in ints)
    options = _api.Options(layout, mask, int(window_left), int(window_right), bias_type,
                           float(softcap), softmax, float(dropout_p), dropout_seed, float(scale),
                           max_seqlen_q, max_seqlen_kv, deterministic, backend)
    return options, is_training, return_lse, bias_requires_grad


@torch.library.custom_op("fusedattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], alibi_slopes: Optional[Tensor],
        sinks: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
        seq_offsets_q: Optional[Tensor], seq_offsets_kv: Optional[Tensor], problem: str,
        ints: List[int]) -> Tuple[Tensor, Tensor]:
    """(o, lse); lse is empty unless the problem's flags ask for it (training or return_lse)."""
    options, is_training, return_lse, bias_requires_grad = decode_problem(problem, ints)
    inputs = _api.Inputs(bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
                         seq_offsets_kv)
    with _on_device_of(q):
        o, lse = _api.run_forward(TorchArrays, q, k, v, options, inputs, is_training, return_lse,
                                  bias_requires_grad)
    if lse is None:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


@fwd.register_fake
def _fwd_fake(q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
              seq_offsets_kv, problem, ints):
    layout = problem.split("|", 1)[0]
    _, is_training, return_lse, _ = decode_problem(problem, [0, 0, 0])
    o = q.new_empty(_api.output_shape(q.shape, v.shape))
    if is_training or return_lse:
        lse = q.new_empty(_api.lse_shape(layout, q.shape), dtype=torch.float32)
    else:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


@torch.library.custom_op("fusedattn::bwd", mutates_args=())
def bwd(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
        bias: Optional[Tensor], alibi_slopes: Optional[Tensor], sinks: Optional[Tensor],
        cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
        seq_offsets_q: Optional[Tensor], seq_offsets_kv: Optional[Tensor], problem: str,
        ints: List[int]) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dbias, dsink); dbias is empty unless the flags ask for it, dsink unless the
    softmax has a learnable sink."""
    options, _, _, bias_requires_grad = decode_problem(problem, ints)
    inputs = _api.Inputs(bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
                         seq_offsets_kv)
    with _on_device_of(q):
        grads = _api.run_backward(TorchArrays, d_o, q, k, v, o, lse, options, inputs,
                                  bias_requires_grad)
    empty = q.new_empty((0,), dtype=torch.float32)
    return (grads.dq, grads.dk, grads.dv,
            grads.dbias if grads.dbias is not None else empty,
            grads.dsink if grads.dsink is not None else empty.clone())


@bwd.register_fake
def _bwd_fake(d_o, q, k, v, o, lse, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv,
              seq_offsets_q, seq_offsets_kv, problem, ints):
    options, _, _, bias_requires_grad = decode_problem(problem, [0, 0, 0])
    dq = q.new_empty(q.shape)
    dk = k.new_empty(k.shape)
    dv = v.new_empty(v.shape)
    if bias_requires_grad and bias is not None:
        dbias = bias.new_empty(bias.shape)
    else:
        dbias = q.new_empty((0,), dtype=torch.float32)
    if options.softmax == "learnable_sink":
        dsink = q.new_empty((q.shape[-2],), dtype=torch.float32)
    else:
        dsink = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dbias, dsink


def _setup_context(ctx, inputs, output):
    q, k, v, bias, alibi_slopes, sinks, cu_q, cu_kv, off_q, off_kv, problem, ints = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, bias, alibi_slopes, sinks, cu_q, cu_kv, off_q, off_kv)
    ctx.problem, ctx.ints = problem, ints


def _backward(ctx, grad_o, grad_lse):
    # lse is returned detached by attention(): grad_lse is never a real gradient.
    q, k, v, o, lse, bias, alibi_slopes, sinks, cu_q, cu_kv, off_q, off_kv = ctx.saved_tensors
    flags = ctx.problem.rsplit("|", 1)[1]
    is_training, bias_requires_grad = flags[1] == "1", flags[3] == "1"
    if not is_training:
        raise RuntimeError("fusedattn: the forward ran with is_training=False (no LSE saved) but "
                           "a gradient was asked for")
    # Autograd may hand over an expanded gradient (o.sum() gives stride 0 everywhere); the GPU
    # backends read dO like O, so give them a dense one.
    if not grad_o.is_contiguous():
        grad_o = grad_o.contiguous()
    dq, dk, dv, dbias, dsink = bwd(grad_o, q, k, v, o, lse, bias, alibi_slopes, sinks, cu_q,
                                   cu_kv, off_q, off_kv, ctx.problem, ctx.ints)
    return (dq, dk, dv, dbias if bias_requires_grad else None, None,
            dsink if sinks is not None else None, None, None, None, None, None, None)


fwd.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, *, layout="bshd", mask=None, window=(-1, -1), bias=None,
              bias_type="post_scale", alibi_slopes=None, softcap=0.0, sinks=None, softmax=None,
              dropout_p=0.0, dropout_seed=None, scale=None, cu_seqlens_q=None,
              cu_seqlens_kv=None, seq_offsets_q=None, seq_offsets_kv=None, max_seqlen_q=None,
              max_seqlen_kv=None, deterministic=False, backend="auto", return_lse=False):
    """fusedattn.attention for torch tensors (see there). Under torch.compile or CUDA-graph
    capture give max_seqlen_q/kv for "thd" (else cu_seqlens are read on the host) and a
    dropout_seed when dropout_p > 0."""
    options = _api.normalize_options(
        layout=layout, mask=mask, window=window, bias_type=bias_type, has_bias=bias is not None,
        has_alibi=alibi_slopes is not None, softcap=softcap, has_sinks=sinks is not None,
        softmax=softmax, dropout_p=dropout_p, dropout_seed=dropout_seed, scale=scale,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, deterministic=deterministic,
        backend=backend)
    if options.layout == "thd" and cu_seqlens_q is not None:
        if not options.max_seqlen_q or not options.max_seqlen_kv:
            options = options._replace(
                max_seqlen_q=options.max_seqlen_q or TorchArrays.max_length(cu_seqlens_q),
                max_seqlen_kv=options.max_seqlen_kv or (
                    TorchArrays.max_length(cu_seqlens_kv) if cu_seqlens_kv is not None else 0))
    # The library takes float32 slopes and sinks and int32 index tensors; these casts are
    # differentiable, so a bf16 sink parameter gets its gradient in bf16.
    if sinks is not None and sinks.dtype != torch.float32:
        sinks = sinks.float()
    if alibi_slopes is not None and alibi_slopes.dtype != torch.float32:
        alibi_slopes = alibi_slopes.float()
    cu_seqlens_q = _int32(cu_seqlens_q)
    cu_seqlens_kv = _int32(cu_seqlens_kv)
    seq_offsets_q = _int32(seq_offsets_q)
    seq_offsets_kv = _int32(seq_offsets_kv)
    grad = torch.is_grad_enabled()
    bias_requires_grad = grad and bias is not None and bias.requires_grad
    is_training = grad and (q.requires_grad or k.requires_grad or v.requires_grad
                            or bias_requires_grad or (sinks is not None and sinks.requires_grad))
    problem, ints = encode_problem(options, is_training, return_lse, bias_requires_grad)
    o, lse = fwd(q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
                 seq_offsets_kv, problem, ints)
    if return_lse:
        return o, lse.detach()
    return o


def _int32(t):
    if t is None or t.dtype == torch.int32:
        return t
    return t.to(torch.int32)


class _ScoreModAttention(torch.autograd.Function):
    """Attention with a score modifier under autograd. The modifier's graph and tensors are not
    op arguments of fusedattn::fwd/bwd (a graph is no schema type), so this is an
    autograd.Function around _api.run_forward / run_backward. Differentiable inputs: q, k, v,
    bias, sinks and the modifier's tensors (their gradients come back by name)."""

    @staticmethod
    def forward(ctx, setup, q, k, v, bias, sinks, *mod_tensors):
        options, inputs, mod = setup
        bias_requires_grad = ctx.needs_input_grad[4]
        o, lse = _api.run_forward(TorchArrays, q, k, v, options, inputs, is_training=True,
                                  bias_requires_grad=bias_requires_grad, score_mod=mod)
        ctx.setup = setup
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, _d_lse):
        options, inputs, mod = ctx.setup
        q, k, v, o, lse = ctx.saved_tensors
        grads = _api.run_backward(TorchArrays, d_o.contiguous(), q, k, v, o, lse, options, inputs,
                                  bias_requires_grad=ctx.needs_input_grad[4], score_mod=mod)
        mod_grads = [grads.dscore_mod.get(t.name) if needed else None
                     for t, needed in zip(_unique_tensors(mod), ctx.needs_input_grad[6:])]
        dbias = grads.dbias if ctx.needs_input_grad[4] else None
        dsink = grads.dsink if ctx.needs_input_grad[5] else None
        return (None, grads.dq, grads.dk, grads.dv, dbias, dsink, *mod_grads)


def _unique_tensors(mod):
    """The modifier's flex.Tensors, each once, in declaration order."""
    seen, out = set(), []
    for tensor, _ in mod.slots:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out.append(tensor)
    return out


def attention_with_score_mod(q, k, v, options, inputs, mod, return_lse):
    """fusedattn.attention with a score_mod / mask_mod (a flex.ScoreMod) on torch tensors."""
    tensors = _unique_tensors(mod)
    for t in tensors:
        if t.requires_grad and not t.array.requires_grad:
            t.array.requires_grad_()  # the flex.Tensor asks for its gradient
    differentiable = [q, k, v, inputs.bias, inputs.sink_logits] + [t.array for t in tensors]
    training = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in differentiable)
    if training:
        o, lse = _ScoreModAttention.apply((options, inputs, mod), q, k, v, inputs.bias,
                                          inputs.sink_logits, *[t.array for t in tensors])
    else:
        o, lse = _api.run_forward(TorchArrays, q, k, v, options, inputs, return_lse=return_lse,
                                  score_mod=mod)
    return (o, lse) if return_lse else o
