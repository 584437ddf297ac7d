"""fusedattn.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention
(the specification of the drop-in), computed in float64 on the same float32 values: forward and
gradients for every mask kind, GQA, scale, ranks other than 4; fully masked rows; dropout's
seed; the errors where torch's function raises too. Runs on CPU tensors (the reference backend)
here and in CI, and on CUDA tensors where a device is present."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

import fusedattn  # noqa: E402
from helpers import TOLERANCE  # noqa: E402

F = torch.nn.functional

# CUDA runs are marked `gpu` (`pytest -m gpu` on the GPU machine selects them).
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])]


def _rel(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def _inputs(shape_q, shape_kv, device, seed=0, dim_v=None):
    generator = torch.Generator().manual_seed(seed)
    dim_v = dim_v or shape_kv[-1]
    q = torch.randn(shape_q, generator=generator)
    k = torch.randn(shape_kv, generator=generator)
    v = torch.randn(shape_kv[:-1] + (dim_v,), generator=generator)
    return [x.to(device).requires_grad_() for x in (q, k, v)]


def _check(q, k, v, tolerance=TOLERANCE["float32"], mask_grad=None, **kwargs):
    """Forward and gradients (q, k, v, and a float mask that requires grad) of fusedattn's
    function against torch's in float64, computed on the inputs' device (so the reference, its
    leaves and the output gradient all live there)."""
    out = fusedattn.scaled_dot_product_attention(q, k, v, **kwargs)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref_kwargs = dict(kwargs)
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        ref_kwargs["attn_mask"] = mask.detach().double().requires_grad_(mask.requires_grad)
    ref = F.scaled_dot_product_attention(*leaves, **ref_kwargs)
    assert out.shape == ref.shape and out.dtype == q.dtype and out.device == q.device
    assert _rel(out, ref) < tolerance, "forward: %.3g" % _rel(out, ref)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    out.backward(d_out.to(out.dtype))
    ref.backward(d_out.double())
    pairs = list(zip("qkv", (q, k, v), leaves))
    if mask_grad:
        pairs.append(("attn_mask", mask, ref_kwargs["attn_mask"]))
    for name, x, leaf in pairs:
        assert x.grad is not None and torch.isfinite(x.grad).all(), name
        assert _rel(x.grad, leaf.grad) < tolerance, "d%s: %.3g" % (name, _rel(x.grad, leaf.grad))
    return out


# (query shape, key shape): [batch, heads, seq, dim]
SHAPES = {
    "square": ((2, 4, 33, 16), (2, 4, 33, 16)),
    "more_keys": ((2, 4, 17, 16), (2, 4, 40, 16)),
    "more_queries": ((1, 2, 40, 16), (1, 2, 17, 16)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch_without_mask(device, shape, is_causal):
    """is_causal is top-left, as PyTorch defines it, also when seq_q != seq_kv."""
    q, k, v = _inputs(*SHAPES[shape], device)
    _check(q, k, v, is_causal=is_causal)


def _bool_mask(shape, device, seed=3):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    return mask.to(device)


def _key_padding(batch, seqlen_kv, lengths, device):
    mask = torch.arange(seqlen_kv)[None, :] < torch.tensor(lengths)[:, None]
    return mask[:, None, None, :].to(device)  # [batch, 1, 1, seq_kv]


# name -> (mask maker (q shape, k shape, device) -> mask, whether it is a float mask needing
# its gradient)
MASKS = {
    "bool_full": (lambda sq, sk, d: _bool_mask((sq[0], sq[1], sq[2], sk[2]), d), False),
    "bool_key_padding": (lambda sq, sk, d: _key_padding(sq[0], sk[2], [sk[2], sk[2] // 2], d),
                         False),
    "bool_2d": (lambda sq, sk, d: _bool_mask((sq[2], sk[2]), d), False),
    "bool_heads_only": (lambda sq, sk, d: _bool_mask((1, sq[1], sq[2], sk[2]), d), False),
    "float_full": (lambda sq, sk, d: torch.randn(sq[0], sq[1], sq[2], sk[2]).to(d), False),
    "float_broadcast": (lambda sq, sk, d: torch.randn(1, sq[1], 1, sk[2]).to(d), False),
    "float_with_neg_inf": (lambda sq, sk, d: torch.randn(sq[0], 1, sq[2], sk[2]).masked_fill(
        torch.rand(sq[0], 1, sq[2], sk[2], generator=torch.Generator().manual_seed(5)) < 0.3,
        float("-inf")).to(d), False),
    "float_requires_grad": (lambda sq, sk, d: torch.randn(sq[0], 1, sq[2], sk[2]).to(d)
                            .requires_grad_(), True),
    "float_broadcast_requires_grad": (lambda sq, sk, d: torch.randn(1, sq[1], 1, sk[2]).to(d)
                                      .requires_grad_(), True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_matches_torch_with_mask(device, kind):
    """Boolean masks (True = takes part) and additive float masks of every broadcast shape,
    float masks differentiable."""
    shape_q, shape_kv = SHAPES["more_keys"]
    make, needs_grad = MASKS[kind]
    q, k, v = _inputs(shape_q, shape_kv, device)
    mask = make(shape_q, shape_kv, device)
    if mask.dtype == torch.bool:
        mask[..., 0] = True  # no fully masked row here (their own test is below)
    _check(q, k, v, attn_mask=mask, mask_grad=needs_grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_grouped_query_attention(device, is_causal):
    q, k, v = _inputs((2, 8, 20, 16), (2, 2, 28, 16), device)
    _check(q, k, v, is_causal=is_causal, enable_gqa=True)


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_query_attention_with_mask(device):
    q, k, v = _inputs((2, 6, 12, 16), (2, 3, 12, 16), device)
    _check(q, k, v, attn_mask=_bool_mask((2, 1, 12, 12), device) | torch.eye(12, dtype=torch.bool,
                                                                               device=device),
           enable_gqa=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [0.05, 1.0])
def test_scale(device, scale):
    q, k, v = _inputs(*SHAPES["square"], device)
    _check(q, k, v, scale=scale, is_causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_value_head_dim_differs(device):
    q, k, v = _inputs((2, 2, 9, 16), (2, 2, 11, 16), device, dim_v=24)
    _check(q, k, v, is_causal=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [
    ((5, 16), (7, 16)),                          # [seq, dim]
    ((3, 5, 16), (3, 7, 16)),                    # [heads, seq, dim]
    ((2, 3, 2, 5, 16), (2, 3, 2, 7, 16)),        # [batch, extra, heads, seq, dim]
], ids=["rank2", "rank3", "rank5"])
def test_ranks_other_than_four(device, shapes):
    q, k, v = _inputs(*shapes, device)
    mask = _bool_mask(shapes[0][:-1] + (shapes[1][-2],), device)
    mask[..., 0] = True
    _check(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("device", DEVICES)
def test_rank3_grouped_query_attention_reads_axis_minus_three(device):
    q, k, v = _inputs((4, 6, 16), (2, 6, 16), device)
    _check(q, k, v, enable_gqa=True, is_causal=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_dtype", ["bool", "float"])
def test_fully_masked_rows_give_zero_output_and_gradients(device, mask_dtype):
    """A query row whose keys are all masked: output 0 and no gradient through it, as PyTorch
    2.5+ gives (fusedattn's rule: never NaN)."""
    q, k, v = _inputs((1, 2, 4, 8), (1, 2, 6, 8), device)
    keep = torch.ones(1, 1, 4, 6, dtype=torch.bool, device=device)
    keep[..., 2, :] = False
    mask = keep if mask_dtype == "bool" else torch.zeros(keep.shape, device=device).masked_fill(
        ~keep, float("-inf"))
    out = _check(q, k, v, attn_mask=mask)
    assert (out[:, :, 2] == 0).all()
    assert (q.grad[:, :, 2] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_seed_comes_from_torch_generator(device):
    """dropout_p applies the library's dropout with a seed drawn from torch's default CPU
    generator: torch.manual_seed repeats it, and it is the seed fusedattn.attention takes."""
    q, k, v = _inputs((1, 2, 16, 8), (1, 2, 16, 8), device)
    torch.manual_seed(123)
    first = fusedattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(123)
    second = fusedattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(123)
    seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))
    expected = fusedattn.attention(q, k, v, layout="bhsd", dropout_p=0.3, dropout_seed=seed)
    undropped = fusedattn.scaled_dot_product_attention(q, k, v)
    assert torch.equal(first, second) and torch.equal(first, expected)
    assert not torch.allclose(first, undropped)
    first.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_is_causal_with_mask_is_refused():
    q, k, v = _inputs((1, 1, 4, 8), (1, 1, 4, 8), "cpu")
    with pytest.raises(fusedattn.InvalidArgumentError, match="attn_mask and is_causal"):
        fusedattn.scaled_dot_product_attention(q, k, v, torch.ones(4, 4, dtype=torch.bool),
                                               is_causal=True)


