// libFuzzer target for validation and selection: the input bytes become a fusedattn_config (any
// field values: garbage enums, extreme integers and doubles) and forward/backward arguments whose
// tensor descriptors have random dtypes, ranks, shapes and strides. Every entry point is called;
// the library must never crash, never trip a sanitizer, and keep its contract:
//   - every status is a fusedattn_status, every message NUL-terminated inside the caller's buffer,
//     and a failure always says why;
//   - inputs are never written; a failed call writes no output;
//   - a successful call on the reference backend writes exactly the elements the specification
//     says (every logical element of non-THD outputs, the sequence tokens of THD outputs, nothing
//     between strided elements), all finite (LSE and max_logit may be -inf).
//
// Memory: each tensor gets its own heap buffer of exactly the extent its descriptor describes, so
// AddressSanitizer reports any access the descriptor does not allow. A descriptor the library must
// reject (bad rank, non-positive shape, negative stride) gets a one-element buffer. Calls that
// could run are made only when the work is small; larger values still reach validation through
// fusedattn_get_backend and the workspace-size functions.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "fusedattn/fusedattn.h"

namespace {

constexpr int64_t kMaxExtentBytes = 1 << 20;  // per tensor
constexpr double kMaxWork = 1 << 15;          // b * hq * sq * skv * d of a call that may run

// Outcomes of the calls, printed at exit when FUSEDATTN_FUZZ_STATS is set (to see how often the
// decoder reaches successful runs, whose outputs get the strongest checks).
struct Stats {
  uint64_t inputs = 0, selected = 0, fwd_calls = 0, fwd_ok = 0, bwd_calls = 0, bwd_ok = 0;
  uint64_t finite_checked = 0, paged_fwd_calls = 0, paged_fwd_ok = 0;
  ~Stats() {
    if (std::getenv("FUSEDATTN_FUZZ_STATS"))
      std::fprintf(stderr,
                   "fuzz_api stats: inputs %llu, get_backend ok %llu, fwd calls %llu (ok %llu), "
                   "bwd calls %llu (ok %llu), successful calls with finiteness checked %llu, "
                   "paged fwd calls %llu (ok %llu)\n",
                   (unsigned long long)inputs, (unsigned long long)selected,
                   (unsigned long long)fwd_calls, (unsigned long long)fwd_ok,
                   (unsigned long long)bwd_calls, (unsigned long long)bwd_ok,
                   (unsigned long long)finite_checked, (unsigned long long)paged_fwd_calls,
                   (unsigned long long)paged_fwd_ok);
  }
} g_stats;

// The decoded config, printed with a violation so that a crash input explains itself.
std::string g_context;

[[noreturn]] void Violation(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_api: contract violated: %s %s\n  config: %s\n", what,
               detail.c_str(), g_context.c_str());
  std::abort();
}

// ------------------------------------------------------------------------------------------------
// Decoding values
// ------------------------------------------------------------------------------------------------

constexpr int64_t kExtremeInts[] = {0,
                                    -1,
                                    1,
                                    2,
                                    INT32_MAX,
                                    int64_t{INT32_MAX} + 1,
                                    UINT32_MAX,
                                    int64_t{1} << 32,
                                    int64_t{1} << 40,
                                    int64_t{1} << 62,
                                    INT64_MAX,
                                    INT64_MIN,
                                    INT64_MIN + 1,
                                    -2};

// A size-like value: mostly in [lo, hi], sometimes extreme.
int64_t Size(FuzzedDataProvider& in, int64_t lo, int64_t hi) {
  switch (in.ConsumeIntegralInRange<int>(0, 31)) {
    case 31: return in.PickValueInArray(kExtremeInts);
    case 30: return in.ConsumeIntegral<int64_t>();
    case 29: return in.ConsumeIntegralInRange<int64_t>(0, 300);
    default: return in.ConsumeIntegralInRange<int64_t>(lo, hi);
  }
}

// An enum's raw value: mostly one of its `count` values, sometimes anything.
int32_t Enum(FuzzedDataProvider& in, int32_t count) {
  switch (in.ConsumeIntegralInRange<int>(0, 31)) {
    case 31: return in.ConsumeIntegral<int32_t>();
    case 30: return in.PickValueInArray({-1, count, INT32_MIN, INT32_MAX, 255});
    default: return in.ConsumeIntegralInRange<int32_t>(0, count - 1);
  }
}

// True once in n: the rare branch. An exhausted input (which decodes as zeros) takes the usual
// branch.
bool Rare(FuzzedDataProvider& in, int n) { return in.ConsumeIntegralInRange<int>(0, n - 1) == n - 1; }

int32_t Bool(FuzzedDataProvider& in) {
  if (Rare(in, 32)) return in.ConsumeIntegral<int32_t>();
  return in.ConsumeBool() ? 1 : 0;
}

double Real(FuzzedDataProvider& in, std::initializer_list<double> usual) {
  static constexpr double kExtreme[] = {std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        -0.0,
                                        4.9e-324,
                                        1e-300,
                                        1e300,
                                        -1e300,
                                        std::numeric_limits<double>::max(),
                                        -1.0,
                                        1.0,
                                        0.9999999999,
                                        1.0000000001};
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 15: return in.PickValueInArray(kExtreme);
    case 14: {
      uint64_t bits = in.ConsumeIntegral<uint64_t>();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return d;
    }
    default: {
      std::vector<double> values(usual);
      return values[in.ConsumeIntegralInRange<size_t>(0, values.size() - 1)];
    }
  }
}

// Stores a raw integer into an enum field as a C caller could (no C++ enum conversion).
template <typename Enum>
void SetRaw(Enum* field, int32_t value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "enums are int-sized in the C API");
  std::memcpy(field, &value, sizeof value);
}

// Tiny deterministic generator for tensor contents (not fuzz-driven per element).
struct Rng {
  uint64_t state;
  uint64_t next() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (next() >> 11) * 0x1.0p-53; }
};

// ------------------------------------------------------------------------------------------------
// The problem as the fuzzer decoded it, with raw enum values
// ------------------------------------------------------------------------------------------------

struct Decoded {
  fusedattn_config config;
  int32_t q_format, kv_format, o_format, do_format, dqkv_format;
  int32_t qkv_dtype, o_dtype, mask, bias_type, softmax, backend, device;
  bool thd = false, padding = false;
  bool paged = false;  // page_size > 0: k, v are pools of pages with a page table
};

