"""An independent float64 NumPy implementation of what include/fusedattn/fusedattn.h specifies,
forward and backward, written from the header's text (matrix form per sequence and head, unlike
the library's row loops). Tests compare the library against it.

Tensors come in the caller's layout ("bshd", "sbhd", "bhsd", or "thd" with cu_seqlens); outputs
are float64 in the same layout.
"""

import numpy as np

# ---------------------------------------------------------------------------------------------
# Philox4x32-10 (Random123), vectorized over counters, and the header's dropout rule
# ---------------------------------------------------------------------------------------------

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Four uint32 arrays (the counter) and a key -> four uint32 arrays."""
    c = [np.asarray(x, dtype=np.uint64) & _MASK32 for x in (c0, c1, c2, c3)]
    k0, k1 = int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF
    for _ in range(10):
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c = [hi1 ^ c[1] ^ np.uint64(k0), lo1, hi0 ^ c[3] ^ np.uint64(k1), lo0]
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return [x.astype(np.uint32) for x in c]


def dropout_keep(seed, offset, p, b, h, rows, num_keys, heads_q, max_seqlen_q):
    """[len(rows), num_keys] bool: element (i, j) kept, per the header's rule."""
    threshold = min(int(p * 2.0**32), 2**32 - 1)
    rows = np.asarray(rows, dtype=np.int64)
    j = np.arange(num_keys, dtype=np.int64)
    row_ids = (b * heads_q + h) * max_seqlen_q + rows
    c0 = np.broadcast_to(j[None, :] // 4, (len(rows), num_keys))
    c1 = np.broadcast_to(row_ids[:, None], (len(rows), num_keys))
    words = philox4x32_10(c0, c1, np.full(c0.shape, offset & 0xFFFFFFFF),
                          np.full(c0.shape, offset >> 32), seed & 0xFFFFFFFF, seed >> 32)
    word = np.choose(np.broadcast_to(j % 4, c0.shape), words)
    return word.astype(np.uint64) >= threshold


# ---------------------------------------------------------------------------------------------
# Layouts and sequences
# ---------------------------------------------------------------------------------------------

_TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}


def _sequences(layout, q, k, cu_q, cu_kv, off_q, off_kv, padding):
    """[(start_q, len_q, start_kv, len_kv)] per sequence. Starts are token indices for THD, 0
    otherwise."""
    if layout == "thd":
        cu_q, cu_kv = np.asarray(cu_q), np.asarray(cu_kv)
        starts_q = np.asarray(off_q) if off_q is not None else cu_q
        starts_kv = np.asarray(off_kv) if off_kv is not None else cu_kv
        return [(int(starts_q[b]), int(cu_q[b + 1] - cu_q[b]), int(starts_kv[b]),
                 int(cu_kv[b + 1] - cu_kv[b])) for b in range(len(cu_q) - 1)]
    qb = q.transpose(_TO_BHSD[layout])
    kb = k.transpose(_TO_BHSD[layout])
    batch, sq, skv = qb.shape[0], qb.shape[2], kb.shape[2]
    if padding:
        cu_q, cu_kv = np.asarray(cu_q), np.asarray(cu_kv)
        return [(0, int(cu_q[b + 1] - cu_q[b]), 0, int(cu_kv[b + 1] - cu_kv[b]))
                for b in range(batch)]
    return [(0, sq, 0, skv)] * batch


class _View:
    """Access to sequence b of a tensor in a layout as [heads, len, dim] float64."""

    def __init__(self, x, layout):
        self.layout = layout
        self.x = np.asarray(x, dtype=np.float64) if x is not None else None
        if layout != "thd" and x is not None:
            self.bhsd = self.x.transpose(_TO_BHSD[layout])

    def get(self, b, start, length):
        if self.layout == "thd":
            return self.x[start:start + length].transpose(1, 0, 2)
        return self.bhsd[b, :, :length]

    def zeros_like(self):
        return _View(np.zeros_like(self.x), self.layout)

    def put(self, b, start, value):  # value [heads, len, dim]
        length = value.shape[1]
        if self.layout == "thd":
            self.x[start:start + length] = value.transpose(1, 0, 2)
        else:
            self.bhsd[b, :, :length] = value


def _mask_flags(mask, layout):
    causal = mask in ("causal", "causal_bottom_right", "padding_causal",
                      "padding_causal_bottom_right")
    top_left = mask in ("causal", "padding_causal")
    padding = layout == "thd" or mask.startswith("padding")
    return causal, top_left, padding


