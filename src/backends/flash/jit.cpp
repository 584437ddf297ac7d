// Run-time compiled score_mod kernels of the flash backend (jit.h says what and why).
#include "backends/flash/jit.h"

#include <cuda_runtime_api.h>
#include <nvrtc.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <mutex>

#include "backends/flash/sm90.h"
#include "backends/flash/sm90_tile.h"
#include "backends/flash/tiles.h"
#include "common/cuda_util.h"
#include "flex/cache.h"
#include "flex/codegen.h"

namespace fusedattn::flash::jit {

// The kernel headers, embedded at build time (embed_headers.cmake writes them).
extern const char* const kHeaderNames[];
extern const char* const kHeaderSources[];
extern const int kNumHeaders;

namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// What NVRTC has no headers for: the few C/C++ library names the kernel headers include.
constexpr const char* kStdint = R"(#pragma once
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long intptr_t;
typedef unsigned long long uintptr_t;
#define INT32_MAX 2147483647
#define UINT32_MAX 4294967295u
#define INT64_MAX 9223372036854775807LL
#define INT64_MIN (-INT64_MAX - 1)
)";
constexpr const char* kStddef = R"(#pragma once
typedef decltype(sizeof(0)) size_t;
typedef decltype((char*)0 - (char*)0) ptrdiff_t;
)";
constexpr const char* kClimits = R"(#pragma once
#define INT_MAX 2147483647
#define INT_MIN (-INT_MAX - 1)
)";
// The two names of <type_traits> the Hopper kernel headers use (wgmma.cuh, fwd_kernel_sm90.cuh).
constexpr const char* kTypeTraits = R"(#pragma once
namespace std {
template <class T, T kValue>
struct integral_constant {
  static constexpr T value = kValue;
  using value_type = T;
  constexpr operator T() const { return kValue; }
};
template <class A, class B>
inline constexpr bool is_same_v = false;
template <class A>
inline constexpr bool is_same_v<A, A> = true;
}  // namespace std
)";
// cuda.h's CUtensorMap (the Hopper kernel's parameter type), which NVRTC cannot include.
constexpr const char* kTensorMap =
    "typedef struct CUtensorMap_st { alignas(64) unsigned long long opaque[16]; } CUtensorMap;\n";

// The directory with cuda_fp16.h / cuda_bf16.h (NVRTC's -I): $FUSEDATTN_CUDA_INCLUDE, the
// toolkit's at build time, $CUDA_HOME/include, /usr/local/cuda/include.
std::string CudaIncludeDir() {
  static const std::string dir = [] {
    std::vector<std::string> candidates;
    if (const char* e = std::getenv("FUSEDATTN_CUDA_INCLUDE")) candidates.push_back(e);
#ifdef FUSEDATTN_CUDA_INCLUDE_DIR
    candidates.push_back(FUSEDATTN_CUDA_INCLUDE_DIR);
#endif
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
      if (const char* e = std::getenv(var)) candidates.push_back(std::string(e) + "/include");
    candidates.push_back("/usr/local/cuda/include");
    for (const std::string& c : candidates) {
      struct stat st;
      if (!c.empty() && stat((c + "/cuda_fp16.h").c_str(), &st) == 0) return c;
    }
    return std::string();
  }();
  return dir;
}

const char* ElementName(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FLOAT16 ? "fusedattn::flash::Half"
                                          : "fusedattn::flash::Bfloat16";
}

template <int kDim>
void TileOf(Kernel kernel, int* m, int* n, int* warps, size_t* smem) {
  switch (kernel) {
    case Kernel::kForward:
      *m = FwdTile<kDim, true>::kBlockM, *n = FwdTile<kDim, true>::kBlockN;
      *warps = FwdTile<kDim, true>::kWarps, *smem = FwdSmemBytes<kDim, true>(2);
      return;
    case Kernel::kBackward:
      *m = BwdTile<kDim>::kBlockM, *n = BwdTile<kDim>::kBlockN;
      *warps = BwdTile<kDim>::kWarps, *smem = BwdSmemBytes<kDim>(2);
      return;
    case Kernel::kBackwardDq:
      *m = DqTile<kDim>::kBlockM, *n = DqTile<kDim>::kBlockN;
      *warps = DqTile<kDim>::kWarps, *smem = DqSmemBytes<kDim>(2);
      return;
    case Kernel::kForwardSm90:  // Sm90LaunchShape's (LaunchShape never asks here)
      *m = *n = *warps = 0;
      *smem = 0;
      return;
  }
}

