"""Context parallelism: one attention over a sequence split across the ranks of a
torch.distributed process group (NCCL on GPUs, gloo on CPUs), forward and backward.

    import torch.distributed as dist, fusedattn.distributed as cp
    q_local = cp.shard(q, rank, world_size, layout="bshd")          # this rank's part
    o_local = cp.context_parallel_attention(q_local, k_local, v_local, group=dist.group.WORLD,
                                            mode="ring", layout="bshd", mask="causal")

How the sequence is split (every mode, so a model can switch modes): the sequence axis is cut
into 2N equal chunks (N = the group's size) and rank r holds chunks r and 2N-1-r, in that order.
Under a causal mask every rank then has the same amount of work (Megatron's and Transformer
Engine's load balancing). THD (packed variable length) splits every sequence this way: rank r's
tokens are, sequence after sequence, chunks r and 2N-1-r of that sequence; cu_seqlens_q/kv are
those of the whole sequences (the same on every rank), each length a multiple of 2N. shard() and
unshard() convert between a whole tensor and the ranks' parts.

Modes (communication through torch.distributed only):

* "ring": K/V blocks travel around the ring (batch_isend_irecv to rank r+1, from rank r-1)
  while the attention of the block in hand runs; each block's output is merged into the running
  result exactly by its log-sum-exp. NCCL runs the transfers on its own stream, so they overlap
  the attention kernels on the current stream. The backward recomputes each block from the final
  O and LSE (FlashAttention's backward identity: p = exp(s - LSE), D = dO . O), and the dK/dV of
  each block travel around the ring with it and arrive home after N hops. A block that the mask
  hides entirely is skipped; a block it hides in part runs on the rows and keys that see
  something (with dropout, up to 3 keys more, below: hidden by the call's window), with the
  library's mask and window that reproduce the band there.
* "all_to_all" (DeepSpeed Ulysses): an all-to-all trades the sequence split for a head split,
  each rank attends over the whole sequence for heads_q / N heads, and an all-to-all trades back.
  heads_q must be a multiple of N (heads_kv that is not is repeated until it is: GQA/MQA).
* "all_gather": K/V are gathered from every rank, each rank attends with its own queries, and
  the backward reduce-scatters dK/dV. For short K/V (or few ranks).

Every block's attention is fusedattn.attention(..., return_lse=True) and its backward
fusedattn.attention_backward(..., o, lse): the C API, so any backend runs it (the reference backend
on CPU tensors; with dropout, the backends that take dropout positions, below). The result equals the single-device call up to rounding: blocks are merged in
float32 (a block's output is rounded to q's dtype first), and dK/dV/dQ are summed over blocks in
float32.

Dropout (dropout_p > 0) draws the single-device call's mask, so the result equals the
single-device call with the same dropout_seed up to rounding, forward and backward. Every
block's call gives the library its place in the whole problem (fusedattn.DropoutPositions, the
config's dropout_* fields; fusedattn.h, "Dropout mask"): "ring" and "all_gather" the positions
of its first query and first key inside the sequence (and, for THD, the index of its first
sequence), "all_to_all" its head group's first head; the backward's calls give the same. Every
rank uses one seed: dropout_seed, or one drawn on the group's first rank and broadcast when it
is None (drawn from torch's default CPU generator, so torch.manual_seed repeats it and
activation checkpointing, which restores torch's generators, recomputes the same mask). What it
costs: a "ring" call then covers one chunk of queries and one chunk of keys (a non-causal block
takes four calls instead of one; "all_gather" calls one chunk of queries against the whole K/V), and THD sequences whose chunks start
at different positions take a call each; "ring" needs key lengths that are multiples of
8 x world_size (the mask draws keys in groups of four from the sequence's start, and a call's
first key must be at one of them: it is moved down to one inside its chunk, the keys taken in
hidden by its window). Only the reference backend runs these calls for now: flash and
small_seq refuse dropout positions until their kernels take them, and cuDNN draws its own
random stream. CPU tensors take it as always; CUDA tensors need backend="reference" (it copies
to the host and back: correct, not fast), else the calls are refused, naming every backend's
reason.

Gradients of replicated parameters (sinks) are this rank's part (the loss terms of its own tokens
and, under all_to_all, its own heads), as for the weights of every other layer under context
parallelism: the data-parallel gradient reduction over the context-parallel ranks sums them
(Megatron's "dp_cp" group).

Not supported, with the reason in the error: a bias tensor (a [sq, skv] tensor of the whole
sequence on every rank defeats the purpose), ALiBi in "ring" and "all_gather" (its distance
uses the call's own positions; "all_to_all" runs it), score_mod / mask_mod (they read the
call's positions and heads), seq_offsets_q/kv (THD with gaps) and padding masks on dense
layouts (use "thd").
"""

import math
from collections import OrderedDict, namedtuple

import numpy as np
import torch
import torch.distributed as dist

from . import _C, _api
from ._errors import InvalidArgumentError, NotSupportedError
from ._problem import DropoutPositions, normalize_options

__all__ = ["context_parallel_attention", "shard", "unshard", "simulate", "MODES"]

MODES = ("ring", "all_to_all", "all_gather")

# Per layout: the sequence axis and the head axis of q/k/v/o, and the sequence axis of the LSE
# (float32 [batch, heads, seq], or [tokens, heads] for THD).
_SEQ_DIM = {"bshd": 1, "sbhd": 0, "bhsd": 2, "thd": 0}
_HEAD_DIM = {"bshd": 2, "sbhd": 2, "bhsd": 1, "thd": 1}
_LSE_SEQ_DIM = {"bshd": 2, "sbhd": 2, "bhsd": 2, "thd": 0}
_CAUSAL_MASKS = ("causal", "causal_bottom_right", "padding_causal", "padding_causal_bottom_right")
_TOP_LEFT_MASKS = ("causal", "padding_causal")

_CACHE_SIZE = 64


def _cached(cache, key, make):
    """cache[key], made on a miss; the oldest entry goes when the cache is full."""
    try:
        cache.move_to_end(key)
        return cache[key]
    except KeyError:
        value = cache[key] = make()
        if len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
        return value


# ---------------------------------------------------------------------------------------------
# The split: which tokens a rank holds
# ---------------------------------------------------------------------------------------------


def _lengths_of(cu_seqlens, name):
    """Sequence lengths (int64 NumPy) from cu_seqlens: a tensor (read on the host: a device
    synchronization for CUDA tensors), a list or an array."""
    if isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = cu_seqlens.tolist()
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise InvalidArgumentError("%s has shape %s but [batch + 1] is expected"
                                   % (name, list(cu.shape)))
    if cu[0] != 0:
        raise InvalidArgumentError("%s must start at 0 (packed sequences without gaps), got %d"
                                   % (name, cu[0]))
    lengths = np.diff(cu)
    if (lengths < 0).any():
        b = int(np.argmax(lengths < 0))
        raise InvalidArgumentError("%s decreases at sequence %d (%d then %d): cumulative lengths "
                                   "are non-decreasing" % (name, b, cu[b], cu[b + 1]))
    return lengths


def _check_divisible(lengths, world_size, name):
    bad = lengths % (2 * world_size) != 0
    if bad.any():
        b = int(np.argmax(bad))
        raise InvalidArgumentError(
            "%s: sequence %d has %d tokens, not a multiple of 2 x world_size = %d: context "
            "parallelism cuts every sequence into 2N equal chunks (pad the sequences)"
            % (name, b, lengths[b], 2 * world_size))


