// Times forward, backward and forward+backward of a backend (flash by default) on a GPU and prints
// TFLOP/s, for iterating on kernels on the device. The side-by-side comparison with PyTorch is
// the Python harness's job.
//
// FLOPs (as in shared/DESIGN.md): forward 4 * b * h * sq * skv * d, halved when causal; backward
// timed alone 2.5x that; forward+backward timed as one call 3.5x that.
//
// Usage: flash_bench [--backend flash|cudnn|...] [--dtype bf16|fp16|all] [--d 64|128|...|all]
//                    [--seqlen N|all] [--causal 0|1|all] [--tokens 16384] [--hidden 2048]
//                    [--iters 10] [--fwd-only] [--deterministic] [--softcap C] [--alibi]
//                    [--bias pre|post] [--bias-broadcast] [--bias-fp32] [--dropout P]
//                    [--score-mod relbias|softcap|alibi|window|doc]
//        flash_bench --paged-prefill [--batch 8] [--new-tokens 2048] [--cached 8192]
//                    [--heads-q 32] [--heads-kv 8] [--page-sizes 16,64] [--d 128] [--dtype bf16]
// --softcap C (> 0) caps the scores at C (fusedattn.h's softcap); --alibi adds ALiBi with the
// ALiBi paper's slopes 2^(-8 (h + 1) / heads). With either, flash's Hopper forward and backward
// run their softcap-alibi variant ([hopper-wgmma d128 softcap-alibi]).
// --deterministic sets config.deterministic: on sm_90 at d64/d128 the Hopper backward then adds
// dQ in a fixed key order (the backward's bracket ends in "dQ fixed-order+convert"; without the
// flag "dQ atomic+convert"); bias tensors and dropout run on mma.sync ("dQ deterministic-kernel").
// --bias pre|post adds a pre- or post-scale bias tensor [batch, heads, s, s] (--bias-broadcast:
// [1, 1, s, s], shared by every sequence and head), in the qkv dtype (--bias-fp32: float32),
// filled on the device with one finite value (no host copy of a tensor that reaches 8 GiB at
// s 16384); flash's Hopper forward runs its bias variant ([hopper-wgmma d128 bias]), the
// backward mma.sync (no bias gradient is asked for). --bias and --alibi exclude each other.
// --dropout P (0 < P < 1) drops with probability P (fusedattn.h's Philox mask, seed and offset
// fixed) and times the same problem without dropout first, in the same process on the same
// inputs: the line adds "plain fwd X ms ..., speed dropout/plain Y" (plain ms / dropout ms). On
// sm_90 flash's forward runs the Hopper kernel's dropout variant ([hopper-wgmma d128 dropout];
// with a bias tensor the mma.sync full kernel) and the backward the mma.sync one
// ([mma.sync d128 full]); FUSEDATTN_FLASH_WGMMA=0 gives the mma.sync forward for comparison.
// --score-mod NAME times a fusedattn.flex graph (config.score_mod) next to the plain forward of
// the same problem in the same process, on the same inputs: relbias (s + 0.05 (q_idx - kv_idx)),
// softcap (30 tanh(s / 30)), alibi (s - slope[h] |q_idx_br - kv_idx|, a float32 slopes tensor
// with the ALiBi paper's slopes), window (mask_mod: kv_idx <= q_idx and q_idx - kv_idx < 1024,
// block sparsity), doc (mask_mod: equal document ids of query and key, int32 [batch, s] tensors,
// documents of 2048 tokens, and causal). On sm_90 flash's forward then runs the Hopper kernel
// compiled with the graph ([hopper-score_mod-jit d128 score_mod]), the backward the mma.sync
// score_mod kernel ([score_mod-jit d128 full]); the line adds "plain fwd X ms ..., speed
// score_mod/plain Y" (plain ms / score_mod ms; issue 17 asks >= 0.9 for relbias and softcap
// against the plain Hopper forward). TFLOP/s are
// the dense count even for the masks (their time is what the sparsity saves). The first call
// compiles the graph with NVRTC (seconds): TimeMs's warm-up calls take it. Excludes --softcap,
// --alibi, --bias and --dropout (those would send the graph to the mma.sync score_mod kernel).
// With --backend flash each line says which forward and which backward key-block kernel ran, as
// the call's plan (planner.h) names it: [hopper-wgmma d128 plain] (Hopper, sm_90) or
// [mma.sync d128 plain]; FUSEDATTN_FLASH_WGMMA=0 turns both wgmma kernels off.
// Defaults run the standard grid: bf16 and fp16, d 64 and 128, seqlen 1024..16384 at 16k tokens
// (batch = tokens / seqlen, heads = hidden / d), causal and not. Exits 0 without a GPU.
//
// --paged-prefill times chunked prefill against a paged K/V cache next to the same problem with
// contiguous K/V, forward only (issue 21: paged >= 0.95x contiguous): --batch 8 sequences of
// --new-tokens 2048 THD queries each against --cached 8192 earlier tokens plus the chunk's own
// (10240 keys), causal bottom-right, --heads-q 32 --heads-kv 8, d from --d (128), dtypes from
// --dtype (bf16), --page-sizes 16,64. The pages of every sequence are a shuffled permutation of
// the pool. Each line prints both times, TFLOP/s and the ratio contiguous ms / paged ms, with the
// kernels the plans ran.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "fusedattn/score_mod.hpp"
#include "native_bench_util.h"
#ifdef FUSEDATTN_WITH_FLASH
#include "backends/flash/planner.h"  // which kernels run (FUSEDATTN_FLASH_WGMMA=0|1)
#endif

