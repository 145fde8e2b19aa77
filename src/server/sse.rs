//! Streaming answers: gateway events become Server-Sent Events in OpenAI's
//! chunk shapes, ending with `data: [DONE]`. Dropping the stream (a client
//! that went away) drops the ticket, which cancels the generation.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use serde_json::Value;

use super::agent::AnswerStream;
use super::error::ApiError;
use super::response::Reply;
use crate::gateway::{GatewayEvent, Ticket};
use crate::generate::GenerationResult;

/// SSE comments keep idle streams (a long prefill) alive through proxies.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

fn data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

fn done() -> Event {
    Event::default().data("[DONE]")
}

struct StreamState {
    reply: Reply,
    /// Per choice: characters of completion text sent so far (completions'
    /// `text_offset`), and its result once done.
    offsets: Vec<usize>,
    results: Vec<Option<GenerationResult>>,
    finished: bool,
    /// Per choice, for split answers: the splitter and the calls sent.
    answers: Vec<Option<AnswerStream>>,
    calls: Vec<usize>,
}

impl StreamState {
    fn on_event(&mut self, event: Option<(usize, Option<GatewayEvent>)>) -> Vec<Event> {
        let Some((index, event)) = event else {
            return self.fail(ApiError::internal("the generation ended unexpectedly"));
        };
        match event {
            Some(GatewayEvent::Started { .. }) => Vec::new(),
            Some(GatewayEvent::Token { text, logprob, .. }) => {
                if text.is_empty() && logprob.is_none() {
                    return Vec::new();
                }
                if let Some(answer) = &mut self.answers[index] {
                    let deltas = answer.push(&text);
                    let chunks = self.reply.delta_chunks(
                        index,
                        deltas,
                        logprob.as_ref(),
                        &mut self.calls[index],
                    );
                    return chunks.iter().map(data).collect();
                }
                let chunk =
                    self.reply
                        .text_chunk(index, &text, logprob.as_ref(), self.offsets[index]);
                self.offsets[index] += text.chars().count();
                vec![data(&chunk)]
            }
            Some(GatewayEvent::Done(result)) => {
                let mut events = Vec::new();
                if let Some(answer) = &mut self.answers[index] {
                    let deltas = answer.finish();
                    let chunks =
                        self.reply
                            .delta_chunks(index, deltas, None, &mut self.calls[index]);
                    events.extend(chunks.iter().map(data));
                }
                let called = self.calls[index] > 0;
                events.push(data(&self.reply.closing_chunk(index, &result, called)));
                self.results[index] = Some(*result);
                if self.results.iter().all(Option::is_some) {
                    self.finished = true;
                    if self.reply.include_usage {
                        let all: Vec<&GenerationResult> = self.results.iter().flatten().collect();
                        events.push(data(&self.reply.usage_chunk(&all)));
                    }
                    events.push(done());
                }
                events
            }
            Some(GatewayEvent::Failed(e)) => self.fail(ApiError::from(e)),
            None => self.fail(ApiError::internal("the generation ended unexpectedly")),
        }
    }

    fn fail(&mut self, error: ApiError) -> Vec<Event> {
        self.finished = true;
        vec![data(&error.body()), done()]
    }
}

/// One choice's events, tagged with its index; the stream ends after the
/// choice's last event (a closed channel shows up as one `None`).
fn choice_events(
    index: usize,
    ticket: Ticket,
) -> impl Stream<Item = (usize, Option<GatewayEvent>)> {
    stream::unfold(Some(ticket), move |ticket| async move {
        let mut ticket = ticket?;
        let event = ticket.events.recv().await;
        let last = matches!(
            event,
            None | Some(GatewayEvent::Done(_)) | Some(GatewayEvent::Failed(_))
        );
        Some(((index, event), (!last).then_some(ticket)))
    })
}

/// The SSE response for a request whose choices have all started, one
/// ticket per choice in choice order. Dropping it cancels every choice.
pub fn stream(
    reply: Reply,
    tickets: Vec<Ticket>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let opening: Vec<Event> = (0..tickets.len())
        .filter_map(|i| reply.opening_chunk(i))
        .map(|c| data(&c))
        .collect();
    let choices = tickets.len();
    let merged = stream::select_all(
        tickets
            .into_iter()
            .enumerate()
            .map(|(i, t)| choice_events(i, t).boxed()),
    );
    let plan = reply.plan.clone();
    let state = StreamState {
        reply,
        offsets: vec![0; choices],
        results: (0..choices).map(|_| None).collect(),
        finished: false,
        answers: (0..choices)
            .map(|_| plan.clone().map(AnswerStream::new))
            .collect(),
        calls: vec![0; choices],
    };
    let body = stream::unfold((state, merged), |(mut state, mut merged)| async move {
        if state.finished {
            return None;
        }
        let event = merged.next().await;
        let out = state.on_event(event);
        Some((stream::iter(out), (state, merged)))
    })
    .flatten();
    let events = stream::iter(opening).chain(body).map(Ok);
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
