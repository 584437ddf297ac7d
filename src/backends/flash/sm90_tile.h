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
template <int kHeadDim, bool kLongKeys = false>
struct Sm90FwdTile {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "wgmma forward: head dims 64, 128 and 256");
  static_assert(!kLongKeys || kHeadDim == 64, "the long-key tile is d64's");
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
  static constexpr int kColBlocks = kHeadDim / 64;       // 64-column (128-byte) swizzle blocks
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;  // one K or V stage
  static constexpr int kBarrierOffset = kQBytes + 2 * kStages * kKvBytes;
  static constexpr int kBarriers = 2 + 4 * kStages;  // q_full, fix, k/v full, k/v empty
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;  // + alignment slack
};

}  // namespace fusedattn::flash
