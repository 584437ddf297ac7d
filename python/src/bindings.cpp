// fusedattn._C: the public C API (include/fusedattn/fusedattn.h) for Python, and nothing more.
//
// Tensors arrive through DLPack (nb::ndarray: NumPy, PyTorch, JAX, CuPy, ...). Each one is passed
// to the library with its own pointer, dtype, shape and strides, and the device of the tensors
// decides config.device. Failures raise the exception class that fusedattn._errors gives for the
// status, carrying the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"

namespace nb = nanobind;

namespace {

constexpr size_t kMessageBytes = 16384;

// Raises fusedattn._errors.error_class(status)(message, status). Needs the GIL.
[[noreturn]] void Raise(fusedattn_status status, const std::string& message) {
  nb::object errors = nb::module_::import_("fusedattn._errors");
  nb::object cls = errors.attr("error_class")(static_cast<int>(status));
  nb::object exc = cls(nb::str(message.c_str()), static_cast<int>(status));
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw nb::python_error();
}

[[noreturn]] void RaiseInvalid(const std::string& message) {
  Raise(FUSEDATTN_ERROR_INVALID_ARGUMENT, message);
}

void Check(fusedattn_status status, const char* message) {
  if (status != FUSEDATTN_SUCCESS) Raise(status, message);
}

const char* DeviceTypeName(int type) {
  switch (type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return "cuda_managed";
    default: return "an unsupported device";
  }
}

// Where the tensors of one call live; every tensor must agree.
struct Placement {
  bool known = false;
  fusedattn_device device = FUSEDATTN_DEVICE_AUTO;
  int device_type = 0;
  int device_id = 0;
  std::string first;  // the tensor that fixed it, for messages

  void Add(const std::string& name, int type, int id) {
    fusedattn_device d;
    switch (type) {
      case nb::device::cpu::value:
      case nb::device::cuda_host::value: d = FUSEDATTN_DEVICE_CPU; break;
      case nb::device::cuda::value:
      case nb::device::cuda_managed::value: d = FUSEDATTN_DEVICE_CUDA; break;
      default:
        RaiseInvalid(name + " lives on " + DeviceTypeName(type) +
                     " (DLPack device type " + std::to_string(type) +
                     "): fusedattn takes CPU or CUDA tensors");
    }
    if (!known) {
      known = true, device = d, device_type = type, device_id = id, first = name;
      return;
    }
    if (d != device || (d == FUSEDATTN_DEVICE_CUDA && id != device_id))
      RaiseInvalid(name + " is on " + DeviceTypeName(type) + ":" + std::to_string(id) +
                   " but " + first + " is on " + DeviceTypeName(device_type) + ":" +
                   std::to_string(device_id) + ": all tensors of a call must be on one device");
  }
};

// DLPack's codes of the FP8 types (dlpack.h 1.1: kDLFloat8_e4m3fn, kDLFloat8_e5m2).
constexpr uint8_t kDLFloat8E4M3FN = 10;
constexpr uint8_t kDLFloat8E5M2 = 12;

fusedattn_dtype DtypeOf(const std::string& name, const nb::dlpack::dtype& dt) {
  if (dt.lanes == 1) {
    if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float)) {
      if (dt.bits == 32) return FUSEDATTN_DTYPE_FLOAT32;
      if (dt.bits == 16) return FUSEDATTN_DTYPE_FLOAT16;
    }
    if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16)
      return FUSEDATTN_DTYPE_BFLOAT16;
    if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int) && dt.bits == 32)
      return FUSEDATTN_DTYPE_INT32;
    if (dt.code == kDLFloat8E4M3FN && dt.bits == 8) return FUSEDATTN_DTYPE_FP8_E4M3;
    if (dt.code == kDLFloat8E5M2 && dt.bits == 8) return FUSEDATTN_DTYPE_FP8_E5M2;
  }
  RaiseInvalid(name + " has DLPack dtype (code " + std::to_string(dt.code) + ", bits " +
               std::to_string(dt.bits) + ", lanes " + std::to_string(dt.lanes) +
               "): fusedattn takes float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 and "
               "int32 tensors (FP8 also as a (uint8 view, 'fp8_e4m3' or 'fp8_e5m2') pair)");
}