// The Hopper forward's tile (sm90_tile.h): 128 query rows, keys_per_step keys, 384 threads
// (producer warpgroup and two consumers). False for a shape it has no tile of.
bool Sm90LaunchShape(const Variant& v, int* m, int* n, int* warps, size_t* smem) {
  auto take = [&](auto tile) {
    using Tile = decltype(tile);
    *m = Tile::kBlockM, *n = Tile::kBlockN, *warps = Tile::kThreads / 32;
    *smem = static_cast<size_t>(Tile::kSmemBytes);
    return true;
  };
  if (v.head_dim == 64 && v.keys_per_step == 64) return take(Sm90FwdTile<64, false>());
  if (v.head_dim == 64 && v.keys_per_step == 128) return take(Sm90FwdTile<64, true>());
  if (v.head_dim == 128 && v.keys_per_step == 128) return take(Sm90FwdTile<128>());
  if (v.head_dim == 256 && v.keys_per_step == 80) return take(Sm90FwdTile<256>());
  *m = *n = *warps = 0;
  *smem = 0;
  return false;
}

// Whether the Hopper forward's tile overlaps the softmax with O += P V (sm90_tile.h): all but
// d64's 64-key tile.
bool Sm90OverlapsSoftmax(const Variant& v) {
  return !(v.head_dim == 64 && v.keys_per_step == 64);
}

// The spill bytes (stores + loads, ptxas -v) up to which a Hopper score_mod kernel keeps the
// intra-warpgroup overlap: a value or two that ptxas stores once and reloads once per step.
constexpr int kSm90SpillBytesKept = 16;

// FUSEDATTN_FLASH_SM90_JIT_OVERLAP (read once per process): "0" compiles every Hopper score_mod
// forward without the overlap, "1" with it whatever ptxas spills, unset the rule above (-1). For
// measuring the two on a GPU (flash_bench); the module cache does not key on it.
int Sm90OverlapChoice() {
  static const int choice = [] {
    const char* value = std::getenv("FUSEDATTN_FLASH_SM90_JIT_OVERLAP");
    if (value == nullptr || *value == '\0') return -1;
    return value[0] == '0' ? 0 : 1;
  }();
  return choice;
}

void LaunchShape(const Variant& v, int* m, int* n, int* warps, size_t* smem) {
  if (v.kernel == Kernel::kForwardSm90) {
    Sm90LaunchShape(v, m, n, warps, smem);
    return;
  }
  switch (v.head_dim) {
    case 64: TileOf<64>(v.kernel, m, n, warps, smem); return;
    case 128: TileOf<128>(v.kernel, m, n, warps, smem); return;
    default: TileOf<256>(v.kernel, m, n, warps, smem); return;
  }
}

std::string NameExpression(const Variant& v) {
  if (v.kernel == Kernel::kForwardSm90)
    return Format("&fusedattn::flash::WgmmaForwardKernel<%s, %d, "
                  "fusedattn::flash::Sm90Scores::kScoreMod, %s, false, "
                  "fusedattn_flex_jit::ScoreMod>",
                  ElementName(v.dtype), v.head_dim,
                  v.head_dim == 64 && v.keys_per_step == 128 ? "true" : "false");
  int m, n, warps;
  size_t smem;
  LaunchShape(v, &m, &n, &warps, &smem);
  const char* name = v.kernel == Kernel::kForward    ? "FastForwardKernel"
                     : v.kernel == Kernel::kBackward ? "FastBackwardKernel"
                                                     : "FastBackwardDqKernel";
  return Format("&fusedattn::flash::%s<%s, %d, %d, %d, %d, true, fusedattn_flex_jit::ScoreMod>",
                name, ElementName(v.dtype), v.head_dim, m, n, warps);
}

constexpr const char* kMaskKernelName = "fusedattn_flex_block_mask";

