"""fusedattn for JAX: attention through XLA's FFI, under jit, grad, vmap and sharding.

    import fusedattn.jax as fj
    o = fj.attention(q, k, v, mask="causal")                  # q: [batch, seq, heads, dim]
    o = fj.dot_product_attention(q, k, v, is_causal=True)    # jax.nn's signature
    print(fj.explain(q, k, v, mask="causal"))                # which backend, and why

Each call is one XLA custom call (fusedattn_fwd_v1 / fusedattn_bwd_v1) over the C API, on XLA's
stream with workspace from XLA's allocator: CPU arrays run the reference backend (float64
inside: exact, slow), CUDA arrays the fastest backend that runs the problem. Keyword options
are static (a new value compiles a new program); arrays are operands.

Transformations:
* jax.grad / jax.vjp: gradients for q, k, v, bias, sinks and float score_mod tensors (those JAX
  differentiates; alibi_slopes, lengths and indices get none); lse is not differentiable. No
  forward mode (jax.jvp) and no second derivatives. o and lse are named "fusedattn_o" and
  "fusedattn_lse" for jax.checkpoint policies.
* jax.vmap: the mapped axis joins the batch (one call); the cases it cannot join (THD, dropout,
  per-example alibi_slopes or sinks, the gradient of sinks, score_mod tensors without a batch
  axis or graphs that read flex.batch as a number) run one call per example (jax.lax.map).
* Sharding: under jax.shard_map each device runs its own part as is. Under jax.jit with sharded
  arrays, batch and heads stay sharded as q's are (no gather): the sequence and head_dim axes are
  made whole; heads shard only when heads_kv divides by the shard count and the score_mod does
  not read flex.head as a number (likewise batch and flex.batch); THD runs replicated. Dropout
  masks then use the shard's own batch and head indices with the shard index in the Philox
  offset: as random as unsharded, not the same bits.

Errors in the arguments raise fusedattn.InvalidArgumentError when the call is traced; what only
the run can tell (a GPU backend that cannot run the problem) raises XLA's runtime error with the
library's message.
"""

import functools
import math
from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import SymbolicZero
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from . import _C, _flex, _jax_ffi, _problem
from ._errors import InvalidArgumentError, NotSupportedError
from ._run import NumpyArrays

__all__ = ["attention", "dot_product_attention", "explain", "available"]


def available():
    """Whether fusedattn.jax can run: True once imported (the import raises ImportError, saying
    why, when the FFI handlers can neither be found nor built)."""
    return True


# ---------------------------------------------------------------------------------------------
# A call: its static description and its operands
# ---------------------------------------------------------------------------------------------

class Operands(namedtuple("Operands", [
        "q", "k", "v", "bias", "alibi_slopes", "sinks", "lengths_q", "lengths_kv",
        "cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q", "seq_offsets_kv", "dropout",
        "score_mod_tensors"])):
    """The arrays of a call (None where absent). Dense layouts with padding carry per-sequence
    lengths (the cumulative form the library takes is made next to the custom call, so that it
    shards with the batch); THD carries cu_seqlens and seq_offsets. dropout: uint32[4], the
    Philox seed (two words) and offset (two words)."""


class Static(namedtuple("Static", [
        "options", "score_mod", "is_training", "return_lse", "bias_requires_grad",
        "seq_offsets"])):
    """What is fixed when a call is traced: the normalized options (_problem.Options), the
    score_mod graph's text ("" for none), the flags, and whether THD seq_offsets are given."""


def _codes(enum_type):
    return {name: value.value for name, value in enum_type.__members__.items()}


_FORMAT, _MASK, _BIAS = _codes(_C.Format), _codes(_C.Mask), _codes(_C.Bias)
_SOFTMAX, _BACKEND = _codes(_C.Softmax), _codes(_C.Backend)
# (batch, seqlen, heads) axes of q, k, v, o in the dense layouts.
_BSH = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}


def _attributes(static):
    """The FFI call's attributes (jax_ffi.cpp's ReadOptions)."""
    o = static.options
    i64, f64 = np.int64, np.float64
    return dict(
        layout=i64(_FORMAT[o.layout]), mask=i64(_MASK[o.mask]),
        window_left=i64(o.window_left), window_right=i64(o.window_right),
        bias_type=i64(_BIAS[o.bias_type]), softmax_type=i64(_SOFTMAX[o.softmax]),
        backend=i64(_BACKEND[o.backend]), softcap=f64(o.softcap), dropout=f64(o.dropout_p),
        attn_scale=f64(o.scale), deterministic=i64(o.deterministic),
        is_training=i64(static.is_training), return_lse=i64(static.return_lse),
        bias_requires_grad=i64(static.bias_requires_grad),
        max_seqlen_q=i64(o.max_seqlen_q), max_seqlen_kv=i64(o.max_seqlen_kv),
        score_mod=static.score_mod)


# ---------------------------------------------------------------------------------------------
# The custom calls (on whatever part of the arrays one device holds)
# ---------------------------------------------------------------------------------------------

def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _cumulative(lengths):
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(lengths, dtype=jnp.int32)])


