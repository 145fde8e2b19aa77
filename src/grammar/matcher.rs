//! One sequence's grammar state behind the `TokenConstraint` interface.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use mlx_rs::Array;

use super::compile::CompileInfo;
use super::token_env::TokenEnvironment;
use crate::constraint::TokenConstraint;

/// Follows one sequence through a compiled grammar. It advances only on
/// committed tokens; `fork` copies it at the current position and
/// `rollback` undoes committed tokens (speculative decoding uses both).
pub struct GrammarConstraint {
    matcher: Matcher,
    env: Arc<TokenEnvironment>,
    compile: CompileInfo,
    mask_times: Vec<Duration>,
    compute_times: Vec<Duration>,
    commit_times: Vec<Duration>,
    bits: Vec<bool>,
}

impl GrammarConstraint {
    pub(crate) fn new(matcher: Matcher, env: Arc<TokenEnvironment>, compile: CompileInfo) -> Self {
        Self {
            matcher,
            env,
            compile,
            mask_times: Vec::new(),
            compute_times: Vec::new(),
            commit_times: Vec::new(),
            bits: Vec::new(),
        }
    }

    /// How long getting the compiled grammar took and whether it was cached.
    pub fn compile_info(&self) -> CompileInfo {
        self.compile
    }

    /// The host time of every `mask` call so far, in order.
    pub fn mask_times(&self) -> &[Duration] {
        &self.mask_times
    }

    /// The part of each `mask` call spent in the grammar (the rest builds
    /// the array).
    pub fn compute_times(&self) -> &[Duration] {
        &self.compute_times
    }

    /// The host time of every `commit` call so far, in order.
    pub fn commit_times(&self) -> &[Duration] {
        &self.commit_times
    }

    /// The allowed tokens for the next position as a bit set over the
    /// tokenizer's vocabulary.
    pub fn allowed_tokens(&mut self) -> Result<SimpleVob> {
        if self.matcher.is_stopped() {
            self.check_error()?;
            return Ok(self.env.tok_env().tok_trie().eos_token_set());
        }
        self.matcher
            .compute_mask()
            .map_err(|e| anyhow!("structured output: {e}"))
    }

    fn check_error(&self) -> Result<()> {
        match self.matcher.get_error() {
            Some(e) => bail!("structured output: {e}"),
            None => Ok(()),
        }
    }

    fn is_eos(&self, token: u32) -> bool {
        self.env.eos_ids.contains(&token)
    }

    /// Independent copy at the current position (concrete type).
    pub(crate) fn fork_matcher(&self) -> Self {
        Self {
            matcher: self.matcher.clone(),
            env: self.env.clone(),
            compile: self.compile,
            mask_times: Vec::new(),
            compute_times: Vec::new(),
            commit_times: Vec::new(),
            bits: Vec::new(),
        }
    }
}

/// The 8 bools of every byte value, least significant bit first.
const BYTE_BITS: [[bool; 8]; 256] = {
    let mut table = [[false; 8]; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut bit = 0;
        while bit < 8 {
            table[byte][bit] = (byte >> bit) & 1 == 1;
            bit += 1;
        }
        byte += 1;
    }
    table
};

/// Expands `vob` into `bits[..vocab]`; returns how many are set.
fn expand(vob: &SimpleVob, bits: &mut Vec<bool>, vocab: usize) -> usize {
    bits.clear();
    bits.resize(vocab, false);
    let mut set = 0;
    for (w, &word) in vob.as_slice().iter().enumerate() {
        if word == 0 {
            continue;
        }
        let base = w * 32;
        if base >= vocab {
            break;
        }
        let word = if vocab - base < 32 {
            word & ((1u32 << (vocab - base)) - 1)
        } else {
            word
        };
        set += word.count_ones() as usize;
        for (i, byte) in word.to_le_bytes().into_iter().enumerate() {
            let start = base + 8 * i;
            if byte == 0 || start >= vocab {
                continue;
            }
            let end = (start + 8).min(vocab);
            bits[start..end].copy_from_slice(&BYTE_BITS[byte as usize][..end - start]);
        }
    }
    set
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, vocab: usize) -> Result<Option<Array>> {
        let start = Instant::now();
        let vob = self.allowed_tokens()?;
        self.compute_times.push(start.elapsed());
        let mut bits = std::mem::take(&mut self.bits);
        let allowed = expand(&vob, &mut bits, vocab);
        if allowed == 0 {
            bail!("structured output: the grammar allows no token of the model's vocabulary here");
        }
        let mask = Array::from_slice(&bits, &[vocab as i32]);
        self.bits = bits;
        self.mask_times.push(start.elapsed());
        Ok(Some(mask))
    }

    fn allows(&mut self, token: u32) -> Result<bool> {
        if self.is_eos(token) {
            if self.matcher.is_stopped() {
                self.check_error()?;
                return Ok(true);
            }
            return self
                .matcher
                .is_accepting()
                .map_err(|e| anyhow!("structured output: {e}"));
        }
        if self.matcher.is_stopped() {
            self.check_error()?;
            return Ok(false);
        }
        if token as usize >= self.env.vocab_size() {
            // Beyond the tokenizer (a padded model vocabulary): never allowed,
            // and asking the matcher would put it in an error state.
            return Ok(false);
        }
        let n = self
            .matcher
            .validate_tokens(&[token])
            .map_err(|e| anyhow!("structured output: {e}"))?;
        Ok(n == 1)
    }

    fn commit(&mut self, token: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            self.check_error()?;
            if self.is_eos(token) {
                return Ok(());
            }
            bail!("structured output: token {token} came after the grammar was complete");
        }
        let start = Instant::now();
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow!("structured output: the grammar rejected token {token}: {e}"))?;
        self.commit_times.push(start.elapsed());
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    fn fork(&self) -> Result<Box<dyn TokenConstraint>> {
        Ok(Box::new(self.fork_matcher()))
    }

    fn rollback(&mut self, tokens: usize) -> Result<()> {
        self.matcher
            .rollback(tokens)
            .map_err(|e| anyhow!("structured output: rollback of {tokens} tokens failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_pads_and_truncates() {
        let mut vob = SimpleVob::alloc(70);
        vob.allow_token(0);
        vob.allow_token(33);
        vob.allow_token(69);
        let mut bits = Vec::new();
        assert_eq!(expand(&vob, &mut bits, 100), 3);
        assert_eq!(bits.len(), 100);
        assert!(bits[0] && bits[33] && bits[69] && !bits[70]);
        assert_eq!(expand(&vob, &mut bits, 40), 2);
        assert_eq!(bits.len(), 40);
    }

    #[test]
    fn expand_matches_every_bit() {
        let mut vob = SimpleVob::alloc(1000);
        for t in (0..1000u32).filter(|t| (t * 7919) % 13 < 5 || (96..130).contains(t)) {
            vob.allow_token(t);
        }
        let mut bits = Vec::new();
        for vocab in [1, 31, 33, 100, 999, 1000, 1100] {
            let set = expand(&vob, &mut bits, vocab);
            let expected: Vec<bool> = (0..vocab)
                .map(|i| i < 1000 && vob.is_allowed(i as u32))
                .collect();
            assert_eq!(bits, expected, "vocab {vocab}");
            assert_eq!(set, expected.iter().filter(|&&b| b).count());
        }
    }
}
