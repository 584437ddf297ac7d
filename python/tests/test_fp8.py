"""FP8 attention through the DLPack API (fusedattn.forward / backward with fp8=..., fusedattn.h
"FP8 attention") with torch.float8_e4m3fn / float8_e5m2 tensors: on the CPU (the reference
backend) against an emulation written here with torch's own FP8 conversions, the amax outputs,
the errors; and, marked gpu, cuDNN's FP8 graphs against the reference."""
import math

import pytest

torch = pytest.importorskip("torch")

import fusedattn  # noqa: E402

B, S, H, D = 2, 64, 2, 64  # cuDNN FP8 takes head dims and lengths in multiples of 16
SCALE = 1.0 / math.sqrt(D)
DESCALE = dict(q=0.5, k=0.25, v=2.0, do=0.125)
SCALE_S = 256.0  # p <= 1: 256 p stays below e4m3's 448 (no saturation)


def _scalar(value, device="cpu"):
    return torch.tensor([value], dtype=torch.float32, device=device)


def _config(device="cpu", backend="reference", o_dtype="float32", dqkv_dtype="float32",
            causal=False):
    return dict(batch=B, heads_q=H, heads_kv=H, max_seqlen_q=S, max_seqlen_kv=S, head_dim_qk=D,
                head_dim_v=D, qkv_dtype="fp8_e4m3", o_dtype=o_dtype, do_dtype="fp8_e5m2",
                dqkv_dtype=dqkv_dtype, is_training=1, mask="causal" if causal else "none",
                device=device, backend=backend)


def _inputs(seed=3):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (((torch.rand(B, S, H, D, generator=g) * 4 - 2)).to(torch.float8_e4m3fn)
               for _ in range(3))
    d_o = (torch.rand(B, S, H, D, generator=g) * 4 - 2).to(torch.float8_e5m2)
    return q, k, v, d_o


def _forward_scales(device="cpu"):
    return dict(descale_q=_scalar(DESCALE["q"], device), descale_k=_scalar(DESCALE["k"], device),
                descale_v=_scalar(DESCALE["v"], device), descale_s=_scalar(1 / SCALE_S, device),
                scale_s=_scalar(SCALE_S, device), amax_s=_scalar(-1, device),
                amax_o=_scalar(-1, device))


def _emulated_probabilities(q, k, causal=False):
    qd = q.double() * DESCALE["q"]
    kd = k.double() * DESCALE["k"]
    s = torch.einsum("bihd,bjhd->bhij", qd, kd) * SCALE
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1)


def _quantized_s(p):
    # S_fp8 = Q8_e4m3(p * scale_s) (torch rounds to nearest even; nothing saturates here).
    return (p * SCALE_S).to(torch.float8_e4m3fn).double() / SCALE_S


def _run_forward(q, k, v, config, scales):
    o = torch.empty(B, S, H, D, dtype=torch.float32)
    lse = torch.empty(B, H, S, dtype=torch.float32)
    fusedattn.forward(config, q=q, k=k, v=v, o=o, lse=lse, fp8=scales)
    return o, lse


@pytest.mark.parametrize("causal", [False, True])
def test_forward_quantizes_s_as_specified_and_writes_amax(causal):
    q, k, v, _ = _inputs()
    scales = _forward_scales()
    o, _ = _run_forward(q, k, v, _config(causal=causal), scales)
    p = _emulated_probabilities(q, k, causal)
    expected = torch.einsum("bhij,bjhd->bihd", _quantized_s(p), v.double() * DESCALE["v"])
    torch.testing.assert_close(o.double(), expected, rtol=1e-6, atol=1e-6)
    unquantized = torch.einsum("bhij,bjhd->bihd", p, v.double() * DESCALE["v"])
    assert (o.double() - unquantized).abs().max() > 1e-4  # the quantization of S is visible
    assert scales["amax_s"].item() == pytest.approx(p.max().item(), rel=1e-6)
    assert scales["amax_o"].item() == o.abs().max().item()


def test_fp8_output_is_rounded_after_scale_o():
    q, k, v, _ = _inputs()
    o32, _ = _run_forward(q, k, v, _config(), _forward_scales())
    scales = dict(_forward_scales(), scale_o=_scalar(64.0))
    o8 = torch.empty(B, S, H, D, dtype=torch.float8_e4m3fn)
    lse = torch.empty(B, H, S, dtype=torch.float32)
    fusedattn.forward(_config(o_dtype="fp8_e4m3"), q=q, k=k, v=v, o=o8, lse=lse, fp8=scales)
    # |O| <= max |v| = 4, so 64 |O| <= 256: no saturation; one rounding of O * 64.
    torch.testing.assert_close(o8.double(), (o32 * 64).to(torch.float8_e4m3fn).double(),
                               rtol=0, atol=0)
    assert scales["amax_o"].item() == o32.abs().max().item()  # before scale_o


