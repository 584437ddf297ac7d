// The small_seq backward: one team of lanes per (sequence, query head) row, as in the forward
// (device.cuh, Team).
//
// With the forward's LSE the team recomputes p_j = exp(s_j - LSE) for its keys, chunk by chunk as
// in the forward, and with D = dO . O:
//   dp_j = keep_j * (dO . v_j),  ds_j = p_j (dp_j - D),  c_j = ds_j * dsoftcap_j * scale
//   dQ = sum_j c_j k_j,  dK_j = sum_h c_j q_h,  dV_j = sum_h p_j keep_j dO_h
// (keep_j = 1 / (1 - dropout) or 0 for kept/dropped keys, 1 without dropout.)
//
// dK and dV sum over the query heads of a kv group. Without GQA (group = 1) the team owns its kv
// head and writes dK and dV rows directly: a single pass, no workspace. With group > 1 the team
// writes the two per-key coefficients (c_j, p_j keep_j) to the workspace and GroupSumKernel, one
// warp per (sequence, kv head), sums q_h and dO_h weighted by them over the group's heads in a
// fixed order: deterministic without atomics, and the workspace is 8 bytes per (b, h, key), far
// smaller than partial dK/dV rows.
//
// Broadcast sums (dsink over the batch; dbias over a broadcast batch or head axis) go through
// per-(b, h) partials in the workspace and a fixed-order reduction (reduce.cu): deterministic.
#pragma once

#include "backends/small_seq/device.cuh"

namespace fusedattn::small_seq {

template <typename T, int kDimQk, int kDimV>
__global__ void __launch_bounds__(kThreadsPerBlock,
                                  MinBlocksPerSm<KernelKind::kBackward, T, kDimQk>())
    BackwardKernel(const KernelParams p) {
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
  const bool team_leader = lane % TeamOf::kLanes == 0;

  const Sequence seq = LoadSequence(p, b);
  int64_t lo = 0, hi = 0;
  VisibleKeys(p, seq, &lo, &hi);
  if (!has_row) hi = lo;
  // Key j's rows are at <tensor>_rows + j * stride_s.
  const T* k_rows = static_cast<const T*>(p.k.data) + RowOffset(p.k, b, kv_head, seq.start_kv);
  const T* v_rows = static_cast<const T*>(p.v.data) + RowOffset(p.v, b, kv_head, seq.start_kv);
  T* dk_rows = static_cast<T*>(p.dk.data) + RowOffset(p.dk, b, kv_head, seq.start_kv);
  T* dv_rows = static_cast<T*>(p.dv.data) + RowOffset(p.dv, b, kv_head, seq.start_kv);

  // A row with a visible key has its query token (lo < hi needs len_q = 1). Its LSE, q, dO and
  // O are loaded together; the row takes part only if the forward gave it a finite LSE.
  const bool has_keys = lo < hi;
  float lse = -INFINITY;
  if (has_keys)
    lse = __ldg(static_cast<const float*>(p.lse.data) + b * p.lse.stride_b +
                (p.lse_packed ? seq.start_q : 0) * p.lse.stride_s + h * p.lse.stride_h);

  // This lane's columns of q and dO, and D = dO . O (over the whole row).
  float q[kQkVecs][kVec], d_o[kVVecs][kVec];
  float delta = 0.0f;
  {
    const T* q_row = static_cast<const T*>(p.q.data) + RowOffset(p.q, b, h, seq.start_q);
    const int64_t do_row = RowOffset(p.d_o, b, h, seq.start_q);
    const int64_t o_row = RowOffset(p.o, b, h, seq.start_q);
    float partial = 0.0f;
#pragma unroll
    for (int c = 0; c < kQkVecs; ++c) {
      if (has_keys) {
        LoadFloats<T, kVec>(q_row, QkLayout::column(lane, c), p.q.stride_d, p.q.vectorized,
                            q[c]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) q[c][e] = 0.0f;
      }
    }
#pragma unroll
    for (int c = 0; c < kVVecs; ++c) {
      if (has_keys) {
        float o[kVec];
        LoadFloatsOfDtype<kVec>(p.d_o.data, p.d_o.dtype, do_row, VLayout::column(lane, c),
                                p.d_o.stride_d, p.d_o.vectorized, d_o[c]);
        LoadFloatsOfDtype<kVec>(p.o.data, p.o.dtype, o_row, VLayout::column(lane, c),
                                p.o.stride_d, p.o.vectorized, o);
#pragma unroll
        for (int e = 0; e < kVec; ++e) partial = fmaf(d_o[c][e], o[e], partial);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) d_o[c][e] = 0.0f;
      }
    }
    delta = GroupSum<TeamOf::kLanes>(partial);
  }
  // A row without a finite LSE has no gradient at all: exact zeros whatever its inputs hold.
  const bool active = has_keys && isfinite(lse);
  if (!active) {
    delta = 0.0f;
#pragma unroll
    for (int c = 0; c < kQkVecs; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) q[c][e] = 0.0f;
#pragma unroll
    for (int c = 0; c < kVVecs; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) d_o[c][e] = 0.0f;
  }

