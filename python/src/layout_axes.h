// Where a layout keeps batch, sequence and heads in a 4-d q/k/v/o tensor, for the PyTorch
// operators (torch_ops.cpp) and the XLA FFI handlers (jax_ffi.cpp), which read the config's
// sizes off the tensors' shapes. Shipped beside them in the package's _csrc/ (they may be
// compiled on first use), so it includes nothing but the C API header.
#pragma once

#include "fusedattn/fusedattn.h"

namespace fusedattn_python {

// The axes of [batch, seq, heads] in a 4-d tensor of `format` (the head dim is axis 3; THD,
// [tokens, heads, head_dim], has no such axes: callers handle it before asking).
struct Axes {
  int b, s, h;
};
inline Axes AxesOf(fusedattn_format format) {
  switch (format) {
    case FUSEDATTN_FORMAT_SBHD: return {1, 0, 2};
    case FUSEDATTN_FORMAT_BHSD: return {0, 2, 1};
    default: return {0, 1, 2};
  }
}

}  // namespace fusedattn_python
