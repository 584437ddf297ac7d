"""fusedattn.distributed: attention over a sequence split across the ranks of a torch.distributed
group equals the single-process fusedattn.attention call on the whole sequence, forward (o, lse)
and backward (dq, dk, dv, the sinks' gradient), in every mode.

The CPU tests run 2 and 4 processes joined by gloo (cp_workers.py keeps them alive across the
tests) on the reference backend in float32: the error bound is the house's float32 one. Tests
marked `gpu` run the same comparison on CUDA in bfloat16: every rank's part simulated in one
process on one GPU, and, on a machine with several GPUs, one process per GPU joined by NCCL."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("this PyTorch was built without torch.distributed", allow_module_level=True)

import fusedattn  # noqa: E402
import fusedattn.distributed as cp  # noqa: E402
from cp_workers import ProcessGroupPool, as_arrays  # noqa: E402
from helpers import TOLERANCE, relative_error  # noqa: E402

WORLDS = (2, 4)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device visible to PyTorch")


@pytest.fixture(scope="module")
def pools():
    """pools(world, backend, device): a ProcessGroupPool, started on first use and kept for the
    module (a broken one, e.g. after a timeout, is replaced)."""
    import fusedattn._torch  # noqa: F401  (loads or compiles the operators before the workers)
    opened = {}

    def get(world, backend="gloo", device="cpu"):
        key = (world, backend, device)
        pool = opened.get(key)
        if pool is None or not pool.alive():
            pool = opened[key] = ProcessGroupPool(world, backend, device)
        return pool
    yield get
    for pool in opened.values():
        pool.close()


# ---------------------------------------------------------------------------------------------
# Problems and the single-process reference
# ---------------------------------------------------------------------------------------------


def make_problem(*, layout="bshd", mask=None, window=(-1, -1), b=2, sq=32, skv=None, hq=4,
                 hkv=4, d=8, lengths_q=None, lengths_kv=None, softcap=0.0, softmax=None,
                 alibi=False, dropout_p=0.0, seed=0, device="cpu", dtype=torch.float32):
    """(whole tensors, problem arguments) of a random problem. THD takes lengths_q/kv (every one
    a multiple of 2 x world) and gets cu_seqlens of the whole sequences. dropout_p > 0 comes
    with a dropout_seed, which the single-process call takes too."""
    g = torch.Generator().manual_seed(seed)
    skv = sq if skv is None else skv
    problem = dict(layout=layout, mask=mask, window=window, softcap=softcap)
    if dropout_p > 0:
        problem.update(dropout_p=dropout_p, dropout_seed=0x5EED0000 + seed)
    if layout == "thd":
        lengths_kv = lengths_q if lengths_kv is None else lengths_kv
        problem["cu_seqlens_q"] = np.concatenate(([0], np.cumsum(lengths_q))).tolist()
        problem["cu_seqlens_kv"] = np.concatenate(([0], np.cumsum(lengths_kv))).tolist()
        shape_q, shape_kv = (sum(lengths_q), hq, d), (sum(lengths_kv), hkv, d)
    else:
        shape = {"bshd": lambda s, h: (b, s, h, d), "sbhd": lambda s, h: (s, b, h, d),
                 "bhsd": lambda s, h: (b, h, s, d)}[layout]
        shape_q, shape_kv = shape(sq, hq), shape(skv, hkv)

    def randn(shape):
        return torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    tensors = dict(q=randn(shape_q), k=randn(shape_kv), v=randn(shape_kv), d_o=randn(shape_q),
                   sinks=None, alibi_slopes=None)
    if softmax is not None:
        problem["softmax"] = softmax
    if softmax == "sink":
        tensors["sinks"] = torch.randn(hq, generator=g).to(device)
    if alibi:
        tensors["alibi_slopes"] = (torch.rand(hq, generator=g) * 0.5).to(device)
    return tensors, problem


def single_process(tensors, problem):
    """fusedattn.attention on the whole tensors: o, lse and the gradients for d_o."""
    q, k, v = (tensors[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
    sinks = tensors["sinks"]
    if sinks is not None:
        sinks = sinks.detach().clone().requires_grad_()
    o, lse = fusedattn.attention(q, k, v, return_lse=True, sinks=sinks,
                                 alibi_slopes=tensors["alibi_slopes"], **problem)
    o.backward(tensors["d_o"])
    return dict(o=o, lse=lse, dq=q.grad, dk=k.grad, dv=v.grad,
                dsinks=None if sinks is None else sinks.grad)


def assert_parts_match(parts, reference, problem, tolerance, what):
    """Every rank's parts, put together, equal the single-process results: o, lse, dq (query
    side), dk, dv (key side) within `tolerance` (relative), LSE's -inf rows the same rows, and
    the sinks' gradient as the sum of the ranks' shares."""
    layout = problem.get("layout", "bshd")
    thd = layout == "thd"
    split_q = dict(layout=layout, cu_seqlens=problem.get("cu_seqlens_q") if thd else None)
    split_kv = dict(layout=layout, cu_seqlens=problem.get("cu_seqlens_kv") if thd else None)
    split_lse = dict(seq_dim=0 if thd else 2, cu_seqlens=split_q["cu_seqlens"])
    splits = dict(o=split_q, dq=split_q, dk=split_kv, dv=split_kv, lse=split_lse)
    for name, split in splits.items():
        whole = cp.unshard([torch.as_tensor(np.asarray(p[name], dtype=np.float32))
                            for p in parts], **split).double()
        ref = reference[name].detach().double().cpu()
        assert whole.shape == ref.shape, "%s: %s has shape %s, expected %s" % (
            what, name, list(whole.shape), list(ref.shape))
        if name == "lse":
            hidden = torch.isneginf(ref)
            assert torch.equal(torch.isneginf(whole), hidden), \
                "%s: lse is -inf on other rows than the single-process call's" % what
            whole, ref = whole[~hidden], ref[~hidden]
        error = relative_error(whole.numpy(), ref.numpy())
        assert error < tolerance, "%s: %s differs from the single-process call by %.3g" % (
            what, name, error)
    if reference["dsinks"] is not None:
        total = sum(np.asarray(p["dsinks"], dtype=np.float64) for p in parts)
        error = relative_error(total, reference["dsinks"].detach().double().cpu().numpy())
        assert error < tolerance, "%s: the sum of the ranks' sink gradients differs by %.3g" % (
            what, error)


def run_on_ranks(pools, world, mode, tensors, problem, backend="gloo", device="cpu",
                 dtype="float32", **case):
    """Every rank's results of context_parallel_attention (+ backward) in a pool."""
    answers = pools(world, backend, device).run(dict(
        mode=mode, dtype=dtype, problem=problem, **as_arrays(tensors), **case))
    for rank, (status, payload) in enumerate(answers):
        if status != "ok":
            pytest.fail("rank %d of %d (%s) raised %s: %s\n%s" % (rank, world, mode, *payload))
    return [payload for _, payload in answers]