  float dq[kQkVecs][kVec];
#pragma unroll
  for (int c = 0; c < kQkVecs; ++c)
#pragma unroll
    for (int e = 0; e < kVec; ++e) dq[c][e] = 0.0f;

  // Rows of dK/dV this sequence has in the tensors (THD: only its own tokens).
  const int64_t kv_rows = p.thd ? seq.len_kv : p.max_seqlen_kv;
  const bool direct = p.group == 1;
  // Every key of max_seqlen_kv is visited so that each output (dK/dV rows, dbias, workspace)
  // gets its value, zero for hidden keys; only visible keys are loaded. The bound is the same for
  // every team, so every lane meets every shuffle.
  for (int64_t base = 0; base < p.max_seqlen_kv; base += kChunk) {
    const uint32_t keep_bits = DropoutKeepBits<kChunk>(p, b, h, base);
    uint4 k_raw[kChunk][kQkVecs], v_raw[kChunk][kVVecs];
    float bias[kChunk];
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      const int64_t j = base + jj;
      const bool visible = active && j >= lo && j < hi;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c)
        k_raw[jj][c] = visible ? LoadRawVector<T>(k_rows + j * p.k.stride_s,
                                                  QkLayout::column(lane, c), p.k.stride_d,
                                                  p.k.vectorized)
                               : make_uint4(0, 0, 0, 0);
      bias[jj] = visible ? BiasOfKey(p, b, h, j) : 0.0f;
    }
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      const int64_t j = base + jj;
      const bool visible = active && j >= lo && j < hi;
#pragma unroll
      for (int c = 0; c < kVVecs; ++c)
        v_raw[jj][c] = visible ? LoadRawVector<T>(v_rows + j * p.v.stride_s,
                                                  VLayout::column(lane, c), p.v.stride_d,
                                                  p.v.vectorized)
                               : make_uint4(0, 0, 0, 0);
    }

    // Per key: the probability p_j (0 when hidden), the softcap's derivative from q . k, and
    // dO . v_j, each summed over the team (every lane of the team holds them).
    float prob[kChunk], dscore[kChunk], dov[kChunk];
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      float qk = 0.0f, dv_dot = 0.0f;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c) {
        float k_values[kVec];
        UnpackVector<T>(k_raw[jj][c], k_values);
#pragma unroll
        for (int e = 0; e < kVec; ++e) qk = fmaf(q[c][e], k_values[e], qk);
      }
