// fusedattn's XLA FFI handlers: the targets fusedattn_fwd_v1 and fusedattn_bwd_v1 that
// fusedattn/jax.py calls with jax.ffi.ffi_call, for the platforms "cpu" (the reference backend)
// and "CUDA" (cuDNN, flash, small_seq or the reference, whichever the library selects).
//
// A plain shared library over the public C API: the four handlers are C symbols that
// fusedattn/_jax_ffi.py loads with ctypes and registers through jax.ffi.pycapsule. It includes
// only jaxlib's header-only FFI (jax.ffi.include_dir()) and fusedattn.h, so any C++17 compiler
// builds it; no CUDA header, no Python. The versioned names mean that an exported program made by
// an older release fails to find its target instead of decoding operands it does not know.
//
// Operands, in this order (absent optional tensors are zero-size: shape [0]):
//   forward:  q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
//             seq_offsets_kv, dropout (uint32[4]: seed low/high, offset low/high words), the
//             initial o and lse, then the score_mod tensors;
//   backward: q, k, v, o, lse, d_o, then as the forward from bias to dropout, the initial dq,
//             dk and dv, then the score_mod tensors.
// The initial outputs are zeros aliased to the outputs (input_output_aliases) for THD, whose
// tokens outside every sequence the library leaves untouched; zero-size otherwise. The handlers
// do not read them.
// Results: forward o, lse (zero-size unless is_training or return_lse); backward dq, dk, dv,
// dbias, dsink (zero-size when not computed), then one per score_mod tensor (zero-size for those
// whose gradient is not asked for). Shapes and strides are the buffers' (row-major, dense).
// Attributes: the config's enums as int64 (the C API's values), the scalars, the flags, and
// score_mod, the graph's fusedattn_score_mod_serialize text ("" for none).
//
// Nothing is allocated but the workspace: on CUDA from XLA's scratch allocator (freed after the
// call, sized at run time so that a program compiled elsewhere stays right), on the CPU from the
// heap.
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "layout_axes.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using fusedattn_python::Axes;
using fusedattn_python::AxesOf;

constexpr size_t kMessageBytes = 16384;

// ---- errors --------------------------------------------------------------------------------

ffi::ErrorCode CodeOf(fusedattn_status status) {
  switch (status) {
    case FUSEDATTN_ERROR_INVALID_ARGUMENT: return ffi::ErrorCode::kInvalidArgument;
    case FUSEDATTN_ERROR_NOT_SUPPORTED: return ffi::ErrorCode::kUnimplemented;
    case FUSEDATTN_ERROR_WORKSPACE:
    case FUSEDATTN_ERROR_OUT_OF_MEMORY: return ffi::ErrorCode::kResourceExhausted;
    default: return ffi::ErrorCode::kInternal;
  }
}

// The library's message, prefixed so that the user sees whose error it is (XLA adds the code's
// name: "INVALID_ARGUMENT: fusedattn (invalid argument): ...").
ffi::Error Failure(fusedattn_status status, const std::string& message) {
  return ffi::Error(CodeOf(status), std::string("fusedattn (") + fusedattn_status_string(status) +
                                        "): " + message);
}

ffi::Error Invalid(const std::string& message) {
  return Failure(FUSEDATTN_ERROR_INVALID_ARGUMENT, message);
}

// ---- attributes ----------------------------------------------------------------------------

struct Options {
  fusedattn_format format = FUSEDATTN_FORMAT_BSHD;
  fusedattn_mask mask = FUSEDATTN_MASK_NONE;
  int64_t window_left = -1, window_right = -1;
  fusedattn_bias bias_type = FUSEDATTN_BIAS_NONE;
  fusedattn_softmax softmax = FUSEDATTN_SOFTMAX_VANILLA;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  double softcap = 0, dropout = 0, scale = 0;
  bool deterministic = false, is_training = false, return_lse = false, bias_requires_grad = false;
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;  // THD only (dense layouts read the shapes)
  std::string_view score_mod;
};

