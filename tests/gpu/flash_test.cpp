// The flash backend against the CPU reference, on a GPU (each test skips, saying why, without a
// CUDA device or without the flash backend).
//
// Every case forces backend = flash on device tensors and runs the reference (backend =
// reference, device = CPU) on host copies of the same inputs: the forward's O, LSE and max_logit
// are compared; then both backwards run from the reference's O and LSE, and dQ, dK, dV, dbias and
// dsink are compared, with the tolerances of shared/DESIGN.md and poisoned outputs (an element the
// reference writes and flash does not, or the reverse, fails). Dropout draws the reference's
// Philox stream, so dropout cases are compared exactly like the others.
//
// The feature grid (masks x layouts x GQA x windows x bias x softmax x softcap x dropout x dtype
// x head dims x lengths x strides x deterministic) is covered pairwise: every pair of levels of
// any two factors appears in at least one case (FlashGrid/FlashGridTest.Matches/N).
//
// compute-sanitizer subsets (a few seconds each; both paths, forward and backward):
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashSanitize*'
//   compute-sanitizer --tool racecheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashSanitize*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.hpp"
#include "gpu/device_memory.h"
#include "gpu/expect_close.h"
#include "gpu/skip.h"
#include "testing/tensors.h"

#ifdef FUSEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusedattn::testing {
namespace {

fusedattn_config Config(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                        fusedattn_dtype dtype) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = dtype;
  c.is_training = 1;
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_FLASH;
  return c;
}

void SetFormats(fusedattn_config* c, fusedattn_format f) {
  c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format = f;
}

