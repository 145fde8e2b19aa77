//! Serving a model sharded across ranks (`mlx-bun launch … -- serve`).
//!
//! Every forward pass of a sharded model is a collective, so every rank must
//! run the same batch steps in the same order. Rank 0 alone takes requests;
//! at the top of each worker iteration it broadcasts what it is about to
//! apply (requests admitted, with their token ids and sampling, rows
//! cancelled, shutdown) through MLX's own `all_sum` (the other ranks add
//! zeros), and every rank applies it to its own batch and steps it. The
//! other ranks stream to nobody.
//!
//! What makes the ranks agree: the same logits on every rank (the sharded
//! forward ends in a collective); every sampled request carries a seed (rank
//! 0 draws one when the request has none), so each row samples from its own
//! key; rows end only by what every rank sees (tokens, stop strings, limits)
//! or by a cancellation in the broadcast, never by a client's state read on
//! one rank; prefill chunks have a fixed size (not timed) and there is no
//! prompt cache (its hits would depend on each rank's memory). Rank 0 alone
//! decides admission (queue order and KV budget).

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::batch_lane::BatchLane;
use super::job::{Client, InFlight, Job, Waiting};
use super::route::Lane;
use super::worker::Shared;
use super::{GatewayError, GatewayEvent, GatewayRequest};
use crate::collective::Group;
use crate::distributed::Parallelism;
use crate::generate::GenerateOptions;
use crate::grammar::ConstraintSpec;
use crate::sampling::SamplingParams;

/// How this process's model is split: set once by `serve` under `launch`.
#[derive(Clone, Debug)]
pub struct Sharding {
    /// The ranks the model is split across.
    pub group: Group,
    /// Tensor or pipeline parallelism.
    pub parallelism: Parallelism,
}

/// A sharded server's sharding, handed to the one gateway that claims it:
/// every gateway of a server gets a clone of its config, and only the first
/// (the model the server started with) may shard, as the other ranks follow
/// only it. The default holds none: the server is not sharded.
#[derive(Clone, Debug, Default)]
pub struct ShardingSlot(Option<Arc<Mutex<Option<Sharding>>>>);

impl ShardingSlot {
    /// A slot holding `sharding` for the first gateway to claim.
    pub fn new(sharding: Sharding) -> Self {
        Self(Some(Arc::new(Mutex::new(Some(sharding)))))
    }

    /// The sharding, for the first gateway; `None` when the server is not
    /// sharded; an error for a second gateway (a request naming other
    /// adapters or a draft model).
    pub(crate) fn claim(&self) -> Result<Option<Sharding>> {
        let Some(slot) = &self.0 else {
            return Ok(None);
        };
        match slot.lock().unwrap().take() {
            Some(sharding) => Ok(Some(sharding)),
            None => bail!(
                "a sharded server serves only the model it started with (no other models, \
                 adapters or draft models per request; see docs/distributed.md)"
            ),
        }
    }
}

