// The reference backend on CUDA tensors (forced: it copies them to the host, computes, and copies
// the outputs back) gives bit for bit what it gives on host tensors (paged K/V too, its page
// table read from device memory), writes nothing when the sequence lengths or page indices in
// device memory are invalid, and is never chosen automatically for CUDA tensors. Skips without a
// CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::CudaDeviceAvailable;
using testing::DeviceProblem;
using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

bool SameBytes(const HostTensor& a, const HostTensor& b) {
  return a.storage_bytes() == b.storage_bytes() &&
         (a.storage_bytes() == 0 || std::memcmp(a.data(), b.data(), a.storage_bytes()) == 0);
}

struct CudaCase {
  std::string name;
  fusedattn_config config;
  TensorOptions options;
};

fusedattn_config Base() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 3, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 7, c.max_seqlen_kv = 9;
  c.head_dim_qk = 16, c.head_dim_v = 8;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.is_training = 1, c.return_max_logit = 1;
  return c;
}

std::vector<CudaCase> Cases() {
  std::vector<CudaCase> cases;
  {
    CudaCase k{"PaddingCausalBiasSinkDropout", Base(), {}};
    k.config.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    k.config.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    k.config.bias_batch = 1, k.config.bias_heads = 4, k.config.bias_requires_grad = 1;
    k.config.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    k.config.dropout = 0.2;
    k.options.padded_strides = true;
    cases.push_back(k);
  }
  {
    CudaCase k{"ThdGapsPackedLseAlibiSoftcap", Base(), {}};
    auto& c = k.config;
    c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    c.softcap = 1.5;
    c.window_left = 3;
    k.options.thd_gaps = true, k.options.lse_packed = true;
    cases.push_back(k);
  }
  {
    // Chunked prefill against a paged cache (forward only): THD queries, BHSD pages of 4 in a
    // shuffled pool with a shared prefix.
    CudaCase k{"PagedThdChunksBhsdPagesSharedPrefix", Base(), {}};
    auto& c = k.config;
    c.q_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
    c.kv_format = FUSEDATTN_FORMAT_BHSD;
    c.page_size = 4;
    c.is_training = 0, c.return_lse = 1;
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    k.options.share_prefix = true, k.options.thd_gaps = true;
    cases.push_back(k);
  }
  return cases;
}

class ReferenceOnCuda : public ::testing::TestWithParam<CudaCase> {};