def _rank_positions(lengths, rank, world_size):
    """The global token indices (into the whole packed tensor) that rank holds, in its local
    order: per sequence, chunk rank then chunk 2N-1-rank."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    chunk = lengths // (2 * world_size)
    parts = []
    for start, c in zip(starts.tolist(), chunk.tolist()):
        parts.append(np.arange(start + rank * c, start + (rank + 1) * c))
        parts.append(np.arange(start + (2 * world_size - 1 - rank) * c,
                               start + (2 * world_size - rank) * c))
    return np.concatenate(parts) if parts else np.zeros((0,), dtype=np.int64)


_ORDER_CACHE = OrderedDict()


def _global_order(lengths, world_size, device):
    """(shard_order, global_from_shard): shard_order[i] is the global index of the i-th token of
    the ranks' parts laid end to end (rank 0's, then rank 1's, ...); global_from_shard is its
    inverse (for index_select from the concatenated parts into the whole tensor). int64 tensors
    on device."""
    def make():
        order = np.concatenate([_rank_positions(lengths, r, world_size)
                                for r in range(world_size)])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.shape[0])
        return (torch.from_numpy(order).to(device), torch.from_numpy(inverse).to(device))
    key = (tuple(lengths.tolist()), world_size, str(device))
    return _cached(_ORDER_CACHE, key, make)


def _split_args(x, layout, seq_dim, world_size, what):
    if not isinstance(x, torch.Tensor):
        raise InvalidArgumentError("%s takes a torch tensor, got %s" % (what, type(x).__name__))
    if seq_dim is None:
        layout = str(layout).lower()
        if layout not in _SEQ_DIM:
            raise InvalidArgumentError("layout = %r is not one of %s"
                                       % (layout, ", ".join(_SEQ_DIM)))
        seq_dim = _SEQ_DIM[layout]
    if not -x.dim() <= seq_dim < x.dim():
        raise InvalidArgumentError("seq_dim = %d is not an axis of a %d-d tensor"
                                   % (seq_dim, x.dim()))
    if world_size < 1:
        raise InvalidArgumentError("world_size = %d must be >= 1" % world_size)
    return seq_dim % x.dim()


def shard(x, rank, world_size, *, layout="bshd", seq_dim=None, cu_seqlens=None):
    """Rank `rank`'s part of a whole tensor x: chunks rank and 2N-1-rank of the sequence axis
    (of every sequence, for THD with cu_seqlens), N = world_size. layout names the axis ("bshd":
    1, "sbhd": 0, "bhsd": 2, "thd": 0); seq_dim overrides it (an LSE: 2 for [batch, heads, seq],
    0 for THD's [tokens, heads]). Differentiable; any device."""
    dim = _split_args(x, layout, seq_dim, world_size, "shard")
    if not 0 <= rank < world_size:
        raise InvalidArgumentError("rank = %d is not in [0, world_size = %d)" % (rank, world_size))
    lengths = _whole_lengths(x.shape[dim], cu_seqlens, world_size)
    index = torch.from_numpy(_rank_positions(lengths, rank, world_size)).to(x.device)
    return x.index_select(dim, index)


def unshard(parts, *, layout="bshd", seq_dim=None, cu_seqlens=None):
    """The whole tensor from every rank's part (parts[r] = shard(x, r, len(parts), ...)): the
    inverse of shard(). Differentiable; any device."""
    parts = list(parts)
    if not parts:
        raise InvalidArgumentError("unshard needs the parts of every rank, got none")
    dim = _split_args(parts[0], layout, seq_dim, len(parts), "unshard")
    joined = torch.cat(parts, dim)
    lengths = _whole_lengths(joined.shape[dim], cu_seqlens, len(parts))
    _, inverse = _global_order(lengths, len(parts), joined.device)
    return joined.index_select(dim, inverse)


def _whole_lengths(tokens, cu_seqlens, world_size):
    """The lengths of the whole sequences: from cu_seqlens (THD), else one sequence of
    `tokens`."""
    if cu_seqlens is None:
        lengths = np.asarray([tokens], dtype=np.int64)
        _check_divisible(lengths, world_size, "the sequence axis")
        return lengths
    lengths = _lengths_of(cu_seqlens, "cu_seqlens")
    if lengths.sum() != tokens:
        raise InvalidArgumentError("cu_seqlens covers %d tokens but the tensor has %d on its "
                                   "sequence axis" % (lengths.sum(), tokens))
    _check_divisible(lengths, world_size, "cu_seqlens")
    return lengths


# ---------------------------------------------------------------------------------------------
# Planning a block: which rows see which keys, as calls of the library
# ---------------------------------------------------------------------------------------------
#
# Positions are those inside a sequence. The problem's mask and window show key j to query i
# when lo <= j - i <= hi (fusedattn.h: d = i, or i + sk - sq for bottom-right masks, and
# lo = d - i - left, hi = d - i + right, unbounded sides +-inf); src/common/band.h is the same
# rule in C++.
#
# A rank's queries are pieces (chunks) of the sequence, and so are the keys of a block. In an
# m x n rectangle of queries and keys whose global positions are offset by a constant, the keys
# shown are those of a band again, shifted by that offset; which cells it shows depends only on
# the diagonals t = j - i it covers, clamped to [-(m-1), n-1]. Two bands show the same cells of
# a rectangle exactly when their clamped intervals are equal, which is how a plan checks that
# one library call can cover several pieces (their local concatenation is offset from the
# global positions by a different constant per piece). A call then runs on the rows and keys
# that see something (trimmed), where the band, aligned to the bottom right of the trimmed
# rectangle, always has window_left, window_right >= 0 (or unbounded): the library's mask None
# with that window, or a causal mask when window_right is 0.
#
# Everything is vectorized over sequences (NumPy float64: exact for positions < 2^53, with
# +-inf for unbounded sides): one sequence for the dense layouts, every packed sequence for THD.

# A piece: per sequence, where its tokens start in the local tensor, how many, and the position
# of its first token inside the sequence.
_Piece = namedtuple("_Piece", "local length start")
_INF = math.inf


def _diagonals(m, n, a, b):
    """(lo, hi, shown): the diagonals t = j - i in [a, b] that an m x n rectangle has."""
    lo = np.maximum(a, -(m - 1))
    hi = np.minimum(b, n - 1)
    return lo, hi, (lo <= hi) & (m > 0) & (n > 0)


def _same(one, other):
    lo1, hi1, shown1 = one
    lo2, hi2, shown2 = other
    return (shown1 == shown2) & (~shown1 | ((lo1 == lo2) & (hi1 == hi2)))


def _solve_rectangle(q_pieces, kv_pieces, lo, hi):
    """For the rectangle of the q pieces (consecutive in local memory) by the kv pieces: per
    sequence (solved, shown, a, b): whether one band a <= j - i <= b in the rectangle's own
    coordinates shows exactly what the problem's band shows in each piece pair, and whether it
    shows anything."""
    blocks, row = [], 0.0
    for qp in q_pieces:
        col = 0.0
        for kp in kv_pieces:
            offset = qp.start - kp.start  # j - i in the pair's coordinates = global j - i + this
            true = _diagonals(qp.length, kp.length, lo + offset, hi + offset)
            blocks.append((qp, kp, row, col, offset, true))
            col = col + kp.length
        row = row + qp.length
    shown = np.zeros_like(lo, dtype=bool)
    for block in blocks:
        shown |= block[5][2]
    # A band that works is the problem's band moved by the offset of one of the pairs (or one
    # that shows every cell): try each.
    candidates = [(lo + offset + col - row, hi + offset + col - row)
                  for _, _, row, col, offset, _ in blocks]
    candidates.append((np.full_like(lo, -_INF), np.full_like(hi, _INF)))
    solved = np.zeros_like(shown)
    a, b = np.full_like(lo, np.nan), np.full_like(hi, np.nan)
    for cand_a, cand_b in candidates:
        ok = ~solved
        for qp, kp, row, col, _, true in blocks:
            ok &= _same(_diagonals(qp.length, kp.length, cand_a - col + row, cand_b - col + row),
                        true)
        a, b = np.where(ok, cand_a, a), np.where(ok, cand_b, b)
        solved |= ok
    return solved | ~shown, shown, a, b


def _trim(m, n, a, b):
    """The rows [r0, r0 + rows) and keys [k0, k0 + keys) of an m x n rectangle under the band
    a <= j - i <= b that see / are seen by something, and the band as the library's bottom-right
    window (left, right) there, -1 where that side hides nothing. Meaningful where the band
    shows something."""
    with np.errstate(invalid="ignore"):
        r0 = np.maximum(0, -b)
        r1 = np.minimum(m - 1, n - 1 - a)
        k0 = np.maximum(0, a)
        k1 = np.minimum(n - 1, m - 1 + b)
        rows, keys = r1 - r0 + 1, k1 - k0 + 1
        a2, b2 = a + r0 - k0, b + r0 - k0           # the band in the trimmed rectangle
        shift = keys - rows                         # bottom-right: d = i + keys - rows
        left = np.where(a2 <= -(rows - 1), -1, shift - a2)
        right = np.where(b2 >= keys - 1, -1, b2 - shift)
    return r0, rows, k0, keys, left, right


def _coverings(nq, nk):
    """Ways to cover nq x nk piece pairs with rectangles (q range, kv range), fewest first."""
    whole = [((0, nq), (0, nk))]
    out = [whole]
    if nq > 1:
        out.append([((x, x + 1), (0, nk)) for x in range(nq)])
    if nk > 1:
        out.append([((0, nq), (y, y + 1)) for y in range(nk)])
    if nq > 1 and nk > 1:
        out.append([((x, x + 1), (y, y + 1)) for x in range(nq) for y in range(nk)])
    return out


# One library call of a block: per sequence in it (THD: every sequence with rows in this call;
# dense: the one), the first local row and the number of rows, the first key of the block and
# the number of keys; the bottom-right window (left, right). Planned for dropout (positions),
# also the index of its first sequence and the positions inside the sequence of its first row
# and first key, the same for every sequence of the call (else None).
_CallSpec = namedtuple("_CallSpec", "q_start q_len k_start k_len left right seq0 q_pos k_pos",
                       defaults=(None, None, None))


def _plan_block(q_pieces, kv_pieces, lo, hi, positions=False):
    """The calls that compute the attention of the q pieces over the kv pieces: one per
    rectangle of a covering and distinct window, fewest calls per sequence.

    positions (dropout): every call lies inside one q piece and one kv piece, so that its rows
    and keys are the sequence's at a constant offset, which the call's dropout positions give
    (the library draws the whole problem's mask there); a call's first key is moved down to a
    multiple of 4 of the sequence (the positions' key offset must be one: the mask draws keys in
    groups of four) by taking in up to 3 more keys of its piece, which its window hides; and a
    THD call holds consecutive sequences whose calls start at the same positions."""
    coverings = _coverings(len(q_pieces), len(kv_pieces))
    if positions:
        coverings = coverings[-1:]  # the finest: one rectangle per piece pair
    solved = {}
    for covering in coverings:
        for rect in covering:
            if rect not in solved:
                (qs, qe), (ks, ke) = rect
                solved[rect] = _solve_rectangle(q_pieces[qs:qe], kv_pieces[ks:ke], lo, hi)
    costs = []
    for covering in coverings:
        valid = np.ones_like(lo, dtype=bool)
        cost = np.zeros_like(lo)
        for rect in covering:
            ok, shown, _, _ = solved[rect]
            valid &= ok
            cost = cost + shown
        costs.append(np.where(valid, cost, _INF))
    choice = np.argmin(np.stack(costs), axis=0)  # the first of the cheapest
    calls = []
    for c, covering in enumerate(coverings):
        for rect in covering:
            _, shown, a, b = solved[rect]
            members = (choice == c) & shown
            if not members.any():
                continue
            (qs, qe), (ks, ke) = rect
            m = sum(p.length for p in q_pieces[qs:qe])
            n = sum(p.length for p in kv_pieces[ks:ke])
            r0, rows, k0, keys, left, right = _trim(m, n, a, b)
            q_start = q_pieces[qs].local + r0
            k_start = kv_pieces[ks].local + k0
            if positions:
                q_pos = q_pieces[qs].start + r0
                k_pos = kv_pieces[ks].start + k0
                with np.errstate(invalid="ignore"):
                    more = np.where(members, np.mod(k_pos, 4), 0)
                    if (more > k0)[members].any():  # _check_dropout_split refuses these
                        raise NotSupportedError("dropout: a block's keys start off a multiple "
                                                "of 4 at the start of a chunk")
                    # Keys taken in on the left stay hidden when the window's left side is
                    # bounded: k0 > 0 here, so the band starts at the trimmed rectangle's
                    # diagonal r0 >= 0 and left = keys - rows - r0 (what _trim writes, except
                    # for one row, where it writes -1: unbounded hides nothing there).
                    left = np.where(more > 0, keys - rows - r0, left)
                k_start, keys, k_pos = k_start - more, keys + more, k_pos - more
            windows = np.stack((left, right), axis=1)[members]
            for window in np.unique(windows, axis=0):
                group = members & (left == window[0]) & (right == window[1])
                fields = [x[group].astype(np.int64) for x in (q_start, rows, k_start, keys)]
                if not positions:
                    calls.append(_CallSpec(*fields, int(window[0]), int(window[1])))
                    continue
                seqs = np.flatnonzero(group)
                q_at, k_at = q_pos[group], k_pos[group]
                breaks = np.flatnonzero((np.diff(seqs) != 1) | (np.diff(q_at) != 0) |
                                        (np.diff(k_at) != 0)) + 1
                for run in np.split(np.arange(seqs.size), breaks):
                    calls.append(_CallSpec(*(f[run] for f in fields), int(window[0]),
                                           int(window[1]), int(seqs[run[0]]),
                                           int(q_at[run[0]]), int(k_at[run[0]])))
    return calls


def _pieces(lengths, rank, world_size):
    """A rank's two pieces of every sequence (chunks rank and 2N-1-rank), float64 arrays."""
    chunk = (lengths // (2 * world_size)).astype(np.float64)
    local = 2 * np.concatenate(([0.0], np.cumsum(chunk)[:-1]))
    return [_Piece(local, chunk, rank * chunk),
            _Piece(local + chunk, chunk, (2 * world_size - 1 - rank) * chunk)]


def _band(opts, lengths_q, lengths_kv):
    """(lo, hi) per sequence: key j is shown to query i when lo <= j - i <= hi."""
    causal = opts.mask in _CAUSAL_MASKS
    bottom_right = opts.mask not in _TOP_LEFT_MASKS
    shift = (lengths_kv - lengths_q).astype(np.float64) if bottom_right else \
        np.zeros(lengths_q.shape)
    left = _INF if opts.window_left < 0 else float(opts.window_left)
    right = 0.0 if causal else (_INF if opts.window_right < 0 else float(opts.window_right))
    return shift - left, shift + right


# ---------------------------------------------------------------------------------------------
# A call of the library on a block, and where its rows go
# ---------------------------------------------------------------------------------------------


class _DenseCall:
    """A call on rows [q_start, q_start + q_len) of the local queries and keys [k_start, ...)
    of the block (views along the sequence axis; the same for every batch entry)."""

    def __init__(self, spec, layout, dropout_rows):
        self.q_start, self.q_len = int(spec.q_start[0]), int(spec.q_len[0])
        self.k_start, self.k_len = int(spec.k_start[0]), int(spec.k_len[0])
        self.seq_dim = _SEQ_DIM[layout]
        if spec.right == 0:
            mask = "causal" if self.q_len == self.k_len else "causal_bottom_right"
        else:
            mask = None
        self.kwargs = dict(layout=layout, mask=mask, window=(spec.left, spec.right))
        if spec.q_pos is not None:  # dropout: the whole sequence's mask at the call's place
            self.kwargs["dropout_positions"] = DropoutPositions(
                rows=dropout_rows, row_offset=spec.q_pos, key_offset=spec.k_pos)

    def rows(self, x):
        return x.narrow(self.seq_dim, self.q_start, self.q_len)

    def lse_rows(self, lse):
        return lse.narrow(2, self.q_start, self.q_len)

    def keys(self, x):
        return x.narrow(self.seq_dim, self.k_start, self.k_len)

    def written(self, lse_block):
        return lse_block  # every row of the call is written

    def covers(self, q, seq_dim):
        """Whether the call's rows are all of q's."""
        return self.q_start == 0 and self.q_len == q.shape[seq_dim]

    def add_rows(self, acc, part):
        self.rows(acc).add_(part)

    def add_keys(self, acc, part):
        self.keys(acc).add_(part)


class _PackedCall:
    """A THD call on the whole local tensors: per sequence in it, its rows and keys through
    cu_seqlens and seq_offsets (the library writes only those rows; dQ/dK/dV are zero
    elsewhere)."""

    def __init__(self, spec, device, total_q, dropout_rows):
        def int32(x):
            return torch.from_numpy(np.asarray(x, dtype=np.int32)).to(device)
        zero = np.zeros((1,), dtype=np.int64)
        mask = "causal_bottom_right" if spec.right == 0 else None
        self.kwargs = dict(
            layout="thd", mask=mask, window=(spec.left, spec.right),
            cu_seqlens_q=int32(np.concatenate((zero, np.cumsum(spec.q_len)))),
            cu_seqlens_kv=int32(np.concatenate((zero, np.cumsum(spec.k_len)))),
            seq_offsets_q=int32(np.concatenate((spec.q_start, spec.q_start[-1:] + spec.q_len[-1:]))),
            seq_offsets_kv=int32(np.concatenate((spec.k_start,
                                                 spec.k_start[-1:] + spec.k_len[-1:]))),
            max_seqlen_q=int(spec.q_len.max()), max_seqlen_kv=int(spec.k_len.max()))
        if spec.q_pos is not None:  # dropout: sequence seq0 + b of the whole problem, at the
            # call's place in it (the same for each of its sequences)
            self.kwargs["dropout_positions"] = DropoutPositions(
                batch_offset=spec.seq0, rows=dropout_rows, row_offset=spec.q_pos,
                key_offset=spec.k_pos)
        # The rows this call writes (the others' LSE is left at 0 by the operator).
        marks = np.zeros((total_q + 1,), dtype=np.int64)
        np.add.at(marks, spec.q_start, 1)
        np.add.at(marks, spec.q_start + spec.q_len, -1)
        self.row_mask = torch.from_numpy(np.cumsum(marks)[:-1] > 0).to(device)

    def rows(self, x):
        return x

    def lse_rows(self, lse):
        return lse

    def keys(self, x):
        return x

    def written(self, lse_block):
        return torch.where(self.row_mask[:, None], lse_block, -_INF)

    def covers(self, q, seq_dim):
        return False  # (rarely all rows: merged like the others)

    def add_rows(self, acc, part):
        acc.add_(part)

    def add_keys(self, acc, part):
        acc.add_(part)


# ---------------------------------------------------------------------------------------------
# The problem, checked once per call
# ---------------------------------------------------------------------------------------------

_PLAN_CACHE = OrderedDict()


class _Problem:
    """What every mode needs to know about one call: the options, this rank's place, the whole
    sequences' lengths, the options every library call takes (softcap, scale, backend, ...) and
    the plans of the blocks (cached across calls: a model's layers share them)."""

    def __init__(self, opts, rank, world, lengths_q, lengths_kv, heads_q, device, softmax,
                 group=None, dropout_rows=0):
        self.opts, self.layout, self.thd = opts, opts.layout, opts.layout == "thd"
        self.rank, self.world, self.group = rank, world, group
        self.seq_dim, self.head_dim = _SEQ_DIM[self.layout], _HEAD_DIM[self.layout]
        self.lengths_q, self.lengths_kv = lengths_q, lengths_kv
        self.heads_q, self.device = heads_q, device
        self.library = dict(softcap=opts.softcap, scale=opts.scale or None,
                            deterministic=opts.deterministic, backend=opts.backend)
        # Dropout: the seed (the same on every rank) and the whole problem's max_seqlen_q, which
        # numbers the mask's rows (fusedattn.h, "Dropout mask"); every call gives its place.
        self.dropout = opts.dropout_p > 0
        self.dropout_rows = int(dropout_rows) if self.dropout else 0
        if self.dropout:
            self.library.update(dropout_p=opts.dropout_p, dropout_seed=opts.dropout_seed)
        # The whole problem's own arguments (all_to_all runs it as it is, on a head group).
        self.whole = dict(layout=self.layout, mask=opts.mask,
                          window=(opts.window_left, opts.window_right), softmax=softmax)
        if self.thd:
            self.whole.update(cu_seqlens_q=_int32_cumsum(lengths_q, device),
                              cu_seqlens_kv=_int32_cumsum(lengths_kv, device),
                              max_seqlen_q=int(lengths_q.max(initial=0)),
                              max_seqlen_kv=int(lengths_kv.max(initial=0)))

    def extra_logit(self, sinks):
        """The softmax's extra logit per head (sink: the learnable one; off-by-one: 0), None for
        the vanilla softmax."""
        if self.opts.softmax == "learnable_sink":
            return sinks.float()
        if self.opts.softmax == "off_by_one":
            return torch.zeros((self.heads_q,), dtype=torch.float32, device=self.device)
        return None

    def head_group_dropout(self, rank):
        """all_to_all: the dropout positions of head group `rank`'s call over the whole
        sequence (its heads are the whole problem's from rank * heads_q / N), as arguments."""
        if not self.dropout:
            return {}
        return dict(dropout_positions=DropoutPositions(
            heads=self.heads_q, head_offset=rank * (self.heads_q // self.world),
            rows=self.dropout_rows))

    def plan(self, kv_rank):
        """The calls of this rank's queries against the K/V that rank kv_rank holds (ring), or
        against the whole gathered K/V in global order (kv_rank None: all_gather)."""
        o = self.opts
        key = (self.rank, self.world, kv_rank, tuple(self.lengths_q.tolist()),
               tuple(self.lengths_kv.tolist()), o.mask, o.window_left, o.window_right,
               self.layout, str(self.device), self.dropout, self.dropout_rows)

        def make():
            lo, hi = _band(o, self.lengths_q, self.lengths_kv)
            q_pieces = _pieces(self.lengths_q, self.rank, self.world)
            if kv_rank is None:
                kv_pieces = [_Piece(np.concatenate(([0.0], np.cumsum(self.lengths_kv)[:-1])),
                                    self.lengths_kv.astype(np.float64),
                                    np.zeros(self.lengths_kv.shape))]
            else:
                kv_pieces = _pieces(self.lengths_kv, kv_rank, self.world)
            specs = _plan_block(q_pieces, kv_pieces, lo, hi, positions=self.dropout)
            if self.thd:
                total_q = int(self.lengths_q.sum()) // self.world
                return [_PackedCall(s, self.device, total_q, self.dropout_rows) for s in specs]
            return [_DenseCall(s, self.layout, self.dropout_rows) for s in specs]
        return _cached(_PLAN_CACHE, key, make)


def _int32_cumsum(lengths, device):
    cu = np.concatenate(([0], np.cumsum(lengths)))
    return torch.from_numpy(cu.astype(np.int32)).to(device)


def _lse_shape(layout, q):
    if layout == "thd":
        return (q.shape[0], q.shape[1])
    b, s, h = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}[layout]
    return (q.shape[b], q.shape[h], q.shape[s])


def _lse_in_o_order(lse, layout):
    """A view of an LSE ([batch, heads, seq] or [tokens, heads]) with o's axes but head_dim
    ([.., heads, ..] in o's order), to broadcast against o with [..., None]."""
    if layout == "bshd":
        return lse.transpose(1, 2)
    if layout == "sbhd":
        return lse.permute(2, 0, 1)
    return lse  # bhsd: [batch, heads, seq]; thd: [tokens, heads]


def _per_head(x, lse):
    """x [heads] shaped to broadcast against an LSE ([batch, heads, seq] or [tokens, heads])."""
    return x[None, :, None] if lse.dim() == 3 else x[None, :]


# ---------------------------------------------------------------------------------------------
# Ring
# ---------------------------------------------------------------------------------------------


def _merge(o_acc, lse_acc, o_block, lse_block, layout):
    """o_acc, lse_acc <- the attention over the keys of both, merged exactly by log-sum-exp.
    o_acc float32 in o's layout, lse_acc float32 in the LSE's (views of the rows a call wrote);
    a row that has seen no key yet keeps O = 0 and LSE = -inf. Two passes over O (it is 128
    times the LSE's size): scale, then add the block's share."""
    lse_new = torch.logaddexp(lse_acc, lse_block)
    seen = lse_new > -_INF
    w_acc = torch.where(seen, torch.exp(lse_acc - lse_new), 0.0)
    w_block = torch.where(seen, torch.exp(lse_block - lse_new), 0.0)
    o_acc.mul_(_lse_in_o_order(w_acc, layout).unsqueeze(-1))
    o_acc.addcmul_(o_block, _lse_in_o_order(w_block, layout).unsqueeze(-1))
    lse_acc.copy_(lse_new)


def _add_extra_logit(o_acc, lse, extra, layout):
    """The merged vanilla result with the softmax's extra logit (off-by-one, sink): the
    denominator gains exp(extra), so O shrinks by exp(lse - lse'). Rows that see no key keep
    LSE = -inf and O = 0 (fusedattn.h). Returns lse'."""
    seen = lse > -_INF
    lse_new = torch.where(seen, torch.logaddexp(lse, _per_head(extra, lse)), lse)
    shrink = torch.where(seen, torch.exp(lse - lse_new), 0.0)
    o_acc.mul_(_lse_in_o_order(shrink, layout).unsqueeze(-1))
    return lse_new


def _ring_forward(prob, q, head_dim_v, blocks):
    """This rank's O (float32, q's layout) and vanilla LSE from the K/V blocks it is handed: an
    iterable of (kv_rank, k, v) in ring order."""
    o_acc = torch.zeros(tuple(q.shape[:-1]) + (head_dim_v,), dtype=torch.float32,
                        device=q.device)
    lse_acc = torch.full(_lse_shape(prob.layout, q), -_INF, dtype=torch.float32, device=q.device)
    merged = False
    for kv_rank, k, v in blocks:
        for call in prob.plan(kv_rank):
            o_block, lse_block = _api.attention(call.rows(q), call.keys(k), call.keys(v),
                                                return_lse=True, **call.kwargs, **prob.library)
            if not merged and call.covers(q, prob.seq_dim):  # the first block of every row
                o_acc.copy_(o_block)
                lse_acc.copy_(lse_block)
            else:
                _merge(call.rows(o_acc), call.lse_rows(lse_acc), o_block,
                       call.written(lse_block), prob.layout)
            merged = True
    return o_acc, lse_acc


def _ring_backward(prob, d_o, q, o, lse, blocks, dkv_sums):
    """This rank's dQ (float32) from the K/V blocks it is handed; each block's dK/dV (float32,
    packed as _pack packs K/V) goes to dkv_sums.add(kv_rank, part). o and lse are the final
    ones (with the extra logit): each block's backward is FlashAttention's identity with them."""
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for kv_rank, k, v in blocks:
        dkv = torch.zeros((k.numel() + v.numel(),), dtype=torch.float32, device=q.device)
        dk, dv = _unpack(dkv, k.shape, v.shape)
        for call in prob.plan(kv_rank):
            grads = _api.attention_backward(
                call.rows(d_o), call.rows(q), call.keys(k), call.keys(v), call.rows(o),
                call.lse_rows(lse), **call.kwargs, **prob.library)
            call.add_rows(dq, grads.dq)
            call.add_keys(dk, grads.dk)
            call.add_keys(dv, grads.dv)
        dkv_sums.add(kv_rank, dkv)
    return dq


def _sink_gradient(extra, d_o, o, lse, layout):
    """d loss / d sink[h] = -sum over this rank's rows of exp(sink[h] - LSE) D, D = dO . O
    (fusedattn.h); rows that see no key add nothing."""
    delta = (d_o.float() * o.float()).sum(-1)  # o's axes but head_dim, like _lse_in_o_order
    lse_o = _lse_in_o_order(lse, layout)
    heads_axis = 1 if layout in ("bhsd", "thd") else 2
    shape = [1] * delta.dim()
    shape[heads_axis] = -1
    term = torch.where(lse_o > -_INF, torch.exp(extra.view(shape) - lse_o) * delta, 0.0)
    return -term.sum([d for d in range(delta.dim()) if d != heads_axis])


def _pack(k, v):
    """K and V in one contiguous buffer: one transfer per step."""
    return torch.cat((k.reshape(-1), v.reshape(-1)))


def _unpack(buffer, k_shape, v_shape):
    nk = math.prod(k_shape)
    return buffer[:nk].view(k_shape), buffer[nk:].view(v_shape)


class _Ring:
    """Sends to rank r+1 and receives from rank r-1 of the group with batch_isend_irecv (NCCL
    runs the transfers on its own stream, gloo on its threads: both overlap the caller's work)."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def shift(self, send):
        """Starts sending `send` on and receiving the previous rank's tensor of the same shape:
        (received, works)."""
        received = torch.empty_like(send)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, send, self.next, self.group),
            dist.P2POp(dist.irecv, received, self.prev, self.group)])
        return received, works


def _wait(works):
    for work in works:
        work.wait()


def _rotating_blocks(ring, k, v):
    """Yields (kv_rank, k, v) of every rank in ring order, this rank's first; the next block's
    transfer runs while the consumer works on the current one."""
    buffer = _pack(k, v)
    for step in range(ring.size):
        works = None
        if step < ring.size - 1:
            received, works = ring.shift(buffer)
        yield ((ring.rank - step) % ring.size,) + _unpack(buffer, k.shape, v.shape)
        if works is not None:
            _wait(works)
            buffer = received


class _DkvRing:
    """dK/dV of the K/V block in hand travel with it: a rank adds its part to the sum the
    previous rank passed on and passes the sum to rank r+1; after N hops (the last after the
    last step) every block's sum is home. A transfer runs while the next block is computed."""

    def __init__(self, ring):
        self.ring = ring
        self.pending = None  # (sent buffer, received buffer, works) of the last transfer

    def add(self, kv_rank, dkv_part):
        if self.pending is not None:
            _, received, works = self.pending
            _wait(works)
            dkv_part = received.add_(dkv_part)
        received, works = self.ring.shift(dkv_part)
        self.pending = (dkv_part, received, works)  # the sent buffer lives until it is sent

    def result(self):
        _, received, works = self.pending
        _wait(works)
        return received


class _DkvSums:
    """dK/dV sums per K/V block in one process (a group of one rank, and simulate())."""

    def __init__(self):
        self.sums = {}

    def add(self, kv_rank, dkv_part):
        if kv_rank in self.sums:
            self.sums[kv_rank].add_(dkv_part)
        else:
            self.sums[kv_rank] = dkv_part

    def result(self, kv_rank=0):
        return self.sums[kv_rank]


def _check_blocks_run(prob, q, k, v, training):
    """Raises, on every rank alike and before any transfer, what the library would raise at the
    first block (a bad shape, or no backend for it): a rank that fails in the middle of the ring
    would leave its peers waiting."""
    for kv_rank in range(prob.world):
        for call in prob.plan(kv_rank)[:1]:
            config = _api.problem_config(call.rows(q), call.keys(k), call.keys(v),
                                         training=training, **call.kwargs, **prob.library)
            _C.get_backend(config, None)
            return


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, prob):
        o_acc, lse = _ring_forward(prob, q, v.shape[-1], _rotating_blocks(_Ring(prob.group), k, v))
        extra = prob.extra_logit(sinks)
        if extra is not None:
            lse = _add_extra_logit(o_acc, lse, extra, prob.layout)
        o = o_acc.to(q.dtype)
        ctx.prob = prob
        ctx.save_for_backward(q, k, v, sinks, o, lse)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, _):
        q, k, v, sinks, o, lse = ctx.saved_tensors
        prob = ctx.prob
        d_o = d_o.contiguous()
        ring = _Ring(prob.group)
        dkv_sums = _DkvRing(ring) if ring.size > 1 else _DkvSums()
        dq = _ring_backward(prob, d_o, q, o, lse, _rotating_blocks(ring, k, v), dkv_sums)
        dk, dv = _unpack(dkv_sums.result(), k.shape, v.shape)
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            dsinks = _sink_gradient(sinks.float(), d_o, o, lse, prob.layout).to(sinks.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks, None


# ---------------------------------------------------------------------------------------------
# all_gather
# ---------------------------------------------------------------------------------------------


class _AllGatherSequence(torch.autograd.Function):
    """Every rank's part of x gathered along the sequence axis into the whole tensor in global
    order; the backward reduce-scatters the gradient (a rank gets the sum over the ranks of the
    gradient of its own part)."""

    @staticmethod
    def forward(ctx, x, group, seq_dim, global_from_shard, shard_order):
        world = dist.get_world_size(group)
        x = x.contiguous()
        gathered = x.new_empty((world * x.numel(),))  # flat: the ranks' parts end to end
        dist.all_gather_into_tensor(gathered, x.view(-1), group=group)
        gathered = gathered.view((world,) + tuple(x.shape))
        ctx.group, ctx.seq_dim, ctx.shard_order, ctx.local_shape = \
            group, seq_dim, shard_order, x.shape
        # [world, .., s_local, ..] -> [.., world * s_local, ..] in the ranks' order -> global
        joined = gathered.movedim(0, seq_dim).flatten(seq_dim, seq_dim + 1)
        return joined.index_select(seq_dim, global_from_shard)

    @staticmethod
    def backward(ctx, grad):
        world = dist.get_world_size(ctx.group)
        in_rank_order = grad.index_select(ctx.seq_dim, ctx.shard_order)
        s_local = ctx.local_shape[ctx.seq_dim]
        stacked = in_rank_order.unflatten(ctx.seq_dim, (world, s_local)).movedim(ctx.seq_dim, 0)
        out = grad.new_empty(ctx.local_shape)
        dist.reduce_scatter_tensor(out.view(-1), stacked.contiguous().view(-1), group=ctx.group)
        return out, None, None, None, None


class _NoKeySeen(torch.autograd.Function):
    """Zeros of `shape` that depend on q, k and v with zero gradients: the output of a rank
    whose queries see no key, kept in the autograd graph of the collectives before it."""

    @staticmethod
    def forward(ctx, shape, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.new_zeros(shape)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return None, torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


def _attend_gathered(prob, q, k, v, sinks):
    """This rank's queries over the whole K/V (global order), through fusedattn.attention's
    autograd: (o, lse). Every query row is in one call (or in none: it sees no key), so the
    softmax's extra logit goes to the calls as it is."""
    extra = dict(softmax=prob.whole["softmax"], sinks=sinks)
    lse_shape = _lse_shape(prob.layout, q)
    o_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    calls = prob.plan(None)
    if not calls:
        # None of this rank's queries sees a key: O = 0, LSE = -inf, but O must still depend on
        # the gathered K/V so that this rank's backward runs _AllGatherSequence's reduce-scatter
        # with the others (without it the others would wait for it forever).
        return (_NoKeySeen.apply(o_shape, q, k, v),
                torch.full(lse_shape, -_INF, device=q.device))
    if prob.thd:
        o, lse = q.new_zeros(o_shape), torch.full(lse_shape, -_INF, device=q.device)
        for call in calls:  # each writes its own rows (zeros elsewhere)
            o_call, lse_call = _api.attention(q, k, v, return_lse=True, **call.kwargs,
                                              **prob.library, **extra)
            o = o + o_call
            lse = torch.maximum(lse, call.written(lse_call))
        return o, lse
    # Dense: the calls' rows are disjoint ranges; the rows between them see nothing (O = 0).
    o_parts, lse_parts, row = [], [], 0

    def unseen(rows):
        shape, lse_rows = list(o_shape), list(lse_shape)
        shape[prob.seq_dim], lse_rows[2] = rows, rows
        o_parts.append(q.new_zeros(shape))
        lse_parts.append(torch.full(lse_rows, -_INF, device=q.device))

    for call in sorted(calls, key=lambda c: c.q_start):
        if call.q_start > row:
            unseen(call.q_start - row)
        o_call, lse_call = _api.attention(call.rows(q), call.keys(k), call.keys(v),
                                          return_lse=True, **call.kwargs, **prob.library, **extra)
        o_parts.append(o_call)
        lse_parts.append(lse_call)
        row = call.q_start + call.q_len
    if row < q.shape[prob.seq_dim]:
        unseen(q.shape[prob.seq_dim] - row)
    return torch.cat(o_parts, prob.seq_dim), torch.cat(lse_parts, 2)


def _all_gather_attention(prob, q, k, v, sinks):
    shard_order, global_from_shard = _global_order(prob.lengths_kv, prob.world, q.device)
    k_all = _AllGatherSequence.apply(k, prob.group, prob.seq_dim, global_from_shard, shard_order)
    v_all = _AllGatherSequence.apply(v, prob.group, prob.seq_dim, global_from_shard, shard_order)
    o, lse = _attend_gathered(prob, q, k_all, v_all, sinks)
    return o, lse.detach()


# ---------------------------------------------------------------------------------------------
# all_to_all (Ulysses)
# ---------------------------------------------------------------------------------------------


def _heads_to_sequence(x, group, seq_dim, head_dim, global_from_shard):
    """This rank's part of the sequence with every head -> the whole sequence (global order)
    with head group r (heads / N of them) on rank r."""
    world = dist.get_world_size(group)
    send = x.unflatten(head_dim, (world, x.shape[head_dim] // world)).movedim(head_dim, 0)
    send = send.contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    # received[i]: rank i's part of the sequence, this rank's head group
    joined = received.movedim(0, seq_dim).flatten(seq_dim, seq_dim + 1)
    return joined.index_select(seq_dim, global_from_shard)


def _sequence_to_heads(x, group, seq_dim, head_dim, shard_order):
    """The inverse of _heads_to_sequence."""
    world = dist.get_world_size(group)
    in_rank_order = x.index_select(seq_dim, shard_order)
    s_local = x.shape[seq_dim] // world
    send = in_rank_order.unflatten(seq_dim, (world, s_local)).movedim(seq_dim, 0).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    # received[i]: this rank's part of the sequence, head group i
    return received.movedim(0, head_dim).flatten(head_dim, head_dim + 1)


class _AllToAll(torch.autograd.Function):
    """_heads_to_sequence (to_sequence) or _sequence_to_heads, the other one its backward."""

    @staticmethod
    def forward(ctx, x, to_sequence, group, seq_dim, head_dim, order):
        ctx.args = (to_sequence, group, seq_dim, head_dim, order)
        return _all_to_all(x, to_sequence, group, seq_dim, head_dim, order)

    @staticmethod
    def backward(ctx, grad):
        to_sequence, group, seq_dim, head_dim, order = ctx.args
        return (_all_to_all(grad, not to_sequence, group, seq_dim, head_dim, order),
                None, None, None, None, None)


def _all_to_all(x, to_sequence, group, seq_dim, head_dim, order):
    shard_order, global_from_shard = order
    if to_sequence:
        return _heads_to_sequence(x, group, seq_dim, head_dim, global_from_shard)
    return _sequence_to_heads(x, group, seq_dim, head_dim, shard_order)


def _repeat_kv_heads(k, v, world, head_dim):
    """GQA/MQA with heads_kv not a multiple of the ranks: each K/V head repeated until it is, so
    that every rank's query heads find theirs (autograd sums the copies' gradients)."""
    heads_kv = k.shape[head_dim]
    if heads_kv % world == 0:
        return k, v
    repeat = world // math.gcd(heads_kv, world)
    return k.repeat_interleave(repeat, dim=head_dim), v.repeat_interleave(repeat, dim=head_dim)


def _head_group(x, rank, world):
    """Head group `rank` of a per-head tensor [heads] (sinks, ALiBi slopes), or None."""
    if x is None:
        return None
    n = x.shape[0] // world
    return x[rank * n:(rank + 1) * n]


def _ulysses_attention(prob, q, k, v, sinks, alibi_slopes, return_lse):
    group, world, rank = prob.group, prob.world, prob.rank
    k, v = _repeat_kv_heads(k, v, world, prob.head_dim)
    order_q = _global_order(prob.lengths_q, world, q.device)
    order_kv = _global_order(prob.lengths_kv, world, q.device)
    sd, hd = prob.seq_dim, prob.head_dim
    q_all = _AllToAll.apply(q, True, group, sd, hd, order_q)
    k_all = _AllToAll.apply(k, True, group, sd, hd, order_kv)
    v_all = _AllToAll.apply(v, True, group, sd, hd, order_kv)
    o_all, lse_all = _api.attention(q_all, k_all, v_all, return_lse=True,
                                    sinks=_head_group(sinks, rank, world),
                                    alibi_slopes=_head_group(alibi_slopes, rank, world),
                                    **prob.library, **prob.whole,
                                    **prob.head_group_dropout(rank))
    o = _AllToAll.apply(o_all, False, group, sd, hd, order_q)
    lse = None
    if return_lse:  # [batch, heads, seq] or [tokens, heads]: heads on axis 1 in both
        lse = _sequence_to_heads(lse_all.detach(), group, _LSE_SEQ_DIM[prob.layout], 1,
                                 order_q[0])
    return o, lse


# ---------------------------------------------------------------------------------------------
# The entry points
# ---------------------------------------------------------------------------------------------


def context_parallel_attention(q, k, v, *, group=None, mode="ring", layout="bshd", mask=None,
                               window=(-1, -1), softcap=0.0, sinks=None, softmax=None,
                               scale=None, alibi_slopes=None, cu_seqlens_q=None,
                               cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                               deterministic=False, backend="auto", return_lse=False,
                               dropout_p=0.0, dropout_seed=None, bias=None,
                               bias_type="post_scale", seq_offsets_q=None, seq_offsets_kv=None,
                               score_mod=None, mask_mod=None):
    """fusedattn.attention over a sequence split across the ranks of `group` (a
    torch.distributed process group; None: the default group), with autograd.

    q, k, v: this rank's part (shard(): chunks r and 2N-1-r of the sequence axis, of every
    sequence for "thd"), in `layout`. mode: "ring", "all_to_all" or "all_gather" (the module's
    docstring). The problem arguments are fusedattn.attention's, for the whole sequence: mask
    (bottom-right masks and windows align to the ends of the whole sequences), window,
    softcap, sinks / softmax, scale, GQA (heads_kv dividing heads_q), THD with cu_seqlens_q /
    cu_seqlens_kv of the whole sequences (read on the host; every length a multiple of 2N;
    max_seqlen_q/kv, when given, must cover them), deterministic, backend; alibi_slopes under
    "all_to_all"; dropout_p with dropout_seed (the single-device call's mask; None: drawn on
    the group's first rank and broadcast; "ring" needs key lengths that are multiples of
    8 x world_size; see the module's docstring). bias, score_mod / mask_mod and
    seq_offsets_q/kv raise NotSupportedError saying why.

    Returns this rank's part of o (q's layout and dtype), or (o, lse) with return_lse (lse:
    this rank's part, float32 [batch, heads_q, seq_local] or [tokens_local, heads_q], not
    differentiable). Gradients flow to q, k, v (this rank's parts) and to sinks (this rank's
    share: sum it over the group, as the data-parallel reduction does)."""
    if mode not in MODES:
        raise InvalidArgumentError("mode = %r is not one of %s" % (mode, ", ".join(MODES)))
    if group is None:
        if not dist.is_available() or not dist.is_initialized():
            raise InvalidArgumentError(
                "context_parallel_attention needs torch.distributed: call "
                "torch.distributed.init_process_group first, or pass group")
        group = dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if dropout_p and float(dropout_p) > 0 and dropout_seed is None:
        dropout_seed = _agreed_seed(group, q.device)
    prob = _make_problem(q, k, v, mode, rank, world, group, dict(
        layout=layout, mask=mask, window=window, softcap=softcap, sinks=sinks, softmax=softmax,
        scale=scale, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
        deterministic=deterministic, backend=backend, dropout_p=dropout_p,
        dropout_seed=dropout_seed, bias=bias, bias_type=bias_type, seq_offsets_q=seq_offsets_q,
        seq_offsets_kv=seq_offsets_kv, score_mod=score_mod, mask_mod=mask_mod))
    if mode == "ring":
        training = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, sinks))
        _check_blocks_run(prob, q, k, v, training)
        o, lse = _RingAttention.apply(q, k, v, sinks, prob)
    elif mode == "all_gather":
        o, lse = _all_gather_attention(prob, q, k, v, sinks)
    else:
        o, lse = _ulysses_attention(prob, q, k, v, sinks, alibi_slopes, return_lse)
    return (o, lse) if return_lse else o


def _draw_seed():
    """A dropout seed from torch's default CPU generator (as fusedattn's SDPA drop-in draws
    them): torch.manual_seed repeats it, and torch.utils.checkpoint, which restores torch's
    generators before it recomputes a forward, draws the same one again (Python's `random` would
    give the recomputed forward another mask than the one whose loss is differentiated)."""
    return int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))


