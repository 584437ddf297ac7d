// The small kernels of the cuDNN backend (see kernels.h). Simple grid-stride loops over rows,
// every index checked; correctness over speed, they move O(rows) data.
#include "backends/cudnn/kernels.h"

#include <cuda_fp16.h>

#include <cmath>

namespace fusedattn::cudnn {

namespace {

constexpr int kThreads = 256;
// Stats at or below this (or NaN) mean that every score of the row was masked: cuDNN masks with
// -inf, or with the lowest float before 9.10, and a row of them yields -inf, NaN or about
// -3.4e38 plus a log. No visible score reaches it.
constexpr float kEmptyStats = -1e30f;
constexpr int64_t kInt32Max = 2147483647;

struct Seq {
  int64_t start_q, len_q, start_kv, len_kv;
};

__device__ int64_t Clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Sequence b's token starts (THD) and lengths, clamped so that nothing is read out of bounds.
// Entries past the problem's batch (THD graph capacity) are empty and start at the end.
__device__ Seq SequenceOf(const Sequences& s, int64_t b) {
  Seq q{0, s.rows_q, 0, s.rows_kv};
  if (b >= s.batch) {
    q.len_q = q.len_kv = 0;
    q.start_q = s.thd ? s.tokens_q : 0;
    q.start_kv = s.thd ? s.tokens_kv : 0;
    return q;
  }
  if (s.cu_seqlens_q != nullptr)
    q.len_q = Clamp(int64_t{s.cu_seqlens_q[b + 1]} - s.cu_seqlens_q[b], 0, s.rows_q);
  if (s.cu_seqlens_kv != nullptr)
    q.len_kv = Clamp(int64_t{s.cu_seqlens_kv[b + 1]} - s.cu_seqlens_kv[b], 0, s.rows_kv);
  const bool paged = s.seqlens_kv != nullptr;
  if (paged) q.len_kv = Clamp(s.seqlens_kv[b], 0, s.rows_kv);
  if (s.thd) {
    const int32_t* starts_q = s.seq_offsets_q != nullptr ? s.seq_offsets_q : s.cu_seqlens_q;
    q.start_q = starts_q != nullptr ? Clamp(starts_q[b], 0, s.tokens_q) : 0;
    q.len_q = Clamp(q.len_q, 0, s.tokens_q - q.start_q);
    if (!paged) {  // paged keys are in pages, not in a THD tensor
      const int32_t* starts_kv = s.seq_offsets_kv != nullptr ? s.seq_offsets_kv : s.cu_seqlens_kv;
      q.start_kv = starts_kv != nullptr ? Clamp(starts_kv[b], 0, s.tokens_kv) : 0;
      q.len_kv = Clamp(q.len_kv, 0, s.tokens_kv - q.start_kv);
    }
  }
  return q;
}

// Whether row i of a sequence is in the caller's tensors: a THD tensor holds the sequence's rows
// only, a dense one its max_seqlen rows (fewer than the graph's extent for a dense problem run
// through a ragged plan).
__device__ bool InTensor(const Sequences& s, int64_t i, int64_t len, int64_t rows) {
  return s.thd ? i < len : i < rows;
}

// Element offset of (b, h, i, x); start is the THD token start (0 otherwise).
__device__ int64_t At(const DeviceView& v, int64_t b, int64_t h, int64_t i, int64_t x,
                      int64_t start) {
  return b * v.stride_b + (start + i) * v.stride_s + h * v.stride_h + x * v.stride_d;
}

__device__ void ZeroRow16(const DeviceView& v, int64_t b, int64_t h, int64_t i, int64_t start,
                          int64_t dim) {
  uint16_t* p = static_cast<uint16_t*>(v.data);
  for (int64_t x = 0; x < dim; ++x) p[At(v, b, h, i, x, start)] = 0;  // +0.0 in fp16 and bf16
}

__device__ float LseAt(const DeviceView& lse, bool packed, int64_t b, int64_t h, int64_t i,
                       int64_t start_q) {
  const float* p = static_cast<const float*>(lse.data);
  if (packed) return p[(start_q + i) * lse.stride_s + h * lse.stride_h];
  return p[b * lse.stride_b + h * lse.stride_h + i * lse.stride_s];
}

__device__ int64_t GridStart() { return int64_t{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ int64_t GridStride() { return int64_t{gridDim.x} * blockDim.x; }

int Blocks(int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535) blocks = 65535;
  return static_cast<int>(blocks);
}

__global__ void PrepareKernel(PrepareParams p) {
  const int64_t start = GridStart(), stride = GridStride();
  for (int64_t b = start; b <= p.graph_batch; b += stride) {
    Seq s = SequenceOf(p.seq, b);
    if (b < p.graph_batch && p.chunks.count == 0) {
      if (p.seq_len_q != nullptr) p.seq_len_q[b] = static_cast<int32_t>(s.len_q);
      if (p.seq_len_kv != nullptr) p.seq_len_kv[b] = static_cast<int32_t>(s.len_kv);
    }
    for (int slot = 0; slot < kRaggedSlots; ++slot) {
      if (p.ragged[slot] == nullptr) continue;
      int64_t offset;
      if (p.seq.thd) {
        int64_t token = p.ragged_kv_side[slot] ? s.start_kv : s.start_q;
        if (b == p.graph_batch) token = p.ragged_kv_side[slot] ? p.seq.tokens_kv : p.seq.tokens_q;
        offset = token * p.ragged_stride[slot];
      } else {  // a dense tensor: sequence b at b steps; entries past the batch at its end
        offset = (b < p.seq.batch ? b : p.seq.batch) * p.ragged_stride[slot];
      }
      p.ragged[slot][b] = static_cast<int32_t>(offset > kInt32Max ? kInt32Max : offset);
    }
  }
  // Chunked layout: chunk i's lengths from its offset on (plan_spec.h BatchChunks).
  for (int i = 0; i < p.chunks.count; ++i) {
    const int64_t at = p.chunks.seq_len_offset(i);
    for (int64_t j = start; j < p.chunks.batch[i]; j += stride) {
      Seq s = SequenceOf(p.seq, p.chunks.first[i] + j);
      if (p.seq_len_q != nullptr) p.seq_len_q[at + j] = static_cast<int32_t>(s.len_q);
      if (p.seq_len_kv != nullptr) p.seq_len_kv[at + j] = static_cast<int32_t>(s.len_kv);
    }
  }
  if (p.sink != nullptr)
    for (int64_t h = start; h < p.heads_q; h += stride)
      p.sink[h] = p.sink_src != nullptr ? p.sink_src[h * p.sink_stride] : 0.0f;
  if (p.page_table != nullptr) {  // kernels.h PrepareParams says which page each entry gets
    const int64_t entries = p.graph_batch * p.table_pages;
    for (int64_t e = start; e < entries; e += stride) {
      const int64_t b = e / p.table_pages, k = e % p.table_pages;
      // s.len_kv <= rows_kv: the entries TablePage reads are in the caller's row. Past the
      // problem's batch there is no row and no key (TablePage reads nothing then).
      const Seq s = SequenceOf(p.seq, b);
      const int32_t* row =
          b < p.seq.batch ? p.page_table_src + b * p.page_table_stride : nullptr;
      p.page_table[e] = TablePage(row, k, s.len_kv, p.page_size, p.num_pages);
    }
  }
  if (p.zero_counter != nullptr && start == 0) *p.zero_counter = 0;
  if (p.stats != nullptr) {
    const int64_t sq = p.seq.max_seqlen_q;
    const int64_t rows = p.graph_batch * p.heads_q * sq;
    for (int64_t r = start; r < rows; r += stride) {
      const int64_t i = r % sq, h = (r / sq) % p.heads_q, b = r / (sq * p.heads_q);
      Seq s = SequenceOf(p.seq, b);
      float value = INFINITY;
      if (!p.band.row_empty(i, s.len_q, s.len_kv)) {
        float lse = LseAt(p.lse, p.lse_packed, b, h, i, s.start_q);
        if (isfinite(lse)) value = lse;
      }
      p.stats[r] = value;
    }
  }
}

__global__ void ForwardFixupKernel(ForwardFixupParams p) {
  const int64_t sq = p.seq.max_seqlen_q;
  const int64_t rows = p.seq.batch * p.heads_q * sq;
  for (int64_t r = GridStart(); r < rows; r += GridStride()) {
    const int64_t i = r % sq, h = (r / sq) % p.heads_q, b = r / (sq * p.heads_q);
    Seq s = SequenceOf(p.seq, b);
    const bool in_tensor = InTensor(p.seq, i, s.len_q, p.seq.rows_q);
    const bool empty = p.band.row_empty(i, s.len_q, s.len_kv) ||
                       (p.empty_by_stats && !(p.stats[r] > kEmptyStats));
    if (in_tensor && empty) ZeroRow16(p.o, b, h, i, s.start_q, p.head_dim_v);
    if (p.lse.data == nullptr) continue;
    if (p.lse_packed ? !in_tensor : i >= p.seq.rows_q) continue;
    float value = -INFINITY;
    if (!empty && p.stats != nullptr) value = p.stats[r];  // staged rows share r's layout
    float* lse = static_cast<float*>(p.lse.data);
    if (p.lse_packed)
      lse[(s.start_q + i) * p.lse.stride_s + h * p.lse.stride_h] = value;
    else
      lse[b * p.lse.stride_b + h * p.lse.stride_h + i * p.lse.stride_s] = value;
  }
}

// The epilogue's parts below run on a range of the grid's blocks: `block` of `blocks`, each a
// grid-stride loop over its own work.
__device__ void BackwardFixupPart(const BackwardFixupParams& p, int64_t block, int64_t blocks) {
  const int64_t sq = p.seq.max_seqlen_q, skv = p.seq.max_seqlen_kv;
  const int64_t rows_q = p.seq.batch * p.heads_q * sq;
  const int64_t rows_kv = p.seq.batch * p.heads_kv * skv;
  const int64_t stride = blocks * blockDim.x;
  for (int64_t r = block * blockDim.x + threadIdx.x; r < rows_q + rows_kv; r += stride) {
    if (r < rows_q) {
      const int64_t i = r % sq, h = (r / sq) % p.heads_q, b = r / (sq * p.heads_q);
      Seq s = SequenceOf(p.seq, b);
      if (!InTensor(p.seq, i, s.len_q, p.seq.rows_q)) continue;
      if (p.band.row_empty(i, s.len_q, s.len_kv)) ZeroRow16(p.dq, b, h, i, s.start_q, p.head_dim_qk);
    } else {
      const int64_t k = r - rows_q;
      const int64_t j = k % skv, h = (k / skv) % p.heads_kv, b = k / (skv * p.heads_kv);
      Seq s = SequenceOf(p.seq, b);
      if (!InTensor(p.seq, j, s.len_kv, p.seq.rows_kv)) continue;
      if (p.band.key_unseen(j, s.len_q, s.len_kv)) {
        ZeroRow16(p.dk, b, h, j, s.start_kv, p.head_dim_qk);
        ZeroRow16(p.dv, b, h, j, s.start_kv, p.head_dim_v);
      }
    }
  }
}

__device__ void DbiasFixupPart(const DbiasFixupParams& p, int64_t block, int64_t blocks) {
  const int64_t sq = p.seq.rows_q, skv = p.seq.rows_kv;  // the bias's extents: the caller's
  const int64_t count = p.bias_batch * p.bias_heads * sq * skv;
  const int64_t stride = blocks * blockDim.x;
  for (int64_t e = block * blockDim.x + threadIdx.x; e < count; e += stride) {
    const int64_t j = e % skv, i = (e / skv) % sq, bh = (e / (skv * sq)) % p.bias_heads,
                  bb = e / (skv * sq * p.bias_heads);
    // The sequences whose scores this entry adds to: its own, or all when broadcast over batch.
    const int64_t first = p.bias_batch == 1 ? 0 : bb;
    const int64_t last = p.bias_batch == 1 ? p.seq.batch - 1 : bb;
    bool seen = false;
    for (int64_t b = first; b <= last && !seen; ++b) {
      Seq s = SequenceOf(p.seq, b);
      int64_t lo = 0, hi = 0;
      p.band.keys_of_row(i, s.len_q, s.len_kv, &lo, &hi);
      seen = j >= lo && j < hi;
    }
    if (seen) continue;
    const int64_t offset = bb * p.stride_b + bh * p.stride_h + i * p.stride_q + j * p.stride_kv;
    if (p.element_bytes == 4)
      static_cast<uint32_t*>(p.dbias)[offset] = 0;
    else
      static_cast<uint16_t*>(p.dbias)[offset] = 0;
  }
}

__device__ float Load16(const void* data, int64_t index, bool bf16) {
  const uint16_t bits = static_cast<const uint16_t*>(data)[index];
  if (bf16) return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// Block (chunk, h) sums the rows r = chunk, chunk + chunks, ... of head h (warps take rows in
// turn) into partials[chunk][h]. The block that finishes last (counted in p.done, which the
// prepare kernel zeroed) adds the partials of every head in chunk order: the result does not
// depend on which block that is, so dsink is the same bit for bit run to run.
__device__ void DsinkPart(const DsinkParams& p, int chunk, int64_t h) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kWarps = kThreads / 32;
  const int64_t sq = p.seq.max_seqlen_q;
  const int64_t rows = p.seq.batch * sq;
  const float sink = p.sink[h * p.sink_stride];
  float warp_sum = 0.0f;  // meaningful in lane 0
  for (int64_t r = chunk + int64_t{warp} * kDsinkChunks; r < rows;
       r += int64_t{kWarps} * kDsinkChunks) {
    const int64_t b = r / sq, i = r % sq;
    Seq s = SequenceOf(p.seq, b);
    if (p.band.row_empty(i, s.len_q, s.len_kv)) continue;  // also rows past the sequence
    const float lse = LseAt(p.lse, p.lse_packed, b, h, i, s.start_q);
    if (!isfinite(lse)) continue;
    float dot = 0.0f;
    for (int64_t x = lane; x < p.head_dim_v; x += 32)
      dot += Load16(p.d_o.data, At(p.d_o, b, h, i, x, s.start_q), p.bf16) *
             Load16(p.o.data, At(p.o, b, h, i, x, s.start_q), p.bf16);
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_down_sync(0xffffffffu, dot, offset);
    if (lane == 0) warp_sum += expf(sink - lse) * dot;
  }
  __shared__ float sums[kWarps];
  __shared__ bool last_block;
  if (lane == 0) sums[warp] = warp_sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += sums[w];
    p.partials[int64_t{chunk} * p.heads_q + h] = total;
    __threadfence();  // the partial is visible to every block before this one is counted
    const unsigned int blocks = static_cast<unsigned int>(kDsinkChunks * p.heads_q);
    last_block = atomicAdd(p.done, 1u) == blocks - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const volatile float* partials = p.partials;  // written by other blocks: read past L1
  for (int64_t head = threadIdx.x; head < p.heads_q; head += blockDim.x) {
    float total = 0.0f;
    for (int c = 0; c < kDsinkChunks; ++c) total += partials[int64_t{c} * p.heads_q + head];
    p.dsink[head * p.dsink_stride] = -total;
  }
}

// The backward's one launch after the graph: blocks [0, fixup_blocks) zero dQ / dK / dV where
// our semantics say so, the next dbias_blocks zero dbias outside every band, the rest compute
// dsink (kDsinkChunks blocks per head).
__global__ void BackwardEpilogueKernel(BackwardEpilogueParams p, int fixup_blocks,
                                       int dbias_blocks) {
  int64_t block = blockIdx.x;
  if (block < fixup_blocks) {
    BackwardFixupPart(p.fixup, block, fixup_blocks);
    return;
  }
  block -= fixup_blocks;
  if (block < dbias_blocks) {
    DbiasFixupPart(p.dbias_fixup, block, dbias_blocks);
    return;
  }
  block -= dbias_blocks;
  DsinkPart(p.dsink, static_cast<int>(block % kDsinkChunks), block / kDsinkChunks);
}

}  // namespace

cudaError_t ProbeKernels() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, PrepareKernel);
  if (err != cudaSuccess) cudaGetLastError();  // not sticky: clear it
  return err;
}