bool IsCausal(fusedattn_mask m) {
  return m == FUSEDATTN_MASK_CAUSAL || m == FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT ||
         m == FUSEDATTN_MASK_PADDING_CAUSAL || m == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

// The tensor with every row of its innermost axis padded by `extra` elements (values and poison
// kept): strided tensors whose rows stay 16-byte aligned when extra is a multiple of 8.
HostTensor WithPaddedRows(const HostTensor& t, int64_t extra) {
  if (t.empty()) return t;
  const auto& shape = t.shape();
  const int n = static_cast<int>(shape.size());
  std::vector<int64_t> strides(n, 1);
  for (int i = n - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1] + (i == n - 2 ? extra : 0);
  int64_t storage = 1;
  for (int i = 0; i < n; ++i) storage += (shape[i] - 1) * strides[i];
  HostTensor out(t.dtype(), shape, strides, storage + extra);
  out.poison();
  std::vector<int64_t> index(n, 0);
  for (int64_t e = 0; e < t.numel(); ++e) {
    const int64_t from = t.offset_of(index), to = out.offset_of(index);
    if (t.is_poison(from)) {
      // outputs stay poison
    } else {
      out.set(to, t.get(from));
    }
    for (int d = n - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

void PadQkvRows(ProblemTensors* t, int64_t extra) {
  for (HostTensor* x : {&t->q, &t->k, &t->v, &t->o, &t->d_o, &t->dq, &t->dk, &t->dv})
    *x = WithPaddedRows(*x, extra);
}

struct RunOptions {
  bool backward = true;
  int64_t pad_rows = 0;  // pad q/k/v/o/dO/dq/dk/dv rows by this many elements (0: as made)
};

// Runs config on flash (device) and on the reference (host) and compares every output.
void ExpectMatchesReference(const fusedattn_config& config, const TensorOptions& options,
                            const std::string& label, RunOptions run = {}) {
#ifdef FUSEDATTN_WITH_CUDA
  SCOPED_TRACE(label);
  ProblemTensors dev_host = MakeProblemTensors(config, options);
  if (run.pad_rows > 0) PadQkvRows(&dev_host, run.pad_rows);
  ProblemTensors ref = dev_host;
  ref.config.backend = FUSEDATTN_BACKEND_REFERENCE;
  ref.config.device = FUSEDATTN_DEVICE_CPU;
  const double tol = Tolerance(config.qkv_dtype);

  ASSERT_NO_THROW(Forward(ref.config, ref.fwd_args())) << "reference forward";
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(dev_host, &error)) << error;
  size_t fwd_bytes = 0;  // THD on the wgmma kernel: the tile schedule
  ASSERT_NO_THROW(fwd_bytes = FwdWorkspaceSize(config));
  DeviceBuffer fwd_workspace(fwd_bytes);
  ASSERT_TRUE(fwd_bytes == 0 || fwd_workspace.ptr) << "cudaMalloc of " << fwd_bytes << " bytes";
  try {
    Forward(config, dev.fwd_args(), fwd_workspace.ptr, fwd_bytes);
  } catch (const Error& e) {
    FAIL() << "flash forward failed: " << e.what();
  }
  ASSERT_TRUE(dev.download_outputs(&dev_host, &error)) << error;
  ExpectClose("O", dev_host.o, ref.o, tol);
  ExpectClose("LSE", dev_host.lse, ref.lse, tol);
  ExpectClose("max_logit", dev_host.max_logit, ref.max_logit, tol);
  if (!run.backward || !config.is_training) return;

  // Both backwards start from the reference's O and LSE.
  dev_host.o = ref.o;
  dev_host.lse = ref.lse;
  for (HostTensor* g : {&dev_host.dq, &dev_host.dk, &dev_host.dv, &dev_host.dbias, &dev_host.dsink})
    if (!g->empty()) g->poison();
  ASSERT_TRUE(dev.upload_outputs(dev_host, &error)) << error;
  ASSERT_NO_THROW(Backward(ref.config, ref.bwd_args())) << "reference backward";
  size_t bytes = 0;
  ASSERT_NO_THROW(bytes = BwdWorkspaceSize(config));
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(bytes == 0 || workspace.ptr) << "cudaMalloc of " << bytes << " bytes";
  try {
    Backward(config, dev.bwd_args(), workspace.ptr, bytes);
  } catch (const Error& e) {
    FAIL() << "flash backward failed: " << e.what();
  }
  ASSERT_TRUE(dev.download_outputs(&dev_host, &error)) << error;
  ExpectClose("dQ", dev_host.dq, ref.dq, tol);
  ExpectClose("dK", dev_host.dk, ref.dk, tol);
  ExpectClose("dV", dev_host.dv, ref.dv, tol);
  ExpectClose("dbias", dev_host.dbias, ref.dbias, tol);
  ExpectClose("dsink", dev_host.dsink, ref.dsink, tol);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// ------------------------------------------------------------------------------------------------
// The pairwise feature grid
// ------------------------------------------------------------------------------------------------

struct Factor {
  const char* name;
  int levels;
};

// Factors and their levels; Apply() below turns a choice of levels into a problem.
const std::vector<Factor>& Factors() {
  static const std::vector<Factor> factors = {
      {"mask", 6},     {"layout", 5},   {"gqa", 3},     {"window", 3}, {"bias", 5},
      {"softmax", 3},  {"softcap", 2},  {"dropout", 2}, {"dtype", 3},  {"dims", 6},
      {"lengths", 5},  {"strides", 3},  {"deterministic", 2},
  };
  return factors;
}

struct GridCase {
  std::vector<int> level;
  std::string name() const {
    std::ostringstream s;
    for (size_t f = 0; f < level.size(); ++f) s << (f ? "_" : "") << Factors()[f].name << level[f];
    return s.str();
  }
};

// Greedy all-pairs: each new case is the best of a few random candidates by the number of
// uncovered level pairs it covers; deterministic (fixed seed, no library distributions).
std::vector<GridCase> PairwiseCases() {
  const auto& factors = Factors();
  const size_t n = factors.size();
  std::set<std::tuple<size_t, int, size_t, int>> uncovered;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b < n; ++b)
      for (int x = 0; x < factors[a].levels; ++x)
        for (int y = 0; y < factors[b].levels; ++y) uncovered.insert({a, x, b, y});
  std::mt19937 rng(20261123);
  std::vector<GridCase> cases;
  while (!uncovered.empty()) {
    GridCase best;
    size_t best_gain = 0;
    // Seed each candidate with one uncovered pair so every step gains.
    const auto& seed_pair = *uncovered.begin();
    for (int attempt = 0; attempt < 64; ++attempt) {
      GridCase c;
      c.level.resize(n);
      for (size_t f = 0; f < n; ++f) c.level[f] = static_cast<int>(rng() % factors[f].levels);
      c.level[std::get<0>(seed_pair)] = std::get<1>(seed_pair);
      c.level[std::get<2>(seed_pair)] = std::get<3>(seed_pair);
      size_t gain = 0;
      for (size_t a = 0; a < n; ++a)
        for (size_t b = a + 1; b < n; ++b) gain += uncovered.count({a, c.level[a], b, c.level[b]});
      if (gain > best_gain) best_gain = gain, best = c;
    }
    for (size_t a = 0; a < n; ++a)
      for (size_t b = a + 1; b < n; ++b) uncovered.erase({a, best.level[a], b, best.level[b]});
    cases.push_back(best);
  }
  return cases;
}

struct BuiltCase {
  fusedattn_config config;
  TensorOptions options;
  RunOptions run;
};

BuiltCase Apply(const GridCase& g) {
  auto L = [&](const char* name) {
    for (size_t f = 0; f < Factors().size(); ++f)
      if (std::strcmp(Factors()[f].name, name) == 0) return g.level[f];
    return -1;
  };
  static const fusedattn_dtype kDtypes[] = {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FLOAT16,
                                            FUSEDATTN_DTYPE_BFLOAT16};
  static const int64_t kDims[][2] = {{64, 64}, {128, 128}, {40, 40}, {192, 128}, {256, 256}, {24, 24}};
  static const int64_t kLengths[][2] = {{37, 53}, {64, 64}, {1, 45}, {70, 20}, {130, 97}};
  static const int64_t kHeads[][2] = {{4, 4}, {4, 2}, {6, 1}};

  BuiltCase out;
  const int64_t* len = kLengths[L("lengths")];
  const int64_t* heads = kHeads[L("gqa")];
  fusedattn_config c = Config(2, heads[0], heads[1], len[0], len[1], 64, kDtypes[L("dtype")]);
  c.head_dim_qk = kDims[L("dims")][0];
  c.head_dim_v = kDims[L("dims")][1];
  c.mask = static_cast<fusedattn_mask>(L("mask"));
  switch (L("layout")) {
    case 0: SetFormats(&c, FUSEDATTN_FORMAT_BSHD); break;
    case 1: SetFormats(&c, FUSEDATTN_FORMAT_SBHD); break;
    case 2: SetFormats(&c, FUSEDATTN_FORMAT_BHSD); break;
    case 3: SetFormats(&c, FUSEDATTN_FORMAT_THD); break;
    case 4:  // every tensor its own format
      c.q_format = FUSEDATTN_FORMAT_BSHD, c.kv_format = FUSEDATTN_FORMAT_BHSD;
      c.o_format = FUSEDATTN_FORMAT_SBHD, c.do_format = FUSEDATTN_FORMAT_BHSD;
      c.dqkv_format = FUSEDATTN_FORMAT_SBHD;
      break;
  }
  const bool causal = IsCausal(c.mask);
  switch (L("window")) {
    case 0: break;
    case 1: c.window_left = 7; break;
    case 2: c.window_left = 9, c.window_right = causal ? 0 : 4; break;
  }
  switch (L("bias")) {
    case 0: break;
    case 1:
      c.bias_type = FUSEDATTN_BIAS_PRE_SCALE, c.bias_batch = c.batch, c.bias_heads = c.heads_q;
      c.bias_requires_grad = 1;
      break;
    case 2:  // broadcast over batch and heads
      c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_requires_grad = 1;
      break;
    case 3: c.bias_type = FUSEDATTN_BIAS_ALIBI; break;
    case 4:  // broadcast over heads, bias in the data dtype
      c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_batch = c.batch, c.bias_requires_grad = 1;
      out.options.bias_dtype = c.qkv_dtype;
      break;
  }
  c.softmax_type = static_cast<fusedattn_softmax>(L("softmax"));
  if (L("softcap")) c.softcap = 5.0;
  if (L("dropout")) c.dropout = 0.2;
  c.deterministic = L("deterministic");
  c.return_max_logit = 1;
  out.options.seed = 1000 + static_cast<uint64_t>(L("lengths")) * 7 + L("dims");
  out.options.thd_gaps = L("strides") == 1;
  out.options.lse_packed = L("strides") == 2;
  if (L("strides") == 1) out.options.padded_strides = true;  // rows padded by 3: simple path
  if (L("strides") == 2) out.run.pad_rows = 8;              // padded but 16-byte aligned
  out.config = c;
  return out;
}

class FlashGridTest : public ::testing::TestWithParam<GridCase> {};

TEST_P(FlashGridTest, Matches) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  BuiltCase bc = Apply(GetParam());
  ExpectMatchesReference(bc.config, bc.options, GetParam().name(), bc.run);
}

INSTANTIATE_TEST_SUITE_P(FlashGrid, FlashGridTest, ::testing::ValuesIn(PairwiseCases()),
                         [](const ::testing::TestParamInfo<GridCase>& info) {
                           return std::to_string(info.index);
                         });

// ------------------------------------------------------------------------------------------------
// Named cases
// ------------------------------------------------------------------------------------------------

TEST(Flash, LongCausalBf16HeadDim128) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(1, 2, 1, 2048, 2048, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectMatchesReference(c, {}, "s=2048 causal d=128 bf16");
}

TEST(Flash, LongFp16HeadDim64) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(2, 2, 2, 1024, 1024, 64, FUSEDATTN_DTYPE_FLOAT16);
  ExpectMatchesReference(c, {}, "s=1024 d=64 fp16");
}

TEST(Flash, LongSlidingWindowBf16HeadDim256) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(1, 2, 2, 700, 900, 256, FUSEDATTN_DTYPE_BFLOAT16);
  c.window_left = 200, c.window_right = 50;
  ExpectMatchesReference(c, {}, "s=700/900 window (200,50) d=256 bf16");
}

