"""Score modifiers from Python (fusedattn.flex) on NumPy arrays, the reference backend: each
example of flex attention against the built-in feature it expresses (forward and backward), a
document mask and a learnable bias against a NumPy brute force, hand-written derivatives,
structural equality, and the messages of misuse."""

import numpy as np
import pytest

import fusedattn
from fusedattn import flex
from helpers import relative_error

SAME = 1e-6  # both runs compute in double and round once to float32


def make_qkv(batch=2, sq=6, skv=7, hq=4, hkv=2, d=8, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch, skv, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch, skv, hkv, d)).astype(np.float32)
    return q, k, v


def run(q, k, v, **kwargs):
    """(o, lse, Gradients) of attention() and attention_backward() with a fixed d_o."""
    o, lse = fusedattn.attention(q, k, v, return_lse=True, **kwargs)
    d_o = np.random.default_rng(9).standard_normal(o.shape).astype(np.float32)
    grads = fusedattn.attention_backward(d_o, q, k, v, o, lse, **kwargs)
    return o, lse, grads


def assert_same(flex_run, builtin_run, what):
    (o, lse, g), (o_ref, lse_ref, g_ref) = flex_run, builtin_run
    assert relative_error(o, o_ref) < SAME, what + ": o"
    finite = np.isfinite(lse_ref)
    assert np.array_equal(np.isfinite(lse), finite), what + ": masked rows"
    assert relative_error(lse[finite], lse_ref[finite]) < SAME, what + ": lse"
    for name in ("dq", "dk", "dv"):
        assert relative_error(getattr(g, name), getattr(g_ref, name)) < SAME, what + ": " + name


def test_tanh_soft_cap_is_softcap():
    q, k, v = make_qkv()
    assert_same(run(q, k, v, score_mod=0.8 * flex.tanh(flex.score / 0.8)),
                run(q, k, v, softcap=0.8), "soft-cap")


def test_causal_by_index_is_the_causal_mask():
    q, k, v = make_qkv()
    assert_same(run(q, k, v, mask_mod=flex.q_idx >= flex.kv_idx),
                run(q, k, v, mask="causal"), "causal")


def test_bottom_right_causal_by_index_is_causal_bottom_right():
    q, k, v = make_qkv(sq=7, skv=4)  # the first rows see no key
    flex_run = run(q, k, v, mask_mod=flex.q_idx_br >= flex.kv_idx)
    assert_same(flex_run, run(q, k, v, mask="causal_bottom_right"), "causal bottom-right")
    assert np.isneginf(flex_run[1][:, :, 0]).all()


def test_relative_position_bias_is_the_same_bias_as_a_tensor():
    q, k, v = make_qkv()
    i, j = np.arange(6)[:, None], np.arange(7)[None, :]
    bias = np.broadcast_to(0.25 * (i - j), (1, 1, 6, 7)).astype(np.float32).copy()
    assert_same(run(q, k, v, score_mod=flex.score + 0.25 * (flex.q_idx - flex.kv_idx)),
                run(q, k, v, bias=bias), "relative bias")


def test_alibi_from_a_slopes_tensor_is_alibi():
    q, k, v = make_qkv()
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float32)
    slope = flex.Tensor(slopes, name="slopes")[flex.head]
    alibi = flex.score - slope * abs(flex.q_idx_br - flex.kv_idx)
    assert_same(run(q, k, v, score_mod=alibi), run(q, k, v, alibi_slopes=slopes), "ALiBi")


def test_post_scale_bias_tensor_gradient_is_dbias():
    q, k, v = make_qkv()
    bias = np.random.default_rng(3).standard_normal((2, 4, 6, 7)).astype(np.float32)
    table = flex.Tensor(bias, name="bias", requires_grad=True)
    score = flex.score + table[flex.batch, flex.head, flex.q_idx, flex.kv_idx]
    flex_run = run(q, k, v, score_mod=score, mask_mod=flex.q_idx >= flex.kv_idx)
    builtin_run = run(q, k, v, bias=bias, mask="causal")
    assert_same(flex_run, builtin_run, "post-scale bias")
    assert relative_error(flex_run[2].dscore_mod["bias"], builtin_run[2].dbias) < SAME


def test_sliding_window_by_mask_mod_is_the_window():
    q, k, v = make_qkv()
    distance = flex.q_idx_br - flex.kv_idx
    assert_same(run(q, k, v, mask_mod=(distance <= 2) & (distance >= -1)),
                run(q, k, v, window=(2, 1)), "window")


def brute_force(q, k, v, scores_fn, visible_fn):
    """o for BSHD q, k, v (heads_q == heads_kv) with the modified scores and visibility."""
    batch, sq, h, d = q.shape
    s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(d)
    s = scores_fn(s)
    s = np.where(visible_fn(), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p, v.astype(np.float64))


