// fusedattn's PyTorch operators, registered from C++ so that a call costs what PyTorch's own
// operators cost: fusedattn::fwd and fusedattn::bwd with one kernel for CPU and CUDA tensors over
// the public C API, and autograd in C++ (the backward never enters Python). The Python package
// loads this library with torch.ops.load_library and adds only the fake (shape) functions that
// torch.compile traces with (fusedattn/_torch.py).
//
// The schema keeps the scalars of a problem in one string and a list of ints (see
// fusedattn/_torch.py's encode_problem): the string is built once per structure on the Python
// side, and the ints (max_seqlen_q, max_seqlen_kv, dropout_seed, and the dropout positions when
// a call has them) stay ints so that they may be symbolic under torch.compile. A score modifier
// travels as its serialized graph (fusedattn_score_mod_serialize): a string is a schema type and
// a constant of a compiled graph; the graph is rebuilt once per distinct text and kept in a
// bounded cache.
//
// Errors raise the package's exception classes (fusedattn.InvalidArgumentError, ...) with the
// library's message, also from the backward that the autograd engine runs.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <charconv>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "layout_axes.h"

namespace {

using fusedattn_python::Axes;
using fusedattn_python::AxesOf;

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

constexpr size_t kMessageBytes = 16384;

// Raises fusedattn._errors.error_class(status)(message, status) through torch's python_error, so
// that the caller in Python (directly, through the autograd engine or compiled code) sees the
// package's exception. Outside a Python process: a c10::Error with the message.
[[noreturn]] void Fail(fusedattn_status status, const std::string& message) {
  if (Py_IsInitialized()) {
    pybind11::gil_scoped_acquire gil;
    PyObject* errors = PyImport_ImportModule("fusedattn._errors");
    if (errors != nullptr) {
      PyObject* cls = PyObject_CallMethod(errors, "error_class", "i", static_cast<int>(status));
      if (cls != nullptr) {
        PyObject* text = PyUnicode_FromStringAndSize(message.data(),
                                                     static_cast<Py_ssize_t>(message.size()));
        PyObject* code = PyLong_FromLong(static_cast<long>(status));
        PyObject* exc = text && code ? PyObject_CallFunctionObjArgs(cls, text, code, nullptr)
                                     : nullptr;
        if (exc != nullptr) {
          PyErr_SetObject(cls, exc);
          Py_DECREF(exc);
        }
        Py_XDECREF(text);
        Py_XDECREF(code);
        Py_DECREF(cls);
      }
      Py_DECREF(errors);
    }
    if (PyErr_Occurred()) {
      python_error error;
      error.persist();
      throw error;
    }
  }
  TORCH_CHECK(false, message);
}

[[noreturn]] void FailInvalid(const std::string& message) {
  Fail(FUSEDATTN_ERROR_INVALID_ARGUMENT, message);
}

// ---- the problem string --------------------------------------------------------------------

// The problem's scalars, as fusedattn/_torch.py encodes them:
// "format|mask|window_left|window_right|bias|softcap|softmax|dropout|scale|backend|flags" with the
// C API's enum values and flags = deterministic, is_training, return_lse, bias_requires_grad as
// '0'/'1'.
struct Options {
  fusedattn_format format = FUSEDATTN_FORMAT_BSHD;
  fusedattn_mask mask = FUSEDATTN_MASK_NONE;
  int64_t window_left = -1, window_right = -1;
  fusedattn_bias bias_type = FUSEDATTN_BIAS_NONE;
  double softcap = 0, dropout = 0, scale = 0;
  fusedattn_softmax softmax = FUSEDATTN_SOFTMAX_VANILLA;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  bool deterministic = false, is_training = false, return_lse = false, bias_requires_grad = false;
};

Options ParseOptions(std::string_view text) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    size_t bar = text.find('|', start);
    fields.push_back(text.substr(start, bar == std::string_view::npos ? bar : bar - start));
    if (bar == std::string_view::npos) break;
    start = bar + 1;
  }
  auto bad = [&]() {
    FailInvalid("fusedattn::fwd/bwd: problem string '" + std::string(text) +
                "' is not one that fusedattn._torch.encode_problem makes");
  };
  if (fields.size() != 11 || fields[10].size() != 4) bad();
  auto integer = [&](std::string_view f) {
    int64_t value = 0;
    auto [end, error] = std::from_chars(f.data(), f.data() + f.size(), value);
    if (error != std::errc() || end != f.data() + f.size()) bad();
    return value;
  };
  auto real = [&](std::string_view f) {
    std::string copy(f);
    char* end = nullptr;
    double value = std::strtod(copy.c_str(), &end);
    if (copy.empty() || end != copy.c_str() + copy.size()) bad();
    return value;
  };
  Options o;
  o.format = static_cast<fusedattn_format>(integer(fields[0]));
  o.mask = static_cast<fusedattn_mask>(integer(fields[1]));
  o.window_left = integer(fields[2]);
  o.window_right = integer(fields[3]);
  o.bias_type = static_cast<fusedattn_bias>(integer(fields[4]));
  o.softcap = real(fields[5]);
  o.softmax = static_cast<fusedattn_softmax>(integer(fields[6]));
  o.dropout = real(fields[7]);
  o.scale = real(fields[8]);
  o.backend = static_cast<fusedattn_backend>(integer(fields[9]));
  std::string_view flags = fields[10];
  o.deterministic = flags[0] == '1';
  o.is_training = flags[1] == '1';
  o.return_lse = flags[2] == '1';
  o.bias_requires_grad = flags[3] == '1';
  return o;
}