def check(pools, world, mode, **kind):
    tensors, problem = make_problem(**kind)
    parts = run_on_ranks(pools, world, mode, tensors, problem)
    assert_parts_match(parts, single_process(tensors, problem), problem, TOLERANCE["float32"],
                       "%s over %d ranks (%s)" % (mode, world, kind))


# ---------------------------------------------------------------------------------------------
# Every mode matches one process (gloo, 2 and 4 ranks)
# ---------------------------------------------------------------------------------------------

modes = pytest.mark.parametrize("mode", cp.MODES)
worlds = pytest.mark.parametrize("world", WORLDS)


@worlds
@modes
@pytest.mark.parametrize("mask", [None, "causal"])
def test_matches_one_process(pools, world, mode, mask):
    check(pools, world, mode, mask=mask)


@worlds
@modes
@pytest.mark.parametrize("hkv", [2, 1], ids=["gqa", "mqa"])
def test_grouped_kv_heads_match_one_process(pools, world, mode, hkv):
    check(pools, world, mode, mask="causal", hkv=hkv)


@worlds
@modes
@pytest.mark.parametrize("layout", ["sbhd", "bhsd"])
def test_layouts_match_one_process(pools, world, mode, layout):
    check(pools, world, mode, layout=layout, mask="causal")


@worlds
@modes
@pytest.mark.parametrize("mask", [None, "causal"])
def test_packed_sequences_match_one_process(pools, world, mode, mask):
    # THD: every sequence is split in 2N chunks; an empty sequence among them.
    check(pools, world, mode, layout="thd", mask=mask, lengths_q=[16, 8 * world, 0, 24])


