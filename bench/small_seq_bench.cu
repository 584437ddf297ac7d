// small_seq_bench: the small_seq backend's forward and backward bandwidth against the device's
// copy bandwidth, measured in the same run.
//
//   small_seq_bench [--dtype bf16|fp16|fp32] [--batch 30720] [--heads 8] [--heads-kv 8]
//                   [--dims 128,256,512] [--keys 2,4,8,16] [--reps 11] [--calls 5] [--csv]
//
// Each problem: BSHD tensors, sq = 1, no mask, forced onto small_seq. Bytes counted once each:
//   forward:  Q, K, V read, O written, LSE written
//   backward: the forward's bytes (Q, K, V, O, LSE read) + dO read + dQ, dK, dV written
// (the backward's own extra reads, e.g. K and V for both dS and dQ, come from registers, not
// memory). Copy bandwidth: cudaMemcpy device to device, bytes read + bytes written.
// Timing: CUDA events around `calls` back-to-back calls (so the library's host-side checks
// overlap the GPU's work), divided by `calls`; the median over `reps` repetitions after a
// warm-up. The side-by-side comparison with PyTorch's SDPA backends is bench/'s Python harness.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "native_bench_util.h"

namespace {

#define CHECK_CUDA(expr)                                                                \
  do {                                                                                  \
    cudaError_t err_ = (expr);                                                          \
    if (err_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,         \
                   cudaGetErrorString(err_));                                           \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// Exits with the library's message when a fusedattn call fails (msg: the call's buffer).
void CheckFusedattn(fusedattn_status status, const char* msg, const char* what) {
  if (status == FUSEDATTN_SUCCESS) return;
  std::fprintf(stderr, "%s: %s: %s\n", what, fusedattn_status_string(status), msg);
  std::exit(1);
}

struct Options {
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_BFLOAT16;
  int64_t batch = 30720, heads_q = 8, heads_kv = 8;
  std::vector<int64_t> dims = {128, 256, 512};
  std::vector<int64_t> keys = {2, 4, 8, 16};
  int reps = 11, calls = 5;
  bool csv = false;
};

std::vector<int64_t> ParseList(const char* text) {
  std::vector<int64_t> values;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    values.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return values;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--dtype") {
      std::string d = value();
      o.dtype = d == "fp32"   ? FUSEDATTN_DTYPE_FLOAT32
                : d == "fp16" ? FUSEDATTN_DTYPE_FLOAT16
                              : FUSEDATTN_DTYPE_BFLOAT16;
    } else if (arg == "--batch") {
      o.batch = std::atoll(value());
    } else if (arg == "--heads") {
      o.heads_q = std::atoll(value());
    } else if (arg == "--heads-kv") {
      o.heads_kv = std::atoll(value());
    } else if (arg == "--dims") {
      o.dims = ParseList(value());
    } else if (arg == "--keys") {
      o.keys = ParseList(value());
    } else if (arg == "--reps") {
      o.reps = std::max(1, std::atoi(value()));
    } else if (arg == "--calls") {
      o.calls = std::max(1, std::atoi(value()));
    } else if (arg == "--csv") {
      o.csv = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--dtype bf16|fp16|fp32] [--batch N] [--heads N] [--heads-kv N] "
                   "[--dims 128,256,512] [--keys 2,4,8,16] [--reps N] [--calls N] [--csv]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return o;
}

const char* DtypeName(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FLOAT32 ? "fp32" : dtype == FUSEDATTN_DTYPE_FLOAT16 ? "fp16"
                                                                                       : "bf16";
}

// Uniform values in [-1, 1) from a hash of the index, written as the dtype.
__global__ void FillKernel(void* data, size_t count, fusedattn_dtype dtype, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    float x = static_cast<float>(h) * (2.0f / 4294967296.0f) - 1.0f;
    if (dtype == FUSEDATTN_DTYPE_FLOAT32) {
      static_cast<float*>(data)[i] = x;
    } else {
      // bf16: the top half of the float bits (truncation is fine for test data); fp16 below.
      uint32_t bits = __float_as_uint(x);
      uint16_t out = dtype == FUSEDATTN_DTYPE_BFLOAT16
                         ? static_cast<uint16_t>(bits >> 16)
                         : __half_as_ushort(__float2half_rn(x));
      static_cast<uint16_t*>(data)[i] = out;
    }
  }
}

// A dense device tensor (native_bench_util.h) filled on the device from `seed` (or left as is);
// exits when the allocation fails.
struct SeededTensor : fusedattn::bench::DeviceTensor {
  SeededTensor(fusedattn_dtype dtype, const std::vector<int64_t>& shape, uint32_t seed, bool fill)
      : DeviceTensor(dtype, shape) {
    if (!data) std::exit(1);
    if (fill) {
      FillKernel<<<1024, 256>>>(data, static_cast<size_t>(count), dtype, seed);
      CHECK_CUDA(cudaGetLastError());
    }
  }
};

// Median milliseconds per call of `body` (which enqueues one call on `stream`).
template <typename Body>
double MedianMs(cudaStream_t stream, const Options& o, Body body) {
  for (int i = 0; i < 3; ++i) body();  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int r = 0; r < o.reps; ++r) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int c = 0; c < o.calls; ++c) body();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(static_cast<double>(ms) / o.calls);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Device-to-device copy bandwidth (bytes read + written per second) over 1 GiB.
