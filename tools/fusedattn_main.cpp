// The `fusedattn` command line program: run one attention problem on random inputs (forward and
// optionally backward), check it against the reference backend, time it, and explain which
// backend the library chooses and why the others refuse.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "cli_options.h"
#include "common/cuda_util.h"
#include "fusedattn/fusedattn.h"
#include "json.h"
#include "problem/problem.h"
#include "testing/tensors.h"

#ifdef FUSEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusedattn::cli {
namespace {

using testing::ProblemTensors;

constexpr fusedattn_backend kBackendOrder[] = {FUSEDATTN_BACKEND_SMALL_SEQ, FUSEDATTN_BACKEND_CUDNN,
                                               FUSEDATTN_BACKEND_FLASH,
                                               FUSEDATTN_BACKEND_REFERENCE};
constexpr size_t kMessageBytes = 16384;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "fusedattn: %s\n", message.c_str());
  return kExitUsage;
}

int Failure(const std::string& message) {
  std::fprintf(stderr, "fusedattn: %s\n", message.c_str());
  return kExitFailure;
}

std::string StatusText(fusedattn_status status, const char* message) {
  return std::string(fusedattn_status_string(status)) + ": " + message;
}

// ------------------------------------------------------------------------------------------------
// Selection
// ------------------------------------------------------------------------------------------------

struct Selection {
  fusedattn_status status = FUSEDATTN_SUCCESS;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  std::string message;  // the library's diagnostic, or its error
};

Selection Select(const fusedattn_config& config) {
  Selection s;
  char msg[kMessageBytes];
  s.status = fusedattn_get_backend(&config, &s.backend, msg, sizeof msg);
  s.message = msg;
  return s;
}

bool DeviceIsCpu(const fusedattn_config& config) {
  return config.device == FUSEDATTN_DEVICE_CPU ||
         (config.device == FUSEDATTN_DEVICE_AUTO && !testing::CudaDeviceAvailable());
}

// The library's text of the problem, when the config is valid.
std::string Describe(const fusedattn_config& config) {
  Problem problem;
  if (!MakeProblem(&config, testing::CudaDeviceAvailable(), &problem).ok()) return "";
  return problem.describe();
}

// What one backend says about the problem when asked alone (forced): state is "accepts",
// "refuses", "unavailable" or "not_asked" (the JSON spelling; the text prints "not asked").
struct Verdict {
  std::string state;
  std::string reason;  // empty for "accepts"
  // For "accepts": how the backend would run it (its note, e.g. flash's plan: path, instance,
  // variant, schedule, workspace); empty when it has nothing to say.
  std::string note;
  std::string text() const {
    std::string name = state == "not_asked" ? "not asked" : state;
    if (!note.empty()) return name + " [" + note + "]";
    return reason.empty() ? name : name + ": " + reason;
  }
};

Verdict VerdictOf(const fusedattn_config& config, fusedattn_backend id) {
  char msg[kMessageBytes];
  if (!fusedattn_backend_available(id, msg, sizeof msg)) return {"unavailable", msg, ""};
  if (DeviceIsCpu(config) && id != FUSEDATTN_BACKEND_REFERENCE)
    return {"not_asked", "runs on CUDA tensors only, and the device is cpu", ""};
  fusedattn_config forced = config;
  forced.backend = id;
  Selection s = Select(forced);
  if (s.status == FUSEDATTN_SUCCESS) {
    // "X (forced) [<note>]": keep the note.
    const std::string forced_prefix = std::string(fusedattn_backend_name(id)) + " (forced) [";
    if (s.message.rfind(forced_prefix, 0) == 0 && s.message.back() == ']')
      return {"accepts", "",
              s.message.substr(forced_prefix.size(), s.message.size() - forced_prefix.size() - 1)};
    return {"accepts", "", ""};
  }
  // "forced backend X cannot run this problem (<problem>): <reason>": keep the reason.
  std::string prefix = std::string("forced backend ") + fusedattn_backend_name(id) +
                       " cannot run this problem (" + Describe(forced) + "): ";
  if (s.message.rfind(prefix, 0) == 0) return {"refuses", s.message.substr(prefix.size()), ""};
  return {"refuses", s.message, ""};
}