def _agreed_seed(group, device):
    """A dropout seed drawn on the group's first rank and broadcast: every rank's calls draw one
    mask (fusedattn.attention draws its own seed for dropout_seed=None, which differs by rank)."""
    seed = torch.tensor([_draw_seed()], dtype=torch.int64, device=device)
    dist.broadcast(seed, dist.get_global_rank(group, 0), group=group)
    return int(seed.item())


def simulate(q, k, v, world_size, *, mode="ring", d_o=None, ranks=None, **problem):
    """Every rank's part of context_parallel_attention computed in this process, without
    communication: to check the split against the single-device call on one device, or to time
    one rank's work. q, k, v (and d_o, the gradient of o) are the WHOLE tensors; problem:
    context_parallel_attention's problem arguments (cu_seqlens of the whole sequences).

    Returns, per rank, a dict with its part of o and lse and, when d_o is given, of dq, dk, dv,
    and its share of the sinks' gradient ("dsinks", None without sinks). "ring" and
    "all_gather" run each rank's blocks, library calls and merges exactly as under
    torch.distributed; `ranks` (default: all) picks the ranks to run there (dK/dV then sum only
    their contributions). "all_to_all" runs head group r over the whole sequence for rank r,
    every rank."""
    if mode not in MODES:
        raise InvalidArgumentError("mode = %r is not one of %s" % (mode, ", ".join(MODES)))
    if ranks is not None and mode == "all_to_all":
        raise InvalidArgumentError("simulate: mode 'all_to_all' runs every rank (a rank's part "
                                   "of o comes from every head group)")
    ranks = list(range(world_size)) if ranks is None else list(ranks)
    if float(problem.get("dropout_p") or 0) > 0 and problem.get("dropout_seed") is None:
        problem["dropout_seed"] = _draw_seed()  # one seed for every rank
    layout = str(problem.get("layout", "bshd")).lower()
    split_q = _layout_split_args(layout, problem.get("cu_seqlens_q"))
    split_kv = _layout_split_args(layout, problem.get("cu_seqlens_kv"))
    q_parts = [shard(q, r, world_size, **split_q) for r in range(world_size)]
    k_parts = [shard(k, r, world_size, **split_kv) for r in range(world_size)]
    v_parts = [shard(v, r, world_size, **split_kv) for r in range(world_size)]
    d_o_parts = None if d_o is None else \
        [shard(d_o, r, world_size, **split_q).contiguous() for r in range(world_size)]
    probs = [_make_problem(q_parts[r], k_parts[r], v_parts[r], mode, r, world_size, None,
                           dict(problem)) for r in range(world_size)]
    sinks = problem.get("sinks")
    if mode == "ring":
        return _simulate_ring(probs, ranks, q_parts, k_parts, v_parts, d_o_parts, sinks)
    if mode == "all_gather":
        return _simulate_all_gather(probs, ranks, q_parts, k, v, d_o_parts, sinks, split_kv)
    return _simulate_ulysses(probs, q, k, v, d_o, sinks, problem.get("alibi_slopes"), split_q,
                             split_kv)


