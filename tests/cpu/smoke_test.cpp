// A first end-to-end check through the C API on the CPU: a small problem runs on the reference
// backend and its output is a convex combination of V rows (each O element within V's range).
#include <gtest/gtest.h>

#include "fusedattn/fusedattn.hpp"
#include "testing/tensors.h"

using namespace fusedattn::testing;

TEST(Smoke, VersionIsReported) { EXPECT_EQ(fusedattn_version(), FUSEDATTN_VERSION); }

TEST(Smoke, CpuForwardAndBackwardRunOnReference) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 5, c.max_seqlen_kv = 7;
  c.head_dim_qk = 8, c.head_dim_v = 8, c.is_training = 1, c.device = FUSEDATTN_DEVICE_CPU;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  ProblemTensors t = MakeProblemTensors(c, {});
  auto sel = fusedattn::GetBackend(c);
  EXPECT_EQ(sel.backend, FUSEDATTN_BACKEND_REFERENCE) << sel.diagnostic;
  fusedattn::Forward(c, t.fwd_args());
  for (int64_t i = 0; i < t.o.storage_elements(); ++i) {
    double x = t.o.get(i);
    EXPECT_TRUE(std::isfinite(x));
    EXPECT_LE(std::fabs(x), 1.0);
  }
  fusedattn::Backward(c, t.bwd_args());
  for (int64_t i = 0; i < t.dq.storage_elements(); ++i) EXPECT_TRUE(std::isfinite(t.dq.get(i)));
}
