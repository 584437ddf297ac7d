/*
 * fusedattn — fused scaled-dot-product attention, forward and backward.
 *
 * This header is the C API and the one source of truth for what fusedattn computes.
 *
 * ---------------------------------------------------------------------------------------------
 * What is computed (every backend computes exactly this; the reference backend is its oracle)
 * ---------------------------------------------------------------------------------------------
 * For each sequence b, query head h (kv head hk = h / (heads_q / heads_kv)), query position i and
 * key position j (positions count from 0 inside the sequence):
 *
 *   s = attn_scale * (q[b,i,h,:] . k[b,j,hk,:] + pre_bias[b,h,i,j])        pre_bias: PRE_SCALE only
 *   s = softcap * tanh(s / softcap)                                         when softcap > 0
 *   s = s + post_bias[b,h,i,j]                                              POST_SCALE only
 *   s = s - alibi_slope[h] * |i + sk - sq - j|                              ALIBI only
 *
 * where sq, sk are the sequence's own lengths (max_seqlen_q/kv unless a padding mask or THD gives
 * per-sequence lengths from cu_seqlens, or a paged K/V cache gives sk from seqlens_kv; see "Paged
 * K/V"). Key j is visible to query i when j < sk, i < sq and
 *
 *   j <= d + right  and  j >= d - left,     d = i                  (CAUSAL, PADDING_CAUSAL: top-left)
 *                                           d = i + sk - sq        (every other mask: bottom-right)
 *   left  = window_left  (or unbounded when -1)
 *   right = 0 for causal masks, else window_right (or unbounded when -1)
 *
 * Score modifiers (config.score_mod, a finalized graph; see "Score modifiers" below): after the
 * score pipeline and the mask above, for a key j that the mask shows to query i,
 *
 *   visible = mask_mod(b, h, i, j)                   the graph's mask output (true = visible)
 *   s = score_mod(s, b, h, i, j)                     the graph's score output
 *
 * where the graph reads that s, b, h, i, j, the sequence's lengths sq and sk, and auxiliary
 * tensors at (b, h, i, j) restricted to their axes. A key the mask_mod hides is as hidden as a
 * key the mask hides; everything below (softmax, LSE, max_logit, fully masked rows) uses the
 * modified s and visibility. A row whose visible keys all have s = -inf (with no extra logit)
 * is a fully masked row. The modified s must not be +inf or NaN. In the backward, dS (the
 * gradient of the modified s, below) becomes dS * d score_mod / d s for the pipeline above, and
 * an auxiliary tensor declared with requires_grad gets d_aux[e] = the sum, over the visible
 * (b, h, i, j) that read element e, of dS * d score_mod / d aux (0 for elements no visible key
 * reads). The derivative is the graph's explicit one where given, else derived symbolically.
 * The reference, flash and cuDNN backends run score modifiers; small_seq refuses them. flash
 * compiles the graph into its tensor-core kernels at run time (NVRTC): float16/bfloat16 with
 * o_dtype equal, head dims multiples of 8 up to 256, up to 8 tensors, GPUs of compute capability
 * 8.0 or newer; it refuses deterministic mode with a tensor that requires grad and a broadcast
 * bias gradient next to a graph. cuDNN refuses what it cannot combine with one (a tensor bias,
 * ALiBi, softcap, THD, max_logit, gradients of the graph's tensors). Each refusal names the
 * reason, and the reference backend runs every graph.
 *
 * The softmax over the visible keys is
 *   VANILLA:        p_j = exp(s_j) / sum_j' exp(s_j')
 *   OFF_BY_ONE:     p_j = exp(s_j) / (1 + sum_j' exp(s_j'))              (an extra logit fixed at 0)
 *   LEARNABLE_SINK: p_j = exp(s_j) / (exp(sink[h]) + sum_j' exp(s_j'))   (a learnable logit per head)
 * and LSE = log(denominator) (natural log, float32). Dropout keeps p_j with probability 1 - dropout
 * and scales kept values by 1 / (1 - dropout); o[b,i,h,:] = sum_j p'_j v[b,j,hk,:].
 *
 * A query row with no visible key has O = 0, LSE = -inf and contributes nothing to any gradient.
 * max_logit[h] is the largest final s (after bias, softcap, ALiBi and score_mod) of a visible key
 * over all sequences and rows of head h (the off-by-one or sink logit does not count); -inf if
 * head h sees no key at all.
 *
 * The backward differentiates the forward above using the O and LSE it is given, as
 * FlashAttention does: p = exp(s - LSE), D_i = dO_i . O_i, dS = p (dP - D); its gradients carry
 * the rounding of O and LSE. dbias is written in full: entries of hidden or padded (i, j) are 0, and
 * a broadcast dimension receives the sum over it. dsink[h] = -sum over rows of exp(sink[h] - LSE) D.
 *
 * Backends compute tanh, exp and log to their own accuracy; the one to know: flash's kernels on
 * float16/bfloat16 inputs take the softcap's tanh from the GPU's tanh.approx.f32 (relative error
 * up to about 2^-11, as FlashAttention's kernels do), so their s is within softcap * 2^-11 of the
 * formula above.
 *
 * Dropout mask: Philox4x32-10 with key (lo32(seed), hi32(seed)) and counter
 *   (j' / 4, row, lo32(offset), hi32(offset)),
 *   row = ((b + dropout_batch_offset) * H + h + dropout_head_offset) * R + i + dropout_row_offset,
 *   j'  = j + dropout_key_offset,   H = dropout_heads (0: heads_q),   R = dropout_rows
 *   (0: max_seqlen_q),
 * gives four 32-bit words; element j uses word j' % 4 (call it u). The element is kept when
 *   u >= threshold,  threshold = min(floor(dropout * 2^32), 2^32 - 1).
 * (b is the sequence index also for THD; i and j are positions inside the sequence.) The dropout_*
 * position fields are 0 by default, and then row = (b * heads_q + h) * max_seqlen_q + i and
 * j' = j. Otherwise they place the call in a larger problem, of H query heads and max_seqlen_q R,
 * whose mask the call draws: element (b, h, i, j) of the call draws the bit of element
 * (b + dropout_batch_offset, h + dropout_head_offset, i + dropout_row_offset,
 * j + dropout_key_offset) of that problem. (Context parallelism runs a block of the whole
 * sequence's queries and keys, or a group of its heads, as one call, and so draws the mask of
 * the single-device call.) Each position field is in [0, 2^31 - 1]; dropout_heads is 0 or
 * >= heads_q + dropout_head_offset, dropout_rows is 0 or >= max_seqlen_q + dropout_row_offset,
 * and dropout_key_offset is a multiple of 4 (keys are drawn in groups of four, and the call's
 * groups must be the larger problem's); anything else is INVALID_ARGUMENT naming the field,
 * whatever the dropout. Without dropout they change nothing. The row counter is 32 bits, so
 * (batch + dropout_batch_offset) * H * R <= 2^32 when dropout is on.
 *
 * Every backend that implements dropout this way reproduces the reference's mask bit for bit:
 * reference, flash and small_seq (flash and small_seq at the default positions only: they refuse
 * others, naming them, and the reference runs them). cuDNN draws from its own random stream
 * instead: the same keep probability and 1 / (1 - dropout) scaling, and one mask for a forward
 * and its backward with the same seed and offset, but not the reference's elements (force
 * another backend where the bits must match); it refuses positions other than the default.
 *
 * ---------------------------------------------------------------------------------------------
 * FP8 attention (per-tensor scaling, as Transformer Engine's FP8 DotProductAttention trains)
 * ---------------------------------------------------------------------------------------------
 * An FP8 problem has qkv_dtype = FP8_E4M3. Its dtypes:
 *   q, k, v     fp8_e4m3 (fp8_e5m2 q/k/v are refused)
 *   o           o_dtype: fp8_e4m3, bfloat16, float16 or float32
 *   dO          do_dtype: fp8_e4m3 or fp8_e5m2 (TE's E4M3 and hybrid recipes)
 *   dQ, dK, dV  dqkv_dtype: fp8_e4m3, fp8_e5m2, bfloat16, float16 or float32
 *   lse         float32 as always; bias, alibi, sinks, max_logit as always (float, unscaled)
 * do_dtype and dqkv_dtype are checked when the problem has a backward (is_training, or
 * fusedattn_bwd / fusedattn_bwd_workspace_size). A non-FP8 problem keeps the dtypes it always
 * had: do_dtype and dqkv_dtype must be DEFAULT or equal to o_dtype / qkv_dtype, and every FP8
 * scaling pointer below must be NULL.
 *
 * An FP8 tensor X holds X_fp8 = X * scale_X, so X = X_fp8 * descale_X. Every scaling factor is a
 * float32 scalar (a const float* / float* in fusedattn_fwd_args / fusedattn_bwd_args) in the
 * memory where the tensors live (device memory for config.device CUDA), read or written by the
 * call in stream order. The formulas of "What is computed" hold with these changes, where
 * Q8_T(x) is x rounded to the nearest value of the FP8 type T, ties to even, saturated to T's
 * largest finite value (448 for e4m3, 57344 for e5m2; NaN stays NaN): the hardware's
 * cvt.rn.satfinite. Everything between these points is exact in the specification (the
 * reference computes it in float64; GPU backends accumulate in float32):
 *
 * Forward:
 *   q, k, v     read as q_fp8 * descale_q, k_fp8 * descale_k, v_fp8 * descale_v
 *   p'          the probabilities after dropout (p_j, times 1 / (1 - dropout) or 0), as above
 *   amax_s      = max |p'| over every (b, h, i, j) (0 where nothing is visible)
 *   S           S_fp8 = Q8_e4m3(p' * scale_s)                     (the quantized softmax output)
 *   o           o = sum_j S_fp8[j] * descale_s * v[j]   (unrounded; fully masked rows: 0)
 *   amax_o      = max |o| over every element of O the call writes
 *   O stored    o_dtype FP8: Q8_o_dtype(o * scale_o);  else o rounded to o_dtype (no scale_o)
 *   lse         the LSE of the unquantized softmax, as above
 * Backward (O, dO FP8 or not as their dtypes say; LSE as given):
 *   o, dO       read as o_fp8 * descale_o (o_dtype FP8; else as stored), dO_fp8 * descale_do
 *   D_i         = dO_i . o_i
 *   p           = exp(s - LSE) recomputed in float64 from the descaled q, k; p' after dropout
 *   S           S_fp8 = Q8_e4m3(p' * scale_s)
 *   dV[j]       = sum_i S_fp8[i, j] * descale_s * dO_i         (summed over the group in GQA)
 *   dS          = p (dP - D) with dP = dO_i . v_j (times the dropout factor), as above
 *   dP          the gradient with respect to the product q . k: dS through score_mod and
 *               softcap, times attn_scale (what multiplies k in dQ and q in dK; TE's "dP")
 *   amax_dp     = max |dP| over every (b, h, i, j)
 *   dP_fp8      = Q8_do_dtype(dP * scale_dp)                     (quantized in dO's FP8 type)
 *   dQ[i]       = sum_j dP_fp8[i, j] * descale_dp * k_j
 *   dK[j]       = sum_i dP_fp8[i, j] * descale_dp * q_i      (summed over the group in GQA)
 *   amax_dq/dk/dv = max |dQ| / |dK| / |dV| over every element written (before scaling)
 *   dQ/dK/dV stored: dqkv_dtype FP8: Q8_dqkv_dtype(dX * scale_dX); else rounded (no scale_dX)
 *   dbias, dsink and score_mod gradients use the unquantized dS (they are not FP8 tensors).
 *
 * Scaling factors, fusedattn_fwd_args: descale_q, descale_k, descale_v, descale_s, scale_s (all
 * required), scale_o (required when o_dtype is FP8, else NULL); amax_s, amax_o (outputs,
 * required). fusedattn_bwd_args: descale_q, descale_k, descale_v, descale_do, descale_s,
 * descale_dp, scale_s, scale_dp (required), descale_o (required when o_dtype is FP8, else NULL),
 * scale_dq, scale_dk, scale_dv (required when dqkv_dtype is FP8, else NULL); amax_dp, amax_dq,
 * amax_dk, amax_dv (outputs, required). A pointer missing, or set where it is not read, is
 * INVALID_ARGUMENT naming it.
 *
 * Invalid scaling factors. Every factor read must be finite and > 0 (a NaN, an inf, 0 or a
 * negative value is an error). The check needs the values on the host:
 *   CPU tensors: always checked before anything is written: INVALID_ARGUMENT naming the factor
 *               and its value.
 *   CUDA tensors: by default checked the same way, by copying the factors to the host on the
 *               stream, which waits for the stream (a host synchronization per call: the cost of
 *               a clear error). FUSEDATTN_FP8_CHECK_SCALES=0 turns the check off so that calls
 *               stay asynchronous; an invalid factor then gives undefined outputs and amax (NaN
 *               or inf, typically) and no error. The reference backend always checks (it reads
 *               the factors anyway).
 *
 * Backends: the reference emulates every point above exactly and runs FP8 with every feature;
 * cuDNN runs FP8 problems through its FP8 SDPA graphs and names what it refuses; flash runs the
 * FP8 forward on its Hopper kernel (sm_90; head dims up to 128, multiples of 16; dense
 * BSHD/SBHD/BHSD; no mask, causal top-left or bottom-right, windows; GQA/MQA; o_dtype e4m3,
 * bfloat16, float16 or float32; the LSE) and refuses the FP8 backward and the other features,
 * naming them; small_seq refuses FP8 problems. AUTO asks cuDNN first for FP8 problems (no
 * measured order yet), then flash. GPU results differ from the reference's by float32 (and the
 * FP8 tensor cores') accumulation and, where a product lands near a rounding boundary of Q8, by
 * one FP8 step of that element (tests/gpu/fp8_check.h derives the bounds). flash quantizes S
 * during its online softmax, before the row's final maximum and sum are known: its element is
 * Q8_e4m3(exp(s - m') * c) / c * exp(m' - m) / l (m' the running maximum, m and l the row's final
 * maximum and sum of exponentials, c = scale_s), which is within the same u p + a / scale_s of p
 * as the specification's Q8_e4m3(p * scale_s) / scale_s: the two differ by at most one FP8 step,
 * within the bound above. Where scale_s > 448 (p * scale_s may then saturate), flash quantizes
 * with c = 448 and does not saturate: it differs from the specification exactly where
 * p * scale_s > 448, whose saturation it does not reproduce (scale_s <= 448 / amax_s of the
 * call's own S never gets there).
 *
 * ---------------------------------------------------------------------------------------------
 * Tensors
 * ---------------------------------------------------------------------------------------------
 * Every tensor is a pointer, a dtype, a shape and strides in elements; nothing is assumed
 * contiguous. Shapes by format (s = max_seqlen_q or max_seqlen_kv, d = head_dim_qk or head_dim_v):
 *   BSHD [batch, s, heads, d]    SBHD [s, batch, heads, d]    BHSD [batch, heads, s, d]
 *   THD  [total_tokens, heads, d]  (packed variable length: needs cu_seqlens; sequence b's tokens
 *        start at seq_offsets[b] if given, else at cu_seqlens[b]). THD is all or nothing: when one
 *        format is THD, all five (q, kv, o, dO, dQKV) must be, except kv_format under paged K/V,
 *        which gives the layout of the pages (below). Query-side sequences must not overlap;
 *        key-side ones may overlap in the forward (a shared prefix) but not in the backward,
 *        whose dK/dV writes would collide.
 * Other tensors:
 *   lse        float32, [batch, heads_q, max_seqlen_q]; for THD also [total_q_tokens, heads_q]
 *   bias/dbias [bias_batch, bias_heads, max_seqlen_q, max_seqlen_kv], bias_batch in {1, batch},
 *              bias_heads in {1, heads_q}; dtype = qkv_dtype or float32; dbias same as bias.
 *   alibi_slopes, sink_logits, dsink, max_logit: float32 [heads_q]
 *   cu_seqlens_q/kv, seq_offsets_q/kv: int32 [batch + 1]
 *   page_table: int32 [batch, max_pages_per_seq]; seqlens_kv: int32 [batch] (paged K/V, below)
 * Padding masks on BSHD/SBHD/BHSD take per-sequence lengths from cu_seqlens_q/kv (length of
 * sequence b = cu[b+1] - cu[b]). THD always has per-sequence lengths; on THD the masks NONE and
 * PADDING mean the same, as do CAUSAL and PADDING_CAUSAL, and the two BOTTOM_RIGHT forms.
 * Query rows past a sequence's length (padding in BSHD/SBHD/BHSD, or in a [batch, heads, sq] LSE)
 * are fully masked rows: O = 0, LSE = -inf, dQ = 0; key rows past it get dK = dV = 0. In packed
 * THD tensors only the tokens of sequences are written; tokens outside every sequence are left
 * untouched.
 *   score_mod tensors  one dimension per axis the graph declares (batch, heads_q, max_seqlen_q,
 *              max_seqlen_kv, in that order; [1] for none), dtype as declared; their gradients
 *              (d_score_mod_tensors) have the same shape and dtype.
 * Lengths above max_seqlen are an error on the reference backend; GPU backends clamp them (no
 * out-of-bounds access, results for that sequence undefined), since they cannot read device memory
 * on the host without a synchronization.
 *
 * Paged K/V (config.page_size > 0; a serving engine's KV cache, as vLLM, SGLang and FlashInfer
 * keep it). K and V are pools of pages of page_size tokens each, in kv_format:
 *   BSHD [num_pages, page_size, heads_kv, d]    (FlashAttention's and vLLM's layout)
 *   BHSD [num_pages, heads_kv, page_size, d]    (cuDNN's; FlashInfer's HND)
 *   SBHD [page_size, num_pages, heads_kv, d]
 * (THD is not a page layout). num_pages is read from the tensors (k and v alike, any number >= 1).
 * Two more int32 tensors say where each sequence's keys are:
 *   page_table  [batch, max_pages_per_seq], max_pages_per_seq * page_size >= max_seqlen_kv, rows
 *               contiguous (stride 1 along a row): key j of sequence b is token j % page_size of
 *               page page_table[b, j / page_size].
 *   seqlens_kv  [batch], contiguous: sequence b's number of keys sk, in [0, max_seqlen_kv].
 * Only the entries a sequence uses (j / page_size for j < sk) are read, and each of those must be
 * in [0, num_pages); the others may hold anything (-1, say). Sequences may share pages (a common
 * prefix) and use them in any order. Queries are dense (BSHD, SBHD, BHSD: sq = max_seqlen_q, or
 * cu_seqlens_q under a padding mask) or THD (cu_seqlens_q, optional seq_offsets_q: chunked
 * prefill, several new tokens per sequence); cu_seqlens_kv and seq_offsets_kv are not taken. The
 * formulas above hold as written with sk = seqlens_kv[b], every mask, window, bias, softcap,
 * softmax, dropout and score_mod included: a bottom-right mask aligns the sq queries of a
 * sequence to the last sq of its sk keys (decode: sq = 1 sees every key). Paged K/V is forward
 * only: is_training must be 0 and fusedattn_bwd refuses a paged config; lse and max_logit may be
 * returned.
 * Bad page tables never cause a stray read: the reference backend reads the table and the lengths
 * on the host and refuses (INVALID_ARGUMENT, naming the sequence, the entry and its value) an
 * index outside [0, num_pages) or a length outside [0, max_seqlen_kv] before it writes anything.
 * A GPU backend cannot read them on the host without a synchronization: it checks every index on
 * the device as it loads it and never follows one outside [0, num_pages) (that sequence's results
 * are then undefined), and clamps lengths as above, so that nothing outside the pools and the
 * table's used entries is read. On the GPU, flash runs paged K/V: its decode kernel (max_seqlen_q
 * <= 16, float16/bfloat16, head_dim_qk = head_dim_v in {64, 128}, no dropout or score_mod), and
 * on sm_90 the Hopper forward's paged instances for the rest (chunked prefill with more query
 * rows, and the few-row problems the decode kernel refuses): float16/bfloat16 with o_dtype equal,
 * head dims multiples of 8 up to 128, attn_scale > 0, no bias tensor, dropout or score_mod,
 * page_size a power of two >= 16, q and the pools 16-byte aligned for TMA. cuDNN runs paged K/V
 * through its paged SDPA forward (cuDNN >= 9.5, THD queries >= 9.8): float16/bfloat16 with o_dtype
 * equal, page_size a power of two, head dims multiples of 8, no pre-scale bias, ALiBi, softcap,
 * max_logit or score_mod other than a band, what cuDNN's own engines take besides; it gives cuDNN
 * a copy of the table in which every entry is a page of the pool. small_seq and the problems
 * flash and cuDNN refuse say why in their reasons.
 *
 * Where tensors live: config.device says it. CUDA: device memory (or memory the device can read);
 * the reference backend then copies to the host and back. CPU: host memory, only the reference
 * backend runs. AUTO: CUDA when a CUDA device is present, else CPU.
 *
 * ---------------------------------------------------------------------------------------------
 * Errors
 * ---------------------------------------------------------------------------------------------
 * Every entry point returns a status. A readable message naming the field and the value that is
 * wrong is written to the caller's buffer (msg, msg_len; may be NULL/0, always NUL-terminated and
 * truncated to fit). Invalid input never writes outputs.
 *
 * ---------------------------------------------------------------------------------------------
 * Backend selection and run-time fallback
 * ---------------------------------------------------------------------------------------------
 * fusedattn_get_backend and the workspace sizes decide from the config alone. The preference
 * order on CUDA: small_seq (it accepts only one query token against a short K/V), then cuDNN and
 * flash in the order of their measured speed for the problem's class on the device's
 * architecture (a table made from committed benchmark results: dense plain problems by dtype,
 * head dim, mask, GQA, direction and sequence length), cuDNN first where nothing was measured;
 * explain's first line says which and, between cuDNN and flash, why. A backend that
 * accepts a problem may still be unable to read a call's tensors (cuDNN: a misaligned pointer or
 * stride, a head-dim stride other than 1). fusedattn_fwd / fusedattn_bwd then give the call to
 * the next backend that accepts the problem, in the same preference order, provided the
 * workspace given also covers that backend's own size (the workspace sizes promise only the
 * chosen backend's); the error of a call no backend runs names every backend with its reason.
 * A forced backend (config.backend or FUSEDATTN_BACKEND) is never replaced.
 *
 * A new shape of a problem whose cuDNN plans were built before (a sequence length or batch size
 * that no built plan covers) does not wait for cuDNN to build its plans under automatic
 * selection: cuDNN builds them on a background thread while selection picks the next backend
 * that runs the problem (explain names the build), and picks cuDNN again once they are built. A
 * call whose workspace was sized for the earlier choice runs on that choice, so the switch never
 * fails a call; the next workspace query sizes for the new one. Deterministic problems and
 * problems with dropout build in the call (which backend runs them must not depend on timing),
 * as do score_mod graphs (the other backend may compile one for longer); so does a forced cuDNN
 * backend, and a problem no other backend runs.
 *
 * ---------------------------------------------------------------------------------------------
 * Environment variables (read once per process, at first use)
 * ---------------------------------------------------------------------------------------------
 *   FUSEDATTN_BACKEND=name          force a backend for configs with backend = AUTO
 *   FUSEDATTN_PLAN_CACHE_SIZE=n     cuDNN plans kept in memory (default 256)
 *   FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1  EXPERIMENTAL, off by default: build cuDNN plans as
 *                                   dynamic-shape graphs that share compiled kernels (a kernel
 *                                   cache per problem structure) across batch sizes and sequence
 *                                   lengths, instead of one plan per shape. On cuDNN 9.19 (H100,
 *                                   measured 2026-11-24) plans built this way for a new shape gave
 *                                   wrong results (unwritten rows, NaN), so cuDNN plans are per
 *                                   shape unless this is 1 (needs cuDNN 9.18); see
 *                                   src/backends/cudnn/README.md, "Dynamic shapes: status"
 *   FUSEDATTN_CUDNN_BATCH_CHUNKS=n  the most launches of plans built for smaller batches a cuDNN
 *                                   call makes instead of building a plan for its own batch
 *                                   (default and maximum 8; 0 or 1: off); see
 *                                   src/backends/cudnn/README.md, "Plans across shapes"
 *   FUSEDATTN_CUDNN_BACKGROUND_BUILD=0  build a new shape's cuDNN plans in the call that needs
 *                                   them instead of in the background (above; default 1)
 *   FUSEDATTN_CACHE_DIR=dir         the on-disk cache of compiled code, so that a new process
 *                                   does not compile again: cuDNN's per-shape plans (cudnn-plans/,
 *                                   written after each build and read instead of building; keyed
 *                                   by the plan, fusedattn, cuDNN, cudnn-frontend and driver
 *                                   versions and the GPU model), and with
 *                                   FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1 instead cuDNN's kernel caches
 *                                   (cudnn/, from cuDNN 9.10; keyed also by the GPU's UUID);
 *                                   default $XDG_CACHE_HOME/fusedattn, else
 *                                   $HOME/.cache/fusedattn; "", "0" or "off" turns it off. The
 *                                   directory must belong to the user and not be writable by
 *                                   group or others (it holds code that gets loaded); entries
 *                                   are written atomically, checksummed, and a damaged one (or
 *                                   one cuDNN refuses) is ignored and rewritten.
 *   FUSEDATTN_CACHE_MAX_MB=n        its size bound (default 1024); the least recently used
 *                                   entries go first
 *   FUSEDATTN_FLASH_WGMMA=0         flash: no Hopper wgmma kernels
 *   FUSEDATTN_FP8_CHECK_SCALES=0    CUDA: do not read FP8 scaling factors on the host to check
 *                                   them (see "FP8 attention")
 *   FUSEDATTN_CUDA_INCLUDE=dir      flash's run-time compiler: where the CUDA headers are
 * fusedattn_get_backend's message says how the chosen backend runs the problem where it matters
 * (cuDNN: per-shape, unified-node or dynamic-shape plans and why, and where kernel caches are
 * kept).
 */