def test_backward_quantizes_s_and_dp_as_specified():
    q, k, v, d_o = _inputs()
    config = _config()
    o, lse = _run_forward(q, k, v, config, _forward_scales())
    p = _emulated_probabilities(q, k)
    qd, kd, vd = q.double() * DESCALE["q"], k.double() * DESCALE["k"], v.double() * DESCALE["v"]
    dod = d_o.double() * DESCALE["do"]
    delta = (dod * o.double()).sum(-1).transpose(1, 2)  # [b, h, i]
    dp = p * (torch.einsum("bihd,bjhd->bhij", dod, vd) - delta[..., None]) * SCALE
    scale_dp = 2.0 ** math.floor(math.log2(57344.0 / dp.abs().max().item()))
    scales = dict(descale_q=_scalar(DESCALE["q"]), descale_k=_scalar(DESCALE["k"]),
                  descale_v=_scalar(DESCALE["v"]), descale_do=_scalar(DESCALE["do"]),
                  descale_s=_scalar(1 / SCALE_S), descale_dp=_scalar(1 / scale_dp),
                  scale_s=_scalar(SCALE_S), scale_dp=_scalar(scale_dp), amax_dp=_scalar(-1),
                  amax_dq=_scalar(-1), amax_dk=_scalar(-1), amax_dv=_scalar(-1))
    dq, dk, dv = (torch.empty(B, S, H, D, dtype=torch.float32) for _ in range(3))
    fusedattn.backward(config, q=q, k=k, v=v, o=o, lse=lse, d_o=d_o, dq=dq, dk=dk, dv=dv,
                       fp8=scales)
    # The emulation's p comes from the exact LSE, the library's from the float32 one it wrote:
    # the two differ by float32 rounding (1e-7 relative), far below one FP8 step.
    dp8 = (dp * scale_dp).to(torch.float8_e5m2).double() / scale_dp
    torch.testing.assert_close(dv.double(), torch.einsum("bhij,bihd->bjhd", _quantized_s(p), dod),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dq.double(), torch.einsum("bhij,bjhd->bihd", dp8, kd),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dk.double(), torch.einsum("bhij,bihd->bjhd", dp8, qd),
                               rtol=1e-5, atol=1e-5)
    assert scales["amax_dp"].item() == pytest.approx(dp.abs().max().item(), rel=1e-5)
    for name, grad in (("amax_dq", dq), ("amax_dk", dk), ("amax_dv", dv)):
        assert scales[name].item() == grad.abs().max().item()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_an_invalid_scale_is_a_clear_error(bad):
    q, k, v, _ = _inputs()
    scales = dict(_forward_scales(), descale_k=_scalar(bad))
    with pytest.raises(fusedattn.InvalidArgumentError, match="args.descale_k .*finite and > 0"):
        _run_forward(q, k, v, _config(), scales)
    assert scales["amax_s"].item() == -1  # nothing written


def test_a_missing_scale_is_named():
    q, k, v, _ = _inputs()
    scales = _forward_scales()
    del scales["scale_s"]
    with pytest.raises(fusedattn.InvalidArgumentError, match="args.scale_s is NULL"):
        _run_forward(q, k, v, _config(), scales)
    with pytest.raises(fusedattn.InvalidArgumentError, match="unknown scaling tensor"):
        _run_forward(q, k, v, _config(), dict(_forward_scales(), scale_x=_scalar(1.0)))


def test_a_tensor_of_another_dtype_is_named():
    q, k, v, _ = _inputs()
    with pytest.raises(fusedattn.InvalidArgumentError, match="args.q.dtype = bfloat16"):
        _run_forward(q.to(torch.bfloat16), k, v, _config(), _forward_scales())
    with pytest.raises(fusedattn.InvalidArgumentError, match="float32 tensor of one element"):
        _run_forward(q, k, v, _config(), dict(_forward_scales(), scale_s=torch.ones(2)))


def test_config_has_the_fp8_dtype_fields():
    config = fusedattn.make_config(**_config())
    fields = fusedattn.config_dict(config)
    assert fields["do_dtype"] == "fp8_e5m2" and fields["dqkv_dtype"] == "float32"
    assert fusedattn.config_dict(fusedattn.make_config())["do_dtype"] == "default"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_fp8_forward_matches_the_reference(causal):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q, k, v, _ = _inputs()
    config = _config(device="cuda", backend="cudnn", o_dtype="fp8_e4m3", dqkv_dtype="fp8_e5m2",
                     causal=causal)
    reference = dict(_forward_scales(), scale_o=_scalar(64.0))
    o_ref = torch.empty(B, S, H, D, dtype=torch.float8_e4m3fn)
    lse_ref = torch.empty(B, H, S)
    fusedattn.forward(dict(config, device="cpu", backend="reference"), q=q, k=k, v=v, o=o_ref,
                      lse=lse_ref, fp8=reference)
    scales = dict(_forward_scales("cuda"), scale_o=_scalar(64.0, "cuda"))
    o = torch.empty(B, S, H, D, dtype=torch.float8_e4m3fn, device="cuda")
    lse = torch.empty(B, H, S, device="cuda")
    try:
        fusedattn.forward(config, q=q.cuda(), k=k.cuda(), v=v.cuda(), o=o, lse=lse, fp8=scales)
    except fusedattn.NotSupportedError as e:
        pytest.skip("cuDNN refuses this FP8 problem here: %s" % e)
    torch.cuda.synchronize()
    # tests/gpu/cudnn_fp8_test.cpp's bound, coarsened: before the output rounding the two O differ
    # by at most 2.05 B, B <= (2^-4 + S 2^-10 / scale_s) max|v| (src/testing/fp8.h), and the
    # e4m3 rounding of O * 64 by one step (2^-3 |value| + 2^-9) more.
    bound = 2.05 * (2 ** -4 + S * 2 ** -10 / SCALE_S) * (v.double().abs().max() * DESCALE["v"])
    diff = (o.cpu().double() - o_ref.double()).abs()
    assert (diff <= 64 * bound + o_ref.double().abs() * 2 ** -3 + 2 ** -9).all()
    torch.testing.assert_close(lse.cpu(), lse_ref, rtol=0, atol=1e-4)
    assert scales["amax_s"].item() == pytest.approx(reference["amax_s"].item(), rel=1e-5)
