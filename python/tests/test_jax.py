"""fusedattn.jax on the CPU (the reference backend through the same XLA FFI targets the GPU runs):
forward and gradients against the float64 oracle for every feature, jit, vmap, sharding over
host-platform devices, score modifiers, dropout, dot_product_attention against jax.nn, and the
errors. Skipped when jax is not installed.

FUSEDATTN_TEST_JAX_BACKEND=auto|cudnn|flash|small_seq (the GPU machine: gpu_run.sh jax_tests)
puts the oracle cases' arrays on the GPU and forces that backend (auto: the library's choice),
in float32, float16 and bfloat16; cases the backend refuses are skipped with its reason. Dropout
cases compare with the oracle's Philox mask, except where cuDNN runs them: its mask is its own
random stream, so the test reads that mask from the same call with one-hot values and checks
the oracle's results with it (forward, and the backward's use of its forward's mask), its
scaling and its keep fraction. The other tests run where JAX's default device is (run them with
JAX_PLATFORMS=cpu there)."""

import functools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import fusedattn  # noqa: E402
import fusedattn.jax as fj  # noqa: E402
from fusedattn import flex  # noqa: E402
from cases import CASES, DTYPE_CASES, Case, check_lse  # noqa: E402
from helpers import TOLERANCE, relative_error  # noqa: E402
from oracle import Problem  # noqa: E402

# Which backend the oracle cases run on, and where: the reference on the CPU by default.
BACKEND = os.environ.get("FUSEDATTN_TEST_JAX_BACKEND")
DEVICE = jax.devices("gpu")[0] if BACKEND else jax.devices("cpu")[0]

# The keyword arguments of a case that are arrays (operands under jit); the rest are static.
ARRAYS = ("bias", "alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q",
          "seq_offsets_kv", "lengths_q", "lengths_kv")


def seed_of(key):
    """The Philox seed fusedattn.jax draws from a dropout key (64 bits, offset 0)."""
    words = np.asarray(jax.random.bits(key, (2,), jnp.uint32)).astype(np.uint64)
    return int(words[0] | (words[1] << np.uint64(32)))


def split(kwargs):
    """(arrays on DEVICE, static keywords, oracle keywords) of a case's attention() kwargs:
    dropout_seed becomes a dropout_rng key whose seed the oracle gets; THD gets max_seqlen as
    ints (needed under jit)."""
    static, arrays, oracle = {}, {}, dict(kwargs)
    for name, value in kwargs.items():
        if name in ARRAYS:
            arrays[name] = jax.device_put(jnp.asarray(value), DEVICE)
        elif name != "dropout_seed":
            static[name] = value
    if kwargs.get("dropout_p", 0) > 0:
        key = jax.random.key(kwargs.get("dropout_seed", 0) % 2**31)
        arrays["dropout_rng"] = key
        oracle["dropout_seed"] = seed_of(key)
    if kwargs.get("layout") == "thd":
        for side in ("q", "kv"):
            cu = np.asarray(kwargs["cu_seqlens_" + side])
            static.setdefault("max_seqlen_" + side, int(np.diff(cu).max()))
    if BACKEND:
        static["backend"] = BACKEND
    return arrays, static, oracle


def selection(q, k, v, arrays, static, direction):
    """The library's diagnostic for the case on DEVICE, direction "forward" or
    "forward+backward": the backend that runs it first, then why the ones before it refused."""
    line = [text for text in fj.explain(*on_device(q, k, v), **arrays, **static).splitlines()
            if text.startswith(direction + ":")][0]
    return line[len(direction) + 1:].strip()


def skip_unless_backend_runs(q, k, v, arrays, static, direction):
    """Skips (saying why) when the forced backend refuses the case on the GPU (auto always has
    one: the reference backend runs every problem)."""
    if BACKEND in (None, "auto"):
        return
    diagnostic = selection(q, k, v, arrays, static, direction)
    if not diagnostic.startswith(BACKEND):
        pytest.skip(("%s: %s" % (direction, diagnostic))[:300])


# Backends whose dropout draws its own random stream, not the header's Philox mask
# (include/fusedattn/fusedattn.h, "Dropout mask"): cuDNN. The others (reference, flash,
# small_seq) reproduce the reference's mask bit for bit and are compared with it as it is.
OWN_DROPOUT_STREAM = ("cudnn",)


def draws_own_dropout_mask(q, k, v, arrays, static, direction, kwargs):
    """Whether the case has dropout and the backend that runs it draws its own mask."""
    return kwargs.get("dropout_p", 0) > 0 and \
        selection(q, k, v, arrays, static, direction).startswith(OWN_DROPOUT_STREAM)


def key_positions(layout, shape, kwargs):
    """Each key token's position in its sequence for an array of v's shape without its last
    axis (-1 for THD tokens outside every sequence)."""
    if layout == "thd":
        cu = np.asarray(kwargs["cu_seqlens_kv"])
        starts = np.asarray(kwargs.get("seq_offsets_kv", cu))
        positions = np.full(shape[0], -1)
        for b in range(len(cu) - 1):
            positions[starts[b]:starts[b] + cu[b + 1] - cu[b]] = np.arange(cu[b + 1] - cu[b])
        return np.broadcast_to(positions[:, None], shape)
    axis = {"bshd": 1, "sbhd": 0, "bhsd": 2}[layout]
    index = [None] * len(shape)
    index[axis] = slice(None)
    return np.broadcast_to(np.arange(shape[axis])[tuple(index)], shape)


