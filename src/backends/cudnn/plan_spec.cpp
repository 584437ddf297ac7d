#include "backends/cudnn/plan_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "flex/band_mask.h"

namespace fusedattn::cudnn {

namespace {

constexpr int64_t kInt32Max = 2147483647;

// cuDNN's mask attributes for a problem.
struct CudnnMask {
  bool padding = false;        // seq_len tensors given to cuDNN
  bool const_lengths = false;  // ... all at max_seqlen (no padding mask in the problem)
  bool has_left = false, has_right = false;
  int64_t left_bound = 0, right_bound = 0;
  bool bottom_right = false;
};

// A window at least max_seqlen_q + max_seqlen_kv wide hides nothing (|d - j| stays below it for
// every row and key of every sequence): it is the unbounded window.
int64_t EffectiveWindow(int64_t window, const fusedattn_config& c) {
  return window >= c.max_seqlen_q + c.max_seqlen_kv ? -1 : window;
}

CudnnMask CudnnMaskOf(const Problem& p) {
  const auto& c = p.config;
  CudnnMask m;
  // Paged K/V always has per-sequence key lengths, and cuDNN reads paged caches only with its
  // padding mask on (cudnn-frontend: "Paged caches can only be used in combination with padding
  // mask and variable sequence lengths for both Q and KV").
  const bool lengths = p.padding || p.paged;
  m.padding = lengths;
  const int64_t left = EffectiveWindow(p.window_left, c);
  int64_t right = EffectiveWindow(p.window_right, c);
  // Paged decode (one query per sequence against its keys, bottom-right): the diagonal is the
  // last key, so a right bound of 0 or more hides nothing. Dropped, because cuDNN up to 9.9
  // refuses a right bound in decode and 9.15-9.20 keep the unified node from any band.
  if (p.paged && p.bottom_right && c.max_seqlen_q == 1 && right >= 0) right = -1;
  if (left < 0 && right < 0) return m;
  // cuDNN keeps key j when j > d - left_bound (so window_left + 1) and j <= d + right_bound.
  m.has_left = left >= 0;
  m.left_bound = left + 1;
  m.has_right = right >= 0;
  m.right_bound = right;
  m.bottom_right = p.bottom_right;
  // With fixed lengths and sq == skv both alignments are the same diagonal; top-left is the one
  // cuDNN combines with bias and dropout.
  if (!lengths && c.max_seqlen_q == c.max_seqlen_kv) m.bottom_right = false;
  // cuDNN runs a band with max_seqlen_q > max_seqlen_kv only in its padded kernels; give it
  // lengths that are all the maximum.
  if (!lengths && c.max_seqlen_q > c.max_seqlen_kv &&
      (m.has_left || (m.has_right && m.bottom_right))) {
    m.padding = true;
    m.const_lengths = true;
  }
  return m;
}

// Extent-1 dimensions keep the caller's stride unless it is 0, which cuDNN may read as
// overlapping; any non-zero stride addresses the same elements.
int64_t NonZero(int64_t stride, int64_t fallback) { return stride != 0 ? stride : fallback; }

TensorDesc DescOf(const TensorView& t, int64_t batch, int64_t heads, int64_t seqlen, int64_t dim,
                  bool ragged) {
  TensorDesc d;
  d.dim[0] = batch, d.dim[1] = heads, d.dim[2] = seqlen, d.dim[3] = dim;
  d.stride[3] = NonZero(t.stride_d, 1);
  d.stride[2] = NonZero(t.stride_s, dim * d.stride[3]);
  d.stride[1] = NonZero(t.stride_h, dim * d.stride[3]);
  // THD has no batch stride (the ragged offsets place sequences); declare the one of a packed
  // [batch, seqlen] token axis so that cuDNN sees a well-formed tensor.
  d.stride[0] = ragged ? seqlen * d.stride[2] : NonZero(t.stride_b, seqlen * d.stride[2]);
  return d;
}

TensorDesc BiasDescOf(const Problem& p, const BiasView& b) {
  const auto& c = p.config;
  TensorDesc d;
  d.dim[0] = c.bias_batch, d.dim[1] = c.bias_heads, d.dim[2] = c.max_seqlen_q,
  d.dim[3] = c.max_seqlen_kv;
  d.stride[3] = NonZero(b.stride_kv, 1);
  d.stride[2] = NonZero(b.stride_q, c.max_seqlen_kv * d.stride[3]);
  d.stride[1] = NonZero(b.stride_h, c.max_seqlen_q * d.stride[2]);
  d.stride[0] = NonZero(b.stride_b, c.bias_heads * d.stride[1]);
  return d;
}

bool LsePackedBhsd(const Problem& p, const LseView& lse, bool packed) {
  const auto& c = p.config;
  if (packed) return false;
  bool s_ok = c.max_seqlen_q == 1 || lse.stride_s == 1;
  bool h_ok = c.heads_q == 1 || lse.stride_h == c.max_seqlen_q;
  bool b_ok = c.batch == 1 || lse.stride_b == c.heads_q * c.max_seqlen_q;
  return s_ok && h_ok && b_ok;
}

void PackedStatsStrides(const Problem& p, int64_t* stride) {
  stride[0] = p.config.heads_q * p.config.max_seqlen_q;
  stride[1] = p.config.max_seqlen_q;
  stride[2] = 1;
  stride[3] = 1;
}

TensorView Canonical(fusedattn_format format, int64_t batch, int64_t seqlen, int64_t heads,
                     int64_t dim, fusedattn_dtype dtype) {
  TensorView v;
  v.dtype = dtype;
  v.stride_d = 1;
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD:
      v.stride_h = dim, v.stride_s = heads * dim, v.stride_b = seqlen * heads * dim;
      break;
    case FUSEDATTN_FORMAT_SBHD:
      v.stride_h = dim, v.stride_b = heads * dim, v.stride_s = batch * heads * dim;
      break;
    case FUSEDATTN_FORMAT_BHSD:
      v.stride_s = dim, v.stride_h = seqlen * dim, v.stride_b = heads * seqlen * dim;
      break;
    case FUSEDATTN_FORMAT_THD:
      v.stride_h = dim, v.stride_s = heads * dim, v.stride_b = 0;
      break;
  }
  v.num_tokens = batch * seqlen;
  return v;
}

BiasView CanonicalBias(const Problem& p) {
  const auto& c = p.config;
  BiasView b;
  b.dtype = c.qkv_dtype;
  b.stride_kv = 1;
  b.stride_q = c.max_seqlen_kv;
  b.stride_h = c.bias_heads == 1 ? 0 : c.max_seqlen_q * c.max_seqlen_kv;
  b.stride_b = c.bias_batch == 1 ? 0 : c.bias_heads * c.max_seqlen_q * c.max_seqlen_kv;
  return b;
}

LseView CanonicalLse(const Problem& p) {
  LseView l;
  l.dtype = FUSEDATTN_DTYPE_FLOAT32;
  l.stride_s = 1;
  l.stride_h = p.config.max_seqlen_q;
  l.stride_b = p.config.heads_q * p.config.max_seqlen_q;
  l.num_tokens = p.config.batch * p.config.max_seqlen_q;
  return l;
}

size_t AlignUp(size_t n) { return (n + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

// Appends words to a key; the fixed-size key must hold them all.
class KeyWriter {
 public:
  explicit KeyWriter(PlanKey* key) : key_(key) {}
  void add(int64_t w) {
    if (n_ < PlanKey::kWords) key_->words[n_] = w;
    ++n_;
  }
  void add(const TensorDesc& d) {
    for (int i = 0; i < 4; ++i) add(d.dim[i]);
    for (int i = 0; i < 4; ++i) add(d.stride[i]);
  }
  void add_float(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    add(static_cast<int64_t>(bits));
  }
  size_t count() const { return n_; }

 private:
  PlanKey* key_;
  size_t n_ = 0;
};


// The combined band of the config's mask and a band mask_mod, when one band expresses both:
// the same diagonal (or, with fixed and equal lengths, two diagonals that coincide).
bool CombineBands(const Problem& p, const flex::MaskBand& mod, Problem* out) {
  const auto& c = p.config;
  int64_t left = mod.left, right = mod.right;
  bool bottom_right = mod.bottom_right;
  if (p.has_band()) {
    const bool same_diagonal =
        p.bottom_right == mod.bottom_right ||
        (!p.padding && !p.paged && !p.thd && c.max_seqlen_q == c.max_seqlen_kv);
    if (!same_diagonal) return false;
    auto tighter = [](int64_t a, int64_t b) { return a < 0 ? b : (b < 0 ? a : (a < b ? a : b)); };
    left = tighter(p.window_left, mod.left);
    right = tighter(p.window_right, mod.right);
    bottom_right = p.bottom_right;
  }
  *out = p;
  out->score_mod = nullptr;
  out->config.score_mod = nullptr;
  out->window_left = left;
  out->window_right = right;
  out->bottom_right = bottom_right;
  out->causal = p.causal || right == 0;
  return true;
}

// Contiguous views of the score_mod tensors (over their declared axes, in the order batch,
// head, q, kv), the layout check() plans for.
std::vector<AuxTensorView> CanonicalAux(const Problem& p) {
  std::vector<AuxTensorView> views;
  if (!p.score_mod) return views;
  const auto& c = p.config;
  for (const flex::TensorDecl& decl : p.score_mod->tensors()) {
    AuxTensorView v;
    v.dtype = decl.dtype;
    int64_t stride = 1;
    struct {
      uint32_t bit;
      int64_t extent;
      int64_t* stride;
    } axes[] = {{FUSEDATTN_SCORE_MOD_AXIS_KV, c.max_seqlen_kv, &v.stride_kv},
                {FUSEDATTN_SCORE_MOD_AXIS_Q, c.max_seqlen_q, &v.stride_q},
                {FUSEDATTN_SCORE_MOD_AXIS_HEAD, c.heads_q, &v.stride_h},
                {FUSEDATTN_SCORE_MOD_AXIS_BATCH, c.batch, &v.stride_b}};
    for (const auto& a : axes)
      if (decl.axes & a.bit) {
        *a.stride = stride;
        stride *= a.extent;
      }
    views.push_back(v);
  }
  return views;
}

// The score_mod tensors as graph inputs: extent 1 (with a packed stride) on the axes a tensor
// leaves out, the caller's strides on the others; except that a tensor read with batch or kv_idx
// but without q_idx (per-key document ids) gets the full q extent with stride 0: cuDNN 9.19's
// backward misreads such a tensor when its q extent is 1 (gradients 50-150% off on H100).
bool IsKeySide(const flex::TensorDecl& decl) {
  return !(decl.axes & FUSEDATTN_SCORE_MOD_AXIS_Q) &&
         (decl.axes & (FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV));
}

std::vector<SdpaGraphSpec::Aux> AuxDescs(const Problem& p, const std::vector<AuxTensorView>& t) {
  const auto& c = p.config;
  std::vector<SdpaGraphSpec::Aux> out;
  const auto& decls = p.score_mod->tensors();
  for (size_t k = 0; k < decls.size() && k < t.size(); ++k) {
    SdpaGraphSpec::Aux a;
    a.dtype = decls[k].dtype;
    const uint32_t bits[4] = {FUSEDATTN_SCORE_MOD_AXIS_BATCH, FUSEDATTN_SCORE_MOD_AXIS_HEAD,
                              FUSEDATTN_SCORE_MOD_AXIS_Q, FUSEDATTN_SCORE_MOD_AXIS_KV};
    const int64_t extents[4] = {c.batch, c.heads_q, c.max_seqlen_q, c.max_seqlen_kv};
    const int64_t strides[4] = {t[k].stride_b, t[k].stride_h, t[k].stride_q, t[k].stride_kv};
    int64_t packed = 1;
    for (int d = 3; d >= 0; --d) {
      const bool present = (decls[k].axes & bits[d]) != 0;
      a.desc.dim[d] = present ? extents[d] : 1;
      a.desc.stride[d] = present ? strides[d] : packed;
      packed *= a.desc.dim[d];
    }
    if (IsKeySide(decls[k])) a.desc.dim[2] = extents[2], a.desc.stride[2] = 0;
    out.push_back(a);
  }
  return out;
}

// The callback path's part of a spec: no cuDNN mask attribute, the config's mask in the callback.
void SetScoreMod(const Problem& p, const std::vector<AuxTensorView>& aux, SdpaGraphSpec* s) {
  s->padding = false;
  s->has_left_bound = s->has_right_bound = false;
  s->left_bound = s->right_bound = 0;
  s->bottom_right = false;
  s->score_mod = p.score_mod;
  if (p.has_band()) s->mod_band = BandOf(p);
  s->mod_seq_lens = p.padding;
  s->aux = AuxDescs(p, aux);
}

// What a score_mod cannot be combined with on cuDNN, and why. Checked before the general
// refusals, whose alternative (flash) does not run score_mods in this version.
Status ScoreModPreCheck(const Problem& p) {
  const auto& c = p.config;
  if (c.softcap > 0.0)
    return NotSupported(
        "softcap = %g with a score_mod: cuDNN's soft-cap is itself a score modifier and takes no "
        "second one (write it into the score_mod as c * tanh(s / c); the reference backend runs "
        "both)",
        c.softcap);
  if (c.bias_type == FUSEDATTN_BIAS_POST_SCALE)
    return NotSupported(
        "bias_type = post_scale with a score_mod: cuDNN adds the bias after the score modifier, "
        "fusedattn before it (pass the bias as a score_mod tensor; the reference backend runs "
        "both)");
  if (c.bias_type == FUSEDATTN_BIAS_PRE_SCALE)
    return NotSupported("bias_type = pre_scale with a score_mod: cuDNN SDPA has no pre-scale "
                        "bias (flash and the reference backend run both)");
  if (c.bias_type == FUSEDATTN_BIAS_ALIBI)
    return NotSupported(
        "bias_type = alibi with a score_mod: cuDNN disables its ALiBi next to a score modifier "
        "(write the ALiBi term into the score_mod; the reference backend runs both)");
  if (p.thd)
    return NotSupported(
        "THD formats with a score_mod: cuDNN disables its padding mask next to a score modifier, "
        "which packed sequences need (the reference backend runs it)");
  if (c.return_max_logit)
    return NotSupported("return_max_logit = 1 with a score_mod: cuDNN SDPA has no per-head max "
                        "logit (the reference backend returns it)");
  const auto& decls = p.score_mod->tensors();
  // Measured on H100 with cuDNN 9.19 against the reference: a padding mask evaluated in the
  // callback (the per-sequence lengths, [batch, 1, 1, 1] tensors) gives a wrong O (~100%
  // relative error). flash runs it. (Key-side tensors: see AuxDescs.)
  if (ScoreModPathOf(p) == ScoreModPath::kCallback && p.padding)
    return NotSupported(
        "%s with a score_mod: cuDNN 9.19 misreads the per-sequence lengths a score-modifier "
        "callback reads (O ~100%% off on H100; flash and the reference backend run it)",
        MaskName(c.mask));
  for (const flex::TensorDecl& decl : decls)
    if (decl.requires_grad)
      return NotSupported(
          "score_mod tensor '%s' requires_grad: cuDNN's score-modifier backward returns the "
          "score's gradient only, not its tensors' (flash and the reference backend compute them)",
          decl.name.c_str());
  if (decls.size() > static_cast<size_t>(kMaxScoreModTensors))
    return NotSupported("a score_mod with %zu tensors: the cuDNN backend takes at most %d (the "
                        "reference backend takes any number)",
                        decls.size(), kMaxScoreModTensors);
  return Status::Ok();
}

}  // namespace

ScoreModPath ScoreModPathOf(const Problem& p) {
  if (!p.score_mod) return ScoreModPath::kNone;
  const flex::Program& program = p.score_mod->forward();
  flex::MaskBand band;
  Problem combined;
  if (flex::IsMaskOnly(program) && !p.score_mod->any_requires_grad() &&
      flex::RecognizeBandMask(program, &band) && CombineBands(p, band, &combined))
    return ScoreModPath::kNativeBand;
  return ScoreModPath::kCallback;
}

int64_t ThdSeqlenBucket(int64_t n) {
  if (n <= 16) return n;
  if (n <= 64) return (n + 15) / 16 * 16;
  int64_t octave = 64;  // the largest power of two below n
  while (octave * 2 < n) octave *= 2;
  const int64_t step = octave / 4;
  return (n + step - 1) / step * step;
}

namespace {
// THD problems whose sequence extent can grow to its bucket: nothing of the graph but the
// sequences' own rows depends on it (a bias or score_mod tensor has the extent as a dimension;
// a score_mod's callbacks bake it in; cuDNN's dropout numbers elements over it), and the ragged
// offsets still fit int32. Paged K/V the same on the key side: its keys are read through the page
// table up to each sequence's length, whatever the graph's max_seq_len_kv; the queries of a dense
// paged problem keep their extent (it is their tensors' rows).
bool WidensToBucket(const Problem& p) {
  const auto& c = p.config;
  if (!(p.thd || p.paged) || p.has_score_mod() || p.has_tensor_bias() || c.dropout > 0.0)
    return false;
  const int64_t dim = c.head_dim_qk > c.head_dim_v ? c.head_dim_qk : c.head_dim_v;
  const int64_t batch = GraphBatch(p);
  const bool ragged_q = p.thd, ragged_kv = p.thd && !p.paged;
  return (!ragged_q || batch * ThdSeqlenBucket(c.max_seqlen_q) * c.heads_q * dim <= kInt32Max) &&
         (!ragged_kv || batch * ThdSeqlenBucket(c.max_seqlen_kv) * c.heads_kv * dim <= kInt32Max);
}
}  // namespace

const Problem& EffectiveProblem(const Problem& p, Problem* storage) {
  const Problem* effective = &p;  // no copy on the dense path
  if (ScoreModPathOf(p) == ScoreModPath::kNativeBand) {
    flex::MaskBand band;
    flex::RecognizeBandMask(p.score_mod->forward(), &band);
    CombineBands(p, band, storage);
    effective = storage;
  }
  if (WidensToBucket(*effective)) {
    if (effective != storage) *storage = *effective;
    if (storage->thd) storage->config.max_seqlen_q = ThdSeqlenBucket(storage->config.max_seqlen_q);
    storage->config.max_seqlen_kv = ThdSeqlenBucket(storage->config.max_seqlen_kv);
    effective = storage;
  }
  return *effective;
}

Problem EffectiveProblem(const Problem& p) {
  Problem storage;
  return EffectiveProblem(p, &storage);
}

// FP8 attention runs through cudnn-frontend's sdpa_fp8 / sdpa_fp8_backward with nothing of ours
// around the graph: what would need our prepare or fix-up kernels (which read and write
// bfloat16/float16 O) or a feature of the FP8 graphs we do not map is refused here, naming the
// reference (which runs every FP8 problem). cuDNN refuses the rest itself when check() builds the
// graphs (head dims above 128 or not multiples of 16, bottom-right causal on Hopper, ...).
static Status Fp8PreCheck(const Problem& p) {
  const auto& c = p.config;
  const char* other = "the reference runs it";
  if (p.has_score_mod())
    return NotSupported("FP8 with a score_mod: cuDNN's FP8 SDPA takes no score modifier (%s)",
                        other);
  if (p.thd)
    return NotSupported(
        "FP8 with THD: cuDNN's FP8 SDPA backward refuses ragged tensors on Hopper, and this "
        "backend plans FP8 for dense layouts only (%s)",
        other);
  if (p.padding)
    return NotSupported(
        "FP8 with mask = %s: per-sequence lengths need this backend's prepare and fix-up kernels, "
        "which have no FP8 version yet (%s)",
        MaskName(c.mask), other);
  if (CudnnMaskOf(p).const_lengths)
    return NotSupported(
        "FP8 with max_seqlen_q = %lld > max_seqlen_kv = %lld and a band: cuDNN runs that only in "
        "its padded kernels, whose lengths this backend's prepare kernel writes (no FP8 version "
        "yet) (%s)",
        (long long)c.max_seqlen_q, (long long)c.max_seqlen_kv, other);
  if (BandOf(p).any_row_empty(c.max_seqlen_q, c.max_seqlen_kv) ||
      BandOf(p).any_key_unseen(c.max_seqlen_q, c.max_seqlen_kv))
    return NotSupported(
        "FP8 with a mask or window that leaves a query row or a key without a partner "
        "(sq = %lld, skv = %lld): their O = 0 / LSE = -inf / zero gradients need this backend's "
        "fix-up kernels, which have no FP8 version yet (%s)",
        (long long)c.max_seqlen_q, (long long)c.max_seqlen_kv, other);
  if (c.bias_type != FUSEDATTN_BIAS_NONE)
    return NotSupported("FP8 with bias_type = %s: not mapped to cuDNN's FP8 graphs (%s)",
                        BiasName(c.bias_type), other);
  if (c.softmax_type != FUSEDATTN_SOFTMAX_VANILLA)
    return NotSupported("FP8 with softmax_type = %s: not mapped to cuDNN's FP8 graphs (%s)",
                        SoftmaxName(c.softmax_type), other);
  if (c.softcap > 0.0)
    return NotSupported("FP8 with softcap = %g: cuDNN's FP8 SDPA has no soft-cap (%s)", c.softcap,
                        other);
  if (c.dropout > 0.0)
    return NotSupported(
        "FP8 with dropout = %g: cuDNN draws its own mask, so S (and amax_s) would not be the "
        "reference's; not mapped yet (%s)",
        c.dropout, other);
  if (c.return_max_logit)
    return NotSupported("FP8 with return_max_logit = 1: cuDNN SDPA has no per-head max logit (%s)",
                        other);
  if (c.o_dtype == FUSEDATTN_DTYPE_FLOAT32)
    return NotSupported("FP8 with o_dtype = float32: cuDNN's FP8 SDPA writes O in fp8_e4m3, "
                        "bfloat16 or float16 (%s)",
                        other);
  if (p.config.is_training && p.config.dqkv_dtype == FUSEDATTN_DTYPE_FLOAT32)
    return NotSupported("FP8 with dqkv_dtype = float32: cuDNN's FP8 SDPA backward writes dQ/dK/dV "
                        "in fp8, bfloat16 or float16 (%s)",
                        other);
  if (c.head_dim_qk % 16 != 0 || c.head_dim_v % 16 != 0 || c.head_dim_qk > 256 ||
      c.head_dim_v > 256)
    return NotSupported(
        "FP8 with head_dim_qk = %lld, head_dim_v = %lld: cuDNN's FP8 SDPA needs multiples of 16 "
        "(up to 128 on Hopper) (%s)",
        (long long)c.head_dim_qk, (long long)c.head_dim_v, other);
  if (c.max_seqlen_q > kInt32Max || c.max_seqlen_kv > kInt32Max)
    return NotSupported("max_seqlen above 2^31-1: cuDNN's sequence lengths are int32");
  if (EffectiveWindow(p.window_left, c) >= kInt32Max ||
      EffectiveWindow(p.window_right, c) > kInt32Max)
    return NotSupported("window_left = %lld, window_right = %lld: cuDNN's band bounds are int32",
                        (long long)p.window_left, (long long)p.window_right);
  return Status::Ok();
}

// Paged K/V (cudnn-frontend's SDPA_attributes::set_paged_attention_k_table / _v_table /
// _max_seq_len_kv; plan_spec.h): what cuDNN cannot take next to paged caches and what this
// backend does not map for them. Each reason starts with the page size, so that a paged problem's
// refusal says that it is one, and names the backends that run it: flash's paged kernels within
// their limits (fusedattn.h "Paged K/V": e.g. softcap, ALiBi and max_logit), the reference always.
static Status PagedPreCheck(const Problem& p) {
  const auto& c = p.config;
  const long long page = static_cast<long long>(c.page_size);
  const char* other =
      "flash's paged kernels run it within their limits (fusedattn.h \"Paged K/V\"), the "
      "reference always";
  if ((c.page_size & (c.page_size - 1)) != 0)
    return NotSupported(
        "paged K/V (page_size = %lld): cuDNN takes pages of a power-of-two number of tokens only "
        "(cudnn-frontend's Attention.md: the block size of a K or V container is a power of 2) "
        "(the reference runs any page size)",
        page);
  if (p.fp8)
    return NotSupported(
        "paged K/V (page_size = %lld) with FP8: the per-sequence key lengths need this backend's "
        "prepare and fix-up kernels, which have no FP8 version yet (%s)",
        page, other);
  if (p.has_score_mod())  // on the callback path: a plain band became the problem's own mask
    return NotSupported(
        "paged K/V (page_size = %lld) with a score_mod that is not a plain band: cuDNN reads paged "
        "caches only with its padding mask (the key lengths), which it disables next to a score "
        "modifier (%s)",
        page, other);
  if (c.qkv_dtype != FUSEDATTN_DTYPE_FLOAT16 && c.qkv_dtype != FUSEDATTN_DTYPE_BFLOAT16)
    return NotSupported(
        "paged K/V (page_size = %lld) with qkv_dtype = %s: cuDNN SDPA takes float16 or bfloat16 "
        "only (%s)",
        page, DtypeName(c.qkv_dtype), other);
  if (c.o_dtype != c.qkv_dtype)
    return NotSupported(
        "paged K/V (page_size = %lld) with o_dtype = %s differing from qkv_dtype = %s: cuDNN SDPA "
        "writes O in the input dtype (%s)",
        page, DtypeName(c.o_dtype), DtypeName(c.qkv_dtype), other);
  if (c.bias_type == FUSEDATTN_BIAS_PRE_SCALE)
    return NotSupported(
        "paged K/V (page_size = %lld) with bias_type = pre_scale: cuDNN SDPA adds the bias after "
        "attn_scale only (%s)",
        page, other);
  if (c.bias_type == FUSEDATTN_BIAS_ALIBI)
    return NotSupported(
        "paged K/V (page_size = %lld) with bias_type = alibi: cuDNN's ALiBi has fixed slopes "
        "2^(-8(h+1)/heads), not the caller's (%s)",
        page, other);
  if (c.softcap > 0.0)
    return NotSupported(
        "paged K/V (page_size = %lld) with softcap = %g: cuDNN applies a soft-cap only through a "
        "score modifier, which disables the padding mask paged caches need (%s)",
        page, c.softcap, other);
  if (c.return_max_logit)
    return NotSupported(
        "paged K/V (page_size = %lld) with return_max_logit = 1: cuDNN SDPA has no per-head max "
        "logit (%s)",
        page, other);
  if (c.head_dim_qk % 8 != 0 || c.head_dim_v % 8 != 0)
    return NotSupported(
        "paged K/V (page_size = %lld) with head_dim_qk = %lld, head_dim_v = %lld: cuDNN SDPA "
        "needs head dims that are multiples of 8 (%s)",
        page, (long long)c.head_dim_qk, (long long)c.head_dim_v, other);
  return Status::Ok();
}

Status PreCheck(const Problem& p) {
  const auto& c = p.config;
  if (p.device != Device::kCuda)
    return NotSupported("runs on CUDA tensors only (config.device is CPU)");
  if (p.has_dropout_positions())
    return NotSupported(
        "dropout positions (context parallelism: config.dropout_batch_offset, dropout_heads, "
        "dropout_head_offset, dropout_rows, dropout_row_offset, dropout_key_offset): cuDNN draws "
        "its dropout from its own random stream, which has no such positions (the reference "
        "runs them)");
  if (p.paged) FUSEDATTN_RETURN_IF_ERROR(PagedPreCheck(p));
  if (p.has_score_mod()) FUSEDATTN_RETURN_IF_ERROR(ScoreModPreCheck(p));
  if (p.fp8) return Fp8PreCheck(p);
  if (c.qkv_dtype != FUSEDATTN_DTYPE_FLOAT16 && c.qkv_dtype != FUSEDATTN_DTYPE_BFLOAT16)
    return NotSupported(
        "qkv_dtype = %s: cuDNN SDPA takes float16 or bfloat16 only (flash runs float32)",
        DtypeName(c.qkv_dtype));
  if (c.o_dtype != c.qkv_dtype)
    return NotSupported(
        "o_dtype = %s differs from qkv_dtype = %s: cuDNN SDPA writes O in the input dtype (flash "
        "runs mixed dtypes)",
        DtypeName(c.o_dtype), DtypeName(c.qkv_dtype));
  if (c.bias_type == FUSEDATTN_BIAS_PRE_SCALE)
    return NotSupported(
        "bias_type = pre_scale: cuDNN SDPA adds the bias after attn_scale only (flash runs "
        "pre-scale bias)");
  if (c.bias_type == FUSEDATTN_BIAS_ALIBI)
    return NotSupported(
        "bias_type = alibi: cuDNN's ALiBi has fixed slopes 2^(-8(h+1)/heads) and needs a causal "
        "mask, not the caller's slopes (flash runs ALiBi)");
  if (c.softcap > 0.0)
    return NotSupported(
        "softcap = %g: cuDNN applies a soft-cap only through a score modifier that excludes its "
        "masks (flash runs softcap)",
        c.softcap);
  if (c.return_max_logit)
    return NotSupported("return_max_logit = 1: cuDNN SDPA has no per-head max logit (flash "
                        "returns it)");
  if (c.head_dim_qk % 8 != 0 || c.head_dim_v % 8 != 0)
    return NotSupported(
        "head_dim_qk = %lld, head_dim_v = %lld: cuDNN SDPA needs head dims that are multiples of "
        "8 (flash runs any head dim)",
        (long long)c.head_dim_qk, (long long)c.head_dim_v);
  if (c.max_seqlen_q > kInt32Max || c.max_seqlen_kv > kInt32Max)
    return NotSupported("max_seqlen above 2^31-1: cuDNN's sequence lengths are int32");
  // Windows that hide something reach cuDNN as int bounds (window_left + 1, window_right).
  if (EffectiveWindow(p.window_left, c) >= kInt32Max || EffectiveWindow(p.window_right, c) > kInt32Max)
    return NotSupported("window_left = %lld, window_right = %lld: cuDNN's band bounds are int32",
                        (long long)p.window_left, (long long)p.window_right);
  if (p.thd) {
    // Ragged offsets are int32 element offsets; plan for batch * max_seqlen packed tokens.
    // (MakeProblem checked that these products fit int64.) Paged pools have no ragged offsets.
    int64_t dim = c.head_dim_qk > c.head_dim_v ? c.head_dim_qk : c.head_dim_v;
    int64_t q_elems = c.batch * c.max_seqlen_q * c.heads_q * dim;
    int64_t kv_elems = p.paged ? 0 : c.batch * c.max_seqlen_kv * c.heads_kv * dim;
    if (q_elems > kInt32Max || kv_elems > kInt32Max)
      return NotSupported(
          "THD with batch * max_seqlen * heads * head_dim above 2^31-1 elements: cuDNN's ragged "
          "offsets are int32 (flash runs it)");
  }
  return Status::Ok();
}

Band BandOf(const Problem& p) { return p.band(); }

int64_t GraphBatch(const Problem& p) {
  const auto& c = p.config;
  // A per-sequence bias is indexed by the graph batch, so only bias-free (or batch-broadcast)
  // THD problems round their batch up.
  bool per_sequence_bias = p.has_tensor_bias() && c.bias_batch > 1;
  if (!p.thd || per_sequence_bias) return c.batch;
  int64_t capacity = 1;
  while (capacity < c.batch) capacity *= 2;
  return capacity;
}

BatchChunks ChooseBatchChunks(int64_t batch, const std::vector<int64_t>& plan_batches,
                              int max_chunks) {
  BatchChunks best;
  std::vector<int64_t> sizes;
  for (int64_t b : plan_batches)
    if (b >= 1 && b < batch) sizes.push_back(b);
  if (sizes.empty() || max_chunks < 2) return best;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // launches[n]: fewest plans whose batches sum to exactly n (unbounded), for n up to the
  // largest total allowed; from[n]: the last plan's batch on that way.
  const int64_t limit = batch + batch / kMaxChunkWaste;
  constexpr int kNone = 1 << 30;
  std::vector<int> launches(static_cast<size_t>(limit + 1), kNone);
  std::vector<int64_t> from(static_cast<size_t>(limit + 1), 0);
  launches[0] = 0;
  for (int64_t n = 1; n <= limit; ++n)
    for (int64_t b : sizes)
      if (b <= n && launches[n - b] + 1 < launches[n]) {
        launches[n] = launches[n - b] + 1;
        from[n] = b;
      }
  for (int64_t n = batch; n <= limit; ++n) {  // fewest twice-computed sequences first
    if (launches[n] > max_chunks) continue;
    std::vector<int64_t> used;
    for (int64_t at = n; at > 0; at -= from[at]) used.push_back(from[at]);
    std::sort(used.rbegin(), used.rend());
    if (n - used.back() > batch) continue;  // the chunks before the last would run past the end
    best.count = static_cast<int>(used.size());
    int64_t first = 0;
    for (int i = 0; i < best.count; ++i) {
      best.batch[i] = used[i];
      // The last chunk ends at the batch's end (overlapping the one before when n > batch).
      best.first[i] = i + 1 == best.count ? batch - used[i] : first;
      first += used[i];
    }
    return best;
  }
  return best;
}

SequenceBytes SequenceBytesOf(const SdpaGraphSpec& s) {
  const int64_t io = static_cast<int64_t>(DtypeSize(s.io_dtype));
  SequenceBytes b;
  b.q = s.q.stride[0] * io, b.k = s.k.stride[0] * io, b.v = s.v.stride[0] * io;
  b.o = s.o.stride[0] * io;
  if (s.direction == Direction::kBackward) {
    b.d_o = s.d_o.stride[0] * io, b.dq = s.dq.stride[0] * io;
    b.dk = s.dk.stride[0] * io, b.dv = s.dv.stride[0] * io;
  }
  if (s.stats) b.stats = s.stats_stride[0] * static_cast<int64_t>(sizeof(float));
  // A bias with one batch entry is broadcast over the batch: every chunk reads the same one.
  if (s.bias && s.bias_desc.dim[0] > 1)
    b.bias = s.bias_desc.stride[0] * static_cast<int64_t>(DtypeSize(s.bias_dtype));
  if (s.dbias && s.dbias_desc.dim[0] > 1)
    b.dbias = s.dbias_desc.stride[0] * static_cast<int64_t>(DtypeSize(s.bias_dtype));
  return b;
}

Status BatchChunkRefusal(const SdpaGraphSpec& s) {
  if (s.fp8)
    return NotSupported("FP8 plans are per batch (the amax outputs are reduced over the whole "
                        "batch by one launch)");
  if (s.ragged) return NotSupported("THD plans serve a power of two of batch sizes already");
  if (s.dropout > 0.0f)
    return NotSupported("dropout: cuDNN numbers its random stream over the whole batch");
  if (s.score_mod)
    return NotSupported("a score_mod on cuDNN's callbacks may read the batch index");
  if (s.dbias && s.dbias_desc.dim[0] == 1 && s.batch > 1)
    return NotSupported("the bias gradient is summed over the batch");
  if (s.paged)
    return NotSupported("paged K/V: a chunk's keys are found through its rows of the page table, "
                        "which a chunk's pointers do not move");
  return Status::Ok();
}

Status BatchChunkAlignment(const SdpaGraphSpec& s, const BatchChunks& chunks) {
  const SequenceBytes b = SequenceBytesOf(s);
  const struct {
    const char* name;
    int64_t bytes;
  } tensors[] = {{"q", b.q},   {"k", b.k},   {"v", b.v},         {"o", b.o},
                 {"dO", b.d_o}, {"dQ", b.dq}, {"dK", b.dk},       {"dV", b.dv},
                 {"LSE", b.stats}, {"bias", b.bias}, {"dbias", b.dbias}};
  for (int i = 0; i < chunks.count; ++i)
    for (const auto& t : tensors)
      if (t.bytes * chunks.first[i] % 16 != 0)
        return NotSupported("the slice of %s from sequence %lld would start off 16-byte "
                            "alignment",
                            t.name, (long long)chunks.first[i]);
  return Status::Ok();
}

SdpaGraphSpec WithBatch(const SdpaGraphSpec& spec, int64_t batch) {
  SdpaGraphSpec s = spec;
  s.batch = batch;
  for (TensorDesc* d : {&s.q, &s.k, &s.v, &s.o, &s.d_o, &s.dq, &s.dk, &s.dv}) {
    if (s.paged && (d == &s.k || d == &s.v)) continue;  // pools count pages, not sequences
    if (d->dim[0] == spec.batch) d->dim[0] = batch;
  }
  if (s.bias && s.bias_desc.dim[0] > 1) s.bias_desc.dim[0] = batch;
  if (s.dbias && s.dbias_desc.dim[0] > 1) s.dbias_desc.dim[0] = batch;
  return s;
}

int ParseMaxBatchChunks(const char* value, std::string* off_reason) {
  off_reason->clear();
  if (value == nullptr || *value == '\0') return kMaxBatchChunks;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || n < 0) {
    *off_reason = Format("FUSEDATTN_CUDNN_BATCH_CHUNKS = '%s' is not a count: batch chunks off",
                         value);
    return 1;
  }
  if (n <= 1) {
    *off_reason = Format("FUSEDATTN_CUDNN_BATCH_CHUNKS = %lld: batch chunks off", n);
    return 1;
  }
  return n > kMaxBatchChunks ? kMaxBatchChunks : static_cast<int>(n);
}

int64_t TablePages(int64_t seqlen_kv, int64_t page_size) {
  return page_size > 0 ? (seqlen_kv + page_size - 1) / page_size : 0;
}

int64_t CanonicalNumPages(const Problem& p) {
  const int64_t pages = p.config.batch * TablePages(p.config.max_seqlen_kv, p.config.page_size);
  return pages > 0 ? pages : 1;
}

FwdTensors CanonicalFwdTensors(const Problem& p) {
  const auto& c = p.config;
  FwdTensors t;
  t.q = Canonical(c.q_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_qk, c.qkv_dtype);
  if (p.paged) {  // contiguous pools: a page is a "sequence" of page_size tokens
    t.num_pages = CanonicalNumPages(p);
    t.k = Canonical(c.kv_format, t.num_pages, c.page_size, c.heads_kv, c.head_dim_qk,
                    c.qkv_dtype);
    t.v = Canonical(c.kv_format, t.num_pages, c.page_size, c.heads_kv, c.head_dim_v, c.qkv_dtype);
  } else {
    t.k = Canonical(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk,
                    c.qkv_dtype);
    t.v = Canonical(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_v,
                    c.qkv_dtype);
  }
  t.o = Canonical(c.o_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_v, c.o_dtype);
  if (p.needs_lse()) t.lse = CanonicalLse(p);
  if (p.has_tensor_bias()) t.bias = CanonicalBias(p);
  t.score_mod_tensors = CanonicalAux(p);
  return t;
}

BwdTensors CanonicalBwdTensors(const Problem& p) {
  const auto& c = p.config;
  BwdTensors t;
  t.q = Canonical(c.q_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_qk, c.qkv_dtype);
  t.k = Canonical(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk, c.qkv_dtype);
  t.v = Canonical(c.kv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_v, c.qkv_dtype);
  t.o = Canonical(c.o_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_v, c.o_dtype);
  t.d_o = Canonical(c.do_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_v, c.do_dtype);
  t.dq = Canonical(c.dqkv_format, c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_qk, c.dqkv_dtype);
  t.dk = Canonical(c.dqkv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk,
                   c.dqkv_dtype);
  t.dv = Canonical(c.dqkv_format, c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_v,
                   c.dqkv_dtype);
  t.lse = CanonicalLse(p);
  if (p.has_tensor_bias()) t.bias = CanonicalBias(p);
  if (c.bias_requires_grad) t.dbias = CanonicalBias(p);
  t.score_mod_tensors = CanonicalAux(p);
  return t;
}

CallPlan ForwardCallPlan(const Problem& p, const FwdTensors& t) {
  const auto& c = p.config;
  CallPlan call;
  CudnnMask mask = CudnnMaskOf(p);
  Band band = BandOf(p);
  const bool lengths = p.padding || p.paged;  // per-sequence lengths (paged: the key lengths)
  bool empty_rows = !lengths && band.any_row_empty(c.max_seqlen_q, c.max_seqlen_kv);
  call.padding = lengths;
  call.const_lengths = mask.const_lengths;
  // Rows that see no key need O = 0 and LSE = -inf written; an LSE laid out otherwise than
  // packed [batch, heads, seqlen_q] is written by the same kernel from staged stats, so that the
  // graph (and the plan check() built) stays the same for every LSE layout.
  call.stage_stats = p.needs_lse() && (lengths || empty_rows ||
                                       !LsePackedBhsd(p, t.lse, t.lse_packed));
  call.fixup = lengths || empty_rows || call.stage_stats;
  // cuDNN reads a learnable sink straight from the caller when it is contiguous float32 [heads]
  // and 16-byte aligned; another one is copied, and the off-by-one softmax's zero logits are
  // written (fwd_workspace_size reserves the copy's scratch whatever the tensor).
  const bool sink_as_is = (t.sink_stride == 1 || c.heads_q == 1) &&
                          reinterpret_cast<uintptr_t>(t.sink_logits) % 16 == 0;
  call.stage_sink = c.softmax_type == FUSEDATTN_SOFTMAX_OFF_BY_ONE ||
                    (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK && !sink_as_is);
  if (p.has_score_mod()) {
    // The callback decides visibility per element, so only cuDNN's stats tell which rows saw
    // no key: they are always staged and the fix-up reads them. Lengths stay the real ones
    // (the callback masks padding itself).
    call.const_lengths = false;
    call.stage_stats = true;
    call.fixup = true;
    call.empty_by_stats = true;
  }
  // cuDNN reads the page table as [batch, 1, table_pages, 1]: the prepare kernel writes it from
  // the caller's, every entry a page of the pool (kernels.h PrepareParams).
  call.page_table = p.paged;
  call.prep = call.padding || call.const_lengths || call.stage_sink || call.page_table;
  return call;
}

CallPlan BackwardCallPlan(const Problem& p, const BwdTensors& t) {
  const auto& c = p.config;
  CallPlan call;
  CudnnMask mask = CudnnMaskOf(p);
  Band band = BandOf(p);
  bool empty_rows = !p.padding && band.any_row_empty(c.max_seqlen_q, c.max_seqlen_kv);
  bool unseen_keys = !p.padding && band.any_key_unseen(c.max_seqlen_q, c.max_seqlen_kv);
  call.padding = p.padding;
  call.const_lengths = mask.const_lengths;
  call.fixup = p.padding || empty_rows || unseen_keys;
  // The backward reads LSE as packed [batch, heads, seqlen_q] (cuDNN before 9.26), and rows that
  // see no key carry LSE = -inf, which cuDNN would turn into exp(-inf - -inf) = NaN: such LSE
  // goes through scratch with +inf there (every probability of the row is then 0).
  call.stage_stats = p.padding || empty_rows || !LsePackedBhsd(p, t.lse, t.lse_packed);
  call.fixup_dbias = c.bias_requires_grad && (p.padding || p.has_band());
  call.dsink = c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  if (p.has_score_mod()) {
    // Rows a score_mod hid entirely carry LSE = -inf; staging turns it into +inf (every
    // probability 0) where cuDNN would form exp(-inf - -inf) = NaN.
    call.const_lengths = false;
    call.stage_stats = true;
  }
  // The prepare kernel also zeroes the epilogue's dsink counter.
  call.prep = call.padding || call.const_lengths || call.stage_stats || call.dsink;
  return call;
}

namespace {
void SetFp8(const Problem& p, SdpaGraphSpec* s) {
  if (!p.fp8) return;
  s->fp8 = true;
  s->o_dtype = p.config.o_dtype;
  if (s->direction == Direction::kBackward) {
    s->do_dtype = p.config.do_dtype;
    s->dqkv_dtype = p.config.dqkv_dtype;
  }
}
}  // namespace

SdpaGraphSpec ForwardSpec(const Problem& p, const FwdTensors& t) {
  const auto& c = p.config;
  CudnnMask mask = CudnnMaskOf(p);
  SdpaGraphSpec s;
  s.direction = Direction::kForward;
  s.io_dtype = c.qkv_dtype;
  s.batch = GraphBatch(p);
  s.heads_q = c.heads_q, s.heads_kv = c.heads_kv;
  s.seqlen_q = c.max_seqlen_q, s.seqlen_kv = c.max_seqlen_kv;
  s.head_dim_qk = c.head_dim_qk, s.head_dim_v = c.head_dim_v;
  s.ragged = p.thd;
  s.q = DescOf(t.q, s.batch, c.heads_q, c.max_seqlen_q, c.head_dim_qk, p.thd);
  s.k = DescOf(t.k, s.batch, c.heads_kv, c.max_seqlen_kv, c.head_dim_qk, p.thd);
  s.v = DescOf(t.v, s.batch, c.heads_kv, c.max_seqlen_kv, c.head_dim_v, p.thd);
  s.o = DescOf(t.o, s.batch, c.heads_q, c.max_seqlen_q, c.head_dim_v, p.thd);
  // Packed [batch, heads_q, seqlen_q]: the caller's LSE when it is laid out so and needs no
  // fix-up, else our staged copy (ForwardCallPlan).
  s.stats = p.needs_lse();
  if (s.stats) PackedStatsStrides(p, s.stats_stride);
  s.padding = mask.padding;
  s.has_left_bound = mask.has_left, s.left_bound = mask.has_left ? mask.left_bound : 0;
  s.has_right_bound = mask.has_right, s.right_bound = mask.has_right ? mask.right_bound : 0;
  s.bottom_right = mask.bottom_right;
  if (c.bias_type == FUSEDATTN_BIAS_POST_SCALE) {
    s.bias = true;
    s.bias_dtype = t.bias.dtype;
    s.bias_desc = BiasDescOf(p, t.bias);
  }
  s.sink = c.softmax_type != FUSEDATTN_SOFTMAX_VANILLA;
  s.attn_scale = static_cast<float>(p.scale());
  s.dropout = static_cast<float>(c.dropout);
  if (p.has_score_mod()) {
    SetScoreMod(p, t.score_mod_tensors, &s);
    s.stats = true;  // the fix-up finds the rows a score_mod hid from the stats (CallPlan)
    PackedStatsStrides(p, s.stats_stride);
  }
  if (p.paged) {
    // The pools as cuDNN's containers, with the strides the caller's page layout has (a page is
    // a "sequence" of page_size tokens of the view: problem.h).
    s.paged = true;
    s.page_size = c.page_size;
    s.num_pages = t.num_pages;
    s.table_pages = TablePages(c.max_seqlen_kv, c.page_size);
    s.k = DescOf(t.k, t.num_pages, c.heads_kv, c.page_size, c.head_dim_qk, false);
    s.v = DescOf(t.v, t.num_pages, c.heads_kv, c.page_size, c.head_dim_v, false);
  }
  SetFp8(p, &s);
  return s;
}

SdpaGraphSpec BackwardSpec(const Problem& p, const BwdTensors& t) {
  const auto& c = p.config;
  CudnnMask mask = CudnnMaskOf(p);
  SdpaGraphSpec s;
  s.direction = Direction::kBackward;
  s.io_dtype = c.qkv_dtype;
  s.batch = GraphBatch(p);
  s.heads_q = c.heads_q, s.heads_kv = c.heads_kv;
  s.seqlen_q = c.max_seqlen_q, s.seqlen_kv = c.max_seqlen_kv;
  s.head_dim_qk = c.head_dim_qk, s.head_dim_v = c.head_dim_v;
  s.ragged = p.thd;
  s.q = DescOf(t.q, s.batch, c.heads_q, c.max_seqlen_q, c.head_dim_qk, p.thd);
  s.k = DescOf(t.k, s.batch, c.heads_kv, c.max_seqlen_kv, c.head_dim_qk, p.thd);
  s.v = DescOf(t.v, s.batch, c.heads_kv, c.max_seqlen_kv, c.head_dim_v, p.thd);
  s.o = DescOf(t.o, s.batch, c.heads_q, c.max_seqlen_q, c.head_dim_v, p.thd);
  s.d_o = DescOf(t.d_o, s.batch, c.heads_q, c.max_seqlen_q, c.head_dim_v, p.thd);
  s.dq = DescOf(t.dq, s.batch, c.heads_q, c.max_seqlen_q, c.head_dim_qk, p.thd);
  s.dk = DescOf(t.dk, s.batch, c.heads_kv, c.max_seqlen_kv, c.head_dim_qk, p.thd);
  s.dv = DescOf(t.dv, s.batch, c.heads_kv, c.max_seqlen_kv, c.head_dim_v, p.thd);
  // Always packed [batch, heads_q, seqlen_q]: the caller's LSE when it is laid out so and needs
  // no fix-up, else our staged copy (BackwardCallPlan).
  s.stats = true;
  PackedStatsStrides(p, s.stats_stride);
  s.padding = mask.padding;
  s.has_left_bound = mask.has_left, s.left_bound = mask.has_left ? mask.left_bound : 0;
  s.has_right_bound = mask.has_right, s.right_bound = mask.has_right ? mask.right_bound : 0;
  s.bottom_right = mask.bottom_right;
  if (c.bias_type == FUSEDATTN_BIAS_POST_SCALE) {
    s.bias = true;
    s.bias_dtype = t.bias.dtype;
    s.bias_desc = BiasDescOf(p, t.bias);
    if (c.bias_requires_grad) {
      s.dbias = true;
      s.dbias_desc = BiasDescOf(p, t.dbias);
    }
  }
  // The sink changes only LSE, which the backward reads; dQ/dK/dV follow from it unchanged, and
  // dsink is computed by our own kernel (cuDNN's reduction has the opposite sign convention).
  s.sink = false;
  s.attn_scale = static_cast<float>(p.scale());
  s.dropout = static_cast<float>(c.dropout);
  s.deterministic = c.deterministic != 0;
  if (p.has_score_mod()) SetScoreMod(p, t.score_mod_tensors, &s);
  SetFp8(p, &s);
  return s;
}

namespace {

// The hash of a key's used words and its score_mod.
void FinishKey(PlanKey* key) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < key->Used(); ++i) {
    h ^= static_cast<uint64_t>(key->words[i]);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  h ^= static_cast<uint64_t>(key->used);
  h *= 1099511628211ull;
  h ^= flex::ScoreModKeyHash()(key->score_mod);
  h *= 1099511628211ull;
  key->hash = static_cast<size_t>(h);
}

// A tensor's layout without its shape: the axes from the smallest stride up and, per axis,
// whether its stride is exactly the previous axis' stride times that axis' extent (dense) or 1
// for the innermost. Equal strides come from an axis of extent 1 (batch 1, sequence length 1):
// that axis goes first, so that SBHD at batch 1 orders its axes as at batch 2; otherwise the later
// axis first, as in a contiguous tensor.
void AddLayout(const TensorDesc& d, KeyWriter* w) {
  int order[4] = {3, 2, 1, 0};
  std::sort(order, order + 4, [&](int a, int b) {
    if (d.stride[a] != d.stride[b]) return d.stride[a] < d.stride[b];
    if ((d.dim[a] == 1) != (d.dim[b] == 1)) return d.dim[a] == 1;
    return a > b;
  });
  int64_t code = 0;
  for (int k = 0; k < 4; ++k) {
    const int axis = order[k];
    const bool dense = k == 0 ? d.stride[axis] == 1
                              : d.stride[axis] == d.stride[order[k - 1]] * d.dim[order[k - 1]];
    code = code * 16 + axis * 2 + (dense ? 1 : 0);
  }
  w->add(code);
}

// A q/k/v-like tensor: heads and head dim, and its layout.
void AddStructure(const TensorDesc& d, KeyWriter* w) {
  w->add(d.dim[1]), w->add(d.dim[3]);
  AddLayout(d, w);
}

// Every word of MakePlanKey that does not follow from batch and sequence lengths.
void WriteStructure(const SdpaGraphSpec& s, KeyWriter* w) {
  const bool bwd = s.direction == Direction::kBackward;
  w->add(static_cast<int64_t>(s.direction));
  w->add(s.io_dtype);
  w->add(s.heads_q), w->add(s.heads_kv), w->add(s.head_dim_qk), w->add(s.head_dim_v);
  w->add(s.ragged);
  AddStructure(s.q, w), AddStructure(s.k, w), AddStructure(s.v, w), AddStructure(s.o, w);
  if (bwd) AddStructure(s.d_o, w), AddStructure(s.dq, w), AddStructure(s.dk, w), AddStructure(s.dv, w);
  w->add(s.stats);
  w->add(s.padding);
  w->add(s.has_left_bound), w->add(s.left_bound), w->add(s.has_right_bound), w->add(s.right_bound);
  w->add(s.bottom_right);
  w->add(s.bias);
  if (s.bias) {
    w->add(s.bias_dtype), w->add(s.bias_desc.dim[0] == 1), w->add(s.bias_desc.dim[1]);
    AddLayout(s.bias_desc, w);
  }
  w->add(s.dbias);
  if (s.dbias) w->add(s.dbias_desc.dim[0] == 1), w->add(s.dbias_desc.dim[1]), AddLayout(s.dbias_desc, w);
  w->add(s.sink);
  w->add_float(s.attn_scale);
  w->add_float(s.dropout);
  w->add(s.deterministic);
  w->add(s.fp8);
  if (s.fp8) w->add(s.o_dtype), w->add(s.do_dtype), w->add(s.dqkv_dtype);
  w->add(s.paged);
  if (s.paged) w->add(s.page_size);  // the pool's extent and the table's width are shape
  w->add(s.score_mod != nullptr);
  if (s.score_mod) {
    w->add(s.mod_band.left), w->add(s.mod_band.right), w->add(s.mod_band.bottom_right);
    w->add(s.mod_seq_lens);
    w->add(static_cast<int64_t>(s.aux.size()));
    for (const auto& a : s.aux) {
      w->add(a.dtype);
      for (int i = 0; i < 4; ++i) w->add(a.desc.dim[i] == 1);
      AddLayout(a.desc, w);
    }
  }
}

}  // namespace

