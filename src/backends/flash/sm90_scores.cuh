// The softcap-alibi score policy of the Hopper kernels (sm90.h's Sm90Scores::kSoftcapAlibi),
// written once for the forward (fwd_kernel_sm90.cuh) and the backward (bwd_kernel_sm90.cuh):
// fusedattn.h's score without a bias tensor, in log2 units,
//   s = log2(e) (softcap tanh(scale q.k / softcap) - slope_h |i + len_kv - len_q - j|)
// (device_common.cuh's ScoreOf pipeline, through its AlibiDiagonal, AlibiSlope and SoftcapTanh), so that both directions and the mma.sync kernels compute the same P from the same LSE.
// The kernels apply it to whole tiles in their own register layouts; what they share is the
// arithmetic of one element and the problems the policy runs.
#pragma once

#include "backends/flash/device_common.cuh"
#include "backends/flash/sm90_tile.h"  // Sm90Scores, Sm90ScoresFor

namespace fusedattn::flash {

// Which policy runs a problem: sm90_tile.h's Sm90ScoresFor on its FlashParams (the planner asks
// the same of the config); forward: the forward's rule (with the bias policy).
inline bool Sm90ScoresOf(const FlashParams& p, bool forward, Sm90Scores* scores) {
  return Sm90ScoresFor(
      p.bias_type == FUSEDATTN_BIAS_PRE_SCALE || p.bias_type == FUSEDATTN_BIAS_POST_SCALE,
      p.bias_type == FUSEDATTN_BIAS_ALIBI, p.softcap > 0.f, p.dropout, forward, scores);
}

namespace sm90 {

// One element of the policy. With a softcap: s = Capped(th), th = Tanh(q.k); without one:
// s = Scaled(q.k); then with ALiBi: s = Alibi(s, slope, distance), distance = AlibiDiagonal(i) - j
// as a float (exact below 2^24 keys; the sign does not matter). The backward's gradient with
// respect to scale q.k is dS * CapDerivative(th) (ScoreOf's derivative; ALiBi is a constant).
// The kernels branch on p.softcap and p.bias_type once per tile (uniform), outside their loops.
// The forward folds Capped's or Scaled's factor into its softmax's FFMA (it keeps S in units of
// that factor, ALiBi's slope divided by it), one multiply per score less.
struct SoftcapAlibiScores {
  float to_tanh;   // scale / softcap
  float cap_log2;  // softcap log2(e)
  __device__ __forceinline__ explicit SoftcapAlibiScores(const FlashParams& p)
      : to_tanh(p.scale / p.softcap), cap_log2(p.softcap * kLog2e) {}
  __device__ __forceinline__ float Tanh(float qk) const { return SoftcapTanh(qk * to_tanh); }
  __device__ __forceinline__ float Capped(float th) const { return cap_log2 * th; }
  __device__ static __forceinline__ float CapDerivative(float th) { return 1.f - th * th; }
  // Without a softcap: scale log2(e) q.k, with qk_log2 = ScaledFactor(p).
  __device__ static __forceinline__ float ScaledFactor(const FlashParams& p) {
    return p.scale * kLog2e;
  }
  __device__ static __forceinline__ float Scaled(float qk, float qk_log2) { return qk * qk_log2; }
  // ALiBi: the head's slope in log2 units (read only where p.bias_type is ALiBi), and the term.
  __device__ static __forceinline__ float SlopeLog2(const FlashParams& p, int h) {
    return AlibiSlope(p, h) * kLog2e;
  }
  __device__ static __forceinline__ float Alibi(float s, float slope_log2, float distance) {
    return fmaf(-slope_log2, fabsf(distance), s);
  }
};

}  // namespace sm90
}  // namespace fusedattn::flash