def test_grouped_heads_without_enable_gqa_are_refused():
    q, k, v = _inputs((1, 4, 4, 8), (1, 2, 4, 8), "cpu")
    with pytest.raises(fusedattn.InvalidArgumentError, match="enable_gqa=True"):
        fusedattn.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("mask,match", [
    (torch.ones(3, 4, dtype=torch.int64), "boolean .* or float"),
    (torch.ones(1, 1, 3, 4, dtype=torch.bool), "does not broadcast"),
    (torch.ones(1, 1, 1, 4, 5, dtype=torch.bool), "at most 4 axes"),
], ids=["int_mask", "bad_shape", "rank5_mask"])
def test_bad_masks_are_refused(mask, match):
    q, k, v = _inputs((1, 2, 4, 8), (1, 2, 5, 8), "cpu")
    with pytest.raises(fusedattn.InvalidArgumentError, match=match):
        fusedattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_float64_is_refused_naming_the_dtypes_taken():
    q, k, v = (x.double() for x in _inputs((1, 1, 4, 8), (1, 1, 4, 8), "cpu"))
    with pytest.raises(fusedattn.InvalidArgumentError, match="takes float32, float16 and bfloat16"):
        fusedattn.scaled_dot_product_attention(q, k, v)


def test_numpy_arrays_are_refused():
    import numpy as np
    x = np.zeros((1, 1, 4, 8), dtype=np.float32)
    with pytest.raises(TypeError, match="torch tensors"):
        fusedattn.scaled_dot_product_attention(x, x, x)


def test_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) traces the drop-in, mask conversion included."""
    q, k, v = _inputs((2, 4, 9, 16), (2, 2, 11, 16), "cpu")
    mask = _key_padding(2, 11, [11, 6], "cpu")

    def attention(q, k, v, mask):
        return fusedattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    compiled = torch.compile(attention, backend="eager", fullgraph=True)
    assert torch.allclose(compiled(q, k, v, mask), attention(q, k, v, mask), rtol=0, atol=1e-6)
