// The flash planner (planner.h): every decision of which kernel runs, in one place and in order.
// The rules, fastest path first:
//  0. FP8 problems (qkv e4m3): the Hopper forward's FP8 instance (variant fp8, d128) where
//     Fp8ForwardRefusal takes them (forward only, dense, no mask / causal / windows, head dims up
//     to 128), q, k, v described by TMA; every other FP8 problem is refused, naming why.
//  1. Refusals (check()): CPU tensors, paged K/V neither the decode kernel nor the Hopper
//     forward runs, score_mod graphs the tensor-core kernels cannot compile, head dims whose
//     simple-path shared memory does not fit, grids too large.
//  Paged K/V: at most 16 query rows per sequence (decode) on the decode kernel where it fits;
//     else (chunked prefill) the Hopper forward's paged instances: sm_90 with the sm_90a
//     kernels, instance 64 or 128, plain or softcap-alibi, scale > 0, a page size that is a
//     power of two of at least 16, q and the pools described by TMA; nothing else reads pages.
//  2. score_mod graph: the NVRTC-compiled tensor-core kernels (full variant), which need q, k, v
//     (and dO) rows contiguous and 16-byte aligned; other tensors are refused at run time. The
//     forward runs on the Hopper kernel compiled with the graph (path hopper-score_mod-jit,
//     variant score_mod) where it fits: the Hopper device conditions of 3a, instance 64, 128 or
//     256, no dropout and no bias tensor, ALiBi or softcap in the config (the graph expresses
//     them), q, k, v described by TMA; the plain grid (no THD schedule). The backward stays on
//     the mma.sync score_mod kernels (no Hopper score_mod backward yet).
//  3. Tensor-core instance (float16/bfloat16, head dims multiples of 8 up to 256) whose tiles fit
//     the device's shared memory, with q, k, v (and dO) rows contiguous and 16-byte aligned:
//     a. the Hopper kernels: a build with sm_90a kernels, an sm_90 device, FUSEDATTN_FLASH_WGMMA
//        not 0, instance 64, 128 (or 256, forward), tensors TMA can describe, the plain variant
//        or softcap/ALiBi (variant softcap-alibi; no bias tensor or dropout), and in the forward
//        also a bias tensor with or without softcap (variant bias; no dropout) and dropout with
//        or without softcap/ALiBi (variant dropout; no bias tensor: the backward of a dropout
//        problem is the mma.sync one, which draws the same mask); the forward also
//        needs scale > 0; THD problems take the heavy-first schedule where the workspace holds
//        one (and, forward, the LSE is absent or packed). config.deterministic runs there too:
//        the backward's deterministic instances add dQ in a fixed key order (dQ fixed-order+
//        convert) in place of the mma.sync path's second dQ kernel;
//     b. else the mma.sync kernels.
//  4. Everything else: the simple (SIMT) kernels.
#include "backends/flash/planner.h"

#include <algorithm>
#include <atomic>
#include <climits>

#include "backends/flash/decode.h"
#include "backends/flash/dq_accum_layout.h"
#include "backends/flash/jit.h"
#include "backends/flash/kernels.h"
#include "backends/flash/schedule.h"
#include "backends/flash/sm90.h"
#include "backends/flash/tiles.h"
#include "common/philox.h"
#include "flex/score_mod.h"

