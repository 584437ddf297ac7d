#include "testing/tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/dtype.h"

#ifdef FUSEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusedattn::testing {

namespace {
size_t ElementBytes(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32:
    case FUSEDATTN_DTYPE_INT32: return 4;
    case FUSEDATTN_DTYPE_FLOAT16:
    case FUSEDATTN_DTYPE_BFLOAT16: return 2;
    default: return 1;
  }
}
constexpr uint32_t kPoison32 = 0x7FC0DEADu;  // a quiet NaN with a payload
constexpr uint16_t kPoisonHalf = 0x7E5Au;
constexpr uint16_t kPoisonBf16 = 0x7FDAu;
constexpr int32_t kPoisonInt = 0x7FFFFFFF;
constexpr uint8_t kPoisonFp8 = 0x7Fu;  // NaN in e4m3 and in e5m2; FP8 outputs saturate, never NaN
}  // namespace

HostTensor::HostTensor(fusedattn_dtype dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  strides_.assign(shape_.size(), 1);
  for (int i = static_cast<int>(shape_.size()) - 2; i >= 0; --i)
    strides_[i] = strides_[i + 1] * shape_[i + 1];
  storage_.assign(static_cast<size_t>(numel()) * ElementBytes(dtype_), 0);
}

HostTensor::HostTensor(fusedattn_dtype dtype, std::vector<int64_t> shape,
                       std::vector<int64_t> strides, int64_t storage_elements)
    : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
  storage_.assign(static_cast<size_t>(storage_elements) * ElementBytes(dtype_), 0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return shape_.empty() ? 0 : n;
}

int64_t HostTensor::storage_elements() const {
  return static_cast<int64_t>(storage_.size() / ElementBytes(dtype_));
}

fusedattn_tensor HostTensor::desc_at(void* base) const {
  fusedattn_tensor t;
  std::memset(&t, 0, sizeof t);
  if (storage_.empty()) return t;
  t.data = base;
  t.dtype = dtype_;
  t.ndim = static_cast<int32_t>(shape_.size());
  for (size_t i = 0; i < shape_.size() && i < FUSEDATTN_MAX_DIMS; ++i) {
    t.shape[i] = shape_[i];
    t.strides[i] = strides_[i];
  }
  return t;
}

double HostTensor::get(int64_t offset) const {
  return LoadAsDouble(storage_.data(), dtype_, offset);
}

void HostTensor::set(int64_t offset, double value) {
  StoreFromDouble(storage_.data(), dtype_, offset, value);
}

int64_t HostTensor::offset_of(const std::vector<int64_t>& index) const {
  int64_t off = 0;
  for (size_t i = 0; i < index.size(); ++i) off += index[i] * strides_[i];
  return off;
}

void HostTensor::fill(double value) {
  for (int64_t i = 0; i < storage_elements(); ++i) set(i, value);
}

void HostTensor::fill_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < storage_elements(); ++i) set(i, dist(rng));
}

void HostTensor::poison() {
  int64_t n = storage_elements();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype_) {
      case FUSEDATTN_DTYPE_FLOAT32:
        std::memcpy(storage_.data() + 4 * i, &kPoison32, 4);
        break;
      case FUSEDATTN_DTYPE_FLOAT16:
        std::memcpy(storage_.data() + 2 * i, &kPoisonHalf, 2);
        break;
      case FUSEDATTN_DTYPE_BFLOAT16:
        std::memcpy(storage_.data() + 2 * i, &kPoisonBf16, 2);
        break;
      case FUSEDATTN_DTYPE_INT32:
        std::memcpy(storage_.data() + 4 * i, &kPoisonInt, 4);
        break;
      case FUSEDATTN_DTYPE_FP8_E4M3:
      case FUSEDATTN_DTYPE_FP8_E5M2:
        storage_[static_cast<size_t>(i)] = kPoisonFp8;
        break;
      default: break;
    }
  }
}