PlanKey MakePlanKey(const SdpaGraphSpec& s, const DeviceInfo& device) {
  PlanKey key;
  KeyWriter w(&key);
  bool bwd = s.direction == Direction::kBackward;
  w.add(static_cast<int64_t>(s.direction));
  w.add(s.io_dtype);
  w.add(s.batch);
  w.add(s.heads_q), w.add(s.heads_kv), w.add(s.seqlen_q), w.add(s.seqlen_kv);
  w.add(s.head_dim_qk), w.add(s.head_dim_v);
  w.add(s.ragged);
  w.add(s.q), w.add(s.k), w.add(s.v), w.add(s.o);
  if (bwd) w.add(s.d_o), w.add(s.dq), w.add(s.dk), w.add(s.dv);
  w.add(s.stats);
  for (int i = 0; i < 4; ++i) w.add(s.stats ? s.stats_stride[i] : 0);
  w.add(s.padding);
  w.add(s.has_left_bound), w.add(s.left_bound), w.add(s.has_right_bound), w.add(s.right_bound);
  w.add(s.bottom_right);
  w.add(s.bias);
  if (s.bias) w.add(s.bias_dtype), w.add(s.bias_desc);
  w.add(s.dbias);
  if (s.dbias) w.add(s.dbias_desc);
  w.add(s.sink);
  w.add_float(s.attn_scale);
  w.add_float(s.dropout);
  w.add(s.deterministic);
  w.add(s.fp8);
  if (s.fp8) w.add(s.o_dtype), w.add(s.do_dtype), w.add(s.dqkv_dtype);
  w.add(s.paged);
  if (s.paged) w.add(s.page_size), w.add(s.num_pages), w.add(s.table_pages);
  w.add(s.score_mod != nullptr);
  if (s.score_mod) {
    w.add(s.mod_band.left), w.add(s.mod_band.right), w.add(s.mod_band.bottom_right);
    w.add(s.mod_seq_lens);
    w.add(static_cast<int64_t>(s.aux.size()));
    for (const auto& a : s.aux) w.add(a.dtype), w.add(a.desc);
  }
  key.score_mod.score_mod = s.score_mod;
  w.add(device.ordinal), w.add(device.compute_capability), w.add(device.cudnn_version);
  key.used = w.count();
  FinishKey(&key);
  return key;
}