// The selection diagnostic and every backend's own verdict: printed as text (unless --quiet),
// or, with --json, set into `json` under the keys "problem", "device", "backend", "selection"
// and "backends". Returns the selection.
Selection ReportSelection(const fusedattn_config& config, const Settings& settings, Json* json) {
  Selection s = Select(config);
  const std::string problem = Describe(config);
  const bool chosen_any = s.status == FUSEDATTN_SUCCESS;
  const char* device = DeviceIsCpu(config) ? "cpu" : "cuda";
  if (settings.json) {
    json->set("problem", problem.empty() ? Json() : Json(problem));
    json->set("device", device);
    json->set("backend", chosen_any ? Json(fusedattn_backend_name(s.backend)) : Json());
    json->set("selection", s.message);
    Json backends = Json::Array();
    for (fusedattn_backend id : kBackendOrder) {
      Verdict v = VerdictOf(config, id);
      backends.push(Json::Object()
                        .set("name", fusedattn_backend_name(id))
                        .set("verdict", v.state)
                        .set("reason", v.reason.empty() ? Json() : Json(v.reason))
                        .set("note", v.note.empty() ? Json() : Json(v.note))
                        .set("chosen", chosen_any && s.backend == id));
    }
    json->set("backends", std::move(backends));
    return s;
  }
  if (settings.quiet) return s;
  if (settings.verbose)
    std::printf("fusedattn:  %s (GPU code for %s)\n", fusedattn_version_string(),
                *BuiltCudaArchitectures() ? BuiltCudaArchitectures() : "none: built without CUDA");
  if (!problem.empty()) std::printf("problem:    %s\n", problem.c_str());
  std::printf("device:     %s\n", device);
  std::printf("backend:    %s\n", chosen_any ? fusedattn_backend_name(s.backend) : "none");
  std::printf("selection:  %s\n", s.message.c_str());
  std::printf("backends:\n");
  for (fusedattn_backend id : kBackendOrder) {
    std::string verdict = VerdictOf(config, id).text();
    bool chosen = chosen_any && s.backend == id;
    std::printf("  %-10s %s%s\n", fusedattn_backend_name(id), verdict.c_str(),
                chosen ? " (chosen)" : "");
  }
  std::fflush(stdout);
  return s;
}

// Prints a JSON object on one line (the whole output of --json).
void PrintJson(const Json& json) {
  std::printf("%s\n", json.Dump().c_str());
  std::fflush(stdout);
}

// A failure after the options were accepted: with --json the object so far with "error" set (and
// "result": "error" for run), on stdout; else the message on stderr.
int JsonOrFailure(const Settings& settings, Json* json, const std::string& message,
                  bool run) {
  if (!settings.json) return Failure(message);
  json->set("error", message);
  if (run) json->set("result", "error");
  PrintJson(*json);
  return kExitFailure;
}

// ------------------------------------------------------------------------------------------------
// Running on the host or the device
// ------------------------------------------------------------------------------------------------

// Runs the library on the tensors of a problem, where config.device says they live: on the CPU
// straight on the host tensors, on CUDA on device mirrors (testing::DeviceProblem).
class Runner {
 public:
  Runner(const fusedattn_config& config, ProblemTensors* tensors)
      : config_(config), tensors_(tensors), cuda_(!DeviceIsCpu(config)) {}
  ~Runner() {
#ifdef FUSEDATTN_WITH_CUDA
    if (device_workspace_) cudaFree(device_workspace_);
#endif
  }

