//! The training loop: batches, loss and gradients over the adapter arrays,
//! gradient accumulation and clipping, optimizer updates, validation,
//! checkpoints. Progress goes to an event callback (bar, JSON lines, eval DB).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::error::Exception;
use mlx_rs::transforms::{eval, value_and_grad_with_argnums};
use mlx_rs::Array;

use super::batches::{pad_sft, BatchOrder};
use super::config::{Method, TrainConfig};
use super::data::{Examples, Splits};
use super::losses::sft_loss;
use super::optimizer::{clip_grad_norm, Optimizer, Schedule};
use super::orpo::{orpo_loss, OrpoTerms};
use crate::adapters;
use crate::autodiff::forward::TrainForward;
use crate::dataset_rows::{PreferenceExample, SftExample};
use crate::lora::AdapterLayout;
use crate::model::Model;

/// The ORPO components of a loss, as numbers.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct OrpoValues {
    /// The negative log-likelihood term.
    pub nll: f32,
    /// The odds-ratio term `-log σ(log_odds)`.
    pub or: f32,
    /// The log odds ratio of chosen to rejected.
    pub log_odds: f32,
    /// Mean per-token log-probability of the chosen responses.
    pub chosen_logp: f32,
    /// Mean per-token log-probability of the rejected responses.
    pub rejected_logp: f32,
    /// The weight λ of the odds-ratio term (`orpo_lambda`).
    pub lambda: f64,
}

impl OrpoValues {
    fn read(terms: &OrpoTerms, lambda: f64) -> Self {
        Self {
            nll: terms.nll.item_cast(),
            or: terms.or.item_cast(),
            log_odds: terms.log_odds.item_cast(),
            chosen_logp: terms.chosen_logp.item_cast(),
            rejected_logp: terms.rejected_logp.item_cast(),
            lambda,
        }
    }

    fn scaled_add(&mut self, other: &Self, w: f32) {
        self.nll += w * other.nll;
        self.or += w * other.or;
        self.log_odds += w * other.log_odds;
        self.chosen_logp += w * other.chosen_logp;
        self.rejected_logp += w * other.rejected_logp;
        self.lambda = other.lambda;
    }
}

/// One training step, as reported.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepReport {
    /// The iteration (1-based).
    pub iter: usize,
    /// The step's training loss.
    pub loss: f32,
    /// The ORPO components, with `--method orpo`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub orpo: Option<OrpoValues>,
    /// Tokens in the step's batch.
    pub tokens: usize,
    /// Tokens per second over the step.
    pub tokens_per_sec: f64,
    /// Seconds the step took.
    pub step_seconds: f64,
    /// The learning rate the step used.
    pub learning_rate: f64,
    /// MLX's peak memory in bytes since training started.
    pub peak_memory_bytes: usize,
    /// Set on steps that applied an update with clipping enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f32>,
}

/// One validation or test evaluation, as reported.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EvalReport {
    /// Training iterations done before it.
    pub iter: usize,
    /// `valid` or `test`.
    pub split: &'static str,
    /// The loss over the evaluated batches.
    pub loss: f32,
    /// The ORPO components, with `--method orpo`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub orpo: Option<OrpoValues>,
    /// Batches evaluated.
    pub batches: usize,
    /// Seconds the evaluation took.
    pub seconds: f64,
}

