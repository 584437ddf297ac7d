// Small kernels around the cuDNN graphs: they prepare what cuDNN reads (sequence lengths and
// ragged offsets from cu_seqlens, LSE staging, a zero sink, the page table of paged K/V) and
// write what our semantics say where
// cuDNN's differ or are unspecified (rows that see no key: O = 0, LSE = -inf, dQ = 0; keys no row
// sees: dK = dV = 0; dbias outside every sequence's band = 0), and compute dsink. A call launches
// at most one kernel before its graph (LaunchPrepare) and one after it (the forward's fix-up, or
// the backward's epilogue, which does all of the backward's work in one launch): a launch costs
// microseconds of host time, more than these kernels' device time. O(rows) work, no O(sq * skv)
// memory (dbias aside, which is that size).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/band.h"
#include "backends/cudnn/plan_spec.h"

namespace fusedattn::cudnn {

// Where each sequence is, as the problem says. Lengths are clamped to [0, rows] and, for THD, to
// the tensor's tokens, so no kernel reads out of bounds whatever cu_seqlens hold.
struct Sequences {
  int64_t batch = 0;  // the problem's batch (graph batch entries past it are empty)
  // The graph's sequence extents: the rows per sequence and head of our staged stats, and the
  // rows the kernels visit.
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  // The caller's max_seqlen: the rows of a sequence in dense tensors and in a [batch, heads,
  // rows] LSE, and every sequence's length without cu_seqlens. Below the graph's extents for a
  // THD bucket and for a dense problem run through a ragged plan (plan_spec.h RouteExtents),
  // whose rows past them are not the caller's.
  int64_t rows_q = 0, rows_kv = 0;
  const int32_t* cu_seqlens_q = nullptr;   // null: every length is rows
  const int32_t* cu_seqlens_kv = nullptr;
  const int32_t* seq_offsets_q = nullptr;  // THD token starts (null: cu_seqlens)
  const int32_t* seq_offsets_kv = nullptr;
  bool thd = false;
  int64_t tokens_q = 0, tokens_kv = 0;     // THD: token rows of the q-side / kv-side tensors
  // Paged K/V: sequence b has seqlens_kv[b] keys (clamped to [0, rows_kv]), read through the
  // page table; cu_seqlens_kv, seq_offsets_kv and tokens_kv do not apply (THD queries or not).
  const int32_t* seqlens_kv = nullptr;
};

// A [batch, heads, seq, dim] view; THD adds the sequence's token start to seq (stride_b = 0).
struct DeviceView {
  void* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0, stride_d = 0;
};

struct PrepareParams {
  Sequences seq;
  int64_t graph_batch = 0;
  int32_t* seq_len_q = nullptr;   // [graph_batch], or null
  int32_t* seq_len_kv = nullptr;
  // A call in batch chunks (plan_spec.h BatchChunks; count 0: not chunked): the lengths are
  // written as one array per chunk instead, chunk i's at chunks.seq_len_offset(i), holding
  // sequences chunks.first[i] ... + chunks.batch[i] - 1.
  BatchChunks chunks;
  int32_t* ragged[kRaggedSlots] = {};        // [graph_batch + 1] element offsets, or null
  // THD: the tensor's token stride (offset = token start * stride). A dense tensor run through a
  // ragged plan (seq.thd false): its step from one sequence to the next (offset = b * step).
  int64_t ragged_stride[kRaggedSlots] = {};
  bool ragged_kv_side[kRaggedSlots] = {};
  // The softmax sink as cuDNN reads it, contiguous [heads_q]: the caller's sink logits (strided),
  // or zeros for the off-by-one softmax when sink_src is null.
  float* sink = nullptr;
  const float* sink_src = nullptr;
  int64_t sink_stride = 1;
  int64_t heads_q = 0;
  // LSE staging for the backward: stats[b][h][i] = lse of the row, or +inf where the row sees no
  // key (then every probability cuDNN forms, exp(s - stats), is 0).
  float* stats = nullptr;         // [graph_batch, heads_q, max_seqlen_q], or null
  DeviceView lse;                 // float32; stride_d unused
  bool lse_packed = false;        // THD [tokens, heads]
  Band band;
  unsigned int* zero_counter = nullptr;  // set to 0 (the backward epilogue's dsink count), or null
  // Paged K/V: the table cuDNN reads, int32 [graph_batch, table_pages] (packed), written from
  // the caller's (row b at page_table_src + b * page_table_stride), entry by entry as
  // plan_spec.h TablePage says, so that cuDNN never follows an index outside the pool whatever
  // the caller's entries hold (fusedattn.h: only a sequence's used entries are read, and a bad
  // one is never followed). Graph entries past the problem's batch (THD capacity) have no keys:
  // page 0 throughout.
  int32_t* page_table = nullptr;
  const int32_t* page_table_src = nullptr;
  int64_t page_table_stride = 0;
  int64_t table_pages = 0, page_size = 0, num_pages = 0;
};
// cudaSuccess when this build has an image of these kernels for the current device.
cudaError_t ProbeKernels();

cudaError_t LaunchPrepare(const PrepareParams& params, cudaStream_t stream);

struct ForwardFixupParams {
  Sequences seq;
  Band band;
  int64_t heads_q = 0, head_dim_v = 0;
  DeviceView o;                   // 16-bit elements
  const float* stats = nullptr;   // staged [graph_batch, heads_q, max_seqlen_q], or null
  DeviceView lse;                 // float32 output, data null when not asked for
  bool lse_packed = false;
  // A score_mod decided visibility: a row is also empty where its staged stats show that no key
  // was visible (-inf, NaN, or cuDNN's "lowest" mask value plus a log; see kEmptyStats).
  bool empty_by_stats = false;
};
cudaError_t LaunchForwardFixup(const ForwardFixupParams& params, cudaStream_t stream);

struct BackwardFixupParams {
  Sequences seq;
  Band band;
  int64_t heads_q = 0, heads_kv = 0, head_dim_qk = 0, head_dim_v = 0;
  DeviceView dq, dk, dv;          // 16-bit elements
};

struct DbiasFixupParams {
  Sequences seq;
  Band band;
  int64_t bias_batch = 0, bias_heads = 0;
  void* dbias = nullptr;
  int element_bytes = 4;          // 4 (float32) or 2
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_kv = 0;
};

// dsink[h] = -sum over rows that see a key of exp(sink[h] - lse) * (dO . O), in a fixed order
// (bit-identical run to run).
struct DsinkParams {
  Sequences seq;
  Band band;
  int64_t heads_q = 0, head_dim_v = 0;
  bool bf16 = true;               // dtype of O and dO (else float16)
  DeviceView o, d_o;
  DeviceView lse;
  bool lse_packed = false;
  const float* sink = nullptr;
  int64_t sink_stride = 1;
  float* partials = nullptr;      // [kDsinkChunks, heads_q] scratch
  unsigned int* done = nullptr;   // scratch, 0 at launch (the prepare kernel zeroes it)
  float* dsink = nullptr;
  int64_t dsink_stride = 1;
};

// What the backward does after its graph, in one launch: the fix-up of dQ / dK / dV, the dbias
// fix-up and dsink, each when its flag is set (nothing is launched when none is).
struct BackwardEpilogueParams {
  bool do_fixup = false;
  BackwardFixupParams fixup;
  bool do_dbias = false;
  DbiasFixupParams dbias_fixup;
  bool do_dsink = false;
  DsinkParams dsink;
};
cudaError_t LaunchBackwardEpilogue(const BackwardEpilogueParams& params, cudaStream_t stream);

}  // namespace fusedattn::cudnn
