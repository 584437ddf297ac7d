// What the cuDNN GPU tests share: configs, the tensors' layouts they edit, and RunAndCompare,
// which runs one problem on cuDNN (selected, not forced, unless the config forces it) and on the
// reference and compares everything both write.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "fusedattn/fusedattn.h"
#include "gpu/device_memory.h"
#include "testing/tensors.h"

namespace fusedattn::testing {

inline fusedattn_config Config(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv,
                               int64_t d, fusedattn_dtype dtype = FUSEDATTN_DTYPE_BFLOAT16) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = dtype;
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_CUDNN;
  return c;
}

inline void SetFormats(fusedattn_config* c, fusedattn_format f) {
  c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format = f;
}

inline fusedattn_config ReferenceConfig(fusedattn_config c) {
  c.device = FUSEDATTN_DEVICE_CPU;
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  return c;
}

inline fusedattn_cache_stats CacheStats() {
  fusedattn_cache_stats s{};
  fusedattn_get_cache_stats(FUSEDATTN_BACKEND_CUDNN, &s);
  return s;
}

// The same tensor with each element's row padded by `extra` elements (strides change, values
// and poison stay): non-canonical strides for the stride-keyed plans.
inline HostTensor WithPaddedRows(const HostTensor& t, int64_t extra, bool is_output) {
  if (t.empty()) return t;
  const auto& shape = t.shape();
  const int n = static_cast<int>(shape.size());
  std::vector<int64_t> strides(n, 1);
  for (int i = n - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1] + (i == n - 2 ? extra : 0);
  int64_t storage = 1;
  for (int i = 0; i < n; ++i) storage += (shape[i] - 1) * strides[i];
  HostTensor out(t.dtype(), shape, strides, storage);
  out.poison();
  if (!is_output) {
    std::vector<int64_t> index(n, 0);
    for (int64_t e = 0; e < t.numel(); ++e) {
      out.set(out.offset_of(index), t.at(index));
      for (int d = n - 1; d >= 0; --d) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
  }
  return out;
}

inline void PadAllRows(ProblemTensors* t, int64_t extra) {
  t->q = WithPaddedRows(t->q, extra, false);
  t->k = WithPaddedRows(t->k, extra, false);
  t->v = WithPaddedRows(t->v, extra, false);
  t->d_o = WithPaddedRows(t->d_o, extra, false);
  t->o = WithPaddedRows(t->o, extra, true);
  t->dq = WithPaddedRows(t->dq, extra, true);
  t->dk = WithPaddedRows(t->dk, extra, true);
  t->dv = WithPaddedRows(t->dv, extra, true);
}

inline std::string Describe(const char* what, const Comparison& c) {
  return std::string(what) + ": " + c.describe();
}

// Runs one problem on cuDNN and on the reference and compares everything both write.
// Returns false (with gtest failures) when something differs.
struct RunOptions {
  bool backward = true;
  bool expect_no_new_plans = true;  // the calls reuse the plans check() built
  fusedattn_backend expect_backend = FUSEDATTN_BACKEND_CUDNN;  // the one selection picks
  std::function<void(ProblemTensors*)> edit;  // change tensors (layouts) before the runs
  size_t extra_workspace = 0;  // bytes beyond what the workspace-size calls ask for
};

inline void RunAndCompare(const fusedattn_config& c, TensorOptions options,
                          const RunOptions& run) {
  // A bias in qkv_dtype (the layout check() plans for); a float32 bias has its own test.
  if (c.bias_type != FUSEDATTN_BIAS_NONE) options.bias_dtype = c.qkv_dtype;
  fusedattn_config config = c;
  if (run.backward) config.is_training = 1;
  ProblemTensors host = MakeProblemTensors(config, options);
  if (run.edit) run.edit(&host);
  ProblemTensors ref = host;
  const fusedattn_config ref_config = ReferenceConfig(config);
  char msg[4096];

  fusedattn_fwd_args ref_fa = ref.fwd_args();
  ASSERT_EQ(fusedattn_fwd(&ref_config, &ref_fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << "reference forward: " << msg;

  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  ASSERT_EQ(fusedattn_get_backend(&config, &chosen, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  ASSERT_EQ(chosen, run.expect_backend) << msg;
  size_t fwd_bytes = 0, bwd_bytes = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&config, &fwd_bytes, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  if (run.backward)
    ASSERT_EQ(fusedattn_bwd_workspace_size(&config, &bwd_bytes, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
  DeviceBuffer workspace(std::max(fwd_bytes, bwd_bytes) + run.extra_workspace);
  ASSERT_TRUE(workspace.bytes == 0 || workspace.ptr != nullptr);

  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  const uint64_t misses_before = CacheStats().misses;
  fusedattn_fwd_args fa = dev.fwd_args();
  ASSERT_EQ(fusedattn_fwd(&config, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ProblemTensors out = host;
  ASSERT_TRUE(dev.download_outputs(&out, &error)) << error;
  const double tol = Tolerance(config.qkv_dtype);
  Comparison o = Compare(out.o, ref.o);
  EXPECT_TRUE(o.ok(tol)) << Describe("O", o);
  if (!ref.lse.empty()) {
    Comparison lse = Compare(out.lse, ref.lse);
    EXPECT_TRUE(lse.ok(tol)) << Describe("LSE", lse);
  }
  if (!run.backward) {
    if (run.expect_no_new_plans) EXPECT_EQ(CacheStats().misses, misses_before);
    return;
  }

  // Both backwards start from the reference's O and LSE.
  ProblemTensors grads = host;
  grads.o = ref.o;
  grads.lse = ref.lse;
  ASSERT_TRUE(dev.upload_outputs(grads, &error)) << error;
  fusedattn_bwd_args ba = dev.bwd_args();
  ASSERT_EQ(fusedattn_bwd(&config, &ba, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ASSERT_TRUE(dev.download_outputs(&grads, &error)) << error;
  fusedattn_bwd_args ref_ba = ref.bwd_args();
  ASSERT_EQ(fusedattn_bwd(&ref_config, &ref_ba, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << "reference backward: " << msg;
  const std::pair<const char*, std::pair<const HostTensor*, const HostTensor*>> outputs[] = {
      {"dQ", {&grads.dq, &ref.dq}},       {"dK", {&grads.dk, &ref.dk}},
      {"dV", {&grads.dv, &ref.dv}},       {"dBias", {&grads.dbias, &ref.dbias}},
      {"dSink", {&grads.dsink, &ref.dsink}}};
  for (const auto& [name, pair] : outputs) {
    if (pair.second->empty()) continue;
    Comparison cmp = Compare(*pair.first, *pair.second);
    EXPECT_TRUE(cmp.ok(tol)) << Describe(name, cmp);
  }
  if (run.expect_no_new_plans)
    EXPECT_EQ(CacheStats().misses, misses_before) << "a call built a plan check() did not";
}

// The forward of a training problem once, then its backward `runs->size()` times on the same
// inputs, each run's outputs downloaded into its own element of *runs: for tests of run-to-run
// determinism. Fails the calling test (check HasFatalFailure()) when a call fails.
inline void RunBackwardRepeatedly(const fusedattn_config& c, std::vector<ProblemTensors>* runs) {
  ProblemTensors host = MakeProblemTensors(c, {});
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  char msg[4096];
  size_t fb = 0, bb = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&c, &fb, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  ASSERT_EQ(fusedattn_bwd_workspace_size(&c, &bb, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  DeviceBuffer workspace(std::max(fb, bb));
  fusedattn_fwd_args fa = dev.fwd_args();
  ASSERT_EQ(fusedattn_fwd(&c, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  for (auto& r : *runs) {
    r = host;
    fusedattn_bwd_args ba = dev.bwd_args();
    ASSERT_EQ(fusedattn_bwd(&c, &ba, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
    ASSERT_TRUE(dev.download_outputs(&r, &error)) << error;
  }
}

}  // namespace fusedattn::testing
