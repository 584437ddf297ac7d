// Score modifiers at the API's edges: what a config and a call must carry (the graph finalized,
// its tensors with the declared shapes and dtypes, gradients exactly for the tensors that ask),
// messages that name the tensor, outputs untouched on refusal; callers built against 0.1.0
// (shorter structs) still served; GPU backends refusing graphs with a reason; problem keys that
// follow the graph's structure, not the handle's address.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "flex/score_mod.h"
#include "fusedattn/score_mod.hpp"
#include "problem/problem.h"
#include "select/select.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;

constexpr uint32_t kB = FUSEDATTN_SCORE_MOD_AXIS_BATCH, kH = FUSEDATTN_SCORE_MOD_AXIS_HEAD,
                   kQ = FUSEDATTN_SCORE_MOD_AXIS_Q, kKV = FUSEDATTN_SCORE_MOD_AXIS_KV;

fusedattn_config Config() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = 2, c.heads_q = 2, c.heads_kv = 1;
  c.max_seqlen_q = 3, c.max_seqlen_kv = 4, c.head_dim_qk = 4, c.head_dim_v = 4;
  c.is_training = 1;
  return c;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A graph with two tensors: int32 document ids [batch, q] and a learnable float32 bias [head, kv].
struct Call {
  ScoreMod mod;
  fusedattn_config config = Config();
  ProblemTensors t;
  HostTensor doc{FUSEDATTN_DTYPE_INT32, {2, 3}};
  HostTensor bias{FUSEDATTN_DTYPE_FLOAT32, {2, 4}};
  HostTensor dbias{FUSEDATTN_DTYPE_FLOAT32, {2, 4}};
  std::vector<fusedattn_tensor> tensors, grads;

  Call() {
    Expr d = mod.tensor("doc", FUSEDATTN_DTYPE_INT32, kB | kQ);
    Expr b = mod.tensor("bias", FUSEDATTN_DTYPE_FLOAT32, kH | kKV, true);
    mod.set_score(mod.score() + b).set_mask(d >= 0.0).finalize();
    config.score_mod = mod.get();
    t = MakeProblemTensors(config, {});
    doc.fill(1.0);
    bias.fill(0.5);
    dbias.poison();
    tensors = {doc.desc(), bias.desc()};
    grads = {fusedattn_tensor{}, dbias.desc()};
  }
  fusedattn_fwd_args fwd() {
    fusedattn_fwd_args a = t.fwd_args();
    a.num_score_mod_tensors = static_cast<int64_t>(tensors.size());
    a.score_mod_tensors = tensors.data();
    return a;
  }
  fusedattn_bwd_args bwd() {
    fusedattn_bwd_args a = t.bwd_args();
    a.num_score_mod_tensors = static_cast<int64_t>(tensors.size());
    a.score_mod_tensors = tensors.data();
    a.d_score_mod_tensors = grads.data();
    return a;
  }
};

void ExpectRefused(const test::Result& r, fusedattn_status code,
                   std::initializer_list<const char*> mentions) {
  EXPECT_EQ(r.status, code) << test::StatusText(r);
  for (const char* m : mentions) EXPECT_TRUE(Contains(r.message, m)) << "lacks '" << m << "': " << r.message;
}

TEST(FlexValidation, TheSetupRuns) {
  Call s;
  EXPECT_TRUE(test::Forward(s.config, s.fwd()).ok());
  test::Result r = test::Backward(s.config, s.bwd());
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_FALSE(s.dbias.is_poison(0));
}

TEST(FlexValidation, AGraphMustBeFinalizedBeforeAConfigTakesIt) {
  ScoreMod mod;
  mod.set_score(mod.score() * 2.0);
  fusedattn_config c = Config();
  c.score_mod = mod.get();
  fusedattn_backend backend;
  ExpectRefused(test::GetBackend(c, &backend), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"config.score_mod is not finalized", "fusedattn_score_mod_finalize"});
}

