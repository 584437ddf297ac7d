// Validation of configs and tensors, and their normalization into Problem / views.
// Every message names the field and the value that is wrong.
#include "problem/problem.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <utility>

#include "flex/score_mod.h"

namespace fusedattn {

size_t DtypeSize(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return 4;
    case FUSEDATTN_DTYPE_FLOAT16: return 2;
    case FUSEDATTN_DTYPE_BFLOAT16: return 2;
    case FUSEDATTN_DTYPE_FP8_E4M3: return 1;
    case FUSEDATTN_DTYPE_FP8_E5M2: return 1;
    case FUSEDATTN_DTYPE_INT32: return 4;
    case FUSEDATTN_DTYPE_DEFAULT: return 0;
  }
  return 0;
}

const char* DtypeName(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return "float32";
    case FUSEDATTN_DTYPE_FLOAT16: return "float16";
    case FUSEDATTN_DTYPE_BFLOAT16: return "bfloat16";
    case FUSEDATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case FUSEDATTN_DTYPE_FP8_E5M2: return "fp8_e5m2";
    case FUSEDATTN_DTYPE_INT32: return "int32";
    case FUSEDATTN_DTYPE_DEFAULT: return "default";
  }
  return "unknown";
}

const char* FormatName(fusedattn_format format) {
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD: return "BSHD";
    case FUSEDATTN_FORMAT_SBHD: return "SBHD";
    case FUSEDATTN_FORMAT_BHSD: return "BHSD";
    case FUSEDATTN_FORMAT_THD: return "THD";
  }
  return "unknown";
}

const char* MaskName(fusedattn_mask mask) {
  switch (mask) {
    case FUSEDATTN_MASK_NONE: return "none";
    case FUSEDATTN_MASK_PADDING: return "padding";
    case FUSEDATTN_MASK_CAUSAL: return "causal";
    case FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT: return "causal_bottom_right";
    case FUSEDATTN_MASK_PADDING_CAUSAL: return "padding_causal";
    case FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT: return "padding_causal_bottom_right";
  }
  return "unknown";
}

const char* BiasName(fusedattn_bias bias) {
  switch (bias) {
    case FUSEDATTN_BIAS_NONE: return "none";
    case FUSEDATTN_BIAS_PRE_SCALE: return "pre_scale";
    case FUSEDATTN_BIAS_POST_SCALE: return "post_scale";
    case FUSEDATTN_BIAS_ALIBI: return "alibi";
  }
  return "unknown";
}

const char* SoftmaxName(fusedattn_softmax softmax) {
  switch (softmax) {
    case FUSEDATTN_SOFTMAX_VANILLA: return "vanilla";
    case FUSEDATTN_SOFTMAX_OFF_BY_ONE: return "off_by_one";
    case FUSEDATTN_SOFTMAX_LEARNABLE_SINK: return "learnable_sink";
  }
  return "unknown";
}

std::string Problem::describe() const {
  const auto& c = config;
  std::string s = Format(
      "b=%lld hq=%lld hkv=%lld sq=%lld skv=%lld d_qk=%lld d_v=%lld %s q:%s kv:%s mask=%s",
      (long long)c.batch, (long long)c.heads_q, (long long)c.heads_kv, (long long)c.max_seqlen_q,
      (long long)c.max_seqlen_kv, (long long)c.head_dim_qk, (long long)c.head_dim_v,
      DtypeName(c.qkv_dtype), FormatName(c.q_format), FormatName(c.kv_format), MaskName(c.mask));
  if (window_left >= 0 || (window_right >= 0 && !causal))
    s += Format(" window=(%lld,%lld)", (long long)window_left, (long long)window_right);
  if (c.bias_type != FUSEDATTN_BIAS_NONE) s += Format(" bias=%s", BiasName(c.bias_type));
  if (c.softmax_type != FUSEDATTN_SOFTMAX_VANILLA)
    s += Format(" softmax=%s", SoftmaxName(c.softmax_type));
  if (c.softcap > 0) s += Format(" softcap=%g", c.softcap);
  if (c.dropout > 0) s += Format(" dropout=%g", c.dropout);
  if (has_dropout_positions())
    s += Format(" dropout_positions(b+%lld h+%lld/%lld i+%lld/%lld j+%lld)",
                (long long)c.dropout_batch_offset, (long long)c.dropout_head_offset,
                (long long)dropout_heads(), (long long)c.dropout_row_offset,
                (long long)dropout_rows(), (long long)c.dropout_key_offset);
  if (c.is_training) s += " training";
  if (paged) s += Format(" paged(page_size=%lld)", (long long)c.page_size);
  if (fp8)
    s += Format(" fp8(o:%s dO:%s dQKV:%s)", DtypeName(c.o_dtype), DtypeName(c.do_dtype),
                DtypeName(c.dqkv_dtype));
  if (score_mod) s += Format(" score_mod=%016llx", (unsigned long long)score_mod->hash().lo);
  return s;
}

namespace {
int64_t DoubleBits(double d) {
  int64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}
}  // namespace

ProblemKey KeyOf(const Problem& p) {
  const auto& c = p.config;
  ProblemKey key;
  int64_t* w = key.words.data();
  size_t n = 0;
  for (int64_t v : {int64_t{c.is_training}, c.batch, c.heads_q, c.heads_kv, c.max_seqlen_q,
                    c.max_seqlen_kv, c.head_dim_qk, c.head_dim_v, int64_t{c.qkv_dtype},
                    int64_t{c.o_dtype}, int64_t{c.q_format}, int64_t{c.kv_format},
                    int64_t{c.o_format}, int64_t{c.do_format}, int64_t{c.dqkv_format},
                    int64_t{c.mask}, p.window_left, p.window_right, int64_t{c.bias_type},
                    c.bias_batch, c.bias_heads, int64_t{c.bias_requires_grad},
                    int64_t{c.softmax_type}, DoubleBits(c.attn_scale), DoubleBits(c.softcap),
                    DoubleBits(c.dropout), int64_t{c.deterministic}, int64_t{c.return_lse},
                    int64_t{c.return_max_logit}, int64_t{c.backend},
                    static_cast<int64_t>(p.device), c.page_size, int64_t{c.do_dtype},
                    int64_t{c.dqkv_dtype}, c.dropout_batch_offset, c.dropout_heads,
                    c.dropout_head_offset, c.dropout_rows, c.dropout_row_offset,
                    c.dropout_key_offset})
    w[n++] = v;
  // The score_mod by structure (its hash here; operator== compares the graphs), never by the
  // address of the handle in the config.
  w[n++] = p.score_mod ? static_cast<int64_t>(p.score_mod->hash().lo) : 0;
  key.score_mod = p.score_mod;
  static_assert(41 <= ProblemKey::kWords, "ProblemKey too small");
  return key;
}

bool ProblemKey::operator==(const ProblemKey& other) const {
  return words == other.words && flex::SameScoreMod(score_mod.get(), other.score_mod.get());
}

size_t ProblemKeyHash::operator()(const ProblemKey& key) const {
  uint64_t h = 1469598103934665603ull;
  for (int64_t w : key.words) {
    h ^= static_cast<uint64_t>(w) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  }
  return static_cast<size_t>(h);
}

namespace {

constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;

bool IsBool(int32_t v) { return v == 0 || v == 1; }

bool IsFp8(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FP8_E4M3 || dtype == FUSEDATTN_DTYPE_FP8_E5M2;
}

// A dtype of attention data: a listed float dtype (int32 and DEFAULT are not data).
Status CheckDataDtype(const char* field, int dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32:
    case FUSEDATTN_DTYPE_FLOAT16:
    case FUSEDATTN_DTYPE_BFLOAT16:
    case FUSEDATTN_DTYPE_FP8_E4M3:
    case FUSEDATTN_DTYPE_FP8_E5M2: return Status::Ok();
    case FUSEDATTN_DTYPE_INT32:
      return InvalidArgument(
          "%s = int32: attention data must be float32, float16, bfloat16 or (FP8 attention) "
          "fp8_e4m3 / fp8_e5m2",
          field);
    case FUSEDATTN_DTYPE_DEFAULT:
      return InvalidArgument(
          "%s = -1 (FUSEDATTN_DTYPE_DEFAULT): only config.do_dtype and config.dqkv_dtype take "
          "it",
          field);
  }
  return InvalidArgument("%s = %d is not a fusedattn_dtype", field, dtype);
}

