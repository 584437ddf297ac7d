// The arguments of every flash kernel: one plain struct, filled on the host from a Problem and its
// tensor views (flash_backend.cpp) and passed by value to the kernels. Fields that a kernel does
// not use are left zero/null. Lengths fit int32 (validated by MakeProblem); offsets are int64.
#pragma once

#ifndef __CUDACC_RTC__
#include <cstdint>
#endif

#include "common/band.h"
#include "fusedattn/fusedattn.h"

namespace fusedattn::flash {

// A q/k/v/o-like tensor: element (b, h, i, x) of sequence b at
//   data + b * stride_b + (start[b] + i) * stride_s + h * stride_h + x * stride_d.
struct TensorArg {
  void* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0, stride_d = 0;
};

// The LSE tensor: [batch, heads, max_seqlen_q] (stride_b, stride_h, stride_s) or, packed for THD,
// [tokens, heads] (stride_b = 0 and the sequence's token start applies).
struct LseArg {
  float* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0;
  bool packed = false;
};

// Bias [bias_batch, bias_heads, max_seqlen_q, max_seqlen_kv]; broadcast axes have stride 0.
struct BiasArg {
  void* data = nullptr;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_kv = 0;
};

// A score_mod tensor (or the float32 sum of its gradient): element (b, h, i, j) at
// b * stride_b + h * stride_h + i * stride_q + j * stride_kv, stride 0 on axes it does not index.
// Its dtype is part of the compiled graph.
struct FlexTensorArg {
  const void* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_kv = 0;
};
constexpr int kMaxFlexTensors = 8;

// What the run-time compiled score_mod kernels read besides the graph (jit.h); unused (null)
// by the ahead-of-time instances.
struct FlexArgs {
  FlexTensorArg tensors[kMaxFlexTensors];
  // float32 [E_b, E_h, E_q, E_kv] sums of dS * d score / d tensor, for tensors requiring grad
  // (added with atomics); data null otherwise.
  FlexTensorArg grads[kMaxFlexTensors];
  // Block sparsity from the mask_mod: one byte per (b, h, query tile, key tile) of the launched
  // kernel's tile shape, 0 where the mask_mod hides every element of the tile. Null: every tile
  // is visited. Broadcast axes (the mask reads neither the batch nor the head) have stride 0.
  const unsigned char* block_mask = nullptr;
  int64_t block_mask_stride_b = 0, block_mask_stride_h = 0;
  int block_mask_n_tiles = 0;  // row stride: key tiles per query tile
};

// Paged K/V (fusedattn.h "Paged K/V"): key j of sequence b is token j % page_size of page
// page_table[b * page_table_stride + j / page_size]; only entries of keys below the sequence's
// length are read, and one outside [0, num_pages) is never followed. seqlens_kv[b] is the
// sequence's number of keys, clamped to [0, max_seqlen_kv]. page_table null: contiguous K/V.
struct PagedKvArg {
  const int32_t* page_table = nullptr;
  int64_t page_table_stride = 0;
  const int32_t* seqlens_kv = nullptr;
  int page_size = 0;
  int num_pages = 0;
};

// FP8 attention (fusedattn.h "FP8 attention"; the Hopper forward's FP8 instance): the call's
// scaling factors and amax outputs (float32 scalars in device memory, read / written by the
// kernels), and the V^T workspace the pre-pass writes: [batch][heads_kv][128][value_keys] e4m3,
// the keys of each 32-key block in sm90_tile.h's Sm90Fp8ValueKeyOfColumn order, 0 past the keys.
struct Fp8Arg {
  const float* descale_q = nullptr;
  const float* descale_k = nullptr;
  const float* descale_v = nullptr;
  const float* descale_s = nullptr;
  const float* scale_s = nullptr;
  const float* scale_o = nullptr;  // o_dtype FP8 only
  float* amax_s = nullptr;
  float* amax_o = nullptr;
  unsigned char* value_t = nullptr;
  int64_t value_keys = 0;
};

struct FlashParams {
  // Shapes.
  int batch = 0, heads_q = 0, heads_kv = 0, group = 1;  // group = heads_q / heads_kv
  int max_seqlen_q = 0, max_seqlen_kv = 0;
  int head_dim_qk = 0, head_dim_v = 0;
  int64_t tokens_q = 0, tokens_kv = 0;  // rows of the token axis (THD), for clamping offsets
  fusedattn_dtype qkv_dtype = FUSEDATTN_DTYPE_FLOAT32, o_dtype = FUSEDATTN_DTYPE_FLOAT32;

  // Sequences: per-sequence lengths from cu_seqlens when padding (or THD); THD token starts from
  // seq_offsets (or cu_seqlens). Lengths are clamped to max_seqlen and starts to the tokens.
  bool padding = false, thd = false;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;
  const int32_t* seq_offsets_q = nullptr;
  const int32_t* seq_offsets_kv = nullptr;

  // Mask: key j is visible to query i when j < len_kv, i < len_q and
  //   diag - window_left <= j <= diag + window_right, diag = i + (bottom_right ? len_kv - len_q : 0)
  // with -1 meaning unbounded (window_right is 0 for causal masks).
  bool bottom_right = false;
  int64_t window_left = -1, window_right = -1;