PlanKey MakeStructureKey(const SdpaGraphSpec& s, const DeviceInfo& device) {
  PlanKey key;
  KeyWriter w(&key);
  WriteStructure(s, &w);
  key.score_mod.score_mod = s.score_mod;
  w.add(device.ordinal), w.add(device.compute_capability), w.add(device.cudnn_version);
  key.used = w.count();
  FinishKey(&key);
  return key;
}

Status DynamicShapeRefusal(const SdpaGraphSpec& s) {
  if (s.fp8) return NotSupported("FP8 graphs are built per shape");
  if (s.paged)
    return NotSupported("paged K/V graphs are built per shape (their page-table width and "
                        "max_seq_len_kv are graph attributes no execute-time shape carries)");
  if (s.score_mod)
    return NotSupported("a score_mod's callbacks hold the sequence lengths as graph constants, so "
                        "its graphs are built per shape");
  return Status::Ok();
}

const char* const kDynamicShapesWarning =
    "dynamic shapes are experimental: on cuDNN 9.19 (H100, 2026-11-24) plans built for a new "
    "shape from a structure's kernel cache gave wrong results";

namespace {

std::string VersionText(int64_t v) {
  return Format("%lld.%lld.%lld", (long long)(v / 10000), (long long)(v % 10000 / 100),
                (long long)(v % 100));
}

bool IsOneOf(const char* value, std::initializer_list<const char*> words) {
  for (const char* word : words) {
    size_t i = 0;
    while (value[i] != '\0' && word[i] != '\0' &&
           std::tolower(static_cast<unsigned char>(value[i])) == word[i])
      ++i;
    if (value[i] == '\0' && word[i] == '\0') return true;
  }
  return false;
}

}  // namespace

