"""Checks mlx-bun's conversion of a GGUF file against readers that do not
share its code.

Usage: check_gguf.py GGUF MODEL_DIR

Tensors: every tensor of GGUF is read and dequantized by llama.cpp's own
Python package (`gguf.GGUFReader`, `gguf.quants.dequantize`), mapped to its
Hugging Face / mlx-lm name with the name table and Q/K row order of llama.cpp's
`convert_hf_to_gguf.py` (written out here, not taken from mlx-bun), and
compared with MODEL_DIR's safetensors as MLX loads them (`mx.load`;
quantized layers through `mx.dequantize` with config.json's `quantization`).
Every GGUF tensor must have its counterpart and vice versa.

Tokenizer: the ids of MODEL_DIR/tokenizer.json (`tokenizers`) are compared on
a fixed multilingual sample with
  - transformers' GGUF tokenizer (`from_pretrained(..., gguf_file=...)`), and
  - llama.cpp's BPE tokenizer as `llama-vocab.cpp` defines it (its
    pre-tokenizer regexes for `tokenizer.ggml.pre`, special tokens matched
    whole, rank-ordered merges), ported here to Python and run on the
    vocabulary and merges the `gguf` package reads: the reference for a GGUF
    file (llama.cpp itself is not in the oracle environment).
Where transformers disagrees and llama.cpp's tokenizer sides with ours, the
sample is listed in `transformers_differs` with the reason, and transformers'
tokenizer with llama.cpp's split must then equal ours on every sample.

Prints one JSON object; exits 1 when any check fails.
"""

import json
import math
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf
import mlx.core as mx
import numpy as np
import regex

# Dequantized values must agree to this fraction of the tensor's largest
# magnitude. GGUF's Q4_1 block is x = d*q + m and Q8_0's is x = d*q (d, m
# float16). MLX's GGUF loader, which the converter reads with, keeps d and m as
# the scales and biases of its affine quantization, x = scale*q + bias (Q8_0:
# q + 128 as unsigned with bias -128*d, exact in float16), and the converter
# widens them to float32. In float32, d*q and 128*d are exact (11 + 8
# significant bits), so both sides round at most once, to the nearest float32:
# they may differ by at most an ulp, 2^-23 relative (1.2e-7). 1e-6 leaves room
# for that and nothing else: a wrong scale, bias, nibble order or row shows up
# as a difference of the order of the tensor's quantization step (>1e-3).
REL_TOL = 1e-6

# llama.cpp's names (gguf-py's tensor_mapping.py, LLaMA architecture) -> Hugging Face.
TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
PER_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# llama-vocab.cpp's pre-tokenizer regexes, applied one after the other.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA_CPP_PRE = {
    "smollm": [r"\p{N}", GPT2_SPLIT],
    "gpt-2": [GPT2_SPLIT],
}
# ggml token types llama.cpp matches whole in the text (parse_special).
TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 2, 3, 4

SAMPLE = {
    "english": "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, won't we?",
    "french": "Où est la bibliothèque ? Ça coûte 12,50 € — déjà vu, une façon naïve, l'été à Noël.",
    "german": "Grüße aus München! Die Straße ist überfüllt; Fräulein Müller isst Käsespätzle.",
    "chinese": "我们今天去北京看长城，天气很好。人工智能正在改变世界。",
    "japanese": "東京は日本の首都です。ひらがな、カタカナ、漢字を使います。ありがとうございました！",
    "russian": "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "arabic": "مرحبا بالعالم! كيف حالك اليوم؟ الذكاء الاصطناعي مفيد جدا.",
    "emoji": "I ❤️ emoji 🤖🚀 and a family 👩‍👩‍👧 with flags 🇫🇷🇯🇵 — 😂😂😂!",
    "code": (
        "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
        'print({"a": [1, 2, 3]}, x != y, a->b, i++)\n'
    ),
    "digits": "3.14159265358979 is pi; 2024-06-01T12:30:00Z, 1,000,000 items, 0x1F and 1e-9.",
    "whitespace": "  two leading\t\ttabs   three    four\n\n\nnewlines\r\nCRLF \u00a0nbsp  trailing   ",
    "spaces_before_digits": "Total:   42 and    7 ,  3",
    "special_tokens": "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi<|endoftext|>",
}
SAMPLE["all"] = "\n".join(SAMPLE.values())


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def hf_name(gguf_name):
    base, suffix = gguf_name.rsplit(".", 1)
    if base in TOP_LEVEL:
        return f"{TOP_LEVEL[base]}.{suffix}"
    blk, layer, part = base.split(".", 2)
    if blk != "blk" or part not in PER_LAYER:
        raise ValueError(f"no Hugging Face name for GGUF tensor {gguf_name!r}")
    return f"model.layers.{int(layer)}.{PER_LAYER[part]}.{suffix}"


