"""Errors arrive as exceptions carrying the C library's message; explain(), backends() and
version() report what the library says."""

import re

import numpy as np
import pytest

import fusedattn
from fusedattn import _C


def _qkv(b=2, sq=8, skv=8, hq=4, hkv=4, d=16, dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, skv, hkv, d)).astype(dtype)
    v = rng.standard_normal((b, skv, hkv, d)).astype(dtype)
    return q, k, v


def test_error_classes_are_runtime_errors_and_invalid_arguments_are_value_errors():
    assert issubclass(fusedattn.Error, RuntimeError)
    assert issubclass(fusedattn.InvalidArgumentError, fusedattn.Error)
    assert issubclass(fusedattn.InvalidArgumentError, ValueError)
    assert issubclass(fusedattn.NotSupportedError, fusedattn.Error)
    assert not issubclass(fusedattn.NotSupportedError, ValueError)


def test_invalid_config_raises_with_the_c_message():
    q, k, v = _qkv(hkv=3)
    with pytest.raises(fusedattn.InvalidArgumentError) as error:
        fusedattn.attention(q, k, v)
    assert str(error.value).startswith("config.heads_kv = 3 does not divide config.heads_q = 4 "
                                       "(GQA/MQA need heads_q to be a multiple of heads_kv)")
    assert error.value.status == 1 and error.value.status_name == "invalid argument"


def test_tensor_shape_mismatch_names_the_tensor():
    q, k, v = _qkv()
    config = dict(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=8, max_seqlen_kv=8,
                  head_dim_qk=16, head_dim_v=16, qkv_dtype="float32", o_dtype="float32")
    with pytest.raises(fusedattn.InvalidArgumentError,
                       match=r"args\.v\.shape = \[2, 8, 4, 8\] but \[2, 8, 4, 16\] is expected"):
        fusedattn.forward(config, q=q, k=k, v=v[..., :8].copy(), o=np.empty_like(q))


def test_causal_window_contradiction_is_reported_by_the_library():
    q, k, v = _qkv()
    with pytest.raises(fusedattn.InvalidArgumentError,
                       match=r"config\.window_right = 3 contradicts config\.mask = causal"):
        fusedattn.attention(q, k, v, mask="causal", window=(-1, 3))


def test_forced_gpu_backend_on_cpu_tensors_is_not_supported_with_the_reason():
    q, k, v = _qkv()
    with pytest.raises(fusedattn.NotSupportedError, match=r"forced backend cudnn cannot run"):
        fusedattn.attention(q, k, v, backend="cudnn")


def test_invalid_outputs_never_get_written():
    q, k, v = _qkv()
    o = np.full((2, 8, 4, 16), 7.0, dtype=np.float32)
    with pytest.raises(fusedattn.InvalidArgumentError):
        fusedattn.forward(dict(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=8, max_seqlen_kv=8,
                               head_dim_qk=16, head_dim_v=16, qkv_dtype="float32",
                               o_dtype="float32", return_lse=True),
                          q=q, k=k, v=v, o=o)  # lse missing
    assert np.all(o == 7.0)


def test_python_level_argument_errors_are_invalid_argument_errors():
    q, k, v = _qkv()
    with pytest.raises(fusedattn.InvalidArgumentError, match="layout = 'bsdh' is not one of"):
        fusedattn.attention(q, k, v, layout="bsdh")
    with pytest.raises(fusedattn.InvalidArgumentError, match="mask = 'upper' is not one of"):
        fusedattn.attention(q, k, v, mask="upper")
    with pytest.raises(fusedattn.InvalidArgumentError, match="q has dtype float64"):
        fusedattn.attention(q.astype(np.float64), k, v)
    with pytest.raises(fusedattn.InvalidArgumentError, match="needs 4 dimensions"):
        fusedattn.attention(q[0], k, v)
    with pytest.raises(fusedattn.InvalidArgumentError, match="config has no field 'heads'"):
        fusedattn.make_config(heads=4)
    with pytest.raises(fusedattn.InvalidArgumentError, match=r"config\.mask = 'upper'"):
        fusedattn.make_config(mask="upper")


def test_mixed_dtypes_are_reported_by_the_library():
    q, k, v = _qkv()
    with pytest.raises(fusedattn.InvalidArgumentError,
                       match=r"args\.k\.dtype = float16 \(1\) but float32 is expected"):
        fusedattn.attention(q, k.astype(np.float16), v)


