#!/usr/bin/env python3
"""Tiny random models of each supported architecture, built with mlx-lm's
own model classes, with the logits mlx-lm computes for them.

For each case it writes goldens/arch/<case>/: config.json, model.safetensors
(random weights, seeded) and expected.safetensors holding the logits of a
12-token input run (a) in one pass and (b) as an 8-token prefill followed by
4 single-token steps through mlx-lm's KV cache.

    python scripts/oracle/make_arch_goldens.py --out goldens/arch
"""
import argparse
import copy
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes

BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}

GEMMA2 = {
    "model_type": "gemma2",
    "head_dim": 16,
    "query_pre_attn_scalar": 24.0,
    "attn_logit_softcapping": 4.0,
    "final_logit_softcapping": 3.0,
}
# Layers 0 and 2 slide over 5 positions with the local RoPE base, layer 1 is
# global with linear RoPE scaling.
GEMMA3 = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 3,
    "head_dim": 16,
    "query_pre_attn_scalar": 24.0,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "sliding_window": 5,
    "sliding_window_pattern": 2,
}

# Partial rotary (12 of 16 dims) with longrope factors; 512 / 64 positions
# gives the attention factor sqrt(1 + ln 8 / ln 64).
PHI3 = {
    "model_type": "phi3",
    "tie_word_embeddings": False,
    "partial_rotary_factor": 0.75,
    "max_position_embeddings": 512,
    "original_max_position_embeddings": 64,
    "rope_scaling": {
        "type": "longrope",
        "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0],
        "short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    },
}

# Layers 0 and 2 sparse (8 experts, top 6: the one-pass run has 72
# token-expert pairs, so it takes SwitchGLU's sorted path), layer 1 dense.
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 3,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "num_experts": 8,
    "num_experts_per_tok": 6,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
}
MIXTRAL = {
    "model_type": "mixtral",
    "tie_word_embeddings": False,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
# mlx-lm 0.32.2 cannot run quantized experts on MLX 0.32.2's CPU build (it
# passes gather_qmm an argument MLX rejects), so for these the expected
# logits are mlx-lm's on the dequantized weights: the same numbers the 4-bit
# model computes, up to quantized-kernel rounding.
Q4_MOE = {"group_size": 32, "bits": 4, "dense_reference": True}
# The router quantized as mlx-lm's qwen3_moe `quant_predicate` asks (8 bits,
# group 64), written as per-layer overrides in config.json.
ROUTER_8BIT = {"mlp.gate": {"group_size": 64, "bits": 8}}

# Layer 1 of 2 without RoPE.
SMOLLM3 = {"model_type": "smollm3", "no_rope_layer_interval": 2}
GRANITE = {
    "model_type": "granite",
    "attention_multiplier": 0.2,
    "embedding_multiplier": 3.0,
    "residual_multiplier": 0.5,
    "logits_scaling": 4.0,
    "attention_bias": False,
    "mlp_bias": False,
}
# As mlx-lm's granite `quant_predicate`: o_proj and down_proj at 8 bits.
GRANITE_8BIT = {"self_attn.o_proj": {"group_size": 64, "bits": 8}, "mlp.down_proj": {"group_size": 64, "bits": 8}}

# Sliding (window 5) and global layers alternating, 4 experts with biases,
# attention sinks; YaRN scaling as the released checkpoints use.
GPT_OSS = {
    "model_type": "gpt_oss",
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 5,
    "tie_word_embeddings": False,
    "rope_theta": 150000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 64,
        "truncate": False,
    },
}

# Biases on q/k/v, on o_proj and on the MLP; head_dim 32 (wider than
# hidden / heads).
SEED_OSS = {
    "model_type": "seed_oss",
    "head_dim": 32,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "attention_out_bias": True,
    "mlp_bias": True,
}

# Layer 0 with traditional RoPE, layer 1 without; unscaled q/k norms; the
# MLP at intermediate_size_mlp; an untied `output` head.
LLAMA4_TEXT = {
    "model_type": "llama4_text",
    "head_dim": 16,
    "intermediate_size_mlp": 96,
    "no_rope_layers": [1, 0],
    "use_qk_norm": True,
    "tie_word_embeddings": False,
}