def llama_cpp_permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rows -> GGUF rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_unpermute(w, n_head):
    """The inverse: GGUF rows -> HF rows."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_ours(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(mx.load(str(path)))
    return config, tensors


def ours_dense(stem, tensors, quantization):
    """The layer `stem` of the converted model as float32 numpy, how it is
    stored, and the safetensors keys it takes."""
    if f"{stem}.scales" in tensors:
        spec = {k: v for k, v in quantization.items() if not isinstance(v, dict)}
        spec.update(quantization.get(stem) or {})
        w = mx.dequantize(
            tensors[f"{stem}.weight"],
            tensors[f"{stem}.scales"],
            tensors.get(f"{stem}.biases"),
            group_size=spec["group_size"],
            bits=spec["bits"],
            mode=spec.get("mode", "affine"),
        )
        stored = f"affine {spec['bits']}-bit, group {spec['group_size']}"
        keys = [f"{stem}.{p}" for p in ("weight", "scales", "biases") if f"{stem}.{p}" in tensors]
    else:
        w = tensors[f"{stem}.weight"]
        stored = str(w.dtype).replace("mlx.core.", "")
        keys = [f"{stem}.weight"]
    return np.array(w.astype(mx.float32)), stored, keys


def check_tensors(reader, model_dir):
    config, ours = load_ours(model_dir)
    quantization = config.get("quantization") or {}
    n_head = int(field(reader, "llama.attention.head_count"))
    n_kv_head = int(field(reader, "llama.attention.head_count_kv") or n_head)
    per_tensor = {}
    failures = []
    used = set()
    overall = 0.0
    for t in reader.tensors:
        name = hf_name(t.name)
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        want_shape = tuple(int(d) for d in reversed(t.shape))
        if ref.shape != want_shape:
            ref = ref.reshape(want_shape)
        part = t.name.split(".")[2] if t.name.startswith("blk.") else None
        heads = {"attn_q": n_head, "attn_k": n_kv_head}.get(part)
        if heads is not None:
            hf = llama_cpp_unpermute(ref, heads)
            if not np.array_equal(llama_cpp_permute(hf, heads), ref):
                failures.append(f"{t.name}: the un-permutation is not the inverse of llama.cpp's permutation")
            ref = hf
        stem = name[: -len(".weight")] if name.endswith(".weight") else name
        if f"{stem}.weight" not in ours and name not in ours:
            failures.append(f"{t.name}: no {name} in the converted model")
            continue
        if name.endswith(".weight"):
            got, stored, keys = ours_dense(stem, ours, quantization)
        else:
            got, stored, keys = np.array(ours[name].astype(mx.float32)), str(ours[name].dtype), [name]
        used.update(keys)
        entry = {"gguf": t.name, "type": t.tensor_type.name, "ours": stored, "shape": list(ref.shape)}
        if got.shape != ref.shape:
            failures.append(f"{t.name}: shape {list(got.shape)} in the model, {list(ref.shape)} in the GGUF")
            entry["max_abs_diff"] = None
            per_tensor[name] = entry
            continue
        diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        tol = REL_TOL * scale
        entry.update(
            max_abs_diff=diff,
            max_abs_value=scale,
            tolerance=tol,
            bit_identical=bool(np.array_equal(got, ref)),
        )
        if not math.isfinite(diff) or diff > tol:
            failures.append(f"{t.name}: max abs diff {diff:.3g} over the tolerance {tol:.3g}")
        overall = max(overall, diff)
        per_tensor[name] = entry
    extra = sorted(set(ours) - used)
    if extra:
        failures.append(f"tensors in the model without a GGUF counterpart: {extra}")
    gguf_names = {t.name for t in reader.tensors}
    tied = "output.weight" not in gguf_names
    if config.get("tie_word_embeddings") is not tied:
        failures.append(f"tie_word_embeddings is {config.get('tie_word_embeddings')}, the GGUF says {tied}")
    result = {
        "count": len(reader.tensors),
        "model_tensors": len(ours),
        "bit_identical": sum(1 for e in per_tensor.values() if e.get("bit_identical")),
        "max_abs_diff": overall,
        "rel_tolerance": REL_TOL,
        "tied_embeddings": tied,
        "types": {},
        "per_tensor": per_tensor,
    }
    for t in reader.tensors:
        result["types"][t.tensor_type.name] = result["types"].get(t.tensor_type.name, 0) + 1
    return result, failures


def check_config(reader, model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    want = {
        "hidden_size": field(reader, "llama.embedding_length"),
        "intermediate_size": field(reader, "llama.feed_forward_length"),
        "num_hidden_layers": field(reader, "llama.block_count"),
        "num_attention_heads": field(reader, "llama.attention.head_count"),
        "num_key_value_heads": field(reader, "llama.attention.head_count_kv"),
        "rope_theta": field(reader, "llama.rope.freq_base"),
        "rms_norm_eps": field(reader, "llama.attention.layer_norm_rms_epsilon"),
        "vocab_size": field(reader, "llama.vocab_size") or len(field(reader, "tokenizer.ggml.tokens")),
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
    }
    failures = []
    for key, value in want.items():
        if value is None:
            continue
        got = config.get(key)
        same = got is not None and (
            math.isclose(float(got), float(value), rel_tol=1e-6) if isinstance(value, float) else got == value
        )
        if not same:
            failures.append(f"config.json {key} = {got!r}, the GGUF says {value!r}")
    return {k: v for k, v in want.items() if v is not None}, failures


class LlamaCppBpe:
    """llama.cpp's tokenizer for `tokenizer.ggml.model = gpt2` (llm_tokenizer_bpe in
    llama-vocab.cpp), as `llama_tokenize(..., add_special, parse_special=true)`
    runs it: special tokens cut out whole (longest first), each fragment split
    by the pre-tokenizer regexes in turn, byte-level encoded, then merged by
    rank (lowest first, leftmost on ties)."""

    def __init__(self, reader):
        pre = field(reader, "tokenizer.ggml.pre") or "gpt-2"
        if pre not in LLAMA_CPP_PRE:
            raise ValueError(f"no llama.cpp pre-tokenizer regexes here for {pre!r}")
        self.regexes = [regex.compile(r) for r in LLAMA_CPP_PRE[pre]]
        self.tokens = field(reader, "tokenizer.ggml.tokens")
        types_ = field(reader, "tokenizer.ggml.token_type") or [1] * len(self.tokens)
        self.ids = {tok: i for i, tok in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(field(reader, "tokenizer.ggml.merges"))}
        self.special = sorted(
            (tok for tok, ty in zip(self.tokens, types_) if ty in (TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED)),
            key=len,
            reverse=True,
        )
        # GPT-2's byte -> printable character table.
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
        extra = [b for b in range(256) if b not in printable]
        self.byte_char = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(extra)}

    def split(self, text):
        pieces = [text]
        for rx in self.regexes:
            out = []
            for piece in pieces:
                pos = 0
                for m in rx.finditer(piece):
                    if m.start() > pos:
                        out.append(piece[pos : m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces

    def bpe(self, word):
        symbols = [self.byte_char[b] for b in word.encode("utf-8")]
        while len(symbols) > 1:
            best = min(
                ((self.ranks.get((a, b), math.inf), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))),
            )
            if best[0] == math.inf:
                break
            i = best[1]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        ids = []
        for s in symbols:
            if s in self.ids:
                ids.append(self.ids[s])
            else:
                ids.extend(self.ids[c] for c in s)
        return ids

    def encode(self, text):
        fragments = [(False, text)]
        for tok in self.special:
            out = []
            for is_special, frag in fragments:
                if is_special:
                    out.append((True, frag))
                    continue
                parts = frag.split(tok)
                for k, part in enumerate(parts):
                    if k:
                        out.append((True, tok))
                    if part:
                        out.append((False, part))
            fragments = out
        ids = []
        for is_special, frag in fragments:
            if is_special:
                ids.append(self.ids[frag])
            else:
                for word in self.split(frag):
                    ids.extend(self.bpe(word))
        return ids


def transformers_gguf_tokenizer(gguf_path):
    """transformers' tokenizer for a GGUF file, and how it was loaded.

    `AutoTokenizer.from_pretrained(dir, gguf_file=name)` needs PyTorch for a
    LLaMA file (its GGUF metadata reader imports torch, and the config step
    insists on it). Without torch, the same tokenizer is built the same way
    AutoTokenizer would (LlamaConfig has no tokenizer class of its own, so
    AutoTokenizer falls back to TokenizersBackend), with the metadata read by
    llama.cpp's `gguf` package in place of transformers' reader."""
    gguf_path = Path(gguf_path).resolve()
    try:
        import torch  # noqa: F401

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        return tok, "AutoTokenizer.from_pretrained(gguf_file=...)"
    except ImportError:
        pass

    def read_gguf_metadata(path, string_arrays=()):
        reader = gguf.GGUFReader(path)
        metadata = {}
        for key, f in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            value = f.contents()
            is_string_array = f.types[:1] == [gguf.GGUFValueType.ARRAY] and f.types[-1] == gguf.GGUFValueType.STRING
            # transformers' reader leaves string arrays it was not asked for as their length
            metadata[key] = len(value) if is_string_array and key not in string_arrays else value
        return metadata, tuple(t.name for t in reader.tensors)

    shim = types.ModuleType("transformers.integrations.gguf.reader")
    shim.read_gguf_metadata = read_gguf_metadata
    sys.modules[shim.__name__] = shim
    from transformers import TokenizersBackend

    tok = TokenizersBackend.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    return tok, "TokenizersBackend.from_pretrained(gguf_file=...), metadata via gguf.GGUFReader (no torch)"


def with_llama_cpp_split(hf, pre):
    """transformers' GGUF tokenizer (its vocabulary, merges and special tokens)
    with llama.cpp's pre-tokenizer regexes, set the way transformers'
    `set_split_regex` sets them for the `tokenizer.ggml.pre` values it knows."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in LLAMA_CPP_PRE[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return backend


