// Host entry points of the flash kernels. Each returns the launch's status (checked with
// cudaGetLastError right after the launch); none synchronizes.
#pragma once

#include "backends/flash/params.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>

#include "common/status.h"
#endif

namespace fusedattn::flash {

// Element types of the instances.
struct Half {};
struct Bfloat16 {};
// FP8 e4m3 q/k/v (the Hopper forward's FP8 instance; o of the call's o_dtype).
struct Fp8E4m3 {};

#ifndef __CUDACC_RTC__  // host entry points (NVRTC sees only the element types)

// ---- The simple path (SIMT, any dtype, head dim, stride): simple_kernels.cu ----

// Shared memory the simple kernels need for these head dims; check() refuses larger ones.
size_t SimpleSharedBytes(int head_dim_qk, int head_dim_v);
size_t SimpleSharedLimit();
// Whether this binary has kernels for the current GPU (the reason when not).
Status ProbeKernelImage();

Status LaunchSimpleForward(const FlashParams& p, cudaStream_t stream);
// dQ (written directly), dK, dV (and dbias in DbiasMode store/atomic); needs the preprocess.
Status LaunchSimpleBackward(const FlashParams& p, cudaStream_t stream);

// ---- Shared by both paths: simple_kernels.cu ----

// max_logit[h] = -inf for every head.
Status LaunchFillMaxLogit(const FlashParams& p, cudaStream_t stream);
// Every element of dbias = 0 (before the kernels store or add into it).
Status LaunchZeroDbias(const FlashParams& p, cudaStream_t stream);
// delta = rowsum(dO * O), sink partials, and zeroed dq_accum (when p.dq_accum is set).
Status LaunchBackwardPreprocess(const FlashParams& p, cudaStream_t stream);
// dsink[h] = sum of sink partials over (b, i), in a fixed order.
Status LaunchReduceDsink(const FlashParams& p, cudaStream_t stream);
// dbias summed over its broadcast axes in a fixed order (recomputes the scores).
Status LaunchReduceDbias(const FlashParams& p, cudaStream_t stream);
// dq = dq_accum (converted to the dq dtype and strides; row-major or tiled, p.dq_accum_tiled).
Status LaunchConvertDq(const FlashParams& p, cudaStream_t stream);
// A score_mod tensor's gradient (dtype, strides) from its float32 sum over the dense extents.
Status LaunchConvertFlexGrad(const float* sum, const int64_t extents[4], const FlexTensorArg& out,
                             fusedattn_dtype dtype, cudaStream_t stream);

// ---- The fast path (tensor cores): fwd_kernel.cuh / bwd_kernel.cuh, one instance per file ----

template <typename Element, int kHeadDim>
Status LaunchFastForward(const FlashParams& p, cudaStream_t stream);
// dK, dV, dQ into dq_accum by atomics (or nothing for dQ when p.deterministic), dbias per mode.
template <typename Element, int kHeadDim>
Status LaunchFastBackward(const FlashParams& p, cudaStream_t stream);
// dQ written directly, one query tile per block in a fixed order over the keys (deterministic).
template <typename Element, int kHeadDim>
Status LaunchFastBackwardDq(const FlashParams& p, cudaStream_t stream);
#endif  // __CUDACC_RTC__

}  // namespace fusedattn::flash
