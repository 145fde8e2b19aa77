"""Writes tiny random Hugging Face checkpoints (llama, qwen2, qwen3) for the
convert tests: HF tensor names, two safetensors shards with an index, a
config.json, and the tokenizer files of a real model.

Usage: python make_tiny_hf.py OUT_DIR TOKENIZER_DIR
Creates OUT_DIR/{llama,qwen2,qwen3}. Deterministic (fixed seed).
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 128, 256, 4, 4, 2, 32, 256

FAMILIES = {
    # untied head, bfloat16, the rotary cache mlx-lm drops
    "llama": dict(dtype="bfloat16", tied=False, qkv_bias=False, qk_norm=False, inv_freq=True, extra_head=False),
    # tied, q/k/v biases, a stray lm_head.weight mlx-lm drops
    "qwen2": dict(dtype="float32", tied=True, qkv_bias=True, qk_norm=False, inv_freq=True, extra_head=True),
    # untied, q/k norms, float16
    "qwen3": dict(dtype="float16", tied=False, qkv_bias=False, qk_norm=True, inv_freq=False, extra_head=False),
}


def tensors(spec):
    dt = getattr(mx, spec["dtype"])
    w = {}

    def rnd(name, *shape, scale=0.05):
        w[name] = (mx.random.normal(shape) * scale).astype(dt)

    rnd("model.embed_tokens.weight", VOCAB, HIDDEN, scale=0.5)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        rnd(f"{p}.self_attn.q_proj.weight", HEADS * HEAD_DIM, HIDDEN)
        rnd(f"{p}.self_attn.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        rnd(f"{p}.self_attn.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        rnd(f"{p}.self_attn.o_proj.weight", HIDDEN, HEADS * HEAD_DIM)
        if spec["qkv_bias"]:
            rnd(f"{p}.self_attn.q_proj.bias", HEADS * HEAD_DIM)
            rnd(f"{p}.self_attn.k_proj.bias", KV_HEADS * HEAD_DIM)
            rnd(f"{p}.self_attn.v_proj.bias", KV_HEADS * HEAD_DIM)
        if spec["qk_norm"]:
            w[f"{p}.self_attn.q_norm.weight"] = (1 + mx.random.normal((HEAD_DIM,)) * 0.1).astype(dt)
            w[f"{p}.self_attn.k_norm.weight"] = (1 + mx.random.normal((HEAD_DIM,)) * 0.1).astype(dt)
        if spec["inv_freq"]:
            w[f"{p}.self_attn.rotary_emb.inv_freq"] = mx.arange(HEAD_DIM // 2).astype(mx.float32)
        rnd(f"{p}.mlp.gate_proj.weight", INTER, HIDDEN)
        rnd(f"{p}.mlp.up_proj.weight", INTER, HIDDEN)
        rnd(f"{p}.mlp.down_proj.weight", HIDDEN, INTER)
        w[f"{p}.input_layernorm.weight"] = (1 + mx.random.normal((HIDDEN,)) * 0.1).astype(dt)
        w[f"{p}.post_attention_layernorm.weight"] = (1 + mx.random.normal((HIDDEN,)) * 0.1).astype(dt)
    w["model.norm.weight"] = (1 + mx.random.normal((HIDDEN,)) * 0.1).astype(dt)
    if not spec["tied"] or spec["extra_head"]:
        rnd("lm_head.weight", VOCAB, HIDDEN)
    return w


def config(family, spec):
    c = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]],
        "model_type": family,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB,
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "_name_or_path": f"tiny-{family}",
    }
    if family == "llama":
        c.update(attention_bias=False, mlp_bias=False)
    return c


def write(out, family, spec, tokenizer_dir):
    d = out / family
    d.mkdir(parents=True, exist_ok=False)
    w = tensors(spec)
    names = sorted(w)
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    weight_map = {}
    total = 0
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(d / fname), {k: w[k] for k in part}, metadata={"format": "pt"})
        for k in part:
            weight_map[k] = fname
            total += w[k].nbytes
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (d / "config.json").write_text(json.dumps(config(family, spec), indent=2))
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 3]}))
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(Path(tokenizer_dir) / f, d / f)


def main():
    out, tokenizer_dir = Path(sys.argv[1]), sys.argv[2]
    mx.random.seed(7)
    for family, spec in FAMILIES.items():
        write(out, family, spec, tokenizer_dir)


if __name__ == "__main__":
    main()