Decoded DecodeConfig(FuzzedDataProvider& in) {
  Decoded d;
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  if (Rare(in, 64)) c.struct_size = in.ConsumeIntegral<size_t>();
  c.is_training = Bool(in);
  c.batch = Size(in, 1, 3);
  c.heads_kv = Size(in, 1, 2);
  int64_t group = in.ConsumeIntegralInRange<int64_t>(1, 2);
  if (in.ConsumeBool() && !__builtin_mul_overflow(c.heads_kv, group, &c.heads_q)) {
    // heads_q = group * heads_kv
  } else {
    c.heads_q = Size(in, 1, 4);
  }
  c.max_seqlen_q = Size(in, 1, 6);
  c.max_seqlen_kv = in.ConsumeBool() ? c.max_seqlen_q : Size(in, 1, 8);
  c.head_dim_qk = Size(in, 1, 8);
  c.head_dim_v = in.ConsumeBool() ? c.head_dim_qk : Size(in, 1, 8);
  d.qkv_dtype = in.ConsumeBool() ? FUSEDATTN_DTYPE_FLOAT32 : Enum(in, 6);
  d.o_dtype = Rare(in, 8) ? Enum(in, 6) : d.qkv_dtype;
  if (Rare(in, 4)) {  // packed variable length
    d.q_format = d.kv_format = d.o_format = d.do_format = d.dqkv_format = FUSEDATTN_FORMAT_THD;
  } else {
    d.q_format = Enum(in, 3);  // THD only through the branch above (or garbage below)
    d.kv_format = in.ConsumeBool() ? d.q_format : Enum(in, 3);
    d.o_format = in.ConsumeBool() ? d.q_format : Enum(in, 3);
    d.do_format = in.ConsumeBool() ? d.o_format : Enum(in, 3);
    d.dqkv_format = in.ConsumeBool() ? d.q_format : Enum(in, 3);
    if (Rare(in, 32)) d.o_format = Enum(in, 4);  // mixed THD
  }
  if (Rare(in, 4)) {  // paged K/V: pools in a dense layout (sometimes not), forward only
    c.page_size = Size(in, 1, 5);
    if (d.kv_format == FUSEDATTN_FORMAT_THD && !Rare(in, 8))
      d.kv_format = in.ConsumeIntegralInRange<int32_t>(0, 2);
    if (!Rare(in, 8)) c.is_training = 0;
  }
  d.mask = Enum(in, 6);
  c.window_left = Rare(in, 4) ? Size(in, -1, 6) : -1;
  c.window_right = Rare(in, 4) ? Size(in, -1, 6) : -1;
  d.bias_type = Enum(in, 4);
  c.bias_batch = in.ConsumeBool() ? 1 : in.ConsumeBool() ? c.batch : Size(in, 0, 4);
  c.bias_heads = in.ConsumeBool() ? 1 : in.ConsumeBool() ? c.heads_q : Size(in, 0, 4);
  c.bias_requires_grad = Rare(in, 4) ? Bool(in) : 0;
  d.softmax = Enum(in, 3);
  c.attn_scale = in.ConsumeBool() ? 0.0 : Real(in, {0.0, 0.125, 1.0, -0.5, 3.0});
  c.softcap = in.ConsumeBool() ? 0.0 : Real(in, {0.0, 0.5, 5.0, 30.0});
  c.dropout = in.ConsumeBool() ? 0.0 : Real(in, {0.0, 0.1, 0.5, 0.9});
  c.deterministic = Bool(in);
  c.return_lse = in.ConsumeBool() ? 0 : Bool(in);
  c.return_max_logit = in.ConsumeBool() ? 0 : Bool(in);
  d.backend = Rare(in, 4) ? Enum(in, 5) : in.PickValueInArray({0, 1});
  d.device = Rare(in, 8) ? Enum(in, 3) : in.PickValueInArray({0, 1});
  SetRaw(&c.qkv_dtype, d.qkv_dtype);
  SetRaw(&c.o_dtype, d.o_dtype);
  SetRaw(&c.q_format, d.q_format);
  SetRaw(&c.kv_format, d.kv_format);
  SetRaw(&c.o_format, d.o_format);
  SetRaw(&c.do_format, d.do_format);
  SetRaw(&c.dqkv_format, d.dqkv_format);
  SetRaw(&c.mask, d.mask);
  SetRaw(&c.bias_type, d.bias_type);
  SetRaw(&c.softmax_type, d.softmax);
  SetRaw(&c.backend, d.backend);
  SetRaw(&c.device, d.device);
  d.config = c;
  char text[1024];
  std::snprintf(text, sizeof text,
                "struct_size=%zu training=%d b=%lld hq=%lld hkv=%lld sq=%lld skv=%lld dqk=%lld "
                "dv=%lld dtype=%d/%d formats=%d,%d,%d,%d,%d mask=%d window=%lld,%lld bias=%d "
                "(%lld,%lld grad=%d) softmax=%d scale=%g softcap=%g dropout=%g det=%d lse=%d "
                "max_logit=%d backend=%d device=%d page_size=%lld",
                c.struct_size, c.is_training, (long long)c.batch, (long long)c.heads_q,
                (long long)c.heads_kv, (long long)c.max_seqlen_q, (long long)c.max_seqlen_kv,
                (long long)c.head_dim_qk, (long long)c.head_dim_v, d.qkv_dtype, d.o_dtype,
                d.q_format, d.kv_format, d.o_format, d.do_format, d.dqkv_format, d.mask,
                (long long)c.window_left, (long long)c.window_right, d.bias_type,
                (long long)c.bias_batch, (long long)c.bias_heads, c.bias_requires_grad, d.softmax,
                c.attn_scale, c.softcap, c.dropout, c.deterministic, c.return_lse,
                c.return_max_logit, d.backend, d.device, (long long)c.page_size);
  g_context = text;
  d.thd = d.q_format == FUSEDATTN_FORMAT_THD;
  d.padding = d.thd || d.mask == FUSEDATTN_MASK_PADDING || d.mask == FUSEDATTN_MASK_PADDING_CAUSAL ||
              d.mask == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  d.paged = c.page_size > 0;
  return d;
}

// ------------------------------------------------------------------------------------------------
// Tensors: descriptors, buffers of exactly their extent, contents
// ------------------------------------------------------------------------------------------------

int64_t ElementBytes(int32_t dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT16:
    case FUSEDATTN_DTYPE_BFLOAT16: return 2;
    case FUSEDATTN_DTYPE_FP8_E4M3:
    case FUSEDATTN_DTYPE_FP8_E5M2: return 1;
    default: return 4;  // float32, int32, and garbage (the largest size)
  }
}