bool HostTensor::is_poison(int64_t offset) const {
  switch (dtype_) {
    case FUSEDATTN_DTYPE_FLOAT32: {
      uint32_t u;
      std::memcpy(&u, storage_.data() + 4 * offset, 4);
      return u == kPoison32;
    }
    case FUSEDATTN_DTYPE_FLOAT16: {
      uint16_t u;
      std::memcpy(&u, storage_.data() + 2 * offset, 2);
      return u == kPoisonHalf;
    }
    case FUSEDATTN_DTYPE_BFLOAT16: {
      uint16_t u;
      std::memcpy(&u, storage_.data() + 2 * offset, 2);
      return u == kPoisonBf16;
    }
    case FUSEDATTN_DTYPE_INT32: {
      int32_t u;
      std::memcpy(&u, storage_.data() + 4 * offset, 4);
      return u == kPoisonInt;
    }
    case FUSEDATTN_DTYPE_FP8_E4M3:
    case FUSEDATTN_DTYPE_FP8_E5M2: return storage_[static_cast<size_t>(offset)] == kPoisonFp8;
    default: return false;
  }
}

std::vector<double> HostTensor::to_vector() const {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(numel()));
  std::vector<int64_t> index(shape_.size(), 0);
  for (int64_t n = 0; n < numel(); ++n) {
    out.push_back(get(offset_of(index)));
    for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
      if (++index[d] < shape_[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

std::vector<int64_t> FormatShape(fusedattn_format format, int64_t batch, int64_t seqlen,
                                 int64_t heads, int64_t dim, int64_t tokens) {
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD: return {batch, seqlen, heads, dim};
    case FUSEDATTN_FORMAT_SBHD: return {seqlen, batch, heads, dim};
    case FUSEDATTN_FORMAT_BHSD: return {batch, heads, seqlen, dim};
    case FUSEDATTN_FORMAT_THD: return {tokens, heads, dim};
  }
  return {};
}

namespace {

// A tensor of `shape`; with padded strides each dimension's stride leaves a gap.
HostTensor MakeTensor(fusedattn_dtype dtype, const std::vector<int64_t>& shape, bool padded) {
  if (!padded) return HostTensor(dtype, shape);
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t extent = shape.back() + 3;  // innermost rows padded by 3 elements
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = extent;
    extent = strides[i] * shape[i] + (i == 0 ? 0 : 1);
  }
  int64_t storage = 1;
  for (size_t i = 0; i < shape.size(); ++i) storage += (shape[i] - 1) * strides[i];
  return HostTensor(dtype, shape, strides, storage + 2);
}

bool IsPaddingMask(fusedattn_mask mask) {
  return mask == FUSEDATTN_MASK_PADDING || mask == FUSEDATTN_MASK_PADDING_CAUSAL ||
         mask == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

HostTensor IndexTensor(const std::vector<int32_t>& values) {
  HostTensor t(FUSEDATTN_DTYPE_INT32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

}  // namespace

ProblemTensors MakeProblemTensors(const fusedattn_config& config, const TensorOptions& opt) {
  ProblemTensors t;
  t.config = config;
  const auto& c = config;
  std::mt19937_64 rng(opt.seed);
  const bool thd = c.q_format == FUSEDATTN_FORMAT_THD;
  const bool varlen = thd || IsPaddingMask(c.mask);
  const bool paged = c.page_size > 0;
  const int64_t B = c.batch;

  auto draw_lengths = [&](const std::vector<int32_t>& given, int64_t max_len,
                          bool per_sequence) {
    std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(max_len));
    if (!per_sequence) return lens;
    if (!given.empty()) return given;
    std::uniform_int_distribution<int64_t> dist(opt.allow_empty_sequences ? 0 : 1, max_len);
    for (int64_t b = 1; b < B; ++b) lens[b] = static_cast<int32_t>(dist(rng));
    return lens;
  };
  t.len_q = draw_lengths(opt.len_q, c.max_seqlen_q, varlen);
  t.len_kv = draw_lengths(opt.len_kv, c.max_seqlen_kv, varlen || paged);

  // Sequence starts: cu_seqlens are the running sums; THD with gaps puts sequences further apart.
  std::vector<int32_t> cu_q(B + 1, 0), cu_kv(B + 1, 0), off_q(B + 1, 0), off_kv(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    cu_q[b + 1] = cu_q[b] + t.len_q[b];
    cu_kv[b + 1] = cu_kv[b] + t.len_kv[b];
    int32_t gap = opt.thd_gaps ? static_cast<int32_t>(1 + b % 3) : 0;
    off_q[b + 1] = off_q[b] + t.len_q[b] + gap;
    off_kv[b + 1] = off_kv[b] + t.len_kv[b] + gap;
  }
  t.start_q.assign(B, 0);
  t.start_kv.assign(B, 0);
  int64_t tokens_q = B * c.max_seqlen_q, tokens_kv = B * c.max_seqlen_kv;
  if (thd) {
    const auto& sq = opt.thd_gaps ? off_q : cu_q;
    const auto& skv = opt.thd_gaps ? off_kv : cu_kv;
    for (int64_t b = 0; b < B; ++b) t.start_q[b] = sq[b], t.start_kv[b] = skv[b];
    tokens_q = std::max<int64_t>(1, sq[B]);
    tokens_kv = std::max<int64_t>(1, skv[B]);
  }
  if (varlen) {
    t.cu_seqlens_q = IndexTensor(cu_q);
    if (!paged) t.cu_seqlens_kv = IndexTensor(cu_kv);
    if (thd && opt.thd_gaps) {
      t.seq_offsets_q = IndexTensor(off_q);
      if (!paged) t.seq_offsets_kv = IndexTensor(off_kv);
    }
  }
  if (paged) {
    // Pages per sequence; with share_prefix the first full pages of sequence b > 0 are those of
    // sequence 0, the others new ones, all drawn from a shuffled pool.
    const int64_t page = c.page_size;
    const int64_t width = (c.max_seqlen_kv + page - 1) / page + opt.extra_table_width;
    std::vector<int64_t> used(B), shared(B, 0);
    int64_t fresh = 0;
    for (int64_t b = 0; b < B; ++b) {
      used[b] = (t.len_kv[b] + page - 1) / page;
      if (opt.share_prefix && b > 0) shared[b] = std::min(t.len_kv[b], t.len_kv[0]) / page;
      fresh += used[b] - shared[b];
    }
    t.num_pages = std::max<int64_t>(1, fresh + opt.spare_pages);
    std::vector<int32_t> order(static_cast<size_t>(t.num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    t.page_table = HostTensor(FUSEDATTN_DTYPE_INT32, {B, width});
    t.page_table.fill(opt.unused_page_entry);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < used[b]; ++e)
        t.page_table.set(b * width + e,
                         e < shared[b] ? t.page_table.get(e) : order[next++]);
    t.seqlens_kv = IndexTensor(t.len_kv);
  }

  const bool padded = opt.padded_strides;
  const double r = opt.input_range;
  auto qkv = [&](fusedattn_format f, fusedattn_dtype dt, int64_t seq, int64_t heads, int64_t dim,
                 int64_t tokens) {
    return MakeTensor(dt, FormatShape(f, B, seq, heads, dim, tokens), padded);
  };
  t.q = qkv(c.q_format, c.qkv_dtype, c.max_seqlen_q, c.heads_q, c.head_dim_qk, tokens_q);
  if (paged) {  // pools of pages: a page is a "sequence" of page_size tokens
    auto pool = [&](int64_t dim) {
      return MakeTensor(c.qkv_dtype,
                        FormatShape(c.kv_format, t.num_pages, c.page_size, c.heads_kv, dim, 0),
                        padded);
    };
    t.k = pool(c.head_dim_qk);
    t.v = pool(c.head_dim_v);
  } else {
    t.k = qkv(c.kv_format, c.qkv_dtype, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk, tokens_kv);
    t.v = qkv(c.kv_format, c.qkv_dtype, c.max_seqlen_kv, c.heads_kv, c.head_dim_v, tokens_kv);
  }
  t.o = qkv(c.o_format, c.o_dtype, c.max_seqlen_q, c.heads_q, c.head_dim_v, tokens_q);
  // do_dtype / dqkv_dtype DEFAULT: o_dtype / qkv_dtype (fusedattn.h).
  const fusedattn_dtype do_dtype = c.do_dtype == FUSEDATTN_DTYPE_DEFAULT ? c.o_dtype : c.do_dtype;
  const fusedattn_dtype dqkv_dtype =
      c.dqkv_dtype == FUSEDATTN_DTYPE_DEFAULT ? c.qkv_dtype : c.dqkv_dtype;
  t.d_o = qkv(c.do_format, do_dtype, c.max_seqlen_q, c.heads_q, c.head_dim_v, tokens_q);
  t.dq = qkv(c.dqkv_format, dqkv_dtype, c.max_seqlen_q, c.heads_q, c.head_dim_qk, tokens_q);
  if (!paged) {  // paged K/V has no backward
    t.dk = qkv(c.dqkv_format, dqkv_dtype, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk,
               tokens_kv);
    t.dv = qkv(c.dqkv_format, dqkv_dtype, c.max_seqlen_kv, c.heads_kv, c.head_dim_v,
               tokens_kv);
  }
  t.q.fill_uniform(rng, -r, r);
  t.k.fill_uniform(rng, -r, r);
  t.v.fill_uniform(rng, -r, r);
  t.d_o.fill_uniform(rng, -r, r);
  // O as an input of the backward: random too, unless the caller copies the forward's result in.
  t.o.fill_uniform(rng, -r, r);

  if (c.is_training || c.return_lse) {
    if (thd && opt.lse_packed)
      t.lse = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {tokens_q, c.heads_q});
    else
      t.lse = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {B, c.heads_q, c.max_seqlen_q});
  }
  if (c.return_max_logit) t.max_logit = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {c.heads_q});
  if (c.bias_type == FUSEDATTN_BIAS_PRE_SCALE || c.bias_type == FUSEDATTN_BIAS_POST_SCALE) {
    std::vector<int64_t> shape = {c.bias_batch, c.bias_heads, c.max_seqlen_q, c.max_seqlen_kv};
    t.bias = MakeTensor(opt.bias_dtype, shape, padded);
    t.bias.fill_uniform(rng, -1.0, 1.0);
    if (c.bias_requires_grad) t.dbias = MakeTensor(opt.bias_dtype, shape, padded);
  }
  if (c.bias_type == FUSEDATTN_BIAS_ALIBI) {
    t.alibi_slopes = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {c.heads_q});
    for (int64_t h = 0; h < c.heads_q; ++h)  // the geometric slopes of the ALiBi paper
      t.alibi_slopes.set(h, std::pow(2.0, -8.0 * (h + 1) / c.heads_q));
  }
  if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK) {
    t.sink_logits = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {c.heads_q});
    t.sink_logits.fill_uniform(rng, -1.0, 1.0);
    t.dsink = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {c.heads_q});
  }
  t.dropout_seed = rng();
  t.dropout_offset = rng() % 1000;
  t.poison_outputs();
  return t;
}