TEST(Flash, ThdUnevenLengthsIncludingEmpty) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT32}) {
    fusedattn_config c = Config(5, 4, 2, 150, 170, 64, dtype);
    SetFormats(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    TensorOptions o;
    o.len_q = {150, 0, 17, 1, 129};
    o.len_kv = {170, 5, 0, 64, 129};
    o.thd_gaps = true;
    ExpectMatchesReference(c, o, std::string("THD uneven ") + (dtype == FUSEDATTN_DTYPE_FLOAT32 ? "fp32" : "bf16"));
    o.thd_gaps = false;
    o.lse_packed = true;
    ExpectMatchesReference(c, o, "THD uneven, packed LSE");
  }
}

TEST(Flash, PaddingMaskOnBshd) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(3, 4, 4, 96, 80, 128, FUSEDATTN_DTYPE_FLOAT16);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  TensorOptions o;
  o.len_q = {96, 0, 33};
  o.len_kv = {80, 12, 0};
  ExpectMatchesReference(c, o, "BSHD padding causal with empty sequences");
}

TEST(Flash, SingleQueryAndShortQueriesAlignBottomRight) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (int64_t sq : {1, 3, 17}) {
    fusedattn_config c = Config(2, 8, 2, sq, 1000, 128, FUSEDATTN_DTYPE_BFLOAT16);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    ExpectMatchesReference(c, {}, "sq=" + std::to_string(sq) + " skv=1000 causal bottom-right");
    c.window_left = 100;
    ExpectMatchesReference(c, {}, "sq=" + std::to_string(sq) + " skv=1000 window 100");
  }
}