// The dtypes of the problem (see "FP8 attention" in fusedattn.h). Resolves do_dtype and
// dqkv_dtype DEFAULT. The backward's dtypes of an FP8 problem are checked by
// CheckBackwardDtypes, since a forward-only FP8 problem need not name them.
Status CheckDtypes(Problem* p) {
  fusedattn_config& c = p->config;
  FUSEDATTN_RETURN_IF_ERROR(CheckDataDtype("config.qkv_dtype", c.qkv_dtype));
  FUSEDATTN_RETURN_IF_ERROR(CheckDataDtype("config.o_dtype", c.o_dtype));
  if (c.do_dtype != FUSEDATTN_DTYPE_DEFAULT)
    FUSEDATTN_RETURN_IF_ERROR(CheckDataDtype("config.do_dtype", c.do_dtype));
  if (c.dqkv_dtype != FUSEDATTN_DTYPE_DEFAULT)
    FUSEDATTN_RETURN_IF_ERROR(CheckDataDtype("config.dqkv_dtype", c.dqkv_dtype));
  if (c.do_dtype == FUSEDATTN_DTYPE_DEFAULT) c.do_dtype = c.o_dtype;
  if (c.dqkv_dtype == FUSEDATTN_DTYPE_DEFAULT) c.dqkv_dtype = c.qkv_dtype;
  p->fp8 = c.qkv_dtype == FUSEDATTN_DTYPE_FP8_E4M3;
  if (c.qkv_dtype == FUSEDATTN_DTYPE_FP8_E5M2)
    return InvalidArgument(
        "config.qkv_dtype = fp8_e5m2: FP8 attention takes q, k, v in fp8_e4m3 (fp8_e5m2 is for "
        "dO and dQ/dK/dV: config.do_dtype, config.dqkv_dtype)");
  if (!p->fp8) {
    // The dtypes every problem had before FP8: o and dO alike, q/k/v and their gradients alike.
    if (IsFp8(c.o_dtype))
      return InvalidArgument(
          "config.o_dtype = %s with config.qkv_dtype = %s: an FP8 output needs FP8 attention "
          "(qkv_dtype fp8_e4m3)",
          DtypeName(c.o_dtype), DtypeName(c.qkv_dtype));
    if (c.do_dtype != c.o_dtype)
      return InvalidArgument(
          "config.do_dtype = %s differs from config.o_dtype = %s: only FP8 attention "
          "(qkv_dtype fp8_e4m3) takes dO in its own dtype (use default)",
          DtypeName(c.do_dtype), DtypeName(c.o_dtype));
    if (c.dqkv_dtype != c.qkv_dtype)
      return InvalidArgument(
          "config.dqkv_dtype = %s differs from config.qkv_dtype = %s: only FP8 attention "
          "(qkv_dtype fp8_e4m3) writes dQ/dK/dV in their own dtype (use default)",
          DtypeName(c.dqkv_dtype), DtypeName(c.qkv_dtype));
    return Status::Ok();
  }
  if (c.o_dtype == FUSEDATTN_DTYPE_FP8_E5M2)
    return InvalidArgument(
        "config.o_dtype = fp8_e5m2: FP8 attention writes O in fp8_e4m3, bfloat16, float16 or "
        "float32");
  if (c.is_training) return CheckBackwardDtypes(*p);
  return Status::Ok();
}

Status CheckFormat(const char* field, int format) {
  if (format < FUSEDATTN_FORMAT_BSHD || format > FUSEDATTN_FORMAT_THD)
    return InvalidArgument("%s = %d is not a fusedattn_format (BSHD=0, SBHD=1, BHSD=2, THD=3)",
                           field, format);
  return Status::Ok();
}

Status CheckPositive(const char* field, int64_t value) {
  if (value < 1) return InvalidArgument("%s = %lld must be >= 1", field, (long long)value);
  if (value > kMaxDim)
    return InvalidArgument("%s = %lld is larger than the limit %lld", field, (long long)value,
                           (long long)kMaxDim);
  return Status::Ok();
}

// a * b with overflow detection, for non-negative operands.
bool MulOverflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// Whether a finite double is 0 or a normal float32 in magnitude (it rounds to neither 0, a
// subnormal nor inf in float32).
bool FloatNormalOrZero(double x) {
  return x == 0.0 || (std::fabs(x) >= FLT_MIN && std::fabs(x) <= FLT_MAX);
}

// The dropout position fields (fusedattn.h, "Dropout mask"), whatever the dropout: each in
// [0, kMaxDim], the larger problem's heads and rows holding the call's, keys in groups of four.
Status CheckDropoutPositions(const fusedattn_config& c) {
  const struct {
    const char* name;
    int64_t value;
  } fields[] = {{"config.dropout_batch_offset", c.dropout_batch_offset},
                {"config.dropout_heads", c.dropout_heads},
                {"config.dropout_head_offset", c.dropout_head_offset},
                {"config.dropout_rows", c.dropout_rows},
                {"config.dropout_row_offset", c.dropout_row_offset},
                {"config.dropout_key_offset", c.dropout_key_offset}};
  for (const auto& f : fields)
    if (f.value < 0 || f.value > kMaxDim)
      return InvalidArgument("%s = %lld must be in [0, %lld] (a position in the larger problem "
                             "whose dropout mask the call draws; 0 is the default)",
                             f.name, (long long)f.value, (long long)kMaxDim);
  const int64_t heads = c.dropout_heads ? c.dropout_heads : c.heads_q;
  if (heads < c.heads_q + c.dropout_head_offset)
    return InvalidArgument(
        "config.dropout_heads = %lld (0: heads_q) is less than heads_q + dropout_head_offset = "
        "%lld + %lld: the call's heads must lie inside the larger problem's",
        (long long)c.dropout_heads, (long long)c.heads_q, (long long)c.dropout_head_offset);
  const int64_t rows = c.dropout_rows ? c.dropout_rows : c.max_seqlen_q;
  if (rows < c.max_seqlen_q + c.dropout_row_offset)
    return InvalidArgument(
        "config.dropout_rows = %lld (0: max_seqlen_q) is less than max_seqlen_q + "
        "dropout_row_offset = %lld + %lld: the call's rows must lie inside the larger problem's",
        (long long)c.dropout_rows, (long long)c.max_seqlen_q, (long long)c.dropout_row_offset);
  if (c.dropout_key_offset % 4 != 0)
    return InvalidArgument(
        "config.dropout_key_offset = %lld is not a multiple of 4: the dropout mask draws keys in "
        "groups of four, and the call's groups must be the larger problem's",
        (long long)c.dropout_key_offset);
  return Status::Ok();
}

}  // namespace

