// The CPU reference backend: the oracle of every other backend and the default without a GPU.
//
// It computes exactly the formulas of fusedattn.h in double precision, one query row at a time,
// for every feature. Inputs in device memory are copied to the host first and outputs copied back
// (read-modify-write, so elements the reference does not define stay untouched). It is slow by
// design: O(b * h * sq * skv * d) with no tiling, easy to read and to trust.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/cuda_util.h"
#include "common/dtype.h"
#include "common/philox.h"
#include "flex/interpreter.h"
#include "flex/score_mod.h"
#include "select/backend.h"

namespace fusedattn {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Number of elements a strided tensor spans from its first element.
int64_t SpanElements(const TensorView& t, int64_t batch, int64_t heads, int64_t seq, int64_t dim,
                     bool thd) {
  int64_t span = 1;
  if (thd) {
    span += (t.num_tokens - 1) * t.stride_s;
  } else {
    span += (batch - 1) * t.stride_b + (seq - 1) * t.stride_s;
  }
  span += (heads - 1) * t.stride_h + (dim - 1) * t.stride_d;
  return span;
}

// Host access to one tensor: the caller's pointer on the CPU, a host copy for CUDA tensors.
class HostBuffer {
 public:
  Status Attach(const void* data, size_t bytes, Device device, void* stream, bool read) {
    device_ = device;
    user_ = const_cast<void*>(data);
    bytes_ = bytes;
    stream_ = stream;
    if (device == Device::kCpu || data == nullptr) {
      host_ = user_;
      return Status::Ok();
    }
    copy_.resize(bytes);
    host_ = copy_.data();
    if (read) return CopyToHost(host_, data, bytes, stream);
    return Status::Ok();
  }
  // Writes the host copy back to the device (no-op on the CPU).
  Status Flush() {
    if (device_ == Device::kCpu || user_ == nullptr) return Status::Ok();
    return CopyToDevice(user_, host_, bytes_, stream_);
  }
  void* host() const { return host_; }

 private:
  Device device_ = Device::kCpu;
  void* user_ = nullptr;
  void* host_ = nullptr;
  size_t bytes_ = 0;
  void* stream_ = nullptr;
  std::vector<unsigned char> copy_;
};

Status AttachView(const TensorView& t, int64_t batch, int64_t heads, int64_t seq, int64_t dim,
                  bool thd, Device device, void* stream, bool read, HostBuffer* buffer) {
  if (!t.present()) return Status::Ok();
  int64_t span = SpanElements(t, batch, heads, seq, dim, thd);
  return buffer->Attach(t.data, static_cast<size_t>(span) * DtypeSize(t.dtype), device, stream,
                        read);
}

// A bias-shaped tensor (bias or dbias), spanning what its own strides reach: bias broadcast axes
// have stride 0 in the view, dbias broadcast axes keep their real strides (validation leaves them).
Status AttachBias(const Problem& p, const BiasView& v, Device device, void* stream,
                  HostBuffer* buffer) {
  if (!v.present()) return Status::Ok();
  const auto& c = p.config;
  int64_t span = 1 + (c.bias_batch - 1) * v.stride_b + (c.bias_heads - 1) * v.stride_h +
                 (c.max_seqlen_q - 1) * v.stride_q + (c.max_seqlen_kv - 1) * v.stride_kv;
  return buffer->Attach(v.data, static_cast<size_t>(span) * DtypeSize(v.dtype), device, stream,
                        true);
}

Status AttachVector(const void* data, int64_t length, int64_t stride, size_t element_bytes,
                    Device device, void* stream, bool read, HostBuffer* buffer) {
  if (data == nullptr) return Status::Ok();
  size_t bytes = static_cast<size_t>((length - 1) * stride + 1) * element_bytes;
  return buffer->Attach(data, bytes, device, stream, read);
}

// Per-sequence lengths, THD token starts and the pages of paged K/V, read (and checked) on the
// host.
struct Sequences {
  std::vector<int64_t> len_q, len_kv, start_q, start_kv;
  int64_t page_size = 0;                   // paged K/V: > 0
  std::vector<std::vector<int32_t>> pages;  // paged K/V: the pages of each sequence's keys