// Parsed strings, kept per distinct text (a program has a handful of problems). Bounded: cleared
// when it grows past kMaxEntries, which only a program making new problems without end reaches.
template <typename Value>
class TextCache {
 public:
  static constexpr size_t kMaxEntries = 512;
  template <typename Make>
  std::shared_ptr<const Value> Get(std::string_view text, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = entries_.find(std::string(text));
      if (it != entries_.end()) return it->second;
    }
    std::shared_ptr<const Value> made = make(text);  // may raise: nothing is cached then
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() >= kMaxEntries) entries_.clear();
    return entries_.emplace(std::string(text), std::move(made)).first->second;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Value>> entries_;
};

const Options& OptionsOf(std::string_view text, std::shared_ptr<const Options>* keep) {
  static TextCache<Options> cache;
  *keep = cache.Get(text, [](std::string_view t) {
    return std::make_shared<const Options>(ParseOptions(t));
  });
  return **keep;
}

// Per tensor the graph declares, whether it requires grad (the backward writes its gradient).
std::vector<bool> TensorsRequiringGrad(std::string_view score_mod) {
  // The serialized text declares tensors as "tensor <dtype> <axes> <requires_grad> <name>"
  // items, in order, each ended by ';' (flex/serialize.h).
  std::vector<bool> out;
  size_t start = 0;
  while (start < score_mod.size()) {
    size_t end = score_mod.find(';', start);
    if (end == std::string_view::npos) end = score_mod.size();
    std::string_view line = score_mod.substr(start, end - start);
    if (line.substr(0, 7) == "tensor ") {
      size_t a = line.find(' ', 7), b = line.find(' ', a + 1);
      out.push_back(line.substr(b + 1, 1) == "1");
    }
    start = end + 1;
  }
  return out;
}

// A finalized score_mod graph rebuilt from its text ("" = none), with what the backward needs to
// know of its tensors.
struct Graph {
  fusedattn_score_mod* handle = nullptr;
  std::vector<bool> requires_grad;  // per declared tensor
  ~Graph() { fusedattn_score_mod_destroy(handle); }
};

std::shared_ptr<const Graph> GraphOf(std::string_view text) {
  if (text.empty()) return nullptr;
  static TextCache<Graph> cache;
  return cache.Get(text, [](std::string_view t) {
    auto graph = std::make_shared<Graph>();
    char message[kMessageBytes] = "";
    std::string copy(t);
    fusedattn_status status =
        fusedattn_score_mod_deserialize(copy.c_str(), &graph->handle, message, sizeof message);
    if (status != FUSEDATTN_SUCCESS) Fail(status, message);
    graph->requires_grad = TensorsRequiringGrad(t);
    return std::shared_ptr<const Graph>(std::move(graph));
  });
}

// ---- tensors -------------------------------------------------------------------------------

fusedattn_dtype DtypeOf(const char* name, const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return FUSEDATTN_DTYPE_FLOAT32;
    case at::kHalf: return FUSEDATTN_DTYPE_FLOAT16;
    case at::kBFloat16: return FUSEDATTN_DTYPE_BFLOAT16;
    case at::kInt: return FUSEDATTN_DTYPE_INT32;
    default:
      FailInvalid(std::string(name) + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                  ": fusedattn takes float32, float16 and bfloat16 tensors (int32 for index "
                  "tensors)");
  }
}

