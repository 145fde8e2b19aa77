//! A multi-turn conversation that keeps its KV cache between turns, so each
//! turn prefills only what is new (`mlx-bun chat`).
//!
//! The conversation is rendered whole with the chat template every turn
//! (history included, unlike mlx-lm's chat, which templates each turn on its
//! own); the rendering is tokenized and compared with the tokens the cache
//! holds; the cache is trimmed to the common prefix and only the rest is
//! prefilled. When the cache cannot be trimmed (a bounded cache that
//! wrapped) or its history is not known as messages (a cache file), the new
//! turn is templated on its own and appended, as mlx-lm's chat does.

use anyhow::{bail, Result};

use crate::cache::{trim_all, KvCache};
use crate::chat_template::Message;
use crate::decode::generate;
use crate::generate::{GenerateOptions, GenerationResult, Prompt, TokenEvent};
use crate::model::Model;
use crate::prefix::file as kv_file;
use crate::tokenizer::Tokenizer;

/// Makes empty caches (on start and reset).
pub(crate) type CacheFactory<'m> = Box<dyn Fn() -> Result<Vec<Box<dyn KvCache>>> + 'm>;

/// A multi-turn conversation over one model that keeps its KV cache between turns.
pub struct ChatSession<'m> {
    model: &'m Model,
    tokenizer: &'m Tokenizer,
    fresh: CacheFactory<'m>,
    caches: Vec<Box<dyn KvCache>>,
    /// Tokens whose keys/values are in `caches` (when known).
    cache_tokens: Vec<u32>,
    /// Positions in `caches` that came from a file (their text unknown).
    from_file: bool,
    /// The first turn after a cache file completes the file's open turn.
    continue_file_turn: bool,
    system: Option<String>,
    history: Vec<Message>,
    reused: usize,
}

impl<'m> ChatSession<'m> {
    /// A fresh conversation; `fresh` makes empty caches (on start and reset).
    pub fn new(
        model: &'m Model,
        tokenizer: &'m Tokenizer,
        system: Option<String>,
        fresh: CacheFactory<'m>,
    ) -> Result<Self> {
        if tokenizer.chat_template.is_none() {
            bail!("the model has no chat template; chat needs one");
        }
        let caches = fresh()?;
        Ok(Self {
            model,
            tokenizer,
            fresh,
            caches,
            cache_tokens: Vec::new(),
            from_file: false,
            continue_file_turn: false,
            system,
            history: Vec::new(),
            reused: 0,
        })
    }

    /// Starts from a loaded cache file: the first turn completes the user
    /// turn the file left open, as `generate --prompt-cache-file` does.
    pub fn start_from(&mut self, file: kv_file::CacheFile) {
        self.cache_tokens = file.tokens().unwrap_or_default();
        self.caches = file.caches;
        self.from_file = true;
        self.continue_file_turn = true;
    }

    /// Forgets the conversation and the cache.
    pub fn reset(&mut self) -> Result<()> {
        self.caches = (self.fresh)()?;
        self.cache_tokens.clear();
        self.history.clear();
        self.from_file = false;
        self.continue_file_turn = false;
        Ok(())
    }

    /// Positions the last turn found in the cache and did not process.
    pub fn reused(&self) -> usize {
        self.reused
    }

    /// Positions the cache holds.
    pub(crate) fn cached_positions(&self) -> usize {
        self.caches.first().map_or(0, |c| c.offset())
    }

    fn messages_with(&self, user: &str) -> Vec<Message> {
        let mut m = Vec::new();
        if let Some(s) = &self.system {
            m.push(Message::new("system", s));
        }
        m.extend(self.history.iter().cloned());
        m.push(Message::new("user", user));
        m
    }

    /// The prompt tokens to run and how many of them the cache already holds.
    fn plan(&mut self, user: &str) -> Result<(Vec<u32>, usize)> {
        let template = self.tokenizer.chat_template.as_ref().unwrap();
        if self.continue_file_turn {
            let text =
                kv_file::prompt_after_cache(self.tokenizer, user, self.system.as_deref(), true)?;
            return Ok((self.tokenizer.encode(&text)?, 0));
        }
        let held = self.cached_positions();
        if !self.from_file && self.cache_tokens.len() == held {
            let text = template.render(&self.messages_with(user), true)?;
            let tokens = self.tokenizer.encode(&text)?;
            let common = tokens
                .iter()
                .zip(&self.cache_tokens)
                .take_while(|(a, b)| a == b)
                .count()
                .min(tokens.len() - 1);
            if trim_all(&mut self.caches, held - common) {
                self.cache_tokens.truncate(common);
                return Ok((tokens, common));
            }
        }
        // Append the new turn on its own (mlx-lm's chat).
        let mut m = Vec::new();
        if let Some(s) = &self.system {
            m.push(Message::new("system", s));
        }
        m.push(Message::new("user", user));
        let text = template.render(&m, true)?;
        Ok((self.tokenizer.encode(&text)?, 0))
    }

    /// Runs one turn: `on_token` streams the reply and returns false to stop
    /// it (the conversation goes on with the reply so far).
    pub fn turn(
        &mut self,
        user: &str,
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent) -> bool,
    ) -> Result<GenerationResult> {
        if user.is_empty() {
            bail!("the message is empty");
        }
        let (tokens, cached) = self.plan(user)?;
        if tokens.len() <= cached {
            bail!("the message adds no tokens");
        }
        let appended = cached == 0 && self.cached_positions() > 0;
        self.reused = if appended {
            self.cached_positions()
        } else {
            cached
        };
        let result = generate(
            self.model,
            self.tokenizer,
            &mut self.caches,
            Prompt::continuing(&tokens, cached),
            opts,
            None,
            on_token,
        )?;
        if appended {
            self.from_file = true;
            self.cache_tokens.extend_from_slice(&result.cache_tokens);
        } else {
            self.cache_tokens = result.cache_tokens.clone();
        }
        self.continue_file_turn = false;
        self.history.push(Message::new("user", user));
        self.history.push(Message::new("assistant", &result.text));
        Ok(result)
    }
}