// One statement list per program, with the kernel's names for the inputs and tensors. A tensor
// is read at FlexAxesOffset<axes> (device_common.cuh): only the axes it declares, whose strides
// are the only non-zero ones (AuxTensorView), so that the compiler sees a tensor over the keys
// read once per key of a tile, not once per element (the registers of the Hopper forward).
flex::CudaNames Names(const std::vector<flex::TensorDecl>& decls) {
  flex::CudaNames names;
  names.inputs[FUSEDATTN_SCORE_MOD_SCORE] = "s";
  names.inputs[FUSEDATTN_SCORE_MOD_BATCH] = "static_cast<float>(b)";
  names.inputs[FUSEDATTN_SCORE_MOD_HEAD] = "static_cast<float>(h)";
  names.inputs[FUSEDATTN_SCORE_MOD_Q_IDX] = "static_cast<float>(i)";
  names.inputs[FUSEDATTN_SCORE_MOD_KV_IDX] = "static_cast<float>(j)";
  names.inputs[FUSEDATTN_SCORE_MOD_SEQLEN_Q] = "static_cast<float>(len_q)";
  names.inputs[FUSEDATTN_SCORE_MOD_SEQLEN_KV] = "static_cast<float>(len_kv)";
  // The graph's tanh is the softcap's (SoftcapTanh: tanh.approx.f32), so that 30 tanh(s / 30)
  // costs what the ahead-of-time softcap kernels' does and a forward and its backward agree; a
  // division by a constant is a multiply (fusedattn.h, "Score modifiers", states both). tanhf's
  // two MUFU operations and IEEE division's reciprocal made the softcap graph 0.21x the plain
  // Hopper forward (H200, d128 s16384: 135 against 639 TFLOP/s).
  names.tanh_function = "SoftcapTanh";
  names.divide_by_reciprocal = true;
  names.tensor = [decls](int slot, fusedattn_dtype dtype) {
    const std::string t = Format("p.flex.tensors[%d]", slot);
    const unsigned axes = slot < static_cast<int>(decls.size()) ? decls[slot].axes : 15u;
    const std::string at = Format("[FlexAxesOffset<%uu>(", axes) + t + ", b, h, i, j)]";
    switch (dtype) {
      case FUSEDATTN_DTYPE_FLOAT16:
        return "__half2float(static_cast<const __half*>(" + t + ".data)" + at + ")";
      case FUSEDATTN_DTYPE_BFLOAT16:
        return "__bfloat162float(static_cast<const __nv_bfloat16*>(" + t + ".data)" + at + ")";
      case FUSEDATTN_DTYPE_INT32:
        return "static_cast<float>(static_cast<const int*>(" + t + ".data)" + at + ")";
      default: return "static_cast<const float*>(" + t + ".data)" + at;
    }
  };
  return names;
}

std::string Output(const flex::CudaNames& names, int32_t id, const char* absent) {
  return id >= 0 ? flex::CudaValue(names, id) : std::string(absent);
}

}  // namespace

const char* KernelName(Kernel kernel) {
  switch (kernel) {
    case Kernel::kForward: return "forward";
    case Kernel::kBackward: return "backward";
    case Kernel::kBackwardDq: return "backward dQ";
    case Kernel::kForwardSm90: return "Hopper forward";
  }
  return "?";
}

void TileShape(const Variant& v, int* block_m, int* block_n) {
  int warps;
  size_t smem;
  LaunchShape(v, block_m, block_n, &warps, &smem);
}

