// The small_seq forward: one team of lanes per (sequence, query head) row (device.cuh, Team:
// two rows per warp at d = 128 in 16-bit, one at d >= 256).
//
// The team streams the row's visible keys in chunks of ChunkKeys() keys: it issues the 16-byte
// loads of a chunk's K and V rows at once, forms q . k for each key (the team's lanes split the
// row and sum over the team), and folds the chunk into a running softmax (max m, sum l,
// accumulator of p * v). The warp runs as many chunks as its longest row needs, so that every
// lane meets every shuffle; a team whose row is done sits the remaining chunks out.
//
// Each team runs rows_per_team rows one after another (the warp's teams take the next kPerWarp
// rows at each step), as one software pipeline over (row, chunk) items: the loads of the next
// item (the row's next chunk, or the next row's q and first chunk) are issued before the current
// chunk's arithmetic, and the current row's softmax tail and stores run while they are in
// flight. At skv = 2 a row is a few hundred bytes, so without this a warp spent a large share of
// its life on indices, shuffles and stores with no load outstanding.
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

// A team's row: where it is, its visible keys [lo, hi), and the chunks the warp runs for it.
// Kept small (32-bit where check() bounds the values: rows below 2^31, keys at most
// kMaxSeqlenKv), because the pipeline holds two rows at once.
template <typename T>
struct ForwardRow {
  bool has_row;  // false for a team past the last row (it still takes part in the shuffles)
  int32_t b, h;
  int32_t len_q, len_kv;  // the sequence's lengths (Sequence)
  int32_t lo, hi;
  int32_t chunks;   // the warp's chunk count for this step: its teams' longest row (all lanes)
  int64_t start_q;  // the sequence's first query token (THD; 0 otherwise)
  const T* k_rows;  // key j's rows are at k_rows + j * stride_s and v_rows + j * stride_s
  const T* v_rows;

  __device__ __forceinline__ Sequence sequence() const {
    return Sequence{len_q, len_kv, start_q, 0};  // start_kv is folded into k_rows and v_rows
  }
};

// The row of this lane's team at the warp's step whose first row is `first_row`. Every lane of
// the warp calls it together (the chunk count is a maximum over the teams).
template <typename T, int kDimQk, int kDimV>
__device__ __forceinline__ ForwardRow<T> BeginForwardRow(const KernelParams& p, int64_t first_row,
                                                        int lane) {
  using TeamOf = Team<T, kDimQk, kDimV>;
  constexpr int kChunk = ChunkKeys<T, kDimQk, kDimV>();
  ForwardRow<T> r;
  const int64_t row = first_row + lane / TeamOf::kLanes;
  r.has_row = row < p.batch * p.heads_q;
  // check() bounds batch * heads_q to 31 bits: 32-bit divisions (a 64-bit one is a long
  // subroutine on the GPU).
  const uint32_t row32 = r.has_row ? static_cast<uint32_t>(row) : 0u;
  const uint32_t heads_q = static_cast<uint32_t>(p.heads_q);
  const uint32_t b = row32 / heads_q;
  const uint32_t h = row32 - b * heads_q;
  const uint32_t kv_head = h / static_cast<uint32_t>(p.group);
  r.b = static_cast<int32_t>(b);
  r.h = static_cast<int32_t>(h);
  const Sequence seq = LoadSequence(p, r.b);
  int64_t lo = 0, hi = 0;
  VisibleKeys(p, seq, &lo, &hi);
  if (!r.has_row) hi = lo;
  r.len_q = static_cast<int32_t>(seq.len_q);
  r.len_kv = static_cast<int32_t>(seq.len_kv);
  r.lo = static_cast<int32_t>(lo);
  r.hi = static_cast<int32_t>(hi);
  r.start_q = seq.start_q;
  const int own_chunks = (r.hi - r.lo + kChunk - 1) / kChunk;
  r.chunks = own_chunks;
  if constexpr (TeamOf::kPerWarp > 1)
    r.chunks = static_cast<int>(MaxOverTeams<TeamOf::kLanes>(static_cast<float>(own_chunks)));
  r.k_rows = static_cast<const T*>(p.k.data) + RowOffset(p.k, b, kv_head, seq.start_kv);
  r.v_rows = static_cast<const T*>(p.v.data) + RowOffset(p.v, b, kv_head, seq.start_kv);
  return r;
}

