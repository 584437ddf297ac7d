// The small_seq forward: one warp per (sequence, query head).
//
// The warp streams the visible keys in chunks of ChunkKeys() keys: it issues the 16-byte loads
// of the chunk's K and V rows at once, forms q . k (each row group of
// lanes takes one key of a step, its lanes split the row), gathers the chunk's scores into every
// lane, and folds the chunk into a running softmax (max m, sum l, accumulator of p * v).
//
// GQA/MQA: the warps of a kv group's query heads are neighbours (warp = b * heads_q + h), so a
// block's warps mostly share one kv head and issue the same K/V loads together; K and V come
// from DRAM once per kv head and the repeats are served by L1/L2. (Holding several heads per warp
// instead was tried: the per-head q and accumulators need too many registers.)
//
// Saved for the backward: LSE = log(denominator) of each (sequence, head), float32, one per query
// row: [batch, heads_q, 1], or [tokens, heads_q] packed for THD. It is all the backward needs to
// recompute the probabilities (p_j = exp(s_j - LSE)); an empty row has LSE = -inf.
#pragma once

#include "backends/small_seq/device.cuh"

namespace fusedattn::small_seq {

template <typename T, int kDimQk, int kDimV>
__global__ void __launch_bounds__(kThreadsPerBlock,
                                  MinBlocksPerSm<KernelKind::kForward, T, kDimQk>())
    ForwardKernel(const KernelParams p) {
  using QkLayout = RowLayout<T, kDimQk>;
  using VLayout = RowLayout<T, kDimV>;
  constexpr int kVec = QkLayout::kVecElems;
  constexpr int kQkVecs = QkLayout::kVecsPerLane;
  constexpr int kVVecs = VLayout::kVecsPerLane;
  constexpr int kQkGroups = QkLayout::kRowGroups;
  constexpr int kVGroups = VLayout::kRowGroups;
  constexpr int kChunk = ChunkKeys<T, kDimQk, kDimV>();
  constexpr int kQkSteps = kChunk / kQkGroups;
  constexpr int kVSteps = kChunk / kVGroups;
  static_assert(kChunk % kQkGroups == 0 && kChunk % kVGroups == 0, "chunk must fill the steps");

  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (warp >= p.batch * p.heads_q) return;  // the whole warp leaves together
  const int64_t b = warp / p.heads_q;
  const int64_t h = warp - b * p.heads_q;
  const int64_t kv_head = h / p.group;

  const Sequence seq = LoadSequence(p, b);
  int64_t lo = 0, hi = 0;
  VisibleKeys(p, seq, &lo, &hi);
  const int qk_group = QkLayout::group(lane);
  const int v_group = VLayout::group(lane);
  // Key j's rows are at k_rows + j * stride_s and v_rows + j * stride_s.
  const T* k_rows = static_cast<const T*>(p.k.data) + RowOffset(p.k, b, kv_head, seq.start_kv);
  const T* v_rows = static_cast<const T*>(p.v.data) + RowOffset(p.v, b, kv_head, seq.start_kv);

  // This lane's columns of q (only needed when some key is visible).
  float q[kQkVecs][kVec];
  {
    const T* q_row = static_cast<const T*>(p.q.data) + RowOffset(p.q, b, h, seq.start_q);
#pragma unroll
    for (int c = 0; c < kQkVecs; ++c) {
      if (lo < hi) {
        LoadFloats<T, kVec>(q_row, QkLayout::column(lane, c), p.q.stride_d, p.q.vectorized,
                            q[c]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) q[c][e] = 0.0f;
      }
    }
  }

  float running_max = -INFINITY, running_sum = 0.0f, acc[kVVecs][kVec];
#pragma unroll
  for (int c = 0; c < kVVecs; ++c)
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[c][e] = 0.0f;

  for (int64_t base = lo; base < hi; base += kChunk) {
    // Dropout bits first (they need no data), then every load of the chunk before any use.
    const uint32_t keep_bits = DropoutKeepBits<kChunk>(p, b, h, base);
    uint4 k_raw[kQkSteps][kQkVecs], v_raw[kVSteps][kVVecs];
    float bias[kQkSteps];
#pragma unroll
    for (int t = 0; t < kQkSteps; ++t) {
      const int64_t j = base + t * kQkGroups + qk_group;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c)
        k_raw[t][c] = j < hi ? LoadRawVector<T>(k_rows + j * p.k.stride_s,
                                                QkLayout::column(lane, c), p.k.stride_d,
                                                p.k.vectorized)
                             : make_uint4(0, 0, 0, 0);
      bias[t] = j < hi ? BiasOfKey(p, b, h, j) : 0.0f;
    }
#pragma unroll
    for (int t = 0; t < kVSteps; ++t) {
      const int64_t j = base + t * kVGroups + v_group;
#pragma unroll
      for (int c = 0; c < kVVecs; ++c)
        v_raw[t][c] = j < hi ? LoadRawVector<T>(v_rows + j * p.v.stride_s,
                                                VLayout::column(lane, c), p.v.stride_d,
                                                p.v.vectorized)
                             : make_uint4(0, 0, 0, 0);
    }

    // The score of this lane's key of each step (-inf for a hidden key): q . k summed over the
    // row group, through the score pipeline.
    float own_score[kQkSteps];
#pragma unroll
    for (int t = 0; t < kQkSteps; ++t) {
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c) {
        float k_values[kVec];
        UnpackVector<T>(k_raw[t][c], k_values);
#pragma unroll
        for (int e = 0; e < kVec; ++e) sum = fmaf(q[c][e], k_values[e], sum);
      }
      sum = GroupSum<QkLayout::kLanesPerRow>(sum);
      const int64_t j = base + t * kQkGroups + qk_group;
      own_score[t] = j < hi ? Score(p, sum, bias[t], h, j, seq, nullptr) : -INFINITY;
    }
    // Every lane gets every score of the chunk: key base + jj is step jj / kQkGroups of row
    // group jj % kQkGroups.
    float weight[kChunk];
#pragma unroll
    for (int t = 0; t < kQkSteps; ++t)
#pragma unroll
      for (int r = 0; r < kQkGroups; ++r)
        weight[t * kQkGroups + r] =
            __shfl_sync(kFullMask, own_score[t], r * QkLayout::kLanesPerRow);