def own_dropout_keep(output_for, q, k, v, oracle, layout):
    """The dropout mask a backend with its own random stream drew, for the oracle's
    dropout_keep: output_for(v) runs the case (same key, same call) with other values, and
    one-hot values v[key j, feature x] = (x == j) make o[row i, feature j] = P[i, j] * keep[i, j]
    / (1 - p), P the oracle's probabilities without dropout. Checks that every probability is
    either dropped or kept and scaled by 1 / (1 - p), and that the kept fraction is 1 - p within
    its sampling error (5 sigma)."""
    positions = key_positions(layout, v.shape[:-1], oracle)
    assert positions.max() < v.shape[-1], "one-hot values need head_dim_v >= seqlen_kv"
    one_hot = (positions[..., None] == np.arange(v.shape[-1])).astype(v.dtype)
    o = np.asarray(output_for(one_hot), dtype=np.float64)
    p = oracle["dropout_p"]
    without = {name: value for name, value in oracle.items() if not name.startswith("dropout")}
    probabilities, _ = Problem(**without).forward(q, k, one_hot)
    drawn = probabilities > 1e-3  # where the output tells dropped from kept
    ratio = np.where(drawn, o * (1 - p) / np.where(drawn, probabilities, 1), 0.0)
    off = np.minimum(np.abs(ratio), np.abs(ratio - 1))[drawn]
    assert off.max() < 0.1, "an entry neither dropped nor kept with scale 1/(1-p): %.3g" % \
        off.max()
    keep = ratio > 0.5
    kept, draws = keep[drawn].mean(), drawn.sum()
    sigma = np.sqrt(p * (1 - p) / draws)
    assert abs(kept - (1 - p)) < 5 * sigma, "kept %.3f of %d entries, expected %.3f" % (
        kept, draws, 1 - p)
    return keep.astype(np.float64)


def on_device(*xs):
    return [jax.device_put(jnp.asarray(x), DEVICE) for x in xs]


def _params():
    for case in CASES:
        yield pytest.param(case, "float32", id="%s-float32" % case.name)
        if case.name in DTYPE_CASES or BACKEND:
            for dtype in ("float16", "bfloat16"):
                yield pytest.param(case, dtype, id="%s-%s" % (case.name, dtype))


# ---------------------------------------------------------------------------------------------
# Forward and gradients against the oracle
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,dtype", list(_params()))
def test_forward_matches_oracle(case, dtype):
    q, k, v, kwargs = case.make(dtype)
    arrays, static, oracle = split(kwargs)
    skip_unless_backend_runs(q, k, v, arrays, static, "forward")
    run = jax.jit(lambda q, k, v, arrays: fj.attention(q, k, v, return_lse=True, **arrays,
                                                       **static))
    o, lse = run(*on_device(q, k, v), arrays)
    assert o.dtype == q.dtype and o.shape == q.shape[:-1] + (v.shape[-1],)
    if draws_own_dropout_mask(q, k, v, arrays, static, "forward", kwargs):
        oracle["dropout_keep"] = own_dropout_keep(
            lambda values: run(*on_device(q, k, values), arrays)[0], q, k, v, oracle,
            case.layout)
    ref_o, ref_lse = Problem(**oracle).forward(q, k, v)
    o64 = np.asarray(o, dtype=np.float64)
    assert not np.isnan(o64).any(), "NaN in o"
    error = relative_error(o64, ref_o)
    assert error < TOLERANCE[dtype], "%s %s: ||o - ref|| / ||ref|| = %.3g" % (case, dtype, error)
    check_lse(lse, ref_lse, oracle, case.layout)


@pytest.mark.parametrize("case,dtype", list(_params()))
def test_gradients_match_oracle(case, dtype):
    q, k, v, kwargs = case.make(dtype)
    arrays, static, oracle = split(kwargs)
    skip_unless_backend_runs(q, k, v, arrays, static, "forward+backward")
    d_o = np.random.default_rng(1).standard_normal(
        q.shape[:-1] + (v.shape[-1],)).astype(np.float32).astype(q.dtype)
    # Differentiable: q, k, v, and the bias and sinks when the case has them.
    wrt = {name: arrays.pop(name) for name in ("bias", "sinks") if name in arrays}

    def loss(q, k, v, wrt, arrays):
        o = fj.attention(q, k, v, **wrt, **arrays, **static)
        return jnp.sum(o.astype(jnp.float32) * jnp.asarray(d_o, jnp.float32)), o

    run = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
    grads, _ = run(*on_device(q, k, v), wrt, arrays)
    if draws_own_dropout_mask(q, k, v, dict(arrays, **wrt), static, "forward+backward", kwargs):
        # The backward must use the mask its forward drew (the same key, the training forward).
        oracle["dropout_keep"] = own_dropout_keep(
            lambda values: run(*on_device(q, k, values), wrt, arrays)[1], q, k, v, oracle,
            case.layout)
    ref = Problem(**oracle).backward(d_o, q, k, v)
    got = dict(dq=grads[0], dk=grads[1], dv=grads[2], dbias=grads[3].get("bias"),
               dsink=grads[3].get("sinks"))
    for name, want in zip(("dq", "dk", "dv", "dbias", "dsink"), ref):
        if got[name] is None:
            continue
        got64 = np.asarray(got[name], dtype=np.float64)
        assert not np.isnan(got64).any(), "NaN in %s" % name
        error = relative_error(got64, want)
        assert error < TOLERANCE[dtype], "%s %s: %s relative error %.3g" % (case, dtype, name,
                                                                           error)
    assert (got["dbias"] is None) == ("bias" not in kwargs)
    assert (got["dsink"] is None) == (not case.sinks)


