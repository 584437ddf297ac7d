#include "select/measured_speed.h"

#include <cmath>

#include "common/status.h"
#include "select/measured_speed_table.inc"  // FUSEDATTN_MEASURED_SPEED_{ROWS,SOURCE}

namespace fusedattn {

namespace {

// Why the table cannot speak for this problem (the measured kernels are the plain dense ones),
// or nullptr when it may.
const char* OutsideTheTable(const Problem& p) {
  const fusedattn_config& c = p.config;
  if (p.thd) return "packed THD";
  if (p.paged) return "paged K/V";
  if (p.padding) return "per-sequence lengths";
  if (c.bias_type != FUSEDATTN_BIAS_NONE) return "a bias or ALiBi";
  if (c.softmax_type != FUSEDATTN_SOFTMAX_VANILLA) return "an extra softmax logit";
  if (p.has_softcap()) return "softcap";
  if (p.has_dropout()) return "dropout";
  if (p.has_score_mod()) return "a score modifier";
  if (p.window_left >= 0 || (p.window_right >= 0 && !p.causal)) return "a window";
  if (c.deterministic && c.is_training) return "deterministic mode";
  if (c.head_dim_qk != c.head_dim_v) return "head_dim_qk != head_dim_v";
  if (c.qkv_dtype != c.o_dtype) return "mixed dtypes";
  return nullptr;
}

}  // namespace

SpeedOrder OrderByMeasuredSpeed(const Problem& p, int sm, bool training,
                                const std::vector<MeasuredSpeed>& table, const char* source) {
  SpeedOrder order;
  if (p.paged) {
    // Measured side by side on an H200 (bench/results/decode-paged-cudnn-nvidia-h200-2026-11-28,
    // decode_bench --quick: sq 1, bf16 d128 GQA 32/8, b 1..128, skv 512..131072, pages of 16
    // and 64): cuDNN's paged SDPA forward moved 1.13-1.52x the bytes per second of flash's paged
    // decode kernel at all ten points. Chunked prefill (more than one query row) against a paged
    // cache has not been timed on cuDNN: flash's Hopper forward stays first there.
    if (sm == 90 && p.config.max_seqlen_q == 1) {
      order.measured = true;
      order.basis = "measured cudnn faster: paged decode (one query row), cuDNN's paged SDPA "
                    "forward 1.13-1.52x flash's decode kernel in GB/s at sm_90 bfloat16 d128 "
                    "GQA, pages 16/64 (decode-paged-cudnn-nvidia-h200-2026-11-28)";
      return order;
    }
    order.flash_first = true;
    order.basis = "flash first for paged K/V (chunked prefill, or decode on a GPU other than "
                  "sm_90): cuDNN's paged SDPA forward is the second backend there, not timed "
                  "against flash's kernels on such problems yet";
    return order;
  }
  if (const char* why = OutsideTheTable(p)) {
    order.basis = Format("default order: no measured speed for problems with %s", why);
    return order;
  }
  const fusedattn_config& c = p.config;
  const bool gqa = c.heads_q > c.heads_kv;
  const double lq = std::log2(static_cast<double>(c.max_seqlen_q > 0 ? c.max_seqlen_q : 1));
  const double lkv = std::log2(static_cast<double>(c.max_seqlen_kv > 0 ? c.max_seqlen_kv : 1));
  const MeasuredSpeed* best = nullptr;
  double best_distance = 0;
  for (const MeasuredSpeed& e : table) {
    if (e.sm != sm || e.dtype != c.qkv_dtype || e.head_dim != c.head_dim_qk ||
        e.causal != p.causal || e.gqa != gqa || e.training != training)
      continue;
    const double le = std::log2(static_cast<double>(e.seqlen));
    const double dq = std::fabs(le - lq), dkv = std::fabs(le - lkv);
    if (dq > 1.0 || dkv > 1.0) continue;  // more than an octave away: not this problem's class
    if (!best || dq + dkv < best_distance) best = &e, best_distance = dq + dkv;
  }
  const char* direction = training ? "forward+backward" : "forward";
  if (!best) {
    order.basis = Format(
        "default order: no measured speed for sm_%d %s d%lld%s%s %s near seqlen %lld/%lld", sm,
        DtypeName(c.qkv_dtype), (long long)c.head_dim_qk, p.causal ? " causal" : "",
        gqa ? " GQA" : "", direction, (long long)c.max_seqlen_q, (long long)c.max_seqlen_kv);
    return order;
  }
  order.measured = true;
  order.flash_first = best->flash_tflops > best->cudnn_tflops;
  order.basis = Format(
      "measured %s: cudnn %.0f, flash %.0f TFLOP/s %s at sm_%d %s d%d%s%s s%lld (%s)",
      order.flash_first ? "flash faster" : "cudnn faster", best->cudnn_tflops,
      best->flash_tflops, direction, sm, DtypeName(best->dtype), best->head_dim,
      best->causal ? " causal" : "", best->gqa ? " GQA" : "", (long long)best->seqlen, source);
  return order;
}

SpeedOrder OrderByMeasuredSpeed(const Problem& problem, int sm, bool training) {
  return OrderByMeasuredSpeed(problem, sm, training, MeasuredSpeedTable(),
                              MeasuredSpeedSource());
}

const std::vector<MeasuredSpeed>& MeasuredSpeedTable() {
  static const std::vector<MeasuredSpeed> table = {FUSEDATTN_MEASURED_SPEED_ROWS};
  return table;
}

const char* MeasuredSpeedSource() { return FUSEDATTN_MEASURED_SPEED_SOURCE; }

}  // namespace fusedattn