Status MakeProblem(const fusedattn_config* user, bool has_cuda_device, Problem* problem) {
  if (user == nullptr) return InvalidArgument("config is NULL");
  if (problem == nullptr) return InvalidArgument("problem is NULL");
  // The layouts callers may have compiled against: 0.1.0's ended where score_mod begins, the
  // next ones where page_size, do_dtype and dropout_batch_offset begin; such callers get the
  // defaults of the later fields.
  constexpr size_t kConfigSize_0_1 = offsetof(fusedattn_config, score_mod);
  constexpr size_t kConfigSizeScoreMod = offsetof(fusedattn_config, page_size);
  constexpr size_t kConfigSizePaged = offsetof(fusedattn_config, do_dtype);
  constexpr size_t kConfigSizeFp8 = offsetof(fusedattn_config, dropout_batch_offset);
  if (user->struct_size != sizeof(fusedattn_config) && user->struct_size != kConfigSize_0_1 &&
      user->struct_size != kConfigSizeScoreMod && user->struct_size != kConfigSizePaged &&
      user->struct_size != kConfigSizeFp8)
    return InvalidArgument(
        "config.struct_size = %llu but this library's fusedattn_config has %llu bytes (or %llu "
        "as in version 0.1.0, %llu with score_mod, %llu with page_size, %llu with the FP8 "
        "dtypes): initialize the config with FUSEDATTN_CONFIG_INIT and the header of this "
        "library",
        (unsigned long long)user->struct_size, (unsigned long long)sizeof(fusedattn_config),
        (unsigned long long)kConfigSize_0_1, (unsigned long long)kConfigSizeScoreMod,
        (unsigned long long)kConfigSizePaged, (unsigned long long)kConfigSizeFp8);

  Problem p;
  p.config = FUSEDATTN_CONFIG_INIT;
  std::memcpy(&p.config, user, user->struct_size);
  p.config.struct_size = sizeof(fusedattn_config);
  fusedattn_config& c = p.config;

  if (!IsBool(c.is_training))
    return InvalidArgument("config.is_training = %d must be 0 or 1", c.is_training);
  FUSEDATTN_RETURN_IF_ERROR(CheckPositive("config.batch", c.batch));
  FUSEDATTN_RETURN_IF_ERROR(CheckPositive("config.heads_q", c.heads_q));
  FUSEDATTN_RETURN_IF_ERROR(CheckPositive("config.heads_kv", c.heads_kv));
  if (c.heads_q % c.heads_kv != 0)
    return InvalidArgument(
        "config.heads_kv = %lld does not divide config.heads_q = %lld (GQA/MQA need heads_q to "
        "be a multiple of heads_kv)",
        (long long)c.heads_kv, (long long)c.heads_q);
  FUSEDATTN_RETURN_IF_ERROR(CheckPositive("config.max_seqlen_q", c.max_seqlen_q));
  FUSEDATTN_RETURN_IF_ERROR(CheckPositive("config.max_seqlen_kv", c.max_seqlen_kv));
  FUSEDATTN_RETURN_IF_ERROR(CheckPositive("config.head_dim_qk", c.head_dim_qk));
  FUSEDATTN_RETURN_IF_ERROR(CheckPositive("config.head_dim_v", c.head_dim_v));
  // Every tensor of the problem must be addressable with int64 element offsets.
  {
    int64_t n = 0;
    int64_t seq = std::max(c.max_seqlen_q, c.max_seqlen_kv);
    int64_t dim = std::max(c.head_dim_qk, c.head_dim_v);
    if (MulOverflows(c.batch, c.heads_q, &n) || MulOverflows(n, seq, &n) ||
        MulOverflows(n, dim, &n) || MulOverflows(n, 8, &n) ||
        MulOverflows(c.max_seqlen_q, c.max_seqlen_kv, &n) || MulOverflows(n, c.batch, &n) ||
        MulOverflows(n, c.heads_q, &n))
      return InvalidArgument(
          "the problem is too large to address: batch=%lld heads_q=%lld max_seqlen_q=%lld "
          "max_seqlen_kv=%lld head_dim=%lld overflow 64-bit offsets",
          (long long)c.batch, (long long)c.heads_q, (long long)c.max_seqlen_q,
          (long long)c.max_seqlen_kv, (long long)dim);
  }

  FUSEDATTN_RETURN_IF_ERROR(CheckDtypes(&p));

  FUSEDATTN_RETURN_IF_ERROR(CheckFormat("config.q_format", c.q_format));
  FUSEDATTN_RETURN_IF_ERROR(CheckFormat("config.kv_format", c.kv_format));
  FUSEDATTN_RETURN_IF_ERROR(CheckFormat("config.o_format", c.o_format));
  FUSEDATTN_RETURN_IF_ERROR(CheckFormat("config.do_format", c.do_format));
  FUSEDATTN_RETURN_IF_ERROR(CheckFormat("config.dqkv_format", c.dqkv_format));
  {
    const std::array<std::pair<const char*, fusedattn_format>, 5> formats = {{
        {"q_format", c.q_format},
        {"kv_format", c.kv_format},
        {"o_format", c.o_format},
        {"do_format", c.do_format},
        {"dqkv_format", c.dqkv_format},
    }};
    // Paged K/V: kv_format is the layout of the pages, and THD is all or nothing over the
    // other four.
    if (c.page_size < 0 || c.page_size > kMaxDim)
      return InvalidArgument(
          "config.page_size = %lld must be 0 (contiguous K/V) or in [1, %lld] (tokens per page "
          "of a paged K/V cache)",
          (long long)c.page_size, (long long)kMaxDim);
    p.paged = c.page_size > 0;
    if (p.paged && c.kv_format == FUSEDATTN_FORMAT_THD)
      return InvalidArgument(
          "config.kv_format = THD with config.page_size = %lld: paged K/V are pools of pages, "
          "laid out BSHD [num_pages, page_size, heads_kv, d], BHSD [num_pages, heads_kv, "
          "page_size, d] or SBHD [page_size, num_pages, heads_kv, d]",
          (long long)c.page_size);
    auto counts = [&](size_t k) { return !(p.paged && k == 1); };  // formats[1]: kv_format
    size_t thd = 0, counted = 0;
    for (size_t k = 0; k < formats.size(); ++k)
      if (counts(k)) ++counted, thd += formats[k].second == FUSEDATTN_FORMAT_THD;
    if (thd != 0 && thd != counted) {
      for (size_t k = 0; k < formats.size(); ++k)
        if (counts(k) && formats[k].second != FUSEDATTN_FORMAT_THD)
          return InvalidArgument(
              "config.%s = %s but other formats are THD: packed THD must be used for all of "
              "%s",
              formats[k].first, FormatName(formats[k].second),
              p.paged ? "q, o, dO and dQ/dK/dV (kv_format is the layout of the pages)"
                      : "q, k/v, o, dO and dQ/dK/dV");
    }
    p.thd = thd == counted;
  }

  switch (c.mask) {
    case FUSEDATTN_MASK_NONE: break;
    case FUSEDATTN_MASK_PADDING: p.padding = true; break;
    case FUSEDATTN_MASK_CAUSAL: p.causal = true; break;
    case FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT: p.causal = p.bottom_right = true; break;
    case FUSEDATTN_MASK_PADDING_CAUSAL: p.padding = p.causal = true; break;
    case FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT:
      p.padding = p.causal = p.bottom_right = true;
      break;
    default:
      return InvalidArgument("config.mask = %d is not a fusedattn_mask", static_cast<int>(c.mask));
  }
  if (p.thd) p.padding = true;
  // Windows without a causal mask align to the bottom right (FlashAttention's convention).
  if (!p.causal) p.bottom_right = true;

  if (c.window_left < -1)
    return InvalidArgument("config.window_left = %lld must be -1 (unbounded) or >= 0",
                           (long long)c.window_left);
  if (c.window_right < -1)
    return InvalidArgument("config.window_right = %lld must be -1 (unbounded) or >= 0",
                           (long long)c.window_right);
  if (p.causal && c.window_right > 0)
    return InvalidArgument(
        "config.window_right = %lld contradicts config.mask = %s: a causal mask hides every key "
        "right of the diagonal (use -1 or 0)",
        (long long)c.window_right, MaskName(c.mask));
  // A window as wide as both sequences together hides nothing: it is unbounded (-1). This keeps
  // every backend's diagonal +/- window arithmetic far from overflow (a window of INT64_MAX
  // overflowed visible_keys) and gives equal problems equal keys.
  const int64_t no_limit = c.max_seqlen_q + c.max_seqlen_kv;
  if (c.window_left >= no_limit) c.window_left = -1;
  if (c.window_right >= no_limit) c.window_right = -1;
  p.window_left = c.window_left;
  p.window_right = p.causal ? 0 : c.window_right;

  switch (c.bias_type) {
    case FUSEDATTN_BIAS_NONE:
    case FUSEDATTN_BIAS_ALIBI:
      if (c.bias_requires_grad)
        return InvalidArgument(
            "config.bias_requires_grad = 1 but config.bias_type = %s has no bias tensor to "
            "differentiate",
            BiasName(c.bias_type));
      break;
    case FUSEDATTN_BIAS_PRE_SCALE:
    case FUSEDATTN_BIAS_POST_SCALE:
      if (c.bias_batch != 1 && c.bias_batch != c.batch)
        return InvalidArgument("config.bias_batch = %lld must be 1 or batch = %lld",
                               (long long)c.bias_batch, (long long)c.batch);
      if (c.bias_heads != 1 && c.bias_heads != c.heads_q)
        return InvalidArgument("config.bias_heads = %lld must be 1 or heads_q = %lld",
                               (long long)c.bias_heads, (long long)c.heads_q);
      if (!IsBool(c.bias_requires_grad))
        return InvalidArgument("config.bias_requires_grad = %d must be 0 or 1",
                               c.bias_requires_grad);
      break;
    default:
      return InvalidArgument("config.bias_type = %d is not a fusedattn_bias",
                             static_cast<int>(c.bias_type));
  }

  if (c.softmax_type < FUSEDATTN_SOFTMAX_VANILLA ||
      c.softmax_type > FUSEDATTN_SOFTMAX_LEARNABLE_SINK)
    return InvalidArgument("config.softmax_type = %d is not a fusedattn_softmax",
                           static_cast<int>(c.softmax_type));

  // attn_scale and softcap are doubles, but the GPU kernels compute in float32: a value that is
  // not 0 and not a normal float (below FLT_MIN or above FLT_MAX in magnitude) would become 0,
  // a subnormal or inf there, and a backend that decides in double (the flash planner) and one
  // of its kernels that decides in float would disagree about the problem.
  if (!std::isfinite(c.attn_scale))
    return InvalidArgument("config.attn_scale = %g must be finite (0 selects 1/sqrt(head_dim_qk))",
                           c.attn_scale);
  if (!FloatNormalOrZero(c.attn_scale))
    return InvalidArgument("config.attn_scale = %g is outside float32's normal range (%g to %g "
                           "in magnitude, or 0): the GPU kernels compute in float32",
                           c.attn_scale, static_cast<double>(FLT_MIN),
                           static_cast<double>(FLT_MAX));
  if (c.attn_scale == 0.0) c.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim_qk));
  if (!std::isfinite(c.softcap) || c.softcap < 0.0)
    return InvalidArgument("config.softcap = %g must be finite and >= 0 (0 turns it off)",
                           c.softcap);
  if (!FloatNormalOrZero(c.softcap))
    return InvalidArgument("config.softcap = %g is outside float32's normal range (%g to %g, "
                           "or 0 for off): the GPU kernels compute in float32",
                           c.softcap, static_cast<double>(FLT_MIN), static_cast<double>(FLT_MAX));
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    return InvalidArgument("config.dropout = %g must be in [0, 1)", c.dropout);
  FUSEDATTN_RETURN_IF_ERROR(CheckDropoutPositions(c));
  if (c.dropout > 0.0) {
    const int64_t heads = c.dropout_heads ? c.dropout_heads : c.heads_q;
    const int64_t seq = c.dropout_rows ? c.dropout_rows : c.max_seqlen_q;
    int64_t rows = 0;
    if (MulOverflows(c.batch + c.dropout_batch_offset, heads, &rows) ||
        MulOverflows(rows, seq, &rows) || rows > (int64_t{1} << 32)) {
      if (c.dropout_batch_offset == 0 && c.dropout_heads == 0 && c.dropout_rows == 0)
        return InvalidArgument(
            "config.dropout = %g with batch * heads_q * max_seqlen_q = %lld * %lld * %lld rows: "
            "the dropout counter addresses at most 2^32 rows",
            c.dropout, (long long)c.batch, (long long)c.heads_q, (long long)c.max_seqlen_q);
      return InvalidArgument(
          "config.dropout = %g with (batch + dropout_batch_offset) * heads * rows = (%lld + "
          "%lld) * %lld * %lld rows (heads: config.dropout_heads or heads_q, rows: "
          "config.dropout_rows or max_seqlen_q): the dropout counter addresses at most 2^32 rows",
          c.dropout, (long long)c.batch, (long long)c.dropout_batch_offset, (long long)heads,
          (long long)seq);
    }
    // The canonical form: a field that says the default is the default (one problem, one key).
    if (c.dropout_heads == c.heads_q) c.dropout_heads = 0;
    if (c.dropout_rows == c.max_seqlen_q) c.dropout_rows = 0;
  } else {
    // Without dropout the positions change nothing: the problem is the one without them.
    c.dropout_batch_offset = c.dropout_heads = c.dropout_head_offset = 0;
    c.dropout_rows = c.dropout_row_offset = c.dropout_key_offset = 0;
  }
  if (p.paged && c.is_training)
    return InvalidArgument(
        "config.is_training = 1 with config.page_size = %lld: paged K/V is forward only (a "
        "serving cache); set is_training = 0 (return_lse = 1 still returns the LSE)",
        (long long)c.page_size);
  if (!IsBool(c.deterministic))
    return InvalidArgument("config.deterministic = %d must be 0 or 1", c.deterministic);
  if (!IsBool(c.return_lse))
    return InvalidArgument("config.return_lse = %d must be 0 or 1", c.return_lse);
  if (!IsBool(c.return_max_logit))
    return InvalidArgument("config.return_max_logit = %d must be 0 or 1", c.return_max_logit);
  if (c.backend < FUSEDATTN_BACKEND_AUTO || c.backend >= FUSEDATTN_BACKEND_COUNT)
    return InvalidArgument("config.backend = %d is not a fusedattn_backend",
                           static_cast<int>(c.backend));

  switch (c.device) {
    case FUSEDATTN_DEVICE_AUTO: p.device = has_cuda_device ? Device::kCuda : Device::kCpu; break;
    case FUSEDATTN_DEVICE_CPU: p.device = Device::kCpu; break;
    case FUSEDATTN_DEVICE_CUDA:
      // Valid without a usable device too: then every backend refuses it in selection, and the
      // diagnostic gives each one's reason.
      p.device = Device::kCuda;
      break;
    default:
      return InvalidArgument("config.device = %d is not a fusedattn_device",
                             static_cast<int>(c.device));
  }

  if (c.score_mod != nullptr)
    FUSEDATTN_RETURN_IF_ERROR(flex::FinalizedOf(c.score_mod, "config.score_mod", &p.score_mod));

  *problem = p;
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------------
// Tensors
// ------------------------------------------------------------------------------------------------
namespace {

std::string ShapeText(const fusedattn_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim && i < FUSEDATTN_MAX_DIMS; ++i)
    s += Format(i ? ", %lld" : "%lld", (long long)t.shape[i]);
  return s + "]";
}

