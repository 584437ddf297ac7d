// The tiled order of the backward's float32 dQ workspace (src/backends/flash/dq_accum_layout.h):
// what the Hopper key-block kernel writes (register order through shared memory, one bulk add
// per 64 x 64 block) is what the dQ conversion reads, for every length and head dim.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "backends/flash/dq_accum_layout.h"

namespace fusedattn::flash {
namespace {

const int kLengths[] = {1, 7, 63, 64, 65, 100, 128, 129, 200, 256};
const int kDims[] = {64, 128};

TEST(DqAccumLayout, TiledOrderIsAPermutationOfEachHeadsRows) {
  for (int rows : kLengths)
    for (int dim : kDims) {
      std::vector<int> hits(static_cast<size_t>(rows) * dim, 0);
      for (int i = 0; i < rows; ++i)
        for (int x = 0; x < dim; ++x) {
          const int64_t at = DqTiledOffset(i, x, rows, dim);
          ASSERT_GE(at, 0);
          ASSERT_LT(at, int64_t{rows} * dim) << "row " << i << " col " << x;
          ++hits[static_cast<size_t>(at)];
        }
      for (int h : hits) ASSERT_EQ(h, 1) << rows << " rows, dim " << dim;
    }
}

// A bulk add of a block's first n rows (n * 64 floats from the block's start) covers exactly
// rows 0..n-1 of it: rows past the end of a sequence are never touched.
TEST(DqAccumLayout, EachBlockRowIsItsOwnRunOf64Floats) {
  for (int rows : kLengths)
    for (int dim : kDims)
      for (int m0 = 0; m0 < rows; m0 += kDqTileRows)
        for (int cb = 0; cb < dim / kDqBlockCols; ++cb) {
          const int64_t block = DqTiledBlockOffset(m0, cb, rows, dim);
          for (int r = 0; r < DqTileRows(m0, rows); ++r)
            for (int c = 0; c < kDqBlockCols; ++c) {
              const int64_t at = DqTiledOffset(m0 + r, cb * kDqBlockCols + c, rows, dim);
              ASSERT_GE(at - block, int64_t{r} * kDqBlockCols);
              ASSERT_LT(at - block, int64_t{r + 1} * kDqBlockCols);
            }
        }
}

// Thread t of a consumer warpgroup holds D[16 w + g + 8 r][8 i + 2 q + c] in d[4 i + 2 r + c]
// (w = t / 32, g = t % 32 / 4, q = t % 4) and stores float4 k of row r, {d[8k+2r], d[8k+2r+1],
// d[8k+4+2r], d[8k+4+2r+1]}, at byte DqFragmentByteOffset(16 w + g, q) XOR 64 k, + 2048 r.
struct Store {
  int lane_phase;   // which 8 lanes of the warp issue it together (lane / 8)
  int byte;         // byte offset in the 64 x 64 block
  int row, col[4];  // the elements of its four floats
};

std::vector<Store> KernelStores(int warp, int r, int k) {
  std::vector<Store> stores;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    Store s;
    s.lane_phase = lane / 8;
    s.row = 16 * warp + g + 8 * r;
    s.byte = (DqFragmentByteOffset(16 * warp + g, q) ^ (64 * k)) + 2048 * r;
    const int cols[4] = {16 * k + 2 * q, 16 * k + 2 * q + 1, 16 * k + 8 + 2 * q,
                         16 * k + 8 + 2 * q + 1};
    for (int j = 0; j < 4; ++j) s.col[j] = cols[j];
    stores.push_back(s);
  }
  return stores;
}

TEST(DqAccumLayout, RegisterOrderStoresLandWhereTheLayoutPutsEachElement) {
  std::set<int> written;
  for (int warp = 0; warp < 4; ++warp)
    for (int r = 0; r < 2; ++r)
      for (int k = 0; k < 4; ++k)
        for (const Store& s : KernelStores(warp, r, k)) {
          ASSERT_EQ(s.byte % 16, 0);
          for (int j = 0; j < 4; ++j) {
            EXPECT_EQ(s.byte + 4 * j, 4 * DqBlockPosition(s.row, s.col[j]))
                << "row " << s.row << " col " << s.col[j];
            written.insert(s.byte + 4 * j);
          }
        }
  EXPECT_EQ(written.size(), 64u * 64u);  // every float of the block, once
}

// 128-bit shared stores go out 8 lanes at a time; 8 distinct 16-byte bank groups (address / 16
// mod 8) in each such phase means no bank conflict.
TEST(DqAccumLayout, RegisterOrderStoresAreFreeOfBankConflicts) {
  for (int warp = 0; warp < 4; ++warp)
    for (int r = 0; r < 2; ++r)
      for (int k = 0; k < 4; ++k) {
        const std::vector<Store> stores = KernelStores(warp, r, k);
        for (int phase = 0; phase < 4; ++phase) {
          std::set<int> groups;
          for (const Store& s : stores)
            if (s.lane_phase == phase) groups.insert(s.byte / 16 % 8);
          EXPECT_EQ(groups.size(), 8u) << "warp " << warp << " r " << r << " k " << k;
        }
      }
}

// The conversion reads 8 columns 8j..8j+7 of a row as four float2 at positions of 2 q: the pairs
// (2q, 2q + 1) stay adjacent and 8-byte aligned.
TEST(DqAccumLayout, ColumnPairsStayAdjacentForTheConversionsFloat2Loads) {
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < 64; col += 2) {
      const int at = DqBlockPosition(row, col);
      EXPECT_EQ(at % 2, 0);
      EXPECT_EQ(DqBlockPosition(row, col + 1), at + 1);
    }
}

}  // namespace
}  // namespace fusedattn::flash