def _simulate_ring(probs, ranks, q_parts, k_parts, v_parts, d_o_parts, sinks):
    world = len(probs)
    dkv_sums = _DkvSums()
    results = []
    for r in ranks:
        prob, q = probs[r], q_parts[r]
        blocks = [((r - t) % world, k_parts[(r - t) % world], v_parts[(r - t) % world])
                  for t in range(world)]
        o_acc, lse = _ring_forward(prob, q, v_parts[r].shape[-1], blocks)
        extra = prob.extra_logit(sinks)
        if extra is not None:
            lse = _add_extra_logit(o_acc, lse, extra, prob.layout)
        out = dict(o=o_acc.to(q.dtype), lse=lse)
        if d_o_parts is not None:
            out["dq"] = _ring_backward(prob, d_o_parts[r], q, out["o"], lse, blocks,
                                       dkv_sums).to(q.dtype)
            out["dsinks"] = None if sinks is None else \
                _sink_gradient(sinks.float(), d_o_parts[r], out["o"], lse, prob.layout)
        results.append(out)
    if d_o_parts is not None:
        for r, out in zip(ranks, results):
            dk, dv = _unpack(dkv_sums.sums[r], k_parts[r].shape, v_parts[r].shape)
            out["dk"], out["dv"] = dk.to(k_parts[r].dtype), dv.to(v_parts[r].dtype)
    return results


