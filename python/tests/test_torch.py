"""The PyTorch path (marker `gpu`; runs on the GPU machine): forward and autograd against
torch.nn.functional.scaled_dot_product_attention computed in float64 on the CPU, the custom ops'
fake implementations (torch.library.opcheck), torch.compile(fullgraph=True) and CUDA-graph
capture. Skips without torch, and the CUDA tests without a device, saying why. A problem that no
built backend runs is skipped with the library's diagnostic."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed here; the gpu tests run on the GPU machine")

import fusedattn  # noqa: E402  (after torch: registers the torch ops at import)
from helpers import TOLERANCE, relative_error  # noqa: E402
from oracle import Problem, visible  # noqa: E402

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device visible to PyTorch")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}


def _shape(layout, b, s, h, d):
    return {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d)}[layout]


def _rel(a, b):
    return relative_error(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy())


def _run_or_skip(fn):
    """Runs fn; a problem no built backend accepts skips the test with the library's reason."""
    try:
        return fn()
    except fusedattn.NotSupportedError as error:
        pytest.skip("not supported by the built backends: %s" % error)


def sdpa_float64(q, k, v, layout="bshd", mask=None, window=(-1, -1), bias=None, scale=None):
    """torch's scaled_dot_product_attention on float64 CPU copies, with the header's masks as an
    explicit boolean mask (and GQA by repeating k/v heads). Returns (o in layout, leaves)."""
    leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    qd, kd, vd = (x.permute(_TO_BHSD[layout]) for x in leaves)
    group = qd.shape[1] // kd.shape[1]
    kd, vd = kd.repeat_interleave(group, dim=1), vd.repeat_interleave(group, dim=1)
    sq, skv = qd.shape[2], kd.shape[2]
    mask = mask or "none"
    causal = mask.startswith("causal")
    keep = torch.from_numpy(visible(sq, skv, causal, mask == "causal", window))
    attn_mask = torch.zeros(sq, skv, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    if bias is not None:
        bias_leaf = bias.detach().cpu().double().requires_grad_()
        leaves.append(bias_leaf)
        attn_mask = attn_mask + bias_leaf
    o = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, attn_mask=attn_mask,
                                                         scale=scale)
    inverse = tuple(int(i) for i in np.argsort(_TO_BHSD[layout]))
    return o.permute(inverse), leaves


SDPA_CASES = [
    dict(id="bshd", layout="bshd", b=2, sq=128, skv=128, hq=4, hkv=4, d=64),
    dict(id="bshd_causal", layout="bshd", b=2, sq=128, skv=128, hq=4, hkv=4, d=128,
         mask="causal"),
    dict(id="bhsd_gqa", layout="bhsd", b=2, sq=96, skv=160, hq=8, hkv=2, d=64),
    dict(id="bshd_causal_bottom_right", layout="bshd", b=1, sq=64, skv=200, hq=4, hkv=4, d=64,
         mask="causal_bottom_right"),
    dict(id="sbhd_window", layout="sbhd", b=2, sq=128, skv=128, hq=2, hkv=1, d=64,
         window=(32, 16)),
    dict(id="bshd_bias", layout="bshd", b=2, sq=64, skv=96, hq=4, hkv=4, d=64, bias=True),
    dict(id="bshd_d256", layout="bshd", b=1, sq=64, skv=64, hq=2, hkv=2, d=256, mask="causal"),
]


