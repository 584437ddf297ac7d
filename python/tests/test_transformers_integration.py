"""fusedattn.integrations.transformers: tiny random-weight models with
attn_implementation="fusedattn" against the same weights with "eager" (float32, CPU tensors on
the reference backend here; CUDA where present): logits at real tokens, the loss and every
parameter's gradient, for Llama (GQA), Mistral (sliding window), Gemma 2 (softcap, alternating
sliding and full layers), Qwen2 and gpt-oss (sinks), with padding on the left, on the right, in
the middle of a row, packed sequences, a bidirectional decoder, greedy generation with dynamic
and static caches; then the plans the mask function makes, the FlashAttention contract for masks
it did not make, and what is refused."""

import copy
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
transformers = pytest.importorskip("transformers", reason="transformers is not installed here")

import fusedattn  # noqa: E402
from fusedattn.integrations import transformers as hf  # noqa: E402
from transformers import masking_utils  # noqa: E402

# CUDA runs are marked `gpu` (`pytest -m gpu` on the GPU machine selects them).
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])]
VOCAB = 96
TOLERANCE = 1e-4  # relative, float32 through a 2-layer model (the attention alone: 1e-5)


def _llama():
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)


def _mistral():
    return transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=4)


def _gemma2():
    return transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
        attn_logit_softcapping=2.0, final_logit_softcapping=30.0, query_pre_attn_scalar=8)


def _qwen2():
    return transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1)


def _gpt_oss():
    return transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
        num_local_experts=2, num_experts_per_tok=1)


CONFIGS = {"llama": _llama, "mistral": _mistral, "gemma2": _gemma2, "qwen2": _qwen2,
           "gpt_oss": _gpt_oss}


def _models(name, device, **config_changes):
    """(eager model, fusedattn model) with the same random weights, float32, train mode off."""
    config = CONFIGS[name]()
    for key, value in config_changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="eager")
    with torch.no_grad():  # random sinks (gpt-oss initializes them to zero)
        for parameter_name, parameter in reference.named_parameters():
            if parameter_name.endswith("sinks"):
                parameter.normal_()
    ours = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="fusedattn")
    ours.load_state_dict(reference.state_dict())
    return reference.to(device).eval(), ours.to(device).eval()