Status PagedVersionRefusal(const Problem& p, int64_t cudnn_version) {
  if (!p.paged) return Status::Ok();
  const auto& c = p.config;
  const long long page = static_cast<long long>(c.page_size);
  if (cudnn_version < kMinPagedCudnn)
    return NotSupported("paged K/V (page_size = %lld): cuDNN %s is loaded; cuDNN reads paged "
                        "caches from %s on (the reference runs it)",
                        page, VersionText(cudnn_version).c_str(),
                        VersionText(kMinPagedCudnn).c_str());
  if (p.thd && cudnn_version < kMinPagedRaggedCudnn)
    return NotSupported("paged K/V (page_size = %lld) with THD queries: cuDNN %s is loaded; "
                        "ragged queries next to paged caches need %s (cudnn-frontend's paged "
                        "prefill sample; the reference runs it)",
                        page, VersionText(cudnn_version).c_str(),
                        VersionText(kMinPagedRaggedCudnn).c_str());
  // cudnn-frontend sdpa_support_surface.h: "Paged attention only supported with d_qk and d_v <=
  // 128 for backend version 9.9 or below" (its test: version <= 9.9.0).
  if (cudnn_version <= 90900 && (c.head_dim_qk > 128 || c.head_dim_v > 128))
    return NotSupported("paged K/V (page_size = %lld) with head_dim_qk = %lld, head_dim_v = "
                        "%lld: cuDNN %s reads paged caches for head dims up to 128 only (the "
                        "reference runs it)",
                        page, (long long)c.head_dim_qk, (long long)c.head_dim_v,
                        VersionText(cudnn_version).c_str());
  return Status::Ok();
}