void ProblemTensors::poison_outputs() {
  for (HostTensor* out : {&o, &lse, &max_logit, &dq, &dk, &dv, &dbias, &dsink})
    if (!out->empty()) out->poison();
}

fusedattn_fwd_args ProblemTensors::fwd_args() const {
  fusedattn_fwd_args a = fusedattn_fwd_args_init();
  a.q = q.desc();
  a.k = k.desc();
  a.v = v.desc();
  a.o = o.desc();
  a.lse = lse.desc();
  a.max_logit = max_logit.desc();
  a.bias = bias.desc();
  a.alibi_slopes = alibi_slopes.desc();
  a.sink_logits = sink_logits.desc();
  a.cu_seqlens_q = cu_seqlens_q.desc();
  a.cu_seqlens_kv = cu_seqlens_kv.desc();
  a.seq_offsets_q = seq_offsets_q.desc();
  a.seq_offsets_kv = seq_offsets_kv.desc();
  a.page_table = page_table.desc();
  a.seqlens_kv = seqlens_kv.desc();
  a.dropout_seed = dropout_seed;
  a.dropout_offset = dropout_offset;
  return a;
}

fusedattn_bwd_args ProblemTensors::bwd_args() const {
  fusedattn_bwd_args a = fusedattn_bwd_args_init();
  a.q = q.desc();
  a.k = k.desc();
  a.v = v.desc();
  a.o = o.desc();
  a.lse = lse.desc();
  a.d_o = d_o.desc();
  a.bias = bias.desc();
  a.alibi_slopes = alibi_slopes.desc();
  a.sink_logits = sink_logits.desc();
  a.cu_seqlens_q = cu_seqlens_q.desc();
  a.cu_seqlens_kv = cu_seqlens_kv.desc();
  a.seq_offsets_q = seq_offsets_q.desc();
  a.seq_offsets_kv = seq_offsets_kv.desc();
  a.dropout_seed = dropout_seed;
  a.dropout_offset = dropout_offset;
  a.dq = dq.desc();
  a.dk = dk.desc();
  a.dv = dv.desc();
  a.dbias = dbias.desc();
  a.dsink = dsink.desc();
  return a;
}