#ifndef FUSEDATTN_FUSEDATTN_H
#define FUSEDATTN_FUSEDATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FUSEDATTN_API __declspec(dllexport)
#else
#define FUSEDATTN_API __attribute__((visibility("default")))
#endif

#define FUSEDATTN_VERSION_MAJOR 0
#define FUSEDATTN_VERSION_MINOR 1
#define FUSEDATTN_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define FUSEDATTN_VERSION \
  (FUSEDATTN_VERSION_MAJOR * 10000 + FUSEDATTN_VERSION_MINOR * 100 + FUSEDATTN_VERSION_PATCH)

/* C callers may store any int in an enum field or argument; validation refuses the values that
 * are not listed. C++ (the library included) sees every enum with the fixed underlying type
 * int32_t, so that any such value is a valid value of the type there too (reading an out-of-range
 * value of an enum without a fixed type is undefined behaviour in C++). Size and ABI are those of
 * int in both languages. */
#ifdef __cplusplus
#define FUSEDATTN_ENUM(name) enum name : int32_t
#else
#define FUSEDATTN_ENUM(name) enum name
#endif

typedef FUSEDATTN_ENUM(fusedattn_status) {
  FUSEDATTN_SUCCESS = 0,
  FUSEDATTN_ERROR_INVALID_ARGUMENT = 1, /* the config or a tensor is wrong */
  FUSEDATTN_ERROR_NOT_SUPPORTED = 2,    /* valid, but no (or not the forced) backend can run it */
  FUSEDATTN_ERROR_WORKSPACE = 3,        /* workspace missing or smaller than asked for */
  FUSEDATTN_ERROR_CUDA = 4,             /* a CUDA call failed */
  FUSEDATTN_ERROR_CUDNN = 5,            /* a cuDNN call failed */
  FUSEDATTN_ERROR_OUT_OF_MEMORY = 6,
  FUSEDATTN_ERROR_INTERNAL = 7
} fusedattn_status;