std::string PolicySource(const flex::ScoreMod& mod) {
  const flex::CudaNames names = Names(mod.tensors());
  const flex::Program& fwd = mod.forward();
  const flex::Program& bwd = mod.backward();
  const auto& tensors = mod.tensors();
  constexpr const char* kArgs =
      "const FlashParams& p, float s, int b, int h, int64_t i, int64_t j, int len_q, int len_kv";
  std::string out;
  out += "namespace fusedattn_flex_jit {\nusing namespace fusedattn::flash;\n";
  out += flex::CudaHelpers();
  out += "\n// The score_mod graph as the kernels' hook (device_common.cuh's NoScoreMod).\n";
  std::string described = mod.Describe();
  for (size_t c = described.find('\n'); c != std::string::npos; c = described.find('\n', c + 1))
    described.insert(c + 1, "// ");
  out += "// " + described + "\n";
  out += "struct ScoreMod {\n  static constexpr bool kActive = true;\n";
  out += Format("  static constexpr bool kTensorGrads = %s;\n",
                mod.any_requires_grad() ? "true" : "false");

  // ForwardAt (device_common.cuh's NoScoreMod): q_idx and kv_idx from the caller's floats.
  flex::CudaNames at_names = names;
  at_names.inputs[FUSEDATTN_SCORE_MOD_Q_IDX] = "fi";
  at_names.inputs[FUSEDATTN_SCORE_MOD_KV_IDX] = "fj";
  out += "  __device__ __forceinline__ static bool ForwardAt(const FlashParams& p, float s, int b, "
         "int h, int64_t i, int64_t j, float fi, float fj, int len_q, int len_kv, "
         "float* score) {\n";
  flex::EmitCudaNodes(fwd, tensors, at_names, &out);
  out += "    *score = " + Output(names, fwd.score, "s") + ";\n";
  out += "    return " + Output(names, fwd.mask, "true") + ";\n  }\n";
  out += Format("  __device__ __forceinline__ static bool Forward(%s, float* score) {\n", kArgs);
  out += "    return ForwardAt(p, s, b, h, i, j, static_cast<float>(i), static_cast<float>(j), "
         "len_q, len_kv, score);\n  }\n";

  out += Format(
      "  __device__ __forceinline__ static bool Backward(%s, float* score, float* d_s) {\n",
      kArgs);
  flex::EmitCudaNodes(bwd, tensors, names, &out);
  out += "    *score = " + Output(names, bwd.score, "s") + ";\n";
  out += "    *d_s = " + Output(names, bwd.d_score, "1.f") + ";\n";
  out += "    return " + Output(names, bwd.mask, "true") + ";\n  }\n";

  out += "  __device__ __forceinline__ static void AddTensorGrads(const FlashParams& p, float s, "
         "float ds, int b, int h, int64_t i, int64_t j, int len_q, int len_kv) {\n";
  if (mod.any_requires_grad()) {
    flex::EmitCudaNodes(bwd, tensors, names, &out);
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (!tensors[k].requires_grad || k >= bwd.d_tensor.size() || bwd.d_tensor[k] < 0) continue;
      out += Format(
          "    atomicAdd(static_cast<float*>(const_cast<void*>(p.flex.grads[%zu].data)) + "
          "FlexOffset(p.flex.grads[%zu], b, h, i, j), ds * %s);\n",
          k, k, flex::CudaValue(names, bwd.d_tensor[k]).c_str());
    }
  }
  out += "  }\n";

  out += "  __device__ __forceinline__ static bool Mask(const FlashParams& p, int b, int h, "
         "int64_t i, int64_t j, int len_q, int len_kv) {\n    const float s = 0.f;\n";
  if (fwd.mask >= 0) flex::EmitCudaNodes(fwd, tensors, names, &out);
  out += "    return " + Output(names, fwd.mask, "true") + ";\n  }\n";
  out += "};\n}  // namespace fusedattn_flex_jit\n";
  return out;
}

namespace {
// KernelSource with the Hopper forward's intra-warpgroup overlap on or off (Sm90ModTraits).
std::string SourceOf(const flex::ScoreMod& mod, const Variant& v, bool sm90_overlap) {
  std::string out = Format("// fusedattn: a score_mod graph in the flash %s kernel (%s, d%d)\n",
                           KernelName(v.kernel),
                           v.dtype == FUSEDATTN_DTYPE_FLOAT16 ? "float16" : "bfloat16",
                           v.head_dim);
  out += "#define INFINITY __int_as_float(0x7f800000)\n";
  if (v.kernel == Kernel::kForwardSm90) {
    out += kTensorMap;
    out += "#include \"backends/flash/fwd_kernel_sm90.cuh\"\n";
  } else {
    out += v.kernel == Kernel::kForward ? "#include \"backends/flash/fwd_kernel.cuh\"\n"
                                        : "#include \"backends/flash/bwd_kernel.cuh\"\n";
  }
  out += PolicySource(mod);
  if (v.kernel == Kernel::kForwardSm90 && !sm90_overlap)
    out += "template <>\nstruct fusedattn::flash::Sm90ModTraits<fusedattn_flex_jit::ScoreMod> {\n"
           "  static constexpr bool kOverlapSoftmax = false;\n};\n";
  if (mod.forward().mask >= 0) {
    out += R"(
// The block mask: out[z][m_tile][n_tile] = whether the mask_mod shows any element of the tile
// (z = batch * heads + head over the axes the mask reads; the others are broadcast).
extern "C" __global__ void __launch_bounds__(256)
    fusedattn_flex_block_mask(const fusedattn::flash::FlashParams p, unsigned char* out,
                              int block_m, int block_n, int heads, int per_batch) {
  using namespace fusedattn::flash;
  const int n_tile = blockIdx.x, m_tile = blockIdx.y;
  const int b = blockIdx.z / heads, h = blockIdx.z % heads;
  int len_q = p.max_seqlen_q, len_kv = p.max_seqlen_kv;
  if (per_batch) {
    const SeqInfo seq = LoadSeq(p, b);
    len_q = seq.len_q, len_kv = seq.len_kv;
  }
  const int64_t i0 = int64_t{m_tile} * block_m, j0 = int64_t{n_tile} * block_n;
  const int rows = static_cast<int>(ClampI64(len_q - i0, 0, block_m));
  const int cols = static_cast<int>(ClampI64(len_kv - j0, 0, block_n));
  bool any = false;
  for (int e = threadIdx.x; e < rows * cols && !any; e += blockDim.x)
    any = fusedattn_flex_jit::ScoreMod::Mask(p, b, h, i0 + e / cols, j0 + e % cols, len_q, len_kv);
  any = __syncthreads_or(any);
  if (threadIdx.x == 0)
    out[(int64_t{blockIdx.z} * gridDim.y + m_tile) * gridDim.x + n_tile] = any ? 1 : 0;
}
)";
  }
  return out;
}
}  // namespace