// Every tensor of a call on q's device.
void CheckDevice(const char* name, const Tensor& t, const Tensor& q) {
  if (t.device() != q.device())
    FailInvalid(std::string(name) + " is on " + t.device().str() + " but q is on " +
                q.device().str() + ": all tensors of a call must be on one device");
}

fusedattn_tensor Describe(const char* name, const Tensor& t, const Tensor& q) {
  fusedattn_tensor out{};
  if (!t.defined()) return out;
  CheckDevice(name, t, q);
  if (t.dim() < 1 || t.dim() > FUSEDATTN_MAX_DIMS)
    FailInvalid(std::string(name) + " has " + std::to_string(t.dim()) +
                " dimensions; fusedattn tensors have 1 to " + std::to_string(FUSEDATTN_MAX_DIMS));
  out.data = t.data_ptr();
  out.dtype = DtypeOf(name, t);
  out.ndim = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) {
    out.shape[i] = t.size(i);
    out.strides[i] = t.stride(i);
  }
  return out;
}

fusedattn_tensor Describe(const char* name, const OptionalTensor& t, const Tensor& q) {
  return t.has_value() ? Describe(name, *t, q) : fusedattn_tensor{};
}

// The inputs both directions take (fusedattn_fwd_args and fusedattn_bwd_args name them alike).
struct CommonInputs {
  const Tensor &q, &k, &v;
  const OptionalTensor &bias, &alibi_slopes, &sinks, &cu_seqlens_q, &cu_seqlens_kv, &seq_offsets_q,
      &seq_offsets_kv;
};

template <typename Args>
void DescribeInputs(const CommonInputs& in, Args* args) {
  const Tensor& q = in.q;
  args->q = Describe("q", q, q);
  args->k = Describe("k", in.k, q);
  args->v = Describe("v", in.v, q);
  args->bias = Describe("bias", in.bias, q);
  args->alibi_slopes = Describe("alibi_slopes", in.alibi_slopes, q);
  args->sink_logits = Describe("sinks", in.sinks, q);
  args->cu_seqlens_q = Describe("cu_seqlens_q", in.cu_seqlens_q, q);
  args->cu_seqlens_kv = Describe("cu_seqlens_kv", in.cu_seqlens_kv, q);
  args->seq_offsets_q = Describe("seq_offsets_q", in.seq_offsets_q, q);
  args->seq_offsets_kv = Describe("seq_offsets_kv", in.seq_offsets_kv, q);
}

const char* LayoutName(fusedattn_format format) {
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD: return "bshd ([batch, seqlen, heads, head_dim])";
    case FUSEDATTN_FORMAT_SBHD: return "sbhd ([seqlen, batch, heads, head_dim])";
    case FUSEDATTN_FORMAT_BHSD: return "bhsd ([batch, heads, seqlen, head_dim])";
    case FUSEDATTN_FORMAT_THD: return "thd ([tokens, heads, head_dim])";
  }
  return "?";
}

// The layout of the pages of a paged K/V cache: the layout's own for dense layouts, bshd
// ([num_pages, page_size, heads_kv, head_dim]) under thd.
fusedattn_format PoolFormat(fusedattn_format format) {
  return format == FUSEDATTN_FORMAT_THD ? FUSEDATTN_FORMAT_BSHD : format;
}

// The ints after [max_seqlen_q, max_seqlen_kv, dropout_seed] when a call places its dropout
// mask in a larger problem (fusedattn/_torch.py's _position_ints): the config's dropout_*
// position fields in their order. Absent: the default positions.
constexpr size_t kDropoutPositions = 6;

