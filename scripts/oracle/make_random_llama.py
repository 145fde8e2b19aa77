"""Writes a random-weight model with Llama-3-8B's layer shapes, quantized by
mlx-lm's own classes, for decode benchmarks on a GPU (no download needed).

    python make_random_llama.py OUT TOKENIZER_DIR [--dtype bfloat16|float32] [--bits 4]

TOKENIZER_DIR: a folder with tokenizer files (the default model's will do);
its vocabulary size sets the model's.
"""

import argparse
import json
import os
import shutil

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("tokenizer")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--bits", type=int, default=4, help="0 keeps the weights unquantized")
    p.add_argument("--group-size", type=int, default=64)
    args = p.parse_args()

    with open(os.path.join(args.tokenizer, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    ids = list(tokenizer["model"]["vocab"].values())
    ids += [t["id"] for t in tokenizer.get("added_tokens", [])]
    vocab = max(ids) + 1
    cfg = dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        vocab_size=vocab, rope_theta=500000.0, tie_word_embeddings=False,
        max_position_embeddings=8192,
    )
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    model.set_dtype(getattr(mx, args.dtype))
    if args.bits:
        nn.quantize(model, group_size=args.group_size, bits=args.bits)
        q = {"group_size": args.group_size, "bits": args.bits}
        cfg.update(quantization=q, quantization_config=q)
    mx.eval(model.parameters())
    os.makedirs(args.out, exist_ok=True)
    mx.save_safetensors(
        os.path.join(args.out, "model.safetensors"),
        dict(tree_flatten(model.parameters())),
        metadata={"format": "mlx"},
    )
    cfg.update(architectures=["LlamaForCausalLM"], torch_dtype=args.dtype,
               bos_token_id=1, eos_token_id=2)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in os.listdir(args.tokenizer):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "generation_config.json"):
            shutil.copy(os.path.join(args.tokenizer, name), args.out)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"model written to {args.out}: {size / 1e9:.2f} GB, vocabulary {vocab}")


if __name__ == "__main__":
    main()