def _make(case, dtype, device, requires_grad=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    layout = case["layout"]

    def tensor(shape):
        x = torch.randn(shape, generator=generator).to(device=device, dtype=DTYPES[dtype])
        return x.requires_grad_(requires_grad)

    q = tensor(_shape(layout, case["b"], case["sq"], case["hq"], case["d"]))
    k = tensor(_shape(layout, case["b"], case["skv"], case["hkv"], case["d"]))
    v = tensor(_shape(layout, case["b"], case["skv"], case["hkv"], case["d"]))
    kwargs = dict(layout=layout, mask=case.get("mask"), window=case.get("window", (-1, -1)))
    if case.get("bias"):
        kwargs["bias"] = tensor((1, case["hq"], case["sq"], case["skv"]))
    return q, k, v, kwargs


def _check_against_sdpa(case, dtype, device):
    q, k, v, kwargs = _make(case, dtype, device)
    o = _run_or_skip(lambda: fusedattn.attention(q, k, v, **kwargs))
    assert o.dtype == q.dtype and o.device == q.device and o.shape == q.shape
    ref, leaves = sdpa_float64(q, k, v, kwargs["layout"], kwargs["mask"], kwargs["window"],
                               kwargs.get("bias"))
    assert not torch.isnan(o).any()
    tolerance = TOLERANCE[dtype]
    assert _rel(o, ref) < tolerance, "%s %s forward: %.3g" % (case["id"], dtype, _rel(o, ref))
    d_o = torch.randn(o.shape, generator=torch.Generator().manual_seed(1))
    o.backward(d_o.to(device=device, dtype=o.dtype))
    ref.backward(d_o.double())
    inputs = [q, k, v] + ([kwargs["bias"]] if "bias" in kwargs else [])
    for name, x, leaf in zip(("dq", "dk", "dv", "dbias"), inputs, leaves):
        assert x.grad is not None and not torch.isnan(x.grad).any(), name
        error = _rel(x.grad, leaf.grad)
        assert error < tolerance, "%s %s %s: %.3g" % (case["id"], dtype, name, error)


@pytest.mark.parametrize("case", [SDPA_CASES[0], SDPA_CASES[1], SDPA_CASES[2], SDPA_CASES[5]],
                         ids=lambda c: c["id"])
def test_cpu_tensors_match_sdpa_forward_and_backward(case):
    """CPU torch tensors run on the reference backend, through the same custom ops."""
    small = dict(case, sq=min(case["sq"], 32), skv=min(case["skv"], 48))
    _check_against_sdpa(small, "float32", "cpu")


@needs_cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: c["id"])
def test_cuda_matches_sdpa_forward_and_backward(case, dtype):
    _check_against_sdpa(case, dtype, "cuda")


@needs_cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_thd_varlen_matches_the_oracle(dtype):
    lens_q, lens_kv = [37, 1, 128, 75], [37, 64, 128, 200]
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_kv = torch.tensor(np.concatenate([[0], np.cumsum(lens_kv)]), dtype=torch.int32)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(int(cu_q[-1]), 8, 64, generator=generator).to(DTYPES[dtype])
    k = torch.randn(int(cu_kv[-1]), 2, 64, generator=generator).to(DTYPES[dtype])
    v = torch.randn(int(cu_kv[-1]), 2, 64, generator=generator).to(DTYPES[dtype])
    kwargs = dict(layout="thd", mask="causal_bottom_right", max_seqlen_q=max(lens_q),
                  max_seqlen_kv=max(lens_kv))
    qc, kc, vc = (x.cuda().requires_grad_() for x in (q, k, v))
    o = _run_or_skip(lambda: fusedattn.attention(qc, kc, vc, cu_seqlens_q=cu_q.cuda(),
                                                 cu_seqlens_kv=cu_kv.cuda(), **kwargs))
    to_np = lambda x: x.detach().float().cpu().numpy()  # noqa: E731
    oracle = Problem(cu_seqlens_q=cu_q.numpy(), cu_seqlens_kv=cu_kv.numpy(), **kwargs)
    ref_o, _ = oracle.forward(to_np(q), to_np(k), to_np(v))
    assert relative_error(to_np(o), ref_o) < TOLERANCE[dtype]
    d_o = torch.randn(o.shape, generator=generator).to(o.dtype)
    o.backward(d_o.cuda())
    ref = oracle.backward(to_np(d_o), to_np(q), to_np(k), to_np(v))
    for name, x, want in zip(("dq", "dk", "dv"), (qc, kc, vc), ref):
        error = relative_error(to_np(x.grad), want)
        assert error < TOLERANCE[dtype], "%s: %.3g" % (name, error)


@pytest.mark.parametrize("device,dtype", [("cpu", "float32"),
                                          pytest.param("cuda", "bfloat16", marks=needs_cuda)])
