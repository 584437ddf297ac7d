// Small helpers shared by the CPU tests: running the C API with a message buffer, comparing an
// output with what the oracle expects, and checking that outputs still hold their poison.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "fusedattn/fusedattn.h"
#include "testing/tensors.h"

namespace fusedattn::test {

// A call's status and message.
struct Result {
  fusedattn_status status = FUSEDATTN_SUCCESS;
  std::string message;
  bool ok() const { return status == FUSEDATTN_SUCCESS; }
};

inline std::string StatusText(const Result& r) {
  return std::string(fusedattn_status_string(r.status)) + ": " + r.message;
}

// A small causal float32 training problem on the CPU (the selection tests' fake backends run it
// through the reference).
inline fusedattn_config SmallCpuTrainingConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.batch = 2, c.heads_q = 2, c.heads_kv = 2, c.max_seqlen_q = 8, c.max_seqlen_kv = 8;
  c.head_dim_qk = c.head_dim_v = 16;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  c.is_training = 1;
  return c;
}

inline Result Forward(const fusedattn_config& c, const fusedattn_fwd_args& args) {
  char msg[4096] = "";
  fusedattn_status s = fusedattn_fwd(&c, &args, nullptr, 0, nullptr, msg, sizeof msg);
  return {s, msg};
}

inline Result Backward(const fusedattn_config& c, const fusedattn_bwd_args& args) {
  char msg[4096] = "";
  fusedattn_status s = fusedattn_bwd(&c, &args, nullptr, 0, nullptr, msg, sizeof msg);
  return {s, msg};
}

inline Result GetBackend(const fusedattn_config& c, fusedattn_backend* backend) {
  char msg[4096] = "";
  fusedattn_status s = fusedattn_get_backend(&c, backend, msg, sizeof msg);
  return {s, msg};
}

// Every storage element of the tensor is still the poison MakeProblemTensors put there.
inline bool AllPoison(const testing::HostTensor& t) {
  for (int64_t i = 0; i < t.storage_elements(); ++i)
    if (!t.is_poison(i)) return false;
  return true;
}

// Byte-identical storage.
inline bool SameBytes(const testing::HostTensor& a, const testing::HostTensor& b) {
  return a.storage_bytes() == b.storage_bytes() &&
         (a.storage_bytes() == 0 || std::memcmp(a.data(), b.data(), a.storage_bytes()) == 0);
}

// out against expected: the same elements written, no NaN, ||out - ref|| / ||ref|| <= tolerance.
#define EXPECT_MATCHES(name, out, expected, tolerance, context)                           \
  do {                                                                                    \
    ::fusedattn::testing::Comparison cmp_ = ::fusedattn::testing::Compare(out, expected); \
    EXPECT_TRUE(cmp_.ok(tolerance)) << name << ": " << cmp_.describe() << " (tolerance "  \
                                    << (tolerance) << ") in " << (context);               \
  } while (0)

}  // namespace fusedattn::test
