// The Hopper forward (sm_90a): warpgroup MMA (wgmma) from 128-byte-swizzled shared memory, K/V
// tiles loaded by TMA through a two-stage mbarrier pipeline, FlashAttention-3 style.
//
// One block per (query tile of 128 rows, head, sequence), three warpgroups:
//  * warpgroup 0 is the producer (one warp works, with few registers: setmaxnreg 24): it loads
//    K of the first step, then Q, then K(j) ahead of V(j - 1) (V lags K by one step, the order in
//    which the consumers use them), each into stage j % 2, waiting until both consumers released
//    the stage (k_empty / v_empty) before overwriting it;
//  * warpgroups 1 and 2 are consumers (setmaxnreg 240, or 104 on d64's two-block tile), 64 query
//    rows each: S = Q K^T with both operands from shared memory (m64nNk16, K-major), the online
//    softmax in registers (exp2 with the scale folded into one FFMA), then O += P V with P in
//    registers as the A operand and V an MN-major B operand (transpose bit).
// Main loop, FlashAttention-3 style: step 0 computes S(0) and its softmax alone; step n >= 1
// issues S(n) and O += P(n - 1) V(n - 1) back to back; the last O += P V comes alone. At d128
// and d256 a consumer waits only for S(n), masks it and computes its softmax while its
// O += P V still runs on the tensor cores, then rescales O and packs P(n) (intra-warpgroup
// overlap; d256 rescales O instead between the issue of S(n + 1) and of O += P(n) V(n)); so
// does d64 from 4096 keys (its long-key tile). On d64's two-block tile (104 registers cannot
// hold S, P and O at once) O += P V completes before S(n) is issued.
// Around the issue of a step's products the two consumers take turns (ping-pong, two named
// barriers; d64 and d128 only), so that one consumer's softmax runs while the tensor cores
// compute the other's products.
// Tiles per head dim (Sm90FwdTile): 128 query rows per block; 64 keys per step and two blocks
// per SM at d64 below 4096 keys, 128 keys per step at d64 from 4096 keys and at d128 (one block
// per SM; sm90.h's Sm90ForwardKeysPerStep chooses), 80 at d256. Every tile is loaded as 64-column TMA boxes, one per 128-byte swizzle block
// (d256 rows are 512 bytes: four boxes per tile).
// Key tiles are walked from the last to the first; only tiles the mask reaches are visited and
// element masks run only on tiles that cross a boundary (per consumer's 64 rows). Out-of-bounds
// rows of a tensor are zero-filled by TMA; rows past a sequence's length that are inside the
// tensor (padding, THD) are real other tokens or garbage: S is masked there, and the producer
// zeroes the V rows of the one tile that crosses the end of the keys where O += P V reads them
// (0 * NaN would poison O).
// The last tile of a sequence with at most 64 rows left leaves consumer 1 idle, and d128's key
// tile with at most 64 keys left runs both products over 64 keys.
// The epilogue (sink, LSE, max logit, fully masked rows) is fwd_kernel.cuh's.
// Paged K/V (kPaged, instances at d64 and d128; README "Paged K/V on the Hopper forward"): the
// K and V maps are over the page pools and the producer loads a key tile as one box per page
// (or one per tile when pages hold whole tiles), the page indices read from the page table as
// it goes; the sequence's keys come from seqlens_kv, and V's rows past them are always zeroed.
// Score policies (sm90.h's Sm90Scores, a template argument): the plain instances keep S in raw
// q.k units and fold the scale into the softmax's FFMA; the softcap-alibi and bias instances turn
// S into fusedattn.h's score (in units of the factor that the softmax's FFMA then applies,
// scale_log2) right after S = Q K^T completes, on every key tile, and the mask follows on the
// tiles that cross a boundary, as in the plain instances. The bias instances read each thread's elements of the bias tensor
// straight from global memory into registers at the top of the step (transform_scores,
// bias_words), and walk the heads fastest when the bias is shared by the heads.
// The dropout instances (Sm90Scores::kDropout) transform S as softcap-alibi does (the plain score
// where the call has neither) and drop elements of P by fusedattn.h's Philox mask after the
// softmax has added them to the row sums (the LSE is the undropped one, as the mma.sync kernel
// and the reference have it; O takes the kept elements, and 1 / (1 - dropout) in the epilogue).
// A tile's mask bits (two words per thread, sm90_scores.cuh's DropoutKeepBits) are computed at the
// top of its step, before the consumer waits for K and its turn, or on d64's two-block tile after
// the softmax (step 0: while S(0) runs).
#pragma once

#include <climits>
#include <type_traits>

#include "backends/flash/device_common.cuh"
#include "backends/flash/fwd_kernel.cuh"
#include "backends/flash/sm90_scores.cuh"
#include "backends/flash/sm90_tile.h"
#include "backends/flash/wgmma.cuh"
#ifndef __CUDACC_RTC__  // NVRTC (jit.cpp: the score_mod instances) compiles the kernel alone
#include "backends/flash/schedule.h"
#include "backends/flash/sm90.h"
#include "common/cuda_util.h"
#endif

