// The flash backend: our own fused attention kernels on CUDA tensors, for every feature of
// fusedattn.h.
//
// Which kernel runs a call is the planner's decision (planner.h): the Hopper wgmma/TMA kernels,
// the mma.sync tensor-core kernels (fwd_kernel.cuh, bwd_kernel.cuh, one instance per padded head
// dim under instances/), the NVRTC-compiled score_mod kernels (jit.h), the simple SIMT kernels
// (simple_kernels.cu), or, for max_seqlen_q <= 16 against paged or contiguous K/V, the decode
// kernel (decode.h, decode_kernel.cuh: split-KV with a combine); paged K/V with more query rows
// (chunked prefill) runs on the Hopper forward's paged instances. With the variant, the THD
// schedule and the workspace layout. check(), the
// workspace sizes, forward() and backward() execute that plan; note() prints it for explain.
//
// Backward: a preprocess computes D = rowsum(dO * O); the fast kernel is parallel over key blocks
// (dK, dV in registers, dQ added in float32 by atomics into a workspace, then converted). With
// config.deterministic, dQ comes from a second kernel parallel over query blocks that walks the
// keys in a fixed order instead, and nothing is added atomically; the Hopper key-block kernel
// keeps its dQ workspace there and adds to it in a fixed order of the key blocks instead
// (bwd_kernel_sm90.cuh; dQ fixed-order+convert). dbias is stored directly when it
// is not broadcast; a broadcast float32 dbias is added atomically (non-deterministic mode), any
// other broadcast dbias is summed by a kernel in a fixed order. dsink is reduced in a fixed order.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include <cstring>
#include <mutex>

#include "backends/flash/decode.h"
#include "backends/flash/jit.h"
#include "backends/flash/kernels.h"
#include "backends/flash/planner.h"
#include "backends/flash/sm90.h"
#include "common/cuda_util.h"
#include "common/philox.h"
#include "flex/score_mod.h"
#include "select/backend.h"