/// What the training loop reports as it goes.
pub enum Event<'a> {
    /// Training starts.
    Start {
        /// Trainable (adapter) parameters.
        trainable_params: usize,
        /// Transformer blocks with adapters.
        adapted_layers: usize,
        /// Examples in `train.jsonl`.
        train_examples: usize,
    },
    /// A training step is done.
    Step(&'a StepReport),
    /// A validation or test evaluation is done.
    Eval(&'a EvalReport),
    /// Adapters were saved to this file.
    Saved(&'a Path),
}

/// What a training run did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainSummary {
    /// Iterations run.
    pub iters: usize,
    /// The last training loss.
    pub final_loss: Option<f32>,
    /// The last validation loss.
    pub final_val_loss: Option<f32>,
    /// The test loss, with `--test`.
    pub test_loss: Option<f32>,
    /// Tokens trained on.
    pub tokens: usize,
    /// Seconds the run took.
    pub seconds: f64,
    /// MLX's peak memory in bytes over the run.
    pub peak_memory_bytes: usize,
    /// The final adapter file (`adapters.safetensors` in the adapter path).
    pub adapter_file: PathBuf,
}

/// One step's batch.
enum Batch {
    Sft(super::batches::SftBatch),
    Pairs(Vec<PreferenceExample>),
}

/// Model with adapters and everything needed to compute losses.
pub struct Trainer {
    /// The model, with the adapters attached.
    pub model: Model,
    /// Where the adapters sit and their rank and scale.
    pub layout: AdapterLayout,
    /// The adapter arrays being trained, in the layout's order.
    pub params: Vec<Array>,
    cfg: TrainConfig,
    checkpoint_from: Option<usize>,
}

fn to_exception(e: anyhow::Error) -> Exception {
    Exception::custom(format!("{e:#}"))
}

impl Trainer {
    /// Attaches fresh (or resumed) adapters to `model` as `cfg` asks.
    pub fn new(model: Model, cfg: &TrainConfig) -> Result<Self> {
        cfg.validate()?;
        let layout = AdapterLayout::new(&model, cfg.num_layers, &cfg.lora_parameters)?;
        let mut params = layout.init_params(&model, cfg.seed)?;
        if let Some(file) = &cfg.resume_adapter_file {
            params = adapters::load_params(&model, &layout, file, Some(&params))
                .with_context(|| format!("resuming from {}", file.display()))?;
        }
        if cfg.grad_checkpoint && layout.dropout > 0.0 {
            bail!(
                "LoRA dropout cannot be combined with --grad-checkpoint \
                 (the recomputed pass would draw other masks)"
            );
        }
        mlx_rs::random::seed(cfg.seed)?;
        let checkpoint_from = cfg
            .grad_checkpoint
            .then(|| layout.sites.iter().map(|s| s.block).min())
            .flatten();
        let mut model = model;
        layout.set_params(&mut model, &params)?;
        Ok(Self {
            model,
            layout,
            params,
            cfg: cfg.clone(),
            checkpoint_from,
        })
    }

    fn forward<'m>(&self, model: &'m Model) -> TrainForward<'m> {
        TrainForward {
            decoder: &model.decoder,
            checkpoint_from: self.checkpoint_from,
        }
    }

    /// Loss terms for `batch` with the adapters in `params`, and the tokens
    /// the batch holds. Differentiable in `params`.
    fn loss_terms(
        &self,
        params: &[Array],
        batch: &Batch,
        training: bool,
    ) -> Result<(Vec<Array>, usize)> {
        let mut model = self.model.clone();
        if training {
            self.layout.set_training_params(&mut model, params)?;
        } else {
            self.layout.set_params(&mut model, params)?;
        }
        let fwd = self.forward(&model);
        let chunk = self.cfg.loss_chunk_tokens;
        match batch {
            Batch::Sft(b) => {
                let remat = b.supervised_count() > chunk;
                let (loss, _) = sft_loss(&fwd, b, chunk, remat)?;
                Ok((vec![loss], b.num_tokens()))
            }
            Batch::Pairs(pairs) => {
                let longest = pairs
                    .iter()
                    .map(|p| p.prompt.len() + p.chosen.len() + p.rejected.len())
                    .max()
                    .unwrap_or(0);
                let refs: Vec<&PreferenceExample> = pairs.iter().collect();
                let (terms, tokens) = orpo_loss(
                    &fwd,
                    &refs,
                    self.cfg.orpo_lambda as f32,
                    self.cfg.sft_scope,
                    chunk,
                    longest > chunk,
                )?;
                Ok((terms.into_vec(), tokens))
            }
        }
    }

    /// Loss terms and their gradients with respect to the adapter arrays.
    fn value_and_grad(&self, batch: &Batch) -> Result<(Vec<Array>, Vec<Array>, usize)> {
        let mut tokens = 0;
        let f = |params: &[Array]| -> Result<Vec<Array>, Exception> {
            let (values, n) = self.loss_terms(params, batch, true).map_err(to_exception)?;
            tokens = n;
            Ok(values)
        };
        let argnums: Vec<i32> = (0..self.params.len() as i32).collect();
        let mut vg = value_and_grad_with_argnums(f, &argnums[..]);
        let (values, grads) = vg(&self.params).map_err(|e| anyhow!("{}", e.what()))?;
        drop(vg);
        Ok((values, grads, tokens))
    }

    /// The loss of `batch` (no gradients), as numbers.
    fn eval_batch(&self, batch: &Batch) -> Result<(f32, Option<OrpoValues>, usize)> {
        let (values, tokens) = self.loss_terms(&self.params, batch, false)?;
        eval(values.iter())?;
        let loss = values[0].item_cast::<f32>();
        let orpo = (values.len() > 1)
            .then(|| OrpoValues::read(&OrpoTerms::from_slice(&values), self.cfg.orpo_lambda));
        Ok((loss, orpo, tokens))
    }

    /// Mean loss over up to `max_batches` batches of `examples` (-1: all).
    pub fn evaluate(
        &self,
        examples: &Examples,
        max_batches: i64,
    ) -> Result<(f32, Option<OrpoValues>, usize)> {
        let order = batch_order(examples, self.cfg.batch_size, self.cfg.seed, false)?;
        let limit = if max_batches < 0 {
            usize::MAX
        } else {
            max_batches as usize
        };
        let mut loss_sum = 0.0f64;
        let mut weight_sum = 0.0f64;
        let mut orpo_sum: Option<OrpoValues> = None;
        let mut batches = 0;
        for idx in order.take(limit) {
            let batch = make_batch(examples, &idx, self.cfg.max_seq_length);
            let (loss, orpo, _) = self.eval_batch(&batch)?;
            // SFT averages over tokens (as mlx-lm), ORPO over pairs.
            let w = match &batch {
                Batch::Sft(b) => b.supervised_count() as f64,
                Batch::Pairs(p) => p.len() as f64,
            };
            loss_sum += loss as f64 * w;
            weight_sum += w;
            if let Some(o) = orpo {
                orpo_sum
                    .get_or_insert_with(OrpoValues::default)
                    .scaled_add(&o, w as f32);
            }
            batches += 1;
        }
        if batches == 0 {
            bail!(
                "no complete batch to evaluate (batch_size {})",
                self.cfg.batch_size
            );
        }
        let mean = (loss_sum / weight_sum) as f32;
        let orpo = orpo_sum.map(|sum| {
            let mut mean = OrpoValues::default();
            mean.scaled_add(&sum, (1.0 / weight_sum) as f32);
            mean
        });
        Ok((mean, orpo, batches))
    }

    /// Writes the current adapter tensors to `file`, atomically: a reader
    /// (or a resumed run after a crash) sees the previous complete file or
    /// the new complete one, never a torn write.
    pub fn save(&self, file: &Path) -> Result<()> {
        save_atomically(file, |tmp| {
            adapters::save_params(&self.layout, &self.params, tmp)
        })
    }

    /// Options as stored in `adapter_config.json`.
    pub fn adapter_config(&self) -> Result<serde_json::Value> {
        let mut v = serde_json::to_value(&self.cfg)?;
        let obj = v.as_object_mut().expect("a struct serializes to an object");
        let keys: Vec<String> = {
            let mut keys: Vec<String> = Vec::new();
            for s in &self.layout.sites {
                if !keys.contains(&s.key) {
                    keys.push(s.key.clone());
                }
            }
            keys
        };
        obj.insert(
            "lora_parameters".into(),
            serde_json::json!({
                "rank": self.layout.rank,
                "scale": self.layout.scale,
                "dropout": self.layout.dropout,
                "keys": keys,
            }),
        );
        obj.insert("fine_tune_type".into(), "lora".into());
        obj.insert(
            "model".into(),
            self.cfg
                .model
                .clone()
                .unwrap_or_else(|| self.model.path.display().to_string())
                .into(),
        );
        Ok(v)
    }
}