def _leaf(x, grad):
    return None if x is None else x.detach().requires_grad_(grad)


def _simulate_all_gather(probs, ranks, q_parts, k, v, d_o_parts, sinks, split_kv):
    world, grad = len(probs), d_o_parts is not None
    k_all, v_all, sinks = _leaf(k, grad), _leaf(v, grad), _leaf(sinks, grad)
    dk_all, dv_all = torch.zeros_like(k), torch.zeros_like(v)
    results = []
    for r in ranks:
        q = _leaf(q_parts[r], grad)
        with torch.set_grad_enabled(grad):
            o, lse = _attend_gathered(probs[r], q, k_all, v_all, sinks)
        out = dict(o=o.detach(), lse=lse.detach())
        if grad:
            inputs = [q, k_all, v_all] + ([sinks] if sinks is not None else [])
            grads = torch.autograd.grad(o, inputs, d_o_parts[r])
            out["dq"], out["dsinks"] = grads[0], (grads[3] if sinks is not None else None)
            dk_all += grads[1]  # the reduce-scatter's sum
            dv_all += grads[2]
        results.append(out)
    if grad:
        for r, out in zip(ranks, results):
            out["dk"] = shard(dk_all, r, world, **split_kv)
            out["dv"] = shard(dv_all, r, world, **split_kv)
    return results


