// The small_seq backend: one query token (max_seqlen_q = 1) against a short K/V
// (max_seqlen_kv <= kMaxSeqlenKv): cross-attention from one token, or decoding against a short
// cache. Such problems are purely memory-bound: per (sequence, head) the work is q (d), k and v
// (seqlen_kv * d per kv head) and o (d), so the kernels stream every byte once with 16-byte loads
// and keep the scores in registers. Nothing here is a matrix product.
//
// Files: small_seq_backend.cpp (check, workspace, parameters; plain C++), device.cuh (row layout,
// loads/stores, masks, score pipeline, dropout), forward.cuh, backward.cuh (the kernels and what
// they save and exchange), reduce.cuh (fixed-order sums), launch.cuh + kernels_<dtype>.cu (the
// instances, one file per dtype). Tuning knobs: kChunkVectors, kForwardRowsPerTeam and
// MinBlocksPerSm (device.cuh), kWarpsPerBlock (here). tests/small_seq_emulation runs these kernels on the CPU.
//
// This header is shared by the host side and the kernels: it holds only plain data.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "problem/problem.h"

namespace fusedattn::small_seq {

// The longest K/V this backend takes. The kernels themselves stream any number of keys in
// chunks; 16 is the bound the issue set (one query against at most 16 keys), at which every
// sequence is a few chunks. Raise it only after bench/small_seq_bench shows the same kernels at
// memory speed for the longer K/V (the GQA backward's workspace also grows with it). Longer
// sequences go to cuDNN or flash.
constexpr int64_t kMaxSeqlenKv = 16;

// Head dims with compiled kernels: head_dim_qk = head_dim_v in {64, 128, 256, 512}. The forward
// and backward kernels give a row to a team of lanes that must cover the q.k and the v row alike
// (device.cuh, Team), which holds for equal head dims.
constexpr bool HasKernelsForHeadDims(int64_t head_dim_qk, int64_t head_dim_v) {
  return head_dim_qk == head_dim_v &&
         (head_dim_qk == 64 || head_dim_qk == 128 || head_dim_qk == 256 || head_dim_qk == 512);
}

// Threads per block: four independent warps (no shared memory, no block-wide barrier).
constexpr int kWarpsPerBlock = 4;
constexpr int kThreadsPerBlock = 32 * kWarpsPerBlock;

// The shape/feature rule of this backend, without looking for a device: OK, or the reason it
// does not run the problem. check() = available() + this.
Status CheckProblem(const Problem& problem);

// A q/k/v/o-like tensor as the kernels see it (see TensorView in problem/problem.h).
struct KernelTensor {
  void* data = nullptr;
  int dtype = FUSEDATTN_DTYPE_FLOAT32;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0, stride_d = 0;
  // Whether every chunk of 16 / sizeof(qkv element) elements of a row can be moved with aligned
  // vector accesses (stride_d = 1, pointer and strides aligned). Otherwise element by element.
  bool vectorized = false;
};

// A bias-like tensor [bias_batch, bias_heads, 1, max_seqlen_kv]; broadcast axes have stride 0.
struct KernelBias {
  void* data = nullptr;
  int dtype = FUSEDATTN_DTYPE_FLOAT32;
  int64_t stride_b = 0, stride_h = 0, stride_kv = 0;
};

// How the backward delivers dbias.
enum class DbiasMode : int {
  kNone = 0,
  // bias_batch = batch and bias_heads = heads_q: each (b, h) warp owns its dbias row.
  kDirect = 1,
  // A broadcast axis: each (b, h) warp writes its row of partial sums to the workspace and a
  // second kernel sums them over the broadcast axes in a fixed order (deterministic).
  kPartials = 2,
};

// Everything a kernel needs, by value (a few hundred bytes of kernel parameters).
struct KernelParams {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, group = 1;
  int64_t max_seqlen_q = 1, max_seqlen_kv = 0;
  int64_t q_tokens = 0, kv_tokens = 0;  // rows of the token axis (THD clamp)

