"""Runs through the extension on tensors that a framework adapter allocates: the NumPy path of
attention() / attention_backward() (the CPU reference backend), and the tensor export used by
the low-level fusedattn.forward / fusedattn.backward on any DLPack tensors.

(Torch tensors take the torch operators of _torch.py instead: the whole call is C++ there.)
"""

from collections import namedtuple

from . import _C
from ._errors import InvalidArgumentError
from ._problem import build_config, checked_max_length, lse_shape, output_shape, problem_dims

# page_table, seqlens_kv: paged K/V (None for contiguous K/V).
Inputs = namedtuple("Inputs", "bias alibi_slopes sink_logits cu_seqlens_q cu_seqlens_kv "
                              "seq_offsets_q seq_offsets_kv page_table seqlens_kv",
                    defaults=(None, None))


class Gradients(namedtuple("Gradients", "dq dk dv dbias dsink")):
    """dq, dk, dv, dbias and dsink (None when not computed); dscore_mod: the gradients of the
    score_mod tensors that require one, {tensor name: array} (summed over the reads of a tensor
    indexed in several ways)."""

    dscore_mod = {}


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
    def max_length(cu_seqlens, name):
        import numpy as np
        cu = np.asarray(cu_seqlens)
        if cu.shape[0] < 2:
            return 0
        steps = cu[1:] - cu[:-1]
        return checked_max_length(name, int(steps.min()), int(steps.max()))


# The shape of each index tensor, as messages say it.
INDEX_SHAPES = {"cu_seqlens_q": "[batch + 1]", "cu_seqlens_kv": "[batch + 1]",
                "seq_offsets_q": "[batch + 1]", "seq_offsets_kv": "[batch + 1]",
                "page_table": "[batch, max_pages_per_seq]", "seqlens_kv": "[batch]"}


def index_array(x, name):
    """A NumPy index tensor (cu_seqlens_*, seq_offsets_*, page_table, seqlens_kv) as the library
    reads it: int32. Lists and tuples of ints, and int64 arrays (NumPy's default integer), are
    converted; cumulative lengths are checked to be non-decreasing here, where the values are on
    the host."""
    import numpy as np
    if x is None:
        return None
    shape = INDEX_SHAPES[name]
    ndim = 2 if name == "page_table" else 1
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise InvalidArgumentError("%s must be an int32 array %s (or a list of ints), got %s"
                                   % (name, shape, type(x).__name__))
    if x.dtype.kind not in "iu":
        raise InvalidArgumentError("%s has dtype %s: lengths, offsets and page indices are "
                                   "integers (int32)" % (name, x.dtype))
    if x.ndim != ndim or x.shape[0] < 1:
        raise InvalidArgumentError("%s has shape %s but %s is expected"
                                   % (name, list(x.shape), shape))
    if x.dtype != np.int32:
        if x.size and (x.min() < np.iinfo(np.int32).min or x.max() > np.iinfo(np.int32).max):
            raise InvalidArgumentError("%s holds values outside int32" % name)
        x = x.astype(np.int32)
    if name.startswith("cu_seqlens") and x.shape[0] > 1:
        steps = np.diff(x.astype(np.int64))
        if (steps < 0).any():
            b = int(np.argmax(steps < 0))
            raise InvalidArgumentError(
                "%s decreases at sequence %d (%d then %d): cumulative lengths are "
                "non-decreasing, [0, len_0, len_0 + len_1, ...]" % (name, b, x[b], x[b + 1]))
    return x


def numpy_inputs(inputs):
    """Inputs with their NumPy index tensors converted and checked (see index_array)."""
    return inputs._replace(**{name: index_array(getattr(inputs, name), name)
                              for name in INDEX_SHAPES})


def check_writable(name, x):
    """Refuses an output the caller cannot expect to be written: a read-only NumPy array or an
    immutable JAX array (JAX arrays export DLPack without saying they are read-only)."""
    if x is None:
        return
    module = type(x).__module__
    if module.startswith("jax") or module.startswith("jaxlib"):
        raise InvalidArgumentError(
            "%s is a JAX array, which is immutable: fusedattn writes outputs in place, so pass a "
            "writable tensor (NumPy, PyTorch, CuPy); fusedattn.jax is the JAX interface" % name)
    flags = getattr(x, "flags", None)
    if module == "numpy" and flags is not None and not flags.writeable:
        raise InvalidArgumentError("%s is a read-only NumPy array but it is an output" % name)


