//! Differentiating through a model: the forward pass over a batch that
//! training, DWQ and dynamic quantization take gradients of, and gradient
//! checkpointing (`remat`).

pub mod forward;
pub mod remat;