def test_document_mask_from_document_ids_matches_a_brute_force():
    q, k, v = make_qkv(batch=2, sq=8, skv=8, hq=2, hkv=2)
    docs = np.array([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 2, 2]], dtype=np.int32)
    doc = flex.Tensor(docs, name="doc")
    same_doc = doc[flex.batch, flex.q_idx] == doc[flex.batch, flex.kv_idx]
    o = fusedattn.attention(q, k, v, mask_mod=same_doc & (flex.q_idx >= flex.kv_idx))
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    visible = (docs[:, None, :, None] == docs[:, None, None, :]) & (i >= j)
    assert relative_error(o, brute_force(q, k, v, lambda s: s, lambda: visible)) < 1e-6


def test_learnable_tensor_gradient_matches_finite_differences():
    q, k, v = make_qkv(batch=1, sq=4, skv=5, hq=2, hkv=2, d=4)
    temperature = np.array([0.25, -0.5], dtype=np.float32)
    tensor = flex.Tensor(temperature, name="temperature", requires_grad=True)
    score = flex.score * flex.exp(tensor[flex.head])
    d_o = np.random.default_rng(2).standard_normal((1, 4, 2, 4)).astype(np.float32)

    def loss(t):
        mod = flex.Tensor(t, name="temperature")
        o = fusedattn.attention(q, k, v, score_mod=flex.score * flex.exp(mod[flex.head]))
        return float(np.sum(o.astype(np.float64) * d_o))

    o, lse = fusedattn.attention(q, k, v, return_lse=True, score_mod=score)
    got = fusedattn.attention_backward(d_o, q, k, v, o, lse, score_mod=score)
    eps = 1.0 / 256
    for h in range(2):
        up, down = temperature.copy(), temperature.copy()
        up[h] += eps
        down[h] -= eps
        fd = (loss(up) - loss(down)) / (2 * eps)
        assert abs(got.dscore_mod["temperature"][h] - fd) < 1e-3 * max(1.0, abs(fd)), h


def test_a_hand_written_derivative_gives_the_derived_gradients():
    q, k, v = make_qkv()
    t = flex.tanh(flex.score / 2)
    given = flex.ScoreMod(score=2 * t, gradients={flex.score: 1 - t * t})
    derived = flex.ScoreMod(score=2 * t)
    assert "(given)" in given.describe() and "(derived)" in derived.describe()
    assert given != derived  # the explicit backward is part of the graph
    a, b = run(q, k, v, score_mod=given), run(q, k, v, score_mod=derived)
    assert_same(a, b, "explicit backward")


def test_equal_expressions_make_equal_score_mods():
    make = lambda c: flex.ScoreMod(score=c * flex.tanh(flex.score / c),  # noqa: E731
                                   mask=flex.q_idx >= flex.kv_idx)
    assert make(30.0) == make(30.0)
    assert hash(make(30.0)) == hash(make(30.0))
    assert make(30.0) != make(np.nextafter(30.0, 31.0))
    assert flex.ScoreMod(score=flex.score + 0.0) != flex.ScoreMod(score=flex.score + -0.0)


def test_an_expression_has_no_truth_value():
    with pytest.raises(TypeError, match="no truth value"):
        if flex.q_idx >= flex.kv_idx:
            pass


def test_python_functions_are_not_traced():
    q, k, v = make_qkv()
    with pytest.raises(fusedattn.InvalidArgumentError, match="Python functions are not traced"):
        fusedattn.attention(q, k, v, score_mod=lambda s, b, h, i, j: s)


def test_type_errors_come_from_the_library():
    with pytest.raises(fusedattn.InvalidArgumentError, match="operand 0 is a boolean"):
        flex.ScoreMod(score=(flex.q_idx >= flex.kv_idx) * 2)
    with pytest.raises(fusedattn.InvalidArgumentError, match="reads the score s"):
        flex.ScoreMod(mask=flex.score > 0)


def test_tensors_are_indexed_by_the_index_inputs_in_order():
    t = flex.Tensor(np.zeros((4, 6), np.float32), name="t")
    with pytest.raises(fusedattn.InvalidArgumentError, match="in that order"):
        t[flex.q_idx, flex.head]
    with pytest.raises(fusedattn.InvalidArgumentError, match="index it by flex.batch"):
        t[flex.q_idx_br]


def test_a_tensor_of_the_wrong_shape_is_named():
    q, k, v = make_qkv()
    bias = flex.Tensor(np.zeros((4, 5), np.float32), name="bias")  # [heads, kv] wants [4, 7]
    with pytest.raises(fusedattn.InvalidArgumentError, match=r"\('bias'\).shape = \[4, 5\]"):
        fusedattn.attention(q, k, v, score_mod=flex.score + bias[flex.head, flex.kv_idx])


def test_explain_names_the_reference_for_score_mods():
    q, k, v = make_qkv()
    text = fusedattn.explain(q, k, v, mask_mod=flex.q_idx >= flex.kv_idx)
    assert text.startswith("forward: reference"), text


def test_a_bfloat16_tensor_is_read_as_its_values():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = make_qkv()
    bias = np.random.default_rng(4).standard_normal((4, 6, 7)).astype(ml_dtypes.bfloat16)
    table = flex.Tensor(bias, name="bias")
    as_float = bias.astype(np.float32)[None]
    assert_same(run(q, k, v, score_mod=flex.score + table[flex.head, flex.q_idx, flex.kv_idx]),
                run(q, k, v, bias=as_float), "bfloat16 bias tensor")