namespace fusedattn::flash {

const char* KernelPathName(KernelPath path) {
  switch (path) {
    case KernelPath::kNone: return "none";
    case KernelPath::kHopperWgmma: return "hopper-wgmma";
    case KernelPath::kMmaSync: return "mma.sync";
    case KernelPath::kScoreModJit: return "score_mod-jit";
    case KernelPath::kSimple: return "simple";
    case KernelPath::kDecode: return "decode";
    case KernelPath::kHopperScoreModJit: return "hopper-score_mod-jit";
  }
  return "?";
}
const char* KernelVariantName(KernelVariant variant) {
  switch (variant) {
    case KernelVariant::kPlain: return "plain";
    case KernelVariant::kFull: return "full";
    case KernelVariant::kSoftcapAlibi: return "softcap-alibi";
    case KernelVariant::kBias: return "bias";
    case KernelVariant::kScoreMod: return "score_mod";
    case KernelVariant::kDropout: return "dropout";
    case KernelVariant::kFp8: return "fp8";
  }
  return "?";
}
const char* TileScheduleName(TileSchedule schedule) {
  return schedule == TileSchedule::kThdHeavyFirst ? "thd-heavy-first" : "plain-grid";
}
const char* DqModeName(DqMode mode) {
  switch (mode) {
    case DqMode::kDirect: return "direct";
    case DqMode::kAtomicThenConvert: return "atomic+convert";
    case DqMode::kDeterministic: return "deterministic-kernel";
    case DqMode::kFixedOrderThenConvert: return "fixed-order+convert";
  }
  return "?";
}
const char* DbiasPlanName(DbiasPlan plan) {
  switch (plan) {
    case DbiasPlan::kNone: return "none";
    case DbiasPlan::kStore: return "store";
    case DbiasPlan::kAtomic: return "atomic";
    case DbiasPlan::kReduce: return "reduce";
  }
  return "?";
}

int FastHeadDimFor(int head_dim_qk, int head_dim_v) {
  // cp.async moves 8 elements at a time: both head dims must be multiples of 8.
  if (head_dim_qk % 8 != 0 || head_dim_v % 8 != 0) return 0;
  const int dim = head_dim_qk > head_dim_v ? head_dim_qk : head_dim_v;
  for (int instance : {64, 128, 256})  // the head dims of generate_kernels.py
    if (dim <= instance) return instance;
  return 0;
}

namespace {

constexpr size_t kWorkspaceAlign = 256;
size_t AlignUp(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

bool IsHalfType(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FLOAT16 || dtype == FUSEDATTN_DTYPE_BFLOAT16;
}

// The variant rule of NeedsFullKernel (params.h) on the config: bias (tensor or ALiBi), softcap
// or dropout.
KernelVariant VariantOf(const Problem& p) {
  const auto& c = p.config;
  return NeedsFullKernel(c.bias_type, static_cast<float>(c.softcap), c.dropout > 0.0)
             ? KernelVariant::kFull
             : KernelVariant::kPlain;
}

// The Hopper kernels' variant of a problem in one direction: sm90_tile.h's Sm90ScoresFor on the
// config (the rule the launchers apply to FlashParams), kFull where no Hopper policy runs it.
KernelVariant HopperVariantOf(const Problem& p, bool forward) {
  const auto& c = p.config;
  Sm90Scores scores;
  if (!Sm90ScoresFor(c.bias_type == FUSEDATTN_BIAS_PRE_SCALE ||
                         c.bias_type == FUSEDATTN_BIAS_POST_SCALE,
                     c.bias_type == FUSEDATTN_BIAS_ALIBI, c.softcap > 0.0, c.dropout > 0.0,
                     forward, &scores))
    return KernelVariant::kFull;
  switch (scores) {
    case Sm90Scores::kSoftcapAlibi: return KernelVariant::kSoftcapAlibi;
    case Sm90Scores::kBias: return KernelVariant::kBias;
    case Sm90Scores::kDropout: return KernelVariant::kDropout;
    default: return KernelVariant::kPlain;
  }
}
// The backward's (and the paged forward's, whose instances have no bias policy) and the forward's.
KernelVariant HopperVariantOf(const Problem& p) { return HopperVariantOf(p, /*forward=*/false); }
KernelVariant HopperForwardVariantOf(const Problem& p) {
  return HopperVariantOf(p, /*forward=*/true);
}

// Shared memory of the tensor-core kernels of a padded head dim (float16/bfloat16): the forward
// (both variants), and the backward (key-block and deterministic dQ kernels). The tiles were
// sized on H100: the d128 and d256 backward (173 and 217 KB) do not fit an A100 (163 KB), nor the
// d256 forward (132 KB) an sm_86/89 GPU (99 KB); there the simple path runs those problems.
size_t FastForwardSmem(int dim) {
  switch (dim) {
    case 64: return std::max(FwdSmemBytes<64, false>(2), FwdSmemBytes<64, true>(2));
    case 128: return std::max(FwdSmemBytes<128, false>(2), FwdSmemBytes<128, true>(2));
    case 256: return std::max(FwdSmemBytes<256, false>(2), FwdSmemBytes<256, true>(2));
  }
  return 0;
}
size_t FastBackwardSmem(int dim) {
  switch (dim) {
    case 64: return std::max(BwdSmemBytes<64>(2), DqSmemBytes<64>(2));
    case 128: return std::max(BwdSmemBytes<128>(2), DqSmemBytes<128>(2));
    case 256: return std::max(BwdSmemBytes<256>(2), DqSmemBytes<256>(2));
  }
  return 0;
}

// Whether the Hopper kernels may run on this device and build at all.
bool HopperDevice(const DeviceFacts& d) {
  return d.sm90a_kernels && d.wgmma_allowed && d.compute_capability == 90;
}
// The instances of the Hopper kernels (generate_kernels.py's SM90_DIRECTIONS): the forward has
// 64, 128 and 256, the backward 64 and 128.
bool HopperInstance(int dim, bool backward) {
  return dim == 64 || dim == 128 || (dim == 256 && !backward);
}

// The most query rows per sequence that paged K/V runs on the decode kernel: its limit
// (DecodeFits), for which it is tuned (a GQA group's rows packed into one tile, splits over the
// keys). Longer queries (chunked prefill) take the Hopper forward, whose 128-row query tiles
// read each key tile once per tile of queries.
constexpr int64_t kPagedDecodeMaxRows = 16;

// Why the Hopper kernels do not run on this device / build, or null when they may.
const char* HopperDeviceRefusal(const DeviceFacts& d) {
  if (!d.sm90a_kernels) return "this build has no sm_90a kernels";
  if (d.compute_capability != 90) return "the device is not sm_90";
  if (!d.wgmma_allowed) return "FUSEDATTN_FLASH_WGMMA=0";
  return nullptr;
}

// The Hopper forward's query tiles of the longest sequence (128 rows each).
int64_t HopperForwardQueryTiles(const Problem& p) {
  return (p.config.max_seqlen_q + kSm90ScheduleRowsForward - 1) / kSm90ScheduleRowsForward;
}

// Whether the Hopper forward's grid (one block per query tile, head and sequence) fits a CUDA
// grid's int32 block count: every Hopper forward path asks it.
bool HopperForwardGridFits(const Problem& p) {
  return HopperForwardQueryTiles(p) * p.config.heads_q * p.config.batch <= INT_MAX;
}

// Why the Hopper forward's paged instances cannot run a paged problem (from the config and the
// device; the tensors TMA must describe are asked in PlanForward), or empty when they can.
std::string HopperPagedRefusal(const Problem& p, const DeviceFacts& d) {
  const auto& c = p.config;
  if (const char* device = HopperDeviceRefusal(d)) return Format("hopper kernels: %s", device);
  const int dim = TensorCoreInstance(p);
  if (dim != 64 && dim != 128)
    return Format("the Hopper forward reads paged K/V at instances 64 and 128 (float16/bfloat16, "
                  "o_dtype equal, head dims multiples of 8 up to 128), but qkv_dtype = %s, "
                  "o_dtype = %s, head_dim_qk = %lld, head_dim_v = %lld",
                  DtypeName(c.qkv_dtype), DtypeName(c.o_dtype), (long long)c.head_dim_qk,
                  (long long)c.head_dim_v);
  if (p.score_mod) return "the Hopper forward runs score_mod graphs on contiguous K/V only";
  if (HopperVariantOf(p) == KernelVariant::kFull)
    return "the Hopper forward's paged instances have no bias tensor or dropout (softcap and "
           "ALiBi run there)";
  if (!(p.scale() > 0.0)) return "the Hopper forward takes attn_scale > 0 only";
  if (const char* page = Sm90PagedRefusal(c.page_size))
    return Format("%s, but page_size = %lld", page, (long long)c.page_size);
  if (!HopperForwardGridFits(p))
    return "the Hopper forward needs more blocks than a CUDA grid holds";
  return std::string();
}

// Why the Hopper forward compiled with a score_mod graph (kHopperScoreModJit) cannot run a
// contiguous score_mod problem on this device (from the config; the tensors TMA must describe
// are asked in PlanForward), or empty when it can. Its policy computes Mod(scale q.k): the
// config's own score modifiers (bias tensor, ALiBi, softcap) and dropout stay on the mma.sync
// score_mod kernel, which applies them before the graph.
std::string HopperScoreModRefusal(const Problem& p, int dim, const DeviceFacts& d) {
  const auto& c = p.config;
  if (const char* device = HopperDeviceRefusal(d)) return Format("hopper kernels: %s", device);
  if (!HopperInstance(dim, /*backward=*/false))
    return Format("hopper score_mod forward: instances 64, 128 and 256 only (this is %d)", dim);
  if (c.dropout > 0.0 || c.bias_type != FUSEDATTN_BIAS_NONE || c.softcap > 0.0)
    return "hopper score_mod forward: no dropout, bias tensor, ALiBi or softcap in the config "
           "(the graph can express them)";
  if (!HopperForwardGridFits(p))
    return "hopper score_mod forward: more blocks than a CUDA grid holds";
  return std::string();
}

// Whether paged K/V takes the decode kernel (few query rows per sequence, and it fits).
bool PagedTakesDecode(const Problem& p, const DeviceFacts& d) {
  return p.config.max_seqlen_q <= kPagedDecodeMaxRows && DecodeFits(p, d).ok();
}

// cp.async copies 16-byte pieces of rows: the head dim must be the innermost axis and every row
// start 16-byte aligned.
bool RowsAligned16(const TensorView& t) {
  const size_t element = t.dtype == FUSEDATTN_DTYPE_FLOAT32 ? 4 : 2;
  const int64_t per16 = static_cast<int64_t>(16 / element);
  return t.stride_d == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
         t.stride_b % per16 == 0 && t.stride_h % per16 == 0 && t.stride_s % per16 == 0;
}

// Whether TMA can describe a q/k/v/dO tensor of element_bytes-byte elements (2; the FP8 forward's
// e4m3: 1) as the Hopper launchers encode it (EncodeQkvTensorMap and EncodeFp8TensorMap,
// sm90_host.cpp, ask the same): [batch][heads][rows][cols], THD as one
// batch of tokens; base and walked strides 16-byte multiples below 2^40 bytes; a tile's row
// coordinate (box of at most 256 rows) inside int32.
bool TmaDescribes(const TensorView& t, bool query_side, const Problem& p,
                  int element_bytes = 2) {
  const auto& c = p.config;
  const int64_t rows = query_side ? (p.thd ? t.num_tokens : c.max_seqlen_q)
                                  : (p.thd ? t.num_tokens : c.max_seqlen_kv);
  constexpr int kMaxBoxRows = 256;
  if (rows + kMaxBoxRows >= INT_MAX) return false;
  return TmaDescribesTensor(reinterpret_cast<uintptr_t>(t.data), t.stride_b, t.stride_h,
                            t.stride_s, t.stride_d, rows,
                            query_side ? c.heads_q : c.heads_kv, p.thd ? 1 : c.batch,
                            element_bytes);
}

// TMA over a page pool of paged K/V: [num_pages][heads_kv][page_size][d] (sm90_host.cpp's
// EncodePageTensorMap).
bool TmaDescribesPool(const TensorView& t, const Problem& p, int64_t num_pages) {
  return TmaDescribesTensor(reinterpret_cast<uintptr_t>(t.data), t.stride_b, t.stride_h,
                            t.stride_s, t.stride_d, p.config.page_size, p.config.heads_kv,
                            num_pages);
}

jit::Variant JitVariant(const Problem& p, jit::Kernel kernel, int instance,
                        const DeviceFacts& d) {
  jit::Variant v;
  v.kernel = kernel;
  v.dtype = p.config.qkv_dtype;
  v.head_dim = instance;
  v.arch = d.compute_capability;
  if (kernel == jit::Kernel::kForwardSm90)
    v.keys_per_step = Sm90ForwardKeysPerStep(instance, p.config.max_seqlen_kv);
  return v;
}

size_t BlockMaskBytes(const Problem& p, jit::Kernel kernel, int instance, const DeviceFacts& d) {
  const auto& c = p.config;
  return jit::BlockMaskBytes(*p.score_mod, JitVariant(p, kernel, instance, d),
                             static_cast<int>(c.batch), static_cast<int>(c.heads_q),
                             static_cast<int>(c.max_seqlen_q), static_cast<int>(c.max_seqlen_kv));
}

bool DbiasBroadcast(const fusedattn_config& c) {
  return (c.bias_batch == 1 && c.batch > 1) || (c.bias_heads == 1 && c.heads_q > 1);
}

// Extents of a score_mod tensor ([batch|1, heads_q|1, max_seqlen_q|1, max_seqlen_kv|1]).
void FlexExtents(const Problem& p, uint32_t axes, int64_t e[4]) {
  const auto& c = p.config;
  e[0] = axes & FUSEDATTN_SCORE_MOD_AXIS_BATCH ? c.batch : 1;
  e[1] = axes & FUSEDATTN_SCORE_MOD_AXIS_HEAD ? c.heads_q : 1;
  e[2] = axes & FUSEDATTN_SCORE_MOD_AXIS_Q ? c.max_seqlen_q : 1;
  e[3] = axes & FUSEDATTN_SCORE_MOD_AXIS_KV ? c.max_seqlen_kv : 1;
}

// What the tensor-core kernels cannot run with a score_mod graph, or Ok.
Status CheckScoreMod(const Problem& p, const DeviceFacts& d) {
  const auto& c = p.config;
  const flex::ScoreMod& mod = *p.score_mod;
  const int dim = TensorCoreInstance(p);
  if (dim == 0)
    return NotSupported(
        "score_mod graphs run on flash's tensor-core kernels only: qkv_dtype float16 or "
        "bfloat16 with o_dtype equal and head dims multiples of 8 up to 256, but qkv_dtype = %s, "
        "o_dtype = %s, head_dim_qk = %lld, head_dim_v = %lld (the reference backend runs it)",
        DtypeName(c.qkv_dtype), DtypeName(c.o_dtype), (long long)c.head_dim_qk,
        (long long)c.head_dim_v);
  if (mod.tensors().size() > static_cast<size_t>(kMaxFlexTensors))
    return NotSupported("config.score_mod declares %zu tensors; flash's kernels take at most %d",
                        mod.tensors().size(), kMaxFlexTensors);
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
  const int cc = d.compute_capability;
  if (cc < 80)
    return NotSupported("score_mod kernels need compute capability 8.0 or later; this GPU has "
                        "%d.%d",
                        cc / 10, cc % 10);
  const size_t need = c.is_training ? std::max(FastForwardSmem(dim), FastBackwardSmem(dim))
                                    : FastForwardSmem(dim);
  if (need > d.smem_per_block)
    return NotSupported(
        "score_mod graphs run on flash's tensor-core kernels, whose %s at head dim %d takes %zu "
        "bytes of shared memory per block, more than the %zu this GPU gives (the reference "
        "backend runs it)",
        c.is_training ? "forward and backward" : "forward", dim, need, d.smem_per_block);
  return jit::Available();
}

// Why the tensor-core kernels do not run a problem (for the plan's `why`), or null when they may.
const char* TensorCoreRefusal(const Problem& p, int dim, bool fits) {
  if (dim == 0) {
    const auto& c = p.config;
    if (!IsHalfType(c.qkv_dtype) || c.o_dtype != c.qkv_dtype)
      return "tensor cores: qkv and o float16/bfloat16 of one dtype only";
    return "tensor cores: head dims multiples of 8 up to 256 only";
  }
  if (!fits) return "tensor cores: the instance's tiles need more shared memory than the GPU gives";
  return nullptr;
}

// Sends a plan to the simple kernel (plain variant) when the tensor-core kernels cannot run it
// (TensorCoreRefusal, or rows that are not contiguous and 16-byte aligned: `rows` names the
// tensors whose rows they read), with the reason in its `why`. False: they can, plan unchanged.
template <typename Plan>
bool PlanSimpleWithoutTensorCores(const Problem& p, int dim, bool fits, bool aligned,
                                  const char* rows, Plan* plan) {
  if (const char* refusal = TensorCoreRefusal(p, dim, fits))
    plan->why = refusal;
  else if (!aligned)
    plan->why = Format("tensor cores: %s rows must be contiguous (head-dim stride 1) and 16-byte "
                       "aligned",
                       rows);
  else
    return false;
  plan->path = KernelPath::kSimple;
  plan->variant = KernelVariant::kPlain;
  return true;
}

}  // namespace

bool TmaDescribesTensor(uintptr_t address, int64_t stride_b, int64_t stride_h, int64_t stride_s,
                        int64_t stride_d, int64_t rows, int64_t heads, int64_t batch,
                        int element_bytes) {
  const int64_t kElement = element_bytes;
  constexpr int64_t kStrideLimit = int64_t{1} << 40;
  if (address % 16 != 0 || stride_d != 1) return false;
  if (rows < 1 || rows > (int64_t{1} << 31) - 1 || heads < 1 || batch < 1) return false;
  // Strides of the axes that are walked (size > 1) must be 16-byte multiples, positive and below
  // 2^40 bytes; an axis of size 1 is never stepped.
  auto walkable = [&](int64_t stride, int64_t size) {
    if (size == 1) return true;
    const int64_t bytes = stride * kElement;
    return bytes > 0 && bytes % 16 == 0 && bytes < kStrideLimit;
  };
  return walkable(stride_s, rows) && walkable(stride_h, heads) && walkable(stride_b, batch);
}

int TensorCoreInstance(const Problem& p) {
  const auto& c = p.config;
  if (!IsHalfType(c.qkv_dtype) || c.o_dtype != c.qkv_dtype) return 0;
  return FastHeadDimFor(static_cast<int>(c.head_dim_qk), static_cast<int>(c.head_dim_v));
}

// The instance of the FP8 forward (generate_kernels.py's SM90_FP8_HEAD_DIMS).
constexpr int kFp8Instance = 128;

std::string Fp8ForwardRefusal(const Problem& p, const DeviceFacts& d) {
  const auto& c = p.config;
  // What runs, then why not this problem.
  const char* what =
      "flash's FP8 forward runs on its Hopper kernel (sm_90): qkv e4m3, head dims up to 128 "
      "(multiples of 16), dense BSHD/SBHD/BHSD, no mask, causal (top-left or bottom-right) and "
      "windows, GQA/MQA, the LSE; the FP8 backward: none in flash (cuDNN and the reference run "
      "it)";
  auto refuse = [&](const std::string& why) { return Format("%s; %s", what, why.c_str()); };
  if (c.is_training) return refuse("config.is_training = 1 (the backward is needed)");
  if (const char* device = HopperDeviceRefusal(d)) return refuse(Format("hopper kernels: %s", device));
  if (p.paged) return refuse(Format("paged K/V (page_size = %lld)", (long long)c.page_size));
  if (p.thd) return refuse("THD (packed sequences)");
  if (p.padding) return refuse(Format("padding masks (mask = %s)", MaskName(c.mask)));
  if (p.has_score_mod()) return refuse("a score_mod graph");
  if (c.dropout > 0.0) return refuse(Format("dropout = %g", c.dropout));
  if (c.bias_type != FUSEDATTN_BIAS_NONE)
    return refuse(Format("bias_type = %s", BiasName(c.bias_type)));
  if (c.softcap > 0.0) return refuse(Format("softcap = %g", c.softcap));
  if (c.softmax_type != FUSEDATTN_SOFTMAX_VANILLA)
    return refuse("a softmax other than vanilla (off-by-one, sinks)");
  if (c.head_dim_qk > kFp8Instance || c.head_dim_v > kFp8Instance || c.head_dim_qk % 16 != 0 ||
      c.head_dim_v % 16 != 0)
    return refuse(Format("head_dim_qk = %lld, head_dim_v = %lld", (long long)c.head_dim_qk,
                         (long long)c.head_dim_v));
  if (c.o_dtype != FUSEDATTN_DTYPE_FP8_E4M3 && c.o_dtype != FUSEDATTN_DTYPE_BFLOAT16 &&
      c.o_dtype != FUSEDATTN_DTYPE_FLOAT16 && c.o_dtype != FUSEDATTN_DTYPE_FLOAT32)
    return refuse(Format("o_dtype = %s", DtypeName(c.o_dtype)));
  if (!(p.scale() > 0.0)) return refuse(Format("attn_scale = %g (> 0 only)", p.scale()));
  if (!HopperForwardGridFits(p)) return refuse("more blocks than a CUDA grid holds");
  if (Sm90Fp8ValueKeys(c.max_seqlen_kv) / 128 > 65535 || c.batch * c.heads_kv > INT_MAX)
    return refuse("more V^T pre-pass blocks than a CUDA grid holds");
  return std::string();
}

Status PlanCheck(const Problem& p, const DeviceFacts& d) {
  const auto& c = p.config;
  if (p.device != Device::kCuda)
    return NotSupported("runs on CUDA tensors only, and config.device is CPU");
  if (p.has_dropout_positions())
    return NotSupported(
        "dropout positions (context parallelism: config.dropout_batch_offset, dropout_heads, "
        "dropout_head_offset, dropout_rows, dropout_row_offset, dropout_key_offset): not yet on "
        "flash's kernels; the reference runs them");
  if (p.fp8) {
    const std::string refusal = Fp8ForwardRefusal(p, d);
    if (!refusal.empty()) return NotSupported("%s", refusal.c_str());
    return Status::Ok();
  }
  if (p.paged) {  // the decode kernel (decode.h) and the Hopper forward's paged instances
    if (PagedTakesDecode(p, d)) return Status::Ok();
    const std::string hopper = HopperPagedRefusal(p, d);
    if (hopper.empty()) return Status::Ok();
    // (kPagedDecodeMaxRows is DecodeFits's own limit: it says why the decode kernel does not.)
    return NotSupported(
        "paged K/V (page_size = %lld) runs on flash's decode kernel or its Hopper forward: %s; %s",
        (long long)c.page_size, DecodeFits(p, d).message().c_str(), hopper.c_str());
  }
  if (p.has_score_mod()) FUSEDATTN_RETURN_IF_ERROR(CheckScoreMod(p, d));
  const size_t need =
      SimpleSharedBytes(static_cast<int>(c.head_dim_qk), static_cast<int>(c.head_dim_v));
  if (need > d.smem_per_block)
    return NotSupported(
        "head_dim_qk = %lld with head_dim_v = %lld needs %zu bytes of shared memory per block "
        "in flash's kernels, more than the %zu this GPU gives (the reference backend runs it)",
        (long long)c.head_dim_qk, (long long)c.head_dim_v, need, d.smem_per_block);
  const int64_t longest = std::max(c.max_seqlen_q, c.max_seqlen_kv);
  if ((longest + 3) / 4 * c.heads_q * c.batch > INT_MAX)
    return NotSupported(
        "batch = %lld * heads_q = %lld * max_seqlen = %lld needs more thread blocks than a "
        "CUDA grid holds",
        (long long)c.batch, (long long)c.heads_q, (long long)longest);
  return Status::Ok();
}

// The THD schedule's workspace is reserved for every THD problem the Hopper kernels of that
// direction may run on this device (one of its instances, no score_mod), so that a forward
// elsewhere keeps needing none.
static bool ReservesSchedule(const Problem& p, const DeviceFacts& d, bool backward) {
  return p.thd && !p.score_mod && HopperInstance(TensorCoreInstance(p), backward) &&
         HopperDevice(d);
}

// Whether a deterministic problem may run the Hopper backward on this device: one of its
// instances, a variant it has (plain, softcap-alibi), no score_mod. Its workspace then holds the
// dQ accumulator and the order flags of the deterministic instances (the tensors may still send
// the call to the mma.sync kernels, which need neither).
static bool ReservesHopperDeterministic(const Problem& p, const DeviceFacts& d, int fast_dim) {
  return p.config.deterministic && !p.score_mod && fast_dim > 0 &&
         HopperInstance(fast_dim, /*backward=*/true) && HopperDevice(d) &&
         HopperVariantOf(p) != KernelVariant::kFull;
}

FwdWorkspaceLayout PlanFwdWorkspace(const Problem& p, const DeviceFacts& d) {
  FwdWorkspaceLayout w;
  if (p.fp8) {  // V^T for the FP8 forward (the only flash kernel of FP8 problems)
    const auto& c = p.config;
    w.fp8_values = 0;
    w.fp8_values_bytes =
        static_cast<size_t>(Sm90Fp8ValueBytes(c.batch, c.heads_kv, c.max_seqlen_kv));
    w.total = AlignUp(w.fp8_values_bytes);
    return w;
  }
  const int dim = TensorCoreInstance(p);
  if (p.score_mod && dim > 0) {
    // The block mask of either score_mod forward (the tensors decide between them): the mma.sync
    // kernel's 128 x 64 tiles, the Hopper kernel's 128 x keys_per_step where it may run.
    w.block_mask_bytes = BlockMaskBytes(p, jit::Kernel::kForward, dim, d);
    if (HopperScoreModRefusal(p, dim, d).empty())
      w.block_mask_bytes =
          std::max(w.block_mask_bytes, BlockMaskBytes(p, jit::Kernel::kForwardSm90, dim, d));
    w.total = AlignUp(w.block_mask_bytes);
  }
  if (ReservesSchedule(p, d, /*backward=*/false)) {
    w.schedule = w.total;
    w.has_schedule = true;
    w.total += AlignUp(ScheduleBytes(p.config.batch));
  }
  // The decode kernel's split partials; a contiguous problem may still take the other kernels
  // when its tensors do not suit the decode kernel, so it keeps their size too.
  if (p.device == Device::kCuda && DecodeFits(p, d).ok()) {
    w.decode_bytes = DecodeWorkspaceBytes(p, d);
    w.total = std::max(w.total, w.decode_bytes);
  }
  return w;
}

BwdWorkspaceLayout PlanBwdWorkspace(const Problem& p, const DeviceFacts& d) {
  const auto& c = p.config;
  const size_t rows = static_cast<size_t>(c.batch * c.heads_q * c.max_seqlen_q);
  BwdWorkspaceLayout w;
  w.delta = 0;
  w.total = AlignUp(rows * sizeof(float));
  if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK) {
    w.sink_partial = w.total;
    w.total += AlignUp(rows * sizeof(float));
  }
  const int instance = TensorCoreInstance(p);
  const int fast_dim =
      instance > 0 && FastBackwardSmem(instance) <= d.smem_per_block ? instance : 0;
  const bool hopper_deterministic = ReservesHopperDeterministic(p, d, fast_dim);
  if (fast_dim > 0 && (!c.deterministic || hopper_deterministic)) {
    w.dq_accum = w.total;
    w.dq_accum_dim = fast_dim;
    w.total += AlignUp(rows * static_cast<size_t>(fast_dim) * sizeof(float));
  }
  if (hopper_deterministic) {
    w.dq_order = w.total;
    w.dq_order_bytes =
        static_cast<size_t>(DqOrderInts(c.batch, c.heads_q, c.max_seqlen_q)) * sizeof(int32_t);
    w.total += AlignUp(w.dq_order_bytes);
  }
  if (p.score_mod && fast_dim > 0) {
    w.block_mask = w.total;
    w.block_mask_bytes = BlockMaskBytes(p, jit::Kernel::kBackward, fast_dim, d);
    w.total += AlignUp(w.block_mask_bytes);
    if (c.deterministic) {
      w.block_mask_dq = w.total;
      w.block_mask_dq_bytes = BlockMaskBytes(p, jit::Kernel::kBackwardDq, fast_dim, d);
      w.total += AlignUp(w.block_mask_dq_bytes);
    }
    for (const flex::TensorDecl& decl : p.score_mod->tensors()) {
      w.flex_grad.push_back(w.total);
      if (!decl.requires_grad) continue;
      int64_t e[4];
      FlexExtents(p, decl.axes, e);
      w.total += AlignUp(static_cast<size_t>(e[0] * e[1] * e[2] * e[3]) * sizeof(float));
    }
  }
  if (ReservesSchedule(p, d, /*backward=*/true)) {
    w.schedule = w.total;
    w.has_schedule = true;
    w.total += AlignUp(ScheduleBytes(c.batch));
  }
  return w;
}

// The Hopper forward's block order (contiguous and paged K/V): THD takes the heavy-first
// schedule where the workspace holds one, and where no row outside the sequences is written
// anyway (a [batch, heads, max_seqlen_q] LSE gets -inf past len_q from the plain grid only).
TileSchedule HopperForwardSchedule(const Problem& p, const FwdTensors& t,
                                   const FwdWorkspaceLayout& w) {
  if (p.thd && w.has_schedule && (!t.lse.present() || t.lse_packed) && p.config.batch >= 1 &&
      HopperForwardQueryTiles(p) + 1 <= kScheduleMaxBins)
    return TileSchedule::kThdHeavyFirst;
  return TileSchedule::kPlainGrid;
}

ForwardPlan PlanForward(const Problem& p, const FwdTensors& t, const DeviceFacts& d) {
  const auto& c = p.config;
  ForwardPlan plan;
  plan.status = PlanCheck(p, d);
  if (!plan.status.ok()) return plan;
  plan.workspace = PlanFwdWorkspace(p, d);
  plan.variant = VariantOf(p);
  if (p.fp8) {  // PlanCheck: Fp8ForwardRefusal accepted it
    // q and k by TMA (1-byte elements), v by the pre-pass's 16-byte loads (the same conditions).
    if (!TmaDescribes(t.q, true, p, 1) || !TmaDescribes(t.k, false, p, 1) ||
        !TmaDescribes(t.v, false, p, 1)) {
      plan.status = NotSupported(
          "flash's FP8 forward reads q and k by TMA and v with 16-byte loads: the head dim "
          "contiguous (stride 1), base pointers and strides 16-byte aligned");
      return plan;
    }
    plan.path = KernelPath::kHopperWgmma;
    plan.instance = kFp8Instance;
    plan.variant = KernelVariant::kFp8;
    plan.keys_per_step = 128;
    return plan;
  }
  const int dim = TensorCoreInstance(p);
  const bool fits = dim > 0 && FastForwardSmem(dim) <= d.smem_per_block;
  const bool aligned = RowsAligned16(t.q) && RowsAligned16(t.k) && RowsAligned16(t.v);
  // Paged K/V with at most kPagedDecodeMaxRows query rows per sequence, and contiguous problems
  // with max_seqlen_q <= 16 that it fits: the decode kernel, which reads each kv head's keys
  // once for its whole GQA group and splits long sequences over the GPU. It reads q, k, v rows
  // with 16-byte copies.
  const bool decode_kernel = p.paged ? PagedTakesDecode(p, d) : WantsDecode(p, d);
  if (decode_kernel && aligned) {
    const DecodePlan decode = PlanDecode(p, d);
    plan.path = KernelPath::kDecode;
    plan.instance = decode.head_dim;
    plan.decode_splits = decode.splits;
    plan.decode_keys_per_split = decode.tiles_per_split * DecodeTile<128>::kBlockN;
    plan.decode_blocks = static_cast<int>(decode.blocks);
    plan.decode_blocks_per_sm = decode.blocks_per_sm;
    return plan;
  }
  // Other paged K/V (PlanCheck: the decode kernel or the Hopper forward's paged instances take
  // it): chunked prefill on the Hopper forward, its producer loading key tiles from the pages.
  if (p.paged) {
    if (!HopperPagedRefusal(p, d).empty()) {  // the decode kernel's, on tensors it cannot read
      plan.status = NotSupported(
          "flash's decode kernel reads q, k and v rows with 16-byte copies: they must be "
          "contiguous along the head dim (stride 1) and 16-byte aligned (pointer and strides)");
      return plan;
    }
    if (!TmaDescribes(t.q, true, p) || !TmaDescribesPool(t.k, p, t.num_pages) ||
        !TmaDescribesPool(t.v, p, t.num_pages)) {
      plan.status = NotSupported(
          "paged K/V on flash's Hopper forward: TMA cannot describe q or the k/v page pools "
          "(head dim contiguous, 16-byte aligned base and strides)");
      return plan;
    }
    plan.path = KernelPath::kHopperWgmma;
    plan.instance = dim;
    plan.variant = HopperVariantOf(p);
    plan.paged = true;
    plan.keys_per_step = Sm90ForwardKeysPerStep(dim, c.max_seqlen_kv);
    plan.schedule = HopperForwardSchedule(p, t, plan.workspace);
    return plan;
  }
  if (p.score_mod) {
    if (!(fits && aligned)) {
      plan.status = NotSupported(
          "flash runs score_mod graphs on its tensor-core kernels only, which need q, k and v "
          "rows contiguous (head-dim stride 1) and 16-byte aligned");
      return plan;
    }
    plan.path = KernelPath::kScoreModJit;
    plan.instance = dim;
    plan.variant = KernelVariant::kFull;
    const std::string hopper = HopperScoreModRefusal(p, dim, d);
    if (!hopper.empty()) {
      plan.why = hopper;
    } else if (!TmaDescribes(t.q, true, p) || !TmaDescribes(t.k, false, p) ||
               !TmaDescribes(t.v, false, p)) {
      plan.why =
          "hopper kernels: TMA cannot describe q, k or v (16-byte aligned base and strides)";
    } else {
      plan.path = KernelPath::kHopperScoreModJit;
      plan.variant = KernelVariant::kScoreMod;
      plan.keys_per_step = Sm90ForwardKeysPerStep(dim, c.max_seqlen_kv);
    }
    return plan;
  }
  if (PlanSimpleWithoutTensorCores(p, dim, fits, aligned, "q, k, v", &plan)) return plan;
  plan.instance = dim;
  plan.path = KernelPath::kMmaSync;
  if (const char* device = HopperDeviceRefusal(d)) {
    plan.why = Format("hopper kernels: %s", device);
  } else if (!HopperInstance(dim, /*backward=*/false)) {
    plan.why = Format("hopper forward: instances 64, 128 and 256 only (this is %d)", dim);
  } else if (HopperForwardVariantOf(p) == KernelVariant::kFull) {  // a bias tensor with dropout
    plan.why = "hopper forward: no bias tensor with dropout (dropout runs there alone or with "
               "softcap and ALiBi, bias tensors without dropout)";
  } else if (!(p.scale() > 0.0)) {
    plan.why = "hopper forward: attn_scale > 0 only";
  } else if (!TmaDescribes(t.q, true, p) || !TmaDescribes(t.k, false, p) ||
             !TmaDescribes(t.v, false, p)) {
    plan.why = "hopper kernels: TMA cannot describe q, k or v (16-byte aligned base and strides)";
  } else if (!HopperForwardGridFits(p)) {
    plan.why = "hopper forward: more blocks than a CUDA grid holds";
  } else {
    plan.path = KernelPath::kHopperWgmma;
    plan.variant = HopperForwardVariantOf(p);
    plan.keys_per_step = Sm90ForwardKeysPerStep(dim, c.max_seqlen_kv);
    plan.schedule = HopperForwardSchedule(p, t, plan.workspace);
  }
  return plan;
}

BackwardPlan PlanBackward(const Problem& p, const BwdTensors& t, const DeviceFacts& d) {
  const auto& c = p.config;
  BackwardPlan plan;
  Problem training = p;
  training.config.is_training = 1;
  plan.status = PlanCheck(training, d);
  if (!plan.status.ok()) return plan;
  plan.workspace = PlanBwdWorkspace(p, d);
  plan.variant = VariantOf(p);
  if (t.dbias.present()) {
    if (!DbiasBroadcast(c))
      plan.dbias = DbiasPlan::kStore;
    else if (t.dbias.dtype == FUSEDATTN_DTYPE_FLOAT32 && !c.deterministic)
      plan.dbias = DbiasPlan::kAtomic;
    else
      plan.dbias = DbiasPlan::kReduce;
  }
  const int dim = TensorCoreInstance(p);
  const bool fits = dim > 0 && FastBackwardSmem(dim) <= d.smem_per_block;
  const bool aligned = RowsAligned16(t.q) && RowsAligned16(t.k) && RowsAligned16(t.v) &&
                       RowsAligned16(t.d_o);
  const DqMode fast_dq = c.deterministic ? DqMode::kDeterministic : DqMode::kAtomicThenConvert;
  if (p.score_mod) {
    if (!(fits && aligned)) {
      plan.status = NotSupported(
          "flash runs score_mod graphs on its tensor-core kernels only, which need q, k, v and dO "
          "rows contiguous (head-dim stride 1) and 16-byte aligned");
      return plan;
    }
    plan.path = KernelPath::kScoreModJit;
    plan.instance = dim;
    plan.variant = KernelVariant::kFull;
    plan.dq = fast_dq;
    if (HopperDevice(d))
      plan.why = "hopper backward: no score_mod graphs (the forward runs them there)";
    return plan;
  }
  if (PlanSimpleWithoutTensorCores(p, dim, fits, aligned, "q, k, v, dO", &plan)) {
    plan.dq = DqMode::kDirect;  // the simple kernels write dQ
    return plan;
  }
  plan.instance = dim;
  plan.path = KernelPath::kMmaSync;
  plan.dq = fast_dq;
  const int n_tiles = static_cast<int>((c.max_seqlen_kv + kSm90ScheduleRowsBackward - 1) /
                                       kSm90ScheduleRowsBackward);
  if (const char* device = HopperDeviceRefusal(d)) {
    plan.why = Format("hopper kernels: %s", device);
  } else if (!HopperInstance(dim, /*backward=*/true)) {
    plan.why = Format("hopper backward: instances 64 and 128 only (this is %d)", dim);
  } else if (HopperVariantOf(p) == KernelVariant::kFull) {
    // Training with dropout: the Hopper forward (its dropout variant) and this mma.sync backward,
    // which applies the same mask (fusedattn.h's Philox numbering, in both kernels).
    plan.why = HopperForwardVariantOf(p) == KernelVariant::kDropout
                   ? "hopper backward: no dropout (the Hopper forward runs it; this backward "
                     "draws the same mask)"
                   : "hopper backward: no bias tensor or dropout (softcap and ALiBi run there)";
  } else if (c.deterministic && plan.workspace.dq_order_bytes == 0) {
    plan.why = "hopper backward: deterministic mode needs the dQ accumulator and order flags "
               "in the workspace, which this problem's plan has not";
  } else if (!t.lse.present()) {
    plan.why = "hopper backward: needs the forward's LSE";
  } else if (!TmaDescribes(t.q, true, p) || !TmaDescribes(t.d_o, true, p) ||
             !TmaDescribes(t.k, false, p) || !TmaDescribes(t.v, false, p)) {
    plan.why =
        "hopper kernels: TMA cannot describe q, dO, k or v (16-byte aligned base and strides)";
  } else if (int64_t{n_tiles} * c.heads_kv * c.batch > INT_MAX) {
    plan.why = "hopper backward: more blocks than a CUDA grid holds";
  } else {
    plan.path = KernelPath::kHopperWgmma;
    plan.variant = HopperVariantOf(p);
    // Deterministic: the kernel's own instances add dQ in a fixed order of the key blocks.
    plan.dq = c.deterministic ? DqMode::kFixedOrderThenConvert : DqMode::kAtomicThenConvert;
    // THD: the heavy-first schedule of the key tiles. The plain grid's blocks past a sequence's
    // keys write nothing there, so leaving them out changes no output.
    if (p.thd && plan.workspace.has_schedule && c.batch >= 1 && n_tiles + 1 <= kScheduleMaxBins)
      plan.schedule = TileSchedule::kThdHeavyFirst;
  }
  return plan;
}

// ------------------------------------------------------------------------------------------------
// Dense tensors
// ------------------------------------------------------------------------------------------------

namespace {

TensorView Dense(fusedattn_format format, int64_t batch, int64_t seqlen, int64_t heads,
                 int64_t dim, fusedattn_dtype dtype) {
  TensorView v;
  v.dtype = dtype;
  v.stride_d = 1;
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD:
      v.stride_h = dim, v.stride_s = heads * dim, v.stride_b = seqlen * heads * dim;
      break;
    case FUSEDATTN_FORMAT_SBHD:
      v.stride_h = dim, v.stride_b = heads * dim, v.stride_s = batch * heads * dim;
      break;
    case FUSEDATTN_FORMAT_BHSD:
      v.stride_s = dim, v.stride_h = seqlen * dim, v.stride_b = heads * seqlen * dim;
      break;
    default:  // THD: tokens of every sequence back to back
      v.stride_h = dim, v.stride_s = heads * dim, v.stride_b = 0;
      break;
  }
  v.num_tokens = batch * seqlen;
  return v;
}

// The LSE: [tokens, heads] packed for THD (as varlen callers give it), else [batch, heads, sq].
LseView DenseLse(const Problem& p, bool* packed) {
  const auto& c = p.config;
  LseView l;
  l.dtype = FUSEDATTN_DTYPE_FLOAT32;
  *packed = p.thd;
  if (p.thd) {
    l.stride_h = 1, l.stride_s = c.heads_q, l.stride_b = 0;
  } else {
    l.stride_s = 1, l.stride_h = c.max_seqlen_q, l.stride_b = c.heads_q * c.max_seqlen_q;
  }
  l.num_tokens = c.batch * c.max_seqlen_q;
  return l;
}

// Present-looking views need a non-null pointer; this one is never read through.
void* const kPlaceholder = reinterpret_cast<void*>(uintptr_t{1} << 12);

}  // namespace