std::string ExpectText(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += Format(i ? ", %lld" : "%lld", (long long)shape[i]);
  return s + "]";
}

// Checks dtype, rank, shape and strides of a present tensor. Outputs must not overlap themselves.
Status CheckTensor(const char* name, const fusedattn_tensor& t, fusedattn_dtype dtype,
                   const int64_t* shape, int ndim, bool is_output) {
  // (Also tells the compiler the bound of the sort below.)
  if (ndim < 1 || ndim > FUSEDATTN_MAX_DIMS)
    return InternalError("%s: %d dimensions expected, outside [1, %d]", name, ndim,
                         FUSEDATTN_MAX_DIMS);
  if (t.dtype != dtype)
    return InvalidArgument("%s.dtype = %s (%d) but %s is expected", name,
                           DtypeName(t.dtype), static_cast<int>(t.dtype), DtypeName(dtype));
  if (t.ndim != ndim)
    return InvalidArgument("%s.ndim = %d but %d is expected (shape %s)", name, t.ndim, ndim,
                           ExpectText(shape, ndim).c_str());
  for (int i = 0; i < ndim; ++i) {
    if (t.shape[i] != shape[i])
      return InvalidArgument("%s.shape = %s but %s is expected (dimension %d)", name,
                             ShapeText(t).c_str(), ExpectText(shape, ndim).c_str(), i);
    if (t.strides[i] < 0 || (t.strides[i] == 0 && t.shape[i] > 1 && is_output))
      return InvalidArgument("%s.strides[%d] = %lld must be %s", name, i,
                             (long long)t.strides[i], is_output ? "> 0" : ">= 0");
  }
  // The furthest element must be addressable in bytes.
  int64_t extent = 0;
  for (int i = 0; i < ndim; ++i) {
    int64_t span = 0;
    if (__builtin_mul_overflow(shape[i] - 1, t.strides[i], &span) ||
        __builtin_add_overflow(extent, span, &extent))
      return InvalidArgument("%s.strides overflow 64-bit offsets", name);
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(extent + 1, static_cast<int64_t>(DtypeSize(dtype)), &bytes))
    return InvalidArgument("%s.strides overflow 64-bit offsets", name);
  if (is_output) {
    // Non-overlap: ordered by stride, each stride must step past everything the smaller ones
    // cover.
    std::array<int, FUSEDATTN_MAX_DIMS> order{};
    for (int i = 0; i < ndim; ++i) order[i] = i;
    std::sort(order.begin(), order.begin() + ndim,
              [&](int a, int b) { return t.strides[a] < t.strides[b]; });
    int64_t covered = 1;  // elements spanned by the dimensions so far
    for (int k = 0; k < ndim; ++k) {
      int i = order[k];
      if (shape[i] == 1) continue;
      if (t.strides[i] < covered)
        return InvalidArgument(
            "%s.strides make elements overlap (stride %lld of dimension %d is smaller than the "
            "%lld elements the smaller dimensions span): outputs need distinct elements",
            name, (long long)t.strides[i], i, (long long)covered);
      covered = t.strides[i] * (shape[i] - 1) + covered;
    }
  }
  return Status::Ok();
}

// The shape a q/k/v/o-like tensor must have for its format, and its view.
Status CheckQkvLike(const char* name, const fusedattn_tensor& t, fusedattn_format format,
                    fusedattn_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads,
                    int64_t dim, bool is_output, int64_t required_tokens, TensorView* view) {
  if (t.data == nullptr) return InvalidArgument("%s.data is NULL", name);
  int64_t shape[4];
  int ndim = 4;
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD: shape[0] = batch, shape[1] = seqlen, shape[2] = heads; break;
    case FUSEDATTN_FORMAT_SBHD: shape[0] = seqlen, shape[1] = batch, shape[2] = heads; break;
    case FUSEDATTN_FORMAT_BHSD: shape[0] = batch, shape[1] = heads, shape[2] = seqlen; break;
    case FUSEDATTN_FORMAT_THD:
      ndim = 3;
      if (t.ndim != 3)
        return InvalidArgument("%s.ndim = %d but THD needs 3 dimensions [tokens, %lld, %lld]",
                               name, t.ndim, (long long)heads, (long long)dim);
      if (t.shape[0] < 1 || t.shape[0] > kMaxDim)
        return InvalidArgument("%s.shape[0] = %lld (THD tokens) must be in [1, %lld]", name,
                               (long long)t.shape[0], (long long)kMaxDim);
      if (required_tokens >= 0 && t.shape[0] != required_tokens)
        return InvalidArgument("%s.shape[0] = %lld tokens but the matching input has %lld", name,
                               (long long)t.shape[0], (long long)required_tokens);
      shape[0] = t.shape[0], shape[1] = heads, shape[2] = dim;
      break;
  }
  if (format != FUSEDATTN_FORMAT_THD) shape[3] = dim;
  FUSEDATTN_RETURN_IF_ERROR(CheckTensor(name, t, dtype, shape, ndim, is_output));
  view->data = t.data;
  view->dtype = t.dtype;
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD:
      view->stride_b = t.strides[0], view->stride_s = t.strides[1];
      view->stride_h = t.strides[2], view->stride_d = t.strides[3];
      view->num_tokens = batch * seqlen;
      break;
    case FUSEDATTN_FORMAT_SBHD:
      view->stride_s = t.strides[0], view->stride_b = t.strides[1];
      view->stride_h = t.strides[2], view->stride_d = t.strides[3];
      view->num_tokens = batch * seqlen;
      break;
    case FUSEDATTN_FORMAT_BHSD:
      view->stride_b = t.strides[0], view->stride_h = t.strides[1];
      view->stride_s = t.strides[2], view->stride_d = t.strides[3];
      view->num_tokens = batch * seqlen;
      break;
    case FUSEDATTN_FORMAT_THD:
      view->stride_b = 0, view->stride_s = t.strides[0];
      view->stride_h = t.strides[1], view->stride_d = t.strides[2];
      view->num_tokens = t.shape[0];
      break;
  }
  return Status::Ok();
}

Status CheckAbsent(const char* name, const fusedattn_tensor& t, const char* why) {
  if (t.data != nullptr) return InvalidArgument("%s is given but %s", name, why);
  return Status::Ok();
}

Status CheckVector(const char* name, const fusedattn_tensor& t, fusedattn_dtype dtype,
                   int64_t length, bool is_output, const char* why_needed) {
  if (t.data == nullptr) return InvalidArgument("%s.data is NULL but %s", name, why_needed);
  int64_t shape[1] = {length};
  return CheckTensor(name, t, dtype, shape, 1, is_output);
}

Status CheckLse(const char* name, const Problem& p, const fusedattn_tensor& t, bool is_output,
                int64_t q_tokens, LseView* view, bool* packed) {
  const auto& c = p.config;
  if (t.data == nullptr)
    return InvalidArgument("%s.data is NULL but %s", name,
                           is_output ? "the config asks for it (is_training or return_lse)"
                                     : "the backward needs the forward's LSE");
  view->data = t.data;
  view->dtype = t.dtype;
  if (p.thd && t.ndim == 2) {
    int64_t shape[2] = {q_tokens, c.heads_q};
    FUSEDATTN_RETURN_IF_ERROR(
        CheckTensor(name, t, FUSEDATTN_DTYPE_FLOAT32, shape, 2, is_output));
    view->stride_b = 0, view->stride_s = t.strides[0], view->stride_h = t.strides[1];
    view->num_tokens = q_tokens;
    *packed = true;
    return Status::Ok();
  }
  int64_t shape[3] = {c.batch, c.heads_q, c.max_seqlen_q};
  if (t.ndim != 3)
    return InvalidArgument(
        "%s.ndim = %d but %s is expected%s", name, t.ndim, ExpectText(shape, 3).c_str(),
        p.thd ? Format(" (or [%lld, %lld] packed for THD)", (long long)q_tokens,
                       (long long)c.heads_q)
                    .c_str()
              : "");
  FUSEDATTN_RETURN_IF_ERROR(CheckTensor(name, t, FUSEDATTN_DTYPE_FLOAT32, shape, 3, is_output));
  view->stride_b = t.strides[0], view->stride_h = t.strides[1], view->stride_s = t.strides[2];
  view->num_tokens = c.batch * c.max_seqlen_q;
  *packed = false;
  return Status::Ok();
}

