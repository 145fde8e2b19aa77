//! ORPO (odds-ratio preference optimization):
//! `loss = NLL + λ·L_OR`, `L_OR = -log σ(log_odds)`,
//! `log_odds = (ℓ_w - ℓ_r) - (log1mexp(ℓ_w) - log1mexp(ℓ_r))`, where `ℓ` is
//! the mean log-probability of a response's tokens (prompt excluded).
//!
//! The prompt of a pair runs once; chosen and rejected continue from its
//! keys/values as a batch of two. Every needed log-probability then comes
//! from one chunked pass through the output head.

use anyhow::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{
    broadcast_to, concatenate, exp, expm1, log, log1p, logaddexp, maximum, minimum, select,
};
use mlx_rs::Array;

use super::config::SftScope;
use super::losses::{gather_rows, target_logprobs, Head};
use crate::autodiff::forward::{PrefixState, TrainForward};
use crate::dataset_rows::PreferenceExample;

/// The scalar terms of an ORPO loss (each a 0-d array).
#[derive(Clone)]
pub struct OrpoTerms {
    /// The loss minimized: `nll + λ·or`.
    pub loss: Array,
    /// The negative log-likelihood term (SFT loss on the chosen response, or prompt and chosen with `SftScope::Full`).
    pub nll: Array,
    /// The odds-ratio term `-log σ(log_odds)`, averaged over pairs.
    pub or: Array,
    /// The log odds ratio of chosen to rejected, averaged over pairs.
    pub log_odds: Array,
    /// Mean per-token log-probability of the chosen responses, averaged over pairs.
    pub chosen_logp: Array,
    /// Mean per-token log-probability of the rejected responses, averaged over pairs.
    pub rejected_logp: Array,
}

impl OrpoTerms {
    pub(crate) fn into_vec(self) -> Vec<Array> {
        vec![
            self.loss,
            self.nll,
            self.or,
            self.log_odds,
            self.chosen_logp,
            self.rejected_logp,
        ]
    }

    /// The terms from the loss values in the order the trainer evaluates them.
    pub fn from_slice(v: &[Array]) -> Self {
        Self {
            loss: v[0].clone(),
            nll: v[1].clone(),
            or: v[2].clone(),
            log_odds: v[3].clone(),
            chosen_logp: v[4].clone(),
            rejected_logp: v[5].clone(),
        }
    }
}

/// `log(1 - exp(x))` for `x < 0`, accurate on both sides of `-ln 2`; each
/// branch sees only inputs where it is finite, so gradients stay finite.
pub fn log1mexp(x: &Array) -> Result<Array> {
    let cut = Array::from_f32(-std::f32::consts::LN_2);
    let x = minimum(x, Array::from_f32(-1e-7))?;
    let near = maximum(&x, &cut)?;
    let far = minimum(&x, &cut)?;
    let near = log(expm1(&near)?.negative()?)?;
    let far = log1p(exp(&far)?.negative()?)?;
    Ok(select(x.gt(&cut)?, near, far)?)
}

/// Log-odds of the chosen over the rejected response from their mean log-probs.
pub fn log_odds(chosen: &Array, rejected: &Array) -> Result<Array> {
    let diff = chosen - rejected;
    let odds = &log1mexp(chosen)? - &log1mexp(rejected)?;
    Ok(&diff - &odds)
}

/// Sums of log-probabilities of one pair.
struct PairSums {
    /// Over the prompt's own next-token positions (`P - 1` of them).
    prompt: Array,
    chosen: Array,
    rejected: Array,
    prompt_count: usize,
}

