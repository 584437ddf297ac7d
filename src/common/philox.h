// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// dropout rule of fusedattn.h. Header-only and usable on host and device, so that every backend
// draws exactly the reference's mask.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__CUDA_ARCH__)
#define FUSEDATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FUSEDATTN_HOST_DEVICE inline
#endif

namespace fusedattn {

struct Philox4 {
  uint32_t x, y, z, w;
};

// The high and low words of a * b. On the device as two 32-bit operations (ptxas fuses them into
// one IMAD.WIDE): from the 64-bit product, NVVM kept 64-bit XORs of the words that ptxas lowered
// with an extra add per multiply (about a fifth of the Hopper dropout forward's mask arithmetic;
// the mma.sync full backward spills less with it, ptxas -v, sm_80 and sm_90a). Same words.
FUSEDATTN_HOST_DEVICE uint32_t PhiloxMulHi(uint32_t a, uint32_t b, uint32_t* lo) {
#if defined(__CUDA_ARCH__)
  *lo = a * b;
  return __umulhi(a, b);
#else
  uint64_t product = static_cast<uint64_t>(a) * b;
  *lo = static_cast<uint32_t>(product);
  return static_cast<uint32_t>(product >> 32);
#endif
}

// Ten rounds of Philox4x32 on counter c with key (k0, k1).
FUSEDATTN_HOST_DEVICE Philox4 Philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t lo0, lo1;
    uint32_t hi0 = PhiloxMulHi(kMul0, c.x, &lo0);
    uint32_t hi1 = PhiloxMulHi(kMul1, c.z, &lo1);
    c = Philox4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

// The dropout stream of one attention row: row = (b * heads_q + h) * max_seqlen_q + i.
struct DropoutRow {
  uint32_t key0, key1, row, offset_lo, offset_hi, threshold;

  FUSEDATTN_HOST_DEVICE static uint32_t Threshold(double probability) {
    double scaled = probability * 4294967296.0;
    return scaled >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(scaled);
  }

  // The four words for keys j = 4 * group .. 4 * group + 3.
  FUSEDATTN_HOST_DEVICE Philox4 Words(uint32_t group) const {
    return Philox4x32_10(Philox4{group, row, offset_lo, offset_hi}, key0, key1);
  }

  FUSEDATTN_HOST_DEVICE bool Keep(int64_t j) const {
    Philox4 r = Words(static_cast<uint32_t>(j >> 2));
    uint32_t words[4] = {r.x, r.y, r.z, r.w};
    return words[j & 3] >= threshold;
  }
};

FUSEDATTN_HOST_DEVICE DropoutRow MakeDropoutRow(uint64_t seed, uint64_t offset, uint32_t threshold,
                                                int64_t b, int64_t h, int64_t i, int64_t heads_q,
                                                int64_t max_seqlen_q) {
  DropoutRow r;
  r.key0 = static_cast<uint32_t>(seed);
  r.key1 = static_cast<uint32_t>(seed >> 32);
  r.row = static_cast<uint32_t>((b * heads_q + h) * max_seqlen_q + i);
  r.offset_lo = static_cast<uint32_t>(offset);
  r.offset_hi = static_cast<uint32_t>(offset >> 32);
  r.threshold = threshold;
  return r;
}

}  // namespace fusedattn
