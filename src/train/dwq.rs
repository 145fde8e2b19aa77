//! DWQ (distilled weight quantization), as `mlx_lm.dwq`: a quantized student
//! learns only the scales and biases of its sub-8-bit layers, by matching
//! the full-precision teacher's top-k logits (KL at a temperature), with
//! Adam at a small learning rate on float32 master copies.
//!
//! Two phases keep teacher and student apart in memory: the teacher's
//! top-k logits and indices are written as safetensors shards first
//! (`<target_dir>/{valid,train}/<batch>.safetensors`), then the teacher is
//! dropped and the student trains from the shards.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, exp};
use mlx_rs::transforms::{eval, value_and_grad_with_argnums};
use mlx_rs::{Array, Dtype};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::batches::BatchOrder;
use super::config::{OptimizerKind, OptimizerSettings};
use super::optimizer::{Optimizer, Schedule};
use crate::autodiff::forward::TrainForward;
use crate::eval::perplexity::{encode_document, eos_id, token_losses};
use crate::lora::{block_linear, block_linear_mut, BLOCK_LINEARS};
use crate::model::layers::{with_differentiable_quantization, LinearWeight};
use crate::model::Model;
use crate::quant::QuantSpec;
use crate::tokenizer::Tokenizer;

/// Options, with `mlx_lm.dwq`'s defaults.
#[derive(Clone, Debug)]
pub struct DwqOptions {
    /// The full-precision teacher.
    pub teacher: PathBuf,
    /// An already quantized student; else the teacher quantized with `spec`.
    pub quantized_model: Option<PathBuf>,
    /// The student's quantization (`--bits`, `--group-size`; default 4 bits, group 64).
    pub spec: QuantSpec,
    /// Text documents (a file, folder or dataset id; see `eval::data`).
    pub data: String,
    /// Where the student model folder is written.
    pub mlx_path: PathBuf,
    /// Training documents to use (`--num-samples`, default 2048).
    pub num_samples: usize,
    /// Held-out documents for validation (`--num-valid-samples`, default 32).
    pub num_valid_samples: usize,
    /// Documents are cut to this many tokens (`--max-seq-length`, default 1025).
    pub max_seq_length: usize,
    /// Seed of the document shuffle (`--seed`, default 123).
    pub seed: u64,
    /// Adam's learning rate (`--learning-rate`, default 1e-6).
    pub learning_rate: f64,
    /// Rows per batch (`--batch-size`, default 4).
    pub batch_size: usize,
    /// Temperature of the distillation KL (`--temperature`, default 2).
    pub temperature: f32,
    /// Teacher logits kept per position (`--top-k`, default 1024).
    pub top_k: usize,
    /// Teacher targets; computed there when missing. `None`: a temporary
    /// folder beside `mlx_path`, removed at the end.
    pub target_dir: Option<PathBuf>,
    /// Write the targets and stop.
    pub targets_only: bool,
    /// Validate every this many steps (and before and after training).
    pub steps_per_eval: usize,
}

impl Default for DwqOptions {
    fn default() -> Self {
        Self {
            teacher: PathBuf::new(),
            quantized_model: None,
            spec: QuantSpec::affine(64, 4),
            data: String::new(),
            mlx_path: PathBuf::from("mlx_model"),
            num_samples: 2048,
            num_valid_samples: 32,
            max_seq_length: 1025,
            seed: 123,
            learning_rate: 1e-6,
            batch_size: 4,
            temperature: 2.0,
            top_k: 1024,
            target_dir: None,
            targets_only: false,
            steps_per_eval: 200,
        }
    }
}

/// What the run reports as it goes.
pub enum Event<'a> {
    /// A phase starts: `targets-valid`, `targets-train`, `validate`, `train`.
    Phase {
        /// The phase's name.
        name: &'a str,
        /// Batches it will process.
        total: usize,
    },
    /// One batch of the current phase is done.
    Progress {
        /// Batches of the phase done so far.
        done: usize,
    },
    /// A training step is done.
    Step {
        /// The step's number (1-based).
        iter: usize,
        /// The step's distillation loss (KL per token).
        loss: f32,
        /// Tokens in the step's batch.
        tokens: usize,
    },
    /// The student was validated after `iter` steps.
    Validation {
        /// Training steps done.
        iter: usize,
        /// KL to the teacher per held-out token.
        kl: f64,
        /// Perplexity of the held-out rows.
        perplexity: f64,
    },
}

