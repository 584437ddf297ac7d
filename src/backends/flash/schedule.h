// Heavy-first tile schedule of the Hopper kernels for THD problems (schedule.cu).
//
// The plain grid of a flash kernel is one block per (tile, head, sequence) with the tile count of
// the longest sequence: for packed sequences of uneven lengths most blocks are empty (they exit at
// once but still take a block slot each) and the longest sequence's tiles may come last and form
// a tail. The schedule lists the sequences by descending tile count, with the exclusive prefix
// sums of their tile counts, so that a kernel's block i takes entry i / heads of that list (head
// i % heads; device_common.cuh's ScheduledBlock): the heaviest sequences' tiles start first and the
// blocks past the last tile exit without touching anything.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/flash/params.h"
#include "common/status.h"

namespace fusedattn::flash {

// The most tile counts (max tiles + 1) the scheduling kernel sorts in shared memory; more (very
// long sequences) and the kernels keep the plain grid.
constexpr int kScheduleMaxBins = 12288;

// The tile rows the Hopper kernels' schedules count in, which the planner plans with:
// Sm90FwdTile::kBlockM query rows, Sm90BwdTile::kBlockN keys (the launchers static_assert it).
constexpr int kSm90ScheduleRowsForward = 128;
constexpr int kSm90ScheduleRowsBackward = 128;

// Bytes of a schedule of `batch` sequences: order[batch], then tile_start[batch + 1] (int32).
inline size_t ScheduleBytes(int64_t batch) {
  return static_cast<size_t>(2 * batch + 1) * sizeof(int32_t);
}

// Writes the schedule of p's sequences into p.schedule_workspace on `stream` (one block): tile
// count of sequence b = ceil(len / tile_rows) with len = LoadSeq(p, b).len_kv when by_keys (the
// backward's key tiles), else len_q (the forward's query tiles); max_tiles = ceil(max_seqlen /
// tile_rows) of that axis. order[] lists the sequences by descending tile count (ties in any
// order), tile_start[pos] = tiles of the sequences before position pos, tile_start[batch] = all
// tiles. Sets *scheduled = false and launches nothing when there is no workspace (the planner
// chose the plain grid); an internal error when batch < 1 or max_tiles + 1 > kScheduleMaxBins,
// which the planner (planner.cpp) rules out before it gives the workspace.
Status LaunchTileSchedule(const FlashParams& p, bool by_keys, int tile_rows, int max_tiles,
                          cudaStream_t stream, bool* scheduled);

}  // namespace fusedattn::flash
