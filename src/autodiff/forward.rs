//! The differentiable forward pass used for training: hidden states of a
//! batch, optionally continuing after a shared prefix, with per-layer
//! gradient checkpointing on request.

use anyhow::Result;
use mlx_rs::Array;

use super::remat::checkpointed;
use crate::cache::KvCache;
use crate::lora::block_loras_mut;
use crate::model::decoder::{Block, Decoder};

/// Keys and values per layer (`[B, kv_heads, P, head_dim]`) of processed positions.
pub(crate) type PrefixState = Vec<(Array, Array)>;

/// The model's forward pass for training, with gradient checkpointing of the adapted layers.
pub struct TrainForward<'a> {
    /// The decoder whose (adapted) layers are run.
    pub decoder: &'a Decoder,
    /// Checkpoint every layer from this index on (the adapted layers).
    pub checkpoint_from: Option<usize>,
}

impl TrainForward<'_> {
    /// Final-norm hidden states `[B, L, hidden]` of `inputs` `[B, L]`,
    /// continuing after `prefix` when given. With `keep_state`, also the
    /// keys/values of every position, to continue from later.
    pub fn hidden(
        &self,
        inputs: &Array,
        prefix: Option<&PrefixState>,
        keep_state: bool,
    ) -> Result<(Array, Option<PrefixState>)> {
        if crate::model::gemma4_text::is_gemma4(self.decoder) {
            // KV-shared layers read other layers' keys: the stack runs whole.
            return crate::model::gemma4_text::train_hidden(
                self.decoder,
                inputs,
                prefix,
                keep_state,
            );
        }
        let recurrent = self.decoder.layers.iter().any(|b| b.linear_attn.is_some());
        if recurrent && (keep_state || prefix.is_some()) {
            anyhow::bail!(
                "continuing from a shared prompt (ORPO) does not cover recurrent layers yet"
            );
        }
        let mut h = self.decoder.embed(inputs)?;
        let templates = self.decoder.make_caches();
        let mut state = keep_state.then(Vec::new);
        for (i, (layer, template)) in self.decoder.layers.iter().zip(templates).enumerate() {
            let past = prefix.map(|p| p[i].clone());
            let checkpoint = self.checkpoint_from.is_some_and(|from| i >= from);
            let (out, kv) = if checkpoint {
                layer_checkpointed(layer, template, &h, past)?
            } else {
                layer_forward(layer, template, &h, past)?
            };
            h = out;
            if let (Some(s), Some(kv)) = (state.as_mut(), kv) {
                s.push(kv);
            }
        }
        Ok((self.decoder.norm.forward(&h)?, state))
    }
}

fn layer_forward(
    layer: &Block,
    mut cache: Box<dyn KvCache>,
    h: &Array,
    past: Option<(Array, Array)>,
) -> Result<(Array, Option<(Array, Array)>)> {
    if let Some((k, v)) = past {
        let offset = k.shape()[2] as usize;
        cache.set_state(k, v, offset)?;
    }
    let out = layer.forward(h, cache.as_mut())?;
    Ok((out, cache.state()))
}

fn layer_checkpointed(
    layer: &Block,
    template: Box<dyn KvCache>,
    h: &Array,
    past: Option<(Array, Array)>,
) -> Result<(Array, Option<(Array, Array)>)> {
    // Adapter arrays are passed as inputs, not captured: the checkpoint
    // differentiates only with respect to its inputs.
    let mut layer = layer.clone();
    let lora_inputs: Vec<Array> = block_loras_mut(&mut layer)
        .into_iter()
        .flat_map(|l| [l.a.clone(), l.b.clone()])
        .collect();
    let has_past = past.is_some();
    let first_lora = if has_past { 3 } else { 1 };
    let body = move |args: &[Array]| -> Result<Vec<Array>> {
        for (lora, ab) in block_loras_mut(&mut layer)
            .into_iter()
            .zip(args[first_lora..].chunks(2))
        {
            lora.a = ab[0].clone();
            lora.b = ab[1].clone();
        }
        let past = has_past.then(|| (args[1].clone(), args[2].clone()));
        let (out, kv) = layer_forward(&layer, template.boxed_clone(), &args[0], past)?;
        let mut outs = vec![out];
        if let Some((k, v)) = kv {
            outs.push(k);
            outs.push(v);
        }
        Ok(outs)
    };
    let mut inputs = vec![h.clone()];
    if let Some((k, v)) = past {
        inputs.push(k);
        inputs.push(v);
    }
    inputs.extend(lora_inputs);
    let mut outs = checkpointed(body, &inputs)?.into_iter();
    let out = outs.next().expect("the layer returns its output");
    let kv = match (outs.next(), outs.next()) {
        (Some(k), Some(v)) => Some((k, v)),
        _ => None,
    };
    Ok((out, kv))
}