namespace fusedattn::flash {

// What a score_mod policy (the kernel's Mod) changes of the tile's schedule: kOverlapSoftmax
// false runs the step without the intra-warpgroup overlap (O += P V completes before S is
// issued, as on d64's 64-key tile), which frees P's registers (32 at d128) while the graph's
// code runs; jit.cpp specializes it for a graph whose kernel would spill with the overlap.
template <typename Mod>
struct Sm90ModTraits {
  static constexpr bool kOverlapSoftmax = true;
};

struct Sm90Maps {
  CUtensorMap q, k, v;  // FP8: v is over the V^T workspace
};

// The FP8 forward's O elements (x, x + 1) of a row at `at` (elements of p.o): o_dtype e4m3 as
// Q8_e4m3(o * scale_o), else o rounded to o_dtype (fusedattn.h "FP8 attention").
__device__ __forceinline__ void StoreFp8AttentionOutput(const FlashParams& p, int64_t at,
                                                        float scale_o, float o0, float o1) {
  const int64_t step = p.o.stride_d;
  switch (p.o_dtype) {
    case FUSEDATTN_DTYPE_FP8_E4M3: {
      const uint32_t two = sm90::PackE4m3x2(o0 * scale_o, o1 * scale_o);
      unsigned char* o = static_cast<unsigned char*>(p.o.data) + at;
      if (step == 1 && (reinterpret_cast<uintptr_t>(o) & 1) == 0) {
        *reinterpret_cast<unsigned short*>(o) = static_cast<unsigned short>(two);
      } else {
        o[0] = static_cast<unsigned char>(two & 0xffu);
        o[step] = static_cast<unsigned char>(two >> 8);
      }
      break;
    }
    case FUSEDATTN_DTYPE_BFLOAT16: StorePair<Bfloat16>(p.o.data, at, step, o0, o1); break;
    case FUSEDATTN_DTYPE_FLOAT16: StorePair<Half>(p.o.data, at, step, o0, o1); break;
    default: {
      float* o = static_cast<float*>(p.o.data) + at;
      o[0] = o0;
      o[step] = o1;
    }
  }
}

// Mod: the score_mod policy (device_common.cuh's NoScoreMod, or the struct jit.cpp generates from
// a graph, with kScores = kScoreMod; never paged).
template <typename Element, int kHeadDim, Sm90Scores kScores, bool kLongKeys, bool kPaged,
          typename Mod = NoScoreMod>
__global__ void __launch_bounds__(384, Sm90FwdTile<kHeadDim, kLongKeys>::kMinBlocks)
    WgmmaForwardKernel(const __grid_constant__ Sm90Maps maps, const FlashParams p, int m_tiles) {
#if FUSEDATTN_SM90_DEVICE
  // The FP8 instance (Element Fp8E4m3, README "Hopper forward: FP8"): e4m3 Q, K and V^T (the
  // pre-pass's, LaunchWgmmaForwardFp8), S = Q K^T and O += P V by m64n128k32 .e4m3 with both
  // operands K-major, P quantized as Q8(exp(s - m_running) * p_scale) into the A registers, the
  // scaling factors read from device memory, O stored in the call's o_dtype, amax_s and amax_o.
  // The rest (roles, pipeline, ping-pong, overlap, masks, online softmax, LSE) is this kernel's.
  constexpr bool kFp8 = std::is_same_v<Element, Fp8E4m3>;
  using Tile = Sm90FwdTile<kHeadDim, kLongKeys, kFp8 ? 1 : 2>;
  static_assert(!kFp8 || (kScores == Sm90Scores::kPlain && !kPaged),
                "the FP8 forward: plain scores, contiguous K/V");
  // Paged K/V: the boxes of a key tile are whole pages or whole tiles of a page, which needs
  // kBlockN a power of two (Sm90PagedRefusal's page sizes then either divide it or are multiples).
  static_assert(!kPaged || (Tile::kBlockN & (Tile::kBlockN - 1)) == 0,
                "paged K/V: key tiles of a power-of-two size (d64, d128)");
  constexpr bool kTransformScores = kScores != Sm90Scores::kPlain;
  constexpr bool kBiasTensor = kScores == Sm90Scores::kBias;
  constexpr bool kScoreMod = kScores == Sm90Scores::kScoreMod;
  constexpr bool kDropout = kScores == Sm90Scores::kDropout;  // (scores as softcap-alibi's)
  static_assert(!kDropout || !kPaged, "no paged K/V with dropout");
  static_assert(kScoreMod == Mod::kActive, "a score_mod graph runs in the kScoreMod policy");
  static_assert(!kScoreMod || !kPaged, "no paged K/V with a score_mod graph");
  // The tile's schedule, unless the score_mod policy turns the intra-warpgroup overlap off
  // (Sm90ModTraits): O is then rescaled after O += P V completes, also at d256.
  constexpr bool kOverlapSoftmax = Tile::kOverlapSoftmax && Sm90ModTraits<Mod>::kOverlapSoftmax;
  constexpr bool kRescaleOBeforeValueProduct =
      Tile::kRescaleOBeforeValueProduct && kOverlapSoftmax;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  constexpr int kColBlocks = Tile::kColBlocks, kKvBytes = Tile::kKvBytes;
  constexpr int kSTiles = kBlockN / 8;   // 8-column slices of S
  constexpr int kDTiles = kHeadDim / 8;  // 8-column slices of O

  // The plain grid, or the heavy-first schedule of THD problems (schedule.h).
  TileIndex tile;
  if (p.schedule != nullptr) {
    tile = ScheduledBlock(p.schedule, blockIdx.x, p.heads_q, p.batch);
    if (tile.tile < 0) return;  // past the last scheduled tile
  } else {
    tile = DecomposeBlock(blockIdx.x, m_tiles, p.heads_q);
    if constexpr (kBiasTensor) {
      // A bias shared by the heads: heads fastest, then query tiles, then sequences, so that the
      // blocks running together are a few query tiles of every head and read the same bias rows
      // (a wave streams its tiles' rows from memory once for all heads, where tiles-fastest
      // streams the whole bias once per head; K/V are then re-read once per wave instead, from
      // L2 between the heads' blocks of a wave).
      if (p.bias.stride_h == 0 && p.heads_q > 1) {
        tile.h = static_cast<int>(blockIdx.x % p.heads_q);
        const int64_t rest = blockIdx.x / p.heads_q;
        tile.tile = static_cast<int>(rest % m_tiles);
        tile.b = static_cast<int>(rest / m_tiles);
      }
    }
  }
  const int b = tile.b, h = tile.h, hk = h / p.group;
  const SeqInfo seq = [&] {
    if constexpr (kPaged)
      return LoadPagedSeq(p, b);
    else
      return LoadSeq(p, b);
  }();
  // The longest causal tiles (the last ones) start first.
  const int m_tile = (p.schedule != nullptr ? (seq.len_q + kBlockM - 1) / kBlockM : m_tiles) - 1 -
                     tile.tile;
  const int m0 = m_tile * kBlockM;
  const int64_t shift = DiagShift(p, seq.len_q, seq.len_kv);

  // The key tiles [n_tile_begin, n_tile_end) this query tile sees.
  int n_tile_begin, n_tile_end;
  KeyTilesSeenBy(p, seq, m0, kBlockM, kBlockN, shift, &n_tile_begin, &n_tile_end);
  // kScoreMod with a mask_mod: only the key tiles its block mask shows are walked (from the top,
  // as without one); n_tile_end becomes the first of them + 1 and n_shown counts them, read by
  // every warp alike before the roles split.
  int n_shown = n_tile_end - n_tile_begin;
  if constexpr (kScoreMod) {
    if (p.flex.block_mask != nullptr && n_tile_begin < n_tile_end)
      FlexShownKeyTiles(p, b, h, m_tile, n_tile_begin, &n_tile_end, &n_shown);
  }
  if (n_tile_begin >= n_tile_end) {
    WriteRowsWithoutKeys<Tile::kThreads>(p, b, h, seq, m0, min(kBlockM, p.max_seqlen_q - m0));
    return;
  }
  const int n_count = kScoreMod ? n_shown : n_tile_end - n_tile_begin;
  // The key tile after `tile` in the walk: the one below it, or (kScoreMod with a block mask) the
  // next one the block mask shows; by a whole warp.
  auto next_key_tile = [&](int tile) {
    if constexpr (kScoreMod) {
      if (p.flex.block_mask != nullptr)
        return FlexNextShownKeyTile(p, b, h, m_tile, n_tile_begin, tile);
    }
    return tile - 1;
  };

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (SmemAddress(smem_raw) & 1023u)) & 1023u);
  unsigned char* q_s = smem;                                 // [col block][128 rows][128 B]
  unsigned char* k_s = smem + Tile::kQBytes;                 // [stage][col block][keys][128 B]
  unsigned char* v_s = k_s + kStages * kKvBytes;             // [stage][col block][keys][128 B]
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Tile::kBarrierOffset);
  uint64_t* q_full = bars;
  uint64_t* fix = bars + 1;  // the producer's own barrier for the V tile it patches
  uint64_t* k_full = bars + 2;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;

  // A tile whose second 64 rows lie past the queries (the last tile of a sequence of 64 mod 128
  // rows): consumer 1 has nothing to compute and goes straight to its epilogue, so only
  // consumer 0's warps release the stages.
  const bool upper_rows_absent = m0 + 64 >= seq.len_q;
  const int releasing_warps = upper_rows_absent ? Tile::kConsumerWarps / 2 : Tile::kConsumerWarps;
  // d128's key tile [n0, n0 + 128) across the end of the keys with at most 64 keys left: O += P V
  // over 64 keys (V's upper rows are not read; S is computed over all 128 and masked).
  auto half_keys_at = [&](int n0) { return kBlockN == 128 && n0 + 64 >= seq.len_kv; };
  if (threadIdx.x == 0) {
    sm90::MbarInit(q_full, 1);
    sm90::MbarInit(fix, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::MbarInit(k_full + s, 1);
      sm90::MbarInit(v_full + s, 1);
      sm90::MbarInit(k_empty + s, releasing_warps);
      sm90::MbarInit(v_empty + s, releasing_warps);
    }
    sm90::FenceBarrierInit();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    sm90::RegistersDown<Tile::kProducerRegs>();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    const int batch_coord = p.thd ? 0 : b;
    const int kv_row0 = static_cast<int>(seq.start_kv);
    // Paged K/V: the maps are over the pools, [num_pages][heads_kv][page_size][d] with boxes of
    // min(page_size, kBlockN) rows; page_size is a power of two of at least 16 (the launcher
    // checks Sm90PagedRefusal), so that a box is a whole page (page_size < kBlockN: kBlockN /
    // page_size boxes per tile) or a whole tile inside one page, and lands on a 2048-byte
    // boundary of the stage (whole 128-byte swizzle atoms).
    // Key tile [n0, n0 + kBlockN) of K or V into dst, completing on bar. Contiguous (lane 0
    // only): one box per column block, kKvBytes expected with the one arrival. Paged (the whole
    // warp): one box (per column block) per page the tile touches below the sequence's length,
    // box k issued by lane k with its page-table entry (`page`); lane 0 arrives expecting the
    // bytes of the boxes the warp issues (a ballot) before any is issued, so that boxes left out
    // complete nothing: boxes past the keys (their K rows are masked, their V rows zeroed by
    // load_values) and boxes of a page-table entry outside [0, num_pages), which is never
    // followed (fusedattn.h: that sequence's results are undefined, nothing else is read). Only
    // entries of keys below len_kv are read. One lane per box rather than lane 0 looping over
    // them: the entries' loads are in flight together, not one after another (page 16 at d128:
    // 8 per tile), which made the producer the bottleneck (issue 21's prefill at page 16: 0.53x
    // the contiguous problem; 0.835x with a lane per box, H100).
    // Paged: lane k's page-table entry for box k of key tile n0 (-1 for boxes past the keys),
    // read before the stage's empty barrier is waited on, and kept for the tile's V one step
    // later (the same keys), so that no entry's load sits between a stage freeing and its load.
    auto page_entry = [&](int n0) {
      if constexpr (!kPaged) {
        return -1;
      } else {
        // Computed here from the parameters (constant memory) rather than kept live across the
        // walk: the producer has 24 registers.
        const int r = lane * min(p.paged.page_size, kBlockN);  // box `lane`'s first row
        if (r >= kBlockN || n0 + r >= seq.len_kv) return -1;
        const int32_t* page_row = p.paged.page_table + b * p.paged.page_table_stride;
        return __ldg(page_row + ((n0 + r) >> (__ffs(p.paged.page_size) - 1)));
      }
    };
    auto load_tile = [&](unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int n0,
                         int page) {
      if constexpr (!kPaged) {
        sm90::MbarArriveExpectTx(bar, kKvBytes);
#pragma unroll
        for (int cb = 0; cb < kColBlocks; ++cb)
          sm90::TmaLoad4d(dst + cb * kBlockN * 128, map, bar, cb * Tile::kBoxCols, kv_row0 + n0,
                          hk, batch_coord);
      } else {
        const int box_rows = min(p.paged.page_size, kBlockN);
        const int r = lane * box_rows;  // box `lane`'s first row in the tile
        const int key = n0 + r;
        const bool issue = page >= 0 && page < p.paged.num_pages;
        const unsigned issued = __ballot_sync(0xffffffffu, issue);
        if (lane == 0)
          sm90::MbarArriveExpectTx(bar, __popc(issued) * box_rows * 128 * kColBlocks);
        __syncwarp();  // the bytes expected before any box can complete
        if (issue) {
#pragma unroll
          for (int cb = 0; cb < kColBlocks; ++cb)
            sm90::TmaLoad4d(dst + cb * kBlockN * 128 + r * 128, map, bar, cb * 64,
                            key & (p.paged.page_size - 1), hk, page);
        }
      }
    };
    // Step j of the walk reads key tile n_tile (n_tile_end - 1 - j, or with kScoreMod's block
    // mask the j-th tile it shows from the top) through stage j % kStages; the first use of a
    // stage waits for nothing (parity 1 of a fresh barrier).
    // Returns the lane's page entry of the tile (page_entry) for load_values.
    auto load_keys = [&](int j, int n_tile) {  // lane 0 (paged: the whole warp)
      const int n0 = n_tile * kBlockN;
      const int stage = j % kStages;
      const int page = page_entry(n0);
      sm90::MbarWait(k_empty + stage, ((j / kStages) & 1) ^ 1);
      load_tile(k_s + stage * kKvBytes, &maps.k, k_full + stage, n0, page);
      return page;
    };
    uint32_t fix_parity = 0;
    auto load_values = [&](int j, int n_tile, int page) {  // the whole warp
      const int n0 = n_tile * kBlockN;
      const int stage = j % kStages;
      unsigned char* v_dst = v_s + stage * kKvBytes;
      if constexpr (kFp8) {
        // V^T's tile [kHeadDim rows of d][keys n0, n0 + kBlockN): one box (128 rows x 128 bytes,
        // one swizzle block); the pre-pass wrote zeros past the keys, so nothing is patched.
        if (lane == 0) {
          sm90::MbarWait(v_empty + stage, ((j / kStages) & 1) ^ 1);
          sm90::MbarArriveExpectTx(v_full + stage, kKvBytes);
          sm90::TmaLoad4d(v_dst, &maps.v, v_full + stage, n0, 0, hk, b);
        }
        return;
      }
      // Rows past the keys but inside the tensor exist only with per-sequence lengths (and
      // paged K/V: the rest of the last page, boxes not loaded); they are zeroed where O += P V
      // reads them (all kBlockN rows, or the lower 64 on a half tile).
      const int v_rows_read = half_keys_at(n0) ? 64 : kBlockN;
      const bool patch_v = (kPaged || p.padding) && n0 + v_rows_read > seq.len_kv;
      uint64_t* v_bar = patch_v ? fix : v_full + stage;
      if (kPaged || lane == 0) {
        sm90::MbarWait(v_empty + stage, ((j / kStages) & 1) ^ 1);
        load_tile(v_dst, &maps.v, v_bar, n0, page);
      }
      if (patch_v) {  // zero V's rows [len_kv - n0, kBlockN) (whole rows: the swizzle stays inside a row)
        sm90::MbarWait(fix, fix_parity);
        fix_parity ^= 1;
        const int valid = seq.len_kv - n0;
        const int chunks = (kBlockN - valid) * 8;  // 16-byte chunks per column block
        // Per column block, with no division by `chunks`: the producer has 24 registers (a
        // division spilled one at d256).
#pragma unroll
        for (int cb = 0; cb < kColBlocks; ++cb)
          for (int e = lane; e < chunks; e += 32)
            *reinterpret_cast<uint4*>(v_dst + cb * kBlockN * 128 + valid * 128 + e * 16) =
                make_uint4(0, 0, 0, 0);
        sm90::FenceProxyAsync();  // generic writes before the consumers' wgmma (async proxy)
        __syncwarp();
        if (lane == 0) sm90::MbarArrive(v_full + stage);
      }
    };
    // The order in which the consumers use the tiles: K of the first step (before Q, so that both
    // are in flight together), then K(j) ahead of V(j - 1), since step j issues S(j) = Q K(j)^T
    // together with O += P(j - 1) V(j - 1); the last V alone.
    if (lane == 0) {
      sm90::PrefetchTensorMap(&maps.k);
      sm90::PrefetchTensorMap(&maps.v);
    }
    // kScoreMod: the walk's tiles of K(j) and V(j - 1), advanced by the whole warp.
    int key_tile = n_tile_end - 1, value_tile = n_tile_end;
    int key_page = -1;  // paged: the lane's page entry of K(j - 1)'s tile, which V(j - 1) reads
    for (int j = 0; j <= n_count; ++j) {
      const int value_page = key_page;
      if ((kPaged || lane == 0) && j < n_count) {
        key_page = load_keys(j, kScoreMod ? key_tile : n_tile_end - 1 - j);
        if (lane == 0 && j == 0) {
          sm90::MbarArriveExpectTx(q_full, Tile::kQBytes);
#pragma unroll
          for (int cb = 0; cb < kColBlocks; ++cb)
            sm90::TmaLoad4d(q_s + cb * kBlockM * 128, &maps.q, q_full, cb * Tile::kBoxCols,
                            static_cast<int>(seq.start_q) + m0, h, batch_coord);
        }
      }
      if (j > 0)
        load_values(j - 1, kScoreMod ? value_tile : n_tile_end - 1 - (j - 1), value_page);
      if constexpr (kScoreMod) {
        value_tile = key_tile;
        if (j + 1 < n_count) key_tile = next_key_tile(key_tile);
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  sm90::RegistersUp<Tile::kConsumerRegs>();
  const int wg = warpgroup - 1;  // rows [64 wg, 64 wg + 64) of the tile
  const int tid = threadIdx.x - 128 * warpgroup;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int wg_m0 = m0 + wg * 64;
  const int row0 = wg_m0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8

  // The bias tensor (kBias instances): this thread's fragment of a key tile, element (nt, c) of
  // row r at key n0 + 8 nt + 2 t + c of row row0 + 8 r, loaded as raw 32-bit words at the top of
  // the step that uses it, before its waits for K, the turn and S = Q K^T, so that the loads run
  // under them (the words then hold kBlockN / 4 registers through the step). Two 16-bit elements
  // (the qkv dtype) per word: the whole fragment; float32: one element per word, so the words
  // hold the first half of the fragment's slices, and the second half is loaded once the first
  // is applied (holding all of it, 64 more registers at d128, would spill; the top of the step
  // prefetches it into L1, which holds no registers). Elements of rows at or past len_q and keys
  // at or past len_kv are not read (0; the mask hides them), so nothing outside the sequence's
  // [len_q, len_kv] corner of the bias is touched.
  constexpr int kBiasWords = kBiasTensor ? kBlockN / 4 : 1;
  uint32_t bias_words[kBiasWords];
  const unsigned char* bias_row[2] = {nullptr, nullptr};  // rows row0, row0 + 8 (null: past len_q)
  bool bias_fp32 = false, bias_pairs = false;
  int64_t bias_stride_kv = 0;  // bytes
  if constexpr (kBiasTensor) {
    bias_fp32 = p.bias.dtype == FUSEDATTN_DTYPE_FLOAT32;
    const int64_t size = bias_fp32 ? 4 : 2;
    bias_stride_kv = p.bias.stride_kv * size;
    // Both elements of a pair with one load: keys contiguous and every pair 2-element aligned.
    bias_pairs = p.bias.stride_kv == 1 && reinterpret_cast<uintptr_t>(p.bias.data) % (2 * size) == 0 &&
                 p.bias.stride_q % 2 == 0 && p.bias.stride_h % 2 == 0 && p.bias.stride_b % 2 == 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = row0 + 8 * r;
      if (i < seq.len_q)
        bias_row[r] = static_cast<const unsigned char*>(p.bias.data) +
                      (b * p.bias.stride_b + h * p.bias.stride_h + i * p.bias.stride_q) * size;
    }
  }
  // 16-bit bias: the pairs (nt, r) of the tile at n0 into bias_words[2 nt + r]. A tile inside
  // the keys with paired loads (every tile of a long sequence but its last) takes one 32-bit load
  // per pair, predicated on the row only; the others check every key.
  auto load_bias16 = [&](int n0) {
    if (bias_pairs && n0 + kBlockN <= seq.len_kv) {
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t j = n0 + 8 * nt + 2 * t;
          bias_words[2 * nt + r] =
              bias_row[r] != nullptr
                  ? __ldg(reinterpret_cast<const unsigned int*>(bias_row[r] + 2 * j))
                  : 0u;
        }
      return;
    }
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = n0 + 8 * nt + 2 * t;
        uint32_t w = 0;
        if (bias_row[r] != nullptr && j < seq.len_kv) {
          if (bias_pairs && j + 1 < seq.len_kv) {
            w = __ldg(reinterpret_cast<const unsigned int*>(bias_row[r] + 2 * int64_t{j}));
          } else {
            const unsigned char* at = bias_row[r] + j * bias_stride_kv;
            w = __ldg(reinterpret_cast<const unsigned short*>(at));
            if (j + 1 < seq.len_kv)
              w |= uint32_t{__ldg(reinterpret_cast<const unsigned short*>(at + bias_stride_kv))}
                   << 16;
          }
        }
        bias_words[2 * nt + r] = w;
      }
  };
  // float32 bias: slices [nt_first, nt_first + kSTiles / 2) of the tile at n0, element (nt, r, c)
  // into bias_words[4 (nt - nt_first) + 2 r + c] (a tile inside the keys as load_bias16's).
  auto load_bias32 = [&](int n0, int nt_first) {
    if (bias_pairs && n0 + kBlockN <= seq.len_kv) {
#pragma unroll
      for (int k = 0; k < kSTiles / 2; ++k)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t j = n0 + 8 * (nt_first + k) + 2 * t;
          uint2 pair = make_uint2(0u, 0u);
          if (bias_row[r] != nullptr)
            pair = __ldg(reinterpret_cast<const uint2*>(bias_row[r] + 4 * j));
          bias_words[4 * k + 2 * r] = pair.x;
          bias_words[4 * k + 2 * r + 1] = pair.y;
        }
      return;
    }