#pragma unroll
      for (int c = 0; c < kVVecs; ++c) {
        float v_values[kVec];
        UnpackVector<T>(v_raw[jj][c], v_values);
#pragma unroll
        for (int e = 0; e < kVec; ++e) dv_dot = fmaf(d_o[c][e], v_values[e], dv_dot);
      }
      qk = GroupSum<TeamOf::kLanes>(qk);
      dov[jj] = GroupSum<TeamOf::kLanes>(dv_dot);
      const int64_t j = base + jj;
      prob[jj] = 0.0f;
      dscore[jj] = 1.0f;
      if (active && j >= lo && j < hi)
        prob[jj] = expf(Score(p, qk, bias[jj], h, j, seq, &dscore[jj]) - lse);
    }

    // Per key: dk_coef = dS * dsoftcap * scale (weights q into dK, k into dQ), dv_coef =
    // P * keep (weights dO into dV), bias_grad (dbias). All zero for hidden keys (prob = 0).
    float dk_coef[kChunk], dv_coef[kChunk], bias_grad[kChunk];
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      const float factor = DropoutFactor(p, keep_bits, jj);
      const float ds = prob[jj] * (dov[jj] * factor - delta);
      const float dt = ds * dscore[jj];
      dk_coef[jj] = dt * p.scale;
      dv_coef[jj] = prob[jj] * factor;
      bias_grad[jj] = p.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? dt * p.scale : ds;
    }

    // dQ += dk_coef_j k_j.
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c) {
        float k_values[kVec];
        UnpackVector<T>(k_raw[jj][c], k_values);
#pragma unroll
        for (int e = 0; e < kVec; ++e) dq[c][e] = fmaf(dk_coef[jj], k_values[e], dq[c][e]);
      }
    }
    if (!has_row) continue;  // no shuffles below

    if (direct) {
      // dK_j = dk_coef_j q and dV_j = dv_coef_j dO: this row's head is its kv head's only one.
#pragma unroll
      for (int jj = 0; jj < kChunk; ++jj) {
        const int64_t j = base + jj;
        if (j >= kv_rows) continue;
#pragma unroll
        for (int c = 0; c < kQkVecs; ++c) {
          float out[kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) out[e] = dk_coef[jj] * q[c][e];
          StoreFloats<T, kVec>(dk_rows + j * p.dk.stride_s, QkLayout::column(lane, c),
                               p.dk.stride_d, p.dk.vectorized, out);
        }
#pragma unroll
        for (int c = 0; c < kVVecs; ++c) {
          float out[kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) out[e] = dv_coef[jj] * d_o[c][e];
          StoreFloats<T, kVec>(dv_rows + j * p.dv.stride_s, VLayout::column(lane, c),
                               p.dv.stride_d, p.dv.vectorized, out);
        }
      }
    }

    // The team's first lane writes the per-key outputs.
    if (!team_leader) continue;
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      const int64_t j = base + jj;
      if (j >= p.max_seqlen_kv) continue;
      const int64_t key_index = (b * p.heads_q + h) * p.max_seqlen_kv + j;
      if (!direct) {
        p.group_coefficients[2 * key_index] = dk_coef[jj];
        p.group_coefficients[2 * key_index + 1] = dv_coef[jj];
      }
      if (p.dbias_mode == DbiasMode::kDirect)
        StoreScalarOfDtype(p.dbias.data, p.dbias.dtype,
                           b * p.dbias.stride_b + h * p.dbias.stride_h + j * p.dbias.stride_kv,
                           bias_grad[jj]);
      else if (p.dbias_mode == DbiasMode::kPartials)
        p.dbias_partials[key_index] = bias_grad[jj];
    }
  }

  if (!has_row) return;
  // dQ (zeros for a row without visible keys).
  const bool q_row_exists = !p.thd || seq.len_q > 0;
  if (q_row_exists) {
    T* dq_row = static_cast<T*>(p.dq.data) + RowOffset(p.dq, b, h, seq.start_q);
#pragma unroll
    for (int c = 0; c < kQkVecs; ++c)
      StoreFloats<T, kVec>(dq_row, QkLayout::column(lane, c), p.dq.stride_d, p.dq.vectorized,
                           dq[c]);
  }
  // dsink[h] = -sum over rows of exp(sink - LSE) * D; this row's term.
  if (p.dsink_partials != nullptr && team_leader)
    p.dsink_partials[b * p.heads_q + h] = active ? -expf(ExtraLogit(p, h) - lse) * delta : 0.0f;
}