def _simulate_ulysses(probs, q, k, v, d_o, sinks, alibi_slopes, split_q, split_kv):
    """all_to_all: rank r attends over the whole sequence with head group r; the inverse
    all-to-all hands every rank its part of each group's output."""
    world, grad, prob = len(probs), d_o is not None, probs[0]
    hd = prob.head_dim
    q, sinks = _leaf(q, grad), _leaf(sinks, grad)
    k, v = _leaf(k, grad), _leaf(v, grad)
    k_rep, v_rep = _repeat_kv_heads(k, v, world, hd)
    o_groups, lse_groups = [], []
    with torch.set_grad_enabled(grad):
        for r in range(world):
            o_r, lse_r = _api.attention(
                _head_slice(q, hd, r, world), _head_slice(k_rep, hd, r, world),
                _head_slice(v_rep, hd, r, world), return_lse=True,
                sinks=_head_group(sinks, r, world),
                alibi_slopes=_head_group(alibi_slopes, r, world), **prob.library, **prob.whole,
                **prob.head_group_dropout(r))
            o_groups.append(o_r)
            lse_groups.append(lse_r.detach())
        o = torch.cat(o_groups, hd)
    lse = torch.cat(lse_groups, 1)
    lse_split = dict(seq_dim=_LSE_SEQ_DIM[prob.layout], cu_seqlens=split_q["cu_seqlens"])
    results = [dict(o=shard(o.detach(), r, world, **split_q),
                    lse=shard(lse, r, world, **lse_split)) for r in range(world)]
    if grad:
        inputs = [q, k, v] + ([sinks] if sinks is not None else [])
        grads = torch.autograd.grad(o, inputs, d_o)
        for r, out in enumerate(results):
            out["dq"] = shard(grads[0], r, world, **split_q)
            out["dk"] = shard(grads[1], r, world, **split_kv)
            out["dv"] = shard(grads[2], r, world, **split_kv)
            out["dsinks"] = None
            if sinks is not None:  # rank r's share: its head group's entries
                share = torch.zeros_like(grads[3])
                n = share.shape[0] // world
                share[r * n:(r + 1) * n] = grads[3][r * n:(r + 1) * n]
                out["dsinks"] = share
    return results