DynamicShapesSetting ParseDynamicShapes(const char* value, int64_t cudnn_version) {
  DynamicShapesSetting s;
  const bool unset = value == nullptr || *value == '\0';
  if (unset) {
    s.off_reason = Format("per-shape plans by default (%s; FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1 "
                          "turns them on)",
                          kDynamicShapesWarning);
    return s;
  }
  if (IsOneOf(value, {"0", "off", "false", "no"})) {
    s.off_reason = Format("FUSEDATTN_CUDNN_DYNAMIC_SHAPES = '%s': per-shape plans", value);
    return s;
  }
  DynamicShapesMode mode = DynamicShapesMode::kOff;
  if (IsOneOf(value, {"1", "on", "true", "yes"})) mode = DynamicShapesMode::kOn;
  if (IsOneOf(value, {"no-override"})) mode = DynamicShapesMode::kOnWithoutOverrides;
  if (mode == DynamicShapesMode::kOff) {
    s.off_reason = Format("FUSEDATTN_CUDNN_DYNAMIC_SHAPES = '%s' is not 1 (or no-override): "
                          "per-shape plans",
                          value);
    return s;
  }
  const int64_t needed = mode == DynamicShapesMode::kOn ? kMinExecuteTimeShapesCudnn
                                                        : kMinDynamicShapesCudnn;
  if (cudnn_version < needed) {
    s.off_reason = Format("FUSEDATTN_CUDNN_DYNAMIC_SHAPES = '%s' needs cuDNN %s, %s is loaded: "
                          "per-shape plans",
                          value, VersionText(needed).c_str(), VersionText(cudnn_version).c_str());
    return s;
  }
  s.mode = mode;
  return s;
}

