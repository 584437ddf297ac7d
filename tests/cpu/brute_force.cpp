#include "brute_force.h"

#include <cmath>
#include <limits>

#include "common/philox.h"

namespace fusedattn::brute_force {

using testing::HostTensor;
using testing::ProblemTensors;

namespace {

constexpr Real kInf = std::numeric_limits<Real>::infinity();

bool IsThd(const fusedattn_config& c) { return c.q_format == FUSEDATTN_FORMAT_THD; }

bool HasPaddingMask(const fusedattn_config& c) {
  return c.mask == FUSEDATTN_MASK_PADDING || c.mask == FUSEDATTN_MASK_PADDING_CAUSAL ||
         c.mask == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

bool IsCausal(const fusedattn_config& c) {
  return c.mask == FUSEDATTN_MASK_CAUSAL || c.mask == FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT ||
         c.mask == FUSEDATTN_MASK_PADDING_CAUSAL ||
         c.mask == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

}  // namespace

std::vector<int64_t> LogicalIndex(fusedattn_format format, int64_t b, int64_t position, int64_t h,
                                  int64_t x, int64_t start) {
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD: return {b, position, h, x};
    case FUSEDATTN_FORMAT_SBHD: return {position, b, h, x};
    case FUSEDATTN_FORMAT_BHSD: return {b, h, position, x};
    case FUSEDATTN_FORMAT_THD: return {start + position, h, x};
  }
  return {};
}

namespace {

Real Get(const HostTensor& t, const std::vector<int64_t>& index) {
  return static_cast<Real>(t.at(index));
}

std::vector<int64_t> BiasIndex(const fusedattn_config& c, int64_t b, int64_t h, int64_t i,
                               int64_t j) {
  return {c.bias_batch == 1 ? 0 : b, c.bias_heads == 1 ? 0 : h, i, j};
}

size_t BiasFlat(const fusedattn_config& c, int64_t b, int64_t h, int64_t i, int64_t j) {
  int64_t bb = c.bias_batch == 1 ? 0 : b, bh = c.bias_heads == 1 ? 0 : h;
  return static_cast<size_t>(((bb * c.bias_heads + bh) * c.max_seqlen_q + i) * c.max_seqlen_kv + j);
}

}  // namespace

std::vector<Sequence> SequencesOf(const ProblemTensors& t) {
  const auto& c = t.config;
  std::vector<Sequence> seqs(static_cast<size_t>(c.batch));
  const bool per_sequence = IsThd(c) || HasPaddingMask(c);
  for (int64_t b = 0; b < c.batch; ++b) {
    Sequence& s = seqs[b];
    if (!per_sequence) {
      s.len_q = c.max_seqlen_q, s.len_kv = c.max_seqlen_kv;
      continue;
    }
    // "length of sequence b = cu[b+1] - cu[b]"
    s.len_q = static_cast<int64_t>(t.cu_seqlens_q.at({b + 1}) - t.cu_seqlens_q.at({b}));
    s.len_kv = static_cast<int64_t>(t.cu_seqlens_kv.at({b + 1}) - t.cu_seqlens_kv.at({b}));
    if (IsThd(c)) {
      // "sequence b's tokens start at seq_offsets[b] if given, else at cu_seqlens[b]"
      s.start_q = static_cast<int64_t>(t.seq_offsets_q.empty() ? t.cu_seqlens_q.at({b})
                                                               : t.seq_offsets_q.at({b}));
      s.start_kv = static_cast<int64_t>(t.seq_offsets_kv.empty() ? t.cu_seqlens_kv.at({b})
                                                                 : t.seq_offsets_kv.at({b}));
    }
  }
  return seqs;
}

bool Visible(const fusedattn_config& c, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  if (!(j < sk && i < sq)) return false;
  // d = i for CAUSAL and PADDING_CAUSAL (top-left), d = i + sk - sq for every other mask.
  const bool top_left = c.mask == FUSEDATTN_MASK_CAUSAL || c.mask == FUSEDATTN_MASK_PADDING_CAUSAL;
  const int64_t d = top_left ? i : i + sk - sq;
  // right = 0 for causal masks, else window_right (or unbounded when -1).
  const bool right_bounded = IsCausal(c) || c.window_right != -1;
  const int64_t right = IsCausal(c) ? 0 : c.window_right;
  // left = window_left (or unbounded when -1).
  const bool left_bounded = c.window_left != -1;
  if (right_bounded && !(j <= d + right)) return false;
  if (left_bounded && !(j >= d - c.window_left)) return false;
  return true;
}

bool DropoutKeeps(const fusedattn_config& c, uint64_t seed, uint64_t offset, int64_t b, int64_t h,
                  int64_t i, int64_t j) {
  if (c.dropout == 0.0) return true;
  // key (lo32(seed), hi32(seed)); counter (j' / 4, row, lo32(offset), hi32(offset)) with
  // row = ((b + dropout_batch_offset) * H + h + dropout_head_offset) * R + i + dropout_row_offset,
  // j' = j + dropout_key_offset, H = dropout_heads (0: heads_q), R = dropout_rows (0:
  // max_seqlen_q); word j' % 4.
  const int64_t heads = c.dropout_heads ? c.dropout_heads : c.heads_q;
  const int64_t rows = c.dropout_rows ? c.dropout_rows : c.max_seqlen_q;
  const uint64_t row = static_cast<uint64_t>(
      ((b + c.dropout_batch_offset) * heads + h + c.dropout_head_offset) * rows + i +
      c.dropout_row_offset);
  j += c.dropout_key_offset;
  Philox4 counter{static_cast<uint32_t>(j / 4), static_cast<uint32_t>(row),
                  static_cast<uint32_t>(offset & 0xFFFFFFFFu), static_cast<uint32_t>(offset >> 32)};
  Philox4 r = Philox4x32_10(counter, static_cast<uint32_t>(seed & 0xFFFFFFFFu),
                            static_cast<uint32_t>(seed >> 32));
  const uint32_t words[4] = {r.x, r.y, r.z, r.w};
  const uint64_t u = words[j % 4];
  // threshold = min(floor(dropout * 2^32), 2^32 - 1); kept when u >= threshold.
  Real threshold = std::floor(static_cast<Real>(c.dropout) * 4294967296.0L);
  if (threshold > 4294967295.0L) threshold = 4294967295.0L;
  return static_cast<Real>(u) >= threshold;
}

Attention Compute(const ProblemTensors& t, const HostTensor* given_o) {
  const fusedattn_config& c = t.config;
  Attention a;
  a.batch = c.batch, a.heads_q = c.heads_q, a.heads_kv = c.heads_kv;
  a.seqlen_q = c.max_seqlen_q, a.seqlen_kv = c.max_seqlen_kv;
  a.head_dim_qk = c.head_dim_qk, a.head_dim_v = c.head_dim_v;
  a.sequences = SequencesOf(t);
  const int64_t B = c.batch, HQ = c.heads_q, SQ = c.max_seqlen_q, SKV = c.max_seqlen_kv;
  const int64_t DQK = c.head_dim_qk, DV = c.head_dim_v, HKV = c.heads_kv;
  const Real scale = c.attn_scale != 0.0 ? static_cast<Real>(c.attn_scale)
                                         : 1.0L / std::sqrt(static_cast<Real>(DQK));
  const Real softcap = static_cast<Real>(c.softcap);
  const Real keep_scale = 1.0L / (1.0L - static_cast<Real>(c.dropout));

  a.o.assign(static_cast<size_t>(B * HQ * SQ * DV), 0);
  a.lse.assign(static_cast<size_t>(B * HQ * SQ), -kInf);
  a.max_logit.assign(static_cast<size_t>(HQ), -kInf);
  a.dq.assign(static_cast<size_t>(B * HQ * SQ * DQK), 0);
  a.dk.assign(static_cast<size_t>(B * HKV * SKV * DQK), 0);
  a.dv.assign(static_cast<size_t>(B * HKV * SKV * DV), 0);
  const bool tensor_bias =
      c.bias_type == FUSEDATTN_BIAS_PRE_SCALE || c.bias_type == FUSEDATTN_BIAS_POST_SCALE;
  if (tensor_bias) a.dbias.assign(static_cast<size_t>(c.bias_batch * c.bias_heads * SQ * SKV), 0);
  a.dsink.assign(static_cast<size_t>(HQ), 0);

  // Per (b, h): the full matrices of the pre-softcap value t, the score s and visibility.
  std::vector<Real> tmat(static_cast<size_t>(SQ * SKV)), smat(static_cast<size_t>(SQ * SKV));
  std::vector<char> visible(static_cast<size_t>(SQ * SKV));
  for (int64_t b = 0; b < B; ++b) {
    const Sequence& seq = a.sequences[b];
    const int64_t sq = seq.len_q, sk = seq.len_kv;
    for (int64_t h = 0; h < HQ; ++h) {
      const int64_t hk = h / (HQ / HKV);
      auto q = [&](int64_t i, int64_t x) {
        return Get(t.q, LogicalIndex(c.q_format, b, i, h, x, seq.start_q));
      };
      auto k = [&](int64_t j, int64_t x) {
        return Get(t.k, LogicalIndex(c.kv_format, b, j, hk, x, seq.start_kv));
      };
      auto v = [&](int64_t j, int64_t x) {
        return Get(t.v, LogicalIndex(c.kv_format, b, j, hk, x, seq.start_kv));
      };
      auto d_o = [&](int64_t i, int64_t x) {
        return Get(t.d_o, LogicalIndex(c.do_format, b, i, h, x, seq.start_q));
      };
      // Scores of every visible (i, j), as the spec's pipeline writes them.
      for (int64_t i = 0; i < SQ; ++i)
        for (int64_t j = 0; j < SKV; ++j) {
          const size_t ij = static_cast<size_t>(i * SKV + j);
          visible[ij] = Visible(c, i, j, sq, sk);
          if (!visible[ij]) continue;
          Real dot = 0;
          for (int64_t x = 0; x < DQK; ++x) dot += q(i, x) * k(j, x);
          Real pre =
              c.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? Get(t.bias, BiasIndex(c, b, h, i, j)) : 0;
          Real s = scale * (dot + pre);
          tmat[ij] = s;
          if (softcap > 0) s = softcap * std::tanh(s / softcap);
          if (c.bias_type == FUSEDATTN_BIAS_POST_SCALE) s += Get(t.bias, BiasIndex(c, b, h, i, j));
          if (c.bias_type == FUSEDATTN_BIAS_ALIBI)
            s -= static_cast<Real>(t.alibi_slopes.at({h})) *
                 std::fabs(static_cast<Real>(i + sk - sq - j));
          smat[ij] = s;
        }
      // The extra logit of the denominator.
      const bool has_extra = c.softmax_type != FUSEDATTN_SOFTMAX_VANILLA;
      const Real extra = c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK
                             ? static_cast<Real>(t.sink_logits.at({h}))
                             : 0;
      for (int64_t i = 0; i < SQ; ++i) {
        Real m = -kInf;
        for (int64_t j = 0; j < SKV; ++j)
          if (visible[i * SKV + j]) m = std::max(m, smat[i * SKV + j]);
        if (m == -kInf) continue;  // no visible key: O = 0, LSE = -inf, no gradient
        a.max_logit[h] = std::max(a.max_logit[h], m);
        const Real shift = has_extra ? std::max(m, extra) : m;
        Real denominator = has_extra ? std::exp(extra - shift) : 0;
        for (int64_t j = 0; j < SKV; ++j)
          if (visible[i * SKV + j]) denominator += std::exp(smat[i * SKV + j] - shift);
        const Real lse = shift + std::log(denominator);
        a.lse[(b * HQ + h) * SQ + i] = lse;

        // Forward: p_j, p'_j (after dropout) and O.
        std::vector<Real> p(static_cast<size_t>(SKV), 0), factor(static_cast<size_t>(SKV), 0);
        for (int64_t j = 0; j < SKV; ++j) {
          if (!visible[i * SKV + j]) continue;
          p[j] = std::exp(smat[i * SKV + j] - lse);
          factor[j] =
              DropoutKeeps(c, t.dropout_seed, t.dropout_offset, b, h, i, j) ? keep_scale : 0;
          for (int64_t x = 0; x < DV; ++x)
            a.o[((b * HQ + h) * SQ + i) * DV + x] += p[j] * factor[j] * v(j, x);
        }

        // Backward of L = sum(O * dO):
        //   dL/dp_j = factor_j (dO . v_j);  ds_j = p_j (dL/dp_j - sum_k p_k dL/dp_k)
        //   dL/dsink = -p_sink * sum_k p_k dL/dp_k
        std::vector<Real> dp(static_cast<size_t>(SKV), 0);
        Real weighted = 0;
        for (int64_t j = 0; j < SKV; ++j) {
          if (!visible[i * SKV + j]) continue;
          Real dot = 0;
          for (int64_t x = 0; x < DV; ++x) dot += d_o(i, x) * v(j, x);
          dp[j] = factor[j] * dot;
          weighted += p[j] * dp[j];
        }
        if (given_o) {
          weighted = 0;
          for (int64_t x = 0; x < DV; ++x)
            weighted +=
                d_o(i, x) * Get(*given_o, LogicalIndex(c.o_format, b, i, h, x, seq.start_q));
        }
        if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK)
          a.dsink[h] -= std::exp(extra - lse) * weighted;
        for (int64_t j = 0; j < SKV; ++j) {
          if (!visible[i * SKV + j]) continue;
          const Real ds = p[j] * (dp[j] - weighted);
          Real dt = ds;  // through softcap: d(c tanh(t/c))/dt = 1 - tanh^2(t/c)
          if (softcap > 0) {
            Real th = std::tanh(tmat[i * SKV + j] / softcap);
            dt = ds * (1 - th * th);
          }
          const Real ddot = dt * scale;  // t = scale * (q.k + pre_bias)
          for (int64_t x = 0; x < DQK; ++x) {
            a.dq[((b * HQ + h) * SQ + i) * DQK + x] += ddot * k(j, x);
            a.dk[((b * HKV + hk) * SKV + j) * DQK + x] += ddot * q(i, x);
          }
          for (int64_t x = 0; x < DV; ++x)
            a.dv[((b * HKV + hk) * SKV + j) * DV + x] += p[j] * factor[j] * d_o(i, x);
          if (tensor_bias && c.bias_requires_grad)
            a.dbias[BiasFlat(c, b, h, i, j)] += c.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? ddot : ds;
        }
      }
    }
  }
  return a;
}

ExpectedOutputs Expected(const ProblemTensors& t, const Attention& a) {
  const fusedattn_config& c = t.config;
  const int64_t HQ = c.heads_q, HKV = c.heads_kv, SQ = c.max_seqlen_q, SKV = c.max_seqlen_kv;
  const int64_t DQK = c.head_dim_qk, DV = c.head_dim_v;
  const bool thd = IsThd(c);
  ExpectedOutputs e{t.o, t.lse, t.max_logit, t.dq, t.dk, t.dv, t.dbias, t.dsink};
  auto put = [](HostTensor& tensor, const std::vector<int64_t>& index, Real value) {
    tensor.set(tensor.offset_of(index), static_cast<double>(value));
  };
  for (int64_t b = 0; b < c.batch; ++b) {
    const Sequence& seq = a.sequences[b];
    // BSHD/SBHD/BHSD tensors are written in full (rows past the sequence get 0); packed THD
    // tensors only at the sequence's tokens.
    const int64_t rows_q = thd ? seq.len_q : SQ, rows_kv = thd ? seq.len_kv : SKV;
    for (int64_t h = 0; h < HQ; ++h)
      for (int64_t i = 0; i < rows_q; ++i) {
        for (int64_t x = 0; x < DV; ++x)
          put(e.o, LogicalIndex(c.o_format, b, i, h, x, seq.start_q),
              a.o[((b * HQ + h) * SQ + i) * DV + x]);
        for (int64_t x = 0; x < DQK; ++x)
          put(e.dq, LogicalIndex(c.dqkv_format, b, i, h, x, seq.start_q),
              a.dq[((b * HQ + h) * SQ + i) * DQK + x]);
      }
    for (int64_t h = 0; h < HKV; ++h)
      for (int64_t j = 0; j < rows_kv; ++j) {
        for (int64_t x = 0; x < DQK; ++x)
          put(e.dk, LogicalIndex(c.dqkv_format, b, j, h, x, seq.start_kv),
              a.dk[((b * HKV + h) * SKV + j) * DQK + x]);
        for (int64_t x = 0; x < DV; ++x)
          put(e.dv, LogicalIndex(c.dqkv_format, b, j, h, x, seq.start_kv),
              a.dv[((b * HKV + h) * SKV + j) * DV + x]);
      }
    if (!e.lse.empty()) {
      const bool packed = e.lse.shape().size() == 2;  // THD [tokens, heads_q]
      for (int64_t h = 0; h < HQ; ++h)
        for (int64_t i = 0; i < (packed ? seq.len_q : SQ); ++i)
          put(e.lse,
              packed ? std::vector<int64_t>{seq.start_q + i, h} : std::vector<int64_t>{b, h, i},
              a.lse[(b * HQ + h) * SQ + i]);
    }
  }
  if (!e.max_logit.empty())
    for (int64_t h = 0; h < HQ; ++h) put(e.max_logit, {h}, a.max_logit[h]);
  if (!e.dsink.empty())
    for (int64_t h = 0; h < HQ; ++h) put(e.dsink, {h}, a.dsink[h]);
  if (!e.dbias.empty())
    for (int64_t bb = 0; bb < c.bias_batch; ++bb)
      for (int64_t bh = 0; bh < c.bias_heads; ++bh)
        for (int64_t i = 0; i < SQ; ++i)
          for (int64_t j = 0; j < SKV; ++j)
            put(e.dbias, {bb, bh, i, j}, a.dbias[BiasFlat(c, bb, bh, i, j)]);
  return e;
}

}  // namespace fusedattn::brute_force
