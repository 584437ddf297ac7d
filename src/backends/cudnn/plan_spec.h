// The cuDNN backend's planning, in plain C++ (no CUDA, no cuDNN): which problems it refuses up
// front and why, the exact SDPA graph a problem and its tensors need (SdpaGraphSpec), the plan
// cache key, the layout of our own scratch memory and which fix-ups a call needs. Everything
// here is a pure function of the problem and the tensor views, so it is unit-tested on the CPU
// (tests/cpu/cudnn_plan_test.cpp); cudnn_backend.cpp runs it, sdpa_graph.cpp turns a spec into
// a cudnn-frontend graph.
//
// How strides enter (the design choice of issue 3): a cuDNN graph bakes in every tensor's
// strides, but check() sees only the problem. So
//   * check() builds the graphs for the canonical strides of the problem's formats (contiguous
//     BSHD/SBHD/BHSD/THD, bias [bias_batch, bias_heads, sq, skv] in qkv_dtype) and refuses the
//     problem when cuDNN refuses those graphs;
//   * the LSE never changes the graph: cuDNN always reads/writes packed [batch, heads, seqlen_q]
//     stats, the caller's LSE directly when it is laid out so, else through our scratch and a
//     small copy kernel (which also writes -inf for rows that see no key);
//   * forward()/backward() build the spec from the actual tensor views; the key is the whole
//     spec, so tensors with the canonical strides hit the graph check() built, and others
//     (interleaved QKV, padded rows, a float32 bias, ...) build and cache their own graph on
//     first use;
//   * what cuDNN cannot take at all for a particular call (a misaligned pointer or stride, a
//     head-dim stride != 1, THD offsets beyond int32, a plan for the caller's strides that needs
//     more workspace than was given) is known only at run time: forward()/backward() answer
//     NotSupported naming the tensor, and selection gives the call to the next backend that
//     accepts the problem (select.h, RunForward), or reports every reason.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/band.h"
#include "common/status.h"
#include "flex/score_mod.h"
#include "problem/problem.h"