FwdTensors DenseFwdTensors(const Problem& p) {
  const auto& c = p.config;
  FwdTensors t;
  t.q = Dense(c.q_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_qk, c.qkv_dtype);
  t.k = Dense(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk, c.qkv_dtype);
  t.v = Dense(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_v, c.qkv_dtype);
  if (p.paged) {  // pools of the pages every sequence's max_seqlen_kv keys need
    t.num_pages = c.batch * ((c.max_seqlen_kv + c.page_size - 1) / c.page_size);
    t.k = Dense(c.kv_format, t.num_pages, c.page_size, c.heads_kv, c.head_dim_qk, c.qkv_dtype);
    t.v = Dense(c.kv_format, t.num_pages, c.page_size, c.heads_kv, c.head_dim_v, c.qkv_dtype);
  }
  t.o = Dense(c.o_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_v, c.o_dtype);
  if (p.needs_lse()) {
    t.lse = DenseLse(p, &t.lse_packed);
    t.lse.data = kPlaceholder;
  }
  return t;
}

BwdTensors DenseBwdTensors(const Problem& p) {
  const auto& c = p.config;
  BwdTensors t;
  t.q = Dense(c.q_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_qk, c.qkv_dtype);
  t.k = Dense(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk, c.qkv_dtype);
  t.v = Dense(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_v, c.qkv_dtype);
  t.o = Dense(c.o_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_v, c.o_dtype);
  t.d_o = Dense(c.do_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_v, c.o_dtype);
  t.dq = Dense(c.dqkv_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_qk, c.qkv_dtype);
  t.dk = Dense(c.dqkv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk, c.qkv_dtype);
  t.dv = Dense(c.dqkv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_v, c.qkv_dtype);
  t.lse = DenseLse(p, &t.lse_packed);
  t.lse.data = kPlaceholder;
  if (c.bias_requires_grad && p.has_tensor_bias()) {
    t.dbias.data = kPlaceholder;
    t.dbias.dtype = c.qkv_dtype;  // (a float32 broadcast dbias takes the atomic plan)
  }
  return t;
}