# Layer 0 dense, layers 1-2 sparse: 8 experts in 4 groups of 2, the best 3
# groups kept, top 6 (72 token-expert pairs: SwitchGLU's sorted path), one
# shared expert; q/k/v biases, q/k norms, half the head rotated.
GLM4_MOE = {
    "model_type": "glm4_moe",
    "num_hidden_layers": 3,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "use_qk_norm": True,
    "partial_rotary_factor": 0.5,
    "rope_scaling": None,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 3,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}

# Multi-head latent attention: queries through a rank-32 bottleneck
# (q_lora_rank), keys and values from a rank-32 latent plus a 32-dim shared
# rotary key (whole groups of 32: a quantized KV cache can hold both); YaRN
# (mscale != mscale_all_dim, so both the rope's factor and the softmax
# scale's change). Layer 0 dense, layers 1-2 sparse: 8 experts in 2 groups
# of 4, the best group kept, top 3, one shared expert.
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
    },
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 3,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
}
# Plain q_proj (q_lora_rank null), no RoPE scaling, attention biases, every
# second layer sparse (moe_layer_freq 2, first_k_dense_replace 0: layers 0
# and 2), 4 experts in one group, top 2 not renormalized.
DEEPSEEK_V3_PLAIN_Q = {
    **DEEPSEEK_V3,
    "q_lora_rank": None,
    "rope_scaling": None,
    "attention_bias": True,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 2,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": False,
}

# Post-norm layers, q/k norms over all heads at once; layers 0 and 2 slide
# over 5 positions with plain RoPE, layer 1 is global with YaRN.
OLMO3 = {
    "model_type": "olmo3",
    "num_hidden_layers": 3,
    "tie_word_embeddings": False,
    "sliding_window": 5,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 8.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 64,
        "attention_factor": 1.2,
    },
}

# Post-norm layers, per-head q/k norms; "LLG" repeated over 4 layers: local
# layers slide over 5 positions with llama3-scaled RoPE, layer 2 is global
# without positional encoding.
EXAONE4 = {
    "model_type": "exaone4",
    "num_hidden_layers": 4,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "sliding_window": 5,
    "sliding_window_pattern": "LLG",
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}

# Layer 0 slides over 5 positions, layer 1 is global; YaRN from
# rope_parameters (whose rope_theta wins over the top-level one); queries
# scaled by 1 + 0.5 ln(1 + floor(pos / 4)).
MINISTRAL3 = {
    "model_type": "ministral3",
    "tie_word_embeddings": False,
    "sliding_window": 5,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 16.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4,
        "rope_theta": 1000000.0,
        "llama_4_scaling_beta": 0.5,
    },
}

# Hybrid layers: 0 and 2 gated DeltaNet (2 key heads, 4 value heads,
# convolution kernel 4), 1 full attention with an output gate, q/k norms and
# half the head rotated. Qwen3-Next: layers 0 and 2 sparse (4 experts, top 2,
# renormalized, gated shared expert), layer 1 dense (`mlp_only_layers`).
HYBRID = {
    "num_hidden_layers": 3,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "full_attention_interval": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}
QWEN3_NEXT = {
    **HYBRID,
    "model_type": "qwen3_next",
    "partial_rotary_factor": 0.5,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "norm_topk_prob": True,
}
# The router and shared-expert gate at 8 bits, as mlx-lm's quant_predicate.
HYBRID_8BIT = {
    "mlp.gate": {"group_size": 64, "bits": 8},
    "shared_expert_gate": {"group_size": 64, "bits": 8},
}
# Qwen3.5 nests the decoder in text_config (written nested: "nest") and
# takes RoPE from rope_parameters; layer_types agrees with the interval.
QWEN3_5 = {
    **HYBRID,
    "model_type": "qwen3_5",
    "nest": True,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "rope_parameters": {
        "type": "default",
        "mrope_section": [2, 2, 0],
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
    },
}
# Every layer sparse; top-k weights renormalized by default.
QWEN3_5_MOE = {
    **QWEN3_5,
    "model_type": "qwen3_5_moe",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}