# Batches of 3 rows of 10 tokens: 1 = a real token, 0 = padding.
PADDINGS = {
    "none": None,
    "left": [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10, [0, 1, 1, 1, 1, 1, 1, 1, 1, 1]],
    "right": [[1, 1, 1, 1, 1, 1, 0, 0, 0, 0], [1] * 10, [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]],
    "both_sides": [[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
                   [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]],
    "hole": [[1, 1, 1, 0, 0, 1, 1, 1, 1, 1], [1] * 10, [0, 0, 1, 1, 1, 1, 1, 1, 1, 1]],
}


def _batch(padding, device):
    ids = torch.randint(0, VOCAB, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = None if padding is None else torch.tensor(padding)
    labels = ids.clone()
    if mask is not None:
        # A label counts where its token and the token predicting it (the one before) are real:
        # outputs at padded positions are not compared (fusedattn gives 0 there).
        predicted_by_real = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=1)
        labels = labels.masked_fill((mask == 0) | (predicted_by_real == 0), -100)
    return ids.to(device), None if mask is None else mask.to(device), labels.to(device)


def _rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare_training_step(reference, ours, ids, mask, labels, **kwargs):
    """Logits at real tokens, loss and parameter gradients of one forward/backward."""
    results = []
    for model in (reference, ours):
        model.zero_grad()
        out = model(ids, attention_mask=mask, labels=labels, **kwargs)
        out.loss.backward()
        results.append(out)
    real = torch.ones(ids.shape, dtype=torch.bool, device=ids.device) if mask is None \
        else mask.bool()
    assert _rel(results[1].logits[real], results[0].logits[real]) < TOLERANCE, "logits"
    assert _rel(results[1].loss, results[0].loss) < TOLERANCE, "loss"
    ours_parameters = dict(ours.named_parameters())
    for name, parameter in reference.named_parameters():
        if parameter.grad is None:
            continue
        grad = ours_parameters[name].grad
        assert grad is not None, name
        assert _rel(grad, parameter.grad) < TOLERANCE, "%s: %.3g" % (
            name, _rel(grad, parameter.grad))


@pytest.fixture(params=[True, False], ids=["read_masks", "no_reads"])
def read_masks(request):
    """Both ways a plan is made: with its one read of the mask (dense/varlen plans), and without
    reads (flex plans, as under torch.compile)."""
    hf.register(read_masks=request.param)
    yield request.param
    hf.register(read_masks=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding", sorted(PADDINGS))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_training_step_matches_eager(name, padding, device, read_masks):
    reference, ours = _models(name, device)
    ids, mask, labels = _batch(PADDINGS[padding], device)
    _compare_training_step(reference, ours, ids, mask, labels)


def _step(model, ids, mask, labels):
    model.zero_grad()
    out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return out.logits, out.loss, grads


BFLOAT16_SLACK = 1e-2  # relative, added to twice eager-bfloat16's own error


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_bfloat16_training_step_is_as_close_to_float32_as_eager(name, padding):
    """bfloat16 on CUDA (cuDNN or flash kernels): fusedattn's logits at real tokens, loss and
    parameter gradients are within twice eager-bfloat16's own distance from float32 eager, plus
    1e-2 relative (the documented bfloat16 tolerance)."""
    reference, ours = _models(name, "cuda")
    eager16 = copy.deepcopy(reference).to(torch.bfloat16)
    ours16 = ours.to(torch.bfloat16)
    ids, mask, labels = _batch(PADDINGS[padding], "cuda")
    truth = _step(reference, ids, mask, labels)
    theirs = _step(eager16, ids, mask, labels)
    mine = _step(ours16, ids, mask, labels)
    real = torch.ones(ids.shape, dtype=torch.bool, device="cuda") if mask is None else mask.bool()
    pairs = [("logits", truth[0][real], theirs[0][real], mine[0][real]),
             ("loss", truth[1], theirs[1], mine[1])]
    pairs += [(n, g, theirs[2][n], mine[2][n]) for n, g in truth[2].items()]
    for what, exact, eager_value, our_value in pairs:
        eager_error, our_error = _rel(eager_value, exact), _rel(our_value, exact)
        assert our_error <= 2 * eager_error + BFLOAT16_SLACK, "%s: %.3g (eager bf16 %.3g)" % (
            what, our_error, eager_error)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_bidirectional_decoder_matches_eager(padding, device, read_masks):
    """config.is_causal=False: transformers makes bidirectional masks (sliding ones for
    Mistral)."""
    for name in ("llama", "mistral"):
        reference, ours = _models(name, device, is_causal=False)
        ids, mask, labels = _batch(PADDINGS[padding], device)
        _compare_training_step(reference, ours, ids, mask, labels)


def _packed_positions(device):
    """position_ids of sequences packed into rows (3 + 4 + 3, and 6 + 4)."""
    rows = [[0, 1, 2, 0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]]
    return torch.tensor(rows, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_packed_sequences_from_position_ids_match_eager(name, device, read_masks):
    reference, ours = _models(name, device)
    ids, _, labels = _batch(None, device)
    ids, labels = ids[:2], labels[:2]
    _compare_training_step(reference, ours, ids, None, labels,
                           position_ids=_packed_positions(device))


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attention_varlen_kwargs_match_eager(device):
    """cu_seq_lens_q/k and max_length_q/k (DataCollatorWithFlattening's) on one packed row."""
    reference, ours = _models("llama", device)
    ids, _, labels = _batch(None, device)
    ids, labels = ids[:1], labels[:1]
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1, 2]], device=device)
    cu = torch.tensor([0, 3, 7, 10], dtype=torch.int32, device=device)
    eager = reference(ids, position_ids=positions).logits
    logits = ours(ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=4,
                  max_length_k=4).logits  # no position_ids: the kwargs alone separate them
    plain = ours(ids).logits
    # Rotary positions differ without position_ids, so compare the first sequence (positions
    # 0..2 either way) and check the others see no earlier sequence: they differ from `plain`.
    assert _rel(logits[:, :3], eager[:, :3]) < TOLERANCE
    assert _rel(logits[:, 3:], plain[:, 3:]) > 1e-3