// The tensors of one call, converted, kept alive until the call returns.
class TensorSet {
 public:
  explicit TensorSet(const fusedattn_config& config) : config_(config) {}

  // object: None (absent), anything DLPack or the buffer protocol exports, or a pair (tensor,
  // dtype name) that reinterprets a tensor's elements as a dtype of the same width: NumPy has no
  // bfloat16 in DLPack, so ml_dtypes' bfloat16 arrays arrive as (uint16 view, "bfloat16").
  fusedattn_tensor Input(const char* name, nb::handle object) {
    if (object.is_none()) return {};
    nb::handle declared;
    Unpair(name, &object, &declared);
    nb::ndarray<nb::ro> array;
    if (!nb::try_cast(object, array, false))
      RaiseInvalid(std::string("args.") + name + ": expected a tensor exporting DLPack (NumPy, " +
                   "PyTorch, JAX, CuPy, ...), got " +
                   nb::cast<std::string>(nb::str(nb::handle(object.type()))));
    inputs_.push_back(array);
    return Describe(name, Declared(name, declared, array.dtype()), array.ndim(), array.data(),
                    array.shape_ptr(), array.stride_ptr(), array.device_type(),
                    array.device_id());
  }

  fusedattn_tensor Output(const char* name, nb::handle object) {
    if (object.is_none()) return {};
    nb::handle declared;
    Unpair(name, &object, &declared);
    nb::ndarray<> array;
    if (!nb::try_cast(object, array, false)) {
      nb::ndarray<nb::ro> readonly;
      if (nb::try_cast(object, readonly, false))
        RaiseInvalid(std::string("args.") + name + " is read-only but it is an output");
      RaiseInvalid(std::string("args.") + name + ": expected a writable tensor exporting " +
                   "DLPack (NumPy, PyTorch, JAX, CuPy, ...), got " +
                   nb::cast<std::string>(nb::str(nb::handle(object.type()))));
    }
    outputs_.push_back(array);
    return Describe(name, Declared(name, declared, array.dtype()), array.ndim(), array.data(),
                    array.shape_ptr(), array.stride_ptr(), array.device_type(),
                    array.device_id());
  }

  // A list (or tuple) of tensors, e.g. the score_mod tensors; None entries are absent (outputs
  // only). The descriptors live in this set until the call returns.
  const fusedattn_tensor* List(const char* name, nb::handle list, bool is_output,
                               int64_t* count) {
    *count = 0;
    if (list.is_none()) return nullptr;
    if (!nb::isinstance<nb::list>(list) && !nb::isinstance<nb::tuple>(list))
      RaiseInvalid(std::string("args.") + name + " must be a list of tensors");
    lists_.emplace_back();
    std::vector<fusedattn_tensor>& out = lists_.back();
    size_t k = 0;
    for (nb::handle item : list) {
      std::string item_name = std::string(name) + "[" + std::to_string(k++) + "]";
      if (item.is_none() && !is_output)
        RaiseInvalid("args." + item_name + " is None but score_mod tensors are inputs");
      out.push_back(is_output ? Output(item_name.c_str(), item) : Input(item_name.c_str(), item));
    }
    *count = static_cast<int64_t>(out.size());
    return out.empty() ? nullptr : out.data();
  }

  // An FP8 scaling factor or amax output: a float32 tensor of one element (None: absent), on
  // the tensors' device. Returns its address.
  float* Scalar(const char* name, nb::handle object, bool is_output) {
    if (object.is_none()) return nullptr;
    fusedattn_tensor t = is_output ? Output(name, object) : Input(name, object);
    int64_t elements = 1;
    for (int i = 0; i < t.ndim; ++i) elements *= t.shape[i];
    if (t.dtype != FUSEDATTN_DTYPE_FLOAT32 || elements != 1)
      RaiseInvalid(std::string("args.") + name +
                   " must be a float32 tensor of one element (an FP8 scaling factor or amax)");
    return static_cast<float*>(t.data);
  }

  // The workspace: any tensor (bytes = elements * itemsize) on the tensors' device.
  void Workspace(nb::handle object, void** data, size_t* bytes) {
    *data = nullptr, *bytes = 0;
    if (object.is_none()) return;
    nb::ndarray<> array;
    if (!nb::try_cast(object, array, false))
      RaiseInvalid("workspace: expected a writable tensor exporting DLPack");
    placement_.Add("workspace", array.device_type(), array.device_id());
    outputs_.push_back(array);
    *data = array.data();
    *bytes = array.nbytes();
  }

