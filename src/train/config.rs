//! Training options. Every field has the name mlx-lm's `lora` YAML uses, so
//! its config files work unchanged; values come from defaults, then a YAML
//! file, then command-line flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::lora::LoraParameters;

/// The training objective.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Supervised fine-tuning: masked next-token cross-entropy.
    #[default]
    #[serde(alias = "lora")]
    Sft,
    /// Odds-ratio preference optimization on `{prompt, chosen, rejected}` rows.
    Orpo,
}

/// Which positions the ORPO NLL term supervises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SftScope {
    /// Every non-pad label-shifted position of prompt + chosen (TRL / the paper).
    #[default]
    Full,
    /// The chosen response tokens only: NLL = -mean response log-prob.
    Response,
}

/// The optimizer (`optimizer`, `--optimizer`; default `adam`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Adam.
    #[default]
    Adam,
    /// AdamW: Adam with decoupled weight decay.
    Adamw,
    /// Stochastic gradient descent, with optional momentum.
    Sgd,
}

/// Per-optimizer settings, as mlx-lm's `optimizer_config.<name>` maps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSettings {
    /// Adam's `[β1, β2]` (default `[0.9, 0.999]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub betas: Option<[f32; 2]>,
    /// Adam's ε (default 1e-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f32>,
    /// Weight decay (default 0.01 for AdamW, else 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f32>,
    /// SGD momentum (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f32>,
    /// Adam's bias correction (default false, as MLX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias_correction: Option<bool>,
}

/// `lr_schedule`, as in mlx-lm: a schedule name with its arguments and an
/// optional linear warmup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrScheduleConfig {
    /// `cosine_decay` (arguments: init, decay_steps, [end]), `linear_schedule`
    /// (init, end, steps) or `constant` (init).
    pub name: String,
    /// The schedule's arguments, in the order `name` takes them.
    pub arguments: Vec<f64>,
    /// Linear warmup steps before the schedule (default 0).
    #[serde(default)]
    pub warmup: usize,
    /// The learning rate the warmup starts from (default 0).
    #[serde(default)]
    pub warmup_init: f64,
}

