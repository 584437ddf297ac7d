// Skips a GPU test, saying why, when there is no CUDA device or a backend cannot run here.
#pragma once

#include <gtest/gtest.h>

#include "fusedattn/fusedattn.h"
#include "testing/tensors.h"

#define SKIP_UNLESS_BACKEND_RUNS(backend)                                                  \
  do {                                                                                     \
    if (!::fusedattn::testing::CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";    \
    char reason_[512];                                                                     \
    if (!fusedattn_backend_available(backend, reason_, sizeof reason_))                    \
      GTEST_SKIP() << #backend " unavailable: " << reason_;                                \
  } while (0)
