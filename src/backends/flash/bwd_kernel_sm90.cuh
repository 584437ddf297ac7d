// The Hopper backward (sm_90a): the key-block kernel of bwd_kernel.cuh rebuilt on warpgroup MMA
// (wgmma) from 128-byte-swizzled shared memory, with TMA loads through a two-stage mbarrier
// pipeline. The preprocess (D = rowsum(dO * O), sink partials, zeroed dQ workspace) is the
// mma.sync path's and so is the dQ conversion (simple_kernels.cu), which reads this kernel's
// tiled workspace order (dq_accum_layout.h; the host sets dq_accum_tiled).
//
// One block per (key tile of kBlockN = 128 keys, kv head, sequence), three warpgroups:
//  * warpgroup 0 is the producer (few registers: setmaxnreg); warp 0 loads K and V of the block
//    once, then per step Q and dO of kBlockM query rows by TMA into stage step % 2, after both
//    consumers released the stage; warp 1 adds each consumer's dQ tile of each step to the
//    float32 workspace with one bulk reduce-add (cp.reduce.async.bulk .add.f32) from shared
//    memory; warps 2 and 3 exit;
//  * warpgroups 1 and 2 are consumers, 64 keys each (keys as the M dimension: every product whose
//    result is an A operand later comes out in the A layout already):
//      S^T  = K_wg Q^T     (SS, both K-major)      dP^T = V_wg dO^T   (SS, both K-major)
//      P^T  = 2^(S^T scale log2(e) - LSE)           dS^T = P^T o (dP^T - D) scale
//      dV  += P^T dO       (RS: P^T from registers, dO an MN-major B)
//      dK  += dS^T Q       (RS: dS^T from registers, Q an MN-major B)
//    dS^T also goes to shared memory ([queries / 64][128 keys][64 queries], swizzled); dV is
//    issued, and after a named barrier of the two consumers each computes one 64 x 64 tile of
//      dQ   = dS K         (SS: dS^T read as an MN-major A, K as an MN-major B; all 128 keys)
//    issued before dK, so that while dK runs the consumer writes the dQ tile to its own shared
//    buffer in register order (128-bit stores) and hands it to the producer's warp 1 (named
//    barriers kDqFull / kDqEmpty per consumer): no atomics from the consumers. dS^T is
//    double-buffered, so one barrier per step suffices: a consumer passes the barrier of step n
//    only after the other one has arrived there, i.e. finished step n - 1 and its reads of the
//    buffer step n + 1 reuses. The step's LSE (log2 units) and D reach shared memory through the
//    consumers (see the stats below).
// Tiles: d128 takes kBlockM = 64 queries per step and splits dQ [64 x 128] by columns (consumer w:
// columns 64 w..); d64 takes kBlockM = 128 and splits dQ [128 x 64] by rows (consumer w: rows
// 64 w..). Either way each consumer's dQ tile is one 64-column swizzle block of dS^T and of K, so
// every wgmma operand starts on a swizzle block (no partial-atom descriptors) and N = 64.
// Registers per consumer thread: d128 dK + dV 128, S^T + dP^T 64 (dead after packing into 32),
// dQ 32; d64 dK + dV 64, S^T + dP^T 128, dQ 32.
//
// The walk: the query heads of the kv head's group in order, and per head the query tiles that
// can see the block's keys (RowsSeeingKeys); dK and dV are summed over it in registers in that
// fixed order and written once. Element masks run only where a consumer's 64 keys x the step's
// queries cross a mask boundary. Rows past a sequence's length inside a tensor (padding, THD) are
// other tokens or garbage, maybe NaN: the producer zeroes K/V rows past len_kv and Q/dO rows past
// len_q in the tiles that cross those ends, where the products read them (0 * NaN would reach dK,
// dV or dQ), and the mask makes P = dS = 0 there.
// Ends of sequences with at most 64 keys or queries left in a tile: consumer 1 of a block with no
// upper keys computes only its dQ tile (over the lower 64 keys), and d64's step with no upper
// queries runs dV, dK over 64 queries; consumer 1's dQ rows of that step lie past the sequence
// and the dQ warp adds none of them (it adds only a tile's rows inside the sequence, which also
// keeps the rows past the end of the queries of every tile out of the workspace).
// Sinks need nothing here: the forward's LSE includes the sink (so P is already normalized with
// it), D = rowsum(dO * O) is unchanged, and the preprocess computes the sink gradient's partials.
// GQA needs no cross-block sum: one block walks every query head of its kv head's group, so dK
// and dV, summed in registers in the walk's order, are the same bits every run. Only dQ, which
// every key block adds to, depends on the order the blocks reach the workspace in; deterministic
// mode (config.deterministic, the kDeterministic instances) fixes that order with one flag per
// query tile in global memory (the dQ warp's comment below says how, and why it cannot
// deadlock). The dQ conversion reads the workspace in a fixed order either way.
// Score policies (sm90.h's Sm90Scores, a template argument, one instance set each): plain as
// above; softcap-alibi turns S^T into the forward's score in log2 units (sm90_scores.cuh) and
// computes P^T and dS^T = P^T o (dP^T - D) (1 - tanh^2) scale after dP^T is complete (see
// policy_gradients below); the plain instances carry none of its code.
#pragma once

#include <climits>
#include <type_traits>

#include "backends/flash/device_common.cuh"
#include "backends/flash/dq_accum_layout.h"
#include "backends/flash/schedule.h"
#include "backends/flash/sm90.h"
#include "backends/flash/sm90_scores.cuh"
#include "backends/flash/wgmma.cuh"
#include "common/cuda_util.h"