// The config of a call from the tensors' shapes and the options. page_table present: k and v
// are pools of pages (PoolFormat), page_size read from their sequence axis, and max_seqlen_kv
// (unless given) what the table holds.
fusedattn_config MakeConfig(const Options& o, const Tensor& q, const Tensor& k, const Tensor& v,
                            const OptionalTensor& bias, const OptionalTensor& cu_seqlens_q,
                            const OptionalTensor& page_table, c10::SymIntArrayRef ints,
                            bool is_training, bool return_lse) {
  bool thd = o.format == FUSEDATTN_FORMAT_THD;
  bool paged = page_table.has_value();
  int64_t rank = thd ? 3 : 4;
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    bool pool = paged && t != &q;
    if (t->dim() != (pool ? 4 : rank))
      FailInvalid(std::string(name) + " has " + std::to_string(t->dim()) +
                  " dimensions but " +
                  (pool ? std::string("a page pool of layout ") + LayoutName(o.format) +
                              " is [num_pages, page_size, heads_kv, head_dim] in its axes: 4"
                        : std::string("layout ") + LayoutName(o.format) + " has " +
                              std::to_string(rank)));
  }
  if (ints.size() != 3 && ints.size() != 3 + kDropoutPositions)
    FailInvalid("fusedattn::fwd/bwd: ints must be [max_seqlen_q, max_seqlen_kv, dropout_seed], "
                "then optionally the six dropout positions (config.dropout_batch_offset, "
                "dropout_heads, dropout_head_offset, dropout_rows, dropout_row_offset, "
                "dropout_key_offset)");
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.is_training = is_training ? 1 : 0;
  if (thd) {
    if (!cu_seqlens_q.has_value())
      FailInvalid("layout 'thd' needs cu_seqlens_q and cu_seqlens_kv (int32 [batch + 1])");
    c.batch = cu_seqlens_q->size(0) - 1;
    c.max_seqlen_q = ints[0].guard_int(__FILE__, __LINE__);
    c.max_seqlen_kv = ints[1].guard_int(__FILE__, __LINE__);
    c.heads_q = q.size(1), c.heads_kv = k.size(1);
    c.head_dim_qk = q.size(2), c.head_dim_v = v.size(2);
  } else {
    Axes a = AxesOf(o.format);
    c.batch = q.size(a.b);
    c.max_seqlen_q = q.size(a.s), c.max_seqlen_kv = k.size(a.s);
    // Dense layouts read the lengths off the shapes; given ones must agree (paged K/V: the
    // key length bound is set below).
    for (auto [name, given, actual] :
         {std::tuple<const char*, int64_t, int64_t>{"max_seqlen_q",
                                                    ints[0].guard_int(__FILE__, __LINE__),
                                                    c.max_seqlen_q},
          {"max_seqlen_kv", paged ? 0 : ints[1].guard_int(__FILE__, __LINE__),
           c.max_seqlen_kv}})
      if (given != 0 && given != actual)
        FailInvalid(std::string(name) + " = " + std::to_string(given) +
                    " but the tensor's seqlen axis (layout " + LayoutName(o.format) + ") is " +
                    std::to_string(actual));
    c.heads_q = q.size(a.h), c.heads_kv = k.size(a.h);
    c.head_dim_qk = q.size(3), c.head_dim_v = v.size(3);
  }
  c.qkv_dtype = c.o_dtype = DtypeOf("q", q);
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = o.format;
  if (paged) {
    c.kv_format = PoolFormat(o.format);
    Axes pool = AxesOf(c.kv_format);
    c.page_size = k.size(pool.s);
    c.heads_kv = k.size(pool.h);
    c.head_dim_v = v.size(3);
    int64_t given = ints[1].guard_int(__FILE__, __LINE__);
    c.max_seqlen_kv = given != 0 ? given
                      : page_table->dim() == 2 ? page_table->size(1) * c.page_size
                                               : c.page_size;  // the library names the bad table
  }
  c.mask = o.mask;
  c.window_left = o.window_left, c.window_right = o.window_right;
  c.bias_type = o.bias_type;
  if (bias.has_value()) {
    if (bias->dim() != 4)
      FailInvalid("bias has " + std::to_string(bias->dim()) +
                  " dimensions but [1|batch, 1|heads_q, max_seqlen_q, max_seqlen_kv] is expected");
    c.bias_batch = bias->size(0), c.bias_heads = bias->size(1);
  }
  c.bias_requires_grad = o.bias_requires_grad && bias.has_value() ? 1 : 0;
  c.softmax_type = o.softmax;
  c.attn_scale = o.scale, c.softcap = o.softcap, c.dropout = o.dropout;
  if (ints.size() == 3 + kDropoutPositions) {
    int64_t* positions[kDropoutPositions] = {&c.dropout_batch_offset, &c.dropout_heads,
                                             &c.dropout_head_offset,  &c.dropout_rows,
                                             &c.dropout_row_offset,   &c.dropout_key_offset};
    for (size_t i = 0; i < kDropoutPositions; ++i)
      *positions[i] = ints[3 + i].guard_int(__FILE__, __LINE__);
  }
  c.deterministic = o.deterministic ? 1 : 0;
  c.return_lse = return_lse ? 1 : 0;
  c.backend = o.backend;
  c.device = q.is_cuda() ? FUSEDATTN_DEVICE_CUDA : FUSEDATTN_DEVICE_CPU;
  return c;
}

std::vector<int64_t> LseShape(fusedattn_format format, const Tensor& q) {
  if (format == FUSEDATTN_FORMAT_THD) return {q.size(0), q.size(1)};
  Axes a = AxesOf(format);
  return {q.size(a.b), q.size(a.h), q.size(a.s)};
}

