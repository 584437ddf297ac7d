"""fusedattn on NumPy arrays (the reference backend on the CPU) against the independent float64
oracle in oracle.py: forward (o, lse) and backward (dq, dk, dv, dbias, dsink) for every feature."""

import numpy as np
import pytest

import fusedattn
from cases import CASES, DTYPE_CASES, Case, check_lse, token_mask
from helpers import TOLERANCE, relative_error
from oracle import Problem, philox4x32_10


def _params():
    for case in CASES:
        yield pytest.param(case, "float32", id="%s-float32" % case.name)
        if case.name in DTYPE_CASES:
            for dtype in ("float16", "bfloat16"):
                yield pytest.param(case, dtype, id="%s-%s" % (case.name, dtype))


@pytest.mark.parametrize("case,dtype", list(_params()))
def test_forward_matches_oracle(case, dtype):
    q, k, v, kwargs = case.make(dtype)
    o, lse = fusedattn.attention(q, k, v, return_lse=True, **kwargs)
    assert o.dtype == q.dtype and o.shape == q.shape[:-1] + (v.shape[-1],)
    ref_o, ref_lse = Problem(**kwargs).forward(q, k, v)
    o64 = np.asarray(o, dtype=np.float64)
    assert not np.isnan(o64).any(), "NaN in o"
    error = relative_error(o64, ref_o)
    assert error < TOLERANCE[dtype], "%s %s: ||o - ref|| / ||ref|| = %.3g" % (case, dtype, error)
    check_lse(lse, ref_lse, kwargs, case.layout)


@pytest.mark.parametrize("case,dtype", list(_params()))
def test_backward_matches_oracle(case, dtype):
    q, k, v, kwargs = case.make(dtype)
    o, lse = fusedattn.attention(q, k, v, return_lse=True, **kwargs)
    rng = np.random.default_rng(1)
    d_o = rng.standard_normal(o.shape).astype(np.float32).astype(o.dtype)
    grads = fusedattn.attention_backward(d_o, q, k, v, o, lse, **kwargs)
    ref = Problem(**kwargs).backward(d_o, q, k, v)
    names = ("dq", "dk", "dv", "dbias", "dsink")
    for name, got, want in zip(names, grads, ref):
        if name == "dbias" and "bias" not in kwargs:
            assert got is None
            continue
        if name == "dsink" and not case.sinks:
            assert got is None
            continue
        got64 = np.asarray(got, dtype=np.float64)
        assert not np.isnan(got64).any(), "NaN in %s" % name
        error = relative_error(got64, want)
        assert error < TOLERANCE[dtype], "%s %s: %s relative error %.3g" % (case, dtype, name,
                                                                           error)