namespace fusedattn::cudnn {

// Up-front refusals that need neither a device nor cuDNN: features cuDNN's SDPA does not have.
// Each reason names the field and value, and the backend that runs it instead.
Status PreCheck(const Problem& problem);

// Paged K/V (problem.paged; fusedattn.h "Paged K/V") runs through cuDNN's paged SDPA forward:
// K and V are cuDNN's "containers" (the caller's pools, dims [num_pages, heads_kv, page_size, d]
// with the pools' strides), read through int32 page tables [batch, 1, table_pages, 1] with
// cuDNN's padding mask on (per-sequence lengths for Q and KV are required next to paged caches;
// cudnn-frontend sdpa_support_surface.h). PreCheck refuses what cuDNN cannot take with paged
// caches; these are the limits that depend on the cuDNN loaded: paged caches from 9.5.0
// (cudnn-frontend's own check), ragged (THD) queries next to them from 9.8.0 (the frontend lets
// 9.7 through; its paged prefill sample runs from 9.8.0).
constexpr int64_t kMinPagedCudnn = 90500;
constexpr int64_t kMinPagedRaggedCudnn = 90800;
// Why the loaded cuDNN (cudnnGetVersion()) cannot run this paged problem, or OK (also for a
// problem that is not paged).
Status PagedVersionRefusal(const Problem& problem, int64_t cudnn_version);

// The page-table width a paged graph reads: ceil(seqlen_kv / page_size) entries per sequence,
// exactly (cudnn-frontend's paged cache load refuses another width unless the table is packed
// with ragged offsets).
int64_t TablePages(int64_t seqlen_kv, int64_t page_size);

// Entry k of a sequence's row of the page table cuDNN reads, which the prepare kernel writes
// (kernels.h PrepareParams) from `row`, the caller's row of that sequence; len_kv is its key
// count (clamped to max_seqlen_kv, so that the entries read are in the caller's row). Only the
// used entries (ceil(len_kv / page_size) of them) are read:
//   k < used: the caller's entry when it is a page of the pool [0, num_pages), else page 0 (an
//     index outside the pool is never followed; that sequence's results are undefined);
//   k >= used: the sequence's last used page (page 0 when it has none, and then nothing is
//     read), since cuDNN's engine may read every page the table names and mask the keys past
//     the length (cudnn-frontend's paged tests say so of its backend engine): it reads only pages
//     this sequence is on, never what the caller's unused entries hold (-1, anything).
FUSEDATTN_BAND_HD int32_t TablePage(const int32_t* row, int64_t k, int64_t len_kv,
                                    int64_t page_size, int64_t num_pages) {
  const int64_t used = (len_kv + page_size - 1) / page_size;
  if (used <= 0) return 0;
  const int32_t given = row[k < used ? k : used - 1];
  return given >= 0 && int64_t{given} < num_pages ? given : 0;
}

// The pool check() plans a paged problem for: every sequence its own pages, batch * table_pages
// of them (a call whose pool has another number of pages builds its own plan at its first call:
// the pool's extent is part of the graph).
int64_t CanonicalNumPages(const Problem& problem);

// Score modifiers (issue 6). cudnn-frontend applies its score-modifier callback right after
// attn_scale, before its bias, ALiBi, padding and band masks, and refuses those masks next to
// a callback ("Attention score mod enabled and hence other subgraphs are disabled"). Its
// backward callback receives dS (the gradient of the modified score, after dropout) and
// returns the gradient of the score it was given, before attn_scale; tensors made by the
// forward callback may be read there (the forward runs again inside the backward graph). So a
// problem's score_mod reaches cuDNN one of two ways:
enum class ScoreModPath {
  kNone,
  // The graph only hides keys (no score output, no tensor gradient), by a band
  // (flex/band_mask.h) that combines with the config's mask into one band: the problem runs as
  // a plain problem with that band, and cuDNN skips the tiles outside it.
  kNativeBand,
  // Everything else: the callbacks evaluate the graph per element, and with it the config's
  // band and padding, which cuDNN's masks cannot do next to a callback (no tile is skipped).
  kCallback,
};
ScoreModPath ScoreModPathOf(const Problem& problem);

// The problem cuDNN runs: the problem itself; on the native-band path the problem without its
// score_mod and with the combined band; and for THD (without a bias or score_mod tensor,
// dropout or callbacks) max_seqlen_q / max_seqlen_kv rounded up to ThdSeqlenBucket, for paged
// K/V (the same conditions) max_seqlen_kv so rounded (and max_seqlen_q too for THD queries).
// check(), the workspace sizes, forward and backward all plan from it, so a band mask_mod and the
// equal config mask share one plan, and so do THD batches whose longest sequences fall in one
// bucket and decode steps whose longest cache does.
Problem EffectiveProblem(const Problem& problem);
// The same without a copy when the problem is its own effective problem (the per-call path):
// the problem itself, or the changed one written into *storage.
const Problem& EffectiveProblem(const Problem& problem, Problem* storage);

// The sequence extent of a THD graph for a longest sequence of n: n up to 16, then up to 64 in
// steps of 16, then four steps per octave (at most a quarter more rows than n). A serving batch's
// longest sequence changes every batch; a graph per bucket, not per length, is built. The rows
// past a sequence's length are never written nor used (cuDNN reads the lengths from tensors), so
// the extent only sizes the grid (the extra tiles exit at once), cuDNN's workspace and our staged
// LSE.
int64_t ThdSeqlenBucket(int64_t n);

// At most this many score_mod tensors reach one cuDNN graph (each is one more graph input).
constexpr int kMaxScoreModTensors = 8;

// The band of the problem's mask (our semantics, common/band.h).
Band BandOf(const Problem& problem);

// A 4-d tensor as cuDNN sees it: dims (B, H, S, D) and strides in elements.
struct TensorDesc {
  int64_t dim[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
};

enum class Direction : int64_t { kForward = 0, kBackward = 1 };

// Everything a cuDNN SDPA graph depends on. Two calls share a graph iff their specs are equal.
struct SdpaGraphSpec {
  Direction direction = Direction::kForward;
  fusedattn_dtype io_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  // The graph's batch: the problem's batch, or for THD a power-of-two capacity so that batch
  // sizes in one bucket share the graph (unused entries get length 0).
  int64_t batch = 0;
  int64_t heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_kv = 0, head_dim_qk = 0, head_dim_v = 0;
  bool ragged = false;  // THD: every q/k/v-like tensor carries ragged offsets (in elements)
  TensorDesc q, k, v, o;          // o: output of the forward, input of the backward
  TensorDesc d_o, dq, dk, dv;     // backward only
  bool stats = false;             // forward: write LSE; backward: always (input)
  int64_t stats_stride[4] = {0, 0, 0, 0};  // dims (batch, heads_q, seqlen_q, 1)
  bool padding = false;           // seq_len_q / seq_len_kv tensors [batch]
  bool has_left_bound = false;    // cuDNN left bound = window_left + 1 (keys j > d - bound)
  int64_t left_bound = 0;
  bool has_right_bound = false;   // cuDNN right bound = window_right (keys j <= d + bound)
  int64_t right_bound = 0;
  bool bottom_right = false;      // cuDNN diagonal alignment
  bool bias = false;              // post-scale bias
  fusedattn_dtype bias_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  TensorDesc bias_desc;           // dims (bias_batch, bias_heads, seqlen_q, seqlen_kv)
  bool dbias = false;             // backward: bias gradient, same dims, dtype bias_dtype
  TensorDesc dbias_desc;
  bool sink = false;              // forward: per-head extra logit [1, heads_q, 1, 1] float32
  float attn_scale = 1.0f;
  float dropout = 0.0f;           // 0: none; cuDNN's Philox with seed/offset passed by value
  bool deterministic = false;     // backward
  // FP8 attention (problem.fp8; fusedattn.h "FP8 attention"): io_dtype is fp8_e4m3 (q, k, v)
  // and the graph is cudnn-frontend's sdpa_fp8 / sdpa_fp8_backward, whose per-tensor scaling
  // factors and amax outputs are float32 [1, 1, 1, 1] graph tensors at the caller's pointers
  // (a factor the problem does not read, as scale_o for a bfloat16 O, is the constant 1).
  bool fp8 = false;
  fusedattn_dtype o_dtype = FUSEDATTN_DTYPE_BFLOAT16;     // fp8: O (forward output, bwd input)
  fusedattn_dtype do_dtype = FUSEDATTN_DTYPE_BFLOAT16;    // fp8 backward: dO, and dP's type
  fusedattn_dtype dqkv_dtype = FUSEDATTN_DTYPE_BFLOAT16;  // fp8 backward: dQ, dK, dV
  // Score modifier (ScoreModPath::kCallback; null otherwise). The callbacks also evaluate the
  // config's band (mod_band, -1 = unbounded) and, with padding, the per-sequence lengths read
  // from int32 [batch] tensors (mod_seq_lens; else the lengths are max_seqlen); cuDNN's own
  // padding and band attributes stay off.
  std::shared_ptr<const flex::ScoreMod> score_mod;
  Band mod_band;
  bool mod_seq_lens = false;
  struct Aux {
    fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
    TensorDesc desc;  // dims (batch | 1, heads_q | 1, seqlen_q | 1, seqlen_kv | 1)
  };
  std::vector<Aux> aux;  // the score_mod tensors, in declaration order
  // Paged K/V (forward only): k and v are the pools, dims (num_pages, heads_kv, page_size, d)
  // with the caller's strides (never ragged, also under THD queries); key j of sequence b is
  // token j % page_size of page table[b][j / page_size], the table int32 [batch, 1, table_pages,
  // 1] (packed) that the prepare kernel writes for K and V alike; padding is always on (the key
  // lengths), and seqlen_kv is cuDNN's max_seq_len_kv.
  bool paged = false;
  int64_t page_size = 0;
  int64_t num_pages = 0;    // the pools' extent
  int64_t table_pages = 0;  // TablePages(seqlen_kv, page_size)
};

// The device and library a plan is built for.
struct DeviceInfo {
  int ordinal = 0;
  int compute_capability = 0;   // major * 10 + minor
  int64_t cudnn_version = 0;    // cudnnGetVersion() at run time
};

// The plan cache key: the spec and the device, as words, and the score_mod by its structure
// (ScoreModKey: equal graphs built twice share a plan, different ones never do; its tensors'
// dtypes and layouts are words).
struct PlanKey {
  static constexpr size_t kWords = 256;
  std::array<int64_t, kWords> words{};
  size_t used = 0;  // words written (at most kWords; a test checks the largest key fits)
  size_t hash = 0;
  flex::ScoreModKey score_mod;
  // Words past `used` are zero, so comparing the used ones is comparing all (a warm call's
  // lookup compares ~100 words, not 256).
  bool operator==(const PlanKey& other) const {
    return used == other.used &&
           std::equal(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(Used()),
                      other.words.begin()) &&
           score_mod == other.score_mod;
  }
  size_t Used() const { return used < kWords ? used : kWords; }
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const { return key.hash; }
};
PlanKey MakePlanKey(const SdpaGraphSpec& spec, const DeviceInfo& device);

// The structure of a spec: everything but its shape (batch, sequence lengths, and the tensor
// extents and strides that follow from them), plus the device. The graphs of one structure share
// a cuDNN kernel cache (cudnn_backend.cpp): cuDNN itself decides which compiled kernel a graph of
// a new shape can reuse, so this key only groups the graphs whose kernels are worth sharing.
// Tensor layouts enter as the order of their strides and which axes are dense over the next one
// (so padded rows are another structure), extents as heads and head dims.
PlanKey MakeStructureKey(const SdpaGraphSpec& spec, const DeviceInfo& device);

// Why a spec is built per shape even when dynamic shapes are on, or OK. (A score_mod's callbacks
// write the sequence lengths into the graph as constants, which a kernel compiled for another
// shape would keep; a paged graph's page-table width and max_seq_len_kv are graph attributes
// that no execute-time shape carries.)
Status DynamicShapeRefusal(const SdpaGraphSpec& spec);

// FUSEDATTN_CUDNN_DYNAMIC_SHAPES. Plans are per shape unless it asks for dynamic shapes, which
// are experimental: on cuDNN 9.19 (H100, 2026-11-24) the plans a structure's kernel cache gave
// for a second shape computed the first shape (README.md, "Dynamic shapes: status").
//   unset, "", 0 / off / false / no, anything else  per-shape plans (the default)
//   1 / on / true / yes   dynamic-shape graphs with the structure's kernel cache, executed with
//                         each tensor's shape and strides passed at execution (cuDNN >= 9.18)
//   no-override           the same without execute-time shapes, exactly what failed on
//                         2026-11-24 (cuDNN >= 9.5); kept to reproduce that failure
enum class DynamicShapesMode { kOff, kOn, kOnWithoutOverrides };
struct DynamicShapesSetting {
  DynamicShapesMode mode = DynamicShapesMode::kOff;
  std::string off_reason;  // mode kOff: why plans are per shape (for the diagnostic)
};
// value: the variable's value, null when unset; cudnn_version: cudnnGetVersion() at run time.
DynamicShapesSetting ParseDynamicShapes(const char* value, int64_t cudnn_version);
// What the diagnostic adds when a plan was built with dynamic shapes.
extern const char* const kDynamicShapesWarning;
constexpr int64_t kMinDynamicShapesCudnn = 90500;        // a kernel cache bound to an op graph
constexpr int64_t kMinExecuteTimeShapesCudnn = 91800;    // variant-pack shape overrides

// What a compiled kernel depends on besides its structure: the on-disk cache's key holds all of
// it, so a file written for another GPU, driver, cuDNN or fusedattn is never read.
struct MachineIdentity {
  std::string gpu_name;
  std::string gpu_uuid;        // hex, distinguishes boards of one model
  int sm_count = 0;
  int compute_capability = 0;  // major * 10 + minor
  int driver_version = 0;      // cudaDriverGetVersion
  int64_t cudnn_version = 0;   // cudnnGetVersion at run time
  int frontend_version = 0;    // cudnn-frontend, compiled in
  std::string fusedattn_version;
};
// The on-disk cache key of a structure's kernel cache (readable text: the identity, then the
// structure's words in hex). Specs of one structure on one machine share it.
std::string KernelCacheDiskKey(const SdpaGraphSpec& spec, const MachineIdentity& machine);

// The on-disk plan store's key of a spec's per-shape plan (readable text: the identity without
// the board's uuid, then every word of the plan key but the device ordinal, then the score_mod's
// words).
std::string PlanDiskKey(const SdpaGraphSpec& spec, const MachineIdentity& machine);

// The graph batch (see SdpaGraphSpec::batch).
int64_t GraphBatch(const Problem& problem);

// ------------------------------------------------------------------------------------------------
// Batch chunks: a new batch size of a built problem without a new plan.
// ------------------------------------------------------------------------------------------------
// A graph bakes in its batch, and building one costs 100-160 ms (cuDNN 9.19, H100); cuDNN's
// dynamic shapes, which would avoid it, gave wrong results there (README.md "Dynamic shapes:
// status"). Sequences of a dense problem are independent, so a call of batch b can run as
// launches of plans already built for fewer sequences of the same tensors, each over its own
// slice of every tensor: b = 5 as the plans for 4 and 1. Where no sum of built batch sizes is b,
// the last chunk may start before the previous one ends (b = 7 as 2 + 2 + 2 + 2, the last over
// sequences 5 and 6): the overlapped sequences are computed twice and written twice, with the
// same values by the forward and by the backward with values either launch may produce. That
// costs device time, so it is allowed for at most an eighth of the batch (kMaxChunkWaste).
constexpr int kMaxBatchChunks = 8;     // the most launches a call makes (and scratch reserves)
constexpr int64_t kMaxChunkWaste = 8;  // sequences computed twice: at most batch / this
struct BatchChunks {
  int count = 0;                        // 0: one launch of a plan for the whole batch
  int64_t first[kMaxBatchChunks] = {};  // each chunk's first sequence
  int64_t batch[kMaxBatchChunks] = {};  // and its plan's batch
  // Where chunk i's per-sequence lengths start in the chunked layout the prepare kernel writes:
  // each chunk's array on a 16-byte boundary (cuDNN's alignment).
  FUSEDATTN_BAND_HD int64_t seq_len_offset(int i) const {
    int64_t at = 0;
    for (int j = 0; j < i; ++j) at += (batch[j] + 3) / 4 * 4;
    return at;
  }
};
// Chunks covering sequences [0, batch) with plans of the given batch sizes (each < batch,
// repeats allowed): fewest sequences computed twice (at most batch / kMaxChunkWaste), then fewest
// launches, at most max_chunks; the largest chunks first. count 0 when there is none.
BatchChunks ChooseBatchChunks(int64_t batch, const std::vector<int64_t>& plan_batches,
                              int max_chunks);

// Why calls of spec cannot run in batch chunks at all, or OK: THD (its plans already serve every
// batch size up to a power of two, and sequences are placed by ragged offsets), dropout (cuDNN
// numbers its random stream over the whole batch), a score_mod on cuDNN's callbacks (it may read
// the batch index), a bias gradient summed over the batch, paged K/V (a chunk's keys are found
// through its rows of the page table, which the chunks' pointers do not move).
Status BatchChunkRefusal(const SdpaGraphSpec& spec);
// Why these chunks cannot run: a chunk's slice of a tensor would start off cuDNN's 16-byte
// alignment (LSE rows of heads * seqlen_q floats not a multiple of 4, say); or OK.
Status BatchChunkAlignment(const SdpaGraphSpec& spec, const BatchChunks& chunks);

// spec with its batch (and every batch extent but a broadcast bias's and a page pool's) set to
// batch; strides stay: the spec a plan for `batch` sequences of the same tensors has.
SdpaGraphSpec WithBatch(const SdpaGraphSpec& spec, int64_t batch);

// Bytes from one sequence to the next in each tensor a graph reads or writes (0 for a tensor
// without a batch axis: a broadcast bias, the sink), for a chunk's pointers.
struct SequenceBytes {
  int64_t q = 0, k = 0, v = 0, o = 0, d_o = 0, dq = 0, dk = 0, dv = 0;
  int64_t stats = 0, bias = 0, dbias = 0;
};
SequenceBytes SequenceBytesOf(const SdpaGraphSpec& spec);

// FUSEDATTN_CUDNN_BATCH_CHUNKS: the most launches a call may make instead of building a plan of
// its own (default and maximum kMaxBatchChunks; 0 or 1 turns batch chunks off). value: the
// variable's value, null when unset. *off_reason says why, when off.
int ParseMaxBatchChunks(const char* value, std::string* off_reason);

// ------------------------------------------------------------------------------------------------
// Sequence-length route: a new sequence length of a built dense problem without a new plan.
// ------------------------------------------------------------------------------------------------
// A graph bakes in its sequence lengths too. A BSHD tensor holds sequence b as a block of rows
// starting b * stride_b elements in, with the token and head strides of a THD tensor: it is the
// memory of a THD tensor whose ragged offsets are b * stride_b. So a dense BSHD call can run
// through the ragged (THD) plan of the same tensors built for a batch and sequence extents at
// least its own, with cuDNN's padding mask giving each sequence the call's lengths (its
// max_seqlen, or cu_seqlens under a padding mask) and the graph entries past its batch empty:
// exactly a THD call whose sequences are packed without gaps, which this backend runs anyway.
// That plan's extents are powers of two (RouteExtentsOf), so one plan serves every length up to
// its extents. README.md "Sequence-length route" has the policy (when such a plan is built, when
// a call uses it) and what it costs.
struct RouteExtents {
  int64_t batch = 0;                    // the ragged graph's batch (a power of two)
  int64_t seqlen_q = 0, seqlen_kv = 0;  // its sequence extents
  bool operator==(const RouteExtents& o) const {
    return batch == o.batch && seqlen_q == o.seqlen_q && seqlen_kv == o.seqlen_kv;
  }
};
// A ragged plan built for a call has the extents of RouteExtentsOf: the batch and each length
// rounded up to a power of two (lengths to at least kMinRouteSeqlen).
constexpr int64_t kMinRouteSeqlen = 16;
int64_t RouteSeqlenExtent(int64_t seqlen);
RouteExtents RouteExtentsOf(const Problem& problem);
// The ragged plans a call may run through, cheapest first: its own extents and, on each of the
// three axes, the next power of two (at most 4x the call's rows on an axis, so that the tiles and
// workspace a graph sizes by its extents stay within a small factor of the call's); those whose
// ragged offsets fit int32 (cuDNN's) only.
std::vector<RouteExtents> RouteCandidates(const Problem& problem);

// Why calls of this dense problem, with the tensors of spec (its own plan's spec), cannot run
// through a ragged plan, or OK: THD (its plans already serve a bucket of lengths), formats other
// than BSHD (SBHD's sequence stride holds the batch, BHSD's head stride the sequence length),
// FP8, a score_mod on cuDNN's callbacks (they hold the lengths as graph constants), a bias tensor
// (the lengths are its dims), dropout (cuDNN numbers its random stream over the graph's extents:
// a routed forward and an exact backward would draw different masks), paged K/V (its keys are
// no ragged tensor; its plans already serve a bucket of longest caches), tensors whose sequences
// overlap, or ragged offsets beyond int32.
Status SeqlenRouteRefusal(const Problem& problem, const SdpaGraphSpec& spec);

// The THD form of a dense problem for the ragged plan of extents e: THD formats, a padding
// mask (the same band), batch e.batch and max_seqlen e.seqlen_q / e.seqlen_kv. ForwardSpec /
// BackwardSpec of it with the dense call's own views (a ragged spec reads their token and head
// strides only) is the ragged plan's spec; its call plans and scratch are the routed call's.
Problem RoutedProblem(const Problem& problem, const RouteExtents& e);

// The elements from one sequence's first row to the next's in a dense tensor run through a
// ragged plan: its batch stride (a batch of one: its rows), the step of its ragged offsets.
int64_t RouteSequenceStep(const TensorView& view, int64_t batch, int64_t seqlen);

// FUSEDATTN_CUDNN_SEQLEN_ROUTE (value: the variable's value, null when unset).
//   unset, "", 1 / on / true / yes   on (the default): a call of a new length runs through a built
//                                    ragged plan that covers it; a length that builds its own
//                                    plans builds the ragged plans of its extents with them once
//                                    its structure has had another length
//   eager                            those ragged plans also with a structure's first plans, so
//                                    that its first new length builds nothing either
//   0 / off / false / no             off: every length builds plans of its own
// Anything else is off, and *off_reason says why (also for off).
enum class SeqlenRouteMode { kOff, kOn, kEager };
SeqlenRouteMode ParseSeqlenRoute(const char* value, std::string* off_reason);

// Background builds (README.md "Background builds"): under automatic selection, the plans of a
// new shape of a structure built before (a batch size no chunks cover, a sequence length no
// ragged plan covers, a new THD bucket) are built on a worker thread while the calls run on the
// next backend that accepts the problem (Backend::check_or_defer). FUSEDATTN_CUDNN_BACKGROUND_BUILD
// (value: the variable's value, null when unset): unset, 1/on/true/yes: on (the default); 0/off/
// false/no: off, with *off_reason saying so; anything else: off, with *off_reason naming it.
bool ParseBackgroundBuild(const char* value, std::string* off_reason);
// Why a problem's plans are built in the call even when background builds are on, or Ok:
// deterministic problems (which backend runs one must not depend on a thread's timing), dropout
// (a forward and its backward must draw the same mask, so both run on one backend) and score_mod
// graphs (the next backend, flash, may compile one for longer than cuDNN builds).
Status BackgroundBuildRefusal(const Problem& problem);

// Canonical (contiguous) views of every tensor of a problem, the ones check() plans for. Data
// pointers are null.
FwdTensors CanonicalFwdTensors(const Problem& problem);
BwdTensors CanonicalBwdTensors(const Problem& problem);

// What a call does besides running the graph. All decided from the problem and the LSE view.
struct CallPlan {
  bool padding = false;        // per-sequence lengths (padding masks, THD: cu_seqlens; paged
                               // K/V: seqlens_kv, and cu_seqlens_q or max_seqlen_q)
  bool const_lengths = false;  // seq lens all max_seqlen (to reach cuDNN's padded kernels)
  bool prep = false;           // a prepare kernel writes seq lens / ragged offsets / staging
  bool stage_stats = false;    // LSE goes through our scratch (forward: out, backward: in), so
                               // the graph always has packed [batch, heads, seqlen_q] stats
  bool fixup = false;          // a kernel writes our semantics for empty rows / unseen keys
  bool fixup_dbias = false;    // zero dbias where no sequence sees (i, j)
  bool stage_sink = false;     // the forward's sink: the caller's logits copied contiguous (when
                               // strided), or zeros for the off-by-one softmax
  bool dsink = false;          // learnable sink: our kernel computes dsink
  bool empty_by_stats = false; // forward: rows whose staged stats show no visible key (a
                               // score_mod hid them all) are written as empty rows
  bool page_table = false;     // paged K/V: the prepare kernel writes the table cuDNN reads
};
CallPlan ForwardCallPlan(const Problem& problem, const FwdTensors& tensors);
CallPlan BackwardCallPlan(const Problem& problem, const BwdTensors& tensors);

// The spec of a call. The views may be the canonical ones (check) or the caller's.
SdpaGraphSpec ForwardSpec(const Problem& problem, const FwdTensors& tensors);
SdpaGraphSpec BackwardSpec(const Problem& problem, const BwdTensors& tensors);

// Our scratch memory inside the workspace: byte offsets from the scratch base, kNone if absent.
enum RaggedSlot { kRaggedQ, kRaggedK, kRaggedV, kRaggedO, kRaggedDO, kRaggedDQ, kRaggedDK,
                  kRaggedDV, kRaggedSlots };
struct Scratch {
  static constexpr size_t kNone = ~size_t{0};
  // int32 [graph batch], or for a chunked call one array per chunk (BatchChunks); room
  // for either is reserved.
  size_t seq_len_q = kNone, seq_len_kv = kNone;
  size_t ragged[kRaggedSlots] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};
  size_t stats = kNone;           // float32 [graph batch, heads_q, seqlen_q]
  size_t sink = kNone;            // float32 [heads_q]
  size_t dsink_partials = kNone;  // float32 [kDsinkChunks, heads_q]
  size_t dsink_done = kNone;      // uint32: dsink blocks finished (zeroed by the prepare kernel)
  size_t page_table = kNone;      // int32 [graph batch, table_pages] (paged K/V)
  size_t bytes = 0;
};
constexpr int kDsinkChunks = 64;
Scratch ForwardScratch(const Problem& problem, const CallPlan& call);
Scratch BackwardScratch(const Problem& problem, const CallPlan& call);

// Workspace = alignment slack + our scratch + cuDNN's workspace, each 256-byte aligned; 0 when
// neither needs any.
constexpr size_t kWorkspaceAlignment = 256;
size_t WorkspaceBytes(size_t scratch_bytes, int64_t cudnn_bytes);

// Run-time limits of cuDNN that no graph can lift, checked per call: the head-dim stride must be
// 1, other strides and data pointers 16-byte aligned, ragged offsets must fit int32. The message
// names the tensor.
Status CheckRuntimeLayout(const char* name, const TensorView& view, int64_t batch, int64_t heads,
                          int64_t seqlen, int64_t dim, bool ragged);

}  // namespace fusedattn::cudnn
