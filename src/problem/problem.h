// The normalized problem: a validated config with its masks turned into flags and ranges, and
// tensors turned into logical [batch, head, seq, dim] views. Backends read only these.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/band.h"
#include "common/philox.h"
#include "common/status.h"
#include "fusedattn/fusedattn.h"

namespace fusedattn {

namespace flex {
class ScoreMod;  // a finalized score-modifier graph (flex/score_mod.h)
}

// Resolved where the tensors live (never AUTO).
enum class Device { kCpu, kCuda };

// A tensor seen through logical axes. Element (b, h, i, x) — sequence b, head h, position i inside
// the sequence, feature x — lives at
//   data + b * stride_b + (token_start[b] + i) * stride_s + h * stride_h + x * stride_d
// token_start is 0 for BSHD/SBHD/BHSD, and seq_offsets[b] (or cu_seqlens[b]) for THD, where
// stride_b is 0. Strides are in elements of dtype.
struct TensorView {
  void* data = nullptr;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0, stride_d = 0;
  int64_t num_tokens = 0;  // THD: the packed token dimension's size; else batch * seq
  bool present() const { return data != nullptr; }
};

// Paged K/V (Problem::paged): the k and v views address one page as TensorView addresses one
// sequence: stride_b steps from page to page and stride_s from token to token inside a page, so
// key j of sequence b is element (page_table[b][j / page_size], h, j % page_size, x), and
// num_tokens is num_pages * page_size.

// LSE views also come in a packed [tokens, heads] form for THD: then stride_b is 0 and token_start
// applies, exactly as for TensorView (stride_d unused).
using LseView = TensorView;

// Bias [bias_batch, bias_heads, max_seqlen_q, max_seqlen_kv]: broadcast axes have stride 0 here.
struct BiasView {
  void* data = nullptr;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_kv = 0;
  bool present() const { return data != nullptr; }
};

struct Problem {
  fusedattn_config config{};  // the caller's config, with attn_scale resolved
  Device device = Device::kCpu;
  // config.score_mod's finalized graph (null when none). Backends read this, never the handle.
  std::shared_ptr<const flex::ScoreMod> score_mod;

  // Masks as flags.
  bool causal = false;        // keys right of the diagonal are hidden
  bool bottom_right = false;  // the diagonal (and window) aligned to the end of the keys
  bool padding = false;       // per-sequence lengths come from cu_seqlens
  bool thd = false;           // q, o, dO, dQKV packed THD (and k, v unless paged)
  bool paged = false;         // k, v are pools of pages (config.page_size > 0); forward only
  bool fp8 = false;           // FP8 attention: qkv_dtype fp8_e4m3 with per-tensor scaling
  int64_t window_left = -1;   // -1 unbounded
  int64_t window_right = -1;  // -1 unbounded; 0 when causal

  int64_t group_size() const { return config.heads_q / config.heads_kv; }
  double scale() const { return config.attn_scale; }
  bool has_dropout() const { return config.dropout > 0.0; }
  // The dropout mask's place in a larger problem (fusedattn.h, "Dropout mask"). Normalized: all
  // 0 without dropout, and dropout_heads / dropout_rows 0 where they are heads_q / max_seqlen_q,
  // so that any field set means the call draws another mask than it would at its own positions.
  bool has_dropout_positions() const {
    const auto& c = config;
    return c.dropout_batch_offset || c.dropout_heads || c.dropout_head_offset || c.dropout_rows ||
           c.dropout_row_offset || c.dropout_key_offset;
  }
  int64_t dropout_heads() const {
    return config.dropout_heads ? config.dropout_heads : config.heads_q;
  }
  int64_t dropout_rows() const {
    return config.dropout_rows ? config.dropout_rows : config.max_seqlen_q;
  }
  // The dropout stream of row i of head h of sequence b, and the key its element j draws
  // (DropoutRow::Keep(dropout_key(j))), at the problem's positions.
  DropoutRow dropout_row(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i) const {
    const auto& c = config;
    return MakeDropoutRow(seed, offset, DropoutRow::Threshold(c.dropout),
                          b + c.dropout_batch_offset, h + c.dropout_head_offset,
                          i + c.dropout_row_offset, dropout_heads(), dropout_rows());
  }
  int64_t dropout_key(int64_t j) const { return j + config.dropout_key_offset; }
  bool has_softcap() const { return config.softcap > 0.0; }
  bool needs_lse() const { return config.is_training || config.return_lse; }
  bool has_score_mod() const { return score_mod != nullptr; }
  bool has_tensor_bias() const {
    return config.bias_type == FUSEDATTN_BIAS_PRE_SCALE ||
           config.bias_type == FUSEDATTN_BIAS_POST_SCALE;
  }
  // Whether the window/causal constraints hide anything beyond the sequence lengths.
  bool has_band() const { return causal || window_left >= 0 || window_right >= 0; }