/// Held-out quality of the student at one point.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Quality {
    /// KL divergence to the teacher's top-k distribution at the temperature
    /// (the validation loss), per token.
    pub kl: f64,
    /// Perplexity of the held-out rows.
    pub perplexity: f64,
}

/// What a DWQ run did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DwqSummary {
    /// Held-out quality of the student before training.
    pub before: Quality,
    /// Held-out quality of the student after training.
    pub after: Quality,
    /// The final validation loss is above the initial one.
    pub got_worse: bool,
    /// Training steps taken (one per batch).
    pub iters: usize,
    /// Tokens trained on.
    pub tokens: usize,
    /// Trained parameters (the scales and biases of the quantized layers).
    pub trainable_params: usize,
    /// Seconds the whole run took.
    pub seconds: f64,
    /// The student model's directory.
    pub output: PathBuf,
}

/// Token rows for training and validation: every document encoded (EOS
/// appended), shuffled by `seed`, the first `num_samples` for training, the
/// next `num_valid` for validation, each cut to `max_seq_length`.
pub(crate) fn split_rows(
    tok: &Tokenizer,
    docs: &[String],
    num_samples: usize,
    num_valid: usize,
    max_seq_length: usize,
    seed: u64,
) -> Result<(Rows, Rows)> {
    let eos = eos_id(tok)?;
    let mut order: Vec<usize> = (0..docs.len()).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let mut rows = Vec::new();
    for &i in order.iter().take(num_samples + num_valid) {
        let mut ids = encode_document(tok, eos, &docs[i])?;
        ids.truncate(max_seq_length);
        if ids.len() >= 2 {
            rows.push(ids);
        }
    }
    let n_train = num_samples.min(rows.len().saturating_sub(num_valid.min(rows.len() / 2)));
    let valid = rows.split_off(n_train);
    Ok((rows, valid))
}

/// Token rows.
pub type Rows = Vec<Vec<i32>>;

/// One padded batch `[rows, width]` (token 0 past each row's end).
#[derive(Clone, Debug)]
pub struct DwqBatch {
    /// The token ids, `rows * width` of them.
    pub tokens: Vec<i32>,
    /// Rows in the batch.
    pub rows: usize,
    /// Length of the longest row.
    pub width: usize,
    /// Each row's length before padding.
    pub lengths: Vec<usize>,
}

impl DwqBatch {
    /// Pads `rows` with token 0 to the longest.
    pub fn new(rows: &[&Vec<i32>]) -> Self {
        let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let mut tokens = vec![0i32; rows.len() * width];
        for (i, r) in rows.iter().enumerate() {
            tokens[i * width..i * width + r.len()].copy_from_slice(r);
        }
        Self {
            tokens,
            rows: rows.len(),
            width,
            lengths: rows.iter().map(|r| r.len()).collect(),
        }
    }

    /// The model inputs: the batch without its last column, `[rows, width - 1]`.
    pub fn inputs(&self) -> Array {
        let all = Array::from_slice(&self.tokens, &[self.rows as i32, self.width as i32]);
        all.index((.., ..self.width as i32 - 1))
    }

    /// 1 where position `t` has a next token (`t + 1 < length`, mlx-lm's mask).
    pub fn mask(&self) -> Array {
        let t = self.width - 1;
        let m: Vec<f32> = self
            .lengths
            .iter()
            .flat_map(|&len| (0..t).map(move |i| if i + 1 < len { 1.0 } else { 0.0 }))
            .collect();
        Array::from_slice(&m, &[self.rows as i32, t as i32])
    }
}

