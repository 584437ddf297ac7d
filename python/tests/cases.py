"""The attention problems the tests share: shapes and attention()'s arguments for every feature
(layouts, masks, windows, GQA, bias, ALiBi, softcap, sinks, off-by-one, padding, THD, dropout),
made with fresh random inputs in a dtype."""

import numpy as np

from helpers import numpy_dtype


class Case:
    """One problem: shapes, and attention()'s arguments. bias: None, "1h" ([1, heads, sq, skv]) or
    "b1" ([batch, 1, sq, skv]). THD cases give per-sequence lengths (lens_q, lens_kv)."""

    def __init__(self, name, batch=2, sq=7, skv=9, hq=4, hkv=4, d=16, dv=None, layout="bshd",
                 bias=None, alibi=False, sinks=False, lens_q=None, lens_kv=None, gaps=False,
                 padding_lens=None, input_scale=1.0, **kwargs):
        self.name, self.batch, self.sq, self.skv = name, batch, sq, skv
        self.hq, self.hkv, self.d, self.dv = hq, hkv, d, dv or d
        self.layout, self.bias, self.alibi, self.sinks = layout, bias, alibi, sinks
        self.lens_q, self.lens_kv, self.gaps = lens_q, lens_kv, gaps
        self.padding_lens, self.input_scale, self.kwargs = padding_lens, input_scale, kwargs

    def __repr__(self):
        return self.name

    def make(self, dtype, seed=0):
        """(q, k, v, attention kwargs) with fresh random inputs in dtype."""
        rng = np.random.default_rng(seed)
        dt = numpy_dtype(dtype)

        def tensor(shape, scale=1.0):
            return (scale * rng.standard_normal(shape)).astype(np.float32).astype(dt)

        kwargs = dict(self.kwargs, layout=self.layout)
        if self.layout == "thd":
            batch = len(self.lens_q)
            cu_q = np.concatenate([[0], np.cumsum(self.lens_q)]).astype(np.int32)
            cu_kv = np.concatenate([[0], np.cumsum(self.lens_kv)]).astype(np.int32)
            tokens_q, tokens_kv = int(cu_q[-1]), int(cu_kv[-1])
            if self.gaps:  # two unused tokens before every sequence, one at the end
                off_q = (cu_q + 2 * np.arange(batch + 1)).astype(np.int32)
                off_kv = (cu_kv + 2 * np.arange(batch + 1)).astype(np.int32)
                tokens_q, tokens_kv = int(off_q[-1]) + 1, int(off_kv[-1]) + 1
                kwargs.update(seq_offsets_q=off_q, seq_offsets_kv=off_kv)
            kwargs.update(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
            q_shape, k_shape = (tokens_q, self.hq, self.d), (tokens_kv, self.hkv, self.d)
            v_shape = (tokens_kv, self.hkv, self.dv)
            sq, skv = max(self.lens_q), max(self.lens_kv)
        else:
            batch, sq, skv = self.batch, self.sq, self.skv
            shape = {"bshd": lambda s, h, d: (batch, s, h, d),
                     "sbhd": lambda s, h, d: (s, batch, h, d),
                     "bhsd": lambda s, h, d: (batch, h, s, d)}[self.layout]
            q_shape, k_shape, v_shape = (shape(sq, self.hq, self.d), shape(skv, self.hkv, self.d),
                                         shape(skv, self.hkv, self.dv))
            if self.padding_lens is not None:
                lens_q, lens_kv = self.padding_lens
                kwargs.update(
                    cu_seqlens_q=np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32),
                    cu_seqlens_kv=np.concatenate([[0], np.cumsum(lens_kv)]).astype(np.int32))
        q = tensor(q_shape, self.input_scale)
        k = tensor(k_shape, self.input_scale)
        v = tensor(v_shape)
        if self.bias == "1h":
            kwargs["bias"] = tensor((1, self.hq, sq, skv))
        elif self.bias == "b1":
            kwargs["bias"] = tensor((batch, 1, sq, skv))
        if self.alibi:
            kwargs["alibi_slopes"] = (0.5 ** np.arange(1, self.hq + 1)).astype(np.float32)
        if self.sinks:
            kwargs["sinks"] = rng.standard_normal(self.hq).astype(np.float32)
        return q, k, v, kwargs