bool IsFloat(int32_t dtype) {
  return dtype == FUSEDATTN_DTYPE_FLOAT32 || dtype == FUSEDATTN_DTYPE_FLOAT16 ||
         dtype == FUSEDATTN_DTYPE_BFLOAT16;
}

enum class Role { kInput, kOutput, kIndex };

struct Tensor {
  const char* name = "";
  Role role = Role::kInput;
  bool present = false;
  int32_t dtype = FUSEDATTN_DTYPE_FLOAT32;
  int32_t ndim = 0;
  int64_t shape[FUSEDATTN_MAX_DIMS] = {};
  int64_t strides[FUSEDATTN_MAX_DIMS] = {};
  // Buffer: exactly the descriptor's extent (or one element for a descriptor that must be
  // refused), and a snapshot to detect writes.
  std::vector<unsigned char> storage, snapshot;
  bool described = false;  // the descriptor is one validation could accept (rank 1..4, ...)
  // Token ranges that a THD output writes (filled in by the caller when known).
  bool thd_tokens = false;  // dimension 0 is a THD token dimension

  int64_t elements() const { return static_cast<int64_t>(storage.size()) / ElementBytes(dtype); }
  fusedattn_tensor desc() {
    fusedattn_tensor t;
    std::memset(&t, 0, sizeof t);
    if (!present) return t;
    t.data = storage.data();
    SetRaw(&t.dtype, dtype);
    t.ndim = ndim;
    for (int i = 0; i < FUSEDATTN_MAX_DIMS; ++i) t.shape[i] = shape[i], t.strides[i] = strides[i];
    return t;
  }
};

// Elements spanned by a descriptor from its first element; -1 when the library must refuse the
// descriptor whatever the config (rank, shape or stride out of range), -2 when it is too large
// for this harness.
int64_t Extent(const Tensor& t) {
  if (t.ndim < 1 || t.ndim > FUSEDATTN_MAX_DIMS) return -1;
  int64_t extent = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 1 || t.strides[i] < 0) return -1;
    int64_t span = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.strides[i], &span) ||
        __builtin_add_overflow(extent, span, &extent))
      return -2;
  }
  if (extent > kMaxExtentBytes / ElementBytes(t.dtype)) return -2;
  return extent;
}

// Strides for `shape` in one of several layouts: dense, padded, permuted, broadcast (zero).
void ChooseStrides(FuzzedDataProvider& in, Tensor* t) {
  int order[FUSEDATTN_MAX_DIMS] = {0, 1, 2, 3};
  int kind = in.ConsumeIntegralInRange<int>(0, 7);
  if (kind == 2)  // permuted: a random order of the dimensions in memory
    for (int i = t->ndim - 1; i > 0; --i) std::swap(order[i], order[in.ConsumeIntegralInRange(0, i)]);
  int64_t stride = 1;
  for (int k = t->ndim - 1; k >= 0; --k) {
    int i = order[k];
    t->strides[i] = stride;
    int64_t pad = kind == 1 ? in.ConsumeIntegralInRange<int64_t>(0, 3) : 0;
    if (__builtin_mul_overflow(stride, std::max<int64_t>(t->shape[i], 1), &stride) ||
        __builtin_add_overflow(stride, pad, &stride))
      stride = INT64_MAX / 4;
  }
  if (kind == 3 && t->ndim > 0)  // broadcast one dimension (only inputs may)
    t->strides[in.ConsumeIntegralInRange<int>(0, t->ndim - 1)] = 0;
}

// A descriptor for a tensor whose expected dtype and shape are given, possibly mutated.
void Describe(FuzzedDataProvider& in, Tensor* t, const char* name, Role role, bool needed,
              int32_t dtype, std::vector<int64_t> shape) {
  t->name = name;
  t->role = role;
  t->present = Rare(in, 32) ? !needed : needed;
  if (!t->present) return;
  t->dtype = dtype;
  t->ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size() && i < FUSEDATTN_MAX_DIMS; ++i) t->shape[i] = shape[i];
  if (role == Role::kIndex) {
    t->strides[0] = 1;
  } else {
    ChooseStrides(in, t);
  }
  // Mutations: what a confused caller passes.
  for (int mutations = 0; mutations < 4 && Rare(in, 8); ++mutations) {
    int dim = in.ConsumeIntegralInRange<int>(0, FUSEDATTN_MAX_DIMS - 1);
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: t->dtype = Enum(in, 6); break;
      case 1: t->ndim = in.ConsumeIntegralInRange<int32_t>(-2, 6); break;
      case 2: {
        int64_t shifted;
        if (!__builtin_add_overflow(t->shape[dim], in.ConsumeIntegralInRange<int64_t>(-2, 2),
                                    &shifted))
          t->shape[dim] = shifted;
        break;
      }
      case 3: t->shape[dim] = Size(in, 0, 8); break;
      case 4: t->strides[dim] = Size(in, 0, 8); break;
      case 5: t->strides[dim] = t->strides[dim] > 0 ? -t->strides[dim] : -1; break;
    }
  }
  int64_t extent = Extent(*t);
  t->described = extent > 0;
  int64_t elements = extent > 0 ? extent : 1;
  if (extent == -2) elements = 1;  // handled by the caller: such a call is not made
  t->storage.assign(static_cast<size_t>(elements * ElementBytes(t->dtype)), 0);
}

void FillInput(Tensor* t, Rng* rng, double lo, double hi) {
  if (!t->present) return;
  if (!IsFloat(t->dtype)) {
    for (auto& byte : t->storage) byte = static_cast<unsigned char>(rng->next());
    return;
  }
  for (int64_t i = 0; i < t->elements(); ++i)
    fusedattn::StoreFromDouble(t->storage.data(), static_cast<fusedattn_dtype>(t->dtype), i,
                               rng->uniform(lo, hi));
}

// Outputs start as all-ones bytes: a NaN in every float format, so a written element (always
// finite or -inf) is told apart from an untouched one.
void Poison(Tensor* t) {
  if (t->present) std::memset(t->storage.data(), 0xFF, t->storage.size());
}

bool IsPoison(const Tensor& t, int64_t i) {
  int64_t n = ElementBytes(t.dtype);
  for (int64_t k = 0; k < n; ++k)
    if (t.storage[static_cast<size_t>(i * n + k)] != 0xFF) return false;
  return true;
}

