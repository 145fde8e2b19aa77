//! A layer pipeline across ranks (as mlx-lm's `PipelineMixin`): each rank
//! runs a contiguous range of the decoder's layers, rank 0 the last ones;
//! activations go from rank r+1 to rank r, and rank 0's output reaches every
//! rank so every rank computes the same logits. The sharding pass
//! (`distributed/shard.rs`, standing on the model) splits the layers and puts
//! a [`PipelineStage`] into the decoder.

use anyhow::{Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use crate::collective::Group;

/// One rank's place in a layer pipeline: it receives the activations of the
/// layers before its own from rank + 1 and passes its output to rank - 1.
///
/// Activations move by MLX's `send`/`recv` where the backend has them. MLX
/// 0.32's CUDA backend has none ("Recv has no CUDA implementation"), so on a
/// GPU (or with `MLX_BUN_PIPELINE_ALL_SUM=1`) every hand-over is an `all_sum`
/// that all ranks join, the sender adding its activations and the others
/// zeros; each is evaluated before the next so every rank runs the
/// collectives in the same order.
#[derive(Clone, Debug)]
pub struct PipelineStage {
    group: Group,
    by_all_sum: bool,
}

impl PipelineStage {
    /// This rank's stage of a pipeline over `group`.
    pub(crate) fn new(group: &Group) -> Self {
        let by_all_sum = crate::mlx_ext::on_gpu() || crate::settings::get().pipeline_all_sum;
        Self {
            group: group.clone(),
            by_all_sum,
        }
    }

    /// The input of this rank's layers: `h` (the embeddings) on the last
    /// rank, which runs the first layers; the previous stage's output elsewhere.
    pub(crate) fn receive(&self, h: &Array) -> Result<Array> {
        let (rank, size) = (self.group.rank(), self.group.size());
        if !self.by_all_sum {
            return if rank + 1 < size {
                self.group.recv_like(h, rank + 1)
            } else {
                Ok(h.clone())
            };
        }
        // Hand-overs of the stages before this one, first stage first: rank
        // b passes its output to rank b - 1.
        let mut input = h.clone();
        for b in (rank + 1..size).rev() {
            let got = self.hand_over(h, false)?;
            if b == rank + 1 {
                input = got;
            }
        }
        Ok(input)
    }

    /// Passes this rank's output on and returns the pipeline's output (rank
    /// 0's), the same on every rank. Evaluated here: a send only happens when
    /// its result is evaluated, and callers evaluate only what they need.
    pub(crate) fn pass_on(&self, h: &Array) -> Result<Array> {
        let rank = self.group.rank();
        if self.by_all_sum {
            for b in (1..=rank).rev() {
                self.hand_over(h, b == rank)?;
            }
            return self.hand_over(h, rank == 0).context("pipeline stage");
        }
        let sent = if rank > 0 {
            self.group.send(h, rank - 1)?
        } else {
            h.clone()
        };
        let batch = h.shape()[0];
        let out = self.group.all_gather(&sent)?.index(0..batch);
        out.eval().context("pipeline stage")?;
        Ok(out)
    }

    /// One hand-over by `all_sum`: this rank adds `h` when it is the sender,
    /// zeros (of `h`'s shape and dtype) otherwise; evaluated.
    fn hand_over(&self, h: &Array, sender: bool) -> Result<Array> {
        let contribution = if sender {
            h.clone()
        } else {
            mlx_rs::ops::zeros_like(h)?
        };
        let out = self.group.all_sum(&contribution)?;
        out.eval().context("pipeline hand-over")?;
        Ok(out)
    }
}