/// The batches of one epoch over `rows`, in the seeded order training uses.
pub fn epoch_batches(rows: &[Vec<i32>], batch_size: usize, seed: u64) -> Result<Vec<DwqBatch>> {
    let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
    let order = BatchOrder::new(&lengths, batch_size, seed, false)?;
    Ok(order
        .map(|idx| DwqBatch::new(&idx.iter().map(|&i| &rows[i]).collect::<Vec<_>>()))
        .collect())
}

/// The teacher's top-`k` logits (float32) and their vocabulary indices
/// (uint32) at every input position of `batch`, `[rows, width - 1, k]`.
pub(crate) fn teacher_targets(
    teacher: &Model,
    batch: &DwqBatch,
    k: usize,
) -> Result<(Array, Array)> {
    let mut caches = teacher.make_caches();
    let logits = teacher
        .decoder
        .forward(&batch.inputs(), &mut caches)?
        .as_dtype(Dtype::Float32)?;
    let vocab = *logits
        .shape()
        .last()
        .expect("logits have a vocabulary axis") as usize;
    let k = k.min(vocab);
    let idx =
        argpartition_axis(&logits, (vocab - k) as i32, -1)?.index((.., .., (vocab - k) as i32..));
    let top = logits.take_along_axis(&idx, -1)?;
    let idx = idx.as_dtype(Dtype::Uint32)?;
    eval([&top, &idx])?;
    Ok((top, idx))
}

fn shard_path(dir: &Path, split: &str, i: usize) -> PathBuf {
    dir.join(split).join(format!("{i:010}.safetensors"))
}

/// Whether `dir` holds targets for both splits.
pub(crate) fn has_targets(dir: &Path) -> bool {
    ["train", "valid"]
        .iter()
        .all(|s| shard_path(dir, s, 0).is_file())
}

/// Computes and writes the teacher's targets for `batches` of `split`.
pub fn write_targets(
    teacher: &Model,
    batches: &[DwqBatch],
    dir: &Path,
    split: &str,
    k: usize,
    on_event: &mut dyn FnMut(Event) -> Result<()>,
) -> Result<()> {
    let folder = dir.join(split);
    std::fs::create_dir_all(&folder)
        .with_context(|| format!("creating target folder {}", folder.display()))?;
    on_event(Event::Phase {
        name: if split == "train" {
            "targets-train"
        } else {
            "targets-valid"
        },
        total: batches.len(),
    })?;
    for (i, batch) in batches.iter().enumerate() {
        let (logits, indices) = teacher_targets(teacher, batch, k)?;
        // The token rows travel with the targets, so training can tell when
        // the data or the batching changed since they were written.
        let tokens = Array::from_slice(&batch.tokens, &[batch.rows as i32, batch.width as i32]);
        let path = shard_path(dir, split, i);
        Array::save_safetensors(
            [
                ("logits", &logits),
                ("indices", &indices),
                ("tokens", &tokens),
            ],
            None,
            &path,
        )
        .with_context(|| format!("writing {}", path.display()))?;
        on_event(Event::Progress { done: i + 1 })?;
    }
    Ok(())
}

/// Reads the targets of batch `i` of `split`, checking they belong to `batch`.
pub fn read_targets(dir: &Path, split: &str, i: usize, batch: &DwqBatch) -> Result<(Array, Array)> {
    let path = shard_path(dir, split, i);
    let mut map = Array::load_safetensors(&path)
        .map_err(|e| anyhow!("reading targets {}: {e}", path.display()))?;
    let mut take = |name: &str| {
        map.remove(name)
            .with_context(|| format!("targets {} have no {name:?} tensor", path.display()))
    };
    let logits = take("logits")?;
    let indices = take("indices")?;
    if let Ok(tokens) = take("tokens") {
        let same = tokens.shape() == [batch.rows as i32, batch.width as i32]
            && tokens.as_dtype(Dtype::Int32)?.as_slice::<i32>() == batch.tokens.as_slice();
        if !same {
            bail!(
                "targets {} were computed for other token rows (the data, --seed, \
                 --batch-size or --max-seq-length changed): delete the target folder",
                path.display()
            );
        }
    }
    Ok((
        logits.as_dtype(Dtype::Float32)?,
        indices.as_dtype(Dtype::Int32)?,
    ))
}