// Per-sequence lengths and starts written into cu_seqlens / seq_offsets: mostly consistent,
// sometimes garbage.
struct Sequences {
  std::vector<int32_t> cu_q, cu_kv, off_q, off_kv;
  int64_t tokens_q = 1, tokens_kv = 1;
};

Sequences DecodeSequences(FuzzedDataProvider& in, const fusedattn_config& c) {
  Sequences s;
  int64_t batch = std::min<int64_t>(std::max<int64_t>(c.batch, 1), 16);
  auto side = [&](int64_t max_len, std::vector<int32_t>* cu, std::vector<int32_t>* off,
                  int64_t* tokens) {
    cu->assign(batch + 1, 0);
    off->assign(batch + 1, 0);
    int64_t cap = std::min<int64_t>(std::max<int64_t>(max_len, 0), 64);
    for (int64_t b = 0; b < batch; ++b) {
      int64_t len = in.ConsumeIntegralInRange<int64_t>(0, cap);
      int64_t gap = Rare(in, 4) ? in.ConsumeIntegralInRange(1, 2) : 0;
      (*cu)[b + 1] = static_cast<int32_t>((*cu)[b] + len);
      (*off)[b + 1] = static_cast<int32_t>((*off)[b] + len + gap);
    }
    if (Rare(in, 16))  // garbage
      (*cu)[in.ConsumeIntegralInRange<int64_t>(0, batch)] = in.ConsumeIntegral<int32_t>();
    if (Rare(in, 16))
      (*off)[in.ConsumeIntegralInRange<int64_t>(0, batch)] = in.ConsumeIntegral<int32_t>();
    *tokens = std::max<int64_t>(1, std::max<int64_t>((*cu)[batch], (*off)[batch]) +
                                       in.ConsumeIntegralInRange<int>(-1, 2));
  };
  side(c.max_seqlen_q, &s.cu_q, &s.off_q, &s.tokens_q);
  side(c.max_seqlen_kv, &s.cu_kv, &s.off_kv, &s.tokens_kv);
  return s;
}

void FillIndex(Tensor* t, const std::vector<int32_t>& values, Rng* rng) {
  if (!t->present) return;
  if (t->dtype != FUSEDATTN_DTYPE_INT32) return FillInput(t, rng, -4, 4);
  for (int64_t i = 0; i < t->elements(); ++i) {
    int32_t v = i < static_cast<int64_t>(values.size()) ? values[i] : static_cast<int32_t>(rng->next());
    std::memcpy(t->storage.data() + 4 * i, &v, 4);
  }
}

int64_t PlusOne(int64_t v) { return v == INT64_MAX ? v : v + 1; }

// Paged K/V: the pool's page count, and the table's width (what max_seqlen_kv needs, sometimes
// one less or more).
struct Paging {
  int64_t num_pages = 1, width = 1;
};

Paging DecodePaging(FuzzedDataProvider& in, const fusedattn_config& c) {
  Paging p;
  p.num_pages = in.ConsumeIntegralInRange<int64_t>(1, 8);
  if (c.page_size > 0 && c.max_seqlen_kv > 0)
    p.width = c.max_seqlen_kv / c.page_size + (c.max_seqlen_kv % c.page_size != 0);
  if (Rare(in, 8))  // (a huge max_seqlen_kv gives a huge width: stay clear of overflow)
    p.width = std::max<int64_t>(1, std::min<int64_t>(p.width, INT64_MAX - 2) +
                                       in.ConsumeIntegralInRange(-1, 2));
  return p;
}

// Page indices mostly in the pool, sometimes just outside it or anything; key lengths mostly in
// [0, max_seqlen_kv], sometimes not. Every element of the buffer gets a value (gaps too).
void FillPaged(FuzzedDataProvider& in, Tensor* table, Tensor* lengths, int64_t num_pages,
               int64_t max_seqlen_kv, Rng* rng) {
  auto fill = [&](Tensor* t, int64_t hi) {
    if (!t->present) return;
    if (t->dtype != FUSEDATTN_DTYPE_INT32) return FillInput(t, rng, -4, 4);
    for (int64_t i = 0; i < t->elements(); ++i) {
      const uint64_t range = static_cast<uint64_t>(std::max<int64_t>(hi, 1));
      int64_t v = static_cast<int64_t>(rng->next() % range);
      if (Rare(in, 16)) v = in.PickValueInArray<int64_t>({-1, hi, hi + 1, INT32_MAX, INT32_MIN});
      int32_t value = static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX));
      std::memcpy(t->storage.data() + 4 * i, &value, 4);
    }
  };
  fill(table, num_pages);
  fill(lengths, std::min<int64_t>(PlusOne(std::max<int64_t>(max_seqlen_kv, 0)), INT32_MAX));
}

std::vector<int64_t> FormatShape(int32_t format, int64_t batch, int64_t seq, int64_t heads,
                                 int64_t dim, int64_t tokens) {
  switch (format) {
    case FUSEDATTN_FORMAT_SBHD: return {seq, batch, heads, dim};
    case FUSEDATTN_FORMAT_BHSD: return {batch, heads, seq, dim};
    case FUSEDATTN_FORMAT_THD: return {tokens, heads, dim};
    default: return {batch, seq, heads, dim};
  }
}

// ------------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------------

struct Message {
  std::unique_ptr<char[]> buffer;
  size_t length = 0;
  char* data() { return buffer.get(); }
};

// A message buffer of a random size (possibly NULL or 0), filled with non-NUL bytes so a missing
// terminator is seen.
Message MakeMessage(FuzzedDataProvider& in) {
  Message m;
  int kind = in.ConsumeIntegralInRange<int>(0, 7);
  if (kind == 7) return m;  // NULL, 0
  m.length = kind == 6 ? in.ConsumeIntegralInRange<size_t>(0, 3) : 512;
  if (kind == 5) m.length = in.ConsumeIntegralInRange<size_t>(0, 64);
  if (m.length == 0 && in.ConsumeBool()) {
    m.length = in.ConsumeIntegralInRange<size_t>(1, 100);  // NULL with a length
    return m;
  }
  m.buffer.reset(new char[m.length ? m.length : 1]);
  std::memset(m.buffer.get(), 'x', m.length ? m.length : 1);
  return m;
}

