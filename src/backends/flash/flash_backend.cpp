// The flash backend: our own fused attention kernels on CUDA tensors, for every feature of
// fusedattn.h.
//
// Two paths compute the same thing:
//  * the fast path (fwd_kernel.cuh, bwd_kernel.cuh): tensor cores (mma.sync m16n8k16, ldmatrix,
//    cp.async), float16/bfloat16 with o_dtype == qkv_dtype, head dims that are multiples of 8 up
//    to 256 (padded to a compiled instance, instances/), and q/k/v/dO rows that are contiguous and
//    16-byte aligned;
//  * the simple path (simple_kernels.cu): SIMT, every dtype, head dim and stride;
// and, for max_seqlen_q <= 16 against paged or contiguous K/V, the decode kernel (decode.h,
// decode_kernel.cuh: split-KV with a combine), the only one that reads paged K/V.
// check() sees only the Problem, so the choice between them is made per call from the tensors.
//
// Backward: a preprocess computes D = rowsum(dO * O); the fast kernel is parallel over key blocks
// (dK, dV in registers, dQ added in float32 by atomics into a workspace, then converted). With
// config.deterministic, dQ comes from a second kernel parallel over query blocks that walks the
// keys in a fixed order instead, and nothing is added atomically. dbias is stored directly when it
// is not broadcast; a broadcast float32 dbias is added atomically (non-deterministic mode), any
// other broadcast dbias is summed by a kernel in a fixed order. dsink is reduced in a fixed order.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include <cstring>

#include "backends/flash/decode.h"
#include "backends/flash/jit.h"
#include "backends/flash/kernels.h"
#include "backends/flash/schedule.h"
#include "backends/flash/sm90.h"
#include "backends/flash/tiles.h"
#include "common/cuda_util.h"
#include "flex/score_mod.h"
#include "common/philox.h"
#include "select/backend.h"

