// The small_seq backend's host side: which problems it takes (CheckProblem), its workspace, and
// the translation of validated views into kernel parameters.
#include <algorithm>
#include <cstdint>

#include "backends/small_seq/small_seq.h"
#include "common/cuda_util.h"
#include "common/philox.h"
#include "select/backend.h"

namespace fusedattn {
namespace small_seq {

Status CheckProblem(const Problem& problem) {
  const auto& c = problem.config;
  if (problem.device != Device::kCuda)
    return NotSupported("runs on CUDA tensors only, and config.device is CPU");
  if (problem.has_dropout_positions())
    return NotSupported(
        "dropout positions (context parallelism: config.dropout_batch_offset, dropout_heads, "
        "dropout_head_offset, dropout_rows, dropout_row_offset, dropout_key_offset): not yet on "
        "small_seq's kernels; the reference runs them");
  if (problem.paged)
    return NotSupported("paged K/V (page_size = %lld): small_seq's kernels read contiguous K/V "
                        "only, no page table",
                        (long long)c.page_size);
  if (c.max_seqlen_q != 1)
    return NotSupported("max_seqlen_q = %lld != 1 (small_seq runs one query token per sequence)",
                        (long long)c.max_seqlen_q);
  if (c.max_seqlen_kv > kMaxSeqlenKv)
    return NotSupported("max_seqlen_kv = %lld > %lld", (long long)c.max_seqlen_kv,
                        (long long)kMaxSeqlenKv);
  if (!HasKernelsForHeadDims(c.head_dim_qk, c.head_dim_v)) {
    if (c.head_dim_qk != c.head_dim_v)
      return NotSupported(
          "head_dim_qk = %lld != head_dim_v = %lld (small_seq is built for equal head dims 64, "
          "128, 256 or 512)",
          (long long)c.head_dim_qk, (long long)c.head_dim_v);
    return NotSupported("head_dim = %lld is not one of 64, 128, 256, 512",
                        (long long)c.head_dim_qk);
  }
  for (fusedattn_dtype dtype : {c.qkv_dtype, c.o_dtype}) {
    if (dtype != FUSEDATTN_DTYPE_FLOAT32 && dtype != FUSEDATTN_DTYPE_FLOAT16 &&
        dtype != FUSEDATTN_DTYPE_BFLOAT16)
      return NotSupported("dtype %s: small_seq runs float32, float16 and bfloat16",
                          DtypeName(dtype));
  }
  // At most one warp per (sequence, query head) (GroupSumKernel: per kv head); block counts must
  // fit the grid's 31 bits, and the forward indexes rows in 32 bits.
  if (c.batch * c.heads_q > INT32_MAX)
    return NotSupported("batch * heads_q = %lld * %lld is more than %d warps", (long long)c.batch,
                        (long long)c.heads_q, INT32_MAX);
  // Every mask, window, bias (with dbias), ALiBi, softcap, softmax variant and dropout (at the
  // default positions) runs here; the backward is deterministic (no floating-point atomics).
  return Status::Ok();
}

namespace {

constexpr size_t kWorkspaceAlignment = 256;

size_t AlignUp(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

bool DbiasIsDirect(const Problem& problem) {
  const auto& c = problem.config;
  return c.bias_batch == c.batch && c.bias_heads == c.heads_q;
}

}  // namespace

// The backward's workspace holds only what crosses from one row's team to another kernel:
//  - group > 1: two floats per (sequence, query head, key) [batch][heads_q][max_seqlen_kv][2],
//    the coefficients that GroupSumKernel sums over a group's heads into dK and dV;
//  - dbias over a broadcast axis: one float per (sequence, query head, key), the row of dbias
//    partials that a fixed-order reduction sums over the broadcast axes;
//  - learnable sink: one float per (sequence, query head), the dsink terms summed over the batch.
// Everything else (dQ, and dK/dV without GQA) is written straight to the outputs. The forward
// needs no workspace.
BwdWorkspaceLayout BackwardWorkspace(const Problem& problem) {
  const auto& c = problem.config;
  const size_t rows = static_cast<size_t>(c.batch) * static_cast<size_t>(c.heads_q);
  const size_t keys = static_cast<size_t>(c.max_seqlen_kv);
  BwdWorkspaceLayout layout;
  size_t offset = 0;
  if (problem.group_size() > 1) {
    layout.group_coefficients = offset;
    offset += AlignUp(rows * keys * 2 * sizeof(float));
  }
  if (c.bias_requires_grad && !DbiasIsDirect(problem)) {
    layout.dbias_partials = offset;
    offset += AlignUp(rows * keys * sizeof(float));
  }
  if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK) {
    layout.dsink_partials = offset;
    offset += AlignUp(rows * sizeof(float));
  }
  layout.total = offset;
  return layout;
}

namespace {

// A view as the kernels see it. Chunks of a row are 16 bytes of the qkv dtype (qkv_chunk
// elements); they move as vectors when stride_d is 1 and the pointer and every other stride keep
// each chunk aligned to its access width.
KernelTensor ToKernel(const TensorView& view, int64_t qkv_chunk) {
  KernelTensor k;
  k.data = view.data;
  k.dtype = view.dtype;
  k.stride_b = view.stride_b;
  k.stride_h = view.stride_h;
  k.stride_s = view.stride_s;
  k.stride_d = view.stride_d;
  const int64_t element = static_cast<int64_t>(DtypeSize(view.dtype));
  const int64_t width = std::min<int64_t>(16, qkv_chunk * element);
  auto aligned = [&](int64_t stride) { return (stride * element) % width == 0; };
  k.vectorized = view.data != nullptr && view.stride_d == 1 &&
                 reinterpret_cast<uintptr_t>(view.data) % static_cast<uintptr_t>(width) == 0 &&
                 aligned(view.stride_b) && aligned(view.stride_h) && aligned(view.stride_s);
  return k;
}

KernelBias ToKernel(const BiasView& view) {
  KernelBias k;
  k.data = view.data;
  k.dtype = view.dtype;
  k.stride_b = view.stride_b;
  k.stride_h = view.stride_h;
  k.stride_kv = view.stride_kv;
  return k;
}

// The fields forward and backward share.
template <typename Tensors>
KernelParams CommonParams(const Problem& problem, const Tensors& t) {
  const auto& c = problem.config;
  const int64_t chunk = 16 / static_cast<int64_t>(DtypeSize(c.qkv_dtype));
  KernelParams p;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.group = problem.group_size();
  p.max_seqlen_q = c.max_seqlen_q;
  p.max_seqlen_kv = c.max_seqlen_kv;
  p.q_tokens = t.q.num_tokens;
  p.kv_tokens = t.k.num_tokens;
  p.q = ToKernel(t.q, chunk);
  p.k = ToKernel(t.k, chunk);
  p.v = ToKernel(t.v, chunk);
  p.o = ToKernel(t.o, chunk);
  if (t.lse.present()) {
    p.lse.data = t.lse.data;
    p.lse.dtype = FUSEDATTN_DTYPE_FLOAT32;
    p.lse.stride_b = t.lse.stride_b;
    p.lse.stride_h = t.lse.stride_h;
    p.lse.stride_s = t.lse.stride_s;
  }
  p.lse_packed = t.lse_packed;
  p.padding = problem.padding;
  p.thd = problem.thd;
  p.cu_seqlens_q = t.cu_seqlens_q;
  p.cu_seqlens_kv = t.cu_seqlens_kv;
  p.seq_offsets_q = t.seq_offsets_q;
  p.seq_offsets_kv = t.seq_offsets_kv;
  p.bottom_right = problem.bottom_right;
  p.window_left = problem.window_left;
  p.window_right = problem.window_right;
  p.scale = static_cast<float>(problem.scale());
  p.softcap = static_cast<float>(c.softcap);
  p.bias_type = c.bias_type;
  p.bias = ToKernel(t.bias);
  p.alibi_slopes = t.alibi_slopes;
  p.alibi_stride = t.alibi_stride;
  p.softmax_type = c.softmax_type;
  p.sink_logits = t.sink_logits;
  p.sink_stride = t.sink_stride;
  p.dropout = problem.has_dropout();
  p.dropout_threshold = DropoutRow::Threshold(c.dropout);
  p.dropout_keep_scale = static_cast<float>(1.0 / (1.0 - c.dropout));
  p.dropout_seed = t.dropout_seed;
  p.dropout_offset = t.dropout_offset;
  return p;
}

Status LaunchForward(const KernelParams& p, const Problem& problem, void* stream) {
  const auto& c = problem.config;
  const int dqk = static_cast<int>(c.head_dim_qk), dv = static_cast<int>(c.head_dim_v);
  switch (c.qkv_dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return LaunchForwardFloat32(p, dqk, dv, stream);
    case FUSEDATTN_DTYPE_FLOAT16: return LaunchForwardFloat16(p, dqk, dv, stream);
    case FUSEDATTN_DTYPE_BFLOAT16: return LaunchForwardBfloat16(p, dqk, dv, stream);
    default: return InternalError("small_seq: no forward for dtype %s", DtypeName(c.qkv_dtype));
  }
}

Status LaunchBackward(const KernelParams& p, const Problem& problem, void* stream) {
  const auto& c = problem.config;
  const int dqk = static_cast<int>(c.head_dim_qk), dv = static_cast<int>(c.head_dim_v);
  switch (c.qkv_dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return LaunchBackwardFloat32(p, dqk, dv, stream);
    case FUSEDATTN_DTYPE_FLOAT16: return LaunchBackwardFloat16(p, dqk, dv, stream);
    case FUSEDATTN_DTYPE_BFLOAT16: return LaunchBackwardBfloat16(p, dqk, dv, stream);
    default: return InternalError("small_seq: no backward for dtype %s", DtypeName(c.qkv_dtype));
  }
}

}  // namespace
}  // namespace small_seq

namespace {

class SmallSeqBackendImpl final : public Backend {
 public:
  fusedattn_backend id() const override { return FUSEDATTN_BACKEND_SMALL_SEQ; }
  const char* name() const override { return "small_seq"; }