Comparison Compare(const HostTensor& out, const HostTensor& ref) {
  Comparison c;
  if (out.storage_elements() != ref.storage_elements() || out.dtype() != ref.dtype()) {
    c.nan = -1;  // layouts differ: report as a failure
    return c;
  }
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < ref.storage_elements(); ++i) {
    bool ref_poison = ref.is_poison(i), out_poison = out.is_poison(i);
    if (ref_poison) {
      if (!out_poison) ++c.touched_unwritten;
      continue;
    }
    if (out_poison) {
      ++c.unwritten;
      continue;
    }
    double r = ref.get(i), o = out.get(i);
    if (std::isinf(r) && r == o) {  // -inf LSE of masked rows
      ++c.compared;
      continue;
    }
    if (!std::isfinite(o) || !std::isfinite(r)) {
      ++c.nan;
      continue;
    }
    diff2 += (o - r) * (o - r);
    ref2 += r * r;
    c.max_abs_error = std::max(c.max_abs_error, std::fabs(o - r));
    ++c.compared;
  }
  c.rel_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return c;
}

std::string Comparison::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "rel_error=%.3g max_abs=%.3g compared=%lld nan=%lld unwritten=%lld "
                "touched_unwritten=%lld",
                rel_error, max_abs_error, (long long)compared, (long long)nan,
                (long long)unwritten, (long long)touched_unwritten);
  return buf;
}