cudaError_t LaunchPrepare(const PrepareParams& p, cudaStream_t stream) {
  int64_t work = p.graph_batch + 1;
  if (p.heads_q > work) work = p.heads_q;
  if (p.stats != nullptr && p.graph_batch * p.heads_q * p.seq.max_seqlen_q > work)
    work = p.graph_batch * p.heads_q * p.seq.max_seqlen_q;
  if (p.page_table != nullptr && p.graph_batch * p.table_pages > work)
    work = p.graph_batch * p.table_pages;
  PrepareKernel<<<Blocks(work), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchForwardFixup(const ForwardFixupParams& p, cudaStream_t stream) {
  ForwardFixupKernel<<<Blocks(p.seq.batch * p.heads_q * p.seq.max_seqlen_q), kThreads, 0,
                       stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchBackwardEpilogue(const BackwardEpilogueParams& p, cudaStream_t stream) {
  int fixup_blocks = 0, dbias_blocks = 0;
  int64_t dsink_blocks = 0;
  if (p.do_fixup) {
    const auto& f = p.fixup;
    fixup_blocks = Blocks(f.seq.batch * (f.heads_q * f.seq.max_seqlen_q +
                                         f.heads_kv * f.seq.max_seqlen_kv));
  }
  if (p.do_dbias) {
    const auto& d = p.dbias_fixup;
    dbias_blocks = Blocks(d.bias_batch * d.bias_heads * d.seq.rows_q * d.seq.rows_kv);
  }
  if (p.do_dsink) {
    if (p.dsink.heads_q > 65535 || p.dsink.done == nullptr) return cudaErrorInvalidConfiguration;
    dsink_blocks = int64_t{kDsinkChunks} * p.dsink.heads_q;
  }
  const int64_t blocks = fixup_blocks + dbias_blocks + dsink_blocks;
  if (blocks == 0) return cudaSuccess;
  BackwardEpilogueKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, fixup_blocks,
                                                                                 dbias_blocks);
  return cudaGetLastError();
}

}  // namespace fusedattn::cudnn