@worlds
@modes
@pytest.mark.parametrize("mask,window", [("causal", (3, 0)), ("causal", (9, 0)),
                                         (None, (2, 3)), (None, (-1, 5))],
                         ids=["causal_3", "causal_9_wider_than_a_chunk", "band_2_3",
                              "right_5"])
def test_sliding_windows_match_one_process(pools, world, mode, mask, window):
    check(pools, world, mode, mask=mask, window=window)


@worlds
@modes
def test_bottom_right_alignment_with_more_keys_matches_one_process(pools, world, mode):
    # The diagonal ends at the last key of the whole sequence, not of a rank's part.
    check(pools, world, mode, mask="causal_bottom_right", sq=16, skv=48)


@worlds
@modes
@pytest.mark.parametrize("mask,window", [("causal_bottom_right", (-1, -1)), (None, (3, 2))],
                         ids=["causal_bottom_right", "window_3_2"])
def test_packed_sequences_with_other_key_lengths_match_one_process(pools, world, mode, mask,
                                                                   window):
    check(pools, world, mode, layout="thd", mask=mask, window=window,
          lengths_q=[16, 8, 0, 32], lengths_kv=[32, 8, 16, 16])


@worlds
@modes
def test_softcap_matches_one_process(pools, world, mode):
    check(pools, world, mode, mask="causal", softcap=2.0)


@worlds
@modes
@pytest.mark.parametrize("softmax", ["sink", "off_by_one"])
def test_extra_logit_softmaxes_match_one_process(pools, world, mode, softmax):
    # The sinks' gradient: each rank returns its share, which sum to the single-process one.
    check(pools, world, mode, mask="causal", softmax=softmax)


@worlds
def test_alibi_runs_under_all_to_all(pools, world):
    check(pools, world, "all_to_all", mask="causal", alibi=True)


# ---------------------------------------------------------------------------------------------
# Dropout: every block's call draws the single-device call's mask at its place (fusedattn.h,
# "Dropout mask"), forward and backward, so the ranks' parts equal the single-process call with
# the same seed. The kinds: the two plain masks, a window whose blocks start their keys inside a
# chunk (moved down to a multiple of 4), bottom-right with more keys, and THD with sequences of
# two lengths (the calls of equal ones, consecutive, are one) and an empty one.
# ---------------------------------------------------------------------------------------------

DROPOUT_KINDS = {  # per world size ("ring" takes key lengths that are multiples of 8 x world)
    "none": lambda world: dict(mask=None),
    "causal": lambda world: dict(mask="causal"),
    "causal_window_5": lambda world: dict(mask="causal", window=(5, 0)),
    "bottom_right_more_keys": lambda world: dict(mask="causal_bottom_right", sq=16, skv=64),
    "thd": lambda world: dict(layout="thd", mask="causal",
                              lengths_q=[8 * world, 8 * world, 16 * world, 0]),
}


@worlds
@modes
@pytest.mark.parametrize("kind", list(DROPOUT_KINDS))
def test_dropout_matches_one_process_with_the_same_seed(pools, world, mode, kind):
    check(pools, world, mode, dropout_p=0.3, **DROPOUT_KINDS[kind](world))


@modes
def test_dropout_without_a_seed_draws_one_for_every_rank(pools, mode):
    # Each rank's torch generator differs (torch_seed + rank); the ranks' parts still equal the
    # single-process call with rank 0's draw from torch's default generator: that seed was
    # broadcast.
    tensors, problem = make_problem(mask="causal", dropout_p=0.3)
    del problem["dropout_seed"]
    parts = run_on_ranks(pools, 2, mode, tensors, problem, torch_seed=1000)
    draw = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64,
                             generator=torch.Generator().manual_seed(1000)))
    rank_0 = dict(problem, dropout_seed=draw)
    assert_parts_match(parts, single_process(tensors, rank_0), rank_0, TOLERANCE["float32"],
                       "%s with a broadcast seed" % mode)