ffi::Error ReadOptions(const ffi::Dictionary& attrs, Options* o) {
  std::string missing;
  auto integer = [&](const char* name) -> int64_t {
    ffi::ErrorOr<int64_t> v = attrs.get<int64_t>(name);
    if (!v.has_value()) {
      missing += missing.empty() ? name : std::string(", ") + name;
      return 0;
    }
    return *v;
  };
  auto real = [&](const char* name) -> double {
    ffi::ErrorOr<double> v = attrs.get<double>(name);
    if (!v.has_value()) {
      missing += missing.empty() ? name : std::string(", ") + name;
      return 0;
    }
    return *v;
  };
  o->format = static_cast<fusedattn_format>(integer("layout"));
  o->mask = static_cast<fusedattn_mask>(integer("mask"));
  o->window_left = integer("window_left");
  o->window_right = integer("window_right");
  o->bias_type = static_cast<fusedattn_bias>(integer("bias_type"));
  o->softmax = static_cast<fusedattn_softmax>(integer("softmax_type"));
  o->backend = static_cast<fusedattn_backend>(integer("backend"));
  o->softcap = real("softcap");
  o->dropout = real("dropout");
  o->scale = real("attn_scale");
  o->deterministic = integer("deterministic") != 0;
  o->is_training = integer("is_training") != 0;
  o->return_lse = integer("return_lse") != 0;
  o->bias_requires_grad = integer("bias_requires_grad") != 0;
  o->max_seqlen_q = integer("max_seqlen_q");
  o->max_seqlen_kv = integer("max_seqlen_kv");
  ffi::ErrorOr<std::string_view> text = attrs.get<std::string_view>("score_mod");
  if (!text.has_value()) missing += missing.empty() ? "score_mod" : ", score_mod";
  else o->score_mod = *text;
  if (!missing.empty())
    return Invalid("the FFI call lacks the attribute(s) " + missing +
                   " (or has them with another type): it was not made by fusedattn.jax of this "
                   "version");
  return ffi::Error::Success();
}

// ---- score modifiers -----------------------------------------------------------------------

// Finalized graphs rebuilt from their text, kept by text (equal texts are equal graphs) in a
// bounded least-recently-used cache shared by the threads XLA runs handlers on. The library's own
// plan caches key on the graph's structure, so equal expressions share their compiled artifacts.
class GraphCache {
 public:
  static constexpr size_t kCapacity = 256;

  struct Graph {
    fusedattn_score_mod* handle = nullptr;
    ~Graph() { fusedattn_score_mod_destroy(handle); }
  };

  // The graph of text, or an error with the library's message about the text.
  ffi::Error Get(std::string_view text, std::shared_ptr<const Graph>* out) {
    std::string key(text);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = index_.find(key);
      if (it != index_.end()) {
        order_.splice(order_.begin(), order_, it->second);
        *out = it->second->second;
        return ffi::Error::Success();
      }
    }
    auto graph = std::make_shared<Graph>();
    char message[kMessageBytes] = "";
    fusedattn_status status =
        fusedattn_score_mod_deserialize(key.c_str(), &graph->handle, message, sizeof message);
    if (status != FUSEDATTN_SUCCESS) return Failure(status, message);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      order_.emplace_front(key, std::move(graph));
      index_.emplace(std::move(key), order_.begin());
      if (order_.size() > kCapacity) {
        index_.erase(order_.back().first);
        order_.pop_back();
      }
      it = index_.find(order_.front().first);
    }
    *out = it->second->second;
    return ffi::Error::Success();
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_.size();
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Graph>>;
  std::mutex mutex_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

GraphCache& Graphs() {
  static GraphCache* cache = new GraphCache();  // never destroyed: handlers may outlive exit
  return *cache;
}

// ---- buffers -------------------------------------------------------------------------------

