// Helpers of the paged K/V GPU tests (flash_decode_test.cpp, flash_paged_prefill_test.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "testing/tensors.h"

namespace fusedattn::testing {

// Index of (page, token, head, feature) in a pool of kv_format.
inline std::vector<int64_t> PoolIndex(fusedattn_format format, int64_t page, int64_t token,
                                      int64_t h, int64_t x) {
  switch (format) {
    case FUSEDATTN_FORMAT_BHSD: return {page, h, token, x};
    case FUSEDATTN_FORMAT_SBHD: return {token, page, h, x};
    default: return {page, token, h, x};
  }
}

// NaN in every pool element no sequence's keys are on (spare pages, the tail of last pages), so
// that a kernel reading one shows it in O.
inline void PoisonUnusedPoolRows(ProblemTensors* t) {
  const fusedattn_config& c = t->config;
  const int64_t ps = c.page_size, width = t->page_table.shape()[1];
  std::vector<char> used(static_cast<size_t>(t->num_pages * ps), 0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < t->len_kv[b]; ++j) {
      const int64_t page = static_cast<int64_t>(t->page_table.get(b * width + j / ps));
      used[static_cast<size_t>(page * ps + j % ps)] = 1;
    }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (HostTensor* pool : {&t->k, &t->v})
    for (int64_t page = 0; page < t->num_pages; ++page)
      for (int64_t token = 0; token < ps; ++token) {
        if (used[static_cast<size_t>(page * ps + token)]) continue;
        for (int64_t h = 0; h < c.heads_kv; ++h)
          for (int64_t x = 0; x < pool->shape()[3]; ++x)
            pool->set(pool->offset_of(PoolIndex(c.kv_format, page, token, h, x)), nan);
      }
}

}  // namespace fusedattn::testing