@pytest.mark.parametrize("mode", ["all_to_all", "all_gather"])
def test_dropout_with_key_chunks_off_a_multiple_of_4_runs_outside_the_ring(pools, mode):
    # 20 keys over 2 ranks: chunks of 5, which "ring" refuses (below); these modes' calls see
    # the keys from the sequence's start.
    check(pools, 2, mode, mask="causal", sq=20, dropout_p=0.3)


# ---------------------------------------------------------------------------------------------
# Refusals: the error says what is wrong and what is accepted, on every rank, before any transfer
# ---------------------------------------------------------------------------------------------

REFUSALS = [
    dict(id="dropout_ring_key_chunks", mode="ring", kind=dict(sq=20),
         problem=dict(dropout_p=0.1, dropout_seed=1), error="NotSupportedError",
         says="multiples of 8 x world_size = 16"),
    dict(id="bias", mode="all_gather", problem=dict(bias_type="pre_scale"), bias=True,
         error="NotSupportedError", says="no bias tensor"),
    dict(id="alibi_in_ring", mode="ring", kind=dict(alibi=True),
         error="NotSupportedError", says="mode 'all_to_all'"),
    dict(id="heads_not_a_multiple", mode="all_to_all", kind=dict(hq=3, hkv=1),
         error="InvalidArgumentError", says="heads_q = 3 is not a multiple"),
    dict(id="heads_kv_not_dividing", mode="ring", kind=dict(hq=4, hkv=3),
         error="InvalidArgumentError", says="heads_kv = 3 does not divide"),
    dict(id="padding_mask_dense", mode="ring", problem=dict(mask="padding_causal"),
         error="NotSupportedError", says="pack the sequences as layout 'thd'"),
    dict(id="seq_offsets", mode="ring", kind=dict(layout="thd", lengths_q=[8, 8]),
         problem=dict(seq_offsets_q=[0, 8, 16]), error="NotSupportedError",
         says="without gaps"),
    dict(id="causal_right_window", mode="ring", problem=dict(mask="causal", window=(2, 3)),
         error="InvalidArgumentError", says="contradicts mask = causal"),
    dict(id="unknown_mode", mode="ringg", error="InvalidArgumentError",
         says="is not one of ring, all_to_all, all_gather"),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r["id"] for r in REFUSALS])
def test_unsupported_problems_are_refused_saying_why(pools, refusal):
    tensors, problem = make_problem(**refusal.get("kind", {}))
    problem.update(refusal.get("problem", {}))
    if refusal.get("bias"):
        problem["bias"] = np.zeros((1, 1, 32, 32), dtype=np.float32)
    answers = pools(2).run(dict(mode=refusal["mode"], dtype="float32", problem=problem,
                                **as_arrays(tensors)))
    for status, payload in answers:
        assert status == "error", "refusal %s: a rank ran it" % refusal["id"]
        kind, message, _ = payload
        assert kind == refusal["error"] and refusal["says"] in message, message


def test_thd_lengths_must_split_into_2n_chunks(pools):
    # Whole sequences of 16 and 12 tokens over 4 ranks (8 chunks each), 7 tokens a rank:
    # refused, naming the sequence.
    tensors, problem = make_problem(layout="thd", lengths_q=[16, 12])
    parts = {n: None if t is None else t[:7] for n, t in tensors.items()}
    answers = pools(4).run(dict(mode="ring", dtype="float32", problem=problem, split=False,
                                **as_arrays(parts)))
    for status, payload in answers:
        assert status == "error" and payload[0] == "InvalidArgumentError"
        assert "cu_seqlens_q: sequence 1 has 12 tokens, not a multiple of 2 x world_size = 8" \
            in payload[1]


# ---------------------------------------------------------------------------------------------
# The split, and simulate() (one process)
# ---------------------------------------------------------------------------------------------


