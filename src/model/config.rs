//! `config.json` fields shared by the decoder-only architectures.

use anyhow::{bail, Result};
use serde::de;
use serde::{Deserialize, Deserializer};

use crate::quant::Quantization;

fn default_rope_theta() -> f32 {
    10000.0
}

fn default_true() -> bool {
    true
}

fn default_eps() -> f32 {
    1e-6
}

/// The fields one family adds to `config.json`, parsed once at load; an
/// error names the field (`attn_logit_softcapping: invalid type: ...`).
pub(crate) fn family_args<T: serde::de::DeserializeOwned>(raw: &serde_json::Value) -> Result<T> {
    serde_path_to_error::deserialize(raw.clone())
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path(), e.inner()))
}

/// `rope_scaling` (or transformers 5's `rope_parameters`), parsed once.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear {
        /// The divisor; positive.
        factor: f64,
    },
    /// Llama 3.1's frequency bands.
    Llama3 {
        /// How much the low frequencies are stretched.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor`
        /// are stretched by `factor`; default 1.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor`
        /// stay as they are; default 4 (those between are blended).
        high_freq_factor: f64,
        /// The context length trained before the extension; default 8192.
        original_max_position_embeddings: f64,
    },
    /// YaRN (GPT-OSS, DeepSeek-style long context).
    Yarn(YarnScaling),
    /// Phi-3's su / longrope: read by `phi3.rs` with its own fields.
    LongRope,
}

/// YaRN's fields of `rope_scaling`, defaults filled in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    /// How much longer the context is than the one trained.
    pub factor: f64,
    /// The context length trained.
    pub original_max_position_embeddings: f64,
    /// The rotation count that sets where the frequency ramp starts.
    pub beta_fast: f64,
    /// The rotation count that sets where the frequency ramp ends.
    pub beta_slow: f64,
    /// The attention factor's `mscale` (its numerator).
    pub mscale: f64,
    /// The attention factor's `mscale_all_dim` (its denominator).
    pub mscale_all_dim: f64,
}

impl RopeScaling {
    /// `None` for no scaling (absent, null, or type `default`). Errors name
    /// the field: `rope_scaling.factor must be a positive number, got 0`.
    pub fn parse(v: &serde_json::Value) -> Result<Option<Self>> {
        if v.is_null() {
            return Ok(None);
        }
        let Some(map) = v.as_object() else {
            bail!("rope_scaling must be an object, got {v}");
        };
        let kind = match map.get("rope_type").or_else(|| map.get("type")) {
            None => "default",
            Some(t) => t.as_str().ok_or_else(|| {
                anyhow::anyhow!("rope_scaling.rope_type must be a string, got {t}")
            })?,
        };
        let num = |key: &str, default: Option<f64>| -> Result<f64> {
            match map.get(key).filter(|v| !v.is_null()) {
                Some(v) => v
                    .as_f64()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| anyhow::anyhow!("rope_scaling.{key} must be a number, got {v}")),
                None => default
                    .ok_or_else(|| anyhow::anyhow!("rope_scaling.{key} is required for {kind:?}")),
            }
        };
        let factor = |default: Option<f64>| -> Result<f64> {
            let f = num("factor", default)?;
            if f <= 0.0 {
                bail!("rope_scaling.factor must be a positive number, got {f}");
            }
            Ok(f)
        };
        Ok(Some(match kind {
            "default" => return Ok(None),
            "linear" => Self::Linear {
                factor: factor(None)?,
            },
            "llama3" => Self::Llama3 {
                factor: factor(None)?,
                low_freq_factor: num("low_freq_factor", Some(1.0))?,
                high_freq_factor: num("high_freq_factor", Some(4.0))?,
                original_max_position_embeddings: num(
                    "original_max_position_embeddings",
                    Some(8192.0),
                )?,
            },
            "yarn" => Self::Yarn(YarnScaling {
                factor: factor(None)?,
                original_max_position_embeddings: num(
                    "original_max_position_embeddings",
                    Some(4096.0),
                )?,
                beta_fast: num("beta_fast", Some(32.0))?,
                beta_slow: num("beta_slow", Some(1.0))?,
                mscale: num("mscale", Some(1.0))?,
                mscale_all_dim: num("mscale_all_dim", Some(0.0))?,
            }),
            "su" | "longrope" => Self::LongRope,
            other => bail!(
                "unsupported rope_scaling type {other:?} (supported: default, linear, llama3, yarn; su/longrope on phi3)"
            ),
        }))
    }
}

