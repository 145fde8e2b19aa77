//! Speculative decoding with mlx-lm's semantics: a drafter proposes up to `n`
//! tokens, the target scores `[pending, ...drafts]` in one forward pass, the
//! longest prefix where the target's own sample equals the draft is accepted,
//! and the target's sample at the first mismatch (or after the last draft) is
//! emitted as well. Both caches are then trimmed to the accepted tokens.
//!
//! With a grammar the walk is constrained: position `i` is sampled under the
//! mask of the matcher state after the tokens accepted so far, so every
//! emitted token is one the grammar allows; the matcher only advances on
//! emitted tokens.

use anyhow::{bail, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::async_eval;
use mlx_rs::Array;

use crate::cache::{total_bytes, trim_all, KvCache};
use crate::constraint::TokenConstraint;
use crate::generate::{apply_mask, prefill};
use crate::model::Model;
use crate::sampling::{log_softmax, Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;

/// Tokens a drafter proposes per verification step unless set otherwise (mlx-lm's
/// `num_draft_tokens`).
pub const DEFAULT_NUM_DRAFT_TOKENS: usize = 3;

/// Anything that can propose continuations for the verify loop.
pub trait DraftSource {
    /// Sees the prompt (all but its last token) before the first round.
    fn prefill(&mut self, tokens: &[u32], prefill_step: usize) -> Result<()>;
    /// Proposes up to `n` tokens following `history` (prompt and every
    /// emitted token). Returns a `[k]` uint32 array, `k <= n`, which may still
    /// be lazy; `None` when there is nothing to propose. With a `guide` (the
    /// row's grammar after `history`) only tokens it allows are proposed; the
    /// guide itself is left where it was.
    fn draft(
        &mut self,
        history: &[u32],
        n: usize,
        guide: Option<&mut dyn TokenConstraint>,
    ) -> Result<Option<Array>>;
    /// Told after verification how many of the `drafted` tokens were accepted.
    fn rewind(&mut self, drafted: usize, accepted: usize) -> Result<()>;
    /// Device bytes held (weights and cache), for memory admission.
    fn resident_bytes(&self) -> usize;
    /// A short label of the drafter: `model:<path>` or `ngram`.
    fn name(&self) -> String;
}

impl<D: DraftSource + ?Sized> DraftSource for &mut D {
    fn prefill(&mut self, tokens: &[u32], prefill_step: usize) -> Result<()> {
        (**self).prefill(tokens, prefill_step)
    }

    fn draft(
        &mut self,
        history: &[u32],
        n: usize,
        guide: Option<&mut dyn TokenConstraint>,
    ) -> Result<Option<Array>> {
        (**self).draft(history, n, guide)
    }

    fn rewind(&mut self, drafted: usize, accepted: usize) -> Result<()> {
        (**self).rewind(drafted, accepted)
    }

    fn resident_bytes(&self) -> usize {
        (**self).resident_bytes()
    }

    fn name(&self) -> String {
        (**self).name()
    }
}

/// Drafting with a second, cheaper model sharing the target's tokenizer.
pub struct ModelDrafter<'m> {
    model: &'m Model,
    caches: Vec<Box<dyn KvCache>>,
    sampler: Sampler,
    /// How many history tokens the draft cache holds.
    seen: usize,
    /// Tokens fed during the last `draft` call beyond `seen`.
    fed: usize,
    history_len: usize,
}

/// How a draft model samples for a request: its temperature, top-p, top-k
/// and min-p, with its seed plus one (no penalties or bias).
pub(crate) fn draft_sampling(sampling: &SamplingParams) -> SamplingParams {
    SamplingParams {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        top_k: sampling.top_k,
        min_p: sampling.min_p,
        seed: sampling.seed.map(|s| s.wrapping_add(1)),
        ..SamplingParams::default()
    }
}

impl<'m> ModelDrafter<'m> {
    /// A drafter over draft `model`, sampling with the request's temperature,
    /// top-p, top-k and min-p (its seed plus one).
    pub fn new(model: &'m Model, sampling: &SamplingParams) -> Result<Self> {
        Ok(Self {
            model,
            caches: model.make_caches(),
            sampler: Sampler::new(draft_sampling(sampling))?,
            seen: 0,
            fed: 0,
            history_len: 0,
        })
    }
}

impl DraftSource for ModelDrafter<'_> {
    fn prefill(&mut self, tokens: &[u32], prefill_step: usize) -> Result<()> {
        prefill(self.model, &mut self.caches, tokens, prefill_step)?;
        self.seen = tokens.len();
        Ok(())
    }

    fn draft(
        &mut self,
        history: &[u32],
        n: usize,
        guide: Option<&mut dyn TokenConstraint>,
    ) -> Result<Option<Array>> {
        if n == 0 || self.seen >= history.len() {
            return Ok(None);
        }
        let mut guide = match guide {
            Some(g) if !g.is_finished() => g.fork().ok(),
            _ => None,
        };
        self.history_len = history.len();
        let fresh: Vec<i32> = history[self.seen..].iter().map(|&t| t as i32).collect();
        let mut input = Array::from_slice(&fresh, &[1, fresh.len() as i32]);
        let vocab = self.model.vocab_size();
        let mut drafted = Vec::with_capacity(n);
        for _ in 0..n {
            let logits = self.model.forward(&input, &mut self.caches)?;
            let mut last = logits.index((.., -1, ..));
            if let Some(g) = guide.as_mut() {
                if let Some(mask) = g.mask(vocab)? {
                    last = apply_mask(&last, &mask)?;
                }
            }
            let token = self.sampler.sample(&log_softmax(&last)?)?;
            async_eval([&token])?;
            input = token.reshape(&[1, 1])?;
            drafted.push(token.clone());
            if let Some(g) = guide.as_mut() {
                g.commit(token.item_cast::<u32>())?;
                if g.is_finished() {
                    break;
                }
            }
        }
        // Fed: the fresh history tokens and all drafts but the last.
        self.fed = fresh.len() + drafted.len() - 1;
        Ok(Some(concatenate(&drafted, 0)?))
    }

    fn rewind(&mut self, drafted: usize, accepted: usize) -> Result<()> {
        if drafted == 0 {
            return Ok(());
        }
        let keep_drafts = accepted.min(drafted - 1);
        let trim = (drafted - 1) - keep_drafts;
        if !trim_all(&mut self.caches, trim) {
            bail!("the draft model's cache cannot be trimmed");
        }
        self.seen = self.history_len + keep_drafts;
        self.fed = 0;
        Ok(())
    }

    fn resident_bytes(&self) -> usize {
        self.model.resident_bytes() + total_bytes(&self.caches)
    }

    fn name(&self) -> String {
        format!("model:{}", self.model.path.display())
    }
}