  // config with its device taken from the tensors (CPU or CUDA).
  fusedattn_config Config() {
    fusedattn_config c = config_;
    if (!placement_.known) return c;
    if (c.device != FUSEDATTN_DEVICE_AUTO && c.device != placement_.device)
      RaiseInvalid(std::string("config.device = ") +
                   (c.device == FUSEDATTN_DEVICE_CPU ? "cpu" : "cuda") + " but " +
                   placement_.first + " is a " +
                   (placement_.device == FUSEDATTN_DEVICE_CPU ? "CPU" : "CUDA") + " tensor");
    c.device = placement_.device;
    return c;
  }

 private:
  static void Unpair(const char* name, nb::handle* object, nb::handle* declared) {
    if (!nb::isinstance<nb::tuple>(*object)) return;
    nb::tuple pair = nb::borrow<nb::tuple>(*object);
    if (pair.size() != 2 || !nb::isinstance<nb::str>(pair[1]))
      RaiseInvalid(std::string("args.") + name +
                   ": a tuple must be (tensor, dtype name), e.g. (array.view(uint16), 'bfloat16')");
    *object = pair[0];
    *declared = pair[1];
  }

  // The DLPack dtype, or the declared one when its width matches.
  static nb::dlpack::dtype Declared(const char* name, nb::handle declared,
                                    nb::dlpack::dtype actual) {
    if (!declared.is_valid()) return actual;
    std::string dtype = nb::cast<std::string>(declared);
    nb::dlpack::dtype want{};
    want.lanes = 1;
    if (dtype == "bfloat16") {
      want.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), want.bits = 16;
    } else if (dtype == "float16") {
      want.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Float), want.bits = 16;
    } else if (dtype == "float32") {
      want.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Float), want.bits = 32;
    } else if (dtype == "int32") {
      want.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Int), want.bits = 32;
    } else if (dtype == "fp8_e4m3") {
      want.code = kDLFloat8E4M3FN, want.bits = 8;
    } else if (dtype == "fp8_e5m2") {
      want.code = kDLFloat8E5M2, want.bits = 8;
    } else {
      RaiseInvalid(std::string("args.") + name + ": declared dtype '" + dtype +
                   "' is not float32, float16, bfloat16, int32, fp8_e4m3 or fp8_e5m2");
    }
    if (actual.bits != want.bits || actual.lanes != 1)
      RaiseInvalid(std::string("args.") + name + ": declared dtype '" + dtype + "' has " +
                   std::to_string(want.bits) + " bits but the tensor's elements have " +
                   std::to_string(actual.bits));
    return want;
  }

  fusedattn_tensor Describe(const char* name, nb::dlpack::dtype dtype, size_t ndim,
                            const void* data, const int64_t* shape, const int64_t* strides,
                            int device_type, int device_id) {
    std::string full = std::string("args.") + name;
    placement_.Add(full, device_type, device_id);
    if (ndim < 1 || ndim > FUSEDATTN_MAX_DIMS)
      RaiseInvalid(full + " has " + std::to_string(ndim) + " dimensions; fusedattn tensors have 1 to " +
                   std::to_string(FUSEDATTN_MAX_DIMS));
    fusedattn_tensor t{};
    t.data = const_cast<void*>(data);
    t.dtype = DtypeOf(full, dtype);
    t.ndim = static_cast<int32_t>(ndim);
    for (size_t i = 0; i < ndim; ++i) {
      t.shape[i] = shape[i];
      // DLPack may leave strides out for compact row-major tensors.
      if (strides != nullptr) {
        t.strides[i] = strides[i];
      } else {
        int64_t s = 1;
        for (size_t j = i + 1; j < ndim; ++j) s *= shape[j];
        t.strides[i] = s;
      }
    }
    return t;
  }

  fusedattn_config config_;
  Placement placement_;
  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
  std::list<std::vector<fusedattn_tensor>> lists_;  // stable addresses
};