Status CheckBias(const char* name, const Problem& p, const fusedattn_tensor& t, bool is_output,
                 fusedattn_dtype required_dtype, BiasView* view) {
  const auto& c = p.config;
  if (t.data == nullptr)
    return InvalidArgument("%s.data is NULL but %s", name,
                           is_output ? "config.bias_requires_grad = 1"
                                     : Format("config.bias_type = %s", BiasName(c.bias_type)).c_str());
  fusedattn_dtype dtype = required_dtype;
  if (dtype == FUSEDATTN_DTYPE_INT32) {  // any of qkv_dtype or float32
    if (t.dtype != c.qkv_dtype && t.dtype != FUSEDATTN_DTYPE_FLOAT32)
      return InvalidArgument("%s.dtype = %s but %s (qkv_dtype) or float32 is expected", name,
                             DtypeName(t.dtype), DtypeName(c.qkv_dtype));
    dtype = t.dtype;
  }
  int64_t shape[4] = {c.bias_batch, c.bias_heads, c.max_seqlen_q, c.max_seqlen_kv};
  FUSEDATTN_RETURN_IF_ERROR(CheckTensor(name, t, dtype, shape, 4, is_output));
  view->data = t.data;
  view->dtype = t.dtype;
  view->stride_b = c.bias_batch == 1 ? 0 : t.strides[0];
  view->stride_h = c.bias_heads == 1 ? 0 : t.strides[1];
  view->stride_q = t.strides[2];
  view->stride_kv = t.strides[3];
  return Status::Ok();
}

Status CheckSeqlens(const char* name, const fusedattn_tensor& t, int64_t batch) {
  int64_t shape[1] = {batch + 1};
  FUSEDATTN_RETURN_IF_ERROR(CheckTensor(name, t, FUSEDATTN_DTYPE_INT32, shape, 1, false));
  if (t.strides[0] != 1)
    return InvalidArgument("%s.strides[0] = %lld must be 1 (contiguous int32)", name,
                           (long long)t.strides[0]);
  return Status::Ok();
}

// The shape of a score_mod tensor: one dimension per declared axis, [1] for none.
int ScoreModShape(const Problem& p, uint32_t axes, int64_t* shape, int* axis_of_dim) {
  const auto& c = p.config;
  const std::pair<uint32_t, int64_t> extents[4] = {{FUSEDATTN_SCORE_MOD_AXIS_BATCH, c.batch},
                                                   {FUSEDATTN_SCORE_MOD_AXIS_HEAD, c.heads_q},
                                                   {FUSEDATTN_SCORE_MOD_AXIS_Q, c.max_seqlen_q},
                                                   {FUSEDATTN_SCORE_MOD_AXIS_KV, c.max_seqlen_kv}};
  int ndim = 0;
  for (int a = 0; a < 4; ++a)
    if (axes & extents[a].first) {
      axis_of_dim[ndim] = a;
      shape[ndim++] = extents[a].second;
    }
  if (ndim == 0) {
    axis_of_dim[0] = -1;
    shape[ndim++] = 1;
  }
  return ndim;
}

Status CheckScoreModTensor(const Problem& p, const std::string& name, const fusedattn_tensor& t,
                           const flex::TensorDecl& decl, bool is_output, AuxTensorView* view) {
  if (t.data == nullptr) return InvalidArgument("%s.data is NULL", name.c_str());
  int64_t shape[4];
  int axis_of_dim[4];
  int ndim = ScoreModShape(p, decl.axes, shape, axis_of_dim);
  if (t.ndim != ndim)
    return InvalidArgument("%s.ndim = %d but the graph declares it with axes %s: %s is expected",
                           name.c_str(), t.ndim, flex::AxesText(decl.axes).c_str(),
                           ExpectText(shape, ndim).c_str());
  FUSEDATTN_RETURN_IF_ERROR(CheckTensor(name.c_str(), t, decl.dtype, shape, ndim, is_output));
  view->data = t.data;
  view->dtype = t.dtype;
  int64_t* strides[4] = {&view->stride_b, &view->stride_h, &view->stride_q, &view->stride_kv};
  for (int d = 0; d < ndim; ++d)
    if (axis_of_dim[d] >= 0) *strides[axis_of_dim[d]] = t.strides[d];
  return Status::Ok();
}

// The score_mod tensors of a call (and, for the backward, their gradients) against the graph's
// declarations.
Status CheckScoreModTensors(const Problem& p, int64_t count, const fusedattn_tensor* tensors,
                            bool backward, const fusedattn_tensor* grads,
                            std::vector<AuxTensorView>* views,
                            std::vector<AuxTensorView>* grad_views) {
  if (!p.score_mod) {
    if (count != 0)
      return InvalidArgument("args.num_score_mod_tensors = %lld but config.score_mod is NULL",
                             (long long)count);
    if (tensors != nullptr)
      return InvalidArgument("args.score_mod_tensors is given but config.score_mod is NULL");
    if (grads != nullptr)
      return InvalidArgument("args.d_score_mod_tensors is given but config.score_mod is NULL");
    return Status::Ok();
  }
  const auto& decls = p.score_mod->tensors();
  if (count != static_cast<int64_t>(decls.size())) {
    std::string names;
    for (const auto& d : decls) names += (names.empty() ? "'" : ", '") + d.name + "'";
    return InvalidArgument(
        "args.num_score_mod_tensors = %lld but config.score_mod declares %zu tensor%s%s%s%s",
        (long long)count, decls.size(), decls.size() == 1 ? "" : "s",
        names.empty() ? "" : " (", names.c_str(), names.empty() ? "" : ")");
  }
  if (count > 0 && tensors == nullptr)
    return InvalidArgument("args.score_mod_tensors is NULL but config.score_mod declares %lld "
                           "tensors",
                           (long long)count);
  views->assign(decls.size(), AuxTensorView{});
  for (size_t k = 0; k < decls.size(); ++k) {
    std::string name = Format("args.score_mod_tensors[%zu] ('%s')", k, decls[k].name.c_str());
    FUSEDATTN_RETURN_IF_ERROR(
        CheckScoreModTensor(p, name, tensors[k], decls[k], false, &(*views)[k]));
  }
  if (!backward) return Status::Ok();
  grad_views->assign(decls.size(), AuxTensorView{});
  for (size_t k = 0; k < decls.size(); ++k) {
    std::string name = Format("args.d_score_mod_tensors[%zu] ('%s')", k, decls[k].name.c_str());
    if (decls[k].requires_grad) {
      if (grads == nullptr)
        return InvalidArgument("args.d_score_mod_tensors is NULL but tensor '%s' requires grad",
                               decls[k].name.c_str());
      FUSEDATTN_RETURN_IF_ERROR(
          CheckScoreModTensor(p, name, grads[k], decls[k], true, &(*grad_views)[k]));
    } else if (grads != nullptr && grads[k].data != nullptr) {
      return InvalidArgument("%s is given but the graph declares '%s' with requires_grad = 0",
                             name.c_str(), decls[k].name.c_str());
    }
  }
  return Status::Ok();
}

// A page pool (k or v of paged K/V): a q/k/v-like tensor whose batch axis counts pages and whose
// sequence axis is page_size long. num_pages is read from the tensor; pages_of_k >= 0 is the
// number k has, which v must have too.
Status CheckPagePool(const char* name, const fusedattn_tensor& t, fusedattn_format format,
                     fusedattn_dtype dtype, int64_t page_size, int64_t heads, int64_t dim,
                     int64_t pages_of_k, TensorView* view, int64_t* num_pages) {
  if (t.data == nullptr) return InvalidArgument("%s.data is NULL", name);
  const bool sbhd = format == FUSEDATTN_FORMAT_SBHD;
  const int page_axis = sbhd ? 1 : 0;
  const int token_axis = format == FUSEDATTN_FORMAT_BHSD ? 2 : sbhd ? 0 : 1;
  const char* layout = format == FUSEDATTN_FORMAT_BHSD ? "[num_pages, heads_kv, page_size, d]"
                       : sbhd                          ? "[page_size, num_pages, heads_kv, d]"
                                                       : "[num_pages, page_size, heads_kv, d]";
  if (t.ndim != 4)
    return InvalidArgument("%s.ndim = %d but a page pool in kv_format %s has 4 dimensions %s",
                           name, t.ndim, FormatName(format), layout);
  const int64_t pages = t.shape[page_axis];
  if (pages < 1 || pages > kMaxDim)
    return InvalidArgument("%s.shape[%d] = %lld pages (kv_format %s: %s) must be in [1, %lld]",
                           name, page_axis, (long long)pages, FormatName(format), layout,
                           (long long)kMaxDim);
  if (pages_of_k >= 0 && pages != pages_of_k)
    return InvalidArgument("%s.shape[%d] = %lld pages but args.k has %lld: k and v are pools "
                           "of the same pages",
                           name, page_axis, (long long)pages, (long long)pages_of_k);
  if (t.shape[token_axis] != page_size)
    return InvalidArgument(
        "%s.shape[%d] = %lld tokens per page but config.page_size = %lld (kv_format %s: %s)",
        name, token_axis, (long long)t.shape[token_axis], (long long)page_size,
        FormatName(format), layout);
  FUSEDATTN_RETURN_IF_ERROR(
      CheckQkvLike(name, t, format, dtype, pages, page_size, heads, dim, false, -1, view));
  *num_pages = pages;
  return Status::Ok();
}

