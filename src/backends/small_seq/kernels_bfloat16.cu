// small_seq kernels for bfloat16 q/k/v (one file per dtype so that the build compiles them in
// parallel).
#include "backends/small_seq/launch.cuh"

namespace fusedattn::small_seq {

Status LaunchForwardBfloat16(const KernelParams& params, int head_dim_qk, int head_dim_v,
                             void* stream) {
  return LaunchForwardTyped<__nv_bfloat16>(params, head_dim_qk, head_dim_v, stream);
}

Status LaunchBackwardBfloat16(const KernelParams& params, int head_dim_qk, int head_dim_v,
                              void* stream) {
  return LaunchBackwardTyped<__nv_bfloat16>(params, head_dim_qk, head_dim_v, stream);
}

}  // namespace fusedattn::small_seq