@pytest.mark.parametrize("feature", ["sinks", "softcap", "alibi", "off_by_one"])
def test_features_match_the_oracle(feature, device, dtype):
    b, s, h, d = 2, 96, 4, 64
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=generator).to(DTYPES[dtype]) for _ in range(3))
    kwargs = dict(mask="causal")
    leaves = {}
    if feature == "sinks":
        kwargs["sinks"] = torch.randn(h, generator=generator)
    if feature == "softcap":
        kwargs["softcap"] = 5.0
    if feature == "alibi":
        kwargs["alibi_slopes"] = 0.5 ** torch.arange(1, h + 1, dtype=torch.float32)
    if feature == "off_by_one":
        kwargs["softmax"] = "off_by_one"
    qc, kc, vc = (x.to(device).requires_grad_() for x in (q, k, v))
    cuda_kwargs = {n: (x.to(device) if isinstance(x, torch.Tensor) else x)
                   for n, x in kwargs.items()}
    if "sinks" in cuda_kwargs:
        cuda_kwargs["sinks"] = leaves["sinks"] = cuda_kwargs["sinks"].requires_grad_()
    o = _run_or_skip(lambda: fusedattn.attention(qc, kc, vc, **cuda_kwargs))
    to_np = lambda x: x.detach().float().cpu().numpy()  # noqa: E731
    oracle = Problem(**{n: (to_np(x) if isinstance(x, torch.Tensor) else x)
                        for n, x in kwargs.items()})
    ref_o, _ = oracle.forward(to_np(q), to_np(k), to_np(v))
    assert relative_error(to_np(o), ref_o) < TOLERANCE[dtype]
    d_o = torch.randn(o.shape, generator=generator).to(o.dtype)
    o.backward(d_o.to(device))
    dq, dk, dv, _, dsink = oracle.backward(to_np(d_o), to_np(q), to_np(k), to_np(v))
    for name, x, want in (("dq", qc, dq), ("dk", kc, dk), ("dv", vc, dv)):
        assert relative_error(to_np(x.grad), want) < TOLERANCE[dtype], name
    if feature == "sinks":
        assert relative_error(to_np(leaves["sinks"].grad), dsink) < TOLERANCE[dtype]


def test_dropout_positions_give_a_block_the_whole_problems_mask_through_autograd():
    # A whole problem whose rows see only keys 5..11 (bottom-right causal, window 3), and its
    # block of sequence 1, heads 1..2 and keys 4..11 placed in the whole problem's dropout mask:
    # the torch op carries the place to the forward and to the backward that autograd runs.
    g = torch.Generator().manual_seed(5)
    q, d_o = (torch.randn(2, 4, 4, 8, generator=g) for _ in range(2))
    k, v = (torch.randn(2, 12, 4, 8, generator=g) for _ in range(2))
    problem = dict(mask="causal_bottom_right", window=(3, 0), dropout_p=0.4, dropout_seed=7)
    place = fusedattn.DropoutPositions(batch_offset=1, heads=4, head_offset=1, key_offset=4)
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    o, lse = fusedattn.attention(*whole, return_lse=True, **problem)
    o.backward(d_o)
    block = [x[1:, :, 1:3].clone().requires_grad_() for x in (q,)] + \
        [x[1:, 4:, 1:3].clone().requires_grad_() for x in (k, v)]
    bo, blse = fusedattn.attention(*block, return_lse=True, dropout_positions=place, **problem)
    bo.backward(d_o[1:, :, 1:3])
    # The reference sums the same terms in the same order: equal, not close.
    assert torch.equal(bo, o[1:, :, 1:3]) and torch.equal(blse, lse[1:, 1:3])
    assert torch.equal(block[0].grad, whole[0].grad[1:, :, 1:3])
    for b, w in zip(block[1:], whole[1:]):
        assert torch.equal(b.grad, w.grad[1:, 4:, 1:3])


@needs_cuda
def test_cuda_fully_masked_rows_are_zero_without_nan():
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    o, lse = _run_or_skip(lambda: fusedattn.attention(q, k, v, mask="causal_bottom_right",
                                                      return_lse=True))
    # Bottom-right with sq=64 > skv=16: rows 0..47 see no key.
    assert torch.all(o[:, :48] == 0) and torch.all(torch.isneginf(lse[:, :, :48]))
    o.sum().backward()
    for x in (q, k, v):
        assert not torch.isnan(x.grad).any()
    assert torch.all(q.grad[:, :48] == 0)


def _op_args(device, with_score_mod=False):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q = torch.randn(2, 16, 4, 32, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 24, 2, 32, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 24, 2, 32, device=device, dtype=dtype, requires_grad=True)
    sinks = torch.randn(4, device=device, requires_grad=True)
    from fusedattn import _problem, _torch, flex
    options = _problem.normalize_options(mask="causal_bottom_right", has_sinks=True)
    problem = _torch.encode_problem(options, True, True, False)
    text, mods = "", []
    if with_score_mod:
        bias = flex.Tensor(torch.randn(4, device=device, requires_grad=True), name="head bias",
                           requires_grad=True)
        mod = flex.ScoreMod(score=flex.score + bias[flex.head], mask=flex.q_idx_br >= flex.kv_idx)
        text, mods = mod.text, mod.tensors()
    return (q, k, v, None, None, sinks, None, None, None, None, None, None, mods, problem, text,
            [0, 0, 0])