TEST_P(ReferenceOnCuda, MatchesTheHostRunBitForBit) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  fusedattn_config host_config = GetParam().config;
  host_config.device = FUSEDATTN_DEVICE_CPU;
  fusedattn_config cuda_config = GetParam().config;
  cuda_config.device = FUSEDATTN_DEVICE_CUDA;
  cuda_config.backend = FUSEDATTN_BACKEND_REFERENCE;

  ProblemTensors host = MakeProblemTensors(host_config, GetParam().options);
  ProblemTensors on_cuda = host;  // same inputs, same poisoned outputs
  char msg[2048];
  fusedattn_fwd_args fa = host.fwd_args();
  ASSERT_EQ(fusedattn_fwd(&host_config, &fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  const bool backward = host_config.is_training != 0;
  fusedattn_bwd_args ba = host.bwd_args();
  if (backward)
    ASSERT_EQ(fusedattn_bwd(&host_config, &ba, nullptr, 0, nullptr, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;

  DeviceProblem device;
  std::string error;
  ASSERT_TRUE(device.upload(on_cuda, &error)) << error;
  fa = device.fwd_args();
  ASSERT_EQ(fusedattn_fwd(&cuda_config, &fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  // The backward reads O and LSE from the device buffers the forward wrote.
  ba = device.bwd_args();
  if (backward)
    ASSERT_EQ(fusedattn_bwd(&cuda_config, &ba, nullptr, 0, nullptr, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
  ASSERT_TRUE(device.download_outputs(&on_cuda, &error)) << error;

  EXPECT_TRUE(SameBytes(host.o, on_cuda.o)) << "O";
  EXPECT_TRUE(SameBytes(host.lse, on_cuda.lse)) << "LSE";
  EXPECT_TRUE(SameBytes(host.max_logit, on_cuda.max_logit)) << "max_logit";
  EXPECT_TRUE(SameBytes(host.dq, on_cuda.dq)) << "dQ";
  EXPECT_TRUE(SameBytes(host.dk, on_cuda.dk)) << "dK";
  EXPECT_TRUE(SameBytes(host.dv, on_cuda.dv)) << "dV";
  EXPECT_TRUE(SameBytes(host.dbias, on_cuda.dbias)) << "dBias";
  EXPECT_TRUE(SameBytes(host.dsink, on_cuda.dsink)) << "dSink";
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceOnCuda, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

bool AllPoison(const HostTensor& t) {
  for (int64_t i = 0; i < t.storage_elements(); ++i)
    if (!t.is_poison(i)) return false;
  return true;
}

// cu_seqlens in device memory are read on the host by the reference; bad contents are rejected
// naming the array and index, and the device outputs keep their poison.
TEST(ReferenceOnCudaValidation, BadSequenceLengthsInDeviceMemoryWriteNothing) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  fusedattn_config c = Base();
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  c.mask = FUSEDATTN_MASK_PADDING;
  TensorOptions o;
  o.len_q = {7, 2, 3}, o.len_kv = {9, 4, 1};
  ProblemTensors t = MakeProblemTensors(c, o);
  t.cu_seqlens_kv.set(2, 30);  // sequence 1: 30 - 9 = 21 keys > max_seqlen_kv = 9
  DeviceProblem device;
  std::string error;
  ASSERT_TRUE(device.upload(t, &error)) << error;
  char msg[2048];
  fusedattn_fwd_args fa = device.fwd_args();
  EXPECT_EQ(fusedattn_fwd(&c, &fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT)
      << msg;
  EXPECT_NE(std::string(msg).find("cu_seqlens_kv[1..2]"), std::string::npos) << msg;
  ProblemTensors after = t;
  ASSERT_TRUE(device.download_outputs(&after, &error)) << error;
  EXPECT_TRUE(AllPoison(after.o)) << "O was written";
  EXPECT_TRUE(AllPoison(after.lse)) << "LSE was written";
  EXPECT_TRUE(AllPoison(after.max_logit)) << "max_logit was written";
}

// A page index outside the pool, in device memory: the reference copies the entries it uses to
// the host, refuses the bad one by name, and the device outputs keep their poison.
TEST(ReferenceOnCudaValidation, ABadPageIndexInDeviceMemoryWritesNothing) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  fusedattn_config c = Base();
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  c.is_training = 0, c.return_lse = 1;
  c.page_size = 2;
  TensorOptions o;
  o.len_kv = {9, 4, 1};
  ProblemTensors t = MakeProblemTensors(c, o);
  const int64_t width = t.page_table.shape()[1];
  t.page_table.set(1 * width + 1, static_cast<double>(t.num_pages));  // sequence 1, 2nd page
  DeviceProblem device;
  std::string error;
  ASSERT_TRUE(device.upload(t, &error)) << error;
  char msg[2048];
  fusedattn_fwd_args fa = device.fwd_args();
  EXPECT_EQ(fusedattn_fwd(&c, &fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT)
      << msg;
  EXPECT_NE(std::string(msg).find("page_table[1, 1]"), std::string::npos) << msg;
  ProblemTensors after = t;
  ASSERT_TRUE(device.download_outputs(&after, &error)) << error;
  EXPECT_TRUE(AllPoison(after.o)) << "O was written";
  EXPECT_TRUE(AllPoison(after.lse)) << "LSE was written";
  EXPECT_TRUE(AllPoison(after.max_logit)) << "max_logit was written";
}

// Paged K/V on CUDA tensors that no GPU backend runs (head dim 512: flash's paged kernels take
// head dims up to 256, small ones they pad; return_max_logit (Base): cuDNN's paged SDPA returns no
// max logit): selection finds none and says why for each, every reason naming paged K/V (the
// reference runs it only when forced).
TEST(ReferenceOnCudaSelection, PagedKvNamesEveryGpuBackendsReason) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  fusedattn_config c = Base();
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.is_training = 0;
  c.max_seqlen_q = 1;
  c.head_dim_qk = c.head_dim_v = 512;
  c.page_size = 16;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  char msg[4096];
  fusedattn_status s = fusedattn_get_backend(&c, &backend, msg, sizeof msg);
  ASSERT_EQ(s, FUSEDATTN_ERROR_NOT_SUPPORTED) << msg;
  for (const char* reason :
       {"small_seq: paged K/V (page_size = 16)", "cudnn: paged K/V (page_size = 16)",
        "flash: ", "reference: not chosen automatically"})
    EXPECT_NE(std::string(msg).find(reason), std::string::npos) << reason << " in " << msg;
}

// The reference computes on the host: selection never picks it for CUDA tensors by itself.
TEST(ReferenceOnCudaSelection, IsNotChosenAutomatically) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  fusedattn_config c = Base();
  c.device = FUSEDATTN_DEVICE_CUDA;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  char msg[4096];
  fusedattn_status s = fusedattn_get_backend(&c, &backend, msg, sizeof msg);
  if (s == FUSEDATTN_SUCCESS) {
    EXPECT_NE(backend, FUSEDATTN_BACKEND_REFERENCE) << msg;
  } else {
    EXPECT_EQ(s, FUSEDATTN_ERROR_NOT_SUPPORTED) << msg;
    EXPECT_NE(std::string(msg).find("reference: not chosen automatically"), std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace fusedattn