namespace fusedattn::flash {

template <int kHeadDim>
struct Sm90BwdTile {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "wgmma backward: head dims 64 and 128");
  static constexpr int kBlockN = 128;                         // keys: 2 consumers x 64
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per step
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerWarps = 8;
  static constexpr int kConsumerThreads = 256;
  // setmaxnreg: the block starts at 168 per thread (65536 / 384, rounded down to 8); the producer
  // (TMA and bulk-copy issue) gives back what the consumers take (128 * producer + 256 *
  // consumer <= 384 * 168). 32 / 232 rather than 24 / 240: at 24 ptxas spilled two values of the
  // load warp once the dQ warp was added; the consumers fit 232 without spills.
  static constexpr int kProducerRegs = 32;
  static constexpr int kConsumerRegs = 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "register budget");
  // dQ [kBlockM][kHeadDim] in two 64 x 64 tiles: by rows (d64) or by columns (d128).
  static constexpr bool kDqSplitRows = kBlockM == 128;
  static_assert(kDqSplitRows ? kHeadDim == 64 : kBlockM == 64, "one 64 x 64 dQ tile per consumer");
  static constexpr int kColBlocks = kHeadDim / 64;           // 64-column (128-byte) swizzle blocks
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;    // K or V
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;     // one stage of Q or of dO
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;     // one dS^T buffer
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKvBytes;
  static constexpr int kQOffset = kVOffset + kKvBytes;       // [stage]
  static constexpr int kDoOffset = kQOffset + kStages * kQBytes;  // [stage]
  static constexpr int kDsOffset = kDoOffset + kStages * kQBytes;  // [2]
  // Each consumer's float32 64 x 64 dQ tile on its way to the bulk reduce-add (dq_accum_layout.h).
  static constexpr int kDqBytes = 64 * 64 * 4;
  static constexpr int kDqOffset = kDsOffset + 2 * kDsBytes;     // [consumer]
  static constexpr int kStatsOffset = kDqOffset + 2 * kDqBytes;  // [2][LSE, D][kBlockM] floats
  static constexpr int kBarrierOffset = kStatsOffset + 2 * 2 * kBlockM * 4;
  static constexpr int kBarriers = 2 + 2 * kStages;  // kv_full, fix, full[stage], empty[stage]
  // Deterministic mode: the block's ticket (int32), shared with all its threads.
  static constexpr int kTicketOffset = kBarrierOffset + 8 * kBarriers;
  static constexpr int kSmemBytes = kTicketOffset + 16 + 1024;  // + alignment slack
  static_assert(kQOffset % 1024 == 0 && kDoOffset % 1024 == 0 && kDsOffset % 1024 == 0 &&
                    kQBytes % 1024 == 0 && kDsBytes % 1024 == 0,
                "swizzled tiles start 1024-byte aligned");
  static_assert(kDqOffset % 16 == 0 && kDqBytes % 16 == 0, "bulk copies: 16-byte aligned");
  static_assert(kDqOffset % 256 == 0 && kDqBytes % 256 == 0,
                "the dQ stores address float4 k by XOR 64 k: bits 6-7 free in the buffer's base");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
  // Named barriers (0 is __syncthreads): the consumers' per-step barrier, and per consumer c the
  // dQ hand-off to the producer's dQ warp (one consumer warpgroup + one warp): kDqFull + c (the
  // tile is in shared memory) and kDqEmpty + c (the bulk reduce-add has read it).
  static constexpr int kStepBarrier = 1;
  static constexpr int kDqFull = 2;   // 2, 3
  static constexpr int kDqEmpty = 4;  // 4, 5
  static constexpr int kDqBarrierThreads = 128 + 32;
};

struct Sm90BwdMaps {
  CUtensorMap q, k, v, d_o;
};

// Zeroes rows [valid, kRows) of a swizzled tile of kColBlocks column blocks (whole 128-byte rows,
// so the swizzle, which stays inside a row, does not matter), one warp.
template <int kRows, int kColBlocks>
__device__ __forceinline__ void ZeroSwizzledRows(unsigned char* tile, int valid, int lane) {
  valid = valid < 0 ? 0 : valid;
  const int chunks = (kRows - valid) * 8;  // 16-byte chunks per column block
  for (int e = lane; e < kColBlocks * chunks; e += 32) {
    const int cb = e / chunks, rest = e % chunks;
    *reinterpret_cast<uint4*>(tile + cb * kRows * 128 + (valid + rest / 8) * 128 +
                              (rest % 8) * 16) = make_uint4(0, 0, 0, 0);
  }
}

// The query rows [*first, *last] (empty: first > last) that the key block from key n0 walks, i.e.
// that may see one of its keys: the kernel's own walk, and (deterministic) the walk of the block
// before it in the dQ order, computed by the same function so that the two always agree.
template <int kBlockN>
__device__ __forceinline__ void KeyBlockQueryRows(const FlashParams& p, const SeqInfo& seq, int n0,
                                                  int* first, int* last) {
  *first = 0;
  *last = -1;
  if (n0 < seq.len_kv) RowsSeeingKeys(p, n0, n0 + kBlockN, seq.len_q, seq.len_kv, first, last);
}

