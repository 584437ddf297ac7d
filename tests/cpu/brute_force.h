// An independent oracle for the reference backend, written from the specification in the top
// comment of include/fusedattn/fusedattn.h and nothing else: it materializes the full score matrix
// of every (sequence, head) in long double, applies the masks as the spec's text defines them, and
// computes O, LSE, max_logit and the analytic gradients dQ, dK, dV, dBias, dSink.
//
// It deliberately shares no code with src/backends/reference or src/problem: tensors are read by
// logical index through testing::HostTensor, sequence lengths come straight from the cu_seqlens /
// seq_offsets tensors, and the dropout keep rule is re-implemented from the spec's words (only
// the Philox4x32-10 block function itself is reused, and it has its own known-answer test).
#pragma once

#include <cstdint>
#include <vector>

#include "testing/tensors.h"

namespace fusedattn::brute_force {

using Real = long double;

// One sequence of a batch as the spec defines it.
struct Sequence {
  int64_t len_q = 0, len_kv = 0;      // the sequence's own lengths sq, sk
  int64_t start_q = 0, start_kv = 0;  // THD: first token of the sequence
};

// Logical index of element (b, position, h, x) of a q/k/v/o-like tensor in `format`, for
// HostTensor::at(); `start` is the sequence's first token in THD.
std::vector<int64_t> LogicalIndex(fusedattn_format format, int64_t b, int64_t position, int64_t h,
                                  int64_t x, int64_t start);

// Per-sequence lengths and THD starts, read from the config and the index tensors.
std::vector<Sequence> SequencesOf(const testing::ProblemTensors& t);

// The spec's visibility rule: may query i see key j in a sequence of lengths sq, sk?
bool Visible(const fusedattn_config& config, int64_t i, int64_t j, int64_t sq, int64_t sk);

// The spec's dropout rule: is element (b, h, i, j) kept? (Always true when dropout = 0.)
bool DropoutKeeps(const fusedattn_config& config, uint64_t seed, uint64_t offset, int64_t b,
                  int64_t h, int64_t i, int64_t j);

// Logical results in long double, indexed [b][h][i][x] (O, dQ), [b][hk][j][x] (dK, dV),
// [b][h][i] (LSE), [h] (max_logit, dSink), [bias_b][bias_h][i][j] (dBias). Rows a sequence does
// not have are zero in O and the gradients and -inf in LSE.
struct Attention {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_kv = 0;
  int64_t head_dim_qk = 0, head_dim_v = 0;
  std::vector<Sequence> sequences;
  std::vector<Real> o, lse, max_logit;
  std::vector<Real> dq, dk, dv, dbias, dsink;
};

// Computes the forward and, from t.d_o, the gradients of the loss sum(O * dO).
//
// The softmax backward needs D_i = sum_j p_ij dL/dp_ij, which equals dO_i . O_i. With
// `given_o` (the O handed to the backward, as the API passes it) D is computed as dO . O from
// that tensor, the way the reference and FlashAttention-style backwards do; then the gradients
// carry O's rounding, exactly like the backend under test. Without it, D comes from the exact
// probabilities.
Attention Compute(const testing::ProblemTensors& t, const testing::HostTensor* given_o = nullptr);

// What the spec says a call writes: copies of t's output tensors (as given, i.e. poisoned) with
// every element the call must write set to the oracle's value. Elements the spec leaves
// untouched (THD gaps, padded strides) keep their poison, so Compare() also checks that the call
// wrote exactly these elements.
struct ExpectedOutputs {
  testing::HostTensor o, lse, max_logit;
  testing::HostTensor dq, dk, dv, dbias, dsink;
};
ExpectedOutputs Expected(const testing::ProblemTensors& t, const Attention& a);

}  // namespace fusedattn::brute_force