def test_oracle_backward_matches_finite_differences_of_oracle_forward():
    """The oracle's gradients are themselves checked: central differences in float64."""
    case = Case("tiny_everything", batch=1, hq=2, hkv=1, sq=3, skv=4, d=3,
                mask="causal_bottom_right", window=(2, 0), bias="1h", softcap=2.0, sinks=True)
    q, k, v, kwargs = case.make("float32")
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    kwargs["bias"] = kwargs["bias"].astype(np.float64)
    kwargs["sinks"] = kwargs["sinks"].astype(np.float64)
    d_o = np.random.default_rng(2).standard_normal(q.shape[:-1] + (v.shape[-1],))

    def loss():
        o, _ = Problem(**kwargs).forward(q, k, v)
        return float((o * d_o).sum())

    grads = Problem(**kwargs).backward(d_o, q, k, v)
    for name, x, g in (("q", q, grads[0]), ("k", k, grads[1]), ("v", v, grads[2]),
                       ("bias", kwargs["bias"], grads[3]), ("sinks", kwargs["sinks"], grads[4])):
        numeric = np.zeros_like(x)
        for index in np.ndindex(x.shape):
            keep = x[index]
            x[index] = keep + 1e-6
            up = loss()
            x[index] = keep - 1e-6
            down = loss()
            x[index] = keep
            numeric[index] = (up - down) / 2e-6
        np.testing.assert_allclose(g, numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_oracle_philox_matches_random123_known_answers():
    # Random123's kat_vectors: philox4x32_10, counter 0 key 0, and counter/key all ones.
    zero = philox4x32_10(0, 0, 0, 0, 0, 0)
    assert [int(w) for w in zero] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = philox4x32_10(*([0xFFFFFFFF] * 4), 0xFFFFFFFF, 0xFFFFFFFF)
    assert [int(w) for w in ones] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_dropout_depends_on_the_seed_and_is_reproducible():
    q, k, v, kwargs = Case("d", dropout_p=0.5).make("float32")
    kwargs.pop("dropout_seed", None)
    a = fusedattn.attention(q, k, v, dropout_seed=1, **kwargs)
    b = fusedattn.attention(q, k, v, dropout_seed=1, **kwargs)
    c = fusedattn.attention(q, k, v, dropout_seed=2, **kwargs)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def _block_of_whole(rng):
    """A whole problem whose rows see only keys 5..11 (bottom-right causal, window 3: row i sees
    keys i + 5 .. i + 8 of 12), and its block of sequence 1, heads 1..2 and keys 4..11 with the
    block's place in the whole problem's dropout mask: the block holds every key its rows see."""
    q = rng.standard_normal((2, 4, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 12, 4, 8)).astype(np.float32) for _ in range(2))
    d_o = rng.standard_normal((2, 4, 4, 8)).astype(np.float32)
    problem = dict(mask="causal_bottom_right", window=(3, 0), dropout_p=0.4, dropout_seed=7)
    place = fusedattn.DropoutPositions(batch_offset=1, heads=4, head_offset=1, key_offset=4)
    block = tuple(np.ascontiguousarray(x) for x in
                  (q[1:, :, 1:3], k[1:, 4:, 1:3], v[1:, 4:, 1:3], d_o[1:, :, 1:3]))
    return (q, k, v, d_o), block, problem, place


def test_dropout_positions_give_a_block_the_whole_problems_mask_at_its_place():
    (q, k, v, d_o), (bq, bk, bv, bd_o), problem, place = _block_of_whole(np.random.default_rng(3))
    o, lse = fusedattn.attention(q, k, v, return_lse=True, **problem)
    grads = fusedattn.attention_backward(d_o, q, k, v, o, lse, **problem)
    bo, blse = fusedattn.attention(bq, bk, bv, return_lse=True, dropout_positions=place,
                                   **problem)
    bgrads = fusedattn.attention_backward(bd_o, bq, bk, bv, bo, blse, dropout_positions=place,
                                          **problem)
    # The same terms summed in the same order (float64 in the reference): equal, not close.
    assert np.array_equal(bo, o[1:, :, 1:3]) and np.array_equal(blse, lse[1:, 1:3])
    assert np.array_equal(bgrads.dq, grads.dq[1:, :, 1:3])
    assert np.array_equal(bgrads.dk, grads.dk[1:, 4:, 1:3])
    assert np.array_equal(bgrads.dv, grads.dv[1:, 4:, 1:3])
    # At its own positions the block draws another mask.
    assert not np.array_equal(fusedattn.attention(bq, bk, bv, **problem), bo)


def test_dropout_positions_are_checked_by_the_library_naming_the_field():
    q, k, v, kwargs = Case("d", dropout_p=0.5).make("float32")
    with pytest.raises(fusedattn.InvalidArgumentError, match="config.dropout_key_offset = 6"):
        fusedattn.attention(q, k, v, dropout_positions=dict(key_offset=6), **kwargs)
    with pytest.raises(fusedattn.InvalidArgumentError, match="unknown field"):
        fusedattn.attention(q, k, v, dropout_positions=dict(key=4), **kwargs)


def test_fully_masked_rows_give_zero_output_and_negative_infinite_lse():
    q, k, v, kwargs = Case("m", sq=6, skv=3, mask="causal_bottom_right").make("float32")
    o, lse = fusedattn.attention(q, k, v, return_lse=True, **kwargs)
    # Bottom-right: row i sees keys j <= i + 3 - 6, so rows 0..2 see none.
    assert np.all(o[:, :3] == 0)
    assert np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(np.isfinite(lse[:, :, 3:]))
    grads = fusedattn.attention_backward(np.ones_like(o), q, k, v, o, lse, **kwargs)
    assert np.all(grads.dq[:, :3] == 0)


