"""The PyTorch path: the operators fusedattn::fwd and fusedattn::bwd, registered from C++
(python/src/torch_ops.cpp: CPU and CUDA kernels over the C API, autograd in C++), their fake
(shape) functions for torch.compile, and attention() for torch tensors.

A warm call costs what a PyTorch operator costs: the Python side below only turns the keyword
arguments into the op's problem string (once per distinct set of options, then a dictionary
lookup) and calls the op; allocation, the library call and the backward are C++. Nothing
synchronizes with the device and every buffer comes from torch's allocator on the current
stream, so a warm call can be captured in a CUDA graph. Score modifiers take the same op (their
graph travels as text), so torch.compile traces them without a graph break.

The operator library is built with the package when torch is present at build time
(`pip install --no-build-isolation .`); otherwise it is compiled here on first use, once per
torch version, into the user's cache directory (a C++ compiler is needed then).

Imported only when the caller passes a torch tensor (or had imported torch before fusedattn),
so `import fusedattn` works without torch.
"""

import os
import random
import sys
import warnings

import torch

from . import _C, _flex, _problem
from ._cache import cache_root as _cache_root
from ._errors import InvalidArgumentError
from ._run import INDEX_SHAPES, Gradients, gradients_by_name, refuse_paged_backward

_HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------
# Loading the operators
# ---------------------------------------------------------------------------------------------


def _prebuilt():
    """The operator library built with the package, when it was built against this torch."""
    path = os.path.join(_HERE, "_torch_ops.so")
    stamp = os.path.join(_HERE, "_torch_ops.torch_version")
    if not (os.path.exists(path) and os.path.exists(stamp)):
        return None, "not built with the package (torch was not importable at build time)"
    with open(stamp) as f:
        built_for = f.read().strip()
    if built_for != torch.__version__:
        return None, "built for torch %s, but torch %s is running" % (built_for, torch.__version__)
    return path, None


def _compile_operators(why):
    """Compiles python/src/torch_ops.cpp (shipped in _csrc/) against the running torch into the
    cache directory and loads it. cpp_extension serializes concurrent builds with a lock file."""
    from torch.utils import cpp_extension
    source = os.path.join(_HERE, "_csrc", "torch_ops.cpp")
    library = [os.path.join(_HERE, f) for f in sorted(os.listdir(_HERE))
               if f.startswith("libfusedattn.so")]
    if not os.path.exists(source) or not library:
        raise ImportError("fusedattn's PyTorch operators are %s, and their source is not in the "
                          "package to compile them: reinstall fusedattn with "
                          "`pip install --no-build-isolation .` where torch is installed" % why)
    tag = "%s-torch%s-py%d%d" % (_C.version(), torch.__version__, sys.version_info[0],
                                 sys.version_info[1])
    build = os.path.join(_cache_root(), "torch_ops", "".join(
        c if c.isalnum() or c in ".-_" else "_" for c in tag))
    os.makedirs(build, exist_ok=True)
    if not os.path.exists(os.path.join(build, "fusedattn_torch_ops.so")):
        warnings.warn("fusedattn: the PyTorch operators are %s; compiling them once for torch %s "
                      "into %s (about a minute)" % (why, torch.__version__, build))
    try:
        return cpp_extension.load(
            name="fusedattn_torch_ops", sources=[source],
            extra_include_paths=[os.path.join(_HERE, "_csrc")],
            extra_ldflags=[library[0], "-Wl,-rpath," + _HERE], extra_cflags=["-O2"],
            is_python_module=True, build_directory=build, verbose=False)
    except Exception as error:
        raise ImportError("fusedattn's PyTorch operators are %s, and compiling them failed (%s); "
                          "reinstall fusedattn with `pip install --no-build-isolation .` where "
                          "torch is installed" % (why, error)) from error


def _load_operators():
    """The operator library as a Python module (importing it registers the operators)."""
    path, why = _prebuilt()
    if path is not None:
        import importlib
        return importlib.import_module(__package__ + "._torch_ops")
    return _compile_operators(why)


_OPS = _load_operators()
# Through the dispatcher's Python binding: what torch.compile traces, and what tensor subclasses
# and __torch_function__ modes see.
_FWD = torch.ops.fusedattn.fwd.default
_BWD = torch.ops.fusedattn.bwd.default
# The same dispatcher calls from C++ without torch.ops' argument parsing: for plain tensors.
_FAST_FWD = _OPS.fwd
_FAST_BWD = _OPS.bwd
_has_torch_function = torch._C._has_torch_function

# ---------------------------------------------------------------------------------------------
# The problem string
# ---------------------------------------------------------------------------------------------

_CODES = {kind: {name: value.value for name, value in enum.__members__.items()}
          for kind, enum in (("format", _C.Format), ("mask", _C.Mask), ("bias", _C.Bias),
                             ("softmax", _C.Softmax), ("backend", _C.Backend))}