/// The options of a LoRA training run, as mlx-lm's `lora` YAML names them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// The model to adapt: a directory or Hub id (`--model`).
    #[serde(default)]
    pub model: Option<String>,
    /// The directory with `train.jsonl`, `valid.jsonl`, `test.jsonl` (`--data`).
    #[serde(default)]
    pub data: Option<PathBuf>,
    /// The training objective (default `sft`).
    #[serde(default)]
    pub method: Method,
    /// Only `lora` is supported (the default).
    #[serde(default = "default_fine_tune_type")]
    pub fine_tune_type: String,
    /// The optimizer (default `adam`).
    #[serde(default)]
    pub optimizer: OptimizerKind,
    /// Settings per optimizer name (`adam`, `adamw`, `sgd`).
    #[serde(default)]
    pub optimizer_config: BTreeMap<String, OptimizerSettings>,
    /// Seed of the batch order and the adapters' initialization (default 0).
    #[serde(default)]
    pub seed: u64,
    /// Adapted blocks, counted from the last; -1 (or 0, as in mlx-lm) adapts all.
    #[serde(default = "default_num_layers")]
    pub num_layers: i64,
    /// Examples per batch (`--batch-size`, default 4).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Training iterations (`--iters`, default 1000).
    #[serde(default = "default_iters")]
    pub iters: usize,
    /// -1 uses the whole validation set.
    #[serde(default = "default_val_batches")]
    pub val_batches: i64,
    /// The learning rate, or a schedule's base (`--learning-rate`, default 1e-5).
    #[serde(default = "default_learning_rate")]
    pub learning_rate: f64,
    /// Iterations between loss reports (default 10; YAML only).
    #[serde(default = "default_steps_per_report")]
    pub steps_per_report: usize,
    /// Iterations between validations (`--steps-per-eval`, default 200).
    #[serde(default = "default_steps_per_eval")]
    pub steps_per_eval: usize,
    /// Start from the adapter weights in this file (`--resume-adapter-file`).
    #[serde(default)]
    pub resume_adapter_file: Option<PathBuf>,
    /// Where the adapters and their config are saved (`--adapter-path`, default `adapters`).
    #[serde(default = "default_adapter_path")]
    pub adapter_path: PathBuf,
    /// Iterations between adapter checkpoints (`--save-every`, default 100).
    #[serde(default = "default_save_every")]
    pub save_every: usize,
    /// Evaluate on `test.jsonl` after training (`--test`).
    #[serde(default)]
    pub test: bool,
    /// Test batches; -1 uses the whole test set (`--test-batches`, default 500).
    #[serde(default = "default_test_batches")]
    pub test_batches: i64,
    /// Longer sequences are truncated to this many tokens (`--max-seq-length`, default 2048).
    #[serde(default = "default_max_seq_length")]
    pub max_seq_length: usize,
    /// Recompute the adapted layers' activations in the backward pass to save memory (`--grad-checkpoint`).
    #[serde(default)]
    pub grad_checkpoint: bool,
    /// Batches whose gradients are summed before each update (`--grad-accumulation-steps`, default 1).
    #[serde(default = "default_one")]
    pub grad_accumulation_steps: usize,
    /// Clip the global gradient norm to this value.
    #[serde(default)]
    pub grad_clip: Option<f32>,
    /// A learning-rate schedule; None: constant `learning_rate`.
    #[serde(default)]
    pub lr_schedule: Option<LrScheduleConfig>,
    /// Rank, scale, dropout and target modules of the adapters.
    #[serde(default)]
    pub lora_parameters: LoraParameters,
    /// Leave the prompt out of the SFT loss (`--mask-prompt`).
    #[serde(default)]
    pub mask_prompt: bool,
    /// Weight of the odds-ratio term in the ORPO loss.
    #[serde(default = "default_orpo_lambda")]
    pub orpo_lambda: f64,
    /// Which positions ORPO's NLL term covers (default `full`).
    #[serde(default)]
    pub sft_scope: SftScope,
    /// Token rows per output-head chunk in the loss (bounds the logits memory).
    #[serde(default = "default_loss_chunk")]
    pub loss_chunk_tokens: usize,
    /// The eval database (default: `<cache>/eval.db`).
    #[serde(default)]
    pub db: Option<PathBuf>,
    /// mlx-lm options accepted for compatibility and not used.
    #[serde(default, skip_serializing)]
    pub train: Option<serde_yaml::Value>,
    /// Accepted for compatibility with mlx-lm; not used.
    #[serde(default, skip_serializing)]
    pub report_to: Option<serde_yaml::Value>,
    /// Accepted for compatibility with mlx-lm; not used.
    #[serde(default, skip_serializing)]
    pub project_name: Option<serde_yaml::Value>,
    /// Accepted for compatibility with mlx-lm; not used.
    #[serde(default, skip_serializing)]
    pub clear_cache_threshold: Option<serde_yaml::Value>,
    /// Accepted for compatibility with mlx-lm; not used.
    #[serde(default, skip_serializing)]
    pub trust_remote_code: Option<serde_yaml::Value>,
    /// Accepted for compatibility with mlx-lm; not used.
    #[serde(default, skip_serializing)]
    pub config: Option<serde_yaml::Value>,
}

fn default_fine_tune_type() -> String {
    "lora".into()
}
fn default_num_layers() -> i64 {
    16
}
fn default_batch_size() -> usize {
    4
}
fn default_iters() -> usize {
    1000
}
fn default_val_batches() -> i64 {
    25
}
fn default_learning_rate() -> f64 {
    1e-5
}
fn default_steps_per_report() -> usize {
    10
}
fn default_steps_per_eval() -> usize {
    200
}
fn default_adapter_path() -> PathBuf {
    PathBuf::from("adapters")
}
fn default_save_every() -> usize {
    100
}
fn default_test_batches() -> i64 {
    500
}
fn default_max_seq_length() -> usize {
    2048
}
fn default_one() -> usize {
    1
}
fn default_orpo_lambda() -> f64 {
    0.1
}
fn default_loss_chunk() -> usize {
    512
}

impl Default for TrainConfig {
    fn default() -> Self {
        serde_yaml::from_value(serde_yaml::Value::Mapping(Default::default()))
            .expect("the defaults deserialize")
    }
}