def test_results_equal_fusedattn_attention_on_numpy():
    q, k, v, kwargs = Case("e", hq=4, hkv=2, mask="causal", sinks=True, bias="1h",
                           softcap=2.0).make("float32")
    want_o, want_lse = fusedattn.attention(q, k, v, return_lse=True, **kwargs)
    o, lse = fj.attention(q, k, v, return_lse=True, **kwargs)
    assert np.array_equal(np.asarray(o), want_o) and np.array_equal(np.asarray(lse), want_lse)
    d_o = np.random.default_rng(2).standard_normal(o.shape).astype(np.float32)
    want = fusedattn.attention_backward(d_o, q, k, v, want_o, want_lse, **kwargs)
    _, vjp = jax.vjp(lambda q, k, v, b, s: fj.attention(q, k, v, **dict(kwargs, bias=b, sinks=s)),
                     q, k, v, kwargs["bias"], kwargs["sinks"])
    got = vjp(jnp.asarray(d_o))
    for g, w in zip(got, (want.dq, want.dk, want.dv, want.dbias, want.dsink)):
        assert np.array_equal(np.asarray(g), w)


def test_padding_lengths_equal_cu_seqlens_and_give_zero_rows():
    q, k, v, kwargs = Case("p", padding_lens=([5, 7], [9, 3]), mask="padding_causal",
                           sq=7, skv=9).make("float32")
    by_cu = fj.attention(q, k, v, **kwargs)
    by_lengths = fj.attention(q, k, v, mask="causal", lengths_q=jnp.array([5, 7]),
                              lengths_kv=jnp.array([9, 3]))
    assert np.array_equal(np.asarray(by_cu), np.asarray(by_lengths))
    assert np.all(np.asarray(by_lengths)[0, 5:] == 0)  # padded query rows


def test_a_missing_length_is_the_full_length():
    q, k, v, _ = Case("p").make("float32")
    both = fj.attention(q, k, v, lengths_q=jnp.array([4, 7]), lengths_kv=jnp.array([9, 9]))
    one = fj.attention(q, k, v, lengths_q=jnp.array([4, 7]))
    assert np.array_equal(np.asarray(both), np.asarray(one))


def test_thd_max_seqlen_is_read_from_concrete_cu_seqlens():
    q, k, v, kwargs = Case("t", layout="thd", lens_q=[3, 0, 7], lens_kv=[4, 2, 7]).make("float32")
    derived = fj.attention(q, k, v, **kwargs)
    given = fj.attention(q, k, v, max_seqlen_q=7, max_seqlen_kv=7, **kwargs)
    assert np.array_equal(np.asarray(derived), np.asarray(given))
    assert np.array_equal(np.asarray(derived), fusedattn.attention(q, k, v, **kwargs))


def test_thd_tokens_outside_sequences_are_zero_in_outputs_and_gradients():
    q, k, v, kwargs = Case("g", layout="thd", lens_q=[3, 5], lens_kv=[4, 6],
                           gaps=True).make("float32")
    kwargs.update(max_seqlen_q=5, max_seqlen_kv=6)
    o = jax.jit(lambda q, k, v: fj.attention(q, k, v, **kwargs))(q, k, v)
    inside = np.zeros(q.shape[0], bool)
    for b, start in enumerate(kwargs["seq_offsets_q"][:-1]):
        inside[start:start + [3, 5][b]] = True
    assert np.all(np.asarray(o)[~inside] == 0) and np.any(np.asarray(o)[inside] != 0)
    dq = jax.grad(lambda q: fj.attention(q, k, v, **kwargs).sum())(q)
    assert np.all(np.asarray(dq)[~inside] == 0)


def test_lse_is_returned_but_not_differentiated():
    q, k, v, _ = Case("l").make("float32")
    grad = jax.grad(lambda q: fj.attention(q, k, v, return_lse=True)[1].sum())(q)
    assert np.all(np.asarray(grad) == 0)


def test_gradients_through_jax_checkpoint_are_the_same():
    q, k, v, _ = Case("c", mask="causal").make("float32")

    def loss(q):
        return (fj.attention(q, k, v, mask="causal") ** 2).sum()

    policy = jax.checkpoint_policies.save_only_these_names("fusedattn_o", "fusedattn_lse")
    plain = jax.grad(loss)(q)
    remat = jax.grad(jax.checkpoint(loss, policy=policy))(q)
    assert np.array_equal(np.asarray(plain), np.asarray(remat))


# ---------------------------------------------------------------------------------------------
# jit and vmap
# ---------------------------------------------------------------------------------------------