@pytest.fixture
def fresh_compiler():
    """Compiled state is per process (dynamo's caches, and on CUDA the CUDA graph trees that
    generate()'s default compile mode records into): a test that compiles leaves none behind,
    so that one failing inside a CUDA graph recording cannot fail the tests after it (they
    would stop on an AssertionError in torch/_inductor/cudagraph_trees.py)."""
    yield
    torch.compiler.reset()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
@pytest.mark.usefixtures("fresh_compiler")
def test_greedy_generation_matches_eager(name, cache, device, read_masks):
    """Left-padded prompts, greedy decoding: the prefill and every decoding step (one query
    against the cache, bottom-right; a static cache's offsets) give eager's tokens."""
    reference, ours = _models(name, device)
    ids, mask, _ = _batch(PADDINGS["left"], device)
    mask = mask.clone()
    mask[2] = 1  # a full row beside the padded ones
    outputs = []
    for model in (reference, ours):
        kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
        if cache == "static":
            kwargs["cache_implementation"] = "static"
        outputs.append(model.generate(ids, attention_mask=mask, **kwargs))
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_prefill_in_chunks_with_cache_matches_eager(name, device, read_masks):
    """A left-padded prompt fed in two chunks through the cache (the second: 4 queries after
    6 cached positions, bottom-right), then one more token."""
    reference, ours = _models(name, device)
    ids, mask, _ = _batch(PADDINGS["left"], device)
    logits = []
    for model in (reference, ours):
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids[:, :6], attention_mask=mask[:, :6], past_key_values=cache)
            second = model(ids[:, 6:], attention_mask=mask, past_key_values=cache).logits
            step_mask = torch.cat((mask, mask.new_ones(3, 1)), 1)
            third = model(ids[:, :1], attention_mask=step_mask, past_key_values=cache).logits
        logits.append((second, third))
    assert _rel(logits[1][0], logits[0][0]) < TOLERANCE
    assert _rel(logits[1][1], logits[0][1]) < TOLERANCE


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_in_training(device):
    """The layers' attention_dropout applies in train mode (a seed from torch's generator, so
    torch.manual_seed repeats a step) and not in eval mode."""
    _, ours = _models("llama", device, attention_dropout=0.5)
    ids, mask, labels = _batch(PADDINGS["left"], device)
    ours.train()
    torch.manual_seed(3)
    first = ours(ids, attention_mask=mask, labels=labels)
    torch.manual_seed(3)
    second = ours(ids, attention_mask=mask, labels=labels)
    first.loss.backward()
    ours.eval()
    evaluated = ours(ids, attention_mask=mask, labels=labels)
    assert torch.equal(first.logits, second.logits)
    assert not torch.allclose(first.logits, evaluated.logits)
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters() if p.grad is not None)


@pytest.mark.parametrize("padding", ["none", "left"])
def test_compiles_without_graph_breaks(padding):
    """torch.compile(fullgraph=True) traces the mask function and every layer (plans then make
    no device reads: padding runs as a flex mask)."""
    reference, ours = _models("llama", "cpu")
    ids, mask, _ = _batch(PADDINGS[padding], "cpu")
    compiled = torch.compile(ours, backend="eager", fullgraph=True)
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    logits = compiled(ids, attention_mask=mask).logits
    assert _rel(logits[real], reference(ids, attention_mask=mask).logits[real]) < TOLERANCE


