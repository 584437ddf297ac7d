// The reference backend, through the public C API on the CPU, against the independent
// brute-force oracle (brute_force.h), forward and backward, over an all-pairs design of every
// feature: each mask and each layout meets every value of every other feature (GQA/MQA, windows,
// bias kinds and broadcasts, softmax variants, softcap, dropout, shapes with sq < skv and
// sq > skv, sequence lengths 0 and 1, head_dim_qk != head_dim_v, padded strides, packed LSE,
// THD with and without seq_offsets gaps), and every row runs in all three dtypes.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "brute_force.h"
#include "covering_array.h"
#include "problem/problem.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

enum class Layout {
  kBshd,
  kSbhd,
  kBhsd,
  kMixed,  // every tensor in another format: q BSHD, k/v SBHD, o BHSD, dO SBHD, dQKV BHSD
  kThd,
  kThdPackedLse,
  kThdGaps,  // seq_offsets leave unused tokens between sequences
  kThdGapsPackedLse,
};
constexpr int kLayouts = 8;

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kBshd: return "BSHD";
    case Layout::kSbhd: return "SBHD";
    case Layout::kBhsd: return "BHSD";
    case Layout::kMixed: return "mixed";
    case Layout::kThd: return "THD";
    case Layout::kThdPackedLse: return "THD_packedLSE";
    case Layout::kThdGaps: return "THDgaps";
    case Layout::kThdGapsPackedLse: return "THDgaps_packedLSE";
  }
  return "?";
}

// One row of the design (the dtype is added when the rows are expanded).
struct Case {
  int row = 0;
  fusedattn_mask mask = FUSEDATTN_MASK_NONE;
  Layout layout = Layout::kBshd;
  bool padded_strides = false;
  int heads = 0;   // 0: MHA 2/2, 1: GQA 4/2, 2: MQA 3/1
  int window = 0;  // 0: none, 1: left 2, 2: right 1 (0 for causal masks), 3: both
  fusedattn_bias bias = FUSEDATTN_BIAS_NONE;
  int bias_broadcast = 0;  // 0: [b, h], 1: [1, h], 2: [b, 1], 3: [1, 1]
  bool bias_in_qkv_dtype = false;
  fusedattn_softmax softmax = FUSEDATTN_SOFTMAX_VANILLA;
  bool softcap = false;
  bool dropout = false;
  int shape = 0;              // 0: sq < skv, 1: sq > skv, 2: sq = skv, 3: sq = 1, 4: skv = 1
  int dims = 0;               // 0: d_qk > d_v, 1: d_qk < d_v, 2: equal
  bool edge_lengths = false;  // padding/THD lengths include 0 and 1 (else random)
  bool o_float32 = false;     // o/dO in float32 while q/k/v are in the dtype
  bool explicit_scale = false;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
};

const char* DtypeShort(fusedattn_dtype d) {
  switch (d) {
    case FUSEDATTN_DTYPE_FLOAT32: return "f32";
    case FUSEDATTN_DTYPE_FLOAT16: return "f16";
    case FUSEDATTN_DTYPE_BFLOAT16: return "bf16";
    default: return "?";
  }
}

bool IsThd(Layout l) { return l >= Layout::kThd; }

