// Recognizes mask_mods that are a diagonal band: a conjunction of comparisons between the key
// index and the query index (optionally aligned bottom-right, q_idx + sk - sq) plus constants,
// e.g. kv_idx <= q_idx (causal), q_idx - kv_idx < W, kv_idx - q_idx <= W. A backend with a native
// band (cuDNN's diagonal alignment and bounds, a tiled kernel's loop limits) can then skip whole
// tiles instead of evaluating the mask per element. Anything else is not a band and must be
// evaluated as written; the recognizer never guesses.
#pragma once

#include <cstdint>

#include "common/band.h"
#include "flex/score_mod.h"

namespace fusedattn::flex {

// The keys j visible to query i are d - left <= j <= d + right, d = i (top-left) or
// i + sk - sq (bottom-right); -1 = unbounded on that side: fusedattn.h's window rule, the band of
// common/band.h.
using MaskBand = Band;

// True (with the band) when the program's mask output is exactly a band as above: every
// comparison relates kv_idx to one diagonal (all top-left or all bottom-right) with a bound
// that is a number >= 0 (an empty or strictly-off-diagonal band has no unbounded-free form in
// the window rule, so it is left to the general path). Comparisons that reach neither index, an
// OR, NOT, EQ/NE, tensors, batch/head or the score make it not a band.
bool RecognizeBandMask(const Program& program, MaskBand* band);

// True when the program changes nothing but visibility (no score output, or the score s
// itself), so that a backend may replace the whole graph with a native band.
bool IsMaskOnly(const Program& program);

}  // namespace fusedattn::flex