fn batch_order(
    examples: &Examples,
    batch_size: usize,
    seed: u64,
    looping: bool,
) -> Result<BatchOrder> {
    let lengths: Vec<usize> = match examples {
        Examples::Sft(v) => v.iter().map(|e| e.tokens.len()).collect(),
        Examples::Preference(v) => v.iter().map(PreferenceExample::longest).collect(),
    };
    BatchOrder::new(&lengths, batch_size, seed, looping)
}

fn make_batch(examples: &Examples, idx: &[usize], max_seq_length: usize) -> Batch {
    match examples {
        Examples::Sft(v) => {
            let rows: Vec<&SftExample> = idx.iter().map(|&i| &v[i]).collect();
            Batch::Sft(pad_sft(&rows, max_seq_length))
        }
        Examples::Preference(v) => {
            let pairs: Vec<PreferenceExample> =
                idx.iter().map(|&i| v[i].fit(max_seq_length)).collect();
            if idx.iter().any(|&i| v[i].longest() > max_seq_length) {
                tracing::warn!(
                    "some preference pairs are longer than {max_seq_length} tokens and are truncated"
                );
            }
            Batch::Pairs(pairs)
        }
    }
}

/// Trains adapters on `splits` as `cfg` says, reporting through `on_event`.
/// Adapters are written to `cfg.adapter_path`.
pub fn train(
    model: Model,
    splits: &Splits,
    cfg: &TrainConfig,
    on_event: &mut dyn FnMut(Event) -> Result<()>,
) -> Result<(Trainer, TrainSummary)> {
    let mut trainer = Trainer::new(model, cfg)?;
    let kind_ok = matches!(
        (&splits.train, cfg.method),
        (Examples::Sft(_), Method::Sft) | (Examples::Preference(_), Method::Orpo)
    );
    if !kind_ok {
        bail!("the data does not match the training method");
    }
    let dir = &cfg.adapter_path;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    adapters::write_config(dir, &trainer.adapter_config()?)?;
    let adapter_file = dir.join(adapters::WEIGHTS_FILE);

    let schedule = Schedule::from_config(cfg.learning_rate, cfg.lr_schedule.as_ref())?;
    let mut optimizer = Optimizer::new(cfg.optimizer, &cfg.optimizer_settings(), schedule);
    on_event(Event::Start {
        trainable_params: trainer.layout.num_params(&trainer.model),
        adapted_layers: trainer
            .layout
            .sites
            .iter()
            .map(|s| s.layer)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        train_examples: splits.train.len(),
    })?;

    crate::mlx_ext::reset_peak_memory();
    let started = Instant::now();
    let mut order = batch_order(&splits.train, cfg.batch_size, cfg.seed, true)?;
    let mut accumulated: Option<Vec<Array>> = None;
    let mut summary = TrainSummary {
        iters: 0,
        final_loss: None,
        final_val_loss: None,
        test_loss: None,
        tokens: 0,
        seconds: 0.0,
        peak_memory_bytes: 0,
        adapter_file: adapter_file.clone(),
    };
    for it in 1..=cfg.iters {
        if let Some(valid) = splits.valid.as_ref().filter(|_| cfg.val_batches != 0) {
            if it == 1 || it % cfg.steps_per_eval == 0 || it == cfg.iters {
                let tic = Instant::now();
                let (loss, orpo, batches) = trainer.evaluate(valid, cfg.val_batches)?;
                summary.final_val_loss = Some(loss);
                on_event(Event::Eval(&EvalReport {
                    iter: it - 1,
                    split: "valid",
                    loss,
                    orpo,
                    batches,
                    seconds: tic.elapsed().as_secs_f64(),
                }))?;
            }
        }

        let tic = Instant::now();
        let idx = order.next().expect("the batch order loops");
        let batch = make_batch(&splits.train, &idx, cfg.max_seq_length);
        let learning_rate = optimizer.learning_rate();
        let (values, grads, tokens) = trainer.value_and_grad(&batch)?;
        let grads = match accumulated.take() {
            Some(prev) => prev.iter().zip(&grads).map(|(a, b)| a + b).collect(),
            None => grads,
        };
        let mut grad_norm = None;
        if it % cfg.grad_accumulation_steps == 0 {
            let mut grads = grads;
            if cfg.grad_accumulation_steps > 1 {
                let k = cfg.grad_accumulation_steps as f32;
                grads = grads.iter().map(|g| g / k).collect();
            }
            if let Some(max) = cfg.grad_clip {
                let (clipped, norm) = clip_grad_norm(&grads, max)?;
                grads = clipped;
                grad_norm = Some(norm);
            }
            trainer.params = optimizer.update(&trainer.params, &grads)?;
            let mut pending: Vec<&Array> = values.iter().collect();
            pending.extend(trainer.params.iter());
            pending.extend(optimizer.state_arrays());
            if let Some(n) = &grad_norm {
                pending.push(n);
            }
            eval(pending)?;
        } else {
            let mut pending: Vec<&Array> = values.iter().collect();
            pending.extend(grads.iter());
            eval(pending)?;
            accumulated = Some(grads);
        }
        let step_seconds = tic.elapsed().as_secs_f64();
        let loss = values[0].item_cast::<f32>();
        if !loss.is_finite() {
            bail!("the loss became {loss} at iteration {it}; try a lower learning rate");
        }
        let orpo = (values.len() > 1)
            .then(|| OrpoValues::read(&OrpoTerms::from_slice(&values), cfg.orpo_lambda));
        let report = StepReport {
            iter: it,
            loss,
            orpo,
            tokens,
            tokens_per_sec: tokens as f64 / step_seconds.max(1e-9),
            step_seconds,
            learning_rate,
            peak_memory_bytes: crate::mlx_ext::peak_memory_bytes(),
            grad_norm: grad_norm.map(|n| n.item_cast::<f32>()),
        };
        summary.iters = it;
        summary.final_loss = Some(loss);
        summary.tokens += tokens;
        on_event(Event::Step(&report))?;

        if it % cfg.save_every == 0 {
            trainer
                .layout
                .set_params(&mut trainer.model, &trainer.params)?;
            trainer.save(&adapter_file)?;
            let numbered = dir.join(format!("{it:07}_adapters.safetensors"));
            trainer.save(&numbered)?;
            on_event(Event::Saved(&numbered))?;
        }
    }
    trainer
        .layout
        .set_params(&mut trainer.model, &trainer.params)?;
    trainer.save(&adapter_file)?;
    on_event(Event::Saved(&adapter_file))?;

    if cfg.test {
        let test = splits
            .test
            .as_ref()
            .ok_or_else(|| anyhow!("--test needs a non-empty test.jsonl"))?;
        let tic = Instant::now();
        let (loss, orpo, batches) = trainer.evaluate(test, cfg.test_batches)?;
        summary.test_loss = Some(loss);
        on_event(Event::Eval(&EvalReport {
            iter: summary.iters,
            split: "test",
            loss,
            orpo,
            batches,
            seconds: tic.elapsed().as_secs_f64(),
        }))?;
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary.peak_memory_bytes = crate::mlx_ext::peak_memory_bytes();
    Ok((trainer, summary))
}

/// The temporary name a checkpoint is written under before it is renamed
/// into place (same folder, so the rename is atomic; it keeps the
/// `.safetensors` suffix, which MLX would otherwise append).
pub fn partial_path(file: &Path) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    file.with_file_name(format!(".{name}.partial.safetensors"))
}

/// Writes through `write` into a temporary file beside `file`, flushes it to
/// disk, renames it over `file` and flushes the folder entry.
fn save_atomically(file: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = partial_path(file);
    let result = write(&tmp).and_then(|()| {
        let sync = |p: &Path| -> std::io::Result<()> { std::fs::File::open(p)?.sync_all() };
        sync(&tmp).with_context(|| format!("flushing {}", tmp.display()))?;
        std::fs::rename(&tmp, file)
            .with_context(|| format!("renaming {} to {}", tmp.display(), file.display()))?;
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            sync(dir).with_context(|| format!("flushing {}", dir.display()))?;
        }
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