namespace {

using fusedattn::bench::ApiOk;
using fusedattn::bench::CudaOk;
using fusedattn::bench::DeviceTensor;
using fusedattn::bench::TimeMs;

#ifdef FUSEDATTN_WITH_FLASH
// The kernel flash's plan runs for these arguments (planner.h), e.g. "hopper-wgmma d128 plain".
std::string KernelText(fusedattn::flash::KernelPath path, int instance,
                       fusedattn::flash::KernelVariant variant) {
  std::string text = fusedattn::flash::KernelPathName(path);
  if (instance > 0) text += " d" + std::to_string(instance);
  return text + " " + fusedattn::flash::KernelVariantName(variant);
}
std::string ForwardKernel(const fusedattn_config& c, const fusedattn_fwd_args& a) {
  fusedattn::flash::ForwardPlan plan;
  if (!fusedattn::flash::PlanForwardCall(c, a, &plan).ok() || !plan.status.ok()) return "no plan";
  return KernelText(plan.path, plan.instance, plan.variant);
}
std::string BackwardKernel(const fusedattn_config& c, const fusedattn_bwd_args& a) {
  fusedattn::flash::BackwardPlan plan;
  if (!fusedattn::flash::PlanBackwardCall(c, a, &plan).ok() || !plan.status.ok()) return "no plan";
  return KernelText(plan.path, plan.instance, plan.variant) + ", dQ " +
         fusedattn::flash::DqModeName(plan.dq);
}
#endif

struct Options {
  fusedattn_backend backend = FUSEDATTN_BACKEND_FLASH;
  std::vector<fusedattn_dtype> dtypes = {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16};
  std::vector<int64_t> dims = {64, 128};
  std::vector<int64_t> seqlens = {1024, 2048, 4096, 8192, 16384};
  std::vector<int> causal = {0, 1};
  int64_t tokens = 16384, hidden = 2048;
  int iters = 10;
  bool fwd_only = false, deterministic = false;
  double softcap = 0.0;  // 0: off
  bool alibi = false;
  fusedattn_bias bias = FUSEDATTN_BIAS_NONE;  // PRE_SCALE or POST_SCALE: a bias tensor
  bool bias_broadcast = false, bias_fp32 = false;
  std::string score_mod;  // --score-mod: relbias, softcap, alibi, window, doc (empty: none)
  double dropout = 0.0;   // --dropout: the probability of dropping (0: off)
  // --paged-prefill
  bool paged_prefill = false;
  int64_t batch = 8, new_tokens = 2048, cached = 8192, heads_q = 32, heads_kv = 8;
  std::vector<int64_t> page_sizes = {16, 64};
};

#ifdef FUSEDATTN_WITH_FLASH
std::string ForwardPlanText(const fusedattn_config& c, const fusedattn_fwd_args& a) {
  fusedattn::flash::ForwardPlan plan;
  if (!fusedattn::flash::PlanForwardCall(c, a, &plan).ok()) return "no plan";
  return fusedattn::flash::DescribeForwardPlan(plan);
}
#endif

bool Upload(DeviceTensor& t, const std::vector<int32_t>& host) {
  return t.data && CudaOk(cudaMemcpy(t.data, host.data(), host.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice),
                          "upload int32");
}

// Chunked prefill, paged against contiguous K/V (see the top of the file).
void RunPagedPrefill(const Options& o, fusedattn_dtype dtype, int64_t d) {
  const int64_t b = o.batch, sq = o.new_tokens, skv = o.cached + o.new_tokens;
  const int64_t hq = o.heads_q, hkv = o.heads_kv;
  std::mt19937 rng(1);
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = dtype;
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.backend = o.backend;
  c.device = FUSEDATTN_DEVICE_CUDA;

  DeviceTensor q(dtype, {b * sq, hq, d}, rng, true), out(dtype, {b * sq, hq, d}, rng, false);
  DeviceTensor k(dtype, {b * skv, hkv, d}, rng, true), v(dtype, {b * skv, hkv, d}, rng, true);
  DeviceTensor cu_q(FUSEDATTN_DTYPE_INT32, {b + 1}), cu_kv(FUSEDATTN_DTYPE_INT32, {b + 1});
  std::vector<int32_t> host_cu_q(b + 1), host_cu_kv(b + 1);
  for (int64_t i = 0; i <= b; ++i)
    host_cu_q[i] = static_cast<int32_t>(i * sq), host_cu_kv[i] = static_cast<int32_t>(i * skv);
  if (!q.data || !out.data || !k.data || !v.data || !Upload(cu_q, host_cu_q) ||
      !Upload(cu_kv, host_cu_kv))
    return;
  // FLOPs of the keys each query sees: query i of a sequence sees cached + i + 1 keys.
  const double pairs = static_cast<double>(b) * (sq * static_cast<double>(o.cached) +
                                                 sq * (sq + 1) / 2.0);
  const double flops = 4.0 * hq * d * pairs;
  char msg[2048];
  auto time_forward = [&](const fusedattn_config& config, const fusedattn_fwd_args& args,
                          const char* what) {
    size_t bytes = 0;
    if (!ApiOk(fusedattn_fwd_workspace_size(&config, &bytes, msg, sizeof msg), what, msg))
      return -1.0;
    void* workspace = nullptr;
    if (bytes && !CudaOk(cudaMalloc(&workspace, bytes), "cudaMalloc workspace")) return -1.0;
    const double ms = TimeMs(o.iters, [&] {
      return ApiOk(fusedattn_fwd(&config, &args, workspace, bytes, nullptr, msg, sizeof msg),
                   what, msg);
    });
    if (workspace) cudaFree(workspace);
    return ms;
  };

  fusedattn_fwd_args contiguous = fusedattn_fwd_args_init();
  contiguous.q = q.desc, contiguous.k = k.desc, contiguous.v = v.desc, contiguous.o = out.desc;
  contiguous.cu_seqlens_q = cu_q.desc, contiguous.cu_seqlens_kv = cu_kv.desc;
  const double contiguous_ms = time_forward(c, contiguous, "contiguous fwd");
  std::string contiguous_plan;
#ifdef FUSEDATTN_WITH_FLASH
  if (o.backend == FUSEDATTN_BACKEND_FLASH) contiguous_plan = ForwardPlanText(c, contiguous);
#endif

  for (int64_t page : o.page_sizes) {
    const int64_t per_seq = (skv + page - 1) / page, pages = b * per_seq;
    fusedattn_config pc = c;
    pc.kv_format = FUSEDATTN_FORMAT_BSHD;  // pools [num_pages, page_size, heads_kv, d]
    pc.page_size = page;
    DeviceTensor pool_k(dtype, {pages, page, hkv, d}, rng, true),
        pool_v(dtype, {pages, page, hkv, d}, rng, true);
    DeviceTensor table(FUSEDATTN_DTYPE_INT32, {b, per_seq}), lens(FUSEDATTN_DTYPE_INT32, {b});
    std::vector<int32_t> host_table(pages), host_lens(b, static_cast<int32_t>(skv));
    for (int64_t i = 0; i < pages; ++i) host_table[i] = static_cast<int32_t>(i);
    std::shuffle(host_table.begin(), host_table.end(), rng);
    if (!pool_k.data || !pool_v.data || !Upload(table, host_table) || !Upload(lens, host_lens))
      return;
    fusedattn_fwd_args paged = fusedattn_fwd_args_init();
    paged.q = q.desc, paged.k = pool_k.desc, paged.v = pool_v.desc, paged.o = out.desc;
    paged.cu_seqlens_q = cu_q.desc;
    paged.page_table = table.desc, paged.seqlens_kv = lens.desc;
    const double paged_ms = time_forward(pc, paged, "paged fwd");
    std::printf("%s d=%lld b=%lld new=%lld cached=%lld hq=%lld hkv=%lld page=%-4lld "
                "contiguous %8.3f ms %6.1f TFLOP/s | paged %8.3f ms %6.1f TFLOP/s | "
                "contiguous/paged %.3f",
                dtype == FUSEDATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16", (long long)d, (long long)b,
                (long long)sq, (long long)o.cached, (long long)hq, (long long)hkv,
                (long long)page, contiguous_ms, flops / contiguous_ms / 1e9, paged_ms,
                flops / paged_ms / 1e9, paged_ms > 0 ? contiguous_ms / paged_ms : 0.0);
#ifdef FUSEDATTN_WITH_FLASH
    if (o.backend == FUSEDATTN_BACKEND_FLASH)
      std::printf(" [contiguous: %s] [paged: %s]", contiguous_plan.c_str(),
                  ForwardPlanText(pc, paged).c_str());
#endif
    std::printf("\n");
    std::fflush(stdout);
  }
}

void RunOne(const Options& o, fusedattn_dtype dtype, int64_t d, int64_t seqlen, int causal) {
  const int64_t batch = o.tokens / seqlen > 0 ? o.tokens / seqlen : 1;
  const int64_t heads = o.hidden / d > 0 ? o.hidden / d : 1;
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = batch, c.heads_q = c.heads_kv = heads;
  c.max_seqlen_q = c.max_seqlen_kv = seqlen;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = dtype;
  c.mask = causal ? FUSEDATTN_MASK_CAUSAL : FUSEDATTN_MASK_NONE;
  c.is_training = 1;
  c.deterministic = o.deterministic;
  c.softcap = o.softcap;
  if (o.alibi) c.bias_type = FUSEDATTN_BIAS_ALIBI;
  if (o.bias != FUSEDATTN_BIAS_NONE) {
    c.bias_type = o.bias;
    c.bias_batch = o.bias_broadcast ? 1 : batch;
    c.bias_heads = o.bias_broadcast ? 1 : heads;
  }
  c.backend = o.backend;
  c.device = FUSEDATTN_DEVICE_CUDA;

  std::mt19937 rng(1);
  const std::vector<int64_t> shape = {batch, seqlen, heads, d};
  DeviceTensor q(dtype, shape, rng, true), k(dtype, shape, rng, true), v(dtype, shape, rng, true);
  DeviceTensor out(dtype, shape, rng, false), d_o(dtype, shape, rng, true);
  DeviceTensor dq(dtype, shape, rng, false), dk(dtype, shape, rng, false),
      dv(dtype, shape, rng, false);
  DeviceTensor lse(FUSEDATTN_DTYPE_FLOAT32, {batch, heads, seqlen}, rng, false);
  if (!q.data || !k.data || !v.data || !out.data || !d_o.data || !dq.data || !dk.data ||
      !dv.data || !lse.data)
    return;

  DeviceTensor slopes(FUSEDATTN_DTYPE_FLOAT32, {heads});  // ALiBi: the paper's slopes
  if (!slopes.data) return;
  {
    std::vector<float> host(heads);
    for (int64_t h = 0; h < heads; ++h)
      host[h] = std::pow(2.f, -8.f * static_cast<float>(h + 1) / static_cast<float>(heads));
    if (!CudaOk(cudaMemcpy(slopes.data, host.data(), heads * sizeof(float),
                           cudaMemcpyHostToDevice),
                "upload slopes"))
      return;
  }

  // --score-mod: the graph (alive through the calls) and its tensors on the device.
  fusedattn::ScoreMod mod;
  DeviceTensor doc_ids(FUSEDATTN_DTYPE_INT32, {batch, seqlen});
  if (!doc_ids.data) return;
  std::vector<fusedattn_tensor> graph_tensors;
  if (!o.score_mod.empty()) {
    using fusedattn::Expr;
    if (o.score_mod == "relbias") {
      mod.set_score(mod.score() + 0.05 * (mod.q_idx() - mod.kv_idx()));
    } else if (o.score_mod == "softcap") {
      mod.set_score(30.0 * tanh(mod.score() / 30.0));
    } else if (o.score_mod == "alibi") {
      Expr slope = mod.tensor("slopes", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
      mod.set_score(mod.score() - slope * abs(mod.q_idx_br() - mod.kv_idx()));
      graph_tensors.push_back(slopes.desc);
    } else if (o.score_mod == "window") {
      mod.set_mask(mod.kv_idx() <= mod.q_idx() && mod.q_idx() - mod.kv_idx() < 1024.0);
    } else {  // doc
      Expr doc_q = mod.tensor("doc_q", FUSEDATTN_DTYPE_INT32,
                              FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
      Expr doc_kv = mod.tensor("doc_kv", FUSEDATTN_DTYPE_INT32,
                               FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
      mod.set_mask(eq(doc_q, doc_kv) && mod.kv_idx() <= mod.q_idx());
      std::vector<int32_t> host(batch * seqlen);
      for (int64_t e = 0; e < batch * seqlen; ++e)
        host[e] = static_cast<int32_t>((e % seqlen) / 2048);
      if (!CudaOk(cudaMemcpy(doc_ids.data, host.data(), host.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice),
                  "upload document ids"))
        return;
      graph_tensors.push_back(doc_ids.desc);
      graph_tensors.push_back(doc_ids.desc);
    }
    mod.finalize();
  }

  // The bias tensor: every byte 0x3c, a finite value in each dtype (bf16 0.0115, fp16 1.06,
  // float32 0.0115).
  const bool with_bias = o.bias != FUSEDATTN_BIAS_NONE;
  DeviceTensor bias(o.bias_fp32 ? FUSEDATTN_DTYPE_FLOAT32 : dtype,
                    with_bias ? std::vector<int64_t>{c.bias_batch, c.bias_heads, seqlen, seqlen}
                              : std::vector<int64_t>{1});
  if (!bias.data) return;
  if (with_bias &&
      !CudaOk(cudaMemset(bias.data, 0x3c,
                         bias.count * fusedattn::bench::ElementBytes(bias.desc.dtype)),
              "fill bias"))
    return;

  fusedattn_fwd_args fa = fusedattn_fwd_args_init();
  fa.q = q.desc, fa.k = k.desc, fa.v = v.desc, fa.o = out.desc, fa.lse = lse.desc;
  fusedattn_bwd_args ba = fusedattn_bwd_args_init();
  ba.q = q.desc, ba.k = k.desc, ba.v = v.desc, ba.o = out.desc, ba.lse = lse.desc;
  if (o.alibi) fa.alibi_slopes = ba.alibi_slopes = slopes.desc;
  if (with_bias) fa.bias = ba.bias = bias.desc;
  ba.d_o = d_o.desc, ba.dq = dq.desc, ba.dk = dk.desc, ba.dv = dv.desc;
  fa.dropout_seed = ba.dropout_seed = 0x1234abcd5678ef01ull;  // --dropout (read when > 0)
  fa.dropout_offset = ba.dropout_offset = 7;

  char msg[2048];
  size_t fwd_bytes = 0, bwd_bytes = 0;
  if (!ApiOk(fusedattn_fwd_workspace_size(&c, &fwd_bytes, msg, sizeof msg), "workspace", msg) ||
      !ApiOk(fusedattn_bwd_workspace_size(&c, &bwd_bytes, msg, sizeof msg), "workspace", msg))
    return;
  void* workspace = nullptr;
  size_t bytes = fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes;
  if (bytes && !CudaOk(cudaMalloc(&workspace, bytes), "cudaMalloc workspace")) return;

  auto fwd = [&] {
    return ApiOk(fusedattn_fwd(&c, &fa, workspace, bytes, nullptr, msg, sizeof msg), "fwd", msg);
  };
  auto bwd = [&] {
    return ApiOk(fusedattn_bwd(&c, &ba, workspace, bytes, nullptr, msg, sizeof msg), "bwd", msg);
  };
  const double flops = 4.0 * batch * heads * seqlen * seqlen * d * (causal ? 0.5 : 1.0);
  // --score-mod and --dropout: the plain forward of the same problem first (without the graph,
  // without dropout), then the graph's or dropout's, with the workspace that problem needs (the
  // graph's block mask; the backward that dropout runs on).
  double plain_ms = 0;
  std::string plain_kernel;
  if (!o.score_mod.empty() || o.dropout > 0) {
    plain_ms = TimeMs(o.iters, fwd);
#ifdef FUSEDATTN_WITH_FLASH
    if (o.backend == FUSEDATTN_BACKEND_FLASH) plain_kernel = ForwardKernel(c, fa);
#endif
    c.dropout = o.dropout;
    if (!o.score_mod.empty()) {
      c.score_mod = mod.get();
      fa.num_score_mod_tensors = ba.num_score_mod_tensors =
          static_cast<int64_t>(graph_tensors.size());
      fa.score_mod_tensors = ba.score_mod_tensors = graph_tensors.data();
    }
    size_t then_fwd = 0, then_bwd = 0;
    if (!ApiOk(fusedattn_fwd_workspace_size(&c, &then_fwd, msg, sizeof msg), "workspace", msg) ||
        !ApiOk(fusedattn_bwd_workspace_size(&c, &then_bwd, msg, sizeof msg), "workspace", msg))
      return;
    const size_t need = then_fwd > then_bwd ? then_fwd : then_bwd;
    if (need > bytes) {
      if (workspace) cudaFree(workspace);
      workspace = nullptr;
      bytes = need;
      if (!CudaOk(cudaMalloc(&workspace, bytes), "cudaMalloc workspace")) return;
    }
  }
  const double fwd_ms = TimeMs(o.iters, fwd);
  std::string mods;
  if (o.softcap > 0) mods += " softcap=" + std::to_string(o.softcap).substr(0, 5);
  if (o.alibi) mods += " alibi";
  if (!o.score_mod.empty()) mods += " score_mod=" + o.score_mod;
  if (o.dropout > 0) mods += " dropout=" + std::to_string(o.dropout).substr(0, 4);
  if (with_bias)
    mods += std::string(" bias=") + (o.bias == FUSEDATTN_BIAS_PRE_SCALE ? "pre" : "post") +
            (o.bias_broadcast ? "[1,1,s,s]" : "[b,h,s,s]") + (o.bias_fp32 ? "f32" : "");
  std::printf("%s d=%-3lld s=%-5lld b=%-3lld h=%-3lld %-6s%s fwd %8.3f ms %6.1f TFLOP/s",
              dtype == FUSEDATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16", (long long)d,
              (long long)seqlen, (long long)batch, (long long)heads,
              causal ? "causal" : "full", mods.c_str(), fwd_ms, flops / fwd_ms / 1e9);
#ifdef FUSEDATTN_WITH_FLASH
  if (o.backend == FUSEDATTN_BACKEND_FLASH)
    std::printf(" [%s]", ForwardKernel(c, fa).c_str());
#endif
  if (plain_ms > 0 && fwd_ms > 0)
    std::printf(" | plain fwd %8.3f ms %6.1f TFLOP/s%s%s%s, speed %s/plain %.3f", plain_ms,
                flops / plain_ms / 1e9, plain_kernel.empty() ? "" : " [",
                plain_kernel.c_str(), plain_kernel.empty() ? "" : "]",
                o.score_mod.empty() ? "dropout" : "score_mod", plain_ms / fwd_ms);
  if (!o.fwd_only && fwd_ms > 0) {
    double bwd_host_ms = 0;
    const double bwd_ms = TimeMs(o.iters, bwd, &bwd_host_ms);
    const double both_ms = TimeMs(o.iters, [&] { return fwd() && bwd(); });
    std::printf(" | bwd %8.3f ms %6.1f", bwd_ms, 2.5 * flops / bwd_ms / 1e9);
#ifdef FUSEDATTN_WITH_FLASH
    if (o.backend == FUSEDATTN_BACKEND_FLASH)
      std::printf(" [%s]", BackwardKernel(c, ba).c_str());
#endif
    std::printf(" | fwd+bwd %8.3f ms %6.1f | bwd host %.3f ms/call", both_ms,
                3.5 * flops / both_ms / 1e9, bwd_host_ms);
  }
  std::printf("\n");
  std::fflush(stdout);
  if (workspace) cudaFree(workspace);
}

template <typename T, typename Parse>
std::vector<T> ParseList(const char* value, const std::vector<T>& all, Parse parse) {
  if (std::strcmp(value, "all") == 0) return all;
  return {parse(value)};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const Options defaults;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    auto next = [&] { ++i; };
    if (flag == "--backend") {
      if (fusedattn_backend_from_name(value, &o.backend) != FUSEDATTN_SUCCESS) {
        std::printf("unknown backend %s\n", value);
        return 2;
      }
      next();
    } else if (flag == "--dtype") {
      o.dtypes = ParseList<fusedattn_dtype>(value, defaults.dtypes, [](const char* v) {
        return std::strcmp(v, "fp16") == 0 ? FUSEDATTN_DTYPE_FLOAT16 : FUSEDATTN_DTYPE_BFLOAT16;
      });
      next();
    } else if (flag == "--d") {
      o.dims = ParseList<int64_t>(value, defaults.dims, [](const char* v) { return atoll(v); });
      next();
    } else if (flag == "--seqlen") {
      o.seqlens = ParseList<int64_t>(value, defaults.seqlens, [](const char* v) { return atoll(v); });
      next();
    } else if (flag == "--causal") {
      o.causal = ParseList<int>(value, defaults.causal, [](const char* v) { return atoi(v); });
      next();
    } else if (flag == "--tokens") {
      o.tokens = atoll(value), next();
    } else if (flag == "--hidden") {
      o.hidden = atoll(value), next();
    } else if (flag == "--iters") {
      o.iters = atoi(value), next();
    } else if (flag == "--fwd-only") {
      o.fwd_only = true;
    } else if (flag == "--deterministic") {
      o.deterministic = true;
    } else if (flag == "--softcap") {
      o.softcap = atof(value), next();
    } else if (flag == "--alibi") {
      o.alibi = true;
    } else if (flag == "--bias") {
      if (std::strcmp(value, "pre") == 0) {
        o.bias = FUSEDATTN_BIAS_PRE_SCALE;
      } else if (std::strcmp(value, "post") == 0) {
        o.bias = FUSEDATTN_BIAS_POST_SCALE;
      } else {
        std::printf("--bias takes pre or post, not %s\n", value);
        return 2;
      }
      next();
    } else if (flag == "--bias-broadcast") {
      o.bias_broadcast = true;
    } else if (flag == "--bias-fp32") {
      o.bias_fp32 = true;
    } else if (flag == "--score-mod") {
      o.score_mod = value;
      if (o.score_mod != "relbias" && o.score_mod != "softcap" && o.score_mod != "alibi" &&
          o.score_mod != "window" && o.score_mod != "doc") {
        std::printf("--score-mod takes relbias, softcap, alibi, window or doc, not %s\n", value);
        return 2;
      }
      next();
    } else if (flag == "--dropout") {
      o.dropout = atof(value), next();
      if (!(o.dropout > 0.0 && o.dropout < 1.0)) {
        std::printf("--dropout takes a probability in (0, 1), not %s\n", value);
        return 2;
      }
    } else if (flag == "--paged-prefill") {
      o.paged_prefill = true;
    } else if (flag == "--batch") {
      o.batch = atoll(value), next();
    } else if (flag == "--new-tokens") {
      o.new_tokens = atoll(value), next();
    } else if (flag == "--cached") {
      o.cached = atoll(value), next();
    } else if (flag == "--heads-q") {
      o.heads_q = atoll(value), next();
    } else if (flag == "--heads-kv") {
      o.heads_kv = atoll(value), next();
    } else if (flag == "--page-sizes") {  // comma-separated
      o.page_sizes.clear();
      for (const char* p = value; *p;) {
        o.page_sizes.push_back(atoll(p));
        const char* comma = std::strchr(p, ',');
        p = comma ? comma + 1 : p + std::strlen(p);
      }
      next();
    } else {
      std::printf("unknown flag %s (see the top of bench/flash_bench.cpp)\n", flag.c_str());
      return 2;
    }
  }
  if (o.alibi && o.bias != FUSEDATTN_BIAS_NONE) {
    std::printf("--bias and --alibi exclude each other (config.bias_type is one of them)\n");
    return 2;
  }
  if (!o.score_mod.empty() &&
      (o.alibi || o.softcap > 0 || o.bias != FUSEDATTN_BIAS_NONE || o.dropout > 0)) {
    std::printf("--score-mod excludes --softcap, --alibi, --bias and --dropout (see the top of "
                "the file)\n");
    return 2;
  }
  if ((o.bias_broadcast || o.bias_fp32) && o.bias == FUSEDATTN_BIAS_NONE) {
    std::printf("--bias-broadcast and --bias-fp32 need --bias pre|post\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to time\n");
    return 0;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, backend %s, %d iterations\n", prop.name, fusedattn_backend_name(o.backend),
              o.iters);
  if (o.paged_prefill) {
    // One dtype and head dim unless given: bf16 d128.
    const std::vector<fusedattn_dtype> dtypes =
        o.dtypes.size() > 1 ? std::vector<fusedattn_dtype>{FUSEDATTN_DTYPE_BFLOAT16} : o.dtypes;
    const std::vector<int64_t> dims = o.dims.size() > 1 ? std::vector<int64_t>{128} : o.dims;
    for (fusedattn_dtype dtype : dtypes)
      for (int64_t d : dims) RunPagedPrefill(o, dtype, d);
    return 0;
  }
  for (fusedattn_dtype dtype : o.dtypes)
    for (int64_t d : o.dims)
      for (int causal : o.causal)
        for (int64_t s : o.seqlens) RunOne(o, dtype, d, s, causal);
  return 0;
}