// This lane's vectors of the row's q, raw (zeros when no key is visible: the row may not exist).
template <typename T, int kDimQk>
__device__ __forceinline__ void LoadQ(const KernelParams& p, const ForwardRow<T>& r, int lane,
                                      uint4 (&q_raw)[RowLayout<T, kDimQk>::kVecsPerLane]) {
  using QkLayout = RowLayout<T, kDimQk>;
  const T* q_row = static_cast<const T*>(p.q.data) + RowOffset(p.q, r.b, r.h, r.start_q);
#pragma unroll
  for (int c = 0; c < QkLayout::kVecsPerLane; ++c)
    q_raw[c] = r.lo < r.hi ? LoadRawVector<T>(q_row, QkLayout::column(lane, c), p.q.stride_d,
                                              p.q.vectorized)
                           : make_uint4(0, 0, 0, 0);
}

// One chunk's loads for row (b, h) with visible keys below hi: K and V of keys
// base .. base + kChunk - 1 (zeros from hi on) and their bias elements.
template <typename T, int kDimQk, int kDimV>
struct ForwardChunk {
  static constexpr int kKeys = ChunkKeys<T, kDimQk, kDimV>();
  uint4 k[kKeys][RowLayout<T, kDimQk>::kVecsPerLane];
  uint4 v[kKeys][RowLayout<T, kDimV>::kVecsPerLane];
  float bias[kKeys];
};

template <typename T, int kDimQk, int kDimV>
__device__ __forceinline__ void LoadChunk(const KernelParams& p, int32_t b, int32_t h, int32_t hi,
                                          const T* k_rows, const T* v_rows, int64_t base,
                                          int lane, ForwardChunk<T, kDimQk, kDimV>& chunk) {
  using QkLayout = RowLayout<T, kDimQk>;
  using VLayout = RowLayout<T, kDimV>;
  constexpr int kChunk = ChunkKeys<T, kDimQk, kDimV>();
#pragma unroll
  for (int jj = 0; jj < kChunk; ++jj) {
    const int64_t j = base + jj;
#pragma unroll
    for (int c = 0; c < QkLayout::kVecsPerLane; ++c)
      chunk.k[jj][c] = j < hi ? LoadRawVector<T>(k_rows + j * p.k.stride_s,
                                                   QkLayout::column(lane, c), p.k.stride_d,
                                                   p.k.vectorized)
                                : make_uint4(0, 0, 0, 0);
    chunk.bias[jj] = j < hi ? BiasOfKey(p, b, h, j) : 0.0f;
  }
#pragma unroll
  for (int jj = 0; jj < kChunk; ++jj) {
    const int64_t j = base + jj;
#pragma unroll
    for (int c = 0; c < VLayout::kVecsPerLane; ++c)
      chunk.v[jj][c] = j < hi ? LoadRawVector<T>(v_rows + j * p.v.stride_s,
                                                   VLayout::column(lane, c), p.v.stride_d,
                                                   p.v.vectorized)
                                : make_uint4(0, 0, 0, 0);
  }
}