fusedattn_config ConfigOf(const Case& k) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.is_training = 1;
  c.return_max_logit = 1;
  c.batch = 4;
  const int64_t heads[3][2] = {{2, 2}, {4, 2}, {3, 1}};
  c.heads_q = heads[k.heads][0], c.heads_kv = heads[k.heads][1];
  const int64_t shapes[5][2] = {{5, 9}, {8, 4}, {6, 6}, {1, 7}, {5, 1}};
  c.max_seqlen_q = shapes[k.shape][0], c.max_seqlen_kv = shapes[k.shape][1];
  const int64_t dims[3][2] = {{8, 5}, {4, 7}, {6, 6}};
  c.head_dim_qk = dims[k.dims][0], c.head_dim_v = dims[k.dims][1];
  c.qkv_dtype = k.dtype;
  c.o_dtype = k.o_float32 ? FUSEDATTN_DTYPE_FLOAT32 : k.dtype;
  switch (k.layout) {
    case Layout::kBshd: break;
    case Layout::kSbhd:
      c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_SBHD;
      break;
    case Layout::kBhsd:
      c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_BHSD;
      break;
    case Layout::kMixed:
      c.q_format = FUSEDATTN_FORMAT_BSHD, c.kv_format = FUSEDATTN_FORMAT_SBHD;
      c.o_format = FUSEDATTN_FORMAT_BHSD, c.do_format = FUSEDATTN_FORMAT_SBHD;
      c.dqkv_format = FUSEDATTN_FORMAT_BHSD;
      break;
    default:
      c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
      break;
  }
  c.mask = k.mask;
  const bool causal = k.mask == FUSEDATTN_MASK_CAUSAL ||
                      k.mask == FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT ||
                      k.mask == FUSEDATTN_MASK_PADDING_CAUSAL ||
                      k.mask == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  if (k.window == 1 || k.window == 3) c.window_left = 2;
  if (k.window == 2 || k.window == 3) c.window_right = causal ? 0 : 1;
  c.bias_type = k.bias;
  if (k.bias == FUSEDATTN_BIAS_PRE_SCALE || k.bias == FUSEDATTN_BIAS_POST_SCALE) {
    c.bias_batch = (k.bias_broadcast == 1 || k.bias_broadcast == 3) ? 1 : c.batch;
    c.bias_heads = (k.bias_broadcast == 2 || k.bias_broadcast == 3) ? 1 : c.heads_q;
    c.bias_requires_grad = 1;
  }
  c.softmax_type = k.softmax;
  if (k.softcap) c.softcap = 1.5;
  if (k.dropout) c.dropout = 0.25;
  if (k.explicit_scale) c.attn_scale = 0.7;
  return c;
}

TensorOptions OptionsOf(const Case& k, const fusedattn_config& c) {
  TensorOptions o;
  o.seed = 1000 + 17 * k.row + static_cast<int>(k.dtype);
  o.padded_strides = k.padded_strides;
  o.thd_gaps = k.layout == Layout::kThdGaps || k.layout == Layout::kThdGapsPackedLse;
  o.lse_packed = k.layout == Layout::kThdPackedLse || k.layout == Layout::kThdGapsPackedLse;
  o.input_range = 1.5;  // scores large enough for softcap to bend them
  o.bias_dtype = k.bias_in_qkv_dtype ? k.dtype : FUSEDATTN_DTYPE_FLOAT32;
  if (k.edge_lengths) {
    // Sequence 0 at the maximum; 1: no queries; 2: one query and no keys (a fully masked row);
    // 3: one query and one key.
    const int32_t sq = static_cast<int32_t>(c.max_seqlen_q);
    const int32_t skv = static_cast<int32_t>(c.max_seqlen_kv);
    o.len_q = {sq, 0, 1, 1};
    o.len_kv = {skv, skv > 1 ? 2 : 1, 0, 1};
  }
  return o;
}

// A problem to check: config, tensor options and a readable description for failure messages.
struct Setup {
  std::string name;
  fusedattn_config config;
  TensorOptions options;
  std::string description;
};

std::string Lengths(const std::vector<int32_t>& lengths) {
  std::string s;
  for (int32_t l : lengths) s += (s.empty() ? "" : ",") + std::to_string(l);
  return "{" + s + "}";
}

