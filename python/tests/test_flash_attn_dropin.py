"""fusedattn.flash_attn against FlashAttention-2's documented semantics, written here in float64
torch (the flash_attn package is not a test dependency): [batch, seq, heads, dim] tensors,
causal and sliding windows aligned to the bottom-right corner, softcap, ALiBi, GQA, the varlen
functions over cu_seqlens, the packed variants, and the arguments it refuses. KV caches
(flash_attn_with_kvcache, varlen with block_table): test_flash_attn_kvcache.py."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

import fusedattn  # noqa: E402
from fusedattn import flash_attn as fa  # noqa: E402
from helpers import TOLERANCE  # noqa: E402

# CUDA runs are marked `gpu` (`pytest -m gpu` on the GPU machine selects them).
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])]


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """One sequence, as flash_attn documents it: q [seq_q, heads, dim], k/v [seq_k, heads_k,
    dim] float64; query i sees keys in [i + seq_k - seq_q - left, i + seq_k - seq_q + right]
    (right = 0 when causal), ALiBi subtracts slope * |i + seq_k - seq_q - j| after the softcap;
    rows with no key give 0."""
    seq_q, heads, dim = q.shape
    seq_k, heads_k = k.shape[:2]
    k = k.repeat_interleave(heads // heads_k, dim=1)
    v = v.repeat_interleave(heads // heads_k, dim=1)
    scale = dim ** -0.5 if scale is None else scale
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(seq_q)[:, None]
    j = torch.arange(seq_k)[None, :]
    diagonal = i + seq_k - seq_q
    if alibi is not None:
        s = s - alibi.double()[:, None, None] * (diagonal - j).abs()
    left, right = window
    right = 0 if causal else right
    keep = torch.ones(seq_q, seq_k, dtype=torch.bool)
    if left >= 0:
        keep &= j >= diagonal - left
    if right >= 0:
        keep &= j <= diagonal + right
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v)


def _rel(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def _tensors(shapes, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator).to(device).requires_grad_() for s in shapes]


def _compare(out, ref, inputs, leaves, tolerance=TOLERANCE["float32"]):
    assert _rel(out, ref) < tolerance, "forward: %.3g" % _rel(out, ref)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    out.backward(d_out.to(out.device))
    ref.backward(d_out.double())
    for name, x, leaf in zip("qkv", inputs, leaves):
        assert _rel(x.grad, leaf.grad) < tolerance, "d%s: %.3g" % (name, _rel(x.grad, leaf.grad))


# name -> (seq_q, seq_k, heads, heads_k, flash_attn keyword arguments)
CASES = {
    "plain": (24, 24, 4, 4, {}),
    "causal": (24, 24, 4, 4, dict(causal=True)),
    "causal_fewer_queries": (9, 30, 4, 2, dict(causal=True)),
    "causal_more_queries": (30, 9, 2, 2, dict(causal=True)),
    "window": (24, 31, 4, 4, dict(window_size=(5, 3))),
    "causal_window": (24, 24, 4, 1, dict(causal=True, window_size=(6, -1))),
    "left_window_only": (20, 20, 2, 2, dict(window_size=(4, -1))),
    "softcap": (16, 20, 4, 4, dict(causal=True, softcap=5.0)),
    "scale": (16, 16, 2, 2, dict(softmax_scale=0.3)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attn_func_matches_flash_attention_semantics(device, name):
    seq_q, seq_k, heads, heads_k, kwargs = CASES[name]
    q, k, v = _tensors([(2, seq_q, heads, 16), (2, seq_k, heads_k, 16),
                        (2, seq_k, heads_k, 16)], device)
    out = fa.flash_attn_func(q, k, v, **kwargs)
    assert out.shape == q.shape
    leaves = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    ref_kwargs = dict(causal=kwargs.get("causal", False),
                      window=kwargs.get("window_size", (-1, -1)),
                      softcap=kwargs.get("softcap", 0.0), scale=kwargs.get("softmax_scale"))
    ref = torch.stack([reference(*(x[b] for x in leaves), **ref_kwargs) for b in range(2)])
    _compare(out, ref, (q, k, v), leaves)


@pytest.mark.parametrize("device", DEVICES)
def test_alibi_slopes(device):
    q, k, v = _tensors([(2, 12, 4, 16), (2, 20, 4, 16), (2, 20, 4, 16)], device)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device)
    out = fa.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    leaves = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    ref = torch.stack([reference(*(x[b] for x in leaves), causal=True, alibi=slopes.cpu())
                       for b in range(2)])
    _compare(out, ref, (q, k, v), leaves)


VARLEN_CASES = {
    "self": ([5, 17, 1, 9], [5, 17, 1, 9], dict(causal=True)),
    "cross": ([3, 8, 6], [10, 4, 6], dict(causal=True)),
    "window": ([12, 7], [12, 9], dict(window_size=(3, 2))),
    "empty_sequence": ([4, 0, 6], [4, 0, 6], dict(causal=True, softcap=3.0)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(VARLEN_CASES))
def test_flash_attn_varlen_func_matches_per_sequence(device, name):
    lengths_q, lengths_k, kwargs = VARLEN_CASES[name]
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q, k, v = _tensors([(total_q, 4, 16), (total_k, 2, 16), (total_k, 2, 16)], device)
    cu_q = torch.tensor([0] + lengths_q, dtype=torch.int32).cumsum(0).int().to(device)
    cu_k = torch.tensor([0] + lengths_k, dtype=torch.int32).cumsum(0).int().to(device)
    out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                    **kwargs)
    assert out.shape == q.shape
    leaves = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    pieces = []
    for b in range(len(lengths_q)):
        qs = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ks = slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lengths_q[b]:
            pieces.append(reference(leaves[0][qs], leaves[1][ks], leaves[2][ks],
                                    causal=kwargs.get("causal", False),
                                    window=kwargs.get("window_size", (-1, -1)),
                                    softcap=kwargs.get("softcap", 0.0)))
    _compare(out, torch.cat(pieces), (q, k, v), leaves)


def test_packed_variants_equal_the_unpacked_functions():
    qkv, = _tensors([(2, 10, 3, 4, 16)], "cpu")
    q, k, v = qkv.unbind(2)
    expected = fa.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(fa.flash_attn_qkvpacked_func(qkv, causal=True), expected)
    assert torch.equal(fa.flash_attn_kvpacked_func(q, torch.stack((k, v), 2), causal=True),
                       expected)
    flat = qkv.reshape(20, 3, 4, 16)
    cu = torch.tensor([0, 10, 20], dtype=torch.int32)
    varlen = fa.flash_attn_varlen_qkvpacked_func(flat, cu, 10, causal=True)
    assert torch.allclose(varlen.reshape(2, 10, 4, 16), expected, rtol=0, atol=1e-6)
    fq, fk, fv = flat.unbind(1)
    assert torch.equal(fa.flash_attn_varlen_kvpacked_func(fq, torch.stack((fk, fv), 1), cu, cu,
                                                          10, 10, causal=True), varlen)
    expected.sum().backward()
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape


def test_top_level_names_are_the_same_functions():
    assert fusedattn.flash_attn_func is fa.flash_attn_func
    assert fusedattn.flash_attn_varlen_func is fa.flash_attn_varlen_func


def test_dropout_is_applied_and_repeatable_with_torch_manual_seed():
    q, k, v = _tensors([(1, 16, 2, 8)] * 3, "cpu")
    torch.manual_seed(5)
    first = fa.flash_attn_func(q, k, v, dropout_p=0.25)
    torch.manual_seed(5)
    assert torch.equal(first, fa.flash_attn_func(q, k, v, dropout_p=0.25))
    assert not torch.allclose(first, fa.flash_attn_func(q, k, v))


def _qkv(shape=(1, 4, 2, 8)):
    return _tensors([shape] * 3, "cpu")


def test_return_attn_probs_is_refused():
    with pytest.raises(fusedattn.NotSupportedError, match="return_attn_probs"):
        fa.flash_attn_func(*_qkv(), return_attn_probs=True)


def test_varlen_without_max_seqlen_is_refused():
    q, k, v = _tensors([(4, 2, 8)] * 3, "cpu")
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(fusedattn.InvalidArgumentError, match="max_seqlen_q and max_seqlen_k"):
        fa.flash_attn_varlen_func(q, k, v, cu, cu, None, None)


def test_alibi_slopes_per_batch_are_refused():
    with pytest.raises(fusedattn.NotSupportedError, match="one slope per head"):
        fa.flash_attn_func(*_qkv(), alibi_slopes=torch.ones(1, 2))


def test_bad_window_is_refused():
    with pytest.raises(fusedattn.InvalidArgumentError, match="window_size"):
        fa.flash_attn_func(*_qkv(), window_size=3)


def test_numpy_arrays_are_refused():
    import numpy as np
    x = np.zeros((1, 4, 2, 8), dtype=np.float32)
    with pytest.raises(TypeError, match="torch tensors"):
        fa.flash_attn_func(x, x, x)


def test_varlen_compiles_without_graph_breaks():
    q, k, v = _tensors([(10, 4, 16), (10, 2, 16), (10, 2, 16)], "cpu")
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)

    def attention(q, k, v, cu):
        return fa.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True, window_size=(2, 0))

    compiled = torch.compile(attention, backend="eager", fullgraph=True)
    assert torch.allclose(compiled(q, k, v, cu), attention(q, k, v, cu), rtol=0, atol=1e-6)