impl TrainConfig {
    /// Defaults, overlaid by the YAML file (if any), overlaid by `overrides`
    /// (the flags that were given, keyed by field name).
    pub fn layered(file: Option<&Path>, overrides: serde_yaml::Mapping) -> Result<Self> {
        let mut merged = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config {}", path.display()))?;
                match serde_yaml::from_str::<serde_yaml::Value>(&text)
                    .with_context(|| format!("parsing config {}", path.display()))?
                {
                    serde_yaml::Value::Mapping(m) => m,
                    serde_yaml::Value::Null => Default::default(),
                    _ => bail!("config {} must be a mapping of options", path.display()),
                }
            }
            None => Default::default(),
        };
        for (k, v) in overrides {
            merge_value(&mut merged, k, v);
        }
        let cfg: TrainConfig = serde_yaml::from_value(serde_yaml::Value::Mapping(merged))
            .map_err(|e| anyhow::anyhow!("invalid training options: {e}"))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the values mlx-bun cannot run (zero sizes, an unsupported `fine_tune_type`, bad rates, `mask_prompt` with ORPO).
    pub fn validate(&self) -> Result<()> {
        if self.fine_tune_type != "lora" {
            bail!(
                "fine_tune_type {:?} is not supported (only \"lora\")",
                self.fine_tune_type
            );
        }
        let checks: [(&str, usize); 5] = [
            ("batch_size", self.batch_size),
            ("grad_accumulation_steps", self.grad_accumulation_steps),
            ("steps_per_eval", self.steps_per_eval),
            ("save_every", self.save_every),
            ("loss_chunk_tokens", self.loss_chunk_tokens),
        ];
        for (name, v) in checks {
            if v == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if self.max_seq_length < 2 {
            bail!("max_seq_length must be at least 2");
        }
        if self.lora_parameters.rank == 0 {
            bail!("lora_parameters.rank must be at least 1");
        }
        if !(0.0..1.0).contains(&self.lora_parameters.dropout) {
            bail!("lora_parameters.dropout must be in [0, 1)");
        }
        if !(self.learning_rate.is_finite() && self.learning_rate >= 0.0) {
            bail!("learning_rate must be a non-negative number");
        }
        if let Some(c) = self.grad_clip {
            if c.is_nan() || c <= 0.0 {
                bail!("grad_clip must be positive");
            }
        }
        if !self.orpo_lambda.is_finite() || self.orpo_lambda < 0.0 {
            bail!("orpo_lambda must be a non-negative number");
        }
        if self.method == Method::Orpo && self.mask_prompt {
            bail!("mask_prompt applies to SFT; ORPO chooses its NLL positions with sft_scope");
        }
        Ok(())
    }

    /// The settings of the chosen optimizer.
    pub(crate) fn optimizer_settings(&self) -> OptimizerSettings {
        let name = match self.optimizer {
            OptimizerKind::Adam => "adam",
            OptimizerKind::Adamw => "adamw",
            OptimizerKind::Sgd => "sgd",
        };
        self.optimizer_config.get(name).cloned().unwrap_or_default()
    }
}

/// Sets `key` in `map`, merging nested mappings (so `lora_parameters.rank`
/// from a flag keeps the file's `lora_parameters.keys`).
fn merge_value(map: &mut serde_yaml::Mapping, key: serde_yaml::Value, value: serde_yaml::Value) {
    match (map.get_mut(&key), value) {
        (Some(serde_yaml::Value::Mapping(existing)), serde_yaml::Value::Mapping(new)) => {
            for (k, v) in new {
                merge_value(existing, k, v);
            }
        }
        (_, value) => {
            map.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_mlx_lm() {
        let c = TrainConfig::default();
        assert_eq!(c.num_layers, 16);
        assert_eq!(c.lora_parameters.rank, 8);
        assert_eq!(c.lora_parameters.scale, 20.0);
        assert_eq!(c.batch_size, 4);
        assert_eq!(c.learning_rate, 1e-5);
        assert_eq!(c.method, Method::Sft);
        assert_eq!(c.sft_scope, SftScope::Full);
        assert_eq!(c.orpo_lambda, 0.1);
    }

    #[test]
    fn flags_override_file_and_nested_maps_merge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "iters: 7\nlearning_rate: 1e-4\nlora_parameters: {rank: 4, keys: [self_attn.q_proj]}\n",
        )
        .unwrap();
        let mut over = serde_yaml::Mapping::new();
        over.insert("iters".into(), 3.into());
        let mut lp = serde_yaml::Mapping::new();
        lp.insert("scale".into(), 2.0.into());
        over.insert("lora_parameters".into(), lp.into());
        let c = TrainConfig::layered(Some(&path), over).unwrap();
        assert_eq!(c.iters, 3);
        assert_eq!(c.learning_rate, 1e-4);
        assert_eq!(c.lora_parameters.rank, 4);
        assert_eq!(c.lora_parameters.scale, 2.0);
        assert_eq!(
            c.lora_parameters.keys.as_deref(),
            Some(&["self_attn.q_proj".to_string()][..])
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "itres: 7\n").unwrap();
        let err = TrainConfig::layered(Some(&path), Default::default()).unwrap_err();
        assert!(format!("{err:#}").contains("itres"), "{err:#}");
    }
}