def test_jit_does_not_retrace_on_a_second_call():
    traces = []

    @jax.jit
    def run(q, k, v):
        traces.append(1)
        return fj.attention(q, k, v, mask="causal")

    q, k, v, _ = Case("j").make("float32")
    first = run(q, k, v)
    q2, k2, v2, _ = Case("j").make("float32", seed=5)
    second = run(q2, k2, v2)
    assert len(traces) == 1
    assert not np.array_equal(np.asarray(first), np.asarray(second))


def _stack(*arrays):
    return jnp.stack([jnp.asarray(a) for a in arrays])


VMAP_CASES = [
    Case("vmap_bshd_gqa_bias", hq=4, hkv=2, mask="causal", bias="1h"),
    Case("vmap_sbhd", layout="sbhd", mask="causal_bottom_right"),
    Case("vmap_bhsd_per_sequence_bias", layout="bhsd", bias="b1", bias_type="pre_scale"),
    Case("vmap_padding", padding_lens=([5, 7], [9, 3]), mask="padding"),
    Case("vmap_sinks", sinks=True),  # the sinks' gradient: one call per example
    Case("vmap_thd", layout="thd", lens_q=[3, 5], lens_kv=[4, 6], max_seqlen_q=5,
         max_seqlen_kv=6),  # one call per example
]


@pytest.mark.parametrize("case", VMAP_CASES, ids=repr)
def test_vmap_and_vmap_of_grad_equal_a_loop_with_unmapped_k(case):
    n = 3
    made = [case.make("float32", seed=s) for s in range(n)]
    q = _stack(*(m[0] for m in made))
    v = _stack(*(m[2] for m in made))
    k, kwargs = made[0][1], made[0][3]
    arrays = {name: jnp.asarray(kwargs.pop(name)) for name in ARRAYS if name in kwargs}
    wrt = {name: arrays.pop(name) for name in ("bias", "sinks") if name in arrays}

    def f(q, k, v, wrt):
        return fj.attention(q, k, v, **wrt, **arrays, **kwargs)

    def loss(q, k, v, wrt):
        return jnp.sum(f(q, k, v, wrt) ** 2)

    mapped = jax.jit(jax.vmap(f, in_axes=(0, None, 0, None)))(q, k, v, wrt)
    loop = jnp.stack([f(q[i], k, v[i], wrt) for i in range(n)])
    assert np.array_equal(np.asarray(mapped), np.asarray(loop))
    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)), in_axes=(0, None, 0, None)))(
        q, k, v, wrt)
    looped = [jax.grad(loss, argnums=(0, 1, 2, 3))(q[i], k, v[i], wrt) for i in range(n)]
    for got, want in zip(jax.tree.leaves(grads),
                         jax.tree.leaves(jax.tree.map(lambda *x: jnp.stack(x), *looped))):
        # A bias shared by the batch gets its gradient summed over the sequences by JAX in one
        # case and by the library in the other: equal up to float32 rounding.
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_vmap_of_vmap_and_grad_of_vmap():
    q, k, v, _ = Case("vv").make("float32")
    qs = _stack(*[_stack(q + i, q - i) for i in range(3)])  # [3, 2, batch, ...]

    def f(q):
        return fj.attention(q, k, v, mask="causal")

    nested = jax.vmap(jax.vmap(f))(qs)
    assert np.array_equal(np.asarray(nested[2, 1]), np.asarray(f(qs[2, 1])))
    g = jax.grad(lambda qs: jnp.sum(jax.vmap(jax.vmap(f))(qs) ** 2))(qs)
    want = jax.grad(lambda q: jnp.sum(f(q) ** 2))(qs[1, 0])
    np.testing.assert_allclose(np.asarray(g[1, 0]), np.asarray(want), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Score modifiers
# ---------------------------------------------------------------------------------------------

def test_score_mod_and_mask_mod_equal_fusedattn_attention_on_numpy():
    q, k, v, _ = Case("s", hq=4, hkv=2, sq=8, skv=8).make("float32")
    rel = np.random.default_rng(3).standard_normal((4, 8, 8)).astype(np.float32)
    table = flex.Tensor(rel, name="rel")
    score = flex.score + table[flex.head, flex.q_idx, flex.kv_idx] - 0.1 * abs(
        flex.q_idx - flex.kv_idx)
    mask = (flex.kv_idx <= flex.q_idx + 2)
    want = fusedattn.attention(q, k, v, score_mod=score, mask_mod=mask)
    got = jax.jit(lambda q, k, v: fj.attention(q, k, v, score_mod=score, mask_mod=mask))(q, k, v)
    assert np.array_equal(np.asarray(got), want)


def test_score_mod_tensor_gets_its_gradient_when_jax_differentiates_it():
    q, k, v, _ = Case("s", sq=8, skv=8).make("float32")
    rel = np.random.default_rng(3).standard_normal((4, 8, 8)).astype(np.float32)
    d_o = np.random.default_rng(4).standard_normal(q.shape).astype(np.float32)
    # The numpy path asks for the gradient with requires_grad; JAX decides by differentiating.
    t = flex.Tensor(rel, name="rel", requires_grad=True)
    o, lse = fusedattn.attention(q, k, v, score_mod=flex.score * t[flex.head, flex.q_idx,
                                                                      flex.kv_idx],
                                 return_lse=True, mask="causal")
    want = fusedattn.attention_backward(d_o, q, k, v, o, lse, mask="causal",
                                        score_mod=flex.score * t[flex.head, flex.q_idx,
                                                                 flex.kv_idx])

    def loss(q, rel):
        table = flex.Tensor(rel, name="rel")  # requires_grad not set: JAX asks for it
        o = fj.attention(q, k, v, mask="causal",
                         score_mod=flex.score * table[flex.head, flex.q_idx, flex.kv_idx])
        return jnp.sum(o * d_o)

    dq, drel = jax.jit(jax.grad(loss, argnums=(0, 1)))(q, rel)
    np.testing.assert_allclose(np.asarray(dq), want.dq, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(drel), want.dscore_mod["rel"], rtol=1e-6, atol=1e-7)


def test_score_mod_combines_with_bias_padding_and_window():
    q, k, v, kwargs = Case("c", padding_lens=([5, 7], [9, 3]), mask="padding_causal",
                           bias="1h", window=(4, 0)).make("float32")
    score = 20 * flex.tanh(flex.score / 20)
    want = fusedattn.attention(q, k, v, score_mod=score, **kwargs)
    got = fj.attention(q, k, v, score_mod=score, **kwargs)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_equal_expressions_share_one_cached_graph():
    q, k, v, _ = Case("s").make("float32")

    def run(cap):  # a new expression object on every call
        return fj.attention(q, k, v, score_mod=cap * flex.tanh(flex.score / cap))

    from fusedattn import _jax_ffi
    before = _jax_ffi.graph_cache_size()
    run(17.0)
    after_first = _jax_ffi.graph_cache_size()
    run(17.0)
    jax.jit(run, static_argnums=0)(17.0)
    assert after_first == before + 1
    assert _jax_ffi.graph_cache_size() == after_first
    run(18.0)
    assert _jax_ffi.graph_cache_size() == after_first + 1


def test_vmap_with_a_score_mod_tensor_indexed_by_batch_joins_the_batch():
    q, k, v, _ = Case("s", batch=2, sq=6, skv=6).make("float32")
    docs = np.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 2, 2]], np.int32)

    def f(q, docs):
        d = flex.Tensor(docs, name="docs")
        return fj.attention(q, k, v, mask_mod=d[flex.batch, flex.q_idx] == d[flex.batch,
                                                                               flex.kv_idx])

    qs = _stack(q, q * 2)
    mapped = jax.vmap(f, in_axes=(0, None))(qs, docs)
    assert np.array_equal(np.asarray(mapped[1]), np.asarray(f(qs[1], docs)))
    text = jax.jit(jax.vmap(f, in_axes=(0, None))).lower(qs, docs).as_text()
    assert text.count("fusedattn_fwd_v1") == 1 and "while" not in text


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------