TEST(FlexValidation, AConfigPointingAtSomethingElseIsRefused) {
  struct NotAGraph {
    uint64_t words[8] = {};
  } other;
  fusedattn_config c = Config();
  c.score_mod = reinterpret_cast<const fusedattn_score_mod*>(&other);
  fusedattn_backend backend;
  ExpectRefused(test::GetBackend(c, &backend), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"config.score_mod does not point at a live fusedattn_score_mod"});
}

TEST(FlexValidation, TheNumberOfTensorsMustMatchTheGraph) {
  Call s;
  fusedattn_fwd_args a = s.fwd();
  a.num_score_mod_tensors = 1;
  ExpectRefused(test::Forward(s.config, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"args.num_score_mod_tensors = 1", "declares 2 tensors ('doc', 'bias')"});
  a = s.fwd();
  a.score_mod_tensors = nullptr;
  ExpectRefused(test::Forward(s.config, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"args.score_mod_tensors is NULL"});
  EXPECT_TRUE(test::AllPoison(s.t.o)) << "a refused call wrote o";
}

TEST(FlexValidation, TensorsWithoutAGraphAreRefused) {
  Call s;
  fusedattn_config plain = Config();
  ProblemTensors t = MakeProblemTensors(plain, {});
  fusedattn_fwd_args a = t.fwd_args();
  a.num_score_mod_tensors = 2;
  a.score_mod_tensors = s.tensors.data();
  ExpectRefused(test::Forward(plain, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"args.num_score_mod_tensors = 2 but config.score_mod is NULL"});
}

TEST(FlexValidation, ATensorOfTheWrongDtypeIsNamed) {
  Call s;
  HostTensor doc_float(FUSEDATTN_DTYPE_FLOAT32, {2, 3});
  s.tensors[0] = doc_float.desc();
  ExpectRefused(test::Forward(s.config, s.fwd()), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"args.score_mod_tensors[0] ('doc').dtype = float32", "int32 is expected"});
}

TEST(FlexValidation, ATensorOfTheWrongRankOrShapeIsNamed) {
  Call s;
  HostTensor full(FUSEDATTN_DTYPE_FLOAT32, {2, 2, 3, 4});
  s.tensors[1] = full.desc();
  ExpectRefused(test::Forward(s.config, s.fwd()), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"args.score_mod_tensors[1] ('bias').ndim = 4", "axes [head, kv]", "[2, 4]"});
  HostTensor wrong(FUSEDATTN_DTYPE_FLOAT32, {2, 5});
  s.tensors[1] = wrong.desc();
  ExpectRefused(test::Forward(s.config, s.fwd()), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"args.score_mod_tensors[1] ('bias').shape = [2, 5] but [2, 4] is expected"});
  s.tensors[1] = fusedattn_tensor{};
  ExpectRefused(test::Forward(s.config, s.fwd()), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"args.score_mod_tensors[1] ('bias').data is NULL"});
}

TEST(FlexValidation, AScalarTensorHasShapeOne) {
  ScoreMod mod;
  mod.set_score(mod.score() * mod.tensor("temperature", FUSEDATTN_DTYPE_FLOAT32, 0)).finalize();
  fusedattn_config c = Config();
  c.is_training = 0;
  c.score_mod = mod.get();
  ProblemTensors t = MakeProblemTensors(c, {});
  HostTensor scalar(FUSEDATTN_DTYPE_FLOAT32, {1});
  scalar.fill(0.5);
  fusedattn_tensor desc = scalar.desc();
  fusedattn_fwd_args a = t.fwd_args();
  a.num_score_mod_tensors = 1;
  a.score_mod_tensors = &desc;
  test::Result r = test::Forward(c, a);
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
}

