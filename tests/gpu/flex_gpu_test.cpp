// Score modifiers with CUDA tensors: selection picks cuDNN (flex_cudnn_test.cpp checks what it
// computes), flash accepts them (flex_flash_test.cpp), small_seq refuses them, and the reference, when forced, reads the
// graph's tensors from device memory and writes their gradients back, bit for bit what it
// computes on host tensors. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/score_mod.hpp"
#include "gpu/device_memory.h"
#include "testing/tensors.h"

#ifdef FUSEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusedattn {
namespace {

using testing::CudaDeviceAvailable;
using testing::DeviceCopy;
using testing::DeviceProblem;
using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;

fusedattn_config Base() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 7, c.max_seqlen_kv = 9;
  c.head_dim_qk = 16, c.head_dim_v = 8;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.is_training = 1;
  return c;
}

TEST(FlexOnCuda, SelectionPicksCudnnFlashAcceptsAndSmallSeqRefusesScoreMods) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  ScoreMod mod;
  mod.set_score(30.0 * tanh(mod.score() / 30.0)).finalize();
  fusedattn_config c = Base();
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.score_mod = mod.get();
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  char msg[8192];
  char reason[512];
  if (fusedattn_backend_available(FUSEDATTN_BACKEND_CUDNN, reason, sizeof reason)) {
    // Head dims 16 and 8 are multiples of 8: cuDNN takes this problem (flex_cudnn_test.cpp
    // compares what it computes with the reference).
    ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
    EXPECT_EQ(backend, FUSEDATTN_BACKEND_CUDNN) << msg;
  } else {
    ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg),
              FUSEDATTN_ERROR_NOT_SUPPORTED)
        << msg;
    EXPECT_NE(std::string(msg).find("reference: not chosen automatically"), std::string::npos)
        << msg;
  }
  // Forced, flash compiles the graph into its kernels (flex_flash_test.cpp checks what it
  // computes); small_seq still gives its reason.
  if (fusedattn_backend_available(FUSEDATTN_BACKEND_FLASH, reason, sizeof reason)) {
    fusedattn_config forced = c;
    forced.backend = FUSEDATTN_BACKEND_FLASH;
    EXPECT_EQ(fusedattn_get_backend(&forced, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS)
        << msg;
  }
  for (fusedattn_backend id : {FUSEDATTN_BACKEND_SMALL_SEQ}) {
    if (!fusedattn_backend_available(id, reason, sizeof reason)) continue;
    fusedattn_config forced = c;
    forced.backend = id;
    ASSERT_EQ(fusedattn_get_backend(&forced, &backend, msg, sizeof msg),
              FUSEDATTN_ERROR_NOT_SUPPORTED)
        << msg;
    EXPECT_NE(std::string(msg).find("small_seq has no score modifier hook"),
              std::string::npos)
        << msg;
  }
}

