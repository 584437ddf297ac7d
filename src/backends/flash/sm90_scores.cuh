// The softcap-alibi score policy of the Hopper kernels (sm90.h's Sm90Scores::kSoftcapAlibi),
// written once for the forward (fwd_kernel_sm90.cuh) and the backward (bwd_kernel_sm90.cuh):
// fusedattn.h's score without a bias tensor, in log2 units,
//   s = log2(e) (softcap tanh(scale q.k / softcap) - slope_h |i + len_kv - len_q - j|)
// (device_common.cuh's ScoreOf pipeline, through its AlibiDiagonal, AlibiSlope and SoftcapTanh), so that both directions and the mma.sync kernels compute the same P from the same LSE.
// The kernels apply it to whole tiles in their own register layouts; what they share is the
// arithmetic of one element and the problems the policy runs.
// Also the dropout mask of the forward's dropout policy (Sm90Scores::kDropout) in the wgmma
// accumulator layout (DropoutKeepBits).
#pragma once

#include "backends/flash/device_common.cuh"
#include "backends/flash/sm90_tile.h"  // Sm90Scores, Sm90ScoresFor

namespace fusedattn::flash {

// Which policy runs a problem: sm90_tile.h's Sm90ScoresFor on its FlashParams (the planner asks
// the same of the config); forward: the forward's rule (with the bias and dropout policies).
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

// The dropout mask of one key tile for a consumer thread of the Hopper forward, in the wgmma
// accumulator layout (m64nNk16: lane = 4 g + t of warp w holds rows 16 w + g and 16 w + g + 8 of
// its warpgroup's 64, and in each 8-key slice nt keys 8 nt + 2 t and 8 nt + 2 t + 1): bit
// 2 nt + c of keep[r] says whether the element of row r (row0 + 8 r) and key n0 + 8 nt + 2 t + c
// is kept, by fusedattn.h's rule (device_common.cuh's DropoutRow numbering and DropoutKeepPair,
// as the mma.sync kernels and the reference decide it).
// One Philox call gives the four words of keys 4 q .. 4 q + 3 of one row, and lanes t and t ^ 1
// hold the two halves of such a group, in both rows (keys n0 + 8 nt + 4 (t / 2) .. + 3): each lane
// computes the group of one row (t even: row0, t odd: row0 + 8; `stream` is that row's
// DropoutRowOf), keeps its own pair of keys and passes the other pair's bits to its partner, one
// shuffle per tile. That is one Philox call per four elements, the fewest the numbering allows
// (the mma.sync kernels make one per two: each thread its own pair). n0 is a multiple of 8, so
// the partner's first key of a slice is this thread's j ^ 2. Every lane of the warp must call it
// (the shuffle).
template <int kSlices>
__device__ __forceinline__ void DropoutKeepBits(const DropoutRow& stream, int n0, int t,
                                                uint32_t (&keep)[2]) {
  static_assert(2 * kSlices <= 32, "two bits per slice in one 32-bit word");
  uint32_t mine = 0, theirs = 0;  // this lane's pairs; the partner's pairs (of this lane's row)
#pragma unroll
  for (int nt = 0; nt < kSlices; ++nt) {
    const int j = n0 + 8 * nt + 2 * t;
    const Philox4 words = stream.Words(static_cast<uint32_t>(j >> 2));
    bool own0, own1, other0, other1;
    DropoutKeepPair(stream, words, j, &own0, &own1);
    DropoutKeepPair(stream, words, j ^ 2, &other0, &other1);
    mine |= (uint32_t{own0} | uint32_t{own1} << 1) << (2 * nt);
    theirs |= (uint32_t{other0} | uint32_t{other1} << 1) << (2 * nt);
  }
  const uint32_t received = __shfl_xor_sync(0xffffffffu, theirs, 1);  // the partner's row
  const bool odd = (t & 1) != 0;
  keep[0] = odd ? received : mine;
  keep[1] = odd ? mine : received;
}

}  // namespace sm90
}  // namespace fusedattn::flash