#pragma unroll
    for (int k = 0; k < kSTiles / 2; ++k)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = n0 + 8 * (nt_first + k) + 2 * t;
        uint32_t w0 = 0, w1 = 0;
        if (bias_row[r] != nullptr && j < seq.len_kv) {
          if (bias_pairs && j + 1 < seq.len_kv) {
            const uint2 pair = __ldg(reinterpret_cast<const uint2*>(bias_row[r] + 4 * int64_t{j}));
            w0 = pair.x, w1 = pair.y;
          } else {
            const unsigned char* at = bias_row[r] + j * bias_stride_kv;
            w0 = __ldg(reinterpret_cast<const unsigned int*>(at));
            if (j + 1 < seq.len_kv)
              w1 = __ldg(reinterpret_cast<const unsigned int*>(at + bias_stride_kv));
          }
        }
        bias_words[4 * k + 2 * r] = w0;
        bias_words[4 * k + 2 * r + 1] = w1;
      }
  };
  // What a step loads at its top: the fragment (16-bit) or its first half (float32). The second
  // float32 half is prefetched into L1 there (no registers held), on tiles inside the keys with
  // paired loads, so that its loads after the first half's use find it close.
  auto load_bias = [&](int n0) {
    if constexpr (kBiasTensor) {
      if (bias_fp32) {
        load_bias32(n0, 0);
        if (bias_pairs && n0 + kBlockN <= seq.len_kv) {
#pragma unroll
          for (int k = 0; k < kSTiles / 2; ++k)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              if (bias_row[r] != nullptr)
                asm volatile("prefetch.global.L1 [%0];" ::"l"(
                    bias_row[r] + 4 * int64_t{n0 + 8 * (kSTiles / 2 + k) + 2 * t}));
        }
      } else {
        load_bias16(n0);
      }
    }
  };

  float acc_o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // in S's units (below)
  float row_sum[2] = {0.f, 0.f};              // this thread's columns only
  // What takes S's units to log2 units: scale * log2(e) (> 0, checked by the launcher) where S is
  // q.k, softcap * log2(e) where transform_scores leaves the softcap's tanh in S; the softmax's
  // FFMA applies it, so the transform spends no multiply of its own on it. log2(e) where S is
  // the score itself (a post-scale bias: added after the scale and the softcap).
  // FP8: S = Q_fp8 K_fp8^T is q.k / (descale_q descale_k), folded into the factor.
  const float scale_log2 =
      kFp8 ? p.scale * (*p.fp8.descale_q) * (*p.fp8.descale_k) * kLog2e
      : kScoreMod                                             ? kLog2e
      : kBiasTensor && p.bias_type == FUSEDATTN_BIAS_POST_SCALE ? kLog2e
      : kTransformScores && p.softcap > 0.f                   ? p.softcap * kLog2e
                                                              : p.scale * kLog2e;

  const uint32_t q_addr = SmemAddress(q_s) + wg * 64 * 128;
  const uint32_t k_addr = SmemAddress(k_s), v_addr = SmemAddress(v_s);
  // Read from lane 0, so that the compiler knows the loop is warp-uniform (it then keeps its
  // uniform registers).
  const int loop_count = __shfl_sync(0xffffffffu, wg == 1 && upper_rows_absent ? 0 : n_count, 0);

  // P of the previous step, the A operand of O += P V (kKeysPerValueMma keys per register set:
  // 16 16-bit elements, or 32 e4m3).
  constexpr int kKeysPerValueMma = Tile::kKeysPerValueMma;
  uint32_t pa[kBlockN / kKeysPerValueMma][4];
  // FP8: P is quantized as Q8(e * p_scale), e = exp(s - running max) <= 1 (fusedattn.h's
  // Q8(p * scale_s) up to the normalization, which the epilogue applies); p_scale = scale_s, or
  // 448 where scale_s is larger (e * scale_s would saturate where p * scale_s need not), and the
  // epilogue multiplies O by descale_s * scale_s / p_scale (1 * descale_s ... as the spec's
  // S_fp8 * descale_s reads it).
  float p_scale = 1.f;
  if constexpr (kFp8) p_scale = fminf(*p.fp8.scale_s, 448.f);

  // S = Q K^T into s: 32 bytes of d per wgmma (16 16-bit columns, or 32 e4m3: m64nNk32), 4 per
  // 128-byte column block (issued, not waited).
  auto score_product = [&](auto& s, int stage, auto keys) {
    constexpr int kN = decltype(keys)::value;
    sm90::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim * (kFp8 ? 1 : 2) / 32; ++kk) {
      const uint64_t desc_q =
          sm90::MakeDesc(q_addr + (kk / 4) * (kBlockM * 128) + (kk % 4) * 32, 16, 1024);
      const uint64_t desc_k = sm90::MakeDesc(
          k_addr + stage * kKvBytes + (kk / 4) * (kBlockN * 128) + (kk % 4) * 32, 16, 1024);
      sm90::Wgmma<Element, kN>::template SS<0, 0>(sm90::LeadingColumns<kN>(s), desc_q, desc_k,
                                                  kk > 0);
    }
    sm90::WgmmaCommit();
  };
  // O += P V: 16 keys per wgmma (two 8-row swizzle atoms, 2048 bytes); issued, not waited.
  auto value_product = [&](int stage, auto key_chunks) {
    sm90::FenceOperands(acc_o);
    sm90::WgmmaFence();  // orders the registers written since (acc_o, pa) before the wgmmas
#pragma unroll
    for (int kk = 0; kk < decltype(key_chunks)::value; ++kk) {
      if constexpr (kFp8) {
        // V^T K-major (rows of d, keys contiguous): 32 keys = 32 bytes of every row per wgmma,
        // the operand described as K is in score_product.
        const uint64_t desc_v = sm90::MakeDesc(v_addr + stage * kKvBytes + kk * 32, 16, 1024);
        sm90::Wgmma<Element, kHeadDim>::template RS<0>(acc_o, pa[kk], desc_v, true);
      } else {
        const uint64_t desc_v =
            sm90::MakeDesc(v_addr + stage * kKvBytes + kk * 2048, kBlockN * 128, 1024);
        sm90::Wgmma<Element, kHeadDim>::template RS<1>(acc_o, pa[kk], desc_v, true);
      }
    }
    sm90::WgmmaCommit();
  };
  // Only the first key tile of the walk (the one that crosses the end of the keys) can be half.
  const int half_keys_step = half_keys_at((n_tile_end - 1) * kBlockN) ? 0 : -1;
  // O += P(step) V(step) from `stage`: over 64 keys on d128's half tile (see half_keys_at).
  auto value_product_of = [&](int step, int stage) {
    if constexpr (kBlockN == 128) {
      if (step == half_keys_step)
        value_product(stage, sm90::Static<kBlockN / 2 / kKeysPerValueMma>());
      else
        value_product(stage, sm90::Static<kBlockN / kKeysPerValueMma>());
    } else {
      value_product(stage, sm90::Static<kBlockN / 16>());  // no half tiles at 64 or 80 keys
    }
  };
  // Each warp releases a stage once its wgmmas that read it are complete.
  auto release = [&](uint64_t* empty) {
    __syncwarp();
    if (lane == 0) sm90::MbarArrive(empty);
  };
  // The softcap-alibi and bias instances: S becomes fusedattn.h's score over scale_log2, on every
  // tile; masked elements are set after it.
  //  softcap-alibi (sm90_scores.cuh, the backward's arithmetic too): the softcap's tanh (or q.k
  //    without one) minus ALiBi's term with the slope divided by scale_log2;
  //  bias (fusedattn.h's order, ScoreOf's arithmetic): a pre-scale bias b is added to q.k before
  //    the scale and the softcap's tanh, S = tanh(scale (q.k + b) / softcap) (q.k + b without a
  //    softcap), scale_log2 as for softcap-alibi; a post-scale one after them, in natural units,
  //    S = softcap tanh(scale q.k / softcap) + b (scale q.k + b), scale_log2 = log2(e).
  // bias_slices: slices [nt_first, nt_first + kNt) of S, bias_at(k, r, c) the bias of element
  // (nt_first + k, r, c).
  auto bias_slices = [&](auto& s, int nt_first, auto nt_count, const auto& bias_at) {
    using Scores = sm90::SoftcapAlibiScores;
    constexpr int kNt = decltype(nt_count)::value;
    if (p.bias_type == FUSEDATTN_BIAS_PRE_SCALE) {
#pragma unroll
      for (int k = 0; k < kNt; ++k)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) s[4 * (nt_first + k) + 2 * r + c] += bias_at(k, r, c);
      if (p.softcap > 0.f) {
        const Scores scores(p);
#pragma unroll
        for (int e = 4 * nt_first; e < 4 * (nt_first + kNt); ++e) s[e] = scores.Tanh(s[e]);
      }
    } else if (p.softcap > 0.f) {
      const Scores scores(p);
#pragma unroll
      for (int k = 0; k < kNt; ++k)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[4 * (nt_first + k) + 2 * r + c];
            x = fmaf(p.softcap, scores.Tanh(x), bias_at(k, r, c));
          }
    } else {
#pragma unroll
      for (int k = 0; k < kNt; ++k)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[4 * (nt_first + k) + 2 * r + c];
            x = fmaf(x, p.scale, bias_at(k, r, c));
          }
    }
  };
  // kScoreMod: S becomes the graph's score in natural units (scale_log2 = log2(e)) where the
  // config's mask and the mask_mod show the key, -inf elsewhere: s = Mod(scale q.k), as the
  // mma.sync kernel computes it (ScoreOf without bias, softcap or ALiBi, which the planner sends
  // elsewhere). Two paths, chosen per tile (uniform over the warpgroup):
  // * an interior tile (every element shown by the config's mask; lengths up to 2^24) runs the
  //   graph on the indices as floats: the row's converted once, the key's as one float plus its
  //   constant offset in the tile (exact below 2^24), not an I2F per element (I2F issues at the
  //   MUFU unit's rate, which the softmax's ex2 already fills), and no bounds;
  // * a tile that crosses a boundary of the config's mask for these 64 rows evaluates the graph
  //   at the row and key clamped into the sequence (so that its tensors are read only at
  //   (i < len_q, j < len_kv), as the mma.sync kernel reads them) and masks the element after;
  //   rows past len_q and keys past len_kv are never shown.
  auto score_mod_scores = [&](auto& s, int n0) {
    if constexpr (kScoreMod) {
      const bool interior =
          TileFullyVisible(p, wg_m0, 64, n0, kBlockN, seq.len_q, seq.len_kv, shift);
      if (interior && seq.len_kv <= (1 << 24) && seq.len_q <= (1 << 24)) {
        const float key0 = static_cast<float>(n0 + 2 * t);
        float row_at[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) row_at[r] = static_cast<float>(row0 + 8 * r);
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int j = n0 + 8 * nt + 2 * t + c;
            const float key_at = key0 + static_cast<float>(8 * nt + c);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              float& x = s[4 * nt + 2 * r + c];
              float score;
              const bool shown =
                  Mod::ForwardAt(p, x * p.scale, b, h, int64_t{row0 + 8 * r}, int64_t{j},
                                 row_at[r], key_at, seq.len_q, seq.len_kv, &score);
              x = shown ? score : -INFINITY;
            }
          }
        return;
      }
      int lo[2], hi[2], i_at[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = row0 + 8 * r;
        lo[r] = n0, hi[r] = n0 + kBlockN;
        if (!interior) VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo[r], &hi[r]);
        i_at[r] = min(i, seq.len_q - 1);  // len_q >= 1: this consumer has rows
      }
      // Keys outermost: what the graph computes of a key alone (its index as a float, a tensor
      // over the keys) serves both rows and dies there, rather than living through the tile.
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int j = n0 + 8 * nt + 2 * t + c;
          const int j_at = min(j, seq.len_kv - 1);  // len_kv >= 1: the walk has key tiles
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float& x = s[4 * nt + 2 * r + c];
            float score;
            const bool shown = Mod::Forward(p, x * p.scale, b, h, int64_t{i_at[r]},
                                            int64_t{j_at}, seq.len_q, seq.len_kv, &score);
            x = shown && j >= lo[r] && j < hi[r] ? score : -INFINITY;
          }
        }
    }
  };
  auto transform_scores = [&](auto& s, int n0) {
    if constexpr (kScoreMod) {
      score_mod_scores(s, n0);
    } else if constexpr (kBiasTensor) {
      if (bias_fp32) {
        auto fp32_at = [&](int k, int r, int c) {
          return __uint_as_float(bias_words[4 * k + 2 * r + c]);
        };
        bias_slices(s, 0, sm90::Static<kSTiles / 2>(), fp32_at);
        load_bias32(n0, kSTiles / 2);  // the second half (prefetched into L1: see load_bias)
        bias_slices(s, kSTiles / 2, sm90::Static<kSTiles / 2>(), fp32_at);
      } else {
        auto bits16_at = [&](int k, int r, int c) {
          const uint32_t w = bias_words[2 * k + r];
          if constexpr (std::is_same_v<Element, Bfloat16>)
            return __uint_as_float(c == 0 ? w << 16 : w & 0xffff0000u);
          else
            return __half2float(__ushort_as_half(static_cast<unsigned short>(c == 0 ? w : w >> 16)));
        };
        bias_slices(s, 0, sm90::Static<kSTiles>(), bits16_at);
      }
    } else if constexpr (kTransformScores) {
      using Scores = sm90::SoftcapAlibiScores;
      constexpr int kS = kBlockN / 2;
      if (p.softcap > 0.f) {
        const Scores scores(p);
#pragma unroll
        for (int e = 0; e < kS; ++e) s[e] = scores.Tanh(s[e]);
      }
      if (p.bias_type == FUSEDATTN_BIAS_ALIBI) {
        const float slope = Scores::SlopeLog2(p, h) / scale_log2;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // Element (nt, c) of row r is key n0 + 2 t + 8 nt + c: its distance from the row's
          // diagonal is diagonal - (8 nt + c).
          const float diagonal = static_cast<float>(
              AlibiDiagonal(row0 + 8 * r, seq.len_q, seq.len_kv) - n0 - 2 * t);
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float& x = s[4 * nt + 2 * r + c];
              x = Scores::Alibi(x, slope, diagonal - static_cast<float>(8 * nt + c));
            }
        }
      }
    }
  };
  // Mask: -inf where the key is hidden, only on tiles that cross a boundary for these rows.
  // (kScoreMod: score_mod_scores has masked them.)
  auto mask_scores = [&](auto& s, int n0) {
    if constexpr (!kScoreMod) {
      const bool interior =
          TileFullyVisible(p, wg_m0, 64, n0, kBlockN, seq.len_q, seq.len_kv, shift);
      if (!interior) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          int lo, hi;
          VisibleKeys(p, row0 + 8 * r, seq.len_q, seq.len_kv, &lo, &hi);
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int j = n0 + nt * 8 + 2 * t + c;
              if (j < lo || j >= hi) s[4 * nt + 2 * r + c] = -INFINITY;
            }
        }
      }
    }
  };
  // Online softmax in log2 units: p = 2^(s * scale_log2 - max * scale_log2), one FFMA + ex2.
  // s becomes the exponentials; correction[r] is what O's row r must be multiplied by (O is
  // still being accumulated by the previous step's O += P V, so the caller applies it later).
  auto softmax = [&](auto& s, float (&correction)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
        tile_max = fmaxf(tile_max, fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      const float base = new_max == -INFINITY ? 0.f : new_max * scale_log2;  // a row that saw nothing
      correction[r] = FastExp2(row_max[r] * scale_log2 - base);
      row_max[r] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float e = FastExp2(fmaf(s[4 * nt + 2 * r + c], scale_log2, -base));
          s[4 * nt + 2 * r + c] = e;
          sum += e;
        }
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
  };
  auto rescale_o = [&](const float (&correction)[2]) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc_o[4 * dt + 2 * r] *= correction[r];
        acc_o[4 * dt + 2 * r + 1] *= correction[r];
      }
  };
  // P as the A operand: keys 16 kk.. of S (slices 2 kk, 2 kk + 1) in the m16n8k16 A layout.
  auto pack_p = [&](auto& s) {
    if constexpr (kFp8) {
      // Keys 32 kk.. (slices 4 kk .. 4 kk + 3): register 0 = row r0's keys 2t, 2t + 1, 8 + 2t,
      // 9 + 2t, register 1 the same of row r0 + 8, registers 2 and 3 those + 16 (sm90_tile.h's
      // Sm90Fp8ValueKeyOfColumn: V^T holds its keys in this order).
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk) {
        const float* e = &s[16 * kk];
        pa[kk][0] = sm90::PackE4m3x4(e[0] * p_scale, e[1] * p_scale, e[4] * p_scale,
                                     e[5] * p_scale);
        pa[kk][1] = sm90::PackE4m3x4(e[2] * p_scale, e[3] * p_scale, e[6] * p_scale,
                                     e[7] * p_scale);
        pa[kk][2] = sm90::PackE4m3x4(e[8] * p_scale, e[9] * p_scale, e[12] * p_scale,
                                     e[13] * p_scale);
        pa[kk][3] = sm90::PackE4m3x4(e[10] * p_scale, e[11] * p_scale, e[14] * p_scale,
                                     e[15] * p_scale);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        pa[kk][0] = Pack<Element>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = Pack<Element>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = Pack<Element>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = Pack<Element>(s[8 * kk + 6], s[8 * kk + 7]);
      }
    }
  };

  // Dropout (kDropout): keep[r] bit 2 nt + c for element (nt, r, c) of the tile at n0
  // (sm90_scores.cuh's DropoutKeepBits, one Philox call per four elements, one shuffle); the
  // lane's Philox stream is of row row0 for even t, row0 + 8 for odd t. Applied to P after the
  // softmax: the row sums keep the dropped probabilities, O += P V does not. The mask depends on
  // the positions only, so it is computed where the consumer holds the fewest registers: with
  // the overlap, at the top of a step (O and P(it - 1) live, S not yet); without it (d64's
  // two-block tile), after the softmax, when O += P(it - 1) V is complete and P's registers are
  // free; step 0 while S(0) runs. Computed between the issue of the products and the wait for S
  // (S's registers live, and the mask's two words through the softmax) it spilled 12 bytes
  // reloaded every step at d128 and 124 bytes at d64's two-block tile; at the top of the step,
  // 8 bytes per step at d64's two-block tile (ptxas -v, nvcc 13.0).
  DropoutRow dropout_stream{};
  if constexpr (kDropout) dropout_stream = DropoutRowOf(p, b, h, row0 + 8 * (t & 1));
  auto dropout_keep = [&](int n0, uint32_t (&keep)[2]) {
    if constexpr (kDropout) sm90::DropoutKeepBits<kSTiles>(dropout_stream, n0, t, keep);
  };
  auto drop_scores = [&](auto& s, const uint32_t (&keep)[2]) {
    if constexpr (kDropout) {
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            if (((keep[r] >> (2 * nt + c)) & 1u) == 0) s[4 * nt + 2 * r + c] = 0.f;
    }
  };

  // Ping-pong between the two consumers: consumer c waits on named barrier kTurnBarrier + c before
  // it issues a step's two products and, right after issuing them, lets the other consumer issue
  // its own (bar.arrive on the other's barrier; 256 threads = one warpgroup syncing plus one
  // arriving). The tensor cores then run one consumer's products while the other computes its
  // softmax. Both consumers run the same number of steps (1 .. loop_count - 1); consumer 0 takes
  // step 1 without waiting, and consumer 1's last step passes no turn on (nobody would take it):
  // every arrival then meets exactly one wait, and no barrier is left half-arrived at exit. A
  // tile with consumer 1 idle runs consumer 0 alone, without turns.
  constexpr int kTurnBarrier = 1;  // ids 1 and 2 (0 is __syncthreads)
  auto wait_for_turn = [](int c) { sm90::NamedBarrierOfPair<true, kTurnBarrier, 256>(c); };
  auto pass_turn_to = [](int c) { sm90::NamedBarrierOfPair<false, kTurnBarrier, 256>(c); };
  const bool ping_pong = Tile::kPingPong && !upper_rows_absent;

  // What O's rows must be multiplied by before the next O += P V (from the last softmax).
  float correction[2] = {1.f, 1.f};
  if (loop_count > 0) {
    sm90::MbarWait(q_full, 0);

    // Step 0: S(0) and its softmax alone (the key tile that crosses the end of the keys comes
    // first in the walk, so only this one can be a half tile).
    {
      const int n0 = (n_tile_end - 1) * kBlockN;
      float s[kBlockN / 2];  // S, then its exponentials
      load_bias(n0);
      sm90::MbarWait(k_full, 0);
      // S over all kBlockN keys even on a half tile (the columns past the keys are masked
      // below): an m64n64 product here, into s or into registers of its own, made ptxas
      // serialize every wgmma of the kernel (C7511, "insufficient register resources").
      score_product(s, 0, sm90::Static<kBlockN>());
      uint32_t keep[2];
      dropout_keep(n0, keep);  // (kDropout) while S(0) runs
      sm90::WgmmaWait<0>();
      sm90::FenceOperands(s);
      release(k_empty);  // this warp is done with K(0)
      transform_scores(s, n0);
      mask_scores(s, n0);
      // O is still zero: nothing to rescale now (with kRescaleOBeforeValueProduct, step 1
      // multiplies the zeros by this correction, which is 0).
      softmax(s, correction);
      drop_scores(s, keep);
      pack_p(s);
    }

    // Step it, in consumer c's turn: S(it) = Q K(it)^T and O += P(it - 1) V(it - 1).
    int walk_tile = n_tile_end - 1;  // kScoreMod: the key tile of step it
    for (int it = 1; it < loop_count; ++it) {
      if constexpr (kScoreMod) walk_tile = next_key_tile(walk_tile);
      const int n0 = (kScoreMod ? walk_tile : n_tile_end - 1 - it) * kBlockN;
      const int stage = it % kStages, prev = (it - 1) % kStages;
      const bool wait_turn = ping_pong && !(wg == 0 && it == 1);
      const bool pass_turn = ping_pong && !(wg == 1 && it == loop_count - 1);
      float s[kBlockN / 2];
      load_bias(n0);  // bias instances: this step's bias, in flight through the waits below
      uint32_t keep[2];  // (kDropout) the tile's mask
      if constexpr (kOverlapSoftmax) {
        // Both products issued back to back; the softmax of S(it) runs while the tensor cores
        // still compute O += P V; then O is rescaled (d256: before O += P V, while S runs) and
        // P(it) packed.
        dropout_keep(n0, keep);  // before the waits: O and P(it - 1) live, S not yet
        sm90::MbarWait(k_full + stage, (it / kStages) & 1);
        if (wait_turn) wait_for_turn(wg);
        score_product(s, stage, sm90::Static<kBlockN>());
        if constexpr (kRescaleOBeforeValueProduct) {
          sm90::FenceOperands(acc_o);  // keeps the rescale after the issue of S (no instruction)
          rescale_o(correction);       // the correction of step it - 1
        }
        sm90::MbarWait(v_full + prev, ((it - 1) / kStages) & 1);
        value_product_of(it - 1, prev);
        if (pass_turn) pass_turn_to(1 - wg);
        sm90::WgmmaWait<1>();  // S(it) is complete (groups complete in order)
        sm90::FenceOperands(s);
        release(k_empty + stage);  // this warp is done with K(it)
        transform_scores(s, n0);
        mask_scores(s, n0);
        softmax(s, correction);
        drop_scores(s, keep);
        sm90::WgmmaWait<0>();  // O += P(it - 1) V(it - 1) is complete: pa and acc_o are free
        sm90::FenceOperands(acc_o);
        release(v_empty + prev);  // this warp is done with V(it - 1)
      } else {
        // O += P V complete before S is issued (their registers would not fit together).
        sm90::MbarWait(v_full + prev, ((it - 1) / kStages) & 1);
        if (wait_turn) wait_for_turn(wg);
        value_product_of(it - 1, prev);
        sm90::WgmmaWait<0>();
        sm90::FenceOperands(acc_o);
        release(v_empty + prev);  // this warp is done with V(it - 1)
        sm90::MbarWait(k_full + stage, (it / kStages) & 1);
        score_product(s, stage, sm90::Static<kBlockN>());
        if (pass_turn) pass_turn_to(1 - wg);
        sm90::WgmmaWait<0>();
        sm90::FenceOperands(s);
        release(k_empty + stage);  // this warp is done with K(it)
        transform_scores(s, n0);
        mask_scores(s, n0);
        softmax(s, correction);
        dropout_keep(n0, keep);  // P(it - 1) is consumed: its registers are free
        drop_scores(s, keep);
      }
      if constexpr (!kRescaleOBeforeValueProduct) rescale_o(correction);
      pack_p(s);
    }

    // The last O += P V alone.
    {
      const int last = loop_count - 1, stage = last % kStages;
      if constexpr (kRescaleOBeforeValueProduct) rescale_o(correction);
      sm90::MbarWait(v_full + stage, (last / kStages) & 1);
      value_product_of(last, stage);
      sm90::WgmmaWait<0>();
      sm90::FenceOperands(acc_o);
      release(v_empty + stage);  // this warp is done with V(last)
    }
  }
  // Epilogue: O = acc / (sum + extra logit), LSE, max logit (as fwd_kernel.cuh).
  const float extra = ExtraLogit(p, h) * kLog2e;
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;
  const int dv = p.head_dim_v;
  float thread_max = -INFINITY;
  // FP8: o = acc * descale_v * descale_s * scale_s / p_scale / l (pack_p's P is e * p_scale);
  // this thread's largest probability and |o| (0 where nothing is visible or written).
  float fp8_o_factor = 1.f, fp8_amax_s = 0.f, fp8_amax_o = 0.f, fp8_scale_o = 1.f;
  if constexpr (kFp8) {
    fp8_o_factor = (*p.fp8.descale_v) * (*p.fp8.descale_s) * (*p.fp8.scale_s) / p_scale;
    if (p.o_dtype == FUSEDATTN_DTYPE_FP8_E4M3) fp8_scale_o = *p.fp8.scale_o;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float m = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale_log2;
    const int64_t i = row0 + 8 * r;
    float lse = -INFINITY, norm = 0.f;
    if (m != -INFINITY) {
      const float top = fmaxf(m, extra);
      const float a = FastExp2(m - top);
      const float z = sum * a + FastExp2(extra - top);
      lse = (top + log2f(z)) * kLn2;
      norm = a / z;
      if constexpr (kDropout) norm *= p.keep_scale;  // the kept probabilities, / (1 - dropout)
      thread_max = fmaxf(thread_max, m);
    }
    if constexpr (kFp8) {
      // amax_s: the row's largest probability is its maximum's, exp(m - lse) = norm.
      fp8_amax_s = fmaxf(fp8_amax_s, norm);
      norm *= fp8_o_factor;
    }
    if (i < rows_out) {
      const int64_t at = Offset(p.o, b, h, seq.start_q, i, 0);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int x = dt * 8 + 2 * t;
        if (x < dv) {
          if constexpr (kFp8) {
            const float o0 = acc_o[4 * dt + 2 * r] * norm, o1 = acc_o[4 * dt + 2 * r + 1] * norm;
            fp8_amax_o = fmaxf(fp8_amax_o, fmaxf(fabsf(o0), fabsf(o1)));
            StoreFp8AttentionOutput(p, at + x * p.o.stride_d, fp8_scale_o, o0, o1);
          } else {
            StorePair<Element>(p.o.data, at + x * p.o.stride_d, p.o.stride_d,
                               acc_o[4 * dt + 2 * r] * norm, acc_o[4 * dt + 2 * r + 1] * norm);
          }
        }
      }
    }
    if (t == 0 && p.lse.data && (p.lse.packed ? i < seq.len_q : i < p.max_seqlen_q))
      p.lse.data[LseOffset(p.lse, b, h, seq.start_q, i)] = lse;
  }
  if (p.max_logit) {
    thread_max = WarpMax(thread_max);
    if (lane == 0 && thread_max != -INFINITY)
      AtomicMaxFloat(&p.max_logit[h * p.max_logit_stride], thread_max * kLn2);
  }
  if constexpr (kFp8) {
    // One atomic per warp and amax (16 per block of 128 rows x d128, next to ~10^6 FLOPs per
    // row: negligible; a block-wide reduction first would need a barrier of both consumers).
    // The launcher zeroed both; values >= 0 order like their bits (AtomicMaxFloat).
    fp8_amax_s = WarpMax(fp8_amax_s);
    fp8_amax_o = WarpMax(fp8_amax_o);
    if (lane == 0) {
      AtomicMaxFloat(p.fp8.amax_s, fp8_amax_s);
      AtomicMaxFloat(p.fp8.amax_o, fp8_amax_o);
    }
  }