# NVIDIA Nemotron-H: one kind of layer per character of
# hybrid_override_pattern: an MLP layer first (before any cache-keeping
# layer), Mamba-2 (4 heads of 16, 2 groups, state 16, kernel 4, conv bias),
# attention without RoPE (head_dim 32 over 4 heads, 2 KV heads), two MLP
# layers, Mamba-2 again: three caches for six layers. The 4-bit case names
# its layers with layers_block_type words, gives every projection a bias and
# clips the step sizes (time_step_limit).
NEMOTRON_H = {
    "model_type": "nemotron_h",
    "hybrid_override_pattern": "-M*--M",
    "head_dim": 32,
    "attention_bias": False,
    "mlp_bias": False,
    "use_bias": False,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "mamba_proj_bias": False,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "n_groups": 2,
    "use_conv_bias": True,
    "layer_norm_epsilon": 1e-5,
}
NEMOTRON_H_Q4 = {
    **NEMOTRON_H,
    "hybrid_override_pattern": None,
    "layers_block_type": ["mamba", "mlp", "attention", "mamba", "mlp"],
    "attention_bias": True,
    "mlp_bias": True,
    "mamba_proj_bias": True,
    "time_step_limit": [0.05, 2.0],
    "quantize": {"group_size": 32, "bits": 4},
}
# Nemotron-H mixture-of-experts layers (E): an experts layer first (before
# any cache-keeping layer), Mamba-2, attention, an MLP layer, experts again.
# 8 ReLU² experts of width 32 in 4 groups, the best 2 groups kept, top 6 (72
# token-expert pairs in the one-pass run: SwitchMLP's sorted path), weights
# renormalized and scaled by 2.5, one shared expert. The latent case runs its
# experts in a 32-wide latent space (fc1/fc2_latent_proj, with biases) over
# one group, top 2, unnormalized, without shared experts.
NEMOTRON_H_MOE = {
    **NEMOTRON_H,
    "hybrid_override_pattern": "EM*-E",
    "n_routed_experts": 8,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 32,
    "n_group": 4,
    "topk_group": 2,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}
NEMOTRON_H_MOE_LATENT = {
    **{k: v for k, v in NEMOTRON_H_MOE.items() if "shared_expert" not in k},
    "hybrid_override_pattern": "ME*E",
    "mlp_bias": True,
    "moe_latent_size": 32,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.5,
}

# IBM Granite 4 (granitemoehybrid): Mamba-2 (4 heads of 16 in 2 groups,
# state 16, kernel 4, conv bias; the gated norm over all 64 channels) and
# attention without RoPE (position_embedding_type nope) alternating, each
# followed by 4 experts of width 32 (top 2) beside a shared MLP of 64;
# Granite's four multipliers. The 4-bit case quantizes it (the router at 8
# bits, as mlx-lm's quant_predicate). The dense case is the dense-MLP variant
# (no num_local_experts) with RoPE, biases on attention and the Mamba-2
# projections, untied embeddings and a step-size clip (time_step_limit).
GRANITEMOEHYBRID = {
    "model_type": "granitemoehybrid",
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "attention", "mamba", "attention"],
    "intermediate_size": 32,
    "attention_multiplier": 0.2,
    "embedding_multiplier": 3.0,
    "residual_multiplier": 0.5,
    "logits_scaling": 4.0,
    "attention_bias": False,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "shared_intermediate_size": 64,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_proj_bias": False,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_n_groups": 2,
    "mamba_conv_bias": True,
    "position_embedding_type": "nope",
}
GRANITEMOEHYBRID_DENSE = {
    **GRANITEMOEHYBRID,
    "layer_types": ["attention", "mamba", "mamba", "attention"],
    "intermediate_size": 96,
    "num_local_experts": None,
    "num_experts_per_tok": None,
    "shared_intermediate_size": None,
    "position_embedding_type": "rope",
    "attention_bias": True,
    "mamba_proj_bias": True,
    "tie_word_embeddings": False,
    "time_step_limit": [0.05, 2.0],
}