/// The tensors DWQ trains, by name: the scales and biases of every layer
/// quantized below 8 bits, and the RMS-norm weights, which `mlx_lm.dwq` also
/// leaves trainable (its quantized layers freeze themselves; nothing freezes
/// the norms).
pub fn trainable_tensors(model: &Model) -> Vec<String> {
    let mut quantized = Vec::new();
    let low = |w: &LinearWeight| matches!(w, LinearWeight::Quantized { spec, .. } if spec.bits < 8);
    if low(&model.decoder.embed_tokens.weight) {
        quantized.push("model.embed_tokens".to_string());
    }
    let mut norms = Vec::new();
    for (i, block) in model.decoder.layers.iter().enumerate() {
        for key in BLOCK_LINEARS {
            if block_linear(block, key).is_some_and(|l| low(&l.weight)) {
                quantized.push(format!("model.layers.{i}.{key}"));
            }
        }
        norms.push(format!("model.layers.{i}.input_layernorm"));
        norms.push(format!("model.layers.{i}.post_attention_layernorm"));
        if block.self_attn.q_norm.is_some() {
            norms.push(format!("model.layers.{i}.self_attn.q_norm"));
        }
        if block.self_attn.k_norm.is_some() {
            norms.push(format!("model.layers.{i}.self_attn.k_norm"));
        }
    }
    norms.push("model.norm".to_string());
    if model
        .decoder
        .lm_head
        .as_ref()
        .is_some_and(|l| low(&l.weight))
    {
        quantized.push("lm_head".to_string());
    }
    if quantized.is_empty() {
        return Vec::new();
    }
    let mut names: Vec<String> = quantized
        .iter()
        .flat_map(|q| [format!("{q}.scales"), format!("{q}.biases")])
        .collect();
    names.extend(norms.into_iter().map(|n| format!("{n}.weight")));
    names
}

/// The model's array behind tensor `name`.
fn tensor_mut<'m>(model: &'m mut Model, name: &str) -> Result<&'m mut Array> {
    let missing = || anyhow!("the model has no trainable tensor {name}");
    let (module, leaf) = name.rsplit_once('.').ok_or_else(missing)?;
    let d = &mut model.decoder;
    let norm = |d: &'m mut crate::model::decoder::Decoder| -> Option<&'m mut Array> {
        if module == "model.norm" {
            return Some(&mut d.norm.weight);
        }
        let (i, key) = module.strip_prefix("model.layers.")?.split_once('.')?;
        let block = d.layers.get_mut(i.parse::<usize>().ok()?)?;
        Some(match key {
            "input_layernorm" => &mut block.input_layernorm.weight,
            "post_attention_layernorm" => &mut block.post_attention_layernorm.weight,
            "self_attn.q_norm" => &mut block.self_attn.q_norm.as_mut()?.weight,
            "self_attn.k_norm" => &mut block.self_attn.k_norm.as_mut()?.weight,
            _ => return None,
        })
    };
    if leaf == "weight" {
        return norm(d).ok_or_else(missing);
    }
    let weight = if module == "model.embed_tokens" {
        Some(&mut d.embed_tokens.weight)
    } else if module == "lm_head" {
        d.lm_head.as_mut().map(|l| &mut l.weight)
    } else {
        module
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(i, key)| {
                let block = d.layers.get_mut(i.parse::<usize>().ok()?)?;
                block_linear_mut(block, key).map(|l| &mut l.weight)
            })
    };
    match (weight, leaf) {
        (Some(LinearWeight::Quantized { scales, .. }), "scales") => Ok(scales),
        (
            Some(LinearWeight::Quantized {
                biases: Some(biases),
                ..
            }),
            "biases",
        ) => Ok(biases),
        _ => Err(missing()),
    }
}

/// Float32 copies of the tensors `names` (the master copies Adam updates).
pub fn read_params(model: &Model, names: &[String]) -> Result<Vec<Array>> {
    let mut m = model.clone();
    names
        .iter()
        .map(|n| Ok(tensor_mut(&mut m, n)?.as_dtype(Dtype::Float32)?))
        .collect()
}