bool DtypeOf(ffi::DataType type, fusedattn_dtype* out) {
  switch (type) {
    case ffi::DataType::F32: *out = FUSEDATTN_DTYPE_FLOAT32; return true;
    case ffi::DataType::F16: *out = FUSEDATTN_DTYPE_FLOAT16; return true;
    case ffi::DataType::BF16: *out = FUSEDATTN_DTYPE_BFLOAT16; return true;
    case ffi::DataType::S32: *out = FUSEDATTN_DTYPE_INT32; return true;
    default: return false;
  }
}

// A dense row-major buffer as the C API's tensor; absent (data NULL) when `optional` and the
// buffer is zero-size.
ffi::Error Describe(const char* name, const ffi::AnyBuffer& buffer, bool optional,
                    fusedattn_tensor* out) {
  *out = fusedattn_tensor{};
  ffi::AnyBuffer::Dimensions dims = buffer.dimensions();
  if (optional && buffer.element_count() == 0) return ffi::Error::Success();
  if (dims.size() < 1 || dims.size() > FUSEDATTN_MAX_DIMS)
    return Invalid(std::string(name) + " has " + std::to_string(dims.size()) +
                   " dimensions; fusedattn tensors have 1 to " +
                   std::to_string(FUSEDATTN_MAX_DIMS));
  if (!DtypeOf(buffer.element_type(), &out->dtype))
    return Invalid(std::string(name) + " has XLA element type " +
                   std::to_string(static_cast<int>(buffer.element_type())) +
                   ": fusedattn takes float32, float16 and bfloat16 tensors (int32 for index "
                   "tensors)");
  out->data = buffer.untyped_data();
  out->ndim = static_cast<int32_t>(dims.size());
  int64_t stride = 1;
  for (int i = out->ndim - 1; i >= 0; --i) {
    out->shape[i] = dims[i];
    out->strides[i] = stride;
    stride *= dims[i];
  }
  return ffi::Error::Success();
}

// The inputs both directions take after their own leading ones.
enum Common { kBias, kAlibi, kSinks, kCuQ, kCuKv, kOffQ, kOffKv, kDropout, kNumCommon };
constexpr const char* kCommonNames[kNumCommon] = {
    "bias", "alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_kv", "seq_offsets_q",
    "seq_offsets_kv", "dropout"};

struct Inputs {
  fusedattn_tensor q{}, k{}, v{};
  fusedattn_tensor common[kNumCommon]{};
  const uint64_t* dropout_seed_offset = nullptr;
  std::vector<fusedattn_tensor> score_mod_tensors;
  std::vector<int64_t> q_dims, k_dims, v_dims, bias_dims, cu_q_dims;
};

ffi::ErrorOr<ffi::AnyBuffer> Arg(const ffi::RemainingArgs& args, size_t i) {
  return args.get<ffi::AnyBuffer>(i);
}

std::vector<int64_t> DimsOf(const ffi::AnyBuffer& b) {
  return std::vector<int64_t>(b.dimensions().begin(), b.dimensions().end());
}