def _common_operands(static, ops):
    """bias, alibi_slopes, sinks, cu_seqlens_q/kv, seq_offsets_q/kv, dropout: zero-size where
    absent."""
    if ops.lengths_q is not None:  # dense layouts with padding
        cu_q, cu_kv = _cumulative(ops.lengths_q), _cumulative(ops.lengths_kv)
    else:
        cu_q, cu_kv = ops.cu_seqlens_q, ops.cu_seqlens_kv

    def given(x, dtype):
        return _empty(dtype) if x is None else x

    return [given(ops.bias, jnp.float32), given(ops.alibi_slopes, jnp.float32),
            given(ops.sinks, jnp.float32), given(cu_q, jnp.int32), given(cu_kv, jnp.int32),
            given(ops.seq_offsets_q, jnp.int32), given(ops.seq_offsets_kv, jnp.int32),
            given(ops.dropout, jnp.uint32)]


def _initial(static, shape, dtype):
    """The initial content of an output: zeros for THD (whose tokens outside every sequence the
    library leaves untouched), aliased to the output; nothing otherwise."""
    if static.options.layout == "thd":
        return jnp.zeros(shape, dtype)
    return _empty(dtype)


def _ffi_forward(static, ops):
    """(o, lse or None) from the forward custom call."""
    q, v = ops.q, ops.v
    layout = static.options.layout
    o_shape = _problem.output_shape(q.shape, v.shape)
    want_lse = static.is_training or static.return_lse
    lse_shape = _problem.lse_shape(layout, q.shape) if want_lse else (0,)
    args = [q, ops.k, v] + _common_operands(static, ops)
    first_initial = len(args)
    args += [_initial(static, o_shape, q.dtype), _initial(static, lse_shape, jnp.float32)]
    aliases = {}
    if layout == "thd":
        aliases = {first_initial: 0, first_initial + 1: 1}
    args += list(ops.score_mod_tensors)
    results = [jax.ShapeDtypeStruct(o_shape, q.dtype),
               jax.ShapeDtypeStruct(lse_shape, jnp.float32)]
    call = jax.ffi.ffi_call(_jax_ffi.FWD_TARGET, results, input_output_aliases=aliases)
    o, lse = call(*args, **_attributes(static))
    return o, (lse if want_lse else None)


def _ffi_backward(static, ops, o, lse, d_o):
    """(dq, dk, dv, dbias or None, dsink or None, (d score_mod tensor or None, ...)) from the
    backward custom call."""
    q, k, v = ops.q, ops.k, ops.v
    args = [q, k, v, o, lse, d_o] + _common_operands(static, ops)
    first_initial = len(args)
    args += [_initial(static, x.shape, x.dtype) for x in (q, k, v)]
    aliases = {}
    if static.options.layout == "thd":
        aliases = {first_initial: 0, first_initial + 1: 1, first_initial + 2: 2}
    args += list(ops.score_mod_tensors)

    def result(x, wanted):
        if wanted:
            return jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.ShapeDtypeStruct((0,), jnp.float32)

    wants_dbias = static.bias_requires_grad and ops.bias is not None
    wants_dsink = static.options.softmax == "learnable_sink"
    wants_mods = _flex.declared_requires_grad(static.score_mod) if static.score_mod else []
    results = [result(q, True), result(k, True), result(v, True), result(ops.bias, wants_dbias),
               result(ops.sinks, wants_dsink)]
    results += [result(t, w) for t, w in zip(ops.score_mod_tensors, wants_mods)]
    call = jax.ffi.ffi_call(_jax_ffi.BWD_TARGET, results, input_output_aliases=aliases)
    out = call(*args, **_attributes(static))
    dq, dk, dv, dbias, dsink = out[:5]
    d_mods = tuple(g if w else None for g, w in zip(out[5:], wants_mods))
    return dq, dk, dv, (dbias if wants_dbias else None), (dsink if wants_dsink else None), d_mods


# ---------------------------------------------------------------------------------------------
# Sharding under jit: custom_partitioning with a Shardy rule
# ---------------------------------------------------------------------------------------------