def dims_of(arrays, q, k, v, options, inputs):
    batch = None
    if inputs.cu_seqlens_q is not None:
        batch = inputs.cu_seqlens_q.shape[0] - 1
    max_q, max_kv = options.max_seqlen_q, options.max_seqlen_kv
    if options.layout == "thd" and batch is not None and (not max_q or not max_kv):
        if not max_q:
            max_q = arrays.max_length(inputs.cu_seqlens_q, "cu_seqlens_q")
        if not max_kv and inputs.cu_seqlens_kv is not None:
            max_kv = arrays.max_length(inputs.cu_seqlens_kv, "cu_seqlens_kv")
    table = None if inputs.page_table is None else tuple(inputs.page_table.shape)
    return problem_dims(options.layout, q.shape, k.shape, v.shape, batch, max_q, max_kv, table)


def _tensors(inputs):
    return {"bias": inputs.bias, "alibi_slopes": inputs.alibi_slopes,
            "sink_logits": inputs.sink_logits, "cu_seqlens_q": inputs.cu_seqlens_q,
            "cu_seqlens_kv": inputs.cu_seqlens_kv, "seq_offsets_q": inputs.seq_offsets_q,
            "seq_offsets_kv": inputs.seq_offsets_kv}


def paged_tensors(inputs):
    """The forward's paged K/V tensors (none for contiguous K/V)."""
    if inputs.page_table is None and inputs.seqlens_kv is None:
        return {}
    return {"page_table": inputs.page_table, "seqlens_kv": inputs.seqlens_kv}


def refuse_paged_backward(inputs):
    """Paged K/V is forward only (fusedattn.h): said in the Python call's terms."""
    if inputs.page_table is not None or inputs.seqlens_kv is not None:
        raise InvalidArgumentError("page_table / seqlens_kv: paged K/V is forward only (a "
                                   "serving cache); the backward takes contiguous k and v")


# torch's FP8 dtypes (by name, so that torch is imported only for torch tensors) and fusedattn's.
_TORCH_FP8 = {"torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e5m2"}


def exported(tensors):
    """tensors for _C.fwd / _C.bwd:
    * torch tensors become DLPack capsules through torch.utils.dlpack.to_dlpack: no stream
      synchronization and no device check (Tensor.__dlpack__ may do both), safe under CUDA-graph
      capture; the op runs on the stream given;
    * NumPy bfloat16 arrays (ml_dtypes) become (uint16 view, "bfloat16"), since NumPy exports no
      bfloat16 through DLPack or the buffer protocol;
    * torch float8_e4m3fn / float8_e5m2 tensors become (uint8 view, "fp8_e4m3" / "fp8_e5m2"),
      whatever DLPack version torch exports;
    * anything else goes as is, through its __dlpack__."""
    def export(t):
        module = type(t).__module__
        if module == "torch" or module.startswith("torch."):
            import torch.utils.dlpack
            t = t.detach() if t.requires_grad else t
            fp8 = _TORCH_FP8.get(str(t.dtype))
            if fp8 is not None:
                import torch
                return (torch.utils.dlpack.to_dlpack(t.view(torch.uint8)), fp8)
            return torch.utils.dlpack.to_dlpack(t)
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
    dims = dims_of(arrays, q, k, v, options, inputs)
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
    tensors = dict(q=q, k=k, v=v, o=o, lse=lse, **_tensors(inputs), **paged_tensors(inputs))
    if score_mod is not None:
        tensors["score_mod_tensors"] = score_mod.tensors()
    _C.fwd(config, exported(tensors), dropout_seed=options.dropout_seed, workspace=workspace,
           stream=arrays.stream(q), score_mod=graph)
    return o, lse


def run_backward(arrays, d_o, q, k, v, o, lse, options, inputs, bias_requires_grad=False,
                 score_mod=None):
    """Allocates dq, dk, dv (dbias when bias_requires_grad, dsink for the sink softmax, the
    gradients of score_mod tensors that require one) with `arrays` and runs the backward.
    Returns Gradients (absent ones None)."""
    refuse_paged_backward(inputs)
    dims = dims_of(arrays, q, k, v, options, inputs)
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
    _C.bwd(config, exported(tensors), dropout_seed=options.dropout_seed, workspace=workspace,
           stream=arrays.stream(q), score_mod=graph)
    grads = Gradients(dq, dk, dv, dbias, dsink)
    if score_mod is not None:
        grads.dscore_mod = gradients_by_name(score_mod, slot_grads)
    return grads


def gradients_by_name(score_mod, slot_grads):
    """{tensor name: gradient} from the per-slot gradients (None where not computed); the reads
    of one tensor with several index sets add up under the tensor's own name."""
    out = {}
    for (tensor, _), name, grad in zip(score_mod.slots, score_mod.names, slot_grads):
        if grad is None:
            continue
        key = tensor.name if tensor.name is not None else name
        out[key] = out[key] + grad if key in out else grad
    return out