_LAYOUT_OF_CODE = {str(code): name for name, code in _CODES["format"].items()}
_LEARNABLE_SINK = str(_CODES["softmax"]["learnable_sink"])


def encode_problem(options, is_training, return_lse, bias_requires_grad):
    """The op's problem string (see torch_ops.cpp's Options): the C API's enum values and the
    flags deterministic, is_training, return_lse, bias_requires_grad."""
    return _prefix_of(options) + _flags(is_training, return_lse, bias_requires_grad)


def _prefix_of(options):
    """Everything but the last three flags, which depend on the call's tensors."""
    return "|".join((str(_CODES["format"][options.layout]), str(_CODES["mask"][options.mask]),
                     str(options.window_left), str(options.window_right),
                     str(_CODES["bias"][options.bias_type]), repr(options.softcap),
                     str(_CODES["softmax"][options.softmax]), repr(options.dropout_p),
                     repr(options.scale), str(_CODES["backend"][options.backend]),
                     "1" if options.deterministic else "0"))


_FLAG_TEXTS = tuple("%d%d%d" % (i >> 2, (i >> 1) & 1, i & 1) for i in range(8))


def _flags(is_training, return_lse, bias_requires_grad):
    # A lookup, not a join: attention() calls this on every call.
    return _FLAG_TEXTS[(4 if is_training else 0) + (2 if return_lse else 0)
                       + (1 if bias_requires_grad else 0)]


def _decoded(problem):
    """(learnable_sink, is_training, return_lse, bias_requires_grad) of a problem string."""
    fields = problem.split("|")
    flags = fields[10]
    return fields[6] == _LEARNABLE_SINK, flags[1] == "1", flags[2] == "1", flags[3] == "1"


# One entry per distinct set of keyword options: (Options, prefix string). A program has a
# handful; the bound only stops a program that makes options without end from growing it.
_PREFIXES = {}
_MAX_PREFIXES = 1024


def _options(layout, mask, window, bias_type, softcap, softmax, dropout_p, scale, deterministic,
             backend, has_bias, has_alibi, has_sinks):
    options = _problem.normalize_options(
        layout=layout, mask=mask, window=window, bias_type=bias_type, has_bias=has_bias,
        has_alibi=has_alibi, softcap=softcap, has_sinks=has_sinks, softmax=softmax,
        dropout_p=dropout_p, dropout_seed=0, scale=scale, deterministic=deterministic,
        backend=backend)
    return options, _prefix_of(options)


def max_length(cu_seqlens, name):
    """The longest sequence of a cu_seqlens tensor. A host read: synchronizes with the device
    for CUDA tensors."""
    if cu_seqlens.shape[0] < 2:
        return 0
    shortest, longest = torch.aminmax(cu_seqlens[1:] - cu_seqlens[:-1])
    shortest, longest = torch.stack((shortest, longest)).tolist()  # one read
    return _problem.checked_max_length(name, shortest, longest)


def _max_lengths(layout, max_seqlen_q, max_seqlen_kv, cu_seqlens_q, cu_seqlens_kv):
    """The op's max_seqlen_q/kv: as given, else for THD read from cu_seqlens; 0 for the dense
    layouts' (their lengths come from the shapes)."""
    max_q, max_kv = max_seqlen_q or 0, max_seqlen_kv or 0
    if layout == "thd" and cu_seqlens_q is not None:
        max_q = max_q or max_length(cu_seqlens_q, "cu_seqlens_q")
        if cu_seqlens_kv is not None:
            max_kv = max_kv or max_length(cu_seqlens_kv, "cu_seqlens_kv")
    return max_q, max_kv


def _int32(t, name, q):
    """An index tensor as the library reads it: int32 on q's device. int64 tensors (torch's
    default integer) are converted; a list or tuple of ints (or of lists, for page_table)
    becomes a tensor."""
    if t is None:
        return t
    if not isinstance(t, torch.Tensor):
        if isinstance(t, (list, tuple)):
            return torch.tensor(t, dtype=torch.int32, device=q.device)
        raise InvalidArgumentError("%s must be an int32 tensor %s (or a list of ints), got %s"
                                   % (name, INDEX_SHAPES[name], type(t).__name__))
    if t.dtype == torch.int32:
        return t
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        raise InvalidArgumentError("%s has dtype %s: lengths, offsets and page indices are "
                                   "integers (int32)" % (name, t.dtype))
    return t.to(torch.int32)


def _float32(t, name):
    """Sinks and slopes as the library reads them (float32). The cast is differentiable: a bf16
    sink parameter gets its gradient in bf16."""
    if t is None:
        return t
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError("%s must be a float tensor [heads_q], got %s"
                                   % (name, type(t).__name__))
    if t.dtype == torch.float32:
        return t
    return t.float()


