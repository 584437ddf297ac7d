// The options of the `fusedattn` program: one table drives both the parser and --help, so the
// two cannot drift apart.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"

namespace fusedattn::cli {

// Exit codes of the program.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // check failed, no backend, library error
constexpr int kExitUsage = 2;    // bad command line

enum class CheckMode { kAuto, kAlways, kNever };

// Everything the command line can set. Zero in heads_kv, seqlen_kv, head_dim_qk and head_dim_v
// means "same as" heads_q, seqlen_q and head_dim; -1 in a per-tensor layout means "--layout".
struct Settings {
  int64_t batch = 2;
  int64_t heads_q = 8;
  int64_t heads_kv = 0;
  int64_t seqlen_q = 128;
  int64_t seqlen_kv = 0;
  int64_t head_dim = 64;
  int64_t head_dim_qk = 0;
  int64_t head_dim_v = 0;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_BFLOAT16;
  int layout = FUSEDATTN_FORMAT_BSHD;
  int q_layout = -1, kv_layout = -1, o_layout = -1, do_layout = -1, dqkv_layout = -1;
  int64_t page_size = 0;  // > 0: paged K/V
  fusedattn_mask mask = FUSEDATTN_MASK_NONE;
  int64_t window_left = -1, window_right = -1;
  fusedattn_bias bias = FUSEDATTN_BIAS_NONE;
  bool bias_full_batch = false, bias_full_heads = false;
  bool bias_grad = false;
  bool bias_fp32 = true;
  fusedattn_dtype bias_dtype_named = FUSEDATTN_DTYPE_FLOAT32;  // --bias-dtype given as a dtype
  fusedattn_softmax softmax = FUSEDATTN_SOFTMAX_VANILLA;
  double softcap = 0;
  double dropout = 0;
  double scale = 0;
  bool deterministic = false;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  fusedattn_device device = FUSEDATTN_DEVICE_AUTO;
  int64_t seed = 1;
  std::vector<int32_t> lengths_q, lengths_kv;  // empty: drawn at random
  bool thd_gaps = false;
  bool lse_packed = false;
  bool padded_strides = false;
  bool backward = false;
  CheckMode check = CheckMode::kAuto;
  int64_t iters = 3;
  bool max_logit = false;
  bool lse = false;
  bool help = false;
  // Output: --json (one JSON object on stdout, documented keys), --quiet, --verbose.
  bool json = false;
  bool quiet = false;
  bool verbose = false;
};

// One command line option. `set` parses the value (empty for flags) into the settings and returns
// "" or what is wrong with the value.
struct Option {
  std::string name;      // "--b"
  std::string metavar;   // "N"; empty for a flag
  std::string fallback;  // the default, as the help shows it
  std::string help;
  bool run_only = false; // ignored by `explain`
  std::function<std::string(Settings&, const std::string& value)> set;
};

const std::vector<Option>& Options();

// Parses argv[first..argc) into settings. On error returns false with a one-line message naming
// the option.
bool ParseOptions(int argc, char** argv, int first, Settings* settings, std::string* error);

// Checks that concern several options at once (lengths against batch and layout). Returns "" or a
// one-line message naming the option.
std::string CheckCombination(const Settings& settings);

// The config the settings describe. is_training follows --bwd.
fusedattn_config MakeConfig(const Settings& settings);

// Every spelling the program takes for a dtype (--dtype, --bias-dtype): bf16|bfloat16,
// fp16|float16|half, fp32|float32. Returns false for another text.
bool ParseDtype(const std::string& text, fusedattn_dtype* dtype);
extern const char* const kDtypeSpellings;  // "bf16|bfloat16|fp16|float16|half|fp32|float32"

// The option list of --help, generated from the table.
std::string OptionsHelp();

}  // namespace fusedattn::cli
