"""Score modifiers on torch tensors (marker `gpu`): fusedattn.attention with score_mod /
mask_mod through the same torch operators as every other call, forward and autograd (the
modifier's own tensors included) against the same attention written out in float64, eager and
under torch.compile(fullgraph=True). CUDA tensors run on the GPU backends; CPU tensors on the
reference backend, so the CPU cases run wherever torch is installed."""

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed here; the gpu tests run on the GPU machine")

import fusedattn  # noqa: E402
from fusedattn import flex  # noqa: E402

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device visible to PyTorch")

B, S, H, D = 2, 96, 4, 64
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
# (device, dtype) pairs: CUDA in bf16, the CPU reference in float32.
DEVICES = [pytest.param("cuda", torch.bfloat16, marks=needs_cuda, id="cuda"),
           pytest.param("cpu", torch.float32, id="cpu")]


def _inputs(dtype, device="cuda"):
    torch.manual_seed(7)
    return [torch.randn(B, S, H, D, device=device, dtype=dtype, requires_grad=True)
            for _ in range(3)]


def _float64_attention(q, k, v, modify):
    """o of softmax(modify(scale * q k^T, i, j)) v in float64 on the CPU, with its leaves.
    modify returns the modified scores (-inf where hidden)."""
    leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    qd, kd, vd = (x.permute(0, 2, 1, 3) for x in leaves)
    scores = qd @ kd.transpose(-1, -2) / D ** 0.5
    i = torch.arange(S, dtype=torch.float64).view(S, 1)
    j = torch.arange(S, dtype=torch.float64).view(1, S)
    o = torch.softmax(modify(scores, i, j), dim=-1) @ vd
    return o.permute(0, 2, 1, 3), leaves


def _relative(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def _check(dtype, modify, **mods):
    q, k, v = _inputs(dtype)
    o = fusedattn.attention(q, k, v, **mods)
    ref, leaves = _float64_attention(q, k, v, modify)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    ref.backward(d_o.double().cpu())
    tol = TOLERANCE[dtype]
    assert not torch.isnan(o).any()
    assert _relative(o, ref) < tol
    for name, got, leaf in zip("qkv", (q.grad, k.grad, v.grad), leaves):
        assert got is not None, name
        assert _relative(got, leaf.grad) < tol, name


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tanh_soft_cap_as_a_score_mod_matches_float64(dtype):
    _check(dtype, lambda s, i, j: 5 * torch.tanh(s / 5),
           score_mod=5 * flex.tanh(flex.score / 5))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_relative_position_bias_as_a_score_mod_matches_float64(dtype):
    _check(dtype, lambda s, i, j: s + 0.05 * (i - j),
           score_mod=flex.score + 0.05 * (flex.q_idx - flex.kv_idx))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_causal_mask_mod_matches_float64(dtype):
    _check(dtype, lambda s, i, j: s.masked_fill(j > i, float("-inf")),
           mask_mod=flex.kv_idx <= flex.q_idx)


@needs_cuda
def test_document_mask_from_a_torch_tensor_matches_float64():
    document = torch.tensor([[0] * 40 + [1] * 56, [0] * 10 + [1] * 86], device="cuda",
                            dtype=torch.int32)
    ids = flex.Tensor(document, name="document")
    same = ids[flex.batch, flex.q_idx] == ids[flex.batch, flex.kv_idx]
    doc = document.cpu()

    def modify(s, i, j):
        hidden = doc[:, :, None] != doc[:, None, :]  # [B, S, S]
        return s.masked_fill(hidden[:, None], float("-inf"))
    _check(torch.bfloat16, modify, mask_mod=same)


@needs_cuda
def test_a_score_mod_without_grad_runs_the_inference_forward():
    q, k, v = (x.detach() for x in _inputs(torch.bfloat16))
    with torch.no_grad():
        o, lse = fusedattn.attention(q, k, v, score_mod=5 * flex.tanh(flex.score / 5),
                                     return_lse=True)
    ref, _ = _float64_attention(q, k, v, lambda s, i, j: 5 * torch.tanh(s / 5))
    assert _relative(o, ref) < TOLERANCE[torch.bfloat16]
    assert lse.shape == (B, H, S)


def _key_bias_problem(device, dtype):
    """A learnable bias per (head, key) and a soft-cap as a score_mod, causal as a mask_mod.
    (A bias per head alone would have no gradient: softmax ignores a shift of a whole row.)"""
    torch.manual_seed(11)
    bias = torch.randn(H, S, device=device, dtype=torch.float32, requires_grad=True)
    table = flex.Tensor(bias, name="key bias", requires_grad=True)
    mod = flex.ScoreMod(score=flex.score + table[flex.head, flex.kv_idx]
                        + 0.5 * flex.tanh(flex.score / 5),
                        mask=flex.q_idx >= flex.kv_idx)
    return bias, mod


def _reference_key_bias(q, k, v, bias):
    leaves_bias = bias.detach().cpu().double().requires_grad_()

    def modify(s, i, j):
        s = s + leaves_bias.view(1, H, 1, S) + 0.5 * torch.tanh(s / 5)
        return s.masked_fill(j > i, float("-inf"))
    ref, leaves = _float64_attention(q, k, v, modify)
    return ref, leaves + [leaves_bias]


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_a_score_mod_tensor_gets_its_gradient_through_autograd(device, dtype):
    q, k, v = _inputs(dtype, device)
    bias, mod = _key_bias_problem(device, dtype)
    o = fusedattn.attention(q, k, v, score_mod=mod)
    ref, leaves = _reference_key_bias(q, k, v, bias)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    ref.backward(d_o.double().cpu())
    tol = TOLERANCE[dtype]
    assert _relative(o, ref) < tol
    for name, got, leaf in zip(("dq", "dk", "dv", "dbias"), (q.grad, k.grad, v.grad, bias.grad),
                               leaves):
        assert got is not None, name
        assert _relative(got, leaf.grad) < tol, name


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_a_score_mod_compiles_in_one_graph_and_matches_eager(device, dtype):
    """torch.compile(fullgraph=True) raises on any graph break: the expression is lowered to
    the op's text argument in plain Python, which dynamo traces."""
    import torch._dynamo
    torch._dynamo.reset()
    bias, _ = _key_bias_problem(device, dtype)
    table = flex.Tensor(bias, name="key bias", requires_grad=True)

    def loss_fn(q, k, v):
        # Expressions built inside the compiled function, as model code writes them.
        o = fusedattn.attention(q, k, v, score_mod=flex.score + table[flex.head, flex.kv_idx]
                                + 0.5 * flex.tanh(flex.score / 5),
                                mask_mod=flex.q_idx >= flex.kv_idx)
        return (o.float() ** 2).sum()

    def grads(fn):
        q, k, v = _inputs(dtype, device)
        bias.grad = None
        loss = fn(q, k, v)
        loss.backward()
        return loss.detach(), [x.grad.clone() for x in (q, k, v, bias)]

    eager_loss, eager_grads = grads(loss_fn)
    compiled_loss, compiled_grads = grads(torch.compile(loss_fn, fullgraph=True))
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2,
                                                                              atol=2e-2)
    torch.testing.assert_close(compiled_loss, eager_loss, **tolerance)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, **tolerance)
