#!/usr/bin/env python3
"""Host time per call of the transformers attention function "fusedattn" against transformers'
own sdpa_attention_forward, on CPU tensors small enough that the host work dominates (issue 19:
the train step's gap to "sdpa" on the full batch is host time per attention call).

Both functions get what a LlamaAttention layer passes them: query/key/value as
[batch, heads, seq, dim] views of the projections (GQA), dropout 0, the layer's scaling; the
fusedattn function gets the mask its mask function made for an unpadded causal batch (the dense
plan), sdpa gets None (as transformers gives it). Rounds rotate the order of the functions; each
round times `--calls` calls of one function; the figure is the median over rounds of the time
per call. Modes: "no_grad" (inference), "grad" (the forward with inputs that require grad: the
autograd node is made), "fwd_bwd" (forward and backward of out.sum()). "fusedattn op" is the
library's operator alone with the same tensors (the floor the integration adds to).

    python bench/hf_attention_host.py [--profile]   # --profile: cProfile of the fusedattn call
"""

import argparse
import cProfile
import pstats
import statistics
import time

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import causal_mask_function

import fusedattn  # noqa: F401
from fusedattn import _torch
from fusedattn.integrations import transformers as hf


def layer_inputs(args, requires_grad):
    config = transformers.LlamaConfig(
        hidden_size=args.heads * args.dim, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, num_hidden_layers=1, intermediate_size=32,
        vocab_size=32)
    module = transformers.models.llama.modeling_llama.LlamaAttention(config, layer_idx=0)
    torch.manual_seed(0)

    def projection(heads):  # [b, s, h, d] -> a [b, h, s, d] view, as the layer makes it
        x = torch.randn(args.batch, args.seq, heads, args.dim, requires_grad=requires_grad)
        return x.transpose(1, 2)

    q, k, v = projection(args.heads), projection(args.kv_heads), projection(args.kv_heads)
    mask = hf.attention_mask(args.batch, args.seq, args.seq, mask_function=causal_mask_function)
    return module, q, k, v, mask


def calls(args, mode):
    """name -> a function of no arguments making one call in `mode`."""
    module, q, k, v, mask = layer_inputs(args, mode != "no_grad")
    qb, kb, vb = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    problem = _torch.encode_problem(
        _torch._options("bshd", "causal", (-1, -1), "post_scale", 0.0, None, 0.0,
                        module.scaling, False, "auto", False, False, False)[0],
        mode != "no_grad", False, False)

    # What LlamaModel's layers pass on besides (seen in transformers 5.17).
    extra = dict(position_ids=torch.arange(args.seq)[None], use_cache=False)

    def fusedattn_call():
        return hf.attention_forward(module, q, k, v, mask, dropout=0.0, scaling=module.scaling,
                                    **extra)[0]

    def sdpa_call():
        return sdpa_attention_forward(module, q, k, v, None, dropout=0.0,
                                      scaling=module.scaling, **extra)[0]

    def op_call():
        return _torch._FAST_FWD(qb, kb, vb, None, None, None, None, None, None, None, None, None,
                                [], problem, "", [0, 0, 0])[0]

    functions = {"fusedattn": fusedattn_call, "sdpa": sdpa_call, "fusedattn op": op_call}
    if mode == "fwd_bwd":
        def with_backward(f):
            return lambda: f().sum().backward()
        functions = {name: with_backward(f) for name, f in functions.items()}
    return functions


def measure(functions, rounds, n, no_grad):
    times = {name: [] for name in functions}
    names = list(functions)
    context = torch.no_grad if no_grad else torch.enable_grad
    with context():
        for f in functions.values():  # warm (plans, caches)
            for _ in range(20):
                f()
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                f = functions[name]
                start = time.perf_counter()
                for _ in range(n):
                    f()
                times[name].append(1e6 * (time.perf_counter() - start) / n)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--modes", default="no_grad,grad,fwd_bwd")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of the fusedattn call (grad mode)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("b%d s%d heads %d/%d d%d float32 CPU, us per call (median of %d rounds of %d calls)"
          % (args.batch, args.seq, args.heads, args.kv_heads, args.dim, args.rounds, args.calls))
    for mode in args.modes.split(","):
        result = measure(calls(args, mode), args.rounds, args.calls, mode == "no_grad")
        print("%-8s fusedattn %7.2f  sdpa %7.2f  fusedattn op %7.2f  (fusedattn - sdpa %+.2f, "
              "fusedattn - op %+.2f)"
              % (mode, result["fusedattn"], result["sdpa"], result["fusedattn op"],
                 result["fusedattn"] - result["sdpa"],
                 result["fusedattn"] - result["fusedattn op"]))
    if args.profile:
        f = calls(args, "grad")["fusedattn"]
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20000):
            f()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