  // The mask's band (common/band.h, the one definition of which keys a row sees).
  Band band() const { return MakeBand(window_left, window_right, bottom_right); }
  // The visible key range [lo, hi) of query i for a sequence of lengths seqlen_q, seqlen_kv.
  // Empty (lo >= hi) when the row sees no key.
  void visible_keys(int64_t i, int64_t seqlen_q, int64_t seqlen_kv, int64_t* lo,
                    int64_t* hi) const {
    band().keys_of_row(i, seqlen_q, seqlen_kv, lo, hi);
  }

  // A short text of the problem for diagnostics.
  std::string describe() const;
};

// Every field of a problem as words: equal keys <=> equal problems. Caches key on it (plus what
// else changes their artifact), never on addresses. A score_mod enters by its structure: the
// last word holds its hash, and equality compares the graphs themselves.
struct ProblemKey {
  static constexpr size_t kWords = 41;
  std::array<int64_t, kWords> words{};
  std::shared_ptr<const flex::ScoreMod> score_mod;
  bool operator==(const ProblemKey& other) const;
};
struct ProblemKeyHash {
  size_t operator()(const ProblemKey& key) const;
};
ProblemKey KeyOf(const Problem& problem);

// A score_mod's auxiliary tensor: element (b, h, i, j) at
//   data + b * stride_b + h * stride_h + i * stride_q + j * stride_kv,
// with stride 0 on the axes the tensor does not index. data is null for an absent gradient.
struct AuxTensorView {
  void* data = nullptr;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_kv = 0;
  bool present() const { return data != nullptr; }
};

// FP8 per-tensor scaling factors of a call (fusedattn.h, "FP8 attention"): float32 scalars where
// the tensors live, null where the problem does not read them. Validation checked presence only;
// the values are checked by CheckFp8ScaleValues (api) or read by a backend.
struct Fp8FwdScales {
  const float* descale_q = nullptr;
  const float* descale_k = nullptr;
  const float* descale_v = nullptr;
  const float* descale_s = nullptr;
  const float* scale_s = nullptr;
  const float* scale_o = nullptr;  // o_dtype FP8 only
  float* amax_s = nullptr;
  float* amax_o = nullptr;
};
struct Fp8BwdScales {
  const float* descale_q = nullptr;
  const float* descale_k = nullptr;
  const float* descale_v = nullptr;
  const float* descale_o = nullptr;  // o_dtype FP8 only
  const float* descale_do = nullptr;
  const float* descale_s = nullptr;
  const float* descale_dp = nullptr;
  const float* scale_s = nullptr;
  const float* scale_dp = nullptr;
  const float* scale_dq = nullptr;  // dqkv_dtype FP8 only, as scale_dk and scale_dv
  const float* scale_dk = nullptr;
  const float* scale_dv = nullptr;
  float* amax_dp = nullptr;
  float* amax_dq = nullptr;
  float* amax_dk = nullptr;
  float* amax_dv = nullptr;
};

// The views of a forward call, validated against the problem.
struct FwdTensors {
  TensorView q, k, v, o;
  LseView lse;            // present when the problem needs it
  bool lse_packed = false;  // THD [tokens, heads] layout
  float* max_logit = nullptr;  // [heads_q] float32, contiguous stride given below
  int64_t max_logit_stride = 1;
  BiasView bias;
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride = 1;
  const float* sink_logits = nullptr;
  int64_t sink_stride = 1;
  const int32_t* cu_seqlens_q = nullptr;   // [batch + 1] (stride 1 after validation)
  const int32_t* cu_seqlens_kv = nullptr;
  const int32_t* seq_offsets_q = nullptr;  // THD token starts; falls back to cu_seqlens
  const int32_t* seq_offsets_kv = nullptr;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  // Where the caller holds {seed, offset} instead (args.dropout_seed_offset), or null. The API
  // layer reads it into the two fields above before a backend runs (ReadDropoutSeedOffset).
  const uint64_t* dropout_seed_offset = nullptr;
  std::vector<AuxTensorView> score_mod_tensors;  // one per declared tensor
  // Paged K/V (problem.paged; else null and 0): k and v hold num_pages pages (see TensorView);
  // row b of the page table starts at page_table + b * page_table_stride and holds
  // max_pages_per_seq entries (stride 1); seqlens_kv has batch entries (stride 1). Validation
  // checked shapes and strides only: the entries themselves live where the tensors live.
  const int32_t* page_table = nullptr;
  int64_t page_table_stride = 0;
  int64_t max_pages_per_seq = 0;
  int64_t num_pages = 0;
  const int32_t* seqlens_kv = nullptr;
  Fp8FwdScales fp8;  // problem.fp8 only
};

struct BwdTensors {
  TensorView q, k, v, o, d_o;
  LseView lse;
  bool lse_packed = false;
  BiasView bias;
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride = 1;
  const float* sink_logits = nullptr;
  int64_t sink_stride = 1;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;
  const int32_t* seq_offsets_q = nullptr;
  const int32_t* seq_offsets_kv = nullptr;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  // Where the caller holds {seed, offset} instead (args.dropout_seed_offset), or null. The API
  // layer reads it into the two fields above before a backend runs (ReadDropoutSeedOffset).
  const uint64_t* dropout_seed_offset = nullptr;
  TensorView dq, dk, dv;
  BiasView dbias;            // present when bias_requires_grad
  float* dsink = nullptr;    // [heads_q] for LEARNABLE_SINK
  int64_t dsink_stride = 1;
  std::vector<AuxTensorView> score_mod_tensors;  // one per declared tensor
  std::vector<AuxTensorView> score_mod_grads;    // present for tensors that require grad
  Fp8BwdScales fp8;  // problem.fp8 only
};

// Validates a config (every field) and normalizes it. Resolves device AUTO with has_cuda_device.
// A config of an earlier layout's smaller struct_size (fusedattn.h's struct_size comment lists
// them) is read with the later fields at their defaults.
Status MakeProblem(const fusedattn_config* config, bool has_cuda_device, Problem* problem);

// Validates the tensors of a call against a problem (shapes, strides, dtypes, presence) and
// builds their views. Nothing is read through the pointers.
Status MakeFwdTensors(const Problem& problem, const fusedattn_fwd_args* args, FwdTensors* out);
Status MakeBwdTensors(const Problem& problem, const fusedattn_bwd_args* args, BwdTensors* out);

// Whether the problem has a backward (fusedattn_bwd, fusedattn_bwd_workspace_size): paged K/V is
// forward only, and an FP8 problem needs an FP8 do_dtype (CheckBackwardDtypes).
Status CheckHasBackward(const Problem& problem);
Status CheckBackwardDtypes(const Problem& problem);

// The FP8 scaling factors a call reads, with their names, for checks and backends that read
// them on the host (fusedattn.h: each must be finite and > 0).
struct NamedScale {
  const char* name;
  const float* pointer;
};
std::vector<NamedScale> Fp8ScalesRead(const Fp8FwdScales& scales);
std::vector<NamedScale> Fp8ScalesRead(const Fp8BwdScales& scales);
// Checks values[k] (the value of scales[k]): the first that is NaN, inf or <= 0 is
// INVALID_ARGUMENT naming it and its value.
Status CheckFp8ScaleValues(const std::vector<NamedScale>& scales, const float* values);

size_t DtypeSize(fusedattn_dtype dtype);
const char* DtypeName(fusedattn_dtype dtype);
const char* FormatName(fusedattn_format format);
const char* MaskName(fusedattn_mask mask);
const char* BiasName(fusedattn_bias bias);
const char* SoftmaxName(fusedattn_softmax softmax);

}  // namespace fusedattn