/// The `config.json` fields the decoder-only families share (mlx-lm's
/// `ModelArgs`); each family reads what else it needs from the raw JSON.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    /// The architecture name (`llama`, `qwen3`, ...) that picks the family.
    pub model_type: String,
    /// Width of the residual stream.
    pub hidden_size: i32,
    /// Number of decoder layers.
    pub num_hidden_layers: i32,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: i32,
    /// Number of query heads.
    pub num_attention_heads: i32,
    /// Number of key/value heads (grouped-query attention); defaults to
    /// `num_attention_heads`.
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    /// Width of one attention head; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<i32>,
    /// The RMS norms' epsilon; default `1e-6`.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    /// Number of token ids the embedding and output head cover.
    pub vocab_size: i32,
    /// The RoPE frequency base; default `rope_parameters.rope_theta`, else 10000.
    #[serde(default)]
    pub rope_theta: Option<f32>,
    /// transformers >= 5 nests `rope_theta` and the scaling here.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// Rotates adjacent feature pairs instead of the two halves; default false.
    #[serde(default)]
    pub rope_traditional: bool,
    /// The RoPE scaling block (`linear`, `llama3`, `yarn`, `su`/`longrope`),
    /// parsed by [`RopeScaling::parse`].
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// The output head shares the embedding matrix; default true.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Bias on the attention projections; default false (biases are loaded
    /// wherever the weights carry them).
    #[serde(default)]
    pub attention_bias: bool,
    /// Bias on the MLP projections; default false (biases are loaded wherever
    /// the weights carry them).
    #[serde(default)]
    pub mlp_bias: bool,
    /// The longest context the model was trained for, in tokens.
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// The sliding attention window, in tokens, of layers `layer_types` marks
    /// `sliding_attention`.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Per layer: its attention kind (`full_attention`, `sliding_attention`, or
    /// a family's own names); as many entries as layers.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// mlx-lm's `quantization` block, or its `quantization_config` alias
    /// (`resolve_quantization` reads the alias once, at load).
    #[serde(default)]
    pub quantization: Option<Quantization>,
    #[serde(default)]
    quantization_config: Option<serde_json::Value>,
    /// The checkpoint's float dtype (`bfloat16`, `float16`, `float32`).
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// End-of-sequence token id(s); see [`ModelArgs::eos_ids`].
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// The beginning-of-sequence token id(s), as written; kept but not read.
    #[serde(default)]
    pub bos_token_id: Option<serde_json::Value>,
}

impl ModelArgs {
    pub(crate) fn rope_base(&self) -> f32 {
        self.rope_theta
            .or_else(|| {
                self.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(|v| v.as_f64())
                    .map(|v| v as f32)
            })
            .unwrap_or_else(default_rope_theta)
    }

    /// The RoPE scaling of `rope_scaling`, else of `rope_parameters`.
    pub(crate) fn rope_scaling(&self) -> Result<Option<RopeScaling>> {
        match self
            .rope_scaling
            .as_ref()
            .filter(|v| !v.is_null())
            .or(self.rope_parameters.as_ref())
        {
            Some(v) => RopeScaling::parse(v),
            None => Ok(None),
        }
    }

