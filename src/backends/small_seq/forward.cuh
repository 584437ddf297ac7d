// The small_seq forward: one team of lanes per (sequence, query head) row (device.cuh, Team:
// two rows per warp at d = 128 in 16-bit, one at d >= 256).
//
// The team streams the row's visible keys in chunks of ChunkKeys() keys: it issues the 16-byte
// loads of the chunk's K and V rows at once, forms q . k for each key (the team's lanes split the
// row and sum over the team), and folds the chunk into a running softmax (max m, sum l,
// accumulator of p * v). The warp runs as many chunks as its longest row needs, so that every
// lane meets every shuffle; a team whose row is done sits the remaining chunks out.
//
// GQA/MQA: the rows of a kv group's query heads are neighbours (row = b * heads_q + h), so a
// block's teams mostly share one kv head and issue the same K/V loads together; K and V come
// from DRAM once per kv head and the repeats are served by L1/L2.
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
  using TeamOf = Team<T, kDimQk, kDimV>;
  constexpr int kVec = QkLayout::kVecElems;
  constexpr int kQkVecs = QkLayout::kVecsPerLane;
  constexpr int kVVecs = VLayout::kVecsPerLane;
  constexpr int kChunk = ChunkKeys<T, kDimQk, kDimV>();

  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t rows = p.batch * p.heads_q;
  if (warp * TeamOf::kPerWarp >= rows) return;  // the whole warp leaves together
  // A team past the last row has no row but still takes part in the warp's shuffles.
  const int64_t row = warp * TeamOf::kPerWarp + lane / TeamOf::kLanes;
  const bool has_row = TeamOf::kPerWarp == 1 || row < rows;  // a lone team always has one
  const int64_t b = has_row ? row / p.heads_q : 0;
  const int64_t h = has_row ? row - b * p.heads_q : 0;
  const int64_t kv_head = h / p.group;

  const Sequence seq = LoadSequence(p, b);
  int64_t lo = 0, hi = 0;
  VisibleKeys(p, seq, &lo, &hi);
  if (!has_row) hi = lo;
  // The warp runs the chunks of its longest row: [lo, end) covers them.
  int64_t end = hi;
  if constexpr (TeamOf::kPerWarp > 1) {
    const int own_chunks = static_cast<int>((hi - lo + kChunk - 1) / kChunk);
    end = lo + int64_t{kChunk} *
                   static_cast<int>(MaxOverTeams<TeamOf::kLanes>(static_cast<float>(own_chunks)));
  }
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

  for (int64_t base = lo; base < end; base += kChunk) {
    // Dropout bits first (they need no data), then every load of the chunk before any use.
    const uint32_t keep_bits = DropoutKeepBits<kChunk>(p, b, h, base);
    uint4 k_raw[kChunk][kQkVecs], v_raw[kChunk][kVVecs];
    float bias[kChunk];
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      const int64_t j = base + jj;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c)
        k_raw[jj][c] = j < hi ? LoadRawVector<T>(k_rows + j * p.k.stride_s,
                                                 QkLayout::column(lane, c), p.k.stride_d,
                                                 p.k.vectorized)
                              : make_uint4(0, 0, 0, 0);
      bias[jj] = j < hi ? BiasOfKey(p, b, h, j) : 0.0f;
    }
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      const int64_t j = base + jj;
#pragma unroll
      for (int c = 0; c < kVVecs; ++c)
        v_raw[jj][c] = j < hi ? LoadRawVector<T>(v_rows + j * p.v.stride_s,
                                                 VLayout::column(lane, c), p.v.stride_d,
                                                 p.v.vectorized)
                              : make_uint4(0, 0, 0, 0);
    }

    // The score of each key of the chunk (-inf for a hidden key): q . k summed over the team,
    // through the score pipeline. Every lane of the team holds every score.
    float weight[kChunk];
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c) {
        float k_values[kVec];
        UnpackVector<T>(k_raw[jj][c], k_values);
#pragma unroll
        for (int e = 0; e < kVec; ++e) sum = fmaf(q[c][e], k_values[e], sum);
      }
      sum = GroupSum<TeamOf::kLanes>(sum);
      const int64_t j = base + jj;
      weight[jj] = j < hi ? Score(p, sum, bias[jj], h, j, seq, nullptr) : -INFINITY;
    }
    if (base >= hi) continue;  // this team's row is done (no shuffles below)

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
    for (int jj = 0; jj < kChunk; ++jj) {
#pragma unroll
      for (int c = 0; c < kVVecs; ++c) {
        float v_values[kVec];
        UnpackVector<T>(v_raw[jj][c], v_values);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[c][e] = fmaf(weight[jj], v_values[e], acc[c][e]);
      }
    }
  }

  float out_scale = 0.0f, lse = -INFINITY;
  if (lo < hi) {
    const float extra = ExtraLogit(p, h);
    const float top = fmaxf(running_max, extra);
    const float correction = expf(running_max - top);
    const float denominator = running_sum * correction + expf(extra - top);
    out_scale = correction / denominator;
    lse = top + logf(denominator);
  }
  if (!has_row) return;  // no shuffles below
  const bool o_row_exists = !p.thd || seq.len_q > 0;
  if (o_row_exists) {
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
  const bool team_leader = lane % TeamOf::kLanes == 0;
  if (team_leader && p.lse.data != nullptr && (!p.lse_packed || seq.len_q > 0))
    static_cast<float*>(p.lse.data)[b * p.lse.stride_b +
                                    (p.lse_packed ? seq.start_q : 0) * p.lse.stride_s +
                                    h * p.lse.stride_h] = lse;
  if (team_leader && p.max_logit != nullptr && lo < hi)
    AtomicMaxFloat(p.max_logit + h * p.max_logit_stride, running_max);
}

}  // namespace fusedattn::small_seq
