// CUDA C++ from score-modifier programs: each node of a Program becomes one `const` local of its
// operands, in program order, with the numbers of graph.cpp's ApplyOp in float32 (a native GPU
// executor's code generator; src/backends/flash/jit.cpp builds its kernels' policy from this).
//
// The generated statements read the inputs and tensors through the names an executor gives, so
// the same emitter serves any kernel.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "flex/score_mod.h"

namespace fusedattn::flex {

struct CudaNames {
  // Expressions of the inputs (float): s, batch, head, q_idx, kv_idx, seqlen_q, seqlen_kv,
  // indexed by fusedattn_score_mod_variable.
  std::string inputs[kNumInputs];
  // The float expression that reads tensor `slot` (of the graph's declared dtype) at the point.
  std::function<std::string(int slot, fusedattn_dtype dtype)> tensor;
  std::string prefix = "v";  // locals are <prefix><node index>
  // The function that computes tanh (float -> float): tanhf, or a backend's faster one.
  std::string tanh_function = "tanhf";
  // Whether x / c for a constant c is emitted as x * (1 / c), where 1 / c rounded to float32 is a
  // normal number (within about an ulp of the division; one multiply instead of a division's
  // dozen instructions); other constants (0, inf, NaN, denormals, |c| > 2^126) keep the division.
  bool divide_by_reciprocal = false;
};

// Appends one line per node of `program` ("    const float v3 = (v1 * v2);"). Booleans are
// `bool`, numbers `float`; constants are exact float32 bit patterns of the graph's doubles.
void EmitCudaNodes(const Program& program, const std::vector<TensorDecl>& tensors,
                   const CudaNames& names, std::string* out);

// The local that holds node `id` (for outputs), e.g. "v7".
std::string CudaValue(const CudaNames& names, int32_t id);

// Device helpers the emitted code calls (FlexMin, FlexMax with ApplyOp's NaN rule); emit once
// per translation unit before the emitted code.
const char* CudaHelpers();

// Whether node `id` of `nodes` depends on the batch (batch, the sequence lengths or a tensor with
// a batch axis) or on the head (head or a tensor with a head axis): a block mask of a mask that
// reads neither is computed once and broadcast.
struct Dependence {
  bool batch = false, head = false;
};
Dependence DependenceOf(const std::vector<Node>& nodes, const std::vector<TensorDecl>& tensors,
                        int32_t id);

}  // namespace fusedattn::flex