// Reads q, k, v at positions 0..2 and the common inputs from position `first`; the score_mod
// tensors follow the `num_initial` initial outputs after them.
ffi::Error ReadInputs(const ffi::RemainingArgs& args, size_t first, size_t num_initial,
                      Inputs* in) {
  if (args.size() < first + kNumCommon + num_initial)
    return Invalid("the FFI call has " + std::to_string(args.size()) + " operands but at least " +
                   std::to_string(first + kNumCommon + num_initial) + " are expected");
  const char* qkv[3] = {"q", "k", "v"};
  fusedattn_tensor* qkv_out[3] = {&in->q, &in->k, &in->v};
  std::vector<int64_t>* qkv_dims[3] = {&in->q_dims, &in->k_dims, &in->v_dims};
  for (size_t i = 0; i < 3; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> b = Arg(args, i);
    if (!b.has_value()) return b.error();
    if (ffi::Error e = Describe(qkv[i], *b, false, qkv_out[i]); e.failure()) return e;
    *qkv_dims[i] = DimsOf(*b);
  }
  for (int c = 0; c < kNumCommon; ++c) {
    ffi::ErrorOr<ffi::AnyBuffer> b = Arg(args, first + c);
    if (!b.has_value()) return b.error();
    if (c == kDropout) {
      // uint32[4]: the {seed, offset} pair of uint64 in memory (little-endian words).
      if (b->element_count() == 0) continue;
      if (b->size_bytes() != 2 * sizeof(uint64_t))
        return Invalid("dropout has " + std::to_string(b->size_bytes()) +
                       " bytes; the seed and offset take 16 (uint32[4])");
      in->dropout_seed_offset = static_cast<const uint64_t*>(b->untyped_data());
      continue;
    }
    if (ffi::Error e = Describe(kCommonNames[c], *b, true, &in->common[c]); e.failure()) return e;
    if (c == kBias) in->bias_dims = DimsOf(*b);
    if (c == kCuQ) in->cu_q_dims = DimsOf(*b);
  }
  for (size_t i = first + kNumCommon + num_initial; i < args.size(); ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> b = Arg(args, i);
    if (!b.has_value()) return b.error();
    fusedattn_tensor t;
    if (ffi::Error e = Describe("a score_mod tensor", *b, false, &t); e.failure()) return e;
    in->score_mod_tensors.push_back(t);
  }
  return ffi::Error::Success();
}

template <typename Args>
void SetCommon(const Inputs& in, Args* args) {
  args->q = in.q, args->k = in.k, args->v = in.v;
  args->bias = in.common[kBias];
  args->alibi_slopes = in.common[kAlibi];
  args->sink_logits = in.common[kSinks];
  args->cu_seqlens_q = in.common[kCuQ];
  args->cu_seqlens_kv = in.common[kCuKv];
  args->seq_offsets_q = in.common[kOffQ];
  args->seq_offsets_kv = in.common[kOffKv];
  args->dropout_seed_offset = in.dropout_seed_offset;
  args->num_score_mod_tensors = static_cast<int64_t>(in.score_mod_tensors.size());
  args->score_mod_tensors = in.score_mod_tensors.empty() ? nullptr : in.score_mod_tensors.data();
}

// ---- the config ----------------------------------------------------------------------------

ffi::Error MakeConfig(const Options& o, const Inputs& in, bool is_training, bool return_lse,
                      fusedattn_device device, fusedattn_config* out) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  bool thd = o.format == FUSEDATTN_FORMAT_THD;
  size_t rank = thd ? 3 : 4;
  if (in.q_dims.size() != rank || in.k_dims.size() != rank || in.v_dims.size() != rank)
    return Invalid("q, k, v have " + std::to_string(in.q_dims.size()) + ", " +
                   std::to_string(in.k_dims.size()) + ", " + std::to_string(in.v_dims.size()) +
                   " dimensions but the layout has " + std::to_string(rank));
  c.is_training = is_training ? 1 : 0;
  if (thd) {
    if (in.cu_q_dims.size() != 1)
      return Invalid("layout 'thd' needs cu_seqlens_q and cu_seqlens_kv (int32 [batch + 1])");
    c.batch = in.cu_q_dims[0] - 1;
    c.max_seqlen_q = o.max_seqlen_q, c.max_seqlen_kv = o.max_seqlen_kv;
    c.heads_q = in.q_dims[1], c.heads_kv = in.k_dims[1];
    c.head_dim_qk = in.q_dims[2], c.head_dim_v = in.v_dims[2];
  } else {
    Axes a = AxesOf(o.format);
    c.batch = in.q_dims[a.b];
    c.max_seqlen_q = in.q_dims[a.s], c.max_seqlen_kv = in.k_dims[a.s];
    c.heads_q = in.q_dims[a.h], c.heads_kv = in.k_dims[a.h];
    c.head_dim_qk = in.q_dims[3], c.head_dim_v = in.v_dims[3];
  }
  c.qkv_dtype = c.o_dtype = in.q.dtype;
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = o.format;
  c.mask = o.mask;
  c.window_left = o.window_left, c.window_right = o.window_right;
  c.bias_type = o.bias_type;
  if (in.common[kBias].data != nullptr) {
    if (in.bias_dims.size() != 4)
      return Invalid("bias has " + std::to_string(in.bias_dims.size()) +
                     " dimensions but [1|batch, 1|heads_q, max_seqlen_q, max_seqlen_kv] is "
                     "expected");
    c.bias_batch = in.bias_dims[0], c.bias_heads = in.bias_dims[1];
  }
  c.bias_requires_grad = is_training && o.bias_requires_grad && in.common[kBias].data ? 1 : 0;
  c.softmax_type = o.softmax;
  c.attn_scale = o.scale, c.softcap = o.softcap, c.dropout = o.dropout;
  c.deterministic = o.deterministic ? 1 : 0;
  c.return_lse = return_lse ? 1 : 0;
  c.backend = o.backend;
  c.device = device;
  *out = c;
  return ffi::Error::Success();
}