def test_shard_holds_chunks_r_and_2n_minus_1_minus_r():
    x = torch.arange(16).view(1, 16, 1, 1)  # bshd, 2 ranks: chunks of 4
    assert cp.shard(x, 0, 2).flatten().tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cp.shard(x, 1, 2).flatten().tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_shard_splits_every_packed_sequence():
    x = torch.arange(12).view(12, 1, 1)  # thd: sequences of 8 and 4 tokens, 2 ranks
    assert cp.shard(x, 0, 2, layout="thd", cu_seqlens=[0, 8, 12]).flatten().tolist() == \
        [0, 1, 6, 7, 8, 11]
    assert cp.shard(x, 1, 2, layout="thd", cu_seqlens=[0, 8, 12]).flatten().tolist() == \
        [2, 3, 4, 5, 9, 10]


@pytest.mark.parametrize("layout,cu_seqlens", [("bshd", None), ("bhsd", None),
                                                ("thd", [0, 16, 16, 40])])
def test_unshard_inverts_shard(layout, cu_seqlens):
    x = torch.randn((40, 3, 2) if layout == "thd" else (2, 3, 16, 2) if layout == "bhsd"
                    else (2, 16, 3, 2))
    parts = [cp.shard(x, r, 4, layout=layout, cu_seqlens=cu_seqlens) for r in range(4)]
    assert torch.equal(cp.unshard(parts, layout=layout, cu_seqlens=cu_seqlens), x)


def test_shard_refuses_a_length_that_does_not_split_into_2n_chunks():
    with pytest.raises(fusedattn.InvalidArgumentError, match="not a multiple of 2 x world_size"):
        cp.shard(torch.zeros(1, 12, 1, 1), 0, 4)


@modes
@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3], ids=["no_dropout", "dropout"])
def test_simulated_ranks_match_one_process(mode, mask, dropout_p):
    tensors, problem = make_problem(mask=mask, softmax="sink", dropout_p=dropout_p)
    parts = cp.simulate(tensors["q"], tensors["k"], tensors["v"], 4, mode=mode,
                        d_o=tensors["d_o"], sinks=tensors["sinks"], **problem)
    assert_parts_match(parts, single_process(tensors, problem), problem, TOLERANCE["float32"],
                       "simulated %s over 4 ranks" % mode)


def test_simulated_seed_without_one_given_comes_from_torchs_generator():
    # torch.manual_seed repeats it (and activation checkpointing, which restores torch's
    # generators, recomputes the same mask).
    tensors, problem = make_problem(mask="causal", dropout_p=0.3)
    del problem["dropout_seed"]
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(cp.simulate(tensors["q"], tensors["k"], tensors["v"], 2, mode="ring",
                                **problem))
    for a, b in zip(*runs):
        assert torch.equal(a["o"], b["o"])


def test_all_gather_rank_whose_queries_see_no_key_takes_part_in_the_backward(pools):
    # Bottom-right causal, 32 queries against 8 keys: only queries 24..31 see keys, and they
    # are chunk 3 of 4, which rank 0 holds (with chunk 0); rank 1's chunks 1 and 2 see none.
    # Rank 1's backward must still run the reduce-scatter of dK/dV (else rank 0 would wait for
    # it), and its gradients are zeros.
    tensors, problem = make_problem(mask="causal_bottom_right", b=1, sq=32, skv=8, hq=2, hkv=2)
    parts = run_on_ranks(pools, 2, "all_gather", tensors, problem)
    assert_parts_match(parts, single_process(tensors, problem), problem, TOLERANCE["float32"],
                       "all_gather with a rank that sees no key")
    sim = cp.simulate(tensors["q"], tensors["k"], tensors["v"], 2, mode="all_gather",
                      d_o=tensors["d_o"], **problem)
    assert_parts_match(sim, single_process(tensors, problem), problem, TOLERANCE["float32"],
                       "simulated all_gather with a rank that sees no key")


def test_block_plan_of_a_causal_ring_runs_one_call_per_step_and_skips_nothing_it_needs():
    # 2 ranks, causal: rank 0's own block is one causal call on its two chunks; of rank 1's
    # block (chunks 1 and 2) only its second chunk's queries see keys, all of them.
    from fusedattn._problem import normalize_options
    opts = normalize_options(layout="bshd", mask="causal")
    lengths = np.array([64])
    prob = cp._Problem(opts, 0, 2, lengths, lengths, 4, torch.device("cpu"), None)
    own, other = prob.plan(0), prob.plan(1)
    assert [(c.q_start, c.q_len, c.k_start, c.k_len, c.kwargs["mask"]) for c in own] == \
        [(0, 32, 0, 32, "causal")]
    assert [(c.q_start, c.q_len, c.k_start, c.k_len, c.kwargs["mask"]) for c in other] == \
        [(16, 16, 0, 32, None)]