std::string KernelSource(const flex::ScoreMod& mod, const Variant& v) {
  return SourceOf(mod, v, /*sm90_overlap=*/true);
}

PtxasReport ReportOf(const std::string& log, const std::string& kernel) {
  PtxasReport r;
  for (size_t at = log.find("warning"); at != std::string::npos; at = log.find("warning", at + 1))
    r.warnings += log.substr(at, log.find('\n', at) - at) + "\n";
  const size_t entry = log.find("Compiling entry function '" + kernel + "'");
  if (entry == std::string::npos) return r;
  const size_t props = log.find("bytes stack frame", entry);
  const size_t used = log.find("Used ", entry);
  if (props == std::string::npos || used == std::string::npos) return r;
  // "ptxas         .     448 bytes stack frame, 952 bytes spill stores, 1084 bytes spill loads"
  size_t number = props;
  while (number > 0 && log[number - 1] == ' ') --number;
  while (number > 0 && log[number - 1] >= '0' && log[number - 1] <= '9') --number;
  r.found = std::sscanf(log.c_str() + number,
                        "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
                        &r.stack, &r.spill_stores, &r.spill_loads) == 3 &&
            std::sscanf(log.c_str() + used, "Used %d registers", &r.registers) == 1;
  return r;
}

Status Available() {
  if (CudaIncludeDir().empty())
    return NotSupported(
        "score_mod kernels are compiled at run time with NVRTC, which needs the CUDA toolkit's "
        "headers (cuda_fp16.h): none found in $FUSEDATTN_CUDA_INCLUDE, the build's toolkit, "
        "$CUDA_HOME/include or /usr/local/cuda/include");
  return Status::Ok();
}

namespace {
// FUSEDATTN_FLASH_JIT_FAST_MATH=1 (read once per process): every score_mod kernel of the process
// (forward and backward alike, so that the backward recomputes the forward's P) is compiled with
// NVRTC's --use_fast_math: divisions by a tensor or index, expf and logf approximate, denormals
// flushed (the graph's tanh and divisions by constants are fast without it: Names). Off by
// default; for measuring. Measured before Names took SoftcapTanh (H200, d128 s16384 bf16 Hopper
// forward): the softcap graph 135 -> 246 TFLOP/s, relative bias 449 -> 450. The module cache
// does not key on it.
bool FastMath() {
  static const bool fast = [] {
    const char* value = std::getenv("FUSEDATTN_FLASH_JIT_FAST_MATH");
    return value != nullptr && value[0] == '1';
  }();
  return fast;
}

// Whether this NVRTC caches compiles across processes (CUDA 12.9 and later), and so takes
// --no-cache.
bool NvrtcHasCache() {
  static const bool has = [] {
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return false;
    return major > 12 || (major == 12 && minor >= 9);
  }();
  return has;
}

// One NVRTC run of `source` into module->cubin, kernel_name (the lowered name of v's kernel) and
// log; module->status says why it failed.
void CompileProgram(const std::string& source, const Variant& v, Module* module) {
  const std::string name_expr = NameExpression(v);
  std::vector<const char*> names(kHeaderNames, kHeaderNames + kNumHeaders);
  std::vector<const char*> sources(kHeaderSources, kHeaderSources + kNumHeaders);
  for (auto [name, text] : {std::pair{"cstdint", kStdint}, std::pair{"stdint.h", kStdint},
                            std::pair{"cstddef", kStddef}, std::pair{"stddef.h", kStddef},
                            std::pair{"climits", kClimits},
                            std::pair{"type_traits", kTypeTraits}}) {
    names.push_back(name);
    sources.push_back(text);
  }
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, source.c_str(), "fusedattn_flex.cu",
                                     static_cast<int>(names.size()), sources.data(),
                                     names.data());
  if (r != NVRTC_SUCCESS) {
    module->status = InternalError("nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    return;
  }
  nvrtcAddNameExpression(prog, name_expr.c_str());
  const std::string arch = Format("--gpu-architecture=sm_%d%s", v.arch, v.arch == 90 ? "a" : "");
  const std::string include = "-I" + CudaIncludeDir();
  // -default-device: the declarations of fusedattn.h (host functions, never called here) are
  // read as device ones.
  // --ptxas-options=-v: ptxas's resource lines (registers, spills) and any warning of its
  // (e.g. wgmma serialization, C7510-C7519) go into the log (Module::log, ReportOf).
  std::vector<const char*> options = {arch.c_str(),      "-std=c++17",
                                      include.c_str(),   "-DNDEBUG",
                                      "-default-device", "--diag-suppress=177,550,1097",
                                      "--ptxas-options=-v"};
  if (FastMath()) options.push_back("--use_fast_math");
  // NVRTC's own cache (CUDA 12.9+, in the driver's compute cache, across processes) hands back a
  // CUBIN without ptxas's report, on which the Hopper forward's overlap rule decides (Compile): a
  // cached compile kept the overlap where the first process had dropped it. Those compiles skip
  // it (their NVRTC time, 1-8 s, is then paid once per process, as the module cache keeps them).
  // An NVRTC without the cache has no --no-cache either, and refuses options it does not know.
  if (v.kernel == Kernel::kForwardSm90 && NvrtcHasCache()) options.push_back("--no-cache");
  r = nvrtcCompileProgram(prog, static_cast<int>(options.size()), options.data());
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  module->log.clear();
  if (log_size > 1) {
    module->log.resize(log_size);
    nvrtcGetProgramLog(prog, module->log.data());
    module->log.resize(log_size - 1);
  }
  if (r != NVRTC_SUCCESS) {
    module->status = InternalError(
        "flash: NVRTC could not compile the score_mod %s kernel (%s): %.2000s",
        KernelName(v.kernel), nvrtcGetErrorString(r), module->log.c_str());
    nvrtcDestroyProgram(&prog);
    return;
  }
  const char* lowered = nullptr;
  nvrtcGetLoweredName(prog, name_expr.c_str(), &lowered);
  module->kernel_name = lowered ? lowered : "";
  size_t cubin_size = 0;
  nvrtcGetCUBINSize(prog, &cubin_size);
  module->cubin.resize(cubin_size);
  nvrtcGetCUBIN(prog, module->cubin.data());
  nvrtcDestroyProgram(&prog);
  if (module->kernel_name.empty() || cubin_size == 0)
    module->status = InternalError("flash: NVRTC gave no kernel for %s", name_expr.c_str());
}
}  // namespace

