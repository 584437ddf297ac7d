// The two layouts of the backward's float32 dQ workspace (FlashParams::dq_accum): the same
// max_seqlen_q x dq_accum_dim floats per (sequence, query head), so the same size, the same
// zeroing by the preprocess (row by row) and the same RowIndex base per (b, h); only the order
// inside those floats differs.
//  * Row-major (the mma.sync kernels, bwd_kernel.cuh): element (i, x) at i * dim + x.
//  * Tiled (the Hopper key-block kernel, bwd_kernel_sm90.cuh; FlashParams::dq_accum_tiled): the
//    rows in tiles of 64 (the last one shorter when max_seqlen_q is not a multiple of 64), each
//    tile as dim / 64 blocks of [tile_rows][64] floats one after the other, and inside a block's
//    row of 64 floats the columns permuted so that a consumer warpgroup can write its m64n64
//    accumulator to shared memory with 128-bit stores in register order, free of bank conflicts,
//    and a bulk reduce-add (cp.reduce.async.bulk) of the block's first `rows` rows adds exactly
//    the rows of the sequence: rows past the end of a sequence are never touched.
// LaunchConvertDq reads either (dq_accum_tiled); tests/cpu/dq_accum_layout_test.cpp checks that
// the tiled order is a permutation of each (b, h) slab and conflict-free as stored.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FUSEDATTN_DQ_LAYOUT_HD __host__ __device__ __forceinline__
#else
#define FUSEDATTN_DQ_LAYOUT_HD inline
#endif

namespace fusedattn::flash {

constexpr int kDqTileRows = 64;  // rows per tile of the tiled layout
constexpr int kDqBlockCols = 64;  // columns per block (one consumer's m64n64 dQ tile)

// Position (in floats) of element (row, col), row and col in [0, 64), inside one [64][64] block
// of the tiled layout (rows 64 floats apart). The accumulator of m64n64 (wgmma.cuh) holds, for
// thread t of the warpgroup with w = t / 32, g = t % 32 / 4, q = t % 4:
//   d[4 i + 2 r + c] = D[16 w + g + 8 r][8 i + 2 q + c];
// the kernel stores per row r four float4 (k = 0..3): {d[8k+2r], d[8k+2r+1], d[8k+4+2r],
// d[8k+4+2r+1]} = columns 16k + 2q + {0, 1} and 16k + 8 + 2q + {0, 1}, as 16-byte chunk 4k + q
// of the row, XOR 4 on odd rows: the 8 lanes of a store phase (g in {2j, 2j+1}, q = 0..3) then
// cover all 32 banks (a row is 256 bytes, so without the XOR rows g and g+1 would collide).
FUSEDATTN_DQ_LAYOUT_HD int DqBlockPosition(int row, int col) {
  const int k = col >> 4, high = (col >> 3) & 1, q = (col >> 1) & 3, c = col & 1;
  const int chunk = (4 * k + q) ^ ((row & 1) << 2);
  return row * kDqBlockCols + chunk * 4 + 2 * high + c;
}

// The same for the stores of one thread (q = t % 4) of a row: the byte offset of its float4
// k = 0 in the block; its float4 k lies at this offset XOR 64 k (the row's chunk group 4k + q XOR
// 4 (row & 1) is bits 6-7 of the offset, which hold only row & 1 here), and row + 8 at + 2048.
FUSEDATTN_DQ_LAYOUT_HD int DqFragmentByteOffset(int row, int q) {
  return row * kDqBlockCols * 4 + ((row & 1) << 6) + 16 * q;
}

// Rows in the tile that starts at row m0 (a multiple of 64) of max_seqlen_q rows.
FUSEDATTN_DQ_LAYOUT_HD int DqTileRows(int m0, int max_seqlen_q) {
  return max_seqlen_q - m0 < kDqTileRows ? max_seqlen_q - m0 : kDqTileRows;
}

// Offset (in floats) of the [rows][64] block of columns [64 col_block, +64) of the tile that
// starts at row m0 (a multiple of 64), from the start of its (b, h) slab.
FUSEDATTN_DQ_LAYOUT_HD int64_t DqTiledBlockOffset(int m0, int col_block, int max_seqlen_q,
                                                  int dim) {
  return int64_t{m0} * dim + int64_t{col_block} * DqTileRows(m0, max_seqlen_q) * kDqBlockCols;
}

// Offset (in floats) of element (i, x), i < max_seqlen_q and x < dim (a multiple of 64), from the
// start of its (b, h) slab in the tiled layout.
FUSEDATTN_DQ_LAYOUT_HD int64_t DqTiledOffset(int i, int x, int max_seqlen_q, int dim) {
  const int m0 = i & ~(kDqTileRows - 1);
  return DqTiledBlockOffset(m0, x / kDqBlockCols, max_seqlen_q, dim) +
         DqBlockPosition(i - m0, x % kDqBlockCols);
}

// The deterministic Hopper backward's order workspace (FlashParams::dq_order, int32, zeroed
// before each call): int 0 counts the key-block kernel's blocks as they start (their tickets),
// then one flag per (sequence b, query head h, 64-row tile of max_seqlen_q): 1 + the last key
// tile whose dQ has been added to that query tile (0: none yet). bwd_kernel_sm90.cuh says how the
// kernel uses them.
FUSEDATTN_DQ_LAYOUT_HD int64_t DqOrderTiles(int64_t max_seqlen_q) {
  return (max_seqlen_q + kDqTileRows - 1) / kDqTileRows;
}
FUSEDATTN_DQ_LAYOUT_HD int64_t DqOrderInts(int64_t batch, int64_t heads_q, int64_t max_seqlen_q) {
  return 1 + batch * heads_q * DqOrderTiles(max_seqlen_q);
}
// Index of the flag of query rows [m0, m0 + 64) (m0 a multiple of 64) of (b, h).
FUSEDATTN_DQ_LAYOUT_HD int64_t DqOrderFlag(int b, int h, int m0, int heads_q, int max_seqlen_q) {
  return 1 + (int64_t{b} * heads_q + h) * DqOrderTiles(max_seqlen_q) + m0 / kDqTileRows;
}

}  // namespace fusedattn::flash

#undef FUSEDATTN_DQ_LAYOUT_HD