TEST(FlexOnCuda, ForcedReferenceReadsTensorsFromDeviceMemoryBitForBit) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
#ifdef FUSEDATTN_WITH_CUDA
  ScoreMod mod;
  Expr bias = mod.tensor("bias", FUSEDATTN_DTYPE_FLOAT32,
                         FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_Q |
                             FUSEDATTN_SCORE_MOD_AXIS_KV,
                         true);
  Expr doc = mod.tensor("doc", FUSEDATTN_DTYPE_INT32,
                        FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
  mod.set_score(2.0 * tanh(mod.score() / 2.0) + bias);
  mod.set_mask(mod.q_idx_br() >= mod.kv_idx() && ne(doc, 3.0));
  mod.finalize();

  fusedattn_config host_config = Base();
  host_config.device = FUSEDATTN_DEVICE_CPU;
  host_config.score_mod = mod.get();
  fusedattn_config cuda_config = host_config;
  cuda_config.device = FUSEDATTN_DEVICE_CUDA;
  cuda_config.backend = FUSEDATTN_BACKEND_REFERENCE;

  ProblemTensors host = MakeProblemTensors(host_config, {});
  ProblemTensors on_cuda = host;
  std::mt19937_64 rng(3);
  HostTensor bias_data(FUSEDATTN_DTYPE_FLOAT32, {4, 7, 9}), doc_data(FUSEDATTN_DTYPE_INT32, {2, 9});
  bias_data.fill_uniform(rng, -1.0, 1.0);
  for (int64_t n = 0; n < 18; ++n) doc_data.set(n, static_cast<double>(n % 5));
  HostTensor dbias_host(FUSEDATTN_DTYPE_FLOAT32, {4, 7, 9});
  dbias_host.poison();
  HostTensor dbias_cuda = dbias_host;

  // Host run.
  char msg[2048];
  std::vector<fusedattn_tensor> tensors = {bias_data.desc(), doc_data.desc()};
  std::vector<fusedattn_tensor> grads = {dbias_host.desc(), fusedattn_tensor{}};
  fusedattn_fwd_args fa = host.fwd_args();
  fa.num_score_mod_tensors = 2, fa.score_mod_tensors = tensors.data();
  ASSERT_EQ(fusedattn_fwd(&host_config, &fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  fusedattn_bwd_args ba = host.bwd_args();
  ba.num_score_mod_tensors = 2, ba.score_mod_tensors = tensors.data();
  ba.d_score_mod_tensors = grads.data();
  ASSERT_EQ(fusedattn_bwd(&host_config, &ba, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;

  // Device run: the same inputs in device memory.
  DeviceProblem device;
  std::string error;
  ASSERT_TRUE(device.upload(on_cuda, &error)) << error;
  DeviceCopy bias_device(bias_data), doc_device(doc_data), dbias_device(dbias_cuda);
  ASSERT_TRUE(bias_device.ptr && doc_device.ptr && dbias_device.ptr) << "cudaMalloc failed";
  std::vector<fusedattn_tensor> device_tensors = {bias_data.desc_at(bias_device.ptr),
                                                  doc_data.desc_at(doc_device.ptr)};
  std::vector<fusedattn_tensor> device_grads = {dbias_cuda.desc_at(dbias_device.ptr),
                                                fusedattn_tensor{}};
  fa = device.fwd_args();
  fa.num_score_mod_tensors = 2, fa.score_mod_tensors = device_tensors.data();
  ASSERT_EQ(fusedattn_fwd(&cuda_config, &fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ba = device.bwd_args();
  ba.num_score_mod_tensors = 2, ba.score_mod_tensors = device_tensors.data();
  ba.d_score_mod_tensors = device_grads.data();
  ASSERT_EQ(fusedattn_bwd(&cuda_config, &ba, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ASSERT_TRUE(device.download_outputs(&on_cuda, &error)) << error;
  ASSERT_EQ(cudaMemcpy(dbias_cuda.data(), dbias_device.ptr, dbias_cuda.storage_bytes(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);

  auto same = [](const HostTensor& a, const HostTensor& b) {
    return a.storage_bytes() == b.storage_bytes() &&
           std::memcmp(a.data(), b.data(), a.storage_bytes()) == 0;
  };
  EXPECT_TRUE(same(host.o, on_cuda.o)) << "O";
  EXPECT_TRUE(same(host.lse, on_cuda.lse)) << "LSE";
  EXPECT_TRUE(same(host.dq, on_cuda.dq)) << "dQ";
  EXPECT_TRUE(same(host.dk, on_cuda.dk)) << "dK";
  EXPECT_TRUE(same(host.dv, on_cuda.dv)) << "dV";
  EXPECT_TRUE(same(dbias_host, dbias_cuda)) << "d bias (the score_mod tensor's gradient)";
  EXPECT_FALSE(dbias_host.is_poison(0)) << "the gradient was not written";
#endif
}

}  // namespace
}  // namespace fusedattn
