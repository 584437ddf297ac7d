"""Score modifiers on torch tensors (marker `gpu`; runs on the GPU machine): fusedattn.attention
with score_mod / mask_mod on CUDA tensors (the cuDNN backend runs them), forward and autograd,
against the same attention written out in float64 on the CPU. Skips without torch or a device."""

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed here; the gpu tests run on the GPU machine")

import fusedattn  # noqa: E402
from fusedattn import flex  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="no CUDA device visible to PyTorch")]

B, S, H, D = 2, 96, 4, 64
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _inputs(dtype):
    torch.manual_seed(7)
    return [torch.randn(B, S, H, D, device="cuda", dtype=dtype, requires_grad=True)
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tanh_soft_cap_as_a_score_mod_matches_float64(dtype):
    _check(dtype, lambda s, i, j: 5 * torch.tanh(s / 5),
           score_mod=5 * flex.tanh(flex.score / 5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_relative_position_bias_as_a_score_mod_matches_float64(dtype):
    _check(dtype, lambda s, i, j: s + 0.05 * (i - j),
           score_mod=flex.score + 0.05 * (flex.q_idx - flex.kv_idx))


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_causal_mask_mod_matches_float64(dtype):
    _check(dtype, lambda s, i, j: s.masked_fill(j > i, float("-inf")),
           mask_mod=flex.kv_idx <= flex.q_idx)


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


def test_a_score_mod_without_grad_runs_the_inference_forward():
    q, k, v = (x.detach() for x in _inputs(torch.bfloat16))
    with torch.no_grad():
        o, lse = fusedattn.attention(q, k, v, score_mod=5 * flex.tanh(flex.score / 5),
                                     return_lse=True)
    ref, _ = _float64_attention(q, k, v, lambda s, i, j: 5 * torch.tanh(s / 5))
    assert _relative(o, ref) < TOLERANCE[torch.bfloat16]
    assert lse.shape == (B, H, S)