# ---------------------------------------------------------------------------------------------
# attention() and attention_backward() for torch tensors
# ---------------------------------------------------------------------------------------------


def attention(q, k, v, layout, mask, window, bias, bias_type, alibi_slopes, softcap, sinks,
              softmax, dropout_p, dropout_seed, scale, cu_seqlens_q, cu_seqlens_kv,
              seq_offsets_q, seq_offsets_kv, max_seqlen_q, max_seqlen_kv, deterministic, backend,
              return_lse, score_mod, mask_mod, page_table=None, seqlens_kv=None,
              dropout_positions=None):
    """fusedattn.attention for torch tensors (the arguments in its order; see there). Under
    torch.compile or CUDA-graph capture give max_seqlen_q/kv for "thd" (else cu_seqlens are
    read on the host) and a dropout_seed when dropout_p > 0. Paged K/V (page_table) needs no
    host read: max_seqlen_kv defaults to what the table holds."""
    key = (layout, mask, window, bias_type, softcap, softmax, dropout_p, scale, deterministic,
           backend, bias is not None, alibi_slopes is not None, sinks is not None)
    compiling = torch.compiler.is_compiling()
    if compiling:
        options, prefix = _options(*key)
    else:
        try:
            options, prefix = _PREFIXES[key]
        except KeyError:
            if len(_PREFIXES) >= _MAX_PREFIXES:
                _PREFIXES.clear()
            options, prefix = _PREFIXES[key] = _options(*key)
        except TypeError:  # an unhashable argument (a window given as a list): not cached
            options, prefix = _options(*key)
    seed = 0
    ints_tail = ()
    if options.dropout_p > 0:
        seed = dropout_seed if dropout_seed is not None else random.getrandbits(63)
    if dropout_positions is not None:
        ints_tail = _position_ints(_problem.checked_dropout_positions(dropout_positions))
    if sinks is not None:
        sinks = _float32(sinks, "sinks")
    if alibi_slopes is not None:
        alibi_slopes = _float32(alibi_slopes, "alibi_slopes")
    if (cu_seqlens_q is not None or cu_seqlens_kv is not None or seq_offsets_q is not None
            or seq_offsets_kv is not None or page_table is not None or seqlens_kv is not None):
        # Variable length or paged K/V; a dense problem (the common call) skips all of this.
        cu_seqlens_q = _int32(cu_seqlens_q, "cu_seqlens_q", q)
        cu_seqlens_kv = _int32(cu_seqlens_kv, "cu_seqlens_kv", q)
        seq_offsets_q = _int32(seq_offsets_q, "seq_offsets_q", q)
        seq_offsets_kv = _int32(seq_offsets_kv, "seq_offsets_kv", q)
        page_table = _int32(page_table, "page_table", q)
        seqlens_kv = _int32(seqlens_kv, "seqlens_kv", q)
    max_q, max_kv = _max_lengths(options.layout, max_seqlen_q, max_seqlen_kv, cu_seqlens_q,
                                 cu_seqlens_kv)
    text, mod_tensors = "", []
    if score_mod is not None or mask_mod is not None:
        mod = _flex.as_score_mod(score_mod, mask_mod)
        text = mod.text
        for tensor, _ in mod.slots:
            if tensor.requires_grad and not tensor.array.requires_grad:
                tensor.array.requires_grad_()  # the flex.Tensor asks for its gradient
        mod_tensors = mod.tensors()
    grad = torch.is_grad_enabled()
    bias_requires_grad = grad and bias is not None and bias.requires_grad
    is_training = grad and (q.requires_grad or k.requires_grad or v.requires_grad
                            or bias_requires_grad
                            or (sinks is not None and sinks.requires_grad)
                            or any(t.requires_grad for t in mod_tensors))
    if is_training and (page_table is not None or seqlens_kv is not None):
        raise InvalidArgumentError(
            "page_table / seqlens_kv: paged K/V is forward only (a serving cache), but q, k, v, "
            "bias, sinks or a score_mod tensor requires grad: call under torch.no_grad() or "
            "torch.inference_mode(), or detach them")
    problem = prefix + _flags(is_training, return_lse, bias_requires_grad)
    fwd = _FWD
    if not (compiling or _has_torch_function((q, k, v, bias, sinks, alibi_slopes, *mod_tensors))):
        fwd = _FAST_FWD
    try:
        o, lse = fwd(q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv,
                     seq_offsets_q, seq_offsets_kv, page_table, seqlens_kv, mod_tensors, problem,
                     text, [max_q, max_kv, seed, *ints_tail])
    except InvalidArgumentError as error:
        _problem.add_layout_hint(error, layout, q, k)
        raise
    return (o, lse) if return_lse else o


