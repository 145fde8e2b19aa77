"""Writes tiny random Hugging Face checkpoints, one per family convert knows, for the
convert tests: HF tensor names, two safetensors shards with an index, a
config.json, and the tokenizer files of a real model.

Usage: python make_tiny_hf.py OUT_DIR TOKENIZER_DIR
Creates OUT_DIR/<model_type> for each of FAMILIES. Deterministic (fixed seed).
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 128, 256, 4, 4, 2, 32, 256

BASE = dict(
    tied=False, extra_head=False, qkv_bias=False, qk_norm=None, inv_freq=False,
    norms=("input_layernorm", "post_attention_layernorm"), fused=False, mlp="mlp",
)
GEMMA_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")

FAMILIES = {
    # untied head, bfloat16, the rotary cache mlx-lm drops
    "llama": dict(dtype="bfloat16", inv_freq=True),
    # tied, q/k/v biases, a stray lm_head.weight mlx-lm drops
    "qwen2": dict(dtype="float32", tied=True, qkv_bias=True, inv_freq=True, extra_head=True),
    # untied, q/k norms, float16
    "qwen3": dict(dtype="float16", qk_norm="head"),
    # runs as llama in mlx-lm
    "mistral": dict(dtype="bfloat16", inv_freq=True),
    # the embedding is the head; four norms a layer
    "gemma2": dict(dtype="float32", tied=True, norms=GEMMA_NORMS),
    # config says tied, but an lm_head.weight is present: mlx-lm keeps it
    "gemma3_text": dict(dtype="bfloat16", tied=True, extra_head=True, qk_norm="head", norms=GEMMA_NORMS),
    "smollm3": dict(dtype="bfloat16", tied=True, extra_head=True, inv_freq=True),
    # untied, so its quant_predicate reaches lm_head too
    "granite": dict(dtype="float16"),
    "seed_oss": dict(dtype="bfloat16", tied=True, extra_head=True, qkv_bias=True),
    # q/k norms over all heads; norms after attention and MLP only
    "olmo3": dict(dtype="bfloat16", qk_norm="full", norms=POST_NORMS),
    "exaone4": dict(dtype="float32", tied=True, qk_norm="head", norms=POST_NORMS),
    "ministral3": dict(dtype="bfloat16", tied=True, extra_head=True, inv_freq=True),
    # fused qkv_proj and gate_up_proj
    "phi3": dict(dtype="bfloat16", fused=True),
    # MLP under feed_forward; q/k norms without weights
    "llama4_text": dict(dtype="bfloat16", tied=True, mlp="feed_forward"),
}
FAMILIES = {k: {**BASE, **v} for k, v in FAMILIES.items()}

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "seed_oss": "SeedOssForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
}


def tensors(spec):
    dt = getattr(mx, spec["dtype"])
    w = {}

    def rnd(name, *shape, scale=0.05):
        w[name] = (mx.random.normal(shape) * scale).astype(dt)

    def norm(name, size):
        w[name] = (1 + mx.random.normal((size,)) * 0.1).astype(dt)

    rnd("model.embed_tokens.weight", VOCAB, HIDDEN, scale=0.5)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        if spec["fused"]:
            rnd(f"{p}.self_attn.qkv_proj.weight", (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN)
        else:
            rnd(f"{p}.self_attn.q_proj.weight", HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{p}.self_attn.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{p}.self_attn.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        rnd(f"{p}.self_attn.o_proj.weight", HIDDEN, HEADS * HEAD_DIM)
        if spec["qkv_bias"]:
            rnd(f"{p}.self_attn.q_proj.bias", HEADS * HEAD_DIM)
            rnd(f"{p}.self_attn.k_proj.bias", KV_HEADS * HEAD_DIM)
            rnd(f"{p}.self_attn.v_proj.bias", KV_HEADS * HEAD_DIM)
        if spec["qk_norm"] == "head":
            norm(f"{p}.self_attn.q_norm.weight", HEAD_DIM)
            norm(f"{p}.self_attn.k_norm.weight", HEAD_DIM)
        elif spec["qk_norm"] == "full":
            norm(f"{p}.self_attn.q_norm.weight", HEADS * HEAD_DIM)
            norm(f"{p}.self_attn.k_norm.weight", KV_HEADS * HEAD_DIM)
        if spec["inv_freq"]:
            w[f"{p}.self_attn.rotary_emb.inv_freq"] = mx.arange(HEAD_DIM // 2).astype(mx.float32)
        m = f"{p}.{spec['mlp']}"
        if spec["fused"]:
            rnd(f"{m}.gate_up_proj.weight", 2 * INTER, HIDDEN)
        else:
            rnd(f"{m}.gate_proj.weight", INTER, HIDDEN)
            rnd(f"{m}.up_proj.weight", INTER, HIDDEN)
        rnd(f"{m}.down_proj.weight", HIDDEN, INTER)
        for n in spec["norms"]:
            norm(f"{p}.{n}.weight", HIDDEN)
    norm("model.norm.weight", HIDDEN)
    if not spec["tied"] or spec["extra_head"]:
        rnd("lm_head.weight", VOCAB, HIDDEN)
    return w


def config(family, spec):
    c = {
        "architectures": [ARCHITECTURES[family]],
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
    sliding = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    c.update(
        {
            "llama": dict(attention_bias=False, mlp_bias=False),
            "gemma2": dict(
                query_pre_attn_scalar=HEAD_DIM, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                sliding_window=64, hidden_activation="gelu_pytorch_tanh",
            ),
            "gemma3_text": dict(
                query_pre_attn_scalar=HEAD_DIM, sliding_window=64, sliding_window_pattern=2,
                rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh",
            ),
            "smollm3": dict(no_rope_layer_interval=4, no_rope_layers=[1, 1, 1, 0]),
            "granite": dict(
                logits_scaling=2.0, attention_multiplier=0.03125, embedding_multiplier=4.0,
                residual_multiplier=0.5, attention_bias=False, mlp_bias=False,
            ),
            "seed_oss": dict(attention_bias=True, attention_out_bias=False, mlp_bias=False),
            "olmo3": dict(sliding_window=64, layer_types=sliding, attention_bias=False),
            "exaone4": dict(
                sliding_window=64, sliding_window_pattern="LLLG", layer_types=sliding, rope_scaling=None,
            ),
            "ministral3": dict(
                rope_parameters={
                    "rope_type": "default", "rope_theta": 10000.0,
                    "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 2048,
                },
            ),
            "phi3": dict(rope_scaling=None),
            "llama4_text": dict(intermediate_size_mlp=INTER, no_rope_layers=[1, 1, 1, 0], use_qk_norm=True),
        }.get(family, {})
    )
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