/// The ORPO loss of `pairs` (one step's batch) and the number of tokens run.
pub fn orpo_loss(
    fwd: &TrainForward,
    pairs: &[&PreferenceExample],
    lambda: f32,
    scope: SftScope,
    chunk: usize,
    remat: bool,
) -> Result<(OrpoTerms, usize)> {
    let head = Head::of(fwd.decoder);
    let mut sums = Vec::with_capacity(pairs.len());
    let mut tokens = 0;
    for pair in pairs {
        sums.push(pair_sums(fwd, &head, pair, scope, chunk, remat)?);
        tokens += pair.prompt.len() + pair.chosen.len() + pair.rejected.len();
    }
    let n = pairs.len() as f32;
    let mut chosen_means = Vec::new();
    let mut rejected_means = Vec::new();
    for (s, p) in sums.iter().zip(pairs) {
        chosen_means.push(&s.chosen / p.chosen.len() as f32);
        rejected_means.push(&s.rejected / p.rejected.len() as f32);
    }
    let stack = |v: &[Array]| -> Result<Array> {
        let parts: Vec<Array> = v
            .iter()
            .map(|a| a.reshape(&[1]))
            .collect::<Result<_, _>>()?;
        Ok(concatenate(&parts, 0)?)
    };
    let lw = stack(&chosen_means)?;
    let lr = stack(&rejected_means)?;
    let odds = log_odds(&lw, &lr)?;
    // -log σ(z) = log(1 + exp(-z))
    let or_terms = logaddexp(Array::from_f32(0.0), odds.negative()?)?;
    let or = &or_terms.sum(None)? / n;
    let nll = match scope {
        SftScope::Response => &lw.sum(None)?.negative()? / n,
        SftScope::Full => {
            let mut total = Array::from_f32(0.0);
            let mut count = 0usize;
            for (s, p) in sums.iter().zip(pairs) {
                total = &(&total + &s.prompt) + &s.chosen;
                count += s.prompt_count + p.chosen.len();
            }
            &total.negative()? / count as f32
        }
    };
    let loss = &nll + &(&or * lambda);
    let terms = OrpoTerms {
        loss,
        nll,
        or,
        log_odds: &odds.sum(None)? / n,
        chosen_logp: &lw.sum(None)? / n,
        rejected_logp: &lr.sum(None)? / n,
    };
    Ok((terms, tokens))
}

fn pair_sums(
    fwd: &TrainForward,
    head: &Head,
    pair: &PreferenceExample,
    scope: SftScope,
    chunk: usize,
    remat: bool,
) -> Result<PairSums> {
    let p = pair.prompt.len();
    let (rw, rr) = (pair.chosen.len(), pair.rejected.len());
    let prompt_ids: Vec<i32> = pair.prompt.iter().map(|&t| t as i32).collect();
    let prompt = Array::from_slice(&prompt_ids, &[1, p as i32]);
    let width = rw.max(rr) - 1;
    let (h_prompt, state) = fwd.hidden(&prompt, None, width > 0)?;
    let mut rows = vec![h_prompt.reshape(&[p as i32, -1])?];
    if width > 0 {
        let state = state.expect("kept when asked for");
        let shared: PrefixState = state
            .into_iter()
            .map(|(k, v)| -> Result<(Array, Array)> {
                let mut shape = k.shape().to_vec();
                shape[0] = 2;
                Ok((broadcast_to(&k, &shape)?, broadcast_to(&v, &shape)?))
            })
            .collect::<Result<_>>()?;
        let mut resp = vec![0i32; 2 * width];
        for (j, &t) in pair.chosen[..rw - 1].iter().enumerate() {
            resp[j] = t as i32;
        }
        for (j, &t) in pair.rejected[..rr - 1].iter().enumerate() {
            resp[width + j] = t as i32;
        }
        let resp = Array::from_slice(&resp, &[2, width as i32]);
        let (h_resp, _) = fwd.hidden(&resp, Some(&shared), false)?;
        rows.push(h_resp.reshape(&[2 * width as i32, -1])?);
    }
    let hidden = if rows.len() == 1 {
        rows.remove(0)
    } else {
        concatenate(&rows, 0)?
    };

    // Row r of `hidden`: prompt position r for r < P, then chosen response
    // inputs, then rejected response inputs (each `width` rows).
    let full = scope == SftScope::Full;
    let prompt_count = if full { p - 1 } else { 0 };
    let mut idx = Vec::with_capacity(prompt_count + rw + rr);
    let mut targets = Vec::with_capacity(idx.capacity());
    if full {
        for r in 0..p - 1 {
            idx.push(r as i32);
            targets.push(prompt_ids[r + 1]);
        }
    }
    let last_prompt = (p - 1) as i32;
    for (base, resp) in [(p, &pair.chosen), (p + width, &pair.rejected)] {
        for (j, &t) in resp.iter().enumerate() {
            idx.push(if j == 0 {
                last_prompt
            } else {
                (base + j - 1) as i32
            });
            targets.push(t as i32);
        }
    }
    let picked = gather_rows(&hidden, &idx)?;
    let logp = target_logprobs(head, &picked, &targets, chunk, remat)?;
    let segment = |from: usize, to: usize| -> Result<Array> {
        Ok(logp.index(from as i32..to as i32).sum(None)?)
    };
    Ok(PairSums {
        prompt: if full {
            segment(0, prompt_count)?
        } else {
            Array::from_f32(0.0)
        },
        chosen: segment(prompt_count, prompt_count + rw)?,
        rejected: segment(prompt_count + rw, prompt_count + rw + rr)?,
        prompt_count,
    })
}