namespace fusedattn {

namespace flash {
int FastHeadDimFor(int head_dim_qk, int head_dim_v) {
  // cp.async moves 8 elements at a time: both head dims must be multiples of 8.
  if (head_dim_qk % 8 != 0 || head_dim_v % 8 != 0) return 0;
  const int dim = head_dim_qk > head_dim_v ? head_dim_qk : head_dim_v;
  for (int instance : {64, 128, 256})  // the head dims of generate_kernels.py
    if (dim <= instance) return instance;
  return 0;
}
}  // namespace flash

namespace {

using flash::FlashParams;
namespace jit = flash::jit;

constexpr size_t kWorkspaceAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

bool IsHalfType(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FLOAT16 || dtype == FUSEDATTN_DTYPE_BFLOAT16;
}

// The padded head dim of the fast path's instance for this problem, or 0 (simple path).
int FastHeadDim(const Problem& p) {
  const auto& c = p.config;
  if (!IsHalfType(c.qkv_dtype) || c.o_dtype != c.qkv_dtype) return 0;
  return flash::FastHeadDimFor(static_cast<int>(c.head_dim_qk), static_cast<int>(c.head_dim_v));
}

// Shared memory a block may opt in to on the current device (sm_80 163 KB, sm_86/89 99 KB,
// sm_90 227 KB), queried once per device.
size_t SharedLimit() {
  constexpr int kMaxDevices = 64;
  static std::atomic<size_t> limits[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return flash::SimpleSharedLimit();
  }
  size_t limit = limits[device].load(std::memory_order_relaxed);
  if (limit == 0) {
    limit = flash::SimpleSharedLimit();
    limits[device].store(limit, std::memory_order_relaxed);
  }
  return limit;
}

// Shared memory of the fast path's kernels of a padded head dim (float16/bfloat16): the forward
// (both variants), and the backward (key-block and deterministic dQ kernels).
size_t FastForwardSmem(int dim) {
  switch (dim) {
    case 64: return std::max(flash::FwdSmemBytes<64, false>(2), flash::FwdSmemBytes<64, true>(2));
    case 128:
      return std::max(flash::FwdSmemBytes<128, false>(2), flash::FwdSmemBytes<128, true>(2));
    case 256:
      return std::max(flash::FwdSmemBytes<256, false>(2), flash::FwdSmemBytes<256, true>(2));
  }
  return 0;
}
size_t FastBackwardSmem(int dim) {
  switch (dim) {
    case 64: return std::max(flash::BwdSmemBytes<64>(2), flash::DqSmemBytes<64>(2));
    case 128: return std::max(flash::BwdSmemBytes<128>(2), flash::DqSmemBytes<128>(2));
    case 256: return std::max(flash::BwdSmemBytes<256>(2), flash::DqSmemBytes<256>(2));
  }
  return 0;
}
// Whether the device gives the fast kernels their shared memory. The tiles were sized on H100:
// the d128 and d256 backward (173 and 217 KB) do not fit an A100 (163 KB), nor the d256 forward
// (132 KB) an sm_86/89 GPU (99 KB); there the simple path runs those problems.
bool FastForwardFits(int dim) { return dim > 0 && FastForwardSmem(dim) <= SharedLimit(); }
bool FastBackwardFits(int dim) { return dim > 0 && FastBackwardSmem(dim) <= SharedLimit(); }

// The instances of the wgmma kernels (generate_kernels.py's SM90_DIRECTIONS): the forward has
// 64, 128 and 256, the backward 64 and 128.
bool HasWgmmaInstance(int dim, bool backward) {
  return dim == 64 || dim == 128 || (dim == 256 && !backward);
}

// Whether a THD problem may run the wgmma forward (or backward), which then takes the
// heavy-first tile schedule (schedule.h) from the workspace: THD, no score_mod, a wgmma instance
// of that direction and the wgmma path enabled on the current device. Only these problems get
// the schedule's workspace, so that a forward elsewhere keeps needing none.
bool WantsSchedule(const Problem& p, bool backward) {
  const int dim = FastHeadDim(p);
  return p.thd && !p.score_mod && HasWgmmaInstance(dim, backward) && flash::WgmmaEnabled();
}

// cp.async copies 16-byte pieces of rows: the head dim must be the innermost axis and every row
// start 16-byte aligned.
bool RowsAligned16(const TensorView& t) {
  const size_t element = t.dtype == FUSEDATTN_DTYPE_FLOAT32 ? 4 : 2;
  const int64_t per16 = static_cast<int64_t>(16 / element);
  return t.stride_d == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
         t.stride_b % per16 == 0 && t.stride_h % per16 == 0 && t.stride_s % per16 == 0;
}

// A window at least as wide as both sequences hides nothing: unbounded (keeps device math small).
int64_t NormalizeWindow(int64_t window, const fusedattn_config& c) {
  if (window < 0) return -1;
  return window >= c.max_seqlen_q + c.max_seqlen_kv ? -1 : window;
}

flash::TensorArg Arg(const TensorView& t) {
  flash::TensorArg a;
  a.data = t.data;
  a.stride_b = t.stride_b, a.stride_h = t.stride_h, a.stride_s = t.stride_s;
  a.stride_d = t.stride_d;
  return a;
}

flash::LseArg LseArgOf(const LseView& t, bool packed) {
  flash::LseArg a;
  a.data = static_cast<float*>(t.data);
  a.stride_b = t.stride_b, a.stride_h = t.stride_h, a.stride_s = t.stride_s;
  a.packed = packed;
  return a;
}

flash::BiasArg BiasArgOf(const BiasView& v, const fusedattn_config& c, bool zero_broadcast) {
  flash::BiasArg a;
  a.data = v.data;
  a.dtype = v.dtype;
  a.stride_b = zero_broadcast && c.bias_batch == 1 ? 0 : v.stride_b;
  a.stride_h = zero_broadcast && c.bias_heads == 1 ? 0 : v.stride_h;
  a.stride_q = v.stride_q, a.stride_kv = v.stride_kv;
  return a;
}

// Everything both directions share.
template <typename Tensors>
FlashParams CommonParams(const Problem& problem, const Tensors& t) {
  const auto& c = problem.config;
  FlashParams p;
  p.batch = static_cast<int>(c.batch);
  p.heads_q = static_cast<int>(c.heads_q);
  p.heads_kv = static_cast<int>(c.heads_kv);
  p.group = static_cast<int>(c.heads_q / c.heads_kv);
  p.max_seqlen_q = static_cast<int>(c.max_seqlen_q);
  p.max_seqlen_kv = static_cast<int>(c.max_seqlen_kv);
  p.head_dim_qk = static_cast<int>(c.head_dim_qk);
  p.head_dim_v = static_cast<int>(c.head_dim_v);
  p.tokens_q = t.q.num_tokens;
  p.tokens_kv = t.k.num_tokens;
  p.qkv_dtype = c.qkv_dtype;
  p.o_dtype = c.o_dtype;
  p.padding = problem.padding;
  p.thd = problem.thd;
  p.cu_seqlens_q = t.cu_seqlens_q;
  p.cu_seqlens_kv = t.cu_seqlens_kv;
  p.seq_offsets_q = t.seq_offsets_q;
  p.seq_offsets_kv = t.seq_offsets_kv;
  p.bottom_right = problem.bottom_right;
  p.window_left = NormalizeWindow(problem.window_left, c);
  p.window_right = NormalizeWindow(problem.window_right, c);
  p.scale = static_cast<float>(problem.scale());
  p.softcap = static_cast<float>(c.softcap);
  p.bias_type = c.bias_type;
  if (t.bias.present()) p.bias = BiasArgOf(t.bias, c, true);
  p.alibi_slopes = t.alibi_slopes;
  p.alibi_stride = t.alibi_stride;
  p.softmax_type = c.softmax_type;
  p.sink_logits = t.sink_logits;
  p.sink_stride = t.sink_stride;
  p.dropout = c.dropout > 0.0;
  p.dropout_threshold = DropoutRow::Threshold(c.dropout);
  p.keep_scale = static_cast<float>(1.0 / (1.0 - c.dropout));
  p.dropout_seed = t.dropout_seed;
  p.dropout_offset = t.dropout_offset;
  p.q = Arg(t.q);
  p.k = Arg(t.k);
  p.v = Arg(t.v);
  p.o = Arg(t.o);
  p.lse = LseArgOf(t.lse, t.lse_packed);
  return p;
}

bool DbiasBroadcast(const fusedattn_config& c) {
  return (c.bias_batch == 1 && c.batch > 1) || (c.bias_heads == 1 && c.heads_q > 1);
}

// ------------------------------------------------------------------------------------------------
// Score modifiers: the fast kernels with a graph compiled at run time (jit.h).
// ------------------------------------------------------------------------------------------------

jit::Variant FlexVariant(const Problem& problem, jit::Kernel kernel) {
  jit::Variant v;
  v.kernel = kernel;
  v.dtype = problem.config.qkv_dtype;
  v.head_dim = FastHeadDim(problem);
  v.arch = CurrentDeviceComputeCapability();
  return v;
}

size_t FlexBlockMaskBytes(const Problem& problem, jit::Kernel kernel) {
  const auto& c = problem.config;
  return jit::BlockMaskBytes(*problem.score_mod, FlexVariant(problem, kernel),
                             static_cast<int>(c.batch), static_cast<int>(c.heads_q),
                             static_cast<int>(c.max_seqlen_q), static_cast<int>(c.max_seqlen_kv));
}

// Extents of a score_mod tensor ([batch|1, heads_q|1, max_seqlen_q|1, max_seqlen_kv|1]).
void FlexExtents(const Problem& p, uint32_t axes, int64_t e[4]) {
  const auto& c = p.config;
  e[0] = axes & FUSEDATTN_SCORE_MOD_AXIS_BATCH ? c.batch : 1;
  e[1] = axes & FUSEDATTN_SCORE_MOD_AXIS_HEAD ? c.heads_q : 1;
  e[2] = axes & FUSEDATTN_SCORE_MOD_AXIS_Q ? c.max_seqlen_q : 1;
  e[3] = axes & FUSEDATTN_SCORE_MOD_AXIS_KV ? c.max_seqlen_kv : 1;
}

// What the fast kernels cannot run with a score_mod graph, or Ok.
Status CheckScoreMod(const Problem& p) {
  const auto& c = p.config;
  const flex::ScoreMod& mod = *p.score_mod;
  if (FastHeadDim(p) == 0)
    return NotSupported(
        "score_mod graphs run on flash's tensor-core kernels only: qkv_dtype float16 or "
        "bfloat16 with o_dtype equal and head dims multiples of 8 up to 256, but qkv_dtype = %s, "
        "o_dtype = %s, head_dim_qk = %lld, head_dim_v = %lld (the reference backend runs it)",
        DtypeName(c.qkv_dtype), DtypeName(c.o_dtype), (long long)c.head_dim_qk,
        (long long)c.head_dim_v);
  if (mod.tensors().size() > static_cast<size_t>(flash::kMaxFlexTensors))
    return NotSupported("config.score_mod declares %zu tensors; flash's kernels take at most %d",
                        mod.tensors().size(), flash::kMaxFlexTensors);
  if (c.deterministic && mod.any_requires_grad())
    return NotSupported(
        "config.deterministic = 1 but a score_mod tensor requires grad: flash sums those "
        "gradients with float32 atomics, whose order varies run to run");
  if (c.bias_requires_grad && p.has_tensor_bias() && DbiasBroadcast(c))
    return NotSupported(
        "a broadcast bias (bias_batch = %lld, bias_heads = %lld) with bias_requires_grad next to "
        "a score_mod graph: flash's dbias reduction does not evaluate the graph (give the bias "
        "as a score_mod tensor instead)",
        (long long)c.bias_batch, (long long)c.bias_heads);
  const int cc = CurrentDeviceComputeCapability();
  if (cc < 80)
    return NotSupported("score_mod kernels need compute capability 8.0 or later; this GPU has "
                        "%d.%d",
                        cc / 10, cc % 10);
  const int dim = FastHeadDim(p);
  const size_t need = c.is_training ? std::max(FastForwardSmem(dim), FastBackwardSmem(dim))
                                    : FastForwardSmem(dim);
  if (need > SharedLimit())
    return NotSupported(
        "score_mod graphs run on flash's tensor-core kernels, whose %s at head dim %d takes %zu "
        "bytes of shared memory per block, more than the %zu this GPU gives (the reference "
        "backend runs it)",
        c.is_training ? "forward and backward" : "forward", dim, need, SharedLimit());
  return jit::Available();
}

// The score_mod tensors of a call in the kernels' params.
template <typename Tensors>
void SetFlexTensors(const Tensors& t, FlashParams* p) {
  for (size_t k = 0; k < t.score_mod_tensors.size(); ++k) {
    const AuxTensorView& v = t.score_mod_tensors[k];
    flash::FlexTensorArg& a = p->flex.tensors[k];
    a.data = v.data;
    a.stride_b = v.stride_b, a.stride_h = v.stride_h;
    a.stride_q = v.stride_q, a.stride_kv = v.stride_kv;
  }
}

// Workspace of the backward, carved in this order from one buffer.
struct BwdWorkspace {
  size_t delta = 0, sink_partial = 0, dq_accum = 0, total = 0;
  int dq_accum_dim = 0;
  // score_mod: block masks of the key-block and dQ kernels, float32 gradient sums per tensor.
  size_t block_mask = 0, block_mask_dq = 0;
  size_t block_mask_bytes = 0, block_mask_dq_bytes = 0;
  std::vector<size_t> flex_grad;  // offset per tensor (requires grad)
  // THD on the wgmma kernels: the key tiles' schedule (schedule.h), last.
  size_t schedule = 0;
  bool has_schedule = false;
};

BwdWorkspace PlanBwdWorkspace(const Problem& problem) {
  const auto& c = problem.config;
  const size_t rows = static_cast<size_t>(c.batch * c.heads_q * c.max_seqlen_q);
  BwdWorkspace w;
  w.delta = 0;
  w.total = AlignUp(rows * sizeof(float));
  if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK) {
    w.sink_partial = w.total;
    w.total += AlignUp(rows * sizeof(float));
  }
  const int fast_dim = FastBackwardFits(FastHeadDim(problem)) ? FastHeadDim(problem) : 0;
  if (fast_dim > 0 && !c.deterministic) {
    w.dq_accum = w.total;
    w.dq_accum_dim = fast_dim;
    w.total += AlignUp(rows * static_cast<size_t>(fast_dim) * sizeof(float));
  }
  if (problem.score_mod && fast_dim > 0) {
    w.block_mask = w.total;
    w.block_mask_bytes = FlexBlockMaskBytes(problem, jit::Kernel::kBackward);
    w.total += AlignUp(w.block_mask_bytes);
    if (c.deterministic) {
      w.block_mask_dq = w.total;
      w.block_mask_dq_bytes = FlexBlockMaskBytes(problem, jit::Kernel::kBackwardDq);
      w.total += AlignUp(w.block_mask_dq_bytes);
    }
    for (const flex::TensorDecl& decl : problem.score_mod->tensors()) {
      w.flex_grad.push_back(w.total);
      if (!decl.requires_grad) continue;
      int64_t e[4];
      FlexExtents(problem, decl.axes, e);
      w.total += AlignUp(static_cast<size_t>(e[0] * e[1] * e[2] * e[3]) * sizeof(float));
    }
  }
  if (WantsSchedule(problem, /*backward=*/true) && !c.deterministic) {
    w.schedule = w.total;
    w.has_schedule = true;
    w.total += AlignUp(flash::ScheduleBytes(c.batch));
  }
  return w;
}

// The wgmma forward (fwd_kernel_sm90.cuh) when the build has it, the device is sm_90, the problem
// is plain (no bias, ALiBi, softcap, dropout), the instance is 64, 128 or 256 and TMA can
// describe the tensors (LaunchWgmmaForward checks and reports whether it launched); else the
// mma.sync kernel. FUSEDATTN_FLASH_WGMMA=0 turns the wgmma path off.
template <typename Element>
Status FastForward(int dim, const FlashParams& p, cudaStream_t s) {
#ifdef FUSEDATTN_FLASH_SM90
  if (HasWgmmaInstance(dim, /*backward=*/false) && flash::WgmmaEnabled()) {
    bool launched = false;
    Status status = dim == 64    ? flash::LaunchWgmmaForward<Element, 64>(p, s, &launched)
                    : dim == 128 ? flash::LaunchWgmmaForward<Element, 128>(p, s, &launched)
                                 : flash::LaunchWgmmaForward<Element, 256>(p, s, &launched);
    if (launched || !status.ok()) {
      flash::SetLastForwardUsedWgmma(launched);
      return status;
    }
  }
#endif
  switch (dim) {
    case 64: return flash::LaunchFastForward<Element, 64>(p, s);
    case 128: return flash::LaunchFastForward<Element, 128>(p, s);
    case 256: return flash::LaunchFastForward<Element, 256>(p, s);
  }
  return InternalError("flash: no forward instance for head dim %d", dim);
}

// The key-block kernel of the backward: the wgmma one (bwd_kernel_sm90.cuh) under the forward's
// conditions, plus non-deterministic mode without bias gradients (LaunchWgmmaBackward checks and
// reports whether it launched); else the mma.sync kernel. Both leave dQ in dq_accum (or nothing,
// deterministic) for the same conversion: the wgmma kernel in its tiled order, which it notes in
// p->dq_accum_tiled (dq_accum_layout.h).
template <typename Element>
Status FastBackward(int dim, FlashParams* p, cudaStream_t s) {
#ifdef FUSEDATTN_FLASH_SM90
  if (HasWgmmaInstance(dim, /*backward=*/true) && flash::WgmmaEnabled()) {
    bool launched = false;
    Status status = dim == 64 ? flash::LaunchWgmmaBackward<Element, 64>(*p, s, &launched)
                              : flash::LaunchWgmmaBackward<Element, 128>(*p, s, &launched);
    if (launched || !status.ok()) {
      flash::SetLastBackwardUsedWgmma(launched);
      p->dq_accum_tiled = launched;
      return status;
    }
  }
#endif
  switch (dim) {
    case 64: return flash::LaunchFastBackward<Element, 64>(*p, s);
    case 128: return flash::LaunchFastBackward<Element, 128>(*p, s);
    case 256: return flash::LaunchFastBackward<Element, 256>(*p, s);
  }
  return InternalError("flash: no backward instance for head dim %d", dim);
}

template <typename Element>
Status FastBackwardDq(int dim, const FlashParams& p, cudaStream_t s) {
  switch (dim) {
    case 64: return flash::LaunchFastBackwardDq<Element, 64>(p, s);
    case 128: return flash::LaunchFastBackwardDq<Element, 128>(p, s);
    case 256: return flash::LaunchFastBackwardDq<Element, 256>(p, s);
  }
  return InternalError("flash: no dQ instance for head dim %d", dim);
}

class FlashBackendImpl final : public Backend {
 public:
  fusedattn_backend id() const override { return FUSEDATTN_BACKEND_FLASH; }
  const char* name() const override { return "flash"; }

