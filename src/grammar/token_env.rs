//! The grammar engine's view of one tokenizer: every token's bytes in a trie,
//! the end-of-sequence ids, and the parser factory built on them. Building it
//! walks the whole vocabulary, so it happens once per tokenizer per process.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Result};
use llguidance::toktrie::TokEnv;
use llguidance::ParserFactory;
use toktrie_hf_tokenizers::ByteTokenizer;

use crate::tokenizer::Tokenizer;

/// A stable identity for a tokenizer: its `tokenizer.json` and eos ids.
pub(crate) type TokenizerKey = u64;

pub(crate) struct TokenEnvironment {
    pub key: TokenizerKey,
    pub factory: ParserFactory,
    pub eos_ids: Vec<u32>,
}

impl TokenEnvironment {
    pub(crate) fn tok_env(&self) -> &TokEnv {
        self.factory.tok_env()
    }

    /// Number of token ids the grammar knows about.
    pub fn vocab_size(&self) -> usize {
        self.tok_env().tok_trie().vocab_size()
    }
}

fn tokenizer_key(tokenizer: &Tokenizer) -> TokenizerKey {
    let mut h = DefaultHasher::new();
    tokenizer.json.hash(&mut h);
    tokenizer.eos_ids.hash(&mut h);
    h.finish()
}

fn build(tokenizer: &Tokenizer, key: TokenizerKey) -> Result<TokenEnvironment> {
    let eos_ids: Vec<u32> = tokenizer.eos_ids.iter().copied().collect();
    if eos_ids.is_empty() {
        bail!("structured output needs an end-of-sequence token, and this tokenizer has none");
    }
    let mut bytes = ByteTokenizer::from_tokenizer(tokenizer.inner().clone())
        .map_err(|e| anyhow!("reading the vocabulary for structured output: {e}"))?;
    bytes.set_eos_tokens(&eos_ids);
    let env = bytes
        .into_tok_env(None)
        .map_err(|e| anyhow!("building the token trie for structured output: {e}"))?;
    let mut factory = ParserFactory::new_simple(&env)
        .map_err(|e| anyhow!("preparing the grammar engine: {e}"))?;
    // Problems come back as errors and warnings; nothing goes to stderr.
    factory.quiet();
    Ok(TokenEnvironment {
        key,
        factory,
        eos_ids,
    })
}

/// The environment of `tokenizer`, built on first use and shared afterwards.
pub(crate) fn token_environment(tokenizer: &Tokenizer) -> Result<Arc<TokenEnvironment>> {
    static ENVIRONMENTS: OnceLock<Mutex<HashMap<TokenizerKey, Arc<TokenEnvironment>>>> =
        OnceLock::new();
    let key = tokenizer_key(tokenizer);
    let registry = ENVIRONMENTS.get_or_init(Default::default);
    if let Some(env) = registry.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(env.clone());
    }
    // Built outside the lock: another model's requests need not wait.
    let env = Arc::new(build(tokenizer, key)?);
    let mut map = registry.lock().unwrap_or_else(|e| e.into_inner());
    Ok(map.entry(key).or_insert(env).clone())
}