def _mesh_axes(entry):
    """A PartitionSpec entry as a tuple of mesh axis names."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _spec_entry(axes):
    return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))



def _mod_axes(text):
    """Per score_mod tensor the graph declares, its axes as a tuple of names (batch, head,
    q_idx, kv_idx)."""
    out = []
    for item in text.split(";") if text else ():
        if item.startswith("tensor "):
            bits = int(item.split(" ")[2])
            out.append(tuple(name for name, bit in _flex._AXIS_BITS.items() if bits & bit))
    return out


def _operand_roles(static, backward):
    """The role of each array leaf of a call's arguments, in flattening order: the forward takes
    (ops,), the backward (ops, o, lse, d_o). Roles name shapes: "q", "k", "v", "o", "lse",
    "bias", "heads" ([heads_q]), "batch" ([batch]), "whole" (never sharded), ("mod", axes)."""
    o = static.options
    dense = o.layout != "thd"
    roles = ["q", "k", "v"]
    if o.bias_type in ("pre_scale", "post_scale"):
        roles.append("bias")
    if o.bias_type == "alibi":
        roles.append("heads")
    if o.softmax == "learnable_sink":
        roles.append("heads")
    if dense and o.mask.startswith("padding"):
        roles += ["batch", "batch"]
    if not dense:
        roles += ["whole"] * (2 + sum(static.seq_offsets))  # cu_seqlens, seq_offsets
    if o.dropout_p > 0:
        roles.append("whole")
    roles += [("mod", axes) for axes in _mod_axes(static.score_mod)]
    if backward:
        roles += ["o", "lse", "o"]
    return roles


def _result_roles(static, backward, has_bias):
    o = static.options
    if not backward:
        return ["o"] + (["lse"] if static.is_training or static.return_lse else [])
    roles = ["q", "k", "v"]
    if static.bias_requires_grad and has_bias:
        roles.append("bias")
    if o.softmax == "learnable_sink":
        roles.append("heads")
    wanted = _flex.declared_requires_grad(static.score_mod) if static.score_mod else []
    roles += [("mod", axes) for axes, w in zip(_mod_axes(static.score_mod), wanted) if w]
    return roles


def _layout_dims(layout, batch, seq, heads, dim):
    dims = [None] * 4
    b, s, h = _BSH[layout]
    dims[b], dims[s], dims[h], dims[3] = batch, seq, heads, dim
    return dims


def _factors(role, shape, layout, heads, unique):
    """The Shardy factors of one array's dimensions. b: batch, s/t: query/key positions, g: kv
    heads, heads: the query heads' factors ("(g r)": kv heads g times the group r), d/e: head
    dims of q/k and v."""
    if layout == "thd":
        return [unique() for _ in shape]
    if role == "q":
        return _layout_dims(layout, "b", "s", heads, "d")
    if role == "o":
        return _layout_dims(layout, "b", "s", heads, "e")
    if role == "k":
        return _layout_dims(layout, "b", "t", "g", "d")
    if role == "v":
        return _layout_dims(layout, "b", "t", "g", "e")
    if role == "lse":
        return ["b", heads, "s"]
    if role == "bias":
        return ["b" if shape[0] > 1 else unique(), heads if shape[1] > 1 else unique(), "s", "t"]
    if role == "heads":
        return [heads]
    if role == "batch":
        return ["b"]
    if isinstance(role, tuple):  # ("mod", axes)
        names = {"batch": "b", "head": heads, "q_idx": "s", "kv_idx": "t"}
        return [names[a] for a in role[1]] or [unique()]
    return [unique() for _ in shape]


def _sharding_rule(static, backward, mesh, value_types, result_types):
    """The Shardy rule of a call (custom_partitioning's sharding_rule callable)."""
    from jax.extend.mlir import ir
    shapes_in = [tuple(ir.RankedTensorType(t).shape) for t in value_types]
    shapes_out = [tuple(ir.RankedTensorType(t).shape) for t in result_types]
    roles_in = _operand_roles(static, backward)
    roles_out = _result_roles(static, backward, "bias" in roles_in)
    layout = static.options.layout
    uniques = []

    def unique():
        uniques.append("u%d" % len(uniques))
        return uniques[-1]

    sizes = {}
    heads = None
    if layout != "thd":
        h = _BSH[layout][2]
        heads_q, heads_kv = shapes_in[0][h], shapes_in[1][h]
        # A compound factor may not have a factor of size 1.
        if heads_q == heads_kv:
            heads = "g"
        elif heads_kv == 1:
            heads = "r"
        else:
            heads, sizes["r"] = "(g r)", heads_q // heads_kv

    def text(roles, shapes):
        return ", ".join(" ".join(_factors(role, shape, layout, heads, unique))
                         for role, shape in zip(roles, shapes))

    rule = "%s -> %s" % (text(roles_in, shapes_in), text(roles_out, shapes_out))
    replicated = set(uniques)
    if layout != "thd":
        replicated |= {"s", "t", "d", "e"}
    # Shardy wants them in the order in which the factors first appear.
    order = []
    for word in rule.replace("(", " ").replace(")", " ").replace(",", " ").split():
        if word in replicated and word not in order:
            order.append(word)
    return rule, dict(sizes, need_replication_factors=tuple(order))


def _shard_plan(static, mesh, q, k):
    """(batch axes, head axes): the mesh axes over which q's batch and heads are sharded and
    stay so; () where that dimension is made whole."""
    options = static.options
    sharding = getattr(q, "sharding", None)
    if options.layout == "thd" or not isinstance(sharding, NamedSharding):
        return (), ()
    spec = tuple(sharding.spec) + (None,) * (len(q.shape) - len(sharding.spec))
    b_axis, _, h_axis = _BSH[options.layout]
    batch, heads = _mesh_axes(spec[b_axis]), _mesh_axes(spec[h_axis])

    def count(axes):
        return math.prod(mesh.shape[a] for a in axes)

    text = static.score_mod
    if batch and (q.shape[b_axis] % count(batch) or (text and _flex.reads_input(text, "batch"))):
        batch = ()
    # Heads shard as whole groups: kv head g serves query heads g * group ... (g + 1) * group - 1,
    # so heads_kv must divide by the shard count.
    if heads and (k.shape[h_axis] % count(heads) or (text and _flex.reads_input(text, "head"))
                  or set(heads) & set(batch)):
        heads = ()
    return batch, heads


def _spec(role, shape, layout, batch, heads):
    B, H = _spec_entry(batch), _spec_entry(heads)
    if layout == "thd":
        return PartitionSpec()
    if role in ("q", "k", "v", "o"):
        return PartitionSpec(*_layout_dims(layout, B, None, H, None))
    if role == "lse":
        return PartitionSpec(B, H, None)
    if role == "bias":
        return PartitionSpec(B if shape[0] > 1 else None, H if shape[1] > 1 else None)
    if role == "heads":
        return PartitionSpec(H)
    if role == "batch":
        return PartitionSpec(B)
    if isinstance(role, tuple):
        names = {"batch": B, "head": H}
        return PartitionSpec(*[names.get(a) for a in role[1]])
    return PartitionSpec()


def _reduced_axes(role, shape, batch, heads):
    """The mesh axes a backward result is a partial sum over on each device: a gradient of a
    tensor broadcast over batch or heads sums over them."""
    if role == "bias":
        return (batch if shape[0] == 1 else ()) + (heads if shape[1] == 1 else ())
    if role == "heads":  # dsink
        return batch
    if isinstance(role, tuple):
        axes = role[1]
        return (() if "batch" in axes else batch) + (() if "head" in axes else heads)
    return ()


def _fold_shard_index(dropout, mesh, axes):
    """The dropout words with the linear index of this device's shard added to the Philox
    offset's low word, so that shards draw independent masks."""
    index = jnp.uint32(0)
    for axis in axes:
        index = index * jnp.uint32(mesh.shape[axis]) + jax.lax.axis_index(axis).astype(jnp.uint32)
    return dropout.at[2].add(index)


def _partition(static, backward, inner, mesh, arg_shapes, result_shape):
    layout = static.options.layout
    ops = arg_shapes[0]
    batch, heads = _shard_plan(static, mesh, ops.q, ops.k)
    leaves, tree = jax.tree.flatten(arg_shapes)
    roles_in = _operand_roles(static, backward)
    arg_shardings = tree.unflatten([
        NamedSharding(mesh, _spec(role, x.shape, layout, batch, heads))
        for role, x in zip(roles_in, leaves)])
    out_leaves, out_tree = jax.tree.flatten(result_shape)
    roles_out = _result_roles(static, backward, ops.bias is not None)
    result_shardings = out_tree.unflatten([
        NamedSharding(mesh, _spec(role, x.shape, layout, batch, heads))
        for role, x in zip(roles_out, out_leaves)])
    reductions = [_reduced_axes(role, x.shape, batch, heads)
                  for role, x in zip(roles_out, out_leaves)]

    def lower(*args):
        if args[0].dropout is not None and batch + heads:
            args = (args[0]._replace(dropout=_fold_shard_index(args[0].dropout, mesh,
                                                                batch + heads)),) + args[1:]
        out = inner(static, *args)
        if not any(reductions):
            return out
        flat, tree_out = jax.tree.flatten(out)
        flat = [jax.lax.psum(x, axes) if axes else x for x, axes in zip(flat, reductions)]
        return tree_out.unflatten(flat)

    return mesh, lower, result_shardings, arg_shardings


@functools.lru_cache(maxsize=256)
def _partitioned(static, backward):
    """The custom call of a static description as a custom_partitioning function."""
    inner = _ffi_backward if backward else _ffi_forward

    def call(*args):
        return inner(static, *args)

    partitioned = custom_partitioning(call)
    partitioned.def_partition(
        partition=functools.partial(_partition, static, backward, inner),
        sharding_rule=functools.partial(_sharding_rule, static, backward))
    return partitioned


# ---------------------------------------------------------------------------------------------
# vmap: the mapped axis joins the batch
# ---------------------------------------------------------------------------------------------

def _fold(x, batched, axis, n):
    """x with vmap's leading axis (size n; x is broadcast when not batched) merged into its own
    axis `axis` (which the unbatched array has there): [..., n * size, ...]."""
    if batched:
        x = jnp.moveaxis(x, 0, axis)
    else:
        x = jnp.broadcast_to(jnp.expand_dims(x, axis), x.shape[:axis] + (n,) + x.shape[axis:])
    shape = x.shape
    return x.reshape(shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:])