void* StreamOf(const Tensor& q) {
  if (!q.is_cuda()) return nullptr;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->getStream(q.device())
      .native_handle();
}

// The workspace a call needs (size_of: fusedattn_fwd_workspace_size or _bwd_), from torch's
// allocator on q's device; undefined when none is needed.
using WorkspaceSize = fusedattn_status (*)(const fusedattn_config*, size_t*, char*, size_t);
Tensor Workspace(WorkspaceSize size_of, const fusedattn_config& config, const Tensor& q,
                 size_t* bytes) {
  char message[kMessageBytes] = "";
  *bytes = 0;
  fusedattn_status status = size_of(&config, bytes, message, sizeof message);
  if (status != FUSEDATTN_SUCCESS) Fail(status, message);
  if (*bytes == 0) return Tensor();
  return at::empty({static_cast<int64_t>(*bytes)}, q.options().dtype(at::kByte));
}

uint64_t SeedOf(c10::SymIntArrayRef ints) {
  return static_cast<uint64_t>(ints[2].guard_int(__FILE__, __LINE__));
}

// ---- the kernels (CPU and CUDA) ------------------------------------------------------------

std::tuple<Tensor, Tensor> Forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const OptionalTensor& bias, const OptionalTensor& alibi_slopes,
                                   const OptionalTensor& sinks, const OptionalTensor& cu_seqlens_q,
                                   const OptionalTensor& cu_seqlens_kv,
                                   const OptionalTensor& seq_offsets_q,
                                   const OptionalTensor& seq_offsets_kv,
                                   const OptionalTensor& page_table,
                                   const OptionalTensor& seqlens_kv, at::TensorList mod_tensors,
                                   c10::string_view problem, c10::string_view score_mod,
                                   c10::SymIntArrayRef ints) {
  std::shared_ptr<const Options> keep;
  const Options& o = OptionsOf(std::string_view(problem.data(), problem.size()), &keep);
  std::shared_ptr<const Graph> graph =
      GraphOf(std::string_view(score_mod.data(), score_mod.size()));
  c10::DeviceGuard device(q.device());
  bool want_lse = o.is_training || o.return_lse;
  fusedattn_config config =
      MakeConfig(o, q, k, v, bias, cu_seqlens_q, page_table, ints, o.is_training, o.return_lse);
  config.score_mod = graph ? graph->handle : nullptr;
  bool thd = o.format == FUSEDATTN_FORMAT_THD;
  // THD leaves tokens outside every sequence untouched: zero them rather than leave garbage.
  std::vector<int64_t> o_shape(q.sizes().begin(), q.sizes().end());
  o_shape.back() = v.size(-1);
  Tensor out = thd ? at::zeros(o_shape, q.options()) : at::empty(o_shape, q.options());
  auto lse_options = q.options().dtype(at::kFloat);
  Tensor lse = !want_lse ? at::empty({0}, lse_options)
               : thd     ? at::zeros(LseShape(o.format, q), lse_options)
                         : at::empty(LseShape(o.format, q), lse_options);
  size_t bytes = 0;
  Tensor workspace = Workspace(&fusedattn_fwd_workspace_size, config, q, &bytes);

  fusedattn_fwd_args args = fusedattn_fwd_args_init();
  DescribeInputs({q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
                  seq_offsets_kv},
                 &args);
  args.page_table = Describe("page_table", page_table, q);
  args.seqlens_kv = Describe("seqlens_kv", seqlens_kv, q);
  args.o = Describe("o", out, q);
  if (want_lse) args.lse = Describe("lse", lse, q);
  std::vector<fusedattn_tensor> mods;
  for (const Tensor& t : mod_tensors) mods.push_back(Describe("score_mod tensor", t, q));
  args.num_score_mod_tensors = static_cast<int64_t>(mods.size());
  args.score_mod_tensors = mods.empty() ? nullptr : mods.data();
  args.dropout_seed = SeedOf(ints);
  char message[kMessageBytes] = "";
  void* workspace_data = workspace.defined() ? workspace.data_ptr() : nullptr;
  fusedattn_status status = fusedattn_fwd(&config, &args, workspace_data, bytes, StreamOf(q),
                                          message, sizeof message);
  if (status != FUSEDATTN_SUCCESS) Fail(status, message);
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, std::vector<Tensor>> Backward(
    const Tensor& d_o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
    const Tensor& lse, const OptionalTensor& bias, const OptionalTensor& alibi_slopes,
    const OptionalTensor& sinks, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_kv, const OptionalTensor& seq_offsets_q,
    const OptionalTensor& seq_offsets_kv, at::TensorList mod_tensors, c10::string_view problem,
    c10::string_view score_mod, c10::SymIntArrayRef ints) {
  std::shared_ptr<const Options> keep;
  const Options& opt = OptionsOf(std::string_view(problem.data(), problem.size()), &keep);
  std::string_view mod_text(score_mod.data(), score_mod.size());
  std::shared_ptr<const Graph> graph = GraphOf(mod_text);
  c10::DeviceGuard device(q.device());
  fusedattn_config config =
      MakeConfig(opt, q, k, v, bias, cu_seqlens_q, std::nullopt, ints, /*is_training=*/true,
                 false);
  config.score_mod = graph ? graph->handle : nullptr;
  bool thd = opt.format == FUSEDATTN_FORMAT_THD;
  // Gradients laid out like their inputs (empty_like keeps a dense input's strides): a model
  // that hands over [batch, seq, heads, dim] views of [batch, heads, seq, dim] tensors (the
  // transformers layers after RoPE) then gets gradients its next backward op reads in its own
  // memory order. THD gradients start zeroed: rows outside the sequences are not written.
  auto like = [&](const Tensor& t) {
    return thd ? at::zeros(t.sizes(), t.options()) : at::empty_like(t);
  };
  Tensor dq = like(q), dk = like(k), dv = like(v);
  auto float_options = q.options().dtype(at::kFloat);
  Tensor dbias = config.bias_requires_grad ? at::empty(bias->sizes(), bias->options())
                                           : at::empty({0}, float_options);
  bool sink = opt.softmax == FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  Tensor dsink = sink ? at::empty({config.heads_q}, float_options) : at::empty({0}, float_options);
  const std::vector<bool> wanted = graph ? graph->requires_grad : std::vector<bool>();
  if (wanted.size() != mod_tensors.size())
    FailInvalid("score_mod declares " + std::to_string(wanted.size()) + " tensors but " +
                std::to_string(mod_tensors.size()) + " were given");
  std::vector<Tensor> d_mods;
  for (size_t i = 0; i < mod_tensors.size(); ++i)
    d_mods.push_back(wanted[i] ? at::empty(mod_tensors[i].sizes(), mod_tensors[i].options())
                               : at::empty({0}, mod_tensors[i].options()));

  size_t bytes = 0;
  Tensor workspace = Workspace(&fusedattn_bwd_workspace_size, config, q, &bytes);

  fusedattn_bwd_args args = fusedattn_bwd_args_init();
  DescribeInputs({q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
                  seq_offsets_kv},
                 &args);
  args.o = Describe("o", o, q);
  args.lse = Describe("lse", lse, q);
  args.d_o = Describe("d_o", d_o, q);
  args.dq = Describe("dq", dq, q);
  args.dk = Describe("dk", dk, q);
  args.dv = Describe("dv", dv, q);
  if (config.bias_requires_grad) args.dbias = Describe("dbias", dbias, q);
  if (sink) args.dsink = Describe("dsink", dsink, q);
  std::vector<fusedattn_tensor> mods, grads;
  for (size_t i = 0; i < mod_tensors.size(); ++i) {
    mods.push_back(Describe("score_mod tensor", mod_tensors[i], q));
    grads.push_back(wanted[i] ? Describe("score_mod gradient", d_mods[i], q) : fusedattn_tensor{});
  }
  args.num_score_mod_tensors = static_cast<int64_t>(mods.size());
  args.score_mod_tensors = mods.empty() ? nullptr : mods.data();
  args.d_score_mod_tensors = grads.empty() ? nullptr : grads.data();
  args.dropout_seed = SeedOf(ints);
  char message[kMessageBytes] = "";
  void* workspace_data = workspace.defined() ? workspace.data_ptr() : nullptr;
  fusedattn_status status = fusedattn_bwd(&config, &args, workspace_data, bytes, StreamOf(q),
                                          message, sizeof message);
  if (status != FUSEDATTN_SUCCESS) Fail(status, message);
  return {dq, dk, dv, dbias, dsink, d_mods};
}

// ---- autograd ------------------------------------------------------------------------------

const c10::TypedOperatorHandle<decltype(Forward)>& ForwardOp() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fusedattn::fwd", "")
                             .typed<decltype(Forward)>();
  return op;
}

