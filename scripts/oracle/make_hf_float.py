"""Writes the default model's float weights as a Hugging Face style folder
(for the convert benchmark): two safetensors shards with an index, in
float32 or bfloat16, with config.json (torch_dtype set) and the tokenizer.

Usage: python make_hf_float.py SRC_DIR OUT_DIR [float32|bfloat16]
SRC_DIR is a dense mlx-lm folder (e.g. ~/.cache/mlx-bun/test-models/smol-f32).
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
    out.mkdir(parents=True, exist_ok=False)
    weights = {}
    for f in sorted(src.glob("model*.safetensors")):
        weights.update(mx.load(str(f)))
    names = sorted(weights)
    half = len(names) // 2
    weight_map, total = {}, 0
    for i, part in enumerate([names[:half], names[half:]]):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        shard = {k: weights[k].astype(getattr(mx, dtype)) for k in part}
        mx.save_safetensors(str(out / fname), shard, metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = fname
            total += v.nbytes
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    config = json.loads((src / "config.json").read_text())
    config["torch_dtype"] = dtype
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.name not in ("config.json",) and not f.name.endswith(".safetensors") and f.is_file():
            shutil.copy(f, out / f.name)


if __name__ == "__main__":
    main()