// A finalized score-modifier graph (fusedattn_score_mod), rebuilt from the text that
// fusedattn._flex writes (fusedattn_score_mod_deserialize checks it).
class ScoreModGraph {
 public:
  explicit ScoreModGraph(fusedattn_score_mod* graph) : graph_(graph) {}
  ~ScoreModGraph() { fusedattn_score_mod_destroy(graph_); }
  ScoreModGraph(const ScoreModGraph&) = delete;
  ScoreModGraph& operator=(const ScoreModGraph&) = delete;

  static ScoreModGraph* Deserialize(const std::string& text) {
    char message[kMessageBytes] = "";
    fusedattn_score_mod* graph = nullptr;
    Check(fusedattn_score_mod_deserialize(text.c_str(), &graph, message, sizeof message),
          message);
    return new ScoreModGraph(graph);
  }
  std::string Serialize() const {
    size_t needed = 0;
    Check(fusedattn_score_mod_serialize(graph_, nullptr, 0, &needed), "not finalized");
    std::string text(needed, '\0');
    Check(fusedattn_score_mod_serialize(graph_, text.data(), text.size(), &needed),
          "fusedattn_score_mod_serialize failed");
    text.resize(needed - 1);
    return text;
  }
  nb::tuple Hash() const {
    uint64_t hash[2] = {0, 0};
    Check(fusedattn_score_mod_hash(graph_, hash), "the score_mod graph is not finalized");
    return nb::make_tuple(hash[0], hash[1]);
  }
  bool Equal(const ScoreModGraph& other) const {
    int32_t equal = 0;
    Check(fusedattn_score_mod_equal(graph_, other.graph_, &equal),
          "both score_mod graphs must be finalized");
    return equal != 0;
  }
  std::string Describe() const {
    char text[kMessageBytes] = "";
    Check(fusedattn_score_mod_describe(graph_, text, sizeof text), text);
    return text;
  }
  const fusedattn_score_mod* get() const { return graph_; }

 private:
  fusedattn_score_mod* graph_ = nullptr;
};

const fusedattn_score_mod* GraphOf(const ScoreModGraph* graph) {
  return graph ? graph->get() : nullptr;
}

// Takes the tensors of a call out of a dict, refusing names the call does not know.
class Named {
 public:
  explicit Named(nb::dict tensors, const char* call) : tensors_(tensors), call_(call) {}
  nb::handle Get(const char* name) {
    used_.push_back(name);
    if (!tensors_.contains(name)) return nb::none();
    return tensors_[name];
  }
  void RejectUnknown() {
    for (auto item : tensors_) {
      std::string key = nb::cast<std::string>(nb::str(item.first));
      bool known = false;
      for (const std::string& u : used_) known |= u == key;
      if (!known) {
        std::string names;
        for (const std::string& u : used_) names += (names.empty() ? "" : ", ") + u;
        RaiseInvalid(std::string(call_) + ": unknown tensor '" + key + "' (known: " + names + ")");
      }
    }
  }

 private:
  nb::dict tensors_;
  const char* call_;
  std::vector<std::string> used_;
};