@pytest.fixture
def no_score_mod_backend(monkeypatch):
    """The library's selection as where no backend runs score modifiers (float32 on CUDA):
    every problem with a score_mod graph is refused. The integration's answers are cached per
    problem, so the cache is emptied around the test. (The operators themselves still run the
    graphs here: the test checks what the integration sends them.)"""
    real_get_backend = fusedattn._C.get_backend

    def get_backend(config, graph=None):
        if graph is not None:
            raise fusedattn.NotSupportedError("no backend runs score modifiers here (test)")
        return real_get_backend(config, graph)

    monkeypatch.setattr(fusedattn._C, "get_backend", get_backend)
    hf._score_mods_run_cached.cache_clear()
    yield
    hf._score_mods_run_cached.cache_clear()


def test_flex_plan_falls_back_to_its_materialized_mask(no_score_mod_backend):
    """Where no backend runs score modifiers, a flex plan's mask runs materialized (with a
    warning): same results."""
    reference, ours = _models("mistral", "cpu")
    ids, mask, labels = _batch(PADDINGS["hole"], "cpu")
    with pytest.warns(UserWarning, match="materialized"):
        _compare_training_step(reference, ours, ids, mask, labels)


def _score_mod_texts(graphs):
    """The score_mod text of every fusedattn forward call in torch.compile's graphs (found by
    its name in the operator's schema, which may gain arguments)."""
    op = torch.ops.fusedattn.fwd.default
    index = [argument.name for argument in op._schema.arguments].index("score_mod")
    return [node.args[index] if len(node.args) > index else node.kwargs["score_mod"]
            for graph in graphs for node in graph.graph.nodes
            if node.op == "call_function" and node.target is op]


@pytest.mark.usefixtures("fresh_compiler")
def test_compiled_static_cache_generation_falls_back_before_tracing(no_score_mod_backend):
    """generate() with a static cache compiles its decoding steps, whose masks are flex plans
    (a static cache's offsets are tensors): the fallback is decided while tracing, so the
    compiled graph calls the operator with the materialized mask, not the score modifier that
    no backend would run (an error inside the compiled graph), and gives eager's tokens."""
    from transformers.generation.configuration_utils import CompileConfig
    graphs = []

    def recording_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    compile_config = CompileConfig(fullgraph=True, backend=recording_backend, mode=None)
    compile_config._compile_all_devices = True  # generate() compiles on CUDA only otherwise
    reference, ours = _models("llama", "cpu")
    ids, mask, _ = _batch(PADDINGS["left"], "cpu")
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                  cache_implementation="static")
    outputs = [reference.generate(ids, **kwargs)]
    with pytest.warns(UserWarning, match="materialized"):  # said while tracing
        outputs.append(ours.generate(ids, compile_config=compile_config, **kwargs))
    texts = _score_mod_texts(graphs)
    assert texts and all(text == "" for text in texts), "a score modifier reached the graph"
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.usefixtures("fresh_compiler")
def test_fallback_check_keeps_dynamic_shapes_symbolic(no_score_mod_backend):
    """Under torch.compile with dynamic sequence lengths (traced as symbolic) the check asks at
    a nominal length: one graph serves two lengths, with the materialized mask."""
    graphs = []

    def recording_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def layer(q, k, v, padding):
        mask = hf.attention_mask(batch_size=2, q_length=q.shape[2], kv_length=k.shape[2],
                                 attention_mask=padding, device="cpu")
        return hf.attention_forward(_Layer(), q, k, v, mask)[0]

    compiled = torch.compile(layer, backend=recording_backend, fullgraph=True)
    for length in (6, 9):
        q, k, v = _layer_inputs(q_length=length, kv_length=length)
        padding = torch.ones(2, length, dtype=torch.bool)
        padding[0, 2] = False  # a hole: a flex plan
        for x, axis in ((q, 2), (k, 2), (v, 2), (padding, 1)):
            torch._dynamo.mark_dynamic(x, axis)  # the sequence axes, as a model's
        allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None] & \
            padding[:, None, None, :]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "fusedattn: this attention mask runs as a mat")
            out = compiled(q, k, v, padding)
        assert _rel(out, _eager(q, k, v, allowed)) < 1e-5
    assert len(graphs) == 1
    texts = _score_mod_texts(graphs)
    assert texts and all(text == "" for text in texts)