/// Prompt-lookup drafting: finds the latest earlier occurrence of the
/// history's last `k` tokens (longest `k` first) and proposes what followed.
/// Needs no model; pays on extraction, summarization and code edits.
pub struct NgramDrafter {
    /// The longest n-gram matched, in tokens.
    pub max_ngram: usize,
    /// The shortest n-gram matched, in tokens.
    pub min_ngram: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        Self {
            max_ngram: 3,
            min_ngram: 1,
        }
    }
}

impl NgramDrafter {
    pub(crate) fn propose(&self, history: &[u32], n: usize) -> Vec<u32> {
        for k in (self.min_ngram..=self.max_ngram).rev() {
            if history.len() <= k {
                continue;
            }
            let tail = &history[history.len() - k..];
            // Latest match that is not the tail itself.
            for start in (0..history.len() - k).rev() {
                if &history[start..start + k] == tail {
                    let from = start + k;
                    let to = (from + n).min(history.len());
                    if from < to {
                        return history[from..to].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }
}

impl DraftSource for NgramDrafter {
    fn prefill(&mut self, _tokens: &[u32], _prefill_step: usize) -> Result<()> {
        Ok(())
    }

    fn draft(
        &mut self,
        history: &[u32],
        n: usize,
        guide: Option<&mut dyn TokenConstraint>,
    ) -> Result<Option<Array>> {
        let mut proposal = self.propose(history, n);
        if let Some(guide) = guide {
            proposal.truncate(allowed_prefix(&proposal, guide)?);
        }
        if proposal.is_empty() {
            return Ok(None);
        }
        Ok(Some(Array::from_slice(&proposal, &[proposal.len() as i32])))
    }

    fn rewind(&mut self, _drafted: usize, _accepted: usize) -> Result<()> {
        Ok(())
    }

    fn resident_bytes(&self) -> usize {
        0
    }

    fn name(&self) -> String {
        "ngram".into()
    }
}

/// How many leading tokens of `proposal` the grammar allows in sequence,
/// walked on a fork so `guide` stays where it was.
fn allowed_prefix(proposal: &[u32], guide: &mut dyn TokenConstraint) -> Result<usize> {
    if proposal.is_empty() || guide.is_finished() {
        return Ok(0);
    }
    let Ok(mut walk) = guide.fork() else {
        // Unfiltered proposals are still verified under the grammar.
        return Ok(proposal.len());
    };
    let mut allowed = 0;
    for &token in proposal {
        if walk.is_finished() || !walk.allows(token)? {
            break;
        }
        walk.commit(token)?;
        allowed += 1;
    }
    Ok(allowed)
}

/// Refuses a draft model from another tokenizer family; warns on a vocabulary
/// size mismatch (padding differences are common and harmless).
pub fn check_draft_tokenizer(target: &Tokenizer, draft: &Tokenizer) -> Result<Option<String>> {
    let probe = "Hello, world! 12345 The quick brown fox. <|im_start|>user\nÜber naïve café";
    let a = target.encode(probe)?;
    let b = draft.encode(probe)?;
    if a != b {
        bail!("the draft model uses a different tokenizer than the target (token ids differ on a probe text)");
    }
    if target.vocab_size() != draft.vocab_size() {
        return Ok(Some(format!(
            "draft vocabulary size {} differs from the target's {}",
            draft.vocab_size(),
            target.vocab_size()
        )));
    }
    Ok(None)
}
