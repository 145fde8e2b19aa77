//! One entry that assembles what runs a model: the model (adapters applied,
//! read onto the device), its tokenizer, a drafter for speculative decoding
//! (a draft model or prompt lookup), validated KV-cache settings, and the
//! memory check that runs before any weight loads.
//!
//! The CLI's commands and the server's model pool describe what they want
//! in a [`RuntimeSpec`] and call [`Runtime::assemble`]; every setting is
//! checked here, where the thing it sets is built, and a setting that cannot
//! be honoured is an error.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::cache::{KvCache, KvSettings};
use crate::fit::FitReport;
use crate::mlx_ext::ComputeDtype;
use crate::model::Model;
use crate::sampling::SamplingParams;
use crate::speculative::{check_draft_tokenizer, DraftSource, ModelDrafter, NgramDrafter};
use crate::tokenizer::Tokenizer;

/// Where speculative decoding's drafts come from (`--draft-model`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftSpec {
    /// A draft model's directory; it must share the target's tokenizer.
    Model(PathBuf),
    /// Prompt lookup (`--draft-model ngram`): drafts copied from the
    /// history, no model.
    Ngram,
}

/// The memory check before loading: the model (and its draft) must hold
/// `context` tokens in the available memory, less `reserved_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitCheck {
    /// Tokens one sequence must hold (prompt and generation).
    pub context: usize,
    /// Bytes set aside for other things (the server's prompt cache).
    pub reserved_bytes: u64,
}

/// What to assemble.
#[derive(Clone, Debug)]
pub struct RuntimeSpec {
    /// The model directory (already resolved: a local folder).
    pub model_dir: PathBuf,
    /// `--compute-dtype`, for the model and its draft.
    pub compute: ComputeDtype,
    /// A LoRA adapter directory (`--adapter-path`) applied to the model.
    pub adapter: Option<PathBuf>,
    /// The drafter for speculative decoding (`--draft-model`).
    pub draft: Option<DraftSpec>,
    /// Tokens a drafter proposes per verification step (`--num-draft-tokens`).
    pub num_draft_tokens: usize,
    /// How KV caches are built (`--max-kv-size`, `--kv-bits`, …).
    pub kv: KvSettings,
    /// The memory check before loading; `None` runs none (the caller turned
    /// it off, or the model is split across ranks).
    pub fit: Option<FitCheck>,
    /// Read every weight onto the device once loaded, as mlx-lm's `load`
    /// does; off where the caller splits the model across ranks first or
    /// warms it up itself.
    pub materialize: bool,
}

impl RuntimeSpec {
    /// The model in `model_dir` alone: no adapters, no draft, dense KV
    /// caches, no memory check, read onto the device once loaded.
    pub fn new(model_dir: PathBuf, compute: ComputeDtype) -> Self {
        Self {
            model_dir,
            compute,
            adapter: None,
            draft: None,
            num_draft_tokens: crate::speculative::DEFAULT_NUM_DRAFT_TOKENS,
            kv: KvSettings::default(),
            fit: None,
            materialize: true,
        }
    }
}

/// A drafter's source, loaded.
pub enum Draft {
    /// A draft model, with what the tokenizer check warned about (a
    /// vocabulary size that differs from the target's).
    Model {
        /// The draft model, loaded.
        model: Box<Model>,
        /// What the tokenizer check warned about, if anything.
        warning: Option<String>,
    },
    /// Prompt lookup.
    Ngram,
}

/// What [`Runtime::assemble`] puts together.
pub struct Runtime {
    /// The model that generates.
    pub model: Model,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The drafter for speculative decoding, when one was asked for.
    pub draft: Option<Draft>,
    /// Tokens a drafter proposes per verification step.
    pub num_draft_tokens: usize,
    /// KV-cache settings, checked against the model.
    pub kv: KvSettings,
    /// The memory check's report; `None` where it did not run or the
    /// available memory is unknown.
    pub fit: Option<FitReport>,
}

