// FP8 scaling factors for tests and benchmarks: one block of float32 scalars that a call's FP8
// pointers address (fusedattn.h, "FP8 attention"). The block lives on the host for CPU calls;
// for CUDA calls copy it to device memory and point the args at the copy (same layout).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "testing/tensors.h"

namespace fusedattn::testing {

struct Fp8Factors {
  float descale_q = 1, descale_k = 1, descale_v = 1, descale_o = 1, descale_do = 1;
  float descale_s = 1, descale_dp = 1;
  float scale_s = 1, scale_o = 1, scale_dp = 1, scale_dq = 1, scale_dk = 1, scale_dv = 1;
  // Outputs.
  float amax_s = -1, amax_o = -1, amax_dp = -1, amax_dq = -1, amax_dk = -1, amax_dv = -1;
};

inline bool IsFp8(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FP8_E4M3 || dtype == FUSEDATTN_DTYPE_FP8_E5M2;
}

// The dtype a config gives dO / dQKV (DEFAULT resolved as fusedattn.h says).
inline fusedattn_dtype DoDtype(const fusedattn_config& c) {
  return c.do_dtype == FUSEDATTN_DTYPE_DEFAULT ? c.o_dtype : c.do_dtype;
}
inline fusedattn_dtype DqkvDtype(const fusedattn_config& c) {
  return c.dqkv_dtype == FUSEDATTN_DTYPE_DEFAULT ? c.qkv_dtype : c.dqkv_dtype;
}

// Points the FP8 fields of the args at `block` (an Fp8Factors on the host or a device copy of
// one): exactly the pointers the config reads (fusedattn.h), the others NULL.
inline void PointFwdArgsAt(const fusedattn_config& c, Fp8Factors* block, fusedattn_fwd_args* a) {
  a->descale_q = &block->descale_q;
  a->descale_k = &block->descale_k;
  a->descale_v = &block->descale_v;
  a->descale_s = &block->descale_s;
  a->scale_s = &block->scale_s;
  a->scale_o = IsFp8(c.o_dtype) ? &block->scale_o : nullptr;
  a->amax_s = &block->amax_s;
  a->amax_o = &block->amax_o;
}

inline void PointBwdArgsAt(const fusedattn_config& c, Fp8Factors* block, fusedattn_bwd_args* a) {
  const bool dqkv_fp8 = IsFp8(DqkvDtype(c));
  a->descale_q = &block->descale_q;
  a->descale_k = &block->descale_k;
  a->descale_v = &block->descale_v;
  a->descale_o = IsFp8(c.o_dtype) ? &block->descale_o : nullptr;
  a->descale_do = &block->descale_do;
  a->descale_s = &block->descale_s;
  a->descale_dp = &block->descale_dp;
  a->scale_s = &block->scale_s;
  a->scale_dp = &block->scale_dp;
  a->scale_dq = dqkv_fp8 ? &block->scale_dq : nullptr;
  a->scale_dk = dqkv_fp8 ? &block->scale_dk : nullptr;
  a->scale_dv = dqkv_fp8 ? &block->scale_dv : nullptr;
  a->amax_dp = &block->amax_dp;
  a->amax_dq = &block->amax_dq;
  a->amax_dk = &block->amax_dk;
  a->amax_dv = &block->amax_dv;
}

// The largest power of two p with amax * p <= max_finite (the FP8 type's largest value): a
// scale that never saturates and whose reciprocal is exact. amax 0: 1.
inline float PowerOfTwoScale(double amax, double max_finite) {
  if (!(amax > 0)) return 1.0f;
  return static_cast<float>(std::exp2(std::floor(std::log2(max_finite / amax))));
}

// Float64 attention on the descaled FP8 inputs, unquantized, and the bound of the quantization
// points of fusedattn.h ("FP8 attention") per output element. For an FP8 type with m mantissa
// bits and smallest normal 2^e_min, rounding to nearest moves y by at most
//   u |y| + a,   u = 2^-(m+1),  a = 2^(e_min - m - 1)   (e4m3: 2^-4, 2^-10; e5m2: 2^-3, 2^-17)
// when y does not saturate; with y = x * scale read back as Q8(y) / scale (power-of-two scales),
// |Q8(x scale) / scale - x| <= u |x| + a / scale. Summed over the GEMM that reads the quantized
// tensor, per element:
//   O[i,x]  : sum_j (u_s p_ij + a_s / scale_s) |v_jx|
//   dV[j,x] : sum_i (u_s p_ij + a_s / scale_s) |dO_ix|
//   dQ[i,x] : sum_j (u_dp |dP_ij| + a_dp / scale_dp) |k_jx|;  dK[j,x] likewise with |q_ix|
// (tests/cpu/fp8_test.cpp holds the reference to it; tests/gpu/fp8_check.h derives the GPU's
// tolerance from it). Masks none or causal (top-left; the forward also bottom-right), no dropout;
// the forward in any dense format (q, k, v read in theirs; its outputs in BSHD order, see
// InFormatOrder), the backward BSHD.
struct Fp8Type {
  double u, a;
};
inline Fp8Type RoundingOf(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FP8_E5M2 ? Fp8Type{std::ldexp(1.0, -3), std::ldexp(1.0, -17)}
                        : Fp8Type{std::ldexp(1.0, -4), std::ldexp(1.0, -10)};
}
inline double MaxFinite(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FP8_E5M2 ? 57344.0 : 448.0;
}

// Float64 attention, unquantized, on the descaled FP8 inputs (BSHD, masks none or causal), with
// the per-element bounds of the header comment (*_bound), and for a float32 implementation
// (*_f32) a bound F of how far what it quantizes may drift from the exact value before rounding,
// carried through the GEMM that reads it. A sum of n products of FP8 operands on the tensor
// cores is bounded by g_n = n u_mma / (1 - n u_mma) times the sum of the products' magnitudes,
// with u_mma = 2^-14, not float32's 2^-24: Hopper's FP8 MMA adds the products into its float32
// accumulator keeping about 14 mantissa bits (DeepSeek-V3 technical report, section 3.3.2; on the
// H100, cuDNN 9.19's amax_dp was off by 1.1x and amax_s by 1.8x a float32 bound). Sums on the CUDA
// cores (the softmax's, gamma_n with 2^-24) stay float32:
//   score       es_ij  = g_D scale sum_x |q_ix k_jx| + 4 2^-24 |s_ij|
//   LSE (fwd)   el_i   = max_j es_ij + gamma_skv + 4 2^-24 |LSE_i|   (the backward reads it given)
//   p           ep_ij  = 1.01 p_ij (es_ij + el_i + 2^-22)               (exp of a small error)
//   dP          edp_ij = 1.01 scale (ep_ij |dpv_ij - D_i| + p_ij g_D (sum_x |dO_ix v_jx|
//                        + sum_x |dO_ix o_ix|)) + 2^-22 |dP_ij|
//   F: O[i,x] sum_j ep |v_jx|; dV[j,x] sum_i ep |dO_ix|; dQ[i,x] sum_j edp |k_jx|; dK[j,x]
//   sum_i edp |q_ix| (the GEMM's own sum: g_n, added by the test that reads F).
struct Exact {
  // [b][s][h][x] like the BSHD tensors.
  std::vector<double> o, o_bound, dq, dq_bound, dk, dk_bound, dv, dv_bound;
  std::vector<double> o_f32, dq_f32, dk_f32, dv_f32;
  double amax_s = 0, amax_dp = 0;
  double p_relative_f32 = 0;  // max of ep_ij / p_ij: amax_s's relative error
  double dp_f32 = 0;          // max of edp_ij: amax_dp's error
};

// gamma_n of the comment above.
inline double Gamma32(int64_t n) {
  const double nu = static_cast<double>(n) * std::ldexp(1.0, -24);
  return nu / (1.0 - nu);
}

// g_n of the comment above: a sum of n products on the FP8 tensor cores.
inline double GammaFp8Mma(int64_t n) {
  const double nu = static_cast<double>(n) * std::ldexp(1.0, -14);
  return nu / (1.0 - nu);
}

inline int64_t Idx(int64_t b, int64_t s, int64_t h, int64_t x, int64_t S, int64_t H, int64_t D) {
  return ((b * S + s) * H + h) * D + x;
}

// Index of element (b, s, h, x) in a tensor of `format` read with to_vector() (its shape's
// row-major order: SBHD [S, B, H, D], BHSD [B, H, S, D], else BSHD).
inline int64_t FormatIdx(fusedattn_format format, int64_t b, int64_t s, int64_t h, int64_t x,
                         int64_t B, int64_t S, int64_t H, int64_t D) {
  switch (format) {
    case FUSEDATTN_FORMAT_SBHD: return ((s * B + b) * H + h) * D + x;
    case FUSEDATTN_FORMAT_BHSD: return ((b * H + h) * S + s) * D + x;
    default: return Idx(b, s, h, x, S, H, D);
  }
}

// A [b][s][h][x] (BSHD-ordered) vector in the to_vector() order of a tensor of `format`.
inline std::vector<double> InFormatOrder(const std::vector<double>& bshd, fusedattn_format format,
                                         int64_t B, int64_t S, int64_t H, int64_t D) {
  std::vector<double> out(bshd.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < D; ++x)
          out[FormatIdx(format, b, s, h, x, B, S, H, D)] = bshd[Idx(b, s, h, x, S, H, D)];
  return out;
}

// backward = false: O and its bound (and amax_s). backward = true: dQ, dK, dV and their bounds
// (and amax_dp), from the O and LSE in t (the ones the backward reads).
inline Exact ExactAttention(const fusedattn_config& c, const ProblemTensors& t, const Fp8Factors& f,
                     bool backward) {
  const int64_t B = c.batch, HQ = c.heads_q, HKV = c.heads_kv, SQ = c.max_seqlen_q,
                SKV = c.max_seqlen_kv, D = c.head_dim_qk, G = HQ / HKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Fp8Type s_type = RoundingOf(FUSEDATTN_DTYPE_FP8_E4M3), dp_type = RoundingOf(DoDtype(c));
  Exact e;
  e.o.assign(B * SQ * HQ * D, 0), e.o_bound.assign(e.o.size(), 0);
  e.dq = e.dq_bound = e.o_f32 = e.dq_f32 = e.o;
  e.dk.assign(B * SKV * HKV * D, 0), e.dk_bound = e.dv = e.dv_bound = e.dk_f32 = e.dv_f32 = e.dk;
  const double u32 = std::ldexp(1.0, -24), gamma_d = GammaFp8Mma(D);
  // q, k, v decoded once ([b, s, h, d] order, as at() reads them): reading them element by
  // element through at() in the loops below made one s512 case take minutes on the host.
  const std::vector<double> qv = t.q.to_vector(), kv = t.k.to_vector(), vv = t.v.to_vector();
  // (The forward reads q, k, v in any dense format; the backward's dO and O are read BSHD.)
  auto q = [&](int64_t b, int64_t i, int64_t h, int64_t x) {
    return qv[FormatIdx(c.q_format, b, i, h, x, B, SQ, HQ, D)] * f.descale_q;
  };
  auto k = [&](int64_t b, int64_t j, int64_t h, int64_t x) {
    return kv[FormatIdx(c.kv_format, b, j, h, x, B, SKV, HKV, D)] * f.descale_k;
  };
  auto v = [&](int64_t b, int64_t j, int64_t h, int64_t x) {
    return vv[FormatIdx(c.kv_format, b, j, h, x, B, SKV, HKV, D)] * f.descale_v;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < HQ; ++h)
      for (int64_t i = 0; i < SQ; ++i) {
        const int64_t hk = h / G;
        // Keys [0, hi): causal top-left or bottom-right (the diagonal at the last key); a row
        // with none keeps o = 0 and no bound.
        const int64_t hi =
            c.mask == FUSEDATTN_MASK_CAUSAL ? std::min(i + 1, SKV)
            : c.mask == FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT
                ? std::max<int64_t>(0, std::min(i + 1 + SKV - SQ, SKV))
                : SKV;
        if (hi == 0) continue;
        std::vector<double> s(hi), es(hi);
        double es_max = 0;
        for (int64_t j = 0; j < hi; ++j) {
          double dot = 0, dot_abs = 0;
          for (int64_t x = 0; x < D; ++x) {
            dot += q(b, i, h, x) * k(b, j, hk, x);
            dot_abs += std::fabs(q(b, i, h, x) * k(b, j, hk, x));
          }
          s[j] = scale * dot;
          es[j] = gamma_d * scale * dot_abs + 4 * u32 * std::fabs(s[j]);
          es_max = std::max(es_max, es[j]);
        }
        double lse;
        if (!backward) {
          const double m = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double sj : s) sum += std::exp(sj - m);
          lse = m + std::log(sum);
        } else {
          lse = t.lse.at({b, h, i});  // what the backward reads
        }
        const double el = backward ? 0.0 : es_max + Gamma32(hi) + 4 * u32 * std::fabs(lse);
        std::vector<double> p(hi), ep(hi);
        for (int64_t j = 0; j < hi; ++j) {
          p[j] = std::exp(s[j] - lse);
          ep[j] = 1.01 * p[j] * (es[j] + el + 4 * u32);
          e.p_relative_f32 = std::max(e.p_relative_f32, 1.01 * (es[j] + el + 4 * u32));
          e.amax_s = std::max(e.amax_s, p[j]);
        }
        if (!backward) {
          for (int64_t x = 0; x < D; ++x)
            for (int64_t j = 0; j < hi; ++j) {
              const int64_t io = Idx(b, i, h, x, SQ, HQ, D);
              e.o[io] += p[j] * v(b, j, hk, x);
              e.o_bound[io] += (s_type.u * p[j] + s_type.a / f.scale_s) * std::fabs(v(b, j, hk, x));
              e.o_f32[io] += ep[j] * std::fabs(v(b, j, hk, x));
            }
          continue;
        }
        std::vector<double> d_o(D), o(D);
        double delta = 0, delta_abs = 0;
        for (int64_t x = 0; x < D; ++x) {
          d_o[x] = t.d_o.at({b, i, h, x}) * f.descale_do;
          o[x] = t.o.at({b, i, h, x}) * (IsFp8(c.o_dtype) ? f.descale_o : 1.0f);
          delta += d_o[x] * o[x];
          delta_abs += std::fabs(d_o[x] * o[x]);
        }
        for (int64_t j = 0; j < hi; ++j) {
          double dpv = 0, dpv_abs = 0;
          for (int64_t x = 0; x < D; ++x) {
            dpv += d_o[x] * v(b, j, hk, x);
            dpv_abs += std::fabs(d_o[x] * v(b, j, hk, x));
          }
          const double dp = p[j] * (dpv - delta) * scale;  // the gradient of q . k
          e.amax_dp = std::max(e.amax_dp, std::fabs(dp));
          const double dp_error = dp_type.u * std::fabs(dp) + dp_type.a / f.scale_dp;
          const double edp = 1.01 * scale *
                                 (ep[j] * std::fabs(dpv - delta) +
                                  p[j] * gamma_d * (dpv_abs + delta_abs)) +
                             4 * u32 * std::fabs(dp);
          e.dp_f32 = std::max(e.dp_f32, edp);
          for (int64_t x = 0; x < D; ++x) {
            const int64_t iq = Idx(b, i, h, x, SQ, HQ, D), ik = Idx(b, j, hk, x, SKV, HKV, D);
            e.dv[ik] += p[j] * d_o[x];
            e.dv_bound[ik] += (s_type.u * p[j] + s_type.a / f.scale_s) * std::fabs(d_o[x]);
            e.dv_f32[ik] += ep[j] * std::fabs(d_o[x]);
            e.dq[iq] += dp * k(b, j, hk, x);
            e.dq_bound[iq] += dp_error * std::fabs(k(b, j, hk, x));
            e.dq_f32[iq] += edp * std::fabs(k(b, j, hk, x));
            e.dk[ik] += dp * q(b, i, h, x);
            e.dk_bound[ik] += dp_error * std::fabs(q(b, i, h, x));
            e.dk_f32[ik] += edp * std::fabs(q(b, i, h, x));
          }
        }
      }
  return e;
}

}  // namespace fusedattn::testing
