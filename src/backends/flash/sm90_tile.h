// The Hopper forward's compile-time configuration in plain C++ (no includes), so that the
// kernel (fwd_kernel_sm90.cuh), the host code that launches it (its launchers, and jit.cpp for
// the run-time compiled score_mod instances) and NVRTC read it from one place: the score policies
// and the tile shapes with their shared memory.
#pragma once

namespace fusedattn::flash {

// The score policies of the wgmma forward and backward, one instance set each per direction
// (generate_kernels.py), chosen at compile time so that the plain instance carries no code of the
// other:
//  kPlain: s = scale * q.k (masks, windows, sinks, off-by-one);
//  kSoftcapAlibi: softcap and/or ALiBi with the caller's slopes (fusedattn.h's pipeline without a
//    bias tensor, sm90_scores.cuh), applied to every key tile before the mask;
//  kBias (forward only): a pre- or post-scale bias tensor (qkv dtype or float32, any strides,
//    broadcast over batch and heads), with or without softcap, each thread's elements read from
//    global memory (fwd_kernel_sm90.cuh);
//  kScoreMod (forward only, never an ahead-of-time instance): a score_mod graph compiled at run
//    time by NVRTC (jit.h), its policy struct the kernel's Mod argument: s = Mod(scale * q.k) per
//    element with the mask_mod and the block mask of its module;
//  kDropout (forward only): dropout, with the plain score or with softcap and/or ALiBi (the
//    softcap-alibi arithmetic, chosen per call as there): fusedattn.h's Philox mask, the same
//    elements the mma.sync kernels and the reference drop (sm90_scores.cuh's DropoutKeepBits),
//    applied to P after the row sums, so that the LSE is the undropped one.
// No Hopper kernel runs dropout with a bias tensor, nor dropout or bias tensors in the backward:
// the mma.sync full variant runs them (a Hopper dropout forward is followed by the mma.sync
// backward, which draws the same mask).
enum class Sm90Scores : int {
  kPlain = 0,
  kSoftcapAlibi = 1,
  kBias = 2,
  kScoreMod = 3,
  kDropout = 4
};

// The one rule for which ahead-of-time score policy runs a problem without a score_mod graph:
// *scores, or false where none does (dropout in the backward or with a bias tensor; a bias
// tensor in the backward). The planner asks it of the config (planner.cpp's HopperVariantOf),
// the launchers of FlashParams, so that the plan explain prints and the instance that runs
// cannot disagree. bias_tensor: a pre- or post-scale bias tensor; alibi: ALiBi slopes; softcap:
// softcap > 0; dropout: dropout > 0.
inline bool Sm90ScoresFor(bool bias_tensor, bool alibi, bool softcap, bool dropout, bool forward,
                          Sm90Scores* scores) {
  if (!forward && (dropout || bias_tensor)) return false;
  if (dropout && bias_tensor) return false;
  *scores = dropout                ? Sm90Scores::kDropout
            : bias_tensor          ? Sm90Scores::kBias
            : (softcap || alibi) ? Sm90Scores::kSoftcapAlibi
                                 : Sm90Scores::kPlain;
  return true;
}

// kLongKeys (d64 only, sm90.h's Sm90ForwardKeysPerStep): d128's configuration at d64.
// kElementBytes: 2 (float16/bfloat16), or 1 for the FP8 (e4m3) forward, at d128 only: a row of
// Q or K is then 128 bytes, one 128-byte swizzle block (one TMA box of 128 columns), and V is
// read transposed (V^T, keys contiguous: fp8 wgmma has no transpose bit, both operands are
// K-major; see Sm90Fp8ValueKeyOfColumn below).
template <int kHeadDim, bool kLongKeys = false, int kElementBytes = 2>
struct Sm90FwdTile {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "wgmma forward: head dims 64, 128 and 256");
  static_assert(!kLongKeys || kHeadDim == 64, "the long-key tile is d64's");
  static_assert(kElementBytes == 2 || (kElementBytes == 1 && kHeadDim == 128 && !kLongKeys),
                "the FP8 forward's tile is d128's");
  static constexpr bool kTwoBlocks = kHeadDim == 64 && !kLongKeys;
  static constexpr int kBlockM = 128;  // 2 consumer warpgroups x 64 rows
  // d64: 64 keys per step and two blocks per SM (registers for 2 x 384 threads), so that one
  // block's prologue and epilogue overlap the other's main loop on short sequences, or with
  // kLongKeys d128's tile; d128: one block per SM with 128 keys per step; d256: 80 keys per
  // step, what shared memory holds (Q 64 KB + 2 stages of K and V at 40 KB each = 224 KB of the
  // 227 KB a block may have).
  static constexpr int kBlockN = kTwoBlocks ? 64 : kHeadDim == 256 ? 80 : 128;
  static constexpr int kMinBlocks = kTwoBlocks ? 2 : 1;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerWarps = 8;
  // setmaxnreg: the block starts at 65536 / (384 kMinBlocks) registers per thread, rounded down to
  // 8 (168 or 80); the producer gives back what the consumers take.
  static constexpr int kStartRegs = 65536 / (kThreads * kMinBlocks) / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kTwoBlocks ? 104 : 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kStartRegs,
                "register budget");
  // The softmax of S(n + 1) overlaps O += P(n) V(n) of the same consumer: S, P and O in
  // registers at once (64 + 32 + 64 at d128, 40 + 20 + 128 at d256). d64's two-block tile's 104
  // registers cannot hold its 32 + 16 + 32 with the rest (ptxas then serializes every wgmma,
  // C7512): there O += P V completes before S is issued, and only the ping-pong between the
  // consumers hides the softmax.
  static constexpr bool kOverlapSoftmax = !kTwoBlocks;
  // d256: O (128 registers per thread) is rescaled right after S(n + 1) = Q K^T is issued, while
  // the tensor cores compute it, and just before O += P(n) V(n) is issued, rather than after
  // O += P V completes, where the rescale would delay the next step (FlashAttention-3's
  // RescaleOBeforeGemm).
  static constexpr bool kRescaleOBeforeValueProduct = kHeadDim == 256;
  // The two consumers take turns issuing their products (see the kernel). Not at d256, where
  // FlashAttention-3 and -4 turn it off too (head dims above 128): the softmax over 80 keys is
  // short next to the step's two products, and each consumer's softmax already runs under its
  // own O += P V (not yet measured here with turns on).
  static constexpr bool kPingPong = kHeadDim <= 128;
  // 128-byte swizzle blocks of a Q/K row, each loaded as one TMA box of kBoxCols columns.
  static constexpr int kColBlocks = kHeadDim * kElementBytes / 128;
  static constexpr int kBoxCols = 128 / kElementBytes;
  // Keys per wgmma of O += P V (its K): 16 for 16-bit operands, 32 for FP8 (m64nNk32).
  static constexpr int kKeysPerValueMma = 32 / kElementBytes;
  static constexpr int kQBytes = kBlockM * kHeadDim * kElementBytes;
  static constexpr int kKvBytes = kBlockN * kHeadDim * kElementBytes;  // one K or V (V^T) stage
  static constexpr int kBarrierOffset = kQBytes + 2 * kStages * kKvBytes;
  static constexpr int kBarriers = 2 + 4 * kStages;  // q_full, fix, k/v full, k/v empty
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;  // + alignment slack
};