// ------------------------------------------------------------------------------------------------
// Sequence-length route
// ------------------------------------------------------------------------------------------------
namespace {
int64_t PowerOfTwoAtLeast(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// Whether a ragged graph of these extents keeps its element offsets within int32, as PreCheck
// asks of every THD problem.
bool RouteFits(const Problem& p, const RouteExtents& e) {
  const auto& c = p.config;
  const int64_t dim = c.head_dim_qk > c.head_dim_v ? c.head_dim_qk : c.head_dim_v;
  return e.batch * e.seqlen_q * c.heads_q * dim <= kInt32Max &&
         e.batch * e.seqlen_kv * c.heads_kv * dim <= kInt32Max;
}
}  // namespace

int64_t RouteSeqlenExtent(int64_t seqlen) {
  return PowerOfTwoAtLeast(seqlen < kMinRouteSeqlen ? kMinRouteSeqlen : seqlen);
}

RouteExtents RouteExtentsOf(const Problem& p) {
  const auto& c = p.config;
  return RouteExtents{PowerOfTwoAtLeast(c.batch), RouteSeqlenExtent(c.max_seqlen_q),
                      RouteSeqlenExtent(c.max_seqlen_kv)};
}

std::vector<RouteExtents> RouteCandidates(const Problem& p) {
  const RouteExtents own = RouteExtentsOf(p);
  std::vector<RouteExtents> out;
  for (int64_t b : {own.batch, 2 * own.batch})
    for (int64_t sq : {own.seqlen_q, 2 * own.seqlen_q})
      for (int64_t skv : {own.seqlen_kv, 2 * own.seqlen_kv})
        if (RouteFits(p, RouteExtents{b, sq, skv})) out.push_back(RouteExtents{b, sq, skv});
  // Fewest rows a graph sizes its grid and workspace by first; then the smaller batch.
  std::stable_sort(out.begin(), out.end(), [](const RouteExtents& x, const RouteExtents& y) {
    const int64_t rx = x.batch * (x.seqlen_q + x.seqlen_kv), ry = y.batch * (y.seqlen_q + y.seqlen_kv);
    return rx != ry ? rx < ry : x.batch < y.batch;
  });
  return out;
}

Status SeqlenRouteRefusal(const Problem& p, const SdpaGraphSpec& s) {
  const auto& c = p.config;
  if (p.thd) return NotSupported("THD plans already serve every longest sequence of a bucket");
  if (p.paged || s.paged)
    return NotSupported("paged K/V: its keys are read through the page table, not ragged "
                        "offsets (its plans already serve the longest caches of a bucket where "
                        "no tensor has the key extent)");
  if (p.fp8 || s.fp8) return NotSupported("FP8 graphs take no ragged offsets in this backend");
  const struct {
    const char* name;
    fusedattn_format format;
    bool used;
  } formats[] = {{"q_format", c.q_format, true},
                 {"kv_format", c.kv_format, true},
                 {"o_format", c.o_format, true},
                 {"do_format", c.do_format, c.is_training != 0},
                 {"dqkv_format", c.dqkv_format, c.is_training != 0}};
  for (const auto& f : formats) {
    if (f.used && f.format != FUSEDATTN_FORMAT_BSHD)
      return NotSupported(
          "%s = %s: only a BSHD tensor is a THD tensor with ragged offsets b * stride_b (SBHD's "
          "sequence stride holds the batch, BHSD's head stride the sequence length)",
          f.name, FormatName(f.format));
  }
  if (p.has_score_mod() || s.score_mod)
    return NotSupported("a score_mod on cuDNN's callbacks holds the sequence lengths as graph "
                        "constants");
  if (p.has_tensor_bias() || s.bias)
    return NotSupported("a bias tensor has the sequence lengths as dimensions");
  if (c.dropout > 0.0 || s.dropout > 0.0f)
    return NotSupported(
        "dropout: cuDNN numbers its random stream over the graph's extents, so a forward and a "
        "backward run through plans of other extents would draw other masks");
  if (RouteCandidates(p).empty())
    return NotSupported("batch * max_seqlen * heads * head_dim at the ragged plan's extents "
                        "exceeds int32 (cuDNN's ragged offsets)");
  const bool bwd = s.direction == Direction::kBackward;
  const struct {
    const char* name;
    const TensorDesc& desc;
    bool used;
  } tensors[] = {{"q", s.q, true},       {"k", s.k, true},     {"v", s.v, true},
                 {"o", s.o, true},       {"dO", s.d_o, bwd},   {"dQ", s.dq, bwd},
                 {"dK", s.dk, bwd},      {"dV", s.dv, bwd}};
  for (const auto& t : tensors) {
    if (!t.used) continue;
    const int64_t batch = t.desc.dim[0], rows = t.desc.dim[2] * t.desc.stride[2];
    if (batch > 1 && t.desc.stride[0] < rows)
      return NotSupported(
          "the sequences of %s overlap (batch stride %lld < %lld rows of %lld elements): a "
          "ragged tensor's sequences are disjoint blocks of rows",
          t.name, (long long)t.desc.stride[0], (long long)t.desc.dim[2],
          (long long)t.desc.stride[2]);
    const int64_t step = batch > 1 ? t.desc.stride[0] : rows;
    if (batch * step > kInt32Max)
      return NotSupported("%s spans %lld elements: cuDNN's ragged offsets are int32", t.name,
                          (long long)(batch * step));
  }
  return Status::Ok();
}

Problem RoutedProblem(const Problem& p, const RouteExtents& e) {
  Problem r = p;
  fusedattn_config& c = r.config;
  c.batch = e.batch;
  c.max_seqlen_q = e.seqlen_q;
  c.max_seqlen_kv = e.seqlen_kv;
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  // The same band, with per-sequence lengths (every band is per sequence: common/band.h).
  switch (c.mask) {
    case FUSEDATTN_MASK_NONE: c.mask = FUSEDATTN_MASK_PADDING; break;
    case FUSEDATTN_MASK_CAUSAL: c.mask = FUSEDATTN_MASK_PADDING_CAUSAL; break;
    case FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT:
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
      break;
    default: break;  // already a padding mask
  }
  r.thd = true;
  r.padding = true;
  return r;
}

int64_t RouteSequenceStep(const TensorView& v, int64_t batch, int64_t seqlen) {
  return batch > 1 ? v.stride_b : seqlen * v.stride_s;
}

SeqlenRouteMode ParseSeqlenRoute(const char* value, std::string* off_reason) {
  off_reason->clear();
  if (value == nullptr || *value == '\0' || IsOneOf(value, {"1", "on", "true", "yes"}))
    return SeqlenRouteMode::kOn;
  if (IsOneOf(value, {"eager"})) return SeqlenRouteMode::kEager;
  if (IsOneOf(value, {"0", "off", "false", "no"}))
    *off_reason = Format("FUSEDATTN_CUDNN_SEQLEN_ROUTE = '%s': every sequence length builds "
                         "plans of its own",
                         value);
  else
    *off_reason = Format("FUSEDATTN_CUDNN_SEQLEN_ROUTE = '%s' is not 1, eager or 0: off (every "
                         "sequence length builds plans of its own)",
                         value);
  return SeqlenRouteMode::kOff;
}

bool ParseBackgroundBuild(const char* value, std::string* off_reason) {
  off_reason->clear();
  if (value == nullptr || *value == '\0' || IsOneOf(value, {"1", "on", "true", "yes"}))
    return true;
  if (IsOneOf(value, {"0", "off", "false", "no"}))
    *off_reason = Format("FUSEDATTN_CUDNN_BACKGROUND_BUILD = '%s': a new shape's plans are built "
                         "in the call that needs them",
                         value);
  else
    *off_reason = Format("FUSEDATTN_CUDNN_BACKGROUND_BUILD = '%s' is not 1 or 0: off (a new "
                         "shape's plans are built in the call that needs them)",
                         value);
  return false;
}

Status BackgroundBuildRefusal(const Problem& problem) {
  if (problem.config.deterministic)
    return NotSupported("deterministic: which backend runs it must not depend on a build's "
                        "timing");
  if (problem.has_dropout())
    return NotSupported("dropout: its forward and backward must run on one backend to draw one "
                        "mask");
  if (problem.has_score_mod())
    return NotSupported("a score_mod graph: the next backend may compile it for seconds (flash's "
                        "run-time compiler), longer than cuDNN's build");
  return Status::Ok();
}

std::string KernelCacheDiskKey(const SdpaGraphSpec& s, const MachineIdentity& m) {
  PlanKey structure;
  KeyWriter w(&structure);
  WriteStructure(s, &w);
  std::string key = Format(
      "fusedattn cudnn kernel cache v1\nfusedattn %s\ncudnn %lld\ncudnn-frontend %d\n"
      "gpu %s | sm_%d | %d SMs | uuid %s\ndriver %d\nstructure",
      m.fusedattn_version.c_str(), (long long)m.cudnn_version, m.frontend_version,
      m.gpu_name.c_str(), m.compute_capability, m.sm_count, m.gpu_uuid.c_str(), m.driver_version);
  for (size_t i = 0; i < w.count() && i < PlanKey::kWords; ++i)
    key += Format(" %llx", (unsigned long long)structure.words[i]);
  if (s.score_mod) {  // never reached today (DynamicShapeRefusal), kept exact should that change
    key += "\nscore_mod";
    for (uint64_t word : s.score_mod->words()) key += Format(" %llx", (unsigned long long)word);
  }
  return key;
}

std::string PlanDiskKey(const SdpaGraphSpec& s, const MachineIdentity& m) {
  // The plan key's words with the ordinal zeroed, and the GPU by model (name, architecture, SM
  // count), not by board: the eight GPUs of a machine share one file per plan.
  const PlanKey plan = MakePlanKey(s, DeviceInfo{0, m.compute_capability, m.cudnn_version});
  std::string key = Format(
      "fusedattn cudnn plan v1\nfusedattn %s\ncudnn %lld\ncudnn-frontend %d\n"
      "gpu %s | sm_%d | %d SMs\ndriver %d\nplan",
      m.fusedattn_version.c_str(), (long long)m.cudnn_version, m.frontend_version,
      m.gpu_name.c_str(), m.compute_capability, m.sm_count, m.driver_version);
  for (size_t i = 0; i < plan.Used(); ++i)
    key += Format(" %llx", (unsigned long long)plan.words[i]);
  if (s.score_mod) {
    key += "\nscore_mod";
    for (uint64_t word : s.score_mod->words()) key += Format(" %llx", (unsigned long long)word);
  }
  return key;
}

namespace {
// Room for the per-sequence lengths of a call: [batch], or the chunked layout's arrays
// (BatchChunks::seq_len_offset), which hold at most the chunks' batches plus 3 per chunk:
// batch + batch / kMaxChunkWaste + 3 * kMaxBatchChunks ints.
int64_t SeqLenInts(int64_t batch) {
  return batch < 2 ? batch : 2 * batch + 4 * kMaxBatchChunks;
}
}  // namespace

Scratch ForwardScratch(const Problem& p, const CallPlan& call) {
  const auto& c = p.config;
  const int64_t batch = GraphBatch(p);
  Scratch s;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    size_t offset = at;
    at += AlignUp(bytes);
    return offset;
  };
  if (call.padding || call.const_lengths) {
    s.seq_len_q = take(sizeof(int32_t) * SeqLenInts(batch));
    s.seq_len_kv = take(sizeof(int32_t) * SeqLenInts(batch));
  }
  if (p.thd)
    for (int slot : {kRaggedQ, kRaggedK, kRaggedV, kRaggedO}) {
      if (p.paged && (slot == kRaggedK || slot == kRaggedV)) continue;  // pools are not ragged
      s.ragged[slot] = take(sizeof(int32_t) * (batch + 1));
    }
  if (call.stage_stats) s.stats = take(sizeof(float) * batch * c.heads_q * c.max_seqlen_q);
  if (call.stage_sink) s.sink = take(sizeof(float) * c.heads_q);
  if (call.page_table)
    s.page_table = take(sizeof(int32_t) * batch * TablePages(c.max_seqlen_kv, c.page_size));
  s.bytes = at;
  return s;
}

