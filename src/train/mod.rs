//! Fine-tuning: LoRA adapters trained with SFT or ORPO, in mlx-lm's
//! adapter format; DWQ (distilled quantization scales and biases).

pub mod batches;
pub mod config;
pub mod data;
pub mod dwq;
pub mod fuse;
pub mod losses;
pub mod optimizer;
pub mod orpo;
pub mod trainer;