// The page table and the key lengths of paged K/V (their shapes: the entries are read by the
// backends, where the tensors live), or their absence otherwise.
Status CheckPagedInputs(const Problem& p, const fusedattn_tensor& page_table,
                        const fusedattn_tensor& seqlens_kv, FwdTensors* out) {
  const auto& c = p.config;
  if (!p.paged) {
    const char* why = "config.page_size = 0 (contiguous K/V)";
    FUSEDATTN_RETURN_IF_ERROR(CheckAbsent("args.page_table", page_table, why));
    return CheckAbsent("args.seqlens_kv", seqlens_kv, why);
  }
  if (page_table.data == nullptr)
    return InvalidArgument("args.page_table.data is NULL but config.page_size = %lld (paged "
                           "K/V) needs it: int32 [batch, max_pages_per_seq]",
                           (long long)c.page_size);
  if (page_table.ndim != 2)
    return InvalidArgument("args.page_table.ndim = %d but 2 is expected [batch, "
                           "max_pages_per_seq]",
                           page_table.ndim);
  const int64_t needed = (c.max_seqlen_kv + c.page_size - 1) / c.page_size;
  const int64_t width = page_table.shape[1];
  if (width < needed)
    return InvalidArgument(
        "args.page_table.shape = [%lld, %lld]: %lld pages per sequence hold %lld tokens of "
        "page_size %lld, fewer than max_seqlen_kv = %lld (at least %lld pages are needed)",
        (long long)page_table.shape[0], (long long)width, (long long)width,
        (long long)(width * c.page_size), (long long)c.page_size, (long long)c.max_seqlen_kv,
        (long long)needed);
  if (width > kMaxDim)
    return InvalidArgument("args.page_table.shape[1] = %lld is larger than the limit %lld",
                           (long long)width, (long long)kMaxDim);
  const int64_t shape[2] = {c.batch, width};
  FUSEDATTN_RETURN_IF_ERROR(
      CheckTensor("args.page_table", page_table, FUSEDATTN_DTYPE_INT32, shape, 2, false));
  if (width > 1 && page_table.strides[1] != 1)
    return InvalidArgument("args.page_table.strides[1] = %lld must be 1 (rows of contiguous "
                           "int32 page indices)",
                           (long long)page_table.strides[1]);
  if (seqlens_kv.data == nullptr)
    return InvalidArgument("args.seqlens_kv.data is NULL but config.page_size = %lld (paged "
                           "K/V) needs the key lengths: int32 [batch]",
                           (long long)c.page_size);
  const int64_t length_shape[1] = {c.batch};
  FUSEDATTN_RETURN_IF_ERROR(
      CheckTensor("args.seqlens_kv", seqlens_kv, FUSEDATTN_DTYPE_INT32, length_shape, 1, false));
  if (c.batch > 1 && seqlens_kv.strides[0] != 1)
    return InvalidArgument("args.seqlens_kv.strides[0] = %lld must be 1 (contiguous int32)",
                           (long long)seqlens_kv.strides[0]);
  out->page_table = static_cast<const int32_t*>(page_table.data);
  out->page_table_stride = page_table.strides[0];
  out->max_pages_per_seq = width;
  out->seqlens_kv = static_cast<const int32_t*>(seqlens_kv.data);
  return Status::Ok();
}

// Inputs shared by forward and backward: masks, bias, alibi, sinks, sequence lengths.
struct SharedInputs {
  const fusedattn_tensor* bias;
  const fusedattn_tensor* alibi_slopes;
  const fusedattn_tensor* sink_logits;
  const fusedattn_tensor* cu_seqlens_q;
  const fusedattn_tensor* cu_seqlens_kv;
  const fusedattn_tensor* seq_offsets_q;
  const fusedattn_tensor* seq_offsets_kv;
};

// Names are literals and reasons are formatted only on failure: this runs on every call.
template <typename Out>
Status CheckShared(const Problem& p, const SharedInputs& in, Out* out) {
  const auto& c = p.config;
  if (p.has_tensor_bias()) {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckBias("args.bias", p, *in.bias, false, FUSEDATTN_DTYPE_INT32, &out->bias));
  } else if (in.bias->data != nullptr) {
    return InvalidArgument("args.bias is given but config.bias_type = %s takes no bias tensor",
                           BiasName(c.bias_type));
  }
  if (c.bias_type == FUSEDATTN_BIAS_ALIBI) {
    FUSEDATTN_RETURN_IF_ERROR(CheckVector("args.alibi_slopes", *in.alibi_slopes,
                                          FUSEDATTN_DTYPE_FLOAT32, c.heads_q, false,
                                          "config.bias_type = alibi"));
    out->alibi_slopes = static_cast<const float*>(in.alibi_slopes->data);
    out->alibi_stride = in.alibi_slopes->strides[0];
  } else {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckAbsent("args.alibi_slopes", *in.alibi_slopes, "config.bias_type is not alibi"));
  }
  if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK) {
    FUSEDATTN_RETURN_IF_ERROR(CheckVector("args.sink_logits", *in.sink_logits,
                                          FUSEDATTN_DTYPE_FLOAT32, c.heads_q, false,
                                          "config.softmax_type = learnable_sink"));
    out->sink_logits = static_cast<const float*>(in.sink_logits->data);
    out->sink_stride = in.sink_logits->strides[0];
  } else {
    FUSEDATTN_RETURN_IF_ERROR(CheckAbsent("args.sink_logits", *in.sink_logits,
                                          "config.softmax_type is not learnable_sink"));
  }
  if (p.paged) {
    // The key lengths come from seqlens_kv (CheckPagedInputs), the keys from the page table.
    const char* why = "paged K/V takes the key lengths from args.seqlens_kv";
    FUSEDATTN_RETURN_IF_ERROR(CheckAbsent("args.cu_seqlens_kv", *in.cu_seqlens_kv, why));
    FUSEDATTN_RETURN_IF_ERROR(CheckAbsent(
        "args.seq_offsets_kv", *in.seq_offsets_kv,
        "paged K/V finds the keys through args.page_table"));
  }
  if (p.padding) {
    const char* why = p.thd ? "THD formats need per-sequence lengths"
                            : "a padding mask needs per-sequence lengths";
    if (in.cu_seqlens_q->data == nullptr)
      return InvalidArgument("args.cu_seqlens_q is NULL but %s", why);
    FUSEDATTN_RETURN_IF_ERROR(CheckSeqlens("args.cu_seqlens_q", *in.cu_seqlens_q, c.batch));
    out->cu_seqlens_q = static_cast<const int32_t*>(in.cu_seqlens_q->data);
    if (!p.paged) {
      if (in.cu_seqlens_kv->data == nullptr)
        return InvalidArgument("args.cu_seqlens_kv is NULL but %s", why);
      FUSEDATTN_RETURN_IF_ERROR(
          CheckSeqlens("args.cu_seqlens_kv", *in.cu_seqlens_kv, c.batch));
      out->cu_seqlens_kv = static_cast<const int32_t*>(in.cu_seqlens_kv->data);
    }
  } else {
    for (const auto& [name, tensor] : {std::pair{"args.cu_seqlens_q", in.cu_seqlens_q},
                                       std::pair{"args.cu_seqlens_kv", in.cu_seqlens_kv}})
      if (tensor->data != nullptr)
        return InvalidArgument("%s is given but config.mask = %s has no padding (use a "
                               "padding_* mask)",
                               name, MaskName(c.mask));
  }
  if (p.thd) {
    if (in.seq_offsets_q->data) {
      FUSEDATTN_RETURN_IF_ERROR(CheckSeqlens("args.seq_offsets_q", *in.seq_offsets_q, c.batch));
      out->seq_offsets_q = static_cast<const int32_t*>(in.seq_offsets_q->data);
    }
    if (in.seq_offsets_kv->data) {
      FUSEDATTN_RETURN_IF_ERROR(
          CheckSeqlens("args.seq_offsets_kv", *in.seq_offsets_kv, c.batch));
      out->seq_offsets_kv = static_cast<const int32_t*>(in.seq_offsets_kv->data);
    }
  } else {
    const char* why = "seq_offsets apply only to THD formats";
    FUSEDATTN_RETURN_IF_ERROR(CheckAbsent("args.seq_offsets_q", *in.seq_offsets_q, why));
    FUSEDATTN_RETURN_IF_ERROR(CheckAbsent("args.seq_offsets_kv", *in.seq_offsets_kv, why));
  }
  return Status::Ok();
}

// One FP8 scaling pointer: present exactly when the problem reads it.
struct ScaleField {
  const char* name;     // "args.descale_q"
  const void* pointer;  // the caller's
  bool read;            // whether this problem reads it
  const char* role;     // what it is, for the message when missing
};