CASES = [
    Case("plain"),
    Case("causal_top_left_sq_lt_skv", sq=5, skv=9, mask="causal"),
    Case("causal_top_left_sq_gt_skv", sq=9, skv=5, mask="causal"),
    Case("causal_bottom_right", sq=5, skv=9, mask="causal_bottom_right"),
    Case("causal_bottom_right_fully_masked_rows", sq=9, skv=5, mask="causal_bottom_right"),
    Case("window_without_causal", sq=8, skv=8, window=(3, 2)),
    Case("window_causal", sq=8, skv=11, mask="causal", window=(4, 0)),
    Case("gqa", hq=6, hkv=2),
    Case("mqa_causal", hq=4, hkv=1, mask="causal"),
    Case("layout_sbhd", layout="sbhd", mask="causal"),
    Case("layout_bhsd", layout="bhsd", hq=4, hkv=2),
    Case("head_dim_v_differs", d=16, dv=8),
    Case("bias_post_scale", bias="1h"),
    Case("bias_pre_scale_per_batch", bias="b1", bias_type="pre_scale", mask="causal"),
    Case("alibi", alibi=True, mask="causal_bottom_right", sq=6, skv=9),
    Case("softcap", softcap=2.0, input_scale=2.0),
    Case("sinks", sinks=True),
    Case("off_by_one", softmax="off_by_one"),
    Case("scale", scale=0.3),
    Case("padding_bshd", padding_lens=([5, 7], [9, 3]), mask="padding"),
    Case("padding_causal_bshd", padding_lens=([5, 7], [9, 3]), mask="padding_causal"),
    Case("thd_uneven", layout="thd", lens_q=[3, 0, 7, 5], lens_kv=[4, 2, 7, 9], hq=4, hkv=2),
    Case("thd_causal", layout="thd", lens_q=[3, 6, 7], lens_kv=[3, 6, 7], mask="causal"),
    Case("thd_bottom_right_window", layout="thd", lens_q=[2, 5, 4], lens_kv=[6, 5, 9],
         mask="causal_bottom_right", window=(3, 0)),
    Case("thd_seq_offsets_with_gaps", layout="thd", lens_q=[3, 5], lens_kv=[4, 6], gaps=True,
         mask="causal_bottom_right"),
    Case("dropout", dropout_p=0.3, dropout_seed=1234567890123),
    Case("thd_dropout", layout="thd", lens_q=[3, 6], lens_kv=[5, 6], dropout_p=0.25,
         dropout_seed=77),
    Case("everything", hq=4, hkv=2, sq=6, skv=10, mask="causal_bottom_right", window=(5, 0),
         bias="1h", softcap=3.0, sinks=True, input_scale=1.5),
    # One query token against a short K/V (the small_seq backend's problems).
    Case("small_seq_cross", batch=3, sq=1, skv=9, hq=4, hkv=2, d=64),
    Case("small_seq_padding", sq=1, skv=16, d=64, padding_lens=([1, 1], [16, 5]),
         mask="padding"),
]

DTYPE_CASES = ["plain", "causal_bottom_right", "gqa", "thd_uneven", "bias_post_scale",
               "sinks", "everything"]


def token_mask(kwargs, tokens):
    """THD: which tokens belong to a sequence."""
    cu = kwargs["cu_seqlens_q"]
    starts = kwargs.get("seq_offsets_q", cu)
    inside = np.zeros(tokens, dtype=bool)
    for b in range(len(cu) - 1):
        inside[starts[b]:starts[b] + cu[b + 1] - cu[b]] = True
    return inside


def check_lse(lse, ref_lse, kwargs, layout):
    """LSE against the oracle's: float32 rounding, and with a softcap the hardware tanh's bound
    (fusedattn.h: on float16/bfloat16 inputs a score is within softcap * 2^-11 of the exact one,
    and so is the LSE, a log-sum-exp of the scores)."""
    lse = np.asarray(lse, dtype=np.float64)
    atol = max(2e-6, (kwargs.get("softcap") or 0.0) * 2.0 ** -11)
    if layout == "thd":
        inside = token_mask(kwargs, lse.shape[0])
        lse, ref_lse = lse[inside], ref_lse[inside]
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "-inf rows differ"
    finite = np.isfinite(ref_lse)
    assert np.all(np.isfinite(lse[finite]))
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=2e-6, atol=atol)