TEST(Flash, FullyMaskedRowsGiveZeroOutputAndNoNan) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  // Bottom-right causal with sq > skv: the first sq - skv rows see no key.
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT32}) {
    fusedattn_config c = Config(2, 2, 2, 150, 40, 64, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    c.return_max_logit = 1;
    ExpectMatchesReference(c, {}, "fully masked rows");
  }
}

TEST(Flash, DropoutMaskIsTheReferenceMask) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  // A float32 problem (tolerance 1e-5): one differing mask bit would show as an error ~1e-2.
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FLOAT16}) {
    fusedattn_config c = Config(2, 3, 3, 77, 140, 64, dtype);
    c.dropout = 0.5;
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    ExpectMatchesReference(c, {}, "dropout 0.5");
  }
}

TEST(Flash, HeadDimsOfEverySize) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  // Instances (64, 128, 256), padded dims, unequal dims, dims past the fast path and odd dims.
  const int64_t dims[][2] = {{32, 32}, {64, 64}, {80, 80}, {96, 96}, {128, 128}, {160, 160},
                             {192, 128}, {128, 64}, {256, 256}, {264, 264}, {512, 512},
                             {7, 13}};
  for (auto d : dims) {
    fusedattn_config c = Config(1, 2, 1, 65, 130, d[0], FUSEDATTN_DTYPE_BFLOAT16);
    c.head_dim_v = d[1];
    c.mask = FUSEDATTN_MASK_CAUSAL;
    ExpectMatchesReference(c, {}, "d_qk=" + std::to_string(d[0]) + " d_v=" + std::to_string(d[1]));
  }
}

TEST(Flash, DeterministicBackwardIsBitIdentical) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_CUDA
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT32}) {
    fusedattn_config c = Config(2, 4, 2, 300, 300, 128, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.deterministic = 1;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;  // broadcast: dbias summed over (b, h)
    c.bias_requires_grad = 1;
    ProblemTensors host = MakeProblemTensors(c, {});
    DeviceProblem dev;
    std::string error;
    ASSERT_TRUE(dev.upload(host, &error)) << error;
    ASSERT_NO_THROW(Forward(c, dev.fwd_args()));
    size_t bytes = BwdWorkspaceSize(c);
    DeviceBuffer workspace(bytes);
    std::vector<ProblemTensors> runs;
    for (int r = 0; r < 2; ++r) {
      ASSERT_NO_THROW(Backward(c, dev.bwd_args(), workspace.ptr, bytes));
      ProblemTensors out = host;
      ASSERT_TRUE(dev.download_outputs(&out, &error)) << error;
      runs.push_back(out);
    }
    for (auto member : {&ProblemTensors::dq, &ProblemTensors::dk, &ProblemTensors::dv,
                        &ProblemTensors::dbias}) {
      const HostTensor& a = runs[0].*member;
      const HostTensor& b = runs[1].*member;
      ASSERT_EQ(a.storage_bytes(), b.storage_bytes());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.storage_bytes()))
          << "two deterministic backwards differ";
    }
  }