#endif  // FUSEDATTN_SM90_DEVICE
}

#ifndef __CUDACC_RTC__  // the host launchers of the ahead-of-time instances
// One tile's launch (kLongKeys: Sm90FwdTile; kPaged: K/V maps over the page pools).
template <typename Element, int kHeadDim, Sm90Scores kScores, bool kLongKeys, bool kPaged>
Status LaunchWgmmaForwardTile(const FlashParams& p, cudaStream_t stream, bool* launched) {
  using Tile = Sm90FwdTile<kHeadDim, kLongKeys>;
  static_assert(Tile::kBlockM == kSm90ScheduleRowsForward, "schedule.h: the planner's rows");
  const bool bf16 = std::is_same_v<Element, Bfloat16>;
  Sm90Maps maps;
  if (!EncodeLaunchTensorMap(&maps.q, p, p.q, true, p.head_dim_qk, Tile::kBlockM, bf16))
    return Status::Ok();
  if constexpr (kPaged) {
    const int box_rows = p.paged.page_size < Tile::kBlockN ? p.paged.page_size : Tile::kBlockN;
    if (!EncodePageTensorMap(&maps.k, p, p.k, p.head_dim_qk, box_rows, bf16) ||
        !EncodePageTensorMap(&maps.v, p, p.v, p.head_dim_v, box_rows, bf16))
      return Status::Ok();
  } else {
    if (!EncodeLaunchTensorMap(&maps.k, p, p.k, false, p.head_dim_qk, Tile::kBlockN, bf16) ||
        !EncodeLaunchTensorMap(&maps.v, p, p.v, false, p.head_dim_v, Tile::kBlockN, bf16))
      return Status::Ok();
  }
  const int m_tiles = (p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM;
  const int64_t blocks = int64_t{m_tiles} * p.heads_q * p.batch;
  if (blocks > INT_MAX) return Status::Ok();
  // THD: the heavy-first schedule of the query tiles (schedule.h), where no row outside the
  // sequences is written anyway (WriteRowsWithoutKeys writes rows < len_q of O and, packed, of
  // the LSE); a [batch, heads, max_seqlen_q] LSE gets -inf past len_q from the plain grid only.
  FlashParams run = p;
  run.schedule = nullptr;
  if (p.thd && p.schedule_workspace != nullptr && (p.lse.data == nullptr || p.lse.packed)) {
    bool scheduled = false;
    FUSEDATTN_RETURN_IF_ERROR(
        LaunchTileSchedule(p, /*by_keys=*/false, Tile::kBlockM, m_tiles, stream, &scheduled));
    if (scheduled) run.schedule = p.schedule_workspace;
  }
  auto kernel = WgmmaForwardKernel<Element, kHeadDim, kScores, kLongKeys, kPaged>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Tile::kSmemBytes));
  kernel<<<static_cast<unsigned>(blocks), Tile::kThreads, Tile::kSmemBytes, stream>>>(maps, run,
                                                                                    m_tiles);
  *launched = true;
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