// ------------------------------------------------------------------------------------------------
// Text
// ------------------------------------------------------------------------------------------------

namespace {

std::string KernelText(KernelPath path, int instance, KernelVariant variant,
                       TileSchedule schedule) {
  std::string s = KernelPathName(path);
  if (instance > 0) s += Format(" d%d", instance);
  if (path != KernelPath::kSimple) s += Format(" %s", KernelVariantName(variant));
  if (schedule != TileSchedule::kPlainGrid) s += Format(", %s schedule", TileScheduleName(schedule));
  return s;
}

}  // namespace

std::string DescribeForwardPlan(const ForwardPlan& plan) {
  if (!plan.status.ok()) return "forward: refused: " + plan.status.message();
  std::string s = "forward: " + KernelText(plan.path, plan.instance, plan.variant, plan.schedule);
  if (plan.path == KernelPath::kDecode)
    s += Format(", %d splits of %d keys, %d blocks (%d per SM)", plan.decode_splits,
                plan.decode_keys_per_split, plan.decode_blocks, plan.decode_blocks_per_sm);
  if (plan.path == KernelPath::kHopperWgmma || plan.path == KernelPath::kHopperScoreModJit)
    s += Format(", %d keys per step", plan.keys_per_step);
  if (plan.paged) s += ", paged K/V";
  s += Format(", workspace %zu B", plan.workspace.total);
  if (!plan.why.empty()) s += " (" + plan.why + ")";
  return s;
}

std::string DescribeBackwardPlan(const BackwardPlan& plan) {
  if (!plan.status.ok()) return "backward: refused: " + plan.status.message();
  std::string s = "backward: " + KernelText(plan.path, plan.instance, plan.variant, plan.schedule);
  s += Format(", dQ %s", DqModeName(plan.dq));
  if (plan.dbias != DbiasPlan::kNone) s += Format(", dbias %s", DbiasPlanName(plan.dbias));
  s += Format(", workspace %zu B", plan.workspace.total);
  if (!plan.why.empty()) s += " (" + plan.why + ")";
  return s;
}

}  // namespace fusedattn::flash