typedef FUSEDATTN_ENUM(fusedattn_dtype) {
  FUSEDATTN_DTYPE_FLOAT32 = 0,
  FUSEDATTN_DTYPE_FLOAT16 = 1,
  FUSEDATTN_DTYPE_BFLOAT16 = 2,
  FUSEDATTN_DTYPE_FP8_E4M3 = 3, /* FP8 attention only (see "FP8 attention") */
  FUSEDATTN_DTYPE_FP8_E5M2 = 4, /* FP8 attention only: dO, dQ/dK/dV */
  FUSEDATTN_DTYPE_INT32 = 5,    /* index tensors (cu_seqlens, seq_offsets) */
  /* config.do_dtype / config.dqkv_dtype only: the same dtype as o_dtype / qkv_dtype */
  FUSEDATTN_DTYPE_DEFAULT = -1
} fusedattn_dtype;

typedef FUSEDATTN_ENUM(fusedattn_format) {
  FUSEDATTN_FORMAT_BSHD = 0,
  FUSEDATTN_FORMAT_SBHD = 1,
  FUSEDATTN_FORMAT_BHSD = 2,
  FUSEDATTN_FORMAT_THD = 3
} fusedattn_format;

typedef FUSEDATTN_ENUM(fusedattn_mask) {
  FUSEDATTN_MASK_NONE = 0,
  FUSEDATTN_MASK_PADDING = 1,
  FUSEDATTN_MASK_CAUSAL = 2,
  FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT = 3,
  FUSEDATTN_MASK_PADDING_CAUSAL = 4,
  FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT = 5
} fusedattn_mask;