  bool Prepare(std::string* error) {
    size_t fwd_bytes = 0, bwd_bytes = 0;
    char msg[kMessageBytes];
    fusedattn_status st = fusedattn_fwd_workspace_size(&config_, &fwd_bytes, msg, sizeof msg);
    if (st == FUSEDATTN_SUCCESS && config_.is_training)
      st = fusedattn_bwd_workspace_size(&config_, &bwd_bytes, msg, sizeof msg);
    if (st != FUSEDATTN_SUCCESS) {
      *error = "workspace size: " + StatusText(st, msg);
      return false;
    }
    workspace_bytes_ = std::max(fwd_bytes, bwd_bytes);
    if (!cuda_) {
      host_workspace_.resize(workspace_bytes_);
      return true;
    }
#ifdef FUSEDATTN_WITH_CUDA
    if (workspace_bytes_ > 0) {
      if (cudaError_t err = cudaMalloc(&device_workspace_, workspace_bytes_); err != cudaSuccess) {
        *error = std::string("cudaMalloc of the workspace: ") + cudaGetErrorString(err);
        return false;
      }
    }
    if (!device_.upload(*tensors_, error)) {
      *error = "upload to the device: " + *error;
      return false;
    }
    return true;
#else
    *error = "the tensors are on CUDA but this program was built without CUDA";
    return false;
#endif
  }

  bool Forward(std::string* error) {
    fusedattn_fwd_args args = cuda_ ? device_.fwd_args() : tensors_->fwd_args();
    char msg[kMessageBytes];
    fusedattn_status st =
        fusedattn_fwd(&config_, &args, workspace(), workspace_bytes_, nullptr, msg, sizeof msg);
    if (st != FUSEDATTN_SUCCESS) *error = "forward: " + StatusText(st, msg);
    return st == FUSEDATTN_SUCCESS;
  }

  bool Backward(std::string* error) {
    fusedattn_bwd_args args = cuda_ ? device_.bwd_args() : tensors_->bwd_args();
    char msg[kMessageBytes];
    fusedattn_status st =
        fusedattn_bwd(&config_, &args, workspace(), workspace_bytes_, nullptr, msg, sizeof msg);
    if (st != FUSEDATTN_SUCCESS) *error = "backward: " + StatusText(st, msg);
    return st == FUSEDATTN_SUCCESS;
  }

  // Brings the outputs to the host tensors (nothing to do on the CPU).
  bool Fetch(std::string* error) {
    if (!cuda_) return true;
    if (!device_.download_outputs(tensors_, error)) {
      *error = "download from the device: " + *error;
      return false;
    }
    return true;
  }

  // Milliseconds of each of `iters` calls of step: CUDA events on the GPU, steady_clock on the
  // host.
  bool Time(int64_t iters, const std::function<bool(std::string*)>& step,
            std::vector<double>* times, std::string* error) {
    for (int64_t i = 0; i < iters; ++i) {
      if (!cuda_) {
        auto begin = std::chrono::steady_clock::now();
        if (!step(error)) return false;
        auto end = std::chrono::steady_clock::now();
        times->push_back(std::chrono::duration<double, std::milli>(end - begin).count());
        continue;
      }
#ifdef FUSEDATTN_WITH_CUDA
      cudaEvent_t begin = nullptr, end = nullptr;
      cudaError_t err = cudaEventCreate(&begin);
      if (err == cudaSuccess) err = cudaEventCreate(&end);
      if (err == cudaSuccess) err = cudaEventRecord(begin, nullptr);
      bool ok = err == cudaSuccess && step(error);
      if (ok) {
        err = cudaEventRecord(end, nullptr);
        if (err == cudaSuccess) err = cudaEventSynchronize(end);
        float ms = 0;
        if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, begin, end);
        times->push_back(ms);
      }
      if (begin) cudaEventDestroy(begin);
      if (end) cudaEventDestroy(end);
      if (!ok) return false;
      if (err != cudaSuccess) {
        *error = std::string("timing with CUDA events: ") + cudaGetErrorString(err);
        return false;
      }
#endif
    }
    return true;
  }

  const char* clock_name() const { return cuda_ ? "CUDA events" : "steady_clock"; }

 private:
  void* workspace() {
    if (cuda_) return device_workspace_;
    return host_workspace_.empty() ? nullptr : host_workspace_.data();
  }

  fusedattn_config config_;
  ProblemTensors* tensors_;
  bool cuda_;
  testing::DeviceProblem device_;
  size_t workspace_bytes_ = 0;
  std::vector<unsigned char> host_workspace_;
  void* device_workspace_ = nullptr;
};