const c10::TypedOperatorHandle<decltype(Backward)>& BackwardOp() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fusedattn::bwd", "")
                             .typed<decltype(Backward)>();
  return op;
}

Tensor OrUndefined(const OptionalTensor& t) { return t.has_value() ? *t : Tensor(); }
OptionalTensor Optional(const Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

// The forward's inputs in the order of the gradients the backward returns: q, k, v, bias,
// alibi_slopes, sinks, cu_seqlens_q/kv, seq_offsets_q/kv, page_table, seqlens_kv, then one per
// score_mod tensor, then the three non-tensor arguments. (Paged K/V is forward only: the library
// refuses is_training with a page table, so the backward never sees one.)
class Attention : public torch::autograd::Function<Attention> {
 public:
  static constexpr size_t kFixedInputs = 12;  // the tensors before the score_mod tensors

  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
      const OptionalTensor& bias, const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
      const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_kv,
      const OptionalTensor& seq_offsets_q, const OptionalTensor& seq_offsets_kv,
      const OptionalTensor& page_table, const OptionalTensor& seqlens_kv,
      at::TensorList mod_tensors, c10::string_view problem, c10::string_view score_mod,
      c10::SymIntArrayRef ints) {
    Tensor o, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(o, lse) = ForwardOp().call(q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q,
                                          cu_seqlens_kv, seq_offsets_q, seq_offsets_kv,
                                          page_table, seqlens_kv, mod_tensors, problem,
                                          score_mod, ints);
    }
    std::vector<Tensor> saved = {q,
                                 k,
                                 v,
                                 o,
                                 lse,
                                 OrUndefined(bias),
                                 OrUndefined(alibi_slopes),
                                 OrUndefined(sinks),
                                 OrUndefined(cu_seqlens_q),
                                 OrUndefined(cu_seqlens_kv),
                                 OrUndefined(seq_offsets_q),
                                 OrUndefined(seq_offsets_kv)};
    saved.insert(saved.end(), mod_tensors.begin(), mod_tensors.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["problem"] = std::string(problem);
    ctx->saved_data["score_mod"] = std::string(score_mod);
    ctx->saved_data["ints"] = c10::IValue(ints);
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {o, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    std::string problem = ctx->saved_data["problem"].toStringRef();
    std::string score_mod = ctx->saved_data["score_mod"].toStringRef();
    std::vector<c10::SymInt> ints = ctx->saved_data["ints"].toSymIntVector();
    torch::autograd::variable_list saved = ctx->get_saved_variables();
    std::vector<Tensor> mod_tensors(saved.begin() + 12, saved.end());
    Tensor d_o = grads[0];
    // One gradient per forward argument (absent optional tensors and the non-tensor arguments
    // get undefined ones): q, k, v, the nine optional tensors, the score_mod tensors, problem,
    // score_mod, ints.
    torch::autograd::variable_list out(kFixedInputs + mod_tensors.size() + 3);
    if (!d_o.defined()) return out;  // o took no part in the loss
    std::shared_ptr<const Options> keep;
    const Options& o = OptionsOf(problem, &keep);
    if (!o.is_training)
      FailInvalid("fusedattn: the forward ran with is_training=False (no LSE saved) but a "
                  "gradient was asked for");
    // Autograd may hand over an expanded gradient (o.sum() gives stride 0 everywhere); the GPU
    // backends read dO like O, so give them a dense one.
    if (!d_o.is_contiguous()) d_o = d_o.contiguous();
    // The backward has no derivative of its own: unless the caller asked for one (create_graph,
    // which keeps grad mode on and meets the autograd fallback's error), skip the autograd key.
    std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
    if (!torch::autograd::GradMode::is_enabled()) below_autograd.emplace();
    auto [dq, dk, dv, dbias, dsink, d_mods] = BackwardOp().call(
        d_o, saved[0], saved[1], saved[2], saved[3], saved[4], Optional(saved[5]),
        Optional(saved[6]), Optional(saved[7]), Optional(saved[8]), Optional(saved[9]),
        Optional(saved[10]), Optional(saved[11]), mod_tensors, problem, score_mod, ints);
    out[0] = dq, out[1] = dk, out[2] = dv;
    if (o.bias_requires_grad && saved[5].defined()) out[3] = dbias;
    if (saved[7].defined() && o.softmax == FUSEDATTN_SOFTMAX_LEARNABLE_SINK) out[5] = dsink;
    if (std::shared_ptr<const Graph> graph = GraphOf(score_mod)) {
      for (size_t i = 0; i < d_mods.size(); ++i)
        if (graph->requires_grad[i]) out[kFixedInputs + i] = d_mods[i];
    }
    return out;
  }
};

std::tuple<Tensor, Tensor> ForwardAutograd(
    const Tensor& q, const Tensor& k, const Tensor& v, const OptionalTensor& bias,
    const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
    const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_kv,
    const OptionalTensor& seq_offsets_q, const OptionalTensor& seq_offsets_kv,
    const OptionalTensor& page_table, const OptionalTensor& seqlens_kv,
    at::TensorList mod_tensors, c10::string_view problem, c10::string_view score_mod,
    c10::SymIntArrayRef ints) {
  auto outputs = Attention::apply(q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q,
                                  cu_seqlens_kv, seq_offsets_q, seq_offsets_kv, page_table,
                                  seqlens_kv, mod_tensors, problem, score_mod, ints);
  return {outputs[0], outputs[1]};
}

}  // namespace