void CheckStatus(const char* call, fusedattn_status status, Message& msg) {
  int code = static_cast<int>(status);
  if (code < FUSEDATTN_SUCCESS || code > FUSEDATTN_ERROR_INTERNAL)
    Violation(call, "returned a status outside fusedattn_status: " + std::to_string(code));
  if (status == FUSEDATTN_ERROR_INTERNAL)
    Violation(call, "internal error: " + std::string(msg.data() ? msg.data() : "(no buffer)"));
  if (msg.data() == nullptr || msg.length == 0) return;
  if (std::memchr(msg.data(), '\0', msg.length) == nullptr)
    Violation(call, "message is not NUL-terminated inside its buffer");
  if (status != FUSEDATTN_SUCCESS && msg.length > 1 && msg.data()[0] == '\0')
    Violation(call, "failed without a message");
}

void Snapshot(std::vector<Tensor*>& tensors) {
  for (Tensor* t : tensors) t->snapshot = t->storage;
}

void CheckUnchanged(const char* call, const Tensor& t) {
  if (t.present && t.storage != t.snapshot)
    Violation(call, std::string(t.name) + " was written");
}

// Token membership of THD outputs: [start, start + len) per sequence.
struct TokenRanges {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  bool contains(int64_t token) const {
    for (auto& r : ranges)
      if (token >= r.first && token < r.first + r.second) return true;
    return false;
  }
};

// After a successful call: the elements the specification writes are written and finite (-inf
// allowed where `may_be_neg_inf`), every other element of the buffer is untouched.
void CheckWritten(const char* call, const Tensor& t, const TokenRanges* tokens, bool may_be_neg_inf,
                  bool check_finite) {
  if (!t.present) return;
  std::vector<char> expected(static_cast<size_t>(t.elements()), 0);
  int64_t index[FUSEDATTN_MAX_DIMS] = {0, 0, 0, 0};
  int64_t count = 1;
  for (int i = 0; i < t.ndim; ++i) count *= t.shape[i];
  for (int64_t n = 0; n < count; ++n) {
    int64_t offset = 0;
    for (int i = 0; i < t.ndim; ++i) offset += index[i] * t.strides[i];
    if (tokens == nullptr || tokens->contains(index[0])) expected[static_cast<size_t>(offset)] = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (++index[i] < t.shape[i]) break;
      index[i] = 0;
    }
  }
  for (int64_t i = 0; i < t.elements(); ++i) {
    bool poison = IsPoison(t, i);
    if (!expected[static_cast<size_t>(i)]) {
      if (!poison)
        Violation(call, std::string(t.name) + " element " + std::to_string(i) +
                            " outside what the specification writes was written");
      continue;
    }
    if (poison)
      Violation(call, std::string(t.name) + " element " + std::to_string(i) + " was not written");
    double v = fusedattn::LoadAsDouble(t.storage.data(), static_cast<fusedattn_dtype>(t.dtype), i);
    // Outside the finite range (huge scales, dropout near 1) scores may overflow even double.
    bool ok = std::isfinite(v) || (may_be_neg_inf && v == -INFINITY) || !check_finite;
    if (!ok)
      Violation(call, std::string(t.name) + " element " + std::to_string(i) + " = " +
                          std::to_string(v));
  }
}

TokenRanges Ranges(const Tensor& cu, const Tensor& offsets, int64_t batch) {
  TokenRanges r;
  auto at = [](const Tensor& t, int64_t i) {
    int32_t v;
    std::memcpy(&v, t.storage.data() + 4 * i, 4);
    return int64_t{v};
  };
  for (int64_t b = 0; b < batch; ++b) {
    int64_t len = at(cu, b + 1) - at(cu, b);
    int64_t start = offsets.present ? at(offsets, b) : at(cu, b);
    r.ranges.emplace_back(start, len);
  }
  return r;
}

// ------------------------------------------------------------------------------------------------
// The calls
// ------------------------------------------------------------------------------------------------

struct Run {
  const Decoded& d;
  FuzzedDataProvider& in;
  Rng rng;
  bool may_run;       // small enough that a successful call is cheap
  bool finite_check;  // values in a range where every output must be finite
};

void* Workspace(FuzzedDataProvider& in, std::vector<unsigned char>* storage, size_t* bytes) {
  int kind = in.ConsumeIntegralInRange<int>(0, 3);
  if (kind == 0) {
    *bytes = kind == 0 && in.ConsumeBool() ? in.ConsumeIntegral<size_t>() : 0;  // NULL
    return nullptr;
  }
  storage->assign(in.ConsumeIntegralInRange<size_t>(1, 256), 0);
  *bytes = storage->size();
  return storage->data();
}