@pytest.mark.parametrize("q_length,kv_length,q_offset,kv_offset", [
    (6, 6, 0, 0), (1, 9, 8, 0), (2, 16, 7, 0), (1, 4, 10, 7)],
    ids=["prefill", "decode", "static_cache", "sliding_cache"])
@pytest.mark.parametrize("window", [None, 3])
def test_flex_plan_mask_is_transformers_mask(q_length, kv_length, q_offset, kv_offset, window):
    """The flex plan's mask, materialized, is the mask transformers gives SDPA (padding with a
    hole, cache offsets, sliding window)."""
    function = CAUSAL if window is None else \
        masking_utils.sliding_window_causal_mask_function(window)
    total = q_offset + q_length
    padding = torch.ones(2, total, dtype=torch.bool)
    padding[0, 0] = padding[1, total // 2] = False
    hf.register(read_masks=False)
    try:
        plan = _plan(function, padding, q_length, kv_length, q_offset, kv_offset)
    finally:
        hf.register(read_masks=True)
    expected = masking_utils.sdpa_mask(
        batch_size=2, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
        kv_offset=kv_offset, mask_function=function, attention_mask=padding,
        allow_is_causal_skip=False)
    assert plan.kind == "flex"
    assert torch.equal(plan.visible().expand(expected.shape), expected)


def test_gradient_checkpointing_recomputes_the_same_dropout():
    """Dropout seeds come from torch's CPU generator, whose state activation checkpointing saves
    and restores: the recomputed forward draws the same masks, so gradients are the same as
    without checkpointing."""
    _, ours = _models("llama", "cpu", attention_dropout=0.5)
    ids, mask, labels = _batch(PADDINGS["right"], "cpu")
    ours.train()
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            ours.gradient_checkpointing_enable()
        torch.manual_seed(11)
        grads.append(_step(ours, ids, mask, labels)[2])
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, rtol=1e-5, atol=1e-7), name


# ---------------------------------------------------------------------------------------------
# The mask function's plans
# ---------------------------------------------------------------------------------------------


def _plan(mask_function, attention_mask=None, q_length=6, kv_length=6, q_offset=0, kv_offset=0,
          batch=2):
    mask = hf.attention_mask(batch_size=batch, q_length=q_length, kv_length=kv_length,
                             q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                             attention_mask=attention_mask, device="cpu")
    return getattr(mask, "_fusedattn_plan", mask)


CAUSAL = masking_utils.causal_mask_function


@pytest.mark.parametrize("mask_function,expected", [
    (masking_utils.causal_mask_function, (True, -1, -1)),
    (masking_utils.bidirectional_mask_function, (False, -1, -1)),
    (masking_utils.sliding_window_causal_mask_function(5), (True, 4, -1)),
    (masking_utils.sliding_window_bidirectional_mask_function(3), (False, 3, 3)),
], ids=["causal", "bidirectional", "sliding_causal", "sliding_bidirectional"])
def test_recognizes_transformers_mask_functions(mask_function, expected):
    pattern, sequence_ids = hf.recognize(mask_function)
    assert (pattern.causal, pattern.left, pattern.right) == expected and sequence_ids is None


def test_does_not_recognize_other_mask_functions():
    assert hf.recognize(masking_utils.or_masks(CAUSAL, lambda b, h, q, kv: kv == 0)) is None
    assert hf.recognize(masking_utils.chunked_causal_mask_function(
        4, torch.zeros(2, dtype=torch.long))) is None
    assert hf.recognize(lambda b, h, q, kv: q >= kv) is None


def test_unrecognized_mask_is_transformers_sdpa_mask():
    """or_mask/and_mask functions, chunked attention and the like: the mask transformers would
    give SDPA, materialized (exact)."""
    function = masking_utils.or_masks(CAUSAL, lambda b, h, q, kv: kv == 0)
    padding = torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6], dtype=torch.bool)
    mask = _plan(function, padding)
    expected = masking_utils.sdpa_mask(batch_size=2, q_length=6, kv_length=6,
                                       mask_function=function, attention_mask=padding,
                                       allow_is_causal_skip=False)
    assert mask.dim() == 4 and torch.equal(mask, expected)