std::shared_ptr<Module> Compile(const flex::ScoreMod& mod, const Variant& v) {
  auto module = std::make_shared<Module>();
  module->status = Available();
  if (!module->status.ok()) return module;
  if (v.kernel == Kernel::kForwardSm90) {
    int m, n, warps;
    size_t smem;
    if (v.arch != 90 || !Sm90LaunchShape(v, &m, &n, &warps, &smem)) {
      module->status = InternalError(
          "flash: no Hopper score_mod forward for sm_%d, head dim %d, %d keys per step (sm_90 "
          "with 64/64, 64/128, 128/128 or 256/80)",
          v.arch, v.head_dim, v.keys_per_step);
      return module;
    }
  }
  const int overlap_choice = Sm90OverlapChoice();
  const bool overlap_first = Sm90OverlapsSoftmax(v) && overlap_choice != 0;
  const Clock::time_point t0 = Clock::now();
  const std::string source = SourceOf(mod, v, overlap_first);
  const flex::Dependence dep =
      flex::DependenceOf(mod.forward().nodes, mod.tensors(), mod.forward().mask);
  module->mask_batch = dep.batch;
  module->mask_head = dep.head;
  if (mod.forward().mask >= 0) module->mask_kernel_name = kMaskKernelName;
  module->codegen_ms = MsSince(t0);

  const Clock::time_point t1 = Clock::now();
  module->sm90_overlap = v.kernel == Kernel::kForwardSm90 && overlap_first;
  CompileProgram(source, v, module.get());
  module->ptxas = ReportOf(module->log, module->kernel_name);
  if (module->status.ok() && v.kernel == Kernel::kForwardSm90 && overlap_first &&
      overlap_choice < 0) {
    // The Hopper forward overlaps a consumer's softmax with its own O += P V, which keeps P's
    // registers (32 at d128) live while the graph's code runs. Where ptxas spills more than a
    // value or two with it (kSm90SpillBytesKept: one reload per step, an L1 hit), the kernel
    // is compiled again without the overlap (Sm90ModTraits) and the one that spills less is
    // kept (the first on a tie).
    const int spilled = module->ptxas.spill_stores + module->ptxas.spill_loads;
    if (module->ptxas.found && spilled > kSm90SpillBytesKept) {
      Module second;
      second.status = Status::Ok();
      CompileProgram(SourceOf(mod, v, /*sm90_overlap=*/false), v, &second);
      const PtxasReport report = ReportOf(second.log, second.kernel_name);
      if (second.status.ok() && report.found &&
          report.spill_stores + report.spill_loads < spilled) {
        module->cubin = std::move(second.cubin);
        module->kernel_name = std::move(second.kernel_name);
        module->log = std::move(second.log);
        module->ptxas = report;
        module->sm90_overlap = false;
      }
    }
  }
  module->compile_ms = MsSince(t1);
  return module;
}

