// The heavy-first tile schedule (schedule.h): one block of 1024 threads, a counting sort of the
// sequences on their tile counts in shared memory.
#include "backends/flash/device_common.cuh"
#include "backends/flash/schedule.h"
#include "common/cuda_util.h"

namespace fusedattn::flash {
namespace {

constexpr int kScheduleThreads = 1024;
constexpr int kScheduleWarps = kScheduleThreads / 32;

__device__ __forceinline__ int TileCount(const FlashParams& p, int b, bool by_keys, int tile_rows,
                                         int max_tiles) {
  // The query side alone when ordering query tiles (paged K/V has no cu_seqlens_kv to read).
  const int len = by_keys ? LoadSeq(p, b).len_kv : LoadQuerySeq(p, b).len_q;
  const int tiles = (len + tile_rows - 1) / tile_rows;
  return tiles < max_tiles ? tiles : max_tiles;
}

// Block-wide exclusive sums of two ints per thread (all kScheduleThreads threads call it);
// *total_a, *total_b: the block's sums. sums: 2 * kScheduleWarps ints of shared memory.
__device__ __forceinline__ void BlockExclusiveSum2(int* a, int* b, int* total_a, int* total_b,
                                                   int* sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int ia = *a, ib = *b;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int ya = __shfl_up_sync(0xffffffffu, ia, d), yb = __shfl_up_sync(0xffffffffu, ib, d);
    if (lane >= d) ia += ya, ib += yb;
  }
  if (lane == 31) sums[warp] = ia, sums[kScheduleWarps + warp] = ib;
  __syncthreads();
  if (warp == 0) {
    int wa = sums[lane], wb = sums[kScheduleWarps + lane];  // kScheduleWarps == 32
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int ya = __shfl_up_sync(0xffffffffu, wa, d), yb = __shfl_up_sync(0xffffffffu, wb, d);
      if (lane >= d) wa += ya, wb += yb;
    }
    sums[lane] = wa, sums[kScheduleWarps + lane] = wb;  // inclusive over warps
  }
  __syncthreads();
  const int pa = warp > 0 ? sums[warp - 1] : 0, pb = warp > 0 ? sums[kScheduleWarps + warp - 1] : 0;
  *a = ia - *a + pa;
  *b = ib - *b + pb;
  *total_a = sums[kScheduleWarps - 1];
  *total_b = sums[2 * kScheduleWarps - 1];
  __syncthreads();  // sums reused by the next call
}

__global__ void __launch_bounds__(kScheduleThreads)
    TileScheduleKernel(const FlashParams p, bool by_keys, int tile_rows, int max_tiles) {
  static_assert(kScheduleWarps == 32, "one warp scans the warp sums");
  extern __shared__ int smem[];
  __shared__ int sums[2 * kScheduleWarps];
  const int bins = max_tiles + 1;
  // count[t]: sequences with t tiles, then the next free position of bin t (the bins in
  // descending t). base[t]: tiles before the bin's first position, minus that position * t.
  int* count = smem;
  int* base = smem + bins;
  int32_t* order = p.schedule_workspace;
  int32_t* tile_start = order + p.batch;

  for (int t = threadIdx.x; t < bins; t += kScheduleThreads) count[t] = 0;
  __syncthreads();
  for (int b = threadIdx.x; b < p.batch; b += kScheduleThreads)
    atomicAdd(&count[TileCount(p, b, by_keys, tile_rows, max_tiles)], 1);
  __syncthreads();

  // Exclusive sums over the bins from the most tiles down, in chunks of one value per thread.
  int carry_seqs = 0, carry_tiles = 0;
  for (int chunk = 0; chunk < bins; chunk += kScheduleThreads) {
    const int r = chunk + static_cast<int>(threadIdx.x);
    const int t = max_tiles - r;
    int seqs = r < bins ? count[t] : 0;
    int tiles = seqs * (t > 0 ? t : 0);
    int total_seqs, total_tiles;
    BlockExclusiveSum2(&seqs, &tiles, &total_seqs, &total_tiles, sums);
    if (r < bins) {
      const int first = carry_seqs + seqs;
      count[t] = first;
      base[t] = carry_tiles + tiles - first * t;
    }
    carry_seqs += total_seqs;
    carry_tiles += total_tiles;
  }
  __syncthreads();

  for (int b = threadIdx.x; b < p.batch; b += kScheduleThreads) {
    const int t = TileCount(p, b, by_keys, tile_rows, max_tiles);
    const int pos = atomicAdd(&count[t], 1);
    order[pos] = b;
    tile_start[pos] = base[t] + pos * t;
  }
  if (threadIdx.x == 0) tile_start[p.batch] = carry_tiles;
}

}  // namespace

Status LaunchTileSchedule(const FlashParams& p, bool by_keys, int tile_rows, int max_tiles,
                          cudaStream_t stream, bool* scheduled) {
  *scheduled = false;
  if (p.schedule_workspace == nullptr) return Status::Ok();
  // The planner gives a workspace only to problems it checked against these limits.
  if (p.batch < 1 || tile_rows < 1 || max_tiles < 0 || max_tiles + 1 > kScheduleMaxBins)
    return InternalError(
        "flash: the planner chose the THD schedule for %d sequences of up to %d tiles of %d rows, "
        "which the scheduling kernel cannot sort (at most %d tile counts)",
        p.batch, max_tiles, tile_rows, kScheduleMaxBins - 1);
  const size_t smem = 2 * static_cast<size_t>(max_tiles + 1) * sizeof(int);
  if (smem > 48 * 1024)
    FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(
        TileScheduleKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  TileScheduleKernel<<<1, kScheduleThreads, smem, stream>>>(p, by_keys, tile_rows, max_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  *scheduled = true;
  return Status::Ok();
}

}  // namespace fusedattn::flash