double CopyBandwidth(cudaStream_t stream, const Options& o) {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemsetAsync(src, 1, bytes, stream));
  double ms = MedianMs(stream, o, [&] {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseOptions(argc, argv);
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "small_seq_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  const double copy = CopyBandwidth(stream, o);
  std::printf("device: %s; copy bandwidth (D2D, read + write): %.3f TB/s\n", prop.name,
              copy * 1e-12);
  std::printf("dtype %s, batch %lld, heads_q %lld, heads_kv %lld, sq = 1, BSHD, no mask\n",
              DtypeName(o.dtype), (long long)o.batch, (long long)o.heads_q,
              (long long)o.heads_kv);
  if (o.csv)
    std::printf("csv,dtype,batch,heads_q,heads_kv,head_dim,seqlen_kv,fwd_us,fwd_tbs,fwd_frac,"
                "bwd_us,bwd_tbs,bwd_frac,copy_tbs\n");
  else
    std::printf("%5s %4s | %10s %8s %7s | %10s %8s %7s | %s\n", "d", "skv", "fwd us", "TB/s",
                "of copy", "bwd us", "TB/s", "of copy", "backend chosen automatically");

  const size_t e = fusedattn::bench::ElementBytes(o.dtype);
  for (int64_t d : o.dims)
    for (int64_t skv : o.keys) {
      fusedattn_config c = FUSEDATTN_CONFIG_INIT;
      c.is_training = 1;
      c.batch = o.batch;
      c.heads_q = o.heads_q;
      c.heads_kv = o.heads_kv;
      c.max_seqlen_q = 1;
      c.max_seqlen_kv = skv;
      c.head_dim_qk = c.head_dim_v = d;
      c.qkv_dtype = c.o_dtype = o.dtype;
      c.device = FUSEDATTN_DEVICE_CUDA;
      fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
      char msg[4096] = "";
      CheckFusedattn(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), msg,
                     "fusedattn_get_backend");
      c.backend = FUSEDATTN_BACKEND_SMALL_SEQ;

      const int64_t b = o.batch, hq = o.heads_q, hkv = o.heads_kv;
      SeededTensor q(o.dtype, {b, 1, hq, d}, 1, true), k(o.dtype, {b, skv, hkv, d}, 2, true),
          v(o.dtype, {b, skv, hkv, d}, 3, true), out(o.dtype, {b, 1, hq, d}, 0, false),
          d_o(o.dtype, {b, 1, hq, d}, 4, true), dq(o.dtype, {b, 1, hq, d}, 0, false),
          dk(o.dtype, {b, skv, hkv, d}, 0, false), dv(o.dtype, {b, skv, hkv, d}, 0, false),
          lse(FUSEDATTN_DTYPE_FLOAT32, {b, hq, 1}, 0, false);

      fusedattn_fwd_args fa = fusedattn_fwd_args_init();
      fa.q = q.desc;
      fa.k = k.desc;
      fa.v = v.desc;
      fa.o = out.desc;
      fa.lse = lse.desc;
      fusedattn_bwd_args ba = fusedattn_bwd_args_init();
      ba.q = q.desc;
      ba.k = k.desc;
      ba.v = v.desc;
      ba.o = out.desc;
      ba.lse = lse.desc;
      ba.d_o = d_o.desc;
      ba.dq = dq.desc;
      ba.dk = dk.desc;
      ba.dv = dv.desc;

      size_t fwd_ws = 0, bwd_ws = 0;
      CheckFusedattn(fusedattn_fwd_workspace_size(&c, &fwd_ws, msg, sizeof msg), msg,
                     "fusedattn_fwd_workspace_size");
      CheckFusedattn(fusedattn_bwd_workspace_size(&c, &bwd_ws, msg, sizeof msg), msg,
                     "fusedattn_bwd_workspace_size");
      void* workspace = nullptr;
      const size_t workspace_bytes = std::max(fwd_ws, bwd_ws);
      if (workspace_bytes > 0) CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));

      // The forward also leaves O and LSE for the backward.
      const double fwd_ms = MedianMs(stream, o, [&] {
        CheckFusedattn(fusedattn_fwd(&c, &fa, workspace, fwd_ws, stream, msg, sizeof msg), msg,
                       "fusedattn_fwd");
      });
      const double bwd_ms = MedianMs(stream, o, [&] {
        CheckFusedattn(fusedattn_bwd(&c, &ba, workspace, bwd_ws, stream, msg, sizeof msg), msg,
                       "fusedattn_bwd");
      });
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (workspace) CHECK_CUDA(cudaFree(workspace));

      const double row_q = double(b * hq * d * e), kv = double(b * hkv * skv * d * e);
      const double lse_bytes = double(b * hq * 4);
      const double fwd_bytes = row_q /*q*/ + 2 * kv /*k, v*/ + row_q /*o*/ + lse_bytes;
      const double bwd_bytes = fwd_bytes + row_q /*dO*/ + row_q /*dQ*/ + 2 * kv /*dK, dV*/;
      const double fwd_bw = fwd_bytes / (fwd_ms * 1e-3), bwd_bw = bwd_bytes / (bwd_ms * 1e-3);
      if (o.csv)
        std::printf("csv,%s,%lld,%lld,%lld,%lld,%lld,%.2f,%.4f,%.4f,%.2f,%.4f,%.4f,%.4f\n",
                    DtypeName(o.dtype), (long long)b, (long long)hq, (long long)hkv,
                    (long long)d, (long long)skv, fwd_ms * 1e3, fwd_bw * 1e-12, fwd_bw / copy,
                    bwd_ms * 1e3, bwd_bw * 1e-12, bwd_bw / copy, copy * 1e-12);
      else
        std::printf("%5lld %4lld | %10.1f %8.3f %6.1f%% | %10.1f %8.3f %6.1f%% | %s\n",
                    (long long)d, (long long)skv, fwd_ms * 1e3, fwd_bw * 1e-12,
                    100 * fwd_bw / copy, bwd_ms * 1e3, bwd_bw * 1e-12, 100 * bwd_bw / copy,
                    fusedattn_backend_name(chosen));
      std::fflush(stdout);
    }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
