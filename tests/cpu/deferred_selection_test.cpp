// Deferred backends in automatic selection (backend.h check_or_defer, select.cpp "Deferred
// backends"), on the CPU with a fake backend in front of the reference: a backend that defers is
// passed over while its preparation runs, chosen once it is ready, never deferred when forced,
// waited for when nobody else runs the problem or the chosen one cannot read a call's tensors;
// and a call whose workspace was sized from the choice before still runs there.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "select/backend.h"
#include "select/select.h"
#include "fake_backend.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::MakeProblemTensors;
using testing::ProblemTensors;

// Defers every problem to `ready` until the test sets it; runs with the reference's results (it
// asks the reference), so that a test sees which backend ran by its counters.
class DeferringBackend final : public Backend {
 public:
  explicit DeferringBackend(size_t workspace = 0) : workspace_(workspace) {}
  fusedattn_backend id() const override { return FUSEDATTN_BACKEND_CUDNN; }
  const char* name() const override { return "deferring"; }
  Status available() const override { return Status::Ok(); }
  Status check(const Problem&) override {
    ++checks;
    return Status::Ok();
  }
  Status check_or_defer(const Problem& p,
                        std::shared_ptr<const std::atomic<bool>>* ready) override {
    ++deferred_checks;
    if (ready_->load()) return check(p);
    *ready = ready_;
    return NotSupported("preparing this problem in the background");
  }
  Status fwd_workspace_size(const Problem&, size_t* bytes) override {
    *bytes = workspace_;
    return Status::Ok();
  }
  Status bwd_workspace_size(const Problem&, size_t* bytes) override {
    *bytes = workspace_;
    return Status::Ok();
  }
  Status forward(const Problem& p, const FwdTensors& t, void* w, size_t b, void* s) override {
    ++calls;
    return ReferenceBackend()->forward(p, t, nullptr, 0, s);
  }
  Status backward(const Problem& p, const BwdTensors& t, void* w, size_t b, void* s) override {
    ++calls;
    return ReferenceBackend()->backward(p, t, nullptr, 0, s);
  }
  void make_ready() { ready_->store(true); }

  std::atomic<int> checks{0}, deferred_checks{0}, calls{0};

 private:
  std::shared_ptr<std::atomic<bool>> ready_ = std::make_shared<std::atomic<bool>>(false);
  size_t workspace_;
};

// Refuses every problem.
class RefusingBackend final : public Backend {
 public:
  fusedattn_backend id() const override { return FUSEDATTN_BACKEND_FLASH; }
  const char* name() const override { return "refusing"; }
  Status available() const override { return Status::Ok(); }
  Status check(const Problem&) override { return NotSupported("never runs anything"); }
  Status fwd_workspace_size(const Problem&, size_t*) override { return check(Problem()); }
  Status bwd_workspace_size(const Problem&, size_t*) override { return check(Problem()); }
  Status forward(const Problem&, const FwdTensors&, void*, size_t, void*) override {
    return check(Problem());
  }
  Status backward(const Problem&, const BwdTensors&, void*, size_t, void*) override {
    return check(Problem());
  }
};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

fusedattn_backend Chosen(const fusedattn_config& c, std::string* diagnostic = nullptr) {
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &chosen);
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  if (diagnostic) *diagnostic = r.message;
  return chosen;
}