// A direct Python entry to the operators: the same dispatcher calls as torch.ops.fusedattn.fwd /
// bwd (autograd, the CPU/CUDA kernels, every dispatch key), without the per-call cost of
// torch.ops' schema-driven argument parsing (several microseconds for 14 arguments).
// fusedattn/_torch.py uses it for plain tensors outside torch.compile and __torch_function__
// overrides, and torch.ops otherwise.
#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME _torch_ops
#endif
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fusedattn's PyTorch operators (fusedattn::fwd, fusedattn::bwd) and direct entries";
  m.def(
      "fwd",
      [](const Tensor& q, const Tensor& k, const Tensor& v, const OptionalTensor& bias,
         const OptionalTensor& alibi_slopes, const OptionalTensor& sinks,
         const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_kv,
         const OptionalTensor& seq_offsets_q, const OptionalTensor& seq_offsets_kv,
         const OptionalTensor& page_table, const OptionalTensor& seqlens_kv,
         const std::vector<Tensor>& mod_tensors, const std::string& problem,
         const std::string& score_mod, const std::vector<int64_t>& ints) {
        std::vector<c10::SymInt> sym(ints.begin(), ints.end());
        return ForwardOp().call(q, k, v, bias, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_kv,
                                seq_offsets_q, seq_offsets_kv, page_table, seqlens_kv,
                                mod_tensors, problem, score_mod, sym);
      },
      pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def(
      "bwd",
      [](const Tensor& d_o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
         const Tensor& lse, const OptionalTensor& bias, const OptionalTensor& alibi_slopes,
         const OptionalTensor& sinks, const OptionalTensor& cu_seqlens_q,
         const OptionalTensor& cu_seqlens_kv, const OptionalTensor& seq_offsets_q,
         const OptionalTensor& seq_offsets_kv, const std::vector<Tensor>& mod_tensors,
         const std::string& problem, const std::string& score_mod,
         const std::vector<int64_t>& ints) {
        std::vector<c10::SymInt> sym(ints.begin(), ints.end());
        return BackwardOp().call(d_o, q, k, v, o, lse, bias, alibi_slopes, sinks, cu_seqlens_q,
                                 cu_seqlens_kv, seq_offsets_q, seq_offsets_kv, mod_tensors,
                                 problem, score_mod, sym);
      },
      pybind11::call_guard<pybind11::gil_scoped_release>());
}