typedef FUSEDATTN_ENUM(fusedattn_bias) {
  FUSEDATTN_BIAS_NONE = 0,
  FUSEDATTN_BIAS_PRE_SCALE = 1,
  FUSEDATTN_BIAS_POST_SCALE = 2,
  FUSEDATTN_BIAS_ALIBI = 3
} fusedattn_bias;

typedef FUSEDATTN_ENUM(fusedattn_softmax) {
  FUSEDATTN_SOFTMAX_VANILLA = 0,
  FUSEDATTN_SOFTMAX_OFF_BY_ONE = 1,
  FUSEDATTN_SOFTMAX_LEARNABLE_SINK = 2
} fusedattn_softmax;

typedef FUSEDATTN_ENUM(fusedattn_backend) {
  FUSEDATTN_BACKEND_AUTO = 0,
  FUSEDATTN_BACKEND_REFERENCE = 1,
  FUSEDATTN_BACKEND_CUDNN = 2,
  FUSEDATTN_BACKEND_FLASH = 3,
  FUSEDATTN_BACKEND_SMALL_SEQ = 4
} fusedattn_backend;
#define FUSEDATTN_BACKEND_COUNT 5

typedef FUSEDATTN_ENUM(fusedattn_device) {
  FUSEDATTN_DEVICE_AUTO = 0, /* CUDA when a device is present, else CPU */
  FUSEDATTN_DEVICE_CPU = 1,
  FUSEDATTN_DEVICE_CUDA = 2
} fusedattn_device;