size_t FwdWorkspace(const fusedattn_config& c) {
  size_t bytes = 0;
  char msg[1024] = "";
  EXPECT_EQ(fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  return bytes;
}

class DeferredSelection : public ::testing::Test {
 protected:
  void TearDown() override { ResetBackendsForTesting(); }
};

TEST_F(DeferredSelection, ADeferringBackendIsPassedOverUntilReadyThenChosen) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  DeferringBackend deferring;
  SetBackendsForTesting({&deferring, ReferenceBackend()});

  std::string diagnostic;
  EXPECT_EQ(Chosen(c, &diagnostic), FUSEDATTN_BACKEND_REFERENCE);
  EXPECT_TRUE(Contains(diagnostic, "deferring: preparing this problem in the background"))
      << diagnostic;
  EXPECT_TRUE(Contains(diagnostic, "(deferring is preparing the problem)")) << diagnostic;
  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(deferring.calls.load(), 0) << "the reference ran the call";
  EXPECT_EQ(deferring.checks.load(), 0) << "nobody waited for the preparation";

  // Not ready yet: the cached choice stands, the deferring backend is not asked again.
  const int asked = deferring.deferred_checks.load();
  EXPECT_EQ(Chosen(c), FUSEDATTN_BACKEND_REFERENCE);
  EXPECT_EQ(deferring.deferred_checks.load(), asked);

  deferring.make_ready();
  EXPECT_EQ(Chosen(c, &diagnostic), FUSEDATTN_BACKEND_CUDNN) << diagnostic;
  r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  r = test::Backward(c, t.bwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(deferring.calls.load(), 2) << "the forward and the backward ran on it";
}

TEST_F(DeferredSelection, AForcedBackendIsAskedCheckItselfAndNeverDefers) {
  fusedattn_config c = test::SmallCpuTrainingConfig();
  DeferringBackend deferring;
  SetBackendsForTesting({&deferring, ReferenceBackend()});
  c.backend = FUSEDATTN_BACKEND_CUDNN;
  EXPECT_EQ(Chosen(c), FUSEDATTN_BACKEND_CUDNN);
  EXPECT_EQ(deferring.deferred_checks.load(), 0);
  EXPECT_EQ(deferring.checks.load(), 1);
}

TEST_F(DeferredSelection, WhenNoOtherBackendRunsTheProblemSelectionWaitsForTheDeferredOne) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  DeferringBackend deferring;
  RefusingBackend refusing;
  SetBackendsForTesting({&deferring, &refusing});
  std::string diagnostic;
  EXPECT_EQ(Chosen(c, &diagnostic), FUSEDATTN_BACKEND_CUDNN);
  EXPECT_EQ(deferring.checks.load(), 1) << "its blocking check() was asked";
  EXPECT_TRUE(Contains(diagnostic, "refusing: never runs anything")) << diagnostic;
  EXPECT_FALSE(Contains(diagnostic, "deferring: preparing")) << "it was chosen: " << diagnostic;
}

TEST_F(DeferredSelection, TensorsTheChosenBackendCannotReadGoToTheDeferredBackendFirst) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  DeferringBackend deferring;
  test::FakeBackend unreadable(FUSEDATTN_BACKEND_FLASH, "unreadable",
                               NotSupported("args.q is not 16-byte aligned"));
  SetBackendsForTesting({&deferring, &unreadable, ReferenceBackend()});
  EXPECT_EQ(Chosen(c), FUSEDATTN_BACKEND_FLASH) << "the deferring backend is preparing";
  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(unreadable.calls.load(), 1);
  EXPECT_EQ(deferring.checks.load(), 1) << "waited for: its blocking check() was asked";
  EXPECT_EQ(deferring.calls.load(), 1) << "it ran the call, ahead of the reference";
}

TEST_F(DeferredSelection, ACallWithTheWorkspaceOfTheChoiceBeforeRunsOnThatChoice) {
  const fusedattn_config c = test::SmallCpuTrainingConfig();
  DeferringBackend deferring(/*workspace=*/size_t{1} << 20);
  SetBackendsForTesting({&deferring, ReferenceBackend()});
  EXPECT_EQ(FwdWorkspace(c), 0u) << "the reference needs none";

  // Ready between the caller's workspace query and its call: the call, given no workspace,
  // runs on the reference instead of failing for the deferring backend's megabyte.
  deferring.make_ready();
  ProblemTensors t = MakeProblemTensors(c, {});
  test::Result r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(deferring.calls.load(), 0);

  // The next query sizes for the new choice, and a call with that workspace runs on it.
  const size_t bytes = FwdWorkspace(c);
  EXPECT_EQ(bytes, size_t{1} << 20);
  std::vector<char> workspace(bytes);
  char msg[4096] = "";
  const fusedattn_fwd_args args = t.fwd_args();
  ASSERT_EQ(fusedattn_fwd(&c, &args, workspace.data(), workspace.size(), nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  EXPECT_EQ(deferring.calls.load(), 1);
}

}  // namespace
}  // namespace fusedattn
