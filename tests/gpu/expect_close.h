// The comparison every GPU-against-reference test makes of one output.
#pragma once

#include <gtest/gtest.h>

#include "testing/tensors.h"

namespace fusedattn::testing {

// Expects `out` to match the reference's `expected` within `tol` (the dtype's tolerance from
// shared/DESIGN.md); checks nothing when the reference has no such output (an empty tensor).
inline void ExpectClose(const char* what, const HostTensor& out, const HostTensor& expected,
                        double tol) {
  if (expected.empty()) return;
  Comparison cmp = Compare(out, expected);
  EXPECT_TRUE(cmp.ok(tol)) << what << ": " << cmp.describe();
}

}  // namespace fusedattn::testing