  // Where key j of sequence b is in the k and v views: (batch index, position) to pass to At()
  // with start 0. Paged: the page and the token inside it; else the sequence and its position.
  void LocateKey(int64_t b, int64_t j, int64_t* view_b, int64_t* view_i) const {
    if (page_size > 0) {
      *view_b = pages[b][j / page_size];
      *view_i = j % page_size;
    } else {
      *view_b = b;
      *view_i = start_kv[b] + j;
    }
  }
};

Status ReadIndexArray(const int32_t* data, int64_t count, Device device, void* stream,
                      std::vector<int32_t>* out) {
  out->assign(static_cast<size_t>(count), 0);
  if (count == 0) return Status::Ok();  // a sequence without keys uses no page table entry
  if (device == Device::kCpu) {
    std::memcpy(out->data(), data, static_cast<size_t>(count) * sizeof(int32_t));
    return Status::Ok();
  }
  return CopyToHost(out->data(), data, static_cast<size_t>(count) * sizeof(int32_t), stream);
}

template <typename Tensors>
Status ReadSequences(const Problem& p, const Tensors& t, void* stream, Sequences* seq) {
  const auto& c = p.config;
  const int64_t batch = c.batch;
  seq->len_q.assign(batch, c.max_seqlen_q);
  seq->len_kv.assign(batch, c.max_seqlen_kv);
  seq->start_q.assign(batch, 0);
  seq->start_kv.assign(batch, 0);
  if (!p.padding) return Status::Ok();
  // Paged K/V takes the key lengths from seqlens_kv instead (ReadPages).
  const bool keys = !p.paged;
  std::vector<int32_t> cu_q, cu_kv, off_q, off_kv;
  FUSEDATTN_RETURN_IF_ERROR(ReadIndexArray(t.cu_seqlens_q, batch + 1, p.device, stream, &cu_q));
  if (keys)
    FUSEDATTN_RETURN_IF_ERROR(
        ReadIndexArray(t.cu_seqlens_kv, batch + 1, p.device, stream, &cu_kv));
  if (t.seq_offsets_q)
    FUSEDATTN_RETURN_IF_ERROR(
        ReadIndexArray(t.seq_offsets_q, batch + 1, p.device, stream, &off_q));
  if (keys && t.seq_offsets_kv)
    FUSEDATTN_RETURN_IF_ERROR(
        ReadIndexArray(t.seq_offsets_kv, batch + 1, p.device, stream, &off_kv));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t lq = int64_t{cu_q[b + 1]} - cu_q[b];
    if (lq < 0 || lq > c.max_seqlen_q)
      return InvalidArgument(
          "cu_seqlens_q[%lld..%lld] = %d..%d gives sequence %lld length %lld, outside [0, "
          "max_seqlen_q = %lld]",
          (long long)b, (long long)b + 1, cu_q[b], cu_q[b + 1], (long long)b, (long long)lq,
          (long long)c.max_seqlen_q);
    seq->len_q[b] = lq;
    if (p.thd) {
      int64_t sq = t.seq_offsets_q ? off_q[b] : cu_q[b];
      if (sq < 0 || sq + lq > t.q.num_tokens)
        return InvalidArgument(
            "%s[%lld] = %lld with length %lld runs past the %lld tokens of q",
            t.seq_offsets_q ? "seq_offsets_q" : "cu_seqlens_q", (long long)b, (long long)sq,
            (long long)lq, (long long)t.q.num_tokens);
      seq->start_q[b] = sq;
    }
    if (!keys) continue;
    int64_t lkv = int64_t{cu_kv[b + 1]} - cu_kv[b];
    if (lkv < 0 || lkv > c.max_seqlen_kv)
      return InvalidArgument(
          "cu_seqlens_kv[%lld..%lld] = %d..%d gives sequence %lld length %lld, outside [0, "
          "max_seqlen_kv = %lld]",
          (long long)b, (long long)b + 1, cu_kv[b], cu_kv[b + 1], (long long)b, (long long)lkv,
          (long long)c.max_seqlen_kv);
    seq->len_kv[b] = lkv;
    if (p.thd) {
      int64_t skv = t.seq_offsets_kv ? off_kv[b] : cu_kv[b];
      if (skv < 0 || skv + lkv > t.k.num_tokens)
        return InvalidArgument(
            "%s[%lld] = %lld with length %lld runs past the %lld tokens of k",
            t.seq_offsets_kv ? "seq_offsets_kv" : "cu_seqlens_kv", (long long)b, (long long)skv,
            (long long)lkv, (long long)t.k.num_tokens);
      seq->start_kv[b] = skv;
    }
  }
  return Status::Ok();
}

// Paged K/V: each sequence's key length (seqlens_kv) and the pages its keys are on (the first
// ceil(length / page_size) entries of its page_table row, the only ones read), each checked
// against the pool. Nothing else of the table is looked at.
Status ReadPages(const Problem& p, const FwdTensors& t, void* stream, Sequences* seq) {
  const auto& c = p.config;
  const int64_t batch = c.batch, page_size = c.page_size;
  std::vector<int32_t> lengths;
  FUSEDATTN_RETURN_IF_ERROR(ReadIndexArray(t.seqlens_kv, batch, p.device, stream, &lengths));
  seq->page_size = page_size;
  seq->pages.assign(static_cast<size_t>(batch), {});
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = lengths[b];
    if (length < 0 || length > c.max_seqlen_kv)
      return InvalidArgument("seqlens_kv[%lld] = %lld is outside [0, max_seqlen_kv = %lld]",
                             (long long)b, (long long)length, (long long)c.max_seqlen_kv);
    seq->len_kv[b] = length;
    // Validation checked that a row holds max_seqlen_kv keys: the entries read are in the row.
    const int64_t used = (length + page_size - 1) / page_size;
    std::vector<int32_t>& pages = seq->pages[b];
    FUSEDATTN_RETURN_IF_ERROR(ReadIndexArray(t.page_table + b * t.page_table_stride, used,
                                             p.device, stream, &pages));
    for (int64_t e = 0; e < used; ++e)
      if (pages[e] < 0 || pages[e] >= t.num_pages)
        return InvalidArgument(
            "page_table[%lld, %lld] = %d is not a page of the pool: page indices are in [0, "
            "num_pages = %lld) (sequence %lld has %lld keys on its first %lld entries)",
            (long long)b, (long long)e, pages[e], (long long)t.num_pages, (long long)b,
            (long long)length, (long long)used);
  }
  return Status::Ok();
}

// Element offset of (b, h, i, x) in a view; start is the sequence's THD token start (else 0).
inline int64_t At(const TensorView& t, int64_t b, int64_t h, int64_t i, int64_t x,
                  int64_t start) {
  return b * t.stride_b + (start + i) * t.stride_s + h * t.stride_h + x * t.stride_d;
}

// A row of a view as doubles.
void LoadRow(const TensorView& t, const void* host, int64_t b, int64_t h, int64_t i,
             int64_t start, int64_t dim, double* out) {
  for (int64_t x = 0; x < dim; ++x) out[x] = LoadAsDouble(host, t.dtype, At(t, b, h, i, x, start));
}

// The score pipeline of one (b, h, i, j) before masking, and its derivative ds_final/dt where
// t = scale * (q.k + pre_bias) (for the backward).
struct ScoreParams {
  double scale = 1, softcap = 0;
  fusedattn_bias bias_type = FUSEDATTN_BIAS_NONE;
  const void* bias = nullptr;
  BiasView bias_view;
  const float* alibi = nullptr;
  int64_t alibi_stride = 1;
};