double Tolerance(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return 1e-5;
    case FUSEDATTN_DTYPE_FLOAT16: return 2e-3;
    case FUSEDATTN_DTYPE_BFLOAT16: return 1e-2;
    default: return 0;
  }
}

// ------------------------------------------------------------------------------------------------
// Device mirrors
// ------------------------------------------------------------------------------------------------
namespace {
std::vector<const HostTensor*> AllTensors(const ProblemTensors& t) {
  return {&t.q,  &t.k,  &t.v,  &t.o,  &t.lse, &t.max_logit, &t.bias, &t.alibi_slopes,
          &t.sink_logits, &t.cu_seqlens_q, &t.cu_seqlens_kv, &t.seq_offsets_q,
          &t.seq_offsets_kv, &t.page_table, &t.seqlens_kv, &t.d_o, &t.dq, &t.dk, &t.dv,
          &t.dbias, &t.dsink};
}
std::vector<HostTensor*> Outputs(ProblemTensors* t) {
  return {&t->o, &t->lse, &t->max_logit, &t->dq, &t->dk, &t->dv, &t->dbias, &t->dsink};
}
}  // namespace

DeviceProblem::~DeviceProblem() {
#ifdef FUSEDATTN_WITH_CUDA
  for (auto& b : buffers_) cudaFree(b.second);
#endif
}

void* DeviceProblem::device_ptr(const HostTensor* host_tensor) const {
  for (auto& b : buffers_)
    if (b.first == host_tensor) return b.second;
  return nullptr;
}

bool DeviceProblem::upload(const ProblemTensors& host, std::string* error) {
#ifdef FUSEDATTN_WITH_CUDA
  host_ = &host;
  for (const HostTensor* t : AllTensors(host)) {
    if (t->empty()) continue;
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, t->storage_bytes());
    if (err == cudaSuccess)
      err = cudaMemcpy(ptr, t->data(), t->storage_bytes(), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
      if (error) *error = cudaGetErrorString(err);
      if (ptr) cudaFree(ptr);
      return false;
    }
    buffers_.emplace_back(t, ptr);
  }
  return true;