def visible(len_q, len_kv, causal, top_left, window):
    """[len_q, len_kv] bool, the header's rule: d = i (top-left causal) or i + sk - sq."""
    i = np.arange(len_q)[:, None]
    j = np.arange(len_kv)[None, :]
    d = i if (causal and top_left) else i + len_kv - len_q
    left, right = window
    ok = np.ones((len_q, len_kv), dtype=bool)
    if left >= 0:
        ok &= j >= d - left
    right = 0 if causal else right
    if right >= 0:
        ok &= j <= d + right
    return ok


class Problem:
    """The arguments of one attention problem, as fusedattn.attention takes them."""

    def __init__(self, layout="bshd", mask=None, window=(-1, -1), bias=None,
                 bias_type="post_scale", alibi_slopes=None, softcap=0.0, sinks=None,
                 softmax=None, dropout_p=0.0, dropout_seed=None, scale=None, cu_seqlens_q=None,
                 cu_seqlens_kv=None, seq_offsets_q=None, seq_offsets_kv=None, max_seqlen_q=None,
                 max_seqlen_kv=None, dropout_keep=None, **_ignored):
        """dropout_keep: a dropout mask to use instead of the header's Philox mask (a backend's
        own random stream, recovered by a test): an array in o's layout whose feature j at
        query row i is 1 where key j is kept, 0 where dropped."""
        self.layout = layout
        self.mask = mask or "none"
        self.window = tuple(window)
        self.bias = None if bias is None else np.asarray(bias, dtype=np.float64)
        if alibi_slopes is not None:
            self.bias_type = "alibi"
        else:
            self.bias_type = bias_type if bias is not None else "none"
        self.alibi = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
        self.softcap = softcap
        self.sinks = None if sinks is None else np.asarray(sinks, dtype=np.float64)
        self.softmax = softmax or ("sink" if sinks is not None else "vanilla")
        self.dropout_p = dropout_p
        self.seed = dropout_seed
        self.keep = None if dropout_keep is None else _View(dropout_keep, layout)
        self.scale = scale
        self.cu_q, self.cu_kv = cu_seqlens_q, cu_seqlens_kv
        self.off_q, self.off_kv = seq_offsets_q, seq_offsets_kv
        self.max_seqlen_q = max_seqlen_q

    def _setup(self, q, k):
        self.causal, self.top_left, self.padding = _mask_flags(self.mask, self.layout)
        self.seqs = _sequences(self.layout, q, k, self.cu_q, self.cu_kv, self.off_q,
                               self.off_kv, self.padding)
        head_axis = 1 if self.layout == "thd" else {"bshd": 2, "sbhd": 2, "bhsd": 1}[self.layout]
        self.heads_q, self.heads_kv = q.shape[head_axis], k.shape[head_axis]
        self.dim = q.shape[-1]
        self.scale_value = 1 / np.sqrt(self.dim) if self.scale is None else self.scale
        if self.layout == "thd":
            self.max_q = self.max_seqlen_q or max(s[1] for s in self.seqs)
        else:
            self.max_q = q.transpose(_TO_BHSD[self.layout]).shape[2]

    def _extra(self, h):
        if self.softmax == "off_by_one":
            return 0.0
        if self.softmax in ("sink", "learnable_sink"):
            return float(self.sinks[h])
        return -np.inf

    def _bias(self, b, h, lq, lkv):
        bb = 0 if self.bias.shape[0] == 1 else b
        bh = 0 if self.bias.shape[1] == 1 else h
        return self.bias[bb, bh, :lq, :lkv]

    def _scores(self, Q, K, b, h, lq, lkv):
        """(s after bias and softcap, dS/dt) before masking: the header's pipeline."""
        pre = self._bias(b, h, lq, lkv) if self.bias_type == "pre_scale" else 0.0
        t = self.scale_value * (Q @ K.T + pre)
        if self.softcap > 0:
            th = np.tanh(t / self.softcap)
            s, dsdt = self.softcap * th, 1 - th * th
        else:
            s, dsdt = t, np.ones_like(t)
        if self.bias_type == "post_scale":
            s = s + self._bias(b, h, lq, lkv)
        if self.bias_type == "alibi":
            i = np.arange(lq)[:, None]
            j = np.arange(lkv)[None, :]
            s = s - self.alibi[h] * np.abs(i + lkv - lq - j)
        return s, dsdt

    def _probabilities(self, s, vis, h):
        """(P, lse, visible-row flags) with P = exp(s - lse) on visible keys."""
        masked = np.where(vis, s, -np.inf)
        extra = self._extra(h)
        has_key = vis.any(axis=1)
        m = np.maximum(np.where(has_key, masked.max(axis=1, initial=-np.inf), -np.inf), extra)
        m = np.where(np.isfinite(m), m, 0.0)
        denominator = np.exp(extra - m) + np.exp(masked - m[:, None]).sum(axis=1)
        with np.errstate(divide="ignore"):  # rows without keys: log(0), replaced by -inf
            lse = np.where(has_key, m + np.log(denominator), -np.inf)
        p = np.where(vis & has_key[:, None], np.exp(masked - np.where(has_key, lse, 0)[:, None]),
                     0.0)
        return p, lse, has_key

    def _dropout(self, b, h, start_q, lq, lkv):
        if self.dropout_p <= 0:
            return np.ones((lq, lkv))
        if self.keep is not None:
            keep = self.keep.get(b, start_q, lq)[h, :, :lkv] != 0
        else:
            keep = dropout_keep(self.seed, 0, self.dropout_p, b, h, np.arange(lq), lkv,
                                self.heads_q, self.max_q)
        return keep / (1 - self.dropout_p)

    def forward(self, q, k, v):
        """(o, lse): o in q's layout, lse [batch, heads, max_seqlen_q] or packed [tokens, heads]
        for THD (entries outside sequences: 0 for o, nan for lse)."""
        self._setup(q, k)
        Qv, Kv, Vv = _View(q, self.layout), _View(k, self.layout), _View(v, self.layout)
        o = _View(np.zeros(q.shape[:-1] + (v.shape[-1],)), self.layout)
        if self.layout == "thd":
            lse = np.full((q.shape[0], self.heads_q), np.nan)
        else:
            lse = np.full((len(self.seqs), self.heads_q, self.max_q), -np.inf)
        group = self.heads_q // self.heads_kv
        for b, (sq0, lq, skv0, lkv) in enumerate(self.seqs):
            Q, K, V = Qv.get(b, sq0, lq), Kv.get(b, skv0, lkv), Vv.get(b, skv0, lkv)
            vis = visible(lq, lkv, self.causal, self.top_left, self.window)
            out = np.zeros((self.heads_q, lq, V.shape[-1]))
            for h in range(self.heads_q):
                s, _ = self._scores(Q[h], K[h // group], b, h, lq, lkv)
                p, row_lse, _ = self._probabilities(s, vis, h)
                out[h] = (p * self._dropout(b, h, sq0, lq, lkv)) @ V[h // group]
                if self.layout == "thd":
                    lse[sq0:sq0 + lq, h] = row_lse
                else:
                    lse[b, h, :lq] = row_lse
            o.put(b, sq0, out)
        return o.x, lse

    def backward(self, d_o, q, k, v):
        """(dq, dk, dv, dbias, dsink) for loss gradient d_o (in o's layout)."""
        o, _ = self.forward(q, k, v)
        Qv, Kv, Vv = _View(q, self.layout), _View(k, self.layout), _View(v, self.layout)
        dOv, Ov = _View(d_o, self.layout), _View(o, self.layout)
        dq, dk, dv = Qv.zeros_like(), Kv.zeros_like(), Vv.zeros_like()
        dbias = None if self.bias is None else np.zeros_like(self.bias)
        dsink = np.zeros(self.heads_q)
        group = self.heads_q // self.heads_kv
        for b, (sq0, lq, skv0, lkv) in enumerate(self.seqs):
            Q, K, V = Qv.get(b, sq0, lq), Kv.get(b, skv0, lkv), Vv.get(b, skv0, lkv)
            dO, O = dOv.get(b, sq0, lq), Ov.get(b, sq0, lq)
            vis = visible(lq, lkv, self.causal, self.top_left, self.window)
            gq = np.zeros(Q.shape)
            gk, gv = np.zeros(K.shape), np.zeros(V.shape)
            for h in range(self.heads_q):
                hk = h // group
                s, dsdt = self._scores(Q[h], K[hk], b, h, lq, lkv)
                p, lse, has_key = self._probabilities(s, vis, h)
                z = self._dropout(b, h, sq0, lq, lkv)
                gv[hk] += (p * z).T @ dO[h]
                dp = (dO[h] @ V[hk].T) * z
                delta = np.where(has_key, (dO[h] * O[h]).sum(axis=1), 0.0)
                ds = p * (dp - delta[:, None])
                dt = ds * dsdt
                gq[h] = self.scale_value * dt @ K[hk]
                gk[hk] += self.scale_value * dt.T @ Q[h]
                if dbias is not None:
                    g = ds if self.bias_type == "post_scale" else self.scale_value * dt
                    bb = 0 if self.bias.shape[0] == 1 else b
                    bh = 0 if self.bias.shape[1] == 1 else h
                    dbias[bb, bh, :lq, :lkv] += g
                if self.softmax != "vanilla":
                    p_extra = np.where(has_key, np.exp(self._extra(h) - np.where(has_key, lse, 0)),
                                       0.0)
                    dsink[h] -= (p_extra * delta).sum()
            dq.put(b, sq0, gq)
            dk.put(b, skv0, gk)
            dv.put(b, skv0, gv)
        return dq.x, dk.x, dv.x, dbias, dsink