ScoreParams MakeScoreParams(const Problem& p, const void* bias_host, const BiasView& bias_view,
                            const void* alibi_host, int64_t alibi_stride) {
  ScoreParams sp;
  sp.scale = p.scale();
  sp.softcap = p.config.softcap;
  sp.bias_type = p.config.bias_type;
  sp.bias = bias_host;
  sp.bias_view = bias_view;
  sp.alibi = static_cast<const float*>(alibi_host);
  sp.alibi_stride = alibi_stride;
  return sp;
}

double BiasAt(const ScoreParams& sp, int64_t b, int64_t h, int64_t i, int64_t j) {
  const BiasView& v = sp.bias_view;
  return LoadAsDouble(sp.bias, v.dtype, b * v.stride_b + h * v.stride_h + i * v.stride_q +
                                            j * v.stride_kv);
}

double Score(const ScoreParams& sp, double qk, int64_t b, int64_t h, int64_t i, int64_t j,
             int64_t len_q, int64_t len_kv, double* dfinal_dt) {
  double pre = sp.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? BiasAt(sp, b, h, i, j) : 0.0;
  double t = sp.scale * (qk + pre);
  double s = t, derivative = 1.0;
  if (sp.softcap > 0) {
    double th = std::tanh(t / sp.softcap);
    s = sp.softcap * th;
    derivative = 1.0 - th * th;
  }
  if (sp.bias_type == FUSEDATTN_BIAS_POST_SCALE) s += BiasAt(sp, b, h, i, j);
  if (sp.bias_type == FUSEDATTN_BIAS_ALIBI)
    s -= static_cast<double>(sp.alibi[h * sp.alibi_stride]) *
         std::fabs(static_cast<double>(i + len_kv - len_q - j));
  if (dfinal_dt) *dfinal_dt = derivative;
  return s;
}

// ------------------------------------------------------------------------------------------------
// Score modifiers: the problem's graph interpreted at every (b, h, i, j) the mask shows.
// ------------------------------------------------------------------------------------------------

// Extents of the four axes of a score_mod tensor: the problem's, or 1 on axes it leaves out.
std::array<int64_t, 4> AuxExtents(const Problem& p, uint32_t axes) {
  const auto& c = p.config;
  return {axes & FUSEDATTN_SCORE_MOD_AXIS_BATCH ? c.batch : 1,
          axes & FUSEDATTN_SCORE_MOD_AXIS_HEAD ? c.heads_q : 1,
          axes & FUSEDATTN_SCORE_MOD_AXIS_Q ? c.max_seqlen_q : 1,
          axes & FUSEDATTN_SCORE_MOD_AXIS_KV ? c.max_seqlen_kv : 1};
}

// Host copies of the score_mod tensors (and gradients) of a call.
struct AuxBuffers {
  std::vector<HostBuffer> buffers;
  std::vector<flex::TensorRead> reads;  // host views for the interpreter

  Status Attach(const Problem& p, const std::vector<AuxTensorView>& views, Device device,
                void* stream) {
    buffers.resize(views.size());
    reads.resize(views.size());
    for (size_t k = 0; k < views.size(); ++k) {
      const AuxTensorView& v = views[k];
      if (!v.present()) continue;
      std::array<int64_t, 4> e = AuxExtents(p, p.score_mod->tensors()[k].axes);
      int64_t span = 1 + (e[0] - 1) * v.stride_b + (e[1] - 1) * v.stride_h +
                     (e[2] - 1) * v.stride_q + (e[3] - 1) * v.stride_kv;
      FUSEDATTN_RETURN_IF_ERROR(buffers[k].Attach(v.data, static_cast<size_t>(span) *
                                                              DtypeSize(v.dtype),
                                                  device, stream, true));
      flex::TensorRead& r = reads[k];
      r.data = buffers[k].host();
      r.dtype = v.dtype;
      r.stride_b = v.stride_b, r.stride_h = v.stride_h;
      r.stride_q = v.stride_q, r.stride_kv = v.stride_kv;
    }
    return Status::Ok();
  }
  Status Flush() {
    for (HostBuffer& b : buffers) FUSEDATTN_RETURN_IF_ERROR(b.Flush());
    return Status::Ok();
  }
};

// Runs a score_mod program (forward or backward) at the keys of one query row.
class ScoreModRunner {
 public:
  ScoreModRunner(const flex::Program* program, const AuxBuffers* tensors)
      : program_(program), tensors_(tensors) {
    if (program_) values_.resize(program_->nodes.size());
  }
  bool active() const { return program_ != nullptr; }
  void StartRow(int64_t b, int64_t h, int64_t i, int64_t len_q, int64_t len_kv) {
    point_.batch = b, point_.head = h, point_.q_idx = i;
    point_.seqlen_q = len_q, point_.seqlen_kv = len_kv;
  }
  // Evaluates at key j for the pipeline's score s_in. False when the mask_mod hides the key;
  // else *s is the modified score.
  bool Evaluate(int64_t j, double s_in, double* s) {
    point_.kv_idx = j;
    point_.score = s_in;
    flex::Evaluate(program_->nodes, point_, tensors_->reads.data(), values_.data());
    if (program_->mask >= 0 && values_[program_->mask] == 0.0) return false;
    *s = program_->score >= 0 ? values_[program_->score] : s_in;
    return true;
  }
  // After Evaluate on a backward program: d score / d s and d score / d tensor k.
  double d_score() const { return values_[program_->d_score]; }
  double d_tensor(size_t k) const { return values_[program_->d_tensor[k]]; }
  const flex::Point& point() const { return point_; }