def _unfold(y, axis, n):
    """The inverse of _fold: [..., n * size, ...] at `axis` -> [n, ..., size, ...]."""
    shape = y.shape
    y = y.reshape(shape[:axis] + (n, shape[axis] // n) + shape[axis + 1:])
    return jnp.moveaxis(y, axis, 0)


def _foldable(static, backward, ops_batched, ops):
    """Whether vmap can join the batch (one call) rather than loop: see the module's text."""
    o = static.options
    if o.layout == "thd" or o.dropout_p > 0:
        return False
    if ops_batched.alibi_slopes or ops_batched.sinks:
        return False
    if backward and o.softmax == "learnable_sink":  # dsink sums over the batch
        return False
    text = static.score_mod
    if text and _flex.reads_input(text, "batch"):
        return False
    wanted = _flex.declared_requires_grad(text) if (backward and text) else []
    for k, (axes, batched) in enumerate(zip(_mod_axes(text), ops_batched.score_mod_tensors)):
        if "batch" not in axes and (batched or (k < len(wanted) and wanted[k])):
            return False
    return True


def _fold_operands(static, backward, ops, batched, n):
    layout = static.options.layout
    b_axis = _BSH[layout][0]
    fold = functools.partial(_fold, n=n)
    bias = ops.bias
    if bias is not None:
        # A bias shared by the batch ([1, ...]) stays shared, unless each example needs its own
        # gradient: then it is broadcast over the joined batch like a per-sequence bias.
        per_sequence = bias.shape[1 if batched.bias else 0] > 1
        if batched.bias or per_sequence or (backward and static.bias_requires_grad):
            if not per_sequence:
                batch = ops.q.shape[b_axis + (1 if batched.q else 0)]
                shape = bias.shape
                lead = 1 if batched.bias else 0
                bias = jnp.broadcast_to(bias, shape[:lead] + (batch,) + shape[lead + 1:])
            bias = fold(bias, batched.bias, 0)
    mods = []
    for t, axes, is_batched in zip(ops.score_mod_tensors, _mod_axes(static.score_mod),
                                   batched.score_mod_tensors):
        mods.append(fold(t, is_batched, 0) if "batch" in axes else t)
    lengths = [None if x is None else fold(x, b, 0)
               for x, b in ((ops.lengths_q, batched.lengths_q),
                            (ops.lengths_kv, batched.lengths_kv))]
    return ops._replace(q=fold(ops.q, batched.q, b_axis), k=fold(ops.k, batched.k, b_axis),
                        v=fold(ops.v, batched.v, b_axis), bias=bias, lengths_q=lengths[0],
                        lengths_kv=lengths[1], score_mod_tensors=tuple(mods))


def _vmap_rule(static, backward, call, n, in_batched, *args):
    ops, ops_batched = args[0], in_batched[0]
    if not _foldable(static, backward, ops_batched, ops):
        return _vmap_by_loop(call, in_batched, args)
    layout = static.options.layout
    b_axis = _BSH[layout][0]
    folded = [_fold_operands(static, backward, ops, ops_batched, n)]
    if backward:  # o, lse, d_o
        o, lse, d_o = args[1:]
        o_b, lse_b, d_o_b = in_batched[1:]
        folded += [_fold(o, o_b, b_axis, n), _fold(lse, lse_b, 0, n), _fold(d_o, d_o_b, b_axis, n)]
    out = call(*folded)
    if not backward:
        o, lse = out
        result = (_unfold(o, b_axis, n), None if lse is None else _unfold(lse, 0, n))
    else:
        dq, dk, dv, dbias, dsink, d_mods = out
        if dbias is not None:
            dbias = _unfold(dbias, 0, n)
            if ops.bias.shape[1 if ops_batched.bias else 0] == 1:  # per example: sum its batch
                dbias = dbias.sum(axis=1, keepdims=True)
        d_mods = tuple(None if g is None else _unfold(g, 0, n) for g in d_mods)
        result = (_unfold(dq, b_axis, n), _unfold(dk, b_axis, n), _unfold(dv, b_axis, n),
                  dbias, dsink, d_mods)
    return result, jax.tree.map(lambda _: True, result)


def _vmap_by_loop(call, in_batched, args):
    """One call per example, with jax.lax.map over the batched arrays."""
    leaves, tree = jax.tree.flatten(args)
    flags = jax.tree.leaves(in_batched)
    mapped = [i for i, flag in enumerate(flags) if flag]

    def one(xs):
        current = list(leaves)
        for i, x in zip(mapped, xs):
            current[i] = x
        return call(*tree.unflatten(current))

    out = jax.lax.map(one, [leaves[i] for i in mapped])
    return out, jax.tree.map(lambda _: True, out)


@functools.lru_cache(maxsize=256)
def _batched(static, backward):
    """The custom call of a static description, with its vmap rule and sharding."""
    partitioned = _partitioned(static, backward)

    @custom_vmap
    def call(*args):
        return partitioned(*args)

    call.def_vmap(functools.partial(_vmap_rule, static, backward, call))
    return call


# ---------------------------------------------------------------------------------------------
# Gradients: custom_vjp
# ---------------------------------------------------------------------------------------------

class _Training:
    """The Static of a call's training forward, carried to its backward among the residuals as
    a pytree node without leaves (it is Python data, not arrays)."""

    def __init__(self, static):
        self.static = static

    def __hash__(self):
        return hash(self.static)

    def __eq__(self, other):
        return isinstance(other, _Training) and other.static == self.static


jax.tree_util.register_static(_Training)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static, ops):
    o, lse = _batched(static, False)(ops)
    return (o, lse) if static.return_lse else o


def _attention_fwd(static, ops):
    # symbolic_zeros: every array comes with `perturbed`, whether JAX wants its gradient.
    values = jax.tree.map(lambda p: p.value, ops)
    perturbed = jax.tree.map(lambda p: p.perturbed, ops)
    text = static.score_mod
    if text:
        text = _flex.with_requires_grad(text, [
            bool(wanted) and jnp.issubdtype(t.dtype, jnp.floating)
            for wanted, t in zip(perturbed.score_mod_tensors, values.score_mod_tensors)])
    training = static._replace(is_training=True, score_mod=text,
                               bias_requires_grad=values.bias is not None and bool(perturbed.bias))
    o, lse = _batched(training, False)(values)
    o = checkpoint_name(o, "fusedattn_o")
    lse = checkpoint_name(lse, "fusedattn_lse")
    out = (o, lse) if static.return_lse else o
    return out, (values, o, lse, _Training(training))


def _attention_bwd(static, residuals, cotangent):
    values, o, lse, training = residuals
    d_o = cotangent[0] if static.return_lse else cotangent  # lse has no gradient
    nothing = jax.tree.map(lambda _: None, values)
    if isinstance(d_o, SymbolicZero):
        return (nothing,)
    dq, dk, dv, dbias, dsink, d_mods = _batched(training.static, True)(values, o, lse, d_o)
    return (nothing._replace(q=dq, k=dk, v=dv, bias=dbias, sinks=dsink,
                             score_mod_tensors=d_mods),)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


# ---------------------------------------------------------------------------------------------
# The public functions
# ---------------------------------------------------------------------------------------------

_PADDING_FORM = {"none": "padding", "causal": "padding_causal",
                 "causal_bottom_right": "padding_causal_bottom_right"}


def _concrete(x):
    """x's values as a NumPy array, or None when x is traced (its values are not known yet)."""
    try:
        return np.asarray(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _check_shape(name, x, expected, what):
    if x is not None and tuple(x.shape) != tuple(expected):
        raise InvalidArgumentError("%s has shape %s but %s %s is expected"
                                   % (name, list(x.shape), what, list(expected)))


def _max_length(name, cu, given):
    if given:
        return int(given)
    values = _concrete(cu)
    if values is None:
        raise InvalidArgumentError(
            "layout 'thd' under jax.jit needs max_seqlen_q and max_seqlen_kv as Python ints "
            "(%s is traced, so its longest sequence is not known when the call is traced)" % name)
    return NumpyArrays.max_length(values, name)


def _index_array(x, name):
    if x is None:
        return None
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise InvalidArgumentError("%s has dtype %s: lengths and offsets are integers (int32)"
                                   % (name, x.dtype))
    return x.astype(jnp.int32)


def _dropout_words(key):
    """uint32[4]: 64 bits drawn from the key as the Philox seed, and offset 0."""
    if key is None:
        raise InvalidArgumentError("dropout_p > 0 needs dropout_rng, a jax.random key (each key "
                                   "draws its own dropout mask)")
    seed = jax.random.bits(key, (2,), jnp.uint32)
    return jnp.concatenate([seed, jnp.zeros((2,), jnp.uint32)])


def attention(q, k, v, *, layout="bshd", mask=None, window=(-1, -1), bias=None,
              bias_type="post_scale", alibi_slopes=None, softcap=0.0, sinks=None, softmax=None,
              dropout_p=0.0, dropout_rng=None, scale=None, lengths_q=None, lengths_kv=None,
              cu_seqlens_q=None, cu_seqlens_kv=None, seq_offsets_q=None, seq_offsets_kv=None,
              max_seqlen_q=None, max_seqlen_kv=None, deterministic=False, backend="auto",
              return_lse=False, score_mod=None, mask_mod=None):
    """Scaled dot-product attention on JAX arrays, o = softmax(scale * q k^T + bias) v, as
    include/fusedattn/fusedattn.h specifies; fusedattn.attention's arguments (see there), with:

    dropout_rng: a jax.random key, needed when dropout_p > 0 (it replaces dropout_seed): the
    mask is the library's Philox mask with 64 bits of the key as its seed, the same on every
    backend. lengths_q / lengths_kv: int [batch], per-sequence lengths for padding on the dense
    layouts (jax.nn's query_seq_lengths / key_value_seq_lengths; a missing one is the full
    length): the mask becomes its padding form (None -> "padding", "causal" ->
    "padding_causal", ...). cu_seqlens_q/kv on a dense layout are turned into lengths. For
    "thd" under jax.jit give max_seqlen_q/kv as Python ints.

    Returns o, or (o, lse) with return_lse (lse: float32 [batch, heads_q, seqlen_q], or
    [tokens, heads_q] for "thd"; not differentiable). Every keyword but the arrays is static:
    changing one compiles a new program.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    layout = str(layout).lower()
    dense = layout != "thd"
    if dense:
        for name, given in (("seq_offsets_q", seq_offsets_q), ("seq_offsets_kv", seq_offsets_kv)):
            if given is not None:
                raise InvalidArgumentError("%s is for layout 'thd' (packed sequences); the dense "
                                           "layouts take lengths_q / lengths_kv" % name)
        if cu_seqlens_q is not None:
            lengths_q = jnp.diff(_index_array(cu_seqlens_q, "cu_seqlens_q"))
        if cu_seqlens_kv is not None:
            lengths_kv = jnp.diff(_index_array(cu_seqlens_kv, "cu_seqlens_kv"))
        cu_seqlens_q = cu_seqlens_kv = None
        if lengths_q is not None or lengths_kv is not None:
            mask_name = "none" if mask is None else str(mask).lower()
            mask = _PADDING_FORM.get(mask_name, mask_name)
    elif lengths_q is not None or lengths_kv is not None:
        raise InvalidArgumentError("lengths_q / lengths_kv are for the dense layouts; layout "
                                   "'thd' takes cu_seqlens_q / cu_seqlens_kv")
    options = _problem.normalize_options(
        layout=layout, mask=mask, window=window, bias_type=bias_type, has_bias=bias is not None,
        has_alibi=alibi_slopes is not None, softcap=softcap, has_sinks=sinks is not None,
        softmax=softmax, dropout_p=dropout_p, dropout_seed=0, scale=scale,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, deterministic=deterministic,
        backend=backend)

    batch = None
    cu_q, cu_kv = _index_array(cu_seqlens_q, "cu_seqlens_q"), _index_array(cu_seqlens_kv,
                                                                           "cu_seqlens_kv")
    off_q, off_kv = (_index_array(seq_offsets_q, "seq_offsets_q"),
                     _index_array(seq_offsets_kv, "seq_offsets_kv"))
    if not dense:
        if cu_q is None or cu_kv is None:
            raise InvalidArgumentError("layout 'thd' needs cu_seqlens_q and cu_seqlens_kv "
                                       "(int32 [batch + 1])")
        batch = cu_q.shape[0] - 1
        options = options._replace(
            max_seqlen_q=_max_length("cu_seqlens_q", cu_q, options.max_seqlen_q),
            max_seqlen_kv=_max_length("cu_seqlens_kv", cu_kv, options.max_seqlen_kv))
    dims = _problem.problem_dims(layout, q.shape, k.shape, v.shape, batch, options.max_seqlen_q,
                                 options.max_seqlen_kv)
    if dense and options.mask.startswith("padding") and lengths_q is None and lengths_kv is None:
        raise InvalidArgumentError("mask = %r needs per-sequence lengths: lengths_q / lengths_kv "
                                   "(or cu_seqlens_q / cu_seqlens_kv)" % options.mask)
    if dense and (lengths_q is not None or lengths_kv is not None):
        full_q = jnp.full((dims.batch,), dims.max_seqlen_q, jnp.int32)
        full_kv = jnp.full((dims.batch,), dims.max_seqlen_kv, jnp.int32)
        lengths_q = full_q if lengths_q is None else _index_array(lengths_q, "lengths_q")
        lengths_kv = full_kv if lengths_kv is None else _index_array(lengths_kv, "lengths_kv")

    bias = None if bias is None else jnp.asarray(bias)
    alibi_slopes = None if alibi_slopes is None else jnp.asarray(alibi_slopes, jnp.float32)
    sinks = None if sinks is None else jnp.asarray(sinks, jnp.float32)
    mod = _flex.as_score_mod(score_mod, mask_mod)
    mod_tensors = () if mod is None else tuple(jnp.asarray(t) for t in mod.tensors())
    _check_operands(layout, dims, q, k, v, bias, alibi_slopes, sinks, lengths_q, lengths_kv,
                    cu_q, cu_kv, off_q, off_kv, mod, mod_tensors)
    dropout = _dropout_words(dropout_rng) if options.dropout_p > 0 else None

    # Every argument the library checks from the config alone is checked now, at trace time,
    # against the reference backend (which runs every valid problem).
    config = _problem.build_config(
        dims, options._replace(backend="reference"), jnp.dtype(q.dtype).name, "cpu", False,
        bool(return_lse), None if bias is None else tuple(bias.shape), False)
    try:
        _C.get_backend(config, None if mod is None else mod.graph)
    except InvalidArgumentError as error:
        _problem.add_layout_hint(error, layout, q, k)
        raise

    static = Static(options, "" if mod is None else mod.text, False, bool(return_lse), False,
                    (off_q is not None, off_kv is not None))
    ops = Operands(q, k, v, bias, alibi_slopes, sinks, lengths_q, lengths_kv, cu_q, cu_kv, off_q,
                   off_kv, dropout, mod_tensors)
    out = _attention(static, ops)
    if return_lse:
        o, lse = out
        return o, jax.lax.stop_gradient(lse)
    return out


def _check_operands(layout, dims, q, k, v, bias, alibi_slopes, sinks, lengths_q, lengths_kv,
                    cu_q, cu_kv, off_q, off_kv, mod, mod_tensors):
    """The arrays' shapes and dtypes against the problem's dimensions (the config the library
    checks at trace time holds no array)."""
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise InvalidArgumentError("%s has dtype %s but q has %s: q, k and v share one dtype"
                                       % (name, x.dtype, q.dtype))
    if layout == "thd":
        kv_tokens = k.shape[0]
        _check_shape("k", k, (kv_tokens, dims.heads_kv, dims.head_dim_qk), "[tokens_kv, heads_kv, "
                     "head_dim of q]")
        _check_shape("v", v, (kv_tokens, dims.heads_kv, v.shape[2]), "[tokens_kv (as k), "
                     "heads_kv, head_dim_v]")
        for name, x in (("cu_seqlens_kv", cu_kv), ("seq_offsets_q", off_q),
                        ("seq_offsets_kv", off_kv)):
            _check_shape(name, x, (dims.batch + 1,), "(as cu_seqlens_q) [batch + 1]")
    else:
        b, s, h = _BSH[layout]
        expected_k = [None] * 4
        expected_k[b], expected_k[s], expected_k[h] = dims.batch, dims.max_seqlen_kv, dims.heads_kv
        _check_shape("k", k, expected_k[:3] + [dims.head_dim_qk],
                     "(q's batch and head_dim, layout %r)" % layout)
        _check_shape("v", v, expected_k[:3] + [v.shape[3]], "(k's batch, seqlen and heads)")
        for name, x in (("lengths_q", lengths_q), ("lengths_kv", lengths_kv)):
            _check_shape(name, x, (dims.batch,), "[batch]")
    for name, x in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        _check_shape(name, x, (dims.heads_q,), "[heads_q]")
    if bias is not None:
        if bias.ndim != 4 or bias.shape[0] not in (1, dims.batch) or \
                bias.shape[1] not in (1, dims.heads_q) or \
                tuple(bias.shape[2:]) != (dims.max_seqlen_q, dims.max_seqlen_kv):
            raise InvalidArgumentError(
                "bias has shape %s but [1|batch, 1|heads_q, max_seqlen_q, max_seqlen_kv] = "
                "[1|%d, 1|%d, %d, %d] is expected" % (list(bias.shape), dims.batch, dims.heads_q,
                                                      dims.max_seqlen_q, dims.max_seqlen_kv))
    if mod is not None:
        extent = {"batch": dims.batch, "head": dims.heads_q, "q_idx": dims.max_seqlen_q,
                  "kv_idx": dims.max_seqlen_kv}
        for name, axes, t in zip(mod.names, _mod_axes(mod.text), mod_tensors):
            _check_shape("score_mod tensor %r" % name, t, [extent[a] for a in axes] or [1],
                         "(indexed by [%s])" % ", ".join(axes))


def _platform_of(x):
    """"cuda" or "cpu": where an array lives (a ShapeDtypeStruct or tracer: JAX's default
    backend)."""
    try:
        devices = x.devices()
    except Exception:  # a tracer or a ShapeDtypeStruct: no devices to ask
        devices = None
    platform = next(iter(devices)).platform if devices else jax.default_backend()
    return "cuda" if platform in ("gpu", "cuda") else "cpu"


def explain(q, k, v, **keywords):
    """Which backend runs this problem and why the ones before it refused, for the forward alone
    and for forward + backward: fusedattn.explain for JAX arrays (or jax.ShapeDtypeStruct), on
    the platform the arrays live on. Takes attention()'s keywords."""
    from . import _api
    keywords.pop("dropout_rng", None)
    keywords.pop("return_lse", None)
    lengths = keywords.pop("lengths_q", None), keywords.pop("lengths_kv", None)
    if lengths != (None, None):
        mask = keywords.get("mask")
        mask_name = "none" if mask is None else str(mask).lower()
        keywords["mask"] = _PADDING_FORM.get(mask_name, mask_name)
    return _api.explain(q, k, v, device=keywords.pop("device", _platform_of(q)), **keywords)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None,
                          is_causal=False, query_seq_lengths=None, key_value_seq_lengths=None,
                          local_window_size=None, implementation=None, return_residual=False):
    """jax.nn.dot_product_attention's signature and semantics, computed by fusedattn: query
    [B, T, N, H] (or [T, N, H]), key and value [B, S, K, H] with K dividing N; bias and the
    boolean mask (True = attend) broadcastable to [B, N, T, S]; bias is added after the scale;
    is_causal is the top-left causal mask; local_window_size (left, right) (or an int for both)
    is relative to i = j; the seq lengths pad queries and keys (padded query rows are 0);
    return_residual adds the log-sum-exp as [B, T, N] in query's dtype.

    implementation: None (the fastest backend that runs the problem), a fusedattn backend's
    name ("cudnn", "flash", "small_seq", "reference": that backend, or an error saying why it
    cannot), or "xla", which calls jax.nn.dot_product_attention itself (for comparisons).

    Differences from jax.nn: a query row that sees no key gives 0 (jax.nn averages the values
    over every key; the residual is then -inf), the mask becomes a 0 / -inf bias of [B|1, N|1,
    T, S] (as large as jax.nn's own), and a window without is_causal where T != S or with seq
    lengths becomes a score modifier (fusedattn.flex mask_mod), since fusedattn's windows are
    bottom-right aligned otherwise.
    """
    if implementation == "xla":
        return jax.nn.dot_product_attention(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=local_window_size, implementation="xla",
            return_residual=return_residual)
    backend = "auto" if implementation is None else str(implementation)
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.ndim != 4:
            raise InvalidArgumentError("%s has shape %s: [B, T|S, N|K, H] or [T|S, N|K, H] is "
                                       "expected" % (name, list(x.shape)))
    B, T, N, _ = query.shape
    S = key.shape[1]
    has_lengths = query_seq_lengths is not None or key_value_seq_lengths is not None

    window, mask_mod = (-1, -1), None
    if local_window_size is not None:
        left, right = ((local_window_size, local_window_size)
                       if isinstance(local_window_size, int) else tuple(local_window_size))
        if is_causal or (T == S and not has_lengths):  # ours is then relative to i = j too
            window = (int(left), int(right))
        else:
            mask_mod = ((_flex.kv_idx >= _flex.q_idx - int(left)) &
                        (_flex.kv_idx <= _flex.q_idx + int(right)))

    def four_d(x, name):
        x = jnp.asarray(x)
        if x.ndim > 4:
            raise InvalidArgumentError("%s has shape %s: broadcastable to [B, N, T, S] is "
                                       "expected" % (name, list(x.shape)))
        return x.reshape((1,) * (4 - x.ndim) + x.shape)

    total = None
    if bias is not None:
        total = four_d(bias, "bias")
        if total.dtype not in (query.dtype, jnp.dtype(jnp.float32)):
            total = total.astype(jnp.float32)
    if mask is not None:
        visible = four_d(mask, "mask")
        if visible.dtype != jnp.bool_:
            raise InvalidArgumentError("mask has dtype %s: a boolean mask (True = attend) is "
                                       "expected; pass additive masks as bias" % visible.dtype)
        additive = jnp.where(visible, 0, -jnp.inf).astype(
            query.dtype if total is None else total.dtype)
        total = additive if total is None else total + additive
    if total is not None:
        target = (B if total.shape[0] != 1 else 1, N if total.shape[1] != 1 else 1, T, S)
        try:
            total = jnp.broadcast_to(total, target)
        except ValueError:
            raise InvalidArgumentError("bias/mask of shape %s does not broadcast to [B, N, T, S] "
                                       "= %s" % (list(total.shape), [B, N, T, S])) from None

    out = attention(query, key, value, layout="bshd", mask="causal" if is_causal else None,
                    window=window, bias=total, bias_type="post_scale", scale=scale,
                    lengths_q=query_seq_lengths, lengths_kv=key_value_seq_lengths,
                    backend=backend, return_lse=return_residual, mask_mod=mask_mod)
    if not return_residual:
        return out[0] if unbatched else out
    o, lse = out
    residual = jnp.transpose(lse, (0, 2, 1)).astype(query.dtype)
    return (o[0], residual[0]) if unbatched else (o, residual)
