// The flash backend's Hopper kernels (wgmma + TMA, src/backends/flash/fwd_kernel_sm90.cuh and
// bwd_kernel_sm90.cuh) against the CPU reference, on a GPU.
//
//  * FlashWgmmaTile.*: one warpgroup MMA tile (sm90.h's WgmmaTileSelfTest) against a CPU
//    matmul: the descriptors and the 128-byte swizzle, apart from the attention logic (mode 3,
//    MnMajorA, is the backward's dQ = dS K with the transpose-A bit; modes 4 and 5 the d256
//    forward's m64n80 S = Q K^T from four TMA boxes and m64n256 O += P V).
//  * FlashWgmma/FlashWgmmaCase.*: forward cases (masks, lengths, layouts, GQA, sinks, softcap and
//    ALiBi: the softcap-alibi variant; pre- and post-scale bias tensors: the bias variant) for bf16
//    and fp16 at head dims 64, 128 and 256: O, LSE and max_logit against the reference with the
//    tolerances of shared/DESIGN.md, poisoned outputs, and on an sm_90 device the check that the
//    call's plan (flash::PlanForwardCall, planner.h) is the wgmma kernel: the backend runs the
//    plan, and a Hopper launcher that declines what the plan chose is an error, not a fall-back;
//    the plan's variant is dropout exactly when the problem has dropout, else bias exactly when it
//    has a bias tensor, else softcap-alibi exactly when it has softcap or ALiBi. Dropout cases
//    (the dropout variant) compare O exactly like the others: the reference draws the same mask.
//  * FlashWgmma.Dropout*: the Hopper forward's dropout mask against the reference's bit for bit,
//    and a Hopper dropout forward followed by the mma.sync backward (no Hopper backward has
//    dropout): gradients against the reference, and the backward's mask against the forward's.
//  * FlashWgmma.*: a large case, the dispatch rule, and FlashWgmmaSanitize.* for
//    compute-sanitizer:
//      compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashWgmmaSanitize*'
//      compute-sanitizer --tool racecheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashWgmmaSanitize*'
//  * FlashWgmmaBwd/FlashWgmmaBwdCase.*, FlashWgmmaBwd.*, FlashWgmmaBwdSanitize.*: the same for the
//    backward (dQ, dK, dV, dsink from the reference's O and LSE, NaN in the padding rows of q, k,
//    v and dO; softcap and ALiBi: its softcap-alibi variant), checking the plan
//    (flash::PlanBackwardCall) and its variant; all of the backward's tests:
//      --gtest_filter='FlashWgmmaBwd*:FlashWgmmaTiles/FlashWgmmaTile.MatchesCpuMatmul/MnMajorA*'
//    Deterministic mode (config.deterministic: the Hopper backward's deterministic instances, dQ
//    fixed-order+convert): the deterministic_* cases against the reference, and
//    FlashWgmmaBwd.Deterministic* bitwise identical dQ, dK, dV over runs on shapes with many key
//    blocks per query tile.
// Without a CUDA device every test skips; on a device that is not sm_90 (or with
// FUSEDATTN_FLASH_WGMMA=0) the attention cases still run, on the mma.sync kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
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
#ifdef FUSEDATTN_WITH_FLASH
#include "backends/flash/planner.h"
#include "backends/flash/sm90.h"
#endif

namespace fusedattn::testing {
namespace {

// Whether forwards on this device and build are expected to take the wgmma kernel.
bool WgmmaExpected() {
#ifdef FUSEDATTN_WITH_FLASH
  const flash::DeviceFacts d = flash::CurrentDeviceFacts();
  return d.sm90a_kernels && d.wgmma_allowed && d.compute_capability == 90;
#else
  return false;
#endif
}

// Whether the flash plan of this call (what the backend runs) is the wgmma kernel; when it is,
// its variant must be the one of the problem's score modifiers.
bool ForwardPlanIsWgmma(const fusedattn_config& config, const fusedattn_fwd_args& args) {
#ifdef FUSEDATTN_WITH_FLASH
  flash::ForwardPlan plan;
  Status s = flash::PlanForwardCall(config, args, &plan);
  EXPECT_TRUE(s.ok()) << s.message();
  if (plan.path != flash::KernelPath::kHopperWgmma) return false;
  const bool bias = config.bias_type == FUSEDATTN_BIAS_PRE_SCALE ||
                    config.bias_type == FUSEDATTN_BIAS_POST_SCALE;
  const bool modifiers = config.softcap > 0.0 || config.bias_type == FUSEDATTN_BIAS_ALIBI;
  EXPECT_EQ(plan.variant, config.dropout > 0.0 ? flash::KernelVariant::kDropout
                          : bias               ? flash::KernelVariant::kBias
                          : modifiers          ? flash::KernelVariant::kSoftcapAlibi
                                               : flash::KernelVariant::kPlain)
      << flash::DescribeForwardPlan(plan);
  return true;
#else
  return false;
#endif
}

bool BackwardPlanIsWgmma(const fusedattn_config& config, const fusedattn_bwd_args& args) {
#ifdef FUSEDATTN_WITH_FLASH
  flash::BackwardPlan plan;
  Status s = flash::PlanBackwardCall(config, args, &plan);
  EXPECT_TRUE(s.ok()) << s.message();
  if (plan.path != flash::KernelPath::kHopperWgmma) return false;
  const bool modifiers = config.softcap > 0.0 || config.bias_type == FUSEDATTN_BIAS_ALIBI;
  EXPECT_EQ(plan.variant,
            modifiers ? flash::KernelVariant::kSoftcapAlibi : flash::KernelVariant::kPlain)
      << flash::DescribeBackwardPlan(plan);
  EXPECT_EQ(plan.dq, config.deterministic ? flash::DqMode::kFixedOrderThenConvert
                                          : flash::DqMode::kAtomicThenConvert)
      << flash::DescribeBackwardPlan(plan);
  return true;
#else
  return false;
#endif
}

bool DeviceIsSm90() {
#ifdef FUSEDATTN_WITH_CUDA
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

fusedattn_config Config(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                        fusedattn_dtype dtype) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = dtype;
  c.is_training = 1;  // LSE
  c.return_max_logit = 1;
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_FLASH;
  return c;
}

void SetFormats(fusedattn_config* c, fusedattn_format f) {
  c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format = f;
}

// NaN in every element of q, k, v and dO rows past their sequence's length (BSHD/SBHD/BHSD with a
// padding mask): a kernel must never let them into a visible result (0 * NaN = NaN).
void PoisonPaddingRows(ProblemTensors* t) {
  const auto& c = t->config;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto poison = [&](HostTensor& x, fusedattn_format f, const std::vector<int32_t>& lens,
                    int64_t seqlen, int64_t heads, int64_t dim) {
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t s = lens[b]; s < seqlen; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d) {
            std::vector<int64_t> index;
            switch (f) {
              case FUSEDATTN_FORMAT_BSHD: index = {b, s, h, d}; break;
              case FUSEDATTN_FORMAT_SBHD: index = {s, b, h, d}; break;
              case FUSEDATTN_FORMAT_BHSD: index = {b, h, s, d}; break;
              default: return;
            }
            x.set(x.offset_of(index), nan);
          }
  };
  poison(t->q, c.q_format, t->len_q, c.max_seqlen_q, c.heads_q, c.head_dim_qk);
  poison(t->k, c.kv_format, t->len_kv, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk);
  poison(t->v, c.kv_format, t->len_kv, c.max_seqlen_kv, c.heads_kv, c.head_dim_v);
  if (!t->d_o.empty())
    poison(t->d_o, c.do_format, t->len_q, c.max_seqlen_q, c.heads_q, c.head_dim_v);
}

// Layouts of a bias tensor [bias_batch, bias_heads, max_seqlen_q, max_seqlen_kv] in the tests:
// as MakeProblemTensors made it (contiguous, random everywhere), or a layout whose storage is NaN
// everywhere except at the elements some sequence reads (rows < len_q and keys < len_kv of a
// sequence that uses that bias batch): an element read from the wrong place (a wrong stride,
// sequence or row start, the gaps of a strided layout) poisons O, and one past a sequence's end
// is never visible (the sanitizer cases catch reads past the tensor).
enum class BiasLayout {
  kAsMade,
  kDenseNanOutside,     // contiguous
  kOddRowsNanOutside,   // keys contiguous, rows max_seqlen_kv + 3 apart (odd: no paired loads)
  kKeysMajorNanOutside, // the queries contiguous, keys max_seqlen_q + 1 apart
};

void RelayoutBias(ProblemTensors* t, BiasLayout layout) {
  if (layout == BiasLayout::kAsMade || t->bias.empty()) return;
  const auto& c = t->config;
  const int64_t bb = c.bias_batch, bh = c.bias_heads, sq = c.max_seqlen_q, sk = c.max_seqlen_kv;
  std::vector<int64_t> strides;
  switch (layout) {
    case BiasLayout::kDenseNanOutside: strides = {bh * sq * sk, sq * sk, sk, 1}; break;
    case BiasLayout::kOddRowsNanOutside: {
      const int64_t head = sq * (sk + 3) + 1;
      strides = {bh * head + 1, head, sk + 3, 1};
      break;
    }
    default: strides = {bh * sk * (sq + 1), sk * (sq + 1), 1, sq + 1}; break;
  }
  const std::vector<int64_t> shape = {bb, bh, sq, sk};
  int64_t storage = 1;
  for (int x = 0; x < 4; ++x) storage += (shape[x] - 1) * strides[x];
  HostTensor bias(t->bias.dtype(), shape, strides, storage);
  bias.fill(std::numeric_limits<double>::quiet_NaN());
  for (int64_t b = 0; b < bb; ++b)
    for (int64_t h = 0; h < bh; ++h)
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j) {
          bool read = false;  // by a sequence of this bias batch
          for (int64_t s = 0; s < c.batch && !read; ++s)
            read = (bb == 1 || s == b) && i < t->len_q[s] && j < t->len_kv[s];
          if (read) bias.set(bias.offset_of({b, h, i, j}), t->bias.at({b, h, i, j}));
        }
  t->bias = std::move(bias);
}

struct Case {
  std::string name;
  fusedattn_config config;
  TensorOptions options;
  bool poison_padding = false;
  bool expect_wgmma = true;  // on an sm_90 device with the path enabled
  BiasLayout bias_layout = BiasLayout::kAsMade;
};

