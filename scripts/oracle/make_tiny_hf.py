"""Writes tiny random Hugging Face checkpoints, one per family convert knows, for the
convert tests: HF tensor names, two safetensors shards with an index, a
config.json, and the tokenizer files of a real model.

Usage: python make_tiny_hf.py OUT_DIR TOKENIZER_DIR
Creates OUT_DIR/<model_type> for each of FAMILIES (and, for one float8 with
per-tensor scales, OUT_DIR/<model_type>_dequantized: the same weights as
floats, for mlx-lm, which misreads those float8 bytes). Deterministic (fixed seed).
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 128, 256, 4, 4, 2, 32, 256
EXPERTS, TOP_K, MOE_INTER = 4, 2, 128
# Gated DeltaNet layers (three of every four): key and value heads, head sizes, kernel.
LIN_K_HEADS, LIN_V_HEADS, LIN_HEAD_DIM, CONV_KERNEL = 2, 4, 32, 4
# DeepSeek-V3's latent attention: query and key-value ranks, head parts.
Q_RANK, KV_RANK, NOPE, ROPE, V_DIM = 64, 64, 64, 32, 64
# Granite 4's Mamba-2 mixers: heads, head size, state size, groups, kernel
# (heads × head size = mamba_expand (2) × hidden, as transformers checks).
MAMBA_HEADS, MAMBA_HEAD_DIM, MAMBA_STATE, MAMBA_GROUPS, MAMBA_KERNEL = 8, 32, 16, 2, 4
GRANITE_HYBRID_LAYERS = ["mamba", "attention", "mamba", "attention"]

BASE = dict(
    tied=False, extra_head=False, qkv_bias=False, qk_norm=None, inv_freq=False,
    norms=("input_layernorm", "post_attention_layernorm"), fused=False, mlp="mlp", moe=None,
    hybrid=False, mtp=False, split_in_proj=False, nested=False, fp8=False, mistral3=None,
)
# Sparse feed-forwards as Hugging Face stores them: a router `gate` and each
# expert's projections apart, `{block}.experts.{e}.{gate,up,down names}`.
MIXTRAL_MOE = dict(block="block_sparse_moe", names=("w1", "w3", "w2"), inter=INTER)
QWEN3_MOE = dict(block="mlp", names=("gate_proj", "up_proj", "down_proj"), inter=MOE_INTER)
# ... plus a shared expert scaled by a one-output gate (Qwen3-Next).
QWEN3_NEXT_MOE = dict(QWEN3_MOE, shared=True)
# ... with the experts fused: `experts.gate_up_proj` [experts, 2 x inter, hidden]
# and `experts.down_proj`, no `.weight` suffix (Qwen3.5-MoE).
QWEN3_5_MOE = dict(QWEN3_NEXT_MOE, fused_experts=True)
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
    # per-expert w1/w3/w2 that mlx-lm stacks into switch_mlp
    "mixtral": dict(dtype="bfloat16", moe=MIXTRAL_MOE),
    # per-expert projections, q/k norms; its predicate keeps the routers at 8 bits
    "qwen3_moe": dict(dtype="bfloat16", qk_norm="head", moe=QWEN3_MOE),
    # gated DeltaNet layers (convolution [channels, 1, kernel]), gated attention,
    # norms stored as offsets from 1, shared experts, mtp.* tensors mlx-lm drops
    "qwen3_next": dict(dtype="bfloat16", qk_norm="head", moe=QWEN3_NEXT_MOE, hybrid=True, mtp=True),
    # Qwen3-Next's decoder with the DeltaNet projections apart, inside a
    # vision-language checkpoint: tensors under model.language_model., a vision
    # tensor and mtp.* mlx-lm drops, the decoder's config in text_config
    "qwen3_5": dict(dtype="bfloat16", qk_norm="head", hybrid=True, mtp=True, split_in_proj=True, nested=True),
    "qwen3_5_moe": dict(
        dtype="bfloat16", qk_norm="head", moe=QWEN3_5_MOE, hybrid=True, mtp=True, split_in_proj=True, nested=True,
    ),
    # sigmoid-routed experts with a float32 score correction mlx-lm keeps; layers of their own
    "glm4_moe": dict(dtype="bfloat16"),
    "deepseek_v3": dict(dtype="bfloat16"),
    # runs as deepseek_v3 in mlx-lm
    "kimi_k2": dict(dtype="bfloat16"),
    # tied; convolutions mlx-lm turns to [channels, kernel, 1]; no down_proj for the mixed recipes
    "lfm2": dict(dtype="bfloat16", tied=True),
    # tied with a stray lm_head.weight mlx-lm drops; a float32 A_log it casts
    "granitemoehybrid": dict(dtype="bfloat16", tied=True, extra_head=True),
    # no experts: mlx-lm renames the shared MLP mlp
    "granitemoehybrid_dense": dict(dtype="bfloat16", tied=True, model_type="granitemoehybrid"),
    # MXFP4 experts, which mlx-lm keeps packed
    "gpt_oss": dict(dtype="bfloat16"),
    # Mamba-2, attention, ReLU² MLP and experts layers under backbone.; per-expert
    # up/down mlx-lm stacks into switch_mlp fc1/fc2; a float32 score correction and
    # A_log it keeps; mtp.* it drops; an untied head
    "nemotron_h": dict(dtype="bfloat16"),
    # (last, so the families above draw the same random tensors)
    # as Mistral publishes Ministral 3: every layer's linear weights F8_E4M3
    # with a per-tensor weight_scale_inv and an activation_scale
    "ministral3_fp8": dict(dtype="bfloat16", tied=True, extra_head=True, model_type="ministral3", fp8="tensor"),
    # The Mistral 3 vision-language wrapper: the decoder's config in text_config,
    # a vision tower and projector mlx-lm drops. Ministral 3 in transformers 5's
    # layout (model.language_model.*, lm_head, model.vision_tower.*), text_config
    # without tie_word_embeddings (untied to mlx-lm); a tied LLaMA-style one in
    # the older layout (language_model.model.*, language_model.lm_head, a stray
    # head mlx-lm drops, vision_tower.*); the Ministral 3 one in float8.
    "mistral3": dict(dtype="bfloat16", inv_freq=True, model_type="ministral3", mistral3="hf"),
    "mistral3_llama": dict(dtype="bfloat16", tied=True, extra_head=True, model_type="mistral", mistral3="legacy"),
    "mistral3_fp8": dict(dtype="bfloat16", model_type="ministral3", fp8="tensor", mistral3="hf"),
    # as DeepSeek publishes DeepSeek-V3: the layers' linear weights (not the
    # routers) F8_E4M3 with float32 weight_scale_inv per 128×128 block; a dense
    # intermediate size of 192 and the 96-row kv_a_proj_with_mqa leave
    # partial blocks at the edges
    "deepseek_v3_fp8": dict(dtype="bfloat16", model_type="deepseek_v3", fp8="block"),
    # as Qwen publishes Qwen3-FP8: the same block layout (the 64-row k/v
    # projections partial blocks); mlx-lm does not read it, so a dequantized
    # copy is its reference
    "qwen3_fp8": dict(dtype="bfloat16", qk_norm="head", model_type="qwen3", fp8="block"),
    # as Z.ai publishes GLM-4.5-FP8: the same block layout on every expert's
    # projections (the router kept in bfloat16); mlx-lm does not read it
    "glm4_moe_fp8": dict(dtype="bfloat16", model_type="glm4_moe", fp8="block"),
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
    "ministral3_fp8": "Ministral3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "glm4_moe": "Glm4MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "deepseek_v3_fp8": "DeepseekV3ForCausalLM",
    "qwen3_fp8": "Qwen3ForCausalLM",
    "glm4_moe_fp8": "Glm4MoeForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "granitemoehybrid_dense": "GraniteMoeHybridForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "mistral3": "Mistral3ForConditionalGeneration",
    "mistral3_llama": "Mistral3ForConditionalGeneration",
    "mistral3_fp8": "Mistral3ForConditionalGeneration",
}

GRANITE_HYBRID = dict(
    intermediate_size=MOE_INTER, layer_types=GRANITE_HYBRID_LAYERS, attention_multiplier=0.03125,
    embedding_multiplier=4.0, residual_multiplier=0.5, logits_scaling=2.0, attention_bias=False,
    shared_intermediate_size=MOE_INTER, mamba_n_heads=MAMBA_HEADS, mamba_d_head=MAMBA_HEAD_DIM,
    mamba_proj_bias=False, mamba_d_state=MAMBA_STATE, mamba_d_conv=MAMBA_KERNEL, mamba_n_groups=MAMBA_GROUPS,
    mamba_conv_bias=True, position_embedding_type="rope",
)
SIGMOID_MOE = dict(
    n_routed_experts=EXPERTS, n_shared_experts=1, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_INTER,
    first_k_dense_replace=1, n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
    topk_method="noaux_tc", scoring_func="sigmoid",
)
GLM4_MOE = dict(
    SIGMOID_MOE, attention_bias=True, use_qk_norm=True, partial_rotary_factor=0.5, rope_scaling=None,
    num_nextn_predict_layers=1,
)
DEEPSEEK_V3 = dict(
    SIGMOID_MOE, q_lora_rank=Q_RANK, kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
    v_head_dim=V_DIM, moe_layer_freq=1, attention_bias=False, num_key_value_heads=HEADS, rope_scaling=None,
)


MINISTRAL3 = dict(
    rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0,
        "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 2048,
    },
)
FP8_MAX = 448.0
FP8_BLOCK = 128
# DeepSeek-V3 fp8's dense intermediate size: one full and one partial block.
FP8_INTER = 192
FP8_BLOCKS = {
    "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
}


def to_fp8(w):
    """Every layer's linear weights as e4m3 bytes over a per-tensor scale, as
    transformers' FP8 layers store them: `weight` (uint8 here, F8_E4M3 once
    written), `weight_scale_inv` and an `activation_scale` no loader uses."""
    out = {}
    for name, v in w.items():
        if not (name.startswith("model.layers.") and name.endswith("_proj.weight")):
            out[name] = v
            continue
        scale = mx.max(mx.abs(v.astype(mx.float32))) / FP8_MAX
        out[name] = mx.to_fp8(v.astype(mx.float32) / scale)
        base = name[: -len("weight")]
        out[base + "weight_scale_inv"] = scale.astype(v.dtype)
        out[base + "activation_scale"] = mx.array(0.5 + mx.random.uniform().item()).astype(v.dtype)
    return out


def to_fp8_blocks(w):
    """Every layer's linear weights (not the routers) as e4m3 bytes, each
    FP8_BLOCK × FP8_BLOCK block over its own float32 `weight_scale_inv`, as
    DeepSeek's checkpoints store them; blocks at the edges may be partial."""
    out = {}
    for name, v in w.items():
        if not (name.startswith("model.layers.") and v.ndim == 2 and not name.endswith(".gate.weight")):
            out[name] = v
            continue
        rows, cols = v.shape
        up = lambda n: -(-n // FP8_BLOCK)
        scale = mx.zeros((up(rows), up(cols)))
        blocks = v.astype(mx.float32)
        for r in range(up(rows)):
            for c in range(up(cols)):
                tile = blocks[r * FP8_BLOCK : (r + 1) * FP8_BLOCK, c * FP8_BLOCK : (c + 1) * FP8_BLOCK]
                scale[r, c] = mx.max(mx.abs(tile)) / FP8_MAX
        per_weight = mx.repeat(mx.repeat(scale, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:rows, :cols]
        out[name] = mx.to_fp8(blocks / per_weight)
        out[name[: -len("weight")] + "weight_scale_inv"] = scale
    return out


def mark_fp8(path):
    """Rewrites a safetensors file's uint8 tensors as F8_E4M3 (MLX writes no fp8 dtype)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    for k, v in header.items():
        if k != "__metadata__" and v["dtype"] == "U8":
            v["dtype"] = "F8_E4M3"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n :])


def tensors(spec):
    dt = getattr(mx, spec["dtype"])
    w = {}

    def rnd(name, *shape, scale=0.05, dtype=dt):
        w[name] = (mx.random.normal(shape) * scale).astype(dtype)

    def norm(name, size):
        w[name] = (1 + mx.random.normal((size,)) * 0.1).astype(dt)

    rnd("model.embed_tokens.weight", VOCAB, HIDDEN, scale=0.5)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        if spec["hybrid"] and i % 4 != 3:
            delta_net(rnd, norm, f"{p}.linear_attn", spec["split_in_proj"])
        elif spec["fused"]:
            rnd(f"{p}.self_attn.qkv_proj.weight", (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN)
        else:
            # a gated attention's q_proj also yields the output gate
            q_rows = HEADS * HEAD_DIM * (2 if spec["hybrid"] else 1)
            rnd(f"{p}.self_attn.q_proj.weight", q_rows, HIDDEN)
            rnd(f"{p}.self_attn.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{p}.self_attn.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        if not spec["hybrid"] or i % 4 == 3:
            rnd(f"{p}.self_attn.o_proj.weight", HIDDEN, HEADS * HEAD_DIM)
        if spec["qkv_bias"]:
            rnd(f"{p}.self_attn.q_proj.bias", HEADS * HEAD_DIM)
            rnd(f"{p}.self_attn.k_proj.bias", KV_HEADS * HEAD_DIM)
            rnd(f"{p}.self_attn.v_proj.bias", KV_HEADS * HEAD_DIM)
        if spec["qk_norm"] == "head" and (not spec["hybrid"] or i % 4 == 3):
            norm(f"{p}.self_attn.q_norm.weight", HEAD_DIM)
            norm(f"{p}.self_attn.k_norm.weight", HEAD_DIM)
        elif spec["qk_norm"] == "full":
            norm(f"{p}.self_attn.q_norm.weight", HEADS * HEAD_DIM)
            norm(f"{p}.self_attn.k_norm.weight", KV_HEADS * HEAD_DIM)
        if spec["inv_freq"]:
            w[f"{p}.self_attn.rotary_emb.inv_freq"] = mx.arange(HEAD_DIM // 2).astype(mx.float32)
        if spec["moe"]:
            moe = spec["moe"]
            block = f"{p}.{moe['block']}"
            rnd(f"{block}.gate.weight", EXPERTS, HIDDEN)
            gate, up, down = moe["names"]
            if moe.get("fused_experts"):
                rnd(f"{block}.experts.gate_up_proj", EXPERTS, 2 * moe["inter"], HIDDEN)
                rnd(f"{block}.experts.down_proj", EXPERTS, HIDDEN, moe["inter"])
            for e in range(0 if moe.get("fused_experts") else EXPERTS):
                x = f"{block}.experts.{e}"
                rnd(f"{x}.{gate}.weight", moe["inter"], HIDDEN)
                rnd(f"{x}.{up}.weight", moe["inter"], HIDDEN)
                rnd(f"{x}.{down}.weight", HIDDEN, moe["inter"])
            if moe.get("shared"):
                rnd(f"{block}.shared_expert.gate_proj.weight", MOE_INTER, HIDDEN)
                rnd(f"{block}.shared_expert.up_proj.weight", MOE_INTER, HIDDEN)
                rnd(f"{block}.shared_expert.down_proj.weight", HIDDEN, MOE_INTER)
                rnd(f"{block}.shared_expert_gate.weight", 1, HIDDEN)
        else:
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
    if spec["mtp"]:
        rnd("mtp.fc.weight", HIDDEN, 2 * HIDDEN)
        norm("mtp.norm.weight", HIDDEN)
    if not spec["tied"] or spec["extra_head"]:
        rnd("lm_head.weight", VOCAB, HIDDEN)
    if spec["nested"]:
        w = {(f"model.language_model.{k[6:]}" if k.startswith("model.") else k): v for k, v in w.items()}
        rnd("model.visual.patch_embed.proj.weight", HIDDEN, 3 * 2 * 16 * 16)
    return w


def sigmoid_routed_moe(rnd, w, prefix):
    """A sigmoid-routed MoE block (GLM-4.5, DeepSeek-V3): a router with a
    float32 score correction, experts one by one, a shared expert."""
    rnd(f"{prefix}.gate.weight", EXPERTS, HIDDEN)
    w[f"{prefix}.gate.e_score_correction_bias"] = mx.random.normal((EXPERTS,)) * 0.1
    for e in range(EXPERTS):
        swiglu(rnd, f"{prefix}.experts.{e}", MOE_INTER)
    swiglu(rnd, f"{prefix}.shared_experts", MOE_INTER)


def swiglu(rnd, prefix, inter):
    rnd(f"{prefix}.gate_proj.weight", inter, HIDDEN)
    rnd(f"{prefix}.up_proj.weight", inter, HIDDEN)
    rnd(f"{prefix}.down_proj.weight", HIDDEN, inter)


def glm4_moe_tensors(rnd, norm, w):
    """GLM-4.5: biased q/k/v, per-head q/k norms, a dense first layer, and a
    multi-token-prediction layer `model.layers.{LAYERS}` mlx-lm drops."""
    for i in range(LAYERS + 1):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        for proj, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
            rnd(f"{a}.{proj}_proj.weight", heads * HEAD_DIM, HIDDEN)
            rnd(f"{a}.{proj}_proj.bias", heads * HEAD_DIM)
        rnd(f"{a}.o_proj.weight", HIDDEN, HEADS * HEAD_DIM)
        norm(f"{a}.q_norm.weight", HEAD_DIM)
        norm(f"{a}.k_norm.weight", HEAD_DIM)
        if i == 0:
            swiglu(rnd, f"{p}.mlp", INTER)
        else:
            sigmoid_routed_moe(rnd, w, f"{p}.mlp")
        norm(f"{p}.input_layernorm.weight", HIDDEN)
        norm(f"{p}.post_attention_layernorm.weight", HIDDEN)
    rnd(f"model.layers.{LAYERS}.eh_proj.weight", HIDDEN, 2 * HIDDEN)
    norm(f"model.layers.{LAYERS}.enorm.weight", HIDDEN)


def deepseek_v3_tensors(rnd, norm, w, inter=INTER):
    """DeepSeek-V3: latent attention with the unsplit `kv_b_proj`, a dense
    first layer, rotary caches mlx-lm drops."""
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        rnd(f"{a}.q_a_proj.weight", Q_RANK, HIDDEN)
        norm(f"{a}.q_a_layernorm.weight", Q_RANK)
        rnd(f"{a}.q_b_proj.weight", HEADS * (NOPE + ROPE), Q_RANK)
        rnd(f"{a}.kv_a_proj_with_mqa.weight", KV_RANK + ROPE, HIDDEN)
        norm(f"{a}.kv_a_layernorm.weight", KV_RANK)
        rnd(f"{a}.kv_b_proj.weight", HEADS * (NOPE + V_DIM), KV_RANK)
        rnd(f"{a}.o_proj.weight", HIDDEN, HEADS * V_DIM)
        w[f"{a}.rotary_emb.inv_freq"] = mx.arange(ROPE // 2).astype(mx.float32)
        if i == 0:
            swiglu(rnd, f"{p}.mlp", inter)
        else:
            sigmoid_routed_moe(rnd, w, f"{p}.mlp")
        norm(f"{p}.input_layernorm.weight", HIDDEN)
        norm(f"{p}.post_attention_layernorm.weight", HIDDEN)


# LFM2's layers: short convolutions and attention.
LFM2_LAYERS = ["conv", "full_attention", "conv", "full_attention"]
LFM2_KERNEL = 3


def lfm2_tensors(rnd, norm, w):
    """LFM2: gated short convolutions in Hugging Face's `[channels, 1, kernel]`,
    attention with per-head q/k norms, a w1/w3/w2 feed-forward."""
    for i, kind in enumerate(LFM2_LAYERS):
        p = f"model.layers.{i}"
        if kind == "conv":
            rnd(f"{p}.conv.in_proj.weight", 3 * HIDDEN, HIDDEN)
            rnd(f"{p}.conv.conv.weight", HIDDEN, 1, LFM2_KERNEL, scale=0.3)
            rnd(f"{p}.conv.out_proj.weight", HIDDEN, HIDDEN)
        else:
            a = f"{p}.self_attn"
            rnd(f"{a}.q_proj.weight", HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{a}.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{a}.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{a}.out_proj.weight", HIDDEN, HEADS * HEAD_DIM)
            norm(f"{a}.q_layernorm.weight", HEAD_DIM)
            norm(f"{a}.k_layernorm.weight", HEAD_DIM)
        rnd(f"{p}.feed_forward.w1.weight", INTER, HIDDEN)
        rnd(f"{p}.feed_forward.w3.weight", INTER, HIDDEN)
        rnd(f"{p}.feed_forward.w2.weight", HIDDEN, INTER)
        norm(f"{p}.operator_norm.weight", HIDDEN)
        norm(f"{p}.ffn_norm.weight", HIDDEN)


def granitemoehybrid_tensors(rnd, norm, w):
    """Granite 4: Mamba-2 mixers (convolution `[channels, 1, kernel]`) and
    attention, each followed by a fused shared MLP and experts stored as
    `input_linear` (gate and up halves) and `output_linear`."""
    granite_hybrid_layers(rnd, norm, w, experts=True)


def granitemoehybrid_dense_tensors(rnd, norm, w):
    """Granite 4 without experts: the fused shared MLP alone."""
    granite_hybrid_layers(rnd, norm, w, experts=False)


def mamba2_mixer(rnd, norm, w, m):
    """A Mamba-2 mixer at `m`, its convolution `[channels, 1, kernel]`."""
    inner = MAMBA_HEADS * MAMBA_HEAD_DIM
    conv_dim = inner + 2 * MAMBA_GROUPS * MAMBA_STATE
    rnd(f"{m}.in_proj.weight", inner + conv_dim + MAMBA_HEADS, HIDDEN)
    rnd(f"{m}.conv1d.weight", conv_dim, 1, MAMBA_KERNEL, scale=0.3)
    rnd(f"{m}.conv1d.bias", conv_dim)
    rnd(f"{m}.dt_bias", MAMBA_HEADS, scale=1.0)
    w[f"{m}.A_log"] = mx.random.normal((MAMBA_HEADS,))
    rnd(f"{m}.D", MAMBA_HEADS, scale=1.0)
    norm(f"{m}.norm.weight", inner)
    rnd(f"{m}.out_proj.weight", HIDDEN, inner)


def granite_hybrid_layers(rnd, norm, w, experts):
    for i, kind in enumerate(GRANITE_HYBRID_LAYERS):
        p = f"model.layers.{i}"
        if kind == "mamba":
            m = f"{p}.mamba"
            mamba2_mixer(rnd, norm, w, m)
        else:
            a = f"{p}.self_attn"
            rnd(f"{a}.q_proj.weight", HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{a}.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{a}.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{a}.o_proj.weight", HIDDEN, HEADS * HEAD_DIM)
        if experts:
            moe = f"{p}.block_sparse_moe"
            rnd(f"{moe}.router.layer.weight", EXPERTS, HIDDEN)
            rnd(f"{moe}.input_linear.weight", EXPERTS, 2 * MOE_INTER, HIDDEN)
            rnd(f"{moe}.output_linear.weight", EXPERTS, HIDDEN, MOE_INTER)
        rnd(f"{p}.shared_mlp.input_linear.weight", 2 * MOE_INTER, HIDDEN)
        rnd(f"{p}.shared_mlp.output_linear.weight", HIDDEN, MOE_INTER)
        norm(f"{p}.input_layernorm.weight", HIDDEN)
        norm(f"{p}.post_attention_layernorm.weight", HIDDEN)


def gpt_oss_tensors(rnd, norm, w):
    """GPT-OSS as OpenAI ships it: biased attention with sinks, a biased
    router, and experts in MXFP4 `*_blocks` (bytes `[experts, rows, groups,
    16]`) and `*_scales`, gate and up rows interleaved in `gate_up_proj`."""
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        for proj, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
            rnd(f"{a}.{proj}_proj.weight", heads * HEAD_DIM, HIDDEN)
            rnd(f"{a}.{proj}_proj.bias", heads * HEAD_DIM)
        rnd(f"{a}.o_proj.weight", HIDDEN, HEADS * HEAD_DIM)
        rnd(f"{a}.o_proj.bias", HIDDEN)
        rnd(f"{a}.sinks", HEADS, scale=1.0)
        rnd(f"{p}.mlp.router.weight", EXPERTS, HIDDEN)
        rnd(f"{p}.mlp.router.bias", EXPERTS)
        for name, rows, cols in (("gate_up_proj", 2 * MOE_INTER, HIDDEN), ("down_proj", HIDDEN, MOE_INTER)):
            dense = mx.random.normal((EXPERTS, rows, cols)) * 0.05
            packed, scales = mx.quantize(dense, group_size=32, bits=4, mode="mxfp4")
            w[f"{p}.mlp.experts.{name}_blocks"] = packed.view(mx.uint8).reshape(EXPERTS, rows, cols // 32, 16)
            w[f"{p}.mlp.experts.{name}_scales"] = scales
            rnd(f"{p}.mlp.experts.{name}_bias", EXPERTS, rows)
        norm(f"{p}.input_layernorm.weight", HIDDEN)
        norm(f"{p}.post_attention_layernorm.weight", HIDDEN)


# Nemotron-H's layers: experts, Mamba-2, attention, a ReLU² MLP.
NEMOTRON_H_PATTERN = "EM*-"


def nemotron_h_tensors(rnd, norm, w):
    """Nemotron-H: one mixer per layer under `backbone.layers.{i}.mixer`, the
    Mamba-2 convolution `[channels, 1, kernel]`, experts one by one beside a
    shared expert behind a sigmoid router with a float32 score correction."""
    for i, kind in enumerate(NEMOTRON_H_PATTERN):
        p = f"backbone.layers.{i}"
        m = f"{p}.mixer"
        norm(f"{p}.norm.weight", HIDDEN)
        if kind == "M":
            mamba2_mixer(rnd, norm, w, m)
        elif kind == "*":
            rnd(f"{m}.q_proj.weight", HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{m}.k_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{m}.v_proj.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            rnd(f"{m}.o_proj.weight", HIDDEN, HEADS * HEAD_DIM)
        elif kind == "-":
            rnd(f"{m}.up_proj.weight", INTER, HIDDEN)
            rnd(f"{m}.down_proj.weight", HIDDEN, INTER)
        else:
            rnd(f"{m}.gate.weight", EXPERTS, HIDDEN)
            w[f"{m}.gate.e_score_correction_bias"] = mx.random.normal((EXPERTS,)) * 0.1
            for e in range(EXPERTS):
                rnd(f"{m}.experts.{e}.up_proj.weight", MOE_INTER, HIDDEN)
                rnd(f"{m}.experts.{e}.down_proj.weight", HIDDEN, MOE_INTER)
            rnd(f"{m}.shared_experts.up_proj.weight", MOE_INTER, HIDDEN)
            rnd(f"{m}.shared_experts.down_proj.weight", HIDDEN, MOE_INTER)
    rnd("mtp.layers.0.mixer.up_proj.weight", INTER, HIDDEN)


# Families whose layers the generic spec does not describe.
OWN_LAYERS = {
    "lfm2": lfm2_tensors,
    "granitemoehybrid": granitemoehybrid_tensors,
    "granitemoehybrid_dense": granitemoehybrid_dense_tensors,
    "gpt_oss": gpt_oss_tensors,
    "glm4_moe": glm4_moe_tensors,
    "glm4_moe_fp8": glm4_moe_tensors,
    "deepseek_v3": deepseek_v3_tensors,
    "kimi_k2": deepseek_v3_tensors,
    "deepseek_v3_fp8": lambda rnd, norm, w: deepseek_v3_tensors(rnd, norm, w, inter=FP8_INTER),
    "nemotron_h": nemotron_h_tensors,
}


def own_tensors(family, spec):
    dt = getattr(mx, spec["dtype"])
    w = {}

    def rnd(name, *shape, scale=0.05):
        w[name] = (mx.random.normal(shape) * scale).astype(dt)

    def norm(name, size):
        w[name] = (1 + mx.random.normal((size,)) * 0.1).astype(dt)

    rnd(EMBEDDINGS.get(family, "model.embed_tokens.weight"), VOCAB, HIDDEN, scale=0.5)
    OWN_LAYERS[family](rnd, norm, w)
    norm(FINAL_NORMS.get(family, "model.norm.weight"), HIDDEN)
    if not spec["tied"] or spec["extra_head"]:
        rnd("lm_head.weight", VOCAB, HIDDEN)
    return w


FINAL_NORMS = {"lfm2": "model.embedding_norm.weight", "nemotron_h": "backbone.norm_f.weight"}
EMBEDDINGS = {"nemotron_h": "backbone.embeddings.weight"}


def delta_net(rnd, norm, prefix, split_in_proj):
    """A gated DeltaNet as Hugging Face's Qwen3-Next (or, split_in_proj, Qwen3.5) stores it."""
    key_dim, value_dim = LIN_K_HEADS * LIN_HEAD_DIM, LIN_V_HEADS * LIN_HEAD_DIM
    if split_in_proj:
        rnd(f"{prefix}.in_proj_qkv.weight", 2 * key_dim + value_dim, HIDDEN)
        rnd(f"{prefix}.in_proj_z.weight", value_dim, HIDDEN)
        rnd(f"{prefix}.in_proj_b.weight", LIN_V_HEADS, HIDDEN)
        rnd(f"{prefix}.in_proj_a.weight", LIN_V_HEADS, HIDDEN)
    else:
        rnd(f"{prefix}.in_proj_qkvz.weight", 2 * key_dim + 2 * value_dim, HIDDEN)
        rnd(f"{prefix}.in_proj_ba.weight", 2 * LIN_V_HEADS, HIDDEN)
    rnd(f"{prefix}.conv1d.weight", 2 * key_dim + value_dim, 1, CONV_KERNEL, scale=0.3)
    rnd(f"{prefix}.dt_bias", LIN_V_HEADS, scale=1.0)
    # kept in float32 (mlx-lm casts it for qwen3_next, not for qwen3_5)
    rnd(f"{prefix}.A_log", LIN_V_HEADS, scale=1.0, dtype=mx.float32)
    norm(f"{prefix}.norm.weight", LIN_HEAD_DIM)
    rnd(f"{prefix}.out_proj.weight", HIDDEN, value_dim)


HYBRID_TEXT = dict(
    full_attention_interval=4, linear_num_key_heads=LIN_K_HEADS, linear_num_value_heads=LIN_V_HEADS,
    linear_key_head_dim=LIN_HEAD_DIM, linear_value_head_dim=LIN_HEAD_DIM, linear_conv_kernel_dim=CONV_KERNEL,
    rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1], "mrope_interleaved": True,
    },
)


