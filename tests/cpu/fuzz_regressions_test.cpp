// Regressions found by the fuzzer (tests/fuzz): each test pins the fixed behaviour.
#include <gtest/gtest.h>

#include <cstring>

#include "fusedattn/fusedattn.h"
#include "testing/tensors.h"

using namespace fusedattn::testing;

namespace {

fusedattn_config SmallCpuConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 2, c.heads_kv = 1, c.max_seqlen_q = 5, c.max_seqlen_kv = 7;
  c.head_dim_qk = c.head_dim_v = 4;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  return c;
}

fusedattn_status Forward(const fusedattn_config& c, ProblemTensors* t, std::string* message) {
  fusedattn_fwd_args args = t->fwd_args();
  char msg[1024];
  fusedattn_status st = fusedattn_fwd(&c, &args, nullptr, 0, nullptr, msg, sizeof msg);
  *message = msg;
  return st;
}

}  // namespace

// window_left/right = INT64_MAX overflowed the diagonal + window arithmetic; a window at least as
// wide as both sequences hides nothing and now behaves exactly as unbounded (-1).
TEST(FuzzRegressions, HugeWindowBehavesAsUnbounded) {
  fusedattn_config unbounded = SmallCpuConfig();
  fusedattn_config huge = unbounded;
  huge.window_left = INT64_MAX;
  huge.window_right = INT64_MAX;
  ProblemTensors expected = MakeProblemTensors(unbounded, {});
  ProblemTensors actual = expected;
  std::string msg;
  ASSERT_EQ(Forward(unbounded, &expected, &msg), FUSEDATTN_SUCCESS) << msg;
  ASSERT_EQ(Forward(huge, &actual, &msg), FUSEDATTN_SUCCESS) << msg;
  Comparison c = Compare(actual.o, expected.o);
  EXPECT_TRUE(c.ok(0.0)) << c.describe();
}

// Only windows of at least max_seqlen_q + max_seqlen_kv become unbounded: a narrow one still
// hides keys.
TEST(FuzzRegressions, WindowBelowTheBoundStillHidesKeys) {
  fusedattn_config unbounded = SmallCpuConfig();
  fusedattn_config narrow = unbounded;
  narrow.window_left = 1;
  narrow.window_right = 0;
  ProblemTensors expected = MakeProblemTensors(unbounded, {});
  ProblemTensors actual = expected;
  std::string msg;
  ASSERT_EQ(Forward(unbounded, &expected, &msg), FUSEDATTN_SUCCESS) << msg;
  ASSERT_EQ(Forward(narrow, &actual, &msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_GT(Compare(actual.o, expected.o).rel_error, 1e-3);
}

// C callers may store any int in an enum field. The enums have a fixed int32_t underlying type in
// C++, so such a value is well defined there, and validation refuses it naming the field.
TEST(FuzzRegressions, OutOfRangeEnumValuesAreRefusedByName) {
  struct Case {
    const char* field;
    void (*set)(fusedattn_config*, int32_t);
  };
  const Case cases[] = {
      {"config.qkv_dtype", [](fusedattn_config* c, int32_t v) { std::memcpy(&c->qkv_dtype, &v, 4); }},
      {"config.q_format", [](fusedattn_config* c, int32_t v) { std::memcpy(&c->q_format, &v, 4); }},
      {"config.mask", [](fusedattn_config* c, int32_t v) { std::memcpy(&c->mask, &v, 4); }},
      {"config.bias_type", [](fusedattn_config* c, int32_t v) { std::memcpy(&c->bias_type, &v, 4); }},
      {"config.softmax_type",
       [](fusedattn_config* c, int32_t v) { std::memcpy(&c->softmax_type, &v, 4); }},
      {"config.backend", [](fusedattn_config* c, int32_t v) { std::memcpy(&c->backend, &v, 4); }},
      {"config.device", [](fusedattn_config* c, int32_t v) { std::memcpy(&c->device, &v, 4); }},
  };
  for (const Case& test : cases) {
    for (int32_t value : {-1, 1000, INT32_MIN, INT32_MAX}) {
      fusedattn_config c = SmallCpuConfig();
      test.set(&c, value);
      fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
      char msg[1024];
      EXPECT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg),
                FUSEDATTN_ERROR_INVALID_ARGUMENT)
          << test.field << " = " << value;
      EXPECT_NE(std::strstr(msg, test.field), nullptr) << test.field << " = " << value << ": " << msg;
    }
  }
}
