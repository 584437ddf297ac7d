// Selection's run-time retry (select.h, RunForward / RunBackward) on the CPU, with fake backends
// in front of the reference: a backend that accepts a problem but cannot read the call's tensors
// answers NotSupported, and fusedattn_fwd / fusedattn_bwd give the call to the next backend,
// whose outputs are the reference's own; a forced backend is not replaced; other errors are not
// retried; a backend whose workspace the caller did not provide is skipped; and when nobody runs
// the tensors the error keeps every backend's reason.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "select/backend.h"
#include "select/select.h"
#include "fake_backend.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using test::FakeBackend;
using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;

bool BytesEqual(const HostTensor& a, const HostTensor& b) {
  return a.storage_bytes() == b.storage_bytes() &&
         std::memcmp(a.data(), b.data(), a.storage_bytes()) == 0;
}

bool AllPoisoned(const HostTensor& t) {
  for (int64_t e = 0; e < t.storage_elements(); ++e)
    if (!t.is_poison(e)) return false;
  return true;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class RuntimeRetry : public ::testing::Test {
 protected:
  void TearDown() override { ResetBackendsForTesting(); }
  // The outputs of the reference alone on fresh tensors of c.
  ProblemTensors ReferenceRun(const fusedattn_config& c) {
    ResetBackendsForTesting();
    ProblemTensors t = MakeProblemTensors(c, {});
    test::Result r = test::Forward(c, t.fwd_args());
    EXPECT_TRUE(r.ok()) << test::StatusText(r);
    r = test::Backward(c, t.bwd_args());
    EXPECT_TRUE(r.ok()) << test::StatusText(r);
    return t;
  }
};

TEST_F(RuntimeRetry, TensorsTheChosenBackendCannotReadRunOnTheNextOne) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  const ProblemTensors expected = ReferenceRun(c);

  FakeBackend fake(FUSEDATTN_BACKEND_CUDNN, "fake",
                   NotSupported("args.q.data = 0x3 is not 16-byte aligned, which fake needs"));
  SetBackendsForTesting({&fake, ReferenceBackend()});
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &chosen);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(chosen, FUSEDATTN_BACKEND_CUDNN) << "selection itself picks the fake: " << r.message;

  ProblemTensors t = MakeProblemTensors(c, {});  // same seed: the same inputs
  r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  r = test::Backward(c, t.bwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(fake.calls.load(), 2) << "the fake was asked first, both times";
  EXPECT_TRUE(BytesEqual(t.o, expected.o)) << "O is the reference's";
  EXPECT_TRUE(BytesEqual(t.lse, expected.lse));
  EXPECT_TRUE(BytesEqual(t.dq, expected.dq));
  EXPECT_TRUE(BytesEqual(t.dk, expected.dk));
  EXPECT_TRUE(BytesEqual(t.dv, expected.dv));

  // The alternatives are asked once per selection, not per call.
  const int checks = fake.checks.load();
  r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(fake.checks.load(), checks);
  EXPECT_EQ(fake.calls.load(), 3);
}

TEST_F(RuntimeRetry, AForcedBackendIsNotReplacedAndSaysWhoWouldRunIt) {
  fusedattn_config c = test::SmallCpuTrainingConfig();
  FakeBackend fake(FUSEDATTN_BACKEND_CUDNN, "fake",
                   NotSupported("args.k has head-dim stride 2: fake needs stride 1 there"));
  SetBackendsForTesting({&fake, ReferenceBackend()});
  c.backend = FUSEDATTN_BACKEND_CUDNN;
  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result r = test::Forward(c, t.fwd_args());
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_NOT_SUPPORTED) << r.message;
  EXPECT_TRUE(Contains(r.message, "forced backend fake")) << r.message;
  EXPECT_TRUE(Contains(r.message, "args.k has head-dim stride 2")) << r.message;
  EXPECT_TRUE(Contains(r.message, "reference")) << "names the backend auto would go on to: "
                                                 << r.message;
  EXPECT_TRUE(AllPoisoned(t.o)) << "nothing ran";
}

TEST_F(RuntimeRetry, WhenNoBackendRunsTheTensorsEveryReasonIsKept) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  FakeBackend first(FUSEDATTN_BACKEND_CUDNN, "first", NotSupported("args.q is misaligned"));
  FakeBackend second(FUSEDATTN_BACKEND_FLASH, "second", NotSupported("args.v has stride 3"));
  FakeBackend third(FUSEDATTN_BACKEND_SMALL_SEQ, "third", Status::Ok(), size_t{1} << 20);
  SetBackendsForTesting({&first, &second, &third});
  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result r = test::Backward(c, t.bwd_args());  // no workspace given
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_NOT_SUPPORTED) << r.message;
  EXPECT_TRUE(Contains(r.message, "first: args.q is misaligned")) << r.message;
  EXPECT_TRUE(Contains(r.message, "second: args.v has stride 3")) << r.message;
  EXPECT_TRUE(Contains(r.message, "third: needs 1048576 bytes of bwd workspace, 0 were given"))
      << r.message;
  EXPECT_EQ(third.calls.load(), 0) << "a backend is not run without its workspace";
  EXPECT_TRUE(AllPoisoned(t.dq));
}

TEST_F(RuntimeRetry, OtherErrorsAreNotRetried) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  FakeBackend failing(FUSEDATTN_BACKEND_CUDNN, "failing",
                      Status(FUSEDATTN_ERROR_CUDA, "an illegal memory access was encountered"));
  SetBackendsForTesting({&failing, ReferenceBackend()});
  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result r = test::Forward(c, t.fwd_args());
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_CUDA) << r.message;
  EXPECT_EQ(r.message, "an illegal memory access was encountered");
  EXPECT_TRUE(AllPoisoned(t.o)) << "the reference did not run after a real error";
}

TEST_F(RuntimeRetry, AnErrorOfTheBackendTriedNextNamesWhyItRan) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  FakeBackend refusing(FUSEDATTN_BACKEND_CUDNN, "refusing", NotSupported("args.o is misaligned"));
  FakeBackend failing(FUSEDATTN_BACKEND_FLASH, "failing",
                      Status(FUSEDATTN_ERROR_CUDA, "launch failed"));
  SetBackendsForTesting({&refusing, &failing, ReferenceBackend()});
  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result r = test::Forward(c, t.fwd_args());
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_CUDA) << r.message;
  EXPECT_TRUE(Contains(r.message, "failing: launch failed")) << r.message;
  EXPECT_TRUE(Contains(r.message, "refusing: args.o is misaligned")) << r.message;
}

}  // namespace
}  // namespace fusedattn
