#include "cli_options.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace fusedattn::cli {
namespace {

using Setter = std::function<std::string(Settings&, const std::string&)>;

// Strict number parsing: the whole text must be the number.
bool ParseInt(const std::string& text, int64_t* value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *value = v;
  return true;
}

bool ParseReal(const std::string& text, double* value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v)) return false;
  *value = v;
  return true;
}

const char* DtypeText(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return "float32";
    case FUSEDATTN_DTYPE_FLOAT16: return "float16";
    case FUSEDATTN_DTYPE_BFLOAT16: return "bfloat16";
    default: return "another dtype";
  }
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    size_t end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? end : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

std::string RealText(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

std::string RangeText(int64_t min, int64_t max) {
  if (max == INT64_MAX) return "must be >= " + std::to_string(min);
  return "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

Setter Int(int64_t Settings::*field, int64_t min, int64_t max = INT64_MAX) {
  return [=](Settings& s, const std::string& text) -> std::string {
    int64_t v = 0;
    if (!ParseInt(text, &v)) return "'" + text + "' is not an integer";
    if (v < min || v > max) return text + " is out of range: " + RangeText(min, max);
    s.*field = v;
    return "";
  };
}

// A real in [min, max], or [min, max) when max_open.
Setter Real(double Settings::*field, double min, double max, bool max_open) {
  return [=](Settings& s, const std::string& text) -> std::string {
    double v = 0;
    if (!ParseReal(text, &v)) return "'" + text + "' is not a finite number";
    if (v < min || v > max || (max_open && v == max)) {
      std::string range = std::isinf(max) ? "must be >= " + RealText(min)
                                          : "must be in [" + RealText(min) + ", " +
                                                RealText(max) + (max_open ? ")" : "]");
      return text + " is out of range: " + range;
    }
    s.*field = v;
    return "";
  };
}

Setter Flag(bool Settings::*field) {
  return [=](Settings& s, const std::string&) -> std::string {
    s.*field = true;
    return "";
  };
}

template <typename T>
std::string ChoiceNames(const std::vector<std::pair<const char*, T>>& choices) {
  std::string names;
  for (auto& c : choices) {
    if (!names.empty()) names += '|';
    names += c.first;
  }
  return names;
}

template <typename T, typename Field>
Setter Choice(Field Settings::*field, std::vector<std::pair<const char*, T>> choices) {
  return [=](Settings& s, const std::string& text) -> std::string {
    for (auto& c : choices)
      if (text == c.first) {
        s.*field = static_cast<Field>(c.second);
        return "";
      }
    return "'" + text + "' is not one of " + ChoiceNames(choices);
  };
}

const std::vector<std::pair<const char*, fusedattn_format>> kLayouts = {
    {"bshd", FUSEDATTN_FORMAT_BSHD},
    {"sbhd", FUSEDATTN_FORMAT_SBHD},
    {"bhsd", FUSEDATTN_FORMAT_BHSD},
    {"thd", FUSEDATTN_FORMAT_THD}};

// "Q1,Q2,...", each in [0, 2^31 - 1].
std::string ParseLengths(const std::string& text, std::vector<int32_t>* lengths) {
  lengths->clear();
  for (const std::string& part : Split(text, ',')) {
    int64_t v = 0;
    if (!ParseInt(part, &v)) return "'" + part + "' in '" + text + "' is not an integer";
    if (v < 0 || v > INT32_MAX) return part + " is out of range: lengths must be >= 0";
    lengths->push_back(static_cast<int32_t>(v));
  }
  return "";
}

std::vector<Option> BuildOptions() {
  using S = Settings;
  std::vector<Option> o;
  auto add = [&](std::string name, std::string metavar, std::string fallback, std::string help,
                 Setter set, bool run_only = false) {
    o.push_back({std::move(name), std::move(metavar), std::move(fallback), std::move(help),
                 run_only, std::move(set)});
  };
  // The problem.
  add("--b", "N", "2", "batch: number of sequences", Int(&S::batch, 1));
  add("--h", "N", "8", "query heads", Int(&S::heads_q, 1));
  add("--hkv", "N", "--h", "key/value heads (divides --h: GQA/MQA)", Int(&S::heads_kv, 1));
  add("--sq", "N", "128", "query sequence length (max_seqlen_q)", Int(&S::seqlen_q, 1));
  add("--skv", "N", "--sq", "key/value sequence length (max_seqlen_kv)", Int(&S::seqlen_kv, 1));
  add("--d", "N", "64", "head dim of q/k and of v", Int(&S::head_dim, 1));
  add("--dqk", "N", "--d", "head dim of q and k", Int(&S::head_dim_qk, 1));
  add("--dv", "N", "--d", "head dim of v and o", Int(&S::head_dim_v, 1));
  add("--dtype", "DTYPE", "bf16",
      "dtype of q, k, v, o and their gradients: bf16|bfloat16, fp16|float16|half, fp32|float32",
      [](Settings& s, const std::string& text) -> std::string {
        if (!ParseDtype(text, &s.dtype))
          return "'" + text + "' is not one of " + kDtypeSpellings;
        return "";
      });
  add("--layout", "bshd|sbhd|bhsd|thd", "bshd",
      "format of every tensor (thd: packed variable length)", Choice(&S::layout, kLayouts));
  add("--q-layout", "FORMAT", "--layout", "format of q", Choice(&S::q_layout, kLayouts));
  add("--kv-layout", "FORMAT", "--layout", "format of k and v", Choice(&S::kv_layout, kLayouts));
  add("--o-layout", "FORMAT", "--layout", "format of o", Choice(&S::o_layout, kLayouts));
  add("--do-layout", "FORMAT", "--layout", "format of dO", Choice(&S::do_layout, kLayouts));
  add("--dqkv-layout", "FORMAT", "--layout", "format of dQ, dK, dV",
      Choice(&S::dqkv_layout, kLayouts));
  add("--page-size", "N", "0",
      "paged K/V: k and v as pools of pages of N tokens, found through a page table, with "
      "per-sequence key lengths (forward only; 0: contiguous). --kv-layout is the pages' "
      "layout: bshd [pages, N, hkv, d], bhsd [pages, hkv, N, d], sbhd [N, pages, hkv, d]; bshd "
      "when --layout is thd. run: the pages in a shuffled order, 2 spare",
      Int(&S::page_size, 0, INT32_MAX));
  add("--mask", "MASK", "none",
      "one of none, padding, causal, causal_bottom_right, padding_causal, "
      "padding_causal_bottom_right (bottom_right: diagonal aligned to the end of the keys)",
      Choice(&S::mask, std::vector<std::pair<const char*, fusedattn_mask>>{
                           {"none", FUSEDATTN_MASK_NONE},
                           {"padding", FUSEDATTN_MASK_PADDING},
                           {"causal", FUSEDATTN_MASK_CAUSAL},
                           {"causal_bottom_right", FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT},
                           {"padding_causal", FUSEDATTN_MASK_PADDING_CAUSAL},
                           {"padding_causal_bottom_right",
                            FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT}}));
  add("--window", "L,R", "-1,-1", "sliding window: keys left and right of the diagonal (-1: unbounded)",
      [](Settings& s, const std::string& text) -> std::string {
        std::vector<std::string> parts = Split(text, ',');
        int64_t left = 0, right = 0;
        if (parts.size() != 2 || !ParseInt(parts[0], &left) || !ParseInt(parts[1], &right))
          return "'" + text + "' is not two integers L,R";
        if (left < -1 || right < -1) return text + " is out of range: each must be >= -1";
        s.window_left = left, s.window_right = right;
        return "";
      });
  add("--bias", "none|pre_scale|post_scale|alibi", "none",
      "attention bias: a [1|b, 1|h, sq, skv] tensor added before or after the scale, or ALiBi",
      Choice(&S::bias, std::vector<std::pair<const char*, fusedattn_bias>>{
                           {"none", FUSEDATTN_BIAS_NONE},
                           {"pre_scale", FUSEDATTN_BIAS_PRE_SCALE},
                           {"post_scale", FUSEDATTN_BIAS_POST_SCALE},
                           {"alibi", FUSEDATTN_BIAS_ALIBI}}));
  add("--bias-shape", "(1|b),(1|h)", "1,1", "bias batch and head extents (broadcast when 1)",
      [](Settings& s, const std::string& text) -> std::string {
        std::vector<std::string> parts = Split(text, ',');
        if (parts.size() != 2 || (parts[0] != "1" && parts[0] != "b") ||
            (parts[1] != "1" && parts[1] != "h"))
          return "'" + text + "' is not one of 1,1|b,1|1,h|b,h";
        s.bias_full_batch = parts[0] == "b", s.bias_full_heads = parts[1] == "h";
        return "";
      });
  add("--bias-dtype", "fp32|same", "fp32",
      "bias dtype: float32 (fp32|float32) or the same as --dtype (same, or that dtype's name)",
      [](Settings& s, const std::string& text) -> std::string {
        fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
        if (text == "same") {
          s.bias_fp32 = false;
          s.bias_dtype_named = FUSEDATTN_DTYPE_FLOAT32;  // no dtype named
          return "";
        }
        if (!ParseDtype(text, &dtype))
          return "'" + text + "' is not one of same|" + kDtypeSpellings;
        // A dtype by name: float32 is fp32, any other must be --dtype's (checked in
        // CheckCombination, which sees the final --dtype).
        s.bias_fp32 = dtype == FUSEDATTN_DTYPE_FLOAT32;
        s.bias_dtype_named = dtype;
        return "";
      });
  add("--bias-grad", "", "off", "the backward also computes dbias", Flag(&S::bias_grad));
  add("--softmax", "vanilla|off_by_one|sink", "vanilla",
      "softmax variant (sink: a learnable logit per head)",
      Choice(&S::softmax, std::vector<std::pair<const char*, fusedattn_softmax>>{
                              {"vanilla", FUSEDATTN_SOFTMAX_VANILLA},
                              {"off_by_one", FUSEDATTN_SOFTMAX_OFF_BY_ONE},
                              {"sink", FUSEDATTN_SOFTMAX_LEARNABLE_SINK}}));
  add("--softcap", "X", "0", "tanh soft-cap of the scores (0: off)",
      Real(&S::softcap, 0, INFINITY, false));
  add("--dropout", "P", "0", "dropout probability in [0, 1)", Real(&S::dropout, 0, 1, true));
  add("--scale", "X", "0", "score scale (0: 1/sqrt(dqk))",
      Real(&S::scale, -INFINITY, INFINITY, false));
  add("--deterministic", "", "off", "ask for a bit-reproducible backward",
      Flag(&S::deterministic));
  add("--max-logit", "", "off", "the forward also returns the per-head max logit",
      Flag(&S::max_logit));
  add("--lse", "", "off", "the forward also returns the log-sum-exp (implied by --bwd)",
      Flag(&S::lse));
  add("--bwd", "", "off", "also run (and check, and time) the backward", Flag(&S::backward));
  // Where and how.
  add("--backend", "auto|reference|cudnn|flash|small_seq", "auto",
      "force a backend (auto: the library chooses)",
      Choice(&S::backend, std::vector<std::pair<const char*, fusedattn_backend>>{
                              {"auto", FUSEDATTN_BACKEND_AUTO},
                              {"reference", FUSEDATTN_BACKEND_REFERENCE},
                              {"cudnn", FUSEDATTN_BACKEND_CUDNN},
                              {"flash", FUSEDATTN_BACKEND_FLASH},
                              {"small_seq", FUSEDATTN_BACKEND_SMALL_SEQ}}));
  add("--device", "auto|cpu|cuda", "auto", "where the tensors live (auto: cuda when a GPU is present)",
      Choice(&S::device, std::vector<std::pair<const char*, fusedattn_device>>{
                             {"auto", FUSEDATTN_DEVICE_AUTO},
                             {"cpu", FUSEDATTN_DEVICE_CPU},
                             {"cuda", FUSEDATTN_DEVICE_CUDA}}));
  // The inputs and the measurement (run only).
  add("--seed", "N", "1", "seed of the random inputs and sequence lengths", Int(&S::seed, 0),
      true);
  add("--lengths", "Q,..[:KV,..]", "random",
      "per-sequence lengths (thd, padding masks; key lengths also with --page-size): --b query "
      "lengths, then optionally ':' and --b key lengths (else the same)",
      [](Settings& s, const std::string& text) -> std::string {
        std::vector<std::string> parts = Split(text, ':');
        if (parts.size() > 2) return "'" + text + "' has more than one ':'";
        std::string error = ParseLengths(parts[0], &s.lengths_q);
        if (error.empty())
          error = ParseLengths(parts.size() == 2 ? parts[1] : parts[0], &s.lengths_kv);
        return error;
      },
      true);
  add("--thd-gaps", "", "off", "thd: leave unused tokens between sequences (seq_offsets)",
      Flag(&S::thd_gaps), true);
  add("--lse-packed", "", "off", "thd: LSE as [tokens, heads] instead of [b, heads, sq]",
      Flag(&S::lse_packed), true);
  add("--padded-strides", "", "off", "tensors with padded (non-contiguous) strides",
      Flag(&S::padded_strides), true);
  add("--check", "", "auto",
      "compare with the reference backend even when large (auto: when b*h*sq*skv*d <= 2^26)",
      [](Settings& s, const std::string&) -> std::string {
        s.check = CheckMode::kAlways;
        return "";
      },
      true);
  add("--no-check", "", "auto", "never compare with the reference backend",
      [](Settings& s, const std::string&) -> std::string {
        s.check = CheckMode::kNever;
        return "";
      },
      true);
  add("--iters", "N", "3", "timed repetitions after the checked run (0: no timing)",
      Int(&S::iters, 0, 1000000), true);
  // Output.
  add("--json", "", "off",
      "print one JSON object on stdout instead of text (keys in the README's CLI section)",
      Flag(&S::json));
  add("--quiet", "", "off",
      "-q: print only the result (run: the result line; explain: the chosen backend)",
      Flag(&S::quiet));
  add("--verbose", "", "off",
      "-v: also print the version, the build's GPU architectures and every timed call",
      Flag(&S::verbose));
  add("--help", "", "", "this help", Flag(&S::help));
  return o;
}

}  // namespace

const std::vector<Option>& Options() {
  static const std::vector<Option> options = BuildOptions();
  return options;
}

bool ParseOptions(int argc, char** argv, int first, Settings* settings, std::string* error) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    std::string name = arg, value;
    bool inline_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq), value = arg.substr(eq + 1), inline_value = true;
    }
    if (name == "-h") name = "--help";
    if (name == "-q") name = "--quiet";
    if (name == "-v") name = "--verbose";
    const Option* option = nullptr;
    for (const Option& o : Options())
      if (o.name == name) option = &o;
    if (option == nullptr) {
      *error = (arg.rfind("-", 0) == 0 ? "unknown option '" + name + "'"
                                       : "unexpected argument '" + arg + "'") +
               " (see --help)";
      return false;
    }
    if (option->metavar.empty()) {
      if (inline_value) {
        *error = name + " is a flag and takes no value (got '" + value + "')";
        return false;
      }
    } else if (!inline_value) {
      if (i + 1 >= argc) {
        *error = name + " needs a value (" + option->metavar + ")";
        return false;
      }
      value = argv[++i];
    }
    if (std::string problem = option->set(*settings, value); !problem.empty()) {
      *error = name + ": " + problem;
      return false;
    }
  }
  return true;
}