def test_dropout_mask_follows_the_key_and_equals_the_library_mask():
    q, k, v, _ = Case("d").make("float32")
    run = jax.jit(lambda q, key: fj.attention(q, k, v, dropout_p=0.4, dropout_rng=key))
    key = jax.random.key(7)
    a, b = run(q, key), run(q, key)
    c = run(q, jax.random.key(8))
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    want = fusedattn.attention(q, k, v, dropout_p=0.4, dropout_seed=seed_of(key))
    assert np.array_equal(np.asarray(a), want)
    # The old-style uint32[2] keys work too.
    assert run(q, jax.random.PRNGKey(7)).shape == a.shape


def test_dropout_gradients_use_the_forward_mask():
    q, k, v, kwargs = Case("d", dropout_p=0.3).make("float32")
    key = jax.random.key(3)
    d_o = np.random.default_rng(5).standard_normal(q.shape).astype(np.float32)
    _, vjp = jax.vjp(lambda q, k, v: fj.attention(q, k, v, dropout_p=0.3, dropout_rng=key),
                     q, k, v)
    got = vjp(jnp.asarray(d_o))
    ref = Problem(dropout_p=0.3, dropout_seed=seed_of(key)).backward(d_o, q, k, v)
    for g, want in zip(got, ref[:3]):
        assert relative_error(np.asarray(g), want) < 1e-5


def test_dropout_under_vmap_runs_one_call_per_example_with_the_same_key():
    q, k, v, _ = Case("d").make("float32")
    key = jax.random.key(1)
    qs = _stack(q, q)
    mapped = jax.vmap(lambda q: fj.attention(q, k, v, dropout_p=0.5, dropout_rng=key))(qs)
    assert np.array_equal(np.asarray(mapped[0]), np.asarray(mapped[1]))


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make_call,message", [
    (lambda q, k, v: fj.attention(q, k[..., :8], v), "k has shape"),
    (lambda q, k, v: fj.attention(q, k, v, mask="diagonal"), "mask = 'diagonal'"),
    (lambda q, k, v: fj.attention(q, k, v, mask="causal", window=(2, 3)), "window"),
    (lambda q, k, v: fj.attention(q, k, v, dropout_p=0.1), "dropout_rng"),
    (lambda q, k, v: fj.attention(q, k, v, bias=jnp.zeros((3, 1, 7, 9))), "bias has shape"),
    (lambda q, k, v: fj.attention(q, k, v, sinks=jnp.zeros(3)), "sinks has shape"),
    (lambda q, k, v: fj.attention(q, k, v, mask="padding"), "lengths_q"),
    (lambda q, k, v: fj.attention(q, k, v, softmax="sink"), "sinks="),
    (lambda q, k, v: fj.attention(q, k, v, layout="thd"), "needs cu_seqlens_q and cu_seqlens_kv"),
    (lambda q, k, v: fj.attention(q, k, v.astype(jnp.float16)), "dtype"),
])
def test_bad_arguments_raise_when_the_call_is_traced(make_call, message):
    q, k, v, _ = Case("e").make("float32")
    with pytest.raises(fusedattn.InvalidArgumentError, match=message.replace("(", r"\(")):
        jax.jit(make_call).lower(q, k, v)  # tracing alone raises: nothing runs