/// Why a spec was refused before any weight loaded, by step.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The draft model's tokenizer differs from the target's.
    Draft(anyhow::Error),
    /// The model (and draft) does not fit in the available memory.
    Fit(anyhow::Error),
    /// Anything else: the KV settings, reading the draft's tokenizer.
    Other(anyhow::Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Draft(e) | Refusal::Fit(e) | Refusal::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for Refusal {}

/// A spec whose checks before loading passed; [`Prepared::load`] loads it.
/// Its model may be loaded on another thread than the one that checked it.
pub(crate) struct Prepared {
    spec: RuntimeSpec,
    pub(crate) tokenizer: Arc<Tokenizer>,
    /// What the draft tokenizer check warned about.
    pub(crate) draft_warning: Option<String>,
    fit: Option<FitReport>,
}

impl Runtime {
    /// Checks `spec` and loads what it names, in this order: the KV
    /// settings, the draft model's tokenizer against `tokenizer` (the
    /// target's), the memory check, then the model, its adapters, the
    /// draft model, and the KV settings against the model.
    pub fn assemble(spec: &RuntimeSpec, tokenizer: impl Into<Arc<Tokenizer>>) -> Result<Self> {
        Self::prepare(spec, tokenizer)?.load()
    }

    /// The checks of [`Runtime::assemble`] that come before any weight
    /// loads.
    pub(crate) fn prepare(
        spec: &RuntimeSpec,
        tokenizer: impl Into<Arc<Tokenizer>>,
    ) -> Result<Prepared, Refusal> {
        let tokenizer = tokenizer.into();
        spec.kv.validate().map_err(Refusal::Other)?;
        let draft_dir = match &spec.draft {
            Some(DraftSpec::Model(dir)) => Some(dir.as_path()),
            Some(DraftSpec::Ngram) | None => None,
        };
        let draft_warning = match draft_dir {
            Some(dir) => {
                let draft_tokenizer = Tokenizer::load(dir).map_err(Refusal::Other)?;
                check_draft_tokenizer(&tokenizer, &draft_tokenizer).map_err(Refusal::Draft)?
            }
            None => None,
        };
        let fit = match &spec.fit {
            Some(check) => crate::fit::check_fits(
                &spec.model_dir,
                draft_dir,
                spec.compute,
                check.context,
                spec.num_draft_tokens,
                check.reserved_bytes,
            )
            .map_err(Refusal::Fit)?,
            None => None,
        };
        Ok(Prepared {
            spec: spec.clone(),
            tokenizer,
            draft_warning,
            fit,
        })
    }

    /// Fresh KV caches for one sequence, as [`Runtime::kv`] asks.
    pub fn make_caches(&self) -> Result<Vec<Box<dyn KvCache>>> {
        self.model
            .decoder
            .make_caches_with(self.kv.max_kv_size, self.kv.quantization)
    }

    /// A drafter over the loaded draft (`None` without one), sampling its
    /// proposals as `sampling` asks.
    pub fn drafter(&self, sampling: &SamplingParams) -> Result<Option<Box<dyn DraftSource + '_>>> {
        Ok(match &self.draft {
            None => None,
            Some(Draft::Ngram) => Some(Box::new(NgramDrafter::default())),
            Some(Draft::Model { model, .. }) => Some(Box::new(ModelDrafter::new(model, sampling)?)),
        })
    }
}

impl Prepared {
    /// Loads the model, applies its adapters, loads the draft model, and
    /// checks the KV settings against the model.
    pub(crate) fn load(self) -> Result<Runtime> {
        let spec = &self.spec;
        let mut model = Model::load_as(&spec.model_dir, spec.compute)?;
        if let Some(adapter) = &spec.adapter {
            crate::adapters::apply(&mut model, adapter)
                .with_context(|| format!("applying adapters {}", adapter.display()))?;
        }
        if spec.materialize {
            model.materialize()?;
        }
        let draft = match &spec.draft {
            None => None,
            Some(DraftSpec::Ngram) => Some(Draft::Ngram),
            Some(DraftSpec::Model(dir)) => {
                let draft = Model::load_as(dir, spec.compute).context("loading the draft model")?;
                if spec.materialize {
                    draft.materialize()?;
                }
                Some(Draft::Model {
                    model: Box::new(draft),
                    warning: self.draft_warning,
                })
            }
        };
        model.decoder.check_kv(&spec.kv)?;
        Ok(Runtime {
            model,
            tokenizer: self.tokenizer,
            draft,
            num_draft_tokens: spec.num_draft_tokens,
            kv: spec.kv,
            fit: self.fit,
        })
    }
}
