// Tensor factories shared by the tests, the `fusedattn` program, the fuzzer and the benchmarks:
// host tensors with explicit strides, every tensor of a problem built from its config with random
// data, device mirrors, and the error measure of shared/DESIGN.md.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"

namespace fusedattn::testing {

// An owning host tensor. Storage may be larger than the elements (padded strides).
class HostTensor {
 public:
  HostTensor() = default;
  // Contiguous (row-major) tensor.
  HostTensor(fusedattn_dtype dtype, std::vector<int64_t> shape);
  // Tensor with the given strides over storage of `storage_elements` elements.
  HostTensor(fusedattn_dtype dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
             int64_t storage_elements);

  bool empty() const { return storage_.empty(); }
  fusedattn_dtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t numel() const;                    // logical elements
  int64_t storage_elements() const;         // elements of storage
  size_t storage_bytes() const { return storage_.size(); }
  void* data() { return storage_.empty() ? nullptr : storage_.data(); }
  const void* data() const { return storage_.empty() ? nullptr : storage_.data(); }

  // Descriptor over this tensor's storage, or over `device_data` (a mirror with equal layout).
  fusedattn_tensor desc() const { return desc_at(const_cast<void*>(data())); }
  fusedattn_tensor desc_at(void* base) const;

  // Element access by storage offset or by logical index.
  double get(int64_t offset) const;
  void set(int64_t offset, double value);
  int64_t offset_of(const std::vector<int64_t>& index) const;
  double at(const std::vector<int64_t>& index) const { return get(offset_of(index)); }

  // Every storage element (also gaps between strided elements).
  void fill(double value);
  void fill_uniform(std::mt19937_64& rng, double lo, double hi);
  // A NaN with a recognizable payload in every storage element (0x7FFFFFFF for int32).
  void poison();
  bool is_poison(int64_t offset) const;

  // Logical elements in row-major order as doubles.
  std::vector<double> to_vector() const;

 private:
  fusedattn_dtype dtype_ = FUSEDATTN_DTYPE_FLOAT32;
  std::vector<int64_t> shape_, strides_;
  std::vector<unsigned char> storage_;
};

// Shape of a q/k/v/o-like tensor in a format. tokens is used for THD.
std::vector<int64_t> FormatShape(fusedattn_format format, int64_t batch, int64_t seqlen,
                                 int64_t heads, int64_t dim, int64_t tokens);

struct TensorOptions {
  uint64_t seed = 1;
  // Per-sequence lengths for padding masks and THD. Empty: drawn at random in
  // [0 or 1, max_seqlen], with the first sequence at the maximum.
  std::vector<int32_t> len_q, len_kv;
  bool allow_empty_sequences = true;
  bool thd_gaps = false;         // THD: seq_offsets leave gaps of unused tokens between sequences
  bool lse_packed = false;       // THD: LSE as [tokens, heads] instead of [batch, heads, sq]
  bool padded_strides = false;   // rows padded: strides larger than the dense ones
  double input_range = 1.0;      // q, k, v, dO uniform in [-range, range]
  fusedattn_dtype bias_dtype = FUSEDATTN_DTYPE_FLOAT32;
  // Paged K/V (config.page_size > 0). The key lengths are always per sequence (len_kv, else
  // drawn as above). The pool holds the pages the sequences use, in a shuffled order, and
  // spare_pages more that no sequence uses (random data too, so that reading one shows). With
  // share_prefix, every sequence shares the full pages of its common prefix with sequence 0
  // (the same page indices). Table entries past a sequence's pages hold unused_page_entry.
  int64_t spare_pages = 2;
  bool share_prefix = false;
  int32_t unused_page_entry = -1;
  int64_t extra_table_width = 0;  // page table columns beyond ceil(max_seqlen_kv / page_size)
};

// Every tensor of a problem, laid out as the config's formats say, filled with random inputs and
// poisoned outputs. Tensors the config does not use stay empty.
struct ProblemTensors {
  fusedattn_config config{};
  std::vector<int32_t> len_q, len_kv;       // per-sequence lengths
  std::vector<int32_t> start_q, start_kv;   // THD token starts (0 otherwise)
  HostTensor q, k, v, o, lse, max_logit, bias, alibi_slopes, sink_logits;
  HostTensor cu_seqlens_q, cu_seqlens_kv, seq_offsets_q, seq_offsets_kv;
  HostTensor page_table, seqlens_kv;  // paged K/V: k and v are pools of num_pages pages
  int64_t num_pages = 0;
  HostTensor d_o, dq, dk, dv, dbias, dsink;
  uint64_t dropout_seed = 0x1234abcd5678ef01ull;
  uint64_t dropout_offset = 7;

  fusedattn_fwd_args fwd_args() const;
  fusedattn_bwd_args bwd_args() const;
  // Poisons every output (o, lse, max_logit, dq, dk, dv, dbias, dsink).
  void poison_outputs();
};

ProblemTensors MakeProblemTensors(const fusedattn_config& config, const TensorOptions& options);

// ||out - ref|| / ||ref|| over the elements the reference wrote (those not poison in ref).
// Elements of `out` where ref is poison must be poison too (untouched), else counted as
// `touched_unwritten`. NaN (non-poison) in out where ref is finite counts as `nan`.
struct Comparison {
  double rel_error = 0;
  double max_abs_error = 0;
  int64_t compared = 0;
  int64_t nan = 0;               // NaN/inf in out where ref is finite
  int64_t unwritten = 0;         // poison left in out where ref was written
  int64_t touched_unwritten = 0; // written in out where ref left poison
  std::string describe() const;
  bool ok(double tolerance) const {
    return nan == 0 && unwritten == 0 && touched_unwritten == 0 && rel_error <= tolerance;
  }
};
Comparison Compare(const HostTensor& out, const HostTensor& ref);

// The tolerances of shared/DESIGN.md.
double Tolerance(fusedattn_dtype dtype);

// Device mirrors (CUDA builds only): each HostTensor of a ProblemTensors gets a device copy with
// the same layout; args point at the device copies.
class DeviceProblem {
 public:
  DeviceProblem() = default;
  ~DeviceProblem();
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  // Allocates and uploads every non-empty tensor. Returns false with a message on failure.
  bool upload(const ProblemTensors& host, std::string* error);
  // Copies the outputs back into host (o, lse, max_logit, dq, dk, dv, dbias, dsink).
  bool download_outputs(ProblemTensors* host, std::string* error) const;
  // Re-uploads the host's outputs (e.g. after poisoning them).
  bool upload_outputs(const ProblemTensors& host, std::string* error);
  fusedattn_fwd_args fwd_args() const;
  fusedattn_bwd_args bwd_args() const;
  void* device_ptr(const HostTensor* host_tensor) const;

 private:
  const ProblemTensors* host_ = nullptr;
  std::vector<std::pair<const HostTensor*, void*>> buffers_;
};

// True when a CUDA device is usable (tests use it to skip).
bool CudaDeviceAvailable();

}  // namespace fusedattn::testing