  // Score pipeline (fusedattn.h).
  float scale = 1.f;
  float softcap = 0.f;  // 0: off
  fusedattn_bias bias_type = FUSEDATTN_BIAS_NONE;
  BiasArg bias;
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride = 1;
  fusedattn_softmax softmax_type = FUSEDATTN_SOFTMAX_VANILLA;
  const float* sink_logits = nullptr;
  int64_t sink_stride = 1;

  // Dropout (fusedattn.h's Philox rule): keep when word >= threshold, kept values * keep_scale.
  bool dropout = false;
  uint32_t dropout_threshold = 0;
  float keep_scale = 1.f;
  uint64_t dropout_seed = 0, dropout_offset = 0;

  // Forward tensors.
  TensorArg q, k, v, o;
  LseArg lse;                   // output of the forward (may be null), input of the backward
  float* max_logit = nullptr;   // [heads_q], filled with -inf before the forward
  int64_t max_logit_stride = 1;

  // Backward tensors.
  TensorArg d_o, dq, dk, dv;
  BiasArg dbias;                // data null: no bias gradient
  float* dsink = nullptr;
  int64_t dsink_stride = 1;
  bool deterministic = false;

  // Backward workspace (float32), indexed by (b, h, i) with i < max_seqlen_q:
  float* delta = nullptr;        // D = rowsum(dO * O), 0 for rows without a visible key
  float* sink_partial = nullptr; // LEARNABLE_SINK: -exp(sink - lse) * D per row, reduced to dsink
  float* dq_accum = nullptr;     // [b, h, max_seqlen_q, dq_accum_dim]: dQ / scale accumulated
  int dq_accum_dim = 0;          // padded head dim of dq_accum
  // Order of dq_accum's floats (dq_accum_layout.h): row-major (the mma.sync kernels), or tiled
  // (the Hopper key-block kernel; set by the host after it ran, read by LaunchConvertDq).
  bool dq_accum_tiled = false;
  // The deterministic Hopper backward (p.deterministic on the Hopper key-block kernel): its
  // zeroed int32 order workspace of DqOrderInts(...) values (dq_accum_layout.h); else null.
  int32_t* dq_order = nullptr;
  // How the backward kernels treat dbias: 0 none, 1 store (each element written once),
  // 2 atomic add into float32 dbias (broadcast axes, non-deterministic).
  int dbias_mode = 0;

  // Score modifiers (run-time compiled kernels only).
  FlexArgs flex;

  // Heavy-first tile schedule of the Hopper kernels for THD problems (schedule.h):
  // schedule_workspace: int32 room for ScheduleInts(batch) values that the host gives the
  //   launchers (null: no schedule, the plain grid);
  // schedule: set by a launcher for its own kernel once LaunchTileSchedule has written
  //   order[batch] then tile_start[batch + 1] there; null: the plain (tile, head, sequence) grid.
  int32_t* schedule_workspace = nullptr;
  const int32_t* schedule = nullptr;

  // Paged K/V on the Hopper forward's paged instances (fwd_kernel_sm90.cuh; the decode kernel
  // takes the same in its DecodeParams): k and v are then the pools (stride_b from page to page,
  // stride_s from token to token inside a page). Last in the struct, so that the other kernels'
  // fields keep their offsets.
  PagedKvArg paged;

  // FP8 problems only (qkv_dtype FP8_E4M3): after paged, for the same reason.
  Fp8Arg fp8;
};

enum DbiasMode { kDbiasNone = 0, kDbiasStore = 1, kDbiasAtomic = 2 };

#if defined(__CUDACC__)
#define FUSEDATTN_PARAMS_HD __host__ __device__ __forceinline__
#else
#define FUSEDATTN_PARAMS_HD inline
#endif

// Whether the tensor-core kernels run their full variant (bias or ALiBi, softcap, dropout) rather
// than the plain one, which keeps registers free for vanilla attention. The planner (planner.cpp)
// and the launchers (NeedsFullKernel(p), device_common.cuh) both ask this.
FUSEDATTN_PARAMS_HD bool NeedsFullKernel(fusedattn_bias bias_type, float softcap, bool dropout) {
  return bias_type != FUSEDATTN_BIAS_NONE || softcap > 0.f || dropout;
}

// The band of the params' mask (common/band.h, the one definition every backend reads).
FUSEDATTN_PARAMS_HD Band BandOf(const FlashParams& p) {
  return MakeBand(p.window_left, p.window_right, p.bottom_right);
}

// Whether every key of [key0, key0 + keys) is visible to every query row of [row0, row0 + rows)
// in a sequence of len_q queries and len_kv keys (rows, keys >= 1; row0, key0 >= 0): the tile
// lies inside the sequence and the band, so no element of it is masked and the kernels run no
// mask code on it. The last row's raw_lo and the first row's raw_hi bound every other row's;
// shift is the band's diagonal shift for the sequence (Band::shift). Written as the kernels wrote
// it out before it was shared (int tile coordinates, each window field read where the test needs
// it), so that their arithmetic stays what it was.
FUSEDATTN_PARAMS_HD bool TileFullyVisible(const FlashParams& p, int row0, int rows, int key0,
                                          int keys, int len_q, int len_kv, int64_t shift) {
  return row0 + rows <= len_q && key0 + keys <= len_kv &&
         (p.window_left < 0 || key0 >= BandOf(p).raw_lo(row0 + rows - 1, shift)) &&
         (p.window_right < 0 || key0 + keys <= BandOf(p).raw_hi(row0, shift));
}

}  // namespace fusedattn::flash