namespace fusedattn {

namespace {

using flash::FlashParams;
namespace jit = flash::jit;

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

// Extents of a score_mod tensor ([batch|1, heads_q|1, max_seqlen_q|1, max_seqlen_kv|1]).
void FlexExtents(const Problem& p, uint32_t axes, int64_t e[4]) {
  const auto& c = p.config;
  e[0] = axes & FUSEDATTN_SCORE_MOD_AXIS_BATCH ? c.batch : 1;
  e[1] = axes & FUSEDATTN_SCORE_MOD_AXIS_HEAD ? c.heads_q : 1;
  e[2] = axes & FUSEDATTN_SCORE_MOD_AXIS_Q ? c.max_seqlen_q : 1;
  e[3] = axes & FUSEDATTN_SCORE_MOD_AXIS_KV ? c.max_seqlen_kv : 1;
}

jit::Variant JitVariant(const Problem& problem, jit::Kernel kernel, int instance,
                        const flash::DeviceFacts& device) {
  jit::Variant v;
  v.kernel = kernel;
  v.dtype = problem.config.qkv_dtype;
  v.head_dim = instance;
  v.arch = device.compute_capability;
  if (kernel == jit::Kernel::kForwardSm90)  // the tile the planner printed
    v.keys_per_step = flash::Sm90ForwardKeysPerStep(instance, problem.config.max_seqlen_kv);
  return v;
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

// A paged forward's page table, lengths and pool size in the kernels' params (params.h's
// PagedKvArg), which the decode kernel and the Hopper forward's paged instances both read. The
// pool's page count fits an int: validation (problem.cpp, CheckPagePool) refuses pools of more
// than INT32_MAX pages, whose entries (int32) could not address them.
void SetPagedKv(const Problem& problem, const FwdTensors& t, FlashParams* p) {
  p->paged.page_table = t.page_table;
  p->paged.page_table_stride = t.page_table_stride;
  p->paged.seqlens_kv = t.seqlens_kv;
  p->paged.page_size = static_cast<int>(problem.config.page_size);
  p->paged.num_pages = static_cast<int>(t.num_pages);
}

// The Hopper kernels of a plan. The planner chose them from the same facts the launchers check,
// so a launcher that declines (*launched = false) means the two disagree: an internal error, never
// a silent fall-through to another kernel.
#ifdef FUSEDATTN_FLASH_SM90
template <typename Element, flash::Sm90Scores kScores>
Status HopperForwardOf(int dim, bool paged, const FlashParams& p, cudaStream_t s,
                       bool* launched) {
  if (paged) {  // the paged instances: plain and softcap-alibi, d64 and d128 (generate_kernels.py)
    if constexpr (kScores == flash::Sm90Scores::kPlain ||
                  kScores == flash::Sm90Scores::kSoftcapAlibi) {
      switch (dim) {
        case 64: return flash::LaunchWgmmaForward<Element, 64, kScores, true>(p, s, launched);
        case 128: return flash::LaunchWgmmaForward<Element, 128, kScores, true>(p, s, launched);
      }
    }
    return InternalError("flash: no paged Hopper forward instance of this variant at head dim %d",
                         dim);
  }
  switch (dim) {
    case 64: return flash::LaunchWgmmaForward<Element, 64, kScores>(p, s, launched);
    case 128: return flash::LaunchWgmmaForward<Element, 128, kScores>(p, s, launched);
    case 256: return flash::LaunchWgmmaForward<Element, 256, kScores>(p, s, launched);
  }
  return InternalError("flash: no Hopper forward instance for head dim %d", dim);
}
#endif

// The FP8 forward (variant kFp8): the scaling factors and amax outputs of the call, V^T in the
// workspace (the plan's layout), the instance of the plan.
Status HopperForwardFp8(const flash::ForwardPlan& plan, const FwdTensors& t, char* workspace,
                        FlashParams p, cudaStream_t s) {
#ifdef FUSEDATTN_FLASH_SM90
  p.fp8.descale_q = t.fp8.descale_q;
  p.fp8.descale_k = t.fp8.descale_k;
  p.fp8.descale_v = t.fp8.descale_v;
  p.fp8.descale_s = t.fp8.descale_s;
  p.fp8.scale_s = t.fp8.scale_s;
  p.fp8.scale_o = t.fp8.scale_o;
  p.fp8.amax_s = t.fp8.amax_s;
  p.fp8.amax_o = t.fp8.amax_o;
  p.fp8.value_t = reinterpret_cast<unsigned char*>(workspace + plan.workspace.fp8_values);
  p.fp8.value_keys = flash::Sm90Fp8ValueKeys(p.max_seqlen_kv);
  bool launched = false;
  Status status = plan.instance == 128 ? flash::LaunchWgmmaForwardFp8<128>(p, s, &launched)
                                       : InternalError("flash: no FP8 forward instance for head "
                                                       "dim %d",
                                                       plan.instance);
  if (status.ok() && !launched)
    return InternalError("flash: the planner chose the FP8 forward (d%d) but its launcher "
                         "declined the call (planner.cpp's Fp8ForwardRefusal and "
                         "LaunchWgmmaForwardFp8 disagree)",
                         plan.instance);
  return status;
#else
  (void)plan, (void)t, (void)workspace, (void)p, (void)s;
  return InternalError("flash: the planner chose the FP8 forward in a build without it");
#endif
}

// paged: the plan's paged instances (p.paged set).
template <typename Element>
Status HopperForward(int dim, flash::KernelVariant variant, bool paged, const FlashParams& p,
                     cudaStream_t s) {
#ifdef FUSEDATTN_FLASH_SM90
  bool launched = false;
  Status status = Status::Ok();
  switch (variant) {
    case flash::KernelVariant::kPlain:
      status = HopperForwardOf<Element, flash::Sm90Scores::kPlain>(dim, paged, p, s, &launched);
      break;
    case flash::KernelVariant::kSoftcapAlibi:
      status =
          HopperForwardOf<Element, flash::Sm90Scores::kSoftcapAlibi>(dim, paged, p, s, &launched);
      break;
    case flash::KernelVariant::kBias:
      status = HopperForwardOf<Element, flash::Sm90Scores::kBias>(dim, paged, p, s, &launched);
      break;
    case flash::KernelVariant::kDropout:
      status = HopperForwardOf<Element, flash::Sm90Scores::kDropout>(dim, paged, p, s, &launched);
      break;
    default:
      return InternalError("flash: no Hopper forward of the %s variant",
                           flash::KernelVariantName(variant));
  }
  if (status.ok() && !launched)
    return InternalError("flash: the planner chose the Hopper forward (d%d %s%s) but its "
                         "launcher declined the call (planner.cpp and LaunchWgmmaForward "
                         "disagree)",
                         dim, flash::KernelVariantName(variant), paged ? ", paged K/V" : "");
  return status;
#else
  return InternalError("flash: the planner chose the Hopper forward in a build without it");
#endif
}

#ifdef FUSEDATTN_FLASH_SM90
template <typename Element, flash::Sm90Scores kScores>
Status HopperBackwardOf(int dim, const FlashParams& p, cudaStream_t s, bool* launched) {
  switch (dim) {
    case 64:
      return p.deterministic
                 ? flash::LaunchWgmmaBackward<Element, 64, kScores, true>(p, s, launched)
                 : flash::LaunchWgmmaBackward<Element, 64, kScores, false>(p, s, launched);
    case 128:
      return p.deterministic
                 ? flash::LaunchWgmmaBackward<Element, 128, kScores, true>(p, s, launched)
                 : flash::LaunchWgmmaBackward<Element, 128, kScores, false>(p, s, launched);
  }
  return InternalError("flash: no Hopper backward instance for head dim %d", dim);
}
#endif

template <typename Element>
Status HopperBackward(int dim, flash::KernelVariant variant, const FlashParams& p,
                      cudaStream_t s) {
#ifdef FUSEDATTN_FLASH_SM90
  bool launched = false;
  Status status = Status::Ok();
  switch (variant) {
    case flash::KernelVariant::kPlain:
      status = HopperBackwardOf<Element, flash::Sm90Scores::kPlain>(dim, p, s, &launched);
      break;
    case flash::KernelVariant::kSoftcapAlibi:
      status = HopperBackwardOf<Element, flash::Sm90Scores::kSoftcapAlibi>(dim, p, s, &launched);
      break;
    default:
      return InternalError("flash: no Hopper backward of the %s variant",
                           flash::KernelVariantName(variant));
  }
  if (status.ok() && !launched)
    return InternalError("flash: the planner chose the Hopper backward (d%d %s) but its launcher "
                         "declined the call (planner.cpp and LaunchWgmmaBackward disagree)",
                         dim, flash::KernelVariantName(variant));
  return status;
#else
  return InternalError("flash: the planner chose the Hopper backward in a build without it");
#endif
}

template <typename Element>
Status MmaSyncForward(int dim, const FlashParams& p, cudaStream_t s) {
  switch (dim) {
    case 64: return flash::LaunchFastForward<Element, 64>(p, s);
    case 128: return flash::LaunchFastForward<Element, 128>(p, s);
    case 256: return flash::LaunchFastForward<Element, 256>(p, s);
  }
  return InternalError("flash: no forward instance for head dim %d", dim);
}

// The key-block kernel of the backward; leaves dQ in dq_accum (or nothing, deterministic).
template <typename Element>
Status MmaSyncBackward(int dim, const FlashParams& p, cudaStream_t s) {
  switch (dim) {
    case 64: return flash::LaunchFastBackward<Element, 64>(p, s);
    case 128: return flash::LaunchFastBackward<Element, 128>(p, s);
    case 256: return flash::LaunchFastBackward<Element, 256>(p, s);
  }
  return InternalError("flash: no backward instance for head dim %d", dim);
}

template <typename Element>
Status MmaSyncBackwardDq(int dim, const FlashParams& p, cudaStream_t s) {
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
    return flash::PlanCheck(p, p.device == Device::kCuda ? flash::CurrentDeviceFacts()
                                                         : flash::DeviceFacts());
  }

  Status fwd_workspace_size(const Problem& p, size_t* bytes) override {
    *bytes = flash::PlanFwdWorkspace(p, flash::CurrentDeviceFacts()).total;
    return Status::Ok();
  }

  Status bwd_workspace_size(const Problem& p, size_t* bytes) override {
    *bytes = flash::PlanBwdWorkspace(p, flash::CurrentDeviceFacts()).total;
    return Status::Ok();
  }

  fusedattn_cache_stats cache_stats() const override { return jit::CacheStats(); }

  // The plans for contiguous tensors in the problem's formats (explain, the CLI).
  std::string note(const Problem& problem) override {
    const flash::DeviceFacts device = flash::CurrentDeviceFacts();
    std::string text =
        "plan for contiguous tensors: " +
        flash::DescribeForwardPlan(
            flash::PlanForward(problem, flash::DenseFwdTensors(problem), device));
    if (problem.config.is_training)
      text += "; " + flash::DescribeBackwardPlan(flash::PlanBackward(
                         problem, flash::DenseBwdTensors(problem), device));
    return text;
  }

  Status forward(const Problem& problem, const FwdTensors& t, void* workspace,
                 size_t workspace_bytes, void* stream) override {
    const flash::DeviceFacts device = flash::CurrentDeviceFacts();
    const flash::ForwardPlan plan = flash::PlanForward(problem, t, device);
    FUSEDATTN_RETURN_IF_ERROR(plan.status);
    if (plan.workspace.total > 0 && (workspace == nullptr || workspace_bytes < plan.workspace.total))
      return Status(FUSEDATTN_ERROR_WORKSPACE,
                    Format("flash forward needs %zu bytes of workspace, %zu given",
                           plan.workspace.total, workspace_bytes));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    char* base = static_cast<char*>(workspace);
    FlashParams p = CommonParams(problem, t);
    if (plan.schedule == flash::TileSchedule::kThdHeavyFirst)
      p.schedule_workspace = reinterpret_cast<int32_t*>(base + plan.workspace.schedule);
    p.max_logit = t.max_logit;
    p.max_logit_stride = t.max_logit_stride;
    if (p.max_logit && plan.path != flash::KernelPath::kDecode)
      FUSEDATTN_RETURN_IF_ERROR(flash::LaunchFillMaxLogit(p, s));
    if (problem.paged) SetPagedKv(problem, t, &p);
    const bool half = problem.config.qkv_dtype == FUSEDATTN_DTYPE_FLOAT16;
    switch (plan.path) {
      case flash::KernelPath::kDecode:
        // max_logit is filled by RunDecode itself.
        return flash::RunDecode(problem, t, p, device, workspace, workspace_bytes, s);
      case flash::KernelPath::kScoreModJit:
        SetFlexTensors(t, &p);
        return jit::Launch(problem.score_mod,
                           JitVariant(problem, jit::Kernel::kForward, plan.instance, device),
                           p, base + plan.workspace.block_mask, s);
      case flash::KernelPath::kHopperScoreModJit:
        // The Hopper forward compiled with the graph (jit.h, Kernel::kForwardSm90): its launch
        // encodes the TMA maps; the plain grid (the plan reserves no THD schedule for it).
        SetFlexTensors(t, &p);
        return jit::Launch(problem.score_mod,
                           JitVariant(problem, jit::Kernel::kForwardSm90, plan.instance, device),
                           p, base + plan.workspace.block_mask, s);
      case flash::KernelPath::kHopperWgmma:
        if (plan.variant == flash::KernelVariant::kFp8)
          return HopperForwardFp8(plan, t, base, p, s);
        return half ? HopperForward<flash::Half>(plan.instance, plan.variant, plan.paged, p, s)
                    : HopperForward<flash::Bfloat16>(plan.instance, plan.variant, plan.paged, p,
                                                     s);
      case flash::KernelPath::kMmaSync:
        return half ? MmaSyncForward<flash::Half>(plan.instance, p, s)
                    : MmaSyncForward<flash::Bfloat16>(plan.instance, p, s);
      case flash::KernelPath::kSimple: return flash::LaunchSimpleForward(p, s);
      case flash::KernelPath::kNone: break;
    }
    return InternalError("flash: a forward plan without a kernel");
  }

  Status backward(const Problem& problem, const BwdTensors& t, void* workspace,
                  size_t workspace_bytes, void* stream) override {
    const auto& c = problem.config;
    const flash::DeviceFacts device = flash::CurrentDeviceFacts();
    const flash::BackwardPlan plan = flash::PlanBackward(problem, t, device);
    FUSEDATTN_RETURN_IF_ERROR(plan.status);
    const flash::BwdWorkspaceLayout& w = plan.workspace;
    if (w.total > 0 && (workspace == nullptr || workspace_bytes < w.total))
      return Status(FUSEDATTN_ERROR_WORKSPACE,
                    Format("flash backward needs %zu bytes of workspace, %zu given", w.total,
                           workspace_bytes));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    char* base = static_cast<char*>(workspace);
    FlashParams p = CommonParams(problem, t);
    p.d_o = Arg(t.d_o);
    p.dq = Arg(t.dq);
    p.dk = Arg(t.dk);
    p.dv = Arg(t.dv);
    p.dsink = t.dsink;
    p.dsink_stride = t.dsink_stride;
    p.deterministic = c.deterministic != 0;
    p.delta = reinterpret_cast<float*>(base + w.delta);
    if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK)
      p.sink_partial = reinterpret_cast<float*>(base + w.sink_partial);
    if (plan.dq == flash::DqMode::kAtomicThenConvert ||
        plan.dq == flash::DqMode::kFixedOrderThenConvert) {
      p.dq_accum = reinterpret_cast<float*>(base + w.dq_accum);
      p.dq_accum_dim = w.dq_accum_dim;
    }
    if (plan.dq == flash::DqMode::kFixedOrderThenConvert)
      p.dq_order = reinterpret_cast<int32_t*>(base + w.dq_order);
    if (plan.schedule == flash::TileSchedule::kThdHeavyFirst)
      p.schedule_workspace = reinterpret_cast<int32_t*>(base + w.schedule);

    if (plan.dbias != flash::DbiasPlan::kNone) {
      p.dbias = BiasArgOf(t.dbias, c, true);
      if (plan.dbias == flash::DbiasPlan::kStore) p.dbias_mode = flash::kDbiasStore;
      if (plan.dbias == flash::DbiasPlan::kAtomic) p.dbias_mode = flash::kDbiasAtomic;
      if (p.dbias_mode != flash::kDbiasNone) FUSEDATTN_RETURN_IF_ERROR(flash::LaunchZeroDbias(p, s));
    }

    FUSEDATTN_RETURN_IF_ERROR(flash::LaunchBackwardPreprocess(p, s));
    if (p.dsink) FUSEDATTN_RETURN_IF_ERROR(flash::LaunchReduceDsink(p, s));
    const bool half = c.qkv_dtype == FUSEDATTN_DTYPE_FLOAT16;
    switch (plan.path) {
      case flash::KernelPath::kScoreModJit: {
        // Gradient sums of the tensors that require grad: zeroed, added by the key-block kernel
        // with float32 atomics (not deterministic; check() refuses deterministic), converted.
        SetFlexTensors(t, &p);
        const auto& decls = problem.score_mod->tensors();
        for (size_t k = 0; k < decls.size(); ++k) {
          if (!decls[k].requires_grad) continue;
          int64_t e[4];
          FlexExtents(problem, decls[k].axes, e);
          flash::FlexTensorArg& g = p.flex.grads[k];
          g.data = base + w.flex_grad[k];
          g.stride_kv = e[3] > 1 ? 1 : 0;
          g.stride_q = e[2] > 1 ? e[3] : 0;
          g.stride_h = e[1] > 1 ? e[2] * e[3] : 0;
          g.stride_b = e[0] > 1 ? e[1] * e[2] * e[3] : 0;
          FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(const_cast<void*>(g.data), 0,
                                               static_cast<size_t>(e[0] * e[1] * e[2] * e[3]) *
                                                   sizeof(float),
                                               s));
        }
        FUSEDATTN_RETURN_IF_ERROR(
            jit::Launch(problem.score_mod,
                        JitVariant(problem, jit::Kernel::kBackward, plan.instance, device), p,
                        base + w.block_mask, s));
        if (plan.dq == flash::DqMode::kDeterministic) {
          FUSEDATTN_RETURN_IF_ERROR(
              jit::Launch(problem.score_mod,
                          JitVariant(problem, jit::Kernel::kBackwardDq, plan.instance, device), p,
                          base + w.block_mask_dq, s));
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
      case flash::KernelPath::kHopperWgmma:
        FUSEDATTN_RETURN_IF_ERROR(
            half ? HopperBackward<flash::Half>(plan.instance, plan.variant, p, s)
                 : HopperBackward<flash::Bfloat16>(plan.instance, plan.variant, p, s));
        p.dq_accum_tiled = true;  // the kernel's tiled order of dq_accum (dq_accum_layout.h)
        break;
      case flash::KernelPath::kMmaSync:
        FUSEDATTN_RETURN_IF_ERROR(half ? MmaSyncBackward<flash::Half>(plan.instance, p, s)
                                       : MmaSyncBackward<flash::Bfloat16>(plan.instance, p, s));
        break;
      case flash::KernelPath::kSimple:
        FUSEDATTN_RETURN_IF_ERROR(flash::LaunchSimpleBackward(p, s));
        break;
      case flash::KernelPath::kDecode:
      case flash::KernelPath::kHopperScoreModJit:
      case flash::KernelPath::kNone:
        return InternalError("flash: a backward plan without a backward kernel");
    }
    if (plan.dq == flash::DqMode::kDeterministic) {
      FUSEDATTN_RETURN_IF_ERROR(half ? MmaSyncBackwardDq<flash::Half>(plan.instance, p, s)
                                     : MmaSyncBackwardDq<flash::Bfloat16>(plan.instance, p, s));
    } else if (plan.dq == flash::DqMode::kAtomicThenConvert ||
               plan.dq == flash::DqMode::kFixedOrderThenConvert) {
      FUSEDATTN_RETURN_IF_ERROR(flash::LaunchConvertDq(p, s));
    }
    if (plan.dbias == flash::DbiasPlan::kReduce)
      FUSEDATTN_RETURN_IF_ERROR(flash::LaunchReduceDbias(p, s));
    return Status::Ok();
  }
};

}  // namespace

namespace flash {

DeviceFacts CurrentDeviceFacts() {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> known[kMaxDevices];
  static DeviceFacts facts[kMaxDevices];
  static std::mutex mutex;
  DeviceFacts f;
  f.sm90a_kernels = WgmmaCompiled();
  f.wgmma_allowed = WgmmaAllowedByEnvironment();
  const int device = CurrentCudaDevice();
  if (device < 0) return f;
  if (device < kMaxDevices && known[device].load(std::memory_order_acquire)) return facts[device];
  f.compute_capability = CurrentDeviceComputeCapability();
  // SMs, shared memory per SM and reserved per block (0 where the device does not say).
  const cudaDeviceAttr attrs[3] = {cudaDevAttrMultiProcessorCount,
                                   cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                   cudaDevAttrReservedSharedMemoryPerBlock};
  int value[3] = {0, 0, 0};
  for (int k = 0; k < 3; ++k)
    if (cudaDeviceGetAttribute(&value[k], attrs[k], device) != cudaSuccess) {
      cudaGetLastError();
      value[k] = 0;
    }
  f.sm_count = value[0];
  f.smem_per_sm = static_cast<size_t>(value[1]);
  f.reserved_smem_per_block = static_cast<size_t>(value[2]);
  f.smem_per_block = SimpleSharedLimit();
  if (device < kMaxDevices) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!known[device].load(std::memory_order_relaxed)) {
      facts[device] = f;
      known[device].store(true, std::memory_order_release);
    }
  }
  return f;
}

Status PlanForwardCall(const fusedattn_config& config, const fusedattn_fwd_args& args,
                       ForwardPlan* plan) {
  Problem p;
  FUSEDATTN_RETURN_IF_ERROR(MakeProblem(&config, HasCudaDevice(), &p));
  FwdTensors t;
  FUSEDATTN_RETURN_IF_ERROR(MakeFwdTensors(p, &args, &t));
  *plan = PlanForward(p, t, CurrentDeviceFacts());
  return Status::Ok();
}

Status PlanBackwardCall(const fusedattn_config& config, const fusedattn_bwd_args& args,
                        BackwardPlan* plan) {
  Problem p;
  FUSEDATTN_RETURN_IF_ERROR(MakeProblem(&config, HasCudaDevice(), &p));
  BwdTensors t;
  FUSEDATTN_RETURN_IF_ERROR(MakeBwdTensors(p, &args, &t));
  *plan = PlanBackward(p, t, CurrentDeviceFacts());
  return Status::Ok();
}

}  // namespace flash

Backend* FlashBackend() {
  static FlashBackendImpl backend;
  return &backend;
}

}  // namespace fusedattn