// A row's running softmax: max m, sum l and the accumulator of p * v (this lane's columns).
template <typename T, int kDimV>
struct RunningSoftmax {
  static constexpr int kVec = RowLayout<T, kDimV>::kVecElems;
  float max, sum, acc[RowLayout<T, kDimV>::kVecsPerLane][kVec];
  __device__ __forceinline__ void Reset() {
    max = -INFINITY;
    sum = 0.0f;
#pragma unroll
    for (int c = 0; c < RowLayout<T, kDimV>::kVecsPerLane; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[c][e] = 0.0f;
  }
};

// Folds the chunk of keys base .. base + kChunk - 1 into the running softmax. Every lane of the
// warp calls it (the team sums are shuffles); a team whose row is done only takes part.
template <typename T, int kDimQk, int kDimV>
__device__ __forceinline__ void FoldChunk(
    const KernelParams& p, const ForwardRow<T>& r, int64_t base,
    const uint4 (&q_raw)[RowLayout<T, kDimQk>::kVecsPerLane],
    const ForwardChunk<T, kDimQk, kDimV>& chunk, RunningSoftmax<T, kDimV>& s) {
  using TeamOf = Team<T, kDimQk, kDimV>;
  constexpr int kVec = RowLayout<T, kDimQk>::kVecElems;
  constexpr int kQkVecs = RowLayout<T, kDimQk>::kVecsPerLane;
  constexpr int kVVecs = RowLayout<T, kDimV>::kVecsPerLane;
  constexpr int kChunk = ChunkKeys<T, kDimQk, kDimV>();
  // The score of each key of the chunk (-inf for a hidden key): q . k summed over the team,
  // through the score pipeline. Every lane of the team holds every score.
  float weight[kChunk];
#pragma unroll
  for (int jj = 0; jj < kChunk; ++jj) {
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kQkVecs; ++c) {
      float q[kVec], k_values[kVec];  // q stays packed between chunks (registers)
      UnpackVector<T>(q_raw[c], q);
      UnpackVector<T>(chunk.k[jj][c], k_values);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum = fmaf(q[e], k_values[e], sum);
    }
    sum = GroupSum<TeamOf::kLanes>(sum);
    const int64_t j = base + jj;
    weight[jj] = j < r.hi ? Score(p, sum, chunk.bias[jj], r.h, j, r.sequence(), nullptr) : -INFINITY;
  }
  if (base >= r.hi) return;  // this team's row is done (no shuffles below)
  // The dropout bits here rather than with the loads: they need no data, and registers are what
  // the pipeline is short of.
  const uint32_t keep_bits = DropoutKeepBits<kChunk>(p, r.b, r.h, base);

  float chunk_max = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < kChunk; ++jj) chunk_max = fmaxf(chunk_max, weight[jj]);
  // Key `base` is visible, so the maximum is finite.
  const float new_max = fmaxf(s.max, chunk_max);
  const float rescale = expf(s.max - new_max);  // 0 on the first chunk
  s.max = new_max;
  float chunk_sum = 0.0f;
#pragma unroll
  for (int jj = 0; jj < kChunk; ++jj) {
    weight[jj] = expf(weight[jj] - new_max);  // 0 for hidden keys
    chunk_sum += weight[jj];
    // Dropout touches only the output's weights, not the denominator.
    weight[jj] *= DropoutFactor(p, keep_bits, jj);
  }
  s.sum = s.sum * rescale + chunk_sum;
#pragma unroll
  for (int c = 0; c < kVVecs; ++c)
#pragma unroll
    for (int e = 0; e < kVec; ++e) s.acc[c][e] *= rescale;
#pragma unroll
  for (int jj = 0; jj < kChunk; ++jj) {
#pragma unroll
    for (int c = 0; c < kVVecs; ++c) {
      float v_values[kVec];
      UnpackVector<T>(chunk.v[jj][c], v_values);
#pragma unroll
      for (int e = 0; e < kVec; ++e) s.acc[c][e] = fmaf(weight[jj], v_values[e], s.acc[c][e]);
    }
  }
}

// The row's output O = acc / denominator, its LSE and max logit (no shuffles).
template <typename T, int kDimQk, int kDimV>
__device__ __forceinline__ void FinishRow(const KernelParams& p, const ForwardRow<T>& r,
                                          const RunningSoftmax<T, kDimV>& s, int lane) {
  using TeamOf = Team<T, kDimQk, kDimV>;
  using VLayout = RowLayout<T, kDimV>;
  constexpr int kVec = VLayout::kVecElems;
  if (!r.has_row) return;
  float out_scale = 0.0f, lse = -INFINITY;
  if (r.lo < r.hi) {
    const float extra = ExtraLogit(p, r.h);
    const float top = fmaxf(s.max, extra);
    const float correction = expf(s.max - top);
    const float denominator = s.sum * correction + expf(extra - top);
    out_scale = correction / denominator;
    lse = top + logf(denominator);
  }
  const bool o_row_exists = !p.thd || r.len_q > 0;
  if (o_row_exists) {
    const int64_t o_row = RowOffset(p.o, r.b, r.h, r.start_q);
#pragma unroll
    for (int c = 0; c < VLayout::kVecsPerLane; ++c) {
      float out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = s.acc[c][e] * out_scale;
      StoreFloatsOfDtype<kVec>(p.o.data, p.o.dtype, o_row, VLayout::column(lane, c),
                               p.o.stride_d, p.o.vectorized, out);
    }
  }
  const bool team_leader = lane % TeamOf::kLanes == 0;
  if (team_leader && p.lse.data != nullptr && (!p.lse_packed || r.len_q > 0))
    static_cast<float*>(p.lse.data)[r.b * p.lse.stride_b +
                                    (p.lse_packed ? r.start_q : 0) * p.lse.stride_s +
                                    r.h * p.lse.stride_h] = lse;
  if (team_leader && p.max_logit != nullptr && r.lo < r.hi)
    AtomicMaxFloat(p.max_logit + r.h * p.max_logit_stride, s.max);
}