@pytest.mark.parametrize("with_score_mod", [False, True], ids=["plain", "score_mod"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_custom_ops_pass_opcheck(device, with_score_mod):
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch agree with
    the real ops."""
    args = _op_args(device, with_score_mod)
    _run_or_skip(lambda: torch.ops.fusedattn.fwd(*args))
    torch.library.opcheck(torch.ops.fusedattn.fwd.default, args)
    o, lse = torch.ops.fusedattn.fwd(*args)
    d_o = torch.randn_like(o)
    (q, k, v, bias, alibi, sinks, cu_q, cu_kv, off_q, off_kv, page_table, seqlens_kv, mods,
     problem, text, ints) = args
    bwd_args = (d_o, q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(), None, None,
                sinks.detach(), None, None, None, None, [m.detach() for m in mods], problem, text,
                ints)
    torch.library.opcheck(torch.ops.fusedattn.bwd.default, bwd_args)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_torch_compile_fullgraph_matches_eager(device):
    import torch._dynamo
    torch._dynamo.reset()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    generator = torch.Generator().manual_seed(0)
    base = [torch.randn(2, 32, 4, 64, generator=generator).to(device=device, dtype=dtype)
            for _ in range(3)]
    weight = torch.randn(2, 32, 4, 64, generator=generator).to(device=device, dtype=dtype)
    sinks = torch.randn(4, generator=generator).to(device)

    def loss_fn(q, k, v, sinks):
        o = fusedattn.attention(q, k, v, mask="causal", sinks=sinks, scale=0.1)
        return (o.float() * weight.float()).sum()

    def grads(fn):
        leaves = [x.clone().requires_grad_() for x in base] + [sinks.clone().requires_grad_()]
        loss = fn(*leaves)
        loss.backward()
        return loss.detach(), [x.grad for x in leaves]

    eager_loss, eager_grads = _run_or_skip(lambda: grads(loss_fn))
    compiled = torch.compile(loss_fn, fullgraph=True)
    compiled_loss, compiled_grads = grads(compiled)
    # The attention ops are the same; inductor fuses the loss around them in its own order.
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2,
                                                                              atol=2e-2)
    torch.testing.assert_close(compiled_loss, eager_loss, **tolerance)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, **tolerance)


@needs_cuda
def test_torch_compile_thd_with_given_max_seqlen():
    import torch._dynamo
    torch._dynamo.reset()
    cu = torch.tensor([0, 5, 17, 40], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(40, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def fn(q, k, v, cu):
        return fusedattn.attention(q, k, v, layout="thd", mask="causal", cu_seqlens_q=cu,
                                   cu_seqlens_kv=cu, max_seqlen_q=23, max_seqlen_kv=23)

    eager = _run_or_skip(lambda: fn(q, k, v, cu))
    assert torch.equal(torch.compile(fn, fullgraph=True)(q, k, v, cu), eager)


def _cuda_graph_inputs():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(2, 256, 8, 128, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(3)]


@needs_cuda
def test_cuda_graph_capture_of_forward_replays_on_new_inputs():
    q, k, v = _cuda_graph_inputs()
    _run_or_skip(lambda: fusedattn.attention(q, k, v, mask="causal"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm the plan caches off the capture
        for _ in range(2):
            fusedattn.attention(q, k, v, mask="causal")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_static = fusedattn.attention(q, k, v, mask="causal")
    for x, new in zip((q, k, v), _cuda_graph_inputs()):
        x.copy_(new.flip(1))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_static, fusedattn.attention(q, k, v, mask="causal"))


@needs_cuda
def test_cuda_graph_capture_of_forward_and_backward():
    q, k, v = (x.requires_grad_() for x in _cuda_graph_inputs())
    d_o = torch.randn_like(q)

    def step():
        o = fusedattn.attention(q, k, v, mask="causal")
        o.backward(d_o)

    _run_or_skip(step)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for x in (q, k, v):
                x.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for x in (q, k, v):
        x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    captured = [x.grad for x in (q, k, v)]
    with torch.no_grad():
        for x, new in zip((q, k, v), _cuda_graph_inputs()):
            x.copy_(new.flip(2))
    graph.replay()
    torch.cuda.synchronize()
    replayed = [g.clone() for g in captured]
    for x in (q, k, v):
        x.grad = None
    step()
    for name, got, x in zip(("dq", "dk", "dv"), replayed, (q, k, v)):
        assert torch.equal(got, x.grad), name


@needs_cuda
def test_cuda_forward_and_backward_do_not_synchronize():
    q, k, v = (x.requires_grad_() for x in _cuda_graph_inputs())
    _run_or_skip(lambda: fusedattn.attention(q, k, v, mask="causal"))
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = fusedattn.attention(q, k, v, mask="causal")
        o.backward(torch.ones_like(o))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
def test_runs_on_the_current_stream():
    q, k, v = _cuda_graph_inputs()
    expected = _run_or_skip(lambda: fusedattn.attention(q * 2, k, v))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # q2 is written on this stream after a long sleep: an op on another stream reads it
        # before it exists.
        torch.cuda._sleep(50_000_000)
        q2 = q * 2
        o = fusedattn.attention(q2, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(o, expected)


@needs_cuda
def test_cupy_arrays_through_the_low_level_api():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    q, k, v = (cupy.asarray(np.random.default_rng(i).standard_normal((2, 64, 4, 64)),
                            dtype=cupy.float16) for i in range(3))
    o = cupy.empty_like(q)
    config = dict(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=64, max_seqlen_kv=64,
                  head_dim_qk=64, head_dim_v=64, qkv_dtype="float16", o_dtype="float16",
                  device="cuda")
    nbytes = _run_or_skip(lambda: fusedattn.workspace_size(config))
    workspace = cupy.empty(max(nbytes, 1), dtype=cupy.uint8)
    fusedattn.forward(config, q=q, k=k, v=v, o=o, workspace=workspace, stream=0)
    cupy.cuda.Device().synchronize()
    ref, _ = Problem().forward(*(cupy.asnumpy(x).astype(np.float32) for x in (q, k, v)))
    assert relative_error(cupy.asnumpy(o), ref) < TOLERANCE["float16"]


def test_import_order_torch_after_fusedattn_still_dispatches():
    import subprocess
    import sys
    code = ("import fusedattn, torch; q = torch.randn(1, 8, 2, 16); "
            "o = fusedattn.attention(q, q, q); print(type(o).__name__, tuple(o.shape))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Tensor (1, 8, 2, 16)"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_bench_smoke_grid_runs_end_to_end(device, tmp_path):
    """bench/bench.py on its tiny grid: workers, timing, every direction, failure records and
    the three output files."""
    import json
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                          "bench.py")
    only = "fusedattn:auto,fusedattn:flash,torch:flash,torch:efficient,torch:math"
    out = subprocess.run([sys.executable, script, "--grid", "smoke", "--quick", "--device",
                          device, "--only", only, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    files = sorted(os.listdir(tmp_path))
    assert [f.rsplit(".", 1)[1] for f in files] == ["json", "md", "png"], files
    data = json.loads((tmp_path / [f for f in files if f.endswith(".json")][0]).read_text())
    assert data["device"]["copy_tbps"] > 0 and data["device"]["gemm_tflops"] > 0
    rows = data["rows"]
    assert len(rows) == 3 + 3 + 2 + 1
    for row in rows:
        statuses = {impl: e["status"] for impl, e in row["impls"].items()}
        if "torch:math" in statuses:
            assert statuses["torch:math"] == "ok", row
        assert statuses["fusedattn:auto"] in ("ok", "unsupported"), row
        if device == "cpu":
            assert statuses["fusedattn:auto"] == "ok", row  # the reference backend


def test_a_double_backward_raises_instead_of_giving_zeros():
    """The backward is not differentiable: create_graph=True still gives the first-order
    gradients, and differentiating those raises (PyTorch's default would warn and give 0)."""
    q, k, v = (torch.randn(1, 8, 2, 16, requires_grad=True) for _ in range(3))
    o = fusedattn.attention(q, k, v, mask="causal")
    (dq,) = torch.autograd.grad(o, (q,), torch.randn_like(o), create_graph=True)
    with pytest.raises(RuntimeError, match="derivative for fusedattn::bwd is not implemented"):
        dq.sum().backward()



def test_decreasing_cu_seqlens_of_torch_tensors_are_named_as_such():
    """Read on the host when max_seqlen is not given, cumulative lengths that decrease are
    refused in those terms, not as the odd lengths the library would see."""
    x = torch.randn(10, 2, 16)
    cu = torch.tensor([0, 7, 3, 10])
    with pytest.raises(fusedattn.InvalidArgumentError, match="cu_seqlens_q decreases somewhere"):
        fusedattn.attention(x, x, x, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