// kSoftcap: the softcap-alibi policy's kernel for problems with a softcap (and maybe ALiBi), else
// the one for ALiBi alone (false for plain). Two kernels of one instance: the softcap path's
// registers make ptxas serialize the d64 wgmmas (C7512), which ALiBi alone then does not pay.
// kDeterministic: dQ added in a fixed order (see "Deterministic mode" below); its own instances
// (sm90.h), so that the plain path carries none of its code or registers.
template <typename Element, int kHeadDim, Sm90Scores kScores, bool kSoftcap, bool kDeterministic>
__global__ void __launch_bounds__(384, 1)
    WgmmaBackwardKernel(const __grid_constant__ Sm90BwdMaps maps, const FlashParams p,
                        int n_tiles) {
#if FUSEDATTN_SM90_DEVICE
  using Tile = Sm90BwdTile<kHeadDim>;
  using Scores = sm90::SoftcapAlibiScores;
  constexpr bool kTransformScores = kScores == Sm90Scores::kSoftcapAlibi;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  constexpr int kColBlocks = Tile::kColBlocks;
  constexpr int kQBytes = Tile::kQBytes;
  constexpr int kSlices = kBlockM / 8;  // 8-query slices of S^T, dP^T

  // The plain grid, or the heavy-first schedule of THD problems (schedule.h); key tile 0 (the
  // one most causal queries see) first either way. Deterministic: the blocks take their places
  // in that order by ticket (the order they start in), and walk each (kv head, sequence)'s key
  // tiles from the last to the first (see "Deterministic mode" below). The two modes' tile
  // choice is written apart: folding them (a ticket variable defaulting to blockIdx.x, the aligned
  // shared-memory base computed up here) changed nothing in the plain path's logic but made
  // ptxas serialize the wgmmas of the softcap-alibi d64 kernels (C7512) and spill.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  TileIndex tile;
  if constexpr (kDeterministic) {
    int* ticket = reinterpret_cast<int*>(
        smem_raw + ((1024u - (SmemAddress(smem_raw) & 1023u)) & 1023u) + Tile::kTicketOffset);
    if (threadIdx.x == 0) *ticket = atomicAdd(p.dq_order, 1);
    __syncthreads();
    const int place = *ticket;
    if (p.schedule != nullptr) {
      tile = ScheduledBlock(p.schedule, place, p.heads_kv, p.batch);
      if (tile.tile < 0) return;  // past the last scheduled tile
    } else {
      tile = DecomposeBlock(place, n_tiles, p.heads_kv);
    }
  } else {
    if (p.schedule != nullptr) {
      tile = ScheduledBlock(p.schedule, blockIdx.x, p.heads_kv, p.batch);
      if (tile.tile < 0) return;  // past the last scheduled tile
    } else {
      tile = DecomposeBlock(blockIdx.x, n_tiles, p.heads_kv);
    }
  }
  const int b = tile.b, hk = tile.h;
  const SeqInfo seq = LoadSeq(p, b);
  if constexpr (kDeterministic) {
    // The schedule counts ceil(len_kv / kBlockN) tiles per sequence (schedule.h), the grid
    // n_tiles.
    const int tiles = p.schedule != nullptr ? (seq.len_kv + kBlockN - 1) / kBlockN : n_tiles;
    tile.tile = tiles - 1 - tile.tile;
  }
  const int n_tile = tile.tile;
  const int n0 = n_tile * kBlockN;

  int first, last;  // query rows that may see the block's keys
  KeyBlockQueryRows<kBlockN>(p, seq, n0, &first, &last);
  if (first > last) {  // no query sees these keys: dK = dV = 0
    ZeroKeyBlockGradients<Tile::kThreads>(p, b, hk, seq, n0, kBlockN);
    return;
  }
  // Steps (p.group * m_count; each role computes the count itself, which keeps it out of the
  // registers live across the role split): query head hk * group + step / m_count, query tile
  // m_first + step % m_count.
  const int m_first = first / kBlockM;
  const int m_count = last / kBlockM - m_first + 1;

  unsigned char* smem = smem_raw + ((1024u - (SmemAddress(smem_raw) & 1023u)) & 1023u);
  unsigned char* k_s = smem + Tile::kKOffset;    // [col block][128 keys][128 B]
  unsigned char* v_s = smem + Tile::kVOffset;    // [col block][128 keys][128 B]
  unsigned char* q_s = smem + Tile::kQOffset;    // [stage][col block][kBlockM rows][128 B]
  unsigned char* do_s = smem + Tile::kDoOffset;  // [stage][col block][kBlockM rows][128 B]
  unsigned char* ds_s = smem + Tile::kDsOffset;  // [2][kBlockM / 64][128 keys][128 B]
  float* stats = reinterpret_cast<float*>(smem + Tile::kStatsOffset);  // [step % 2][LSE, D][kBlockM]
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Tile::kBarrierOffset);
  uint64_t* kv_full = bars;
  uint64_t* fix = bars + 1;  // the producer's own barrier for tiles it patches
  uint64_t* full = bars + 2;
  uint64_t* empty = full + kStages;

  // A block whose upper 64 keys lie past the sequence (the last block of a sequence of 64 mod
  // 128 keys): consumer 1 has no keys, so it reads no stage (only its dQ tile, from dS^T and K)
  // and only consumer 0's warps release the stages; dQ sums over the lower 64 keys.
  const bool upper_keys_absent = n0 + 64 >= seq.len_kv;
  // d64's step of 128 queries from m0 across the end of the queries with at most 64 left (the
  // last of a sequence of 64 mod 128 rows): the key step runs dV, dK over 64 queries, and
  // consumer 1's dQ rows (queries 64..127) are all past the sequence.
  auto half_queries_at = [&](int m0) { return kBlockM == 128 && m0 + 64 >= seq.len_q; };
  if (threadIdx.x == 0) {
    sm90::MbarInit(kv_full, 1);
    sm90::MbarInit(fix, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::MbarInit(full + s, 1);
      sm90::MbarInit(empty + s,
                     upper_keys_absent ? Tile::kConsumerWarps / 2 : Tile::kConsumerWarps);
    }
    sm90::FenceBarrierInit();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    sm90::RegistersDown<Tile::kProducerRegs>();
    if (threadIdx.x >= 64) return;
    if (threadIdx.x < 32) {  // ---- warp 0: the loads
      const int lane = threadIdx.x;
      const int batch_coord = p.thd ? 0 : b;
      uint32_t fix_parity = 0;

      // K and V, once. Rows past the keys but inside the tensor exist only with per-sequence
      // lengths: when the products read any of them (all 128 rows, or the lower 64 when
      // upper_keys_absent), the tiles land on `fix`, get those rows zeroed, and kv_full is arrived
      // by hand. Rows no product reads stay as they are (maybe NaN).
      const int key_rows_read = upper_keys_absent ? 64 : kBlockN;
      const bool patch_kv = p.padding && n0 + key_rows_read > seq.len_kv;
      if (lane == 0) {
        sm90::PrefetchTensorMap(&maps.q);
        sm90::PrefetchTensorMap(&maps.d_o);
        uint64_t* bar = patch_kv ? fix : kv_full;
        sm90::MbarArriveExpectTx(bar, 2 * Tile::kKvBytes);
#pragma unroll
        for (int cb = 0; cb < kColBlocks; ++cb) {
          const int row = static_cast<int>(seq.start_kv) + n0;
          sm90::TmaLoad4d(k_s + cb * kBlockN * 128, &maps.k, bar, cb * 64, row, hk, batch_coord);
          sm90::TmaLoad4d(v_s + cb * kBlockN * 128, &maps.v, bar, cb * 64, row, hk, batch_coord);
        }
      }
      if (patch_kv) {
        sm90::MbarWait(fix, fix_parity);
        fix_parity ^= 1;
        ZeroSwizzledRows<kBlockN, kColBlocks>(k_s, seq.len_kv - n0, lane);
        ZeroSwizzledRows<kBlockN, kColBlocks>(v_s, seq.len_kv - n0, lane);
        sm90::FenceProxyAsync();  // generic writes before the consumers' wgmma (async proxy)
        __syncwarp();
        if (lane == 0) sm90::MbarArrive(kv_full);
      }

      for (int step = 0; step < p.group * m_count; ++step) {
        const int h = hk * p.group + step / m_count;
        const int m0 = (m_first + step % m_count) * kBlockM;
        const int stage = step % kStages;
        unsigned char* q_dst = q_s + stage * kQBytes;
        unsigned char* do_dst = do_s + stage * kQBytes;
        sm90::MbarWait(empty + stage, ((step / kStages) & 1) ^ 1);  // first use: no wait
        // A tile that crosses the end of the queries within the rows dV and dK read (all kBlockM,
        // or the lower 64 at d64's half_queries) lands on `fix`, gets its rows past the sequence
        // zeroed, and full[stage] is arrived by hand. The rows past 64 at half_queries only reach
        // S^T and dP^T columns whose P^T is masked to zero and whose dS^T reaches only
        // consumer 1's dQ rows past the queries, which the dQ warp never adds.
        const int query_rows_read = half_queries_at(m0) ? 64 : kBlockM;
        const bool patch_q = p.padding && m0 + query_rows_read > seq.len_q;
        if (lane == 0) {
          uint64_t* bar = patch_q ? fix : full + stage;
          sm90::MbarArriveExpectTx(bar, 2 * kQBytes);
#pragma unroll
          for (int cb = 0; cb < kColBlocks; ++cb) {
            const int row = static_cast<int>(seq.start_q) + m0;
            sm90::TmaLoad4d(q_dst + cb * kBlockM * 128, &maps.q, bar, cb * 64, row, h, batch_coord);
            sm90::TmaLoad4d(do_dst + cb * kBlockM * 128, &maps.d_o, bar, cb * 64, row, h,
                            batch_coord);
          }
        }
        if (patch_q) {  // zero Q and dO rows [len_q - m0, kBlockM)
          sm90::MbarWait(fix, fix_parity);
          fix_parity ^= 1;
          ZeroSwizzledRows<kBlockM, kColBlocks>(q_dst, seq.len_q - m0, lane);
          ZeroSwizzledRows<kBlockM, kColBlocks>(do_dst, seq.len_q - m0, lane);
          sm90::FenceProxyAsync();
          __syncwarp();
          if (lane == 0) sm90::MbarArrive(full + stage);
        }
      }
      return;
    }
    // ---- warp 1: dQ of each consumer and step into the workspace, one bulk reduce-add of the
    // tile's rows inside the sequence (tiled layout, dq_accum_layout.h). The buffer starts
    // empty (one arrival ahead); every tile then costs the consumer one kDqEmpty sync and one
    // kDqFull arrival and this warp the reverse, and the consumer's last kDqEmpty sync (after
    // its loop) takes this warp's last arrival, so the counts match.
    // Written lean (nested loops, 32-bit shared address): this warp has kProducerRegs too.
    //
    // Deterministic mode: the key blocks of a (kv head, sequence) add their dQ tiles of query
    // rows [m0, m0 + kBlockM) of query head h in a fixed order, from the last key block that
    // walks those rows to the first. The blocks that walk a query tile are consecutive key
    // blocks (Band::rows_seeing_keys' first and last rows grow with the keys, so the blocks
    // seeing a tile, which are also inside the sequence and seen by some query, form one run),
    // so this block's predecessor for the tile is block n_tile + 1 if that block's walk
    // (KeyBlockQueryRows, the function this block's walk comes from) holds the tile, and else
    // there is none. The tile's flag (dq_order, one per 64 query rows at m0 of (b, h); the d64
    // step's 128 rows use the one at m0) says which block added last (1 + its key tile): this
    // warp waits (acquire) until the flag names the predecessor, adds the step's two tiles,
    // waits until the adds are complete (not only read: the next block's adds must land after
    // them), and names itself (release). A block with no predecessor for a tile adds at once.
    // Causal problems skip no order slot: the walk of a key block starts at the first query
    // tile that sees it, so the first block of a tile's order is the last key block that walks
    // it, whatever the mask. The order runs from the last key block down because the blocks
    // also start in that order (tickets, above): under a causal mask block n + 1, started
    // earlier, walks the same tiles from a later first tile, so it has added a tile steps before
    // block n comes to it and the order costs almost no waiting; without a mask, the blocks of a
    // kv head lag one another by one add each, once.
    // No deadlock: a block waits only for its predecessor, whose ticket is smaller (block
    // n_tile + 1 of the same kv head and sequence: one ticket earlier, or in the same place
    // of the schedule's order). A ticket is taken by a block that is already running on an SM,
    // so the running block with the smallest ticket waits for nothing that is not done, runs to
    // its end and frees its SM; by induction every block finishes, whatever the grid size,
    // the number of resident blocks or the order the hardware starts blocks in (the ticket
    // order, not blockIdx, decides the order of the work).
    const int lane = threadIdx.x - 32;
    const uint32_t dq_s = SmemAddress(smem + Tile::kDqOffset);
    int pred_first = 0, pred_last = -1;  // query tiles of the predecessor's walk (deterministic)
    if constexpr (kDeterministic) {
      int rows_first, rows_last;
      KeyBlockQueryRows<kBlockN>(p, seq, n0 + kBlockN, &rows_first, &rows_last);
      if (rows_first <= rows_last) pred_first = rows_first / kBlockM, pred_last = rows_last / kBlockM;
    }
    for (int c = 0; c < 2; ++c)
      sm90::NamedBarrierArrive(Tile::kDqEmpty + c, Tile::kDqBarrierThreads);
    for (int hh = 0; hh < p.group; ++hh) {  // the steps' order: heads, then query tiles
      const int h = hk * p.group + hh;
      float* head_dq = p.dq_accum + RowIndex(p, b, h, 0) * kHeadDim;
      for (int mt = m_first; mt < m_first + m_count; ++mt) {
        const int m0 = mt * kBlockM;
        int32_t* flag = nullptr;
        if constexpr (kDeterministic)
          flag = p.dq_order + DqOrderFlag(b, h, m0, p.heads_q, p.max_seqlen_q);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          sm90::NamedBarrierSync(Tile::kDqFull + c, Tile::kDqBarrierThreads);
          if constexpr (kDeterministic) {
            if (c == 0 && lane == 0 && mt >= pred_first && mt <= pred_last) {
              while (sm90::LoadAcquireGpu(flag) != n_tile + 2) {
              }
              sm90::FenceProxyAsyncGlobal();  // the adds below after the predecessor's
            }
          }
          const int tile_m0 = m0 + (Tile::kDqSplitRows ? 64 * c : 0);
          const int rows = min(64, seq.len_q - tile_m0);  // rows of the sequence in the tile
          if (lane == 0 && rows > 0) {
            sm90::BulkReduceAddF32(
                head_dq + DqTiledBlockOffset(tile_m0, Tile::kDqSplitRows ? 0 : c,
                                             p.max_seqlen_q, kHeadDim),
                dq_s + c * Tile::kDqBytes, rows * kDqBlockCols * 4);
            sm90::BulkCommit();
            sm90::BulkWaitRead<0>();
          }
          __syncwarp();
          sm90::NamedBarrierArrive(Tile::kDqEmpty + c, Tile::kDqBarrierThreads);
        }
        if constexpr (kDeterministic) {
          if (lane == 0) {
            sm90::BulkWait<0>();             // both adds complete
            sm90::FenceProxyAsyncGlobal();  // before the release below
            sm90::StoreReleaseGpu(flag, n_tile + 1);
          }
        }
      }
    }
    if (lane == 0) sm90::BulkWait<0>();  // the adds complete before the block ends
    return;
  }

  // ---------------------------------------------------------------- consumers
  sm90::RegistersUp<Tile::kConsumerRegs>();
  const int wg = warpgroup - 1;  // keys [n0 + 64 wg, n0 + 64 wg + 64) of the block
  const int tid = threadIdx.x - 128 * warpgroup;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int key0 = n0 + 64 * wg;
  // False only for consumer 1 when upper_keys_absent. Read from lane 0, like dq_rows_absent, so
  // that the compiler knows the branches on them are warp-uniform (the loop keeps its uniform
  // registers).
  const bool has_keys = __shfl_sync(0xffffffffu, key0 < seq.len_kv, 0);
  const int key_row = key0 + warp * 16 + g;  // this thread's keys: key_row and key_row + 8
  const int64_t shift = DiagShift(p, seq.len_q, seq.len_kv);
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;

  // The query rows [q_first, q_last] that see each of this thread's two keys (exact for one key;
  // empty for a key past the sequence).
  int q_first[2], q_last[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    RowsSeeingKeys(p, key_row + 8 * r, key_row + 8 * r + 1, seq.len_q, seq.len_kv, &q_first[r],
                   &q_last[r]);

  float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
  const float scale_log2 = p.scale * kLog2e;
  const float scale = p.scale;
  // The softcap-alibi instances: P^T and dS^T come after dP^T is complete, from S^T (raw q.k, or
  // tanh(scale q.k / softcap) with a softcap, taken right after S^T completes so that the MUFU
  // work overlaps dP^T); the derivative of the softcap needs the tanh next to dP^T, and st has no
  // room for both P^T and the tanh. With or without a softcap: the template argument; ALiBi: a
  // branch uniform per kernel.
  constexpr bool kSoftcapped = kTransformScores && kSoftcap;
  const bool alibi = kTransformScores && p.bias_type == FUSEDATTN_BIAS_ALIBI;
  // ALiBi: query 2 t's diagonal minus this thread's first key, as a float (exact below 2^24; a
  // step adds m0, an element 8 i + c - 8 r).
  const float alibi_diagonal0 =
      alibi ? static_cast<float>(AlibiDiagonal(2 * t, seq.len_q, seq.len_kv) - key_row) : 0.f;

  const uint32_t k_addr = SmemAddress(k_s), v_addr = SmemAddress(v_s);
  const uint32_t k_wg_addr = k_addr + wg * 64 * 128, v_wg_addr = v_addr + wg * 64 * 128;
  // This consumer's dQ tile: rows [64 dq_rows, +64) of the step, columns [64 dq_cols, +64).
  const int dq_rows = Tile::kDqSplitRows ? wg : 0;
  const int dq_cols = Tile::kDqSplitRows ? 0 : wg;
  const uint32_t k_dq_addr = k_addr + dq_cols * (kBlockN * 128);
  // This thread's float4 k = 0 of row 16 warp + g in the consumer's dQ buffer (float4 k at XOR
  // 64 k, row + 8 at + 2048: DqFragmentByteOffset).
  const uint32_t dq_store_addr = SmemAddress(smem + Tile::kDqOffset) + wg * Tile::kDqBytes +
                                 DqFragmentByteOffset(16 * warp + g, t);

  // The LSE and D of a step's rows go through shared memory, [step % 2][LSE, D][kBlockM]:
  // consumer thread c (c < 2 kBlockM) reads value c (row c % kBlockM) of the next step into a
  // register at the top of a step and stores it before that step's named barrier, which orders
  // the store after every consumer's reads of the step before and before their reads in the next
  // (no mbarrier hand-off between the producer's stores and the consumers' loads). LSE in log2
  // units, +inf where the row has no gradient (past the sequence, non-finite LSE: BackwardLse's
  // rule, whose visible-key test the element mask covers), so that P = 2^(s - LSE) = 0.
  const int ctid = threadIdx.x - 128;
  const bool stat_loader = ctid < 2 * kBlockM;
  auto load_stat = [&](int step) -> float {
    const int h = hk * p.group + step / m_count;
    const bool is_lse = ctid < kBlockM;
    const int64_t i = int64_t{(m_first + step % m_count) * kBlockM} + ctid % kBlockM;
    if (i >= seq.len_q) return is_lse ? INFINITY : 0.f;
    if (!is_lse) return p.delta[RowIndex(p, b, h, i)];
    const float lse = p.lse.data[LseOffset(p.lse, b, h, seq.start_q, i)];
    return isfinite(lse) ? lse * kLog2e : INFINITY;
  };
  if (stat_loader) stats[ctid] = load_stat(0);
  sm90::NamedBarrierSync(Tile::kStepBarrier, Tile::kConsumerThreads);
  sm90::MbarWait(kv_full, 0);

  const int steps = p.group * m_count;
  // The steps, compiled apart for a consumer with keys and for one without (consumer 1 of a
  // block whose upper keys are past the sequence: dQ only), so that dS^T's registers, which
  // the dK product after dQ reads, are defined on every path of its version.
  auto run_steps = [&](auto keys) {
    constexpr bool kHasKeys = decltype(keys)::value != 0;
    for (int step = 0; step < steps; ++step) {
      const int m0 = (m_first + step % m_count) * kBlockM;
      const int stage = step % kStages;
      const uint32_t q_addr = SmemAddress(q_s) + stage * kQBytes;
      const uint32_t do_addr = SmemAddress(do_s) + stage * kQBytes;
      const float* lse_s = stats + (step & 1) * 2 * kBlockM;
      const float* delta_s = lse_s + kBlockM;
      unsigned char* ds_buf = ds_s + (step & 1) * Tile::kDsBytes;
      const bool stat_next = stat_loader && step + 1 < steps;
      const float next_stat = stat_next ? load_stat(step + 1) : 0.f;
      const bool half_queries = half_queries_at(m0);

      uint32_t dsa[kBlockM / 16][4];  // dS^T as the A operand of dK (issued after dQ)
      if constexpr (kHasKeys) {
        sm90::MbarWait(full + stage, (step / kStages) & 1);

        // S^T = K_wg Q^T and dP^T = V_wg dO^T: 16 columns of d per wgmma, 4 per column block; two
        // commit groups, so the exponentials of P^T overlap dP^T on the tensor cores. Full width
        // even at half_queries (an instance of 64 queries costs the registers that keep the wgmmas
        // pipelined): the queries past the sequence have Q = dO = 0 and LSE = +inf, so P^T = 0.
        float st[kBlockM / 2], dpt[kBlockM / 2];
        sm90::WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          const uint32_t k_off = (kk / 4) * (kBlockN * 128) + (kk % 4) * 32;
          const uint32_t q_off = (kk / 4) * (kBlockM * 128) + (kk % 4) * 32;
          sm90::Wgmma<Element, kBlockM>::template SS<0, 0>(
              st, sm90::MakeDesc(k_wg_addr + k_off, 16, 1024),
              sm90::MakeDesc(q_addr + q_off, 16, 1024), kk > 0);
        }
        sm90::WgmmaCommit();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          const uint32_t v_off = (kk / 4) * (kBlockN * 128) + (kk % 4) * 32;
          const uint32_t do_off = (kk / 4) * (kBlockM * 128) + (kk % 4) * 32;
          sm90::Wgmma<Element, kBlockM>::template SS<0, 0>(
              dpt, sm90::MakeDesc(v_wg_addr + v_off, 16, 1024),
              sm90::MakeDesc(do_addr + do_off, 16, 1024), kk > 0);
        }
        sm90::WgmmaCommit();

        // P^T: element 4 i + 2 r + c of st is (key key_row + 8 r, query m0 + 8 i + 2 t + c).
        sm90::WgmmaWait<1>();
        sm90::FenceOperands(st);
        if constexpr (kSoftcapped) {
          const Scores scores(p);
#pragma unroll
          for (int e = 0; e < kBlockM / 2; ++e) st[e] = scores.Tanh(st[e]);
        }
        // At half_queries only the lower 64 queries' slices: the upper ones feed nothing (their
        // P^T is masked to zero below and their dS^T reaches only consumer 1's dQ rows past the
        // queries, which the dQ warp never adds).
        auto exponentials = [&](auto slices) {
#pragma unroll
          for (int i = 0; i < decltype(slices)::value; ++i) {
            const float2 lse = *reinterpret_cast<const float2*>(lse_s + 8 * i + 2 * t);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              st[4 * i + 2 * r] = FastExp2(fmaf(st[4 * i + 2 * r], scale_log2, -lse.x));
              st[4 * i + 2 * r + 1] = FastExp2(fmaf(st[4 * i + 2 * r + 1], scale_log2, -lse.y));
            }
          }
        };
        // Hidden keys: P = 0, only where these 64 keys x the step's queries cross a mask boundary.
        auto mask_probabilities = [&] {
          const bool interior =
              TileFullyVisible(p, m0, kBlockM, key0, 64, seq.len_q, seq.len_kv, shift);
          if (!interior) {
#pragma unroll
            for (int i = 0; i < kSlices; ++i)
#pragma unroll
              for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                  const int q = m0 + 8 * i + 2 * t + c;
                  if (q < q_first[r] || q > q_last[r]) st[4 * i + 2 * r + c] = 0.f;
                }
          }
        };
        if constexpr (!kTransformScores) {
          if (half_queries)
            exponentials(sm90::Static<kSlices / 2>());
          else
            exponentials(sm90::Static<kSlices>());
          mask_probabilities();
        }

        // dS^T = P^T o (dP^T - D) * scale (d loss / d (q.k)).
        sm90::WgmmaWait<0>();
        sm90::FenceOperands(dpt);
        auto score_gradients = [&](auto slices) {
#pragma unroll
          for (int i = 0; i < decltype(slices)::value; ++i) {
            const float2 delta = *reinterpret_cast<const float2*>(delta_s + 8 * i + 2 * t);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              dpt[4 * i + 2 * r] = st[4 * i + 2 * r] * (dpt[4 * i + 2 * r] - delta.x) * scale;
              dpt[4 * i + 2 * r + 1] =
                  st[4 * i + 2 * r + 1] * (dpt[4 * i + 2 * r + 1] - delta.y) * scale;
            }
          }
        };
        // The softcap-alibi policy (sm90_scores.cuh), from S^T: dS^T = P^T o (dP^T - D) dcap scale
        // (d loss / d (q.k); dcap = 1 - tanh^2 with a softcap, ScoreOf's derivative, else 1;
        // ALiBi adds a constant: no term), in two passes that each read one statistic per query,
        // as the plain loops: (dP^T - D) dcap scale while S^T still holds the tanh or q.k, then
        // P^T = 2^(s - LSE) in its place, s fusedattn.h's score in log2 units as in the forward
        // (element 4 i + 2 r + c at distance alibi_diagonal - 8 r + 8 i + c from its query's ALiBi
        // diagonal), the mask on P^T, and the product.
        auto policy_gradients = [&](auto slices, auto with_softcap, auto with_alibi) {
          constexpr int kN = decltype(slices)::value;
          constexpr bool kWithSoftcap = decltype(with_softcap)::value != 0;
          constexpr bool kWithAlibi = decltype(with_alibi)::value != 0;
#pragma unroll
          for (int i = 0; i < kN; ++i) {
            const float2 delta = *reinterpret_cast<const float2*>(delta_s + 8 * i + 2 * t);
#pragma unroll
            for (int e = 4 * i; e < 4 * i + 4; ++e) {
              const float d = (e & 1) == 0 ? delta.x : delta.y;
              dpt[e] = kWithSoftcap ? (dpt[e] - d) * (Scores::CapDerivative(st[e]) * scale)
                                : (dpt[e] - d) * scale;
            }
          }
          const Scores scores(p);
          const float qk_log2 = Scores::ScaledFactor(p);
          float slope_log2 = 0.f, alibi_diagonal = 0.f;
          if constexpr (kWithAlibi) {
            slope_log2 = Scores::SlopeLog2(p, hk * p.group + step / m_count);
            alibi_diagonal = alibi_diagonal0 + static_cast<float>(m0);
          }
#pragma unroll
          for (int i = 0; i < kN; ++i) {
            const float2 lse = *reinterpret_cast<const float2*>(lse_s + 8 * i + 2 * t);
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int e = 4 * i + 2 * r + c;
                float score = kWithSoftcap ? scores.Capped(st[e]) : Scores::Scaled(st[e], qk_log2);
                if constexpr (kWithAlibi)
                  score = Scores::Alibi(score, slope_log2,
                                        alibi_diagonal + static_cast<float>(8 * i + c - 8 * r));
                st[e] = FastExp2(score - (c == 0 ? lse.x : lse.y));
              }
          }
          mask_probabilities();