std::string Describe(const fusedattn_config& c, const TensorOptions& o) {
  Problem p;
  Status s = MakeProblem(&c, false, &p);
  std::string text = s.ok() ? p.describe() : "invalid config: " + s.message();
  text += Format(" formats q/kv/o/dO/dQKV=%s/%s/%s/%s/%s", FormatName(c.q_format),
                 FormatName(c.kv_format), FormatName(c.o_format), FormatName(c.do_format),
                 FormatName(c.dqkv_format));
  if (o.padded_strides) text += " padded_strides";
  if (o.thd_gaps) text += " thd_gaps";
  if (o.lse_packed) text += " lse_packed";
  if (!o.len_q.empty()) text += " len_q=" + Lengths(o.len_q) + " len_kv=" + Lengths(o.len_kv);
  if (c.bias_type == FUSEDATTN_BIAS_PRE_SCALE || c.bias_type == FUSEDATTN_BIAS_POST_SCALE)
    text += Format(" bias_shape=[%lld,%lld,..] bias_dtype=%s", (long long)c.bias_batch,
                   (long long)c.bias_heads, DtypeShort(o.bias_dtype));
  text += Format(" o_dtype=%s attn_scale=%g seed=%llu", DtypeShort(c.o_dtype), c.attn_scale,
                 (unsigned long long)o.seed);
  return text;
}

// The domains of the design, in the order of the fields of Case (dtype excluded).
const std::vector<int> kDomains = {6, kLayouts, 2, 3, 4, 4, 4, 2, 3, 2, 2, 5, 3, 2, 2, 2};
constexpr uint64_t kDesignSeed = 20261122;

std::vector<Setup> DesignedCases() {
  std::vector<Setup> cases;
  const auto rows = testing_design::AllPairs(kDomains, kDesignSeed);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<int>& v = rows[r];
    Case k;
    k.row = static_cast<int>(r);
    k.mask = static_cast<fusedattn_mask>(v[0]);
    k.layout = static_cast<Layout>(v[1]);
    k.padded_strides = v[2];
    k.heads = v[3];
    k.window = v[4];
    k.bias = static_cast<fusedattn_bias>(v[5]);
    k.bias_broadcast = v[6];
    k.bias_in_qkv_dtype = v[7];
    k.softmax = static_cast<fusedattn_softmax>(v[8]);
    k.softcap = v[9];
    k.dropout = v[10];
    k.shape = v[11];
    k.dims = v[12];
    k.edge_lengths = v[13];
    k.o_float32 = v[14];
    k.explicit_scale = v[15];
    for (fusedattn_dtype d :
         {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FLOAT16, FUSEDATTN_DTYPE_BFLOAT16}) {
      k.dtype = d;
      Setup setup;
      setup.name = Format("r%02d_%s_%s_%s", k.row, MaskName(k.mask), LayoutName(k.layout),
                          DtypeShort(k.dtype));
      setup.config = ConfigOf(k);
      setup.options = OptionsOf(k, setup.config);
      setup.description = Describe(setup.config, setup.options) + Format(" (design row %d)", k.row);
      cases.push_back(setup);
    }
  }
  return cases;
}

// Forward outputs are the oracle's values rounded once into the output dtype, so the reference
// may differ from them by at most one rounding: |error| <= 2^-p |value| with p the significand
// bits (float32 24, float16 11, bfloat16 8).
double OneRounding(fusedattn_dtype d) {
  switch (d) {
    case FUSEDATTN_DTYPE_FLOAT32: return 1.2e-7;
    case FUSEDATTN_DTYPE_FLOAT16: return 9.8e-4;
    case FUSEDATTN_DTYPE_BFLOAT16: return 7.9e-3;
    default: return 0;
  }
}

// Gradients: one rounding into their dtype, or for float32 the effect of the float32 LSE the
// backward reads: it perturbs every probability by about |LSE| * 2^-24, and sums of gradient
// terms of both signs (dSink, dBias under broadcast) amplify that a few times.
double GradientTolerance(fusedattn_dtype out_dtype) {
  return std::max(OneRounding(out_dtype), 2e-6);
}

class ReferenceMatchesBruteForce : public ::testing::TestWithParam<Setup> {};