def nest_text_config(family, c):
    """Qwen3.5's layout: the decoder's fields in text_config."""
    top = ("architectures", "model_type", "tie_word_embeddings", "_name_or_path")
    text = {k: v for k, v in c.items() if k not in top}
    text["model_type"] = f"{family}_text"
    text["dtype"] = text.pop("torch_dtype")
    return {**{k: c[k] for k in top}, "text_config": text}


def nest_mistral3(c, spec):
    """Mistral 3's layout: the decoder's fields in text_config (tied only when
    it says so), the wrapper's own fields and quantization at the top."""
    top = ("architectures", "_name_or_path", "torch_dtype", "quantization_config")
    text = {k: v for k, v in c.items() if k not in top + ("tie_word_embeddings",)}
    if spec["tied"]:
        text["tie_word_embeddings"] = True
    vision = dict(model_type="pixtral", hidden_size=16, num_hidden_layers=1, patch_size=4, image_size=16)
    wrapper = dict(
        model_type="mistral3", image_token_index=10, projector_hidden_act="gelu", spatial_merge_size=2,
        vision_feature_layer=-1, multimodal_projector_bias=False, vision_config=vision,
    )
    return {**{k: c[k] for k in top if k in c}, **wrapper, "text_config": text}


def wrap_mistral3(w, layout):
    """The text model's tensors renamed into the wrapper, with a vision tower
    and projector beside them (zeros: they draw no random numbers)."""
    if layout == "hf":
        out = {(f"model.language_model.{k[6:]}" if k.startswith("model.") else k): v for k, v in w.items()}
        vision = "model.vision_tower.", "model.multi_modal_projector."
    else:
        out = {f"language_model.{k}": v for k, v in w.items()}
        vision = "vision_tower.", "multi_modal_projector."
    out[vision[0] + "patch_conv.weight"] = mx.zeros((16, 3, 4, 4), dtype=mx.bfloat16)
    out[vision[1] + "linear_1.weight"] = mx.zeros((HIDDEN, 16), dtype=mx.bfloat16)
    return out