# Liquid LFM2: layers 0 and 2 short causal convolutions (kernel 3), 1 and 3
# full attention with per-head q/k norms. The feed-forward width follows
# block_auto_adjust_ff_dim: 2/3 of block_ff_dim, times the multiplier, up to a
# multiple of block_multiple_of (160 -> 106 -> 159 -> 160). The norms take
# norm_eps; rope_parameters' rope_theta wins over the top-level one. The
# 4-bit case also gives the convolution layers biases (conv_bias).
LFM2 = {
    "model_type": "lfm2",
    "num_hidden_layers": 4,
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    "norm_eps": 1e-4,
    "conv_bias": False,
    "conv_L_cache": 3,
    "block_dim": 64,
    "block_ff_dim": 160,
    "block_multiple_of": 32,
    "block_ffn_dim_multiplier": 1.5,
    "block_auto_adjust_ff_dim": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}

# Gemma 4 (text): layers 0 and 2 slide over 5 positions (head_dim 16, 2 KV
# heads, default RoPE), 1 and 3 are global (global_head_dim 32, one KV head
# whose keys are also the values: attention_k_eq_v, proportional RoPE on a
# quarter of the dims). Layers 2 and 3 reuse the keys and values of layers 0
# and 1 (num_kv_shared_layers) and have double-wide MLPs; per-layer input
# embeddings, the MoE block beside the dense MLP and a small logit cap.
GEMMA4 = {
    "model_type": "gemma4_text",
    "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 32,
    "vocab_size_per_layer_input": 256,
    "use_double_wide_mlp": True,
    "enable_moe_block": True,
    "num_experts": 4,
    "top_k_experts": 2,
    "moe_intermediate_size": 32,
    "sliding_window": 5,
    "sliding_window_pattern": 2,
    "final_logit_softcapping": 3.0,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
}
# The multimodal wrapper's layout (model_type gemma4, the decoder in
# text_config, tensors under language_model.), with the plain variants:
# separate values, no KV sharing, no per-layer inputs or experts, an untied
# head. The wrapper takes vocab_size from the top level ("nest" lists the
# keys kept there too).
GEMMA4_NESTED = {
    **GEMMA4,
    "model_type": "gemma4",
    "nest": ["vocab_size"],
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "enable_moe_block": False,
    "tie_word_embeddings": False,
}

# The Mistral 3 wrapper (model_type mistral3) as mlx-community publishes it:
# the decoder in text_config (its own model_type picks Ministral 3 or LLaMA),
# tensors under language_model., plus vision tensors mlx-lm's sanitize drops
# ("vision"). The Ministral 3 one leaves tie_word_embeddings out of
# text_config ("drop"), which the wrapper reads as untied.
MISTRAL3 = {
    **MINISTRAL3,
    "model_type": "mistral3",
    "nest": True,
    "text_model_type": "ministral3",
    "drop": ["tie_word_embeddings"],
    "vision": True,
}
MISTRAL3_LLAMA = {
    "model_type": "mistral3",
    "nest": True,
    "text_model_type": "mistral",
    "vision": True,
}