Status CheckScaleFields(const Problem& p, const std::vector<ScaleField>& fields) {
  const auto& c = p.config;
  for (const ScaleField& f : fields) {
    if (!p.fp8) {
      if (f.pointer != nullptr)
        return InvalidArgument(
            "%s is set but config.qkv_dtype = %s: FP8 scaling factors are read only by FP8 "
            "attention (qkv_dtype fp8_e4m3); pass NULL",
            f.name, DtypeName(c.qkv_dtype));
      continue;
    }
    if (f.read && f.pointer == nullptr)
      return InvalidArgument(
          "%s is NULL: FP8 attention (config.qkv_dtype = fp8_e4m3) needs it: %s (a float32 "
          "scalar where the tensors live)",
          f.name, f.role);
    if (!f.read && f.pointer != nullptr)
      return InvalidArgument("%s is set but not read: %s; pass NULL", f.name, f.role);
  }
  return Status::Ok();
}

std::string NotFp8(const char* what, const char* field, fusedattn_dtype dtype) {
  return Format("%s is only for an FP8 %s, and config.%s = %s", what, field, field,
                DtypeName(dtype));
}

Status CheckFwdScales(const Problem& p, const fusedattn_fwd_args& a, Fp8FwdScales* out) {
  const auto& c = p.config;
  const bool o_fp8 = IsFp8(c.o_dtype);
  const std::string scale_o_role =
      o_fp8 ? std::string("O_fp8 = O * scale_o") : NotFp8("scale_o", "o_dtype", c.o_dtype);
  std::vector<ScaleField> fields = {
      {"args.descale_q", a.descale_q, true, "q = q_fp8 * descale_q"},
      {"args.descale_k", a.descale_k, true, "k = k_fp8 * descale_k"},
      {"args.descale_v", a.descale_v, true, "v = v_fp8 * descale_v"},
      {"args.descale_s", a.descale_s, true, "S = S_fp8 * descale_s (the softmax output)"},
      {"args.scale_s", a.scale_s, true, "S_fp8 = S * scale_s"},
      {"args.scale_o", a.scale_o, o_fp8, scale_o_role.c_str()},
      {"args.amax_s", a.amax_s, true, "the output max |S|"},
      {"args.amax_o", a.amax_o, true, "the output max |O| before scale_o"},
  };
  FUSEDATTN_RETURN_IF_ERROR(CheckScaleFields(p, fields));
  if (!p.fp8) return Status::Ok();
  Fp8FwdScales t;
  t.descale_q = a.descale_q, t.descale_k = a.descale_k, t.descale_v = a.descale_v;
  t.descale_s = a.descale_s, t.scale_s = a.scale_s, t.scale_o = a.scale_o;
  t.amax_s = a.amax_s, t.amax_o = a.amax_o;
  *out = t;
  return Status::Ok();
}

Status CheckBwdScales(const Problem& p, const fusedattn_bwd_args& a, Fp8BwdScales* out) {
  const auto& c = p.config;
  const bool o_fp8 = IsFp8(c.o_dtype), dqkv_fp8 = IsFp8(c.dqkv_dtype);
  const std::string descale_o_role =
      o_fp8 ? std::string("o = o_fp8 * descale_o") : NotFp8("descale_o", "o_dtype", c.o_dtype);
  auto grad_role = [&](const char* name, const char* formula) {
    return dqkv_fp8 ? std::string(formula) : NotFp8(name, "dqkv_dtype", c.dqkv_dtype);
  };
  const std::string dq_role = grad_role("scale_dq", "dQ_fp8 = dQ * scale_dq");
  const std::string dk_role = grad_role("scale_dk", "dK_fp8 = dK * scale_dk");
  const std::string dv_role = grad_role("scale_dv", "dV_fp8 = dV * scale_dv");
  std::vector<ScaleField> fields = {
      {"args.descale_q", a.descale_q, true, "q = q_fp8 * descale_q"},
      {"args.descale_k", a.descale_k, true, "k = k_fp8 * descale_k"},
      {"args.descale_v", a.descale_v, true, "v = v_fp8 * descale_v"},
      {"args.descale_o", a.descale_o, o_fp8, descale_o_role.c_str()},
      {"args.descale_do", a.descale_do, true, "dO = dO_fp8 * descale_do"},
      {"args.descale_s", a.descale_s, true, "S = S_fp8 * descale_s (the softmax output)"},
      {"args.descale_dp", a.descale_dp, true, "dP = dP_fp8 * descale_dp"},
      {"args.scale_s", a.scale_s, true, "S_fp8 = S * scale_s"},
      {"args.scale_dp", a.scale_dp, true, "dP_fp8 = dP * scale_dp"},
      {"args.scale_dq", a.scale_dq, dqkv_fp8, dq_role.c_str()},
      {"args.scale_dk", a.scale_dk, dqkv_fp8, dk_role.c_str()},
      {"args.scale_dv", a.scale_dv, dqkv_fp8, dv_role.c_str()},
      {"args.amax_dp", a.amax_dp, true, "the output max |dP|"},
      {"args.amax_dq", a.amax_dq, true, "the output max |dQ| before scale_dq"},
      {"args.amax_dk", a.amax_dk, true, "the output max |dK| before scale_dk"},
      {"args.amax_dv", a.amax_dv, true, "the output max |dV| before scale_dv"},
  };
  FUSEDATTN_RETURN_IF_ERROR(CheckScaleFields(p, fields));
  if (!p.fp8) return Status::Ok();
  Fp8BwdScales t;
  t.descale_q = a.descale_q, t.descale_k = a.descale_k, t.descale_v = a.descale_v;
  t.descale_o = a.descale_o, t.descale_do = a.descale_do, t.descale_s = a.descale_s;
  t.descale_dp = a.descale_dp, t.scale_s = a.scale_s, t.scale_dp = a.scale_dp;
  t.scale_dq = a.scale_dq, t.scale_dk = a.scale_dk, t.scale_dv = a.scale_dv;
  t.amax_dp = a.amax_dp, t.amax_dq = a.amax_dq, t.amax_dk = a.amax_dk, t.amax_dv = a.amax_dv;
  *out = t;
  return Status::Ok();
}

}  // namespace

std::vector<NamedScale> Fp8ScalesRead(const Fp8FwdScales& s) {
  std::vector<NamedScale> out = {{"descale_q", s.descale_q}, {"descale_k", s.descale_k},
                                 {"descale_v", s.descale_v}, {"descale_s", s.descale_s},
                                 {"scale_s", s.scale_s}};
  if (s.scale_o) out.push_back({"scale_o", s.scale_o});
  return out;
}

std::vector<NamedScale> Fp8ScalesRead(const Fp8BwdScales& s) {
  std::vector<NamedScale> out = {{"descale_q", s.descale_q},   {"descale_k", s.descale_k},
                                 {"descale_v", s.descale_v},   {"descale_do", s.descale_do},
                                 {"descale_s", s.descale_s},   {"descale_dp", s.descale_dp},
                                 {"scale_s", s.scale_s},       {"scale_dp", s.scale_dp}};
  for (NamedScale n : {NamedScale{"descale_o", s.descale_o}, NamedScale{"scale_dq", s.scale_dq},
                       NamedScale{"scale_dk", s.scale_dk}, NamedScale{"scale_dv", s.scale_dv}})
    if (n.pointer) out.push_back(n);
  return out;
}

Status CheckFp8ScaleValues(const std::vector<NamedScale>& scales, const float* values) {
  for (size_t k = 0; k < scales.size(); ++k) {
    const float v = values[k];
    if (!(std::isfinite(v) && v > 0.0f))
      return InvalidArgument(
          "args.%s = %g: an FP8 scaling factor must be finite and > 0 (NaN, inf, 0 and "
          "negative values are refused)",
          scales[k].name, static_cast<double>(v));
  }
  return Status::Ok();
}

