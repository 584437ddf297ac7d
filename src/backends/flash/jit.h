// Score modifiers on the fast kernels, compiled at run time (issue 6): a finalized graph becomes
// a policy struct (the hook of fwd_kernel.cuh / bwd_kernel.cuh, see NoScoreMod in
// device_common.cuh), the same kernel sources are instantiated with it by NVRTC for the device's
// architecture, and the CUBIN is loaded with the runtime's cudaLibraryLoadData (no -lcuda).
// On sm_90 the forward may instead be the Hopper kernel (fwd_kernel_sm90.cuh, wgmma + TMA) with
// the policy as its Mod argument and the score policy Sm90Scores::kScoreMod (Kernel::kForwardSm90,
// compiled for sm_90a; its TMA tensor maps are encoded at launch as sm90_host.cpp encodes them for
// the ahead-of-time instances); the planner (planner.h) says which forward runs.
//
// One module per (graph, kernel, dtype, padded head dim, architecture), cached in a bounded LRU
// (flex/cache.h) keyed by the graph's structure plus those words. A module holds the kernel and,
// when the graph has a mask, the block-mask kernel (one byte per tile: does the mask_mod show any
// element of it), with which the kernels skip tiles the mask_mod hides.
//
// Codegen and compilation need no device (the CPU tests compile every op to CUBIN); loading and
// launching do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/flash/params.h"
#include "common/status.h"
#include "flex/score_mod.h"

namespace fusedattn::flash::jit {

enum class Kernel : int { kForward = 0, kBackward = 1, kBackwardDq = 2, kForwardSm90 = 3 };
const char* KernelName(Kernel kernel);

struct Variant {
  Kernel kernel = Kernel::kForward;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_BFLOAT16;  // float16 or bfloat16
  int head_dim = 128;                                // padded: 64, 128 or 256
  int arch = 90;                                     // compute capability; 90 -> sm_90a
  // kForwardSm90 only (arch 90): its tile's keys per step, sm90.h's Sm90ForwardKeysPerStep (64
  // or 128 at d64, 128 at d128, 80 at d256); 0 for the other kernels.
  int keys_per_step = 0;
};

// The tile shape (query rows, keys) of a variant's kernel: the block mask's granularity.
void TileShape(const Variant& v, int* block_m, int* block_n);

// The CUDA source of the policy struct for a graph (for tests and messages).
std::string PolicySource(const flex::ScoreMod& mod);
// The whole translation unit NVRTC compiles for a variant (policy, instantiation, block mask).
std::string KernelSource(const flex::ScoreMod& mod, const Variant& v);

// ptxas's report on one kernel of an NVRTC log (compiled with --ptxas-options=-v): the registers
// of the launch, the spill bytes and stack frame, and every ptxas warning in the log (e.g.
// C7510-C7519: wgmma serialized). found: the kernel's lines were in the log.
struct PtxasReport {
  bool found = false;
  int registers = -1, spill_stores = -1, spill_loads = -1, stack = -1;
  std::string warnings;
};
PtxasReport ReportOf(const std::string& log, const std::string& kernel_name);

// A compiled (and, once used, loaded) module.
struct Module {
  Status status;                       // why compiling (or loading) failed
  std::vector<char> cubin;
  std::string kernel_name, mask_kernel_name;  // lowered names; mask: empty without a mask
  bool mask_batch = false, mask_head = false;  // what the mask_mod reads (block-mask broadcast)
  double codegen_ms = 0, compile_ms = 0, load_ms = 0;
  std::string log;                     // NVRTC's log (with ptxas's -v lines)
  PtxasReport ptxas;                   // the kernel's (kernel_name) report in the log
  // kForwardSm90: whether the kernel has the tile's intra-warpgroup overlap of the softmax with
  // O += P V (never on d64's 64-key tile). Compile() compiles it with the overlap first and,
  // where ptxas spills more than 16 bytes there, again without it, keeping the one that spills
  // less; FUSEDATTN_FLASH_SM90_JIT_OVERLAP=0 / 1 forces it off / on (read once per process).
  bool sm90_overlap = false;
  ~Module();
  // Loads the CUBIN into the current context on first use (thread-safe); the kernel handles.
  Status Load(const void** kernel, const void** mask_kernel);

 private:
  struct Loaded;
  std::shared_ptr<Loaded> loaded_;
  std::string load_error_;
  bool load_tried_ = false;
};

// Whether NVRTC can compile here (its CUDA headers found), or why not.
Status Available();
// Compiles a variant without caching (tests, timing).
std::shared_ptr<Module> Compile(const flex::ScoreMod& mod, const Variant& v);
// The cached module of (graph, variant), compiled on a miss. Never null; check ->status.
std::shared_ptr<Module> GetModule(const std::shared_ptr<const flex::ScoreMod>& mod,
                                  const Variant& v);
fusedattn_cache_stats CacheStats();
void ClearCache();

// Launches. p.flex must hold the tensors (and gradient sums); the block mask is computed into
// `block_mask` (BlockMaskBytes of the variant) and set in the params the kernel gets.
size_t BlockMaskBytes(const flex::ScoreMod& mod, const Variant& v, int batch, int heads,
                      int max_seqlen_q, int max_seqlen_kv);
Status Launch(const std::shared_ptr<const flex::ScoreMod>& mod, const Variant& v,
              const FlashParams& p, void* block_mask, void* stream);

}  // namespace fusedattn::flash::jit