def check_tokenizer(reader, gguf_path, model_dir):
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    llama_cpp = LlamaCppBpe(reader)
    hf, loader = transformers_gguf_tokenizer(gguf_path)
    pre = field(reader, "tokenizer.ggml.pre") or "gpt-2"
    hf_split = with_llama_cpp_split(hf, pre)
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token"))
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    failures = []
    cases = []
    transformers_differs = []
    vocab_ours = ours.get_vocab(with_added_tokens=True)
    vocab_gguf = {tok: i for i, tok in enumerate(llama_cpp.tokens)}
    vocab_hf = hf.get_vocab()
    if vocab_ours != vocab_gguf:
        failures.append("tokenizer.json's vocabulary differs from the GGUF's token list")
    for label, text in SAMPLE.items():
        ids = ours.encode(text, add_special_tokens=False).ids
        ids_special = ours.encode(text, add_special_tokens=True).ids
        ref = llama_cpp.encode(text)
        ref_special = ([bos] if add_bos else []) + ref
        hf_ids = hf.encode(text, add_special_tokens=False)
        hf_special = hf.encode(text, add_special_tokens=True)
        split_ids = hf_split.encode(text, add_special_tokens=False).ids
        case = {
            "label": label,
            "tokens": len(ids),
            "equal_llama_cpp": ids == ref,
            "equal_llama_cpp_with_special": ids_special == ref_special,
            "equal_transformers": ids == hf_ids,
            "equal_transformers_with_special": ids_special == hf_special,
            "equal_transformers_llama_cpp_split": ids == split_ids,
            "roundtrip": ours.decode(ids, skip_special_tokens=False) == text,
        }
        if ids != ref or ids_special != ref_special:
            failures.append(f"tokenizer: {label}: ids differ from llama.cpp's")
            case.update(ours_ids=ids, llama_cpp_ids=ref)
        if ids != split_ids:
            failures.append(f"tokenizer: {label}: ids differ from transformers' with llama.cpp's split")
            case.update(ours_ids=ids, transformers_split_ids=split_ids)
        if ids != hf_ids or ids_special != hf_special:
            # Reported, not failed, when llama.cpp's tokenizer (the reference
            # for a GGUF) sides with us: see "transformers_note".
            transformers_differs.append(label)
            case.update(ours_ids=ids, transformers_ids=hf_ids, llama_cpp_ids=ref)
            case["transformers_equal_llama_cpp"] = hf_ids == ref
            if hf_ids == ref:
                failures.append(f"tokenizer: {label}: transformers and llama.cpp agree, we differ")
        if not case["roundtrip"]:
            failures.append(f"tokenizer: {label}: decode(encode(text)) != text")
        cases.append(case)
    result = {
        "ours": "tokenizers.Tokenizer.from_file(MODEL_DIR/tokenizer.json)",
        "llama_cpp": f"llama-vocab.cpp's BPE in Python, pre-tokenizer {pre!r}: {LLAMA_CPP_PRE.get(pre)}",
        "transformers": loader,
        "samples": len(cases),
        "equal_llama_cpp": sum(c["equal_llama_cpp"] and c["equal_llama_cpp_with_special"] for c in cases),
        "equal_transformers": sum(c["equal_transformers"] and c["equal_transformers_with_special"] for c in cases),
        "equal_transformers_llama_cpp_split": sum(c["equal_transformers_llama_cpp_split"] for c in cases),
        "vocab_equal_gguf": vocab_ours == vocab_gguf,
        "vocab_equal_transformers": vocab_ours == vocab_hf,
        "transformers_differs": transformers_differs,
        "cases": cases,
    }
    if transformers_differs:
        result["transformers_note"] = (
            f"transformers has no split for tokenizer.ggml.pre={pre!r} (GGUF_PRE_TOKENIZER_SPLITS) "
            "and keeps GPT-2's, which does not cut digits out before the GPT-2 regex as "
            "llama.cpp's smollm regexes do, so a run of spaces before a digit ends differently "
            "('   42': transformers 'ĠĠ','Ġ','4', llama.cpp 'ĠĠĠ','4'). llama.cpp's tokenizer is "
            "the reference for a GGUF and ours equals it; transformers' own vocabulary, merges "
            "and special tokens with llama.cpp's split equal ours on every sample "
            "(equal_transformers_llama_cpp_split)"
        )
    if vocab_ours != vocab_hf:
        failures.append("tokenizer.json's vocabulary differs from transformers' GGUF tokenizer's")
    return result, failures


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    gguf_path, model_dir = sys.argv[1], Path(sys.argv[2])
    reader = gguf.GGUFReader(gguf_path)
    arch = field(reader, "general.architecture")
    if arch != "llama":
        print(f"only the llama architecture is mapped here, not {arch!r}", file=sys.stderr)
        return 2
    tensors, failures = check_tensors(reader, model_dir)
    config, config_failures = check_config(reader, model_dir)
    tokenizer, tokenizer_failures = check_tokenizer(reader, gguf_path, model_dir)
    failures += config_failures + tokenizer_failures
    report = {
        "gguf": str(gguf_path),
        "model": str(model_dir),
        "gguf_package": getattr(gguf, "__version__", None) or _version("gguf"),
        "tensors": tensors,
        "config": config,
        "tokenizer": tokenizer,
        "failures": failures,
        "ok": not failures,
    }
    print(json.dumps(report, ensure_ascii=False))
    return 0 if not failures else 1


def _version(package):
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    sys.exit(main())