def test_read_only_output_is_refused():
    q, k, v = _qkv()
    o = np.empty_like(q)
    o.flags.writeable = False
    with pytest.raises(fusedattn.InvalidArgumentError, match=r"o is a read-only NumPy array"):
        fusedattn.forward(dict(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=8, max_seqlen_kv=8,
                               head_dim_qk=16, head_dim_v=16, qkv_dtype="float32",
                               o_dtype="float32"), q=q, k=k, v=v, o=o)


def test_read_only_inputs_are_accepted():
    q, k, v = _qkv()
    for x in (q, k, v):
        x.flags.writeable = False
    assert fusedattn.attention(q, k, v).shape == q.shape


def test_non_tensor_argument_names_the_argument():
    q, k, v = _qkv()
    config = fusedattn.make_config(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=8,
                                   max_seqlen_kv=8, head_dim_qk=16, head_dim_v=16,
                                   qkv_dtype="float32", o_dtype="float32")
    with pytest.raises(fusedattn.InvalidArgumentError, match=r"args\.k: expected a tensor"):
        _C.fwd(config, dict(q=q, k=[1, 2, 3], v=v, o=np.empty_like(q)))


def test_unknown_tensor_name_is_refused():
    q, k, v = _qkv()
    config = fusedattn.make_config(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=8,
                                   max_seqlen_kv=8, head_dim_qk=16, head_dim_v=16,
                                   qkv_dtype="float32", o_dtype="float32")
    with pytest.raises(fusedattn.InvalidArgumentError, match=r"fwd: unknown tensor 'sinks'"):
        _C.fwd(config, dict(q=q, k=k, v=v, o=np.empty_like(q), sinks=np.zeros(4, np.float32)))


def test_numpy_and_torch_only_in_the_high_level_call():
    with pytest.raises(TypeError, match="NumPy arrays or torch tensors"):
        fusedattn.attention([[1.0]], [[1.0]], [[1.0]])


def test_backends_lists_every_backend_with_a_status():
    status = fusedattn.backends()
    assert set(status) == {"reference", "cudnn", "flash", "small_seq"}
    assert status["reference"] == "available"
    for name, text in status.items():
        assert text, name


def test_explain_reports_the_chosen_backend_for_forward_and_training():
    q, k, v = _qkv()
    text = fusedattn.explain(q, k, v, mask="causal")
    lines = text.splitlines()
    assert lines[0] == "forward: reference" and lines[1] == "forward+backward: reference"


def test_explain_takes_shapes_only():
    text = fusedattn.explain((2, 128, 8, 64), (2, 128, 2, 64), (2, 128, 2, 64),
                             dtype="bfloat16", device="cpu", mask="causal", sinks=True)
    assert text.startswith("forward: reference")


def test_explain_on_cuda_shapes_without_a_device_says_why():
    text = fusedattn.explain((2, 128, 8, 64), (2, 128, 8, 64), (2, 128, 8, 64), device="cuda")
    if fusedattn.backends()["cudnn"] == "available" or fusedattn.backends()["flash"] == "available":
        pytest.skip("a CUDA device is present")
    assert "no CUDA device" in text


def test_explain_for_a_forced_backend_gives_its_reason():
    text = fusedattn.explain((2, 128, 8, 64), (2, 128, 8, 64), (2, 128, 8, 64), device="cpu",
                             backend="flash")
    assert re.search(r"forced backend flash cannot run this problem", text)


