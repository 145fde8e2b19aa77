//! Running one model across several processes with MLX's own distributed
//! layer: [`shard`] splits a loaded model across a [`crate::collective::Group`]
//! (tensor or pipeline parallel); [`launch`] starts the ranks with the
//! environment MLX's backends read, as `mlx.launch` does.
//!
//! Every rank runs the same program on the same inputs: the sharded forward
//! pass gives every rank the same logits, so every rank samples the same
//! tokens and follows the same schedule without a channel of its own.

pub mod launch;
pub mod shard;

pub use shard::{shard_model, Parallelism};