const char* const kDtypeSpellings = "bf16|bfloat16|fp16|float16|half|fp32|float32";

bool ParseDtype(const std::string& text, fusedattn_dtype* dtype) {
  static const std::pair<const char*, fusedattn_dtype> kNames[] = {
      {"bf16", FUSEDATTN_DTYPE_BFLOAT16}, {"bfloat16", FUSEDATTN_DTYPE_BFLOAT16},
      {"fp16", FUSEDATTN_DTYPE_FLOAT16},  {"float16", FUSEDATTN_DTYPE_FLOAT16},
      {"half", FUSEDATTN_DTYPE_FLOAT16},  {"fp32", FUSEDATTN_DTYPE_FLOAT32},
      {"float32", FUSEDATTN_DTYPE_FLOAT32}};
  for (const auto& name : kNames)
    if (text == name.first) {
      *dtype = name.second;
      return true;
    }
  return false;
}

std::string CheckCombination(const Settings& s) {
  if (s.bias_dtype_named != FUSEDATTN_DTYPE_FLOAT32 && s.bias_dtype_named != s.dtype)
    return std::string("--bias-dtype: ") + DtypeText(s.bias_dtype_named) +
           " is neither float32 nor --dtype (" + DtypeText(s.dtype) + ")";
  if (s.lengths_q.empty()) return "";
  const bool thd = s.layout == FUSEDATTN_FORMAT_THD;
  const bool padding = s.mask == FUSEDATTN_MASK_PADDING ||
                       s.mask == FUSEDATTN_MASK_PADDING_CAUSAL ||
                       s.mask == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  const bool paged = s.page_size > 0;
  if (!thd && !padding && !paged)
    return "--lengths: per-sequence lengths need --layout thd, a padding mask or --page-size";
  if (static_cast<int64_t>(s.lengths_q.size()) != s.batch ||
      static_cast<int64_t>(s.lengths_kv.size()) != s.batch)
    return "--lengths: give --b = " + std::to_string(s.batch) + " lengths (got " +
           std::to_string(s.lengths_q.size()) + " query and " +
           std::to_string(s.lengths_kv.size()) + " key lengths)";
  fusedattn_config c = MakeConfig(s);
  if (!thd && !padding)  // paged: per-sequence key lengths only
    for (int32_t len : s.lengths_q)
      if (len != c.max_seqlen_q)
        return "--lengths: query length " + std::to_string(len) + " differs from --sq = " +
               std::to_string(c.max_seqlen_q) +
               ": per-sequence query lengths need --layout thd or a padding mask (--page-size "
               "gives per-sequence key lengths; give them after ':')";
  for (int32_t len : s.lengths_q)
    if (len > c.max_seqlen_q)
      return "--lengths: query length " + std::to_string(len) + " is larger than --sq = " +
             std::to_string(c.max_seqlen_q);
  for (int32_t len : s.lengths_kv)
    if (len > c.max_seqlen_kv)
      return "--lengths: key length " + std::to_string(len) + " is larger than --skv = " +
             std::to_string(c.max_seqlen_kv);
  return "";
}