def _head_slice(x, head_dim, group, world):
    n = x.shape[head_dim] // world
    return x.narrow(head_dim, group * n, n)


def _layout_split_args(layout, cu_seqlens):
    if layout not in _SEQ_DIM:
        raise InvalidArgumentError("layout = %r is not one of %s" % (layout, ", ".join(_SEQ_DIM)))
    return dict(seq_dim=_SEQ_DIM[layout], cu_seqlens=cu_seqlens if layout == "thd" else None)


def _make_problem(q, k, v, mode, rank, world, group, args):
    """The checked _Problem of a call on this rank's parts q, k, v."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError("context parallel attention takes torch tensors; %s is %s"
                                       % (name, type(t).__name__))
    get = args.get
    _refuse_unsupported(mode, get("bias"), get("alibi_slopes"), get("score_mod"),
                        get("mask_mod"), get("seq_offsets_q"), get("seq_offsets_kv"))
    known = {"layout", "mask", "window", "softcap", "sinks", "softmax", "scale", "alibi_slopes",
             "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv", "deterministic",
             "backend", "dropout_p", "dropout_seed", "bias", "bias_type", "seq_offsets_q",
             "seq_offsets_kv", "score_mod", "mask_mod"}
    unknown = set(args) - known
    if unknown:
        raise TypeError("unexpected argument(s): %s" % ", ".join(sorted(unknown)))
    sinks = get("sinks")
    opts = normalize_options(
        layout=get("layout", "bshd"), mask=get("mask"), window=get("window", (-1, -1)),
        softcap=get("softcap", 0.0), has_sinks=sinks is not None, softmax=get("softmax"),
        scale=get("scale"), has_alibi=get("alibi_slopes") is not None,
        deterministic=get("deterministic", False), backend=get("backend", "auto"),
        dropout_p=get("dropout_p", 0.0), dropout_seed=get("dropout_seed"))
    if opts.window_left < -1 or opts.window_right < -1:
        raise InvalidArgumentError("window = %r: each side is -1 (unbounded) or >= 0"
                                   % (get("window"),))
    if opts.mask in _CAUSAL_MASKS and opts.window_right > 0:
        raise InvalidArgumentError("window_right = %d contradicts mask = %s: a causal mask hides "
                                   "every key right of the diagonal"
                                   % (opts.window_right, opts.mask))
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.dim() != 1):
        raise InvalidArgumentError("sinks must be a float tensor [heads_q]")
    lengths_q, lengths_kv = _sequence_lengths(q, k, opts, world, get("cu_seqlens_q"),
                                              get("cu_seqlens_kv"), get("max_seqlen_q"),
                                              get("max_seqlen_kv"))
    heads_q = q.shape[_HEAD_DIM[opts.layout]]
    if mode == "all_to_all" and heads_q % world:
        raise InvalidArgumentError(
            "mode 'all_to_all' splits the heads over the ranks: heads_q = %d is not a multiple "
            "of the group's %d ranks (modes 'ring' and 'all_gather' take any head count)"
            % (heads_q, world))
    dropout_rows = 0
    if opts.dropout_p > 0:
        dropout_rows = _check_dropout_split(mode, opts, lengths_q, lengths_kv, heads_q, world,
                                            get("max_seqlen_q"))
    return _Problem(opts, rank, world, lengths_q, lengths_kv, heads_q, q.device,
                    get("softmax"), group, dropout_rows)


def _check_dropout_split(mode, opts, lengths_q, lengths_kv, heads_q, world, max_seqlen_q):
    """The whole problem's max_seqlen_q, which numbers the dropout mask's rows (fusedattn.h,
    'Dropout mask': the single-device call's; THD: max_seqlen_q as given, else the longest
    sequence), after checking that the blocks' calls can draw that mask."""
    rows = int(lengths_q[0]) if opts.layout != "thd" else \
        int(max_seqlen_q or lengths_q.max(initial=0))
    batch = lengths_q.shape[0] if opts.layout == "thd" else None
    if batch is not None and batch * heads_q * rows > 2 ** 32:
        raise InvalidArgumentError(
            "dropout_p = %g with %d sequences * heads_q %d * max_seqlen_q %d rows: the dropout "
            "counter addresses at most 2^32 rows" % (opts.dropout_p, batch, heads_q, rows))
    if mode == "ring":
        # A block's call starts its keys at a chunk's start or inside the chunk; the mask draws
        # keys in groups of four from the sequence's start, so a call moves its first key down
        # to a multiple of 4, which must stay in the chunk: chunks of a multiple of 4 tokens.
        chunks = lengths_kv // (2 * world)
        bad = chunks % 4 != 0
        if bad.any():
            b = int(np.argmax(bad))
            raise NotSupportedError(
                "dropout_p = %g under mode 'ring': %s has %d tokens, chunks of %d over 2 x %d "
                "ranks, not a multiple of 4. Each K/V block's call draws the whole sequence's "
                "dropout mask at its place, whose keys come in groups of four from the "
                "sequence's start: the key lengths must be multiples of 8 x world_size = %d "
                "(pad the sequences), or use mode 'all_gather' or 'all_to_all'"
                % (opts.dropout_p, "the sequence" if opts.layout != "thd" else
                   "sequence %d" % b, lengths_kv[b], chunks[b], world, 8 * world))
    return rows