void RunForward(Run& r, fusedattn_status workspace_status) {
  const fusedattn_config& c = r.d.config;
  FuzzedDataProvider& in = r.in;
  Sequences seq = DecodeSequences(in, c);
  const int64_t b = c.batch, hq = c.heads_q, hkv = c.heads_kv, sq = c.max_seqlen_q,
                skv = c.max_seqlen_kv, dqk = c.head_dim_qk, dv = c.head_dim_v;
  const int64_t b1 = PlusOne(b);
  Tensor q, k, v, o, lse, max_logit, bias, alibi, sink, cu_q, cu_kv, off_q, off_kv, table,
      lengths;
  const bool lse_packed = r.d.thd && in.ConsumeBool();
  const bool paged = r.d.paged;
  const Paging paging = paged ? DecodePaging(in, c) : Paging{};
  // Paged K/V: pools of num_pages pages of page_size tokens (a page is a "sequence").
  const int64_t kv_batch = paged ? paging.num_pages : b, kv_seq = paged ? c.page_size : skv;
  Describe(in, &q, "q", Role::kInput, true, r.d.qkv_dtype,
           FormatShape(r.d.q_format, b, sq, hq, dqk, seq.tokens_q));
  Describe(in, &k, "k", Role::kInput, true, r.d.qkv_dtype,
           FormatShape(r.d.kv_format, kv_batch, kv_seq, hkv, dqk, seq.tokens_kv));
  Describe(in, &v, "v", Role::kInput, true, r.d.qkv_dtype,
           FormatShape(r.d.kv_format, kv_batch, kv_seq, hkv, dv, seq.tokens_kv));
  Describe(in, &o, "o", Role::kOutput, true, r.d.o_dtype,
           FormatShape(r.d.o_format, b, sq, hq, dv, seq.tokens_q));
  Describe(in, &lse, "lse", Role::kOutput, c.is_training == 1 || c.return_lse == 1,
           FUSEDATTN_DTYPE_FLOAT32,
           lse_packed ? std::vector<int64_t>{seq.tokens_q, hq} : std::vector<int64_t>{b, hq, sq});
  Describe(in, &max_logit, "max_logit", Role::kOutput, c.return_max_logit == 1,
           FUSEDATTN_DTYPE_FLOAT32, {hq});
  const bool tensor_bias =
      r.d.bias_type == FUSEDATTN_BIAS_PRE_SCALE || r.d.bias_type == FUSEDATTN_BIAS_POST_SCALE;
  Describe(in, &bias, "bias", Role::kInput, tensor_bias,
           in.ConsumeBool() ? FUSEDATTN_DTYPE_FLOAT32 : r.d.qkv_dtype,
           {c.bias_batch, c.bias_heads, sq, skv});
  Describe(in, &alibi, "alibi_slopes", Role::kInput, r.d.bias_type == FUSEDATTN_BIAS_ALIBI,
           FUSEDATTN_DTYPE_FLOAT32, {hq});
  Describe(in, &sink, "sink_logits", Role::kInput,
           r.d.softmax == FUSEDATTN_SOFTMAX_LEARNABLE_SINK, FUSEDATTN_DTYPE_FLOAT32, {hq});
  Describe(in, &cu_q, "cu_seqlens_q", Role::kIndex, r.d.padding, FUSEDATTN_DTYPE_INT32, {b1});
  Describe(in, &cu_kv, "cu_seqlens_kv", Role::kIndex, r.d.padding && !paged,
           FUSEDATTN_DTYPE_INT32, {b1});
  Describe(in, &off_q, "seq_offsets_q", Role::kIndex, r.d.thd && in.ConsumeBool(),
           FUSEDATTN_DTYPE_INT32, {b1});
  Describe(in, &off_kv, "seq_offsets_kv", Role::kIndex, r.d.thd && !paged && in.ConsumeBool(),
           FUSEDATTN_DTYPE_INT32, {b1});
  // The page table takes any strides (validation wants its rows contiguous).
  Describe(in, &table, "page_table", Role::kInput, paged, FUSEDATTN_DTYPE_INT32,
           {b, paging.width});
  Describe(in, &lengths, "seqlens_kv", Role::kIndex, paged, FUSEDATTN_DTYPE_INT32, {b});
  std::vector<Tensor*> all = {&q,     &k,    &v,    &o,    &lse,   &max_logit, &bias,  &alibi,
                              &sink, &cu_q, &cu_kv, &off_q, &off_kv, &table,   &lengths};
  for (Tensor* t : all)
    if (t->present && Extent(*t) == -2) return;  // cannot give it memory: not called

  FillInput(&q, &r.rng, -1, 1), FillInput(&k, &r.rng, -1, 1), FillInput(&v, &r.rng, -1, 1);
  FillInput(&bias, &r.rng, -1, 1), FillInput(&alibi, &r.rng, 0, 1);
  FillInput(&sink, &r.rng, -1, 1);
  FillIndex(&cu_q, seq.cu_q, &r.rng), FillIndex(&cu_kv, seq.cu_kv, &r.rng);
  FillIndex(&off_q, seq.off_q, &r.rng), FillIndex(&off_kv, seq.off_kv, &r.rng);
  FillPaged(in, &table, &lengths, paging.num_pages, skv, &r.rng);
  Poison(&o), Poison(&lse), Poison(&max_logit);
  Snapshot(all);

  fusedattn_fwd_args args = fusedattn_fwd_args_init();
  if (Rare(in, 64)) args.struct_size = in.ConsumeIntegral<size_t>();
  args.q = q.desc(), args.k = k.desc(), args.v = v.desc(), args.o = o.desc();
  args.lse = lse.desc(), args.max_logit = max_logit.desc(), args.bias = bias.desc();
  args.alibi_slopes = alibi.desc(), args.sink_logits = sink.desc();
  args.cu_seqlens_q = cu_q.desc(), args.cu_seqlens_kv = cu_kv.desc();
  args.seq_offsets_q = off_q.desc(), args.seq_offsets_kv = off_kv.desc();
  args.page_table = table.desc(), args.seqlens_kv = lengths.desc();
  args.dropout_seed = in.ConsumeIntegral<uint64_t>();
  args.dropout_offset = in.ConsumeIntegral<uint64_t>();
  std::vector<unsigned char> workspace_storage;
  size_t workspace_bytes = 0;
  void* workspace = Workspace(in, &workspace_storage, &workspace_bytes);
  Message msg = MakeMessage(in);

  fusedattn_status st = fusedattn_fwd(&c, &args, workspace, workspace_bytes, nullptr, msg.data(),
                                      msg.length);
  ++g_stats.fwd_calls;
  if (st == FUSEDATTN_SUCCESS) ++g_stats.fwd_ok, g_stats.finite_checked += r.finite_check;
  g_stats.paged_fwd_calls += paged;
  g_stats.paged_fwd_ok += paged && st == FUSEDATTN_SUCCESS;
  CheckStatus("fusedattn_fwd", st, msg);
  for (Tensor* t : all)
    if (t->role != Role::kOutput || st != FUSEDATTN_SUCCESS) CheckUnchanged("fusedattn_fwd", *t);
  if (st != FUSEDATTN_SUCCESS) return;
  if (workspace_status != FUSEDATTN_SUCCESS)
    Violation("fusedattn_fwd", "succeeded where fusedattn_fwd_workspace_size failed");
  TokenRanges q_tokens;
  if (r.d.thd) q_tokens = Ranges(cu_q, off_q, b);
  CheckWritten("fusedattn_fwd o", o, r.d.thd ? &q_tokens : nullptr, false, r.finite_check);
  // The library reads a rank-2 LSE of a THD problem as packed [tokens, heads].
  const bool packed = r.d.thd && lse.ndim == 2;
  CheckWritten("fusedattn_fwd lse", lse, packed ? &q_tokens : nullptr, true, r.finite_check);
  CheckWritten("fusedattn_fwd max_logit", max_logit, nullptr, true, r.finite_check);
}

