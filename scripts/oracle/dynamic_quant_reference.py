"""The oracle for `mlx-bun convert --target-bpw`: mlx-lm's own dynamic
quantization (`mlx_lm.quant.dynamic_quant.main`) run on local calibration
text, and mlx-lm loading a converted folder.

mlx-lm's `load_data` reads `~/.cache/mlx-lm/calibration_v5.txt` (downloading
it when missing); here HOME points at a temporary folder holding the given
text under that name, so its own code reads the same text we use.

Usage:
  python dynamic_quant_reference.py make OUT_DIR TOKENIZER_DIR
      a tiny random float32 llama checkpoint (Hugging Face names) with the
      tokenizer of TOKENIZER_DIR and its full vocabulary
  python dynamic_quant_reference.py run MODEL TEXT OUT_DIR SENSITIVITIES_JSON [flags...]
      mlx_lm.dynamic_quant's steps (its functions) on TEXT; flags: dynamic_quant's
      --target-bpw --low-bits --low-group-size --high-bits --high-group-size --seed,
      plus --num-samples and --sequence-length (load_data's arguments) and
      --sensitivities FILE (read instead of estimated, as dynamic_quant's flag);
      prints the threshold, bits per weight and perplexities as JSON
  python dynamic_quant_reference.py load MODEL
      loads MODEL with mlx-lm, prints {"tokens": [...], "bits": {layer: bits}} as JSON
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx


def make(out, tokenizer_dir):
    hidden, inter, layers, heads, kv_heads, head_dim, vocab = 128, 256, 2, 4, 2, 32, 49152
    mx.random.seed(11)
    w = {}

    def rnd(name, *shape, scale=0.08):
        w[name] = mx.random.normal(shape) * scale

    rnd("model.embed_tokens.weight", vocab, hidden, scale=0.05)
    for i in range(layers):
        p = f"model.layers.{i}"
        rnd(f"{p}.self_attn.q_proj.weight", heads * head_dim, hidden)
        rnd(f"{p}.self_attn.k_proj.weight", kv_heads * head_dim, hidden)
        rnd(f"{p}.self_attn.v_proj.weight", kv_heads * head_dim, hidden, scale=0.2)
        rnd(f"{p}.self_attn.o_proj.weight", hidden, heads * head_dim, scale=0.2)
        rnd(f"{p}.mlp.gate_proj.weight", inter, hidden)
        rnd(f"{p}.mlp.up_proj.weight", inter, hidden, scale=0.15 * (i + 1))
        rnd(f"{p}.mlp.down_proj.weight", hidden, inter, scale=0.1 * (i + 1))
        w[f"{p}.input_layernorm.weight"] = 1 + mx.random.normal((hidden,)) * 0.1
        w[f"{p}.post_attention_layernorm.weight"] = 1 + mx.random.normal((hidden,)) * 0.1
    w["model.norm.weight"] = 1 + mx.random.normal((hidden,)) * 0.1
    out = Path(out)
    out.mkdir(parents=True, exist_ok=False)
    mx.save_safetensors(str(out / "model.safetensors"), w, metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(Path(tokenizer_dir) / f, out / f)


def run(model_path, text, out, sens_path, flags):
    """`mlx_lm.dynamic_quant.main`'s steps through its own functions, with the
    calibration row count and length as flags (main fixes them at all rows
    of 512 tokens)."""
    import argparse
    import time

    from mlx_lm.quant import dynamic_quant as dq
    from mlx_lm.quant.utils import load_data
    from mlx_lm.utils import compute_bits_per_weight, load, quantize_model, save

    p = argparse.ArgumentParser()
    p.add_argument("--target-bpw", type=float, default=5.0)
    p.add_argument("--low-bits", type=int, default=4)
    p.add_argument("--low-group-size", type=int, default=64)
    p.add_argument("--high-bits", type=int, default=5)
    p.add_argument("--high-group-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--num-samples", type=int, default=-1)
    p.add_argument("--sequence-length", type=int, default=512)
    p.add_argument("--sensitivities", default=None, help="read instead of estimating")
    args = p.parse_args(flags)

    home = tempfile.mkdtemp()
    cache = Path(home) / ".cache" / "mlx-lm"
    cache.mkdir(parents=True)
    shutil.copy(text, cache / "calibration_v5.txt")
    os.environ["HOME"] = home
    try:
        model, tokenizer, config = load(model_path, return_config=True)
        started = time.time()
        mx.random.seed(args.seed)
        data = load_data(tokenizer, args.num_samples, args.sequence_length)
        if args.sensitivities is None:
            sensitivities = dq.estimate_sensitivities(
                model, data, args.low_bits, args.low_group_size, args.high_bits, args.high_group_size
            )
            with open(sens_path, "w") as fid:
                json.dump(sensitivities, fid)
        else:
            with open(args.sensitivities) as fid:
                sensitivities = json.load(fid)
        sens_seconds = time.time() - started
    finally:
        shutil.rmtree(home)
    sensitivities = dict(sensitivities)
    original_ppl = dq.eval_ppl(model, data)
    threshold = dq.estimate_threshold(
        model,
        sensitivities,
        target_bpw=args.target_bpw,
        low_bits=args.low_bits,
        low_group_size=args.low_group_size,
        high_bits=args.high_bits,
        high_group_size=args.high_group_size,
    )

    def quant_predicate(p, m):
        if not hasattr(m, "to_quantized"):
            return False
        if sensitivities[p] > threshold:
            return {"bits": args.high_bits, "group_size": args.high_group_size}
        return True

    model, config = quantize_model(
        model, config, group_size=args.low_group_size, bits=args.low_bits, quant_predicate=quant_predicate
    )
    quantized_ppl = dq.eval_ppl(model, data)
    bpw = compute_bits_per_weight(model)
    save(out, model_path, model, tokenizer, config)
    print(
        json.dumps(
            {
                "rows": data.shape[0],
                "threshold": threshold,
                "bits_per_weight": bpw,
                "original_ppl": original_ppl,
                "quantized_ppl": quantized_ppl,
                "sensitivity_seconds": sens_seconds,
                "seconds": time.time() - started,
            }
        )
    )


def load(model):
    from mlx_lm import load as mlx_load

    m, tok = mlx_load(model)
    bits = {}
    for name, mod in m.named_modules():
        if hasattr(mod, "bits"):
            bits[name] = mod.bits
    ids = []
    prompt = mx.array(tok.encode("hi"))[None]
    for _ in range(3):
        logits = m(prompt)[:, -1, :]
        nxt = mx.argmax(logits, axis=-1)
        ids.append(nxt.item())
        prompt = mx.concatenate([prompt, nxt[:, None]], axis=1)
    print(json.dumps({"tokens": ids, "bits": bits}))


def main():
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3])
    elif cmd == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
    elif cmd == "load":
        load(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