TEST_P(ReferenceMatchesBruteForce, Forward) {
  const fusedattn_config& c = GetParam().config;
  const std::string& where = GetParam().description;
  ProblemTensors t = MakeProblemTensors(c, GetParam().options);
  const brute_force::ExpectedOutputs want = brute_force::Expected(t, brute_force::Compute(t));
  const ProblemTensors inputs = t;

  test::Result r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r) << " in " << where;

  EXPECT_MATCHES("O", t.o, want.o, OneRounding(c.o_dtype), where);
  EXPECT_MATCHES("LSE", t.lse, want.lse, OneRounding(FUSEDATTN_DTYPE_FLOAT32), where);
  EXPECT_MATCHES("max_logit", t.max_logit, want.max_logit, OneRounding(FUSEDATTN_DTYPE_FLOAT32),
                 where);
  EXPECT_TRUE(test::SameBytes(t.q, inputs.q) && test::SameBytes(t.k, inputs.k) &&
              test::SameBytes(t.v, inputs.v) && test::SameBytes(t.bias, inputs.bias))
      << "the forward wrote into an input in " << where;
}

TEST_P(ReferenceMatchesBruteForce, Backward) {
  const fusedattn_config& c = GetParam().config;
  const std::string& where = GetParam().description;
  ProblemTensors t = MakeProblemTensors(c, GetParam().options);

  test::Result r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r) << " in " << where;
  // The oracle's D = dO . O from the O the backward is given (see brute_force.h).
  const brute_force::ExpectedOutputs want = brute_force::Expected(t, brute_force::Compute(t, &t.o));
  const ProblemTensors inputs = t;
  r = test::Backward(c, t.bwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r) << " in " << where;

  EXPECT_MATCHES("dQ", t.dq, want.dq, GradientTolerance(c.qkv_dtype), where);
  EXPECT_MATCHES("dK", t.dk, want.dk, GradientTolerance(c.qkv_dtype), where);
  EXPECT_MATCHES("dV", t.dv, want.dv, GradientTolerance(c.qkv_dtype), where);
  if (!want.dbias.empty())
    EXPECT_MATCHES("dBias", t.dbias, want.dbias, GradientTolerance(t.dbias.dtype()), where);
  if (!want.dsink.empty())
    EXPECT_MATCHES("dSink", t.dsink, want.dsink, GradientTolerance(FUSEDATTN_DTYPE_FLOAT32), where);
  EXPECT_TRUE(test::SameBytes(t.o, inputs.o) && test::SameBytes(t.lse, inputs.lse) &&
              test::SameBytes(t.q, inputs.q) && test::SameBytes(t.d_o, inputs.d_o))
      << "the backward wrote into an input in " << where;
}

