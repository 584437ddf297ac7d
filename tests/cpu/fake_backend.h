// A fake backend for the selection tests (runtime_retry_test.cpp, deferred_selection_test.cpp).
#pragma once

#include <atomic>
#include <utility>

#include "select/backend.h"

namespace fusedattn::test {

// Accepts every problem; each call answers `answer` (NotSupported: "cannot read these tensors").
class FakeBackend final : public Backend {
 public:
  FakeBackend(fusedattn_backend id, const char* name, Status answer, size_t workspace = 0)
      : id_(id), name_(name), answer_(std::move(answer)), workspace_(workspace) {}
  fusedattn_backend id() const override { return id_; }
  const char* name() const override { return name_; }
  Status available() const override { return Status::Ok(); }
  Status check(const Problem&) override {
    ++checks;
    return Status::Ok();
  }
  Status fwd_workspace_size(const Problem&, size_t* bytes) override {
    *bytes = workspace_;
    return Status::Ok();
  }
  Status bwd_workspace_size(const Problem&, size_t* bytes) override {
    *bytes = workspace_;
    return Status::Ok();
  }
  Status forward(const Problem&, const FwdTensors&, void*, size_t, void*) override {
    ++calls;
    return answer_;
  }
  Status backward(const Problem&, const BwdTensors&, void*, size_t, void*) override {
    ++calls;
    return answer_;
  }
  std::atomic<int> checks{0}, calls{0};

 private:
  fusedattn_backend id_;
  const char* name_;
  Status answer_;
  size_t workspace_;
};

}  // namespace fusedattn::test