  Status available() const override {
    if (!HasCudaDevice()) return NotSupported("%s", NoCudaDeviceReason().c_str());
    return flash::ProbeKernelImage();
  }

  Status check(const Problem& p) override {
    const auto& c = p.config;
    if (p.device != Device::kCuda)
      return NotSupported("runs on CUDA tensors only, and config.device is CPU");
    if (p.fp8)
      return NotSupported(
          "FP8 attention (qkv_dtype %s): flash has no FP8 kernels yet (cuDNN and the reference "
          "run it)",
          DtypeName(c.qkv_dtype));
    if (p.paged) {  // only the decode kernel reads pages (decode.h)
      Status fits = flash::DecodeFits(p);
      if (!fits.ok())
        return NotSupported("paged K/V (page_size = %lld) runs on flash's decode kernel only: %s",
                            (long long)c.page_size, fits.message().c_str());
      return Status::Ok();
    }
    if (p.has_score_mod()) FUSEDATTN_RETURN_IF_ERROR(CheckScoreMod(p));
    const size_t need = flash::SimpleSharedBytes(static_cast<int>(c.head_dim_qk),
                                                 static_cast<int>(c.head_dim_v));
    const size_t limit = flash::SimpleSharedLimit();
    if (need > limit)
      return NotSupported(
          "head_dim_qk = %lld with head_dim_v = %lld needs %zu bytes of shared memory per block "
          "in flash's kernels, more than the %zu this GPU gives (the reference backend runs it)",
          (long long)c.head_dim_qk, (long long)c.head_dim_v, need, limit);
    const int64_t longest = std::max(c.max_seqlen_q, c.max_seqlen_kv);
    if ((longest + 3) / 4 * c.heads_q * c.batch > INT_MAX)
      return NotSupported(
          "batch = %lld * heads_q = %lld * max_seqlen = %lld needs more thread blocks than a "
          "CUDA grid holds",
          (long long)c.batch, (long long)c.heads_q, (long long)longest);
    return Status::Ok();
  }