#else
  if (error) *error = "built without CUDA";
  return false;
#endif
}

// Outputs are matched by their position in Outputs(), so `host` may be another ProblemTensors
// with the same layout (e.g. a copy kept for comparison).
bool DeviceProblem::download_outputs(ProblemTensors* host, std::string* error) const {
#ifdef FUSEDATTN_WITH_CUDA
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    if (error) *error = cudaGetErrorString(err);
    return false;
  }
  auto mine = Outputs(const_cast<ProblemTensors*>(host_));
  auto theirs = Outputs(host);
  for (size_t i = 0; i < mine.size(); ++i) {
    void* ptr = device_ptr(mine[i]);
    if (!ptr || theirs[i]->storage_bytes() != mine[i]->storage_bytes()) continue;
    cudaError_t err =
        cudaMemcpy(theirs[i]->data(), ptr, theirs[i]->storage_bytes(), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
      if (error) *error = cudaGetErrorString(err);
      return false;
    }
  }
  return true;
#else
  if (error) *error = "built without CUDA";
  return false;
#endif
}

bool DeviceProblem::upload_outputs(const ProblemTensors& host, std::string* error) {
#ifdef FUSEDATTN_WITH_CUDA
  auto mine = Outputs(const_cast<ProblemTensors*>(host_));
  auto theirs = Outputs(const_cast<ProblemTensors*>(&host));
  for (size_t i = 0; i < mine.size(); ++i) {
    void* ptr = device_ptr(mine[i]);
    if (!ptr || theirs[i]->storage_bytes() != mine[i]->storage_bytes()) continue;
    cudaError_t err =
        cudaMemcpy(ptr, theirs[i]->data(), theirs[i]->storage_bytes(), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
      if (error) *error = cudaGetErrorString(err);
      return false;
    }
  }
  return true;
#else
  if (error) *error = "built without CUDA";
  return false;
#endif
}

fusedattn_fwd_args DeviceProblem::fwd_args() const {
  fusedattn_fwd_args a = host_->fwd_args();
  auto fix = [&](fusedattn_tensor& d, const HostTensor& h) {
    if (d.data) d.data = device_ptr(&h);
  };
  fix(a.q, host_->q), fix(a.k, host_->k), fix(a.v, host_->v), fix(a.o, host_->o);
  fix(a.lse, host_->lse), fix(a.max_logit, host_->max_logit), fix(a.bias, host_->bias);
  fix(a.alibi_slopes, host_->alibi_slopes), fix(a.sink_logits, host_->sink_logits);
  fix(a.cu_seqlens_q, host_->cu_seqlens_q), fix(a.cu_seqlens_kv, host_->cu_seqlens_kv);
  fix(a.seq_offsets_q, host_->seq_offsets_q), fix(a.seq_offsets_kv, host_->seq_offsets_kv);
  fix(a.page_table, host_->page_table), fix(a.seqlens_kv, host_->seqlens_kv);
  return a;
}

fusedattn_bwd_args DeviceProblem::bwd_args() const {
  fusedattn_bwd_args a = host_->bwd_args();
  auto fix = [&](fusedattn_tensor& d, const HostTensor& h) {
    if (d.data) d.data = device_ptr(&h);
  };
  fix(a.q, host_->q), fix(a.k, host_->k), fix(a.v, host_->v), fix(a.o, host_->o);
  fix(a.lse, host_->lse), fix(a.d_o, host_->d_o), fix(a.bias, host_->bias);
  fix(a.alibi_slopes, host_->alibi_slopes), fix(a.sink_logits, host_->sink_logits);
  fix(a.cu_seqlens_q, host_->cu_seqlens_q), fix(a.cu_seqlens_kv, host_->cu_seqlens_kv);
  fix(a.seq_offsets_q, host_->seq_offsets_q), fix(a.seq_offsets_kv, host_->seq_offsets_kv);
  fix(a.dq, host_->dq), fix(a.dk, host_->dk), fix(a.dv, host_->dv);
  fix(a.dbias, host_->dbias), fix(a.dsink, host_->dsink);
  return a;
}

bool CudaDeviceAvailable() {
#ifdef FUSEDATTN_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

}  // namespace fusedattn::testing