/* A score-modifier graph (opaque; see "Score modifiers" below). */
typedef struct fusedattn_score_mod fusedattn_score_mod;

/* The problem: everything that decides which backend can run it and how. No tensor pointers;
 * a score_mod graph is part of the problem (by its structure, never by its address). */
typedef struct fusedattn_config {
  size_t struct_size; /* sizeof(fusedattn_config) as the caller compiled it (or an earlier
                         layout's: 0.1.0's, the one that ends with score_mod, the one
                         that ends with page_size, or the one that ends with dqkv_dtype) */

  int32_t is_training; /* forward saves LSE and the backend must also support the backward */
  int64_t batch;
  int64_t heads_q;
  int64_t heads_kv; /* divides heads_q (GQA/MQA) */
  int64_t max_seqlen_q;
  int64_t max_seqlen_kv;
  int64_t head_dim_qk;
  int64_t head_dim_v;

  fusedattn_dtype qkv_dtype; /* q, k, v and dq, dk, dv (unless dqkv_dtype says otherwise) */
  fusedattn_dtype o_dtype;   /* o and do (unless do_dtype says otherwise) */

  fusedattn_format q_format;
  fusedattn_format kv_format;
  fusedattn_format o_format;
  fusedattn_format do_format;
  fusedattn_format dqkv_format;

  fusedattn_mask mask;
  int64_t window_left;  /* -1: unbounded */
  int64_t window_right; /* -1: unbounded; causal masks need -1 or 0 */

  fusedattn_bias bias_type;
  int64_t bias_batch; /* PRE/POST_SCALE: 1 or batch */
  int64_t bias_heads; /* PRE/POST_SCALE: 1 or heads_q */
  int32_t bias_requires_grad; /* backward writes dbias */

  fusedattn_softmax softmax_type;
  /* attn_scale and softcap: finite, and 0 or a normal float32 in magnitude (FLT_MIN..FLT_MAX),
   * since the GPU kernels compute in float32; anything else is an invalid argument. */
  double attn_scale; /* 0: 1/sqrt(head_dim_qk) */
  double softcap;    /* 0: off */
  double dropout;    /* probability of dropping, in [0, 1) */

  int32_t deterministic;    /* the backward gives bit-identical results run to run */
  int32_t return_lse;       /* forward writes lse (needed by the backward; implied by is_training) */
  int32_t return_max_logit; /* forward writes max_logit */

  fusedattn_backend backend; /* AUTO, or force one (also env FUSEDATTN_BACKEND=name) */
  fusedattn_device device;

  /* Fields added after version 0.1.0 (callers built against 0.1.0 pass the shorter struct_size
   * and get the defaults below). */
  const fusedattn_score_mod* score_mod; /* NULL: none; else a finalized graph */
  int64_t page_size; /* 0: K/V are contiguous tensors; > 0: paged K/V, pools of pages of this many
                        tokens with a page table (see "Paged K/V"; forward only) */
  /* Added after 0.1.0 (FP8; earlier layouts get DEFAULT): the dtypes of dO and of dQ/dK/dV.
   * DEFAULT: o_dtype and qkv_dtype. Only an FP8 problem may set others (see "FP8 attention"). */
  fusedattn_dtype do_dtype;
  fusedattn_dtype dqkv_dtype;
  /* Added after 0.1.0 (earlier layouts get 0): where this call's elements sit in a larger
   * problem, for the dropout mask only (see "Dropout mask"). All 0: the call is the problem. */
  int64_t dropout_batch_offset;
  int64_t dropout_heads;       /* the larger problem's query heads; 0: heads_q */
  int64_t dropout_head_offset;
  int64_t dropout_rows;        /* the larger problem's max_seqlen_q; 0: max_seqlen_q */
  int64_t dropout_row_offset;
  int64_t dropout_key_offset;  /* a multiple of 4 */
} fusedattn_config;