 private:
  const flex::Program* program_;
  const AuxBuffers* tensors_;
  flex::Point point_;
  std::vector<double> values_;
};

// The gradient of one score_mod tensor, accumulated in double in the tensor's logical order.
struct AuxGradient {
  std::array<int64_t, 4> extents{1, 1, 1, 1};
  std::vector<double> sum;
  int64_t index(const flex::Point& p) const {
    int64_t b = extents[0] > 1 ? p.batch : 0, h = extents[1] > 1 ? p.head : 0;
    int64_t i = extents[2] > 1 ? p.q_idx : 0, j = extents[3] > 1 ? p.kv_idx : 0;
    return ((b * extents[1] + h) * extents[2] + i) * extents[3] + j;
  }
};

// The extra logit of the softmax denominator: none (-inf), 0 (off-by-one) or the head's sink.
double ExtraLogit(const Problem& p, const float* sinks, int64_t sink_stride, int64_t h) {
  switch (p.config.softmax_type) {
    case FUSEDATTN_SOFTMAX_OFF_BY_ONE: return 0.0;
    case FUSEDATTN_SOFTMAX_LEARNABLE_SINK: return sinks[h * sink_stride];
    default: return kNegInf;
  }
}

// FP8 attention (fusedattn.h, "FP8 attention"): the scaling factors read on the host, checked as
// the header says (the reference reads them anyway, so it always checks), and the amax outputs.
// For a problem that is not FP8 every factor is 1 and nothing is quantized.
struct Fp8Scaling {
  bool on = false;
  fusedattn_dtype s_dtype = FUSEDATTN_DTYPE_FP8_E4M3;   // S_fp8
  fusedattn_dtype dp_dtype = FUSEDATTN_DTYPE_FP8_E4M3;  // dP_fp8: dO's FP8 type
  double descale_q = 1, descale_k = 1, descale_v = 1, descale_o = 1, descale_do = 1;
  double descale_s = 1, descale_dp = 1, scale_s = 1, scale_dp = 1;
  double scale_o = 1, scale_dq = 1, scale_dk = 1, scale_dv = 1;

  // S as the next GEMM reads it: Q8_e4m3(p' * scale_s) * descale_s.
  double QuantizeS(double p) const { return QuantizeFp8(p * scale_s, s_dtype) * descale_s; }
  double QuantizeDp(double dp) const {
    return QuantizeFp8(dp * scale_dp, dp_dtype) * descale_dp;
  }
};

Status ReadScales(const std::vector<NamedScale>& named, Device device, void* stream,
                  std::vector<double>* values) {
  std::vector<float> host(named.size());
  for (size_t k = 0; k < named.size(); ++k) {
    if (device == Device::kCpu) {
      host[k] = *named[k].pointer;
    } else {
      FUSEDATTN_RETURN_IF_ERROR(CopyToHost(&host[k], named[k].pointer, sizeof(float), stream));
    }
  }
  FUSEDATTN_RETURN_IF_ERROR(CheckFp8ScaleValues(named, host.data()));
  values->assign(host.begin(), host.end());
  return Status::Ok();
}

// The factors `named` lists (read, checked) in an Fp8Scaling; one the call does not read (the
// forward's list has no backward factor, the backward's no scale_o) stays 1.
Status ReadFp8Scaling(const std::vector<NamedScale>& named, Device device, void* stream,
                      Fp8Scaling* out) {
  std::vector<double> values;
  FUSEDATTN_RETURN_IF_ERROR(ReadScales(named, device, stream, &values));
  auto value = [&](const char* name) {
    for (size_t k = 0; k < named.size(); ++k)
      if (std::strcmp(named[k].name, name) == 0) return values[k];
    return 1.0;
  };
  Fp8Scaling f;
  f.on = true;
  f.descale_q = value("descale_q");
  f.descale_k = value("descale_k");
  f.descale_v = value("descale_v");
  f.descale_o = value("descale_o");
  f.descale_do = value("descale_do");
  f.descale_s = value("descale_s");
  f.descale_dp = value("descale_dp");
  f.scale_s = value("scale_s");
  f.scale_dp = value("scale_dp");
  f.scale_o = value("scale_o");
  f.scale_dq = value("scale_dq");
  f.scale_dk = value("scale_dk");
  f.scale_dv = value("scale_dv");
  *out = f;
  return Status::Ok();
}

Status ReadFp8Scaling(const Problem& p, const Fp8FwdScales& s, void* stream, Fp8Scaling* out) {
  if (!p.fp8) return Status::Ok();
  return ReadFp8Scaling(Fp8ScalesRead(s), p.device, stream, out);
}

Status ReadFp8Scaling(const Problem& p, const Fp8BwdScales& s, void* stream, Fp8Scaling* out) {
  if (!p.fp8) return Status::Ok();
  FUSEDATTN_RETURN_IF_ERROR(ReadFp8Scaling(Fp8ScalesRead(s), p.device, stream, out));
  out->dp_dtype = p.config.do_dtype;
  return Status::Ok();
}

Status WriteAmax(float* amax, double value, Device device, void* stream) {
  const float v = static_cast<float>(value);
  if (device == Device::kCpu) {
    *amax = v;
    return Status::Ok();
  }
  return CopyToDevice(amax, &v, sizeof v, stream);
}

void Scale(std::vector<double>* row, double factor) {
  if (factor != 1.0)
    for (double& x : *row) x *= factor;
}