Status MakeFwdTensors(const Problem& p, const fusedattn_fwd_args* user, FwdTensors* out) {
  if (user == nullptr) return InvalidArgument("args is NULL");
  // The layouts callers may have compiled against: 0.1.0's, then with the score_mod fields,
  // then with dropout_seed_offset.
  constexpr size_t kSize_0_1 = offsetof(fusedattn_fwd_args, num_score_mod_tensors);
  constexpr size_t kSizeScoreMod = offsetof(fusedattn_fwd_args, dropout_seed_offset);
  constexpr size_t kSizeSeedOffset = offsetof(fusedattn_fwd_args, page_table);
  constexpr size_t kSizePaged = offsetof(fusedattn_fwd_args, descale_q);
  if (user->struct_size != sizeof(fusedattn_fwd_args) && user->struct_size != kSize_0_1 &&
      user->struct_size != kSizeScoreMod && user->struct_size != kSizeSeedOffset &&
      user->struct_size != kSizePaged)
    return InvalidArgument(
        "args.struct_size = %llu but this library's fusedattn_fwd_args has %llu bytes (or %llu "
        "as in version 0.1.0, %llu with the score_mod fields, %llu with dropout_seed_offset, "
        "%llu with the paged K/V fields): use fusedattn_fwd_args_init()",
        (unsigned long long)user->struct_size, (unsigned long long)sizeof(fusedattn_fwd_args),
        (unsigned long long)kSize_0_1, (unsigned long long)kSizeScoreMod,
        (unsigned long long)kSizeSeedOffset, (unsigned long long)kSizePaged);
  // Read the caller's struct as far as it goes; later fields stay zero.
  fusedattn_fwd_args copy;
  std::memset(&copy, 0, sizeof copy);
  std::memcpy(&copy, user, user->struct_size);
  const fusedattn_fwd_args* args = &copy;
  const auto& c = p.config;
  FwdTensors t;
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.q", args->q, c.q_format, c.qkv_dtype, c.batch,
                                         c.max_seqlen_q, c.heads_q, c.head_dim_qk, false, -1,
                                         &t.q));
  if (p.paged) {
    FUSEDATTN_RETURN_IF_ERROR(CheckPagePool("args.k", args->k, c.kv_format, c.qkv_dtype,
                                            c.page_size, c.heads_kv, c.head_dim_qk, -1, &t.k,
                                            &t.num_pages));
    int64_t pages_of_v = 0;
    FUSEDATTN_RETURN_IF_ERROR(CheckPagePool("args.v", args->v, c.kv_format, c.qkv_dtype,
                                            c.page_size, c.heads_kv, c.head_dim_v, t.num_pages,
                                            &t.v, &pages_of_v));
  } else {
    FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.k", args->k, c.kv_format, c.qkv_dtype, c.batch,
                                           c.max_seqlen_kv, c.heads_kv, c.head_dim_qk, false, -1,
                                           &t.k));
    FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.v", args->v, c.kv_format, c.qkv_dtype, c.batch,
                                           c.max_seqlen_kv, c.heads_kv, c.head_dim_v, false,
                                           p.thd ? t.k.num_tokens : -1, &t.v));
  }
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.o", args->o, c.o_format, c.o_dtype, c.batch,
                                         c.max_seqlen_q, c.heads_q, c.head_dim_v, true,
                                         p.thd ? t.q.num_tokens : -1, &t.o));
  if (p.needs_lse()) {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckLse("args.lse", p, args->lse, true, t.q.num_tokens, &t.lse, &t.lse_packed));
  } else {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckAbsent("args.lse", args->lse,
                    "neither config.is_training nor config.return_lse asks for it"));
  }
  if (c.return_max_logit) {
    FUSEDATTN_RETURN_IF_ERROR(CheckVector("args.max_logit", args->max_logit,
                                          FUSEDATTN_DTYPE_FLOAT32, c.heads_q, true,
                                          "config.return_max_logit = 1"));
    t.max_logit = static_cast<float*>(args->max_logit.data);
    t.max_logit_stride = args->max_logit.strides[0];
  } else {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckAbsent("args.max_logit", args->max_logit, "config.return_max_logit = 0"));
  }
  SharedInputs shared{&args->bias,          &args->alibi_slopes,  &args->sink_logits,
                      &args->cu_seqlens_q,  &args->cu_seqlens_kv, &args->seq_offsets_q,
                      &args->seq_offsets_kv};
  FUSEDATTN_RETURN_IF_ERROR(CheckShared(p, shared, &t));
  FUSEDATTN_RETURN_IF_ERROR(CheckPagedInputs(p, args->page_table, args->seqlens_kv, &t));
  FUSEDATTN_RETURN_IF_ERROR(CheckScoreModTensors(p, args->num_score_mod_tensors,
                                                 args->score_mod_tensors, false, nullptr,
                                                 &t.score_mod_tensors, nullptr));
  FUSEDATTN_RETURN_IF_ERROR(CheckFwdScales(p, *args, &t.fp8));
  t.dropout_seed = args->dropout_seed;
  t.dropout_offset = args->dropout_offset;
  t.dropout_seed_offset = args->dropout_seed_offset;
  *out = t;
  return Status::Ok();
}

Status MakeBwdTensors(const Problem& p, const fusedattn_bwd_args* user, BwdTensors* out) {
  if (user == nullptr) return InvalidArgument("args is NULL");
  // The layouts callers may have compiled against: 0.1.0's, then with the score_mod fields.
  constexpr size_t kSize_0_1 = offsetof(fusedattn_bwd_args, num_score_mod_tensors);
  constexpr size_t kSizeScoreMod = offsetof(fusedattn_bwd_args, dropout_seed_offset);
  constexpr size_t kSizeSeedOffset = offsetof(fusedattn_bwd_args, descale_q);
  if (user->struct_size != sizeof(fusedattn_bwd_args) && user->struct_size != kSize_0_1 &&
      user->struct_size != kSizeScoreMod && user->struct_size != kSizeSeedOffset)
    return InvalidArgument(
        "args.struct_size = %llu but this library's fusedattn_bwd_args has %llu bytes (or %llu "
        "as in version 0.1.0, %llu with the score_mod fields, %llu with dropout_seed_offset): "
        "use fusedattn_bwd_args_init()",
        (unsigned long long)user->struct_size, (unsigned long long)sizeof(fusedattn_bwd_args),
        (unsigned long long)kSize_0_1, (unsigned long long)kSizeScoreMod,
        (unsigned long long)kSizeSeedOffset);
  FUSEDATTN_RETURN_IF_ERROR(CheckHasBackward(p));
  fusedattn_bwd_args copy;
  std::memset(&copy, 0, sizeof copy);
  std::memcpy(&copy, user, user->struct_size);
  const fusedattn_bwd_args* args = &copy;
  const auto& c = p.config;
  BwdTensors t;
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.q", args->q, c.q_format, c.qkv_dtype, c.batch,
                                         c.max_seqlen_q, c.heads_q, c.head_dim_qk, false, -1,
                                         &t.q));
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.k", args->k, c.kv_format, c.qkv_dtype, c.batch,
                                         c.max_seqlen_kv, c.heads_kv, c.head_dim_qk, false, -1,
                                         &t.k));
  int64_t q_tokens = p.thd ? t.q.num_tokens : -1;
  int64_t kv_tokens = p.thd ? t.k.num_tokens : -1;
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.v", args->v, c.kv_format, c.qkv_dtype, c.batch,
                                         c.max_seqlen_kv, c.heads_kv, c.head_dim_v, false,
                                         kv_tokens, &t.v));
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.o", args->o, c.o_format, c.o_dtype, c.batch,
                                         c.max_seqlen_q, c.heads_q, c.head_dim_v, false, q_tokens,
                                         &t.o));
  FUSEDATTN_RETURN_IF_ERROR(
      CheckLse("args.lse", p, args->lse, false, t.q.num_tokens, &t.lse, &t.lse_packed));
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.d_o", args->d_o, c.do_format, c.do_dtype, c.batch,
                                         c.max_seqlen_q, c.heads_q, c.head_dim_v, false, q_tokens,
                                         &t.d_o));
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.dq", args->dq, c.dqkv_format, c.dqkv_dtype,
                                         c.batch, c.max_seqlen_q, c.heads_q, c.head_dim_qk, true,
                                         q_tokens, &t.dq));
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.dk", args->dk, c.dqkv_format, c.dqkv_dtype,
                                         c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk,
                                         true, kv_tokens, &t.dk));
  FUSEDATTN_RETURN_IF_ERROR(CheckQkvLike("args.dv", args->dv, c.dqkv_format, c.dqkv_dtype,
                                         c.batch, c.max_seqlen_kv, c.heads_kv, c.head_dim_v, true,
                                         kv_tokens, &t.dv));
  SharedInputs shared{&args->bias,          &args->alibi_slopes,  &args->sink_logits,
                      &args->cu_seqlens_q,  &args->cu_seqlens_kv, &args->seq_offsets_q,
                      &args->seq_offsets_kv};
  FUSEDATTN_RETURN_IF_ERROR(CheckShared(p, shared, &t));
  if (c.bias_requires_grad) {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckBias("args.dbias", p, args->dbias, true, t.bias.dtype, &t.dbias));
    // Broadcast axes are summed into, so dbias keeps its own strides even where they are 1-sized.
  } else {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckAbsent("args.dbias", args->dbias, "config.bias_requires_grad = 0"));
  }
  if (c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK) {
    FUSEDATTN_RETURN_IF_ERROR(CheckVector("args.dsink", args->dsink, FUSEDATTN_DTYPE_FLOAT32,
                                          c.heads_q, true, "config.softmax_type = learnable_sink"));
    t.dsink = static_cast<float*>(args->dsink.data);
    t.dsink_stride = args->dsink.strides[0];
  } else {
    FUSEDATTN_RETURN_IF_ERROR(
        CheckAbsent("args.dsink", args->dsink, "config.softmax_type is not learnable_sink"));
  }
  FUSEDATTN_RETURN_IF_ERROR(CheckScoreModTensors(p, args->num_score_mod_tensors,
                                                 args->score_mod_tensors, true,
                                                 args->d_score_mod_tensors, &t.score_mod_tensors,
                                                 &t.score_mod_grads));
  FUSEDATTN_RETURN_IF_ERROR(CheckBwdScales(p, *args, &t.fp8));
  t.dropout_seed = args->dropout_seed;
  t.dropout_offset = args->dropout_offset;
  t.dropout_seed_offset = args->dropout_seed_offset;
  *out = t;
  return Status::Ok();
}

Status CheckBackwardDtypes(const Problem& p) {
  if (!p.fp8) return Status::Ok();
  const auto& c = p.config;
  if (!IsFp8(c.do_dtype))
    return InvalidArgument(
        "config.do_dtype = %s%s: the FP8 backward takes dO in fp8_e4m3 or fp8_e5m2 (set "
        "config.do_dtype; default is o_dtype)",
        DtypeName(c.do_dtype), c.do_dtype == c.o_dtype ? " (default: o_dtype)" : "");
  return Status::Ok();
}

Status CheckHasBackward(const Problem& p) {
  FUSEDATTN_RETURN_IF_ERROR(CheckBackwardDtypes(p));
  if (p.paged)
    return InvalidArgument(
        "config.page_size = %lld: paged K/V is forward only (a serving cache has no backward); "
        "run the backward on contiguous K/V (page_size = 0)",
        (long long)p.config.page_size);
  return Status::Ok();
}

}  // namespace fusedattn
