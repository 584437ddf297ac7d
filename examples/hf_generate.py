"""Hugging Face generation with fusedattn as the attention implementation: one import, then
attn_implementation="fusedattn".

    python examples/hf_generate.py                                   # a tiny random Llama
    python examples/hf_generate.py --model Qwen/Qwen2.5-0.5B --prompt "Attention is"  # weights
                                                                     # from the hub or a folder

Prompts of different lengths go as one left-padded batch (the padding runs unpadded, no
O(seq^2) mask); greedy decoding with fusedattn is checked against the same model with
attn_implementation="sdpa": in float32 the script fails if the tokens differ (in 16-bit types it
reports how many agree). python/tests runs it on the CPU with a tiny random model."""

import argparse
import copy

import torch
import transformers

import fusedattn.integrations.transformers  # noqa: F401  registers "fusedattn"


def tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config), None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model name or folder (default: a tiny "
                        "random Llama, no download)")
    parser.add_argument("--prompt", action="append", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, else float32")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))

    if args.model is None:
        model, tokenizer = tiny_llama()
        lengths = [5, 9, 3]
        ids = torch.randint(3, 128, (len(lengths), max(lengths)),
                            generator=torch.Generator().manual_seed(1))
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):  # left padding, as generation wants it
            mask[row, -n:] = 1
        ids = ids * mask
        inputs = dict(input_ids=ids, attention_mask=mask)
        pad_token_id = 0
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model, padding_side="left")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        prompts = args.prompt or ["Attention is", "The capital of France is a city that"]
        inputs = tokenizer(prompts, return_tensors="pt", padding=True)
        pad_token_id = tokenizer.pad_token_id
    inputs = {name: t.to(args.device) for name, t in inputs.items()}

    outputs = {}
    for implementation in ("fusedattn", "sdpa"):
        copy_of_model = copy.deepcopy(model).to(device=args.device, dtype=dtype).eval()
        copy_of_model.set_attn_implementation(implementation)
        with torch.no_grad():
            outputs[implementation] = copy_of_model.generate(
                **inputs, max_new_tokens=args.max_new_tokens, do_sample=False,
                pad_token_id=pad_token_id)
    new_tokens = outputs["fusedattn"][:, inputs["input_ids"].shape[1]:]
    for row, tokens in enumerate(new_tokens.tolist()):
        text = tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer else tokens
        print("prompt %d -> %s" % (row, text))
    same = (outputs["fusedattn"] == outputs["sdpa"]).float().mean().item()
    print("fusedattn and sdpa agree on %.1f%% of the tokens (greedy, %s, %s)"
          % (100 * same, args.device, str(dtype).replace("torch.", "")))
    # float32 must agree exactly; in 16-bit types a near tie between two tokens may round
    # either way and the continuations then part, so there it is only reported.
    if dtype == torch.float32 and same < 1:
        raise SystemExit("fusedattn and sdpa generated different tokens:\n%s\n%s"
                         % (outputs["fusedattn"].tolist(), outputs["sdpa"].tolist()))


if __name__ == "__main__":
    main()