// ------------------------------------------------------------------------------------------------
// Loading
// ------------------------------------------------------------------------------------------------

struct Module::Loaded {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr, mask_kernel = nullptr;
  ~Loaded() {
    if (library) cudaLibraryUnload(library);
  }
};

Module::~Module() = default;

Status Module::Load(const void** kernel, const void** mask_kernel) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (!status.ok()) return status;
  if (!load_tried_) {
    load_tried_ = true;
    const Clock::time_point t0 = Clock::now();
    auto loaded = std::make_shared<Loaded>();
    cudaError_t e = cudaLibraryLoadData(&loaded->library, cubin.data(), nullptr, nullptr, 0,
                                        nullptr, nullptr, 0);
    if (e == cudaSuccess) e = cudaLibraryGetKernel(&loaded->kernel, loaded->library,
                                                   kernel_name.c_str());
    if (e == cudaSuccess && !mask_kernel_name.empty())
      e = cudaLibraryGetKernel(&loaded->mask_kernel, loaded->library, mask_kernel_name.c_str());
    if (e != cudaSuccess) {
      load_error_ = Format("flash: loading the score_mod kernel failed: %s (%s)",
                           cudaGetErrorString(e), cudaGetErrorName(e));
      cudaGetLastError();
    } else {
      loaded_ = std::move(loaded);
    }
    load_ms = MsSince(t0);
  }
  if (!loaded_) return Status(FUSEDATTN_ERROR_CUDA, load_error_);
  *kernel = reinterpret_cast<const void*>(loaded_->kernel);
  *mask_kernel = reinterpret_cast<const void*>(loaded_->mask_kernel);
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------------
// Cache
// ------------------------------------------------------------------------------------------------

namespace {
flex::VariantArtifactCache<Module>& Cache() {
  static flex::VariantArtifactCache<Module> cache(64);
  return cache;
}
}  // namespace

std::shared_ptr<Module> GetModule(const std::shared_ptr<const flex::ScoreMod>& mod,
                                  const Variant& v) {
  flex::VariantKey key;
  key.graph.score_mod = mod;
  key.words = {static_cast<int64_t>(v.kernel), static_cast<int64_t>(v.dtype), v.head_dim,
               v.arch, v.keys_per_step, 0, 0, 0};
  // A failed compile is cached too (its status), so that a graph NVRTC refuses is not compiled
  // again on every call.
  return Cache().get_or_make(key, [&] { return Compile(*mod, v); });
}

fusedattn_cache_stats CacheStats() { return Cache().stats(); }
void ClearCache() { Cache().clear(); }

// ------------------------------------------------------------------------------------------------
// Launching
// ------------------------------------------------------------------------------------------------

namespace {
struct MaskGrid {
  int m_tiles = 0, n_tiles = 0, batches = 1, heads = 1;
  bool usable = false;
};
MaskGrid MaskGridOf(bool has_mask, bool per_batch, bool per_head, const Variant& v, int batch,
                    int heads, int sq, int skv) {
  MaskGrid g;
  if (!has_mask) return g;
  int m, n;
  TileShape(v, &m, &n);
  g.m_tiles = (sq + m - 1) / m;
  g.n_tiles = (skv + n - 1) / n;
  g.batches = per_batch ? batch : 1;
  g.heads = per_head ? heads : 1;
  // CUDA grid limits (y, z <= 65535): beyond them every tile is visited (no block mask).
  g.usable = g.m_tiles > 0 && g.n_tiles > 0 && g.m_tiles <= 65535 &&
             int64_t{g.batches} * g.heads <= 65535;
  return g;
}
}  // namespace

size_t BlockMaskBytes(const flex::ScoreMod& mod, const Variant& v, int batch, int heads,
                      int max_seqlen_q, int max_seqlen_kv) {
  const flex::Dependence dep =
      flex::DependenceOf(mod.forward().nodes, mod.tensors(), mod.forward().mask);
  const MaskGrid g = MaskGridOf(mod.forward().mask >= 0, dep.batch, dep.head, v, batch, heads,
                                max_seqlen_q, max_seqlen_kv);
  if (!g.usable) return 0;
  return static_cast<size_t>(g.batches) * g.heads * g.m_tiles * g.n_tiles;
}