// The FP8 forward's O += P V (fwd_kernel_sm90.cuh, Element Fp8E4m3): P is the register A operand
// of wgmma m64nNk32 .e4m3, V^T the K-major B operand (keys contiguous in each row of d), written
// by a pre-pass into the call's workspace. The A fragment of m64nNk32 (8-bit types; PTX ISA,
// "Register Fragments" of wgmma, the layout of mma.m16n8k32's 8-bit A per warp) gives lane
// 4 g + c of a warp, for rows g and g + 8 of its 16, the K positions {4c .. 4c + 3} (registers
// 0 and 1) and {16 + 4c .. 19 + 4c} (registers 2 and 3) of each 32-wide K step; the S
// accumulator (m64nNk32 and k16 alike: the mma.sync C fragment per 8-column slice) gives the same
// lane the keys {2c, 2c + 1, 8 + 2c, 9 + 2c, 16 + 2c, 17 + 2c, 24 + 2c, 25 + 2c} of each 32 keys.
// Instead of moving P between lanes, the keys of every 32-key block of V^T are stored in the
// order P's registers hold them: K position 4c + i (i < 4) holds key (i < 2 ? 2c + i : 8 + 2c +
// i - 2), and position 16 + 4c + i key 16 + the same. The sum over the keys does not depend on
// their order as long as P and V^T agree. The map is a permutation of [0, 32) (every key once).
// Used by the pre-pass (device) and tests/cpu (host): one definition.
#if defined(__CUDACC__)
#define FUSEDATTN_SM90_TILE_HD __host__ __device__ __forceinline__
#else
#define FUSEDATTN_SM90_TILE_HD inline
#endif
constexpr int kSm90Fp8KeyBlock = 32;
// The key (0..31, inside its 32-key block) at K position `column` (0..31) of V^T.
FUSEDATTN_SM90_TILE_HD constexpr int Sm90Fp8ValueKeyOfColumn(int column) {
  return (column & 16) + ((column & 3) < 2 ? 2 * ((column & 15) >> 2) + (column & 3)
                                           : 8 + 2 * ((column & 15) >> 2) + (column & 3) - 2);
}
// Keys per row of the V^T workspace: the keys rounded up to the FP8 forward's key tile (128),
// zero past the sequence's keys.
FUSEDATTN_SM90_TILE_HD constexpr long long Sm90Fp8ValueKeys(long long max_seqlen_kv) {
  return (max_seqlen_kv + 127) / 128 * 128;
}
// Bytes of the V^T workspace: [batch][heads_kv][128 rows of d][Sm90Fp8ValueKeys] e4m3.
FUSEDATTN_SM90_TILE_HD constexpr long long Sm90Fp8ValueBytes(long long batch, long long heads_kv,
                                                             long long max_seqlen_kv) {
  return batch * heads_kv * 128 * Sm90Fp8ValueKeys(max_seqlen_kv);
}
#undef FUSEDATTN_SM90_TILE_HD

}  // namespace fusedattn::flash
