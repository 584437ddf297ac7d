// The cuDNN backend's FP8 planning, on the CPU: which FP8 problems it leaves to cuDNN's FP8 graphs
// and which it refuses (naming the feature and the reference), the spec and keys that separate
// FP8 graphs by their dtypes, and FP8 plans staying per shape and per batch. Compiled when the
// cuDNN backend is built; needs no GPU.
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <string>

#include "backends/cudnn/plan_spec.h"
#include "problem/problem.h"

namespace fusedattn::cudnn {
namespace {

fusedattn_config Fp8Config() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = c.max_seqlen_kv = 64;
  c.head_dim_qk = c.head_dim_v = 128;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FP8_E4M3;
  c.do_dtype = c.dqkv_dtype = FUSEDATTN_DTYPE_FP8_E5M2;
  c.is_training = 1;
  c.device = FUSEDATTN_DEVICE_CUDA;
  return c;
}

Problem MakeCuda(const fusedattn_config& c) {
  Problem p;
  Status s = MakeProblem(&c, true, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

TEST(CudnnFp8PreCheck, LeavesDenseUnmaskedAndCausalProblemsToCudnn) {
  for (fusedattn_mask mask : {FUSEDATTN_MASK_NONE, FUSEDATTN_MASK_CAUSAL}) {
    fusedattn_config c = Fp8Config();
    c.mask = mask;
    Status s = PreCheck(MakeCuda(c));
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

TEST(CudnnFp8PreCheck, RefusesWhatNeedsOurKernelsNamingTheFeatureAndTheReference) {
  struct Case {
    const char* name;
    void (*edit)(fusedattn_config*);
    const char* mentions;
  };
  const Case cases[] = {
      {"padding", [](fusedattn_config* c) { c->mask = FUSEDATTN_MASK_PADDING; }, "mask = padding"},
      {"thd",
       [](fusedattn_config* c) {
         c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format =
             FUSEDATTN_FORMAT_THD;
       },
       "THD"},
      {"unseen keys",
       [](fusedattn_config* c) { c->mask = FUSEDATTN_MASK_CAUSAL, c->max_seqlen_kv = 96; },
       "without a partner"},
      {"band with sq > skv",
       [](fusedattn_config* c) {
         c->mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, c->max_seqlen_q = 96;
       },
       "padded kernels"},
      {"bias", [](fusedattn_config* c) { c->bias_type = FUSEDATTN_BIAS_POST_SCALE; },
       "bias_type = post_scale"},
      {"sink", [](fusedattn_config* c) { c->softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE; },
       "softmax_type = off_by_one"},
      {"softcap", [](fusedattn_config* c) { c->softcap = 30.0; }, "softcap = 30"},
      {"dropout", [](fusedattn_config* c) { c->dropout = 0.1; }, "dropout = 0.1"},
      {"max logit", [](fusedattn_config* c) { c->return_max_logit = 1; }, "return_max_logit"},
      {"float32 O", [](fusedattn_config* c) { c->o_dtype = FUSEDATTN_DTYPE_FLOAT32; },
       "o_dtype = float32"},
      {"float32 grads", [](fusedattn_config* c) { c->dqkv_dtype = FUSEDATTN_DTYPE_FLOAT32; },
       "dqkv_dtype = float32"},
      {"head dim 72", [](fusedattn_config* c) { c->head_dim_qk = c->head_dim_v = 72; },
       "head_dim_qk = 72"},
  };
  for (const Case& k : cases) {
    fusedattn_config c = Fp8Config();
    k.edit(&c);
    Status s = PreCheck(MakeCuda(c));
    EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << k.name;
    EXPECT_NE(s.message().find(k.mentions), std::string::npos) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find("FP8"), std::string::npos) << k.name << ": " << s.message();
  }
}

TEST(CudnnFp8Spec, CarriesTheDtypesAndSeparatesTheKeys) {
  const DeviceInfo device{0, 90, 91900};
  const Problem p = MakeCuda(Fp8Config());
  const SdpaGraphSpec fwd = ForwardSpec(p, CanonicalFwdTensors(p));
  const SdpaGraphSpec bwd = BackwardSpec(p, CanonicalBwdTensors(p));
  EXPECT_TRUE(fwd.fp8 && bwd.fp8);
  EXPECT_EQ(fwd.io_dtype, FUSEDATTN_DTYPE_FP8_E4M3);
  EXPECT_EQ(bwd.o_dtype, FUSEDATTN_DTYPE_FP8_E4M3);
  EXPECT_EQ(bwd.do_dtype, FUSEDATTN_DTYPE_FP8_E5M2);
  EXPECT_EQ(bwd.dqkv_dtype, FUSEDATTN_DTYPE_FP8_E5M2);
  // Another dO type or O type is another graph; the same problem built twice is one.
  fusedattn_config other = Fp8Config();
  other.do_dtype = other.dqkv_dtype = FUSEDATTN_DTYPE_FP8_E4M3;
  const Problem q = MakeCuda(other);
  EXPECT_FALSE(MakePlanKey(bwd, device) == MakePlanKey(BackwardSpec(q, CanonicalBwdTensors(q)),
                                                       device));
  other = Fp8Config();
  other.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  const Problem r = MakeCuda(other);
  EXPECT_FALSE(MakePlanKey(fwd, device) ==
               MakePlanKey(ForwardSpec(r, CanonicalFwdTensors(r)), device));
  EXPECT_FALSE(MakeStructureKey(fwd, device) ==
               MakeStructureKey(ForwardSpec(r, CanonicalFwdTensors(r)), device));
  const Problem again = MakeCuda(Fp8Config());
  EXPECT_TRUE(MakePlanKey(fwd, device) ==
              MakePlanKey(ForwardSpec(again, CanonicalFwdTensors(again)), device));
}

TEST(CudnnFp8Spec, PlansStayPerShapeAndPerBatch) {
  const Problem p = MakeCuda(Fp8Config());
  const SdpaGraphSpec fwd = ForwardSpec(p, CanonicalFwdTensors(p));
  EXPECT_EQ(DynamicShapeRefusal(fwd).code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(BatchChunkRefusal(fwd).code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
}

}  // namespace
}  // namespace fusedattn::cudnn

#endif  // FUSEDATTN_WITH_CUDNN
