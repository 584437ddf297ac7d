// Backend selection on a machine without a GPU: the reference is chosen, the diagnostics name
// every backend and its reason, forcing (config field or FUSEDATTN_BACKEND) works and says why a
// forced backend cannot run, and a warm selection is cheap.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

#include "common/cuda_util.h"
#include "select/select.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::MakeProblemTensors;
using testing::ProblemTensors;

fusedattn_config CpuConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 16, c.max_seqlen_kv = 16;
  c.head_dim_qk = 64, c.head_dim_v = 64;
  c.is_training = 1;
  return c;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Each test starts and ends with FUSEDATTN_BACKEND as the process had it, re-read, and an empty
// selection cache.
class Selection : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("FUSEDATTN_BACKEND")) saved_ = v;
    unsetenv("FUSEDATTN_BACKEND");
    Reload();
  }
  void TearDown() override {
    if (saved_)
      setenv("FUSEDATTN_BACKEND", saved_->c_str(), 1);
    else
      unsetenv("FUSEDATTN_BACKEND");
    Reload();
  }
  static void SetEnvironmentBackend(const char* name) {
    setenv("FUSEDATTN_BACKEND", name, 1);
    Reload();
  }
  static void Reload() {
    ReloadEnvironmentBackend();
    ClearSelectionCache();
  }
  std::optional<std::string> saved_;
};

TEST_F(Selection, CpuProblemRunsOnTheReference) {
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(CpuConfig(), &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
  EXPECT_EQ(r.message, "reference");
}

TEST_F(Selection, AutoDeviceWithoutAGpuMeansCpu) {
  if (HasCudaDevice()) GTEST_SKIP() << "a CUDA device is present: AUTO means CUDA here";
  fusedattn_config c = CpuConfig();
  c.device = FUSEDATTN_DEVICE_AUTO;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
}

TEST_F(Selection, ForcedReferenceIsReportedAsForced) {
  fusedattn_config c = CpuConfig();
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
  EXPECT_EQ(r.message, "reference (forced)");
}

// A GPU backend forced on CPU tensors cannot run: NOT_SUPPORTED, naming the backend and its
// reason (on this machine: not built, or no device), and the forward writes nothing.
class ForcedGpuBackend : public Selection,
                         public ::testing::WithParamInterface<fusedattn_backend> {};

TEST_P(ForcedGpuBackend, OnCpuTensorsIsNotSupportedNamingItAndItsReason) {
  const fusedattn_backend forced = GetParam();
  const std::string name = fusedattn_backend_name(forced);
  fusedattn_config c = CpuConfig();
  c.backend = forced;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &backend);
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_NOT_SUPPORTED) << test::StatusText(r);
  EXPECT_TRUE(Contains(r.message, "forced backend " + name)) << r.message;
  char why[512];
  if (!fusedattn_backend_available(forced, why, sizeof why))
    EXPECT_TRUE(Contains(r.message, why)) << r.message << "\ndoes not give the reason: " << why;

  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result fwd = test::Forward(c, t.fwd_args());
  EXPECT_EQ(fwd.status, FUSEDATTN_ERROR_NOT_SUPPORTED) << test::StatusText(fwd);
  EXPECT_TRUE(Contains(fwd.message, name)) << fwd.message;
  EXPECT_TRUE(test::AllPoison(t.o) && test::AllPoison(t.lse)) << "the forward wrote outputs";
}

INSTANTIATE_TEST_SUITE_P(Backends, ForcedGpuBackend,
                         ::testing::Values(FUSEDATTN_BACKEND_CUDNN, FUSEDATTN_BACKEND_FLASH,
                                           FUSEDATTN_BACKEND_SMALL_SEQ),
                         [](const auto& info) {
                           return std::string(fusedattn_backend_name(info.param));
                         });

TEST_F(Selection, EnvironmentVariableForcesABackend) {
  SetEnvironmentBackend("flash");
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(CpuConfig(), &backend);
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_NOT_SUPPORTED) << test::StatusText(r);
  EXPECT_TRUE(Contains(r.message, "forced backend flash")) << r.message;

  SetEnvironmentBackend("reference");
  r = test::GetBackend(CpuConfig(), &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
  EXPECT_EQ(r.message, "reference (forced)");
}

TEST_F(Selection, EnvironmentVariableAutoSelectsAsWithoutIt) {
  SetEnvironmentBackend("auto");
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(CpuConfig(), &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(r.message, "reference");
}

TEST_F(Selection, EnvironmentVariableWithAnUnknownNameIsRejectedNamingIt) {
  SetEnvironmentBackend("fastest");
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(CpuConfig(), &backend);
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_INVALID_ARGUMENT) << test::StatusText(r);
  EXPECT_TRUE(Contains(r.message, "FUSEDATTN_BACKEND")) << r.message;
  EXPECT_TRUE(Contains(r.message, "'fastest'")) << r.message;

  ProblemTensors t = MakeProblemTensors(CpuConfig(), {});
  test::Result fwd = test::Forward(CpuConfig(), t.fwd_args());
  EXPECT_EQ(fwd.status, FUSEDATTN_ERROR_INVALID_ARGUMENT) << test::StatusText(fwd);
  EXPECT_TRUE(test::AllPoison(t.o)) << "the forward wrote O";
}

TEST_F(Selection, ConfigBackendTakesPrecedenceOverTheEnvironment) {
  SetEnvironmentBackend("fastest");  // not even a valid name: the config's choice wins
  fusedattn_config c = CpuConfig();
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
}