#define FUSEDATTN_CONFIG_INIT                                                                   \
  {                                                                                             \
    sizeof(fusedattn_config), /*is_training*/ 0, /*batch*/ 0, /*heads_q*/ 0, /*heads_kv*/ 0,    \
        /*max_seqlen_q*/ 0, /*max_seqlen_kv*/ 0, /*head_dim_qk*/ 0, /*head_dim_v*/ 0,           \
        FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_FORMAT_BSHD,              \
        FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_BSHD,                    \
        FUSEDATTN_FORMAT_BSHD, FUSEDATTN_MASK_NONE, /*window_left*/ -1, /*window_right*/ -1,    \
        FUSEDATTN_BIAS_NONE, /*bias_batch*/ 1, /*bias_heads*/ 1, /*bias_requires_grad*/ 0,      \
        FUSEDATTN_SOFTMAX_VANILLA, /*attn_scale*/ 0.0, /*softcap*/ 0.0, /*dropout*/ 0.0,        \
        /*deterministic*/ 0, /*return_lse*/ 0, /*return_max_logit*/ 0, FUSEDATTN_BACKEND_AUTO, \
        FUSEDATTN_DEVICE_AUTO, /*score_mod*/ NULL, /*page_size*/ 0, FUSEDATTN_DTYPE_DEFAULT,    \
        FUSEDATTN_DTYPE_DEFAULT, /*dropout_batch_offset*/ 0, /*dropout_heads*/ 0,               \
        /*dropout_head_offset*/ 0, /*dropout_rows*/ 0, /*dropout_row_offset*/ 0,                \
        /*dropout_key_offset*/ 0                                                                \
  }

#define FUSEDATTN_MAX_DIMS 4

typedef struct fusedattn_tensor {
  void* data; /* NULL: absent */
  fusedattn_dtype dtype;
  int32_t ndim;
  int64_t shape[FUSEDATTN_MAX_DIMS];
  int64_t strides[FUSEDATTN_MAX_DIMS]; /* in elements */
} fusedattn_tensor;

typedef struct fusedattn_fwd_args {
  size_t struct_size;
  fusedattn_tensor q, k, v;
  fusedattn_tensor o;            /* output */
  fusedattn_tensor lse;          /* output when return_lse or is_training */
  fusedattn_tensor max_logit;    /* output when return_max_logit */
  fusedattn_tensor bias;         /* PRE/POST_SCALE */
  fusedattn_tensor alibi_slopes; /* ALIBI */
  fusedattn_tensor sink_logits;  /* LEARNABLE_SINK */
  fusedattn_tensor cu_seqlens_q, cu_seqlens_kv; /* THD and padding masks */
  fusedattn_tensor seq_offsets_q, seq_offsets_kv; /* THD, optional */
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  /* Added after 0.1.0: the score_mod's auxiliary tensors, in declaration order (shapes and
   * dtypes as the graph declares them). */
  int64_t num_score_mod_tensors;
  const fusedattn_tensor* score_mod_tensors;
  /* Added after 0.1.0: the dropout seed and offset held in memory instead of the two fields
   * above, for callers that have them only there (a PRNG key traced by jax.jit, a generator's
   * state on the device): NULL, or two uint64 values {seed, offset} where the tensors live
   * (device memory for config.device CUDA). Read only when config.dropout > 0, and then they
   * replace dropout_seed and dropout_offset. On CUDA the library reads them with one 16-byte
   * copy on the stream, which waits for the stream (a host synchronization per call). */
  const uint64_t* dropout_seed_offset;
  /* Added after 0.1.0: paged K/V (config.page_size > 0; absent otherwise): int32
   * [batch, max_pages_per_seq] and int32 [batch]. */
  fusedattn_tensor page_table;
  fusedattn_tensor seqlens_kv;
  /* Added after 0.1.0: FP8 per-tensor scaling (qkv_dtype FP8_E4M3; NULL otherwise): float32
   * scalars where the tensors live; see "FP8 attention" for where each one applies. */
  const float* descale_q;
  const float* descale_k;
  const float* descale_v;
  const float* descale_s;
  const float* scale_s;
  const float* scale_o; /* o_dtype FP8 only */
  float* amax_s;        /* output: max |softmax output after dropout| */
  float* amax_o;        /* output: max |O| before scale_o */
} fusedattn_fwd_args;

typedef struct fusedattn_bwd_args {
  size_t struct_size;
  fusedattn_tensor q, k, v, o, lse;
  fusedattn_tensor d_o;
  fusedattn_tensor bias, alibi_slopes, sink_logits;
  fusedattn_tensor cu_seqlens_q, cu_seqlens_kv;
  fusedattn_tensor seq_offsets_q, seq_offsets_kv;
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  fusedattn_tensor dq, dk, dv; /* outputs */
  fusedattn_tensor dbias;      /* output when bias_requires_grad */
  fusedattn_tensor dsink;      /* output for LEARNABLE_SINK */
  /* Added after 0.1.0: the score_mod's auxiliary tensors (as in the forward) and their
   * gradients (outputs, same shapes and dtypes; data present exactly for the tensors declared
   * with requires_grad, NULL for the others). */
  int64_t num_score_mod_tensors;
  const fusedattn_tensor* score_mod_tensors;
  const fusedattn_tensor* d_score_mod_tensors;
  /* Added after 0.1.0: as in fusedattn_fwd_args (NULL: dropout_seed and dropout_offset). */
  const uint64_t* dropout_seed_offset;
  /* Added after 0.1.0: FP8 per-tensor scaling (qkv_dtype FP8_E4M3; NULL otherwise), as in
   * fusedattn_fwd_args; see "FP8 attention". */
  const float* descale_q;
  const float* descale_k;
  const float* descale_v;
  const float* descale_o; /* o_dtype FP8 only */
  const float* descale_do;
  const float* descale_s;
  const float* descale_dp;
  const float* scale_s;
  const float* scale_dp;
  const float* scale_dq; /* dqkv_dtype FP8 only, as scale_dk and scale_dv */
  const float* scale_dk;
  const float* scale_dv;
  float* amax_dp; /* outputs: max |dP|, |dQ|, |dK|, |dV| before scaling */
  float* amax_dq;
  float* amax_dk;
  float* amax_dv;
} fusedattn_bwd_args;

/* Zero-filled args with struct_size set. (struct_size may also be that of an earlier layout:
 * 0.1.0's, the one that ends with the score_mod fields, the one that ends with
 * dropout_seed_offset, or (fusedattn_fwd_args) the one that ends with seqlens_kv; the fields
 * added since then are then zero.) */
