// The small_seq launchers for the emulation test: the kernels of src/backends/small_seq compiled
// as host C++ (through the shims in cuda/) and run by the warp emulator instead of the GPU.
#include "backends/small_seq/backward.cuh"
#include "backends/small_seq/forward.cuh"
#include "backends/small_seq/reduce.cuh"
#include "warp_emulator.h"

namespace fusedattn::small_seq {
namespace {

unsigned BlocksFor(int64_t warps) {
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

Status NoKernelFor(int head_dim_qk, int head_dim_v) {
  return InternalError("small_seq: no kernel for head_dim_qk = %d, head_dim_v = %d", head_dim_qk,
                       head_dim_v);
}

// The forward's teams run kForwardRowsPerTeam rows each here, whatever the problem's size (the
// GPU launch gives large problems only that many): the tests' small problems then cover the
// row-to-row pipeline and warps whose last steps have no rows.
template <typename T, int kDim>
void ForwardForDim(const KernelParams& p) {
  emulation::Launch(
      BlocksFor(Team<T, kDim, kDim>::ForwardWarpsFor(p.batch * p.heads_q, kForwardRowsPerTeam)),
      kThreadsPerBlock, [&] { ForwardKernel<T, kDim, kDim>(p, kForwardRowsPerTeam); });
}

template <typename T, int kDim>
void BackwardForDim(const KernelParams& p) {
  emulation::Launch(BlocksFor(Team<T, kDim, kDim>::WarpsFor(p.batch * p.heads_q)),
                    kThreadsPerBlock, [&] { BackwardKernel<T, kDim, kDim>(p); });
  if (p.group > 1)
    emulation::Launch(BlocksFor(p.batch * p.heads_kv), kThreadsPerBlock,
                      [&] { GroupSumKernel<T, kDim, kDim>(p); });
}

template <typename T>
Status Forward(const KernelParams& p, int head_dim_qk, int head_dim_v) {
  if (head_dim_qk != head_dim_v) return NoKernelFor(head_dim_qk, head_dim_v);
  switch (head_dim_qk) {
    case 64: ForwardForDim<T, 64>(p); return Status::Ok();
    case 128: ForwardForDim<T, 128>(p); return Status::Ok();
    case 256: ForwardForDim<T, 256>(p); return Status::Ok();
    case 512: ForwardForDim<T, 512>(p); return Status::Ok();
    default: return NoKernelFor(head_dim_qk, head_dim_v);
  }
}

template <typename T>
Status Backward(const KernelParams& p, int head_dim_qk, int head_dim_v) {
  if (head_dim_qk != head_dim_v) return NoKernelFor(head_dim_qk, head_dim_v);
  switch (head_dim_qk) {
    case 64: BackwardForDim<T, 64>(p); return Status::Ok();
    case 128: BackwardForDim<T, 128>(p); return Status::Ok();
    case 256: BackwardForDim<T, 256>(p); return Status::Ok();
    case 512: BackwardForDim<T, 512>(p); return Status::Ok();
    default: return NoKernelFor(head_dim_qk, head_dim_v);
  }
}

}  // namespace

Status LaunchForwardFloat32(const KernelParams& p, int dqk, int dv, void*) {
  return Forward<float>(p, dqk, dv);
}
Status LaunchForwardFloat16(const KernelParams& p, int dqk, int dv, void*) {
  return Forward<__half>(p, dqk, dv);
}
Status LaunchForwardBfloat16(const KernelParams& p, int dqk, int dv, void*) {
  return Forward<__nv_bfloat16>(p, dqk, dv);
}
Status LaunchBackwardFloat32(const KernelParams& p, int dqk, int dv, void*) {
  return Backward<float>(p, dqk, dv);
}
Status LaunchBackwardFloat16(const KernelParams& p, int dqk, int dv, void*) {
  return Backward<__half>(p, dqk, dv);
}
Status LaunchBackwardBfloat16(const KernelParams& p, int dqk, int dv, void*) {
  return Backward<__nv_bfloat16>(p, dqk, dv);
}

Status LaunchFillNegativeInfinity(float* data, int64_t count, int64_t stride, void*) {
  if (count <= 0) return Status::Ok();
  constexpr unsigned kThreads = 256;
  emulation::Launch(static_cast<unsigned>((count + kThreads - 1) / kThreads), kThreads,
                    [&] { FillKernel(data, count, stride, -INFINITY); });
  return Status::Ok();
}

Status LaunchSumPartials(const float* partials, int64_t batch, int64_t heads, int64_t keys,
                         int64_t out_batch, int64_t out_heads, const KernelBias& out, void*) {
  const int64_t outputs = out_batch * out_heads * keys;
  if (outputs <= 0) return Status::Ok();
  const int64_t items = PartialSumOf(0, batch, heads, keys, out_batch, out_heads).items();
  if (items <= kItemsPerThread) {
    emulation::Launch(static_cast<unsigned>((outputs + kThreadSumThreads - 1) / kThreadSumThreads),
                      kThreadSumThreads, [&] {
                        SumPartialsByThreadKernel(partials, batch, heads, keys, out_batch,
                                                  out_heads, outputs, out);
                      });
  } else {
    emulation::Launch(static_cast<unsigned>(outputs), kSumThreads, [&] {
      SumPartialsKernel(partials, batch, heads, keys, out_batch, out_heads, out);
    });
  }
  return Status::Ok();
}

Status KernelsRunOnCurrentDevice() { return Status::Ok(); }

}  // namespace fusedattn::small_seq