/// What rank 0 applies in one iteration, in this order.
#[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
struct Control {
    /// Rows to cancel, by batch-lane id.
    cancel: Vec<u64>,
    admit: Vec<Admit>,
    shutdown: bool,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Admit {
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingParams,
    stop: Vec<String>,
    logprobs: Option<usize>,
    prefill_step: usize,
    constraint: Option<Constraint>,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Constraint {
    JsonSchema(serde_json::Value),
    JsonObject,
    Regex(String),
    Choice(Vec<String>),
    Lark(String),
}

impl Admit {
    fn of(request: &GatewayRequest) -> Self {
        let o = &request.options;
        Self {
            prompt: request.prompt.clone(),
            max_tokens: o.max_tokens,
            sampling: o.sampling.clone(),
            stop: o.stop.clone(),
            logprobs: o.logprobs,
            prefill_step: o.prefill_step,
            constraint: request.constraint.as_ref().map(|c| match c {
                ConstraintSpec::JsonSchema(v) => Constraint::JsonSchema(v.clone()),
                ConstraintSpec::JsonObject => Constraint::JsonObject,
                ConstraintSpec::Regex(r) => Constraint::Regex(r.clone()),
                ConstraintSpec::Choice(c) => Constraint::Choice(c.clone()),
                ConstraintSpec::Lark(l) => Constraint::Lark(l.clone()),
            }),
        }
    }

    fn into_request(self) -> GatewayRequest {
        GatewayRequest {
            prompt: self.prompt,
            options: GenerateOptions {
                max_tokens: self.max_tokens,
                sampling: self.sampling,
                stop: self.stop,
                logprobs: self.logprobs,
                prefill_step: self.prefill_step,
            },
            constraint: self.constraint.map(|c| match c {
                Constraint::JsonSchema(v) => ConstraintSpec::JsonSchema(v),
                Constraint::JsonObject => ConstraintSpec::JsonObject,
                Constraint::Regex(r) => ConstraintSpec::Regex(r),
                Constraint::Choice(c) => ConstraintSpec::Choice(c),
                Constraint::Lark(l) => ConstraintSpec::Lark(l),
            }),
        }
    }
}

fn exchange(group: &Group, control: Option<&Control>) -> Result<Control> {
    let bytes = match control {
        Some(c) => Some(serde_json::to_vec(c)?),
        None => None,
    };
    let got = group.broadcast_bytes(bytes.as_deref())?;
    serde_json::from_slice(&got).context("reading rank 0's control message")
}

/// The worker loop of a sharded server: rank 0 leads, the others follow.
pub(crate) fn run(
    group: &Group,
    shared: &mut Shared,
    batch: &mut BatchLane<'_>,
    rx: Receiver<Job>,
) {
    let outcome = if group.rank() == 0 {
        lead(group, shared, batch, rx)
    } else {
        follow(group, shared, batch)
    };
    if let Err(e) = outcome {
        tracing::error!("rank {}: lost the other ranks: {e:#}", group.rank());
    }
}

/// Rank 0: takes jobs from the queue, decides, broadcasts, applies, steps.
fn lead(
    group: &Group,
    shared: &mut Shared,
    batch: &mut BatchLane<'_>,
    rx: Receiver<Job>,
) -> Result<()> {
    let counters = shared.reporter.counters.clone();
    let mut waiting = Waiting::new(counters.clone());
    let mut open = true;
    loop {
        if open && batch.is_idle() && waiting.is_empty() {
            match rx.recv() {
                Ok(job) => waiting.push(job),
                Err(_) => open = false,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(job) => waiting.push(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        let aborting = shared.reporter.aborting();
        let mut control = Control {
            cancel: batch.abandoned(aborting),
            ..Control::default()
        };
        let mut admitted = Vec::new();
        while let Some(front) = waiting.front() {
            let gone = front.client.abandoned();
            // A job waits while the batch runs and has no room for it.
            let blocked =
                !gone && !aborting && front.lane == Lane::Batch && !batch.can_admit(front);
            if blocked && !batch.is_idle() {
                break;
            }
            let mut job = waiting.pop().unwrap();
            if aborting {
                job.client
                    .send(GatewayEvent::Failed(GatewayError::ShuttingDown));
            } else if gone {
                shared.reporter.dropped(&job.client);
            } else if job.lane != Lane::Batch {
                shared.reporter.fail(
                    &job.client,
                    GatewayError::Unsupported(
                        "a sharded server runs requests as rows of its batch only".into(),
                    ),
                );
            } else if !batch.can_admit(&job) {
                // Submission refuses what can never fit; this is a guard.
                shared.reporter.fail(
                    &job.client,
                    GatewayError::InvalidRequest(
                        "the request needs more KV memory than the budget".into(),
                    ),
                );
            } else {
                let sampling = &mut job.request.options.sampling;
                if sampling.seed.is_none() && !sampling.is_greedy() {
                    sampling.seed = Some(rand::random::<u32>() as u64);
                }
                control.admit.push(Admit::of(&job.request));
                admitted.push(job);
                // Count the row before deciding on the next job.
                break;
            }
        }
        control.shutdown = !open && waiting.is_empty() && batch.is_idle() && admitted.is_empty();
        let started = Instant::now();
        exchange(group, Some(&control))?;
        let exchanged = started.elapsed();
        batch.cancel(&control.cancel);
        for job in admitted {
            batch.admit(shared, job);
        }
        if control.shutdown {
            return Ok(());
        }
        if !batch.is_idle() {
            batch.step(shared);
            tracing::debug!(
                "lockstep: exchange {:.1} ms, step {:.1} ms",
                exchanged.as_secs_f64() * 1e3,
                (started.elapsed() - exchanged).as_secs_f64() * 1e3
            );
        }
    }
}

/// Ranks other than 0: apply rank 0's control message, step, repeat.
fn follow(group: &Group, shared: &mut Shared, batch: &mut BatchLane<'_>) -> Result<()> {
    let in_flight = Arc::new(AtomicUsize::new(0));
    loop {
        let control = exchange(group, None)?;
        batch.cancel(&control.cancel);
        for admit in control.admit {
            // Nobody listens: the events go to a closed channel.
            let (events, _) = tokio::sync::mpsc::unbounded_channel();
            let job = Job {
                request: admit.into_request(),
                lane: Lane::Batch,
                client: Client {
                    events,
                    cancel: Arc::new(AtomicBool::new(false)),
                    submitted: Instant::now(),
                    _in_flight: InFlight::new(&in_flight),
                },
            };
            batch.admit(shared, job);
        }
        if control.shutdown {
            return Ok(());
        }
        if !batch.is_idle() {
            batch.step(shared);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_round_trip() {
        let mut sampling = SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            seed: Some(u64::MAX - 3),
            ..SamplingParams::default()
        };
        sampling.logit_bias.insert(17, -1.5);
        let control = Control {
            cancel: vec![3, 9],
            admit: vec![Admit {
                prompt: vec![1, 2, 49151],
                max_tokens: 5,
                sampling,
                stop: vec!["\n\n".into(), "é".into()],
                logprobs: Some(2),
                prefill_step: 512,
                constraint: Some(Constraint::JsonSchema(
                    serde_json::json!({"type": "object"}),
                )),
            }],
            shutdown: false,
        };
        let bytes = serde_json::to_vec(&control).unwrap();
        let back: Control = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, control);
        let request = back.admit.into_iter().next().unwrap().into_request();
        assert_eq!(request.options.sampling.logit_bias[&17], -1.5);
        assert!(matches!(
            request.constraint,
            Some(ConstraintSpec::JsonSchema(_))
        ));
    }
}