void RunBackward(Run& r, fusedattn_status workspace_status) {
  const fusedattn_config& c = r.d.config;
  FuzzedDataProvider& in = r.in;
  Sequences seq = DecodeSequences(in, c);
  const int64_t b = c.batch, hq = c.heads_q, hkv = c.heads_kv, sq = c.max_seqlen_q,
                skv = c.max_seqlen_kv, dqk = c.head_dim_qk, dv = c.head_dim_v;
  const int64_t b1 = PlusOne(b);
  Tensor q, k, v, o, lse, d_o, bias, alibi, sink, cu_q, cu_kv, off_q, off_kv, dq, dk, dv_, dbias,
      dsink;
  const bool lse_packed = r.d.thd && in.ConsumeBool();
  const bool tensor_bias =
      r.d.bias_type == FUSEDATTN_BIAS_PRE_SCALE || r.d.bias_type == FUSEDATTN_BIAS_POST_SCALE;
  const bool sinks = r.d.softmax == FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  const int32_t bias_dtype = in.ConsumeBool() ? FUSEDATTN_DTYPE_FLOAT32 : r.d.qkv_dtype;
  Describe(in, &q, "q", Role::kInput, true, r.d.qkv_dtype,
           FormatShape(r.d.q_format, b, sq, hq, dqk, seq.tokens_q));
  Describe(in, &k, "k", Role::kInput, true, r.d.qkv_dtype,
           FormatShape(r.d.kv_format, b, skv, hkv, dqk, seq.tokens_kv));
  Describe(in, &v, "v", Role::kInput, true, r.d.qkv_dtype,
           FormatShape(r.d.kv_format, b, skv, hkv, dv, seq.tokens_kv));
  Describe(in, &o, "o", Role::kInput, true, r.d.o_dtype,
           FormatShape(r.d.o_format, b, sq, hq, dv, seq.tokens_q));
  Describe(in, &lse, "lse", Role::kInput, true, FUSEDATTN_DTYPE_FLOAT32,
           lse_packed ? std::vector<int64_t>{seq.tokens_q, hq} : std::vector<int64_t>{b, hq, sq});
  Describe(in, &d_o, "d_o", Role::kInput, true, r.d.o_dtype,
           FormatShape(r.d.do_format, b, sq, hq, dv, seq.tokens_q));
  Describe(in, &bias, "bias", Role::kInput, tensor_bias, bias_dtype,
           {c.bias_batch, c.bias_heads, sq, skv});
  Describe(in, &alibi, "alibi_slopes", Role::kInput, r.d.bias_type == FUSEDATTN_BIAS_ALIBI,
           FUSEDATTN_DTYPE_FLOAT32, {hq});
  Describe(in, &sink, "sink_logits", Role::kInput, sinks, FUSEDATTN_DTYPE_FLOAT32, {hq});
  Describe(in, &cu_q, "cu_seqlens_q", Role::kIndex, r.d.padding, FUSEDATTN_DTYPE_INT32, {b1});
  Describe(in, &cu_kv, "cu_seqlens_kv", Role::kIndex, r.d.padding, FUSEDATTN_DTYPE_INT32, {b1});
  Describe(in, &off_q, "seq_offsets_q", Role::kIndex, r.d.thd && in.ConsumeBool(),
           FUSEDATTN_DTYPE_INT32, {b1});
  Describe(in, &off_kv, "seq_offsets_kv", Role::kIndex, r.d.thd && in.ConsumeBool(),
           FUSEDATTN_DTYPE_INT32, {b1});
  Describe(in, &dq, "dq", Role::kOutput, true, r.d.qkv_dtype,
           FormatShape(r.d.dqkv_format, b, sq, hq, dqk, seq.tokens_q));
  Describe(in, &dk, "dk", Role::kOutput, true, r.d.qkv_dtype,
           FormatShape(r.d.dqkv_format, b, skv, hkv, dqk, seq.tokens_kv));
  Describe(in, &dv_, "dv", Role::kOutput, true, r.d.qkv_dtype,
           FormatShape(r.d.dqkv_format, b, skv, hkv, dv, seq.tokens_kv));
  Describe(in, &dbias, "dbias", Role::kOutput, c.bias_requires_grad == 1, bias_dtype,
           {c.bias_batch, c.bias_heads, sq, skv});
  Describe(in, &dsink, "dsink", Role::kOutput, sinks, FUSEDATTN_DTYPE_FLOAT32, {hq});
  std::vector<Tensor*> all = {&q,    &k,     &v,     &o,      &lse, &d_o, &bias,
                              &alibi, &sink, &cu_q,  &cu_kv,  &off_q, &off_kv, &dq,
                              &dk,   &dv_,   &dbias, &dsink};
  for (Tensor* t : all)
    if (t->present && Extent(*t) == -2) return;

  FillInput(&q, &r.rng, -1, 1), FillInput(&k, &r.rng, -1, 1), FillInput(&v, &r.rng, -1, 1);
  FillInput(&o, &r.rng, -1, 1), FillInput(&d_o, &r.rng, -1, 1);
  FillInput(&bias, &r.rng, -1, 1), FillInput(&alibi, &r.rng, 0, 1);
  FillInput(&sink, &r.rng, -1, 1);
  // An LSE above every score by log(number of scores) keeps every probability below
  // e^-1 / (b * hq * sq * skv), so every gradient sum stays small and finite.
  double scale = c.attn_scale == 0 ? 1.0 : std::fabs(c.attn_scale);
  double scores = static_cast<double>(b) * hq * sq * skv;
  double bound = std::isfinite(scale) && scores >= 1
                     ? scale * (static_cast<double>(dqk) + 1.0) + 2.0 + std::log(scores)
                     : 0.0;
  FillInput(&lse, &r.rng, std::min(bound, 1e30), std::min(bound, 1e30) + 1.0);
  FillIndex(&cu_q, seq.cu_q, &r.rng), FillIndex(&cu_kv, seq.cu_kv, &r.rng);
  FillIndex(&off_q, seq.off_q, &r.rng), FillIndex(&off_kv, seq.off_kv, &r.rng);
  Poison(&dq), Poison(&dk), Poison(&dv_), Poison(&dbias), Poison(&dsink);
  Snapshot(all);

  fusedattn_bwd_args args = fusedattn_bwd_args_init();
  if (Rare(in, 64)) args.struct_size = in.ConsumeIntegral<size_t>();
  args.q = q.desc(), args.k = k.desc(), args.v = v.desc(), args.o = o.desc();
  args.lse = lse.desc(), args.d_o = d_o.desc(), args.bias = bias.desc();
  args.alibi_slopes = alibi.desc(), args.sink_logits = sink.desc();
  args.cu_seqlens_q = cu_q.desc(), args.cu_seqlens_kv = cu_kv.desc();
  args.seq_offsets_q = off_q.desc(), args.seq_offsets_kv = off_kv.desc();
  args.dq = dq.desc(), args.dk = dk.desc(), args.dv = dv_.desc();
  args.dbias = dbias.desc(), args.dsink = dsink.desc();
  args.dropout_seed = in.ConsumeIntegral<uint64_t>();
  args.dropout_offset = in.ConsumeIntegral<uint64_t>();
  std::vector<unsigned char> workspace_storage;
  size_t workspace_bytes = 0;
  void* workspace = Workspace(in, &workspace_storage, &workspace_bytes);
  Message msg = MakeMessage(in);

  fusedattn_status st = fusedattn_bwd(&c, &args, workspace, workspace_bytes, nullptr, msg.data(),
                                      msg.length);
  ++g_stats.bwd_calls;
  if (st == FUSEDATTN_SUCCESS) ++g_stats.bwd_ok, g_stats.finite_checked += r.finite_check;
  CheckStatus("fusedattn_bwd", st, msg);
  for (Tensor* t : all)
    if (t->role != Role::kOutput || st != FUSEDATTN_SUCCESS) CheckUnchanged("fusedattn_bwd", *t);
  if (st != FUSEDATTN_SUCCESS) return;
  if (workspace_status != FUSEDATTN_SUCCESS)
    Violation("fusedattn_bwd", "succeeded where fusedattn_bwd_workspace_size failed");
  if (r.d.paged) Violation("fusedattn_bwd", "succeeded for paged K/V, which is forward only");
  TokenRanges q_tokens, kv_tokens;
  if (r.d.thd) q_tokens = Ranges(cu_q, off_q, b), kv_tokens = Ranges(cu_kv, off_kv, b);
  const bool f = r.finite_check;
  CheckWritten("fusedattn_bwd dq", dq, r.d.thd ? &q_tokens : nullptr, false, f);
  CheckWritten("fusedattn_bwd dk", dk, r.d.thd ? &kv_tokens : nullptr, false, f);
  CheckWritten("fusedattn_bwd dv", dv_, r.d.thd ? &kv_tokens : nullptr, false, f);
  CheckWritten("fusedattn_bwd dbias", dbias, nullptr, false, f);
  CheckWritten("fusedattn_bwd dsink", dsink, nullptr, false, f);
}