Scratch BackwardScratch(const Problem& p, const CallPlan& call) {
  const auto& c = p.config;
  const int64_t batch = GraphBatch(p);
  Scratch s;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    size_t offset = at;
    at += AlignUp(bytes);
    return offset;
  };
  if (call.padding || call.const_lengths) {
    s.seq_len_q = take(sizeof(int32_t) * SeqLenInts(batch));
    s.seq_len_kv = take(sizeof(int32_t) * SeqLenInts(batch));
  }
  if (p.thd)
    for (int slot = 0; slot < kRaggedSlots; ++slot)
      s.ragged[slot] = take(sizeof(int32_t) * (batch + 1));
  if (call.stage_stats) s.stats = take(sizeof(float) * batch * c.heads_q * c.max_seqlen_q);
  if (call.dsink) {
    s.dsink_partials = take(sizeof(float) * kDsinkChunks * c.heads_q);
    s.dsink_done = take(sizeof(uint32_t));
  }
  s.bytes = at;
  return s;
}

size_t WorkspaceBytes(size_t scratch_bytes, int64_t cudnn_bytes) {
  size_t cudnn = cudnn_bytes > 0 ? static_cast<size_t>(cudnn_bytes) : 0;
  if (scratch_bytes == 0 && cudnn == 0) return 0;
  return kWorkspaceAlignment + AlignUp(scratch_bytes) + AlignUp(cudnn);
}

