#!/usr/bin/env python3
"""Train-step time of a Hugging Face Llama with attn_implementation="fusedattn" against "sdpa",
side by side in one process on the same inputs (issue 19's figure).

The model: random weights, 8 layers, hidden 2048, GQA 16/4 heads (head dim 128), MLP 5632,
vocabulary 32000, bfloat16 on one GPU; a step is forward (use_cache=False) + backward + fused
AdamW on 4 x 2048 tokens. The two models start from the same weights and are stepped
alternately (back to back, the order swapped every step), each step timed on the host between
device synchronizations (so host cost counts); the median of --steps steps after --warmup. The
first step's loss, logits and parameter gradients of the two are compared (relative error).

Batches: "full" (no padding: transformers passes no mask to SDPA, fusedattn runs a dense causal
plan) and "padded" (lengths 2048, 1536, 1024, 512, right-padded; SDPA gets a [4, 1, 2048, 2048]
boolean mask, fusedattn a varlen plan) and "left-padded" (the same lengths padded on the left).

    python bench/hf_train_step.py --out DIR      # writes hf-train-step-<gpu>-<date>.{json,md}
"""

import argparse
import copy
import datetime
import json
import os
import statistics
import time

import torch
import transformers

import fusedattn
import fusedattn.integrations.transformers  # noqa: F401  registers "fusedattn"

IMPLEMENTATIONS = ("sdpa", "fusedattn")


def build_models(args):
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq)
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    base = base.to(device=args.device, dtype=getattr(torch, args.dtype)).train()
    models = {}
    for name in IMPLEMENTATIONS:
        model = copy.deepcopy(base)
        model.set_attn_implementation(name)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5,
                                      fused=args.device == "cuda")
        models[name] = (model, optimizer)
    return models


def batch(kind, args):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator)
    mask = None
    if kind != "full":
        lengths = [args.seq * (args.batch - b) // args.batch for b in range(args.batch)]
        mask = torch.zeros(args.batch, args.seq, dtype=torch.long)
        for b, n in enumerate(lengths):
            if kind == "padded":
                mask[b, :n] = 1
            else:
                mask[b, args.seq - n:] = 1
    labels = ids.clone() if mask is None else ids.masked_fill(mask == 0, -100)
    if mask is not None:
        # As in the tests: a label counts where the token predicting it is real too.
        labels = labels.masked_fill(torch.nn.functional.pad(mask[:, :-1], (1, 0), value=1) == 0,
                                    -100)
        mask = mask.to(args.device)
    return ids.to(args.device), mask, labels.to(args.device)


def step(model, optimizer, ids, mask, labels, keep=False):
    out = model(ids, attention_mask=mask, labels=labels, use_cache=False)
    out.loss.backward()
    kept = None
    if keep:
        kept = (out.loss.detach().float(), out.logits.detach().float(),
                {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
                 if p.grad is not None})
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return kept


def relative(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def compare(kept, mask):
    (loss_s, logits_s, grads_s), (loss_f, logits_f, grads_f) = kept["sdpa"], kept["fusedattn"]
    real = torch.ones(logits_s.shape[:2], dtype=torch.bool, device=logits_s.device) \
        if mask is None else mask.bool()
    grad_errors = {n: relative(grads_f[n], g) for n, g in grads_s.items()}
    worst = max(grad_errors, key=grad_errors.get)
    return {"loss_sdpa": float(loss_s), "loss_fusedattn": float(loss_f),
            "loss_rel": relative(loss_f, loss_s),
            "logits_rel": relative(logits_f[real], logits_s[real]),
            "grad_rel_median": statistics.median(grad_errors.values()),
            "grad_rel_max": grad_errors[worst], "grad_rel_max_param": worst}


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(kind, models, args):
    ids, mask, labels = batch(kind, args)
    kept = {}
    for name in IMPLEMENTATIONS:  # the first step of each from the same weights
        kept[name] = step(*models[name], ids, mask, labels, keep=True)
    result = compare(kept, mask)
    times = {name: [] for name in IMPLEMENTATIONS}
    for i in range(args.warmup + args.steps):
        order = IMPLEMENTATIONS if i % 2 == 0 else IMPLEMENTATIONS[::-1]
        for name in order:
            synchronize(args.device)
            start = time.perf_counter()
            step(*models[name], ids, mask, labels)
            synchronize(args.device)
            if i >= args.warmup:
                times[name].append(1e3 * (time.perf_counter() - start))
    for name in IMPLEMENTATIONS:
        result["ms_" + name] = statistics.median(times[name])
    result["sdpa_over_fusedattn"] = result["ms_sdpa"] / result["ms_fusedattn"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="folder for the .json and .md results")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--mlp", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batches", default="full,padded,left-padded")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (the tests' own)")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    models = build_models(args)
    head_dim = args.hidden // args.heads
    explain = fusedattn.explain((args.batch, args.seq, args.heads, head_dim),
                                (args.batch, args.seq, args.kv_heads, head_dim),
                                (args.batch, args.seq, args.kv_heads, head_dim),
                                dtype=args.dtype, device=args.device, mask="causal")
    print(explain)
    results = {}
    for kind in args.batches.split(","):
        results[kind] = run(kind, models, args)
        r = results[kind]
        print("%-11s sdpa %7.2f ms  fusedattn %7.2f ms  (sdpa/fusedattn %.3fx)  loss %.5f vs "
              "%.5f  logits rel %.2e  grads rel median %.2e max %.2e (%s)"
              % (kind, r["ms_sdpa"], r["ms_fusedattn"], r["sdpa_over_fusedattn"],
                 r["loss_sdpa"], r["loss_fusedattn"], r["logits_rel"], r["grad_rel_median"],
                 r["grad_rel_max"], r["grad_rel_max_param"]))
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    record = {"gpu": gpu, "torch": torch.__version__,
              "transformers": transformers.__version__, "fusedattn": fusedattn.version(),
              "cudnn": torch.backends.cudnn.version() if args.device == "cuda" else None,
              "args": vars(args),
              "fusedattn_explain": explain, "results": results}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, "hf-train-step-%s-%s" % (
            gpu.lower().replace(" ", "-"), datetime.date.today()))
        with open(stem + ".json", "w") as f:
            json.dump(record, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write("# HF Llama train step, %s, %s, %d x %d tokens, %d layers, GQA %d/%d\n\n"
                    % (gpu, args.dtype, args.batch, args.seq, args.layers, args.heads,
                       args.kv_heads))
            f.write("| batch | sdpa ms | fusedattn ms | sdpa/fusedattn | loss rel | logits rel "
                    "| grads rel (median / max) |\n|---|---|---|---|---|---|---|\n")
            for kind, r in results.items():
                f.write("| %s | %.2f | %.2f | %.3fx | %.2e | %.2e | %.2e / %.2e |\n"
                        % (kind, r["ms_sdpa"], r["ms_fusedattn"], r["sdpa_over_fusedattn"],
                           r["loss_rel"], r["logits_rel"], r["grad_rel_median"],
                           r["grad_rel_max"]))
        print("wrote", stem + ".json", stem + ".md")


if __name__ == "__main__":
    main()