void Forward(const fusedattn_config& config, nb::dict tensors, uint64_t dropout_seed,
             uint64_t dropout_offset, nb::handle workspace, uintptr_t stream,
             const ScoreModGraph* score_mod) {
  TensorSet set(config);
  Named named(tensors, "fwd");
  fusedattn_fwd_args args = fusedattn_fwd_args_init();
  args.q = set.Input("q", named.Get("q"));
  args.k = set.Input("k", named.Get("k"));
  args.v = set.Input("v", named.Get("v"));
  args.o = set.Output("o", named.Get("o"));
  args.lse = set.Output("lse", named.Get("lse"));
  args.max_logit = set.Output("max_logit", named.Get("max_logit"));
  args.bias = set.Input("bias", named.Get("bias"));
  args.alibi_slopes = set.Input("alibi_slopes", named.Get("alibi_slopes"));
  args.sink_logits = set.Input("sink_logits", named.Get("sink_logits"));
  args.cu_seqlens_q = set.Input("cu_seqlens_q", named.Get("cu_seqlens_q"));
  args.cu_seqlens_kv = set.Input("cu_seqlens_kv", named.Get("cu_seqlens_kv"));
  args.seq_offsets_q = set.Input("seq_offsets_q", named.Get("seq_offsets_q"));
  args.seq_offsets_kv = set.Input("seq_offsets_kv", named.Get("seq_offsets_kv"));
  args.score_mod_tensors = set.List("score_mod_tensors", named.Get("score_mod_tensors"), false,
                                    &args.num_score_mod_tensors);
  args.page_table = set.Input("page_table", named.Get("page_table"));
  args.seqlens_kv = set.Input("seqlens_kv", named.Get("seqlens_kv"));
  args.descale_q = set.Scalar("descale_q", named.Get("descale_q"), false);
  args.descale_k = set.Scalar("descale_k", named.Get("descale_k"), false);
  args.descale_v = set.Scalar("descale_v", named.Get("descale_v"), false);
  args.descale_s = set.Scalar("descale_s", named.Get("descale_s"), false);
  args.scale_s = set.Scalar("scale_s", named.Get("scale_s"), false);
  args.scale_o = set.Scalar("scale_o", named.Get("scale_o"), false);
  args.amax_s = set.Scalar("amax_s", named.Get("amax_s"), true);
  args.amax_o = set.Scalar("amax_o", named.Get("amax_o"), true);
  named.RejectUnknown();
  args.dropout_seed = dropout_seed;
  args.dropout_offset = dropout_offset;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  set.Workspace(workspace, &ws, &ws_bytes);
  fusedattn_config c = set.Config();
  c.score_mod = GraphOf(score_mod);
  char message[kMessageBytes] = "";
  fusedattn_status status;
  {
    nb::gil_scoped_release release;
    status = fusedattn_fwd(&c, &args, ws, ws_bytes, reinterpret_cast<void*>(stream), message,
                           sizeof message);
  }
  Check(status, message);
}

void Backward(const fusedattn_config& config, nb::dict tensors, uint64_t dropout_seed,
              uint64_t dropout_offset, nb::handle workspace, uintptr_t stream,
              const ScoreModGraph* score_mod) {
  TensorSet set(config);
  Named named(tensors, "bwd");
  fusedattn_bwd_args args = fusedattn_bwd_args_init();
  args.q = set.Input("q", named.Get("q"));
  args.k = set.Input("k", named.Get("k"));
  args.v = set.Input("v", named.Get("v"));
  args.o = set.Input("o", named.Get("o"));
  args.lse = set.Input("lse", named.Get("lse"));
  args.d_o = set.Input("d_o", named.Get("d_o"));
  args.bias = set.Input("bias", named.Get("bias"));
  args.alibi_slopes = set.Input("alibi_slopes", named.Get("alibi_slopes"));
  args.sink_logits = set.Input("sink_logits", named.Get("sink_logits"));
  args.cu_seqlens_q = set.Input("cu_seqlens_q", named.Get("cu_seqlens_q"));
  args.cu_seqlens_kv = set.Input("cu_seqlens_kv", named.Get("cu_seqlens_kv"));
  args.seq_offsets_q = set.Input("seq_offsets_q", named.Get("seq_offsets_q"));
  args.seq_offsets_kv = set.Input("seq_offsets_kv", named.Get("seq_offsets_kv"));
  args.dq = set.Output("dq", named.Get("dq"));
  args.dk = set.Output("dk", named.Get("dk"));
  args.dv = set.Output("dv", named.Get("dv"));
  args.dbias = set.Output("dbias", named.Get("dbias"));
  args.dsink = set.Output("dsink", named.Get("dsink"));
  args.descale_q = set.Scalar("descale_q", named.Get("descale_q"), false);
  args.descale_k = set.Scalar("descale_k", named.Get("descale_k"), false);
  args.descale_v = set.Scalar("descale_v", named.Get("descale_v"), false);
  args.descale_o = set.Scalar("descale_o", named.Get("descale_o"), false);
  args.descale_do = set.Scalar("descale_do", named.Get("descale_do"), false);
  args.descale_s = set.Scalar("descale_s", named.Get("descale_s"), false);
  args.descale_dp = set.Scalar("descale_dp", named.Get("descale_dp"), false);
  args.scale_s = set.Scalar("scale_s", named.Get("scale_s"), false);
  args.scale_dp = set.Scalar("scale_dp", named.Get("scale_dp"), false);
  args.scale_dq = set.Scalar("scale_dq", named.Get("scale_dq"), false);
  args.scale_dk = set.Scalar("scale_dk", named.Get("scale_dk"), false);
  args.scale_dv = set.Scalar("scale_dv", named.Get("scale_dv"), false);
  args.amax_dp = set.Scalar("amax_dp", named.Get("amax_dp"), true);
  args.amax_dq = set.Scalar("amax_dq", named.Get("amax_dq"), true);
  args.amax_dk = set.Scalar("amax_dk", named.Get("amax_dk"), true);
  args.amax_dv = set.Scalar("amax_dv", named.Get("amax_dv"), true);
  args.score_mod_tensors = set.List("score_mod_tensors", named.Get("score_mod_tensors"), false,
                                    &args.num_score_mod_tensors);
  int64_t num_grads = 0;
  args.d_score_mod_tensors =
      set.List("d_score_mod_tensors", named.Get("d_score_mod_tensors"), true, &num_grads);
  if (args.d_score_mod_tensors && num_grads != args.num_score_mod_tensors)
    RaiseInvalid("args.d_score_mod_tensors has " + std::to_string(num_grads) +
                 " entries but score_mod_tensors has " +
                 std::to_string(args.num_score_mod_tensors) + " (None where no gradient)");
  named.RejectUnknown();
  args.dropout_seed = dropout_seed;
  args.dropout_offset = dropout_offset;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  set.Workspace(workspace, &ws, &ws_bytes);
  fusedattn_config c = set.Config();
  c.score_mod = GraphOf(score_mod);
  char message[kMessageBytes] = "";
  fusedattn_status status;
  {
    nb::gil_scoped_release release;
    status = fusedattn_bwd(&c, &args, ws, ws_bytes, reinterpret_cast<void*>(stream), message,
                           sizeof message);
  }
  Check(status, message);
}