TORCH_LIBRARY(fusedattn, m) {
  m.set_python_module("fusedattn._torch");
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? alibi_slopes, Tensor? sinks, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? seq_offsets_q, "
      "Tensor? seq_offsets_kv, Tensor? page_table, Tensor? seqlens_kv, "
      "Tensor[] score_mod_tensors, str problem, str score_mod, SymInt[] ints) -> (Tensor, "
      "Tensor)");
  m.def(
      "bwd(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor? bias, "
      "Tensor? alibi_slopes, Tensor? sinks, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
      "Tensor? seq_offsets_q, Tensor? seq_offsets_kv, Tensor[] score_mod_tensors, str problem, "
      "str score_mod, SymInt[] ints) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor[])");
}

TORCH_LIBRARY_IMPL(fusedattn, CPU, m) {
  m.impl("fwd", &Forward);
  m.impl("bwd", &Backward);
}

TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) {
  m.impl("fwd", &Forward);
  m.impl("bwd", &Backward);
}

// The backward itself has no derivative: a double backward (create_graph=True, then another
// backward through its outputs) raises instead of PyTorch's default of a warning and zeros.
TORCH_LIBRARY_IMPL(fusedattn, Autograd, m) {
  m.impl("fwd", &ForwardAutograd);
  m.impl("bwd", torch::autograd::autogradNotImplementedFallback());
}