Status CheckRuntimeLayout(const char* name, const TensorView& t, int64_t batch, int64_t heads,
                          int64_t seqlen, int64_t dim, bool ragged) {
  const int64_t bytes = static_cast<int64_t>(DtypeSize(t.dtype));
  if (t.stride_d != 1)
    return NotSupported("%s has head-dim stride %lld: cuDNN SDPA needs stride 1 there", name,
                        (long long)t.stride_d);
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return NotSupported("%s.data = %p is not 16-byte aligned, which cuDNN SDPA needs", name,
                        t.data);
  struct {
    const char* axis;
    int64_t extent, stride;
  } axes[] = {{"head", heads, t.stride_h}, {"sequence", seqlen, t.stride_s}};
  // A graph's tensor never repeats its elements: a stride of 0 (an input broadcast over an axis,
  // which validation allows) would be read as a packed one (DescOf), past the tensor.
  const bool batch_broadcast = !ragged && batch > 1 && t.stride_b == 0;
  for (const auto& a : axes)
    if (a.extent > 1 && a.stride == 0)
      return NotSupported("%s has %s stride 0 (broadcast over %lld %ss): cuDNN SDPA reads no "
                          "repeated elements",
                          name, a.axis, (long long)a.extent, a.axis);
  if (batch_broadcast)
    return NotSupported("%s has batch stride 0 (broadcast over %lld sequences): cuDNN SDPA reads "
                        "no repeated elements",
                        name, (long long)batch);
  for (const auto& a : axes)
    if (a.extent > 1 && (a.stride * bytes) % 16 != 0)
      return NotSupported("%s has %s stride %lld (%lld bytes), not a multiple of 16 bytes as cuDNN "
                          "SDPA needs",
                          name, a.axis, (long long)a.stride, (long long)(a.stride * bytes));
  if (ragged) {
    int64_t last = (t.num_tokens - 1) * t.stride_s + (heads - 1) * t.stride_h + (dim - 1);
    if (t.num_tokens > 0 && last > kInt32Max)
      return NotSupported("%s spans %lld elements: cuDNN's THD ragged offsets are int32", name,
                          (long long)last + 1);
  } else if (batch > 1 && (t.stride_b * bytes) % 16 != 0) {
    return NotSupported("%s has batch stride %lld, not a multiple of 16 bytes as cuDNN SDPA needs",
                        name, (long long)t.stride_b);
  }
  return Status::Ok();
}

}  // namespace fusedattn::cudnn
