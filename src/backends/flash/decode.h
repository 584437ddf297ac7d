// flash's decode kernel (decode_kernel.cuh): a few query rows per sequence (max_seqlen_q <= 16)
// against a paged or contiguous K/V cache, split over the keys (flash-decoding) with a combine
// step. README.md, "Paged K/V and decode", says how it works; this is its host side.
//
// The planner (planner.cpp) asks DecodeFits / WantsDecode, PlanDecode and DecodeWorkspaceBytes,
// with the device as DeviceFacts (planner.h), never the current device; the backend's forward
// runs the plan's decode path with RunDecode (fills max_logit, launches the kernel and the
// combine) on the facts it planned with, so the split count a call runs with is its plan's
// decode_splits.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "backends/flash/params.h"
#include "common/status.h"

namespace fusedattn {
struct Problem;
struct FwdTensors;
}  // namespace fusedattn

namespace fusedattn::flash {

struct DeviceFacts;  // planner.h

// Tiles of the decode kernel: kBlockN keys per tile, one quarter (16 keys) per warp; kStages
// tiles in shared memory, kStages - 1 of them in flight while one is computed. kRows query rows
// per block: 16 or 32 (one or two m16 mma tiles per warp).
template <int kHeadDim>
struct DecodeTile {
  static constexpr int kBlockN = 64, kWarps = 4;
  static constexpr int kStages = kHeadDim == 64 ? 4 : 3;
};

// Blocks of an instance an SM should hold: the kernel's __launch_bounds__ minimum, so that
// registers never keep that many off an SM (at most 65536 / (128 * n) registers a thread: 256
// for 2, 170 for 3). Shared memory (DeviceFacts) may allow fewer; the planner counts the smaller
// of the two. 3 only where shared memory lets three in on an H100: d64 with 16 rows (77 KB a
// block, 3 x 3 tiles of 16 KB in flight per SM); d64 with 32 rows takes 78 KB, which two fit.
template <int kHeadDim, int kRows>
constexpr int DecodeMinBlocksPerSm() {
  return kHeadDim == 64 && kRows == 16 ? 3 : 2;
}

// Dynamic shared memory of an instance (16-bit elements): Q (kRows rows), then either the K/V
// stages or, after the key loop, the warps' partial results for the block's reduction.
template <int kHeadDim, int kRows>
constexpr size_t DecodeSmemBytes() {
  using Tile = DecodeTile<kHeadDim>;
  constexpr size_t stride = kHeadDim + 8;
  constexpr size_t q = kRows * stride * 2;
  constexpr size_t stages = size_t{Tile::kStages} * 2 * Tile::kBlockN * stride * 2;
  constexpr size_t reduce =
      (size_t{Tile::kWarps} * kRows * (kHeadDim + 8) + 3 * Tile::kWarps * kRows + kRows) * 4;
  return q + (stages > reduce ? stages : reduce);
}

struct DecodeParams {
  // Shapes, sequences (q side; k side when contiguous), mask, score pipeline, q/k/v/o/lse and
  // max_logit, as the other kernels take them. Paged (base.paged, params.h's PagedKvArg, as the
  // Hopper forward takes it): k and v are the pools, stride_b steps from page to page and
  // stride_s from token to token inside a page; entries outside [0, num_pages) are never
  // followed (their keys read as zeros). The decode kernel takes any page size.
  FlashParams base;
  int page_shift = -1;  // paged: log2(base.paged.page_size) when it is a power of two, else -1
  // Work split: rows = group * max_seqlen_q query rows per (sequence, kv head), row r being
  // query i = r / group of head hk * group + r % group; row_chunks blocks of kRows rows each;
  // splits blocks along the keys, split s taking the key tiles [s * tiles_per_split, ...).
  int rows = 0, row_chunks = 1;
  int splits = 1, tiles_per_split = 1;
  // splits > 1: the splits' results, O_s normalized inside the split and LSE_s (natural log,
  // -inf when the split saw no key of the row), indexed by ((s * batch + b) * heads_q + h) *
  // max_seqlen_q + i (times head_dim_v for O). splits == 1: the kernel writes o and lse itself.
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
  // Host side of the launch (the plan's programmatic_launch): launch the kernel, and the combine
  // after it, with programmatic stream serialization (sm_90). Each kernel then waits
  // (griddepcontrol.wait) for the grids before it to finish and their writes to be visible
  // before it reads or writes global memory, and lets the next one start launching early.
  bool programmatic_launch = false;
};

// How the decode kernel runs a problem (from the config and the DeviceFacts alone, so that the
// workspace size and the run agree).
struct DecodePlan {
  int head_dim = 0;   // instance: 64 or 128
  int block_rows = 16;  // kRows
  int rows = 0, row_chunks = 1;
  int splits = 1, tiles_per_split = 1;
  int blocks_per_sm = 1;  // resident blocks an SM holds (shared memory, DecodeMinBlocksPerSm)
  int64_t blocks = 0;     // the grid: batch * heads_kv * splits * row_chunks
  bool programmatic_launch = false;  // sm_90 only (DecodeParams::programmatic_launch)
  size_t workspace = 0;  // bytes of partials (0 with one split)
};

// The split count PlanDecode takes for `tiles` 64-key tiles per sequence when `base` blocks
// (sequences x kv heads x row chunks) share `slots` resident block slots (SMs x blocks per SM).
// Exposed for the planner's tests.
int DecodeSplitsFor(int64_t tiles, int64_t base, int64_t slots);

// Ok when the decode kernel runs this problem (CUDA tensors assumed), else why not: float16 or
// bfloat16 (o_dtype equal), head_dim_qk = head_dim_v in {64, 128}, max_seqlen_q <= 16, no
// dropout, no score_mod, compute capability >= 8.0 and the shared memory it needs.
Status DecodeFits(const Problem& p, const DeviceFacts& device);

// Whether flash's forward takes the decode kernel for this problem: every paged problem that
// fits, and contiguous ones that fit (max_seqlen_q <= 16): the kernel reads each kv head's keys
// once for its whole GQA group and splits long sequences over the GPU, where the prefill kernels
// read them once per query head and run one block per (query tile, head, sequence).
bool WantsDecode(const Problem& p, const DeviceFacts& device);

DecodePlan PlanDecode(const Problem& p, const DeviceFacts& device);
size_t DecodeWorkspaceBytes(const Problem& p, const DeviceFacts& device);

// Runs the problem (WantsDecode true) on the decode kernel as PlanDecode(p, device) says (device:
// the facts the call's plan was made with). common: the backend's FlashParams of the call
// (CommonParams). NotSupported, before anything is written, when the tensors do not suit the
// kernel (q, k, v rows not contiguous and 16-byte aligned); a workspace error when it is smaller
// than DecodeWorkspaceBytes.
Status RunDecode(const Problem& p, const FwdTensors& t, const FlashParams& common,
                 const DeviceFacts& device, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream);

// The kernels of one instance (decode_kernel.cuh, instances/flash_decode_*.cu).
template <typename Element, int kHeadDim>
Status LaunchDecode(const DecodeParams& p, int block_rows, cudaStream_t stream);

}  // namespace fusedattn::flash