class ReferenceBackendImpl final : public Backend {
 public:
  fusedattn_backend id() const override { return FUSEDATTN_BACKEND_REFERENCE; }
  const char* name() const override { return "reference"; }
  Status available() const override { return Status::Ok(); }
  Status check(const Problem& problem) override {
    if (problem.device == Device::kCuda && !HasCudaDevice())
      return NotSupported("CUDA tensors but no CUDA device to copy them from");
    return Status::Ok();
  }
  Status fwd_workspace_size(const Problem&, size_t* bytes) override {
    *bytes = 0;
    return Status::Ok();
  }
  Status bwd_workspace_size(const Problem&, size_t* bytes) override {
    *bytes = 0;
    return Status::Ok();
  }
  Status forward(const Problem& p, const FwdTensors& t, void*, size_t, void* stream) override;
  Status backward(const Problem& p, const BwdTensors& t, void*, size_t, void* stream) override;
};

Status ReferenceBackendImpl::forward(const Problem& p, const FwdTensors& t, void*, size_t,
                                     void* stream) {
  const auto& c = p.config;
  const int64_t B = c.batch, HQ = c.heads_q, HKV = c.heads_kv, SQ = c.max_seqlen_q,
                SKV = c.max_seqlen_kv, DQK = c.head_dim_qk, DV = c.head_dim_v;
  const Device dev = p.device;
  Sequences seq;
  FUSEDATTN_RETURN_IF_ERROR(ReadSequences(p, t, stream, &seq));
  if (p.paged) FUSEDATTN_RETURN_IF_ERROR(ReadPages(p, t, stream, &seq));
  Fp8Scaling fp8;
  FUSEDATTN_RETURN_IF_ERROR(ReadFp8Scaling(p, t.fp8, stream, &fp8));
  double amax_s = 0, amax_o = 0;

  HostBuffer q, k, v, o, lse, bias, alibi, sinks, max_logit;
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.q, B, HQ, SQ, DQK, p.thd, dev, stream, true, &q));
  // K and V: the sequences' rows, or the whole pools of paged K/V.
  const int64_t kv_batch = p.paged ? t.num_pages : B, kv_seq = p.paged ? c.page_size : SKV;
  const bool kv_packed = p.thd && !p.paged;
  FUSEDATTN_RETURN_IF_ERROR(
      AttachView(t.k, kv_batch, HKV, kv_seq, DQK, kv_packed, dev, stream, true, &k));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachView(t.v, kv_batch, HKV, kv_seq, DV, kv_packed, dev, stream, true, &v));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.o, B, HQ, SQ, DV, p.thd, dev, stream, true, &o));
  if (t.lse.present())
    FUSEDATTN_RETURN_IF_ERROR(
        AttachView(t.lse, B, HQ, SQ, 1, t.lse_packed, dev, stream, true, &lse));
  FUSEDATTN_RETURN_IF_ERROR(AttachBias(p, t.bias, dev, stream, &bias));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachVector(t.alibi_slopes, HQ, t.alibi_stride, 4, dev, stream, true, &alibi));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachVector(t.sink_logits, HQ, t.sink_stride, 4, dev, stream, true, &sinks));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachVector(t.max_logit, HQ, t.max_logit_stride, 4, dev, stream, true, &max_logit));
  AuxBuffers aux;
  if (p.score_mod) FUSEDATTN_RETURN_IF_ERROR(aux.Attach(p, t.score_mod_tensors, dev, stream));
  ScoreModRunner mod(p.score_mod ? &p.score_mod->forward() : nullptr, &aux);

  const ScoreParams sp = MakeScoreParams(p, bias.host(), t.bias, alibi.host(), t.alibi_stride);
  const float* sink_host = static_cast<const float*>(sinks.host());
  const double keep_scale = 1.0 / (1.0 - c.dropout);
  const int64_t group = p.group_size();

  std::vector<double> max_logits(HQ, kNegInf);
  std::vector<double> qrow(DQK), krow(DQK), vrow(DV), scores(SKV), out(DV);
  std::vector<char> visible(SKV);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lq = seq.len_q[b], lkv = seq.len_kv[b];
    // Rows that exist in the output tensors: all of max_seqlen_q, or only the sequence in THD.
    const int64_t rows = p.thd ? lq : SQ;
    for (int64_t h = 0; h < HQ; ++h) {
      const int64_t hk = h / group;
      const double extra = ExtraLogit(p, sink_host, t.sink_stride, h);
      for (int64_t i = 0; i < rows; ++i) {
        int64_t lo = 0, hi = 0;
        p.visible_keys(i, lq, lkv, &lo, &hi);
        std::fill(out.begin(), out.end(), 0.0);
        double row_lse = kNegInf;
        double m = kNegInf;  // the row's largest visible score
        if (lo < hi) {
          LoadRow(t.q, q.host(), b, h, i, seq.start_q[b], DQK, qrow.data());
          Scale(&qrow, fp8.descale_q);
          if (mod.active()) mod.StartRow(b, h, i, lq, lkv);
          for (int64_t j = lo; j < hi; ++j) {
            int64_t kb = 0, kj = 0;
            seq.LocateKey(b, j, &kb, &kj);
            LoadRow(t.k, k.host(), kb, hk, kj, 0, DQK, krow.data());
            Scale(&krow, fp8.descale_k);
            double qk = 0;
            for (int64_t x = 0; x < DQK; ++x) qk += qrow[x] * krow[x];
            scores[j] = Score(sp, qk, b, h, i, j, lq, lkv, nullptr);
            visible[j] = !mod.active() || mod.Evaluate(j, scores[j], &scores[j]);
            if (visible[j]) m = std::max(m, scores[j]);
          }
          max_logits[h] = std::max(max_logits[h], m);
        }
        // Fully masked: no visible key (the mask_mod may hide them all), or every visible score
        // is -inf (a score_mod's doing) and no extra logit is there to normalize against.
        bool any_visible = false;
        for (int64_t j = lo; j < hi; ++j) any_visible |= visible[j] != 0;
        if (!any_visible || (m == kNegInf && extra == kNegInf)) lo = hi;
        if (lo < hi) {
          double mm = std::max(m, extra);
          double sum = std::exp(extra - mm);  // 0 for vanilla (extra = -inf)
          for (int64_t j = lo; j < hi; ++j)
            if (visible[j]) sum += std::exp(scores[j] - mm);
          row_lse = mm + std::log(sum);
          DropoutRow drop{};
          if (c.dropout > 0)
            drop = p.dropout_row(t.dropout_seed, t.dropout_offset, b, h, i);
          for (int64_t j = lo; j < hi; ++j) {
            if (!visible[j]) continue;
            double prob = std::exp(scores[j] - row_lse);
            if (c.dropout > 0) prob = drop.Keep(p.dropout_key(j)) ? prob * keep_scale : 0.0;
            if (fp8.on) {
              amax_s = std::max(amax_s, prob);
              prob = fp8.QuantizeS(prob);
            }
            if (prob == 0.0) continue;
            int64_t vb = 0, vj = 0;
            seq.LocateKey(b, j, &vb, &vj);
            LoadRow(t.v, v.host(), vb, hk, vj, 0, DV, vrow.data());
            Scale(&vrow, fp8.descale_v);
            for (int64_t x = 0; x < DV; ++x) out[x] += prob * vrow[x];
          }
        }
        for (int64_t x = 0; x < DV; ++x) {
          amax_o = std::max(amax_o, std::fabs(out[x]));
          StoreFromDouble(o.host(), t.o.dtype, At(t.o, b, h, i, x, seq.start_q[b]),
                          out[x] * fp8.scale_o);
        }
        if (t.lse.present()) {
          int64_t start = t.lse_packed ? seq.start_q[b] : 0;
          StoreFromDouble(lse.host(), FUSEDATTN_DTYPE_FLOAT32,
                          b * t.lse.stride_b + (start + i) * t.lse.stride_s + h * t.lse.stride_h,
                          row_lse);
        }
      }
      // LSE in [batch, heads, max_seqlen_q] for THD: the rows past the sequence are -inf.
      if (t.lse.present() && p.thd && !t.lse_packed)
        for (int64_t i = lq; i < SQ; ++i)
          StoreFromDouble(lse.host(), FUSEDATTN_DTYPE_FLOAT32,
                          b * t.lse.stride_b + i * t.lse.stride_s + h * t.lse.stride_h, kNegInf);
    }
  }
  if (t.max_logit)
    for (int64_t h = 0; h < HQ; ++h)
      static_cast<float*>(max_logit.host())[h * t.max_logit_stride] =
          static_cast<float>(max_logits[h]);

  FUSEDATTN_RETURN_IF_ERROR(o.Flush());
  FUSEDATTN_RETURN_IF_ERROR(lse.Flush());
  FUSEDATTN_RETURN_IF_ERROR(max_logit.Flush());
  if (fp8.on) {
    FUSEDATTN_RETURN_IF_ERROR(WriteAmax(t.fp8.amax_s, amax_s, dev, stream));
    FUSEDATTN_RETURN_IF_ERROR(WriteAmax(t.fp8.amax_o, amax_o, dev, stream));
  }
  return Status::Ok();
}