// Forward on flash (device) and on the reference (host) from the same inputs; O, LSE and
// max_logit compared; whether the wgmma kernel ran checked against `expect_wgmma`.
void ExpectForwardMatches(const Case& k) {
#ifdef FUSEDATTN_WITH_CUDA
  SCOPED_TRACE(k.name);
  ProblemTensors host = MakeProblemTensors(k.config, k.options);
  if (k.poison_padding) PoisonPaddingRows(&host);
  RelayoutBias(&host, k.bias_layout);
  ProblemTensors ref = host;
  ref.config.backend = FUSEDATTN_BACKEND_REFERENCE;
  ref.config.device = FUSEDATTN_DEVICE_CPU;
  ASSERT_NO_THROW(Forward(ref.config, ref.fwd_args())) << "reference forward";
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  size_t bytes = 0;  // THD on the wgmma kernel: the tile schedule
  ASSERT_NO_THROW(bytes = FwdWorkspaceSize(k.config));
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(bytes == 0 || workspace.ptr) << "cudaMalloc of " << bytes << " bytes";
  try {
    Forward(k.config, dev.fwd_args(), workspace.ptr, bytes);
  } catch (const Error& e) {
    FAIL() << "flash forward failed: " << e.what();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const bool used = ForwardPlanIsWgmma(k.config, dev.fwd_args());
  if (WgmmaExpected())
    EXPECT_EQ(used, k.expect_wgmma) << "wgmma path " << (used ? "taken" : "not taken");
  else
    EXPECT_FALSE(used);
  ASSERT_TRUE(dev.download_outputs(&host, &error)) << error;
  const double tol = Tolerance(k.config.qkv_dtype);
  ExpectClose("O", host.o, ref.o, tol);
  ExpectClose("LSE", host.lse, ref.lse, tol);
  ExpectClose("max_logit", host.max_logit, ref.max_logit, tol);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Backward on flash (device) and on the reference (host) from the same inputs and the
// reference's O and LSE (as flash_test.cpp); dQ, dK, dV and dsink compared; whether the wgmma
// key-block kernel ran checked against `expect_wgmma`.
void ExpectBackwardMatches(const Case& k) {
#ifdef FUSEDATTN_WITH_CUDA
  SCOPED_TRACE(k.name + " (backward)");
  ProblemTensors host = MakeProblemTensors(k.config, k.options);
  if (k.poison_padding) PoisonPaddingRows(&host);
  ProblemTensors ref = host;
  ref.config.backend = FUSEDATTN_BACKEND_REFERENCE;
  ref.config.device = FUSEDATTN_DEVICE_CPU;
  ASSERT_NO_THROW(Forward(ref.config, ref.fwd_args())) << "reference forward";
  host.o = ref.o;
  host.lse = ref.lse;
  ASSERT_NO_THROW(Backward(ref.config, ref.bwd_args())) << "reference backward";
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;  // dq, dk, dv, dsink poisoned
  size_t bytes = 0;
  ASSERT_NO_THROW(bytes = BwdWorkspaceSize(k.config));
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(bytes == 0 || workspace.ptr) << "cudaMalloc of " << bytes << " bytes";
  try {
    Backward(k.config, dev.bwd_args(), workspace.ptr, bytes);
  } catch (const Error& e) {
    FAIL() << "flash backward failed: " << e.what();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const bool used = BackwardPlanIsWgmma(k.config, dev.bwd_args());
  if (WgmmaExpected())
    EXPECT_EQ(used, k.expect_wgmma) << "wgmma backward " << (used ? "taken" : "not taken");
  else
    EXPECT_FALSE(used);
  ASSERT_TRUE(dev.download_outputs(&host, &error)) << error;
  const double tol = Tolerance(k.config.qkv_dtype);
  ExpectClose("dQ", host.dq, ref.dq, tol);
  ExpectClose("dK", host.dk, ref.dk, tol);
  ExpectClose("dV", host.dv, ref.dv, tol);
  ExpectClose("dsink", host.dsink, ref.dsink, tol);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// ------------------------------------------------------------------------------------------------
// One wgmma tile against a CPU matmul
// ------------------------------------------------------------------------------------------------

#ifdef FUSEDATTN_WITH_FLASH
void ExpectTileMatches(int mode, fusedattn_dtype dtype) {
  const bool bf16 = dtype == FUSEDATTN_DTYPE_BFLOAT16;
  // mode 0, 2: C[64][64] = A[64][128] B[64][128]^T; mode 1: C[64][128] = A[64][64] B[64][128];
  // mode 3: C[64][64] = At[128][64]^T B[128][64]; mode 4: C[64][80] = A[64][256] B[80][256]^T;
  // mode 5: C[64][256] = A[64][80] B[80][256].
  const int m = 64;
  const int n = mode == 1 ? 128 : mode == 4 ? 80 : mode == 5 ? 256 : 64;
  const int k = mode == 1 ? 64 : mode == 4 ? 256 : mode == 5 ? 80 : 128;
  const bool b_is_kn = mode == 1 || mode == 3 || mode == 5;  // B stored [k][n], else [n][k]
  HostTensor a(dtype, mode == 3 ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}),
      b(dtype, b_is_kn ? std::vector<int64_t>{k, n} : std::vector<int64_t>{n, k});
  std::mt19937_64 rng(77 + mode);
  a.fill_uniform(rng, -1, 1);
  b.fill_uniform(rng, -1, 1);
  std::vector<double> expected(m * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int x = 0; x < k; ++x)
        sum += (mode == 3 ? a.get(x * m + i) : a.get(i * k + x)) *
               (b_is_kn ? b.get(x * n + j) : b.get(j * k + x));
      expected[i * n + j] = sum;
    }
  void *da = nullptr, *db = nullptr, *dc = nullptr;
  ASSERT_EQ(cudaMalloc(&da, a.storage_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, b.storage_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc, sizeof(float) * m * n), cudaSuccess);
  cudaMemcpy(da, a.data(), a.storage_bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.storage_bytes(), cudaMemcpyHostToDevice);
  cudaMemset(dc, 0xFF, sizeof(float) * m * n);  // NaN: an unwritten element fails
  Status status = flash::WgmmaTileSelfTest(mode, bf16, da, db, static_cast<float*>(dc), nullptr);
  EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> c(m * n);
  cudaMemcpy(c.data(), dc, sizeof(float) * m * n, cudaMemcpyDeviceToHost);
  cudaFree(da), cudaFree(db), cudaFree(dc);
  double err = 0, norm = 0, worst = 0;
  int worst_at = -1, nan = 0;
  for (int e = 0; e < m * n; ++e) {
    if (!std::isfinite(c[e])) ++nan;
    const double d = c[e] - expected[e];
    err += d * d, norm += expected[e] * expected[e];
    if (!(std::fabs(d) <= worst)) worst = std::fabs(d), worst_at = e;
  }
  EXPECT_EQ(nan, 0);
  EXPECT_LT(std::sqrt(err / norm), 1e-5)
      << "largest error " << worst << " at row " << worst_at / n << " column " << worst_at % n
      << ": got " << c[worst_at] << ", expected " << expected[worst_at];
}
#endif

class FlashWgmmaTile : public ::testing::TestWithParam<std::tuple<int, fusedattn_dtype>> {};

TEST_P(FlashWgmmaTile, MatchesCpuMatmul) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_FLASH
  if (!flash::WgmmaCompiled()) GTEST_SKIP() << "built without sm_90a kernels";
  if (!DeviceIsSm90()) GTEST_SKIP() << "the device is not sm_90";
  ExpectTileMatches(std::get<0>(GetParam()), std::get<1>(GetParam()));
#endif
}

std::string TileName(const ::testing::TestParamInfo<FlashWgmmaTile::ParamType>& info) {
  static const char* kModes[] = {"SsKMajor",  "RsMnMajor",         "SsKMajorTma",
                                 "MnMajorA", "SsKMajorTmaD256N80", "RsMnMajorN256K80"};
  return std::string(kModes[std::get<0>(info.param)]) +
         (std::get<1>(info.param) == FUSEDATTN_DTYPE_BFLOAT16 ? "Bf16" : "Fp16");
}

INSTANTIATE_TEST_SUITE_P(
    FlashWgmmaTiles, FlashWgmmaTile,
    ::testing::Combine(::testing::Values(0, 1, 2, 3, 4, 5),
                       ::testing::Values(FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16)),
    TileName);

// ------------------------------------------------------------------------------------------------
// Forward cases: every one for bf16/fp16 x d64/d128/d256
// ------------------------------------------------------------------------------------------------

// The cases the forward and backward lists share, at the same place in both (the seeds follow
// the position). Second and third: causal, and bottom-right with sq < skv.
template <typename Add>
void CausalCases(fusedattn_dtype dtype, int64_t d, Add& add) {
  {
    fusedattn_config c = Config(2, 4, 4, 300, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    add("causal", c);
  }
  {
    fusedattn_config c = Config(2, 4, 2, 77, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    add("causal_bottom_right_sq_lt_skv", c);
  }
}

// Further on: fully masked rows, windows, padding and THD with uneven lengths.
template <typename Add>
void MaskAndLayoutCases(fusedattn_dtype dtype, int64_t d, Add& add) {
  {
    fusedattn_config c = Config(2, 2, 2, 150, 40, d, dtype);  // first 110 rows see no key
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    add("fully_masked_rows_with_sink", c);
  }
  {
    fusedattn_config c = Config(2, 4, 4, 333, 280, d, dtype);
    c.window_left = 100, c.window_right = 20;
    add("window_100_20", c);
  }
  {
    fusedattn_config c = Config(1, 4, 4, 400, 400, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.window_left = 130;
    add("causal_window_130", c);
  }
  {
    fusedattn_config c = Config(4, 4, 2, 200, 180, d, dtype);
    c.mask = FUSEDATTN_MASK_PADDING;
    TensorOptions o;
    o.len_q = {200, 0, 77, 130};
    o.len_kv = {180, 50, 0, 129};
    add("padding_uneven_with_empty_nan_in_padding", c, o, true);
  }
  {
    fusedattn_config c = Config(3, 4, 4, 260, 250, d, dtype);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    TensorOptions o;
    o.len_q = {1, 260, 129};
    o.len_kv = {250, 3, 200};
    add("padding_causal_bottom_right_nan_in_padding", c, o, true);
  }
  {
    fusedattn_config c = Config(5, 4, 2, 150, 170, d, dtype);
    SetFormats(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    TensorOptions o;
    o.len_q = {150, 0, 17, 1, 129};
    o.len_kv = {170, 5, 0, 64, 129};
    o.thd_gaps = true;
    add("thd_uneven_with_empty_gaps", c, o);
    o.thd_gaps = false;
    o.lse_packed = true;
    c.mask = FUSEDATTN_MASK_PADDING;
    add("thd_uneven_packed_lse", c, o);
  }
}

// Softcap and ALiBi (the softcap-alibi variant of the Hopper forward): each alone and both, with
// the masks, windows, GQA, padding (NaN in the padding rows: the mask must come after tanh) and
// THD. A softcap of 0.8 saturates most scores (|scale q.k| reaches ~1), 5 few; the test slopes
// (2^(-8 (h + 1) / heads)) make ALiBi dominate the far keys.
template <typename Add>
void SoftcapAlibiCases(fusedattn_dtype dtype, int64_t d, Add& add) {
  {
    fusedattn_config c = Config(2, 4, 4, 300, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.softcap = 0.8;
    add("softcap_causal", c);
    c.mask = FUSEDATTN_MASK_NONE;
    c.softcap = 0.0;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    add("alibi", c);
  }
  {
    fusedattn_config c = Config(2, 4, 2, 333, 280, d, dtype);
    c.window_left = 100, c.window_right = 20;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    add("alibi_window_100_20_gqa", c);
    c.softcap = 5.0;
    add("softcap_alibi_window_100_20_gqa", c);
  }
  {
    fusedattn_config c = Config(2, 6, 2, 77, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    c.softcap = 0.8;
    add("softcap_alibi_gqa3_causal_bottom_right_sq_lt_skv", c);
  }
  {
    fusedattn_config c = Config(2, 2, 2, 150, 40, d, dtype);  // first 110 rows see no key
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    c.softcap = 0.8;
    add("softcap_fully_masked_rows_with_sink", c);
  }
  {
    fusedattn_config c = Config(3, 4, 4, 260, 250, d, dtype);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    c.softcap = 0.8;
    TensorOptions o;
    o.len_q = {1, 260, 129};
    o.len_kv = {250, 3, 200};
    add("softcap_alibi_padding_causal_nan_in_padding", c, o, true);
  }
  {
    fusedattn_config c = Config(5, 4, 2, 150, 170, d, dtype);
    SetFormats(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    c.softcap = 0.8;
    TensorOptions o;
    o.len_q = {150, 0, 17, 1, 129};
    o.len_kv = {170, 5, 0, 64, 129};
    o.thd_gaps = true;
    add("softcap_alibi_thd_uneven_with_empty_gaps", c, o);
    o.thd_gaps = false;
    o.lse_packed = true;  // the heavy-first schedule
    c.mask = FUSEDATTN_MASK_PADDING;
    c.softcap = 0.0;
    add("alibi_thd_uneven_packed_lse", c, o);
  }
}

// Bias tensors (the bias variant of the Hopper forward): pre- and post-scale, in the qkv dtype
// and float32, shared by all (bias_batch = bias_heads = 1), per head, per sequence and full, with
// and without softcap, through the masks, windows, GQA, sinks, padding and THD, in contiguous
// and strided layouts with NaN wherever no sequence reads (BiasLayout); lengths end mid-tile.
template <typename Add>
void BiasCases(fusedattn_dtype dtype, int64_t d, Add& add) {
  TensorOptions qkv_bias;
  qkv_bias.bias_dtype = dtype;
  TensorOptions f32_bias;
  f32_bias.bias_dtype = FUSEDATTN_DTYPE_FLOAT32;
  {
    fusedattn_config c = Config(2, 4, 4, 300, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;  // [1, 1, 300, 300]
    add("post_bias_shared_causal", c, qkv_bias);
    c.softcap = 0.8;
    add("softcap_post_bias_shared_causal", c, qkv_bias);
  }
  {
    fusedattn_config c = Config(2, 4, 2, 333, 280, d, dtype);
    c.window_left = 100, c.window_right = 20;
    c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
    c.bias_batch = 2, c.bias_heads = 4;
    add("pre_bias_full_f32_window_100_20_gqa", c, f32_bias);
    c.softcap = 5.0;
    add("softcap_pre_bias_full_f32_window_100_20_gqa", c, f32_bias);
  }
  {
    fusedattn_config c = Config(2, 6, 2, 77, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    c.bias_batch = 2;  // shared by the heads: the heads-fastest grid
    add("post_bias_per_sequence_odd_rows_causal_bottom_right", c, qkv_bias, false,
        BiasLayout::kOddRowsNanOutside);
  }
  {
    fusedattn_config c = Config(2, 4, 4, 200, 190, d, dtype);
    c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
    c.bias_heads = 4;
    add("pre_bias_per_head_f32_keys_major", c, f32_bias, false, BiasLayout::kKeysMajorNanOutside);
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    add("post_bias_per_head_keys_major", c, qkv_bias, false, BiasLayout::kKeysMajorNanOutside);
  }
  {
    fusedattn_config c = Config(2, 2, 2, 150, 40, d, dtype);  // first 110 rows see no key
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    add("post_bias_fully_masked_rows_with_sink", c, qkv_bias);
  }
  {
    fusedattn_config c = Config(3, 4, 4, 260, 250, d, dtype);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    c.bias_batch = 3, c.bias_heads = 4;
    TensorOptions o = qkv_bias;
    o.len_q = {1, 260, 129};
    o.len_kv = {250, 3, 200};
    add("post_bias_full_padding_causal_nan_outside", c, o, true, BiasLayout::kDenseNanOutside);
    c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
    c.bias_batch = 1, c.bias_heads = 1;
    c.softcap = 0.8;
    o.bias_dtype = FUSEDATTN_DTYPE_FLOAT32;
    add("softcap_pre_bias_shared_f32_padding_odd_rows_nan_outside", c, o, true,
        BiasLayout::kOddRowsNanOutside);
  }
  {
    fusedattn_config c = Config(5, 4, 2, 150, 170, d, dtype);
    SetFormats(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
    c.bias_batch = 5;
    TensorOptions o = f32_bias;
    o.len_q = {150, 0, 17, 1, 129};
    o.len_kv = {170, 5, 0, 64, 129};
    o.thd_gaps = true;
    add("pre_bias_per_sequence_f32_thd_uneven_with_empty_gaps", c, o, false,
        BiasLayout::kDenseNanOutside);
    o.thd_gaps = false;
    o.lse_packed = true;  // the heavy-first schedule
    o.bias_dtype = dtype;
    c.mask = FUSEDATTN_MASK_PADDING;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    c.bias_batch = 1, c.bias_heads = 4;
    c.softcap = 0.8;
    add("softcap_post_bias_per_head_thd_packed_lse_keys_major", c, o, false,
        BiasLayout::kKeysMajorNanOutside);
  }
  {
    // From 4096 keys d64 runs its long-key tile (Sm90ForwardKeysPerStep).
    fusedattn_config c = Config(1, 2, 1, 130, 4200, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    add("long_keys_post_bias_shared_causal_bottom_right_mqa", c, qkv_bias);
  }
}

// Dropout (the dropout variant of the Hopper forward): drop probabilities 0.1 to 0.9, causal and
// not, windows, GQA and MQA, softcap and ALiBi, sinks, fully masked rows, padding with NaN, THD on
// both grids, d64's long-key tile. O is compared with the reference's, which drops the same
// elements (fusedattn.h's Philox numbering); FlashWgmma.DropoutMaskIsTheReferenceMaskBitForBit
// checks the mask alone, element by element.
template <typename Add>
void DropoutCases(fusedattn_dtype dtype, int64_t d, Add& add) {
  {
    fusedattn_config c = Config(2, 4, 4, 200, 200, d, dtype);
    for (int percent : {10, 50, 90}) {
      c.dropout = percent / 100.0;
      add("dropout_" + std::to_string(percent), c);
    }
  }
  {
    fusedattn_config c = Config(2, 4, 4, 300, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.dropout = 0.2;
    add("dropout_causal", c);
  }
  {
    fusedattn_config c = Config(2, 6, 2, 77, 300, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.dropout = 0.3;
    add("dropout_gqa3_causal_bottom_right_sq_lt_skv", c);
  }
  {
    fusedattn_config c = Config(2, 4, 2, 333, 280, d, dtype);
    c.window_left = 100, c.window_right = 20;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    c.softcap = 5.0;
    c.dropout = 0.25;
    add("dropout_softcap_alibi_window_100_20_gqa", c);
    c.bias_type = FUSEDATTN_BIAS_NONE;
    c.softcap = 0.8;
    add("dropout_softcap_window_100_20_gqa", c);
  }
  {
    fusedattn_config c = Config(2, 2, 2, 150, 40, d, dtype);  // first 110 rows see no key
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    c.dropout = 0.5;
    add("dropout_fully_masked_rows_with_sink", c);
  }
  {
    fusedattn_config c = Config(3, 4, 4, 260, 250, d, dtype);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    c.dropout = 0.3;
    TensorOptions o;
    o.len_q = {1, 260, 129};
    o.len_kv = {250, 3, 200};
    add("dropout_padding_causal_nan_in_padding", c, o, true);
  }
  {
    fusedattn_config c = Config(5, 4, 2, 150, 170, d, dtype);
    SetFormats(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    c.dropout = 0.4;
    TensorOptions o;
    o.len_q = {150, 0, 17, 1, 129};
    o.len_kv = {170, 5, 0, 64, 129};
    o.thd_gaps = true;
    add("dropout_thd_uneven_with_empty_gaps", c, o);
    o.thd_gaps = false;
    o.lse_packed = true;  // the heavy-first schedule
    c.mask = FUSEDATTN_MASK_PADDING;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    add("dropout_alibi_thd_uneven_packed_lse", c, o);
  }
  {
    // From 4096 keys d64 runs its long-key tile (Sm90ForwardKeysPerStep).
    fusedattn_config c = Config(1, 2, 1, 130, 4200, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.dropout = 0.15;
    add("dropout_long_keys_causal_bottom_right_mqa", c);
  }
}

std::vector<Case> CasesFor(fusedattn_dtype dtype, int64_t d) {
  std::vector<Case> cases;
  auto add = [&](std::string name, fusedattn_config c, TensorOptions o = {},
                 bool poison_padding = false, BiasLayout bias_layout = BiasLayout::kAsMade) {
    o.seed = 4000 + cases.size() * 13 + d;
    // max_seqlen_q <= 16 runs on the decode kernel (flash_decode_test.cpp), not on wgmma, at the
    // head dims it is built for (64 and 128).
    const bool decode = c.max_seqlen_q <= 16 && c.head_dim_qk == c.head_dim_v &&
                        (c.head_dim_qk == 64 || c.head_dim_qk == 128);
    cases.push_back({name, c, o, poison_padding, !decode, bias_layout});
  };
  add("no_mask", Config(2, 4, 4, 200, 200, d, dtype));
  CausalCases(dtype, d, add);
  MaskAndLayoutCases(dtype, d, add);
  {
    fusedattn_config c = Config(2, 6, 2, 257, 257, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    add("gqa_group3_causal", c);
  }
  {
    fusedattn_config c = Config(2, 4, 1, 129, 300, d, dtype);
    add("mqa_uneven_tiles", c);
  }
  for (auto [sq, skv] : {std::pair<int64_t, int64_t>{1, 1000}, {1000, 1}, {129, 257}, {17, 33}}) {
    fusedattn_config c = Config(2, 2, 2, sq, skv, d, dtype);
    add("lengths_" + std::to_string(sq) + "_" + std::to_string(skv), c);
  }
  if (d == 256) {
    // The 256 instance with zero-filled columns: the last 64-column box of q and k, the last two
    // of v, lie wholly outside the tensors.
    fusedattn_config c = Config(2, 2, 2, 190, 190, d, dtype);
    c.head_dim_qk = 192;
    c.head_dim_v = 128;
    c.mask = FUSEDATTN_MASK_CAUSAL;
    add("head_dim_qk192_v128", c);
  } else {
    fusedattn_config c = Config(2, 2, 2, 190, 190, d, dtype);
    c.head_dim_qk = d == 128 ? 128 : 40;  // zero-filled columns of the 64 instance
    c.head_dim_v = 64;
    c.mask = FUSEDATTN_MASK_CAUSAL;
    add(d == 128 ? "head_dim_qk128_v64" : "head_dim_qk40_v64", c);
  }
  {
    fusedattn_config c = Config(2, 4, 4, 160, 230, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    add("learnable_sink", c);
    c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
    add("off_by_one", c);
  }
  {
    fusedattn_config c = Config(2, 4, 2, 140, 200, d, dtype);
    SetFormats(&c, FUSEDATTN_FORMAT_BHSD);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    add("bhsd", c);
    SetFormats(&c, FUSEDATTN_FORMAT_SBHD);
    add("sbhd", c);
    c.q_format = FUSEDATTN_FORMAT_BSHD, c.kv_format = FUSEDATTN_FORMAT_BHSD;
    c.o_format = FUSEDATTN_FORMAT_SBHD;
    add("mixed_formats", c);
  }
  {
    fusedattn_config c = Config(1, 2, 2, 100, 100, d, dtype);
    c.attn_scale = 0.3;
    add("custom_scale", c);
  }
  SoftcapAlibiCases(dtype, d, add);
  {
    // From 4096 keys d64 runs its long-key tile (sm90.h, Sm90ForwardKeysPerStep): its masks, a
    // sequence ending mid-tile, the half tile at the end of the keys and the softcap-alibi
    // variant on problems above that length (the other head dims run their one tile).
    fusedattn_config c = Config(1, 2, 1, 130, 4200, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    add("long_keys_causal_bottom_right_mqa", c);
    c.mask = FUSEDATTN_MASK_PADDING;
    TensorOptions o;
    o.len_q = {97};
    o.len_kv = {4100};
    add("long_keys_padding_nan_in_padding", c, o, true);
    c.mask = FUSEDATTN_MASK_NONE;
    c.max_seqlen_kv = 4096;
    c.softcap = 5.0;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    add("long_keys_4096_softcap_alibi", c);
  }
  BiasCases(dtype, d, add);
  DropoutCases(dtype, d, add);
  return cases;
}

struct ForwardParam {
  fusedattn_dtype dtype;
  int64_t d;
  Case c;
};

std::vector<ForwardParam> AllForwardCases() {
  std::vector<ForwardParam> all;
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16})
    for (int64_t d : {64, 128, 256})
      for (Case& c : CasesFor(dtype, d)) all.push_back({dtype, d, c});
  return all;
}

class FlashWgmmaCase : public ::testing::TestWithParam<ForwardParam> {};

TEST_P(FlashWgmmaCase, ForwardMatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  ExpectForwardMatches(GetParam().c);
}

INSTANTIATE_TEST_SUITE_P(FlashWgmma, FlashWgmmaCase, ::testing::ValuesIn(AllForwardCases()),
                         [](const ::testing::TestParamInfo<ForwardParam>& info) {
                           const ForwardParam& p = info.param;
                           return std::string(p.dtype == FUSEDATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16") +
                                  "_d" + std::to_string(p.d) + "_" + p.c.name;
                         });

// ------------------------------------------------------------------------------------------------
// Named cases
// ------------------------------------------------------------------------------------------------

TEST(FlashWgmma, LargeBf16HeadDim128) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(2, 4, 4, 2048, 2048, 128, FUSEDATTN_DTYPE_BFLOAT16);
  ExpectForwardMatches({"b2 h4 s2048 d128 bf16", c, {}, false, true});
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectForwardMatches({"b2 h4 s2048 d128 bf16 causal", c, {}, false, true});
}

TEST(FlashWgmma, LargeFp16HeadDim64Gqa) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(2, 4, 2, 2048, 2048, 64, FUSEDATTN_DTYPE_FLOAT16);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectForwardMatches({"b2 h4/2 s2048 d64 fp16 causal", c, {}, false, true});
}

TEST(FlashWgmma, LargeBf16HeadDim256) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(1, 4, 2, 1200, 1200, 256, FUSEDATTN_DTYPE_BFLOAT16);
  ExpectForwardMatches({"b1 h4/2 s1200 d256 bf16", c, {}, false, true});
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectForwardMatches({"b1 h4/2 s1200 d256 bf16 causal", c, {}, false, true});
}

// Head dim 256 walks 80 keys per step: sequences whose keys end one before, at and one after a
// multiple of 80 (the producer zeroes the V rows past the keys of the crossing tile; with padding,
// the rows past each sequence hold NaN), and whose queries leave consumer 1 idle (at most 64
// rows in the last tile), THD and padded, causal and not.
TEST(FlashWgmma, HeadDim256SequencesEndingMidTile) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  TensorOptions o;
  o.len_q = {160, 64, 65, 241, 1, 129, 80, 200, 0};
  o.len_kv = {79, 80, 81, 241, 160, 1, 161, 239, 33};
  for (bool thd : {true, false})
    for (bool causal : {false, true}) {
      fusedattn_config c = Config(9, 4, 2, 241, 241, 256, FUSEDATTN_DTYPE_BFLOAT16);
      if (thd) SetFormats(&c, FUSEDATTN_FORMAT_THD);
      c.mask = causal ? FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT : FUSEDATTN_MASK_PADDING;
      o.seed = 4321 + causal + 7 * thd;
      o.lse_packed = thd;  // THD: the heavy-first schedule
      const std::string name = std::string(thd ? "thd" : "bshd nan in padding") +
                               " d256 ends mid-tile" + (causal ? " causal bottom-right" : "");
      ExpectForwardMatches({name, c, o, !thd, true});
    }
}

// The dispatch: plain problems of the 64, 128 and 256 instances take the wgmma kernel on sm_90,
// and so do softcap and ALiBi (the softcap-alibi variant), bias tensors (the bias variant) and
// dropout with or without softcap and ALiBi (the dropout variant; variants checked by
// ExpectForwardMatches); a bias tensor with dropout, float32 and unaligned rows do not (and stay
// correct).
TEST(FlashWgmma, PathIsTakenExactlyWhenItShouldBe) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  if (!WgmmaExpected())
    GTEST_SKIP() << "the wgmma forward is not enabled here (not sm_90, built without 90a, or "
                    "FUSEDATTN_FLASH_WGMMA=0)";
  fusedattn_config c = Config(1, 2, 2, 130, 140, 128, FUSEDATTN_DTYPE_BFLOAT16);
  ExpectForwardMatches({"plain d128", c, {}, false, true});
  fusedattn_config x = c;
  x.bias_type = FUSEDATTN_BIAS_ALIBI;
  ExpectForwardMatches({"alibi", x, {}, false, true});
  x.softcap = 20.0;
  ExpectForwardMatches({"softcap and alibi", x, {}, false, true});
  x = c;
  x.softcap = 20.0;
  ExpectForwardMatches({"softcap", x, {}, false, true});
  x.dropout = 0.1;
  ExpectForwardMatches({"softcap with dropout", x, {}, false, true});
  x = c;
  x.dropout = 0.1;
  ExpectForwardMatches({"dropout", x, {}, false, true});
  x.head_dim_qk = x.head_dim_v = 64;
  ExpectForwardMatches({"d64 dropout", x, {}, false, true});
  x.head_dim_qk = x.head_dim_v = 256;
  ExpectForwardMatches({"d256 dropout", x, {}, false, true});
  x = c;
  x.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  ExpectForwardMatches({"post-scale bias", x, {}, false, true});
  x.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  x.softcap = 20.0;
  ExpectForwardMatches({"pre-scale bias with softcap", x, {}, false, true});
  x.dropout = 0.1;
  ExpectForwardMatches({"pre-scale bias with dropout falls back", x, {}, false, false});
  x = c;
  x.dropout = 0.1;
  x.attn_scale = -0.1;
  ExpectForwardMatches({"dropout with a negative scale falls back", x, {}, false, false});
  x = c;
  x.head_dim_qk = x.head_dim_v = 256;
  ExpectForwardMatches({"plain d256", x, {}, false, true});
  x.softcap = 20.0;
  ExpectForwardMatches({"d256 softcap", x, {}, false, true});
  x = c;
  x.head_dim_qk = x.head_dim_v = 64;
  x.bias_type = FUSEDATTN_BIAS_ALIBI;
  ExpectForwardMatches({"d64 alibi", x, {}, false, true});
  x.attn_scale = -0.1;
  ExpectForwardMatches({"d64 alibi with a negative scale falls back", x, {}, false, false});
  x = c;
  x.qkv_dtype = x.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  ExpectForwardMatches({"float32 falls back", x, {}, false, false});
  x = c;
  x.attn_scale = -0.1;
  ExpectForwardMatches({"negative scale falls back", x, {}, false, false});
  x = c;
  TensorOptions padded;
  padded.padded_strides = true;  // rows padded by 3 elements: not 16-byte aligned
  ExpectForwardMatches({"unaligned rows fall back", x, padded, false, false});
}

// The sanitize suites' two standard problems, with `variant` applied to both configs: THD at
// d64 bf16 (gaps between sequences, an empty one, bottom-right causal with a window, a sink) and
// a padding mask at d128 fp16 (NaN in the padding). `what` names the variant in the case names.
template <typename Variant>
std::vector<Case> SanitizeCases(const std::string& what, Variant variant) {
  std::vector<Case> cases;
  fusedattn_config c = Config(3, 4, 2, 150, 170, 64, FUSEDATTN_DTYPE_BFLOAT16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 90;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  variant(c);
  TensorOptions o;
  o.len_q = {150, 0, 140};
  o.len_kv = {170, 30, 129};
  o.thd_gaps = true;
  cases.push_back({"sanitize " + what + "THD d64 bf16", c, o, false, true});
  c = Config(2, 2, 2, 200, 260, 128, FUSEDATTN_DTYPE_FLOAT16);
  c.mask = FUSEDATTN_MASK_PADDING;
  variant(c);
  TensorOptions p;
  p.len_q = {200, 33};
  p.len_kv = {260, 131};
  cases.push_back({"sanitize " + what + "padding d128 fp16", c, p, true, true});
  return cases;
}

void NoVariant(fusedattn_config&) {}
void SoftcapAndAlibi(fusedattn_config& c) {
  c.softcap = 0.8;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
}
// The backward's problems: no max_logit (the backward does not take it).
template <typename Variant>
std::vector<Case> BackwardSanitizeCases(const std::string& what, Variant variant) {
  return SanitizeCases(what, [&](fusedattn_config& c) {
    variant(c);
    c.return_max_logit = 0;
  });
}

// Small problems for compute-sanitizer (memcheck, racecheck, synccheck).
TEST(FlashWgmmaSanitize, SmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (const Case& k : SanitizeCases("", NoVariant)) ExpectForwardMatches(k);
}

// d64's long-key tile (from 4096 keys): THD with a sequence ending mid-tile and an empty one.
TEST(FlashWgmmaSanitize, LongKeyTileD64) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(3, 2, 1, 70, 4100, 64, FUSEDATTN_DTYPE_BFLOAT16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  TensorOptions o;
  o.len_q = {70, 0, 33};
  o.len_kv = {4100, 30, 4097};
  o.thd_gaps = true;
  ExpectForwardMatches({"sanitize long-key tile THD d64 bf16", c, o, false, true});
}

// Softcap and ALiBi on the Hopper forward (the softcap-alibi instances) at every head dim.
TEST(FlashWgmmaSanitize, SoftcapAlibiSmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (const Case& k : SanitizeCases("softcap alibi ", SoftcapAndAlibi)) ExpectForwardMatches(k);
  fusedattn_config c = Config(2, 2, 1, 100, 180, 256, FUSEDATTN_DTYPE_BFLOAT16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  ExpectForwardMatches({"sanitize alibi causal d256 bf16", c, {}, false, true});
}

#ifdef FUSEDATTN_WITH_CUDA
// The forward and then the backward of c on the device, the backward from that forward's own O
// and LSE (as a training step runs them), and both on the reference backend on the host from the
// same inputs: *host receives the device's outputs, *ref the reference's; *dev keeps the device
// tensors (for the plan checks).
// `inputs`: the tensors to run (MakeProblemTensors's, or inputs made from them).
void ForwardThenBackwardOnDeviceAndReference(const ProblemTensors& inputs, ProblemTensors* host,
                                             ProblemTensors* ref, DeviceProblem* dev) {
  const fusedattn_config& c = inputs.config;
  *host = inputs;
  *ref = *host;
  ref->config.backend = FUSEDATTN_BACKEND_REFERENCE;
  ref->config.device = FUSEDATTN_DEVICE_CPU;
  ASSERT_NO_THROW(Forward(ref->config, ref->fwd_args()));
  ASSERT_NO_THROW(Backward(ref->config, ref->bwd_args()));
  std::string error;
  ASSERT_TRUE(dev->upload(*host, &error)) << error;
  size_t fwd_bytes = 0, bwd_bytes = 0;
  ASSERT_NO_THROW(fwd_bytes = FwdWorkspaceSize(c));
  ASSERT_NO_THROW(bwd_bytes = BwdWorkspaceSize(c));
  DeviceBuffer fwd_workspace(fwd_bytes), bwd_workspace(bwd_bytes);
  ASSERT_NO_THROW(Forward(c, dev->fwd_args(), fwd_workspace.ptr, fwd_bytes));
  ASSERT_NO_THROW(Backward(c, dev->bwd_args(), bwd_workspace.ptr, bwd_bytes));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(dev->download_outputs(host, &error)) << error;
}
void ForwardThenBackwardOnDeviceAndReference(const fusedattn_config& c, const TensorOptions& o,
                                             ProblemTensors* host, ProblemTensors* ref,
                                             DeviceProblem* dev) {
  ForwardThenBackwardOnDeviceAndReference(MakeProblemTensors(c, o), host, ref, dev);
}

// O, LSE and every gradient the reference computed (dbias where it has one), within the dtype's
// tolerance.
void ExpectForwardAndGradientsClose(const ProblemTensors& host, const ProblemTensors& ref) {
  const double tol = Tolerance(host.config.qkv_dtype);
  ExpectClose("O", host.o, ref.o, tol);
  ExpectClose("LSE", host.lse, ref.lse, tol);
  ExpectClose("dQ", host.dq, ref.dq, tol);
  ExpectClose("dK", host.dk, ref.dk, tol);
  ExpectClose("dV", host.dv, ref.dv, tol);
  ExpectClose("dbias", host.dbias, ref.dbias, tol);
}
#endif

// A forward on the Hopper kernel (softcap-alibi) followed by the Hopper backward (softcap-alibi)
// in either mode (deterministic: its deterministic instances), each from that forward's own O and
// LSE: the kernels agree on the scores and the LSE, so the gradients match the reference's.
TEST(FlashWgmma, SoftcapAlibiForwardThenEitherBackward) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_CUDA
  for (int64_t d : {64, 128})
    for (int deterministic : {0, 1}) {
      fusedattn_config c = Config(2, 4, 2, 200, 230, d, FUSEDATTN_DTYPE_BFLOAT16);
      c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
      c.softcap = 0.8;
      c.bias_type = FUSEDATTN_BIAS_ALIBI;
      c.deterministic = deterministic;
      SCOPED_TRACE("d" + std::to_string(d) + (deterministic ? " deterministic" : ""));
      TensorOptions o;
      o.seed = 977 + d;
      ProblemTensors host, ref;
      DeviceProblem dev;
      ASSERT_NO_FATAL_FAILURE(ForwardThenBackwardOnDeviceAndReference(c, o, &host, &ref, &dev));
      EXPECT_EQ(ForwardPlanIsWgmma(c, dev.fwd_args()), WgmmaExpected());
      EXPECT_EQ(BackwardPlanIsWgmma(c, dev.bwd_args()), WgmmaExpected());
      ExpectForwardAndGradientsClose(host, ref);
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Bias tensors on the Hopper forward (the bias instances) at every head dim: bias tensors sized
// exactly [bias_batch, bias_heads, max_seqlen_q, max_seqlen_kv] with lengths that end mid-tile,
// so that a read past a row's last key or past the last row leaves the allocation.
TEST(FlashWgmmaSanitize, BiasSmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(3, 4, 2, 150, 170, 64, FUSEDATTN_DTYPE_BFLOAT16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 90;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  c.bias_batch = 3;
  TensorOptions o;
  o.len_q = {150, 0, 140};
  o.len_kv = {170, 30, 129};
  o.thd_gaps = true;
  o.bias_dtype = FUSEDATTN_DTYPE_FLOAT32;
  ExpectForwardMatches({"sanitize pre-scale f32 bias THD d64 bf16", c, o, false, true,
                        BiasLayout::kDenseNanOutside});
  c = Config(2, 2, 2, 200, 260, 128, FUSEDATTN_DTYPE_FLOAT16);
  c.mask = FUSEDATTN_MASK_PADDING;
  c.softcap = 0.8;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_heads = 2;
  TensorOptions p;
  p.len_q = {200, 33};
  p.len_kv = {260, 131};
  p.bias_dtype = FUSEDATTN_DTYPE_FLOAT16;
  ExpectForwardMatches({"sanitize softcap post-scale bias odd rows padding d128 fp16", c, p, true,
                        true, BiasLayout::kOddRowsNanOutside});
  c = Config(1, 2, 2, 150, 170, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;  // [1, 1, 150, 170], contiguous: paired loads
  TensorOptions q;
  q.bias_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  ExpectForwardMatches({"sanitize post-scale bias d128 bf16", c, q, false, true});
  c = Config(2, 2, 1, 100, 180, 256, FUSEDATTN_DTYPE_BFLOAT16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  ExpectForwardMatches({"sanitize post-scale f32 bias causal d256 bf16", c, {}, false, true});
}

// A forward on the Hopper kernel's bias variant followed by the mma.sync backward (no Hopper
// backward has a bias tensor) in either mode, from that forward's own O and LSE: the kernels agree
// on the scores and the LSE, so the gradients, dbias included, match the reference's.
TEST(FlashWgmma, BiasForwardThenMmaSyncBackward) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_CUDA
  for (int64_t d : {64, 128})
    for (int variant : {0, 1})
      for (int deterministic : {0, 1}) {
        fusedattn_config c = Config(2, 4, 2, 200, 230, d, FUSEDATTN_DTYPE_BFLOAT16);
        c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
        c.deterministic = deterministic;
        c.bias_requires_grad = 1;
        TensorOptions o;
        o.seed = 977 + d;
        if (variant == 0) {  // shared by all, float32
          c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
          o.bias_dtype = FUSEDATTN_DTYPE_FLOAT32;
        } else {  // softcap, one per sequence and head, bf16
          c.softcap = 0.8;
          c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
          c.bias_batch = c.batch, c.bias_heads = c.heads_q;
          o.bias_dtype = FUSEDATTN_DTYPE_BFLOAT16;
        }
        SCOPED_TRACE("d" + std::to_string(d) +
                     (variant == 0 ? " post-scale bias [1, 1] f32" : " softcap pre-scale bias bf16") +
                     (deterministic ? " deterministic" : ""));
        ProblemTensors host, ref;
        DeviceProblem dev;
        ASSERT_NO_FATAL_FAILURE(ForwardThenBackwardOnDeviceAndReference(c, o, &host, &ref, &dev));
        EXPECT_EQ(ForwardPlanIsWgmma(c, dev.fwd_args()), WgmmaExpected());
        EXPECT_FALSE(BackwardPlanIsWgmma(c, dev.bwd_args()));
        ExpectForwardAndGradientsClose(host, ref);
      }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Dropout on the Hopper forward (the dropout instances), followed by the mma.sync backward (no
// Hopper backward has dropout) in either mode, the backward from that forward's own O and LSE:
// the two kernels drop the same elements (the backward recomputes P from the LSE and applies its
// own mask), so O, the LSE and the gradients match the reference's.
TEST(FlashWgmma, DropoutForwardThenMmaSyncBackward) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_CUDA
  for (int64_t d : {64, 128})
    for (int variant : {0, 1})
      for (int deterministic : {0, 1}) {
        fusedattn_config c = Config(2, 4, 2, 200, 230, d, FUSEDATTN_DTYPE_BFLOAT16);
        c.mask = variant == 0 ? FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT : FUSEDATTN_MASK_NONE;
        c.dropout = variant == 0 ? 0.3 : 0.6;
        if (variant == 1) {
          c.softcap = 0.8;
          c.bias_type = FUSEDATTN_BIAS_ALIBI;
        }
        c.deterministic = deterministic;
        SCOPED_TRACE("d" + std::to_string(d) +
                     (variant == 0 ? " dropout 0.3 causal" : " dropout 0.6 softcap alibi") +
                     (deterministic ? " deterministic" : ""));
        TensorOptions o;
        o.seed = 1201 + d + 7 * variant;
        ProblemTensors host, ref;
        DeviceProblem dev;
        ASSERT_NO_FATAL_FAILURE(ForwardThenBackwardOnDeviceAndReference(c, o, &host, &ref, &dev));
        EXPECT_EQ(ForwardPlanIsWgmma(c, dev.fwd_args()), WgmmaExpected());
        EXPECT_FALSE(BackwardPlanIsWgmma(c, dev.bwd_args()));
        ExpectForwardAndGradientsClose(host, ref);
      }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

#ifdef FUSEDATTN_WITH_CUDA
// Index of element x of token s of sequence b, head h in a q/k/v/o-like tensor of format f
// (query side: q, o, dO, dQ; else k, v, dK, dV).
std::vector<int64_t> TokenIndex(const ProblemTensors& t, fusedattn_format f, bool query_side,
                                int64_t b, int64_t s, int64_t h, int64_t x) {
  switch (f) {
    case FUSEDATTN_FORMAT_SBHD: return {s, b, h, x};
    case FUSEDATTN_FORMAT_BHSD: return {b, h, s, x};
    case FUSEDATTN_FORMAT_THD: return {(query_side ? t.start_q[b] : t.start_kv[b]) + s, h, x};
    default: return {b, s, h, x};
  }
}

// Inputs whose outputs show the dropout mask (config: head_dim_qk == head_dim_v = dv, a
// bottom-right causal mask with window_left = dv - 1): q = 0, so that each of the n_i keys row i
// sees has probability 1 / n_i; v[j] = e_(j mod dv) in every kv head and dO[i] = e_(i mod dv) in
// every query head. The window puts the keys a row sees in distinct columns, and the rows that
// see a key too, so, for query head h,
//   O[h][i][j mod dv] = keep(h, i, j) / ((1 - dropout) n_i):
// nonzero exactly where the element (h, i, j) is kept by the forward's mask, whichever kv head h
// reads (they all hold the same V). With heads_q == heads_kv, also
//   dV[h][j][i mod dv] = the same, kept by the backward's mask;
// with a GQA group dV sums the group's query heads, and so shows no single head's mask.
void ShowDropoutMask(ProblemTensors* t) {
  const auto& c = t->config;
  const int64_t dv = c.head_dim_v;
  t->q.fill(0.0);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_kv; ++h)
      for (int64_t j = 0; j < t->len_kv[b]; ++j)
        for (int64_t x = 0; x < dv; ++x)
          t->v.set(t->v.offset_of(TokenIndex(*t, c.kv_format, false, b, j, h, x)),
                   x == j % dv ? 1.0 : 0.0);
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < t->len_q[b]; ++i)
        for (int64_t x = 0; x < dv; ++x)
          t->d_o.set(t->d_o.offset_of(TokenIndex(*t, c.do_format, true, b, i, h, x)),
                     x == i % dv ? 1.0 : 0.0);
  }
}

// Over every visible element (b, h, i, j) of a ShowDropoutMask problem: how many there are, how
// many the reference keeps (O nonzero), and where the device's forward (O) and backward (dV)
// decide otherwise. dV is read only where it shows the mask (heads_q == heads_kv; else
// backward_differs stays 0 and backward_compared false).
struct DropoutMaskCounts {
  bool backward_compared = false;
  int64_t visible = 0, kept = 0, forward_differs = 0, backward_differs = 0;
};
DropoutMaskCounts CompareDropoutMasks(const ProblemTensors& device, const ProblemTensors& ref) {
  const auto& c = ref.config;
  const int64_t dv = c.head_dim_v;
  DropoutMaskCounts n;
  n.backward_compared = c.heads_q == c.heads_kv;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < ref.len_q[b]; ++i) {
        const int64_t diagonal = i + ref.len_kv[b] - ref.len_q[b];  // bottom-right
        const int64_t lo = std::max<int64_t>(0, diagonal - (dv - 1));
        const int64_t hi = std::min<int64_t>(ref.len_kv[b] - 1, diagonal);
        for (int64_t j = lo; j <= hi; ++j) {
          const auto o_at = TokenIndex(ref, c.o_format, true, b, i, h, j % dv);
          const bool kept = ref.o.at(o_at) != 0.0;
          ++n.visible;
          n.kept += kept;
          n.forward_differs += (device.o.at(o_at) != 0.0) != kept;
          if (n.backward_compared) {
            const auto dv_at = TokenIndex(ref, c.dqkv_format, false, b, j, h, i % dv);
            n.backward_differs += (device.dv.at(dv_at) != 0.0) != kept;
          }
        }
      }
  return n;
}
#endif

// The Hopper forward's dropout mask is the reference's, element by element, and so is the
// mma.sync backward's that follows it (ShowDropoutMask): every instance (d64 on both of its
// tiles, d128, d256), dense and THD with gaps and empty sequences, bf16 and fp16, several drop
// probabilities. A forward that ignored dropout, numbered rows, keys or sequences differently,
// or exchanged the wrong halves between lanes would differ in about half the elements. Two cases
// aim at the numbering of heads and sequences:
//   - GQA (4 query heads, 2 kv heads): the mask is numbered by the query head; a forward that
//     numbered it by the kv head would give query heads 1 and 3 the masks of heads 0 and 2.
//     Only the forward's mask (O) is checked there: dV sums the group's query heads.
//   - THD with packed LSE, which selects the heavy-first schedule (batch and head come from the
//     scheduled tile), over sequences of 1 to 257 queries: a sequence or head numbered wrongly
//     differs in about half of its elements, and the count is exact, so even the 3-token
//     sequence (6 elements a head) cannot hide behind the long ones.
TEST(FlashWgmma, DropoutMaskIsTheReferenceMaskBitForBit) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_CUDA
  struct MaskCase {
    std::string name;
    int64_t d, sq, skv;
    bool thd;
    double dropout;
    fusedattn_dtype dtype;
    int64_t heads_q = 2, heads_kv = 2;
    // THD: LSE as [tokens, heads] (the heavy-first schedule), over the sequences below rather
    // than the default ones (sq, 0, 17, 129 queries with gaps).
    bool lse_packed = false;
    std::vector<int32_t> len_q = {}, len_kv = {};
  };
  const std::vector<MaskCase> cases = {
      {"d64 two-block tile", 64, 300, 300, false, 0.3, FUSEDATTN_DTYPE_BFLOAT16},
      {"d64 long-key tile", 64, 130, 4200, false, 0.5, FUSEDATTN_DTYPE_FLOAT16},
      {"d128", 128, 300, 300, false, 0.3, FUSEDATTN_DTYPE_BFLOAT16},
      {"d128 fp16 sq < skv", 128, 200, 333, false, 0.8, FUSEDATTN_DTYPE_FLOAT16},
      {"d256", 256, 300, 300, false, 0.3, FUSEDATTN_DTYPE_BFLOAT16},
      {"d128 THD", 128, 300, 300, true, 0.4, FUSEDATTN_DTYPE_BFLOAT16},
      {"d64 THD", 64, 300, 300, true, 0.1, FUSEDATTN_DTYPE_BFLOAT16},
      // Query heads 1 and 3 share kv heads with 0 and 2 but not their masks.
      {"d128 GQA 4/2 (forward only)", 128, 300, 300, false, 0.3, FUSEDATTN_DTYPE_BFLOAT16, 4, 2},
      // The schedule takes sequences 1 (257 queries, 3 tiles) and 4 (2 tiles) first: its block
      // order is not the batch order. sq, skv: the longest lengths (257, 300).
      {"d64 THD packed LSE (heavy-first), sequences of 1 to 257 queries", 64, 0, 0, true, 0.3,
       FUSEDATTN_DTYPE_BFLOAT16, 2, 2, true, {3, 257, 17, 1, 130, 64}, {3, 300, 40, 1, 130, 9}},
  };
  for (const MaskCase& k : cases) {
    SCOPED_TRACE(k.name);
    const int64_t batch = !k.thd ? 2 : k.lse_packed ? static_cast<int64_t>(k.len_q.size()) : 4;
    int64_t sq = k.sq, skv = k.skv;
    if (k.lse_packed) {  // THD's padded sq, skv: the longest sequence
      sq = *std::max_element(k.len_q.begin(), k.len_q.end());
      skv = *std::max_element(k.len_kv.begin(), k.len_kv.end());
    }
    fusedattn_config c = Config(batch, k.heads_q, k.heads_kv, sq, skv, k.d, k.dtype);
    c.return_max_logit = 0;
    c.dropout = k.dropout;
    c.window_left = k.d - 1;
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    TensorOptions o;
    o.seed = 3301 + k.d + k.sq;
    if (k.thd) {
      SetFormats(&c, FUSEDATTN_FORMAT_THD);
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
      if (k.lse_packed) {
        o.lse_packed = true;
        o.len_q = k.len_q;
        o.len_kv = k.len_kv;
      } else {
        o.len_q = {static_cast<int32_t>(k.sq), 0, 17, 129};
        o.len_kv = {static_cast<int32_t>(k.skv), 5, 40, 129};
        o.thd_gaps = true;
      }
    }
    ProblemTensors inputs = MakeProblemTensors(c, o);
    ShowDropoutMask(&inputs);
    ProblemTensors host, ref;
    DeviceProblem dev;
    ASSERT_NO_FATAL_FAILURE(ForwardThenBackwardOnDeviceAndReference(inputs, &host, &ref, &dev));
    EXPECT_EQ(ForwardPlanIsWgmma(c, dev.fwd_args()), WgmmaExpected());
    const DropoutMaskCounts n = CompareDropoutMasks(host, ref);
    EXPECT_EQ(n.forward_differs, 0) << "of " << n.visible << " visible elements";
    // With GQA dV sums the group's query heads (each under its own mask), so it shows no single
    // head's mask: the backward's is checked by the cases with one query head per kv head.
    if (n.backward_compared)
      EXPECT_EQ(n.backward_differs, 0) << "of " << n.visible << " visible elements";
    // The test itself: the reference kept about 1 - dropout of the elements.
    ASSERT_GT(n.visible, 10000);
    const double kept = static_cast<double>(n.kept) / static_cast<double>(n.visible);
    EXPECT_NEAR(kept, 1.0 - k.dropout, 0.05) << n.kept << " of " << n.visible;
    const double tol = Tolerance(c.qkv_dtype);
    ExpectClose("O", host.o, ref.o, tol);
    ExpectClose("LSE", host.lse, ref.lse, tol);
    ExpectClose("dV", host.dv, ref.dv, tol);
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Dropout on the Hopper forward (the dropout instances) at every head dim, for compute-sanitizer.
TEST(FlashWgmmaSanitize, DropoutSmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (const Case& k : SanitizeCases("dropout ", [](fusedattn_config& c) { c.dropout = 0.3; }))
    ExpectForwardMatches(k);
  for (const Case& k : SanitizeCases("dropout softcap alibi ", [](fusedattn_config& c) {
         SoftcapAndAlibi(c);
         c.dropout = 0.6;
       }))
    ExpectForwardMatches(k);
  fusedattn_config c = Config(2, 2, 1, 100, 180, 256, FUSEDATTN_DTYPE_BFLOAT16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.dropout = 0.2;
  ExpectForwardMatches({"sanitize dropout causal d256 bf16", c, {}, false, true});
  c = Config(1, 2, 1, 70, 4100, 64, FUSEDATTN_DTYPE_BFLOAT16);  // d64's long-key tile
  c.dropout = 0.2;
  ExpectForwardMatches({"sanitize dropout long-key tile d64 bf16", c, {}, false, true});
}

// The same for the 256 instance alone (80-key tiles, four boxes per row, no ping-pong):
//   --gtest_filter='FlashWgmmaSanitize.SmallCasesHeadDim256'
TEST(FlashWgmmaSanitize, SmallCasesHeadDim256) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(3, 2, 1, 150, 170, 256, FUSEDATTN_DTYPE_BFLOAT16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  TensorOptions o;
  o.len_q = {150, 0, 65};
  o.len_kv = {170, 30, 81};
  o.thd_gaps = true;
  o.lse_packed = true;
  ExpectForwardMatches({"sanitize THD d256 bf16", c, o, false, true});
  c = Config(2, 2, 2, 100, 180, 256, FUSEDATTN_DTYPE_FLOAT16);
  c.mask = FUSEDATTN_MASK_PADDING;
  TensorOptions p;
  p.len_q = {100, 33};
  p.len_kv = {180, 79};
  ExpectForwardMatches({"sanitize padding d256 fp16", c, p, true, true});
}

// ------------------------------------------------------------------------------------------------
// Backward cases: every one for bf16/fp16 x d64/d128 (tiles: 128 keys per block; 64 queries per
// step at d128, 128 at d64; the sizes are not multiples of either)
// ------------------------------------------------------------------------------------------------

std::vector<Case> BackwardCasesFor(fusedattn_dtype dtype, int64_t d) {
  std::vector<Case> cases;
  auto add = [&](std::string name, fusedattn_config c, TensorOptions o = {},
                 bool poison_padding = false) {
    o.seed = 9000 + cases.size() * 17 + d;
    c.return_max_logit = 0;
    cases.push_back({name, c, o, poison_padding, true});
  };
  add("no_mask_200_333", Config(2, 4, 4, 200, 333, d, dtype));
  CausalCases(dtype, d, add);
  {
    fusedattn_config c = Config(2, 4, 4, 300, 130, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    add("causal_bottom_right_sq_gt_skv", c);  // the first 170 rows see no key
  }
  MaskAndLayoutCases(dtype, d, add);
  {
    fusedattn_config c = Config(2, 8, 2, 257, 257, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    add("gqa_group4_causal", c);
  }
  {
    fusedattn_config c = Config(2, 4, 1, 129, 300, d, dtype);
    add("mqa_uneven_tiles", c);
  }
  for (auto [sq, skv] : {std::pair<int64_t, int64_t>{1, 1000}, {1000, 1}, {17, 33}}) {
    fusedattn_config c = Config(2, 2, 2, sq, skv, d, dtype);
    add("lengths_" + std::to_string(sq) + "_" + std::to_string(skv), c);
  }
  {
    fusedattn_config c = Config(2, 2, 2, 190, 190, d, dtype);
    c.head_dim_qk = d == 128 ? 128 : 40;  // zero-filled columns of the 64 instance
    c.head_dim_v = 64;
    c.mask = FUSEDATTN_MASK_CAUSAL;
    add(d == 128 ? "head_dim_qk128_v64" : "head_dim_qk40_v64", c);
  }
  {
    fusedattn_config c = Config(2, 4, 4, 160, 230, d, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    add("learnable_sink", c);
    c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
    add("off_by_one", c);
  }
  {
    fusedattn_config c = Config(2, 4, 2, 140, 200, d, dtype);
    SetFormats(&c, FUSEDATTN_FORMAT_BHSD);
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    add("bhsd", c);
    SetFormats(&c, FUSEDATTN_FORMAT_SBHD);
    add("sbhd", c);
    c.q_format = FUSEDATTN_FORMAT_BSHD, c.kv_format = FUSEDATTN_FORMAT_BHSD;
    c.o_format = FUSEDATTN_FORMAT_SBHD, c.do_format = FUSEDATTN_FORMAT_BHSD;
    add("mixed_formats", c);
  }
  {
    fusedattn_config c = Config(1, 2, 2, 100, 100, d, dtype);
    c.attn_scale = 0.3;
    add("custom_scale", c);
  }
  SoftcapAlibiCases(dtype, d, add);  // the softcap-alibi variant of the Hopper backward
  // Deterministic mode (its own instances): the cases whose dQ order differs the most from the
  // plain grid's (masks that start a query tile's order past key block 0, windows that end it
  // early, GQA, per-sequence lengths, THD on the plain grid and the schedule, half tiles).
  const std::vector<std::string> deterministic = {
      "no_mask_200_333",
      "causal",
      "causal_bottom_right_sq_lt_skv",
      "causal_bottom_right_sq_gt_skv",
      "window_100_20",
      "causal_window_130",
      "padding_causal_bottom_right_nan_in_padding",
      "thd_uneven_with_empty_gaps",
      "thd_uneven_packed_lse",
      "gqa_group4_causal",
      "mqa_uneven_tiles",
      "lengths_1_1000",
      "learnable_sink",
      "softcap_alibi_window_100_20_gqa",
      "softcap_alibi_thd_uneven_with_empty_gaps"};
  const size_t plain = cases.size();
  for (size_t i = 0; i < plain; ++i) {
    if (std::find(deterministic.begin(), deterministic.end(), cases[i].name) ==
        deterministic.end())
      continue;
    Case k = cases[i];
    k.name = "deterministic_" + k.name;
    k.config.deterministic = 1;
    cases.push_back(k);
  }
  return cases;
}

std::vector<ForwardParam> AllBackwardCases() {
  std::vector<ForwardParam> all;
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16})
    for (int64_t d : {64, 128})
      for (Case& c : BackwardCasesFor(dtype, d)) all.push_back({dtype, d, c});
  return all;
}

class FlashWgmmaBwdCase : public ::testing::TestWithParam<ForwardParam> {};

TEST_P(FlashWgmmaBwdCase, BackwardMatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  ExpectBackwardMatches(GetParam().c);
}

INSTANTIATE_TEST_SUITE_P(FlashWgmmaBwd, FlashWgmmaBwdCase, ::testing::ValuesIn(AllBackwardCases()),
                         [](const ::testing::TestParamInfo<ForwardParam>& info) {
                           const ForwardParam& p = info.param;
                           return std::string(p.dtype == FUSEDATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16") +
                                  "_d" + std::to_string(p.d) + "_" + p.c.name;
                         });

TEST(FlashWgmmaBwd, LargeBf16HeadDim128) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(1, 2, 2, 1024, 1024, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.return_max_logit = 0;
  ExpectBackwardMatches({"b1 h2 s1024 d128 bf16", c, {}, false, true});
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectBackwardMatches({"b1 h2 s1024 d128 bf16 causal", c, {}, false, true});
}

TEST(FlashWgmmaBwd, LargeFp16HeadDim64Gqa) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(1, 4, 2, 1024, 1024, 64, FUSEDATTN_DTYPE_FLOAT16);
  c.return_max_logit = 0;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectBackwardMatches({"b1 h4/2 s1024 d64 fp16 causal", c, {}, false, true});
}

// THD with many uneven sequences, empty ones and one much longer than the rest: the heavy-first
// tile schedule of the wgmma forward and backward (schedule.h) against the reference, causal and
// not, with and without gaps between the sequences (packed LSE, which the forward's schedule
// needs; the unpacked one takes the plain grid, thd_uneven_with_empty_gaps above).
TEST(FlashWgmmaBwd, ThdManyUnevenSequencesScheduled) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  TensorOptions o;
  std::mt19937 rng(321);
  std::uniform_int_distribution<int32_t> len(1, 600);
  for (int b = 0; b < 33; ++b) {
    int32_t n = b % 8 == 3 ? 0 : len(rng);  // some empty sequences
    if (b == 17) n = 1500;                  // one much longer, in the middle of the batch
    if (b == 5) n = 128;                    // exactly one tile
    o.len_q.push_back(n);
    o.len_kv.push_back(b == 9 ? 0 : n);     // keys empty where the queries are not
  }
  o.lse_packed = true;
  for (bool causal : {false, true})
    for (bool gaps : {false, true}) {
      fusedattn_config c = Config(33, 4, 2, 1500, 1500, 128, FUSEDATTN_DTYPE_BFLOAT16);
      SetFormats(&c, FUSEDATTN_FORMAT_THD);
      c.mask = causal ? FUSEDATTN_MASK_PADDING_CAUSAL : FUSEDATTN_MASK_PADDING;
      o.thd_gaps = gaps;
      o.seed = 777 + 2 * causal + gaps;
      const std::string name = std::string("thd 33 uneven d128 bf16") + (causal ? " causal" : "") +
                               (gaps ? " gaps" : "");
      ExpectForwardMatches({name, c, o, false, true});
      c.return_max_logit = 0;
      ExpectBackwardMatches({name, c, o, false, true});
    }
}

// Deterministic mode: the Hopper backward's dQ, dK and dV are the same bytes run after run, on
// problems whose query tiles get dQ from many key blocks (32 per query tile at s4096, several
// heads, so that many blocks add to one tile at once): flash's forward once for O and LSE, then
// the backward `runs` times into freshly poisoned outputs, each compared with memcmp against the
// first. On the non-deterministic instances the bulk reduce-adds of one tile land in the order
// the blocks reach it, and float32 addition is not associative: dQ differs between runs as a rule
// (not always: the test prints what it saw there too, as information, without failing on it).
#ifdef FUSEDATTN_WITH_CUDA
struct RunBytes {
  std::vector<unsigned char> dq, dk, dv;
};
std::vector<unsigned char> BytesOf(const HostTensor& t) {
  const auto* data = static_cast<const unsigned char*>(t.data());
  return std::vector<unsigned char>(data, data + t.storage_bytes());
}
// Which of dQ, dK, dV differ in some run from the first (empty: identical over every run).
std::string BackwardBytesDifferOverRuns(const fusedattn_config& c, const TensorOptions& o,
                                        int runs) {
  ProblemTensors host = MakeProblemTensors(c, o);
  DeviceProblem dev;
  std::string error;
  EXPECT_TRUE(dev.upload(host, &error)) << error;
#ifdef FUSEDATTN_WITH_FLASH
  if (WgmmaExpected()) {  // the Hopper backward, deterministic or not as asked
    flash::BackwardPlan plan;
    EXPECT_TRUE(flash::PlanBackwardCall(c, dev.bwd_args(), &plan).ok());
    EXPECT_EQ(plan.path, flash::KernelPath::kHopperWgmma) << flash::DescribeBackwardPlan(plan);
    EXPECT_EQ(plan.dq, c.deterministic ? flash::DqMode::kFixedOrderThenConvert
                                       : flash::DqMode::kAtomicThenConvert)
        << flash::DescribeBackwardPlan(plan);
  }
#endif
  const size_t fwd_bytes = FwdWorkspaceSize(c), bwd_bytes = BwdWorkspaceSize(c);
  DeviceBuffer fwd_workspace(fwd_bytes), bwd_workspace(bwd_bytes);
  Forward(c, dev.fwd_args(), fwd_workspace.ptr, fwd_bytes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(dev.download_outputs(&host, &error)) << error;  // O and LSE of the forward
  std::vector<RunBytes> seen;
  for (int r = 0; r < runs; ++r) {
    host.dq.poison();
    host.dk.poison();
    host.dv.poison();
    EXPECT_TRUE(dev.upload_outputs(host, &error)) << error;
    Backward(c, dev.bwd_args(), bwd_workspace.ptr, bwd_bytes);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dev.download_outputs(&host, &error)) << error;
    seen.push_back({BytesOf(host.dq), BytesOf(host.dk), BytesOf(host.dv)});
  }
  std::string differ;
  auto check = [&](const char* name, auto member) {
    for (int r = 1; r < runs; ++r) {
      const auto& a = seen[0].*member;
      const auto& b = seen[r].*member;
      if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size()) != 0) {
        differ += std::string(differ.empty() ? "" : ", ") + name;
        return;
      }
    }
  };
  check("dQ", &RunBytes::dq);
  check("dK", &RunBytes::dk);
  check("dV", &RunBytes::dv);
  return differ;
}
#endif

void ExpectDeterministicOverRuns(const std::string& name, fusedattn_config c,
                                 const TensorOptions& o) {
#ifdef FUSEDATTN_WITH_CUDA
  SCOPED_TRACE(name);
  c.return_max_logit = 0;
  c.deterministic = 1;
  EXPECT_EQ(BackwardBytesDifferOverRuns(c, o, 3), "") << "deterministic backward, bytes differ";
  c.deterministic = 0;
  const std::string plain = BackwardBytesDifferOverRuns(c, o, 3);
  std::printf("[ info ] %s: the non-deterministic backward over 3 runs: %s\n", name.c_str(),
              plain.empty() ? "identical bytes this time" : (plain + " differ").c_str());
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(FlashWgmmaBwd, DeterministicIsBitwiseIdenticalOverRuns) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  ExpectDeterministicOverRuns("b2 h8 s4096 d128 bf16",
                              Config(2, 8, 8, 4096, 4096, 128, FUSEDATTN_DTYPE_BFLOAT16), {});
  fusedattn_config c = Config(2, 8, 2, 4096, 4096, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectDeterministicOverRuns("b2 h8/2 s4096 d128 bf16 causal gqa", c, {});
  c = Config(1, 8, 2, 4096, 3000, 64, FUSEDATTN_DTYPE_FLOAT16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 1500;
  ExpectDeterministicOverRuns("b1 h8/2 sq4096 skv3000 d64 fp16 causal bottom-right window 1500",
                              c, {});
  c = Config(1, 8, 8, 4096, 4096, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.softcap = 30.0;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  ExpectDeterministicOverRuns("b1 h8 s4096 d128 bf16 softcap alibi", c, {});
}

TEST(FlashWgmmaBwd, DeterministicThdIsBitwiseIdenticalOverRuns) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  TensorOptions o;
  o.len_q = {4096, 700, 0, 2500, 129, 3000};
  o.len_kv = {4096, 900, 64, 2500, 129, 1000};
  for (bool packed : {true, false}) {  // the heavy-first schedule, the plain grid
    o.lse_packed = packed;
    for (int64_t d : {64, 128}) {
      fusedattn_config c = Config(6, 8, 2, 4096, 4096, d, FUSEDATTN_DTYPE_BFLOAT16);
      SetFormats(&c, FUSEDATTN_FORMAT_THD);
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
      ExpectDeterministicOverRuns(std::string("thd 6 uneven h8/2 d") + std::to_string(d) +
                                      (packed ? " packed lse" : ""),
                                  c, o);
    }
  }
}

// Sequences whose last tile holds at most 64 rows or keys (64 mod 128, and one either side of
// it): the kernels then skip the absent half (forward: consumer 1's rows, d128's upper 64 keys;
// backward: consumer 1's keys, d64's upper 64 queries of a step, whose dQ rows are computed but
// never added to the workspace) and leave the rows past the sequence that no product reads
// unpatched: with padding, those rows hold NaN.
TEST(FlashWgmmaBwd, HalfTilesAtTheEndsOfSequences) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  TensorOptions o;
  o.len_q = {192, 64, 320, 65, 63, 128, 191, 193, 1};
  o.len_kv = {192, 320, 64, 63, 65, 193, 128, 1, 191};
  o.lse_packed = true;
  for (bool thd : {true, false})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        fusedattn_config c = Config(9, 4, 2, 320, 320, d, FUSEDATTN_DTYPE_BFLOAT16);
        if (thd) SetFormats(&c, FUSEDATTN_FORMAT_THD);
        c.mask = causal ? FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT : FUSEDATTN_MASK_PADDING;
        c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
        o.seed = 1234 + d + causal + 7 * thd;
        o.lse_packed = thd;
        const std::string name = std::string(thd ? "thd" : "bshd nan in padding") +
                                 " half tiles d" + std::to_string(d) +
                                 (causal ? " causal bottom-right" : "");
        ExpectForwardMatches({name, c, o, !thd, true});
        c.return_max_logit = 0;
        ExpectBackwardMatches({name, c, o, !thd, true});
      }
}

// The dispatch: plain problems of the 64 and 128 instances take the wgmma backward on sm_90, and
// so do softcap and ALiBi (the softcap-alibi variant, checked by ExpectBackwardMatches), in
// either mode (deterministic: dQ fixed-order+convert, also checked there); bias tensors,
// dropout, head dim 256, float32 and unaligned rows do not (and stay correct).
TEST(FlashWgmmaBwd, PathIsTakenExactlyWhenItShouldBe) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  if (!WgmmaExpected())
    GTEST_SKIP() << "the wgmma kernels are not enabled here (not sm_90, built without 90a, or "
                    "FUSEDATTN_FLASH_WGMMA=0)";
  fusedattn_config c = Config(1, 2, 2, 130, 140, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.return_max_logit = 0;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectBackwardMatches({"plain d128", c, {}, false, true});
  fusedattn_config x = c;
  x.deterministic = 1;
  ExpectBackwardMatches({"deterministic", x, {}, false, true});
  x = c;
  x.bias_type = FUSEDATTN_BIAS_ALIBI;
  ExpectBackwardMatches({"alibi", x, {}, false, true});
  x.softcap = 20.0;
  ExpectBackwardMatches({"softcap and alibi", x, {}, false, true});
  x.deterministic = 1;
  ExpectBackwardMatches({"deterministic softcap and alibi", x, {}, false, true});
  x = c;
  x.softcap = 20.0;
  ExpectBackwardMatches({"softcap", x, {}, false, true});
  x.dropout = 0.1;
  ExpectBackwardMatches({"softcap with dropout falls back", x, {}, false, false});
  x = c;
  x.head_dim_qk = x.head_dim_v = 64;
  x.bias_type = FUSEDATTN_BIAS_ALIBI;
  ExpectBackwardMatches({"d64 alibi", x, {}, false, true});
  x = c;
  x.dropout = 0.1;
  ExpectBackwardMatches({"dropout falls back", x, {}, false, false});
  x.deterministic = 1;
  ExpectBackwardMatches({"deterministic dropout falls back", x, {}, false, false});
  x = c;
  x.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  ExpectBackwardMatches({"post-scale bias falls back", x, {}, false, false});
  x.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  x.softcap = 20.0;
  ExpectBackwardMatches({"pre-scale bias with softcap falls back", x, {}, false, false});
  x = c;
  x.head_dim_qk = x.head_dim_v = 256;
  ExpectBackwardMatches({"d256 falls back", x, {}, false, false});
  x.deterministic = 1;
  ExpectBackwardMatches({"deterministic d256 falls back", x, {}, false, false});
  x = c;
  x.qkv_dtype = x.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  ExpectBackwardMatches({"float32 falls back", x, {}, false, false});
  x = c;
  TensorOptions padded;
  padded.padded_strides = true;  // rows padded by 3 elements: not 16-byte aligned
  ExpectBackwardMatches({"unaligned rows fall back", x, padded, false, false});
}

// Small problems for compute-sanitizer (memcheck, racecheck, synccheck):
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashWgmmaBwdSanitize*'
//   compute-sanitizer --tool racecheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashWgmmaBwdSanitize*'
TEST(FlashWgmmaBwdSanitize, SmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (const Case& k : BackwardSanitizeCases("", NoVariant)) ExpectBackwardMatches(k);
}

// Deterministic mode (the deterministic instances: tickets, the dQ order flags, the waits) at
// both head dims, THD on the schedule with windows, padding with NaN, GQA with softcap:
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashWgmmaBwdSanitize.Deterministic*'
//   compute-sanitizer --tool racecheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashWgmmaBwdSanitize.Deterministic*'
TEST(FlashWgmmaBwdSanitize, DeterministicSmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = Config(3, 4, 2, 300, 420, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.return_max_logit = 0;
  c.deterministic = 1;
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 150;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  TensorOptions o;
  o.len_q = {300, 0, 140};
  o.len_kv = {420, 30, 329};
  o.thd_gaps = true;
  o.lse_packed = true;
  ExpectBackwardMatches({"sanitize deterministic THD d64 bf16", c, o, false, true});
  c = Config(2, 2, 2, 200, 400, 128, FUSEDATTN_DTYPE_FLOAT16);
  c.return_max_logit = 0;
  c.deterministic = 1;
  c.mask = FUSEDATTN_MASK_PADDING;
  TensorOptions p;
  p.len_q = {200, 33};
  p.len_kv = {400, 131};
  ExpectBackwardMatches({"sanitize deterministic padding d128 fp16", c, p, true, true});
  c = Config(1, 4, 1, 260, 390, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.return_max_logit = 0;
  c.deterministic = 1;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  c.softcap = 0.8;
  ExpectBackwardMatches({"sanitize deterministic softcap causal gqa d128 bf16", c, {}, false, true});
}

// Softcap and ALiBi on the Hopper backward (the softcap-alibi instances), both head dims:
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='FlashWgmmaBwdSanitize.SoftcapAlibiSmallCases'
TEST(FlashWgmmaBwdSanitize, SoftcapAlibiSmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (const Case& k : BackwardSanitizeCases("softcap alibi ", SoftcapAndAlibi))
    ExpectBackwardMatches(k);
  fusedattn_config c = Config(2, 4, 1, 100, 180, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.return_max_logit = 0;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  ExpectBackwardMatches({"sanitize alibi causal gqa d128 bf16", c, {}, false, true});
}

}  // namespace
}  // namespace fusedattn::testing