  Status fwd_workspace_size(const Problem& p, size_t* bytes) override {
    // score_mod: the forward's block mask; THD on the wgmma kernel: the query tiles' schedule.
    *bytes = p.score_mod && FastHeadDim(p) > 0
                 ? AlignUp(FlexBlockMaskBytes(p, jit::Kernel::kForward))
                 : 0;
    if (WantsSchedule(p, /*backward=*/false))
      *bytes = AlignUp(flash::ScheduleBytes(p.config.batch));
    // The decode kernel's split partials (decode.h); a contiguous problem may still take the
    // other kernels when its tensors do not suit it, so it keeps their size too.
    if (flash::WantsDecode(p)) *bytes = std::max(*bytes, flash::DecodeWorkspaceBytes(p));
    return Status::Ok();
  }

  fusedattn_cache_stats cache_stats() const override { return jit::CacheStats(); }

  Status bwd_workspace_size(const Problem& p, size_t* bytes) override {
    *bytes = PlanBwdWorkspace(p).total;
    return Status::Ok();
  }

  Status forward(const Problem& problem, const FwdTensors& t, void* workspace,
                 size_t workspace_bytes, void* stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    FlashParams p = CommonParams(problem, t);
    // Paged K/V, and contiguous problems with max_seqlen_q <= 16, run on the decode kernel
    // (decode.h); a contiguous one whose tensors it cannot read (NotSupported, nothing written)
    // takes the kernels below.
    flash::SetLastDecodeSplits(0);
    flash::SetLastForwardUsedWgmma(false);  // also when the decode kernel runs it
    if (flash::WantsDecode(problem)) {
      Status status = flash::RunDecode(problem, t, p, workspace, workspace_bytes, s);
      if (problem.paged || status.code() != FUSEDATTN_ERROR_NOT_SUPPORTED) return status;
    }
    if (WantsSchedule(problem, /*backward=*/false) && workspace != nullptr &&
        workspace_bytes >= flash::ScheduleBytes(problem.config.batch))
      p.schedule_workspace = static_cast<int32_t*>(workspace);
    p.max_logit = t.max_logit;
    p.max_logit_stride = t.max_logit_stride;
    const int dim = FastHeadDim(problem);
    const bool fast = FastForwardFits(dim) && RowsAligned16(t.q) && RowsAligned16(t.k) &&
                      RowsAligned16(t.v);
    if (problem.score_mod && !fast)
      return NotSupported(
          "flash runs score_mod graphs on its tensor-core kernels only, which need q, k and v "
          "rows contiguous (head-dim stride 1) and 16-byte aligned");
    if (p.max_logit) FUSEDATTN_RETURN_IF_ERROR(flash::LaunchFillMaxLogit(p, s));
    if (problem.score_mod) {
      SetFlexTensors(t, &p);
      return jit::Launch(problem.score_mod, FlexVariant(problem, jit::Kernel::kForward), p,
                         workspace, s);
    }
    if (fast) {
      if (problem.config.qkv_dtype == FUSEDATTN_DTYPE_FLOAT16)
        return FastForward<flash::Half>(dim, p, s);
      return FastForward<flash::Bfloat16>(dim, p, s);
    }
    return flash::LaunchSimpleForward(p, s);
  }