Status Launch(const std::shared_ptr<const flex::ScoreMod>& mod, const Variant& v,
              const FlashParams& params, void* block_mask, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  std::shared_ptr<Module> module = GetModule(mod, v);
  const void* kernel = nullptr;
  const void* mask_kernel = nullptr;
  FUSEDATTN_RETURN_IF_ERROR(module->Load(&kernel, &mask_kernel));

  FlashParams p = params;
  int m, n, warps;
  size_t smem;
  LaunchShape(v, &m, &n, &warps, &smem);
  // The Hopper forward (kForwardSm90): Q, K and V by TMA, the tensor maps encoded (before anything
  // is launched) as the ahead-of-time instances' launcher encodes them (EncodeLaunchTensorMap:
  // boxes of 64 columns x 128 query rows or keys_per_step keys), the plain grid (no THD schedule).
  // The kernel takes (maps, params, m_tiles).
  struct alignas(128) Maps {
    alignas(128) unsigned char q[128];
    alignas(128) unsigned char k[128];
    alignas(128) unsigned char v[128];
  } maps;
  static_assert(sizeof(Maps) == 384, "three CUtensorMaps, as the kernel's Sm90Maps");
  if (v.kernel == Kernel::kForwardSm90) {
    const bool bf16 = v.dtype == FUSEDATTN_DTYPE_BFLOAT16;
    p.schedule = nullptr;
    if (!EncodeLaunchTensorMap(maps.q, p, p.q, true, p.head_dim_qk, m, bf16) ||
        !EncodeLaunchTensorMap(maps.k, p, p.k, false, p.head_dim_qk, n, bf16) ||
        !EncodeLaunchTensorMap(maps.v, p, p.v, false, p.head_dim_v, n, bf16))
      return InternalError(
          "flash: the planner chose the Hopper score_mod forward but TMA cannot describe q, k or "
          "v (planner.cpp's TmaDescribes and sm90_host.cpp's encoding disagree, or this build "
          "has no sm_90a kernels)");
  }
  const MaskGrid g = MaskGridOf(mask_kernel != nullptr, module->mask_batch, module->mask_head, v,
                                p.batch, p.heads_q, p.max_seqlen_q, p.max_seqlen_kv);
  p.flex.block_mask = nullptr;
  if (g.usable && block_mask != nullptr) {
    unsigned char* out = static_cast<unsigned char*>(block_mask);
    int per_batch = module->mask_batch ? 1 : 0;
    int heads = g.heads;
    void* args[] = {&p, &out, &m, &n, &heads, &per_batch};
    FUSEDATTN_CUDA_CHECK(cudaLaunchKernel(
        mask_kernel, dim3(static_cast<unsigned>(g.n_tiles), static_cast<unsigned>(g.m_tiles),
                          static_cast<unsigned>(g.batches * g.heads)),
        dim3(256), args, 0, stream));
    p.flex.block_mask = out;
    p.flex.block_mask_n_tiles = g.n_tiles;
    p.flex.block_mask_stride_h = module->mask_head ? int64_t{g.m_tiles} * g.n_tiles : 0;
    p.flex.block_mask_stride_b =
        module->mask_batch ? int64_t{g.heads} * g.m_tiles * g.n_tiles : 0;
  }

  int64_t blocks = 0;
  int tiles = 0;
  if (v.kernel == Kernel::kBackward) {
    tiles = (p.max_seqlen_kv + n - 1) / n;
    blocks = int64_t{tiles} * p.heads_kv * p.batch;
  } else {
    tiles = (p.max_seqlen_q + m - 1) / m;
    blocks = int64_t{tiles} * p.heads_q * p.batch;
  }
  if (blocks > 2147483647)
    return NotSupported("flash: %lld %s blocks", (long long)blocks, KernelName(v.kernel));
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  if (v.kernel == Kernel::kForwardSm90) {
    void* args[] = {&maps, &p, &tiles};
    FUSEDATTN_CUDA_CHECK(cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)),
                                          dim3(static_cast<unsigned>(warps * 32)), args, smem,
                                          stream));
    return Status::Ok();
  }
  void* args[] = {&p, &tiles};
  FUSEDATTN_CUDA_CHECK(cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)),
                                        dim3(static_cast<unsigned>(warps * 32)), args, smem,
                                        stream));
  return Status::Ok();
}

}  // namespace fusedattn::flash::jit
