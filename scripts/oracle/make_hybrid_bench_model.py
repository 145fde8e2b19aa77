#!/usr/bin/env python3
"""A random hybrid model for benchmarks: mlx-lm 0.32.2's own Qwen3-Next
class (gated DeltaNet layers with one full-attention layer in four, dense
feed-forward everywhere), at a size where prefill costs real time on a CPU,
with the default model's tokenizer and chat template so both servers can
chat with it. Weights keep the classes' own initialization (seeded),
stored as float32.

    python scripts/oracle/make_hybrid_bench_model.py OUT_DIR TOKENIZER_DIR
"""
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

LAYERS = 8
CONFIG = {
    "model_type": "qwen3_next",
    "hidden_size": 512,
    "num_hidden_layers": LAYERS,
    "intermediate_size": 1536,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "vocab_size": 49152,
    "max_position_embeddings": 32768,
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "tie_word_embeddings": False,
    "full_attention_interval": 4,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 0,
    "num_experts_per_tok": 1,
    "decoder_sparse_step": 1,
    "mlp_only_layers": list(range(LAYERS)),
    "moe_intermediate_size": 0,
    "shared_expert_intermediate_size": 0,
    "norm_topk_prob": True,
}


def main():
    out, tokenizer = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(11)
    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = dict(CONFIG)
    config["eos_token_id"] = 2
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(tokenizer / f, out / f)
    print(out, sum(v.size for v in weights.values()), "parameters")


if __name__ == "__main__":
    main()