// Whether the bias instances read the problem's bias tensor: present, of the qkv dtype or float32
// (which policy runs a problem is Sm90ScoresOf's).
template <typename Element>
bool Sm90BiasTensorReadable(const FlashParams& p) {
  const fusedattn_dtype element =
      std::is_same_v<Element, Bfloat16> ? FUSEDATTN_DTYPE_BFLOAT16 : FUSEDATTN_DTYPE_FLOAT16;
  return p.bias.data != nullptr &&
         (p.bias.dtype == element || p.bias.dtype == FUSEDATTN_DTYPE_FLOAT32);
}

template <typename Element, int kHeadDim, Sm90Scores kScores, bool kPaged>
Status LaunchWgmmaForward(const FlashParams& p, cudaStream_t stream, bool* launched) {
  *launched = false;
  Sm90Scores scores;
  const bool policy_runs_it = Sm90ScoresOf(p, /*forward=*/true, &scores) && scores == kScores &&
                              (kScores != Sm90Scores::kBias || Sm90BiasTensorReadable<Element>(p));
  if (!policy_runs_it || !(p.scale > 0.f) || p.head_dim_qk > kHeadDim ||
      p.head_dim_v > kHeadDim || p.qkv_dtype != p.o_dtype)
    return Status::Ok();
  // The paged instances run paged K/V of the page sizes they take, the others contiguous K/V.
  const bool paged = p.paged.page_table != nullptr;
  if (paged != kPaged || (paged && (Sm90PagedRefusal(p.paged.page_size) != nullptr ||
                                    p.paged.seqlens_kv == nullptr)))
    return Status::Ok();
  if constexpr (kHeadDim == 64) {
    if (Sm90ForwardKeysPerStep(kHeadDim, p.max_seqlen_kv) == 128)
      return LaunchWgmmaForwardTile<Element, kHeadDim, kScores, true, kPaged>(p, stream,
                                                                               launched);
  }
  return LaunchWgmmaForwardTile<Element, kHeadDim, kScores, false, kPaged>(p, stream, launched);
}