TEST(FlexValidation, GradientsAreGivenExactlyForTheTensorsThatRequireThem) {
  {
    Call s;
    s.grads[1] = fusedattn_tensor{};
    ExpectRefused(test::Backward(s.config, s.bwd()), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                  {"args.d_score_mod_tensors[1] ('bias').data is NULL"});
  }
  {
    Call s;
    fusedattn_bwd_args a = s.bwd();
    a.d_score_mod_tensors = nullptr;
    ExpectRefused(test::Backward(s.config, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                  {"args.d_score_mod_tensors is NULL but tensor 'bias' requires grad"});
  }
  {
    Call s;
    HostTensor ddoc(FUSEDATTN_DTYPE_INT32, {2, 3});
    s.grads[0] = ddoc.desc();
    ExpectRefused(test::Backward(s.config, s.bwd()), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                  {"args.d_score_mod_tensors[0] ('doc') is given", "requires_grad = 0"});
  }
  {
    Call s;  // an output whose elements overlap
    HostTensor storage(FUSEDATTN_DTYPE_FLOAT32, {4});
    s.grads[1] = MakeTensor(storage.data(), FUSEDATTN_DTYPE_FLOAT32, {2, 4}, {1, 1});
    ExpectRefused(test::Backward(s.config, s.bwd()), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                  {"args.d_score_mod_tensors[1] ('bias').strides make elements overlap"});
    EXPECT_TRUE(test::AllPoison(s.t.dq)) << "a refused call wrote dq";
  }
}

// ---------------------------------------------------------------------------------------------
// Callers built against 0.1.0
// ---------------------------------------------------------------------------------------------

TEST(FlexAbi, ConfigsAndArgsOfVersion010AreReadWithTheNewFieldsAtTheirDefaults) {
  fusedattn_config c = Config();
  ProblemTensors t = MakeProblemTensors(c, {});
  // What a 0.1.0 caller's struct holds beyond its end is not read: stale bytes there are ignored.
  Call stale;
  c.struct_size = offsetof(fusedattn_config, score_mod);
  c.score_mod = stale.mod.get();
  fusedattn_fwd_args fa = t.fwd_args();
  fa.struct_size = offsetof(fusedattn_fwd_args, num_score_mod_tensors);
  fa.num_score_mod_tensors = 99;
  test::Result r = test::Forward(c, fa);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  fusedattn_bwd_args ba = t.bwd_args();
  ba.struct_size = offsetof(fusedattn_bwd_args, num_score_mod_tensors);
  ba.num_score_mod_tensors = 99;
  r = test::Backward(c, ba);
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  // The same problem at full size gives the same results.
  fusedattn_config full = Config();
  ProblemTensors again = t;
  again.poison_outputs();
  ASSERT_TRUE(test::Forward(full, again.fwd_args()).ok());
  ASSERT_TRUE(test::Backward(full, again.bwd_args()).ok());
  EXPECT_TRUE(test::SameBytes(again.o, t.o));
  EXPECT_TRUE(test::SameBytes(again.dq, t.dq));
}

TEST(FlexAbi, OtherStructSizesAreRefusedNamingBothAcceptedSizes) {
  fusedattn_config c = Config();
  c.struct_size = offsetof(fusedattn_config, score_mod) - 8;
  fusedattn_backend backend;
  ExpectRefused(test::GetBackend(c, &backend), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                {"config.struct_size", std::to_string(sizeof(fusedattn_config)).c_str(),
                 std::to_string(offsetof(fusedattn_config, score_mod)).c_str()});
}

// ---------------------------------------------------------------------------------------------
// Backends and problem keys
// ---------------------------------------------------------------------------------------------

TEST(FlexBackends, OnTheCpuTheReferenceRunsScoreMods) {
  Call s;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(s.config, &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
}

// Each GPU backend compiled in refuses a problem with a score_mod in check(), saying why; the
// check comes before anything that needs a device, so it is seen here too.
// small_seq refuses score_mods up front; flash compiles them for its float16/bfloat16 kernels
// (this float32 problem is refused with that reason); cuDNN runs them (its planning is tested in
// cudnn_score_mod_plan_test.cpp; without a device its check() fails for lack of one).
TEST(FlexBackends, NativeBackendsRefuseScoreModsWithAReasonCudnnDoesNot) {
  Call s;
  fusedattn_config c = s.config;
  c.device = FUSEDATTN_DEVICE_CUDA;
  Problem p;
  Status made = MakeProblem(&c, /*has_cuda_device=*/true, &p);
  ASSERT_TRUE(made.ok()) << made.message();
  const char* kSmallSeq =
      "score_mod graphs: small_seq has no score modifier hook (cuDNN, flash and the reference "
      "backend run them)";
  int compiled_in = 0;
  for (fusedattn_backend id :
       {FUSEDATTN_BACKEND_CUDNN, FUSEDATTN_BACKEND_FLASH, FUSEDATTN_BACKEND_SMALL_SEQ}) {
    Backend* b = FindBackend(id);
    ASSERT_NE(b, nullptr);
    Status s = b->check(p);
    if (Contains(s.message(), "not built")) continue;
    ++compiled_in;
    if (id == FUSEDATTN_BACKEND_CUDNN) {
      EXPECT_NE(s.message(), kSmallSeq) << b->name();
      continue;
    }
    if (id == FUSEDATTN_BACKEND_FLASH) {  // compiles graphs, on its float16/bfloat16 kernels
      EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << b->name();
      EXPECT_TRUE(Contains(s.message(), "qkv_dtype = float32")) << s.message();
      continue;
    }
    EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << b->name();
    EXPECT_EQ(s.message(), kSmallSeq) << b->name();
  }
  if (compiled_in == 0) GTEST_SKIP() << "no GPU backend is built in (no CUDA toolkit)";
}

Problem ProblemWith(const fusedattn_score_mod* graph) {
  fusedattn_config c = Config();
  c.score_mod = graph;
  Problem p;
  Status s = MakeProblem(&c, false, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

TEST(FlexProblemKey, FollowsTheGraphsStructureNotTheHandle) {
  ScoreMod a, b, c;
  a.set_score(30.0 * tanh(a.score() / 30.0)).finalize();
  b.set_score(30.0 * tanh(b.score() / 30.0)).finalize();
  c.set_score(30.0 * tanh(c.score() / 29.0)).finalize();
  ProblemKey key_a = KeyOf(ProblemWith(a.get())), key_b = KeyOf(ProblemWith(b.get()));
  ProblemKey key_c = KeyOf(ProblemWith(c.get())), key_none = KeyOf(ProblemWith(nullptr));
  EXPECT_TRUE(key_a == key_b);
  EXPECT_EQ(ProblemKeyHash()(key_a), ProblemKeyHash()(key_b));
  EXPECT_FALSE(key_a == key_c);
  EXPECT_FALSE(key_a == key_none);
  EXPECT_FALSE(key_none == key_a);
  // Equal words with different graphs (as a hash collision would give) still differ.
  ProblemKey forged = key_c;
  forged.words = key_a.words;
  EXPECT_FALSE(key_a == forged);
}

// A selection cached for one graph serves an equal graph built later, after the first handle is
// gone (a new handle may even reuse its address): the key holds the graph, not the address.
TEST(FlexProblemKey, SelectionSurvivesTheHandleThatFilledIt) {
  ClearSelectionCache();
  for (int round = 0; round < 3; ++round) {
    ScoreMod mod;
    if (round == 1) {
      mod.set_mask(mod.q_idx() >= mod.kv_idx());
    } else {
      mod.set_score(mod.score() * 2.0);
    }
    mod.finalize();
    fusedattn_config c = Config();
    c.score_mod = mod.get();
    fusedattn_backend backend;
    test::Result r = test::GetBackend(c, &backend);
    ASSERT_TRUE(r.ok()) << test::StatusText(r);
    EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
  }
}

}  // namespace
}  // namespace fusedattn