def attention_backward(d_o, q, k, v, o, lse, options, inputs, bias_requires_grad, mod):
    """fusedattn.attention_backward for torch tensors: the bwd operator, without autograd."""
    refuse_paged_backward(inputs)
    cu_q = _int32(inputs.cu_seqlens_q, "cu_seqlens_q", q)
    cu_kv = _int32(inputs.cu_seqlens_kv, "cu_seqlens_kv", q)
    max_q, max_kv = _max_lengths(options.layout, options.max_seqlen_q, options.max_seqlen_kv,
                                 cu_q, cu_kv)
    bias_requires_grad = bool(bias_requires_grad and inputs.bias is not None)
    problem = encode_problem(options, True, False, bias_requires_grad)
    text = mod.text if mod is not None else ""
    mod_tensors = [t.detach() for t in mod.tensors()] if mod is not None else []
    dq, dk, dv, dbias, dsink, d_mods = _BWD(
        d_o.contiguous(), q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(),
        _detached(inputs.bias), _float32(_detached(inputs.alibi_slopes), "alibi_slopes"),
        _float32(_detached(inputs.sink_logits), "sinks"), cu_q, cu_kv,
        _int32(inputs.seq_offsets_q, "seq_offsets_q", q),
        _int32(inputs.seq_offsets_kv, "seq_offsets_kv", q),
        mod_tensors, problem, text,
        [max_q, max_kv, options.dropout_seed, *_position_ints(options.dropout_positions)])
    grads = Gradients(dq, dk, dv, dbias if bias_requires_grad else None,
                      dsink if options.softmax == "learnable_sink" else None)
    if mod is not None:
        slot_grads = [g if t.requires_grad else None for (t, _), g in zip(mod.slots, d_mods)]
        grads.dscore_mod = gradients_by_name(mod, slot_grads)
    return grads


def _position_ints(positions):
    """The ops' ints after [max_seqlen_q, max_seqlen_kv, dropout_seed]: the six dropout
    positions (torch_ops.cpp's MakeConfig), or none at the default positions."""
    return () if positions == _problem.DEFAULT_DROPOUT_POSITIONS else tuple(positions)


def _detached(t):
    return None if t is None else t.detach()


# ---------------------------------------------------------------------------------------------
# Fake functions (shapes only) for torch.compile and FakeTensor tracing
# ---------------------------------------------------------------------------------------------


@torch.library.register_fake("fusedattn::fwd")
def _fwd_fake(q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
              seq_offsets_kv, page_table, seqlens_kv, score_mod_tensors, problem, score_mod, ints):
    _, is_training, return_lse, _ = _decoded(problem)
    o = q.new_empty(_problem.output_shape(q.shape, v.shape))
    if is_training or return_lse:
        lse = q.new_empty(_problem.lse_shape(_LAYOUT_OF_CODE[problem.split("|", 1)[0]],
                                             q.shape), dtype=torch.float32)
    else:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


def _tensors_requiring_grad(score_mod):
    """Per declared score_mod tensor, whether the graph asks for its gradient (the text's
    "tensor <dtype> <axes> <requires_grad> <name>" items; see src/flex/serialize.h)."""
    return [item.split(" ")[3] == "1" for item in score_mod.split(";")
            if item.startswith("tensor ")]


@torch.library.register_fake("fusedattn::bwd")
def _bwd_fake(d_o, q, k, v, o, lse, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv,
              seq_offsets_q, seq_offsets_kv, score_mod_tensors, problem, score_mod, ints):
    learnable_sink, _, _, bias_requires_grad = _decoded(problem)
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    empty = q.new_empty((0,), dtype=torch.float32)
    dbias = bias.new_empty(bias.shape) if bias_requires_grad and bias is not None else empty
    dsink = q.new_empty((q.shape[-2],), dtype=torch.float32) if learnable_sink else \
        q.new_empty((0,), dtype=torch.float32)
    d_mods = [t.new_empty(t.shape) if wanted else t.new_empty((0,))
              for t, wanted in zip(score_mod_tensors, _tensors_requiring_grad(score_mod))]
    return dq, dk, dv, dbias, dsink, d_mods


# ---------------------------------------------------------------------------------------------
# The low-level API's adapter (fusedattn.forward / backward on preallocated torch tensors)
# ---------------------------------------------------------------------------------------------


def current_stream(t):
    """The cudaStream_t (an int) of torch's current stream on t's device; 0 for CPU tensors."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def empty_bytes(nbytes, like):
    return torch.empty((nbytes,), dtype=torch.uint8, device=like.device)


def device_name(t):
    return "cuda" if t.is_cuda else "cpu"


_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16",
                torch.bfloat16: "bfloat16", torch.int32: "int32", torch.uint8: "uint8"}


def dtype_name(t):
    return _DTYPE_NAMES.get(t.dtype, str(t.dtype).replace("torch.", ""))