def config(family, spec):
    c = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": spec.get("model_type", family),
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
            "ministral3": MINISTRAL3,
            "mistral3": MINISTRAL3,
            "mistral3_fp8": dict(
                MINISTRAL3,
                quantization_config={
                    "activation_scheme": "static", "dequantize": False,
                    "modules_to_not_convert": ["model.vision_tower", "model.multi_modal_projector", "lm_head"],
                    "quant_method": "fp8", "weight_block_size": None,
                },
            ),
            "ministral3_fp8": dict(
                MINISTRAL3,
                quantization_config={
                    "activation_scheme": "static", "dequantize": False, "modules_to_not_convert": ["lm_head"],
                    "quant_method": "fp8", "weight_block_size": None,
                },
            ),
            "phi3": dict(rope_scaling=None),
            "llama4_text": dict(intermediate_size_mlp=INTER, no_rope_layers=[1, 1, 1, 0], use_qk_norm=True),
            "mixtral": dict(num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, sliding_window=None),
            "qwen3_moe": dict(
                num_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_INTER,
                decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, attention_bias=False,
            ),
            "glm4_moe": GLM4_MOE,
            "deepseek_v3": DEEPSEEK_V3,
            "granitemoehybrid": dict(GRANITE_HYBRID, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K),
            "granitemoehybrid_dense": dict(GRANITE_HYBRID, num_local_experts=0),
            "gpt_oss": dict(
                intermediate_size=MOE_INTER, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, sliding_window=64,
                rope_theta=150000.0, rope_scaling=None, layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2),
                quantization_config={
                    "quant_method": "mxfp4",
                    "modules_to_not_convert": [
                        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
                    ],
                },
            ),
            "lfm2": dict(
                layer_types=LFM2_LAYERS, norm_eps=1e-5, conv_bias=False, conv_L_cache=LFM2_KERNEL, block_dim=HIDDEN,
                block_ff_dim=INTER, block_multiple_of=256, block_ffn_dim_multiplier=1.0,
                block_auto_adjust_ff_dim=False, tie_embedding=True,
            ),
            "kimi_k2": DEEPSEEK_V3,
            "deepseek_v3_fp8": dict(DEEPSEEK_V3, intermediate_size=FP8_INTER, quantization_config=FP8_BLOCKS),
            "qwen3_fp8": dict(quantization_config=FP8_BLOCKS),
            "glm4_moe_fp8": dict(GLM4_MOE, quantization_config=FP8_BLOCKS),
            "nemotron_h": dict(
                hybrid_override_pattern=NEMOTRON_H_PATTERN, attention_bias=False, mlp_bias=False,
                use_bias=False, mamba_num_heads=MAMBA_HEADS, mamba_head_dim=MAMBA_HEAD_DIM,
                mamba_proj_bias=False, ssm_state_size=MAMBA_STATE, conv_kernel=MAMBA_KERNEL,
                n_groups=MAMBA_GROUPS, use_conv_bias=True, layer_norm_epsilon=1e-5,
                n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_INTER,
                n_shared_experts=1, moe_shared_expert_intermediate_size=MOE_INTER, n_group=2,
                topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                num_nextn_predict_layers=1,
            ),
            "qwen3_5": HYBRID_TEXT,
            "qwen3_5_moe": dict(
                HYBRID_TEXT, num_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_INTER,
                shared_expert_intermediate_size=MOE_INTER,
            ),
            "qwen3_next": dict(
                num_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_INTER,
                shared_expert_intermediate_size=MOE_INTER, decoder_sparse_step=1, mlp_only_layers=[],
                norm_topk_prob=True, full_attention_interval=4, partial_rotary_factor=0.25,
                linear_num_key_heads=LIN_K_HEADS, linear_num_value_heads=LIN_V_HEADS,
                linear_key_head_dim=LIN_HEAD_DIM, linear_value_head_dim=LIN_HEAD_DIM,
                linear_conv_kernel_dim=CONV_KERNEL,
            ),
        }.get(family, {})
    )
    if spec["mistral3"]:
        return nest_mistral3(c, spec)
    return nest_text_config(family, c) if spec["nested"] else c