/// Puts `params` (from `read_params`) into `model`, in the model's dtype.
pub(crate) fn write_params(model: &mut Model, names: &[String], params: &[Array]) -> Result<()> {
    let dtype = model.dtype;
    for (name, p) in names.iter().zip(params) {
        *tensor_mut(model, name)? = p.as_dtype(dtype)?;
    }
    Ok(())
}

/// The DWQ loss of `batch` for the student with `params`: the mean over
/// real positions of `KL(teacher ‖ student)` on the teacher's top-k
/// entries, both scaled by `1 / temperature` (mlx-lm's `kl_div_loss`).
/// Returns `(loss, tokens)`.
pub fn dwq_loss(
    student: &Model,
    sites: &[String],
    params: &[Array],
    batch: &DwqBatch,
    targets: &(Array, Array),
    temperature: f32,
) -> Result<(Array, Array)> {
    let mut model = student.clone();
    write_params(&mut model, sites, params)?;
    let fwd = TrainForward {
        decoder: &model.decoder,
        checkpoint_from: None,
    };
    let (hidden, _) = fwd.hidden(&batch.inputs(), None, false)?;
    let logits = model.decoder.project(&hidden)?.as_dtype(Dtype::Float32)?;
    let (target_logits, ids) = targets;
    let picked = logits.take_along_axis(ids, -1)?;
    let s = 1.0 / temperature;
    let log_softmax = |x: &Array| -> Result<Array> {
        let x = x * s;
        let lse = x.logsumexp_axis(-1, true)?;
        Ok(&x - &lse)
    };
    let lq = log_softmax(&picked)?;
    let lp = log_softmax(target_logits)?;
    let kl = (&exp(&lp)? * &(&lp - &lq)).sum_axis(-1, false)?;
    let mask = batch.mask();
    let ntoks = mask.sum(None)?;
    let loss = &(&kl * &mask).sum(None)? / &ntoks;
    Ok((loss, ntoks))
}

/// Loss and gradients with respect to `params`.
pub fn loss_and_grads(
    student: &Model,
    sites: &[String],
    params: &[Array],
    batch: &DwqBatch,
    targets: &(Array, Array),
    temperature: f32,
) -> Result<(Array, Array, Vec<Array>)> {
    let f = |p: &[Array]| -> Result<Vec<Array>, Exception> {
        let (loss, n) = dwq_loss(student, sites, p, batch, targets, temperature)
            .map_err(|e| Exception::custom(format!("{e:#}")))?;
        Ok(vec![loss, n])
    };
    let argnums: Vec<i32> = (0..params.len() as i32).collect();
    let (values, grads) = with_differentiable_quantization(|| {
        let mut vg = value_and_grad_with_argnums(f, &argnums[..]);
        vg(params).map_err(|e| anyhow!("{}", e.what()))
    })?;
    let mut values = values.into_iter();
    let loss = values.next().expect("the loss");
    let n = values.next().expect("the token count");
    Ok((loss, n, grads))
}

/// What a validation pass reads: the validation batches with their teacher
/// targets on disk, the rows scored for perplexity, and the student's
/// trainable sites.
struct Validation<'a> {
    batches: &'a [DwqBatch],
    rows: &'a [Vec<i32>],
    target_dir: &'a Path,
    student: &'a Model,
    sites: &'a [String],
    temperature: f32,
}