  Status available() const override {
    if (!HasCudaDevice()) return NotSupported("%s", NoCudaDeviceReason().c_str());
    static const Status runs = small_seq::KernelsRunOnCurrentDevice();
    return runs;
  }

  Status check(const Problem& problem) override {
    if (problem.has_score_mod())
      return NotSupported(
          "score_mod graphs: small_seq has no score modifier hook (cuDNN, flash and the "
          "reference backend run them)");
    FUSEDATTN_RETURN_IF_ERROR(small_seq::CheckProblem(problem));
    return available();
  }

  Status fwd_workspace_size(const Problem&, size_t* bytes) override {
    *bytes = 0;
    return Status::Ok();
  }

  Status bwd_workspace_size(const Problem& problem, size_t* bytes) override {
    *bytes = small_seq::BackwardWorkspace(problem).total;
    return Status::Ok();
  }

  Status forward(const Problem& problem, const FwdTensors& t, void*, size_t,
                 void* stream) override {
    FUSEDATTN_RETURN_IF_ERROR(small_seq::CheckProblem(problem));
    small_seq::KernelParams p = small_seq::CommonParams(problem, t);
    p.max_logit = t.max_logit;
    p.max_logit_stride = t.max_logit_stride;
    if (p.max_logit != nullptr)
      FUSEDATTN_RETURN_IF_ERROR(small_seq::LaunchFillNegativeInfinity(
          p.max_logit, problem.config.heads_q, p.max_logit_stride, stream));
    return small_seq::LaunchForward(p, problem, stream);
  }