def write(out, family, spec, tokenizer_dir):
    w = own_tensors(family, spec) if family in OWN_LAYERS else tensors(spec)
    c = config(family, spec)
    wrap = (lambda w: wrap_mistral3(w, spec["mistral3"])) if spec["mistral3"] else (lambda w: w)
    plain = {k: v for k, v in c.items() if k != "quantization_config"}
    if spec["fp8"] == "block":
        w = to_fp8_blocks(w)
        if family not in MLX_LM_READS_FP8:
            save(out / f"{family}_dequantized", wrap(block_dequantized(w)), plain, False, tokenizer_dir)
    elif spec["fp8"]:
        w = to_fp8(w)
        save(out / f"{family}_dequantized", wrap(dequantized(w)), plain, False, tokenizer_dir)
    save(out / family, wrap(w), c, spec["fp8"], tokenizer_dir)


def dequantized(w):
    """The float weights an fp8 checkpoint holds: e4m3 values (in bfloat16)
    times their weight_scale_inv, without the scales."""
    out = {k: v for k, v in w.items() if not k.endswith(("_scale_inv", "activation_scale"))}
    for k, scale in w.items():
        if k.endswith("weight_scale_inv"):
            base = k[: -len("_scale_inv")]
            out[base] = mx.from_fp8(w[base], dtype=mx.bfloat16) * scale
    return out


# Block-scaled fp8 checkpoints whose families mlx-lm's sanitize dequantizes.
MLX_LM_READS_FP8 = {"deepseek_v3_fp8"}


def block_dequantized(w):
    """The float weights a block-scaled fp8 checkpoint holds: e4m3 values (in
    bfloat16) times their block's scale, rounded to bfloat16."""
    out = {k: v for k, v in w.items() if not k.endswith("_scale_inv")}
    for k, scale in w.items():
        if k.endswith("weight_scale_inv"):
            base = k[: -len("_scale_inv")]
            rows, cols = w[base].shape
            per_weight = mx.repeat(mx.repeat(scale, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:rows, :cols]
            out[base] = (mx.from_fp8(w[base], dtype=mx.bfloat16) * per_weight).astype(mx.bfloat16)
    return out


def save(d, w, c, fp8, tokenizer_dir):
    d.mkdir(parents=True, exist_ok=False)
    names = sorted(w)
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    weight_map = {}
    total = 0
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(d / fname), {k: w[k] for k in part}, metadata={"format": "pt"})
        if fp8:
            mark_fp8(d / fname)
        for k in part:
            weight_map[k] = fname
            total += w[k].nbytes
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (d / "config.json").write_text(json.dumps(c, indent=2))
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