#pragma unroll
          for (int e = 0; e < 4 * kN; ++e) dpt[e] *= st[e];
        };
        auto policy_gradients_of = [&](auto slices) {
          if constexpr (kSoftcapped) {
            if (alibi)
              policy_gradients(slices, sm90::Static<1>(), sm90::Static<1>());
            else
              policy_gradients(slices, sm90::Static<1>(), sm90::Static<0>());
          } else {
            policy_gradients(slices, sm90::Static<0>(), sm90::Static<1>());  // ALiBi alone
          }
        };
        if constexpr (kTransformScores) {
          if (half_queries)
            policy_gradients_of(sm90::Static<kSlices / 2>());
          else
            policy_gradients_of(sm90::Static<kSlices>());
        } else {
          if (half_queries)
            score_gradients(sm90::Static<kSlices / 2>());
          else
            score_gradients(sm90::Static<kSlices>());
        }

        // P^T and dS^T as A operands (queries 16 kk.. = slices 2 kk, 2 kk + 1), and dS^T to shared
        // memory for dQ: slice i, rows r of this thread at (key 64 wg + 16 warp + g + 8 r, query
        // 8 i + 2 t) of the [128 keys][kBlockM queries] tile. dsa[kk][m] is one 8x8 matrix in
        // the mma fragment layout (slice 2 kk + m / 2, rows 8 (m % 2)..), so one stmatrix.x4 per
        // kk stores four of them (4 instructions per thread at d128 where 32-bit stores took
        // 16); lane 8 m + j gives the address of row j of matrix m. Conflict-free either way:
        // the 8 rows of a store phase land in 8 different 16-byte chunks of the swizzle. The
        // softcap-alibi instances keep the 32-bit stores: there stmatrix's addresses made ptxas
        // spill (d64 32/36 B) and the backward measured 3-5% slower (H200, 2026-11-28), where
        // the plain d128 one measured up to 2% faster.
        uint32_t pa[kBlockM / 16][4];
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            pa[kk][e] = Pack<Element>(st[8 * kk + 2 * e], st[8 * kk + 2 * e + 1]);
            dsa[kk][e] = Pack<Element>(dpt[8 * kk + 2 * e], dpt[8 * kk + 2 * e + 1]);
          }
        if constexpr (!kTransformScores) {
          const int matrix = lane / 8;
          const int row = 64 * wg + 16 * warp + lane % 8 + 8 * (matrix % 2);
          const uint32_t ds_address = SmemAddress(ds_buf);
#pragma unroll
          for (int kk = 0; kk < kBlockM / 16; ++kk)
            sm90::StoreMatrix4(
                ds_address + sm90::Swizzle128Offset(row, 8 * (2 * kk + matrix / 2), kBlockN),
                dsa[kk][0], dsa[kk][1], dsa[kk][2], dsa[kk][3]);
        } else {
#pragma unroll
          for (int i = 0; i < kSlices; ++i) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int row = 64 * wg + 16 * warp + g + 8 * r;
              *reinterpret_cast<uint32_t*>(ds_buf +
                                           sm90::Swizzle128Offset(row, 8 * i + 2 * t, kBlockN)) =
                  dsa[i / 2][2 * (i % 2) + r];
            }
          }
        }
        sm90::FenceProxyAsync();  // this thread's dS^T stores before the wgmma reads (async proxy)

        // dV += P^T dO now (it needs no other consumer); dK += dS^T Q after dQ below. 16 queries
        // per wgmma (two 8-row swizzle atoms, 2048 bytes).
        auto dv_product = [&](auto query_chunks) {
          sm90::FenceOperands(acc_dv);
          sm90::WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < decltype(query_chunks)::value; ++kk)
            sm90::Wgmma<Element, kHeadDim>::template RS<1>(
                acc_dv, pa[kk], sm90::MakeDesc(do_addr + kk * 2048, kBlockM * 128, 1024), true);
          sm90::WgmmaCommit();
        };
        if (half_queries)
          dv_product(sm90::Static<kBlockM / 32>());
        else
          dv_product(sm90::Static<kBlockM / 16>());
      }  // kHasKeys

      // dQ tile = dS K over all 128 keys, once both consumers' dS^T is in place; issued before dK
      // so that its trip through shared memory overlaps the dK product.
      if (stat_next) stats[((step + 1) & 1) * 2 * kBlockM + ctid] = next_stat;
      // The other consumer may be in the other instance of this loop (kHasKeys differs).
      sm90::NamedBarrierSyncFromDivergentCode(Tile::kStepBarrier, Tile::kConsumerThreads);
      // At d64's half step consumer 1's dQ rows lie past the queries: it computes them anyway
      // (from dS^T columns that hold garbage there, maybe NaN), and the dQ warp adds none of them
      // (the tile has no rows of the sequence); no branch between the products.
      float dq[32];
      const uint32_t ds_addr = SmemAddress(ds_buf) + dq_rows * (kBlockN * 128);
      auto dq_product = [&](auto key_chunks) {
        sm90::WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < decltype(key_chunks)::value; ++kk)
          sm90::Wgmma<Element, 64>::template SS<1, 1>(
              dq, sm90::MakeDesc(ds_addr + kk * 2048, kBlockN * 128, 1024),
              sm90::MakeDesc(k_dq_addr + kk * 2048, kBlockN * 128, 1024), kk > 0);
        sm90::WgmmaCommit();
      };
      if (upper_keys_absent)
        dq_product(sm90::Static<kBlockN / 32>());
      else
        dq_product(sm90::Static<kBlockN / 16>());
      if constexpr (kHasKeys) {
        auto dk_product = [&](auto query_chunks) {
          sm90::FenceOperands(acc_dk);
          sm90::WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < decltype(query_chunks)::value; ++kk)
            sm90::Wgmma<Element, kHeadDim>::template RS<1>(
                acc_dk, dsa[kk], sm90::MakeDesc(q_addr + kk * 2048, kBlockM * 128, 1024), true);
          sm90::WgmmaCommit();
        };
        if (half_queries)
          dk_product(sm90::Static<kBlockM / 32>());
        else
          dk_product(sm90::Static<kBlockM / 16>());
        sm90::WgmmaWait<1>();  // dV and dQ done, dK may still run
      } else {
        sm90::WgmmaWait<0>();
      }

      // The dQ tile goes to this consumer's buffer in register order, four 16-byte stores per row
      // of this thread (dq_accum_layout.h's DqFragmentByteOffset), once the dQ warp has read the
      // previous one; then the hand-off to the dQ warp, which adds it to the workspace with one
      // bulk reduce-add.
      sm90::FenceOperands(dq);
      sm90::NamedBarrierSync(Tile::kDqEmpty + wg, Tile::kDqBarrierThreads);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t address = dq_store_addr ^ (64 * k);
        sm90::StoreShared4<0>(address, dq[8 * k], dq[8 * k + 1], dq[8 * k + 4], dq[8 * k + 5]);
        sm90::StoreShared4<2048>(address, dq[8 * k + 2], dq[8 * k + 3], dq[8 * k + 6],
                                 dq[8 * k + 7]);
      }
      sm90::FenceProxyAsync();  // the stores before the bulk copy's reads (async proxy)
      sm90::NamedBarrierArrive(Tile::kDqFull + wg, Tile::kDqBarrierThreads);
      sm90::WgmmaWait<0>();
      sm90::FenceOperands(acc_dv);
      sm90::FenceOperands(acc_dk);
      __syncwarp();
      if (kHasKeys && lane == 0) sm90::MbarArrive(empty + stage);  // this warp is done with it
    }
  };
  if (has_keys)
    run_steps(sm90::Static<1>());
  else
    run_steps(sm90::Static<0>());
  // The dQ warp's last arrival (its last tile has been read; see the producer).
  sm90::NamedBarrierSync(Tile::kDqEmpty + wg, Tile::kDqBarrierThreads);

  // dK (scale already in dS), dV of this thread's keys; keys past the sequence come out zero
  // (their K/V rows were zeroed and masked).
  const int64_t rows_out = p.thd ? seq.len_kv : p.max_seqlen_kv;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = key_row + 8 * r;
    if (j >= rows_out) continue;
    const int64_t at_k = Offset(p.dk, b, hk, seq.start_kv, j, 0);
    const int64_t at_v = Offset(p.dv, b, hk, seq.start_kv, j, 0);
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      const int x = 8 * i + 2 * t;
      if (x < dqk)
        StorePair<Element>(p.dk.data, at_k + x * p.dk.stride_d, p.dk.stride_d,
                           acc_dk[4 * i + 2 * r], acc_dk[4 * i + 2 * r + 1]);
      if (x < dv)
        StorePair<Element>(p.dv.data, at_v + x * p.dv.stride_d, p.dv.stride_d,
                           acc_dv[4 * i + 2 * r], acc_dv[4 * i + 2 * r + 1]);
    }
  }