def test_no_padding_plans_are_dense_and_read_nothing(monkeypatch):
    def no_reads(*args):
        raise AssertionError("the plan read the device")
    monkeypatch.setattr(torch.Tensor, "tolist", no_reads)
    assert _plan(CAUSAL).kind == "dense" and _plan(CAUSAL).mask == "causal"
    cached = _plan(CAUSAL, q_length=1, kv_length=7, q_offset=6)  # decoding, dynamic cache
    assert (cached.kind, cached.mask) == ("dense", "causal_bottom_right")
    static = _plan(CAUSAL, q_length=1, kv_length=16, q_offset=torch.tensor(6))
    assert static.kind == "flex"  # a static cache's offset is a tensor: exact, no read


@pytest.mark.parametrize("padding,kind", [
    ([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], "varlen"),
    ([[1] * 6, [1] * 6], "dense"),
    ([[1, 0, 1, 1, 1, 1], [1] * 6], "flex"),
], ids=["left_and_right", "all_real", "hole"])
def test_padding_plans(padding, kind):
    plan = _plan(CAUSAL, torch.tensor(padding, dtype=torch.bool))
    assert plan.kind == kind
    if kind == "varlen":
        assert plan.cu_seqlens_q.tolist() == [0, 4, 8]
        assert plan.seq_offsets_q.tolist()[:2] == [2, 6]
        assert (plan.max_seqlen_q, plan.max_seqlen_kv) == (4, 4)


def test_packed_sequences_plan_is_varlen_over_the_rows():
    ids = torch.tensor([[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 1, 1]])
    function = masking_utils.and_masks(CAUSAL, masking_utils.packed_sequence_mask_function(ids))
    plan = _plan(function)
    assert plan.kind == "varlen"
    assert plan.cu_seqlens_q.tolist() == [0, 2, 5, 6, 10, 12] and plan.max_seqlen_q == 4


# ---------------------------------------------------------------------------------------------
# Masks the mask function did not make, and refusals
# ---------------------------------------------------------------------------------------------


class _Layer(torch.nn.Module):
    is_causal = True


def _layer_inputs(batch=2, heads=4, heads_kv=2, q_length=6, kv_length=6, dim=8):
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(batch, heads, q_length, dim, generator=generator)
    k = torch.randn(batch, heads_kv, kv_length, dim, generator=generator)
    v = torch.randn(batch, heads_kv, kv_length, dim, generator=generator)
    return q, k, v