// Whether a successful call would be cheap: the work of the problem's dimensions is small, or
// one of them is below 1 so that validation refuses it. (The bias extents need no bound: the bias
// tensor's own extent bounds them.)
bool SmallWork(const fusedattn_config& c) {
  double work = 1;
  for (int64_t v : {c.batch, c.heads_q, c.heads_kv, c.max_seqlen_q, c.max_seqlen_kv,
                    std::max(c.head_dim_qk, c.head_dim_v)}) {
    if (v < 1) return true;  // refused by validation before any work
    work *= static_cast<double>(v);
  }
  return work <= kMaxWork;
}

// The effective values keep every output finite: bounded scale, dropout keep factor and inputs.
bool FiniteRange(const fusedattn_config& c) {
  double scale = c.attn_scale == 0 ? 1.0 : std::fabs(c.attn_scale);
  return scale <= 8 && c.dropout <= 0.9;
}

void OtherEntryPoints(FuzzedDataProvider& in) {
  int32_t raw = Enum(in, FUSEDATTN_BACKEND_COUNT);
  fusedattn_backend id;
  SetRaw(&id, raw);
  Message msg = MakeMessage(in);
  int available = fusedattn_backend_available(id, msg.data(), msg.length);
  CheckStatus("fusedattn_backend_available", FUSEDATTN_SUCCESS, msg);
  if (available != 0 && available != 1) Violation("fusedattn_backend_available", "not 0 or 1");
  if (fusedattn_backend_name(id) == nullptr) Violation("fusedattn_backend_name", "NULL");
  fusedattn_status status;
  SetRaw(&status, Enum(in, 8));
  if (fusedattn_status_string(status) == nullptr) Violation("fusedattn_status_string", "NULL");
  fusedattn_cache_stats stats;
  fusedattn_get_cache_stats(id, in.ConsumeBool() ? &stats : nullptr);
  std::string name = in.ConsumeRandomLengthString(16);
  fusedattn_backend parsed = FUSEDATTN_BACKEND_AUTO;
  if (fusedattn_backend_from_name(name.c_str(), &parsed) == FUSEDATTN_SUCCESS &&
      std::strcmp(name.c_str(), fusedattn_backend_name(parsed)) != 0)
    Violation("fusedattn_backend_from_name", name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Decoded d = DecodeConfig(in);
  const fusedattn_config* config = Rare(in, 64) ? nullptr : &d.config;

  // Selection and workspace sizes: any values, also huge ones.
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  Message msg = MakeMessage(in);
  fusedattn_status select_status = fusedattn_get_backend(
      config, Rare(in, 64) ? nullptr : &backend, msg.data(), msg.length);
  CheckStatus("fusedattn_get_backend", select_status, msg);
  ++g_stats.inputs;
  g_stats.selected += select_status == FUSEDATTN_SUCCESS;
  if (select_status == FUSEDATTN_SUCCESS && backend != FUSEDATTN_BACKEND_REFERENCE)
    Violation("fusedattn_get_backend", "chose a GPU backend in a CPU build");
  size_t bytes = 0;
  Message fwd_msg = MakeMessage(in);
  fusedattn_status fwd_ws = fusedattn_fwd_workspace_size(config, &bytes, fwd_msg.data(),
                                                         fwd_msg.length);
  CheckStatus("fusedattn_fwd_workspace_size", fwd_ws, fwd_msg);
  Message bwd_msg = MakeMessage(in);
  fusedattn_status bwd_ws = fusedattn_bwd_workspace_size(config, &bytes, bwd_msg.data(),
                                                         bwd_msg.length);
  CheckStatus("fusedattn_bwd_workspace_size", bwd_ws, bwd_msg);

  OtherEntryPoints(in);
  if (config == nullptr) {
    Message m = MakeMessage(in);
    CheckStatus("fusedattn_fwd", fusedattn_fwd(nullptr, nullptr, nullptr, 0, nullptr, m.data(),
                                               m.length), m);
    return 0;
  }
  if (Rare(in, 64)) {  // NULL args
    Message m = MakeMessage(in);
    fusedattn_status st = fusedattn_bwd(&d.config, nullptr, nullptr, 0, nullptr, m.data(), m.length);
    CheckStatus("fusedattn_bwd", st, m);
    if (st == FUSEDATTN_SUCCESS) Violation("fusedattn_bwd", "succeeded with NULL args");
    return 0;
  }
  // Forward and backward with tensors, when a successful call would be cheap.
  if (!SmallWork(d.config)) return 0;
  Run run{d, in, Rng{in.ConsumeIntegral<uint64_t>() | 1}, true, FiniteRange(d.config)};
  RunForward(run, fwd_ws);
  RunBackward(run, bwd_ws);
  return 0;
}
