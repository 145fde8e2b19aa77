//! The KV-cache flags that `generate`, `chat`, `cache-prompt` and `serve`
//! share, declared and lowered here once.

use anyhow::Result;
use mlx_bun::cache::KvQuantization;

/// KV-cache quantization flags, as mlx-lm's.
#[derive(clap::Args)]
pub struct KvArgs {
    /// Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8; default: no quantization).
    #[arg(long)]
    pub kv_bits: Option<i32>,
    /// Group size of KV quantization.
    #[arg(long, default_value_t = 64)]
    pub kv_group_size: i32,
    /// Quantize once the cache holds this many positions.
    #[arg(long, default_value_t = 5000)]
    pub quantized_kv_start: usize,
}

impl KvArgs {
    /// The quantization these flags ask for (the model checks that the
    /// group size divides what it caches when it makes its caches).
    pub fn settings(&self) -> Result<Option<KvQuantization>> {
        let Some(bits) = self.kv_bits else {
            return Ok(None);
        };
        let q = KvQuantization {
            bits,
            group_size: self.kv_group_size,
            start: self.quantized_kv_start,
        };
        q.validate()?;
        Ok(Some(q))
    }
}
