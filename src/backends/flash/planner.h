// The flash planner: from the problem, the tensors' layout and the device, which kernel runs a
// forward or a backward — path, instance, variant, schedule and workspace layout — or why flash
// cannot run it. Pure C++ (no CUDA call): check(), the workspace sizes, forward() and backward()
// all execute this one decision, explain prints it (Backend::note), and tests/cpu/flash_plan_test.cpp
// specifies it on the CPU. The device enters only as DeviceFacts, also for the decode path's fit
// and split count (decode.h: DecodeFits, PlanDecode).
//
// Tensors enter as views (pointer value and strides, nothing is read through them). check(),
// the workspace sizes and explain plan with DenseTensors(): the layouts fusedattn.h's formats give
// contiguous tensors, with 256-byte aligned (here: null) base pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "fusedattn/fusedattn.h"
#include "problem/problem.h"

namespace fusedattn::flash {

// The kernel families of the folder, fastest first.
enum class KernelPath : int {
  kNone = 0,     // refused: the plan's status says why
  kHopperWgmma,  // fwd_kernel_sm90.cuh / bwd_kernel_sm90.cuh: wgmma + TMA, sm_90a builds on sm_90
  kMmaSync,      // fwd_kernel.cuh / bwd_kernel.cuh: mma.sync tensor cores, instances/
  kScoreModJit,  // fwd_kernel.cuh / bwd_kernel.cuh compiled by NVRTC with a score_mod graph (jit.h)
  kSimple,       // simple_kernels.cu: SIMT, any dtype, head dim and stride
  kDecode,       // decode_kernel.cuh (decode.h): max_seqlen_q <= 16, paged or contiguous K/V,
                 // split over the keys with a combine; forward only
  kHopperScoreModJit,  // fwd_kernel_sm90.cuh compiled by NVRTC with a score_mod graph (jit.h,
                       // Kernel::kForwardSm90): the forward of score_mod problems on sm_90
};
const char* KernelPathName(KernelPath path);

// The plain kernel keeps the registers that bias, ALiBi, softcap and dropout need in the full one
// (mma.sync, score_mod-jit). The Hopper forward and backward have the plain variant and
// softcap-alibi (softcap and/or ALiBi, sm90.h's Sm90Scores); the Hopper forward also bias (a
// pre- or post-scale bias tensor, softcap or not) and dropout (with softcap and/or ALiBi or
// neither; no bias tensor). kScoreMod: the Hopper forward's score_mod policy
// (Sm90Scores::kScoreMod, path kHopperScoreModJit).
enum class KernelVariant : int {
  kPlain = 0,
  kFull = 1,
  kSoftcapAlibi = 2,
  kBias = 3,
  kScoreMod = 4,
  kDropout = 5,
  kFp8 = 6,  // the Hopper forward's FP8 (e4m3) instance (fusedattn.h "FP8 attention")
};
const char* KernelVariantName(KernelVariant variant);

// The order of a kernel's blocks: one per (tile, head, sequence) of the longest sequence, or the
// THD sequences heaviest first from a schedule in the workspace (schedule.h).
enum class TileSchedule : int { kPlainGrid = 0, kThdHeavyFirst = 1 };
const char* TileScheduleName(TileSchedule schedule);

// How the backward produces dQ.
enum class DqMode : int {
  kDirect = 0,         // the simple kernels write dQ
  kAtomicThenConvert,  // float32 atomics into the workspace, then LaunchConvertDq
  kDeterministic,      // a second kernel per query tile in a fixed key order (config.deterministic)
  kFixedOrderThenConvert,  // the Hopper key-block kernel adds to the workspace in a fixed key
                           // order (config.deterministic), then LaunchConvertDq
};
const char* DqModeName(DqMode mode);

// How the backward writes dbias.
enum class DbiasPlan : int {
  kNone = 0,  // no bias gradient
  kStore,     // not broadcast: each element stored once
  kAtomic,    // broadcast float32 dbias, non-deterministic: float32 atomics
  kReduce,    // broadcast otherwise: summed over the broadcast axes by LaunchReduceDbias
};
const char* DbiasPlanName(DbiasPlan plan);

// What the plan reads of the device and the build.
struct DeviceFacts {
  int compute_capability = 0;       // major * 10 + minor; 0: no device
  int sm_count = 0;                 // (for the decode path's split count)
  size_t smem_per_block = 48 * 1024;  // opt-in shared memory per block
  // Shared memory per SM and what the driver reserves per block: how many decode blocks share
  // an SM (the decode path's split count).
  size_t smem_per_sm = 0, reserved_smem_per_block = 0;
  bool sm90a_kernels = false;       // this build has the Hopper kernels (CUDA arch 90a)
  bool wgmma_allowed = true;        // FUSEDATTN_FLASH_WGMMA is not 0 (read once per process)
};
// The current device's facts (queried once per device) and this build's (flash_backend.cpp: the
// planner itself calls no CUDA function).
DeviceFacts CurrentDeviceFacts();

// Workspace of a forward (0 bytes for most problems). The decode kernel's split partials start at
// 0 as well: only one path runs a call.
struct FwdWorkspaceLayout {
  size_t total = 0;
  size_t decode_bytes = 0;                      // decode kernel: partials of its splits
  size_t block_mask = 0, block_mask_bytes = 0;  // score_mod: the forward's block mask
  size_t schedule = 0;                          // THD on the Hopper kernel: its schedule
  bool has_schedule = false;
  // FP8 (variant kFp8): V^T written by the pre-pass, sm90_tile.h's Sm90Fp8ValueBytes.
  size_t fp8_values = 0, fp8_values_bytes = 0;
};

// Workspace of a backward, carved in this order from one buffer.
struct BwdWorkspaceLayout {
  size_t delta = 0, sink_partial = 0, dq_accum = 0, total = 0;
  int dq_accum_dim = 0;  // 0: no dQ accumulator
  // Deterministic problems the Hopper backward may run: its dQ order flags (int32,
  // dq_accum_layout.h's DqOrderInts), right after dq_accum; 0 bytes otherwise.
  size_t dq_order = 0, dq_order_bytes = 0;
  // score_mod: block masks of the key-block and dQ kernels, float32 gradient sums per tensor.
  size_t block_mask = 0, block_mask_dq = 0;
  size_t block_mask_bytes = 0, block_mask_dq_bytes = 0;
  std::vector<size_t> flex_grad;  // offset per tensor (requires grad)
  // THD on the Hopper kernels: the key tiles' schedule (schedule.h), last.
  size_t schedule = 0;
  bool has_schedule = false;
};

struct ForwardPlan {
  Status status;  // NotSupported with the reason when flash cannot run it; then path is kNone
  KernelPath path = KernelPath::kNone;
  int instance = 0;  // padded head dim of the tensor-core kernels (64, 128, 256); 0: simple
  KernelVariant variant = KernelVariant::kPlain;
  TileSchedule schedule = TileSchedule::kPlainGrid;
  int decode_splits = 0;  // kDecode: splits over the keys (decode.h's DecodePlan)
  int decode_keys_per_split = 0, decode_blocks = 0, decode_blocks_per_sm = 0;  // (the same)
  // kHopperWgmma and kHopperScoreModJit: its tile's keys per step (sm90.h, Sm90ForwardKeysPerStep)
  int keys_per_step = 0;
  // kHopperWgmma: the paged instances (K/V from a paged cache: chunked prefill; paged problems
  // with at most 16 query rows per sequence take kDecode where it fits).
  bool paged = false;
  FwdWorkspaceLayout workspace;
  std::string why;  // why no faster path runs it (empty when the Hopper path does, or none could)
};

struct BackwardPlan {
  Status status;
  KernelPath path = KernelPath::kNone;  // of the key-block kernel (dK, dV, and dQ by atomics)
  int instance = 0;
  KernelVariant variant = KernelVariant::kPlain;
  TileSchedule schedule = TileSchedule::kPlainGrid;
  DqMode dq = DqMode::kDirect;
  DbiasPlan dbias = DbiasPlan::kNone;
  BwdWorkspaceLayout workspace;
  std::string why;
};

// The padded head dim of the tensor-core kernels for a problem, or 0 (simple path only):
// float16/bfloat16 with o_dtype equal, head dims multiples of 8 up to 256.
int TensorCoreInstance(const Problem& problem);
// The instance for head dims alone: the padded head dims the tensor-core kernels are compiled for
// (HEAD_DIMS in generate_kernels.py, which writes one file per instance under instances/), or 0.
int FastHeadDimFor(int head_dim_qk, int head_dim_v);

// Whether TMA can describe a tensor of 16-bit (or 8-bit) elements seen as [batch][heads][rows][cols] with
// these element strides (16-byte aligned base, head dim innermost, walked strides 16-byte
// multiples below 2^40 bytes, sizes in range). EncodeQkvTensorMap asks the same before encoding.
// element_bytes: 2, or 1 for FP8 tensors.
bool TmaDescribesTensor(uintptr_t address, int64_t stride_b, int64_t stride_h, int64_t stride_s,
                        int64_t stride_d, int64_t rows, int64_t heads, int64_t batch,
                        int element_bytes = 2);

// Why flash's FP8 forward cannot run an FP8 problem (config.qkv_dtype FP8_E4M3) on this device,
// or empty when it can (the tensors TMA must describe are asked in PlanForward). PlanCheck refuses
// an FP8 problem with this reason; the backward is never flash's (training problems included).
std::string Fp8ForwardRefusal(const Problem& problem, const DeviceFacts& device);

// Whether flash runs the problem at all on this device (the forward, and the backward when
// config.is_training): what check() returns. Equal to the status of PlanForward (and
// PlanBackward) with DenseTensors.
Status PlanCheck(const Problem& problem, const DeviceFacts& device);

ForwardPlan PlanForward(const Problem& problem, const FwdTensors& tensors,
                        const DeviceFacts& device);
BackwardPlan PlanBackward(const Problem& problem, const BwdTensors& tensors,
                          const DeviceFacts& device);

// The workspace layouts depend on the problem and the device only (selection asks for the size
// before it sees tensors); a plan uses them as they are.
FwdWorkspaceLayout PlanFwdWorkspace(const Problem& problem, const DeviceFacts& device);
BwdWorkspaceLayout PlanBwdWorkspace(const Problem& problem, const DeviceFacts& device);

// Contiguous tensors in the problem's formats (null data: 256-byte aligned, as allocators give).
FwdTensors DenseFwdTensors(const Problem& problem);
BwdTensors DenseBwdTensors(const Problem& problem);

// One line per direction for explain and the CLI, e.g. "forward: hopper-wgmma d128 plain,
// thd-heavy-first schedule, workspace 200 B".
std::string DescribeForwardPlan(const ForwardPlan& plan);
std::string DescribeBackwardPlan(const BackwardPlan& plan);

// The plans fusedattn_fwd / fusedattn_bwd make for these arguments on the current device (for
// tests and benchmarks: the plan is what runs; flash_backend.cpp). Errors: the config or the
// arguments are invalid.
Status PlanForwardCall(const fusedattn_config& config, const fusedattn_fwd_args& args,
                       ForwardPlan* plan);
Status PlanBackwardCall(const fusedattn_config& config, const fusedattn_bwd_args& args,
                        BackwardPlan* plan);

}  // namespace fusedattn::flash
