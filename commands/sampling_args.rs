//! The sampling flags `generate`, `chat` and `serve` share, declared and
//! checked once and lowered into the engine's `SamplingParams` in one place.

use mlx_bun::sampling::SamplingParams;

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy (serve: for requests that give none).
    #[arg(long, default_value_t = 0.0, value_parser = crate::validate::non_negative)]
    pub temp: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability
    /// reaches this (1 is off).
    #[arg(long, default_value_t = 1.0, value_parser = crate::validate::positive_fraction)]
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 is off.
    #[arg(long, default_value_t = 0, value_parser = crate::validate::count)]
    pub top_k: usize,
    /// Drop tokens below this fraction of the most likely one's probability.
    #[arg(long, default_value_t = 0.0, value_parser = crate::validate::fraction)]
    pub min_p: f32,
    /// With --min-p: tokens that always survive the filter.
    #[arg(long, default_value_t = 1, value_parser = crate::validate::at_least_one)]
    pub min_tokens_to_keep: usize,
    /// XTC: the chance that a step removes its top choices (0 is off).
    #[arg(long, default_value_t = 0.0, value_parser = crate::validate::fraction)]
    pub xtc_probability: f32,
    /// XTC: the probability a token needs to count as a top choice.
    #[arg(long, default_value_t = 0.1, value_parser = crate::validate::fraction)]
    pub xtc_threshold: f32,
}

impl SamplingArgs {
    /// The engine's sampling parameters for these flags (others at their defaults).
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            min_tokens_to_keep: self.min_tokens_to_keep,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            ..SamplingParams::default()
        }
    }
}