  Status backward(const Problem& problem, const BwdTensors& t, void* workspace,
                  size_t workspace_bytes, void* stream) override {
    const auto& c = problem.config;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const BwdWorkspace plan = PlanBwdWorkspace(problem);
    if (plan.total > 0 && (workspace == nullptr || workspace_bytes < plan.total))
      return Status(FUSEDATTN_ERROR_WORKSPACE,
                    Format("flash backward needs %zu bytes of workspace, %zu given", plan.total,
                           workspace_bytes));
    char* base = static_cast<char*>(workspace);
    FlashParams p = CommonParams(problem, t);
    flash::SetLastBackwardUsedWgmma(false);
    p.d_o = Arg(t.d_o);
    p.dq = Arg(t.dq);
    p.dk = Arg(t.dk);
    p.dv = Arg(t.dv);
    p.dsink = t.dsink;
    p.dsink_stride = t.dsink_stride;
    p.deterministic = c.deterministic != 0;
    p.delta = reinterpret_cast<float*>(base + plan.delta);
    if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK)
      p.sink_partial = reinterpret_cast<float*>(base + plan.sink_partial);

    const int dim = FastHeadDim(problem);
    const bool fast = FastBackwardFits(dim) && RowsAligned16(t.q) && RowsAligned16(t.k) &&
                      RowsAligned16(t.v) && RowsAligned16(t.d_o);
    if (problem.score_mod && !fast)
      return NotSupported(
          "flash runs score_mod graphs on its tensor-core kernels only, which need q, k, v and dO "
          "rows contiguous (head-dim stride 1) and 16-byte aligned");
    if (fast && !p.deterministic) {
      p.dq_accum = reinterpret_cast<float*>(base + plan.dq_accum);
      p.dq_accum_dim = plan.dq_accum_dim;
    }
    if (plan.has_schedule) p.schedule_workspace = reinterpret_cast<int32_t*>(base + plan.schedule);