FUSEDATTN_API fusedattn_fwd_args fusedattn_fwd_args_init(void);
FUSEDATTN_API fusedattn_bwd_args fusedattn_bwd_args_init(void);

/* Which backend runs this problem. On success *backend is set and msg holds the diagnostic
 * (the chosen backend and why each one before it refused); on FUSEDATTN_ERROR_NOT_SUPPORTED
 * msg names every backend with its reason. */
FUSEDATTN_API fusedattn_status fusedattn_get_backend(const fusedattn_config* config,
                                                     fusedattn_backend* backend, char* msg,
                                                     size_t msg_len);

FUSEDATTN_API fusedattn_status fusedattn_fwd_workspace_size(const fusedattn_config* config,
                                                            size_t* bytes, char* msg,
                                                            size_t msg_len);
FUSEDATTN_API fusedattn_status fusedattn_bwd_workspace_size(const fusedattn_config* config,
                                                            size_t* bytes, char* msg,
                                                            size_t msg_len);

/* stream: a cudaStream_t (NULL: the default stream); ignored on the CPU. The workspace lives where
 * the tensors live and must hold at least the size asked for. */
FUSEDATTN_API fusedattn_status fusedattn_fwd(const fusedattn_config* config,
                                             const fusedattn_fwd_args* args, void* workspace,
                                             size_t workspace_bytes, void* stream, char* msg,
                                             size_t msg_len);
FUSEDATTN_API fusedattn_status fusedattn_bwd(const fusedattn_config* config,
                                             const fusedattn_bwd_args* args, void* workspace,
                                             size_t workspace_bytes, void* stream, char* msg,
                                             size_t msg_len);

FUSEDATTN_API const char* fusedattn_status_string(fusedattn_status status);
FUSEDATTN_API const char* fusedattn_backend_name(fusedattn_backend backend);
/* Parses "auto", "reference", "cudnn", "flash", "small_seq". */
FUSEDATTN_API fusedattn_status fusedattn_backend_from_name(const char* name,
                                                           fusedattn_backend* backend);

/* Whether a backend is compiled in, and (for GPU backends) whether a device is usable. The reason
 * when it is not is written to msg. */
FUSEDATTN_API int fusedattn_backend_available(fusedattn_backend backend, char* msg,
                                              size_t msg_len);

FUSEDATTN_API int fusedattn_version(void);
FUSEDATTN_API const char* fusedattn_version_string(void);
/* cuDNN version the library runs against (cudnnGetVersion), 0 if built without cuDNN. */
FUSEDATTN_API int64_t fusedattn_cudnn_version(void);

/* Counters of a backend's plan / kernel cache (zero for backends without one). */
typedef struct fusedattn_cache_stats {
  uint64_t hits;
  uint64_t misses;
  uint64_t evictions;
  uint64_t entries;
  uint64_t capacity;
} fusedattn_cache_stats;
FUSEDATTN_API fusedattn_status fusedattn_get_cache_stats(fusedattn_backend backend,
                                                         fusedattn_cache_stats* stats);

/* ---------------------------------------------------------------------------------------------
 * Score modifiers (flex attention): expression graphs over the score and the indices
 * ---------------------------------------------------------------------------------------------
 * A fusedattn_score_mod is an expression DAG with up to two outputs: a score (a number that
 * replaces s) and a mask (a boolean, true = the key stays visible). Build it node by node, set
 * its outputs, then finalize it; a finalized graph is immutable and may be shared by threads.
 * fusedattn/score_mod.hpp wraps these functions with operators (s * 2, q_idx >= kv_idx, ...).
 *
 * Values are numbers or booleans. Numbers are evaluated in double on the CPU reference (a GPU
 * executor may use float32: integers up to 2^24 stay exact there). flash's kernels (float16 and
 * bfloat16 inputs) compute TANH as the softcap's tanh.approx.f32 (relative error up to about
 * 2^-11) and DIV by a constant c as a multiply by 1 / c rounded to float32 where that is a
 * normal float32. Leaves:
 *   inputs     s (the score, see the specification above), b, h (query head), i (q_idx),
 *              j (kv_idx), sq and sk (the sequence's own lengths), all numbers
 *   constants  numbers (double; +-0, inf and NaN payloads are kept bit for bit)
 *   tensors    auxiliary tensors, read at (b, h, i, j) restricted to their axes (below)
 * Operations (operands are node ids returned by the functions below):
 *   NEG ABS EXP LOG TANH SIGMOID    number -> number; SIGMOID(x) = 1 / (1 + exp(-x))
 *   ADD SUB MUL DIV                 numbers -> number (IEEE)
 *   MIN MAX                         numbers -> number; NaN if either is NaN, else MIN(a, b) =
 *                                   (b < a ? b : a) and MAX(a, b) = (b > a ? b : a)
 *   LT LE GT GE                     numbers -> boolean (IEEE: false when either is NaN)
 *   EQ NE                           two numbers or two booleans -> boolean
 *   AND OR (booleans) NOT (boolean) -> boolean
 *   SELECT(c, a, b)                 c ? a : b; c boolean, a and b both numbers or both booleans
 * Derivatives (for the backward): d|x| = sign(x) (0 at 0), dMIN / dMAX follow the branch taken,
 * SELECT passes the gradient to the branch taken only, comparisons pass none.
 *
 * Identical nodes are one node (hash-consing): building the same expression twice returns the
 * same id. Two finalized graphs are equal (fusedattn_score_mod_equal) exactly when their
 * outputs (score, mask, explicit gradients) are built by the same operations on the same
 * operands and constants (bit for bit: -0.0 is not 0.0), and they declare the same tensors
 * (dtype, axes, requires_grad, in order); names and nodes that no output uses do not count.
 * With the config's extents this also fixes every tensor's shape. Caches key on that structure,
 * never on the handle's address. Building a graph is not thread-safe; a finalized one is.
 */
typedef FUSEDATTN_ENUM(fusedattn_score_mod_variable) {
  FUSEDATTN_SCORE_MOD_SCORE = 0,     /* s */
  FUSEDATTN_SCORE_MOD_BATCH = 1,     /* b: the sequence */
  FUSEDATTN_SCORE_MOD_HEAD = 2,      /* h: the query head */
  FUSEDATTN_SCORE_MOD_Q_IDX = 3,     /* i: query position inside the sequence */
  FUSEDATTN_SCORE_MOD_KV_IDX = 4,    /* j: key position inside the sequence */
  FUSEDATTN_SCORE_MOD_SEQLEN_Q = 5,  /* sq: the sequence's query length */
  FUSEDATTN_SCORE_MOD_SEQLEN_KV = 6, /* sk: the sequence's key length */
  /* i + sk - sq: the query position aligned to the end of the keys (bottom-right). Not a leaf:
   * fusedattn_score_mod_input builds it as ADD(q_idx, SUB(seqlen_kv, seqlen_q)). */
  FUSEDATTN_SCORE_MOD_Q_IDX_BR = 7
} fusedattn_score_mod_variable;