def test_thd_under_jit_without_max_seqlen_says_what_to_give():
    q, k, v, kwargs = Case("t", layout="thd", lens_q=[3, 5], lens_kv=[4, 6]).make("float32")
    cu_q, cu_kv = kwargs["cu_seqlens_q"], kwargs["cu_seqlens_kv"]
    with pytest.raises(fusedattn.InvalidArgumentError, match="max_seqlen_q and max_seqlen_kv"):
        jax.jit(lambda q, k, v, a, b: fj.attention(q, k, v, layout="thd", cu_seqlens_q=a,
                                                   cu_seqlens_kv=b)).lower(q, k, v, cu_q, cu_kv)


def test_a_backend_that_cannot_run_raises_with_the_library_message_at_run_time():
    q, k, v, _ = Case("e").make("float32")
    if "available" in fusedattn.backends()["cudnn"] and jax.default_backend() == "gpu":
        pytest.skip("cuDNN runs here")
    with pytest.raises(Exception, match=r"fusedattn \(not supported\).*cudnn"):
        jax.block_until_ready(fj.attention(q, k, v, backend="cudnn"))


def test_import_fusedattn_does_not_import_jax():
    code = "import sys, fusedattn; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_explain_takes_jax_arrays_and_shapes():
    q, k, v, _ = Case("x").make("bfloat16")
    text = fj.explain(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask="causal",
                      lengths_q=jnp.array([3, 7]))
    assert text.startswith("forward: reference") and "forward+backward: reference" in text
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    assert "reference" in fj.explain(*shapes)
    assert fj.available()


# ---------------------------------------------------------------------------------------------
# dot_product_attention against jax.nn's
# ---------------------------------------------------------------------------------------------

DPA_CASES = {
    "plain": dict(),
    "causal_gqa": dict(is_causal=True, heads_kv=2),
    "causal_t_gt_s": dict(is_causal=True, t=9, s=5),
    "bias_and_mask": dict(bias=True, mask=True),
    "seq_lengths": dict(lengths=True),
    "causal_seq_lengths": dict(is_causal=True, lengths=True),
    "window_t_eq_s": dict(local_window_size=(2, 1), t=8, s=8),
    "window_causal_t_ne_s": dict(local_window_size=(3, 0), is_causal=True, t=6, s=9),
    "window_t_ne_s_as_mask_mod": dict(local_window_size=(2, 3), t=6, s=9),
    "window_with_lengths_as_mask_mod": dict(local_window_size=2, t=8, s=8, lengths=True,
                                            shorter_kv=1),
    "unbatched": dict(unbatched=True),
}