    bool reduce_dbias = false;
    if (t.dbias.present()) {
      p.dbias = BiasArgOf(t.dbias, c, true);
      if (!DbiasBroadcast(c)) {
        p.dbias_mode = flash::kDbiasStore;
      } else if (t.dbias.dtype == FUSEDATTN_DTYPE_FLOAT32 && !p.deterministic) {
        p.dbias_mode = flash::kDbiasAtomic;
      } else {
        reduce_dbias = true;
      }
      if (p.dbias_mode != flash::kDbiasNone) FUSEDATTN_RETURN_IF_ERROR(flash::LaunchZeroDbias(p, s));
    }

    FUSEDATTN_RETURN_IF_ERROR(flash::LaunchBackwardPreprocess(p, s));
    if (p.dsink) FUSEDATTN_RETURN_IF_ERROR(flash::LaunchReduceDsink(p, s));
    if (problem.score_mod) {
      // Gradient sums of the tensors that require grad: zeroed, added by the key-block kernel
      // with float32 atomics (not deterministic; check() refuses deterministic), converted.
      SetFlexTensors(t, &p);
      const auto& decls = problem.score_mod->tensors();
      for (size_t k = 0; k < decls.size(); ++k) {
        if (!decls[k].requires_grad) continue;
        int64_t e[4];
        FlexExtents(problem, decls[k].axes, e);
        flash::FlexTensorArg& g = p.flex.grads[k];
        g.data = base + plan.flex_grad[k];
        g.stride_kv = e[3] > 1 ? 1 : 0;
        g.stride_q = e[2] > 1 ? e[3] : 0;
        g.stride_h = e[1] > 1 ? e[2] * e[3] : 0;
        g.stride_b = e[0] > 1 ? e[1] * e[2] * e[3] : 0;
        FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(const_cast<void*>(g.data), 0,
                                             static_cast<size_t>(e[0] * e[1] * e[2] * e[3]) *
                                                 sizeof(float),
                                             s));
      }
      FUSEDATTN_RETURN_IF_ERROR(jit::Launch(problem.score_mod,
                                            FlexVariant(problem, jit::Kernel::kBackward), p,
                                            base + plan.block_mask, s));
      if (p.deterministic) {
        FUSEDATTN_RETURN_IF_ERROR(jit::Launch(problem.score_mod,
                                              FlexVariant(problem, jit::Kernel::kBackwardDq), p,
                                              base + plan.block_mask_dq, s));
      } else {
        FUSEDATTN_RETURN_IF_ERROR(flash::LaunchConvertDq(p, s));
      }
      for (size_t k = 0; k < decls.size(); ++k) {
        if (!decls[k].requires_grad) continue;
        int64_t e[4];
        FlexExtents(problem, decls[k].axes, e);
        const AuxTensorView& out = t.score_mod_grads[k];
        flash::FlexTensorArg o;
        o.data = out.data;
        o.stride_b = out.stride_b, o.stride_h = out.stride_h;
        o.stride_q = out.stride_q, o.stride_kv = out.stride_kv;
        FUSEDATTN_RETURN_IF_ERROR(flash::LaunchConvertFlexGrad(
            static_cast<const float*>(p.flex.grads[k].data), e, o, out.dtype, s));
      }
      return Status::Ok();
    }
    if (fast) {
      const bool half = c.qkv_dtype == FUSEDATTN_DTYPE_FLOAT16;
      FUSEDATTN_RETURN_IF_ERROR(half ? FastBackward<flash::Half>(dim, &p, s)
                                     : FastBackward<flash::Bfloat16>(dim, &p, s));
      if (p.deterministic) {
        FUSEDATTN_RETURN_IF_ERROR(half ? FastBackwardDq<flash::Half>(dim, p, s)
                                       : FastBackwardDq<flash::Bfloat16>(dim, p, s));
      } else {
        FUSEDATTN_RETURN_IF_ERROR(flash::LaunchConvertDq(p, s));
      }
    } else {
      FUSEDATTN_RETURN_IF_ERROR(flash::LaunchSimpleBackward(p, s));
    }
    if (reduce_dbias) FUSEDATTN_RETURN_IF_ERROR(flash::LaunchReduceDbias(p, s));
    return Status::Ok();
  }
};

}  // namespace

Backend* FlashBackend() {
  static FlashBackendImpl backend;
  return &backend;
}

}  // namespace fusedattn