#endif  // FUSEDATTN_SM90_DEVICE
}

template <typename Element, int kHeadDim, Sm90Scores kScores, bool kDeterministic>
Status LaunchWgmmaBackward(const FlashParams& p, cudaStream_t stream, bool* launched) {
  using Tile = Sm90BwdTile<kHeadDim>;
  static_assert(Tile::kBlockN == kSm90ScheduleRowsBackward, "schedule.h: the planner's rows");
  static_assert(Tile::kBlockM % kDqTileRows == 0, "one dQ order flag per 64 query rows");
  *launched = false;
  // The plain variant (kPlain) or softcap/ALiBi (kSoftcapAlibi) with the dQ workspace of this
  // instance, in this instance's mode (deterministic: with its order workspace); everything else
  // (bias tensors, dropout, score_mod graphs) stays on the mma.sync kernels.
  Sm90Scores scores;
  const bool policy_runs_it = Sm90ScoresOf(p, /*forward=*/false, &scores) && scores == kScores;
  if (!policy_runs_it || p.deterministic != kDeterministic ||
      (kDeterministic && p.dq_order == nullptr) || p.dbias_mode != kDbiasNone ||
      p.flex.block_mask != nullptr || p.dq_accum == nullptr || p.dq_accum_dim != kHeadDim ||
      p.head_dim_qk > kHeadDim || p.head_dim_v > kHeadDim || p.qkv_dtype != p.o_dtype ||
      p.lse.data == nullptr)
    return Status::Ok();
  const bool bf16 = std::is_same_v<Element, Bfloat16>;
  Sm90BwdMaps maps;
  if (!EncodeLaunchTensorMap(&maps.q, p, p.q, true, p.head_dim_qk, Tile::kBlockM, bf16) ||
      !EncodeLaunchTensorMap(&maps.d_o, p, p.d_o, true, p.head_dim_v, Tile::kBlockM, bf16) ||
      !EncodeLaunchTensorMap(&maps.k, p, p.k, false, p.head_dim_qk, Tile::kBlockN, bf16) ||
      !EncodeLaunchTensorMap(&maps.v, p, p.v, false, p.head_dim_v, Tile::kBlockN, bf16))
    return Status::Ok();
  const int n_tiles = (p.max_seqlen_kv + Tile::kBlockN - 1) / Tile::kBlockN;
  const int64_t blocks = int64_t{n_tiles} * p.heads_kv * p.batch;
  if (blocks > INT_MAX) return Status::Ok();
  // THD: the heavy-first schedule of the key tiles (schedule.h). The plain grid's blocks past a
  // sequence's keys write nothing there (ZeroKeyBlockGradients stops at len_kv for THD), so
  // leaving them out changes no output.
  FlashParams run = p;
  run.schedule = nullptr;
  if (p.thd && p.schedule_workspace != nullptr) {
    bool scheduled = false;
    FUSEDATTN_RETURN_IF_ERROR(
        LaunchTileSchedule(p, /*by_keys=*/true, Tile::kBlockN, n_tiles, stream, &scheduled));
    if (scheduled) run.schedule = p.schedule_workspace;
  }
  auto kernel = WgmmaBackwardKernel<Element, kHeadDim, kScores, false, kDeterministic>;
  if constexpr (kScores == Sm90Scores::kSoftcapAlibi)
    if (p.softcap > 0.f)
      kernel = WgmmaBackwardKernel<Element, kHeadDim, kScores, true, kDeterministic>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Tile::kSmemBytes));
  if constexpr (kDeterministic)  // the ticket counter and the flags start at zero every call
    FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(
        p.dq_order, 0,
        static_cast<size_t>(DqOrderInts(p.batch, p.heads_q, p.max_seqlen_q)) * sizeof(int32_t),
        stream));
  kernel<<<static_cast<unsigned>(blocks), Tile::kThreads, Tile::kSmemBytes, stream>>>(maps, run,
                                                                                    n_tiles);
  *launched = true;
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace fusedattn::flash
