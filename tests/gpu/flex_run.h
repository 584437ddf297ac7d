// Helpers of the score_mod GPU tests (flex_cudnn_test.cpp, flex_flash_test.cpp): one run of a config on a GPU backend compared with the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "gpu/device_memory.h"
#include "gpu/expect_close.h"
#include "testing/tensors.h"

namespace fusedattn::testing {

// A training problem on CUDA tensors, forced to `backend`.
inline fusedattn_config FlexConfig(fusedattn_backend backend, int64_t b, int64_t hq, int64_t hkv,
                                   int64_t sq, int64_t skv, int64_t d, fusedattn_dtype dtype) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = dtype;
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = backend;
  c.is_training = 1;
  return c;
}

// What one run produced, for tests that compare two cuDNN runs with each other.
struct Outputs {
  ProblemTensors fwd, bwd;  // O/LSE, and dQ/dK/dV
};

// Runs `config` (with its score_mod and the tensors `aux`) on config.backend (cuDNN or flash) and
// on the reference and compares O, LSE, dQ, dK, dV (dsink with a learnable sink; the tensors'
// gradients given in `aux_grads`, poisoned here). may_refuse: the backend's refusal in check() is
// a skip (with its message), for combinations whose support depends on the cuDNN version; the
// issue's examples never may. With config.is_training = 0 only the forward runs.
inline void RunAndCompare(fusedattn_config config, const std::vector<HostTensor>& aux,
                          TensorOptions options = {}, bool may_refuse = false,
                          Outputs* outputs = nullptr, std::vector<HostTensor> aux_grads = {}) {
  char msg[4096];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  fusedattn_status st = fusedattn_get_backend(&config, &chosen, msg, sizeof msg);
  if (st != FUSEDATTN_SUCCESS && may_refuse) GTEST_SKIP() << "the backend refuses: " << msg;
  ASSERT_EQ(st, FUSEDATTN_SUCCESS) << msg;
  ASSERT_EQ(chosen, config.backend) << msg;

  ProblemTensors host = MakeProblemTensors(config, options);
  ProblemTensors ref = host;
  fusedattn_config ref_config = config;
  ref_config.device = FUSEDATTN_DEVICE_CPU;
  ref_config.backend = FUSEDATTN_BACKEND_REFERENCE;
  std::vector<fusedattn_tensor> host_aux;
  for (const HostTensor& t : aux) host_aux.push_back(t.desc());

  fusedattn_fwd_args ref_fa = ref.fwd_args();
  ref_fa.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  ref_fa.score_mod_tensors = host_aux.data();
  ASSERT_EQ(fusedattn_fwd(&ref_config, &ref_fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << "reference forward: " << msg;

  size_t fwd_bytes = 0, bwd_bytes = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&config, &fwd_bytes, msg, sizeof msg), FUSEDATTN_SUCCESS)
      << msg;
  if (config.is_training)
    ASSERT_EQ(fusedattn_bwd_workspace_size(&config, &bwd_bytes, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
  DeviceBuffer workspace(std::max(fwd_bytes, bwd_bytes));
  ASSERT_TRUE(workspace.bytes == 0 || workspace.ptr != nullptr);

  std::vector<std::unique_ptr<DeviceCopy>> copies;
  std::vector<fusedattn_tensor> device_aux;
  for (const HostTensor& t : aux) {
    copies.push_back(std::make_unique<DeviceCopy>(t));
    ASSERT_NE(copies.back()->ptr, nullptr) << "cudaMalloc failed";
    device_aux.push_back(t.desc_at(copies.back()->ptr));
  }

  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  fusedattn_fwd_args fa = dev.fwd_args();
  fa.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  fa.score_mod_tensors = device_aux.data();
  ASSERT_EQ(fusedattn_fwd(&config, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ProblemTensors out = host;
  ASSERT_TRUE(dev.download_outputs(&out, &error)) << error;
  const double tol = Tolerance(config.qkv_dtype);
  ExpectClose("O", out.o, ref.o, tol);
  ExpectClose("LSE", out.lse, ref.lse, tol);
  if (!config.is_training) {  // inference: the forward is all there is
    if (outputs != nullptr) outputs->fwd = out;
    return;
  }

  // Both backwards start from the reference's O and LSE.
  ProblemTensors grads = host;
  grads.o = ref.o;
  grads.lse = ref.lse;
  ASSERT_TRUE(dev.upload_outputs(grads, &error)) << error;
  // The tensors' gradients (where given): poisoned, on the device and on the host.
  std::vector<HostTensor> ref_aux_grads = aux_grads;
  std::vector<std::unique_ptr<DeviceCopy>> grad_copies;
  std::vector<fusedattn_tensor> device_grads, host_grads;
  for (size_t k = 0; k < aux_grads.size(); ++k) {
    if (aux_grads[k].empty()) {
      device_grads.push_back(fusedattn_tensor{});
      host_grads.push_back(fusedattn_tensor{});
      grad_copies.push_back(nullptr);
      continue;
    }
    aux_grads[k].poison();
    ref_aux_grads[k].poison();
    grad_copies.push_back(std::make_unique<DeviceCopy>(aux_grads[k]));
    ASSERT_NE(grad_copies.back()->ptr, nullptr) << "cudaMalloc failed";
    device_grads.push_back(aux_grads[k].desc_at(grad_copies.back()->ptr));
    host_grads.push_back(ref_aux_grads[k].desc());
  }
  fusedattn_bwd_args ba = dev.bwd_args();
  ba.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  ba.score_mod_tensors = device_aux.data();
  if (!aux_grads.empty()) ba.d_score_mod_tensors = device_grads.data();
  ASSERT_EQ(fusedattn_bwd(&config, &ba, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ASSERT_TRUE(dev.download_outputs(&grads, &error)) << error;
  fusedattn_bwd_args ref_ba = ref.bwd_args();
  ref_ba.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  ref_ba.score_mod_tensors = host_aux.data();
  if (!aux_grads.empty()) ref_ba.d_score_mod_tensors = host_grads.data();
  ASSERT_EQ(fusedattn_bwd(&ref_config, &ref_ba, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << "reference backward: " << msg;
  ExpectClose("dQ", grads.dq, ref.dq, tol);
  ExpectClose("dK", grads.dk, ref.dk, tol);
  ExpectClose("dV", grads.dv, ref.dv, tol);
  ExpectClose("dSink", grads.dsink, ref.dsink, tol);
  for (size_t k = 0; k < aux_grads.size(); ++k) {
    if (aux_grads[k].empty()) continue;
    ASSERT_EQ(cudaMemcpy(aux_grads[k].data(), grad_copies[k]->ptr, aux_grads[k].storage_bytes(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    Comparison cmp = Compare(aux_grads[k], ref_aux_grads[k]);
    EXPECT_TRUE(cmp.ok(tol)) << "d score_mod tensor " << k << ": " << cmp.describe();
  }
  if (outputs != nullptr) {
    outputs->fwd = out;
    outputs->bwd = grads;
  }
}

inline HostTensor Uniform(fusedattn_dtype dtype, std::vector<int64_t> shape, uint64_t seed, double lo,
                   double hi) {
  HostTensor t(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  t.fill_uniform(rng, lo, hi);
  return t;
}

}  // namespace fusedattn::testing