// FUSEDATTN_BACKEND is read once per process: changing it later has no effect until reloaded.
TEST_F(Selection, EnvironmentVariableIsReadOnce) {
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  ASSERT_TRUE(test::GetBackend(CpuConfig(), &backend).ok());
  setenv("FUSEDATTN_BACKEND", "flash", 1);
  ClearSelectionCache();
  test::Result r = test::GetBackend(CpuConfig(), &backend);
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  ReloadEnvironmentBackend();
  r = test::GetBackend(CpuConfig(), &backend);
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_NOT_SUPPORTED) << test::StatusText(r);
}

// The cache is keyed by the whole problem, the forced backend included: a cached choice for one
// problem is never returned for another.
TEST_F(Selection, CachedChoiceIsNotReusedForAnotherForcedBackend) {
  fusedattn_config c = CpuConfig();
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  ASSERT_TRUE(test::GetBackend(c, &backend).ok());
  c.backend = FUSEDATTN_BACKEND_CUDNN;
  EXPECT_EQ(test::GetBackend(c, &backend).status, FUSEDATTN_ERROR_NOT_SUPPORTED);
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  EXPECT_TRUE(test::GetBackend(c, &backend).ok());
}

// With CUDA tensors on a machine without a GPU no backend runs the problem, and the message names
// every backend with its reason.
TEST_F(Selection, WhenNoBackendRunsTheProblemEveryBackendGivesItsReason) {
  if (HasCudaDevice()) GTEST_SKIP() << "a CUDA device is present";
  fusedattn_config c = CpuConfig();
  c.device = FUSEDATTN_DEVICE_CUDA;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &backend);
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_NOT_SUPPORTED) << test::StatusText(r);
  EXPECT_TRUE(Contains(r.message, "no backend runs this problem")) << r.message;
  for (const char* name : {"small_seq: ", "cudnn: ", "flash: ", "reference: "}) {
    EXPECT_TRUE(Contains(r.message, name)) << "no reason from " << name << " in " << r.message;
  }
  for (fusedattn_backend b :
       {FUSEDATTN_BACKEND_CUDNN, FUSEDATTN_BACKEND_FLASH, FUSEDATTN_BACKEND_SMALL_SEQ}) {
    char why[512];
    if (!fusedattn_backend_available(b, why, sizeof why))
      EXPECT_TRUE(Contains(r.message, std::string(fusedattn_backend_name(b)) + ": " + why))
          << r.message;
  }
  EXPECT_TRUE(Contains(r.message, "reference: CUDA tensors but no CUDA device")) << r.message;
}

// The same problem asked again hits the selection cache. The figure is printed for the report;
// the bound is generous so that it cannot flake on a loaded machine (the aim is well under 1 us).
TEST_F(Selection, WarmSelectionIsCheap) {
  const fusedattn_config c = CpuConfig();
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  char msg[256];
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  constexpr int kCalls = 100000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) fusedattn_get_backend(&c, &backend, msg, sizeof msg);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double per_call_us = seconds / kCalls * 1e6;
  std::printf("[ selection ] warm fusedattn_get_backend: %.3f us per call (%d calls)\n",
              per_call_us, kCalls);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
  EXPECT_LT(per_call_us, 5.0);
}

// ---------------------------------------------------------------------------------------------
// Backend names and availability.
// ---------------------------------------------------------------------------------------------
TEST(BackendNames, RoundTripThroughFromName) {
  for (int i = 0; i < FUSEDATTN_BACKEND_COUNT; ++i) {
    const auto id = static_cast<fusedattn_backend>(i);
    fusedattn_backend parsed = FUSEDATTN_BACKEND_AUTO;
    ASSERT_EQ(fusedattn_backend_from_name(fusedattn_backend_name(id), &parsed), FUSEDATTN_SUCCESS)
        << fusedattn_backend_name(id);
    EXPECT_EQ(parsed, id);
  }
}

TEST(BackendNames, UnknownOrMisspelledNamesAreRejected) {
  fusedattn_backend parsed = FUSEDATTN_BACKEND_FLASH;
  for (const char* name : {"", "Flash", "cuDNN", "smallseq", "reference "})
    EXPECT_EQ(fusedattn_backend_from_name(name, &parsed), FUSEDATTN_ERROR_INVALID_ARGUMENT)
        << "'" << name << "'";
  EXPECT_EQ(fusedattn_backend_from_name(nullptr, &parsed), FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fusedattn_backend_from_name("flash", nullptr), FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(parsed, FUSEDATTN_BACKEND_FLASH) << "a rejected name changed the output";
}

TEST(BackendAvailability, ReferenceIsAlwaysAvailable) {
  char msg[256];
  EXPECT_EQ(fusedattn_backend_available(FUSEDATTN_BACKEND_REFERENCE, msg, sizeof msg), 1) << msg;
}

TEST(BackendAvailability, GpuBackendsAreUnavailableWithoutAGpuAndSayWhy) {
  if (HasCudaDevice()) GTEST_SKIP() << "a CUDA device is present";
  for (fusedattn_backend b :
       {FUSEDATTN_BACKEND_CUDNN, FUSEDATTN_BACKEND_FLASH, FUSEDATTN_BACKEND_SMALL_SEQ}) {
    char msg[256] = "";
    EXPECT_EQ(fusedattn_backend_available(b, msg, sizeof msg), 0) << fusedattn_backend_name(b);
    EXPECT_GT(std::strlen(msg), 0u) << fusedattn_backend_name(b) << " gives no reason";
  }
}

TEST(BackendAvailability, UnknownBackendIsNotAvailableAndNamed) {
  char msg[256] = "";
  EXPECT_EQ(fusedattn_backend_available(static_cast<fusedattn_backend>(42), msg, sizeof msg), 0);
  EXPECT_TRUE(Contains(msg, "42")) << msg;
}

}  // namespace
}  // namespace fusedattn
