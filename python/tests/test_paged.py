"""Paged K/V (a serving engine's KV cache, forward only): fusedattn.attention(...,
page_table=..., seqlens_kv=...) with k and v as pools of pages, on NumPy arrays and torch CPU
tensors (the reference backend), against the independent oracle run on the keys gathered from
the pages, and bit for bit against the library's own run of that contiguous problem."""

import numpy as np
import pytest

import fusedattn
from helpers import TOLERANCE, numpy_dtype, relative_error
from oracle import Problem

_POOL = {  # (pages, tokens, heads, dim) -> the pool's axes in each layout's order
    "bshd": (0, 1, 2, 3), "thd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3), "sbhd": (1, 0, 2, 3)}


class Cache:
    """A paged K/V cache: pools k, v of the layout's page shape, the page table and the key
    lengths, with the pages in a shuffled order, spare pages of random data and -1 in the
    table's unused entries; and the same keys gathered into a contiguous bshd k, v (NaN past
    each sequence's keys)."""

    def __init__(self, rng, lens_kv, page_size, heads_kv, dim, layout, dtype, spare=2):
        self.lens_kv = np.asarray(lens_kv, dtype=np.int32)
        batch, longest = len(lens_kv), max(lens_kv)
        width = max(1, -(-longest // page_size))
        used = [-(-n // page_size) for n in lens_kv]
        num_pages = sum(used) + spare
        order = rng.permutation(num_pages)
        self.page_table = np.full((batch, width), -1, dtype=np.int32)
        nxt = 0
        for b, n in enumerate(used):
            self.page_table[b, :n] = order[nxt:nxt + n]
            nxt += n
        dt = numpy_dtype(dtype)
        pages = rng.standard_normal((2, num_pages, page_size, heads_kv, dim)).astype(dt)
        self.k, self.v = (np.ascontiguousarray(p.transpose(_POOL[layout])) for p in pages)
        self.dense_k = np.full((batch, longest, heads_kv, dim), np.nan, dtype=dt)
        self.dense_v = np.full((batch, longest, heads_kv, dim), np.nan, dtype=dt)
        for b, n in enumerate(lens_kv):
            for j in range(n):
                page = self.page_table[b, j // page_size]
                self.dense_k[b, j] = pages[0, page, j % page_size]
                self.dense_v[b, j] = pages[1, page, j % page_size]
        self.max_seqlen_kv = longest

    def dense(self, layout):
        """k, v gathered, in a dense layout ("bshd", "sbhd", "bhsd") or packed "thd"."""
        if layout == "thd":
            return tuple(np.concatenate([x[b, :n] for b, n in enumerate(self.lens_kv)])
                         for x in (self.dense_k, self.dense_v))
        order = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}[layout]
        return tuple(np.ascontiguousarray(x.transpose(order))
                     for x in (self.dense_k, self.dense_v))

    def cu_seqlens_kv(self):
        return np.concatenate([[0], np.cumsum(self.lens_kv)]).astype(np.int32)


def _padding_form(mask):
    """A dense-query problem's mask once the key lengths are per sequence (a padding mask)."""
    mask = mask or "none"
    return {"none": "padding", "causal": "padding_causal",
            "causal_bottom_right": "padding_causal_bottom_right"}.get(mask, mask)


class Case:
    """A paged problem: queries dense (sq, layout) or "thd" (lens_q), a cache of lens_kv keys
    in pages of page_size, and attention()'s other arguments."""

    def __init__(self, name, layout, lens_kv, page_size, sq=1, lens_q=None, hq=4, hkv=2, d=16,
                 **kwargs):
        self.name, self.layout, self.lens_kv, self.page_size = name, layout, lens_kv, page_size
        self.sq, self.lens_q, self.hq, self.hkv, self.d, self.kwargs = sq, lens_q, hq, hkv, d, \
            kwargs

    def __repr__(self):
        return self.name

    def make(self, dtype, seed=0):
        """(q, cache, paged kwargs, contiguous kwargs)."""
        rng = np.random.default_rng(seed)
        batch = len(self.lens_kv)
        cache = Cache(rng, self.lens_kv, self.page_size, self.hkv, self.d, self.layout, dtype)
        paged = dict(self.kwargs, layout=self.layout, page_table=cache.page_table,
                     seqlens_kv=cache.lens_kv)
        contiguous = dict(self.kwargs, layout=self.layout)
        if self.layout == "thd":
            cu_q = np.concatenate([[0], np.cumsum(self.lens_q)]).astype(np.int32)
            q_shape = (int(cu_q[-1]), self.hq, self.d)
            paged.update(cu_seqlens_q=cu_q, max_seqlen_kv=cache.max_seqlen_kv)
            contiguous.update(cu_seqlens_q=cu_q, cu_seqlens_kv=cache.cu_seqlens_kv())
        else:
            q_shape = {"bshd": (batch, self.sq, self.hq, self.d),
                       "sbhd": (self.sq, batch, self.hq, self.d),
                       "bhsd": (batch, self.hq, self.sq, self.d)}[self.layout]
            lens_q = self.lens_q or [self.sq] * batch
            cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
            if self.lens_q is not None:
                paged["cu_seqlens_q"] = cu_q
            paged["max_seqlen_kv"] = cache.max_seqlen_kv
            contiguous.update(mask=_padding_form(self.kwargs.get("mask")), cu_seqlens_q=cu_q,
                              cu_seqlens_kv=cache.cu_seqlens_kv())
        q = rng.standard_normal(q_shape).astype(np.float32).astype(numpy_dtype(dtype))
        if self.kwargs.get("sinks") is True:
            sinks = rng.standard_normal(self.hq).astype(np.float32)
            paged["sinks"] = contiguous["sinks"] = sinks
        if self.kwargs.get("alibi_slopes") is True:
            slopes = (0.5 ** np.arange(1, self.hq + 1)).astype(np.float32)
            paged["alibi_slopes"] = contiguous["alibi_slopes"] = slopes
        return q, cache, paged, contiguous


CASES = [
    Case("decode_bshd_softcap_sinks", "bshd", [13, 1, 0], 4, mask="causal_bottom_right",
         softcap=5.0, sinks=True),
    Case("chunked_prefill_thd_window_alibi", "thd", [13, 6, 3], 3, lens_q=[4, 1, 3],
         mask="causal_bottom_right", window=(5, 0), alibi_slopes=True),
    Case("decode_bhsd_page_longer_than_caches_off_by_one", "bhsd", [9, 4], 16,
         softmax="off_by_one", hq=8, hkv=1),
    Case("sbhd_queries_with_a_padding_mask", "sbhd", [7, 12, 5], 2, sq=3, lens_q=[3, 2, 0],
         mask="padding_causal_bottom_right"),
]


def _oracle(q, cache, contiguous):
    k, v = cache.dense(contiguous["layout"])
    return Problem(**contiguous).forward(q.astype(np.float64), k.astype(np.float64),
                                         v.astype(np.float64))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_paged_numpy_matches_the_oracle_and_the_contiguous_problem(case, dtype):
    q, cache, paged, contiguous = case.make(dtype)
    o, lse = fusedattn.attention(q, cache.k, cache.v, return_lse=True, **paged)
    k, v = cache.dense(case.layout)
    o_dense, lse_dense = fusedattn.attention(q, k, v, return_lse=True, **contiguous)
    np.testing.assert_array_equal(o, o_dense)
    np.testing.assert_array_equal(lse, lse_dense)
    ref_o, ref_lse = _oracle(q, cache, contiguous)
    assert relative_error(o, ref_o) < TOLERANCE[dtype]
    if case.layout == "thd":  # packed LSE [tokens, heads]: the oracle leaves gaps nan
        ref_lse = np.where(np.isnan(ref_lse), lse, ref_lse)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_paged_takes_lists_and_int64_index_arrays():
    q, cache, paged, _ = CASES[0].make("float32")
    expected = fusedattn.attention(q, cache.k, cache.v, **paged)
    as_lists = dict(paged, page_table=cache.page_table.tolist(),
                    seqlens_kv=cache.lens_kv.tolist())
    as_int64 = dict(paged, page_table=cache.page_table.astype(np.int64),
                    seqlens_kv=cache.lens_kv.astype(np.int64))
    for kwargs in (as_lists, as_int64):
        np.testing.assert_array_equal(fusedattn.attention(q, cache.k, cache.v, **kwargs),
                                      expected)


def test_max_seqlen_kv_defaults_to_what_the_table_holds():
    q, cache, paged, _ = CASES[0].make("float32")
    paged.pop("max_seqlen_kv")
    o = fusedattn.attention(q, cache.k, cache.v, **paged)
    np.testing.assert_array_equal(o, fusedattn.attention(q, cache.k, cache.v,
                                                         **dict(paged, max_seqlen_kv=13)))


def test_a_page_index_outside_the_pool_is_refused_by_name():
    q, cache, paged, _ = CASES[0].make("float32")
    table = cache.page_table.copy()
    table[0, 2] = cache.k.shape[0]  # one past the last page
    with pytest.raises(fusedattn.InvalidArgumentError,
                       match=r"page_table\[0, 2\] = %d .*num_pages = %d"
                       % (cache.k.shape[0], cache.k.shape[0])):
        fusedattn.attention(q, cache.k, cache.v, **dict(paged, page_table=table))


def test_shapes_are_said_in_the_calls_terms():
    q, cache, paged, _ = CASES[0].make("float32")
    with pytest.raises(fusedattn.InvalidArgumentError,
                       match=r"page_table has shape \[12\] but \[batch, max_pages_per_seq\]"):
        fusedattn.attention(q, cache.k, cache.v,
                            **dict(paged, page_table=cache.page_table.ravel()))
    with pytest.raises(fusedattn.InvalidArgumentError,
                       match=r"k has shape .* pool of pages, \[num_pages, page_size, heads_kv"):
        fusedattn.attention(q, cache.k[0], cache.v, **paged)
    with pytest.raises(fusedattn.InvalidArgumentError, match=r"args.seqlens_kv.data is NULL"):
        fusedattn.attention(q, cache.k, cache.v, **dict(paged, seqlens_kv=None))


def test_the_backward_of_a_paged_cache_is_refused():
    q, cache, paged, _ = CASES[0].make("float32")
    o, lse = fusedattn.attention(q, cache.k, cache.v, return_lse=True, **paged)
    with pytest.raises(fusedattn.InvalidArgumentError, match="paged K/V is forward only"):
        fusedattn.attention_backward(np.ones_like(o), q, cache.k, cache.v, o, lse, **paged)


def test_explain_names_the_backend_and_that_there_is_no_backward():
    text = fusedattn.explain((3, 1, 4, 16), (8, 4, 2, 16), (8, 4, 2, 16), page_table=(3, 4),
                             dtype="float32", device="cpu", mask="causal_bottom_right")
    forward, training = text.splitlines()
    assert forward.startswith("forward: reference"), text
    assert training == ("forward+backward: none: paged K/V is forward only (a serving cache has "
                        "no backward)"), text
    gpu = fusedattn.explain((3, 1, 4, 128), (64, 16, 2, 128), (64, 16, 2, 128),
                            page_table=(3, 32), device="cuda")
    assert "flash" in gpu and "cudnn" in gpu and "small_seq" in gpu, gpu


def test_low_level_forward_takes_the_page_table():
    q, cache, paged, _ = CASES[0].make("float32")
    expected = fusedattn.attention(q, cache.k, cache.v, **paged)
    o = np.zeros_like(expected)
    config = dict(batch=3, heads_q=4, heads_kv=2, max_seqlen_q=1, max_seqlen_kv=13,
                  head_dim_qk=16, head_dim_v=16, qkv_dtype="float32", o_dtype="float32",
                  mask="causal_bottom_right", softcap=5.0, softmax_type="learnable_sink",
                  page_size=4, device="cpu")
    fusedattn.forward(config, q=q, k=cache.k, v=cache.v, o=o, sink_logits=paged["sinks"],
                      page_table=cache.page_table, seqlens_kv=cache.lens_kv)
    np.testing.assert_array_equal(o, expected)


# ---------------------------------------------------------------------------------------------
# torch CPU tensors: the same operator as on CUDA (fusedattn::fwd), the reference backend
# ---------------------------------------------------------------------------------------------


def _torch_args(torch, paged):
    return {name: (torch.from_numpy(np.asarray(value)) if isinstance(value, np.ndarray)
                   else value) for name, value in paged.items()}


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_paged_torch_cpu_equals_numpy(case):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    q, cache, paged, _ = case.make("float32")
    expected, expected_lse = fusedattn.attention(q, cache.k, cache.v, return_lse=True, **paged)
    args = _torch_args(torch, paged)
    if case.layout != "thd":
        args.pop("max_seqlen_kv")  # the table's capacity is the default bound
    with torch.no_grad():
        o, lse = fusedattn.attention(torch.from_numpy(q), torch.from_numpy(cache.k),
                                     torch.from_numpy(cache.v), return_lse=True, **args)
    np.testing.assert_array_equal(o.numpy(), expected)
    np.testing.assert_array_equal(lse.numpy(), expected_lse)


def test_paged_torch_refuses_tensors_that_require_grad():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    q, cache, paged, _ = CASES[0].make("float32")
    tq = torch.from_numpy(q).requires_grad_()
    with pytest.raises(fusedattn.InvalidArgumentError, match="torch.no_grad"):
        fusedattn.attention(tq, torch.from_numpy(cache.k), torch.from_numpy(cache.v),
                            **_torch_args(torch, paged))


def test_paged_torch_int64_table_and_opcheck():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    q, cache, paged, _ = CASES[1].make("float32")
    expected = fusedattn.attention(q, cache.k, cache.v, **paged)
    args = _torch_args(torch, paged)
    args["page_table"] = args["page_table"].long()  # torch's default integer: converted
    with torch.no_grad():
        o = fusedattn.attention(torch.from_numpy(q), torch.from_numpy(cache.k),
                                torch.from_numpy(cache.v), **args)
    np.testing.assert_array_equal(o.numpy(), expected)
    # The operator itself: schema, fake (shape) function and dispatch agree.
    from fusedattn import _problem, _torch
    options = _problem.normalize_options(layout="thd", mask="causal_bottom_right")
    problem = _torch.encode_problem(options, False, True, False)
    op_args = (torch.from_numpy(q), torch.from_numpy(cache.k), torch.from_numpy(cache.v), None,
               None, None, torch.from_numpy(paged["cu_seqlens_q"]), None, None, None,
               torch.from_numpy(cache.page_table), torch.from_numpy(cache.lens_kv), [], problem,
               "", [4, 0, 0])
    torch.library.opcheck(torch.ops.fusedattn.fwd.default, op_args)


def test_paged_decode_compiles_fullgraph():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import torch._dynamo
    torch._dynamo.reset()
    q, cache, paged, _ = CASES[0].make("float32")
    args = _torch_args(torch, paged)
    args.pop("max_seqlen_kv")
    tq, tk, tv = (torch.from_numpy(x) for x in (q, cache.k, cache.v))

    def step(q, k, v, page_table, seqlens_kv):
        return fusedattn.attention(q, k, v, **dict(args, page_table=page_table,
                                                   seqlens_kv=seqlens_kv))

    with torch.no_grad():
        eager = step(tq, tk, tv, args["page_table"], args["seqlens_kv"])
        compiled = torch.compile(step, fullgraph=True)(tq, tk, tv, args["page_table"],
                                                       args["seqlens_kv"])
    assert torch.equal(eager, compiled)


# ---------------------------------------------------------------------------------------------
# CUDA tensors (the GPU machine): the reference runs them when forced, equal to the CPU run; a
# float32 problem, which no GPU backend's paged kernel takes (flash's decode kernel is float16 or
# bfloat16), makes auto selection name each one's reason. (flash's decode kernel itself is
# tested against the reference in tests/gpu/flash_decode_test.cpp.)
# ---------------------------------------------------------------------------------------------


def _cuda_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to PyTorch")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_paged_cuda_reference_equals_the_cpu_run(case):
    torch = _cuda_torch()
    q, cache, paged, _ = case.make("bfloat16")
    expected, expected_lse = fusedattn.attention(q, cache.k, cache.v, return_lse=True, **paged)
    args = {name: (value.to("cuda") if isinstance(value, torch.Tensor) else value)
            for name, value in _torch_args(torch, paged).items()}

    def cuda(x):  # bfloat16 through float32: exact both ways
        return torch.from_numpy(x.astype(np.float32)).to(device="cuda", dtype=torch.bfloat16)

    with torch.no_grad():
        o, lse = fusedattn.attention(cuda(q), cuda(cache.k), cuda(cache.v), return_lse=True,
                                     backend="reference", **args)
    np.testing.assert_array_equal(o.float().cpu().numpy(), expected.astype(np.float32))
    np.testing.assert_array_equal(lse.cpu().numpy(), expected_lse)


@pytest.mark.gpu
def test_paged_cuda_auto_names_every_gpu_backends_reason():
    torch = _cuda_torch()
    q, cache, paged, _ = CASES[0].make("float32")
    args = {name: (value.to("cuda") if isinstance(value, torch.Tensor) else value)
            for name, value in _torch_args(torch, paged).items()}
    with pytest.raises(fusedattn.NotSupportedError) as error, torch.no_grad():
        fusedattn.attention(torch.from_numpy(q).cuda(), torch.from_numpy(cache.k).cuda(),
                            torch.from_numpy(cache.v).cuda(), **args)
    for backend in ("small_seq", "cudnn", "flash"):
        assert "%s: paged K/V (page_size = 4)" % backend in str(error.value), str(error.value)