def _refuse_unsupported(mode, bias, alibi_slopes, score_mod, mask_mod, seq_offsets_q,
                        seq_offsets_kv):
    if bias is not None:
        raise NotSupportedError(
            "bias: context parallelism takes no bias tensor (one of [sq, skv] for the whole "
            "sequence on every rank is what splitting the sequence avoids); sliding windows, "
            "softcap and sinks are supported")
    if alibi_slopes is not None and mode != "all_to_all":
        raise NotSupportedError(
            "alibi_slopes under mode %r: ALiBi's distance |i + sk - sq - j| uses the call's own "
            "positions, which a block's call does not share with the whole sequence; mode "
            "'all_to_all' (each rank attends over the whole sequence) runs it" % mode)
    if score_mod is not None or mask_mod is not None:
        raise NotSupportedError(
            "score_mod / mask_mod: context parallelism does not run score modifiers (they read "
            "the call's positions and heads, which are not the whole sequence's)")
    if seq_offsets_q is not None or seq_offsets_kv is not None:
        raise NotSupportedError(
            "seq_offsets_q / seq_offsets_kv: context parallelism takes packed THD sequences "
            "without gaps (cu_seqlens alone)")


def _sequence_lengths(q, k, opts, world, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                      max_seqlen_kv):
    """(lengths_q, lengths_kv) of the whole sequences (int64 NumPy), checked against this
    rank's tensors and the 2N-chunk split."""
    layout = opts.layout
    rank = 3 if layout == "thd" else 4
    for name, t in (("q", q), ("k", k)):
        if t.dim() != rank:
            raise InvalidArgumentError("%s has shape %s but layout %r needs %d dimensions"
                                       % (name, list(t.shape), layout, rank))
    if layout != "thd":
        if opts.mask.startswith("padding"):
            raise NotSupportedError(
                "mask = %r on layout %r: padding masks take per-sequence lengths; under context "
                "parallelism pack the sequences as layout 'thd' with cu_seqlens"
                % (opts.mask, layout))
        if cu_seqlens_q is not None or cu_seqlens_kv is not None:
            raise InvalidArgumentError("cu_seqlens_q / cu_seqlens_kv are for layout 'thd'")
        out = []
        for name, t, given in (("q", q, max_seqlen_q), ("k", k, max_seqlen_kv)):
            local = t.shape[_SEQ_DIM[layout]]
            if local % 2:
                raise InvalidArgumentError(
                    "%s has %d positions on its sequence axis, an odd number: a rank holds two "
                    "equal chunks of the whole sequence (chunks r and 2N-1-r)" % (name, local))
            if given is not None and given != local * world:
                raise InvalidArgumentError("max_seqlen_%s = %d but the whole sequence has %d"
                                           % (name, given, local * world))
            out.append(np.asarray([local * world], dtype=np.int64))
        return out[0], out[1]
    if cu_seqlens_q is None or cu_seqlens_kv is None:
        raise InvalidArgumentError("layout 'thd' needs cu_seqlens_q and cu_seqlens_kv (those of "
                                   "the whole sequences, int32 [batch + 1])")
    out = []
    for name, cu, t, given in (("cu_seqlens_q", cu_seqlens_q, q, max_seqlen_q),
                               ("cu_seqlens_kv", cu_seqlens_kv, k, max_seqlen_kv)):
        lengths = _lengths_of(cu, name)
        _check_divisible(lengths, world, name)
        if lengths.sum() != t.shape[0] * world:
            raise InvalidArgumentError(
                "%s covers %d tokens of the whole sequences, but this rank's tensor has %d "
                "tokens, not 1/%d of them (2 of the 2N chunks of every sequence)"
                % (name, lengths.sum(), t.shape[0], world))
        if given is not None and lengths.size and given < lengths.max():
            raise InvalidArgumentError("max_%s = %d but a whole sequence has %d tokens"
                                       % (name[3:], given, lengths.max()))
        out.append(lengths)
    if out[0].shape != out[1].shape:
        raise InvalidArgumentError("cu_seqlens_q and cu_seqlens_kv describe %d and %d sequences"
                                   % (out[0].shape[0], out[1].shape[0]))
    return out[0], out[1]