impl Validation<'_> {
    /// KL to the teacher and perplexity on the validation data with `params`
    /// after `iter` training steps, reported as an [`Event::Validation`].
    fn run(
        &self,
        iter: usize,
        params: &[Array],
        on_event: &mut dyn FnMut(Event) -> Result<()>,
    ) -> Result<Quality> {
        let Self {
            batches: valid,
            rows,
            target_dir,
            student,
            sites,
            temperature,
        } = *self;
        on_event(Event::Phase {
            name: "validate",
            total: valid.len() + rows.len(),
        })?;
        let mut model = student.clone();
        write_params(&mut model, sites, params)?;
        let (mut kl_sum, mut n_sum) = (0.0f64, 0.0f64);
        for (i, batch) in valid.iter().enumerate() {
            let targets = read_targets(target_dir, "valid", i, batch)?;
            let (loss, n) = dwq_loss(&model, sites, params, batch, &targets, temperature)?;
            eval([&loss, &n])?;
            let n = n.item_cast::<f32>() as f64;
            kl_sum += loss.item_cast::<f32>() as f64 * n;
            n_sum += n;
            on_event(Event::Progress { done: i + 1 })?;
        }
        let (mut ce_sum, mut ce_n) = (0.0f64, 0usize);
        for (j, row) in rows.iter().enumerate() {
            let losses = token_losses(&model, std::slice::from_ref(row), 1, &mut |_, _| {})?;
            ce_sum += losses.iter().map(|&x| x as f64).sum::<f64>();
            ce_n += losses.len();
            on_event(Event::Progress {
                done: valid.len() + j + 1,
            })?;
        }
        let quality = Quality {
            kl: kl_sum / n_sum.max(1.0),
            perplexity: (ce_sum / ce_n.max(1) as f64).exp(),
        };
        on_event(Event::Validation {
            iter,
            kl: quality.kl,
            perplexity: quality.perplexity,
        })?;
        Ok(quality)
    }
}

/// Copies the files of model folder `src` into a new folder `dst`.
fn copy_model(src: &Path, dst: &Path) -> Result<()> {
    crate::convert::output::require_absent(dst)?;
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let to = dst.join(path.file_name().expect("a file has a name"));
            std::fs::copy(&path, &to)
                .with_context(|| format!("copying {} to {}", path.display(), to.display()))?;
        }
    }
    Ok(())
}

/// Writes the trained scales and biases into the safetensors files of `dir`.
fn save_params(dir: &Path, sites: &[String], params: &[Array]) -> Result<()> {
    let wanted: HashMap<&String, &Array> = sites.iter().zip(params).collect();
    let mut written = 0;
    for file in crate::model::weights::weight_files(dir)? {
        let (mut map, meta) = Array::load_safetensors_with_metadata(&file)
            .map_err(|e| anyhow!("reading {}: {e}", file.display()))?;
        let mut changed = false;
        for (name, value) in map.iter_mut() {
            if let Some(p) = wanted.get(name) {
                *value = p.as_dtype(value.dtype())?;
                changed = true;
                written += 1;
            }
        }
        if changed {
            let tmp = file.with_extension("dwq-partial.safetensors");
            Array::save_safetensors(map.iter(), &meta, &tmp)
                .map_err(|e| anyhow!("writing {}: {e}", tmp.display()))?;
            std::fs::rename(&tmp, &file)
                .with_context(|| format!("replacing {}", file.display()))?;
        }
    }
    if written != wanted.len() {
        bail!(
            "wrote {written} of {} trained tensors into {}",
            wanted.len(),
            dir.display()
        );
    }
    Ok(())
}

