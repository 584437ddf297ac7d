// Run-time compiled score_mod kernels of the flash backend (jit.h says what and why).
#include "backends/flash/jit.h"

#include <cuda_runtime_api.h>
#include <nvrtc.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <mutex>

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
  }
}

void LaunchShape(const Variant& v, int* m, int* n, int* warps, size_t* smem) {
  switch (v.head_dim) {
    case 64: TileOf<64>(v.kernel, m, n, warps, smem); return;
    case 128: TileOf<128>(v.kernel, m, n, warps, smem); return;
    default: TileOf<256>(v.kernel, m, n, warps, smem); return;
  }
}

std::string NameExpression(const Variant& v) {
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

// One statement list per program, with the kernel's names for the inputs and tensors.
flex::CudaNames Names() {
  flex::CudaNames names;
  names.inputs[FUSEDATTN_SCORE_MOD_SCORE] = "s";
  names.inputs[FUSEDATTN_SCORE_MOD_BATCH] = "static_cast<float>(b)";
  names.inputs[FUSEDATTN_SCORE_MOD_HEAD] = "static_cast<float>(h)";
  names.inputs[FUSEDATTN_SCORE_MOD_Q_IDX] = "static_cast<float>(i)";
  names.inputs[FUSEDATTN_SCORE_MOD_KV_IDX] = "static_cast<float>(j)";
  names.inputs[FUSEDATTN_SCORE_MOD_SEQLEN_Q] = "static_cast<float>(len_q)";
  names.inputs[FUSEDATTN_SCORE_MOD_SEQLEN_KV] = "static_cast<float>(len_kv)";
  names.tensor = [](int slot, fusedattn_dtype dtype) {
    const std::string t = Format("p.flex.tensors[%d]", slot);
    const std::string at = "[FlexOffset(" + t + ", b, h, i, j)]";
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
  }
  return "?";
}

void TileShape(const Variant& v, int* block_m, int* block_n) {
  int warps;
  size_t smem;
  LaunchShape(v, block_m, block_n, &warps, &smem);
}

std::string PolicySource(const flex::ScoreMod& mod) {
  const flex::CudaNames names = Names();
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

  out += Format("  __device__ __forceinline__ static bool Forward(%s, float* score) {\n", kArgs);
  flex::EmitCudaNodes(fwd, tensors, names, &out);
  out += "    *score = " + Output(names, fwd.score, "s") + ";\n";
  out += "    return " + Output(names, fwd.mask, "true") + ";\n  }\n";

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

std::string KernelSource(const flex::ScoreMod& mod, const Variant& v) {
  std::string out = Format("// fusedattn: a score_mod graph in the flash %s kernel (%s, d%d)\n",
                           KernelName(v.kernel),
                           v.dtype == FUSEDATTN_DTYPE_FLOAT16 ? "float16" : "bfloat16",
                           v.head_dim);
  out += "#define INFINITY __int_as_float(0x7f800000)\n";
  out += v.kernel == Kernel::kForward ? "#include \"backends/flash/fwd_kernel.cuh\"\n"
                                      : "#include \"backends/flash/bwd_kernel.cuh\"\n";
  out += PolicySource(mod);
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

Status Available() {
  if (CudaIncludeDir().empty())
    return NotSupported(
        "score_mod kernels are compiled at run time with NVRTC, which needs the CUDA toolkit's "
        "headers (cuda_fp16.h): none found in $FUSEDATTN_CUDA_INCLUDE, the build's toolkit, "
        "$CUDA_HOME/include or /usr/local/cuda/include");
  return Status::Ok();
}

std::shared_ptr<Module> Compile(const flex::ScoreMod& mod, const Variant& v) {
  auto module = std::make_shared<Module>();
  module->status = Available();
  if (!module->status.ok()) return module;
  const Clock::time_point t0 = Clock::now();
  const std::string source = KernelSource(mod, v);
  const std::string name_expr = NameExpression(v);
  const flex::Dependence dep =
      flex::DependenceOf(mod.forward().nodes, mod.tensors(), mod.forward().mask);
  module->mask_batch = dep.batch;
  module->mask_head = dep.head;
  std::vector<const char*> names(kHeaderNames, kHeaderNames + kNumHeaders);
  std::vector<const char*> sources(kHeaderSources, kHeaderSources + kNumHeaders);
  for (auto [name, text] : {std::pair{"cstdint", kStdint}, std::pair{"stdint.h", kStdint},
                            std::pair{"cstddef", kStddef}, std::pair{"stddef.h", kStddef},
                            std::pair{"climits", kClimits}}) {
    names.push_back(name);
    sources.push_back(text);
  }
  module->codegen_ms = MsSince(t0);

  const Clock::time_point t1 = Clock::now();
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, source.c_str(), "fusedattn_flex.cu",
                                     static_cast<int>(names.size()), sources.data(),
                                     names.data());
  if (r != NVRTC_SUCCESS) {
    module->status = InternalError("nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    return module;
  }
  nvrtcAddNameExpression(prog, name_expr.c_str());
  const std::string arch = Format("--gpu-architecture=sm_%d%s", v.arch, v.arch == 90 ? "a" : "");
  const std::string include = "-I" + CudaIncludeDir();
  // -default-device: the declarations of fusedattn.h (host functions, never called here) are
  // read as device ones.
  const char* options[] = {arch.c_str(), "-std=c++17", include.c_str(), "-DNDEBUG",
                           "-default-device", "--diag-suppress=177,550,1097"};
  r = nvrtcCompileProgram(prog, static_cast<int>(std::size(options)), options);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
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
    return module;
  }
  const char* lowered = nullptr;
  nvrtcGetLoweredName(prog, name_expr.c_str(), &lowered);
  if (lowered) module->kernel_name = lowered;
  if (mod.forward().mask >= 0) module->mask_kernel_name = kMaskKernelName;
  size_t cubin_size = 0;
  nvrtcGetCUBINSize(prog, &cubin_size);
  module->cubin.resize(cubin_size);
  nvrtcGetCUBIN(prog, module->cubin.data());
  nvrtcDestroyProgram(&prog);
  module->compile_ms = MsSince(t1);
  if (module->kernel_name.empty() || cubin_size == 0)
    module->status = InternalError("flash: NVRTC gave no kernel for %s", name_expr.c_str());
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
               v.arch, 0, 0, 0, 0};
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
  void* args[] = {&p, &tiles};
  FUSEDATTN_CUDA_CHECK(cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)),
                                        dim3(static_cast<unsigned>(warps * 32)), args, smem,
                                        stream));
  return Status::Ok();
}

}  // namespace fusedattn::flash::jit