    pub(crate) fn kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one attention head: `head_dim`, else `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> i32 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// End-of-sequence ids named in the config (a number or a list).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_token_id
            .as_ref()
            .map(|ids| ids.0.clone())
            .unwrap_or_default()
    }

    /// Takes mlx-lm's `quantization_config` alias when `quantization` is
    /// absent: an mlx-lm block (no `quant_method`), or the whole-model
    /// `mxfp4`/`mxfp8` methods mlx-lm maps onto its modes. Called once by
    /// the config reader; errors name the field.
    pub(crate) fn resolve_quantization(&mut self) -> Result<()> {
        let Some(alias) = self.quantization_config.take() else {
            return Ok(());
        };
        if self.quantization.is_some() || alias.is_null() {
            return Ok(());
        }
        let method = alias.get("quant_method");
        let block = match method.and_then(serde_json::Value::as_str) {
            None if method.is_none() => alias,
            Some("mxfp4") => serde_json::json!({"group_size": 32, "bits": 4, "mode": "mxfp4"}),
            Some("mxfp8") => serde_json::json!({"group_size": 32, "bits": 8, "mode": "mxfp8"}),
            _ => bail!(
                "quantization_config.quant_method {} is not supported (mlx-bun loads mlx-lm \
                 quantization; convert the float checkpoint with `mlx-bun convert -q`)",
                method.unwrap_or(&serde_json::Value::Null)
            ),
        };
        self.quantization = Some(Quantization::parse(block, "quantization_config")?);
        Ok(())
    }

    /// Checks the fields the model is built from, naming the first bad one.
    /// Run at load, so a broken config is an error instead of a division by
    /// zero or an opaque reshape failure later.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", Some(self.hidden_size)),
            ("num_hidden_layers", Some(self.num_hidden_layers)),
            ("intermediate_size", Some(self.intermediate_size)),
            ("num_attention_heads", Some(self.num_attention_heads)),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", Some(self.vocab_size)),
        ];
        for (name, value) in positive {
            if let Some(v) = value.filter(|&v| v < 1) {
                bail!("{name} must be at least 1, got {v}");
            }
        }
        let (heads, kv_heads) = (self.num_attention_heads, self.kv_heads());
        if heads % kv_heads != 0 {
            bail!(
                "num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            );
        }
        if self.head_dim.is_none() && self.hidden_size % heads != 0 {
            bail!(
                "hidden_size ({}) must be a multiple of num_attention_heads ({heads}) when head_dim is not given",
                self.hidden_size
            );
        }
        if self.head_dim() % 2 != 0 {
            bail!(
                "head_dim must be even for rotary embeddings, got {}",
                self.head_dim()
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            bail!(
                "rms_norm_eps must be a positive number, got {}",
                self.rms_norm_eps
            );
        }
        let base = self.rope_base();
        if !(base.is_finite() && base > 0.0) {
            bail!("rope_theta must be a positive number, got {base}");
        }
        self.rope_scaling()?;
        if let Some(q) = &self.quantization {
            q.validate()?;
        }
        for (name, value) in [
            ("max_position_embeddings", self.max_position_embeddings),
            ("sliding_window", self.sliding_window),
        ] {
            if value == Some(0) {
                bail!("{name} must be at least 1, got 0");
            }
        }
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers as usize {
                bail!(
                    "layer_types has {} entries but num_hidden_layers is {}",
                    types.len(),
                    self.num_hidden_layers
                );
            }
        }
        Ok(())
    }
}

/// Token ids given as one number or a list (`eos_token_id`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(u32),
            Many(Vec<u32>),
        }
        match OneOrMany::deserialize(d) {
            Ok(OneOrMany::One(id)) => Ok(Self(vec![id])),
            Ok(OneOrMany::Many(ids)) => Ok(Self(ids)),
            Err(_) => Err(de::Error::custom(
                "expected a token id (a whole number) or a list of them",
            )),
        }
    }
}

/// The `eos_token_id` of `config.json` and `generation_config.json` in
/// `dir`, as mlx-lm's `load_config` reads them: generation_config.json's
/// wins when it gives one. Errors name the file and field.
pub(crate) fn eos_token_ids(dir: &std::path::Path) -> Result<Vec<u32>> {
    #[derive(Deserialize)]
    struct Eos {
        #[serde(default)]
        eos_token_id: Option<TokenIds>,
    }
    let read = |name: &str| -> Result<Vec<u32>> {
        let path = dir.join(name);
        if !path.is_file() {
            return Ok(Vec::new());
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let mut de = serde_json::Deserializer::from_str(&text);
        let eos: Eos = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| anyhow::anyhow!("{}: {}: {}", path.display(), e.path(), e.inner()))?;
        Ok(eos.eos_token_id.map(|ids| ids.0).unwrap_or_default())
    };
    let generation = read("generation_config.json")?;
    if !generation.is_empty() {
        return Ok(generation);
    }
    read("config.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: serde_json::Value) -> ModelArgs {
        let mut base = serde_json::json!({
            "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100,
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn error(extra: serde_json::Value) -> String {
        args(extra).validate().unwrap_err().to_string()
    }

    /// `read_config`'s parse: serde's error with its path, then the alias.
    fn parse(extra: serde_json::Value) -> Result<ModelArgs> {
        let mut base = serde_json::json!({
            "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100,
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        let mut args: ModelArgs = serde_path_to_error::deserialize(base)
            .map_err(|e| anyhow::anyhow!("{}: {}", e.path(), e.inner()))?;
        args.resolve_quantization()?;
        args.validate()?;
        Ok(args)
    }

    #[test]
    fn quantization_is_read_from_the_block_or_its_alias() {
        use crate::quant::{QuantMode, QuantSpec};
        use serde_json::json;
        // The block itself (its parsing: `crate::quant`'s tests).
        let args = parse(json!({"quantization": {
            "group_size": 32, "bits": 4, "mode": "mxfp4", "lm_head": false,
        }}))
        .unwrap();
        let q = args.quantization.unwrap();
        assert_eq!(q.default.mode, QuantMode::Mxfp4);
        assert_eq!(q.named("lm_head"), Some(None));
        // The alias alone, as mlx-lm writes it, and the whole-model methods.
        let alias =
            parse(json!({"quantization_config": {"group_size": 16, "bits": 4, "mode": "nvfp4"}}))
                .unwrap();
        assert_eq!(alias.quantization.unwrap().default.mode, QuantMode::Nvfp4);
        let method = parse(json!({"quantization_config": {"quant_method": "mxfp4"}})).unwrap();
        assert_eq!(method.quantization.unwrap().default.mode, QuantMode::Mxfp4);
        // Both: `quantization` wins (mlx-lm reads the alias only without it).
        let both = parse(json!({
            "quantization": {"group_size": 32, "bits": 8},
            "quantization_config": {"quant_method": "awq"},
        }))
        .unwrap();
        assert_eq!(both.quantization.unwrap().default, QuantSpec::affine(32, 8));
    }

    #[test]
    fn malformed_quantization_names_the_field() {
        use serde_json::json;
        let e = |extra| format!("{:#}", parse(extra).unwrap_err());
        let cases = [
            (
                json!({"quantization": {"group_size": "64", "bits": 4}}),
                "quantization.group_size: invalid type: string",
            ),
            (
                json!({"quantization": {"group_size": 64, "bits": 4,
                       "lm_head": {"group_size": 64, "bits": "8"}}}),
                "quantization.lm_head.bits: invalid type: string",
            ),
            (
                json!({"quantization": {"group_size": 64, "bits": 4,
                       "lm_head": {"bits": 7}}}),
                "quantization.\"lm_head\": 7 quantization bits are not supported",
            ),
            (
                json!({"quantization_config": {"group_size": 64}}),
                "quantization_config: missing field `bits`",
            ),
            (
                json!({"quantization_config": {"quant_method": "awq", "bits": 4}}),
                "quantization_config.quant_method \"awq\" is not supported",
            ),
            (
                json!({"eos_token_id": [2, "x"]}),
                "eos_token_id: expected a token id",
            ),
        ];
        for (extra, want) in cases {
            let got = e(extra.clone());
            assert!(got.contains(want), "{extra}: {got}");
        }
        let ids = parse(json!({"eos_token_id": [2, 7]})).unwrap();
        assert_eq!(ids.eos_ids(), vec![2, 7]);
        assert_eq!(
            parse(json!({"eos_token_id": 5})).unwrap().eos_ids(),
            vec![5]
        );
    }

    #[test]
    fn eos_ids_from_generation_config_win_as_in_mlx_lm() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("config.json", r#"{"eos_token_id": 2}"#);
        assert_eq!(eos_token_ids(dir.path()).unwrap(), vec![2]);
        write("generation_config.json", r#"{"eos_token_id": [7, 9]}"#);
        assert_eq!(eos_token_ids(dir.path()).unwrap(), vec![7, 9]);
        write("generation_config.json", r#"{"eos_token_id": []}"#);
        assert_eq!(eos_token_ids(dir.path()).unwrap(), vec![2]);
        write("generation_config.json", r#"{"eos_token_id": "two"}"#);
        let e = eos_token_ids(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("generation_config.json: eos_token_id: expected a token id"),
            "{e}"
        );
    }

    #[test]
    fn names_the_bad_field() {
        assert!(args(serde_json::json!({})).validate().is_ok());
        let e = error(serde_json::json!({"num_attention_heads": 0}));
        assert!(e.contains("num_attention_heads must be at least 1"), "{e}");
        let e = error(serde_json::json!({"num_key_value_heads": 3}));
        assert!(e.contains("multiple of num_key_value_heads (3)"), "{e}");
        let e = error(serde_json::json!({"hidden_size": 66}));
        assert!(e.contains("hidden_size (66)"), "{e}");
        let e = error(serde_json::json!({"rms_norm_eps": -1.0}));
        assert!(e.contains("rms_norm_eps"), "{e}");
        let e = error(serde_json::json!({"quantization": {"group_size": 48, "bits": 4}}));
        assert!(
            e.contains("quantization: quantization group size 48"),
            "{e}"
        );
        let e = error(
            serde_json::json!({"quantization": {"group_size": 32, "bits": 8, "mode": "mxfp4"}}),
        );
        assert!(e.contains("mxfp4 quantization takes exactly 4 bits"), "{e}");
        let e = error(serde_json::json!({"layer_types": ["full_attention"]}));
        assert!(e.contains("layer_types has 1 entries"), "{e}");
        let e = error(serde_json::json!({"rope_scaling": {"type": "linear", "factor": 0}}));
        assert!(e.contains("rope_scaling.factor"), "{e}");
    }
}
