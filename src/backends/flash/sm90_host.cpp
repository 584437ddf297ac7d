// Host side of the wgmma kernels: whether the build has them and the environment allows them
// (the planner, planner.cpp, decides per call), and the TMA tensor maps, encoded through the driver entry point that the runtime hands out (no -lcuda).
#include <climits>
#include <cstdlib>
#include <cstring>

#include "backends/flash/sm90.h"

#include "backends/flash/planner.h"
#include "common/cuda_util.h"

#ifdef FUSEDATTN_FLASH_SM90
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

namespace fusedattn::flash {

bool WgmmaAllowedByEnvironment() {
  static const bool allowed = [] {
    const char* value = std::getenv("FUSEDATTN_FLASH_WGMMA");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return allowed;
}

#ifdef FUSEDATTN_FLASH_SM90

bool WgmmaCompiled() { return true; }

namespace {

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiledEntryPoint() {
  static const PFN_cuTensorMapEncodeTiled_v12000 entry = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // clear a sticky lookup error
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return entry;
}

}  // namespace

namespace {

// EncodeQkvTensorMap for elements of kElement bytes of the TMA type `type`, boxes of box_cols
// columns (128 bytes: one swizzle block).
bool EncodeTensorMap(void* map, const TensorArg& t, CUtensorMapDataType type, int64_t kElement,
                     int64_t rows, int cols, int heads, int batch, int box_cols, int box_rows) {
  constexpr int64_t kStrideLimit = int64_t{1} << 40;
  if (t.data == nullptr || cols < 1 ||
      !TmaDescribesTensor(reinterpret_cast<uintptr_t>(t.data), t.stride_b, t.stride_h, t.stride_s,
                          t.stride_d, rows, heads, batch, static_cast<int>(kElement)))
    return false;
  // Strides of the axes that are walked (size > 1) must be 16-byte multiples and non-negative;
  // an axis of size 1 is never stepped, and gets a harmless valid stride.
  int64_t extent = 16;
  for (int64_t s : {t.stride_s * rows, t.stride_h * heads}) extent = s * kElement > extent ? s * kElement : extent;
  extent = (extent + 15) / 16 * 16;
  auto stride_bytes = [&](int64_t stride, int64_t size, cuuint64_t* out) {
    if (size == 1) {
      *out = static_cast<cuuint64_t>(extent < kStrideLimit ? extent : 16);
      return true;
    }
    const int64_t bytes = stride * kElement;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= kStrideLimit) return false;
    *out = static_cast<cuuint64_t>(bytes);
    return true;
  };
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                        static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  cuuint64_t strides[3];
  if (!stride_bytes(t.stride_s, rows, &strides[0]) || !stride_bytes(t.stride_h, heads, &strides[1]) ||
      !stride_bytes(t.stride_b, batch, &strides[2]))
    return false;
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows),
                             1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiledEntryPoint();
  if (encode == nullptr) return false;
  const CUresult result = encode(
      static_cast<CUtensorMap*>(map), type, 4, t.data, dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS;
}

}  // namespace

bool EncodeQkvTensorMap(void* map, const TensorArg& t, bool bf16, int64_t rows, int cols,
                        int heads, int batch, int box_rows) {
  return EncodeTensorMap(
      map, t, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, rows,
      cols, heads, batch, 64, box_rows);
}

bool EncodeFp8TensorMap(void* map, const TensorArg& t, int64_t rows, int cols, int heads,
                        int batch, int box_rows) {
  // e4m3 bytes as UINT8 (TMA copies bytes; the zero fill is 0x00 = +0 in e4m3).
  return EncodeTensorMap(map, t, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, cols, heads, batch, 128,
                         box_rows);
}

bool EncodeLaunchTensorMap(void* map, const FlashParams& p, const TensorArg& t, bool query_side,
                           int cols, int box_rows, bool bf16) {
  const int64_t rows = query_side ? (p.thd ? p.tokens_q : p.max_seqlen_q)
                                  : (p.thd ? p.tokens_kv : p.max_seqlen_kv);
  if (rows + box_rows >= INT_MAX) return false;
  return EncodeQkvTensorMap(map, t, bf16, rows, cols, query_side ? p.heads_q : p.heads_kv,
                            p.thd ? 1 : p.batch, box_rows);
}

bool EncodePageTensorMap(void* map, const FlashParams& p, const TensorArg& t, int cols,
                         int box_rows, bool bf16) {
  return EncodeQkvTensorMap(map, t, bf16, p.paged.page_size, cols, p.heads_kv,
                            p.paged.num_pages, box_rows);
}

#else  // !FUSEDATTN_FLASH_SM90

bool WgmmaCompiled() { return false; }
bool EncodeQkvTensorMap(void*, const TensorArg&, bool, int64_t, int, int, int, int) {
  return false;
}
bool EncodeFp8TensorMap(void*, const TensorArg&, int64_t, int, int, int, int) { return false; }
bool EncodeLaunchTensorMap(void*, const FlashParams&, const TensorArg&, bool, int, int, bool) {
  return false;
}
bool EncodePageTensorMap(void*, const FlashParams&, const TensorArg&, int, int, bool) {
  return false;
}
Status WgmmaTileSelfTest(int, bool, const void*, const void*, float*, cudaStream_t) {
  return NotSupported("flash: built without sm_90a kernels");
}

#endif

}  // namespace fusedattn::flash