typedef FUSEDATTN_ENUM(fusedattn_score_mod_opcode) {
  FUSEDATTN_SCORE_MOD_NEG = 0,
  FUSEDATTN_SCORE_MOD_ABS = 1,
  FUSEDATTN_SCORE_MOD_EXP = 2,
  FUSEDATTN_SCORE_MOD_LOG = 3,
  FUSEDATTN_SCORE_MOD_TANH = 4,
  FUSEDATTN_SCORE_MOD_SIGMOID = 5,
  FUSEDATTN_SCORE_MOD_NOT = 6,
  FUSEDATTN_SCORE_MOD_ADD = 7,
  FUSEDATTN_SCORE_MOD_SUB = 8,
  FUSEDATTN_SCORE_MOD_MUL = 9,
  FUSEDATTN_SCORE_MOD_DIV = 10,
  FUSEDATTN_SCORE_MOD_MIN = 11,
  FUSEDATTN_SCORE_MOD_MAX = 12,
  FUSEDATTN_SCORE_MOD_LT = 13,
  FUSEDATTN_SCORE_MOD_LE = 14,
  FUSEDATTN_SCORE_MOD_GT = 15,
  FUSEDATTN_SCORE_MOD_GE = 16,
  FUSEDATTN_SCORE_MOD_EQ = 17,
  FUSEDATTN_SCORE_MOD_NE = 18,
  FUSEDATTN_SCORE_MOD_AND = 19,
  FUSEDATTN_SCORE_MOD_OR = 20,
  FUSEDATTN_SCORE_MOD_SELECT = 21
} fusedattn_score_mod_opcode;

/* Axes an auxiliary tensor is indexed by (a bit set). Its shape has one dimension per axis, in
 * the order batch, head, q, kv, each of the full extent: batch, heads_q, max_seqlen_q,
 * max_seqlen_kv. It is broadcast over the axes it leaves out; with no axis it is a scalar of
 * shape [1]. Example: per-token document ids [batch, max_seqlen_q] are BATCH | Q. */
#define FUSEDATTN_SCORE_MOD_AXIS_BATCH 1u
#define FUSEDATTN_SCORE_MOD_AXIS_HEAD 2u
#define FUSEDATTN_SCORE_MOD_AXIS_Q 4u
#define FUSEDATTN_SCORE_MOD_AXIS_KV 8u

/* A new, empty graph. *graph is NULL on failure. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_create(fusedattn_score_mod** graph);
/* Frees a graph (NULL is fine). Configs that point at it must not be used afterwards. */
FUSEDATTN_API void fusedattn_score_mod_destroy(fusedattn_score_mod* graph);

/* Node builders: each writes the new (or the identical existing) node's id to *node. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_input(fusedattn_score_mod* graph,
                                                         fusedattn_score_mod_variable input,
                                                         int32_t* node, char* msg,
                                                         size_t msg_len);
FUSEDATTN_API fusedattn_status fusedattn_score_mod_constant(fusedattn_score_mod* graph,
                                                            double value, int32_t* node,
                                                            char* msg, size_t msg_len);
/* Declares the next auxiliary tensor and returns the node that reads it. Tensors are numbered
 * in declaration order (0, 1, ...): the calls pass them in that order (fusedattn_fwd_args /
 * fusedattn_bwd_args .score_mod_tensors). dtype: float32, float16, bfloat16 or int32 (read as
 * numbers). requires_grad: the backward writes its gradient (float dtypes only). name: for
 * messages, unique in the graph. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_tensor(fusedattn_score_mod* graph,
                                                          const char* name,
                                                          fusedattn_dtype dtype, uint32_t axes,
                                                          int32_t requires_grad, int32_t* node,
                                                          char* msg, size_t msg_len);
FUSEDATTN_API fusedattn_status fusedattn_score_mod_op(fusedattn_score_mod* graph,
                                                      fusedattn_score_mod_opcode op,
                                                      int32_t num_operands,
                                                      const int32_t* operands, int32_t* node,
                                                      char* msg, size_t msg_len);

/* Outputs. score: a number, the modified score (unset: s unchanged). mask: a boolean over the
 * indices and tensors only (it may not read s), ANDed with the config's mask (unset: no extra
 * masking). Setting an output again replaces it. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_set_score(fusedattn_score_mod* graph,
                                                             int32_t node, char* msg,
                                                             size_t msg_len);
FUSEDATTN_API fusedattn_status fusedattn_score_mod_set_mask(fusedattn_score_mod* graph,
                                                            int32_t node, char* msg,
                                                            size_t msg_len);
/* An explicit backward: gradient is the node that computes d score / d wrt, where wrt is the
 * score input s or a tensor node declared with requires_grad. Without one the library derives
 * it symbolically; with one, the backward uses the given graph. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_set_gradient(fusedattn_score_mod* graph,
                                                                int32_t wrt, int32_t gradient,
                                                                char* msg, size_t msg_len);

/* Checks the graph, derives its backward and freezes it. Builders and setters fail afterwards;
 * only a finalized graph can be put in a config. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_finalize(fusedattn_score_mod* graph,
                                                            char* msg, size_t msg_len);

/* The canonical 128-bit hash of a finalized graph (hash[0] low, hash[1] high word). Equal
 * graphs have equal hashes; equality itself is fusedattn_score_mod_equal. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_hash(const fusedattn_score_mod* graph,
                                                        uint64_t hash[2]);
/* *equal = 1 when two finalized graphs are structurally equal, else 0. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_equal(const fusedattn_score_mod* a,
                                                         const fusedattn_score_mod* b,
                                                         int32_t* equal);
/* A readable text of the graph: its outputs and, once finalized, the derived derivatives. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_describe(const fusedattn_score_mod* graph,
                                                            char* text, size_t text_len);

/* A self-contained text form of a finalized graph, for places where only strings travel (a
 * torch op's string argument, an XLA FFI attribute, a file): the tensor declarations, every node
 * and the outputs, constants as the bits of their doubles. fusedattn_score_mod_deserialize
 * rebuilds an equal graph (fusedattn_score_mod_equal says 1, same hash). Writes at most text_len
 * bytes including the NUL; *needed (may be NULL) receives the bytes the whole text needs,
 * including the NUL: call with text_len 0 to size the buffer. A text_len too small is
 * FUSEDATTN_ERROR_INVALID_ARGUMENT with nothing written. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_serialize(const fusedattn_score_mod* graph,
                                                             char* text, size_t text_len,
                                                             size_t* needed);
/* A new finalized graph from fusedattn_score_mod_serialize's text (*graph is NULL on failure;
 * the message names the malformed item). Free it with fusedattn_score_mod_destroy. */
FUSEDATTN_API fusedattn_status fusedattn_score_mod_deserialize(const char* text,
                                                               fusedattn_score_mod** graph,
                                                               char* msg, size_t msg_len);

#ifdef __cplusplus
}
#endif

#endif /* FUSEDATTN_FUSEDATTN_H */