fusedattn_backend BackendFromName(const std::string& name) {
  fusedattn_backend backend;
  if (fusedattn_backend_from_name(name.c_str(), &backend) != FUSEDATTN_SUCCESS)
    RaiseInvalid("backend '" + name + "' is not one of auto, reference, cudnn, flash, small_seq");
  return backend;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fusedattn's C API (include/fusedattn/fusedattn.h); use the fusedattn package.";

  nb::enum_<fusedattn_dtype>(m, "Dtype")
      .value("float32", FUSEDATTN_DTYPE_FLOAT32)
      .value("float16", FUSEDATTN_DTYPE_FLOAT16)
      .value("bfloat16", FUSEDATTN_DTYPE_BFLOAT16)
      .value("fp8_e4m3", FUSEDATTN_DTYPE_FP8_E4M3)
      .value("fp8_e5m2", FUSEDATTN_DTYPE_FP8_E5M2)
      .value("int32", FUSEDATTN_DTYPE_INT32)
      .value("default", FUSEDATTN_DTYPE_DEFAULT);
  nb::enum_<fusedattn_format>(m, "Format")
      .value("bshd", FUSEDATTN_FORMAT_BSHD)
      .value("sbhd", FUSEDATTN_FORMAT_SBHD)
      .value("bhsd", FUSEDATTN_FORMAT_BHSD)
      .value("thd", FUSEDATTN_FORMAT_THD);
  nb::enum_<fusedattn_mask>(m, "Mask")
      .value("none", FUSEDATTN_MASK_NONE)
      .value("padding", FUSEDATTN_MASK_PADDING)
      .value("causal", FUSEDATTN_MASK_CAUSAL)
      .value("causal_bottom_right", FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT)
      .value("padding_causal", FUSEDATTN_MASK_PADDING_CAUSAL)
      .value("padding_causal_bottom_right", FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT);
  nb::enum_<fusedattn_bias>(m, "Bias")
      .value("none", FUSEDATTN_BIAS_NONE)
      .value("pre_scale", FUSEDATTN_BIAS_PRE_SCALE)
      .value("post_scale", FUSEDATTN_BIAS_POST_SCALE)
      .value("alibi", FUSEDATTN_BIAS_ALIBI);
  nb::enum_<fusedattn_softmax>(m, "Softmax")
      .value("vanilla", FUSEDATTN_SOFTMAX_VANILLA)
      .value("off_by_one", FUSEDATTN_SOFTMAX_OFF_BY_ONE)
      .value("learnable_sink", FUSEDATTN_SOFTMAX_LEARNABLE_SINK);
  nb::enum_<fusedattn_backend>(m, "Backend")
      .value("auto", FUSEDATTN_BACKEND_AUTO)
      .value("reference", FUSEDATTN_BACKEND_REFERENCE)
      .value("cudnn", FUSEDATTN_BACKEND_CUDNN)
      .value("flash", FUSEDATTN_BACKEND_FLASH)
      .value("small_seq", FUSEDATTN_BACKEND_SMALL_SEQ);
  nb::enum_<fusedattn_device>(m, "Device")
      .value("auto", FUSEDATTN_DEVICE_AUTO)
      .value("cpu", FUSEDATTN_DEVICE_CPU)
      .value("cuda", FUSEDATTN_DEVICE_CUDA);

  // fusedattn_config, field for field; a new Config holds FUSEDATTN_CONFIG_INIT.
  auto config = nb::class_<fusedattn_config>(m, "Config");
  config.def("__init__", [](fusedattn_config* c) { new (c) fusedattn_config FUSEDATTN_CONFIG_INIT; });
  std::vector<std::string> fields;
#define FUSEDATTN_FIELD(name)                        \
  config.def_rw(#name, &fusedattn_config::name);     \
  fields.push_back(#name);
  FUSEDATTN_FIELD(is_training)
  FUSEDATTN_FIELD(batch)
  FUSEDATTN_FIELD(heads_q)
  FUSEDATTN_FIELD(heads_kv)
  FUSEDATTN_FIELD(max_seqlen_q)
  FUSEDATTN_FIELD(max_seqlen_kv)
  FUSEDATTN_FIELD(head_dim_qk)
  FUSEDATTN_FIELD(head_dim_v)
  FUSEDATTN_FIELD(qkv_dtype)
  FUSEDATTN_FIELD(o_dtype)
  FUSEDATTN_FIELD(q_format)
  FUSEDATTN_FIELD(kv_format)
  FUSEDATTN_FIELD(o_format)
  FUSEDATTN_FIELD(do_format)
  FUSEDATTN_FIELD(dqkv_format)
  FUSEDATTN_FIELD(mask)
  FUSEDATTN_FIELD(window_left)
  FUSEDATTN_FIELD(window_right)
  FUSEDATTN_FIELD(bias_type)
  FUSEDATTN_FIELD(bias_batch)
  FUSEDATTN_FIELD(bias_heads)
  FUSEDATTN_FIELD(bias_requires_grad)
  FUSEDATTN_FIELD(softmax_type)
  FUSEDATTN_FIELD(attn_scale)
  FUSEDATTN_FIELD(softcap)
  FUSEDATTN_FIELD(dropout)
  FUSEDATTN_FIELD(deterministic)
  FUSEDATTN_FIELD(return_lse)
  FUSEDATTN_FIELD(return_max_logit)
  FUSEDATTN_FIELD(backend)
  FUSEDATTN_FIELD(device)
  FUSEDATTN_FIELD(page_size)
  FUSEDATTN_FIELD(do_dtype)
  FUSEDATTN_FIELD(dqkv_dtype)
  FUSEDATTN_FIELD(dropout_batch_offset)
  FUSEDATTN_FIELD(dropout_heads)
  FUSEDATTN_FIELD(dropout_head_offset)
  FUSEDATTN_FIELD(dropout_rows)
  FUSEDATTN_FIELD(dropout_row_offset)
  FUSEDATTN_FIELD(dropout_key_offset)
#undef FUSEDATTN_FIELD
  nb::list field_names;
  for (const std::string& f : fields) field_names.append(nb::str(f.c_str()));
  config.attr("fields") = nb::tuple(field_names);

  nb::class_<ScoreModGraph>(m, "ScoreModGraph",
                            "A finalized fusedattn_score_mod graph; build it with fusedattn.flex.")
      .def_static("deserialize", &ScoreModGraph::Deserialize, nb::arg("text"),
                  nb::rv_policy::take_ownership,
                  "The graph of fusedattn_score_mod_serialize's text (checked; raises "
                  "InvalidArgumentError naming what is wrong).")
      .def("serialize", &ScoreModGraph::Serialize)
      .def("hash", &ScoreModGraph::Hash)
      .def("equal", &ScoreModGraph::Equal, nb::arg("other"))
      .def("describe", &ScoreModGraph::Describe);

  m.def("fwd", &Forward, nb::arg("config"), nb::arg("tensors"), nb::arg("dropout_seed") = 0,
        nb::arg("dropout_offset") = 0, nb::arg("workspace").none() = nb::none(),
        nb::arg("stream") = 0, nb::arg("score_mod").none() = nb::none(),
        "fusedattn_fwd. tensors: dict of q, k, v, o, lse, max_logit, bias, alibi_slopes, "
        "sink_logits, cu_seqlens_q/kv, seq_offsets_q/kv, page_table, seqlens_kv, "
        "score_mod_tensors (a list; absent or None when unused). stream: a cudaStream_t as an "
        "int (0: the default stream). "
        "score_mod: a finalized ScoreModGraph for config.score_mod.");
  m.def("bwd", &Backward, nb::arg("config"), nb::arg("tensors"), nb::arg("dropout_seed") = 0,
        nb::arg("dropout_offset") = 0, nb::arg("workspace").none() = nb::none(),
        nb::arg("stream") = 0, nb::arg("score_mod").none() = nb::none(),
        "fusedattn_bwd. tensors: dict of q, k, v, o, lse, d_o, bias, alibi_slopes, "
        "sink_logits, cu_seqlens_q/kv, seq_offsets_q/kv, dq, dk, dv, dbias, dsink, "
        "score_mod_tensors and d_score_mod_tensors (lists; None where no gradient).");

  m.def(
      "get_backend",
      [](fusedattn_config c, const ScoreModGraph* score_mod) {
        c.score_mod = GraphOf(score_mod);
        fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
        char message[kMessageBytes] = "";
        Check(fusedattn_get_backend(&c, &backend, message, sizeof message), message);
        return nb::make_tuple(nb::str(fusedattn_backend_name(backend)), nb::str(message));
      },
      nb::arg("config"), nb::arg("score_mod").none() = nb::none(),
      "(backend name, diagnostic) for the problem; raises NotSupportedError naming every "
      "backend's reason when none runs it.");
  m.def(
      "fwd_workspace_size",
      [](fusedattn_config c, const ScoreModGraph* score_mod) {
        c.score_mod = GraphOf(score_mod);
        size_t bytes = 0;
        char message[kMessageBytes] = "";
        Check(fusedattn_fwd_workspace_size(&c, &bytes, message, sizeof message), message);
        return bytes;
      },
      nb::arg("config"), nb::arg("score_mod").none() = nb::none());
  m.def(
      "bwd_workspace_size",
      [](fusedattn_config c, const ScoreModGraph* score_mod) {
        c.score_mod = GraphOf(score_mod);
        size_t bytes = 0;
        char message[kMessageBytes] = "";
        Check(fusedattn_bwd_workspace_size(&c, &bytes, message, sizeof message), message);
        return bytes;
      },
      nb::arg("config"), nb::arg("score_mod").none() = nb::none());
  m.def(
      "backend_available",
      [](const std::string& name) {
        char message[kMessageBytes] = "";
        int ok = fusedattn_backend_available(BackendFromName(name), message, sizeof message);
        return nb::make_tuple(ok != 0, nb::str(message));
      },
      nb::arg("name"), "(available, 'available' or the reason it is not)");
  m.def("backend_names", []() {
    nb::list names;
    for (int i = 0; i < FUSEDATTN_BACKEND_COUNT; ++i)
      names.append(nb::str(fusedattn_backend_name(static_cast<fusedattn_backend>(i))));
    return nb::tuple(names);
  });
  m.def(
      "cache_stats",
      [](const std::string& name) {
        fusedattn_cache_stats s{};
        fusedattn_status status = fusedattn_get_cache_stats(BackendFromName(name), &s);
        if (status != FUSEDATTN_SUCCESS)
          Raise(status, "no cache statistics for backend '" + name + "'");
        nb::dict d;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["evictions"] = s.evictions;
        d["entries"] = s.entries;
        d["capacity"] = s.capacity;
        return d;
      },
      nb::arg("name"));
  m.def("status_string", [](int status) {
    return std::string(fusedattn_status_string(static_cast<fusedattn_status>(status)));
  });
  m.def("version", []() { return std::string(fusedattn_version_string()); });
  m.def("version_number", []() { return fusedattn_version(); });
  m.def("cudnn_version", []() { return fusedattn_cudnn_version(); });
}