// ---- where the call runs -------------------------------------------------------------------

// The CUDA runtime's cudaGetDevice / cudaSetDevice, looked up among libfusedattn's own
// dependencies (a CUDA build links the shared libcudart), so that this library needs no CUDA
// at build time. Null in a build without CUDA, where no CUDA call reaches the handlers.
struct CudaDeviceCalls {
  int (*get)(int*) = nullptr;  // cudaError_t is an int-sized enum; 0 is cudaSuccess
  int (*set)(int) = nullptr;
};

const CudaDeviceCalls& CudaDevice() {
  static const CudaDeviceCalls calls = [] {
    CudaDeviceCalls c;
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&fusedattn_fwd), &info) == 0 || info.dli_fname == nullptr)
      return c;
    // dlsym on the library's handle searches it and then its dependencies.
    void* library = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) return c;
    c.get = reinterpret_cast<int (*)(int*)>(dlsym(library, "cudaGetDevice"));
    c.set = reinterpret_cast<int (*)(int)>(dlsym(library, "cudaSetDevice"));
    if (c.get == nullptr || c.set == nullptr) c.get = nullptr, c.set = nullptr;
    return c;
  }();
  return calls;
}

// Makes XLA's device for the call the current CUDA device of this thread for the call's
// duration: the library runs on the current device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int64_t ordinal) {
    const CudaDeviceCalls& cuda = CudaDevice();
    if (cuda.get == nullptr || cuda.get(&previous_) != 0 || previous_ == ordinal) return;
    if (cuda.set(static_cast<int>(ordinal)) == 0) restore_ = true;
  }
  ~ScopedDevice() {
    if (restore_) CudaDevice().set(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
  bool restore_ = false;
};

// The platform's stream and workspace: CUDA gives both from XLA's context; the CPU has neither
// (the reference backend ignores the stream and its workspace comes from the heap).
struct Platform {
  fusedattn_device device = FUSEDATTN_DEVICE_CPU;
  void* stream = nullptr;
  ffi::ScratchAllocator* scratch = nullptr;

  ffi::Error Workspace(size_t bytes, std::vector<uint8_t>* heap, void** out) const {
    *out = nullptr;
    if (bytes == 0) return ffi::Error::Success();
    if (scratch == nullptr) {
      heap->resize(bytes);
      *out = heap->data();
      return ffi::Error::Success();
    }
    // The workspace starts on a 256-byte boundary (what cudaMalloc gives; the backends lay their
    // parts out from there). XLA's allocator takes no alignment above 16 ("Unsupported
    // alignment"), so ask for 255 bytes more and align here.
    constexpr size_t kAlignment = 256;
    std::optional<void*> memory = scratch->Allocate(bytes + kAlignment - 1, 16);
    if (!memory.has_value())
      return Failure(FUSEDATTN_ERROR_OUT_OF_MEMORY,
                     "XLA's scratch allocator could not give the " + std::to_string(bytes) +
                         " bytes of workspace this call needs");
    uintptr_t base = reinterpret_cast<uintptr_t>(*memory);
    *out = reinterpret_cast<void*>((base + kAlignment - 1) / kAlignment * kAlignment);
    return ffi::Error::Success();
  }
};

using WorkspaceSize = fusedattn_status (*)(const fusedattn_config*, size_t*, char*, size_t);

// ---- the two directions --------------------------------------------------------------------

ffi::ErrorOr<ffi::AnyBuffer> Ret(const ffi::RemainingRets& rets, size_t i) {
  ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> r = rets.get<ffi::AnyBuffer>(i);
  if (!r.has_value()) return ffi::Unexpected(r.error());
  return **r;
}

ffi::Error Forward(const Platform& platform, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   ffi::Dictionary attrs) {
  Options o;
  if (ffi::Error e = ReadOptions(attrs, &o); e.failure()) return e;
  Inputs in;
  if (ffi::Error e = ReadInputs(args, 3, 2, &in); e.failure()) return e;
  if (rets.size() != 2)
    return Invalid("the forward FFI call has " + std::to_string(rets.size()) +
                   " results but o and lse are expected");
  fusedattn_config config;
  if (ffi::Error e = MakeConfig(o, in, o.is_training, o.return_lse, platform.device, &config);
      e.failure())
    return e;
  std::shared_ptr<const GraphCache::Graph> graph;
  if (!o.score_mod.empty()) {
    if (ffi::Error e = Graphs().Get(o.score_mod, &graph); e.failure()) return e;
    config.score_mod = graph->handle;
  }
  fusedattn_fwd_args fwd = fusedattn_fwd_args_init();
  SetCommon(in, &fwd);
  ffi::ErrorOr<ffi::AnyBuffer> out = Ret(rets, 0), lse = Ret(rets, 1);
  if (!out.has_value()) return out.error();
  if (!lse.has_value()) return lse.error();
  if (ffi::Error e = Describe("o", *out, false, &fwd.o); e.failure()) return e;
  if (o.is_training || o.return_lse)
    if (ffi::Error e = Describe("lse", *lse, false, &fwd.lse); e.failure()) return e;

  char message[kMessageBytes] = "";
  size_t bytes = 0;
  fusedattn_status status = fusedattn_fwd_workspace_size(&config, &bytes, message, sizeof message);
  if (status != FUSEDATTN_SUCCESS) return Failure(status, message);
  std::vector<uint8_t> heap;
  void* workspace = nullptr;
  if (ffi::Error e = platform.Workspace(bytes, &heap, &workspace); e.failure()) return e;
  status = fusedattn_fwd(&config, &fwd, workspace, bytes, platform.stream, message, sizeof message);
  if (status != FUSEDATTN_SUCCESS) return Failure(status, message);
  return ffi::Error::Success();
}

ffi::Error Backward(const Platform& platform, ffi::RemainingArgs args, ffi::RemainingRets rets,
                    ffi::Dictionary attrs) {
  Options o;
  if (ffi::Error e = ReadOptions(attrs, &o); e.failure()) return e;
  Inputs in;
  if (ffi::Error e = ReadInputs(args, 6, 3, &in); e.failure()) return e;
  size_t num_mods = in.score_mod_tensors.size();
  if (rets.size() != 5 + num_mods)
    return Invalid("the backward FFI call has " + std::to_string(rets.size()) +
                   " results but dq, dk, dv, dbias, dsink and " + std::to_string(num_mods) +
                   " score_mod gradients are expected");
  fusedattn_config config;
  if (ffi::Error e = MakeConfig(o, in, /*is_training=*/true, false, platform.device, &config);
      e.failure())
    return e;
  std::shared_ptr<const GraphCache::Graph> graph;
  if (!o.score_mod.empty()) {
    if (ffi::Error e = Graphs().Get(o.score_mod, &graph); e.failure()) return e;
    config.score_mod = graph->handle;
  }
  fusedattn_bwd_args bwd = fusedattn_bwd_args_init();
  SetCommon(in, &bwd);
  const char* leading[3] = {"o", "lse", "d_o"};
  fusedattn_tensor* leading_out[3] = {&bwd.o, &bwd.lse, &bwd.d_o};
  for (size_t i = 0; i < 3; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> b = Arg(args, 3 + i);
    if (!b.has_value()) return b.error();
    if (ffi::Error e = Describe(leading[i], *b, false, leading_out[i]); e.failure()) return e;
  }
  const char* grads[5] = {"dq", "dk", "dv", "dbias", "dsink"};
  fusedattn_tensor* grads_out[5] = {&bwd.dq, &bwd.dk, &bwd.dv, &bwd.dbias, &bwd.dsink};
  for (size_t i = 0; i < 5; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> b = Ret(rets, i);
    if (!b.has_value()) return b.error();
    if (ffi::Error e = Describe(grads[i], *b, i >= 3, grads_out[i]); e.failure()) return e;
  }
  std::vector<fusedattn_tensor> mod_grads(num_mods);
  for (size_t i = 0; i < num_mods; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> b = Ret(rets, 5 + i);
    if (!b.has_value()) return b.error();
    if (ffi::Error e = Describe("a score_mod gradient", *b, true, &mod_grads[i]); e.failure())
      return e;
  }
  bwd.d_score_mod_tensors = mod_grads.empty() ? nullptr : mod_grads.data();

  char message[kMessageBytes] = "";
  size_t bytes = 0;
  fusedattn_status status = fusedattn_bwd_workspace_size(&config, &bytes, message, sizeof message);
  if (status != FUSEDATTN_SUCCESS) return Failure(status, message);
  std::vector<uint8_t> heap;
  void* workspace = nullptr;
  if (ffi::Error e = platform.Workspace(bytes, &heap, &workspace); e.failure()) return e;
  status = fusedattn_bwd(&config, &bwd, workspace, bytes, platform.stream, message, sizeof message);
  if (status != FUSEDATTN_SUCCESS) return Failure(status, message);
  return ffi::Error::Success();
}

// ---- the handlers per platform -------------------------------------------------------------

ffi::Error ForwardCpu(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return Forward(Platform{}, args, rets, attrs);
}

ffi::Error BackwardCpu(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return Backward(Platform{}, args, rets, attrs);
}

ffi::Error ForwardCuda(void* stream, int32_t device, ffi::ScratchAllocator scratch,
                       ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  ScopedDevice current(device);
  return Forward(Platform{FUSEDATTN_DEVICE_CUDA, stream, &scratch}, args, rets, attrs);
}

ffi::Error BackwardCuda(void* stream, int32_t device, ffi::ScratchAllocator scratch,
                        ffi::RemainingArgs args, ffi::RemainingRets rets,
                        ffi::Dictionary attrs) {
  ScopedDevice current(device);
  return Backward(Platform{FUSEDATTN_DEVICE_CUDA, stream, &scratch}, args, rets, attrs);
}

}  // namespace

// The handlers and the cache counter are this library's only exported symbols (it is built with
// hidden visibility otherwise).
#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(fusedattn_xla_fwd_cpu, ForwardCpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(fusedattn_xla_bwd_cpu, BackwardCpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(fusedattn_xla_fwd_cuda, ForwardCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(fusedattn_xla_bwd_cuda, BackwardCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());

// The number of score_mod graphs the handlers keep (tests check that equal expressions share
// one entry).
extern "C" int64_t fusedattn_xla_graph_cache_size(void) {
  return static_cast<int64_t>(Graphs().size());
}

#pragma GCC visibility pop
