// Host entry points of the Hopper (sm_90a) kernels: warpgroup MMA (wgmma) with TMA loads and an
// mbarrier pipeline (fwd_kernel_sm90.cuh, bwd_kernel_sm90.cuh, wgmma.cuh). Built only when
// CMAKE_CUDA_ARCHITECTURES contains 90a (FUSEDATTN_FLASH_SM90); without it WgmmaCompiled() is
// false, the planner never chooses them and nothing else here is called.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/flash/kernels.h"
#include "backends/flash/sm90_tile.h"  // Sm90Scores, Sm90FwdTile

namespace fusedattn::flash {

// Whether this build contains the wgmma kernels.
bool WgmmaCompiled();
// Whether the environment allows them: FUSEDATTN_FLASH_WGMMA is not "0" (read once per process).
// The planner (planner.h, DeviceFacts) decides with both whether the Hopper path runs a call.
bool WgmmaAllowedByEnvironment();

// The wgmma forward on head dims padded to kHeadDim (64, 128 or 256) with the score policy
// kScores, when the planner chose it (planner.cpp: the problem, the tensors TMA can describe,
// scale > 0). The launcher keeps its own guards: *launched = false (nothing launched) when they
// refuse what the plan chose (among them a problem of the other policy, or paged K/V on a
// contiguous instance and the reverse), which the backend reports as an internal error.
// kPaged: K/V from a paged cache (p.paged; chunked prefill), instances at kHeadDim 64 and 128
// only, a compile-time policy of the producer so that the contiguous instances carry none of it.
template <typename Element, int kHeadDim, Sm90Scores kScores, bool kPaged = false>
Status LaunchWgmmaForward(const FlashParams& p, cudaStream_t stream, bool* launched);

// Keys per step of the wgmma forward's tile at instance kHeadDim for a problem with this many keys
// (the planner prints it, the launcher runs it). d64 has two tiles: 64 keys per step with two
// blocks per SM (one block's prologue and epilogue overlap the other's loop, which short
// sequences need), and from 4096 keys d128's configuration, 128 keys per step, one block per SM
// with 240 registers per consumer and the intra-warpgroup overlap (H200, bf16 s16384: 413
// against 386-389 TFLOP/s, causal 408 against 370; s4096 +1-2%; s1024 8-13% slower).
// d128: 128; d256: 80.
constexpr int kSm90D64LongKeys = 4096;
inline int Sm90ForwardKeysPerStep(int instance, int64_t max_seqlen_kv) {
  if (instance == 64) return max_seqlen_kv >= kSm90D64LongKeys ? 128 : 64;
  return instance == 128 ? 128 : 80;
}

// Why the paged instances of the wgmma forward cannot take this page size, or null when they
// can: a power of two of at least 16 tokens. Their producer loads a key tile (Sm90ForwardKeys-
// PerStep: 64 or 128 keys at d64, 128 at d128) as one TMA box per page (page_size below the tile) or per tile (pages of whole
// tiles), each box on a 2048-byte boundary of the 128-byte swizzle; pages of fewer than 16
// tokens would mean more than 8 boxes per tile and column block from one thread. The planner
// and the launcher both ask this.
inline const char* Sm90PagedRefusal(int64_t page_size) {
  if (page_size < 16 || (page_size & (page_size - 1)) != 0)
    return "the Hopper forward reads paged K/V with page sizes that are powers of two of at "
           "least 16 (one TMA box per page or per key tile)";
  return nullptr;
}

// The wgmma key-block kernel of the backward (bwd_kernel_sm90.cuh) with the score policy kScores
// (plain, or softcap-alibi: the forward's policies, its own instance set) at kHeadDim 64 or 128,
// in place of LaunchFastBackward, when the planner chose it: needs the preprocess before (D,
// zeroed dq_accum with dq_accum_dim == kHeadDim) and LaunchConvertDq after, with dq_accum_tiled
// set (the kernel leaves dQ in the tiled order of dq_accum_layout.h). kDeterministic (its own
// instances, so that the non-deterministic kernels carry none of its code): for
// p.deterministic, dQ added to the workspace in a fixed order of the key blocks, which needs
// p.dq_order (DqOrderInts(batch, heads_q, max_seqlen_q) int32 values; the launcher zeroes them).
// *launched as for the forward (also false when p.deterministic is not kDeterministic).
template <typename Element, int kHeadDim, Sm90Scores kScores, bool kDeterministic>
Status LaunchWgmmaBackward(const FlashParams& p, cudaStream_t stream, bool* launched);

// Encodes a CUtensorMap (128-byte aligned storage of 128 bytes at `map`) for a q/k/v tensor of
// 16-bit elements seen as [batch][heads][rows][cols] with the strides of `t` (THD: rows are the
// token axis and batch is 1), boxes of 64 columns x box_rows rows, 128-byte swizzle, zero fill
// out of bounds. False when TMA cannot describe the tensor (TmaDescribesTensor, planner.h, which
// the planner asks before it chooses the Hopper path) or the driver entry point is missing.
bool EncodeQkvTensorMap(void* map, const TensorArg& t, bool bf16, int64_t rows, int cols,
                        int heads, int batch, int box_rows);

// EncodeQkvTensorMap for e4m3 elements (1 byte): boxes of 128 columns (128 bytes, one swizzle
// block) x box_rows rows. The FP8 forward's q, k and V^T (its workspace).
bool EncodeFp8TensorMap(void* map, const TensorArg& t, int64_t rows, int cols, int heads,
                        int batch, int box_rows);

// The FP8 (e4m3) forward at instance kHeadDim (128; head dims up to it, head_dim_v a multiple of
// 16) when the planner chose it (planner.cpp's Fp8ForwardRefusal): zeroes amax_s and amax_o,
// writes V^T into p.fp8.value_t (the pre-pass), then runs WgmmaForwardKernel<Fp8E4m3, ...>.
// *launched = false (nothing launched) where its own guards refuse the params.
template <int kHeadDim>
Status LaunchWgmmaForwardFp8(const FlashParams& p, cudaStream_t stream, bool* launched);

// EncodeQkvTensorMap for a page pool of paged K/V (p.k or p.v when p.paged.page_table is set):
// [num_pages][heads_kv][page_size rows][cols] with the pool's strides (stride_b from page to
// page), boxes of box_rows rows. Also false when TMA cannot describe the pool.
bool EncodePageTensorMap(void* map, const FlashParams& p, const TensorArg& t, int cols,
                         int box_rows, bool bf16);

// EncodeQkvTensorMap for a tensor of a flash launch: query side (q, dO: max_seqlen_q rows,
// heads_q) or key side (k, v: max_seqlen_kv, heads_kv); THD tensors are one batch of
// tokens_q / tokens_kv rows. Also false when a row coordinate of a tile (token start + tile
// offset, box_rows rows) might not fit TMA's int32 coordinates.
bool EncodeLaunchTensorMap(void* map, const FlashParams& p, const TensorArg& t, bool query_side,
                           int cols, int box_rows, bool bf16);

// Test hook for one warpgroup MMA tile against a CPU matmul (tests/gpu/flash_wgmma_test.cpp), all
// pointers on the device, 16-bit elements (fp16 or bf16), row-major:
//  mode 0: C[64][64] = A[64][128] . B[64][128]^T, both operands K-major from shared memory written
//          by threads in the swizzled layout (the S = Q K^T pattern, two column blocks);
//  mode 1: C[64][128] = A[64][64] . B[64][128], A from registers, B MN-major (the O += P V pattern);
//  mode 2: mode 0 with the operands loaded by TMA (tensor maps from EncodeQkvTensorMap);
//  mode 3: C[64][64] = A[64][128] . B[128][64] with `a` holding A transposed, At[128][64], both
//          operands MN-major from shared memory written by threads (the backward's dQ = dS K
//          pattern: dS^T read through the transpose-A bit, K as an MN-major B);
//  mode 4: C[64][80] = A[64][256] . B[80][256]^T, both loaded by TMA as four 64-column boxes
//          (the d256 forward's S = Q K^T: m64n80k16, boxes of 80 rows);
//  mode 5: C[64][256] = A[64][80] . B[80][256], A from registers, B MN-major in four column
//          blocks of 80 rows (the d256 forward's O += P V: m64n256k16).
Status WgmmaTileSelfTest(int mode, bool bf16, const void* a, const void* b, float* c,
                         cudaStream_t stream);

}  // namespace fusedattn::flash