// dK and dV of one (sequence, kv head) with group > 1: the sums over the group's query heads of
// q_h and dO_h weighted by the coefficients BackwardKernel left in the workspace.
template <typename T, int kDimQk, int kDimV>
__global__ void __launch_bounds__(kThreadsPerBlock,
                                  MinBlocksPerSm<KernelKind::kGroupSum, T, kDimQk>())
    GroupSumKernel(const KernelParams p) {
  using QkLayout = RowLayout<T, kDimQk>;
  using VLayout = RowLayout<T, kDimV>;
  constexpr int kVec = QkLayout::kVecElems;
  constexpr int kQkVecs = QkLayout::kVecsPerLane;
  constexpr int kVVecs = VLayout::kVecsPerLane;
  constexpr int kQkGroups = QkLayout::kRowGroups;
  constexpr int kVGroups = VLayout::kRowGroups;
  constexpr int kChunk = GroupSumChunkKeys<T, kDimQk, kDimV>();
  constexpr int kQkSteps = kChunk / kQkGroups;
  constexpr int kVSteps = kChunk / kVGroups;
  static_assert(kChunk % kQkGroups == 0 && kChunk % kVGroups == 0, "chunk must fill the steps");

  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (warp >= p.batch * p.heads_kv) return;  // the whole warp leaves together
  const int64_t b = warp / p.heads_kv;
  const int64_t kv_head = warp - b * p.heads_kv;
  const Sequence seq = LoadSequence(p, b);
  const int64_t kv_rows = p.thd ? seq.len_kv : p.max_seqlen_kv;
  const int qk_group = QkLayout::group(lane);
  const int v_group = VLayout::group(lane);
  T* dk_rows = static_cast<T*>(p.dk.data) + RowOffset(p.dk, b, kv_head, seq.start_kv);
  T* dv_rows = static_cast<T*>(p.dv.data) + RowOffset(p.dv, b, kv_head, seq.start_kv);

  for (int64_t base = 0; base < kv_rows; base += kChunk) {
    float dk[kQkSteps][kQkVecs][kVec], dv[kVSteps][kVVecs][kVec];
#pragma unroll
    for (int t = 0; t < kQkSteps; ++t)
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) dk[t][c][e] = 0.0f;
#pragma unroll
    for (int t = 0; t < kVSteps; ++t)
#pragma unroll
      for (int c = 0; c < kVVecs; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) dv[t][c][e] = 0.0f;

    // Without a query token (len_q = 0) every coefficient is zero, and in THD there is no q or
    // dO row to read.
    if (seq.len_q > 0) {
      for (int64_t h = kv_head * p.group; h < (kv_head + 1) * p.group; ++h) {
        const float* coefficients =
            p.group_coefficients + 2 * (b * p.heads_q + h) * p.max_seqlen_kv;
        const T* q_row = static_cast<const T*>(p.q.data) + RowOffset(p.q, b, h, seq.start_q);
        const int64_t do_row = RowOffset(p.d_o, b, h, seq.start_q);
        float q[kQkVecs][kVec], d_o[kVVecs][kVec];
#pragma unroll
        for (int c = 0; c < kQkVecs; ++c)
          LoadFloats<T, kVec>(q_row, QkLayout::column(lane, c), p.q.stride_d, p.q.vectorized,
                              q[c]);
#pragma unroll
        for (int c = 0; c < kVVecs; ++c)
          LoadFloatsOfDtype<kVec>(p.d_o.data, p.d_o.dtype, do_row, VLayout::column(lane, c),
                                  p.d_o.stride_d, p.d_o.vectorized, d_o[c]);
#pragma unroll
        for (int t = 0; t < kQkSteps; ++t) {
          const int64_t j = base + t * kQkGroups + qk_group;
          const float w = j < kv_rows ? __ldg(coefficients + 2 * j) : 0.0f;
#pragma unroll
          for (int c = 0; c < kQkVecs; ++c)
#pragma unroll
            for (int e = 0; e < kVec; ++e) dk[t][c][e] = fmaf(w, q[c][e], dk[t][c][e]);
        }
#pragma unroll
        for (int t = 0; t < kVSteps; ++t) {
          const int64_t j = base + t * kVGroups + v_group;
          const float w = j < kv_rows ? __ldg(coefficients + 2 * j + 1) : 0.0f;
#pragma unroll
          for (int c = 0; c < kVVecs; ++c)
#pragma unroll
            for (int e = 0; e < kVec; ++e) dv[t][c][e] = fmaf(w, d_o[c][e], dv[t][c][e]);
        }
      }
    }

#pragma unroll
    for (int t = 0; t < kQkSteps; ++t) {
      const int64_t j = base + t * kQkGroups + qk_group;
      if (j >= kv_rows) continue;
#pragma unroll
      for (int c = 0; c < kQkVecs; ++c)
        StoreFloats<T, kVec>(dk_rows + j * p.dk.stride_s, QkLayout::column(lane, c),
                             p.dk.stride_d, p.dk.vectorized, dk[t][c]);
    }
#pragma unroll
    for (int t = 0; t < kVSteps; ++t) {
      const int64_t j = base + t * kVGroups + v_group;
      if (j >= kv_rows) continue;
#pragma unroll
      for (int c = 0; c < kVVecs; ++c)
        StoreFloats<T, kVec>(dv_rows + j * p.dv.stride_s, VLayout::column(lane, c),
                             p.dv.stride_d, p.dv.vectorized, dv[t][c]);
    }
  }
}

}  // namespace fusedattn::small_seq
