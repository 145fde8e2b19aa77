//! mlx-bun: the engine. Models, caches, sampling, generation, grammar
//! constraints, speculation and model conversion, free of CLI and HTTP concerns.

#![warn(missing_docs)]

pub mod adapters;
pub mod autodiff;
pub mod cache;
pub mod chat;
pub mod chat_template;
pub mod collective;
pub mod constraint;
pub mod convert;
pub mod dataset_rows;
pub mod decode;
pub mod default_model;
pub mod distributed;
pub mod eval;
pub mod evaldb;
pub mod fit;
pub mod gateway;
pub mod generate;
pub mod grammar;
pub mod hub;
mod huge_pages;
pub mod kernels;
pub mod lora;
mod mlx_closure;
pub mod mlx_ext;
pub mod model;
pub mod prefix;
pub mod prompt;
pub mod quant;
pub mod reasoning;
pub mod runtime;
pub mod sampling;
#[cfg(feature = "server")]
pub mod server;
pub mod settings;
pub mod speculative;
pub mod stop;
pub mod tokenizer;
pub mod tool_calls;
pub mod train;
pub mod upload;

/// The crate's version (`CARGO_PKG_VERSION`).
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