def test_explain_thd_shapes_take_the_batch_from_cu_seqlens():
    cu = np.array([0, 3, 10], dtype=np.int32)
    text = fusedattn.explain((10, 4, 16), (10, 4, 16), (10, 4, 16), layout="thd", device="cpu",
                             cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert text.startswith("forward: reference")


def test_explain_raises_for_an_invalid_problem():
    with pytest.raises(fusedattn.InvalidArgumentError, match="heads_kv = 3 does not divide"):
        fusedattn.explain((2, 8, 4, 16), (2, 8, 3, 16), (2, 8, 3, 16), device="cpu")


def test_version_is_the_library_version():
    assert fusedattn.version() == "%d.%d.%d" % tuple(
        int(x) for x in re.findall(r"\d+", fusedattn.version()))
    assert fusedattn.__version__ == fusedattn.version()
    assert isinstance(fusedattn.cudnn_version(), int)


def test_import_does_not_load_torch():
    import subprocess
    import sys
    code = "import sys, fusedattn; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_workspace_size_of_the_reference_backend_is_zero():
    config = dict(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=8, max_seqlen_kv=8, head_dim_qk=16,
                  head_dim_v=16, qkv_dtype="float32", o_dtype="float32", device="cpu")
    assert fusedattn.workspace_size(config) == 0
    assert fusedattn.workspace_size(config, backward=True) == 0


def _thd(tokens=10):
    x = np.random.default_rng(0).standard_normal((tokens, 2, 16)).astype(np.float32)
    return x, x, x


@pytest.mark.parametrize("cu", [[0, 4, 10], (0, 4, 10), np.array([0, 4, 10], dtype=np.int64)],
                         ids=["list", "tuple", "int64"])
def test_cu_seqlens_as_a_list_or_int64_are_converted(cu):
    q, k, v = _thd()
    expected = fusedattn.attention(q, k, v, layout="thd",
                                   cu_seqlens_q=np.array([0, 4, 10], np.int32),
                                   cu_seqlens_kv=np.array([0, 4, 10], np.int32))
    o = fusedattn.attention(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert np.array_equal(o, expected)


def test_decreasing_cu_seqlens_are_named_as_such():
    q, k, v = _thd()
    with pytest.raises(fusedattn.InvalidArgumentError,
                       match=r"cu_seqlens_kv decreases at sequence 1 \(7 then 3\)"):
        fusedattn.attention(q, k, v, layout="thd", cu_seqlens_q=[0, 4, 10],
                            cu_seqlens_kv=[0, 7, 3, 10][:3] + [10])


def test_float_cu_seqlens_are_refused_naming_the_argument():
    q, k, v = _thd()
    with pytest.raises(fusedattn.InvalidArgumentError, match="cu_seqlens_q has dtype float"):
        fusedattn.attention(q, k, v, layout="thd", cu_seqlens_q=np.array([0.0, 4.0, 10.0]),
                            cu_seqlens_kv=[0, 4, 10])


def test_window_is_an_int_or_a_pair():
    q, k, v = _qkv()
    symmetric = fusedattn.attention(q, k, v, window=3)
    assert np.array_equal(symmetric, fusedattn.attention(q, k, v, window=(3, 3)))
    with pytest.raises(fusedattn.InvalidArgumentError, match="window = 'x' must be an int or a pair"):
        fusedattn.attention(q, k, v, window="x")


def test_the_sink_softmax_without_sinks_names_the_argument():
    q, k, v = _qkv()
    with pytest.raises(fusedattn.InvalidArgumentError, match="needs sinks="):
        fusedattn.attention(q, k, v, softmax="sink")


def test_sdpa_shaped_tensors_get_a_layout_hint_when_bshd_refuses_them():
    """[batch, heads, seq, dim] tensors (torch's SDPA layout) read with the default layout bshd:
    here k's 3 'heads' (its seq axis) do not divide q's 4, and the message says what to do."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 8, 4, 16)).astype(np.float32)   # bhsd: 8 heads, seq 4
    k = rng.standard_normal((2, 2, 3, 16)).astype(np.float32)   # bhsd: 2 heads, seq 3
    with pytest.raises(fusedattn.InvalidArgumentError, match="pass layout='bhsd'"):
        fusedattn.attention(q, k, k)
    assert fusedattn.attention(q, k, k, layout="bhsd").shape == q.shape


def test_an_immutable_jax_array_is_refused_as_an_output_and_left_alone():
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    q, k, v = _qkv()
    o = jnp.full(q.shape, 7.0, dtype=jnp.float32)
    with pytest.raises(fusedattn.InvalidArgumentError, match="o is a JAX array, which is immutable"):
        fusedattn.forward(dict(batch=2, heads_q=4, heads_kv=4, max_seqlen_q=8, max_seqlen_kv=8,
                               head_dim_qk=16, head_dim_v=16, qkv_dtype="float32",
                               o_dtype="float32"), q=q, k=k, v=v, o=o)
    assert bool((o == 7.0).all())