  Status backward(const Problem& problem, const BwdTensors& t, void* workspace,
                  size_t workspace_bytes, void* stream) override {
    FUSEDATTN_RETURN_IF_ERROR(small_seq::CheckProblem(problem));
    const auto& c = problem.config;
    const small_seq::BwdWorkspaceLayout layout = small_seq::BackwardWorkspace(problem);
    if (layout.total > 0 && (workspace == nullptr || workspace_bytes < layout.total))
      return Status(FUSEDATTN_ERROR_WORKSPACE,
                    Format("small_seq backward: workspace of %llu bytes given, %llu needed",
                           (unsigned long long)workspace_bytes,
                           (unsigned long long)layout.total));
    auto* bytes = static_cast<unsigned char*>(workspace);
    small_seq::KernelParams p = small_seq::CommonParams(problem, t);
    const int64_t chunk = 16 / static_cast<int64_t>(DtypeSize(c.qkv_dtype));
    p.d_o = small_seq::ToKernel(t.d_o, chunk);
    p.dq = small_seq::ToKernel(t.dq, chunk);
    p.dk = small_seq::ToKernel(t.dk, chunk);
    p.dv = small_seq::ToKernel(t.dv, chunk);
    if (problem.group_size() > 1)
      p.group_coefficients = reinterpret_cast<float*>(bytes + layout.group_coefficients);
    if (c.bias_requires_grad) {
      if (small_seq::DbiasIsDirect(problem)) {
        p.dbias_mode = small_seq::DbiasMode::kDirect;
        p.dbias = small_seq::ToKernel(t.dbias);
      } else {
        p.dbias_mode = small_seq::DbiasMode::kPartials;
        p.dbias_partials = reinterpret_cast<float*>(bytes + layout.dbias_partials);
      }
    }
    if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK)
      p.dsink_partials = reinterpret_cast<float*>(bytes + layout.dsink_partials);

    FUSEDATTN_RETURN_IF_ERROR(small_seq::LaunchBackward(p, problem, stream));
    if (p.dsink_partials != nullptr) {
      small_seq::KernelBias dsink;
      dsink.data = t.dsink;
      dsink.dtype = FUSEDATTN_DTYPE_FLOAT32;
      dsink.stride_h = t.dsink_stride;
      FUSEDATTN_RETURN_IF_ERROR(small_seq::LaunchSumPartials(
          p.dsink_partials, c.batch, c.heads_q, 1, 1, c.heads_q, dsink, stream));
    }
    if (p.dbias_mode == small_seq::DbiasMode::kPartials)
      FUSEDATTN_RETURN_IF_ERROR(small_seq::LaunchSumPartials(
          p.dbias_partials, c.batch, c.heads_q, c.max_seqlen_kv, c.bias_batch, c.bias_heads,
          small_seq::ToKernel(t.dbias), stream));
    return Status::Ok();
  }
};

}  // namespace

Backend* SmallSeqBackend() {
  static SmallSeqBackendImpl backend;
  return &backend;
}

}  // namespace fusedattn
