// Launchers: the head dims and heads-per-warp a problem needs, mapped to kernel instances.
// Each kernels_<dtype>.cu includes this once for its element type.
#pragma once

#include "backends/small_seq/backward.cuh"
#include "backends/small_seq/forward.cuh"

namespace fusedattn::small_seq {

inline Status LaunchStatus(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(FUSEDATTN_ERROR_CUDA,
                  Format("small_seq: launching the %s kernel failed: %s", what,
                         cudaGetErrorString(err)));
  return Status::Ok();
}

// One block holds kWarpsPerBlock warps; check() bounds the warps to 31-bit block counts.
inline dim3 BlocksFor(int64_t warps) {
  return dim3(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
}

// The backward gives each (sequence, query head) row to a team (device.cuh).
template <typename T, int kDimQk, int kDimV>
dim3 BlocksForRows(const KernelParams& p) {
  return BlocksFor(Team<T, kDimQk, kDimV>::WarpsFor(p.batch * p.heads_q));
}

// The forward's teams run several rows each when the grid stays large enough (device.cuh,
// ForwardRowsPerTeam).
template <typename T, int kDimQk, int kDimV>
Status LaunchForwardForDims(const KernelParams& p, cudaStream_t stream) {
  using TeamOf = Team<T, kDimQk, kDimV>;
  const int64_t rows = p.batch * p.heads_q;
  // A step: per team a q and an O row and max_seqlen_kv K and V rows.
  const int64_t bytes_per_step = int64_t{TeamOf::kPerWarp} * int64_t{sizeof(T)} *
                                 ((kDimQk + kDimV) * (1 + p.max_seqlen_kv));
  const int rows_per_team = ForwardRowsPerTeam(TeamOf::WarpsFor(rows), bytes_per_step);
  ForwardKernel<T, kDimQk, kDimV>
      <<<BlocksFor(TeamOf::ForwardWarpsFor(rows, rows_per_team)), kThreadsPerBlock, 0, stream>>>(
          p, rows_per_team);
  return LaunchStatus("forward");
}

template <typename T, int kDimQk, int kDimV>
Status LaunchBackwardForDims(const KernelParams& p, cudaStream_t stream) {
  BackwardKernel<T, kDimQk, kDimV>
      <<<BlocksForRows<T, kDimQk, kDimV>(p), kThreadsPerBlock, 0, stream>>>(p);
  FUSEDATTN_RETURN_IF_ERROR(LaunchStatus("backward"));
  if (p.group > 1) {
    GroupSumKernel<T, kDimQk, kDimV>
        <<<BlocksFor(p.batch * p.heads_kv), kThreadsPerBlock, 0, stream>>>(p);
    FUSEDATTN_RETURN_IF_ERROR(LaunchStatus("backward group sum"));
  }
  return Status::Ok();
}

inline Status NoKernelFor(int head_dim_qk, int head_dim_v) {
  return InternalError("small_seq: no kernel for head_dim_qk = %d, head_dim_v = %d", head_dim_qk,
                       head_dim_v);
}

template <typename T>
Status LaunchForwardTyped(const KernelParams& p, int head_dim_qk, int head_dim_v, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (head_dim_qk == head_dim_v) {
    switch (head_dim_qk) {
      case 64: return LaunchForwardForDims<T, 64, 64>(p, s);
      case 128: return LaunchForwardForDims<T, 128, 128>(p, s);
      case 256: return LaunchForwardForDims<T, 256, 256>(p, s);
      case 512: return LaunchForwardForDims<T, 512, 512>(p, s);
      default: break;
    }
  }
  return NoKernelFor(head_dim_qk, head_dim_v);
}

template <typename T>
Status LaunchBackwardTyped(const KernelParams& p, int head_dim_qk, int head_dim_v, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (head_dim_qk == head_dim_v) {
    switch (head_dim_qk) {
      case 64: return LaunchBackwardForDims<T, 64, 64>(p, s);
      case 128: return LaunchBackwardForDims<T, 128, 128>(p, s);
      case 256: return LaunchBackwardForDims<T, 256, 256>(p, s);
      case 512: return LaunchBackwardForDims<T, 512, 512>(p, s);
      default: break;
    }
  }
  return NoKernelFor(head_dim_qk, head_dim_v);
}

}  // namespace fusedattn::small_seq