fusedattn_config MakeConfig(const Settings& s) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.is_training = s.backward ? 1 : 0;
  c.batch = s.batch;
  c.heads_q = s.heads_q;
  c.heads_kv = s.heads_kv ? s.heads_kv : s.heads_q;
  c.max_seqlen_q = s.seqlen_q;
  c.max_seqlen_kv = s.seqlen_kv ? s.seqlen_kv : s.seqlen_q;
  c.head_dim_qk = s.head_dim_qk ? s.head_dim_qk : s.head_dim;
  c.head_dim_v = s.head_dim_v ? s.head_dim_v : s.head_dim;
  c.qkv_dtype = c.o_dtype = s.dtype;
  auto format = [&](int override_layout) {
    return static_cast<fusedattn_format>(override_layout >= 0 ? override_layout : s.layout);
  };
  c.q_format = format(s.q_layout);
  c.kv_format = format(s.kv_layout);
  // Pages are never THD: with --layout thd they are bshd unless --kv-layout says otherwise.
  c.page_size = s.page_size;
  if (s.page_size > 0 && s.kv_layout < 0 && c.kv_format == FUSEDATTN_FORMAT_THD)
    c.kv_format = FUSEDATTN_FORMAT_BSHD;
  c.o_format = format(s.o_layout);
  c.do_format = format(s.do_layout);
  c.dqkv_format = format(s.dqkv_layout);
  c.mask = s.mask;
  c.window_left = s.window_left;
  c.window_right = s.window_right;
  c.bias_type = s.bias;
  c.bias_batch = s.bias_full_batch ? c.batch : 1;
  c.bias_heads = s.bias_full_heads ? c.heads_q : 1;
  c.bias_requires_grad = s.bias_grad ? 1 : 0;
  c.softmax_type = s.softmax;
  c.attn_scale = s.scale;
  c.softcap = s.softcap;
  c.dropout = s.dropout;
  c.deterministic = s.deterministic ? 1 : 0;
  c.return_lse = s.lse ? 1 : 0;
  c.return_max_logit = s.max_logit ? 1 : 0;
  c.backend = s.backend;
  c.device = s.device;
  return c;
}

std::string OptionsHelp() {
  constexpr size_t kIndent = 34, kWidth = 100;
  std::string text;
  for (const Option& o : Options()) {
    std::string line = "  " + o.name + (o.metavar.empty() ? "" : " " + o.metavar);
    if (line.size() < kIndent) {
      line.resize(kIndent, ' ');
    } else {
      text += line + "\n";
      line = std::string(kIndent, ' ');
    }
    std::string help = o.help;
    if (!o.fallback.empty()) help += " [default: " + o.fallback + "]";
    if (o.run_only) help += " (run only)";
    // Word-wrapped at kWidth columns.
    for (const std::string& word : Split(help, ' ')) {
      if (line.size() > kIndent && line.size() + 1 + word.size() > kWidth) {
        text += line + "\n";
        line = std::string(kIndent, ' ');
      }
      if (line.size() > kIndent) line += ' ';
      line += word;
    }
    text += line + "\n";
  }
  return text;
}

}  // namespace fusedattn::cli