// rows_per_team: how many rows each team runs (ForwardRowsPerTeam; the grid has
// Team::ForwardWarpsFor(rows, rows_per_team) warps). The warp's rows are consecutive: at step s
// its teams run rows (warp * rows_per_team + s) * kPerWarp + team.
template <typename T, int kDimQk, int kDimV>
__global__ void __launch_bounds__(kThreadsPerBlock,
                                  MinBlocksPerSm<KernelKind::kForward, T, kDimQk>())
    ForwardKernel(const KernelParams p, const int rows_per_team) {
  using TeamOf = Team<T, kDimQk, kDimV>;
  constexpr int kQkVecs = RowLayout<T, kDimQk>::kVecsPerLane;
  constexpr int kChunk = ChunkKeys<T, kDimQk, kDimV>();

  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t rows = p.batch * p.heads_q;
  int64_t first_row = warp * rows_per_team * TeamOf::kPerWarp;  // of the current step
  const int64_t last_first_row =  // the first row of the warp's last step that has rows
      first_row + int64_t{rows_per_team - 1} * TeamOf::kPerWarp;
  if (first_row >= rows) return;  // the whole warp leaves together

  // The pipeline's current item: row r's chunk `chunk` (its loads in `current`).
  ForwardRow<T> r = BeginForwardRow<T, kDimQk, kDimV>(p, first_row, lane);
  uint4 q_raw[kQkVecs];
  LoadQ<T, kDimQk>(p, r, lane, q_raw);
  ForwardChunk<T, kDimQk, kDimV> current;
  LoadChunk<T, kDimQk, kDimV>(p, r.b, r.h, r.hi, r.k_rows, r.v_rows, r.lo, lane, current);
  RunningSoftmax<T, kDimV> softmax;
  softmax.Reset();
  int chunk = 0;
  for (;;) {
    // Issue the next item's loads: the row's next chunk, or the next row's q and first chunk.
    // The branch is the same on every lane (chunks and first_row are).
    const bool next_in_row = chunk + 1 < r.chunks;
    const int64_t next_first_row = first_row + TeamOf::kPerWarp;
    const bool next_row = !next_in_row && next_first_row <= last_first_row &&
                          next_first_row < rows;
    ForwardChunk<T, kDimQk, kDimV> next;
    ForwardRow<T> nr;
    uint4 next_q_raw[kQkVecs];
    if (next_row) {
      nr = BeginForwardRow<T, kDimQk, kDimV>(p, next_first_row, lane);
      LoadQ<T, kDimQk>(p, nr, lane, next_q_raw);
    }
    if (next_in_row || next_row) {  // one call site: the chunk loads are inlined once
      // Field by field: a reference to either row would put both rows in local memory.
      const int64_t base = next_in_row ? r.lo + int64_t{kChunk} * (chunk + 1) : nr.lo;
      LoadChunk<T, kDimQk, kDimV>(p, next_in_row ? r.b : nr.b, next_in_row ? r.h : nr.h,
                                  next_in_row ? r.hi : nr.hi,
                                  next_in_row ? r.k_rows : nr.k_rows,
                                  next_in_row ? r.v_rows : nr.v_rows, base, lane, next);
    }

    if (chunk < r.chunks)
      FoldChunk<T, kDimQk, kDimV>(p, r, r.lo + int64_t{kChunk} * chunk, q_raw, current, softmax);
    if (next_in_row) {
      ++chunk;
    } else {
      FinishRow<T, kDimQk, kDimV>(p, r, softmax, lane);
      if (!next_row) break;
      r = nr;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c) q_raw[c] = next_q_raw[c];
      softmax.Reset();
      first_row = next_first_row;
      chunk = 0;
    }
    current = next;
  }
}

}  // namespace fusedattn::small_seq