// The FP8 forward's pre-pass (README "Hopper forward: FP8"): V^T of every (sequence, kv head)
// into p.fp8.value_t, [batch][heads_kv][kHeadDim rows of d][value_keys] e4m3, the keys of every
// 32-key block in Sm90Fp8ValueKeyOfColumn's order (the order pack_p leaves P in), zeros past the
// keys and past head_dim_v. One block per (sequence and kv head, 128 keys): V's 128 rows through
// shared memory with 16-byte loads (the planner sends only v of 16-byte aligned rows and strides,
// head_dim_v a multiple of 16), written as 16-byte pieces of V^T's rows.
template <int kHeadDim>
__global__ void __launch_bounds__(256) Fp8TransposeValuesKernel(const FlashParams p) {
  constexpr int kKeys = 128, kRowBytes = kHeadDim + 16;  // + 16: rows in different banks
  __shared__ __align__(16) unsigned char tile[kKeys * kRowBytes];
  const int bh = static_cast<int>(blockIdx.x);  // b * heads_kv + hk
  const int b = bh / p.heads_kv, hk = bh % p.heads_kv;
  const int n0 = static_cast<int>(blockIdx.y) * kKeys;
  const unsigned char* v = static_cast<const unsigned char*>(p.v.data);
  for (int e = threadIdx.x; e < kKeys * kHeadDim / 16; e += 256) {
    const int r = e / (kHeadDim / 16), c = e % (kHeadDim / 16);
    const int64_t j = n0 + r;
    uint4 chunk = make_uint4(0u, 0u, 0u, 0u);
    if (j < p.max_seqlen_kv && c * 16 < p.head_dim_v)
      chunk = __ldg(reinterpret_cast<const uint4*>(v + b * p.v.stride_b + j * p.v.stride_s +
                                                   hk * p.v.stride_h + c * 16));
    *reinterpret_cast<uint4*>(tile + r * kRowBytes + c * 16) = chunk;
  }
  __syncthreads();
  unsigned char* out = p.fp8.value_t + int64_t{bh} * kHeadDim * p.fp8.value_keys + n0;
  for (int e = threadIdx.x; e < kHeadDim * kKeys / 16; e += 256) {
    const int d = e / (kKeys / 16), c = e % (kKeys / 16);  // row d, columns [16 c, 16 c + 16)
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int column = 16 * c + 4 * q + k;
        const int key = (column & ~(kSm90Fp8KeyBlock - 1)) +
                        Sm90Fp8ValueKeyOfColumn(column & (kSm90Fp8KeyBlock - 1));
        word |= uint32_t{tile[key * kRowBytes + d]} << (8 * k);
      }
      w[q] = word;
    }
    *reinterpret_cast<uint4*>(out + int64_t{d} * p.fp8.value_keys + 16 * c) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Whether the FP8 instance runs these params (planner.cpp's Fp8ForwardRefusal decides first;
// this is the launcher's own guard).
inline bool Fp8ForwardRuns(const FlashParams& p, int head_dim) {
  const Fp8Arg& f = p.fp8;
  return p.qkv_dtype == FUSEDATTN_DTYPE_FP8_E4M3 && p.paged.page_table == nullptr && !p.thd &&
         !p.padding && p.bias_type == FUSEDATTN_BIAS_NONE && !(p.softcap > 0.f) && !p.dropout &&
         p.softmax_type == FUSEDATTN_SOFTMAX_VANILLA && p.scale > 0.f &&
         p.head_dim_qk <= head_dim && p.head_dim_v <= head_dim && p.head_dim_v % 16 == 0 &&
         f.descale_q && f.descale_k && f.descale_v && f.descale_s && f.scale_s && f.amax_s &&
         f.amax_o && (p.o_dtype != FUSEDATTN_DTYPE_FP8_E4M3 || f.scale_o) &&
         p.o_dtype != FUSEDATTN_DTYPE_FP8_E5M2 && f.value_t != nullptr &&
         f.value_keys == Sm90Fp8ValueKeys(p.max_seqlen_kv);
}

template <int kHeadDim>
Status LaunchWgmmaForwardFp8(const FlashParams& p, cudaStream_t stream, bool* launched) {
  using Tile = Sm90FwdTile<kHeadDim, false, 1>;
  static_assert(Tile::kBlockM == kSm90ScheduleRowsForward, "schedule.h: the planner's rows");
  static_assert(Tile::kBlockN == 128, "V^T's rows are padded to 128-key tiles");
  *launched = false;
  if (!Fp8ForwardRuns(p, kHeadDim)) return Status::Ok();
  Sm90Maps maps;
  if (p.max_seqlen_q + Tile::kBlockM >= INT_MAX || p.max_seqlen_kv + Tile::kBlockN >= INT_MAX)
    return Status::Ok();
  TensorArg value_t;
  value_t.data = p.fp8.value_t;
  value_t.stride_d = 1;
  value_t.stride_s = p.fp8.value_keys;  // V^T's rows: d
  value_t.stride_h = int64_t{kHeadDim} * p.fp8.value_keys;
  value_t.stride_b = value_t.stride_h * p.heads_kv;
  if (!EncodeFp8TensorMap(&maps.q, p.q, p.max_seqlen_q, p.head_dim_qk, p.heads_q, p.batch,
                          Tile::kBlockM) ||
      !EncodeFp8TensorMap(&maps.k, p.k, p.max_seqlen_kv, p.head_dim_qk, p.heads_kv, p.batch,
                          Tile::kBlockN) ||
      !EncodeFp8TensorMap(&maps.v, value_t, kHeadDim, static_cast<int>(p.fp8.value_keys),
                          p.heads_kv, p.batch, kHeadDim))
    return Status::Ok();
  const int m_tiles = (p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM;
  const int64_t blocks = int64_t{m_tiles} * p.heads_q * p.batch;
  const int64_t value_blocks = int64_t{p.batch} * p.heads_kv;
  const int64_t key_tiles = p.fp8.value_keys / 128;
  if (blocks > INT_MAX || value_blocks > INT_MAX || key_tiles > 65535) return Status::Ok();
  // amax_s and amax_o start at 0 (fusedattn.h: 0 where nothing is visible or written); the
  // kernel's warps raise them with atomicMax.
  FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(p.fp8.amax_s, 0, sizeof(float), stream));
  FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(p.fp8.amax_o, 0, sizeof(float), stream));
  *launched = true;
  Fp8TransposeValuesKernel<kHeadDim><<<dim3(static_cast<unsigned>(value_blocks),
                                            static_cast<unsigned>(key_tiles)),
                                       256, 0, stream>>>(p);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  auto kernel = WgmmaForwardKernel<Fp8E4m3, kHeadDim, Sm90Scores::kPlain, false, false>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Tile::kSmemBytes));
  FlashParams run = p;
  run.schedule = nullptr;
  kernel<<<static_cast<unsigned>(blocks), Tile::kThreads, Tile::kSmemBytes, stream>>>(maps, run,
                                                                                    m_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

#endif  // __CUDACC_RTC__

}  // namespace fusedattn::flash