/// Runs DWQ as `opts` says. With `targets_only`, returns `None` after
/// writing the targets.
pub fn run(
    opts: &DwqOptions,
    on_event: &mut dyn FnMut(Event) -> Result<()>,
) -> Result<Option<DwqSummary>> {
    let started = Instant::now();
    if opts.batch_size == 0 || opts.top_k == 0 || opts.max_seq_length < 2 {
        bail!("--batch-size and the top-k must be positive, --max-seq-length at least 2");
    }
    if opts.temperature <= 0.0 {
        bail!("the temperature must be positive");
    }
    let tok = Tokenizer::load(&opts.teacher)?;
    let docs = crate::eval::data::load_documents(&opts.data)?;
    let (train_rows, valid_rows) = split_rows(
        &tok,
        &docs,
        opts.num_samples,
        opts.num_valid_samples,
        opts.max_seq_length,
        opts.seed,
    )?;
    let train = epoch_batches(&train_rows, opts.batch_size, opts.seed)
        .context("too little training data")?;
    let valid = epoch_batches(
        &valid_rows,
        opts.batch_size.min(valid_rows.len().max(1)),
        opts.seed,
    )
    .context("too little validation data")?;

    let temporary = opts.target_dir.is_none();
    let target_dir = match &opts.target_dir {
        Some(d) => d.clone(),
        None => {
            let mut name = opts.mlx_path.as_os_str().to_owned();
            name.push(".dwq-targets");
            PathBuf::from(name)
        }
    };
    if !has_targets(&target_dir) {
        let teacher = Model::load(&opts.teacher)?;
        write_targets(&teacher, &valid, &target_dir, "valid", opts.top_k, on_event)?;
        write_targets(&teacher, &train, &target_dir, "train", opts.top_k, on_event)?;
    }
    if opts.targets_only {
        return Ok(None);
    }

    match &opts.quantized_model {
        Some(q) => copy_model(q, &opts.mlx_path)?,
        None => {
            quantize_folder(&opts.teacher, &opts.mlx_path, opts.spec)?;
        }
    }
    let student = Model::load(&opts.mlx_path)?;
    student.refuse_recurrent_layers("DWQ")?;
    let sites = trainable_tensors(&student);
    if sites.is_empty() {
        bail!(
            "the student {} has no quantized layer below 8 bits to train",
            opts.mlx_path.display()
        );
    }
    let mut params = read_params(&student, &sites)?;
    let trainable_params = params.iter().map(|p| p.size()).sum();

    let validation = Validation {
        batches: &valid,
        rows: &valid_rows,
        target_dir: &target_dir,
        student: &student,
        sites: &sites,
        temperature: opts.temperature,
    };
    let before = validation.run(0, &params, on_event)?;
    let mut opt = Optimizer::new(
        OptimizerKind::Adam,
        &OptimizerSettings {
            bias_correction: Some(true),
            ..Default::default()
        },
        Schedule::Constant(opts.learning_rate),
    );
    let mut tokens = 0usize;
    for (it, batch) in train.iter().enumerate() {
        if it == 0 {
            on_event(Event::Phase {
                name: "train",
                total: train.len(),
            })?;
        }
        let targets = read_targets(&target_dir, "train", it, batch)?;
        let (loss, n, grads) =
            loss_and_grads(&student, &sites, &params, batch, &targets, opts.temperature)?;
        params = opt.update(&params, &grads)?;
        let mut outs: Vec<&Array> = vec![&loss, &n];
        outs.extend(params.iter());
        outs.extend(opt.state_arrays());
        eval(outs)?;
        let n = n.item_cast::<f32>() as usize;
        tokens += n;
        on_event(Event::Step {
            iter: it + 1,
            loss: loss.item_cast::<f32>(),
            tokens: n,
        })?;
        if (it + 1) % opts.steps_per_eval.max(1) == 0 && it + 1 < train.len() {
            validation.run(it + 1, &params, on_event)?;
            on_event(Event::Phase {
                name: "train",
                total: train.len(),
            })?;
            on_event(Event::Progress { done: it + 1 })?;
        }
    }
    let after = validation.run(train.len(), &params, on_event)?;
    save_params(&opts.mlx_path, &sites, &params)?;
    if temporary {
        let _ = std::fs::remove_dir_all(&target_dir);
    }
    Ok(Some(DwqSummary {
        before,
        after,
        got_worse: after.kl > before.kl,
        iters: train.len(),
        tokens,
        trainable_params,
        seconds: started.elapsed().as_secs_f64(),
        output: opts.mlx_path.clone(),
    }))
}

/// Writes `teacher` quantized with affine `spec` (float32 scales) to `out`:
/// the plain-quantized student DWQ starts from.
pub fn quantize_folder(teacher: &Path, out: &Path, spec: QuantSpec) -> Result<()> {
    use crate::convert::hf::{convert, HfOptions, QuantRecipe};
    convert(
        teacher,
        &HfOptions {
            output: out.to_path_buf(),
            dtype: Some(Dtype::Float32),
            quantize: Some(QuantRecipe {
                mode: crate::quant::QuantMode::Affine,
                group_size: Some(spec.group_size),
                bits: Some(spec.bits),
                mixed: None,
            }),
            dequantize: false,
            base_model: None,
        },
        &mut |_| {},
    )?;
    Ok(())
}