def _dropout_plan(mask, window=(-1, -1)):
    """Rank 0 of 2 over a sequence of 64 (chunks of 16: rank 0 holds [0, 16) and [48, 64),
    rank 1 [16, 32) and [32, 48)), with dropout: (q_start, q_len, k_start, k_len, window,
    dropout positions) of each call against rank 1's K/V."""
    from fusedattn._problem import normalize_options
    opts = normalize_options(layout="bshd", mask=mask, window=window, dropout_p=0.1,
                             dropout_seed=1)
    lengths = np.array([64])
    prob = cp._Problem(opts, 0, 2, lengths, lengths, 4, torch.device("cpu"), None,
                       dropout_rows=64)
    return [(c.q_start, c.q_len, c.k_start, c.k_len, c.kwargs["window"],
             c.kwargs["dropout_positions"]) for c in prob.plan(1)]


def test_block_plan_with_dropout_gives_each_call_one_chunk_pair_and_its_place():
    # Without a mask one call would cover the block; with dropout each pair of a query chunk
    # and a key chunk is a call, whose rows and keys start at its chunks' places.
    place = fusedattn.DropoutPositions
    assert _dropout_plan(None) == [
        (0, 16, 0, 16, (-1, -1), place(rows=64, row_offset=0, key_offset=16)),
        (0, 16, 16, 16, (-1, -1), place(rows=64, row_offset=0, key_offset=32)),
        (16, 16, 0, 16, (-1, -1), place(rows=64, row_offset=48, key_offset=16)),
        (16, 16, 16, 16, (-1, -1), place(rows=64, row_offset=48, key_offset=32))]


def test_block_plan_with_dropout_moves_a_calls_first_key_down_to_a_multiple_of_4():
    # Causal, window 5: queries 48..52 see keys 43..47 of rank 1's chunk [32, 48). The call
    # starts at key 40 instead (keys 40..42 taken in, hidden by its window: left 0 of a
    # bottom-right band, d = i + 3 over 8 keys), so that its keys are the mask's groups of 4.
    assert _dropout_plan("causal", (5, 0)) == [
        (16, 5, 24, 8, (0, -1), fusedattn.DropoutPositions(rows=64, row_offset=48,
                                                           key_offset=40))]


# ---------------------------------------------------------------------------------------------
# GPU: bfloat16 against the single-GPU call
# ---------------------------------------------------------------------------------------------

GPU_KIND = dict(b=1, sq=2048, hq=8, hkv=2, d=128, device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
@worlds
@modes
@pytest.mark.parametrize("mask", [None, "causal"])
def test_simulated_ranks_match_one_gpu(world, mode, mask):
    tensors, problem = make_problem(mask=mask, **GPU_KIND)
    parts = cp.simulate(tensors["q"], tensors["k"], tensors["v"], world, mode=mode,
                        d_o=tensors["d_o"], **problem)
    parts = [{n: (None if t is None else t.float().cpu().numpy()) for n, t in p.items()}
             for p in parts]
    assert_parts_match(parts, single_process(tensors, problem), problem, TOLERANCE["bfloat16"],
                       "simulated %s over %d ranks on one GPU" % (mode, world))


@pytest.mark.gpu
@worlds
@modes
@pytest.mark.parametrize("mask", [None, "causal"])
def test_nccl_ranks_match_one_gpu(pools, world, mode, mask):
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        pytest.skip("needs %d CUDA devices for NCCL, %d visible" % (
            world, torch.cuda.device_count() if torch.cuda.is_available() else 0))
    tensors, problem = make_problem(mask=mask, **GPU_KIND)
    parts = run_on_ranks(pools, world, mode, tensors, problem, backend="nccl", device="cuda",
                         dtype="bfloat16")
    assert_parts_match(parts, single_process(tensors, problem), problem, TOLERANCE["bfloat16"],
                       "%s over %d GPUs (NCCL)" % (mode, world))