Status ReferenceBackendImpl::backward(const Problem& p, const BwdTensors& t, void*, size_t,
                                      void* stream) {
  const auto& c = p.config;
  const int64_t B = c.batch, HQ = c.heads_q, HKV = c.heads_kv, SQ = c.max_seqlen_q,
                SKV = c.max_seqlen_kv, DQK = c.head_dim_qk, DV = c.head_dim_v;
  const Device dev = p.device;
  Sequences seq;
  FUSEDATTN_RETURN_IF_ERROR(ReadSequences(p, t, stream, &seq));
  Fp8Scaling fp8;
  FUSEDATTN_RETURN_IF_ERROR(ReadFp8Scaling(p, t.fp8, stream, &fp8));
  double amax_dp = 0;

  HostBuffer q, k, v, o, d_o, lse, bias, alibi, sinks, dq, dk, dv, dbias, dsink;
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.q, B, HQ, SQ, DQK, p.thd, dev, stream, true, &q));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.k, B, HKV, SKV, DQK, p.thd, dev, stream, true, &k));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.v, B, HKV, SKV, DV, p.thd, dev, stream, true, &v));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.o, B, HQ, SQ, DV, p.thd, dev, stream, true, &o));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.d_o, B, HQ, SQ, DV, p.thd, dev, stream, true, &d_o));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachView(t.lse, B, HQ, SQ, 1, t.lse_packed, dev, stream, true, &lse));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.dq, B, HQ, SQ, DQK, p.thd, dev, stream, true, &dq));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.dk, B, HKV, SKV, DQK, p.thd, dev, stream, true, &dk));
  FUSEDATTN_RETURN_IF_ERROR(AttachView(t.dv, B, HKV, SKV, DV, p.thd, dev, stream, true, &dv));
  FUSEDATTN_RETURN_IF_ERROR(AttachBias(p, t.bias, dev, stream, &bias));
  FUSEDATTN_RETURN_IF_ERROR(AttachBias(p, t.dbias, dev, stream, &dbias));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachVector(t.alibi_slopes, HQ, t.alibi_stride, 4, dev, stream, true, &alibi));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachVector(t.sink_logits, HQ, t.sink_stride, 4, dev, stream, true, &sinks));
  FUSEDATTN_RETURN_IF_ERROR(
      AttachVector(t.dsink, HQ, t.dsink_stride, 4, dev, stream, true, &dsink));
  AuxBuffers aux, aux_grads;
  std::vector<AuxGradient> gaux;  // one per score_mod tensor; empty sum when no grad is asked
  if (p.score_mod) {
    FUSEDATTN_RETURN_IF_ERROR(aux.Attach(p, t.score_mod_tensors, dev, stream));
    FUSEDATTN_RETURN_IF_ERROR(aux_grads.Attach(p, t.score_mod_grads, dev, stream));
    for (const flex::TensorDecl& decl : p.score_mod->tensors()) {
      AuxGradient g;
      g.extents = AuxExtents(p, decl.axes);
      if (decl.requires_grad)
        g.sum.assign(static_cast<size_t>(g.extents[0] * g.extents[1] * g.extents[2] *
                                         g.extents[3]),
                     0.0);
      gaux.push_back(std::move(g));
    }
  }
  ScoreModRunner mod(p.score_mod ? &p.score_mod->backward() : nullptr, &aux);

  const ScoreParams sp = MakeScoreParams(p, bias.host(), t.bias, alibi.host(), t.alibi_stride);
  const float* sink_host = static_cast<const float*>(sinks.host());
  const double keep_scale = 1.0 / (1.0 - c.dropout);
  const int64_t group = p.group_size();

  // Accumulators in double, in logical [b][h][s][x] order.
  std::vector<double> gq(static_cast<size_t>(B * HQ * SQ * DQK), 0.0);
  std::vector<double> gk(static_cast<size_t>(B * HKV * SKV * DQK), 0.0);
  std::vector<double> gv(static_cast<size_t>(B * HKV * SKV * DV), 0.0);
  std::vector<double> gbias(t.dbias.present() ? static_cast<size_t>(c.bias_batch * c.bias_heads *
                                                                    SQ * SKV)
                                              : 0,
                            0.0);
  std::vector<double> gsink(HQ, 0.0);

  std::vector<double> qrow(DQK), krow(DQK), vrow(DV), orow(DV), dorow(DV), scores(SKV),
      derivs(SKV);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lq = seq.len_q[b], lkv = seq.len_kv[b];
    for (int64_t h = 0; h < HQ; ++h) {
      const int64_t hk = h / group;
      const double extra = ExtraLogit(p, sink_host, t.sink_stride, h);
      for (int64_t i = 0; i < lq; ++i) {
        int64_t lo = 0, hi = 0;
        p.visible_keys(i, lq, lkv, &lo, &hi);
        if (lo >= hi) continue;  // fully masked row: no gradient
        int64_t lse_start = t.lse_packed ? seq.start_q[b] : 0;
        double row_lse = LoadAsDouble(lse.host(), FUSEDATTN_DTYPE_FLOAT32,
                                      b * t.lse.stride_b + (lse_start + i) * t.lse.stride_s +
                                          h * t.lse.stride_h);
        if (!std::isfinite(row_lse)) continue;
        LoadRow(t.q, q.host(), b, h, i, seq.start_q[b], DQK, qrow.data());
        LoadRow(t.o, o.host(), b, h, i, seq.start_q[b], DV, orow.data());
        LoadRow(t.d_o, d_o.host(), b, h, i, seq.start_q[b], DV, dorow.data());
        Scale(&qrow, fp8.descale_q);
        Scale(&orow, fp8.descale_o);
        Scale(&dorow, fp8.descale_do);
        double delta = 0;  // D = dO . O
        for (int64_t x = 0; x < DV; ++x) delta += dorow[x] * orow[x];
        if (c.softmax_type != FUSEDATTN_SOFTMAX_VANILLA)
          gsink[h] -= std::exp(extra - row_lse) * delta;
        DropoutRow drop{};
        if (c.dropout > 0)
          drop = p.dropout_row(t.dropout_seed, t.dropout_offset, b, h, i);
        if (mod.active()) mod.StartRow(b, h, i, lq, lkv);
        for (int64_t j = lo; j < hi; ++j) {
          LoadRow(t.k, k.host(), b, hk, j, seq.start_kv[b], DQK, krow.data());
          LoadRow(t.v, v.host(), b, hk, j, seq.start_kv[b], DV, vrow.data());
          Scale(&krow, fp8.descale_k);
          Scale(&vrow, fp8.descale_v);
          double qk = 0;
          for (int64_t x = 0; x < DQK; ++x) qk += qrow[x] * krow[x];
          double dfinal_dt = 1;
          double s = Score(sp, qk, b, h, i, j, lq, lkv, &dfinal_dt);
          if (mod.active() && !mod.Evaluate(j, s, &s)) continue;  // hidden by the mask_mod
          double prob = std::exp(s - row_lse);
          double keep = 1.0;
          if (c.dropout > 0) keep = drop.Keep(p.dropout_key(j)) ? keep_scale : 0.0;
          // dV += p' dO;  dP = dO . v (times the dropout factor);  dS = p (dP - D)
          double dp = 0;
          for (int64_t x = 0; x < DV; ++x) dp += dorow[x] * vrow[x];
          dp *= keep;
          double* gv_row = &gv[static_cast<size_t>(((b * HKV + hk) * SKV + j) * DV)];
          const double s_for_dv = fp8.on ? fp8.QuantizeS(prob * keep) : prob * keep;
          for (int64_t x = 0; x < DV; ++x) gv_row[x] += s_for_dv * dorow[x];
          double ds = prob * (dp - delta);
          if (mod.active()) {
            // ds is d loss / d (modified s). A zero stays zero: its key contributes nothing, even
            // where a derivative is inf (0 * inf would be NaN).
            for (size_t a = 0; a < gaux.size(); ++a)
              if (!gaux[a].sum.empty() && ds != 0.0)
                gaux[a].sum[static_cast<size_t>(gaux[a].index(mod.point()))] +=
                    ds * mod.d_tensor(a);
            ds = ds != 0.0 ? ds * mod.d_score() : 0.0;  // to the pipeline's s
          }
          double dt = ds * dfinal_dt;  // through the softcap
          double dqk = dt * sp.scale;
          if (fp8.on) {  // dP: what multiplies k in dQ and q in dK, quantized in dO's FP8 type
            amax_dp = std::max(amax_dp, std::fabs(dqk));
            dqk = fp8.QuantizeDp(dqk);
          }
          double* gq_row = &gq[static_cast<size_t>(((b * HQ + h) * SQ + i) * DQK)];
          double* gk_row = &gk[static_cast<size_t>(((b * HKV + hk) * SKV + j) * DQK)];
          for (int64_t x = 0; x < DQK; ++x) {
            gq_row[x] += dqk * krow[x];
            gk_row[x] += dqk * qrow[x];
          }
          if (!gbias.empty()) {
            int64_t bb = c.bias_batch == 1 ? 0 : b, bh = c.bias_heads == 1 ? 0 : h;
            double g = c.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? dt * sp.scale : ds;
            gbias[static_cast<size_t>(((bb * c.bias_heads + bh) * SQ + i) * SKV + j)] += g;
          }
        }
      }
    }
  }

  // Write: every element of the non-THD tensors (padding rows get 0), only sequence tokens in THD.
  // FP8: the amax of each gradient (elements not written are 0 in the sums), and its scale.
  auto amax_of = [](const std::vector<double>& g) {
    double m = 0;
    for (double x : g) m = std::max(m, std::fabs(x));
    return m;
  };
  const double out_scale_dq = IsFp8Dtype(t.dq.dtype) ? fp8.scale_dq : 1.0;
  const double out_scale_dk = IsFp8Dtype(t.dk.dtype) ? fp8.scale_dk : 1.0;
  const double out_scale_dv = IsFp8Dtype(t.dv.dtype) ? fp8.scale_dv : 1.0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t rows_q = p.thd ? seq.len_q[b] : SQ, rows_kv = p.thd ? seq.len_kv[b] : SKV;
    for (int64_t h = 0; h < HQ; ++h)
      for (int64_t i = 0; i < rows_q; ++i)
        for (int64_t x = 0; x < DQK; ++x)
          StoreFromDouble(dq.host(), t.dq.dtype, At(t.dq, b, h, i, x, seq.start_q[b]),
                          gq[static_cast<size_t>(((b * HQ + h) * SQ + i) * DQK + x)] *
                              out_scale_dq);
    for (int64_t h = 0; h < HKV; ++h)
      for (int64_t j = 0; j < rows_kv; ++j) {
        for (int64_t x = 0; x < DQK; ++x)
          StoreFromDouble(dk.host(), t.dk.dtype, At(t.dk, b, h, j, x, seq.start_kv[b]),
                          gk[static_cast<size_t>(((b * HKV + h) * SKV + j) * DQK + x)] *
                              out_scale_dk);
        for (int64_t x = 0; x < DV; ++x)
          StoreFromDouble(dv.host(), t.dv.dtype, At(t.dv, b, h, j, x, seq.start_kv[b]),
                          gv[static_cast<size_t>(((b * HKV + h) * SKV + j) * DV + x)] *
                              out_scale_dv);
      }
  }
  if (t.dbias.present()) {
    const BiasView& bv = t.dbias;
    for (int64_t bb = 0; bb < c.bias_batch; ++bb)
      for (int64_t bh = 0; bh < c.bias_heads; ++bh)
        for (int64_t i = 0; i < SQ; ++i)
          for (int64_t j = 0; j < SKV; ++j)
            StoreFromDouble(
                dbias.host(), bv.dtype,
                bb * bv.stride_b + bh * bv.stride_h + i * bv.stride_q + j * bv.stride_kv,
                gbias[static_cast<size_t>(((bb * c.bias_heads + bh) * SQ + i) * SKV + j)]);
  }
  if (t.dsink)
    for (int64_t h = 0; h < HQ; ++h)
      static_cast<float*>(dsink.host())[h * t.dsink_stride] = static_cast<float>(gsink[h]);
  for (size_t a = 0; a < gaux.size(); ++a) {
    if (gaux[a].sum.empty()) continue;
    const flex::TensorRead& out = aux_grads.reads[a];
    const auto& e = gaux[a].extents;
    size_t n = 0;  // sum is in logical order
    for (int64_t bb = 0; bb < e[0]; ++bb)
      for (int64_t hh = 0; hh < e[1]; ++hh)
        for (int64_t ii = 0; ii < e[2]; ++ii)
          for (int64_t jj = 0; jj < e[3]; ++jj)
            StoreFromDouble(const_cast<void*>(out.data), out.dtype,
                            bb * out.stride_b + hh * out.stride_h + ii * out.stride_q +
                                jj * out.stride_kv,
                            gaux[a].sum[n++]);
  }

  FUSEDATTN_RETURN_IF_ERROR(dq.Flush());
  FUSEDATTN_RETURN_IF_ERROR(dk.Flush());
  FUSEDATTN_RETURN_IF_ERROR(dv.Flush());
  FUSEDATTN_RETURN_IF_ERROR(dbias.Flush());
  FUSEDATTN_RETURN_IF_ERROR(dsink.Flush());
  FUSEDATTN_RETURN_IF_ERROR(aux_grads.Flush());
  if (fp8.on) {
    FUSEDATTN_RETURN_IF_ERROR(WriteAmax(t.fp8.amax_dp, amax_dp, dev, stream));
    FUSEDATTN_RETURN_IF_ERROR(WriteAmax(t.fp8.amax_dq, amax_of(gq), dev, stream));
    FUSEDATTN_RETURN_IF_ERROR(WriteAmax(t.fp8.amax_dk, amax_of(gk), dev, stream));
    FUSEDATTN_RETURN_IF_ERROR(WriteAmax(t.fp8.amax_dv, amax_of(gv), dev, stream));
  }
  return Status::Ok();
}

}  // namespace

Backend* ReferenceBackend() {
  static ReferenceBackendImpl backend;
  return &backend;
}

}  // namespace fusedattn