CASES = {
    "llama": {"model_type": "llama"},
    "llama3_rope": {
        "model_type": "llama",
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "llama_sliding": {
        "model_type": "llama",
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 5,
    },
    "mistral": {"model_type": "mistral", "tie_word_embeddings": False, "sliding_window": 4096},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": False},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "llama_q4": {"model_type": "llama", "quantize": {"group_size": 32, "bits": 4}},
    # Small caps so the random logits reach the tanh's curve.
    "gemma2": {**GEMMA2},
    "gemma2_q4": {**GEMMA2, "quantize": {"group_size": 32, "bits": 4}},
    "gemma3_text": {**GEMMA3},
    "gemma3_text_q4": {**GEMMA3, "quantize": {"group_size": 32, "bits": 4}},
    "phi3": {**PHI3},
    "phi3_q4": {**PHI3, "quantize": {"group_size": 32, "bits": 4}},
    "qwen3_moe": {**QWEN3_MOE},
    "qwen3_moe_q4": {**QWEN3_MOE, "quantize": {**Q4_MOE, "overrides": ROUTER_8BIT}},
    "mixtral": {**MIXTRAL},
    "mixtral_q4": {**MIXTRAL, "quantize": Q4_MOE},
    "smollm3": {**SMOLLM3},
    "smollm3_q4": {**SMOLLM3, "quantize": {"group_size": 32, "bits": 4}},
    "granite": {**GRANITE},
    "granite_q4": {**GRANITE, "quantize": {"group_size": 32, "bits": 4, "overrides": GRANITE_8BIT}},
    "gpt_oss": {**GPT_OSS},
    "gpt_oss_q4": {**GPT_OSS, "quantize": {**Q4_MOE, "overrides": {"mlp.router": {"group_size": 64, "bits": 8}}}},
    "seed_oss": {**SEED_OSS},
    "seed_oss_q4": {**SEED_OSS, "quantize": {"group_size": 32, "bits": 4}},
    "llama4_text": {**LLAMA4_TEXT},
    "llama4_text_q4": {**LLAMA4_TEXT, "quantize": {"group_size": 32, "bits": 4}},
    "glm4_moe": {**GLM4_MOE},
    "glm4_moe_q4": {**GLM4_MOE, "quantize": Q4_MOE},
    "deepseek_v3": {**DEEPSEEK_V3},
    "deepseek_v3_q4": {**DEEPSEEK_V3, "quantize": Q4_MOE},
    "deepseek_v3_plain_q": {**DEEPSEEK_V3_PLAIN_Q},
    "olmo3": {**OLMO3},
    "olmo3_q4": {**OLMO3, "quantize": {"group_size": 32, "bits": 4}},
    "exaone4": {**EXAONE4},
    "exaone4_q4": {**EXAONE4, "quantize": {"group_size": 32, "bits": 4}},
    "ministral3": {**MINISTRAL3},
    "ministral3_q4": {**MINISTRAL3, "quantize": {"group_size": 32, "bits": 4}},
    "qwen3_next": {**QWEN3_NEXT},
    "qwen3_next_q4": {**QWEN3_NEXT, "quantize": {**Q4_MOE, "overrides": HYBRID_8BIT}},
    "qwen3_5": {**QWEN3_5},
    "qwen3_5_q4": {**QWEN3_5, "quantize": {"group_size": 32, "bits": 4}},
    "qwen3_5_moe": {**QWEN3_5_MOE},
    "qwen3_5_moe_q4": {**QWEN3_5_MOE, "quantize": {**Q4_MOE, "overrides": HYBRID_8BIT}},
    "lfm2": {**LFM2},
    "lfm2_q4": {**LFM2, "conv_bias": True, "quantize": {"group_size": 32, "bits": 4}},
    "nemotron_h": {**NEMOTRON_H},
    "nemotron_h_q4": {**NEMOTRON_H_Q4},
    "nemotron_h_moe": {**NEMOTRON_H_MOE},
    "nemotron_h_moe_latent": {**NEMOTRON_H_MOE_LATENT},
    # As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "nemotron_h_moe_q4": {**NEMOTRON_H_MOE, "quantize": Q4_MOE},
    "gemma4_text": {**GEMMA4},
    # As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "gemma4_text_q4": {**GEMMA4, "quantize": {**Q4_MOE, "overrides": {"router.proj": {"group_size": 64, "bits": 8}}}},
    "gemma4": {**GEMMA4_NESTED},
    "granitemoehybrid": {**GRANITEMOEHYBRID},
    # As the MoE cases above: mlx-lm's dense run of the dequantized weights.
    "granitemoehybrid_q4": {**GRANITEMOEHYBRID, "quantize": {**Q4_MOE, "overrides": {"router.layer": {"group_size": 64, "bits": 8}}}},
    "granitemoehybrid_dense": {**GRANITEMOEHYBRID_DENSE},
    "mistral3": {**MISTRAL3},
    "mistral3_llama": {**MISTRAL3_LLAMA},
    # A per-layer override, written under the wrapper's language_model. path.
    "mistral3_q4": {**MISTRAL3, "quantize": {"group_size": 32, "bits": 4, "overrides": {"mlp.down_proj": {"group_size": 64, "bits": 8}}}},
}


def quantize(model, config, quant):
    """nn.quantize with per-layer overrides (module path suffix -> spec),
    recorded in config.json as mlx-lm writes them."""
    overrides = quant.get("overrides", {})
    q_config = {"group_size": quant["group_size"], "bits": quant["bits"]}

    def predicate(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        for suffix, spec in overrides.items():
            if path.endswith(suffix):
                q_config[path] = dict(spec)
                return dict(spec)
        return True

    nn.quantize(model, group_size=quant["group_size"], bits=quant["bits"], class_predicate=predicate)
    config["quantization"] = q_config


def dequantized(model_class, args_class, config, model):
    """A dense model of the same class holding `model`'s dequantized weights."""
    q = config["quantization"]
    flat = dict(tree_flatten(model.parameters()))
    dense = {}
    for k, v in flat.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        prefix = k[: -len(".weight")]
        if k.endswith(".weight") and prefix + ".scales" in flat:
            spec = q.get(prefix, q)
            v = mx.dequantize(v, flat[prefix + ".scales"], flat[prefix + ".biases"], spec["group_size"], spec["bits"])
        dense[k] = v
    ref = model_class(args_class.from_dict(config))
    ref.load_weights(list(dense.items()))
    mx.eval(ref.parameters())
    return ref

TOKENS = [1, 17, 42, 99, 3, 250, 7, 7, 128, 64, 5, 200]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="goldens/arch")
    ap.add_argument("--only", nargs="*", help="cases to (re)write; default all")
    a = ap.parse_args()
    for name, extra in CASES.items():
        if a.only and name not in a.only:
            continue
        extra = dict(extra)
        quant = extra.pop("quantize", None)
        config = {**BASE, **extra}
        for key in config.pop("drop", []):
            del config[key]
        vision = config.pop("vision", False)
        text_type = config.pop("text_model_type", None)
        nest = config.pop("nest", False)
        if nest:
            kept = {k: config[k] for k in nest} if isinstance(nest, list) else {}
            config = {"model_type": config["model_type"], **kept, "text_config": config}
            if text_type:
                config["text_config"]["model_type"] = text_type
        mx.random.seed(7)
        model_class, args_class = _get_classes(config)
        # mistral3's arguments fill defaults into text_config in place: build
        # from a copy so config.json stays as written.
        model = model_class(args_class.from_dict(copy.deepcopy(config) if text_type else config))
        # Random norms and biases too, so every parameter matters.
        params = tree_flatten(model.parameters())
        model.load_weights(
            [(k, mx.random.normal(v.shape) * (0.5 if v.ndim > 1 else 0.2) + (1.0 if "norm" in k else 0.0)) for k, v in params]
        )
        if quant:
            quantize(model, config, quant)
        mx.eval(model.parameters())
        out = Path(a.out) / name
        out.mkdir(parents=True, exist_ok=True)
        weights = dict(tree_flatten(model.parameters()))
        if vision:
            weights["vision_tower.patch_conv.weight"] = mx.random.normal((8, 3, 4, 4))
            weights["multi_modal_projector.linear_1.weight"] = mx.random.normal((16, 8))
        mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

        run = model
        if quant and quant.get("dense_reference"):
            run = dequantized(model_class, args_class, config, model)
        ids = mx.array(TOKENS)[None]
        full = run(ids)
        cache = make_prompt_cache(run)
        steps = [run(ids[:, :8], cache=cache)[:, -1:, :]]
        for i in range(8, len(TOKENS)):
            steps.append(run(ids[:, i : i + 1], cache=cache))
        incremental = mx.concatenate(steps, axis=1)
        mx.save_safetensors(
            str(out / "expected.safetensors"),
            {"tokens": mx.array(TOKENS, dtype=mx.int32), "full": full[0], "incremental": incremental[0]},
        )
        print(name, "ok", full.shape)


if __name__ == "__main__":
    main()