// ------------------------------------------------------------------------------------------------
// Measures
// ------------------------------------------------------------------------------------------------

// Visible (query, key) pairs per head, counted exactly with the library's own mask rule over the
// actual per-sequence lengths.
int64_t VisiblePairs(const fusedattn_config& config, const ProblemTensors& tensors) {
  Problem problem;
  if (!MakeProblem(&config, testing::CudaDeviceAvailable(), &problem).ok()) return 0;
  int64_t pairs = 0;
  for (int64_t b = 0; b < config.batch; ++b) {
    const int64_t len_q = tensors.len_q[b], len_kv = tensors.len_kv[b];
    for (int64_t i = 0; i < len_q; ++i) {
      int64_t lo = 0, hi = 0;
      problem.visible_keys(i, len_q, len_kv, &lo, &hi);
      pairs += hi - lo;
    }
  }
  return pairs;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string JoinLengths(const std::vector<int32_t>& lengths) {
  std::string text;
  for (size_t i = 0; i < lengths.size() && i < 16; ++i) {
    if (i) text += ',';
    text += std::to_string(lengths[i]);
  }
  if (lengths.size() > 16) text += ",...";
  return text;
}

// ------------------------------------------------------------------------------------------------
// Subcommands
// ------------------------------------------------------------------------------------------------

const char* kCommandsHelp =
    "usage: fusedattn <command> [options]\n"
    "\n"
    "commands:\n"
    "  run        run a problem on random inputs: forward (and backward with --bwd), check it\n"
    "             against the reference backend, time it, report TFLOP/s\n"
    "  explain    print only which backend runs the problem and why each other one refuses\n"
    "             (exit 0 when a backend is chosen, 1 when none)\n"
    "  backends   list every backend, whether it is available and why not\n"
    "             (options: --json, --quiet/-q, --verbose/-v)\n"
    "  options    print the option names, one per line (for scripts and completion)\n"
    "  --version  print the version\n"
    "  --help     this help; 'fusedattn <command> --help' for one command\n"
    "\n"
    "exit codes: 0 success, 1 failure (check failed, no backend, library error), 2 usage error\n";

void PrintHelp(const char* command) {
  if (command == nullptr) {
    std::printf("%s\noptions of run and explain:\n%s", kCommandsHelp, OptionsHelp().c_str());
    return;
  }
  std::printf("usage: fusedattn %s [options]\n\n", command);
  if (std::strcmp(command, "run") == 0)
    std::printf(
        "Runs the problem on random inputs (uniform in [-1, 1]) with the chosen backend, on the\n"
        "GPU when the device is cuda. Checks every output against the reference backend run on\n"
        "host copies (automatically when b*h*sq*skv*d <= 2^26, or with --check): relative error\n"
        "||out-ref||/||ref|| against the dtype's tolerance (fp32 1e-5, fp16 2e-3, bf16 1e-2).\n"
        "Times --iters further calls (median) and reports TFLOP/s with FLOPs counted over the\n"
        "visible (query, key) pairs: 2*(dqk+dv)*h per pair forward, 2.5 times that backward.\n"
        "Exit 1 when a check fails.\n\n");
  else
    std::printf(
        "Prints the backend the library chooses for the problem and every backend's reason, and\n"
        "for a backend that accepts it how it would run it (flash: its kernel plan).\n"
        "Exit 0 when a backend is chosen, 1 when none can run it.\n\n");
  std::printf("options:\n%s", OptionsHelp().c_str());
}

// fusedattn backends [--json] [--quiet] [--verbose]. JSON keys: "version", "cuda_device",
// "cuda_architectures", "backends": [{"name", "available", "reason"}].
int CmdBackends(const Settings& settings) {
  if (settings.json) {
    Json json = Json::Object();
    json.set("version", fusedattn_version_string());
    json.set("cuda_device", testing::CudaDeviceAvailable());
    json.set("cuda_architectures", BuiltCudaArchitectures());
    Json list = Json::Array();
    for (fusedattn_backend id : kBackendOrder) {
      char msg[kMessageBytes];
      int available = fusedattn_backend_available(id, msg, sizeof msg);
      list.push(Json::Object()
                    .set("name", fusedattn_backend_name(id))
                    .set("available", available != 0)
                    .set("reason", available ? Json() : Json(msg)));
    }
    json.set("backends", std::move(list));
    PrintJson(json);
    return kExitOk;
  }
  if (!settings.quiet) {
    if (settings.verbose)
      std::printf("fusedattn %s, GPU code for %s\n", fusedattn_version_string(),
                  *BuiltCudaArchitectures() ? BuiltCudaArchitectures()
                                            : "none (built without CUDA)");
    std::printf("backends (in the order the library asks them on CUDA):\n");
  }
  for (fusedattn_backend id : kBackendOrder) {
    char msg[kMessageBytes];
    int available = fusedattn_backend_available(id, msg, sizeof msg);
    if (settings.quiet) {
      std::printf("%s %s\n", fusedattn_backend_name(id), available ? "available" : "unavailable");
      continue;
    }
    std::printf("  %-10s %s%s%s\n", fusedattn_backend_name(id),
                available ? "available" : "unavailable", available ? "" : ": ",
                available ? "" : msg);
  }
  if (!settings.quiet)
    std::printf("cuda device: %s\n", testing::CudaDeviceAvailable() ? "yes" : "no");
  return kExitOk;
}

int CmdOptions() {
  for (const Option& o : Options()) std::printf("%s\n", o.name.c_str());
  return kExitOk;
}

int CmdVersion() {
  int64_t cudnn = fusedattn_cudnn_version();
  std::printf("fusedattn %s (library %s, CUDA %s, cuDNN %s)\n", fusedattn_version_string(),
              fusedattn_version_string(),
#ifdef FUSEDATTN_WITH_CUDA
              "yes",
#else
              "no",
#endif
              cudnn ? std::to_string(cudnn).c_str() : "none");
  return kExitOk;
}

// JSON keys: "problem", "device", "backend", "selection", "backends": [{"name", "verdict",
// "reason", "note" (how an accepting backend runs it: flash's kernel plan, cuDNN's plans), "chosen"}],
// "error".
int CmdExplain(const Settings& settings) {
  fusedattn_config config = MakeConfig(settings);
  Json json = Json::Object();
  Selection probe = Select(config);
  if (probe.status == FUSEDATTN_ERROR_INVALID_ARGUMENT)
    return JsonOrFailure(settings, &json, "invalid problem: " + probe.message, false);
  Selection s = ReportSelection(config, settings, &json);
  if (settings.json) {
    json.set("error", Json());
    PrintJson(json);
  } else if (settings.quiet) {
    std::printf("%s\n", s.status == FUSEDATTN_SUCCESS ? fusedattn_backend_name(s.backend) : "none");
  }
  return s.status == FUSEDATTN_SUCCESS ? kExitOk : kExitFailure;
}

// JSON keys: those of explain, then "lengths" ({"q": [...], "kv": [...]} or null), "pages"
// ({"page_size", "num_pages", "table_width"} for paged K/V, else null), "check"
// ({"performed", "reason", "tolerance", "outputs": [{"name", "rel_error", "max_abs_error",
// "passed"}]}), "flops" ({"visible_pairs", "dense_pairs", "fwd_gflop", "bwd_gflop"}), "time"
// ({"clock", "iters", "fwd_ms", "fwd_tflops", "bwd_ms", "bwd_tflops"} or null with --iters 0),
// "result" ("PASS", "FAIL", "not checked" or "error") and "error" (null or the message).
int CmdRun(const Settings& settings) {
  const fusedattn_config config = MakeConfig(settings);
  const bool text = !settings.json && !settings.quiet;
  Json json = Json::Object();
  Selection probe = Select(config);
  if (probe.status == FUSEDATTN_ERROR_INVALID_ARGUMENT)
    return JsonOrFailure(settings, &json, "invalid problem: " + probe.message, true);
  Selection selection = ReportSelection(config, settings, &json);
  if (selection.status != FUSEDATTN_SUCCESS)
    return JsonOrFailure(settings, &json, "no backend runs this problem", true);

  testing::TensorOptions options;
  options.seed = static_cast<uint64_t>(settings.seed);
  options.len_q = settings.lengths_q;
  options.len_kv = settings.lengths_kv;
  options.thd_gaps = settings.thd_gaps;
  options.lse_packed = settings.lse_packed;
  options.padded_strides = settings.padded_strides;
  options.bias_dtype = settings.bias_fp32 ? FUSEDATTN_DTYPE_FLOAT32 : config.qkv_dtype;
  ProblemTensors tensors = testing::MakeProblemTensors(config, options);
  if (tensors.cu_seqlens_q.empty() && tensors.seqlens_kv.empty()) {
    json.set("lengths", Json());
  } else {
    if (text)
      std::printf("lengths:    q %s  kv %s\n", JoinLengths(tensors.len_q).c_str(),
                  JoinLengths(tensors.len_kv).c_str());
    Json q = Json::Array(), kv = Json::Array();
    for (int32_t len : tensors.len_q) q.push(static_cast<int64_t>(len));
    for (int32_t len : tensors.len_kv) kv.push(static_cast<int64_t>(len));
    json.set("lengths", Json::Object().set("q", std::move(q)).set("kv", std::move(kv)));
  }
  if (config.page_size > 0) {
    const int64_t width = tensors.page_table.shape()[1];
    if (text)
      std::printf("pages:      %lld of %lld tokens in a shuffled pool (%lld spare), table [%lld, "
                  "%lld]\n",
                  (long long)tensors.num_pages, (long long)config.page_size,
                  (long long)options.spare_pages, (long long)config.batch, (long long)width);
    json.set("pages", Json::Object()
                          .set("page_size", config.page_size)
                          .set("num_pages", tensors.num_pages)
                          .set("table_width", width));
  } else {
    json.set("pages", Json());
  }

  const double size = static_cast<double>(config.batch) * config.heads_q * config.max_seqlen_q *
                      config.max_seqlen_kv * std::max(config.head_dim_qk, config.head_dim_v);
  const bool check = settings.check == CheckMode::kAlways ||
                     (settings.check == CheckMode::kAuto && size <= std::ldexp(1.0, 26));
  ProblemTensors expected;
  if (check) expected = tensors;  // inputs and poisoned outputs, before any run

  // The checked run: forward, then backward on the forward's O and LSE.
  std::string error;
  Runner runner(config, &tensors);
  if (!runner.Prepare(&error) || !runner.Forward(&error) ||
      (settings.backward && !runner.Backward(&error)) || !runner.Fetch(&error))
    return JsonOrFailure(settings, &json, error, true);

  bool passed = true;
  Json check_json = Json::Object();
  if (!check) {
    const char* reason = settings.check == CheckMode::kNever
                             ? "--no-check"
                             : "b*h*sq*skv*d > 2^26; --check forces it";
    if (text) std::printf("check:      skipped (%s)\n", reason);
    check_json.set("performed", false).set("reason", reason).set("tolerance", Json());
    check_json.set("outputs", Json::Array());
  } else {
    fusedattn_config reference = config;
    reference.backend = FUSEDATTN_BACKEND_REFERENCE;
    reference.device = FUSEDATTN_DEVICE_CPU;
    fusedattn_fwd_args fwd = expected.fwd_args();
    char msg[kMessageBytes];
    fusedattn_status st = fusedattn_fwd(&reference, &fwd, nullptr, 0, nullptr, msg, sizeof msg);
    if (st == FUSEDATTN_SUCCESS && settings.backward) {
      fusedattn_bwd_args bwd = expected.bwd_args();
      st = fusedattn_bwd(&reference, &bwd, nullptr, 0, nullptr, msg, sizeof msg);
    }
    if (st != FUSEDATTN_SUCCESS)
      return JsonOrFailure(settings, &json, "reference run: " + StatusText(st, msg), true);

    const double tolerance = testing::Tolerance(config.qkv_dtype);
    if (text)
      std::printf(
          "check:      against the reference backend on host copies%s; tolerance %g (%s)\n",
          selection.backend == FUSEDATTN_BACKEND_REFERENCE && DeviceIsCpu(config)
              ? " (the run itself was the reference: this checks that it wrote every "
                "output and repeats exactly)"
              : "",
          tolerance, DtypeName(config.qkv_dtype));
    check_json.set("performed", true).set("reason", Json()).set("tolerance", tolerance);
    struct Output {
      const char* name;
      const testing::HostTensor& out;
      const testing::HostTensor& ref;
    };
    std::vector<Output> outputs = {{"o", tensors.o, expected.o},
                                   {"lse", tensors.lse, expected.lse},
                                   {"max_logit", tensors.max_logit, expected.max_logit}};
    if (settings.backward) {
      outputs.push_back({"dq", tensors.dq, expected.dq});
      outputs.push_back({"dk", tensors.dk, expected.dk});
      outputs.push_back({"dv", tensors.dv, expected.dv});
      outputs.push_back({"dbias", tensors.dbias, expected.dbias});
      outputs.push_back({"dsink", tensors.dsink, expected.dsink});
    }
    Json outputs_json = Json::Array();
    for (const Output& output : outputs) {
      if (output.ref.empty()) continue;
      testing::Comparison c = testing::Compare(output.out, output.ref);
      bool ok = c.ok(tolerance);
      passed &= ok;
      outputs_json.push(Json::Object()
                            .set("name", output.name)
                            .set("rel_error", c.rel_error)
                            .set("max_abs_error", c.max_abs_error)
                            .set("passed", ok));
      if (!text) continue;
      std::printf("  %-10s rel_error %-10.3g max_abs %-10.3g %s", output.name, c.rel_error,
                  c.max_abs_error, ok ? "PASS" : "FAIL");
      if (!ok) std::printf("  (%s)", c.describe().c_str());
      std::printf("\n");
    }
    check_json.set("outputs", std::move(outputs_json));
  }
  json.set("check", std::move(check_json));

  // Timing: further calls on the same tensors (the backward reuses the forward's O and LSE).
  const int64_t pairs = VisiblePairs(config, tensors);
  const double dense = static_cast<double>(config.batch) * config.max_seqlen_q *
                       config.max_seqlen_kv;
  const double fwd_flops = 2.0 * static_cast<double>(config.heads_q) *
                           static_cast<double>(config.head_dim_qk + config.head_dim_v) *
                           static_cast<double>(pairs);
  if (text)
    std::printf("flops:      %lld visible (query, key) pairs per head (%.1f%% of dense b*sq*skv = "
                "%.0f); fwd 2*(dqk+dv)*h*pairs = %.4g GFLOP, bwd 2.5x = %.4g GFLOP\n",
                (long long)pairs, dense > 0 ? 100.0 * pairs / dense : 0.0, dense,
                fwd_flops * 1e-9, 2.5 * fwd_flops * 1e-9);
  json.set("flops", Json::Object()
                        .set("visible_pairs", pairs)
                        .set("dense_pairs", dense)
                        .set("fwd_gflop", fwd_flops * 1e-9)
                        .set("bwd_gflop", settings.backward ? Json(2.5 * fwd_flops * 1e-9)
                                                            : Json()));
  json.set("time", Json());
  if (settings.iters > 0) {
    std::vector<double> fwd_ms, bwd_ms;
    auto forward = [&](std::string* e) { return runner.Forward(e); };
    auto backward = [&](std::string* e) { return runner.Backward(e); };
    if (!runner.Time(settings.iters, forward, &fwd_ms, &error) ||
        (settings.backward && !runner.Time(settings.iters, backward, &bwd_ms, &error)))
      return JsonOrFailure(settings, &json, error, true);
    auto tflops = [](double median, double flops) {
      return median > 0 ? flops / (median * 1e-3) * 1e-12 : 0.0;
    };
    auto report = [&](const char* name, const std::vector<double>& ms, double flops) {
      double median = Median(ms);
      if (!text) return;
      std::printf("time %s:   %.4g ms (median of %lld, %s), %.4g TFLOP/s\n", name, median,
                  (long long)ms.size(), runner.clock_name(), tflops(median, flops));
      if (settings.verbose) {
        std::printf("  %s calls (ms):", name);
        for (double t : ms) std::printf(" %.4g", t);
        std::printf("\n");
      }
    };
    report("fwd", fwd_ms, fwd_flops);
    if (settings.backward) report("bwd", bwd_ms, 2.5 * fwd_flops);
    Json time = Json::Object();
    time.set("clock", runner.clock_name()).set("iters", settings.iters);
    time.set("fwd_ms", Median(fwd_ms)).set("fwd_tflops", tflops(Median(fwd_ms), fwd_flops));
    time.set("bwd_ms", settings.backward ? Json(Median(bwd_ms)) : Json());
    time.set("bwd_tflops",
             settings.backward ? Json(tflops(Median(bwd_ms), 2.5 * fwd_flops)) : Json());
    json.set("time", std::move(time));
  }
  const char* result = !check ? "not checked" : passed ? "PASS" : "FAIL";
  if (settings.json) {
    json.set("result", result).set("error", Json());
    PrintJson(json);
  } else {
    std::printf("result:     %s\n", result);
  }
  return passed ? kExitOk : kExitFailure;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "%s", kCommandsHelp);
    return kExitUsage;
  }
  std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    PrintHelp(nullptr);
    return kExitOk;
  }
  if (command == "--version") return CmdVersion();
  if (command == "options") {
    if (argc > 2 && (std::strcmp(argv[2], "--help") == 0 || std::strcmp(argv[2], "-h") == 0)) {
      std::printf("usage: fusedattn options\n");
      return kExitOk;
    }
    if (argc > 2) return UsageError(command + " takes no options (got '" + argv[2] + "')");
    return CmdOptions();
  }
  if (command == "backends") {
    Settings settings;
    for (int i = 2; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::printf("usage: fusedattn backends [--json] [--quiet|-q] [--verbose|-v]\n");
        return kExitOk;
      }
      if (arg == "--json") settings.json = true;
      else if (arg == "--quiet" || arg == "-q") settings.quiet = true;
      else if (arg == "--verbose" || arg == "-v") settings.verbose = true;
      else
        return UsageError("backends takes --json, --quiet and --verbose only (got '" + arg +
                          "')");
    }
    return CmdBackends(settings);
  }
  if (command != "run" && command != "explain")
    return UsageError("unknown command '" + command +
                      "' (commands: run, explain, backends, options; see fusedattn --help)");

  Settings settings;
  std::string error;
  if (!ParseOptions(argc, argv, 2, &settings, &error)) return UsageError(error);
  if (settings.help) {
    PrintHelp(command.c_str());
    return kExitOk;
  }
  if (error = CheckCombination(settings); !error.empty()) return UsageError(error);
  return command == "run" ? CmdRun(settings) : CmdExplain(settings);
}

}  // namespace
}  // namespace fusedattn::cli

int main(int argc, char** argv) {
  try {
    return fusedattn::cli::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fusedattn: out of host memory (the problem's tensors do not fit)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusedattn: %s\n", e.what());
  }
  return fusedattn::cli::kExitFailure;
}