#endif
}

TEST(Flash, AutoSelectionChoosesFlashForWhatCudnnRefuses) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  std::vector<std::pair<std::string, fusedattn_config>> problems;
  fusedattn_config base = Config(2, 8, 8, 512, 512, 128, FUSEDATTN_DTYPE_BFLOAT16);
  base.backend = FUSEDATTN_BACKEND_AUTO;
  fusedattn_config c = base;
  c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  problems.push_back({"pre-scale bias", c});
  c = base;
  c.softcap = 30.0;
  problems.push_back({"softcap", c});
  c = base;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  problems.push_back({"alibi with the caller's slopes", c});
  c = base;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  problems.push_back({"float32", c});
  for (auto& [what, config] : problems) {
    Selection s;
    ASSERT_NO_THROW(s = GetBackend(config)) << what;
    EXPECT_EQ(s.backend, FUSEDATTN_BACKEND_FLASH) << what << ": " << s.diagnostic;
  }
}

TEST(Flash, OutOfRangeSequenceLengthsDoNotFault) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_CUDA
  fusedattn_config c = Config(3, 2, 2, 64, 64, 64, FUSEDATTN_DTYPE_BFLOAT16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  TensorOptions o;
  o.len_q = {64, 10, 20};
  o.len_kv = {64, 10, 20};
  ProblemTensors host = MakeProblemTensors(c, o);
  // Lengths above max_seqlen, negative lengths and starts past the tokens: clamped on the device.
  const int32_t bad_q[] = {0, 500, 400, 1 << 30};
  const int32_t bad_kv[] = {-7, 100, 90, 95};
  for (int i = 0; i < 4; ++i) host.cu_seqlens_q.set(i, bad_q[i]), host.cu_seqlens_kv.set(i, bad_kv[i]);
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  {
    size_t fwd_bytes = FwdWorkspaceSize(c);  // THD on the wgmma kernel: the tile schedule
    DeviceBuffer fwd_workspace(fwd_bytes);
    EXPECT_NO_THROW(Forward(c, dev.fwd_args(), fwd_workspace.ptr, fwd_bytes));
  }
  size_t bytes = BwdWorkspaceSize(c);
  DeviceBuffer workspace(bytes);
  EXPECT_NO_THROW(Backward(c, dev.bwd_args(), workspace.ptr, bytes));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#endif
}

// Small problems of both paths and both directions, for compute-sanitizer (memcheck, racecheck).
TEST(FlashSanitize, FastPathAllFeatures) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(2, 4, 2, 70, 90, 64, FUSEDATTN_DTYPE_BFLOAT16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 30;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.softcap = 10.0;
  c.dropout = 0.1;
  c.return_max_logit = 1;
  TensorOptions o;
  o.thd_gaps = true;
  ExpectMatchesReference(c, o, "sanitize fast path THD");
  c = Config(2, 2, 2, 70, 130, 128, FUSEDATTN_DTYPE_FLOAT16);
  c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  c.bias_requires_grad = 1;
  ExpectMatchesReference(c, {}, "sanitize fast path bias");
  c.deterministic = 1;
  ExpectMatchesReference(c, {}, "sanitize fast path deterministic");
  c = Config(1, 2, 2, 33, 47, 256, FUSEDATTN_DTYPE_BFLOAT16);
  c.head_dim_v = 192;
  ExpectMatchesReference(c, {}, "sanitize fast path d=256/192");
}

TEST(FlashSanitize, SimplePathAllFeatures) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(2, 4, 2, 40, 30, 24, FUSEDATTN_DTYPE_FLOAT32);
  c.head_dim_v = 40;
  c.mask = FUSEDATTN_MASK_PADDING;
  c.window_left = 5, c.window_right = 3;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_requires_grad = 1;
  c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
  c.dropout = 0.3;
  ExpectMatchesReference(c, {}, "sanitize simple path");
  c.deterministic = 1;
  ExpectMatchesReference(c, {}, "sanitize simple path deterministic");
}

}  // namespace
}  // namespace fusedattn::testing