std::string SetupName(const ::testing::TestParamInfo<Setup>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(AllPairs, ReferenceMatchesBruteForce, ::testing::ValuesIn(DesignedCases()),
                         SetupName);

// Problems drawn at random (deterministically from their index): shapes, lengths, strides and
// combinations of features that the design's fixed shapes do not reach.
Setup RandomSetup(int index) {
  std::mt19937_64 rng(0xC0FFEEull + static_cast<uint64_t>(index));
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const fusedattn_dtype dtypes[3] = {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FLOAT16,
                                     FUSEDATTN_DTYPE_BFLOAT16};
  const fusedattn_format formats[3] = {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_SBHD,
                                       FUSEDATTN_FORMAT_BHSD};
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.is_training = 1;
  c.return_max_logit = pick(2);
  c.batch = 1 + pick(4);
  c.heads_kv = 1 + pick(3);
  c.heads_q = c.heads_kv * (1 + pick(3));
  c.max_seqlen_q = 1 + pick(12), c.max_seqlen_kv = 1 + pick(12);
  c.head_dim_qk = 1 + pick(12), c.head_dim_v = 1 + pick(12);
  c.qkv_dtype = dtypes[pick(3)];
  c.o_dtype = pick(3) == 0 ? dtypes[pick(3)] : c.qkv_dtype;
  const bool thd = pick(4) == 0;
  for (fusedattn_format* f : {&c.q_format, &c.kv_format, &c.o_format, &c.do_format, &c.dqkv_format})
    *f = thd ? FUSEDATTN_FORMAT_THD : formats[pick(3)];
  c.mask = static_cast<fusedattn_mask>(pick(6));
  const bool causal = c.mask == FUSEDATTN_MASK_CAUSAL ||
                      c.mask == FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT ||
                      c.mask == FUSEDATTN_MASK_PADDING_CAUSAL ||
                      c.mask == FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.window_left = pick(3) == 0 ? pick(5) : -1;
  c.window_right = causal ? (pick(2) ? 0 : -1) : (pick(3) == 0 ? pick(5) : -1);
  c.bias_type = static_cast<fusedattn_bias>(pick(4));
  if (c.bias_type == FUSEDATTN_BIAS_PRE_SCALE || c.bias_type == FUSEDATTN_BIAS_POST_SCALE) {
    c.bias_batch = pick(2) ? 1 : c.batch;
    c.bias_heads = pick(2) ? 1 : c.heads_q;
    c.bias_requires_grad = pick(4) != 0;
  }
  c.softmax_type = static_cast<fusedattn_softmax>(pick(3));
  c.softcap = pick(3) == 0 ? 0.5 * (1 + pick(4)) : 0.0;
  c.dropout = pick(3) == 0 ? 0.05 + 0.3 * pick(3) : 0.0;
  c.attn_scale = pick(2) ? 0.0 : 0.1 + 0.2 * pick(5);
  TensorOptions o;
  o.seed = 5000 + static_cast<uint64_t>(index);
  o.padded_strides = pick(2);
  o.thd_gaps = thd && pick(2);
  o.lse_packed = thd && pick(2);
  o.input_range = 0.5 * (1 + pick(4));
  o.bias_dtype = pick(2) ? c.qkv_dtype : FUSEDATTN_DTYPE_FLOAT32;
  Setup setup{Format("random%03d_%s", index, DtypeShort(c.qkv_dtype)), c, o, ""};
  setup.description = Describe(c, o) + Format(" (random problem %d)", index);
  return setup;
}

std::vector<Setup> RandomCases() {
  std::vector<Setup> cases;
  for (int i = 0; i < 300; ++i) cases.push_back(RandomSetup(i));
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Random, ReferenceMatchesBruteForce, ::testing::ValuesIn(RandomCases()),
                         SetupName);

// Without training, LSE is written only when asked for, and O is the same either way.
TEST(ReferenceForward, WritesLseOnlyWhenAsked) {
  for (int return_lse : {0, 1}) {
    fusedattn_config c = FUSEDATTN_CONFIG_INIT;
    c.device = FUSEDATTN_DEVICE_CPU;
    c.batch = 2, c.heads_q = 2, c.heads_kv = 2, c.max_seqlen_q = 5, c.max_seqlen_kv = 6;
    c.head_dim_qk = 8, c.head_dim_v = 8;
    c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
    c.is_training = 0, c.return_lse = return_lse;
    ProblemTensors t = MakeProblemTensors(c, {});
    EXPECT_EQ(t.lse.empty(), return_lse == 0);
    const auto want = brute_force::Expected(t, brute_force::Compute(t));
    test::Result r = test::Forward(c, t.fwd_args());
    ASSERT_TRUE(r.ok()) << test::StatusText(r);
    EXPECT_MATCHES("O", t.o, want.o, OneRounding(FUSEDATTN_DTYPE_FLOAT32),
                   Format("return_lse=%d", return_lse));
    if (return_lse)
      EXPECT_MATCHES("LSE", t.lse, want.lse, OneRounding(FUSEDATTN_DTYPE_FLOAT32), "return_lse=1");
  }
}

// The design itself: every mask meets every layout and every value of every other feature.
TEST(AllPairsDesign, CoversEveryPairOfValues) {
  const std::vector<int>& domains = kDomains;
  const auto rows = testing_design::AllPairs(domains, kDesignSeed);
  for (size_t a = 0; a < domains.size(); ++a)
    for (size_t b = a + 1; b < domains.size(); ++b)
      for (int va = 0; va < domains[a]; ++va)
        for (int vb = 0; vb < domains[b]; ++vb) {
          bool found = false;
          for (const auto& row : rows) found |= row[a] == va && row[b] == vb;
          EXPECT_TRUE(found) << "parameters " << a << "=" << va << " and " << b << "=" << vb;
        }
  std::printf("[ design ] %zu all-pairs rows x 3 dtypes\n", rows.size());
}

}  // namespace
}  // namespace fusedattn