@pytest.mark.parametrize("name", list(DPA_CASES))
def test_dot_product_attention_matches_jax_nn(name):
    c = DPA_CASES[name]
    rng = np.random.default_rng(0)
    B, T, S, N, K, H = 2, c.get("t", 7), c.get("s", 9), 4, c.get("heads_kv", 4), 16
    q = rng.standard_normal((B, T, N, H)).astype(np.float32)
    k = rng.standard_normal((B, S, K, H)).astype(np.float32)
    v = rng.standard_normal((B, S, K, H)).astype(np.float32)
    kwargs = dict(is_causal=c.get("is_causal", False), local_window_size=c.get("local_window_size"))
    if c.get("bias"):
        kwargs["bias"] = rng.standard_normal((1, N, T, S)).astype(np.float32)
    if c.get("mask"):
        kwargs["mask"] = rng.random((B, 1, T, S)) > 0.2
    if c.get("lengths"):
        kwargs.update(query_seq_lengths=jnp.array([T - 2, T], jnp.int32),
                      key_value_seq_lengths=jnp.array([S, S - c.get("shorter_kv", 3)],
                                                      jnp.int32))
    if c.get("unbatched"):
        q, k, v = q[0], k[0], v[0]
    def ours(q, k, v, **extra):
        return fj.dot_product_attention(q, k, v, **kwargs, **extra)

    def theirs(q, k, v, **extra):
        return jax.nn.dot_product_attention(q, k, v, implementation="xla", **kwargs, **extra)

    got, got_lse = jax.jit(functools.partial(ours, return_residual=True))(q, k, v)
    want, want_lse = jax.jit(functools.partial(theirs, return_residual=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
    assert got_lse.shape == want_lse.shape and got_lse.dtype == want_lse.dtype
    # Padded query rows have no key: -inf here, a large negative number's log-sum-exp in jax.nn.
    got_lse, want_lse = np.asarray(got_lse), np.asarray(want_lse)
    padded = np.isneginf(got_lse)
    if "query_seq_lengths" in kwargs:
        assert np.array_equal(padded[0, T - 2:], np.ones_like(padded[0, T - 2:]))
    assert padded.sum() == (2 * N if "query_seq_lengths" in kwargs else 0)
    np.testing.assert_allclose(got_lse[~padded], want_lse[~padded], rtol=2e-5, atol=2e-5)
    d_o = rng.standard_normal(np.shape(q)).astype(np.float32)

    def grad(f):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * d_o), argnums=(0, 1, 2)))

    for g, w in zip(grad(ours)(q, k, v), grad(theirs)(q, k, v)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def test_dot_product_attention_xla_is_jax_nn_itself():
    q, k, v = (np.random.default_rng(0).standard_normal((1, 4, 2, 8)).astype(np.float32)
               for _ in range(3))
    got = fj.dot_product_attention(q, k, v, implementation="xla", is_causal=True)
    want = jax.nn.dot_product_attention(q, k, v, implementation="xla", is_causal=True)
    assert np.array_equal(np.asarray(got), np.asarray(want))


def test_dot_product_attention_rows_without_keys_give_zero():
    q, k, v = (np.random.default_rng(0).standard_normal((1, 4, 2, 8)).astype(np.float32)
               for _ in range(3))
    mask = np.ones((1, 1, 4, 4), bool)
    mask[..., 1, :] = False  # query row 1 sees no key
    o = np.asarray(fj.dot_product_attention(q, k, v, mask=mask))
    assert np.all(o[0, 1] == 0) and np.all(np.isfinite(o))


# ---------------------------------------------------------------------------------------------
# Sharding over four host-platform devices (a subprocess: the device count is set at start-up)
# ---------------------------------------------------------------------------------------------

_SHARDING_SCRIPT = textwrap.dedent('''
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"  # also on a machine with a GPU
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import fusedattn.jax as fj

    rng = np.random.default_rng(0)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    results = {}

    def arrays(batch, hq, hkv, sq=8, skv=9, d=16):
        return [rng.standard_normal(s).astype(np.float32)
                for s in ((batch, sq, hq, d), (batch, skv, hkv, d), (batch, skv, hkv, d))]

    def check(name, spec, q, k, v, kv_spec=None, **kwargs):
        wrt = {n: kwargs.pop(n) for n in ("bias", "sinks") if n in kwargs}
        def loss(q, k, v, wrt):
            return jnp.sum(fj.attention(q, k, v, **wrt, **kwargs) ** 2)
        fwd = jax.jit(lambda q, k, v, wrt: fj.attention(q, k, v, **wrt, **kwargs))
        bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        sharded = [jax.device_put(x, NamedSharding(mesh, s))
                   for x, s in ((q, spec), (k, kv_spec or spec), (v, kv_spec or spec))]
        out = {}
        for label, f in (("forward", fwd), ("gradients", bwd)):
            want, got = f(q, k, v, wrt), f(*sharded, wrt)
            out[label + "_error"] = max(float(jnp.abs(a - b).max()) for a, b in
                                        zip(jax.tree.leaves(want), jax.tree.leaves(got)))
            hlo = f.lower(*sharded, wrt).compile().as_text()
            out[label + "_all_gather"] = "all-gather" in hlo
            out[label + "_calls"] = [l.split("=")[1].split("custom-call(")[0].strip()
                                     for l in hlo.splitlines()
                                     if "fusedattn_" in l and "custom-call(" in l]
        out["output_spec"] = repr(tuple(fwd(*sharded, wrt).sharding.spec))
        results[name] = out

    q, k, v = arrays(4, 4, 2)
    check("batch_and_heads", P("data", None, "model", None), q, k, v, mask="causal")
    check("batch_over_both_axes", P(("data", "model"), None, None, None), q, k, v)
    q, k, v = arrays(4, 4, 1)  # MQA: heads_kv = 1 cannot shard, heads are made whole
    check("mqa_heads_whole", P("data", None, "model", None), q, k, v,
          kv_spec=P("data", None, None, None))
    q, k, v = arrays(4, 4, 4)
    check("bias_shared_by_batch", P("data", None, "model", None), q, k, v,
          bias=rng.standard_normal((1, 4, 8, 9)).astype(np.float32))
    check("sinks", P("data", None, "model", None), q, k, v,
          sinks=rng.standard_normal(4).astype(np.float32))
    check("sequence_sharded_is_gathered", P(None, "data", None, None), q, k, v,
          kv_spec=P(None, None, None, None))
    check("lengths", P("data", None, "model", None), q, k, v, mask="causal",
          lengths_q=jnp.array([8, 3, 5, 0]), lengths_kv=jnp.array([9, 4, 2, 9]))
    # A score_mod tensor without a head axis: its gradient is summed over the head shards.
    from fusedattn import flex
    def table_loss(q, k, v, table):
        t = flex.Tensor(table, name="per_token")
        o = fj.attention(q, k, v, score_mod=flex.score * t[flex.batch, flex.kv_idx])
        return jnp.sum(o ** 2)
    table = rng.standard_normal((4, 9)).astype(np.float32)
    grad = jax.jit(jax.grad(table_loss, argnums=(0, 3)))
    spec = P("data", None, "model", None)
    sharded = [jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v)]
    table_sharded = jax.device_put(table, NamedSharding(mesh, P("data", None)))
    want, got = grad(q, k, v, table), grad(*sharded, table_sharded)
    hlo = grad.lower(*sharded, table_sharded).compile().as_text()
    results["score_mod_tensor_without_head_axis"] = dict(
        gradients_error=max(float(jnp.abs(a - b).max()) for a, b in zip(want, got)),
        gradients_all_gather="all-gather" in hlo, reduced="all-reduce" in hlo)

    def thd(q, k, v):
        return dict(layout="thd", cu_seqlens_q=jnp.array([0, 5, 8, 16, 32]),
                    cu_seqlens_kv=jnp.array([0, 9, 18, 20, 36]), max_seqlen_q=16,
                    max_seqlen_kv=16)
    tq, tk, tv = (x.reshape((-1,) + x.shape[2:]) for x in (q, k, v))
    check("thd_runs_whole", P(None, "model", None), tq, tk, tv, **thd(tq, tk, tv))

    drop = jax.jit(lambda q, k, v, key: fj.attention(q, k, v, dropout_p=0.3, dropout_rng=key))
    sharded = [jax.device_put(x, NamedSharding(mesh, P("data", None, "model", None)))
               for x in (q, k, v)]
    key = jax.random.key(0)
    a, b = drop(*sharded, key), drop(*sharded, key)
    results["dropout"] = dict(repeatable=bool(jnp.array_equal(a, b)),
                              finite=bool(jnp.isfinite(a).all()))

    inside = jax.jit(jax.shard_map(lambda q, k, v: fj.attention(q, k, v, mask="causal"),
                                   mesh=mesh, in_specs=P("data", None, "model", None),
                                   out_specs=P("data", None, "model", None)))
    results["shard_map_error"] = float(jnp.abs(
        inside(q, k, v) - fj.attention(q, k, v, mask="causal")).max())
    print(json.dumps(results))
''')


@pytest.fixture(scope="module")
def sharding_results():
    out = subprocess.run([sys.executable, "-c", _SHARDING_SCRIPT], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["batch_and_heads", "batch_over_both_axes",
                                  "bias_shared_by_batch", "sinks", "lengths"])
def test_sharded_run_equals_unsharded_without_gathering_batch_or_heads(sharding_results, name):
    r = sharding_results[name]
    assert r["forward_error"] <= 1e-6 and r["gradients_error"] <= 1e-5, r
    assert not r["forward_all_gather"] and not r["gradients_all_gather"], r
    # Each device's custom call sees its own part: a quarter of the batch x heads.
    assert all(shape.startswith(("(f32[1,8,", "(f32[2,8,")) for shape in r["forward_calls"]), r


def test_sharded_heads_keep_their_sharding_and_mqa_heads_are_whole(sharding_results):
    assert sharding_results["batch_and_heads"]["output_spec"] == "('data', None, 'model')"
    # heads_kv = 1 does not divide over 2 shards: each call gets all 4 query heads.
    r = sharding_results["mqa_heads_whole"]
    assert r["forward_error"] <= 1e-6 and r["gradients_error"] <= 1e-5, r
    assert r["forward_calls"] and all(s.startswith("(f32[2,8,4,") for s in r["forward_calls"]), r


def test_a_score_mod_tensor_gradient_is_summed_over_head_shards(sharding_results):
    r = sharding_results["score_mod_tensor_without_head_axis"]
    assert r["gradients_error"] <= 1e-5 and not r["gradients_all_gather"] and r["reduced"], r


@pytest.mark.parametrize("name", ["sequence_sharded_is_gathered", "thd_runs_whole"])
def test_what_cannot_stay_sharded_is_made_whole_and_stays_right(sharding_results, name):
    r = sharding_results[name]
    assert r["forward_error"] <= 1e-6 and r["gradients_error"] <= 1e-5, r
    assert r["forward_calls"] and all(s.startswith(("(f32[4,8,4,", "(f32[32,4,"))
                                      for s in r["forward_calls"]), r


def test_sharded_dropout_is_repeatable_and_shard_map_runs_local_parts(sharding_results):
    assert sharding_results["dropout"] == dict(repeatable=True, finite=True)
    assert sharding_results["shard_map_error"] <= 1e-6


# ---------------------------------------------------------------------------------------------
# The GPU benchmark's harness (bench/jax_bench.py), dry run on the CPU
# ---------------------------------------------------------------------------------------------

def test_jax_bench_dry_run_writes_its_tables(tmp_path):
    bench_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
    sys.path.insert(0, bench_dir)
    try:
        import jax_bench
    finally:
        sys.path.remove(bench_dir)
    assert jax_bench.main(["--grid", "smoke", "--platform", "cpu", "--quick",
                           "--out", str(tmp_path)]) == 0
    [md] = tmp_path.glob("jax-smoke-cpu-*.md")
    [js] = tmp_path.glob("jax-smoke-cpu-*.json")
    data = json.loads(js.read_text())
    assert len(data["rows"]) == 4 and all(c["reference_o"] == 0 for c in data["checks"].values())
    ours = [row["impls"]["fusedattn.jax"] for row in data["rows"]]
    assert all(e["status"] == "ok" and e["device"]["time_ms"] > 0 for e in ours)
    assert all(row["impls"]["jax.nn:xla"]["status"] == "ok" for row in data["rows"])
    text = md.read_text()
    assert "Back to back" in text and "Device only" in text and "(reference)" in text