  KernelTensor q, k, v, o, d_o, dq, dk, dv;
  // LSE: stride_b, stride_h and stride_s used (for packed THD stride_b is 0 and the sequence's
  // token start applies).
  KernelTensor lse;
  bool lse_packed = false;

  // Sequences (padding masks and THD).
  bool padding = false, thd = false;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;
  const int32_t* seq_offsets_q = nullptr;
  const int32_t* seq_offsets_kv = nullptr;

  // Mask (Problem's flags).
  bool bottom_right = true;
  int64_t window_left = -1, window_right = -1;

  // Score pipeline.
  float scale = 1.0f, softcap = 0.0f;
  int bias_type = FUSEDATTN_BIAS_NONE;
  KernelBias bias;
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride = 1;

  // Softmax.
  int softmax_type = FUSEDATTN_SOFTMAX_VANILLA;
  const float* sink_logits = nullptr;
  int64_t sink_stride = 1;

  // Dropout (fusedattn.h's Philox rule).
  bool dropout = false;
  uint32_t dropout_threshold = 0;
  float dropout_keep_scale = 1.0f;
  uint64_t dropout_seed = 0, dropout_offset = 0;

  // Forward extras.
  float* max_logit = nullptr;
  int64_t max_logit_stride = 1;

  // Backward extras.
  DbiasMode dbias_mode = DbiasMode::kNone;
  KernelBias dbias;                 // kDirect: the output
  float* dbias_partials = nullptr;  // kPartials: workspace [batch][heads_q][max_seqlen_kv]
  float* dsink_partials = nullptr;  // learnable sink: workspace [batch][heads_q]
  // group > 1: workspace [batch][heads_q][max_seqlen_kv][2] holding, per key, the two
  // coefficients whose sums over a group's query heads give dK and dV (see backward.cu).
  float* group_coefficients = nullptr;
};

// The backward's workspace, in bytes and as offsets into it. Sizes depend on the problem only.
struct BwdWorkspaceLayout {
  size_t group_coefficients = 0, dbias_partials = 0, dsink_partials = 0;  // offsets
  size_t total = 0;
};
BwdWorkspaceLayout BackwardWorkspace(const Problem& problem);

// Kernel launchers, one set per qkv dtype (kernels_<dtype>.cu). The head dims must be ones
// CheckProblem accepts. stream is a cudaStream_t.
Status LaunchForwardFloat32(const KernelParams& params, int head_dim_qk, int head_dim_v,
                            void* stream);
Status LaunchForwardFloat16(const KernelParams& params, int head_dim_qk, int head_dim_v,
                            void* stream);
Status LaunchForwardBfloat16(const KernelParams& params, int head_dim_qk, int head_dim_v,
                             void* stream);
Status LaunchBackwardFloat32(const KernelParams& params, int head_dim_qk, int head_dim_v,
                             void* stream);
Status LaunchBackwardFloat16(const KernelParams& params, int head_dim_qk, int head_dim_v,
                             void* stream);
Status LaunchBackwardBfloat16(const KernelParams& params, int head_dim_qk, int head_dim_v,
                              void* stream);

// Helpers of reduce.cu: max_logit to -inf before the forward's atomic maxima; sums of partials
// over broadcast axes for dsink and dbias.
Status LaunchFillNegativeInfinity(float* data, int64_t count, int64_t stride, void* stream);
// out[ob, oh, j] = sum over b (all if out_batch == 1, else b = ob) and h (all if out_heads == 1,
// else h = oh) of partials[(b * heads + h) * keys + j], in a fixed order.
Status LaunchSumPartials(const float* partials, int64_t batch, int64_t heads, int64_t keys,
                         int64_t out_batch, int64_t out_heads, const KernelBias& out,
                         void* stream);

// Whether the kernels have machine code for the current device (they are built for one
// architecture); the reason if not.
Status KernelsRunOnCurrentDevice();

}  // namespace fusedattn::small_seq