def test_thd_tokens_outside_sequences_are_zero():
    q, k, v, kwargs = Case("g", layout="thd", lens_q=[3, 5], lens_kv=[4, 6],
                           gaps=True).make("float32")
    o = fusedattn.attention(q, k, v, **kwargs)
    outside = ~token_mask(kwargs, q.shape[0])
    assert outside.any() and np.all(o[outside] == 0)


def test_thd_max_seqlen_given_or_derived_agree():
    q, k, v, kwargs = CASES[[c.name for c in CASES].index("thd_uneven")].make("float32")
    derived = fusedattn.attention(q, k, v, **kwargs)
    given = fusedattn.attention(q, k, v, max_seqlen_q=7, max_seqlen_kv=9, **kwargs)
    padded = fusedattn.attention(q, k, v, max_seqlen_q=12, max_seqlen_kv=12, **kwargs)
    assert np.array_equal(derived, given)
    assert np.array_equal(derived, padded)


def test_strided_inputs_are_read_through_their_strides():
    q, k, v, kwargs = Case("s", layout="bhsd", mask="causal").make("float32")
    # The same data as non-contiguous bshd views.
    qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    assert not qt.flags.c_contiguous
    strided = fusedattn.attention(qt, kt, vt, mask="causal")
    packed = fusedattn.attention(*(np.ascontiguousarray(x) for x in (qt, kt, vt)), mask="causal")
    assert np.array_equal(strided, packed)


def test_bfloat16_numpy_arrays_return_bfloat16():
    q, k, v, kwargs = Case("b").make("bfloat16")
    o = fusedattn.attention(q, k, v)
    assert o.dtype.name == "bfloat16"


def test_low_level_forward_and_backward_with_a_config_dict_match_attention():
    q, k, v, kwargs = Case("l", mask="causal", hq=4, hkv=2, sinks=True).make("float32")
    o_ref, lse_ref = fusedattn.attention(q, k, v, return_lse=True, **kwargs)
    config = dict(batch=2, heads_q=4, heads_kv=2, max_seqlen_q=7, max_seqlen_kv=9,
                  head_dim_qk=16, head_dim_v=16, qkv_dtype="float32", o_dtype="float32",
                  mask="causal", softmax_type="learnable_sink", is_training=True)
    o = np.full_like(o_ref, np.nan)
    lse = np.full_like(lse_ref, np.nan)
    max_logit = np.full(4, np.nan, dtype=np.float32)
    fusedattn.forward(dict(config, return_max_logit=True), q=q, k=k, v=v, o=o, lse=lse,
                      max_logit=max_logit, sink_logits=kwargs["sinks"])
    assert np.array_equal(o, o_ref) and np.array_equal(lse, lse_ref)
    assert np.all(np.isfinite(max_logit))

    d_o = np.random.default_rng(3).standard_normal(o.shape).astype(np.float32)
    grads = fusedattn.attention_backward(d_o, q, k, v, o, lse, **kwargs)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dsink = np.empty(4, dtype=np.float32)
    fusedattn.backward(config, q=q, k=k, v=v, o=o, lse=lse, d_o=d_o, dq=dq, dk=dk, dv=dv,
                       dsink=dsink, sink_logits=kwargs["sinks"])
    for got, want in ((dq, grads.dq), (dk, grads.dk), (dv, grads.dv), (dsink, grads.dsink)):
        assert np.array_equal(got, want)


def test_make_config_round_trips_through_config_dict():
    config = fusedattn.make_config(batch=3, heads_q=8, mask="causal_bottom_right",
                                   qkv_dtype="float16", backend="reference", deterministic=True)
    fields = fusedattn.config_dict(config)
    assert fields["batch"] == 3 and fields["heads_q"] == 8
    assert fields["mask"] == "causal_bottom_right" and fields["qkv_dtype"] == "float16"
    assert fields["backend"] == "reference" and fields["deterministic"] == 1
    assert fields["window_left"] == -1  # FUSEDATTN_CONFIG_INIT's default
