// Tile shapes of the fast kernels and the shared memory they take, in plain C++ so that the host
// launchers (fwd_kernel.cuh, bwd_kernel.cuh and the run-time compiled score_mod kernels, jit.cpp)
// and the kernels read them from one place. Also compiled by NVRTC (no includes).
#pragma once

namespace fusedattn::flash {

// Forward: kBlockM query rows, kBlockN keys, kWarps warps per padded head dim and variant.
// kBlockM / kWarps rows per warp: 32 (two 16-row mma tiles) halves the shared-memory reads of K
// and V per flop, where registers allow; the full variant (score modifiers, dropout) needs more
// registers and takes 16 rows per warp.
template <int kHeadDim, bool kFull>
struct FwdTile {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8;
};
template <>
struct FwdTile<64, false> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4;
};
template <>
struct FwdTile<128, false> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4;
};

// Backward key-block kernel: kBlockM queries per step, kBlockN keys per block.
template <int kHeadDim>
struct BwdTile;
template <>
struct BwdTile<64> {
  static constexpr int kBlockM = 64, kBlockN = 128, kWarps = 8;
};
template <>
struct BwdTile<128> {
  static constexpr int kBlockM = 64, kBlockN = 128, kWarps = 8;
};
template <>
struct BwdTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 8;
};

// Deterministic dQ kernel: kBlockM queries per block, kBlockN keys per step.
template <int kHeadDim>
struct DqTile;
template <>
struct DqTile<64> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4;
};
template <>
struct DqTile<128> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4;
};
template <>
struct DqTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 32, kWarps = 4;
};

// Dynamic shared memory of each kernel (element_bytes: 2 for float16/bfloat16).
template <int kHeadDim, bool kFull>
constexpr unsigned long FwdSmemBytes(int element_bytes) {
  using Tile = FwdTile<kHeadDim, kFull>;
  return static_cast<unsigned long>(Tile::kBlockM + 2 * Tile::kBlockN) * (kHeadDim + 8) *
         element_bytes;
}
template <int kHeadDim>
constexpr unsigned long BwdSmemBytes(int element_bytes) {
  using Tile = BwdTile<kHeadDim>;
  return static_cast<unsigned long>(2 * Tile::kBlockN + 4 * Tile::kBlockM) * (kHeadDim + 8) *
             element_bytes +
         static_cast<unsigned long>(2 * Tile::kBlockN) * (Tile::kBlockM + 8) * element_bytes +
         static_cast<unsigned long>(4 * Tile::kBlockM) * 4;
}
template <int kHeadDim>
constexpr unsigned long DqSmemBytes(int element_bytes) {
  using Tile = DqTile<kHeadDim>;
  return static_cast<unsigned long>(2 * Tile::kBlockM + 2 * Tile::kBlockN) * (kHeadDim + 8) *
         element_bytes;
}

}  // namespace fusedattn::flash