    float chunk_max = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) chunk_max = fmaxf(chunk_max, weight[jj]);
    // Key `base` is visible, so the maximum is finite.
    const float new_max = fmaxf(running_max, chunk_max);
    const float rescale = expf(running_max - new_max);  // 0 on the first chunk
    running_max = new_max;
    float chunk_sum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      weight[jj] = expf(weight[jj] - new_max);  // 0 for hidden keys
      chunk_sum += weight[jj];
      // Dropout touches only the output's weights, not the denominator.
      weight[jj] *= DropoutFactor(p, keep_bits, jj);
    }
    running_sum = running_sum * rescale + chunk_sum;
#pragma unroll
    for (int c = 0; c < kVVecs; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[c][e] *= rescale;
#pragma unroll
    for (int t = 0; t < kVSteps; ++t) {
      const float w = PickForGroup<kVGroups>(weight, t * kVGroups, v_group);
#pragma unroll
      for (int c = 0; c < kVVecs; ++c) {
        float v_values[kVec];
        UnpackVector<T>(v_raw[t][c], v_values);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[c][e] = fmaf(w, v_values[e], acc[c][e]);
      }
    }
  }

  // Each row group accumulated its own keys: sum the groups, then finish the softmax.
#pragma unroll
  for (int c = 0; c < kVVecs; ++c)
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[c][e] = AcrossGroupsSum<VLayout::kLanesPerRow>(acc[c][e]);
  float out_scale = 0.0f, lse = -INFINITY;
  if (lo < hi) {
    const float extra = ExtraLogit(p, h);
    const float top = fmaxf(running_max, extra);
    const float correction = expf(running_max - top);
    const float denominator = running_sum * correction + expf(extra - top);
    out_scale = correction / denominator;
    lse = top + logf(denominator);
  }
  const bool o_row_exists = !p.thd || seq.len_q > 0;
  if (o_row_exists && v_group == 0) {
    const int64_t o_row = RowOffset(p.o, b, h, seq.start_q);
#pragma unroll
    for (int c = 0; c < kVVecs; ++c) {
      float out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = acc[c][e] * out_scale;
      StoreFloatsOfDtype<kVec>(p.o.data, p.o.dtype, o_row, VLayout::column(lane, c),
                               p.o.stride_d, p.o.vectorized, out);
    }
  }
  if (lane == 0 && p.lse.data != nullptr && (!p.lse_packed || seq.len_q > 0))
    static_cast<float*>(p.lse.data)[b * p.lse.stride_b +
                                    (p.lse_packed ? seq.start_q : 0) * p.lse.stride_s +
                                    h * p.lse.stride_h] = lse;
  if (lane == 0 && p.max_logit != nullptr && lo < hi)
    AtomicMaxFloat(p.max_logit + h * p.max_logit_stride, running_max);
}

}  // namespace fusedattn::small_seq