def _eager(q, k, v, allowed):
    """[batch, seq_q, heads, dim] of softmax attention over the allowed keys (float64)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    s = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("read", [True, False], ids=["read_masks", "no_reads"])
def test_cross_attention_with_encoder_padding(read):
    """A bidirectional mask over an encoder's keys (decoder queries, q_length != kv_length): every
    query sees the real keys; queries are not masked."""
    q, k, v = _layer_inputs(q_length=4, kv_length=7)
    padding = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    hf.register(read_masks=read)
    try:
        mask = hf.attention_mask(batch_size=2, q_length=4, kv_length=7,
                                 mask_function=masking_utils.bidirectional_mask_function,
                                 attention_mask=padding, device="cpu")
    finally:
        hf.register(read_masks=True)
    assert mask._fusedattn_plan.kind == ("varlen" if read else "flex")
    out, _ = hf.attention_forward(_Layer(), q, k, v, mask)
    assert _rel(out, _eager(q, k, v, padding[:, None, None, :])) < 1e-5


def test_plain_2d_mask_follows_flash_attention_contract():
    """A [batch, seq_kv] mask without a plan (another mask function's, or one moved to another
    device): causal from the layer, keys where the mask is 1, the last column the last query."""
    q, k, v = _layer_inputs(q_length=3, kv_length=6)
    padding = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out, weights = hf.attention_forward(_Layer(), q, k, v, padding)
    causal = torch.ones(3, 6, dtype=torch.bool).tril(3)
    allowed = causal[None, None] & padding.bool()[:, None, None, :]
    assert weights is None
    assert _rel(out, _eager(q, k, v, allowed)) < 1e-5


def test_4d_masks_are_added_as_bias():
    q, k, v = _layer_inputs()
    allowed = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(2)) > 0.4
    allowed[..., 0] = True
    out, _ = hf.attention_forward(_Layer(), q, k, v, allowed)
    assert _rel(out, _eager(q, k, v, allowed)) < 1e-5
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    out, _ = hf.attention_forward(_Layer(), q, k, v, additive)
    assert _rel(out, _eager(q, k, v, allowed)) < 1e-5


def test_no_mask_is_causal_as_transformers_sdpa():
    q, k, v = _layer_inputs()
    out, _ = hf.attention_forward(_Layer(), q, k, v, None)
    assert _rel(out, _eager(q, k, v, torch.ones(6, 6, dtype=torch.bool).tril())) < 1e-5
    out, _ = hf.attention_forward(_Layer(), q, k, v, None, is_causal=False)
    assert _rel(out, _eager(q, k, v, torch.ones(6, 6, dtype=torch.bool))) < 1e-5


def test_dense_plan_copies_neither_inputs_nor_output(monkeypatch):
    """The unpadded causal batch (the dense plan) hands the operator the layer's q, k, v
    ([batch, heads, seq, dim] views of the projections) as they are, and its output is already
    the contiguous [batch, seq_q, heads, dim] that the layer reshapes without a copy."""
    generator = torch.Generator().manual_seed(5)
    query, key, value = (torch.randn(2, 6, heads, 8, generator=generator).transpose(1, 2)
                         for heads in (4, 2, 2))
    mask = hf.attention_mask(batch_size=2, q_length=6, kv_length=6, device="cpu")
    assert mask._fusedattn_plan.kind == "dense"
    seen = []
    operator = fusedattn._torch._FAST_FWD

    def recording_operator(q, k, v, *args):
        seen.append((q, k, v))
        return operator(q, k, v, *args)

    monkeypatch.setattr(fusedattn._torch, "_FAST_FWD", recording_operator)
    out, _ = hf.attention_forward(_Layer(), query, key, value, mask)
    (q, k, v), = seen
    for given, taken in ((query, q), (key, k), (value, v)):
        assert taken.data_ptr() == given.data_ptr()
        assert taken.stride() == given.transpose(1, 2).stride()
    assert out.shape == (2, 6, 4, 8) and out.is_contiguous()
    assert _rel(out, _eager(query, key, value, torch.ones(6, 6, dtype=torch.bool).tril())) < 1e-5


def test_output_attentions_warns_and_returns_none():
    q, k, v = _layer_inputs()
    with pytest.warns(UserWarning, match="output_attentions"):
        hf._warned.discard("output_attentions")
        _, weights = hf.attention_forward(_Layer(), q, k, v, None, output_attentions=True)
    assert weights is None


def test_position_bias_is_refused():
    q, k, v = _layer_inputs()
    with pytest.raises(fusedattn.NotSupportedError, match="position_bias"):
        hf.attention_forward(_Layer(), q, k, v, None, position_bias=torch.zeros(1, 4, 6, 6))


def test_mask_made_for_other_lengths_is_refused():
    q, k, v = _layer_inputs(q_length=4, kv_length=4)
    mask = hf.attention_mask(batch_size=2, q_length=6, kv_length=6, device="cpu")
    with pytest.raises(fusedattn.InvalidArgumentError, match="made for 6 queries and 6 keys"):
        hf.attention_forward(_Layer(), q, k, v, mask)


def test_registered_under_its_name():
    assert transformers.AttentionInterface._global_mapping["fusedattn"] is hf.attention_forward
    assert masking_utils.AttentionMaskInterface._global_mapping["fusedattn"] is \
        hf.attention_mask


def test_fusedattn_imports_without_transformers_or_torch():
    code = ("import sys, fusedattn, fusedattn.flash_attn, fusedattn.integrations; "
            "assert 'transformers' not in sys.modules, 'transformers imported'; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
