//! The KV-cache flags that `generate`, `chat`, `cache-prompt` and `serve`
//! share, declared and lowered here once.

use mlx_bun::cache::{KvQuantization, KvSettings};

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
    /// The KV settings these flags and `--max-kv-size` ask for (the engine
    /// checks them where it builds the caches).
    pub fn settings(&self, max_kv_size: Option<usize>) -> KvSettings {
        KvSettings {
            max_kv_size,
            quantization: self.kv_bits.map(|bits| KvQuantization {
                bits,
                group_size: self.kv_group_size,
                start: self.quantized_kv_start,
            }),
        }
    }
}
